// block_manager.c: pools, per-sequence block tables, the FP double buffer,
// rollback, fork and the prefix cache. See block_manager.h for the model.
//
// The one idea of the implementation: every operation first computes
// everything it will need (blocks, reservation, work-list room) without
// touching state, and only then mutates. That is what makes "state unchanged
// after a failed operation" true by construction.
//
// Quantized-block accounting: a block is FREE (on the free list), USED (ref >
// 0) or CACHED (ref == 0 but registered in the prefix hash table, on the LRU
// list). "Available" = free + cached. Flushes never fail because each
// sequence reserves, at append time, the blocks its pending flushes could
// need; the invariant available >= total reserved holds between operations.
#include "block_manager.h"

#include "nb_status.h"
#include <jemalloc/jemalloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#define NB_BM_MAX_G 4096

typedef struct qblock_rec {
    int32_t ref;         // sequences whose table holds this block
    int32_t next;        // free list or LRU list link (-1 ends)
    int32_t prev;        // LRU list back link
    uint8_t registered;  // present in the prefix hash table
    XXH128_hash_t hash;  // chain hash of the token prefix ending with this block
} qblock_rec;

typedef struct fpblock_rec {
    int32_t ref;  // sequences whose FP list holds this block
    int32_t next; // free list link
} fpblock_rec;

typedef struct seq_rec {
    bool live;
    int32_t next_free;   // slot free list link
    int32_t n_committed; // tokens
    int32_t n_drafted;   // tokens, after the committed ones
    int32_t n_q;         // quantized blocks in q[]
    int32_t n_fp;        // FP blocks in fp[]
    int32_t q_reserved;  // quantized blocks promised to this sequence's flushes
    int32_t preq;        // quantized copy of fp[0] made ahead of its flush, or -1
    int32_t *q;          // [max_q_per_seq]
    int32_t *fp;         // [max_fp_per_seq], fp[0] = C_F1
    int32_t *tokens;     // [max_seq_len]
} seq_rec;

typedef struct ht_entry {
    XXH128_hash_t key;
    int32_t block; // -1: empty
} ht_entry;

struct nb_bm {
    nb_bm_params p;
    int32_t G;
    int32_t max_q_per_seq;
    int32_t max_fp_per_seq;

    qblock_rec *qrec;   // [n_qblocks]
    int32_t q_free_head;
    int32_t n_q_free;
    int32_t lru_head;   // least recently used cached block
    int32_t lru_tail;
    int32_t n_q_cached;
    int32_t q_reserved_total;

    fpblock_rec *fprec; // [n_fpblocks]
    int32_t fp_free_head;
    int32_t n_fp_free;

    seq_rec *seqs;      // [max_seqs]
    int32_t seq_free_head;
    int32_t n_seqs;

    ht_entry *ht;       // [ht_cap], open addressing, linear probing
    uint32_t ht_mask;
    int32_t ht_count;

    XXH3_state_t *xxh;
    int64_t n_prefix_hits;
    int64_t n_evictions;

    // one allocation each, released in nb_bm_destroy
    int32_t *q_tables;
    int32_t *fp_tables;
    int32_t *token_store;
};

// ---------------------------------------------------------------------------
// small helpers
// ---------------------------------------------------------------------------

static int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

int32_t nb_bm_qblocks_for_tokens(const nb_bm_params *p, int32_t n) {
    if (!p->quantize || n < 2 * p->group_size) return 0;
    return n / p->group_size - 1;
}

// Flushes due for a FP region holding fp_committed committed tokens.
static int32_t flushes_for(const nb_bm_t *bm, int32_t fp_committed) {
    if (!bm->p.quantize || fp_committed < 2 * bm->G) return 0;
    return fp_committed / bm->G - 1;
}

static int32_t seq_fp_committed(const nb_bm_t *bm, const seq_rec *s) {
    return s->n_committed - s->n_q * bm->G;
}

static int32_t seq_fp_tokens(const nb_bm_t *bm, const seq_rec *s) {
    return s->n_committed + s->n_drafted - s->n_q * bm->G;
}

static int32_t q_available(const nb_bm_t *bm) { return bm->n_q_free + bm->n_q_cached; }

static seq_rec *seq_get(nb_bm_t *bm, int32_t seq) {
    if (seq < 0 || seq >= bm->p.max_seqs || !bm->seqs[seq].live) return NULL;
    return &bm->seqs[seq];
}

static int32_t work_room(const nb_bm_work_list *w) { return w ? w->cap - w->n : 0; }

static void work_push(nb_bm_work_list *w, nb_bm_work_kind kind, int32_t src, int32_t dst,
                      int32_t n_tokens) {
    NB_ASSERT(w && w->n < w->cap);
    w->items[w->n++] = (nb_bm_work){.kind = kind, .src = src, .dst = dst, .n_tokens = n_tokens};
}

// ---------------------------------------------------------------------------
// prefix hash table (keys are 128-bit chain hashes; values block ids)
// ---------------------------------------------------------------------------

static uint32_t ht_slot(const nb_bm_t *bm, XXH128_hash_t k) {
    return (uint32_t)(k.low64 ^ (k.high64 >> 7)) & bm->ht_mask;
}

static int32_t ht_find(const nb_bm_t *bm, XXH128_hash_t k) {
    for (uint32_t i = ht_slot(bm, k);; i = (i + 1) & bm->ht_mask) {
        const ht_entry *e = &bm->ht[i];
        if (e->block < 0) return -1;
        if (XXH128_isEqual(e->key, k)) return e->block;
    }
}

static void ht_insert(nb_bm_t *bm, XXH128_hash_t k, int32_t block) {
    NB_ASSERT(bm->ht_count < (int32_t)bm->ht_mask); // capacity >= 2 * n_qblocks
    uint32_t i = ht_slot(bm, k);
    while (bm->ht[i].block >= 0) i = (i + 1) & bm->ht_mask;
    bm->ht[i].key = k;
    bm->ht[i].block = block;
    bm->ht_count++;
}

