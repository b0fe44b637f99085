// linear_dense_ri.cuh: the row-invariant dense matmul (nb_cuda_matmul_dense_ri
// in linear_cuda.h), included by linear_cuda.cu inside its anonymous
// namespace (it uses that file's mma, cp.async and load/store helpers).
//
// The one idea: a row of x must get the same bits whether 1 or 64 rows share
// the launch (a verify row must equal the decode row at the same position),
// and one launch must read the weights once for up to 64 rows. So every
// output is summed in an order fixed by (m, k) alone:
//   - a block owns 128 weight rows (16 per warp) and one of S fixed,
//     contiguous k ranges (S from the shape and the SM count, never from n);
//     its warps accumulate 64-wide k steps in order, each as four
//     mma.m16n8k16 (k 0-15, ..., 48-63) chained on one f32 accumulator per
//     8-row tile of x;
//   - with S == 1 the block adds the bias and stores the output; with S > 1
//     it stores its partial sums in the workspace and a second kernel adds
//     the S partials of each output in the order s = 0, 1, ..., S - 1, then
//     the bias (spread over the whole GPU: the last block of each tile
//     adding them was latency bound, 43.6 us instead of 20.3 at 4096x4096
//     and 64 rows);
//   - x rows ride in the mma's n dimension: NX tiles of 8 rows (NX = 1, 2,
//     4 or 8 by n) only change how many accumulators a warp keeps, not the
//     arithmetic of any one of them. n > 64 adds blocks in grid.y.
// The weights and x reach shared memory through a cp.async ring of 128-byte
// row pieces (16 KB of weights plus 8*NX rows of x per stage; 4-6 stages,
// ~100 KB, which also keeps the hardware from stacking a third block on an
// SM while others have one), stored with the 16-byte chunks of row r at
// chunk c ^ (r & 7), so the ldmatrix reads of 8 rows hit 8 different bank
// groups.
//
// The RoPE form (kDrRope, nb_cuda_matmul_dense_ri_rope): w is q|k|v in
// the model's order; the matmul always stores its partial sums (S = 1
// too), and the reduction kernel sums dims d and d + D/2 of a head in
// split order and stores them as nb_cuda_rope_write_kv would: q rotated
// into the attention's input, k rotated and v into the FP cache. The bits
// of the plain form's f32 outputs followed by the RoPE + KV write kernel.
//
// The SwiGLU form (kDrSwiglu, nb_cuda_matmul_dense_ri_swiglu): w is gate|up in
// the SwiGLU row layout (16-row tile t: gate rows 8t..8t+7, then up rows
// 8t..8t+7), so a thread's accumulators for rows g and g + 8 of its warp's
// tile are a gate output and its up output. With S == 1 the thread stores
// silu(g) * u directly; with S > 1 the reduction kernel sums both in split
// order and stores it. Either way the bits of the plain form's f32 outputs
// followed by the SwiGLU kernel, with no f32 gate|up rows in memory and no
// SwiGLU launch.
//
// The RMSNorm scaled after the matmul (the target's norm_post, as
// linear_cuda.h's nb_cuda_matmul_wq_res / _rs forms are the draft's): the
// residual form (nb_cuda_matmul_dense_ri_res) always stores its partial
// sums, and its reduction kernel (dense_ri_reduce_res_kernel) adds each
// output, in split order and with the bias as the plain reduction does, into
// the residual stream x, stores x * w (the next norm's weights) as the
// matmul's dtype, and each block's sum of x^2 over its 1,024 columns of one
// row. The norm-scaled SwiGLU and RoPE forms (p.rs_part) multiply each x
// row's sums by r = 1 / sqrt(sum / k + eps), the row's partials added in
// column order, before their epilogue: in the SwiGLU form's accumulators
// when S == 1 (dense_ri_kernel's RS), else in the reductions. Every step is
// per row in an order fixed by (m, k): row invariant as the plain form.
//
// Programmatic dependent launch: the first stages' weights are requested
// before griddepcontrol.wait (weights never depend on an earlier kernel);
// x, the workspace, the bias and the output only after it. A block triggers
// its dependents once its last copy is issued; the reduction kernel at
// entry.

