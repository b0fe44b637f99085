// sampling_cuda.cu: CUDA twins of sampling.c (contracts and the list of what
// is bit-exact in sampling_cuda.h).
//
// Top-k / top-p without a sort: the reference sorts the row's probabilities
// only to find a cut value v and how many ties of v to keep; here that cut is
// found by a most-significant-digit radix descent on the f32 bit patterns
// (non-negative floats order like their bits): three passes (bits 30..20,
// 19..10, 9..0) each build a shared-memory histogram of counts (top-k) or of
// 64-bit fixed-point masses (top-p) over the candidates sharing the digits
// found so far, and a block scan in descending order finds the bucket where
// the running count reaches k or the running mass reaches top_p * kept.
// Integer histograms make the search exact and order-independent; the only
// approximation is the fixed-point mass (p * 2^62 truncated).
#include "sampling_cuda.h"

#include <math.h>

namespace {

constexpr int kPT = 1024; // threads per row block
constexpr int kNW = kPT / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr uint32_t kNone = 0xffffffffu;

// ------------------------------------------------------------ philox
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint32_t k0, uint32_t k1) {
#pragma unroll
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
    }
    return c;
}

__device__ __forceinline__ float rng_uniform(uint64_t seed, uint64_t counter, uint32_t stream) {
    uint4 r = philox4x32_10(make_uint4((uint32_t)counter, (uint32_t)(counter >> 32), stream, 0u),
                            (uint32_t)seed, (uint32_t)(seed >> 32));
    return __fmul_rn(__uint2float_rn(r.x >> 8), 5.9604644775390625e-08f); // * 2^-24, exact
}

// ------------------------------------------------------------ block helpers
// All reductions have a fixed shape (xor butterflies, index-ordered scans), so
// results never depend on scheduling.
template <typename T> __device__ __forceinline__ T warp_incl_scan(T v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        T n = __shfl_up_sync(kFull, v, o);
        if (lane >= o) v = v + n;
    }
    return v;
}

