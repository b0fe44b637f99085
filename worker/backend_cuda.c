// backend_cuda.c: the cuda backend, the same Llama forward pass as
// backend_cpu.c on one GPU, built from the CUDA kernels in kernels/*.cu.
//
// The one idea: everything a forward pass needs is allocated once, at
// creation (weights, quantized weight copies, activation workspace, KV
// pools, pinned staging), so a step is one upload of the step's metadata
// (tokens, positions, KV slots, block tables), a fixed sequence of kernel
// launches on one stream, and one download of the logits. No cudaMalloc on
// the hot path.
//
// Row invariance. Greedy speculative decoding must emit exactly the tokens
// greedy target-only decoding emits (ARCHITECTURE.md), so a row's logits
// must not depend on how many rows share its pass: a verify row at position
// p must equal the decode row at p bit for bit. Passes whose sequences all
// have <= NB_CUDA_STEP_ROWS rows (draft, verify, decode) therefore run in
// "step" mode:
//   - dense linear layers (f16/bf16 weights) run on the row-invariant dense
//     matmul (nb_cuda_matmul_dense_ri: a summation order fixed by the
//     matrix, one weight pass per 64 rows), so a 40-row verify reads the
//     weights once; quantized layers (and dense ones it does not take) run
//     on fixed 16-row slices (padded for cuBLAS), so cuBLAS and the
//     quantized kernels see the same shape whatever the batch;
//   - attention uses the row-invariant split of nb_pa_attention
//     (fixed_chunk_groups), each sequence's rows cut into entries of at most
//     8/(n_heads/n_kv_heads) rows (target-view passes: up to 24/(ratio),
//     nb_pa_step_entry_vectors, so a verify of 5 rows at GQA 4 reads the
//     cache once where the three-tile CTAs take fewer waves, else twice,
//     never three times).
//     Draft passes take the batch-tuned split
//     (the row-invariant one takes 7-32% longer on the draft view at
//     >= 32k, docs/benchmarks.md) unless cfg.draft_batch_invariant: a draft only proposes tokens, the
//     verify pass decides them (greedy output is the target's either way),
//     and verify rewrites the drafted positions' KV; what the option keeps
//     is that a SAMPLED sequence's tokens do not depend on its batch.
// Longer passes (prefill chunks) use full-size GEMMs and the batch-tuned
// attention split; both runs of a comparison prefill identically.
// Step mode needs the decode attention kernel (head_dim 64/128, f16/bf16
// cache, G % 32 == 0, GQA ratio <= 8); other models run everything in the
// batch-tuned mode and are correct but not row-invariant.
#include "nb_status.h"
#include <jemalloc/jemalloc.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend.h"
#include "kv_cache_cuda.h"
#include "linear_cuda.h"
#include "ops_cuda.h"
#include "ops_ref.h"
#include "paged_attention_cuda.h"
#include "sample_host.h"
#include "sampling_cuda.h"
#include "wquant.h"

#define STEP_SLICE 16       // rows per linear-layer slice in step mode (cuBLAS, quantized)
#define NB_POST_ROWS 16     // passes of up to this many rows scale their draft norms after the matmul (norm_post)
#define RI_SLICE 64         // rows per call of the row-invariant dense matmul (step mode)
#define ATTN_MAX_CHUNKS 64  // split-K chunks at most (both modes)
#define WORK_BATCH 1024     // KV work items per upload
#define BLAS_WS ((size_t)32 << 20) // cuBLAS workspace

typedef struct dlin {
    int m, k;
    const void *w;    // dense [m][k] in be->adt (device), or NULL
    nb_cuda_wq q;     // device planes and sz; q.upper NULL when there is no quantized copy
    const void *bias; // device [m] bias_dt, or NULL
    nb_dtype bias_dt;
    // A draft-only quantized copy whose rows are moved for a fused epilogue
    // (w keeps model order): gate|up in nb_cuda_wq_swiglu_row order for
    // nb_cuda_matmul_wq_swiglu, q|k|v in nb_cuda_wq_rope_row order for
    // nb_cuda_matmul_wq_rope.
    bool swiglu, rope;
    // The dense copy of gate|up in the same SwiGLU row order, for
    // nb_cuda_matmul_dense_ri_swiglu (the target's step passes); other
    // passes' matmuls write gate|up in that order for
    // nb_cuda_silu_mul_cvt_moved.
    bool dswiglu;
} dlin;

typedef struct dlayer {
    dlin wq, wk, wv, wo, gate, up, down;
    dlin qkv, gu; // the fused projections (be->fqkv / be->fgu): wq|wk|wv and gate|up rows
    const void *attn_norm, *ffn_norm; // device, model dtype
    nb_dtype attn_norm_dt, ffn_norm_dt;
} dlayer;

typedef struct upload_ent {
    const void *host;
    nb_dtype dt;
    void *dev;
} upload_ent;

typedef struct meta_off {
    size_t tok, pos, kvb, kvs, lrow, ent, qt, ft, end;
} meta_off;

// Sampling metadata, rows j in [0, LR) and verify sequences v in [0, MS).
typedef struct samp_off {
    size_t sp, seed, cnt, vseed, vc0, in_row, out_row, vprow, vqrow, vgam, vdraft, end;
} samp_off;

static samp_off samp_layout(int LR, int MS, int MG) {
    samp_off o;
    size_t a = 0;
    o.sp = a; a += (size_t)LR * sizeof(nb_sampling_params);
    o.seed = a; a += (size_t)LR * 8;
    o.cnt = a; a += (size_t)LR * 8;
    o.vseed = a; a += (size_t)MS * 8;
    o.vc0 = a; a += (size_t)MS * 8;
    o.in_row = a; a += (size_t)LR * 4;
    o.out_row = a; a += (size_t)LR * 4;
    o.vprow = a; a += (size_t)MS * 4;
    o.vqrow = a; a += (size_t)MS * 4;
    o.vgam = a; a += (size_t)MS * 4;
    o.vdraft = a; a += (size_t)MS * (MG > 0 ? MG : 1) * 4;
    o.end = a;
    return o;
}

// Fixed for a backend (offsets do not depend on the pass, so a captured graph
// stays valid): tok, pos, kvb, kvs [R], lrow [LR], ent [R], qt, ft [tab].
static meta_off meta_layout(int R, int LR, int tab) {
    meta_off o;
    size_t a = 0;
    o.tok = a; a += (size_t)R * 4;
    o.pos = a; a += (size_t)R * 4;
    o.kvb = a; a += (size_t)R * 4;
    o.kvs = a; a += (size_t)R * 4;
    o.lrow = a; a += (size_t)LR * 4;
    a = (a + 15) & ~(size_t)15;
    o.ent = a; a += (size_t)R * sizeof(nb_pa_seq);
    o.qt = a; a += (size_t)tab * 4;
    o.ft = a; a += (size_t)tab * 4;
    o.end = (a + 15) & ~(size_t)15;
    return o;
}

#define CK(expr, what)                                                                           \
    do {                                                                                         \
        nb_status st_ = (expr);                                                                  \
        if (st_ != NB_OK) {                                                                      \
            nb_set_err(err, err_len, "forward: %s failed (%s): %s", what, nb_status_str(st_),    \
                       cudaGetErrorString(cudaGetLastError()));                                  \
            return st_ == NB_ERR_INVALID_ARG ? NB_ERR_INTERNAL : st_;                            \
        }                                                                                        \
    } while (0)

#define GRAPH_CACHE 48

typedef struct graph_key {
    int mode, R, n_ent, ent_rows, n_logits, attn_tokens;
} graph_key;

typedef struct graph_ent {
    graph_key key;
    bool used;
    uint64_t last_use;
    cudaGraphExec_t exec; // NULL until captured (the second pass of this shape)
} graph_ent;

typedef struct cuda_backend {
    nb_backend base;
    nb_backend_config cfg;
    const nb_model_config *mc;
    const nb_model_weights *mw;
    cudaStream_t stream;
    cublasHandle_t blas;
    nb_dtype adt;  // dense weights and their activations (f32, f16 or bf16)
    nb_dtype qxdt; // activations of the 8-bit view's kernels (f16 or bf16; the 4-bit view: qx_of)
    dlayer *layers;
    dlin lm_head;
    const void *embd, *out_norm;
    nb_dtype embd_dt, out_norm_dt;
    float *inv_freq; // device [D/2]
    float *rope_cs;  // device [Rp][D/2][2]: a pass's RoPE (cos, sin) (nb_cuda_rope_table), filled
                     // when a layer of the pass takes rope_stage or dense_rope_stage; else NULL
    int rope_layer;  // the first layer whose q|k|v is in the RoPE layout, or -1
    bool drope;      // step passes on the dense q|k|v take RoPE + KV write in its reduction
                     // (dense_rope_stage; the table then too)
    nb_kv_layout lay;
    nb_kv_pools pools; // device
    // every device allocation, freed at destroy; counting only (dry run) when plan_only
    void **allocs;
    int n_allocs, cap_allocs;
    bool plan_only;
    size_t dev_bytes, weight_bytes, wq_bytes, kv_bytes;
    upload_ent *uploads;
    int n_uploads, cap_uploads;
    // workspace: Rp = max_rows rounded up to STEP_SLICE, LRp likewise for logit rows
    int Rp, LRp, maxk;
    float *x, *xb, *q, *k, *v, *att, *gate, *up, *tmp, *xl, *logits;
    // The RMSNorm scaled after the fused draft matmul instead of launched
    // (norm_post; NB_NORM_POST=0: off): the o / down projection before it
    // adds its output into x and stores x * w as f16 (xs) and its blocks'
    // partial sums of x^2 (part), which the fused matmul after it reads
    // (nb_cuda_matmul_wq_res, _swiglu_rs, _rope_rs). The target's step
    // passes likewise on the row-invariant dense matmuls (dnorm_post;
    // NB_DENSE_NORM_POST=0: off): xs in adt, part [R][nb_cuda_dr_parts(H)]
    // (nb_cuda_matmul_dense_ri_res, _swiglu_rs, _rope_rs). xs and part
    // hold max(NB_POST_ROWS, Rp) rows.
    uint16_t *xs;
    float *part;
    bool norm_post, dnorm_post;
    long norm_posts; // such norms enqueued (nb_backend_cuda_norm_posts)
    float *qkv;        // [Rp][Hq + 2*Hkv] fused q/k/v projection output (fqkv)
    bool fqkv, fgu;    // q/k/v and gate/up run as one matmul each (every layer)
    void *xa_d, *xa_q; // converted inputs of the dense / quantized linear layers
    void *attn_ws;
    size_t attn_ws_bytes;
    void *pf_stage;    // the prefill stage (nb_pa_args.stage), pf_stage_bytes; NULL: none
    size_t pf_stage_bytes;
    bool ri_on;        // step-mode dense layers on nb_cuda_matmul_dense_ri (else cuBLAS slices)
    void *ri_ws;       // its workspace (k-split partial sums), ri_ws_bytes
    size_t ri_ws_bytes;
    int step_ok;       // step mode available (decode attention kernel usable)
    int entry_rows;    // rows per attention entry in step mode: 8 / GQA ratio
    int entry_rows_tgt; // the same for target-view passes (nb_pa_step_entry_vectors: up to 16 / ratio)
    int step_min_tokens; // the step split's smallest chunk (nb_pa_step_split)
    // per-pass metadata: pinned host staging + device copy
    size_t meta_bytes;
    uint8_t *meta_h, *meta_d;
    int32_t tab_cap; // block-table ids per pass
    float *logits_h; // pinned [LRp][V]
    int32_t *argmax_d, *argmax_h; // [LRp]: greedy tokens (device, pinned host)
    meta_off mo;
    // Pass timing (nb_backend_cuda_pass_timing): events recorded at the
    // start and the end of each forward's device work; tm_prev is the
    // previous forward's end event (index into tm_ev), or -1.
    bool tm_on;
    cudaEvent_t tm_ev[3];
    int tm_prev, tm_beg;
    double tm_busy_ms, tm_gap_ms;
    long tm_n;
    graph_ent graphs[GRAPH_CACHE];
    uint64_t clock;
    int n_graphs;
    void *blas_ws;
    int32_t *work_h, *work_d; // [4][WORK_BATCH]: src, dst, n_tokens, status
    // Sampling requests (backend.h): greedy ones on the host from the argmax;
    // temperature > 0 on the device (or, host_sampling, on the host).
    nb_host_sampler hs;
    int32_t n_slots, max_gamma;
    float *qstore;                // [n_slots * max_gamma][V] draft distributions (device)
    samp_off so;
    uint8_t *smeta_h, *smeta_d;   // sampling metadata (pinned host, device)
    int32_t *sres_h, *sres_d;     // results: tok, status [LRp], vout [n_slots][max_gamma+1], nacc [n_slots]
    int32_t *samp_j, *samp_v;     // [n_slots] per sequence of a pass: first row index, verify index
} cuda_backend;

static nb_status cuda_fail(char *err, size_t err_len, const char *what, cudaError_t e) {
    nb_set_err(err, err_len, "cuda backend: %s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? NB_ERR_OUT_OF_MEMORY : NB_ERR_BACKEND;
}

// Device allocation, recorded for destroy (or only counted in a dry run).
static nb_status dev_alloc(cuda_backend *be, void **p, size_t bytes, char *err, size_t err_len) {
    bytes = (bytes + 255) & ~(size_t)255;
    if (bytes == 0) bytes = 256;
    be->dev_bytes += bytes;
    if (be->plan_only) {
        *p = NULL;
        return NB_OK;
    }
    if (be->n_allocs == be->cap_allocs) {
        int cap = be->cap_allocs ? 2 * be->cap_allocs : 64;
        void **a = realloc(be->allocs, (size_t)cap * sizeof(void *));
        if (!a) {
            nb_set_err(err, err_len, "cuda backend: out of host memory");
            return NB_ERR_OUT_OF_MEMORY;
        }
        be->allocs = a;
        be->cap_allocs = cap;
    }
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof(what), "cudaMalloc of %zu bytes (%.2f GiB allocated before it)", bytes,
                 (double)(be->dev_bytes - bytes) / (1 << 30));
        return cuda_fail(err, err_len, what, e);
    }
    be->allocs[be->n_allocs++] = *p;
    return NB_OK;
}

static nb_status h2d(cuda_backend *be, void *dst, const void *src, size_t bytes, char *err,
                     size_t err_len) {
    if (be->plan_only || bytes == 0) return NB_OK;
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? NB_OK : cuda_fail(err, err_len, "upload", e);
}

// A checkpoint tensor on the device in dtype dt (converted on the host when
// it differs), uploaded once per (tensor, dtype): tied embeddings share it.
// Uploads the first n elements of t to dst (device) in dtype dt, converted
// on the host when t's dtype differs.
static nb_status h2d_as(cuda_backend *be, void *dst, const nb_tensor_view *t, size_t n, nb_dtype dt,
                        char *err, size_t err_len) {
    const size_t bytes = n * nb_dtype_size(dt);
    if (t->dtype == dt) return h2d(be, dst, t->data, bytes, err, err_len);
    void *tmp = malloc(bytes);
    if (!tmp) {
        nb_set_err(err, err_len, "cuda backend: out of host memory converting %s", t->name);
        return NB_ERR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < n; i++) nb_store_f32(tmp, dt, i, nb_load_f32(t->data, t->dtype, i));
    nb_status st = h2d(be, dst, tmp, bytes, err, err_len);
    free(tmp);
    return st;
}

