// paged_attention_prefill.cuh: the tensor-core prefill kernel (included by
// paged_attention_cuda.cu inside its anonymous namespace, after
// paged_attention_tc.cuh, whose PTX wrappers and code helpers it uses).
//
// The one idea: a prefill chunk has many query rows, so attention is bound
// by arithmetic, not by bytes, and the arithmetic belongs on tensor cores.
// The kernel this one replaces for those calls (pa_chunk_kernel) does its
// q.k and p.v products as scalar f32 FMAs, ~3 TFLOP/s on an H100 (71 s of a
// 32k-token prompt's prefill at the Llama-3-8B shape). Here, FlashAttention-2
// style: a CTA of 4 warps owns 64 query vectors (rows x the GQA group of one
// kv head, 16 per warp = the M of mma.m16n8k16), streams the chunk's KV as
// 32-token tiles through a 3-stage cp.async ring, and every warp runs
//   scores [16 q x 32 tok] = Q' [16 x 128] . K'^T   (16 + 16 MMAs, hi + lo)
//   out    [16 q x 128 ch] += P' [16 x 32 tok] . V'  (32 MMAs)
// with an online softmax in registers between them (the score C fragments
// are the P.V A fragments, no shuffles).
//
// Exactness of the quantized view. K and V enter the MMAs as their codes,
// never dequantized element by element:
//   - a tile's raw planes are turned once per CTA into f16 SUBNORMAL codes
//     (C * 2^-24, C = 16U + Lstored = C8 + 8 in 0..255, exact) in a
//     swizzled shared-memory tile that ldmatrix reads without bank conflicts;
//   - K's per-channel step folds into q once per block (Q' = q * S_c, split
//     exactly into f16 hi + lo: ~22 bits, two MMAs), and K's zero point with
//     the -8 of C8 into one f32 offset per query vector, qz = sum_c q_c *
//     (Z_c - S_c/2); score = 2^20 * MMA + qz (2^20 = 2^24 / 16: the target
//     step is S/16);
//   - V's per-token step folds into the softmax weights (P' = p * S_t, one
//     f16) and its zero point into an f32 sum per query vector, sum_t p *
//     (Z_t - S_t/2), so out = 2^20 * MMA + zsum.
// FP tiles (the chunk itself and the recent FP blocks) enter as f16 values
// (bf16 caches: converted, exact for |x| in f16's normal range, finite
// values beyond +-65504 saturate, as in the decode tensor-core kernel), q
// as hi + lo, P as one f16. The accumulators of a warp's quantized tiles
// (code domain) switch once, by the exact factor 2^20, when its first FP
// tile arrives: a chunk's tiles are all quantized ones, then all FP ones.
//
// Masks: tokens past the sequence's written slots (zeroed when staged, so
// NaN garbage there cannot reach P.V through a zero weight), causality
// (token position <= the row's), the two row classes of the pre-quantized
// C_F1 (row_uses_prequant), and query vectors past the call's rows. Tiles
// past a CTA's last row are not loaded; a warp skips tiles past its own
// last row. Split-K over units of whole blocks exactly as pa_chunk_kernel
// (the partials go to pa_merge_kernel), so a call's chunks and workspace
// are those of the kernel it replaces.
//
// Shapes: D = 128, G % 32 == 0, f16 or bf16 cache, TARGET or FP_ONLY
// view, any GQA ratio, pools 16-byte aligned. q * softmax_scale * log2(e)
// and q * S_c must be finite in f16 (|x| < 65504), as for the decode
// tensor-core kernel. Not row-invariant (prefill passes use the
// batch-tuned split; fixed_chunk_groups > 0 never comes here).

