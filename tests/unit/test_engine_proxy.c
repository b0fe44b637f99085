// test_engine_proxy: the engine on proxy-llama-31m (head_dim 128, bf16, GQA).
// (1) greedy continuations equal transformers' fp32 ones in
//     training_report.json (unquantized cache);
// (2) the paged engine's logits equal a dense, unpaged forward pass written
//     here from the reference kernels within a stated tolerance;
// (3) greedy speculative == greedy target-only with the quantized cache.
#include <math.h>
#include <time.h>

#include "attention_ref.h"
#include "engine_test_util.h"
#include "ops_ref.h"

static nb_engine *make_engine(const nb_model *m, bool quant, int kv_dtype, char *err) {
    nb_engine_params p = nb_engine_default_params();
    p.quantized_cache = quant;
    p.group_size = 64;
    p.max_seqs = 4;
    p.max_seq_len = 1024;
    p.max_gamma = 8;
    p.prefill_chunk = 128;
    p.max_batch_rows = 256;
    p.kv_memory = (size_t)96 << 20;
    p.kv_dtype = kv_dtype;
    return nb_engine_new(m, &p, err, 256);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// (1) HF continuations.
static void test_hf_continuations(const nb_model *m) {
    cJSON *rep = etu_read_json("models/proxy-llama-31m/training_report.json");
    const cJSON *g;
    char err[256];
    int kv_dts[2] = {NB_DTYPE_F32, NB_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        nb_engine *e = make_engine(m, false, kv_dts[d], err);
        CHECKF(e, "%s", err);
        int case_i = 0;
        cJSON_ArrayForEach(g, cJSON_GetObjectItem(rep, "golden")) {
            int32_t prompt[64], want[128], got[128];
            int np = etu_ints(cJSON_GetObjectItem(g, "prompt_ids"), prompt, 64);
            int nw = etu_ints(cJSON_GetObjectItem(g, "greedy_fp32_ids"), want, 128);
            nb_sampling_params sp = {0};
            double t0 = now_s();
            CHECK(etu_generate(e, &sp, prompt, np, nw, 0, got, NULL) == NB_OK);
            double dt = now_s() - t0;
            int same = 0;
            while (same < nw && got[same] == want[same]) same++;
            printf("proxy %s-cache greedy, prompt %d: %d/%d tokens equal transformers fp32 "
                   "(%.1f tok/s)\n",
                   kv_dts[d] == NB_DTYPE_F32 ? "f32" : "bf16", case_i, same, nw, nw / dt);
            // The fp32 cache is what transformers ran: all tokens must match.
            // The bf16 cache rounds K/V, so only the 16 are required.
            if (kv_dts[d] == NB_DTYPE_F32) CHECKF(same == nw, "f32 cache: %d of %d", same, nw);
            else CHECKF(same >= 16, "bf16 cache: %d of %d", same, nw);
            case_i++;
        }
        nb_engine_destroy(&e);
    }
    cJSON_Delete(rep);
}

// Dense forward pass without paging: contiguous K/V, the same kernels.
static void dense_logits(const nb_model *m, const int32_t *tok, int n, float *logits) {
    const nb_model_config *c = nb_model_get_config(m);
    const nb_model_weights *w = nb_model_get_weights(m);
    int H = c->hidden_size, D = c->head_dim, I = c->intermediate_size;
    int Hq = c->n_heads * D, Hkv = c->n_kv_heads * D;
    float *x = malloc(sizeof(float) * n * H), *xb = malloc(sizeof(float) * n * H);
    float *q = malloc(sizeof(float) * n * Hq), *k = malloc(sizeof(float) * n * Hkv);
    float *v = malloc(sizeof(float) * n * Hkv), *att = malloc(sizeof(float) * n * Hq);
    float *g = malloc(sizeof(float) * n * I), *u = malloc(sizeof(float) * n * I);
    float *t = malloc(sizeof(float) * n * H), inv[512];
    int32_t pos[4096];
    for (int i = 0; i < n; i++) pos[i] = i;
    nb_ref_rope_inv_freq(inv, D, (float)c->rope_theta, &c->rope_scaling);
    nb_ref_embed(x, w->tok_embd.data, w->tok_embd.dtype, tok, n, H, c->vocab_size);
    for (int l = 0; l < c->n_layers; l++) {
        const nb_layer_weights *L = &w->layers[l];
        nb_ref_rmsnorm(xb, x, L->attn_norm.data, L->attn_norm.dtype, n, H, c->rms_norm_eps);
        nb_ref_matmul(q, xb, L->wq.data, L->wq.dtype, NULL, NB_DTYPE_F32, n, Hq, H);
        nb_ref_matmul(k, xb, L->wk.data, L->wk.dtype, NULL, NB_DTYPE_F32, n, Hkv, H);
        nb_ref_matmul(v, xb, L->wv.data, L->wv.dtype, NULL, NB_DTYPE_F32, n, Hkv, H);
        nb_ref_rope_apply(q, pos, n, c->n_heads, D, inv);
        nb_ref_rope_apply(k, pos, n, c->n_kv_heads, D, inv);
        nb_ref_attention_contiguous(n, c->n_kv_heads, c->n_heads, D, k, v, q, n, 0,
                                    1.0f / sqrtf((float)D), att);
        nb_ref_matmul(t, att, L->wo.data, L->wo.dtype, NULL, NB_DTYPE_F32, n, H, Hq);
        nb_ref_add(x, x, t, (size_t)n * H);
        nb_ref_rmsnorm(xb, x, L->ffn_norm.data, L->ffn_norm.dtype, n, H, c->rms_norm_eps);
        nb_ref_matmul(g, xb, L->w_gate.data, L->w_gate.dtype, NULL, NB_DTYPE_F32, n, I, H);
        nb_ref_matmul(u, xb, L->w_up.data, L->w_up.dtype, NULL, NB_DTYPE_F32, n, I, H);
        nb_ref_silu_mul(g, g, u, (size_t)n * I);
        nb_ref_matmul(t, g, L->w_down.data, L->w_down.dtype, NULL, NB_DTYPE_F32, n, H, I);
        nb_ref_add(x, x, t, (size_t)n * H);
    }
    nb_ref_rmsnorm(xb, x, w->out_norm.data, w->out_norm.dtype, n, H, c->rms_norm_eps);
    nb_ref_matmul(logits, xb, w->lm_head.data, w->lm_head.dtype, NULL, NB_DTYPE_F32, n,
                  c->vocab_size, H);
    free(x); free(xb); free(q); free(k); free(v); free(att); free(g); free(u); free(t);
}

// (2) Paged engine logits == dense logits. With an f32 unquantized cache and
// single-token chunks (so the paged path runs decode-shaped passes over many
// blocks), every operation is the same and the tolerance is tight; the paged
// attention only reorders nothing, so any difference comes from f32 rounding
// of K/V storage (none for f32): tolerance 1e-4 absolute on logits of O(10).
static void test_logits_vs_dense(const nb_model *m) {
    const nb_model_config *c = nb_model_get_config(m);
    int n = NB_TEST_SCALE(150, 70), V = c->vocab_size;
    int32_t tok[150];
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 7919 + 13) % V);
    float *ref = malloc(sizeof(float) * (size_t)n * V), *got = malloc(sizeof(float) * (size_t)n * V);
    dense_logits(m, tok, n, ref);
    char err[256];
    int chunks[2] = {1, 37};
    for (int ci = 0; ci < 2; ci++) {
        nb_engine *e = make_engine(m, false, NB_DTYPE_F32, err);
        CHECKF(e, "%s", err);
        nb_sampling_params sp = {0};
        int32_t seq;
        CHECK(nb_engine_seq_add(e, &sp, &seq) == NB_OK);
        double nll = 0;
        CHECK(nb_engine_score(e, seq, tok, n, chunks[ci], NB_FWD_TARGET, &nll, got) == NB_OK);
        double maxd = 0, maxv = 0;
        for (size_t i = 0; i < (size_t)n * V; i++) {
            double d = fabs((double)got[i] - ref[i]);
            if (d > maxd) maxd = d;
            if (fabs(ref[i]) > maxv) maxv = fabs(ref[i]);
        }
        printf("paged (chunk %d) vs dense logits: max |diff| %.3g (max |logit| %.1f)\n",
               chunks[ci], maxd, maxv);
        CHECKF(maxd <= 1e-4, "chunk %d: max |diff| %g > 1e-4", chunks[ci], maxd);
        nb_engine_destroy(&e);
    }
    free(ref);
    free(got);
}

