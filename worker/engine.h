// engine.h: nibbler's model engine. Owns one model replica, its paged KV
// cache (block manager + backend pools) and the sequences, and turns the
// scheduler's commands into forward passes.
//
// Per sequence the engine tracks committed tokens (KV written by the target),
// drafted tokens (KV written by the draft, pending) and the next token: the
// last sampled token, not yet in the cache. After PREFILL of a prompt p the
// cache holds p and next = the first generated token.
//   DRAFT(gamma): gamma draft steps; the cache gains next, d1..d(gamma-1)
//     as drafted tokens; returns d1..d(gamma).
//   VERIFY: one target pass over next, d1..d(gamma) (gamma+1 rows), rewriting
//     their KV with the target's; accepts a prefix of the drafts (exact match
//     when greedy, rejection sampling otherwise) and appends the correction or
//     bonus token, which becomes the new next. Every emitted token is the
//     target's.
//   DECODE(n): n target-only steps (the baseline).
//   ROLLBACK(n): keep the first n committed tokens; next becomes the token
//     that was at position n (unchanged when n == committed).
// Every command takes a batch and reports a status per sequence: one
// sequence's failure (no free blocks, bad state) never affects another.
//
// Randomness is a pure function of (seed, position, stream) (sampling.h), so
// a sequence's tokens never depend on the rest of its batch.
#ifndef NB_ENGINE_H
#define NB_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "block_manager.h"
#include "model_loader.h"
#include "nb_status.h"
#include "sampling.h"

#define NB_ENGINE_MAX_GAMMA 16

typedef struct nb_engine nb_engine;

typedef struct nb_engine_params {
    const char *backend;        // "cpu", or "cuda" in builds with CUDA
    bool quantized_cache;       // true: hierarchical INT8/INT4 blocks; false: every token FP
    int32_t group_size;         // G, tokens per block: 64, 128 or 256 (others for tests)
    int32_t n_qblocks;          // quantized pool, blocks; 0 with n_fpblocks 0: from kv_memory
    int32_t n_fpblocks;         // FP pool, blocks
    size_t kv_memory;           // bytes for both pools when the counts are 0
    int32_t max_seqs;           // sequences at once
    int32_t max_seq_len;        // tokens per sequence; 0: the model's max_position_embeddings
    int32_t max_gamma;          // most drafts per round, 1..NB_ENGINE_MAX_GAMMA and < G
    int32_t prefill_chunk;      // most prompt tokens one sequence adds per prefill pass
                                // (clamped to max_seq_len and max_batch_rows)
    int32_t max_batch_rows;     // most rows in one forward pass
    nb_target_weights target_weights;
    bool draft_w4;              // draft with 4-bit weights (false: the target's; an ablation)
    bool draft_int4_kv;         // draft reads upper nibbles only (false: INT8; an ablation)
    bool prefix_cache;          // share full quantized blocks across equal prefixes
    int kv_dtype;               // nb_dtype of FP blocks and scales; -1: the embedding's dtype
    double gpu_memory_utilization; // cuda, (0, 1]: the share of the device's total memory this
                                   // engine may use (weights, workspace, KV pools), as vLLM;
                                   // the pools get what is left (kv_memory is ignored). 0: unset
    int device;                 // cuda: device ordinal
    bool cuda_graphs;           // cuda: CUDA graphs for step passes (default on)
    bool host_sampling;         // cuda: sample on the host from downloaded logits (the
                                // reference twin of the GPU sampler; tests). Default off
    bool draft_batch_invariant; // cuda: draft passes use the row-invariant attention split
                                // too, so a sampled sequence's tokens do not depend on its
                                // batch; default off: drafts take the faster batch-tuned
                                // split (greedy output is the target's either way)
} nb_engine_params;

// Defaults: cpu, quantized cache, G=128, kv_memory 256 MiB, 16 sequences,
// model context, max_gamma 8, prefill_chunk 1024, max_batch_rows 1024, target
// weights from the checkpoint, 4-bit draft weights, INT4 draft KV, prefix
// cache on, kv_dtype from the model.
nb_engine_params nb_engine_default_params(void);

// Creates an engine on a loaded model (borrowed: it must outlive the
// engine). Returns NULL with a message in err on failure (invalid params,
// out of memory, unsupported backend). Caller owns: nb_engine_destroy().
nb_engine *nb_engine_new(const nb_model *model, const nb_engine_params *p, char *err,
                         size_t err_len);

void nb_engine_destroy(nb_engine **e_p); // accepts NULL; sets *e_p = NULL

// Adds an empty sequence with its sampling parameters (temperature 0 =
// greedy; top_k 0 and top_p 0 or 1 = no truncation). Returns NB_OK,
// NB_ERR_TOO_MANY_SEQS, NB_ERR_INVALID_ARG (bad sampling parameters).
nb_status nb_engine_seq_add(nb_engine *e, const nb_sampling_params *sp, int32_t *seq);

// Releases a sequence's blocks. Returns NB_OK or NB_ERR_NOT_FOUND.
nb_status nb_engine_seq_free(nb_engine *e, int32_t seq);