constexpr int PF_NW = 4, PF_NT = 32 * PF_NW;
constexpr int PF_MT = 16 * PF_NW; // query vectors per CTA
constexpr int PF_TT = 32;         // tokens per tile
constexpr int PF_NS = 3;          // cp.async stages
constexpr int PF_QLD = 136;       // floats per q row in shared memory (conflict-free float2 reads)
// Shared memory: q * scale * log2(e) as f32 [64][PF_QLD]; the tile's K and V
// as f16 [32 tok][128 ch] (16-byte chunk j of row r at chunk j ^ (r & 7));
// the block's K step and zero' (f32 [128] each); the tile's V step and
// zero' (f32 [32] each); the raw ring.
constexpr int PF_Q_OFF = 0;
constexpr int PF_KC_OFF = PF_Q_OFF + PF_MT * PF_QLD * 4;
constexpr int PF_VC_OFF = PF_KC_OFF + PF_TT * 256;
constexpr int PF_KS_OFF = PF_VC_OFF + PF_TT * 256;
constexpr int PF_VS_OFF = PF_KS_OFF + 2 * 128 * 4;
constexpr int PF_RAW_OFF = PF_VS_OFF + 2 * PF_TT * 4;
constexpr int PF_SLOT = 2 * PF_TT * 128 * 2; // an FP tile's K + V rows (16-bit)
constexpr int PF_SMEM = PF_RAW_OFF + PF_NS * PF_SLOT;
// Ring slot: an FP tile, K [32][128], V [32][128], or a quantized one (pf_raw).
// A quantized tile of TT tokens as copied from the pools (both prefill
// kernels): K upper, V upper, K lower, V lower planes [TT][64 B]; K step
// [128], K zero [128], V step [TT], V zero [TT] (16-bit).
template <int TT> struct pf_raw {
    static constexpr int KU = 0, VU = TT * 64, KL = 2 * TT * 64, VL = 3 * TT * 64;
    static constexpr int KS = 4 * TT * 64, KZ = KS + 256, VS = KZ + 256, VZ = VS + 2 * TT, BYTES = VZ + 2 * TT;
};
using PR = pf_raw<PF_TT>;
static_assert(PR::BYTES <= PF_SLOT, "a quantized tile fits the slot");
static_assert(PF_RAW_OFF % 16 == 0, "cp.async destinations are 16-byte aligned");
static_assert(2 * PF_SMEM + 2048 <= 228 * 1024, "two CTAs per SM");

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// f32 pair -> f16 hi + lo pairs (x = hi + lo to ~22 bits).
__device__ __forceinline__ void pf_split(float x, float y, uint32_t &hi, uint32_t &lo) {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 f = __half22float2(h);
    hi = h2u(h);
    lo = h2u(__floats2half2_rn(x - f.x, y - f.y));
}
// Byte offset of 16-byte chunk j of token row r in a swizzled [32][128] f16 tile.
__device__ __forceinline__ int pf_sw(int r, int j) { return r * 256 + ((j ^ (r & 7)) << 4); }

struct pf_tile {
    int fp, block, t0, pos, tl, rmask, unit;
};

