// attention_ref.c: scalar paged attention reference. The one idea: gather the
// sequence's K and V for one kv head into contiguous f32 rows (quantized
// blocks dequantized in the requested view, FP blocks converted exactly), then
// run the one softmax core that the contiguous reference also runs.
#include "attention_ref.h"

#include <math.h>
#include <string.h>

#include "kv_quant.h"
#include "nb_dtype.h"

// One query row against positions 0..n_ctx-1 of k/v (row p at p*stride),
// online softmax accumulated in o. NOTE: a NaN key or value anywhere in the
// window makes the output NaN, which is what the poisoned-slot tests rely on.
static void attend_row(int D, const float *qrow, const float *k, const float *v, size_t stride,
                       int n_ctx, float scale, float *o) {
    float m = -INFINITY, sum = 0.0f;
    for (int c = 0; c < D; c++) o[c] = 0.0f;
    for (int p = 0; p < n_ctx; p++) {
        const float *kp = k + (size_t)p * stride, *vp = v + (size_t)p * stride;
        float dot = 0.0f;
        for (int c = 0; c < D; c++) dot += qrow[c] * kp[c];
        float s = dot * scale;
        if (s > m) {
            float a = expf(m - s);
            sum *= a;
            for (int c = 0; c < D; c++) o[c] *= a;
            m = s;
        }
        float w = expf(s - m);
        sum += w;
        for (int c = 0; c < D; c++) o[c] += w * vp[c];
    }
    float inv = 1.0f / sum;
    for (int c = 0; c < D; c++) o[c] *= inv;
}

// All rows and the q heads of kv head kvh; k/v rows of kv head kvh at stride.
static void attend_kv_head(int kvh, int n_q_heads, int group, int D, const float *k, const float *v,
                           size_t stride, const float *q, int n_rows, int first_pos, float scale,
                           float *out) {
    for (int r = 0; r < n_rows; r++) {
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
            size_t at = ((size_t)r * n_q_heads + h) * D;
            attend_row(D, q + at, k, v, stride, first_pos + r + 1, scale, out + at);
        }
    }
}

nb_status nb_ref_attention_contiguous(int n_tokens, int n_kv_heads, int n_q_heads, int D,
                                      const float *k, const float *v, const float *q, int n_rows,
                                      int first_pos, float softmax_scale, float *out) {
    if (n_tokens < 1 || n_kv_heads < 1 || n_q_heads < 1 || D < 1 || n_q_heads % n_kv_heads ||
        n_rows < 1 || first_pos < 0 || !k || !v || !q || !out)
        return NB_ERR_INVALID_ARG;
    NB_ASSERT((int64_t)first_pos + n_rows <= n_tokens);
    const size_t stride = (size_t)n_kv_heads * D;
    for (int kvh = 0; kvh < n_kv_heads; kvh++)
        attend_kv_head(kvh, n_q_heads, n_q_heads / n_kv_heads, D, k + (size_t)kvh * D,
                       v + (size_t)kvh * D, stride, q, n_rows, first_pos, softmax_scale, out);
    return NB_OK;
}

size_t nb_ref_paged_attention_work_size(const nb_kv_layout *lay, int n_q_blocks, int n_fp_tokens) {
    size_t n_tokens = (size_t)n_q_blocks * lay->group_size + (size_t)n_fp_tokens;
    return 2 * n_tokens * (size_t)lay->head_dim;
}

