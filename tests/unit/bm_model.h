// bm_model.h: the tiny obviously-correct model the block manager tests check
// against, plus a simulation of the engine's KV data.
//
// The one idea: the block manager only plans, so a test plays the engine.
// Every block gets an array of "contents", one int64 per slot holding
// (kv, position), where kv is a hash of the whole token prefix up to and
// including that position: like real KV, it depends on every earlier token,
// so a block reused under a different prefix reads back wrong. Work items are
// executed on these arrays in order, every appended token writes its cell,
// and afterwards every position of every live sequence must read back the
// right cell through the sequence's view. A wrong work item, a use of a freed block
// or a missed copy-on-write shows up as a wrong pair.
#ifndef NB_BM_MODEL_H
#define NB_BM_MODEL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block_manager.h"

// ---------------------------------------------------------------------------
// PRNG: splitmix64, so runs are reproducible from one printed seed.
// ---------------------------------------------------------------------------

typedef struct bm_rng {
    uint64_t s;
} bm_rng;

static inline uint64_t bm_rng_next(bm_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in [lo, hi] (inclusive); lo <= hi.
static inline int32_t bm_rng_range(bm_rng *r, int32_t lo, int32_t hi) {
    uint64_t span = (uint64_t)((int64_t)hi - (int64_t)lo + 1);
    return (int32_t)((int64_t)lo + (int64_t)(bm_rng_next(r) % span));
}

// True with probability pct/100.
static inline bool bm_rng_pct(bm_rng *r, int pct) { return (int)(bm_rng_next(r) % 100) < pct; }

// ---------------------------------------------------------------------------
// The model: what a sequence holds, from first principles.
// ---------------------------------------------------------------------------

// Quantized blocks a sequence of n committed, flushed tokens holds: all full
// groups except the ones the double buffer keeps exact (G <= fp < 2G).
static inline int32_t bm_model_qblocks(int32_t G, bool quantize, int32_t n) {
    if (!quantize) return 0;
    return n >= 2 * G ? n / G - 1 : 0;
}

static inline int32_t bm_ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

typedef struct bm_model_seq {
    bool live;
    int32_t n_committed;
    int32_t n_drafted;
    int32_t cap;
    int32_t *tokens; // [cap]: committed then drafted
} bm_model_seq;

typedef struct bm_model {
    int32_t max_seqs;
    bm_model_seq *seqs; // [max_seqs]
} bm_model;

static inline void bm_model_init(bm_model *m, int32_t max_seqs, int32_t max_seq_len) {
    m->max_seqs = max_seqs;
    m->seqs = calloc((size_t)max_seqs, sizeof(*m->seqs));
    for (int32_t i = 0; i < max_seqs; i++) {
        m->seqs[i].cap = max_seq_len;
        m->seqs[i].tokens = calloc((size_t)max_seq_len + 1, sizeof(int32_t));
    }
}

static inline void bm_model_free(bm_model *m) {
    for (int32_t i = 0; i < m->max_seqs; i++) free(m->seqs[i].tokens);
    free(m->seqs);
    m->seqs = NULL;
}

static inline int32_t bm_model_n_live(const bm_model *m) {
    int32_t n = 0;
    for (int32_t i = 0; i < m->max_seqs; i++) n += m->seqs[i].live;
    return n;
}

// ---------------------------------------------------------------------------
// Data simulation
// ---------------------------------------------------------------------------

#define BM_POISON ((int64_t)-1)

// The simulated KV of a position: the prefix hash h (after its token) and
// the position itself.
static inline uint32_t bm_kv_step(uint32_t h, int32_t id) {
    h ^= (uint32_t)id;
    h *= 0x01000193u;
    return h ^ (h >> 15);
}
#define BM_KV_SEED 0x811c9dc5u

static inline int64_t bm_cell(uint32_t kv, int32_t pos) {
    return (int64_t)(((uint64_t)kv << 32) | (uint64_t)(uint32_t)pos);
}

// kv of position p given tokens[0..p].
static inline uint32_t bm_kv_at(const int32_t *tokens, int32_t p) {
    uint32_t h = BM_KV_SEED;
    for (int32_t i = 0; i <= p; i++) h = bm_kv_step(h, tokens[i]);
    return h;
}

typedef struct bm_sim {
    int32_t G;
    int32_t n_q, n_fp;
    int64_t *q;  // [n_q * G]
    int64_t *fp; // [n_fp * G]
    char msg[512];
} bm_sim;

static inline void bm_sim_init(bm_sim *s, int32_t G, int32_t n_q, int32_t n_fp) {
    s->G = G;
    s->n_q = n_q;
    s->n_fp = n_fp;
    s->q = malloc(sizeof(int64_t) * (size_t)G * (size_t)(n_q > 0 ? n_q : 1));
    s->fp = malloc(sizeof(int64_t) * (size_t)G * (size_t)(n_fp > 0 ? n_fp : 1));
    for (int64_t i = 0; i < (int64_t)n_q * G; i++) s->q[i] = BM_POISON;
    for (int64_t i = 0; i < (int64_t)n_fp * G; i++) s->fp[i] = BM_POISON;
    s->msg[0] = 0;
}

static inline void bm_sim_free(bm_sim *s) {
    free(s->q);
    free(s->fp);
}

// Executes items [from, w->n) in order. Returns false (message in s->msg) on
// an item that is malformed: a bad kind, id or count.
static inline bool bm_sim_exec(bm_sim *s, const nb_bm_work_list *w, int32_t from) {
    int32_t G = s->G;
    for (int32_t i = from; i < w->n; i++) {
        const nb_bm_work *it = &w->items[i];
        switch (it->kind) {
        case NB_BM_WORK_QUANTIZE:
            if (it->src < 0 || it->src >= s->n_fp || it->dst < 0 || it->dst >= s->n_q ||
                it->n_tokens != G) {
                snprintf(s->msg, sizeof(s->msg), "bad QUANTIZE item %d: src %d dst %d n %d", i,
                         it->src, it->dst, it->n_tokens);
                return false;
            }
            memcpy(&s->q[(int64_t)it->dst * G], &s->fp[(int64_t)it->src * G],
                   sizeof(int64_t) * (size_t)G);
            break;
        case NB_BM_WORK_DEQUANTIZE:
            if (it->src < 0 || it->src >= s->n_q || it->dst < 0 || it->dst >= s->n_fp ||
                it->n_tokens != G) {
                snprintf(s->msg, sizeof(s->msg), "bad DEQUANTIZE item %d: src %d dst %d n %d", i,
                         it->src, it->dst, it->n_tokens);
                return false;
            }
            memcpy(&s->fp[(int64_t)it->dst * G], &s->q[(int64_t)it->src * G],
                   sizeof(int64_t) * (size_t)G);
            break;
        case NB_BM_WORK_COPY:
            if (it->src < 0 || it->src >= s->n_fp || it->dst < 0 || it->dst >= s->n_fp ||
                it->src == it->dst || it->n_tokens < 1 || it->n_tokens > G) {
                snprintf(s->msg, sizeof(s->msg), "bad COPY item %d: src %d dst %d n %d", i, it->src,
                         it->dst, it->n_tokens);
                return false;
            }
            memcpy(&s->fp[(int64_t)it->dst * G], &s->fp[(int64_t)it->src * G],
                   sizeof(int64_t) * (size_t)it->n_tokens);
            // Slots past n_tokens are not copied: poison them in dst so a
            // reader relying on them fails.
            for (int32_t k = it->n_tokens; k < G; k++) s->fp[(int64_t)it->dst * G + k] = BM_POISON;
            break;
        default:
            snprintf(s->msg, sizeof(s->msg), "bad work kind %d at item %d", (int)it->kind, i);
            return false;
        }
    }
    return true;
}

// The FP block and slot of position pos in view v (pos in the FP region).
static inline int64_t *bm_sim_fp_slot(bm_sim *s, const nb_bm_seq_view *v, int32_t pos) {
    int32_t G = s->G;
    int32_t rel = pos - v->n_qblocks * G;
    int32_t bi = rel / G;
    if (rel < 0 || bi >= v->n_fpblocks) return NULL;
    int32_t b = v->fpblocks[bi];
    if (b < 0 || b >= s->n_fp) return NULL;
    return &s->fp[(int64_t)b * G + rel % G];
}

// The engine's forward pass writing the KV of positions [from, to) of a
// sequence whose tokens are tokens[0..to).
static inline bool bm_sim_write(bm_sim *s, const nb_bm_seq_view *v, const int32_t *tokens,
                                int32_t from, int32_t to) {
    uint32_t h = from > 0 ? bm_kv_at(tokens, from - 1) : BM_KV_SEED;
    for (int32_t p = from; p < to; p++) {
        h = bm_kv_step(h, tokens[p]);
        int64_t *c = bm_sim_fp_slot(s, v, p);
        if (!c) {
            snprintf(s->msg, sizeof(s->msg), "position %d has no FP slot to write (nq %d, nfp %d)",
                     p, v->n_qblocks, v->n_fpblocks);
            return false;
        }
        *c = bm_cell(h, p);
    }
    return true;
}

// Every position < n_committed + n_drafted must read back (tokens[p], p):
// expected[] is the model's token list.
static inline bool bm_sim_check_seq(bm_sim *s, const nb_bm_seq_view *v, const int32_t *expected) {
    int32_t G = s->G;
    int32_t n = v->n_committed + v->n_drafted;
    uint32_t h = BM_KV_SEED;
    for (int32_t p = 0; p < n; p++) {
        h = bm_kv_step(h, expected[p]);
        int64_t got;
        if (p < v->n_qblocks * G) {
            int32_t b = v->qblocks[p / G];
            if (b < 0 || b >= s->n_q) {
                snprintf(s->msg, sizeof(s->msg), "position %d: bad quantized block %d", p, b);
                return false;
            }
            got = s->q[(int64_t)b * G + p % G];
        } else {
            int64_t *c = bm_sim_fp_slot(s, v, p);
            if (!c) {
                snprintf(s->msg, sizeof(s->msg), "position %d: no FP slot", p);
                return false;
            }
            got = *c;
        }
        if (got != bm_cell(h, p)) {
            snprintf(s->msg, sizeof(s->msg),
                     "position %d (%s, nq %d): read (kv %08x, pos %d), expected (kv %08x, pos %d)%s",
                     p, p < v->n_qblocks * G ? "quantized" : "fp", v->n_qblocks,
                     (unsigned)((uint64_t)got >> 32), got == BM_POISON ? -1 : (int32_t)(uint32_t)got,
                     (unsigned)h, p, got == BM_POISON ? " [poison: never written or freed]" : "");
            return false;
        }
    }
    return true;
}

// The pre-quantized copy of C_F1 (view.prequant_block), when there is one,
// must hold group n_qblocks exactly: rows past (n_qblocks+2)*G read it.
static inline bool bm_sim_check_prequant(bm_sim *s, const nb_bm_seq_view *v, const int32_t *expected) {
    int32_t G = s->G;
    if (v->prequant_block < 0) return true;
    int32_t b = v->prequant_block;
    if (b >= s->n_q) {
        snprintf(s->msg, sizeof(s->msg), "bad prequant block %d", b);
        return false;
    }
    int32_t g = v->n_qblocks;
    if ((g + 1) * G > v->n_committed) {
        snprintf(s->msg, sizeof(s->msg), "prequant block %d for group %d, but only %d committed",
                 b, g, v->n_committed);
        return false;
    }
    uint32_t h = g > 0 ? bm_kv_at(expected, g * G - 1) : BM_KV_SEED;
    for (int32_t i = 0; i < G; i++) {
        int32_t p = g * G + i;
        h = bm_kv_step(h, expected[p]);
        int64_t got = s->q[(int64_t)b * G + i];
        if (got != bm_cell(h, p)) {
            snprintf(s->msg, sizeof(s->msg),
                     "prequant block %d (group %d) slot %d: read (kv %08x, pos %d), expected (kv %08x, pos %d)",
                     b, g, i, (unsigned)((uint64_t)got >> 32),
                     got == BM_POISON ? -1 : (int32_t)(uint32_t)got, (unsigned)h, p);
            return false;
        }
    }
    return true;
}

// ---------------------------------------------------------------------------
// Snapshots: the whole observable state, to prove a failed operation changed
// nothing.
// ---------------------------------------------------------------------------

typedef struct bm_snap_seq {
    bool live;
    bool flush_due;
    int32_t n_committed, n_drafted, n_qblocks, n_fpblocks;
    int32_t prequant_block;
    int32_t *qblocks, *fpblocks, *tokens;
} bm_snap_seq;

typedef struct bm_snap {
    int32_t max_seqs, n_q, n_fp;
    bm_snap_seq *seqs;
    int32_t *qref, *fpref;
    nb_bm_stats stats;
} bm_snap;

static inline void bm_snap_free(bm_snap *s) {
    if (!s->seqs) return;
    for (int32_t i = 0; i < s->max_seqs; i++) {
        free(s->seqs[i].qblocks);
        free(s->seqs[i].fpblocks);
        free(s->seqs[i].tokens);
    }
    free(s->seqs);
    free(s->qref);
    free(s->fpref);
    memset(s, 0, sizeof(*s));
}

static inline int32_t *bm_dup(const int32_t *a, int32_t n) {
    int32_t *d = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (n > 0) memcpy(d, a, sizeof(int32_t) * (size_t)n);
    return d;
}

static inline void bm_snap_take(bm_snap *s, const nb_bm_t *bm) {
    const nb_bm_params *p = nb_bm_params_get(bm);
    s->max_seqs = p->max_seqs;
    s->n_q = p->n_qblocks;
    s->n_fp = p->n_fpblocks;
    s->seqs = calloc((size_t)s->max_seqs, sizeof(*s->seqs));
    for (int32_t i = 0; i < s->max_seqs; i++) {
        nb_bm_seq_view v;
        bm_snap_seq *q = &s->seqs[i];
        if (nb_bm_seq_view_get(bm, i, &v) != NB_OK) continue;
        q->live = true;
        q->flush_due = nb_bm_seq_flush_due(bm, i);
        q->n_committed = v.n_committed;
        q->n_drafted = v.n_drafted;
        q->n_qblocks = v.n_qblocks;
        q->n_fpblocks = v.n_fpblocks;
        q->prequant_block = v.prequant_block;
        q->qblocks = bm_dup(v.qblocks, v.n_qblocks);
        q->fpblocks = bm_dup(v.fpblocks, v.n_fpblocks);
        q->tokens = bm_dup(v.tokens, v.n_committed + v.n_drafted);
    }
    s->qref = malloc(sizeof(int32_t) * (size_t)(s->n_q + 1));
    s->fpref = malloc(sizeof(int32_t) * (size_t)(s->n_fp + 1));
    for (int32_t b = 0; b < s->n_q; b++) s->qref[b] = nb_bm_qblock_refcount(bm, b);
    for (int32_t b = 0; b < s->n_fp; b++) s->fpref[b] = nb_bm_fpblock_refcount(bm, b);
    nb_bm_stats_get(bm, &s->stats);
}

// Returns true when equal; otherwise a description in msg.
static inline bool bm_snap_equal(const bm_snap *a, const bm_snap *b, char *msg, size_t len) {
    for (int32_t i = 0; i < a->max_seqs; i++) {
        const bm_snap_seq *x = &a->seqs[i], *y = &b->seqs[i];
        if (x->live != y->live) {
            snprintf(msg, len, "seq %d: live %d -> %d", i, x->live, y->live);
            return false;
        }
        if (!x->live) continue;
        if (x->flush_due != y->flush_due || x->n_committed != y->n_committed ||
            x->n_drafted != y->n_drafted || x->n_qblocks != y->n_qblocks ||
            x->n_fpblocks != y->n_fpblocks || x->prequant_block != y->prequant_block) {
            snprintf(msg, len,
                     "seq %d: (due %d, c %d, d %d, nq %d, nfp %d) -> (due %d, c %d, d %d, nq %d, nfp %d)",
                     i, x->flush_due, x->n_committed, x->n_drafted, x->n_qblocks, x->n_fpblocks,
                     y->flush_due, y->n_committed, y->n_drafted, y->n_qblocks, y->n_fpblocks);
            return false;
        }
        if (memcmp(x->qblocks, y->qblocks, sizeof(int32_t) * (size_t)x->n_qblocks) ||
            memcmp(x->fpblocks, y->fpblocks, sizeof(int32_t) * (size_t)x->n_fpblocks) ||
            memcmp(x->tokens, y->tokens, sizeof(int32_t) * (size_t)(x->n_committed + x->n_drafted))) {
            snprintf(msg, len, "seq %d: block ids or tokens changed", i);
            return false;
        }
    }
    for (int32_t k = 0; k < a->n_q; k++)
        if (a->qref[k] != b->qref[k]) {
            snprintf(msg, len, "qblock %d refcount %d -> %d", k, a->qref[k], b->qref[k]);
            return false;
        }
    for (int32_t k = 0; k < a->n_fp; k++)
        if (a->fpref[k] != b->fpref[k]) {
            snprintf(msg, len, "fpblock %d refcount %d -> %d", k, a->fpref[k], b->fpref[k]);
            return false;
        }
    const nb_bm_stats *s = &a->stats, *t = &b->stats;
    if (s->n_qblocks_free != t->n_qblocks_free || s->n_qblocks_cached != t->n_qblocks_cached ||
        s->n_qblocks_reserved != t->n_qblocks_reserved || s->n_fpblocks_free != t->n_fpblocks_free ||
        s->n_seqs != t->n_seqs || s->n_prefix_hits != t->n_prefix_hits ||
        s->n_evictions != t->n_evictions) {
        snprintf(msg, len,
                 "stats changed: qfree %d->%d qcached %d->%d qres %d->%d fpfree %d->%d seqs %d->%d "
                 "hits %lld->%lld evictions %lld->%lld",
                 s->n_qblocks_free, t->n_qblocks_free, s->n_qblocks_cached, t->n_qblocks_cached,
                 s->n_qblocks_reserved, t->n_qblocks_reserved, s->n_fpblocks_free,
                 t->n_fpblocks_free, s->n_seqs, t->n_seqs, (long long)s->n_prefix_hits,
                 (long long)t->n_prefix_hits, (long long)s->n_evictions, (long long)t->n_evictions);
        return false;
    }
    return true;
}

#endif // NB_BM_MODEL_H
