// paged_attention_cuda.cu: split-K paged attention over quantized + FP blocks
// (paged_attention_cuda.h has the contract and the math trick).
//
// The one idea: a CTA of 128 threads owns (chunk of whole blocks, kv head,
// m-tile of query vectors, sequence) and streams its blocks as tiles of
// tokens through a cp.async shared-memory pipeline (2-4 stages, 16-byte
// copies), so several tiles of loads are in flight while the previous tile
// is being computed; per tile it computes scores (thread per token),
// an online softmax (warp per query vector) and P.V (thread per 8 channels
// x 4 query vectors x a slice of tokens, accumulators in registers).
//
// Layout of the work of one sequence, in "units" of one block each:
//   units 0 .. nq-1          quantized blocks (all rows)
//   unit  nq (has_prequant)  the pre-quantized C_F1, read only by rows whose
//                            nq_row = nq + 1
//   the rest                 FP blocks fp[j] at positions (nq + j)*G; fp[0]
//                            is read only by rows with nq_row = nq when a
//                            pre-quantized copy exists
// Chunk c owns units [c*upc, (c+1)*upc). Causality and the two row classes
// are masks on the scores; nothing past position pos0 + n_rows - 1 is used.
#include "paged_attention_cuda.h"

#include "dtype_cuda.cuh"
#include "mbarrier_cuda.cuh"
#include "pdl_cuda.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>

#include <type_traits>

namespace {

constexpr int NT = 128;          // threads per CTA
constexpr int MR = 4;            // query vectors per P.V register tile
constexpr int CPT = 8;           // channels per thread chunk
constexpr int MT_MAX = 64;       // query vectors per CTA at most
constexpr int SMEM_LIMIT = 227 * 1024;
constexpr float LOG2E = 1.4426950408889634f;

// ---- plan: tile sizes and shared-memory carve, the same on host and device ----

struct pa_plan {
    int D, Dp, G, es;
    int ttq, ttf, ns;                    // tile tokens (quantized / FP units), pipeline stages
    int stage_bytes;
    int o_ku, o_vu, o_kl, o_vl, o_ks, o_kz, o_vs, o_vz; // quantized stage parts (bytes)
    int o_fk, o_fv;                      // FP stage parts (bytes)
    int MT, n_mtiles;
    int off_q, off_qx, off_p, off_misc, off_stage, smem_bytes;
};

struct pa_kp {
    nb_kv_layout lay;
    const uint8_t *upper, *lower, *scales, *fp;
    int layer, n_q_heads, g;
    float scale_log2;
    const nb_pa_seq *seqs;
    const int32_t *qtab, *fptab;
    const float *q;
    float *out, *ws_o, *ws_ml;
    int n_chunks, upc, max_rows;
    int inv; // row-invariant split (nb_pa_args.fixed_chunk_groups > 0): chunks of groups, always merged
    int merge_rounds; // pa_merge_kernel: 1 forces its several-round path (tests: the same bits)
    int pdl; // the tensor-core decode kernel was launched with programmatic stream serialization
    void *ocvt; // nb_pa_args.out_cvt: outputs stored converted (pa_out)
    int ocvt_dt, ocvt_sat;
    uint8_t *stage; // the prefill stage (nb_pa_args.stage) when pa_stage_kernel filled it for this call, else NULL
    int stage_u;    // its groups per sequence
    pa_plan pl;
};

// Byte offset of token t of (sequence s, group u, kv head h, K | V kv) in
// the prefill stage ([s][u][h][kv][G][D] f16, u < stage_u).
__host__ __device__ __forceinline__ size_t pa_stage_off(const nb_kv_layout &lay, int stage_u, int s, int u, int h,
                                                        int kv, int t) {
    return (((((size_t)s * stage_u + u) * lay.n_kv_heads + h) * 2 + kv) * lay.group_size + t) * (size_t)lay.head_dim *
           2;
}

// Output element i (index into [rows][n_q_heads][D]): f32 to P.out, or
// converted to P.ocvt.
__device__ __forceinline__ void pa_out(const pa_kp &P, size_t i, float v) {
    if (!P.ocvt) {
        P.out[i] = v;
        return;
    }
    ((uint16_t *)P.ocvt)[i] = P.ocvt_dt == NB_DTYPE_BF16 ? nb_dt::f32_to_bf16(v)
                              : P.ocvt_sat                ? nb_dt::f32_to_f16_sat(v)
                                                          : nb_dt::f32_to_f16(v);
}

__host__ __device__ constexpr int a16(int x) { return (x + 15) & ~15; }
__host__ __device__ constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }

// Checks the workspace holds kp.n_chunks chunks of partials when they are
// merged, and points kp at its parts: the partial outputs
// [n_seqs][n_chunks][max_rows][n_q_heads][D], then their (max, sum).
nb_status use_workspace(pa_kp &kp, const nb_pa_args *a, int D, bool merged) {
    const size_t need = nb_pa_workspace_size(a->n_seqs, a->max_rows, a->n_q_heads, D, kp.n_chunks);
    if (merged && (a->workspace_bytes < need || !a->workspace)) return NB_ERR_INVALID_ARG;
    kp.ws_o = (float *)a->workspace;
    kp.ws_ml = kp.ws_o + (size_t)a->n_seqs * kp.n_chunks * a->max_rows * a->n_q_heads * D;
    return NB_OK;
}

// The split-K plan of both decode kernels. Row-invariant
// (fixed_chunk_groups > 0): chunks of that many groups over the longest
// context. Batch-tuned: `target` CTAs (about one wave) over the call's
// (sequence, kv head) pairs, rounded down (a CTA over a full wave costs a
// whole second one), at most `cap` chunks (the work's granularity) and
// max_chunks; the caller sizes its chunks from kp.n_chunks.
nb_status plan_split(pa_kp &kp, const nb_pa_args *a, long target, long cap) {
    if (a->fixed_chunk_groups > 0) {
        kp.inv = 1;
        kp.upc = a->fixed_chunk_groups;
        kp.n_chunks = cdiv(cdiv(a->max_tokens, a->lay.group_size), kp.upc);
        return kp.n_chunks > a->max_chunks ? NB_ERR_INVALID_ARG : NB_OK;
    }
    kp.inv = 0;
    long chunks = target / ((long)a->n_seqs * a->lay.n_kv_heads);
    if (chunks > cap) chunks = cap;
    if (chunks > a->max_chunks) chunks = a->max_chunks;
    if (chunks < 1) chunks = 1;
    kp.n_chunks = (int)chunks;
    return NB_OK;
}

// canonical(p) of nb_bm_qblocks_for_tokens and the row rule of
// nb_bm_view_qblocks_for_row: does the row at position p read the
// pre-quantized C_F1 (group nq) instead of FP block fp[0]?
__device__ __forceinline__ bool row_uses_prequant(int p, int G, int nq, int pq) {
    const int canonical = p >= 2 * G ? p / G - 1 : 0;
    return pq && canonical > nq;
}

// ---- cp.async pipeline ----

__device__ __forceinline__ void cp_async16(void *s, const void *g) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(g));
}
__device__ __forceinline__ void cp_async4(void *s, const void *g) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(g));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// All threads copy n contiguous bytes global -> shared: 16-byte cp.async when
// aligned, 4-byte when possible, else plain (synchronous) byte copies.
__device__ __forceinline__ void stage_copy(uint8_t *s, const uint8_t *g, int n) {
    const int tid = threadIdx.x;
    if ((((uintptr_t)s | (uintptr_t)g | (uintptr_t)n) & 15) == 0) {
        for (int i = tid * 16; i < n; i += NT * 16) cp_async16(s + i, g + i);
    } else if ((((uintptr_t)s | (uintptr_t)g | (uintptr_t)n) & 3) == 0) {
        for (int i = tid * 4; i < n; i += NT * 4) cp_async4(s + i, g + i);
    } else {
        for (int i = tid; i < n; i += NT) s[i] = g[i];
    }
}

// ---- element access ----

template <typename T> __device__ __forceinline__ float ldf(const T *p);
template <> __device__ __forceinline__ float ldf<float>(const float *p) { return *p; }
template <> __device__ __forceinline__ float ldf<__half>(const __half *p) { return __half2float(*p); }
template <> __device__ __forceinline__ float ldf<__nv_bfloat16>(const __nv_bfloat16 *p) {
    return __bfloat162float(*p);
}

// 0x4B0000xx as f32 is 2^23 + xx: byte -> float in a permute and an add.
__device__ __forceinline__ float byte_f(uint32_t w, uint32_t sel, float bias) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, sel)) - bias;
}

// 8 channels (one 4-byte word of the upper plane): U as floats.
__device__ __forceinline__ void draft8(uint32_t up, float v[8]) {
    const uint32_t e = up & 0x0F0F0F0Fu, o = (up >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int b = 0; b < 4; b++) {
        v[2 * b] = byte_f(e, 0x7650u + b, 8388608.0f);
        v[2 * b + 1] = byte_f(o, 0x7650u + b, 8388608.0f);
    }
}

// 8 channels from both planes: C8 = 16U + Lstored - 8 as floats (exact).
__device__ __forceinline__ void target8(uint32_t up, uint32_t lo, float v[8]) {
    const uint32_t e = ((up & 0x0F0F0F0Fu) << 4) | (lo & 0x0F0F0F0Fu);
    const uint32_t o = (up & 0xF0F0F0F0u) | ((lo >> 4) & 0x0F0F0F0Fu);
#pragma unroll
    for (int b = 0; b < 4; b++) {
        v[2 * b] = byte_f(e, 0x7650u + b, 8388616.0f);
        v[2 * b + 1] = byte_f(o, 0x7650u + b, 8388616.0f);
    }
}

// Word cc (channels 8cc..8cc+7) of a plane row of `rb` bytes; bytes past the
// row read as 0 (generic D only).
template <bool FAST>
__device__ __forceinline__ uint32_t plane_word(const uint8_t *row, int cc, int rb) {
    if (FAST) return *(const uint32_t *)(row + cc * 4);
    uint32_t w = 0;
#pragma unroll
    for (int b = 0; b < 4; b++) {
        const int i = cc * 4 + b;
        if (i < rb) w |= (uint32_t)row[i] << (8 * b);
    }
    return w;
}

// Channels 8cc..8cc+7 of an FP row of D elements; past D reads 0.
template <bool FAST, typename T>
__device__ __forceinline__ void fp8(const T *row, int cc, int D, float v[8]) {
    if constexpr (FAST && sizeof(T) == 2) {
        const uint4 w = *(const uint4 *)(row + cc * 8);
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (std::is_same<T, __half>::value) {
                __half2 h = *(const __half2 *)&ws[i];
                float2 f = __half22float2(h);
                v[2 * i] = f.x;
                v[2 * i + 1] = f.y;
            } else {
                v[2 * i] = __uint_as_float(ws[i] << 16);
                v[2 * i + 1] = __uint_as_float(ws[i] & 0xFFFF0000u);
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int c = cc * 8 + j;
            v[j] = c < D ? ldf<T>(row + c) : 0.0f;
        }
    }
}

// One tile: CPT-channel chunks of a token row from the stage buffer.
template <bool FAST, typename T, int MODE>
__device__ __forceinline__ void row8(const uint8_t *sb, const pa_plan &L, bool fp, bool is_v, int t,
                                     int cc, int D, float v[8]) {
    if (MODE == NB_PA_FP_ONLY || fp) {
        const T *base = (const T *)(sb + (is_v ? L.o_fv : L.o_fk)) + (size_t)t * D;
        fp8<FAST, T>(base, cc, D, v);
    } else {
        const int rb = D / 2;
        const uint8_t *u = sb + (is_v ? L.o_vu : L.o_ku) + (size_t)t * rb;
        const uint32_t uw = plane_word<FAST>(u, cc, rb);
        if constexpr (MODE == NB_PA_TARGET) {
            const uint8_t *l = sb + (is_v ? L.o_vl : L.o_kl) + (size_t)t * rb;
            target8(uw, plane_word<FAST>(l, cc, rb), v);
        } else {
            draft8(uw, v);
        }
    }
}

struct tile_t {
    int fp, block, t0, pos, rows, tl, rmask;
};

