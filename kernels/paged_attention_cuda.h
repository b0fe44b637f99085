// paged_attention_cuda.h: paged decode / verify attention over nibbler's
// hierarchical KV cache, for a batch of sequences at one layer (the CUDA twin
// of nb_ref_paged_attention as the cpu backend's attend() drives it).
//
// The one idea: flash-decoding. Each CTA owns (sequence, kv head, chunk of
// whole blocks) and ALL query vectors that read that kv head (rows x the
// q heads of the GQA group), so every K/V byte is loaded from memory once per
// (sequence, kv head, chunk); chunks write an unnormalized partial (o, max,
// sum) and a second small kernel merges them exactly by log-sum-exp.
// Quantized K is never dequantized element by element: with per-channel
// (S_c, Z_c), q.k = sum_c (q_c S_c) U_tc + sum_c q_c Z_c, so the CTA folds S
// into q once per block (S/16 and C8 = 16U + L for the target view); V's
// per-token (S_t, Z_t) fold into the softmax weights the same way. The DRAFT
// view never touches the lower plane (its kernel has no code that reads it).
//
// Three kernels share that plan. Decode and short verify (rows x GQA group
// <= 8 query vectors per kv head, D 64 or 128, f16/bf16, G % 32 == 0,
// 16-byte aligned pools): either the scalar decode kernel (a warp per
// 32-token slice; K: lane = token, integer dot products; V: lanes split D;
// f32 FMAs) or, for D = 128, the tensor-core kernel
// (paged_attention_tc.cuh: bulk async copies into per-warp mbarrier rings,
// mma.sync on nibble codes turned into exact f16 subnormals, q*S split hi +
// lo). The tensor-core kernel takes every view of models with >= 2 query
// heads per kv head and the draft / FP-only views with 1, and with the
// row-invariant split, or on a device with >= 30 GB/s of DRAM bandwidth per
// SM (an H200; not an H100 SXM), the target view with 1 too (its FP-only
// view on f16 caches only), and row-invariant target-view entries of 9-16 query
// vectors (verify rows at GQA >= 2; nb_pa_step_entry_vectors);
// NB_PA_TC=0 / 1 in the environment forces the scalar /
// tensor-core kernel where both apply. More query vectors (prefill chunks)
// at D = 128, G % 32 == 0, f16/bf16, target or FP-only view: a
// tensor-core prefill kernel: where G % 64 == 0 warpgroup MMAs with a
// producer warpgroup, which dequantizes the target view's tiles to f16
// values, or copies them from the prefill stage where the caller passes
// one (nb_pa_args.stage: dequantized once per call by a kernel of their
// own; paged_attention_prefill_wg.cuh; prefill is compute-bound there),
// else FlashAttention-2 tiles on mma.sync with the code-domain folds
// (paged_attention_prefill.cuh; NB_PA_PF=1 forces it, NB_PA_PF=0 the
// scalar one). Everything else (the draft view with many rows, other D /
// G, f32): the cp.async tile kernel.
//
// Which positions a query row reads quantized (nb_bm_view_qblocks_for_row,
// replicated on the device): with canonical(p) = p >= 2G ? p/G - 1 : 0, a row
// at position p reads groups [0, nq_row) quantized where nq_row =
// n_qblocks + 1 if has_prequant and canonical(p) > n_qblocks, else
// n_qblocks; group n_qblocks is then the pre-quantized C_F1 (the table entry
// after the n_qblocks ids). Positions nq_row*G .. p come from FP blocks,
// starting at FP table index nq_row - n_qblocks.
//
// Pointers are DEVICE pointers unless said otherwise; nothing is allocated
// (the caller passes the workspace); every launch goes to `stream`.
#ifndef NB_PAGED_ATTENTION_CUDA_H
#define NB_PAGED_ATTENTION_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kv_layout.h"
#include "nb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

