// paged_attention_tc.cuh: the tensor-core decode kernel for the quantized
// views (included by paged_attention_cuda.cu inside its anonymous namespace;
// uses its pa_kp, cp.async helpers, row_uses_prequant and the merge kernel).
//
// The one idea: the scalar decode kernel spends ~4 f32 ops per cached value
// and query vector, so with 4 query heads per kv head (Llama-3) or the
// half-byte draft view it is bound by the FMA pipe, not by memory. Here
// both products run on mma.sync m16n8k16 (f16 in, f32 accumulate) with the
// codes turned into exact f16 values in registers: K codes as subnormals
// (code * 2^-24 from a mask or a byte permute, the scale undone once per
// slice; draft_k4, target_k4), V codes as f16 integers (1024 + code, minus
// 1024: FP-block slices share the P.V accumulators, so no per-row scale):
//   scores^T [16 tokens x 8 query vectors] = K codes [16 x D] . (q*S_c)^T
//   out^T    [16 channels x 8 query vecs ] = V codes^T [16 x 16 tokens] . (p*S_t)^T
// The per-channel K steps S_c fold into q once per block (as in the scalar
// kernel), the per-token V steps into the softmax weights, and the zeros are
// the same scalar terms (q.Z per block, sum p*Z per query vector). q*S_c is
// split into f16 hi + lo parts (two mmas) so the scores keep ~22 bits; the
// weights p*S_t are one f16 each (flash attention's precision for P).
//
// Query vectors are the MMA's N = 8 columns (rows x GQA group <= 8, as in the
// scalar decode kernel), tokens and channels its M rows, so nothing is
// padded to 16 query vectors. Which channels and tokens a lane holds is a
// free choice as long as both operands agree; the choices below make every
// load a plain 16- or 8-byte shared-memory read:
//   K (A operand, rows = tokens g, g+8 of a 16-token tile): lane (g, t)
//     reads the 16-byte chunk t (channels 32t..32t+31) of its two token
//     rows; flat half2 f of a chunk pairs the channels kpair(f) and serves
//     k-step f/2 (a0/a1 for even f, a2/a3 for odd f). q*S is packed with the
//     same pairing.
//   V (A operand, rows = channels): lane (g, t) reads bytes 8g..8g+7 of the
//     token rows 2t, 2t+1, 2t+8, 2t+9 (channels 16g..16g+15); m-tile b holds
//     channel 16g+2b in row g and 16g+2b+1 in row g+8; a byte permute pairs
//     the same channel of two tokens.
//   P (B operand) comes from the score accumulators through 4 shuffles per
//   16 tokens (the accumulator holds (token, query pairs); B wants (token
//   pairs, query)).
// Each warp streams its 32-token slices through a private cp.async ring
// (NS stages: K and V planes, the block's K scales/zeros and the slice's V
// scales/zeros); rows are stored with their 16-byte chunks XOR-swizzled by
// bit 2 of the row so the V reads are free of bank conflicts. FP blocks
// (C_F1, the newest tokens) are read straight from global memory with the
// same fragment layout. The work split (units, row-invariant fixed chunks,
// the warps' shares of slices) is the scalar decode kernel's, so a row's
// result depends only on its own query, position and cache contents: the
// MMA computes each output element from its own row and column only.
//
// Shapes: D = 128, G % 32 == 0, f16 or bf16 cache (bf16 FP-block values are
// converted to f16, exact within f16's range; finite values beyond +-65504
// saturate), <= 8 query vectors per kv head.

constexpr int TC_NW = 4; // warps per CTA
constexpr int TC_NT = TC_NW * 32;
constexpr int TC_D = 128;
constexpr int TC_M = 8; // query vectors per kv head (MMA N)

// Staged q: [8 query vectors][4 chunks of 32 channels], each chunk padded to
// 36 floats so that the 16-byte reads of 8 lanes (2 query vectors x 4
// chunks) fall in distinct banks.
constexpr int TC_QS_C = 36, TC_QS_M = 4 * TC_QS_C;

