// test_wquant.c: hierarchical weight quantization against its math: the
// exact code formulas, reconstruction error bounds of the 4-bit and 8-bit
// views, the C8 = 16U + L identity, degenerate and non-finite groups, and the
// quantized matmul against dequantize-then-matmul.
// `test_wquant --bench` prints matmul_wq GFLOP/s (never fails on speed).
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "nb_test.h"
#include "ops_ref.h"
#include "wquant.h"

// Slack for the f32 arithmetic of quantize/dequantize: a few roundings of
// quantities no larger than |x| + |z| + 16 s.
#define QEPS(x, z, s) (4.0 * FLT_EPSILON * (fabs(x) + fabs(z) + 16.0 * (s)))

static uint64_t rng_state = 0x13198a2e03707344ull;
static float frand(void) { // uniform in [-1, 1)
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * 0x1p-24) * 2.0f - 1.0f;
}

typedef struct qbuf {
    uint8_t *up, *lo;
    uint16_t *sc, *zr;
} qbuf;

static qbuf qalloc(int m, int k) {
    size_t pb = 0, ng = 0;
    CHECK(nb_wq_sizes(m, k, &pb, &ng) == NB_OK);
    qbuf q = {malloc(pb), malloc(pb), malloc(ng * 2), malloc(ng * 2)};
    return q;
}
static void qfree(qbuf *q) { free(q->up), free(q->lo), free(q->sc), free(q->zr); }
static int nib(const uint8_t *p, size_t e) { return (p[e / 2] >> ((e & 1) * 4)) & 15; }

static void test_sizes(void) {
    size_t pb, ng;
    CHECK(nb_wq_group_size(256) == 128 && nb_wq_group_size(64) == 64 &&
          nb_wq_group_size(96) == 96 && nb_wq_group_size(100) == 0 &&
          nb_wq_group_size(160) == 0 && nb_wq_group_size(16) == 0 && nb_wq_group_size(0) == 0);
    CHECK(nb_wq_sizes(3, 384, &pb, &ng) == NB_OK && pb == 576 && ng == 9);
    CHECK(nb_wq_sizes(3, 64, &pb, &ng) == NB_OK && pb == 96 && ng == 3);
    CHECK(nb_wq_sizes(3, 130, &pb, &ng) == NB_ERR_INVALID_ARG);
    float w[130] = {0};
    uint8_t b[65];
    uint16_t s[2], z[2];
    CHECK(nb_wq_quantize(w, NB_DTYPE_F32, 1, 130, b, b, s, z) == NB_ERR_INVALID_ARG);
}