template <int DC, typename T, int MODE>
__global__ void __launch_bounds__(NT) pa_chunk_kernel(const pa_kp P) {
    constexpr bool FAST = DC != 0;
    constexpr bool QUANT = MODE != NB_PA_FP_ONLY;
    constexpr int NS = !FAST ? 2 : QUANT ? 4 : 3;
    extern __shared__ __align__(16) uint8_t smem[];
    const pa_plan &L = P.pl;
    const nb_kv_layout lay = P.lay;
    const int D = FAST ? DC : L.D, Dp = FAST ? DC : L.Dp, G = lay.group_size;
    const int n_cch = Dp / CPT;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int chunk = blockIdx.x, kvh = blockIdx.y / L.n_mtiles, mt = blockIdx.y % L.n_mtiles;
    const int seq = blockIdx.z, g = P.g;
    const nb_pa_seq S = P.seqs[seq];
    const int nq = QUANT ? S.n_qblocks : 0, pq = QUANT ? (S.has_prequant != 0) : 0;
    const int pos_end = S.pos0 + S.n_rows;
    const int fp_span = pos_end - nq * G;
    const int nfp = fp_span > 0 ? cdiv(fp_span, G) : 0;
    const int nU = nq + pq + nfp;
    const int u0 = chunk * P.upc, u1 = min(nU, u0 + P.upc);
    const int m0 = mt * L.MT;
    const int M = min(L.MT, S.n_rows * g - m0);
    if (M <= 0) return;

    float *qs = (float *)(smem + L.off_q);   // [M][Dp] q * softmax_scale * log2(e)
    float *qx = (float *)(smem + L.off_qx);  // [M][Dp] qs * S_c (quantized tiles)
    float *ps = (float *)(smem + L.off_p);   // [M][ttq] scores, then weights
    float *mrun = (float *)(smem + L.off_misc); // [M] running max (log2 domain)
    float *lrun = mrun + MT_MAX;             // [M] running sum
    float *zacc = lrun + MT_MAX;             // [M] running sum of w * Z_t (quantized V)
    float *alph = zacc + MT_MAX;             // [M] this tile's rescale
    float *qz = alph + MT_MAX;               // [M] sum_c qs * Z_c of this tile's block
    uint8_t *stages = smem + L.off_stage;

    // Workspace index of query vector m of this CTA.
    auto pidx = [&](int m) {
        const int mg = m0 + m, r = mg / g, h = kvh * g + mg % g;
        return ((size_t)(seq * P.n_chunks + chunk) * P.max_rows + r) * P.n_q_heads + h;
    };
    if (u0 >= u1) { // NOTE: an empty chunk still tells the merge it holds nothing
        for (int m = tid; m < M; m += NT) {
            P.ws_ml[2 * pidx(m)] = -INFINITY;
            P.ws_ml[2 * pidx(m) + 1] = 0.0f;
        }
        return;
    }

    const int uq = min(max(nq + pq - u0, 0), u1 - u0), uf = (u1 - u0) - uq;
    const int ntq = cdiv(G, L.ttq), ntf = cdiv(G, L.ttf);
    const int n_tiles = uq * ntq + uf * ntf;
    auto tile_get = [&](int k) {
        tile_t tl;
        if (k < uq * ntq) {
            const int u = u0 + k / ntq;
            tl.fp = 0;
            tl.t0 = (k % ntq) * L.ttq;
            tl.rows = min(L.ttq, G - tl.t0);
            tl.block = P.qtab[S.qblock_off + u]; // u == nq: the pre-quantized C_F1
            tl.pos = u * G + tl.t0;
            tl.rmask = u < nq ? 0 : 1;
        } else {
            k -= uq * ntq;
            const int j = u0 + uq + k / ntf - nq - pq;
            tl.fp = 1;
            tl.t0 = (k % ntf) * L.ttf;
            tl.rows = min(L.ttf, G - tl.t0);
            tl.block = P.fptab[S.fpblock_off + j];
            tl.pos = (nq + j) * G + tl.t0;
            tl.rmask = (pq && j == 0) ? 2 : 0;
        }
        tl.tl = min(tl.rows, pos_end - tl.pos);
        return tl;
    };
    // NOTE: whole tile rows are copied (they lie inside the block); only the
    // first tl rows, all below pos_end, are ever read.
    auto issue = [&](int k) {
        const tile_t t = tile_get(k);
        if (t.tl <= 0) return;
        uint8_t *sb = stages + (size_t)(k % NS) * L.stage_bytes;
        const int es = (int)sizeof(T);
        if (MODE == NB_PA_FP_ONLY || t.fp) {
            const size_t ko = nb_kv_fp_offset(&lay, P.layer, t.block, kvh, 0, t.t0) * es;
            const size_t vo = nb_kv_fp_offset(&lay, P.layer, t.block, kvh, 1, t.t0) * es;
            stage_copy(sb + L.o_fk, P.fp + ko, t.rows * D * es);
            stage_copy(sb + L.o_fv, P.fp + vo, t.rows * D * es);
        } else {
            const size_t ko = nb_kv_plane_offset(&lay, P.layer, t.block, kvh, 0, t.t0);
            const size_t vo = nb_kv_plane_offset(&lay, P.layer, t.block, kvh, 1, t.t0);
            const int nb = t.rows * (D / 2);
            stage_copy(sb + L.o_ku, P.upper + ko, nb);
            stage_copy(sb + L.o_vu, P.upper + vo, nb);
            if (MODE == NB_PA_TARGET) { // the draft view never reads the lower plane
                stage_copy(sb + L.o_kl, P.lower + ko, nb);
                stage_copy(sb + L.o_vl, P.lower + vo, nb);
            }
            const uint8_t *sc = P.scales;
            stage_copy(sb + L.o_ks,
                       sc + nb_kv_scales_offset(&lay, P.layer, t.block, kvh, NB_KV_K_SCALE) * es, D * es);
            stage_copy(sb + L.o_kz,
                       sc + nb_kv_scales_offset(&lay, P.layer, t.block, kvh, NB_KV_K_ZERO) * es, D * es);
            stage_copy(sb + L.o_vs,
                       sc + (nb_kv_scales_offset(&lay, P.layer, t.block, kvh, NB_KV_V_SCALE) + t.t0) * es,
                       t.rows * es);
            stage_copy(sb + L.o_vz,
                       sc + (nb_kv_scales_offset(&lay, P.layer, t.block, kvh, NB_KV_V_ZERO) + t.t0) * es,
                       t.rows * es);
        }
    };

#pragma unroll 1
    for (int s = 0; s < NS - 1; s++) {
        if (s < n_tiles) issue(s);
        cp_commit();
    }

    for (int i = tid; i < M * Dp; i += NT) {
        const int m = i / Dp, c = i - m * Dp, mg = m0 + m;
        const int r = mg / g, h = kvh * g + mg % g;
        qs[i] = c < D ? P.q[((size_t)(S.row_off + r) * P.n_q_heads + h) * D + c] * P.scale_log2 : 0.0f;
    }
    for (int m = tid; m < M; m += NT) {
        mrun[m] = -INFINITY;
        lrun[m] = 0.0f;
        zacc[m] = 0.0f;
    }

    // P.V work split: items (channel chunk, 4 query vectors) x token slices.
    const int n_ms = cdiv(M, MR), n_items = n_cch * n_ms;
    const int n_ts = n_items >= NT ? 1 : NT / n_items;
    const int ts = n_items >= NT ? 0 : tid / n_items;
    const bool pv_on = ts < n_ts;
    int item[2];
    item[0] = n_items >= NT ? tid : tid % n_items;
    item[1] = n_items >= NT && tid + NT < n_items ? tid + NT : -1;
    float acc[2][MR][CPT];
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
        for (int a = 0; a < MR; a++)
#pragma unroll
            for (int j = 0; j < CPT; j++) acc[k][a][j] = 0.0f;

#pragma unroll 1
    for (int it = 0; it < n_tiles; it++) {
        cp_wait<NS - 2>();
        __syncthreads(); // tile `it` landed; everyone is done with tile it-1
        if (it + NS - 1 < n_tiles) issue(it + NS - 1);
        cp_commit();
        const tile_t t = tile_get(it);
        if (t.tl <= 0) continue;
        const uint8_t *sb = stages + (size_t)(it % NS) * L.stage_bytes;
        const bool fp = MODE == NB_PA_FP_ONLY || t.fp;
        const int tt = fp ? L.ttf : L.ttq;

        if (QUANT && !fp) { // fold K's per-channel step into q; zero point into qz
            const T *ks = (const T *)(sb + L.o_ks), *kz = (const T *)(sb + L.o_kz);
            for (int m = warp; m < M; m += NT / 32) {
                float z = 0.0f;
                for (int c = lane; c < Dp; c += 32) {
                    float step = 0.0f, zc = 0.0f;
                    if (c < D) {
                        step = ldf<T>(ks + c);
                        if (MODE == NB_PA_TARGET) step *= 0.0625f;
                        zc = ldf<T>(kz + c);
                    }
                    qx[m * Dp + c] = qs[m * Dp + c] * step;
                    z += qs[m * Dp + c] * zc;
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
                if (lane == 0) qz[m] = z;
            }
            __syncthreads();
        }

        // Scores: thread (token t, query-vector class ms); 8 query vectors per pass.
        {
            const float *qsrc = (QUANT && !fp) ? qx : qs;
            const int n_msS = NT / tt, tok = tid % tt, msS = tid / tt;
            if (msS < n_msS && tok < t.tl) {
                const int pos = t.pos + tok;
#pragma unroll 1
                for (int mb = msS; mb < M; mb += n_msS * 8) {
                    float s[8];
#pragma unroll
                    for (int j = 0; j < 8; j++) s[j] = 0.0f;
#pragma unroll(FAST ? 16 : 1)
                    for (int cc = 0; cc < n_cch; cc++) {
                        float kv[8];
                        row8<FAST, T, MODE>(sb, L, fp, false, tok, cc, D, kv);
#pragma unroll
                        for (int j = 0; j < 8; j++) {
                            const int m = mb + j * n_msS;
                            if (m < M) {
                                const float4 *qv = (const float4 *)(qsrc + m * Dp + cc * CPT);
                                const float4 a = qv[0], b = qv[1];
                                s[j] += a.x * kv[0] + a.y * kv[1] + a.z * kv[2] + a.w * kv[3] +
                                        b.x * kv[4] + b.y * kv[5] + b.z * kv[6] + b.w * kv[7];
                            }
                        }
                    }
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const int m = mb + j * n_msS;
                        if (m < M) {
                            const int r = (m0 + m) / g, p = S.pos0 + r;
                            bool ok = pos <= p;
                            if (t.rmask) ok = ok && (row_uses_prequant(p, G, nq, pq) == (t.rmask == 1));
                            ps[m * L.ttq + tok] = ok ? s[j] + ((QUANT && !fp) ? qz[m] : 0.0f) : -INFINITY;
                        }
                    }
                }
            }
        }
        __syncthreads();

        // Online softmax, warp per query vector (tt <= 64: two tokens a lane).
        for (int m = warp; m < M; m += NT / 32) {
            float sv[2], w[2];
            float mx = -INFINITY;
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const int tok = lane + 32 * k;
                sv[k] = tok < t.tl ? ps[m * L.ttq + tok] : -INFINITY;
                mx = fmaxf(mx, sv[k]);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float mold = mrun[m], mnew = fmaxf(mold, mx);
            const float alpha = mnew == -INFINITY ? 1.0f : exp2f(mold - mnew);
            float sum = 0.0f, pz = 0.0f;
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const int tok = lane + 32 * k;
                w[k] = sv[k] == -INFINITY ? 0.0f : exp2f(sv[k] - mnew);
                sum += w[k];
                if (tok < t.tl) {
                    float wv = w[k];
                    if (QUANT && !fp) {
                        float step = ldf<T>((const T *)(sb + L.o_vs) + tok);
                        if (MODE == NB_PA_TARGET) step *= 0.0625f;
                        pz += w[k] * ldf<T>((const T *)(sb + L.o_vz) + tok);
                        wv = w[k] * step;
                    }
                    ps[m * L.ttq + tok] = wv;
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
                pz += __shfl_xor_sync(0xffffffffu, pz, o);
            }
            __syncwarp();
            if (lane == 0) {
                mrun[m] = mnew;
                lrun[m] = lrun[m] * alpha + sum;
                zacc[m] = zacc[m] * alpha + pz;
                alph[m] = alpha;
            }
        }
        __syncthreads();

        // P.V into registers.
        if (pv_on) {
#pragma unroll
            for (int k = 0; k < 2; k++) {
                if (item[k] < 0) continue;
                const int cc = item[k] % n_cch, mb = (item[k] / n_cch) * MR;
#pragma unroll
                for (int a = 0; a < MR; a++) {
                    const float al = mb + a < M ? alph[mb + a] : 1.0f;
#pragma unroll
                    for (int j = 0; j < CPT; j++) acc[k][a][j] *= al;
                }
#pragma unroll 2
                for (int tok = ts; tok < t.tl; tok += n_ts) {
                    float vv[8];
                    row8<FAST, T, MODE>(sb, L, fp, true, tok, cc, D, vv);
#pragma unroll
                    for (int a = 0; a < MR; a++) {
                        if (mb + a < M) {
                            const float w = ps[(mb + a) * L.ttq + tok];
#pragma unroll
                            for (int j = 0; j < CPT; j++) acc[k][a][j] += w * vv[j];
                        }
                    }
                }
            }
        }
    }
    cp_wait<0>();
    __syncthreads();

    // Reduce the token slices through shared memory (the stage area is free).
    float *red = (float *)stages; // [n_ts][M][Dp]
    if (pv_on) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            if (item[k] < 0) continue;
            const int cc = item[k] % n_cch, mb = (item[k] / n_cch) * MR;
#pragma unroll
            for (int a = 0; a < MR; a++)
                if (mb + a < M)
#pragma unroll
                    for (int j = 0; j < CPT; j++)
                        red[((size_t)ts * M + mb + a) * Dp + cc * CPT + j] = acc[k][a][j];
        }
    }
    __syncthreads();
    for (int i = tid; i < M * D; i += NT) {
        const int m = i / D, c = i - m * D;
        float o = QUANT ? zacc[m] : 0.0f;
        for (int s = 0; s < n_ts; s++) o += red[((size_t)s * M + m) * Dp + c];
        const size_t pi = pidx(m);
        if (P.n_chunks == 1) {
            const int mg = m0 + m, r = mg / g, h = kvh * g + mg % g;
            pa_out(P, ((size_t)(S.row_off + r) * P.n_q_heads + h) * D + c, o / lrun[m]);
        } else {
            P.ws_o[pi * D + c] = o;
            if (c == 0) {
                P.ws_ml[2 * pi] = mrun[m];
                P.ws_ml[2 * pi + 1] = lrun[m];
            }
        }
    }
}