// What a call reads from quantized blocks.
typedef enum nb_pa_mode {
    NB_PA_DRAFT = 0,   // upper plane + scales (U*S + Z)
    NB_PA_TARGET = 1,  // both planes + scales ((16U + L)*S/16 + Z)
    NB_PA_FP_ONLY = 2, // unquantized cache: every position from FP blocks
                       // (n_qblocks and has_prequant are ignored, taken as 0)
} nb_pa_mode;

// One sequence of the batch (an array of these lives in device memory).
typedef struct nb_pa_seq {
    int32_t qblock_off;   // index in qblock_ids of this sequence's first id
    int32_t n_qblocks;    // quantized blocks (view.n_qblocks), positions [0, n_qblocks*G)
    int32_t has_prequant; // 1: qblock_ids[qblock_off + n_qblocks] is the pre-quantized C_F1
    int32_t fpblock_off;  // index in fpblock_ids of this sequence's FP table (C_F1 first)
    int32_t n_tokens;     // tokens in the cache (committed + drafted), >= pos0 + n_rows
    int32_t pos0;         // position of query row 0
    int32_t n_rows;       // query rows, >= 1; row r is at pos0 + r and reads positions <= pos0 + r
    int32_t row_off;      // index of row 0 in q and out
} nb_pa_seq;

typedef struct nb_pa_args {
    nb_kv_layout lay;         // cache layout (D, G, dtype, pool sizes); D even
    nb_kv_pools pools;        // device pools; lower may be NULL for DRAFT, upper/scales for FP_ONLY
    int32_t layer;            // 0 .. n_layers-1
    nb_pa_mode mode;
    int32_t n_q_heads;        // a positive multiple of lay.n_kv_heads; q head h reads kv head h/(n_q_heads/n_kv_heads)
    float softmax_scale;      // usually 1/sqrt(D)
    int32_t n_seqs;           // >= 1
    const nb_pa_seq *seqs;    // device [n_seqs]
    const int32_t *qblock_ids;  // device, per sequence [n_qblocks + has_prequant] quantized block ids
    const int32_t *fpblock_ids; // device, per sequence [ceil((pos0 + n_rows - nq_min*G)/G)] FP block ids
    int32_t max_rows;         // host bound: n_rows <= max_rows for every sequence
    int32_t max_tokens;       // host bound: pos0 + n_rows <= max_tokens for every sequence
    const float *q;           // device [sum n_rows][n_q_heads][D] f32 queries
    float *out;               // device [sum n_rows][n_q_heads][D] f32 (out), normalized; NULL with out_cvt
    // When not NULL, the output goes here instead of out, converted to
    // out_cvt_dt (F16 or BF16, round to nearest even as nb_f32_to_f16 /
    // nb_f32_to_bf16; with out_cvt_sat, F16 only, as nb_f32_to_f16_sat): the
    // input of the next linear layer without a conversion pass of its own.
    void *out_cvt;            // device [sum n_rows][n_q_heads][D] out_cvt_dt, or NULL
    nb_dtype out_cvt_dt;
    int32_t out_cvt_sat;
    void *workspace;          // device, nb_pa_workspace_size(...) bytes, 16-byte aligned
    size_t workspace_bytes;
    int32_t max_chunks;       // the max_chunks the workspace was sized for (split-K upper bound)
    // 0: split-K tuned to the batch (fastest). > 0: ROW-INVARIANT split: chunk
    // c holds the groups [c*fixed_chunk_groups, (c+1)*fixed_chunk_groups) by
    // position, every chunk goes through the merge, and each row's output is
    // a function of its own query, position and cache contents only: equal,
    // bit for bit, whatever the other rows, sequences, n_rows, pos_end,
    // max_tokens (the grid: chunks past a sequence's end are empty) or
    // pre-quantization bookkeeping of the call. This is what makes a verify
    // row equal the target-only decode row at the same position (greedy
    // speculative == greedy target-only on the GPU). Needs the decode kernel
    // (max_rows * n_q_heads/n_kv_heads <= nb_pa_step_entry_vectors(), D
    // 64/128, f16/bf16, G % 32 == 0, aligned pools; else
    // NB_ERR_UNSUPPORTED) and ceil(ceil(max_tokens/G) / fixed_chunk_groups)
    // <= max_chunks (else NB_ERR_INVALID_ARG). Callers split longer verify
    // rows into several nb_pa_seq entries.
    int32_t fixed_chunk_groups;
    // Nonzero: no kernel that may still run when this call's kernel starts
    // writes seqs, the block tables or the quantized pools: the kernel
    // enqueued just before it and, when that one was itself launched with
    // programmatic serialization and triggers before its wait, the ones
    // before it (in the engine: RoPE + KV write, the q|k|v projection and
    // the RMSNorm's tail, which write q, k, v, FP blocks and activations;
    // in draft passes with the RoPE layout, nb_cuda_matmul_wq_rope, which
    // writes q and FP blocks, and the RMSNorm's tail).
    // The tensor-core decode kernel is then launched with programmatic
    // stream serialization: its CTAs may start early and copy their first
    // quantized tiles before they wait for the kernel before them. Same
    // results either way. 0: an ordinary launch.
    int32_t pdl;
    // Optional (NULL: unused): the prefill stage. A target-view call that
    // takes the warpgroup prefill kernel (more than 8 query vectors per kv
    // head, fixed_chunk_groups 0, D = 128, G % 64 == 0, f16/bf16) first
    // dequantizes every quantized group its rows read (n_qblocks, and the
    // pre-quantized C_F1) into f16 here, once, and the kernel then reads
    // them as FP tiles: without it every CTA that reads a group (one per
    // 128 query vectors of each kv head) dequantizes it again in its
    // producer warps. The same f16 values either way, so the same output
    // bits. Used when stage_bytes >= nb_pa_prefill_stage_size(&lay, n_seqs,
    // max_tokens) and an entry has more than 896 query vectors per kv head
    // (8 CTAs of 128; with fewer the producers' repeated work costs less
    // than the stage's extra bytes); else the producer dequantizes.
    // 16-byte aligned.
    // NB_PA_PF_STAGE=0 / 1 in the environment: never / whatever the call's
    // size (read per call).
    void *stage;
    size_t stage_bytes;
} nb_pa_args;

