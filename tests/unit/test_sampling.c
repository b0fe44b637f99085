// test_sampling.c: Philox known answers, target-distribution semantics,
// determinism, and a chi-square test that speculative rejection sampling
// emits exactly the target distribution (and that the test can fail).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "nb_test.h"
#include "sampling.h"

// Chi-square test threshold: reject "distribution == p" when the p-value of
// the statistic (V-1 degrees of freedom) is below this.
#define CHI2_ALPHA 1e-3

// Upper tail Q(x; df) of the chi-square distribution for integer df, from the
// closed forms: even df = 2m: e^{-x/2} sum_{j<m} (x/2)^j / j!; odd df = 2m+1:
// erfc(sqrt(x/2)) + sqrt(2x/pi) e^{-x/2} sum_{j=1..m} x^{j-1} / (1*3*...*(2j-1)).
static double chi2_sf(double x, int df) {
    if (x <= 0) return 1.0;
    if (df % 2 == 0) {
        double term = 1.0, sum = 1.0;
        for (int j = 1; j < df / 2; j++) {
            term *= (x / 2) / j;
            sum += term;
        }
        return exp(-x / 2) * sum;
    }
    double sum = 0.0, term = 1.0;
    for (int j = 1; j <= df / 2; j++) {
        term = j == 1 ? 1.0 : term * x / (2 * j - 1);
        sum += term;
    }
    return erfc(sqrt(x / 2)) + sqrt(2 * x / M_PI) * exp(-x / 2) * sum;
}

static void test_chi2_sf(void) {
    // Tabulated critical values at alpha = 0.001.
    CHECKF(fabs(chi2_sf(20.515, 5) - 1e-3) < 2e-6, "%g", chi2_sf(20.515, 5));
    CHECKF(fabs(chi2_sf(18.467, 4) - 1e-3) < 2e-6, "%g", chi2_sf(18.467, 4));
    CHECKF(fabs(chi2_sf(10.828, 1) - 1e-3) < 2e-6, "%g", chi2_sf(10.828, 1));
    CHECK(fabs(chi2_sf(2.0, 2) - exp(-1.0)) < 1e-12);
}

static void test_philox_kat(void) {
    // Random123 kat_vectors, philox4x32 10 rounds.
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        nb_philox4x32_10(out, kat[t], kat[t] + 4);
        for (int i = 0; i < 4; i++)
            CHECKF(out[i] == kat[t][6 + i], "kat %d word %d: %08x != %08x", t, i, out[i],
                   kat[t][6 + i]);
    }
    // nb_rng_uniform is word 0 of the counter {lo, hi, stream, 0}, key {lo, hi}.
    uint64_t seed = 0x299f31d0a4093822ull, ctr = 0x85a308d3243f6a88ull;
    uint32_t c[4] = {0x243f6a88, 0x85a308d3, 7, 0}, k[2] = {0xa4093822, 0x299f31d0}, o[4];
    nb_philox4x32_10(o, c, k);
    float u = nb_rng_uniform(seed, ctr, 7);
    CHECK(u == (float)(o[0] >> 8) * 0x1p-24f);
    CHECK(nb_rng_uniform(0, 0, 0) == (float)(0x6627e8d5u >> 8) / 16777216.0f);
    // Range and a crude mean.
    double mean = 0;
    int ok = 1;
    for (int i = 0; i < 100000; i++) {
        float v = nb_rng_uniform(12345, (uint64_t)i, 0);
        ok &= v >= 0.0f && v < 1.0f;
        mean += v;
    }
    CHECK(ok);
    CHECKF(fabs(mean / 100000 - 0.5) < 0.005, "mean %g", mean / 100000);
    CHECK(nb_rng_uniform(1, 5, 0) != nb_rng_uniform(1, 5, 1));
    CHECK(nb_rng_uniform(1, 5, 0) != nb_rng_uniform(2, 5, 0));
    CHECK(nb_rng_uniform(1, 5, 0) != nb_rng_uniform(1, 6, 0));
}

