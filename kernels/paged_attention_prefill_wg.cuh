// paged_attention_prefill_wg.cuh: the prefill kernel on Hopper's warpgroup
// MMAs (wgmma) with a producer warpgroup (included by
// paged_attention_cuda.cu inside its anonymous namespace, after
// paged_attention_prefill.cuh, whose tile walk, raw tile and q split it
// shares).
//
// The one idea: pa_prefill_kernel issues mma.sync, whose operands all pass
// through registers: each warp loads every K and V fragment of a tile with
// ldmatrix for its own 16 query vectors, and all its threads stop at a CTA
// barrier every tile to copy and stage. Here
//   - a consumer warpgroup (4 warps) owns 64 query vectors, and the tensor
//     cores read K and V straight from shared memory (wgmma, B operand by
//     descriptor), 64 x 64 scores or 64 x 128 outputs per instruction; the
//     registers hold only q (A operand), the scores and the outputs. Per
//     64-token tile:
//       scores [64 q x 64 tok] = q [64 x 128] . K^T  (8 k-steps: 8 wgmma m64n64k16)
//       out    [64 q x 128 ch] += P [64 x 64 tok] . V (4 wgmma m64n128k16, V N-major)
//   - a producer warpgroup only copies (cp.async; bulk copies for quantized
//     tiles) and stages (quantized tiles dequantized to f16, bf16 -> f16)
//     into a ring of 3 slots, then
//     fence.proxy.async and an arrive on the slot's "full" mbarrier; the
//     two consumer warpgroups wait on "full", compute, and arrive on
//     "empty" (which the producer waits on before refilling the slot). No
//     CTA-wide barrier in the tile loop: the consumers run free, so one's
//     softmax runs under the other's MMAs, and staging under both.
//   - setmaxnreg moves registers from the producer (ps_preg) to the
//     consumers (ps_creg).
// q enters the scores as one f16 (q * scale * log2(e) rounded once, a
// relative error <= 2^-11 per channel, as FlashAttention rounds q; since
// session 52): the ~22-bit hi + lo split of the mma.sync kernels cost half
// again the tensor work of every tile (docs/decisions.md). Builds with
// -DNB_PA_PF_K2 keep hi + lo, for measurement.
// The register layouts of wgmma's A fragments and accumulators per warp are
// mma.m16n8k16's, so the online softmax, the q split (pf_build_a) and the
// epilogue are pa_prefill_kernel's, with 8 score n-tiles instead of 4.
//
// Quantized tiles are dequantized by the producer into f16 values, not
// folded into q and the softmax weights as in the decode kernels and
// pa_prefill_kernel: the folds (q re-split per block, V steps per tile) sat
// on the consumers, who issue the MMAs and the softmax, and cost the INT8
// view ~1.7x the f16 cache's time (session 24); the consumers now run one
// code path for every tile, and the INT8 view's cost is the producer's
// dequantization (docs/decisions.md, session 25). Each value (C - 8) S/16 + Z
// is one f16 fma rounded once (relative error <= 2^-11: an f16 cache holding
// the target view's values).
//
// Quantized tiles' raw planes and scales arrive by bulk copies (one thread,
// seven copies, a tx-count mbarrier per slot) in a ring of their own
// (PS_NR), two tiles ahead; the producer threads meet at a named barrier
// after staging each one, before its raw slot is refilled.
//
// Shared memory tiles (K and V, 64 tokens x 128 channels, f16) are in
// wgmma's 128-byte-swizzle canonical layout: two 8 KB halves of 64 channels;
// in a half, token r's 128-byte row at r * 128, its 16-byte chunk j at
// chunk j ^ (r & 7); 1024-byte aligned. The same bytes serve K as a K-major
// B operand (scores: N = tokens, K = channels; stride between 8-token groups
// 1024 B) and V as an N-major one (out: K = tokens, N = channels; 8-token
// groups 1024 B apart, the channel halves 8192 B). FP tiles are copied
// straight into that layout (bf16: converted in place; f16 rows past the
// sequence zero-filled instead of copied); quantized tiles are copied raw
// (pf_raw) and dequantized into it (pw_codes, pw_deq).
//
// Shapes: as pa_prefill_kernel, and G % 64 == 0 (other group sizes take it).

