// elementwise_cuda.cuh: device functions of one element, shared by
// ops_cuda.cu's kernels and linear_cuda.cu's epilogues
// (nb_cuda_matmul_wq_swiglu, nb_cuda_matmul_wq_rope), so that a fused
// epilogue stores the bits of the kernel it replaces. Each is the twin of
// its ops_ref.c function (see ops_cuda.h for the contracts and tolerances).
#ifndef NB_ELEMENTWISE_CUDA_CUH
#define NB_ELEMENTWISE_CUDA_CUH

#include "dtype_cuda.cuh"
#include "nb_dtype.h"

namespace nb_ops {

// SwiGLU, nb_ref_silu_mul: (g / (1 + exp(-g))) * u, exp in double rounded
// once to f32, every f32 operation rounded to nearest.
__device__ __forceinline__ float silu_mul(float g, float u) {
    const float ex = __double2float_rn(exp(-(double)g));
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, ex)), u);
}

// RoPE's rotation of dims (i, i + D/2) at position p with frequency f
// (inv_freq[i]): the angle p*f rounded to f32, its cos and sin in double
// rounded once; y0 = x0 c - x1 s, y1 = x1 c + x0 s.
__device__ __forceinline__ void rope_cs(float p, float f, float &c, float &s) {
    const float a = __fmul_rn(p, f);
    c = __double2float_rn(cos((double)a));
    s = __double2float_rn(sin((double)a));
}
__device__ __forceinline__ void rope_rot(float x0, float x1, float c, float s, float &y0, float &y1) {
    y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    y1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
}

// Element i of p as dtype t (f32, f16, bf16), converted as nb_dtype.h does.
__device__ __forceinline__ void store_as(void *p, nb_dtype t, size_t i, float v) {
    if (t == NB_DTYPE_F32) ((float *)p)[i] = v;
    else if (t == NB_DTYPE_F16) ((uint16_t *)p)[i] = nb_dt::f32_to_f16(v);
    else ((uint16_t *)p)[i] = nb_dt::f32_to_bf16(v);
}

} // namespace nb_ops

#endif