static void test_probs(void) {
    float work[16], pr[16];
    nb_sampling_params sp = {0.0f, 0, 1.0f, 0};
    // Greedy: one-hot at the first maximum.
    float lg[6] = {1.0f, 3.0f, -INFINITY, 3.0f, 2.0f, 0.0f};
    CHECK(nb_ref_probs(pr, lg, 6, &sp, work) == NB_OK);
    for (int i = 0; i < 6; i++) CHECK(pr[i] == (i == 1 ? 1.0f : 0.0f));

    // Temperature 1, no filtering: softmax, -inf -> 0.
    sp.temperature = 1.0f;
    CHECK(nb_ref_probs(pr, lg, 6, &sp, work) == NB_OK);
    double z = exp(1) + 2 * exp(3) + exp(2) + 1;
    CHECK(fabs(pr[0] - exp(1) / z) < 1e-6 && pr[2] == 0.0f && pr[1] == pr[3]);
    // Temperature 2 flattens: equals softmax(l / 2).
    sp.temperature = 2.0f;
    CHECK(nb_ref_probs(pr, lg, 6, &sp, work) == NB_OK);
    z = exp(0.5) + 2 * exp(1.5) + exp(1) + 1;
    CHECK(fabs(pr[4] - exp(1.0) / z) < 1e-6);

    // Hand-built distribution: probs p = {.1, .3, .05, .3, .2, .05} (ties!).
    const double pd[6] = {0.1, 0.3, 0.05, 0.3, 0.2, 0.05};
    float lp[6];
    for (int i = 0; i < 6; i++) lp[i] = (float)log(pd[i]);
    sp.temperature = 1.0f;
    // top_k = 1: tie between 1 and 3 -> index 1 only.
    sp.top_k = 1;
    CHECK(nb_ref_probs(pr, lp, 6, &sp, work) == NB_OK);
    for (int i = 0; i < 6; i++) CHECKF(pr[i] == (i == 1 ? 1.0f : 0.0f), "k1 %d %g", i, pr[i]);
    // top_k = 3: {1, 3, 4}, renormalised over 0.8.
    sp.top_k = 3;
    CHECK(nb_ref_probs(pr, lp, 6, &sp, work) == NB_OK);
    const double e3[6] = {0, 0.375, 0, 0.375, 0.25, 0};
    for (int i = 0; i < 6; i++) CHECKF(fabs(pr[i] - e3[i]) < 1e-6, "k3 %d %g", i, pr[i]);
    // top_k = 5: the 0.05 tie keeps the lower index (2), drops 5.
    sp.top_k = 5;
    CHECK(nb_ref_probs(pr, lp, 6, &sp, work) == NB_OK);
    CHECK(pr[2] > 0.0f && pr[5] == 0.0f);
    CHECK(fabs(pr[2] - 0.05 / 0.95) < 1e-6);
    // top_p = 0.5: order 1, 3, 4, 0, 2, 5; cumulative .3, .6 -> {1, 3}.
    sp.top_k = 0;
    sp.top_p = 0.5f;
    CHECK(nb_ref_probs(pr, lp, 6, &sp, work) == NB_OK);
    for (int i = 0; i < 6; i++)
        CHECKF(fabs(pr[i] - ((i == 1 || i == 3) ? 0.5 : 0.0)) < 1e-6, "p.5 %d %g", i, pr[i]);
    // top_p = 0.7: .3, .6, .8 -> {1, 3, 4}.
    sp.top_p = 0.7f;
    CHECK(nb_ref_probs(pr, lp, 6, &sp, work) == NB_OK);
    for (int i = 0; i < 6; i++) CHECKF(fabs(pr[i] - e3[i]) < 1e-6, "p.7 %d %g", i, pr[i]);
    // top_p tiny: only the first in order.
    sp.top_p = 1e-6f;
    CHECK(nb_ref_probs(pr, lp, 6, &sp, work) == NB_OK);
    for (int i = 0; i < 6; i++) CHECK(pr[i] == (i == 1 ? 1.0f : 0.0f));
    // top_k then top_p, relative to the kept mass: top_k=3 -> {.375,.375,.25};
    // top_p = 0.7 -> .375, .75 -> {1, 3}.
    sp.top_k = 3;
    sp.top_p = 0.7f;
    CHECK(nb_ref_probs(pr, lp, 6, &sp, work) == NB_OK);
    for (int i = 0; i < 6; i++)
        CHECKF(fabs(pr[i] - ((i == 1 || i == 3) ? 0.5 : 0.0)) < 1e-6, "kp %d %g", i, pr[i]);
    // Errors.
    sp.top_p = 0.0f;
    CHECK(nb_ref_probs(pr, lp, 6, &sp, work) == NB_ERR_INVALID_ARG);
    sp.top_p = 1.5f;
    CHECK(nb_ref_probs(pr, lp, 6, &sp, work) == NB_ERR_INVALID_ARG);
    sp.top_p = 1.0f;
    sp.top_k = -1;
    CHECK(nb_ref_probs(pr, lp, 6, &sp, work) == NB_ERR_INVALID_ARG);
    sp.top_k = 0;
    sp.temperature = -1.0f;
    CHECK(nb_ref_probs(pr, lp, 6, &sp, work) == NB_ERR_INVALID_ARG);
    sp.temperature = 1.0f;
    float bad[3] = {0.0f, NAN, 1.0f};
    CHECK(nb_ref_probs(pr, bad, 3, &sp, work) == NB_ERR_NON_FINITE);
    float allneg[3] = {-INFINITY, -INFINITY, -INFINITY};
    CHECK(nb_ref_probs(pr, allneg, 3, &sp, work) == NB_ERR_NON_FINITE);
}

