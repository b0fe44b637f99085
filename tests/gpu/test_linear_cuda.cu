// test_linear_cuda.cu: the CUDA linear layers (kernels/linear_cuda.h)
// against their C twins: nb_cuda_matmul_wq (4-bit and 8-bit views; the
// streaming decode kernel, both tile sizes of the tile kernel and the scalar
// fallback) against nb_ref_matmul_wq, with row invariance across the kernels
// and programmatic-dependent-launch chains checked bit for bit, nb_cuda_matmul_dense against nb_ref_matmul, and
// nb_cuda_wq_dequantize bit for bit against nb_wq_dequantize, and
// nb_cuda_matmul_wq_swiglu bit for bit against nb_cuda_matmul_wq followed by
// nb_cuda_silu_mul_cvt (and within a derived bound of the C references).
//
// Tolerance. x and the weights are exactly representable in f16/bf16 and
// every product the kernels form (x * code, x * 1, x * w) is exact in f32;
// the GPU and the reference differ only in the order of f32 additions (mma
// accumulation vs 8-lane order) and, for f16/bf16 outputs, one final
// rounding. So per output, with S = the sum of the absolute values of every
// term added on the way (sum over groups of |sc|*dot(|x|, C) + |z|*sum|x|,
// or sum |x||w| for dense, + |bias|):
//     |gpu - ref| <= 2^-14 * S + u_out * |ref|
// (u_out: the unit roundoff of the output dtype, one round-to-nearest;
// 2^-14 = 256 f32 ulps of S: far more than any summation order of <= 2^17
// terms loses in practice, yet a single wrong or dropped element of a k=4096
// row moves the result by ~S/k = 2^-12 S and fails; u_out = 0 for f32,
// 2^-11 for f16, 2^-8 for bf16). NaN never passes: outputs are poisoned with
// NaN before each launch.
//
// Dense with an f16/bf16 output rounds twice: cuBLAS rounds the product
// d = x.w to out_dt in its epilogue (the rounding mode is not documented, so
// only a faithful rounding is assumed: |err| < 1 ulp <= 2*u_out*|d|), then
// bias_add_kernel adds the bias in f32 and rounds to nearest (u_out*|ref|).
// The first error scales with |d|, not |ref| = |d + bias|, which is smaller
// when the bias cancels the product (seen on an H100: err/tol 1.0-1.1 under
// the old 2*u_out*|ref|); with |d| <= |ref| + |bias|:
//     |gpu - ref| <= 2^-14 * S + u_out * (3*|ref| + 2*|bias|).
//
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

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand(void) { return lt_urand(&g_rng); } // [0, 1)

// The CUDA layouts as linear_cuda.h states them, written here independently
// of the library's helpers (the oracle the pack and the helpers are checked
// against): byte b of row j's group gi of a plane (ng groups of gb bytes a
// row), and the f16 element of 16-row tile tl, group gi, row rt (0..15) of
// the tile, z = 0 scale / 1 zero, in sz.
static size_t oracle_plane_off(int j, int gi, int b, int ng, int gb) {
    return ((size_t)((j / 32) * ng + gi) * 32 + j % 32) * gb + b;
}
static size_t oracle_sz_off(int tl, int gi, int rt, int z, int ng) {
    return (size_t)(((tl / 2) * ng + gi) * 2 + tl % 2) * 32 + (rt % 8) * 4 + z * 2 + rt / 8;
}

static void *dev_upload(const void *h, size_t bytes) {
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}


typedef struct case_stats {
    double worst;   // largest |err| / tol seen
    long outputs;   // outputs compared
} case_stats;