static nb_status upload_tensor(cuda_backend *be, const nb_tensor_view *t, nb_dtype dt,
                               const void **out, char *err, size_t err_len) {
    for (int i = 0; i < be->n_uploads; i++)
        if (be->uploads[i].host == t->data && be->uploads[i].dt == dt) {
            *out = be->uploads[i].dev;
            return NB_OK;
        }
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    size_t bytes = n * nb_dtype_size(dt);
    void *dev = NULL;
    nb_status st = dev_alloc(be, &dev, bytes, err, err_len);
    if (st != NB_OK) return st;
    be->weight_bytes += bytes;
    if (!be->plan_only && (st = h2d_as(be, dev, t, n, dt, err, err_len)) != NB_OK) return st;
    if (be->n_uploads == be->cap_uploads) {
        int cap = be->cap_uploads ? 2 * be->cap_uploads : 64;
        upload_ent *u = realloc(be->uploads, (size_t)cap * sizeof(*u));
        if (!u) {
            nb_set_err(err, err_len, "cuda backend: out of host memory");
            return NB_ERR_OUT_OF_MEMORY;
        }
        be->uploads = u;
        be->cap_uploads = cap;
    }
    be->uploads[be->n_uploads++] = (upload_ent){.host = t->data, .dt = dt, .dev = dev};
    *out = dev;
    return NB_OK;
}

// Which kernel computes a linear layer (the cpu backend's lin_apply rule).
typedef enum { LIN_DENSE = 0, LIN_Q4 = 1, LIN_Q8 = 2 } lin_path;

static lin_path path_of(const cuda_backend *be, const dlin *L, nb_fwd_mode mode) {
    if (mode == NB_FWD_DRAFT && be->cfg.draft_w4 && L->q.upper) return LIN_Q4;
    if (be->cfg.target_weights == NB_TARGET_WEIGHTS_INT8 && L->q.lower) return LIN_Q8;
    return LIN_DENSE;
}

// The device buffer of L's quantized copy (L->m, L->k set): the upper
// plane, the lower plane when int8, then sz, in the kernels' layouts
// (linear_cuda.h). Under plan_only the pointers are placeholders (non-NULL:
// the path rule needs to see a copy).
static nb_status lin_alloc_q(cuda_backend *be, dlin *L, bool int8, char *err, size_t err_len) {
    const size_t pb = nb_cuda_wq_plane_bytes(L->m, L->k), planes = pb * (int8 ? 2 : 1);
    const size_t bytes = planes + nb_cuda_wq_sz_elems(L->m, L->k) * sizeof(uint16_t);
    void *dev = NULL;
    nb_status st = dev_alloc(be, &dev, bytes, err, err_len);
    if (st != NB_OK) return st;
    be->wq_bytes += bytes;
    uint8_t *d = dev;
    L->q.upper = d;
    L->q.lower = int8 ? d + pb : NULL;
    L->q.sz = (const uint16_t *)(d + planes);
    if (be->plan_only) {
        L->q.upper = (const uint8_t *)1;
        L->q.lower = int8 ? (const uint8_t *)1 : NULL;
    }
    return NB_OK;
}

// The quantized copy of a matrix made of np parts stacked by rows (np = 1:
// one matrix) into its device buffer (L->q: the upper plane, the lower
// plane when int8, then sz, one piece). Each part is quantized by the
// reference function (nb_wq_quantize), its rows moved where dlin.swiglu or
// dlin.rope say (nb_cuda_wq_swiglu_row; nb_cuda_wq_rope_row of head_dim D),
// and the whole matrix packed into the kernels' layouts (linear_cuda.h: the
// planes are tile-major in 32-row tiles, so parts are packed together, not
// one by one) and uploaded at once.
static nb_status lin_put_q(cuda_backend *be, const dlin *L, const nb_tensor_view *const *w, int np, int D,
                           char *err, size_t err_len) {
    const int k = L->k, m = L->m;
    const bool int8 = L->q.lower != NULL;
    const size_t nplanes = int8 ? 2 : 1;
    size_t plane = 0, ng = 0, pmax = 0;
    nb_status st = nb_wq_sizes(m, k, &plane, &ng);
    if (st != NB_OK || m == 0) return st;
    for (int i = 0; i < np; i++)
        if ((size_t)w[i]->shape[0] > pmax) pmax = (size_t)w[i]->shape[0];
    const size_t rowb = (size_t)k / 2, gpr = ng / (size_t)m, szn = nb_cuda_wq_sz_elems(m, k);
    const size_t pb = nb_cuda_wq_plane_bytes(m, k), bytes = pb * nplanes + szn * sizeof(uint16_t);
    // rm: the whole matrix in wquant.h's layouts, rows moved; tmp: one part
    // as quantized (planes, scales, zeros), unless a single matrix in its
    // own row order is quantized straight into rm; h: what is uploaded.
    const bool direct = np == 1 && !L->swiglu && !L->rope;
    uint8_t *tmp = direct ? NULL : malloc(pmax * rowb * nplanes + 2 * pmax * gpr * sizeof(uint16_t));
    uint8_t *rm = malloc(plane * nplanes + 2 * ng * sizeof(uint16_t));
    uint8_t *h = malloc(bytes);
    if ((!direct && !tmp) || !rm || !h) {
        free(tmp);
        free(rm);
        free(h);
        nb_set_err(err, err_len, "cuda backend: out of host memory quantizing %s", w[0]->name);
        return NB_ERR_OUT_OF_MEMORY;
    }
    uint16_t *hs = (uint16_t *)(rm + plane * nplanes);
    if (direct) {
        st = nb_wq_quantize(w[0]->data, w[0]->dtype, m, k, rm, int8 ? rm + plane : NULL, hs, hs + ng);
        if (st != NB_OK)
            nb_set_err(err, err_len, "cuda backend: cannot quantize %s: %s", w[0]->name, nb_status_str(st));
    }
    uint8_t *tlo = !direct && int8 ? tmp + pmax * rowb : NULL;
    uint16_t *ts = direct ? NULL : (uint16_t *)(tmp + pmax * rowb * nplanes);
    for (int pi = 0, r0 = 0; !direct && pi < np && st == NB_OK; r0 += (int)w[pi]->shape[0], pi++) {
        const int mp = (int)w[pi]->shape[0];
        const size_t png = (size_t)mp * gpr;
        st = nb_wq_quantize(w[pi]->data, w[pi]->dtype, mp, k, tmp, tlo, ts, ts + png);
        if (st != NB_OK) {
            nb_set_err(err, err_len, "cuda backend: cannot quantize %s: %s", w[pi]->name, nb_status_str(st));
            break;
        }
        for (int j = 0; j < mp; j++) {
            const size_t r = (size_t)(L->swiglu ? nb_cuda_wq_swiglu_row(j, pi)
                                      : L->rope ? nb_cuda_wq_rope_row(r0 + j, D)
                                                : r0 + j);
            memcpy(rm + r * rowb, tmp + (size_t)j * rowb, rowb);
            if (int8) memcpy(rm + plane + r * rowb, tlo + (size_t)j * rowb, rowb);
            memcpy(hs + r * gpr, ts + (size_t)j * gpr, gpr * sizeof(uint16_t));
            memcpy(hs + ng + r * gpr, ts + png + (size_t)j * gpr, gpr * sizeof(uint16_t));
        }
    }
    if (st == NB_OK) {
        st = nb_cuda_wq_pack_plane(h, rm, m, k);
        if (st == NB_OK && int8) st = nb_cuda_wq_pack_plane(h + pb, rm + plane, m, k);
        if (st == NB_OK) st = nb_cuda_wq_pack_sz((uint16_t *)(h + pb * nplanes), hs, hs + ng, m, k);
        if (st != NB_OK) nb_set_err(err, err_len, "cuda backend: cannot repack %s: %s", w[0]->name, nb_status_str(st));
    }
    if (st == NB_OK) st = h2d(be, (uint8_t *)L->q.upper, h, bytes, err, err_len);
    free(tmp);
    free(rm);
    free(h);
    return st;
}

// Uploads one linear layer: the dense weights when some pass uses them, the
// hierarchical quantized copy (quantized on the host by the same reference
// function as the cpu backend, so both backends hold identical codes).
static nb_status lin_init(cuda_backend *be, dlin *L, const nb_tensor_view *w,
                          const nb_tensor_view *bias, char *err, size_t err_len) {
    memset(L, 0, sizeof(*L));
    L->m = (int)w->shape[0];
    L->k = (int)w->shape[1];
    const nb_backend_config *c = &be->cfg;
    bool int8 = c->target_weights == NB_TARGET_WEIGHTS_INT8;
    size_t plane = 0, n_groups = 0;
    bool quantizable = nb_wq_sizes(L->m, L->k, &plane, &n_groups) == NB_OK;
    bool want_q = quantizable && (c->draft_w4 || int8);
    nb_status st;
    if (!(int8 && quantizable)) {
        st = upload_tensor(be, w, be->adt, &L->w, err, err_len);
        if (st != NB_OK) return st;
    }
    if (bias && bias->data) {
        L->bias_dt = bias->dtype;
        st = upload_tensor(be, bias, bias->dtype, &L->bias, err, err_len);
        if (st != NB_OK) return st;
    }
    if (!want_q) return NB_OK;
    if ((st = lin_alloc_q(be, L, int8, err, err_len)) != NB_OK || be->plan_only) return st;
    return lin_put_q(be, L, &w, 1, 0, err, err_len);
}

// Rows [r0, r0 + m) of a fused projection: the dense copy (converted to
// be->adt) and the bias of part w, at their offsets. (The quantized copy
// is packed for all parts at once: lin_put_q.)
static nb_status lin_put_part(cuda_backend *be, const dlin *L, const nb_tensor_view *w, const nb_tensor_view *b,
                              int r0, char *err, size_t err_len) {
    const int m = (int)w->shape[0], k = L->k;
    nb_status st = NB_OK;
    if (L->w && !L->dswiglu &&
        (st = h2d_as(be, (uint8_t *)L->w + (size_t)r0 * k * nb_dtype_size(be->adt), w, (size_t)m * k, be->adt,
                     err, err_len)) != NB_OK)
        return st;
    if (L->bias && (st = h2d_as(be, (uint8_t *)L->bias + (size_t)r0 * nb_dtype_size(L->bias_dt), b, (size_t)m,
                                L->bias_dt, err, err_len)) != NB_OK)
        return st;
    return NB_OK;
}

// Whether environment variable `name` is set to "0..." (a switch turned off).
static bool env_off(const char *name) {
    const char *e = getenv(name);
    return e && e[0] == '0';
}

// The dense copy of gate|up (parts w[0], w[1] of I rows each) in the
// SwiGLU row order (nb_cuda_wq_swiglu_row), uploaded in pieces of up to
// 256 16-row tiles staged on the host in the checkpoint's dtype.
static nb_status lin_put_dense_moved(cuda_backend *be, const dlin *L, const nb_tensor_view *const *w, char *err,
                                     size_t err_len) {
    const int k = L->k, tiles = L->m / 16;
    const nb_dtype sdt = w[0]->dtype;
    const size_t es = nb_dtype_size(sdt), run = (size_t)8 * k * es, piece = 256;
    if (w[1]->dtype != sdt) return NB_ERR_INTERNAL;
    uint8_t *h = malloc(piece * 2 * run);
    if (!h) {
        nb_set_err(err, err_len, "cuda backend: out of host memory moving %s", w[0]->name);
        return NB_ERR_OUT_OF_MEMORY;
    }
    nb_status st = NB_OK;
    for (int t0 = 0; t0 < tiles && st == NB_OK; t0 += (int)piece) {
        const int nt = tiles - t0 < (int)piece ? tiles - t0 : (int)piece;
        for (int t = 0; t < nt; t++)
            for (int up = 0; up < 2; up++)
                memcpy(h + ((size_t)t * 2 + up) * run, (const uint8_t *)w[up]->data + (size_t)(t0 + t) * run, run);
        const nb_tensor_view v = {h, sdt, {(int64_t)nt * 16, k}, 2, w[0]->name};
        st = h2d_as(be, (uint8_t *)L->w + (size_t)t0 * 16 * k * nb_dtype_size(be->adt), &v, (size_t)nt * 16 * k,
                    be->adt, err, err_len);
    }
    free(h);
    return st;
}

// One linear layer made of np parts stacked by rows (q|k|v, gate|up): one
// matmul instead of np launches. The caller checked lin_fusable().
// swiglu_ok: gate|up whose down projection has a draft copy; dswiglu_ok:
// gate|up whose down projection has a dense copy; rope_D > 0: q|k|v of
// heads of rope_D (n_heads, n_kv_heads) whose cache the RoPE epilogue can
// write.
static nb_status lin_init_cat(cuda_backend *be, dlin *L, const nb_tensor_view *const *w,
                              const nb_tensor_view *const *b, int np, bool swiglu_ok, bool dswiglu_ok, int rope_D,
                              char *err, size_t err_len) {
    memset(L, 0, sizeof(*L));
    for (int i = 0; i < np; i++) L->m += (int)w[i]->shape[0];
    L->k = (int)w[0]->shape[1];
    const nb_backend_config *c = &be->cfg;
    const bool int8 = c->target_weights == NB_TARGET_WEIGHTS_INT8;
    size_t plane = 0;
    const bool quantizable = nb_wq_sizes(L->m, L->k, &plane, NULL) == NB_OK;
    const bool want_q = quantizable && (c->draft_w4 || int8);
    // gate|up in the SwiGLU layout when its quantized copy serves the draft
    // alone (the target reads the dense copy): one launch for gate|up and
    // SwiGLU in every draft pass. NB_WQ_SWIGLU=0 in the environment keeps
    // the model's row order (benchmarks compare; the same bits either way).
    const bool draft_only = want_q && !int8 && c->draft_w4 && !(b[0] && b[0]->data);
    L->swiglu = swiglu_ok && draft_only && np == 2 && w[0]->shape[0] == w[1]->shape[0] &&
                w[0]->shape[0] % 8 == 0 && nb_cuda_matmul_wq_swiglu_supported(L->m, L->k) &&
                !env_off("NB_WQ_SWIGLU");
    // The same for q|k|v and RoPE + KV write (NB_WQ_ROPE=0: model order).
    L->rope = rope_D > 0 && draft_only && np == 3 &&
              nb_cuda_matmul_wq_rope_supported(L->m, L->k, (int)w[0]->shape[0] / rope_D,
                                               (int)w[1]->shape[0] / rope_D, rope_D) &&
              w[1]->shape[0] == w[2]->shape[0] && w[0]->shape[0] % rope_D == 0 && w[1]->shape[0] % rope_D == 0 &&
              !env_off("NB_WQ_ROPE");
    // The dense copy of gate|up in the SwiGLU layout where the target's
    // step passes can take nb_cuda_matmul_dense_ri_swiglu (f16/bf16, no
    // bias, a dense down projection). NB_DENSE_SWIGLU=0 keeps the model's
    // order (the same bits either way).
    const bool pairs = np == 2 && w[0]->shape[0] == w[1]->shape[0] && w[0]->shape[0] % 8 == 0 &&
                       w[0]->dtype == w[1]->dtype;
    L->dswiglu = dswiglu_ok && pairs && !(int8 && quantizable) && !(b[0] && b[0]->data) &&
                 nb_cuda_matmul_dense_ri_supported(be->adt, L->k) && !env_off("NB_DENSE_SWIGLU");
    nb_status st;
    void *dev = NULL;
    if (!(int8 && quantizable)) {
        const size_t bytes = (size_t)L->m * L->k * nb_dtype_size(be->adt);
        if ((st = dev_alloc(be, &dev, bytes, err, err_len)) != NB_OK) return st;
        be->weight_bytes += bytes;
        L->w = dev;
    }
    if (b[0] && b[0]->data) {
        L->bias_dt = b[0]->dtype;
        const size_t bytes = (size_t)L->m * nb_dtype_size(L->bias_dt);
        if ((st = dev_alloc(be, &dev, bytes, err, err_len)) != NB_OK) return st;
        be->weight_bytes += bytes;
        L->bias = dev;
    }
    if (want_q && (st = lin_alloc_q(be, L, int8, err, err_len)) != NB_OK) return st;
    if (be->plan_only) return NB_OK;
    for (int i = 0, r0 = 0; i < np; r0 += (int)w[i]->shape[0], i++)
        if ((st = lin_put_part(be, L, w[i], b[i], r0, err, err_len)) != NB_OK) return st;
    if (L->dswiglu && (st = lin_put_dense_moved(be, L, w, err, err_len)) != NB_OK) return st;
    return want_q ? lin_put_q(be, L, w, np, rope_D, err, err_len) : NB_OK;
}