// Backward-shift deletion keeps probe chains intact without tombstones.
static void ht_remove(nb_bm_t *bm, XXH128_hash_t k) {
    uint32_t i = ht_slot(bm, k);
    while (!XXH128_isEqual(bm->ht[i].key, k) || bm->ht[i].block < 0) {
        NB_ASSERT(bm->ht[i].block >= 0);
        i = (i + 1) & bm->ht_mask;
    }
    bm->ht[i].block = -1;
    bm->ht_count--;
    for (uint32_t j = (i + 1) & bm->ht_mask; bm->ht[j].block >= 0; j = (j + 1) & bm->ht_mask) {
        uint32_t home = ht_slot(bm, bm->ht[j].key);
        // move j back into the hole at i unless its home lies cyclically in (i, j]
        bool in_range = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!in_range) {
            bm->ht[i] = bm->ht[j];
            bm->ht[j].block = -1;
            i = j;
        }
    }
}

// Chain hash of group j: H(salt; hash of group j-1, tokens of group j).
static XXH128_hash_t chain_hash(nb_bm_t *bm, const XXH128_hash_t *prev, const int32_t *tokens) {
    XXH3_128bits_reset_withSeed(bm->xxh, bm->p.cache_salt);
    XXH128_hash_t zero = {0, 0};
    const XXH128_hash_t *pv = prev ? prev : &zero;
    XXH3_128bits_update(bm->xxh, &pv->low64, sizeof(pv->low64));
    XXH3_128bits_update(bm->xxh, &pv->high64, sizeof(pv->high64));
    XXH3_128bits_update(bm->xxh, tokens, (size_t)bm->G * sizeof(int32_t));
    return XXH3_128bits_digest(bm->xxh);
}

// ---------------------------------------------------------------------------
// quantized and FP block pools
// ---------------------------------------------------------------------------

static void lru_unlink(nb_bm_t *bm, int32_t b) {
    qblock_rec *r = &bm->qrec[b];
    if (r->prev >= 0) bm->qrec[r->prev].next = r->next; else bm->lru_head = r->next;
    if (r->next >= 0) bm->qrec[r->next].prev = r->prev; else bm->lru_tail = r->prev;
    r->next = r->prev = -1;
    bm->n_q_cached--;
}

static void lru_push_tail(nb_bm_t *bm, int32_t b) {
    qblock_rec *r = &bm->qrec[b];
    r->prev = bm->lru_tail;
    r->next = -1;
    if (bm->lru_tail >= 0) bm->qrec[bm->lru_tail].next = b; else bm->lru_head = b;
    bm->lru_tail = b;
    bm->n_q_cached++;
}

// Takes a block from the free list, else evicts the least recently used
// cached block. Returns -1 when neither exists.
static int32_t q_alloc(nb_bm_t *bm) {
    int32_t b = bm->q_free_head;
    if (b >= 0) {
        bm->q_free_head = bm->qrec[b].next;
        bm->n_q_free--;
    } else if (bm->lru_head >= 0) {
        b = bm->lru_head;
        lru_unlink(bm, b);
        ht_remove(bm, bm->qrec[b].hash);
        bm->qrec[b].registered = 0;
        bm->n_evictions++;
    } else {
        return -1;
    }
    qblock_rec *r = &bm->qrec[b];
    r->ref = 1;
    r->next = r->prev = -1;
    r->registered = 0;
    return b;
}

// A reference to an existing block (shared prefix, fork).
static void q_ref(nb_bm_t *bm, int32_t b) {
    qblock_rec *r = &bm->qrec[b];
    if (r->ref == 0) {
        NB_ASSERT(r->registered);
        lru_unlink(bm, b);
    }
    r->ref++;
}

static void q_release(nb_bm_t *bm, int32_t b) {
    qblock_rec *r = &bm->qrec[b];
    NB_ASSERT(r->ref > 0);
    if (--r->ref > 0) return;
    if (r->registered) {
        lru_push_tail(bm, b);
    } else {
        r->next = bm->q_free_head;
        bm->q_free_head = b;
        bm->n_q_free++;
    }
}

static int32_t fp_alloc(nb_bm_t *bm) {
    int32_t b = bm->fp_free_head;
    NB_ASSERT(b >= 0); // callers check n_fp_free first
    bm->fp_free_head = bm->fprec[b].next;
    bm->n_fp_free--;
    bm->fprec[b].ref = 1;
    bm->fprec[b].next = -1;
    return b;
}

static void fp_release(nb_bm_t *bm, int32_t b) {
    fpblock_rec *r = &bm->fprec[b];
    NB_ASSERT(r->ref > 0);
    if (--r->ref > 0) return;
    r->next = bm->fp_free_head;
    bm->fp_free_head = b;
    bm->n_fp_free++;
}

static int32_t q_block_for_group(nb_bm_t *bm, seq_rec *s, int32_t j, int32_t f,
                                 nb_bm_work_list *work);

// Blocks this sequence's flushes may still take: one per possible flush, less
// the pre-quantized block it already holds (which serves the first flush).
static int32_t reservation_for(const nb_bm_t *bm, const seq_rec *s, int32_t fp_committed_max) {
    int32_t r = flushes_for(bm, fp_committed_max) - (s->preq >= 0 ? 1 : 0);
    return r > 0 ? r : 0;
}

static int32_t seq_reservation_needed(const nb_bm_t *bm, const seq_rec *s) {
    return reservation_for(bm, s, seq_fp_committed(bm, s) + s->n_drafted);
}

static void seq_set_reservation(nb_bm_t *bm, seq_rec *s, int32_t res) {
    bm->q_reserved_total += res - s->q_reserved;
    s->q_reserved = res;
}

// ---------------------------------------------------------------------------
// lifecycle
// ---------------------------------------------------------------------------

