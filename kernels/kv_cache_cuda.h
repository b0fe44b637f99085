// kv_cache_cuda.h: the CUDA twins of the block manager's KV work items
// (kv_quant.h): quantize FP block -> quantized block, dequantize (deep
// rollback, target view), copy the first n tokens of an FP block.
//
// The one idea: each launch serves a BATCH of work items, one CTA per
// (item, layer, kv head, K|V) group set, and the quantization reproduces
// nb_kv_quantize_block's codes, scales and zeros BIT FOR BIT: the same f32
// operations in the same order through explicit round-to-nearest intrinsics
// (no fma contraction, IEEE division, rintf, no flush-to-zero), and the scale
// rounded UP to the dtype from the exact double range, as kv_quant.c does.
//
// Items of one call must be independent (no block written by one item and
// read or written by another); the engine executes its work list in order,
// so it batches only runs of same-kind, independent items.
//
// Pointers are DEVICE pointers; nothing is allocated; every launch goes to
// `stream`. Per-item results land in a device status array (0 = NB_OK, else
// a negative nb_status) that the caller reads back when it needs to.
#ifndef NB_KV_CACHE_CUDA_H
#define NB_KV_CACHE_CUDA_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kv_layout.h"
#include "nb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Quantizes FP block fp_src[i] into quantized block q_dst[i] for i < n, all
// layers, kv heads, K and V (nb_kv_quantize_block's math, bit-exact). Every
// value of an item is validated before anything is written: status[i]
// becomes NB_ERR_NON_FINITE (a NaN/Inf or |x| > 2^125 somewhere in the
// block; q_dst[i] left untouched), NB_ERR_INVALID_ARG (a block id out of
// range) or NB_OK. dtypes f32, f16, bf16; any even D, any G >= 1.
// Returns NB_OK (launched; see status), NB_ERR_INVALID_ARG (invalid layout,
// n < 0, NULL pointer with n > 0), NB_ERR_BACKEND (launch failed).
nb_status nb_kv_cuda_quantize_blocks(const nb_kv_layout *lay,  // host struct
                                     const nb_kv_pools *pools, // host struct of device pointers
                                     const int32_t *fp_src,    // device [n] FP block ids
                                     const int32_t *q_dst,     // device [n] quantized block ids
                                     int32_t n,
                                     int32_t *status,          // device [n] per-item nb_status (out)
                                     cudaStream_t stream);

// Deep rollback: dequantizes quantized block q_src[i] in the TARGET view into
// FP block fp_dst[i], each value rounded to the dtype (nearest even) and
// saturated at the largest finite dtype value, like nb_kv_dequantize_block.
// status (may be NULL) receives NB_OK or NB_ERR_INVALID_ARG (id out of
// range: the item is skipped). Returns as nb_kv_cuda_quantize_blocks.
nb_status nb_kv_cuda_dequantize_blocks(const nb_kv_layout *lay, const nb_kv_pools *pools,
                                       const int32_t *q_src,  // device [n] quantized block ids
                                       const int32_t *fp_dst, // device [n] FP block ids
                                       int32_t n,
                                       int32_t *status,       // device [n] or NULL (out)
                                       cudaStream_t stream);

// Copy-on-write: copies tokens 0..n_tokens[i]-1 of FP block src[i] to FP
// block dst[i] (every layer, kv head, K and V); other slots of dst are left
// as they are; src == dst is a no-op. status (may be NULL): NB_OK or
// NB_ERR_INVALID_ARG (id or n_tokens out of range: skipped).
// Returns as nb_kv_cuda_quantize_blocks.
nb_status nb_kv_cuda_copy_fp_blocks(const nb_kv_layout *lay, const nb_kv_pools *pools,
                                    const int32_t *src,      // device [n] FP block ids
                                    const int32_t *dst,      // device [n] FP block ids
                                    const int32_t *n_tokens, // device [n] tokens to copy, 0..G
                                    int32_t n,
                                    int32_t *status,         // device [n] or NULL (out)
                                    cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif // NB_KV_CACHE_CUDA_H
