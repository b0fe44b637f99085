// ops_ref.h: scalar C reference of the dense transformer ops (the cpu
// backend's compute and the twins the CUDA kernels are tested against).
//
// The one idea: every function has an exactly specified result. Where a sum
// is involved the summation order is part of the contract and is written
// beside the declaration ("8-lane order", below), so a result does not depend
// on tiling, threads or the instruction set the compiler picked. The library
// is compiled with -ffp-contract=off, so no fma is ever introduced.
//
// 8-lane order (used by nb_ref_matmul and the wquant matmul): a sum over
// k = 0..K-1 of terms t_k is computed as eight f32 partial sums
// a_l = (((t_l + t_{l+8}) + t_{l+16}) + ...) (each product t_k rounded to
// f32 first; a_l starts at +0), then
// ((a_0 + a_1) + (a_2 + a_3)) + ((a_4 + a_5) + (a_6 + a_7)).
//
// 64-lane order (nb_ref_rmsnorm's sum of squares): 64 partial sums a_l as
// above, lane l = k mod 64; then, lane-wise over the eight groups of eight,
// b_e = ((a_e + a_{8+e}) + (a_{16+e} + a_{24+e})) +
//       ((a_{32+e} + a_{40+e}) + (a_{48+e} + a_{56+e})), and the b_e summed
// as the a_l of the 8-lane order. A GPU norm runs 64 chains of d/64 adds in
// parallel instead of 8 of d/8 (its one-row latency; the 8-lane chains of a
// 4096-wide row took ~2 us), and a CPU runs it as 8 vectors of 8 lanes.
//
// Activations are f32 row-major. Weights are in HF layout W[out][in] in any
// nb_dtype. Nothing here allocates (nb_ref_matmul may start one helper
// thread for large products; see there).
#ifndef NB_OPS_REF_H
#define NB_OPS_REF_H

#include <stddef.h>
#include <stdint.h>

#include "nb_dtype.h"
#include "nb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Convert n elements of dtype dt to f32 (exact; f16 Inf/NaN/subnormals kept).
void nb_ref_convert_to_f32(float *out /*[n] f32*/, const void *src /*[n] dt*/, nb_dtype dt,
                           size_t n);

// The 8-lane-order sum of x[0..n-1] (see the top of this file).
float nb_ref_sum8(const float *x /*[n] f32*/, size_t n);

// RMSNorm, Llama semantics: out[i][j] = (x[i][j] * r_i) * w[j] with
// r_i = 1 / sqrtf(ms_i + eps), ms_i = (sum of x_ij^2 in the 64-lane order) / d
// (f32).
// out may equal x.
void nb_ref_rmsnorm(float *out /*[n][d] f32*/, const float *x /*[n][d] f32*/,
                    const void *w /*[d] dt*/, nb_dtype dt, int n, int d, float eps);

// out[i][j] = dot(x[i], w[j]) + bias[j], the dot in 8-lane order over k and
// the bias (converted to f32) added last; with bias == NULL no addition.
// out must not overlap x or w. For n*m*k >= 2^21 the output columns are split
// between the calling thread and one helper pthread; every output is computed
// by the same operations either way, so the result is bit-identical.
void nb_ref_matmul(float *out /*[n][m] f32*/, const float *x /*[n][k] f32*/,
                   const void *w /*[m][k] dt*/, nb_dtype dt,
                   const void *bias /*[m] bias_dt, or NULL*/, nb_dtype bias_dt, int n, int m,
                   int k);

// Embedding lookup: out[i] = table[ids[i]] converted to f32.
// Returns NB_OK, or NB_ERR_INVALID_ARG if an id is outside [0, vocab)
// (rows before the bad one are already written).
nb_status nb_ref_embed(float *out /*[n][d] f32*/, const void *table /*[vocab][d] dt*/,
                       nb_dtype dt, const int32_t *ids /*[n]*/, int n, int d, int vocab);