// Log-sum-exp merge of the chunks' partials: one CTA per (q head, row, seq).
// The chunks are split between MNT/(D/4) thread groups (float4 columns of o
// when D % 4 == 0); the groups are then summed through shared memory in a
// fixed order (deterministic). Up to 8 chunks per group (64 at D = 128: the
// engine's max_chunks) are loaded in one round, together with the values
// the maximum needs; more take a few rounds of independent loads. Measured
// on an H100 (docs/benchmarks.md, session 18): the merge after the decode
// grid's end took 2.3-4.3 us with the rounds (a dependent load per chunk
// and per maximum), 1.5-2.8 us in one round.
constexpr int MNT = 256;
#ifdef NB_PA_TRACE
// Diagnostic builds: thread 0 of merge CTA i records %globaltimer at entry,
// after griddepcontrol.wait and at its end in g_pa_mtrace[3i ..]; slot
// 3 * MTRACE_MAX holds the time of nb_pa_trace_marker's kernel.
constexpr int MTRACE_MAX = 4096;
__device__ unsigned long long g_pa_mtrace[MTRACE_MAX * 3 + 1];
__device__ __forceinline__ void mtrace(int k) {
    const unsigned bl = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (threadIdx.x == 0 && bl < MTRACE_MAX) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
        g_pa_mtrace[bl * 3 + k] = t;
    }
}
__global__ void pa_trace_marker_kernel() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    g_pa_mtrace[MTRACE_MAX * 3] = t;
}
#define MTRACE(k) mtrace(k)
#else
#define MTRACE(k) ((void)0)
#endif
__global__ void __launch_bounds__(MNT) pa_merge_kernel(const pa_kp P) {
    constexpr int MK = 8; // chunks per thread group held in registers (the one-round path)
    __shared__ float red[MNT * 4];
    __shared__ float wmax[MNT / 32];
    __shared__ float lgrp[MNT];
    const int h = blockIdx.x, r = blockIdx.y, seq = blockIdx.z, tid = threadIdx.x;
    const nb_pa_seq S = P.seqs[seq];
    if (r >= S.n_rows) return;
    MTRACE(0);
    // Launched as a programmatic dependent of the decode kernel (see
    // launch_merge): the partials are read only once that grid is complete.
    nb_pdl::wait();
    // The next kernel, when launched with the attribute (a quantized
    // matmul reading out_cvt), may start its weight stream now; it reads
    // the output only after its own wait for this grid.
    nb_pdl::trigger();
    MTRACE(1);
    const int D = P.pl.D, n = P.n_chunks;
    const size_t stride = (size_t)P.max_rows * P.n_q_heads;
    const size_t base = ((size_t)seq * n * P.max_rows + r) * P.n_q_heads + h;
    const int vec = (D % 4 == 0) ? 4 : 1, dv = D / vec;
    const int ng = dv >= MNT ? 1 : MNT / dv;
    // One round of loads when every group's chunks fit in registers (n <=
    // ng * MK: 64 chunks at D = 128): each thread loads the (max, sum) of
    // chunk tid for the maximum and, with it, the (max, sum) and float4 of o
    // of its group's chunks, so no load waits for the maximum. Otherwise
    // the maximum first, then the chunks in rounds. The same arithmetic in
    // the same order either way (bit-identical results).
    const bool one_round = !P.merge_rounds && vec == 4 && n <= ng * MK;
    float2 mlv[MK];
    float4 ov[MK];
    float mx = -INFINITY;
    if (one_round) {
        const int grp = tid / dv, d4 = tid % dv;
        if (tid < n) {
            const float2 m = *(const float2 *)(P.ws_ml + 2 * (base + tid * stride));
            if (m.y > 0.0f) mx = m.x;
        }
#pragma unroll
        for (int k = 0; k < MK; k++) {
            const int c = grp + k * ng;
            mlv[k] = make_float2(-INFINITY, 0.0f);
            if (grp < ng && c < n) {
                const size_t i = base + c * stride;
                mlv[k] = *(const float2 *)(P.ws_ml + 2 * i);
                ov[k] = *(const float4 *)(P.ws_o + i * D + 4 * d4);
            }
        }
    } else {
        for (int c = tid; c < n; c += MNT) {
            const size_t i = base + c * stride;
            if (P.ws_ml[2 * i + 1] > 0.0f) mx = fmaxf(mx, P.ws_ml[2 * i]);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((tid & 31) == 0) wmax[tid >> 5] = mx;
    __syncthreads();
    mx = wmax[0];
#pragma unroll
    for (int w = 1; w < MNT / 32; w++) mx = fmaxf(mx, wmax[w]);

    const size_t out0 = ((size_t)(S.row_off + r) * P.n_q_heads + h) * D;
    float lsum = 0.0f;
    if (vec == 4) { // D % 4 == 0: float4 columns
        const int grp = tid / dv, d4 = tid % dv;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (grp < ng) {
            if (one_round) {
#pragma unroll
                for (int k = 0; k < MK; k++) {
                    const float li = mlv[k].y;
                    if (li > 0.0f) {
                        const float f = exp2f(mlv[k].x - mx);
                        o.x = fmaf(ov[k].x, f, o.x);
                        o.y = fmaf(ov[k].y, f, o.y);
                        o.z = fmaf(ov[k].z, f, o.z);
                        o.w = fmaf(ov[k].w, f, o.w);
                        lsum = fmaf(li, f, lsum);
                    }
                }
            } else {
#pragma unroll 4
                for (int c = grp; c < n; c += ng) {
                    const size_t i = base + c * stride;
                    const float li = P.ws_ml[2 * i + 1];
                    if (li > 0.0f) {
                        const float f = exp2f(P.ws_ml[2 * i] - mx);
                        const float4 v = *(const float4 *)(P.ws_o + i * D + 4 * d4);
                        o.x = fmaf(v.x, f, o.x);
                        o.y = fmaf(v.y, f, o.y);
                        o.z = fmaf(v.z, f, o.z);
                        o.w = fmaf(v.w, f, o.w);
                        lsum = fmaf(li, f, lsum);
                    }
                }
            }
            *(float4 *)(red + 4 * (grp * dv + d4)) = o;
            if (d4 == 0) lgrp[grp] = lsum;
        }
    } else {
        for (int d = tid; d < D; d += MNT) {
            float o = 0.0f, l = 0.0f;
            for (int c = 0; c < n; c++) {
                const size_t i = base + c * stride;
                const float li = P.ws_ml[2 * i + 1];
                if (li > 0.0f) {
                    const float f = exp2f(P.ws_ml[2 * i] - mx);
                    o = fmaf(P.ws_o[i * D + d], f, o);
                    l = fmaf(li, f, l);
                }
            }
            pa_out(P, out0 + d, o / l);
        }
        return;
    }
    __syncthreads();
    float l = 0.0f;
    for (int g2 = 0; g2 < ng; g2++) l += lgrp[g2];
    const float inv = 1.0f / l;
    for (int d = tid; d < D; d += MNT) {
        float o = 0.0f;
        for (int g2 = 0; g2 < ng; g2++) o += red[g2 * D + d];
        pa_out(P, out0 + d, o * inv);
    }
    MTRACE(2);
}

// pa_merge_kernel on (q head, row, seq), launched with programmatic stream
// serialization (unless NB_PA_PDL=0): its CTAs may be scheduled while the
// decode kernel's last CTAs finish, and wait in griddepcontrol.wait. The
// same bits either way.
cudaError_t launch_merge(pa_kp &kp, const nb_pa_args *a, cudaStream_t stream) {
    static int pdl = -1;
    const char *mr = getenv("NB_PA_MERGE_ROUNDS"); // read per call (tests)
    kp.merge_rounds = mr && mr[0] == '1';
    const dim3 grid((unsigned)a->n_q_heads, (unsigned)a->max_rows, (unsigned)a->n_seqs);
    const cudaError_t e =
        nb_pdl::launch(pa_merge_kernel, grid, dim3(MNT), 0, stream, nb_pdl::env_switch_once("NB_PA_PDL", true, &pdl), kp);
    return e != cudaSuccess ? e : cudaGetLastError();
}

// ---- decode kernel: few query vectors per kv head (decode, short verify) ----
//
// The one idea: a warp owns slices of 32 consecutive tokens of a block and
// streams them straight from global memory, no shared-memory staging. For
// the scores lane t owns token t of the slice (its whole K row, 16-byte
// loads; q from shared memory, one broadcast float4 per 4 channels), so
// no cross-lane reduction is needed; for P.V lanes split D into 8-channel
// words (LPT lanes per token, TPS tokens per step) and read V rows with
// coalesced 4-byte (plane) or 16-byte (FP) loads, the weights coming back
// through a per-warp shared-memory row. The running max is warp-uniform;
// the sums (l, the V zero term) stay per lane and are reduced once at the
// end. The 4 warps of a CTA split the chunk's slices and merge through
// shared memory; chunks write partials for pa_merge_kernel as before.
// Quantized blocks cost few instructions per byte (the kernel is issue-bound
// otherwise): scores are integer dot products (dp4a) of the code bytes with
// q*S_c quantized per block into two int8 parts (hi on max|q*S_c|/127, lo
// on a 254x finer step: ~15 bits, exact integer sums, one scale each); the
// draft's P.V converts a nibble to 0.5 + U/256 in one AND and one byte
// permute and removes the 0.5 through the sum of the weights at the end; V
// words are loaded with K, so a slice waits for memory once; plane and
// scale offsets are set once per unit; decode shapes (M <= 2) run the P.V
// steps without a per-token branch. The draft instance is held to 128
// registers (4 CTAs per SM), which measured faster than 167 at 3 (also with
// a next-slice prefetch in registers, session 11: docs/benchmarks.md).

constexpr int DNW = 4;            // warps per decode CTA
constexpr int DNT = DNW * 32;
constexpr int DEC_MMAX = 8;       // query vectors per kv head the decode kernel takes

__device__ __forceinline__ uint4 ldg16(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
// K rows: lanes read 16-byte pieces of 32- or 64-byte sectors that their
// next load also touches, so let L1 keep them.
__device__ __forceinline__ uint4 ldg16_l1(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
__device__ __forceinline__ uint32_t ldg4(const void *p) {
    uint32_t r;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
}

// 8 channels of an FP row (one 16-byte word) as floats.
template <typename T> __device__ __forceinline__ void fpw8(const uint4 w, float v[8]) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (std::is_same<T, __half>::value) {
            const float2 f = __half22float2(*(const __half2 *)&ws[i]);
            v[2 * i] = f.x;
            v[2 * i + 1] = f.y;
        } else {
            v[2 * i] = __uint_as_float(ws[i] << 16);
            v[2 * i + 1] = __uint_as_float(ws[i] & 0xFFFF0000u);
        }
    }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// s[m] += dot(q[m][c0 .. c0+7], v[0..7]) with q rows of D floats in shared memory.
template <int M, int D>
__device__ __forceinline__ void dot8(float (&s)[M], const float *q, int c0, const float v[8]) {
#pragma unroll
    for (int m = 0; m < M; m++) {
        const float4 a = *(const float4 *)(q + m * D + c0), b = *(const float4 *)(q + m * D + c0 + 4);
        s[m] = fmaf(a.x, v[0], s[m]);
        s[m] = fmaf(a.y, v[1], s[m]);
        s[m] = fmaf(a.z, v[2], s[m]);
        s[m] = fmaf(a.w, v[3], s[m]);
        s[m] = fmaf(b.x, v[4], s[m]);
        s[m] = fmaf(b.y, v[5], s[m]);
        s[m] = fmaf(b.z, v[6], s[m]);
        s[m] = fmaf(b.w, v[7], s[m]);
    }
}

// c += dot of 4 unsigned code bytes of a with 4 signed bytes of b.
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// Code bytes of one 4-byte word of the planes: e = channels 8w+0,2,4,6 and
// o = channels 8w+1,3,5,7, one code per byte (draft: U; target: 16U + L, the
// -8 of C8 applied by the caller).
template <bool TGT> __device__ __forceinline__ void code_bytes(uint32_t up, uint32_t lo, uint32_t &e, uint32_t &o) {
    if (TGT) {
        e = ((up & 0x0F0F0F0Fu) << 4) | (lo & 0x0F0F0F0Fu);
        o = (up & 0xF0F0F0F0u) | ((lo >> 4) & 0x0F0F0F0Fu);
    } else {
        e = up & 0x0F0F0F0Fu;
        o = (up >> 4) & 0x0F0F0F0Fu;
    }
}

// 8 draft channels as 0.5 + U/256 = (1 + U/128) / 2 (exact): the nibble
// becomes mantissa bits 16-19 of 0.5f in one byte permute per value (byte 2
// is 0000UUUU, byte 3 0x3F), no add and no OR. Callers remove the 0.5
// through the sum of the weights (see pa_decode_kernel's P.V).
__device__ __forceinline__ void draft8_h(uint32_t up, float v[8]) {
    const uint32_t e = up & 0x0F0F0F0Fu, o = (up >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int b = 0; b < 4; b++) {
        v[2 * b] = __uint_as_float(__byte_perm(e, 0x3F000000u, 0x7044u | (b << 8)));
        v[2 * b + 1] = __uint_as_float(__byte_perm(o, 0x3F000000u, 0x7044u | (b << 8)));
    }
}

// M weights of one token from the warp's row (16-byte reads when M % 4 == 0).
template <int M> __device__ __forceinline__ void ld_w(float (&w)[M], const float *p) {
    if constexpr (M % 4 == 0) {
#pragma unroll
        for (int i = 0; i < M / 4; i++) {
            const float4 v = *(const float4 *)(p + 4 * i);
            w[4 * i] = v.x;
            w[4 * i + 1] = v.y;
            w[4 * i + 2] = v.z;
            w[4 * i + 3] = v.w;
        }
    } else if constexpr (M == 2) {
        const float2 v = *(const float2 *)p;
        w[0] = v.x;
        w[1] = v.y;
    } else {
        w[0] = p[0];
    }
}

// The CTA merge's scratch (dec_cta_merge_at): per query vector NW factors,
// the merged sum and the output base, padded to 16 bytes.
template <int NW> __device__ __host__ constexpr int dec_merge_fx_stride() { return (NW + 3 + 3) & ~3; }
template <int NW, int M> __device__ __host__ constexpr int dec_merge_fx_floats() { return M * dec_merge_fx_stride<NW>(); }

template <int D, int M> struct dec_smem {
    static constexpr int q = 0;                        // [M][D] q * scale * log2e
    static constexpr int qx = q + M * D * 4;           // [DNW][M][D/8][4] int8 words of q * S_c (warp's block)
    static constexpr int w = qx + DNW * M * D * 4;     // [DNW][32][M] weights of the warp's slice
    static constexpr int mo = w + DNW * 32 * M * 4;    // [DNW][M][D] warp partial outputs
    static constexpr int ml = mo + DNW * M * D * 4;    // [DNW][M][2] warp (max, sum)
    static constexpr int fx = (ml + DNW * M * 2 * 4 + 15) & ~15; // the CTA merge's scratch
    static constexpr int bytes = fx + dec_merge_fx_floats<DNW, M>() * 4;
};

// Index of query vector m's partial (o, max, sum) of this chunk in the
// workspace, for a decode CTA of (chunk, kv head, sequence).
__device__ __forceinline__ size_t dec_pidx(const pa_kp &P, int seq, int chunk, int kvh, int m) {
    const int r = m / P.g, h = kvh * P.g + m % P.g;
    return ((size_t)(seq * P.n_chunks + chunk) * P.max_rows + r) * P.n_q_heads + h;
}

// Where channel c of query vector m sits in a row of mo: c itself, or for
// the tensor-core kernel (SWZ) c with bits 0-3 XOR-ed by (c >> 5) & 3 and
// (m >> 1) & 3, so that its fragment-order stores hit 32 distinct banks
// (the merge's reads of 32 consecutive c stay a permutation of one row span).
template <bool SWZ> __device__ __forceinline__ int mo_col(int m, int c) {
    return SWZ ? c ^ ((((c >> 5) & 3) << 2) | ((m >> 1) & 3)) : c;
}

// The NW warps of a decode CTA merge their partials (both decode kernels):
// mo [NW][M][D] unnormalized outputs (columns placed by mo_col<SWZ>) and
// mlp [NW][M][2] (max, sum) in shared memory, written before a
// __syncthreads. Writes the normalized output when the call has one
// batch-tuned chunk, else the chunk's partial for pa_merge_kernel. Merged
// in a fixed warp order (deterministic).
// dec_cta_merge_at reads warp w's row m through mo_at(w, m) (its D outputs,
// columns placed by mo_col<SWZ>) and ml_at(w, m) (its max, sum); fx is
// scratch shared memory of dec_merge_fx_floats<NW, M>() floats (16-byte
// aligned) that nothing else reads or writes during the call; last: the
// CTA's last chunk (the merge kernel may then be scheduled).
//
// Two passes. First, per query vector (one thread each): the warps' max,
// each warp's factor exp2(m_w - max) (-1 for a warp with no sum, which
// adds nothing), the merged sum, and where the vector's outputs go. Then,
// per output: the factors' weighted sum of the warps' outputs. The same
// terms in the same order as one pass that did all of it per output
// (sessions 45-46), so the same bits; but the per-vector work (16 shared
// loads, the max, 8 exponentials, an integer division for the address)
// ran once per output there: at a three-tile verify CTA's 20 vectors x 128
// outputs that loop took ~10% of the kernel's instructions (session 47).
template <int NW, int M, int D, bool SWZ, typename MO, typename ML>
__device__ __forceinline__ void dec_cta_merge_at(const pa_kp &P, const nb_pa_seq &S, int seq, int chunk, int kvh,
                                                 int Mt, MO mo_at, ML ml_at, float *fx, bool last) {
    // Every load of the chunk is done: the merge kernel may be scheduled
    // (it waits for this grid to complete before it reads a partial).
    if (last) nb_pdl::trigger();
    constexpr int FS = dec_merge_fx_stride<NW>(); // per vector: NW factors, the sum, the output base (2 words)
    const int g = P.g;
    const bool single = P.n_chunks == 1 && !P.inv;
    for (int m = threadIdx.x; m < Mt; m += NW * 32) {
        float mw[NW], lw[NW];
#pragma unroll
        for (int w = 0; w < NW; w++) {
            mw[w] = ml_at(w, m)[0];
            lw[w] = ml_at(w, m)[1];
        }
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; w++) mx = lw[w] > 0.0f ? fmaxf(mx, mw[w]) : mx;
        float l = 0.0f;
        float *fm = fx + m * FS;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const float f = exp2f(mw[w] - mx); // NaN or 0 where lw[w] <= 0: not used
            l = lw[w] > 0.0f ? fmaf(lw[w], f, l) : l;
            fm[w] = lw[w] > 0.0f ? f : -1.0f;
        }
        fm[NW] = l;
        size_t base;
        if (single) {
            base = ((size_t)(S.row_off + m / g) * P.n_q_heads + kvh * g + m % g) * D;
        } else {
            const size_t pi = dec_pidx(P, seq, chunk, kvh, m);
            base = pi * D;
            P.ws_ml[2 * pi] = mx;
            P.ws_ml[2 * pi + 1] = l;
        }
        fm[NW + 1] = __int_as_float((int)(uint32_t)base);
        fm[NW + 2] = __int_as_float((int)(uint32_t)(base >> 32));
    }
    __syncthreads();
    for (int i = threadIdx.x; i < Mt * D; i += NW * 32) {
        const int m = i / D, c = i - m * D;
        const float *fm = fx + m * FS;
        float ow[NW], f[NW];
        if constexpr (NW % 4 == 0) {
#pragma unroll
            for (int w = 0; w < NW; w += 4) *(float4 *)(f + w) = *(const float4 *)(fm + w);
        } else {
#pragma unroll
            for (int w = 0; w < NW; w++) f[w] = fm[w];
        }
        // NOTE: every warp's output is loaded first and its term selected,
        // not branched to: with a load inside a branch per warp the terms
        // ran one after another (session 45).
#pragma unroll
        for (int w = 0; w < NW; w++) ow[w] = mo_at(w, m)[mo_col<SWZ>(m, c)];
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) o = !(f[w] < 0.0f) ? fmaf(ow[w], f[w], o) : o; // -1: a warp with no sum
        const size_t base = (size_t)(uint32_t)__float_as_int(fm[NW + 1]) |
                            ((size_t)(uint32_t)__float_as_int(fm[NW + 2]) << 32);
        if (single) pa_out(P, base + c, o / fm[NW]);
        else P.ws_o[base + c] = o;
    }
}
template <int NW, int M, int D, bool SWZ = false>
__device__ __forceinline__ void dec_cta_merge(const pa_kp &P, const nb_pa_seq &S, int seq, int chunk, int kvh,
                                              int Mt, const float *mo, const float *mlp, float *fx) {
    dec_cta_merge_at<NW, M, D, SWZ>(
        P, S, seq, chunk, kvh, Mt, [&](int w, int m) { return mo + (w * M + m) * D; },
        [&](int w, int m) { return mlp + 2 * (w * M + m); }, fx, true);
}

