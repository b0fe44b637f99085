// block_manager.h: the host-side paged block allocator of nibbler's
// hierarchical KV cache. Pure C: no CUDA, no I/O, never touches KV data.
//
// The one idea: every sequence's tokens live in two regions.
//   [0, n_qblocks*G)            full groups in QUANTIZED blocks (immutable,
//                               shareable, registered in the prefix cache)
//   [n_qblocks*G, n_tokens)     the FULL-PRECISION region: a short list of FP
//                               blocks, fp[0] = C_F1, fp[1] = C_F2, fp[2..] =
//                               spill for drafted tokens / prefill chunks.
// After every commit + flush the FP region holds between G and 2G-1 committed
// tokens (fewer only while the whole sequence is shorter than G), so the most
// recent >= G tokens stay exact. When C_F2 fills, C_F1 is quantized into a
// new quantized block and dropped from the list: the paper's double buffer
// moves by a pointer shift, no copy.
//
// The manager plans; the engine executes. Operations that need data to move
// append work items (quantize f->q, dequantize q->f, copy f->f') to a
// caller-provided list. The engine must execute the items IN ORDER, before the
// next forward pass and before the items of any later operation: a block
// freed by an item may already have been handed to a later operation.
//
// Pre-quantization keeps the cache precision a query sees a function of its
// position alone: a row at position p reads groups < nb_bm_qblocks_for_tokens(p)
// quantized, in target-only decoding and in a verify pass alike. When an append
// puts a token at or past (n_qblocks+2)*G, C_F1 (already committed, so final)
// is quantized at once into the block its flush will later adopt
// (view.prequant_block); rows at those positions read it instead of C_F1.
// Each committed group is still quantized exactly once.
//
// Every operation either succeeds or returns a status with the manager's state
// unchanged (running out of blocks is NB_ERR_NO_FREE_BLOCKS, never a crash).
#ifndef NB_BLOCK_MANAGER_H
#define NB_BLOCK_MANAGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_bm nb_bm_t;

typedef struct nb_bm_params {
    int32_t group_size;   // G, tokens per block (serving uses 64, 128 or 256; 1..4096 accepted)
    int32_t n_qblocks;    // quantized pool size, blocks
    int32_t n_fpblocks;   // full-precision pool size, blocks
    int32_t max_seqs;     // sequence table size
    int32_t max_seq_len;  // tokens per sequence, committed + drafted
    int32_t max_append;   // most tokens one append may add, and most drafted tokens pending
    bool quantize;        // false: unquantized cache mode (every token stays in FP blocks)
    bool prefix_cache;    // register full quantized blocks by token-chain hash and reuse them
    uint64_t cache_salt;  // model + quantization settings, mixed into every prefix hash
    size_t qblock_bytes;  // bytes of one quantized block (all layers), for capacity figures
    size_t fpblock_bytes; // bytes of one FP block (all layers), for capacity figures
} nb_bm_params;

// Defaults: G=128, 1024 quantized and 256 FP blocks, 64 sequences, 8192
// tokens, max_append 512, quantize and prefix cache on, zero byte sizes.
nb_bm_params nb_bm_default_params(void);

// Fewest FP blocks one sequence can hold at once: ceil((2G + max_append)/G) + 1.
int32_t nb_bm_fp_blocks_per_seq_max(const nb_bm_params *p);

// An FP pool size that cannot run short for a caller that works in passes,
// as nibbler's engine does: between passes every committed append has been
// flushed and each sequence holds at most max_pending drafted tokens; one
// pass appends at most pass_rows tokens over all its sequences (adopted
// prefix blocks not counted). Every sequence's FP region then holds at most
// 2G - 1 + max_pending tokens outside a pass, and a sequence appending n in a
// pass at most n more, so with base = the per-sequence figure for appends of
// max(max_pending, G) tokens (which leaves each sequence one block spare):
//   max_seqs * base + ceil(pass_rows / G)
// (the derivation is in block_manager.c). Quantized mode only; without
// quantization every token stays in FP blocks and this returns max_seqs *
// nb_bm_fp_blocks_per_seq_max(p). Uses p's group_size, max_seqs, quantize
// and max_seq_len; returns -1 for arguments out of range or a result past
// INT32_MAX.
int32_t nb_bm_fp_pool_blocks(const nb_bm_params *p, int32_t max_pending, int32_t pass_rows);

// Creates a manager; all records and tables are allocated here, once.
// Returns NULL on invalid parameters or allocation failure; if err is
// non-NULL it receives a message. Caller owns the result: nb_bm_destroy().
nb_bm_t *nb_bm_new(const nb_bm_params *p, char *err, size_t err_len);

// Frees everything. Accepts NULL; sets *bm_p = NULL.
void nb_bm_destroy(nb_bm_t **bm_p);