// Can parts w[0..np) (biases b) be one stacked matrix? Same k and dtype,
// every part but the last a whole number of 16-row tiles (the rule every
// fused path is tested under; lin_put_q packs the quantized copy whole, so
// it would not need it), biases all present with one dtype or all absent.
static bool lin_fusable(const nb_tensor_view *const *w, const nb_tensor_view *const *b, int np) {
    const bool has_b = b[0] && b[0]->data;
    for (int i = 0; i < np; i++) {
        if (w[i]->ndim != 2 || w[i]->shape[1] != w[0]->shape[1] || w[i]->dtype != w[0]->dtype) return false;
        if (i < np - 1 && w[i]->shape[0] % 16 != 0) return false;
        const bool hb = b[i] && b[i]->data;
        if (hb != has_b || (hb && b[i]->dtype != b[0]->dtype)) return false;
    }
    return true;
}

static void cuda_destroy(nb_backend *base) {
    cuda_backend *be = (cuda_backend *)base;
    if (!be) return;
    if (be->stream) cudaStreamSynchronize(be->stream);
    for (int i = 0; i < 3; i++)
        if (be->tm_ev[i]) cudaEventDestroy(be->tm_ev[i]);
    for (int i = 0; i < GRAPH_CACHE; i++)
        if (be->graphs[i].exec) cudaGraphExecDestroy(be->graphs[i].exec);
    for (int i = 0; i < be->n_allocs; i++) cudaFree(be->allocs[i]);
    free(be->allocs);
    free(be->uploads);
    free(be->layers);
    if (be->meta_h) cudaFreeHost(be->meta_h);
    if (be->logits_h) cudaFreeHost(be->logits_h);
    if (be->argmax_h) cudaFreeHost(be->argmax_h);
    if (be->work_h) cudaFreeHost(be->work_h);
    if (be->smeta_h) cudaFreeHost(be->smeta_h);
    if (be->sres_h) cudaFreeHost(be->sres_h);
    free(be->samp_j);
    free(be->samp_v);
    nb_host_sampler_free(&be->hs);
    if (be->blas) cublasDestroy(be->blas);
    if (be->stream) cudaStreamDestroy(be->stream);
    free(be);
}

static size_t cuda_weight_bytes(const nb_backend *base) {
    const cuda_backend *be = (const cuda_backend *)base;
    return be->weight_bytes + be->wq_bytes;
}
static size_t cuda_kv_bytes(const nb_backend *base) { return ((const cuda_backend *)base)->kv_bytes; }

// Synchronizes and turns a pending CUDA error into a status.
static nb_status sync_check(cuda_backend *be, const char *what, char *err, size_t err_len) {
    cudaError_t e = cudaStreamSynchronize(be->stream);
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? NB_OK : cuda_fail(err, err_len, what, e);
}

// Pass timing: tm_begin before a forward's first device operation, tm_end
// after its last one is enqueued, tm_account once the stream has synchronized.
static void tm_begin(cuda_backend *be) {
    if (!be->tm_on) return;
    be->tm_beg = be->tm_prev < 0 ? 0 : (be->tm_prev + 1) % 3;
    cudaEventRecord(be->tm_ev[be->tm_beg], be->stream);
}
static void tm_end(cuda_backend *be) {
    if (be->tm_on) cudaEventRecord(be->tm_ev[(be->tm_beg + 1) % 3], be->stream);
}
static void tm_account(cuda_backend *be) {
    if (!be->tm_on) return;
    const int end = (be->tm_beg + 1) % 3;
    float busy = 0.0f, gap = 0.0f;
    if (cudaEventElapsedTime(&busy, be->tm_ev[be->tm_beg], be->tm_ev[end]) != cudaSuccess) {
        cudaGetLastError();
        be->tm_prev = -1;
        return;
    }
    if (be->tm_prev >= 0 && cudaEventElapsedTime(&gap, be->tm_ev[be->tm_prev], be->tm_ev[be->tm_beg]) == cudaSuccess)
        be->tm_gap_ms += gap;
    cudaGetLastError();
    be->tm_busy_ms += busy;
    be->tm_n++;
    be->tm_prev = end;
}

// ---------------------------------------------------------------------------
// KV work items
// ---------------------------------------------------------------------------

// Pools (0 quantized, 1 FP) an item reads (src) and writes (dst).
static void work_pools(nb_bm_work_kind k, int *src_pool, int *dst_pool) {
    *src_pool = k == NB_BM_WORK_DEQUANTIZE ? 0 : 1;
    *dst_pool = k == NB_BM_WORK_QUANTIZE ? 0 : 1;
}

// True when item j touches a block an earlier item of [i0, j) writes, or
// writes a block one of them touches: such items must not share a launch.
static bool work_conflict(const nb_bm_work *it, int32_t i0, int32_t j) {
    int sj, dj;
    work_pools(it[j].kind, &sj, &dj);
    for (int32_t i = i0; i < j; i++) {
        int si, di;
        work_pools(it[i].kind, &si, &di);
        if ((di == dj && it[i].dst == it[j].dst) || (si == dj && it[i].src == it[j].dst) ||
            (di == sj && it[i].dst == it[j].src))
            return true;
    }
    return false;
}

static nb_status cuda_exec_work(nb_backend *base, const nb_bm_work *items, int32_t n) {
    cuda_backend *be = (cuda_backend *)base;
    char err[256];
    for (int32_t b0 = 0; b0 < n; b0 += WORK_BATCH) {
        int32_t nb = n - b0 < WORK_BATCH ? n - b0 : WORK_BATCH;
        int32_t *hs = be->work_h, *hd = hs + WORK_BATCH, *hn = hd + WORK_BATCH, *hst = hn + WORK_BATCH;
        for (int32_t i = 0; i < nb; i++) {
            hs[i] = items[b0 + i].src;
            hd[i] = items[b0 + i].dst;
            hn[i] = items[b0 + i].n_tokens;
            hst[i] = 0;
        }
        if (cudaMemcpyAsync(be->work_d, be->work_h, 4 * WORK_BATCH * sizeof(int32_t),
                            cudaMemcpyHostToDevice, be->stream) != cudaSuccess)
            return NB_ERR_BACKEND;
        int32_t *ds = be->work_d, *dd = ds + WORK_BATCH, *dn = dd + WORK_BATCH, *dst = dn + WORK_BATCH;
        for (int32_t i = 0; i < nb;) {
            int32_t j = i + 1;
            while (j < nb && j - i < 256 && items[b0 + j].kind == items[b0 + i].kind &&
                   !work_conflict(items + b0, i, j))
                j++;
            nb_status st = NB_ERR_INTERNAL;
            switch (items[b0 + i].kind) {
            case NB_BM_WORK_QUANTIZE:
                st = nb_kv_cuda_quantize_blocks(&be->lay, &be->pools, ds + i, dd + i, j - i, dst + i,
                                                be->stream);
                break;
            case NB_BM_WORK_DEQUANTIZE:
                st = nb_kv_cuda_dequantize_blocks(&be->lay, &be->pools, ds + i, dd + i, j - i, dst + i,
                                                  be->stream);
                break;
            case NB_BM_WORK_COPY:
                st = nb_kv_cuda_copy_fp_blocks(&be->lay, &be->pools, ds + i, dd + i, dn + i, j - i,
                                               dst + i, be->stream);
                break;
            }
            if (st != NB_OK) return st;
            i = j;
        }
        if (cudaMemcpyAsync(hst, dst, (size_t)nb * sizeof(int32_t), cudaMemcpyDeviceToHost,
                            be->stream) != cudaSuccess)
            return NB_ERR_BACKEND;
        nb_status st = sync_check(be, "KV work items", err, sizeof(err));
        if (st != NB_OK) {
            fprintf(stderr, "nibbler: %s\n", err);
            return st;
        }
        for (int32_t i = 0; i < nb; i++)
            if (hst[i] != NB_OK) return (nb_status)hst[i];
    }
    return NB_OK;
}

// ---------------------------------------------------------------------------
// forward
// ---------------------------------------------------------------------------

// The activations a quantized path reads. The 8-bit target view: qxdt (the
// model's 16-bit type). The 4-bit draft view: f16 whatever the model's type,
// because with f16 x its codes enter the tensor cores by masks alone
// (kernels/linear_cuda.cu) and bf16 x measured 15-22% slower at batch 1 on
// the Llama shapes (docs/benchmarks.md, session 17). A bf16 model's
// activations past f16's range are clamped to +-65504 there
// (nb_cuda_convert_f16_sat): that can only cost a draft acceptance, since
// every emitted token is the target's.
static nb_dtype qx_of(const cuda_backend *be, lin_path p) {
    return p == LIN_Q4 ? NB_DTYPE_F16 : be->qxdt;
}

// Converts the f32 input rows of a linear stage into the dtypes its layers
// read: *xd for dense layers (the f32 rows themselves when adt is f32), *xq
// for quantized ones (both quantized layers of a stage take the same path).
static nb_status stage_in(cuda_backend *be, const float *src, int n, int k, lin_path p0, lin_path p1,
                          const void **xd, const void **xq) {
    bool dense = p0 == LIN_DENSE || p1 == LIN_DENSE, quant = p0 != LIN_DENSE || p1 != LIN_DENSE;
    *xd = src;
    *xq = NULL;
    size_t cnt = (size_t)n * k;
    if (dense && be->adt != NB_DTYPE_F32) {
        nb_status st = nb_cuda_convert(be->xa_d, be->adt, src, NB_DTYPE_F32, cnt, be->stream);
        if (st != NB_OK) return st;
        *xd = be->xa_d;
    }
    if (quant) {
        const lin_path pq = p0 != LIN_DENSE ? p0 : p1;
        if (p0 != LIN_DENSE && p1 != LIN_DENSE && p0 != p1) return NB_ERR_INTERNAL;
        const nb_dtype qdt = qx_of(be, pq);
        nb_status st = NB_OK;
        if (dense && be->adt == qdt)
            *xq = *xd;
        else if (pq == LIN_Q4)
            st = nb_cuda_convert_f16_sat(be->xa_q, src, cnt, be->stream);
        else
            st = nb_cuda_convert(be->xa_q, qdt, src, NB_DTYPE_F32, cnt, be->stream);
        if (st != NB_OK) return st;
        if (!*xq) *xq = be->xa_q;
    }
    return NB_OK;
}

// Where a fused op (RMSNorm, SwiGLU) writes the input of a stage whose
// layers take paths p0 and p1: one converted copy when that serves every
// layer (the choices of stage_in), else the f32 rows (f32) for stage_in.
typedef struct stage_out {
    float *f32;
    nb_cuda_cvt cvt;
    bool generic; // call stage_in on f32 after the op
} stage_out;

static nb_status stage_plan(cuda_backend *be, float *f32, lin_path p0, lin_path p1, stage_out *o,
                            const void **xd, const void **xq) {
    const bool dense = p0 == LIN_DENSE || p1 == LIN_DENSE, quant = p0 != LIN_DENSE || p1 != LIN_DENSE;
    *o = (stage_out){NULL, {NULL, NB_DTYPE_F32, 0}, false};
    *xd = *xq = NULL;
    if (p0 != LIN_DENSE && p1 != LIN_DENSE && p0 != p1) return NB_ERR_INTERNAL;
    const lin_path pq = p0 != LIN_DENSE ? p0 : p1;
    const nb_dtype qdt = qx_of(be, pq);
    if (dense && be->adt == NB_DTYPE_F32) {
        o->f32 = f32;
        *xd = f32;
        if (quant) o->generic = true;
    } else if (dense) {
        o->cvt = (nb_cuda_cvt){be->xa_d, be->adt, 0};
        *xd = be->xa_d;
        if (quant && be->adt == qdt) *xq = be->xa_d; // as stage_in: the dense copy serves both
        else if (quant) o->f32 = f32, o->generic = true;
    } else {
        o->cvt = (nb_cuda_cvt){be->xa_q, qdt, pq == LIN_Q4};
        *xq = be->xa_q;
    }
    if (o->generic) o->f32 = f32, o->cvt.p = NULL;
    return NB_OK;
}

// x (+= res, when res) then RMSNorm into the inputs of a stage's layers.
static nb_status norm_stage(cuda_backend *be, const float *res, const void *w, nb_dtype wdt, int R,
                            lin_path p0, lin_path p1, const void **xd, const void **xq) {
    const int H = be->mc->hidden_size;
    stage_out o;
    nb_status st = stage_plan(be, be->xb, p0, p1, &o, xd, xq);
    if (st == NB_OK)
        st = nb_cuda_add_rmsnorm(be->x, res, w, wdt, R, H, be->mc->rms_norm_eps, o.f32, o.cvt, be->stream);
    if (st == NB_OK && o.generic) st = stage_in(be, be->xb, R, H, p0, p1, xd, xq);
    return st;
}

// SwiGLU of (strided) gate/up rows into the down projection's input;
// moved: gate|up rows [R][2I] in the SwiGLU row layout at gate (up unused).
static nb_status silu_stage(cuda_backend *be, const float *gate, const float *up, int stride, int R, bool moved,
                            lin_path p, const void **xd, const void **xq) {
    const int I = be->mc->intermediate_size;
    stage_out o;
    nb_status st = stage_plan(be, be->up, p, p, &o, xd, xq);
    if (st == NB_OK)
        st = moved ? nb_cuda_silu_mul_cvt_moved(o.f32, o.cvt, gate, R, I, be->stream)
                   : nb_cuda_silu_mul_cvt(o.f32, o.cvt, gate, up, stride, R, I, be->stream);
    if (st == NB_OK && o.generic) st = stage_in(be, be->up, R, I, p, p, xd, xq);
    return st;
}

// Whether step mode runs dense layer L on the row-invariant dense matmul.
static bool ri_takes(const cuda_backend *be, const dlin *L) {
    return be->ri_on && L->w && nb_cuda_matmul_dense_ri_supported(be->adt, L->k) &&
           ((uintptr_t)L->w & 15) == 0;
}

