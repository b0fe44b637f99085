// linear_cuda.cu: quantized (wquant.h) and dense linear layers on CUDA
// (contracts in linear_cuda.h).
//
// The one idea of the quantized path: a weight tile of 16 rows is the A
// operand of mma.sync.m16n8k16 and 8 rows of x are B, so one 16-byte load of
// nibbles per lane (32 codes of one row, a quarter of a group) becomes A
// fragments with a mask (or mask-or-fma) per pair of codes and no shuffles:
//   - lane (g = lane/4, t = lane%4) owns rows g and g+8 of the tile and
//     elements [32t, 32t+32) of each group of 128: 16 bytes of each plane;
//   - the device planes are in the CUDA layout (nb_cuda_wq_pack_plane):
//     within each 32-bit word of 8 codes, nibble n holds code rev3(n)
//     (0,4,2,6,1,5,3,7), so (q >> 4i) & 0x000f000f puts codes (0,1), (4,5),
//     (2,3), (6,7) for i = 0..3 into the two halves of an x2 register: the
//     order of x in memory, so an x load is a B fragment as it is;
//   - in the 4-bit view with f16 x the masked bits already are the f16
//     subnormals U * 2^-24 (exact), and q & 0x00f000f0 is 16U * 2^-24, so
//     one shift and four masks make the word's four A registers; the
//     16U ones accumulate apart and are folded in with one fma per group.
//     Otherwise magic | code and one fma.rn.x2 remove the magic (and scale U
//     by 16 in the 8-bit view), exactly;
//   - sum(x_G) comes from one more mma with A = all ones, already laid out
//     like the accumulators, so the zero term is one fma per group;
//   - scales and zeros are tile-major (nb_cuda_wq_pack_sz): a lane's two
//     rows' scale and zero for a group are one 8-byte read.
// Per group the mma accumulates dot(x_G, C_G) in f32 from +0, and the lane
// adds sc * d, then z * xs, to its running total (two fmas). The 8 warps of a block split
// the groups of k between them (interleaved, 2 groups per warp per
// iteration, all loads of an iteration issued before the first mma) and are
// summed in a fixed order through shared memory at the end, so results are
// deterministic run to run. Weights are read with L1::no_allocate so that
// x, which every block reads, stays in L1.
#include "linear_cuda.h"

#include "dtype_cuda.cuh"
#include "mbarrier_cuda.cuh"
#include "pdl_cuda.cuh"
#include "elementwise_cuda.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <type_traits>