const nb_bm_params *nb_bm_params_get(const nb_bm_t *bm);

// ---------------------------------------------------------------------------
// Work items
// ---------------------------------------------------------------------------

typedef enum nb_bm_work_kind {
    NB_BM_WORK_QUANTIZE = 0,   // FP block src (G tokens) -> quantized block dst
    NB_BM_WORK_DEQUANTIZE = 1, // quantized block src -> FP block dst (target view)
    NB_BM_WORK_COPY = 2,       // first n_tokens of FP block src -> FP block dst
} nb_bm_work_kind;

typedef struct nb_bm_work {
    nb_bm_work_kind kind;
    int32_t src;      // block id in the src kind's pool
    int32_t dst;      // block id in the dst kind's pool
    int32_t n_tokens; // tokens to move (G for quantize/dequantize)
} nb_bm_work;

// A caller-owned list; operations append to items[n..cap). An operation
// whose worst case does not fit returns NB_ERR_INVALID_ARG, state unchanged.
typedef struct nb_bm_work_list {
    nb_bm_work *items;
    int32_t n;
    int32_t cap;
} nb_bm_work_list;

// Most items a single operation can append (size lists from this).
int32_t nb_bm_work_max_per_op(const nb_bm_t *bm);

// ---------------------------------------------------------------------------
// Sequences. A sequence is a slot index in [0, max_seqs).
// ---------------------------------------------------------------------------

typedef enum nb_bm_append_kind {
    NB_BM_COMMITTED = 0, // KV the target writes (prefill chunk, target decode)
    NB_BM_DRAFTED = 1,   // KV the draft writes, pending until accept
} nb_bm_append_kind;

// Adds an empty sequence. *seq receives its slot.
// Returns NB_OK or NB_ERR_TOO_MANY_SEQS.
nb_status nb_bm_seq_add(nb_bm_t *bm, int32_t *seq);

// Appends n tokens (ids in tokens[0..n)) to the sequence, allocating FP
// blocks for their KV and reserving the quantized blocks their later flush
// will need, and pre-quantizes C_F1 if a new token reaches (n_qblocks+2)*G.
// If n_cached is non-NULL, the sequence is empty, the prefix cache is on and
// kind is COMMITTED, the longest cached prefix of tokens is adopted instead
// of computed: *n_cached receives how many leading tokens need no forward
// pass (a multiple of G, always leaving >= G tokens to compute). Pass NULL
// when every token must be computed (e.g. scoring needs every row's logits).
// The limit max_append applies to the tokens actually added (n - *n_cached),
// so a whole long prompt may be passed to the first append.
// COMMITTED requires no pending drafts; both kinds require the previous
// commit to have been flushed. A write into a shared FP block plans a COPY.
// Returns NB_OK, NB_ERR_NOT_FOUND (seq), NB_ERR_INVALID_ARG (n < 1,
// more than max_append tokens to add, work list too small), NB_ERR_STATE (pending drafts for a
// committed append, or a flush is due), NB_ERR_CONTEXT_TOO_LONG,
// NB_ERR_NO_FREE_BLOCKS.
nb_status nb_bm_seq_append(nb_bm_t *bm, int32_t seq, const int32_t *tokens, int32_t n,
                           nb_bm_append_kind kind, int32_t *n_cached, nb_bm_work_list *work);

// How many leading tokens of a prompt the prefix cache holds now (what a
// first committed append of these tokens would adopt). Read-only.
int32_t nb_bm_prefix_lookup(const nb_bm_t *bm, const int32_t *tokens, int32_t n);

// Call after the forward pass that wrote committed KV: plans QUANTIZE for
// every full group beyond the double buffer (or reuses an identical cached
// block) and shifts the FP list. Never fails for lack of blocks (they were
// reserved at append). Returns NB_OK, NB_ERR_NOT_FOUND, NB_ERR_INVALID_ARG
// (work list too small).
nb_status nb_bm_seq_flush(nb_bm_t *bm, int32_t seq, nb_bm_work_list *work);

// Verify's outcome: the first n_accept pending tokens become committed, the
// rest are discarded (their KV is dropped, never quantized), then flushes.
// Returns NB_OK, NB_ERR_NOT_FOUND, NB_ERR_INVALID_ARG (n_accept < 0 or
// > pending, work list too small).
nb_status nb_bm_seq_accept(nb_bm_t *bm, int32_t seq, int32_t n_accept, nb_bm_work_list *work);

// Truncates the sequence to its first n committed tokens (pending drafts are
// discarded). Inside the FP region this is O(1); deeper, the group(s) that
// become the new FP region are DEQUANTIZED into fresh FP blocks and later
// quantized blocks released, so the state equals that of a sequence that
// only ever committed n tokens (dequantized tokens carry INT8 precision).
// Returns NB_OK, NB_ERR_NOT_FOUND, NB_ERR_INVALID_ARG (n < 0 or n >
// committed, work list too small), NB_ERR_NO_FREE_BLOCKS.
nb_status nb_bm_seq_rollback(nb_bm_t *bm, int32_t seq, int32_t n, nb_bm_work_list *work);