template <int MODE> struct tc_cfg {
    static constexpr bool TGT = MODE == NB_PA_TARGET;
    static constexpr int PLANE = 32 * (TC_D / 2);               // one plane, 32 rows: 2048 B
    static constexpr int o_ku = 0, o_vu = PLANE;
    static constexpr int o_kl = 2 * PLANE, o_vl = 3 * PLANE;    // TARGET only
    static constexpr int o_ks = (TGT ? 4 : 2) * PLANE;          // K scale[D], K zero[D] (T)
    static constexpr int o_vs = o_ks + 2 * TC_D * 2;            // V scale[32] (T)
    static constexpr int o_vz = o_vs + 64;                      // V zero[32] (T)
    static constexpr int stage = o_vz + 64;
    // Ring stages per warp and CTAs per SM: 3 CTAs (12 warps) hide more
    // latency than deeper rings (measured); registers <= 168 for 3.
    static constexpr int NS = TGT ? 2 : 3;
    static constexpr int MIN_CTAS = 3;
    static constexpr int qs_bytes = TC_M * TC_QS_M * 4;        // q [8][4 chunks][36] f32 (padded)
    static constexpr int ring = TC_NW * NS * stage;
    static constexpr int mo_bytes = TC_NW * TC_M * TC_D * 4 + TC_NW * TC_M * 2 * 4;
    static constexpr int body = ring > mo_bytes ? ring : mo_bytes;
    // + the chunk's block-id table (tab_bytes(upc)) between q and the ring
    static int tab_bytes(int upc) { return ((upc + 1) * 4 + 15) & ~15; }
    static int smem(int upc) { return qs_bytes + tab_bytes(upc) + body; }
};

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x, approximate (max rel. error ~2^-22), denormal results flushed to 0;
// 2^-inf = 0.
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t h2u(__half2 h) { return *(uint32_t *)&h; }
__device__ __forceinline__ __half2 u2h(uint32_t u) { return *(__half2 *)&u; }

// f16 magic: 0x6400 | x is 1024 + x for x < 1024.
__device__ __forceinline__ uint32_t hsub_const(uint32_t h, uint32_t c2) { return h2u(__hsub2(u2h(h), u2h(c2))); }
constexpr uint32_t H1024 = 0x64006400u; // (1024, 1024)
constexpr uint32_t H1032 = 0x64086408u; // (1032, 1032)

// (x & M) | H1024 as one LOP3 (left to itself the compiler emits an AND and
// an OR, each with its immediate).
template <uint32_t M> __device__ __forceinline__ uint32_t and_or1024(uint32_t x) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(x), "n"(M), "r"(H1024));
    return d;
}

// Four half2 of upper nibbles from a word of 8, as f16 subnormals (no
// exponent bits: the value is the mantissa times 2^-24, exact, and the
// tensor cores take subnormal inputs as they are). h[0] = (c0, c4) and
// h[1] = (c2, c6) are U * 2^-24 (low nibbles), h[2] = (c1, c5) and h[3] =
// (c3, c7) are 16U * 2^-24 (high nibbles, left in place): k-step 2w of a
// word w takes the first two, k-step 2w + 1 the last two, so each
// accumulator chain holds one scale (undone once per slice).
__device__ __forceinline__ void draft_k4(uint32_t u, uint32_t (&h)[4]) {
    const uint32_t s = u >> 8;
    h[0] = u & 0x000f000fu;
    h[1] = s & 0x000f000fu;
    h[2] = u & 0x00f000f0u;
    h[3] = s & 0x00f000f0u;
}

// Even / odd channel codes 16U + Lstored (0..255) of a word pair, one byte each.
__device__ __forceinline__ uint32_t codes_even(uint32_t u, uint32_t l) {
    return ((u & 0x0f0f0f0fu) << 4) | (l & 0x0f0f0f0fu);
}
__device__ __forceinline__ uint32_t codes_odd(uint32_t u, uint32_t l) {
    return (u & 0xf0f0f0f0u) | ((l >> 4) & 0x0f0f0f0fu);
}

// Four half2 of C8 + 8 = 16U + Lstored (0..255) from a word pair of both
// planes, as f16 subnormals ((C8 + 8) * 2^-24, exact; the -8 is a q term
// per block). Pairs: (c0,c2) (c1,c3) (c4,c6) (c5,c7).
__device__ __forceinline__ void target_k4(uint32_t u, uint32_t l, uint32_t (&h)[4]) {
    const uint32_t e = codes_even(u, l), o = codes_odd(u, l);
    h[0] = __byte_perm(e, 0u, 0x4140);
    h[1] = __byte_perm(o, 0u, 0x4140);
    h[2] = __byte_perm(e, 0u, 0x4342);
    h[3] = __byte_perm(o, 0u, 0x4342);
}

// The two channels (within a 32-channel chunk) of flat half2 f (0..15).
template <int KIND> __device__ __forceinline__ int2 kpair(int f) {
    const int w = f >> 2, j = f & 3;
    if (KIND == 0) return make_int2(8 * w + 2 * (j & 1) + (j >> 1), 8 * w + 2 * (j & 1) + (j >> 1) + 4); // draft codes
    if (KIND == 1) return make_int2(8 * w + (j & 1) + 4 * (j >> 1), 8 * w + (j & 1) + 4 * (j >> 1) + 2); // target codes
    return make_int2(2 * f, 2 * f + 1);                                         // FP values
}