// Exclusive prefix over threads in index order; *total (if given) = the sum.
template <typename T> __device__ T block_excl_scan(T v, T *total) {
    __shared__ T sh[kNW + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    T inc = warp_incl_scan(v);
    T ex = __shfl_up_sync(kFull, inc, 1);
    if (lane == 0) ex = T(0);
    if (lane == 31) sh[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        T w = sh[lane];
        T wi = warp_incl_scan(w);
        T we = __shfl_up_sync(kFull, wi, 1);
        if (lane == 0) we = T(0);
        sh[lane] = we;
        if (lane == 31) sh[kNW] = wi;
    }
    __syncthreads();
    T res = sh[warp] + ex;
    if (total) *total = sh[kNW];
    __syncthreads();
    return res;
}

struct op_sum {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct op_max {
    template <typename T> __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct op_min {
    template <typename T> __device__ T operator()(T a, T b) const { return a < b ? a : b; }
};

// Every thread gets the same result (xor butterflies of a commutative op).
template <typename T, typename Op> __device__ T block_allreduce(T v, Op op) {
    __shared__ T sh[kNW];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = sh[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
    __syncthreads();
    return v;
}

// nb_ref_argmax of x[0..V): the largest non-NaN value, lowest index on ties.
__device__ int32_t block_argmax(const float *x, int V) {
    float bv = 0.0f;
    int bi = -1;
    // NOTE: AU independent loads per thread per round (a 128k row is ~125
    // loads a thread at 1024 threads; one at a time they cost ~47 us on an
    // H100, ncu), compared in index order so ties keep the lowest index.
    constexpr int AU = 8;
    int i = threadIdx.x;
    for (; i + (AU - 1) * (int)blockDim.x < V; i += AU * blockDim.x) {
        float v[AU];
#pragma unroll
        for (int u = 0; u < AU; u++) v[u] = x[i + u * blockDim.x];
#pragma unroll
        for (int u = 0; u < AU; u++)
            if (!isnan(v[u]) && (bi < 0 || v[u] > bv)) bv = v[u], bi = i + u * blockDim.x;
    }
    for (; i < V; i += blockDim.x) {
        float v = x[i];
        if (isnan(v)) continue;
        if (bi < 0 || v > bv) bv = v, bi = i;
    }
    __shared__ float sv[kNW];
    __shared__ int si[kNW];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int round = 0; round < 2; round++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(kFull, bv, o);
            int oi = __shfl_xor_sync(kFull, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        if (round == 0) {
            if (lane == 0) sv[warp] = bv, si[warp] = bi;
            __syncthreads();
            bv = sv[lane];
            bi = si[lane];
        }
    }
    __syncthreads();
    return bi;
}

// ------------------------------------------------------------ inverse CDF
struct row_probs {
    const float *p;
    __device__ float operator()(int i) const { return p[i]; }
};
struct row_residual { // max(0, p - q), the reference's work[] in nb_ref_spec_accept
    const float *p, *q;
    __device__ float operator()(int i) const {
        float r = __fsub_rn(p[i], q[i]);
        return r > 0.0f ? r : 0.0f;
    }
};

// nb_ref_sample over row(0..V-1) with u; every thread gets the token. Each
// thread owns a contiguous chunk, walked in index order.
template <typename Row> __device__ int32_t block_sample(Row row, int V, float u) {
    const int C = (V + kPT - 1) / kPT;
    const int beg = min(V, (int)threadIdx.x * C), end = min(V, beg + C);
    double s = 0.0;
    int last = -1;
    for (int i = beg; i < end; i++) {
        float v = row(i);
        if (v > 0.0f) s += (double)v, last = i;
    }
    double total;
    double cum = block_excl_scan(s, &total);
    last = block_allreduce(last, op_max());
    if (last < 0) return -1;
    const double target = (double)u * total;
    int found = 0x7fffffff;
    for (int i = beg; i < end; i++) {
        float v = row(i);
        if (!(v > 0.0f)) continue;
        cum += (double)v;
        if (cum > target) {
            found = i;
            break;
        }
    }
    found = block_allreduce(found, op_min());
    return found == 0x7fffffff ? last : found;
}

// ------------------------------------------------------------ radix cut
__device__ __forceinline__ unsigned long long fx_of(float p) {
    return __float2ull_rz(__fmul_rn(p, 4611686018427387904.0f)); // p * 2^62
}

struct cut_t {
    bool found;
    uint32_t key;    // f32 bits of the cut value v
    uint32_t cnt_gt; // candidates > v
    uint32_t j;      // copies of v up to and including the cut (>= 1)
};

// Descending order over the candidate multiset M = {p : bits(p) > lo_key} plus
// lo_mult copies of bits lo_key. by_sum == false: the cut is the k_count-th
// element. by_sum == true: the first element where the running fixed-point
// mass, as a double, is >= need. found == false if no element qualifies.
__device__ cut_t radix_cut(const float *pr, int V, uint32_t lo_key, uint32_t lo_mult,
                           bool by_sum, uint32_t k_count, double need, uint32_t *hcnt,
                           unsigned long long *hfx) {
    __shared__ uint32_t s_bucket, s_cnt;
    __shared__ unsigned long long s_fx;
    const int tid = threadIdx.x;
    uint32_t prefix = 0, above_cnt = 0, bucket_cnt = 0;
    unsigned long long above_fx = 0;
    for (int pass = 0; pass < 3; pass++) {
        const int shift = pass == 0 ? 20 : pass == 1 ? 10 : 0;
        const int nb = pass == 0 ? 2048 : 1024;
        const uint32_t himask = pass == 0 ? 0u : ~((1u << (shift + 10)) - 1u);
        for (int b = tid; b < nb; b += kPT) hcnt[b] = 0, hfx[b] = 0;
        if (tid == 0) s_bucket = kNone;
        __syncthreads();
        for (int i = tid; i < V; i += kPT) {
            float p = pr[i];
            uint32_t key = __float_as_uint(p);
            if (key > lo_key && key < 0x80000000u && (key & himask) == prefix) {
                uint32_t b = (key >> shift) & (uint32_t)(nb - 1);
                atomicAdd(&hcnt[b], 1u);
                if (by_sum) atomicAdd(&hfx[b], fx_of(p));
            }
        }
        if (tid == 0 && lo_mult > 0 && (lo_key & himask) == prefix) {
            uint32_t b = (lo_key >> shift) & (uint32_t)(nb - 1);
            atomicAdd(&hcnt[b], lo_mult);
            if (by_sum)
                atomicAdd(&hfx[b], (unsigned long long)lo_mult * fx_of(__uint_as_float(lo_key)));
        }
        __syncthreads();
        // NOTE: thread t owns buckets nb-1-t*per .. in descending order, so the
        // exclusive scan over threads is the mass/count above each bucket.
        const int per = nb / kPT;
        uint32_t c_loc = 0;
        unsigned long long f_loc = 0;
        for (int u = 0; u < per; u++) {
            int b = nb - 1 - (tid * per + u);
            c_loc += hcnt[b];
            f_loc += hfx[b];
        }
        uint32_t cb = above_cnt + block_excl_scan(c_loc, (uint32_t *)nullptr);
        unsigned long long fb = above_fx + block_excl_scan(f_loc, (unsigned long long *)nullptr);
        for (int u = 0; u < per; u++) {
            int b = nb - 1 - (tid * per + u);
            uint32_t c = hcnt[b];
            unsigned long long f = hfx[b];
            bool cross = by_sum ? ((double)fb < need && (double)(fb + f) >= need)
                                : (cb < k_count && cb + c >= k_count);
            if (cross) s_bucket = (uint32_t)b, s_cnt = cb, s_fx = fb; // exactly one bucket
            cb += c;
            fb += f;
        }
        __syncthreads();
        const uint32_t bucket = s_bucket;
        if (bucket == kNone) {
            __syncthreads();
            return cut_t{false, 0, 0, 0};
        }
        prefix |= bucket << shift;
        above_cnt = s_cnt;
        above_fx = s_fx;
        bucket_cnt = hcnt[bucket];
        __syncthreads();
    }
    cut_t r{true, prefix, above_cnt, 0};
    if (!by_sum) {
        r.j = k_count - above_cnt;
    } else {
        // Smallest j in [1, bucket_cnt] with above + j * fx(v) >= need (the
        // crossing guarantees j = bucket_cnt qualifies).
        const unsigned long long fv = fx_of(__uint_as_float(prefix));
        uint32_t lo = 1, hi = bucket_cnt;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if ((double)(above_fx + (unsigned long long)mid * fv) >= need) hi = mid;
            else lo = mid + 1;
        }
        r.j = lo;
    }
    return r;
}

// ------------------------------------------------------------ kernels
__global__ void philox_kernel(uint32_t *out, const uint32_t *ctr, const uint32_t *key, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint4 r = philox4x32_10(make_uint4(ctr[4 * i], ctr[4 * i + 1], ctr[4 * i + 2], ctr[4 * i + 3]),
                            key[2 * i], key[2 * i + 1]);
    out[4 * i] = r.x, out[4 * i + 1] = r.y, out[4 * i + 2] = r.z, out[4 * i + 3] = r.w;
}

__global__ void uniform_kernel(float *out, const uint64_t *seed, const uint64_t *counter,
                               uint32_t stream, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = rng_uniform(seed[i], counter[i], stream);
}

__global__ void __launch_bounds__(kPT) argmax_kernel(int32_t *out, const float *x, int V) {
    int32_t am = block_argmax(x + (size_t)blockIdx.x * V, V);
    if (threadIdx.x == 0) out[blockIdx.x] = am;
}

// Block b: logits row in_rows[b] -> probs row out_rows[b] (NULL maps: b).
__global__ void __launch_bounds__(kPT) probs_kernel(float *probs, const int32_t *out_rows,
                                                    const float *logits, const int32_t *in_rows,
                                                    int V, const nb_sampling_params *sps,
                                                    int32_t *status) {
    __shared__ uint32_t hcnt[2048];
    __shared__ unsigned long long hfx[2048];
    const size_t row = blockIdx.x;
    const float *lg = logits + (size_t)(in_rows ? in_rows[row] : row) * V;
    float *pr = probs + (size_t)(out_rows ? out_rows[row] : row) * V;
    const int tid = threadIdx.x;
    const nb_sampling_params sp = sps[row];
    if (!(sp.temperature >= 0.0f) || sp.top_k < 0 || !(sp.top_p > 0.0f) || !(sp.top_p <= 1.0f)) {
        if (tid == 0) status[row] = NB_ERR_INVALID_ARG;
        return;
    }
    float mx = -INFINITY;
    int bad = 0;
    for (int i = tid; i < V; i += kPT) {
        float x = lg[i];
        if (isnan(x) || x == INFINITY) bad = 1;
        else if (x > mx) mx = x;
    }
    mx = block_allreduce(mx, op_max());
    bad = block_allreduce(bad, op_max());
    if (bad || mx == -INFINITY) {
        if (tid == 0) status[row] = NB_ERR_NON_FINITE;
        return;
    }
    const float T = sp.temperature;
    if (T == 0.0f) {
        const int32_t am = block_argmax(lg, V); // reads the whole row before any write
        for (int i = tid; i < V; i += kPT) pr[i] = i == am ? 1.0f : 0.0f;
        if (tid == 0) status[row] = NB_OK;
        return;
    }
    double s = 0.0;
    for (int i = tid; i < V; i += kPT) {
        // NOTE: exp in double rounded once: within 1 ulp of glibc's expf, and
        // equal to it for all but ~1 argument in 1600.
        float z = __fdiv_rn(__fsub_rn(lg[i], mx), T);
        float e = __double2float_rn(exp((double)z));
        pr[i] = e;
        s += (double)e;
    }
    s = block_allreduce(s, op_sum());
    float fs = __double2float_rn(s);
    for (int i = tid; i < V; i += kPT) pr[i] = __fdiv_rn(pr[i], fs);
    if ((sp.top_k == 0 || sp.top_k >= V) && sp.top_p >= 1.0f) {
        if (tid == 0) status[row] = NB_OK;
        return;
    }
    __syncthreads(); // the passes below read other threads' elements

    int nz_loc = 0;
    for (int i = tid; i < V; i += kPT) nz_loc += pr[i] > 0.0f;
    const uint32_t nz = (uint32_t)block_allreduce(nz_loc, op_sum());
    uint32_t keep = nz;
    if (sp.top_k > 0 && (uint32_t)sp.top_k < keep) keep = (uint32_t)sp.top_k;
    // The top `keep` elements: bits > kt plus mt copies of kt.
    uint32_t kt = 0, mt = 0;
    if (keep < nz) {
        cut_t c = radix_cut(pr, V, 0, 0, false, keep, 0.0, hcnt, hfx);
        kt = c.key;
        mt = c.j;
    }
    uint32_t vkey = kt, neq = mt;
    if (sp.top_p < 1.0f) {
        unsigned long long kf = 0;
        for (int i = tid; i < V; i += kPT)
            if (__float_as_uint(pr[i]) > kt) kf += fx_of(pr[i]);
        kf = block_allreduce(kf, op_sum());
        kf += (unsigned long long)mt * fx_of(__uint_as_float(kt));
        const double need = (double)sp.top_p * (double)kf;
        cut_t c = radix_cut(pr, V, kt, mt, true, 0, need, hcnt, hfx);
        if (c.found) vkey = c.key, neq = c.j;
    }
    // Kept: bits > vkey, and the first neq (by index) with bits == vkey.
    // NOTE: ranking ties needs index order, so each thread owns a chunk.
    const int C = (V + kPT - 1) / kPT;
    const int beg = min(V, tid * C), end = min(V, beg + C);
    uint32_t n_tie = 0;
    if (vkey != 0)
        for (int i = beg; i < end; i++) n_tie += __float_as_uint(pr[i]) == vkey;
    const uint32_t rank0 = block_excl_scan(n_tie, (uint32_t *)nullptr);
    double ks = 0.0;
    uint32_t rank = rank0;
    for (int i = beg; i < end; i++) {
        uint32_t key = __float_as_uint(pr[i]);
        bool kept = key > vkey || (vkey != 0 && key == vkey && rank++ < neq);
        if (kept) ks += (double)pr[i];
    }
    ks = block_allreduce(ks, op_sum());
    const float fk = __double2float_rn(ks);
    rank = rank0;
    for (int i = beg; i < end; i++) {
        float p = pr[i];
        uint32_t key = __float_as_uint(p);
        bool kept = key > vkey || (vkey != 0 && key == vkey && rank++ < neq);
        pr[i] = kept ? __fdiv_rn(p, fk) : 0.0f;
    }
    if (tid == 0) status[row] = NB_OK;
}

__global__ void __launch_bounds__(kPT) sample_kernel(int32_t *out, const float *probs,
                                                     const int32_t *rows, int V,
                                                     const uint64_t *seed,
                                                     const uint64_t *counter, uint32_t stream) {
    const size_t row = blockIdx.x;
    const float u = rng_uniform(seed[row], counter[row], stream);
    const size_t pr = rows ? (size_t)rows[row] : row;
    int32_t t = block_sample(row_probs{probs + pr * V}, V, u);
    if (threadIdx.x == 0) out[row] = t;
}

__global__ void accept_greedy_kernel(int n, int gamma_max, const int32_t *gamma,
                                     const int32_t *draft, const int32_t *target,
                                     int32_t *out, int32_t *n_acc) {
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= n) return;
    const int g = gamma ? gamma[s] : gamma_max;
    if (g < 0 || g > gamma_max) {
        n_acc[s] = NB_ERR_INVALID_ARG;
        return;
    }
    const int32_t *d = draft + (size_t)s * gamma_max, *t = target + (size_t)s * (gamma_max + 1);
    int32_t *o = out + (size_t)s * (gamma_max + 1);
    int a = 0;
    while (a < g && d[a] == t[a]) {
        o[a] = d[a];
        a++;
    }
    o[a] = t[a];
    n_acc[s] = a;
}

__global__ void __launch_bounds__(kPT) accept_kernel(int gamma_max, int V, const int32_t *gamma,
                                                     const float *p, const int32_t *p_row0,
                                                     const float *q, const int32_t *q_row0,
                                                     const int32_t *draft, const uint64_t *seed,
                                                     const uint64_t *counter0, int32_t *out,
                                                     int32_t *n_acc) {
    __shared__ int s_rej, s_err;
    const size_t s = blockIdx.x;
    const int g = gamma ? gamma[s] : gamma_max;
    const float *ps = p + (p_row0 ? (size_t)p_row0[s] : s * (size_t)(gamma_max + 1)) * V;
    const float *qs = q + (q_row0 ? (size_t)q_row0[s] : s * (size_t)gamma_max) * V;
    const int32_t *ds = draft + s * (size_t)gamma_max;
    int32_t *os = out + s * (size_t)(gamma_max + 1);
    const uint64_t sd = seed[s], c0 = counter0[s];
    if (threadIdx.x == 0) {
        int err = NB_OK, rej = g;
        if (g < 0 || g > gamma_max) err = NB_ERR_INVALID_ARG;
        for (int i = 0; err == NB_OK && i < g; i++)
            if (ds[i] < 0 || ds[i] >= V) err = NB_ERR_INVALID_ARG;
        for (int i = 0; err == NB_OK && i < g; i++) {
            const int32_t d = ds[i];
            float u = rng_uniform(sd, c0 + (uint64_t)i, 1);
            if (__fmul_rn(u, qs[(size_t)i * V + d]) < ps[(size_t)i * V + d]) {
                os[i] = d;
                continue;
            }
            rej = i;
            break;
        }
        s_rej = rej;
        s_err = err;
    }
    __syncthreads();
    const int rej = s_rej;
    if (s_err != NB_OK) {
        if (threadIdx.x == 0) n_acc[s] = s_err;
        return;
    }
    int32_t t;
    if (rej < g) {
        const float *pi = ps + (size_t)rej * V, *qi = qs + (size_t)rej * V;
        row_residual res{pi, qi};
        int any = 0;
        for (int j = threadIdx.x; j < V; j += kPT) any |= res(j) > 0.0f;
        any = block_allreduce(any, op_max());
        const float u2 = rng_uniform(sd, c0 + (uint64_t)rej, 2);
        t = any ? block_sample(res, V, u2) : block_sample(row_probs{pi}, V, u2);
    } else {
        t = block_sample(row_probs{ps + (size_t)g * V}, V, rng_uniform(sd, c0 + (uint64_t)g, 2));
    }
    if (threadIdx.x == 0) {
        if (t < 0) {
            n_acc[s] = NB_ERR_STATE;
        } else {
            os[rej] = t;
            n_acc[s] = rej;
        }
    }
}

nb_status launch_status() {
    return cudaGetLastError() == cudaSuccess ? NB_OK : NB_ERR_BACKEND;
}

} // namespace

// ------------------------------------------------------------ launchers
extern "C" nb_status nb_cuda_philox4x32_10(uint32_t *out, const uint32_t *ctr,
                                           const uint32_t *key, int n, cudaStream_t stream) {
    if (n < 0) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!out || !ctr || !key) return NB_ERR_INVALID_ARG;
    philox_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, ctr, key, n);
    return launch_status();
}

