// model_loader.c: config.json + safetensors -> nb_model (views into mmaps).
//
// Loading is all-or-nothing: the first problem is reported with the file,
// the tensor and expected vs found, and everything opened so far is freed.
#include "model_loader.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model_internal.h"
#include "safetensors.h"

struct nb_model {
    char *dir;
    nb_model_config cfg;
    nb_st_set *weights_set; // owns the mappings every view points into; NULL when synthetic
    nb_model_weights w;
    bool synthetic;                  // made by nb_model_synthetic() (model_synthetic.c)
    void *owned;                     // synthetic: the memory the views point into
    void (*owned_free)(void *owned); // frees `owned` in nb_model_free()
};

static nb_status set_err(char *err, size_t err_len, nb_status st, const char *fmt, ...) {
    if (err && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

static void fmt_shape(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int d = 0; d < ndim && o < len; d++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

// st tensor -> view, checking dtype, rank <= 2 and alignment. `file` names
// the file in messages.
static nb_status make_view(const nb_st_tensor *t, const char *file, nb_tensor_view *v,
                           char *err, size_t err_len) {
    if (!t->dtype_supported)
        return set_err(err, err_len, NB_ERR_UNSUPPORTED,
                       "%s: tensor \"%s\" has dtype %s; supported: F32, F16, BF16", file,
                       t->name, t->dtype_name);
    if (t->ndim > 2) {
        char s[160];
        fmt_shape(s, sizeof s, t->ndim, t->shape);
        return set_err(err, err_len, NB_ERR_UNSUPPORTED,
                       "%s: tensor \"%s\" has rank %d (shape %s); at most 2 supported", file,
                       t->name, t->ndim, s);
    }
    if ((uintptr_t)t->data % t->elem_size != 0)
        return set_err(err, err_len, NB_ERR_FORMAT,
                       "%s: tensor \"%s\" starts at file offset %llu, not aligned to its "
                       "%zu-byte elements",
                       file, t->name, (unsigned long long)t->file_offset, t->elem_size);
    v->data = t->data;
    v->dtype = t->dtype;
    v->ndim = t->ndim ? t->ndim : 1;
    v->shape[0] = t->ndim >= 1 ? t->shape[0] : 1;
    v->shape[1] = t->ndim == 2 ? t->shape[1] : 1;
    v->name = t->name;
    return NB_OK;
}

// Resolve `name` and check it has shape [d0] (ndim 1) or [d0, d1] (ndim 2).
// With !required an absent tensor leaves *v zeroed and returns NB_OK.
static nb_status need(const nb_model *m, const char *name, int ndim, int64_t d0, int64_t d1,
                      bool required, nb_tensor_view *v, char *err, size_t err_len) {
    memset(v, 0, sizeof *v);
    const nb_st_tensor *t;
    const char *file = NULL;
    const int64_t want[2] = {d0, d1};
    char ws[96], fs[160];
    fmt_shape(ws, sizeof ws, ndim, want);
    nb_status st = nb_st_set_find(m->weights_set, name, &t, &file, err, err_len);
    if (st == NB_ERR_NOT_FOUND) {
        if (!required) return NB_OK;
        return set_err(err, err_len, NB_ERR_NOT_FOUND,
                       "%s: missing tensor \"%s\" (expected shape %s)",
                       nb_st_set_source(m->weights_set), name, ws);
    }
    if (st) return st;
    if ((st = make_view(t, file, v, err, err_len))) return st;
    bool ok = t->ndim == ndim && t->shape[0] == d0 && (ndim == 1 || t->shape[1] == d1);
    if (!ok) {
        fmt_shape(fs, sizeof fs, t->ndim, t->shape);
        memset(v, 0, sizeof *v);
        return set_err(err, err_len, NB_ERR_FORMAT,
                       "%s: tensor \"%s\" has shape %s, expected %s (from config.json)", file,
                       name, fs, ws);
    }
    return NB_OK;
}

static nb_status load_layer(const nb_model *m, int i, nb_layer_weights *L, char *err,
                            size_t err_len) {
    const nb_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, I = c->intermediate_size;
    const int64_t Hq = (int64_t)c->n_heads * c->head_dim;
    const int64_t Hkv = (int64_t)c->n_kv_heads * c->head_dim;
    char n[128];
    nb_status st;
#define NEED(field, suffix, nd, a, b, req)                                                   \
    do {                                                                                     \
        snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix);                              \
        if ((st = need(m, n, nd, a, b, req, &L->field, err, err_len))) return st;            \
    } while (0)
    NEED(attn_norm, "input_layernorm.weight", 1, H, 0, true);
    NEED(wq, "self_attn.q_proj.weight", 2, Hq, H, true);
    NEED(wk, "self_attn.k_proj.weight", 2, Hkv, H, true);
    NEED(wv, "self_attn.v_proj.weight", 2, Hkv, H, true);
    NEED(wo, "self_attn.o_proj.weight", 2, H, Hq, true);
    if (c->qkv_bias) {
        NEED(bq, "self_attn.q_proj.bias", 1, Hq, 0, true);
        NEED(bk, "self_attn.k_proj.bias", 1, Hkv, 0, true);
        NEED(bv, "self_attn.v_proj.bias", 1, Hkv, 0, true);
    }
    if (c->o_bias) NEED(bo, "self_attn.o_proj.bias", 1, H, 0, true);
    NEED(ffn_norm, "post_attention_layernorm.weight", 1, H, 0, true);
    NEED(w_gate, "mlp.gate_proj.weight", 2, I, H, true);
    NEED(w_up, "mlp.up_proj.weight", 2, I, H, true);
    NEED(w_down, "mlp.down_proj.weight", 2, H, I, true);
#undef NEED
    return NB_OK;
}

nb_status nb_model_load(const char *dir, nb_model **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!dir || !out)
        return set_err(err, err_len, NB_ERR_INVALID_ARG, "nb_model_load: NULL argument");
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return set_err(err, err_len, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO,
                       "%s: cannot open model directory: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return set_err(err, err_len, NB_ERR_NOT_FOUND, "%s: not a directory", dir);

    nb_status st = NB_OK;
    nb_model *m = calloc(1, sizeof *m);
    size_t dl = strlen(dir);
    char *cfg_path = malloc(dl + sizeof "/config.json");
    if (!m || !cfg_path || !(m->dir = malloc(dl + 1))) {
        st = set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
        goto out_free_model;
    }
    memcpy(m->dir, dir, dl + 1);
    memcpy(cfg_path, dir, dl);
    memcpy(cfg_path + dl, "/config.json", sizeof "/config.json");
    if ((st = nb_model_config_load(cfg_path, &m->cfg, err, err_len))) goto out_free_model;
    if ((st = nb_st_set_open(dir, &m->weights_set, err, err_len))) goto out_free_model;

    const nb_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, V = c->vocab_size;
    m->w.layers = calloc((size_t)c->n_layers, sizeof *m->w.layers);
    if (!m->w.layers) {
        st = set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
        goto out_free_model;
    }
    m->w.n_layers = c->n_layers;
    if ((st = need(m, "model.embed_tokens.weight", 2, V, H, true, &m->w.tok_embd, err,
                   err_len)))
        goto out_free_model;
    for (int i = 0; i < c->n_layers; i++)
        if ((st = load_layer(m, i, &m->w.layers[i], err, err_len))) goto out_free_model;
    if ((st = need(m, "model.norm.weight", 1, H, 0, true, &m->w.out_norm, err, err_len)))
        goto out_free_model;
    if (c->tie_word_embeddings) {
        m->w.lm_head = m->w.tok_embd;
        m->w.lm_head_tied = true;
    } else {
        st = need(m, "lm_head.weight", 2, V, H, false, &m->w.lm_head, err, err_len);
        if (st) goto out_free_model;
        if (!m->w.lm_head.data) {
            st = set_err(err, err_len, NB_ERR_NOT_FOUND,
                         "%s: missing tensor \"lm_head.weight\" (expected shape [%lld, %lld]) "
                         "and config.json has tie_word_embeddings false",
                         nb_st_set_source(m->weights_set), (long long)V, (long long)H);
            goto out_free_model;
        }
    }
    free(cfg_path);
    *out = m;
    return NB_OK;

out_free_model:
    free(cfg_path);
    nb_model_free(&m);
    return st;
}

void nb_model_free(nb_model **mp) {
    if (!mp || !*mp) return;
    nb_model *m = *mp;
    nb_st_set_close(&m->weights_set);
    if (m->owned_free) m->owned_free(m->owned);
    free(m->w.layers);
    free(m->dir);
    free(m);
    *mp = NULL;
}

const nb_model_config *nb_model_get_config(const nb_model *m) { return &m->cfg; }
const nb_model_weights *nb_model_get_weights(const nb_model *m) { return &m->w; }
const char *nb_model_get_dir(const nb_model *m) { return m->dir; }
bool nb_model_is_synthetic(const nb_model *m) { return m && m->synthetic; }

nb_model *nb_model_new_synthetic_internal(const char *dir, const nb_model_config *cfg,
                                          const nb_model_weights *w, void *owned,
                                          void (*owned_free)(void *owned)) {
    nb_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        return NULL;
    }
    m->cfg = *cfg;
    m->w = *w;
    m->synthetic = true;
    m->owned = owned;
    m->owned_free = owned_free;
    return m;
}

nb_status nb_model_find_tensor(const nb_model *m, const char *name, nb_tensor_view *out,
                               char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!m || !name || !out)
        return set_err(err, err_len, NB_ERR_INVALID_ARG, "nb_model_find_tensor: NULL argument");
    memset(out, 0, sizeof *out);
    if (!m->weights_set)
        return set_err(err, err_len, NB_ERR_NOT_FOUND, "%s: no tensor \"%s\" (no checkpoint file)",
                       m->dir, name);
    const nb_st_tensor *t;
    const char *file = NULL;
    nb_status st = nb_st_set_find(m->weights_set, name, &t, &file, err, err_len);
    if (st == NB_ERR_NOT_FOUND)
        return set_err(err, err_len, st, "%s: no tensor \"%s\"",
                       nb_st_set_source(m->weights_set), name);
    if (st) return st;
    return make_view(t, file, out, err, err_len);
}
