// backend.h: the compute backend table the engine calls (ggml-backend style).
//
// The one idea: the engine decides WHAT runs (which rows, which weights,
// which view of the cache, which blocks); a backend only computes. A forward
// pass takes a batch of sequences, each with some new rows at consecutive
// positions whose KV slots the block manager has already allocated; it
// writes those rows' K/V into their FP slots, attends over the paged cache
// and returns logits for the rows asked for. The cpu backend (backend_cpu.c)
// is the scalar reference of every kernel; a cuda backend implements the
// same table.
#ifndef NB_BACKEND_H
#define NB_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "block_manager.h"
#include "kv_layout.h"
#include "model_loader.h"
#include "nb_status.h"
#include "sampling.h"

typedef enum nb_fwd_mode {
    NB_FWD_TARGET = 0, // target weights, both nibbles of quantized KV
    NB_FWD_DRAFT = 1,  // draft weights (4-bit by default), upper nibbles by default
} nb_fwd_mode;

// Precision of the target's linear layers.
typedef enum nb_target_weights {
    NB_TARGET_WEIGHTS_MODEL = 0, // the checkpoint's own dtype (exact)
    NB_TARGET_WEIGHTS_INT8 = 1,  // hierarchical 8-bit: 16*U + L, the draft reading U
} nb_target_weights;

// What the backend makes of a sequence's logit rows besides the logits and
// argmax: tokens, sampled where the logits are (on the GPU for the cuda
// backend) with sampling.h's reference semantics and counters. A logit row
// at position t decides the token at t + 1, and that position is its counter.
// Greedy sequences (temperature 0) get the argmax and exact-match acceptance.
typedef enum nb_fwd_sample {
    NB_FWD_SAMPLE_NONE = 0, // logits/argmax only
    NB_FWD_SAMPLE_TARGET,   // each logit row: a token from nb_ref_probs(sp), rng stream 2
    NB_FWD_SAMPLE_DRAFT,    // one logit row: q = nb_ref_probs(sp) is kept in the sequence's
                            // draft slot (slot, draft_step); a token from q, rng stream 0
    NB_FWD_SAMPLE_VERIFY,   // gamma + 1 = n_logits rows, target distributions p;
                            // nb_ref_spec_accept against drafts[0..gamma) and the q kept
                            // at (slot, 0..gamma), counter0 = the first logit row's
                            // position + 1
} nb_fwd_sample;

typedef struct nb_fwd_seq {
    nb_bm_seq_view view;   // the sequence's blocks, including the new rows' slots
    int32_t pos0;          // absolute position of the first new row
    int32_t n_rows;        // new rows; their KV is written by this pass
    const int32_t *tokens; // [n_rows] input token ids
    int32_t n_logits;      // logits wanted for the last n_logits rows (0..n_rows)
    // Sampling (optional; zero = NB_FWD_SAMPLE_NONE):
    nb_fwd_sample sample;
    const nb_sampling_params *sp; // valid (temperature >= 0, top_k >= 0, top_p in (0, 1])
    int32_t slot;                 // draft slot, [0, bm max_seqs): the engine's sequence id
    int32_t draft_step;           // DRAFT: [0, max_gamma)
    const int32_t *drafts;        // VERIFY: [n_logits - 1]
} nb_fwd_seq;

typedef struct nb_fwd_batch {
    nb_fwd_mode mode;
    int32_t n_seqs;
    const nb_fwd_seq *seqs; // [n_seqs]
    float *logits;          // [sum of n_logits][vocab] f32, in sequence order (out)
    // Greedy outputs (optional): when argmax is not NULL it receives
    // nb_ref_argmax of each logit row ([sum of n_logits], -1 for a row with
    // no non-NaN logit), computed where the logits are (on the GPU for the
    // cuda backend); with skip_logits the logits need not be written at all
    // (the cuda backend then downloads 4 bytes per row instead of 4V).
    int32_t *argmax;
    bool skip_logits;
    // Sampling outputs, in logit-row order ([sum of n_logits]; needed when a
    // sequence asks for sampling): TARGET/DRAFT rows get their token, or -1
    // when the row's logits hold NaN/+inf or are all -inf; a VERIFY
    // sequence's rows get the accepted drafts then the correction/bonus
    // (n_accepted + 1 tokens). n_accepted ([n_seqs]) is set for VERIFY
    // sequences: the accepted drafts, or NB_ERR_NON_FINITE (negative) when a
    // target row cannot be sampled.
    int32_t *sampled;
    int32_t *n_accepted;
} nb_fwd_batch;

typedef struct nb_backend_config {
    const nb_model *model;       // borrowed; outlives the backend
    nb_kv_layout layout;         // the cache the backend allocates (pool sizes included)
    const nb_bm_params *bm;      // the block manager's parameters (G, quantize)
    int32_t max_rows;            // most rows in one forward pass (over all sequences)
    int32_t max_seq_len;         // tokens, for attention scratch
    nb_target_weights target_weights;
    bool draft_w4;               // the draft uses 4-bit weights (false: the target's)
    nb_kv_view draft_view;       // how the draft reads quantized KV (ablation: TARGET)
    int32_t max_logit_rows;      // most logit rows in one pass (0: max_rows)
    int32_t max_gamma;           // draft slots per sequence for sampled drafting (0: none)
    int device;                  // cuda: the device ordinal
    bool cuda_graphs;            // cuda: replay step passes from CUDA graphs
    bool host_sampling;          // cuda: sample on the host from downloaded logits with the
                                 // reference functions (the twin of the device sampler)
    bool draft_batch_invariant;  // cuda: draft passes row invariant too (else batch-tuned attention)
} nb_backend_config;