// Compares rows [0, n) of a device result of dtype odt with ref and bound S.
static void compare(const char *what, const void *d_out, nb_dtype odt, const float *ref,
                    const float *S, int n, int m, float u_mul, const float *babs,
                    case_stats *st) {
    const size_t cnt = (size_t)n * m;
    void *h = malloc(cnt * nb_dtype_size(odt));
    CUDA_OK(cudaMemcpy(h, d_out, cnt * nb_dtype_size(odt), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t e = 0; e < cnt; e++) {
        const float got = nb_load_f32(h, odt, e);
        const double tol = ldexp((double)S[e], -14) + u_mul * lt_out_u(odt) * fabs((double)ref[e]) +
                           (babs ? 2.0 * lt_out_u(odt) * (fabs((double)ref[e]) + babs[e % m]) : 0.0);
        const double err = fabs((double)got - (double)ref[e]);
        if (!(err <= tol)) {
            if (bad < 3)
                fprintf(stderr, "  %s: [%zu][%zu] got %.9g ref %.9g err %.3g tol %.3g\n", what,
                        e / m, e % m, got, ref[e], err, tol);
            bad++;
        } else if (tol > 0 && err / tol > st->worst) {
            st->worst = err / tol;
        }
    }
    CHECKF(bad == 0, "%s: %d of %zu outputs outside tolerance", what, bad, cnt);
    st->outputs += (long)cnt;
    free(h);
}

// A chain of `steps` dependent calls out = x . W^T ping-ponging between two
// buffers (n rows of k = m, in dt), started from x and enqueued without a
// sync, launched with PDL on or off, decode-kernel variant v (n <= 8 and
// the two-x-tile form alike) and grid bps;
// copies the final buffer (n * k elements of dt) to host. Restores the
// launch settings.
static void pdl_chain(void *host_out, const void *d_x, nb_dtype dt, const nb_cuda_wq *w, int view,
                      int n, int m, int k, int steps, int pdl, int v, int bps) {
    const size_t bb = (size_t)n * k * nb_dtype_size(dt);
    void *buf[2];
    CUDA_OK(cudaMalloc(&buf[0], bb));
    CUDA_OK(cudaMalloc(&buf[1], bb));
    cudaStream_t cs;
    CUDA_OK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    nb_cuda_matmul_wq_set_pdl(pdl);
    nb_cuda_matmul_wq_set_gemv_variant(v);
    nb_cuda_matmul_wq_set_gemv16_variant(v);
    nb_cuda_matmul_wq_set_blocks_per_sm(bps);
    CUDA_OK(cudaMemcpy(buf[0], d_x, bb, cudaMemcpyDeviceToDevice));
    CUDA_OK(cudaMemset(buf[1], 0xff, bb));
    for (int step = 0; step < steps; step++)
        CHECK(nb_cuda_matmul_wq(buf[(step + 1) & 1], dt, buf[step & 1], dt, w, view, NULL,
                                NB_DTYPE_F32, n, m, k, NULL, 0, cs) == NB_OK);
    CUDA_OK(cudaStreamSynchronize(cs));
    CUDA_OK(cudaMemcpy(host_out, buf[steps & 1], bb, cudaMemcpyDeviceToHost));
    nb_cuda_matmul_wq_set_pdl(-1);
    nb_cuda_matmul_wq_set_gemv_variant(-1);
    nb_cuda_matmul_wq_set_gemv16_variant(-1);
    nb_cuda_matmul_wq_set_blocks_per_sm(0);
    CUDA_OK(cudaStreamDestroy(cs));
    cudaFree(buf[0]);
    cudaFree(buf[1]);
}

static void run_shape(nb_dtype dt, int m, int k, int nmax, const int *ns, int n_ns) {
    const int gs = nb_wq_group_size(k), ng = k / gs;
    size_t pb = 0, ngt = 0;
    CHECK(nb_wq_sizes(m, k, &pb, &ngt) == NB_OK);
    const size_t mk = (size_t)m * k, nk = (size_t)nmax * k, nm = (size_t)nmax * m;
    const size_t es = nb_dtype_size(dt);

    // Weights: per-row scale and offset so groups have varied ranges and zeros;
    // row 0 starts with a constant group (s == 0).
    uint16_t *w = (uint16_t *)malloc(mk * 2);
    float *wf = (float *)malloc(mk * 4), *wabs = (float *)malloc(mk * 4);
    for (int j = 0; j < m; j++) {
        const double amp = 0.02 + 0.2 * urand(), off = 0.05 * (urand() - 0.5);
        for (int t = 0; t < k; t++) {
            double v = off + amp * (2.0 * urand() - 1.0);
            if (j == 0 && t < gs) v = 0.125;
            nb_store_f32(w, dt, (size_t)j * k + t, (float)v);
        }
    }
    nb_ref_convert_to_f32(wf, w, dt, mk);
    for (size_t e = 0; e < mk; e++) wabs[e] = fabsf(wf[e]);
    uint8_t *up = (uint8_t *)malloc(pb), *lo = (uint8_t *)malloc(pb);
    uint16_t *sc = (uint16_t *)malloc(ngt * 2), *zr = (uint16_t *)malloc(ngt * 2);
    uint16_t *sca = (uint16_t *)malloc(ngt * 2), *zra = (uint16_t *)malloc(ngt * 2);
    CHECK(nb_wq_quantize(w, dt, m, k, up, lo, sc, zr) == NB_OK);
    for (size_t e = 0; e < ngt; e++) {
        sca[e] = sc[e] & 0x7fffu;
        zra[e] = zr[e] & 0x7fffu;
    }
    nb_wq_tensor hw = {up, lo, sc, zr}, hwa = {up, lo, sca, zra};

    // Activations in dt (so the GPU and the reference see the same values).
    uint16_t *x = (uint16_t *)malloc(nk * 2);
    float *xf = (float *)malloc(nk * 4), *xabs = (float *)malloc(nk * 4);
    for (size_t e = 0; e < nk; e++) nb_store_f32(x, dt, e, (float)(4.0 * urand() - 2.0));
    nb_ref_convert_to_f32(xf, x, dt, nk);
    for (size_t e = 0; e < nk; e++) xabs[e] = fabsf(xf[e]);
    // Bias: f32 for f16 runs, in dt for bf16 runs (both bias dtypes covered).
    const nb_dtype bdt = dt == NB_DTYPE_F16 ? NB_DTYPE_F32 : dt;
    void *bias = malloc((size_t)m * 4);
    float *babs = (float *)malloc((size_t)m * 4);
    for (int j = 0; j < m; j++) {
        nb_store_f32(bias, bdt, j, (float)(urand() - 0.5));
        babs[j] = fabsf(nb_load_f32(bias, bdt, j));
    }

    // References for nmax rows; a run with n rows is checked against the
    // first n (rows are independent).
    float *ref[3], *S[3];
    for (int v = 0; v < 3; v++) {
        ref[v] = (float *)malloc(nm * 4);
        S[v] = (float *)malloc(nm * 4);
    }
    nb_ref_matmul_wq(ref[0], xf, &hw, 0, bias, bdt, nmax, m, k);
    nb_ref_matmul_wq(ref[1], xf, &hw, 1, bias, bdt, nmax, m, k);
    nb_ref_matmul(ref[2], xf, w, dt, bias, bdt, nmax, m, k);
    nb_ref_matmul_wq(S[0], xabs, &hwa, 0, babs, NB_DTYPE_F32, nmax, m, k);
    nb_ref_matmul_wq(S[1], xabs, &hwa, 1, babs, NB_DTYPE_F32, nmax, m, k);
    nb_ref_matmul(S[2], xabs, wabs, NB_DTYPE_F32, babs, NB_DTYPE_F32, nmax, m, k);

    // Device copies (planes in the CUDA layout).
    const size_t cpb = nb_cuda_wq_plane_bytes(m, k);
    uint8_t *upk = (uint8_t *)malloc(cpb), *lok = (uint8_t *)malloc(cpb);
    CHECK(cpb >= pb && nb_cuda_wq_pack_plane(upk, up, m, k) == NB_OK);
    CHECK(nb_cuda_wq_pack_plane(lok, lo, m, k) == NB_OK);
    // The padding rows of the last 32-row tile (zeros as packed) get codes:
    // no stored output may depend on them.
    const int gsz = nb_wq_group_size(k), pgb = gsz / 2, png = k / gsz;
    for (int j = m; j < (m + 31) / 32 * 32; j++)
        for (int gi = 0; gi < png; gi++)
            for (int b = 0; b < pgb; b++) {
                const size_t o = oracle_plane_off(j, gi, b, png, pgb);
                upk[o] = (uint8_t)(0xa5 + b);
                lok[o] = (uint8_t)(0x5a + j);
            }
    uint8_t *d_up = (uint8_t *)dev_upload(upk, cpb), *d_lo = (uint8_t *)dev_upload(lok, cpb);
    free(upk);
    free(lok);
    const size_t nsz = nb_cuda_wq_sz_elems(m, k);
    uint16_t *hsz = (uint16_t *)malloc(nsz * 2);
    CHECK(nsz >= 2 * ngt && nb_cuda_wq_pack_sz(hsz, sc, zr, m, k) == NB_OK);
    uint16_t *d_sz = (uint16_t *)dev_upload(hsz, nsz * 2);
    void *d_w = dev_upload(w, mk * es), *d_x = dev_upload(x, nk * es);
    void *d_bias = dev_upload(bias, (size_t)m * nb_dtype_size(bdt));
    void *d_out = NULL, *d_out2 = NULL, *d_xmis = NULL;
    CUDA_OK(cudaMalloc(&d_out, nm * 4));
    CUDA_OK(cudaMalloc(&d_out2, nm * 4));
    CUDA_OK(cudaMalloc(&d_xmis, nk * es + 16));
    uint8_t *d_xm = (uint8_t *)d_xmis + 2; // 2-byte aligned only: the scalar fallback
    CUDA_OK(cudaMemcpy(d_xm, x, nk * es, cudaMemcpyHostToDevice));
    nb_cuda_wq dw = {d_up, d_lo, d_sz};
    nb_cuda_wq dw4 = {d_up, NULL, d_sz}; // draft-only: no lower plane at all
    cublasHandle_t cb;
    CHECK(cublasCreate(&cb) == CUBLAS_STATUS_SUCCESS);

    case_stats st[3] = {{0, 0}, {0, 0}, {0, 0}};
    char what[160];
    for (int in = 0; in < n_ns; in++) {
        const int n = ns[in];
        if (n > nmax) continue;
        const nb_dtype odts[3] = {NB_DTYPE_F32, NB_DTYPE_F16, NB_DTYPE_BF16};
        const int n_odt = (n == 7 || n == 12 || n == 33) ? 3 : 1;
        for (int io = 0; io < n_odt; io++) {
            const nb_dtype odt = odts[io];
            for (int view = 0; view < 2; view++) {
                // The built-in choice (the decode kernel up to n = 16), then
                // the tile kernel with 16- and 32-row tiles for every n.
                for (int tile = 0; tile <= 32; tile += 16) {
                    nb_cuda_matmul_wq_set_tile_rows(tile);
                    nb_cuda_matmul_wq_set_decode_kernel(tile ? 0 : -1);
                    CUDA_OK(cudaMemset(d_out, 0xff, nm * 4));
                    nb_status s = nb_cuda_matmul_wq(d_out, odt, d_x, dt, view ? &dw : &dw4, view,
                                                    d_bias, bdt, n, m, k, NULL, 0, 0);
                    CHECK(s == NB_OK);
                    CUDA_OK(cudaGetLastError());
                    CUDA_OK(cudaDeviceSynchronize());
                    snprintf(what, sizeof what, "wq%d %s m=%d k=%d n=%d out=%s tile=%d",
                             view ? 8 : 4, nb_dtype_name(dt), m, k, n, nb_dtype_name(odt), tile);
                    compare(what, d_out, odt, ref[view], S[view], n, m, 1.0f, NULL, &st[view]);
                }
                nb_cuda_matmul_wq_set_tile_rows(0);
                nb_cuda_matmul_wq_set_decode_kernel(-1);
            }
            if (odt != NB_DTYPE_F32 && odt != dt) {
                // cuBLAS has no mixed f16/bf16 output: refused, not computed.
                CHECK(nb_cuda_matmul_dense(cb, d_out, odt, d_x, d_w, dt, d_bias, bdt, n, m, k,
                                           0) == NB_ERR_INVALID_ARG);
                continue;
            }
            CUDA_OK(cudaMemset(d_out, 0xff, nm * 4));
            CHECK(nb_cuda_matmul_dense(cb, d_out, odt, d_x, d_w, dt, d_bias, bdt, n, m, k, 0) ==
                  NB_OK);
            CUDA_OK(cudaGetLastError());
            CUDA_OK(cudaDeviceSynchronize());
            snprintf(what, sizeof what, "dense %s m=%d k=%d n=%d out=%s", nb_dtype_name(dt), m,
                     k, n, nb_dtype_name(odt));
            compare(what, d_out, odt, ref[2], S[2], n, m, 1.0f, babs, &st[2]);
        }
    }

    // The scalar fallback on the same shape (x not 16-byte aligned).
    for (int view = 0; view < 2; view++) {
        const int n = nmax < 3 ? nmax : 3;
        CUDA_OK(cudaMemset(d_out, 0xff, nm * 4));
        CHECK(nb_cuda_matmul_wq(d_out, NB_DTYPE_F32, d_xm, dt, &dw, view, d_bias, bdt, n, m, k,
                                NULL, 0, 0) == NB_OK);
        CUDA_OK(cudaDeviceSynchronize());
        snprintf(what, sizeof what, "wq%d fallback %s m=%d k=%d n=%d", view ? 8 : 4,
                 nb_dtype_name(dt), m, k, n);
        compare(what, d_out, NB_DTYPE_F32, ref[view], S[view], n, m, 1.0f, NULL, &st[view]);
    }

    // Determinism: the same launch twice gives the same bits.
    {
        const int n = nmax < 16 ? nmax : 16;
        CHECK(nb_cuda_matmul_wq(d_out, NB_DTYPE_F32, d_x, dt, &dw, 1, NULL, bdt, n, m, k, NULL,
                                0, 0) == NB_OK);
        CHECK(nb_cuda_matmul_wq(d_out2, NB_DTYPE_F32, d_x, dt, &dw, 1, NULL, bdt, n, m, k, NULL,
                                0, 0) == NB_OK);
        CUDA_OK(cudaDeviceSynchronize());
        float *a = (float *)malloc((size_t)n * m * 4), *b = (float *)malloc((size_t)n * m * 4);
        CUDA_OK(cudaMemcpy(a, d_out, (size_t)n * m * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(b, d_out2, (size_t)n * m * 4, cudaMemcpyDeviceToHost));
        CHECKF(memcmp(a, b, (size_t)n * m * 4) == 0, "wq8 %s m=%d k=%d: two runs differ",
               nb_dtype_name(dt), m, k);
        free(a);
        free(b);
    }

    // Row invariance: a row of x gets the same bits alone as with up to 15
    // other rows (n <= 8 takes the streaming decode kernel, 9..16 its
    // two-x-tile form, in every variant, and the tile kernel when the decode
    // kernel is off; the engine's verify rows must equal its decode rows),
    // with and without programmatic dependent launch.
    {
        const int nb = nmax < 16 ? nmax : 16;
        const size_t rowb = (size_t)m * 4;
        float *alone = (float *)malloc(nb * rowb), *got = (float *)malloc(nb * rowb);
        const int bns[] = {2, 5, 8, 9, 12, 16};
        for (int view = 0; view < 2; view++) {
            nb_cuda_matmul_wq_set_pdl(0);
            CUDA_OK(cudaMemset(d_out, 0xff, nb * rowb));
            for (int i = 0; i < nb; i++)
                CHECK(nb_cuda_matmul_wq((char *)d_out + i * rowb, NB_DTYPE_F32,
                                        (const char *)d_x + (size_t)i * k * es, dt, &dw, view,
                                        d_bias, bdt, 1, m, k, NULL, 0, 0) == NB_OK);
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(alone, d_out, nb * rowb, cudaMemcpyDeviceToHost));
            for (int pdl = 0; pdl < 2; pdl++) {
                nb_cuda_matmul_wq_set_pdl(pdl);
                for (size_t bi = 0; bi < sizeof bns / sizeof bns[0]; bi++) {
                    const int n = bns[bi];
                    if (n > nb) continue;
                    // n > 8: each two-x-tile variant, then the tile kernel (kc == nv2).
                    const int nv2 = nb_cuda_matmul_wq_set_gemv16_variant(-1);
                    for (int kc = 0; kc <= (n > 8 ? nv2 : 0); kc++) {
                        nb_cuda_matmul_wq_set_gemv16_variant(kc < nv2 ? kc : -1);
                        nb_cuda_matmul_wq_set_decode_kernel(kc < nv2 ? -1 : 0);
                        CUDA_OK(cudaMemset(d_out, 0xff, n * rowb));
                        CHECK(nb_cuda_matmul_wq(d_out, NB_DTYPE_F32, d_x, dt, &dw, view, d_bias,
                                                bdt, n, m, k, NULL, 0, 0) == NB_OK);
                        CUDA_OK(cudaDeviceSynchronize());
                        CUDA_OK(cudaMemcpy(got, d_out, n * rowb, cudaMemcpyDeviceToHost));
                        CHECKF(memcmp(got, alone, n * rowb) == 0,
                               "wq%d %s m=%d k=%d: rows of an n=%d call (%s %d) differ from the "
                               "same rows alone (pdl %d)", view ? 8 : 4, nb_dtype_name(dt), m, k,
                               n, kc < nv2 ? "decode-kernel variant" : "tile kernel", kc, pdl);
                    }
                    nb_cuda_matmul_wq_set_gemv16_variant(-1);
                    nb_cuda_matmul_wq_set_decode_kernel(-1);
                }
            }
        }
        nb_cuda_matmul_wq_set_pdl(-1);
        // Every variant of the decode kernel (ring depth, register budget,
        // items per step, tiles per item; a forced variant takes the decode
        // kernel for every matrix) and grid size gives the rows the same
        // bits as the built-in choice alone, in both views.
        for (int view = 0; view < 2; view++) {
            const nb_cuda_wq *wv = view ? &dw : &dw4;
            nb_cuda_matmul_wq_set_pdl(0);
            CUDA_OK(cudaMemset(d_out, 0xff, nb * rowb));
            for (int i = 0; i < nb; i++)
                CHECK(nb_cuda_matmul_wq((char *)d_out + i * rowb, NB_DTYPE_F32,
                                        (const char *)d_x + (size_t)i * k * es, dt, wv, view,
                                        d_bias, bdt, 1, m, k, NULL, 0, 0) == NB_OK);
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(alone, d_out, nb * rowb, cudaMemcpyDeviceToHost));
            nb_cuda_matmul_wq_set_pdl(-1);
            const int nv = nb_cuda_matmul_wq_set_gemv_variant(-1);
            for (int v = 0; v < nv; v++) {
                nb_cuda_matmul_wq_set_gemv_variant(v);
                for (int bps = 0; bps < 4; bps++) {
                    nb_cuda_matmul_wq_set_blocks_per_sm(bps);
                    const int vns[] = {1, 5, 8};
                    for (int vi = 0; vi < 3; vi++) {
                        const int n = vns[vi] < nb ? vns[vi] : nb;
                        CUDA_OK(cudaMemset(d_out, 0xff, n * rowb));
                        CHECK(nb_cuda_matmul_wq(d_out, NB_DTYPE_F32, d_x, dt, wv, view, d_bias,
                                                bdt, n, m, k, NULL, 0, 0) == NB_OK);
                        CUDA_OK(cudaDeviceSynchronize());
                        CUDA_OK(cudaMemcpy(got, d_out, n * rowb, cudaMemcpyDeviceToHost));
                        CHECKF(memcmp(got, alone, n * rowb) == 0,
                               "wq%d %s m=%d k=%d: decode variant %d (grid %d/SM) n=%d differs "
                               "from the built-in choice alone", view ? 8 : 4, nb_dtype_name(dt),
                               m, k, v, bps, n);
                    }
                }
            }
            nb_cuda_matmul_wq_set_gemv_variant(-1);
            nb_cuda_matmul_wq_set_blocks_per_sm(0);
        }
        free(alone);
        free(got);
    }

    // sz only 8-byte aligned (the decode kernel copies it in 16-byte parts:
    // these calls must take the tile kernel) and only 2-byte aligned (the
    // scalar kernel); both must be right.
    for (int off = 8; off >= 2; off -= 6) {
        char *d_szm = NULL;
        CUDA_OK(cudaMalloc(&d_szm, nsz * 2 + 16));
        CUDA_OK(cudaMemcpy(d_szm + off, hsz, nsz * 2, cudaMemcpyHostToDevice));
        nb_cuda_wq dwm = {d_up, d_lo, (const uint16_t *)(d_szm + off)};
        for (int view = 0; view < 2; view++) {
            const int n = nmax < 3 ? nmax : 3;
            CUDA_OK(cudaMemset(d_out, 0xff, nm * 4));
            CHECK(nb_cuda_matmul_wq(d_out, NB_DTYPE_F32, d_x, dt, &dwm, view, d_bias, bdt, n, m,
                                    k, NULL, 0, 0) == NB_OK);
            CUDA_OK(cudaDeviceSynchronize());
            snprintf(what, sizeof what, "wq%d %d-byte-aligned sz %s m=%d k=%d n=%d",
                     view ? 8 : 4, off, nb_dtype_name(dt), m, k, n);
            compare(what, d_out, NB_DTYPE_F32, ref[view], S[view], n, m, 1.0f, NULL, &st[view]);
        }
        cudaFree(d_szm);
    }

    // Programmatic dependent launch hazards: a chain of dependent calls
    // ping-ponging between two buffers (each reads what the last one wrote
    // and overwrites what the last one read), enqueued without a sync, must
    // give the bits of the same chain without PDL.
    if (m == k && m >= 4096) {
        const int n = 4;
        size_t bb = (size_t)12 * k * es;
        uint8_t *res0 = (uint8_t *)malloc(bb), *res = (uint8_t *)malloc(bb);
        // bf16, both views, 8 calls (the values grow through the chain): the
        // last run sizes the decode kernel's grid for one block per SM, so
        // the next launch's blocks start beside every block of this one
        // (otherwise only a large m leaves free slots). 4 rows (the decode
        // kernel) and 12 (its two-x-tile form).
        for (int nc = 4; dt == NB_DTYPE_BF16 && nc <= 12; nc += 8) {
            bb = (size_t)nc * k * es;
            for (int view = 0; view < 2; view++) {
                pdl_chain(res0, d_x, dt, view ? &dw : &dw4, view, nc, m, k, 8, 0, 0, 0);
                for (int run = 1; run < 4; run++) {
                    pdl_chain(res, d_x, dt, view ? &dw : &dw4, view, nc, m, k, 8, 1, 0, run == 3 ? 1 : 0);
                    CHECKF(memcmp(res0, res, bb) == 0,
                           "wq%d %s m=%d k=%d n=%d: an 8-call chain with PDL (run %d) differs "
                           "from the chain without", view ? 8 : 4, nb_dtype_name(dt), m, k, nc, run);
                }
            }
        }
        bb = (size_t)n * k * es;
        // f16, 4-bit view, every decode-kernel variant at grids of all and 2
        // blocks per SM (the variants with room for more resident blocks
        // than the grid is sized for put the next launch's blocks beside
        // this one's), against variant 0 without PDL. Four calls keep f16
        // finite.
        if (dt == NB_DTYPE_F16) {
            pdl_chain(res0, d_x, dt, &dw4, 0, n, m, k, 4, 0, 0, 0);
            const uint16_t *h0 = (const uint16_t *)res0;
            size_t fin = 0;
            for (size_t e = 0; e < (size_t)n * k; e++) fin += (h0[e] & 0x7c00) != 0x7c00;
            CHECKF(fin == (size_t)n * k, "wq4 f16 chain: %zu of %zu values not finite",
                   (size_t)n * k - fin, (size_t)n * k);
            const int nv = nb_cuda_matmul_wq_set_gemv_variant(-1);
            for (int v = -1; v < nv; v++)
                for (int bps = 0; bps <= 2; bps += 2) {
                    pdl_chain(res, d_x, dt, &dw4, 0, n, m, k, 4, 1, v, bps);
                    CHECKF(memcmp(res0, res, bb) == 0,
                           "wq4 f16 m=%d k=%d: a 4-call chain with PDL, variant %d, grid %d/SM, "
                           "differs from variant 0's chain without", m, k, v, bps);
                }
        }
        free(res0);
        free(res);
    }

    // Dequantize: bit for bit against the C twin rounded to dt.
    for (int view = 0; view < 2; view++) {
        float *deq = (float *)malloc(mk * 4);
        uint16_t *got = (uint16_t *)malloc(mk * 2);
        nb_wq_dequantize(deq, &hw, view, m, k);
        CUDA_OK(cudaMemset(d_w, 0xff, mk * es));
        CHECK(nb_cuda_wq_dequantize(d_w, dt, view ? &dw : &dw4, view, m, k, 0) == NB_OK);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(got, d_w, mk * 2, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t e = 0; e < mk; e++) {
            uint16_t want = dt == NB_DTYPE_F16 ? nb_f32_to_f16(deq[e]) : nb_f32_to_bf16(deq[e]);
            bad += got[e] != want;
        }
        CHECKF(bad == 0, "dequantize%d %s m=%d k=%d: %zu elements differ", view ? 8 : 4,
               nb_dtype_name(dt), m, k, bad);
        free(deq);
        free(got);
    }

    printf("  %-4s m=%-5d k=%-5d (g=%d, %d groups): worst err/tol wq4 %.3f wq8 %.3f dense %.3f "
           "(%ld outputs)\n",
           nb_dtype_name(dt), m, k, gs, ng, st[0].worst, st[1].worst, st[2].worst,
           st[0].outputs + st[1].outputs + st[2].outputs);
    fflush(stdout);

    cublasDestroy(cb);
    cudaFree(d_up);
    cudaFree(d_lo);
    cudaFree(d_sz);
    free(hsz);
    cudaFree(d_w);
    cudaFree(d_x);
    cudaFree(d_bias);
    cudaFree(d_out);
    cudaFree(d_out2);
    cudaFree(d_xmis);
    for (int v = 0; v < 3; v++) {
        free(ref[v]);
        free(S[v]);
    }
    free(w);
    free(wf);
    free(wabs);
    free(up);
    free(lo);
    free(sc);
    free(zr);
    free(sca);
    free(zra);
    free(x);
    free(xf);
    free(xabs);
    free(bias);
    free(babs);
}