// Releases every block of the sequence and its slot. Returns NB_OK or NB_ERR_NOT_FOUND.
nb_status nb_bm_seq_free(nb_bm_t *bm, int32_t seq);

// Adds a sequence *child sharing parent's committed tokens: quantized blocks
// and FP blocks are shared by reference (FP blocks copy-on-write at the next
// write). Pending drafts are not inherited. If the parent has drafts, its pending
// slots may lie in a block it now shares with the child; the parent's verify
// rewrites them there, beyond the child's tokens, which the child never reads. Returns NB_OK, NB_ERR_NOT_FOUND,
// NB_ERR_TOO_MANY_SEQS, NB_ERR_NO_FREE_BLOCKS (flush reservation).
nb_status nb_bm_seq_fork(nb_bm_t *bm, int32_t parent, int32_t *child);

// What the engine needs to run a forward pass over the sequence. Pointers
// stay valid until the next operation on this sequence.
typedef struct nb_bm_seq_view {
    int32_t n_committed;      // tokens whose KV the target wrote
    int32_t n_drafted;        // pending tokens after them
    int32_t n_qblocks;        // quantized region = tokens [0, n_qblocks*G)
    const int32_t *qblocks;   // [n_qblocks] quantized block ids
    int32_t n_fpblocks;       // FP region = tokens [n_qblocks*G, n_committed+n_drafted)
    const int32_t *fpblocks;  // [n_fpblocks] FP block ids, C_F1 first
    const int32_t *tokens;    // [n_committed + n_drafted] token ids
    int32_t prequant_block;   // quantized copy of fpblocks[0] (group n_qblocks), or -1
} nb_bm_seq_view;

// Quantized blocks a query row at position pos reads, given the view: groups
// [0, result) come from qblocks (then prequant_block), the rest from FP blocks
// (FP region starting at result*G, at fpblocks[result - n_qblocks]).
int32_t nb_bm_view_qblocks_for_row(const nb_bm_params *p, const nb_bm_seq_view *v, int32_t pos);

// Returns NB_OK or NB_ERR_NOT_FOUND.
nb_status nb_bm_seq_view_get(const nb_bm_t *bm, int32_t seq, nb_bm_seq_view *v);

// True when a committed append or accept left groups to quantize.
bool nb_bm_seq_flush_due(const nb_bm_t *bm, int32_t seq);

// ---------------------------------------------------------------------------
// Capacity, for a scheduler
// ---------------------------------------------------------------------------

typedef struct nb_bm_stats {
    int32_t n_qblocks_total;
    int32_t n_qblocks_free;     // allocatable now: unused + evictable cached, minus reserved
    int32_t n_qblocks_cached;   // unreferenced blocks kept for prefix reuse (evictable)
    int32_t n_qblocks_reserved; // promised to pending flushes
    int32_t n_fpblocks_total;
    int32_t n_fpblocks_free;
    int32_t n_seqs;
    int64_t n_prefix_hits;      // blocks adopted from the prefix cache (cumulative)
    int64_t n_evictions;        // cached blocks evicted for reuse (cumulative)
    double qbytes_per_token;    // quantized block bytes / G
    double fpbytes_per_token;   // FP block bytes / G
} nb_bm_stats;

void nb_bm_stats_get(const nb_bm_t *bm, nb_bm_stats *s);

// Whether a new sequence of n_tokens could be prefilled (in chunks of at
// most max_append) and then run one round of gamma drafts + verify (gamma + 1
// pending tokens, so gamma + 1 <= max_append is required; the bonus token is
// counted), with the blocks free now and no prefix reuse assumed. Conservative.
bool nb_bm_can_admit(const nb_bm_t *bm, int32_t n_tokens, int32_t gamma);

// Quantized blocks a sequence of n committed (flushed) tokens holds:
// 0 below 2G tokens, else floor(n/G) - 1. Without quantization, 0.
int32_t nb_bm_qblocks_for_tokens(const nb_bm_params *p, int32_t n);

// Reference count of a block (tests and stats). -1 for a bad id.
int32_t nb_bm_qblock_refcount(const nb_bm_t *bm, int32_t block);
int32_t nb_bm_fpblock_refcount(const nb_bm_t *bm, int32_t block);

// Full consistency check (free lists, refcounts recomputed from every
// sequence, hash table, reservations). Returns NB_OK or NB_ERR_INTERNAL with
// a message in err. O(pool + tokens): for tests, not the hot path.
nb_status nb_bm_check(const nb_bm_t *bm, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif // NB_BLOCK_MANAGER_H
