// model_config.c: config.json -> nb_model_config, with HF's defaults and
// the refusals listed in model_config.h. Parsing is strict about types (a
// string where a number belongs is an error naming the field) and lenient
// about absent optional fields (null counts as absent, as in transformers).
#include "model_config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

const char *nb_arch_name(nb_arch a) {
    switch (a) {
    case NB_ARCH_LLAMA: return "llama";
    case NB_ARCH_MISTRAL: return "mistral";
    case NB_ARCH_QWEN2: return "qwen2";
    }
    return "unknown";
}

static nb_status set_err(char *err, size_t err_len, nb_status st, const char *fmt, ...) {
    if (err && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

// Parse context: the file name for messages and the error sink.
typedef struct cfg_ctx {
    const char *src;
    char *err;
    size_t err_len;
} cfg_ctx;

#define CFG_FAIL(c, st, ...) set_err((c)->err, (c)->err_len, (st), __VA_ARGS__)

// An item that is absent or JSON null counts as absent.
static const cJSON *get_item(const cJSON *obj, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return (it && !cJSON_IsNull(it)) ? it : NULL;
}

// Reads an integer field into *out. Absent: *out = def and NB_OK unless required.
static nb_status get_int(const cfg_ctx *c, const cJSON *obj, const char *key, bool required,
                         long long def, long long lo, long long hi, long long *out) {
    const cJSON *it = get_item(obj, key);
    if (!it) {
        if (required)
            return CFG_FAIL(c, NB_ERR_FORMAT, "%s: missing required field \"%s\"", c->src, key);
        *out = def;
        return NB_OK;
    }
    if (!cJSON_IsNumber(it))
        return CFG_FAIL(c, NB_ERR_FORMAT, "%s: field \"%s\" must be an integer", c->src, key);
    double v = it->valuedouble;
    if (!(v == floor(v)) || v < (double)lo || v > (double)hi)
        return CFG_FAIL(c, NB_ERR_FORMAT,
                        "%s: field \"%s\" = %g, expected an integer in [%lld, %lld]", c->src,
                        key, v, lo, hi);
    *out = (long long)v;
    return NB_OK;
}

// Reads a finite number field; `positive` requires > 0.
static nb_status get_num(const cfg_ctx *c, const cJSON *obj, const char *key, bool required,
                         double def, bool positive, double *out) {
    const cJSON *it = get_item(obj, key);
    if (!it) {
        if (required)
            return CFG_FAIL(c, NB_ERR_FORMAT, "%s: missing required field \"%s\"", c->src, key);
        *out = def;
        return NB_OK;
    }
    if (!cJSON_IsNumber(it))
        return CFG_FAIL(c, NB_ERR_FORMAT, "%s: field \"%s\" must be a number", c->src, key);
    double v = it->valuedouble;
    if (!isfinite(v) || (positive && !(v > 0)))
        return CFG_FAIL(c, NB_ERR_FORMAT, "%s: field \"%s\" = %g, expected a %s number",
                        c->src, key, v, positive ? "positive" : "finite");
    *out = v;
    return NB_OK;
}

static nb_status get_bool(const cfg_ctx *c, const cJSON *obj, const char *key, bool def,
                          bool *out) {
    const cJSON *it = get_item(obj, key);
    if (!it) {
        *out = def;
        return NB_OK;
    }
    if (!cJSON_IsBool(it))
        return CFG_FAIL(c, NB_ERR_FORMAT, "%s: field \"%s\" must be true or false", c->src, key);
    *out = cJSON_IsTrue(it);
    return NB_OK;
}

static bool arch_from_class(const char *s, nb_arch *a) {
    if (!strcmp(s, "LlamaForCausalLM")) *a = NB_ARCH_LLAMA;
    else if (!strcmp(s, "MistralForCausalLM")) *a = NB_ARCH_MISTRAL;
    else if (!strcmp(s, "Qwen2ForCausalLM")) *a = NB_ARCH_QWEN2;
    else return false;
    return true;
}

static bool arch_from_type(const char *s, nb_arch *a) {
    if (!strcmp(s, "llama")) *a = NB_ARCH_LLAMA;
    else if (!strcmp(s, "mistral")) *a = NB_ARCH_MISTRAL;
    else if (!strcmp(s, "qwen2")) *a = NB_ARCH_QWEN2;
    else return false;
    return true;
}

// `architectures` (the class HF instantiates) wins over `model_type`.
static nb_status parse_arch(const cfg_ctx *c, const cJSON *root, nb_arch *a) {
    const cJSON *archs = get_item(root, "architectures");
    const cJSON *type = get_item(root, "model_type");
    if (type && !cJSON_IsString(type))
        return CFG_FAIL(c, NB_ERR_FORMAT, "%s: field \"model_type\" must be a string", c->src);
    if (archs) {
        if (!cJSON_IsArray(archs) || cJSON_GetArraySize(archs) < 1 ||
            !cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
            return CFG_FAIL(c, NB_ERR_FORMAT,
                            "%s: field \"architectures\" must be a non-empty list of strings",
                            c->src);
        const char *cls = cJSON_GetArrayItem(archs, 0)->valuestring;
        if (arch_from_class(cls, a)) return NB_OK;
        return CFG_FAIL(c, NB_ERR_UNSUPPORTED,
                        "%s: unsupported architecture \"%s\" (model_type \"%s\"); supported: "
                        "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM",
                        c->src, cls, type ? type->valuestring : "(none)");
    }
    if (type) {
        if (arch_from_type(type->valuestring, a)) return NB_OK;
        return CFG_FAIL(c, NB_ERR_UNSUPPORTED,
                        "%s: unsupported model_type \"%s\"; supported: llama, mistral, qwen2",
                        c->src, type->valuestring);
    }
    return CFG_FAIL(c, NB_ERR_FORMAT,
                    "%s: neither \"architectures\" nor \"model_type\" is given", c->src);
}

static nb_status parse_rope_scaling(const cfg_ctx *c, const cJSON *rs, nb_rope_scaling *out) {
    memset(out, 0, sizeof *out);
    out->type = NB_ROPE_NONE;
    out->factor = 1.0f;
    if (!rs) return NB_OK;
    if (!cJSON_IsObject(rs))
        return CFG_FAIL(c, NB_ERR_FORMAT, "%s: field \"rope_scaling\" must be an object or null",
                        c->src);
    // transformers writes "rope_type" since 4.45; older files say "type".
    const cJSON *t = get_item(rs, "rope_type");
    if (!t) t = get_item(rs, "type");
    if (!t || !cJSON_IsString(t))
        return CFG_FAIL(c, NB_ERR_FORMAT,
                        "%s: rope_scaling has no string \"rope_type\" (or \"type\")", c->src);
    const char *ty = t->valuestring;
    nb_status st;
    double v;
    if (!strcmp(ty, "default")) return NB_OK;
    if (!strcmp(ty, "linear")) {
        out->type = NB_ROPE_LINEAR;
        if ((st = get_num(c, rs, "factor", true, 1.0, true, &v))) return st;
        out->factor = (float)v;
        return NB_OK;
    }
    if (!strcmp(ty, "llama3")) {
        out->type = NB_ROPE_LLAMA3;
        long long omax;
        if ((st = get_num(c, rs, "factor", true, 1.0, true, &v))) return st;
        out->factor = (float)v;
        if ((st = get_num(c, rs, "low_freq_factor", true, 1.0, true, &v))) return st;
        out->low_freq_factor = (float)v;
        if ((st = get_num(c, rs, "high_freq_factor", true, 1.0, true, &v))) return st;
        out->high_freq_factor = (float)v;
        if ((st = get_int(c, rs, "original_max_position_embeddings", true, 0, 1, INT32_MAX,
                          &omax)))
            return st;
        out->original_max_position_embeddings = (int)omax;
        if (!(out->high_freq_factor > out->low_freq_factor))
            return CFG_FAIL(c, NB_ERR_FORMAT,
                            "%s: rope_scaling llama3 needs high_freq_factor (%g) > "
                            "low_freq_factor (%g)",
                            c->src, out->high_freq_factor, out->low_freq_factor);
        return NB_OK;
    }
    return CFG_FAIL(c, NB_ERR_UNSUPPORTED,
                    "%s: rope_scaling type \"%s\" is not supported (supported: null, "
                    "\"default\", \"linear\", \"llama3\")",
                    c->src, ty);
}

static nb_status parse_ids(const cfg_ctx *c, const cJSON *root, nb_model_config *cfg) {
    long long v;
    nb_status st;
    if ((st = get_int(c, root, "bos_token_id", false, -1, 0, INT32_MAX, &v))) return st;
    cfg->bos_token_id = (int)v;
    cfg->n_eos_token_ids = 0;
    const cJSON *eos = get_item(root, "eos_token_id");
    if (!eos) return NB_OK;
    if (cJSON_IsNumber(eos)) {
        if ((st = get_int(c, root, "eos_token_id", true, 0, 0, INT32_MAX, &v))) return st;
        cfg->eos_token_ids[cfg->n_eos_token_ids++] = (int)v;
        return NB_OK;
    }
    if (!cJSON_IsArray(eos))
        return CFG_FAIL(c, NB_ERR_FORMAT,
                        "%s: field \"eos_token_id\" must be an integer or a list of integers",
                        c->src);
    if (cJSON_GetArraySize(eos) > NB_MAX_EOS_IDS)
        return CFG_FAIL(c, NB_ERR_UNSUPPORTED, "%s: eos_token_id lists %d ids, at most %d kept",
                        c->src, cJSON_GetArraySize(eos), NB_MAX_EOS_IDS);
    const cJSON *e;
    cJSON_ArrayForEach(e, eos) {
        double d = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(d == floor(d)) || d < 0 || d > INT32_MAX)
            return CFG_FAIL(c, NB_ERR_FORMAT,
                            "%s: eos_token_id list holds a non-integer or negative entry",
                            c->src);
        cfg->eos_token_ids[cfg->n_eos_token_ids++] = (int)d;
    }
    return NB_OK;
}

static nb_status parse_root(const cfg_ctx *c, const cJSON *root, nb_model_config *cfg) {
    nb_status st;
    long long v;
    double d;
    if (!cJSON_IsObject(root))
        return CFG_FAIL(c, NB_ERR_FORMAT, "%s: top level is not a JSON object", c->src);
    if ((st = parse_arch(c, root, &cfg->arch))) return st;

    // NOTE: the shape fields are required even though transformers has
    // defaults for them (Llama-2-7B's): a config that omits them is far more
    // likely broken than meant to be a 7B.
    const int imax = 1 << 30;
    if ((st = get_int(c, root, "hidden_size", true, 0, 1, imax, &v))) return st;
    cfg->hidden_size = (int)v;
    if ((st = get_int(c, root, "intermediate_size", true, 0, 1, imax, &v))) return st;
    cfg->intermediate_size = (int)v;
    if ((st = get_int(c, root, "num_hidden_layers", true, 0, 1, 1 << 16, &v))) return st;
    cfg->n_layers = (int)v;
    if ((st = get_int(c, root, "num_attention_heads", true, 0, 1, 1 << 16, &v))) return st;
    cfg->n_heads = (int)v;
    if ((st = get_int(c, root, "num_key_value_heads", false, cfg->n_heads, 1, 1 << 16, &v)))
        return st;
    cfg->n_kv_heads = (int)v;
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return CFG_FAIL(c, NB_ERR_FORMAT,
                        "%s: num_attention_heads (%d) is not a multiple of "
                        "num_key_value_heads (%d)",
                        c->src, cfg->n_heads, cfg->n_kv_heads);
    if (!get_item(root, "head_dim") && cfg->hidden_size % cfg->n_heads != 0)
        return CFG_FAIL(c, NB_ERR_FORMAT,
                        "%s: no head_dim and hidden_size (%d) is not a multiple of "
                        "num_attention_heads (%d)",
                        c->src, cfg->hidden_size, cfg->n_heads);
    if ((st = get_int(c, root, "head_dim", false, cfg->hidden_size / cfg->n_heads, 1, 1 << 16,
                      &v)))
        return st;
    cfg->head_dim = (int)v;
    if ((long long)cfg->n_heads * cfg->head_dim > imax)
        return CFG_FAIL(c, NB_ERR_FORMAT, "%s: num_attention_heads * head_dim is too large",
                        c->src);
    if ((st = get_int(c, root, "vocab_size", true, 0, 1, imax, &v))) return st;
    cfg->vocab_size = (int)v;
    if ((st = get_num(c, root, "rms_norm_eps", false, 1e-6, true, &d))) return st;
    cfg->rms_norm_eps = (float)d;

    // transformers v5 moves rope_theta and the scaling into "rope_parameters".
    const cJSON *rp = get_item(root, "rope_parameters");
    if (rp && !cJSON_IsObject(rp))
        return CFG_FAIL(c, NB_ERR_FORMAT, "%s: field \"rope_parameters\" must be an object",
                        c->src);
    const cJSON *theta_src = (rp && get_item(rp, "rope_theta")) ? rp : root;
    if ((st = get_num(c, theta_src, "rope_theta", false, 10000.0, true, &d))) return st;
    cfg->rope_theta = d;
    const cJSON *rs = get_item(root, "rope_scaling");
    if (!rs && rp) rs = rp;
    if ((st = parse_rope_scaling(c, rs, &cfg->rope_scaling))) return st;

    long long def_ctx = cfg->arch == NB_ARCH_LLAMA ? 2048 : cfg->arch == NB_ARCH_MISTRAL
                                                                ? 4096 * 32
                                                                : 32768;
    if ((st = get_int(c, root, "max_position_embeddings", false, def_ctx, 1, INT32_MAX, &v)))
        return st;
    cfg->max_position_embeddings = (int)v;
    if ((st = get_bool(c, root, "tie_word_embeddings", false, &cfg->tie_word_embeddings)))
        return st;

    const cJSON *dt = get_item(root, "torch_dtype");
    if (!dt) dt = get_item(root, "dtype");
    cfg->has_torch_dtype = false;
    cfg->torch_dtype = NB_DTYPE_F32;
    if (dt && cJSON_IsString(dt)) {
        const char *s = dt->valuestring;
        cfg->has_torch_dtype = true;
        if (!strcmp(s, "float32")) cfg->torch_dtype = NB_DTYPE_F32;
        else if (!strcmp(s, "float16")) cfg->torch_dtype = NB_DTYPE_F16;
        else if (!strcmp(s, "bfloat16")) cfg->torch_dtype = NB_DTYPE_BF16;
        else cfg->has_torch_dtype = false; // informational only: the tensors decide
    }
    if ((st = parse_ids(c, root, cfg))) return st;

    bool attention_bias, mlp_bias;
    if ((st = get_bool(c, root, "attention_bias", false, &attention_bias))) return st;
    if ((st = get_bool(c, root, "mlp_bias", false, &mlp_bias))) return st;
    if (mlp_bias)
        return CFG_FAIL(c, NB_ERR_UNSUPPORTED, "%s: mlp_bias = true is not supported", c->src);
    // Qwen2 hard-codes bias=True on q/k/v and False on o; Mistral has none;
    // Llama's attention_bias covers q, k, v and o.
    cfg->qkv_bias = cfg->arch == NB_ARCH_QWEN2 || (cfg->arch == NB_ARCH_LLAMA && attention_bias);
    cfg->o_bias = cfg->arch == NB_ARCH_LLAMA && attention_bias;

    const cJSON *act = get_item(root, "hidden_act");
    if (act && (!cJSON_IsString(act) ||
                (strcmp(act->valuestring, "silu") && strcmp(act->valuestring, "swish"))))
        return CFG_FAIL(c, NB_ERR_UNSUPPORTED,
                        "%s: hidden_act \"%s\" is not supported (only silu)", c->src,
                        cJSON_IsString(act) ? act->valuestring : "?");

    cfg->sliding_window = 0;
    if (cfg->arch != NB_ARCH_LLAMA) {
        bool use_sw = true;
        if (cfg->arch == NB_ARCH_QWEN2 &&
            (st = get_bool(c, root, "use_sliding_window", false, &use_sw)))
            return st;
        if ((st = get_int(c, root, "sliding_window", false, 0, 0, INT32_MAX, &v))) return st;
        cfg->sliding_window = use_sw ? (int)v : 0;
    }
    return NB_OK;
}

// 1-based line and column of byte offset `off` in `s`.
static void line_col(const char *s, size_t off, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (s[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

nb_status nb_model_config_parse(const char *json, size_t len, const char *src_name,
                                nb_model_config *cfg, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!json || !cfg)
        return set_err(err, err_len, NB_ERR_INVALID_ARG, "nb_model_config_parse: NULL argument");
    cfg_ctx c = {src_name ? src_name : "config.json", err, err_len};
    memset(cfg, 0, sizeof *cfg);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!root) {
        size_t off = (end && end >= json && end <= json + len) ? (size_t)(end - json) : len;
        int line, col;
        line_col(json, off, &line, &col);
        return CFG_FAIL(&c, NB_ERR_FORMAT, "%s: invalid JSON at line %d, column %d (byte %zu)",
                        c.src, line, col, off);
    }
    nb_status st = parse_root(&c, root, cfg);
    cJSON_Delete(root);
    return st;
}

nb_status nb_model_config_load(const char *path, nb_model_config *cfg, char *err,
                               size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!path || !cfg)
        return set_err(err, err_len, NB_ERR_INVALID_ARG, "nb_model_config_load: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f)
        return set_err(err, err_len, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO,
                       "%s: cannot open: %s", path, strerror(errno));
    nb_status st = NB_OK;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = set_err(err, err_len, NB_ERR_IO, "%s: cannot determine size: %s", path,
                     strerror(errno));
        goto out_close;
    }
    if (n > (64L << 20)) {
        st = set_err(err, err_len, NB_ERR_FORMAT, "%s: %ld bytes is too large for a config",
                     path, n);
        goto out_close;
    }
    buf = malloc((size_t)n + 1);
    if (!buf) {
        st = set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto out_close;
    }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        st = set_err(err, err_len, NB_ERR_IO, "%s: read failed", path);
        goto out_free_buf;
    }
    buf[n] = '\0';
    st = nb_model_config_parse(buf, (size_t)n, path, cfg, err, err_len);
out_free_buf:
    free(buf);
out_close:
    fclose(f);
    return st;
}