constexpr int kDrBM = 128;       // weight rows per block (16 per warp)
constexpr int kDrBK = 64;        // k per ring stage: 128 bytes of a row
constexpr int kDrMinSteps = 4;   // k steps of a split at least (256 of k)
constexpr int kDrMaxSplit = 8;   // k splits at most
constexpr int kDrRows = 64;      // x rows per block at most (NX = 8)
enum { kDrPlain = 0, kDrSwiglu = 1, kDrRope = 2 }; // the forms' epilogues

struct DrParams {
    void *out;           // [n][m] out_dt
    const void *x;       // [n][k] T
    const void *w;       // [m][k] T
    const void *bias;    // [m] bias_dt or NULL
    float *part;         // [S][n][m] f32 partial sums (S > 1; kDrRope: S >= 1)
    int out_dt, bias_dt;
    int sat;             // kDrSwiglu: f16 output saturating
    int n, m, k;
    int S, tiles;
    const float *rs_part; // the _rs forms: [n][rs_np] partial sums of squares of x's rows, else NULL
    float rs_eps;
    int rs_np;            // nb_cuda_dr_parts(k)
};

// The RMSNorm factor of x row i for the _rs forms: its partial sums of
// squares added in column order, then 1 / sqrt(sum / k + eps).
__device__ __forceinline__ float dr_rs_factor(const DrParams &p, size_t i) {
    const float *q = p.rs_part + i * (size_t)p.rs_np;
    float a = __ldcg(q);
    for (int b = 1; b < p.rs_np; b++) a = __fadd_rn(a, __ldcg(q + b));
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(a, (float)p.k), p.rs_eps)));
}

