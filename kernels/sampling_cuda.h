// sampling_cuda.h: CUDA twins of sampling.h: Philox4x32-10, greedy argmax,
// target distributions (temperature, top-k, top-p), inverse-CDF sampling and
// speculative acceptance, for a batch of rows/sequences at once.
//
// The one idea: the same pure function of (seed, counter, stream) as the cpu
// backend, so both backends pick the same tokens from the same logits. What
// is bit-exact and what is not:
//   - Philox words and uniforms, argmax, greedy acceptance, the acceptance
//     test u * q[d] < p[d]: bit-exact.
//   - Probabilities: every per-element operation is the reference's, but
//     exp is evaluated in double and rounded to f32 (glibc's expf is not
//     correctly rounded for ~1 argument in 1600, so an element may differ
//     by 1 ulp) and the double sums (the softmax normaliser, the top-p
//     cumulative mass, the renormaliser) are added in a different order, so
//     the f32 normaliser can differ by 1 ulp in rare rows. The top-k cut is
//     found exactly (integer radix select on the f32 bits). The top-p cut
//     compares exact 64-bit fixed-point sums (p * 2^62, truncated: masses
//     below 2^-62 per token are ignored) with top_p * kept, where the cpu
//     compares double sums in sorted order: the kept set differs only when
//     the cumulative mass lies within ~1e-15 (relative) of top_p * kept.
//   - Sampling: the cumulative sums are double, per-thread chunks in index
//     order then a fixed tree, the reference's is one index-order chain; the
//     token differs only when u * total falls within double rounding
//     (~V * 2^-53 relative) of a CDF boundary, or when an upstream 1-ulp
//     difference in p moves a boundary across u (probability ~1e-7 per
//     sample). Every reduction has a fixed order (no floating-point atomics),
//     so the GPU results are deterministic and independent of the batch.
//
// Conventions as ops_cuda.h: device pointers, work enqueued on `stream`, no
// allocation (the kernels need only shared memory), host-side checks return
// NB_ERR_INVALID_ARG, a failed launch NB_ERR_BACKEND. Per-row errors that only
// the data reveals are reported in device arrays as negative nb_status values,
// so no call has to synchronise. Usable from C and C++.
#ifndef NB_SAMPLING_CUDA_H
#define NB_SAMPLING_CUDA_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "nb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

// NOTE: inside the C linkage block so that C++ includers (the .cu files) see
// sampling.h's functions with C linkage; its own includes are above.
#include "sampling.h"

// Philox4x32-10 on n independent (counter, key) pairs, bit-exact with
// nb_philox4x32_10 (for known-answer tests and bulk random words).
nb_status nb_cuda_philox4x32_10(uint32_t *out /*[n][4]*/, const uint32_t *ctr /*[n][4]*/,
                                const uint32_t *key /*[n][2]*/, int n, cudaStream_t stream);

// out[i] = nb_rng_uniform(seed[i], counter[i], rng_stream), bit-exact.
nb_status nb_cuda_rng_uniform(float *out /*[n]*/, const uint64_t *seed /*[n]*/,
                              const uint64_t *counter /*[n]*/, uint32_t rng_stream, int n,
                              cudaStream_t stream);

// Greedy: out[r] = nb_ref_argmax(x[r], V) (ties to the lowest index, NaN
// skipped, -1 when the row is all NaN), bit-exact. One block per row.
nb_status nb_cuda_argmax(int32_t *out /*[n]*/, const float *x /*[n][V] f32*/, int n, int V,
                         cudaStream_t stream);

// Target distributions, twin of nb_ref_probs per row with that row's
// parameters sp[r] (device copy of the host structs; seed unused here).
// status[r] receives NB_OK, NB_ERR_INVALID_ARG (bad parameters) or
// NB_ERR_NON_FINITE (a NaN/+inf logit or all -inf), exactly when
// nb_ref_probs returns them; probs[r] is then unspecified. probs may equal
// logits. One block of 1024 threads per row; top-k/top-p rows take about a
// dozen passes over the row (radix selection), the others three.
// Returns NB_ERR_INVALID_ARG for n < 0 or V < 1 (host check).
nb_status nb_cuda_probs(float *probs /*[n][V] f32*/, const float *logits /*[n][V] f32*/, int n,
                        int V, const nb_sampling_params *sp /*[n] device*/,
                        int32_t *status /*[n] nb_status*/, cudaStream_t stream);

// nb_cuda_probs on gathered rows: row r reads logits + in_rows[r]*V and
// writes probs + out_rows[r]*V (a NULL map is the identity), with sp[r] and
// status[r]. The engine's use: distributions computed in place in the
// logits buffer, or written into per-sequence draft slots. Rows written must
// not overlap other rows read (in place, out_rows == in_rows, is allowed).
nb_status nb_cuda_probs_rows(float *probs /*[*][V] f32*/, const int32_t *out_rows /*[n] or NULL*/,
                             const float *logits /*[*][V] f32*/,
                             const int32_t *in_rows /*[n] or NULL*/, int n, int V,
                             const nb_sampling_params *sp /*[n] device*/,
                             int32_t *status /*[n] nb_status*/, cudaStream_t stream);