namespace {

constexpr int kWarps = 8;            // warps per block; they split k
constexpr int kThreads = kWarps * 32;
// Groups per warp per iteration (GU, a template parameter): all loads of an
// iteration are issued before the first mma, so GU sets the bytes in flight.
// 4 at one x tile (decode: 8 loads of 16 B a lane in flight; k = 4096 is
// then one iteration), 2 at two (the accumulators need the registers).
constexpr int kGroup = NB_WQ_GROUP;  // the tensor-core path needs k % 128 == 0
// Bytes of one group of a 32-row tile of a CUDA plane (linear_cuda.h): 32
// rows x 64 bytes, contiguous.
constexpr int kPlaneGroup = 32 * kGroup / 2;

struct WqParams {
    void *out;              // [n][m] out_dt
    const void *x;          // [n][k] XT
    const uint8_t *upper;   // CUDA plane (linear_cuda.h)
    const uint8_t *lower;   // CUDA plane (8-bit view only)
    const uint16_t *sz;     // CUDA sz layout, 32-row tiles (linear_cuda.h)
    const void *bias;       // [m] bias_dt or NULL
    int out_dt, bias_dt;
    int n, m, k;
    int trace_seq;          // NB_WQ_TRACE builds: the launch's trace slot, or -1
    // The epilogue (kEpiPlain: out[n][m] as computed). kEpiSwiglu
    // (nb_cuda_matmul_wq_swiglu): rows 16t + i and 16t + 8 + i (i < 8) are
    // gate and up row 8t + i; out is [n][m/2] out_dt (f16 saturating when
    // sat), no bias. kEpiRope (nb_cuda_matmul_wq_rope): rows 16t + i and
    // 16t + 8 + i of a head are its dims 8(t mod D/16) + i and that + D/2;
    // out unused, see WqRopeParams.
    int epi, sat;
};
// The RoPE epilogue's kernels take this (the others WqParams alone: a
// larger parameter block changed the registers of the plain kernels).
struct WqRopeParams : WqParams {
    nb_cuda_wq_rope rope;
};
// kEpiRes (nb_cuda_matmul_wq_res): the plain outputs added into the f32
// residual stream, which also yields the next RMSNorm's unscaled f16 input
// and the blocks' partial sums of squares; see WqResParams.
constexpr int kEpiPlain = 0, kEpiSwiglu = 1, kEpiRope = 2, kEpiRes = 3;
struct WqResParams : WqParams {
    nb_cuda_wq_res res;
};
template <int EPI>
using WqP = typename std::conditional<EPI == kEpiRope, WqRopeParams,
                                      typename std::conditional<EPI == kEpiRes, WqResParams, WqParams>::type>::type;
// RS (nb_cuda_matmul_wq_swiglu_rs / _rope_rs): the epilogue first scales
// each x row's sums by that row's RMSNorm factor r, from the partial sums
// of squares a kEpiRes launch left (only those kernels take the larger
// parameter block).
template <int EPI> struct WqRsParams : WqP<EPI> {
    const float *part; // [n][NB_CUDA_WQ_PART]
    float eps;
};
template <int EPI, bool RS> using WqPN = typename std::conditional<RS, WqRsParams<EPI>, WqP<EPI>>::type;
constexpr int kPart = NB_CUDA_WQ_PART;

// Constants for turning "magic | code" into the code: value = h * mul + add.
template <typename XT> struct Deq;
template <> struct Deq<__half> {
    static constexpr uint32_t kMagic = 0x64006400u;  // 1024 + code (exact to 1023)
    static constexpr uint32_t kOne = 0x3c003c00u;    // 1.0
    static constexpr uint32_t kU4Add = 0xe400e400u;  // -1024: U
    static constexpr uint32_t kU8Mul = 0x4c004c00u;  // 16.0
    static constexpr uint32_t kU8Add = 0xf400f400u;  // -16384: 16U
    static constexpr uint32_t kLAdd = 0xe408e408u;   // -1032: (L + 8) - 8
    static constexpr bool kSubnormalU4 = true;       // see deq_u
};
template <> struct Deq<__nv_bfloat16> {
    static constexpr uint32_t kMagic = 0x43004300u;  // 128 + code (exact to 127)
    static constexpr uint32_t kOne = 0x3f803f80u;    // 1.0
    static constexpr uint32_t kU4Add = 0xc300c300u;  // -128
    static constexpr uint32_t kU8Mul = 0x41804180u;  // 16.0
    static constexpr uint32_t kU8Add = 0xc500c500u;  // -2048
    static constexpr uint32_t kLAdd = 0xc308c308u;   // -136
    // NOTE: no bf16 subnormal trick: U * 2^-133 times a small x underflows f32.
    static constexpr bool kSubnormalU4 = false;
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

// Nibbles i and i+4 of the 8 of q (i = shift / 4) as an x2 value.
template <typename XT>
__device__ __forceinline__ uint32_t deq(uint32_t q, int shift, uint32_t mul, uint32_t add) {
    uint32_t h = ((q >> shift) & 0x000f000fu) | Deq<XT>::kMagic;
    return fma2<XT>(h, mul, add);
}

// The upper-plane nibbles i and i+4 of word q (i = shift / 4) as an mma
// operand. 8-bit view: 16U (magic, then one fma). 4-bit view: U, except in
// f16, where the masked bits already are the f16 subnormals U * 2^-24: one
// instruction instead of three, and exact, as are their products with x
// (>= 2^-48 in magnitude, far from f32's subnormals). Every product and
// partial sum of the mma, and acc, is then the value with U itself times
// 2^-24; the group sums of x are formed times 2^-24 as well (x_sum), so a
// tile's whole sum is the true one times 2^-24, scaled back once per tile
// (tile_out): the same roundings as with U, bit for bit, while every value
// stays far above 2^-126.
template <typename XT, bool LOWER>
__device__ __forceinline__ uint32_t deq_u(uint32_t q, int shift) {
    if (LOWER) return deq<XT>(q, shift, Deq<XT>::kU8Mul, Deq<XT>::kU8Add);
    if (Deq<XT>::kSubnormalU4) return (q >> shift) & 0x000f000fu;
    return deq<XT>(q, shift, Deq<XT>::kOne, Deq<XT>::kU4Add);
}
// The lower-plane nibbles (8-bit view): L = stored - 8.
template <typename XT> __device__ __forceinline__ uint32_t deq_l(uint32_t q, int shift) {
    return deq<XT>(q, shift, Deq<XT>::kOne, Deq<XT>::kLAdd);
}
// The factor applied to a group's dot product for the group's scale s.
template <typename XT, bool LOWER> __device__ __forceinline__ float sc_view(float s) {
    if (LOWER) return s * 0.0625f;  // s/16 is exact (a power-of-two scaling of an f16)
    return s;
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

// The per-group arithmetic, shared by the tile and the decode kernel (a
// row's bits must not depend on which kernel computed it, so both call
// exactly these, in the same order).
//
// b[0..3]: the B fragments of the 8 x elements of one word of a lane's 16
// bytes: elements (0,1), (2,3), (4,5), (6,7), as they lie in memory (the
// planes' layout puts the codes in that order, see word_mma).
__device__ __forceinline__ void x_frags(const uint4 &v, uint32_t (&b)[4]) {
    b[0] = v.x;
    b[1] = v.y;
    b[2] = v.z;
    b[3] = v.w;
}
// xs += the sum of the word's x elements (an mma with A = ones; for the
// 4-bit view with f16 x, A = 2^-24, the f16 subnormal 1: the sum times
// 2^-24, exactly, see deq_u).
template <typename XT, bool LOWER>
__device__ __forceinline__ void x_sum(float (&xs)[4], const uint32_t (&b)[4]) {
    const uint32_t one = !LOWER && Deq<XT>::kSubnormalU4 ? 0x00010001u : Deq<XT>::kOne;
    mma<XT>(xs, one, one, one, one, b[0], b[1]);
    mma<XT>(xs, one, one, one, one, b[2], b[3]);
}
// The 4-bit view with f16 x: U * 2^-24 and 16U * 2^-24 by masks alone (see
// deq_u); the 16U products go to a second accumulator, acc16.
template <typename XT, bool LOWER> constexpr bool kMaskU4 = !LOWER && Deq<XT>::kSubnormalU4;

// acc[nt] (and acc16[nt], kMaskU4 only) += one word of codes of weight rows
// g and g+8 (q0, q1; l0, l1 the lower plane in the 8-bit view) times x tile
// nt's fragments b[nt]. In the planes' layout, nibble pairs (n, n+4) of a
// word hold codes (0,1), (4,5), (2,3), (6,7) for n = 0..3, so the A registers
// at shifts 0 and 8 go with x pairs (0,1), (2,3) and those at shifts 4 and
// 12 with (4,5), (6,7). Upper codes first, then lower, each in that order.
template <typename XT, bool LOWER, int NT>
__device__ __forceinline__ void word_mma(float (*acc)[4] /*[NT]*/, float (*acc16)[4] /*[NT]*/,
                                         uint32_t q0, uint32_t q1, uint32_t l0, uint32_t l1,
                                         const uint32_t (*b)[4] /*[NT]*/) {
    if constexpr (kMaskU4<XT, LOWER>) {
        constexpr uint32_t kLo = 0x000f000fu, kHi = 0x00f000f0u;
        const uint32_t r0 = q0 >> 8, r1 = q1 >> 8;
        const uint32_t a0 = q0 & kLo, a1 = q1 & kLo, a2 = r0 & kLo, a3 = r1 & kLo;
        const uint32_t c0 = q0 & kHi, c1 = q1 & kHi, c2 = r0 & kHi, c3 = r1 & kHi;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            mma<XT>(acc[nt], a0, a1, a2, a3, b[nt][0], b[nt][1]);
            mma<XT>(acc16[nt], c0, c1, c2, c3, b[nt][2], b[nt][3]);
        }
    } else {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int sh = 4 * hh;
            const uint32_t a0 = deq_u<XT, LOWER>(q0, sh), a1 = deq_u<XT, LOWER>(q1, sh);
            const uint32_t a2 = deq_u<XT, LOWER>(q0, sh + 8), a3 = deq_u<XT, LOWER>(q1, sh + 8);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) mma<XT>(acc[nt], a0, a1, a2, a3, b[nt][2 * hh], b[nt][2 * hh + 1]);
        }
        if (LOWER) {
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int sh = 4 * hh;
                const uint32_t a0 = deq_l<XT>(l0, sh), a1 = deq_l<XT>(l1, sh);
                const uint32_t a2 = deq_l<XT>(l0, sh + 8), a3 = deq_l<XT>(l1, sh + 8);
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    mma<XT>(acc[nt], a0, a1, a2, a3, b[nt][2 * hh], b[nt][2 * hh + 1]);
            }
        }
    }
}
// A group's dot product from its accumulators (kMaskU4: acc + acc16 / 16,
// one rounding; 1/16 is exact). X1: only x row 2t (i = 0, 2) is wanted (one
// row of x: the others are never stored).
template <typename XT, bool LOWER, bool X1 = false>
__device__ __forceinline__ void group_dot(float (&acc)[4], const float (&acc16)[4]) {
    if constexpr (kMaskU4<XT, LOWER>) {
#pragma unroll
        for (int i = 0; i < 4; i += X1 ? 2 : 1) acc[i] = __fmaf_rn(acc16[i], 0.0625f, acc[i]);
    }
}
// A group's contribution: tot[i] += sc * dot, then += z * sum(x_G) (two
// fmas) for weight row g + 8*(i/2) (sc[0..1], zc[0..1]) and x row 2t + i%2.
template <bool X1 = false>
__device__ __forceinline__ void fold_group(float (&tot)[4], const float (&sc)[2], const float (&zc)[2],
                                           const float (&acc)[4], const float (&xs)[4]) {
#pragma unroll
    for (int i = 0; i < 4; i += X1 ? 2 : 1)
        tot[i] = __fmaf_rn(zc[i >> 1], xs[i], __fmaf_rn(sc[i >> 1], acc[i], tot[i]));
}
// A tile's sum as it leaves a warp: kMaskU4 sums are formed times 2^-24.
template <typename XT, bool LOWER> __device__ __forceinline__ float tile_out(float v) {
    return kMaskU4<XT, LOWER> ? v * 16777216.0f : v;
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

// The SwiGLU epilogues' store (4-bit and row-invariant dense matmuls):
// silu(g) * u as element e of out, converted as nb_dtype.h converts (the
// SwiGLU kernel's stores; f16 saturating when sat).
__device__ __forceinline__ void swiglu_store(void *out, int out_dt, bool sat, size_t e, float g, float u) {
    const float v = nb_ops::silu_mul(g, u);
    if (out_dt == NB_DTYPE_F32) static_cast<float *>(out)[e] = v;
    else if (out_dt == NB_DTYPE_F16)
        static_cast<uint16_t *>(out)[e] = sat ? nb_dt::f32_to_f16_sat(v) : nb_dt::f32_to_f16(v);
    else static_cast<uint16_t *>(out)[e] = nb_dt::f32_to_bf16(v);
}
// Output row j (of m/2) for x row i.
__device__ __forceinline__ void store_swiglu(const WqParams &p, int i, int j, float g, float u) {
    swiglu_store(p.out, p.out_dt, p.sat, (size_t)i * (p.m / 2) + j, g, u);
}

// The RoPE epilogues' store (4-bit and row-invariant dense matmuls): dims d
// and d + D/2 of head hd (q heads, then k heads, then v heads) for x row i,
// x0 and x1. q heads are rotated into q_out, k heads rotated and v heads as
// they are into the FP cache at (fpblock[i], slot[i]) (a row outside the
// pool or block: skipped), each as nb_cuda_rope_write_kv stores them.
__device__ __forceinline__ void store_rope_pair(const nb_cuda_wq_rope &r, int i, int hd, int d, float x0,
                                                float x1) {
    const int D = r.lay.head_dim, h = D / 2;
    const int nq = r.n_heads, nkv = r.lay.n_kv_heads;
    float y0 = x0, y1 = x1;
    if (hd < nq + nkv) {
        const float2 cs = reinterpret_cast<const float2 *>(r.cs)[(size_t)i * h + d];
        nb_ops::rope_rot(x0, x1, cs.x, cs.y, y0, y1);
    }
    if (hd < nq) {
        float *q = r.q_out + ((size_t)i * nq + hd) * D;
        q[d] = y0;
        q[d + h] = y1;
        return;
    }
    const int32_t fb = r.fpblock[i], sl = r.slot[i];
    if (fb < 0 || fb >= r.lay.n_fpblocks || sl < 0 || sl >= r.lay.group_size) return;
    const int kv = hd >= nq + nkv, kh = hd - nq - kv * nkv;
    const size_t o = nb_kv_fp_offset(&r.lay, r.layer, fb, kh, kv, sl);
    nb_ops::store_as(r.fp, r.lay.dtype, o + d, y0);
    nb_ops::store_as(r.fp, r.lay.dtype, o + d + h, y1);
}
// The 4-bit epilogue's pair: weight rows row and row + 8 of the RoPE row
// layout (a 16-row tile's lane pair), dims d and d + D/2 of head row / D
// with d = 8 * ((row mod D) / 16) + (row mod 8).
__device__ __forceinline__ void store_rope(const WqRopeParams &p, int i, int row, float x0, float x1) {
    const int D = p.rope.lay.head_dim;
    store_rope_pair(p.rope, i, row / D, ((row % D) >> 4) * 8 + (row & 7), x0, x1);
}

// The paired epilogues' final loop, shared by the tile and decode kernels:
// for each x row and each 16-row tile of the block's RR, weight rows rl and
// rl + 8 (rl < 8), each summed over the warps in the plain epilogue's order
// (rb[w][x row][row in block]), then stored as the epilogue stores a pair.
// rsc (RS kernels, else NULL): each x row's RMSNorm factor, applied to both
// sums first.
template <int EPI, int RR, typename Red>
__device__ __forceinline__ void epi_pairs(const WqP<EPI> &p, Red rb, int xrows, int row0, int xr0,
                                          const float *rsc = nullptr) {
    for (int idx = threadIdx.x; idx < xrows * RR * 8; idx += kThreads) {
        const int xc = idx / (RR * 8), q = idx % (RR * 8), rl = (q >> 3) * 16 + (q & 7);
        const int row = row0 + rl, xrow = xr0 + xc;
        if (row >= p.m || xrow >= p.n) continue;
        float va = rb[0][xc][rl], vb = rb[0][xc][rl + 8];
#pragma unroll
        for (int w = 1; w < kWarps; w++) va += rb[w][xc][rl], vb += rb[w][xc][rl + 8];
        if (rsc) {
            va = __fmul_rn(va, rsc[xrow]);
            vb = __fmul_rn(vb, rsc[xrow]);
        }
        if constexpr (EPI == kEpiSwiglu) store_swiglu(p, xrow, (row >> 4) * 8 + (q & 7), va, vb);
        else store_rope(p, xrow, row, va, vb);
    }
}
// A warp's sums of one block's tiles into rb[warp], as both kernels stage
// them for the epilogues: tot[r][c][i] is weight row g + 8*(i/2) of 16-row
// tile r and x row 8c + 2t + i%2.
template <typename XT, bool LOWER, int RR, int NC, typename Red>
__device__ __forceinline__ void stage_tot(Red rb, int warp, int g, int t, const float (&tot)[RR][NC][4]) {
#pragma unroll
    for (int r = 0; r < RR; r++)
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                rb[warp][c * 8 + 2 * t + (i & 1)][r * 16 + g + (i >> 1) * 8] = tile_out<XT, LOWER>(tot[r][c][i]);
}
// The plain epilogue's loop, shared by the tile and decode kernels (a row's
// bits must not depend on which of them ran): each output of the block
// summed over the warps in warp order, plus the bias, then stored.
template <int EPI, int RR, typename Red>
__device__ __forceinline__ void store_plain(const WqP<EPI> &p, Red rb, int xrows, int row0, int xr0) {
    for (int idx = threadIdx.x; idx < xrows * RR * 16; idx += kThreads) {
        const int xc = idx / (RR * 16), rl = idx % (RR * 16);
        const int row = row0 + rl, xrow = xr0 + xc;
        if (row >= p.m || xrow >= p.n) continue;
        float v = rb[0][xc][rl];
#pragma unroll
        for (int w = 1; w < kWarps; w++) v += rb[w][xc][rl];
        if (p.bias) v += load_any(p.bias, p.bias_dt, row);
        store_any(p.out, p.out_dt, (size_t)xrow * p.m + row, v);
    }
}

// kEpiRes's loop (decode kernel, 32-row items: a row tile's 32 outputs of
// x row c are warp c's lanes, c = warp + 8j): each output summed over the
// warps in store_plain's order (plus the bias), so v is the plain output's
// bits; h = x + v as nb_ref_add adds them, stored back into x; xs = the f16
// saturating h * w; ss[j] += h * h (this thread's running sum of row c).
template <int NX, typename Red>
__device__ __forceinline__ void store_res(const WqResParams &p, Red rb, int row0, float (&ss)[NX]) {
#pragma unroll
    for (int j = 0; j < NX; j++) {
        const int xc = (threadIdx.x >> 5) + 8 * j, rl = threadIdx.x & 31;
        const int row = row0 + rl;
        if (row >= p.m || xc >= p.n) continue;
        float v = rb[0][xc][rl];
#pragma unroll
        for (int w = 1; w < kWarps; w++) v += rb[w][xc][rl];
        if (p.bias) v += load_any(p.bias, p.bias_dt, row);
        const size_t e = (size_t)xc * p.m + row;
        const float h = __fadd_rn(p.res.x[e], v);
        p.res.x[e] = h;
        p.res.xs[e] = nb_dt::f32_to_f16_sat(__fmul_rn(h, load_any(p.res.w, p.res.w_dt, row)));
        ss[j] = __fadd_rn(ss[j], __fmul_rn(h, h));
    }
}

// The sum over 32 lanes in one fixed order (every lane gets it).
__device__ __forceinline__ float warp_sum_fixed(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename XT> __device__ __forceinline__ float x_to_f32(XT v);
template <> __device__ __forceinline__ float x_to_f32<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float x_to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

#ifdef NB_WQ_TRACE
// Timeline hooks, compiled only into tests/bench/trace_linear_cuda.cu (a
// diagnostic; never in the library): lane 0 of each warp stores
// %globaltimer at numbered points into its own slot, no atomics. The harness
// lists its launches' output buffers; p.out names the launch.
constexpr int kTrL = 32, kTrB = 1024, kTrP = 6;
__device__ unsigned long long nb_wq_trace_buf[kTrL][kTrB][kWarps][kTrP];
// Host side: the outputs of the launches to trace (slot = index), matched
// at launch so that the kernel looks nothing up.
const void *nb_wq_trace_outs[kTrL];
__device__ __forceinline__ unsigned long long wq_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void wq_trace_t(int seq, int pt, unsigned long long t) {
    if ((threadIdx.x & 31) == 0 && seq >= 0 && blockIdx.x < kTrB)
        nb_wq_trace_buf[seq][blockIdx.x][threadIdx.x >> 5][pt] = t;
}
#define WQ_TRACE_SEQ                               \
    const unsigned long long wq_t0 = wq_now();     \
    const int wq_seq = p.trace_seq
#define WQ_TRACE(pt) wq_trace_t(wq_seq, pt, (pt) == 0 ? wq_t0 : wq_now())
#else
#define WQ_TRACE_SEQ ((void)0)
#define WQ_TRACE(pt) ((void)0)
#endif

// The tensor-core kernel. Block: kWarps warps, R tiles of 16 weight rows
// (blockIdx.x), NT tiles of 8 x rows (blockIdx.y); grid.x = ceil(m/16R),
// grid.y = ceil(n/8NT).
template <typename XT, int NT, int R, bool LOWER, int kGU, int EPI>
__global__ void __launch_bounds__(kThreads) wq_mma_kernel(const WqP<EPI> p) {
    __shared__ float red[kWarps][NT * 8][R * 16];
    WQ_TRACE_SEQ;
    WQ_TRACE(0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * (R * 16);
    const int xr0 = blockIdx.y * (NT * 8);
    const int ng = p.k / kGroup;

    const uint8_t *wu[R][2];
    const uint8_t *wl[R][2];
    const uint2 *wsz[R];  // this lane's (sc(g), sc(g+8)), (z(g), z(g+8)) of each group
    bool tok[R];
    bool rok[R][2];
    // Row row0 + g's first group in the CUDA plane layout (linear_cuda.h;
    // the block's rows lie in one 32-row tile, padded past m); the group G
    // of row row0 + i is kPlaneGroup * G + 64 (i - g) bytes on from there.
    const size_t o0 = nb_cuda_wq_plane_off(row0, 0, 0, ng, kGroup / 2) + (g * (kGroup / 2) + t * 16);
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            rok[r][h] = row0 + r * 16 + g + h * 8 < p.m;
            const size_t o = o0 + (size_t)(r * 16 + h * 8) * (kGroup / 2);
            wu[r][h] = p.upper + o;
            wl[r][h] = LOWER ? p.lower + o : nullptr;
        }
        const int tile = row0 / 16 + r;
        tok[r] = tile * 16 < p.m;
        // Tile `tile`'s half of its 32-row tile's 128 bytes a group (sz
        // layout, linear_cuda.h); group G is 16 uint2 on.
        const int tt = tok[r] ? tile : 0;
        wsz[r] = reinterpret_cast<const uint2 *>(p.sz + nb_cuda_wq_sz_off(tt, 0, ng)) + g;
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
                    qu[u][r][h] = ok ? ld_stream(wu[r][h] + (size_t)grp * kPlaneGroup) : z4;
                    if (LOWER) ql[u][r][h] = ok ? ld_stream(wl[r][h] + (size_t)grp * kPlaneGroup) : z4;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kGU; u++) {
            const int grp = gb + u * kWarps;
            const bool gok = grp < ng;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint2 szv = gok && tok[r] ? __ldg(wsz[r] + (size_t)grp * 16) : make_uint2(0, 0);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const bool ok = gok && rok[r][h];
                    float s = ok ? f16_bits_to_f32((uint16_t)(szv.x >> (16 * h))) : 0.0f;
                    sc[u][r][h] = sc_view<XT, LOWER>(s);
                    zc[u][r][h] = ok ? f16_bits_to_f32((uint16_t)(szv.y >> (16 * h))) : 0.0f;
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
            float acc[R][NT][4], acc16[R][NT][4];
            float xs[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    xs[nt][i] = 0.0f;
#pragma unroll
                    for (int r = 0; r < R; r++) acc[r][nt][i] = acc16[r][nt][i] = 0.0f;
                }
            }
#pragma unroll
            for (int w = 0; w < 4; w++) {
                uint32_t b[NT][4];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    x_frags(xv[u][nt][w], b[nt]);
                    x_sum<XT, LOWER>(xs[nt], b[nt]);
                }
#pragma unroll
                for (int r = 0; r < R; r++)
                    word_mma<XT, LOWER, NT>(acc[r], acc16[r], word(qu[u][r][0], w), word(qu[u][r][1], w),
                                            LOWER ? word(ql[u][r][0], w) : 0u,
                                            LOWER ? word(ql[u][r][1], w) : 0u, b);
            }
            // acc[r][nt][i]: weight row g + 8*(i/2) of tile r, x row 2t + i%2 of
            // tile nt; xs[nt][i] is that x row's group sum.
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    group_dot<XT, LOWER>(acc[r][nt], acc16[r][nt]);
                    fold_group(tot[r][nt], sc[u][r], zc[u][r], acc[r][nt], xs[nt]);
                }
        }
    }

    stage_tot<XT, LOWER>(red, warp, g, t, tot);
    __syncthreads();
    if constexpr (EPI != kEpiPlain) // each output of the plain loop, rows rl and rl + 8 paired (m % 16 == 0)
        epi_pairs<EPI, R>(p, red, NT * 8, row0, xr0);
    else
        store_plain<EPI, R>(p, red, NT * 8, row0, xr0);
    WQ_TRACE(5);
}

