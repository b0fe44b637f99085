// test_ops_cuda.cu: every kernel of ops_cuda.h and sampling_cuda.h against
// its C twin (ops_ref.h, sampling.h, the cpu backend's write_kv) on random
// data, with one PASS/FAIL summary line per kernel.
//
// The one idea: bit-exact where the kernel performs the reference's own
// roundings (rmsnorm, add, embed, write_kv, convert, philox, argmax, greedy
// acceptance), a named tolerance where a transcendental is evaluated by a
// different library (rope: cos/sin; silu: exp), and for the sampling chain a
// count of token disagreements over many seeds, which must be 0 for greedy
// and at most 0.1% for sampling (each one needs a uniform to land within
// rounding of a CDF boundary; see sampling_cuda.h; the expected count is 0).
// Exits 0 when everything passes, 1 on a failure, 77 without a GPU.
#include <cuda_runtime.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "kv_layout.h"
#include "nb_dtype.h"
#include "nb_status.h"
// NOTE: the C reference headers have no C++ guards of their own.
extern "C" {
#include "ops_ref.h"
#include "sampling.h"
}
#include "ops_cuda.h"
#include "sampling_cuda.h"

// ------------------------------------------------------------ harness
static int g_failed = 0;

#include "../nb_cuda_check.h"

