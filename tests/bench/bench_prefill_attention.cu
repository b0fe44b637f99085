// bench_prefill_attention: one prefill chunk's attention at one layer (a
// chunk of C query rows, causal, over H tokens of history plus the chunk
// itself) at the Llama-3-8B head shape (32 q / 8 kv heads x 128), G = 128,
// with the f16 cache (FP-only view: every token from FP blocks) and the INT8
// target view (history quantized as the engine keeps it: all but the last
// G..2G-1 committed tokens, the chunk in FP blocks), each with the
// warpgroup-MMA prefill kernel (the built-in choice), the mma.sync prefill
// kernel it replaced (NB_PA_PF=1) and the scalar chunk kernel (NB_PA_PF=0).
// bench_prefill_sdpa.py measures PyTorch's flash SDPA on the same shapes as
// the baseline.
//
// Method: random data, shuffled (non-contiguous) block tables, one sequence;
// a GPU spin queued before each timed call (bench_spin: no launch time
// inside the events);
// CUDA events around the attention call (with its merge when split-K), median
// of the timed iterations after two warm-up calls; no L2 flush (the call is
// bound by arithmetic: at C = 1024 it does ~4 * 128 * 32 flops per byte of KV
// it reads). TFLOP/s counts the causal work only: 4 * D * Hq flops (q.k and
// p.v) per (row, token it attends).
//
// usage: bench_prefill_attention [--quick] [--iters N] [--chunk C,...] [--hist H,...]
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "paged_attention_cuda.h"

#include "../nb_cuda_check.h"
#include "bench_fill.cuh"

// Parses "a,b,c" into v (1..16 values, each in [lo, hi]); false if malformed.
static bool parse_list(const char *s, std::vector<int> &v, int lo, int hi) {
    v.clear();
    while (*s) {
        char *end;
        const long x = strtol(s, &end, 10);
        if (end == s || x < lo || x > hi || (*end && *end != ',')) return false;
        v.push_back((int)x);
        s = *end ? end + 1 : end;
        if (v.size() > 16) return false;
    }
    return !v.empty();
}

