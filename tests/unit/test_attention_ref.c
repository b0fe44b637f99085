// test_attention_ref.c: the paged attention reference against the contiguous
// one, and the contiguous one against a double-precision naive attention.
//
// Paged setups follow vLLM/FlashInfer practice: random non-contiguous block
// tables, odd lengths (1, G-1, G, G+1, 2G+3), every unused pool slot poisoned
// (NaN in FP slots and scales, random bytes in nibble planes) so a read past
// the valid tokens turns the output NaN; quantized blocks checked in both
// views; GQA/MQA; several causal rows.
//
// Tolerances:
//   PAGED: 0 (bit-exact). The paged reference gathers exactly the values the
//     test hands the contiguous one and runs the same core in the same order.
//   CORE:  |out - naive_double| <= 2^-20 * (T + D) * max|V|. The f32 core
//     rounds each of D products in a score (scores here are O(1): q, k ~ N(0,1)
//     scaled by 1/sqrt(D)), exp, and T accumulations, each with relative error
//     2^-24; the weighted sum is a convex combination of V rows, so the error
//     is O((T + D) * 2^-24 * max|V|); 2^-20 leaves a factor 16 of room.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_ref.h"
#include "kv_layout.h"
#include "kv_quant.h"
#include "nb_dtype.h"
#include "nb_test.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_uniform(void) { return (double)(rng_next() >> 11) * 0x1p-53; }
static float rng_normal(void) {
    double u = rng_uniform() + 0x1p-54, v = rng_uniform();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

// Naive causal GQA attention in double.
static void attention_double(int T, int Hkv, int Hq, int D, const float *k, const float *v,
                             const float *q, int n_rows, int first_pos, double scale, double *out) {
    double *w = malloc(sizeof(double) * T);
    for (int r = 0; r < n_rows; r++)
        for (int h = 0; h < Hq; h++) {
            const int kvh = h / (Hq / Hkv), n = first_pos + r + 1;
            const float *qr = q + ((size_t)r * Hq + h) * D;
            double m = -INFINITY, sum = 0;
            for (int p = 0; p < n; p++) {
                double s = 0;
                for (int c = 0; c < D; c++) s += (double)qr[c] * k[((size_t)p * Hkv + kvh) * D + c];
                w[p] = s * scale;
                m = w[p] > m ? w[p] : m;
            }
            for (int p = 0; p < n; p++) sum += (w[p] = exp(w[p] - m));
            for (int c = 0; c < D; c++) {
                double o = 0;
                for (int p = 0; p < n; p++) o += w[p] * v[((size_t)p * Hkv + kvh) * D + c];
                out[((size_t)r * Hq + h) * D + c] = o / sum;
            }
        }
    free(w);
}

static void test_contiguous_core(void) {
    const struct { int T, Hkv, Hq, D, n_rows, first_pos; } cs[] = {
        {1, 1, 1, 8, 1, 0},    {37, 2, 4, 16, 1, 36}, {100, 2, 8, 64, 7, 93},
        {259, 1, 4, 128, 5, 0}, {64, 4, 4, 32, 64, 0}, {515, 2, 2, 64, 3, 200}};
    double worst = 0;
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const int T = cs[i].T, Hkv = cs[i].Hkv, Hq = cs[i].Hq, D = cs[i].D, R = cs[i].n_rows;
        const size_t nkv = (size_t)T * Hkv * D, nq = (size_t)R * Hq * D;
        float *k = malloc(4 * nkv), *v = malloc(4 * nkv), *q = malloc(4 * nq), *o = malloc(4 * nq);
        double *ref = malloc(8 * nq), vmax = 0;
        for (size_t j = 0; j < nkv; j++) {
            k[j] = rng_normal();
            v[j] = rng_normal() * 3;
            vmax = fabs(v[j]) > vmax ? fabs(v[j]) : vmax;
        }
        for (size_t j = 0; j < nq; j++) q[j] = rng_normal();
        const float scale = 1.0f / sqrtf((float)D);
        CHECK(nb_ref_attention_contiguous(T, Hkv, Hq, D, k, v, q, R, cs[i].first_pos, scale, o) ==
              NB_OK);
        attention_double(T, Hkv, Hq, D, k, v, q, R, cs[i].first_pos, scale, ref);
        const double tol = 0x1p-20 * (T + D) * vmax;
        double err = 0;
        for (size_t j = 0; j < nq; j++) err = fmax(err, fabs(o[j] - ref[j]));
        CHECKF(err <= tol, "case %zu: core err %.3g > tol %.3g", i, err, tol);
        worst = fmax(worst, err / tol);
        free(k); free(v); free(q); free(o); free(ref);
    }
    printf("contiguous core vs double: worst err/tol %.4f\n", worst);
    float x[8] = {0}, y[8];
    CHECK(nb_ref_attention_contiguous(1, 2, 3, 4, x, x, x, 1, 0, 1.0f, y) == NB_ERR_INVALID_ARG);
}

