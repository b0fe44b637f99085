// paged_attention_prefill_wg.cuh: the prefill kernel on Hopper's warpgroup
// MMAs (wgmma; included by paged_attention_cuda.cu inside its anonymous
// namespace, after paged_attention_prefill.cuh, whose tile record, q split
// and exactness rules it shares).
//
// The one idea: pa_prefill_kernel issues mma.sync, whose operands all pass
// through registers: each warp loads every K and V fragment of a tile with
// ldmatrix for its own 16 query vectors. Here a warpgroup (4 warps) owns 64
// query vectors and the tensor cores read K and V straight from shared
// memory (wgmma, B operand by descriptor), 64 x 64 scores or 64 x 128
// outputs per instruction, while the warpgroup's registers hold only q
// (A operand), the scores and the outputs. Per 64-token tile and warpgroup:
//   scores [64 q x 64 tok] = Q' [64 x 128] . K'^T  (8 k-steps, hi + lo: 16 wgmma m64n64k16)
//   out    [64 q x 128 ch] += P' [64 x 64 tok] . V' (4 wgmma m64n128k16, V N-major)
// The register layouts of wgmma's A fragments and accumulators per warp are
// mma.m16n8k16's, so the online softmax, the q split and fold (build_a), the
// code-domain switch and the epilogue are pa_prefill_kernel's, with 8 score
// n-tiles instead of 4; the bits differ only by the order in which the
// tensor cores sum their products.
//
// Shared memory tiles (K and V, 64 tokens x 128 channels, f16) are in
// wgmma's 128-byte-swizzle canonical layout: two 8 KB halves of 64 channels;
// in a half, token r's 128-byte row at r * 128, its 16-byte chunk j at
// chunk j ^ (r & 7); 1024-byte aligned. The same bytes serve K as a K-major
// B operand (scores: N = tokens, K = channels; stride between 8-token groups
// 1024 B) and V as an N-major one (out: K = tokens, N = channels; 8-token
// groups 1024 B apart, the channel halves 8192 B). FP tiles are copied
// straight into that layout (bf16: converted in place); quantized tiles are
// staged from the raw planes as f16 subnormal codes, as in pa_prefill_kernel
// (K's 8-channel chunks in the even-odd order build_a mirrors).
//
// A CTA is two warpgroups (128 query vectors, one CTA per SM) that share
// the cp.async ring; every thread copies, stages and syncs, then each
// warpgroup computes its tile while the other's MMAs run. Shapes: as
// pa_prefill_kernel, and G % 64 == 0 (other group sizes take it).

constexpr int PW_NWG = 2, PW_NT = 128 * PW_NWG;
constexpr int PW_MT = 64 * PW_NWG; // query vectors per CTA
constexpr int PW_TT = 64;          // tokens per tile
constexpr int PW_NS = 3;           // cp.async stages
constexpr int PW_TILE = PW_TT * 256; // one f16 [64 tok][128 ch] tile
// Shared memory (from a 1024-byte aligned base): the staged code tiles Kc,
// Vc; the ring (an FP tile's K + V, or a quantized tile's raw planes and
// scales); q * scale * log2(e) as f32 [128][PF_QLD]; the block's K step and
// zero' (f32 [128] each); the tile's V step and zero' (f32 [64] each).
constexpr int PW_KC_OFF = 0;
constexpr int PW_VC_OFF = PW_TILE;
constexpr int PW_RAW_OFF = 2 * PW_TILE;
constexpr int PW_SLOT = 2 * PW_TILE;
constexpr int PW_Q_OFF = PW_RAW_OFF + PW_NS * PW_SLOT;
constexpr int PW_KS_OFF = PW_Q_OFF + PW_MT * PF_QLD * 4;
constexpr int PW_VS_OFF = PW_KS_OFF + 2 * 128 * 4;
constexpr int PW_SMEM = PW_VS_OFF + 2 * PW_TT * 4 + 1024; // + alignment slack
// Raw quantized slot: K upper, V upper, K lower, V lower planes [64][64];
// K step[128], K zero[128], V step[64], V zero[64] (16-bit).
constexpr int PWR_KU = 0, PWR_VU = 4096, PWR_KL = 8192, PWR_VL = 12288;
constexpr int PWR_KS = 16384, PWR_KZ = PWR_KS + 256, PWR_VS = PWR_KZ + 256, PWR_VZ = PWR_VS + 128;
static_assert(PWR_VZ + 128 <= PW_SLOT, "a quantized tile fits the slot");
static_assert(PW_SMEM <= 227 * 1024, "one CTA per SM");

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

