// test_ops_ref.c: the dense reference ops against straightforward
// double-precision loops, plus the exact contracts (8-lane order, bitwise
// determinism across the thread split, exact dtype conversion).
// `test_ops_ref --bench` also prints matmul GFLOP/s (never fails on speed).
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "nb_test.h"
#include "ops_ref.h"

// f32 sums of n products in the 8-lane order: each lane adds ceil(n/8) terms
// and the tree adds 3 levels, so |error| <= (n/8 + 4) * eps * sum|terms|.
#define LANE_RTOL(n) (((double)(n) / 8.0 + 4.0) * FLT_EPSILON)
// Elementwise ops built from a handful of correctly rounded f32 operations
// and libm expf/sqrtf/cosf/sinf (<= 1-2 ulp): relative tolerance.
#define ELEM_RTOL 4e-6
// powf in f32 plus a rounded exponent (2i/D when D is not a power of two):
// inv_freq relative tolerance against the double formula.
#define INV_FREQ_RTOL 4e-6

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static float frand(void) { // uniform in [-1, 1)
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * 0x1p-24) * 2.0f - 1.0f;
}

static void fill(void *buf, nb_dtype dt, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) nb_store_f32(buf, dt, i, frand() * scale);
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_convert(void) {
    static float out[65536];
    static uint16_t src[65536];
    for (int i = 0; i < 65536; i++) src[i] = (uint16_t)i;
    nb_ref_convert_to_f32(out, src, NB_DTYPE_F16, 65536);
    int bad = 0;
    for (int i = 0; i < 65536; i++) bad += !same_bits(out[i], nb_f16_to_f32((uint16_t)i));
    CHECKF(bad == 0, "%d f16 values differ", bad);
    nb_ref_convert_to_f32(out, src, NB_DTYPE_BF16, 65536);
    bad = 0;
    for (int i = 0; i < 65536; i++) bad += !same_bits(out[i], nb_bf16_to_f32((uint16_t)i));
    CHECKF(bad == 0, "%d bf16 values differ", bad);
    // odd length (scalar tail)
    nb_ref_convert_to_f32(out, src + 0x3c00, NB_DTYPE_F16, 11);
    CHECK(out[0] == 1.0f && out[10] == nb_f16_to_f32(0x3c0a));
    // The saturating f32 -> f16 (the draft's quantized inputs on the GPU):
    // finite values past the range to +-65504, the rest as nb_f32_to_f16.
    CHECK(nb_f32_to_f16_sat(65520.0f) == 0x7bffu && nb_f32_to_f16(65520.0f) == 0x7c00u);
    CHECK(nb_f32_to_f16_sat(-3.0e38f) == 0xfbffu);
    CHECK(nb_f32_to_f16_sat(65519.0f) == 0x7bffu && nb_f32_to_f16_sat(65504.0f) == 0x7bffu);
    CHECK(nb_f32_to_f16_sat(INFINITY) == 0x7c00u && nb_f32_to_f16_sat(-INFINITY) == 0xfc00u);
    CHECK((nb_f32_to_f16_sat(NAN) & 0x7fffu) > 0x7c00u);
    bad = 0;
    for (int i = 0; i < 65536; i++) {
        const float f = nb_f16_to_f32((uint16_t)i);  // every f16 value comes back unchanged
        bad += (i & 0x7fff) <= 0x7c00 && nb_f32_to_f16_sat(f) != (uint16_t)i;
    }
    CHECKF(bad == 0, "%d f16 values not kept by the saturating conversion", bad);
}

