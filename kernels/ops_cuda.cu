// ops_cuda.cu: CUDA twins of the dense ops of ops_ref.c (contracts in
// ops_cuda.h). Every f32 operation is written with an explicit-rounding
// intrinsic so the sequence of roundings is the reference's, whatever the
// compiler flags.
#include "ops_cuda.h"

#include "dtype_cuda.cuh"
#include "pdl_cuda.cuh"
#include "elementwise_cuda.cuh"

#include <math.h>
#include <stdlib.h>

namespace {

constexpr int kThreads = 256;

// ------------------------------------------------------------ dtypes
using nb_dt::bf16_to_f32;
using nb_dt::f16_to_f32;
using nb_dt::f32_to_bf16;
using nb_dt::f32_to_f16;
using nb_dt::f32_to_f16_sat;

__device__ __forceinline__ float load_f32(const void *p, nb_dtype t, size_t i) {
    if (t == NB_DTYPE_F32) return ((const float *)p)[i];
    if (t == NB_DTYPE_F16) return f16_to_f32(((const uint16_t *)p)[i]);
    return bf16_to_f32(((const uint16_t *)p)[i]);
}

using nb_ops::store_as;
__device__ __forceinline__ void store_f32(void *p, nb_dtype t, size_t i, float v) { store_as(p, t, i, v); }

bool dtype_ok(nb_dtype t) {
    return t == NB_DTYPE_F32 || t == NB_DTYPE_F16 || t == NB_DTYPE_BF16;
}

nb_status launch_status() {
    return cudaGetLastError() == cudaSuccess ? NB_OK : NB_ERR_BACKEND;
}

unsigned grid_for(size_t n, int threads) {
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    // NOTE: grid-stride loops below cover whatever the cap leaves over.
    return (unsigned)(b < 65535u * 16u ? (b ? b : 1) : 65535u * 16u);
}

// Element i of a fused op's converted output.
__device__ __forceinline__ void store_cvt(const nb_cuda_cvt &c, size_t i, float v) {
    if (c.sat) ((uint16_t *)c.p)[i] = f32_to_f16_sat(v);
    else store_f32(c.p, c.dt, i, v);
}

// Programmatic dependent launch (pdl_cuda.cuh): lets the NEXT kernel, when
// it is launched with the PDL attribute (the quantized matmuls' decode
// kernel, which reads its weights before its wait and its input after it),
// start streaming its weights while this small kernel runs. Measured (ncu,
// Llama-3-8B shape, one row): RMSNorm 7.4 us, SwiGLU 3.4 us, conversions
// 2.5 us, each ahead of a matmul.

// A launch, with the programmatic stream serialization attribute when pdl.
template <typename... KArgs, typename... Args>
nb_status launch_ex(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                    Args... args) {
    if (nb_pdl::launch(kern, grid, block, smem, stream, pdl, args...) != cudaSuccess) return NB_ERR_BACKEND;
    return launch_status();
}

// ------------------------------------------------------------ rmsnorm
// One block per row. The row is staged in shared memory; threads 0..63 run
// the 64 lane chains a_l = sum over k = l (mod 64) of x_k*x_k, in k order,
// and warps 0 and 1 combine them by shuffles in the fixed tree of ops_ref.h's
// 64-lane order (ops_ref.c's vector loop plus its scalar tail).
// With res (nb_cuda_add_rmsnorm): x = x + res first (written back, nb_ref_add's
// single rounding), and the normalized row goes to out (f32, if not NULL)
// and/or cvt (converted from that f32 value as the convert kernels do).
// NOTE: one block per row means a decode step's norm (one row) runs on one
// SM, so its latency is the kernel's cost: the loads are issued RN at a
// time per thread (independent, so the latency is paid once per RN
// elements: 17 -> 7.4 us at d = 4096, one row, ncu on an H100), the
// weights before the row, and the sum is 64 chains of d/64 dependent adds
// (the 8-lane order's 8 chains of d/8 took ~2 us of the 7.4).
constexpr int kNormThreads = 1024;
constexpr int RN = 4;
__global__ void __launch_bounds__(kNormThreads) rmsnorm_kernel(float *out, float *x, const float *res,
                                                               const void *w, nb_dtype dt, int d,
                                                               float eps, nb_cuda_cvt cvt) {
    extern __shared__ float xs[]; // [d]
    __shared__ float part[2][8];
    __shared__ float r_sh;
    const size_t row = blockIdx.x;
    float *xi = x + row * (size_t)d;
    float *oi = out ? out + row * (size_t)d : nullptr;
    const float *ri = res ? res + row * (size_t)d : nullptr;
    // The weights of the first output pass are loaded first: they do not
    // depend on the row, so their latency hides under the row's.
    float w0[RN];
#pragma unroll
    for (int u = 0; u < RN; u++) {
        const int j = threadIdx.x + u * blockDim.x;
        w0[u] = j < d ? load_f32(w, dt, (size_t)j) : 0.0f;
    }
    // Launched with programmatic stream serialization (NB_NORM_PDL=0 in the
    // environment: without; the same bits either way), the block starts
    // while the kernel before it drains, loads its weights, waits here for
    // that kernel (which writes x and res), and only then lets the next
    // kernel start (its matmul's weight stream under this kernel).
    // Triggering at entry, before the wait, let that matmul's blocks take SM
    // slots while the matmul before this norm still streamed (batch 8 draft
    // 13.9 -> 14.7 ms, session 30). Measured with SwiGLU the same way (H100,
    // bench_engine_long 4k, two passes): batch-1 draft 10.41 -> 10.02 ms per
    // 4 tokens, batch 8 within noise. Without the attribute the wait returns
    // at once.
    nb_pdl::wait();
    nb_pdl::trigger();
    for (int j0 = threadIdx.x; j0 < d; j0 += RN * blockDim.x) {
        float v[RN], r[RN];
#pragma unroll
        for (int u = 0; u < RN; u++) {
            const int j = j0 + u * blockDim.x;
            v[u] = j < d ? xi[j] : 0.0f;
            r[u] = ri && j < d ? ri[j] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < RN; u++) {
            const int j = j0 + u * blockDim.x;
            if (j >= d) continue;
            if (ri) {
                v[u] = __fadd_rn(v[u], r[u]);
                xi[j] = v[u];
            }
            xs[j] = v[u];
        }
    }
    __syncthreads();
    if (threadIdx.x < 64) {
        float a = 0.0f;
        int k = threadIdx.x;
        // NOTE: the squares of an 8-step window are independent of the chain,
        // so they are loaded and multiplied ahead of the dependent adds.
        for (; k + 64 * 7 < d; k += 64 * 8) {
            float t[8];
#pragma unroll
            for (int u = 0; u < 8; u++) t[u] = __fmul_rn(xs[k + 64 * u], xs[k + 64 * u]);
#pragma unroll
            for (int u = 0; u < 8; u++) a = __fadd_rn(a, t[u]);
        }
        for (; k < d; k += 64) a = __fadd_rn(a, __fmul_rn(xs[k], xs[k]));
        // Lane e < 8 of warp h: ((a_e + a_8+e) + (a_16+e + a_24+e)) of the
        // warp's 32 chains (chains 32h..32h+31).
        a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, 8));
        a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, 16));
        if ((threadIdx.x & 31) < 8) part[threadIdx.x >> 5][threadIdx.x & 7] = a;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const int e = threadIdx.x & 7;
        float b = __fadd_rn(part[0][e], part[1][e]);
        b = __fadd_rn(b, __shfl_down_sync(0xffffffffu, b, 1));
        b = __fadd_rn(b, __shfl_down_sync(0xffffffffu, b, 2));
        b = __fadd_rn(b, __shfl_down_sync(0xffffffffu, b, 4));
        if (threadIdx.x == 0) {
            float ms = __fdiv_rn(b, (float)d);
            r_sh = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
        }
    }
    __syncthreads();
    const float r = r_sh;
    for (int j0 = threadIdx.x; j0 < d; j0 += RN * blockDim.x) {
        float wv[RN];
#pragma unroll
        for (int u = 0; u < RN; u++) {
            const int j = j0 + u * blockDim.x;
            wv[u] = j0 == (int)threadIdx.x ? w0[u] : j < d ? load_f32(w, dt, (size_t)j) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < RN; u++) {
            const int j = j0 + u * blockDim.x;
            if (j >= d) continue;
            const float o = __fmul_rn(__fmul_rn(xs[j], r), wv[u]);
            if (oi) oi[j] = o;
            if (cvt.p) store_cvt(cvt, row * (size_t)d + j, o);
        }
    }
}

