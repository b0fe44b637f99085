// engine.c: sequences, commands and speculative acceptance on top of the
// block manager and a backend. See engine.h for the command semantics.
//
// The one idea: every command runs in steps, and every step is (1) block
// manager operations for each sequence, collecting work items, (2) the work
// items executed in order, (3) one batched forward pass, (4) per-sequence
// sampling and acceptance. A sequence that fails in (1) drops out of the
// step with its own status and its state unchanged.
#include "engine.h"

#include "nb_status.h"
#include <jemalloc/jemalloc.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "ops_ref.h"

typedef struct eseq {
    bool live;
    nb_sampling_params sp;
    int32_t next_token;  // sampled, not in the cache; -1 before the first prefill
    int32_t n_drafts;    // drafts awaiting VERIFY (d1..d_gamma), 0 when none
    int32_t drafts[NB_ENGINE_MAX_GAMMA];
    int64_t n_draft_tokens;
    int64_t n_accepted_tokens;
} eseq;

struct nb_engine {
    nb_engine_params p;
    const nb_model *model;
    const nb_model_config *mc;
    nb_bm_params bmp;
    nb_bm_t *bm;
    nb_backend *be;
    eseq *seqs;          // [max_seqs], indexed by block-manager slot
    nb_bm_work_list work;
    int32_t V;
    int32_t max_logit_rows;
    float *logits;       // [max_logit_rows][V]
    int32_t *sampled;    // [max_logit_rows] tokens the backend sampled (nb_fwd_batch.sampled)
    int32_t *n_acc;      // [max_seqs] verify results (nb_fwd_batch.n_accepted)
    nb_fwd_seq *fwd;     // [max_seqs]
    int32_t *fwd_slot;   // [max_seqs] sequence of each fwd entry
    int32_t *fwd_owner;  // [max_seqs] index into the command's arrays
    int32_t *cur;        // [max_seqs] current input token per active sequence
};

nb_engine_params nb_engine_default_params(void) {
    return (nb_engine_params){
        .backend = "cpu",
        .quantized_cache = true,
        .group_size = 128,
        .n_qblocks = 0,
        .n_fpblocks = 0,
        .kv_memory = (size_t)256 << 20,
        .max_seqs = 16,
        .max_seq_len = 0,
        .max_gamma = 8,
        .prefill_chunk = 1024,
        .max_batch_rows = 1024,
        .target_weights = NB_TARGET_WEIGHTS_MODEL,
        .draft_w4 = true,
        .draft_int4_kv = true,
        .prefix_cache = true,
        .kv_dtype = -1,
        .cuda_graphs = true,
    };
}

// Valid parameters, normalised: top_p 0 (a protocol's unset field) means 1.
static bool sampling_normalise(const nb_sampling_params *in, nb_sampling_params *out) {
    if (!in || !(in->temperature >= 0.0f) || !isfinite(in->temperature) || in->top_k < 0 ||
        !(in->top_p >= 0.0f && in->top_p <= 1.0f))
        return false;
    *out = *in;
    if (out->top_p == 0.0f) out->top_p = 1.0f;
    return true;
}

static eseq *eseq_get(nb_engine *e, int32_t seq) {
    if (seq < 0 || seq >= e->p.max_seqs || !e->seqs[seq].live) return NULL;
    return &e->seqs[seq];
}

static nb_status exec_work(nb_engine *e) {
    nb_status st = NB_OK;
    if (e->work.n > 0) st = e->be->ops->exec_work(e->be, e->work.items, e->work.n);
    e->work.n = 0;
    return st;
}

// ---------------------------------------------------------------------------
// lifecycle
// ---------------------------------------------------------------------------

