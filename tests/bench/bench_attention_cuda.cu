// bench_attention_cuda: one decode step (1 query row) of paged attention at
// one layer, nibbler FP16 cache (FP-only mode) vs INT8 target view vs INT4
// draft view, G=128, for Llama-2-7B (32 q / 32 kv heads x 128) and
// Llama-3-8B (32 q / 8 kv heads x 128), batch 1 and 8, contexts 4k..128k.
//
// Method: random data, shuffled (non-contiguous) block tables; each timed
// iteration is preceded by an L2 flush (the cache is read cold from HBM, as
// in a real decode step where the other layers evict it) and a ~0.5 ms GPU
// spin (as the SDPA bench's, whose Python dispatch must not be timed);
// CUDA events around the attention call only;
// median of the timed iterations after warm-up. Bytes are what the kernel
// must read/write: planes + scales + FP tokens + q + out. Peak bandwidth is
// MEASURED in the same run by a device-to-device cudaMemcpy (read + write),
// and so is the floor of a timed call (one and two empty kernels between
// the events, behind a flush kernel as the real calls).
// Prints a markdown table (compare_attention.py joins it with the SDPA one).
//
// usage: bench_attention_cuda [--quick] [--iters N] [--only MODEL BATCH CTX] [--mode I]
//                             [--flush read|write|none] [--split batch|step]
//                             [--step-chunks N] [--rows R] [--dtype f16|bf16]
//   --only / --mode run one configuration / one kernel row (0..8, the order
//   of mode_names below), e.g. to profile it (tests/gpu/profile).
//   --flush: how L2 is emptied before each timed call. read (default): a
//   kernel reads a buffer of 4x the L2 size, so L2 holds only CLEAN lines of
//   it, as after a layer's weight reads in a real decode step. write: a
//   memset of 2x the L2 size (the method before session 14); it leaves up
//   to an L2's worth of DIRTY lines, whose write-back to HBM then lands in
//   the timed call (~17 us on an H100 for every kernel, SDPA's included).
//   none: no flush (the KV bytes may be served from L2 when they fit).
//   --split: the split-K the calls use. batch (default): tuned to the call
//   (nb_pa_args.fixed_chunk_groups 0; what draft passes use by default).
//   step: the row-invariant split the cuda backend's step mode (target,
//   verify and decode passes; drafts with --batch-invariant-draft) uses for
//   an engine of max_seq_len 131072, as worker/backend_cuda.c sets it up:
//   fixed chunks of ceil(groups / 64) groups (at least 2), a grid over the
//   context's chunks rounded up to a power of two (max_tokens = that many
//   chunks' tokens).
//   --step-chunks N (2..128, default 64, the engine's ATTN_MAX_CHUNKS): the
//   max_chunks the step split is derived from (chunks of ceil(groups / N)
//   groups, at least NB_PA_STEP_MIN_CHUNK_TOKENS = 2,048 tokens, or
//   NB_PA_STEP_MIN_TOKENS from the environment as for the engine: N = 128
//   gives 1,024-token chunks only with NB_PA_STEP_MIN_TOKENS=1024), to
//   measure other fixed chunk sizes.
//   --rows R (1..9, default 1; R > 1 needs --split step): a verify step
//   instead of a decode step: each sequence's last R positions are query
//   rows, cut into entries as the engine cuts them (nb_pa_step_entry_vectors
//   / GQA ratio rows each: wide entries when narrow ones would fill more
//   than a wave, three-tile ones where they take fewer waves; NB_PA_TC_WIDE=0 / 1 force
//   narrow / wide, NB_PA_TC_TILES=2 / 3 two / three tiles); the draft-view rows
//   are skipped (drafts have one row). MB moved counts the cache once.
//   --dtype: the cache's element type (default f16; the fp16 rows then
//   read bf16 FP blocks, which the tensor-core kernel leaves to the scalar one).
//   --table: how the block tables place a sequence's blocks in the pools.
//   shuffled (default): every block anywhere; contig: each sequence's
//   blocks one after the other; runs:N: runs of N consecutive blocks, the
//   runs shuffled (N = 16 at the Llama-3 shape: 2 MB of the upper plane).
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

