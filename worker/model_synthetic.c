// model_synthetic.c: built-in model shapes with seeded random weights, made
// in memory (no checkpoint file) for benchmarks of real shapes and machines
// without weights. Their output is noise.
//
// The one idea: every element is a pure function of (seed, tensor index,
// element index) through a counter-based hash (splitmix64's finaliser), so
// the fill can be split over threads in any way and the same seed always
// gives the same weights. Projections are uniform with standard deviation
// 1/sqrt(fan_in) and norms are 1, so every matmul keeps unit-scale
// activations and the forward pass stays finite at any depth we ship.
#include "model_synthetic.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model_internal.h"
#include "model_loader.h"

// HF config.json text of each shape: parsed by the same code as a
// checkpoint's, so the defaults and checks are the loader's.
typedef struct synth_shape {
    const char *name;
    nb_dtype dtype;
    const char *config_json;
} synth_shape;

static const synth_shape k_shapes[] = {
    {"tiny", NB_DTYPE_F32,
     "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\","
     "\"torch_dtype\":\"float32\",\"vocab_size\":512,\"hidden_size\":128,"
     "\"intermediate_size\":384,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
     "\"num_key_value_heads\":2,\"head_dim\":32,\"rms_norm_eps\":1e-5,"
     "\"rope_theta\":10000.0,\"max_position_embeddings\":2048,"
     "\"tie_word_embeddings\":false,\"bos_token_id\":1,\"eos_token_id\":2,"
     "\"hidden_act\":\"silu\"}"},
    {"llama-2-7b", NB_DTYPE_BF16,
     "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\","
     "\"torch_dtype\":\"bfloat16\",\"vocab_size\":32000,\"hidden_size\":4096,"
     "\"intermediate_size\":11008,\"num_hidden_layers\":32,\"num_attention_heads\":32,"
     "\"num_key_value_heads\":32,\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,"
     "\"max_position_embeddings\":4096,\"tie_word_embeddings\":false,"
     "\"bos_token_id\":1,\"eos_token_id\":2,\"hidden_act\":\"silu\"}"},
    {"llama-3-8b", NB_DTYPE_BF16,
     "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\","
     "\"torch_dtype\":\"bfloat16\",\"vocab_size\":128256,\"hidden_size\":4096,"
     "\"intermediate_size\":14336,\"num_hidden_layers\":32,\"num_attention_heads\":32,"
     "\"num_key_value_heads\":8,\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0,"
     "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
     "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192},"
     "\"max_position_embeddings\":131072,\"tie_word_embeddings\":false,"
     "\"bos_token_id\":128000,\"eos_token_id\":128001,\"hidden_act\":\"silu\"}"},
};
#define N_SHAPES (sizeof k_shapes / sizeof k_shapes[0])