nb_engine *nb_engine_new(const nb_model *model, const nb_engine_params *pin, char *err,
                         size_t err_len) {
    if (!model || !pin) {
        nb_set_err(err, err_len, "engine: NULL model or params");
        return NULL;
    }
    nb_engine_params p = *pin;
    const nb_model_config *mc = nb_model_get_config(model);
    const nb_model_weights *mw = nb_model_get_weights(model);
#ifdef NB_HAVE_CUDA
    const bool use_cuda = p.backend && strcmp(p.backend, "cuda") == 0;
    const char *built = "cpu, cuda";
#else
    const bool use_cuda = false;
    const char *built = "cpu";
#endif
    if (!p.backend || (strcmp(p.backend, "cpu") != 0 && !use_cuda)) {
        nb_set_err(err, err_len, "engine: backend '%s' is not available (this build has: %s)",
                p.backend ? p.backend : "(null)", built);
        return NULL;
    }
    if (p.gpu_memory_utilization != 0.0 &&
        (!use_cuda || !(p.gpu_memory_utilization > 0.0 && p.gpu_memory_utilization <= 1.0))) {
        nb_set_err(err, err_len, "engine: gpu_memory_utilization %g needs the cuda backend and (0, 1]",
                   p.gpu_memory_utilization);
        return NULL;
    }
    if (p.max_seq_len == 0) p.max_seq_len = mc->max_position_embeddings;
    // No prompt is longer than the context and no pass longer than
    // max_batch_rows: a larger chunk (the default 1,024 on a short-context
    // model, or beside a smaller --max-batch-rows) means as much as fits.
    if (p.max_seq_len >= 2 && p.prefill_chunk > p.max_seq_len) p.prefill_chunk = p.max_seq_len;
    if (p.max_batch_rows >= 1 && p.prefill_chunk > p.max_batch_rows) p.prefill_chunk = p.max_batch_rows;
    if (p.group_size < 1 || p.max_seqs < 1 || p.max_seq_len < 2 || p.max_gamma < 1 ||
        p.max_gamma > NB_ENGINE_MAX_GAMMA || p.max_gamma >= p.group_size || p.prefill_chunk < 1 ||
        p.max_batch_rows < p.prefill_chunk || p.max_batch_rows < p.max_gamma + 1 ||
        p.max_batch_rows < p.group_size ||
        p.n_qblocks < 0 || p.n_fpblocks < 0) {
        nb_set_err(err, err_len,
                "engine: invalid parameters (G %d, max_seqs %d, max_seq_len %d, max_gamma %d "
                "(1..%d and < G), prefill_chunk %d, max_batch_rows %d (>= G and > max_gamma))",
                p.group_size, p.max_seqs, p.max_seq_len, p.max_gamma, NB_ENGINE_MAX_GAMMA,
                p.prefill_chunk, p.max_batch_rows);
        return NULL;
    }
    if (mc->head_dim % 2 != 0) {
        nb_set_err(err, err_len, "engine: head_dim %d must be even", mc->head_dim);
        return NULL;
    }
    nb_dtype kv_dt = p.kv_dtype < 0 ? mw->tok_embd.dtype : (nb_dtype)p.kv_dtype;
    if (kv_dt != NB_DTYPE_F32 && kv_dt != NB_DTYPE_F16 && kv_dt != NB_DTYPE_BF16) {
        nb_set_err(err, err_len, "engine: kv_dtype %d is not f32, f16 or bf16", p.kv_dtype);
        return NULL;
    }

    nb_engine *e = calloc(1, sizeof(*e));
    if (!e) {
        nb_set_err(err, err_len, "engine: out of host memory");
        return NULL;
    }
    e->p = p;
    e->model = model;
    e->mc = mc;
    e->V = mc->vocab_size;

    // Memory plan: FP blocks for every sequence's double buffer and drafts,
    // plus one pass's worth of prefill chunks shared by all sequences (each
    // pass is flushed before the next: nb_bm_fp_pool_blocks), or, unquantized,
    // everything; the rest of kv_memory for quantized blocks.
    nb_bm_params bmp = nb_bm_default_params();
    bmp.group_size = p.group_size;
    bmp.max_seqs = p.max_seqs;
    bmp.max_seq_len = p.max_seq_len;
    // An append adds a prefill chunk, a verify's gamma + 1 tokens, or the G
    // tokens that follow an adopted prefix (nb_engine_prefill).
    bmp.max_append = p.prefill_chunk > p.max_gamma + 1 ? p.prefill_chunk : p.max_gamma + 1;
    if (bmp.max_append < p.group_size) bmp.max_append = p.group_size;
    bmp.quantize = p.quantized_cache;
    bmp.prefix_cache = p.prefix_cache && p.quantized_cache;
    nb_kv_layout lay = {.n_layers = mc->n_layers, .n_kv_heads = mc->n_kv_heads,
                        .head_dim = mc->head_dim, .group_size = p.group_size, .dtype = kv_dt};
    bmp.qblock_bytes = nb_kv_qblock_bytes(&lay);
    bmp.fpblock_bytes = nb_kv_fpblock_bytes(&lay);
    // Every pass appends at most max_batch_rows tokens (prefill takes chunks
    // from that budget), and pending drafts are at most max_gamma + 1.
    int32_t fp_pool = nb_bm_fp_pool_blocks(&bmp, p.max_gamma + 1, p.max_batch_rows);
    if (p.quantized_cache && fp_pool < 1) {
        nb_set_err(err, err_len, "engine: max_seqs %d and max_batch_rows %d are too large to plan",
                   p.max_seqs, p.max_batch_rows);
        goto out_free;
    }
    e->max_logit_rows = p.max_batch_rows < 256 ? p.max_batch_rows : 256;
    if (e->max_logit_rows < p.max_gamma + 1) e->max_logit_rows = p.max_gamma + 1;
    nb_backend_config bc = {
        .model = model,
        .layout = lay,
        .bm = &bmp,
        .max_rows = p.max_batch_rows,
        .max_seq_len = p.max_seq_len,
        .target_weights = p.target_weights,
        .draft_w4 = p.draft_w4,
        .draft_view = p.draft_int4_kv ? NB_KV_VIEW_DRAFT : NB_KV_VIEW_TARGET,
        .max_logit_rows = e->max_logit_rows,
        .max_gamma = p.max_gamma,
        .device = p.device,
        .cuda_graphs = p.cuda_graphs,
        .host_sampling = p.host_sampling,
        .draft_batch_invariant = p.draft_batch_invariant,
    };
#ifdef NB_HAVE_CUDA
    // Memory plan as vLLM: weights and workspace first, the KV pools get the
    // rest of the share of the device this engine may use.
    if (use_cuda && p.gpu_memory_utilization > 0.0 && p.n_qblocks == 0 && p.n_fpblocks == 0) {
        size_t stat = 0, dfree = 0, dtotal = 0;
        if (nb_backend_cuda_plan(&bc, &stat, &dfree, &dtotal, err, err_len) != NB_OK) goto out_free;
        double budget = p.gpu_memory_utilization * (double)dtotal - (double)(dtotal - dfree) - (double)stat;
        if (budget < (double)bmp.fpblock_bytes) {
            nb_set_err(err, err_len,
                       "engine: gpu_memory_utilization %g of %.1f GiB leaves no room for the KV cache "
                       "(%.2f GiB in use on the device, %.2f GiB of weights and workspace)",
                       p.gpu_memory_utilization, dtotal / 1073741824.0, (dtotal - dfree) / 1073741824.0,
                       stat / 1073741824.0);
            goto out_free;
        }
        // More blocks than every sequence at full length (4 times over, for
        // the prefix cache) would only cost host memory for their records.
        int64_t groups = p.max_seq_len / p.group_size + 2;
        double cap = p.quantized_cache
                         ? (double)fp_pool * bmp.fpblock_bytes +
                               4.0 * p.max_seqs * groups * bmp.qblock_bytes
                         : 4.0 * p.max_seqs * groups * bmp.fpblock_bytes;
        p.kv_memory = (size_t)(budget < cap ? budget : cap);
        e->p = p;
    }
#endif
    if (p.n_qblocks == 0 && p.n_fpblocks == 0) {
        if (p.quantized_cache) {
            int64_t fp = fp_pool;
            int64_t left = (int64_t)p.kv_memory - fp * (int64_t)bmp.fpblock_bytes;
            p.n_fpblocks = (int32_t)fp;
            p.n_qblocks = left > 0 ? (int32_t)(left / (int64_t)bmp.qblock_bytes) : 0;
        } else {
            p.n_fpblocks = (int32_t)(p.kv_memory / bmp.fpblock_bytes);
        }
        e->p = p;
    }
    if (p.n_fpblocks < 1) {
        nb_set_err(err, err_len, "engine: kv_memory %zu bytes holds no FP block (%zu bytes each)",
                p.kv_memory, bmp.fpblock_bytes);
        goto out_free;
    }
    bmp.n_qblocks = p.quantized_cache ? p.n_qblocks : 0;
    bmp.n_fpblocks = p.n_fpblocks;
    // The salt ties cached blocks to this model and cache format.
    {
        struct {
            int32_t layers, hidden, heads, kv_heads, head_dim, vocab, G, dtype;
        } salt = {mc->n_layers, mc->hidden_size, mc->n_heads, mc->n_kv_heads, mc->head_dim,
                  mc->vocab_size, p.group_size, (int32_t)kv_dt};
        const char *dir = nb_model_get_dir(model);
        bmp.cache_salt = XXH3_64bits_withSeed(&salt, sizeof(salt), XXH3_64bits(dir, strlen(dir)));
    }
    e->bmp = bmp;
    e->bm = nb_bm_new(&bmp, err, err_len);
    if (!e->bm) goto out_free;
    lay.n_qblocks = bmp.n_qblocks;
    lay.n_fpblocks = bmp.n_fpblocks;

    bc.layout = lay;
    bc.bm = nb_bm_params_get(e->bm);
#ifdef NB_HAVE_CUDA
    if (use_cuda) {
        if (nb_backend_cuda_new(&bc, &e->be, err, err_len) != NB_OK) goto out_free;
    } else
#endif
    if (nb_backend_cpu_new(&bc, &e->be, err, err_len) != NB_OK) goto out_free;
    int32_t wcap = p.max_seqs * (nb_bm_work_max_per_op(e->bm) + 2);
    e->work.items = calloc((size_t)wcap, sizeof(nb_bm_work));
    e->work.cap = wcap;
    e->seqs = calloc((size_t)p.max_seqs, sizeof(eseq));
    e->logits = malloc((size_t)e->max_logit_rows * e->V * sizeof(float));
    e->sampled = malloc((size_t)e->max_logit_rows * sizeof(int32_t));
    e->n_acc = calloc((size_t)p.max_seqs, sizeof(int32_t));
    e->fwd = calloc((size_t)p.max_seqs, sizeof(nb_fwd_seq));
    e->fwd_owner = calloc((size_t)p.max_seqs, sizeof(int32_t));
    e->fwd_slot = calloc((size_t)p.max_seqs, sizeof(int32_t));
    e->cur = calloc((size_t)p.max_seqs, sizeof(int32_t));
    if (!e->work.items || !e->seqs || !e->logits || !e->sampled || !e->n_acc || !e->fwd ||
        !e->fwd_owner || !e->fwd_slot || !e->cur) {
        nb_set_err(err, err_len, "engine: out of host memory");
        goto out_free;
    }
    return e;

out_free:
    nb_engine_destroy(&e);
    return NULL;
}