#define NB_CHECK(x)                                                                        \
    do {                                                                                   \
        nb_status s_ = (x);                                                                \
        if (s_ != NB_OK) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, nb_status_str(s_)); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static void summary(bool ok, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s %-18s ", ok ? "PASS" : "FAIL", name);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    if (!ok) g_failed++;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd64() { // xorshift64*
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1Dull;
}
static uint32_t rnd32() { return (uint32_t)(rnd64() >> 32); }
static float rnd_unit() { return (float)(rnd64() >> 40) * 0x1p-24f; }               // [0,1)
static float rnd_range(float a, float b) { return a + (b - a) * rnd_unit(); }
static float rnd_normal() {
    float u1 = rnd_unit() + 0x1p-25f, u2 = rnd_unit();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

template <typename T> struct dbuf { // device buffer
    T *p = nullptr;
    size_t n = 0;
    explicit dbuf(size_t count) : n(count) {
        CUDA_OK(cudaMalloc((void **)&p, (count ? count : 1) * sizeof(T)));
    }
    dbuf(const std::vector<T> &h) : dbuf(h.size()) { up(h); }
    ~dbuf() { cudaFree(p); }
    dbuf(const dbuf &) = delete;
    dbuf &operator=(const dbuf &) = delete;
    void up(const std::vector<T> &h) {
        CUDA_OK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<T> down() const {
        std::vector<T> h(n);
        CUDA_OK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};

static void sync() { CUDA_OK(cudaDeviceSynchronize()); }

// Distance in ulps between two floats (ordered-integer mapping; +0 == -0).
static int64_t ulp_dist(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    int64_t oa = ia < 0 ? -(int64_t)(ia & 0x7fffffff) : ia;
    int64_t ob = ib < 0 ? -(int64_t)(ib & 0x7fffffff) : ib;
    return oa > ob ? oa - ob : ob - oa;
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

// Random f32 values of dtype dt stored in a byte buffer (for weights/tables).
static std::vector<uint8_t> make_dtype_buf(size_t n, nb_dtype dt, bool random_bits) {
    std::vector<uint8_t> b(n * nb_dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        if (random_bits) {
            uint32_t r = rnd32();
            if (dt == NB_DTYPE_F32) {
                // NOTE: no signalling NaNs: a host float copy may quiet them.
                if ((r & 0x7f800000u) == 0x7f800000u && (r & 0x7fffffu)) r |= 0x400000u;
                memcpy(&b[i * 4], &r, 4);
            } else {
                uint16_t h = (uint16_t)r;
                memcpy(&b[i * 2], &h, 2);
            }
        } else {
            nb_store_f32(b.data(), dt, i, rnd_range(0.5f, 1.5f) * (rnd32() & 1 ? 1.0f : -1.0f));
        }
    }
    return b;
}

// ------------------------------------------------------------ rmsnorm
static void test_rmsnorm() {
    const int shapes[][2] = {{1, 8},    {3, 64},   {5, 128},  {4, 100},  {7, 4096},
                             {2, 8192}, {3, 4099}, {1, 16384}, {33, 2048}};
    const nb_dtype dts[] = {NB_DTYPE_F32, NB_DTYPE_F16, NB_DTYPE_BF16};
    long cases = 0, elems = 0, mism = 0;
    int64_t max_ulp = 0;
    for (auto &sh : shapes) {
        for (nb_dtype dt : dts) {
            const int n = sh[0], d = sh[1];
            std::vector<float> x((size_t)n * d);
            for (int i = 0; i < n; i++) {
                float scale = i % 3 == 0 ? 1.0f : i % 3 == 1 ? 300.0f : 1e-3f;
                for (int j = 0; j < d; j++) x[(size_t)i * d + j] = rnd_normal() * scale;
            }
            std::vector<uint8_t> w = make_dtype_buf((size_t)d, dt, false);
            std::vector<float> ref(x.size());
            nb_ref_rmsnorm(ref.data(), x.data(), w.data(), dt, n, d, 1e-5f);
            dbuf<float> dx(x), dout(x.size());
            std::vector<uint8_t> wb(w);
            dbuf<uint8_t> dw(wb);
            // Odd cases run in place (out == x).
            const bool inplace = (cases & 1) != 0;
            NB_CHECK(nb_cuda_rmsnorm(inplace ? dx.p : dout.p, dx.p, dw.p, dt, n, d, 1e-5f, 0));
            std::vector<float> got = inplace ? dx.down() : dout.down();
            for (size_t i = 0; i < got.size(); i++) {
                if (!same_bits(got[i], ref[i])) mism++;
                int64_t u = ulp_dist(got[i], ref[i]);
                if (u > max_ulp) max_ulp = u;
            }
            elems += (long)got.size();
            cases++;
        }
    }
    summary(mism == 0, "rmsnorm", "%ld cases (d 8..16384, f32/f16/bf16 w, half in place), %ld elems, "
            "%ld not bit-exact (max %lld ulp); contract: bit-exact (64-lane order)",
            cases, elems, mism, (long long)max_ulp);
}

// ------------------------------------------------------------ rope
static void test_rope() {
    const int Ds[] = {8, 64, 128};
    const int heads[] = {1, 4, 32};
    const int rows[] = {1, 7, 33};
    long cases = 0, elems = 0, inexact = 0, bad = 0;
    double worst = 0.0; // max |got-ref| / (2^-22 (|x0|+|x1|))
    for (int D : Ds) {
        for (int sc = 0; sc < 2; sc++) {
            std::vector<float> inv(D / 2);
            nb_rope_scaling llama3 = {NB_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192};
            NB_CHECK(nb_ref_rope_inv_freq(inv.data(), D, sc ? 500000.0f : 10000.0f,
                                          sc ? &llama3 : NULL));
            for (int H : heads) {
                for (int n : rows) {
                    std::vector<int32_t> pos(n);
                    for (int t = 0; t < n; t++)
                        pos[t] = t == 0 ? 0 : t == 1 ? 1 : (int32_t)(rnd32() % 131072);
                    std::vector<float> x((size_t)n * H * D);
                    for (auto &v : x) v = rnd_normal() * 4.0f;
                    std::vector<float> ref(x);
                    nb_ref_rope_apply(ref.data(), pos.data(), n, H, D, inv.data());
                    dbuf<float> dx(x), dinv(inv);
                    dbuf<int32_t> dpos(pos);
                    NB_CHECK(nb_cuda_rope_apply(dx.p, dpos.p, n, H, D, dinv.p, 0));
                    std::vector<float> got = dx.down();
                    const int h = D / 2;
                    for (size_t e = 0; e < got.size(); e++) {
                        size_t base = e / D * D;
                        int i = (int)(e % D) % h;
                        double mag = fabs(x[base + i]) + fabs(x[base + i + h]);
                        double err = fabs((double)got[e] - (double)ref[e]);
                        double tol = ldexp(mag, -22);
                        if (!same_bits(got[e], ref[e])) inexact++;
                        if (err > tol) bad++;
                        if (tol > 0 && err / tol > worst) worst = err / tol;
                    }
                    elems += (long)got.size();
                    cases++;
                }
            }
        }
    }
    summary(bad == 0, "rope", "%ld cases (D 8/64/128, default+llama3, pos < 131072), %ld elems, "
            "%ld not bit-exact (%.4f%%), worst err %.3f of tol 2^-22*(|x0|+|x1|)",
            cases, elems, inexact, 100.0 * inexact / (double)elems, worst);
}

// ------------------------------------------------------------ silu, add
static void test_silu_add() {
    const size_t sizes[] = {1, 1000, (1u << 20) + 3};
    long elems = 0, inexact = 0, bad = 0, add_bad = 0, add_elems = 0;
    int64_t max_ulp = 0;
    int which = 0;
    for (size_t n : sizes) {
        std::vector<float> g(n), u(n);
        for (size_t i = 0; i < n; i++) {
            g[i] = rnd_range(-30.0f, 30.0f);
            u[i] = rnd_normal() * 3.0f;
        }
        const float special[] = {0.0f, -0.0f, 100.0f, -100.0f, 88.0f, -88.0f, 89.0f, -89.0f,
                                 1e-30f, -1e-30f, 104.0f, -104.0f, INFINITY, -INFINITY};
        for (size_t i = 0; i < sizeof special / sizeof special[0] && i < n; i++)
            g[n - 1 - i] = special[i];
        std::vector<float> ref(n);
        nb_ref_silu_mul(ref.data(), g.data(), u.data(), n);
        dbuf<float> dg(g), du(u), dout(n);
        // Alternate out-of-place and in-place (out == gate, out == up).
        float *out = which == 0 ? dout.p : which == 1 ? dg.p : du.p;
        NB_CHECK(nb_cuda_silu_mul(out, dg.p, du.p, n, 0));
        std::vector<float> got = which == 0 ? dout.down() : which == 1 ? dg.down() : du.down();
        for (size_t i = 0; i < n; i++) {
            if (isnan(ref[i]) && isnan(got[i])) continue;
            if (!same_bits(got[i], ref[i])) inexact++;
            int64_t d = ulp_dist(got[i], ref[i]);
            if (d > max_ulp) max_ulp = d;
            if (d > 4) bad++;
        }
        elems += (long)n;

        // add: out = a + b, bit-exact (NaN compared as NaN: payload rules differ).
        std::vector<float> a(n), b(n), aref(n);
        for (size_t i = 0; i < n; i++) {
            a[i] = rnd_normal() * 1e3f;
            b[i] = (i % 97 == 0) ? INFINITY : rnd_normal();
        }
        nb_ref_add(aref.data(), a.data(), b.data(), n);
        dbuf<float> da(a), db(b);
        NB_CHECK(nb_cuda_add(which == 1 ? db.p : da.p, da.p, db.p, n, 0));
        std::vector<float> agot = which == 1 ? db.down() : da.down();
        for (size_t i = 0; i < n; i++)
            if (!same_bits(agot[i], aref[i]) && !(isnan(agot[i]) && isnan(aref[i]))) add_bad++;
        add_elems += (long)n;
        which = (which + 1) % 3;
    }
    summary(bad == 0, "silu_mul", "%ld elems (g in [-30,30] + overflow/underflow/inf), %ld not "
            "bit-exact, max %lld ulp; tol 4 ulp (exp <= 1 ulp from glibc's expf, then +, /, *)",
            elems, inexact, (long long)max_ulp);
    summary(add_bad == 0, "add", "%ld elems, %ld mismatches; contract: bit-exact", add_elems,
            add_bad);
}

// ------------------------------------------------------------ embed
static void test_embed() {
    const nb_dtype dts[] = {NB_DTYPE_F32, NB_DTYPE_F16, NB_DTYPE_BF16};
    const int shapes[][2] = {{512, 8}, {512, 4096}, {16000, 64}, {128256, 128}}; // vocab, d
    long rows = 0, mism = 0, nan_rows_ok = 1;
    for (auto &sh : shapes) {
        for (nb_dtype dt : dts) {
            const int vocab = sh[0], d = sh[1], n = 37;
            // NOTE: random bit patterns cover Inf, NaN payloads and subnormals.
            std::vector<uint8_t> table = make_dtype_buf((size_t)vocab * d, dt, true);
            std::vector<int32_t> ids(n);
            for (int i = 0; i < n; i++) ids[i] = i == 0 ? 0 : i == 1 ? vocab - 1 : (int32_t)(rnd32() % vocab);
            std::vector<float> ref((size_t)n * d);
            NB_CHECK(nb_ref_embed(ref.data(), table.data(), dt, ids.data(), n, d, vocab));
            dbuf<uint8_t> dt_(table);
            dbuf<int32_t> dids(ids);
            dbuf<float> dout((size_t)n * d);
            NB_CHECK(nb_cuda_embed(dout.p, dt_.p, dt, dids.p, n, d, vocab, 0));
            std::vector<float> got = dout.down();
            for (size_t i = 0; i < got.size(); i++) mism += !same_bits(got[i], ref[i]);
            rows += n;
            // An invalid id gives a NaN row instead of an out-of-bounds read.
            std::vector<int32_t> badid = {vocab};
            dbuf<int32_t> dbad(badid);
            NB_CHECK(nb_cuda_embed(dout.p, dt_.p, dt, dbad.p, 1, d, vocab, 0));
            std::vector<float> g2 = dout.down();
            for (int j = 0; j < d; j++) nan_rows_ok &= isnan(g2[j]);
        }
    }
    summary(mism == 0 && nan_rows_ok, "embed", "%ld rows (vocab 512..128256, random f32/f16/bf16 "
            "bit patterns), %ld mismatching elems, bad id -> NaN row: %s; contract: bit-exact",
            rows, mism, nan_rows_ok ? "yes" : "NO");
}

// ------------------------------------------------------------ write_kv
// The cpu backend's write_kv, with (fpblock, slot) per row given directly.
static void ref_write_kv(const nb_kv_layout *lay, void *fp, int layer, const float *k,
                         const float *v, const int32_t *fb, const int32_t *slot, int n) {
    const int D = lay->head_dim, Hkv = lay->n_kv_heads;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < Hkv; h++) {
            size_t ko = nb_kv_fp_offset(lay, layer, fb[i], h, 0, slot[i]);
            size_t vo = nb_kv_fp_offset(lay, layer, fb[i], h, 1, slot[i]);
            for (int c = 0; c < D; c++) {
                nb_store_f32(fp, lay->dtype, ko + c, k[((size_t)i * Hkv + h) * D + c]);
                nb_store_f32(fp, lay->dtype, vo + c, v[((size_t)i * Hkv + h) * D + c]);
            }
        }
}

static float kv_value() {
    static const float special[] = {NAN, -NAN, INFINITY, -INFINITY, 65504.0f, 65519.0f,
                                    65520.0f, -65520.0f, 1e-8f, -1e-8f, 0x1p-25f, 0x1p-24f,
                                    0x1.8p-24f, 6.1e-5f, 0.0f, -0.0f, 1e30f, 3.0e38f};
    uint32_t r = rnd32();
    if (r % 16 == 0) return special[(r >> 4) % (sizeof special / sizeof special[0])];
    if (r % 16 == 1) { // random finite bits
        uint32_t b = rnd32();
        if ((b & 0x7f800000u) == 0x7f800000u) b &= 0xbfffffffu;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    return rnd_normal() * 2.0f;
}

static void test_write_kv() {
    const nb_dtype dts[] = {NB_DTYPE_F32, NB_DTYPE_F16, NB_DTYPE_BF16};
    const int Ds[] = {8, 64, 128};
    const int Hs[] = {1, 8};
    long cases = 0, bytes = 0, mism = 0;
    for (nb_dtype dt : dts)
        for (int D : Ds)
            for (int H : Hs) {
                nb_kv_layout lay = {3, H, D, 16, dt, 0, 6};
                const int layer = 1, n = 40, slots = lay.n_fpblocks * lay.group_size;
                std::vector<int32_t> perm(slots);
                for (int i = 0; i < slots; i++) perm[i] = i;
                for (int i = slots - 1; i > 0; i--) std::swap(perm[i], perm[rnd32() % (i + 1)]);
                std::vector<int32_t> fb(n), sl(n);
                for (int i = 0; i < n; i++) fb[i] = perm[i] / 16, sl[i] = perm[i] % 16;
                std::vector<float> k((size_t)n * H * D), v(k.size());
                for (auto &x : k) x = kv_value();
                for (auto &x : v) x = kv_value();
                std::vector<uint8_t> pool(nb_kv_fp_bytes(&lay), 0xA5);
                dbuf<uint8_t> dpool(pool);
                ref_write_kv(&lay, pool.data(), layer, k.data(), v.data(), fb.data(), sl.data(), n);
                dbuf<float> dk(k), dv(v);
                dbuf<int32_t> dfb(fb), dsl(sl);
                NB_CHECK(nb_cuda_write_kv(&lay, dpool.p, layer, dk.p, dv.p, dfb.p, dsl.p, n, 0));
                std::vector<uint8_t> got = dpool.down();
                for (size_t i = 0; i < got.size(); i++) mism += got[i] != pool[i];
                bytes += (long)got.size();
                cases++;
            }
    summary(mism == 0, "write_kv", "%ld cases (D 8/64/128, 1/8 kv heads, f32/f16/bf16 cache, "
            "NaN/Inf/overflow/subnormal values, poisoned pool), %ld of %ld pool bytes differ; "
            "contract: bit-exact", cases, mism, bytes);
}

// ------------------------------------------------------------ fused ops
// The backend's fused kernels against compositions of the C twins:
// add_rmsnorm = nb_ref_add, nb_ref_rmsnorm, then a conversion; silu_mul_cvt
// = nb_ref_silu_mul on strided rows, then a conversion; rope_write_kv =
// nb_cuda_rope_apply + nb_cuda_write_kv (twins of nb_ref_rope_apply and
// write_kv, tested above) bit for bit, and q against nb_ref_rope_apply with
// rope's tolerance.
static uint16_t cvt_ref(float v, nb_dtype dt, int sat) {
    if (sat) return nb_f32_to_f16_sat(v);
    return dt == NB_DTYPE_F16 ? nb_f32_to_f16(v) : nb_f32_to_bf16(v);
}

static void test_add_rmsnorm() {
    const int shapes[][2] = {{1, 8}, {3, 64}, {5, 128}, {4, 100}, {7, 4096}, {2, 8192}, {33, 2048}};
    const nb_dtype dts[] = {NB_DTYPE_F32, NB_DTYPE_F16, NB_DTYPE_BF16};
    // cvt kinds: none (f32 out only), f16, bf16, f16 saturating; each with
    // and without the f32 out, with and without the residual.
    long cases = 0, mism = 0, elems = 0;
    for (auto &sh : shapes)
        for (nb_dtype dt : dts)
            for (int kind = 0; kind < 4; kind++)
                for (int with_res = 0; with_res < 2; with_res++) {
                    const int n = sh[0], d = sh[1];
                    const bool want32 = kind == 0 || (cases & 1);
                    std::vector<float> x((size_t)n * d), r(x.size());
                    for (int i = 0; i < n; i++) {
                        float scale = i % 3 == 0 ? 1.0f : i % 3 == 1 ? 300.0f : 1e-3f;
                        for (int j = 0; j < d; j++) {
                            x[(size_t)i * d + j] = rnd_normal() * scale;
                            r[(size_t)i * d + j] = rnd_normal() * scale;
                        }
                    }
                    // Weights up to 1e5 in f32 push outputs past f16's range
                    // (the saturating conversion's edge).
                    std::vector<uint8_t> w = make_dtype_buf((size_t)d, dt, false);
                    if (dt == NB_DTYPE_F32)
                        for (int j = 0; j < d; j += 7) nb_store_f32(w.data(), dt, j, rnd_range(-1e5f, 1e5f));
                    std::vector<float> xr(x), ref(x.size());
                    if (with_res) nb_ref_add(xr.data(), x.data(), r.data(), x.size());
                    nb_ref_rmsnorm(ref.data(), xr.data(), w.data(), dt, n, d, 1e-5f);
                    dbuf<float> dx(x), dr(r), dout(x.size());
                    dbuf<uint8_t> dw(w);
                    dbuf<uint16_t> dc(x.size());
                    nb_cuda_cvt c = {nullptr, NB_DTYPE_F16, 0};
                    if (kind > 0) c = {dc.p, kind == 2 ? NB_DTYPE_BF16 : NB_DTYPE_F16, kind == 3};
                    NB_CHECK(nb_cuda_add_rmsnorm(dx.p, with_res ? dr.p : nullptr, dw.p, dt, n, d, 1e-5f,
                                                 want32 ? dout.p : nullptr, c, 0));
                    std::vector<float> gx = dx.down();
                    for (size_t i = 0; i < gx.size(); i++) mism += !same_bits(gx[i], xr[i]);
                    if (want32) {
                        std::vector<float> go = dout.down();
                        for (size_t i = 0; i < go.size(); i++) mism += !same_bits(go[i], ref[i]);
                    }
                    if (kind > 0) {
                        std::vector<uint16_t> gc = dc.down();
                        for (size_t i = 0; i < gc.size(); i++) mism += gc[i] != cvt_ref(ref[i], c.dt, c.sat);
                    }
                    elems += (long)x.size();
                    cases++;
                }
    // Refusals: no output at all, out == x with a residual, sat with bf16.
    dbuf<float> t(64);
    dbuf<uint16_t> w16(8);
    bool refused = nb_cuda_add_rmsnorm(t.p, nullptr, w16.p, NB_DTYPE_F16, 1, 8, 1e-5f, nullptr,
                                       nb_cuda_cvt{nullptr, NB_DTYPE_F16, 0}, 0) == NB_ERR_INVALID_ARG &&
                   nb_cuda_add_rmsnorm(t.p, t.p + 8, w16.p, NB_DTYPE_F16, 1, 8, 1e-5f, t.p,
                                       nb_cuda_cvt{nullptr, NB_DTYPE_F16, 0}, 0) == NB_ERR_INVALID_ARG &&
                   nb_cuda_add_rmsnorm(t.p, nullptr, w16.p, NB_DTYPE_F16, 1, 8, 1e-5f, nullptr,
                                       nb_cuda_cvt{t.p + 16, NB_DTYPE_BF16, 1}, 0) == NB_ERR_INVALID_ARG;
    summary(mism == 0 && refused, "add_rmsnorm", "%ld cases (d 8..8192, f32/f16/bf16 w, residual or not, "
            "f32 / f16 / bf16 / f16-saturating outputs), %ld elems, %ld mismatches, bad args refused: %s; "
            "contract: bit-exact with nb_ref_add + nb_ref_rmsnorm + conversion",
            cases, elems, mism, refused ? "yes" : "NO");
}

static void test_silu_mul_cvt() {
    const int shapes[][2] = {{1, 64}, {5, 1000}, {16, 14336}, {40, 4096}};
    long elems = 0, bad = 0, inexact = 0, cmism = 0;
    int64_t max_ulp = 0;
    int kind = 0;
    for (auto &sh : shapes) {
        const int n = sh[0], I = sh[1], stride = 2 * I;
        std::vector<float> gu((size_t)n * stride);
        for (size_t i = 0; i < gu.size(); i++)
            gu[i] = (i / I) % 2 == 0 ? rnd_range(-30.0f, 30.0f) : rnd_normal() * (kind == 3 ? 3e4f : 3.0f);
        std::vector<float> g((size_t)n * I), u(g.size()), ref(g.size());
        for (int r = 0; r < n; r++)
            for (int i = 0; i < I; i++) {
                g[(size_t)r * I + i] = gu[(size_t)r * stride + i];
                u[(size_t)r * I + i] = gu[(size_t)r * stride + I + i];
            }
        nb_ref_silu_mul(ref.data(), g.data(), u.data(), g.size());
        // The f32 result must also equal nb_cuda_silu_mul's bit for bit.
        dbuf<float> dg(g), du(u), dsep(g.size()), dgu(gu), dout(g.size());
        dbuf<uint16_t> dc(g.size());
        NB_CHECK(nb_cuda_silu_mul(dsep.p, dg.p, du.p, g.size(), 0));
        nb_cuda_cvt c = {dc.p, kind == 1 ? NB_DTYPE_BF16 : NB_DTYPE_F16, kind >= 2};
        NB_CHECK(nb_cuda_silu_mul_cvt(dout.p, c, dgu.p, dgu.p + I, stride, n, I, 0));
        std::vector<float> got = dout.down(), sep = dsep.down();
        std::vector<uint16_t> gc = dc.down();
        // The same rows in the SwiGLU row layout (gate i at column
        // 16 (i/8) + i%8, up 8 further): nb_cuda_silu_mul_cvt_moved must
        // store the same bits.
        std::vector<float> gum(gu.size());
        for (int r = 0; r < n; r++)
            for (int i = 0; i < I; i++) {
                const size_t col = (size_t)(i >> 3) * 16 + (i & 7);
                gum[(size_t)r * stride + col] = gu[(size_t)r * stride + i];
                gum[(size_t)r * stride + col + 8] = gu[(size_t)r * stride + I + i];
            }
        dbuf<float> dgum(gum), doutm(g.size());
        dbuf<uint16_t> dcm(g.size());
        NB_CHECK(nb_cuda_silu_mul_cvt_moved(doutm.p, nb_cuda_cvt{dcm.p, c.dt, c.sat}, dgum.p, n, I, 0));
        std::vector<float> gotm = doutm.down();
        std::vector<uint16_t> gcm = dcm.down();
        for (size_t i = 0; i < got.size(); i++) {
            cmism += !same_bits(gotm[i], got[i]) || gcm[i] != gc[i];
            cmism += !same_bits(got[i], sep[i]) || gc[i] != cvt_ref(got[i], c.dt, c.sat);
            if (!same_bits(got[i], ref[i])) inexact++;
            int64_t dd = ulp_dist(got[i], ref[i]);
            if (dd > max_ulp) max_ulp = dd;
            if (dd > 4) bad++;
        }
        elems += (long)got.size();
        kind = (kind + 1) % 4;
    }
    // Refusals: stride shorter than a row, no output, saturating bf16.
    dbuf<float> t(64);
    const bool refused =
        nb_cuda_silu_mul_cvt(t.p, nb_cuda_cvt{nullptr, NB_DTYPE_F16, 0}, t.p, t.p + 8, 7, 1, 8, 0) ==
            NB_ERR_INVALID_ARG &&
        nb_cuda_silu_mul_cvt(nullptr, nb_cuda_cvt{nullptr, NB_DTYPE_F16, 0}, t.p, t.p + 8, 16, 1, 8, 0) ==
            NB_ERR_INVALID_ARG &&
        nb_cuda_silu_mul_cvt(nullptr, nb_cuda_cvt{t.p, NB_DTYPE_BF16, 1}, t.p, t.p + 8, 16, 1, 8, 0) ==
            NB_ERR_INVALID_ARG &&
        nb_cuda_silu_mul_cvt_moved(t.p, nb_cuda_cvt{nullptr, NB_DTYPE_F16, 0}, t.p, 1, 12, 0) ==
            NB_ERR_INVALID_ARG && // I % 8 != 0
        nb_cuda_silu_mul_cvt_moved(t.p, nb_cuda_cvt{nullptr, NB_DTYPE_F16, 0}, nullptr, 1, 8, 0) ==
            NB_ERR_INVALID_ARG &&
        nb_cuda_silu_mul_cvt_moved(t.p, nb_cuda_cvt{nullptr, NB_DTYPE_F16, 0}, t.p, -1, 8, 0) ==
            NB_ERR_INVALID_ARG &&
        nb_cuda_silu_mul_cvt_moved(nullptr, nb_cuda_cvt{t.p, NB_DTYPE_BF16, 1}, t.p, 1, 8, 0) ==
            NB_ERR_INVALID_ARG;
    if (!refused) cmism++;
    summary(bad == 0 && cmism == 0, "silu_mul_cvt", "%ld elems (strided gate/up rows, f16/bf16/f16-sat "
            "copies; and in the SwiGLU row layout, _moved), %ld differ from nb_cuda_silu_mul or its conversion "
            "(contract: 0); vs nb_ref_silu_mul "
            "%ld not bit-exact, max %lld ulp (tol 4 ulp, as silu_mul)",
            elems, cmism, inexact, (long long)max_ulp);
}

// The fused ops launched right after one another as the engine launches
// them: silu_mul_cvt writes the residual the RMSNorm adds. Both are
// launched with programmatic stream serialization (unless NB_SILU_PDL /
// NB_NORM_PDL = 0), so each block may start before the kernel before it
// ends and must read what that kernel writes only after its wait. 24 chains
// of 512 x 4096; each norm must equal nb_ref_add + nb_ref_rmsnorm on the
// downloaded residual, and each residual nb_cuda_silu_mul's, bit for bit.
static void test_fused_chain() {
    const int n = 512, d = 4096;
    long mism = 0;
    std::vector<float> gu((size_t)n * 2 * d), y((size_t)n * d), g((size_t)n * d), u((size_t)n * d);
    std::vector<uint8_t> w = make_dtype_buf((size_t)d, NB_DTYPE_BF16, false);
    dbuf<uint8_t> dw(w);
    for (int rep = 0; rep < 24; rep++) {
        for (auto &v : gu) v = rnd_range(-8.0f, 8.0f);
        for (auto &v : y) v = rnd_normal();
        for (int r = 0; r < n; r++)
            for (int i = 0; i < d; i++) {
                g[(size_t)r * d + i] = gu[(size_t)r * 2 * d + i];
                u[(size_t)r * d + i] = gu[(size_t)r * 2 * d + d + i];
            }
        dbuf<float> dgu(gu), dy(y), dres((size_t)n * d), dout((size_t)n * d), dg(g), du(u), dsep((size_t)n * d);
        NB_CHECK(nb_cuda_silu_mul(dsep.p, dg.p, du.p, g.size(), 0));
        CUDA_OK(cudaDeviceSynchronize());
        NB_CHECK(nb_cuda_silu_mul_cvt(dres.p, nb_cuda_cvt{nullptr, NB_DTYPE_F16, 0}, dgu.p, dgu.p + d, 2 * d, n, d,
                                      0));
        NB_CHECK(nb_cuda_add_rmsnorm(dy.p, dres.p, dw.p, NB_DTYPE_BF16, n, d, 1e-5f, dout.p,
                                     nb_cuda_cvt{nullptr, NB_DTYPE_F16, 0}, 0));
        std::vector<float> res = dres.down(), sep = dsep.down(), got = dout.down(), xr(y.size()), ref(y.size());
        nb_ref_add(xr.data(), y.data(), sep.data(), y.size());
        nb_ref_rmsnorm(ref.data(), xr.data(), w.data(), NB_DTYPE_BF16, n, d, 1e-5f);
        for (size_t i = 0; i < got.size(); i++) mism += !same_bits(got[i], ref[i]) || !same_bits(res[i], sep[i]);
    }
    summary(mism == 0, "fused_chain", "24 chains silu_mul_cvt -> add_rmsnorm back to back (programmatic launch), "
            "512 x 4096: %ld mismatches (contract: 0)", mism);
}

static void test_rope_write_kv() {
    const nb_dtype dts[] = {NB_DTYPE_F32, NB_DTYPE_F16, NB_DTYPE_BF16};
    const int Ds[] = {8, 64, 128};
    long cases = 0, mism = 0, bad = 0, bytes = 0;
    for (nb_dtype dt : dts)
        for (int D : Ds)
            for (int fused = 0; fused < 2; fused++) {
                const int Hkv = fused ? 8 : 2, Hq = fused ? 32 : 2, n = 21;
                nb_kv_layout lay = {2, Hkv, D, 16, dt, 0, 6};
                const int layer = 1, slots = lay.n_fpblocks * lay.group_size;
                std::vector<int32_t> perm(slots);
                for (int i = 0; i < slots; i++) perm[i] = i;
                for (int i = slots - 1; i > 0; i--) std::swap(perm[i], perm[rnd32() % (i + 1)]);
                std::vector<int32_t> fb(n), sl(n), pos(n);
                for (int i = 0; i < n; i++) {
                    fb[i] = perm[i] / 16, sl[i] = perm[i] % 16;
                    pos[i] = (int32_t)(rnd32() % 131072);
                }
                fb[n - 1] = lay.n_fpblocks; // out of the pool: skipped by both paths
                std::vector<float> inv(D / 2);
                NB_CHECK(nb_ref_rope_inv_freq(inv.data(), D, 500000.0f, NULL));
                const int W = Hq * D + 2 * Hkv * D; // a fused qkv row
                std::vector<float> qkv((size_t)n * W);
                for (auto &v : qkv) v = rnd_normal() * 4.0f;
                std::vector<float> q((size_t)n * Hq * D), k((size_t)n * Hkv * D), v(k.size());
                for (int r = 0; r < n; r++) {
                    memcpy(&q[(size_t)r * Hq * D], &qkv[(size_t)r * W], sizeof(float) * Hq * D);
                    memcpy(&k[(size_t)r * Hkv * D], &qkv[(size_t)r * W + Hq * D], sizeof(float) * Hkv * D);
                    memcpy(&v[(size_t)r * Hkv * D], &qkv[(size_t)r * W + (Hq + Hkv) * D],
                           sizeof(float) * Hkv * D);
                }
                std::vector<uint8_t> pool(nb_kv_fp_bytes(&lay), 0xA5);
                dbuf<uint8_t> dpool_a(pool), dpool_b(pool);
                dbuf<float> dq(q), dk(k), dv(v), dqkv(qkv), dqo(q.size()), dinv(inv);
                dbuf<int32_t> dfb(fb), dsl(sl), dpos(pos);
                // Separate kernels (their C twins are tested above).
                NB_CHECK(nb_cuda_rope_apply(dq.p, dpos.p, n, Hq, D, dinv.p, 0));
                NB_CHECK(nb_cuda_rope_apply(dk.p, dpos.p, n, Hkv, D, dinv.p, 0));
                NB_CHECK(nb_cuda_write_kv(&lay, dpool_a.p, layer, dk.p, dv.p, dfb.p, dsl.p, n, 0));
                // Fused: from the packed qkv rows, or (unfused layout) in place.
                dbuf<float> dq2(q), dk2(k), dv2(v);
                if (fused)
                    NB_CHECK(nb_cuda_rope_write_kv(dqo.p, dqkv.p, W, dqkv.p + Hq * D, dqkv.p + (Hq + Hkv) * D, W,
                                                   dpos.p, n, Hq, dinv.p, &lay, dpool_b.p, layer, dfb.p, dsl.p,
                                                   0));
                else
                    NB_CHECK(nb_cuda_rope_write_kv(dq2.p, dq2.p, Hq * D, dk2.p, dv2.p, Hkv * D, dpos.p, n, Hq,
                                                   dinv.p, &lay, dpool_b.p, layer, dfb.p, dsl.p, 0));
                std::vector<uint8_t> pa = dpool_a.down(), pb = dpool_b.down();
                for (size_t i = 0; i < pa.size(); i++) mism += pa[i] != pb[i];
                std::vector<float> qa = dq.down(), qb = fused ? dqo.down() : dq2.down();
                for (size_t i = 0; i < qa.size(); i++) mism += !same_bits(qa[i], qb[i]);
                // q against the C twin, rope's tolerance.
                std::vector<float> qr(q);
                nb_ref_rope_apply(qr.data(), pos.data(), n, Hq, D, inv.data());
                const int h = D / 2;
                for (size_t e = 0; e < qb.size(); e++) {
                    size_t base = e / D * D;
                    int i = (int)(e % D) % h;
                    double mag = fabs(q[base + i]) + fabs(q[base + i + h]);
                    if (fabs((double)qb[e] - (double)qr[e]) > ldexp(mag, -22)) bad++;
                }
                bytes += (long)pa.size();
                cases++;
            }
    // Refusals: in place with a stride wider than q's rows, a short kv
    // stride, a layer outside the layout.
    {
        nb_kv_layout lay = {2, 2, 64, 16, NB_DTYPE_F16, 0, 2};
        dbuf<float> t(4096), dinv(32);
        dbuf<int32_t> di(4);
        dbuf<uint8_t> pool(nb_kv_fp_bytes(&lay));
        const bool r1 = nb_cuda_rope_write_kv(t.p, t.p, 4 * 64 + 1, t.p, t.p, 128, di.p, 1, 4, dinv.p, &lay, pool.p,
                                              0, di.p, di.p, 0) == NB_ERR_INVALID_ARG;
        const bool r2 = nb_cuda_rope_write_kv(t.p, t.p, 256, t.p, t.p, 127, di.p, 1, 4, dinv.p, &lay, pool.p, 0,
                                              di.p, di.p, 0) == NB_ERR_INVALID_ARG;
        const bool r3 = nb_cuda_rope_write_kv(t.p, t.p, 256, t.p, t.p, 128, di.p, 1, 4, dinv.p, &lay, pool.p, 2,
                                              di.p, di.p, 0) == NB_ERR_INVALID_ARG;
        if (!(r1 && r2 && r3)) mism++;
    }
    summary(mism == 0 && bad == 0, "rope_write_kv", "%ld cases (D 8/64/128, f32/f16/bf16 cache, packed qkv "
            "rows and separate in-place q, a row outside the pool; bad args refused), %ld bytes/q values or refusals differ from "
            "rope_apply + write_kv (contract: 0), %ld q values outside rope's tolerance vs nb_ref_rope_apply",
            cases, mism, bad);
}

// ------------------------------------------------------------ convert
static void test_convert() {
    long mism = 0, total = 0;
    // f32 -> f16 / bf16: random bit patterns and the rounding edges.
    const size_t n = 1 << 20;
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) {
        uint32_t b = rnd32();
        if (i % 4 == 0) b = (b & 0x80000000u) | (0x33000000u + (b % 0x14000000u)); // f16 range
        if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu)) b |= 0x400000u;   // quiet NaN
        memcpy(&f[i], &b, 4);
    }
    const float edges[] = {65519.0f, 65520.0f, 0x1p-25f, 0x1.8p-24f, 0x1p-24f, 0x1.000002p-25f,
                           -0.0f, INFINITY, NAN};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) f[i] = edges[i];
    dbuf<float> df(f);
    dbuf<uint16_t> dh(n);
    for (nb_dtype dt : {NB_DTYPE_F16, NB_DTYPE_BF16}) {
        NB_CHECK(nb_cuda_convert(dh.p, dt, df.p, NB_DTYPE_F32, n, 0));
        std::vector<uint16_t> got = dh.down();
        for (size_t i = 0; i < n; i++)
            mism += got[i] != (dt == NB_DTYPE_F16 ? nb_f32_to_f16(f[i]) : nb_f32_to_bf16(f[i]));
        total += (long)n;
    }
    // f32 -> f16 saturating (nb_f32_to_f16_sat), the same inputs plus the
    // overflow edges.
    {
        const float sat_edges[] = {65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e30f, -3.4e38f,
                                   -INFINITY, INFINITY, NAN};
        std::vector<float> fs(f);
        for (size_t i = 0; i < sizeof sat_edges / sizeof sat_edges[0]; i++) fs[16 + i] = sat_edges[i];
        dbuf<float> dfs(fs);
        NB_CHECK(nb_cuda_convert_f16_sat(dh.p, dfs.p, n, 0));
        std::vector<uint16_t> got = dh.down();
        for (size_t i = 0; i < n; i++) mism += got[i] != nb_f32_to_f16_sat(fs[i]);
        total += (long)n;
        // The twin itself at the edges: +-65504 past the range, Inf and NaN kept.
        mism += nb_f32_to_f16_sat(65520.0f) != 0x7bffu;
        mism += nb_f32_to_f16_sat(-1e30f) != 0xfbffu;
        mism += nb_f32_to_f16_sat(INFINITY) != 0x7c00u;
        mism += (nb_f32_to_f16_sat(NAN) & 0x7c00u) != 0x7c00u || !(nb_f32_to_f16_sat(NAN) & 0x3ffu);
        mism += nb_f32_to_f16_sat(65519.0f) != nb_f32_to_f16(65519.0f);
    }
    // f16 / bf16 -> f32 and -> each other: all 65536 patterns.
    std::vector<uint16_t> all(65536);
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    dbuf<uint16_t> dall(all), d16(65536);
    dbuf<float> d32(65536);
    for (nb_dtype dt : {NB_DTYPE_F16, NB_DTYPE_BF16}) {
        NB_CHECK(nb_cuda_convert(d32.p, NB_DTYPE_F32, dall.p, dt, 65536, 0));
        std::vector<float> got = d32.down();
        for (int i = 0; i < 65536; i++) {
            float r = dt == NB_DTYPE_F16 ? nb_f16_to_f32((uint16_t)i) : nb_bf16_to_f32((uint16_t)i);
            mism += !same_bits(got[i], r);
        }
        nb_dtype other = dt == NB_DTYPE_F16 ? NB_DTYPE_BF16 : NB_DTYPE_F16;
        NB_CHECK(nb_cuda_convert(d16.p, other, dall.p, dt, 65536, 0));
        std::vector<uint16_t> g16 = d16.down();
        for (int i = 0; i < 65536; i++) {
            float r = nb_load_f32(&all[i], dt, 0);
            uint16_t e = other == NB_DTYPE_F16 ? nb_f32_to_f16(r) : nb_f32_to_bf16(r);
            mism += g16[i] != e;
        }
        total += 2 * 65536;
    }
    summary(mism == 0, "convert", "%ld conversions (f32->f16/bf16 and f16 saturating random bits + "
            "edges, all 65536 f16/bf16 patterns -> f32 and across), %ld mismatches; contract: bit-exact",
            total, mism);
}