// ---- The decode kernel (n <= 16 rows of x) ----
//
// The arithmetic per output is the tile kernel's (same lane
// layout, same mma sequence per group, the same groups per warp: warp w
// takes groups w, w+8, ... of every tile, the same 8-warp sum in shared
// memory), so a row of x gets the same bits whether it comes with 0 or 15
// other rows (the engine's verify and decode rows rely on it). What differs
// is how the weights arrive and what is done once instead of per tile:
//   - blocks are persistent: grid = ceil(tiles / ceil(tiles / resident)), so
//     every block walks about the same number of 16-row tiles (strided) and
//     the machine has no half-empty last wave;
//   - each warp streams its (tile, group) items through an ST-deep ring in
//     shared memory (kGvVars), issuing item i + ST as it finishes item i,
//     across tile boundaries, so loads are always in flight. Lane 0 issues
//     an item as bulk copies (cp.async.bulk: the item's 16R rows of each
//     plane, 1 or 2 KB contiguous in the CUDA plane layout, and the R
//     tiles' 64 bytes each of scales and zeros, contiguous in the sz
//     layout) that complete on the slot's mbarrier, which every lane
//     waits on. Session 38 replaced per-lane 16-byte cp.async copies (3
//     instructions and ~20 of address and predicate work per item, and 4
//     load-unit passes per 32-lane copy) with tensor copies of 16R rows x
//     64 bytes from row-major planes: H200 n = 1, with the 32-row variants
//     that then became the built-in ones, 4.75 / 11.2 / 12.1 -> 4.6 / 10.5
//     / 11.1-11.4 us at 4096x4096 / 14336x4096 / 4096x14336. Session 40
//     made the planes tile-major, so an item is one contiguous piece of
//     whole 128-byte lines: H100 n = 1, 4-bit, 5.12-5.15 / 11.66-11.73 /
//     12.59-12.68 -> 4.96-4.99 / 11.54-11.66 / 12.17-12.25 us
//     (docs/benchmarks.md), and the scales and zeros tile-major in 32-row
//     tiles too, so that no copy needs a tensor map (none is encoded per
//     launch);
//   - the group sums of x (the zero term) depend only on the group, so each
//     warp computes its groups' sums once (the same mma as the tile kernel),
//     in the first tile's steps from the x fragments loaded there anyway,
//     and keeps them in shared memory for its later tiles (a pass of their
//     own before the first item measured 6.75 vs 5.92 us at 4096x4096);
//   - the ring's cursor moves by increments (no division per item), and
//     per-tile pointers are set up once per tile;
//   - programmatic dependent launch: the ring's first ST items (weights
//     only: they never depend on an earlier kernel) are requested before
//     griddepcontrol.wait, so with the launch attribute this launch's weight
//     stream starts while the previous kernel drains; x, the bias and the
//     output are touched only after the wait.

