// test_synthetic.c: built-in synthetic models. tiny builds, the engine
// prefills, drafts, verifies and decodes finite tokens on it; weights are a
// function of the seed only; unknown names are refused with the known list;
// the big shapes are checked through their configs only (too big for CI).
#include <math.h>
#include <string.h>

#include "engine.h"
#include "model_loader.h"
#include "model_synthetic.h"
#include "nb_test.h"

static bool views_equal(const nb_tensor_view *a, const nb_tensor_view *b) {
    size_t n = (size_t)(a->shape[0] * a->shape[1]) * nb_dtype_size(a->dtype);
    return a->dtype == b->dtype && a->shape[0] == b->shape[0] && a->shape[1] == b->shape[1] &&
           !memcmp(a->data, b->data, n);
}

static void test_tiny_shapes_and_values(void) {
    nb_model *m = NULL;
    char err[256];
    CHECKF(nb_model_synthetic("tiny", 7, &m, err, sizeof err) == NB_OK, "%s", err);
    if (!m) return;
    CHECK(nb_model_is_synthetic(m));
    CHECK(!strcmp(nb_model_get_dir(m), "synthetic:tiny"));
    const nb_model_config *c = nb_model_get_config(m);
    CHECK(c->n_layers == 2 && c->hidden_size == 128 && c->n_heads == 4 && c->n_kv_heads == 2 &&
          c->head_dim == 32 && c->vocab_size == 512);
    const nb_model_weights *w = nb_model_get_weights(m);
    CHECK(w->n_layers == 2);
    CHECK(w->tok_embd.dtype == NB_DTYPE_F32 && w->tok_embd.shape[0] == 512 &&
          w->tok_embd.shape[1] == 128 && w->tok_embd.ndim == 2);
    CHECK(w->layers[1].wk.shape[0] == 64 && w->layers[1].wk.shape[1] == 128);
    CHECK(w->layers[0].w_down.shape[0] == 128 && w->layers[0].w_down.shape[1] == c->intermediate_size);
    CHECK(w->lm_head.data && w->lm_head.data != w->tok_embd.data && !w->lm_head_tied);
    CHECK(w->layers[0].bq.data == NULL && w->layers[0].bq.ndim == 0);
    CHECK(w->out_norm.ndim == 1 && ((const float *)w->out_norm.data)[5] == 1.0f);
    CHECK(w->layers[1].wq.name && strstr(w->layers[1].wq.name, "layers.1.self_attn.q_proj"));
    // Values: within (-a, a), mean ~0, std ~1/sqrt(fan_in).
    const float *q = w->layers[0].wq.data;
    size_t n = (size_t)(w->layers[0].wq.shape[0] * w->layers[0].wq.shape[1]);
    double s = 0, s2 = 0, a = sqrt(3.0 / 128);
    bool in_range = true;
    for (size_t i = 0; i < n; i++) {
        s += q[i];
        s2 += (double)q[i] * q[i];
        if (!(fabs(q[i]) < a)) in_range = false;
    }
    double mean = s / n, sd = sqrt(s2 / n - mean * mean);
    CHECK(in_range);
    CHECKF(fabs(mean) < 0.01, "mean %g", mean);
    CHECKF(fabs(sd * sqrt(128.0) - 1.0) < 0.05, "sd %g", sd);
    nb_tensor_view v;
    CHECK(nb_model_find_tensor(m, "model.norm.weight", &v, err, sizeof err) == NB_ERR_NOT_FOUND);
    nb_model_free(&m);
    CHECK(m == NULL);
}

static void test_seed(void) {
    nb_model *a = NULL, *b = NULL, *c = NULL;
    char err[256];
    CHECK(nb_model_synthetic("tiny", 1, &a, err, sizeof err) == NB_OK);
    CHECK(nb_model_synthetic("synthetic:tiny", 1, &b, err, sizeof err) == NB_OK);
    CHECK(nb_model_synthetic("tiny", 2, &c, err, sizeof err) == NB_OK);
    if (a && b && c) {
        const nb_model_weights *wa = nb_model_get_weights(a), *wb = nb_model_get_weights(b),
                               *wc = nb_model_get_weights(c);
        CHECK(views_equal(&wa->tok_embd, &wb->tok_embd));
        CHECK(views_equal(&wa->layers[1].w_up, &wb->layers[1].w_up));
        CHECK(views_equal(&wa->lm_head, &wb->lm_head));
        CHECK(!views_equal(&wa->tok_embd, &wc->tok_embd));
        CHECK(!views_equal(&wa->layers[1].w_up, &wc->layers[1].w_up));
        // Different tensors of one model differ too.
        CHECK(memcmp(wa->layers[0].wq.data, wa->layers[1].wq.data, 128 * 128 * 4) != 0);
    }
    nb_model_free(&a);
    nb_model_free(&b);
    nb_model_free(&c);
}

