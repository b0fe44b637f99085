// sampling.h: token sampling and speculative acceptance, deterministic per
// sequence whatever the batch.
//
// The one idea: every random number is a pure function of (seed, counter,
// stream) through the counter-based Philox4x32-10 generator, so a sequence's
// tokens never depend on which other sequences share a batch, on threads or
// on the device. Streams: 0 = drafting/plain sampling, 1 = acceptance tests,
// 2 = correction/bonus samples. Use counter = the sequence position of the
// token being decided: nb_ref_spec_accept then never reuses a (counter,
// stream) pair across rounds (a round starting at counter0 = c that commits
// a+1 tokens consumes only counters c..c+a; the next round starts at c+a+1).
#ifndef NB_SAMPLING_H
#define NB_SAMPLING_H

#include <stdint.h>

#include "nb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Philox4x32-10 (Salmon et al., SC'11): 10 rounds, multipliers 0xD2511F53 and
// 0xCD9E8D57, Weyl key increments 0x9E3779B9 and 0xBB67AE85.
void nb_philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2]);

// A uniform float in [0, 1) with 24 random bits: u = (x0 >> 8) * 2^-24, x0
// the first word of Philox4x32-10 with key = {lo32(seed), hi32(seed)} and
// counter = {lo32(counter), hi32(counter), stream, 0}.
float nb_rng_uniform(uint64_t seed, uint64_t counter, uint32_t stream);

typedef struct nb_sampling_params {
    float temperature; // 0 = greedy; > 0 divides the logits
    int32_t top_k;     // keep the k most probable tokens; 0 = all
    float top_p;       // nucleus mass in (0, 1]; 1 = all
    uint64_t seed;     // the sequence's RNG key
} nb_sampling_params;

// Target distribution after temperature, top-k and top-p:
// - temperature == 0: one-hot at argmax(logits) (ties -> lowest index);
//   top_k/top_p are ignored.
// - else: p = nb_ref_softmax(logits[i] / T) (f32 division); order tokens by
//   p descending, ties by index ascending; keep the first top_k (0 = all);
//   then keep the shortest prefix of that order whose cumulative mass,
//   relative to the kept mass (summed in double, in order), is >= top_p
//   (top_p >= 1: all kept); zero the rest and divide the kept p by their sum
//   (double, index order, rounded to f32 once).
// work: [V] floats of scratch. -inf logits are allowed (probability 0).
// Returns NB_OK; NB_ERR_INVALID_ARG (V <= 0, T < 0 or NaN, top_k < 0,
// top_p outside (0, 1]); NB_ERR_NON_FINITE (NaN or +inf logit, or all -inf).
nb_status nb_ref_probs(float *probs /*[V] f32*/, const float *logits /*[V] f32*/, int V,
                       const nb_sampling_params *sp, float *work /*[V] f32*/);

// Inverse-CDF sample: the first i with cumsum(probs[0..i]) > u * total
// (cumsum and total in double, index order). If rounding leaves no such i,
// the last token with nonzero probability. u in [0, 1). Returns -1 if no
// probability is positive (a caller bug).
int32_t nb_ref_sample(const float *probs /*[V] f32*/, int V, float u);

// Exact-match acceptance (greedy): accepts drafts while draft[i] ==
// target_argmax[i]; out_tokens = accepted drafts + target_argmax[n_accepted].
void nb_ref_spec_accept_greedy(int gamma, const int32_t *draft /*[gamma]*/,
                               const int32_t *target_argmax /*[gamma+1]*/,
                               int32_t *out_tokens /*[gamma+1]*/, int *n_accepted);

// Speculative rejection sampling (Leviathan et al. 2023). For i = 0..gamma-1,
// with d = draft[i] and u = nb_rng_uniform(seed, counter0 + i, 1): accept iff
// u * q[i][d] < p[i][d] (so p >= q always accepts; q[d] == 0 < p[d] accepts;
// p[d] == 0 never accepts). On the first rejection at i, the correction is
// nb_ref_sample(max(0, p[i] - q[i]), u2) with u2 = nb_rng_uniform(seed,
// counter0 + i, 2), or from p[i] when that residual is all zero. If all gamma
// are accepted, the bonus is nb_ref_sample(p[gamma], nb_rng_uniform(seed,
// counter0 + gamma, 2)). out_tokens = accepted drafts + correction/bonus;
// *n_accepted = number of accepted drafts (0..gamma). With one-hot p and q
// (temperature 0) this is exact match. Rows of p and q need not be
// normalised (nb_ref_sample normalises). work: [V] floats of scratch.
// Returns NB_OK; NB_ERR_INVALID_ARG (gamma < 0, V <= 0, a draft id outside
// [0, V)); NB_ERR_STATE (a row of p with no positive probability).
nb_status nb_ref_spec_accept(int gamma, int V, const float *p /*[gamma+1][V] target probs*/,
                             const float *q /*[gamma][V] draft probs*/,
                             const int32_t *draft /*[gamma]*/, uint64_t seed, uint64_t counter0,
                             int32_t *out_tokens /*[gamma+1]*/, int *n_accepted,
                             float *work /*[V] f32*/);

#ifdef __cplusplus
}
#endif

#endif // NB_SAMPLING_H