void nb_engine_destroy(nb_engine **e_p) {
    if (!e_p || !*e_p) return;
    nb_engine *e = *e_p;
    if (e->be) e->be->ops->destroy(e->be);
    nb_bm_destroy(&e->bm);
    free(e->work.items);
    free(e->seqs);
    free(e->logits);
    free(e->sampled);
    free(e->n_acc);
    free(e->fwd);
    free(e->fwd_owner);
    free(e->fwd_slot);
    free(e->cur);
    free(e);
    *e_p = NULL;
}

const nb_model_config *nb_engine_model_config(const nb_engine *e) { return e->mc; }
const nb_engine_params *nb_engine_params_get(const nb_engine *e) { return &e->p; }
const nb_bm_t *nb_engine_block_manager(const nb_engine *e) { return e->bm; }
nb_backend *nb_engine_backend(nb_engine *e) { return e->be; }

// ---------------------------------------------------------------------------
// sequences
// ---------------------------------------------------------------------------

static nb_status eseq_init(nb_engine *e, int32_t seq, const nb_sampling_params *sp) {
    eseq *es = &e->seqs[seq];
    memset(es, 0, sizeof(*es));
    es->live = true;
    es->sp = *sp;
    es->next_token = -1;
    return NB_OK;
}

nb_status nb_engine_seq_add(nb_engine *e, const nb_sampling_params *sp_in, int32_t *seq) {
    nb_sampling_params sp;
    if (!seq || !sampling_normalise(sp_in, &sp)) return NB_ERR_INVALID_ARG;
    nb_status st = nb_bm_seq_add(e->bm, seq);
    if (st != NB_OK) return st;
    st = eseq_init(e, *seq, &sp);
    if (st != NB_OK) nb_bm_seq_free(e->bm, *seq);
    return st;
}

