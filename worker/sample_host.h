// sample_host.h: the sampling requests of a forward batch (nb_fwd_sample,
// backend.h) served on the host from logits in host memory, with the
// reference functions of sampling.h. The cpu backend samples with it; the
// cuda backend does when configured with host_sampling, which makes it the
// twin the device sampler is tested against on the same logits.
#ifndef NB_SAMPLE_HOST_H
#define NB_SAMPLE_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

// Checks every sampling request of b before any work: kinds, parameters,
// slots and steps within (n_slots, max_gamma), draft ids within [0, V),
// output arrays present. NB_OK or NB_ERR_INVALID_ARG with a message.
nb_status nb_fwd_sample_check(const nb_fwd_batch *b, int32_t V, int32_t n_slots,
                              int32_t max_gamma, char *err, size_t err_len);

// True when fs samples with temperature > 0 (needs its logits' distributions,
// not only the argmax); fs passed nb_fwd_sample_check.
static inline bool nb_fwd_seq_needs_probs(const nb_fwd_seq *fs) {
    return fs->sample != NB_FWD_SAMPLE_NONE && fs->n_logits > 0 && fs->sp->temperature != 0.0f;
}

// True when some sequence of b does.
bool nb_fwd_sample_needs_probs(const nb_fwd_batch *b);

typedef struct nb_host_sampler {
    int32_t V, n_slots, max_gamma;
    float *q;    // [n_slots][max_gamma][V] draft distributions kept until VERIFY
    float *p;    // [max_gamma + 1][V]
    float *work; // [V]
    int32_t *am; // [max_gamma + 1]
} nb_host_sampler;

// Allocates the draft slots (n_slots * max_gamma * V floats; none when
// max_gamma is 0 or greedy_only) and scratch. NB_OK or NB_ERR_OUT_OF_MEMORY.
nb_status nb_host_sampler_init(nb_host_sampler *hs, int32_t V, int32_t n_slots, int32_t max_gamma,
                               bool greedy_only);
void nb_host_sampler_free(nb_host_sampler *hs);

// Serves b's requests (checked by nb_fwd_sample_check) from its logit rows
// logits ([sum of n_logits][V]) and their argmax ([sum of n_logits]; NULL:
// computed here), writing b->sampled and b->n_accepted. greedy_only: only
// the temperature-0 sequences (those need the argmax only; logits may then
// be NULL when argmax is given); the others are left to the caller.
void nb_host_sample(nb_host_sampler *hs, const nb_fwd_batch *b, const float *logits,
                    const int32_t *argmax, bool greedy_only);

#endif // NB_SAMPLE_HOST_H
