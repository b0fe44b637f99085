// wquant.h: hierarchical 4/8-bit weight quantization (QuantSpec weights).
//
// The one idea: one set of bytes serves both models. Along each row's k
// dimension, per group of g = nb_wq_group_size(k) weights (128, or k itself
// when k < 128 and k % 32 == 0), with mn/mx the group's min/max:
//   s = the smallest f16 >= the double ((double)mx - (double)mn) / 15
//   z = mn rounded to the nearest f16
//   U = clamp(rintf((x - z) / s), 0, 15)          (f32 arithmetic)
//   r = x - (U * s + z)                            (f32, in this order)
//   L = clamp(rintf((r / s) * 16), -8, 7)
//   s == 0 (constant group) -> U = L = 0
// The draft reads w4 = U*s + z (upper plane + scales); the target's 8-bit
// view reads w8 = (16U + L) * (s/16) + z (both planes). Storage:
//   upper [m][k/2] bytes: byte j holds element 2j in bits 0-3, 2j+1 in 4-7
//   lower [m][k/2] bytes: L + 8 (offset binary), same packing
//   scale [m][k/g] f16 bits, zero [m][k/g] f16 bits
// Error (|x - w|, x inside [z, z + 15s]): w4 <= s/2; w8 <= s/32, or <= s/16
// where L clamps at 7. Because z is mn rounded to f16 (not down), elements
// within |mn - z| of the edges may exceed these by up to |mn - z| (at most
// half an f16 ulp of mn); a constant group is exact iff its value is an f16.
#ifndef NB_WQUANT_H
#define NB_WQUANT_H

#include <stddef.h>
#include <stdint.h>

#include "nb_dtype.h"
#include "nb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_WQ_GROUP 128

// A quantized weight matrix W[m][k] (the caller owns all four buffers).
typedef struct nb_wq_tensor {
    const uint8_t *upper;  // [m][k/2] U nibbles
    const uint8_t *lower;  // [m][k/2] L+8 nibbles; NULL for a draft-only tensor
    const uint16_t *scale; // [m][k/g] f16 s
    const uint16_t *zero;  // [m][k/g] f16 z
} nb_wq_tensor;

// Group size for rows of length k: 128 if k % 128 == 0, else k if
// 32 <= k < 128 and k % 32 == 0, else 0 (unsupported).
int nb_wq_group_size(int k);

// Sizes of the four buffers of an [m][k] tensor: bytes of each plane
// (m*k/2) and number of f16 elements in each of scale and zero (m*k/g).
// Returns NB_OK, or NB_ERR_INVALID_ARG (m < 0 or unsupported k).
nb_status nb_wq_sizes(int m, int k, size_t *plane_bytes, size_t *n_groups);

// Quantize w (any dtype). lower may be NULL (draft-only: the lower plane is
// not written). Returns NB_OK; NB_ERR_INVALID_ARG (m < 0, unsupported k);
// NB_ERR_NON_FINITE (a NaN or Inf weight; nothing written); or
// NB_ERR_UNSUPPORTED (a group's range or min overflows f16; output partial).
nb_status nb_wq_quantize(const void *w /*[m][k] dt*/, nb_dtype dt, int m, int k,
                         uint8_t *upper /*[m][k/2]*/, uint8_t *lower /*[m][k/2] or NULL*/,
                         uint16_t *scale /*[m][k/g] f16*/, uint16_t *zero /*[m][k/g] f16*/);

// out = w4 (use_lower == 0) or w8 (use_lower == 1), each element computed in
// f32 as U*s + z, or C8*(s/16) + z with C8 = 16U + L.
void nb_wq_dequantize(float *out /*[m][k] f32*/, const nb_wq_tensor *w, int use_lower, int m,
                      int k);

// out[i][j] = sum over groups G of x[i] . W[j] in the chosen view, + bias[j],
// with the dequantization folded into the group sums: per group,
// d = dot(x_G, C_G) of the integer codes (C = U, or C8 = 16U + L) in 8-lane
// order (ops_ref.h) over the group's elements taken in "nibble order" (each
// 16-element chunk as its 8 even elements, then its 8 odd ones: lane l adds
// elements 16c+2l and 16c+2l+1 in turn), and xs = nb_ref_sum8(x_G) in index
// order; the group contributes
// (sc * d) + (z * xs), sc = s (4-bit) or s/16 (8-bit), so the zero term
// costs one multiply per group. Contributions are added in group order
// starting from +0, then the bias (f32) is added. Large products are split
// over two threads with bit-identical results (as nb_ref_matmul).
// use_lower == 1 requires w->lower. k must be supported (nb_wq_group_size).
void nb_ref_matmul_wq(float *out /*[n][m] f32*/, const float *x /*[n][k] f32*/,
                      const nb_wq_tensor *w, int use_lower,
                      const void *bias /*[m] bias_dt or NULL*/, nb_dtype bias_dt, int n, int m,
                      int k);

#ifdef __cplusplus
}
#endif

#endif // NB_WQUANT_H