template <typename T, int MODE>
__global__ void __launch_bounds__(PW_NT, 1) pa_prefill_wg_kernel(const pa_kp P) {
    constexpr bool QUANT = MODE == NB_PA_TARGET;
    constexpr float K20 = 1048576.0f; // 2^24 (subnormal codes) / 16 (the target step S/16)
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t *const smem = smem_raw + ((1024u - (s_u32(smem_raw) & 1023u)) & 1023u);
    const nb_kv_layout lay = P.lay;
    const int G = lay.group_size, ntq = G / PW_TT;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
    const int chunk = blockIdx.x, kvh = blockIdx.y / P.pl.n_mtiles, mt = blockIdx.y % P.pl.n_mtiles;
    const int seq = blockIdx.z, gq = P.g;
    const nb_pa_seq S = P.seqs[seq];
    const int m0 = mt * PW_MT;
    const int M = min(PW_MT, S.n_rows * gq - m0); // query vectors of this CTA
    if (M <= 0) return;
    const int nq = QUANT ? S.n_qblocks : 0, pq = QUANT ? (S.has_prequant != 0) : 0;
    const int seq_end = S.pos0 + S.n_rows;
    const int pos_end = S.pos0 + (m0 + M - 1) / gq + 1; // this CTA's rows read positions < pos_end
    const int fp_span = seq_end - nq * G;
    const int nU = nq + pq + (fp_span > 0 ? cdiv(fp_span, G) : 0);
    const int u0 = chunk * P.upc, u1 = min(nU, u0 + P.upc);
    const int uq = max(min(nq + pq - u0, u1 - u0), 0), uf = max(u1 - u0 - uq, 0);
    const int jf0 = u0 + uq - nq - pq; // FP table index of the chunk's first FP unit
    int nft = 0;
    if (uf > 0) {
        const int span = pos_end - (nq + jf0) * G;
        nft = span > 0 ? min(uf * ntq, cdiv(span, PW_TT)) : 0;
    }
    const int n_tiles = uq * ntq + nft;

    auto pidx = [&](int m) { // workspace index of query vector m of this CTA
        const int mg = m0 + m, r = mg / gq, h = kvh * gq + mg % gq;
        return ((size_t)(seq * P.n_chunks + chunk) * P.max_rows + r) * P.n_q_heads + h;
    };
    if (n_tiles == 0) { // NOTE: only with split-K; an empty chunk still tells the merge it holds nothing
        for (int m = tid; m < M; m += PW_NT) {
            P.ws_ml[2 * pidx(m)] = -INFINITY;
            P.ws_ml[2 * pidx(m) + 1] = 0.0f;
        }
        return;
    }

    auto tile_get = [&](int k) {
        pf_tile x;
        if (k < uq * ntq) {
            const int u = u0 + k / ntq;
            x.fp = 0;
            x.t0 = (k % ntq) * PW_TT;
            x.block = P.qtab[S.qblock_off + u]; // u == nq: the pre-quantized C_F1
            x.pos = u * G + x.t0;
            x.rmask = u < nq ? 0 : 1;
            x.unit = u;
        } else {
            k -= uq * ntq;
            const int j = jf0 + k / ntq;
            x.fp = 1;
            x.t0 = (k % ntq) * PW_TT;
            x.block = P.fptab[S.fpblock_off + j];
            x.pos = (nq + j) * G + x.t0;
            x.rmask = (pq && j == 0) ? 2 : 0;
            x.unit = -1;
        }
        x.tl = min(PW_TT, seq_end - x.pos);
        return x;
    };
    // Whole 64-token rows are copied (they lie inside the block); rows at
    // or past tl are zeroed when staged.
    auto issue = [&](int k) {
        const pf_tile x = tile_get(k);
        uint8_t *sb = smem + PW_RAW_OFF + (k % PW_NS) * PW_SLOT;
        if (x.fp) {
            const uint8_t *kg = P.fp + nb_kv_fp_offset(&lay, P.layer, x.block, kvh, 0, x.t0) * sizeof(T);
            const uint8_t *vg = P.fp + nb_kv_fp_offset(&lay, P.layer, x.block, kvh, 1, x.t0) * sizeof(T);
#pragma unroll
            for (int i = tid; i < PW_TT * 16; i += PW_NT) { // straight into the swizzled layout
                const int r = i >> 4, j = i & 15;
                cp_async16(sb + pw_sw(r, j), kg + 16 * i);
                cp_async16(sb + PW_TILE + pw_sw(r, j), vg + 16 * i);
            }
        } else if (QUANT) {
            const size_t ko = nb_kv_plane_offset(&lay, P.layer, x.block, kvh, 0, x.t0);
            const size_t vo = nb_kv_plane_offset(&lay, P.layer, x.block, kvh, 1, x.t0);
            cp_async16(sb + PWR_KU + 16 * tid, P.upper + ko + 16 * tid); // 256 x 16 B = 64 rows x 64 B
            cp_async16(sb + PWR_VU + 16 * tid, P.upper + vo + 16 * tid);
            cp_async16(sb + PWR_KL + 16 * tid, P.lower + ko + 16 * tid);
            cp_async16(sb + PWR_VL + 16 * tid, P.lower + vo + 16 * tid);
            if (tid < 48) {
                const uint8_t *sc = P.scales;
                const size_t es = sizeof(T);
                if (tid < 16)
                    cp_async16(sb + PWR_KS + 16 * tid,
                               sc + nb_kv_scales_offset(&lay, P.layer, x.block, kvh, NB_KV_K_SCALE) * es + 16 * tid);
                else if (tid < 32)
                    cp_async16(sb + PWR_KZ + 16 * (tid - 16),
                               sc + nb_kv_scales_offset(&lay, P.layer, x.block, kvh, NB_KV_K_ZERO) * es +
                                   16 * (tid - 16));
                else if (tid < 40)
                    cp_async16(sb + PWR_VS + 16 * (tid - 32),
                               sc + (nb_kv_scales_offset(&lay, P.layer, x.block, kvh, NB_KV_V_SCALE) + x.t0) * es +
                                   16 * (tid - 32));
                else
                    cp_async16(sb + PWR_VZ + 16 * (tid - 40),
                               sc + (nb_kv_scales_offset(&lay, P.layer, x.block, kvh, NB_KV_V_ZERO) + x.t0) * es +
                                   16 * (tid - 40));
            }
        }
    };

#pragma unroll 1
    for (int s = 0; s < PW_NS - 1; s++) {
        if (s < n_tiles) issue(s);
        cp_commit();
    }

    float *qs = (float *)(smem + PW_Q_OFF);
    for (int i = tid; i < PW_MT * 32; i += PW_NT) { // float4 of q per thread
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

    // This warpgroup's 64 query vectors (uniform across its warps: every
    // wgmma is issued by all four), and this warp's 16.
    const int wgm0 = 64 * (warp >> 2);
    const bool wg_act = wgm0 < M;
    const int wg_pmax = S.pos0 + (m0 + min(wgm0 + 63, M - 1)) / gq; // its last row's position
    const int wm0 = 16 * warp;
    const int wp_min = S.pos0 + (m0 + min(wm0, M - 1)) / gq; // this warp's first row's
    const bool wfull = wm0 + 15 < M;                           // all 16 query vectors valid
    int prow[2];
    bool rok[2], rpre[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int m = wm0 + g8 + 8 * h;
        rok[h] = m < M;
        prow[h] = S.pos0 + (m0 + (rok[h] ? m : 0)) / gq;
        rpre[h] = row_uses_prequant(prow[h], G, nq, pq);
    }
    float acc[64]; // out: n-tile n (channels 8n..8n+7) at acc[4n .. 4n+3]
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    float mrun[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f}, zsum[2] = {0.0f, 0.0f}, qz[2] = {0.0f, 0.0f};
    uint32_t ah[8][4], al[8][4]; // Q' A fragments, k-step ks = channels 16ks..16ks+15
    int cur = -2;                // what ah/al hold: a quantized unit, -1 (FP: q itself), -2 nothing
    bool qdom = QUANT;           // accumulators in the code domain (x 2^-20)

    // As pa_prefill_kernel's build_a (the same channel order for quantized K).
    auto build_a = [&](bool fold) {
        const float *q0 = qs + (wm0 + g8) * PF_QLD, *q1 = q0 + 8 * PF_QLD;
        const float *ks = (const float *)(smem + PW_KS_OFF), *kz = ks + 128;
        float z0 = 0.0f, z1 = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
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
                pf_split(a.x, a.y, ah[k][2 * h], al[k][2 * h]);
                pf_split(b.x, b.y, ah[k][2 * h + 1], al[k][2 * h + 1]);
            }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
            z0 += __shfl_xor_sync(0xffffffffu, z0, o);
            z1 += __shfl_xor_sync(0xffffffffu, z1, o);
        }
        qz[0] = fold ? z0 : 0.0f;
        qz[1] = fold ? z1 : 0.0f;
    };