nb_bm_params nb_bm_default_params(void) {
    return (nb_bm_params){
        .group_size = 128,
        .n_qblocks = 1024,
        .n_fpblocks = 256,
        .max_seqs = 64,
        .max_seq_len = 8192,
        .max_append = 512,
        .quantize = true,
        .prefix_cache = true,
        .cache_salt = 0,
        .qblock_bytes = 0,
        .fpblock_bytes = 0,
    };
}

int32_t nb_bm_fp_blocks_per_seq_max(const nb_bm_params *p) {
    int32_t G = p->group_size;
    if (!p->quantize) return ceil_div(p->max_seq_len, G) + 1;
    return ceil_div(2 * G + p->max_append, G) + 1;
}

// Why max_seqs * base + ceil(pass_rows / G) suffices. Every live FP block is
// on at least one sequence's list (copy-on-write replaces a shared block in
// the writer's list, the other list keeps it), and an append succeeds when
// the pool covers what the lists hold after it, so it is enough to bound the
// sum of list lengths. A list holds ceil(t / G) blocks for the t tokens of
// the FP region. Outside a pass, t <= 2G - 1 + D (D = max_pending: flushes
// leave G..2G-1 committed tokens, a deep rollback at most 2G - 1), and
// ceil((2G - 1 + D) / G) <= ceil((2G + D') / G) = base - 1 with D' =
// max(D, G). A sequence that appends n tokens in a pass holds at most
// ceil((2G - 1 + D + n) / G) <= base - 1 + ceil(n / G) <= base + n / G
// (an adopted prefix leaves t = n, fewer). Summed: max_seqs * base + sum n /
// G, and sum n <= pass_rows.
int32_t nb_bm_fp_pool_blocks(const nb_bm_params *p, int32_t max_pending, int32_t pass_rows) {
    if (!p || p->group_size < 1 || p->max_seqs < 1 || max_pending < 0 || pass_rows < 0)
        return -1;
    int64_t per_seq;
    int64_t extra = 0;
    if (!p->quantize) {
        if (p->max_seq_len < 1) return -1;
        per_seq = nb_bm_fp_blocks_per_seq_max(p);
    } else {
        const int32_t G = p->group_size;
        nb_bm_params small = *p; // base: the per-sequence figure for appends of max(D, G)
        small.max_append = max_pending > G ? max_pending : G;
        per_seq = nb_bm_fp_blocks_per_seq_max(&small);
        extra = ((int64_t)pass_rows + G - 1) / G;
    }
    int64_t n = (int64_t)p->max_seqs * per_seq + extra;
    return n > INT32_MAX ? -1 : (int32_t)n;
}

nb_bm_t *nb_bm_new(const nb_bm_params *p, char *err, size_t err_len) {
    if (!p) {
        nb_set_err(err, err_len, "block manager: NULL params");
        return NULL;
    }
    if (p->group_size < 1 || p->group_size > NB_BM_MAX_G) {
        nb_set_err(err, err_len, "block manager: group_size %d outside [1, %d]", p->group_size,
                NB_BM_MAX_G);
        return NULL;
    }
    if (p->n_qblocks < 0 || p->n_fpblocks < 1 || p->max_seqs < 1 || p->max_seq_len < 1 ||
        p->max_append < 1) {
        nb_set_err(err, err_len,
                "block manager: need n_qblocks >= 0, n_fpblocks, max_seqs, max_seq_len, "
                "max_append >= 1 (got %d, %d, %d, %d, %d)",
                p->n_qblocks, p->n_fpblocks, p->max_seqs, p->max_seq_len, p->max_append);
        return NULL;
    }
    if (p->max_append > p->max_seq_len) {
        nb_set_err(err, err_len, "block manager: max_append %d exceeds max_seq_len %d",
                p->max_append, p->max_seq_len);
        return NULL;
    }
    nb_bm_t *bm = calloc(1, sizeof(*bm));
    if (!bm) goto out_oom;
    bm->p = *p;
    bm->G = p->group_size;
    bm->max_q_per_seq = p->max_seq_len / p->group_size + 1;
    bm->max_fp_per_seq = nb_bm_fp_blocks_per_seq_max(p);

    size_t ns = (size_t)p->max_seqs;
    bm->qrec = calloc((size_t)(p->n_qblocks ? p->n_qblocks : 1), sizeof(qblock_rec));
    bm->fprec = calloc((size_t)p->n_fpblocks, sizeof(fpblock_rec));
    bm->seqs = calloc(ns, sizeof(seq_rec));
    bm->q_tables = malloc(ns * (size_t)bm->max_q_per_seq * sizeof(int32_t));
    bm->fp_tables = malloc(ns * (size_t)bm->max_fp_per_seq * sizeof(int32_t));
    // NOTE: one reservation of address space; pages are touched only as
    // sequences grow, so a large max_seqs * max_seq_len costs little RSS.
    bm->token_store = malloc(ns * (size_t)p->max_seq_len * sizeof(int32_t));
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)p->n_qblocks + 2u) cap <<= 1;
    bm->ht = malloc(cap * sizeof(ht_entry));
    bm->ht_mask = cap - 1;
    bm->xxh = XXH3_createState();
    if (!bm->qrec || !bm->fprec || !bm->seqs || !bm->q_tables || !bm->fp_tables ||
        !bm->token_store || !bm->ht || !bm->xxh)
        goto out_free_bm;

    for (uint32_t i = 0; i < cap; i++) bm->ht[i].block = -1;
    for (int32_t b = 0; b < p->n_qblocks; b++) {
        bm->qrec[b].next = b + 1 < p->n_qblocks ? b + 1 : -1;
        bm->qrec[b].prev = -1;
    }
    bm->q_free_head = p->n_qblocks ? 0 : -1;
    bm->n_q_free = p->n_qblocks;
    bm->lru_head = bm->lru_tail = -1;
    for (int32_t b = 0; b < p->n_fpblocks; b++)
        bm->fprec[b].next = b + 1 < p->n_fpblocks ? b + 1 : -1;
    bm->fp_free_head = 0;
    bm->n_fp_free = p->n_fpblocks;
    for (int32_t i = 0; i < p->max_seqs; i++) {
        seq_rec *s = &bm->seqs[i];
        s->next_free = i + 1 < p->max_seqs ? i + 1 : -1;
        s->q = bm->q_tables + (size_t)i * bm->max_q_per_seq;
        s->fp = bm->fp_tables + (size_t)i * bm->max_fp_per_seq;
        s->tokens = bm->token_store + (size_t)i * p->max_seq_len;
    }
    bm->seq_free_head = 0;
    return bm;

