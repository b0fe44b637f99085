// bench_engine_long: the GPU engine end to end at a real model shape and
// long context (in-process, no socket). For each (batch, context) it
// prefills `batch` distinct random prompts of `context` tokens, then times
//   - target-only decoding with the unquantized f16 cache and the model's
//     own (bf16) weights: what a user runs without nibbler;
//   - target-only decoding with the hierarchical INT8 cache;
//   - self-speculative rounds (gamma drafts with 4-bit weights and the INT4
//     view, then one verify), draft and verify timed apart.
// Prints markdown: prefill tokens/s, ms per step / per round, and the
// speculative speedup at the acceptance measured here and the break-even
// (tokens per round at which a round costs what the same tokens cost
// target-only). With a synthetic model (random weights: the output is
// noise) the acceptance is that of noise; the step times are the model
// shape's. Each engine first prefills and decodes a throwaway prompt, so the
// first cell does not pay the process's first kernel launches. A second
// table splits a decode step, a draft call and a verify into the device's
// time inside forwards and its idle gaps between them (CUDA events,
// nb_backend_cuda_pass_timing; taken in extra steps after the timed ones).
//
// Usage: bench_engine_long [--model synthetic:llama-3-8b | DIR] [--ctx 4096,32768]
//          [--batch 1,8] [--new 32] [--gamma 4] [--chunk 1024] [--util 0.9]
//          [--kinds fp16,quant] [--max-seq-len N] [--no-graphs] [--ncu]
// --ncu: a cudaProfilerStart/Stop range around one decode step, one draft
// call and one verify of the quantized engine, for
// `ncu --profile-from-start off` (kernel durations without launch gaps).
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block_manager.h"
#include "engine.h"
#include "model_loader.h"
#include "nb_test.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define MAXL 8
// "a,b,c": up to MAXL integers in [1, max]; -1 on anything else.
static int parse_list(const char *s, int *v, long max) {
    int n = 0;
    for (;;) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 1 || x > max || n == MAXL) return -1;
        v[n++] = (int)x;
        if (*end == '\0') return n;
        if (*end != ',') return -1;
        s = end + 1;
    }
}

// An integer in [lo, hi], or false.
static bool parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    long x = strtol(s, &end, 10);
    if (end == s || *end || x < lo || x > hi) return false;
    *out = (int)x;
    return true;
}

static int usage(const char *why) {
    fprintf(stderr,
            "bench_engine_long: %s\n"
            "usage: bench_engine_long [--model synthetic:NAME|DIR] [--ctx N,N..] [--batch N,N..]\n"
            "         [--new N] [--gamma 1..8] [--chunk N] [--util (0,1]] [--kinds fp16,quant]\n"
            "         [--max-seq-len N] [--no-graphs] [--ncu]\n"
            "  --ctx: up to 8 contexts in 1..1048576; --batch: up to 8 batches in 1..64;\n"
            "  --new 1..4096; --kinds: fp16, quant or both; --max-seq-len: the engine's (default:\n"
            "  the longest context + what the run generates), at most 1048576\n",
            why);
    return 2;
}

typedef struct cell {
    double prefill_tps[2];  // fp16 engine, quant engine
    double ms_fp16, ms_int8; // target-only ms per step
    double ms_draft, ms_verify, acc, tok_round;
    bool have[2];
    // Pass timing, ms: [kind] decode step wall, device time a forward, idle
    // gap between forwards; draft call wall, device time of its forwards,
    // idle gap between them; verify wall, device time.
    double pt_step[2][3], pt_draft[3], pt_verify[2];
} cell;

