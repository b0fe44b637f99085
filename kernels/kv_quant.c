// kv_quant.c: scalar reference of the hierarchical INT4/INT8 KV quantization
// (kv_quant.h specifies the math). The one idea: every operation is written
// out in f32 exactly as the CUDA kernel must perform it, so codes agree bit
// for bit; the build compiles this file with -ffp-contract=off (no fma).
#include "kv_quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF // gcc: -ffp-contract=off from kernels/CMakeLists.txt
#endif

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "kv_quant.c needs f32 arithmetic evaluated in f32 (FLT_EVAL_METHOD 0)"
#endif

static int shape_ok(int G, int D, nb_dtype dt) {
    return G >= 1 && D >= 2 && (D & 1) == 0 &&
           (dt == NB_DTYPE_F32 || dt == NB_DTYPE_F16 || dt == NB_DTYPE_BF16);
}

static int value_ok(float x) { return isfinite(x) && fabsf(x) <= NB_KV_QUANT_MAX_ABS; }

// 1 if all n dtype values of src are quantizable (finite, within range).
static int values_ok(const void *src, nb_dtype dt, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!value_ok(nb_load_f32(src, dt, i))) return 0;
    return 1;
}

// The next dtype value above h >= 0 (h a dtype value, below the dtype max).
static float dtype_next_up(float h, nb_dtype dt) {
    if (dt == NB_DTYPE_F16) return nb_f16_to_f32((uint16_t)(nb_f32_to_f16(h) + 1u));
    if (dt == NB_DTYPE_BF16) return nb_bf16_to_f32((uint16_t)(nb_f32_to_bf16(h) + 1u));
    return nextafterf(h, INFINITY);
}

float nb_kv_scale_round_up(double s_exact, nb_dtype dt) {
    NB_ASSERT(s_exact >= 0.0 && s_exact <= 0x1p126 / 15.0);
    // NOTE: the smallest f32 >= s_exact first; dtype values are a subset of
    // f32, so the smallest dtype value >= it is the one >= s_exact.
    float f = (float)s_exact;
    if ((double)f < s_exact) f = nextafterf(f, INFINITY);
    if (dt == NB_DTYPE_F32) return f;
    float h = nb_round_to_dtype(f, dt);
    if (h < f) h = dtype_next_up(h, dt);
    return h;
}

void nb_kv_encode(float x, float s, float z, int *u, int *l) {
    if (s == 0.0f) {
        *u = 0;
        *l = 0;
        return;
    }
    float uf = rintf((x - z) / s);
    uf = uf < 0.0f ? 0.0f : uf > 15.0f ? 15.0f : uf;
    float r = x - (uf * s + z);
    float lf = rintf((r / s) * 16.0f);
    lf = lf < -8.0f ? -8.0f : lf > 7.0f ? 7.0f : lf;
    *u = (int)uf;
    *l = (int)lf;
}

float nb_kv_decode(int u, int l, float s, float z, nb_kv_view view) {
    if (view == NB_KV_VIEW_DRAFT) return (float)u * s + z;
    return (float)(16 * u + l) * (s * 0.0625f) + z;
}

// Stores S, Z of the group of n values src[base + i*stride] at index `at` of
// scale/zero (values already validated).
static void group_params(const void *src, nb_dtype dt, size_t base, size_t stride, int n,
                         void *scale, void *zero, size_t at) {
    float mn = nb_load_f32(src, dt, base), mx = mn;
    for (int i = 1; i < n; i++) {
        float x = nb_load_f32(src, dt, base + (size_t)i * stride);
        if (x < mn) mn = x;
        if (x > mx) mx = x;
    }
    double s_exact = ((double)mx - (double)mn) / 15.0;
    nb_store_f32(scale, dt, at, nb_kv_scale_round_up(s_exact, dt));
    nb_store_f32(zero, dt, at, mn);
}

// Codes of the [G][D] values of src, channel c / token t using the S, Z at
// index (per_channel ? c : t) of scale/zero.
static void encode_rows(int G, int D, nb_dtype dt, const void *src, int per_channel,
                        const void *scale, const void *zero, uint8_t *upper, uint8_t *lower) {
    for (int t = 0; t < G; t++) {
        for (int j = 0; j < D / 2; j++) {
            int u[2], l[2];
            for (int k = 0; k < 2; k++) {
                int c = 2 * j + k;
                size_t at = per_channel ? (size_t)c : (size_t)t;
                float x = nb_load_f32(src, dt, (size_t)t * D + c);
                nb_kv_encode(x, nb_load_f32(scale, dt, at), nb_load_f32(zero, dt, at), &u[k], &l[k]);
            }
            upper[(size_t)t * (D / 2) + j] = nb_kv_nibble_pack(u[0], u[1]);
            lower[(size_t)t * (D / 2) + j] =
                nb_kv_nibble_pack(l[0] + NB_KV_LOWER_BIAS, l[1] + NB_KV_LOWER_BIAS);
        }
    }
}

