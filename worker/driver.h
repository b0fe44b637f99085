// driver.h: the in-process driver: one call runs a whole generation (prefill,
// then draft/verify rounds of gamma, or target-only decoding) on an engine.
// Used by tests, benchmarks and tools that embed the engine; the worker
// process exposes the same steps as protocol commands.
#ifndef NB_DRIVER_H
#define NB_DRIVER_H

#include <stdint.h>

#include "engine.h"

typedef struct nb_driver_opts {
    int32_t max_tokens;          // tokens to generate (the first comes from prefill)
    int32_t gamma;               // drafts per round; 0 = target-only decoding
    nb_sampling_params sampling; // temperature 0 = greedy
    const int32_t *eos_ids;      // stop after emitting one of these (may be NULL)
    int32_t n_eos;
} nb_driver_opts;

typedef struct nb_driver_stats {
    int32_t n_tokens;   // tokens written to out
    int64_t n_drafted;  // drafts proposed
    int64_t n_accepted; // drafts accepted
    int64_t n_rounds;   // draft/verify rounds (or decode steps)
    double seconds;     // wall time of the whole call
} nb_driver_stats;

// Adds a sequence, prefills prompt[0..n_prompt), generates up to
// opts->max_tokens tokens into out (which holds at least max_tokens), frees
// the sequence. Tokens past an eos or past max_tokens are not written (a
// round may produce more than needed). Returns NB_OK or the first failing
// status (the sequence is freed either way); stats (may be NULL) is filled
// with what was done.
nb_status nb_driver_generate(nb_engine *e, const int32_t *prompt, int32_t n_prompt,
                             const nb_driver_opts *opts, int32_t *out, nb_driver_stats *stats);

#endif // NB_DRIVER_H
