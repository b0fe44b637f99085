// test_kv_quant.c: the KV quantization reference against its math (error
// bounds of both views, the clamp case, C8 = 16*U + L, code ranges, step
// rounding), degenerate groups, NaN/Inf rejection, the byte layout, and the
// block work items on a small pool with non-contiguous block ids.
//
// Tolerance: exact-arithmetic bounds are S/2 (draft), S/32 (target) and S/16
// (target, clamp case); the f32 evaluation adds at most a few roundings of
// relative 2^-24 on quantities bounded by |x| + |Z| + 16*S, plus subnormal
// absolute rounding (S/16 rounded to an f32 subnormal, then multiplied by
// |C8| <= 247, is the largest: < 2^-142), so every check allows
// SLACK = 2^-20*(|x|+|Z|+16S) + 2^-140 (kv_quant.h derives it).
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_layout.h"
#include "kv_quant.h"
#include "nb_dtype.h"
#include "nb_test.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_uniform(void) { return (double)(rng_next() >> 11) * 0x1p-53; } // [0,1)
static double rng_normal(void) {
    double u = rng_uniform() + 0x1p-54, v = rng_uniform();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static const nb_dtype DTYPES[3] = {NB_DTYPE_F32, NB_DTYPE_F16, NB_DTYPE_BF16};

static double slack(double x, double z, double s) {
    return 0x1p-20 * (fabs(x) + fabs(z) + 16.0 * s) + 0x1p-140;
}

// The dtype value just below s > 0.
static double dtype_prev(float s, nb_dtype dt) {
    if (dt == NB_DTYPE_F16) return nb_f16_to_f32((uint16_t)(nb_f32_to_f16(s) - 1));
    if (dt == NB_DTYPE_BF16) return nb_bf16_to_f32((uint16_t)(nb_f32_to_bf16(s) - 1));
    return nextafterf(s, 0.0f);
}

typedef struct stats {
    long n_values, n_clamp, n_groups;
    double max_draft, max_target, max_target_noclamp; // errors in units of S
} stats;

// Quantize src ([G][D] in dt) as K (per_channel) or V and check every bound.
static void check_groups(int G, int D, nb_dtype dt, const void *src, int per_channel, stats *st) {
    const int n_groups = per_channel ? D : G, n_per = per_channel ? G : D;
    const size_t es = nb_dtype_size(dt);
    uint8_t *upper = malloc((size_t)G * D / 2), *lower = malloc((size_t)G * D / 2);
    void *scale = malloc((size_t)n_groups * es), *zero = malloc((size_t)n_groups * es);
    float *draft = malloc(sizeof(float) * G * D), *target = malloc(sizeof(float) * G * D);
    nb_status s1 = per_channel ? nb_kv_quantize_k(G, D, dt, src, upper, lower, scale, zero)
                               : nb_kv_quantize_v(G, D, dt, src, upper, lower, scale, zero);
    CHECKF(s1 == NB_OK, "quantize: %s", nb_status_str(s1));
    nb_status s2 = per_channel
        ? nb_kv_dequantize_k(G, D, dt, upper, NULL, scale, zero, NB_KV_VIEW_DRAFT, draft)
        : nb_kv_dequantize_v(G, D, dt, upper, NULL, scale, zero, NB_KV_VIEW_DRAFT, draft);
    nb_status s3 = per_channel
        ? nb_kv_dequantize_k(G, D, dt, upper, lower, scale, zero, NB_KV_VIEW_TARGET, target)
        : nb_kv_dequantize_v(G, D, dt, upper, lower, scale, zero, NB_KV_VIEW_TARGET, target);
    CHECK(s2 == NB_OK && s3 == NB_OK);

    for (int g = 0; g < n_groups; g++) {
        double mn = INFINITY, mx = -INFINITY;
        for (int i = 0; i < n_per; i++) {
            size_t at = per_channel ? (size_t)i * D + g : (size_t)g * D + i;
            double x = nb_load_f32(src, dt, at);
            mn = x < mn ? x : mn;
            mx = x > mx ? x : mx;
        }
        const float s = nb_load_f32(scale, dt, g), z = nb_load_f32(zero, dt, g);
        const double s_exact = (mx - mn) / 15.0;
        CHECKF(s >= s_exact, "S %.9g < exact %.9g", s, s_exact);
        CHECKF(s == 0.0f ? s_exact == 0.0 : dtype_prev(s, dt) < s_exact,
               "S %.9g not the smallest dtype value >= %.9g", s, s_exact);
        CHECK((double)z == mn);
        st->n_groups++;
        for (int i = 0; i < n_per; i++) {
            const int t = per_channel ? i : g, c = per_channel ? g : i;
            const size_t at = (size_t)t * D + c;
            const double x = nb_load_f32(src, dt, at);
            const int u = nb_kv_nibble_get(upper + (size_t)t * (D / 2), c);
            const int l = nb_kv_nibble_get(lower + (size_t)t * (D / 2), c) - NB_KV_LOWER_BIAS;
            const int c8 = 16 * u + l;
            const double sl = slack(x, z, s);
            CHECK(u >= 0 && u <= 15 && l >= -8 && l <= 7 && c8 >= -8 && c8 <= 247);
            if (s == 0.0f) CHECK(u == 0 && l == 0 && draft[at] == z && target[at] == z);
            int ue, le;
            nb_kv_encode((float)x, s, z, &ue, &le);
            CHECK(ue == u && le == l);
            // C8 reconstructs the target value; U alone the draft value.
            CHECKF(fabs(target[at] - (c8 * (double)s / 16.0 + z)) <= sl, "C8 identity");
            CHECKF(fabs(target[at] - (u * (double)s + l * (double)s / 16.0 + z)) <= sl, "U*S+L*S/16+Z");
            CHECK(fabs(draft[at] - (u * (double)s + z)) <= sl);
            CHECK(target[at] == nb_kv_decode(u, l, s, z, NB_KV_VIEW_TARGET));
            CHECK(draft[at] == nb_kv_decode(u, 0, s, z, NB_KV_VIEW_DRAFT));

            const double ed = fabs(x - draft[at]), et = fabs(x - target[at]);
            CHECKF(ed <= s / 2.0 + sl, "draft err %.9g > S/2 (S %.9g, x %.9g)", ed, s, x);
            if (et <= s / 32.0 + sl) {
                if (s > 0 && et / s > st->max_target_noclamp) st->max_target_noclamp = et / s;
            } else {
                // The clamp case: L = 7 and the residual in the top 1/32 of S.
                const double r = x - draft[at];
                CHECKF(l == 7 && r >= 15.0 * s / 32.0 - sl,
                       "target err %.9g > S/32 outside the clamp case (S %.9g, l %d, r %.9g)", et,
                       s, l, r);
                CHECKF(et <= s / 16.0 + sl, "clamp err %.9g > S/16 (S %.9g)", et, s);
                st->n_clamp++;
            }
            if (s > 0 && ed / s > st->max_draft) st->max_draft = ed / s;
            if (s > 0 && et / s > st->max_target) st->max_target = et / s;
            st->n_values++;
        }
    }
    free(upper); free(lower); free(scale); free(zero); free(draft); free(target);
}

// Fill [n] of dt with f(i) rounded to dt.
static void *make_src(size_t n, nb_dtype dt) { return malloc(n * nb_dtype_size(dt)); }

enum { DIST_NORMAL, DIST_OFFSET, DIST_TIES, DIST_OUTLIER, DIST_N };

static void fill(void *src, nb_dtype dt, size_t n, int D, int dist) {
    const double off = (rng_uniform() - 0.5) * 20.0, scl = 0.01 + rng_uniform() * 4.0;
    for (size_t i = 0; i < n; i++) {
        double x;
        switch (dist) {
        case DIST_NORMAL: x = rng_normal() * scl; break;
        case DIST_OFFSET: x = off + rng_uniform() * scl; break;
        case DIST_TIES: x = (double)(rng_next() % 31) * 0.5; break; // S = 1: exact ties
        default: x = rng_normal() * 0.1 + ((rng_next() % 97) == 0 ? 50.0 : 0.0); break;
        }
        nb_store_f32(src, dt, i, (float)x);
    }
    if (dist == DIST_TIES) { // force range [0, 15] in every K group and V group
        for (size_t i = 0; i < n; i++) {
            const size_t t = i / D, c = i % D;
            if (t == 0 || c == 0) nb_store_f32(src, dt, i, 0.0f);
            else if (t == 1 || c == 1) nb_store_f32(src, dt, i, 15.0f);
        }
    }
}

static void test_random_groups(void) {
    const int Ds[] = {8, 64, 128, 256}, Gs[] = {64, 128, 256};
    stats st = {0};
    for (int di = 0; di < 3; di++)
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 3; b++)
                for (int dist = 0; dist < DIST_N; dist++) {
                    const int D = Ds[a], G = Gs[b];
                    const nb_dtype dt = DTYPES[di];
                    void *src = make_src((size_t)G * D, dt);
                    fill(src, dt, (size_t)G * D, D, dist);
                    check_groups(G, D, dt, src, 1, &st);
                    check_groups(G, D, dt, src, 0, &st);
                    free(src);
                }
    printf("random groups: %ld values in %ld groups; max err/S draft %.4f target %.5f "
           "(non-clamp %.5f, bound 1/32 = %.5f); clamp cases %ld\n",
           st.n_values, st.n_groups, st.max_draft, st.max_target, st.max_target_noclamp,
           1.0 / 32, st.n_clamp);
    CHECKF(st.n_clamp > 0, "the clamp case was never exercised");
    CHECK(st.max_target > 1.0 / 32 && st.max_target <= 1.0 / 16 + 1e-6);
}