// An empty chunk still tells the merge it holds nothing.
__device__ __forceinline__ void dec_empty_chunk(const pa_kp &P, int seq, int chunk, int kvh, int Mt) {
    for (int m = threadIdx.x; m < Mt; m += blockDim.x) {
        const size_t pi = dec_pidx(P, seq, chunk, kvh, m);
        P.ws_ml[2 * pi] = -INFINITY;
        P.ws_ml[2 * pi + 1] = 0.0f;
    }
}

template <int D, typename T, int MODE, int M>
__global__ void __launch_bounds__(DNT, (M == 1 && MODE == NB_PA_DRAFT ? 4 : 1)) pa_decode_kernel(const pa_kp P) {
    constexpr bool QUANT = MODE != NB_PA_FP_ONLY;
    constexpr bool TGT = MODE == NB_PA_TARGET;
    constexpr int RB = D / 2;          // plane bytes per token row
    constexpr int LPT = D / 8;         // P.V lanes per token (8 channels each)
    constexpr int TPS = 32 / LPT;      // tokens per P.V step
    constexpr int NSTEP = 32 / TPS;    // P.V steps per 32-token slice
    using SM = dec_smem<D, M>;
    extern __shared__ __align__(16) uint8_t smem[];
    float *qs = (float *)(smem + SM::q);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // q * S_c of the warp's current quantized block as two int8 parts,
    // q*S_c ~= qsh*H + qsl*L: word (m, w) = {H even, H odd, L even, L odd}
    // channels of 8w..8w+7, in the byte order of code_bytes.
    uint4 *qx = (uint4 *)(smem + SM::qx) + warp * M * (D / 8);
    float *wsm = (float *)(smem + SM::w) + warp * 32 * M;
    const int ts = lane / LPT, cp = lane % LPT;

    const nb_kv_layout lay = P.lay;
    const int G = lay.group_size, g = P.g;
    const int chunk = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z;
    const nb_pa_seq S = P.seqs[seq];
    const int nq = QUANT ? S.n_qblocks : 0, pq = QUANT ? (S.has_prequant != 0) : 0;
    const int pos_end = S.pos0 + S.n_rows;
    const int fp_span = pos_end - nq * G;
    const int nfp = fp_span > 0 ? cdiv(fp_span, G) : 0;
    const int nU = nq + pq + nfp;
    // Unit-based split: chunk = units [u0, u1). Row-invariant split: chunk =
    // groups [chunk*upc, (chunk+1)*upc) by POSITION, so a row's partials do
    // not depend on nq/pq bookkeeping, pos_end or the other rows.
    const int u0 = P.inv ? 0 : chunk * P.upc;
    const int u1 = P.inv ? ((long)chunk * P.upc * G < pos_end ? 1 : 0) : min(nU, u0 + P.upc);
    const int Mt = S.n_rows * g; // <= M
    if (u0 >= u1) {
        dec_empty_chunk(P, seq, chunk, kvh, Mt);
        return;
    }
    for (int i = tid; i < M * D; i += DNT) {
        const int m = i / D, c = i - m * D;
        qs[i] = m < Mt ? P.q[((size_t)(S.row_off + m / g) * P.n_q_heads + kvh * g + m % g) * D + c] *
                             P.scale_log2
                       : 0.0f;
    }
    __syncthreads();

    float mrun[M], lsum[M], zsum[M], acc[M][8];
#pragma unroll
    for (int m = 0; m < M; m++) {
        mrun[m] = -INFINITY;
        lsum[m] = 0.0f;
        zsum[m] = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) acc[m][j] = 0.0f;
    }
    float qz[M], qsh[M], qsl[M]; // zero term and int8-pair steps of the current block
    int qbh[M], qbl[M];          // target: -8 * sum of each part
#pragma unroll
    for (int m = 0; m < M; m++) {
        qz[m] = qsh[m] = qsl[m] = 0.0f;
        qbh[m] = qbl[m] = 0;
    }
    float wsum[M]; // draft P.V: sum of the weights each lane applied (the 0.5 of 0.5 + U/256)
#pragma unroll
    for (int m = 0; m < M; m++) wsum[m] = 0.0f;

    const int spu = G / 32; // slices per unit (G % 32 == 0 on this path)
    // Row-invariant: the warp's slices are a fixed share of the chunk's
    // nominal groups (independent of where the sequence ends).
    const int n_sl = (P.inv ? P.upc : u1 - u0) * spu;
    const int k0 = warp * n_sl / DNW, k1 = (warp + 1) * n_sl / DNW;
    int cur_u = -1, blk = 0, upos = 0, ntok = 0, rmask = 0;
    bool ufp = true;
    const size_t es = sizeof(T);
    // The current unit's K plane (bytes, quantized) or K rows (elements, FP)
    // and scales record: set once per unit, so a slice only adds its token.
    size_t ubase = 0, sbase = 0;
    // Each query vector's row position, and whether it reads the
    // pre-quantized C_F1: fixed for the CTA, so for M <= 2 computed once
    // (no division per slice); more vectors recompute them (registers).
    constexpr bool PRE = M <= 2;
    int prow[PRE ? M : 1];
    bool rpq[PRE ? M : 1];
#pragma unroll
    for (int m = 0; m < (PRE ? M : 1); m++) {
        prow[m] = S.pos0 + m / g;
        rpq[m] = row_uses_prequant(prow[m], G, nq, pq);
    }