int main(int argc, char **argv) {
    int iters = 5;
    bool hist_set = false;
    std::vector<int> chunks = {512, 2048}, hists = {0, 4096, 16384, 32768};
    bool ok = true;
    for (int i = 1; i < argc && ok; i++) {
        if (!strcmp(argv[i], "--quick")) {
            if (!hist_set) hists = {0, 4096, 16384};
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            std::vector<int> v;
            ok = parse_list(argv[++i], v, 1, 1000) && v.size() == 1;
            if (ok) iters = v[0];
        } else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) ok = parse_list(argv[++i], chunks, 16, 8192);
        else if (!strcmp(argv[i], "--hist") && i + 1 < argc) {
            ok = parse_list(argv[++i], hists, 0, 131072);
            hist_set = true;
        }
        else ok = false;
    }
    for (int h : hists) ok = ok && h % 128 == 0;
    if (!ok) {
        fprintf(stderr, "usage: %s [--quick] [--iters 1..1000] [--chunk C,... (16..8192)] "
                        "[--hist H,... (0..131072, multiples of 128)]\n", argv[0]);
        return 2;
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));

    const int D = 128, Hq = 32, Hkv = 8, G = 128;
    const int max_c = *std::max_element(chunks.begin(), chunks.end());
    const int max_h = *std::max_element(hists.begin(), hists.end());
    const int max_tok = max_h + max_c;
    const int n_blocks = (max_tok + G - 1) / G + 2;
    nb_kv_layout lay = {1, Hkv, D, G, NB_DTYPE_F16, n_blocks, n_blocks};
    const size_t pb = nb_kv_plane_bytes(&lay), sbytes = nb_kv_scales_bytes(&lay), fb = nb_kv_fp_bytes(&lay);
    nb_kv_pools pools;
    CUDA_OK(cudaMalloc(&pools.upper, pb));
    CUDA_OK(cudaMalloc(&pools.lower, pb));
    CUDA_OK(cudaMalloc(&pools.scales, sbytes));
    CUDA_OK(cudaMalloc(&pools.fp, fb));
    fill_bytes<<<1024, 256>>>((uint8_t *)pools.upper, pb, 1);
    fill_bytes<<<1024, 256>>>((uint8_t *)pools.lower, pb, 2);
    // steps and zeros: every record's K step/zero, V step/zero (a range the
    // kernels' f16 products stay finite in; speed does not depend on it)
    fill_half<<<1024, 256>>>((__half *)pools.scales, sbytes / 2, 0.02f, 0.1f, 3);
    fill_half<<<1024, 256>>>((__half *)pools.fp, fb / 2, -2.0f, 2.0f, 4);
    CUDA_OK(cudaGetLastError());

    std::vector<int32_t> qperm(n_blocks), fperm(n_blocks);
    for (int i = 0; i < n_blocks; i++) qperm[i] = fperm[i] = i;
    srand(7);
    for (int i = n_blocks - 1; i > 0; i--) std::swap(qperm[i], qperm[rand() % (i + 1)]);
    for (int i = n_blocks - 1; i > 0; i--) std::swap(fperm[i], fperm[rand() % (i + 1)]);
    int32_t *d_q, *d_f;
    CUDA_OK(cudaMalloc(&d_q, 4 * n_blocks));
    CUDA_OK(cudaMalloc(&d_f, 4 * n_blocks));
    CUDA_OK(cudaMemcpy(d_q, qperm.data(), 4 * n_blocks, cudaMemcpyHostToDevice));
    nb_pa_seq *d_seq;
    CUDA_OK(cudaMalloc(&d_seq, sizeof(nb_pa_seq)));
    float *q, *out;
    CUDA_OK(cudaMalloc(&q, (size_t)max_c * Hq * D * 4));
    CUDA_OK(cudaMalloc(&out, (size_t)max_c * Hq * D * 4));
    fill_float<<<1024, 256>>>(q, (size_t)max_c * Hq * D, 5);
    const int max_chunks = 8; // the cuda backend sizes its prefill workspace for 8
    const size_t wsb = nb_pa_workspace_size(1, max_c, Hq, D, max_chunks);
    void *ws;
    CUDA_OK(cudaMalloc(&ws, wsb));
    // The prefill stage (nb_pa_args.stage) as the cuda backend sizes it:
    // one sequence of the longest call.
    const size_t stage_b = nb_pa_prefill_stage_size(&lay, 1, max_tok);
    void *stage;
    CUDA_OK(cudaMalloc(&stage, stage_b));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));

    // NB_PA_PF set at the start picks the first kernel (kept for each call).
    char pf0[8] = "";
    if (getenv("NB_PA_PF")) snprintf(pf0, sizeof(pf0), "%s", getenv("NB_PA_PF"));
    char first[32] = "warpgroup prefill"; // the built-in choice at G = 128
    if (pf0[0]) snprintf(first, sizeof(first), "NB_PA_PF=%s", pf0);
    printf("<!-- device %s, %d SMs -->\n", prop.name, prop.multiProcessorCount);
    printf("| chunk rows | history | cache / view | kernel | ms | TFLOP/s | x mma.sync |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int C : chunks)
        for (int H : hists) {
            const int T = H + C;
            double work = 0.0; // (row, token) pairs attended
            for (int r = 0; r < C; r++) work += H + r + 1;
            const double flops = 4.0 * D * Hq * work;
            for (int view = 0; view < 2; view++) {
                const bool quant = view == 1;
                const int nq = quant && H >= 2 * G ? H / G - 1 : 0;
                const int nfb = (T - nq * G + G - 1) / G;
                nb_pa_seq sq = {0, nq, 0, 0, T, H, C, 0};
                CUDA_OK(cudaMemcpy(d_seq, &sq, sizeof(sq), cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(d_f, fperm.data(), 4 * nfb, cudaMemcpyHostToDevice));
                nb_pa_args a;
                memset(&a, 0, sizeof(a));
                a.lay = lay;
                a.pools = pools;
                a.layer = 0;
                a.mode = quant ? NB_PA_TARGET : NB_PA_FP_ONLY;
                a.n_q_heads = Hq;
                a.softmax_scale = 1.0f / sqrtf((float)D);
                a.n_seqs = 1;
                a.seqs = d_seq;
                a.qblock_ids = d_q;
                a.fpblock_ids = d_f;
                a.max_rows = C;
                a.max_tokens = T;
                a.q = q;
                a.out = out;
                a.workspace = ws;
                a.workspace_bytes = wsb;
                a.max_chunks = max_chunks;
                // k 3 (the INT8 view): the built-in kernel with the prefill
                // stage, its dequantization kernel inside the timed call
                // (forced: NB_PA_PF_STAGE=1, also below the size rule).
                const char *const kname[4] = {first, "mma.sync prefill", "scalar chunk", "warpgroup + stage"};
                double ms_k[4] = {0.0, 0.0, 0.0, 0.0};
                const int nk = quant && !pf0[0] ? 4 : 3;
                for (int k = 0; k < nk; k++) { // NB_PA_PF: as at the start (unset: built in), 1, 0, unset
                    if (k == 1 || k == 2)
                        setenv("NB_PA_PF", k == 1 ? "1" : "0", 1);
                    else if (k == 0 && pf0[0])
                        setenv("NB_PA_PF", pf0, 1);
                    a.stage = k == 3 ? stage : NULL;
                    a.stage_bytes = k == 3 ? stage_b : 0;
                    if (k == 3) setenv("NB_PA_PF_STAGE", "1", 1); // whatever the call's size
                    const int n_it = k == 2 ? std::min(iters, 3) : iters; // the scalar kernel is slow
                    std::vector<float> t;
                    for (int i = 0; i < n_it + 2; i++) {
                        bench_spin<<<1, 1>>>(kBenchSpinCycles);
                        CUDA_OK(cudaEventRecord(e0));
                        const nb_status st = nb_pa_attention(&a, 0);
                        CUDA_OK(cudaEventRecord(e1));
                        CUDA_OK(cudaEventSynchronize(e1));
                        if (st != NB_OK) {
                            fprintf(stderr, "nb_pa_attention failed: %d\n", (int)st);
                            return 1;
                        }
                        float ms;
                        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
                        if (i >= 2) t.push_back(ms);
                    }
                    unsetenv("NB_PA_PF");
                    if (k == 3) unsetenv("NB_PA_PF_STAGE");
                    std::sort(t.begin(), t.end());
                    ms_k[k] = t[t.size() / 2];
                }
                for (int k = 0; k < nk; k++)
                    printf("| %d | %d | %s | %s | %.3f | %.1f | %.2fx |\n", C, H,
                           quant ? "INT8 target view" : "f16 cache", kname[k], ms_k[k],
                           flops / (ms_k[k] * 1e-3) / 1e12, ms_k[1] / ms_k[k]);
                fflush(stdout);
            }
        }
    cudaFree(pools.upper); cudaFree(pools.lower); cudaFree(pools.scales); cudaFree(pools.fp);
    cudaFree(d_q); cudaFree(d_f); cudaFree(d_seq); cudaFree(q); cudaFree(out); cudaFree(ws); cudaFree(stage);
    return 0;
}