// ------------------------------------------------------------ rope
// One block per token: the D/2 (cos, sin) pairs once, then every head.
__global__ void __launch_bounds__(kThreads) rope_kernel(float *x, const int32_t *pos,
                                                        int n_heads, int D,
                                                        const float *inv_freq) {
    __shared__ float cs[512], sn[512];
    const int h = D / 2;
    const size_t t = blockIdx.x;
    const float p = (float)pos[t];
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        float a = __fmul_rn(p, inv_freq[i]);
        // NOTE: double evaluation rounded once is within 1 ulp of glibc's
        // cosf/sinf (CUDA's precise cosf/sinf are only within 2 ulp).
        cs[i] = __double2float_rn(cos((double)a));
        sn[i] = __double2float_rn(sin((double)a));
    }
    __syncthreads();
    float *xt = x + t * (size_t)n_heads * D;
    for (int e = threadIdx.x; e < n_heads * h; e += blockDim.x) {
        int hd = e / h, i = e - hd * h;
        float *v = xt + (size_t)hd * D;
        float x0 = v[i], x1 = v[i + h], c = cs[i], s = sn[i];
        v[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        v[i + h] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    }
}

// ------------------------------------------------------------ elementwise
__global__ void silu_mul_kernel(float *out, const float *gate, const float *up, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        out[i] = nb_ops::silu_mul(gate[i], up[i]);
    }
}

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __fadd_rn(a[i], b[i]);
}