#pragma unroll 1
    for (int it = 0; it < n_tiles; it++) {
        cp_wait<PW_NS - 2>();
        fence_async_smem(); // this thread's copies of tile `it`, next read by the tensor cores
        __syncthreads();    // tile `it` landed; every warpgroup is done with tile it-1
        if (it + PW_NS - 1 < n_tiles) issue(it + PW_NS - 1);
        cp_commit();
        const pf_tile x = tile_get(it);
        const uint8_t *sb = smem + PW_RAW_OFF + (it % PW_NS) * PW_SLOT;

        // ---- stage: FP tiles in place (bf16 -> f16; rows past the
        // sequence zeroed), quantized tiles -> f16 codes in Kc/Vc, steps ----
        constexpr bool F16 = std::is_same<T, __half>::value;
        const bool fp = !QUANT || x.fp;
        if (fp) {
            if (!F16 || x.tl < PW_TT) {
                uint8_t *sw = smem + PW_RAW_OFF + (it % PW_NS) * PW_SLOT;
#pragma unroll
                for (int i = tid; i < 2 * PW_TT * 16; i += PW_NT) {
                    const int kv = i >> 10, r = (i >> 4) & 63, j = i & 15;
                    uint4 *a = (uint4 *)(sw + kv * PW_TILE + pw_sw(r, j));
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
                fence_async_smem();
                __syncthreads();
            }
        } else if (QUANT) {
            // Thread: word j (channels 8j..8j+7) of rows r0 + 16k, k = 0..3;
            // byte layout as in pa_prefill_kernel.
            const int j = tid & 15, r0 = tid >> 4;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int r = r0 + 16 * k;
                uint4 wk = make_uint4(0u, 0u, 0u, 0u), wv = wk;
                if (r < x.tl) {
                    const uint32_t ku = *(const uint32_t *)(sb + PWR_KU + r * 64 + 4 * j);
                    const uint32_t kl = *(const uint32_t *)(sb + PWR_KL + r * 64 + 4 * j);
                    const uint32_t vu = *(const uint32_t *)(sb + PWR_VU + r * 64 + 4 * j);
                    const uint32_t vl = *(const uint32_t *)(sb + PWR_VL + r * 64 + 4 * j);
                    const uint32_t ke = codes_even(ku, kl), ko = codes_odd(ku, kl);
                    wk = make_uint4(prmt(ke, 0u, 0x4140), prmt(ke, 0u, 0x4342), prmt(ko, 0u, 0x4140),
                                    prmt(ko, 0u, 0x4342));
                    const uint32_t ve = codes_even(vu, vl), vo = codes_odd(vu, vl);
                    const uint32_t x0 = prmt(ve, vo, 0x5140), x1 = prmt(ve, vo, 0x7362);
                    wv = make_uint4(prmt(x0, 0u, 0x4140), prmt(x0, 0u, 0x4342), prmt(x1, 0u, 0x4140),
                                    prmt(x1, 0u, 0x4342));
                }
                *(uint4 *)(smem + PW_KC_OFF + pw_sw(r, j)) = wk;
                *(uint4 *)(smem + PW_VC_OFF + pw_sw(r, j)) = wv;
            }
            float *ks = (float *)(smem + PW_KS_OFF), *vs = (float *)(smem + PW_VS_OFF);
            if ((x.t0 == 0 || it == 0) && tid < 128) { // the block's K step and zero' = zero - step/2
                const float s = t2_f2<T>(*(const uint16_t *)(sb + PWR_KS + 2 * tid)).x;
                const float z = t2_f2<T>(*(const uint16_t *)(sb + PWR_KZ + 2 * tid)).x;
                ks[tid] = s;
                ks[128 + tid] = fmaf(-0.5f, s, z);
            }
            if (tid >= 128 && tid < 128 + PW_TT) {
                const int t = tid - 128;
                float s = 0.0f, z = 0.0f;
                if (t < x.tl) {
                    s = t2_f2<T>(*(const uint16_t *)(sb + PWR_VS + 2 * t)).x;
                    z = fmaf(-0.5f, s, t2_f2<T>(*(const uint16_t *)(sb + PWR_VZ + 2 * t)).x);
                }
                vs[t] = s;
                vs[PW_TT + t] = z;
            }
            fence_async_smem();
            __syncthreads();
        }
        if (!wg_act || x.tl <= 0 || x.pos > wg_pmax) continue; // nothing of this tile for this warpgroup
        if (fp) {
            if (cur != -1) {
                build_a(false);
                cur = -1;
            }
            if (qdom) {
#pragma unroll
                for (int i = 0; i < 64; i++) acc[i] *= K20;
                qdom = false;
            }
        } else if (cur != x.unit) {
            build_a(true);
            cur = x.unit;
        }

        const uint32_t kc_s = fp ? s_u32(sb) : s_u32(smem + PW_KC_OFF);
        const uint32_t vc_s = fp ? s_u32(sb + PW_TILE) : s_u32(smem + PW_VC_OFF);
        // ---- scores: 8 k-steps, hi + lo ----
        float sc[32]; // token n-tile n (tokens 8n..8n+7) at sc[4n .. 4n+3]
#pragma unroll
        for (int i = 0; i < 32; i++) sc[i] = 0.0f;
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 8; ks++) {
            const uint64_t d = pw_desc(kc_s + (ks >> 2) * 8192 + (ks & 3) * 32, 16, 1024);
            wg_mma_n64(sc, ah[ks], d);
            wg_mma_n64(sc, al[ks], d);
        }
        wg_commit();
        wg_wait0();
        reg_fence(sc);
        // ---- online softmax (log2 units); sc[4n + i]: row g8 + 8 (i >> 1), token 8n + 2t4 + (i & 1) ----
        const float ksc = fp ? 1.0f : K20;
        float mx[2] = {-INFINITY, -INFINITY};
        if (x.tl == PW_TT && x.rmask == 0 && x.pos + PW_TT - 1 <= wp_min && wfull) { // no masks
#pragma unroll
            for (int i = 0; i < 32; i++) {
                sc[i] = fmaf(sc[i], ksc, qz[(i >> 1) & 1]);
                mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], sc[i]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++) {
                const int h = (i >> 1) & 1, col = 8 * (i >> 2) + 2 * t4 + (i & 1);
                bool ok = rok[h] && col < x.tl && x.pos + col <= prow[h];
                if (x.rmask) ok = ok && (rpre[h] == (x.rmask == 1));
                sc[i] = ok ? fmaf(sc[i], ksc, qz[h]) : -INFINITY;
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
        float ps[2] = {0.0f, 0.0f}, pz[2] = {0.0f, 0.0f};
        uint32_t pa[4][4]; // P' A fragments, k-step kk = tokens 16kk..16kk+15
        const float *vs = (const float *)(smem + PW_VS_OFF);
#pragma unroll
        for (int n = 0; n < 8; n++) {
            float p[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                p[i] = ex2_ftz(sc[4 * n + i] - msafe[i >> 1]);
                ps[i >> 1] += p[i];
            }
            if (!fp) {
                const float2 st = *(const float2 *)(vs + 8 * n + 2 * t4);
                const float2 zt = *(const float2 *)(vs + PW_TT + 8 * n + 2 * t4);
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
            acc[4 * n] *= alpha[0];
            acc[4 * n + 1] *= alpha[0];
            acc[4 * n + 2] *= alpha[1];
            acc[4 * n + 3] *= alpha[1];
        }
        // ---- out += P' . V: 4 k-steps of 16 tokens ----
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wg_mma_n128_t(acc, pa[kk], pw_desc(vc_s + kk * 2048, 8192, 1024));
        wg_commit();
        wg_wait0();
        reg_fence(acc);
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
    const float dom = qdom ? K20 : 1.0f;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (!rok[h]) continue;
        const int m = wm0 + g8 + 8 * h, mg = m0 + m, r = mg / gq, hq = kvh * gq + mg % gq;
        if (P.n_chunks == 1) {
            float *o = P.out + ((size_t)(S.row_off + r) * P.n_q_heads + hq) * TC_D + 2 * t4;
            const float inv = 1.0f / lsum[h];
#pragma unroll
            for (int n = 0; n < 16; n++)
                *(float2 *)(o + 8 * n) = make_float2(fmaf(acc[4 * n + 2 * h], dom, zsum[h]) * inv,
                                                     fmaf(acc[4 * n + 2 * h + 1], dom, zsum[h]) * inv);
        } else {
            const size_t pi = pidx(m);
            float *o = P.ws_o + pi * TC_D + 2 * t4;
#pragma unroll
            for (int n = 0; n < 16; n++)
                *(float2 *)(o + 8 * n) =
                    make_float2(fmaf(acc[4 * n + 2 * h], dom, zsum[h]), fmaf(acc[4 * n + 2 * h + 1], dom, zsum[h]));
            if (t4 == 0) {
                P.ws_ml[2 * pi] = mrun[h];
                P.ws_ml[2 * pi + 1] = lsum[h];
            }
        }
    }
}
