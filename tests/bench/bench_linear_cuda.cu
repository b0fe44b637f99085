// bench_linear_cuda.cu: the quantized linear layer (4-bit draft view and
// hierarchical 8-bit target view of the same bytes) against cuBLAS fp16 at
// decode batch sizes on the Llama shapes. Prints a markdown table of time,
// weight bytes read, achieved GB/s, % of the device-to-device copy bandwidth
// measured in the same run, and speedup over cuBLAS fp16.
//
// Method: each configuration is captured into a CUDA graph of L launches that
// rotate over enough weight copies (>= 4x the L2 size in all) that no launch
// finds its weights in L2; the graph is replayed 3 times to warm up, then 15
// timed replays (CUDA events) give the median time per launch. Inputs are
// random, never zeros. Speed is reported, never asserted.
//
// Usage: bench_linear_cuda [--quick | --only M K N | --gemv-sweep [M K]... | --dense [--quick | --sweep] |
//                          --norm-post]
//   --quick: one shape, n = 1, for CI; --only: that one configuration (for
//   profilers); --gemv-sweep: only the decode kernel's variants and grid
//   sizes (nb_cuda_matmul_wq_set_gemv_variant, _set_blocks_per_sm) at
//   n = 1, 4, 5, 6 and 8, against cuBLAS fp16; --dense: the row-invariant
//   dense matmul against cuBLAS at n = 1..64 (bf16 and f16; --quick: one
//   shape, bf16 only, n = 1, 4, 8; --sweep: first the k splits forced to
//   1..8 on the split shapes).
// Exits 77 when no CUDA device is present.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "linear_cuda.h"
#include "ops_cuda.h"
#include "wq_bench_util.cuh"

#define NB_OK_OR_DIE(call)                                                              \
    do {                                                                                \
        nb_status s_ = (call);                                                          \
        if (s_ != NB_OK) {                                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                    nb_status_str(s_));                                                 \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

typedef struct bench_ctx {
    int m, k, n;
    int copies;
    nb_cuda_wq *wq;     // [copies] device planes and sz
    void **w16;         // [copies] dense f16 weights
    void *x, *out;
    cublasHandle_t cb;
    int path;           // 0 wq4, 1 wq8, 2 cuBLAS fp16, 3 dense_ri, 4 cuBLAS in 16-row slices
    int bf16_x;         // wq paths: x (and out) in bf16 instead of f16
    void *ws;           // dense_ri workspace (zeroed once)
    size_t ws_bytes;
    nb_dtype ddt;       // paths 2-4 with --dense: the weights' and x's dtype
} bench_ctx;

static void launch(const bench_ctx *c, int copy, cudaStream_t s) {
    const nb_dtype ddt = c->ddt ? c->ddt : NB_DTYPE_F16;
    if (c->path == 3) {
        NB_OK_OR_DIE(nb_cuda_matmul_dense_ri(c->out, NB_DTYPE_F32, c->x, c->w16[copy], ddt, NULL,
                                             NB_DTYPE_F32, c->n, c->m, c->k, c->ws, c->ws_bytes, s));
        return;
    }
    if (c->path == 4) { // what step mode did before dense_ri: 16-row slices, each padded to 16
        for (int r = 0; r < c->n; r += 16)
            NB_OK_OR_DIE(nb_cuda_matmul_dense(c->cb, (float *)c->out + (size_t)r * c->m, NB_DTYPE_F32,
                                              (const uint16_t *)c->x + (size_t)r * c->k, c->w16[copy], ddt,
                                              NULL, NB_DTYPE_F32, 16, c->m, c->k, s));
        return;
    }
    if (c->path == 2 && c->ddt)
        NB_OK_OR_DIE(nb_cuda_matmul_dense(c->cb, c->out, NB_DTYPE_F32, c->x, c->w16[copy], ddt, NULL,
                                          NB_DTYPE_F32, c->n, c->m, c->k, s));
    else if (c->path == 2)
        NB_OK_OR_DIE(nb_cuda_matmul_dense(c->cb, c->out, NB_DTYPE_F16, c->x, c->w16[copy],
                                          NB_DTYPE_F16, NULL, NB_DTYPE_F32, c->n, c->m, c->k, s));
    else
        NB_OK_OR_DIE(nb_cuda_matmul_wq(c->out, c->bf16_x ? NB_DTYPE_BF16 : NB_DTYPE_F16, c->x,
                                       c->bf16_x ? NB_DTYPE_BF16 : NB_DTYPE_F16, &c->wq[copy],
                                       c->path, NULL, NB_DTYPE_F32, c->n, c->m, c->k, NULL, 0,
                                       s));
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

// Median microseconds per step over replays of a graph of `steps` steps
// (step(i) enqueues step i on s; step(0) runs once first, outside the
// capture: lazy module / cuBLAS initialisation), reps <= 64 of them.
template <typename Step> static double graph_us(cudaStream_t s, int steps, int reps, Step step) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    step(0);
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < steps; i++) step(i);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; i++) CUDA_OK(cudaGraphLaunch(exec, s));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    float ms[64];
    if (reps > 64) reps = 64;
    for (int r = 0; r < reps; r++) {
        CUDA_OK(cudaEventRecord(e0, s));
        CUDA_OK(cudaGraphLaunch(exec, s));
        CUDA_OK(cudaEventRecord(e1, s));
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    CUDA_OK(cudaGetLastError());
    qsort(ms, reps, sizeof ms[0], cmp_float);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return 1000.0 * ms[reps / 2] / steps;
}

