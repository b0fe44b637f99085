// ops_ref.c: scalar reference of the dense ops (see ops_ref.h for the exact
// contracts). The hot loops use GCC vector extensions on 8 floats, which
// are exactly the eight lanes of the "8-lane order", so vectorisation never
// changes a result: whatever the ISA, each lane is one f32 sum in k order.
#include "ops_ref.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

// NOTE: the 32-byte vector helpers are static inline and never cross an ABI
// boundary, so GCC's note about AVX vector returns does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float nb_v8f __attribute__((vector_size(32)));
typedef uint32_t nb_v8u __attribute__((vector_size(32)));
typedef int32_t nb_v8i __attribute__((vector_size(32)));
typedef uint16_t nb_v8h __attribute__((vector_size(16)));

static inline nb_v8f ld8(const float *p) {
    nb_v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum8(nb_v8f a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// NOTE: x86-64 baseline is SSE2; an AVX2 clone runs the same operations in
// the same order (no fma: -ffp-contract=off and the target has no "fma").
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones) && !defined(__SANITIZE_ADDRESS__)
#define NB_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef NB_CLONES
#define NB_CLONES
#endif

// ------------------------------------------------------------ conversion
static inline void cvt8_f16(float *dst, const uint16_t *src) {
    nb_v8h h;
    memcpy(&h, src, sizeof h);
    nb_v8u u = __builtin_convertvector(h, nb_v8u);
    nb_v8u sign = (u & 0x8000u) << 16;
    nb_v8u em = (u & 0x7fffu) << 13;
    // exponent+mantissa as an f32 with bias 15 instead of 127: scale by 2^112
    // (exact; subnormal f16 become normal f32).
    nb_v8f f = (nb_v8f)em * 0x1p112f;
    nb_v8u bits = (nb_v8u)f;
    nb_v8u infnan = (nb_v8u)((u & 0x7c00u) == 0x7c00u); // all-ones where exp == 31
    bits |= infnan & 0x7f800000u;
    bits |= sign;
    memcpy(dst, &bits, sizeof bits);
}

static inline void cvt8_bf16(float *dst, const uint16_t *src) {
    nb_v8h h;
    memcpy(&h, src, sizeof h);
    nb_v8u u = __builtin_convertvector(h, nb_v8u) << 16;
    memcpy(dst, &u, sizeof u);
}

static void convert_f32(float *out, const void *src, nb_dtype dt, size_t n) {
    if (dt == NB_DTYPE_F32) {
        memcpy(out, src, n * sizeof(float));
        return;
    }
    const uint16_t *s = (const uint16_t *)src;
    size_t i = 0;
    if (dt == NB_DTYPE_F16) {
        for (; i + 8 <= n; i += 8) cvt8_f16(out + i, s + i);
    } else {
        for (; i + 8 <= n; i += 8) cvt8_bf16(out + i, s + i);
    }
    for (; i < n; i++) out[i] = nb_load_f32(src, dt, i);
}

void nb_ref_convert_to_f32(float *out, const void *src, nb_dtype dt, size_t n) {
    convert_f32(out, src, dt, n);
}

float nb_ref_sum8(const float *x, size_t n) {
    nb_v8f a = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) a += ld8(x + i);
    for (; i < n; i++) a[i & 7] += x[i];
    return hsum8(a);
}

// ------------------------------------------------------------ rmsnorm
void nb_ref_rmsnorm(float *out, const float *x, const void *w, nb_dtype dt, int n, int d,
                    float eps) {
    NB_ASSERT(n >= 0 && d > 0);
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * d;
        float *oi = out + (size_t)i * d;
        // The 64-lane order (ops_ref.h): vector v holds lanes 8v..8v+7.
        nb_v8f a[8] = {{0}};
        int j = 0;
        for (; j + 64 <= d; j += 64)
            for (int v = 0; v < 8; v++) {
                nb_v8f x8 = ld8(xi + j + 8 * v);
                a[v] += x8 * x8;
            }
        for (; j < d; j++) a[(j >> 3) & 7][j & 7] += xi[j] * xi[j];
        nb_v8f b = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        float ms = hsum8(b) / (float)d;
        float r = 1.0f / sqrtf(ms + eps);
        if (dt == NB_DTYPE_F32) {
            const float *wf = (const float *)w;
            for (j = 0; j < d; j++) oi[j] = (xi[j] * r) * wf[j];
        } else {
            float wt[64];
            for (j = 0; j < d; j += 64) {
                int len = d - j < 64 ? d - j : 64;
                convert_f32(wt, (const uint16_t *)w + j, dt, (size_t)len);
                for (int t = 0; t < len; t++) oi[j + t] = (xi[j + t] * r) * wt[t];
            }
        }
    }
}