nb_status nb_ref_paged_attention(const nb_kv_layout *lay, const nb_kv_pools *pools, int layer,
                                 nb_kv_view view, const int32_t *q_blocks, int n_q_blocks,
                                 const int32_t *fp_blocks, int n_fp_tokens, int n_q_heads,
                                 const float *q, int n_rows, int first_pos, float softmax_scale,
                                 float *out, float *work) {
    if (!nb_kv_layout_valid(lay) || !pools || layer < 0 || layer >= lay->n_layers)
        return NB_ERR_INVALID_ARG;
    if (view != NB_KV_VIEW_DRAFT && view != NB_KV_VIEW_TARGET) return NB_ERR_INVALID_ARG;
    if (n_q_blocks < 0 || n_fp_tokens < 0 || n_q_heads < 1 || n_q_heads % lay->n_kv_heads ||
        n_rows < 1 || first_pos < 0 || !q || !out || !work)
        return NB_ERR_INVALID_ARG;
    const int G = lay->group_size, D = lay->head_dim;
    const int n_fp_blocks = (n_fp_tokens + G - 1) / G;
    if (n_q_blocks > 0 && (!q_blocks || !pools->upper || !pools->scales ||
                           (view == NB_KV_VIEW_TARGET && !pools->lower)))
        return NB_ERR_INVALID_ARG;
    if (n_fp_tokens > 0 && (!fp_blocks || !pools->fp)) return NB_ERR_INVALID_ARG;
    for (int i = 0; i < n_q_blocks; i++)
        if (q_blocks[i] < 0 || q_blocks[i] >= lay->n_qblocks) return NB_ERR_INVALID_ARG;
    for (int j = 0; j < n_fp_blocks; j++)
        if (fp_blocks[j] < 0 || fp_blocks[j] >= lay->n_fpblocks) return NB_ERR_INVALID_ARG;
    const int64_t n_tokens = (int64_t)n_q_blocks * G + n_fp_tokens;
    NB_ASSERT((int64_t)first_pos + n_rows <= n_tokens);

    const nb_dtype dt = lay->dtype;
    const size_t es = nb_kv_dtype_bytes(dt);
    float *kw = work, *vw = work + (size_t)n_tokens * D;
    const uint8_t *upper = pools->upper, *lower = pools->lower, *scales = pools->scales;
    for (int32_t kvh = 0; kvh < lay->n_kv_heads; kvh++) {
        for (int i = 0; i < n_q_blocks; i++) {
            const int32_t b = q_blocks[i];
            size_t ko = nb_kv_plane_offset(lay, layer, b, kvh, 0, 0);
            size_t vo = nb_kv_plane_offset(lay, layer, b, kvh, 1, 0);
            nb_status st = nb_kv_dequantize_k(
                G, D, dt, upper + ko, lower ? lower + ko : NULL,
                scales + nb_kv_scales_offset(lay, layer, b, kvh, NB_KV_K_SCALE) * es,
                scales + nb_kv_scales_offset(lay, layer, b, kvh, NB_KV_K_ZERO) * es, view,
                kw + (size_t)i * G * D);
            NB_ASSERT(st == NB_OK);
            st = nb_kv_dequantize_v(
                G, D, dt, upper + vo, lower ? lower + vo : NULL,
                scales + nb_kv_scales_offset(lay, layer, b, kvh, NB_KV_V_SCALE) * es,
                scales + nb_kv_scales_offset(lay, layer, b, kvh, NB_KV_V_ZERO) * es, view,
                vw + (size_t)i * G * D);
            NB_ASSERT(st == NB_OK);
        }
        for (int j = 0; j < n_fp_tokens; j++) {
            const int32_t b = fp_blocks[j / G];
            size_t p = (size_t)n_q_blocks * G + (size_t)j;
            size_t ko = nb_kv_fp_offset(lay, layer, b, kvh, 0, j % G);
            size_t vo = nb_kv_fp_offset(lay, layer, b, kvh, 1, j % G);
            for (int c = 0; c < D; c++) {
                kw[p * D + c] = nb_load_f32(pools->fp, dt, ko + c);
                vw[p * D + c] = nb_load_f32(pools->fp, dt, vo + c);
            }
        }
        attend_kv_head(kvh, n_q_heads, n_q_heads / lay->n_kv_heads, D, kw, vw, (size_t)D, q,
                       n_rows, first_pos, softmax_scale, out);
    }
    return NB_OK;
}