__global__ void embed_kernel(float *out, const void *table, nb_dtype dt, const int32_t *ids,
                             int d, int vocab) {
    const size_t row = blockIdx.x;
    const int32_t id = ids[row];
    float *o = out + row * (size_t)d;
    const bool ok = id >= 0 && id < vocab;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        o[j] = ok ? load_f32(table, dt, (size_t)id * d + j) : __uint_as_float(0x7fc00000u);
}

// One block per (row, kv head): K and V rows of D channels.
__global__ void write_kv_kernel(nb_kv_layout lay, void *fp, int layer, const float *k,
                                const float *v, const int32_t *fpblock, const int32_t *slot) {
    const int r = blockIdx.x, hd = blockIdx.y, D = lay.head_dim;
    const int32_t fb = fpblock[r], sl = slot[r];
    if (fb < 0 || fb >= lay.n_fpblocks || sl < 0 || sl >= lay.group_size) return;
    const size_t ko = nb_kv_fp_offset(&lay, layer, fb, hd, 0, sl);
    const size_t vo = nb_kv_fp_offset(&lay, layer, fb, hd, 1, sl);
    const size_t src = ((size_t)r * lay.n_kv_heads + hd) * D;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        store_f32(fp, lay.dtype, ko + c, k[src + c]);
        store_f32(fp, lay.dtype, vo + c, v[src + c]);
    }
}

// nb_f32_to_f16_sat: finite values past the f16 range to +-65504.
__global__ void convert_f16_sat_kernel(uint16_t *dst, const float *src, size_t n) {
    nb_pdl::trigger();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = f32_to_f16_sat(src[i]);
}

__global__ void convert_kernel(void *dst, nb_dtype dst_dt, const void *src, nb_dtype src_dt,
                               size_t n) {
    nb_pdl::trigger();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        if (dst_dt == src_dt && dst_dt != NB_DTYPE_F32)
            ((uint16_t *)dst)[i] = ((const uint16_t *)src)[i]; // bits, NaN payloads too
        else
            store_f32(dst, dst_dt, i, load_f32(src, src_dt, i));
    }
}