// Median microseconds per launch over graph replays.
static double time_path(const bench_ctx *c, cudaStream_t s, int reps) {
    const int per = c->copies >= 32 ? c->copies : (32 + c->copies - 1) / c->copies * c->copies;
    return graph_us(s, per, reps, [&](int i) { launch(c, i % c->copies, s); });
}

// Device-to-device copy bandwidth (bytes read + bytes written per second).
static double copy_gbps(cudaStream_t s, size_t bytes) {
    void *a, *b;
    CUDA_OK(cudaMalloc(&a, bytes));
    CUDA_OK(cudaMalloc(&b, bytes));
    fill(a, bytes, 0, 7);
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    float ms[15];
    for (int r = 0; r < 3; r++) CUDA_OK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    for (int r = 0; r < 15; r++) {
        CUDA_OK(cudaEventRecord(e0, s));
        CUDA_OK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
        CUDA_OK(cudaEventRecord(e1, s));
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    qsort(ms, 15, sizeof ms[0], cmp_float);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)bytes / (ms[7] * 1e-3) / 1e9;
}

// One dense shape's device buffers: enough weight copies (>= 4x L2 in all)
// that no launch finds its weights in L2, 64 rows of x and out, and a
// dense_ri workspace for 64 rows at any k split.
typedef struct dense_set {
    int m, k, copies;
    void **w;
    void *x, *out, *ws;
    size_t ws_bytes;
} dense_set;

static dense_set dense_alloc(int m, int k, size_t l2, uint32_t seed) {
    dense_set d = {m, k, 0, NULL, NULL, NULL, NULL, (size_t)8 * 64 * m * 4};
    const size_t bytes = (size_t)m * k * 2;
    d.copies = (int)((4 * l2 + bytes - 1) / bytes) + 1;
    d.w = (void **)calloc(d.copies, sizeof *d.w);
    for (int c = 0; c < d.copies; c++) {
        CUDA_OK(cudaMalloc(&d.w[c], bytes));
        fill(d.w[c], (size_t)m * k, 1, seed + c);
    }
    CUDA_OK(cudaMalloc(&d.x, (size_t)64 * k * 2));
    CUDA_OK(cudaMalloc(&d.out, (size_t)64 * m * 4));
    CUDA_OK(cudaMalloc(&d.ws, d.ws_bytes));
    fill(d.x, (size_t)64 * k, 1, seed + 100);
    CUDA_OK(cudaDeviceSynchronize());
    return d;
}

static void dense_free(dense_set *d) {
    for (int c = 0; c < d->copies; c++) cudaFree(d->w[c]);
    free(d->w);
    cudaFree(d->x);
    cudaFree(d->out);
    cudaFree(d->ws);
}

