// test_dense_ri_cuda.cu: the row-invariant dense matmul
// (nb_cuda_matmul_dense_ri, kernels/linear_dense_ri.cuh) against its C twin
// nb_ref_matmul, and the property the engine relies on: a row of x gets the
// same bits whatever n is and wherever the row sits among the n rows.
//
// Checked, for f16 and bf16, on shapes with and without k splits (the
// built-in plan and forced S = 1, 2, 3, 7), m not a multiple of the 128-row
// block, n = 1..130 (every x-tile form, NX = 1, 2, 4, 8, and n > 64 with
// more than one block row):
//   - against nb_ref_matmul within 2^-14 * S + u_out * (|ref| + 2^-14 * S),
//     S = sum |x||w| + |bias| per output (the kernel adds in f32 in its own
//     order, then rounds once to out_dt; see test_linear_cuda.cu for why
//     2^-14 * S);
//   - bit for bit: the first n rows, and rows 3..3+n taken at offset 0,
//     against the same rows of one 130-row launch; every launch three times;
//     out poisoned with NaN before each launch, and nothing written past
//     the n rows;
//   - a chain of dependent launches (each reads the previous one's output)
//     with programmatic dependent launch on and off: the same bits;
//   - one workspace shared by launches of different shapes in one stream;
//   - refusals: unsupported dtype or k, misaligned or NULL pointers, a
//     missing or too small workspace;
//   - the SwiGLU form (nb_cuda_matmul_dense_ri_swiglu) byte for byte
//     against the plain form + nb_cuda_silu_mul_cvt (check_swiglu), and
//     the RoPE form (nb_cuda_matmul_dense_ri_rope) against the plain form +
//     nb_cuda_rope_write_kv (check_rope), with their refusals;
//   - the norm scaled after the matmul: the residual form
//     (nb_cuda_matmul_dense_ri_res) against the plain form + the host's
//     add, x * w and partial sums (check_res), and the norm-scaled SwiGLU
//     and RoPE forms (_rs) against the plain form, the host's scaling and
//     the separate SwiGLU / RoPE kernels, byte for byte.
// Exits 77 (skipped) when no CUDA device is present.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "linear_cuda.h"
#include "ops_cuda.h"
extern "C" {
#include "ops_ref.h"
}
#include "nb_test.h"

#include "../nb_cuda_check.h"
#include "linear_test_util.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static double urand(void) { return lt_urand(&g_rng); } // [0, 1)


#define NMAX 130

typedef struct shape_ctx {
    nb_dtype dt;
    int m, k;
    void *d_w, *d_x, *d_bias, *d_out, *d_ws;
    size_t ws_bytes;
    float *ref, *S;  // [NMAX][m]: reference with bias, and sum of |terms|
    float *babs;
} shape_ctx;

static double g_worst = 0.0;
static long g_outputs = 0;

// Launches n rows of x starting at row r0 into d_out (poisoned first);
// returns the host copy of NMAX rows of out (f32 view of out_dt).
static void *launch(shape_ctx *c, nb_dtype odt, int r0, int n, int with_bias) {
    const size_t es = nb_dtype_size(c->dt), os = nb_dtype_size(odt);
    const size_t all = (size_t)NMAX * c->m * os;
    CUDA_OK(cudaMemset(c->d_out, 0xff, all));
    const nb_status st = nb_cuda_matmul_dense_ri(c->d_out, odt, (const uint8_t *)c->d_x + (size_t)r0 * c->k * es,
                                                 c->d_w, c->dt, with_bias ? c->d_bias : NULL,
                                                 NB_DTYPE_BF16, n, c->m, c->k, c->d_ws, c->ws_bytes, 0);
    CHECKF(st == NB_OK, "dense_ri %s m=%d k=%d n=%d: %s", nb_dtype_name(c->dt), c->m, c->k, n,
           nb_status_str(st));
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    void *h = malloc(all);
    CUDA_OK(cudaMemcpy(h, c->d_out, all, cudaMemcpyDeviceToHost));
    return h;
}

// Rows [r0, r0 + n) of the reference against h's first n rows; the rows
// after them must still hold the poison.
static void compare_ref(shape_ctx *c, const void *h, nb_dtype odt, int r0, int n, const char *what) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c->m; j++) {
            const size_t e = (size_t)(r0 + i) * c->m + j;
            const double got = nb_load_f32(h, odt, (size_t)i * c->m + j);
            const double s = ldexp((double)c->S[e], -14);
            const double tol = s + lt_out_u(odt) * (fabs((double)c->ref[e]) + s);
            const double err = fabs(got - (double)c->ref[e]);
            if (!(err <= tol)) {
                if (bad < 3)
                    fprintf(stderr, "  %s: [%d][%d] got %.9g ref %.9g err %.3g tol %.3g\n", what, i, j, got,
                            c->ref[e], err, tol);
                bad++;
            } else if (tol > 0 && err / tol > g_worst) {
                g_worst = err / tol;
            }
        }
    size_t untouched = 0;
    const size_t os = nb_dtype_size(odt);
    for (size_t b = (size_t)n * c->m * os; b < (size_t)NMAX * c->m * os; b++)
        untouched += ((const uint8_t *)h)[b] == 0xff;
    CHECKF(bad == 0, "%s: %d of %d outputs outside tolerance", what, bad, n * c->m);
    CHECKF(untouched == (size_t)(NMAX - n) * c->m * os, "%s: %zu bytes written past row %d", what,
           (size_t)(NMAX - n) * c->m * os - untouched, n);
    g_outputs += (long)n * c->m;
}