// Query vectors (rows x n_q_heads/n_kv_heads) per entry to cut a
// row-invariant call's rows into. 8, or up to 24 for the target view at
// D = 128 on f16/bf16 caches with G % 32 == 0 and >= 2 query heads per kv
// head (the tensor-core kernel with two or three query tiles per CTA: an
// entry of up to 16 or 24 vectors reads each cached byte once).
// live_ctas[t - 1]: the call's CTAs when its rows are cut into entries of
// 8t vectors (entries x n_kv_heads x grid chunks that hold positions):
//   - 8 when live_ctas[0] <= one CTA per SM: below a wave the narrow
//     entries' extra CTAs run side by side, and a two-tile CTA takes ~1.4x
//     as long as a one-tile one;
//   - else 24 or 16, whichever takes fewer waves (ceil(CTAs / SMs)), 24 on
//     a tie, a three-tile CTA counted as 1.75 two-tile ones (H100, docs/benchmarks.md,
//     session 33: a 5-row verify at GQA 4 in one three-tile entry against a
//     two-tile and a one-tile one is 14-15% faster at batch 8 from 16k, but
//     1.3% slower in the engine at batch 8 4k (3 waves against 5) and 2.5%
//     at batch 1 16k (136 CTAs: 2 waves against 3)).
// live_ctas NULL: the most any call gets (for sizing). 0 for bad
// arguments. A row's bits are the same whatever the cut. NB_PA_TC=0,
// NB_PA_TC_CPS=2 or NB_PA_TC_WIDE=0 in the environment (tests, benchmarks)
// make it 8; NB_PA_TC_WIDE=1 16 (24 with NB_PA_TC_TILES=3) where the wide
// kernel applies, whatever the grid; past the one-wave rule
// NB_PA_TC_TILES=2 takes 16 and =3 24. Read per call.
int32_t nb_pa_step_entry_vectors(const nb_kv_layout *lay, nb_pa_mode mode, int32_t n_q_heads,
                                 const int64_t live_ctas[3]);