// ------------------------------------------------------------ philox
static void test_philox() {
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    const int n = 1 << 20;
    std::vector<uint32_t> ctr(4 * (size_t)n), key(2 * (size_t)n);
    for (auto &x : ctr) x = rnd32();
    for (auto &x : key) x = rnd32();
    for (int t = 0; t < 3; t++) {
        memcpy(&ctr[4 * t], kat[t], 16);
        memcpy(&key[2 * t], kat[t] + 4, 8);
    }
    dbuf<uint32_t> dctr(ctr), dkey(key), dout(4 * (size_t)n);
    NB_CHECK(nb_cuda_philox4x32_10(dout.p, dctr.p, dkey.p, n, 0));
    std::vector<uint32_t> got = dout.down();
    int kat_bad = 0;
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 4; i++) kat_bad += got[4 * t + i] != kat[t][6 + i];
    long mism = 0;
    for (int i = 0; i < n; i++) {
        uint32_t r[4];
        nb_philox4x32_10(r, &ctr[4 * (size_t)i], &key[2 * (size_t)i]);
        mism += memcmp(r, &got[4 * (size_t)i], 16) != 0;
    }
    // Uniforms for the three streams.
    std::vector<uint64_t> seed(n), cnt(n);
    for (int i = 0; i < n; i++) {
        seed[i] = i < 16 ? (uint64_t)i : rnd64();
        cnt[i] = i % 3 == 0 ? (uint64_t)i : rnd64();
    }
    dbuf<uint64_t> dseed(seed), dcnt(cnt);
    dbuf<float> du(n);
    long umism = 0;
    for (uint32_t st = 0; st < 3; st++) {
        NB_CHECK(nb_cuda_rng_uniform(du.p, dseed.p, dcnt.p, st, n, 0));
        std::vector<float> u = du.down();
        for (int i = 0; i < n; i++) umism += !same_bits(u[i], nb_rng_uniform(seed[i], cnt[i], st));
    }
    summary(kat_bad == 0 && mism == 0 && umism == 0, "philox",
            "Random123 KATs on device: %d words wrong; %d random (ctr,key): %ld mismatches; "
            "%d x 3 streams of uniforms: %ld mismatches; contract: bit-exact",
            kat_bad, n, mism, n, umism);
}