// Thread t of nt issues its cp.async copies of quantized tile x into raw
// (pf_raw<TT> layout, 16-byte aligned).
template <typename T, int TT>
__device__ __forceinline__ void pf_copy_raw(const pa_kp &P, const pf_tile &x, int kvh, uint8_t *raw, int t, int nt) {
    using R = pf_raw<TT>;
    const nb_kv_layout lay = P.lay;
    const size_t ko = nb_kv_plane_offset(&lay, P.layer, x.block, kvh, 0, x.t0);
    const size_t vo = nb_kv_plane_offset(&lay, P.layer, x.block, kvh, 1, x.t0);
#pragma unroll
    for (int i = t; i < TT * 4; i += nt) { // TT rows x 64 B per plane, 16 B a copy
        cp_async16(raw + R::KU + 16 * i, P.upper + ko + 16 * i);
        cp_async16(raw + R::VU + 16 * i, P.upper + vo + 16 * i);
        cp_async16(raw + R::KL + 16 * i, P.lower + ko + 16 * i);
        cp_async16(raw + R::VL + 16 * i, P.lower + vo + 16 * i);
    }
    constexpr int NV = TT / 8; // 16-byte copies of a V step or zero row
    if (t < 32 + 2 * NV) {
        const uint8_t *sc = P.scales;
        const size_t es = sizeof(T);
        if (t < 16)
            cp_async16(raw + R::KS + 16 * t,
                       sc + nb_kv_scales_offset(&lay, P.layer, x.block, kvh, NB_KV_K_SCALE) * es + 16 * t);
        else if (t < 32)
            cp_async16(raw + R::KZ + 16 * (t - 16),
                       sc + nb_kv_scales_offset(&lay, P.layer, x.block, kvh, NB_KV_K_ZERO) * es + 16 * (t - 16));
        else if (t < 32 + NV)
            cp_async16(raw + R::VS + 16 * (t - 32),
                       sc + (nb_kv_scales_offset(&lay, P.layer, x.block, kvh, NB_KV_V_SCALE) + x.t0) * es +
                           16 * (t - 32));
        else
            cp_async16(raw + R::VZ + 16 * (t - 32 - NV),
                       sc + (nb_kv_scales_offset(&lay, P.layer, x.block, kvh, NB_KV_V_ZERO) + x.t0) * es +
                           16 * (t - 32 - NV));
    }
}
// Word j (channels 8j..8j+7) of token row r of a raw tile as 8 f16 codes
// each of K and V (C * 2^-24, C = 16U + Lstored). Byte b of a word pair:
// even channel 8j + 2b, odd 8j + 2b + 1. V keeps channel order (its
// channels are the accumulators' columns, shared with FP tiles); K's chunk
// holds the even channels, then the odd ones, which pf_build_a mirrors.
template <int TT> __device__ __forceinline__ void pf_codes(const uint8_t *raw, int r, int j, uint4 &wk, uint4 &wv) {
    using R = pf_raw<TT>;
    const uint32_t ku = *(const uint32_t *)(raw + R::KU + r * 64 + 4 * j);
    const uint32_t kl = *(const uint32_t *)(raw + R::KL + r * 64 + 4 * j);
    const uint32_t vu = *(const uint32_t *)(raw + R::VU + r * 64 + 4 * j);
    const uint32_t vl = *(const uint32_t *)(raw + R::VL + r * 64 + 4 * j);
    const uint32_t ke = codes_even(ku, kl), ko = codes_odd(ku, kl);
    wk = make_uint4(prmt(ke, 0u, 0x4140), prmt(ke, 0u, 0x4342), prmt(ko, 0u, 0x4140), prmt(ko, 0u, 0x4342));
    const uint32_t ve = codes_even(vu, vl), vo = codes_odd(vu, vl);
    const uint32_t x0 = prmt(ve, vo, 0x5140), x1 = prmt(ve, vo, 0x7362);
    wv = make_uint4(prmt(x0, 0u, 0x4140), prmt(x0, 0u, 0x4342), prmt(x1, 0u, 0x4140), prmt(x1, 0u, 0x4342));
}