out_free_bm:
    nb_bm_destroy(&bm);
out_oom:
    nb_set_err(err, err_len, "block manager: out of host memory");
    return NULL;
}

void nb_bm_destroy(nb_bm_t **bm_p) {
    if (!bm_p || !*bm_p) return;
    nb_bm_t *bm = *bm_p;
    if (bm->xxh) XXH3_freeState(bm->xxh);
    free(bm->ht);
    free(bm->token_store);
    free(bm->fp_tables);
    free(bm->q_tables);
    free(bm->seqs);
    free(bm->fprec);
    free(bm->qrec);
    free(bm);
    *bm_p = NULL;
}

const nb_bm_params *nb_bm_params_get(const nb_bm_t *bm) { return &bm->p; }

int32_t nb_bm_work_max_per_op(const nb_bm_t *bm) {
    int32_t flush = bm->p.quantize ? ceil_div(2 * bm->G + bm->p.max_append, bm->G) : 0;
    return flush > 2 ? flush : 2;
}

// ---------------------------------------------------------------------------
// sequences
// ---------------------------------------------------------------------------

nb_status nb_bm_seq_add(nb_bm_t *bm, int32_t *seq) {
    if (!seq) return NB_ERR_INVALID_ARG;
    int32_t i = bm->seq_free_head;
    if (i < 0) return NB_ERR_TOO_MANY_SEQS;
    seq_rec *s = &bm->seqs[i];
    bm->seq_free_head = s->next_free;
    s->live = true;
    s->next_free = -1;
    s->n_committed = s->n_drafted = s->n_q = s->n_fp = s->q_reserved = 0;
    s->preq = -1;
    bm->n_seqs++;
    *seq = i;
    return NB_OK;
}

bool nb_bm_seq_flush_due(const nb_bm_t *bm, int32_t seq) {
    if (seq < 0 || seq >= bm->p.max_seqs || !bm->seqs[seq].live) return false;
    return flushes_for(bm, seq_fp_committed(bm, &bm->seqs[seq])) > 0;
}

nb_status nb_bm_seq_append(nb_bm_t *bm, int32_t seq, const int32_t *tokens, int32_t n,
                           nb_bm_append_kind kind, int32_t *n_cached, nb_bm_work_list *work) {
    seq_rec *s = seq_get(bm, seq);
    if (!s) return NB_ERR_NOT_FOUND;
    if (!tokens || n < 1 || (kind != NB_BM_COMMITTED && kind != NB_BM_DRAFTED))
        return NB_ERR_INVALID_ARG;
    if (kind == NB_BM_COMMITTED && s->n_drafted > 0) return NB_ERR_STATE;
    if (kind == NB_BM_DRAFTED && s->n_drafted + n > bm->p.max_append) return NB_ERR_INVALID_ARG;
    if (flushes_for(bm, seq_fp_committed(bm, s)) > 0) return NB_ERR_STATE;
    if ((int64_t)s->n_committed + s->n_drafted + n > bm->p.max_seq_len)
        return NB_ERR_CONTEXT_TOO_LONG;

    const int32_t G = bm->G;

    // 1. Prefix adoption (empty sequence, committed append): count the
    //    cached blocks without touching anything yet; step 3 adopts them.
    int32_t m = 0, m_cached = 0;
    bool adopt = kind == NB_BM_COMMITTED && n_cached && s->n_committed == 0 &&
                 bm->p.prefix_cache && bm->p.quantize;
    if (adopt) {
        int32_t m_max = nb_bm_qblocks_for_tokens(&bm->p, n);
        XXH128_hash_t h = {0, 0};
        for (; m < m_max; m++) {
            h = chain_hash(bm, m ? &h : NULL, tokens + (size_t)m * G);
            int32_t b = ht_find(bm, h);
            if (b < 0) break;
            if (bm->qrec[b].ref == 0) m_cached++;
        }
    }

    // 2. What the append needs: FP blocks (new ones + a copy-on-write
    //    target), reserved quantized blocks, work-list room.
    int32_t fp_tokens = adopt ? 0 : seq_fp_tokens(bm, s);
    int32_t n_fp_now = adopt ? 0 : s->n_fp;
    int32_t add = n - m * G;
    if (add > bm->p.max_append) return NB_ERR_INVALID_ARG;
    int32_t n_fp_after = ceil_div(fp_tokens + add, G);
    bool cow = fp_tokens % G != 0 && bm->fprec[s->fp[n_fp_now - 1]].ref > 1;
    int32_t fp_need = n_fp_after - n_fp_now + (cow ? 1 : 0);
    NB_ASSERT(n_fp_after <= bm->max_fp_per_seq);
    if (fp_need > bm->n_fp_free) return NB_ERR_NO_FREE_BLOCKS;

    int32_t fp_committed_max = (adopt ? 0 : seq_fp_committed(bm, s)) +
                               (kind == NB_BM_DRAFTED ? s->n_drafted + n : add);
    int32_t res = reservation_for(bm, s, fp_committed_max);
    int32_t others = bm->q_reserved_total - s->q_reserved;
    if (q_available(bm) - m_cached - others < res) return NB_ERR_NO_FREE_BLOCKS;
    // Pre-quantize C_F1 when a new token reaches (n_q+2)*G and C_F1 is committed.
    int32_t nq_after = adopt ? m : s->n_q;
    int32_t last_pos = s->n_committed + s->n_drafted + n - 1;
    // NOTE: only a C_F1 committed BEFORE this append qualifies: the KV of the
    // tokens being appended is written by the forward pass that follows, and
    // the QUANTIZE item runs before it.
    int32_t fp_committed_before = adopt ? 0 : seq_fp_committed(bm, s);
    bool preq = bm->p.quantize && s->preq < 0 && fp_committed_before >= G &&
                last_pos >= (nq_after + 2) * G;
    if (work_room(work) < (cow ? 1 : 0) + (preq ? 1 : 0)) return NB_ERR_INVALID_ARG;

    // 3. Commit to it.
    if (adopt) {
        for (int32_t j = 0; j < m; j++) {
            const XXH128_hash_t *prev = j ? &bm->qrec[s->q[j - 1]].hash : NULL;
            int32_t b = ht_find(bm, chain_hash(bm, prev, tokens + (size_t)j * G));
            NB_ASSERT(b >= 0);
            q_ref(bm, b);
            s->q[j] = b;
        }
        s->n_q = m;
        s->n_committed = m * G;
        memcpy(s->tokens, tokens, (size_t)m * G * sizeof(int32_t));
        bm->n_prefix_hits += m;
    }
    if (cow) {
        int32_t old = s->fp[n_fp_now - 1];
        int32_t nb = fp_alloc(bm);
        work_push(work, NB_BM_WORK_COPY, old, nb, fp_tokens % G);
        fp_release(bm, old);
        s->fp[n_fp_now - 1] = nb;
    }
    for (int32_t i = n_fp_now; i < n_fp_after; i++) s->fp[i] = fp_alloc(bm);
    s->n_fp = n_fp_after;
    int32_t at = s->n_committed + s->n_drafted;
    memcpy(s->tokens + at, tokens + (size_t)m * G, (size_t)add * sizeof(int32_t));
    if (kind == NB_BM_COMMITTED) s->n_committed += add;
    else s->n_drafted += add;
    seq_set_reservation(bm, s, res);
    if (preq) {
        NB_ASSERT(s->q_reserved > 0);
        seq_set_reservation(bm, s, s->q_reserved - 1);
        s->preq = q_block_for_group(bm, s, s->n_q, s->fp[0], work);
    }
    NB_ASSERT(s->q_reserved == seq_reservation_needed(bm, s));
    if (n_cached) *n_cached = m * G;
    return NB_OK;
}

