// test_block_manager_prop.c: property test of the block manager. Thousands of
// random operation sequences (add, committed appends in chunks, flush,
// drafts, accept/reject, rollback to random lengths, fork, free, prefix reuse
// over repeated token chains, admission probes, invalid calls) run against
// the tiny model of bm_model.h, with invariants checked after EVERY step:
// token counts and ids, the FP region's bounds, nb_bm_check, refcounts
// recomputed from every view, stats accounting, no leaks, rollback
// equivalence with a sequence that only ever committed n tokens, and the
// engine's simulated KV data read back through every view. Failed operations
// (tiny pools make NB_ERR_NO_FREE_BLOCKS common) must leave the whole
// observable state unchanged and append no work items.
//
// Usage: test_block_manager_prop [runs [steps [base_seed]]]
// A failure prints the seed of its run; rerun just that run with
// `test_block_manager_prop 1 <steps> <seed>`.
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block_manager.h"
#include "bm_model.h"
#include "nb_test.h"

typedef struct seq_info {
    bool unflushed;     // a committed append whose flush has not run yet
    int32_t prompt;     // the prompt chain its tokens still follow, or -1
} seq_info;

typedef struct run {
    uint64_t seed;
    int32_t step;
    char op[192];
    bool failed;
    nb_bm_params p;
    int32_t G;
    nb_bm_t *bm;
    bm_model m;
    seq_info *info;
    bm_sim sim;
    nb_bm_work *items;
    int32_t max_items;
    nb_bm_work_list w;
    bm_rng rng;
    int32_t n_prompts;
    int32_t *prompts; // [n_prompts][max_seq_len]
    int32_t *tmp;     // [max_seq_len + max_append]
    int32_t *qcount, *fpcount;
    // figures
    long n_ops, n_fail_blocks, n_hits, n_deq, n_cow, n_preq, n_admit;
} run;

static long g_total_ops, g_total_nfb, g_total_hits, g_total_deq, g_total_cow, g_total_preq,
    g_total_admit;

static void fail(run *r, const char *fmt, ...) {
    if (r->failed) return;
    r->failed = true;
    nb_test_failures++;
    fprintf(stderr, "FAIL seed 0x%016" PRIx64 " step %d (G %d, q %d, prefix %d, seqs %d, len %d, "
            "append %d, qpool %d, fppool %d) after op [%s]: ",
            r->seed, r->step, r->G, r->p.quantize, r->p.prefix_cache, r->p.max_seqs,
            r->p.max_seq_len, r->p.max_append, r->p.n_qblocks, r->p.n_fpblocks, r->op);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

#define PCHECK(r, cond, ...)                                                  \
    do {                                                                      \
        nb_test_checks++;                                                     \
        if (!(cond)) {                                                        \
            fail(r, __VA_ARGS__);                                             \
            return;                                                           \
        }                                                                     \
    } while (0)

static void setop(run *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->op, sizeof(r->op), fmt, ap);
    va_end(ap);
}

static int32_t fp_tokens_of(const nb_bm_seq_view *v, int32_t G) {
    return v->n_committed + v->n_drafted - v->n_qblocks * G;
}

static nb_bm_seq_view get_view(run *r, int32_t s) {
    nb_bm_seq_view v;
    memset(&v, 0, sizeof(v));
    nb_status st = nb_bm_seq_view_get(r->bm, s, &v);
    if (st != NB_OK) fail(r, "view of live seq %d: %s", s, nb_status_str(st));
    return v;
}

// ---------------------------------------------------------------------------
// invariants, after every step
// ---------------------------------------------------------------------------

