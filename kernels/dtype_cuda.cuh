// dtype_cuda.cuh: device twins of nb_dtype.h's conversions (host-only
// inline functions there), bit for bit, NaN patterns included (cuda_fp16's
// conversions do not share them). Included by the kernels that store f16 /
// bf16 values the C reference stores through nb_dtype.h.
#ifndef NB_DTYPE_CUDA_CUH
#define NB_DTYPE_CUDA_CUH

#include <stdint.h>

namespace nb_dt {

__device__ __forceinline__ float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return __uint_as_float(sign);
        float v = __fmul_rn((float)man, 1.0f / 16777216.0f); // exact
        return sign ? -v : v;
    }
    if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

__device__ __forceinline__ float bf16_to_f32(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ uint16_t f32_to_f16(float f) {
    uint32_t u = __float_as_uint(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u;
    if (a < 0x38800000u) {
        float v = __fmul_rn(__uint_as_float(a), 16777216.0f);
        uint32_t m = __float2uint_rz(v);
        float rem = __fsub_rn(v, __uint2float_rn(m));
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
        return sign | (uint16_t)m;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return sign | (uint16_t)(((r >> 13) - (112u << 10)) & 0xffffu);
}

// nb_f32_to_f16_sat: finite values past the f16 range to +-65504.
__device__ __forceinline__ uint16_t f32_to_f16_sat(float f) {
    const uint32_t u = __float_as_uint(f), a = u & 0x7fffffffu;
    return a < 0x7f800000u && a >= 0x477ff000u ? (uint16_t)(((u >> 16) & 0x8000u) | 0x7bffu) : f32_to_f16(f);
}

} // namespace nb_dt

#endif