// Quantize w [m][k] of dtype dt and check every element against the spec.
static void check_quant(const void *w, nb_dtype dt, int m, int k, const char *what) {
    qbuf q = qalloc(m, k);
    CHECK(nb_wq_quantize(w, dt, m, k, q.up, q.lo, q.sc, q.zr) == NB_OK);
    const int gs = nb_wq_group_size(k), ng = k / gs;
    float *d4 = malloc(sizeof(float) * m * k), *d8 = malloc(sizeof(float) * m * k);
    nb_wq_tensor t = {q.up, q.lo, q.sc, q.zr};
    nb_wq_dequantize(d4, &t, 0, m, k);
    nb_wq_dequantize(d8, &t, 1, m, k);
    int code_bad = 0, sz_bad = 0, e4_bad = 0, e8_bad = 0, c8_bad = 0, span_bad = 0;
    for (int j = 0; j < m; j++) {
        for (int g = 0; g < ng; g++) {
            size_t base = (size_t)j * k + (size_t)g * gs;
            float mn = INFINITY, mx = -INFINITY;
            for (int e = 0; e < gs; e++) {
                float x = nb_load_f32(w, dt, base + e);
                mn = fminf(mn, x), mx = fmaxf(mx, x);
            }
            uint16_t sh = q.sc[(size_t)j * ng + g], zh = q.zr[(size_t)j * ng + g];
            float s = nb_f16_to_f32(sh), z = nb_f16_to_f32(zh);
            double dd = ((double)mx - (double)mn) / 15.0;
            // s: the smallest f16 >= (max-min)/15; z: min rounded to nearest.
            sz_bad += !(s >= dd) || (sh > 0 && nb_f16_to_f32((uint16_t)(sh - 1)) >= dd);
            sz_bad += zh != nb_f32_to_f16(mn);
            int saw0 = 0, saw15 = 0;
            for (int e = 0; e < gs; e++) {
                size_t i = base + e;
                float x = nb_load_f32(w, dt, i);
                int U = nib(q.up, i), L = nib(q.lo, i) - 8;
                int eU = 0, eL = 0;
                if (s != 0.0f) {
                    float fu = fminf(fmaxf(rintf((x - z) / s), 0.0f), 15.0f);
                    float r = x - (fu * s + z);
                    eU = (int)fu;
                    eL = (int)fminf(fmaxf(rintf((r / s) * 16.0f), -8.0f), 7.0f);
                }
                code_bad += U != eU || L != eL;
                saw0 |= U == 0, saw15 |= U == 15;
                double slack = fabs((double)mn - z) + QEPS(x, z, s);
                e4_bad += fabs(x - d4[i]) > s / 2.0 + slack;
                e8_bad += fabs(x - d8[i]) > (L == 7 ? s / 16.0 : s / 32.0) + slack;
                // C8 = 16U + L: the 8-bit view is the 4-bit view plus L * s/16.
                c8_bad += d8[i] != (float)(16 * U + L) * (s / 16.0f) + z;
                c8_bad += fabs((double)d8[i] - (d4[i] + L * (s / 16.0))) > QEPS(x, z, s);
            }
            span_bad += s != 0.0f && !(saw0 && saw15);
        }
    }
    CHECKF(code_bad == 0, "%s: %d codes differ from the formula", what, code_bad);
    CHECKF(sz_bad == 0, "%s: %d scale/zero off", what, sz_bad);
    CHECKF(e4_bad == 0, "%s: %d 4-bit errors over s/2", what, e4_bad);
    CHECKF(e8_bad == 0, "%s: %d 8-bit errors over s/32 (s/16 clamped)", what, e8_bad);
    CHECKF(c8_bad == 0, "%s: %d C8 identity failures", what, c8_bad);
    CHECKF(span_bad == 0, "%s: %d groups not spanning U 0..15", what, span_bad);

    // Draft-only quantization writes the same upper plane, scales and zeros.
    qbuf q2 = qalloc(m, k);
    CHECK(nb_wq_quantize(w, dt, m, k, q2.up, NULL, q2.sc, q2.zr) == NB_OK);
    size_t pb, ngt;
    nb_wq_sizes(m, k, &pb, &ngt);
    CHECK(memcmp(q.up, q2.up, pb) == 0 && memcmp(q.sc, q2.sc, ngt * 2) == 0 &&
          memcmp(q.zr, q2.zr, ngt * 2) == 0);
    qfree(&q2);
    free(d4), free(d8);
    qfree(&q);
}