constexpr int PW_MT = 128;           // query vectors per CTA (two consumer warpgroups)
constexpr int PW_TT = 64;            // tokens per tile
constexpr int PW_TILE = PW_TT * 256; // one f16 [64 tok][128 ch] tile
using PWR = pf_raw<PW_TT>; // a raw quantized tile

// Byte offset of 16-byte chunk j (0..15) of token row r in a swizzled tile.
__device__ __forceinline__ int pw_sw(int r, int j) {
    return ((j >> 3) << 13) + (r << 7) + (((j & 7) ^ (r & 7)) << 4);
}
// wgmma shared-memory descriptor, 128-byte swizzle (PTX ISA "Matrix
// Descriptor Format"): start, leading and stride byte offsets in 16-byte units.
__device__ __forceinline__ uint64_t pw_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
// The raw words of word j (channels 8j..8j+7) of token row r (pf_raw<PW_TT>
// planes): K upper, K lower, V upper, V lower.
__device__ __forceinline__ uint4 pw_raw(const uint8_t *raw, int r, int j) {
    return make_uint4(*(const uint32_t *)(raw + PWR::KU + r * 64 + 4 * j),
                      *(const uint32_t *)(raw + PWR::KL + r * 64 + 4 * j),
                      *(const uint32_t *)(raw + PWR::VU + r * 64 + 4 * j),
                      *(const uint32_t *)(raw + PWR::VL + r * 64 + 4 * j));
}
// Target codes (16U + L, 0..255) of an upper / lower plane word pair,
// channels 8j..8j+7 in order, one byte each: channels 0-3 in c0, 4-7 in c1.
__device__ __forceinline__ void pw_codes(uint32_t u, uint32_t l, uint32_t &c0, uint32_t &c1) {
    const uint32_t e = codes_even(u, l), o = codes_odd(u, l);
    c0 = prmt(e, o, 0x5140);
    c1 = prmt(e, o, 0x7362);
}
// Two f32 as an f16 pair (x low), saturated at +-65504.
__device__ __forceinline__ uint32_t pw_h2(float x, float y) {
    uint32_t r;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(y), "f"(x));
    return r;
}
// A pair of dtype steps S as the f16 pair S/16 (f16: exact but for
// subnormal results, rounded as the f32 route would be).
template <typename T> __device__ __forceinline__ uint32_t pw_step2(uint32_t w) {
    if constexpr (std::is_same<T, __half>::value) {
        return h2u(__hmul2(u2h(w), __float2half2_rn(0.0625f)));
    } else {
        const float2 f = t2_f2<T>(w);
        return pw_h2(f.x * 0.0625f, f.y * 0.0625f);
    }
}
// A pair of dtype values as an f16 pair (bf16: saturated).
template <typename T> __device__ __forceinline__ uint32_t pw_h2pair(uint32_t w) {
    if constexpr (std::is_same<T, __half>::value) {
        return w;
    } else {
        const float2 f = t2_f2<T>(w);
        return pw_h2(f.x, f.y);
    }
}
// Codes in bytes B and B + 1 of w dequantized, (C - 8) * s + z with the f16
// pairs s = S/16 and z = Z: 1024 + C as f16 (the byte under exponent bits
// 0x64), less 1032 (exact), then one fma rounded once to f16, clamped at
// +-65504 as bf16 FP tiles are (a value within f16's range can round past
// it).
template <int B, bool CLAMP> __device__ __forceinline__ uint32_t pw_deq(uint32_t w, uint32_t s, uint32_t z) {
    const uint32_t h = prmt(w, 0x64646464u, B == 0 ? 0x4140 : 0x4342); // bytes B, B + 1 of w under 0x64: 1024 + C
    const __half2 c = __hsub2(u2h(h), __float2half2_rn(1032.0f));
    __half2 v = __hfma2(c, u2h(s), u2h(z));
    if (CLAMP) v = __hmin2(__hmax2(v, __float2half2_rn(-65504.0f)), __float2half2_rn(65504.0f));
    return h2u(v);
}
// K's S/16 and Z of word j's channel pairs (ks, kz: f16 pairs) from the
// 16 bytes of K steps and of K zeros that cover channels 8j..8j+7.
template <typename T>
__device__ __forceinline__ void pw_kscale(uint4 a, uint4 b, uint32_t (&ks)[4], uint32_t (&kz)[4]) {
    const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        ks[i] = pw_step2<T>(aw[i]);
        kz[i] = pw_h2pair<T>(bw[i]);
    }
}
// One token row's word of K and of V (raw: K upper, K lower, V upper, V
// lower words, pw_raw's order) dequantized to 8 f16 values each, with K's
// ks, kz (pw_kscale) and the row's V step | V zero << 16 (rv): what the
// producer stages and pa_stage_kernel writes, from one definition.
template <typename T, bool CLAMP>
__device__ __forceinline__ void pw_deq_word(uint4 raw, const uint32_t (&ks)[4], const uint32_t (&kz)[4], uint32_t rv,
                                            uint4 &wk, uint4 &wv) {
    uint32_t k0, k1, v0, v1;
    pw_codes(raw.x, raw.y, k0, k1);
    pw_codes(raw.z, raw.w, v0, v1);
    // V's S/16 (low half) and Z (high half) of this row, broadcast by the
    // fma's operand selectors.
    const __half2 sv = u2h(pw_step2<T>(rv)), zv = u2h(pw_h2pair<T>(rv));
    const uint32_t s2 = h2u(__low2half2(sv)), z2 = h2u(__high2half2(zv));
    wk = make_uint4(pw_deq<0, CLAMP>(k0, ks[0], kz[0]), pw_deq<2, CLAMP>(k0, ks[1], kz[1]),
                    pw_deq<0, CLAMP>(k1, ks[2], kz[2]), pw_deq<2, CLAMP>(k1, ks[3], kz[3]));
    wv = make_uint4(pw_deq<0, CLAMP>(v0, s2, z2), pw_deq<2, CLAMP>(v0, s2, z2), pw_deq<0, CLAMP>(v1, s2, z2),
                    pw_deq<2, CLAMP>(v1, s2, z2));
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Shared memory written by ordinary stores or cp.async, read next by wgmma.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accesses of wgmma accumulators across the wait.
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
// D [64 x 64] (+)= A [64 x 16] (registers, mma.m16n8k16's A layout per warp)
// . B [16 x 64] (K-major, descriptor); D per warp in mma.m16n8k16's C layout,
// n-tile n at d[4n .. 4n+3].
__device__ __forceinline__ void wg_mma_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
// D [64 x 128] += A [64 x 16] (registers) . B [16 x 128] (N-major,
// descriptor: imm-trans-b = 1); D as above, n-tile n at d[4n .. 4n+3].
__device__ __forceinline__ void wg_mma_n128_t(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

constexpr int PS_NT = 384; // producer warpgroup + 2 consumer warpgroups
constexpr int PS_NS = 3;   // ring slots
// Registers per thread after setmaxnreg, by view. They come from the CTA's
// own allocation (384 x 168 at launch): a larger sum would leave the
// consumers' setmaxnreg.inc waiting forever. The producer's dequantization
// of quantized tiles (target view), eight rows unrolled, needs 88; it only
// copies for the FP-only view.
// With the prefill stage (STG) the producer only copies, as for the
// FP-only view.
__host__ __device__ constexpr int ps_preg(int mode, bool stg) { return mode == NB_PA_TARGET && !stg ? 88 : 56; }
__host__ __device__ constexpr int ps_creg(int mode, bool stg) { return mode == NB_PA_TARGET && !stg ? 208 : 224; }
static_assert(128 * ps_preg(NB_PA_TARGET, false) + 256 * ps_creg(NB_PA_TARGET, false) <= PS_NT * 168 &&
                  128 * ps_preg(NB_PA_FP_ONLY, false) + 256 * ps_creg(NB_PA_FP_ONLY, false) <= PS_NT * 168,
              "setmaxnreg within the launch allocation");
// Shared memory (from a 1024-byte aligned base): PS_NS slots of a staged
// tile (K, V f16 swizzled), PS_NR raw slots (pf_raw: the quantized planes
// and 16-bit scales of a tile), q * scale * log2(e) as f32 [128][PF_QLD],
// then the full, empty and raw-full mbarriers.
constexpr int PS_NR = 3;                                  // raw ring slots
constexpr int PS_SLOT = PW_TILE * 2;                      // staged K and V
constexpr int PS_RSLOT = (PWR::BYTES + 127) & ~127;       // a raw quantized tile
constexpr int PS_RAW_OFF = PS_NS * PS_SLOT;
constexpr int PS_Q_OFF = PS_RAW_OFF + PS_NR * PS_RSLOT;
constexpr int PS_BAR_OFF = PS_Q_OFF + PW_MT * PF_QLD * 4;
constexpr int PS_SMEM = PS_BAR_OFF + (2 * PS_NS + PS_NR) * 8 + 1024; // + alignment slack
static_assert(PS_SMEM <= 227 * 1024, "one CTA per SM");

// The prefill stage (nb_pa_args.stage, pf_launch): every quantized group
// (n_qblocks, and the pre-quantized C_F1 when there is one) of this layer
// that a call's rows read, dequantized once into the f16 values the
// producer below stages from the same codes (pw_deq_word with the clamp:
// where the producer's fast path runs, no value needs it), so
// the kernel reads them as FP tiles and computes the same bits. Grid
// (groups per sequence, kv heads, sequences), PS_STAGE_NT threads, each
// a quarter of a token row (32 channels: 16-byte loads of each plane) at
// a time; layout pa_stage_off.
constexpr int PS_STAGE_NT = 128;
template <typename T> __global__ void __launch_bounds__(PS_STAGE_NT) pa_stage_kernel(const pa_kp P) {
    const nb_kv_layout lay = P.lay;
    const int u = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z, G = lay.group_size;
    const nb_pa_seq S = P.seqs[seq];
    if (u >= S.n_qblocks + (S.has_prequant != 0)) return;
    const int block = P.qtab[S.qblock_off + u];
    const uint8_t *sc = P.scales + nb_kv_scales_offset(&lay, P.layer, block, kvh, NB_KV_K_SCALE) * sizeof(T);
    const uint8_t *ku = P.upper + nb_kv_plane_offset(&lay, P.layer, block, kvh, 0, 0);
    const uint8_t *vu = P.upper + nb_kv_plane_offset(&lay, P.layer, block, kvh, 1, 0);
    const uint8_t *kl = P.lower + nb_kv_plane_offset(&lay, P.layer, block, kvh, 0, 0);
    const uint8_t *vl = P.lower + nb_kv_plane_offset(&lay, P.layer, block, kvh, 1, 0);
    uint8_t *dk = P.stage + pa_stage_off(lay, P.stage_u, seq, u, kvh, 0, 0);
    uint8_t *dv = P.stage + pa_stage_off(lay, P.stage_u, seq, u, kvh, 1, 0);
    for (int i = threadIdx.x; i < G * 4; i += PS_STAGE_NT) {
        const int r = i >> 2, q = i & 3; // channels 32q .. 32q+31 (words 4q .. 4q+3) of token row r
        const uint4 a_ku = *(const uint4 *)(ku + r * 64 + 16 * q), a_kl = *(const uint4 *)(kl + r * 64 + 16 * q);
        const uint4 a_vu = *(const uint4 *)(vu + r * 64 + 16 * q), a_vl = *(const uint4 *)(vl + r * 64 + 16 * q);
        const uint32_t w_ku[4] = {a_ku.x, a_ku.y, a_ku.z, a_ku.w}, w_kl[4] = {a_kl.x, a_kl.y, a_kl.z, a_kl.w};
        const uint32_t w_vu[4] = {a_vu.x, a_vu.y, a_vu.z, a_vu.w}, w_vl[4] = {a_vl.x, a_vl.y, a_vl.z, a_vl.w};
        const uint32_t rv = *(const uint16_t *)(sc + (2 * TC_D + r) * sizeof(T)) |
                            ((uint32_t) * (const uint16_t *)(sc + (2 * TC_D + G + r) * sizeof(T)) << 16);
        uint4 ok[4], ov[4];
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            const int j = 4 * q + jj; // word j: channels 8j .. 8j+7
            uint32_t ks[4], kz[4];
            pw_kscale<T>(*(const uint4 *)(sc + 16 * j), *(const uint4 *)(sc + TC_D * sizeof(T) + 16 * j), ks, kz);
            pw_deq_word<T, true>(make_uint4(w_ku[jj], w_kl[jj], w_vu[jj], w_vl[jj]), ks, kz, rv, ok[jj], ov[jj]);
        }
        uint4 *ok4 = (uint4 *)(dk + r * 256 + 64 * q), *ov4 = (uint4 *)(dv + r * 256 + 64 * q);
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            ok4[jj] = ok[jj];
            ov4[jj] = ov[jj];
        }
    }
}