static void test_unknown_and_configs(void) {
    nb_model *m = (nb_model *)1;
    char err[256];
    CHECK(nb_model_synthetic("gpt-5", 0, &m, err, sizeof err) == NB_ERR_NOT_FOUND);
    CHECK(m == NULL);
    CHECKF(strstr(err, "gpt-5") && strstr(err, "tiny") && strstr(err, "llama-2-7b") &&
               strstr(err, "llama-3-8b"),
           "%s", err);
    CHECK(nb_model_synthetic(NULL, 0, &m, err, sizeof err) == NB_ERR_INVALID_ARG);
    CHECK(!nb_model_is_synthetic(NULL));

    nb_model_config c;
    size_t bytes = 0;
    CHECK(nb_model_synthetic_config("nope", &c, &bytes, err, sizeof err) == NB_ERR_NOT_FOUND);
    CHECKF(nb_model_synthetic_config("llama-2-7b", &c, &bytes, err, sizeof err) == NB_OK, "%s",
           err);
    CHECK(c.n_layers == 32 && c.hidden_size == 4096 && c.n_heads == 32 && c.n_kv_heads == 32 &&
          c.head_dim == 128 && c.intermediate_size == 11008 && c.vocab_size == 32000);
    CHECKF(bytes == (size_t)6738415616ull * 2, "llama-2-7b bytes %zu", bytes); // 6.74B params
    CHECKF(nb_model_synthetic_config("llama-3-8b", &c, &bytes, err, sizeof err) == NB_OK, "%s",
           err);
    CHECK(c.n_layers == 32 && c.hidden_size == 4096 && c.n_heads == 32 && c.n_kv_heads == 8 &&
          c.head_dim == 128 && c.intermediate_size == 14336 && c.vocab_size == 128256);
    CHECK(c.rope_theta == 500000.0 && c.rope_scaling.type == NB_ROPE_LLAMA3 &&
          c.rope_scaling.factor == 8.0f && c.rope_scaling.original_max_position_embeddings == 8192);
    CHECKF(bytes == (size_t)8030261248ull * 2, "llama-3-8b bytes %zu", bytes); // 8.03B params
    CHECK(strstr(nb_model_synthetic_names(), "tiny") != NULL);
}

static void test_engine_on_tiny(void) {
    nb_model *m = NULL;
    char err[256];
    CHECK(nb_model_synthetic("tiny", 42, &m, err, sizeof err) == NB_OK);
    if (!m) return;
    nb_engine_params p = nb_engine_default_params();
    p.max_seqs = 4;
    p.kv_memory = (size_t)16 << 20;
    p.group_size = 64;
    nb_engine *e = nb_engine_new(m, &p, err, sizeof err);
    CHECKF(e != NULL, "%s", err);
    if (!e) {
        nb_model_free(&m);
        return;
    }
    nb_sampling_params sp = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 1};
    int32_t seq, next;
    nb_status sst;
    CHECK(nb_engine_seq_add(e, &sp, &seq) == NB_OK);
    int32_t prompt[100];
    for (int i = 0; i < 100; i++) prompt[i] = (i * 37 + 1) % 512;
    const int32_t *pp[1] = {prompt};
    int32_t len = 100;
    float lp = 0;
    CHECK(nb_engine_prefill(e, 1, &seq, pp, &len, &next, &lp, NULL, &sst) == NB_OK);
    CHECK(sst == NB_OK);
    CHECK(next >= 0 && next < 512);
    CHECK(isfinite(lp) && lp <= 0);
    int32_t drafts[4], out[9], n_out = 0, n_acc = 0;
    float lps[9];
    for (int r = 0; r < 5; r++) {
        CHECK(nb_engine_draft(e, 1, &seq, 4, drafts, &sst) == NB_OK && sst == NB_OK);
        CHECK(nb_engine_verify(e, 1, &seq, out, lps, &n_out, &n_acc, &sst) == NB_OK &&
              sst == NB_OK);
        CHECK(n_out >= 1 && n_out <= 5 && n_acc == n_out - 1);
        for (int j = 0; j < n_out; j++) {
            CHECK(out[j] >= 0 && out[j] < 512);
            CHECK(isfinite(lps[j]));
        }
    }
    int32_t dec[8], nd = 0;
    float dlp[8];
    CHECK(nb_engine_decode(e, 1, &seq, 8, dec, dlp, &nd, &sst) == NB_OK && sst == NB_OK);
    CHECK(nd == 8);
    for (int j = 0; j < nd; j++) CHECK(dec[j] >= 0 && dec[j] < 512 && isfinite(dlp[j]));
    nb_engine_seq_info info;
    CHECK(nb_engine_seq_info_get(e, seq, &info) == NB_OK);
    CHECK(info.n_committed > 100);
    printf("tiny: committed %d, drafts %lld accepted %lld\n", info.n_committed,
           (long long)info.n_draft_tokens, (long long)info.n_accepted_tokens);
    CHECK(nb_engine_seq_free(e, seq) == NB_OK);
    nb_engine_destroy(&e);
    nb_model_free(&m);
}

int main(void) {
    test_tiny_shapes_and_values();
    test_seed();
    test_unknown_and_configs();
    test_engine_on_tiny();
    return nb_test_finish("test_synthetic");
}