// One block per (row, head): q heads rotated into q_out; kv heads rotated
// (K) and copied (V) into the FP cache as write_kv_kernel stores them. The
// rotation is rope_kernel's, element for element.
__global__ void rope_write_kv_kernel(float *q_out, const float *q_in, int q_stride, const float *k_in,
                                     const float *v_in, int kv_stride, const int32_t *pos, int n_heads,
                                     const float *inv_freq, nb_kv_layout lay, void *fp, int layer,
                                     const int32_t *fpblock, const int32_t *slot) {
    nb_pdl::trigger(); // the decode attention after it reads neither q nor FP blocks before its wait
    const int r = blockIdx.x, hb = blockIdx.y, D = lay.head_dim, h = D / 2;
    const float p = (float)pos[r];
    // The first (cos, sin) pair of this thread depends only on the position
    // (uploaded before the pass) and the frequencies: computed before the
    // wait for the projection that writes q, k and v (launched with
    // programmatic stream serialization, the block may start under it).
    float c0 = 0.0f, s0 = 0.0f;
    if ((int)threadIdx.x < h) nb_ops::rope_cs(p, inv_freq[threadIdx.x], c0, s0);
    nb_pdl::wait();
    const float *src;
    size_t ko = 0, vo = 0;
    float *dst = nullptr;
    if (hb < n_heads) {
        src = q_in + (size_t)r * q_stride + (size_t)hb * D;
        dst = q_out + ((size_t)r * n_heads + hb) * D;
    } else {
        const int kh = hb - n_heads;
        const int32_t fb = fpblock[r], sl = slot[r];
        if (fb < 0 || fb >= lay.n_fpblocks || sl < 0 || sl >= lay.group_size) return;
        ko = nb_kv_fp_offset(&lay, layer, fb, kh, 0, sl);
        vo = nb_kv_fp_offset(&lay, layer, fb, kh, 1, sl);
        src = k_in + (size_t)r * kv_stride + (size_t)kh * D;
        const float *vs = v_in + (size_t)r * kv_stride + (size_t)kh * D;
        for (int c = threadIdx.x; c < D; c += blockDim.x) store_f32(fp, lay.dtype, vo + c, vs[c]);
    }
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        float c = c0, sn = s0;
        if (i != (int)threadIdx.x) nb_ops::rope_cs(p, inv_freq[i], c, sn);
        float y0, y1;
        nb_ops::rope_rot(src[i], src[i + h], c, sn, y0, y1);
        if (dst) {
            dst[i] = y0;
            dst[i + h] = y1;
        } else {
            store_f32(fp, lay.dtype, ko + i, y0);
            store_f32(fp, lay.dtype, ko + i + h, y1);
        }
    }
}

// RoPE's (cos, sin) table: thread (r, i) of n x D/2. Reads only pos and
// inv_freq, so it computes before its wait; it waits before it exits, so
// that a kernel waiting for this grid also waits for the one before it.
__global__ void rope_table_kernel(float *cs, const int32_t *pos, int h, const float *inv_freq, size_t total) {
    nb_pdl::trigger();
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / (size_t)h;
        float c, sn;
        nb_ops::rope_cs((float)pos[r], inv_freq[e - r * (size_t)h], c, sn);
        cs[2 * e] = c;
        cs[2 * e + 1] = sn;
    }
    nb_pdl::wait();
}

// SwiGLU of strided gate/up rows into [n][I] (f32 and/or converted).
// moved: element i of a row sits at column 16 (i / 8) + i % 8 (the SwiGLU
// row layout; up = gate + 8).
__global__ void silu_mul_cvt_kernel(float *out, nb_cuda_cvt cvt, const float *gate, const float *up,
                                    int stride, int I, size_t total, bool moved) {
    nb_pdl::wait(); // as rmsnorm_kernel's (NB_SILU_PDL=0: launched without the attribute)
    nb_pdl::trigger();
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / (size_t)I, i = e - r * (size_t)I;
        const size_t src = r * (size_t)stride + (moved ? (i >> 3) * 16 + (i & 7) : i);
        const float o = nb_ops::silu_mul(gate[src], up[src]);
        if (out) out[e] = o;
        if (cvt.p) store_cvt(cvt, e, o);
    }
}

} // namespace

// ------------------------------------------------------------ launchers
static bool cvt_ok(const nb_cuda_cvt &c) {
    return !c.p || (c.sat ? c.dt == NB_DTYPE_F16 : (c.dt == NB_DTYPE_F16 || c.dt == NB_DTYPE_BF16 ||
                                                    c.dt == NB_DTYPE_F32));
}