// A new sequence sharing parent's committed tokens and next token (blocks
// shared, copy-on-write); sp NULL keeps the parent's sampling parameters.
// Returns NB_OK, NB_ERR_NOT_FOUND, NB_ERR_TOO_MANY_SEQS, NB_ERR_NO_FREE_BLOCKS,
// NB_ERR_STATE (parent has unverified drafts), NB_ERR_INVALID_ARG.
nb_status nb_engine_seq_fork(nb_engine *e, int32_t parent, const nb_sampling_params *sp,
                             int32_t *child);

// PREFILL: appends prompts[i] (lens[i] tokens) to seqs[i] in chunks, then
// samples next[i]. Per sequence st[i]: NB_OK, NB_ERR_NOT_FOUND, NB_ERR_STATE
// (unverified drafts), NB_ERR_INVALID_ARG (empty prompt, token outside the
// vocabulary), NB_ERR_CONTEXT_TOO_LONG, NB_ERR_NO_FREE_BLOCKS (the sequence
// keeps what was prefilled before the failure; roll back or free it). The
// return value is NB_OK unless the command itself is malformed or the
// backend failed. n_cached (may be NULL) receives prompt tokens reused from
// the prefix cache.
// Log-probability outputs (next_logprob here, out_logprobs below; each may
// be NULL) hold log softmax of the target's raw logits (temperature 1, no
// truncation) at each emitted token, laid out like the token outputs.
nb_status nb_engine_prefill(nb_engine *e, int32_t n, const int32_t *seqs,
                            const int32_t *const *prompts, const int32_t *lens, int32_t *next,
                            float *next_logprob, int32_t *n_cached, nb_status *st);

// DRAFT: gamma draft tokens per sequence into drafts[i*gamma + j]. st[i]:
// NB_OK, NB_ERR_NOT_FOUND, NB_ERR_STATE (no next token yet, or unverified
// drafts), NB_ERR_CONTEXT_TOO_LONG, NB_ERR_NO_FREE_BLOCKS (nothing changed).
// Returns NB_ERR_INVALID_ARG for gamma outside 1..max_gamma.
nb_status nb_engine_draft(nb_engine *e, int32_t n, const int32_t *seqs, int32_t gamma,
                          int32_t *drafts, nb_status *st);

// VERIFY: per sequence, out[i*(max_gamma+1) + j] for j < n_out[i] are the
// emitted tokens (accepted drafts, then the correction or bonus);
// n_accepted[i] counts accepted drafts. st[i]: NB_OK, NB_ERR_NOT_FOUND,
// NB_ERR_STATE (no drafts to verify), NB_ERR_NO_FREE_BLOCKS (drafts kept).
nb_status nb_engine_verify(nb_engine *e, int32_t n, const int32_t *seqs, int32_t *out,
                           float *out_logprobs, int32_t *n_out, int32_t *n_accepted,
                           nb_status *st);

// DECODE: n_steps target-only tokens per sequence into out[i*n_steps + j].
// st[i]: as DRAFT. A sequence that runs out of blocks stops; n_out[i] says
// how many tokens it produced.
nb_status nb_engine_decode(nb_engine *e, int32_t n, const int32_t *seqs, int32_t n_steps,
                           int32_t *out, float *out_logprobs, int32_t *n_out, nb_status *st);

// ROLLBACK to n committed tokens. Returns NB_OK, NB_ERR_NOT_FOUND,
// NB_ERR_INVALID_ARG (n < 0 or > committed), NB_ERR_NO_FREE_BLOCKS.
nb_status nb_engine_rollback(nb_engine *e, int32_t seq, int32_t n);

typedef struct nb_engine_seq_info {
    int32_t n_committed;   // tokens in the cache, written by the target
    int32_t n_drafted;     // pending drafted tokens in the cache
    int32_t next_token;    // -1 before the first prefill
    int32_t n_qblocks;     // quantized blocks held
    int32_t n_fpblocks;    // FP blocks held
    int64_t n_draft_tokens;    // drafts proposed so far
    int64_t n_accepted_tokens; // drafts accepted so far
} nb_engine_seq_info;

nb_status nb_engine_seq_info_get(const nb_engine *e, int32_t seq, nb_engine_seq_info *info);

// Token ids in the cache (committed then drafted), valid until the next
// command on the sequence. NULL for an unknown sequence.
const int32_t *nb_engine_seq_tokens(const nb_engine *e, int32_t seq);

// SCORE (teacher forcing, for perplexity): appends tokens[0..n) to an empty
// sequence in passes of `chunk` tokens through the target and adds the
// negative log-likelihood (nats) of tokens[1..n) to *nll. The cache precision
// a row sees follows the same rules as decoding, so chunk == 1 measures
// exactly what target-only decoding would read. Returns NB_OK or a status.
// mode NB_FWD_DRAFT scores through the draft instead (its weights and KV
// view), to measure what the draft alone would cost. logits (may be NULL)
// receives every row's logits, [n][vocab] f32.
nb_status nb_engine_score(nb_engine *e, int32_t seq, const int32_t *tokens, int32_t n,
                          int32_t chunk, nb_fwd_mode mode, double *nll, float *logits);

const nb_model_config *nb_engine_model_config(const nb_engine *e);
const nb_engine_params *nb_engine_params_get(const nb_engine *e);
const nb_bm_t *nb_engine_block_manager(const nb_engine *e);
nb_backend *nb_engine_backend(nb_engine *e);

#endif // NB_ENGINE_H