template <int NX> __host__ __device__ constexpr int dr_stage_bytes() { return (kDrBM + 8 * NX) * kDrBK * 2; }
// Ring stages: ~100 KB per block, so at most two blocks share an SM.
template <int NX> __host__ __device__ constexpr int dr_stages() { return NX <= 2 ? 6 : NX == 4 ? 5 : 4; }
template <int NX> __host__ __device__ constexpr int dr_smem_bytes() { return dr_stages<NX>() * dr_stage_bytes<NX>(); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// Byte offset of 16-byte chunk c of row r in a stage's tile (128-byte rows).
__device__ __forceinline__ uint32_t dr_sw(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }

// Grid: (tiles * S, ceil(n / (8 NX))); block: kThreads; dynamic shared
// memory dr_smem_bytes<NX>(). Needs k % 64 == 0, 16-byte aligned x and w
// (kDrSwiglu: m % 16 == 0, no bias; out is [n][m/2]. kDrRope: partial
// sums whatever S). RS (kDrSwiglu with S == 1 only): each x row's sums
// scaled by its RMSNorm factor (dr_rs_factor) before the SwiGLU.
template <typename T, int NX, int EPI, bool RS = false>
__global__ void __launch_bounds__(kThreads, 2) dense_ri_kernel(const DrParams p) {
    static_assert(!RS || EPI == kDrSwiglu, "the norm scale in the accumulators: the SwiGLU form");
    extern __shared__ __align__(128) unsigned char dr_smem[];
    constexpr int XR = 8 * NX;               // x rows per block
    constexpr int kW = kDrBM * kDrBK * 2;    // weight bytes per stage
    constexpr int kSt = dr_stage_bytes<NX>();
    constexpr int kDrST = dr_stages<NX>();
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int tile = (int)blockIdx.x / p.S, s = (int)blockIdx.x % p.S;
    const int KS = p.k / kDrBK;
    const int kb = (int)((long long)s * KS / p.S);
    const int nk = (int)((long long)(s + 1) * KS / p.S) - kb;
    const int m0 = tile * kDrBM, n0 = (int)blockIdx.y * XR;
    const uint32_t sbase = smem_addr(dr_smem);

    // Copy assignment: thread tid copies 16-byte chunk c of weight rows
    // r0 + 32i (i < 4) and of x rows r0 + 32i.
    const int c = tid & 7, r0 = tid >> 3;
    // Rows past m are zero-filled (their reads point at row 0).
    const T *wp = static_cast<const T *>(p.w) + (size_t)(m0 + r0) * p.k + (size_t)kb * kDrBK + c * 8;
    const size_t wstep = (size_t)32 * p.k;  // 32 rows
    const T *w0 = static_cast<const T *>(p.w) + (size_t)kb * kDrBK + c * 8;
    const int wrows = p.m - m0 - r0;  // row r0 + 32i is in range while 32i < wrows
    // x: rows r0 + 32i (i < XI), threads tid < 8 XR only when XR < 32.
    constexpr int XI = XR > 32 ? XR / 32 : 1;
    const bool xcp = XR >= 32 || tid < XR * 8;
    bool xok[XI];
    const T *xp[XI];
#pragma unroll
    for (int i = 0; i < XI; i++) {
        const int xr = n0 + r0 + 32 * i;
        xok[i] = xcp && xr < p.n;
        xp[i] = static_cast<const T *>(p.x) + (size_t)(xok[i] ? xr : 0) * p.k + (size_t)kb * kDrBK + c * 8;
    }
    auto load_w = [&](int it) {
        const uint32_t st = sbase + (it % kDrST) * kSt;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const bool ok = 32 * i < wrows;
            cp16z(st + dr_sw(r0 + 32 * i, c), (ok ? wp + i * wstep : w0) + (size_t)it * kDrBK, ok);
        }
    };
    auto load_x = [&](int it) {
        if (xcp)
#pragma unroll
            for (int i = 0; i < XI; i++)
                cp16z(sbase + (it % kDrST) * kSt + kW + dr_sw(r0 + 32 * i, c), xp[i] + (size_t)it * kDrBK, xok[i]);
    };

    // Group 0 holds the weights of stages 0..ST-2 and x of stage 0; group j
    // x of stage j: waiting for group j then covers stage j in full.
#pragma unroll
    for (int st = 0; st < kDrST - 1; st++)
        if (st < nk) load_w(st);
    nb_pdl::wait();
#pragma unroll
    for (int st = 0; st < kDrST - 1; st++) {
        if (st < nk) load_x(st);
        cp_commit();
    }
    // RS: the rows' factors, read while the first stages land (the loop's
    // barriers publish them before the epilogue).
    __shared__ float rsh[RS ? XR : 1];
    if constexpr (RS) {
        if (tid < XR) rsh[tid] = n0 + tid < p.n ? dr_rs_factor(p, (size_t)(n0 + tid)) : 0.0f;
    }
    if (nk <= kDrST - 1) nb_pdl::trigger();

    float acc[NX][4];
#pragma unroll
    for (int nx = 0; nx < NX; nx++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nx][i] = 0.0f;
    // ldmatrix rows: A (x4 = rows 0-7 / 8-15 at k 0-7, then at k 8-15 of a
    // k16 slice) and B (x4 = x rows 0-7 at k chunks 0..3 of a k32 pair).
    const int arow = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, ahi = lane >> 4;
    const int brow = lane & 7, bch = lane >> 3;
    for (int it = 0; it < nk; it++) {
        cp_wait<kDrST - 2>();
        __syncthreads();  // stage it is in; every thread is done with stage it - 1
        const int nx_it = it + kDrST - 1;
        if (nx_it < nk) {
            load_w(nx_it);
            load_x(nx_it);
            if (nx_it == nk - 1) nb_pdl::trigger();
        }
        cp_commit();
        const uint32_t st = sbase + (it % kDrST) * kSt;
        uint32_t a[4][4];  // the warp's 16 rows at k16 slices 0..3
#pragma unroll
        for (int kk = 0; kk < 4; kk++) ldsm_x4(a[kk], st + dr_sw(arow, 2 * kk + ahi));
#pragma unroll
        for (int nx = 0; nx < NX; nx++)
#pragma unroll
            for (int kp = 0; kp < 2; kp++) {
                uint32_t b[4];
                ldsm_x4(b, st + kW + dr_sw(nx * 8 + brow, 4 * kp + bch));
                mma<T>(acc[nx], a[2 * kp][0], a[2 * kp][1], a[2 * kp][2], a[2 * kp][3], b[0], b[1]);
                mma<T>(acc[nx], a[2 * kp + 1][0], a[2 * kp + 1][1], a[2 * kp + 1][2], a[2 * kp + 1][3], b[2],
                       b[3]);
            }
    }
    cp_wait<0>();

    // acc[nx][i]: weight row m0 + 16 warp + g + 8 (i / 2), x row n0 + 8 nx + 2t + i % 2.
    if constexpr (EPI == kDrSwiglu) {
        if (p.S == 1) { // gate row (i < 2) and its up row (i + 2): output 8 (tile) + g
            const int row = m0 + warp * 16 + g;
#pragma unroll
            for (int nx = 0; nx < NX; nx++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int xr = n0 + nx * 8 + 2 * t + i;
                    float gv = acc[nx][i], uv = acc[nx][i + 2];
                    if constexpr (RS) {
                        const float r = rsh[nx * 8 + 2 * t + i];
                        gv = __fmul_rn(gv, r);
                        uv = __fmul_rn(uv, r);
                    }
                    if (row < p.m && xr < p.n)
                        swiglu_store(p.out, p.out_dt, p.sat, (size_t)xr * (p.m / 2) + (row >> 4) * 8 + g, gv, uv);
                }
            return;
        }
    }
#pragma unroll
    for (int nx = 0; nx < NX; nx++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = m0 + warp * 16 + g + 8 * (i >> 1), xr = n0 + nx * 8 + 2 * t + (i & 1);
            if (row < p.m && xr < p.n) {
                if (p.S > 1 || EPI == kDrRope) {
                    __stcg(p.part + ((size_t)s * p.n + xr) * p.m + row, acc[nx][i]);
                } else {
                    float v = acc[nx][i];
                    if (p.bias) v += load_any(p.bias, p.bias_dt, row);
                    store_any(p.out, p.out_dt, (size_t)xr * p.m + row, v);
                }
            }
        }
}