// The quantized block for group j of s, whose FP copy is f: an identical
// registered block if the prefix cache has one, else a new block and a
// QUANTIZE item. The caller has room in work and has consumed one unit of
// the sequence's reservation.
static int32_t q_block_for_group(nb_bm_t *bm, seq_rec *s, int32_t j, int32_t f,
                                 nb_bm_work_list *work) {
    const int32_t G = bm->G;
    XXH128_hash_t h = {0, 0};
    if (bm->p.prefix_cache) {
        h = chain_hash(bm, j ? &bm->qrec[s->q[j - 1]].hash : NULL, s->tokens + (size_t)j * G);
        int32_t b = ht_find(bm, h);
        if (b >= 0) {
            q_ref(bm, b); // shared prefix: no quantization
            bm->n_prefix_hits++;
            return b;
        }
    }
    int32_t b = q_alloc(bm);
    NB_ASSERT(b >= 0); // guaranteed by the reservation
    work_push(work, NB_BM_WORK_QUANTIZE, f, b, G);
    if (bm->p.prefix_cache) {
        bm->qrec[b].hash = h;
        bm->qrec[b].registered = 1;
        ht_insert(bm, h, b);
    }
    return b;
}

int32_t nb_bm_prefix_lookup(const nb_bm_t *bm_c, const int32_t *tokens, int32_t n) {
    nb_bm_t *bm = (nb_bm_t *)bm_c; // the scratch hash state only
    if (!tokens || n < 1 || !bm->p.prefix_cache || !bm->p.quantize) return 0;
    int32_t m = 0, m_max = nb_bm_qblocks_for_tokens(&bm->p, n);
    XXH128_hash_t h = {0, 0};
    for (; m < m_max; m++) {
        h = chain_hash(bm, m ? &h : NULL, tokens + (size_t)m * bm->G);
        if (ht_find(bm, h) < 0) break;
    }
    return m * bm->G;
}

// Quantizes (or adopts the pre-quantized or a cached copy of) every full
// group beyond the double buffer, shifting the FP list.
static void seq_flush(nb_bm_t *bm, seq_rec *s, nb_bm_work_list *work) {
    for (int32_t k = flushes_for(bm, seq_fp_committed(bm, s)); k > 0; k--) {
        int32_t f = s->fp[0];
        int32_t b;
        if (s->preq >= 0) {
            b = s->preq; // quantized ahead of time; its reservation is spent
            s->preq = -1;
        } else {
            // NOTE: the reservation is consumed before allocating so that
            // available >= reserved holds throughout.
            NB_ASSERT(s->q_reserved > 0);
            seq_set_reservation(bm, s, s->q_reserved - 1);
            b = q_block_for_group(bm, s, s->n_q, f, work);
        }
        fp_release(bm, f);
        memmove(s->fp, s->fp + 1, (size_t)(s->n_fp - 1) * sizeof(int32_t));
        s->n_fp--;
        s->q[s->n_q++] = b;
    }
    seq_set_reservation(bm, s, seq_reservation_needed(bm, s));
}

nb_status nb_bm_seq_flush(nb_bm_t *bm, int32_t seq, nb_bm_work_list *work) {
    seq_rec *s = seq_get(bm, seq);
    if (!s) return NB_ERR_NOT_FOUND;
    if (work_room(work) < flushes_for(bm, seq_fp_committed(bm, s))) return NB_ERR_INVALID_ARG;
    seq_flush(bm, s, work);
    return NB_OK;
}

