// bench_engine_cuda: end-to-end decoding speed of the GPU engine on
// proxy-llama-31m (in-process, no socket): target-only decoding with the
// unquantized bf16 cache (what a user runs without nibbler), target-only with
// the INT8 cache, and self-speculative decoding (gamma 4), at batch 1 and 8
// and several context lengths, with and without CUDA graphs; then sampled
// decoding with the GPU sampler and with host sampling. Prints markdown
// tables of tokens/s (all sequences together) and ms per step.
// Usage: bench_engine_cuda [N_NEW]   (needs ../shared or NB_SHARED_DIR)
#include <cuda_runtime_api.h>
#include <math.h>
#include <time.h>

#include "etu_text.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int load_text_tokens(const char *model_dir, int32_t *ids, int cap) {
    char err[256];
    nb_tokenizer *tk = NULL;
    if (nb_tokenizer_load(model_dir, &tk, err, sizeof(err)) != NB_OK) return 0;
    int n = etu_text_tokens(tk, ids, cap);
    nb_tokenizer_free(&tk);
    return n;
}

typedef enum { RUN_FP16_TARGET, RUN_INT8_TARGET, RUN_SPEC } run_kind;

// Tokens/s of one configuration: B sequences with ctx-token prompts (distinct
// windows of the text), then n_new tokens each.
static double run(const nb_model *m, const int32_t *text, int n_text, run_kind kind, bool graphs, int B,
                  int ctx, int n_new, int gamma, const nb_sampling_params *sp, bool host_sampling,
                  double *acc, double *ms_step) {
    nb_engine_params p = nb_engine_default_params();
    p.backend = "cuda";
    p.quantized_cache = kind != RUN_FP16_TARGET;
    p.kv_dtype = kind == RUN_FP16_TARGET ? NB_DTYPE_F16 : -1;
    p.prefix_cache = false;
    p.group_size = 128;
    p.max_seqs = B;
    p.max_seq_len = 4096;
    p.max_gamma = 8;
    p.prefill_chunk = 512;
    p.max_batch_rows = 1024;
    p.kv_memory = (size_t)2 << 30;
    p.cuda_graphs = graphs;
    p.host_sampling = host_sampling;
    char err[256];
    nb_engine *e = nb_engine_new(m, &p, err, sizeof(err));
    if (!e) {
        fprintf(stderr, "engine: %s\n", err);
        exit(1);
    }
    int32_t seqs[64], next[64], lens[64], n_out[64];
    const int32_t *pr[64];
    nb_status st[64];
    for (int i = 0; i < B; i++) {
        nb_sampling_params spi = *sp;
        spi.seed += (uint64_t)i;
        CHECK(nb_engine_seq_add(e, &spi, &seqs[i]) == NB_OK);
        int off = (int)(((long)i * 997) % (n_text - ctx));
        pr[i] = text + off;
        lens[i] = ctx;
        CHECK(nb_engine_prefill(e, 1, &seqs[i], &pr[i], &lens[i], &next[i], NULL, NULL, &st[i]) == NB_OK);
        CHECK(st[i] == NB_OK);
    }
    int32_t *out = malloc(sizeof(int32_t) * (size_t)B * (n_new + 16) * 2);
    int32_t *drafts = malloc(sizeof(int32_t) * (size_t)B * 16);
    int32_t n_acc[64];
    long produced = 0, steps = 0;
    int64_t drafted = 0, accepted = 0;
    // Warm-up (first-use setup, graph capture), not timed.
    if (kind == RUN_SPEC) {
        for (int w = 0; w < 3; w++) {
            CHECK(nb_engine_draft(e, B, seqs, gamma, drafts, st) == NB_OK);
            CHECK(nb_engine_verify(e, B, seqs, out, NULL, n_out, n_acc, st) == NB_OK);
        }
    } else {
        CHECK(nb_engine_decode(e, B, seqs, 3, out, NULL, n_out, st) == NB_OK);
    }
    double t0 = now_s();
    if (kind == RUN_SPEC) {
        long done_min = 0;
        while (done_min < n_new) {
            CHECK(nb_engine_draft(e, B, seqs, gamma, drafts, st) == NB_OK);
            CHECK(nb_engine_verify(e, B, seqs, out, NULL, n_out, n_acc, st) == NB_OK);
            for (int i = 0; i < B; i++) {
                CHECK(st[i] == NB_OK);
                produced += n_out[i];
                drafted += gamma;
                accepted += n_acc[i];
            }
            steps++;
            done_min = produced / B;
        }
    } else {
        CHECK(nb_engine_decode(e, B, seqs, n_new, out, NULL, n_out, st) == NB_OK);
        for (int i = 0; i < B; i++) produced += n_out[i];
        steps = n_new;
    }
    double dt = now_s() - t0;
    *acc = drafted ? (double)accepted / drafted : 0.0;
    *ms_step = 1e3 * dt / steps;
    free(out);
    free(drafts);
    nb_engine_destroy(&e);
    return produced / dt;
}