#pragma unroll 1
    for (int k = k0; k < k1; k++) {
      const int t0 = (k % spu) * 32;
      int ub, nrep = 1;
      if (P.inv) { // group gi; group nq with a pre-quantized C_F1 has two sources, in a fixed order
          const int gi = chunk * P.upc + k / spu;
          if (gi * G >= pos_end) break;
          ub = gi < nq ? gi : gi + pq;
          if (pq && gi == nq) { ub = nq; nrep = 2; }
      } else {
          ub = u0 + k / spu;
      }
#pragma unroll 1
      for (int rep = 0; rep < nrep; rep++) {
        const int u = ub + rep;
        if (u != cur_u) { // warp-uniform
            cur_u = u;
            if (u < nq + pq) {
                ufp = false;
                blk = P.qtab[S.qblock_off + u]; // u == nq: the pre-quantized C_F1
                upos = u * G;
                rmask = u < nq ? 0 : 1;
            } else {
                const int j = u - nq - pq;
                ufp = true;
                blk = P.fptab[S.fpblock_off + j];
                upos = (nq + j) * G;
                rmask = (pq && j == 0) ? 2 : 0;
            }
            ntok = min(G, pos_end - upos);
            if (ufp) {
                ubase = nb_kv_fp_offset(&lay, P.layer, blk, kvh, 0, 0);
            } else {
                ubase = nb_kv_plane_offset(&lay, P.layer, blk, kvh, 0, 0);
                sbase = nb_kv_scales_offset(&lay, P.layer, blk, kvh, NB_KV_K_SCALE);
            }
            if (QUANT && !ufp && ntok > 0) { // fold K's per-channel step into q, as int8 pairs
                const T *ks = (const T *)P.scales + sbase;
                const T *kz = ks + D;
                __syncwarp();
                float xv[M][D / 32], amax[M];
#pragma unroll
                for (int m = 0; m < M; m++) qz[m] = amax[m] = 0.0f;
#pragma unroll
                for (int i = 0; i < D / 32; i++) {
                    const int c = lane + 32 * i;
                    float st = ldf<T>(ks + c);
                    if (TGT) st *= 0.0625f;
                    const float zc = ldf<T>(kz + c);
#pragma unroll
                    for (int m = 0; m < M; m++) {
                        xv[m][i] = qs[m * D + c] * st;
                        amax[m] = fmaxf(amax[m], fabsf(xv[m][i]));
                        qz[m] = fmaf(qs[m * D + c], zc, qz[m]);
                    }
                }
                int8_t *qb = (int8_t *)qx;
#pragma unroll
                for (int m = 0; m < M; m++) {
                    qz[m] = warp_sum(qz[m]);
                    amax[m] = warp_max(amax[m]);
                    // H in [-127, 127] on a step of amax/127, then the
                    // residual (|r| <= step/2) on a step 254 times finer.
                    qsh[m] = amax[m] * (1.0f / 127.0f);
                    qsl[m] = qsh[m] * (1.0f / 254.0f);
                    const float ih = amax[m] > 0.0f ? 127.0f / amax[m] : 0.0f, il = ih * 254.0f;
                    int sh = 0, sl = 0;
#pragma unroll
                    for (int i = 0; i < D / 32; i++) {
                        const int c = lane + 32 * i;
                        const float h = fminf(fmaxf(rintf(xv[m][i] * ih), -127.0f), 127.0f);
                        const float l = fminf(fmaxf(rintf(fmaf(-h, qsh[m], xv[m][i]) * il), -127.0f), 127.0f);
                        const int off = (m * (D / 8) + (c >> 3)) * 16 + (c & 1) * 4 + ((c & 7) >> 1);
                        qb[off] = (int8_t)h;
                        qb[off + 8] = (int8_t)l;
                        sh += (int)h;
                        sl += (int)l;
                    }
                    if (TGT) { // the -8 of C8 = 16U + L - 8, exactly, on the quantized q
#pragma unroll
                        for (int o = 16; o > 0; o >>= 1) {
                            sh += __shfl_xor_sync(0xffffffffu, sh, o);
                            sl += __shfl_xor_sync(0xffffffffu, sl, o);
                        }
                        qbh[m] = -8 * sh;
                        qbl[m] = -8 * sl;
                    }
                }
                __syncwarp();
            }
        }
        const int tl = min(32, ntok - t0);
        if (tl <= 0) continue;
        const bool tv = lane < tl;
        const int pos = upos + t0 + lane;

        // ---- scores: lane = token ----
        float sc[M], sd[M]; // two chains per query vector (even / odd 8-channel words)
#pragma unroll
        for (int m = 0; m < M; m++) sc[m] = sd[m] = 0.0f;
        float vstep = 1.0f, vzero = 0.0f;
        // V words of this slice for P.V, loaded with K so that one memory
        // latency, not two, separates a slice's loads from its math.
        uint32_t vu[QUANT ? NSTEP : 1], vl[TGT ? NSTEP : 1];
        if (QUANT && !ufp) {
            {
                const size_t voff = ubase + (size_t)(G + t0) * RB + cp * 4; // V plane follows K's
                const uint8_t *vrow = P.upper + voff;
                const uint8_t *vlrow = TGT ? P.lower + voff : nullptr;
#pragma unroll
                for (int s = 0; s < NSTEP; s++) {
                    const int tok = s * TPS + ts;
                    vu[s] = tok < tl ? ldg4(vrow + tok * RB) : 0u;
                    if (TGT) vl[s] = tok < tl ? ldg4(vlrow + tok * RB) : 0u;
                }
            }
            const size_t koff = ubase + (size_t)(t0 + lane) * RB;
            const uint8_t *krow = P.upper + koff;
            uint4 ku[RB / 16], kl[TGT ? RB / 16 : 1];
            if (tv) {
#pragma unroll
                for (int i = 0; i < RB / 16; i++) ku[i] = ldg16_l1(krow + 16 * i);
                if (TGT) {
                    const uint8_t *lrow = P.lower + koff;
#pragma unroll
                    for (int i = 0; i < RB / 16; i++) kl[i] = ldg16_l1(lrow + 16 * i);
                }
                const T *vsp = (const T *)P.scales + sbase + 2 * D; // record: K step, K zero, V step, V zero
                const T *vzp = vsp + G;
                vstep = ldf<T>(vsp + t0 + lane);
                if (TGT) vstep *= 0.0625f;
                vzero = ldf<T>(vzp + t0 + lane);
            } else {
#pragma unroll
                for (int i = 0; i < RB / 16; i++) ku[i] = make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int i = 0; i < (TGT ? RB / 16 : 1); i++) kl[i] = make_uint4(0, 0, 0, 0);
            }
            // Integer dot products of the code bytes with the int8 parts of
            // q*S_c: exact sums, scaled once.
            int ah[M], al[M];
#pragma unroll
            for (int m = 0; m < M; m++) {
                ah[m] = TGT ? qbh[m] : 0;
                al[m] = TGT ? qbl[m] : 0;
            }
#pragma unroll
            for (int i = 0; i < RB / 16; i++) {
                const uint32_t uw[4] = {ku[i].x, ku[i].y, ku[i].z, ku[i].w};
                const uint32_t lw[4] = {kl[TGT ? i : 0].x, kl[TGT ? i : 0].y, kl[TGT ? i : 0].z,
                                        kl[TGT ? i : 0].w};
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    uint32_t e, o;
                    code_bytes<TGT>(uw[w], lw[w], e, o);
#pragma unroll
                    for (int m = 0; m < M; m++) {
                        const uint4 qq = qx[m * (D / 8) + i * 4 + w];
                        ah[m] = dp4a_us(e, qq.x, ah[m]);
                        ah[m] = dp4a_us(o, qq.y, ah[m]);
                        al[m] = dp4a_us(e, qq.z, al[m]);
                        al[m] = dp4a_us(o, qq.w, al[m]);
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < M; m++) sc[m] = fmaf(qsh[m], (float)ah[m], fmaf(qsl[m], (float)al[m], qz[m]));
        } else {
            const uint8_t *krow = P.fp + (ubase + (size_t)(t0 + lane) * D) * es;
            uint4 kf[D / 8];
#pragma unroll
            for (int i = 0; i < D / 8; i++) kf[i] = tv ? ldg16_l1(krow + 16 * i) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int i = 0; i < D / 8; i++) {
                float kv[8];
                fpw8<T>(kf[i], kv);
                if (i & 1) dot8<M, D>(sd, qs, i * 8, kv);
                else dot8<M, D>(sc, qs, i * 8, kv);
            }
#pragma unroll
            for (int m = 0; m < M; m++) sc[m] += sd[m];
        }

        // ---- online softmax (max warp-uniform, sums per lane) ----
#pragma unroll
        for (int m = 0; m < M; m++) {
            bool ok = tv && m < Mt;
            if (PRE) {
                ok = ok && pos <= prow[PRE ? m : 0];
                if (rmask) ok = ok && (rpq[PRE ? m : 0] == (rmask == 1));
            } else if (ok) {
                const int p = S.pos0 + m / g;
                ok = pos <= p;
                if (rmask) ok = ok && (row_uses_prequant(p, G, nq, pq) == (rmask == 1));
            }
            const float s = ok ? sc[m] : -INFINITY;
            const float mnew = fmaxf(mrun[m], warp_max(s));
            const float alpha = mnew == -INFINITY ? 1.0f : exp2f(mrun[m] - mnew);
            const float w = ok ? exp2f(s - mnew) : 0.0f;
            mrun[m] = mnew;
            lsum[m] = fmaf(lsum[m], alpha, w);
            if (QUANT) zsum[m] = fmaf(zsum[m], alpha, w * vzero);
            if (QUANT && !TGT) wsum[m] *= alpha;
            wsm[lane * M + m] = w * vstep;
#pragma unroll
            for (int j = 0; j < 8; j++) acc[m][j] *= alpha;
        }
        __syncwarp();

        // ---- P.V: lane = (token ts of each step, channel word cp) ----
        // NOTE: no per-token branch for M <= 2: a token past the slice's end
        // has weight +0 (every lane wrote its row of wsm) and V words of 0
        // (not loaded), so its terms add +0 to accumulators that are never
        // -0. With more query vectors the branch stays: without it the
        // compiler keeps more steps in flight and the M = 8 instances spill.
        constexpr bool BR = M > 2;
        if (QUANT && !ufp) {
#pragma unroll
            for (int s = 0; s < NSTEP; s++) {
                const int tok = s * TPS + ts;
                if (BR && tok >= tl) continue;
                float v[8];
                if (TGT) target8(vu[s], vl[TGT ? s : 0], v);
                else draft8_h(vu[s], v); // 0.5 + U/256
                float wv[M];
                ld_w<M>(wv, wsm + tok * M);
#pragma unroll
                for (int m = 0; m < M; m++) {
                    if (!TGT) wsum[m] += wv[m];
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[m][j] = fmaf(wv[m], v[j], acc[m][j]);
                }
            }
        } else {
            const uint8_t *vrow = P.fp + (ubase + (size_t)(G + t0) * D) * es + cp * 16; // V rows follow K's
            uint4 vf[NSTEP];
#pragma unroll
            for (int s = 0; s < NSTEP; s++) {
                const int tok = s * TPS + ts;
                vf[s] = tok < tl ? ldg16(vrow + (size_t)tok * D * es) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int s = 0; s < NSTEP; s++) {
                const int tok = s * TPS + ts;
                if (BR && tok >= tl) continue;
                float v[8];
                fpw8<T>(vf[s], v);
                float wv[M];
                ld_w<M>(wv, wsm + tok * M);
                if (QUANT && !TGT) // on the scale of the draft's (1 + U/128) / 2 (see the end)
#pragma unroll
                    for (int m = 0; m < M; m++) wv[m] *= 0.00390625f;
#pragma unroll
                for (int m = 0; m < M; m++) {
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[m][j] = fmaf(wv[m], v[j], acc[m][j]);
                }
            }
        }
        __syncwarp();
      }
    }

    // ---- warp reduction, then the CTA's warps merge ----
    float *mo = (float *)(smem + SM::mo);
    float *mlp = (float *)(smem + SM::ml);
    if (QUANT && !TGT) { // draft: acc = sum w*(0.5 + U/256) (quantized) + sum w*v/256 (FP)
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[m][j] = 256.0f * (acc[m][j] - 0.5f * wsum[m]);
    }
#pragma unroll
    for (int m = 0; m < M; m++) {
#pragma unroll
        for (int o = LPT; o < 32; o <<= 1)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[m][j] += __shfl_xor_sync(0xffffffffu, acc[m][j], o);
        lsum[m] = warp_sum(lsum[m]);
        if (QUANT) zsum[m] = warp_sum(zsum[m]);
        if (ts == 0) {
#pragma unroll
            for (int j = 0; j < 8; j++) mo[(warp * M + m) * D + cp * 8 + j] = acc[m][j] + zsum[m];
        }
        if (lane == 0) {
            mlp[2 * (warp * M + m)] = mrun[m];
            mlp[2 * (warp * M + m) + 1] = lsum[m];
        }
    }
    __syncthreads();
    dec_cta_merge<DNW, M, D>(P, S, seq, chunk, kvh, Mt, mo, mlp, (float *)(smem + SM::fx));
}

#include "paged_attention_tc.cuh"
#include "paged_attention_prefill.cuh"
#include "paged_attention_prefill_wg.cuh"

// The scalar decode kernel on (chunk, kv head, sequence).
template <int D, typename T, int MODE, int M> struct dec_launcher {
    static nb_status run(pa_kp &kp, const nb_pa_args *a, cudaStream_t stream) {
        void (*kern)(const pa_kp) = pa_decode_kernel<D, T, MODE, M>;
        const int smem = dec_smem<D, M>::bytes;
        static int occ = 0, dev_sms = 0, dev = -1;
        int cur;
        if (cudaGetDevice(&cur) != cudaSuccess) return NB_ERR_BACKEND;
        if (cur != dev) { // NOTE: cached per instantiation; re-read when the device changes
            if (cudaDeviceGetAttribute(&dev_sms, cudaDevAttrMultiProcessorCount, cur) != cudaSuccess)
                return NB_ERR_BACKEND;
            if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
                return NB_ERR_BACKEND;
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, DNT, smem) != cudaSuccess)
                return NB_ERR_BACKEND;
            if (occ < 1) occ = 1;
            dev = cur;
        }
        // Split-K (plan_split): chunks of whole blocks. NOTE: one wave of
        // CTAs against two waves of half-size chunks was faster in 37 of 48
        // measured cells (llama2/llama3 shapes, batch 1 and 8, 4k-128k, three
        // views), e.g. the draft view at batch 1, 32k: llama2 0.0741 vs 0.0811
        // ms, llama3 0.0500 vs 0.0634 ms; slower by at most 2% in the others
        // but llama3, batch 8, 128k, target (1.020 vs 0.952 ms). Half a wave
        // and 1.5 waves were slower (docs/benchmarks.md, session 12).
        const int units_max = cdiv(a->max_tokens, a->lay.group_size) + (MODE == NB_PA_FP_ONLY ? 0 : 1);
        nb_status st = plan_split(kp, a, (long)dev_sms * occ, units_max);
        if (st != NB_OK) return st;
        if (!kp.inv) {
            kp.upc = cdiv(units_max, kp.n_chunks);
            kp.n_chunks = cdiv(units_max, kp.upc);
        }
        if ((st = use_workspace(kp, a, D, kp.n_chunks > 1 || kp.inv)) != NB_OK) return st;
        dim3 grid((unsigned)kp.n_chunks, (unsigned)a->lay.n_kv_heads, (unsigned)a->n_seqs);
        kern<<<grid, DNT, smem, stream>>>(kp);
        if (cudaGetLastError() != cudaSuccess) return NB_ERR_BACKEND;
        if (kp.n_chunks > 1 || kp.inv) {
            if (launch_merge(kp, a, stream) != cudaSuccess) return NB_ERR_BACKEND;
        }
        return NB_OK;
    }
};