// out[n][m] f32 = x . W^T + bias. Step mode: dense layers take the
// row-invariant dense matmul in calls of up to RI_SLICE rows (one weight
// pass per call; a row's bits do not depend on the call's row count, see
// linear_cuda.h), or, where it does not apply (f32 weights, k % 64 != 0,
// NB_DENSE_RI=0), cuBLAS on STEP_SLICE-row slices padded to the full slice
// (cuBLAS picks its algorithm by shape); quantized layers take their exact
// rows in STEP_SLICE-row slices: nb_cuda_matmul_wq gives a row the same
// bits whatever the row count (tests/gpu/test_linear_cuda.cu checks it),
// and a slice of 1-16 rows streams the weights with the decode kernel.
static nb_status lin_run(cuda_backend *be, float *out, const void *xd, const void *xq, int n,
                         const dlin *L, nb_fwd_mode mode, bool step) {
    lin_path p = path_of(be, L, mode);
    nb_dtype xdt = p == LIN_DENSE ? be->adt : qx_of(be, p);
    const uint8_t *x = p == LIN_DENSE ? xd : xq;
    size_t xrow = (size_t)L->k * nb_dtype_size(xdt);
    if (step && p == LIN_DENSE && ri_takes(be, L)) {
        for (int r = 0; r < n; r += RI_SLICE) {
            const int rows = n - r < RI_SLICE ? n - r : RI_SLICE;
            nb_status st = nb_cuda_matmul_dense_ri(out + (size_t)r * L->m, NB_DTYPE_F32, x + (size_t)r * xrow,
                                                   L->w, be->adt, L->bias, L->bias_dt, rows, L->m, L->k,
                                                   be->ri_ws, be->ri_ws_bytes, be->stream);
            if (st != NB_OK) return st;
        }
        return NB_OK;
    }
    int n_calls = step ? (n + STEP_SLICE - 1) / STEP_SLICE : 1;
    for (int c = 0; c < n_calls; c++) {
        const void *xc = x + (size_t)c * STEP_SLICE * xrow;
        float *oc = out + (size_t)c * STEP_SLICE * L->m;
        int left = n - c * STEP_SLICE;
        int rows = !step ? n : p == LIN_DENSE || left > STEP_SLICE ? STEP_SLICE : left;
        nb_status st;
        if (p == LIN_DENSE)
            st = nb_cuda_matmul_dense(be->blas, oc, NB_DTYPE_F32, xc, L->w, be->adt, L->bias,
                                      L->bias_dt, rows, L->m, L->k, be->stream);
        else
            st = nb_cuda_matmul_wq(oc, NB_DTYPE_F32, xc, xdt, &L->q, p == LIN_Q8, L->bias,
                                   L->bias_dt, rows, L->m, L->k, NULL, 0, be->stream);
        if (st != NB_OK) return st;
    }
    return NB_OK;
}

// The draft's q|k|v projection, RoPE and KV write as one matmul (q|k|v in
// the RoPE layout, dlin.rope): q into be->q, k and v into the FP blocks,
// as lin_run + nb_cuda_rope_write_kv would store them
// (nb_cuda_matmul_wq_rope), with the pass's (cos, sin) table be->rope_cs
// (filled by run_pass before the first layer). Step mode takes
// STEP_SLICE-row slices.
static nb_status rope_stage(cuda_backend *be, const void *x, int n, const dlin *L, int layer,
                            const int32_t *fpblock, const int32_t *slot, bool step) {
    const nb_model_config *mc = be->mc;
    const int D = mc->head_dim, Hq = mc->n_heads * D;
    const nb_dtype dt = qx_of(be, LIN_Q4);
    const size_t xrow = (size_t)L->k * nb_dtype_size(dt);
    const int slice = step ? STEP_SLICE : (n > 0 ? n : 1);
    for (int r = 0; r < n; r += slice) {
        const int rows = n - r < slice ? n - r : slice;
        const nb_cuda_wq_rope rp = {be->q + (size_t)r * Hq, be->rope_cs + (size_t)r * D, be->pools.fp, fpblock + r,
                                    slot + r,                be->lay,                      layer,        mc->n_heads};
        nb_status st = nb_cuda_matmul_wq_rope((const uint8_t *)x + (size_t)r * xrow, dt, &L->q, 0, rows, L->m, L->k,
                                              &rp, be->stream);
        if (st != NB_OK) return st;
    }
    return NB_OK;
}

// The draft's gate|up projection and SwiGLU as one matmul (gate|up in the
// SwiGLU layout, dlin.swiglu), writing the down projection's quantized input
// as silu_stage would convert it (f16, saturating: stage_plan's copy for
// LIN_Q4), with the same bits (nb_cuda_matmul_wq_swiglu). It goes to
// be->gate, which the unfused path fills with the f32 gate|up rows: NOT to
// xa_q, where x itself is (the norm's output), since a block may store
// before another has read all of x. Step mode takes STEP_SLICE-row slices,
// as lin_run does for quantized layers.
static nb_status swiglu_stage(cuda_backend *be, const void *x, int n, const dlin *L, lin_path pdown, bool step,
                              const void **xd, const void **xq) {
    // NOTE: the layout is chosen only where the down projection has a draft
    // copy, so its input is the f16 copy of the Q4 path.
    if (pdown != LIN_Q4 || x == (const void *)be->gate) return NB_ERR_INTERNAL;
    const int I = L->m / 2, k = L->k;
    const nb_dtype dt = qx_of(be, LIN_Q4);
    const size_t xrow = (size_t)k * nb_dtype_size(dt), orow = (size_t)I * nb_dtype_size(dt);
    const int slice = step ? STEP_SLICE : (n > 0 ? n : 1);
    for (int r = 0; r < n; r += slice) {
        const int rows = n - r < slice ? n - r : slice;
        nb_status st = nb_cuda_matmul_wq_swiglu((uint8_t *)be->gate + (size_t)r * orow, dt, 1,
                                                (const uint8_t *)x + (size_t)r * xrow, dt, &L->q, 0, rows, L->m, k,
                                                be->stream);
        if (st != NB_OK) return st;
    }
    *xd = NULL;
    *xq = be->gate;
    return NB_OK;
}

// The dense q|k|v projection, RoPE and KV write as one row-invariant matmul
// (be->drope): q into be->q, k and v into the FP blocks, as lin_run +
// nb_cuda_rope_write_kv would store them (nb_cuda_matmul_dense_ri_rope),
// with the pass's (cos, sin) table be->rope_cs, in RI_SLICE-row calls as
// lin_run makes them. The caller checked dense_rope_takes().
// part (else NULL): the rows' partial sums of squares for the norm scaled
// after the matmul (nb_cuda_matmul_dense_ri_rope_rs; x: dpost_stage's xs).
static nb_status dense_rope_stage(cuda_backend *be, const void *x, int n, const dlin *L, int layer,
                                  const int32_t *fpblock, const int32_t *slot, const float *part) {
    const nb_model_config *mc = be->mc;
    const int D = mc->head_dim, Hq = mc->n_heads * D;
    const size_t xrow = (size_t)L->k * nb_dtype_size(be->adt);
    for (int r = 0; r < n; r += RI_SLICE) {
        const int rows = n - r < RI_SLICE ? n - r : RI_SLICE;
        const nb_cuda_wq_rope rp = {be->q + (size_t)r * Hq, be->rope_cs + (size_t)r * D, be->pools.fp, fpblock + r,
                                    slot + r,                be->lay,                      layer,        mc->n_heads};
        const uint8_t *xr = (const uint8_t *)x + (size_t)r * xrow;
        nb_status st =
            part ? nb_cuda_matmul_dense_ri_rope_rs(xr, L->w, be->adt, L->bias, L->bias_dt, rows, L->m, L->k, be->ri_ws,
                                                   be->ri_ws_bytes, &rp, part + (size_t)r * nb_cuda_dr_parts(L->k),
                                                   mc->rms_norm_eps, be->stream)
                 : nb_cuda_matmul_dense_ri_rope(xr, L->w, be->adt, L->bias, L->bias_dt, rows, L->m, L->k, be->ri_ws,
                                                be->ri_ws_bytes, &rp, be->stream);
        if (st != NB_OK) return st;
    }
    return NB_OK;
}

// Whether a pass in this mode takes dense_rope_stage for layer L.
static bool dense_rope_takes(const cuda_backend *be, const dlayer *L, nb_fwd_mode mode, bool step) {
    return step && be->drope && path_of(be, &L->qkv, mode) == LIN_DENSE && ri_takes(be, &L->qkv);
}

// The target's gate|up projection and SwiGLU as one row-invariant matmul
// (the dense copy in the SwiGLU layout, dlin.dswiglu), writing the dense
// down projection's input (be->adt) as silu_stage would convert it, with
// the same bits (nb_cuda_matmul_dense_ri_swiglu), in RI_SLICE-row calls as
// lin_run makes them. It goes to be->gate (the idle f32 gate|up rows), not
// to xa_d, where x is. The caller checked dense_swiglu_takes().
// part: as dense_rope_stage's (nb_cuda_matmul_dense_ri_swiglu_rs).
static nb_status dense_swiglu_stage(cuda_backend *be, const void *x, int n, const dlin *L, const void **xd,
                                    const void **xq, const float *part) {
    if (x == (const void *)be->gate) return NB_ERR_INTERNAL;
    const int I = L->m / 2, k = L->k;
    const size_t es = nb_dtype_size(be->adt), xrow = (size_t)k * es, orow = (size_t)I * es;
    for (int r = 0; r < n; r += RI_SLICE) {
        const int rows = n - r < RI_SLICE ? n - r : RI_SLICE;
        uint8_t *o = (uint8_t *)be->gate + (size_t)r * orow;
        const uint8_t *xr = (const uint8_t *)x + (size_t)r * xrow;
        nb_status st = part ? nb_cuda_matmul_dense_ri_swiglu_rs(o, be->adt, 0, xr, L->w, be->adt, rows, L->m, k,
                                                                be->ri_ws, be->ri_ws_bytes,
                                                                part + (size_t)r * nb_cuda_dr_parts(k),
                                                                be->mc->rms_norm_eps, be->stream)
                            : nb_cuda_matmul_dense_ri_swiglu(o, be->adt, 0, xr, L->w, be->adt, rows, L->m, k,
                                                             be->ri_ws, be->ri_ws_bytes, be->stream);
        if (st != NB_OK) return st;
    }
    *xd = be->gate;
    *xq = NULL;
    return NB_OK;
}

// Whether a step pass in this mode takes dense_swiglu_stage for layer L:
// both gate|up and down on their dense copies, gate|up on the row-invariant
// matmul, the down projection reading be->adt rows (stage_plan's copy).
static bool dense_swiglu_takes(const cuda_backend *be, const dlayer *L, nb_fwd_mode mode, bool step) {
    return step && be->fgu && L->gu.dswiglu && path_of(be, &L->gu, mode) == LIN_DENSE &&
           path_of(be, &L->down, mode) == LIN_DENSE && be->adt != NB_DTYPE_F32 && ri_takes(be, &L->gu);
}

// Whether a pass of R rows in this mode scales the norm before layer L's
// fused 4-bit matmuls after them (norm_post): draft passes (the fused
// layouts take the 4-bit view) of up to NB_POST_ROWS rows, where both of
// L's norms feed fused matmuls (q|k|v + RoPE, gate|up + SwiGLU, with the
// down projection 4-bit too). Not with draft_batch_invariant: a row's
// factor comes from partial sums cut by the matmul's grid, which the row
// count picks (and past NB_POST_ROWS rows the norms run unscaled).
static bool post_ok(const cuda_backend *be, const dlayer *L, nb_fwd_mode mode, int R) {
    return be->norm_post && !be->cfg.draft_batch_invariant && R <= NB_POST_ROWS && be->fqkv && L->qkv.rope &&
           path_of(be, &L->qkv, mode) == LIN_Q4 && be->fgu && L->gu.swiglu && path_of(be, &L->gu, mode) == LIN_Q4 &&
           path_of(be, &L->down, mode) == LIN_Q4;
}

// The 4-bit projection Lp (one call of R rows, input xq) adding its output
// into x and leaving the next norm's unscaled f16 input and partial sums
// (nb_cuda_matmul_wq_res; w: that norm's weights). *st: its status.
static nb_status post_stage(cuda_backend *be, const void *xq, int R, const dlin *Lp, const void *w, nb_dtype wdt,
                            nb_status *st) {
    const nb_cuda_wq_res rs = {be->x, w, wdt, be->xs, be->part};
    *st = nb_cuda_matmul_wq_res(xq, qx_of(be, LIN_Q4), &Lp->q, Lp->bias, Lp->bias_dt, R, Lp->m, Lp->k, &rs,
                                be->stream);
    if (*st == NB_OK) be->norm_posts++;
    return *st;
}

// Whether a step pass in this mode scales the RMSNorm between the dense
// projection Lp (an o or down projection) and layer L's fused dense matmul
// after it (ffn: gate|up + SwiGLU, else q|k|v + RoPE) after the latter
// (dnorm_post): post_ok's form on the target's row-invariant matmuls. No
// condition depends on the row count: a verify row and the decode row at
// its position take the same path, as row invariance needs.
static bool dpost_ok(const cuda_backend *be, const dlayer *L, const dlin *Lp, bool ffn, nb_fwd_mode mode, bool step) {
    return be->dnorm_post && step && path_of(be, Lp, mode) == LIN_DENSE && ri_takes(be, Lp) && Lp->m % 4 == 0 &&
           (ffn ? dense_swiglu_takes(be, L, mode, step) : dense_rope_takes(be, L, mode, step));
}

// post_stage's twin for a dense projection Lp (input xd, R rows, in
// RI_SLICE-row calls as lin_run makes them): nb_cuda_matmul_dense_ri_res.
static nb_status dpost_stage(cuda_backend *be, const void *xd, int R, const dlin *Lp, const void *w, nb_dtype wdt,
                             nb_status *st) {
    const int m = Lp->m, np = nb_cuda_dr_parts(m);
    const size_t es = nb_dtype_size(be->adt), xrow = (size_t)Lp->k * es;
    *st = NB_OK;
    for (int r = 0; r < R && *st == NB_OK; r += RI_SLICE) {
        const int rows = R - r < RI_SLICE ? R - r : RI_SLICE;
        const nb_cuda_dr_res rs = {be->x + (size_t)r * m, w, wdt, (uint8_t *)be->xs + (size_t)r * m * es,
                                   be->part + (size_t)r * np};
        *st = nb_cuda_matmul_dense_ri_res((const uint8_t *)xd + (size_t)r * xrow, Lp->w, be->adt, Lp->bias,
                                          Lp->bias_dt, rows, m, Lp->k, be->ri_ws, be->ri_ws_bytes, &rs, be->stream);
    }
    if (*st == NB_OK) be->norm_posts++;
    return *st;
}

// Layout of one pass's metadata in the staging buffers (byte offsets).
// The kernels of one pass, enqueued on the stream (captured into a CUDA
// graph for repeated step shapes). Everything that varies between passes of
// the same shape lives in the device metadata.
typedef struct pass {
    nb_fwd_mode mode;
    bool step;
    int R, n_logits;
    const int32_t *d_tok, *d_pos, *d_kvb, *d_kvs, *d_lrow;
    nb_pa_args pa;
} pass;