// ------------------------------------------------------------ logits
// Row kinds that exercise the selection: smooth, peaked, integer ties, -inf.
static void make_logits(float *row, int V, int kind) {
    switch (kind % 5) {
    case 0:
        for (int i = 0; i < V; i++) row[i] = rnd_normal() * 2.0f;
        break;
    case 1: // peaked: a few large logits
        for (int i = 0; i < V; i++) row[i] = rnd_normal();
        for (int j = 0; j < 8; j++) row[rnd32() % V] = 8.0f + 4.0f * rnd_unit();
        break;
    case 2: // many exact ties
        for (int i = 0; i < V; i++) row[i] = (float)(int)(rnd32() % 7) - 3.0f;
        break;
    case 3: // masked vocabulary
        for (int i = 0; i < V; i++) row[i] = (rnd32() % 4 == 0) ? -INFINITY : rnd_normal() * 3.0f;
        break;
    default: // flat-ish, wide
        for (int i = 0; i < V; i++) row[i] = rnd_normal() * 0.3f;
        break;
    }
}

static nb_sampling_params make_params(int j, int V) {
    static const float Ts[] = {0.0f, 0.6f, 1.0f, 1.3f};
    static const float Ps[] = {1.0f, 0.95f, 0.8f, 0.3f, 1e-6f};
    const int Ks[] = {0, 1, 2, 40, 1000, V, V + 5};
    nb_sampling_params sp;
    sp.temperature = Ts[j % 4];
    sp.top_k = Ks[(j / 4) % 7];
    sp.top_p = Ps[(j / 28) % 5];
    sp.seed = rnd64();
    return sp;
}