// Two 16-bit elements (one 32-bit word, low half first) as floats.
template <typename T> __device__ __forceinline__ float2 t2_f2(uint32_t w) {
    if constexpr (std::is_same<T, __half>::value) {
        return __half22float2(u2h(w));
    } else {
        return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
    }
}

// Two FP elements (one 32-bit word) as an f16 pair.
template <typename T> __device__ __forceinline__ uint32_t fp_pair_h(uint32_t w) {
    if constexpr (std::is_same<T, __half>::value) {
        return w;
    } else {
        float lo = __uint_as_float(w << 16), hi = __uint_as_float(w & 0xFFFF0000u);
        lo = fminf(fmaxf(lo, -65504.0f), 65504.0f);
        hi = fminf(fmaxf(hi, -65504.0f), 65504.0f);
        return h2u(__floats2half2_rn(lo, hi));
    }
}

// Byte offset in a stage plane of 16-byte chunk c of row r (swizzled).
__device__ __forceinline__ int tc_sw(int r, int c) { return r * 64 + ((c ^ (((r >> 2) & 1) << 1)) << 4); }

template <typename T, int MODE>
__global__ void __launch_bounds__(TC_NT, tc_cfg<MODE>::MIN_CTAS) pa_tc_kernel(const pa_kp P) {
    using C = tc_cfg<MODE>;
    constexpr bool TGT = C::TGT;
    constexpr int D = TC_D, RB = D / 2;
    extern __shared__ __align__(16) uint8_t smem[];
    float *qs = (float *)smem; // [8][4][TC_QS_C]
    int32_t *tab = (int32_t *)(smem + C::qs_bytes); // block id of unit ua + i
    uint8_t *body = smem + C::qs_bytes + ((P.upc + 1) * 4 + 15) / 16 * 16;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, t4 = lane & 3; // MMA group / thread-in-group
    uint8_t *ring = body + warp * C::NS * C::stage;

    const nb_kv_layout lay = P.lay;
    const int G = lay.group_size, gq = P.g;
    const int chunk = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z;
    const nb_pa_seq S = P.seqs[seq];
    const int nq = S.n_qblocks, pq = S.has_prequant != 0;
    const int pos_end = S.pos0 + S.n_rows;
    const int fp_span = pos_end - nq * G;
    const int nfp = fp_span > 0 ? cdiv(fp_span, G) : 0;
    const int nU = nq + pq + nfp;
    const int u0 = P.inv ? 0 : chunk * P.upc;
    const int u1 = P.inv ? ((long)chunk * P.upc * G < pos_end ? 1 : 0) : min(nU, u0 + P.upc);
    const int Mt = S.n_rows * gq; // <= 8
    if (u0 >= u1) {
        dec_empty_chunk(P, seq, chunk, kvh, Mt);
        return;
    }
    // Thread tid loads channel tid of every query vector now and stages it
    // after the first copies are issued, so the two latencies overlap.
    static_assert(TC_NT == TC_D, "thread tid stages channel tid of every query vector");
    float qreg[TC_M];
    {
        // query vector m = (row m / gq, head m % gq), walked without a division
        int r = 0, h = 0;
#pragma unroll
        for (int m = 0; m < TC_M; m++) {
            qreg[m] = m < Mt ? P.q[((size_t)(S.row_off + r) * P.n_q_heads + kvh * gq + h) * D + tid] : 0.0f;
            if (++h == gq) {
                h = 0;
                r++;
            }
        }
    }
    // The units this chunk can touch, [ua, ua + n_tab), and their block ids
    // (read once here, not per slice: a dependent global load per slice
    // would stall the copy pipeline).
    const int ua = P.inv ? chunk * P.upc + ((pq && chunk * P.upc > nq) ? 1 : 0) : u0;
    const int n_tab = P.inv ? min(P.upc + 1, nU - ua) : u1 - u0;
    for (int i = tid; i < n_tab; i += TC_NT) {
        const int u = ua + i;
        tab[i] = u < nq + pq ? P.qtab[S.qblock_off + u] : P.fptab[S.fpblock_off + u - nq - pq];
    }
    __syncthreads();

    // ---- the warp's items: 32-token slices, the pre-quantized group twice ----
    const int spu = G / 32;
    // slice k -> (k / spu, k % spu): a shift and a mask for G = 32 * 2^n
    const bool spu2 = (spu & (spu - 1)) == 0;
    const int lspu = __ffs(spu) - 1;
    const int n_sl = (P.inv ? P.upc : u1 - u0) * spu;
    const int k0 = warp * n_sl / TC_NW, k1 = (warp + 1) * n_sl / TC_NW;
    // Row-invariant with a pre-quantized C_F1: the slices of group nq come
    // twice (C_F1 quantized, then FP block 0), as in the scalar kernel.
    int dlo = k1, dhi = k1;
    if (P.inv && pq) {
        const int ka = (nq - chunk * P.upc) * spu;
        dlo = max(k0, ka);
        dhi = min(k1, ka + spu);
        if (dlo >= dhi) dlo = dhi = k1;
    }
    const int n_items = (k1 - k0) + (dhi - dlo);
    struct item {
        int u, t0, blk, upos, rmask, tl;
        bool fp;
    };
    auto get_item = [&](int j) {
        item it;
        int k, rep = 0;
        if (k0 + j < dlo) {
            k = k0 + j;
        } else if (j - (dlo - k0) < 2 * (dhi - dlo)) {
            k = dlo + (j - (dlo - k0)) / 2;
            rep = (j - (dlo - k0)) & 1;
        } else {
            k = k0 + j - (dhi - dlo);
        }
        const int kq = spu2 ? k >> lspu : k / spu;
        it.t0 = (k - kq * spu) * 32;
        int u;
        if (P.inv) {
            const int gi = chunk * P.upc + kq;
            if (gi * G >= pos_end) {
                it.tl = 0;
                it.u = -1;
                it.fp = true;
                it.blk = it.upos = it.rmask = 0;
                return it;
            }
            u = gi < nq ? gi : gi + pq;
            if (pq && gi == nq) u = nq + rep;
        } else {
            u = u0 + kq;
        }
        it.u = u;
        if (u < nq + pq) {
            it.fp = false;
            it.blk = tab[u - ua];
            it.upos = u * G;
            it.rmask = u < nq ? 0 : 1;
        } else {
            const int jf = u - nq - pq;
            it.fp = true;
            it.blk = tab[u - ua];
            it.upos = (nq + jf) * G;
            it.rmask = (pq && jf == 0) ? 2 : 0;
        }
        it.tl = min(32, min(G, pos_end - it.upos) - it.t0);
        return it;
    };
    // Issues the cp.async copies of item j into its ring slot (quantized items only).
    // Plane rows of (layer, blk, kvh) start at ((hb*2 + kv)*G + token)*RB with
    // hb = (layer*n_qblocks + blk)*n_kv_heads + kvh (nb_kv_plane_offset), its
    // scales record at hb*(2D + 2G) elements (nb_kv_scales_offset). Lane x of
    // copy i moves bytes 16(x + 32i) of the 32 rows: row (x >> 2) + 8i, chunk
    // x & 3, so its shared offset is tc_sw(lane >> 2, lane & 3) + 512i.
    const size_t hb_layer = (size_t)P.layer * lay.n_qblocks;
    const int sw_lane = tc_sw(lane >> 2, lane & 3);
    const int rec_bytes = (2 * D + 2 * G) * (int)sizeof(T);
    auto issue = [&](int j) {
        if (j < n_items) {
            const item it = get_item(j);
            if (!it.fp && it.tl > 0) {
                uint8_t *st = ring + (j % C::NS) * C::stage;
                const size_t hb = (hb_layer + it.blk) * lay.n_kv_heads + kvh;
                const size_t krow = (hb * 2 * G + it.t0) * RB + lane * 16, vrow = krow + (size_t)G * RB;
                const uint8_t *ku = P.upper + krow, *vu = P.upper + vrow;
#pragma unroll
                for (int i = 0; i < 4; i++) { // 128 16-byte chunks per plane
                    cp_async16(st + C::o_ku + sw_lane + 512 * i, ku + 512 * i);
                    cp_async16(st + C::o_vu + sw_lane + 512 * i, vu + 512 * i);
                    if (TGT) {
                        cp_async16(st + C::o_kl + sw_lane + 512 * i, P.lower + krow + 512 * i);
                        cp_async16(st + C::o_vl + sw_lane + 512 * i, P.lower + vrow + 512 * i);
                    }
                }
                const uint8_t *rec = P.scales + hb * rec_bytes;
                cp_async16(st + C::o_ks + lane * 16, rec + lane * 16); // K scale + zero: 512 B
                if (lane < 8) { // V scale (lanes 0-3) and V zero (4-7) of the slice's 32 tokens
                    const int part = lane >> 2;
                    cp_async16(st + C::o_vs + lane * 16,
                               rec + (2 * D + part * G + it.t0) * (int)sizeof(T) + (lane & 3) * 16);
                }
            }
        }
        cp_commit(); // possibly empty: keeps one group per item
    };

    float acc[8][4]; // out^T: m-tile b = channels (16g+2b, 16g+2b+1) x query vectors (2t, 2t+1)
#pragma unroll
    for (int b = 0; b < 8; b++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[b][i] = 0.0f;
    float mrun[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f}, zsum[2] = {0.0f, 0.0f};
    float qz[2] = {0.0f, 0.0f};  // q.Z of the current block, query vectors 2t, 2t+1
    uint32_t qh[16], ql[16];     // q*S packed (hi, lo) for query vector g, chunk t
    int cur_u = -2;
    const size_t es = sizeof(T);
    // Which of the query vectors 2t, 2t+1 exist, and their rows' positions.
    int qpos[2];
    bool qok[2], qpre[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int m = 2 * t4 + h;
        qok[h] = m < Mt;
        qpos[h] = S.pos0 + (qok[h] ? m / gq : 0);
        qpre[h] = row_uses_prequant(qpos[h], G, nq, pq);
    }

#pragma unroll 1
    for (int j = 0; j < C::NS - 1; j++) issue(j);
#pragma unroll
    for (int m = 0; m < TC_M; m++) qs[m * TC_QS_M + (tid >> 5) * TC_QS_C + (tid & 31)] = qreg[m] * P.scale_log2;
    __syncthreads(); // q staged for every warp

#pragma unroll 1
    for (int j = 0; j < n_items; j++) {
        issue(j + C::NS - 1);
        cp_wait<C::NS - 1>();
        __syncwarp();
        const item it = get_item(j);
        if (it.tl > 0) {
            const uint8_t *st = ring + (j % C::NS) * C::stage;
            // ---- q * S_c (and q.Z) when the unit changes ----
            if (it.u != cur_u) {
                cur_u = it.u;
                // Word w (channels 8w..8w+7 of the lane's chunk t) at a
                // time: 16-byte reads of q, the K steps and zeros; flat half2
                // f = 4w + j pairs two channels of that word (kpair).
                const float *qrow = qs + g8 * TC_QS_M + t4 * TC_QS_C;
                float qzp = 0.0f;
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    const float4 q0 = *(const float4 *)(qrow + 8 * w), q1 = *(const float4 *)(qrow + 8 * w + 4);
                    float qv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
                    if (!it.fp) { // q.Z, then q * S (in place)
                        const uint4 kzw = *(const uint4 *)(st + C::o_ks + (D + 32 * t4 + 8 * w) * 2);
                        const uint32_t zw[4] = {kzw.x, kzw.y, kzw.z, kzw.w};
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const float2 z = t2_f2<T>(zw[i]);
                            qzp = fmaf(qv[2 * i], z.x, qzp);
                            qzp = fmaf(qv[2 * i + 1], z.y, qzp);
                        }
                        const uint4 ksw = *(const uint4 *)(st + C::o_ks + (32 * t4 + 8 * w) * 2);
                        const uint32_t kw[4] = {ksw.x, ksw.y, ksw.z, ksw.w};
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const float2 k = t2_f2<T>(kw[i]);
                            qv[2 * i] *= k.x * (TGT ? 0.0625f : 1.0f);
                            qv[2 * i + 1] *= k.y * (TGT ? 0.0625f : 1.0f);
                        }
                    }
#pragma unroll
                    for (int jj = 0; jj < 4; jj++) {
                        const int f = 4 * w + jj;
                        float a, b;
                        if (it.fp) {
                            a = qv[2 * jj]; // kpair<2>(f) = (2f, 2f + 1)
                            b = qv[2 * jj + 1];
                        } else {
                            const int2 cp = TGT ? kpair<1>(f) : kpair<0>(f);
                            a = qv[cp.x - 8 * w]; // channels within the word
                            b = qv[cp.y - 8 * w];
                        }
                        const __half2 hi = __floats2half2_rn(a, b);
                        const float2 hf = __half22float2(hi);
                        qh[f] = h2u(hi);
                        ql[f] = h2u(__floats2half2_rn(a - hf.x, b - hf.y));
                        if (TGT && !it.fp) qzp = fmaf(-8.0f, a + b, qzp); // the -8 of C8 = (C8 + 8) - 8
                    }
                }
                qzp += __shfl_xor_sync(0xffffffffu, qzp, 1);
                qzp += __shfl_xor_sync(0xffffffffu, qzp, 2);
                qz[0] = __shfl_sync(0xffffffffu, qzp, 4 * (2 * t4));
                qz[1] = __shfl_sync(0xffffffffu, qzp, 4 * (2 * t4 + 1));
            }

            // ---- scores^T: two 16-token tiles ----
            float sc[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                uint32_t hk[2][16]; // rows g, g+8
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const int r = 16 * mt + g8 + 8 * rr;
                    if (!it.fp) {
                        const uint4 u = *(const uint4 *)(st + C::o_ku + tc_sw(r, t4));
                        const uint32_t uw[4] = {u.x, u.y, u.z, u.w};
                        if (TGT) {
                            const uint4 l = *(const uint4 *)(st + C::o_kl + tc_sw(r, t4));
                            const uint32_t lw[4] = {l.x, l.y, l.z, l.w};
#pragma unroll
                            for (int w = 0; w < 4; w++) {
                                uint32_t h[4];
                                target_k4(uw[w], lw[w], h);
#pragma unroll
                                for (int i = 0; i < 4; i++) hk[rr][4 * w + i] = h[i];
                            }
                        } else {
#pragma unroll
                            for (int w = 0; w < 4; w++) {
                                uint32_t h[4];
                                draft_k4(uw[w], h);
#pragma unroll
                                for (int i = 0; i < 4; i++) hk[rr][4 * w + i] = h[i];
                            }
                        }
                    } else {
                        const uint8_t *row = P.fp + nb_kv_fp_offset(&lay, P.layer, it.blk, kvh, 0, it.t0 + r) * es;
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const uint4 v = ldg16(row + 64 * t4 + 16 * i);
                            hk[rr][4 * i + 0] = fp_pair_h<T>(v.x);
                            hk[rr][4 * i + 1] = fp_pair_h<T>(v.y);
                            hk[rr][4 * i + 2] = fp_pair_h<T>(v.z);
                            hk[rr][4 * i + 3] = fp_pair_h<T>(v.w);
                        }
                    }
                }
                // four independent accumulator chains (hi/lo x even/odd
                // k-steps), summed in a fixed order: short mma dependency chains
                float ch[4][4];