static void check_all(run *r) {
    const int32_t G = r->G;
    char err[512] = "";
    nb_status st = nb_bm_check(r->bm, err, sizeof(err));
    PCHECK(r, st == NB_OK, "nb_bm_check: %s", err);
    memset(r->qcount, 0, sizeof(int32_t) * (size_t)r->p.n_qblocks);
    memset(r->fpcount, 0, sizeof(int32_t) * (size_t)r->p.n_fpblocks);
    for (int32_t s = 0; s < r->p.max_seqs; s++) {
        bm_model_seq *ms = &r->m.seqs[s];
        nb_bm_seq_view v;
        st = nb_bm_seq_view_get(r->bm, s, &v);
        PCHECK(r, (st == NB_OK) == ms->live, "seq %d: view %s, model live %d", s,
               nb_status_str(st), ms->live);
        if (!ms->live) continue;
        PCHECK(r, v.n_committed == ms->n_committed && v.n_drafted == ms->n_drafted,
               "seq %d: c %d d %d, model c %d d %d", s, v.n_committed, v.n_drafted,
               ms->n_committed, ms->n_drafted);
        PCHECK(r, memcmp(v.tokens, ms->tokens, sizeof(int32_t) * (size_t)(v.n_committed + v.n_drafted)) == 0,
               "seq %d: token ids differ from the model", s);
        int32_t nq_model = bm_model_qblocks(G, r->p.quantize, v.n_committed);
        bool due = nb_bm_seq_flush_due(r->bm, s);
        PCHECK(r, v.n_qblocks <= nq_model, "seq %d: nq %d > %d for %d committed", s, v.n_qblocks,
               nq_model, v.n_committed);
        PCHECK(r, due == (v.n_qblocks < nq_model), "seq %d: flush_due %d with nq %d of %d", s, due,
               v.n_qblocks, nq_model);
        if (!r->info[s].unflushed) {
            PCHECK(r, v.n_qblocks == nq_model, "seq %d: nq %d, expected %d for %d committed", s,
                   v.n_qblocks, nq_model, v.n_committed);
            int32_t fpc = v.n_committed - v.n_qblocks * G;
            if (r->p.quantize && v.n_committed >= G)
                PCHECK(r, fpc >= G && fpc < 2 * G, "seq %d: %d committed FP tokens (G %d)", s, fpc, G);
            else
                PCHECK(r, fpc == v.n_committed, "seq %d: fp %d", s, fpc);
        }
        int32_t fpt = fp_tokens_of(&v, G);
        PCHECK(r, v.n_fpblocks == bm_ceil_div(fpt, G), "seq %d: %d FP blocks for %d FP tokens", s,
               v.n_fpblocks, fpt);
        if (!r->p.quantize) PCHECK(r, v.n_qblocks == 0 && v.prequant_block == -1, "seq %d: quantized", s);
        for (int32_t i = 0; i < v.n_qblocks; i++) {
            PCHECK(r, v.qblocks[i] >= 0 && v.qblocks[i] < r->p.n_qblocks, "seq %d: qblock id %d", s,
                   v.qblocks[i]);
            r->qcount[v.qblocks[i]]++;
        }
        for (int32_t i = 0; i < v.n_fpblocks; i++) {
            PCHECK(r, v.fpblocks[i] >= 0 && v.fpblocks[i] < r->p.n_fpblocks, "seq %d: fpblock id %d",
                   s, v.fpblocks[i]);
            r->fpcount[v.fpblocks[i]]++;
        }
        if (v.prequant_block >= 0) {
            PCHECK(r, v.prequant_block < r->p.n_qblocks, "seq %d: prequant id", s);
            r->qcount[v.prequant_block]++;
        }
        PCHECK(r, bm_sim_check_seq(&r->sim, &v, ms->tokens), "seq %d data: %s", s, r->sim.msg);
        PCHECK(r, bm_sim_check_prequant(&r->sim, &v, ms->tokens), "seq %d: %s", s, r->sim.msg);
    }
    // Refcounts recomputed from every view: a block appears in two
    // sequences only through sharing, which the refcount must show.
    int32_t q_used = 0, fp_used = 0;
    for (int32_t b = 0; b < r->p.n_qblocks; b++) {
        int32_t rc = nb_bm_qblock_refcount(r->bm, b);
        PCHECK(r, rc == r->qcount[b], "qblock %d: refcount %d, views hold %d", b, rc, r->qcount[b]);
        q_used += r->qcount[b] > 0;
    }
    for (int32_t b = 0; b < r->p.n_fpblocks; b++) {
        int32_t rc = nb_bm_fpblock_refcount(r->bm, b);
        PCHECK(r, rc == r->fpcount[b], "fpblock %d: refcount %d, views hold %d", b, rc, r->fpcount[b]);
        fp_used += r->fpcount[b] > 0;
        // Unreferenced FP blocks hold nothing anyone may read.
        if (r->fpcount[b] == 0)
            for (int32_t k = 0; k < G; k++) r->sim.fp[(int64_t)b * G + k] = BM_POISON;
    }
    if (!r->p.prefix_cache)
        for (int32_t b = 0; b < r->p.n_qblocks; b++)
            if (r->qcount[b] == 0)
                for (int32_t k = 0; k < G; k++) r->sim.q[(int64_t)b * G + k] = BM_POISON;
    nb_bm_stats s;
    nb_bm_stats_get(r->bm, &s);
    PCHECK(r, s.n_seqs == bm_model_n_live(&r->m), "n_seqs %d, model %d", s.n_seqs, bm_model_n_live(&r->m));
    PCHECK(r, s.n_fpblocks_total == r->p.n_fpblocks && s.n_qblocks_total == r->p.n_qblocks, "totals");
    PCHECK(r, s.n_fpblocks_free == r->p.n_fpblocks - fp_used, "fp free %d, %d of %d referenced",
           s.n_fpblocks_free, fp_used, r->p.n_fpblocks);
    PCHECK(r, s.n_qblocks_free >= 0 && s.n_qblocks_reserved >= 0 && s.n_qblocks_cached >= 0,
           "negative q figures: free %d reserved %d cached %d", s.n_qblocks_free,
           s.n_qblocks_reserved, s.n_qblocks_cached);
    PCHECK(r, q_used + s.n_qblocks_free + s.n_qblocks_reserved == r->p.n_qblocks,
           "q accounting: %d referenced + %d free + %d reserved != %d", q_used, s.n_qblocks_free,
           s.n_qblocks_reserved, r->p.n_qblocks);
    PCHECK(r, s.n_qblocks_cached <= r->p.n_qblocks - q_used, "cached %d with %d referenced",
           s.n_qblocks_cached, q_used);
    if (!r->p.prefix_cache) PCHECK(r, s.n_qblocks_cached == 0, "cached %d without prefix cache", s.n_qblocks_cached);
    if (bm_model_n_live(&r->m) == 0) {
        PCHECK(r, s.n_fpblocks_free == s.n_fpblocks_total && s.n_qblocks_free == s.n_qblocks_total &&
                      s.n_qblocks_reserved == 0,
               "leak with no sequences: fp free %d/%d, q free %d/%d (cached %d), reserved %d",
               s.n_fpblocks_free, s.n_fpblocks_total, s.n_qblocks_free, s.n_qblocks_total,
               s.n_qblocks_cached, s.n_qblocks_reserved);
    }
}

// ---------------------------------------------------------------------------
// operations
// ---------------------------------------------------------------------------

static void work_reset(run *r) {
    // Sometimes the list already holds earlier items: new ones go after.
    int32_t pre = bm_rng_pct(&r->rng, 20) ? bm_rng_range(&r->rng, 1, 3) : 0;
    for (int32_t i = 0; i < pre; i++) r->items[i] = (nb_bm_work){NB_BM_WORK_COPY, -5, -5, -5};
    r->w.items = r->items;
    r->w.n = pre;
    r->w.cap = pre + nb_bm_work_max_per_op(r->bm);
}

// Checks the untouched prefix and the kinds, then executes the new items.
static int32_t work_new(run *r, int32_t pre, int *kinds) {
    kinds[0] = kinds[1] = kinds[2] = 0;
    for (int32_t i = 0; i < pre; i++)
        if (r->items[i].src != -5 || r->items[i].dst != -5) {
            fail(r, "work item %d before the operation's own was overwritten", i);
            return -1;
        }
    if (r->w.n - pre > nb_bm_work_max_per_op(r->bm)) {
        fail(r, "%d items > nb_bm_work_max_per_op %d", r->w.n - pre, nb_bm_work_max_per_op(r->bm));
        return -1;
    }
    for (int32_t i = pre; i < r->w.n; i++)
        if ((int)r->items[i].kind >= 0 && (int)r->items[i].kind < 3) kinds[r->items[i].kind]++;
    if (!bm_sim_exec(&r->sim, &r->w, pre)) {
        fail(r, "%s", r->sim.msg);
        return -1;
    }
    return r->w.n - pre;
}

static bool status_ok_or_blocks(nb_status st) { return st == NB_OK || st == NB_ERR_NO_FREE_BLOCKS; }

// State-unchanged and no-items check for a failed operation.
static void check_unchanged(run *r, bm_snap *before, int32_t pre, nb_status st) {
    bm_snap after;
    char msg[256];
    bm_snap_take(&after, r->bm);
    bool eq = bm_snap_equal(before, &after, msg, sizeof(msg));
    bm_snap_free(&after);
    if (!eq) fail(r, "failed with %s but changed state: %s", nb_status_str(st), msg);
    else if (r->w.n != pre) fail(r, "failed with %s but appended %d items", nb_status_str(st), r->w.n - pre);
    if (st == NB_ERR_NO_FREE_BLOCKS) r->n_fail_blocks++;
}

static int32_t pick_live(run *r) {
    int32_t n = bm_model_n_live(&r->m);
    if (n == 0) return -1;
    int32_t k = bm_rng_range(&r->rng, 0, n - 1);
    for (int32_t s = 0; s < r->p.max_seqs; s++)
        if (r->m.seqs[s].live && k-- == 0) return s;
    return -1;
}