// ------------------------------------------------------------ argmax
static void test_argmax() {
    const int Vs[] = {512, 16000, 128256};
    long rows = 0, mism = 0;
    for (int V : Vs) {
        const int n = 24;
        std::vector<float> x((size_t)n * V);
        for (int r = 0; r < n; r++) {
            float *row = &x[(size_t)r * V];
            make_logits(row, V, r);
            if (r % 6 == 5)
                for (int i = 0; i < V; i += 3) row[i] = NAN;
            if (r == 7) row[V - 1] = INFINITY;
            if (r == 8) row[V / 2] = -0.0f, row[V / 3] = 0.0f;
            if (r == 8)
                for (int i = 0; i < V; i++) if (i != V / 2 && i != V / 3) row[i] = -1.0f;
            if (r == 9)
                for (int i = 0; i < V; i++) row[i] = NAN;
            if (r == 10)
                for (int i = 0; i < V; i++) row[i] = i % 2 ? NAN : -INFINITY;
        }
        dbuf<float> dx(x);
        dbuf<int32_t> dout(n);
        NB_CHECK(nb_cuda_argmax(dout.p, dx.p, n, V, 0));
        std::vector<int32_t> got = dout.down();
        for (int r = 0; r < n; r++) mism += got[r] != nb_ref_argmax(&x[(size_t)r * V], V);
        rows += n;
    }
    summary(mism == 0, "argmax", "%ld rows (V 512/16000/128256; ties, NaN, all-NaN, +-0, inf), "
            "%ld disagreements; contract: exact", rows, mism);
}