static nb_status set_err(char *err, size_t err_len, nb_status st, const char *fmt, ...) {
    if (err && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

const char *nb_model_synthetic_names(void) { return "tiny, llama-2-7b, llama-3-8b"; }

static const synth_shape *find_shape(const char *name) {
    if (!strncmp(name, "synthetic:", 10)) name += 10;
    for (size_t i = 0; i < N_SHAPES; i++)
        if (!strcmp(k_shapes[i].name, name)) return &k_shapes[i];
    return NULL;
}

// ---------------------------------------------------------------- tensor plan

// One tensor of the plan: where its view lives and how it is filled.
typedef struct synth_tensor {
    nb_tensor_view *view; // filled in place (points into the nb_model_weights being built)
    int64_t rows, cols;   // cols = fan_in of a projection
    int ndim;
    bool ones;            // a norm weight: all 1
    size_t offset;        // bytes into the blob
    char name[64];
} synth_tensor;

typedef struct synth_plan {
    nb_model_config cfg;
    nb_dtype dtype;
    int n_tensors;
    synth_tensor *t;   // [n_tensors]
    size_t total;      // blob bytes
} synth_plan;

// Lays out every tensor (64-byte aligned) in the order the HF checkpoint
// lists them. w->layers must hold cfg.n_layers entries.
static int plan_tensors(synth_plan *p, nb_model_weights *w) {
    const nb_model_config *c = &p->cfg;
    const int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    const int64_t Hq = (int64_t)c->n_heads * c->head_dim;
    const int64_t Hkv = (int64_t)c->n_kv_heads * c->head_dim;
    const size_t es = nb_dtype_size(p->dtype);
    int n = 0;
    size_t off = 0;
#define ADD(viewp, r, cc, nd, one, ...)                                                      \
    do {                                                                                     \
        synth_tensor *t_ = &p->t[n++];                                                       \
        t_->view = (viewp);                                                                  \
        t_->rows = (r);                                                                      \
        t_->cols = (cc);                                                                     \
        t_->ndim = (nd);                                                                     \
        t_->ones = (one);                                                                    \
        t_->offset = off;                                                                    \
        snprintf(t_->name, sizeof t_->name, __VA_ARGS__);                                    \
        off += ((size_t)(r) * (size_t)(cc) * es + 63) & ~(size_t)63;                         \
    } while (0)
    ADD(&w->tok_embd, V, H, 2, false, "model.embed_tokens.weight");
    for (int i = 0; i < c->n_layers; i++) {
        nb_layer_weights *L = &w->layers[i];
        ADD(&L->attn_norm, H, 1, 1, true, "model.layers.%d.input_layernorm.weight", i);
        ADD(&L->wq, Hq, H, 2, false, "model.layers.%d.self_attn.q_proj.weight", i);
        ADD(&L->wk, Hkv, H, 2, false, "model.layers.%d.self_attn.k_proj.weight", i);
        ADD(&L->wv, Hkv, H, 2, false, "model.layers.%d.self_attn.v_proj.weight", i);
        ADD(&L->wo, H, Hq, 2, false, "model.layers.%d.self_attn.o_proj.weight", i);
        ADD(&L->ffn_norm, H, 1, 1, true, "model.layers.%d.post_attention_layernorm.weight", i);
        ADD(&L->w_gate, I, H, 2, false, "model.layers.%d.mlp.gate_proj.weight", i);
        ADD(&L->w_up, I, H, 2, false, "model.layers.%d.mlp.up_proj.weight", i);
        ADD(&L->w_down, H, I, 2, false, "model.layers.%d.mlp.down_proj.weight", i);
    }
    ADD(&w->out_norm, H, 1, 1, true, "model.norm.weight");
    ADD(&w->lm_head, V, H, 2, false, "lm_head.weight");
#undef ADD
    p->total = off;
    return n;
}

static int plan_count(const nb_model_config *c) { return 1 + 9 * c->n_layers + 2; }

static nb_status shape_config(const synth_shape *s, nb_model_config *cfg, char *err,
                              size_t err_len) {
    char src[96];
    snprintf(src, sizeof src, "synthetic:%s config", s->name);
    return nb_model_config_parse(s->config_json, strlen(s->config_json), src, cfg, err,
                                 err_len);
}

nb_status nb_model_synthetic_config(const char *name, nb_model_config *cfg,
                                    size_t *weight_bytes, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!name || !cfg)
        return set_err(err, err_len, NB_ERR_INVALID_ARG, "nb_model_synthetic_config: NULL argument");
    const synth_shape *s = find_shape(name);
    if (!s)
        return set_err(err, err_len, NB_ERR_NOT_FOUND,
                       "unknown synthetic model \"%s\" (known: %s)", name,
                       nb_model_synthetic_names());
    nb_status st = shape_config(s, cfg, err, err_len);
    if (st || !weight_bytes) return st;
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size, V = cfg->vocab_size;
    const int64_t Hq = (int64_t)cfg->n_heads * cfg->head_dim;
    const int64_t Hkv = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    int64_t per_layer = 2 * H + Hq * H * 2 + Hkv * H * 2 + 3 * I * H;
    int64_t elems = 2 * V * H + H + per_layer * cfg->n_layers;
    *weight_bytes = (size_t)elems * nb_dtype_size(s->dtype);
    return NB_OK;
}

// ---------------------------------------------------------------- the fill

static inline uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct fill_job {
    const synth_plan *p;
    unsigned char *blob;
    uint64_t seed;
    int part, n_parts;
    int64_t table_fan_in;  // fan_in the table below was made for; 0: none yet
    void *table;           // [65536] values in the model dtype, one per 16-bit draw
} fill_job;

// Element e of tensor k: 16 bits of mix64(key_k + e/4) (bf16 and f32 alike,
// so a shape's values do not depend on its dtype beyond rounding), mapped to
// a uniform on (-a, a) with a = sqrt(3 / fan_in): standard deviation
// 1/sqrt(fan_in). NOTE: the 16 bits index a table of the 65536 possible
// values, which keeps the fill at memory speed (a 7B model in seconds).
static void make_table(fill_job *j, int64_t fan_in) {
    const float sc = sqrtf(3.0f / (float)fan_in) / 32768.0f;
    for (uint32_t v = 0; v < 65536; v++) {
        float u = ((float)v + 0.5f - 32768.0f) * sc;
        if (j->p->dtype == NB_DTYPE_F32)
            ((float *)j->table)[v] = u;
        else
            nb_store_f32(j->table, j->p->dtype, v, u);
    }
    j->table_fan_in = fan_in;
}

static void fill_range(const synth_tensor *t, int k, fill_job *j, int64_t e0, int64_t e1) {
    void *base = j->blob + t->offset;
    const nb_dtype dt = j->p->dtype;
    if (t->ones) {
        for (int64_t e = e0; e < e1; e++) nb_store_f32(base, dt, (size_t)e, 1.0f);
        return;
    }
    if (j->table_fan_in != t->cols) make_table(j, t->cols);
    const uint64_t key = mix64(j->seed ^ mix64((uint64_t)k + 1));
    int64_t e = e0;
    if (dt == NB_DTYPE_F32) {
        const float *tab = j->table;
        float *out = base;
        for (; e < e1; e++)
            out[e] = tab[(mix64(key + (uint64_t)(e >> 2)) >> (16 * (e & 3))) & 0xffffu];
        return;
    }
    const uint16_t *tab = j->table;
    uint16_t *out = base;
    for (; e < e1 && (e & 3); e++)
        out[e] = tab[(mix64(key + (uint64_t)(e >> 2)) >> (16 * (e & 3))) & 0xffffu];
    for (; e + 4 <= e1; e += 4) {
        uint64_t r = mix64(key + (uint64_t)(e >> 2));
        out[e] = tab[r & 0xffffu];
        out[e + 1] = tab[(r >> 16) & 0xffffu];
        out[e + 2] = tab[(r >> 32) & 0xffffu];
        out[e + 3] = tab[r >> 48];
    }
    for (; e < e1; e++)
        out[e] = tab[(mix64(key + (uint64_t)(e >> 2)) >> (16 * (e & 3))) & 0xffffu];
}

static void *fill_thread(void *arg) {
    fill_job *j = arg;
    const synth_plan *p = j->p;
    for (int k = 0; k < p->n_tensors; k++) {
        const synth_tensor *t = &p->t[k];
        int64_t n = t->rows * t->cols;
        // Split each tensor in n_parts slices on 4-element boundaries.
        int64_t q = (n / j->n_parts + 3) & ~(int64_t)3;
        int64_t e0 = q * j->part, e1 = e0 + q;
        if (j->part == j->n_parts - 1) e1 = n;
        if (e1 > n) e1 = n;
        if (e0 < e1) fill_range(t, k, j, e0, e1);
    }
    return NULL;
}

// ---------------------------------------------------------------- ownership

typedef struct synth_owned {
    void *blob;
    size_t blob_len;
    char *names; // every view's name, NUL separated
} synth_owned;

static void synth_owned_free(void *arg) {
    synth_owned *o = arg;
    if (!o) return;
    if (o->blob) munmap(o->blob, o->blob_len);
    free(o->names);
    free(o);
}

nb_status nb_model_synthetic(const char *name, uint64_t seed, nb_model **out, char *err,
                             size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!name || !out)
        return set_err(err, err_len, NB_ERR_INVALID_ARG, "nb_model_synthetic: NULL argument");
    *out = NULL;
    const synth_shape *s = find_shape(name);
    if (!s)
        return set_err(err, err_len, NB_ERR_NOT_FOUND,
                       "unknown synthetic model \"%s\" (known: %s)", name,
                       nb_model_synthetic_names());
    synth_plan p = {.dtype = s->dtype};
    nb_status st = shape_config(s, &p.cfg, err, err_len);
    if (st) return st;

    nb_model_weights w = {0};
    synth_owned *o = calloc(1, sizeof *o);
    w.layers = calloc((size_t)p.cfg.n_layers, sizeof *w.layers);
    p.t = calloc((size_t)plan_count(&p.cfg), sizeof *p.t);
    if (!o || !w.layers || !p.t) goto out_oom;
    w.n_layers = p.cfg.n_layers;
    p.n_tensors = plan_tensors(&p, &w);

    o->blob_len = p.total;
    o->blob = mmap(NULL, o->blob_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (o->blob == MAP_FAILED) {
        o->blob = NULL;
        st = set_err(err, err_len, NB_ERR_OUT_OF_MEMORY,
                     "synthetic:%s: cannot allocate %.2f GB of weights", s->name,
                     (double)p.total / 1e9);
        goto out_free;
    }
#ifdef MADV_HUGEPAGE
    madvise(o->blob, o->blob_len, MADV_HUGEPAGE); // NOTE: fewer page faults in the fill
#endif
    size_t names_len = 0;
    for (int k = 0; k < p.n_tensors; k++) names_len += strlen(p.t[k].name) + 1;
    if (!(o->names = malloc(names_len))) goto out_oom;

    // Fill: one thread for small models, up to 16 (at least 2) for big ones.
    enum { MAX_FILL_THREADS = 16 };
    int n_threads = 1;
    if (p.total > ((size_t)64 << 20)) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = nc < 2 ? 2 : nc > MAX_FILL_THREADS ? MAX_FILL_THREADS : (int)nc;
    }
    fill_job jobs[MAX_FILL_THREADS];
    pthread_t th[MAX_FILL_THREADS];
    int started = 0;
    void *tables = malloc((size_t)n_threads * 65536 * nb_dtype_size(p.dtype));
    if (!tables) goto out_oom;
    for (int i = 0; i < n_threads; i++) {
        jobs[i] = (fill_job){.p = &p, .blob = o->blob, .seed = seed, .part = i,
                             .n_parts = n_threads,
                             .table = (char *)tables + (size_t)i * 65536 * nb_dtype_size(p.dtype)};
        if (i == 0) continue; // part 0 runs on this thread
        if (pthread_create(&th[i], NULL, fill_thread, &jobs[i]) != 0) break;
        started = i;
    }
    // Parts whose thread did not start run here, after part 0.
    fill_thread(&jobs[0]);
    for (int i = started + 1; i < n_threads; i++) fill_thread(&jobs[i]);
    for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
    free(tables);

    char *np = o->names;
    for (int k = 0; k < p.n_tensors; k++) {
        const synth_tensor *t = &p.t[k];
        size_t l = strlen(t->name) + 1;
        memcpy(np, t->name, l);
        *t->view = (nb_tensor_view){
            .data = (unsigned char *)o->blob + t->offset,
            .dtype = p.dtype,
            .shape = {t->rows, t->cols},
            .ndim = t->ndim,
            .name = np,
        };
        np += l;
    }
    w.lm_head_tied = false;
    char dir[64];
    snprintf(dir, sizeof dir, "synthetic:%s", s->name);
    nb_model *m = nb_model_new_synthetic_internal(dir, &p.cfg, &w, o, synth_owned_free);
    if (!m) goto out_oom;
    free(p.t);
    *out = m;
    return NB_OK;

out_oom:
    st = set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "synthetic:%s: out of memory", s->name);
out_free:
    free(p.t);
    free(w.layers);
    synth_owned_free(o);
    return st;
}