// Tokens for an append: continue the sequence's prompt chain, or random
// ones from a small alphabet (chains recur, so prefixes are shared).
static void gen_tokens(run *r, int32_t s, int32_t at, int32_t n, int32_t *out) {
    seq_info *si = &r->info[s];
    bool follow = si->prompt >= 0 && bm_rng_pct(&r->rng, 85);
    for (int32_t i = 0; i < n; i++) {
        if (follow && at + i < r->p.max_seq_len)
            out[i] = r->prompts[(size_t)si->prompt * (size_t)r->p.max_seq_len + (size_t)(at + i)];
        else
            out[i] = bm_rng_range(&r->rng, 0, 40);
    }
}

static int32_t longest_live_chain(run *r, const int32_t *toks, int32_t n) {
    int32_t best = 0;
    const int32_t G = r->G;
    for (int32_t s = 0; s < r->p.max_seqs; s++) {
        if (!r->m.seqs[s].live) continue;
        nb_bm_seq_view v = get_view(r, s);
        int32_t j = 0;
        while (j < v.n_qblocks && (j + 1) * G <= n &&
               memcmp(v.tokens, toks, sizeof(int32_t) * (size_t)(j + 1) * G) == 0)
            j++;
        if (j > best) best = j;
    }
    return best;
}

static void do_flush(run *r, int32_t s);
static void flush_check(run *r, int32_t s, nb_status st, int32_t pre, const nb_bm_seq_view *pv0,
                        const int32_t *fp0, int32_t due, int32_t preq);
static void rollback_check(run *r, int32_t s, int32_t n, nb_status st, int32_t pre, bm_snap *pbefore,
                           const nb_bm_seq_view *pv0, const int32_t *q0, int32_t nq_new,
                           int32_t n_deq, const nb_bm_stats *ps0);

// kind: committed or drafted; n may be invalid on purpose.
static void do_append(run *r, int32_t s, nb_bm_append_kind kind, int32_t n, bool flush_after) {
    const int32_t G = r->G;
    bm_model_seq *ms = &r->m.seqs[s];
    int32_t c = ms->n_committed, d = ms->n_drafted;
    setop(r, "append seq %d %s n %d (c %d d %d)", s, kind == NB_BM_COMMITTED ? "committed" : "drafted",
          n, c, d);
    int32_t nn = n > 0 ? n : 1;
    gen_tokens(r, s, c + d, nn, r->tmp);
    nb_bm_seq_view v0 = get_view(r, s);
    int32_t fpt0 = fp_tokens_of(&v0, G);
    int32_t last0 = v0.n_fpblocks > 0 ? v0.fpblocks[v0.n_fpblocks - 1] : -1;
    int32_t cf1 = v0.n_fpblocks > 0 ? v0.fpblocks[0] : -1;
    int32_t fp_written = c - v0.n_qblocks * G;
    bool shared_last = last0 >= 0 && fpt0 % G != 0 && nb_bm_fpblock_refcount(r->bm, last0) > 1;
    bool due = nb_bm_seq_flush_due(r->bm, s);
    int32_t live_chain = (c + d == 0 && kind == NB_BM_COMMITTED && r->p.prefix_cache && r->p.quantize)
                             ? longest_live_chain(r, r->tmp, nn) : 0;
    nb_bm_stats s0;
    nb_bm_stats_get(r->bm, &s0);
    // Adoption: first committed append, prefix cache on, n_cached non-NULL.
    bool want_cached = bm_rng_pct(&r->rng, 85);
    bool adopt = want_cached && c + d == 0 && kind == NB_BM_COMMITTED && r->p.prefix_cache &&
                 r->p.quantize && n >= 1;
    int32_t lookup = n >= 1 ? nb_bm_prefix_lookup(r->bm, r->tmp, n) : 0;
    if (!(r->p.prefix_cache && r->p.quantize) || n < 1)
        PCHECK(r, lookup == 0, "prefix lookup %d with the cache off", lookup);
    PCHECK(r, lookup >= 0 && lookup % G == 0 && lookup <= bm_model_qblocks(G, r->p.quantize, n) * G,
           "prefix lookup %d for %d tokens", lookup, n);
    int32_t add = n - (adopt ? lookup : 0);
    // Every documented status that applies; the order among them is not
    // documented, so any one of them is accepted.
    nb_status allowed[6];
    int n_allowed = 0;
    if (n < 1 || add > r->p.max_append) allowed[n_allowed++] = NB_ERR_INVALID_ARG;
    if (kind == NB_BM_DRAFTED && d + n > r->p.max_append) allowed[n_allowed++] = NB_ERR_INVALID_ARG;
    if ((kind == NB_BM_COMMITTED && d > 0) || due) allowed[n_allowed++] = NB_ERR_STATE;
    if (c + d + n > r->p.max_seq_len) allowed[n_allowed++] = NB_ERR_CONTEXT_TOO_LONG;

    bm_snap before;
    bm_snap_take(&before, r->bm);
    work_reset(r);
    int32_t pre = r->w.n;
    int32_t cached = -7;
    nb_status st = nb_bm_seq_append(r->bm, s, r->tmp, n, kind, want_cached ? &cached : NULL, &r->w);
    r->n_ops++;
    if (n_allowed > 0) {
        bool ok = false;
        for (int k = 0; k < n_allowed; k++) ok |= st == allowed[k];
        if (!ok) fail(r, "returned %s, expected %s", nb_status_str(st), nb_status_str(allowed[0]));
        else check_unchanged(r, &before, pre, st);
        bm_snap_free(&before);
        return;
    }
    if (!status_ok_or_blocks(st)) {
        fail(r, "returned %s", nb_status_str(st));
        bm_snap_free(&before);
        return;
    }
    if (st == NB_ERR_NO_FREE_BLOCKS) {
        check_unchanged(r, &before, pre, st);
        bm_snap_free(&before);
        // Spurious? Enough FP blocks for every new block plus a copy, and
        // enough quantized blocks for every group it could ever flush.
        int32_t fp_need = bm_ceil_div(fpt0 + n, G) - v0.n_fpblocks + (shared_last ? 1 : 0);
        int32_t q_need = bm_model_qblocks(G, r->p.quantize, c + d + n) - v0.n_qblocks + 1;
        if (fp_need <= s0.n_fpblocks_free && q_need <= s0.n_qblocks_free)
            fail(r, "NO_FREE_BLOCKS with %d FP blocks free (need %d) and %d q free (need <= %d)",
                 s0.n_fpblocks_free, fp_need, s0.n_qblocks_free, q_need);
        return;
    }
    bm_snap_free(&before);
    int kinds[3];
    if (work_new(r, pre, kinds) < 0) return;
    nb_bm_seq_view v = get_view(r, s);
    // n_cached: a multiple of G leaving >= G tokens; only for a committed
    // first append with the prefix cache on.
    if (!want_cached) cached = 0;
    PCHECK(r, cached != -7, "append did not write *n_cached");
    if (adopt) {
        PCHECK(r, cached == lookup, "adopted %d tokens, nb_bm_prefix_lookup said %d", cached, lookup);
        PCHECK(r, cached % G == 0 && cached >= 0 &&
                      cached <= bm_model_qblocks(G, true, n) * G,
               "n_cached %d for a first append of %d", cached, n);
        PCHECK(r, cached >= G * (live_chain < bm_model_qblocks(G, true, n) ? live_chain
                                                                         : bm_model_qblocks(G, true, n)),
               "n_cached %d below the %d groups live sequences hold", cached, live_chain);
        PCHECK(r, v.n_qblocks == cached / G, "adopted %d tokens but nq %d", cached, v.n_qblocks);
        if (cached > 0) r->n_hits++;
    } else {
        PCHECK(r, cached == 0, "n_cached %d for a non-first or drafted append (or NULL)", cached);
        PCHECK(r, v.n_qblocks == v0.n_qblocks, "an append changed nq %d -> %d", v0.n_qblocks, v.n_qblocks);
    }
    PCHECK(r, kinds[NB_BM_WORK_DEQUANTIZE] == 0, "append planned DEQUANTIZE");
    PCHECK(r, kinds[NB_BM_WORK_COPY] <= 1 && kinds[NB_BM_WORK_QUANTIZE] <= 1,
           "append planned %d COPY, %d QUANTIZE", kinds[NB_BM_WORK_COPY], kinds[NB_BM_WORK_QUANTIZE]);
    PCHECK(r, kinds[NB_BM_WORK_COPY] == (shared_last && cached == 0 ? 1 : 0),
           "append planned %d COPY; last block shared %d (valid %d)", kinds[NB_BM_WORK_COPY],
           shared_last, fpt0 % G);
    for (int32_t i = pre; i < r->w.n; i++) {
        const nb_bm_work *it = &r->items[i];
        if (it->kind == NB_BM_WORK_COPY) {
            r->n_cow++;
            PCHECK(r, it->src == last0 && it->n_tokens == fpt0 % G,
                   "COPY src %d n %d, expected the shared last block %d with %d valid tokens",
                   it->src, it->n_tokens, last0, fpt0 % G);
        } else if (it->kind == NB_BM_WORK_QUANTIZE) {
            r->n_preq++;
            PCHECK(r, it->dst == v.prequant_block, "append QUANTIZE dst %d, prequant %d", it->dst,
                   v.prequant_block);
            PCHECK(r, it->src == cf1 && fp_written >= G,
                   "append pre-quantized FP block %d (C_F1 was %d) with only %d of its G=%d tokens' "
                   "KV written before the forward pass",
                   it->src, cf1, fp_written > 0 ? fp_written : 0, G);
        }
    }
    // Model, then the engine's forward pass writes the new positions.
    int32_t add_from = c + d;
    memcpy(ms->tokens + c + d, r->tmp, sizeof(int32_t) * (size_t)n);
    if (kind == NB_BM_COMMITTED) {
        ms->n_committed += n;
        r->info[s].unflushed = true;
    } else {
        ms->n_drafted += n;
    }
    if (c + d == 0) add_from = cached;
    if (r->info[s].prompt >= 0) {
        const int32_t *pr = r->prompts + (size_t)r->info[s].prompt * (size_t)r->p.max_seq_len;
        if (memcmp(pr + c + d, r->tmp, sizeof(int32_t) * (size_t)n) != 0) r->info[s].prompt = -1;
    }
    for (int32_t p = add_from; p < c + d + n; p++) {
        PCHECK(r, bm_sim_fp_slot(&r->sim, &v, p) != NULL, "position %d has no FP slot", p);
        int32_t b = v.fpblocks[(p - v.n_qblocks * G) / G];
        PCHECK(r, nb_bm_fpblock_refcount(r->bm, b) == 1,
               "the forward pass writes position %d into FP block %d shared by %d sequences", p, b,
               nb_bm_fpblock_refcount(r->bm, b));
    }
    PCHECK(r, bm_sim_write(&r->sim, &v, ms->tokens, add_from, c + d + n), "%s", r->sim.msg);
    if (kind == NB_BM_COMMITTED && flush_after) do_flush(r, s);
}