// ------------------------------------------------------------ probs + sample
static void test_probs_sample() {
    const int Vs[] = {512, 16000, 128256};
    const int Ns[] = {2048, 512, 140};
    long rows = 0, status_bad = 0, set_diff = 0, val_bad = 0, rows_exact = 0;
    int64_t max_ulp = 0;
    long greedy_n = 0, greedy_dis = 0, samp_n = 0, samp_dis = 0, cdf_dis = 0;
    long gather_rows = 0, gather_diff = 0;
    for (int vi = 0; vi < 3; vi++) {
        const int V = Vs[vi], n = Ns[vi];
        std::vector<float> lg((size_t)n * V);
        std::vector<nb_sampling_params> sp(n);
        std::vector<uint64_t> seed(n), cnt(n);
        for (int r = 0; r < n; r++) {
            make_logits(&lg[(size_t)r * V], V, r / 7 + r);
            sp[r] = make_params(r, V);
            seed[r] = sp[r].seed;
            cnt[r] = rnd64() >> (rnd32() % 64);
        }
        // Error rows: bad parameters and non-finite logits.
        sp[3].top_p = 0.0f;
        sp[5].temperature = -1.0f;
        sp[6].top_k = -2;
        lg[(size_t)9 * V + V / 2] = NAN;
        lg[(size_t)10 * V + 1] = INFINITY;
        for (int i = 0; i < V; i++) lg[(size_t)11 * V + i] = -INFINITY;

        std::vector<float> ref((size_t)n * V), work(V);
        std::vector<int> ref_st(n);
        std::vector<int32_t> ref_tok(n, -2);
        for (int r = 0; r < n; r++) {
            ref_st[r] = nb_ref_probs(&ref[(size_t)r * V], &lg[(size_t)r * V], V, &sp[r], work.data());
            if (ref_st[r] == NB_OK)
                ref_tok[r] = nb_ref_sample(&ref[(size_t)r * V], V, nb_rng_uniform(seed[r], cnt[r], 0));
        }
        dbuf<float> dlg(lg), dpr((size_t)n * V), dref(ref);
        dbuf<nb_sampling_params> dsp(sp);
        dbuf<int32_t> dst(n), dtok(n), dtok2(n);
        dbuf<uint64_t> dseed(seed), dcnt(cnt);
        NB_CHECK(nb_cuda_probs(dpr.p, dlg.p, n, V, dsp.p, dst.p, 0));
        NB_CHECK(nb_cuda_sample(dtok.p, dpr.p, n, V, dseed.p, dcnt.p, 0, 0));
        // The same sampler on the reference probabilities isolates the CDF.
        NB_CHECK(nb_cuda_sample(dtok2.p, dref.p, n, V, dseed.p, dcnt.p, 0, 0));
        std::vector<float> got = dpr.down();
        std::vector<int32_t> st = dst.down(), tok = dtok.down(), tok2 = dtok2.down();
        // Gathered rows (the engine's use): row r read from logits row
        // perm[r] of a copy, written to row perm2[r] of a larger buffer, and
        // in place; each must give the identity call's bits.
        {
            std::vector<int32_t> perm(n), perm2(n);
            for (int r = 0; r < n; r++) perm[r] = perm2[r] = r;
            for (int r = n - 1; r > 0; r--) {
                std::swap(perm[r], perm[rnd32() % (r + 1)]);
                std::swap(perm2[r], perm2[rnd32() % (r + 1)]);
            }
            std::vector<float> lgp((size_t)n * V);
            for (int r = 0; r < n; r++)
                memcpy(&lgp[(size_t)perm[r] * V], &lg[(size_t)r * V], (size_t)V * sizeof(float));
            for (int r = 0; r < n; r++) perm2[r] += n / 3; // rows n/3.. of a buffer of n + n/3
            std::vector<float> poison((size_t)(n + n / 3) * V, NAN);
            dbuf<float> dlgp(lgp), dout(poison), dinpl(lgp);
            dbuf<int32_t> dperm(perm), dperm2(perm2), dst2(n), dtok3(n), dst3(n);
            NB_CHECK(nb_cuda_probs_rows(dout.p, dperm2.p, dlgp.p, dperm.p, n, V, dsp.p, dst2.p, 0));
            NB_CHECK(nb_cuda_sample_rows(dtok3.p, dout.p, dperm2.p, n, V, dseed.p, dcnt.p, 0, 0));
            NB_CHECK(nb_cuda_probs_rows(dinpl.p, dperm.p, dinpl.p, dperm.p, n, V, dsp.p, dst3.p, 0));
            std::vector<float> g2 = dout.down(), g3 = dinpl.down();
            std::vector<int32_t> st2 = dst2.down(), tok3 = dtok3.down(), st3 = dst3.down();
            long gdiff = 0;
            for (int r = 0; r < n; r++) {
                gdiff += st2[r] != st[r] || st3[r] != st[r];
                if (st[r] != NB_OK) continue;
                gdiff += tok3[r] != tok[r];
                gdiff += memcmp(&g2[(size_t)perm2[r] * V], &got[(size_t)r * V], (size_t)V * 4) != 0;
                gdiff += memcmp(&g3[(size_t)perm[r] * V], &got[(size_t)r * V], (size_t)V * 4) != 0;
            }
            gather_rows += n;
            gather_diff += gdiff;
        }
        for (int r = 0; r < n; r++) {
            rows++;
            if (st[r] != ref_st[r]) {
                status_bad++;
                fprintf(stderr, "probs V=%d row %d: status %d, reference %d\n", V, r, st[r], ref_st[r]);
                continue;
            }
            if (ref_st[r] != NB_OK) continue;
            const float *g = &got[(size_t)r * V], *e = &ref[(size_t)r * V];
            bool same_set = true, exact = true;
            for (int i = 0; i < V; i++) same_set &= (g[i] > 0.0f) == (e[i] > 0.0f);
            // NOTE: a differing kept set renormalises every value; only rows
            // with the same set are compared value by value.
            for (int i = 0; same_set && i < V; i++) {
                if (!same_bits(g[i], e[i])) exact = false;
                int64_t u = ulp_dist(g[i], e[i]);
                if (u > max_ulp) max_ulp = u;
                if (u > 4) val_bad++;
            }
            set_diff += !same_set;
            rows_exact += same_set && exact;
            if (!same_set)
                fprintf(stderr, "probs V=%d row %d (T=%g k=%d p=%g): kept sets differ\n", V, r,
                        sp[r].temperature, sp[r].top_k, sp[r].top_p);
            if (sp[r].temperature == 0.0f) {
                greedy_n++;
                greedy_dis += tok[r] != ref_tok[r];
            } else {
                samp_n++;
                samp_dis += tok[r] != ref_tok[r];
            }
            cdf_dis += tok2[r] != ref_tok[r];
        }
    }
    const long allowed_rows = rows / 1000;
    summary(status_bad == 0 && val_bad == 0 && set_diff <= allowed_rows, "probs",
            "%ld rows (V 512/16000/128256; T 0/0.6/1/1.3 x top_k x top_p; ties, -inf, errors): "
            "%ld status mismatches, %ld kept-set differences (allowed %ld), %ld bit-exact rows, "
            "max %lld ulp (tol 4), %ld values over tol", rows, status_bad, set_diff, allowed_rows,
            rows_exact, (long long)max_ulp, val_bad);
    summary(greedy_dis == 0, "sample greedy", "%ld rows, %ld token disagreements (must be 0)",
            greedy_n, greedy_dis);
    summary(samp_dis <= samp_n / 1000, "sample", "%ld seeds, %ld token disagreements GPU chain vs "
            "CPU chain (allowed 0.1%%: %ld), %ld when sampling the CPU's probs", samp_n, samp_dis,
            samp_n / 1000, cdf_dis);
    if (cdf_dis > samp_n / 1000) summary(false, "sample cdf", "%ld disagreements", cdf_dis);
    summary(gather_diff == 0, "probs/sample rows", "%ld rows gathered (permuted, offset, in "
            "place): %ld differences from the identity calls (must be 0: same bits)", gather_rows,
            gather_diff);
}