extern "C" nb_status nb_cuda_rng_uniform(float *out, const uint64_t *seed,
                                         const uint64_t *counter, uint32_t rng_stream, int n,
                                         cudaStream_t stream) {
    if (n < 0) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!out || !seed || !counter) return NB_ERR_INVALID_ARG;
    uniform_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, seed, counter,
                                                                      rng_stream, n);
    return launch_status();
}

extern "C" nb_status nb_cuda_argmax(int32_t *out, const float *x, int n, int V,
                                    cudaStream_t stream) {
    if (n < 0 || V < 1) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!out || !x) return NB_ERR_INVALID_ARG;
    argmax_kernel<<<(unsigned)n, kPT, 0, stream>>>(out, x, V);
    return launch_status();
}

extern "C" nb_status nb_cuda_probs(float *probs, const float *logits, int n, int V,
                                   const nb_sampling_params *sp, int32_t *status,
                                   cudaStream_t stream) {
    return nb_cuda_probs_rows(probs, nullptr, logits, nullptr, n, V, sp, status, stream);
}

extern "C" nb_status nb_cuda_probs_rows(float *probs, const int32_t *out_rows,
                                        const float *logits, const int32_t *in_rows, int n, int V,
                                        const nb_sampling_params *sp, int32_t *status,
                                        cudaStream_t stream) {
    if (n < 0 || V < 1) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!probs || !logits || !sp || !status) return NB_ERR_INVALID_ARG;
    probs_kernel<<<(unsigned)n, kPT, 0, stream>>>(probs, out_rows, logits, in_rows, V, sp, status);
    return launch_status();
}