// The CUDA plane layout (host code, checked with or without a GPU): 32-row
// tiles, group-major within a tile, rows past m zero; codes 0..7 of a word
// in nibbles rev3(n).
static void check_pack(void) {
    // One row, one group of 32 (k = 32): nibbles n = 0..7 of a word hold
    // elements 0,4,2,6,1,5,3,7 (element i's code is i in the first word,
    // 15 - i in the second); rows 1..31 of the tile are zeros.
    uint8_t wd[16] = {0x10, 0x32, 0x54, 0x76, 0xef, 0xcd, 0xab, 0x89, 0x10, 0x32, 0x54, 0x76, 0xef, 0xcd, 0xab, 0x89};
    uint8_t cw[32 * 16];
    CHECK(nb_cuda_wq_plane_bytes(1, 32) == sizeof cw);
    memset(cw, 0xff, sizeof cw);
    CHECK(nb_cuda_wq_pack_plane(cw, wd, 1, 32) == NB_OK);
    CHECKF(cw[0] == 0x40 && cw[1] == 0x62 && cw[2] == 0x51 && cw[3] == 0x73,
           "pack: word 0 is %02x %02x %02x %02x", cw[0], cw[1], cw[2], cw[3]);
    CHECKF(cw[4] == 0xbf && cw[5] == 0x9d && cw[6] == 0xae && cw[7] == 0x8c,
           "pack: word 1 is %02x %02x %02x %02x", cw[4], cw[5], cw[6], cw[7]);
    size_t nz = 0;
    for (size_t i = 16; i < sizeof cw; i++) nz += cw[i] != 0;
    CHECKF(nz == 0, "pack: %zu padding bytes not zero", nz);

    // m = 40 (a partial second tile), k = 256 (two groups of 128): every
    // code where the layout puts it, padding rows zero.
    enum { PM = 40, PK = 256, PNG = 2 };
    static uint8_t src[PM * PK / 2], dst[64 * PK / 2];
    CHECK(nb_cuda_wq_plane_bytes(PM, PK) == sizeof dst);
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(urand() * 256.0);
    memset(dst, 0xff, sizeof dst);
    CHECK(nb_cuda_wq_pack_plane(dst, src, PM, PK) == NB_OK);
    size_t misplaced = 0;
    for (int j = 0; j < 64; j++)
        for (int e = 0; e < PK; e++) {
            const int gi = e / 128, eg = e % 128, i = eg & 7, n = ((i & 1) << 2) | (i & 2) | (i >> 2);
            const size_t o = oracle_plane_off(j, gi, (eg >> 3) * 4 + (n >> 1), PNG, 64);
            const int got = (dst[o] >> ((n & 1) * 4)) & 15;
            const int want = j < PM ? (src[(size_t)j * PK / 2 + e / 2] >> ((e & 1) * 4)) & 15 : 0;
            misplaced += got != want;
        }
    CHECKF(misplaced == 0, "pack: %zu of %d codes misplaced", misplaced, 64 * PK);
    // The kernels address planes through nb_cuda_wq_plane_off: the same
    // offsets as the formula above, for every (row, group, byte).
    size_t off_bad = 0;
    for (int j = 0; j < 64; j++)
        for (int gi = 0; gi < PNG; gi++)
            for (int b = 0; b < 64; b++)
                off_bad += nb_cuda_wq_plane_off(j, gi, b, PNG, 64) != oracle_plane_off(j, gi, b, PNG, 64);
    CHECKF(off_bad == 0, "nb_cuda_wq_plane_off: %zu of %d offsets differ", off_bad, 64 * PNG * 64);
    CHECK(nb_cuda_wq_plane_bytes(PM, 100) == 0 && nb_cuda_wq_plane_bytes(-1, PK) == 0);
    CHECK(nb_cuda_wq_plane_bytes(0, PK) == 0);
    CHECK(nb_cuda_wq_pack_plane(dst, src, PM, 100) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_wq_pack_plane(NULL, src, PM, PK) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_wq_pack_plane(dst, NULL, PM, PK) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_wq_pack_plane(src, src, 1, 32) == NB_ERR_INVALID_ARG); // in place
    CHECK(nb_cuda_wq_pack_plane(NULL, NULL, 0, PK) == NB_OK);

    // sz: 32-row tiles, then groups, then 16-row halves, then row pairs
    // (g, g+8): scale, scale, zero, zero; rows past m zero. m = 40 (a
    // partial second 32-row tile), 2 groups.
    enum { M = 40, K = 256, NG = 2 };
    uint16_t sc[M * NG], zr[M * NG], sz[4 * NG * 32];
    for (int j = 0; j < M; j++)
        for (int gi = 0; gi < NG; gi++) {
            sc[j * NG + gi] = (uint16_t)(1000 + 10 * j + gi);
            zr[j * NG + gi] = (uint16_t)(3000 + 10 * j + gi);
        }
    CHECK(nb_cuda_wq_sz_elems(M, K) == sizeof sz / 2);
    CHECK(nb_cuda_wq_sz_elems(M, 100) == 0);
    memset(sz, 0xff, sizeof sz);
    CHECK(nb_cuda_wq_pack_sz(sz, sc, zr, M, K) == NB_OK);
    size_t bad = 0;
    for (int tl = 0; tl < 4; tl++)
        for (int gi = 0; gi < NG; gi++)
            for (int g = 0; g < 8; g++)
                for (int q = 0; q < 4; q++) {
                    const int j = tl * 16 + g + 8 * (q & 1);
                    const uint16_t want = j >= M ? 0 : (q < 2 ? sc : zr)[j * NG + gi];
                    bad += sz[oracle_sz_off(tl, gi, g + 8 * (q & 1), q >> 1, NG)] != want;
                }
    CHECKF(bad == 0, "pack_sz: %zu of %d values misplaced", bad, 4 * NG * 32);
    // ... and scales through nb_cuda_wq_sz_off + nb_cuda_wq_sz_slot.
    size_t sz_bad = 0;
    for (int tl = 0; tl < 4; tl++)
        for (int gi = 0; gi < NG; gi++)
            for (int rt = 0; rt < 16; rt++)
                for (int z = 0; z < 2; z++)
                    sz_bad += nb_cuda_wq_sz_off(tl, gi, NG) + (size_t)nb_cuda_wq_sz_slot(rt, z) !=
                              oracle_sz_off(tl, gi, rt, z, NG);
    CHECKF(sz_bad == 0, "nb_cuda_wq_sz_off/slot: %zu of %d offsets differ", sz_bad, 4 * NG * 32);
    CHECK(nb_cuda_wq_pack_sz(sz, sc, zr, M, 100) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_wq_pack_sz(NULL, sc, zr, M, K) == NB_ERR_INVALID_ARG);
}

