// linear_cuda.cu: quantized (wquant.h) and dense linear layers on CUDA
// (contracts in linear_cuda.h).
//
// The one idea of the quantized path: a weight tile of 16 rows is the A
// operand of mma.sync.m16n8k16 and 8 rows of x are B, so one 16-byte load of
// nibbles per lane (32 codes of one row, a quarter of a group) becomes A
// fragments with a mask-or-fma per pair of codes and no shuffles:
//   - lane (g = lane/4, t = lane%4) owns rows g and g+8 of the tile and
//     elements [32t, 32t+32) of each group of 128: 16 bytes of each plane;
//   - (q >> 4i) & 0x000f000f | magic puts codes i and i+4 of the 8 held in
//     word q into the two halves of an f16x2 (bf16x2) as magic + code, and
//     one fma.rn.x2 removes the magic (and scales U by 16 in the 8-bit
//     view), exactly;
//   - the mma's k index is a permutation of the physical one (slots 2t,
//     2t+1, 2t+8, 2t+9 hold codes (0,4), (1,5) of a word, then (2,6), (3,7)),
//     and x is loaded 8 halves at a time and permuted the same way with two
//     byte-perms per pair; a dot product does not care about k's order;
//   - sum(x_G) comes from one more mma with A = all ones, already laid out
//     like the accumulators, so the zero term is one multiply per group.
// Per group the mma accumulates dot(x_G, C_G) in f32 from +0, and the lane
// adds sc * d + z * xs to its running total. The 8 warps of a block split
// the groups of k between them (interleaved, 2 groups per warp per
// iteration, all loads of an iteration issued before the first mma) and are
// summed in a fixed order through shared memory at the end, so results are
// deterministic run to run. Weights are read with L1::no_allocate so that
// x, which every block reads, stays in L1.
#include "linear_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

constexpr int kWarps = 8;            // warps per block; they split k
constexpr int kThreads = kWarps * 32;
// Groups per warp per iteration (GU, a template parameter): all loads of an
// iteration are issued before the first mma, so GU sets the bytes in flight.
// 4 at one x tile (decode: 8 loads of 16 B a lane in flight; k = 4096 is
// then one iteration), 2 at two (the accumulators need the registers).
constexpr int kGroup = NB_WQ_GROUP;  // the tensor-core path needs k % 128 == 0

struct WqParams {
    void *out;              // [n][m] out_dt
    const void *x;          // [n][k] XT
    const uint8_t *upper;   // [m][k/2]
    const uint8_t *lower;   // [m][k/2] (8-bit view only)
    const uint16_t *scale;  // [m][k/g] f16
    const uint16_t *zero;   // [m][k/g] f16
    const void *bias;       // [m] bias_dt or NULL
    int out_dt, bias_dt;
    int n, m, k;
};

// Constants for turning "magic | code" into the code: value = h * mul + add.
template <typename XT> struct Deq;
template <> struct Deq<__half> {
    static constexpr uint32_t kMagic = 0x64006400u;  // 1024 + code (exact to 1023)
    static constexpr uint32_t kOne = 0x3c003c00u;    // 1.0
    static constexpr uint32_t kU4Add = 0xe400e400u;  // -1024: U
    static constexpr uint32_t kU8Mul = 0x4c004c00u;  // 16.0
    static constexpr uint32_t kU8Add = 0xf400f400u;  // -16384: 16U
    static constexpr uint32_t kLAdd = 0xe408e408u;   // -1032: (L + 8) - 8
};
template <> struct Deq<__nv_bfloat16> {
    static constexpr uint32_t kMagic = 0x43004300u;  // 128 + code (exact to 127)
    static constexpr uint32_t kOne = 0x3f803f80u;    // 1.0
    static constexpr uint32_t kU4Add = 0xc300c300u;  // -128
    static constexpr uint32_t kU8Mul = 0x41804180u;  // 16.0
    static constexpr uint32_t kU8Add = 0xc500c500u;  // -2048
    static constexpr uint32_t kLAdd = 0xc308c308u;   // -136
};