static void run_shape(nb_dtype dt, int m, int k, int split) {
    nb_cuda_matmul_dense_ri_set_split(split);
    shape_ctx c;
    memset(&c, 0, sizeof c);
    c.dt = dt;
    c.m = m;
    c.k = k;
    const size_t es = nb_dtype_size(dt), mk = (size_t)m * k, nk = (size_t)NMAX * k;
    // Values exactly representable in dt, so the reference sees what the GPU sees.
    uint16_t *w = (uint16_t *)malloc(mk * 2), *x = (uint16_t *)malloc(nk * 2);
    uint16_t *bias = (uint16_t *)malloc((size_t)m * 2);
    float *xf = (float *)malloc(nk * 4), *xabs = (float *)malloc(nk * 4);
    float *wabs = (float *)malloc(mk * 4);
    c.babs = (float *)malloc((size_t)m * 4);
    for (size_t e = 0; e < mk; e++) {
        const float v = (float)((urand() * 2.0 - 1.0) * 0.05);
        w[e] = dt == NB_DTYPE_F16 ? nb_f32_to_f16(v) : nb_f32_to_bf16(v);
        wabs[e] = fabsf(nb_load_f32(w, dt, e));
    }
    for (size_t e = 0; e < nk; e++) {
        const float v = (float)((urand() * 2.0 - 1.0) * 2.0);
        x[e] = dt == NB_DTYPE_F16 ? nb_f32_to_f16(v) : nb_f32_to_bf16(v);
        xf[e] = nb_load_f32(x, dt, e);
        xabs[e] = fabsf(xf[e]);
    }
    for (int j = 0; j < m; j++) {
        bias[j] = nb_f32_to_bf16((float)(urand() * 2.0 - 1.0));
        c.babs[j] = fabsf(nb_load_f32(bias, NB_DTYPE_BF16, (size_t)j));
    }
    c.ref = (float *)malloc((size_t)NMAX * m * 4);
    c.S = (float *)malloc((size_t)NMAX * m * 4);
    nb_ref_matmul(c.ref, xf, w, dt, bias, NB_DTYPE_BF16, NMAX, m, k);
    nb_ref_matmul(c.S, xabs, wabs, NB_DTYPE_F32, NULL, NB_DTYPE_F32, NMAX, m, k);
    for (size_t e = 0; e < (size_t)NMAX * m; e++) c.S[e] += c.babs[e % m];

    CUDA_OK(cudaMalloc(&c.d_w, mk * es));
    CUDA_OK(cudaMalloc(&c.d_x, nk * es));
    CUDA_OK(cudaMalloc(&c.d_bias, (size_t)m * 2));
    CUDA_OK(cudaMalloc(&c.d_out, (size_t)NMAX * m * 4));
    CUDA_OK(cudaMemcpy(c.d_w, w, mk * es, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(c.d_x, x, nk * es, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(c.d_bias, bias, (size_t)m * 2, cudaMemcpyHostToDevice));
    c.ws_bytes = nb_cuda_matmul_dense_ri_workspace_bytes(NMAX, m, k);
    const int S = nb_cuda_matmul_dense_ri_split(m, k);
    CHECKF(S >= 1 && (S == 1) == (c.ws_bytes == 0), "m=%d k=%d: S=%d with %zu workspace bytes", m, k, S,
           c.ws_bytes);
    if (c.ws_bytes) {
        CUDA_OK(cudaMalloc(&c.d_ws, c.ws_bytes));
        CUDA_OK(cudaMemset(c.d_ws, 0xff, c.ws_bytes)); // NaN: nothing needs it zeroed
    }

    char what[160];
    // The full launch: the bits every other launch's rows must equal.
    void *full = launch(&c, NB_DTYPE_F32, 0, NMAX, 1);
    snprintf(what, sizeof what, "%s m=%d k=%d S=%d n=%d", nb_dtype_name(dt), m, k, S, NMAX);
    compare_ref(&c, full, NB_DTYPE_F32, 0, NMAX, what);
    const int ns[] = {1, 2, 7, 8, 9, 16, 17, 33, 40, 64, 65, 127};
    for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
        const int n = ns[in];
        for (int r0 = 0; r0 <= 3; r0 += 3) {
            for (int rep = 0; rep < 3; rep++) {
                void *h = launch(&c, NB_DTYPE_F32, r0, n, 1);
                snprintf(what, sizeof what, "%s m=%d k=%d S=%d n=%d rows from %d (launch %d)",
                         nb_dtype_name(dt), m, k, S, n, r0, rep);
                if (rep == 0) compare_ref(&c, h, NB_DTYPE_F32, r0, n, what);
                CHECKF(memcmp(h, (float *)full + (size_t)r0 * m, (size_t)n * m * 4) == 0,
                       "%s: not the bits of the same rows in the %d-row launch", what, NMAX);
                free(h);
            }
        }
    }
    // Other output dtypes and no bias (against the reference without it).
    {
        const nb_dtype odts[2] = {NB_DTYPE_F16, NB_DTYPE_BF16};
        for (int io = 0; io < 2; io++) {
            void *h = launch(&c, odts[io], 0, 9, 1);
            snprintf(what, sizeof what, "%s m=%d k=%d S=%d n=9 out=%s", nb_dtype_name(dt), m, k, S,
                     nb_dtype_name(odts[io]));
            compare_ref(&c, h, odts[io], 0, 9, what);
            free(h);
        }
        void *h = launch(&c, NB_DTYPE_F32, 0, 5, 0);
        float *nb = (float *)malloc((size_t)5 * m * 4);
        nb_ref_matmul(nb, xf, w, dt, NULL, NB_DTYPE_F32, 5, m, k);
        int bad = 0;
        for (size_t e = 0; e < (size_t)5 * m; e++) {
            const double err = fabs((double)((float *)h)[e] - nb[e]);
            bad += !(err <= ldexp((double)c.S[e], -14));
        }
        CHECKF(bad == 0, "%s m=%d k=%d n=5 without bias: %d outputs outside tolerance", nb_dtype_name(dt), m,
               k, bad);
        free(nb);
        free(h);
    }
    printf("  %-4s m=%-5d k=%-5d S=%-2d ok so far (worst err/tol %.3f)\n", nb_dtype_name(dt), m, k, S,
           g_worst);
    fflush(stdout);
    free(full);
    cudaFree(c.d_w);
    cudaFree(c.d_x);
    cudaFree(c.d_bias);
    cudaFree(c.d_out);
    cudaFree(c.d_ws);
    free(w);
    free(x);
    free(bias);
    free(xf);
    free(xabs);
    free(wabs);
    free(c.babs);
    free(c.ref);
    free(c.S);
    nb_cuda_matmul_dense_ri_set_split(0);
}

// `steps` dependent launches, each reading the previous one's f16 output
// (m = k), enqueued without a sync; returns the final buffer.
static void chain(uint16_t *host, const void *d_x, const void *d_w, int n, int k, int steps, int pdl,
                  void *ws, size_t ws_bytes) {
    const size_t bb = (size_t)n * k * 2;
    void *buf[2];
    CUDA_OK(cudaMalloc(&buf[0], bb));
    CUDA_OK(cudaMalloc(&buf[1], bb));
    cudaStream_t cs;
    CUDA_OK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    nb_cuda_matmul_wq_set_pdl(pdl);
    CUDA_OK(cudaMemcpy(buf[0], d_x, bb, cudaMemcpyDeviceToDevice));
    for (int s = 0; s < steps; s++)
        CHECK(nb_cuda_matmul_dense_ri(buf[(s + 1) & 1], NB_DTYPE_F16, buf[s & 1], d_w, NB_DTYPE_F16, NULL,
                                      NB_DTYPE_F32, n, k, k, ws, ws_bytes, cs) == NB_OK);
    CUDA_OK(cudaStreamSynchronize(cs));
    CUDA_OK(cudaMemcpy(host, buf[steps & 1], bb, cudaMemcpyDeviceToHost));
    nb_cuda_matmul_wq_set_pdl(-1);
    cudaStreamDestroy(cs);
    cudaFree(buf[0]);
    cudaFree(buf[1]);
}

static void check_chain_and_errors(void) {
    const int k = 2048, n = 40;
    const size_t mk = (size_t)k * k, nk = (size_t)n * k;
    uint16_t *w = (uint16_t *)malloc(mk * 2), *x = (uint16_t *)malloc(nk * 2);
    // Entries ~ 1/sqrt(k) keep the chained activations near 1.
    for (size_t e = 0; e < mk; e++) w[e] = nb_f32_to_f16((float)((urand() * 2.0 - 1.0) * 0.038));
    for (size_t e = 0; e < nk; e++) x[e] = nb_f32_to_f16((float)(urand() * 2.0 - 1.0));
    void *d_w, *d_x, *d_ws = NULL, *d_out;
    CUDA_OK(cudaMalloc(&d_w, mk * 2));
    CUDA_OK(cudaMalloc(&d_x, nk * 2 + 16));
    CUDA_OK(cudaMalloc(&d_out, nk * 4));
    CUDA_OK(cudaMemcpy(d_w, w, mk * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_x, x, nk * 2, cudaMemcpyHostToDevice));
    const size_t ws = nb_cuda_matmul_dense_ri_workspace_bytes(n, k, k);
    CHECKF(ws > 0, "k=%d: expected a k split at m = %d", k, k);
    CUDA_OK(cudaMalloc(&d_ws, ws));
    CUDA_OK(cudaMemset(d_ws, 0xff, ws));

    uint16_t *a = (uint16_t *)malloc(nk * 2), *b = (uint16_t *)malloc(nk * 2);
    chain(a, d_x, d_w, n, k, 6, 0, d_ws, ws);
    chain(b, d_x, d_w, n, k, 6, 1, d_ws, ws);
    size_t finite = 0;
    for (size_t e = 0; e < nk; e++) finite += isfinite(nb_load_f32(a, NB_DTYPE_F16, e)) != 0;
    CHECKF(finite == nk, "chain: %zu of %zu outputs not finite", nk - finite, nk);
    CHECKF(memcmp(a, b, nk * 2) == 0, "a 6-launch chain with PDL differs from the chain without");

    // One workspace for launches of several shapes in one stream: each
    // result equals the same launch alone.
    {
        float *alone = (float *)malloc(nk * 4), *mixed = (float *)malloc(nk * 4);
        const int ms[3] = {k, 640, 1152}, nn[3] = {40, 3, 17};
        for (int i = 0; i < 3; i++) {
            CHECK(nb_cuda_matmul_dense_ri_workspace_bytes(nn[i], ms[i], k) <= ws);
            CHECK(nb_cuda_matmul_dense_ri(d_out, NB_DTYPE_F32, d_x, d_w, NB_DTYPE_F16, NULL, NB_DTYPE_F32, nn[i],
                                          ms[i], k, d_ws, ws, 0) == NB_OK);
            CUDA_OK(cudaMemcpy(alone, d_out, (size_t)nn[i] * ms[i] * 4, cudaMemcpyDeviceToHost));
            // the other two shapes back to back, then this one again
            for (int j = 1; j <= 3; j++)
                CHECK(nb_cuda_matmul_dense_ri(d_out, NB_DTYPE_F32, d_x, d_w, NB_DTYPE_F16, NULL, NB_DTYPE_F32,
                                              nn[(i + j) % 3], ms[(i + j) % 3], k, d_ws, ws, 0) == NB_OK);
            CUDA_OK(cudaMemcpy(mixed, d_out, (size_t)nn[i] * ms[i] * 4, cudaMemcpyDeviceToHost));
            CHECKF(memcmp(alone, mixed, (size_t)nn[i] * ms[i] * 4) == 0,
                   "shared workspace: m=%d n=%d differs after other shapes", ms[i], nn[i]);
        }
        free(alone);
        free(mixed);
    }

    // Refusals, before any launch.
    const uint8_t *xb = (const uint8_t *)d_x;
    CHECK(nb_cuda_matmul_dense_ri(d_out, NB_DTYPE_F32, d_x, d_w, NB_DTYPE_F32, NULL, NB_DTYPE_F32, n, k, k,
                                  d_ws, ws, 0) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri(d_out, NB_DTYPE_F32, d_x, d_w, NB_DTYPE_F16, NULL, NB_DTYPE_F32, n, k, k - 32,
                                  d_ws, ws, 0) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri(d_out, NB_DTYPE_F32, xb + 2, d_w, NB_DTYPE_F16, NULL, NB_DTYPE_F32, n, k, k,
                                  d_ws, ws, 0) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri(d_out, NB_DTYPE_F32, d_x, d_w, NB_DTYPE_F16, NULL, NB_DTYPE_F32, n, k, k,
                                  NULL, 0, 0) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri(d_out, NB_DTYPE_F32, d_x, d_w, NB_DTYPE_F16, NULL, NB_DTYPE_F32, n, k, k,
                                  d_ws, ws - 4, 0) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri(d_out, NB_DTYPE_F32, d_x, d_w, NB_DTYPE_F16, NULL, NB_DTYPE_F32, n, k, k,
                                  (uint8_t *)d_ws + 4, ws - 4, 0) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri(NULL, NB_DTYPE_F32, d_x, d_w, NB_DTYPE_F16, NULL, NB_DTYPE_F32, n, k, k, d_ws,
                                  ws, 0) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri(d_out, NB_DTYPE_F32, d_x, d_w, NB_DTYPE_F16, NULL, NB_DTYPE_F32, -1, k, k,
                                  d_ws, ws, 0) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri(d_out, NB_DTYPE_F32, d_x, d_w, NB_DTYPE_F16, NULL, NB_DTYPE_F32, 0, k, k,
                                  NULL, 0, 0) == NB_OK);
    CHECK(nb_cuda_matmul_dense_ri_supported(NB_DTYPE_BF16, 4096) == 1);
    CHECK(nb_cuda_matmul_dense_ri_supported(NB_DTYPE_F16, 4000) == 0);
    CHECK(nb_cuda_matmul_dense_ri_supported(NB_DTYPE_F32, 4096) == 0);
    CHECK(nb_cuda_matmul_dense_ri_workspace_bytes(n, k, 100) == 0);
    CUDA_OK(cudaGetLastError());
    free(w);
    free(x);
    free(a);
    free(b);
    cudaFree(d_w);
    cudaFree(d_x);
    cudaFree(d_ws);
    cudaFree(d_out);
}

// The norm scale of the _rs forms on the host, in their order: row i's
// np partial sums added in order, then 1 / sqrt(sum / k + eps).
static float rs_factor(const float *part, int np, int k, float eps) {
    float a = part[0];
    for (int b = 1; b < np; b++) a = a + part[b];
    const float ms = a / (float)k;
    return 1.0f / sqrtf(ms + eps);
}
// Random partial sums for nmax rows of a norm over k channels (r_i in ~[0.5,
// 2]), uploaded; their factors into r.
static float *rs_parts(int nmax, int k, float eps, float *r) {
    const int np = nb_cuda_dr_parts(k);
    const size_t cnt = (size_t)nmax * np;
    float *h = (float *)malloc(cnt * sizeof(float));
    for (int i = 0; i < nmax; i++) {
        const double ms = 0.25 + urand() * 3.75;
        for (int b = 0; b < np; b++) h[(size_t)i * np + b] = (float)(ms * k / np * (0.5 + urand()));
        r[i] = rs_factor(h + (size_t)i * np, np, k, eps);
    }
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, cnt * sizeof(float)));
    CUDA_OK(cudaMemcpy(d, h, cnt * sizeof(float), cudaMemcpyHostToDevice));
    free(h);
    return (float *)d;
}
static const float kEps = 1e-5f;

