// paged_attention_prefill_wg.cuh: the prefill kernel on Hopper's warpgroup
// MMAs (wgmma) with a producer warpgroup (included by
// paged_attention_cuda.cu inside its anonymous namespace, after
// paged_attention_prefill.cuh, whose tile record, q split and exactness
// rules it shares).
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
//       scores [64 q x 64 tok] = Q' [64 x 128] . K'^T  (8 k-steps, hi + lo: 16 wgmma m64n64k16)
//       out    [64 q x 128 ch] += P' [64 x 64 tok] . V' (4 wgmma m64n128k16, V N-major)
//   - a producer warpgroup only copies (cp.async) and stages (quantized
//     codes and steps, bf16 -> f16) into a ring of 3 slots, then
//     fence.proxy.async and an arrive on the slot's "full" mbarrier; the
//     two consumer warpgroups wait on "full", compute, and arrive on
//     "empty" (which the producer waits on before refilling the slot). No
//     CTA-wide barrier in the tile loop: the consumers run free, so one's
//     softmax runs under the other's MMAs, and staging under both.
//   - setmaxnreg moves registers from the producer (PS_PREG) to the
//     consumers (PS_CREG).
// The register layouts of wgmma's A fragments and accumulators per warp are
// mma.m16n8k16's, so the online softmax, the q split and fold (build_a), the
// code-domain switch and the epilogue are pa_prefill_kernel's, with 8 score
// n-tiles instead of 4.
//
// Shared memory tiles (K and V, 64 tokens x 128 channels, f16) are in
// wgmma's 128-byte-swizzle canonical layout: two 8 KB halves of 64 channels;
// in a half, token r's 128-byte row at r * 128, its 16-byte chunk j at
// chunk j ^ (r & 7); 1024-byte aligned. The same bytes serve K as a K-major
// B operand (scores: N = tokens, K = channels; stride between 8-token groups
// 1024 B) and V as an N-major one (out: K = tokens, N = channels; 8-token
// groups 1024 B apart, the channel halves 8192 B). FP tiles are copied
// straight into that layout (bf16: converted in place; f16 rows past the
// sequence zero-filled instead of copied); quantized tiles are staged from
// their raw planes as f16 subnormal codes, as in pa_prefill_kernel (K's
// 8-channel chunks in the even-odd order build_a mirrors).
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
// Registers per thread after setmaxnreg. They come from the CTA's own
// allocation (384 x 168 at launch): a larger sum would leave the consumers'
// setmaxnreg.inc waiting forever.
constexpr int PS_PREG = 56, PS_CREG = 224;
static_assert(128 * PS_PREG + 256 * PS_CREG <= PS_NT * 168, "setmaxnreg within the launch allocation");
// Shared memory (from a 1024-byte aligned base): PS_NS slots, then q *
// scale * log2(e) as f32 [128][PF_QLD], then the full and empty mbarriers.
// Slot: the staged tile (K, V f16 swizzled), the raw quantized planes and
// 16-bit scales (pf_raw), the f32 K step / zero' [128] each and V step /
// zero' [64] each.
constexpr int PS_RAW = PW_TILE * 2;
constexpr int PS_F32 = PS_RAW + PWR::BYTES;
constexpr int PS_SLOT = (PS_F32 + 2 * 128 * 4 + 2 * PW_TT * 4 + 1023) & ~1023;
constexpr int PS_Q_OFF = PS_NS * PS_SLOT;
constexpr int PS_BAR_OFF = PS_Q_OFF + PW_MT * PF_QLD * 4;
constexpr int PS_SMEM = PS_BAR_OFF + 2 * PS_NS * 8 + 1024; // + alignment slack
static_assert(PS_SMEM <= 227 * 1024, "one CTA per SM");

template <typename T, int MODE>
__global__ void __launch_bounds__(PS_NT, 1) pa_prefill_wg_kernel(const pa_kp P) {
    constexpr bool QUANT = MODE == NB_PA_TARGET;
    constexpr bool F16 = std::is_same<T, __half>::value;
    constexpr float K20 = 1048576.0f; // 2^24 (subnormal codes) / 16 (the target step S/16)
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
    uint64_t *full = (uint64_t *)(smem + PS_BAR_OFF), *empty = full + PS_NS;
    if (tid == 0) {
        for (int s = 0; s < PS_NS; s++) {
            mbar_init(full + s, 128);        // every producer thread
            mbar_init(empty + s, 4 * n_cwg); // every warp of the active consumer warpgroups
        }
    }
    float *qs = (float *)(smem + PS_Q_OFF);
    C.load_q(P, qs);
    __syncthreads(); // barriers initialized, q staged: the last CTA-wide barrier

    if (warp < 4) { // ================= producer =================
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PS_PREG));
        const int pt = tid; // 0..127
        // Copies of tile k into its slot: FP rows < tl straight into the
        // swizzled tile (f16 rows past tl are zero-filled instead); quantized
        // planes and scales into the raw area.
        auto issue = [&](int k) {
            const pf_tile x = tile_get(k);
            uint8_t *sl = smem + (k % PS_NS) * PS_SLOT;
            if (x.fp) {
                const uint8_t *kg = P.fp + nb_kv_fp_offset(&lay, P.layer, x.block, kvh, 0, x.t0) * sizeof(T);
                const uint8_t *vg = P.fp + nb_kv_fp_offset(&lay, P.layer, x.block, kvh, 1, x.t0) * sizeof(T);
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
            } else if (QUANT) {
                pf_copy_raw<T, PW_TT>(P, x, kvh, sl + PS_RAW, pt, 128);
            }
        };