// (3) greedy speculative == greedy target-only, quantized bf16 cache.
static void test_spec_equals_target(const nb_model *m) {
    cJSON *rep = etu_read_json("models/proxy-llama-31m/training_report.json");
    char err[256];
    nb_engine *e = make_engine(m, true, -1, err);
    CHECKF(e, "%s", err);
    const cJSON *g;
    int n_new = NB_TEST_SCALE(200, 140), gammas[3] = {1, 4, 8};
    cJSON_ArrayForEach(g, cJSON_GetObjectItem(rep, "golden")) {
        int32_t prompt[64], ref[256], got[256];
        int np = etu_ints(cJSON_GetObjectItem(g, "prompt_ids"), prompt, 64);
        nb_sampling_params sp = {0};
        CHECK(etu_generate(e, &sp, prompt, np, n_new, 0, ref, NULL) == NB_OK);
        for (int gi = 0; gi < 3; gi++) {
            etu_gen_stats gs = {0};
            CHECK(etu_generate(e, &sp, prompt, np, n_new, gammas[gi], got, &gs) == NB_OK);
            int same = 0;
            while (same < n_new && got[same] == ref[same]) same++;
            CHECKF(same == n_new, "gamma %d: %d of %d equal", gammas[gi], same, n_new);
            printf("proxy quantized cache, gamma %d: spec == target-only for %d/%d tokens, "
                   "acceptance %.3f\n",
                   gammas[gi], same, n_new, gs.drafted ? (double)gs.accepted / gs.drafted : 0.0);
        }
    }
    nb_engine_destroy(&e);
    cJSON_Delete(rep);
}

int main(void) {
    nb_model *m = etu_load_model("proxy-llama-31m");
    test_hf_continuations(m);
    test_logits_vs_dense(m);
    test_spec_equals_target(m);
    nb_model_free(&m);
    return nb_test_finish("test_engine_proxy");
}