template <int D, typename T, int M> nb_status dec_by_mode(pa_kp &kp, const nb_pa_args *a, cudaStream_t s) {
    switch (a->mode) {
    case NB_PA_DRAFT: return dec_launcher<D, T, NB_PA_DRAFT, M>::run(kp, a, s);
    case NB_PA_TARGET: return dec_launcher<D, T, NB_PA_TARGET, M>::run(kp, a, s);
    default: return dec_launcher<D, T, NB_PA_FP_ONLY, M>::run(kp, a, s);
    }
}

// The tensor-core decode kernel: CPS CTAs of tc_cfg::NW warps per SM.
// Split-K batch-tuned: one wave, each (sequence, kv head) in SMs * CPS /
// pairs chunks (the kernel weights them by bytes); row-invariant: fixed
// chunks of fixed_chunk_groups groups.
// Per-device setup of a kernel of fixed dynamic shared memory, cached per
// call site (re-read when the current device changes): the device's SM
// count into *sms, and the kernel's shared-memory limit raised to smem.
struct kern_dev {
    int dev = -1, sms = 0;
};
nb_status kern_prepare(kern_dev &kd, void (*kern)(const pa_kp), int smem) {
    int cur;
    if (cudaGetDevice(&cur) != cudaSuccess) return NB_ERR_BACKEND;
    if (cur == kd.dev) return NB_OK;
    if (cudaDeviceGetAttribute(&kd.sms, cudaDevAttrMultiProcessorCount, cur) != cudaSuccess)
        return NB_ERR_BACKEND;
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
        return NB_ERR_BACKEND;
    kd.dev = cur;
    return NB_OK;
}

// Split-K over whole blocks (units) for the tile kernels: enough chunks
// that the `base` CTAs of one chunk become `target` (about one wave), at
// most units_max and a->max_chunks; kp.upc units a chunk.
void plan_units(pa_kp &kp, const nb_pa_args *a, int units_max, long base, long target) {
    long chunks = (target + base - 1) / base;
    if (chunks > units_max) chunks = units_max;
    if (chunks > a->max_chunks) chunks = a->max_chunks;
    if (chunks < 1) chunks = 1;
    kp.inv = 0;
    kp.upc = cdiv(units_max, (int)chunks);
    kp.n_chunks = cdiv(units_max, kp.upc);
}

// CTAs per (entry, kv head) of a row-invariant call on the tensor-core
// kernel (target and FP views; two- and three-tile target CTAs since
// session 48: where a warp's partial then goes, tc_cfg). Where the call's pairs leave
// room for at least two CTAs each in one wave, about one wave (slots /
// pairs), each CTA walking its chunks c, c + gx, ... and streaming across
// their boundaries: a chunk's end costs no drain of the copies in flight
// and the prologue (q, its fragments) is paid once per CTA, not per chunk.
// Otherwise one CTA per chunk (the grid before session 35): with one CTA a
// pair, walking all its chunks, the H100 ran Llama-2-shape batch 8 0.4-1.6%
// slower than many one-chunk CTAs that the hardware balances across SMs
// (the H200 6-8% faster; docs/benchmarks.md, session 35). A chunk's partial
// is the same bits whichever CTA computes it and after whichever chunk, so
// the grid may follow the call's batch. NB_PA_TC_STEP_CTAS=N in the
// environment forces N (tests, benchmarks; read per call).
// min_walk: the fewest chunks a walking CTA may get, else one CTA per
// chunk. 1 for one-tile CTAs; 4 for the verify's two- and three-tile
// ones (session 48, H200, Llama-3 shape: walking 8 chunks a CTA 4-6%
// faster at batch 8 from 32k, 4 chunks 2-5% at batch 8 16k and -1.3% /
// +0.8% at batch 1 128k, but 2 chunks 5-7% slower at batch 1 64k).
int step_ctas(int n_chunks, long pairs, long slots, int min_walk) {
    const char *e = getenv("NB_PA_TC_STEP_CTAS");
    const bool forced = e && atoi(e) > 0;
    long gx = forced ? atoi(e) : slots / pairs;
    if (!forced && (gx < 2 || (long)n_chunks < gx * min_walk)) gx = n_chunks;
    if (gx < 1) gx = 1;
    if (gx > n_chunks) gx = n_chunks;
    return (int)gx;
}

template <typename T, int MODE, int CPS, int NM = 1>
nb_status tc_launch(pa_kp &kp, const nb_pa_args *a, cudaStream_t stream) {
    using C = tc_cfg<T, MODE, CPS, NM>;
    void (*kern)(const pa_kp) = pa_tc_kernel<T, MODE, CPS, NM, false>;
    static kern_dev kd, kd_walk;
    if (kern_prepare(kd, kern, C::SMEM) != NB_OK) return NB_ERR_BACKEND;
    const int dev_sms = kd.sms;
    // CPS CTAs per SM; chunks of 32-token slices (the kernel weights them by bytes).
    const int units_max = cdiv(a->max_tokens, a->lay.group_size) + (MODE == NB_PA_FP_ONLY ? 0 : 1);
    nb_status st = plan_split(kp, a, (long)dev_sms * CPS, (long)units_max * (a->lay.group_size / 32));
    if (st != NB_OK) return st;
    if (!kp.inv) kp.upc = 0;
#ifdef NB_PA_TRACE
    if (!kp.inv && getenv("NB_PA_TC_CHUNKS")) { // diagnostic builds only
        kp.n_chunks = atoi(getenv("NB_PA_TC_CHUNKS"));
        if (kp.n_chunks < 1 || kp.n_chunks > a->max_chunks) return NB_ERR_INVALID_ARG;
    }
#endif
    if ((st = use_workspace(kp, a, TC_D, kp.n_chunks > 1 || kp.inv)) != NB_OK) return st;
    // Programmatic stream serialization when the caller allows it
    // (nb_pa_args.pdl; NB_PA_TC_PDL=0 in the environment turns it off, read
    // per call): the CTAs may start under the previous kernel and copy
    // quantized tiles before they wait for it (see the prologue). Same bits
    // either way.
    kp.pdl = a->pdl && nb_pdl::env_switch("NB_PA_TC_PDL", true);
    const int gx = kp.inv && C::PERSIST ? step_ctas(kp.n_chunks, (long)a->lay.n_kv_heads * a->n_seqs,
                                                    (long)dev_sms * CPS, NM == 1 ? 1 : 4)
                                     : kp.n_chunks;
    if constexpr (C::PERSIST) {
        if (gx < kp.n_chunks) { // CTAs walking several chunks: the form with the walk
            kern = pa_tc_kernel<T, MODE, CPS, NM, true>;
            if (kern_prepare(kd_walk, kern, C::SMEM) != NB_OK) return NB_ERR_BACKEND;
        }
    }
    if (nb_pdl::launch(kern, dim3((unsigned)gx, (unsigned)a->lay.n_kv_heads, (unsigned)a->n_seqs),
                       dim3(C::NT), C::SMEM, stream, kp.pdl != 0, kp) != cudaSuccess ||
        cudaGetLastError() != cudaSuccess)
        return NB_ERR_BACKEND;
    if (kp.n_chunks > 1 || kp.inv) {
        if (launch_merge(kp, a, stream) != cudaSuccess) return NB_ERR_BACKEND;
    }
    return NB_OK;
}
// CTAs per SM for a call: NB_PA_TC_CPS=1|2 in the environment forces one
// (read per call, for benchmarks and tests). Built in, measured on an H100
// (docs/benchmarks.md, sessions 15-16): two for the row-invariant split's
// draft view, and for its target view when the model has one query head
// per kv head; one otherwise. The fixed chunks are small (2,048 tokens at
// 128k max_seq_len; 256 KB of nibbles for the draft) and come in waves, so
// two CTAs let one CTA's prologue and merge run under the other's stream:
// Llama-3 shape batch 8 draft 32k 0.159 -> 0.138 ms, 128k 0.569 -> 0.475
// (batch 1 up to 32k 20% slower); Llama-2 shape target (tensor-core
// kernel, use_tc) 0.6-4.5% faster from 32k tokens and at batch 8 from 16k,
// 7% at batch 1 4k, 1.7% slower at batch 1 16k. But the Llama-3 shape's
// target view at batch 1 up to 32k is 6-34% slower with two, as its 8
// (sequence, kv head) pairs leave the SMs few CTAs of half the warps, and
// the Llama-2 shape's FP view is within 3% either way from 16k, 11% slower
// at batch 1 4k. For the row-invariant split the choice depends on the
// view and the model's head ratio only, never on the call's rows or
// sequences (a row-invariant row must take the same warp split whatever
// its batch).
// Batch-tuned calls are one wave of one CTA per SM, except the draft and
// target views of mid-sized calls on an H100-class device (< 30 GB/s of
// DRAM bandwidth per SM, dram_gbps_per_sm): from TC_CPS2_WORK_MIN to
// TC_CPS2_WORK_MAX (kv heads x max_tokens x entries) / SMs, two. Measured
// (H100, session 36, three runs, CPS 1 -> 2): Llama-3 shape batch 8 16k
// target 0.1135 -> 0.1090 ms, draft 0.0674 -> 0.0652, 32k target 0.2064
// -> 0.2020, draft 0.1193 -> 0.1148, batch 1 128k draft 0.0662 -> 0.0633;
// Llama-2 draft batch 1 32k 0.0635 -> 0.0613, batch 8 4k 0.0732 ->
// 0.0679; in the engine (bench_engine_long, Llama-3 shape) the batch-8
// 16k draft call 17.51 -> 17.22 ms, and 32k 23.71-23.73 -> 23.37-23.59
// (its max_tokens, the graph key, makes it ~16,400 per SM: the upper
// bound sits between that and 31,775, the next size measured, which
// lost). Smaller calls gained in the kernel
// benchmark but not in the engine (batch 1 4k-16k drafts ~1% slower
// there, batch 1 64k draft 1-3% slower in both), larger ones lost 0.5-2.7%
// (Llama-2 draft batch 8 64k 0.7795 -> 0.8002), and the FP view is within
// +-1.6% either way.
// work_per_sm: that figure for a batch-tuned call (ignored for inv).
constexpr double TC_CPS2_WORK_MIN = 4000.0, TC_CPS2_WORK_MAX = 20000.0, TC_CPS2_MAX_GBPS_PER_SM = 30.0;
double dram_gbps_per_sm();
int dev_sm_count();
// A call's work per SM for the CTAs-per-SM and kernel choices (tc_cps,
// use_tc): kv heads x max_tokens x entries / SMs.
double call_work_per_sm(const nb_pa_args *a) {
    return (double)a->max_tokens * a->n_seqs * a->lay.n_kv_heads / dev_sm_count();
}
int tc_cps(nb_pa_mode mode, bool inv, int g, double work_per_sm) {
    const char *e = getenv("NB_PA_TC_CPS");
    if (e && (e[0] == '1' || e[0] == '2')) return e[0] - '0';
    if (!inv)
        return mode != NB_PA_FP_ONLY && work_per_sm >= TC_CPS2_WORK_MIN && work_per_sm <= TC_CPS2_WORK_MAX &&
                       dram_gbps_per_sm() < TC_CPS2_MAX_GBPS_PER_SM
                   ? 2
                   : 1;
    return mode == NB_PA_DRAFT || (mode == NB_PA_TARGET && g == 1) ? 2 : 1;
}
template <typename T, int MODE> nb_status tc_by_cps(pa_kp &kp, const nb_pa_args *a, cudaStream_t s) {
    if constexpr (MODE == NB_PA_TARGET) { // wide entries (tc_wide): two query tiles per CTA
        const long mv = (long)a->max_rows * kp.g;
        if (mv > 2 * TC_M) return tc_launch<T, MODE, 1, 3>(kp, a, s);
        if (mv > TC_M) return tc_launch<T, MODE, 1, 2>(kp, a, s);
    }
    const int cps = tc_cps((nb_pa_mode)MODE, a->fixed_chunk_groups > 0, kp.g, call_work_per_sm(a));
    return cps == 2 ? tc_launch<T, MODE, 2>(kp, a, s) : tc_launch<T, MODE, 1>(kp, a, s);
}
template <typename T> nb_status tc_by_mode(pa_kp &kp, const nb_pa_args *a, cudaStream_t s) {
    switch (a->mode) {
    case NB_PA_DRAFT: return tc_by_cps<T, NB_PA_DRAFT>(kp, a, s);
    case NB_PA_TARGET: return tc_by_cps<T, NB_PA_TARGET>(kp, a, s);
    default:
        if constexpr (std::is_same<T, __half>::value) return tc_by_cps<T, NB_PA_FP_ONLY>(kp, a, s);
        return NB_ERR_UNSUPPORTED; // bf16 FP blocks would be converted to f16: the scalar kernel keeps them exact
    }
}

