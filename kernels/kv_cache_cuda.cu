// kv_cache_cuda.cu: CUDA work items of the paged KV cache (kv_cache_cuda.h).
// The one idea: the quantization is kv_quant.c transcribed operation by
// operation through __f*_rn intrinsics (never contracted into fma, IEEE
// division) so codes match the C reference bit for bit; the build also
// compiles this file with -fmad=false (kernels/CMakeLists.txt).
#include "kv_cache_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>

namespace {

constexpr int kThreads = 128;

// ---- dtype access (bit patterns as kv_quant.c / nb_dtype.h read them) ----

template <typename T> struct dt;
template <> struct dt<float> {
    static __device__ __forceinline__ float ld(const float *p) { return *p; }
    static __device__ __forceinline__ void st(float *p, float v) { *p = v; }
    static __device__ __forceinline__ float round_up(float f) { return f; }
    static __device__ __forceinline__ float fmax_() { return FLT_MAX; }
};
template <> struct dt<__half> {
    static __device__ __forceinline__ float ld(const __half *p) { return __half2float(*p); }
    static __device__ __forceinline__ void st(__half *p, float v) { *p = __float2half_rn(v); }
    // The smallest f16 value >= f (f >= 0, far below the f16 maximum).
    static __device__ __forceinline__ float round_up(float f) {
        __half h = __float2half_rn(f);
        if (__half2float(h) < f) h = __ushort_as_half((unsigned short)(__half_as_ushort(h) + 1u));
        return __half2float(h);
    }
    static __device__ __forceinline__ float fmax_() { return 65504.0f; }
};
template <> struct dt<__nv_bfloat16> {
    static __device__ __forceinline__ float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
    static __device__ __forceinline__ void st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
    static __device__ __forceinline__ float round_up(float f) {
        __nv_bfloat16 h = __float2bfloat16_rn(f);
        if (__bfloat162float(h) < f)
            h = __ushort_as_bfloat16((unsigned short)(__bfloat16_as_ushort(h) + 1u));
        return __bfloat162float(h);
    }
    static __device__ __forceinline__ float fmax_() { return __uint_as_float(0x7f7f0000u); }
};

__device__ __forceinline__ bool value_ok(float x) { return isfinite(x) && fabsf(x) <= 0x1p125f; }

// nb_kv_scale_round_up: smallest f32 >= s_exact, then smallest dtype value >= it.
template <typename T> __device__ float scale_round_up(double s_exact) {
    float f = __double2float_rn(s_exact);
    if ((double)f < s_exact) f = nextafterf(f, INFINITY);
    return dt<T>::round_up(f);
}

// nb_kv_encode, operation by operation.
__device__ __forceinline__ void encode(float x, float s, float z, int &u, int &l) {
    if (s == 0.0f) {
        u = 0;
        l = 0;
        return;
    }
    float uf = rintf(__fdiv_rn(__fsub_rn(x, z), s));
    uf = uf < 0.0f ? 0.0f : uf > 15.0f ? 15.0f : uf;
    float r = __fsub_rn(x, __fadd_rn(__fmul_rn(uf, s), z));
    float lf = rintf(__fmul_rn(__fdiv_rn(r, s), 16.0f));
    lf = lf < -8.0f ? -8.0f : lf > 7.0f ? 7.0f : lf;
    u = (int)uf;
    l = (int)lf;
}

// Decodes one item-group CTA index into (item, layer, kv head, kv).
struct group_idx {
    int item, layer, head, kv;
};
__device__ __forceinline__ group_idx group_of(const nb_kv_layout &lay, int b) {
    group_idx g;
    g.kv = b & 1;
    b >>= 1;
    g.head = b % lay.n_kv_heads;
    b /= lay.n_kv_heads;
    g.layer = b % lay.n_layers;
    g.item = b / lay.n_layers;
    return g;
}

// Pass 1: any non-quantizable value in an item's FP block marks the item.
template <typename T>
__global__ void __launch_bounds__(kThreads)
validate_kernel(nb_kv_layout lay, const T *fp, const int32_t *fp_src, const int32_t *q_dst,
                int32_t *status) {
    const group_idx g = group_of(lay, blockIdx.x);
    const int32_t f = fp_src[g.item], q = q_dst[g.item];
    if (f < 0 || f >= lay.n_fpblocks || q < 0 || q >= lay.n_qblocks) {
        if (threadIdx.x == 0) status[g.item] = NB_ERR_INVALID_ARG;
        return;
    }
    const T *src = fp + nb_kv_fp_offset(&lay, g.layer, f, g.head, g.kv, 0);
    const int n = lay.group_size * lay.head_dim;
    int bad = 0;
    for (int i = threadIdx.x; i < n; i += kThreads) bad |= !value_ok(dt<T>::ld(src + i));
    if (__syncthreads_or(bad) && threadIdx.x == 0) status[g.item] = NB_ERR_NON_FINITE;
}

// Pass 2: items whose whole block validated are quantized.
// K: thread j owns channels 2j, 2j+1 (per-channel groups over G tokens).
// V: thread t owns token t (per-token groups over D channels).
template <typename T>
__global__ void __launch_bounds__(kThreads)
quantize_kernel(nb_kv_layout lay, nb_kv_pools pools, const int32_t *fp_src, const int32_t *q_dst,
                const int32_t *status) {
    const group_idx g = group_of(lay, blockIdx.x);
    if (status[g.item] != 0) return; // NOTE: validate-first: a bad item writes nothing
    const int G = lay.group_size, D = lay.head_dim, half = D / 2;
    const int32_t f = fp_src[g.item], q = q_dst[g.item];
    const T *src = (const T *)pools.fp + nb_kv_fp_offset(&lay, g.layer, f, g.head, g.kv, 0);
    const size_t po = nb_kv_plane_offset(&lay, g.layer, q, g.head, g.kv, 0);
    uint8_t *up = (uint8_t *)pools.upper + po, *lo = (uint8_t *)pools.lower + po;
    T *sc = (T *)pools.scales +
            nb_kv_scales_offset(&lay, g.layer, q, g.head, g.kv ? NB_KV_V_SCALE : NB_KV_K_SCALE);
    T *ze = (T *)pools.scales +
            nb_kv_scales_offset(&lay, g.layer, q, g.head, g.kv ? NB_KV_V_ZERO : NB_KV_K_ZERO);
    if (g.kv == 0) {
        for (int j = threadIdx.x; j < half; j += kThreads) {
            float s[2], z[2];
            for (int k = 0; k < 2; k++) {
                const int c = 2 * j + k;
                float mn = dt<T>::ld(src + c), mx = mn;
                for (int t = 1; t < G; t++) {
                    float x = dt<T>::ld(src + (size_t)t * D + c);
                    if (x < mn) mn = x;
                    if (x > mx) mx = x;
                }
                double s_exact = ((double)mx - (double)mn) / 15.0;
                s[k] = scale_round_up<T>(s_exact);
                z[k] = mn;
                dt<T>::st(sc + c, s[k]);
                dt<T>::st(ze + c, z[k]);
            }
            for (int t = 0; t < G; t++) {
                int u0, l0, u1, l1;
                encode(dt<T>::ld(src + (size_t)t * D + 2 * j), s[0], z[0], u0, l0);
                encode(dt<T>::ld(src + (size_t)t * D + 2 * j + 1), s[1], z[1], u1, l1);
                up[(size_t)t * half + j] = nb_kv_nibble_pack(u0, u1);
                lo[(size_t)t * half + j] =
                    nb_kv_nibble_pack(l0 + NB_KV_LOWER_BIAS, l1 + NB_KV_LOWER_BIAS);
            }
        }
    } else {
        for (int t = threadIdx.x; t < G; t += kThreads) {
            const T *row = src + (size_t)t * D;
            float mn = dt<T>::ld(row), mx = mn;
            for (int c = 1; c < D; c++) {
                float x = dt<T>::ld(row + c);
                if (x < mn) mn = x;
                if (x > mx) mx = x;
            }
            double s_exact = ((double)mx - (double)mn) / 15.0;
            const float s = scale_round_up<T>(s_exact), z = mn;
            dt<T>::st(sc + t, s);
            dt<T>::st(ze + t, z);
            for (int j = 0; j < half; j++) {
                int u0, l0, u1, l1;
                encode(dt<T>::ld(row + 2 * j), s, z, u0, l0);
                encode(dt<T>::ld(row + 2 * j + 1), s, z, u1, l1);
                up[(size_t)t * half + j] = nb_kv_nibble_pack(u0, u1);
                lo[(size_t)t * half + j] =
                    nb_kv_nibble_pack(l0 + NB_KV_LOWER_BIAS, l1 + NB_KV_LOWER_BIAS);
            }
        }
    }
}

// Target-view dequantization of one group set into an FP block, rounded to
// the dtype with saturation (nb_kv_dequantize_block).
template <typename T>
__global__ void __launch_bounds__(kThreads)
dequantize_kernel(nb_kv_layout lay, nb_kv_pools pools, const int32_t *q_src, const int32_t *fp_dst,
                  int32_t *status) {
    const group_idx g = group_of(lay, blockIdx.x);
    const int32_t q = q_src[g.item], f = fp_dst[g.item];
    const bool ok = q >= 0 && q < lay.n_qblocks && f >= 0 && f < lay.n_fpblocks;
    if (status && threadIdx.x == 0 && g.layer == 0 && g.head == 0 && g.kv == 0)
        status[g.item] = ok ? NB_OK : NB_ERR_INVALID_ARG;
    if (!ok) return;
    const int G = lay.group_size, D = lay.head_dim, half = D / 2;
    const size_t po = nb_kv_plane_offset(&lay, g.layer, q, g.head, g.kv, 0);
    const uint8_t *up = (const uint8_t *)pools.upper + po, *lo = (const uint8_t *)pools.lower + po;
    const T *sc = (const T *)pools.scales +
                  nb_kv_scales_offset(&lay, g.layer, q, g.head, g.kv ? NB_KV_V_SCALE : NB_KV_K_SCALE);
    const T *ze = (const T *)pools.scales +
                  nb_kv_scales_offset(&lay, g.layer, q, g.head, g.kv ? NB_KV_V_ZERO : NB_KV_K_ZERO);
    T *dst = (T *)pools.fp + nb_kv_fp_offset(&lay, g.layer, f, g.head, g.kv, 0);
    const float fmax = dt<T>::fmax_();
    const int n = G * D;
    for (int i = threadIdx.x; i < n; i += kThreads) {
        const int t = i / D, c = i - t * D, at = g.kv ? t : c;
        const int u = nb_kv_nibble_get(up + (size_t)t * half, c);
        const int l = nb_kv_nibble_get(lo + (size_t)t * half, c) - NB_KV_LOWER_BIAS;
        const float s = dt<T>::ld(sc + at), z = dt<T>::ld(ze + at);
        float v = __fadd_rn(__fmul_rn((float)(16 * u + l), __fmul_rn(s, 0.0625f)), z);
        v = v > fmax ? fmax : v < -fmax ? -fmax : v;
        dt<T>::st(dst + i, v);
    }
}

// Copies the first n tokens of every (layer, head, kv) row set of an FP block.
__global__ void __launch_bounds__(kThreads)
copy_kernel(nb_kv_layout lay, uint8_t *fp, const int32_t *src, const int32_t *dst,
            const int32_t *n_tokens, int32_t *status) {
    const group_idx g = group_of(lay, blockIdx.x);
    const int32_t s = src[g.item], d = dst[g.item], n = n_tokens[g.item];
    const bool ok = s >= 0 && s < lay.n_fpblocks && d >= 0 && d < lay.n_fpblocks && n >= 0 &&
                    n <= lay.group_size;
    if (status && threadIdx.x == 0 && g.layer == 0 && g.head == 0 && g.kv == 0)
        status[g.item] = ok ? NB_OK : NB_ERR_INVALID_ARG;
    if (!ok || s == d || n == 0) return;
    const size_t es = nb_kv_dtype_bytes(lay.dtype);
    const uint8_t *a = fp + nb_kv_fp_offset(&lay, g.layer, s, g.head, g.kv, 0) * es;
    uint8_t *b = fp + nb_kv_fp_offset(&lay, g.layer, d, g.head, g.kv, 0) * es;
    const size_t bytes = (size_t)n * lay.head_dim * es;
    if ((((uintptr_t)a | (uintptr_t)b | bytes) & 15) == 0) {
        const uint4 *a4 = (const uint4 *)a;
        uint4 *b4 = (uint4 *)b;
        for (size_t i = threadIdx.x; i < bytes / 16; i += kThreads) b4[i] = a4[i];
    } else {
        for (size_t i = threadIdx.x; i < bytes; i += kThreads) b[i] = a[i];
    }
}

bool pools_ok(const nb_kv_pools *p) { return p && p->upper && p->lower && p->scales && p->fp; }

// Number of CTAs for n items: one per (item, layer, kv head, K|V).
bool grid_for(const nb_kv_layout *lay, int32_t n, unsigned *grid) {
    unsigned long long g = (unsigned long long)n * lay->n_layers * lay->n_kv_heads * 2;
    if (g > 0x7fffffffull) return false;
    *grid = (unsigned)g;
    return true;
}

nb_status launched() { return cudaGetLastError() == cudaSuccess ? NB_OK : NB_ERR_BACKEND; }

} // namespace

