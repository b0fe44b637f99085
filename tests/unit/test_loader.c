// test_loader.c: the checkpoint loader (worker/model_config, safetensors,
// model_loader) on fixtures this test writes into a mkdtemp directory, then
// on the two real checkpoints in ../shared/models (skipped with exit 77 when
// absent, after the fixture tests have run).
//
// Every error case asserts the status AND that the message names the file
// and, where there is one, the tensor. Valid fixtures fill each tensor with a
// function of its name and index, so every element read through a view can
// be checked exactly (after rounding to the tensor's dtype).
#define _GNU_SOURCE
#include <ftw.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "model_config.h"
#include "model_loader.h"
#include "nb_test.h"
#include "safetensors.h"

static char g_root[256]; // the mkdtemp directory

// ---- small helpers -------------------------------------------------------

static char *fx_path(char *buf, size_t len, const char *dir, const char *name) {
    snprintf(buf, len, "%s/%s", dir, name);
    return buf;
}

static void fx_mkdir(char *out, size_t len, const char *name) {
    snprintf(out, len, "%s/%s", g_root, name);
    NB_ASSERT(mkdir(out, 0755) == 0);
}

static void fx_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    NB_ASSERT(f);
    NB_ASSERT(fwrite(data, 1, n, f) == n);
    fclose(f);
}

static void fx_write_str(const char *path, const char *s) { fx_write(path, s, strlen(s)); }