// A hand-computed group (f32, S = 1, Z = 0): codes fixed bit for bit.
static void test_known_codes(void) {
    // x:        0    15   0.5  7.3  1.49 14.99 3    8.25
    // U:        0    15   0    7    1    15    3    8       (0.5 ties to even 0)
    // L:        0    0    7*   5    7*   0     0    4       (* clamped from 8)
    const float x[8] = {0.0f, 15.0f, 0.5f, 7.3f, 1.49f, 14.99f, 3.0f, 8.25f};
    const uint8_t want_u[4] = {0xf0, 0x70, 0xf1, 0x83}, want_l[4] = {0x88, 0xdf, 0x8f, 0xc8};
    uint8_t up[4], lo[4];
    float s, z;
    CHECK(nb_kv_quantize_v(1, 8, NB_DTYPE_F32, x, up, lo, &s, &z) == NB_OK);
    CHECK(s == 1.0f && z == 0.0f);
    CHECK(memcmp(up, want_u, 4) == 0 && memcmp(lo, want_l, 4) == 0);
    float t[8];
    CHECK(nb_kv_dequantize_v(1, 8, NB_DTYPE_F32, up, lo, &s, &z, NB_KV_VIEW_TARGET, t) == NB_OK);
    CHECK(t[2] == 0.4375f && fabsf(t[2] - x[2]) == 1.0f / 16); // clamp case at its bound S/16
    // The same values as channel 0 of a K group (channel 1 constant).
    float xk[16];
    for (int i = 0; i < 8; i++) { xk[2 * i] = x[i]; xk[2 * i + 1] = -2.5f; }
    uint8_t uk[8], lk[8];
    float sk[2], zk[2];
    CHECK(nb_kv_quantize_k(8, 2, NB_DTYPE_F32, xk, uk, lk, sk, zk) == NB_OK);
    CHECK(sk[0] == 1.0f && zk[0] == 0.0f && sk[1] == 0.0f && zk[1] == -2.5f);
    for (int i = 0; i < 8; i++) {
        int u = (want_u[i / 2] >> (4 * (i % 2))) & 0xf, l = (want_l[i / 2] >> (4 * (i % 2))) & 0xf;
        CHECK(uk[i] == nb_kv_nibble_pack(u, 0) && lk[i] == nb_kv_nibble_pack(l, 8));
    }
    // Step rounding: 1/15 is not an f16 value; the next one up is 0x2c45.
    CHECK(nb_kv_scale_round_up(1.0 / 15.0, NB_DTYPE_F16) == nb_f16_to_f32(0x2c45));
    CHECK(nb_kv_scale_round_up(1.0 / 15.0, NB_DTYPE_F32) >= 1.0 / 15.0);
    CHECK(nb_kv_scale_round_up(0x1p-30, NB_DTYPE_F16) == nb_f16_to_f32(1)); // smallest subnormal
    CHECK(nb_kv_scale_round_up(0.0, NB_DTYPE_BF16) == 0.0f);
}