#pragma unroll
                for (int c = 0; c < 4; c++)
#pragma unroll
                    for (int i = 0; i < 4; i++) ch[c][i] = 0.0f;
#pragma unroll
                for (int s = 0; s < 8; s++) {
                    const uint32_t a[4] = {hk[0][2 * s], hk[1][2 * s], hk[0][2 * s + 1], hk[1][2 * s + 1]};
                    mma16816(ch[s & 1], a, qh[2 * s], qh[2 * s + 1]);
                    mma16816(ch[2 + (s & 1)], a, ql[2 * s], ql[2 * s + 1]);
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (it.fp) {
                        sc[mt][i] = (ch[0][i] + ch[1][i]) + (ch[2][i] + ch[3][i]);
                    } else if (TGT) { // (C8 + 8) * 2^-24 (target_k4)
                        sc[mt][i] = ((ch[0][i] + ch[1][i]) + (ch[2][i] + ch[3][i])) * 16777216.0f;
                    } else { // even k-steps: U * 2^-24, odd: 16U * 2^-24 (draft_k4)
                        sc[mt][i] = fmaf(ch[1][i] + ch[3][i], 1048576.0f, (ch[0][i] + ch[2][i]) * 16777216.0f);
                    }
                }
            }

            // ---- mask, online softmax per query vector (column) ----
            float vst[2][2], vze[2][2]; // [mt][row g / g+8]: V step and zero of the lane's tokens
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const int r = 16 * mt + g8 + 8 * rr;
                    if (!it.fp) {
                        vst[mt][rr] = ldf<T>((const T *)(st + C::o_vs) + r) * (TGT ? 0.0625f : 1.0f);
                        vze[mt][rr] = ldf<T>((const T *)(st + C::o_vz) + r);
                    } else {
                        vst[mt][rr] = 1.0f;
                        vze[mt][rr] = 0.0f;
                    }
                }
            float pw[2][4]; // weights (unscaled), same layout as sc
            // One online-softmax step per query vector (column) h. MASK: the
            // causal / length / C_F1 row masks; a slice every row sees whole
            // (warp-uniform `full`) runs without them. The accumulators are
            // rescaled only when some running max moved (alpha == 1
            // otherwise, so skipping is exact).
            auto softmax = [&](auto masked) {
                constexpr bool MASK = decltype(masked)::value;
                float alpha[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float cm = -INFINITY;
                    bool okv[2][2];
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int rr = 0; rr < 2; rr++) {
                            bool ok = true;
                            if constexpr (MASK) {
                                const int r = 16 * mt + g8 + 8 * rr;
                                ok = qok[h] && r < it.tl && it.upos + it.t0 + r <= qpos[h];
                                if (it.rmask) ok = ok && (qpre[h] == (it.rmask == 1));
                            }
                            okv[mt][rr] = ok;
                            const float s = ok ? sc[mt][2 * rr + h] + (it.fp ? 0.0f : qz[h]) : -INFINITY;
                            sc[mt][2 * rr + h] = s;
                            cm = fmaxf(cm, s);
                        }
                    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 4));
                    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 8));
                    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 16));
                    const float mnew = fmaxf(mrun[h], cm);
                    // 0 on a column's first scores (mrun = -inf); 1 while a
                    // masked column has seen nothing (mnew = -inf)
                    alpha[h] = (MASK && mnew == -INFINITY) ? 1.0f : ex2_ftz(mrun[h] - mnew);
                    mrun[h] = mnew;
                    float ls = 0.0f, zs = 0.0f;
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int rr = 0; rr < 2; rr++) {
                            const float p = okv[mt][rr] ? ex2_ftz(sc[mt][2 * rr + h] - mnew) : 0.0f;
                            ls += p;
                            if (okv[mt][rr]) zs = fmaf(p, vze[mt][rr], zs); // unused slots may hold NaN
                            pw[mt][2 * rr + h] = okv[mt][rr] ? p * vst[mt][rr] : 0.0f;
                        }
                    lsum[h] = fmaf(lsum[h], alpha[h], ls);
                    zsum[h] = fmaf(zsum[h], alpha[h], zs);
                }
                if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                    for (int b = 0; b < 8; b++) {
                        acc[b][0] *= alpha[0];
                        acc[b][2] *= alpha[0];
                        acc[b][1] *= alpha[1];
                        acc[b][3] *= alpha[1];
                    }
                }
            };
            if (it.tl == 32 && it.rmask == 0 && it.upos + it.t0 + 31 <= S.pos0) {
                softmax(std::false_type{});
            } else {
                softmax(std::true_type{});
            }

            // ---- out^T += V^T . P'^T, one 16-token k-step per score tile ----
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const uint32_t lo = h2u(__floats2half2_rn(pw[mt][0], pw[mt][1]));
                const uint32_t hi = h2u(__floats2half2_rn(pw[mt][2], pw[mt][3]));
                const int s1 = 4 * (2 * t4) + (g8 >> 1), s2 = s1 + 4;
                const uint32_t x0 = __shfl_sync(0xffffffffu, lo, s1), x1 = __shfl_sync(0xffffffffu, hi, s1);
                const uint32_t x2 = __shfl_sync(0xffffffffu, lo, s2), x3 = __shfl_sync(0xffffffffu, hi, s2);
                const uint32_t sel = (g8 & 1) ? 0x7632u : 0x5410u;
                const uint32_t b0 = __byte_perm(x0, x2, sel), b1 = __byte_perm(x1, x3, sel);
                // A fragments: rows (channel 16g+2b, 16g+2b+1), tokens (2t, 2t+1 | 2t+8, 2t+9)
                uint32_t av[8][4];