// splitmix64: distinct, reproducible prompts.
static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int main(int argc, char **argv) {
    const char *model = "synthetic:llama-3-8b", *kinds = "fp16,quant";
    int ctxs[MAXL] = {4096, 32768}, n_ctx = 2, Bs[MAXL] = {1, 8}, n_b = 2;
    int n_new = 32, gamma = 4, chunk = 1024, max_len = 0;
    double util = 0.9;
    bool graphs = true, ncu = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-graphs")) { graphs = false; continue; }
        if (!strcmp(a, "--ncu")) { ncu = true; continue; }
        bool ok = true;
        if (strcmp(a, "--model") && strcmp(a, "--ctx") && strcmp(a, "--batch") && strcmp(a, "--new") &&
            strcmp(a, "--gamma") && strcmp(a, "--chunk") && strcmp(a, "--util") && strcmp(a, "--kinds") &&
            strcmp(a, "--max-seq-len"))
            return usage("unknown option");
        if (!v) return usage("an option needs a value");
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--ctx")) ok = (n_ctx = parse_list(v, ctxs, 1L << 20)) > 0;
        else if (!strcmp(a, "--batch")) ok = (n_b = parse_list(v, Bs, 64)) > 0;
        else if (!strcmp(a, "--new")) ok = parse_int(v, 1, 4096, &n_new);
        else if (!strcmp(a, "--gamma")) ok = parse_int(v, 1, 8, &gamma);
        else if (!strcmp(a, "--chunk")) ok = parse_int(v, 1, 1 << 16, &chunk);
        else if (!strcmp(a, "--max-seq-len")) ok = parse_int(v, 1, 1 << 20, &max_len);
        else if (!strcmp(a, "--util")) {
            char *end;
            util = strtod(v, &end);
            ok = end != v && !*end && util > 0.0 && util <= 1.0;
        } else {
            kinds = v;
            ok = !strcmp(v, "fp16") || !strcmp(v, "quant") || !strcmp(v, "fp16,quant") ||
                 !strcmp(v, "quant,fp16");
        }
        if (!ok) return usage("a value outside its range");
    }
    {
        int longest = 0;
        for (int i = 0; i < n_ctx; i++) longest = ctxs[i] > longest ? ctxs[i] : longest;
        // The prompt; n_new target-only tokens; two warm-up rounds; then
        // rounds until the batch has n_new tokens a sequence, each round at
        // least one token for every sequence (so at most n_new rounds) and at
        // most gamma + 1 for one, which can thus get n_new * (gamma + 1);
        // gamma draft positions past the last; slack. (Was longest + n_new +
        // 88, which a batch with uneven acceptance overran at --new 64.)
        // Then the pass-timing steps: 4 decode steps and two more rounds.
        const int need = longest + n_new + 4 * (gamma + 1) + n_new * (gamma + 1) + gamma + 20;
        if (max_len > 0 && max_len < need)
            return usage("--max-seq-len is below the longest context + (gamma + 2) x --new + 5 x gamma + 24");
        if (max_len == 0) max_len = need;
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("SKIP: no CUDA device\n");
        return NB_TEST_SKIP;
    }
    char err[512];
    nb_model *m = NULL;
    double t0 = now_s();
    nb_status st0 = !strncmp(model, "synthetic:", 10) ? nb_model_synthetic(model + 10, 1, &m, err, sizeof err)
                                                    : nb_model_load(model, &m, err, sizeof err);
    if (st0 != NB_OK) {
        fprintf(stderr, "model %s: %s\n", model, err);
        return 1;
    }
    const nb_model_config *mc = nb_model_get_config(m);
    printf("# bench_engine_long: %s (%d layers, %d/%d heads x %d, vocab %d), model made/loaded in %.1f s\n",
           model, mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->head_dim, mc->vocab_size, now_s() - t0);
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("# %s; gamma %d, %d new tokens per sequence, prefill chunk %d, max_seq_len %d, CUDA graphs %s\n\n",
           prop.name, gamma, n_new, chunk, max_len, graphs ? "on" : "off");
    fflush(stdout);

    int max_ctx = 0, max_b = 0;
    for (int i = 0; i < n_ctx; i++) max_ctx = ctxs[i] > max_ctx ? ctxs[i] : max_ctx;
    for (int i = 0; i < n_b; i++) max_b = Bs[i] > max_b ? Bs[i] : max_b;
    cell cells[MAXL][MAXL];
    memset(cells, 0, sizeof cells);
    int32_t *out = malloc(sizeof(int32_t) * (size_t)max_b * (size_t)(n_new + 16) * 9);
    int32_t drafts[64 * 8], n_out[64], n_acc[64], seqs[64], next[64], lens[64];
    const int32_t *pr[64];
    nb_status st[64];
    CHECK(out && max_b <= 64);

    for (int kind = 0; kind < 2; kind++) {
        if (!strstr(kinds, kind ? "quant" : "fp16")) continue;
        nb_engine_params p = nb_engine_default_params();
        p.backend = "cuda";
        p.quantized_cache = kind == 1;
        p.kv_dtype = kind == 0 ? NB_DTYPE_F16 : -1;
        p.draft_w4 = kind == 1; // the fp16 baseline holds no quantized weight copy
        p.prefix_cache = false;
        p.group_size = 128;
        p.max_seqs = max_b;
        p.max_seq_len = max_len;
        p.max_gamma = 8;
        p.prefill_chunk = chunk;
        p.max_batch_rows = chunk > 1024 ? chunk : 1024;
        p.gpu_memory_utilization = util;
        p.cuda_graphs = graphs;
        t0 = now_s();
        nb_engine *e = nb_engine_new(m, &p, err, sizeof err);
        if (!e) {
            fprintf(stderr, "engine (%s cache): %s\n", kind ? "quantized" : "f16", err);
            return 1;
        }
        printf("# %s-cache engine ready in %.1f s; the draft's gate|up in the SwiGLU layout in %d of %d layers "
               "(NB_WQ_SWIGLU=0: none), q|k|v in the RoPE layout in %d (NB_WQ_ROPE=0: none); the target's dense "
               "gate|up in the SwiGLU layout in %d (NB_DENSE_SWIGLU=0: none), RoPE in its q|k|v's reduction in %d "
               "(NB_DENSE_ROPE=0: none)\n",
               kind ? "hierarchical" : "f16", now_s() - t0, nb_backend_cuda_swiglu_layers(nb_engine_backend(e)),
               mc->n_layers, nb_backend_cuda_rope_layers(nb_engine_backend(e)),
               nb_backend_cuda_dense_swiglu_layers(nb_engine_backend(e)),
               nb_backend_cuda_dense_rope_layers(nb_engine_backend(e)));
        {
            // The memory plan (--util of the device): the FP pool holds
            // every sequence's double buffer and drafts plus one pass of
            // prefill chunks (nb_bm_fp_pool_blocks), the quantized pool the rest.
            nb_bm_stats bs;
            nb_bm_stats_get(nb_engine_block_manager(e), &bs);
            const double G = nb_engine_params_get(e)->group_size;
            printf("# KV pools for %d sequences: FP %d blocks (%.2f GB), quantized %d blocks (%.2f GB, %.0f tokens)\n",
                   max_b, bs.n_fpblocks_total, bs.n_fpblocks_total * bs.fpbytes_per_token * G / 1e9,
                   bs.n_qblocks_total, bs.n_qblocks_total * bs.qbytes_per_token * G / 1e9,
                   bs.n_qblocks_total * G);
        }
        fflush(stdout);
        {
            // Warm-up: a prefill and two decode steps of a throwaway
            // sequence, so that the first cell's prefill does not pay the
            // process's first use of the prefill kernels (module loading,
            // cuBLAS's first calls: 16.5k against 30k tokens/s at batch 1,
            // 4k, session 33).
            const int wn = max_ctx < 2 * chunk ? max_ctx : 2 * chunk;
            int32_t *wbuf = malloc(sizeof(int32_t) * (size_t)wn);
            CHECK(wbuf != NULL);
            for (int t = 0; t < wn; t++) wbuf[t] = 3 + (int32_t)(mix(0xabcdull + (uint64_t)t) % (uint64_t)(mc->vocab_size - 3));
            int32_t ws = -1, wl = wn;
            const int32_t *wp = wbuf;
            CHECK(nb_engine_seq_add(e, &(nb_sampling_params){0}, &ws) == NB_OK);
            CHECK(nb_engine_prefill(e, 1, &ws, &wp, &wl, next, NULL, NULL, st) == NB_OK && st[0] == NB_OK);
            CHECK(nb_engine_decode(e, 1, &ws, 2, out, NULL, n_out, st) == NB_OK);
            nb_engine_seq_free(e, ws);
            free(wbuf);
        }
        for (int bi = 0; bi < n_b; bi++)
            for (int ci = 0; ci < n_ctx; ci++) {
                const int B = Bs[bi], ctx = ctxs[ci];
                cell *c = &cells[bi][ci];
                bool ok = true;
                for (int i = 0; i < B && ok; i++) ok = nb_engine_seq_add(e, &(nb_sampling_params){0}, &seqs[i]) == NB_OK;
                CHECK(ok);
                // B distinct prompts, prefilled together (one call: the engine
                // packs the sequences' chunks into passes of max_batch_rows).
                int32_t *buf = malloc(sizeof(int32_t) * (size_t)B * ctx);
                CHECK(buf != NULL);
                for (int i = 0; i < B; i++) {
                    for (int t = 0; t < ctx; t++)
                        buf[(size_t)i * ctx + t] =
                            3 + (int32_t)(mix(((uint64_t)i << 32) + (uint64_t)t) % (uint64_t)(mc->vocab_size - 3));
                    pr[i] = buf + (size_t)i * ctx;
                    lens[i] = ctx;
                }
                double ts = now_s();
                nb_status r = nb_engine_prefill(e, B, seqs, pr, lens, next, NULL, NULL, st);
                double dt = now_s() - ts;
                free(buf);
                CHECKF(r == NB_OK, "prefill %d x %d: %s", B, ctx, nb_status_str(r));
                for (int i = 0; i < B; i++) CHECKF(st[i] == NB_OK, "prefill seq %d: %s", i, nb_status_str(st[i]));
                if (r != NB_OK) goto release;
                c->prefill_tps[kind] = (double)B * ctx / dt;
                c->have[kind] = true;
                // Target-only: two warm-up steps (graph capture), then n_new.
                CHECK(nb_engine_decode(e, B, seqs, 2, out, NULL, n_out, st) == NB_OK);
                ts = now_s();
                CHECK(nb_engine_decode(e, B, seqs, n_new, out, NULL, n_out, st) == NB_OK);
                dt = now_s() - ts;
                for (int i = 0; i < B; i++) CHECK(st[i] == NB_OK && n_out[i] == n_new);
                if (kind == 0) c->ms_fp16 = 1e3 * dt / n_new;
                else c->ms_int8 = 1e3 * dt / n_new;
                // Pass timing (after the timed steps, so its events are not
                // in them): the device's time inside each forward, and its
                // idle time between one forward's end and the next one's
                // start.
                {
                    nb_backend *be = nb_engine_backend(e);
                    double busy = 0, gap = 0;
                    long np = 0;
                    CHECK(nb_backend_cuda_pass_timing(be, 1) == NB_OK);
                    ts = now_s();
                    CHECK(nb_engine_decode(e, B, seqs, 4, out, NULL, n_out, st) == NB_OK);
                    dt = now_s() - ts;
                    nb_backend_cuda_pass_times(be, &busy, &gap, &np);
                    nb_backend_cuda_pass_timing(be, 0);
                    c->pt_step[kind][0] = 1e3 * dt / 4;
                    c->pt_step[kind][1] = np > 0 ? busy / np : 0;
                    c->pt_step[kind][2] = np > 1 ? gap / (np - 1) : 0;
                }
                if (kind == 1) {
                    for (int w = 0; w < 2; w++) {
                        CHECK(nb_engine_draft(e, B, seqs, gamma, drafts, st) == NB_OK);
                        CHECK(nb_engine_verify(e, B, seqs, out, NULL, n_out, n_acc, st) == NB_OK);
                    }
                    if (ncu) { // --ncu: a profiler range over one decode step, one draft call, one verify
                        cudaDeviceSynchronize();
                        cudaProfilerStart();
                        CHECK(nb_engine_decode(e, B, seqs, 1, out, NULL, n_out, st) == NB_OK);
                        CHECK(nb_engine_draft(e, B, seqs, gamma, drafts, st) == NB_OK);
                        CHECK(nb_engine_verify(e, B, seqs, out, NULL, n_out, n_acc, st) == NB_OK);
                        cudaDeviceSynchronize();
                        cudaProfilerStop();
                    }
                    double td = 0, tv = 0;
                    long rounds = 0, produced = 0, accepted = 0;
                    while (produced < (long)n_new * B) {
                        ts = now_s();
                        CHECK(nb_engine_draft(e, B, seqs, gamma, drafts, st) == NB_OK);
                        double t1 = now_s();
                        CHECK(nb_engine_verify(e, B, seqs, out, NULL, n_out, n_acc, st) == NB_OK);
                        tv += now_s() - t1;
                        td += t1 - ts;
                        for (int i = 0; i < B; i++) {
                            CHECK(st[i] == NB_OK);
                            produced += n_out[i];
                            accepted += n_acc[i];
                        }
                        rounds++;
                    }
                    c->ms_draft = 1e3 * td / rounds;
                    c->ms_verify = 1e3 * tv / rounds;
                    // Pass timing of two more rounds: a draft call's gamma
                    // forwards and the gaps between them; the verify's one.
                    nb_backend *be = nb_engine_backend(e);
                    for (int w = 0; w < 2; w++) {
                        double busy = 0, gap = 0;
                        long np = 0;
                        CHECK(nb_backend_cuda_pass_timing(be, 1) == NB_OK);
                        ts = now_s();
                        CHECK(nb_engine_draft(e, B, seqs, gamma, drafts, st) == NB_OK);
                        double t1 = now_s();
                        nb_backend_cuda_pass_times(be, &busy, &gap, &np);
                        c->pt_draft[0] += 1e3 * (t1 - ts) / 2;
                        c->pt_draft[1] += busy / 2;
                        c->pt_draft[2] += np > 1 ? gap / (np - 1) / 2 : 0;
                        CHECK(nb_backend_cuda_pass_timing(be, 1) == NB_OK);
                        CHECK(nb_engine_verify(e, B, seqs, out, NULL, n_out, n_acc, st) == NB_OK);
                        nb_backend_cuda_pass_times(be, &busy, &gap, &np);
                        c->pt_verify[0] += 1e3 * (now_s() - t1) / 2;
                        c->pt_verify[1] += busy / 2;
                    }
                    nb_backend_cuda_pass_timing(be, 0);
                    c->acc = (double)accepted / ((double)rounds * B * gamma);
                    c->tok_round = (double)produced / ((double)rounds * B);
                }
            release:
                for (int i = 0; i < B; i++) nb_engine_seq_free(e, seqs[i]);
                printf("# %s cache, batch %d, context %d: done\n", kind ? "hierarchical" : "f16", B, ctx);
                fflush(stdout);
            }
        nb_engine_destroy(&e);
    }

    printf("\n| batch | context | prefill tok/s f16 cache | prefill tok/s INT8 cache | target ms/step f16 cache "
           "| target ms/step INT8 cache | draft ms (%d tokens) | verify ms | round ms | acceptance | tokens/round "
           "| spec tok/s | f16 target tok/s | spec / f16 | break-even tokens/round |\n",
           gamma);
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int bi = 0; bi < n_b; bi++)
        for (int ci = 0; ci < n_ctx; ci++) {
            const cell *c = &cells[bi][ci];
            const int B = Bs[bi];
            const double round = c->ms_draft + c->ms_verify;
            const double spec = c->have[1] ? 1e3 * B * c->tok_round / round : 0;
            const double base = c->have[0] ? 1e3 * B / c->ms_fp16 : 0;
            printf("| %d | %d | %.0f | %.0f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.0f | %.0f | ", B,
                   ctxs[ci], c->prefill_tps[0], c->prefill_tps[1], c->ms_fp16, c->ms_int8, c->ms_draft,
                   c->ms_verify, round, c->acc, c->tok_round, spec, base);
            if (c->have[0] && c->have[1])
                printf("%.2fx | %.2f |\n", spec / base, round / c->ms_fp16);
            else
                printf("- | - |\n");
        }
    // Where a call's wall time goes besides its forwards' device time: the
    // device idles between forwards while the host synchronizes, reads the
    // sampled tokens, plans the next step and launches it.
    printf("\nPass timing (CUDA events at each forward's first and last device operation; ms): wall = the "
           "call's host time, device = inside forwards, gap = the device idle between two forwards of the "
           "call\n\n");
    printf("| batch | context | step wall f16 | device | gap | step wall INT8 | device | gap | draft call wall | "
           "device (%d forwards) | gap between them | verify wall | device |\n",
           gamma);
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int bi = 0; bi < n_b; bi++)
        for (int ci = 0; ci < n_ctx; ci++) {
            const cell *c = &cells[bi][ci];
            printf("| %d | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", Bs[bi],
                   ctxs[ci], c->pt_step[0][0], c->pt_step[0][1], c->pt_step[0][2], c->pt_step[1][0],
                   c->pt_step[1][1], c->pt_step[1][2], c->pt_draft[0], c->pt_draft[1], c->pt_draft[2],
                   c->pt_verify[0], c->pt_verify[1]);
        }
    free(out);
    nb_model_free(&m);
    return nb_test_finish("bench_engine_long");
}