// The documented 8-lane order, written out plainly.
static float lane_dot(const float *x, const float *w, int k) {
    float a[8] = {0};
    for (int t = 0; t < k; t++) a[t % 8] += x[t] * w[t];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

static void test_matmul(void) {
    static const int shapes[][3] = {{1, 1, 1},   {1, 5, 8},    {3, 7, 13},  {2, 9, 515},
                                    {17, 33, 100}, {9, 4, 1024}, {1, 256, 512}, {64, 72, 520}};
    const nb_dtype dts[3] = {NB_DTYPE_F32, NB_DTYPE_F16, NB_DTYPE_BF16};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int n = shapes[si][0], m = shapes[si][1], k = shapes[si][2];
        for (int di = 0; di < 3; di++) {
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                nb_dtype dt = dts[di], bdt = dts[(di + 1) % 3];
                float *x = malloc(sizeof(float) * n * k);
                void *w = malloc(4 * (size_t)m * k);
                void *b = malloc(4 * (size_t)m);
                float *out = malloc(sizeof(float) * n * m);
                float *wf = malloc(sizeof(float) * m * k);
                fill(x, NB_DTYPE_F32, (size_t)n * k, 1.0f);
                fill(w, dt, (size_t)m * k, 0.5f);
                fill(b, bdt, (size_t)m, 2.0f);
                for (size_t i = 0; i < (size_t)m * k; i++) wf[i] = nb_load_f32(w, dt, i);
                nb_ref_matmul(out, x, w, dt, with_bias ? b : NULL, bdt, n, m, k);
                double worst = 0;
                int exact_bad = 0;
                for (int i = 0; i < n; i++) {
                    for (int j = 0; j < m; j++) {
                        double ref = 0, mag = 0;
                        for (int t = 0; t < k; t++) {
                            double pr = (double)x[i * k + t] * wf[(size_t)j * k + t];
                            ref += pr;
                            mag += fabs(pr);
                        }
                        float bj = with_bias ? nb_load_f32(b, bdt, j) : 0.0f;
                        ref += bj;
                        double err = fabs(out[i * m + j] - ref) / (LANE_RTOL(k) * mag + 1e-30 +
                                                                   FLT_EPSILON * fabs(ref));
                        if (err > worst) worst = err;
                        float ex = lane_dot(x + i * k, wf + (size_t)j * k, k);
                        if (with_bias) ex += bj;
                        exact_bad += !same_bits(ex, out[i * m + j]);
                    }
                }
                CHECKF(worst <= 1.0, "matmul %dx%dx%d %s bias=%d: error %.3g of tolerance", n, m,
                       k, nb_dtype_name(dt), with_bias, worst);
                CHECKF(exact_bad == 0, "matmul %dx%dx%d %s: %d outputs off the 8-lane order", n,
                       m, k, nb_dtype_name(dt), exact_bad);
                // Row by row (never threaded) must be bit-identical.
                float *row = malloc(sizeof(float) * m);
                int det_bad = 0;
                for (int i = 0; i < n; i++) {
                    nb_ref_matmul(row, x + i * k, w, dt, with_bias ? b : NULL, bdt, 1, m, k);
                    det_bad += memcmp(row, out + i * m, sizeof(float) * m) != 0;
                }
                CHECKF(det_bad == 0, "matmul %dx%dx%d not row-invariant", n, m, k);
                free(row);
                free(x), free(w), free(b), free(out), free(wf);
            }
        }
    }
}

static void test_rmsnorm(void) {
    const int n = 5, d = 300;
    const float eps = 1e-5f;
    const nb_dtype dts[3] = {NB_DTYPE_F32, NB_DTYPE_F16, NB_DTYPE_BF16};
    float x[5 * 300], out[5 * 300];
    uint16_t wbuf[2 * 300];
    fill(x, NB_DTYPE_F32, (size_t)n * d, 3.0f);
    for (int di = 0; di < 3; di++) {
        fill(wbuf, dts[di], (size_t)d, 2.0f);
        nb_ref_rmsnorm(out, x, wbuf, dts[di], n, d, eps);
        int bad = 0;
        for (int i = 0; i < n; i++) {
            double ss = 0;
            for (int j = 0; j < d; j++) ss += (double)x[i * d + j] * x[i * d + j];
            double r = 1.0 / sqrt(ss / d + eps);
            for (int j = 0; j < d; j++) {
                double ref = x[i * d + j] * r * nb_load_f32(wbuf, dts[di], (size_t)j);
                bad += fabs(out[i * d + j] - ref) > ELEM_RTOL * fabs(ref) + 1e-30;
            }
        }
        CHECKF(bad == 0, "rmsnorm %s: %d elements off", nb_dtype_name(dts[di]), bad);
    }
    // in place
    float y[5 * 300];
    memcpy(y, x, sizeof x);
    nb_ref_rmsnorm(y, y, wbuf, NB_DTYPE_BF16, n, d, eps);
    CHECK(memcmp(y, out, sizeof y) == 0);

    // The documented 64-lane order of the sum of squares, written out
    // plainly, against the vectorised loop bit for bit (f32 weights of 1,
    // so out = x * r exactly as the reference rounds it).
    const int ds[5] = {8, 64, 300, 4096, 4163};
    for (int di = 0; di < 5; di++) {
        const int dd = ds[di];
        float *xr = malloc(sizeof(float) * dd), *o = malloc(sizeof(float) * dd), *w1 = malloc(sizeof(float) * dd);
        fill(xr, NB_DTYPE_F32, (size_t)dd, 40.0f);
        for (int j = 0; j < dd; j++) w1[j] = 1.0f;
        nb_ref_rmsnorm(o, xr, w1, NB_DTYPE_F32, 1, dd, eps);
        float a[64] = {0}, b[8];
        for (int j = 0; j < dd; j++) {
            const float t = xr[j] * xr[j];
            a[j % 64] = a[j % 64] + t;
        }
        for (int e = 0; e < 8; e++)
            b[e] = ((a[e] + a[8 + e]) + (a[16 + e] + a[24 + e])) + ((a[32 + e] + a[40 + e]) + (a[48 + e] + a[56 + e]));
        const float ss = ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
        const float r = 1.0f / sqrtf(ss / (float)dd + eps);
        int off = 0;
        for (int j = 0; j < dd; j++) off += nb_f32_bits(o[j]) != nb_f32_bits((xr[j] * r) * 1.0f);
        CHECKF(off == 0, "rmsnorm d=%d: %d outputs off the 64-lane order", dd, off);
        free(xr), free(o), free(w1);
    }
}