static void test_sample(void) {
    const float p[5] = {0.0f, 0.25f, 0.0f, 0.5f, 0.25f};
    CHECK(nb_ref_sample(p, 5, 0.0f) == 1);
    CHECK(nb_ref_sample(p, 5, 0.2499f) == 1);
    CHECK(nb_ref_sample(p, 5, 0.25f) == 3); // cumsum must exceed u * total
    CHECK(nb_ref_sample(p, 5, 0.7499f) == 3);
    CHECK(nb_ref_sample(p, 5, 0.75f) == 4);
    CHECK(nb_ref_sample(p, 5, 0.99999994f) == 4);
    // Unnormalised input.
    const float w[3] = {2.0f, 0.0f, 6.0f};
    CHECK(nb_ref_sample(w, 3, 0.2f) == 0 && nb_ref_sample(w, 3, 0.3f) == 2);
    // Rounding guard: never a zero-probability token, even past the end.
    const float t[4] = {1e-8f, 1.0f, 0.0f, 0.0f};
    CHECK(nb_ref_sample(t, 4, 0.99999994f) == 1);
    const float zz[3] = {0, 0, 0};
    CHECK(nb_ref_sample(zz, 3, 0.5f) == -1);
    // Determinism: same seed + counter -> same token.
    float pr[64], work[64], lg[64];
    for (int i = 0; i < 64; i++) lg[i] = (float)sin(i * 1.7) * 3.0f;
    nb_sampling_params sp = {0.8f, 20, 0.9f, 42};
    CHECK(nb_ref_probs(pr, lg, 64, &sp, work) == NB_OK);
    int same = 1, differ = 0;
    for (uint64_t c = 0; c < 200; c++) {
        int32_t a = nb_ref_sample(pr, 64, nb_rng_uniform(sp.seed, c, 0));
        int32_t b = nb_ref_sample(pr, 64, nb_rng_uniform(sp.seed, c, 0));
        int32_t o = nb_ref_sample(pr, 64, nb_rng_uniform(sp.seed + 1, c, 0));
        same &= a == b && pr[a] > 0.0f;
        differ += a != o;
    }
    CHECK(same);
    CHECK(differ > 20);
}

static void test_greedy_accept(void) {
    // One-hot p and q: rejection sampling must equal exact match.
    enum { V = 8, G = 4 };
    float p[(G + 1) * V], q[G * V], work[V];
    int32_t tgt[G + 1] = {3, 5, 1, 7, 2}, dr[G], out[G + 1], out2[G + 1];
    memset(p, 0, sizeof p);
    for (int i = 0; i <= G; i++) p[i * V + tgt[i]] = 1.0f;
    for (int mism = 0; mism <= G; mism++) {
        for (int i = 0; i < G; i++) dr[i] = (i == mism) ? (tgt[i] + 1) % V : tgt[i];
        memset(q, 0, sizeof q);
        for (int i = 0; i < G; i++) q[i * V + dr[i]] = 1.0f;
        for (uint64_t seed = 0; seed < 20; seed++) {
            int na = -1, na2 = -1;
            CHECK(nb_ref_spec_accept(G, V, p, q, dr, seed, seed * 7, out, &na, work) == NB_OK);
            nb_ref_spec_accept_greedy(G, dr, tgt, out2, &na2);
            CHECK(na == mism && na2 == mism);
            for (int i = 0; i <= na; i++) CHECK(out[i] == tgt[i] && out2[i] == tgt[i]);
        }
    }
    int na;
    dr[0] = V;
    CHECK(nb_ref_spec_accept(G, V, p, q, dr, 0, 0, out, &na, work) == NB_ERR_INVALID_ARG);
}

typedef enum { RULE_CORRECT, RULE_ACCEPT_ALWAYS, RULE_RESAMPLE_FROM_P } rule_t;