nb_status nb_engine_seq_free(nb_engine *e, int32_t seq) {
    eseq *es = eseq_get(e, seq);
    if (!es) return NB_ERR_NOT_FOUND;
    nb_status st = nb_bm_seq_free(e->bm, seq);
    NB_ASSERT(st == NB_OK);
    es->live = false;
    return NB_OK;
}

nb_status nb_engine_seq_fork(nb_engine *e, int32_t parent, const nb_sampling_params *sp,
                             int32_t *child) {
    eseq *ps = eseq_get(e, parent);
    if (!ps) return NB_ERR_NOT_FOUND;
    nb_sampling_params csp = ps->sp;
    if (!child || (sp && !sampling_normalise(sp, &csp))) return NB_ERR_INVALID_ARG;
    if (ps->n_drafts > 0) return NB_ERR_STATE;
    nb_status st = nb_bm_seq_fork(e->bm, parent, child);
    if (st != NB_OK) return st;
    int32_t next = ps->next_token;
    st = eseq_init(e, *child, &csp);
    if (st != NB_OK) {
        nb_bm_seq_free(e->bm, *child);
        return st;
    }
    e->seqs[*child].next_token = next;
    return NB_OK;
}

nb_status nb_engine_seq_info_get(const nb_engine *e, int32_t seq, nb_engine_seq_info *info) {
    if (!info || seq < 0 || seq >= e->p.max_seqs || !e->seqs[seq].live) return NB_ERR_NOT_FOUND;
    nb_bm_seq_view v;
    nb_bm_seq_view_get(e->bm, seq, &v);
    const eseq *es = &e->seqs[seq];
    info->n_committed = v.n_committed;
    info->n_drafted = v.n_drafted;
    info->next_token = es->next_token;
    info->n_qblocks = v.n_qblocks;
    info->n_fpblocks = v.n_fpblocks;
    info->n_draft_tokens = es->n_draft_tokens;
    info->n_accepted_tokens = es->n_accepted_tokens;
    return NB_OK;
}

const int32_t *nb_engine_seq_tokens(const nb_engine *e, int32_t seq) {
    if (seq < 0 || seq >= e->p.max_seqs || !e->seqs[seq].live) return NULL;
    nb_bm_seq_view v;
    nb_bm_seq_view_get(e->bm, seq, &v);
    return v.tokens;
}

// ---------------------------------------------------------------------------
// forward passes in sub-batches
// ---------------------------------------------------------------------------

// Called once per sequence of the list after its sub-batch ran, with its
// logits ([n_logits][V]; NULL unless the list asked for all logits), the
// tokens the backend sampled for it ([n_logits], nb_fwd_batch.sampled) and,
// for a verify, its n_accepted.
typedef void (*consume_fn)(nb_engine *e, void *ctx, int32_t k, const float *logits,
                           const int32_t *sampled, int32_t n_acc);

// Runs the forward list in sub-batches. Tokens are sampled, and drafts
// accepted, by the backend where the logits are (on the GPU: a few bytes per
// row cross the bus instead of 4V); the logits themselves come back only
// with all_logits (log-probabilities or scores asked for).
static nb_status run_forward(nb_engine *e, nb_fwd_mode mode, int32_t n, consume_fn fn, void *ctx,
                             bool all_logits) {
    for (int32_t k0 = 0; k0 < n;) {
        int32_t rows = 0, lrows = 0, k1 = k0;
        while (k1 < n && rows + e->fwd[k1].n_rows <= e->p.max_batch_rows &&
               lrows + e->fwd[k1].n_logits <= e->max_logit_rows) {
            rows += e->fwd[k1].n_rows;
            lrows += e->fwd[k1].n_logits;
            k1++;
        }
        NB_ASSERT(k1 > k0); // a single sequence always fits (checked at creation)
        // Views are read now: block tables may have changed since the list was built.
        for (int32_t k = k0; k < k1; k++)
            NB_ASSERT(nb_bm_seq_view_get(e->bm, e->fwd_slot[k], &e->fwd[k].view) == NB_OK);
        const bool skip = !all_logits;
        nb_fwd_batch b = {.mode = mode, .n_seqs = k1 - k0, .seqs = e->fwd + k0, .logits = e->logits,
                          .skip_logits = skip, .sampled = e->sampled, .n_accepted = e->n_acc};
        char err[256];
        nb_status st = e->be->ops->forward(e->be, &b, err, sizeof(err));
        if (st != NB_OK) {
            fprintf(stderr, "nibbler: forward pass failed: %s\n", err);
            return st;
        }
        const float *lg = e->logits;
        const int32_t *tok = e->sampled;
        for (int32_t k = k0; k < k1; k++) {
            fn(e, ctx, k, skip ? NULL : lg, tok, e->n_acc[k - k0]);
            lg += (size_t)e->fwd[k].n_logits * e->V;
            tok += e->fwd[k].n_logits;
        }
        k0 = k1;
    }
    return NB_OK;
}

// Adds sequence `seq` (command index `owner`) to the forward list, its
// logit rows sampled as `sample` says with the sequence's parameters. Target
// tokens use rng stream 2, the stream of corrections and bonus tokens, so a
// bonus is what target-only decoding would draw (backend.h, sampling.h).
static nb_fwd_seq *fwd_push(nb_engine *e, int32_t *nf, int32_t seq, int32_t owner, int32_t pos0,
                            int32_t n_rows, const int32_t *tokens, int32_t n_logits,
                            nb_fwd_sample sample) {
    int32_t k = (*nf)++;
    e->fwd_slot[k] = seq;
    e->fwd_owner[k] = owner;
    e->fwd[k] = (nb_fwd_seq){.pos0 = pos0, .n_rows = n_rows, .tokens = tokens, .n_logits = n_logits,
                             .sample = n_logits > 0 ? sample : NB_FWD_SAMPLE_NONE,
                             .sp = &e->seqs[seq].sp, .slot = seq};
    return &e->fwd[k];
}