// The S partial sums of the 4 consecutive outputs at element e (16-byte
// aligned) in split order, every load issued before the first add.
__device__ __forceinline__ void dr_sum4(const DrParams &p, size_t e, float (&v)[4]) {
    const size_t stride = (size_t)p.n * p.m;
    float4 q[kDrMaxSplit];
#pragma unroll
    for (int s = 0; s < kDrMaxSplit; s++)
        if (s < p.S) q[s] = __ldcg(reinterpret_cast<const float4 *>(p.part + s * stride + e));
    v[0] = q[0].x, v[1] = q[0].y, v[2] = q[0].z, v[3] = q[0].w;
#pragma unroll
    for (int s = 1; s < kDrMaxSplit; s++)
        if (s < p.S) v[0] += q[s].x, v[1] += q[s].y, v[2] += q[s].z, v[3] += q[s].w;
}

// out[i][j] = ((part[0][i][j] + part[1][i][j]) + ...) + part[S-1][i][j]
// (+ bias[j]). Thread: 4 consecutive outputs of one row (V4: m % 4 == 0),
// else one; every partial load issued before the first add.
template <bool V4> __global__ void __launch_bounds__(256) dense_ri_reduce_kernel(const DrParams p) {
    nb_pdl::trigger();
    nb_pdl::wait();
    constexpr int W = V4 ? 4 : 1;
    const size_t e = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * W;
    const size_t total = (size_t)p.n * p.m, stride = total;
    if (e >= total) return;
    float v[W];
    if constexpr (V4) {
        dr_sum4(p, e, v);
    } else {
        float q[kDrMaxSplit];
#pragma unroll
        for (int s = 0; s < kDrMaxSplit; s++)
            if (s < p.S) q[s] = __ldcg(p.part + s * stride + e);
        v[0] = q[0];
#pragma unroll
        for (int s = 1; s < kDrMaxSplit; s++)
            if (s < p.S) v[0] += q[s];
    }
    const int row = (int)(e % p.m);
#pragma unroll
    for (int w = 0; w < W; w++) {
        float o = v[w];
        if (p.bias) o += load_any(p.bias, p.bias_dt, row + w);
        store_any(p.out, p.out_dt, e + w, o);
    }
}