extern "C" nb_status nb_cuda_sample(int32_t *out, const float *probs, int n, int V,
                                    const uint64_t *seed, const uint64_t *counter,
                                    uint32_t rng_stream, cudaStream_t stream) {
    return nb_cuda_sample_rows(out, probs, nullptr, n, V, seed, counter, rng_stream, stream);
}

extern "C" nb_status nb_cuda_sample_rows(int32_t *out, const float *probs, const int32_t *rows,
                                         int n, int V, const uint64_t *seed,
                                         const uint64_t *counter, uint32_t rng_stream,
                                         cudaStream_t stream) {
    if (n < 0 || V < 1) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!out || !probs || !seed || !counter) return NB_ERR_INVALID_ARG;
    sample_kernel<<<(unsigned)n, kPT, 0, stream>>>(out, probs, rows, V, seed, counter, rng_stream);
    return launch_status();
}

extern "C" nb_status nb_cuda_spec_accept_greedy(int n, int gamma_max, const int32_t *gamma,
                                                const int32_t *draft,
                                                const int32_t *target_argmax,
                                                int32_t *out_tokens, int32_t *n_accepted,
                                                cudaStream_t stream) {
    if (n < 0 || gamma_max < 0) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if ((gamma_max > 0 && !draft) || !target_argmax || !out_tokens || !n_accepted)
        return NB_ERR_INVALID_ARG;
    accept_greedy_kernel<<<(unsigned)((n + 127) / 128), 128, 0, stream>>>(
        n, gamma_max, gamma, draft, target_argmax, out_tokens, n_accepted);
    return launch_status();
}