// One prefill CTA's work (both prefill kernels): sequence blockIdx.z, kv
// head and m-tile of MT query vectors from blockIdx.y, chunk blockIdx.x of
// units (see paged_attention_cuda.cu), cut into tiles of TT tokens (G % TT
// == 0): the chunk's quantized tiles, then its FP tiles up to this CTA's
// last row.
template <int TT, int MT> struct pf_cta {
    nb_pa_seq S;
    int G, gq, chunk, kvh, seq, m0, M, nq, pq, seq_end, u0, uq, jf0, n_tiles;

    // False: nothing to do (no query vectors; or an empty chunk, whose
    // partial this call has written so that the merge skips it).
    __device__ bool init(const pa_kp &P, bool quant) {
        const int ntq = P.lay.group_size / TT;
        G = P.lay.group_size;
        gq = P.g;
        chunk = blockIdx.x;
        kvh = blockIdx.y / P.pl.n_mtiles;
        seq = blockIdx.z;
        S = P.seqs[seq];
        m0 = (blockIdx.y % P.pl.n_mtiles) * MT;
        M = min(MT, S.n_rows * gq - m0);
        if (M <= 0) return false;
        nq = quant ? S.n_qblocks : 0;
        pq = quant ? (S.has_prequant != 0) : 0;
        seq_end = S.pos0 + S.n_rows;
        const int pos_end = S.pos0 + (m0 + M - 1) / gq + 1; // this CTA's rows read positions < pos_end
        const int fp_span = seq_end - nq * G;
        const int nU = nq + pq + (fp_span > 0 ? cdiv(fp_span, G) : 0);
        u0 = chunk * P.upc;
        const int u1 = min(nU, u0 + P.upc);
        uq = max(min(nq + pq - u0, u1 - u0), 0);
        const int uf = max(u1 - u0 - uq, 0);
        jf0 = u0 + uq - nq - pq; // FP table index of the chunk's first FP unit
        int nft = 0;
        if (uf > 0) {
            const int span = pos_end - (nq + jf0) * G;
            nft = span > 0 ? min(uf * ntq, cdiv(span, TT)) : 0;
        }
        n_tiles = uq * ntq + nft;
        if (n_tiles == 0) { // NOTE: only with split-K; an empty chunk still tells the merge it holds nothing
            for (int m = threadIdx.x; m < M; m += blockDim.x) {
                P.ws_ml[2 * pidx(P, m)] = -INFINITY;
                P.ws_ml[2 * pidx(P, m) + 1] = 0.0f;
            }
            return false;
        }
        return true;
    }
    // Workspace index of query vector m of this CTA.
    __device__ size_t pidx(const pa_kp &P, int m) const {
        const int mg = m0 + m, r = mg / gq, h = kvh * gq + mg % gq;
        return ((size_t)(seq * P.n_chunks + chunk) * P.max_rows + r) * P.n_q_heads + h;
    }
    // Position of the row of query vector m.
    __device__ int row_pos(int m) const { return S.pos0 + (m0 + m) / gq; }
    __device__ pf_tile tile(const pa_kp &P, int k) const {
        const int ntq = G / TT;
        pf_tile x;
        if (k < uq * ntq) {
            const int u = u0 + k / ntq;
            x.fp = 0;
            x.t0 = (k % ntq) * TT;
            x.block = P.qtab[S.qblock_off + u]; // u == nq: the pre-quantized C_F1
            x.pos = u * G + x.t0;
            x.rmask = u < nq ? 0 : 1;
            x.unit = u;
        } else {
            k -= uq * ntq;
            const int j = jf0 + k / ntq;
            x.fp = 1;
            x.t0 = (k % ntq) * TT;
            x.block = P.fptab[S.fpblock_off + j];
            x.pos = (nq + j) * G + x.t0;
            x.rmask = (pq && j == 0) ? 2 : 0;
            x.unit = -1;
        }
        x.tl = min(TT, seq_end - x.pos);
        return x;
    }
    // q * scale * log2(e) of the CTA's query vectors into qs (f32 [MT][PF_QLD],
    // zeros past M), by all blockDim.x threads.
    __device__ void load_q(const pa_kp &P, float *qs) const {
        for (int i = threadIdx.x; i < MT * 32; i += blockDim.x) { // float4 of q per thread
            const int m = i >> 5, c = (i & 31) * 4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (m < M) {
                const int mg = m0 + m, r = mg / gq, h = kvh * gq + mg % gq;
                v = *(const float4 *)(P.q + ((size_t)(S.row_off + r) * P.n_q_heads + h) * TC_D + c);
                v.x *= P.scale_log2;
                v.y *= P.scale_log2;
                v.z *= P.scale_log2;
                v.w *= P.scale_log2;
            }
            *(float4 *)(qs + m * PF_QLD + c) = v;
        }
    }
    // The finished query vector m (this lane's channels 8n + 2t4, + 1 of
    // n-tiles n = 0..15, got through acc(n, j)): the output, or the partial
    // (o unnormalized, max, sum) for the merge. dom: 2^20 if the
    // accumulators are still in the code domain, else 1.
    template <typename ACC>
    __device__ void store(const pa_kp &P, int m, int t4, float mrun, float lsum, float zsum, float dom,
                          ACC acc) const {
        const int mg = m0 + m, r = mg / gq, hq = kvh * gq + mg % gq;
        if (P.n_chunks == 1) {
            const size_t o0 = ((size_t)(S.row_off + r) * P.n_q_heads + hq) * TC_D + 2 * t4;
            const float inv = 1.0f / lsum;
#pragma unroll
            for (int n = 0; n < 16; n++) {
                const float v0 = fmaf(acc(n, 0), dom, zsum) * inv, v1 = fmaf(acc(n, 1), dom, zsum) * inv;
                if (P.ocvt) {
                    pa_out(P, o0 + 8 * n, v0);
                    pa_out(P, o0 + 8 * n + 1, v1);
                } else {
                    *(float2 *)(P.out + o0 + 8 * n) = make_float2(v0, v1);
                }
            }
        } else {
            const size_t pi = pidx(P, m);
            float *o = P.ws_o + pi * TC_D + 2 * t4;
#pragma unroll
            for (int n = 0; n < 16; n++)
                *(float2 *)(o + 8 * n) = make_float2(fmaf(acc(n, 0), dom, zsum), fmaf(acc(n, 1), dom, zsum));
            if (t4 == 0) {
                P.ws_ml[2 * pi] = mrun;
                P.ws_ml[2 * pi + 1] = lsum;
            }
        }
    }
};