// Shared-memory layout of one ring slot: an item is R 16-row tiles x one
// group of 128 weights.
// Each part is what one copy brings (128-byte aligned): rows 16r + i of the
// item at 64 i bytes (as they lie in a CUDA plane), so lane (g, t) reads
// rows g and g + 8 at t * 16.
template <bool LOWER, int ST, int R> struct Gv {
    static constexpr int kU = 0;                           // uint4 [R][2][32]: upper plane bytes
    static constexpr int kL = R * 1024;                    // uint4 [R][2][32]: lower plane bytes
    static constexpr int kSZ = (LOWER ? 2 : 1) * R * 1024; // [R] x uint2 [8 g]: (sc(g), sc(g+8)), (z(g), z(g+8))
    static constexpr int kBytes = kSZ + 64 * R;            // bytes one item's copies bring
    static constexpr int kSlot = (kBytes + 127) / 128 * 128;
    static constexpr int kRing = kSlot * ST * kWarps;      // ring bytes per block
};
// Dynamic shared memory of one launch: the ring, then xs[warp][j][NX][8] f32.
template <bool LOWER, int ST, int R, int NX> size_t gv_smem_bytes(int cw_max) {
    return (size_t)Gv<LOWER, ST, R>::kRing + (size_t)kWarps * cw_max * NX * 8 * sizeof(float);
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
// 16 bytes global -> shared, or zeros when !ok (nothing is read then).
__device__ __forceinline__ void cp16z(uint32_t s, const void *g, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g),
                 "r"(ok ? 16 : 0)
                 : "memory");
}
// NOTE: the "memory" clobbers keep the compiler from moving the ring's
// plain shared-memory reads across a wait or a refill.
__device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The decode kernel's ring: an mbarrier per slot (mbarrier_cuda.cuh),
// completed by the bytes of the slot's bulk copies, each `bytes`
// contiguous bytes (16-byte aligned, a multiple of 16).
__device__ __forceinline__ void bulk1d(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// Grid: see launch_gemv; block: kWarps warps; dynamic shared memory
// gv_smem_bytes(cw_max). Needs sz 16-byte aligned, k % 128 == 0,
// 1 <= p.n <= 8 * NX. An item is R consecutive 16-row tiles (a "row tile"
// of 16R rows, ntiles of them) x one group; NX tiles of 8 x rows share
// each item's A fragments (n > 8: NX = 2; R = 2 then halves the x
// fragments loaded per weight byte). Every output gets the arithmetic of
// the tile kernel whatever R and NX.
// RS: the SwiGLU / RoPE epilogue scales by each row's RMSNorm factor (from
// p.part); kEpiRes: see store_res. Both need 32-row items (R = 2).
template <typename XT, bool LOWER, int ST, int MINB, int NS, bool X1, int R, int NX, int EPI, bool RS = false>
__global__ void __launch_bounds__(kThreads, MINB)
    wq_gemv_kernel(const WqPN<EPI, RS> p, int ntiles, int cw_max) {
    static_assert(!X1 || NX == 1, "X1: one row of x");
    static_assert((EPI != kEpiRes && !RS) || R == 2, "the residual / norm-scale forms: 32-row items");
    static_assert(!RS || EPI == kEpiSwiglu || EPI == kEpiRope, "the norm scale: the paired epilogues");
    extern __shared__ __align__(128) unsigned char gv_smem[];
    __shared__ float red[2][kWarps][NX * 8][R * 16];
    __shared__ __align__(8) uint64_t gv_bars[kWarps][ST];
    using L = Gv<LOWER, ST, R>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int ng = p.k / kGroup;
    const int cw = warp < ng ? (ng - warp + kWarps - 1) / kWarps : 0;  // groups per tile
    WQ_TRACE_SEQ;
    WQ_TRACE(0);
    const int my_tiles = (int)blockIdx.x < ntiles
                             ? (ntiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x
                             : 0;
    const uint32_t ring = smem_addr(gv_smem) + warp * (L::kSlot * ST);
    const uint32_t bars = smem_addr(&gv_bars[warp][0]);
    float *xs_s = reinterpret_cast<float *>(gv_smem + L::kRing) + (size_t)warp * cw_max * NX * 8;
    if (lane == 0) {
#pragma unroll
        for (int s = 0; s < ST; s++) nb_mbar::init(bars + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncwarp();

    // The prefetch cursor: row tile pf_tl (of this block's), group index
    // pf_j, slot pf_s. Lane 0 issues each item's copies: its R 16-row
    // tiles of each plane and their scales and zeros, one bulk copy each.
    int pf_tl = 0, pf_j = 0, pf_s = 0;
    // NOTE: the next kernel (when launched with the PDL attribute) may be
    // scheduled once every warp of every block has either triggered or
    // exited; it waits in its own griddepcontrol.wait for this grid to
    // finish before it reads anything this grid writes. Triggering when the
    // last weight load is issued (not at the start) keeps the next launch's
    // blocks from taking this launch's slots while it still streams.
    auto issue = [&]() {
        if (pf_tl < my_tiles) {
            if (lane == 0) {
                const uint32_t s = ring + pf_s * L::kSlot, bar = bars + 8 * pf_s;
                const int rt = (int)blockIdx.x + pf_tl * (int)gridDim.x, grp = warp + pf_j * kWarps;
                // NOTE: the warp's reads of this slot (generic proxy) come
                // before the copies that overwrite it (async proxy).
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                nb_mbar::arrive_tx(bar, L::kBytes);
                // The item's rows of each plane: one contiguous piece (a
                // 32-row tile's group, or a 16-row half of it).
                const int t16 = rt * R;
                const size_t off = nb_cuda_wq_plane_off(t16 * 16, grp, 0, ng, kGroup / 2);
                bulk1d(s + L::kU, p.upper + off, R * (kPlaneGroup / 2), bar);
                if (LOWER) bulk1d(s + L::kL, p.lower + off, R * (kPlaneGroup / 2), bar);
                // Its scales and zeros: the same in the sz layout (64 bytes
                // a 16-row tile).
                bulk1d(s + L::kSZ, p.sz + nb_cuda_wq_sz_off(t16, grp, ng), R * 64, bar);
            }
            pf_s = pf_s + 1 == ST ? 0 : pf_s + 1;
            if (++pf_j == cw) {
                pf_j = 0;
                if (++pf_tl >= my_tiles) nb_pdl::trigger();  // this warp's last weight load is in flight
            }
        }
    };
    if (cw == 0 || my_tiles == 0) nb_pdl::trigger();
    if (cw > 0) {
#pragma unroll
        for (int s = 0; s < ST; s++) issue();
    }
    WQ_TRACE(1);
    nb_pdl::wait();
    WQ_TRACE(2);
    __shared__ float rs_sh[RS ? NX * 8 : 1]; // RS: each x row's RMSNorm factor
    float ss[NX];                   // kEpiRes: this thread's sums of squares (store_res)
#pragma unroll
    for (int j = 0; j < NX; j++) ss[j] = 0.0f;
    if constexpr (EPI == kEpiRes) {
        // The partial sums past this grid's blocks are zeros (the reader sums all kPart).
        if (blockIdx.x == 0)
            for (int i = threadIdx.x; i < p.n * kPart; i += kThreads)
                if (i % kPart >= (int)gridDim.x) p.res.part[i] = 0.0f;
    }
    if constexpr (RS) {
        // The partial sums, into L1 for the first epilogue (lane l: line l of each row).
        if (warp == 0)
            for (int i = 0; i < p.n; i++)
                asm volatile("prefetch.global.L1 [%0];" ::"l"(p.part + (size_t)i * kPart + 32 * lane));
    }

    // NOTE: lanes of x rows past n load nothing (zeros). Loading row 0 in
    // those lanes instead (their mma columns are never stored) was 3-17%
    // slower at n = 4 on an H200 (session 38), likely because a 16-byte
    // load takes the load unit a pass per 8 active lanes.
    bool xok[NX];
    const uint8_t *xb[NX];
#pragma unroll
    for (int nx = 0; nx < NX; nx++) {
        xok[nx] = g + 8 * nx < p.n;
        xb[nx] = static_cast<const uint8_t *>(p.x) + (size_t)(xok[nx] ? g + 8 * nx : 0) * p.k * 2 + t * 64;
    }
    const uint4 z4 = make_uint4(0, 0, 0, 0);
    // b[w][nx][0..3]: the B fragments of x tile nx for word w of this lane's 16 bytes.
    auto load_b = [&](int grp, uint32_t (&b)[4][NX][4]) {
#pragma unroll
        for (int w = 0; w < 4; w++)
#pragma unroll
            for (int nx = 0; nx < NX; nx++)
                x_frags(xok[nx] ? __ldg(reinterpret_cast<const uint4 *>(xb[nx] + (size_t)grp * (kGroup * 2) +
                                                                         w * 16))
                                : z4,
                        b[w][nx]);
    };
    int cs = 0, cons = 0;  // the slot consumed next; items consumed (a slot's phase is (cons / ST) & 1)
    for (int tl = 0; tl < my_tiles; tl++) {
        const int rt = (int)blockIdx.x + tl * (int)gridDim.x;
        float tot[R][NX][4];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int nx = 0; nx < NX; nx++)
#pragma unroll
                for (int i = 0; i < 4; i++) tot[r][nx][i] = 0.0f;
        // N consecutive items at once (two independent mma chains and one
        // exposed x-load latency per pair); the per-item arithmetic and the
        // order of the tot updates are those of one item at a time.
        const bool first = tl == 0;
        auto step = [&](auto n_items, int j) {
            constexpr int N = decltype(n_items)::value;
            uint32_t b[N][4][NX][4];
#pragma unroll
            for (int u = 0; u < N; u++) load_b(warp + (j + u) * kWarps, b[u]);
#pragma unroll
            for (int u = 0; u < N; u++) {
                const int slot = cs + u < ST ? cs + u : cs + u - ST;
                nb_mbar::wait(bars + 8 * slot, (uint32_t)(((cons + u) / ST) & 1));
            }
            float acc[N][R][NX][4], acc16[N][R][NX][4], sc[N][R][2], zc[N][R][2], xs[N][NX][4];
            if (first) {
                // The group sums: the tile kernel's mma, in its order, on the
                // fragments loaded for the items anyway (no pass of their
                // own before the first item); kept for the later tiles.
#pragma unroll
                for (int u = 0; u < N; u++)
#pragma unroll
                    for (int nx = 0; nx < NX; nx++) {
#pragma unroll
                        for (int i = 0; i < 4; i++) xs[u][nx][i] = 0.0f;
#pragma unroll
                        for (int w = 0; w < 4; w++) x_sum<XT, LOWER>(xs[u][nx], b[u][w][nx]);
                        if (g == 0 && my_tiles > 1) {
                            xs_s[((j + u) * NX + nx) * 8 + 2 * t] = xs[u][nx][0];
                            xs_s[((j + u) * NX + nx) * 8 + 2 * t + 1] = xs[u][nx][1];
                        }
                    }
            }
            uint4 qu[N][R][2], ql[N][R][2];
#pragma unroll
            for (int u = 0; u < N; u++) {
                const int slot = cs + u < ST ? cs + u : cs + u - ST;
                const unsigned char *s = gv_smem + (warp * (L::kSlot * ST) + slot * L::kSlot);
#pragma unroll
                for (int r = 0; r < R; r++) {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        qu[u][r][h] = *reinterpret_cast<const uint4 *>(s + L::kU + ((r * 2 + h) * 32 + lane) * 16);
                        if (LOWER)
                            ql[u][r][h] =
                                *reinterpret_cast<const uint4 *>(s + L::kL + ((r * 2 + h) * 32 + lane) * 16);
                    }
                    const uint2 szw = *reinterpret_cast<const uint2 *>(s + L::kSZ + r * 64 + g * 8);
                    sc[u][r][0] = sc_view<XT, LOWER>(f16_bits_to_f32((uint16_t)szw.x));
                    sc[u][r][1] = sc_view<XT, LOWER>(f16_bits_to_f32((uint16_t)(szw.x >> 16)));
                    zc[u][r][0] = f16_bits_to_f32((uint16_t)szw.y);
                    zc[u][r][1] = f16_bits_to_f32((uint16_t)(szw.y >> 16));
#pragma unroll
                    for (int nx = 0; nx < NX; nx++)
#pragma unroll
                        for (int i = 0; i < 4; i++) acc[u][r][nx][i] = acc16[u][r][nx][i] = 0.0f;
                }
                if (!first) {
#pragma unroll
                    for (int nx = 0; nx < NX; nx++) {
                        const float2 xsv = *reinterpret_cast<const float2 *>(xs_s + ((j + u) * NX + nx) * 8 + 2 * t);
                        xs[u][nx][0] = xs[u][nx][2] = xsv.x;
                        xs[u][nx][1] = xs[u][nx][3] = xsv.y;
                    }
                }
            }
#pragma unroll
            for (int w = 0; w < 4; w++)
#pragma unroll
                for (int u = 0; u < N; u++)
#pragma unroll
                    for (int r = 0; r < R; r++)
                        word_mma<XT, LOWER, NX>(acc[u][r], acc16[u][r], word(qu[u][r][0], w),
                                                word(qu[u][r][1], w), LOWER ? word(ql[u][r][0], w) : 0u,
                                                LOWER ? word(ql[u][r][1], w) : 0u, b[u][w]);
#pragma unroll
            for (int u = 0; u < N; u++)
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int nx = 0; nx < NX; nx++) {
                        group_dot<XT, LOWER, X1>(acc[u][r][nx], acc16[u][r][nx]);
                        fold_group<X1>(tot[r][nx], sc[u][r], zc[u][r], acc[u][r][nx], xs[u][nx]);
                    }
            __syncwarp();  // every lane has read the slots before they are refilled
#pragma unroll
            for (int u = 0; u < N; u++) issue();
            cs = cs + N < ST ? cs + N : cs + N - ST;
            cons += N;
            if (first && j == 0) WQ_TRACE(3);  // the first items and group sums done
        };
        int j = 0;
        if constexpr (NS >= 2)
            for (; j + 2 <= cw; j += 2) step(std::integral_constant<int, 2>{}, j);
        for (; j < cw; j++) step(std::integral_constant<int, 1>{}, j);
        WQ_TRACE(4);
        // tot[r][nx][i]: weight row g + 8*(i/2) of tile r, x row 8nx + 2t + i%2.
        float (*rb)[NX * 8][R * 16] = red[tl & 1];
        stage_tot<XT, LOWER>(rb, warp, g, t, tot);
        // NOTE: one barrier per row tile: red is double-buffered, and a
        // buffer is rewritten two row tiles later, after every reader has
        // passed the barrier in between.
        __syncthreads();
        if constexpr (RS) {
            if (tl == 0) { // the rows' factors, once: warp w for rows w and w + 8
                for (int i = warp; i < p.n; i += kWarps) {
                    float v[kPart / 32];
#pragma unroll
                    for (int u = 0; u < kPart / 32; u++) v[u] = p.part[(size_t)i * kPart + lane + 32 * u];
                    float a = 0.0f;
#pragma unroll
                    for (int u = 0; u < kPart / 32; u++) a = __fadd_rn(a, v[u]);
                    const float ms = __fdiv_rn(warp_sum_fixed(a), (float)p.k);
                    if (lane == 0) rs_sh[i] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, p.eps)));
                }
                __syncthreads();
            }
        }
        if constexpr (EPI == kEpiRes)
            store_res<NX>(p, rb, rt * R * 16, ss);
        else if constexpr (EPI != kEpiPlain) // as the tile kernel's
            epi_pairs<EPI, R>(p, rb, NX * 8, rt * R * 16, 0, RS ? rs_sh : nullptr);
        else
            store_plain<EPI, R>(p, rb, NX * 8, rt * R * 16, 0);
    }
    if constexpr (EPI == kEpiRes) {
        // This block's partial sum of squares of each x row, in a fixed order.
#pragma unroll
        for (int j = 0; j < NX; j++) {
            const float a = warp_sum_fixed(ss[j]);
            const int xc = warp + 8 * j;
            if (lane == 0 && xc < p.n) p.res.part[(size_t)xc * kPart + blockIdx.x] = a;
        }
    }
    WQ_TRACE(5);
}

// Byte b of row j's group gi in a CUDA plane (linear_cuda.h; ng groups of
// gs weights a row).
__device__ __forceinline__ size_t plane_off(size_t j, int gi, int b, int ng, int gs) {
    return nb_cuda_wq_plane_off((int)j, gi, b, ng, gs / 2);
}
// Code of element e of row j of a CUDA plane: element 8w + i of a group is
// nibble rev3(i) of (little-endian) word w of the row's group bytes.
__device__ __forceinline__ int plane_code(const uint8_t *plane, size_t j, int e, int ng, int gs) {
    const int i = e & 7, n = ((i & 1) << 2) | (i & 2) | (i >> 2), eg = e % gs;
    return (plane[plane_off(j, e / gs, (eg >> 3) * 4 + (n >> 1), ng, gs)] >> ((n & 1) * 4)) & 15;
}

// The scale (z = 0) or zero (z = 1) of row j, group gi, in the CUDA sz
// layout (ng groups per row).
__device__ __forceinline__ float sz_at(const uint16_t *sz, size_t j, int gi, int ng, int z) {
    return f16_bits_to_f32(sz[nb_cuda_wq_sz_off((int)(j >> 4), gi, ng) + nb_cuda_wq_sz_slot((int)(j & 15), z)]);
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
    const uint8_t *lo = use_lower ? p.lower : nullptr;
    float tot = 0.0f;
    for (int gi = 0; gi < ng; gi++) {
        float d = 0.0f, xs = 0.0f;
        for (int e = gi * gs; e < (gi + 1) * gs; e++) {
            int c = plane_code(p.upper, (size_t)j, e, ng, gs);
            if (lo) c = 16 * c + plane_code(lo, (size_t)j, e, ng, gs) - 8;
            const float xv = x_to_f32<XT>(xr[e]);
            d += __fmul_rn(xv, (float)c);
            xs += xv;
        }
        float s = sz_at(p.sz, (size_t)j, gi, ng, 0);
        if (use_lower) s *= 0.0625f;
        const float z = sz_at(p.sz, (size_t)j, gi, ng, 1);
        tot += __fmul_rn(s, d) + __fmul_rn(z, xs);
    }
    if (p.bias) tot += load_any(p.bias, p.bias_dt, j);
    store_any(p.out, p.out_dt, idx, tot);
}