extern "C" nb_status nb_cuda_add_rmsnorm(float *x, const float *res, const void *w, nb_dtype dt, int n,
                                         int d, float eps, float *out, nb_cuda_cvt cvt,
                                         cudaStream_t stream) {
    if (n < 0 || d < 1 || d > NB_CUDA_RMSNORM_MAX_D || !dtype_ok(dt) || !cvt_ok(cvt))
        return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!x || !w || (!out && !cvt.p) || (res && out == x)) return NB_ERR_INVALID_ARG;
    size_t smem = (size_t)d * sizeof(float);
    // NOTE: above 48 KiB a block needs the dynamic limit raised (host-side
    // attribute, no stream work; cheap and idempotent).
    if (smem > 48 * 1024 && cudaFuncSetAttribute(rmsnorm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)smem) != cudaSuccess)
        return NB_ERR_BACKEND;
    static int pdl = -1;
    return launch_ex(rmsnorm_kernel, dim3((unsigned)n), dim3(kNormThreads), smem, stream,
                     nb_pdl::env_switch_once("NB_NORM_PDL", true, &pdl), out, x, res, w, dt, d, eps, cvt);
}

// Without a residual the kernel only reads x, so the const is kept.
extern "C" nb_status nb_cuda_rmsnorm(float *out, const float *x, const void *w, nb_dtype dt,
                                     int n, int d, float eps, cudaStream_t stream) {
    if (n > 0 && !out) return NB_ERR_INVALID_ARG;
    return nb_cuda_add_rmsnorm((float *)x, nullptr, w, dt, n, d, eps, out, nb_cuda_cvt{nullptr, NB_DTYPE_F32, 0},
                               stream);
}

extern "C" nb_status nb_cuda_rope_write_kv(float *q_out, const float *q_in, int q_stride, const float *k_in,
                                           const float *v_in, int kv_stride, const int32_t *pos, int n,
                                           int n_heads, const float *inv_freq, const nb_kv_layout *lay,
                                           void *fp, int layer, const int32_t *fpblock, const int32_t *slot,
                                           cudaStream_t stream) {
    if (!lay || !nb_kv_layout_valid(lay) || layer < 0 || layer >= lay->n_layers || n < 0 || n_heads < 0 ||
        lay->head_dim > 1024 || n_heads + lay->n_kv_heads > 65535 || q_stride < n_heads * lay->head_dim ||
        kv_stride < lay->n_kv_heads * lay->head_dim)
        return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!q_out || !q_in || !k_in || !v_in || !pos || !inv_freq || !fp || !fpblock || !slot)
        return NB_ERR_INVALID_ARG;
    const int D = lay->head_dim;
    // NOTE: in place (q_out == q_in) only with the packed stride: another
    // row's block would otherwise write where this one reads.
    if (q_out == q_in && q_stride != n_heads * D) return NB_ERR_INVALID_ARG;
    const int threads = D / 2 < 32 ? 32 : D / 2 > kThreads ? kThreads : (D / 2 + 31) / 32 * 32;
    dim3 grid((unsigned)n, (unsigned)(n_heads + lay->n_kv_heads));
    // Programmatic stream serialization (NB_ROPE_PDL=0 in the environment
    // turns it off): the blocks may start while the projection before them
    // drains and compute their rotation angles there. Same bits either way.
    static int pdl = -1;
    return launch_ex(rope_write_kv_kernel, grid, dim3((unsigned)threads), 0, stream,
                     nb_pdl::env_switch_once("NB_ROPE_PDL", true, &pdl), q_out, q_in, q_stride, k_in, v_in, kv_stride, pos, n_heads, inv_freq, *lay, fp, layer, fpblock,
                     slot);
}

extern "C" nb_status nb_cuda_silu_mul_cvt(float *out, nb_cuda_cvt cvt, const float *gate, const float *up,
                                          int stride, int n, int I, cudaStream_t stream) {
    if (n < 0 || I < 1 || stride < I || !cvt_ok(cvt)) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!gate || !up || (!out && !cvt.p)) return NB_ERR_INVALID_ARG;
    const size_t total = (size_t)n * I;
    static int pdl = -1;
    return launch_ex(silu_mul_cvt_kernel, dim3(grid_for(total, kThreads)), dim3(kThreads), 0, stream,
                     nb_pdl::env_switch_once("NB_SILU_PDL", true, &pdl), out, cvt, gate, up, stride, I, total,
                     false);
}

extern "C" nb_status nb_cuda_silu_mul_cvt_moved(float *out, nb_cuda_cvt cvt, const float *gu, int n, int I,
                                                cudaStream_t stream) {
    if (n < 0 || I < 8 || I % 8 || !cvt_ok(cvt)) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!gu || (!out && !cvt.p)) return NB_ERR_INVALID_ARG;
    const size_t total = (size_t)n * I;
    static int pdl = -1;
    return launch_ex(silu_mul_cvt_kernel, dim3(grid_for(total, kThreads)), dim3(kThreads), 0, stream,
                     nb_pdl::env_switch_once("NB_SILU_PDL", true, &pdl), out, cvt, gu, gu + 8, 2 * I, I, total,
                     true);
}