static uint32_t fnv1a(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

// The value every fixture stores at element i of tensor `name` (before
// rounding to the tensor's dtype).
static float fx_value(const char *name, int64_t i) {
    uint32_t h = fnv1a(name) + (uint32_t)i * 2654435761u;
    h ^= h >> 15;
    return ((float)(h % 2001u) - 1000.0f) / 997.0f;
}

// Check `status == want` and that the message holds each of the given
// substrings (NULL-terminated list).
static void check_err(int line, const char *what, nb_status st, nb_status want, const char *err,
                      ...) {
    bool ok = st == want;
    va_list ap;
    va_start(ap, err);
    const char *sub;
    const char *missing = NULL;
    while ((sub = va_arg(ap, const char *)))
        if (!strstr(err, sub) && !missing) missing = sub;
    va_end(ap);
    nb_test_checks++;
    if (!ok || missing) {
        nb_test_failures++;
        fprintf(stderr,
                "test_loader.c:%d: %s: got status %d (%s), want %d (%s); message \"%s\"%s%s\n",
                line, what, st, nb_status_str(st), want, nb_status_str(want), err,
                missing ? " lacks " : "", missing ? missing : "");
    } else {
        printf("  ok %-34s -> %s\n", what, err);
    }
}
#define CHECK_ERR(what, st, want, err, ...)                                                   \
    check_err(__LINE__, what, st, want, err, __VA_ARGS__, (const char *)NULL)

// ---- safetensors writer --------------------------------------------------

typedef struct fx_tensor {
    char name[96];
    const char *dtype; // safetensors dtype string
    int ndim;
    int64_t shape[2];
} fx_tensor;

static size_t fx_elem_size(const char *dtype) {
    if (!strcmp(dtype, "F32") || !strcmp(dtype, "I32")) return 4;
    return 2;
}

static nb_dtype fx_nb_dtype(const char *dtype) {
    return !strcmp(dtype, "F32") ? NB_DTYPE_F32 : !strcmp(dtype, "F16") ? NB_DTYPE_F16
                                                                          : NB_DTYPE_BF16;
}

static int64_t fx_numel(const fx_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

// Write a valid safetensors file holding `n` tensors filled by fx_value.
// Returns the file size.
static size_t fx_write_st(const char *path, const fx_tensor *ts, int n) {
    size_t cap = 256 + (size_t)n * 256, hl = 0;
    char *hdr = malloc(cap);
    NB_ASSERT(hdr);
    hl += (size_t)snprintf(hdr + hl, cap - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t nb = (uint64_t)fx_numel(&ts[i]) * fx_elem_size(ts[i].dtype);
        hl += (size_t)snprintf(hdr + hl, cap - hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                               ts[i].name, ts[i].dtype);
        for (int d = 0; d < ts[i].ndim; d++)
            hl += (size_t)snprintf(hdr + hl, cap - hl, "%s%lld", d ? "," : "",
                                   (long long)ts[i].shape[d]);
        hl += (size_t)snprintf(hdr + hl, cap - hl, "],\"data_offsets\":[%llu,%llu]}",
                               (unsigned long long)off, (unsigned long long)(off + nb));
        off += nb;
    }
    hl += (size_t)snprintf(hdr + hl, cap - hl, "}");
    while (hl % 8) hdr[hl++] = ' '; // pad so data starts 8-byte aligned
    NB_ASSERT(hl < cap);
    size_t total = 8 + hl + off;
    uint8_t *buf = calloc(1, total);
    NB_ASSERT(buf);
    for (int b = 0; b < 8; b++) buf[b] = (uint8_t)((uint64_t)hl >> (8 * b));
    memcpy(buf + 8, hdr, hl);
    uint8_t *p = buf + 8 + hl;
    for (int i = 0; i < n; i++) {
        int64_t ne = fx_numel(&ts[i]);
        if (strcmp(ts[i].dtype, "I32")) {
            nb_dtype dt = fx_nb_dtype(ts[i].dtype);
            for (int64_t j = 0; j < ne; j++) nb_store_f32(p, dt, (size_t)j, fx_value(ts[i].name, j));
        }
        p += (size_t)ne * fx_elem_size(ts[i].dtype);
    }
    fx_write(path, buf, total);
    free(buf);
    free(hdr);
    return total;
}

// Write a safetensors file with header text `json` (padded to 8 bytes) and
// `data_len` zero bytes of data.
static void fx_write_raw_st(const char *path, const char *json, size_t data_len) {
    size_t hl = strlen(json), pad = (8 - hl % 8) % 8;
    size_t total = 8 + hl + pad + data_len;
    uint8_t *buf = calloc(1, total);
    NB_ASSERT(buf);
    for (int b = 0; b < 8; b++) buf[b] = (uint8_t)((uint64_t)(hl + pad) >> (8 * b));
    memcpy(buf + 8, json, hl);
    memset(buf + 8 + hl, ' ', pad);
    fx_write(path, buf, total);
    free(buf);
}

// ---- tiny model fixtures ---------------------------------------------------

enum { FX_H = 16, FX_I = 24, FX_L = 2, FX_NH = 4, FX_NKV = 2, FX_D = 4, FX_V = 32 };

typedef struct fx_model {
    const char *arch_class;   // "LlamaForCausalLM", ...
    const char *model_type;   // "llama", ...
    const char *dtype;        // "F32", "F16", "BF16"
    int n_shards;             // 0 or 1: model.safetensors; >= 2: index + shards
    bool tied;                // tie_word_embeddings in config.json
    bool write_lm_head;       // lm_head.weight in the file
    bool write_qkv_bias;      // q/k/v_proj.bias in the file
    bool write_o_bias;        // o_proj.bias in the file
    const char *extra_cfg;    // appended to config.json's object: ",\"k\": v"
    const char *omit;         // leave this tensor out
    const char *bad_shape;    // write this tensor with shape [3, 5]
    const char *bad_dtype;    // write this tensor as I32
} fx_model;

static int fx_add(fx_tensor *ts, int n, const fx_model *m, const char *name, int ndim,
                  int64_t d0, int64_t d1) {
    if (m->omit && !strcmp(m->omit, name)) return n;
    fx_tensor *t = &ts[n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = (m->bad_dtype && !strcmp(m->bad_dtype, name)) ? "I32" : m->dtype;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    if (m->bad_shape && !strcmp(m->bad_shape, name)) {
        t->ndim = 2;
        t->shape[0] = 3;
        t->shape[1] = 5;
    }
    return n + 1;
}

// Write config.json and the weights of a FX_L-layer model into a new
// directory `name` under g_root; the directory path goes to dir.
static void fx_write_model(char *dir, size_t dir_len, const char *name, const fx_model *m) {
    fx_mkdir(dir, dir_len, name);
    char p[512], cfg[2048];
    const char *td = !strcmp(m->dtype, "F32") ? "float32" : !strcmp(m->dtype, "F16") ? "float16"
                                                                                    : "bfloat16";
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
             "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
             "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
             "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"vocab_size\": %d,\n"
             "  \"rms_norm_eps\": 1e-05,\n  \"max_position_embeddings\": 256,\n"
             "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\",\n"
             "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"hidden_act\": \"silu\"%s\n}\n",
             m->arch_class, m->model_type, FX_H, FX_I, FX_L, FX_NH, FX_NKV, FX_D, FX_V,
             m->tied ? "true" : "false", td, m->extra_cfg ? m->extra_cfg : "");
    fx_write_str(fx_path(p, sizeof p, dir, "config.json"), cfg);

    fx_tensor ts[64];
    int n = 0;
    const int Hq = FX_NH * FX_D, Hkv = FX_NKV * FX_D;
    n = fx_add(ts, n, m, "model.embed_tokens.weight", 2, FX_V, FX_H);
    for (int l = 0; l < FX_L; l++) {
        char nm[96];
#define ADD(suffix, nd, a, b)                                                                 \
    do {                                                                                      \
        snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix);                             \
        n = fx_add(ts, n, m, nm, nd, a, b);                                                   \
    } while (0)
        ADD("input_layernorm.weight", 1, FX_H, 0);
        ADD("self_attn.q_proj.weight", 2, Hq, FX_H);
        ADD("self_attn.k_proj.weight", 2, Hkv, FX_H);
        ADD("self_attn.v_proj.weight", 2, Hkv, FX_H);
        ADD("self_attn.o_proj.weight", 2, FX_H, Hq);
        if (m->write_qkv_bias) {
            ADD("self_attn.q_proj.bias", 1, Hq, 0);
            ADD("self_attn.k_proj.bias", 1, Hkv, 0);
            ADD("self_attn.v_proj.bias", 1, Hkv, 0);
        }
        if (m->write_o_bias) ADD("self_attn.o_proj.bias", 1, FX_H, 0);
        ADD("post_attention_layernorm.weight", 1, FX_H, 0);
        ADD("mlp.gate_proj.weight", 2, FX_I, FX_H);
        ADD("mlp.up_proj.weight", 2, FX_I, FX_H);
        ADD("mlp.down_proj.weight", 2, FX_H, FX_I);
#undef ADD
    }
    n = fx_add(ts, n, m, "model.norm.weight", 1, FX_H, 0);
    if (m->write_lm_head) n = fx_add(ts, n, m, "lm_head.weight", 2, FX_V, FX_H);
    NB_ASSERT(n <= 64);

    if (m->n_shards <= 1) {
        fx_write_st(fx_path(p, sizeof p, dir, "model.safetensors"), ts, n);
        return;
    }
    // Shard k holds tensors [k*n/S, (k+1)*n/S); the index maps each name.
    char *idx = malloc(16384);
    NB_ASSERT(idx);
    size_t il = (size_t)snprintf(idx, 16384, "{\"metadata\": {\"total_size\": 0},\n \"weight_map\": {");
    bool first = true;
    for (int k = 0; k < m->n_shards; k++) {
        int a = k * n / m->n_shards, b = (k + 1) * n / m->n_shards;
        char shard[96];
        snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", k + 1, m->n_shards);
        fx_write_st(fx_path(p, sizeof p, dir, shard), ts + a, b - a);
        for (int i = a; i < b; i++) {
            il += (size_t)snprintf(idx + il, 16384 - il, "%s\n  \"%s\": \"%s\"",
                                   first ? "" : ",", ts[i].name, shard);
            first = false;
        }
    }
    snprintf(idx + il, 16384 - il, "\n }\n}\n");
    fx_write_str(fx_path(p, sizeof p, dir, "model.safetensors.index.json"), idx);
    free(idx);
}

static fx_model fx_llama(const char *dtype) {
    fx_model m = {.arch_class = "LlamaForCausalLM", .model_type = "llama", .dtype = dtype,
                  .n_shards = 1, .tied = false, .write_lm_head = true};
    return m;
}

// ---- checks on a loaded model ------------------------------------------------

static void check_view(const nb_tensor_view *v, const char *name, nb_dtype dt, int ndim,
                       int64_t d0, int64_t d1) {
    CHECKF(v->data != NULL, "%s: absent", name);
    if (!v->data) return;
    CHECKF(v->name && !strcmp(v->name, name), "view name %s, expected %s", v->name, name);
    CHECKF(v->dtype == dt, "%s: dtype %s, expected %s", name, nb_dtype_name(v->dtype),
           nb_dtype_name(dt));
    CHECKF(v->ndim == ndim && v->shape[0] == d0 && v->shape[1] == (ndim == 2 ? d1 : 1),
           "%s: shape %d:[%lld, %lld], expected %d:[%lld, %lld]", name, v->ndim,
           (long long)v->shape[0], (long long)v->shape[1], ndim, (long long)d0, (long long)d1);
    // Every element, exactly.
    int64_t n = v->shape[0] * v->shape[1], bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float want = nb_round_to_dtype(fx_value(name, i), dt);
        float got = nb_load_f32(v->data, v->dtype, (size_t)i);
        if (got != want) bad++;
    }
    CHECKF(bad == 0, "%s: %lld of %lld elements differ", name, (long long)bad, (long long)n);
}