// log softmax of raw logits at token t (double accumulation).
static float token_logprob(const float *logits, int32_t V, int32_t t) {
    double mx = -INFINITY, sum = 0.0;
    for (int32_t j = 0; j < V; j++) mx = logits[j] > mx ? logits[j] : mx;
    for (int32_t j = 0; j < V; j++) sum += exp((double)logits[j] - mx);
    return (float)((double)logits[t] - mx - log(sum));
}

// ---------------------------------------------------------------------------
// PREFILL
// ---------------------------------------------------------------------------

typedef struct prefill_ctx {
    const int32_t *seqs;
    const int32_t *lens;
    int32_t *done;  // [n] prompt tokens appended so far
    int32_t *next;
    float *next_logprob;
    nb_status *st;
} prefill_ctx;

static void prefill_consume(nb_engine *e, void *vctx, int32_t k, const float *logits,
                            const int32_t *sampled, int32_t n_acc) {
    (void)n_acc;
    prefill_ctx *c = vctx;
    const nb_fwd_seq *f = &e->fwd[k];
    if (f->n_logits == 0) return;
    int32_t i = e->fwd_owner[k];
    eseq *es = &e->seqs[c->seqs[i]];
    es->next_token = sampled[0];
    if (es->next_token < 0) c->st[i] = NB_ERR_NON_FINITE;
    c->next[i] = es->next_token;
    if (c->next_logprob && es->next_token >= 0)
        c->next_logprob[i] = token_logprob(logits, e->V, es->next_token);
}

nb_status nb_engine_prefill(nb_engine *e, int32_t n, const int32_t *seqs,
                            const int32_t *const *prompts, const int32_t *lens, int32_t *next,
                            float *next_logprob, int32_t *n_cached, nb_status *st) {
    if (n < 0 || n > e->p.max_seqs || (n > 0 && (!seqs || !prompts || !lens || !next || !st)))
        return NB_ERR_INVALID_ARG;
    int32_t done[n > 0 ? n : 1];
    for (int32_t i = 0; i < n; i++) {
        done[i] = 0;
        next[i] = -1;
        if (n_cached) n_cached[i] = 0;
        st[i] = NB_OK;
        eseq *es = eseq_get(e, seqs[i]);
        if (!es) { st[i] = NB_ERR_NOT_FOUND; continue; }
        for (int32_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) st[i] = NB_ERR_INVALID_ARG; // named twice
        if (st[i] != NB_OK) continue;
        if (es->n_drafts > 0) { st[i] = NB_ERR_STATE; continue; }
        if (lens[i] < 1 || !prompts[i]) { st[i] = NB_ERR_INVALID_ARG; continue; }
        for (int32_t t = 0; t < lens[i]; t++)
            if (prompts[i][t] < 0 || prompts[i][t] >= e->V) st[i] = NB_ERR_INVALID_ARG;
        if (st[i] != NB_OK) continue;
        nb_bm_seq_view v;
        nb_bm_seq_view_get(e->bm, seqs[i], &v);
        if ((int64_t)v.n_committed + lens[i] + 1 > e->p.max_seq_len) st[i] = NB_ERR_CONTEXT_TOO_LONG;
    }
    prefill_ctx ctx = {.seqs = seqs, .lens = lens, .done = done, .next = next,
                       .next_logprob = next_logprob, .st = st};
    for (;;) {
        int32_t nf = 0, budget = e->p.max_batch_rows;
        for (int32_t i = 0; i < n && budget > 0; i++) {
            if (st[i] != NB_OK || done[i] == lens[i]) continue;
            nb_bm_seq_view v;
            nb_bm_seq_view_get(e->bm, seqs[i], &v);
            int32_t chunk = e->p.prefill_chunk < budget ? e->p.prefill_chunk : budget;
            int32_t rest = lens[i] - done[i];
            int32_t take = rest < chunk ? rest : chunk;
            if (v.n_committed == 0 && done[i] == 0) {
                // Hand the block manager the cached prefix plus what follows
                // it: at least G tokens, since the manager keeps >= G exact
                // tokens after an adopted prefix (so a chunk < G would let it
                // adopt nothing).
                int32_t G = nb_bm_params_get(e->bm)->group_size;
                int32_t lookup = nb_bm_prefix_lookup(e->bm, prompts[i], lens[i]);
                int32_t first = chunk > G ? chunk : G;
                if (lookup > 0) take = lens[i] - lookup < first ? lens[i] : lookup + first;
            }
            int32_t cached = 0;
            nb_status s = nb_bm_seq_append(e->bm, seqs[i], prompts[i] + done[i], take,
                                           NB_BM_COMMITTED, &cached, &e->work);
            if (s != NB_OK) { st[i] = s; continue; }
            nb_bm_seq_view_get(e->bm, seqs[i], &v);
            if (n_cached) n_cached[i] += cached;
            int32_t rows = take - cached;
            int32_t pos0 = v.n_committed - rows;
            done[i] += take;
            fwd_push(e, &nf, seqs[i], i, pos0, rows, v.tokens + pos0, done[i] == lens[i] ? 1 : 0,
                     NB_FWD_SAMPLE_TARGET);
            budget -= rows;
        }
        if (nf == 0) break;
        nb_status s = exec_work(e);
        if (s != NB_OK) return s;
        s = run_forward(e, NB_FWD_TARGET, nf, prefill_consume, &ctx, next_logprob != NULL);
        if (s != NB_OK) return s;
        for (int32_t k = 0; k < nf; k++) {
            s = nb_bm_seq_flush(e->bm, e->fwd_slot[k], &e->work);
            NB_ASSERT(s == NB_OK);
        }
        s = exec_work(e);
        if (s != NB_OK) return s;
    }
    for (int32_t i = 0; i < n; i++)
        if (st[i] == NB_OK) e->seqs[seqs[i]].n_drafts = 0;
    return NB_OK;
}