static void do_flush(run *r, int32_t s) {
    const int32_t G = r->G;
    bm_model_seq *ms = &r->m.seqs[s];
    setop(r, "flush seq %d (c %d d %d)", s, ms->n_committed, ms->n_drafted);
    nb_bm_seq_view v0 = get_view(r, s);
    int32_t *fp0 = bm_dup(v0.fpblocks, v0.n_fpblocks); // the view's arrays change with the op
    int32_t due = bm_model_qblocks(G, r->p.quantize, ms->n_committed) - v0.n_qblocks;
    int32_t preq = v0.prequant_block;
    work_reset(r);
    int32_t pre = r->w.n;
    nb_status st = nb_bm_seq_flush(r->bm, s, &r->w);
    r->n_ops++;
    flush_check(r, s, st, pre, &v0, fp0, due, preq);
    free(fp0);
}

static void flush_check(run *r, int32_t s, nb_status st, int32_t pre, const nb_bm_seq_view *pv0,
                        const int32_t *fp0, int32_t due, int32_t preq) {
    nb_bm_seq_view v0 = *pv0;
    PCHECK(r, st == NB_OK, "flush returned %s", nb_status_str(st));
    int kinds[3];
    if (work_new(r, pre, kinds) < 0) return;
    PCHECK(r, kinds[NB_BM_WORK_QUANTIZE] == r->w.n - pre, "flush planned non-QUANTIZE items");
    // Each group once: the pre-quantized one, then QUANTIZE or a cached block.
    PCHECK(r, kinds[NB_BM_WORK_QUANTIZE] <= due - (due > 0 && preq >= 0 ? 1 : 0),
           "flush planned %d QUANTIZE for %d due groups (prequant %d)", kinds[NB_BM_WORK_QUANTIZE],
           due, preq);
    if (!r->p.prefix_cache)
        PCHECK(r, kinds[NB_BM_WORK_QUANTIZE] == due - (due > 0 && preq >= 0 ? 1 : 0),
               "flush planned %d QUANTIZE for %d due groups (prequant %d)",
               kinds[NB_BM_WORK_QUANTIZE], due, preq);
    nb_bm_seq_view v = get_view(r, s);
    if (due > 0 && preq >= 0) PCHECK(r, v.qblocks[v0.n_qblocks] == preq, "prequant block not adopted");
    // The FP list shifted by a pointer move.
    PCHECK(r, v.n_fpblocks == v0.n_fpblocks - (due > 0 ? due : 0), "flush: nfp %d -> %d, %d due",
           v0.n_fpblocks, v.n_fpblocks, due);
    for (int32_t i = 0; i < v.n_fpblocks && due >= 0; i++)
        PCHECK(r, v.fpblocks[i] == fp0[i + due], "flush did not shift the FP list");
    r->info[s].unflushed = false;
}