// Quantize a validated [G][D] group set: per channel (K) or per token (V).
static void quantize_group(int G, int D, nb_dtype dt, const void *src, int per_channel,
                           uint8_t *upper, uint8_t *lower, void *scale, void *zero) {
    if (per_channel)
        for (int c = 0; c < D; c++) group_params(src, dt, (size_t)c, (size_t)D, G, scale, zero, (size_t)c);
    else
        for (int t = 0; t < G; t++) group_params(src, dt, (size_t)t * D, 1, D, scale, zero, (size_t)t);
    encode_rows(G, D, dt, src, per_channel, scale, zero, upper, lower);
}

static nb_status quantize_checked(int G, int D, nb_dtype dt, const void *src, int per_channel,
                                  uint8_t *upper, uint8_t *lower, void *scale, void *zero) {
    if (!shape_ok(G, D, dt) || !src || !upper || !lower || !scale || !zero) return NB_ERR_INVALID_ARG;
    if (!values_ok(src, dt, (size_t)G * D)) return NB_ERR_NON_FINITE;
    quantize_group(G, D, dt, src, per_channel, upper, lower, scale, zero);
    return NB_OK;
}

nb_status nb_kv_quantize_k(int G, int D, nb_dtype dt, const void *src, uint8_t *upper,
                           uint8_t *lower, void *scale, void *zero) {
    return quantize_checked(G, D, dt, src, 1, upper, lower, scale, zero);
}

nb_status nb_kv_quantize_v(int G, int D, nb_dtype dt, const void *src, uint8_t *upper,
                           uint8_t *lower, void *scale, void *zero) {
    return quantize_checked(G, D, dt, src, 0, upper, lower, scale, zero);
}

// Dequantize [G][D] into element `base` onward of out (dtype out_dt). With
// saturate, values past the largest finite out_dt value are clamped to it.
static void dequantize_group(int G, int D, nb_dtype dt, const uint8_t *upper, const uint8_t *lower,
                             const void *scale, const void *zero, int per_channel, nb_kv_view view,
                             void *out, nb_dtype out_dt, size_t base, int saturate) {
    float fmax = out_dt == NB_DTYPE_F16 ? 65504.0f
               : out_dt == NB_DTYPE_BF16 ? nb_bf16_to_f32(0x7f7f) : FLT_MAX;
    for (int t = 0; t < G; t++) {
        const uint8_t *urow = upper + (size_t)t * (D / 2);
        const uint8_t *lrow = view == NB_KV_VIEW_TARGET ? lower + (size_t)t * (D / 2) : NULL;
        for (int c = 0; c < D; c++) {
            size_t at = per_channel ? (size_t)c : (size_t)t;
            int u = nb_kv_nibble_get(urow, c);
            int l = lrow ? nb_kv_nibble_get(lrow, c) - NB_KV_LOWER_BIAS : 0;
            float v = nb_kv_decode(u, l, nb_load_f32(scale, dt, at), nb_load_f32(zero, dt, at), view);
            if (saturate) v = v > fmax ? fmax : v < -fmax ? -fmax : v;
            nb_store_f32(out, out_dt, base + (size_t)t * D + c, v);
        }
    }
}

static nb_status dequantize_checked(int G, int D, nb_dtype dt, const uint8_t *upper,
                                    const uint8_t *lower, const void *scale, const void *zero,
                                    int per_channel, nb_kv_view view, float *dst) {
    if (!shape_ok(G, D, dt) || !upper || !scale || !zero || !dst) return NB_ERR_INVALID_ARG;
    if (view != NB_KV_VIEW_DRAFT && view != NB_KV_VIEW_TARGET) return NB_ERR_INVALID_ARG;
    if (view == NB_KV_VIEW_TARGET && !lower) return NB_ERR_INVALID_ARG;
    dequantize_group(G, D, dt, upper, lower, scale, zero, per_channel, view, dst, NB_DTYPE_F32, 0, 0);
    return NB_OK;
}

nb_status nb_kv_dequantize_k(int G, int D, nb_dtype dt, const uint8_t *upper, const uint8_t *lower,
                             const void *scale, const void *zero, nb_kv_view view, float *dst) {
    return dequantize_checked(G, D, dt, upper, lower, scale, zero, 1, view, dst);
}

nb_status nb_kv_dequantize_v(int G, int D, nb_dtype dt, const uint8_t *upper, const uint8_t *lower,
                             const void *scale, const void *zero, nb_kv_view view, float *dst) {
    return dequantize_checked(G, D, dt, upper, lower, scale, zero, 0, view, dst);
}

// ---- block work items on host pools ----

static int pools_ok(const nb_kv_layout *lay, const nb_kv_pools *p) {
    return nb_kv_layout_valid(lay) && p && p->upper && p->lower && p->scales && p->fp;
}