#pragma unroll 1
        for (int k = 0; k < n_tiles; k++) {
            if (k == 0) {
                issue(0);
                cp_commit();
            }
            if (k + 1 < n_tiles) { // tile k+1's copies fly while tile k is staged
                if (k + 1 >= PS_NS) mbar_wait(empty + (k + 1) % PS_NS, (((k + 1) / PS_NS) - 1) & 1);
                issue(k + 1);
            }
            cp_commit();
            cp_wait<1>(); // this thread's copies of tile k
            const pf_tile x = tile_get(k);
            uint8_t *sl = smem + (k % PS_NS) * PS_SLOT;
            if (x.fp) {
                if (!F16) { // bf16 -> f16 in place, the chunks this thread copied
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
            } else if (QUANT) {
                asm volatile("bar.sync 1, 128;\n" ::: "memory"); // every producer thread's raw copies landed
                const uint8_t *rw = sl + PS_RAW;
                const int j = pt & 15, r0 = pt >> 4; // word j of rows r0 + 8k (byte layout as pa_prefill_kernel)
#pragma unroll 2
                for (int k8 = 0; k8 < 8; k8++) {
                    const int r = r0 + 8 * k8;
                    uint4 wk = make_uint4(0u, 0u, 0u, 0u), wv = wk;
                    if (r < x.tl) pf_codes<PW_TT>(rw, r, j, wk, wv);
                    *(uint4 *)(sl + pw_sw(r, j)) = wk;
                    *(uint4 *)(sl + PW_TILE + pw_sw(r, j)) = wv;
                }
                float *f = (float *)(sl + PS_F32); // K step [128], zero' [128], V step [64], zero' [64]
                {
                    const float s = t2_f2<T>(*(const uint16_t *)(rw + PWR::KS + 2 * pt)).x;
                    const float z = t2_f2<T>(*(const uint16_t *)(rw + PWR::KZ + 2 * pt)).x;
                    f[pt] = s;
                    f[128 + pt] = fmaf(-0.5f, s, z);
                }
                if (pt < PW_TT) {
                    float s = 0.0f, z = 0.0f;
                    if (pt < x.tl) {
                        s = t2_f2<T>(*(const uint16_t *)(rw + PWR::VS + 2 * pt)).x;
                        z = fmaf(-0.5f, s, t2_f2<T>(*(const uint16_t *)(rw + PWR::VZ + 2 * pt)).x);
                    }
                    f[256 + pt] = s;
                    f[256 + PW_TT + pt] = z;
                }
            }
            fence_async_smem(); // the slot's tiles are read next by the tensor cores
            mbar_arrive(full + k % PS_NS);
        }
        cp_wait<0>();
        return;
    }

    // ================= consumers =================
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(PS_CREG));
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
    float mrun[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f}, zsum[2] = {0.0f, 0.0f}, qz[2] = {0.0f, 0.0f};
    uint32_t ah[8][4], al[8][4]; // Q' A fragments, k-step ks = channels 16ks..16ks+15
    int cur = -2;                // what ah/al hold: a quantized unit, -1 (FP: q itself), -2 nothing
    bool qdom = QUANT;           // accumulators in the code domain (x 2^-20)

    // Q' = q (* S_c) as hi + lo; qz (pf_build_a), the block's steps from the slot.
    auto build_a = [&](bool fold, const float *ks) { pf_build_a(qs, ks, wm0, lane, fold, ah, al, qz); };
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
        const float *f = (const float *)(sl + PS_F32);
        const bool fp = !QUANT || x.fp;
        if (fp) {
            if (cur != -1) {
                build_a(false, f);
                cur = -1;
            }
            if (qdom) {
#pragma unroll
                for (int i = 0; i < 64; i++) acc[i] *= K20;
                qdom = false;
            }
        } else if (cur != x.unit) {
            build_a(true, f);
            cur = x.unit;
        }
        const uint32_t kc_s = s_u32(sl), vc_s = s_u32(sl + PW_TILE);
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
        uint32_t pa[4][4];
        const float *vs = f + 256;
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
            zsum[h] += __shfl_xor_sync(0xffffffffu, zsum[h], o);
        }
    const float dom = qdom ? K20 : 1.0f;
#pragma unroll
    for (int h = 0; h < 2; h++)
        if (rok[h])
            C.store(P, wm0 + g8 + 8 * h, t4, mrun[h], lsum[h], zsum[h], dom,
                    [&](int n, int j) { return acc[4 * n + 2 * h + j]; });
}