// The kernels the epilogue tests go through: choice 0 the built-in one, 1
// the tile kernel (decode kernel off), 2-6 the decode kernel's variants
// forced (n <= 8), 7-10 its two-x-tile variants forced (9-16 rows). Sets
// choice kern and returns whether it takes n rows (choice 0 restores the built-in).
static const int kKernChoices = 2 + 5 + 4;
static bool kernel_choice(int kern, int n) {
    const int gv = kern >= 2 && kern < 7 ? kern - 2 : -1, gv2 = kern >= 7 ? kern - 7 : -1;
    nb_cuda_matmul_wq_set_decode_kernel(kern == 1 ? 0 : -1);
    nb_cuda_matmul_wq_set_gemv_variant(gv);
    nb_cuda_matmul_wq_set_gemv16_variant(gv2);
    return !(gv >= 0 && n > 8) && !(gv2 >= 0 && (n <= 8 || n > 16));
}

// A weight matrix for the moved-row epilogues: random bf16 rows (per-row
// scale and offset) in model order, quantized as they are and with model
// row j moved to row_of[j], both uploaded in the CUDA layout (dw[0] model
// order, dw[1] moved); the model order's unpacked codes, scales and zeros
// are kept for the C references. Rows are quantized each on its own, so
// each moved row must hold the codes of its model row: checked.
struct moved_wq {
    uint8_t *up;       // [m][k/2] model order, wquant.h layout
    uint16_t *sc, *zr; // [m][k/g]
    nb_cuda_wq dw[2];
};
static moved_wq make_moved_wq(int m, int k, const int *row_of, const char *what) {
    const size_t mk = (size_t)m * k;
    size_t pb = 0, ngt = 0;
    CHECK(nb_wq_sizes(m, k, &pb, &ngt) == NB_OK);
    uint16_t *w = (uint16_t *)malloc(mk * 2), *wi = (uint16_t *)malloc(mk * 2);
    for (int j = 0; j < m; j++) {
        const double amp = 0.02 + 0.2 * urand(), off = 0.05 * (urand() - 0.5);
        for (int t = 0; t < k; t++)
            nb_store_f32(w, NB_DTYPE_BF16, (size_t)j * k + t, (float)(off + amp * (2.0 * urand() - 1.0)));
    }
    for (int j = 0; j < m; j++) memcpy(wi + (size_t)row_of[j] * k, w + (size_t)j * k, (size_t)k * 2);
    const size_t nsz = nb_cuda_wq_sz_elems(m, k), rb = (size_t)k / 2, gpr = ngt / m;
    uint8_t *up[2];
    uint16_t *sc[2], *zr[2];
    for (int v = 0; v < 2; v++) {
        up[v] = (uint8_t *)malloc(pb);
        sc[v] = (uint16_t *)malloc(ngt * 2);
        zr[v] = (uint16_t *)malloc(ngt * 2);
        CHECK(nb_wq_quantize(v ? wi : w, NB_DTYPE_BF16, m, k, up[v], NULL, sc[v], zr[v]) == NB_OK);
    }
    long moved = 0;
    for (int j = 0; j < m; j++) {
        const size_t b = (size_t)row_of[j];
        moved += memcmp(up[0] + j * rb, up[1] + b * rb, rb) != 0 || memcmp(sc[0] + j * gpr, sc[1] + b * gpr, gpr * 2) != 0 ||
                 memcmp(zr[0] + j * gpr, zr[1] + b * gpr, gpr * 2) != 0;
    }
    CHECKF(moved == 0, "%s: %ld rows quantized differently once moved", what, moved);
    moved_wq q;
    q.up = (uint8_t *)malloc(pb);
    memcpy(q.up, up[0], pb);
    q.sc = sc[0];
    q.zr = zr[0];
    uint16_t *sz = (uint16_t *)malloc(nsz * 2);
    const size_t cpb = nb_cuda_wq_plane_bytes(m, k);
    uint8_t *cp = (uint8_t *)malloc(cpb);
    for (int v = 0; v < 2; v++) {
        CHECK(nb_cuda_wq_pack_plane(cp, up[v], m, k) == NB_OK);
        CHECK(nb_cuda_wq_pack_sz(sz, sc[v], zr[v], m, k) == NB_OK);
        q.dw[v] = (nb_cuda_wq){(const uint8_t *)dev_upload(cp, cpb), NULL, (const uint16_t *)dev_upload(sz, nsz * 2)};
        free(up[v]);
    }
    free(cp);
    free(sc[1]);
    free(zr[1]);
    free(sz);
    free(w);
    free(wi);
    return q;
}
static void free_moved_wq(moved_wq *q) {
    for (int v = 0; v < 2; v++) {
        CUDA_OK(cudaFree((void *)q->dw[v].upper));
        CUDA_OK(cudaFree((void *)q->dw[v].sz));
    }
    free(q->up);
    free(q->sc);
    free(q->zr);
}