nb_status nb_bm_seq_accept(nb_bm_t *bm, int32_t seq, int32_t n_accept, nb_bm_work_list *work) {
    seq_rec *s = seq_get(bm, seq);
    if (!s) return NB_ERR_NOT_FOUND;
    if (n_accept < 0 || n_accept > s->n_drafted) return NB_ERR_INVALID_ARG;
    if (work_room(work) < flushes_for(bm, seq_fp_committed(bm, s) + n_accept))
        return NB_ERR_INVALID_ARG;
    s->n_committed += n_accept;
    s->n_drafted = 0;
    int32_t keep = ceil_div(seq_fp_tokens(bm, s), bm->G);
    for (int32_t i = keep; i < s->n_fp; i++) fp_release(bm, s->fp[i]);
    s->n_fp = keep;
    seq_flush(bm, s, work);
    return NB_OK;
}

nb_status nb_bm_seq_rollback(nb_bm_t *bm, int32_t seq, int32_t n, nb_bm_work_list *work) {
    seq_rec *s = seq_get(bm, seq);
    if (!s) return NB_ERR_NOT_FOUND;
    if (n < 0 || n > s->n_committed) return NB_ERR_INVALID_ARG;
    const int32_t G = bm->G;
    int32_t nq_new = nb_bm_qblocks_for_tokens(&bm->p, n);

    if (nq_new >= s->n_q) {
        // Inside the FP region: truncate, O(1) in the sequence length.
        int32_t keep = ceil_div(n - s->n_q * G, G);
        for (int32_t i = keep; i < s->n_fp; i++) fp_release(bm, s->fp[i]);
        s->n_fp = keep;
        s->n_committed = n;
        s->n_drafted = 0;
        if (s->preq >= 0 && n < (s->n_q + 1) * G) { // C_F1 no longer full
            q_release(bm, s->preq);
            s->preq = -1;
        }
        seq_set_reservation(bm, s, seq_reservation_needed(bm, s));
        return NB_OK;
    }

    // Deeper: groups nq_new .. ceil(n/G)-1 become the FP region (at most 2).
    // Those still quantized are dequantized into fresh FP blocks.
    int32_t g_end = ceil_div(n, G);
    int32_t n_deq = 0;
    for (int32_t g = nq_new; g < g_end; g++)
        if (g < s->n_q) n_deq++;
    // Old FP blocks keep groups n_q .. g_end-1; the rest are released.
    int32_t keep_old = g_end > s->n_q ? g_end - s->n_q : 0;
    int32_t freed = 0;
    for (int32_t i = keep_old; i < s->n_fp; i++)
        if (bm->fprec[s->fp[i]].ref == 1) freed++;
    if (bm->n_fp_free + freed < n_deq) return NB_ERR_NO_FREE_BLOCKS;
    if (work_room(work) < n_deq) return NB_ERR_INVALID_ARG;

    // Release first, so a tiny pool can reuse those blocks for the
    // dequantized groups (their contents no longer matter).
    for (int32_t i = keep_old; i < s->n_fp; i++) fp_release(bm, s->fp[i]);
    int32_t new_fp[2];
    int32_t n_new = 0;
    for (int32_t g = nq_new; g < g_end; g++) {
        if (g < s->n_q) {
            int32_t f = fp_alloc(bm);
            work_push(work, NB_BM_WORK_DEQUANTIZE, s->q[g], f, G);
            new_fp[n_new++] = f;
        } else {
            new_fp[n_new++] = s->fp[g - s->n_q];
        }
    }
    // NOTE: released after the DEQUANTIZE items are planned: a later
    // operation may reuse these blocks, and its items run after ours.
    for (int32_t g = nq_new; g < s->n_q; g++) q_release(bm, s->q[g]);
    if (s->preq >= 0) {
        q_release(bm, s->preq);
        s->preq = -1;
    }
    s->n_q = nq_new;
    memcpy(s->fp, new_fp, (size_t)n_new * sizeof(int32_t));
    s->n_fp = n_new;
    s->n_committed = n;
    s->n_drafted = 0;
    seq_set_reservation(bm, s, seq_reservation_needed(bm, s));
    return NB_OK;
}

nb_status nb_bm_seq_free(nb_bm_t *bm, int32_t seq) {
    seq_rec *s = seq_get(bm, seq);
    if (!s) return NB_ERR_NOT_FOUND;
    for (int32_t i = 0; i < s->n_fp; i++) fp_release(bm, s->fp[i]);
    // Release newest first, so that LRU eviction later takes the tail of a
    // prefix before its head (the head is the part most likely shared).
    if (s->preq >= 0) q_release(bm, s->preq);
    s->preq = -1;
    for (int32_t j = s->n_q - 1; j >= 0; j--) q_release(bm, s->q[j]);
    seq_set_reservation(bm, s, 0);
    s->n_fp = s->n_q = s->n_committed = s->n_drafted = 0;
    s->live = false;
    s->next_free = bm->seq_free_head;
    bm->seq_free_head = seq;
    bm->n_seqs--;
    return NB_OK;
}

nb_status nb_bm_seq_fork(nb_bm_t *bm, int32_t parent, int32_t *child) {
    seq_rec *p = seq_get(bm, parent);
    if (!p) return NB_ERR_NOT_FOUND;
    if (!child) return NB_ERR_INVALID_ARG;
    if (bm->seq_free_head < 0) return NB_ERR_TOO_MANY_SEQS;
    int32_t res = flushes_for(bm, seq_fp_committed(bm, p));
    if (q_available(bm) - bm->q_reserved_total < res) return NB_ERR_NO_FREE_BLOCKS;
    int32_t c_id;
    nb_status st = nb_bm_seq_add(bm, &c_id);
    NB_ASSERT(st == NB_OK);
    seq_rec *c = &bm->seqs[c_id];
    for (int32_t j = 0; j < p->n_q; j++) {
        q_ref(bm, p->q[j]);
        c->q[j] = p->q[j];
    }
    c->n_q = p->n_q;
    c->n_fp = ceil_div(seq_fp_committed(bm, p), bm->G);
    for (int32_t i = 0; i < c->n_fp; i++) {
        bm->fprec[p->fp[i]].ref++;
        c->fp[i] = p->fp[i];
    }
    c->n_committed = p->n_committed;
    memcpy(c->tokens, p->tokens, (size_t)p->n_committed * sizeof(int32_t));
    seq_set_reservation(bm, c, res);
    *child = c_id;
    return NB_OK;
}