extern "C" nb_status nb_cuda_rope_apply(float *x, const int32_t *pos, int n, int n_heads, int D,
                                        const float *inv_freq, cudaStream_t stream) {
    if (D < 2 || (D & 1) || D > 1024 || n < 0 || n_heads < 0) return NB_ERR_INVALID_ARG;
    if (n == 0 || n_heads == 0) return NB_OK;
    if (!x || !pos || !inv_freq) return NB_ERR_INVALID_ARG;
    rope_kernel<<<(unsigned)n, kThreads, 0, stream>>>(x, pos, n_heads, D, inv_freq);
    return launch_status();
}

extern "C" nb_status nb_cuda_rope_table(float *cs, const int32_t *pos, int n, int D, const float *inv_freq,
                                        cudaStream_t stream) {
    if (D < 2 || (D & 1) || D > 1024 || n < 0) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!cs || !pos || !inv_freq) return NB_ERR_INVALID_ARG;
    const size_t total = (size_t)n * (D / 2);
    return launch_ex(rope_table_kernel, dim3(grid_for(total, kThreads)), dim3(kThreads), 0, stream, true, cs, pos,
                     D / 2, inv_freq, total);
}

extern "C" nb_status nb_cuda_silu_mul(float *out, const float *gate, const float *up, size_t n,
                                      cudaStream_t stream) {
    if (n == 0) return NB_OK;
    if (!out || !gate || !up) return NB_ERR_INVALID_ARG;
    silu_mul_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, gate, up, n);
    return launch_status();
}

extern "C" nb_status nb_cuda_add(float *out, const float *a, const float *b, size_t n,
                                 cudaStream_t stream) {
    if (n == 0) return NB_OK;
    if (!out || !a || !b) return NB_ERR_INVALID_ARG;
    add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, a, b, n);
    return launch_status();
}

extern "C" nb_status nb_cuda_embed(float *out, const void *table, nb_dtype dt,
                                   const int32_t *ids, int n, int d, int vocab,
                                   cudaStream_t stream) {
    if (n < 0 || d < 1 || vocab < 1 || !dtype_ok(dt)) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!out || !table || !ids) return NB_ERR_INVALID_ARG;
    embed_kernel<<<(unsigned)n, kThreads, 0, stream>>>(out, table, dt, ids, d, vocab);
    return launch_status();
}

extern "C" nb_status nb_cuda_write_kv(const nb_kv_layout *lay, void *fp, int layer,
                                      const float *k, const float *v, const int32_t *fpblock,
                                      const int32_t *slot, int n, cudaStream_t stream) {
    if (!lay || !nb_kv_layout_valid(lay) || layer < 0 || layer >= lay->n_layers || n < 0 ||
        lay->n_kv_heads > 65535)
        return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!fp || !k || !v || !fpblock || !slot) return NB_ERR_INVALID_ARG;
    int threads = lay->head_dim < kThreads ? (lay->head_dim + 31) / 32 * 32 : kThreads;
    dim3 grid((unsigned)n, (unsigned)lay->n_kv_heads);
    write_kv_kernel<<<grid, threads, 0, stream>>>(*lay, fp, layer, k, v, fpblock, slot);
    return launch_status();
}

extern "C" nb_status nb_cuda_convert_f16_sat(uint16_t *dst, const float *src, size_t n,
                                            cudaStream_t stream) {
    if (n == 0) return NB_OK;
    if (!dst || !src) return NB_ERR_INVALID_ARG;
    convert_f16_sat_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dst, src, n);
    return cudaPeekAtLastError() == cudaSuccess ? NB_OK : NB_ERR_BACKEND;
}

extern "C" nb_status nb_cuda_convert(void *dst, nb_dtype dst_dt, const void *src,
                                     nb_dtype src_dt, size_t n, cudaStream_t stream) {
    if (!dtype_ok(dst_dt) || !dtype_ok(src_dt)) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!dst || !src) return NB_ERR_INVALID_ARG;
    convert_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dst, dst_dt, src, src_dt, n);
    return launch_status();
}