// ---------------------------------------------------------------------------
// DRAFT
// ---------------------------------------------------------------------------

typedef struct draft_ctx {
    const int32_t *seqs;
    int32_t gamma;
    int32_t step;
    int32_t *drafts;
    nb_status *st;
} draft_ctx;

static void draft_consume(nb_engine *e, void *vctx, int32_t k, const float *logits,
                          const int32_t *sampled, int32_t n_acc) {
    (void)logits;
    (void)n_acc;
    draft_ctx *c = vctx;
    int32_t i = e->fwd_owner[k];
    // The backend kept the draft distribution q in the sequence's slot for VERIFY.
    int32_t d = sampled[0];
    if (d < 0) {
        c->st[i] = NB_ERR_NON_FINITE;
        return;
    }
    c->drafts[i * c->gamma + c->step] = d;
    e->cur[i] = d;
}

nb_status nb_engine_draft(nb_engine *e, int32_t n, const int32_t *seqs, int32_t gamma,
                          int32_t *drafts, nb_status *st) {
    if (n < 0 || n > e->p.max_seqs || gamma < 1 || gamma > e->p.max_gamma ||
        (n > 0 && (!seqs || !drafts || !st)))
        return NB_ERR_INVALID_ARG;
    for (int32_t i = 0; i < n; i++) {
        st[i] = NB_OK;
        eseq *es = eseq_get(e, seqs[i]);
        if (!es) { st[i] = NB_ERR_NOT_FOUND; continue; }
        for (int32_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) st[i] = NB_ERR_INVALID_ARG;
        if (st[i] != NB_OK) continue;
        if (es->next_token < 0 || es->n_drafts > 0) { st[i] = NB_ERR_STATE; continue; }
        nb_bm_seq_view v;
        nb_bm_seq_view_get(e->bm, seqs[i], &v);
        // verify will hold next + gamma drafts
        if ((int64_t)v.n_committed + gamma + 1 > e->p.max_seq_len) {
            st[i] = NB_ERR_CONTEXT_TOO_LONG;
            continue;
        }
        e->cur[i] = es->next_token;
    }
    draft_ctx ctx = {.seqs = seqs, .gamma = gamma, .drafts = drafts, .st = st};
    for (int32_t step = 0; step < gamma; step++) {
        int32_t nf = 0;
        for (int32_t i = 0; i < n; i++) {
            if (st[i] != NB_OK) continue;
            nb_status s = nb_bm_seq_append(e->bm, seqs[i], &e->cur[i], 1, NB_BM_DRAFTED, NULL,
                                           &e->work);
            if (s != NB_OK) {
                // Undo this sequence's drafts: the command is all or nothing per sequence.
                st[i] = s;
                nb_status u = nb_bm_seq_accept(e->bm, seqs[i], 0, &e->work);
                NB_ASSERT(u == NB_OK);
                continue;
            }
            nb_bm_seq_view v;
            nb_bm_seq_view_get(e->bm, seqs[i], &v);
            int32_t pos = v.n_committed + v.n_drafted - 1;
            fwd_push(e, &nf, seqs[i], i, pos, 1, v.tokens + pos, 1, NB_FWD_SAMPLE_DRAFT)->draft_step =
                step;
        }
        nb_status s = exec_work(e);
        if (s != NB_OK) return s;
        if (nf == 0) break;
        ctx.step = step;
        s = run_forward(e, NB_FWD_DRAFT, nf, draft_consume, &ctx, false);
        if (s != NB_OK) return s;
        for (int32_t i = 0; i < n; i++) { // a sampling failure undoes that sequence's drafts
            if (st[i] == NB_ERR_NON_FINITE && e->seqs[seqs[i]].n_drafts == 0) {
                nb_bm_seq_view v;
                nb_bm_seq_view_get(e->bm, seqs[i], &v);
                if (v.n_drafted > 0) NB_ASSERT(nb_bm_seq_accept(e->bm, seqs[i], 0, &e->work) == NB_OK);
            }
        }
    }
    nb_status s = exec_work(e);
    if (s != NB_OK) return s;
    for (int32_t i = 0; i < n; i++) {
        if (st[i] != NB_OK) continue;
        eseq *es = &e->seqs[seqs[i]];
        es->n_drafts = gamma;
        memcpy(es->drafts, drafts + (size_t)i * gamma, (size_t)gamma * sizeof(int32_t));
        es->n_draft_tokens += gamma;
    }
    return NB_OK;
}

// ---------------------------------------------------------------------------
// VERIFY
// ---------------------------------------------------------------------------

typedef struct verify_ctx {
    const int32_t *seqs;
    int32_t *out;
    float *out_logprobs;
    int32_t *n_out;
    int32_t *n_accepted;
    nb_status *st;
    nb_status fail;
} verify_ctx;