// The SwiGLU form (nb_cuda_matmul_dense_ri_swiglu) on gate|up in the
// SwiGLU row layout against the plain form on the model-order matrix
// followed by nb_cuda_silu_mul_cvt, byte for byte: outputs f32, f16,
// saturating f16 and bf16, n = 1..64, the k splits given (S == 1: stored
// from the accumulators; S > 1: the reduction kernel). Row 3 of x is
// scaled so that its products overflow f16 (saturating vs Inf). Also the
// plain form on the moved matrix followed by nb_cuda_silu_mul_cvt_moved
// (what the engine's other passes do with a moved copy): the same bytes.
// rs: the norm-scaled form (nb_cuda_matmul_dense_ri_swiglu_rs), against the
// plain form's rows scaled by each row's factor on the host (S == 1: the
// scale in the accumulators; S > 1: in the reduction).
static void check_swiglu(nb_dtype dt, int I, int k, int split, bool rs = false) {
    nb_cuda_matmul_dense_ri_set_split(split);
    const int m = 2 * I, n_max = 64;
    const size_t es = nb_dtype_size(dt), mk = (size_t)m * k, nk = (size_t)n_max * k;
    uint16_t *w = (uint16_t *)malloc(mk * 2), *wm = (uint16_t *)malloc(mk * 2), *x = (uint16_t *)malloc(nk * 2);
    for (size_t e = 0; e < mk; e++) {
        const float v = (float)((urand() * 2.0 - 1.0) * 0.05);
        w[e] = dt == NB_DTYPE_F16 ? nb_f32_to_f16(v) : nb_f32_to_bf16(v);
    }
    for (int j = 0; j < I; j++)
        for (int up = 0; up < 2; up++)
            memcpy(wm + (size_t)nb_cuda_wq_swiglu_row(j, up) * k, w + ((size_t)up * I + j) * k, (size_t)k * 2);
    for (size_t e = 0; e < nk; e++) {
        const float v = (float)((urand() * 2.0 - 1.0) * (e / k == 3 ? 1000.0 : 2.0));
        x[e] = dt == NB_DTYPE_F16 ? nb_f32_to_f16(v) : nb_f32_to_bf16(v);
    }
    void *d_w, *d_wm, *d_x, *d_gu, *d_ref, *d_out, *d_ws = NULL;
    const size_t obytes = (size_t)n_max * I * 4;
    CUDA_OK(cudaMalloc(&d_w, mk * es));
    CUDA_OK(cudaMalloc(&d_wm, mk * es));
    CUDA_OK(cudaMalloc(&d_x, nk * es));
    CUDA_OK(cudaMalloc(&d_gu, (size_t)n_max * m * 4));
    CUDA_OK(cudaMalloc(&d_ref, obytes));
    CUDA_OK(cudaMalloc(&d_out, obytes));
    CUDA_OK(cudaMemcpy(d_w, w, mk * es, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_wm, wm, mk * es, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_x, x, nk * es, cudaMemcpyHostToDevice));
    const size_t ws = nb_cuda_matmul_dense_ri_workspace_bytes(n_max, m, k);
    const int S = nb_cuda_matmul_dense_ri_split(m, k);
    if (ws) {
        CUDA_OK(cudaMalloc(&d_ws, ws));
        CUDA_OK(cudaMemset(d_ws, 0xff, ws));
    }
    uint8_t *ref = (uint8_t *)malloc(obytes), *got = (uint8_t *)malloc(obytes);
    float rf[64];
    float *d_part = rs ? rs_parts(n_max, k, kEps, rf) : NULL;
    const struct {
        nb_dtype dt;
        int sat;
    } outs[4] = {{NB_DTYPE_F32, 0}, {NB_DTYPE_F16, 0}, {NB_DTYPE_F16, 1}, {NB_DTYPE_BF16, 0}};
    const int ns[] = {1, 2, 5, 8, 9, 16, 17, 33, 40, 64};
    long checked = 0, sat_seen = 0;
    for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++)
        for (int io = 0; io < 4; io++) {
            const int n = ns[in];
            const nb_dtype odt = outs[io].dt;
            const size_t ob = (size_t)n * I * nb_dtype_size(odt);
            char what[160];
            snprintf(what, sizeof what, "swiglu%s %s I=%d k=%d S=%d n=%d out=%s%s", rs ? "_rs" : "", nb_dtype_name(dt),
                     I, k, S, n, nb_dtype_name(odt), outs[io].sat ? " (saturating)" : "");
            // Unfused: model-order gate|up rows (scaled by r), then SwiGLU.
            CUDA_OK(cudaMemset(d_ref, 0xff, obytes));
            CHECK(nb_cuda_matmul_dense_ri(d_gu, NB_DTYPE_F32, d_x, d_w, dt, NULL, NB_DTYPE_F32, n, m, k, d_ws, ws,
                                          0) == NB_OK);
            if (rs) CUDA_OK(lt_scale_rows((float *)d_gu, n, m, rf, NULL));
            const nb_cuda_cvt cv = {odt == NB_DTYPE_F32 ? NULL : d_ref, odt, outs[io].sat};
            CHECK(nb_cuda_silu_mul_cvt(odt == NB_DTYPE_F32 ? (float *)d_ref : NULL, cv, (const float *)d_gu,
                                       (const float *)d_gu + I, m, n, I, 0) == NB_OK);
            CUDA_OK(cudaMemcpy(ref, d_ref, obytes, cudaMemcpyDeviceToHost));
            // Fused, on the moved matrix.
            CUDA_OK(cudaMemset(d_out, 0xff, obytes));
            const nb_status st =
                rs ? nb_cuda_matmul_dense_ri_swiglu_rs(d_out, odt, outs[io].sat, d_x, d_wm, dt, n, m, k, d_ws, ws,
                                                       d_part, kEps, 0)
                   : nb_cuda_matmul_dense_ri_swiglu(d_out, odt, outs[io].sat, d_x, d_wm, dt, n, m, k, d_ws, ws, 0);
            CHECKF(st == NB_OK, "%s: %s", what, nb_status_str(st));
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(got, d_out, obytes, cudaMemcpyDeviceToHost));
            CHECKF(memcmp(got, ref, obytes) == 0, "%s: not the bytes of matmul + SwiGLU (or wrote past n rows)",
                   what);
            if (rs) { // (the rest holds for the unscaled form)
                checked += (long)ob;
                continue;
            }
            // Plain form on the moved matrix, then the moved SwiGLU.
            CUDA_OK(cudaMemset(d_out, 0xff, obytes));
            CHECK(nb_cuda_matmul_dense_ri(d_gu, NB_DTYPE_F32, d_x, d_wm, dt, NULL, NB_DTYPE_F32, n, m, k, d_ws, ws,
                                          0) == NB_OK);
            const nb_cuda_cvt cm = {odt == NB_DTYPE_F32 ? NULL : d_out, odt, outs[io].sat};
            CHECK(nb_cuda_silu_mul_cvt_moved(odt == NB_DTYPE_F32 ? (float *)d_out : NULL, cm, (const float *)d_gu,
                                             n, I, 0) == NB_OK);
            CUDA_OK(cudaMemcpy(got, d_out, obytes, cudaMemcpyDeviceToHost));
            CHECKF(memcmp(got, ref, obytes) == 0, "%s: moved matmul + moved SwiGLU differ", what);
            if (odt == NB_DTYPE_F16 && n > 3)
                for (int j = 0; j < I; j++) {
                    const uint16_t h = ((const uint16_t *)ref)[(size_t)3 * I + j] & 0x7fff;
                    sat_seen += outs[io].sat ? h == 0x7bff : h == 0x7c00;
                }
            checked += (long)ob;
        }
    CHECKF(rs || sat_seen > 0, "swiglu %s I=%d: row 3 never reached the f16 range's end", nb_dtype_name(dt), I);
    if (rs) {
        CHECK(nb_cuda_matmul_dense_ri_swiglu_rs(d_out, NB_DTYPE_F16, 0, d_x, d_wm, dt, 1, m, k, d_ws, ws, NULL, kEps,
                                                0) == NB_ERR_INVALID_ARG);
        printf("  swiglu_rs %-4s I=%-5d k=%-5d S=%-2d %ld output bytes == matmul, the norm scale, SwiGLU\n",
               nb_dtype_name(dt), I, k, S, checked);
    } else
        printf("  swiglu %-4s I=%-5d k=%-5d S=%-2d %ld output bytes == matmul + SwiGLU (%ld f16 outputs at the "
               "range's end)\n",
               nb_dtype_name(dt), I, k, S, checked, sat_seen);
    fflush(stdout);
    free(w);
    free(wm);
    free(x);
    free(ref);
    free(got);
    cudaFree(d_w);
    cudaFree(d_wm);
    cudaFree(d_x);
    cudaFree(d_gu);
    cudaFree(d_ref);
    cudaFree(d_out);
    cudaFree(d_ws);
    cudaFree(d_part);
    nb_cuda_matmul_dense_ri_set_split(0);
}