// The timed-call floor's kernel.
__global__ void empty_kernel() {}

// Reads n 16-byte words; the xor is stored only if it hits a magic value
// (practically never), which keeps the loads.
__global__ void read_flush(const uint4 *p, size_t n, uint32_t *sink) {
    uint32_t x = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (x == 0x9E3779B9u) *sink = x;
}

#ifdef NB_PA_TRACE
// Diagnostic builds (-DNB_PA_TRACE): per-CTA timestamps of the tensor-core
// decode kernel's last launch (kernels/paged_attention_tc.cuh, TC_TRACE).
extern "C" int nb_pa_trace_reset(void);
extern "C" int nb_pa_trace_read(unsigned long long *host, int n_ctas);
extern "C" int nb_pa_trace_read_merge(unsigned long long *host, int n_ctas);
extern "C" int nb_pa_trace_marker(cudaStream_t s);
extern "C" int nb_pa_trace_read_warps(unsigned long long *host, int n_ctas);
static void trace_report(void) {
    constexpr int W = 5; // words per CTA (TC_TRACE_W)
    static unsigned long long tr[8192 * W];
    const int n = nb_pa_trace_read(tr, 8192);
    std::vector<double> a, b, c, d;
    unsigned long long t0 = ~0ull;
    for (int i = 0; i < n; i++)
        if (tr[W * i] && tr[W * i] < t0) t0 = tr[W * i];
    for (int i = 0; i < n; i++) {
        if (!tr[W * i]) continue;
        a.push_back((tr[W * i] - t0) * 1e-3);           // start
        b.push_back((tr[W * i + 1] - tr[W * i]) * 1e-3); // prologue
        c.push_back((tr[W * i + 2] - t0) * 1e-3);       // warp 0 out of its loop
        d.push_back((tr[W * i + 3] - t0) * 1e-3);       // partial written
    }
    if (a.empty()) {
        printf("  trace: no tensor-core CTAs\n");
        return;
    }
    auto q = [](std::vector<double> v, double f) {
        std::sort(v.begin(), v.end());
        return v[(size_t)(f * (v.size() - 1))];
    };
    { // per CTA: its span, its loop (prologue end to warp 0 out), its merge (warp 0 out to partial written)
        std::vector<double> span, loop, merge;
        for (int i = 0; i < n; i++) {
            if (!tr[W * i]) continue;
            span.push_back((tr[W * i + 3] - tr[W * i]) * 1e-3);
            loop.push_back(((double)tr[W * i + 2] - (double)tr[W * i + 1]) * 1e-3);
            merge.push_back(((double)tr[W * i + 3] - (double)tr[W * i + 2]) * 1e-3);
        }
        if (!span.empty())
            printf("  per CTA (us, min/med/max): span %.2f/%.2f/%.2f; loop %.2f/%.2f/%.2f; after the loop "
                   "%.2f/%.2f/%.2f\n",
                   q(span, 0), q(span, 0.5), q(span, 1), q(loop, 0), q(loop, 0.5), q(loop, 1), q(merge, 0),
                   q(merge, 0.5), q(merge, 1));
    }
    printf("  trace (us from the first CTA's start; min/med/max): %zu CTAs; start %.2f/%.2f/%.2f; prologue "
           "%.2f/%.2f/%.2f; loop end %.2f/%.2f/%.2f; CTA end %.2f/%.2f/%.2f\n",
           a.size(), q(a, 0), q(a, 0.5), q(a, 1), q(b, 0), q(b, 0.5), q(b, 1), q(c, 0), q(c, 0.5), q(c, 1),
           q(d, 0), q(d, 0.5), q(d, 1));
    { // the marker kernel launched just before the call, the merge kernel's CTAs
        static unsigned long long mt[4096 * 3 + 1];
        const int nm = nb_pa_trace_read_merge(mt, 4096);
        double dmax = 0.0;
        for (double x : d) dmax = x > dmax ? x : dmax;
        std::vector<double> me, mw, mx;
        for (int i = 0; i < nm; i++) {
            if (!mt[3 * i]) continue;
            me.push_back(((double)mt[3 * i] - (double)t0) * 1e-3);
            mw.push_back(((double)mt[3 * i + 1] - (double)t0) * 1e-3);
            mx.push_back(((double)mt[3 * i + 2] - (double)t0) * 1e-3);
        }
        printf("  marker kernel at %.2f us; last CTA end %.2f", ((double)mt[3 * nm] - (double)t0) * 1e-3, dmax);
        if (!me.empty())
            printf("; merge: %zu CTAs, entry %.2f/%.2f/%.2f, after wait %.2f/%.2f/%.2f, end %.2f/%.2f/%.2f", me.size(),
                   q(me, 0), q(me, 0.5), q(me, 1), q(mw, 0), q(mw, 0.5), q(mw, 1), q(mx, 0), q(mx, 0.5), q(mx, 1));
        printf("\n");
    }
    { // every warp's loop end: the CTA's first and last warp out
        static unsigned long long wt[8192 * 2];
        const int nw = nb_pa_trace_read_warps(wt, n);
        std::vector<double> first, last, spread;
        for (int i = 0; i < nw; i++) {
            if (!tr[W * i] || !wt[2 * i]) continue;
            const double l = (wt[2 * i] - t0) * 1e-3, f = ((~wt[2 * i + 1]) - t0) * 1e-3;
            first.push_back(f);
            last.push_back(l);
            spread.push_back(l - f);
        }
        if (!last.empty())
            printf("  warps out of their loops: first %.2f/%.2f/%.2f; last %.2f/%.2f/%.2f; last - first in a CTA "
                   "%.2f/%.2f/%.2f\n",
                   q(first, 0), q(first, 0.5), q(first, 1), q(last, 0), q(last, 0.5), q(last, 1), q(spread, 0),
                   q(spread, 0.5), q(spread, 1));
    }
    if (getenv("NB_BENCH_TRACE")[0] == '2') { // loop end per CTA: sm:us, in CTA order
        printf("  loop end by CTA (sm:us):");
        for (int i = 0; i < n; i++)
            if (tr[W * i]) printf(" %llu:%.0f", tr[W * i + 4], (tr[W * i + 2] - t0) * 1e-3);
        printf("\n");
    }
}
#endif

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    int iters = 20, quick = 0, only_b = 0, only_ctx = 0, only_mode = -1, step_max_chunks = 64, n_rows = 1;
    int table_run = 1; // --table: 1 = shuffled blocks, 0 = in order, N > 1 = shuffled runs of N blocks
    const char *only_model = NULL, *flush_mode = "read", *split = "batch", *dtype = "f16";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--flush") && i + 1 < argc) flush_mode = argv[++i];
        else if (!strcmp(argv[i], "--split") && i + 1 < argc) split = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--step-chunks") && i + 1 < argc) step_max_chunks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mode") && i + 1 < argc) only_mode = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) n_rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
        else if (!strcmp(argv[i], "--table") && i + 1 < argc) {
            const char *t = argv[++i];
            char *end = NULL;
            const long nr = !strncmp(t, "runs:", 5) ? strtol(t + 5, &end, 10) : -1;
            table_run = !strcmp(t, "shuffled") ? 1 : !strcmp(t, "contig") ? 0 : (end && !*end && nr >= 2 && nr <= 4096) ? (int)nr : -1;
        } else if (!strcmp(argv[i], "--only") && i + 3 < argc) {
            only_model = argv[++i];
            only_b = atoi(argv[++i]);
            only_ctx = atoi(argv[++i]);
        } else {
            fprintf(stderr,
                    "usage: %s [--quick] [--iters N] [--only MODEL BATCH CTX] [--mode I] [--flush read|write|none] "
                    "[--split batch|step] [--step-chunks N] [--rows R] [--dtype f16|bf16] [--table shuffled|contig|runs:N]\n",
                    argv[0]);
            return 2;
        }
    }
    // A filter that matches nothing is an error, not an empty table.
    const int ctx_ok = only_ctx == 4096 || only_ctx == 16384 ||
                       (!quick && (only_ctx == 32768 || only_ctx == 65536 || only_ctx == 131072));
    if ((only_model && ((strcmp(only_model, "llama2-7b") && strcmp(only_model, "llama3-8b")) ||
                        (only_b != 1 && only_b != 8) || !ctx_ok)) ||
        only_mode < -1 || only_mode > 8 || iters < 1 ||
        (strcmp(flush_mode, "read") && strcmp(flush_mode, "write") && strcmp(flush_mode, "none")) ||
        (strcmp(split, "batch") && strcmp(split, "step")) || step_max_chunks < 2 || step_max_chunks > 128 ||
        n_rows < 1 || n_rows > 9 || (strcmp(dtype, "f16") && strcmp(dtype, "bf16")) || table_run < 0 ||
        (n_rows > 1 && (strcmp(split, "step") || only_mode == 2 || only_mode == 4 || only_mode == 6))) {
        fprintf(stderr, "%s: --only takes llama2-7b|llama3-8b, batch 1|8, ctx 4096|16384|32768|65536|131072 "
                        "(4096|16384 with --quick); --mode 0..8; --iters >= 1; --flush read|write|none; "
                        "--split batch|step; --step-chunks 2..128; --rows 1..9 (> 1 with --split step, not a draft --mode); "
                        "--dtype f16|bf16; --table shuffled|contig|runs:N (N 2..4096)\n",
                argv[0]);
        return 2;
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));

    // ---- measured peak: device-to-device copy, bytes read + written ----
    const size_t copy_bytes = (size_t)1 << 30;
    void *ca, *cb;
    CUDA_OK(cudaMalloc(&ca, copy_bytes));
    CUDA_OK(cudaMalloc(&cb, copy_bytes));
    CUDA_OK(cudaMemset(ca, 1, copy_bytes));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    std::vector<float> ct;
    for (int i = 0; i < 13; i++) {
        CUDA_OK(cudaEventRecord(e0));
        CUDA_OK(cudaMemcpyAsync(cb, ca, copy_bytes, cudaMemcpyDeviceToDevice));
        CUDA_OK(cudaEventRecord(e1));
        CUDA_OK(cudaEventSynchronize(e1));
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 3) ct.push_back(ms);
    }
    const double peak = 2.0 * copy_bytes / (median(ct) * 1e-3) / 1e9;
    CUDA_OK(cudaFree(ca));
    CUDA_OK(cudaFree(cb));

    const int flush_kind = !strcmp(flush_mode, "read") ? 0 : !strcmp(flush_mode, "write") ? 1 : 2;
    const size_t flush_bytes = (size_t)prop.l2CacheSize * (flush_kind == 0 ? 4 : 2);
    void *flush;
    uint32_t *sink;
    CUDA_OK(cudaMalloc(&flush, flush_bytes));
    CUDA_OK(cudaMalloc(&sink, 4));
    CUDA_OK(cudaMemset(flush, 0x5A, flush_bytes));

    // ---- the floor of a timed call: empty kernels of one CTA per SM (384
    // threads) between the two events, one launch and two (a decode call
    // with its merge kernel is two). Median of 50 after 5 warm-up. ----
    double floor_us[2];
    for (int nk = 1; nk <= 2; nk++) {
        std::vector<float> ft;
        for (int i = 0; i < 55; i++) {
            // behind a flush kernel, as the timed calls below: the launches
            // are queued before the GPU reaches e0 (no host time inside)
            read_flush<<<prop.multiProcessorCount * 8, 512>>>((const uint4 *)flush, flush_bytes / 16, sink);
            bench_spin<<<1, 1>>>(kBenchSpinCycles);
            CUDA_OK(cudaEventRecord(e0));
            for (int k = 0; k < nk; k++) empty_kernel<<<prop.multiProcessorCount, 384>>>();
            CUDA_OK(cudaEventRecord(e1));
            CUDA_OK(cudaEventSynchronize(e1));
            float ms;
            CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
            if (i >= 5) ft.push_back(ms);
        }
        floor_us[nk - 1] = median(ft) * 1e3;
    }

    // ---- pools sized for the largest case, one layer ----
    const int D = 128, G = 128, Hq = 32;
    const int ctxs_all[5] = {4096, 16384, 32768, 65536, 131072};
    const int n_ctx = quick ? 2 : 5;
    const int batches[2] = {1, 8};
    const int max_ctx = ctxs_all[n_ctx - 1];
    const int max_kvh = 32, max_b = 8;
    const int blocks_per_seq = max_ctx / G + 2;
    const bool bf16 = !strcmp(dtype, "bf16");
    nb_kv_layout lay = {1, max_kvh, D, G, bf16 ? NB_DTYPE_BF16 : NB_DTYPE_F16, max_b * blocks_per_seq,
                        max_b * blocks_per_seq};
    // NOTE: the layout's n_kv_heads fixes the pool stride; the 8-kv-head model
    // uses its own layout over the same bytes (fewer heads per block).
    nb_kv_pools pools;
    size_t pb = nb_kv_plane_bytes(&lay), sb = nb_kv_scales_bytes(&lay), fb = nb_kv_fp_bytes(&lay);
    printf("<!-- device %s, %d SMs, L2 %d MB; pools: planes 2 x %.2f GB, scales %.2f GB, fp %.2f GB -->\n",
           prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, pb / 1e9, sb / 1e9, fb / 1e9);
    CUDA_OK(cudaMalloc(&pools.upper, pb));
    CUDA_OK(cudaMalloc(&pools.lower, pb));
    CUDA_OK(cudaMalloc(&pools.scales, sb));
    CUDA_OK(cudaMalloc(&pools.fp, fb));
    fill_bytes<<<4096, 256>>>((uint8_t *)pools.upper, pb, 1u);
    fill_bytes<<<4096, 256>>>((uint8_t *)pools.lower, pb, 2u);
    // scales in [0.01, 0.1) and zeros in [-1, 0): the record mixes both, so
    // fill all with small positive values, good enough for timing.
    if (bf16) {
        fill_bf16<<<4096, 256>>>((__nv_bfloat16 *)pools.scales, sb / 2, 0.01f, 0.1f, 3u);
        fill_bf16<<<4096, 256>>>((__nv_bfloat16 *)pools.fp, fb / 2, -2.0f, 2.0f, 4u);
    } else {
        fill_half<<<4096, 256>>>((__half *)pools.scales, sb / 2, 0.01f, 0.1f, 3u);
        fill_half<<<4096, 256>>>((__half *)pools.fp, fb / 2, -2.0f, 2.0f, 4u);
    }
    CUDA_OK(cudaGetLastError());

    float *dq, *dout;
    CUDA_OK(cudaMalloc(&dq, sizeof(float) * max_b * n_rows * Hq * D));
    CUDA_OK(cudaMalloc(&dout, sizeof(float) * max_b * n_rows * Hq * D));
    fill_float<<<64, 256>>>(dq, (size_t)max_b * n_rows * Hq * D, 5u);
    const int max_chunks = 128;
    // at most one entry per row, of at most n_rows rows
    size_t wsb = nb_pa_workspace_size(max_b * n_rows, n_rows, Hq, D, max_chunks);
    void *ws;
    CUDA_OK(cudaMalloc(&ws, wsb));
    nb_pa_seq *dseqs;
    int32_t *dqt, *dft;
    CUDA_OK(cudaMalloc(&dseqs, sizeof(nb_pa_seq) * max_b * n_rows));
    CUDA_OK(cudaMalloc(&dqt, sizeof(int32_t) * lay.n_qblocks));
    CUDA_OK(cudaMalloc(&dft, sizeof(int32_t) * lay.n_fpblocks));

    std::vector<int32_t> qperm(lay.n_qblocks), fperm(lay.n_fpblocks);
    for (int i = 0; i < lay.n_qblocks; i++) qperm[i] = i;
    for (int i = 0; i < lay.n_fpblocks; i++) fperm[i] = i;
    srand(12345);
    // Runs of table_run consecutive block ids, the runs in random order
    // (1: every block on its own; 0: no shuffle, each sequence's blocks in
    // address order).
    auto shuffle_runs = [&](std::vector<int32_t> &perm) {
        if (table_run == 0) return;
        const int n = (int)perm.size(), nr = n / table_run;
        std::vector<int32_t> runs(nr);
        for (int i = 0; i < nr; i++) runs[i] = i;
        for (int i = nr - 1; i > 0; i--) std::swap(runs[i], runs[rand() % (i + 1)]);
        for (int i = 0; i < nr * table_run; i++) perm[i] = runs[i / table_run] * table_run + i % table_run;
    };
    shuffle_runs(qperm);
    shuffle_runs(fperm);

    struct model {
        const char *name;
        int hkv;
    } models[2] = {{"llama2-7b", 32}, {"llama3-8b", 8}};
    // The first three rows take the built-in kernel choice; the others force
    // the scalar (f32 FMA) decode kernel (NB_PA_TC=0) and the tensor-core one
    // (NB_PA_TC=1) for the same calls, to compare the two.
    const nb_pa_mode modes[9] = {NB_PA_FP_ONLY, NB_PA_TARGET, NB_PA_DRAFT, NB_PA_TARGET, NB_PA_DRAFT,
                                 NB_PA_TARGET,  NB_PA_DRAFT,  NB_PA_FP_ONLY, NB_PA_FP_ONLY};
    const char *mode_names[9] = {"nibbler-fp16",           "nibbler-int8-target",   "nibbler-int4-draft",
                                 "nibbler-int8-target-fma", "nibbler-int4-draft-fma", "nibbler-int8-target-tc",
                                 "nibbler-int4-draft-tc",   "nibbler-fp16-fma",       "nibbler-fp16-tc"};
    const char *tc_env[9] = {NULL, NULL, NULL, "0", "0", "1", "1", "0", "1"};

    // --split step: the engine's step-mode split (worker/backend_cuda.c,
    // ATTN_MAX_CHUNKS 64 unless --step-chunks) for max_seq_len 131072.
    const int step_max_len = 131072;
    const bool step = !strcmp(split, "step");
    // the engine's smallest step chunk, overridable as in backend_cuda.c
    const char *min_env = getenv("NB_PA_STEP_MIN_TOKENS");
    const int32_t step_min_tokens = min_env && atoi(min_env) > 0 ? atoi(min_env) : NB_PA_STEP_MIN_CHUNK_TOKENS;
    int32_t step_groups, step_n, step_unused;
    nb_pa_step_split(step_max_len, G, step_max_chunks, step_min_tokens, 1, &step_groups, &step_n,
                     &step_unused);
    int mem_khz = 0, bus_bits = 0;
    CUDA_OK(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0));
    CUDA_OK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0));
    const double theo = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    printf("\ntheoretical DRAM bandwidth %.0f GB/s (%.1f GB/s per SM; the batch-tuned target view at 1 query head "
           "per kv head takes the tensor-core kernel from 30)",
           theo, theo / prop.multiProcessorCount);
    printf("\nmeasured peak (cudaMemcpy D2D, read+write): %.0f GB/s; cache %s; L2 flush: %s; split: %s", peak, dtype,
           flush_mode, split);
    if (step) printf(" (fixed chunks of %d groups, engine max_seq_len %d)", step_groups, step_max_len);
    if (table_run != 1) printf("; block tables: %s%.0d", table_run ? "shuffled runs of " : "in order", table_run);
    if (n_rows > 1)
        printf("; verify steps of %d rows per sequence%s%s", n_rows,
               getenv("NB_PA_TC_WIDE") ? " (NB_PA_TC_WIDE set)" : "",
               getenv("NB_PA_TC_TILES") ? " (NB_PA_TC_TILES set)" : "");
    printf("\nevent-timed floor: one empty kernel %.2f us, two in a row %.2f us\n\n", floor_us[0], floor_us[1]);
    printf("| model | batch | ctx | kernel | ms | MB moved | GB/s | %% of peak |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int mi = 0; mi < 2; mi++)
        for (int bi = 0; bi < 2; bi++)
            for (int ci = 0; ci < n_ctx; ci++)
                for (int md = 0; md < 9; md++) {
                    if (only_model && (strcmp(only_model, models[mi].name) || only_b != batches[bi] ||
                                       only_ctx != ctxs_all[ci]))
                        continue;
                    if (only_mode >= 0 && md != only_mode) continue;
                    if (n_rows > 1 && modes[md] == NB_PA_DRAFT) continue; // drafts have one row
                    if (tc_env[md]) setenv("NB_PA_TC", tc_env[md], 1);
                    else unsetenv("NB_PA_TC");
                    const int B = batches[bi], ctx = ctxs_all[ci], hkv = models[mi].hkv;
                    nb_kv_layout l = lay;
                    l.n_kv_heads = hkv;
                    // same bytes, viewed with fewer heads per block: more blocks fit
                    l.n_qblocks = (int)((long)lay.n_qblocks * max_kvh / hkv);
                    l.n_fpblocks = (int)((long)lay.n_fpblocks * max_kvh / hkv);
                    std::vector<nb_pa_seq> seqs;
                    std::vector<int32_t> qt, ft;
                    double bytes = 0;
                    // rows per entry as the engine cuts a step pass
                    int per = n_rows;
                    if (n_rows > 1) { // (step split) narrow entries x kv heads x grid chunks
                        const int ratio = Hq / hkv;
                        int32_t cg, nall, grid_tokens;
                        nb_pa_step_split(step_max_len, G, step_max_chunks, step_min_tokens, ctx, &cg, &nall,
                                         &grid_tokens);
                        // live CTAs of 8-, 16- and 24-vector cuts (chunks past
                        // the context return at once)
                        int64_t live[3];
                        for (int t = 0; t < 3; t++) {
                            const int er = 8 * (t + 1) / ratio > 0 ? 8 * (t + 1) / ratio : 1;
                            live[t] = (int64_t)B * ((n_rows + er - 1) / er) * hkv * ((ctx + cg * G - 1) / (cg * G));
                        }
                        per = nb_pa_step_entry_vectors(&l, modes[md], Hq, live) / ratio;
                        if (per < 1) per = 1;
                    }
                    int max_ent_rows = 1;
                    for (int s = 0; s < B; s++) {
                        nb_pa_seq q;
                        const int T = ctx, C = T - n_rows;
                        q.n_qblocks = modes[md] == NB_PA_FP_ONLY ? 0 : (C >= 2 * G ? C / G - 1 : 0);
                        q.has_prequant = 0;
                        q.qblock_off = (int)qt.size();
                        q.fpblock_off = (int)ft.size();
                        q.n_tokens = T;
                        for (int r0 = 0; r0 < n_rows; r0 += per) {
                            q.pos0 = T - n_rows + r0;
                            q.n_rows = n_rows - r0 < per ? n_rows - r0 : per;
                            q.row_off = s * n_rows + r0;
                            seqs.push_back(q);
                            max_ent_rows = q.n_rows > max_ent_rows ? q.n_rows : max_ent_rows;
                        }
                        int nfb = (T - q.n_qblocks * G + G - 1) / G;
                        for (int k = 0; k < q.n_qblocks; k++) qt.push_back(qperm[s * blocks_per_seq + k]);
                        for (int k = 0; k < nfb; k++) ft.push_back(fperm[s * blocks_per_seq + k]);
                        const double planes = modes[md] == NB_PA_TARGET ? 2 : 1;
                        const double qbytes = planes * 2 * G * (D / 2) + (2.0 * D + 2.0 * G) * 2;
                        bytes += (double)hkv * (q.n_qblocks * qbytes + (double)(T - q.n_qblocks * G) * 2 * D * 2);
                        bytes += 2.0 * n_rows * Hq * D * 4; // q in, out
                    }
                    const int n_ent = (int)seqs.size();
                    CUDA_OK(cudaMemcpy(dseqs, seqs.data(), sizeof(nb_pa_seq) * n_ent, cudaMemcpyHostToDevice));
                    if (!qt.empty())
                        CUDA_OK(cudaMemcpy(dqt, qt.data(), 4 * qt.size(), cudaMemcpyHostToDevice));
                    CUDA_OK(cudaMemcpy(dft, ft.data(), 4 * ft.size(), cudaMemcpyHostToDevice));
                    nb_pa_args a;
                    memset(&a, 0, sizeof(a));
                    a.lay = l;
                    a.pools = pools;
                    if (modes[md] == NB_PA_DRAFT) a.pools.lower = NULL;
                    a.layer = 0;
                    a.mode = modes[md];
                    a.n_q_heads = Hq;
                    a.softmax_scale = 1.0f / sqrtf((float)D);
                    a.n_seqs = n_ent;
                    a.seqs = dseqs;
                    a.qblock_ids = dqt;
                    a.fpblock_ids = dft;
                    a.max_rows = max_ent_rows;
                    a.max_tokens = ctx;
                    a.q = dq;
                    a.out = dout;
                    a.workspace = ws;
                    a.workspace_bytes = wsb;
                    a.max_chunks = max_chunks;
                    if (step) { // as backend_cuda.c's step mode
                        int32_t grid_tokens;
                        nb_pa_step_split(step_max_len, G, step_max_chunks, step_min_tokens, ctx, &step_groups,
                                         &step_n, &grid_tokens);
                        a.fixed_chunk_groups = step_groups;
                        a.max_tokens = grid_tokens;
                        a.max_chunks = step_max_chunks;
                    }
                    std::vector<float> t;
#ifdef NB_PA_TRACE
                    const bool tracing = getenv("NB_BENCH_TRACE") != NULL;
#endif
                    for (int it = 0; it < iters + 3; it++) {
#ifdef NB_PA_TRACE
                        if (tracing && (it == 0 || it == iters + 2)) nb_pa_trace_reset(); // it 0: NB_PA_SKIPMERGE for every call
#endif
                        if (flush_kind == 0) {
                            read_flush<<<prop.multiProcessorCount * 8, 512>>>((const uint4 *)flush, flush_bytes / 16,
                                                                               sink);
                            CUDA_OK(cudaGetLastError());
                        } else if (flush_kind == 1) {
                            CUDA_OK(cudaMemsetAsync(flush, it & 0xff, flush_bytes));
                        }
                        bench_spin<<<1, 1>>>(kBenchSpinCycles);
                        CUDA_OK(cudaEventRecord(e0));
#ifdef NB_PA_TRACE
                        if (tracing && it == iters + 2) nb_pa_trace_marker(0);
#endif
                        nb_status st = nb_pa_attention(&a, 0);
                        CUDA_OK(cudaEventRecord(e1));
                        if (st != NB_OK) {
                            fprintf(stderr, "nb_pa_attention: %s\n", nb_status_str(st));
                            return 1;
                        }
                        CUDA_OK(cudaEventSynchronize(e1));
                        float ms;
                        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
                        if (it >= 3) t.push_back(ms);
                    }
                    CUDA_OK(cudaGetLastError());
                    const float ms = median(t);
                    const double gbs = bytes / (ms * 1e-3) / 1e9;
                    char kname[96];
                    if (n_rows > 1) snprintf(kname, sizeof kname, "%s, %d entries/seq", mode_names[md], n_ent / B);
                    else snprintf(kname, sizeof kname, "%s", mode_names[md]);
                    printf("| %s | %d | %d | %s | %.4f | %.1f | %.0f | %.1f |\n", models[mi].name, B, ctx, kname, ms,
                           bytes / 1e6, gbs, 100.0 * gbs / peak);
#ifdef NB_PA_TRACE
                    if (tracing) trace_report();
#endif
                    fflush(stdout);
                }
    return 0;
}