// The paired forms' reduction of 4 consecutive outputs at column c0 and
// 4 at c1 (16-byte aligned), each summed over the S splits in split order
// as dense_ri_reduce_kernel sums one; every load issued before the adds.
__device__ __forceinline__ void dr_sum_pair4(const DrParams &p, size_t c0, size_t c1, float (&a)[4], float (&b)[4]) {
    const size_t stride = (size_t)p.n * p.m;
    float4 qa[kDrMaxSplit], qb[kDrMaxSplit];
#pragma unroll
    for (int s = 0; s < kDrMaxSplit; s++)
        if (s < p.S) {
            qa[s] = __ldcg(reinterpret_cast<const float4 *>(p.part + s * stride + c0));
            qb[s] = __ldcg(reinterpret_cast<const float4 *>(p.part + s * stride + c1));
        }
    a[0] = qa[0].x, a[1] = qa[0].y, a[2] = qa[0].z, a[3] = qa[0].w;
    b[0] = qb[0].x, b[1] = qb[0].y, b[2] = qb[0].z, b[3] = qb[0].w;
#pragma unroll
    for (int s = 1; s < kDrMaxSplit; s++)
        if (s < p.S) {
            a[0] += qa[s].x, a[1] += qa[s].y, a[2] += qa[s].z, a[3] += qa[s].w;
            b[0] += qb[s].x, b[1] += qb[s].y, b[2] += qb[s].z, b[3] += qb[s].w;
        }
}

// The SwiGLU form's reduction: out[i][j] = silu(g) * u with g and u the
// sums above of gate row j and up row j (columns 16 (j / 8) + j % 8 and
// that + 8 of the SwiGLU row layout). Thread: 4 consecutive j of one row
// (m % 16 == 0, so they share an 8-column group and the loads are float4).
__global__ void __launch_bounds__(256) dense_ri_reduce_swiglu_kernel(const DrParams p) {
    nb_pdl::trigger();
    nb_pdl::wait();
    const int I = p.m / 2;
    const size_t e = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (e >= (size_t)p.n * I) return;
    const size_t xr = e / I;
    const int j = (int)(e - xr * I);
    const size_t cg = xr * p.m + (size_t)(j >> 3) * 16 + (j & 7);
    float g[4], u[4];
    dr_sum_pair4(p, cg, cg + 8, g, u);
    if (p.rs_part) { // the _rs form: the row's RMSNorm factor first
        const float r = dr_rs_factor(p, xr);
#pragma unroll
        for (int w = 0; w < 4; w++) g[w] = __fmul_rn(g[w], r), u[w] = __fmul_rn(u[w], r);
    }
#pragma unroll
    for (int w = 0; w < 4; w++) swiglu_store(p.out, p.out_dt, p.sat, e + w, g[w], u[w]);
}

// The RoPE form's reduction: for x row i, head hd and dims d..d+3 (D/2 %
// 4 == 0), the sums of columns hd D + d.. and that + D/2 (+ bias, as the
// plain reduction adds it), stored as store_rope_pair stores a pair.
__global__ void __launch_bounds__(256) dense_ri_reduce_rope_kernel(const DrParams p, const nb_cuda_wq_rope r) {
    nb_pdl::trigger();
    nb_pdl::wait();
    const int D = r.lay.head_dim, h = D / 2, hp = h / 4;  // 4-dim groups per head half
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t per_row = (size_t)(p.m / D) * hp;
    if (e >= (size_t)p.n * per_row) return;
    const int i = (int)(e / per_row), q = (int)(e % per_row), hd = q / hp, d = (q % hp) * 4;
    const size_t c0 = (size_t)i * p.m + (size_t)hd * D + d;
    float x0[4], x1[4];
    dr_sum_pair4(p, c0, c0 + h, x0, x1);
    const int row0 = hd * D + d;
    const float rf = p.rs_part ? dr_rs_factor(p, (size_t)i) : 1.0f; // the _rs form: the row's RMSNorm factor
#pragma unroll
    for (int w = 0; w < 4; w++) {
        float v0 = x0[w], v1 = x1[w];
        if (p.rs_part) v0 = __fmul_rn(v0, rf), v1 = __fmul_rn(v1, rf);
        if (p.bias) {
            v0 += load_any(p.bias, p.bias_dt, row0 + w);
            v1 += load_any(p.bias, p.bias_dt, row0 + w + h);
        }
        store_rope_pair(r, i, hd, d + w, v0, v1);
    }
}