static void test_quantize(void) {
    enum { M = 6, K = 384 };
    static float wf[M * K];
    static uint16_t wh[M * K];
    // Symmetric ranges around 0, several magnitudes.
    for (int i = 0; i < M * K; i++) wf[i] = frand() * (i / K + 1) * 0.05f;
    check_quant(wf, NB_DTYPE_F32, M, K, "f32 symmetric");
    // Asymmetric: all positive, and all negative with an offset.
    for (int i = 0; i < M * K; i++) wf[i] = (i / K) % 2 ? 1.5f + frand() : -7.0f + 0.25f * frand();
    check_quant(wf, NB_DTYPE_F32, M, K, "f32 asymmetric");
    // Heavy-tailed: one outlier per group.
    for (int i = 0; i < M * K; i++) wf[i] = frand() * 0.01f + (i % 128 == 37 ? 2.0f : 0.0f);
    check_quant(wf, NB_DTYPE_F32, M, K, "f32 outliers");
    for (int i = 0; i < M * K; i++) wh[i] = nb_f32_to_bf16(frand() * 0.1f);
    check_quant(wh, NB_DTYPE_BF16, M, K, "bf16");
    for (int i = 0; i < M * K; i++) wh[i] = nb_f32_to_f16(frand() * 3.0f - 1.0f);
    check_quant(wh, NB_DTYPE_F16, M, K, "f16");
    // k < 128: one group of k.
    check_quant(wf, NB_DTYPE_F32, 5, 64, "k=64");
    check_quant(wf, NB_DTYPE_F32, 3, 96, "k=96");
}

static void test_degenerate(void) {
    enum { K = 256 };
    float w[2 * K];
    // Constant groups of f16-representable values are exact in both views.
    const float cv[4] = {0.5f, -3.25f, 0.0f, 1024.0f};
    for (int i = 0; i < 2 * K; i++) w[i] = cv[i / 128];
    qbuf q = qalloc(2, K);
    CHECK(nb_wq_quantize(w, NB_DTYPE_F32, 2, K, q.up, q.lo, q.sc, q.zr) == NB_OK);
    float d[2 * K];
    nb_wq_tensor t = {q.up, q.lo, q.sc, q.zr};
    for (int v = 0; v < 2; v++) {
        nb_wq_dequantize(d, &t, v, 2, K);
        int bad = 0;
        for (int i = 0; i < 2 * K; i++) bad += d[i] != w[i];
        CHECKF(bad == 0, "constant rows view %d: %d inexact", v, bad);
    }
    for (int g = 0; g < 4; g++) CHECK(q.sc[g] == 0);
    for (int i = 0; i < K; i++) CHECK(q.up[i] == 0 && q.lo[i] == 0x88);
    // A group of two values {-1, 1}: min exact, max off only by 15 times
    // the rounding up of s.
    for (int i = 0; i < 128; i++) w[i] = (i & 1) ? 1.0f : -1.0f;
    CHECK(nb_wq_quantize(w, NB_DTYPE_F32, 1, 128, q.up, q.lo, q.sc, q.zr) == NB_OK);
    nb_wq_dequantize(d, &t, 0, 1, 128);
    double up_err = 15.0 * (nb_f16_to_f32(q.sc[0]) - 2.0 / 15.0) + 1e-6;
    int bad = 0;
    for (int i = 0; i < 128; i++) bad += (i & 1) ? fabsf(d[i] - w[i]) > up_err : d[i] != w[i];
    CHECK(bad == 0);
    // Non-finite weights are rejected and nothing is written.
    const float nf[3] = {NAN, INFINITY, -INFINITY};
    for (int v = 0; v < 3; v++) {
        for (int i = 0; i < 2 * K; i++) w[i] = frand();
        w[300] = nf[v];
        memset(q.up, 0xab, K);
        CHECK(nb_wq_quantize(w, NB_DTYPE_F32, 2, K, q.up, q.lo, q.sc, q.zr) == NB_ERR_NON_FINITE);
        CHECK(q.up[0] == 0xab && q.up[K - 1] == 0xab);
    }
    uint16_t wh[128] = {0};
    wh[5] = 0x7c00; // f16 +Inf
    CHECK(nb_wq_quantize(wh, NB_DTYPE_F16, 1, 128, q.up, q.lo, q.sc, q.zr) == NB_ERR_NON_FINITE);
    wh[5] = 0x7fc0; // bf16 NaN
    CHECK(nb_wq_quantize(wh, NB_DTYPE_BF16, 1, 128, q.up, q.lo, q.sc, q.zr) == NB_ERR_NON_FINITE);
    // A range beyond f16 is reported, not silently saturated.
    for (int i = 0; i < 128; i++) w[i] = i ? 0.0f : 1e7f;
    CHECK(nb_wq_quantize(w, NB_DTYPE_F32, 1, 128, q.up, q.lo, q.sc, q.zr) == NB_ERR_UNSUPPORTED);
    qfree(&q);
}