extern "C" nb_status nb_kv_cuda_quantize_blocks(const nb_kv_layout *lay, const nb_kv_pools *pools,
                                                const int32_t *fp_src, const int32_t *q_dst,
                                                int32_t n, int32_t *status, cudaStream_t stream) {
    unsigned grid;
    if (!nb_kv_layout_valid(lay) || !pools_ok(pools) || n < 0 || !grid_for(lay, n, &grid))
        return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!fp_src || !q_dst || !status) return NB_ERR_INVALID_ARG;
    if (cudaMemsetAsync(status, 0, sizeof(int32_t) * (size_t)n, stream) != cudaSuccess)
        return NB_ERR_BACKEND;
    switch (lay->dtype) {
    case NB_DTYPE_F32:
        validate_kernel<float><<<grid, kThreads, 0, stream>>>(*lay, (const float *)pools->fp, fp_src,
                                                             q_dst, status);
        quantize_kernel<float><<<grid, kThreads, 0, stream>>>(*lay, *pools, fp_src, q_dst, status);
        break;
    case NB_DTYPE_F16:
        validate_kernel<__half><<<grid, kThreads, 0, stream>>>(*lay, (const __half *)pools->fp,
                                                              fp_src, q_dst, status);
        quantize_kernel<__half><<<grid, kThreads, 0, stream>>>(*lay, *pools, fp_src, q_dst, status);
        break;
    case NB_DTYPE_BF16:
        validate_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
            *lay, (const __nv_bfloat16 *)pools->fp, fp_src, q_dst, status);
        quantize_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(*lay, *pools, fp_src, q_dst,
                                                                     status);
        break;
    }
    return launched();
}