#pragma unroll
                for (int kh = 0; kh < 2; kh++) { // token pair (2t, 2t+1) + 8*kh
                    const int ra = 16 * mt + 2 * t4 + 8 * kh, rb = ra + 1;
                    if (!it.fp) {
                        // 8 bytes of rows ra, rb: bytes 8g..8g+7 = chunk g>>1, half g&1.
                        // Lanes with odd t read rb first, so each load's 16
                        // lanes hit rows of both parities: no bank conflicts.
                        const bool sw = t4 & 1;
                        const int r1 = sw ? rb : ra, r2 = sw ? ra : rb;
                        uint2 ua = *(const uint2 *)(st + C::o_vu + tc_sw(r1, g8 >> 1) + 8 * (g8 & 1));
                        uint2 ub = *(const uint2 *)(st + C::o_vu + tc_sw(r2, g8 >> 1) + 8 * (g8 & 1));
                        if (sw) { const uint2 x = ua; ua = ub; ub = x; }
                        if (TGT) {
                            uint2 la = *(const uint2 *)(st + C::o_vl + tc_sw(r1, g8 >> 1) + 8 * (g8 & 1));
                            uint2 lb = *(const uint2 *)(st + C::o_vl + tc_sw(r2, g8 >> 1) + 8 * (g8 & 1));
                            if (sw) { const uint2 x = la; la = lb; lb = x; }
                            const uint32_t wa[2] = {ua.x, ua.y}, wb[2] = {ub.x, ub.y};
                            const uint32_t va[2] = {la.x, la.y}, vb[2] = {lb.x, lb.y};
#pragma unroll
                            for (int w = 0; w < 2; w++) {
                                const uint32_t ea = codes_even(wa[w], va[w]), eb = codes_even(wb[w], vb[w]);
                                const uint32_t oa = codes_odd(wa[w], va[w]), ob = codes_odd(wb[w], vb[w]);
#pragma unroll
                                for (int k = 0; k < 4; k++) {
                                    const uint32_t sk = (uint32_t)(k | (k << 4) | ((4 + k) << 8) | ((4 + k) << 12));
                                    av[4 * w + k][2 * kh + 0] =
                                        hsub_const(and_or1024<0x00ff00ffu>(__byte_perm(ea, eb, sk)), H1032);
                                    av[4 * w + k][2 * kh + 1] =
                                        hsub_const(and_or1024<0x00ff00ffu>(__byte_perm(oa, ob, sk)), H1032);
                                }
                            }
                        } else {
                            const uint32_t wa[2] = {ua.x, ua.y}, wb[2] = {ub.x, ub.y};
                            const __half2 k16 = __float2half2_rn(0.0625f), km64 = __float2half2_rn(-64.0f);
#pragma unroll
                            for (int w = 0; w < 2; w++) {
#pragma unroll
                                for (int hb = 0; hb < 2; hb++) { // bytes (0,1) then (2,3) of the words
                                    const uint32_t x = __byte_perm(wa[w], wb[w], hb ? 0x7632u : 0x5410u);
                                    const uint32_t y = x >> 8;
                                    const int b = 4 * w + 2 * hb;
                                    av[b][2 * kh] = hsub_const(and_or1024<0x000f000fu>(x), H1024);
                                    av[b][2 * kh + 1] = h2u(__hfma2(u2h(and_or1024<0x00f000f0u>(x)), k16, km64));
                                    av[b + 1][2 * kh] = hsub_const(and_or1024<0x000f000fu>(y), H1024);
                                    av[b + 1][2 * kh + 1] = h2u(__hfma2(u2h(and_or1024<0x00f000f0u>(y)), k16, km64));
                                }
                            }
                        }
                    } else {
                        // FP rows: channels 16g..16g+15 = 32 bytes; tokens past tl read as 0
                        const bool oka = ra < it.tl, okb = rb < it.tl;
                        const uint8_t *pa = P.fp + nb_kv_fp_offset(&lay, P.layer, it.blk, kvh, 1, it.t0 + ra) * es + 32 * g8;
                        const uint8_t *pb = P.fp + nb_kv_fp_offset(&lay, P.layer, it.blk, kvh, 1, it.t0 + rb) * es + 32 * g8;
                        uint4 A0 = make_uint4(0, 0, 0, 0), A1 = A0, B0 = A0, B1 = A0;
                        if (oka) { A0 = ldg16(pa); A1 = ldg16(pa + 16); }
                        if (okb) { B0 = ldg16(pb); B1 = ldg16(pb + 16); }
                        const uint32_t wa[8] = {A0.x, A0.y, A0.z, A0.w, A1.x, A1.y, A1.z, A1.w};
                        const uint32_t wb[8] = {B0.x, B0.y, B0.z, B0.w, B1.x, B1.y, B1.z, B1.w};
#pragma unroll
                        for (int b = 0; b < 8; b++) {
                            const uint32_t ha = fp_pair_h<T>(wa[b]), hb = fp_pair_h<T>(wb[b]);
                            av[b][2 * kh] = __byte_perm(ha, hb, 0x5410u);
                            av[b][2 * kh + 1] = __byte_perm(ha, hb, 0x7632u);
                        }
                    }
                }