// The token emitted at position pos of one speculative round with drafts
// sampled from q (-2: the round emitted fewer than pos + 1 tokens).
static int32_t emitted_token(rule_t rule, int gamma, int pos, int V, const float *p,
                             const float *q, uint64_t seed, float *work) {
    int32_t dr[8], out[9];
    for (int i = 0; i < gamma; i++)
        dr[i] = nb_ref_sample(q + i * V, V, nb_rng_uniform(seed, (uint64_t)i, 0));
    if (rule == RULE_ACCEPT_ALWAYS) return dr[pos];
    if (rule == RULE_RESAMPLE_FROM_P) {
        // Wrong: on rejection resample from p instead of the residual.
        float u = nb_rng_uniform(seed, 0, 1);
        if (u * q[dr[0]] < p[dr[0]]) return dr[0];
        return nb_ref_sample(p, V, nb_rng_uniform(seed, 0, 2));
    }
    int na;
    nb_status st = nb_ref_spec_accept(gamma, V, p, q, dr, seed, 0, out, &na, work);
    if (st != NB_OK) return -1;
    return pos <= na ? out[pos] : -2;
}

// p-value of "the token emitted at position pos follows p[pos]" over the
// rounds that emitted one (0 when a token outside p's support appears).
static double chi2_emitted(rule_t rule, int gamma, int pos, int trials) {
    enum { V = 6 };
    // Target rows (row 0 decides the first token) and a clearly different
    // draft, including a token the draft never proposes (index 5) and one
    // the target never emits (index 2).
    static const float p[4][V] = {{0.30f, 0.05f, 0.0f, 0.25f, 0.15f, 0.25f},
                                  {0.1f, 0.2f, 0.3f, 0.2f, 0.1f, 0.1f},
                                  {0.5f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f},
                                  {0.2f, 0.2f, 0.2f, 0.2f, 0.1f, 0.1f}};
    static const float q[3][V] = {{0.10f, 0.40f, 0.10f, 0.25f, 0.15f, 0.0f},
                                  {0.3f, 0.1f, 0.1f, 0.1f, 0.2f, 0.2f},
                                  {0.1f, 0.5f, 0.1f, 0.1f, 0.1f, 0.1f}};
    float work[V];
    long cnt[V] = {0}, total = 0;
    for (int t = 0; t < trials; t++) {
        uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1) + (uint64_t)gamma;
        int32_t tok = emitted_token(rule, gamma, pos, V, &p[0][0], &q[0][0], seed, work);
        if (tok == -2) continue;
        if (tok < 0 || tok >= V) return 0.0;
        cnt[tok]++;
        total++;
    }
    // Chi-square over the target's support; any hit outside it is a failure.
    double x2 = 0.0;
    int cells = 0;
    for (int i = 0; i < V; i++) {
        double e = (double)p[pos][i] * total;
        if (e == 0.0) {
            if (cnt[i]) return 0.0;
            continue;
        }
        x2 += (cnt[i] - e) * (cnt[i] - e) / e;
        cells++;
    }
    return chi2_sf(x2, cells - 1);
}

static void test_rejection_is_exact(void) {
    const int trials = 200000;
    // The first emitted token must follow p[0] (the brief's test), and so must
    // later positions (accepted draft, correction, or bonus) follow p[pos].
    static const int cases[][2] = {{1, 0}, {3, 0}, {1, 1}, {3, 1}, {3, 2}, {3, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int gamma = cases[c][0], pos = cases[c][1];
        double pv = chi2_emitted(RULE_CORRECT, gamma, pos, trials);
        printf("rejection sampling gamma=%d position %d: chi-square p-value %.4g\n", gamma, pos, pv);
        CHECKF(pv >= CHI2_ALPHA, "gamma %d position %d p-value %g", gamma, pos, pv);
    }
    // The same test must reject wrong rules.
    double pa = chi2_emitted(RULE_ACCEPT_ALWAYS, 1, 0, trials);
    double pr = chi2_emitted(RULE_RESAMPLE_FROM_P, 1, 0, trials);
    printf("accept-always p-value %.4g, resample-from-p p-value %.4g\n", pa, pr);
    CHECK(pa < CHI2_ALPHA);
    CHECK(pr < CHI2_ALPHA);
}

int main(void) {
    test_chi2_sf();
    test_philox_kat();
    test_probs();
    test_sample();
    test_greedy_accept();
    test_rejection_is_exact();
    return nb_test_finish("test_sampling");
}