nb_status nb_bm_seq_view_get(const nb_bm_t *bm, int32_t seq, nb_bm_seq_view *v) {
    if (!v || seq < 0 || seq >= bm->p.max_seqs || !bm->seqs[seq].live) return NB_ERR_NOT_FOUND;
    const seq_rec *s = &bm->seqs[seq];
    v->n_committed = s->n_committed;
    v->n_drafted = s->n_drafted;
    v->n_qblocks = s->n_q;
    v->qblocks = s->q;
    v->n_fpblocks = s->n_fp;
    v->fpblocks = s->fp;
    v->tokens = s->tokens;
    v->prequant_block = s->preq;
    return NB_OK;
}

int32_t nb_bm_view_qblocks_for_row(const nb_bm_params *p, const nb_bm_seq_view *v, int32_t pos) {
    int32_t want = nb_bm_qblocks_for_tokens(p, pos);
    if (want > v->n_qblocks && v->prequant_block >= 0) return v->n_qblocks + 1;
    return v->n_qblocks;
}

// ---------------------------------------------------------------------------
// capacity
// ---------------------------------------------------------------------------

void nb_bm_stats_get(const nb_bm_t *bm, nb_bm_stats *s) {
    memset(s, 0, sizeof(*s));
    s->n_qblocks_total = bm->p.n_qblocks;
    s->n_qblocks_free = q_available(bm) - bm->q_reserved_total;
    s->n_qblocks_cached = bm->n_q_cached;
    s->n_qblocks_reserved = bm->q_reserved_total;
    s->n_fpblocks_total = bm->p.n_fpblocks;
    s->n_fpblocks_free = bm->n_fp_free;
    s->n_seqs = bm->n_seqs;
    s->n_prefix_hits = bm->n_prefix_hits;
    s->n_evictions = bm->n_evictions;
    s->qbytes_per_token = (double)bm->p.qblock_bytes / bm->G;
    s->fpbytes_per_token = (double)bm->p.fpblock_bytes / bm->G;
}

bool nb_bm_can_admit(const nb_bm_t *bm, int32_t n_tokens, int32_t gamma) {
    if (n_tokens < 1 || gamma < 0 || gamma + 1 > bm->p.max_append) return false;
    if ((int64_t)n_tokens + gamma + 1 > bm->p.max_seq_len) return false;
    if (bm->seq_free_head < 0) return false;
    const int32_t G = bm->G;
    int32_t total = n_tokens + gamma + 1;
    int32_t q_need = nb_bm_qblocks_for_tokens(&bm->p, total);
    int32_t chunk = n_tokens < bm->p.max_append ? n_tokens : bm->p.max_append;
    int32_t step = chunk > gamma + 1 ? chunk : gamma + 1;
    int32_t fp_peak_tokens = bm->p.quantize ? 2 * G - 1 + step : total;
    if (fp_peak_tokens > total) fp_peak_tokens = total;
    int32_t fp_need = ceil_div(fp_peak_tokens, G) + 1; // +1: a copy-on-write or an unaligned start
    return q_available(bm) - bm->q_reserved_total >= q_need && bm->n_fp_free >= fp_need;
}

int32_t nb_bm_qblock_refcount(const nb_bm_t *bm, int32_t b) {
    return (b < 0 || b >= bm->p.n_qblocks) ? -1 : bm->qrec[b].ref;
}

int32_t nb_bm_fpblock_refcount(const nb_bm_t *bm, int32_t b) {
    return (b < 0 || b >= bm->p.n_fpblocks) ? -1 : bm->fprec[b].ref;
}

// ---------------------------------------------------------------------------
// consistency check
// ---------------------------------------------------------------------------

#define CHECK_OR_FAIL(cond, ...)                                                                 \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            nb_set_err(err, err_len, __VA_ARGS__);                                                  \
            st = NB_ERR_INTERNAL;                                                                \
            goto out_free_counts;                                                                \
        }                                                                                        \
    } while (0)