static nb_status run_pass(cuda_backend *be, pass *ps, char *err, size_t err_len) {
    const nb_model_config *mc = be->mc;
    const int H = mc->hidden_size, D = mc->head_dim, I = mc->intermediate_size;
    const int Hq = mc->n_heads * D, V = mc->vocab_size;
    const int R = ps->R, n_logits = ps->n_logits;
    const nb_fwd_mode mode = ps->mode;
    const bool step = ps->step;
    const int32_t *d_tok = ps->d_tok, *d_pos = ps->d_pos, *d_kvb = ps->d_kvb, *d_kvs = ps->d_kvs;
    const int32_t *d_lrow = ps->d_lrow;
    nb_pa_args pa = ps->pa;
    cudaStream_t S = be->stream;
    CK(nb_cuda_embed(be->x, be->embd, be->embd_dt, d_tok, R, H, V, S), "embedding");
    // The rows' RoPE (cos, sin), once for every layer whose q|k|v takes the
    // RoPE epilogue in this pass.
    bool table = false;
    for (int l = 0; l < mc->n_layers && !table; l++) {
        const dlayer *L = &be->layers[l];
        table = (be->fqkv && L->qkv.rope && path_of(be, &L->qkv, mode) == LIN_Q4) || dense_rope_takes(be, L, mode, step);
    }
    if (table) CK(nb_cuda_rope_table(be->rope_cs, d_pos, R, D, be->inv_freq, S), "rope table");
    const int Hkv = mc->n_kv_heads * D, W = Hq + 2 * Hkv;
    const float eps = mc->rms_norm_eps;
    // Draft passes of up to NB_POST_ROWS rows: each norm between a 4-bit
    // projection and a fused 4-bit matmul is scaled after the latter
    // (post_ok; see cuda_backend.xs); step passes likewise between the
    // target's dense projections and fused dense matmuls (dpost_ok). pre:
    // this layer's attention norm went that way (the previous down
    // projection added its residual): 1 the 4-bit forms, 2 the dense ones.
    int pre = 0;
    for (int l = 0; l < mc->n_layers; l++) {
        const dlayer *L = &be->layers[l];
        const void *xd = NULL, *xq = NULL;
        // The residual of the previous layer's MLP is added here, fused
        // with this layer's RMSNorm and the conversion to what q/k/v read.
        const dlin *l0 = be->fqkv ? &L->qkv : &L->wq, *l1 = be->fqkv ? &L->qkv : &L->wk;
        nb_status ps_st = NB_ERR_UNSUPPORTED;
        if (pre == 2) {
            ps_st = dense_rope_stage(be, be->xs, R, &L->qkv, l, d_kvb, d_kvs, be->part);
            if (ps_st != NB_ERR_UNSUPPORTED) CK(ps_st, "qkv projection (norm scaled after) + rope + kv write");
        } else if (pre == 1) {
            const nb_cuda_wq_rope rp = {be->q, be->rope_cs, be->pools.fp, d_kvb, d_kvs, be->lay, l, mc->n_heads};
            ps_st = nb_cuda_matmul_wq_rope_rs(be->xs, NB_DTYPE_F16, &L->qkv.q, R, L->qkv.m, L->qkv.k, &rp, be->part,
                                              eps, S);
            if (ps_st != NB_ERR_UNSUPPORTED) CK(ps_st, "qkv projection (norm scaled after) + rope + kv write");
        }
        if (ps_st != NB_OK) {
            // (After a residual already added by nb_cuda_matmul_wq_res, the
            // norm alone.)
            CK(norm_stage(be, pre || l == 0 ? NULL : be->tmp, L->attn_norm, L->attn_norm_dt, R, path_of(be, l0, mode),
                          path_of(be, l1, mode), &xd, &xq),
               "rmsnorm");
            if (be->fqkv && L->qkv.rope && path_of(be, &L->qkv, mode) == LIN_Q4) {
                CK(rope_stage(be, xq, R, &L->qkv, l, d_kvb, d_kvs, step), "qkv projection + rope + kv write");
            } else if (dense_rope_takes(be, L, mode, step)) {
                CK(dense_rope_stage(be, xd, R, &L->qkv, l, d_kvb, d_kvs, NULL), "qkv projection + rope + kv write");
            } else if (be->fqkv) {
                CK(lin_run(be, be->qkv, xd, xq, R, &L->qkv, mode, step), "qkv projection");
                CK(nb_cuda_rope_write_kv(be->q, be->qkv, W, be->qkv + Hq, be->qkv + Hq + Hkv, W, d_pos, R,
                                         mc->n_heads, be->inv_freq, &be->lay, be->pools.fp, l, d_kvb, d_kvs, S),
                   "rope + kv write");
            } else {
                CK(lin_run(be, be->q, xd, xq, R, &L->wq, mode, step), "q projection");
                CK(lin_run(be, be->k, xd, xq, R, &L->wk, mode, step), "k projection");
                CK(lin_run(be, be->v, xd, xq, R, &L->wv, mode, step), "v projection");
                CK(nb_cuda_rope_write_kv(be->q, be->q, Hq, be->k, be->v, Hkv, d_pos, R, mc->n_heads,
                                         be->inv_freq, &be->lay, be->pools.fp, l, d_kvb, d_kvs, S),
                   "rope + kv write");
            }
        }
        pa.layer = l;
        pa.q = be->q;
        pa.pdl = 1; // the kernel before is the RoPE + KV write: q and FP blocks only
        // The attention writes what the o projection reads (converted, when
        // one copy serves it), as the RMSNorm stages do.
        const lin_path po = path_of(be, &L->wo, mode);
        stage_out ao;
        CK(stage_plan(be, be->att, po, po, &ao, &xd, &xq), "attention output");
        pa.out = ao.f32;
        pa.out_cvt = ao.cvt.p;
        pa.out_cvt_dt = ao.cvt.dt;
        pa.out_cvt_sat = ao.cvt.sat;
        CK(nb_pa_attention(&pa, S), "attention");
        if (ao.generic) CK(stage_in(be, be->att, R, Hq, po, po, &xd, &xq), "convert");
        // The o projection adds its residual itself where the ffn norm is
        // scaled after gate|up (post_stage, dpost_stage).
        const bool post_ffn = post_ok(be, L, mode, R) && path_of(be, &L->wo, mode) == LIN_Q4;
        const bool dpost_ffn = !post_ffn && dpost_ok(be, L, &L->wo, true, mode, step);
        const bool res_o = post_ffn    ? post_stage(be, xq, R, &L->wo, L->ffn_norm, L->ffn_norm_dt, &ps_st) == NB_OK
                           : dpost_ffn ? dpost_stage(be, xd, R, &L->wo, L->ffn_norm, L->ffn_norm_dt, &ps_st) == NB_OK
                                       : false;
        if ((post_ffn || dpost_ffn) && !res_o && ps_st != NB_ERR_UNSUPPORTED) CK(ps_st, "o projection + residual");
        if (!res_o) CK(lin_run(be, be->tmp, xd, xq, R, &L->wo, mode, step), "o projection");
        ps_st = NB_ERR_UNSUPPORTED;
        if (res_o && post_ffn) {
            ps_st = nb_cuda_matmul_wq_swiglu_rs(be->gate, NB_DTYPE_F16, 1, be->xs, NB_DTYPE_F16, &L->gu.q, R, L->gu.m,
                                                L->gu.k, be->part, eps, S);
            if (ps_st != NB_ERR_UNSUPPORTED) CK(ps_st, "gate/up projection (norm scaled after) + swiglu");
            xd = NULL;
            xq = be->gate; // as swiglu_stage leaves it
        } else if (res_o) {
            ps_st = dense_swiglu_stage(be, be->xs, R, &L->gu, &xd, &xq, be->part);
            if (ps_st != NB_ERR_UNSUPPORTED) CK(ps_st, "gate/up projection (norm scaled after) + swiglu");
        }
        if (ps_st != NB_OK) {
            const dlin *g0 = be->fgu ? &L->gu : &L->gate, *g1 = be->fgu ? &L->gu : &L->up;
            CK(norm_stage(be, res_o ? NULL : be->tmp, L->ffn_norm, L->ffn_norm_dt, R, path_of(be, g0, mode),
                          path_of(be, g1, mode), &xd, &xq),
               "residual + rmsnorm");
            if (be->fgu && L->gu.swiglu && path_of(be, &L->gu, mode) == LIN_Q4) {
                CK(swiglu_stage(be, xq, R, &L->gu, path_of(be, &L->down, mode), step, &xd, &xq),
                   "gate/up projection + swiglu");
            } else if (dense_swiglu_takes(be, L, mode, step)) {
                CK(dense_swiglu_stage(be, xd, R, &L->gu, &xd, &xq, NULL), "gate/up projection + swiglu");
            } else if (be->fgu) {
                CK(lin_run(be, be->gate, xd, xq, R, &L->gu, mode, step), "gate/up projection");
                CK(silu_stage(be, be->gate, be->gate + I, 2 * I, R,
                              L->gu.dswiglu && path_of(be, &L->gu, mode) == LIN_DENSE, path_of(be, &L->down, mode),
                              &xd, &xq),
                   "swiglu");
            } else {
                CK(lin_run(be, be->gate, xd, xq, R, &L->gate, mode, step), "gate projection");
                CK(lin_run(be, be->up, xd, xq, R, &L->up, mode, step), "up projection");
                CK(silu_stage(be, be->gate, be->up, I, R, false, path_of(be, &L->down, mode), &xd, &xq), "swiglu");
            }
        }
        // The down projection likewise, for the next layer's attention norm.
        const dlayer *Ln = l + 1 < mc->n_layers ? &be->layers[l + 1] : NULL;
        const bool post_attn = Ln && post_ok(be, Ln, mode, R) && path_of(be, &L->down, mode) == LIN_Q4;
        const bool dpost_attn = Ln && !post_attn && dpost_ok(be, Ln, &L->down, false, mode, step);
        pre = post_attn    ? (post_stage(be, xq, R, &L->down, Ln->attn_norm, Ln->attn_norm_dt, &ps_st) == NB_OK ? 1 : 0)
              : dpost_attn ? (dpost_stage(be, xd, R, &L->down, Ln->attn_norm, Ln->attn_norm_dt, &ps_st) == NB_OK ? 2 : 0)
                           : 0;
        if ((post_attn || dpost_attn) && !pre && ps_st != NB_ERR_UNSUPPORTED) CK(ps_st, "down projection + residual");
        if (!pre) CK(lin_run(be, be->tmp, xd, xq, R, &L->down, mode, step), "down projection");
    }
    CK(nb_cuda_add(be->x, be->x, be->tmp, (size_t)R * H, S), "residual");
    if (n_logits > 0) {
        // The rows that need logits (lrow: their indices) into xl: a gather,
        // which is the embedding lookup with x as the table.
        CK(nb_cuda_embed(be->xl, be->x, NB_DTYPE_F32, d_lrow, n_logits, H, R, S), "gather");
        const void *xd, *xq;
        lin_path lp = path_of(be, &be->lm_head, mode);
        stage_out o;
        CK(stage_plan(be, be->xl, lp, lp, &o, &xd, &xq), "final rmsnorm");
        CK(nb_cuda_add_rmsnorm(be->xl, NULL, be->out_norm, be->out_norm_dt, n_logits, H, mc->rms_norm_eps, o.f32,
                               o.cvt, S),
           "final rmsnorm");
        if (o.generic) CK(stage_in(be, be->xl, n_logits, H, lp, lp, &xd, &xq), "convert");
        CK(lin_run(be, be->logits, xd, xq, n_logits, &be->lm_head, mode, step), "lm head");
    }
    return NB_OK;
}