// The tensor-core prefill kernels, split-K over whole blocks (as the chunk
// kernel's launcher) when the (sequence, kv head, m-tile) CTAs do not fill
// one wave. WG: the warpgroup kernel, one CTA per SM (a producer and two
// consumer warpgroups), 128 query vectors; else the mma.sync kernel, two
// CTAs of 4 warps per SM, 64 query vectors each.
// The fewest m-tiles (CTAs per kv head, 128 query vectors each) for which
// the prefill stage pays (session 48, H200, Llama-3 heads: at 8, 256-row
// chunks, 0.91-0.93x from 16k of history and 0.99x at 4k; at 4, 128-row
// chunks, 1.01-1.07x).
constexpr int PF_STAGE_MIN_MTILES = 8;
template <typename T, int MODE, bool WG> nb_status pf_launch(pa_kp &kp, const nb_pa_args *a, cudaStream_t stream) {
    constexpr int SMEM = WG ? PS_SMEM : PF_SMEM, NTH = WG ? PS_NT : PF_NT, MT = WG ? PW_MT : PF_MT, CPS = WG ? 1 : 2;
    const int units_max = cdiv(a->max_tokens, a->lay.group_size) + (MODE == NB_PA_FP_ONLY ? 0 : 1);
    const long M_max = (long)a->max_rows * kp.g;
    kp.pl.n_mtiles = (int)((M_max + MT - 1) / MT);
    if ((long)a->lay.n_kv_heads * kp.pl.n_mtiles > 65535) return NB_ERR_UNSUPPORTED;
    // The prefill stage (nb_pa_args.stage): the warpgroup kernel's target
    // view, where the call's sequences fit it and each group would be
    // dequantized by at least PF_STAGE_MIN_MTILES CTAs (the m-tiles of a
    // kv head) without it. NB_PA_PF_STAGE=0 / 1 in the environment: never
    // / wherever it fits (tests, benchmarks; read per call).
    bool stg = false;
    if constexpr (WG && MODE == NB_PA_TARGET) {
        const char *e = getenv("NB_PA_PF_STAGE");
        const size_t need = nb_pa_prefill_stage_size(&a->lay, a->n_seqs, a->max_tokens);
        stg = a->stage && need > 0 && a->stage_bytes >= need && (uintptr_t)a->stage % 16 == 0 &&
              !(e && e[0] == '0') && (kp.pl.n_mtiles >= PF_STAGE_MIN_MTILES || (e && e[0] == '1'));
    }
    void (*kern)(const pa_kp) = pa_prefill_kernel<T, MODE>;
    if constexpr (WG) kern = pa_prefill_wg_kernel<T, MODE, false>;
    if constexpr (WG && MODE == NB_PA_TARGET) {
        if (stg) kern = pa_prefill_wg_kernel<T, MODE, true>;
    }
    static kern_dev kd, kd_stg; // per kernel: kern_prepare sets its shared-memory limit
    kern_dev &kdk = stg ? kd_stg : kd;
    if (kern_prepare(kdk, kern, SMEM) != NB_OK) return NB_ERR_BACKEND;
    plan_units(kp, a, units_max, (long)a->n_seqs * a->lay.n_kv_heads * kp.pl.n_mtiles, (long)kdk.sms * CPS);
    const nb_status st = use_workspace(kp, a, TC_D, kp.n_chunks > 1);
    if (st != NB_OK) return st;
    kp.stage = stg ? (uint8_t *)a->stage : nullptr;
    kp.stage_u = stg ? units_max : 0;
    if (stg) {
        pa_stage_kernel<T><<<dim3((unsigned)units_max, (unsigned)a->lay.n_kv_heads, (unsigned)a->n_seqs),
                             PS_STAGE_NT, 0, stream>>>(kp);
        if (cudaGetLastError() != cudaSuccess) return NB_ERR_BACKEND;
    }
    dim3 grid((unsigned)kp.n_chunks, (unsigned)(a->lay.n_kv_heads * kp.pl.n_mtiles), (unsigned)a->n_seqs);
    kern<<<grid, NTH, SMEM, stream>>>(kp);
    if (cudaGetLastError() != cudaSuccess) return NB_ERR_BACKEND;
    if (kp.n_chunks > 1) {
        if (launch_merge(kp, a, stream) != cudaSuccess) return NB_ERR_BACKEND;
    }
    return NB_OK;
}
template <typename T, bool WG> nb_status pf_by_mode(pa_kp &kp, const nb_pa_args *a, cudaStream_t stream) {
    return a->mode == NB_PA_TARGET ? pf_launch<T, NB_PA_TARGET, WG>(kp, a, stream)
                                   : pf_launch<T, NB_PA_FP_ONLY, WG>(kp, a, stream);
}
// Calls of more than 8 query vectors per kv head (prefill chunks; verify
// entries outside step mode) at D = 128 on f16/bf16 caches take a
// tensor-core prefill kernel in the target and FP-only views: the
// warpgroup one (wgmma) where G % 64 == 0, else the mma.sync one.
// NB_PA_PF in the environment (read per call; tests and benchmarks compare
// them): 0 forces the scalar chunk kernel, 1 the mma.sync prefill kernel.
bool use_pf(const nb_pa_args *a, bool aligned) {
    const char *e = getenv("NB_PA_PF");
    if (e && e[0] == '0') return false;
    return aligned && a->lay.head_dim == TC_D && a->lay.group_size % PF_TT == 0 &&
           (a->lay.dtype == NB_DTYPE_F16 || a->lay.dtype == NB_DTYPE_BF16) &&
           (a->mode == NB_PA_TARGET || a->mode == NB_PA_FP_ONLY) && a->fixed_chunk_groups == 0 &&
           ((uintptr_t)a->q | (uintptr_t)a->out) % 16 == 0;
}

// Which decode kernel runs a D = 128 call of <= 8 query vectors per kv
// head. Measured on an H100 (docs/benchmarks.md, sessions 14-16): the
// tensor-core kernel costs about the same instructions per cached byte
// whatever the number of query vectors, the scalar one ~4 FMAs per value
// and query vector, so with 4 query heads per kv head (Llama-3) the
// tensor-core kernel is 1.2-2.6x faster in every view; with 1 (Llama-2) it
// is 3-9% faster on the FP-only view, 2-5% on the draft view from 16k
// tokens; on the target view, 3-6% SLOWER with the batch-tuned split at
// batch 1 (integer dot products are cheap for one query vector), but with
// the row-invariant split, at two CTAs per SM (tc_by_cps), 0.6-4.5% faster
// from 32k tokens and 7% at batch 1 4k (1.7% slower at batch 1 16k; one-row
// calls), and a verify entry's rows (up to 8) do not add to its cost per
// byte as they do to the scalar kernel's. That one exception (the
// batch-tuned target view at one query head per kv head) holds where each
// SM has little DRAM bandwidth to keep up with: on an H200 (4.8 TB/s
// theoretical, 36.5 GB/s per SM) the tensor-core kernel is 4-22% faster
// there too (docs/benchmarks.md, session 34), on an H100 SXM (3.35 TB/s,
// 25.4 GB/s per SM) 0.96-1.02x; so it takes the tensor-core kernel from
// TC_TARGET1_GBPS_PER_SM (dram_gbps_per_sm). Since sessions 35-36 the
// tensor-core kernel takes 0.980-0.997x the scalar one's time on an H100
// too wherever a call has at least ~8,000 tokens x kv heads x sequences
// per SM (Llama-2 shape: batch 1 32k and 64k, batch 8 from 4k; batch 1
// 128k 0.998-1.002x; five passes on three machines, docs/benchmarks.md,
// session 37) and 1.03-1.06x below
// ~4,000 (batch 1 4k and 16k), so below TC_TARGET1_GBPS_PER_SM it takes
// the tensor-core kernel from TC_TARGET1_WORK_MIN per SM (no call between
// 3,971 and 7,943 was measured). For the row-invariant split the choice
// depends on the device, the model's head ratio and the view only, never
// on a call's rows or size, so a verify row and the target-only decode row
// at the same position take the same kernel (the row-invariance contract
// of fixed_chunk_groups); the batch-tuned split makes no such promise (its
// chunks follow the batch already).
// NB_PA_TC=0 / NB_PA_TC=1 in the environment force the scalar /
// tensor-core kernel (benchmarks and tests compare the two; read per call).
constexpr double TC_TARGET1_GBPS_PER_SM = 30.0, TC_TARGET1_WORK_MIN = 6000.0;
// The current device's SM count, read once per device (1 when unknown).
int dev_sm_count() {
    static int dev = -1, v = 1;
    int cur;
    if (cudaGetDevice(&cur) != cudaSuccess) return 1;
    if (cur != dev) {
        int sms = 0;
        v = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cur) == cudaSuccess && sms > 0 ? sms : 1;
        dev = cur;
    }
    return v;
}
// The current device's theoretical DRAM bandwidth per SM, GB/s: memory
// clock x 2 (double data rate) x bus width / SMs, read once per device (0
// when the device does not report it).
double dram_gbps_per_sm() {
    static int dev = -1;
    static double v = 0.0;
    int cur;
    if (cudaGetDevice(&cur) != cudaSuccess) return 0.0;
    if (cur != dev) {
        int khz = 0, bits = 0;
        v = 0.0;
        if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, cur) == cudaSuccess &&
            cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, cur) == cudaSuccess)
            v = 2.0 * khz * 1e3 * (bits / 8.0) / dev_sm_count() / 1e9;
        dev = cur;
    }
    return v;
}
// work_per_sm: call_work_per_sm (read for the batch-tuned split only).
bool use_tc(int gqa, nb_pa_mode mode, bool inv, double work_per_sm) {
    const char *e = getenv("NB_PA_TC");
    if (e && e[0] == '0') return false;
    if (e && e[0] == '1') return true;
    return mode != NB_PA_TARGET || gqa >= 2 || inv || dram_gbps_per_sm() >= TC_TARGET1_GBPS_PER_SM ||
           work_per_sm >= TC_TARGET1_WORK_MIN;
}
// Row-invariant target-view calls of 9-16 query vectors per kv head (a
// verify entry of up to 16 / GQA rows) on the tensor-core kernel with two
// query tiles per CTA (tc_cfg NM = 2), and of 17-24 (a 5-row verify at GQA
// 4) with three (NM = 3): every cached byte is copied and unpacked once for
// all tiles, where 8-vector entries would each read the whole context.
// Only where the one-tile kernel runs the same warp split (one CTA per SM:
// models with >= 2 query heads per kv head), so a row gets the bits of its
// one-row decode. NB_PA_TC_WIDE=0 in the
// environment turns it off (benchmarks compare; read per call, as
// nb_pa_step_entry_vectors reads it; =1 there forces wide entries).
bool tc_wide(const nb_kv_layout *lay, nb_pa_mode mode, int g) {
    const char *e = getenv("NB_PA_TC_WIDE");
    if (e && e[0] == '0') return false;
    return mode == NB_PA_TARGET && lay->head_dim == TC_D && lay->group_size % 32 == 0 &&
           (lay->dtype == NB_DTYPE_F16 || lay->dtype == NB_DTYPE_BF16) && g >= 2 && use_tc(g, mode, true, 0.0) &&
           tc_cps(mode, true, g, 0.0) == 1;
}
template <int D, typename T> nb_status dec_by_m(pa_kp &kp, const nb_pa_args *a, int M_max, cudaStream_t s) {
    if (M_max <= 1) return dec_by_mode<D, T, 1>(kp, a, s);
    if (M_max <= 2) return dec_by_mode<D, T, 2>(kp, a, s);
    if (M_max <= 4) return dec_by_mode<D, T, 4>(kp, a, s);
    return dec_by_mode<D, T, 8>(kp, a, s);
}

// Shared-memory plan for MT query vectors per CTA; smem_bytes 0 if over the limit.
pa_plan make_plan(int D, int G, int es, int mode, bool fast, int MT) {
    pa_plan L = {};
    L.D = D;
    L.Dp = (D + 7) & ~7;
    L.G = G;
    L.es = es;
    L.ttq = fast ? 64 : 32;
    L.ns = !fast ? 2 : mode == NB_PA_FP_ONLY ? 3 : 4;
    const int planes = mode == NB_PA_TARGET ? 2 : 1;
    if (mode == NB_PA_FP_ONLY) {
        L.ttf = L.ttq;
    } else { // an FP tile moves about as many bytes as a quantized one
        L.ttf = L.ttq * planes / (2 * es);
        if (L.ttf < 1) L.ttf = 1;
    }
    int q = 0;
    if (mode != NB_PA_FP_ONLY) {
        const int pb = a16(L.ttq * (D / 2));
        L.o_ku = q; q += pb;
        L.o_vu = q; q += pb;
        if (mode == NB_PA_TARGET) {
            L.o_kl = q; q += pb;
            L.o_vl = q; q += pb;
        }
        L.o_ks = q; q += a16(D * es);
        L.o_kz = q; q += a16(D * es);
        L.o_vs = q; q += a16(L.ttq * es);
        L.o_vz = q; q += a16(L.ttq * es);
    }
    const int fb = a16(L.ttf * D * es);
    L.o_fk = 0;
    L.o_fv = fb;
    L.stage_bytes = q > 2 * fb ? q : 2 * fb;
    L.MT = MT;
    int stage_area = L.ns * L.stage_bytes;
    const int red = MT * L.Dp * 4 > 128 * NT ? MT * L.Dp * 4 : 128 * NT;
    if (red > stage_area) stage_area = red;
    int o = 0;
    L.off_q = o; o += a16(MT * L.Dp * 4);
    L.off_qx = o; o += mode == NB_PA_FP_ONLY ? 0 : a16(MT * L.Dp * 4);
    L.off_p = o; o += a16(MT * L.ttq * 4);
    L.off_misc = o; o += a16(5 * MT_MAX * 4);
    L.off_stage = o; o += stage_area;
    L.smem_bytes = o;
    return L;
}

template <int DC, typename T, int MODE> struct launcher {
    static nb_status run(pa_kp &kp, const nb_pa_args *a, int M_max, cudaStream_t stream) {
        auto kern = pa_chunk_kernel<DC, T, MODE>;
        const pa_plan &L = kp.pl;
        static int attr_smem = -1, occ_smem = -1, occ = 1, dev_sms = 0, dev = -1;
        int cur;
        if (cudaGetDevice(&cur) != cudaSuccess) return NB_ERR_BACKEND;
        if (cur != dev) { // NOTE: cached per instantiation; re-read when the device changes
            if (cudaDeviceGetAttribute(&dev_sms, cudaDevAttrMultiProcessorCount, cur) != cudaSuccess)
                return NB_ERR_BACKEND;
            dev = cur;
            attr_smem = occ_smem = -1;
        }
        if (L.smem_bytes > attr_smem) {
            if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, L.smem_bytes) !=
                cudaSuccess)
                return NB_ERR_BACKEND;
            attr_smem = L.smem_bytes;
        }
        if (L.smem_bytes != occ_smem) {
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, NT, L.smem_bytes) != cudaSuccess)
                return NB_ERR_BACKEND;
            if (occ < 1) occ = 1;
            occ_smem = L.smem_bytes;
        }
        // Split-K: enough CTAs for one full wave, chunks of whole blocks.
        const int G = a->lay.group_size;
        const int units_max = cdiv(a->max_tokens, G) + (MODE == NB_PA_FP_ONLY ? 0 : 1);
        plan_units(kp, a, units_max, (long)a->n_seqs * a->lay.n_kv_heads * L.n_mtiles, (long)dev_sms * occ);
        const nb_status st = use_workspace(kp, a, L.D, kp.n_chunks > 1);
        if (st != NB_OK) return st;
        (void)M_max;
        dim3 grid((unsigned)kp.n_chunks, (unsigned)(a->lay.n_kv_heads * L.n_mtiles), (unsigned)a->n_seqs);
        kern<<<grid, NT, L.smem_bytes, stream>>>(kp);
        if (cudaGetLastError() != cudaSuccess) return NB_ERR_BACKEND;
        if (kp.n_chunks > 1) {
            if (launch_merge(kp, a, stream) != cudaSuccess) return NB_ERR_BACKEND;
        }
        return NB_OK;
    }
};