static void verify_consume(nb_engine *e, void *vctx, int32_t k, const float *logits,
                           const int32_t *sampled, int32_t n_acc) {
    verify_ctx *c = vctx;
    int32_t i = e->fwd_owner[k];
    int32_t seq = c->seqs[i];
    eseq *es = &e->seqs[seq];
    const int32_t V = e->V, stride = e->p.max_gamma + 1;
    int32_t *out = c->out + (size_t)i * stride;
    // The backend accepted (counter0: the position of d1, sampling.h).
    if (n_acc < 0) {
        // Keep the drafts pending: the scheduler may roll back.
        c->st[i] = NB_ERR_NON_FINITE;
        return;
    }
    const int acc = n_acc;
    memcpy(out, sampled, (size_t)(acc + 1) * sizeof(int32_t));
    nb_status s;
    // next, d1..d_acc become committed; the correction/bonus is the new next.
    s = nb_bm_seq_accept(e->bm, seq, acc + 1, &e->work);
    NB_ASSERT(s == NB_OK);
    s = exec_work(e);
    if (s != NB_OK) c->fail = s;
    if (c->out_logprobs)
        for (int r = 0; r <= acc; r++)
            c->out_logprobs[(size_t)i * stride + r] = token_logprob(logits + (size_t)r * V, V, out[r]);
    es->next_token = out[acc];
    es->n_drafts = 0;
    es->n_accepted_tokens += acc;
    c->n_out[i] = acc + 1;
    c->n_accepted[i] = acc;
}

nb_status nb_engine_verify(nb_engine *e, int32_t n, const int32_t *seqs, int32_t *out,
                           float *out_logprobs, int32_t *n_out, int32_t *n_accepted,
                           nb_status *st) {
    if (n < 0 || n > e->p.max_seqs || (n > 0 && (!seqs || !out || !n_out || !n_accepted || !st)))
        return NB_ERR_INVALID_ARG;
    int32_t nf = 0;
    for (int32_t i = 0; i < n; i++) {
        st[i] = NB_OK;
        n_out[i] = n_accepted[i] = 0;
        eseq *es = eseq_get(e, seqs[i]);
        if (!es) { st[i] = NB_ERR_NOT_FOUND; continue; }
        for (int32_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) st[i] = NB_ERR_INVALID_ARG;
        if (st[i] != NB_OK) continue;
        if (es->n_drafts == 0) { st[i] = NB_ERR_STATE; continue; }
        // The last draft's KV is written by this pass.
        int32_t last = es->drafts[es->n_drafts - 1];
        nb_status s = nb_bm_seq_append(e->bm, seqs[i], &last, 1, NB_BM_DRAFTED, NULL, &e->work);
        if (s != NB_OK) { st[i] = s; continue; }
        nb_bm_seq_view v;
        nb_bm_seq_view_get(e->bm, seqs[i], &v);
        NB_ASSERT(v.n_drafted == es->n_drafts + 1);
        fwd_push(e, &nf, seqs[i], i, v.n_committed, v.n_drafted, v.tokens + v.n_committed,
                 v.n_drafted, NB_FWD_SAMPLE_VERIFY)->drafts = es->drafts;
    }
    nb_status s = exec_work(e);
    if (s != NB_OK) return s;
    if (nf == 0) return NB_OK;
    verify_ctx ctx = {.seqs = seqs, .out = out, .out_logprobs = out_logprobs, .n_out = n_out,
                      .n_accepted = n_accepted, .st = st, .fail = NB_OK};
    s = run_forward(e, NB_FWD_TARGET, nf, verify_consume, &ctx, out_logprobs != NULL);
    if (s != NB_OK) return s;
    // A sequence whose acceptance failed drops the verify position again.
    for (int32_t k = 0; k < nf; k++) {
        int32_t i = e->fwd_owner[k];
        if (st[i] == NB_OK) continue;
        nb_bm_seq_view v;
        nb_bm_seq_view_get(e->bm, seqs[i], &v);
        NB_ASSERT(nb_bm_seq_rollback(e->bm, seqs[i], v.n_committed, &e->work) == NB_OK);
        e->seqs[seqs[i]].n_drafts = 0;
    }
    s = exec_work(e);
    return ctx.fail != NB_OK ? ctx.fail : s;
}

// ---------------------------------------------------------------------------
// DECODE
// ---------------------------------------------------------------------------

typedef struct decode_ctx {
    const int32_t *seqs;
    int32_t n_steps;
    int32_t *out;
    float *out_logprobs;
    int32_t *n_out;
    nb_status *st;
} decode_ctx;

static void decode_consume(nb_engine *e, void *vctx, int32_t k, const float *logits,
                           const int32_t *sampled, int32_t n_acc) {
    (void)n_acc;
    decode_ctx *c = vctx;
    int32_t i = e->fwd_owner[k];
    eseq *es = &e->seqs[c->seqs[i]];
    int32_t t = sampled[0];
    if (t < 0) {
        c->st[i] = NB_ERR_NON_FINITE;
        es->next_token = -1;
        return;
    }
    es->next_token = t;
    size_t at = (size_t)i * c->n_steps + c->n_out[i]++;
    c->out[at] = t;
    if (c->out_logprobs) c->out_logprobs[at] = token_logprob(logits, e->V, t);
}