// CUDA graphs for step passes. A pass's kernel sequence depends only on
// (mode, rows, attention entries and their most rows, logit rows): the first
// pass of a shape runs eagerly (it also warms every launcher's one-time
// setup), the second is captured; later ones replay the graph, which saves
// the launch cost of ~20 kernels per layer. The cache holds GRAPH_CACHE
// shapes, least recently used out.
static nb_status run_graph(cuda_backend *be, pass *ps, char *err, size_t err_len) {
    graph_key k = {ps->mode, ps->R, ps->pa.n_seqs, ps->pa.max_rows, ps->n_logits, ps->pa.max_tokens};
    graph_ent *hit = NULL, *lru = &be->graphs[0];
    for (int i = 0; i < GRAPH_CACHE; i++) {
        graph_ent *g = &be->graphs[i];
        if (g->used && memcmp(&g->key, &k, sizeof(k)) == 0) hit = g;
        if (!g->used || (lru->used && g->last_use < lru->last_use)) lru = g;
    }
    be->clock++;
    if (hit && hit->exec) {
        hit->last_use = be->clock;
        cudaError_t e = cudaGraphLaunch(hit->exec, be->stream);
        return e == cudaSuccess ? NB_OK : cuda_fail(err, err_len, "cudaGraphLaunch", e);
    }
    if (!hit) { // first sighting: remember the shape, run eagerly
        if (lru->exec) cudaGraphExecDestroy(lru->exec);
        *lru = (graph_ent){.key = k, .used = true, .last_use = be->clock};
        return run_pass(be, ps, err, err_len);
    }
    hit->last_use = be->clock;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamBeginCapture(be->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return cuda_fail(err, err_len, "cudaStreamBeginCapture", e);
    nb_status st = run_pass(be, ps, err, err_len);
    e = cudaStreamEndCapture(be->stream, &graph);
    if (st != NB_OK) {
        if (graph) cudaGraphDestroy(graph);
        return st;
    }
    if (e != cudaSuccess) return cuda_fail(err, err_len, "cudaStreamEndCapture", e);
    e = cudaGraphInstantiate(&hit->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        hit->exec = NULL;
        return cuda_fail(err, err_len, "cudaGraphInstantiate", e);
    }
    be->n_graphs++;
    e = cudaGraphLaunch(hit->exec, be->stream);
    return e == cudaSuccess ? NB_OK : cuda_fail(err, err_len, "cudaGraphLaunch", e);
}

// ---------------------------------------------------------------------------
// sampling on the device
// ---------------------------------------------------------------------------
//
// The temperature > 0 requests of a pass, after its logits (and the argmax)
// are computed and, when wanted, their download is enqueued: the target
// distributions are formed in place in the logits buffer, draft
// distributions in the sequence's draft slot of qstore, then sampled or
// accepted; one metadata upload before, one result download after. Rows j:
// target rows, then verify rows (both in place), then draft rows.

static nb_status sample_enqueue(cuda_backend *be, const nb_fwd_batch *b, char *err, size_t err_len) {
    const int V = be->mc->vocab_size, MG = be->max_gamma;
    const samp_off so = be->so;
    uint8_t *mh = be->smeta_h;
    nb_sampling_params *sp = (nb_sampling_params *)(mh + so.sp);
    uint64_t *seed = (uint64_t *)(mh + so.seed), *cnt = (uint64_t *)(mh + so.cnt);
    uint64_t *vseed = (uint64_t *)(mh + so.vseed), *vc0 = (uint64_t *)(mh + so.vc0);
    int32_t *in_row = (int32_t *)(mh + so.in_row), *out_row = (int32_t *)(mh + so.out_row);
    int32_t *vprow = (int32_t *)(mh + so.vprow), *vqrow = (int32_t *)(mh + so.vqrow);
    int32_t *vgam = (int32_t *)(mh + so.vgam), *vdraft = (int32_t *)(mh + so.vdraft);
    int nT = 0, nVr = 0, nD = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const nb_fwd_seq *fs = &b->seqs[s];
        if (!nb_fwd_seq_needs_probs(fs)) continue;
        if (fs->sample == NB_FWD_SAMPLE_TARGET) nT += fs->n_logits;
        else if (fs->sample == NB_FWD_SAMPLE_VERIFY) nVr += fs->n_logits;
        else nD += fs->n_logits;
    }
    int jT = 0, jV = nT, jD = nT + nVr, v = 0, lr = 0;
    for (int s = 0; s < b->n_seqs; lr += b->seqs[s].n_logits, s++) {
        const nb_fwd_seq *fs = &b->seqs[s];
        if (!nb_fwd_seq_needs_probs(fs)) continue;
        const int32_t pos_l0 = fs->pos0 + fs->n_rows - fs->n_logits;
        int *j = fs->sample == NB_FWD_SAMPLE_TARGET ? &jT : fs->sample == NB_FWD_SAMPLE_VERIFY ? &jV : &jD;
        be->samp_j[s] = *j;
        for (int r = 0; r < fs->n_logits; r++, (*j)++) {
            sp[*j] = *fs->sp;
            seed[*j] = fs->sp->seed;
            cnt[*j] = (uint64_t)(pos_l0 + r) + 1;
            in_row[*j] = lr + r;
            out_row[*j] = fs->sample == NB_FWD_SAMPLE_DRAFT ? fs->slot * MG + fs->draft_step : lr + r;
        }
        if (fs->sample == NB_FWD_SAMPLE_VERIFY) {
            be->samp_v[s] = v;
            vprow[v] = lr;
            vqrow[v] = fs->slot * MG;
            vgam[v] = fs->n_logits - 1;
            memcpy(vdraft + (size_t)v * MG, fs->drafts, (size_t)(fs->n_logits - 1) * sizeof(int32_t));
            vseed[v] = fs->sp->seed;
            vc0[v] = (uint64_t)pos_l0 + 1;
            v++;
        }
    }
    const int nA = nT + nVr, nv = v, LRp = be->LRp;
    cudaStream_t S = be->stream;
    const uint8_t *md = be->smeta_d;
    const nb_sampling_params *d_sp = (const nb_sampling_params *)(md + so.sp);
    const uint64_t *d_seed = (const uint64_t *)(md + so.seed), *d_cnt = (const uint64_t *)(md + so.cnt);
    const int32_t *d_in = (const int32_t *)(md + so.in_row), *d_out = (const int32_t *)(md + so.out_row);
    int32_t *tok = be->sres_d, *stt = tok + LRp, *vout = stt + LRp, *nacc = vout + (size_t)be->n_slots * (MG + 1);
    nb_status st = NB_OK;
    if (cudaMemcpyAsync(be->smeta_d, mh, so.end, cudaMemcpyHostToDevice, S) != cudaSuccess)
        st = NB_ERR_BACKEND;
    if (st == NB_OK)
        st = nb_cuda_probs_rows(be->logits, d_in, be->logits, d_in, nA, V, d_sp, stt, S);
    if (st == NB_OK && nD > 0)
        st = nb_cuda_probs_rows(be->qstore, d_out + nA, be->logits, d_in + nA, nD, V, d_sp + nA,
                                stt + nA, S);
    if (st == NB_OK) st = nb_cuda_sample_rows(tok, be->logits, d_in, nT, V, d_seed, d_cnt, 2, S);
    if (st == NB_OK && nD > 0)
        st = nb_cuda_sample_rows(tok + nA, be->qstore, d_out + nA, nD, V, d_seed + nA, d_cnt + nA, 0, S);
    if (st == NB_OK && nv > 0)
        st = nb_cuda_spec_accept_rows(nv, MG, V, (const int32_t *)(md + so.vgam), be->logits,
                                      (const int32_t *)(md + so.vprow), be->qstore,
                                      (const int32_t *)(md + so.vqrow),
                                      (const int32_t *)(md + so.vdraft),
                                      (const uint64_t *)(md + so.vseed),
                                      (const uint64_t *)(md + so.vc0), vout, nacc, S);
    size_t n_res = (size_t)2 * LRp + (size_t)be->n_slots * (MG + 2);
    if (st == NB_OK && cudaMemcpyAsync(be->sres_h, be->sres_d, n_res * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, S) != cudaSuccess)
        st = NB_ERR_BACKEND;
    if (st != NB_OK)
        nb_set_err(err, err_len, "forward: sampling launch: %s", cudaGetErrorString(cudaGetLastError()));
    return st;
}

// After the stream synchronised: the device results into b->sampled and
// b->n_accepted.
static void sample_collect(cuda_backend *be, const nb_fwd_batch *b) {
    const int MG = be->max_gamma, LRp = be->LRp;
    const int32_t *tok = be->sres_h, *stt = tok + LRp, *vout = stt + LRp;
    const int32_t *nacc = vout + (size_t)be->n_slots * (MG + 1);
    int lr = 0;
    for (int s = 0; s < b->n_seqs; lr += b->seqs[s].n_logits, s++) {
        const nb_fwd_seq *fs = &b->seqs[s];
        if (!nb_fwd_seq_needs_probs(fs)) continue;
        const int j0 = be->samp_j[s];
        if (fs->sample != NB_FWD_SAMPLE_VERIFY) {
            for (int r = 0; r < fs->n_logits; r++)
                b->sampled[lr + r] = stt[j0 + r] == NB_OK ? tok[j0 + r] : -1;
            continue;
        }
        const int v = be->samp_v[s];
        bool ok = nacc[v] >= 0;
        for (int r = 0; r < fs->n_logits; r++) ok &= stt[j0 + r] == NB_OK;
        b->n_accepted[s] = ok ? nacc[v] : NB_ERR_NON_FINITE;
        if (ok) memcpy(b->sampled + lr, vout + (size_t)v * (MG + 1), (size_t)(nacc[v] + 1) * sizeof(int32_t));
    }
}

static nb_status cuda_forward(nb_backend *base, const nb_fwd_batch *b, char *err, size_t err_len) {
    cuda_backend *be = (cuda_backend *)base;
    const nb_model_config *mc = be->mc;
    const int D = mc->head_dim, V = mc->vocab_size;
    const int G = be->lay.group_size;
    const bool quant = be->cfg.bm->quantize;

    // Validate and decide the mode.
    int R = 0, n_logits = 0, max_rows = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const nb_fwd_seq *fs = &b->seqs[s];
        if (fs->n_rows < 1 || fs->n_logits < 0 || fs->n_logits > fs->n_rows) {
            nb_set_err(err, err_len, "forward: sequence %d has %d rows, %d logits", s, fs->n_rows,
                       fs->n_logits);
            return NB_ERR_INVALID_ARG;
        }
        if (R + fs->n_rows > be->cfg.max_rows || n_logits + fs->n_logits > be->LRp) {
            nb_set_err(err, err_len, "forward: more than %d rows or %d logit rows in one pass",
                       be->cfg.max_rows, be->LRp);
            return NB_ERR_INVALID_ARG;
        }
        for (int i = 0; i < fs->n_rows; i++)
            if (fs->tokens[i] < 0 || fs->tokens[i] >= V) {
                nb_set_err(err, err_len, "forward: token id %d outside the vocabulary [0, %d)",
                           fs->tokens[i], V);
                return NB_ERR_INVALID_ARG;
            }
        R += fs->n_rows;
        n_logits += fs->n_logits;
        if (fs->n_rows > max_rows) max_rows = fs->n_rows;
    }
    if (b->n_seqs < 1 || b->n_seqs > be->cfg.bm->max_seqs) {
        nb_set_err(err, err_len, "forward: %d sequences (1..%d)", b->n_seqs, be->cfg.bm->max_seqs);
        return NB_ERR_INVALID_ARG;
    }
    nb_status st = nb_fwd_sample_check(b, V, be->n_slots, be->max_gamma, err, err_len);
    if (st != NB_OK) return st;
    bool any_sample = false;
    for (int s = 0; s < b->n_seqs; s++) any_sample |= b->seqs[s].sample != NB_FWD_SAMPLE_NONE;
    // NOTE: with max_gamma 0 (no draft slots) the check above refuses
    // drafts and verifies of more than the bonus row.
    const bool hot = nb_fwd_sample_needs_probs(b);
    const bool step = be->step_ok && max_rows <= NB_CUDA_STEP_ROWS;
    const nb_fwd_mode mode = b->mode;
    const nb_kv_view kview = mode == NB_FWD_DRAFT ? be->cfg.draft_view : NB_KV_VIEW_TARGET;
    const nb_pa_mode pa_mode = !quant ? NB_PA_FP_ONLY : kview == NB_KV_VIEW_DRAFT ? NB_PA_DRAFT : NB_PA_TARGET;
    int per = !step ? max_rows : be->entry_rows;
    if (step && pa_mode == NB_PA_TARGET && be->entry_rows_tgt > be->entry_rows) {
        // Wide entries when the narrow ones would fill more than a wave
        // (nb_pa_step_entry_vectors); a row's bits are the same either way.
        // Live CTAs: the grid's chunks past an entry's end return at once.
        int32_t cg, nall, grid_tokens;
        nb_pa_step_split(be->cfg.max_seq_len, G, ATTN_MAX_CHUNKS, be->step_min_tokens, 1, &cg, &nall,
                         &grid_tokens);
        // The call's live CTAs cut into entries of 8, 16 and 24 vectors.
        const int ratio = mc->n_heads / mc->n_kv_heads;
        int64_t live[3] = {0, 0, 0};
        for (int t = 0; t < 3; t++) {
            const int er = 8 * (t + 1) / ratio > 0 ? 8 * (t + 1) / ratio : 1;
            for (int s = 0; s < b->n_seqs; s++) {
                const nb_fwd_seq *fs = &b->seqs[s];
                for (int i0 = 0; i0 < fs->n_rows; i0 += er) {
                    const int end = fs->pos0 + (fs->n_rows - i0 < er ? fs->n_rows : i0 + er);
                    live[t] += (end + cg * G - 1) / (cg * G);
                }
            }
            live[t] *= be->lay.n_kv_heads;
        }
        const int v = nb_pa_step_entry_vectors(&be->lay, NB_PA_TARGET, mc->n_heads, live) / ratio;
        if (v > per) per = v < be->entry_rows_tgt ? v : be->entry_rows_tgt;
    }

    // Metadata: rows, KV slots, attention entries, block tables.
    int n_ent = 0, n_qt = 0, n_ft = 0, max_ent_rows = 1, max_tokens = 1;
    for (int s = 0; s < b->n_seqs; s++) {
        const nb_fwd_seq *fs = &b->seqs[s];
        n_ent += (fs->n_rows + per - 1) / per;
        n_qt += fs->view.n_qblocks + 1;
        n_ft += fs->view.n_fpblocks;
    }
    if (n_qt > be->tab_cap || n_ft > be->tab_cap || n_ent > be->cfg.max_rows) {
        nb_set_err(err, err_len, "forward: block tables exceed the backend's plan");
        return NB_ERR_INVALID_ARG;
    }
    const meta_off mo = be->mo;
    uint8_t *mh = be->meta_h;
    int32_t *tok = (int32_t *)(mh + mo.tok), *pos = (int32_t *)(mh + mo.pos);
    int32_t *kvb = (int32_t *)(mh + mo.kvb), *kvs = (int32_t *)(mh + mo.kvs);
    nb_pa_seq *ent = (nb_pa_seq *)(mh + mo.ent);
    int32_t *qt = (int32_t *)(mh + mo.qt), *ft = (int32_t *)(mh + mo.ft);
    int32_t *lrow = (int32_t *)(mh + mo.lrow);
    int r0 = 0, e = 0, nl = 0;
    bool any_q = false; // a quantized group in some sequence's view (the prefill stage has work)
    n_qt = n_ft = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const nb_fwd_seq *fs = &b->seqs[s];
        const nb_bm_seq_view *v = &fs->view;
        const int n_tok = v->n_committed + v->n_drafted;
        if (fs->pos0 < v->n_qblocks * G || fs->pos0 + fs->n_rows > n_tok ||
            (fs->pos0 + fs->n_rows - v->n_qblocks * G + G - 1) / G > v->n_fpblocks) {
            nb_set_err(err, err_len, "forward: sequence %d rows %d..%d outside its FP blocks", s,
                       fs->pos0, fs->pos0 + fs->n_rows);
            return NB_ERR_INVALID_ARG;
        }
        for (int i = 0; i < fs->n_rows; i++) {
            int32_t idx = fs->pos0 + i - v->n_qblocks * G;
            tok[r0 + i] = fs->tokens[i];
            pos[r0 + i] = fs->pos0 + i;
            kvb[r0 + i] = v->fpblocks[idx / G];
            kvs[r0 + i] = idx % G;
        }
        const int pq = quant && v->prequant_block >= 0;
        any_q = any_q || (quant && v->n_qblocks > 0) || pq;
        memcpy(qt + n_qt, v->qblocks, (size_t)v->n_qblocks * sizeof(int32_t));
        if (pq) qt[n_qt + v->n_qblocks] = v->prequant_block;
        memcpy(ft + n_ft, v->fpblocks, (size_t)v->n_fpblocks * sizeof(int32_t));
        for (int i0 = 0; i0 < fs->n_rows; i0 += per) {
            int nr = fs->n_rows - i0 < per ? fs->n_rows - i0 : per;
            ent[e++] = (nb_pa_seq){.qblock_off = n_qt,
                                   .n_qblocks = quant ? v->n_qblocks : 0,
                                   .has_prequant = pq,
                                   .fpblock_off = n_ft,
                                   .n_tokens = n_tok,
                                   .pos0 = fs->pos0 + i0,
                                   .n_rows = nr,
                                   .row_off = r0 + i0};
            if (nr > max_ent_rows) max_ent_rows = nr;
        }
        if (fs->pos0 + fs->n_rows > max_tokens) max_tokens = fs->pos0 + fs->n_rows;
        for (int i = fs->n_rows - fs->n_logits; i < fs->n_rows; i++) lrow[nl++] = r0 + i;
        n_qt += v->n_qblocks + 1;
        n_ft += v->n_fpblocks;
        r0 += fs->n_rows;
    }
    cudaStream_t S = be->stream;
    tm_begin(be);
    if (cudaMemcpyAsync(be->meta_d, mh, mo.ft + (size_t)n_ft * 4, cudaMemcpyHostToDevice, S) !=
        cudaSuccess) {
        nb_set_err(err, err_len, "forward: metadata upload: %s", cudaGetErrorString(cudaGetLastError()));
        return NB_ERR_BACKEND;
    }
    const uint8_t *md = be->meta_d;
    const int32_t *d_tok = (const int32_t *)(md + mo.tok), *d_pos = (const int32_t *)(md + mo.pos);
    const int32_t *d_kvb = (const int32_t *)(md + mo.kvb), *d_kvs = (const int32_t *)(md + mo.kvs);
    const int32_t *d_lrow = (const int32_t *)(md + mo.lrow);

    nb_pa_args pa;
    memset(&pa, 0, sizeof(pa));
    pa.lay = be->lay;
    pa.pools = be->pools;
    pa.mode = pa_mode;
    pa.n_q_heads = mc->n_heads;
    pa.softmax_scale = 1.0f / sqrtf((float)D);
    pa.n_seqs = n_ent;
    pa.seqs = (const nb_pa_seq *)(md + mo.ent);
    pa.qblock_ids = (const int32_t *)(md + mo.qt);
    pa.fpblock_ids = (const int32_t *)(md + mo.ft);
    pa.max_rows = max_ent_rows;
    pa.max_tokens = max_tokens;
    pa.workspace = be->attn_ws;
    pa.workspace_bytes = be->attn_ws_bytes;
    if (any_q) { // without quantized history the stage kernel would only launch
        pa.stage = be->pf_stage;
        pa.stage_bytes = be->pf_stage_bytes;
    }
    if (step) {
        // Fixed chunks of chunk_groups groups; the grid covers the chunks
        // of the longest entry, rounded up to a power of two, so a graph
        // serves a range of lengths (at most log2(64) + 1 shapes) and
        // short batches launch no CTAs for chunks nobody has. A row's bits
        // do not depend on the grid: chunks are fixed by position and the
        // merge skips empty ones. Batch-tuned draft passes get the same
        // max_tokens (the graph key), the kernel reads the real lengths.
        int32_t cg, nall, grid_tokens;
        nb_pa_step_split(be->cfg.max_seq_len, G, ATTN_MAX_CHUNKS, be->step_min_tokens, max_tokens, &cg, &nall,
                         &grid_tokens);
        const bool inv = mode != NB_FWD_DRAFT || be->cfg.draft_batch_invariant;
        pa.fixed_chunk_groups = inv ? cg : 0;
        pa.max_tokens = grid_tokens;
    }
    if (!step || !pa.fixed_chunk_groups) {
        // Batch-tuned: as many chunks as the workspace holds for this pass's
        // entries (a draft's one row per sequence leaves room for many
        // more than the step split's nall; capping at nall cost batch-1
        // drafts ~6% with max_seq_len 4k, where nall is 5).
        size_t per_chunk = nb_pa_workspace_size(n_ent, max_ent_rows, mc->n_heads, D, 1);
        size_t c = per_chunk ? be->attn_ws_bytes / per_chunk : 1;
        pa.max_chunks = c < 1 ? 1 : c > ATTN_MAX_CHUNKS ? ATTN_MAX_CHUNKS : (int32_t)c;
    } else {
        pa.max_chunks = ATTN_MAX_CHUNKS;
    }