// Q' A fragments (mma.m16n8k16 / wgmma layout) of the warp's 16 query
// vectors wm0.. from qs: q itself (fold = false; FP tiles) or q * S_c with
// qz = sum_c q_c Z'_c (fold = true; a quantized block's step S and zero' Z'
// at ks[0..127], ks[128..255]), each as f16 hi + lo. Lane holds rows g8,
// g8 + 8, k indices 16ks + 2t4 (+1) and + 8 (+1): those channels for FP
// tiles; for quantized K, whose 8-channel chunks are staged as channels 0 2
// 4 6 1 3 5 7 (one byte permute less per word than channel order), channels
// 16ks + {0,2 | 4,6 | 1,3 | 5,7} for t4 = 0..3 (and + 8).
__device__ __forceinline__ void pf_build_a(const float *qs, const float *ks, int wm0, int lane, bool fold,
                                           uint32_t (&ah)[8][4], uint32_t (&al)[8][4], float (&qz)[2]) {
    const int g8 = lane >> 2, t4 = lane & 3;
    const float *q0 = qs + (wm0 + g8) * PF_QLD, *q1 = q0 + 8 * PF_QLD;
    const float *kz = ks + 128;
    float z0 = 0.0f, z1 = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            // k indices 2t4, 2t4 + 1 of a chunk: channels c, c + d
            const int c = 16 * k + 8 * h + (fold ? (t4 < 2 ? 4 * t4 : 4 * t4 - 7) : 2 * t4), d = fold ? 2 : 1;
            float2 a = make_float2(q0[c], q0[c + d]), b = make_float2(q1[c], q1[c + d]);
            if (fold) {
                const float2 s = make_float2(ks[c], ks[c + 2]), z = make_float2(kz[c], kz[c + 2]);
                z0 = fmaf(a.x, z.x, fmaf(a.y, z.y, z0));
                z1 = fmaf(b.x, z.x, fmaf(b.y, z.y, z1));
                a.x *= s.x;
                a.y *= s.y;
                b.x *= s.x;
                b.y *= s.y;
            }
            pf_split(a.x, a.y, ah[k][2 * h], al[k][2 * h]);         // a0 / a2: row g8
            pf_split(b.x, b.y, ah[k][2 * h + 1], al[k][2 * h + 1]); // a1 / a3: row g8 + 8
        }
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
        z0 += __shfl_xor_sync(0xffffffffu, z0, o);
        z1 += __shfl_xor_sync(0xffffffffu, z1, o);
    }
    qz[0] = fold ? z0 : 0.0f;
    qz[1] = fold ? z1 : 0.0f;
}