extern "C" nb_status nb_kv_cuda_dequantize_blocks(const nb_kv_layout *lay, const nb_kv_pools *pools,
                                                  const int32_t *q_src, const int32_t *fp_dst,
                                                  int32_t n, int32_t *status, cudaStream_t stream) {
    unsigned grid;
    if (!nb_kv_layout_valid(lay) || !pools_ok(pools) || n < 0 || !grid_for(lay, n, &grid))
        return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!q_src || !fp_dst) return NB_ERR_INVALID_ARG;
    switch (lay->dtype) {
    case NB_DTYPE_F32:
        dequantize_kernel<float><<<grid, kThreads, 0, stream>>>(*lay, *pools, q_src, fp_dst, status);
        break;
    case NB_DTYPE_F16:
        dequantize_kernel<__half><<<grid, kThreads, 0, stream>>>(*lay, *pools, q_src, fp_dst, status);
        break;
    case NB_DTYPE_BF16:
        dequantize_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(*lay, *pools, q_src, fp_dst,
                                                                       status);
        break;
    }
    return launched();
}

extern "C" nb_status nb_kv_cuda_copy_fp_blocks(const nb_kv_layout *lay, const nb_kv_pools *pools,
                                               const int32_t *src, const int32_t *dst,
                                               const int32_t *n_tokens, int32_t n, int32_t *status,
                                               cudaStream_t stream) {
    unsigned grid;
    if (!nb_kv_layout_valid(lay) || !pools || !pools->fp || n < 0 || !grid_for(lay, n, &grid))
        return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!src || !dst || !n_tokens) return NB_ERR_INVALID_ARG;
    copy_kernel<<<grid, kThreads, 0, stream>>>(*lay, (uint8_t *)pools->fp, src, dst, n_tokens, status);
    return launched();
}