// The residual form's reduction (nb_cuda_matmul_dense_ri_res). Block (b,
// i): columns 1024 b .. 1024 b + 1023 of x row i, 4 a thread (m % 4 == 0).
// Each output is the plain reduction's f32 value (the S partials in split
// order, then the bias); h = x + that, stored back into x; xs = h * w in
// T (f16 saturating); the block's sum of h^2 (each thread's 4 in order, the
// warp's fixed butterfly, the 8 warps in order) into r.part[i][b].
template <typename T> __global__ void __launch_bounds__(256) dense_ri_reduce_res_kernel(const DrParams p, const nb_cuda_dr_res r) {
    nb_pdl::trigger();
    nb_pdl::wait();
    const int i = (int)blockIdx.y, c = (int)blockIdx.x * NB_CUDA_DR_PART_COLS + (int)threadIdx.x * 4;
    float ss = 0.0f;
    if (c < p.m) {
        const size_t e = (size_t)i * p.m + c;
        float v[4];
        dr_sum4(p, e, v); // the plain reduction's sums
        const float4 x4 = *reinterpret_cast<const float4 *>(r.x + e);
        const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
        float h[4];
        uint16_t hs[4];
#pragma unroll
        for (int w = 0; w < 4; w++) {
            float o = v[w];
            if (p.bias) o += load_any(p.bias, p.bias_dt, c + w);
            h[w] = __fadd_rn(xv[w], o);
            const float hw = __fmul_rn(h[w], load_any(r.w, (int)r.w_dt, c + w));
            if constexpr (std::is_same<T, __half>::value) hs[w] = nb_dt::f32_to_f16_sat(hw);
            else hs[w] = nb_dt::f32_to_bf16(hw);
            ss = __fadd_rn(ss, __fmul_rn(h[w], h[w]));
        }
        *reinterpret_cast<float4 *>(r.x + e) = make_float4(h[0], h[1], h[2], h[3]);
        *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(r.xs) + e) =
            make_uint2((uint32_t)hs[0] | ((uint32_t)hs[1] << 16), (uint32_t)hs[2] | ((uint32_t)hs[3] << 16));
    }
    __shared__ float wsum[8];
    ss = warp_sum_fixed(ss);
    if ((threadIdx.x & 31) == 0) wsum[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float a = wsum[0];
#pragma unroll
        for (int w = 1; w < 8; w++) a = __fadd_rn(a, wsum[w]);
        r.part[(size_t)i * ((p.m + NB_CUDA_DR_PART_COLS - 1) / NB_CUDA_DR_PART_COLS) + blockIdx.x] = a;
    }
}

int g_dr_split = 0;  // forced k splits (tests, benchmarks); 0: the built-in plan

// The k splits of an [m][k] matrix: enough blocks for two per SM (the
// kernel's budget at every NX), each split at least kDrMinSteps k steps, at
// most kDrMaxSplit (16 was slower everywhere it applied). A function of
// (m, k) and the device only, never of n: it fixes the summation order of
// every output. Sweep (H100, bf16, us at S = 1 / 2 / 4 / 8 / 16):
// 4096x4096 n = 1: 19.4 / 14.3 / 14.2 / 13.0 / 14.9, n = 64: 40.2 / 23.8 /
// 22.9 / 20.2 / 26.7 (built in: 8); 4096x14336 n = 40: 130.9 / 117.6 / 62.7
// / 50.0 / 55.2 (8); 6144x4096 n = 40: 39.5 / 37.6 / 26.0 / 29.4 / 35.1
// (built in: 5, 26.1).
int dr_split(int m, int k, int sms) {
    const int tiles = (m + kDrBM - 1) / kDrBM, ks = k / kDrBK;
    int S = g_dr_split > 0 ? g_dr_split : (2 * sms) / tiles;
    if (g_dr_split <= 0 && S > ks / kDrMinSteps) S = ks / kDrMinSteps;
    if (S > kDrMaxSplit) S = kDrMaxSplit;
    if (S > ks) S = ks;
    return S < 1 ? 1 : S;
}