// Large matrices are quantized by several threads, each a range of rows:
// the codes must be those of the rows quantized one at a time (single
// threaded), and a non-finite weight in the last row must still leave every
// output unwritten.
static void test_threads(void) {
    enum { M = 4096 + 7, K = 256 };
    float *w = malloc(sizeof(float) * M * K);
    for (int i = 0; i < M * K; i++) w[i] = frand() * (1.0f + (float)(i % 977) / 97.0f);
    qbuf a = qalloc(M, K), b = qalloc(M, K);
    size_t pb = 0, ng = 0;
    CHECK(nb_wq_sizes(M, K, &pb, &ng) == NB_OK);
    CHECK(nb_wq_quantize(w, NB_DTYPE_F32, M, K, a.up, a.lo, a.sc, a.zr) == NB_OK);
    for (int j = 0; j < M; j++)
        CHECK(nb_wq_quantize(w + (size_t)j * K, NB_DTYPE_F32, 1, K, b.up + (size_t)j * K / 2,
                             b.lo + (size_t)j * K / 2, b.sc + (size_t)j * (K / 128),
                             b.zr + (size_t)j * (K / 128)) == NB_OK);
    CHECK(memcmp(a.up, b.up, pb) == 0 && memcmp(a.lo, b.lo, pb) == 0);
    CHECK(memcmp(a.sc, b.sc, ng * 2) == 0 && memcmp(a.zr, b.zr, ng * 2) == 0);
    w[(size_t)M * K - 3] = NAN;
    memset(a.up, 0xab, pb);
    CHECK(nb_wq_quantize(w, NB_DTYPE_F32, M, K, a.up, a.lo, a.sc, a.zr) == NB_ERR_NON_FINITE);
    int bad = 0;
    for (size_t i = 0; i < pb; i++) bad += a.up[i] != 0xab;
    CHECKF(bad == 0, "%d plane bytes written before the non-finite weight was reported", bad);
    qfree(&a);
    qfree(&b);
    free(w);
}