pass ps = {.mode = mode, .step = step, .R = R, .n_logits = n_logits, .d_tok = d_tok, .d_pos = d_pos,
               .d_kvb = d_kvb, .d_kvs = d_kvs, .d_lrow = d_lrow, .pa = pa};
    st = step && be->cfg.cuda_graphs ? run_graph(be, &ps, err, err_len) : run_pass(be, &ps, err, err_len);
    if (st != NB_OK) return st;
    // NOTE: greedy tokens are taken on the GPU (nb_cuda_argmax, bit-exact
    // with nb_ref_argmax), after the pass and outside its graph, and so is
    // sampling; with skip_logits only their results are downloaded.
    const bool host_samp = hot && be->cfg.host_sampling;
    const bool want_argmax = n_logits > 0 && (b->argmax || any_sample);
    const bool want_logits = n_logits > 0 && (!b->skip_logits || host_samp);
    if (want_argmax) {
        if (nb_cuda_argmax(be->argmax_d, be->logits, n_logits, V, S) != NB_OK) {
            nb_set_err(err, err_len, "forward: argmax launch: %s",
                       cudaGetErrorString(cudaGetLastError()));
            return NB_ERR_BACKEND;
        }
        if (cudaMemcpyAsync(be->argmax_h, be->argmax_d, (size_t)n_logits * sizeof(int32_t),
                            cudaMemcpyDeviceToHost, S) != cudaSuccess)
            return sync_check(be, "forward: argmax download", err, err_len);
    }
    if (want_logits) { // enqueued before sampling overwrites the logits in place
        if (cudaMemcpyAsync(be->logits_h, be->logits, (size_t)n_logits * V * sizeof(float),
                            cudaMemcpyDeviceToHost, S) != cudaSuccess)
            return sync_check(be, "forward: logits download", err, err_len);
    }
    if (hot && !host_samp && (st = sample_enqueue(be, b, err, err_len)) != NB_OK) {
        sync_check(be, "forward: sampling", NULL, 0);
        return st;
    }
    tm_end(be);
    st = sync_check(be, "forward", err, err_len);
    if (st != NB_OK) return st;
    tm_account(be);
    if (want_logits && !b->skip_logits) memcpy(b->logits, be->logits_h, (size_t)n_logits * V * sizeof(float));
    if (n_logits > 0 && b->argmax) memcpy(b->argmax, be->argmax_h, (size_t)n_logits * sizeof(int32_t));
    if (any_sample && n_logits > 0) {
        nb_host_sample(&be->hs, b, be->logits_h, be->argmax_h, !host_samp);
        if (hot && !host_samp) sample_collect(be, b);
    }
    return NB_OK;
}

static const nb_backend_ops cuda_ops = {
    .name = "cuda",
    .forward = cuda_forward,
    .exec_work = cuda_exec_work,
    .weight_bytes = cuda_weight_bytes,
    .kv_bytes = cuda_kv_bytes,
    .destroy = cuda_destroy,
};

// ---------------------------------------------------------------------------
// creation
// ---------------------------------------------------------------------------

// Allocates (or, plan_only, counts) everything but the KV pools.
static nb_status build_static(cuda_backend *be, char *err, size_t err_len) {
    const nb_backend_config *cfg = &be->cfg;
    const nb_model_config *mc = be->mc;
    const nb_model_weights *mw = be->mw;
    nb_status st;
    nb_dtype wdt = mw->layers[0].wq.dtype;
    be->adt = wdt == NB_DTYPE_F16 ? NB_DTYPE_F16 : wdt == NB_DTYPE_BF16 ? NB_DTYPE_BF16 : NB_DTYPE_F32;
    be->qxdt = be->adt == NB_DTYPE_F16 ? NB_DTYPE_F16 : NB_DTYPE_BF16;

    be->rope_layer = -1;
    be->layers = calloc((size_t)mc->n_layers, sizeof(dlayer));
    if (!be->layers) {
        nb_set_err(err, err_len, "cuda backend: out of host memory");
        return NB_ERR_OUT_OF_MEMORY;
    }
    // q|k|v and gate|up as one matmul each when every layer's parts stack
    // (kernel launches are a large share of a decode step at 7-8B: each
    // fused pair saves a launch per layer and reads x once).
    be->fqkv = be->fgu = true;
    for (int l = 0; l < mc->n_layers; l++) {
        const nb_layer_weights *lw = &mw->layers[l];
        const nb_tensor_view *qw[3] = {&lw->wq, &lw->wk, &lw->wv}, *qb[3] = {&lw->bq, &lw->bk, &lw->bv};
        const nb_tensor_view *gw[2] = {&lw->w_gate, &lw->w_up}, *gb[2] = {NULL, NULL};
        be->fqkv &= lin_fusable(qw, qb, 3);
        be->fgu &= lin_fusable(gw, gb, 2);
    }
    for (int l = 0; l < mc->n_layers; l++) {
        const nb_layer_weights *lw = &mw->layers[l];
        dlayer *dl = &be->layers[l];
        const nb_tensor_view *qw[3] = {&lw->wq, &lw->wk, &lw->wv}, *qb[3] = {&lw->bq, &lw->bk, &lw->bv};
        const nb_tensor_view *gw[2] = {&lw->w_gate, &lw->w_up}, *gb[2] = {NULL, NULL};
        struct {
            dlin *dst;
            const nb_tensor_view *w, *b;
        } map[] = {{&dl->wq, &lw->wq, &lw->bq},          {&dl->wk, &lw->wk, &lw->bk},
                   {&dl->wv, &lw->wv, &lw->bv},          {&dl->wo, &lw->wo, &lw->bo},
                   {&dl->gate, &lw->w_gate, NULL},       {&dl->up, &lw->w_up, NULL},
                   {&dl->down, &lw->w_down, NULL}};
        for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
            if ((i < 3 && be->fqkv) || ((i == 4 || i == 5) && be->fgu)) continue;
            st = lin_init(be, map[i].dst, map[i].w, map[i].b, err, err_len);
            if (st != NB_OK) return st;
        }
        // The SwiGLU layout needs the down projection's draft copy too: the
        // fused pass writes its quantized input.
        // The RoPE layout: the cache layout's heads are the model's.
        const int rope_D = be->lay.head_dim == mc->head_dim && be->lay.n_kv_heads == mc->n_kv_heads ? mc->head_dim : 0;
        if ((be->fqkv &&
             (st = lin_init_cat(be, &dl->qkv, qw, qb, 3, false, false, rope_D, err, err_len)) != NB_OK) ||
            (be->fgu && (st = lin_init_cat(be, &dl->gu, gw, gb, 2, dl->down.q.upper != NULL, dl->down.w != NULL, 0,
                                           err, err_len)) != NB_OK))
            return st;
        if (be->rope_layer < 0 && be->fqkv && dl->qkv.rope) be->rope_layer = l;
        dl->attn_norm_dt = lw->attn_norm.dtype;
        dl->ffn_norm_dt = lw->ffn_norm.dtype;
        if ((st = upload_tensor(be, &lw->attn_norm, lw->attn_norm.dtype, &dl->attn_norm, err, err_len)) ||
            (st = upload_tensor(be, &lw->ffn_norm, lw->ffn_norm.dtype, &dl->ffn_norm, err, err_len)))
            return st;
    }
    be->embd_dt = mw->tok_embd.dtype;
    be->out_norm_dt = mw->out_norm.dtype;
    if ((st = upload_tensor(be, &mw->tok_embd, mw->tok_embd.dtype, &be->embd, err, err_len)) ||
        (st = upload_tensor(be, &mw->out_norm, mw->out_norm.dtype, &be->out_norm, err, err_len)) ||
        (st = lin_init(be, &be->lm_head, &mw->lm_head, NULL, err, err_len)))
        return st;

    const int H = mc->hidden_size, I = mc->intermediate_size, D = mc->head_dim, V = mc->vocab_size;
    const int Hq = mc->n_heads * D, Hkv = mc->n_kv_heads * D;
    float *inv_freq_h = malloc((size_t)D / 2 * sizeof(float));
    if (!inv_freq_h) {
        nb_set_err(err, err_len, "cuda backend: out of host memory");
        return NB_ERR_OUT_OF_MEMORY;
    }
    st = nb_ref_rope_inv_freq(inv_freq_h, D, (float)mc->rope_theta, &mc->rope_scaling);
    if (st != NB_OK) {
        free(inv_freq_h);
        nb_set_err(err, err_len, "cuda backend: invalid RoPE parameters");
        return st;
    }
    st = dev_alloc(be, (void **)&be->inv_freq, (size_t)D / 2 * sizeof(float), err, err_len);
    if (st == NB_OK) st = h2d(be, be->inv_freq, inv_freq_h, (size_t)D / 2 * sizeof(float), err, err_len);
    free(inv_freq_h);
    if (st != NB_OK) return st;

    // Step-mode dense layers on the row-invariant matmul (NB_DENSE_RI=0:
    // cuBLAS slices), and the dense q|k|v with RoPE + KV write in its
    // reduction where every layer's dense copy and the cache's heads allow
    // it (NB_DENSE_ROPE=0: the separate kernel; the same bits either way).
    be->ri_on = (be->adt == NB_DTYPE_F16 || be->adt == NB_DTYPE_BF16) && !env_off("NB_DENSE_RI");
    be->norm_post = !env_off("NB_NORM_POST");
    be->dnorm_post = be->norm_post && be->ri_on && !env_off("NB_DENSE_NORM_POST");
    be->drope = be->ri_on && be->fqkv && !env_off("NB_DENSE_ROPE") && be->lay.head_dim == D && D % 16 == 0 &&
                be->lay.n_kv_heads == mc->n_kv_heads;
    for (int l = 0; be->drope && l < mc->n_layers; l++) {
        const dlin *q = &be->layers[l].qkv;
        // NOTE: a dry run has no pointers; it counts the table and workspace
        // whenever the shapes allow (the plan may only exceed the real run).
        be->drope = (be->plan_only || (q->w && ((uintptr_t)q->w & 15) == 0)) &&
                    nb_cuda_matmul_dense_ri_supported(be->adt, q->k) && q->m == (mc->n_heads + 2 * mc->n_kv_heads) * D;
    }

    // Activations, rows padded to the step slice.
    be->Rp = (cfg->max_rows + STEP_SLICE - 1) / STEP_SLICE * STEP_SLICE;
    int lr = cfg->max_logit_rows > 0 ? cfg->max_logit_rows : cfg->max_rows;
    be->LRp = (lr + STEP_SLICE - 1) / STEP_SLICE * STEP_SLICE;
    size_t Rp = (size_t)be->Rp, LRp = (size_t)be->LRp;
    int maxk = H > I ? H : I;
    if (Hq > maxk) maxk = Hq;
    be->maxk = maxk;
    struct {
        float **p;
        size_t n;
    } bufs[] = {{&be->x, Rp * H},
                {&be->xb, Rp * H},
                {&be->q, Rp * Hq},
                {&be->k, be->fqkv ? 0 : Rp * Hkv},
                {&be->v, be->fqkv ? 0 : Rp * Hkv},
                {&be->qkv, be->fqkv ? Rp * (Hq + 2 * Hkv) : 0},
                {&be->att, Rp * Hq},
                {&be->gate, Rp * I * (be->fgu ? 2 : 1)}, // fused: the gate|up rows
                {&be->up, Rp * I},                       // fused: SwiGLU's f32 rows, when wanted
                {&be->tmp, Rp * H},
                {&be->xl, LRp * H},
                {&be->logits, LRp * V},
                {&be->rope_cs, be->rope_layer >= 0 || be->drope ? Rp * D : 0}};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i].n && (st = dev_alloc(be, (void **)bufs[i].p, bufs[i].n * sizeof(float), err, err_len)))
            return st;
    if ((st = dev_alloc(be, &be->xa_d, Rp * maxk * 2, err, err_len)) ||
        (st = dev_alloc(be, &be->xa_q, Rp * maxk * 2, err, err_len)) ||
        (st = dev_alloc(be, (void **)&be->xs, (size_t)(Rp > NB_POST_ROWS ? Rp : NB_POST_ROWS) * H * 2, err, err_len)))
        return st;
    {
        const size_t pq = (size_t)NB_POST_ROWS * NB_CUDA_WQ_PART, pd = Rp * nb_cuda_dr_parts(H);
        if ((st = dev_alloc(be, (void **)&be->part, (pq > pd ? pq : pd) * sizeof(float), err, err_len))) return st;
    }

    // The row-invariant dense matmul's workspace: the largest any dense
    // layer needs for RI_SLICE rows (its k-split partial sums; the RoPE
    // form's also where S == 1).
    {
        const int rmax = be->Rp > be->LRp ? be->Rp : be->LRp; // layer rows or LM-head rows
        const int rn = rmax < RI_SLICE ? rmax : RI_SLICE;
        size_t rw = 0;
        for (int l = 0; be->ri_on && l <= mc->n_layers; l++) {
            const dlayer *dl = l < mc->n_layers ? &be->layers[l] : NULL;
            const dlin *ls[9] = {dl ? &dl->wq : &be->lm_head, dl ? &dl->wk : NULL, dl ? &dl->wv : NULL,
                                 dl ? &dl->wo : NULL, dl ? &dl->gate : NULL, dl ? &dl->up : NULL,
                                 dl ? &dl->down : NULL, dl ? &dl->qkv : NULL, dl ? &dl->gu : NULL};
            for (int i = 0; i < 9; i++)
                if (ls[i] && ls[i]->m > 0 && nb_cuda_matmul_dense_ri_supported(be->adt, ls[i]->k)) {
                    // (The RoPE form and the o / down projections' residual
                    // form keep their partial sums whatever S.)
                    const size_t b = (i == 7 && be->drope) || ((i == 3 || i == 6) && be->dnorm_post)
                                         ? nb_cuda_matmul_dense_ri_rope_workspace_bytes(rn, ls[i]->m, ls[i]->k)
                                         : nb_cuda_matmul_dense_ri_workspace_bytes(rn, ls[i]->m, ls[i]->k);
                    if (b > rw) rw = b;
                }
        }
        be->ri_ws_bytes = rw;
        if (rw && (st = dev_alloc(be, &be->ri_ws, rw, err, err_len))) return st;
    }

    // Attention: step mode needs the decode kernel; its workspace holds
    // every entry of a step pass; prefill passes use what is there.
    const int G = cfg->bm->group_size, ratio = mc->n_heads / mc->n_kv_heads;
    const nb_dtype kdt = cfg->layout.dtype;
    be->step_ok = (D == 64 || D == 128) && kdt != NB_DTYPE_F32 && G % 32 == 0 && ratio <= 8;
    be->entry_rows = be->step_ok ? 8 / ratio : 0;
    // Target-view entries may hold more rows (one read of the cache per
    // verify entry, nb_pa_step_entry_vectors); the same environment must
    // hold for the backend's life (NB_PA_TC, NB_PA_TC_CPS, NB_PA_TC_WIDE,
    // NB_PA_TC_TILES).
    be->entry_rows_tgt = be->entry_rows;
    if (be->step_ok && cfg->bm->quantize) {
        const int32_t v = nb_pa_step_entry_vectors(&cfg->layout, NB_PA_TARGET, mc->n_heads, NULL);
        if (v / ratio > be->entry_rows) be->entry_rows_tgt = v / ratio;
    }
    int groups = (cfg->max_seq_len + G - 1) / G, chunk_groups, n_chunks, grid_unused;
    {
        const char *e = getenv("NB_PA_STEP_MIN_TOKENS"); // tuning: the step split's smallest chunk
        be->step_min_tokens = e && atoi(e) > 0 ? atoi(e) : NB_PA_STEP_MIN_CHUNK_TOKENS;
    }
    nb_pa_step_split(cfg->max_seq_len, G, ATTN_MAX_CHUNKS, be->step_min_tokens, 1, &chunk_groups, &n_chunks,
                     &grid_unused);
    size_t ws = 0;
    if (be->step_ok) {
        int max_seqs = cfg->bm->max_seqs;
        for (int k = 0; k < 2; k++) { // the larger of the two entry shapes
            const int er = k ? be->entry_rows_tgt : be->entry_rows;
            int ent_per_seq = (NB_CUDA_STEP_ROWS + er - 1) / er;
            long n_ent = (long)max_seqs * ent_per_seq;
            if (n_ent > cfg->max_rows) n_ent = cfg->max_rows;
            const size_t w = nb_pa_workspace_size((int32_t)n_ent, er, mc->n_heads, D, n_chunks);
            if (w > ws) ws = w;
        }
    }
    size_t ws_prefill = nb_pa_workspace_size(1, cfg->max_rows, mc->n_heads, D, 8);
    if (ws_prefill > ws) ws = ws_prefill;
    be->attn_ws_bytes = ws;
    if ((st = dev_alloc(be, &be->attn_ws, ws, err, err_len))) return st;
    // The prefill stage: a quantized cache's groups dequantized once per
    // prefill call and layer instead of in every CTA that reads them
    // (nb_pa_args.stage; docs/decisions.md, session 48), sized for one
    // sequence of max_seq_len (a batch of shorter ones fits too; calls
    // that do not fit dequantize in the kernel as before). Only where the
    // warpgroup prefill kernel runs (D 128, G % 64, f16/bf16 cache).
    // NB_PREFILL_STAGE=0 in the environment leaves it out.
    be->pf_stage = NULL;
    be->pf_stage_bytes = 0;
    {
        const char *e = getenv("NB_PREFILL_STAGE");
        if (cfg->bm->quantize && D == 128 && G % 64 == 0 && (kdt == NB_DTYPE_F16 || kdt == NB_DTYPE_BF16) &&
            !(e && e[0] == '0')) {
            be->pf_stage_bytes = nb_pa_prefill_stage_size(&cfg->layout, 1, cfg->max_seq_len);
            if ((st = dev_alloc(be, &be->pf_stage, be->pf_stage_bytes, err, err_len))) return st;
        }
    }

    // Per-pass metadata and KV work staging.
    be->tab_cap = cfg->bm->max_seqs * (groups + 4);
    be->mo = meta_layout(cfg->max_rows, be->LRp, be->tab_cap);
    be->meta_bytes = be->mo.end;
    // cuBLAS gets its workspace from us: no allocation inside a graph capture.
    if ((st = dev_alloc(be, &be->blas_ws, BLAS_WS, err, err_len))) return st;
    if (!be->plan_only && cublasSetWorkspace(be->blas, be->blas_ws, BLAS_WS) != CUBLAS_STATUS_SUCCESS) {
        nb_set_err(err, err_len, "cuda backend: cublasSetWorkspace failed");
        return NB_ERR_BACKEND;
    }
    if ((st = dev_alloc(be, (void **)&be->meta_d, be->meta_bytes, err, err_len)) ||
        (st = dev_alloc(be, (void **)&be->work_d, 4 * WORK_BATCH * sizeof(int32_t), err, err_len)) ||
        (st = dev_alloc(be, (void **)&be->argmax_d, LRp * sizeof(int32_t), err, err_len)))
        return st;
    // Sampling: draft slots for every sequence (sampled drafting keeps q
    // until VERIFY), metadata and results.
    be->n_slots = cfg->bm->max_seqs;
    be->max_gamma = cfg->max_gamma > 0 ? cfg->max_gamma : 0;
    be->so = samp_layout(be->LRp, be->n_slots, be->max_gamma);
    size_t n_res = 2 * LRp + (size_t)be->n_slots * (be->max_gamma + 2);
    if (be->max_gamma > 0 && !cfg->host_sampling &&
        (st = dev_alloc(be, (void **)&be->qstore,
                        (size_t)be->n_slots * be->max_gamma * V * sizeof(float), err, err_len)))
        return st;
    if ((st = dev_alloc(be, (void **)&be->smeta_d, be->so.end, err, err_len)) ||
        (st = dev_alloc(be, (void **)&be->sres_d, n_res * sizeof(int32_t), err, err_len)))
        return st;
    if (!be->plan_only) {
        cudaError_t e = cudaMallocHost((void **)&be->meta_h, be->meta_bytes);
        if (e == cudaSuccess) e = cudaMallocHost((void **)&be->logits_h, LRp * V * sizeof(float));
        if (e == cudaSuccess) e = cudaMallocHost((void **)&be->argmax_h, LRp * sizeof(int32_t));
        if (e == cudaSuccess) e = cudaMallocHost((void **)&be->work_h, 4 * WORK_BATCH * sizeof(int32_t));
        if (e == cudaSuccess) e = cudaMallocHost((void **)&be->smeta_h, be->so.end);
        if (e == cudaSuccess) e = cudaMallocHost((void **)&be->sres_h, n_res * sizeof(int32_t));
        if (e != cudaSuccess) return cuda_fail(err, err_len, "pinned host buffers", e);
        be->samp_j = calloc((size_t)be->n_slots, sizeof(int32_t));
        be->samp_v = calloc((size_t)be->n_slots, sizeof(int32_t));
        if (!be->samp_j || !be->samp_v ||
            nb_host_sampler_init(&be->hs, V, be->n_slots, be->max_gamma, !cfg->host_sampling) != NB_OK) {
            nb_set_err(err, err_len, "cuda backend: out of host memory");
            return NB_ERR_OUT_OF_MEMORY;
        }
    }
    return NB_OK;
}