// Degenerate groups: fill every K group (channel) and V group (token) with
// pattern values, for all dtypes and a couple of shapes.
static void test_degenerate(void) {
    stats st = {0};
    for (int di = 0; di < 3; di++) {
        const nb_dtype dt = DTYPES[di];
        const int G = 64, D = 8;
        const size_t n = (size_t)G * D;
        void *src = make_src(n, dt);
        for (int pat = 0; pat < 8; pat++) {
            for (size_t i = 0; i < n; i++) {
                const size_t t = i / D, c = i % D;
                double x;
                switch (pat) {
                case 0: x = 3.25; break;                                    // constant
                case 1: x = 0.0; break;                                     // all zero
                case 2: x = ((t + c) % 2) ? 1.5 : -0.75; break;             // two values
                case 3: x = (t == 5 || c == 3) ? 1000.0 : 0.001 * (double)c; break; // outlier
                case 4: x = ((int)((t + c) % 3) - 1) * (dt == NB_DTYPE_F16 ? 60000.0 : 1e30);
                        break;                                              // huge
                case 5: x = (double)((t * 7 + c) % 11) * 0x1p-24; break;    // f16 subnormals
                case 6: x = (double)((t * 5 + c) % 13) * 0x1p-140; break;   // f32/bf16 subnormal
                default: x = 1.0 + (double)((t + c) % 2) * 0x1p-10; break;  // tiny range
                }
                nb_store_f32(src, dt, i, (float)x);
            }
            check_groups(G, D, dt, src, 1, &st);
            check_groups(G, D, dt, src, 0, &st);
        }
        free(src);
    }
    // Constant groups dequantize exactly (checked inside check_groups); the
    // +-60000 f16 and +-1e30 groups stay finite in both views.
    printf("degenerate groups: %ld values, max err/S draft %.4f target %.5f\n", st.n_values,
           st.max_draft, st.max_target);
}