#pragma unroll
                for (int b = 0; b < 8; b++) {
                    // a0 = (row g, tokens 2t,2t+1), a1 = (row g+8, same), a2/a3 = tokens + 8
                    const uint32_t a[4] = {av[b][0], av[b][1], av[b][2], av[b][3]};
                    mma16816(acc[b], a, b0, b1);
                }
            }
        }
        __syncwarp();
    }
    cp_wait<0>();

    // ---- reduce the lanes' sums, then the CTA's warps merge ----
#pragma unroll
    for (int h = 0; h < 2; h++) {
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
            lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], o);
            zsum[h] += __shfl_xor_sync(0xffffffffu, zsum[h], o);
        }
    }
    __syncthreads(); // every warp is done with its ring: the merge area aliases it
    float *mo = (float *)body;                        // [NW][8][D]
    float *mlp = mo + TC_NW * TC_M * D;               // [NW][8][2]
#pragma unroll
    for (int b = 0; b < 8; b++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = i & 1, m = 2 * t4 + h, c = 16 * g8 + 2 * b + (i >> 1);
            mo[(warp * TC_M + m) * D + mo_col<true>(m, c)] = acc[b][i] + zsum[h];
        }
    if (g8 == 0) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mlp[2 * (warp * TC_M + 2 * t4 + h)] = mrun[h];
            mlp[2 * (warp * TC_M + 2 * t4 + h) + 1] = lsum[h];
        }
    }
    __syncthreads();
    dec_cta_merge<TC_NW, TC_M, D, true>(P, S, seq, chunk, kvh, Mt, mo, mlp);
}