nb_status nb_engine_decode(nb_engine *e, int32_t n, const int32_t *seqs, int32_t n_steps,
                           int32_t *out, float *out_logprobs, int32_t *n_out, nb_status *st) {
    if (n < 0 || n > e->p.max_seqs || n_steps < 1 || (n > 0 && (!seqs || !out || !n_out || !st)))
        return NB_ERR_INVALID_ARG;
    for (int32_t i = 0; i < n; i++) {
        st[i] = NB_OK;
        n_out[i] = 0;
        eseq *es = eseq_get(e, seqs[i]);
        if (!es) { st[i] = NB_ERR_NOT_FOUND; continue; }
        for (int32_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) st[i] = NB_ERR_INVALID_ARG;
        if (st[i] != NB_OK) continue;
        if (es->next_token < 0 || es->n_drafts > 0) st[i] = NB_ERR_STATE;
    }
    decode_ctx ctx = {.seqs = seqs, .n_steps = n_steps, .out = out, .out_logprobs = out_logprobs,
                      .n_out = n_out, .st = st};
    for (int32_t step = 0; step < n_steps; step++) {
        int32_t nf = 0;
        for (int32_t i = 0; i < n; i++) {
            if (st[i] != NB_OK) continue;
            eseq *es = &e->seqs[seqs[i]];
            nb_bm_seq_view v;
            nb_bm_seq_view_get(e->bm, seqs[i], &v);
            if (v.n_committed + 2 > e->p.max_seq_len) { st[i] = NB_ERR_CONTEXT_TOO_LONG; continue; }
            nb_status s = nb_bm_seq_append(e->bm, seqs[i], &es->next_token, 1, NB_BM_COMMITTED,
                                           NULL, &e->work);
            if (s != NB_OK) { st[i] = s; continue; }
            nb_bm_seq_view_get(e->bm, seqs[i], &v);
            fwd_push(e, &nf, seqs[i], i, v.n_committed - 1, 1, v.tokens + v.n_committed - 1, 1,
                     NB_FWD_SAMPLE_TARGET);
        }
        nb_status s = exec_work(e);
        if (s != NB_OK) return s;
        if (nf == 0) break;
        s = run_forward(e, NB_FWD_TARGET, nf, decode_consume, &ctx, out_logprobs != NULL);
        if (s != NB_OK) return s;
        for (int32_t k = 0; k < nf; k++)
            NB_ASSERT(nb_bm_seq_flush(e->bm, e->fwd_slot[k], &e->work) == NB_OK);
        s = exec_work(e);
        if (s != NB_OK) return s;
    }
    // A sequence stopped by a full pool still reports the tokens it made.
    return NB_OK;
}

// ---------------------------------------------------------------------------
// ROLLBACK, SCORE
// ---------------------------------------------------------------------------

nb_status nb_engine_rollback(nb_engine *e, int32_t seq, int32_t n) {
    eseq *es = eseq_get(e, seq);
    if (!es) return NB_ERR_NOT_FOUND;
    nb_bm_seq_view v;
    nb_bm_seq_view_get(e->bm, seq, &v);
    if (n < 0 || n > v.n_committed) return NB_ERR_INVALID_ARG;
    int32_t next = n < v.n_committed ? v.tokens[n] : es->next_token;
    nb_status st = nb_bm_seq_rollback(e->bm, seq, n, &e->work);
    if (st != NB_OK) return st;
    es->next_token = next;
    es->n_drafts = 0;
    return exec_work(e);
}

typedef struct score_ctx {
    const int32_t *tokens;
    int32_t n;
    double nll;
    nb_status st;
    float *logits; // [n][V] or NULL
} score_ctx;

static void score_consume(nb_engine *e, void *vctx, int32_t k, const float *logits,
                          const int32_t *sampled, int32_t n_acc) {
    (void)sampled;
    (void)n_acc;
    score_ctx *c = vctx;
    const nb_fwd_seq *f = &e->fwd[k];
    if (c->logits)
        memcpy(c->logits + (size_t)f->pos0 * e->V, logits, (size_t)f->n_rows * e->V * sizeof(float));
    for (int32_t r = 0; r < f->n_rows; r++) {
        int32_t p = f->pos0 + r;
        if (p + 1 >= c->n) break;
        double lp = token_logprob(logits + (size_t)r * e->V, e->V, c->tokens[p + 1]);
        if (!isfinite(lp)) c->st = NB_ERR_NON_FINITE;
        c->nll -= lp;
    }
}

nb_status nb_engine_score(nb_engine *e, int32_t seq, const int32_t *tokens, int32_t n,
                          int32_t chunk, nb_fwd_mode mode, double *nll, float *logits) {
    eseq *es = eseq_get(e, seq);
    if (!es) return NB_ERR_NOT_FOUND;
    if (!tokens || !nll || n < 2 || chunk < 1 || chunk > e->max_logit_rows ||
        chunk > e->p.prefill_chunk || (mode != NB_FWD_TARGET && mode != NB_FWD_DRAFT))
        return NB_ERR_INVALID_ARG;
    nb_bm_seq_view v;
    nb_bm_seq_view_get(e->bm, seq, &v);
    if (v.n_committed != 0 || es->n_drafts) return NB_ERR_STATE;
    if (n > e->p.max_seq_len) return NB_ERR_CONTEXT_TOO_LONG;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= e->V) return NB_ERR_INVALID_ARG;
    score_ctx ctx = {.tokens = tokens, .n = n, .nll = 0.0, .st = NB_OK, .logits = logits};
    for (int32_t done = 0; done < n;) {
        int32_t take = n - done < chunk ? n - done : chunk;
        // NOTE: no prefix adoption here: every row's logits are needed.
        nb_status s = nb_bm_seq_append(e->bm, seq, tokens + done, take, NB_BM_COMMITTED, NULL,
                                       &e->work);
        if (s == NB_OK) s = exec_work(e);
        if (s != NB_OK) return s;
        nb_bm_seq_view_get(e->bm, seq, &v);
        int32_t nf = 0;
        fwd_push(e, &nf, seq, 0, done, take, v.tokens + done, take, NB_FWD_SAMPLE_NONE);
        s = run_forward(e, mode, nf, score_consume, &ctx, true);
        if (s != NB_OK) return s;
        NB_ASSERT(nb_bm_seq_flush(e->bm, seq, &e->work) == NB_OK);
        s = exec_work(e);
        if (s != NB_OK) return s;
        done += take;
    }
    *nll += ctx.nll;
    return ctx.st;
}