// Checks config and every view of a fixture model loaded from spec `m`.
static void check_fixture_model(const nb_model *model, const fx_model *m, nb_arch arch) {
    const nb_model_config *c = nb_model_get_config(model);
    const nb_model_weights *w = nb_model_get_weights(model);
    nb_dtype dt = fx_nb_dtype(m->dtype);
    CHECK(c->arch == arch);
    CHECK(c->hidden_size == FX_H && c->intermediate_size == FX_I && c->n_layers == FX_L);
    CHECK(c->n_heads == FX_NH && c->n_kv_heads == FX_NKV && c->head_dim == FX_D);
    CHECK(c->vocab_size == FX_V && c->max_position_embeddings == 256);
    CHECK(c->rms_norm_eps == 1e-05f);
    CHECK(c->has_torch_dtype && c->torch_dtype == dt);
    CHECK(c->bos_token_id == 1 && c->n_eos_token_ids == 1 && c->eos_token_ids[0] == 2);
    CHECK(c->tie_word_embeddings == m->tied);
    CHECK(w->n_layers == FX_L);
    const int Hq = FX_NH * FX_D, Hkv = FX_NKV * FX_D;
    check_view(&w->tok_embd, "model.embed_tokens.weight", dt, 2, FX_V, FX_H);
    for (int l = 0; l < FX_L; l++) {
        const nb_layer_weights *L = &w->layers[l];
        char nm[96];
#define V(field, suffix, nd, a, b)                                                            \
    do {                                                                                      \
        snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix);                             \
        check_view(&L->field, nm, dt, nd, a, b);                                              \
    } while (0)
        V(attn_norm, "input_layernorm.weight", 1, FX_H, 0);
        V(wq, "self_attn.q_proj.weight", 2, Hq, FX_H);
        V(wk, "self_attn.k_proj.weight", 2, Hkv, FX_H);
        V(wv, "self_attn.v_proj.weight", 2, Hkv, FX_H);
        V(wo, "self_attn.o_proj.weight", 2, FX_H, Hq);
        if (c->qkv_bias) {
            V(bq, "self_attn.q_proj.bias", 1, Hq, 0);
            V(bk, "self_attn.k_proj.bias", 1, Hkv, 0);
            V(bv, "self_attn.v_proj.bias", 1, Hkv, 0);
        } else {
            CHECK(!L->bq.data && !L->bk.data && !L->bv.data && L->bq.ndim == 0);
        }
        if (c->o_bias) V(bo, "self_attn.o_proj.bias", 1, FX_H, 0);
        else CHECK(!L->bo.data);
        V(ffn_norm, "post_attention_layernorm.weight", 1, FX_H, 0);
        V(w_gate, "mlp.gate_proj.weight", 2, FX_I, FX_H);
        V(w_up, "mlp.up_proj.weight", 2, FX_I, FX_H);
        V(w_down, "mlp.down_proj.weight", 2, FX_H, FX_I);
#undef V
    }
    check_view(&w->out_norm, "model.norm.weight", dt, 1, FX_H, 0);
    if (m->tied) {
        CHECK(w->lm_head_tied && w->lm_head.data == w->tok_embd.data);
        check_view(&w->lm_head, "model.embed_tokens.weight", dt, 2, FX_V, FX_H);
    } else {
        CHECK(!w->lm_head_tied && w->lm_head.data != w->tok_embd.data);
        check_view(&w->lm_head, "lm_head.weight", dt, 2, FX_V, FX_H);
    }
}

// Load fixture `m` written as `name`; check everything; return the model
// (caller frees) or NULL.
static nb_model *load_ok(const char *name, const fx_model *m, nb_arch arch) {
    char dir[512], err[1024];
    fx_write_model(dir, sizeof dir, name, m);
    nb_model *model = (nb_model *)0x1;
    nb_status st = nb_model_load(dir, &model, err, sizeof err);
    CHECKF(st == NB_OK, "%s: %s (%s)", name, nb_status_str(st), err);
    if (st != NB_OK) {
        CHECK(model == NULL);
        return NULL;
    }
    check_fixture_model(model, m, arch);
    printf("  ok load %s\n", name);
    return model;
}