// ---- paged setups ----

typedef struct paged {
    nb_kv_layout lay;
    nb_kv_pools pools;
    float *exact_k, *exact_v; // [n_layers][T][Hkv][D] the values written (before quantization)
} paged;

static void poison_fp_block(const paged *pg, int32_t b) {
    const nb_kv_layout *l = &pg->lay;
    for (int ly = 0; ly < l->n_layers; ly++)
        for (int h = 0; h < l->n_kv_heads; h++)
            for (int kv = 0; kv < 2; kv++)
                for (size_t i = 0; i < (size_t)l->group_size * l->head_dim; i++)
                    nb_store_f32(pg->pools.fp, l->dtype, nb_kv_fp_offset(l, ly, b, h, kv, 0) + i, NAN);
}

static void paged_init(paged *pg, nb_dtype dt, int L, int Hkv, int D, int G) {
    nb_kv_layout l = {.n_layers = L, .n_kv_heads = Hkv, .head_dim = D, .group_size = G,
                      .dtype = dt, .n_qblocks = 9, .n_fpblocks = 7};
    pg->lay = l;
    const size_t pb = nb_kv_plane_bytes(&l), sb = nb_kv_scales_bytes(&l), fb = nb_kv_fp_bytes(&l);
    const size_t es = nb_kv_dtype_bytes(dt);
    pg->pools.upper = malloc(pb);
    pg->pools.lower = malloc(pb);
    pg->pools.scales = malloc(sb);
    pg->pools.fp = malloc(fb);
    for (size_t i = 0; i < pb; i++) {
        ((uint8_t *)pg->pools.upper)[i] = (uint8_t)rng_next();
        ((uint8_t *)pg->pools.lower)[i] = (uint8_t)rng_next();
    }
    for (size_t i = 0; i < sb / es; i++) nb_store_f32(pg->pools.scales, dt, i, NAN);
    for (size_t i = 0; i < fb / es; i++) nb_store_f32(pg->pools.fp, dt, i, NAN);
    pg->exact_k = pg->exact_v = NULL;
}

static void paged_free(paged *pg) {
    free(pg->pools.upper); free(pg->pools.lower); free(pg->pools.scales); free(pg->pools.fp);
    free(pg->exact_k); free(pg->exact_v);
}

// n distinct random ids from [0, n_total) in random order.
static void random_ids(int32_t *ids, int n, int n_total) {
    int32_t all[64];
    for (int i = 0; i < n_total; i++) all[i] = i;
    for (int i = n_total - 1; i > 0; i--) {
        int j = (int)(rng_next() % (uint64_t)(i + 1));
        int32_t t = all[i]; all[i] = all[j]; all[j] = t;
    }
    memcpy(ids, all, sizeof(int32_t) * n);
}

// Fills a sequence of nq quantized blocks + nfp FP tokens with random values
// (quantized through a staging FP block that is poisoned again afterwards).
static void paged_fill(paged *pg, const int32_t *qb, int nq, const int32_t *fb, int nfp,
                       int32_t staging) {
    const nb_kv_layout *l = &pg->lay;
    const int G = l->group_size, D = l->head_dim, H = l->n_kv_heads, T = nq * G + nfp;
    const size_t per_layer = (size_t)T * H * D;
    pg->exact_k = malloc(4 * per_layer * l->n_layers);
    pg->exact_v = malloc(4 * per_layer * l->n_layers);
    for (int ly = 0; ly < l->n_layers; ly++)
        for (int p = 0; p < T; p++)
            for (int h = 0; h < H; h++)
                for (int kv = 0; kv < 2; kv++)
                    for (int c = 0; c < D; c++) {
                        float x = nb_round_to_dtype(rng_normal() * (kv ? 2.0f : 1.0f) + (ly ? 0.5f : 0.0f), l->dtype);
                        float *dst = kv ? pg->exact_v : pg->exact_k;
                        dst[ly * per_layer + ((size_t)p * H + h) * D + c] = x;
                        if (p < nq * G)
                            nb_store_f32(pg->pools.fp, l->dtype,
                                         nb_kv_fp_offset(l, ly, staging, h, kv, p % G) + c, x);
                        else
                            nb_store_f32(pg->pools.fp, l->dtype,
                                         nb_kv_fp_offset(l, ly, fb[(p - nq * G) / G], h, kv,
                                                         (p - nq * G) % G) + c, x);
                    }
    // Quantize block by block: the staging block holds one block's G tokens.
    for (int i = 0; i < nq; i++) {
        for (int ly = 0; ly < l->n_layers; ly++)
            for (int t = 0; t < G; t++)
                for (int h = 0; h < H; h++)
                    for (int kv = 0; kv < 2; kv++)
                        for (int c = 0; c < D; c++) {
                            const float *srcv = kv ? pg->exact_v : pg->exact_k;
                            nb_store_f32(pg->pools.fp, l->dtype,
                                         nb_kv_fp_offset(l, ly, staging, h, kv, t) + c,
                                         srcv[ly * per_layer + ((size_t)(i * G + t) * H + h) * D + c]);
                        }
        CHECK(nb_kv_quantize_block(l, &pg->pools, staging, qb[i]) == NB_OK);
    }
    poison_fp_block(pg, staging);
}