// ------------------------------------------------------------ matmul
enum {
    MM_R = 4,    // weight rows per tile
    MM_NB = 8,   // x rows per block (a converted weight tile is reused this often)
    MM_KC = 512, // k chunk of a converted weight tile (multiple of 8)
};

// acc[r] += x[0..len) * w[r][0..len) lane-wise; x and w start at a k that is
// a multiple of 8, so lane = k mod 8.
static inline void dot_tile(nb_v8f acc[MM_R], const float *x, const float *const w[MM_R],
                            int len) {
    nb_v8f a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    int kk = 0;
    for (; kk + 8 <= len; kk += 8) {
        nb_v8f xv = ld8(x + kk);
        a0 += xv * ld8(w0 + kk);
        a1 += xv * ld8(w1 + kk);
        a2 += xv * ld8(w2 + kk);
        a3 += xv * ld8(w3 + kk);
    }
    for (; kk < len; kk++) {
        float xv = x[kk];
        a0[kk & 7] += xv * w0[kk];
        a1[kk & 7] += xv * w1[kk];
        a2[kk & 7] += xv * w2[kk];
        a3[kk & 7] += xv * w3[kk];
    }
    acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
}

typedef struct mm_args {
    float *out;
    const float *x;
    const void *w;
    nb_dtype dt;
    const void *bias;
    nb_dtype bias_dt;
    int n, m, k;
    int j_begin, j_end; // output columns of this worker
} mm_args;

NB_CLONES static void mm_cols(const mm_args *a) {
    const int n = a->n, m = a->m, k = a->k;
    const size_t esz = nb_dtype_size(a->dt);
    float wt[MM_R][MM_KC] __attribute__((aligned(32)));
    nb_v8f acc[MM_NB][MM_R];
    for (int j0 = a->j_begin; j0 < a->j_end; j0 += MM_R) {
        int rn = a->j_end - j0 < MM_R ? a->j_end - j0 : MM_R;
        for (int i0 = 0; i0 < n; i0 += MM_NB) {
            int ni = n - i0 < MM_NB ? n - i0 : MM_NB;
            memset(acc, 0, sizeof acc);
            for (int kc = 0; kc < k; kc += MM_KC) {
                int len = k - kc < MM_KC ? k - kc : MM_KC;
                const float *wr[MM_R];
                for (int r = 0; r < MM_R; r++) {
                    // NOTE: missing rows of a partial tile repeat row 0; their
                    // sums are discarded.
                    int rr = r < rn ? r : 0;
                    const char *src =
                        (const char *)a->w + ((size_t)(j0 + rr) * k + kc) * esz;
                    if (a->dt == NB_DTYPE_F32) {
                        wr[r] = (const float *)src;
                    } else if (r < rn) {
                        convert_f32(wt[r], src, a->dt, (size_t)len);
                        wr[r] = wt[r];
                    } else {
                        wr[r] = wt[0];
                    }
                }
                for (int i = 0; i < ni; i++)
                    dot_tile(acc[i], a->x + (size_t)(i0 + i) * k + kc, wr, len);
            }
            for (int i = 0; i < ni; i++) {
                float *o = a->out + (size_t)(i0 + i) * m + j0;
                for (int r = 0; r < rn; r++) {
                    float s = hsum8(acc[i][r]);
                    if (a->bias) s += nb_load_f32(a->bias, a->bias_dt, (size_t)(j0 + r));
                    o[r] = s;
                }
            }
        }
    }
}

static void *mm_thread(void *p) {
    mm_cols((const mm_args *)p);
    return NULL;
}

void nb_ref_matmul(float *out, const float *x, const void *w, nb_dtype dt, const void *bias,
                   nb_dtype bias_dt, int n, int m, int k) {
    NB_ASSERT(n >= 0 && m >= 0 && k >= 0);
    mm_args a = {out, x, w, dt, bias, bias_dt, n, m, k, 0, m};
    if (n == 0 || m == 0) return;
    double work = (double)n * m * k;
    if (work >= (double)(1 << 21) && m >= 2 * MM_R) {
        // NOTE: split at a tile boundary; a failed pthread_create just runs
        // both halves here (same operations, same result).
        mm_args b = a;
        a.j_end = b.j_begin = (m / 2 + MM_R - 1) / MM_R * MM_R;
        pthread_t th;
        int started = pthread_create(&th, NULL, mm_thread, &b) == 0;
        mm_cols(&a);
        if (started)
            pthread_join(th, NULL);
        else
            mm_cols(&b);
        return;
    }
    mm_cols(&a);
}