// Write fixture `m` as `name`, expect nb_model_load to fail with `want`;
// the message must hold the given substrings.
#define LOAD_FAIL(name, m, want, ...)                                                         \
    do {                                                                                      \
        char d_[512], e_[1024];                                                               \
        fx_write_model(d_, sizeof d_, name, &(m));                                            \
        nb_model *mm_ = (nb_model *)0x1;                                                      \
        nb_status s_ = nb_model_load(d_, &mm_, e_, sizeof e_);                                \
        CHECK(mm_ == NULL);                                                                   \
        CHECK_ERR(name, s_, want, e_, __VA_ARGS__);                                           \
        nb_model_free(&mm_);                                                                  \
    } while (0)

// ---- valid fixtures ------------------------------------------------------

static void test_valid(void) {
    printf("valid fixtures:\n");
    const char *dts[3] = {"F32", "F16", "BF16"};
    for (int i = 0; i < 3; i++) {
        // sharded into 2 files with an index, untied
        fx_model m = fx_llama(dts[i]);
        m.n_shards = 2;
        char name[64];
        snprintf(name, sizeof name, "llama_%s_sharded", dts[i]);
        nb_model *model = load_ok(name, &m, NB_ARCH_LLAMA);
        if (model) {
            // the two layers' tensors live in different shards
            char err[256];
            nb_tensor_view v;
            CHECK(nb_model_find_tensor(model, "model.layers.1.mlp.down_proj.weight", &v, err,
                                       sizeof err) == NB_OK);
            CHECK(nb_model_find_tensor(model, "no.such.tensor", &v, err, sizeof err) ==
                  NB_ERR_NOT_FOUND);
            CHECK(strstr(err, "model.safetensors.index.json") && strstr(err, "no.such.tensor"));
        }
        nb_model_free(&model);
        CHECK(model == NULL);
        // single file, tied (no lm_head in the file)
        m = fx_llama(dts[i]);
        m.tied = true;
        m.write_lm_head = false;
        snprintf(name, sizeof name, "llama_%s_tied", dts[i]);
        model = load_ok(name, &m, NB_ARCH_LLAMA);
        nb_model_free(&model);
    }
    // three shards, bf16, tied but with lm_head.weight present: embed is used
    fx_model m = fx_llama("BF16");
    m.n_shards = 3;
    m.tied = true;
    nb_model *model = load_ok("llama_bf16_3shards_tied_with_head", &m, NB_ARCH_LLAMA);
    nb_model_free(&model);

    // qwen2 with q/k/v biases; use_sliding_window false -> 0
    m = fx_llama("BF16");
    m.arch_class = "Qwen2ForCausalLM";
    m.model_type = "qwen2";
    m.write_qkv_bias = true;
    m.extra_cfg = ",\"use_sliding_window\": false, \"sliding_window\": 4096, "
                  "\"rope_theta\": 1000000.0";
    model = load_ok("qwen2_bias", &m, NB_ARCH_QWEN2);
    if (model) {
        const nb_model_config *c = nb_model_get_config(model);
        CHECK(c->qkv_bias && !c->o_bias && c->sliding_window == 0);
        CHECK(c->rope_theta == 1000000.0);
    }
    nb_model_free(&model);

    // mistral: sliding window recorded, no biases even if present in the file
    m = fx_llama("F16");
    m.arch_class = "MistralForCausalLM";
    m.model_type = "mistral";
    m.write_qkv_bias = true;
    m.extra_cfg = ",\"sliding_window\": 4096";
    model = load_ok("mistral_sw", &m, NB_ARCH_MISTRAL);
    if (model) {
        const nb_model_config *c = nb_model_get_config(model);
        CHECK(c->sliding_window == 4096 && !c->qkv_bias);
        CHECK(nb_model_get_weights(model)->layers[0].bq.data == NULL);
    }
    nb_model_free(&model);

    // llama with attention_bias: q/k/v/o biases; llama3 rope scaling; eos list
    m = fx_llama("F32");
    m.write_qkv_bias = true;
    m.write_o_bias = true;
    m.extra_cfg = ",\"attention_bias\": true, \"rope_theta\": 500000.0, \"rope_scaling\": "
                  "{\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                  "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}";
    model = load_ok("llama_bias_llama3", &m, NB_ARCH_LLAMA);
    if (model) {
        const nb_model_config *c = nb_model_get_config(model);
        CHECK(c->qkv_bias && c->o_bias);
        CHECK(c->rope_theta == 500000.0);
        CHECK(c->rope_scaling.type == NB_ROPE_LLAMA3);
        CHECK(c->rope_scaling.factor == 8.0f && c->rope_scaling.low_freq_factor == 1.0f);
        CHECK(c->rope_scaling.high_freq_factor == 4.0f);
        CHECK(c->rope_scaling.original_max_position_embeddings == 8192);
    }
    nb_model_free(&model);
}

