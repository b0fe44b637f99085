// attention_ref.h: the scalar C paged attention reference (the cpu backend's
// attention and the twin of the CUDA paged attention kernel), plus a plain
// contiguous attention used by tests.
//
// The one idea: a sequence's cached positions are the concatenation of its
// quantized blocks (read in the draft or target view) followed by its FP
// blocks; the paged reference gathers them into f32 rows and runs the same
// causal, grouped-query softmax(q.k * scale) v core as the contiguous one, so
// on equal values the two agree bit for bit.
#ifndef NB_ATTENTION_REF_H
#define NB_ATTENTION_REF_H

#include <stddef.h>
#include <stdint.h>

#include "kv_layout.h"
#include "nb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Floats (not bytes) of `work` that nb_ref_paged_attention needs for a
// sequence with n_q_blocks quantized blocks and n_fp_tokens FP tokens:
// 2 * (n_q_blocks*G + n_fp_tokens) * D.
size_t nb_ref_paged_attention_work_size(const nb_kv_layout *lay, int n_q_blocks, int n_fp_tokens);

// Attention of ONE sequence at ONE layer over its paged cache (host pools).
// Positions 0 .. n_q_blocks*G-1 are in the quantized blocks (q_blocks[i]
// holds positions i*G .. i*G+G-1), read in `view`; positions n_q_blocks*G ..
// n_q_blocks*G + n_fp_tokens - 1 are in the FP blocks (fp_blocks[j] holds the
// j-th G of them; only the first n_fp_tokens are read). Query row r is at
// absolute position first_pos + r and attends to positions <= first_pos + r.
// Grouped-query: q head h reads kv head h / (n_q_heads / n_kv_heads).
// out[r][h] = sum_p softmax_p(softmax_scale * q[r][h] . K[p]) V[p], in f32.
// pools->lower may be NULL for NB_KV_VIEW_DRAFT; pools->fp may be NULL when
// n_fp_tokens is 0; upper/scales may be NULL when n_q_blocks is 0.
// Returns NB_OK; NB_ERR_INVALID_ARG (invalid layout, layer or view, negative
// counts, block id out of range, n_q_heads not a positive multiple of
// n_kv_heads, n_rows < 1, first_pos < 0, NULL pointer). Asserts
// first_pos + n_rows <= n_q_blocks*G + n_fp_tokens (a caller bug).
nb_status nb_ref_paged_attention(const nb_kv_layout *lay, const nb_kv_pools *pools, int layer,
                                 nb_kv_view view,
                                 const int32_t *q_blocks,  // [n_q_blocks] quantized block ids
                                 int n_q_blocks,
                                 const int32_t *fp_blocks, // [ceil(n_fp_tokens/G)] FP block ids
                                 int n_fp_tokens,
                                 int n_q_heads,
                                 const float *q,           // [n_rows][n_q_heads][D]
                                 int n_rows, int first_pos, float softmax_scale,
                                 float *out,               // [n_rows][n_q_heads][D] (out)
                                 float *work);             // [nb_ref_paged_attention_work_size]

// The same attention over contiguous f32 K and V of n_tokens positions.
// Returns NB_OK; NB_ERR_INVALID_ARG (non-positive sizes, n_q_heads not a
// multiple of n_kv_heads, first_pos < 0, NULL pointer). Asserts
// first_pos + n_rows <= n_tokens.
nb_status nb_ref_attention_contiguous(int n_tokens, int n_kv_heads, int n_q_heads, int D,
                                      const float *k, // [n_tokens][n_kv_heads][D]
                                      const float *v, // [n_tokens][n_kv_heads][D]
                                      const float *q, // [n_rows][n_q_heads][D]
                                      int n_rows, int first_pos, float softmax_scale,
                                      float *out);    // [n_rows][n_q_heads][D] (out)

#ifdef __cplusplus
}
#endif

#endif // NB_ATTENTION_REF_H