static void do_accept(run *r, int32_t s, int32_t k) {
    const int32_t G = r->G;
    bm_model_seq *ms = &r->m.seqs[s];
    setop(r, "accept seq %d k %d (c %d d %d)", s, k, ms->n_committed, ms->n_drafted);
    // The verify pass rewrites every pending position's KV (a block shared
    // after a fork is harmless only if no sharer's valid range covers the
    // slot; the data check sees it otherwise).
    nb_bm_seq_view v0 = get_view(r, s);
    PCHECK(r, bm_sim_write(&r->sim, &v0, ms->tokens, ms->n_committed, ms->n_committed + ms->n_drafted),
           "verify rewrite: %s", r->sim.msg);
    bool valid = k >= 0 && k <= ms->n_drafted;
    bm_snap before;
    bm_snap_take(&before, r->bm);
    work_reset(r);
    int32_t pre = r->w.n;
    nb_status st = nb_bm_seq_accept(r->bm, s, k, &r->w);
    r->n_ops++;
    if (!valid) {
        if (st != NB_ERR_INVALID_ARG) fail(r, "accept returned %s, expected invalid argument", nb_status_str(st));
        else check_unchanged(r, &before, pre, st);
        bm_snap_free(&before);
        return;
    }
    bm_snap_free(&before);
    PCHECK(r, st == NB_OK, "accept returned %s", nb_status_str(st));
    int kinds[3];
    if (work_new(r, pre, kinds) < 0) return;
    PCHECK(r, kinds[NB_BM_WORK_QUANTIZE] == r->w.n - pre, "accept planned non-QUANTIZE items");
    int32_t due = bm_model_qblocks(G, r->p.quantize, ms->n_committed + k) - v0.n_qblocks;
    PCHECK(r, kinds[NB_BM_WORK_QUANTIZE] <= (due > 0 ? due : 0), "accept planned %d QUANTIZE for %d groups",
           kinds[NB_BM_WORK_QUANTIZE], due);
    ms->n_committed += k;
    ms->n_drafted = 0;
    r->info[s].unflushed = false;
    int32_t *pr = r->info[s].prompt >= 0 ? r->prompts + (size_t)r->info[s].prompt * (size_t)r->p.max_seq_len : NULL;
    if (pr && memcmp(pr, ms->tokens, sizeof(int32_t) * (size_t)ms->n_committed) != 0) r->info[s].prompt = -1;
}

static void do_rollback(run *r, int32_t s, int32_t n) {
    const int32_t G = r->G;
    bm_model_seq *ms = &r->m.seqs[s];
    setop(r, "rollback seq %d to %d (c %d d %d)", s, n, ms->n_committed, ms->n_drafted);
    nb_bm_seq_view v0 = get_view(r, s);
    int32_t *q0 = bm_dup(v0.qblocks, v0.n_qblocks); // the view's arrays change with the op
    bool valid = n >= 0 && n <= ms->n_committed;
    int32_t nq_new = bm_model_qblocks(G, r->p.quantize, n);
    int32_t n_deq = 0;
    if (valid)
        for (int32_t g = nq_new; g < bm_ceil_div(n, G); g++) n_deq += g < v0.n_qblocks;
    nb_bm_stats s0;
    nb_bm_stats_get(r->bm, &s0);
    bm_snap before;
    bm_snap_take(&before, r->bm);
    work_reset(r);
    int32_t pre = r->w.n;
    nb_status st = nb_bm_seq_rollback(r->bm, s, n, &r->w);
    r->n_ops++;
    rollback_check(r, s, n, st, pre, &before, &v0, q0, nq_new, n_deq, &s0);
    bm_snap_free(&before);
    free(q0);
}

static void rollback_check(run *r, int32_t s, int32_t n, nb_status st, int32_t pre, bm_snap *pbefore,
                           const nb_bm_seq_view *pv0, const int32_t *q0, int32_t nq_new,
                           int32_t n_deq, const nb_bm_stats *ps0) {
    const int32_t G = r->G;
    bm_model_seq *ms = &r->m.seqs[s];
    nb_bm_seq_view v0 = *pv0;
    nb_bm_stats s0 = *ps0;
    bool valid = n >= 0 && n <= ms->n_committed;
    bm_snap before = *pbefore;
    if (!valid) {
        if (st != NB_ERR_INVALID_ARG) fail(r, "rollback returned %s, expected invalid argument", nb_status_str(st));
        else check_unchanged(r, &before, pre, st);
        return;
    }
    if (st == NB_ERR_NO_FREE_BLOCKS) {
        check_unchanged(r, &before, pre, st);
        if (n_deq <= s0.n_fpblocks_free)
            fail(r, "NO_FREE_BLOCKS for %d dequantized groups with %d FP blocks free", n_deq,
                 s0.n_fpblocks_free);
        return;
    }
    PCHECK(r, st == NB_OK, "rollback returned %s", nb_status_str(st));
    int kinds[3];
    if (work_new(r, pre, kinds) < 0) return;
    PCHECK(r, kinds[NB_BM_WORK_DEQUANTIZE] == r->w.n - pre, "rollback planned non-DEQUANTIZE items");
    if (nq_new >= v0.n_qblocks) PCHECK(r, r->w.n == pre, "rollback inside the FP region planned work");
    PCHECK(r, kinds[NB_BM_WORK_DEQUANTIZE] == (nq_new < v0.n_qblocks ? n_deq : 0),
           "rollback planned %d DEQUANTIZE, expected %d", kinds[NB_BM_WORK_DEQUANTIZE], n_deq);
    r->n_deq += kinds[NB_BM_WORK_DEQUANTIZE];
    ms->n_committed = n;
    ms->n_drafted = 0;
    if (nb_bm_seq_flush_due(r->bm, s)) {
        r->info[s].unflushed = true; // rolled back an unflushed sequence
        do_flush(r, s);
        if (r->failed) return;
    } else {
        r->info[s].unflushed = false;
    }
    // Rollback equivalence: the shape of a sequence that only ever
    // committed these n tokens (check_all checks ids and data).
    nb_bm_seq_view v = get_view(r, s);
    PCHECK(r, v.n_qblocks == nq_new && v.n_fpblocks == bm_ceil_div(n - nq_new * G, G) &&
                  v.n_committed == n && v.n_drafted == 0,
           "after rollback to %d: nq %d nfp %d, expected nq %d nfp %d", n, v.n_qblocks,
           v.n_fpblocks, nq_new, bm_ceil_div(n - nq_new * G, G));
    for (int32_t i = 0; i < nq_new; i++)
        PCHECK(r, v.qblocks[i] == q0[i], "rollback changed kept quantized block %d", i);
}