// config.json parsing alone (no weights needed).
static void test_config(void) {
    printf("config parsing:\n");
    nb_model_config c;
    char err[512];
    // defaults: no num_key_value_heads, head_dim, rope_theta, tie, eps; old "type" key
    const char *j1 = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                     " \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"vocab_size\": 100,"
                     " \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0},"
                     " \"eos_token_id\": [128001, 128008, 128009], \"head_dim\": null}";
    nb_status st = nb_model_config_parse(j1, strlen(j1), "j1/config.json", &c, err, sizeof err);
    CHECKF(st == NB_OK, "%s", err);
    CHECK(c.arch == NB_ARCH_LLAMA && c.n_kv_heads == 8 && c.head_dim == 8);
    CHECK(c.rope_theta == 10000.0 && !c.tie_word_embeddings && c.rms_norm_eps == 1e-6f);
    CHECK(c.rope_scaling.type == NB_ROPE_LINEAR && c.rope_scaling.factor == 2.0f);
    CHECK(c.n_eos_token_ids == 3 && c.eos_token_ids[2] == 128009 && c.bos_token_id == -1);
    CHECK(c.max_position_embeddings == 2048 && !c.has_torch_dtype && !c.qkv_bias);
    // rope_scaling "default" == none
    const char *j2 = "{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 64,"
                     " \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
                     " \"num_attention_heads\": 8, \"num_key_value_heads\": 2,"
                     " \"vocab_size\": 100, \"rope_scaling\": {\"rope_type\": \"default\"},"
                     " \"sliding_window\": null}";
    st = nb_model_config_parse(j2, strlen(j2), "j2/config.json", &c, err, sizeof err);
    CHECKF(st == NB_OK, "%s", err);
    CHECK(c.arch == NB_ARCH_MISTRAL && c.rope_scaling.type == NB_ROPE_NONE);
    CHECK(c.sliding_window == 0 && c.n_kv_heads == 2);
    // errors that need no weights
    const char *j3 = "{\"model_type\": \"llama\", \"hidden_size\": \"64\"}";
    st = nb_model_config_parse(j3, strlen(j3), "j3/config.json", &c, err, sizeof err);
    CHECK_ERR("config: mistyped field", st, NB_ERR_FORMAT, err, "j3/config.json",
              "hidden_size");
    const char *j4 = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 1,"
                     " \"num_hidden_layers\": 1, \"num_attention_heads\": 6,"
                     " \"num_key_value_heads\": 4, \"vocab_size\": 10}";
    st = nb_model_config_parse(j4, strlen(j4), "j4/config.json", &c, err, sizeof err);
    CHECK_ERR("config: heads % kv_heads", st, NB_ERR_FORMAT, err, "j4/config.json",
              "num_key_value_heads");
    const char *j5 = "{\"model_type\": \"llama\", \"intermediate_size\": 1}";
    st = nb_model_config_parse(j5, strlen(j5), "j5/config.json", &c, err, sizeof err);
    CHECK_ERR("config: missing hidden_size", st, NB_ERR_FORMAT, err, "j5/config.json",
              "hidden_size");
    const char *j6 = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 1,"
                     " \"num_hidden_layers\": 1, \"num_attention_heads\": 8, \"vocab_size\": 10,"
                     " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}";
    st = nb_model_config_parse(j6, strlen(j6), "j6/config.json", &c, err, sizeof err);
    CHECK_ERR("config: llama3 incomplete", st, NB_ERR_FORMAT, err, "j6/config.json",
              "low_freq_factor");
    const char *j7 = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 1,"
                     " \"num_hidden_layers\": 1, \"num_attention_heads\": 8, \"vocab_size\": 10,"
                     " \"hidden_act\": \"gelu\"}";
    st = nb_model_config_parse(j7, strlen(j7), "j7/config.json", &c, err, sizeof err);
    CHECK_ERR("config: gelu", st, NB_ERR_UNSUPPORTED, err, "j7/config.json", "gelu");
    st = nb_model_config_load(NULL, &c, err, sizeof err);
    CHECK(st == NB_ERR_INVALID_ARG);
}

// ---- error fixtures ----------------------------------------------------------