// STG: the target view's quantized tiles come from the prefill stage
// (pa_stage_kernel; P.stage), copied as FP tiles.
template <typename T, int MODE, bool STG>
__global__ void __launch_bounds__(PS_NT, 1) pa_prefill_wg_kernel(const pa_kp P) {
    static_assert(!STG || MODE == NB_PA_TARGET, "the prefill stage: the target view");
    constexpr bool QUANT = MODE == NB_PA_TARGET;
    constexpr bool F16 = std::is_same<T, __half>::value;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t *const smem = smem_raw + ((1024u - (s_u32(smem_raw) & 1023u)) & 1023u);
    const nb_kv_layout lay = P.lay;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
    pf_cta<PW_TT, PW_MT> C;
    if (!C.init(P, QUANT)) return;
    const int G = C.G, kvh = C.kvh, M = C.M, nq = C.nq, pq = C.pq, n_tiles = C.n_tiles;
    auto tile_get = [&](int k) { return C.tile(P, k); };
    // Consumer warpgroups with query vectors (a warpgroup without any stays
    // out of the tile loop: its arrivals, running ahead, would complete the
    // "empty" phases of tiles still being read).
    const int n_cwg = M > 64 ? 2 : 1;
    uint64_t *full = (uint64_t *)(smem + PS_BAR_OFF), *empty = full + PS_NS, *rawfull = empty + PS_NS;
    if (tid == 0) {
        for (int s = 0; s < PS_NS; s++) {
            mbar_init(full + s, 128);        // every producer thread
            mbar_init(empty + s, 4 * n_cwg); // every warp of the active consumer warpgroups
        }
        for (int s = 0; s < PS_NR; s++) mbar_init(rawfull + s); // thread 0's arrival and the bulk copies' bytes
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    float *qs = (float *)(smem + PS_Q_OFF);
    C.load_q(P, qs);
    __syncthreads(); // barriers initialized, q staged: the last CTA-wide barrier

    if (warp < 4) { // ================= producer =================
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(ps_preg(MODE, STG)));
        const int pt = tid; // 0..127
        // FP tile k: rows < tl straight into the swizzled tile of its slot
        // (f16 rows past tl zero-filled instead), by every producer thread
        // with cp.async. With the prefill stage, quantized tiles come the
        // same way, as f16, from their group's stage block.
        auto issue_fp = [&](int k, const pf_tile &x) {
            uint8_t *sl = smem + (k % PS_NS) * PS_SLOT;
            const uint8_t *kg = x.fp ? P.fp + nb_kv_fp_offset(&lay, P.layer, x.block, kvh, 0, x.t0) * sizeof(T)
                                     : P.stage + pa_stage_off(lay, P.stage_u, C.seq, x.unit, kvh, 0, x.t0);
            const uint8_t *vg = x.fp ? P.fp + nb_kv_fp_offset(&lay, P.layer, x.block, kvh, 1, x.t0) * sizeof(T)
                                     : P.stage + pa_stage_off(lay, P.stage_u, C.seq, x.unit, kvh, 1, x.t0);
#pragma unroll
            for (int i = pt; i < PW_TT * 16; i += 128) {
                const int r = i >> 4, j = i & 15;
                if (r < x.tl) {
                    cp_async16(sl + pw_sw(r, j), kg + 16 * i);
                    cp_async16(sl + PW_TILE + pw_sw(r, j), vg + 16 * i);
                } else {
                    *(uint4 *)(sl + pw_sw(r, j)) = make_uint4(0u, 0u, 0u, 0u);
                    *(uint4 *)(sl + PW_TILE + pw_sw(r, j)) = make_uint4(0u, 0u, 0u, 0u);
                }
            }
        };
        // Quantized tile k (k < n_qt): its four planes and its scales into raw
        // slot k % PS_NR, seven bulk copies by one thread.
        auto issue_raw = [&](int k, int block, int t0) {
            uint8_t *raw = smem + PS_RAW_OFF + (k % PS_NR) * PS_RSLOT;
            uint64_t *bar = rawfull + k % PS_NR;
            const size_t ko = nb_kv_plane_offset(&lay, P.layer, block, kvh, 0, t0);
            const size_t vo = nb_kv_plane_offset(&lay, P.layer, block, kvh, 1, t0);
            const uint8_t *sc = P.scales + nb_kv_scales_offset(&lay, P.layer, block, kvh, NB_KV_K_SCALE) * sizeof(T);
            const uint32_t pb = PW_TT * 64, vb = PW_TT * (uint32_t)sizeof(T);
            mbar_arrive_tx(bar, PWR::BYTES);
            bulk_g2s(raw + PWR::KU, P.upper + ko, pb, bar);
            bulk_g2s(raw + PWR::VU, P.upper + vo, pb, bar);
            bulk_g2s(raw + PWR::KL, P.lower + ko, pb, bar);
            bulk_g2s(raw + PWR::VL, P.lower + vo, pb, bar);
            bulk_g2s(raw + PWR::KS, sc, 2 * TC_D * sizeof(T), bar); // K steps, then K zeros
            bulk_g2s(raw + PWR::VS, sc + (2 * TC_D + t0) * sizeof(T), vb, bar);
            bulk_g2s(raw + PWR::VZ, sc + (2 * TC_D + G + t0) * sizeof(T), vb, bar);
        };
        // The chunk's quantized tiles come first (pf_cta::tile): tiles
        // 0..n_qt-1, so raw slot k % PS_NR is in phase (k / PS_NR) & 1.
        constexpr bool staged = STG; // quantized tiles come as f16 (pa_stage_kernel)
        const int n_qt = QUANT && !staged ? C.uq * (G / PW_TT) : 0;
        if (pt == 0)
            for (int k = 0; k < min(PS_NR - 1, n_qt); k++) {
                const pf_tile x = tile_get(k);
                issue_raw(k, x.block, x.t0);
            }
        if (n_qt == 0) issue_fp(0, tile_get(0));
        cp_commit();
        // The block of the next quantized tile to issue, read from the block
        // table a tile ahead (the load's latency is not in thread 0's loop;
        // the same for FP tiles measured 3.5% slower: a load in flight there
        // may hold up the cp.async wait).
        int qblock = pt == 0 && PS_NR - 1 < n_qt ? tile_get(PS_NR - 1).block : 0;
#pragma unroll 1
        for (int k = 0; k < n_tiles; k++) {
            // Raw copies run PS_NR - 1 tiles ahead: the slot of tile
            // k + PS_NR - 1 was last read by tile k - 1, staged before the
            // barrier that ended the last iteration.
            if (pt == 0 && k + PS_NR - 1 < n_qt) {
                issue_raw(k + PS_NR - 1, qblock, tile_get(k + PS_NR - 1).t0);
                if (k + PS_NR < n_qt) qblock = tile_get(k + PS_NR).block;
            }
            // FP copies run one tile ahead, into the slot the consumers freed.
            if (k + 1 < n_tiles && k + 1 >= n_qt) {
                if (k + 1 >= PS_NS) mbar_wait(empty + (k + 1) % PS_NS, (((k + 1) / PS_NS) - 1) & 1);
                issue_fp(k + 1, tile_get(k + 1));
            }
            cp_commit();
            const pf_tile x = tile_get(k);
            uint8_t *sl = smem + (k % PS_NS) * PS_SLOT;
            if (x.fp || staged) {
                cp_wait<1>(); // this thread's copies of tile k
                if (!F16 && x.fp) { // bf16 -> f16 in place, the chunks this thread copied (staged tiles are f16)
#pragma unroll
                    for (int i = pt; i < PW_TT * 16; i += 128) {
                        const int r = i >> 4, j = i & 15;
                        if (r >= x.tl) continue;
#pragma unroll
                        for (int kv = 0; kv < 2; kv++) {
                            uint4 *a = (uint4 *)(sl + kv * PW_TILE + pw_sw(r, j));
                            uint4 w = *a;
                            w.x = fp_pair_h<T>(w.x);
                            w.y = fp_pair_h<T>(w.y);
                            w.z = fp_pair_h<T>(w.z);
                            w.w = fp_pair_h<T>(w.w);
                            *a = w;
                        }
                    }
                }
            } else if constexpr (QUANT && !STG) {
                const uint8_t *rw = smem + PS_RAW_OFF + (k % PS_NR) * PS_RSLOT;
                mbar_wait(rawfull + k % PS_NR, (k / PS_NR) & 1);
                const int j = pt & 15, r0 = pt >> 4; // word j (channels 8j..8j+7) of rows r0 + 8k
                // This thread's raw words are loaded four rows at a time
                // (20 registers): rows 0-3 before the checks and the wait for
                // the slot, rows 4-7 once rows 0-3 are staged. Loaded row by
                // row, each load waited behind the previous row's stores (the
                // compiler cannot move a shared load above a shared store).
                // With this and one-instruction selects (codes_even/odd) the
                // INT8 view ran 8-9% faster from 4k of history
                // (docs/benchmarks.md, sessions 26-27).
                uint4 rq[4];
                uint32_t rv[4]; // V step | V zero << 16 of row r0 + 8 k8
                auto load_half = [&](int h) {
#pragma unroll
                    for (int k8 = 0; k8 < 4; k8++) {
                        const int r = r0 + 8 * (4 * h + k8);
                        rq[k8] = pw_raw(rw, r, j);
                        rv[k8] = *(const uint16_t *)(rw + PWR::VS + 2 * r) |
                                 ((uint32_t) * (const uint16_t *)(rw + PWR::VZ + 2 * r) << 16);
                    }
                };
                load_half(0);
                uint32_t ks[4], kz[4]; // K's S/16 and Z of channel pairs, f16 pairs
                pw_kscale<T>(*(const uint4 *)(rw + PWR::KS + 16 * j), *(const uint4 *)(rw + PWR::KZ + 16 * j), ks, kz);
                // No value (C - 8) S/16 + Z can round past +-65504 if |Z| and
                // 16 S stay below 32000 (|C - 8| <= 247 < 256): this thread's
                // K channels, and one V step or zero of the warp's 16 rows per
                // lane. Else (or for a partial tile) the slow path clamps.
                bool ok = x.tl == PW_TT;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const __half2 b = __hfma2(u2h(ks[i]), __float2half2_rn(256.0f), __habs2(u2h(kz[i])));
                    ok = ok && __hble2(b, __float2half2_rn(32000.0f)); // false for inf and NaN
                }
                {
                    const int i = lane & 15, r = (pt >> 5) * 2 + (i & 1) + 8 * (i >> 1);
                    const float v = t2_f2<T>(*(const uint16_t *)(rw + (lane < 16 ? PWR::VS : PWR::VZ) + 2 * r)).x;
                    ok = ok && fabsf(v) * (lane < 16 ? 16.0f : 1.0f) <= 32000.0f;
                }
                auto stage = [&](auto slow) {
                    constexpr bool SLOW = decltype(slow)::value; // clamp, and rows past tl
#pragma unroll
                    for (int k8 = 0; k8 < 8; k8++) {
                        if (k8 == 4) load_half(1);
                        const int r = r0 + 8 * k8, q8 = k8 & 3;
                        uint4 wk, wv;
                        pw_deq_word<T, SLOW>(rq[q8], ks, kz, rv[q8], wk, wv);
                        if (SLOW && r >= x.tl) wk = wv = make_uint4(0u, 0u, 0u, 0u);
                        *(uint4 *)(sl + pw_sw(r, j)) = wk;
                        *(uint4 *)(sl + PW_TILE + pw_sw(r, j)) = wv;
                    }
                };
                // The staged slot is written only once the consumers left it;
                // the raw loads and the checks above ran meanwhile.
                if (k >= PS_NS) mbar_wait(empty + k % PS_NS, ((k / PS_NS) - 1) & 1);
                if (__all_sync(0xffffffffu, ok))
                    stage(std::false_type());
                else
                    stage(std::true_type());
            }
            fence_async_smem(); // the slot's tiles are read next by the tensor cores
            mbar_arrive(full + k % PS_NS);
            if (!x.fp && !staged) asm volatile("bar.sync 1, 128;\n" ::: "memory"); // raw slot k % PS_NR read by all
        }
        cp_wait<0>();
        return;
    }

    // ================= consumers =================
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(ps_creg(MODE, STG)));
    const int cw = warp - 4;              // consumer warp 0..7
    const int wgm0 = 64 * (cw >> 2);      // this warpgroup's first query vector
    if (cw >> 2 >= n_cwg) return;         // no query vectors here
    const int wg_pmax = C.row_pos(min(wgm0 + 63, M - 1)); // its last row's position
    const int wm0 = 16 * cw;
    const int wp_min = C.row_pos(min(wm0, M - 1));
    const bool wfull = wm0 + 15 < M;
    int prow[2];
    bool rok[2], rpre[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int m = wm0 + g8 + 8 * h;
        rok[h] = m < M;
        prow[h] = C.row_pos(rok[h] ? m : 0);
        rpre[h] = row_uses_prequant(prow[h], G, nq, pq);
    }
    float acc[64]; // out: n-tile n (channels 8n..8n+7) at acc[4n .. 4n+3]
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    float mrun[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f};
    // q's A fragments, k-step ks = channels 16ks..16ks+15: q rounded to f16
    // (ah), and the residual (al: NB_PA_PF_K2 builds only).
    uint32_t ah[8][4], al[8][4];
    {
        float qz[2];
        pf_build_a(qs, qs, wm0, lane, false, ah, al, qz);
    }
    auto release = [&](int s) { // this warp is done with slot s
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + s);
    };