// SwiGLU: out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + expf(-g)) in f32.
// out may equal gate or up.
void nb_ref_silu_mul(float *out /*[n] f32*/, const float *gate /*[n] f32*/,
                     const float *up /*[n] f32*/, size_t n);

// out[i] = a[i] + b[i]; out may equal a or b (the residual add).
void nb_ref_add(float *out /*[n] f32*/, const float *a /*[n] f32*/, const float *b /*[n] f32*/,
                size_t n);

// Index of the largest element; ties go to the lowest index; NaNs are
// skipped. Returns -1 if n <= 0 or every element is NaN.
int nb_ref_argmax(const float *x /*[n] f32*/, int n);

// out = softmax(x): e_i = expf(x_i - max) in f32, divided by their sum
// accumulated in double in index order and rounded to f32 once. -inf
// entries give exactly 0. out may equal x. Returns NB_OK, or
// NB_ERR_NON_FINITE if an element is NaN or +inf or all are -inf (out
// untouched).
nb_status nb_ref_softmax(float *out /*[n] f32*/, const float *x /*[n] f32*/, int n);

// ---------------------------------------------------------------- RoPE
typedef enum nb_rope_type {
    NB_ROPE_NONE = 0,   // default: inv_freq_i = 1 / theta^(2i/D)
    NB_ROPE_LINEAR = 1, // positions divided by factor (== inv_freq / factor)
    NB_ROPE_LLAMA3 = 2, // Llama 3.1 frequency-dependent scaling
} nb_rope_type;

typedef struct nb_rope_scaling {
    nb_rope_type type;
    float factor;                             // LINEAR, LLAMA3
    float low_freq_factor;                    // LLAMA3
    float high_freq_factor;                   // LLAMA3
    int32_t original_max_position_embeddings; // LLAMA3, tokens
} nb_rope_scaling;

// inv_freq[i] for i in [0, D/2), as HF computes it: base_i =
// 1.0f / powf(theta, (float)(2i) / (float)D) in f32. sc == NULL or NONE:
// base_i. LINEAR: base_i / factor. LLAMA3 (HF _compute_llama3_parameters
// behaviour), in double from base_i, rounded to f32 once:
//   wavelen = 2*pi / base_i; lo_w = orig / low_freq_factor;
//   hi_w = orig / high_freq_factor;
//   wavelen < hi_w            -> base_i                        (high freq)
//   wavelen > lo_w            -> base_i / factor               (low freq)
//   otherwise, s = (orig / wavelen - low_freq_factor) /
//                  (high_freq_factor - low_freq_factor),
//                             -> (1 - s) * base_i / factor + s * base_i.
// Returns NB_OK, or NB_ERR_INVALID_ARG (D odd or < 2, theta <= 1, factor <= 0,
// LLAMA3 with high_freq_factor <= low_freq_factor or orig <= 0).
nb_status nb_ref_rope_inv_freq(float *inv_freq /*[D/2] f32*/, int D, float theta,
                               const nb_rope_scaling *sc);

// In-place rotary embedding, HF rotate_half convention (pairs (i, i + D/2)):
// a = (float)pos[t] * inv_freq[i] (one f32 multiply), c = cosf(a),
// s = sinf(a) (full-precision f32 libm; the CUDA twin must use the precise
// cosf/sinf, not the intrinsics, and may differ by an ulp), then
// x'[i] = x[i]*c - x[i+D/2]*s, x'[i+D/2] = x[i+D/2]*c + x[i]*s.
// cos/sin stay f32 even for bf16/f16 models (HF rounds them to the model
// dtype; our activations are f32). D must be even and <= 1024.
void nb_ref_rope_apply(float *x /*[n][n_heads][D] f32*/, const int32_t *pos /*[n]*/, int n,
                       int n_heads, int D, const float *inv_freq /*[D/2] f32*/);

#ifdef __cplusplus
}
#endif

#endif // NB_OPS_REF_H