static void test_errors(void) {
    printf("error cases:\n");
    char dir[512], p[600], err[1024];
    nb_model *model = (nb_model *)0x1;
    nb_status st;

    // missing directory
    snprintf(dir, sizeof dir, "%s/does_not_exist", g_root);
    st = nb_model_load(dir, &model, err, sizeof err);
    CHECK(model == NULL);
    CHECK_ERR("missing dir", st, NB_ERR_NOT_FOUND, err, "does_not_exist");

    // missing config.json (weights present)
    fx_model m = fx_llama("F32");
    fx_write_model(dir, sizeof dir, "no_config", &m);
    NB_ASSERT(unlink(fx_path(p, sizeof p, dir, "config.json")) == 0);
    st = nb_model_load(dir, &model, err, sizeof err);
    CHECK_ERR("missing config", st, NB_ERR_NOT_FOUND, err, "no_config/config.json");

    // config but no weights
    fx_write_model(dir, sizeof dir, "no_weights", &m);
    NB_ASSERT(unlink(fx_path(p, sizeof p, dir, "model.safetensors")) == 0);
    st = nb_model_load(dir, &model, err, sizeof err);
    CHECK_ERR("missing weights", st, NB_ERR_NOT_FOUND, err, "no_weights",
              "model.safetensors");

    // bad JSON in config.json: line 3 has the error
    fx_write_model(dir, sizeof dir, "bad_json", &m);
    fx_write_str(fx_path(p, sizeof p, dir, "config.json"),
                 "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 16,,\n}\n");
    st = nb_model_load(dir, &model, err, sizeof err);
    CHECK_ERR("bad config JSON", st, NB_ERR_FORMAT, err, "bad_json/config.json", "line 3");

    // unsupported architecture
    m = fx_llama("F32");
    m.arch_class = "GPT2LMHeadModel";
    m.model_type = "gpt2";
    LOAD_FAIL("arch_gpt2", m, NB_ERR_UNSUPPORTED, "arch_gpt2/config.json", "GPT2LMHeadModel");

    // unsupported rope_scaling
    m = fx_llama("F32");
    m.extra_cfg = ",\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}";
    LOAD_FAIL("rope_yarn", m, NB_ERR_UNSUPPORTED, "rope_yarn/config.json", "yarn");

    // missing tensor (single file)
    m = fx_llama("F32");
    m.omit = "model.layers.1.mlp.up_proj.weight";
    LOAD_FAIL("missing_tensor", m, NB_ERR_NOT_FOUND, "missing_tensor/model.safetensors",
              "model.layers.1.mlp.up_proj.weight", "[24, 16]");

    // missing tensor (sharded): the message names the index
    m = fx_llama("BF16");
    m.n_shards = 2;
    m.omit = "model.norm.weight";
    LOAD_FAIL("missing_tensor_sharded", m, NB_ERR_NOT_FOUND,
              "missing_tensor_sharded/model.safetensors.index.json", "model.norm.weight");

    // wrong shape
    m = fx_llama("F16");
    m.bad_shape = "model.layers.0.self_attn.k_proj.weight";
    LOAD_FAIL("wrong_shape", m, NB_ERR_FORMAT, "wrong_shape/model.safetensors",
              "model.layers.0.self_attn.k_proj.weight", "[3, 5]", "expected [8, 16]");

    // unsupported dtype
    m = fx_llama("F32");
    m.bad_dtype = "model.layers.0.self_attn.q_proj.weight";
    LOAD_FAIL("bad_dtype", m, NB_ERR_UNSUPPORTED, "bad_dtype/model.safetensors",
              "model.layers.0.self_attn.q_proj.weight", "I32");

    // untied and no lm_head
    m = fx_llama("F32");
    m.write_lm_head = false;
    LOAD_FAIL("untied_no_head", m, NB_ERR_NOT_FOUND, "untied_no_head/model.safetensors",
              "lm_head.weight", "tie_word_embeddings");

    // qwen2 without its q/k/v biases
    m = fx_llama("BF16");
    m.arch_class = "Qwen2ForCausalLM";
    m.model_type = "qwen2";
    LOAD_FAIL("qwen2_no_bias", m, NB_ERR_NOT_FOUND, "qwen2_no_bias/model.safetensors",
              "model.layers.0.self_attn.q_proj.bias");

    // truncated file: the last tensor's bytes are cut
    m = fx_llama("F32");
    fx_write_model(dir, sizeof dir, "truncated", &m);
    fx_path(p, sizeof p, dir, "model.safetensors");
    struct stat sb;
    NB_ASSERT(stat(p, &sb) == 0);
    NB_ASSERT(truncate(p, sb.st_size - 10) == 0);
    st = nb_model_load(dir, &model, err, sizeof err);
    CHECK_ERR("truncated data", st, NB_ERR_FORMAT, err, "truncated/model.safetensors",
              "truncated", "lm_head.weight");

    // file cut inside the header
    NB_ASSERT(truncate(p, 100) == 0);
    st = nb_model_load(dir, &model, err, sizeof err);
    CHECK_ERR("header beyond file", st, NB_ERR_FORMAT, err, "truncated/model.safetensors",
              "header length");

    // file shorter than the length prefix
    NB_ASSERT(truncate(p, 5) == 0);
    st = nb_model_load(dir, &model, err, sizeof err);
    CHECK_ERR("5-byte file", st, NB_ERR_FORMAT, err, "truncated/model.safetensors",
              "truncated");

    // header length field absurdly large (not just truncated)
    fx_write_model(dir, sizeof dir, "huge_hlen", &m);
    {
        fx_path(p, sizeof p, dir, "model.safetensors");
        FILE *f = fopen(p, "r+b");
        NB_ASSERT(f);
        uint8_t ff[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
        NB_ASSERT(fwrite(ff, 1, 8, f) == 8);
        fclose(f);
    }
    st = nb_model_load(dir, &model, err, sizeof err);
    CHECK_ERR("header length huge", st, NB_ERR_FORMAT, err, "huge_hlen/model.safetensors",
              "header length", "beyond");

    // index naming a missing shard
    m = fx_llama("F16");
    m.n_shards = 2;
    fx_write_model(dir, sizeof dir, "missing_shard", &m);
    NB_ASSERT(unlink(fx_path(p, sizeof p, dir, "model-00002-of-00002.safetensors")) == 0);
    st = nb_model_load(dir, &model, err, sizeof err);
    CHECK_ERR("missing shard", st, NB_ERR_NOT_FOUND, err,
              "missing_shard/model.safetensors.index.json", "model-00002-of-00002.safetensors");

    // index mapping a tensor to a shard that lacks it: swap shard names
    fx_write_model(dir, sizeof dir, "wrong_shard", &m);
    fx_write_str(fx_path(p, sizeof p, dir, "model.safetensors.index.json"),
                 "{\"weight_map\": {\"model.embed_tokens.weight\": "
                 "\"model-00002-of-00002.safetensors\"}}");
    st = nb_model_load(dir, &model, err, sizeof err);
    CHECK_ERR("tensor not in its shard", st, NB_ERR_FORMAT, err,
              "wrong_shard/model.safetensors.index.json", "model.embed_tokens.weight",
              "model-00002-of-00002.safetensors");

    // index with bad JSON / path-like shard name
    fx_write_str(p, "{\"weight_map\": {\"a\": \"../x.safetensors\"}}");
    st = nb_model_load(dir, &model, err, sizeof err);
    CHECK_ERR("path-like shard name", st, NB_ERR_FORMAT, err, "model.safetensors.index.json",
              "\"a\"");
    fx_write_str(p, "{\"weight_map\": [}");
    st = nb_model_load(dir, &model, err, sizeof err);
    CHECK_ERR("bad index JSON", st, NB_ERR_FORMAT, err, "model.safetensors.index.json",
              "line 1");
    CHECK(model == NULL);
}

// Safetensors header validation on raw files (nb_st_open directly).
static void test_st_raw(void) {
    printf("safetensors header validation:\n");
    char dir[512], p[600], err[1024];
    fx_mkdir(dir, sizeof dir, "raw");
    nb_st_file *f = (nb_st_file *)0x1;
    nb_status st;
#define RAW(fname, json, dlen, want, ...)                                                      \
    do {                                                                                      \
        fx_write_raw_st(fx_path(p, sizeof p, dir, fname), json, dlen);                        \
        st = nb_st_open(p, &f, err, sizeof err);                                              \
        CHECK(f == NULL);                                                                     \
        CHECK_ERR(fname, st, want, err, fname, __VA_ARGS__);                                  \
        nb_st_close(&f);                                                                      \
    } while (0)
    RAW("offsets_out_of_range.safetensors",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [16, 32]}}", 16,
        NB_ERR_FORMAT, "\"w\"", "[16, 32)");
    RAW("negative_offsets.safetensors",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-8, 0]}}", 16,
        NB_ERR_FORMAT, "\"w\"", "header");
    RAW("offsets_reversed.safetensors",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 4]}}", 16,
        NB_ERR_FORMAT, "\"w\"");
    RAW("size_mismatch.safetensors",
        "{\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 8]}}", 16,
        NB_ERR_FORMAT, "\"w\"", "expected 12");
    RAW("overlap.safetensors",
        "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
        " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
        16, NB_ERR_FORMAT, "\"a\"", "\"b\"", "overlap");
    RAW("numel_overflow.safetensors",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4],"
        " \"data_offsets\": [0, 0]}}",
        16, NB_ERR_FORMAT, "\"w\"", "overflow");
    RAW("unknown_dtype.safetensors",
        "{\"w\": {\"dtype\": \"Q4_K\", \"shape\": [2], \"data_offsets\": [0, 1]}}", 16,
        NB_ERR_UNSUPPORTED, "\"w\"", "Q4_K");
    RAW("bad_header_json.safetensors", "{\"w\": {\"dtype\": F32}}", 16, NB_ERR_FORMAT,
        "not valid JSON");
    RAW("dup_tensor.safetensors",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
        " \"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
        16, NB_ERR_FORMAT, "\"w\"", "twice");
    RAW("missing_offsets.safetensors", "{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 16,
        NB_ERR_FORMAT, "\"w\"", "data_offsets");
    RAW("not_object.safetensors", "[1, 2]", 16, NB_ERR_FORMAT, "not a JSON object");
