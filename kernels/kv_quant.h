// kv_quant.h: the scalar C reference of KV-cache quantization (QuantSpec's
// hierarchical INT4/INT8 code) and the cpu backend's block work items.
//
// The one idea: every value x of a quantization group becomes an INT8 code
// C8 = 16*U + L, where U is the asymmetric round-to-nearest INT4 code of x
// (step S, offset Z) and L the symmetric INT4 code of U's residual (step S/16).
// Reading U alone is the draft view; reading both is the target view. The
// CUDA kernels must produce the same CODES bit for bit, so the arithmetic is
// specified operation by operation below (no fma, no flush-to-zero, f32
// evaluated in f32: FLT_EVAL_METHOD 0).
//
// Groups: K is quantized per channel c over the G tokens of a block; V per
// token t over its D channels. For one group x_0..x_{n-1} (dtype values, read
// exactly as f32):
//   1. Reject (NB_ERR_NON_FINITE, nothing written) if any x is NaN or +-Inf,
//      or |x| > NB_KV_QUANT_MAX_ABS (2^125 ~ 4.25e37; only reachable in f32
//      and bf16), which keeps every intermediate below finite.
//   2. mn = min x, mx = max x; S_exact = ((double)mx - (double)mn) / 15.0.
//      S = the smallest dtype value >= S_exact (rounded UP, so 15*S covers the
//      range; nb_kv_scale_round_up); Z = mn (exact). S, Z are stored in dtype.
//   3. S == 0 (constant group): U = 0, L = 0; both views read back Z exactly.
//      Otherwise, in f32, each operation rounded separately:
//        U = clamp(rintf((x - Z) / S), 0, 15)
//        r = x - (U*S + Z)
//        L = clamp(rintf((r / S) * 16.0f), -8, 7)
//      rintf rounds half to even (default rounding mode).
//   4. Draft view:  x_d = U*S + Z
//      Target view: x_t = (float)(16*U + L) * (S * 0.0625f) + Z
//
// Error bounds (exact arithmetic; f32 rounding adds the slack given below).
// With t = (x - Z)/S in [0, 15], U = round(t) needs no clamp and the residual
// r = x - (U*S + Z) lies in [-S/2, S/2], so
//   |x - x_d| <= S/2.
// 16*r/S lies in [-8, 8]. If 16*r/S < 7.5, L = round(16*r/S) and
//   |x - x_t| = |r - L*S/16| <= S/32.
// THE CLAMP CASE: if 16*r/S is in [7.5, 8], i.e. the residual lies in the top
// 1/32 of S (r in [15S/32, S/2]), it rounds to 8 and clamps to L = 7, so
//   |x - x_t| = r - 7S/16 in [S/32, S/16],
// reaching S/16 exactly when r = S/2 (t a half-integer k+1/2 with k even,
// which rintf rounds down). No clamp happens at -8 (16*r/S >= -8), nor at U.
// S itself exceeds the range: (mx - mn)/15 <= S < (mx - mn)/15 * (1 + eps_dt)
// with eps_dt = 2^-10 (f16), 2^-7 (bf16), 2^-23 (f32), plus one subnormal
// ulp when S is subnormal in dtype.
// f32 slack: the computed U*S + Z etc. differ from exact values by at most a
// few roundings (relative 2^-24 each) of quantities bounded by
// |x| + |Z| + 16*S, plus subnormal rounding (absolute 2^-150 each). The
// largest subnormal term: when S < 2^-122 (f32/bf16 groups of values below
// ~1e-36) S*0.0625 is an f32 subnormal rounded by up to 2^-150, and C8 (up to
// 247) multiplies that, adding < 2^-142 to the target-view error. In all,
// 2^-20*(|x| + |Z| + 16*S) + 2^-140 bounds the slack.
//
// Statuses: every function returns NB_OK or a negative nb_status listed above
// it; none allocates. Pointers are host pointers.
#ifndef NB_KV_QUANT_H
#define NB_KV_QUANT_H

#include <stdint.h>

#include "kv_layout.h"
#include "nb_dtype.h"
#include "nb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Largest |x| accepted in a group (2^125); larger values are rejected as
// NB_ERR_NON_FINITE because 15*S, U*S + Z could overflow f32.
#define NB_KV_QUANT_MAX_ABS 0x1p125f

// The stored step for an exact step s_exact >= 0 (<= 2^126/15): the smallest
// value representable in dt that is >= s_exact (f32 for NB_DTYPE_F32).
float nb_kv_scale_round_up(double s_exact, nb_dtype dt);