// ------------------------------------------------------------ acceptance
static void test_spec_accept() {
    const int Vs[] = {512, 16000, 128256};
    const int Ns[] = {384, 96, 24};
    const int G = 6; // gamma_max
    long seqs = 0, dis = 0, st_bad = 0, gseqs = 0, gdis = 0, accepted = 0, errs = 0;
    long gather_seqs = 0, gather_dis = 0;
    for (int vi = 0; vi < 3; vi++) {
        const int V = Vs[vi], n = Ns[vi];
        std::vector<float> p((size_t)n * (G + 1) * V), q((size_t)n * G * V), lg(V), lq(V), work(V);
        std::vector<int32_t> gam(n), draft((size_t)n * G), targ((size_t)n * (G + 1));
        std::vector<uint64_t> seed(n), c0(n);
        for (int s = 0; s < n; s++) {
            gam[s] = s % 8 == 7 ? 0 : (int32_t)(rnd32() % (G + 1));
            seed[s] = rnd64();
            c0[s] = rnd64() >> 20;
            nb_sampling_params tp = {s % 3 == 0 ? 0.7f : 1.0f, s % 4 == 1 ? 50 : 0,
                                     s % 5 == 2 ? 0.9f : 1.0f, seed[s]};
            nb_sampling_params dp = {1.0f, s % 4 == 1 ? 20 : 0, 1.0f, seed[s]};
            for (int i = 0; i <= G; i++) {
                make_logits(lg.data(), V, s + i);
                for (int j = 0; j < V; j++) lq[j] = isinf(lg[j]) ? lg[j] : lg[j] + 0.5f * rnd_normal();
                float *pi = &p[((size_t)s * (G + 1) + i) * V];
                NB_CHECK(nb_ref_probs(pi, lg.data(), V, &tp, work.data()));
                targ[(size_t)s * (G + 1) + i] = nb_ref_argmax(pi, V);
                if (i == G) break;
                float *qi = &q[((size_t)s * G + i) * V];
                NB_CHECK(nb_ref_probs(qi, lq.data(), V, &dp, work.data()));
                int32_t d = nb_ref_sample(qi, V, nb_rng_uniform(seed[s], c0[s] + i, 0));
                if (s % 6 == 4 && i == 1) d = (int32_t)(rnd32() % V); // maybe q[d] == 0 / p[d] == 0
                if (s % 9 == 3 && i == 0) d = targ[(size_t)s * (G + 1) + i];
                draft[(size_t)s * G + i] = d;
            }
        }
        // Error sequences: an invalid draft id, and an all-zero target row.
        if (n > 20) {
            gam[13] = G;
            draft[(size_t)13 * G + 2] = V;
            gam[17] = 2;
            for (int j = 0; j < V; j++) p[((size_t)17 * (G + 1)) * V + j] = 0.0f;
        }
        std::vector<int32_t> ref_out((size_t)n * (G + 1), -7), ref_n(n);
        for (int s = 0; s < n; s++) {
            int na = 0;
            nb_status st = nb_ref_spec_accept(gam[s], V, &p[(size_t)s * (G + 1) * V],
                                              &q[(size_t)s * G * V], &draft[(size_t)s * G], seed[s],
                                              c0[s], &ref_out[(size_t)s * (G + 1)], &na, work.data());
            ref_n[s] = st == NB_OK ? na : (int32_t)st;
        }
        dbuf<float> dp(p), dq(q);
        dbuf<int32_t> dgam(gam), ddraft(draft), dout((size_t)n * (G + 1)), dn(n);
        dbuf<uint64_t> dseed(seed), dc0(c0);
        NB_CHECK(nb_cuda_spec_accept(n, G, V, dgam.p, dp.p, dq.p, ddraft.p, dseed.p, dc0.p,
                                     dout.p, dn.p, 0));
        std::vector<int32_t> out = dout.down(), na = dn.down();
        {
            // Gathered: sequence s's p rows start at row p_row0[s] and its q
            // rows at q_row0[s] of shuffled buffers; the same results.
            std::vector<int32_t> order(n), prow(n), qrow(n);
            for (int s = 0; s < n; s++) order[s] = s;
            for (int s = n - 1; s > 0; s--) std::swap(order[s], order[rnd32() % (s + 1)]);
            std::vector<float> pg((size_t)(n * (G + 1) + 3) * V, NAN), qg((size_t)(n * G + 5) * V, NAN);
            for (int j = 0; j < n; j++) {
                int s = order[j];
                prow[s] = 3 + j * (G + 1);
                qrow[s] = 5 + j * G;
                memcpy(&pg[(size_t)prow[s] * V], &p[(size_t)s * (G + 1) * V], (size_t)(G + 1) * V * 4);
                memcpy(&qg[(size_t)qrow[s] * V], &q[(size_t)s * G * V], (size_t)G * V * 4);
            }
            dbuf<float> dpg(pg), dqg(qg);
            dbuf<int32_t> dprow(prow), dqrow(qrow), dout2((size_t)n * (G + 1)), dn2(n);
            std::vector<int32_t> init((size_t)n * (G + 1), -7);
            CUDA_OK(cudaMemcpy(dout2.p, init.data(), init.size() * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(dout.p, init.data(), init.size() * 4, cudaMemcpyHostToDevice));
            NB_CHECK(nb_cuda_spec_accept(n, G, V, dgam.p, dp.p, dq.p, ddraft.p, dseed.p, dc0.p,
                                         dout.p, dn.p, 0));
            NB_CHECK(nb_cuda_spec_accept_rows(n, G, V, dgam.p, dpg.p, dprow.p, dqg.p, dqrow.p,
                                              ddraft.p, dseed.p, dc0.p, dout2.p, dn2.p, 0));
            out = dout.down();
            std::vector<int32_t> out2 = dout2.down(), na2 = dn2.down();
            for (int s = 0; s < n; s++) {
                gather_seqs++;
                bool same = na2[s] == na[s];
                for (int i = 0; same && na[s] >= 0 && i <= na[s]; i++)
                    same = out2[(size_t)s * (G + 1) + i] == out[(size_t)s * (G + 1) + i];
                gather_dis += !same;
            }
        }
        for (int s = 0; s < n; s++) {
            seqs++;
            if (na[s] != ref_n[s]) {
                if (na[s] < 0 || ref_n[s] < 0) st_bad++;
                else dis++;
                fprintf(stderr, "spec_accept V=%d seq %d: n_accepted %d, reference %d\n", V, s,
                        na[s], ref_n[s]);
                continue;
            }
            if (na[s] < 0) {
                errs++;
                continue;
            }
            accepted += na[s];
            bool same = true;
            for (int i = 0; i <= na[s]; i++)
                same &= out[(size_t)s * (G + 1) + i] == ref_out[(size_t)s * (G + 1) + i];
            dis += !same;
        }

        // Greedy acceptance: drafts equal to the target argmax for a random prefix.
        std::vector<int32_t> gdraft((size_t)n * G);
        for (int s = 0; s < n; s++) {
            int agree = (int)(rnd32() % (G + 2));
            for (int i = 0; i < G; i++) {
                int32_t t = targ[(size_t)s * (G + 1) + i];
                gdraft[(size_t)s * G + i] = i < agree ? t : (t + 1 + (int32_t)(rnd32() % 3)) % V;
            }
        }
        std::vector<int32_t> gref((size_t)n * (G + 1), -7), gref_n(n);
        for (int s = 0; s < n; s++) {
            int a = 0;
            nb_ref_spec_accept_greedy(gam[s], &gdraft[(size_t)s * G], &targ[(size_t)s * (G + 1)],
                                      &gref[(size_t)s * (G + 1)], &a);
            gref_n[s] = a;
        }
        dbuf<int32_t> dgd(gdraft), dtarg(targ);
        NB_CHECK(nb_cuda_spec_accept_greedy(n, G, dgam.p, dgd.p, dtarg.p, dout.p, dn.p, 0));
        out = dout.down();
        na = dn.down();
        for (int s = 0; s < n; s++) {
            gseqs++;
            bool same = na[s] == gref_n[s];
            for (int i = 0; same && i <= na[s]; i++)
                same &= out[(size_t)s * (G + 1) + i] == gref[(size_t)s * (G + 1) + i];
            gdis += !same;
        }
    }
    summary(st_bad == 0 && dis <= seqs / 1000, "spec_accept", "%ld sequences (gamma 0..%d, V "
            "512/16000/128256), %ld drafts accepted, %ld error sequences matched, %ld status "
            "mismatches, %ld token disagreements (allowed 0.1%%: %ld)", seqs, G, accepted, errs,
            st_bad, dis, seqs / 1000);
    summary(gdis == 0, "spec_accept_greedy", "%ld sequences, %ld disagreements (must be 0)", gseqs,
            gdis);
    summary(gather_dis == 0, "spec_accept rows", "%ld sequences with gathered p/q rows, %ld "
            "differences from the strided call (must be 0)", gather_seqs, gather_dis);
}

// ------------------------------------------------------------ timings
// Figures for the log only; never a failure.
static void report_timings() {
    cudaEvent_t a, b;
    CUDA_OK(cudaEventCreate(&a));
    CUDA_OK(cudaEventCreate(&b));
    float ms;
    {
        const int n = 64, d = 4096;
        std::vector<float> x((size_t)n * d, 0.5f);
        std::vector<float> w(d, 1.0f);
        dbuf<float> dx(x), dw(w), dout(x.size());
        NB_CHECK(nb_cuda_rmsnorm(dout.p, dx.p, dw.p, NB_DTYPE_F32, n, d, 1e-5f, 0));
        CUDA_OK(cudaEventRecord(a));
        for (int i = 0; i < 20; i++) NB_CHECK(nb_cuda_rmsnorm(dout.p, dx.p, dw.p, NB_DTYPE_F32, n, d, 1e-5f, 0));
        CUDA_OK(cudaEventRecord(b));
        CUDA_OK(cudaEventSynchronize(b));
        CUDA_OK(cudaEventElapsedTime(&ms, a, b));
        printf("info  rmsnorm 64 x 4096: %.1f us\n", 1000.0 * ms / 20);
    }
    {
        const int n = 32, V = 128256;
        std::vector<float> lg((size_t)n * V);
        for (int r = 0; r < n; r++) make_logits(&lg[(size_t)r * V], V, r);
        std::vector<nb_sampling_params> sp(n, nb_sampling_params{0.8f, 50, 0.9f, 1});
        std::vector<uint64_t> sd(n, 1), ct(n, 2);
        dbuf<float> dlg(lg), dpr(lg.size());
        dbuf<nb_sampling_params> dsp(sp);
        dbuf<int32_t> dst(n), dtok(n);
        dbuf<uint64_t> dsd(sd), dct(ct);
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 1)
                for (auto &s : sp) s.top_k = 0, s.top_p = 1.0f;
            dsp.up(sp);
            NB_CHECK(nb_cuda_probs(dpr.p, dlg.p, n, V, dsp.p, dst.p, 0));
            CUDA_OK(cudaEventRecord(a));
            for (int i = 0; i < 10; i++) NB_CHECK(nb_cuda_probs(dpr.p, dlg.p, n, V, dsp.p, dst.p, 0));
            CUDA_OK(cudaEventRecord(b));
            CUDA_OK(cudaEventSynchronize(b));
            CUDA_OK(cudaEventElapsedTime(&ms, a, b));
            printf("info  probs 32 x 128256 (%s): %.1f us\n",
                   pass == 0 ? "T 0.8, top_k 50, top_p 0.9" : "T 0.8 only", 1000.0 * ms / 10);
        }
        CUDA_OK(cudaEventRecord(a));
        for (int i = 0; i < 10; i++) NB_CHECK(nb_cuda_sample(dtok.p, dpr.p, n, V, dsd.p, dct.p, 0, 0));
        CUDA_OK(cudaEventRecord(b));
        CUDA_OK(cudaEventSynchronize(b));
        CUDA_OK(cudaEventElapsedTime(&ms, a, b));
        printf("info  sample 32 x 128256: %.1f us\n", 1000.0 * ms / 10);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
}

int main() {
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("test_ops_cuda: no CUDA device (%s): skipped\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    printf("test_ops_cuda on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    test_rmsnorm();
    test_rope();
    test_silu_add();
    test_embed();
    test_write_kv();
    test_add_rmsnorm();
    test_silu_mul_cvt();
    test_fused_chain();
    test_rope_write_kv();
    test_convert();
    test_philox();
    test_argmax();
    test_probs_sample();
    test_spec_accept();
    sync();
    report_timings();
    printf("test_ops_cuda: %s (%d failed)\n", g_failed ? "FAIL" : "PASS", g_failed);
    return g_failed ? 1 : 0;
}