static double llama3_ref(double base, double factor, double lo, double hi, double orig) {
    double wl = 2 * M_PI / base;
    if (wl < orig / hi) return base;
    if (wl > orig / lo) return base / factor;
    double s = (orig / wl - lo) / (hi - lo);
    return (1 - s) * base / factor + s * base;
}

static void test_rope(void) {
    float inv[128];
    // Default frequencies, D not a power of two too.
    const int Ds[3] = {64, 96, 128};
    for (int di = 0; di < 3; di++) {
        int D = Ds[di];
        CHECK(nb_ref_rope_inv_freq(inv, D, 10000.0f, NULL) == NB_OK);
        int bad = 0;
        for (int i = 0; i < D / 2; i++) {
            double ref = 1.0 / pow(10000.0, 2.0 * i / D);
            bad += fabs(inv[i] - ref) > INV_FREQ_RTOL * ref;
        }
        CHECKF(bad == 0, "inv_freq D=%d: %d off", D, bad);
    }
    // Llama 3.1 scaling (the released config), computed independently in double.
    nb_rope_scaling sc = {NB_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192};
    CHECK(nb_ref_rope_inv_freq(inv, 128, 500000.0f, &sc) == NB_OK);
    int bad = 0, n_hi = 0, n_lo = 0, n_mid = 0;
    for (int i = 0; i < 64; i++) {
        double base = 1.0 / pow(500000.0, 2.0 * i / 128);
        double ref = llama3_ref(base, 8, 1, 4, 8192);
        double wl = 2 * M_PI / base;
        n_hi += wl < 2048;
        n_lo += wl > 8192;
        n_mid += wl >= 2048 && wl <= 8192;
        bad += fabs(inv[i] - ref) > INV_FREQ_RTOL * ref;
    }
    CHECKF(bad == 0, "llama3 inv_freq: %d off", bad);
    CHECK(n_hi > 0 && n_lo > 0 && n_mid > 0); // all three branches exercised
    // Smaller original context: different thresholds.
    nb_rope_scaling sc2 = {NB_ROPE_LLAMA3, 32.0f, 1.0f, 4.0f, 4096};
    CHECK(nb_ref_rope_inv_freq(inv, 64, 10000.0f, &sc2) == NB_OK);
    bad = 0;
    for (int i = 0; i < 32; i++) {
        double ref = llama3_ref(1.0 / pow(10000.0, 2.0 * i / 64), 32, 1, 4, 4096);
        bad += fabs(inv[i] - ref) > INV_FREQ_RTOL * ref;
    }
    CHECK(bad == 0);
    nb_rope_scaling lin = {NB_ROPE_LINEAR, 4.0f, 0, 0, 0};
    CHECK(nb_ref_rope_inv_freq(inv, 64, 10000.0f, &lin) == NB_OK);
    CHECK(fabs(inv[5] - 1.0 / pow(10000.0, 10.0 / 64) / 4) < INV_FREQ_RTOL * inv[5]);
    CHECK(nb_ref_rope_inv_freq(inv, 63, 10000.0f, NULL) == NB_ERR_INVALID_ARG);
    nb_rope_scaling badsc = {NB_ROPE_LLAMA3, 8.0f, 4.0f, 1.0f, 8192};
    CHECK(nb_ref_rope_inv_freq(inv, 64, 10000.0f, &badsc) == NB_ERR_INVALID_ARG);

    // Apply: identity at position 0, rotate_half pairing vs double, norms kept.
    enum { N = 4, H = 3, D = 64 };
    float x[N * H * D], x0[N * H * D];
    int32_t pos[N] = {0, 1, 77, 131071};
    fill(x, NB_DTYPE_F32, N * H * D, 2.0f);
    memcpy(x0, x, sizeof x);
    CHECK(nb_ref_rope_inv_freq(inv, D, 10000.0f, NULL) == NB_OK);
    nb_ref_rope_apply(x, pos, N, H, D, inv);
    CHECK(memcmp(x, x0, sizeof(float) * H * D) == 0);
    int off = 0, norm_bad = 0;
    for (int t = 0; t < N; t++) {
        for (int h = 0; h < H; h++) {
            const float *a = x0 + (t * H + h) * D, *b = x + (t * H + h) * D;
            for (int i = 0; i < D / 2; i++) {
                double ang = (double)((float)pos[t] * inv[i]);
                double c = cos(ang), s = sin(ang);
                double r0 = a[i] * c - a[i + D / 2] * s, r1 = a[i + D / 2] * c + a[i] * s;
                double mag = fabs(a[i]) + fabs(a[i + D / 2]);
                off += fabs(b[i] - r0) > ELEM_RTOL * mag || fabs(b[i + D / 2] - r1) > ELEM_RTOL * mag;
                double n0 = (double)a[i] * a[i] + (double)a[i + D / 2] * a[i + D / 2];
                double n1 = (double)b[i] * b[i] + (double)b[i + D / 2] * b[i + D / 2];
                norm_bad += fabs(n1 - n0) > 2 * ELEM_RTOL * n0 + 1e-30;
            }
        }
    }
    CHECKF(off == 0, "rope apply: %d pairs off", off);
    CHECKF(norm_bad == 0, "rope apply: %d pair norms changed", norm_bad);
}