// Passes whose sequences all have at most this many rows (draft, verify with
// gamma <= 16, decode) are "step" passes: the cuda backend computes each row
// independently of the others (backend_cuda.c, row invariance).
#define NB_CUDA_STEP_ROWS 17

typedef struct nb_backend nb_backend;

typedef struct nb_backend_ops {
    const char *name;
    // One forward pass. Returns NB_OK; NB_ERR_INVALID_ARG (too many rows, a
    // token id outside the vocabulary); NB_ERR_BACKEND. err gets a message.
    nb_status (*forward)(nb_backend *be, const nb_fwd_batch *b, char *err, size_t err_len);
    // Executes block-manager work items in order. Returns NB_OK,
    // NB_ERR_NON_FINITE (KV to quantize held NaN/Inf), NB_ERR_BACKEND.
    nb_status (*exec_work)(nb_backend *be, const nb_bm_work *items, int32_t n);
    // Bytes of weights the backend holds beyond the checkpoint's own mapping
    // (quantized copies), and bytes of KV pools.
    size_t (*weight_bytes)(const nb_backend *be);
    size_t (*kv_bytes)(const nb_backend *be);
    void (*destroy)(nb_backend *be);
} nb_backend_ops;

struct nb_backend {
    const nb_backend_ops *ops;
};

// Creates the cpu backend: quantizes the draft (and INT8 target) weights,
// allocates the KV pools and the workspace. Caller owns the result; destroy
// with be->ops->destroy(be). Returns NB_OK; NB_ERR_OUT_OF_MEMORY;
// NB_ERR_NON_FINITE (a weight is NaN/Inf); NB_ERR_INVALID_ARG.
nb_status nb_backend_cpu_new(const nb_backend_config *cfg, nb_backend **out, char *err,
                             size_t err_len);

// The cpu backend's KV pools (host memory), for tests that inspect the cache.
const nb_kv_pools *nb_backend_cpu_pools(const nb_backend *be);

// The cuda backend (backend_cuda.c; in builds with CUDA only, NB_HAVE_CUDA).
// Uploads the weights (and their quantized copies), allocates the workspace
// and the KV pools of cfg->layout on device cfg->device. Returns NB_OK;
// NB_ERR_OUT_OF_MEMORY (device or host memory; the message says how much);
// NB_ERR_BACKEND (no device, CUDA/cuBLAS failure); NB_ERR_INVALID_ARG;
// NB_ERR_UNSUPPORTED (head_dim); NB_ERR_NON_FINITE (a weight is NaN/Inf).
nb_status nb_backend_cuda_new(const nb_backend_config *cfg, nb_backend **out, char *err,
                              size_t err_len);

// Memory planning (before the block manager exists): device bytes the cuda
// backend would allocate for cfg besides the KV pools (weights, quantized
// copies, workspace, staging, plus an allowance for cuBLAS), and the
// device's free and total memory now. cfg->layout's pool sizes are ignored.
nb_status nb_backend_cuda_plan(const nb_backend_config *cfg, size_t *static_bytes, size_t *free_bytes,
                               size_t *total_bytes, char *err, size_t err_len);

// The cuda backend's KV pools (device pointers), for tests.
nb_status nb_backend_cuda_pools(const nb_backend *be, nb_kv_pools *pools);

// How many layers of the cuda backend keep the draft's gate|up copy in the
// SwiGLU layout (one launch for gate|up and SwiGLU per draft layer; see
// backend_cuda.c's swiglu_stage), for tests and benchmarks; -1 for a
// backend that is not the cuda one.
int nb_backend_cuda_swiglu_layers(const nb_backend *be);
// The same for the q|k|v copy in the RoPE layout (q|k|v projection, RoPE
// and KV write in one launch per draft layer; backend_cuda.c's rope_stage).
int nb_backend_cuda_rope_layers(const nb_backend *be);
// The same for the dense gate|up copy in the SwiGLU layout (gate|up and
// SwiGLU in one launch per layer of the target's step passes;
// backend_cuda.c's dense_swiglu_stage).
int nb_backend_cuda_dense_swiglu_layers(const nb_backend *be);
// The layers whose dense q|k|v takes RoPE and the KV write in its
// row-invariant matmul's reduction (backend_cuda.c's dense_rope_stage: the
// target's step passes); the same answer for every layer.
int nb_backend_cuda_dense_rope_layers(const nb_backend *be);
// How many RMSNorms the cuda backend has scaled after the fused draft
// matmul they feed instead of launching them (backend_cuda.c's post_stage:
// the o or down projection adds its residual and leaves the norm's
// unscaled input; nb_cuda_matmul_wq_res), counted as their launches are
// enqueued (a pass replayed from a CUDA graph adds none); -1 for another
// backend.
long nb_backend_cuda_norm_posts(const nb_backend *be);

// Pass timing for benchmarks: with on, every later forward records CUDA
// events at the start and the end of its device work (metadata upload to
// result download), and the totals restart. nb_backend_cuda_pass_times
// returns the device time inside forwards (busy), the time the device spent
// between the end of one forward and the start of the next (gap: host work,
// launches, synchronizations, and any KV work items in between) and the
// number of forwards timed. NB_ERR_INVALID_ARG for a backend that is not
// the cuda one (times are then 0).
nb_status nb_backend_cuda_pass_timing(nb_backend *be, int on);
void nb_backend_cuda_pass_times(const nb_backend *be, double *busy_ms, double *gap_ms, long *n);

#endif // NB_BACKEND_H