int main(int argc, char **argv) {
    etu_require_shared("data/spec_bench_questions.jsonl"); // the text it decodes from
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("SKIP: no CUDA device\n");
        return NB_TEST_SKIP;
    }
    int n_new = argc > 1 ? atoi(argv[1]) : 256;
    nb_model *m = etu_load_model("proxy-llama-31m");
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/models/proxy-llama-31m", nb_test_shared_dir());
    static int32_t text[16384];
    int n_text = load_text_tokens(dir, text, 16384);
    CHECKF(n_text > 4000, "only %d text tokens", n_text);
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("# GPU engine, proxy-llama-31m (8 layers, head_dim 128, bf16), %s, %d new tokens per sequence\n\n",
           prop.name, n_new);
    printf("| graphs | batch | context | fp16-cache target tok/s | INT8-cache target tok/s | spec g4 tok/s "
           "| spec / fp16 | acceptance | ms/step fp16 | ms/round spec |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    int ctxs[3] = {512, 2048, 3584}, Bs[2] = {1, 8};
    const nb_sampling_params greedy = {0};
    for (int g = 1; g >= 0; g--)
        for (int bi = 0; bi < 2; bi++)
            for (int ci = 0; ci < 3; ci++) {
                double a0, a1, a2, ms0, ms1, ms2;
                int ctx = ctxs[ci], B = Bs[bi], nn = ctx + n_new + 16 > 4096 ? 4096 - ctx - 16 : n_new;
                double f = run(m, text, n_text, RUN_FP16_TARGET, g, B, ctx, nn, 4, &greedy, false, &a0, &ms0);
                double q = run(m, text, n_text, RUN_INT8_TARGET, g, B, ctx, nn, 4, &greedy, false, &a1, &ms1);
                double s = run(m, text, n_text, RUN_SPEC, g, B, ctx, nn, 4, &greedy, false, &a2, &ms2);
                printf("| %s | %d | %d | %.0f | %.0f | %.0f | %.2fx | %.3f | %.3f | %.3f |\n", g ? "on" : "off",
                       B, ctx, f, q, s, s / f, a2, ms0, ms2);
                fflush(stdout);
            }
    // Sampling (temperature 0.8, top-p 0.95): tokens drawn and drafts
    // accepted on the GPU, vs the same engine sampling on the host from
    // downloaded logits (the reference twin); graphs on, context 2048.
    const nb_sampling_params samp = {0.8f, 0, 0.95f, 1234};
    printf("\n| sampling T=0.8 top-p 0.95 | batch | INT8-cache target tok/s | spec g4 tok/s | spec / "
           "target | acceptance | ms/step target | ms/round spec |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int host = 0; host <= 1; host++)
        for (int bi = 0; bi < 2; bi++) {
            double a1, a2, ms1, ms2;
            int B = Bs[bi];
            double q = run(m, text, n_text, RUN_INT8_TARGET, true, B, 2048, n_new, 4, &samp, host, &a1, &ms1);
            double s = run(m, text, n_text, RUN_SPEC, true, B, 2048, n_new, 4, &samp, host, &a2, &ms2);
            printf("| %s | %d | %.0f | %.0f | %.2fx | %.3f | %.3f | %.3f |\n",
                   host ? "host (logits downloaded)" : "GPU", B, q, s, s / q, a2, ms1, ms2);
            fflush(stdout);
        }
    nb_model_free(&m);
    return nb_test_finish("bench_engine_cuda");
}