template <typename XT> __device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c);
template <> __device__ __forceinline__ uint32_t fma2<__half>(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
template <>
__device__ __forceinline__ uint32_t fma2<__nv_bfloat16>(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// Codes i and i+4 of the 8 nibbles of q (i = shift / 4) as an x2 value.
template <typename XT>
__device__ __forceinline__ uint32_t deq(uint32_t q, int shift, uint32_t mul, uint32_t add) {
    uint32_t h = ((q >> shift) & 0x000f000fu) | Deq<XT>::kMagic;
    return fma2<XT>(h, mul, add);
}

// d += A(16x16) * B(16x8), f32 accumulators.
template <typename XT>
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma<__half>(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&d)[4], uint32_t a0, uint32_t a1,
                                                   uint32_t a2, uint32_t a3, uint32_t b0,
                                                   uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// NOTE: weights are touched once per launch; keep them out of L1 so the
// activations (read by every block) stay there.
__device__ __forceinline__ uint4 ld_stream(const uint8_t *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ uint32_t word(const uint4 &v, int w) {
    return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ float load_any(const void *p, int dt, size_t i) {
    if (dt == NB_DTYPE_F32) return static_cast<const float *>(p)[i];
    if (dt == NB_DTYPE_F16) return __half2float(static_cast<const __half *>(p)[i]);
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
}

__device__ __forceinline__ void store_any(void *p, int dt, size_t i, float v) {
    if (dt == NB_DTYPE_F32)
        static_cast<float *>(p)[i] = v;
    else if (dt == NB_DTYPE_F16)
        static_cast<__half *>(p)[i] = __float2half_rn(v);
    else
        static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
}

template <typename XT> __device__ __forceinline__ float x_to_f32(XT v);
template <> __device__ __forceinline__ float x_to_f32<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float x_to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

// The tensor-core kernel. Block: kWarps warps, R tiles of 16 weight rows
// (blockIdx.x), NT tiles of 8 x rows (blockIdx.y); grid.x = ceil(m/16R),
// grid.y = ceil(n/8NT).
template <typename XT, int NT, int R, bool LOWER, int kGU>
__global__ void __launch_bounds__(kThreads) wq_mma_kernel(const WqParams p) {
    __shared__ float red[kWarps][NT * 8][R * 16];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * (R * 16);
    const int xr0 = blockIdx.y * (NT * 8);
    const int ng = p.k / kGroup;
    const size_t rbytes = (size_t)p.k / 2;

    const uint8_t *wu[R][2];
    const uint8_t *wl[R][2];
    const uint16_t *wsc[R][2];
    const uint16_t *wzr[R][2];
    bool rok[R][2];
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = row0 + r * 16 + g + h * 8;
            rok[r][h] = row < p.m;
            const size_t rr = rok[r][h] ? (size_t)row : 0;
            wu[r][h] = p.upper + rr * rbytes + t * 16;
            wl[r][h] = LOWER ? p.lower + rr * rbytes + t * 16 : nullptr;
            wsc[r][h] = p.scale + rr * ng;
            wzr[r][h] = p.zero + rr * ng;
        }
    }
    const uint8_t *xp[NT];
    bool xok[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int xrow = xr0 + nt * 8 + g;
        xok[nt] = xrow < p.n;
        xp[nt] = static_cast<const uint8_t *>(p.x) + (size_t)(xok[nt] ? xrow : 0) * p.k * 2 + t * 64;
    }

    float tot[R][NT][4];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) tot[r][nt][i] = 0.0f;

    const uint4 z4 = make_uint4(0, 0, 0, 0);
    for (int gb = warp; gb < ng; gb += kWarps * kGU) {
        uint4 qu[kGU][R][2];
        uint4 ql[kGU][R][2];
        float sc[kGU][R][2], zc[kGU][R][2];
        uint4 xv[kGU][NT][4];
#pragma unroll
        for (int u = 0; u < kGU; u++) {
            const int grp = gb + u * kWarps;
            const bool gok = grp < ng;
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const bool ok = gok && rok[r][h];
                    qu[u][r][h] = ok ? ld_stream(wu[r][h] + (size_t)grp * 64) : z4;
                    if (LOWER) ql[u][r][h] = ok ? ld_stream(wl[r][h] + (size_t)grp * 64) : z4;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kGU; u++) {
            const int grp = gb + u * kWarps;
            const bool gok = grp < ng;
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const bool ok = gok && rok[r][h];
                    float s = ok ? f16_bits_to_f32(__ldg(wsc[r][h] + grp)) : 0.0f;
                    // NOTE: s/16 is exact (a power-of-two scaling of an f16).
                    sc[u][r][h] = LOWER ? s * 0.0625f : s;
                    zc[u][r][h] = ok ? f16_bits_to_f32(__ldg(wzr[r][h] + grp)) : 0.0f;
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    xv[u][nt][w] = gok && xok[nt]
                                       ? __ldg(reinterpret_cast<const uint4 *>(
                                             xp[nt] + (size_t)grp * (kGroup * 2) + w * 16))
                                       : z4;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kGU; u++) {
            float acc[R][NT][4];
            float xs[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    xs[nt][i] = 0.0f;
#pragma unroll
                    for (int r = 0; r < R; r++) acc[r][nt][i] = 0.0f;
                }
            }
#pragma unroll
            for (int w = 0; w < 4; w++) {
                // b[nt][2hh], b[nt][2hh+1]: x elements (2hh, 2hh+4), (2hh+1, 2hh+5)
                // of the 8 in this word, matching the A fragments below.
                uint32_t b[NT][4];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const uint4 v = xv[u][nt][w];
                    b[nt][0] = __byte_perm(v.x, v.z, 0x5410);
                    b[nt][1] = __byte_perm(v.x, v.z, 0x7632);
                    b[nt][2] = __byte_perm(v.y, v.w, 0x5410);
                    b[nt][3] = __byte_perm(v.y, v.w, 0x7632);
                    const uint32_t one = Deq<XT>::kOne;
                    mma<XT>(xs[nt], one, one, one, one, b[nt][0], b[nt][1]);
                    mma<XT>(xs[nt], one, one, one, one, b[nt][2], b[nt][3]);
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const uint32_t q0 = word(qu[u][r][0], w), q1 = word(qu[u][r][1], w);
                    const uint32_t umul = LOWER ? Deq<XT>::kU8Mul : Deq<XT>::kOne;
                    const uint32_t uadd = LOWER ? Deq<XT>::kU8Add : Deq<XT>::kU4Add;
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const int sh = 8 * hh;
                        const uint32_t a0 = deq<XT>(q0, sh, umul, uadd);
                        const uint32_t a1 = deq<XT>(q1, sh, umul, uadd);
                        const uint32_t a2 = deq<XT>(q0, sh + 4, umul, uadd);
                        const uint32_t a3 = deq<XT>(q1, sh + 4, umul, uadd);
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
                            mma<XT>(acc[r][nt], a0, a1, a2, a3, b[nt][2 * hh], b[nt][2 * hh + 1]);
                    }
                    if (LOWER) {
                        const uint32_t l0 = word(ql[u][r][0], w), l1 = word(ql[u][r][1], w);
                        const uint32_t one = Deq<XT>::kOne, ladd = Deq<XT>::kLAdd;
#pragma unroll
                        for (int hh = 0; hh < 2; hh++) {
                            const int sh = 8 * hh;
                            const uint32_t a0 = deq<XT>(l0, sh, one, ladd);
                            const uint32_t a1 = deq<XT>(l1, sh, one, ladd);
                            const uint32_t a2 = deq<XT>(l0, sh + 4, one, ladd);
                            const uint32_t a3 = deq<XT>(l1, sh + 4, one, ladd);
#pragma unroll
                            for (int nt = 0; nt < NT; nt++)
                                mma<XT>(acc[r][nt], a0, a1, a2, a3, b[nt][2 * hh],
                                        b[nt][2 * hh + 1]);
                        }
                    }
                }
            }
            // acc[r][nt][i]: weight row g + 8*(i/2) of tile r, x row 2t + i%2 of
            // tile nt; xs[nt][i] is that x row's group sum.
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        tot[r][nt][i] += __fmul_rn(sc[u][r][i >> 1], acc[r][nt][i]) +
                                         __fmul_rn(zc[u][r][i >> 1], xs[nt][i]);
        }
    }