__device__ __forceinline__ void put(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

template <typename OT>
__global__ void wq_dequant_kernel(OT *out, const uint8_t *upper, const uint8_t *lower,
                                  const uint16_t *sz, int m, int k, int gs) {
    const size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // byte index
    if (b >= (size_t)m * k / 2) return;
    const size_t j = b / (k / 2);
    const int ng = k / gs;
    const int bb = (int)(b % (k / 2));  // byte bb % 4 of word bb / 4 of the row
    const size_t src = plane_off(j, bb / (gs / 2), bb % (gs / 2), ng, gs);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int n = (bb & 3) * 2 + h;  // the nibble; it holds element rev3(n) of the word
        const int e = (bb >> 2) * 8 + (((n & 1) << 2) | (n & 2) | (n >> 2));
        const float s = sz_at(sz, j, e / gs, ng, 0), z = sz_at(sz, j, e / gs, ng, 1);
        int c = (upper[src] >> (4 * h)) & 15;
        float v;
        if (lower) {
            c = 16 * c + ((lower[src] >> (4 * h)) & 15) - 8;
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

int g_pdl = -1;  // -1: NB_WQ_PDL from the environment (default on); 0/1: set
int g_gemv = -1; // -1: NB_WQ_GEMV from the environment (default on); 0/1: set
int g_gemv_bps = 0; // decode-kernel blocks per SM; 0: the built-in choice (all that fit)

bool gemv_on() {
    if (g_gemv < 0) {
        const char *e = getenv("NB_WQ_GEMV");
        g_gemv = !(e && e[0] == '0');
    }
    return g_gemv != 0;
}

bool pdl_on() {
    return nb_pdl::env_switch_once("NB_WQ_PDL", true, &g_pdl);
}

// The decode kernel's variants: ring depth in items (the 8-bit view always
// 8 KB in flight a warp: 4 items of 2 KB, or 2 of 4 KB), blocks per SM the
// registers are budgeted for (launch bounds), items per step, and R, the
// 16-row tiles per item (2: one bulk copy of 32 rows a plane, and half
// the x fragments per weight byte). Same bits for every variant (the same
// per-item arithmetic in the same order). The built-in choice is
// gemv_builtin's. With the cp.async ring of sessions 11-37 variant 0 was
// the built-in one below 5 rows of x (session 17: variants 1 and 2 were
// 5-35% slower on an H100; 4 blocks of 64 registers spill); the tensor-copy
// ring (session 38) made the 32-row forms faster in the 4-bit view at every
// measured shape and row count, and in the 8-bit view where one block per
// SM leaves SMs idle.
struct GvVar {
    int st, minb, ns, r;
};
constexpr GvVar kGvVars[] = {{8, 2, 2, 1}, {8, 2, 1, 1}, {6, 3, 1, 1}, {4, 2, 1, 2}, {4, 1, 2, 2}};
constexpr int kGvNVar = (int)(sizeof kGvVars / sizeof kGvVars[0]);
int g_gemv_var = -1; // -1: the built-in choice (gemv_builtin)
// The decode kernel for 9 <= n <= 16 (two x tiles, NX = 2): 16-row tiles
// per item (R), ring depth in items for the 4-bit and the 8-bit view
// (about the bytes in flight of n <= 8), register budget in blocks per SM;
// one item per step. All give the same bits. Built in (measured on an
// H100 at n = 9 and 16, docs/benchmarks.md, session 19): variant 0 (R = 2:
// half the x fragments per weight byte of R = 1; ~150-180 registers, one
// block per SM), except for the 4-bit view when one block per SM would
// leave more than a tenth of the SMs idle (14336x4096: 448 row tiles, 4 per
// block, 112 blocks): variant 1 (two blocks per SM at 128 registers; 4 bytes
// of spill in the 4-bit view, 312 in the 8-bit view, which stays on 0).
// At n = 16, us: 4096x4096 8-bit 11.3 / 14.2 / 12.3 / 13.3 for variants
// 0-3, 4-bit 8.0 / 9.8 / 7.9 / 9.5; 14336x4096 8-bit 35.7 / 36.7 / 37.5 /
// 37.3, 4-bit 23.2 / 20.0 / 23.5 / 29.1; 4096x14336 8-bit 32.4 / 44.6 / 33.8
// / 34.4, 4-bit 21.9 / 24.4 / 21.6 / 26.7.
struct Gv2Var {
    int r, st4, st8, minb;
};
constexpr Gv2Var kGv2Vars[] = {{2, 4, 2, 1}, {2, 4, 2, 2}, {2, 6, 3, 1}, {1, 8, 4, 1}};
constexpr int kGv2NVar = (int)(sizeof kGv2Vars / sizeof kGv2Vars[0]);
int g_gemv2_var = -1; // -1: the built-in choice (gemv2_builtin)

// Resident blocks per SM of one decode-kernel instantiation (fn, numbered
// id < kGvIds) on the current device, for the dynamic shared memory of a
// size class (the group sums' area grows with k; classes are powers of two
// of groups per warp, 4 to 256), and the SM count; computed once per
// device, kernel and class. Returns 0 and sets *err on a CUDA error.
constexpr int kGvIds1 = 8 * kGvNVar + 4 * kGv2NVar; // per epilogue (EPI * kGvIds1 + ...)
constexpr int kGvIds = 8 * kGvIds1;                  // 4 epilogues, then with the norm scale (RS: 4 * kGvIds1 + ...)
constexpr int kMaxDev = 64;
// The current device's SM count (cached per device) and its index; 0 and
// *err set on a CUDA error.
int sm_count(int *dev_out, cudaError_t *err) {
    static int cached_sms[kMaxDev];
    int dev = 0, sms = 0;
    if ((*err = cudaGetDevice(&dev)) != cudaSuccess) return 0;
    *dev_out = dev;
    if (dev >= 0 && dev < kMaxDev && cached_sms[dev] > 0) return cached_sms[dev];
    if ((*err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return 0;
    if (sms < 1) sms = 1;
    if (dev >= 0 && dev < kMaxDev) cached_sms[dev] = sms;
    return sms;
}

int gemv_per_sm(const void *fn, int id, size_t max_smem, int cls, size_t smem, int *sms_out,
                cudaError_t *err) {
    constexpr int kClasses = 7;
    static int cached[kMaxDev][kGvIds][kClasses];
    int dev = 0;
    const int sms = sm_count(&dev, err);
    if (*err != cudaSuccess) return 0;
    *sms_out = sms;
    const bool slot = dev >= 0 && dev < kMaxDev && cls >= 0 && cls < kClasses && id >= 0 &&
                      id < kGvIds;
    if (slot && cached[dev][id][cls] > 0) return cached[dev][id][cls];
    // NOTE: the limit is raised to the largest class's size, never to this
    // call's: it is one attribute per function, so setting it per class
    // would lower it under a larger class already cached (its launches would
    // then fail).
    *err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)max_smem);
    int per_sm = 0;
    if (*err == cudaSuccess)
        *err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kThreads, smem);
    if (*err != cudaSuccess) return 0;
    if (per_sm < 1) per_sm = 1;
    if (slot) cached[dev][id][cls] = per_sm;
    return per_sm;
}

// One decode-kernel instantiation (numbered id < kGvIds for gemv_per_sm).
// X1: n == 1 (the fold skips the unused x rows; the same bits for row 0).
template <typename XT, bool LOWER, int ST, int MINB, int NS, bool X1, int R, int NX, int EPI, bool RS = false>
cudaError_t launch_gemv_k(const WqParams &p, int id, cudaStream_t stream) {
    id += EPI * kGvIds1 + (RS ? 4 * kGvIds1 : 0);
    // Size classes up to k = 256k (NX = 1) or 64k (NX = 2: twice the group
    // sums per group, and a larger static reduction area); see the k limits
    // in wq_dispatch.
    constexpr int kClasses = NX == 1 ? 7 : 5;
    const int ng = p.k / kGroup;
    int cw_max = 4, cls = 0;  // the size class: cw_max rounded up to 4 * 2^cls
    while (cw_max < (ng + kWarps - 1) / kWarps) {
        cw_max *= 2;
        cls++;
    }
    const size_t smem = gv_smem_bytes<LOWER, ST, R, NX>(cw_max);
    constexpr auto kern = wq_gemv_kernel<XT, LOWER, ST, MINB, NS, X1, R, NX, EPI, RS>;
    const void *fn = reinterpret_cast<const void *>(kern);
    cudaError_t err;
    int sms = 1;
    const int per_sm = gemv_per_sm(fn, id, gv_smem_bytes<LOWER, ST, R, NX>(4 << (kClasses - 1)), cls,
                                   smem, &sms, &err);
    if (err != cudaSuccess) return err;
    // NOTE: every resident slot (2 blocks per SM). One per SM leaves the
    // other for the next launch's blocks to start their weight stream early
    // under PDL, but each block then walks twice the tiles with half the
    // warps; it measured slower (4096x4096 4-bit 8.3 vs 6.7 us, 4096x14336
    // 24.1 vs 17.6 us; docs/benchmarks.md, session 11).
    const int bps = g_gemv_bps > 0 && g_gemv_bps < per_sm ? g_gemv_bps : per_sm;
    const int resident = bps * sms;
    const int ntiles = ((p.m + 15) / 16 + R - 1) / R;
    const int per_block = (ntiles + resident - 1) / resident;
    const unsigned grid = (unsigned)((ntiles + per_block - 1) / per_block);
    if (EPI == kEpiRes && grid > (unsigned)kPart) return cudaErrorInvalidConfiguration; // checked by the caller
    return nb_pdl::launch(kern, dim3(grid), dim3(kThreads), smem, stream, pdl_on(),
                          static_cast<const WqPN<EPI, RS> &>(p), ntiles, cw_max);
}

template <typename XT, bool LOWER, int V, bool X1, int EPI, bool RS = false>
cudaError_t launch_gemv_v(const WqParams &p, cudaStream_t stream) {
    constexpr GvVar v = kGvVars[V];
    const int id = V * 8 + (X1 ? 4 : 0) + (LOWER ? 2 : 0) + (std::is_same<XT, __half>::value ? 0 : 1);
    // the 8-bit view: 8 KB in flight per warp (4 items of 2 KB, or 2 of 4 KB)
    return launch_gemv_k<XT, LOWER, LOWER ? 4 / v.r : v.st, v.minb, v.ns, X1, v.r, 1, EPI, RS>(p, id, stream);
}

template <typename XT, bool LOWER, int V, int EPI, bool RS = false>
cudaError_t launch_gemv2_v(const WqParams &p, cudaStream_t stream) {
    constexpr Gv2Var v = kGv2Vars[V];
    const int id = 8 * kGvNVar + V * 4 + (LOWER ? 2 : 0) + (std::is_same<XT, __half>::value ? 0 : 1);
    return launch_gemv_k<XT, LOWER, LOWER ? v.st8 : v.st4, v.minb, 1, false, v.r, 2, EPI, RS>(p, id, stream);
}

// Does a grid of one block per SM, each walking whole 32-row tiles, keep
// at least 90% of the SMs busy for m weight rows?
bool r2_one_per_sm_fills(int m, cudaError_t *err) {
    int dev = 0;
    const int sms = sm_count(&dev, err);
    if (*err != cudaSuccess) return false;
    const long rt = ((m + 15) / 16 + 1) / 2, per_block = (rt + sms - 1) / sms;
    const long grid = (rt + per_block - 1) / per_block;
    return grid * 10 >= (long)sms * 9;
}
// The built-in two-x-tile variant (see kGv2Vars): 0, or 1 for the 4-bit
// view when one block per SM would leave > 10% of the SMs idle.
int gemv2_builtin(bool lower, int m, cudaError_t *err) {
    if (lower) return 0;
    const bool fills = r2_one_per_sm_fills(m, err);
    return fills ? 0 : 1;
}
// The built-in variant for n <= 8 with f16 x (see kGvVars; bf16 x takes
// 0). 4-bit view: 32-row items (two 16-row tiles a copy, and half the x
// fragments per weight byte), two blocks per SM (3) when there are at
// least two row tiles per SM, else one block per SM (4) when that keeps
// >= 90% of the SMs busy, else 3. 8-bit view: 3 where one block per SM of
// 32-row tiles would leave > 10% of the SMs idle, else 0. Measured with the
// tensor-copy ring (session 38, H200 and H100, n = 1-8, docs/benchmarks.md):
// us at n = 1 on the H200 against variant 0, 4-bit: 4096x4096 4.59 vs 5.11
// (4), 14336x4096 10.54 vs 12.43 (3), 4096x14336 11.28 vs 12.34 (4), the
// engine's q|k|v 6144x4096 6.15 vs 6.50 (3) and gate|up 28672x4096 19.73
// vs 20.39 (3; 4 was 20.28, and 24.08 vs 21.08 at n = 4; on the H100 4 is
// the faster there at n = 1, 22.28 vs 23.10); 8-bit: 14336x4096 22.96 vs
// 25.26 (3), 6144x4096 12.42 vs 13.44 (3), 4096x14336 22.83 (0) vs 25.78
// (4), 28672x4096 43.56 (0) vs 42.80 (3), where the H100 has 44.34 vs 46.66.
int gemv_builtin(bool lower, bool f16, int m, cudaError_t *err) {
    if (!f16) return 0;
    int dev = 0;
    const int sms = sm_count(&dev, err);
    if (*err != cudaSuccess) return 0;
    const bool fills = r2_one_per_sm_fills(m, err);
    if (lower) return fills ? 0 : 3;
    const long rt = ((m + 15) / 16 + 1) / 2;
    if (rt >= 2L * sms) return 3;
    return fills ? 4 : 3;
}

template <typename XT, bool LOWER, bool X1, int EPI>
cudaError_t launch_gemv_x(const WqParams &p, cudaStream_t stream) {
    cudaError_t err = cudaSuccess;
    const int v =
        g_gemv_var >= 0 ? g_gemv_var : gemv_builtin(LOWER, std::is_same<XT, __half>::value, p.m, &err);
    if (err != cudaSuccess) return err;
    switch (v) {
    case 1: return launch_gemv_v<XT, LOWER, 1, X1, EPI>(p, stream);
    case 2: return launch_gemv_v<XT, LOWER, 2, X1, EPI>(p, stream);
    case 3: return launch_gemv_v<XT, LOWER, 3, X1, EPI>(p, stream);
    case 4: return launch_gemv_v<XT, LOWER, 4, X1, EPI>(p, stream);
    default: return launch_gemv_v<XT, LOWER, 0, X1, EPI>(p, stream);
    }
}

// The residual epilogue's (EPI kEpiRes) and the norm-scaled epilogues' (RS)
// launches, 4-bit view with f16 x: the built-in variants only (3 or 4 at
// n <= 8, 0 or 1 at 9-16: all 32-row items), or a forced one of those
// (another forced variant takes the built-in one). The same outputs as any
// variant.
template <int EPI, bool RS> cudaError_t launch_gemv_rs(const WqParams &p, cudaStream_t stream) {
    cudaError_t err = cudaSuccess;
    if (p.n > 8) {
        const int v = g_gemv2_var == 0 || g_gemv2_var == 1 ? g_gemv2_var : gemv2_builtin(false, p.m, &err);
        if (err != cudaSuccess) return err;
        return v == 1 ? launch_gemv2_v<__half, false, 1, EPI, RS>(p, stream)
                      : launch_gemv2_v<__half, false, 0, EPI, RS>(p, stream);
    }
    const int v = g_gemv_var == 3 || g_gemv_var == 4 ? g_gemv_var : gemv_builtin(false, true, p.m, &err);
    if (err != cudaSuccess) return err;
    if (v == 4)
        return p.n == 1 ? launch_gemv_v<__half, false, 4, true, EPI, RS>(p, stream)
                        : launch_gemv_v<__half, false, 4, false, EPI, RS>(p, stream);
    return p.n == 1 ? launch_gemv_v<__half, false, 3, true, EPI, RS>(p, stream)
                    : launch_gemv_v<__half, false, 3, false, EPI, RS>(p, stream);
}

template <typename XT, bool LOWER, int EPI = kEpiPlain> cudaError_t launch_gemv(const WqParams &p, cudaStream_t stream) {
    if (p.n > 8) {
        cudaError_t err = cudaSuccess;
        const int v = g_gemv2_var >= 0 ? g_gemv2_var : gemv2_builtin(LOWER, p.m, &err);
        if (err != cudaSuccess) return err;
        switch (v) {
        case 1: return launch_gemv2_v<XT, LOWER, 1, EPI>(p, stream);
        case 2: return launch_gemv2_v<XT, LOWER, 2, EPI>(p, stream);
        case 3: return launch_gemv2_v<XT, LOWER, 3, EPI>(p, stream);
        default: return launch_gemv2_v<XT, LOWER, 0, EPI>(p, stream);
        }
    }
    return p.n == 1 ? launch_gemv_x<XT, LOWER, true, EPI>(p, stream)
                    : launch_gemv_x<XT, LOWER, false, EPI>(p, stream);
}

template <typename XT, int NT, int R, bool LOWER, int EPI>
void launch_mma(const WqParams &p, cudaStream_t stream) {
    const dim3 grid((unsigned)((p.m + R * 16 - 1) / (R * 16)),
                    (unsigned)((p.n + NT * 8 - 1) / (NT * 8)));
    wq_mma_kernel<XT, NT, R, LOWER, NT == 1 ? 4 : 2, EPI><<<grid, kThreads, 0, stream>>>(
        static_cast<const WqP<EPI> &>(p));
}

template <typename XT, int NT, int R, int EPI>
void launch_mma_v(const WqParams &p, bool lower, cudaStream_t stream) {
    if constexpr (EPI != kEpiPlain) // the epilogues: the 4-bit view only
        launch_mma<XT, NT, R, false, EPI>(p, stream);
    else if (lower)
        launch_mma<XT, NT, R, true, kEpiPlain>(p, stream);
    else
        launch_mma<XT, NT, R, false, kEpiPlain>(p, stream);
}

template <typename XT, int EPI = kEpiPlain>
void launch_mma_x(const WqParams &p, bool lower, int nt, int r, cudaStream_t stream) {
    if (nt == 1 && r == 1) launch_mma_v<XT, 1, 1, EPI>(p, lower, stream);
    if (nt == 1 && r == 2) launch_mma_v<XT, 1, 2, EPI>(p, lower, stream);
    if (nt == 2 && r == 1) launch_mma_v<XT, 2, 1, EPI>(p, lower, stream);
    if (nt == 2 && r == 2) launch_mma_v<XT, 2, 2, EPI>(p, lower, stream);
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

bool io_dtype_ok(nb_dtype t) {
    return t == NB_DTYPE_F32 || t == NB_DTYPE_F16 || t == NB_DTYPE_BF16;
}

int g_tile_rows = 0;  // 0: heuristic; see nb_cuda_matmul_wq_set_tile_rows

#include "linear_dense_ri.cuh"

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

extern "C" void nb_cuda_matmul_wq_set_pdl(int on) { g_pdl = on < 0 ? -1 : on != 0; }

extern "C" void nb_cuda_matmul_wq_set_decode_kernel(int on) { g_gemv = on < 0 ? -1 : on != 0; }

extern "C" size_t nb_cuda_wq_plane_bytes(int m, int k) {
    if (m < 0 || nb_wq_group_size(k) == 0) return 0;
    return (size_t)((m + 31) / 32) * 32 * (size_t)(k / 2);
}

extern "C" nb_status nb_cuda_wq_pack_plane(uint8_t *dst, const uint8_t *src, int m, int k) {
    const int gs = nb_wq_group_size(k);
    if (m < 0 || gs == 0 || (m > 0 && (!dst || !src))) return NB_ERR_INVALID_ARG;
    const size_t bytes = nb_cuda_wq_plane_bytes(m, k), rb = (size_t)k / 2, gb = (size_t)gs / 2;
    if (dst < src + (size_t)m * rb && src < dst + bytes) return NB_ERR_INVALID_ARG;
    const int ng = k / gs, rows = (m + 31) / 32 * 32;
    for (int j = 0; j < rows; j++)
        for (int gi = 0; gi < ng; gi++) {
            uint8_t *o = dst + nb_cuda_wq_plane_off(j, gi, 0, ng, gs / 2);
            if (j >= m) {
                memset(o, 0, gb);
                continue;
            }
            const uint8_t *in = src + (size_t)j * rb + (size_t)gi * gb;
            for (size_t w = 0; w < gb; w += 4) {
                const uint32_t q = (uint32_t)in[w] | (uint32_t)in[w + 1] << 8 | (uint32_t)in[w + 2] << 16 |
                                   (uint32_t)in[w + 3] << 24;
                // Nibbles 0, 2, 5, 7 stay; 1 <-> 4 and 3 <-> 6 trade places.
                const uint32_t v = (q & 0xf0f00f0fu) | ((q & 0x0000f0f0u) << 12) | ((q >> 12) & 0x0000f0f0u);
                o[w] = (uint8_t)v;
                o[w + 1] = (uint8_t)(v >> 8);
                o[w + 2] = (uint8_t)(v >> 16);
                o[w + 3] = (uint8_t)(v >> 24);
            }
        }
    return NB_OK;
}

extern "C" size_t nb_cuda_wq_sz_elems(int m, int k) {
    const int gs = nb_wq_group_size(k);
    if (m < 0 || gs == 0) return 0;
    return (size_t)((m + 31) / 32) * (size_t)(k / gs) * 64;
}

extern "C" nb_status nb_cuda_wq_pack_sz(uint16_t *sz, const uint16_t *scale, const uint16_t *zero,
                                        int m, int k) {
    const int gs = nb_wq_group_size(k);
    if (m < 0 || gs == 0 || (m > 0 && (!sz || !scale || !zero))) return NB_ERR_INVALID_ARG;
    const int ng = k / gs, tiles = (m + 31) / 32 * 2;  // 16-row halves of the 32-row tiles
    for (int tl = 0; tl < tiles; tl++)
        for (int gi = 0; gi < ng; gi++) {
            uint16_t *c = sz + nb_cuda_wq_sz_off(tl, gi, ng);
            for (int rt = 0; rt < 16; rt++) {
                const int j = tl * 16 + rt;
                const size_t e = (size_t)j * ng + gi;
                c[nb_cuda_wq_sz_slot(rt, 0)] = j < m ? scale[e] : 0;
                c[nb_cuda_wq_sz_slot(rt, 1)] = j < m ? zero[e] : 0;
            }
        }
    return NB_OK;
}

extern "C" void nb_cuda_matmul_wq_set_blocks_per_sm(int bps) { g_gemv_bps = bps > 0 ? bps : 0; }

extern "C" int nb_cuda_matmul_wq_set_gemv_variant(int v) {
    g_gemv_var = v >= 0 && v < kGvNVar ? v : -1;
    return kGvNVar;
}

extern "C" int nb_cuda_matmul_wq_set_gemv16_variant(int v) {
    g_gemv2_var = v >= 0 && v < kGv2NVar ? v : -1;
    return kGv2NVar;
}

namespace {
// The parameters of one call (arguments checked), no epilogue.
WqParams wq_params(void *out, nb_dtype out_dt, const void *x, const nb_cuda_wq *w, bool use_lower,
                   const void *bias, nb_dtype bias_dt, int n, int m, int k) {
    WqParams p;
    p.out = out;
    p.x = x;
    p.upper = w->upper;
    p.lower = use_lower ? w->lower : nullptr;
    p.sz = w->sz;
    p.bias = bias;
    p.out_dt = (int)out_dt;
    p.bias_dt = (int)bias_dt;
    p.n = n;
    p.m = m;
    p.k = k;
    p.trace_seq = -1;
#ifdef NB_WQ_TRACE
    for (int i = 0; i < kTrL; i++)
        if (nb_wq_trace_outs[i] == out) p.trace_seq = i;
#endif
    p.epi = kEpiPlain;
    p.sat = 0;
    return p;
}

// The launch of one nb_cuda_matmul_wq / _swiglu call (arguments checked):
// the decode kernel, the tile kernel or the scalar kernel (not for the
// SwiGLU epilogue, whose callers check nb_cuda_matmul_wq_swiglu_supported).
nb_status wq_dispatch(WqParams &p, nb_dtype x_dt, bool use_lower, int gs, cudaStream_t stream) {
    const void *x = p.x;
    const int n = p.n, m = p.m, k = p.k;
    const nb_cuda_wq wv = {p.upper, p.lower, p.sz}, *w = &wv;
    const bool fast = gs == kGroup && aligned16(x) && aligned16(w->upper) &&
                      (!use_lower || aligned16(w->lower)) && ((uintptr_t)w->sz & 7u) == 0;
    const bool sz16 = aligned16(w->sz);  // the decode kernel copies an item's sz in 16-byte parts
    // NOTE: k <= 256k (n <= 8) and 64k (9..16) keep the decode kernel's
    // shared memory (the group sums grow with k) inside the limit; no model
    // comes near them.
    // NOTE: the 8-bit view of a matrix of <= 16M weights is faster on the
    // tile kernel (4096 x 4096 on an H100: 10.1 vs 11.8 us), larger ones on
    // the decode kernel (14336 x 4096: 28.4 vs 31.7 us); docs/benchmarks.md.
    // The choice depends on the matrix only, never on n <= 8 rows.
    const bool decode_kernel = !use_lower || n > 8 || (size_t)m * k > ((size_t)16 << 20) || g_gemv_var >= 0;
    if (p.epi != kEpiPlain && (use_lower || x_dt != NB_DTYPE_F16 || !fast)) return NB_ERR_UNSUPPORTED;
    if (fast && n <= 16 && k <= (n <= 8 ? 262144 : 65536) && decode_kernel && sz16 && gemv_on()) {
        if (p.epi != kEpiPlain)
            return (p.epi == kEpiSwiglu ? launch_gemv<__half, false, kEpiSwiglu>(p, stream)
                                        : launch_gemv<__half, false, kEpiRope>(p, stream)) == cudaSuccess
                       ? NB_OK
                       : NB_ERR_BACKEND;
        const cudaError_t e = x_dt == NB_DTYPE_F16
                                  ? (use_lower ? launch_gemv<__half, true>(p, stream)
                                               : launch_gemv<__half, false>(p, stream))
                                  : (use_lower ? launch_gemv<__nv_bfloat16, true>(p, stream)
                                               : launch_gemv<__nv_bfloat16, false>(p, stream));
        return e == cudaSuccess ? NB_OK : NB_ERR_BACKEND;
    }
    if (fast) {
        const int nt = n <= 8 ? 1 : 2;
        // NOTE: 32-row blocks halve the activation traffic per weight byte
        // but halve the block count. The 8-bit view keeps 16 rows (n = 16 on
        // an H100: 14336x4096 45.5 vs 54.3 us, no gain elsewhere); the 4-bit
        // view with f16 x, whose second accumulator set (kMaskU4) costs
        // registers and so resident blocks, takes 32 (n = 16: 4096x4096 9.7
        // vs 11.3 us, 4096x14336 27.6 vs 34.0; docs/benchmarks.md, session
        // 17). The choice depends on n > 8 and the view only, and 16- and
        // 32-row tiles compute a row the same way.
        int r = !use_lower && x_dt == NB_DTYPE_F16 && nt == 2 ? 2 : 1;
        if (g_tile_rows) r = g_tile_rows / 16;
        if (p.epi == kEpiSwiglu)
            launch_mma_x<__half, kEpiSwiglu>(p, false, nt, r, stream);
        else if (p.epi == kEpiRope)
            launch_mma_x<__half, kEpiRope>(p, false, nt, r, stream);
        else if (x_dt == NB_DTYPE_F16)
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
} // namespace

extern "C" nb_status nb_cuda_matmul_wq(void *out, nb_dtype out_dt, const void *x, nb_dtype x_dt,
                                       const nb_cuda_wq *w, int use_lower, const void *bias,
                                       nb_dtype bias_dt, int n, int m, int k, void *workspace,
                                       size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace;
    (void)workspace_bytes;
    const int gs = nb_wq_group_size(k);
    if (n < 0 || m < 0 || gs == 0 || !w) return NB_ERR_INVALID_ARG;
    if (x_dt != NB_DTYPE_F16 && x_dt != NB_DTYPE_BF16) return NB_ERR_INVALID_ARG;
    if (!io_dtype_ok(out_dt) || (bias && !io_dtype_ok(bias_dt))) return NB_ERR_INVALID_ARG;
    if (n == 0 || m == 0) return NB_OK;
    if (!out || !x || !w->upper || !w->sz || (use_lower && !w->lower)) return NB_ERR_INVALID_ARG;
    WqParams p = wq_params(out, out_dt, x, w, use_lower != 0, bias, bias_dt, n, m, k);
    return wq_dispatch(p, x_dt, use_lower != 0, gs, stream);
}

extern "C" int nb_cuda_matmul_wq_swiglu_supported(int m, int k) {
    return m > 0 && m % 16 == 0 && nb_wq_group_size(k) == kGroup;
}

namespace {
nb_status launch_rs_or(WqParams &p, nb_dtype x_dt, bool use_lower, const float *part, float eps, cudaStream_t stream);
nb_status swiglu_impl(void *out, nb_dtype out_dt, int sat, const void *x, nb_dtype x_dt, const nb_cuda_wq *w,
                      int use_lower, int n, int m, int k, const float *part, float eps, cudaStream_t stream);
nb_status rope_impl(const void *x, nb_dtype x_dt, const nb_cuda_wq *w, int use_lower, int n, int m, int k,
                    const nb_cuda_wq_rope *r, const float *part, float eps, cudaStream_t stream);
} // namespace

extern "C" nb_status nb_cuda_matmul_wq_swiglu(void *out, nb_dtype out_dt, int sat, const void *x, nb_dtype x_dt,
                                              const nb_cuda_wq *w, int use_lower, int n, int m, int k,
                                              cudaStream_t stream) {
    return swiglu_impl(out, out_dt, sat, x, x_dt, w, use_lower, n, m, k, nullptr, 0.0f, stream);
}

extern "C" nb_status nb_cuda_matmul_wq_swiglu_rs(void *out, nb_dtype out_dt, int sat, const void *x, nb_dtype x_dt,
                                                 const nb_cuda_wq *w, int n, int m, int k, const float *part,
                                                 float eps, cudaStream_t stream) {
    if (!part) return NB_ERR_INVALID_ARG;
    return swiglu_impl(out, out_dt, sat, x, x_dt, w, 0, n, m, k, part, eps, stream);
}

namespace {
nb_status swiglu_impl(void *out, nb_dtype out_dt, int sat, const void *x, nb_dtype x_dt, const nb_cuda_wq *w,
                      int use_lower, int n, int m, int k, const float *part, float eps, cudaStream_t stream) {
    if (n < 0 || m < 0 || !w || nb_wq_group_size(k) == 0) return NB_ERR_INVALID_ARG;
    if (x_dt != NB_DTYPE_F16 && x_dt != NB_DTYPE_BF16) return NB_ERR_INVALID_ARG;
    if (!io_dtype_ok(out_dt) || (sat && out_dt != NB_DTYPE_F16)) return NB_ERR_INVALID_ARG;
    if (n == 0 || m == 0) return NB_OK;
    if (!out || !x || !w->upper || !w->sz || (use_lower && !w->lower)) return NB_ERR_INVALID_ARG;
    // NOTE: blocks store while others still read x: out must not overlap it.
    const uintptr_t o0 = (uintptr_t)out, o1 = o0 + (size_t)n * (m / 2) * nb_dtype_size(out_dt);
    const uintptr_t x0 = (uintptr_t)x, x1 = x0 + (size_t)n * k * nb_dtype_size(x_dt);
    if (o0 < x1 && x0 < o1) return NB_ERR_INVALID_ARG;
    if (!nb_cuda_matmul_wq_swiglu_supported(m, k) || !aligned16(x) || !aligned16(w->upper) ||
        (use_lower && !aligned16(w->lower)) || ((uintptr_t)w->sz & 7u) != 0)
        return NB_ERR_UNSUPPORTED;
    WqRsParams<kEpiSwiglu> p;
    static_cast<WqParams &>(p) = wq_params(out, out_dt, x, w, use_lower != 0, nullptr, NB_DTYPE_F32, n, m, k);
    p.epi = kEpiSwiglu;
    p.sat = sat != 0;
    return launch_rs_or(p, x_dt, use_lower != 0, part, eps, stream);
}
} // namespace

extern "C" int nb_cuda_matmul_wq_rope_supported(int m, int k, int n_heads, int n_kv_heads, int D) {
    return n_heads > 0 && n_kv_heads > 0 && D > 0 && D % 16 == 0 && m == (n_heads + 2 * n_kv_heads) * D &&
           nb_wq_group_size(k) == kGroup;
}

extern "C" nb_status nb_cuda_matmul_wq_rope(const void *x, nb_dtype x_dt, const nb_cuda_wq *w, int use_lower,
                                            int n, int m, int k, const nb_cuda_wq_rope *r, cudaStream_t stream) {
    return rope_impl(x, x_dt, w, use_lower, n, m, k, r, nullptr, 0.0f, stream);
}

extern "C" nb_status nb_cuda_matmul_wq_rope_rs(const void *x, nb_dtype x_dt, const nb_cuda_wq *w, int n, int m, int k,
                                               const nb_cuda_wq_rope *r, const float *part, float eps,
                                               cudaStream_t stream) {
    if (!part) return NB_ERR_INVALID_ARG;
    return rope_impl(x, x_dt, w, 0, n, m, k, r, part, eps, stream);
}

namespace {
nb_status rope_impl(const void *x, nb_dtype x_dt, const nb_cuda_wq *w, int use_lower, int n, int m, int k,
                    const nb_cuda_wq_rope *r, const float *part, float eps, cudaStream_t stream) {
    if (n < 0 || m < 0 || !w || !r || nb_wq_group_size(k) == 0) return NB_ERR_INVALID_ARG;
    if (x_dt != NB_DTYPE_F16 && x_dt != NB_DTYPE_BF16) return NB_ERR_INVALID_ARG;
    const nb_kv_layout &L = r->lay;
    const int D = L.head_dim;
    if (r->n_heads < 1 || L.n_kv_heads < 1 || D < 2 || m != (r->n_heads + 2 * L.n_kv_heads) * D ||
        !nb_kv_layout_valid(&L) || r->layer < 0 || r->layer >= L.n_layers)
        return NB_ERR_INVALID_ARG;
    if (n == 0 || m == 0) return NB_OK;
    if (!x || !w->upper || !w->sz || (use_lower && !w->lower) || !r->q_out || !r->cs || !r->fp || !r->fpblock ||
        !r->slot || ((uintptr_t)r->cs & 7u) != 0)
        return NB_ERR_INVALID_ARG;
    // NOTE: blocks store while others still read x: q_out must not overlap it.
    const uintptr_t o0 = (uintptr_t)r->q_out, o1 = o0 + (size_t)n * r->n_heads * D * sizeof(float);
    const uintptr_t x0 = (uintptr_t)x, x1 = x0 + (size_t)n * k * nb_dtype_size(x_dt);
    if (o0 < x1 && x0 < o1) return NB_ERR_INVALID_ARG;
    if (!nb_cuda_matmul_wq_rope_supported(m, k, r->n_heads, L.n_kv_heads, D) || !aligned16(x) ||
        !aligned16(w->upper) || (use_lower && !aligned16(w->lower)) || ((uintptr_t)w->sz & 7u) != 0)
        return NB_ERR_UNSUPPORTED;
    WqRsParams<kEpiRope> p;
    static_cast<WqParams &>(p) = wq_params(r->q_out, NB_DTYPE_F32, x, w, use_lower != 0, nullptr, NB_DTYPE_F32, n, m, k);
    p.epi = kEpiRope; // wq_dispatch passes p on as the WqRopeParams it is
    p.rope = *r;
    return launch_rs_or(p, x_dt, use_lower != 0, part, eps, stream);
}

// Without part: wq_dispatch (p, a WqRsParams, passed on as its base). With
// it: the norm-scaled decode kernel (launch_gemv_rs), where the fast path's
// conditions hold; else NB_ERR_UNSUPPORTED, nothing launched.
nb_status launch_rs_or(WqParams &p, nb_dtype x_dt, bool use_lower, const float *part, float eps, cudaStream_t stream) {
    if (!part) return wq_dispatch(p, x_dt, use_lower, kGroup, stream);
    if (p.n > 16 || use_lower || x_dt != NB_DTYPE_F16 || !aligned16(p.x) || !aligned16(p.upper) ||
        !aligned16(p.sz) || !gemv_on())
        return NB_ERR_UNSUPPORTED;
    if (p.n == 0 || p.m == 0) return NB_OK;
    cudaError_t e;
    if (p.epi == kEpiSwiglu) {
        auto &q = static_cast<WqRsParams<kEpiSwiglu> &>(p);
        q.part = part;
        q.eps = eps;
        e = launch_gemv_rs<kEpiSwiglu, true>(q, stream);
    } else {
        auto &q = static_cast<WqRsParams<kEpiRope> &>(p);
        q.part = part;
        q.eps = eps;
        e = launch_gemv_rs<kEpiRope, true>(q, stream);
    }
    return e == cudaSuccess ? NB_OK : NB_ERR_BACKEND;
}
} // namespace

extern "C" nb_status nb_cuda_matmul_wq_res(const void *x, nb_dtype x_dt, const nb_cuda_wq *w, const void *bias,
                                           nb_dtype bias_dt, int n, int m, int k, const nb_cuda_wq_res *res,
                                           cudaStream_t stream) {
    const int gs = nb_wq_group_size(k);
    if (n < 0 || m < 0 || gs == 0 || !w || !res) return NB_ERR_INVALID_ARG;
    if (x_dt != NB_DTYPE_F16 && x_dt != NB_DTYPE_BF16) return NB_ERR_INVALID_ARG;
    if (bias && !io_dtype_ok(bias_dt)) return NB_ERR_INVALID_ARG;
    if (res->w_dt != NB_DTYPE_F32 && res->w_dt != NB_DTYPE_F16 && res->w_dt != NB_DTYPE_BF16) return NB_ERR_INVALID_ARG;
    if (n == 0 || m == 0) return NB_OK;
    if (!x || !w->upper || !w->sz || !res->x || !res->w || !res->xs || !res->part) return NB_ERR_INVALID_ARG;
    if (n > 16) return NB_ERR_UNSUPPORTED; // before the overlaps, which n sizes
    // NOTE: blocks store while others still read x: nothing stored may overlap it.
    const size_t xb = (size_t)n * k * nb_dtype_size(x_dt), hb = (size_t)n * m * 4, sb = (size_t)n * m * 2,
                 pb = (size_t)n * kPart * 4;
    const uintptr_t a[4] = {(uintptr_t)x, (uintptr_t)res->x, (uintptr_t)res->xs, (uintptr_t)res->part};
    const size_t len[4] = {xb, hb, sb, pb};
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            if (a[i] < a[j] + len[j] && a[j] < a[i] + len[i]) return NB_ERR_INVALID_ARG;
    if (n > 16 || x_dt != NB_DTYPE_F16 || gs != kGroup || !aligned16(x) || !aligned16(w->upper) || !aligned16(w->sz) ||
        !gemv_on())
        return NB_ERR_UNSUPPORTED;
    WqResParams p;
    static_cast<WqParams &>(p) = wq_params(nullptr, NB_DTYPE_F32, x, w, false, bias, bias_dt, n, m, k);
    p.epi = kEpiRes;
    p.res = *res;
    const cudaError_t e = launch_gemv_rs<kEpiRes, false>(p, stream);
    if (e == cudaErrorInvalidConfiguration) return NB_ERR_UNSUPPORTED; // more blocks than partial sums
    return e == cudaSuccess ? NB_OK : NB_ERR_BACKEND;
}

extern "C" nb_status nb_cuda_wq_dequantize(void *out, nb_dtype dt, const nb_cuda_wq *w,
                                           int use_lower, int m, int k, cudaStream_t stream) {
    const int gs = nb_wq_group_size(k);
    if (m < 0 || gs == 0 || !w || (dt != NB_DTYPE_F16 && dt != NB_DTYPE_BF16))
        return NB_ERR_INVALID_ARG;
    if (m == 0) return NB_OK;
    if (!out || !w->upper || !w->sz || (use_lower && !w->lower)) return NB_ERR_INVALID_ARG;
    const size_t bytes = (size_t)m * k / 2;
    const unsigned blocks = (unsigned)((bytes + 255) / 256);
    const uint8_t *lo = use_lower ? w->lower : nullptr;
    if (dt == NB_DTYPE_F16)
        wq_dequant_kernel<__half><<<blocks, 256, 0, stream>>>(static_cast<__half *>(out), w->upper,
                                                              lo, w->sz, m, k, gs);
    else
        wq_dequant_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(
            static_cast<__nv_bfloat16 *>(out), w->upper, lo, w->sz, m, k, gs);
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

extern "C" size_t nb_cuda_matmul_dense_ri_workspace_bytes(int n, int m, int k) {
    if (n <= 0 || m <= 0 || k <= 0 || k % kDrBK) return 0;
    cudaError_t err;
    int dev = 0;
    const int sms = sm_count(&dev, &err);
    if (err != cudaSuccess) return 0;
    const int S = dr_split(m, k, sms);
    if (S == 1) return 0;
    return (size_t)S * n * m * sizeof(float);
}

extern "C" void nb_cuda_matmul_dense_ri_set_split(int s) { g_dr_split = s > 0 ? s : 0; }

extern "C" int nb_cuda_matmul_dense_ri_split(int m, int k) {
    if (m <= 0 || k <= 0 || k % kDrBK) return 0;
    cudaError_t err;
    int dev = 0;
    const int sms = sm_count(&dev, &err);
    return err != cudaSuccess ? 0 : dr_split(m, k, sms);
}

extern "C" int nb_cuda_matmul_dense_ri_supported(nb_dtype dt, int k) {
    return (dt == NB_DTYPE_F16 || dt == NB_DTYPE_BF16) && k > 0 && k % kDrBK == 0;
}

// The launch shared by nb_cuda_matmul_dense_ri and its SwiGLU and RoPE
// forms (epi; rope: the RoPE form's stores): arguments checked by the
// caller but for the workspace (the RoPE form's partial sums: S >= 1).
// rs_part (the _rs forms; else NULL): x's rows' partial sums of squares;
// res (the residual form, epi kDrRope's matmul; else NULL).
static nb_status dense_ri_run(void *out, nb_dtype out_dt, bool sat, const void *x, const void *w, nb_dtype dt,
                              const void *bias, nb_dtype bias_dt, int n, int m, int k, void *workspace,
                              size_t workspace_bytes, int epi, const nb_cuda_wq_rope *rope, cudaStream_t stream,
                              const float *rs_part = nullptr, float eps = 0.0f, const nb_cuda_dr_res *res = nullptr) {
    cudaError_t err;
    int dev = 0;
    const int sms = sm_count(&dev, &err);
    if (err != cudaSuccess) return NB_ERR_BACKEND;
    DrParams p = {};
    p.out = out;
    p.x = x;
    p.w = w;
    p.bias = bias;
    p.out_dt = (int)out_dt;
    p.bias_dt = (int)bias_dt;
    p.sat = sat;
    p.n = n;
    p.m = m;
    p.k = k;
    p.S = dr_split(m, k, sms);
    p.tiles = (m + kDrBM - 1) / kDrBM;
    p.rs_part = rs_part;
    p.rs_eps = eps;
    p.rs_np = nb_cuda_dr_parts(k);
    if (p.S > 1 || epi == kDrRope) {
        if (!workspace || ((uintptr_t)workspace & 15) || workspace_bytes < (size_t)p.S * n * m * sizeof(float))
            return NB_ERR_INVALID_ARG;
        p.part = static_cast<float *>(workspace);
    }
    const bool h = dt == NB_DTYPE_F16;
    if (epi == kDrSwiglu && rs_part && p.S == 1)
        err = h ? launch_dense_ri<__half, kDrSwiglu, true>(p, nullptr, stream)
                : launch_dense_ri<__nv_bfloat16, kDrSwiglu, true>(p, nullptr, stream);
    else if (epi == kDrSwiglu)
        err = h ? launch_dense_ri<__half, kDrSwiglu>(p, nullptr, stream)
                : launch_dense_ri<__nv_bfloat16, kDrSwiglu>(p, nullptr, stream);
    else if (epi == kDrRope)
        err = h ? launch_dense_ri<__half, kDrRope>(p, rope, stream, res)
                : launch_dense_ri<__nv_bfloat16, kDrRope>(p, rope, stream, res);
    else
        err = h ? launch_dense_ri<__half>(p, nullptr, stream) : launch_dense_ri<__nv_bfloat16>(p, nullptr, stream);
    return err == cudaSuccess ? NB_OK : NB_ERR_BACKEND;
}

extern "C" nb_status nb_cuda_matmul_dense_ri(void *out, nb_dtype out_dt, const void *x,
                                             const void *w, nb_dtype dt, const void *bias,
                                             nb_dtype bias_dt, int n, int m, int k,
                                             void *workspace, size_t workspace_bytes,
                                             cudaStream_t stream) {
    if (n < 0 || m < 0 || !nb_cuda_matmul_dense_ri_supported(dt, k) || !io_dtype_ok(out_dt) ||
        (bias && !io_dtype_ok(bias_dt)))
        return NB_ERR_INVALID_ARG;
    if (n == 0 || m == 0) return NB_OK;
    if (!out || !x || !w || ((uintptr_t)x & 15) || ((uintptr_t)w & 15)) return NB_ERR_INVALID_ARG;
    return dense_ri_run(out, out_dt, false, x, w, dt, bias, bias_dt, n, m, k, workspace, workspace_bytes, kDrPlain,
                        nullptr, stream);
}

// The SwiGLU form, with (part) or without the norm scale.
static nb_status dense_swiglu(void *out, nb_dtype out_dt, int sat, const void *x, const void *w, nb_dtype dt, int n,
                              int m, int k, void *workspace, size_t workspace_bytes, const float *part, float eps,
                              cudaStream_t stream) {
    if (n < 0 || m < 0 || m % 16 || !nb_cuda_matmul_dense_ri_supported(dt, k) || !io_dtype_ok(out_dt) ||
        (sat && out_dt != NB_DTYPE_F16))
        return NB_ERR_INVALID_ARG;
    if (n == 0 || m == 0) return NB_OK;
    if (!out || !x || !w || ((uintptr_t)x & 15) || ((uintptr_t)w & 15)) return NB_ERR_INVALID_ARG;
    // NOTE: blocks store while others still read x: out must not overlap it.
    const uintptr_t o0 = (uintptr_t)out, o1 = o0 + (size_t)n * (m / 2) * nb_dtype_size(out_dt);
    const uintptr_t x0 = (uintptr_t)x, x1 = x0 + (size_t)n * k * nb_dtype_size(dt);
    if (o0 < x1 && x0 < o1) return NB_ERR_INVALID_ARG;
    return dense_ri_run(out, out_dt, sat != 0, x, w, dt, NULL, NB_DTYPE_F32, n, m, k, workspace, workspace_bytes,
                        kDrSwiglu, nullptr, stream, part, eps);
}

extern "C" nb_status nb_cuda_matmul_dense_ri_swiglu(void *out, nb_dtype out_dt, int sat, const void *x,
                                                    const void *w, nb_dtype dt, int n, int m, int k,
                                                    void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    return dense_swiglu(out, out_dt, sat, x, w, dt, n, m, k, workspace, workspace_bytes, nullptr, 0.0f, stream);
}

extern "C" nb_status nb_cuda_matmul_dense_ri_swiglu_rs(void *out, nb_dtype out_dt, int sat, const void *x,
                                                       const void *w, nb_dtype dt, int n, int m, int k,
                                                       void *workspace, size_t workspace_bytes, const float *part,
                                                       float eps, cudaStream_t stream) {
    if (!part && n > 0 && m > 0) return NB_ERR_INVALID_ARG;
    return dense_swiglu(out, out_dt, sat, x, w, dt, n, m, k, workspace, workspace_bytes, part, eps, stream);
}

extern "C" size_t nb_cuda_matmul_dense_ri_rope_workspace_bytes(int n, int m, int k) {
    const int S = nb_cuda_matmul_dense_ri_split(m, k);
    return n > 0 && m > 0 && S > 0 ? (size_t)S * n * m * sizeof(float) : 0;
}

// The RoPE form, with (part) or without the norm scale.
static nb_status dense_rope(const void *x, const void *w, nb_dtype dt, const void *bias, nb_dtype bias_dt, int n,
                            int m, int k, void *workspace, size_t workspace_bytes, const nb_cuda_wq_rope *r,
                            const float *part, float eps, cudaStream_t stream) {
    if (n < 0 || m < 0 || !r || !nb_cuda_matmul_dense_ri_supported(dt, k) || (bias && !io_dtype_ok(bias_dt)))
        return NB_ERR_INVALID_ARG;
    const nb_kv_layout &L = r->lay;
    const int D = L.head_dim;
    if (r->n_heads < 1 || L.n_kv_heads < 1 || D < 16 || D % 16 || m != (r->n_heads + 2 * L.n_kv_heads) * D ||
        !nb_kv_layout_valid(&L) || r->layer < 0 || r->layer >= L.n_layers)
        return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!x || !w || ((uintptr_t)x & 15) || ((uintptr_t)w & 15) || !r->q_out || !r->cs || !r->fp || !r->fpblock ||
        !r->slot || ((uintptr_t)r->cs & 7u) != 0)
        return NB_ERR_INVALID_ARG;
    // NOTE: the reduction reads the workspace while it stores q: q_out
    // must not overlap it.
    const uintptr_t o0 = (uintptr_t)r->q_out, o1 = o0 + (size_t)n * r->n_heads * D * sizeof(float);
    const uintptr_t w0 = (uintptr_t)workspace, w1 = w0 + workspace_bytes;
    if (workspace && o0 < w1 && w0 < o1) return NB_ERR_INVALID_ARG;
    return dense_ri_run(nullptr, NB_DTYPE_F32, false, x, w, dt, bias, bias_dt, n, m, k, workspace, workspace_bytes,
                        kDrRope, r, stream, part, eps);
}

extern "C" nb_status nb_cuda_matmul_dense_ri_rope(const void *x, const void *w, nb_dtype dt, const void *bias,
                                                  nb_dtype bias_dt, int n, int m, int k, void *workspace,
                                                  size_t workspace_bytes, const nb_cuda_wq_rope *r,
                                                  cudaStream_t stream) {
    return dense_rope(x, w, dt, bias, bias_dt, n, m, k, workspace, workspace_bytes, r, nullptr, 0.0f, stream);
}

extern "C" nb_status nb_cuda_matmul_dense_ri_rope_rs(const void *x, const void *w, nb_dtype dt, const void *bias,
                                                     nb_dtype bias_dt, int n, int m, int k, void *workspace,
                                                     size_t workspace_bytes, const nb_cuda_wq_rope *r,
                                                     const float *part, float eps, cudaStream_t stream) {
    if (!part && n > 0) return NB_ERR_INVALID_ARG;
    return dense_rope(x, w, dt, bias, bias_dt, n, m, k, workspace, workspace_bytes, r, part, eps, stream);
}

extern "C" nb_status nb_cuda_matmul_dense_ri_res(const void *x, const void *w, nb_dtype dt, const void *bias,
                                                 nb_dtype bias_dt, int n, int m, int k, void *workspace,
                                                 size_t workspace_bytes, const nb_cuda_dr_res *res,
                                                 cudaStream_t stream) {
    if (n < 0 || m < 0 || !res || !nb_cuda_matmul_dense_ri_supported(dt, k) || (bias && !io_dtype_ok(bias_dt)) ||
        (res->w_dt != NB_DTYPE_F32 && res->w_dt != NB_DTYPE_F16 && res->w_dt != NB_DTYPE_BF16))
        return NB_ERR_INVALID_ARG;
    if (n == 0 || m == 0) return NB_OK;
    if (!x || !w || ((uintptr_t)x & 15) || ((uintptr_t)w & 15) || !res->x || !res->w || !res->xs || !res->part ||
        ((uintptr_t)res->x & 15) || ((uintptr_t)res->xs & 7))
        return NB_ERR_INVALID_ARG;
    if (m % 4) return NB_ERR_UNSUPPORTED; // the reduction's 4-column threads
    // NOTE: what the reduction stores must not overlap what it or the
    // matmul reads (x, the partial sums) or each other.
    const uintptr_t a[5] = {(uintptr_t)x, (uintptr_t)res->x, (uintptr_t)res->xs, (uintptr_t)res->part,
                            (uintptr_t)workspace};
    const size_t len[5] = {(size_t)n * k * nb_dtype_size(dt), (size_t)n * m * 4, (size_t)n * m * nb_dtype_size(dt),
                           (size_t)n * nb_cuda_dr_parts(m) * 4, workspace ? workspace_bytes : 0};
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            if (a[i] < a[j] + len[j] && a[j] < a[i] + len[i]) return NB_ERR_INVALID_ARG;
    return dense_ri_run(nullptr, NB_DTYPE_F32, false, x, w, dt, bias, bias_dt, n, m, k, workspace, workspace_bytes,
                        kDrRope, nullptr, stream, nullptr, 0.0f, res);
}