#undef RAW
    // A valid raw file: metadata, a scalar, an I64 (listed, not loadable), empty tensor.
    fx_write_raw_st(fx_path(p, sizeof p, dir, "ok.safetensors"),
                    "{\"__metadata__\": {\"format\": \"pt\"},"
                    " \"s\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]},"
                    " \"i\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [8, 16]},"
                    " \"e\": {\"dtype\": \"F16\", \"shape\": [0, 4], \"data_offsets\": [4, 4]}}",
                    16);
    st = nb_st_open(p, &f, err, sizeof err);
    CHECKF(st == NB_OK, "%s", err);
    if (st == NB_OK) {
        CHECK(nb_st_file_n_tensors(f) == 3);
        CHECK(!strcmp(nb_st_file_tensor_at(f, 0)->name, "e"));
        const nb_st_tensor *s = nb_st_file_find(f, "s");
        CHECK(s && s->ndim == 0 && s->numel == 1 && s->dtype_supported);
        const nb_st_tensor *i = nb_st_file_find(f, "i");
        CHECK(i && !i->dtype_supported && !strcmp(i->dtype_name, "I64") && i->nbytes == 8);
        CHECK(nb_st_file_find(f, "zz") == NULL);
        const char *fmt = nb_st_file_metadata(f, "format");
        CHECK(fmt && !strcmp(fmt, "pt"));
        CHECK(nb_st_file_metadata(f, "nope") == NULL);
    }
    nb_st_close(&f);
    CHECK(f == NULL);
    nb_st_close(&f);   // NULL is fine
    nb_st_close(NULL); // so is a NULL pointer
    nb_model_free(NULL);
    st = nb_st_open(fx_path(p, sizeof p, dir, "absent.safetensors"), &f, err, sizeof err);
    CHECK_ERR("absent file", st, NB_ERR_NOT_FOUND, err, "absent.safetensors");
}

// Random byte corruption of a valid file's header and length prefix: any
// status is fine, a crash or a sanitizer report is not; on success every
// tensor must still lie inside the file.
static void test_st_corrupt(void) {
    printf("safetensors corruption sweep:\n");
    char dir[512], p[600], q[600], err[1024];
    fx_mkdir(dir, sizeof dir, "corrupt");
    fx_tensor ts[3] = {{"a", "F32", 2, {3, 4}}, {"b.weight", "BF16", 1, {5, 0}},
                       {"c", "F16", 2, {2, 2}}};
    size_t size = fx_write_st(fx_path(p, sizeof p, dir, "ok.safetensors"), ts, 3);
    uint8_t *orig = malloc(size), *buf = malloc(size);
    NB_ASSERT(orig && buf);
    FILE *f = fopen(p, "rb");
    NB_ASSERT(f && fread(orig, 1, size, f) == size);
    fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | orig[i];
    uint32_t rng = 12345u;
    int n_ok = 0, n_err = 0;
    fx_path(q, sizeof q, dir, "bad.safetensors");
    for (int it = 0; it < 400; it++) {
        memcpy(buf, orig, size);
        int flips = 1 + it % 4;
        for (int k = 0; k < flips; k++) {
            rng = rng * 1664525u + 1013904223u;
            size_t pos = (rng >> 8) % (8 + hl);
            rng = rng * 1664525u + 1013904223u;
            buf[pos] = (it & 1) ? (uint8_t)(rng >> 24) : (uint8_t)"0123456789-[]{},\":e"[(rng >> 24) % 19];
        }
        fx_write(q, buf, size);
        nb_st_file *sf = NULL;
        nb_status st = nb_st_open(q, &sf, err, sizeof err);
        if (st == NB_OK) {
            n_ok++;
            for (int i = 0; i < nb_st_file_n_tensors(sf); i++) {
                const nb_st_tensor *t = nb_st_file_tensor_at(sf, i);
                CHECK(t->file_offset + t->nbytes <= size);
                volatile uint8_t sink = 0;
                for (size_t b = 0; b < t->nbytes; b++) sink ^= ((const uint8_t *)t->data)[b];
                (void)sink;
            }
        } else {
            n_err++;
            CHECK(sf == NULL && strstr(err, "bad.safetensors"));
        }
        nb_st_close(&sf);
    }
    printf("  ok 400 corrupted headers: %d opened, %d rejected with a message\n", n_ok, n_err);
    free(orig);
    free(buf);
}

// ---- real checkpoints ------------------------------------------------------