nb_status nb_bm_check(const nb_bm_t *bm_c, char *err, size_t err_len) {
    nb_bm_t *bm = (nb_bm_t *)bm_c; // chain_hash uses the scratch hash state
    nb_status st = NB_OK;
    const int32_t G = bm->G;
    int32_t nq = bm->p.n_qblocks, nf = bm->p.n_fpblocks;
    int32_t *qcnt = calloc((size_t)(nq ? nq : 1), sizeof(int32_t));
    int32_t *fcnt = calloc((size_t)nf, sizeof(int32_t));
    uint8_t *qmark = calloc((size_t)(nq ? nq : 1), 1);
    uint8_t *fmark = calloc((size_t)nf, 1);
    if (!qcnt || !fcnt || !qmark || !fmark) {
        nb_set_err(err, err_len, "check: out of memory");
        st = NB_ERR_OUT_OF_MEMORY;
        goto out_free_counts;
    }

    int32_t live = 0, res_sum = 0;
    for (int32_t i = 0; i < bm->p.max_seqs; i++) {
        const seq_rec *s = &bm->seqs[i];
        if (!s->live) continue;
        live++;
        int32_t fpt = seq_fp_tokens(bm, s);
        CHECK_OR_FAIL(s->n_committed >= 0 && s->n_drafted >= 0 && fpt >= 0,
                      "seq %d: counts committed %d drafted %d qblocks %d", i, s->n_committed,
                      s->n_drafted, s->n_q);
        CHECK_OR_FAIL(s->n_fp == ceil_div(fpt, G), "seq %d: %d FP blocks for %d FP tokens", i,
                      s->n_fp, fpt);
        CHECK_OR_FAIL(s->n_committed + s->n_drafted <= bm->p.max_seq_len, "seq %d: too long", i);
        int32_t res = seq_reservation_needed(bm, s);
        CHECK_OR_FAIL(s->q_reserved == res && res >= 0, "seq %d: reserved %d, expected %d", i, s->q_reserved,
                      res);
        res_sum += s->q_reserved;
        for (int32_t j = 0; j < s->n_q; j++) {
            int32_t b = s->q[j];
            CHECK_OR_FAIL(b >= 0 && b < nq, "seq %d: bad quantized block %d", i, b);
            qcnt[b]++;
            if (bm->p.prefix_cache) {
                const qblock_rec *r = &bm->qrec[b];
                XXH128_hash_t h =
                    chain_hash(bm, j ? &bm->qrec[s->q[j - 1]].hash : NULL, s->tokens + (size_t)j * G);
                CHECK_OR_FAIL(r->registered && XXH128_isEqual(r->hash, h),
                              "seq %d: quantized block %d (group %d) does not hold its tokens' hash",
                              i, b, j);
            }
        }
        if (s->preq >= 0) {
            CHECK_OR_FAIL(s->preq < nq && s->n_fp >= 1 && seq_fp_committed(bm, s) >= G,
                          "seq %d: pre-quantized block %d without a committed C_F1", i, s->preq);
            qcnt[s->preq]++;
            if (bm->p.prefix_cache) {
                XXH128_hash_t h = chain_hash(bm, s->n_q ? &bm->qrec[s->q[s->n_q - 1]].hash : NULL,
                                             s->tokens + (size_t)s->n_q * G);
                CHECK_OR_FAIL(XXH128_isEqual(bm->qrec[s->preq].hash, h),
                              "seq %d: pre-quantized block %d does not hold C_F1's tokens", i,
                              s->preq);
            }
        }
        for (int32_t k = 0; k < s->n_fp; k++) {
            int32_t b = s->fp[k];
            CHECK_OR_FAIL(b >= 0 && b < nf, "seq %d: bad FP block %d", i, b);
            fcnt[b]++;
        }
    }
    CHECK_OR_FAIL(live == bm->n_seqs, "live sequences %d, counter %d", live, bm->n_seqs);
    CHECK_OR_FAIL(res_sum == bm->q_reserved_total, "reservations %d, total %d", res_sum,
                  bm->q_reserved_total);

    int32_t n_free = 0;
    for (int32_t b = bm->q_free_head; b >= 0; b = bm->qrec[b].next) {
        CHECK_OR_FAIL(b < nq && !qmark[b], "quantized free list: bad or repeated block %d", b);
        qmark[b] = 1;
        CHECK_OR_FAIL(bm->qrec[b].ref == 0 && !bm->qrec[b].registered,
                      "quantized free block %d: ref %d registered %d", b, bm->qrec[b].ref,
                      bm->qrec[b].registered);
        n_free++;
    }
    int32_t n_cached = 0, prev = -1;
    for (int32_t b = bm->lru_head; b >= 0; prev = b, b = bm->qrec[b].next) {
        CHECK_OR_FAIL(b < nq && !qmark[b], "LRU list: bad or repeated block %d", b);
        qmark[b] = 2;
        CHECK_OR_FAIL(bm->qrec[b].ref == 0 && bm->qrec[b].registered && bm->qrec[b].prev == prev,
                      "cached block %d: ref %d registered %d", b, bm->qrec[b].ref,
                      bm->qrec[b].registered);
        n_cached++;
    }
    CHECK_OR_FAIL(prev == bm->lru_tail, "LRU tail %d, walked to %d", bm->lru_tail, prev);
    CHECK_OR_FAIL(n_free == bm->n_q_free && n_cached == bm->n_q_cached,
                  "quantized free %d/%d cached %d/%d", n_free, bm->n_q_free, n_cached,
                  bm->n_q_cached);
    int32_t n_reg = 0;
    for (int32_t b = 0; b < nq; b++) {
        const qblock_rec *r = &bm->qrec[b];
        CHECK_OR_FAIL(r->ref == qcnt[b], "quantized block %d: ref %d but %d holders", b, r->ref,
                      qcnt[b]);
        CHECK_OR_FAIL((r->ref == 0) == (qmark[b] != 0), "quantized block %d: ref %d, listed %d", b,
                      r->ref, qmark[b]);
        if (r->registered) {
            n_reg++;
            CHECK_OR_FAIL(ht_find(bm, r->hash) == b, "block %d registered but not found by hash", b);
        }
    }
    CHECK_OR_FAIL(n_reg == bm->ht_count, "registered %d, hash table holds %d", n_reg, bm->ht_count);
    CHECK_OR_FAIL(q_available(bm) >= bm->q_reserved_total, "available %d < reserved %d",
                  q_available(bm), bm->q_reserved_total);

    n_free = 0;
    for (int32_t b = bm->fp_free_head; b >= 0; b = bm->fprec[b].next) {
        CHECK_OR_FAIL(b < nf && !fmark[b], "FP free list: bad or repeated block %d", b);
        fmark[b] = 1;
        n_free++;
    }
    CHECK_OR_FAIL(n_free == bm->n_fp_free, "FP free %d, counter %d", n_free, bm->n_fp_free);
    for (int32_t b = 0; b < nf; b++) {
        CHECK_OR_FAIL(bm->fprec[b].ref == fcnt[b], "FP block %d: ref %d but %d holders", b,
                      bm->fprec[b].ref, fcnt[b]);
        CHECK_OR_FAIL((fcnt[b] == 0) == (fmark[b] != 0), "FP block %d: ref %d, free-listed %d", b,
                      fcnt[b], fmark[b]);
    }

out_free_counts:
    free(fmark);
    free(qmark);
    free(fcnt);
    free(qcnt);
    return st;
}