template <typename T, int MODE>
__global__ void __launch_bounds__(PF_NT, 2) pa_prefill_kernel(const pa_kp P) {
    constexpr bool QUANT = MODE == NB_PA_TARGET;
    constexpr float K20 = 1048576.0f; // 2^24 (subnormal codes) / 16 (the target step S/16)
    extern __shared__ __align__(128) uint8_t smem[];
    const nb_kv_layout lay = P.lay;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
    pf_cta<PF_TT, PF_MT> C;
    if (!C.init(P, QUANT)) return;
    const int G = C.G, kvh = C.kvh, M = C.M, nq = C.nq, pq = C.pq, n_tiles = C.n_tiles;
    auto tile_get = [&](int k) { return C.tile(P, k); };
    // Whole 32-token rows are copied (they lie inside the block); rows at
    // or past tl are zeroed when staged.
    auto issue = [&](int k) {
        const pf_tile x = tile_get(k);
        uint8_t *sb = smem + PF_RAW_OFF + (k % PF_NS) * PF_SLOT;
        if (x.fp) {
            const uint8_t *kg = P.fp + nb_kv_fp_offset(&lay, P.layer, x.block, kvh, 0, x.t0) * sizeof(T);
            const uint8_t *vg = P.fp + nb_kv_fp_offset(&lay, P.layer, x.block, kvh, 1, x.t0) * sizeof(T);
#pragma unroll
            for (int i = tid; i < PF_TT * 16; i += PF_NT) { // straight into the swizzled layout
                const int r = i >> 4, j = i & 15;
                cp_async16(sb + pf_sw(r, j), kg + 16 * i);
                cp_async16(sb + PF_TT * 256 + pf_sw(r, j), vg + 16 * i);
            }
        } else if (QUANT) {
            pf_copy_raw<T, PF_TT>(P, x, kvh, sb, tid, PF_NT);
        }
    };

#pragma unroll 1
    for (int s = 0; s < PF_NS - 1; s++) {
        if (s < n_tiles) issue(s);
        cp_commit();
    }

    float *qs = (float *)(smem + PF_Q_OFF);
    C.load_q(P, qs);

    // This warp's query vectors: rows g8 and g8 + 8 of its 16 (h = 0, 1).
    const int wm0 = 16 * warp;
    const bool wact = wm0 < M;
    const int wp_max = C.row_pos(min(wm0 + 15, M - 1)); // its last row's position
    const int wp_min = C.row_pos(wm0);                   // its first row's
    const bool wfull = wm0 + 15 < M;                                // all 16 query vectors valid
    int prow[2];
    bool rok[2], rpre[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int m = wm0 + g8 + 8 * h;
        rok[h] = m < M;
        prow[h] = C.row_pos(rok[h] ? m : 0);
        rpre[h] = row_uses_prequant(prow[h], G, nq, pq);
    }
    float acc[16][4];
#pragma unroll
    for (int n = 0; n < 16; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[n][i] = 0.0f;
    float mrun[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f}, zsum[2] = {0.0f, 0.0f}, qz[2] = {0.0f, 0.0f};
    uint32_t ah[8][4], al[8][4]; // Q' A fragments, k-step ks = channels 16ks..16ks+15
    int cur = -2;                // what ah/al hold: a quantized unit, -1 (FP: q itself), -2 nothing
    bool qdom = QUANT;           // accumulators in the code domain (x 2^-20)

    // Q' = q (* S_c) as hi + lo; qz = sum_c q_c Z'_c (pf_build_a).
    auto build_a = [&](bool fold) {
        pf_build_a(qs, (const float *)(smem + PF_KS_OFF), wm0, lane, fold, ah, al, qz);
    };

#pragma unroll 1
    for (int it = 0; it < n_tiles; it++) {
        cp_wait<PF_NS - 2>();
        __syncthreads(); // tile `it` landed; everyone is done with tile it-1
        if (it + PF_NS - 1 < n_tiles) issue(it + PF_NS - 1);
        cp_commit();
        const pf_tile x = tile_get(it);
        const uint8_t *sb = smem + PF_RAW_OFF + (it % PF_NS) * PF_SLOT;

        // ---- stage: FP tiles in place (bf16 -> f16; rows past the
        // sequence zeroed), quantized tiles -> f16 codes in Kc/Vc, steps ----
        constexpr bool F16 = std::is_same<T, __half>::value;
        const bool fp = !QUANT || x.fp;
        if (fp) {
            if (!F16 || x.tl < PF_TT) {
                uint8_t *sw = smem + PF_RAW_OFF + (it % PF_NS) * PF_SLOT;
#pragma unroll
                for (int i = tid; i < 2 * PF_TT * 16; i += PF_NT) {
                    const int kv = i >> 9, r = (i >> 4) & 31, j = i & 15;
                    uint4 *a = (uint4 *)(sw + kv * (PF_TT * 256) + pf_sw(r, j));
                    if (r >= x.tl) {
                        *a = make_uint4(0u, 0u, 0u, 0u);
                    } else if (!F16) {
                        uint4 w = *a;
                        w.x = fp_pair_h<T>(w.x);
                        w.y = fp_pair_h<T>(w.y);
                        w.z = fp_pair_h<T>(w.z);
                        w.w = fp_pair_h<T>(w.w);
                        *a = w;
                    }
                }
                __syncthreads();
            }
        } else if (QUANT) {
            // Thread: word j of rows r0, r0 + 8, r0 + 16, r0 + 24 (r & 7 = r0:
            // one swizzled chunk). Byte b of a word pair: even channel 8j + 2b
            // (e), odd 8j + 2b + 1 (o). V keeps channel order (its channels are
            // the accumulators' columns, shared with FP tiles); K's chunk holds
            // the even channels, then the odd ones, which build_a mirrors.
            const int j = tid & 15, r0 = tid >> 4, swz = (j ^ r0) << 4;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int r = r0 + 8 * k;
                uint4 wk = make_uint4(0u, 0u, 0u, 0u), wv = wk;
                if (r < x.tl) pf_codes<PF_TT>(sb, r, j, wk, wv);
                *(uint4 *)(smem + PF_KC_OFF + r * 256 + swz) = wk;
                *(uint4 *)(smem + PF_VC_OFF + r * 256 + swz) = wv;
            }
            float *ks = (float *)(smem + PF_KS_OFF), *vs = (float *)(smem + PF_VS_OFF);
            if (x.t0 == 0 || it == 0) { // the block's K step and zero' = zero - step/2 (C8 = C - 8, the step is S/16)
                const float s = t2_f2<T>(*(const uint16_t *)(sb + PR::KS + 2 * tid)).x;
                const float z = t2_f2<T>(*(const uint16_t *)(sb + PR::KZ + 2 * tid)).x;
                ks[tid] = s;
                ks[128 + tid] = fmaf(-0.5f, s, z);
            }
            if (tid < PF_TT) {
                float s = 0.0f, z = 0.0f;
                if (tid < x.tl) {
                    s = t2_f2<T>(*(const uint16_t *)(sb + PR::VS + 2 * tid)).x;
                    z = fmaf(-0.5f, s, t2_f2<T>(*(const uint16_t *)(sb + PR::VZ + 2 * tid)).x);
                }
                vs[tid] = s;
                vs[PF_TT + tid] = z;
            }
            __syncthreads();
        }
        if (!wact || x.tl <= 0 || x.pos > wp_max) continue; // nothing of this tile for this warp
        if (fp) {
            if (cur != -1) {
                build_a(false);
                cur = -1;
            }
            if (qdom) {
#pragma unroll
                for (int n = 0; n < 16; n++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[n][i] *= K20;
                qdom = false;
            }
        } else if (cur != x.unit) {
            build_a(true);
            cur = x.unit;
        }

        const uint32_t kc_s = fp ? s_u32(sb) : s_u32(smem + PF_KC_OFF);
        const uint32_t vc_s = fp ? s_u32(sb + PF_TT * 256) : s_u32(smem + PF_VC_OFF);
        // ---- scores: 4 n-tiles of 8 tokens, 8 k-steps, hi + lo ----
        float sc[4][4];
#pragma unroll
        for (int n = 0; n < 4; n++) {
#pragma unroll
            for (int i = 0; i < 4; i++) sc[n][i] = 0.0f;
#pragma unroll
            for (int kp = 0; kp < 4; kp++) {
                uint32_t b[4];
                ldsm_x4(b, kc_s + pf_sw(8 * n + (lane & 7), 4 * kp + (lane >> 3)));
                mma16816(sc[n], ah[2 * kp], b[0], b[1]);
                mma16816(sc[n], ah[2 * kp + 1], b[2], b[3]);
                mma16816(sc[n], al[2 * kp], b[0], b[1]);
                mma16816(sc[n], al[2 * kp + 1], b[2], b[3]);
            }
        }
        // ---- online softmax (log2 units); sc[n][i]: row g8 + 8 (i >> 1), token 8n + 2t4 + (i & 1) ----
        const float ksc = fp ? 1.0f : K20;
        float mx[2] = {-INFINITY, -INFINITY};
        if (x.tl == PF_TT && x.rmask == 0 && x.pos + PF_TT - 1 <= wp_min && wfull) { // no masks
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    sc[n][i] = fmaf(sc[n][i], ksc, qz[i >> 1]);
                    mx[i >> 1] = fmaxf(mx[i >> 1], sc[n][i]);
                }
        } else {
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int h = i >> 1, col = 8 * n + 2 * t4 + (i & 1);
                    bool ok = rok[h] && col < x.tl && x.pos + col <= prow[h];
                    if (x.rmask) ok = ok && (rpre[h] == (x.rmask == 1));
                    sc[n][i] = ok ? fmaf(sc[n][i], ksc, qz[h]) : -INFINITY;
                    mx[h] = fmaxf(mx[h], sc[n][i]);
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
        float ps[2] = {0.0f, 0.0f}, pz[2] = {0.0f, 0.0f};
        uint32_t pa[2][4]; // P' A fragments, k-step kk = tokens 16kk..16kk+15
        const float *vs = (const float *)(smem + PF_VS_OFF);
#pragma unroll
        for (int n = 0; n < 4; n++) {
            float p[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                p[i] = ex2_ftz(sc[n][i] - msafe[i >> 1]);
                ps[i >> 1] += p[i];
            }
            if (!fp) {
                const float2 st = *(const float2 *)(vs + 8 * n + 2 * t4);
                const float2 zt = *(const float2 *)(vs + PF_TT + 8 * n + 2 * t4);
                pz[0] = fmaf(p[0], zt.x, fmaf(p[1], zt.y, pz[0]));
                pz[1] = fmaf(p[2], zt.x, fmaf(p[3], zt.y, pz[1]));
                p[0] *= st.x;
                p[1] *= st.y;
                p[2] *= st.x;
                p[3] *= st.y;
            }
            // n-tile n = k-step n/2, columns 0-7 (n even: a0/a1) or 8-15 (odd: a2/a3)
            pa[n >> 1][2 * (n & 1)] = h2u(__floats2half2_rn(p[0], p[1]));
            pa[n >> 1][2 * (n & 1) + 1] = h2u(__floats2half2_rn(p[2], p[3]));
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            lsum[h] = fmaf(lsum[h], alpha[h], ps[h]);
            zsum[h] = fmaf(zsum[h], alpha[h], pz[h]);
        }
#pragma unroll
        for (int n = 0; n < 16; n++) {
            acc[n][0] *= alpha[0];
            acc[n][1] *= alpha[0];
            acc[n][2] *= alpha[1];
            acc[n][3] *= alpha[1];
        }
        // ---- out += P' . V: 2 k-steps of 16 tokens, 16 n-tiles of 8 channels ----
#pragma unroll
        for (int kk = 0; kk < 2; kk++)
#pragma unroll
            for (int np = 0; np < 8; np++) {
                uint32_t b[4];
                ldsm_x4_t(b, vc_s + pf_sw(16 * kk + ((lane >> 3) & 1) * 8 + (lane & 7), 2 * np + (lane >> 4)));
                mma16816(acc[2 * np], pa[kk], b[0], b[1]);
                mma16816(acc[2 * np + 1], pa[kk], b[2], b[3]);
            }
    }
    cp_wait<0>();

    // ---- the CTA's partial (o unnormalized, max, sum) or the output ----
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
            lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], o);
            zsum[h] += __shfl_xor_sync(0xffffffffu, zsum[h], o);
        }
    if (!wact) return;
    const float dom = qdom ? K20 : 1.0f;
#pragma unroll
    for (int h = 0; h < 2; h++)
        if (rok[h])
            C.store(P, wm0 + g8 + 8 * h, t4, mrun[h], lsum[h], zsum[h], dom,
                    [&](int n, int j) { return acc[n][2 * h + j]; });
}