// Read `n` bytes of tensor `name` straight from the file, by parsing the
// header independently of the loader.
static bool read_tensor_bytes(const char *path, const char *name, void *out, size_t n) {
    bool ok = false;
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    uint8_t lb[8];
    uint64_t hl = 0;
    char *hdr = NULL;
    cJSON *root = NULL;
    if (fread(lb, 1, 8, f) != 8) goto out;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | lb[i];
    if (hl > (1u << 24) || !(hdr = malloc(hl + 1))) goto out;
    if (fread(hdr, 1, hl, f) != hl) goto out;
    hdr[hl] = 0;
    root = cJSON_Parse(hdr);
    const cJSON *t = cJSON_GetObjectItem(root, name);
    const cJSON *offs = t ? cJSON_GetObjectItem(t, "data_offsets") : NULL;
    if (!offs) goto out;
    long begin = (long)cJSON_GetArrayItem(offs, 0)->valuedouble;
    if (fseek(f, (long)(8 + hl) + begin, SEEK_SET) != 0) goto out;
    ok = fread(out, 1, n, f) == n;
out:
    cJSON_Delete(root);
    free(hdr);
    fclose(f);
    return ok;
}

typedef struct real_spec {
    const char *dir;
    int n_layers, hidden, n_heads, n_kv, head_dim, vocab, inter;
    nb_dtype dtype;
    double rope_theta;
} real_spec;

// Returns false when the checkpoint is absent.
static bool test_real(const real_spec *r) {
    char dir[512], p[600], err[1024];
    snprintf(dir, sizeof dir, "%s/models/%s", nb_test_shared_dir(), r->dir);
    if (access(fx_path(p, sizeof p, dir, "config.json"), R_OK) != 0) {
        printf("SKIP real checkpoint %s: %s not found (set NB_SHARED_DIR)\n", r->dir, p);
        return false;
    }
    printf("real checkpoint %s:\n", dir);
    nb_model *model = NULL;
    nb_status st = nb_model_load(dir, &model, err, sizeof err);
    CHECKF(st == NB_OK, "%s: %s", r->dir, err);
    if (st) return true;
    const nb_model_config *c = nb_model_get_config(model);
    const nb_model_weights *w = nb_model_get_weights(model);
    CHECK(c->arch == NB_ARCH_LLAMA);
    CHECKF(c->n_layers == r->n_layers && c->hidden_size == r->hidden &&
               c->n_heads == r->n_heads && c->n_kv_heads == r->n_kv &&
               c->head_dim == r->head_dim && c->vocab_size == r->vocab &&
               c->intermediate_size == r->inter,
           "%s: L %d H %d heads %d/%d D %d V %d I %d", r->dir, c->n_layers, c->hidden_size,
           c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, c->intermediate_size);
    CHECK(c->tie_word_embeddings && w->lm_head_tied && w->lm_head.data == w->tok_embd.data);
    CHECK(c->rope_theta == r->rope_theta && c->rope_scaling.type == NB_ROPE_NONE);
    CHECK(c->has_torch_dtype && c->torch_dtype == r->dtype);
    CHECK(w->n_layers == r->n_layers);
    CHECK(w->tok_embd.dtype == r->dtype && w->tok_embd.shape[0] == r->vocab &&
          w->tok_embd.shape[1] == r->hidden);
    for (int l = 0; l < w->n_layers; l++) {
        const nb_layer_weights *L = &w->layers[l];
        CHECK(L->wq.shape[0] == (int64_t)r->n_heads * r->head_dim && L->wq.shape[1] == r->hidden);
        CHECK(L->wk.shape[0] == (int64_t)r->n_kv * r->head_dim && L->wv.dtype == r->dtype);
        CHECK(L->w_down.shape[0] == r->hidden && L->w_down.shape[1] == r->inter);
        CHECK(L->bq.data == NULL);
    }
    // Spot-check bytes against an independent read of the file.
    fx_path(p, sizeof p, dir, "model.safetensors");
    const size_t es = nb_dtype_size(r->dtype);
    uint8_t want[64 * 4];
    size_t n = 64 * es;
    CHECK(read_tensor_bytes(p, "model.norm.weight", want, n));
    CHECK(memcmp(w->out_norm.data, want, n) == 0);
    const nb_tensor_view *wk = &w->layers[r->n_layers - 1].wk;
    CHECK(read_tensor_bytes(p, wk->name, want, n));
    CHECK(memcmp(wk->data, want, n) == 0);
    // norm weights of a trained model are finite, mostly positive, O(1)
    float v0 = nb_load_f32(w->out_norm.data, w->out_norm.dtype, 0);
    printf("  model.norm.weight[0] = %g; layers %d, hidden %d, heads %d/%d, head_dim %d, "
           "vocab %d, %s\n",
           v0, c->n_layers, c->hidden_size, c->n_heads, c->n_kv_heads, c->head_dim,
           c->vocab_size, nb_dtype_name(w->tok_embd.dtype));
    CHECK(v0 > -100.0f && v0 < 100.0f);
    nb_model_free(&model);
    return true;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_root, sizeof g_root, "%s/nb_loader_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    NB_ASSERT(mkdtemp(g_root));

    test_config();
    test_valid();
    test_errors();
    test_st_raw();
    test_st_corrupt();

    const real_spec stories = {"stories260k", 5, 64, 8, 4, 8, 512, 172, NB_DTYPE_F32, 10000.0};
    const real_spec proxy = {"proxy-llama-31m", 8, 512, 4, 2, 128, 16000, 1408, NB_DTYPE_BF16,
                             500000.0};
    bool have1 = test_real(&stories);
    bool have2 = test_real(&proxy);

    nftw(g_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    int rc = nb_test_finish("test_loader");
    if (rc == 0 && (!have1 || !have2)) {
        printf("SKIP: real checkpoints absent (fixture tests passed)\n");
        return NB_TEST_SKIP;
    }
    return rc;
}