#pragma unroll 1
    for (int it = 0; it < n_tiles; it++) {
        const pf_tile x = tile_get(it);
        const int s = it % PS_NS;
        // Even a tile this warpgroup skips is waited for before it is
        // released, so no warp's arrival can run a phase ahead.
        mbar_wait(full + s, (it / PS_NS) & 1);
        if (x.tl <= 0 || x.pos > wg_pmax) { // nothing of this tile for this warpgroup
            release(s);
            continue;
        }
        const uint8_t *sl = smem + s * PS_SLOT;
        const uint32_t kc_s = s_u32(sl), vc_s = s_u32(sl + PW_TILE);
        float sc[32]; // token n-tile n (tokens 8n..8n+7) at sc[4n .. 4n+3]
#pragma unroll
        for (int i = 0; i < 32; i++) sc[i] = 0.0f;
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 8; ks++) {
            const uint64_t d = pw_desc(kc_s + (ks >> 2) * 8192 + (ks & 3) * 32, 16, 1024);
            wg_mma_n64(sc, ah[ks], d);
#ifdef NB_PA_PF_K2
            wg_mma_n64(sc, al[ks], d);
#endif
        }
        wg_commit();
        wg_wait0();
        reg_fence(sc);
        float mx[2] = {-INFINITY, -INFINITY};
        if (x.tl == PW_TT && x.rmask == 0 && x.pos + PW_TT - 1 <= wp_min && wfull) { // no masks
#pragma unroll
            for (int i = 0; i < 32; i++) {
                mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], sc[i]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++) {
                const int h = (i >> 1) & 1, col = 8 * (i >> 2) + 2 * t4 + (i & 1);
                bool ok = rok[h] && col < x.tl && x.pos + col <= prow[h];
                if (x.rmask) ok = ok && (rpre[h] == (x.rmask == 1));
                if (!ok) sc[i] = -INFINITY;
                mx[h] = fmaxf(mx[h], sc[i]);
            }
        }
        float alpha[2], msafe[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            const float mnew = fmaxf(mrun[h], mx[h]);
            msafe[h] = mnew == -INFINITY ? 0.0f : mnew;
            alpha[h] = ex2_ftz(mrun[h] - msafe[h]);
            mrun[h] = mnew;
        }
        float ps[2] = {0.0f, 0.0f};
        uint32_t pa[4][4];