// Contiguous K, V [T][Hkv][D] of layer `ly` as the paged cache holds them in
// `view` (quantized region dequantized, FP region exact).
static void paged_gather(const paged *pg, int ly, nb_kv_view view, const int32_t *qb, int nq,
                         int nfp, float *k, float *v) {
    const nb_kv_layout *l = &pg->lay;
    const int G = l->group_size, D = l->head_dim, H = l->n_kv_heads, T = nq * G + nfp;
    const size_t es = nb_kv_dtype_bytes(l->dtype), per_layer = (size_t)T * H * D;
    float *tmp = malloc(sizeof(float) * G * D);
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < H; h++)
            for (int kv = 0; kv < 2; kv++) {
                size_t po = nb_kv_plane_offset(l, ly, qb[i], h, kv, 0);
                const uint8_t *sc = (const uint8_t *)pg->pools.scales +
                    nb_kv_scales_offset(l, ly, qb[i], h, kv ? NB_KV_V_SCALE : NB_KV_K_SCALE) * es;
                const uint8_t *ze = (const uint8_t *)pg->pools.scales +
                    nb_kv_scales_offset(l, ly, qb[i], h, kv ? NB_KV_V_ZERO : NB_KV_K_ZERO) * es;
                const uint8_t *u = (const uint8_t *)pg->pools.upper + po;
                const uint8_t *lo = (const uint8_t *)pg->pools.lower + po;
                nb_status s = kv ? nb_kv_dequantize_v(G, D, l->dtype, u, lo, sc, ze, view, tmp)
                                 : nb_kv_dequantize_k(G, D, l->dtype, u, lo, sc, ze, view, tmp);
                CHECK(s == NB_OK);
                for (int t = 0; t < G; t++)
                    memcpy((kv ? v : k) + ((size_t)(i * G + t) * H + h) * D, tmp + (size_t)t * D,
                           sizeof(float) * D);
            }
    for (size_t j = (size_t)nq * G * H * D; j < (size_t)T * H * D; j++) {
        k[j] = pg->exact_k[ly * per_layer + j];
        v[j] = pg->exact_v[ly * per_layer + j];
    }
    free(tmp);
}

typedef struct quant_err { double draft, target; } quant_err;