static void test_small_ops(void) {
    enum { N = 1000 };
    float g[N], u[N], o[N];
    fill(g, NB_DTYPE_F32, N, 20.0f);
    fill(u, NB_DTYPE_F32, N, 3.0f);
    g[0] = -100.0f, g[1] = 100.0f, g[2] = 0.0f;
    nb_ref_silu_mul(o, g, u, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        double ref = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        bad += fabs(o[i] - ref) > ELEM_RTOL * fabs(ref) + 1e-37;
    }
    CHECKF(bad == 0, "silu_mul: %d off", bad);
    nb_ref_add(o, g, u, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += o[i] != g[i] + u[i];
    CHECK(bad == 0);

    float sx[5] = {1.0f, 3.0f, -INFINITY, 3.0f, 2.0f}, sp[5];
    CHECK(nb_ref_argmax(sx, 5) == 1);
    CHECK(nb_ref_softmax(sp, sx, 5) == NB_OK);
    double z = exp(1) + 2 * exp(3) + exp(2);
    CHECK(fabs(sp[0] - exp(1) / z) < ELEM_RTOL && sp[2] == 0.0f && sp[1] == sp[3]);
    float nanx[2] = {NAN, 1.0f};
    CHECK(nb_ref_argmax(nanx, 2) == 1);
    CHECK(nb_ref_softmax(sp, nanx, 2) == NB_ERR_NON_FINITE);
    float allneg[2] = {-INFINITY, -INFINITY};
    CHECK(nb_ref_softmax(sp, allneg, 2) == NB_ERR_NON_FINITE);

    // Embedding: bf16 table, exact conversion, bad ids rejected.
    uint16_t table[10 * 12];
    fill(table, NB_DTYPE_BF16, 120, 1.0f);
    int32_t ids[3] = {9, 0, 4};
    float e[3 * 12];
    CHECK(nb_ref_embed(e, table, NB_DTYPE_BF16, ids, 3, 12, 10) == NB_OK);
    bad = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 12; j++) bad += e[i * 12 + j] != nb_bf16_to_f32(table[ids[i] * 12 + j]);
    CHECK(bad == 0);
    int32_t badid[2] = {1, 10};
    CHECK(nb_ref_embed(e, table, NB_DTYPE_BF16, badid, 2, 12, 10) == NB_ERR_INVALID_ARG);
    badid[1] = -1;
    CHECK(nb_ref_embed(e, table, NB_DTYPE_BF16, badid, 2, 12, 10) == NB_ERR_INVALID_ARG);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench(void) {
    const int m = 512, k = 512;
    const int ns[2] = {1, 64};
    const nb_dtype dts[2] = {NB_DTYPE_F32, NB_DTYPE_BF16};
    float *x = malloc(sizeof(float) * 64 * k), *out = malloc(sizeof(float) * 64 * m);
    void *w = malloc(4 * (size_t)m * k);
    fill(x, NB_DTYPE_F32, (size_t)64 * k, 1.0f);
    for (int di = 0; di < 2; di++) {
        fill(w, dts[di], (size_t)m * k, 1.0f);
        for (int ni = 0; ni < 2; ni++) {
            int n = ns[ni], reps = 0;
            double t0 = now_s(), t;
            do {
                nb_ref_matmul(out, x, w, dts[di], NULL, NB_DTYPE_F32, n, m, k);
                reps++;
                t = now_s() - t0;
            } while (t < 0.5);
            printf("bench matmul n=%d m=%d k=%d %s: %.2f GFLOP/s (%.1f us/call)\n", n, m, k,
                   nb_dtype_name(dts[di]), 2.0 * n * m * k * reps / t * 1e-9, t / reps * 1e6);
        }
    }
    free(x), free(out), free(w);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench();
        return 0;
    }
    test_convert();
    test_matmul();
    test_rmsnorm();
    test_rope();
    test_small_ops();
    return nb_test_finish("test_ops_ref");
}
