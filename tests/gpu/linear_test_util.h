// linear_test_util.h: what the linear-layer GPU tests (test_linear_cuda,
// test_dense_ri_cuda) share: a seeded xorshift stream of uniforms, the
// unit roundoff of an output dtype (their tolerances' u_out), and the
// fused forms' references and checks (RoPE stores, the norm scale, the
// residual add).
#ifndef NB_LINEAR_TEST_UTIL_H
#define NB_LINEAR_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

// The norm-scaled (_rs) forms' reference: rows [0, n) of an f32 [.][w]
// device array multiplied by r[row] (then + bias[j], bf16, when bias is not
// NULL) in place, through the host in f32. Returns the first CUDA error.
static inline cudaError_t lt_scale_rows(float *d, int n, int w, const float *r, const uint16_t *bias) {
    const size_t b = (size_t)n * w * sizeof(float);
    float *h = (float *)malloc(b ? b : 1);
    cudaError_t e = cudaMemcpy(h, d, b, cudaMemcpyDeviceToHost);
    for (int i = 0; e == cudaSuccess && i < n; i++)
        for (int j = 0; j < w; j++) {
            float v = h[(size_t)i * w + j] * r[i];
            if (bias) v = v + nb_bf16_to_f32(bias[j]);
            h[(size_t)i * w + j] = v;
        }
    if (e == cudaSuccess) e = cudaMemcpy(d, h, b, cudaMemcpyHostToDevice);
    free(h);
    return e;
}
#endif

// The residual forms' check (nb_cuda_matmul_wq_res, nb_cuda_matmul_dense_ri_res),
// over nm = rows x m elements of which the first `used` are the launch's
// rows: the new x (hx) must be x0 + out bit for bit (nb_cuda_add's
// rounding), xs (hxs) the xs_dt rounding of x * w (wn: bf16 [m]; f16
// saturating, bf16 to nearest even), and past `used` x and xs untouched
// (x0, 0xffff). Adds the faults to *bad, *bad_xs, *past and the saturated
// f16 xs to *sat.
static inline void lt_res_check(size_t nm, size_t used, int m, const float *x0, const float *out, const float *hx,
                                const uint16_t *hxs, const uint16_t *wn, nb_dtype xs_dt, long *bad, long *bad_xs,
                                long *past, long *sat) {
    for (size_t e = 0; e < nm; e++) {
        if (e >= used) {
            *past += memcmp(&hx[e], &x0[e], 4) != 0 || hxs[e] != 0xffff;
            continue;
        }
        const float h = x0[e] + out[e];
        *bad += memcmp(&hx[e], &h, 4) != 0;
        const float hw = h * nb_bf16_to_f32(wn[e % m]);
        const uint16_t want = xs_dt == NB_DTYPE_F16 ? nb_f32_to_f16_sat(hw) : nb_f32_to_bf16(hw);
        *bad_xs += hxs[e] != want;
        *sat += xs_dt == NB_DTYPE_F16 && (want & 0x7fff) == 0x7bff;
    }
}

#endif // NB_LINEAR_TEST_UTIL_H