// ------------------------------------------------------------ small ops
nb_status nb_ref_embed(float *out, const void *table, nb_dtype dt, const int32_t *ids, int n,
                       int d, int vocab) {
    NB_ASSERT(n >= 0 && d > 0);
    size_t esz = nb_dtype_size(dt);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab) return NB_ERR_INVALID_ARG;
        convert_f32(out + (size_t)i * d, (const char *)table + (size_t)ids[i] * d * esz, dt,
                    (size_t)d);
    }
    return NB_OK;
}

void nb_ref_silu_mul(float *out, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = (g / (1.0f + expf(-g))) * up[i];
    }
}

void nb_ref_add(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

int nb_ref_argmax(const float *x, int n) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i])) continue;
        if (best < 0 || x[i] > x[best]) best = i;
    }
    return best;
}

nb_status nb_ref_softmax(float *out, const float *x, int n) {
    NB_ASSERT(n > 0);
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i]) || x[i] == INFINITY) return NB_ERR_NON_FINITE;
        if (x[i] > mx) mx = x[i];
    }
    if (mx == -INFINITY) return NB_ERR_NON_FINITE;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        float e = expf(x[i] - mx);
        out[i] = e;
        sum += e;
    }
    float inv = (float)sum;
    for (int i = 0; i < n; i++) out[i] = out[i] / inv;
    return NB_OK;
}

// ------------------------------------------------------------ RoPE
nb_status nb_ref_rope_inv_freq(float *inv_freq, int D, float theta, const nb_rope_scaling *sc) {
    if (D < 2 || (D & 1) || !(theta > 1.0f)) return NB_ERR_INVALID_ARG;
    nb_rope_type type = sc ? sc->type : NB_ROPE_NONE;
    if (type != NB_ROPE_NONE && !(sc->factor > 0.0f)) return NB_ERR_INVALID_ARG;
    if (type == NB_ROPE_LLAMA3 &&
        (!(sc->high_freq_factor > sc->low_freq_factor) || !(sc->low_freq_factor > 0.0f) ||
         sc->original_max_position_embeddings <= 0))
        return NB_ERR_INVALID_ARG;
    if (type != NB_ROPE_NONE && type != NB_ROPE_LINEAR && type != NB_ROPE_LLAMA3)
        return NB_ERR_INVALID_ARG;
    for (int i = 0; i < D / 2; i++) {
        float base = 1.0f / powf(theta, (float)(2 * i) / (float)D);
        if (type == NB_ROPE_NONE) {
            inv_freq[i] = base;
        } else if (type == NB_ROPE_LINEAR) {
            inv_freq[i] = base / sc->factor;
        } else {
            double f = base, factor = sc->factor, lo = sc->low_freq_factor,
                   hi = sc->high_freq_factor, orig = sc->original_max_position_embeddings;
            double wavelen = 2.0 * M_PI / f;
            double lo_w = orig / lo, hi_w = orig / hi;
            double r;
            if (wavelen < hi_w) {
                r = f;
            } else if (wavelen > lo_w) {
                r = f / factor;
            } else {
                double s = (orig / wavelen - lo) / (hi - lo);
                r = (1.0 - s) * f / factor + s * f;
            }
            inv_freq[i] = (float)r;
        }
    }
    return NB_OK;
}

void nb_ref_rope_apply(float *x, const int32_t *pos, int n, int n_heads, int D,
                       const float *inv_freq) {
    NB_ASSERT(D >= 2 && D % 2 == 0 && D <= 1024 && n >= 0 && n_heads >= 0);
    const int h = D / 2;
    float c[512], s[512];
    for (int t = 0; t < n; t++) {
        float p = (float)pos[t];
        for (int i = 0; i < h; i++) {
            float a = p * inv_freq[i];
            c[i] = cosf(a);
            s[i] = sinf(a);
        }
        for (int hd = 0; hd < n_heads; hd++) {
            float *v = x + ((size_t)t * n_heads + hd) * D;
            for (int i = 0; i < h; i++) {
                float x0 = v[i], x1 = v[i + h];
                v[i] = x0 * c[i] - x1 * s[i];
                v[i + h] = x1 * c[i] + x0 * s[i];
            }
        }
    }
}
