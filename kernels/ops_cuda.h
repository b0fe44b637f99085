// ops_cuda.h: CUDA twins of the dense transformer ops in ops_ref.h
// (RMSNorm, RoPE, SwiGLU, residual add, embedding lookup), the KV-cache row
// write of the cpu backend (write_kv) and dtype conversions of activations.
//
// The one idea: each kernel performs the same f32 operations, in the same
// order, as its C twin, with every rounding spelled out (__fadd_rn,
// __fmul_rn, ... so no fma can be contracted whatever the nvcc flags), so
// the results are bit-identical to the reference. The two exceptions are the
// transcendental functions, which libm and CUDA compute differently:
//   - SwiGLU's expf and RoPE's cosf/sinf are evaluated in double and rounded
//     to f32 once (an almost always correctly rounded f32, i.e. closer to
//     glibc's < 1 ulp results than CUDA's 2-ulp cosf/sinf/expf); they may
//     still differ from glibc by 1 ulp now and then (glibc is not correctly
//     rounded everywhere: about 1 in 1600 expf and 1 in 80 sinf/cosf
//     arguments above 100 rad differ), which the tests allow for.
// RMSNorm reproduces the 64-lane summation order of ops_ref.h exactly (64
// f32 chains in k order, then the fixed tree), so it is bit-exact too.
//
// Conventions: all pointers are device pointers; every function only
// enqueues work on `stream` (no synchronisation, no allocation) and returns
// NB_OK, NB_ERR_INVALID_ARG (a size or pointer outside its documented range,
// checked on the host before anything is launched) or NB_ERR_BACKEND (the
// launch failed; the CUDA error is left for cudaGetLastError's caller to
// log). Usable from C and C++.
#ifndef NB_OPS_CUDA_H
#define NB_OPS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kv_layout.h"
#include "nb_dtype.h"
#include "nb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Largest row width nb_cuda_rmsnorm accepts (the row is staged in shared
// memory: d * 4 bytes).
#define NB_CUDA_RMSNORM_MAX_D 49152

// RMSNorm, bit-exact twin of nb_ref_rmsnorm: out[i][j] = (x[i][j] * r_i) * w[j],
// r_i = 1 / sqrtf(sum(x_i^2) / d + eps), the sum in the 64-lane order.
// One block per row; the 64 lane chains are sequential (d/64 dependent adds),
// the rest is parallel. out may equal x.
// Returns NB_ERR_INVALID_ARG for n < 0, d < 1 or d > NB_CUDA_RMSNORM_MAX_D,
// an unknown dtype, or NULL pointers with n > 0.
nb_status nb_cuda_rmsnorm(float *out /*[n][d] f32*/, const float *x /*[n][d] f32*/,
                          const void *w /*[d] dt*/, nb_dtype dt, int n, int d, float eps,
                          cudaStream_t stream);

// RoPE's (cos, sin) for every row and frequency: cs[r][i] = (cos, sin) of
// pos[r] * inv_freq[i], i < D/2, computed exactly as nb_cuda_rope_apply and
// nb_cuda_rope_write_kv compute them (for nb_cuda_matmul_wq_rope, whose
// epilogue reads them: the engine fills one table per pass and every layer
// reads it). Returns NB_ERR_INVALID_ARG for D odd, < 2 or > 1024, n < 0 or
// NULL pointers with n > 0. Launched with programmatic stream
// serialization (it reads only pos and inv_freq, which no kernel of a pass
// writes), triggering at entry.
nb_status nb_cuda_rope_table(float *cs /*[n][D/2][2] f32*/, const int32_t *pos /*[n]*/, int n, int D,
                             const float *inv_freq /*[D/2]*/, cudaStream_t stream);

// In-place RoPE, twin of nb_ref_rope_apply (HF rotate_half, pairs (i, i+D/2)):
// a = (float)pos[t] * inv_freq[i], c = cos(a), s = sin(a) (double, rounded to
// f32: within 1 ulp of glibc's cosf/sinf), x'[i] = x[i]*c - x[i+D/2]*s,
// x'[i+D/2] = x[i+D/2]*c + x[i]*s. inv_freq comes from nb_ref_rope_inv_freq
// (computed on the host, uploaded once). Bit-exact wherever c and s equal
// glibc's; else within 2^-22 * (|x[i]| + |x[i+D/2]|).
// Returns NB_ERR_INVALID_ARG for D odd, < 2 or > 1024, n < 0, n_heads < 0.
nb_status nb_cuda_rope_apply(float *x /*[n][n_heads][D] f32*/, const int32_t *pos /*[n]*/,
                             int n, int n_heads, int D, const float *inv_freq /*[D/2] f32*/,
                             cudaStream_t stream);

