// wquant.c: hierarchical 4/8-bit weight quantization and the matmul that
// reads it (contracts in wquant.h). The matmul unpacks one group of codes
// per weight row into an f32 tile of small integers in "nibble order" (low
// nibbles, then high nibbles, of each 8 bytes), dots it with x permuted the
// same way, and applies scale and zero once per group.
#include "wquant.h"

#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "ops_ref.h"

// NOTE: the 32-byte vector helpers are static inline and never cross an ABI
// boundary, so GCC's note about AVX vector returns does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float nb_v8f __attribute__((vector_size(32)));
typedef int32_t nb_v8i __attribute__((vector_size(32)));
typedef uint32_t nb_v8u __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones) && !defined(__SANITIZE_ADDRESS__)
#define NB_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef NB_CLONES
#define NB_CLONES
#endif

static inline nb_v8f ld8(const float *p) {
    nb_v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum8(nb_v8f a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

int nb_wq_group_size(int k) {
    if (k > 0 && k % NB_WQ_GROUP == 0) return NB_WQ_GROUP;
    if (k >= 32 && k < NB_WQ_GROUP && k % 32 == 0) return k;
    return 0;
}

nb_status nb_wq_sizes(int m, int k, size_t *plane_bytes, size_t *n_groups) {
    int g = nb_wq_group_size(k);
    if (m < 0 || g == 0) return NB_ERR_INVALID_ARG;
    if (plane_bytes) *plane_bytes = (size_t)m * (size_t)k / 2;
    if (n_groups) *n_groups = (size_t)m * (size_t)(k / g);
    return NB_OK;
}

// The smallest f16 >= d (d >= 0), or 0x7c00 (Inf) when d > 65504.
static uint16_t f16_ceil(double d) {
    if (d <= 0.0) return 0;
    uint16_t h = nb_f32_to_f16((float)d);
    // NOTE: positive f16 bit patterns are ordered like their values.
    while (h < 0x7c00u && (double)nb_f16_to_f32(h) < d) h++;
    while (h > 0 && (double)nb_f16_to_f32((uint16_t)(h - 1)) >= d) h--;
    return h;
}

static inline float clampf(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }

// Rows [j0, j1) of nb_wq_quantize (rows are independent: each group lies in
// one row, and every output is row-major).
static nb_status wq_quant_rows(const void *w, nb_dtype dt, int k, int j0, int j1, uint8_t *upper,
                               uint8_t *lower, uint16_t *scale, uint16_t *zero) {
    const int gs = nb_wq_group_size(k);
    const int ng = k / gs;
    float xg[NB_WQ_GROUP];
    for (int j = j0; j < j1; j++) {
        for (int g = 0; g < ng; g++) {
            size_t base = (size_t)j * k + (size_t)g * gs;
            nb_ref_convert_to_f32(xg, (const char *)w + base * nb_dtype_size(dt), dt,
                                  (size_t)gs);
            float mn = xg[0], mx = xg[0];
            for (int t = 1; t < gs; t++) {
                mn = xg[t] < mn ? xg[t] : mn;
                mx = xg[t] > mx ? xg[t] : mx;
            }
            uint16_t sh = f16_ceil(((double)mx - (double)mn) / 15.0);
            uint16_t zh = nb_f32_to_f16(mn);
            if ((sh & 0x7fffu) >= 0x7c00u || (zh & 0x7fffu) >= 0x7c00u) return NB_ERR_UNSUPPORTED;
            scale[(size_t)j * ng + g] = sh;
            zero[(size_t)j * ng + g] = zh;
            const float s = nb_f16_to_f32(sh), z = nb_f16_to_f32(zh);
            uint8_t *up = upper + base / 2;
            uint8_t *lo = lower ? lower + base / 2 : NULL;
            for (int t = 0; t < gs; t += 2) {
                int u[2], l[2];
                for (int e = 0; e < 2; e++) {
                    float x = xg[t + e];
                    if (s == 0.0f) {
                        u[e] = 0;
                        l[e] = 0;
                        continue;
                    }
                    float U = clampf(rintf((x - z) / s), 0.0f, 15.0f);
                    float r = x - (U * s + z);
                    float L = clampf(rintf((r / s) * 16.0f), -8.0f, 7.0f);
                    u[e] = (int)U;
                    l[e] = (int)L;
                }
                up[t / 2] = (uint8_t)(u[0] | (u[1] << 4));
                if (lo) lo[t / 2] = (uint8_t)((l[0] + 8) | ((l[1] + 8) << 4));
            }
        }
    }
    return NB_OK;
}

typedef struct wq_job {
    const void *w;
    nb_dtype dt;
    int k, j0, j1, phase; // phase 0: finiteness scan; 1: quantize
    uint8_t *upper, *lower;
    uint16_t *scale, *zero;
    nb_status st;
} wq_job;

static void *wq_job_run(void *arg) {
    wq_job *J = arg;
    if (J->phase == 0) {
        J->st = NB_OK;
        const size_t end = (size_t)J->j1 * J->k;
        for (size_t i = (size_t)J->j0 * J->k; i < end; i++)
            if (!isfinite(nb_load_f32(J->w, J->dt, i))) {
                J->st = NB_ERR_NON_FINITE;
                break;
            }
    } else {
        J->st = wq_quant_rows(J->w, J->dt, J->k, J->j0, J->j1, J->upper, J->lower, J->scale, J->zero);
    }
    return NULL;
}

#define WQ_MAX_THREADS 16
#define WQ_ROWS_PER_THREAD_MIN 256 // below ~1M weights a thread costs more than it saves

nb_status nb_wq_quantize(const void *w, nb_dtype dt, int m, int k, uint8_t *upper,
                         uint8_t *lower, uint16_t *scale, uint16_t *zero) {
    const int gs = nb_wq_group_size(k);
    if (m < 0 || gs == 0) return NB_ERR_INVALID_ARG;
    // Rows split over threads (a real checkpoint's layers quantize at load:
    // ~0.3 s per 59M weights on one core, ~100 s for an 8B model). The
    // split cannot change a code: every row is computed alone.
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = ncpu < 1 ? 1 : ncpu > WQ_MAX_THREADS ? WQ_MAX_THREADS : (int)ncpu;
    if (nt > m / WQ_ROWS_PER_THREAD_MIN) nt = m / WQ_ROWS_PER_THREAD_MIN;
    if (nt < 1) nt = 1;
    wq_job jobs[WQ_MAX_THREADS];
    pthread_t th[WQ_MAX_THREADS];
    for (int t = 0; t < nt; t++)
        jobs[t] = (wq_job){w, dt, k, (int)((long)m * t / nt), (int)((long)m * (t + 1) / nt), 0,
                           upper, lower, scale, zero, NB_OK};
    for (int phase = 0; phase < 2; phase++) {
        int started = 1;
        for (int t = 0; t < nt; t++) jobs[t].phase = phase;
        for (int t = 1; t < nt; t++, started++)
            if (pthread_create(&th[t], NULL, wq_job_run, &jobs[t]) != 0) break;
        wq_job_run(&jobs[0]);
        for (int t = 1; t < started; t++) pthread_join(th[t], NULL);
        for (int t = started; t < nt; t++) wq_job_run(&jobs[t]); // threads refused: run here
        // Phase 0 finds any non-finite weight before anything is written;
        // phase 1's first failing row range (in row order) is the result.
        for (int t = 0; t < nt; t++)
            if (jobs[t].st != NB_OK) return jobs[t].st;
    }
    return NB_OK;
}

void nb_wq_dequantize(float *out, const nb_wq_tensor *w, int use_lower, int m, int k) {
    const int gs = nb_wq_group_size(k);
    NB_ASSERT(gs > 0 && m >= 0 && (!use_lower || w->lower));
    const int ng = k / gs;
    for (int j = 0; j < m; j++) {
        for (int t = 0; t < k; t++) {
            size_t e = (size_t)j * k + t;
            size_t gi = (size_t)j * ng + t / gs;
            float s = nb_f16_to_f32(w->scale[gi]), z = nb_f16_to_f32(w->zero[gi]);
            int U = (w->upper[e / 2] >> ((e & 1) * 4)) & 15;
            if (use_lower) {
                int L = ((w->lower[e / 2] >> ((e & 1) * 4)) & 15) - 8;
                out[e] = (float)(16 * U + L) * (s / 16.0f) + z;
            } else {
                out[e] = (float)U * s + z;
            }
        }
    }
}

// The 16 codes of 8 bytes in "nibble order": the 8 low nibbles (elements
// 0, 2, ..., 14), then the 8 high nibbles (1, 3, ..., 15); U, or 16U + L
// when lo != NULL.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "bytes8() assumes a little-endian host"
#endif

static inline nb_v8i bytes8(const uint8_t *p) {
    // NOTE: broadcast two words and shift per lane; gcc scalarises a direct
    // u8 -> i32 vector conversion.
    uint32_t w0, w1;
    memcpy(&w0, p, 4);
    memcpy(&w1, p + 4, 4);
    nb_v8u v = {w0, w0, w0, w0, w1, w1, w1, w1};
    v = (v >> (nb_v8u){0, 8, 16, 24, 0, 8, 16, 24}) & 0xffu;
    return (nb_v8i)v;
}

static inline void unpack16(float *dst, const uint8_t *up, const uint8_t *lo) {
    nb_v8i uw = bytes8(up);
    nb_v8i ce = uw & 15, co = uw >> 4;
    if (lo) {
        nb_v8i lw = bytes8(lo);
        ce = ce * 16 + (lw & 15) - 8;
        co = co * 16 + (lw >> 4) - 8;
    }
    nb_v8f fe = __builtin_convertvector(ce, nb_v8f);
    nb_v8f fo = __builtin_convertvector(co, nb_v8f);
    memcpy(dst, &fe, sizeof fe);
    memcpy(dst + 8, &fo, sizeof fo);
}

// x in the same nibble order, 16 elements at a time.
static inline void permute16(float *dst, const float *x) {
    for (int l = 0; l < 8; l++) {
        dst[l] = x[2 * l];
        dst[8 + l] = x[2 * l + 1];
    }
}

enum {
    WQ_R = 4,   // weight rows per tile
    WQ_NB = 8,  // x rows per block (an unpacked group tile is reused this often)
    WQ_GC = 8,  // groups per chunk of permuted x and precomputed group sums
};

typedef struct wq_args {
    float *out;
    const float *x;
    const nb_wq_tensor *w;
    int use_lower;
    const void *bias;
    nb_dtype bias_dt;
    int n, m, k;
    int j_begin, j_end;
} wq_args;

NB_CLONES static void wq_cols(const wq_args *a) {
    const int n = a->n, m = a->m, k = a->k;
    const int gs = nb_wq_group_size(k), ng = k / gs;
    const nb_wq_tensor *w = a->w;
    float ct[WQ_R][NB_WQ_GROUP] __attribute__((aligned(32)));
    float xs[WQ_NB][WQ_GC];
    float xp[WQ_NB][WQ_GC * NB_WQ_GROUP] __attribute__((aligned(32)));
    float tot[WQ_NB][WQ_R];
    for (int i0 = 0; i0 < n; i0 += WQ_NB) {
        int ni = n - i0 < WQ_NB ? n - i0 : WQ_NB;
        for (int g0 = 0; g0 < ng; g0 += WQ_GC) {
            int gn = ng - g0 < WQ_GC ? ng - g0 : WQ_GC;
            int last = g0 + gn == ng;
            for (int i = 0; i < ni; i++) {
                const float *xr = a->x + (size_t)(i0 + i) * k + (size_t)g0 * gs;
                for (int gg = 0; gg < gn; gg++) xs[i][gg] = nb_ref_sum8(xr + gg * gs, (size_t)gs);
                for (int e = 0; e < gn * gs; e += 16) permute16(xp[i] + e, xr + e);
            }
            for (int j0 = a->j_begin; j0 < a->j_end; j0 += WQ_R) {
                int rn = a->j_end - j0 < WQ_R ? a->j_end - j0 : WQ_R;
                for (int i = 0; i < ni; i++)
                    for (int r = 0; r < rn; r++)
                        tot[i][r] = g0 == 0 ? 0.0f : a->out[(size_t)(i0 + i) * m + j0 + r];
                for (int gg = 0; gg < gn; gg++) {
                    const int g = g0 + gg;
                    float sc[WQ_R], zr[WQ_R];
                    const float *cp[WQ_R];
                    for (int r = 0; r < WQ_R; r++) {
                        if (r >= rn) {
                            cp[r] = ct[0]; // partial tile: sums discarded
                            continue;
                        }
                        size_t e = (size_t)(j0 + r) * k + (size_t)g * gs;
                        size_t gi = (size_t)(j0 + r) * ng + g;
                        const uint8_t *lo = a->use_lower ? w->lower + e / 2 : NULL;
                        for (int t = 0; t < gs; t += 16)
                            unpack16(ct[r] + t, w->upper + e / 2 + t / 2, lo ? lo + t / 2 : NULL);
                        sc[r] = nb_f16_to_f32(w->scale[gi]);
                        if (a->use_lower) sc[r] = sc[r] / 16.0f;
                        zr[r] = nb_f16_to_f32(w->zero[gi]);
                        cp[r] = ct[r];
                    }
                    for (int i = 0; i < ni; i++) {
                        const float *xg = xp[i] + gg * gs;
                        nb_v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
                        for (int t = 0; t < gs; t += 8) {
                            nb_v8f xv = ld8(xg + t);
                            a0 += xv * ld8(cp[0] + t);
                            a1 += xv * ld8(cp[1] + t);
                            a2 += xv * ld8(cp[2] + t);
                            a3 += xv * ld8(cp[3] + t);
                        }
                        float d[WQ_R] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
                        for (int r = 0; r < rn; r++) {
                            float c = (sc[r] * d[r]) + (zr[r] * xs[i][gg]);
                            tot[i][r] += c;
                        }
                    }
                }
                for (int i = 0; i < ni; i++) {
                    float *o = a->out + (size_t)(i0 + i) * m + j0;
                    for (int r = 0; r < rn; r++) {
                        float v = tot[i][r];
                        if (last && a->bias) v += nb_load_f32(a->bias, a->bias_dt, (size_t)(j0 + r));
                        o[r] = v;
                    }
                }
            }
        }
    }
}

static void *wq_thread(void *p) {
    wq_cols((const wq_args *)p);
    return NULL;
}

void nb_ref_matmul_wq(float *out, const float *x, const nb_wq_tensor *w, int use_lower,
                      const void *bias, nb_dtype bias_dt, int n, int m, int k) {
    NB_ASSERT(n >= 0 && m >= 0 && nb_wq_group_size(k) > 0);
    NB_ASSERT(!use_lower || w->lower);
    wq_args a = {out, x, w, use_lower, bias, bias_dt, n, m, k, 0, m};
    if (n == 0 || m == 0) return;
    if ((double)n * m * k >= (double)(1 << 21) && m >= 2 * WQ_R) {
        wq_args b = a;
        a.j_end = b.j_begin = (m / 2 + WQ_R - 1) / WQ_R * WQ_R;
        pthread_t th;
        int started = pthread_create(&th, NULL, wq_thread, &b) == 0;
        wq_cols(&a);
        if (started)
            pthread_join(th, NULL);
        else
            wq_cols(&b);
        return;
    }
    wq_cols(&a);
}