// NaN, +-Inf and over-range values reject the group and write nothing.
static void test_non_finite(void) {
    const int G = 64, D = 8;
    for (int di = 0; di < 3; di++) {
        const nb_dtype dt = DTYPES[di];
        const size_t n = (size_t)G * D, es = nb_dtype_size(dt);
        void *src = make_src(n, dt);
        const float bad[4] = {NAN, INFINITY, -INFINITY, 1e38f};
        for (int k = 0; k < 4; k++) {
            if (dt == NB_DTYPE_F16 && k == 3) continue; // 1e38 is Inf in f16 (covered)
            for (size_t i = 0; i < n; i++) nb_store_f32(src, dt, i, (float)rng_normal());
            nb_store_f32(src, dt, (size_t)(rng_next() % n), bad[k]);
            for (int kv = 0; kv < 2; kv++) {
                uint8_t up[256], lo[256], sc[512], ze[512], ref[512];
                memset(up, 0xa5, sizeof up); memset(lo, 0xa5, sizeof lo);
                memset(sc, 0xa5, sizeof sc); memset(ze, 0xa5, sizeof ze);
                memset(ref, 0xa5, sizeof ref);
                nb_status s = kv ? nb_kv_quantize_v(G, D, dt, src, up, lo, sc, ze)
                                 : nb_kv_quantize_k(G, D, dt, src, up, lo, sc, ze);
                CHECKF(s == NB_ERR_NON_FINITE, "%s bad %d kv %d: %s", nb_dtype_name(dt), k, kv,
                       nb_status_str(s));
                CHECK(memcmp(up, ref, sizeof up) == 0 && memcmp(lo, ref, sizeof lo) == 0);
                CHECK(memcmp(sc, ref, G * es) == 0 && memcmp(ze, ref, G * es) == 0);
            }
        }
        free(src);
    }
    float x[8] = {0};
    uint8_t b[4];
    float s, z;
    CHECK(nb_kv_quantize_v(1, 7, NB_DTYPE_F32, x, b, b, &s, &z) == NB_ERR_INVALID_ARG);
    CHECK(nb_kv_quantize_v(0, 8, NB_DTYPE_F32, x, b, b, &s, &z) == NB_ERR_INVALID_ARG);
    CHECK(nb_kv_quantize_v(1, 8, NB_DTYPE_F32, NULL, b, b, &s, &z) == NB_ERR_INVALID_ARG);
    CHECK(nb_kv_dequantize_v(1, 8, NB_DTYPE_F32, b, NULL, &s, &z, NB_KV_VIEW_TARGET, x) ==
          NB_ERR_INVALID_ARG);
}