// A fused op's converted copy of its f32 result: dt F16 or BF16 rounded as
// nb_store_f32 (sat 0), or F16 saturating as nb_f32_to_f16_sat (sat 1; the
// 4-bit draft's activations); F32 copies. p NULL: no copy.
typedef struct nb_cuda_cvt {
    void *p;
    nb_dtype dt;
    int sat;
} nb_cuda_cvt;

// Residual add + RMSNorm + conversion in one kernel, bit-exact twin of
// nb_ref_add(x, x, res) (skipped when res is NULL), then
// nb_ref_rmsnorm(out, x, w, ...), then the conversion of out's values to cvt
// (nb_store_f32 or nb_f32_to_f16_sat). x is updated in place when res is
// given; out (f32) and cvt.p may each be NULL, not both; out must not equal
// x when res is given. Returns NB_ERR_INVALID_ARG as nb_cuda_rmsnorm, and for
// an unsupported cvt or NULL pointers. Launched with programmatic stream
// serialization (NB_NORM_PDL=0 in the environment: not): w is read before
// the kernel waits for the one before it, x and res after.
nb_status nb_cuda_add_rmsnorm(float *x /*[n][d] f32, in/out*/, const float *res /*[n][d] f32 or NULL*/,
                              const void *w /*[d] dt*/, nb_dtype dt, int n, int d, float eps,
                              float *out /*[n][d] f32 or NULL*/, nb_cuda_cvt cvt /*[n][d]*/,
                              cudaStream_t stream);

// RoPE of q and k, then the KV write, in one kernel: the twin of
// nb_ref_rope_apply on q and on k followed by the cpu backend's write_kv
// (element for element nb_cuda_rope_apply and nb_cuda_write_kv, so the same
// bits as those two). Row r of q is q_in + r*q_stride ([n_heads][D]); its
// rotation goes to q_out [n][n_heads][D] (q_out may equal q_in only when
// q_stride == n_heads*D). Row r of k and of v is at k_in / v_in +
// r*kv_stride ([n_kv_heads][D]); the rotated k and v go to the FP cache at
// (fpblock[r], slot[r]) as nb_cuda_write_kv stores them (a row outside the
// pool or block is skipped). With a fused qkv projection output [n][Hq +
// 2*Hkv]: q_in = qkv, k_in = qkv + Hq, v_in = k_in + Hkv, both strides Hq +
// 2*Hkv. Returns NB_ERR_INVALID_ARG for an invalid layout or layer, D >
// 1024, n < 0, strides shorter than a row, or NULL pointers with n > 0.
// The kernel triggers programmatic dependent launch at entry (a decode
// attention launched after it with nb_pa_args.pdl may start early), and is
// itself launched with programmatic stream serialization (NB_ROPE_PDL=0 in
// the environment: not): it reads pos and inv_freq, computing its first
// rotation angles, before it waits for the kernel before it, so that kernel
// must not write those two (the engine uploads them before the pass).
nb_status nb_cuda_rope_write_kv(float *q_out, const float *q_in, int q_stride, const float *k_in,
                                const float *v_in, int kv_stride, const int32_t *pos /*[n]*/, int n,
                                int n_heads, const float *inv_freq /*[D/2]*/, const nb_kv_layout *lay,
                                void *fp, int layer, const int32_t *fpblock /*[n]*/,
                                const int32_t *slot /*[n]*/, cudaStream_t stream);

// SwiGLU of strided rows into packed ones, with conversion: for r < n and
// i < I, o = silu(gate[r*stride + i]) * up[r*stride + i] exactly as
// nb_cuda_silu_mul, stored to out[r*I + i] (f32, if not NULL) and/or cvt
// (as nb_cuda_add_rmsnorm's). With a fused gate/up projection output
// [n][2I]: gate = gu, up = gu + I, stride 2I. Returns NB_ERR_INVALID_ARG for
// n < 0, I < 1, stride < I, an unsupported cvt or NULL pointers. Launched
// with programmatic stream serialization (NB_SILU_PDL=0: not); it reads
// nothing before it waits for the kernel before it.
nb_status nb_cuda_silu_mul_cvt(float *out /*[n][I] f32 or NULL*/, nb_cuda_cvt cvt /*[n][I]*/,
                               const float *gate, const float *up, int stride, int n, int I,
                               cudaStream_t stream);