// One paged configuration, every (layer, view, rows) combination.
static void run_case(nb_dtype dt, int Hkv, int Hq, int D, int G, int nq, int nfp, quant_err *qe) {
    paged pg;
    const int L = 2;
    paged_init(&pg, dt, L, Hkv, D, G);
    int32_t ids[16], qb[9], fb[7];
    random_ids(qb, 9, 9);
    random_ids(ids, 7, 7);
    const int n_fpb = (nfp + G - 1) / G;
    memcpy(fb, ids, sizeof(int32_t) * n_fpb);
    const int32_t staging = ids[6];
    NB_ASSERT(nq <= 9 && n_fpb <= 6);
    paged_fill(&pg, qb, nq, fb, nfp, staging);

    const int T = nq * G + nfp;
    const size_t nkv = (size_t)T * Hkv * D;
    float *k = malloc(4 * nkv), *v = malloc(4 * nkv);
    float *work = malloc(sizeof(float) * nb_ref_paged_attention_work_size(&pg.lay, nq, nfp));
    const int rows_opts[3][2] = {{1, T - 1}, {T < 3 ? T : 3, T - (T < 3 ? T : 3)},
                                 {T < 5 ? T : 5, 0}};
    const float scale = 1.0f / sqrtf((float)D);
    for (int ly = 0; ly < L; ly++)
        for (int view = 0; view < 2; view++) {
            if (view == NB_KV_VIEW_DRAFT && nq == 0) continue; // identical to target then
            paged_gather(&pg, ly, (nb_kv_view)view, qb, nq, nfp, k, v);
            for (int ro = 0; ro < 3; ro++) {
                const int R = rows_opts[ro][0], first = rows_opts[ro][1];
                const size_t nqv = (size_t)R * Hq * D;
                float *q = malloc(4 * nqv), *o1 = malloc(4 * nqv), *o2 = malloc(4 * nqv);
                for (size_t j = 0; j < nqv; j++) q[j] = rng_normal();
                nb_kv_pools pools = pg.pools;
                if (view == NB_KV_VIEW_DRAFT) pools.lower = NULL; // the draft never needs it
                nb_status s = nb_ref_paged_attention(&pg.lay, &pools, ly, (nb_kv_view)view, qb, nq,
                                                     fb, nfp, Hq, q, R, first, scale, o1, work);
                CHECKF(s == NB_OK, "paged: %s", nb_status_str(s));
                CHECK(nb_ref_attention_contiguous(T, Hkv, Hq, D, k, v, q, R, first, scale, o2) == NB_OK);
                int same = 1, finite = 1;
                for (size_t j = 0; j < nqv; j++) {
                    same &= o1[j] == o2[j];
                    finite &= isfinite(o1[j]);
                }
                CHECKF(same && finite, "%s Hkv %d Hq %d D %d G %d nq %d nfp %d layer %d view %d "
                       "rows %d@%d: paged != contiguous (finite %d)", nb_dtype_name(dt), Hkv, Hq, D,
                       G, nq, nfp, ly, view, R, first, finite);
                if (nq > 0) { // distance to attention over the unquantized values
                    float *o3 = malloc(4 * nqv);
                    const size_t pl = (size_t)T * Hkv * D;
                    nb_ref_attention_contiguous(T, Hkv, Hq, D, pg.exact_k + ly * pl,
                                                pg.exact_v + ly * pl, q, R, first, scale, o3);
                    double e = 0;
                    for (size_t j = 0; j < nqv; j++) e += (o1[j] - o3[j]) * (double)(o1[j] - o3[j]);
                    if (view == NB_KV_VIEW_DRAFT) qe->draft += e; else qe->target += e;
                    free(o3);
                }
                free(q); free(o1); free(o2);
            }
        }
    // Argument checks.
    float dummy[8];
    int32_t bad[1] = {pg.lay.n_qblocks};
    if (nq > 0) {
        CHECK(nb_ref_paged_attention(&pg.lay, &pg.pools, 0, NB_KV_VIEW_TARGET, bad, 1, fb, 0, Hq,
                                     dummy, 1, 0, 1.0f, dummy, work) == NB_ERR_INVALID_ARG);
    }
    CHECK(nb_ref_paged_attention(&pg.lay, &pg.pools, L, NB_KV_VIEW_TARGET, qb, nq, fb, nfp, Hq,
                                 dummy, 1, 0, 1.0f, dummy, work) == NB_ERR_INVALID_ARG);
    CHECK(nb_ref_paged_attention(&pg.lay, &pg.pools, 0, NB_KV_VIEW_TARGET, qb, nq, fb, nfp,
                                 Hkv > 1 ? Hkv + 1 : 0, dummy, 1, 0, 1.0f, dummy, work) ==
          NB_ERR_INVALID_ARG);
    free(k); free(v); free(work);
    paged_free(&pg);
}

static void test_paged(void) {
    const int Gs[2] = {16, 64};
    const struct { int Hkv, Hq, D; nb_dtype dt; } hs[] = {
        {2, 2, 8, NB_DTYPE_F16}, {2, 4, 64, NB_DTYPE_BF16}, {1, 4, 16, NB_DTYPE_F32},
        {2, 8, 8, NB_DTYPE_F16}};
    quant_err qe = {0, 0};
    int n_cases = 0;
    for (int gi = 0; gi < 2; gi++) {
        const int G = Gs[gi];
        const int lens[][2] = {{0, 1}, {0, G - 1}, {0, G}, {0, G + 1}, {0, 2 * G + 3},
                               {1, 0}, {1, 1}, {2, G - 1}, {3, G + 1}, {2, 2 * G + 3}, {1, 3 * G}};
        for (size_t hi = 0; hi < sizeof hs / sizeof hs[0]; hi++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                run_case(hs[hi].dt, hs[hi].Hkv, hs[hi].Hq, hs[hi].D, G, lens[li][0], lens[li][1], &qe);
                n_cases++;
            }
    }
    printf("paged: %d configurations; squared distance to unquantized attention: draft %.4g, "
           "target %.4g\n", n_cases, qe.draft, qe.target);
    CHECKF(qe.target < qe.draft, "the target view should be closer to the exact values");
}

int main(void) {
    test_contiguous_core();
    test_paged();
    return nb_test_finish("test_attention_ref");
}