template <int DC, typename T>
nb_status by_mode(pa_kp &kp, const nb_pa_args *a, int M_max, cudaStream_t s) {
    switch (a->mode) {
    case NB_PA_DRAFT: return launcher<DC, T, NB_PA_DRAFT>::run(kp, a, M_max, s);
    case NB_PA_TARGET: return launcher<DC, T, NB_PA_TARGET>::run(kp, a, M_max, s);
    default: return launcher<DC, T, NB_PA_FP_ONLY>::run(kp, a, M_max, s);
    }
}

} // namespace

extern "C" int32_t nb_pa_step_entry_vectors(const nb_kv_layout *lay, nb_pa_mode mode, int32_t n_q_heads,
                                            const int64_t live_ctas[3]) {
    if (!lay || lay->n_kv_heads < 1 || n_q_heads < 1 || n_q_heads % lay->n_kv_heads) return 0;
    if (!tc_wide(lay, mode, n_q_heads / lay->n_kv_heads)) return DEC_MMAX;
    const char *tiles = getenv("NB_PA_TC_TILES"), *e = getenv("NB_PA_TC_WIDE");
    const bool cap2 = tiles && tiles[0] == '2', force3 = tiles && tiles[0] == '3';
    if (!live_ctas) return cap2 ? 2 * TC_M : 3 * TC_M;
    if (e && e[0] == '1') return force3 ? 3 * TC_M : 2 * TC_M;
    // One CTA per SM (the target view's tensor-core kernel at CPS 1).
    static int dev = -1, sms = 0;
    int cur;
    if (cudaGetDevice(&cur) != cudaSuccess) return DEC_MMAX;
    if (cur != dev) {
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cur) != cudaSuccess) return DEC_MMAX;
        dev = cur;
    }
    if (live_ctas[0] <= sms) return DEC_MMAX;
    if (force3 || cap2) return force3 ? 3 * TC_M : 2 * TC_M;
    // Waves of each cut, a three-tile CTA taking 1.75x a two-tile one; a
    // tie reads the cache once (batch 1 64k: 4 against 7 waves, 2.3%).
    const int64_t w2 = (live_ctas[1] + sms - 1) / sms, w3 = (live_ctas[2] + sms - 1) / sms;
    return 7 * w3 <= 4 * w2 ? 3 * TC_M : 2 * TC_M;
}

extern "C" size_t nb_pa_prefill_stage_size(const nb_kv_layout *lay, int32_t n_seqs, int32_t max_tokens) {
    if (!lay || n_seqs < 1 || max_tokens < 1 || lay->group_size < 1 || lay->head_dim < 1 || lay->n_kv_heads < 1)
        return 0;
    const int u = cdiv(max_tokens, lay->group_size) + 1;
    return pa_stage_off(*lay, u, n_seqs, 0, 0, 0, 0);
}

extern "C" size_t nb_pa_workspace_size(int32_t n_seqs, int32_t max_rows, int32_t n_q_heads,
                                       int32_t head_dim, int32_t max_chunks) {
    if (n_seqs < 1 || max_rows < 1 || n_q_heads < 1 || head_dim < 1 || max_chunks < 1) return 0;
    return (size_t)n_seqs * max_chunks * max_rows * n_q_heads * ((size_t)head_dim + 2) * sizeof(float);
}

extern "C" nb_status nb_pa_attention(const nb_pa_args *a, cudaStream_t stream) {
    if (!a || !nb_kv_layout_valid(&a->lay) || a->layer < 0 || a->layer >= a->lay.n_layers)
        return NB_ERR_INVALID_ARG;
    if (a->mode != NB_PA_DRAFT && a->mode != NB_PA_TARGET && a->mode != NB_PA_FP_ONLY)
        return NB_ERR_INVALID_ARG;
    if (a->n_q_heads < 1 || a->n_q_heads % a->lay.n_kv_heads || a->n_seqs < 1 || a->n_seqs > 65535 ||
        a->max_rows < 1 || a->max_tokens < 1 || a->max_rows > 65535 || a->max_chunks < 1 || !a->seqs ||
        !a->q || !(a->out || a->out_cvt) || !a->fpblock_ids || !a->pools.fp)
        return NB_ERR_INVALID_ARG;
    if (a->out_cvt && (a->out_cvt_dt != NB_DTYPE_F16 && a->out_cvt_dt != NB_DTYPE_BF16))
        return NB_ERR_INVALID_ARG;
    if (a->out_cvt && a->out_cvt_sat && a->out_cvt_dt != NB_DTYPE_F16) return NB_ERR_INVALID_ARG;
    if (a->mode != NB_PA_FP_ONLY &&
        (!a->qblock_ids || !a->pools.upper || !a->pools.scales ||
         (a->mode == NB_PA_TARGET && !a->pools.lower)))
        return NB_ERR_INVALID_ARG;
    const int D = a->lay.head_dim, G = a->lay.group_size, es = (int)nb_kv_dtype_bytes(a->lay.dtype);
    if (D > 512) return NB_ERR_UNSUPPORTED;
    const int g = a->n_q_heads / a->lay.n_kv_heads;
    const bool fast = (D == 64 || D == 128) && a->lay.dtype != NB_DTYPE_F32;
    const long M_max = (long)a->max_rows * g;
    // Query vectors per CTA: at most 64, at most 2 P.V items a thread, within shared memory.
    int MT = M_max < MT_MAX ? (int)M_max : MT_MAX;
    const int n_cch = ((D + 7) & ~7) / CPT;
    pa_plan L;
    for (;;) {
        L = make_plan(D, G, es, a->mode, fast, MT);
        if (n_cch * cdiv(MT, MR) <= 2 * NT && L.smem_bytes <= SMEM_LIMIT) break;
        if (MT == 1) return NB_ERR_UNSUPPORTED;
        MT = (MT + 1) / 2;
    }
    L.n_mtiles = (int)((M_max + MT - 1) / MT);
    if ((long)a->lay.n_kv_heads * L.n_mtiles > 65535) return NB_ERR_UNSUPPORTED;

    pa_kp kp = {};
    kp.lay = a->lay;
    kp.upper = (const uint8_t *)a->pools.upper;
    kp.lower = (const uint8_t *)a->pools.lower;
    kp.scales = (const uint8_t *)a->pools.scales;
    kp.fp = (const uint8_t *)a->pools.fp;
    kp.layer = a->layer;
    kp.n_q_heads = a->n_q_heads;
    kp.g = g;
    kp.scale_log2 = a->softmax_scale * LOG2E;
    kp.seqs = a->seqs;
    kp.qtab = a->qblock_ids;
    kp.fptab = a->fpblock_ids;
    kp.q = a->q;
    kp.out = a->out;
    kp.ocvt = a->out_cvt;
    kp.ocvt_dt = (int)a->out_cvt_dt;
    kp.ocvt_sat = a->out_cvt && a->out_cvt_sat;
    kp.max_rows = a->max_rows;
    kp.pl = L;

    // Decode and short verify (<= 8 query vectors per kv head): the
    // warp-per-slice kernel. pa_merge_kernel reads only kp.pl.D of the plan.
    const bool aligned = ((uintptr_t)a->pools.fp | (uintptr_t)a->pools.upper | (uintptr_t)a->pools.lower |
                          (uintptr_t)a->pools.scales) % 16 == 0;
    const bool wide = a->fixed_chunk_groups > 0 && M_max > TC_M && M_max <= 3 * TC_M && tc_wide(&a->lay, a->mode, g);
    if (a->fixed_chunk_groups > 0 && !(fast && G % 32 == 0 && (M_max <= DEC_MMAX || wide) && aligned))
        return NB_ERR_UNSUPPORTED; // the row-invariant split exists in the decode kernels only
    if (a->fixed_chunk_groups < 0) return NB_ERR_INVALID_ARG;
    if (fast && G % 32 == 0 && (M_max <= DEC_MMAX || wide) && aligned) {
        if (D == TC_D && (M_max <= TC_M || wide) &&
            use_tc(g, a->mode, a->fixed_chunk_groups > 0, call_work_per_sm(a))) {
            const nb_status st = a->lay.dtype == NB_DTYPE_F16 ? tc_by_mode<__half>(kp, a, stream)
                                                              : tc_by_mode<__nv_bfloat16>(kp, a, stream);
            if (st != NB_ERR_UNSUPPORTED) return st; // unsupported: bf16 FP-only, the scalar kernel below
        }
        if (D == 128 && a->lay.dtype == NB_DTYPE_F16) return dec_by_m<128, __half>(kp, a, (int)M_max, stream);
        if (D == 128) return dec_by_m<128, __nv_bfloat16>(kp, a, (int)M_max, stream);
        if (a->lay.dtype == NB_DTYPE_F16) return dec_by_m<64, __half>(kp, a, (int)M_max, stream);
        return dec_by_m<64, __nv_bfloat16>(kp, a, (int)M_max, stream);
    }
    if (use_pf(a, aligned)) {
        const char *e = getenv("NB_PA_PF");
        const bool wg = G % PW_TT == 0 && !(e && e[0] == '1');
        if (a->lay.dtype == NB_DTYPE_F16)
            return wg ? pf_by_mode<__half, true>(kp, a, stream) : pf_by_mode<__half, false>(kp, a, stream);
        return wg ? pf_by_mode<__nv_bfloat16, true>(kp, a, stream) : pf_by_mode<__nv_bfloat16, false>(kp, a, stream);
    }
    if (fast && D == 128 && a->lay.dtype == NB_DTYPE_F16) return by_mode<128, __half>(kp, a, (int)M_max, stream);
    if (fast && D == 128) return by_mode<128, __nv_bfloat16>(kp, a, (int)M_max, stream);
    if (fast && D == 64 && a->lay.dtype == NB_DTYPE_F16) return by_mode<64, __half>(kp, a, (int)M_max, stream);
    if (fast && D == 64) return by_mode<64, __nv_bfloat16>(kp, a, (int)M_max, stream);
    switch (a->lay.dtype) {
    case NB_DTYPE_F32: return by_mode<0, float>(kp, a, (int)M_max, stream);
    case NB_DTYPE_F16: return by_mode<0, __half>(kp, a, (int)M_max, stream);
    default: return by_mode<0, __nv_bfloat16>(kp, a, (int)M_max, stream);
    }
}

#ifdef NB_PA_TRACE
// Diagnostic builds: the tensor-core decode kernel's per-CTA timestamps of
// the last launch (see TC_TRACE), TC_TRACE_W words per CTA.
extern "C" int nb_pa_trace_reset(void) {
    static unsigned long long zero[TC_TRACE_MAX * TC_TRACE_W];
    static_assert(MTRACE_MAX * 3 + 1 <= TC_TRACE_MAX * TC_TRACE_W, "one zero buffer");
    if (cudaMemcpyToSymbol(g_pa_mtrace, zero, sizeof(g_pa_mtrace)) != cudaSuccess) return -1;
    if (cudaMemcpyToSymbol(g_pa_wtrace, zero, sizeof(g_pa_wtrace)) != cudaSuccess) return -1;
    const char *sk = getenv("NB_PA_SKIPMERGE");
    const int skip = sk ? atoi(sk) : 0;
    if (cudaMemcpyToSymbol(g_pa_skip_merge, &skip, sizeof(skip)) != cudaSuccess) return -1;
    return cudaMemcpyToSymbol(g_pa_trace, zero, sizeof(zero)) == cudaSuccess ? 0 : -1;
}
// Every CTA's (latest, ~earliest) warp loop end (see TC_TRACE_WARPS).
extern "C" int nb_pa_trace_read_warps(unsigned long long *host, int n_ctas) {
    if (n_ctas > TC_TRACE_MAX) n_ctas = TC_TRACE_MAX;
    return cudaMemcpyFromSymbol(host, g_pa_wtrace, sizeof(unsigned long long) * 2 * n_ctas) == cudaSuccess ? n_ctas
                                                                                                            : -1;
}
// The merge kernel's CTAs (3 stamps each) and the marker, as g_pa_mtrace.
extern "C" int nb_pa_trace_read_merge(unsigned long long *host, int n_ctas) {
    if (n_ctas > MTRACE_MAX) n_ctas = MTRACE_MAX;
    if (cudaMemcpyFromSymbol(host, g_pa_mtrace, sizeof(unsigned long long) * 3 * n_ctas) != cudaSuccess) return -1;
    if (cudaMemcpyFromSymbol(host + 3 * n_ctas, g_pa_mtrace, sizeof(unsigned long long),
                             sizeof(unsigned long long) * 3 * MTRACE_MAX) != cudaSuccess)
        return -1;
    return n_ctas;
}
extern "C" int nb_pa_trace_marker(cudaStream_t s) {
    pa_trace_marker_kernel<<<1, 1, 0, s>>>();
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
extern "C" int nb_pa_trace_read(unsigned long long *host, int n_ctas) {
    if (n_ctas > TC_TRACE_MAX) n_ctas = TC_TRACE_MAX;
    return cudaMemcpyFromSymbol(host, g_pa_trace, sizeof(unsigned long long) * TC_TRACE_W * n_ctas) == cudaSuccess
               ? n_ctas
               : -1;
}
#endif