extern "C" nb_status nb_cuda_spec_accept(int n, int gamma_max, int V, const int32_t *gamma,
                                         const float *p, const float *q, const int32_t *draft,
                                         const uint64_t *seed, const uint64_t *counter0,
                                         int32_t *out_tokens, int32_t *n_accepted,
                                         cudaStream_t stream) {
    return nb_cuda_spec_accept_rows(n, gamma_max, V, gamma, p, nullptr, q, nullptr, draft, seed,
                                    counter0, out_tokens, n_accepted, stream);
}

extern "C" nb_status nb_cuda_spec_accept_rows(int n, int gamma_max, int V, const int32_t *gamma,
                                              const float *p, const int32_t *p_row0,
                                              const float *q, const int32_t *q_row0,
                                              const int32_t *draft, const uint64_t *seed,
                                              const uint64_t *counter0, int32_t *out_tokens,
                                              int32_t *n_accepted, cudaStream_t stream) {
    if (n < 0 || gamma_max < 0 || V < 1) return NB_ERR_INVALID_ARG;
    if (n == 0) return NB_OK;
    if (!p || (gamma_max > 0 && (!q || !draft)) || !seed || !counter0 ||
        !out_tokens || !n_accepted)
        return NB_ERR_INVALID_ARG;
    accept_kernel<<<(unsigned)n, kPT, 0, stream>>>(gamma_max, V, gamma, p, p_row0, q, q_row0,
                                                   draft, seed, counter0, out_tokens, n_accepted);
    return launch_status();
}
