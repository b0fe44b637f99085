// ops_cuda.cu: CUDA twins of the dense ops of ops_ref.c (contracts in
// ops_cuda.h). Every f32 operation is written with an explicit-rounding
// intrinsic so the sequence of roundings is the reference's, whatever the
// compiler flags.
#include "ops_cuda.h"

#include <math.h>

namespace {

constexpr int kThreads = 256;

// ------------------------------------------------------------ dtypes
// NOTE: bit-for-bit ports of nb_dtype.h (host-only inline functions there),
// including its NaN patterns, which cuda_fp16's conversions do not share.
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

__device__ __forceinline__ float load_f32(const void *p, nb_dtype t, size_t i) {
    if (t == NB_DTYPE_F32) return ((const float *)p)[i];
    if (t == NB_DTYPE_F16) return f16_to_f32(((const uint16_t *)p)[i]);
    return bf16_to_f32(((const uint16_t *)p)[i]);
}

__device__ __forceinline__ void store_f32(void *p, nb_dtype t, size_t i, float v) {
    if (t == NB_DTYPE_F32) ((float *)p)[i] = v;
    else if (t == NB_DTYPE_F16) ((uint16_t *)p)[i] = f32_to_f16(v);
    else ((uint16_t *)p)[i] = f32_to_bf16(v);
}

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

// ------------------------------------------------------------ rmsnorm
// One block per row. The row is staged in shared memory; threads 0..7 run
// the eight lane chains a_l = sum over k = l (mod 8) of x_k*x_k, in k order,
// exactly as ops_ref.c's vector loop plus its scalar tail do.
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(float *out, const float *x,
                                                           const void *w, nb_dtype dt, int d,
                                                           float eps) {
    extern __shared__ float xs[]; // [d]
    __shared__ float lane_sum[8];
    __shared__ float r_sh;
    const size_t row = blockIdx.x;
    const float *xi = x + row * (size_t)d;
    float *oi = out + row * (size_t)d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) xs[j] = xi[j];
    __syncthreads();
    if (threadIdx.x < 8) {
        float a = 0.0f;
        int k = threadIdx.x;
        // NOTE: the squares of a 16-step window are independent of the chain,
        // so they are loaded and multiplied ahead of the dependent adds.
        for (; k + 8 * 15 < d; k += 8 * 16) {
            float t[16];
#pragma unroll
            for (int u = 0; u < 16; u++) t[u] = __fmul_rn(xs[k + 8 * u], xs[k + 8 * u]);
#pragma unroll
            for (int u = 0; u < 16; u++) a = __fadd_rn(a, t[u]);
        }
        for (; k < d; k += 8) a = __fadd_rn(a, __fmul_rn(xs[k], xs[k]));
        lane_sum[threadIdx.x] = a;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const float *l = lane_sum;
        float s = __fadd_rn(__fadd_rn(__fadd_rn(l[0], l[1]), __fadd_rn(l[2], l[3])),
                            __fadd_rn(__fadd_rn(l[4], l[5]), __fadd_rn(l[6], l[7])));
        float ms = __fdiv_rn(s, (float)d);
        r_sh = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
    }
    __syncthreads();
    const float r = r_sh;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        oi[j] = __fmul_rn(__fmul_rn(xs[j], r), load_f32(w, dt, (size_t)j));
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
        float g = gate[i];
        float e = __double2float_rn(exp(-(double)g));
        out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, e)), up[i]);
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
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float f = src[i];
        const uint32_t u = __float_as_uint(f), a = u & 0x7fffffffu;
        dst[i] = a < 0x7f800000u && a >= 0x477ff000u ? (uint16_t)(((u >> 16) & 0x8000u) | 0x7bffu)
                                                     : f32_to_f16(f);
    }
}

__global__ void convert_kernel(void *dst, nb_dtype dst_dt, const void *src, nb_dtype src_dt,
                               size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        if (dst_dt == src_dt && dst_dt != NB_DTYPE_F32)
            ((uint16_t *)dst)[i] = ((const uint16_t *)src)[i]; // bits, NaN payloads too
        else
            store_f32(dst, dst_dt, i, load_f32(src, src_dt, i));
    }
}

} // namespace

// ------------------------------------------------------------ launchers
extern "C" nb_status nb_cuda_rmsnorm(float *out, const float *x, const void *w, nb_dtype dt,
                                     int n, int d, float eps, cudaStream_t stream) {
    if (n < 0 || d < 1 || d > NB_CUDA_RMSNORM_MAX_D || !dtype_ok(dt)) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!out || !x || !w) return NB_ERR_INVALID_ARG;
    size_t smem = (size_t)d * sizeof(float);
    if (smem > 48 * 1024) {
        // NOTE: above 48 KiB a block needs the dynamic limit raised (host-side
        // attribute, no stream work; cheap and idempotent).
        if (cudaFuncSetAttribute(rmsnorm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem) != cudaSuccess)
            return NB_ERR_BACKEND;
    }
    rmsnorm_kernel<<<(unsigned)n, kThreads, smem, stream>>>(out, x, w, dt, d, eps);
    return launch_status();
}

extern "C" nb_status nb_cuda_rope_apply(float *x, const int32_t *pos, int n, int n_heads, int D,
                                        const float *inv_freq, cudaStream_t stream) {
    if (D < 2 || (D & 1) || D > 1024 || n < 0 || n_heads < 0) return NB_ERR_INVALID_ARG;
    if (n == 0 || n_heads == 0) return NB_OK;
    if (!x || !pos || !inv_freq) return NB_ERR_INVALID_ARG;
    rope_kernel<<<(unsigned)n, kThreads, 0, stream>>>(x, pos, n_heads, D, inv_freq);
    return launch_status();
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