#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                red[warp][nt * 8 + 2 * t + (i & 1)][r * 16 + g + (i >> 1) * 8] = tot[r][nt][i];
    __syncthreads();
    for (int idx = threadIdx.x; idx < NT * 8 * R * 16; idx += kThreads) {
        const int xc = idx / (R * 16), rl = idx % (R * 16);
        const int row = row0 + rl, xrow = xr0 + xc;
        if (row >= p.m || xrow >= p.n) continue;
        float v = red[0][xc][rl];
#pragma unroll
        for (int w = 1; w < kWarps; w++) v += red[w][xc][rl];
        if (p.bias) v += load_any(p.bias, p.bias_dt, row);
        store_any(p.out, p.out_dt, (size_t)xrow * p.m + row, v);
    }
}

// Any supported k (group size gs = 32..128): one thread per output, the same
// per-group algebra, sequential sums. For the small-k shapes only.
template <typename XT>
__global__ void wq_simple_kernel(const WqParams p, int gs, int use_lower) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)p.n * p.m) return;
    const int i = (int)(idx / p.m), j = (int)(idx % p.m);
    const int ng = p.k / gs;
    const XT *xr = static_cast<const XT *>(p.x) + (size_t)i * p.k;
    const uint8_t *up = p.upper + (size_t)j * p.k / 2;
    const uint8_t *lo = use_lower ? p.lower + (size_t)j * p.k / 2 : nullptr;
    float tot = 0.0f;
    for (int gi = 0; gi < ng; gi++) {
        float d = 0.0f, xs = 0.0f;
        for (int e = gi * gs; e < (gi + 1) * gs; e++) {
            int c = (up[e >> 1] >> ((e & 1) * 4)) & 15;
            if (lo) c = 16 * c + ((lo[e >> 1] >> ((e & 1) * 4)) & 15) - 8;
            const float xv = x_to_f32<XT>(xr[e]);
            d += __fmul_rn(xv, (float)c);
            xs += xv;
        }
        float s = f16_bits_to_f32(p.scale[(size_t)j * ng + gi]);
        if (use_lower) s *= 0.0625f;
        const float z = f16_bits_to_f32(p.zero[(size_t)j * ng + gi]);
        tot += __fmul_rn(s, d) + __fmul_rn(z, xs);
    }
    if (p.bias) tot += load_any(p.bias, p.bias_dt, j);
    store_any(p.out, p.out_dt, idx, tot);
}