// The norm scale the _rs kernels compute from a row's partial sums, on the
// host in the same order (lane l sums entries l, l + 32, ... in order, then
// the lanes' butterfly, each lane adding its partner's sum to its own).
static float rs_factor(const float *part, int k, float eps) {
    float a[32], b[32];
    for (int l = 0; l < 32; l++) {
        float v = 0.0f;
        for (int u = 0; u < NB_CUDA_WQ_PART / 32; u++) v = v + part[l + 32 * u];
        a[l] = v;
    }
    for (int o = 16; o > 0; o >>= 1) {
        for (int l = 0; l < 32; l++) b[l] = a[l] + a[l ^ o];
        memcpy(a, b, sizeof a);
    }
    const float ms = a[0] / (float)k;
    return 1.0f / sqrtf(ms + eps);
}
// Partial sums for nmax rows (random in the first `used` entries, zeros
// after, as nb_cuda_matmul_wq_res leaves them), uploaded; their factors in r.
static float *rs_parts(int nmax, int k, float eps, float *r) {
    const size_t np = (size_t)nmax * NB_CUDA_WQ_PART;
    float *h = (float *)calloc(np, sizeof(float));
    for (int i = 0; i < nmax; i++) {
        const int used = 100 + (int)(urand() * 300);
        for (int b = 0; b < used; b++) h[(size_t)i * NB_CUDA_WQ_PART + b] = (float)(urand() * 8.0 * k / used);
        r[i] = rs_factor(h + (size_t)i * NB_CUDA_WQ_PART, k, eps);
    }
    float *d = (float *)dev_upload(h, np * sizeof(float));
    free(h);
    return d;
}
// The kernel choices (kernel_choice) the norm-scaled and residual forms
// are built for: the built-in one, the 32-row n <= 8 variants 3 and 4, the
// two-x-tile variants 0 and 1; choice 1 (the decode kernel off) must be
// refused.
static const int kRsKerns[] = {0, 5, 6, 7, 8};