static nb_status check_config(const nb_backend_config *cfg, char *err, size_t err_len) {
    if (!cfg || !cfg->model || !cfg->bm || cfg->max_rows < 1 || cfg->max_seq_len < 1) {
        nb_set_err(err, err_len, "cuda backend: invalid configuration");
        return NB_ERR_INVALID_ARG;
    }
    const nb_model_config *mc = nb_model_get_config(cfg->model);
    if (mc->head_dim > 512 || mc->head_dim % 2) {
        nb_set_err(err, err_len, "cuda backend: head_dim %d is not supported (even, <= 512)",
                   mc->head_dim);
        return NB_ERR_UNSUPPORTED;
    }
    return NB_OK;
}

static nb_status set_device(int device, char *err, size_t err_len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        nb_set_err(err, err_len, "cuda backend: no CUDA device (%s)",
                   e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
        return NB_ERR_BACKEND;
    }
    if (device < 0 || device >= n) {
        nb_set_err(err, err_len, "cuda backend: device %d does not exist (%d found)", device, n);
        return NB_ERR_INVALID_ARG;
    }
    e = cudaSetDevice(device);
    return e == cudaSuccess ? NB_OK : cuda_fail(err, err_len, "cudaSetDevice", e);
}

nb_status nb_backend_cuda_plan(const nb_backend_config *cfg, size_t *static_bytes, size_t *free_bytes,
                               size_t *total_bytes, char *err, size_t err_len) {
    nb_status st = check_config(cfg, err, err_len);
    if (st != NB_OK) return st;
    if ((st = set_device(cfg->device, err, err_len)) != NB_OK) return st;
    cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
    if (e != cudaSuccess) return cuda_fail(err, err_len, "cudaMemGetInfo", e);
    cuda_backend be;
    memset(&be, 0, sizeof(be));
    be.cfg = *cfg;
    be.mc = nb_model_get_config(cfg->model);
    be.mw = nb_model_get_weights(cfg->model);
    be.lay = cfg->layout; // its heads decide the q|k|v layout (and with it a buffer); pool sizes unused
    be.plan_only = true;
    st = build_static(&be, err, err_len);
    free(be.layers);
    free(be.uploads);
    // NOTE: cuBLAS's handle and kernel modules, CUDA graphs (tens of MiB).
    *static_bytes = be.dev_bytes + ((size_t)96 << 20);
    return st;
}

nb_status nb_backend_cuda_new(const nb_backend_config *cfg, nb_backend **out, char *err,
                              size_t err_len) {
    nb_status st = check_config(cfg, err, err_len);
    if (st != NB_OK) return st;
    if (!nb_kv_layout_valid(&cfg->layout)) {
        nb_set_err(err, err_len, "cuda backend: invalid KV layout");
        return NB_ERR_INVALID_ARG;
    }
    *out = NULL;
    if ((st = set_device(cfg->device, err, err_len)) != NB_OK) return st;
    cuda_backend *be = calloc(1, sizeof(*be));
    if (!be) {
        nb_set_err(err, err_len, "cuda backend: out of host memory");
        return NB_ERR_OUT_OF_MEMORY;
    }
    be->base.ops = &cuda_ops;
    be->cfg = *cfg;
    be->mc = nb_model_get_config(cfg->model);
    be->mw = nb_model_get_weights(cfg->model);
    be->lay = cfg->layout;
    cudaError_t e = cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        st = cuda_fail(err, err_len, "stream", e);
        goto fail;
    }
    if (cublasCreate(&be->blas) != CUBLAS_STATUS_SUCCESS) {
        nb_set_err(err, err_len, "cuda backend: cublasCreate failed");
        st = NB_ERR_BACKEND;
        goto fail;
    }
    if ((st = build_static(be, err, err_len)) != NB_OK) goto fail;

    const nb_kv_layout *lay = &be->lay;
    size_t plane = nb_kv_plane_bytes(lay), scales = nb_kv_scales_bytes(lay), fp = nb_kv_fp_bytes(lay);
    size_t before = be->dev_bytes;
    void *u = NULL, *lo = NULL, *sc = NULL, *f = NULL;
    if ((st = dev_alloc(be, &f, fp, err, err_len))) goto fail;
    if (cfg->bm->quantize && ((st = dev_alloc(be, &u, plane, err, err_len)) ||
                              (st = dev_alloc(be, &lo, plane, err, err_len)) ||
                              (st = dev_alloc(be, &sc, scales, err, err_len))))
        goto fail;
    be->pools = (nb_kv_pools){.upper = u, .lower = lo, .scales = sc, .fp = f};
    be->kv_bytes = be->dev_bytes - before;
    *out = &be->base;
    return NB_OK;
fail:
    cuda_destroy(&be->base);
    return st;
}

nb_status nb_backend_cuda_pools(const nb_backend *base, nb_kv_pools *pools) {
    if (!base || base->ops != &cuda_ops) return NB_ERR_INVALID_ARG;
    *pools = ((const cuda_backend *)base)->pools;
    return NB_OK;
}

// Layers whose gate|up or q|k|v copy of this kind has its rows moved for a
// fused epilogue (DENSE_ROPE: whose dense q|k|v takes dense_rope_stage); -1
// for another backend.
typedef enum { MOVED_SWIGLU, MOVED_ROPE, MOVED_DENSE_SWIGLU, DENSE_ROPE } moved_kind;
static int moved_layers(const nb_backend *base, moved_kind kind) {
    if (!base || base->ops != &cuda_ops) return -1;
    const cuda_backend *be = (const cuda_backend *)base;
    int n = 0;
    for (int l = 0; l < be->mc->n_layers; l++) {
        const dlayer *L = &be->layers[l];
        n += kind == MOVED_ROPE           ? be->fqkv && L->qkv.rope
             : kind == MOVED_SWIGLU       ? be->fgu && L->gu.swiglu
             : kind == MOVED_DENSE_SWIGLU ? be->fgu && L->gu.dswiglu
                                          : be->drope;
    }
    return n;
}

int nb_backend_cuda_swiglu_layers(const nb_backend *base) { return moved_layers(base, MOVED_SWIGLU); }

int nb_backend_cuda_rope_layers(const nb_backend *base) { return moved_layers(base, MOVED_ROPE); }

int nb_backend_cuda_dense_swiglu_layers(const nb_backend *base) { return moved_layers(base, MOVED_DENSE_SWIGLU); }

int nb_backend_cuda_dense_rope_layers(const nb_backend *base) { return moved_layers(base, DENSE_ROPE); }

long nb_backend_cuda_norm_posts(const nb_backend *base) {
    if (!base || base->ops != &cuda_ops) return -1;
    return ((const cuda_backend *)base)->norm_posts;
}

nb_status nb_backend_cuda_pass_timing(nb_backend *base, int on) {
    if (!base || base->ops != &cuda_ops) return NB_ERR_INVALID_ARG;
    cuda_backend *be = (cuda_backend *)base;
    for (int i = 0; on && i < 3; i++)
        if (!be->tm_ev[i] && cudaEventCreate(&be->tm_ev[i]) != cudaSuccess) return NB_ERR_BACKEND;
    be->tm_on = on != 0;
    be->tm_prev = -1;
    be->tm_busy_ms = be->tm_gap_ms = 0.0;
    be->tm_n = 0;
    return NB_OK;
}

void nb_backend_cuda_pass_times(const nb_backend *base, double *busy_ms, double *gap_ms, long *n) {
    const bool ok = base && base->ops == &cuda_ops;
    const cuda_backend *be = (const cuda_backend *)base;
    *busy_ms = ok ? be->tm_busy_ms : 0.0;
    *gap_ms = ok ? be->tm_gap_ms : 0.0;
    *n = ok ? be->tm_n : 0;
}