__device__ __forceinline__ void put(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

template <typename OT>
__global__ void wq_dequant_kernel(OT *out, const uint8_t *upper, const uint8_t *lower,
                                  const uint16_t *scale, const uint16_t *zero, int m, int k,
                                  int gs) {
    const size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // byte index
    if (b >= (size_t)m * k / 2) return;
    const size_t j = b / (k / 2);
    const int ng = k / gs;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int e = (int)(b % (k / 2)) * 2 + h;
        const size_t gi = j * ng + e / gs;
        const float s = f16_bits_to_f32(scale[gi]), z = f16_bits_to_f32(zero[gi]);
        int c = (upper[b] >> (4 * h)) & 15;
        float v;
        if (lower) {
            c = 16 * c + ((lower[b] >> (4 * h)) & 15) - 8;
            v = __fadd_rn(__fmul_rn((float)c, s * 0.0625f), z);
        } else {
            v = __fadd_rn(__fmul_rn((float)c, s), z);
        }
        put(out + j * k + e, v);
    }
}

__global__ void bias_add_kernel(void *out, int out_dt, const void *bias, int bias_dt, int n,
                                int m) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)n * m) return;
    const int j = (int)(idx % m);
    store_any(out, out_dt, idx, load_any(out, out_dt, idx) + load_any(bias, bias_dt, j));
}