// Codes of one value x given its group's stored S > 0 and Z (step 3 above):
// *u in [0,15], *l in [-8,7] (l unbiased, not +8).
void nb_kv_encode(float x, float s, float z, int *u, int *l);

// The value of codes (u, l) in `view` (step 4 above; l ignored for DRAFT).
float nb_kv_decode(int u, int l, float s, float z, nb_kv_view view);

// Quantize one (layer, kv head) K group: per channel over G tokens.
// Returns NB_OK; NB_ERR_INVALID_ARG (G < 1, D < 2 or odd, unknown dt, NULL
// pointer); NB_ERR_NON_FINITE (a value is NaN/Inf or over
// NB_KV_QUANT_MAX_ABS: nothing is written).
nb_status nb_kv_quantize_k(int G, int D, nb_dtype dt,
                           const void *src,  // dt    [G][D] K of G tokens
                           uint8_t *upper,   // uint8 [G][D/2] U nibbles (out)
                           uint8_t *lower,   // uint8 [G][D/2] L+8 nibbles (out)
                           void *scale,      // dt    [D] S per channel (out)
                           void *zero);      // dt    [D] Z per channel (out)

// Quantize one (layer, kv head) V group: per token over its D channels.
// Returns as nb_kv_quantize_k.
nb_status nb_kv_quantize_v(int G, int D, nb_dtype dt,
                           const void *src,  // dt    [G][D] V of G tokens
                           uint8_t *upper,   // uint8 [G][D/2] U nibbles (out)
                           uint8_t *lower,   // uint8 [G][D/2] L+8 nibbles (out)
                           void *scale,      // dt    [G] S per token (out)
                           void *zero);      // dt    [G] Z per token (out)

// Dequantize a K group in `view` to f32. lower is ignored (may be NULL) for
// NB_KV_VIEW_DRAFT. Returns NB_OK; NB_ERR_INVALID_ARG (bad sizes, dt, view,
// NULL pointer).
nb_status nb_kv_dequantize_k(int G, int D, nb_dtype dt,
                             const uint8_t *upper, // uint8 [G][D/2]
                             const uint8_t *lower, // uint8 [G][D/2] or NULL (draft)
                             const void *scale,    // dt    [D]
                             const void *zero,     // dt    [D]
                             nb_kv_view view,
                             float *dst);          // f32   [G][D] (out)

// Dequantize a V group in `view` to f32. Returns as nb_kv_dequantize_k.
nb_status nb_kv_dequantize_v(int G, int D, nb_dtype dt,
                             const uint8_t *upper, // uint8 [G][D/2]
                             const uint8_t *lower, // uint8 [G][D/2] or NULL (draft)
                             const void *scale,    // dt    [G]
                             const void *zero,     // dt    [G]
                             nb_kv_view view,
                             float *dst);          // f32   [G][D] (out)

// Work item: quantize FP block fp_block (all G tokens, every layer and kv
// head) into quantized block q_block of the host pools. Every value is
// validated first, so a failure writes nothing.
// Returns NB_OK; NB_ERR_INVALID_ARG (invalid layout, block id out of range,
// NULL pool); NB_ERR_NON_FINITE (some group has a NaN/Inf/over-range value:
// q_block is left untouched).
nb_status nb_kv_quantize_block(const nb_kv_layout *lay, const nb_kv_pools *pools,
                               int32_t fp_block, int32_t q_block);

// Work item (deep rollback): dequantize q_block in the TARGET view into
// fp_block, each value rounded to lay->dtype (nearest even). Values past the
// largest finite dtype value (possible only for f16 groups reaching +-65504,
// by at most S/16) saturate to it instead of becoming Inf.
// Returns NB_OK; NB_ERR_INVALID_ARG (invalid layout, id out of range, NULL pool).
nb_status nb_kv_dequantize_block(const nb_kv_layout *lay, const nb_kv_pools *pools,
                                 int32_t q_block, int32_t fp_block);

// Work item (copy-on-write): copy tokens 0..n_tokens-1 of FP block src to FP
// block dst for every layer, kv head, K and V; other slots of dst are left
// as they are. src == dst is a no-op.
// Returns NB_OK; NB_ERR_INVALID_ARG (invalid layout, id out of range,
// n_tokens outside [0, G], NULL pool).
nb_status nb_kv_copy_fp_block(const nb_kv_layout *lay, const nb_kv_pools *pools,
                              int32_t src, int32_t dst, int32_t n_tokens);

#ifdef __cplusplus
}
#endif

#endif // NB_KV_QUANT_H
