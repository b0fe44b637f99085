// linear_test_util.h: what the linear-layer GPU tests (test_linear_cuda,
// test_dense_ri_cuda) share: a seeded xorshift stream of uniforms and the
// unit roundoff of an output dtype (their tolerances' u_out).
#ifndef NB_LINEAR_TEST_UTIL_H
#define NB_LINEAR_TEST_UTIL_H

#include <math.h>
#include <stdint.h>

#include "nb_dtype.h"

// [0, 1) from the xorshift64 state *s (nonzero).
static inline double lt_urand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (double)(*s >> 11) * (1.0 / 9007199254740992.0);
}

// One round-to-nearest of an output in dtype t: 0 for f32, 2^-11 for f16,
// 2^-8 for bf16.
static inline float lt_out_u(nb_dtype t) {
    return t == NB_DTYPE_F32 ? 0.0f : t == NB_DTYPE_F16 ? ldexpf(1.0f, -11) : ldexpf(1.0f, -8);
}

#ifdef __CUDACC__
#include <string.h>

#include <cuda_runtime_api.h>

// The RoPE epilogues' check (test_linear_cuda, test_dense_ri_cuda): the q
// rows (qb bytes) and FP pools (pool_bytes, poisoned with 0xa5 before both
// runs) of the unfused chain (d_qa, d_pa) and the fused call (d_qf, d_pf),
// downloaded through the host buffers ha, hf (max(qb, pool_bytes) each).
// *q_same: the q rows equal; *diff: pool bytes that differ; *written:
// pool bytes the unfused chain wrote. Returns the first CUDA error.
static inline cudaError_t lt_rope_compare(const void *d_qa, const void *d_qf, size_t qb, const void *d_pa,
                                          const void *d_pf, size_t pool_bytes, uint8_t *ha, uint8_t *hf,
                                          bool *q_same, long *diff, long *written) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(ha, d_qa, qb, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemcpy(hf, d_qf, qb, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return e;
    *q_same = memcmp(ha, hf, qb) == 0;
    if ((e = cudaMemcpy(ha, d_pa, pool_bytes, cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (e = cudaMemcpy(hf, d_pf, pool_bytes, cudaMemcpyDeviceToHost)) != cudaSuccess)
        return e;
    *diff = *written = 0;
    for (size_t i = 0; i < pool_bytes; i++) *diff += ha[i] != hf[i], *written += ha[i] != 0xa5;
    return cudaSuccess;
}
#endif

#endif // NB_LINEAR_TEST_UTIL_H