#pragma unroll
        for (int n = 0; n < 8; n++) {
            float p[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                p[i] = ex2_ftz(sc[4 * n + i] - msafe[i >> 1]);
                ps[i >> 1] += p[i];
            }
            pa[n >> 1][2 * (n & 1)] = h2u(__floats2half2_rn(p[0], p[1]));
            pa[n >> 1][2 * (n & 1) + 1] = h2u(__floats2half2_rn(p[2], p[3]));
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            lsum[h] = fmaf(lsum[h], alpha[h], ps[h]);
        }
#pragma unroll
        for (int n = 0; n < 16; n++) {
            acc[4 * n] *= alpha[0];
            acc[4 * n + 1] *= alpha[0];
            acc[4 * n + 2] *= alpha[1];
            acc[4 * n + 3] *= alpha[1];
        }
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wg_mma_n128_t(acc, pa[kk], pw_desc(vc_s + kk * 2048, 8192, 1024));
        wg_commit();
        wg_wait0();
        reg_fence(acc);
        release(s);
    }

#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
            lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], o);
        }
    const float zsum[2] = {0.0f, 0.0f}, dom = 1.0f;
#pragma unroll
    for (int h = 0; h < 2; h++)
        if (rok[h])
            C.store(P, wm0 + g8 + 8 * h, t4, mrun[h], lsum[h], zsum[h], dom,
                    [&](int n, int j) { return acc[4 * n + 2 * h + j]; });
}