template <typename XT, int NT, int R, bool LOWER>
void launch_mma(const WqParams &p, cudaStream_t stream) {
    const dim3 grid((unsigned)((p.m + R * 16 - 1) / (R * 16)),
                    (unsigned)((p.n + NT * 8 - 1) / (NT * 8)));
    wq_mma_kernel<XT, NT, R, LOWER, NT == 1 ? 4 : 2><<<grid, kThreads, 0, stream>>>(p);
}

template <typename XT, int NT, int R>
void launch_mma_v(const WqParams &p, bool lower, cudaStream_t stream) {
    if (lower)
        launch_mma<XT, NT, R, true>(p, stream);
    else
        launch_mma<XT, NT, R, false>(p, stream);
}

template <typename XT>
void launch_mma_x(const WqParams &p, bool lower, int nt, int r, cudaStream_t stream) {
    if (nt == 1 && r == 1) launch_mma_v<XT, 1, 1>(p, lower, stream);
    if (nt == 1 && r == 2) launch_mma_v<XT, 1, 2>(p, lower, stream);
    if (nt == 2 && r == 1) launch_mma_v<XT, 2, 1>(p, lower, stream);
    if (nt == 2 && r == 2) launch_mma_v<XT, 2, 2>(p, lower, stream);
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

bool io_dtype_ok(nb_dtype t) {
    return t == NB_DTYPE_F32 || t == NB_DTYPE_F16 || t == NB_DTYPE_BF16;
}

int g_tile_rows = 0;  // 0: heuristic; see nb_cuda_matmul_wq_set_tile_rows

} // namespace

extern "C" size_t nb_cuda_matmul_wq_workspace_bytes(int n, int m, int k) {
    (void)n;
    (void)m;
    (void)k;
    return 0;
}

extern "C" void nb_cuda_matmul_wq_set_tile_rows(int rows) {
    g_tile_rows = rows == 16 || rows == 32 ? rows : 0;
}

extern "C" nb_status nb_cuda_matmul_wq(void *out, nb_dtype out_dt, const void *x, nb_dtype x_dt,
                                       const nb_wq_tensor *w, int use_lower, const void *bias,
                                       nb_dtype bias_dt, int n, int m, int k, void *workspace,
                                       size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace;
    (void)workspace_bytes;
    const int gs = nb_wq_group_size(k);
    if (n < 0 || m < 0 || gs == 0 || !w) return NB_ERR_INVALID_ARG;
    if (x_dt != NB_DTYPE_F16 && x_dt != NB_DTYPE_BF16) return NB_ERR_INVALID_ARG;
    if (!io_dtype_ok(out_dt) || (bias && !io_dtype_ok(bias_dt))) return NB_ERR_INVALID_ARG;
    if (n == 0 || m == 0) return NB_OK;
    if (!out || !x || !w->upper || !w->scale || !w->zero || (use_lower && !w->lower))
        return NB_ERR_INVALID_ARG;
    WqParams p;
    p.out = out;
    p.x = x;
    p.upper = w->upper;
    p.lower = use_lower ? w->lower : nullptr;
    p.scale = w->scale;
    p.zero = w->zero;
    p.bias = bias;
    p.out_dt = (int)out_dt;
    p.bias_dt = (int)bias_dt;
    p.n = n;
    p.m = m;
    p.k = k;
    const bool fast = gs == kGroup && aligned16(x) && aligned16(w->upper) &&
                      (!use_lower || aligned16(w->lower));
    if (fast) {
        const int nt = n <= 8 ? 1 : 2;
        // NOTE: 32-row blocks halve the activation traffic per weight byte
        // (it matters when x has many rows) but halve the block count, so
        // they pay only when there are rows and blocks to spare (untuned).
        int r = (n > 4 && m >= 4096) ? 2 : 1;
        if (g_tile_rows) r = g_tile_rows / 16;
        if (x_dt == NB_DTYPE_F16)
            launch_mma_x<__half>(p, use_lower != 0, nt, r, stream);
        else
            launch_mma_x<__nv_bfloat16>(p, use_lower != 0, nt, r, stream);
    } else {
        const size_t total = (size_t)n * m;
        const unsigned blocks = (unsigned)((total + 127) / 128);
        if (x_dt == NB_DTYPE_F16)
            wq_simple_kernel<__half><<<blocks, 128, 0, stream>>>(p, gs, use_lower != 0);
        else
            wq_simple_kernel<__nv_bfloat16><<<blocks, 128, 0, stream>>>(p, gs, use_lower != 0);
    }
    return cudaPeekAtLastError() == cudaSuccess ? NB_OK : NB_ERR_BACKEND;
}

