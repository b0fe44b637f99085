// sampling.c: Philox RNG, target distributions, inverse-CDF sampling and
// speculative acceptance (contracts in sampling.h).
#include "sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_ref.h"

enum {
    STREAM_ACCEPT = 1,
    STREAM_RESAMPLE = 2,
};

static inline void mulhilo32(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

void nb_philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo32(0xD2511F53u, c0, &hi0, &lo0);
        mulhilo32(0xCD9E8D57u, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

float nb_rng_uniform(uint64_t seed, uint64_t counter, uint32_t stream) {
    uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), stream, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t r[4];
    nb_philox4x32_10(r, ctr, key);
    return (float)(r[0] >> 8) * 0x1p-24f;
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

nb_status nb_ref_probs(float *probs, const float *logits, int V, const nb_sampling_params *sp,
                       float *work) {
    if (V <= 0 || !(sp->temperature >= 0.0f) || sp->top_k < 0 || !(sp->top_p > 0.0f) ||
        !(sp->top_p <= 1.0f))
        return NB_ERR_INVALID_ARG;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY) return NB_ERR_NON_FINITE;
        if (logits[i] > mx) mx = logits[i];
    }
    if (mx == -INFINITY) return NB_ERR_NON_FINITE;
    const float T = sp->temperature;
    if (T == 0.0f) {
        int am = nb_ref_argmax(logits, V);
        memset(probs, 0, (size_t)V * sizeof(float));
        probs[am] = 1.0f;
        return NB_OK;
    }
    // NOTE: (l - max) / T rather than l / T - max / T: the same distribution,
    // and it cannot overflow for tiny T.
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        float e = expf((logits[i] - mx) / T);
        probs[i] = e;
        sum += e;
    }
    float fs = (float)sum;
    for (int i = 0; i < V; i++) probs[i] = probs[i] / fs;
    if ((sp->top_k == 0 || sp->top_k >= V) && sp->top_p >= 1.0f) return NB_OK;

    int nz = 0;
    for (int i = 0; i < V; i++)
        if (probs[i] > 0.0f) work[nz++] = probs[i];
    qsort(work, (size_t)nz, sizeof(float), cmp_desc);
    int keep = nz;
    if (sp->top_k > 0 && sp->top_k < keep) keep = sp->top_k;
    if (sp->top_p < 1.0f) {
        double kept = 0.0, cum = 0.0;
        for (int c = 0; c < keep; c++) kept += work[c];
        double need = (double)sp->top_p * kept;
        for (int c = 0; c < keep; c++) {
            cum += work[c];
            if (cum >= need) {
                keep = c + 1;
                break;
            }
        }
    }
    // The kept set is every p > v plus the lowest-index ties p == v.
    const float v = work[keep - 1];
    int n_eq = 0;
    for (int c = 0; c < keep; c++) n_eq += work[c] == v;
    sum = 0.0;
    for (int i = 0; i < V; i++) {
        if (probs[i] > v) {
            sum += probs[i];
        } else if (probs[i] == v && n_eq > 0) {
            n_eq--;
            sum += probs[i];
        } else {
            probs[i] = 0.0f;
        }
    }
    fs = (float)sum;
    for (int i = 0; i < V; i++) probs[i] = probs[i] / fs;
    return NB_OK;
}

int32_t nb_ref_sample(const float *probs, int V, float u) {
    double total = 0.0;
    int last = -1;
    for (int i = 0; i < V; i++) {
        if (probs[i] > 0.0f) {
            total += probs[i];
            last = i;
        }
    }
    if (last < 0) return -1;
    const double target = (double)u * total;
    double cum = 0.0;
    for (int i = 0; i <= last; i++) {
        if (!(probs[i] > 0.0f)) continue;
        cum += probs[i];
        if (cum > target) return i;
    }
    return last;
}

void nb_ref_spec_accept_greedy(int gamma, const int32_t *draft, const int32_t *target_argmax,
                               int32_t *out_tokens, int *n_accepted) {
    int a = 0;
    while (a < gamma && draft[a] == target_argmax[a]) {
        out_tokens[a] = draft[a];
        a++;
    }
    out_tokens[a] = target_argmax[a];
    *n_accepted = a;
}

nb_status nb_ref_spec_accept(int gamma, int V, const float *p, const float *q,
                             const int32_t *draft, uint64_t seed, uint64_t counter0,
                             int32_t *out_tokens, int *n_accepted, float *work) {
    *n_accepted = 0;
    if (gamma < 0 || V <= 0) return NB_ERR_INVALID_ARG;
    for (int i = 0; i < gamma; i++)
        if (draft[i] < 0 || draft[i] >= V) return NB_ERR_INVALID_ARG;
    for (int i = 0; i < gamma; i++) {
        const float *pi = p + (size_t)i * V, *qi = q + (size_t)i * V;
        const int32_t d = draft[i];
        float u = nb_rng_uniform(seed, counter0 + (uint64_t)i, STREAM_ACCEPT);
        if (u * qi[d] < pi[d]) {
            out_tokens[i] = d;
            continue;
        }
        int any = 0;
        for (int j = 0; j < V; j++) {
            float r = pi[j] - qi[j];
            work[j] = r > 0.0f ? r : 0.0f;
            any |= work[j] > 0.0f;
        }
        float u2 = nb_rng_uniform(seed, counter0 + (uint64_t)i, STREAM_RESAMPLE);
        int32_t t = nb_ref_sample(any ? work : pi, V, u2);
        if (t < 0) return NB_ERR_STATE;
        out_tokens[i] = t;
        *n_accepted = i;
        return NB_OK;
    }
    const float *pg = p + (size_t)gamma * V;
    int32_t t = nb_ref_sample(pg, V, nb_rng_uniform(seed, counter0 + (uint64_t)gamma,
                                                    STREAM_RESAMPLE));
    if (t < 0) return NB_ERR_STATE;
    out_tokens[gamma] = t;
    *n_accepted = gamma;
    return NB_OK;
}