// Bytes of workspace for batches of up to n_seqs sequences of up to max_rows
// rows, split into at most max_chunks chunks (64 is a good value; 1 disables
// split-K and the merge kernel).
size_t nb_pa_workspace_size(int32_t n_seqs, int32_t max_rows, int32_t n_q_heads, int32_t head_dim,
                            int32_t max_chunks);

// Bytes of the prefill stage (nb_pa_args.stage) for calls of up to n_seqs
// sequences ending at or before max_tokens: per sequence ceil(max_tokens /
// G) + 1 groups of K and V, f16, [seq][group][kv head][K | V][G][D]. 0 for
// bad arguments.
size_t nb_pa_prefill_stage_size(const nb_kv_layout *lay, int32_t n_seqs, int32_t max_tokens);

// The row-invariant split a serving engine uses for its step passes
// (worker/backend_cuda.c; bench_attention_cuda --split step reproduces it):
// chunks of *chunk_groups = ceil(ceil(max_seq_len / G) / max_chunks) groups,
// at least 2 and at least min_chunk_tokens tokens, *n_chunks of them over
// max_seq_len, and for a call whose entries end at or before max_tokens,
// *grid_tokens: the max_tokens to pass (the chunks up to max_tokens rounded
// up to a power of two, at most n_chunks: a bounded number of grid shapes,
// no CTAs past the batch).
// The engine's min_chunk_tokens, so an engine with a short max_seq_len cuts
// chunks as one for 128k does (2,048 tokens): 256-token chunks made the
// decode kernel's per-CTA prologue dominate (session 22), and against
// 1,024 tokens, 2,048 make batch-8 rounds 5-7% faster from 16k (fewer walk
// boundaries and verify CTAs) for 0.5-2% at batch 1 up to 16k (fewer CTAs);
// docs/decisions.md, session 46. NB_PA_STEP_MIN_TOKENS overrides it (the
// engine and bench_attention_cuda read it).
#define NB_PA_STEP_MIN_CHUNK_TOKENS 2048
static inline void nb_pa_step_split(int32_t max_seq_len, int32_t G, int32_t max_chunks, int32_t min_chunk_tokens,
                                    int32_t max_tokens, int32_t *chunk_groups, int32_t *n_chunks,
                                    int32_t *grid_tokens) {
    const int32_t groups = (max_seq_len + G - 1) / G;
    int32_t cg = (groups + max_chunks - 1) / max_chunks;
    if (cg < 2) cg = 2;
    if (cg * G < min_chunk_tokens) cg = (min_chunk_tokens + G - 1) / G;
    const int32_t nall = (groups + cg - 1) / cg;
    int32_t nc = 1;
    while (nc * cg * G < max_tokens && nc < nall) nc <<= 1;
    if (nc > nall) nc = nall;
    *chunk_groups = cg;
    *n_chunks = nall;
    *grid_tokens = nc * cg * G;
}

// Runs attention for every row of every sequence of the batch at one layer.
// Returns NB_OK (launched); NB_ERR_INVALID_ARG (invalid layout, layer, mode,
// head counts, bounds, NULL pointer, workspace too small); NB_ERR_UNSUPPORTED
// (D too large for the shared-memory plan, > 512); NB_ERR_BACKEND (a CUDA
// call failed). Out-of-range block ids are a caller bug and are not checked.
nb_status nb_pa_attention(const nb_pa_args *a, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif // NB_PAGED_ATTENTION_CUDA_H