extern "C" nb_status nb_cuda_wq_dequantize(void *out, nb_dtype dt, const nb_wq_tensor *w,
                                           int use_lower, int m, int k, cudaStream_t stream) {
    const int gs = nb_wq_group_size(k);
    if (m < 0 || gs == 0 || !w || (dt != NB_DTYPE_F16 && dt != NB_DTYPE_BF16))
        return NB_ERR_INVALID_ARG;
    if (m == 0) return NB_OK;
    if (!out || !w->upper || !w->scale || !w->zero || (use_lower && !w->lower))
        return NB_ERR_INVALID_ARG;
    const size_t bytes = (size_t)m * k / 2;
    const unsigned blocks = (unsigned)((bytes + 255) / 256);
    const uint8_t *lo = use_lower ? w->lower : nullptr;
    if (dt == NB_DTYPE_F16)
        wq_dequant_kernel<__half><<<blocks, 256, 0, stream>>>(static_cast<__half *>(out), w->upper,
                                                              lo, w->scale, w->zero, m, k, gs);
    else
        wq_dequant_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(
            static_cast<__nv_bfloat16 *>(out), w->upper, lo, w->scale, w->zero, m, k, gs);
    return cudaPeekAtLastError() == cudaSuccess ? NB_OK : NB_ERR_BACKEND;
}

static cudaDataType_t cuda_type(nb_dtype t) {
    return t == NB_DTYPE_F32 ? CUDA_R_32F : t == NB_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

extern "C" nb_status nb_cuda_matmul_dense(cublasHandle_t handle, void *out, nb_dtype out_dt,
                                          const void *x, const void *w, nb_dtype dt,
                                          const void *bias, nb_dtype bias_dt, int n, int m, int k,
                                          cudaStream_t stream) {
    if (!handle || n < 0 || m < 0 || k < 0) return NB_ERR_INVALID_ARG;
    // NOTE: cublasGemmEx has no f16 x bf16-output (or the reverse) combination.
    if ((dt != NB_DTYPE_F32 && dt != NB_DTYPE_F16 && dt != NB_DTYPE_BF16) ||
        (out_dt != NB_DTYPE_F32 && out_dt != dt) ||
        (bias && !io_dtype_ok(bias_dt)))
        return NB_ERR_INVALID_ARG;
    if (n == 0 || m == 0) return NB_OK;
    if (!out || (k > 0 && (!x || !w))) return NB_ERR_INVALID_ARG;
    if (cublasSetStream(handle, stream) != CUBLAS_STATUS_SUCCESS) return NB_ERR_BACKEND;
    const float alpha = 1.0f, beta = 0.0f;
    // NOTE: column-major view: out^T [m][n] = W [m][k] (row-major = k x m
    // column-major, transposed) times x^T (row-major [n][k] = k x n).
    cublasStatus_t st = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w,
                                     cuda_type(dt), k, x, cuda_type(dt), k, &beta, out,
                                     cuda_type(out_dt), m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return NB_ERR_BACKEND;
    if (bias) {
        const size_t total = (size_t)n * m;
        bias_add_kernel<<<(unsigned)((total + 255) / 256), 256, 0, stream>>>(
            out, (int)out_dt, bias, (int)bias_dt, n, m);
        if (cudaPeekAtLastError() != cudaSuccess) return NB_ERR_BACKEND;
    }
    return NB_OK;
}