// The same for gate|up rows [n][2I] in the SwiGLU row layout
// (linear_cuda.h's nb_cuda_wq_swiglu_row: 16-column group t holds gate
// 8t..8t+7, then up 8t..8t+7), as a cuBLAS matmul of such a matrix writes
// them: o = silu(gu[r][16 (i/8) + i%8]) * gu[r][16 (i/8) + 8 + i%8].
// Returns NB_ERR_INVALID_ARG for n < 0, I % 8 != 0 (or I < 8), an
// unsupported cvt or NULL pointers.
nb_status nb_cuda_silu_mul_cvt_moved(float *out /*[n][I] f32 or NULL*/, nb_cuda_cvt cvt /*[n][I]*/,
                                     const float *gu /*[n][2I] swiglu rows*/, int n, int I,
                                     cudaStream_t stream);

// SwiGLU, twin of nb_ref_silu_mul: out[i] = (g / (1 + e)) * up[i] with
// e = exp(-g) in double rounded to f32 (glibc's expf differs by 1 ulp for
// about 1 argument in 1600; the result then differs by at most a few ulp).
// out may equal gate or up.
nb_status nb_cuda_silu_mul(float *out /*[n] f32*/, const float *gate /*[n] f32*/,
                           const float *up /*[n] f32*/, size_t n, cudaStream_t stream);

// Residual add, bit-exact twin of nb_ref_add: out[i] = a[i] + b[i]; out may
// equal a or b.
nb_status nb_cuda_add(float *out /*[n] f32*/, const float *a /*[n] f32*/,
                      const float *b /*[n] f32*/, size_t n, cudaStream_t stream);

// Embedding lookup, bit-exact twin of nb_ref_embed: out[i] = table[ids[i]]
// converted to f32 (f16 Inf/NaN payloads/subnormals kept). The ids must have
// been validated on the host (0 <= id < vocab): the kernel cannot return a
// status, so a row with an id outside [0, vocab) is filled with NaN instead
// of reading out of bounds.
nb_status nb_cuda_embed(float *out /*[n][d] f32*/, const void *table /*[vocab][d] dt*/,
                        nb_dtype dt, const int32_t *ids /*[n]*/, int n, int d, int vocab,
                        cudaStream_t stream);

// KV write, bit-exact twin of the cpu backend's write_kv: for each row r,
// head h and channel c, K[r][h][c] goes to fp[nb_kv_fp_offset(lay, layer,
// fpblock[r], h, 0, slot[r]) + c] and V likewise with kv = 1, rounded to
// lay->dtype exactly as nb_store_f32 (round to nearest even; f16 overflow to
// Inf; NaN stays NaN with nb_f32_to_f16/nb_f32_to_bf16's bit pattern).
// k and v hold the rows after RoPE, n_kv_heads = lay->n_kv_heads, D =
// lay->head_dim. The caller computes (fpblock, slot) from the block tables
// (idx = pos - n_qblocks*G: fpblock = fpblocks[idx / G], slot = idx % G) and
// guarantees 0 <= fpblock < n_fpblocks and 0 <= slot < G; a row outside
// that range is skipped (not written). Two rows must not share a slot.
// Returns NB_ERR_INVALID_ARG for an invalid layout, layer outside
// [0, n_layers), n < 0 or NULL pointers with n > 0.
nb_status nb_cuda_write_kv(const nb_kv_layout *lay, void *fp /*lay->dtype, nb_kv_pools.fp*/,
                           int layer, const float *k /*[n][n_kv_heads][D] f32*/,
                           const float *v /*[n][n_kv_heads][D] f32*/,
                           const int32_t *fpblock /*[n]*/, const int32_t *slot /*[n]*/, int n,
                           cudaStream_t stream);

// Element-wise conversion of n elements between f32, f16 and bf16 (e.g. f32
// activations to bf16 for cuBLAS): widening is exact, narrowing rounds to
// nearest even exactly like nb_store_f32 (and f16/bf16 to the other 16-bit
// type goes through f32, which is exact). Same dtype: a copy. dst must not
// overlap src unless dst == src with the same element size.
nb_status nb_cuda_convert(void *dst /*[n] dst_dt*/, nb_dtype dst_dt, const void *src /*[n] src_dt*/,
                          nb_dtype src_dt, size_t n, cudaStream_t stream);

// f32 to f16 as nb_f32_to_f16_sat (nb_dtype.h): finite values past the f16
// range become +-65504 rather than Inf (the draft's quantized layers of a
// bf16 model take f16 x: a clamped outlier costs acceptance, an Inf would
// poison the draft's logits). dst must not overlap src. Returns NB_OK,
// NB_ERR_INVALID_ARG (NULL pointers with n > 0) or NB_ERR_BACKEND.
nb_status nb_cuda_convert_f16_sat(uint16_t *dst /*[n]*/, const float *src /*[n]*/, size_t n,
                                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif // NB_OPS_CUDA_H