static void do_fork(run *r, int32_t s) {
    bm_model_seq *ms = &r->m.seqs[s];
    setop(r, "fork seq %d (c %d d %d)", s, ms->n_committed, ms->n_drafted);
    int32_t free_slots = r->p.max_seqs - bm_model_n_live(&r->m);
    bm_snap before;
    bm_snap_take(&before, r->bm);
    int32_t child = -1;
    nb_status st = nb_bm_seq_fork(r->bm, s, &child);
    r->n_ops++;
    r->w.n = 0;
    if (free_slots == 0) {
        if (st != NB_ERR_TOO_MANY_SEQS) fail(r, "fork returned %s, expected too many seqs", nb_status_str(st));
        else check_unchanged(r, &before, 0, st);
        bm_snap_free(&before);
        return;
    }
    if (st != NB_OK) {
        // Not due for a flush: a fork needs no blocks at all.
        fail(r, "fork returned %s", nb_status_str(st));
        bm_snap_free(&before);
        return;
    }
    bm_snap_free(&before);
    PCHECK(r, child >= 0 && child < r->p.max_seqs && !r->m.seqs[child].live, "fork child slot %d", child);
    bm_model_seq *mc = &r->m.seqs[child];
    mc->live = true;
    mc->n_committed = ms->n_committed;
    mc->n_drafted = 0;
    memcpy(mc->tokens, ms->tokens, sizeof(int32_t) * (size_t)ms->n_committed);
    r->info[child] = r->info[s];
    nb_bm_seq_view vp = get_view(r, s), vc = get_view(r, child);
    PCHECK(r, vc.n_qblocks == vp.n_qblocks, "fork: child nq %d, parent %d", vc.n_qblocks, vp.n_qblocks);
    for (int32_t i = 0; i < vc.n_qblocks; i++)
        PCHECK(r, vc.qblocks[i] == vp.qblocks[i], "fork did not share quantized block %d", i);
    for (int32_t i = 0; i < vc.n_fpblocks; i++)
        PCHECK(r, vc.fpblocks[i] == vp.fpblocks[i], "fork did not share FP block %d", i);
}

static void do_free(run *r, int32_t s) {
    setop(r, "free seq %d (c %d d %d)", s, r->m.seqs[s].n_committed, r->m.seqs[s].n_drafted);
    nb_status st = nb_bm_seq_free(r->bm, s);
    r->n_ops++;
    PCHECK(r, st == NB_OK, "free returned %s", nb_status_str(st));
    r->m.seqs[s].live = false;
    r->m.seqs[s].n_committed = r->m.seqs[s].n_drafted = 0;
    r->info[s].unflushed = false;
    r->info[s].prompt = -1;
}

static void do_add(run *r) {
    setop(r, "add");
    int32_t free_slots = r->p.max_seqs - bm_model_n_live(&r->m);
    bm_snap before;
    bm_snap_take(&before, r->bm);
    int32_t s = -1;
    nb_status st = nb_bm_seq_add(r->bm, &s);
    r->n_ops++;
    r->w.n = 0;
    if (free_slots == 0) {
        if (st != NB_ERR_TOO_MANY_SEQS) fail(r, "add returned %s with the table full", nb_status_str(st));
        else check_unchanged(r, &before, 0, st);
        bm_snap_free(&before);
        return;
    }
    bm_snap_free(&before);
    PCHECK(r, st == NB_OK && s >= 0 && s < r->p.max_seqs && !r->m.seqs[s].live, "add returned %s slot %d",
           nb_status_str(st), s);
    r->m.seqs[s].live = true;
    r->m.seqs[s].n_committed = r->m.seqs[s].n_drafted = 0;
    r->info[s].unflushed = false;
    r->info[s].prompt = bm_rng_pct(&r->rng, 80) ? bm_rng_range(&r->rng, 0, r->n_prompts - 1) : -1;
    check_all(r);
    if (r->failed) return;
    // Usually the prompt follows at once, in one chunk.
    if (bm_rng_pct(&r->rng, 75)) {
        int32_t hi = r->p.max_append + 3 * r->G;
        if (hi > r->p.max_seq_len) hi = r->p.max_seq_len;
        int32_t n = bm_rng_pct(&r->rng, 70) ? bm_rng_range(&r->rng, 1, r->p.max_append)
                                             : bm_rng_range(&r->rng, 1, hi);
        do_append(r, s, NB_BM_COMMITTED, n, true);
    }
}

// Invalid calls: each must return its documented status and change nothing.
static void do_invalid(run *r) {
    int32_t s = pick_live(r);
    int which = (int)bm_rng_range(&r->rng, 0, 6);
    bm_snap before;
    bm_snap_take(&before, r->bm);
    work_reset(r);
    int32_t pre = r->w.n;
    nb_status st = NB_OK, expect = NB_OK;
    int32_t bad = bm_rng_pct(&r->rng, 50) ? -1 - bm_rng_range(&r->rng, 0, 3)
                                           : r->p.max_seqs + bm_rng_range(&r->rng, 0, 3);
    for (int32_t k = 0; k < r->p.max_seqs; k++)
        if (!r->m.seqs[k].live) { bad = bm_rng_pct(&r->rng, 50) ? k : bad; break; }
    int32_t tok = 1;
    switch (which) {
    case 0: setop(r, "invalid: ops on bad seq %d", bad);
        expect = NB_ERR_NOT_FOUND;
        st = nb_bm_seq_append(r->bm, bad, &tok, 1, NB_BM_COMMITTED, NULL, &r->w);
        if (st == expect) st = nb_bm_seq_flush(r->bm, bad, &r->w);
        if (st == expect) st = nb_bm_seq_accept(r->bm, bad, 0, &r->w);
        if (st == expect) st = nb_bm_seq_rollback(r->bm, bad, 0, &r->w);
        if (st == expect) st = nb_bm_seq_free(r->bm, bad);
        if (st == expect) { int32_t ch; st = nb_bm_seq_fork(r->bm, bad, &ch); }
        if (st == expect) { nb_bm_seq_view v; st = nb_bm_seq_view_get(r->bm, bad, &v); }
        if (st == expect && nb_bm_seq_flush_due(r->bm, bad)) st = NB_ERR_INTERNAL;
        break;
    case 1:
        if (s < 0) goto out;
        setop(r, "invalid: append n 0 / -1 / max_append+1 seq %d", s);
        expect = NB_ERR_INVALID_ARG;
        st = nb_bm_seq_append(r->bm, s, &tok, 0, NB_BM_COMMITTED, NULL, &r->w);
        if (st == expect) st = nb_bm_seq_append(r->bm, s, &tok, -1, NB_BM_DRAFTED, NULL, &r->w);
        if (st == expect) st = nb_bm_seq_append(r->bm, s, r->tmp, r->p.max_append + 1, NB_BM_DRAFTED, NULL, &r->w);
        break;
    case 2:
        if (s < 0) goto out;
        setop(r, "invalid: rollback past committed seq %d", s);
        expect = NB_ERR_INVALID_ARG;
        st = nb_bm_seq_rollback(r->bm, s, r->m.seqs[s].n_committed + 1 + bm_rng_range(&r->rng, 0, 5), &r->w);
        if (st == expect) st = nb_bm_seq_rollback(r->bm, s, -1, &r->w);
        break;
    case 3:
        if (s < 0) goto out;
        setop(r, "invalid: accept past pending seq %d", s);
        expect = NB_ERR_INVALID_ARG;
        st = nb_bm_seq_accept(r->bm, s, r->m.seqs[s].n_drafted + 1, &r->w);
        if (st == expect) st = nb_bm_seq_accept(r->bm, s, -1, &r->w);
        break;
    case 4: {
        // Work list with no room, for an operation that needs room.
        if (s < 0 || r->info[s].unflushed || r->m.seqs[s].n_drafted > 0) goto out;
        int32_t c = r->m.seqs[s].n_committed;
        nb_bm_seq_view v = get_view(r, s);
        if (v.n_qblocks == 0) goto out;
        setop(r, "invalid: deep rollback seq %d with a full work list", s);
        r->w.cap = r->w.n; // full
        expect = NB_ERR_INVALID_ARG;
        st = nb_bm_seq_rollback(r->bm, s, bm_rng_range(&r->rng, 1, v.n_qblocks * r->G), &r->w);
        if (st == NB_ERR_NO_FREE_BLOCKS) st = expect; // checked before the list: either is fine
        (void)c;
        break;
    }
    case 5:
        if (s < 0 || r->m.seqs[s].n_drafted == 0) goto out;
        setop(r, "invalid: committed append with drafts pending seq %d", s);
        expect = NB_ERR_STATE;
        st = nb_bm_seq_append(r->bm, s, &tok, 1, NB_BM_COMMITTED, NULL, &r->w);
        break;
    default:
        if (s < 0) goto out;
        setop(r, "invalid: refcount of bad ids");
        expect = NB_OK;
        if (nb_bm_qblock_refcount(r->bm, -1) != -1 || nb_bm_qblock_refcount(r->bm, r->p.n_qblocks) != -1 ||
            nb_bm_fpblock_refcount(r->bm, -1) != -1 || nb_bm_fpblock_refcount(r->bm, r->p.n_fpblocks) != -1)
            st = NB_ERR_INTERNAL;
        break;
    }
    r->n_ops++;
    if (st != expect) fail(r, "returned %s, expected %s", nb_status_str(st), nb_status_str(expect));
    else check_unchanged(r, &before, pre, NB_OK);
out:
    bm_snap_free(&before);
}