static void test_matmul_wq(void) {
    static const int shapes[][3] = {{1, 8, 256}, {5, 13, 384}, {3, 5, 64}, {2, 3, 96},
                                    {64, 72, 512}, {9, 1, 128}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int n = shapes[si][0], m = shapes[si][1], k = shapes[si][2];
        const int gs = nb_wq_group_size(k), ng = k / gs;
        float *x = malloc(sizeof(float) * n * k), *w = malloc(sizeof(float) * m * k);
        float *wd = malloc(sizeof(float) * m * k), *out = malloc(sizeof(float) * n * m);
        float *ref = malloc(sizeof(float) * n * m), *row = malloc(sizeof(float) * m);
        uint16_t *bias = malloc(2 * (size_t)m);
        for (int i = 0; i < n * k; i++) x[i] = frand();
        for (int i = 0; i < m * k; i++) w[i] = frand() * 0.05f + 0.01f;
        for (int j = 0; j < m; j++) bias[j] = nb_f32_to_bf16(frand());
        qbuf q = qalloc(m, k);
        CHECK(nb_wq_quantize(w, NB_DTYPE_F32, m, k, q.up, q.lo, q.sc, q.zr) == NB_OK);
        nb_wq_tensor t = {q.up, q.lo, q.sc, q.zr};
        for (int v = 0; v < 2; v++) {
            for (int wb = 0; wb < 2; wb++) {
                const void *b = wb ? bias : NULL;
                nb_ref_matmul_wq(out, x, &t, v, b, NB_DTYPE_BF16, n, m, k);
                nb_wq_dequantize(wd, &t, v, m, k);
                nb_ref_matmul(ref, x, wd, NB_DTYPE_F32, b, NB_DTYPE_BF16, n, m, k);
                int bad = 0, det_bad = 0;
                double worst = 0;
                for (int i = 0; i < n; i++) {
                    for (int j = 0; j < m; j++) {
                        // Exact value from the codes in double, and the magnitude
                        // the f32 sums are rounded against.
                        double exact = wb ? nb_bf16_to_f32(bias[j]) : 0.0, mag = fabs(exact);
                        for (int e = 0; e < k; e++) {
                            size_t idx = (size_t)j * k + e;
                            size_t gi = (size_t)j * ng + e / gs;
                            double s = nb_f16_to_f32(q.sc[gi]), z = nb_f16_to_f32(q.zr[gi]);
                            int U = nib(q.up, idx), L = nib(q.lo, idx) - 8;
                            double c = v ? (16 * U + L) * (s / 16) : U * s;
                            exact += x[i * k + e] * (c + z);
                            mag += fabs(x[i * k + e]) * (fabs(c) + fabs(z));
                        }
                        // 8-lane sums (gs/8 + 4 roundings), the group products
                        // and the sum over groups (ng + 2), and for the f32
                        // dequantize+matmul path its own k/8 + 5.
                        double tol = ((double)gs / 8 + ng + 8 + (double)k / 8 + 5) * FLT_EPSILON * mag;
                        double e1 = fabs(out[i * m + j] - exact), e2 = fabs(out[i * m + j] - ref[i * m + j]);
                        bad += e1 > tol || e2 > tol;
                        if (e2 / tol > worst) worst = e2 / tol;
                    }
                }
                CHECKF(bad == 0, "matmul_wq %dx%dx%d view %d bias %d: %d off (worst %.3g)", n, m,
                       k, v, wb, bad, worst);
                for (int i = 0; i < n; i++) {
                    nb_ref_matmul_wq(row, x + i * k, &t, v, b, NB_DTYPE_BF16, 1, m, k);
                    det_bad += memcmp(row, out + i * m, sizeof(float) * m) != 0;
                }
                CHECKF(det_bad == 0, "matmul_wq %dx%dx%d not row-invariant", n, m, k);
            }
        }
        qfree(&q);
        free(x), free(w), free(wd), free(out), free(ref), free(row), free(bias);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench(void) {
    const int m = 512, k = 512;
    float *x = malloc(sizeof(float) * 64 * k), *out = malloc(sizeof(float) * 64 * m);
    float *w = malloc(sizeof(float) * m * k);
    for (int i = 0; i < 64 * k; i++) x[i] = frand();
    for (int i = 0; i < m * k; i++) w[i] = frand();
    qbuf q = qalloc(m, k);
    nb_wq_quantize(w, NB_DTYPE_F32, m, k, q.up, q.lo, q.sc, q.zr);
    nb_wq_tensor t = {q.up, q.lo, q.sc, q.zr};
    for (int v = 0; v < 2; v++) {
        for (int n = 1; n <= 64; n *= 64) {
            int reps = 0;
            double t0 = now_s(), el;
            do {
                nb_ref_matmul_wq(out, x, &t, v, NULL, NB_DTYPE_F32, n, m, k);
                reps++;
                el = now_s() - t0;
            } while (el < 0.5);
            printf("bench matmul_wq n=%d m=%d k=%d %s: %.2f GFLOP/s (%.1f us/call)\n", n, m, k,
                   v ? "8-bit" : "4-bit", 2.0 * n * m * k * reps / el * 1e-9, el / reps * 1e6);
        }
    }
    qfree(&q);
    free(x), free(out), free(w);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench();
        return 0;
    }
    test_sizes();
    test_quantize();
    test_degenerate();
    test_threads();
    test_matmul_wq();
    return nb_test_finish("test_wquant");
}