// Inverse-CDF sampling, twin of nb_ref_sample per row with
// u = nb_rng_uniform(seed[r], counter[r], rng_stream) (stream 0 for plain
// sampling): out[r] = the first i with cumsum(probs[r][0..i]) > u * total
// over positive entries, else the last positive token, -1 if none.
nb_status nb_cuda_sample(int32_t *out /*[n]*/, const float *probs /*[n][V] f32*/, int n, int V,
                         const uint64_t *seed /*[n]*/, const uint64_t *counter /*[n]*/,
                         uint32_t rng_stream, cudaStream_t stream);

// nb_cuda_sample on gathered rows: out[r] samples probs + rows[r]*V (NULL:
// the identity) with seed[r], counter[r].
nb_status nb_cuda_sample_rows(int32_t *out /*[n]*/, const float *probs /*[*][V] f32*/,
                              const int32_t *rows /*[n] or NULL*/, int n, int V,
                              const uint64_t *seed /*[n]*/, const uint64_t *counter /*[n]*/,
                              uint32_t rng_stream, cudaStream_t stream);

// Greedy (exact-match) acceptance for n sequences, twin of
// nb_ref_spec_accept_greedy: sequence s has gamma[s] drafts (gamma == NULL:
// all have gamma_max; each gamma[s] in [0, gamma_max]) stored with row stride
// gamma_max (draft) and gamma_max + 1 (target_argmax, out_tokens).
// n_accepted[s] = accepted drafts, out_tokens[s][0..n_accepted[s]] written,
// or n_accepted[s] = NB_ERR_INVALID_ARG if gamma[s] is out of range.
nb_status nb_cuda_spec_accept_greedy(int n, int gamma_max, const int32_t *gamma /*[n] or NULL*/,
                                     const int32_t *draft /*[n][gamma_max]*/,
                                     const int32_t *target_argmax /*[n][gamma_max+1]*/,
                                     int32_t *out_tokens /*[n][gamma_max+1]*/,
                                     int32_t *n_accepted /*[n]*/, cudaStream_t stream);

// Speculative rejection sampling for n sequences, twin of nb_ref_spec_accept
// (same streams and counters: acceptance u from stream 1 at counter0[s] + i,
// correction/bonus from stream 2). Sequence s uses p + s*(gamma_max+1)*V,
// q + s*gamma_max*V, draft + s*gamma_max, out_tokens + s*(gamma_max+1), and
// gamma[s] drafts (gamma == NULL: gamma_max). The residual max(0, p - q) is
// formed on the fly (no workspace). n_accepted[s] = accepted drafts (0..gamma)
// and out_tokens[s][0..n_accepted[s]] = accepted drafts + correction/bonus;
// or n_accepted[s] = NB_ERR_INVALID_ARG (gamma[s] out of range or a draft id
// outside [0, V)) or NB_ERR_STATE (a p row with no positive probability),
// exactly when nb_ref_spec_accept returns those codes.
// One block of 1024 threads per sequence.
nb_status nb_cuda_spec_accept(int n, int gamma_max, int V, const int32_t *gamma /*[n] or NULL*/,
                              const float *p /*[n][gamma_max+1][V] target probs*/,
                              const float *q /*[n][gamma_max][V] draft probs*/,
                              const int32_t *draft /*[n][gamma_max]*/,
                              const uint64_t *seed /*[n]*/, const uint64_t *counter0 /*[n]*/,
                              int32_t *out_tokens /*[n][gamma_max+1]*/,
                              int32_t *n_accepted /*[n]*/, cudaStream_t stream);

// nb_cuda_spec_accept with each sequence's rows gathered: sequence s reads
// its gamma[s] + 1 target rows from p + p_row0[s]*V on and its draft rows
// from q + q_row0[s]*V on (a NULL map: the strides of nb_cuda_spec_accept);
// draft, out_tokens and the other arrays keep those strides. Same results
// per sequence.
nb_status nb_cuda_spec_accept_rows(int n, int gamma_max, int V, const int32_t *gamma /*[n] or NULL*/,
                                   const float *p /*[*][V]*/, const int32_t *p_row0 /*[n] or NULL*/,
                                   const float *q /*[*][V]*/, const int32_t *q_row0 /*[n] or NULL*/,
                                   const int32_t *draft /*[n][gamma_max]*/,
                                   const uint64_t *seed /*[n]*/, const uint64_t *counter0 /*[n]*/,
                                   int32_t *out_tokens /*[n][gamma_max+1]*/,
                                   int32_t *n_accepted /*[n]*/, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif // NB_SAMPLING_CUDA_H
