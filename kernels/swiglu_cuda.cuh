// swiglu_cuda.cuh: SwiGLU of one element, the device twin of nb_ref_silu_mul
// (ops_ref.c) bit for bit: silu(g) * u = (g / (1 + exp(-g))) * u, with
// exp in double rounded once to f32 and every f32 operation rounded to
// nearest. Shared by ops_cuda.cu's SwiGLU kernel and linear_cuda.cu's
// SwiGLU epilogue (nb_cuda_matmul_wq_swiglu), so both give the same bits.
#ifndef NB_SWIGLU_CUDA_CUH
#define NB_SWIGLU_CUDA_CUH

namespace nb_ops {

__device__ __forceinline__ float silu_mul(float g, float u) {
    const float ex = __double2float_rn(exp(-(double)g));
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, ex)), u);
}

} // namespace nb_ops

#endif