nb_status nb_kv_quantize_block(const nb_kv_layout *lay, const nb_kv_pools *pools,
                               int32_t fp_block, int32_t q_block) {
    if (!pools_ok(lay, pools)) return NB_ERR_INVALID_ARG;
    if (fp_block < 0 || fp_block >= lay->n_fpblocks || q_block < 0 || q_block >= lay->n_qblocks)
        return NB_ERR_INVALID_ARG;
    const int G = lay->group_size, D = lay->head_dim;
    const nb_dtype dt = lay->dtype;
    const size_t es = nb_kv_dtype_bytes(dt);
    const uint8_t *fp = pools->fp;
    uint8_t *upper = pools->upper, *lower = pools->lower, *scales = pools->scales;

    for (int32_t layer = 0; layer < lay->n_layers; layer++)
        for (int32_t h = 0; h < lay->n_kv_heads; h++)
            for (int32_t kv = 0; kv < 2; kv++)
                if (!values_ok(fp + nb_kv_fp_offset(lay, layer, fp_block, h, kv, 0) * es, dt,
                               (size_t)G * D))
                    return NB_ERR_NON_FINITE;

    for (int32_t layer = 0; layer < lay->n_layers; layer++) {
        for (int32_t h = 0; h < lay->n_kv_heads; h++) {
            for (int32_t kv = 0; kv < 2; kv++) {
                const void *src = fp + nb_kv_fp_offset(lay, layer, fp_block, h, kv, 0) * es;
                size_t po = nb_kv_plane_offset(lay, layer, q_block, h, kv, 0);
                nb_kv_scale_part sp = kv ? NB_KV_V_SCALE : NB_KV_K_SCALE;
                nb_kv_scale_part zp = kv ? NB_KV_V_ZERO : NB_KV_K_ZERO;
                quantize_group(G, D, dt, src, kv == 0, upper + po, lower + po,
                               scales + nb_kv_scales_offset(lay, layer, q_block, h, sp) * es,
                               scales + nb_kv_scales_offset(lay, layer, q_block, h, zp) * es);
            }
        }
    }
    return NB_OK;
}

nb_status nb_kv_dequantize_block(const nb_kv_layout *lay, const nb_kv_pools *pools,
                                 int32_t q_block, int32_t fp_block) {
    if (!pools_ok(lay, pools)) return NB_ERR_INVALID_ARG;
    if (fp_block < 0 || fp_block >= lay->n_fpblocks || q_block < 0 || q_block >= lay->n_qblocks)
        return NB_ERR_INVALID_ARG;
    const int G = lay->group_size, D = lay->head_dim;
    const nb_dtype dt = lay->dtype;
    const size_t es = nb_kv_dtype_bytes(dt);
    const uint8_t *upper = pools->upper, *lower = pools->lower, *scales = pools->scales;

    for (int32_t layer = 0; layer < lay->n_layers; layer++) {
        for (int32_t h = 0; h < lay->n_kv_heads; h++) {
            for (int32_t kv = 0; kv < 2; kv++) {
                size_t po = nb_kv_plane_offset(lay, layer, q_block, h, kv, 0);
                nb_kv_scale_part sp = kv ? NB_KV_V_SCALE : NB_KV_K_SCALE;
                nb_kv_scale_part zp = kv ? NB_KV_V_ZERO : NB_KV_K_ZERO;
                dequantize_group(G, D, dt, upper + po, lower + po,
                                 scales + nb_kv_scales_offset(lay, layer, q_block, h, sp) * es,
                                 scales + nb_kv_scales_offset(lay, layer, q_block, h, zp) * es,
                                 kv == 0, NB_KV_VIEW_TARGET, pools->fp, dt,
                                 nb_kv_fp_offset(lay, layer, fp_block, h, kv, 0), 1);
            }
        }
    }
    return NB_OK;
}

nb_status nb_kv_copy_fp_block(const nb_kv_layout *lay, const nb_kv_pools *pools, int32_t src,
                              int32_t dst, int32_t n_tokens) {
    if (!nb_kv_layout_valid(lay) || !pools || !pools->fp) return NB_ERR_INVALID_ARG;
    if (src < 0 || src >= lay->n_fpblocks || dst < 0 || dst >= lay->n_fpblocks ||
        n_tokens < 0 || n_tokens > lay->group_size)
        return NB_ERR_INVALID_ARG;
    if (src == dst || n_tokens == 0) return NB_OK;
    const size_t es = nb_kv_dtype_bytes(lay->dtype);
    const size_t n = (size_t)n_tokens * lay->head_dim * es;
    uint8_t *fp = pools->fp;
    for (int32_t layer = 0; layer < lay->n_layers; layer++)
        for (int32_t h = 0; h < lay->n_kv_heads; h++)
            for (int32_t kv = 0; kv < 2; kv++)
                memcpy(fp + nb_kv_fp_offset(lay, layer, dst, h, kv, 0) * es,
                       fp + nb_kv_fp_offset(lay, layer, src, h, kv, 0) * es, n);
    return NB_OK;
}