// The gate|up projection with the SwiGLU epilogue (nb_cuda_matmul_wq_swiglu)
// on gate|up quantized in the SwiGLU row order (nb_cuda_wq_swiglu_row),
// against the unfused chain on the same rows in model order: the 4-bit
// matmul into f32 [n][2I] (gate rows, then up rows), then the SwiGLU kernel
// storing f32, f16, saturating f16 or bf16. Every byte must match, for the
// decode kernel (each of its variants), the tile kernel and several n. The
// f32 output is also held to the C references (nb_ref_matmul_wq, then
// nb_ref_silu_mul): with Eg, Eu the matmul bound of the header on gate and
// up, |got - ref| <= 1.1*|u|*Eg + |silu(g)|*Eu + 2^-20*|ref| (silu'(g) is
// within [-0.1, 1.1]; the last term covers silu's own roundings).
static void run_swiglu(int I, int k, int nmax) {
    const int m = 2 * I;
    const size_t nk = (size_t)nmax * k;
    size_t pb = 0, ngt = 0;
    CHECK(nb_wq_sizes(m, k, &pb, &ngt) == NB_OK);
    // Model order: gate rows [0, I), up rows [I, 2I); and the SwiGLU order.
    int *row_of = (int *)malloc(sizeof(int) * m);
    for (int j = 0; j < I; j++)
        for (int part = 0; part < 2; part++) row_of[part * I + j] = nb_cuda_wq_swiglu_row(j, part);
    char what[64];
    snprintf(what, sizeof what, "swiglu I=%d k=%d", I, k);
    moved_wq mq = make_moved_wq(m, k, row_of, what);
    free(row_of);
    const nb_cuda_wq *dw = mq.dw;
    // The C references (model order), f32.
    uint16_t *x = (uint16_t *)malloc(nk * 2);
    float *xf = (float *)malloc(nk * 4), *xa = (float *)malloc(nk * 4);
    for (size_t e = 0; e < nk; e++) nb_store_f32(x, NB_DTYPE_F16, e, (float)(4.0 * urand() - 2.0));
    nb_ref_convert_to_f32(xf, x, NB_DTYPE_F16, nk);
    for (size_t e = 0; e < nk; e++) xa[e] = fabsf(xf[e]);
    uint16_t *sca = (uint16_t *)malloc(ngt * 2), *zra = (uint16_t *)malloc(ngt * 2);
    for (size_t e = 0; e < ngt; e++) sca[e] = mq.sc[e] & 0x7fffu, zra[e] = mq.zr[e] & 0x7fffu;
    nb_wq_tensor hw = {mq.up, NULL, mq.sc, mq.zr}, hwa = {mq.up, NULL, sca, zra};
    float *gu = (float *)malloc((size_t)nmax * m * 4), *S = (float *)malloc((size_t)nmax * m * 4);
    nb_ref_matmul_wq(gu, xf, &hw, 0, NULL, NB_DTYPE_F32, nmax, m, k);
    nb_ref_matmul_wq(S, xa, &hwa, 0, NULL, NB_DTYPE_F32, nmax, m, k);
    void *d_x = dev_upload(x, nk * 2), *d_gu = NULL, *d_a = NULL, *d_b = NULL;
    const size_t ob = (size_t)nmax * I * 4;
    CUDA_OK(cudaMalloc(&d_gu, (size_t)nmax * m * 4));
    CUDA_OK(cudaMalloc(&d_a, ob));
    CUDA_OK(cudaMalloc(&d_b, ob));
    uint8_t *ha = (uint8_t *)malloc(ob), *hb = (uint8_t *)malloc(ob);
    const int ns[] = {1, 2, 4, 5, 8, 9, 12, 16, 17, 33};
    const struct { nb_dtype dt; int sat; } outs[] = {{NB_DTYPE_F16, 1}, {NB_DTYPE_F32, 0}, {NB_DTYPE_F16, 0}, {NB_DTYPE_BF16, 0}};
    long checked = 0;
    double worst = 0;
    for (int kern = 0; kern < kKernChoices; kern++) {
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
            const int n = ns[in];
            if (n > nmax || !kernel_choice(kern, n)) continue;
            for (size_t io = 0; io < sizeof outs / sizeof outs[0]; io++) {
                const nb_dtype odt = outs[io].dt;
                if (kern > 0 && io > 0) continue; // every output type once, on the built-in path
                const size_t bytes = (size_t)n * I * nb_dtype_size(odt);
                CUDA_OK(cudaMemset(d_gu, 0xff, (size_t)nmax * m * 4));
                CUDA_OK(cudaMemset(d_a, 0xff, ob));
                CUDA_OK(cudaMemset(d_b, 0xff, ob));
                CHECK(nb_cuda_matmul_wq(d_gu, NB_DTYPE_F32, d_x, NB_DTYPE_F16, &dw[0], 0, NULL, NB_DTYPE_F32, n, m,
                                        k, NULL, 0, 0) == NB_OK);
                const nb_cuda_cvt cvt = {odt == NB_DTYPE_F32 ? NULL : d_b, odt, outs[io].sat};
                CHECK(nb_cuda_silu_mul_cvt(odt == NB_DTYPE_F32 ? (float *)d_b : NULL, cvt, (const float *)d_gu,
                                           (const float *)d_gu + I, m, n, I, 0) == NB_OK);
                CHECK(nb_cuda_matmul_wq_swiglu(d_a, odt, outs[io].sat, d_x, NB_DTYPE_F16, &dw[1], 0, n, m, k, 0) ==
                      NB_OK);
                CUDA_OK(cudaDeviceSynchronize());
                CUDA_OK(cudaMemcpy(ha, d_a, ob, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(hb, d_b, ob, cudaMemcpyDeviceToHost));
                // The bytes past n rows must be untouched (still the 0xff poison).
                long past = 0;
                for (size_t e = bytes; e < ob; e++) past += ha[e] != 0xff;
                CHECKF(memcmp(ha, hb, bytes) == 0 && past == 0,
                       "swiglu I=%d k=%d n=%d out=%s sat=%d kernel=%d: fused differs from matmul + SwiGLU (%ld "
                       "bytes written past n rows)",
                       I, k, n, nb_dtype_name(odt), outs[io].sat, kern, past);
                checked += (long)n * I;
                if (odt != NB_DTYPE_F32) continue;
                const float *got = (const float *)ha;
                long bad = 0;
                for (int r = 0; r < n; r++)
                    for (int j = 0; j < I; j++) {
                        const size_t gi = (size_t)r * m + j, ui = gi + I;
                        float ref = 0;
                        nb_ref_silu_mul(&ref, &gu[gi], &gu[ui], 1);
                        const double sg = fabs((double)gu[gi] / (1.0 + exp(-(double)gu[gi])));
                        const double tol = 1.1 * fabs(gu[ui]) * ldexp(S[gi], -14) + sg * ldexp(S[ui], -14) +
                                           ldexp(fabs(ref), -20);
                        const double err = fabs((double)got[(size_t)r * I + j] - ref);
                        if (!(err <= tol)) bad++;
                        else if (tol > 0 && err / tol > worst) worst = err / tol;
                    }
                CHECKF(bad == 0, "swiglu I=%d k=%d n=%d: %ld outputs outside the bound of the C reference", I, k, n,
                       bad);
            }
        }
    }
    kernel_choice(0, 1);
    printf("swiglu I=%d k=%d: %ld outputs bit-exact against matmul + SwiGLU, worst |err|/tol vs C %.3f\n", I, k,
           checked, worst);
    // The norm-scaled form (nb_cuda_matmul_wq_swiglu_rs): the same chain
    // with the f32 gate|up rows multiplied by each row's factor first.
    {
        const float eps = 1e-5f;
        float r[17];
        const int nr = nmax < 17 ? nmax : 17;
        float *d_part = rs_parts(nr, k, eps, r);
        long rs_checked = 0;
        for (size_t ik = 0; ik < sizeof kRsKerns / sizeof kRsKerns[0]; ik++)
            for (int n = 1; n <= 16 && n <= nr; n += n < 2 ? 1 : 7) { // 1, 2, 9, 16
                if (!kernel_choice(kRsKerns[ik], n)) continue;
                CUDA_OK(cudaMemset(d_a, 0xff, ob));
                CUDA_OK(cudaMemset(d_b, 0xff, ob));
                CHECK(nb_cuda_matmul_wq(d_gu, NB_DTYPE_F32, d_x, NB_DTYPE_F16, &dw[0], 0, NULL, NB_DTYPE_F32, n, m, k,
                                        NULL, 0, 0) == NB_OK);
                CUDA_OK(lt_scale_rows((float *)d_gu, n, m, r, NULL));
                const nb_cuda_cvt cvt = {d_b, NB_DTYPE_F16, 1};
                CHECK(nb_cuda_silu_mul_cvt(NULL, cvt, (const float *)d_gu, (const float *)d_gu + I, m, n, I, 0) ==
                      NB_OK);
                CHECK(nb_cuda_matmul_wq_swiglu_rs(d_a, NB_DTYPE_F16, 1, d_x, NB_DTYPE_F16, &dw[1], n, m, k, d_part,
                                                  eps, 0) == NB_OK);
                CUDA_OK(cudaDeviceSynchronize());
                CUDA_OK(cudaMemcpy(ha, d_a, ob, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(hb, d_b, ob, cudaMemcpyDeviceToHost));
                const size_t bytes = (size_t)n * I * 2;
                long past = 0;
                for (size_t e = bytes; e < ob; e++) past += ha[e] != 0xff;
                CHECKF(memcmp(ha, hb, bytes) == 0 && past == 0,
                       "swiglu_rs I=%d k=%d n=%d kernel=%d: differs from matmul, scale, SwiGLU (%ld bytes past n rows)",
                       I, k, n, kRsKerns[ik], past);
                rs_checked += (long)n * I;
            }
        kernel_choice(1, 1); // the decode kernel off: refused, nothing launched
        CHECK(nb_cuda_matmul_wq_swiglu_rs(d_a, NB_DTYPE_F16, 1, d_x, NB_DTYPE_F16, &dw[1], 1, m, k, d_part, eps, 0) ==
              NB_ERR_UNSUPPORTED);
        kernel_choice(0, 1);
        if (nmax > 16)
            CHECK(nb_cuda_matmul_wq_swiglu_rs(d_a, NB_DTYPE_F16, 1, d_x, NB_DTYPE_F16, &dw[1], 17, m, k, d_part, eps,
                                              0) == NB_ERR_UNSUPPORTED);
        CHECK(nb_cuda_matmul_wq_swiglu_rs(d_a, NB_DTYPE_F16, 1, d_x, NB_DTYPE_F16, &dw[1], 1, m, k, NULL, eps, 0) ==
              NB_ERR_INVALID_ARG);
        CUDA_OK(cudaFree(d_part));
        printf("swiglu_rs I=%d k=%d: %ld outputs bit-exact against matmul, the norm scale and SwiGLU\n", I, k,
               rs_checked);
    }
    // Arguments: refused, nothing launched.
    CHECK(nb_cuda_matmul_wq_swiglu(d_a, NB_DTYPE_BF16, 1, d_x, NB_DTYPE_F16, &dw[1], 0, 1, m, k, 0) ==
          NB_ERR_INVALID_ARG); // saturation is an f16 store
    CHECK(nb_cuda_matmul_wq_swiglu(d_a, NB_DTYPE_F16, 1, d_x, NB_DTYPE_BF16, &dw[1], 0, 1, m, k, 0) ==
          NB_ERR_UNSUPPORTED); // f16 x only
    CHECK(nb_cuda_matmul_wq_swiglu(d_a, NB_DTYPE_F16, 1, d_x, NB_DTYPE_F16, &dw[1], 1, 1, m, k, 0) ==
          NB_ERR_INVALID_ARG); // no lower plane
    const nb_cuda_wq wl = {dw[1].upper, dw[1].upper, dw[1].sz}; // a "lower plane": the 8-bit view is not built
    CHECK(nb_cuda_matmul_wq_swiglu(d_a, NB_DTYPE_F16, 1, d_x, NB_DTYPE_F16, &wl, 1, 1, m, k, 0) == NB_ERR_UNSUPPORTED);
    CHECK(nb_cuda_matmul_wq_swiglu(d_a, NB_DTYPE_F16, 1, (const char *)d_x + 2, NB_DTYPE_F16, &dw[1], 0, 1, m, k,
                                   0) == NB_ERR_UNSUPPORTED); // x not 16-byte aligned
    CHECK(nb_cuda_matmul_wq_swiglu(d_a, NB_DTYPE_F16, 1, d_x, NB_DTYPE_F16, &dw[1], 0, 1, m - 8, k, 0) ==
          NB_ERR_UNSUPPORTED); // m % 16 != 0
    CHECK(nb_cuda_matmul_wq_swiglu(d_a, NB_DTYPE_F16, 1, d_x, NB_DTYPE_F16, &dw[1], 0, 1, m, 100, 0) ==
          NB_ERR_INVALID_ARG); // k without a group size
    CHECK(nb_cuda_matmul_wq_swiglu(d_a, NB_DTYPE_F16, 1, d_x, NB_DTYPE_F16, &dw[1], 0, -1, m, k, 0) ==
          NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_wq_swiglu(NULL, NB_DTYPE_F16, 1, NULL, NB_DTYPE_F16, &dw[1], 0, 0, m, k, 0) == NB_OK);
    CHECK(nb_cuda_matmul_wq_swiglu((char *)d_x + 16, NB_DTYPE_F16, 1, d_x, NB_DTYPE_F16, &dw[1], 0, 1, m, k, 0) ==
          NB_ERR_INVALID_ARG); // out inside x: the engine's first version wrote its output over its input
    CHECK(nb_cuda_matmul_wq_swiglu(d_x, NB_DTYPE_F16, 1, (char *)d_x + 16, NB_DTYPE_F16, &dw[1], 0, 1, m, k, 0) ==
          NB_ERR_INVALID_ARG);
    CHECK(!nb_cuda_matmul_wq_swiglu_supported(m, 96) && !nb_cuda_matmul_wq_swiglu_supported(24, k) &&
          nb_cuda_matmul_wq_swiglu_supported(m, k));
    CUDA_OK(cudaDeviceSynchronize());
    free_moved_wq(&mq);
    CUDA_OK(cudaFree(d_x));
    CUDA_OK(cudaFree(d_gu));
    CUDA_OK(cudaFree(d_a));
    CUDA_OK(cudaFree(d_b));
    free(x);
    free(xf);
    free(xa);
    free(sca);
    free(zra);
    free(gu);
    free(S);
    free(ha);
    free(hb);
}

// The q|k|v projection with the RoPE + KV-write epilogue
// (nb_cuda_matmul_wq_rope) on q|k|v quantized in the RoPE row order
// (nb_cuda_wq_rope_row), with the rows' (cos, sin) from nb_cuda_rope_table,
// against the unfused chain on the model-order
// matrix: the 4-bit matmul into f32 [n][W], then nb_cuda_rope_write_kv. q
// and every byte of the FP pool (poisoned alike, one row's block outside
// the pool) must match, for the decode kernel (each variant), the tile
// kernel and several n. (nb_cuda_rope_write_kv itself is held to the C
// references in test_ops_cuda.)
static void run_rope(int nh, int nkv, int D, int k, nb_dtype cdt, int nmax) {
    const int Hq = nh * D, Hkv = nkv * D, m = Hq + 2 * Hkv;
    const size_t nk = (size_t)nmax * k;
    int *row_of = (int *)malloc(sizeof(int) * m);
    for (int j = 0; j < m; j++) row_of[j] = nb_cuda_wq_rope_row(j, D);
    char what[64];
    snprintf(what, sizeof what, "rope D=%d k=%d", D, k);
    moved_wq mq = make_moved_wq(m, k, row_of, what);
    free(row_of);
    const nb_cuda_wq *dw = mq.dw;
    uint16_t *x = (uint16_t *)malloc(nk * 2);
    for (size_t e = 0; e < nk; e++) nb_store_f32(x, NB_DTYPE_F16, e, (float)(4.0 * urand() - 2.0));
    // The cache: 2 layers, 16-token blocks, pool of 6 blocks; rows at
    // distinct random slots, the last row's block outside the pool.
    const nb_kv_layout lay = {2, nkv, D, 16, cdt, 0, 6};
    const int layer = 1, slots = lay.n_fpblocks * lay.group_size;
    CHECK(nmax <= slots);
    int32_t *perm = (int32_t *)malloc(sizeof(int32_t) * slots), *fb = (int32_t *)malloc(sizeof(int32_t) * nmax),
            *sl = (int32_t *)malloc(sizeof(int32_t) * nmax), *pos = (int32_t *)malloc(sizeof(int32_t) * nmax);
    for (int i = 0; i < slots; i++) perm[i] = i;
    for (int i = slots - 1; i > 0; i--) {
        const int j = (int)(urand() * (i + 1));
        const int t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int i = 0; i < nmax; i++) fb[i] = perm[i] / 16, sl[i] = perm[i] % 16, pos[i] = (int32_t)(urand() * 131072);
    const int32_t out_of_pool = lay.n_fpblocks;
    float *inv = (float *)malloc(sizeof(float) * D / 2);
    CHECK(nb_ref_rope_inv_freq(inv, D, 500000.0f, NULL) == NB_OK);
    const size_t pool_bytes = nb_kv_fp_bytes(&lay), qb = (size_t)nmax * Hq * 4;
    void *d_x = dev_upload(x, nk * 2), *d_inv = dev_upload(inv, sizeof(float) * D / 2);
    int32_t *d_fb = (int32_t *)dev_upload(fb, 4 * nmax), *d_sl = (int32_t *)dev_upload(sl, 4 * nmax),
            *d_pos = (int32_t *)dev_upload(pos, 4 * nmax);
    void *d_qkv = NULL, *d_qa = NULL, *d_qf = NULL, *d_pa = NULL, *d_pf = NULL, *d_cs = NULL;
    CUDA_OK(cudaMalloc(&d_cs, sizeof(float) * nmax * D));
    CHECK(nb_cuda_rope_table((float *)d_cs, d_pos, nmax, D, (const float *)d_inv, 0) == NB_OK);
    {
        // The table against the C reference's cosf / sinf of the same f32
        // angle (nb_ref_rope_apply's): the kernel rounds a double cos/sin
        // once, so within 2^-22 (values in [-1, 1]); the bits it shares
        // with nb_cuda_rope_write_kv are checked by the comparisons below.
        float *hcs = (float *)malloc(sizeof(float) * nmax * D);
        CUDA_OK(cudaMemcpy(hcs, d_cs, sizeof(float) * nmax * D, cudaMemcpyDeviceToHost));
        long off = 0;
        for (int r = 0; r < nmax; r++)
            for (int i = 0; i < D / 2; i++) {
                const float a = (float)pos[r] * inv[i];
                const float *g = hcs + ((size_t)r * (D / 2) + i) * 2;
                off += !(fabsf(g[0] - cosf(a)) <= 0x1p-22f) || !(fabsf(g[1] - sinf(a)) <= 0x1p-22f);
            }
        CHECKF(off == 0, "rope table D=%d: %ld (cos, sin) pairs beyond 2^-22 of cosf/sinf", D, off);
        free(hcs);
        CHECK(nb_cuda_rope_table((float *)d_cs, d_pos, 1, D + 1, (const float *)d_inv, 0) == NB_ERR_INVALID_ARG);
        CHECK(nb_cuda_rope_table(NULL, d_pos, 1, D, (const float *)d_inv, 0) == NB_ERR_INVALID_ARG);
        CHECK(nb_cuda_rope_table(NULL, NULL, 0, D, NULL, 0) == NB_OK);
    }
    CUDA_OK(cudaMalloc(&d_qkv, (size_t)nmax * m * 4));
    CUDA_OK(cudaMalloc(&d_qa, qb));
    CUDA_OK(cudaMalloc(&d_qf, qb));
    CUDA_OK(cudaMalloc(&d_pa, pool_bytes));
    CUDA_OK(cudaMalloc(&d_pf, pool_bytes));
    uint8_t *ha = (uint8_t *)malloc(pool_bytes > qb ? pool_bytes : qb), *hf = (uint8_t *)malloc(pool_bytes > qb ? pool_bytes : qb);
    // One call of n rows on the current kernel choice against the unfused
    // chain: the matmul into f32 rows, with r (the _rs form) each row
    // multiplied by r[row] on the host, then the separate RoPE + KV write.
    // The last row of a call of several has its block outside the pool.
    auto rope_case = [&](int n, int kern, const float *r, const float *d_part, float eps) {
        CUDA_OK(cudaMemcpy(d_fb, fb, 4 * nmax, cudaMemcpyHostToDevice));
        if (n > 1) CUDA_OK(cudaMemcpy(d_fb + (n - 1), &out_of_pool, 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(d_qkv, 0xff, (size_t)nmax * m * 4));
        CUDA_OK(cudaMemset(d_qa, 0xff, qb));
        CUDA_OK(cudaMemset(d_qf, 0xff, qb));
        CUDA_OK(cudaMemset(d_pa, 0xa5, pool_bytes));
        CUDA_OK(cudaMemset(d_pf, 0xa5, pool_bytes));
        CHECK(nb_cuda_matmul_wq(d_qkv, NB_DTYPE_F32, d_x, NB_DTYPE_F16, &dw[0], 0, NULL, NB_DTYPE_F32, n, m, k, NULL,
                                0, 0) == NB_OK);
        if (r) CUDA_OK(lt_scale_rows((float *)d_qkv, n, m, r, NULL));
        const float *qkv = (const float *)d_qkv;
        CHECK(nb_cuda_rope_write_kv((float *)d_qa, qkv, m, qkv + Hq, qkv + Hq + Hkv, m, d_pos, n, nh,
                                    (const float *)d_inv, &lay, d_pa, layer, d_fb, d_sl, 0) == NB_OK);
        const nb_cuda_wq_rope rp = {(float *)d_qf, (const float *)d_cs, d_pf, d_fb, d_sl, lay, layer, nh};
        CHECK((r ? nb_cuda_matmul_wq_rope_rs(d_x, NB_DTYPE_F16, &dw[1], n, m, k, &rp, d_part, eps, 0)
                 : nb_cuda_matmul_wq_rope(d_x, NB_DTYPE_F16, &dw[1], 0, n, m, k, &rp, 0)) == NB_OK);
        bool q_same = false;
        long diff = 0, written = 0;
        CUDA_OK(lt_rope_compare(d_qa, d_qf, qb, d_pa, d_pf, pool_bytes, ha, hf, &q_same, &diff, &written));
        CHECKF(q_same && diff == 0 && written > 0,
               "rope%s nh=%d nkv=%d D=%d k=%d cache=%s n=%d kernel=%d: fused differs from matmul%s + RoPE/KV write "
               "(q %s, %ld pool bytes differ, %ld written)",
               r ? "_rs" : "", nh, nkv, D, k, nb_dtype_name(cdt), n, kern, r ? ", the norm scale" : "",
               q_same ? "same" : "differs", diff, written);
    };
    const int ns[] = {1, 3, 4, 8, 9, 12, 16, 17, 33};
    long checked = 0;
    for (int kern = 0; kern < kKernChoices; kern++) {
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
            const int n = ns[in];
            if (n > nmax || !kernel_choice(kern, n)) continue;
            rope_case(n, kern, NULL, NULL, 0.0f);
            checked += (long)n * m;
        }
    }
    kernel_choice(0, 1);
    printf("rope nh=%d nkv=%d D=%d k=%d cache=%s: %ld q|k|v outputs' stores bit-exact against matmul + "
           "RoPE/KV write\n", nh, nkv, D, k, nb_dtype_name(cdt), checked);
    // The norm-scaled form (nb_cuda_matmul_wq_rope_rs): the q|k|v rows
    // multiplied by each row's factor before the rotation and the stores.
    {
        const float eps = 1e-5f;
        float r[17];
        const int nr = nmax < 17 ? nmax : 17;
        float *d_part = rs_parts(nr, k, eps, r);
        long rs_checked = 0;
        for (size_t ik = 0; ik < sizeof kRsKerns / sizeof kRsKerns[0]; ik++)
            for (int n = 1; n <= 16 && n <= nr; n += n < 2 ? 1 : 7) {
                if (!kernel_choice(kRsKerns[ik], n)) continue;
                rope_case(n, kRsKerns[ik], r, d_part, eps);
                rs_checked += (long)n * m;
            }
        kernel_choice(1, 1);
        CUDA_OK(cudaMemcpy(d_fb, fb, 4 * nmax, cudaMemcpyHostToDevice));
        const nb_cuda_wq_rope rp = {(float *)d_qf, (const float *)d_cs, d_pf, d_fb, d_sl, lay, layer, nh};
        CHECK(nb_cuda_matmul_wq_rope_rs(d_x, NB_DTYPE_F16, &dw[1], 1, m, k, &rp, d_part, eps, 0) == NB_ERR_UNSUPPORTED);
        kernel_choice(0, 1);
        CHECK(nb_cuda_matmul_wq_rope_rs(d_x, NB_DTYPE_F16, &dw[1], 1, m, k, &rp, NULL, eps, 0) == NB_ERR_INVALID_ARG);
        CUDA_OK(cudaFree(d_part));
        printf("rope_rs D=%d k=%d: %ld q|k|v outputs' stores bit-exact against matmul, the norm scale and RoPE/KV "
               "write\n", D, k, rs_checked);
    }
    // Arguments: refused, nothing launched.
    nb_cuda_wq_rope rp = {(float *)d_qf, (const float *)d_cs, d_pf, d_fb, d_sl, lay, layer, nh};
    CHECK(nb_cuda_matmul_wq_rope(d_x, NB_DTYPE_F16, &dw[1], 0, 1, m - D, k, &rp, 0) == NB_ERR_INVALID_ARG);
    rp.layer = 2;
    CHECK(nb_cuda_matmul_wq_rope(d_x, NB_DTYPE_F16, &dw[1], 0, 1, m, k, &rp, 0) == NB_ERR_INVALID_ARG);
    rp.layer = layer;
    rp.cs = NULL;
    CHECK(nb_cuda_matmul_wq_rope(d_x, NB_DTYPE_F16, &dw[1], 0, 1, m, k, &rp, 0) == NB_ERR_INVALID_ARG);
    rp.cs = (const float *)d_cs + 1; // (cos, sin) pairs are read as float2
    CHECK(nb_cuda_matmul_wq_rope(d_x, NB_DTYPE_F16, &dw[1], 0, 1, m, k, &rp, 0) == NB_ERR_INVALID_ARG);
    rp.cs = (const float *)d_cs;
    rp.q_out = (float *)d_x;
    CHECK(nb_cuda_matmul_wq_rope(d_x, NB_DTYPE_F16, &dw[1], 0, 1, m, k, &rp, 0) == NB_ERR_INVALID_ARG);
    rp.q_out = (float *)d_qf;
    CHECK(nb_cuda_matmul_wq_rope(d_x, NB_DTYPE_BF16, &dw[1], 0, 1, m, k, &rp, 0) == NB_ERR_UNSUPPORTED);
    CHECK(nb_cuda_matmul_wq_rope(d_x, NB_DTYPE_F16, &dw[1], 0, 0, m, k, &rp, 0) == NB_OK);
    CHECK(nb_cuda_matmul_wq_rope_supported(m, k, nh, nkv, D) && !nb_cuda_matmul_wq_rope_supported(m, k, nh, nkv + 1, D) &&
          !nb_cuda_matmul_wq_rope_supported((nh + 2 * nkv) * 8, k, nh, nkv, 8));
    CUDA_OK(cudaDeviceSynchronize());
    free_moved_wq(&mq);
    void *dfree[] = {d_x, d_inv, d_fb, d_sl, d_pos, d_qkv, d_qa, d_qf, d_pa, d_pf, d_cs};
    for (void *d : dfree) CUDA_OK(cudaFree(d));
    free(x);
    free(perm);
    free(fb);
    free(sl);
    free(pos);
    free(inv);
    free(ha);
    free(hf);
}

// The o / down projection adding its output into the residual stream
// (nb_cuda_matmul_wq_res): against the plain matmul's f32 output on the
// same kernel choice (the same bits by contract), the new x must be x0 +
// out bit for bit (nb_cuda_add's rounding), xs the saturating f16 of
// x * w (bit for bit, one weight large enough to saturate), rows past n
// untouched, and the partial sums add up to sum(x^2) within 2^-15
// relative (each an f32 sum of a few dozen squares).
static void run_res(int m, int k) {
    const int nmax = 16;
    int *row_of = (int *)malloc(sizeof(int) * m);
    for (int j = 0; j < m; j++) row_of[j] = j;
    char what[64];
    snprintf(what, sizeof what, "res %dx%d", m, k);
    moved_wq mq = make_moved_wq(m, k, row_of, what);
    free(row_of);
    const size_t nk = (size_t)nmax * k, nm = (size_t)nmax * m;
    uint16_t *x = (uint16_t *)malloc(nk * 2), *wn = (uint16_t *)malloc((size_t)m * 2);
    float *x0 = (float *)malloc(nm * 4), *out = (float *)malloc(nm * 4), *hx = (float *)malloc(nm * 4);
    uint16_t *hxs = (uint16_t *)malloc(nm * 2);
    float *hp = (float *)malloc((size_t)nmax * NB_CUDA_WQ_PART * 4);
    for (size_t e = 0; e < nk; e++) nb_store_f32(x, NB_DTYPE_F16, e, (float)(2.0 * urand() - 1.0));
    for (size_t e = 0; e < nm; e++) x0[e] = (float)(40.0 * urand() - 20.0);
    for (int j = 0; j < m; j++) nb_store_f32(wn, NB_DTYPE_BF16, (size_t)j, (float)(0.2 + urand()));
    nb_store_f32(wn, NB_DTYPE_BF16, 3, 30000.0f); // its channel saturates f16
    void *d_x = dev_upload(x, nk * 2), *d_w = dev_upload(wn, (size_t)m * 2), *d_out = NULL, *d_h = NULL, *d_xs = NULL,
         *d_p = NULL;
    CUDA_OK(cudaMalloc(&d_out, nm * 4));
    CUDA_OK(cudaMalloc(&d_h, nm * 4));
    CUDA_OK(cudaMalloc(&d_xs, nm * 2));
    CUDA_OK(cudaMalloc(&d_p, (size_t)nmax * NB_CUDA_WQ_PART * 4));
    const nb_cuda_wq_res rs = {(float *)d_h, d_w, NB_DTYPE_BF16, (uint16_t *)d_xs, (float *)d_p};
    long checked = 0;
    double worst = 0;
    for (size_t ik = 0; ik < sizeof kRsKerns / sizeof kRsKerns[0]; ik++)
        for (int n = 1; n <= nmax; n += n < 2 ? 1 : n < 8 ? 3 : n < 9 ? 1 : 7) { // 1, 2, 5, 8, 9, 16
            if (!kernel_choice(kRsKerns[ik], n)) continue;
            CHECK(nb_cuda_matmul_wq(d_out, NB_DTYPE_F32, d_x, NB_DTYPE_F16, &mq.dw[0], 0, NULL, NB_DTYPE_F32, n, m, k,
                                    NULL, 0, 0) == NB_OK);
            CUDA_OK(cudaMemcpy(d_h, x0, nm * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemset(d_xs, 0xff, nm * 2));
            CUDA_OK(cudaMemset(d_p, 0xff, (size_t)nmax * NB_CUDA_WQ_PART * 4));
            CHECK(nb_cuda_matmul_wq_res(d_x, NB_DTYPE_F16, &mq.dw[0], NULL, NB_DTYPE_F32, n, m, k, &rs, 0) == NB_OK);
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(out, d_out, nm * 4, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(hx, d_h, nm * 4, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(hxs, d_xs, nm * 2, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(hp, d_p, (size_t)nmax * NB_CUDA_WQ_PART * 4, cudaMemcpyDeviceToHost));
            long bad = 0, bad_xs = 0, past = 0, bad_p = 0, sat = 0; // (sat: counted, not required per call)
            lt_res_check(nm, (size_t)n * m, m, x0, out, hx, hxs, wn, NB_DTYPE_F16, &bad, &bad_xs, &past, &sat);
            for (int i = 0; i < n; i++) {
                double sp = 0, sr = 0;
                for (int b = 0; b < NB_CUDA_WQ_PART; b++) {
                    const float v = hp[(size_t)i * NB_CUDA_WQ_PART + b];
                    bad_p += !(v >= 0.0f) || !isfinite(v);
                    sp += v;
                }
                for (int j = 0; j < m; j++) sr += (double)hx[(size_t)i * m + j] * hx[(size_t)i * m + j];
                const double rel = fabs(sp - sr) / sr;
                bad_p += !(rel <= 0x1p-15);
                if (rel > worst) worst = rel;
            }
            CHECKF(bad == 0 && bad_xs == 0 && past == 0 && bad_p == 0,
                   "res %dx%d n=%d kernel=%d: %ld x, %ld xs differ from x0 + matmul; %ld past n rows; %ld partial-sum "
                   "faults",
                   m, k, n, kRsKerns[ik], bad, bad_xs, past, bad_p);
            checked += (long)n * m;
        }
    kernel_choice(0, 1);
    printf("res %dx%d: %ld outputs bit-exact against matmul + residual add, partial sums within %.2e of sum(x^2)\n", m,
           k, checked, worst);
    // Refused before anything is launched.
    CHECK(nb_cuda_matmul_wq_res(d_x, NB_DTYPE_F16, &mq.dw[0], NULL, NB_DTYPE_F32, 17, m, k, &rs, 0) ==
          NB_ERR_UNSUPPORTED);
    CHECK(nb_cuda_matmul_wq_res(d_x, NB_DTYPE_BF16, &mq.dw[0], NULL, NB_DTYPE_F32, 1, m, k, &rs, 0) ==
          NB_ERR_UNSUPPORTED);
    CHECK(nb_cuda_matmul_wq_res(d_x, NB_DTYPE_F16, &mq.dw[0], NULL, NB_DTYPE_F32, 1, m, k, NULL, 0) ==
          NB_ERR_INVALID_ARG);
    nb_cuda_wq_res bad = rs;
    bad.x = (float *)d_x; // over the input
    CHECK(nb_cuda_matmul_wq_res(d_x, NB_DTYPE_F16, &mq.dw[0], NULL, NB_DTYPE_F32, 1, m, k, &bad, 0) ==
          NB_ERR_INVALID_ARG);
    bad = rs;
    bad.part = (float *)d_xs; // over xs
    CHECK(nb_cuda_matmul_wq_res(d_x, NB_DTYPE_F16, &mq.dw[0], NULL, NB_DTYPE_F32, 1, m, k, &bad, 0) ==
          NB_ERR_INVALID_ARG);
    bad = rs;
    bad.w_dt = (nb_dtype)7;
    CHECK(nb_cuda_matmul_wq_res(d_x, NB_DTYPE_F16, &mq.dw[0], NULL, NB_DTYPE_F32, 1, m, k, &bad, 0) ==
          NB_ERR_INVALID_ARG);
    kernel_choice(1, 1);
    CHECK(nb_cuda_matmul_wq_res(d_x, NB_DTYPE_F16, &mq.dw[0], NULL, NB_DTYPE_F32, 1, m, k, &rs, 0) ==
          NB_ERR_UNSUPPORTED);
    kernel_choice(0, 1);
    CHECK(nb_cuda_matmul_wq_res(d_x, NB_DTYPE_F16, &mq.dw[0], NULL, NB_DTYPE_F32, 0, m, k, &rs, 0) == NB_OK);
    CUDA_OK(cudaDeviceSynchronize());
    free_moved_wq(&mq);
    void *dfree[] = {d_x, d_w, d_out, d_h, d_xs, d_p};
    for (void *d : dfree) CUDA_OK(cudaFree(d));
    free(x);
    free(wn);
    free(x0);
    free(out);
    free(hx);
    free(hxs);
    free(hp);
}

int main(void) {
    check_pack();
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        if (nb_test_failures) return nb_test_finish("test_linear_cuda");
        printf("test_linear_cuda: SKIP: no CUDA device (%s); the plane layout checks passed\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return NB_TEST_SKIP;
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    printf("test_linear_cuda on %s (sm_%d%d); tolerance 2^-14*S + u_out*|ref| (wq), "
           "2^-14*S + u_out*(3|ref| + 2|bias|) (dense)\n", prop.name,
           prop.major, prop.minor);
    if (prop.major < 9) {
        printf("test_linear_cuda: SKIP: the kernels are built for sm_90a only\n");
        return NB_TEST_SKIP;
    }

    const int ns[] = {1, 2, 3, 4, 7, 9, 12, 16, 33, 100};
    const int n_ns = (int)(sizeof ns / sizeof ns[0]);
    const int shapes[][2] = {{512, 512}, {1408, 512}, {512, 1408}, {4096, 4096}, {8, 128},
                             {1000, 384}, {40, 64},   {24, 96}};
    const nb_dtype dts[2] = {NB_DTYPE_BF16, NB_DTYPE_F16};
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            run_shape(dts[d], shapes[s][0], shapes[s][1], 100, ns, n_ns);
    // More than 16M weights: the 8-bit view takes the decode kernel too (at
    // n <= 8); 66 groups per row, not a multiple of the 8 warps. Fewer rows
    // of x keep the C reference quick.
    for (int d = 0; d < 2; d++) run_shape(dts[d], 2112, 8448, 16, ns, n_ns);
    // 140 row tiles of 32: blocks of the one-per-SM variants walk two tiles
    // on a 132-SM GPU (the group sums kept from the first tile); 23 groups a
    // row, 3 per warp but the last.
    for (int d = 0; d < 2; d++) run_shape(dts[d], 4480, 2944, 16, ns, n_ns);
    // The decode kernel's shared memory grows with k in size classes; a new,
    // smaller class after a larger one must not break the larger one's later
    // launches (the per-function shared memory limit; a real model alternates
    // k = 4096 and 14336 every layer).
    run_shape(NB_DTYPE_F16, 64, 5120, 4, ns, n_ns);
    run_shape(NB_DTYPE_F16, 64, 8448, 4, ns, n_ns);
    // The two-x-tile decode kernel (9-16 rows) takes k <= 64k: k = 65536 is
    // its largest shared-memory class (the limit the function is set to),
    // k = 66048 must go to the tile kernel at 9-16 rows (and still to the
    // decode kernel at <= 8); both views, rows checked against the same rows
    // alone as everywhere.
    run_shape(NB_DTYPE_F16, 40, 65536, 12, ns, n_ns);
    run_shape(NB_DTYPE_BF16, 24, 66048, 12, ns, n_ns);
    // gate|up with the SwiGLU epilogue: a small MLP, one whose 16-row tiles
    // do not fill the last decode-kernel item, and a Llama-3-8B-sized one.
    run_swiglu(256, 512, 33);
    run_swiglu(520, 384, 33);
    run_swiglu(14336, 4096, 17);
    // q|k|v with the RoPE + KV-write epilogue: small heads, an f32 cache,
    // and the Llama-3-8B shape with a bf16 cache.
    run_rope(4, 2, 64, 256, NB_DTYPE_F16, 33);
    run_rope(2, 1, 128, 384, NB_DTYPE_F32, 33);
    run_rope(32, 8, 128, 4096, NB_DTYPE_BF16, 17);
    // The o / down projections' residual form: a Llama-3-8B o projection,
    // and a small matrix whose last 32-row tile is partly past m.
    run_res(4096, 4096);
    run_res(520, 384);

    // Argument checks.
    nb_cuda_wq none = {NULL, NULL, NULL};
    CHECK(nb_cuda_matmul_wq(NULL, NB_DTYPE_F32, NULL, NB_DTYPE_F32, &none, 0, NULL, NB_DTYPE_F32,
                            1, 1, 128, NULL, 0, 0) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_wq(NULL, NB_DTYPE_F32, NULL, NB_DTYPE_F16, &none, 0, NULL, NB_DTYPE_F32,
                            1, 1, 100, NULL, 0, 0) == NB_ERR_INVALID_ARG);
    CHECK(nb_cuda_matmul_wq(NULL, NB_DTYPE_F32, NULL, NB_DTYPE_F16, &none, 0, NULL, NB_DTYPE_F32,
                            0, 8, 128, NULL, 0, 0) == NB_OK);
    CHECK(nb_cuda_matmul_wq_workspace_bytes(16, 4096, 4096) == 0);
    return nb_test_finish("test_linear_cuda");
}