// Layout: every offset function tiles its buffer exactly once; sizes agree.
static void test_layout(void) {
    const nb_kv_layout l = {.n_layers = 3, .n_kv_heads = 2, .head_dim = 8, .group_size = 4,
                            .dtype = NB_DTYPE_BF16, .n_qblocks = 5, .n_fpblocks = 3};
    CHECK(nb_kv_layout_valid(&l));
    nb_kv_layout odd = l;
    odd.head_dim = 7;
    CHECK(!nb_kv_layout_valid(&odd));
    const size_t pb = nb_kv_plane_bytes(&l), sb = nb_kv_scales_bytes(&l), fb = nb_kv_fp_bytes(&l);
    const size_t se = sb / 2, fe = fb / 2;
    unsigned char *seen_p = calloc(pb, 1), *seen_s = calloc(se, 1), *seen_f = calloc(fe, 1);
    for (int ly = 0; ly < l.n_layers; ly++)
        for (int h = 0; h < l.n_kv_heads; h++) {
            for (int b = 0; b < l.n_qblocks; b++) {
                for (int kv = 0; kv < 2; kv++)
                    for (int t = 0; t < l.group_size; t++)
                        for (size_t j = 0; j < nb_kv_row_bytes(&l); j++) {
                            size_t o = nb_kv_plane_offset(&l, ly, b, h, kv, t) + j;
                            CHECK(o < pb);
                            if (o < pb) seen_p[o]++;
                        }
                for (int part = 0; part < 4; part++) {
                    int len = part < 2 ? l.head_dim : l.group_size;
                    for (int i = 0; i < len; i++) {
                        size_t o = nb_kv_scales_offset(&l, ly, b, h, (nb_kv_scale_part)part) + i;
                        CHECK(o < se);
                        if (o < se) seen_s[o]++;
                    }
                }
            }
            for (int b = 0; b < l.n_fpblocks; b++)
                for (int kv = 0; kv < 2; kv++)
                    for (int t = 0; t < l.group_size; t++)
                        for (int c = 0; c < l.head_dim; c++) {
                            size_t o = nb_kv_fp_offset(&l, ly, b, h, kv, t) + c;
                            CHECK(o < fe);
                            if (o < fe) seen_f[o]++;
                        }
        }
    int once = 1;
    for (size_t i = 0; i < pb; i++) once &= seen_p[i] == 1;
    for (size_t i = 0; i < se; i++) once &= seen_s[i] == 1;
    for (size_t i = 0; i < fe; i++) once &= seen_f[i] == 1;
    CHECKF(once, "offsets do not tile the buffers exactly once");
    CHECK(nb_kv_qblock_bytes(&l) * l.n_qblocks == 2 * pb + sb);
    CHECK(nb_kv_fpblock_bytes(&l) * l.n_fpblocks == fb);
    CHECK(nb_kv_qblock_bytes_per_token(&l) * l.group_size == (double)nb_kv_qblock_bytes(&l));
    free(seen_p); free(seen_s); free(seen_f);

    // Bytes per token per (layer, kv head) in f16 (the table in docs/kv-cache.md).
    const struct { int D, G; double draft, target; size_t fp; } tab[] = {
        {128, 128, 136.0, 264.0, 512}, {8, 128, 12.25, 20.25, 32}, {8, 64, 12.5, 20.5, 32}};
    for (int i = 0; i < 3; i++) {
        nb_kv_layout t = {.n_layers = 1, .n_kv_heads = 1, .head_dim = tab[i].D,
                          .group_size = tab[i].G, .dtype = NB_DTYPE_F16};
        double dr = nb_kv_view_bytes_per_token(&t, NB_KV_VIEW_DRAFT);
        double tg = nb_kv_view_bytes_per_token(&t, NB_KV_VIEW_TARGET);
        size_t fp = nb_kv_fp_bytes_per_token(&t);
        printf("bytes/token/(layer,head) D=%d G=%d f16: fp16 %zu, draft %.2f (%.1f%%), target "
               "%.2f (%.1f%%)\n", tab[i].D, tab[i].G, fp, dr, 100 * dr / fp, tg, 100 * tg / fp);
        CHECK(dr == tab[i].draft && tg == tab[i].target && fp == tab[i].fp);
    }
}