// Whatever can_admit promises must run: prefill in chunks, gamma drafts,
// accept them all, one bonus token.
static void do_admit(run *r) {
    const nb_bm_params *p = &r->p;
    if (bm_model_n_live(&r->m) >= p->max_seqs) return;
    int32_t n = bm_rng_range(&r->rng, 1, p->max_seq_len);
    int32_t gamma = bm_rng_range(&r->rng, 0, p->max_append);
    setop(r, "can_admit(%d, %d)", n, gamma);
    if (!nb_bm_can_admit(r->bm, n, gamma)) return;
    PCHECK(r, n + gamma + 1 <= p->max_seq_len && gamma + 1 <= p->max_append,
           "can_admit(%d, %d) true beyond the limits", n, gamma);
    r->n_admit++;
    int32_t s = -1;
    PCHECK(r, nb_bm_seq_add(r->bm, &s) == NB_OK, "admitted, but add failed");
    r->m.seqs[s].live = true;
    r->m.seqs[s].n_committed = r->m.seqs[s].n_drafted = 0;
    r->info[s].unflushed = false;
    r->info[s].prompt = -1;
    int32_t done = 0;
    long nfb = r->n_fail_blocks;
    while (done < n && !r->failed) {
        int32_t k = n - done < p->max_append ? n - done : p->max_append;
        do_append(r, s, NB_BM_COMMITTED, k, true);
        done += k;
        PCHECK(r, r->m.seqs[s].n_committed == done && r->n_fail_blocks == nfb,
               "can_admit(%d, %d) was true, but the prefill failed at %d", n, gamma, done - k);
        check_all(r);
    }
    if (gamma > 0 && !r->failed) {
        do_append(r, s, NB_BM_DRAFTED, gamma, false);
        PCHECK(r, r->m.seqs[s].n_drafted == gamma && r->n_fail_blocks == nfb,
               "can_admit(%d, %d) was true, but the drafts failed", n, gamma);
        check_all(r);
        if (!r->failed) do_accept(r, s, gamma);
    }
    if (!r->failed) {
        check_all(r);
        do_append(r, s, NB_BM_COMMITTED, 1, true);
        PCHECK(r, r->m.seqs[s].n_committed == n + gamma + 1 && r->n_fail_blocks == nfb,
               "can_admit(%d, %d) was true, but the bonus token failed", n, gamma);
    }
}

// ---------------------------------------------------------------------------
// one run
// ---------------------------------------------------------------------------

static nb_bm_params random_params(bm_rng *g) {
    nb_bm_params p = nb_bm_default_params();
    static const int32_t Gs[] = {4, 4, 4, 8, 8, 8, 64, 1, 2, 3};
    int32_t G = Gs[bm_rng_range(g, 0, 9)];
    p.group_size = G;
    int32_t appends[] = {1, G / 2 + 1, G, G + 1, 2 * G + 1, 4 * G};
    p.max_append = appends[bm_rng_range(g, 0, 5)];
    if (G == 64 && p.max_append > 2 * G + 1) p.max_append = 2 * G + 1;
    p.max_seq_len = G * bm_rng_range(g, 3, G >= 64 ? 8 : 16) + bm_rng_range(g, 0, G - 1);
    if (p.max_seq_len < p.max_append + 1) p.max_seq_len = p.max_append + 1;
    p.max_seqs = bm_rng_range(g, 1, 6);
    p.quantize = bm_rng_pct(g, 85);
    p.prefix_cache = bm_rng_pct(g, 70);
    p.cache_salt = bm_rng_next(g);
    int32_t per_seq = nb_bm_fp_blocks_per_seq_max(&p);
    int32_t tiny = bm_rng_pct(g, 50);
    p.n_fpblocks = tiny ? per_seq + bm_rng_range(g, 0, per_seq) : per_seq * bm_rng_range(g, 2, 6);
    int32_t qmax = p.max_seqs * (p.max_seq_len / G);
    p.n_qblocks = tiny ? bm_rng_range(g, 1, 1 + qmax / 3) : bm_rng_range(g, 1, qmax + 1);
    p.qblock_bytes = (size_t)G * 3;
    p.fpblock_bytes = (size_t)G * 8;
    return p;
}