template <typename T, int NX, int EPI, bool RS>
cudaError_t launch_dense_ri_k(const DrParams &p, const nb_cuda_wq_rope *rope, const nb_cuda_dr_res *res,
                             cudaStream_t stream) {
    constexpr auto kern = dense_ri_kernel<T, NX, EPI, RS>;
    static bool attr_set[kMaxDev];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 0 || dev >= kMaxDev || !attr_set[dev]) {
        err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, dr_smem_bytes<NX>());
        if (err != cudaSuccess) return err;
        if (dev >= 0 && dev < kMaxDev) attr_set[dev] = true;
    }
    const bool pdl = pdl_on();
    err = nb_pdl::launch(kern, dim3((unsigned)(p.tiles * p.S), (unsigned)((p.n + 8 * NX - 1) / (8 * NX))),
                         dim3(kThreads), dr_smem_bytes<NX>(), stream, pdl, p);
    if (err != cudaSuccess) return err;
    if (res) // the residual form (the kDrRope matmul: partial sums whatever S)
        return nb_pdl::launch(dense_ri_reduce_res_kernel<T>,
                              dim3((unsigned)((p.m + NB_CUDA_DR_PART_COLS - 1) / NB_CUDA_DR_PART_COLS), (unsigned)p.n),
                              dim3(256), 0, stream, pdl, p, *res);
    if constexpr (EPI == kDrRope) {
        const size_t threads = (size_t)p.n * (p.m / 8);
        return nb_pdl::launch(dense_ri_reduce_rope_kernel, dim3((unsigned)((threads + 255) / 256)), dim3(256), 0,
                              stream, pdl, p, *rope);
    }
    if (p.S == 1) return err;
    if constexpr (EPI == kDrSwiglu) {
        const size_t threads = (size_t)p.n * (p.m / 2) / 4;
        return nb_pdl::launch(dense_ri_reduce_swiglu_kernel, dim3((unsigned)((threads + 255) / 256)), dim3(256), 0,
                              stream, pdl, p);
    }
    const bool v4 = p.m % 4 == 0;
    const size_t threads = ((size_t)p.n * p.m + (v4 ? 3 : 0)) / (v4 ? 4 : 1);
    const dim3 grid((unsigned)((threads + 255) / 256));
    return v4 ? nb_pdl::launch(dense_ri_reduce_kernel<true>, grid, dim3(256), 0, stream, pdl, p)
              : nb_pdl::launch(dense_ri_reduce_kernel<false>, grid, dim3(256), 0, stream, pdl, p);
}

// rope: the RoPE form's stores (EPI == kDrRope), else NULL. res: the
// residual form (EPI == kDrRope's matmul, then its own reduction), else
// NULL. RS: the SwiGLU form's norm scale in the accumulators (S == 1).
template <typename T, int EPI = kDrPlain, bool RS = false>
cudaError_t launch_dense_ri(const DrParams &p, const nb_cuda_wq_rope *rope, cudaStream_t stream,
                            const nb_cuda_dr_res *res = nullptr) {
    if (p.n <= 8) return launch_dense_ri_k<T, 1, EPI, RS>(p, rope, res, stream);
    if (p.n <= 16) return launch_dense_ri_k<T, 2, EPI, RS>(p, rope, res, stream);
    if (p.n <= 32) return launch_dense_ri_k<T, 4, EPI, RS>(p, rope, res, stream);
    return launch_dense_ri_k<T, 8, EPI, RS>(p, rope, res, stream);
}