// Block work items on a small pool with non-contiguous block ids.
static void test_blocks(void) {
    for (int di = 0; di < 3; di++) {
        const nb_dtype dt = DTYPES[di];
        const size_t es = nb_dtype_size(dt);
        const nb_kv_layout l = {.n_layers = 2, .n_kv_heads = 3, .head_dim = 8, .group_size = 16,
                                .dtype = dt, .n_qblocks = 5, .n_fpblocks = 6};
        const int G = l.group_size, D = l.head_dim;
        const size_t pb = nb_kv_plane_bytes(&l), sb = nb_kv_scales_bytes(&l), fb = nb_kv_fp_bytes(&l);
        nb_kv_pools p = {malloc(pb), malloc(pb), malloc(sb), malloc(fb)};
        memset(p.upper, 0x5a, pb);
        memset(p.lower, 0x5a, pb);
        for (size_t i = 0; i < sb / es; i++) nb_store_f32(p.scales, dt, i, NAN);
        for (size_t i = 0; i < fb / es; i++) nb_store_f32(p.fp, dt, i, NAN);
        // FP block 4: random values; one group near the f16 limit.
        for (int ly = 0; ly < 2; ly++)
            for (int h = 0; h < 3; h++)
                for (int kv = 0; kv < 2; kv++)
                    for (int t = 0; t < G; t++)
                        for (int c = 0; c < D; c++) {
                            float x = (float)(rng_normal() * (1 + h));
                            if (ly == 1 && h == 2 && kv == 1 && t == 3)
                                x = c % 2 ? 65504.0f : -65504.0f + (float)c * 3000.0f;
                            nb_store_f32(p.fp, dt, nb_kv_fp_offset(&l, ly, 4, h, kv, t) + c, x);
                        }
        uint8_t *snap_u = malloc(pb), *snap_s = malloc(sb);
        memcpy(snap_u, p.upper, pb);
        memcpy(snap_s, p.scales, sb);
        CHECK(nb_kv_quantize_block(&l, &p, 4, 2) == NB_OK);
        // Block 2 equals the group functions; blocks 0,1,3,4 are untouched.
        for (int ly = 0; ly < 2; ly++)
            for (int h = 0; h < 3; h++)
                for (int kv = 0; kv < 2; kv++) {
                    uint8_t up[16 * 4], lo[16 * 4];
                    uint8_t sc[16 * 4], ze[16 * 4];
                    const uint8_t *src = (const uint8_t *)p.fp + nb_kv_fp_offset(&l, ly, 4, h, kv, 0) * es;
                    if (kv) nb_kv_quantize_v(G, D, dt, src, up, lo, sc, ze);
                    else nb_kv_quantize_k(G, D, dt, src, up, lo, sc, ze);
                    size_t po = nb_kv_plane_offset(&l, ly, 2, h, kv, 0);
                    int n = kv ? G : D;
                    size_t so = nb_kv_scales_offset(&l, ly, 2, h, kv ? NB_KV_V_SCALE : NB_KV_K_SCALE) * es;
                    size_t zo = nb_kv_scales_offset(&l, ly, 2, h, kv ? NB_KV_V_ZERO : NB_KV_K_ZERO) * es;
                    CHECK(memcmp((uint8_t *)p.upper + po, up, (size_t)G * D / 2) == 0);
                    CHECK(memcmp((uint8_t *)p.lower + po, lo, (size_t)G * D / 2) == 0);
                    CHECK(memcmp((uint8_t *)p.scales + so, sc, n * es) == 0);
                    CHECK(memcmp((uint8_t *)p.scales + zo, ze, n * es) == 0);
                    for (int b = 0; b < 5; b++) {
                        if (b == 2) continue;
                        size_t o = nb_kv_plane_offset(&l, ly, b, h, kv, 0);
                        CHECK(memcmp((uint8_t *)p.upper + o, snap_u + o, (size_t)G * D / 2) == 0);
                        size_t s0 = nb_kv_scales_offset(&l, ly, b, h, NB_KV_K_SCALE) * es;
                        CHECK(memcmp((uint8_t *)p.scales + s0, snap_s + s0,
                                     nb_kv_scales_record_elems(&l) * es) == 0);
                    }
                }

        // Deep rollback: dequantize q block 2 into FP block 1 (target view).
        CHECK(nb_kv_dequantize_block(&l, &p, 2, 1) == NB_OK);
        float tv[16 * 8];
        for (int ly = 0; ly < 2; ly++)
            for (int h = 0; h < 3; h++)
                for (int kv = 0; kv < 2; kv++) {
                    size_t po = nb_kv_plane_offset(&l, ly, 2, h, kv, 0);
                    const uint8_t *sc = (const uint8_t *)p.scales +
                        nb_kv_scales_offset(&l, ly, 2, h, kv ? NB_KV_V_SCALE : NB_KV_K_SCALE) * es;
                    const uint8_t *ze = (const uint8_t *)p.scales +
                        nb_kv_scales_offset(&l, ly, 2, h, kv ? NB_KV_V_ZERO : NB_KV_K_ZERO) * es;
                    const uint8_t *u = (const uint8_t *)p.upper + po, *lw = (const uint8_t *)p.lower + po;
                    if (kv) nb_kv_dequantize_v(G, D, dt, u, lw, sc, ze, NB_KV_VIEW_TARGET, tv);
                    else nb_kv_dequantize_k(G, D, dt, u, lw, sc, ze, NB_KV_VIEW_TARGET, tv);
                    for (int t = 0; t < G; t++)
                        for (int c = 0; c < D; c++) {
                            float got = nb_load_f32(p.fp, dt, nb_kv_fp_offset(&l, ly, 1, h, kv, t) + c);
                            float want = nb_round_to_dtype(tv[t * D + c], dt);
                            if (isinf(want)) want = copysignf(65504.0f, want); // f16 saturation
                            CHECKF(got == want && isfinite(got), "dequant block %g vs %g", got, want);
                        }
                }

        // Copy-on-write: first 5 tokens of FP block 4 into FP block 0.
        CHECK(nb_kv_copy_fp_block(&l, &p, 4, 0, 5) == NB_OK);
        for (int ly = 0; ly < 2; ly++)
            for (int h = 0; h < 3; h++)
                for (int kv = 0; kv < 2; kv++) {
                    const uint8_t *a = (const uint8_t *)p.fp + nb_kv_fp_offset(&l, ly, 0, h, kv, 0) * es;
                    const uint8_t *b = (const uint8_t *)p.fp + nb_kv_fp_offset(&l, ly, 4, h, kv, 0) * es;
                    CHECK(memcmp(a, b, 5 * D * es) == 0);
                    CHECK(isnan(nb_load_f32(p.fp, dt, nb_kv_fp_offset(&l, ly, 0, h, kv, 5))));
                }

        // A NaN in the last group of FP block 5 leaves q block 3 untouched.
        CHECK(nb_kv_copy_fp_block(&l, &p, 4, 5, G) == NB_OK);
        nb_store_f32(p.fp, dt, nb_kv_fp_offset(&l, 1, 5, 2, 1, G - 1) + D - 1, NAN);
        memcpy(snap_u, p.upper, pb);
        memcpy(snap_s, p.scales, sb);
        uint8_t *snap_l = malloc(pb);
        memcpy(snap_l, p.lower, pb);
        CHECK(nb_kv_quantize_block(&l, &p, 5, 3) == NB_ERR_NON_FINITE);
        CHECK(memcmp(snap_u, p.upper, pb) == 0 && memcmp(snap_l, p.lower, pb) == 0 &&
              memcmp(snap_s, p.scales, sb) == 0);

        CHECK(nb_kv_quantize_block(&l, &p, 6, 0) == NB_ERR_INVALID_ARG);
        CHECK(nb_kv_quantize_block(&l, &p, 0, 5) == NB_ERR_INVALID_ARG);
        CHECK(nb_kv_dequantize_block(&l, &p, -1, 0) == NB_ERR_INVALID_ARG);
        CHECK(nb_kv_copy_fp_block(&l, &p, 0, 1, G + 1) == NB_ERR_INVALID_ARG);
        CHECK(nb_kv_copy_fp_block(&l, &p, 3, 3, G) == NB_OK);
        free(snap_u); free(snap_s); free(snap_l);
        free(p.upper); free(p.lower); free(p.scales); free(p.fp);
    }
}

int main(void) {
    test_layout();
    test_known_codes();
    test_random_groups();
    test_degenerate();
    test_non_finite();
    test_blocks();
    return nb_test_finish("test_kv_quant");
}