static void run_one(run *r, uint64_t seed, int32_t steps) {
    memset(r, 0, sizeof(*r));
    r->seed = seed;
    r->rng.s = seed;
    r->p = random_params(&r->rng);
    r->G = r->p.group_size;
    char err[256] = "";
    setop(r, "nb_bm_new");
    r->bm = nb_bm_new(&r->p, err, sizeof(err));
    if (!r->bm) {
        fail(r, "nb_bm_new rejected valid params: %s", err);
        return;
    }
    bm_model_init(&r->m, r->p.max_seqs, r->p.max_seq_len);
    r->info = calloc((size_t)r->p.max_seqs, sizeof(seq_info));
    bm_sim_init(&r->sim, r->G, r->p.n_qblocks, r->p.n_fpblocks);
    r->max_items = nb_bm_work_max_per_op(r->bm) + 8;
    r->items = calloc((size_t)r->max_items, sizeof(nb_bm_work));
    r->n_prompts = 3;
    r->prompts = malloc(sizeof(int32_t) * (size_t)r->n_prompts * (size_t)r->p.max_seq_len);
    for (int32_t i = 0; i < r->n_prompts * r->p.max_seq_len; i++)
        r->prompts[i] = 1000 + bm_rng_range(&r->rng, 0, 30);
    // Prompt 1 starts like prompt 0 (a shared system prompt), then diverges.
    int32_t shared = bm_rng_range(&r->rng, 0, r->p.max_seq_len);
    memcpy(r->prompts + r->p.max_seq_len, r->prompts, sizeof(int32_t) * (size_t)shared);
    r->tmp = malloc(sizeof(int32_t) * (size_t)(r->p.max_seq_len + r->p.max_append + 8));
    r->qcount = malloc(sizeof(int32_t) * (size_t)r->p.n_qblocks);
    r->fpcount = malloc(sizeof(int32_t) * (size_t)r->p.n_fpblocks);
    for (int32_t i = 0; i < r->p.max_seqs; i++) r->info[i].prompt = -1;

    check_all(r);
    for (r->step = 0; r->step < steps && !r->failed; r->step++) {
        int32_t s = pick_live(r);
        int32_t op = bm_rng_range(&r->rng, 0, 99);
        // An unflushed sequence gets flushed (the engine always does) or,
        // rarely, poked with an append that must be refused.
        if (s >= 0 && r->info[s].unflushed) {
            if (op < 8) do_append(r, s, NB_BM_COMMITTED, bm_rng_range(&r->rng, 1, r->p.max_append), false);
            else do_flush(r, s);
        } else if (s < 0 || op < 10) {
            do_add(r);
        } else if (op < 35) {
            bm_model_seq *ms = &r->m.seqs[s];
            int32_t n = bm_rng_pct(&r->rng, 60) ? bm_rng_range(&r->rng, 1, r->G + 1)
                                                 : bm_rng_range(&r->rng, 1, r->p.max_append);
            if (bm_rng_pct(&r->rng, 5)) n = r->p.max_seq_len - ms->n_committed - ms->n_drafted + 1;
            if (ms->n_drafted > 0 && bm_rng_pct(&r->rng, 80)) do_accept(r, s, bm_rng_range(&r->rng, 0, ms->n_drafted));
            else do_append(r, s, NB_BM_COMMITTED, n, bm_rng_pct(&r->rng, 92));
        } else if (op < 55) {
            bm_model_seq *ms = &r->m.seqs[s];
            int32_t room = r->p.max_append - ms->n_drafted;
            int32_t n = room > 0 ? bm_rng_range(&r->rng, 1, room < r->G + 2 ? room : r->G + 2) : 1;
            if (bm_rng_pct(&r->rng, 4)) n = room + 1; // too many pending
            do_append(r, s, NB_BM_DRAFTED, n, false);
        } else if (op < 68) {
            bm_model_seq *ms = &r->m.seqs[s];
            if (ms->n_drafted > 0) do_accept(r, s, bm_rng_range(&r->rng, 0, ms->n_drafted));
            else do_append(r, s, NB_BM_DRAFTED, 1, false);
        } else if (op < 80) {
            bm_model_seq *ms = &r->m.seqs[s];
            int32_t c = ms->n_committed, n;
            int kind = (int)bm_rng_range(&r->rng, 0, 4);
            if (kind == 0) n = c;
            else if (kind == 1) n = c - bm_rng_range(&r->rng, 0, r->G < c ? r->G : c);
            else if (kind == 2) n = 0;
            else n = bm_rng_range(&r->rng, 0, c);
            do_rollback(r, s, n);
        } else if (op < 86) {
            do_fork(r, s);
        } else if (op < 92) {
            do_free(r, s);
        } else if (op < 97) {
            do_invalid(r);
        } else if (op < 99) {
            do_admit(r);
        } else {
            setop(r, "free all");
            for (int32_t k = 0; k < r->p.max_seqs && !r->failed; k++)
                if (r->m.seqs[k].live) do_free(r, k);
        }
        if (!r->failed) check_all(r);
    }
    // No leaks: free everything.
    if (!r->failed) {
        for (int32_t k = 0; k < r->p.max_seqs && !r->failed; k++)
            if (r->m.seqs[k].live) do_free(r, k);
        setop(r, "final free all");
        if (!r->failed) check_all(r);
    }
    g_total_ops += r->n_ops;
    g_total_nfb += r->n_fail_blocks;
    g_total_hits += r->n_hits;
    g_total_deq += r->n_deq;
    g_total_cow += r->n_cow;
    g_total_preq += r->n_preq;
    g_total_admit += r->n_admit;
    nb_bm_destroy(&r->bm);
    bm_model_free(&r->m);
    bm_sim_free(&r->sim);
    free(r->info);
    free(r->items);
    free(r->prompts);
    free(r->tmp);
    free(r->qcount);
    free(r->fpcount);
}

int main(int argc, char **argv) {
    int32_t runs = argc > 1 ? atoi(argv[1]) : 4000;
    int32_t steps = argc > 2 ? atoi(argv[2]) : 300;
    uint64_t base = argc > 3 ? strtoull(argv[3], NULL, 0) : 0x6e6962626c6572ull; // "nibbler"
    clock_t t0 = clock();
    int failed_runs = 0;
    run *r = malloc(sizeof(run));
    for (int32_t i = 0; i < runs; i++) {
        // Run i's seed: the base itself for a single run (to replay one).
        uint64_t seed = runs == 1 ? base : base + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        run_one(r, seed, steps);
        if (r->failed && ++failed_runs >= 10) {
            fprintf(stderr, "stopping after 10 failed runs\n");
            break;
        }
    }
    free(r);
    printf("test_block_manager_prop: %d runs x %d steps, %ld ops, %ld NO_FREE_BLOCKS, %ld prefix hits, "
           "%ld dequantized groups, %ld copy-on-writes, %ld pre-quantizations, %ld admission probes, "
           "%.1f s cpu\n",
           runs, steps, g_total_ops, g_total_nfb, g_total_hits, g_total_deq, g_total_cow, g_total_preq,
           g_total_admit, (double)(clock() - t0) / CLOCKS_PER_SEC);
    return nb_test_finish("test_block_manager_prop");
}