// --dense: the row-invariant dense matmul (what the engine's decode, draft
// and verify passes run for dense weights) against cuBLAS on the same
// weights: one cuBLAS call of n rows, and the 16-row slices step mode used
// before (ceil(n/16) calls padded to 16 rows, each reading the weights).
static void dense_bench(int quick, int sweep, double peak, size_t l2, cudaStream_t s, cublasHandle_t cb) {
    const int shapes[5][2] = {{4096, 4096}, {6144, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
    const char *names[5] = {"o 4096x4096", "qkv 6144x4096", "gate|up 28672x4096", "down 4096x14336",
                            "lm head 128256x4096"};
    const int batches[10] = {1, 4, 8, 16, 17, 24, 32, 40, 48, 64};
    const int n_shapes = quick ? 1 : 5, n_batches = quick ? 3 : 10, reps = quick ? 3 : 15;
    if (sweep) { // k splits forced: S = 1..8 on the split shapes, bf16, n = 1, 16, 40, 64
        printf("k-split sweep (us; dense_ri with S forced; bf16):\n\n| shape | n | S=1 | S=2 | S=3 | S=4 | S=5 | S=6 | "
               "S=8 |\n|---|---|---|---|---|---|---|---|---|\n");
        const int ss[3] = {0, 1, 3}, sn[4] = {1, 16, 40, 64};
        for (int i = 0; i < 3; i++) {
            dense_set d = dense_alloc(shapes[ss[i]][0], shapes[ss[i]][1], l2, 900);
            for (int j = 0; j < 4; j++) {
                printf("| %s | %d |", names[ss[i]], sn[j]);
                for (int S = 1; S <= 8; S += S < 6 ? 1 : 2) {
                    nb_cuda_matmul_dense_ri_set_split(S);
                    bench_ctx c = {d.m, d.k, sn[j], d.copies, NULL, d.w, d.x, d.out, cb, 3, 0, d.ws, d.ws_bytes,
                                   NB_DTYPE_BF16};
                    printf(" %.2f |", time_path(&c, s, reps));
                }
                nb_cuda_matmul_dense_ri_set_split(0);
                printf("\n");
                fflush(stdout);
            }
            dense_free(&d);
        }
        printf("\n");
    }
    printf("Dense linear layer, out[n][m] f32 = x[n][k] W^T (Llama-3-8B shapes; qkv and gate|up "
           "stacked as the engine runs them); us per launch; S = k splits of dense_ri; GB/s and "
           "%% of the copy bandwidth count the weight bytes only; \"sliced\" = cuBLAS on 16-row "
           "slices (step mode before dense_ri):\n\n");
    printf("| shape (m x k) | dtype | S | n | dense_ri us | no PDL us | GB/s | %% peak | cuBLAS us | "
           "sliced us | vs cuBLAS | vs sliced |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const nb_dtype dts[2] = {NB_DTYPE_BF16, NB_DTYPE_F16};
    for (int si = 0; si < n_shapes; si++) {
        const int m = shapes[si][0], k = shapes[si][1];
        const size_t bytes = (size_t)m * k * 2;
        dense_set d = dense_alloc(m, k, l2, 700);
        for (int di = 0; di < (quick ? 1 : 2); di++)
            for (int bi = 0; bi < n_batches; bi++) {
                const int n = batches[bi];
                bench_ctx c = {m, k, n, d.copies, NULL, d.w, d.x, d.out, cb, 3, 0, d.ws, d.ws_bytes, dts[di]};
                const double t_ri = time_path(&c, s, reps);
                nb_cuda_matmul_wq_set_pdl(0);
                const double t_np = time_path(&c, s, reps);
                nb_cuda_matmul_wq_set_pdl(-1);
                c.path = 2;
                const double t_cb = time_path(&c, s, reps);
                c.path = 4;
                const double t_sl = time_path(&c, s, reps);
                const double gbps = (double)bytes / (t_ri * 1e-6) / 1e9;
                printf("| %s | %s | %d | %d | %.2f | %.2f | %.0f | %.1f%% | %.2f | %.2f | %.2fx | %.2fx |\n",
                       names[si], nb_dtype_name(dts[di]), nb_cuda_matmul_dense_ri_split(m, k), n, t_ri, t_np,
                       gbps, 100.0 * gbps / peak, t_cb, t_sl, t_cb / t_ri, t_sl / t_ri);
                fflush(stdout);
            }
        dense_free(&d);
    }
}

// --norm-post's table: for each n of ns, the chain step(n, post, i) with
// the norm launched (post 0) and scaled after (post 1), graph replays of
// `steps` steps (the residual stream x, xbytes, zeroed before each), us a
// step; prints "| n | launched | scaled after | saved |" rows.
template <typename Step>
static void norm_post_table(cudaStream_t s, const int *ns, int n_ns, int steps, int reps, void *x, size_t xbytes,
                            Step step) {
    for (int in = 0; in < n_ns; in++) {
        const int n = ns[in];
        double t[2];
        for (int post = 0; post < 2; post++) {
            CUDA_OK(cudaMemset(x, 0, xbytes));
            t[post] = graph_us(s, steps, reps, [&](int i) { step(n, post, i); });
        }
        printf("| %d | %.2f | %.2f | %.2f |\n", n, t[0], t[1], t[0] - t[1]);
        fflush(stdout);
    }
    printf("\n");
}

// --norm-post, the target's half: a layer's dense o projection (f16
// 4096x4096), RMSNorm and gate|up + SwiGLU (28672x4096) on the
// row-invariant matmul with the norm launched between them
// (nb_cuda_matmul_dense_ri f32 out, nb_cuda_add_rmsnorm,
// nb_cuda_matmul_dense_ri_swiglu) against scaled after gate|up
// (nb_cuda_matmul_dense_ri_res, nb_cuda_matmul_dense_ri_swiglu_rs), at the
// engine's decode and verify row counts; timed as below.
static void norm_post_dense_bench(cudaStream_t s) {
    const int H = 4096, I = 14336, C = 2, steps = 16, reps = 11, NR = 64;
    const float eps = 1e-5f;
    void *wo[C], *wg[C];
    for (int c = 0; c < C; c++) {
        CUDA_OK(cudaMalloc(&wo[c], (size_t)H * H * 2));
        CUDA_OK(cudaMalloc(&wg[c], (size_t)2 * I * H * 2));
        fill(wo[c], (size_t)H * H, 1, 41u + 2u * c);
        fill(wg[c], (size_t)2 * I * H, 1, 42u + 2u * c);
    }
    size_t ws = nb_cuda_matmul_dense_ri_rope_workspace_bytes(NR, H, H);
    const size_t wg_ws = nb_cuda_matmul_dense_ri_workspace_bytes(NR, 2 * I, H);
    if (wg_ws > ws) ws = wg_ws;
    void *xin, *tmp, *x, *xq, *xs, *part, *out, *nw, *wsp;
    CUDA_OK(cudaMalloc(&xin, NR * H * 2));
    CUDA_OK(cudaMalloc(&tmp, NR * H * 4));
    CUDA_OK(cudaMalloc(&x, NR * H * 4));
    CUDA_OK(cudaMalloc(&xq, NR * H * 2));
    CUDA_OK(cudaMalloc(&xs, NR * H * 2));
    CUDA_OK(cudaMalloc(&part, NR * nb_cuda_dr_parts(H) * 4));
    CUDA_OK(cudaMalloc(&out, (size_t)NR * I * 2));
    CUDA_OK(cudaMalloc(&nw, H * 2));
    CUDA_OK(cudaMalloc(&wsp, ws));
    fill(xin, NR * H, 1, 51u);
    fill(nw, H, 1, 52u);
    printf("## The RMSNorm between a target layer's o projection and gate|up: launched, or scaled after gate|up "
           "(f16 row-invariant, 4096x4096 then 28672x4096 + SwiGLU)\n\n| n | norm launched us | scaled after us | "
           "saved us |\n|---|---|---|---|\n");
    const int ns[] = {1, 2, 4, 8, 16, 40, 64};
    norm_post_table(s, ns, 7, steps, reps, x, (size_t)NR * H * 4, [&](int n, int post, int i) {
        const int c = i % C;
        if (post) {
            const nb_cuda_dr_res rs = {(float *)x, nw, NB_DTYPE_F16, xs, (float *)part};
            NB_OK_OR_DIE(nb_cuda_matmul_dense_ri_res(xin, wo[c], NB_DTYPE_F16, NULL, NB_DTYPE_F32, n, H, H, wsp, ws,
                                                     &rs, s));
            NB_OK_OR_DIE(nb_cuda_matmul_dense_ri_swiglu_rs(out, NB_DTYPE_F16, 0, xs, wg[c], NB_DTYPE_F16, n, 2 * I, H,
                                                           wsp, ws, (const float *)part, eps, s));
        } else {
            NB_OK_OR_DIE(nb_cuda_matmul_dense_ri(tmp, NB_DTYPE_F32, xin, wo[c], NB_DTYPE_F16, NULL, NB_DTYPE_F32, n, H,
                                                 H, wsp, ws, s));
            const nb_cuda_cvt cvt = {xq, NB_DTYPE_F16, 0};
            NB_OK_OR_DIE(nb_cuda_add_rmsnorm((float *)x, (const float *)tmp, nw, NB_DTYPE_F16, n, H, eps, NULL, cvt, s));
            NB_OK_OR_DIE(nb_cuda_matmul_dense_ri_swiglu(out, NB_DTYPE_F16, 0, xq, wg[c], NB_DTYPE_F16, n, 2 * I, H, wsp,
                                                        ws, s));
        }
    });
    for (int c = 0; c < C; c++) {
        CUDA_OK(cudaFree(wo[c]));
        CUDA_OK(cudaFree(wg[c]));
    }
    void *f[9] = {xin, tmp, x, xq, xs, part, out, nw, wsp};
    for (void *d : f) CUDA_OK(cudaFree(d));
}

// --norm-post: a draft layer's o projection (4096x4096, 4-bit), RMSNorm and
// gate|up + SwiGLU (28672x4096) with the norm launched between them
// (nb_cuda_matmul_wq f32 out, nb_cuda_add_rmsnorm, nb_cuda_matmul_wq_swiglu)
// against scaled after gate|up (nb_cuda_matmul_wq_res, then
// nb_cuda_matmul_wq_swiglu_rs): microseconds per step, graph replays of 32
// steps over two weight copies of each matrix (more bytes than the L2
// holds), at the engine's draft row counts.
static void norm_post_bench(cudaStream_t s) {
    const int H = 4096, I = 14336, C = 2, steps = 32, reps = 15;
    const float eps = 1e-5f;
    nb_cuda_wq wo[C], wg[C];
    for (int c = 0; c < C; c++) {
        const int ms[2] = {H, 2 * I};
        nb_cuda_wq *w[2] = {&wo[c], &wg[c]};
        for (int i = 0; i < 2; i++) {
            const size_t pb = nb_cuda_wq_plane_bytes(ms[i], H), sz = nb_cuda_wq_sz_elems(ms[i], H);
            void *up = NULL, *z = NULL;
            CUDA_OK(cudaMalloc(&up, pb));
            CUDA_OK(cudaMalloc(&z, sz * 2));
            fill(up, pb, 0, 11u + 2u * c + i);
            fill(z, sz, 2, 21u + 2u * c + i); // scales and zeros alike small, positive: finite outputs
            *w[i] = (nb_cuda_wq){(const uint8_t *)up, NULL, (const uint16_t *)z};
        }
    }
    const int NR = 16;
    void *xin, *tmp, *x, *xq, *xs, *part, *out, *nw;
    CUDA_OK(cudaMalloc(&xin, NR * H * 2));
    CUDA_OK(cudaMalloc(&tmp, NR * H * 4));
    CUDA_OK(cudaMalloc(&x, NR * H * 4));
    CUDA_OK(cudaMalloc(&xq, NR * H * 2));
    CUDA_OK(cudaMalloc(&xs, NR * H * 2));
    CUDA_OK(cudaMalloc(&part, NR * NB_CUDA_WQ_PART * 4));
    CUDA_OK(cudaMalloc(&out, NR * I * 2));
    CUDA_OK(cudaMalloc(&nw, H * 2));
    fill(xin, NR * H, 1, 31u);
    fill(nw, H, 1, 32u);
    printf("## The RMSNorm between a draft layer's o projection and gate|up: launched, or scaled after gate|up "
           "(4-bit, 4096x4096 then 28672x4096 + SwiGLU)\n\n| n | norm launched us | scaled after us | saved us "
           "|\n|---|---|---|---|\n");
    const int ns[] = {1, 2, 4, 8, 16};
    norm_post_table(s, ns, 5, steps, reps, x, (size_t)NR * H * 4, [&](int n, int post, int i) {
        const int c = i % C;
        if (post) {
            const nb_cuda_wq_res rs = {(float *)x, nw, NB_DTYPE_F16, (uint16_t *)xs, (float *)part};
            NB_OK_OR_DIE(nb_cuda_matmul_wq_res(xin, NB_DTYPE_F16, &wo[c], NULL, NB_DTYPE_F32, n, H, H, &rs, s));
            NB_OK_OR_DIE(nb_cuda_matmul_wq_swiglu_rs(out, NB_DTYPE_F16, 1, xs, NB_DTYPE_F16, &wg[c], n, 2 * I, H,
                                                     (const float *)part, eps, s));
        } else {
            NB_OK_OR_DIE(nb_cuda_matmul_wq(tmp, NB_DTYPE_F32, xin, NB_DTYPE_F16, &wo[c], 0, NULL, NB_DTYPE_F32, n, H, H,
                                           NULL, 0, s));
            const nb_cuda_cvt cvt = {xq, NB_DTYPE_F16, 1};
            NB_OK_OR_DIE(nb_cuda_add_rmsnorm((float *)x, (const float *)tmp, nw, NB_DTYPE_F16, n, H, eps, NULL, cvt, s));
            NB_OK_OR_DIE(nb_cuda_matmul_wq_swiglu(out, NB_DTYPE_F16, 1, xq, NB_DTYPE_F16, &wg[c], 0, n, 2 * I, H, s));
        }
    });
    for (int c = 0; c < C; c++) {
        void *f[4] = {(void *)wo[c].upper, (void *)wo[c].sz, (void *)wg[c].upper, (void *)wg[c].sz};
        for (void *d : f) CUDA_OK(cudaFree(d));
    }
    void *f[8] = {xin, tmp, x, xq, xs, part, out, nw};
    for (void *d : f) CUDA_OK(cudaFree(d));
    norm_post_dense_bench(s);
}

int main(int argc, char **argv) {
    const int quick = argc == 2 && strcmp(argv[1], "--quick") == 0;
    const int only = argc == 5 && strcmp(argv[1], "--only") == 0;
    const int only_m = only ? atoi(argv[2]) : 0, only_k = only ? atoi(argv[3]) : 0;
    const int only_n = only ? atoi(argv[4]) : 0;
    // --gemv-sweep [M K]...: the sweep on up to three given shapes (e.g. the
    // engine's stacked q|k|v and gate|up) instead of the three Llama shapes.
    const int gsweep = argc >= 2 && argc <= 8 && argc % 2 == 0 && strcmp(argv[1], "--gemv-sweep") == 0;
    const int gshapes = gsweep ? (argc - 2) / 2 : 0;
    const int dense = argc >= 2 && argc <= 3 && strcmp(argv[1], "--dense") == 0 &&
                      (argc == 2 || strcmp(argv[2], "--quick") == 0 || strcmp(argv[2], "--sweep") == 0);
    const int dsweep = dense && argc == 3 && strcmp(argv[2], "--sweep") == 0;
    const int npost = argc == 2 && strcmp(argv[1], "--norm-post") == 0;
    if (argc > 1 && !quick && !only && !gsweep && !dense && !npost) {
        fprintf(stderr, "usage: bench_linear_cuda [--quick | --only M K N | --gemv-sweep [M K]... | --dense [--quick | --sweep] | --norm-post]\n");
        return 2;
    }
    int gsh[3][2] = {{0, 0}, {0, 0}, {0, 0}};
    for (int i = 0; i < gshapes; i++) {
        gsh[i][0] = atoi(argv[2 + 2 * i]);
        gsh[i][1] = atoi(argv[3 + 2 * i]);
        if (gsh[i][0] <= 0 || gsh[i][0] > (1 << 20) || gsh[i][1] <= 0 || gsh[i][1] > (1 << 20) ||
            gsh[i][1] % NB_WQ_GROUP) {
            fprintf(stderr, "bench_linear_cuda: --gemv-sweep M K needs 0 < M, K <= 2^20, K %% %d == 0\n", NB_WQ_GROUP);
            return 2;
        }
    }
    if (only && (only_m <= 0 || only_k <= 0 || only_k % NB_WQ_GROUP || only_n < 1 || only_n > 16)) {
        fprintf(stderr, "bench_linear_cuda: --only M K N needs M > 0, K %% %d == 0, 1 <= N <= 16\n",
                NB_WQ_GROUP);
        return 2;
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("bench_linear_cuda: SKIP: no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major < 9) {
        printf("bench_linear_cuda: SKIP: built for sm_90a only\n");
        return 77;
    }
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cublasHandle_t cb;
    if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    // NOTE: a fixed cuBLAS workspace keeps graph capture free of allocations.
    void *cb_ws;
    const size_t cb_ws_bytes = 32u << 20;
    CUDA_OK(cudaMalloc(&cb_ws, cb_ws_bytes));
    if (cublasSetWorkspace(cb, cb_ws, cb_ws_bytes) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasSetWorkspace failed\n");
        return 1;
    }

    const double peak = copy_gbps(s, quick ? (64u << 20) : (1024u << 20));
    const size_t l2 = (size_t)prop.l2CacheSize;
    printf("device: %s, %d SMs, L2 %.0f MB; device-to-device copy: %.0f GB/s (read+write)\n\n",
           prop.name, prop.multiProcessorCount, l2 / 1e6, peak);
    if (npost) {
        norm_post_bench(s);
        cublasDestroy(cb);
        cudaFree(cb_ws);
        cudaStreamDestroy(s);
        return 0;
    }
    if (dense) {
        dense_bench(argc == 3 && !dsweep, dsweep, peak, l2, s, cb);
        cublasDestroy(cb);
        cudaFree(cb_ws);
        cudaStreamDestroy(s);
        return 0;
    }

    int shapes[3][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
    const char *names[3] = {"q/o 4096x4096", "gate/up 14336x4096", "down 4096x14336"};
    int batches[5] = {1, 4, 8, 9, 16};
    if (gsweep) { // the decode kernel's own range, around the built-in switch to 32-row items at n = 5
        const int gb[5] = {1, 4, 5, 6, 8};
        memcpy(batches, gb, sizeof gb);
    }
    int n_shapes = quick ? 1 : 3, n_batches = quick ? 1 : 5;
    char gnames[3][32];
    for (int i = 0; i < gshapes; i++) {
        shapes[i][0] = gsh[i][0];
        shapes[i][1] = gsh[i][1];
        snprintf(gnames[i], sizeof gnames[i], "%dx%d", gsh[i][0], gsh[i][1]);
        names[i] = gnames[i];
    }
    if (gshapes) n_shapes = gshapes;
    const int reps = quick ? 3 : 15;
    if (only) {
        shapes[0][0] = only_m;
        shapes[0][1] = only_k;
        names[0] = "--only";
        batches[0] = only_n;
        n_shapes = n_batches = 1;
    }
    const char *path_names[3] = {"wq 4-bit", "wq 8-bit (hier.)", "cuBLAS fp16"};

    if (gsweep)
        printf("| shape (m x k)      |  n | path             | v |  all/SM  |     1/SM |     2/SM "
               "|     3/SM | vs fp16 |\n|---|---|---|---|---|---|---|---|---|\n");
    char table[64][200];
    int rows = 0;
    char sweep[64][240];
    int srows = 0;
    double goal_speedup[3] = {0, 0, 0};
    for (int si = 0; si < n_shapes; si++) {
        const int m = shapes[si][0], k = shapes[si][1], ng = k / NB_WQ_GROUP;
        const size_t plane = nb_cuda_wq_plane_bytes(m, k), groups = (size_t)m * ng;
        const size_t wq4_bytes = plane + groups * 4, dense_bytes = (size_t)m * k * 2;
        const int cq = (int)((4 * l2 + wq4_bytes - 1) / wq4_bytes) + 1;
        const int cd = (int)((4 * l2 + dense_bytes - 1) / dense_bytes) + 1;
        nb_cuda_wq *wq = (nb_cuda_wq *)calloc(cq, sizeof *wq);
        const size_t nsz = nb_cuda_wq_sz_elems(m, k);
        void **w16 = (void **)calloc(cd, sizeof *w16);
        for (int c = 0; c < cq; c++) {
            uint8_t *u, *l;
            uint16_t *sz;
            CUDA_OK(cudaMalloc(&u, plane));
            CUDA_OK(cudaMalloc(&l, plane));
            CUDA_OK(cudaMalloc(&sz, nsz * 2));
            fill(u, plane, 0, 100 + c);
            fill(l, plane, 0, 200 + c);
            fill(sz, nsz, 2, 300 + c); // scale-like values for scales and zeros alike
            wq[c].upper = u;
            wq[c].lower = l;
            wq[c].sz = sz;
        }
        for (int c = 0; c < cd; c++) {
            CUDA_OK(cudaMalloc(&w16[c], dense_bytes));
            fill(w16[c], (size_t)m * k, 1, 500 + c);
        }
        void *x, *out;
        CUDA_OK(cudaMalloc(&x, (size_t)16 * k * 2));
        CUDA_OK(cudaMalloc(&out, (size_t)16 * m * 4));
        fill(x, (size_t)16 * k, 1, 600 + si);
        CUDA_OK(cudaDeviceSynchronize());

        for (int bi = 0; gsweep && bi < n_batches; bi++) {
            const int n = batches[bi];
            bench_ctx c = {m, k, n, cd, wq, w16, x, out, cb, 2, 0, NULL, 0, NB_DTYPE_F32};
            const double t_fp16 = time_path(&c, s, reps);
            for (int path = 0; path < 2; path++) {
                c.path = path;
                c.copies = cq;
                const int nv = nb_cuda_matmul_wq_set_gemv_variant(-1);
                for (int v = 0; v < nv; v++) {
                    nb_cuda_matmul_wq_set_gemv_variant(v);
                    double t[4];
                    for (int b = 0; b < 4; b++) {
                        nb_cuda_matmul_wq_set_blocks_per_sm(b);
                        t[b] = time_path(&c, s, reps);
                    }
                    nb_cuda_matmul_wq_set_blocks_per_sm(0);
                    printf("| %-18s | %2d | %-16s | %d | %8.2f | %8.2f | %8.2f | %8.2f | %5.2fx |\n",
                           names[si], n, path_names[path], v, t[0], t[1], t[2], t[3],
                           t_fp16 / t[0]);
                }
                nb_cuda_matmul_wq_set_gemv_variant(-1);
                // The same view with bf16 activations (a bf16 model's
                // quantized layers; no subnormal-code path), built-in choice.
                c.bf16_x = 1;
                const double t_bf = time_path(&c, s, reps);
                c.bf16_x = 0;
                printf("| %-18s | %2d | %s bf16 x | 0 | %8.2f |          |          |          | "
                       "%5.2fx |\n", names[si], n, path ? "wq 8-bit" : "wq 4-bit", t_bf,
                       t_fp16 / t_bf);
            }
            printf("| %-18s | %2d | cuBLAS fp16      | - | %8.2f |\n", names[si], n, t_fp16);
        }
        for (int bi = 0; !gsweep && bi < n_batches; bi++) {
            const int n = batches[bi];
            double us[3];
            for (int path = 2; path >= 0; path--) {
                bench_ctx c = {m, k, n, path == 2 ? cd : cq, wq, w16, x, out, cb, path, 0, NULL, 0, NB_DTYPE_F32};
                nb_cuda_matmul_wq_set_tile_rows(0);
                us[path] = time_path(&c, s, reps);
                const double wbytes = path == 2 ? (double)dense_bytes
                                                : (double)plane * (path == 1 ? 2 : 1) + groups * 4.0;
                const double io = (double)n * k * 2 + (double)n * m * 2;
                const double gbps = (wbytes + io) / (us[path] * 1e-6) / 1e9;
                snprintf(table[rows++], sizeof table[0],
                         "| %-18s | %2d | %-16s | %8.2f | %7.2f | %6.0f | %5.1f%% | %5.2fx |",
                         names[si], n, path_names[path], us[path], wbytes / 1e6, gbps,
                         100.0 * gbps / peak, us[2] / us[path]);
                if (path < 2) {
                    double t16 = 0, t32 = 0, tnp, t1sm = 0;
                    // The tile kernel; n <= 8 runs the decode kernel unless told not to.
                    nb_cuda_matmul_wq_set_decode_kernel(0);
                    if (n > 8) nb_cuda_matmul_wq_set_tile_rows(16);
                    t16 = time_path(&c, s, reps);
                    if (n > 8) {
                        nb_cuda_matmul_wq_set_tile_rows(32);
                        t32 = time_path(&c, s, reps);
                    }
                    nb_cuda_matmul_wq_set_tile_rows(0);
                    nb_cuda_matmul_wq_set_decode_kernel(-1);
                    nb_cuda_matmul_wq_set_pdl(0);
                    tnp = time_path(&c, s, reps);
                    nb_cuda_matmul_wq_set_pdl(-1);
                    if (n <= 8) { // the decode kernel's grid sized for 1 block per SM
                        nb_cuda_matmul_wq_set_blocks_per_sm(1);
                        t1sm = time_path(&c, s, reps);
                        nb_cuda_matmul_wq_set_blocks_per_sm(0);
                    }
                    // 9 <= n <= 16: the decode kernel's other two-x-tile variants
                    char av[48] = "       - |        - |        - |        -";
                    if (n > 8 && n <= 16) {
                        double tv[4];
                        for (int v = 0; v < 4; v++) {
                            nb_cuda_matmul_wq_set_gemv16_variant(v);
                            tv[v] = time_path(&c, s, reps);
                        }
                        nb_cuda_matmul_wq_set_gemv16_variant(-1);
                        snprintf(av, sizeof av, "%8.2f | %8.2f | %8.2f | %8.2f", tv[0], tv[1], tv[2],
                                 tv[3]);
                    }
                    char a16[16], a32[16] = "       -", a2[16] = "       -";
                    if (n <= 8) snprintf(a2, sizeof a2, "%8.2f", t1sm);
                    snprintf(a16, sizeof a16, "%8.2f", t16);
                    if (n > 8) snprintf(a32, sizeof a32, "%8.2f", t32);
                    snprintf(sweep[srows++], sizeof sweep[0],
                             "| %-18s | %2d | %-16s | %8.2f | %8.2f | %7.2fx | %s | %s | %s | %s |",
                             names[si], n, path_names[path], us[path], tnp, tnp / us[path], a16,
                             a32, a2, av);
                }
            }
            if (n == 1) goal_speedup[si] = us[2] / us[0];
        }
        for (int c = 0; c < cq; c++) {
            cudaFree((void *)wq[c].upper);
            cudaFree((void *)wq[c].lower);
            cudaFree((void *)wq[c].sz);
        }
        for (int c = 0; c < cd; c++) cudaFree(w16[c]);
        cudaFree(x);
        cudaFree(out);
        free(wq);
        free(w16);
    }

    if (gsweep) {
        printf("\n(gemv sweep columns: variant, us with the grid sized for all resident "
               "blocks per SM, 1, 2, 3 per SM; speedup of the first over cuBLAS fp16)\n");
        cublasDestroy(cb);
        cudaFree(cb_ws);
        cudaStreamDestroy(s);
        return 0;
    }
    printf("Launch and kernel sweep (us per launch; auto = the built-in choice: the "
           "streaming decode kernel with PDL for n <= 16 (two x tiles from n = 9; the 8-bit "
           "view of <= 16M weights takes the tile kernel at n <= 8), the tile kernel above; "
           "no PDL = the same without programmatic dependent launch; tile 16 = the tile kernel "
           "with 16-row tiles in place of the decode kernel; tile 32 = 32-row tiles, n > 8; "
           "1/SM = the decode kernel's grid sized for one block per SM instead of two; "
           "v0-v3 = the decode kernel's two-x-tile variants forced (kGv2Vars), n 9..16):\n\n");
    printf("| shape (m x k)      |  n | path             |  auto us | no PDL   | PDL gain | "
           "tile 16  | tile 32  | 1/SM     | v0       | v1       | v2       | v3       |\n");
    printf("|--------------------|----|------------------|----------|----------|----------|"
           "----------|----------|----------|----------|----------|----------|----------|\n");
    for (int r = 0; r < srows; r++) printf("%s\n", sweep[r]);
    printf("\nLinear layer, out[n][m] = x[n][k] W^T, f16 activations and output; MB = weight "
           "bytes read per call; GB/s counts weights + x + out; %% of the copy bandwidth above; "
           "speedup over cuBLAS fp16:\n\n");
    printf("| shape (m x k)      |  n | path             |       us |      MB |   GB/s | %% peak "
           "| vs fp16 |\n");
    printf("|--------------------|----|------------------|----------|---------|--------|-------"
           "-|---------|\n");
    for (int r = 0; r < rows; r++) printf("%s\n", table[r]);
    printf("\n");
    for (int si = 0; si < n_shapes; si++)
        printf("goal (4-bit >= 3x cuBLAS fp16 at n = 1), %s: %.2fx %s\n", names[si],
               goal_speedup[si], goal_speedup[si] >= 3.0 ? "MET" : "NOT MET");
    cublasDestroy(cb);
    cudaFree(cb_ws);
    cudaStreamDestroy(s);
    return 0;
}