// The RoPE form (nb_cuda_matmul_dense_ri_rope) on model-order q|k|v
// against the plain form (f32 rows) + nb_cuda_rope_write_kv: q and every
// byte of the FP pool (poisoned alike; the last row of a call of several
// has its block outside the pool), with and without a bias, for the k
// splits given (S == 1 included: the form then still goes through its
// reduction) and n = 1..64. The (cos, sin) table is nb_cuda_rope_table's
// (held to cosf/sinf in test_linear_cuda). rs: the norm-scaled form
// (nb_cuda_matmul_dense_ri_rope_rs) against the plain form's sums scaled
// by each row's factor, then the bias, on the host.
static void check_rope(nb_dtype dt, int nh, int nkv, int D, int k, nb_dtype cdt, int split, bool rs = false) {
    nb_cuda_matmul_dense_ri_set_split(split);
    const int Hq = nh * D, Hkv = nkv * D, m = Hq + 2 * Hkv, nmax = 64;
    const size_t es = nb_dtype_size(dt), mk = (size_t)m * k, nk = (size_t)nmax * k;
    uint16_t *w = (uint16_t *)malloc(mk * 2), *x = (uint16_t *)malloc(nk * 2), *bias = (uint16_t *)malloc(m * 2);
    for (size_t e = 0; e < mk; e++) nb_store_f32(w, dt, e, (float)((urand() * 2.0 - 1.0) * 0.05));
    for (size_t e = 0; e < nk; e++) nb_store_f32(x, dt, e, (float)((urand() * 2.0 - 1.0) * 2.0));
    for (int j = 0; j < m; j++) nb_store_f32(bias, NB_DTYPE_BF16, j, (float)(urand() * 2.0 - 1.0));
    const nb_kv_layout lay = {2, nkv, D, 16, cdt, 0, 6};
    const int layer = 1, slots = lay.n_fpblocks * lay.group_size;
    CHECK(nmax <= slots);
    int32_t fb[64], sl[64], pos[64], perm[96];
    for (int i = 0; i < slots; i++) perm[i] = i;
    for (int i = slots - 1; i > 0; i--) {
        const int j = (int)(urand() * (i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int i = 0; i < nmax; i++) fb[i] = perm[i] / 16, sl[i] = perm[i] % 16, pos[i] = (int32_t)(urand() * 131072);
    const int32_t out_of_pool = lay.n_fpblocks;
    float inv[256];
    CHECK(D / 2 <= 256 && nb_ref_rope_inv_freq(inv, D, 500000.0f, NULL) == NB_OK);
    const size_t pool_bytes = nb_kv_fp_bytes(&lay), qb = (size_t)nmax * Hq * 4;
    void *d_w, *d_x, *d_bias, *d_inv, *d_cs, *d_qkv, *d_qa, *d_qf, *d_pa, *d_pf, *d_ws = NULL;
    int32_t *d_fb, *d_sl, *d_pos;
    CUDA_OK(cudaMalloc(&d_w, mk * es));
    CUDA_OK(cudaMalloc(&d_x, nk * es));
    CUDA_OK(cudaMalloc(&d_bias, (size_t)m * 2));
    CUDA_OK(cudaMalloc(&d_inv, sizeof(float) * D / 2));
    CUDA_OK(cudaMalloc(&d_cs, sizeof(float) * nmax * D));
    CUDA_OK(cudaMalloc(&d_qkv, (size_t)nmax * m * 4));
    CUDA_OK(cudaMalloc(&d_qa, qb));
    CUDA_OK(cudaMalloc(&d_qf, qb));
    CUDA_OK(cudaMalloc(&d_pa, pool_bytes));
    CUDA_OK(cudaMalloc(&d_pf, pool_bytes));
    CUDA_OK(cudaMalloc(&d_fb, 4 * nmax));
    CUDA_OK(cudaMalloc(&d_sl, 4 * nmax));
    CUDA_OK(cudaMalloc(&d_pos, 4 * nmax));
    CUDA_OK(cudaMemcpy(d_w, w, mk * es, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_x, x, nk * es, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_bias, bias, (size_t)m * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_inv, inv, sizeof(float) * D / 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_sl, sl, 4 * nmax, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_pos, pos, 4 * nmax, cudaMemcpyHostToDevice));
    CHECK(nb_cuda_rope_table((float *)d_cs, d_pos, nmax, D, (const float *)d_inv, 0) == NB_OK);
    const size_t ws = nb_cuda_matmul_dense_ri_rope_workspace_bytes(nmax, m, k);
    const int S = nb_cuda_matmul_dense_ri_split(m, k);
    CHECKF(ws == (size_t)S * nmax * m * 4, "rope workspace %zu bytes for S=%d", ws, S);
    CUDA_OK(cudaMalloc(&d_ws, ws));
    CUDA_OK(cudaMemset(d_ws, 0xff, ws));
    uint8_t *ha = (uint8_t *)malloc(pool_bytes > qb ? pool_bytes : qb);
    uint8_t *hf = (uint8_t *)malloc(pool_bytes > qb ? pool_bytes : qb);
    float rf[64];
    float *d_part = rs ? rs_parts(nmax, k, kEps, rf) : NULL;
    const int ns[] = {1, 2, 5, 8, 9, 17, 40, 64};
    long checked = 0;
    for (int wb = 0; wb < 2; wb++)
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
            const int n = ns[in];
            const void *b = wb ? d_bias : NULL;
            CUDA_OK(cudaMemcpy(d_fb, fb, 4 * nmax, cudaMemcpyHostToDevice));
            if (n > 1) CUDA_OK(cudaMemcpy(d_fb + (n - 1), &out_of_pool, 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemset(d_qa, 0xff, qb));
            CUDA_OK(cudaMemset(d_qf, 0xff, qb));
            CUDA_OK(cudaMemset(d_pa, 0xa5, pool_bytes));
            CUDA_OK(cudaMemset(d_pf, 0xa5, pool_bytes));
            CHECK(nb_cuda_matmul_dense_ri(d_qkv, NB_DTYPE_F32, d_x, d_w, dt, rs ? NULL : b, NB_DTYPE_BF16, n, m, k, d_ws,
                                          ws, 0) == NB_OK);
            if (rs) CUDA_OK(lt_scale_rows((float *)d_qkv, n, m, rf, wb ? bias : NULL));
            const float *qkv = (const float *)d_qkv;
            CHECK(nb_cuda_rope_write_kv((float *)d_qa, qkv, m, qkv + Hq, qkv + Hq + Hkv, m, d_pos, n, nh,
                                        (const float *)d_inv, &lay, d_pa, layer, d_fb, d_sl, 0) == NB_OK);
            const nb_cuda_wq_rope rp = {(float *)d_qf, (const float *)d_cs, d_pf, d_fb, d_sl, lay, layer, nh};
            const nb_status st =
                rs ? nb_cuda_matmul_dense_ri_rope_rs(d_x, d_w, dt, b, NB_DTYPE_BF16, n, m, k, d_ws, ws, &rp, d_part, kEps,
                                                     0)
                   : nb_cuda_matmul_dense_ri_rope(d_x, d_w, dt, b, NB_DTYPE_BF16, n, m, k, d_ws, ws, &rp, 0);
            CHECKF(st == NB_OK, "dense_ri_rope: %s", nb_status_str(st));
            bool q_same = false;
            long diff = 0, written = 0;
            CUDA_OK(lt_rope_compare(d_qa, d_qf, qb, d_pa, d_pf, pool_bytes, ha, hf, &q_same, &diff, &written));
            CHECKF(q_same && diff == 0 && written > 0,
                   "rope%s %s nh=%d nkv=%d D=%d k=%d S=%d cache=%s n=%d bias=%d: differs from matmul + RoPE/KV write "
                   "(q %s, %ld pool bytes differ, %ld written)",
                   rs ? "_rs" : "", nb_dtype_name(dt), nh, nkv, D, k, S, nb_dtype_name(cdt), n, wb,
                   q_same ? "same" : "differs", diff, written);
            checked += (long)n * m;
        }
    printf("  rope%s %-4s nh=%d nkv=%d D=%d k=%d S=%d cache=%s: %ld q|k|v outputs stored as matmul%s + RoPE/KV write\n",
           rs ? "_rs" : "", nb_dtype_name(dt), nh, nkv, D, k, S, nb_dtype_name(cdt), checked,
           rs ? ", the norm scale, the bias" : "");
    // Refusals.
    nb_cuda_wq_rope rp = {(float *)d_qf, (const float *)d_cs, d_pf, d_fb, d_sl, lay, layer, nh};
    if (rs)
        CHECK(nb_cuda_matmul_dense_ri_rope_rs(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m, k, d_ws, ws, &rp, NULL, kEps,
                                              0) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri_rope(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m - D, k, d_ws, ws, &rp, 0) ==
          NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri_rope(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m, k, d_ws, ws, NULL, 0) ==
          NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri_rope(d_x, d_w, dt, NULL, NB_DTYPE_F32, 2, m, k, d_ws, (size_t)S * m * 4, &rp,
                                       0) == NB_ERR_INVALID_ARG); // the workspace holds one row
    CHECK(nb_cuda_matmul_dense_ri_rope(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m, k, NULL, 0, &rp, 0) ==
          NB_ERR_INVALID_ARG);
    rp.layer = 2;
    CHECK(nb_cuda_matmul_dense_ri_rope(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m, k, d_ws, ws, &rp, 0) ==
          NB_ERR_INVALID_ARG);
    rp.layer = layer;
    rp.cs = (const float *)d_cs + 1;
    CHECK(nb_cuda_matmul_dense_ri_rope(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m, k, d_ws, ws, &rp, 0) ==
          NB_ERR_INVALID_ARG);
    rp.cs = (const float *)d_cs;
    rp.q_out = (float *)d_ws; // overlapping the partial sums it reads
    CHECK(nb_cuda_matmul_dense_ri_rope(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m, k, d_ws, ws, &rp, 0) ==
          NB_ERR_INVALID_ARG);
    rp.q_out = (float *)d_qf;
    CHECK(nb_cuda_matmul_dense_ri_rope(d_x, d_w, NB_DTYPE_F32, NULL, NB_DTYPE_F32, 1, m, k, d_ws, ws, &rp, 0) ==
          NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri_rope(d_x, d_w, dt, NULL, NB_DTYPE_F32, 0, m, k, NULL, 0, &rp, 0) == NB_OK);
    CUDA_OK(cudaDeviceSynchronize());
    void *dfree[] = {d_w, d_x, d_bias, d_inv, d_cs, d_qkv, d_qa, d_qf, d_pa, d_pf, d_ws, d_fb, d_sl, d_pos};
    if (d_part) CUDA_OK(cudaFree(d_part));
    for (void *d : dfree) CUDA_OK(cudaFree(d));
    free(w);
    free(x);
    free(bias);
    free(ha);
    free(hf);
    nb_cuda_matmul_dense_ri_set_split(0);
}

// The residual form (nb_cuda_matmul_dense_ri_res) against the plain form's
// f32 outputs (the same bits by contract), with and without a bias: the new
// x must be x0 + out bit for bit (nb_cuda_add's rounding), xs the f16
// (saturating: one norm weight makes its channel overflow) or bf16 of x * w
// bit for bit, each partial sum the host's sum of its 1,024 columns' x^2 in
// the kernel's order bit for bit (and within 2^-15 of sum(x^2) in double
// over the row), and rows past n untouched, n = 1..130 (past 64 rows: two
// block rows of the matmul). Then the refusals.
static void check_res(nb_dtype dt, int m, int k, int split) {
    nb_cuda_matmul_dense_ri_set_split(split);
    const int nmax = NMAX, np = nb_cuda_dr_parts(m);
    const size_t es = nb_dtype_size(dt), mk = (size_t)m * k, nk = (size_t)nmax * k, nm = (size_t)nmax * m,
                 pn = (size_t)nmax * np;
    uint16_t *w = (uint16_t *)malloc(mk * 2), *x = (uint16_t *)malloc(nk * 2), *bias = (uint16_t *)malloc(m * 2),
             *wn = (uint16_t *)malloc(m * 2), *hxs = (uint16_t *)malloc(nm * 2);
    float *x0 = (float *)malloc(nm * 4), *out = (float *)malloc(nm * 4), *hx = (float *)malloc(nm * 4),
          *hp = (float *)malloc(pn * 4);
    for (size_t e = 0; e < mk; e++) nb_store_f32(w, dt, e, (float)((urand() * 2.0 - 1.0) * 0.05));
    for (size_t e = 0; e < nk; e++) nb_store_f32(x, dt, e, (float)((urand() * 2.0 - 1.0) * 2.0));
    for (int j = 0; j < m; j++) nb_store_f32(bias, NB_DTYPE_BF16, j, (float)(urand() * 2.0 - 1.0));
    for (int j = 0; j < m; j++) nb_store_f32(wn, NB_DTYPE_BF16, j, (float)(0.2 + urand()));
    nb_store_f32(wn, NB_DTYPE_BF16, 3, 30000.0f); // its channel overflows f16
    for (size_t e = 0; e < nm; e++) x0[e] = (float)(40.0 * urand() - 20.0);
    void *d_w, *d_x, *d_bias, *d_wn, *d_out, *d_h, *d_xs, *d_p, *d_ws;
    CUDA_OK(cudaMalloc(&d_w, mk * es));
    CUDA_OK(cudaMalloc(&d_x, nk * es));
    CUDA_OK(cudaMalloc(&d_bias, (size_t)m * 2));
    CUDA_OK(cudaMalloc(&d_wn, (size_t)m * 2));
    CUDA_OK(cudaMalloc(&d_out, nm * 4));
    CUDA_OK(cudaMalloc(&d_h, nm * 4));
    CUDA_OK(cudaMalloc(&d_xs, nm * es));
    CUDA_OK(cudaMalloc(&d_p, pn * 4));
    CUDA_OK(cudaMemcpy(d_w, w, mk * es, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_x, x, nk * es, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_bias, bias, (size_t)m * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_wn, wn, (size_t)m * 2, cudaMemcpyHostToDevice));
    const size_t ws = nb_cuda_matmul_dense_ri_rope_workspace_bytes(nmax, m, k);
    const int S = nb_cuda_matmul_dense_ri_split(m, k);
    CUDA_OK(cudaMalloc(&d_ws, ws));
    const nb_cuda_dr_res rs = {(float *)d_h, d_wn, NB_DTYPE_BF16, d_xs, (float *)d_p};
    const int ns[] = {1, 2, 5, 8, 9, 17, 33, 64, 65, 130};
    long checked = 0, sat = 0;
    double worst = 0.0;
    for (int wb = 0; wb < 2; wb++)
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
            const int n = ns[in];
            const void *b = wb ? d_bias : NULL;
            CUDA_OK(cudaMemset(d_ws, 0xff, ws));
            CHECK(nb_cuda_matmul_dense_ri(d_out, NB_DTYPE_F32, d_x, d_w, dt, b, NB_DTYPE_BF16, n, m, k, d_ws, ws, 0) ==
                  NB_OK);
            CUDA_OK(cudaMemcpy(d_h, x0, nm * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemset(d_xs, 0xff, nm * es));
            CUDA_OK(cudaMemset(d_p, 0xff, pn * 4));
            const nb_status st = nb_cuda_matmul_dense_ri_res(d_x, d_w, dt, b, NB_DTYPE_BF16, n, m, k, d_ws, ws, &rs, 0);
            CHECKF(st == NB_OK, "dense_ri_res: %s", nb_status_str(st));
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(out, d_out, nm * 4, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(hx, d_h, nm * 4, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(hxs, d_xs, nm * es, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(hp, d_p, pn * 4, cudaMemcpyDeviceToHost));
            long bad = 0, bad_xs = 0, past = 0, bad_p = 0;
            lt_res_check(nm, (size_t)n * m, m, x0, out, hx, hxs, wn, dt, &bad, &bad_xs, &past, &sat);
            for (size_t e = (size_t)n * np; e < pn; e++) past += nb_f32_bits(hp[e]) != 0xffffffffu;
            for (int i = 0; i < n; i++) {
                const float *hr = hx + (size_t)i * m;
                double sr = 0.0, sp = 0.0;
                for (int j = 0; j < m; j++) sr += (double)hr[j] * hr[j];
                for (int bb = 0; bb < np; bb++) {
                    float wsum[8];
                    for (int wp = 0; wp < 8; wp++) {
                        float a[32], t[32];
                        for (int l = 0; l < 32; l++) {
                            const int c = bb * NB_CUDA_DR_PART_COLS + (wp * 32 + l) * 4;
                            float ss = 0.0f;
                            for (int q = 0; q < 4 && c < m; q++) ss = ss + hr[c + q] * hr[c + q];
                            a[l] = ss;
                        }
                        for (int o = 16; o > 0; o >>= 1) {
                            for (int l = 0; l < 32; l++) t[l] = a[l] + a[l ^ o];
                            memcpy(a, t, sizeof a);
                        }
                        wsum[wp] = a[0];
                    }
                    float want = wsum[0];
                    for (int wp = 1; wp < 8; wp++) want = want + wsum[wp];
                    const float got = hp[(size_t)i * np + bb];
                    bad_p += memcmp(&got, &want, 4) != 0;
                    sp += got;
                }
                const double rel = fabs(sp - sr) / sr;
                bad_p += !(rel <= 0x1p-15);
                if (rel > worst) worst = rel;
            }
            CHECKF(bad == 0 && bad_xs == 0 && past == 0 && bad_p == 0,
                   "res %s %dx%d S=%d n=%d bias=%d: %ld x, %ld xs differ from x0 + matmul; %ld past n rows; %ld "
                   "partial-sum faults",
                   nb_dtype_name(dt), m, k, S, n, wb, bad, bad_xs, past, bad_p);
            checked += (long)n * m;
        }
    CHECKF(dt != NB_DTYPE_F16 || sat > 0, "res %dx%d: no xs saturated", m, k);
    printf("  res  %-4s %dx%d S=%d: %ld outputs == x0 + matmul, x * w and the partial sums bit for bit (%ld f16 "
           "saturated; partials within %.2e of sum(x^2))\n",
           nb_dtype_name(dt), m, k, S, checked, sat, worst);
    // Refusals, before anything is launched.
    nb_cuda_dr_res bad = rs;
    CHECK(nb_cuda_matmul_dense_ri_res(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m, k, d_ws, ws, NULL, 0) ==
          NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri_res(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m - 2, k, d_ws, ws, &rs, 0) ==
          NB_ERR_UNSUPPORTED); // m % 4
    CHECK(nb_cuda_matmul_dense_ri_res(d_x, d_w, NB_DTYPE_F32, NULL, NB_DTYPE_F32, 1, m, k, d_ws, ws, &rs, 0) ==
          NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri_res(d_x, d_w, dt, NULL, NB_DTYPE_F32, 2, m, k, d_ws, (size_t)S * m * 4, &rs, 0) ==
          NB_ERR_INVALID_ARG); // the workspace holds one row
    bad.x = (float *)d_h + 1;  // misaligned
    CHECK(nb_cuda_matmul_dense_ri_res(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m, k, d_ws, ws, &bad, 0) ==
          NB_ERR_INVALID_ARG);
    bad = rs;
    bad.xs = d_x; // over the input
    CHECK(nb_cuda_matmul_dense_ri_res(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m, k, d_ws, ws, &bad, 0) ==
          NB_ERR_INVALID_ARG);
    bad = rs;
    bad.part = (float *)d_ws; // over the workspace
    CHECK(nb_cuda_matmul_dense_ri_res(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m, k, d_ws, ws, &bad, 0) ==
          NB_ERR_INVALID_ARG);
    bad = rs;
    bad.w_dt = (nb_dtype)7;
    CHECK(nb_cuda_matmul_dense_ri_res(d_x, d_w, dt, NULL, NB_DTYPE_F32, 1, m, k, d_ws, ws, &bad, 0) ==
          NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri_res(d_x, d_w, dt, NULL, NB_DTYPE_F32, 0, m, k, NULL, 0, &rs, 0) == NB_OK);
    CUDA_OK(cudaDeviceSynchronize());
    void *dfree[] = {d_w, d_x, d_bias, d_wn, d_out, d_h, d_xs, d_p, d_ws};
    for (void *d : dfree) CUDA_OK(cudaFree(d));
    free(w);
    free(x);
    free(bias);
    free(wn);
    free(hxs);
    free(x0);
    free(out);
    free(hx);
    free(hp);
    nb_cuda_matmul_dense_ri_set_split(0);
}

// The SwiGLU form's refusals.
static void check_swiglu_errors(void) {
    const int I = 64, k = 256, m = 2 * I, n = 4;
    void *d_w, *d_x, *d_out, *d_ws;
    CUDA_OK(cudaMalloc(&d_w, (size_t)m * k * 2));
    CUDA_OK(cudaMalloc(&d_x, (size_t)n * k * 2 + 16));
    CUDA_OK(cudaMalloc(&d_out, (size_t)n * I * 4));
    const size_t ws = nb_cuda_matmul_dense_ri_workspace_bytes(n, m, k);
    CUDA_OK(cudaMalloc(&d_ws, ws ? ws : 16));
    const uint8_t *xb = (const uint8_t *)d_x;
    CHECK(nb_cuda_matmul_dense_ri_swiglu(d_out, NB_DTYPE_F16, 0, d_x, d_w, NB_DTYPE_F16, n, m - 8, k, d_ws, ws,
                                         0) == NB_ERR_INVALID_ARG); // m % 16
    CHECK(nb_cuda_matmul_dense_ri_swiglu(d_out, NB_DTYPE_BF16, 1, d_x, d_w, NB_DTYPE_F16, n, m, k, d_ws, ws, 0) ==
          NB_ERR_INVALID_ARG); // saturating bf16
    CHECK(nb_cuda_matmul_dense_ri_swiglu(d_out, NB_DTYPE_F16, 0, d_x, d_w, NB_DTYPE_F32, n, m, k, d_ws, ws, 0) ==
          NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri_swiglu(d_out, NB_DTYPE_F16, 0, d_x, d_w, NB_DTYPE_F16, n, m, k - 32, d_ws, ws,
                                         0) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri_swiglu(d_out, NB_DTYPE_F16, 0, xb + 2, d_w, NB_DTYPE_F16, n, m, k, d_ws, ws, 0) ==
          NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri_swiglu(NULL, NB_DTYPE_F16, 0, d_x, d_w, NB_DTYPE_F16, n, m, k, d_ws, ws, 0) ==
          NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri_swiglu(d_out, NB_DTYPE_F16, 0, d_x, d_w, NB_DTYPE_F16, -1, m, k, d_ws, ws, 0) ==
          NB_ERR_INVALID_ARG);
    // out overlapping x: blocks would store while others read x.
    CHECK(nb_cuda_matmul_dense_ri_swiglu((uint8_t *)d_x + 64, NB_DTYPE_F16, 0, d_x, d_w, NB_DTYPE_F16, n, m, k,
                                         d_ws, ws, 0) == NB_ERR_INVALID_ARG);
    if (ws) // a missing or too small workspace where S > 1
        CHECK(nb_cuda_matmul_dense_ri_swiglu(d_out, NB_DTYPE_F16, 0, d_x, d_w, NB_DTYPE_F16, n, m, k, d_ws, ws - 4,
                                             0) == NB_ERR_INVALID_ARG &&
              nb_cuda_matmul_dense_ri_swiglu(d_out, NB_DTYPE_F16, 0, d_x, d_w, NB_DTYPE_F16, n, m, k, NULL, 0, 0) ==
                  NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_dense_ri_swiglu(d_out, NB_DTYPE_F16, 0, d_x, d_w, NB_DTYPE_F16, 0, m, k, NULL, 0, 0) ==
          NB_OK);
    CUDA_OK(cudaGetLastError());
    cudaFree(d_w);
    cudaFree(d_x);
    cudaFree(d_out);
    cudaFree(d_ws);
}

int main(void) {
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("test_dense_ri_cuda: SKIP: no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return NB_TEST_SKIP;
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major < 9) {
        printf("test_dense_ri_cuda: SKIP: the kernels are built for sm_90a only\n");
        return NB_TEST_SKIP;
    }
    printf("test_dense_ri_cuda on %s (%d SMs); tolerance 2^-14*S + u_out*(|ref| + 2^-14*S)\n", prop.name,
           prop.multiProcessorCount);
    const nb_dtype dts[2] = {NB_DTYPE_F16, NB_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        run_shape(dts[d], 4096, 4096, 0);   // the built-in plan: 32 row blocks, k splits
        run_shape(dts[d], 1000, 1408, 0);   // partial last row block; 22 k steps
        run_shape(dts[d], 200, 512, 7);     // forced splits of uneven length (8 k steps / 7)
    }
    run_shape(NB_DTYPE_F16, 1000, 1408, 1);  // no split: stored straight from the accumulators
    run_shape(NB_DTYPE_BF16, 640, 2048, 2);
    run_shape(NB_DTYPE_BF16, 64, 192, 3);    // one partial row block, 3 splits of 1 k step
    check_chain_and_errors();
    for (int d = 0; d < 2; d++) {
        check_swiglu(dts[d], 14336, 4096, 0); // Llama-3-8B gate|up: the built-in plan has S = 1
        check_swiglu(dts[d], 520, 1408, 0);   // a partial row block; the built-in plan splits k
    }
    check_swiglu(NB_DTYPE_BF16, 520, 1408, 1);
    check_swiglu(NB_DTYPE_F16, 64, 512, 8);   // one row block, 8 splits
    check_swiglu_errors();
    check_rope(NB_DTYPE_BF16, 32, 8, 128, 4096, NB_DTYPE_BF16, 0); // Llama-3-8B q|k|v: the built-in plan (S = 5)
    check_rope(NB_DTYPE_F16, 32, 8, 128, 4096, NB_DTYPE_F16, 1);   // S = 1: through the reduction all the same
    check_rope(NB_DTYPE_BF16, 4, 2, 128, 512, NB_DTYPE_F32, 0);    // the proxy model's shape
    check_rope(NB_DTYPE_F16, 8, 2, 64, 256, NB_DTYPE_F16, 3);
    // The norm scaled after the matmul (the target's step passes).
    check_res(NB_DTYPE_F16, 4096, 4096, 0);  // the o projection of Llama shapes: S = 8, 4 column groups
    check_res(NB_DTYPE_BF16, 1000, 1408, 0); // a partial column group
    check_res(NB_DTYPE_BF16, 512, 1408, 1);  // S = 1: through the reduction all the same (the proxy's width)
    check_res(NB_DTYPE_F16, 200, 512, 7);
    check_swiglu(NB_DTYPE_F16, 14336, 4096, 0, true); // S = 1: the scale in the accumulators
    check_swiglu(NB_DTYPE_BF16, 520, 1408, 0, true);  // S > 1: in the reduction
    check_swiglu(NB_DTYPE_BF16, 64, 512, 1, true);
    check_rope(NB_DTYPE_BF16, 32, 8, 128, 4096, NB_DTYPE_BF16, 0, true);
    check_rope(NB_DTYPE_F16, 4, 2, 128, 512, NB_DTYPE_F16, 1, true);
    check_rope(NB_DTYPE_BF16, 8, 2, 64, 1408, NB_DTYPE_BF16, 3, true); // k: a partial column group
    return nb_test_finish("test_dense_ri_cuda");
}
