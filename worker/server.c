// server.c: nibbler-worker's request loop, sequence table and command
// dispatch (see server.h for the model; docs/protocol.md for the rules).
#include "server.h"

#include "nb_status.h"
#include <errno.h>
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "engine.h"
#include "model_loader.h"
#include "nb_proto.h"

#ifndef NB_WORKER_VERSION
#define NB_WORKER_VERSION "0.0.0"
#endif

// Most decode steps run per engine call, so stop conditions are checked (and
// finished sequences dropped) at least this often.
#define DECODE_CHUNK_MAX 64
// Envelope frames kept per message (identity + REQ delimiter + a few more).
#define MAX_ENVELOPE 8

typedef Nibbler__V1__SequenceResult seq_result;

// ---------------------------------------------------------------------------
// logging
// ---------------------------------------------------------------------------

static nb_log_level g_log_level = NB_LOG_INFO;

void nb_log_set_level(nb_log_level level) { g_log_level = level; }

bool nb_log_level_parse(const char *s, nb_log_level *out) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (s && strcmp(s, names[i]) == 0) {
            *out = (nb_log_level)i;
            return true;
        }
    return false;
}

void nb_log(nb_log_level level, const char *fmt, ...) {
    if (level < g_log_level) return;
    static const char *names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    char line[1024], ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    // NOTE: one fprintf per line so lines from the ZAP thread never interleave.
    fprintf(stderr, "%s %s %s\n", ts, names[level], line);
}

// ---------------------------------------------------------------------------
// state
// ---------------------------------------------------------------------------

// Per engine slot: what the protocol adds to the engine's sequence.
typedef struct srv_seq {
    bool live;
    uint64_t id;
    uint32_t n_eos;
    uint32_t eos[NB_PROTO_MAX_EOS_IDS];
    uint32_t max_tokens;        // 0: no limit
    uint32_t n_generated;       // tokens emitted since the last Prefill
    Nibbler__V1__FinishReason finish;
    bool needs_prefill;         // no valid next token: fresh, or a failed Prefill
} srv_seq;

struct nb_server {
    nb_server_params p;
    nb_model *model;
    nb_engine *eng;
    const nb_model_config *mc;
    nb_proto_limits lim;
    int32_t max_seqs;
    int32_t max_gamma;
    int kv_dtype;

    // sequences
    srv_seq *seqs;      // [max_seqs] by engine slot
    int32_t n_live;
    uint64_t *map_keys; // [map_cap]
    int32_t *map_vals;  // [map_cap], -1 empty
    uint32_t map_mask;

    // per-request scratch, sized at start-up for max_seqs entries
    seq_result *res;               // [max_seqs]
    seq_result **res_p;            // [max_seqs]
    Nibbler__V1__Status *res_st;   // [max_seqs]
    char (*res_msg)[192];          // [max_seqs]
    int32_t *slots, *idx, *c0;     // [max_seqs] engine list: slot, request index, committed before
    int32_t *e_next, *e_ncached, *e_nout, *e_nacc, *e_lens; // [max_seqs]
    float *e_nlp;                  // [max_seqs]
    nb_status *e_st;               // [max_seqs]
    const int32_t **e_prompts;     // [max_seqs]
    int32_t *e_out;                // [max_seqs * max(max_gamma + 1, DECODE_CHUNK_MAX)]
    float *e_outlp;                // same
    int32_t *e_drafts;             // [max_seqs * max_gamma]
    bool *active;                  // [max_seqs]
    uint32_t *tok;                 // reply tokens, grown on demand
    size_t tok_cap;
    float *lp;                     // reply logprobs, grown on demand
    size_t lp_cap;
    uint8_t *out;                  // the encoded reply
    size_t out_cap;
    char msg[512];                 // the request status message

    // stats
    uint64_t n_requests, n_errors, tokens_generated, tokens_drafted, tokens_accepted;
    double busy_s;
    struct timespec t_start;
    bool draining;

    // zeromq
    void *zctx;
    void *sock;
    pthread_t zap_thread;
    bool zap_running;
    uint8_t (*allowed)[32];
    int32_t n_allowed;
    bool curve, is_tcp;
    char secret[41];       // Z85 server secret key
};

static volatile sig_atomic_t g_stop = 0;

void nb_server_request_stop(void) { g_stop = 1; }

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

nb_server_params nb_server_default_params(void) {
    return (nb_server_params){
        .model = NULL,
        .endpoint = NULL,
        .backend = "cpu",
        .group_size = 128,
        .kv_memory = 0,
        .gpu_memory_utilization = 0.0,
        .max_seqs = 16,
        .max_model_len = 0,
        .target_weights = NB_TARGET_WEIGHTS_MODEL,
        .kv_quant = true,
        .kv_dtype = -1,
        .max_gamma = 8,
        .prefill_chunk = 1024,
        .max_batch_rows = 1024,
        .prefix_cache = true,
        .seed = 0,
        .max_message_bytes = (size_t)64 << 20,
        .curve_secret_key_file = NULL,
        .curve_allowed_clients_file = NULL,
    };
}

// ---------------------------------------------------------------------------
// id -> slot map: linear probing, backward-shift deletion, never full
// (capacity >= 2 * max_seqs).
// ---------------------------------------------------------------------------

static uint32_t map_hash(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (uint32_t)x;
}

static int32_t map_get(const nb_server *s, uint64_t id) {
    for (uint32_t i = map_hash(id) & s->map_mask;; i = (i + 1) & s->map_mask) {
        if (s->map_vals[i] < 0) return -1;
        if (s->map_keys[i] == id) return s->map_vals[i];
    }
}

static void map_put(nb_server *s, uint64_t id, int32_t slot) {
    uint32_t i = map_hash(id) & s->map_mask;
    while (s->map_vals[i] >= 0) {
        NB_ASSERT(s->map_keys[i] != id);
        i = (i + 1) & s->map_mask;
    }
    s->map_keys[i] = id;
    s->map_vals[i] = slot;
}

static void map_del(nb_server *s, uint64_t id) {
    uint32_t i = map_hash(id) & s->map_mask;
    while (s->map_vals[i] >= 0 && s->map_keys[i] != id) i = (i + 1) & s->map_mask;
    NB_ASSERT(s->map_vals[i] >= 0);
    for (uint32_t j = i;;) {
        j = (j + 1) & s->map_mask;
        if (s->map_vals[j] < 0) break;
        uint32_t k = map_hash(s->map_keys[j]) & s->map_mask;
        // Move j into the hole at i unless its home k lies cyclically in (i, j].
        bool home_between = i <= j ? (k > i && k <= j) : (k > i || k <= j);
        if (!home_between) {
            s->map_keys[i] = s->map_keys[j];
            s->map_vals[i] = s->map_vals[j];
            i = j;
        }
    }
    s->map_vals[i] = -1;
}

// ---------------------------------------------------------------------------
// reply building
// ---------------------------------------------------------------------------

typedef struct srv_reply {
    Nibbler__V1__Response r;
    Nibbler__V1__Status st;
    Nibbler__V1__BatchResult batch;
} srv_reply;

static void reply_status(nb_server *s, srv_reply *rp, nb_proto_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->msg, sizeof(s->msg), fmt, ap);
    va_end(ap);
    nb_proto_status_set(&rp->st, code, s->msg);
}

// Starts result i of the batch for sequence seq_id, status OK.
static seq_result *res_begin(nb_server *s, srv_reply *rp, size_t i, uint64_t seq_id) {
    seq_result *r = &s->res[i];
    nibbler__v1__sequence_result__init(r);
    nibbler__v1__status__init(&s->res_st[i]);
    s->res_msg[i][0] = '\0';
    r->status = &s->res_st[i];
    r->seq_id = seq_id;
    s->res_p[i] = r;
    rp->batch.n_seqs = i + 1;
    rp->batch.seqs = s->res_p;
    return r;
}

static void res_fail(nb_server *s, size_t i, nb_proto_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->res_msg[i], sizeof(s->res_msg[i]), fmt, ap);
    va_end(ap);
    nb_proto_status_set(&s->res_st[i], code, s->res_msg[i]);
}

// A per-sequence engine failure with the reason a scheduler needs.
static void res_fail_engine(nb_server *s, size_t i, uint64_t id, nb_status st, const char *cmd) {
    const char *why = nb_status_str(st);
    switch (st) {
    case NB_ERR_NO_FREE_BLOCKS: why = "no free KV blocks: free or roll back other sequences, or retry later"; break;
    case NB_ERR_CONTEXT_TOO_LONG: why = "the sequence would exceed max_context"; break;
    case NB_ERR_STATE: why = "not valid in the sequence's state (pending drafts, no drafts to verify, or no prefill yet)"; break;
    case NB_ERR_TOO_MANY_SEQS: why = "the sequence table is full (max_seqs)"; break;
    case NB_ERR_NON_FINITE: why = "the model produced a non-finite value"; break;
    default: break;
    }
    res_fail(s, i, nb_proto_code_from_status(st), "%s: sequence %llu: %s", cmd,
             (unsigned long long)id, why);
}

static bool grow_u32(uint32_t **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap : 1024;
    while (nc < need) nc *= 2;
    uint32_t *nb = realloc(*buf, nc * sizeof(uint32_t));
    if (!nb) return false;
    *buf = nb;
    *cap = nc;
    return true;
}

static bool grow_f32(float **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap : 1024;
    while (nc < need) nc *= 2;
    float *nb = realloc(*buf, nc * sizeof(float));
    if (!nb) return false;
    *buf = nb;
    *cap = nc;
    return true;
}

// ---------------------------------------------------------------------------
// sequences
// ---------------------------------------------------------------------------

static int32_t seq_committed(const nb_server *s, int32_t slot) {
    nb_engine_seq_info info;
    NB_ASSERT(nb_engine_seq_info_get(s->eng, slot, &info) == NB_OK);
    return info.n_committed;
}

static void seq_set_stop(srv_seq *q, const Nibbler__V1__StopConditions *sc) {
    q->n_eos = 0;
    q->max_tokens = 0;
    if (!sc) return;
    q->n_eos = (uint32_t)sc->n_eos_ids; // validated <= NB_PROTO_MAX_EOS_IDS
    if (q->n_eos) memcpy(q->eos, sc->eos_ids, q->n_eos * sizeof(uint32_t));
    q->max_tokens = sc->max_tokens;
}

static nb_sampling_params sampling_from(const Nibbler__V1__SamplingParams *sp) {
    nb_sampling_params o = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    if (sp) {
        o.temperature = sp->temperature;
        o.top_k = (int32_t)sp->top_k; // validated <= vocab_size
        o.top_p = sp->top_p;
        o.seed = sp->seed;
    }
    return o;
}

// Applies the stop conditions to n freshly emitted tokens; returns how many
// the client gets (the rest are dropped).
static int32_t seq_apply_stop(srv_seq *q, const int32_t *tokens, int32_t n) {
    for (int32_t j = 0; j < n; j++) {
        q->n_generated++;
        for (uint32_t e = 0; e < q->n_eos; e++)
            if ((uint32_t)tokens[j] == q->eos[e]) {
                q->finish = NIBBLER__V1__FINISH_REASON__EOS;
                return j + 1;
            }
        if (q->max_tokens && q->n_generated >= q->max_tokens) {
            q->finish = NIBBLER__V1__FINISH_REASON__MAX_TOKENS;
            return j + 1;
        }
    }
    return n;
}

// Emitted tokens out[0..n) of a sequence that had c0 committed tokens sit at
// positions c0+1+j. Keeping `keep` of them makes out[keep-1] the next token:
// roll the cache back to c0 + keep so the state is as if generation had
// stopped there.
static void seq_trim(nb_server *s, int32_t slot, int32_t c0, int32_t keep, int32_t n) {
    if (keep >= n) return;
    nb_status st = nb_engine_rollback(s->eng, slot, c0 + keep);
    if (st != NB_OK)
        nb_log(NB_LOG_WARN, "sequence %llu: could not drop %d tokens after its stop: %s",
               (unsigned long long)s->seqs[slot].id, n - keep, nb_status_str(st));
}

// Sets res i for a generation command's gate; returns the slot or -1.
static int32_t gate_generate(nb_server *s, size_t i, uint64_t id, const char *cmd) {
    int32_t slot = map_get(s, id);
    if (slot < 0) {
        res_fail(s, i, NIBBLER__V1__CODE__NOT_FOUND, "%s: sequence %llu not found", cmd,
                 (unsigned long long)id);
        return -1;
    }
    const srv_seq *q = &s->seqs[slot];
    if (q->finish != NIBBLER__V1__FINISH_REASON__NOT_FINISHED) {
        s->res[i].finish_reason = q->finish;
        res_fail(s, i, NIBBLER__V1__CODE__FINISHED,
                 "%s: sequence %llu finished (%s); roll back or free it", cmd,
                 (unsigned long long)id,
                 q->finish == NIBBLER__V1__FINISH_REASON__EOS ? "eos" : "max_tokens");
        return -1;
    }
    if (q->needs_prefill) {
        res_fail(s, i, NIBBLER__V1__CODE__BAD_STATE, "%s: sequence %llu has no next token: prefill it first",
                 cmd, (unsigned long long)id);
        return -1;
    }
    return slot;
}

// ---------------------------------------------------------------------------
// commands
// ---------------------------------------------------------------------------

static void cmd_add(nb_server *s, const Nibbler__V1__AddSequence *c, srv_reply *rp) {
    for (size_t i = 0; i < c->n_seqs; i++) {
        const Nibbler__V1__SequenceSpec *sp = c->seqs[i];
        res_begin(s, rp, i, sp->seq_id);
        if (map_get(s, sp->seq_id) >= 0) {
            res_fail(s, i, NIBBLER__V1__CODE__ALREADY_EXISTS, "add_sequence: sequence %llu already exists",
                     (unsigned long long)sp->seq_id);
            continue;
        }
        nb_sampling_params smp = sampling_from(sp->sampling);
        int32_t slot = -1;
        nb_status st = nb_engine_seq_add(s->eng, &smp, &slot);
        if (st != NB_OK) {
            res_fail_engine(s, i, sp->seq_id, st, "add_sequence");
            continue;
        }
        srv_seq *q = &s->seqs[slot];
        memset(q, 0, sizeof(*q));
        q->live = true;
        q->id = sp->seq_id;
        q->needs_prefill = true;
        seq_set_stop(q, sp->stop);
        map_put(s, sp->seq_id, slot);
        s->n_live++;
    }
}

static void cmd_prefill(nb_server *s, const Nibbler__V1__Prefill *c, srv_reply *rp) {
    int32_t n = 0;
    for (size_t i = 0; i < c->n_items; i++) {
        const Nibbler__V1__PrefillItem *it = c->items[i];
        res_begin(s, rp, i, it->seq_id);
        int32_t slot = map_get(s, it->seq_id);
        if (slot < 0) {
            res_fail(s, i, NIBBLER__V1__CODE__NOT_FOUND, "prefill: sequence %llu not found",
                     (unsigned long long)it->seq_id);
            continue;
        }
        s->slots[n] = slot;
        s->idx[n] = (int32_t)i;
        s->c0[n] = seq_committed(s, slot);
        // NOTE: validated < vocab_size <= INT32_MAX, so the uint32 ids read as int32.
        s->e_prompts[n] = (const int32_t *)it->tokens;
        s->e_lens[n] = (int32_t)it->n_tokens;
        n++;
    }
    if (n == 0) return;
    nb_status rs = nb_engine_prefill(s->eng, n, s->slots, s->e_prompts, s->e_lens, s->e_next,
                                     c->return_logprobs ? s->e_nlp : NULL, s->e_ncached, s->e_st);
    if (rs != NB_OK) {
        reply_status(s, rp, nb_proto_code_from_status(rs), "prefill failed: %s", nb_status_str(rs));
        return;
    }
    if (!grow_u32(&s->tok, &s->tok_cap, (size_t)n) ||
        (c->return_logprobs && !grow_f32(&s->lp, &s->lp_cap, (size_t)n))) {
        reply_status(s, rp, NIBBLER__V1__CODE__INTERNAL, "prefill: out of host memory for the reply");
        return;
    }
    for (int32_t k = 0; k < n; k++) {
        int32_t i = s->idx[k], slot = s->slots[k];
        srv_seq *q = &s->seqs[slot];
        seq_result *r = &s->res[i];
        if (s->e_st[k] != NB_OK) {
            res_fail_engine(s, (size_t)i, q->id, s->e_st[k], "prefill");
            // NOTE: keep the cache as it was: a partly prefilled prompt is rolled back.
            if (seq_committed(s, slot) != s->c0[k]) {
                nb_status st = nb_engine_rollback(s->eng, slot, s->c0[k]);
                if (st != NB_OK)
                    nb_log(NB_LOG_WARN, "prefill: sequence %llu: rollback to %d failed: %s",
                           (unsigned long long)q->id, s->c0[k], nb_status_str(st));
                q->needs_prefill = true;
            }
            r->n_context = (uint32_t)seq_committed(s, slot);
            continue;
        }
        q->needs_prefill = false;
        q->finish = NIBBLER__V1__FINISH_REASON__NOT_FINISHED;
        q->n_generated = 0;
        seq_apply_stop(q, &s->e_next[k], 1);
        s->tok[k] = (uint32_t)s->e_next[k];
        r->tokens = &s->tok[k];
        r->n_tokens = 1;
        if (c->return_logprobs) {
            s->lp[k] = s->e_nlp[k];
            r->logprobs = &s->lp[k];
            r->n_logprobs = 1;
        }
        r->n_cached = (uint32_t)s->e_ncached[k];
        r->n_context = (uint32_t)seq_committed(s, slot);
        r->finish_reason = q->finish;
        s->tokens_generated++;
    }
}

// Gates ids for a generation command into the engine list; returns its size.
static int32_t gather_generate(nb_server *s, srv_reply *rp, const uint64_t *ids, size_t n_ids,
                               const char *cmd) {
    int32_t n = 0;
    for (size_t i = 0; i < n_ids; i++) {
        res_begin(s, rp, i, ids[i]);
        int32_t slot = gate_generate(s, i, ids[i], cmd);
        if (slot < 0) continue;
        s->slots[n] = slot;
        s->idx[n] = (int32_t)i;
        s->c0[n] = seq_committed(s, slot);
        n++;
    }
    return n;
}

// Drops entries of the engine list whose status is not OK (after reporting it).
static int32_t compact_failed(nb_server *s, int32_t n, const char *cmd) {
    int32_t m = 0;
    for (int32_t k = 0; k < n; k++) {
        if (s->e_st[k] != NB_OK) {
            res_fail_engine(s, (size_t)s->idx[k], s->seqs[s->slots[k]].id, s->e_st[k], cmd);
            s->res[s->idx[k]].n_context = (uint32_t)seq_committed(s, s->slots[k]);
            continue;
        }
        s->slots[m] = s->slots[k];
        s->idx[m] = s->idx[k];
        s->c0[m] = s->c0[k];
        m++;
    }
    return m;
}

static void cmd_draft(nb_server *s, const Nibbler__V1__Draft *c, srv_reply *rp) {
    int32_t n = gather_generate(s, rp, c->seq_ids, c->n_seq_ids, "draft");
    if (n == 0) return;
    int32_t gamma = (int32_t)c->gamma;
    nb_status rs = nb_engine_draft(s->eng, n, s->slots, gamma, s->e_drafts, s->e_st);
    if (rs != NB_OK) {
        reply_status(s, rp, nb_proto_code_from_status(rs), "draft failed: %s", nb_status_str(rs));
        return;
    }
    if (!grow_u32(&s->tok, &s->tok_cap, (size_t)n * gamma)) {
        reply_status(s, rp, NIBBLER__V1__CODE__INTERNAL, "draft: out of host memory for the reply");
        return;
    }
    for (int32_t k = 0; k < n; k++) {
        seq_result *r = &s->res[s->idx[k]];
        r->n_context = (uint32_t)seq_committed(s, s->slots[k]);
        if (s->e_st[k] != NB_OK) {
            res_fail_engine(s, (size_t)s->idx[k], s->seqs[s->slots[k]].id, s->e_st[k], "draft");
            continue;
        }
        uint32_t *t = s->tok + (size_t)k * gamma;
        for (int32_t j = 0; j < gamma; j++) t[j] = (uint32_t)s->e_drafts[k * gamma + j];
        r->tokens = t;
        r->n_tokens = (size_t)gamma;
        r->n_drafted = (uint32_t)gamma;
        s->tokens_drafted += (uint64_t)gamma;
    }
}

// Verifies the engine list (every entry has drafts or fails with BAD_STATE).
// n_drafted[k] is the drafts each had.
static void run_verify(nb_server *s, int32_t n, bool logprobs, srv_reply *rp, const char *cmd) {
    nb_engine_seq_info info;
    int32_t pend[n > 0 ? n : 1];
    for (int32_t k = 0; k < n; k++) {
        NB_ASSERT(nb_engine_seq_info_get(s->eng, s->slots[k], &info) == NB_OK);
        pend[k] = info.n_drafted; // DRAFT(gamma) leaves gamma pending tokens
    }
    nb_status rs = nb_engine_verify(s->eng, n, s->slots, s->e_out, logprobs ? s->e_outlp : NULL,
                                    s->e_nout, s->e_nacc, s->e_st);
    if (rs != NB_OK) {
        reply_status(s, rp, nb_proto_code_from_status(rs), "%s failed: %s", cmd, nb_status_str(rs));
        return;
    }
    const int32_t stride = s->max_gamma + 1;
    if (!grow_u32(&s->tok, &s->tok_cap, (size_t)n * stride) ||
        (logprobs && !grow_f32(&s->lp, &s->lp_cap, (size_t)n * stride))) {
        reply_status(s, rp, NIBBLER__V1__CODE__INTERNAL, "%s: out of host memory for the reply", cmd);
        return;
    }
    for (int32_t k = 0; k < n; k++) {
        int32_t slot = s->slots[k];
        srv_seq *q = &s->seqs[slot];
        seq_result *r = &s->res[s->idx[k]];
        if (s->e_st[k] != NB_OK) {
            if (s->e_st[k] == NB_ERR_STATE)
                res_fail(s, (size_t)s->idx[k], NIBBLER__V1__CODE__BAD_STATE,
                         "%s: sequence %llu has no drafts to verify (send draft first)", cmd,
                         (unsigned long long)q->id);
            else
                res_fail_engine(s, (size_t)s->idx[k], q->id, s->e_st[k], cmd);
            r->n_context = (uint32_t)seq_committed(s, slot);
            continue;
        }
        const int32_t *out = s->e_out + (size_t)k * stride;
        int32_t keep = seq_apply_stop(q, out, s->e_nout[k]);
        seq_trim(s, slot, s->c0[k], keep, s->e_nout[k]);
        uint32_t *t = s->tok + (size_t)k * stride;
        for (int32_t j = 0; j < keep; j++) t[j] = (uint32_t)out[j];
        r->tokens = t;
        r->n_tokens = (size_t)keep;
        if (logprobs) {
            float *l = s->lp + (size_t)k * stride;
            memcpy(l, s->e_outlp + (size_t)k * stride, (size_t)keep * sizeof(float));
            r->logprobs = l;
            r->n_logprobs = (size_t)keep;
        }
        r->n_drafted = (uint32_t)pend[k];
        r->n_accepted = (uint32_t)s->e_nacc[k];
        r->n_context = (uint32_t)seq_committed(s, slot);
        r->finish_reason = q->finish;
        s->tokens_accepted += (uint64_t)s->e_nacc[k];
        s->tokens_generated += (uint64_t)keep;
    }
}

static void cmd_verify(nb_server *s, const Nibbler__V1__Verify *c, srv_reply *rp) {
    int32_t n = gather_generate(s, rp, c->seq_ids, c->n_seq_ids, "verify");
    if (n > 0) run_verify(s, n, c->return_logprobs, rp, "verify");
}

static void cmd_speculate(nb_server *s, const Nibbler__V1__Speculate *c, srv_reply *rp) {
    int32_t n = gather_generate(s, rp, c->seq_ids, c->n_seq_ids, "speculate");
    if (n == 0) return;
    nb_status rs = nb_engine_draft(s->eng, n, s->slots, (int32_t)c->gamma, s->e_drafts, s->e_st);
    if (rs != NB_OK) {
        reply_status(s, rp, nb_proto_code_from_status(rs), "speculate: draft failed: %s",
                     nb_status_str(rs));
        return;
    }
    for (int32_t k = 0; k < n; k++)
        if (s->e_st[k] == NB_OK) s->tokens_drafted += c->gamma;
    n = compact_failed(s, n, "speculate");
    if (n > 0) run_verify(s, n, c->return_logprobs, rp, "speculate");
}

static void cmd_decode(nb_server *s, const Nibbler__V1__Decode *c, srv_reply *rp) {
    int32_t n = gather_generate(s, rp, c->seq_ids, c->n_seq_ids, "decode");
    if (n == 0) return;
    const int32_t steps = (int32_t)c->n;
    const bool want_lp = c->return_logprobs;
    if (!grow_u32(&s->tok, &s->tok_cap, (size_t)n * steps) ||
        (want_lp && !grow_f32(&s->lp, &s->lp_cap, (size_t)n * steps))) {
        reply_status(s, rp, NIBBLER__V1__CODE__INTERNAL, "decode: out of host memory for a reply of %d x %d tokens",
                     n, steps);
        return;
    }
    // The engine list shrinks as sequences stop; keep each one's reply slot.
    int32_t base[n], done[n], ridx[n];
    for (int32_t k = 0; k < n; k++) {
        base[k] = k * steps;
        done[k] = 0;
        ridx[k] = s->idx[k];
        seq_result *r = &s->res[s->idx[k]];
        r->tokens = s->tok + base[k];
        if (want_lp) r->logprobs = s->lp + base[k];
    }
    // act[] lists positions into base/done/ridx of the sequences still running.
    int32_t act[n], n_act = n;
    int32_t slot_of[n];
    for (int32_t k = 0; k < n; k++) {
        act[k] = k;
        slot_of[k] = s->slots[k];
    }
    int32_t left = steps;
    while (left > 0 && n_act > 0) {
        int32_t chunk = left < DECODE_CHUNK_MAX ? left : DECODE_CHUNK_MAX;
        for (int32_t a = 0; a < n_act; a++) {
            const srv_seq *q = &s->seqs[slot_of[act[a]]];
            if (q->n_eos > 0 && chunk > 16) chunk = 16;
            if (q->max_tokens && (int64_t)q->max_tokens - q->n_generated < chunk)
                chunk = (int32_t)(q->max_tokens - q->n_generated);
        }
        if (chunk < 1) chunk = 1;
        for (int32_t a = 0; a < n_act; a++) {
            s->slots[a] = slot_of[act[a]];
            s->c0[a] = seq_committed(s, s->slots[a]);
        }
        nb_status rs = nb_engine_decode(s->eng, n_act, s->slots, chunk, s->e_out,
                                        want_lp ? s->e_outlp : NULL, s->e_nout, s->e_st);
        if (rs != NB_OK) {
            reply_status(s, rp, nb_proto_code_from_status(rs), "decode failed: %s", nb_status_str(rs));
            return;
        }
        int32_t m = 0;
        for (int32_t a = 0; a < n_act; a++) {
            int32_t k = act[a], slot = s->slots[a];
            srv_seq *q = &s->seqs[slot];
            const int32_t *out = s->e_out + (size_t)a * chunk;
            int32_t keep = seq_apply_stop(q, out, s->e_nout[a]);
            seq_trim(s, slot, s->c0[a], keep, s->e_nout[a]);
            for (int32_t j = 0; j < keep; j++) s->tok[base[k] + done[k] + j] = (uint32_t)out[j];
            if (want_lp)
                memcpy(s->lp + base[k] + done[k], s->e_outlp + (size_t)a * chunk,
                       (size_t)keep * sizeof(float));
            done[k] += keep;
            s->tokens_generated += (uint64_t)keep;
            if (s->e_st[a] != NB_OK) {
                res_fail_engine(s, (size_t)ridx[k], q->id, s->e_st[a], "decode");
                continue;
            }
            if (q->finish != NIBBLER__V1__FINISH_REASON__NOT_FINISHED) continue;
            act[m++] = k;
        }
        n_act = m;
        left -= chunk;
    }
    for (int32_t k = 0; k < n; k++) {
        seq_result *r = &s->res[ridx[k]];
        const srv_seq *q = &s->seqs[slot_of[k]];
        r->n_tokens = (size_t)done[k];
        if (want_lp) r->n_logprobs = (size_t)done[k];
        if (done[k] == 0) {
            r->tokens = NULL;
            r->logprobs = NULL;
        }
        r->n_context = (uint32_t)seq_committed(s, slot_of[k]);
        r->finish_reason = q->finish;
    }
}

static void cmd_rollback(nb_server *s, const Nibbler__V1__Rollback *c, srv_reply *rp) {
    for (size_t i = 0; i < c->n_items; i++) {
        const Nibbler__V1__RollbackItem *it = c->items[i];
        seq_result *r = res_begin(s, rp, i, it->seq_id);
        int32_t slot = map_get(s, it->seq_id);
        if (slot < 0) {
            res_fail(s, i, NIBBLER__V1__CODE__NOT_FOUND, "rollback: sequence %llu not found",
                     (unsigned long long)it->seq_id);
            continue;
        }
        srv_seq *q = &s->seqs[slot];
        int32_t c0 = seq_committed(s, slot), n = (int32_t)it->n_tokens;
        if (n > c0) {
            res_fail(s, i, NIBBLER__V1__CODE__INVALID_ARGUMENT,
                     "rollback: sequence %llu: n_tokens %d exceeds its %d committed tokens",
                     (unsigned long long)it->seq_id, n, c0);
            r->n_context = (uint32_t)c0;
            continue;
        }
        nb_status st = nb_engine_rollback(s->eng, slot, n);
        if (st != NB_OK) {
            res_fail_engine(s, i, it->seq_id, st, "rollback");
        } else {
            uint32_t dropped = (uint32_t)(c0 - n);
            q->n_generated = q->n_generated > dropped ? q->n_generated - dropped : 0;
            q->finish = NIBBLER__V1__FINISH_REASON__NOT_FINISHED;
            // Rolling back into the cache makes tokens[n] the next token again;
            // to the same length keeps whatever next token there was.
            if (n < c0) q->needs_prefill = false;
            if (n == 0) q->needs_prefill = true;
        }
        r->n_context = (uint32_t)seq_committed(s, slot);
    }
}

static void cmd_free(nb_server *s, const Nibbler__V1__Free *c, srv_reply *rp) {
    for (size_t i = 0; i < c->n_seq_ids; i++) {
        uint64_t id = c->seq_ids[i];
        res_begin(s, rp, i, id);
        int32_t slot = map_get(s, id);
        if (slot < 0) {
            res_fail(s, i, NIBBLER__V1__CODE__NOT_FOUND, "free: sequence %llu not found",
                     (unsigned long long)id);
            continue;
        }
        NB_ASSERT(nb_engine_seq_free(s->eng, slot) == NB_OK);
        map_del(s, id);
        s->seqs[slot].live = false;
        s->n_live--;
    }
}

static void cmd_fork(nb_server *s, const Nibbler__V1__Fork *c, srv_reply *rp) {
    seq_result *r = res_begin(s, rp, 0, c->child_id);
    int32_t parent = map_get(s, c->parent_id);
    if (parent < 0) {
        res_fail(s, 0, NIBBLER__V1__CODE__NOT_FOUND, "fork: parent sequence %llu not found",
                 (unsigned long long)c->parent_id);
        return;
    }
    if (map_get(s, c->child_id) >= 0) {
        res_fail(s, 0, NIBBLER__V1__CODE__ALREADY_EXISTS, "fork: sequence %llu already exists",
                 (unsigned long long)c->child_id);
        return;
    }
    nb_sampling_params smp = sampling_from(c->sampling);
    int32_t child = -1;
    nb_status st = nb_engine_seq_fork(s->eng, parent, c->sampling ? &smp : NULL, &child);
    if (st != NB_OK) {
        if (st == NB_ERR_STATE)
            res_fail(s, 0, NIBBLER__V1__CODE__BAD_STATE,
                     "fork: parent sequence %llu has unverified drafts (verify or roll back first)",
                     (unsigned long long)c->parent_id);
        else
            res_fail_engine(s, 0, c->child_id, st, "fork");
        return;
    }
    srv_seq *q = &s->seqs[child];
    *q = s->seqs[parent];
    q->id = c->child_id;
    if (c->stop) seq_set_stop(q, c->stop);
    map_put(s, c->child_id, child);
    s->n_live++;
    r->n_context = (uint32_t)seq_committed(s, child);
    r->finish_reason = q->finish;
}

// ---------------------------------------------------------------------------
// Hello, Stats, Health
// ---------------------------------------------------------------------------

static void cache_info(const nb_server *s, Nibbler__V1__CacheInfo *ci) {
    nb_bm_stats bs;
    nb_bm_stats_get(nb_engine_block_manager(s->eng), &bs);
    const nb_engine_params *ep = nb_engine_params_get(s->eng);
    ci->quantized = ep->quantized_cache;
    ci->group_size = (uint32_t)ep->group_size;
    ci->qblocks_total = (uint32_t)bs.n_qblocks_total;
    ci->qblocks_free = (uint32_t)(bs.n_qblocks_free > 0 ? bs.n_qblocks_free : 0);
    ci->fpblocks_total = (uint32_t)bs.n_fpblocks_total;
    ci->fpblocks_free = (uint32_t)bs.n_fpblocks_free;
    ci->qbytes_per_token = bs.qbytes_per_token;
    ci->fpbytes_per_token = bs.fpbytes_per_token;
    ci->kv_dtype = (char *)(ep->quantized_cache ? "int8x2+int4" : nb_dtype_name((nb_dtype)s->kv_dtype));
}

static void cmd_hello(nb_server *s, srv_reply *rp) {
    static Nibbler__V1__HelloResult h;
    static Nibbler__V1__ModelInfo mi;
    static Nibbler__V1__CacheInfo ci;
    static Nibbler__V1__Limits li;
    static uint32_t eos[NB_MAX_EOS_IDS];
    static char *caps[8];
    nibbler__v1__hello_result__init(&h);
    nibbler__v1__model_info__init(&mi);
    nibbler__v1__cache_info__init(&ci);
    nibbler__v1__limits__init(&li);
    const nb_model_config *mc = s->mc;
    const nb_engine_params *ep = nb_engine_params_get(s->eng);
    mi.name = (char *)nb_model_get_dir(s->model);
    mi.architecture = (char *)nb_arch_name(mc->arch);
    mi.synthetic = nb_model_is_synthetic(s->model);
    mi.vocab_size = (uint32_t)mc->vocab_size;
    mi.n_layers = (uint32_t)mc->n_layers;
    mi.n_heads = (uint32_t)mc->n_heads;
    mi.n_kv_heads = (uint32_t)mc->n_kv_heads;
    mi.head_dim = (uint32_t)mc->head_dim;
    mi.hidden_size = (uint32_t)mc->hidden_size;
    mi.max_context = (uint32_t)ep->max_seq_len;
    for (int i = 0; i < mc->n_eos_token_ids; i++) eos[i] = (uint32_t)mc->eos_token_ids[i];
    mi.n_eos_ids = (size_t)mc->n_eos_token_ids;
    mi.eos_ids = eos;
    mi.bos_id = mc->bos_token_id >= 0 ? (uint32_t)mc->bos_token_id : 0;
    mi.weights_dtype = (char *)nb_dtype_name(
        mc->has_torch_dtype ? mc->torch_dtype : nb_model_get_weights(s->model)->tok_embd.dtype);
    mi.target_weights = (char *)(ep->target_weights == NB_TARGET_WEIGHTS_INT8 ? "int8" : "model");
    cache_info(s, &ci);
    li.max_seqs = (uint32_t)s->max_seqs;
    li.max_gamma = s->lim.max_gamma;
    li.max_batch = s->lim.max_batch;
    li.max_message_bytes = s->lim.max_message_bytes;
    li.prefill_chunk = (uint32_t)ep->prefill_chunk;
    size_t nc = 0;
    caps[nc++] = "speculate";
    caps[nc++] = "rollback";
    caps[nc++] = "fork";
    caps[nc++] = "logprobs";
    caps[nc++] = "sampling";
    caps[nc++] = "stop_conditions";
    if (ep->prefix_cache && ep->quantized_cache) caps[nc++] = "prefix_cache";
    h.protocol_version = NB_PROTO_VERSION;
    h.worker_version = NB_WORKER_VERSION;
    h.backend = (char *)ep->backend;
    h.model = &mi;
    h.cache = &ci;
    h.limits = &li;
    h.n_capabilities = nc;
    h.capabilities = caps;
    rp->r.result_case = NIBBLER__V1__RESPONSE__RESULT_HELLO;
    rp->r.hello = &h;
}

static void jemalloc_stats(uint64_t *allocated, uint64_t *resident) {
    uint64_t epoch = 1;
    size_t sz = sizeof(epoch);
    *allocated = *resident = 0;
    // NOTE: jemalloc caches its statistics; bumping "epoch" refreshes them.
    mallctl("epoch", &epoch, &sz, &epoch, sz);
    size_t v = 0;
    sz = sizeof(v);
    if (mallctl("stats.allocated", &v, &sz, NULL, 0) == 0) *allocated = v;
    sz = sizeof(v);
    if (mallctl("stats.resident", &v, &sz, NULL, 0) == 0) *resident = v;
}

static void cmd_stats(nb_server *s, srv_reply *rp) {
    static Nibbler__V1__StatsResult r;
    static Nibbler__V1__CacheInfo ci;
    nibbler__v1__stats_result__init(&r);
    nibbler__v1__cache_info__init(&ci);
    cache_info(s, &ci);
    nb_bm_stats bs;
    nb_bm_stats_get(nb_engine_block_manager(s->eng), &bs);
    r.cache = &ci;
    r.n_seqs = (uint32_t)s->n_live;
    r.n_requests = s->n_requests;
    r.n_errors = s->n_errors;
    r.tokens_generated = s->tokens_generated;
    r.tokens_drafted = s->tokens_drafted;
    r.tokens_accepted = s->tokens_accepted;
    r.acceptance_rate = s->tokens_drafted ? (double)s->tokens_accepted / (double)s->tokens_drafted : 0.0;
    r.tokens_per_s = s->busy_s > 0.0 ? (double)s->tokens_generated / s->busy_s : 0.0;
    r.prefix_hits = (uint64_t)bs.n_prefix_hits;
    jemalloc_stats(&r.jemalloc_allocated, &r.jemalloc_resident);
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    r.uptime_s = (double)(t.tv_sec - s->t_start.tv_sec) + 1e-9 * (double)(t.tv_nsec - s->t_start.tv_nsec);
    rp->r.result_case = NIBBLER__V1__RESPONSE__RESULT_STATS;
    rp->r.stats = &r;
}

static void cmd_health(nb_server *s, srv_reply *rp) {
    static Nibbler__V1__HealthResult h;
    nibbler__v1__health_result__init(&h);
    h.serving = !s->draining;
    h.draining = s->draining;
    rp->r.result_case = NIBBLER__V1__RESPONSE__RESULT_HEALTH;
    rp->r.health = &h;
}

// ---------------------------------------------------------------------------
// dispatch
// ---------------------------------------------------------------------------

bool nb_server_handle(nb_server *s, const uint8_t *req, size_t len, const uint8_t **resp,
                      size_t *resp_len) {
    double t0 = now_s();
    srv_reply rp;
    nibbler__v1__response__init(&rp.r);
    nibbler__v1__status__init(&rp.st);
    nibbler__v1__batch_result__init(&rp.batch);
    rp.r.status = &rp.st;
    s->msg[0] = '\0';
    bool quit = false, is_batch = false;
    Nibbler__V1__Request *r = NULL;
    s->n_requests++;

    nb_proto_code code = nb_proto_request_decode(req, len, s->lim.max_message_bytes, &r, s->msg,
                                                 sizeof(s->msg));
    if (code != NIBBLER__V1__CODE__OK) {
        nb_proto_peek_request_id(req, len, &rp.r.id);
        nb_proto_status_set(&rp.st, code, s->msg);
        goto out_reply;
    }
    rp.r.id = r->id;
    code = nb_proto_validate_request(r, &s->lim, s->msg, sizeof(s->msg));
    if (code != NIBBLER__V1__CODE__OK) {
        nb_proto_status_set(&rp.st, code, s->msg);
        goto out_reply;
    }
    nb_proto_status_set(&rp.st, NIBBLER__V1__CODE__OK, NULL);
    bool new_work = r->command_case == NIBBLER__V1__REQUEST__COMMAND_ADD_SEQUENCE ||
                    r->command_case == NIBBLER__V1__REQUEST__COMMAND_FORK ||
                    r->command_case == NIBBLER__V1__REQUEST__COMMAND_PREFILL;
    if (s->draining && new_work) {
        reply_status(s, &rp, NIBBLER__V1__CODE__DRAINING,
                     "%s: the worker is draining and accepts no new work",
                     nb_proto_command_name(r->command_case));
        goto out_reply;
    }
    switch (r->command_case) {
    case NIBBLER__V1__REQUEST__COMMAND_HELLO: cmd_hello(s, &rp); break;
    case NIBBLER__V1__REQUEST__COMMAND_ADD_SEQUENCE: cmd_add(s, r->add_sequence, &rp); is_batch = true; break;
    case NIBBLER__V1__REQUEST__COMMAND_PREFILL: cmd_prefill(s, r->prefill, &rp); is_batch = true; break;
    case NIBBLER__V1__REQUEST__COMMAND_DRAFT: cmd_draft(s, r->draft, &rp); is_batch = true; break;
    case NIBBLER__V1__REQUEST__COMMAND_VERIFY: cmd_verify(s, r->verify, &rp); is_batch = true; break;
    case NIBBLER__V1__REQUEST__COMMAND_SPECULATE: cmd_speculate(s, r->speculate, &rp); is_batch = true; break;
    case NIBBLER__V1__REQUEST__COMMAND_DECODE: cmd_decode(s, r->decode, &rp); is_batch = true; break;
    case NIBBLER__V1__REQUEST__COMMAND_ROLLBACK: cmd_rollback(s, r->rollback, &rp); is_batch = true; break;
    case NIBBLER__V1__REQUEST__COMMAND_FREE: cmd_free(s, r->free, &rp); is_batch = true; break;
    case NIBBLER__V1__REQUEST__COMMAND_FORK: cmd_fork(s, r->fork, &rp); is_batch = true; break;
    case NIBBLER__V1__REQUEST__COMMAND_STATS: cmd_stats(s, &rp); break;
    case NIBBLER__V1__REQUEST__COMMAND_HEALTH: cmd_health(s, &rp); break;
    case NIBBLER__V1__REQUEST__COMMAND_DRAIN:
        if (!s->draining) nb_log(NB_LOG_INFO, "draining: %d sequences live; new work is refused", s->n_live);
        s->draining = true;
        cmd_health(s, &rp);
        break;
    case NIBBLER__V1__REQUEST__COMMAND_SHUTDOWN:
        nb_log(NB_LOG_INFO, "shutdown requested (%d sequences dropped)", s->n_live);
        quit = true;
        break;
    default: NB_ASSERT(!"validated command");
    }
    if (is_batch && rp.st.code == NIBBLER__V1__CODE__OK) {
        rp.r.result_case = NIBBLER__V1__RESPONSE__RESULT_BATCH;
        rp.r.batch = &rp.batch;
        for (size_t i = 0; i < rp.batch.n_seqs; i++)
            if (rp.batch.seqs[i]->status->code != NIBBLER__V1__CODE__OK) s->n_errors++;
    }
    if (s->draining && s->n_live == 0) {
        nb_log(NB_LOG_INFO, "drained: no sequences left");
        quit = true;
    }

out_reply:
    if (rp.st.code != NIBBLER__V1__CODE__OK) {
        s->n_errors++;
        nb_log(NB_LOG_WARN, "request %llu (%s): %s: %s", (unsigned long long)rp.r.id,
               r ? nb_proto_command_name(r->command_case) : "undecoded", nb_proto_code_name(rp.st.code),
               s->msg);
    }
    size_t n = 0;
    if (!nb_proto_pack(&rp.r.base, &s->out, &s->out_cap, &n)) {
        // Out of memory for this reply: answer with the bare status.
        nb_log(NB_LOG_ERROR, "request %llu: out of host memory packing the reply", (unsigned long long)rp.r.id);
        rp.r.result_case = NIBBLER__V1__RESPONSE__RESULT__NOT_SET;
        nb_proto_status_set(&rp.st, NIBBLER__V1__CODE__INTERNAL, "out of host memory for the reply");
        if (!nb_proto_pack(&rp.r.base, &s->out, &s->out_cap, &n)) n = 0;
    }
    nb_proto_request_free(&r);
    *resp = s->out;
    *resp_len = n;
    double dt = now_s() - t0;
    s->busy_s += dt;
    nb_log(NB_LOG_DEBUG, "request %llu: %s in %.0f us", (unsigned long long)rp.r.id,
           nb_proto_code_name(rp.st.code), dt * 1e6);
    return quit;
}

// ---------------------------------------------------------------------------
// security: endpoint check, keys, ZAP
// ---------------------------------------------------------------------------

// True for an ipc:// endpoint or a tcp:// one on a loopback address.
static bool endpoint_is_local(const char *ep, bool *is_tcp, char *err, size_t err_len) {
    *is_tcp = false;
    if (strncmp(ep, "ipc://", 6) == 0) {
        if (!ep[6]) {
            nb_set_err(err, err_len, "endpoint %s: empty ipc path", ep);
            return false;
        }
        return true;
    }
    if (strncmp(ep, "tcp://", 6) != 0) {
        nb_set_err(err, err_len, "endpoint %s: only ipc:// and tcp:// are supported", ep);
        return false;
    }
    *is_tcp = true;
    const char *host = ep + 6, *colon = strrchr(host, ':');
    if (!colon || colon == host || !colon[1]) {
        nb_set_err(err, err_len, "endpoint %s: expected tcp://host:port", ep);
        return false;
    }
    char h[256];
    size_t hl = (size_t)(colon - host);
    if (hl >= sizeof(h)) hl = sizeof(h) - 1;
    memcpy(h, host, hl);
    h[hl] = '\0';
    char *hp = h;
    if (hp[0] == '[' && hl >= 2 && hp[hl - 1] == ']') {
        hp[hl - 1] = '\0';
        hp++;
    }
    return strcmp(hp, "localhost") == 0 || strncmp(hp, "127.", 4) == 0 || strcmp(hp, "::1") == 0 ||
           strcmp(hp, "lo") == 0;
}

static char *trim(char *l) {
    while (*l == ' ' || *l == '\t') l++;
    size_t n = strlen(l);
    while (n && (l[n - 1] == '\n' || l[n - 1] == '\r' || l[n - 1] == ' ' || l[n - 1] == '\t')) l[--n] = '\0';
    return l;
}

static bool read_secret_key(const char *path, char key[41], char *err, size_t err_len) {
    FILE *f = fopen(path, "r");
    if (!f) {
        nb_set_err(err, err_len, "--curve-secret-key %s: %s", path, strerror(errno));
        return false;
    }
    char line[256];
    bool ok = false;
    while (fgets(line, sizeof(line), f)) {
        char *l = trim(line);
        if (!*l || *l == '#') continue;
        uint8_t bin[32];
        if (strlen(l) == 40 && zmq_z85_decode(bin, l)) {
            memcpy(key, l, 41);
            ok = true;
        }
        break;
    }
    fclose(f);
    if (!ok) nb_set_err(err, err_len, "--curve-secret-key %s: expected a 40-character Z85 key", path);
    return ok;
}

static bool read_allowed(nb_server *s, const char *path, char *err, size_t err_len) {
    FILE *f = fopen(path, "r");
    if (!f) {
        nb_set_err(err, err_len, "--curve-allowed-clients %s: %s", path, strerror(errno));
        return false;
    }
    char line[256];
    int lineno = 0;
    bool ok = true;
    while (ok && fgets(line, sizeof(line), f)) {
        lineno++;
        char *l = trim(line);
        if (!*l || *l == '#') continue;
        uint8_t bin[32];
        if (strlen(l) != 40 || !zmq_z85_decode(bin, l)) {
            nb_set_err(err, err_len, "--curve-allowed-clients %s:%d: not a 40-character Z85 public key",
                    path, lineno);
            ok = false;
            break;
        }
        uint8_t(*na)[32] = realloc(s->allowed, (size_t)(s->n_allowed + 1) * 32);
        if (!na) {
            nb_set_err(err, err_len, "out of host memory");
            ok = false;
            break;
        }
        s->allowed = na;
        memcpy(s->allowed[s->n_allowed++], bin, 32);
    }
    fclose(f);
    if (ok && s->n_allowed == 0) {
        nb_set_err(err, err_len, "--curve-allowed-clients %s lists no key: no client could connect", path);
        ok = false;
    }
    return ok;
}

static bool zap_allowed(const nb_server *s, const uint8_t *key) {
    for (int32_t i = 0; i < s->n_allowed; i++)
        if (memcmp(s->allowed[i], key, 32) == 0) return true;
    return false;
}

// The ZAP handler (RFC 27): answers every authentication request of the
// socket's CURVE handshakes; only listed client keys get "200".
static void *zap_main(void *arg) {
    nb_server *s = arg;
    void *z = zmq_socket(s->zctx, ZMQ_REP);
    int linger = 0;
    zmq_setsockopt(z, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_bind(z, "inproc://zeromq.zap.01") != 0) {
        nb_log(NB_LOG_ERROR, "zap: bind failed: %s", zmq_strerror(zmq_errno()));
        zmq_close(z);
        return NULL;
    }
    for (;;) {
        char fr[7][64];
        size_t fl[7];
        int nf = 0;
        bool term = false;
        int more = 1;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, z, 0) < 0) {
                zmq_msg_close(&m);
                if (zmq_errno() == EINTR) continue;
                term = true;
                break;
            }
            if (nf < 7) {
                fl[nf] = zmq_msg_size(&m) < 64 ? zmq_msg_size(&m) : 64;
                if (fl[nf]) memcpy(fr[nf], zmq_msg_data(&m), fl[nf]);
                nf++;
            }
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (term) break;
        // version, request id, domain, address, identity, mechanism, credentials
        bool ok = nf == 7 && fl[5] == 5 && memcmp(fr[5], "CURVE", 5) == 0 && fl[6] == 32 &&
                  zap_allowed(s, (const uint8_t *)fr[6]);
        char addr[65] = "?";
        if (nf > 3) {
            memcpy(addr, fr[3], fl[3]);
            addr[fl[3]] = '\0';
        }
        if (!ok) {
            char z85[41] = "?";
            if (nf == 7 && fl[6] == 32) zmq_z85_encode(z85, (const uint8_t *)fr[6], 32);
            nb_log(NB_LOG_WARN, "curve: refused client key %s from %s", z85, addr);
        } else {
            nb_log(NB_LOG_DEBUG, "curve: accepted a client from %s", addr);
        }
        zmq_send(z, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(z, nf > 1 ? fr[1] : "", nf > 1 ? fl[1] : 0, ZMQ_SNDMORE);
        zmq_send(z, ok ? "200" : "400", 3, ZMQ_SNDMORE);
        zmq_send(z, ok ? "OK" : "client key not allowed", ok ? 2 : 22, ZMQ_SNDMORE);
        zmq_send(z, "", 0, ZMQ_SNDMORE);
        zmq_send(z, "", 0, 0);
    }
    zmq_close(z);
    return NULL;
}

// ---------------------------------------------------------------------------
// lifecycle
// ---------------------------------------------------------------------------

// Refuses insecure or malformed endpoint/key configurations before anything
// slow happens; reads the keys into s->secret / s->allowed.
static bool check_security(nb_server *s, char *err, size_t err_len) {
    const nb_server_params *p = &s->p;
    char eerr[256] = "";
    bool local = endpoint_is_local(p->endpoint, &s->is_tcp, eerr, sizeof(eerr));
    if (eerr[0]) {
        nb_set_err(err, err_len, "%s", eerr);
        return false;
    }
    s->curve = p->curve_secret_key_file || p->curve_allowed_clients_file;
    if (s->curve && !(p->curve_secret_key_file && p->curve_allowed_clients_file)) {
        nb_set_err(err, err_len, "CURVE needs both --curve-secret-key and --curve-allowed-clients");
        return false;
    }
    if (!local && !s->curve) {
        nb_set_err(err, err_len,
                "refusing to bind %s: a tcp endpoint off loopback needs CURVE keys "
                "(--curve-secret-key and --curve-allowed-clients); bind 127.0.0.1 or ipc:// otherwise",
                p->endpoint);
        return false;
    }
    if (s->curve) {
        if (!zmq_has("curve")) {
            nb_set_err(err, err_len, "this libzmq was built without CURVE support");
            return false;
        }
        if (!read_secret_key(p->curve_secret_key_file, s->secret, err, err_len) ||
            !read_allowed(s, p->curve_allowed_clients_file, err, err_len))
            return false;
    }
    return true;
}

static bool setup_socket(nb_server *s, int *exit_code, char *err, size_t err_len) {
    const nb_server_params *p = &s->p;
    const bool curve = s->curve, is_tcp = s->is_tcp;
    const char *secret = s->secret;
    *exit_code = NB_SERVER_EXIT_FAIL;
    s->zctx = zmq_ctx_new();
    if (!s->zctx) {
        nb_set_err(err, err_len, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        return false;
    }
    if (curve) {
        // NOTE: the ZAP socket must be bound before the CURVE socket binds.
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old); // signals go to the main thread only
        int rc = pthread_create(&s->zap_thread, NULL, zap_main, s);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc != 0) {
            nb_set_err(err, err_len, "cannot start the ZAP thread");
            return false;
        }
        s->zap_running = true;
        // Wait until the handler is bound (a client arriving before would be refused).
        for (int i = 0; i < 200; i++) {
            void *probe = zmq_socket(s->zctx, ZMQ_REQ);
            int rc2 = zmq_connect(probe, "inproc://zeromq.zap.01");
            zmq_close(probe);
            if (rc2 == 0) break;
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
    }
    s->sock = zmq_socket(s->zctx, ZMQ_ROUTER);
    if (!s->sock) {
        nb_set_err(err, err_len, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        return false;
    }
    int zero = 0, linger = 2000, hwm = 10000;
    int64_t maxmsg = (int64_t)p->max_message_bytes * 2 + 4096;
    zmq_setsockopt(s->sock, ZMQ_ROUTER_MANDATORY, &zero, sizeof(zero));
    zmq_setsockopt(s->sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(s->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(s->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (is_tcp && strchr(p->endpoint + 6, '[')) {
        int one = 1;
        zmq_setsockopt(s->sock, ZMQ_IPV6, &one, sizeof(one));
    }
    if (curve) {
        int one = 1;
        char pub[41];
        zmq_curve_public(pub, secret);
        zmq_setsockopt(s->sock, ZMQ_CURVE_SERVER, &one, sizeof(one));
        zmq_setsockopt(s->sock, ZMQ_CURVE_SECRETKEY, secret, 40);
        zmq_setsockopt(s->sock, ZMQ_ZAP_DOMAIN, "nibbler", 7);
        nb_log(NB_LOG_INFO, "curve: server public key %s, %d allowed client keys", pub, s->n_allowed);
    }
    if (zmq_bind(s->sock, p->endpoint) != 0) {
        nb_set_err(err, err_len, "cannot bind %s: %s", p->endpoint, zmq_strerror(zmq_errno()));
        return false;
    }
    return true;
}

nb_server *nb_server_new(const nb_server_params *pin, bool bind, int *exit_code, char *err,
                         size_t err_len) {
    int ec_dummy;
    if (!exit_code) exit_code = &ec_dummy;
    *exit_code = NB_SERVER_EXIT_CONFIG;
    if (!pin || !pin->model || (bind && !pin->endpoint)) {
        nb_set_err(err, err_len, "--model and --endpoint are required");
        return NULL;
    }
    nb_server_params p = *pin;
    const bool cuda = strcmp(p.backend, "cuda") == 0;
#ifndef NB_HAVE_CUDA
    if (cuda) {
        nb_set_err(err, err_len, "--backend cuda: this build has no cuda backend (use --backend cpu)");
        return NULL;
    }
#endif
    if (!cuda && strcmp(p.backend, "cpu") != 0) {
        nb_set_err(err, err_len, "--backend %s: unknown backend (cpu or cuda)", p.backend);
        return NULL;
    }
    if (!cuda && p.gpu_memory_utilization != 0.0) {
        nb_set_err(err, err_len, "--gpu-memory-utilization is only meaningful with --backend cuda; "
                              "size the cpu cache with --kv-memory BYTES");
        return NULL;
    }
    // The cuda default, as vLLM: 90% of the device unless --kv-memory sizes the pools.
    if (cuda && p.gpu_memory_utilization == 0.0 && p.kv_memory == 0) p.gpu_memory_utilization = 0.9;
    if (p.max_seqs < 1 || p.max_message_bytes < 64 || p.max_message_bytes > (1u << 30)) {
        nb_set_err(err, err_len, "--max-seqs must be >= 1 and --max-message-bytes in 64..1 GiB");
        return NULL;
    }
    nb_server *s = calloc(1, sizeof(*s));
    if (!s) {
        nb_set_err(err, err_len, "out of host memory");
        *exit_code = NB_SERVER_EXIT_FAIL;
        return NULL;
    }
    s->p = p;
    clock_gettime(CLOCK_MONOTONIC, &s->t_start);
    if (bind && !check_security(s, err, err_len)) goto out_free; // exit code: CONFIG

    *exit_code = NB_SERVER_EXIT_FAIL;
    nb_status st;
    if (strncmp(p.model, "synthetic:", 10) == 0) {
        st = nb_model_synthetic(p.model + 10, p.seed, &s->model, err, err_len);
        if (st == NB_OK)
            nb_log(NB_LOG_WARN, "model %s has random weights: its output is noise", p.model);
    } else {
        st = nb_model_load(p.model, &s->model, err, err_len);
    }
    if (st != NB_OK) goto out_free;
    s->mc = nb_model_get_config(s->model);

    nb_engine_params ep = nb_engine_default_params();
    ep.backend = cuda ? "cuda" : "cpu";
    ep.gpu_memory_utilization = p.gpu_memory_utilization;
    ep.device = p.device;
    ep.quantized_cache = p.kv_quant;
    ep.group_size = p.group_size;
    if (p.kv_memory) ep.kv_memory = p.kv_memory;
    ep.max_seqs = p.max_seqs;
    ep.max_seq_len = p.max_model_len;
    ep.max_gamma = p.max_gamma;
    ep.prefill_chunk = p.prefill_chunk;
    ep.max_batch_rows = p.max_batch_rows;
    ep.target_weights = p.target_weights;
    ep.prefix_cache = p.prefix_cache;
    ep.draft_batch_invariant = p.draft_batch_invariant;
    ep.kv_dtype = p.kv_dtype;
    if (p.max_model_len > 0 && p.max_model_len > s->mc->max_position_embeddings)
        nb_log(NB_LOG_WARN, "--max-model-len %d exceeds the model's trained context %d",
               p.max_model_len, s->mc->max_position_embeddings);
    s->eng = nb_engine_new(s->model, &ep, err, err_len);
    if (!s->eng) {
        *exit_code = NB_SERVER_EXIT_CONFIG; // invalid parameters are the usual cause
        goto out_free;
    }
    const nb_engine_params *rp = nb_engine_params_get(s->eng);
    s->max_seqs = rp->max_seqs;
    s->max_gamma = rp->max_gamma;
    s->kv_dtype = rp->kv_dtype >= 0 ? rp->kv_dtype : (int)nb_model_get_weights(s->model)->tok_embd.dtype;
    s->lim = nb_proto_default_limits((uint32_t)s->mc->vocab_size, (uint32_t)rp->max_seq_len);
    s->lim.max_gamma = (uint32_t)rp->max_gamma;
    s->lim.max_batch = (uint32_t)rp->max_seqs; // the engine takes at most max_seqs per command
    s->lim.max_message_bytes = (uint32_t)p.max_message_bytes;

    *exit_code = NB_SERVER_EXIT_FAIL;
    size_t n = (size_t)s->max_seqs;
    uint32_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    s->map_mask = cap - 1;
    s->map_keys = calloc(cap, sizeof(uint64_t));
    s->map_vals = malloc(cap * sizeof(int32_t));
    size_t out_stride = (size_t)(s->max_gamma + 1 > DECODE_CHUNK_MAX ? s->max_gamma + 1 : DECODE_CHUNK_MAX);
    s->seqs = calloc(n, sizeof(srv_seq));
    s->res = calloc(n, sizeof(seq_result));
    s->res_p = calloc(n, sizeof(seq_result *));
    s->res_st = calloc(n, sizeof(Nibbler__V1__Status));
    s->res_msg = calloc(n, sizeof(*s->res_msg));
    s->slots = calloc(n, sizeof(int32_t));
    s->idx = calloc(n, sizeof(int32_t));
    s->c0 = calloc(n, sizeof(int32_t));
    s->e_next = calloc(n, sizeof(int32_t));
    s->e_ncached = calloc(n, sizeof(int32_t));
    s->e_nout = calloc(n, sizeof(int32_t));
    s->e_nacc = calloc(n, sizeof(int32_t));
    s->e_lens = calloc(n, sizeof(int32_t));
    s->e_nlp = calloc(n, sizeof(float));
    s->e_st = calloc(n, sizeof(nb_status));
    s->e_prompts = calloc(n, sizeof(int32_t *));
    s->e_out = calloc(n * out_stride, sizeof(int32_t));
    s->e_outlp = calloc(n * out_stride, sizeof(float));
    s->e_drafts = calloc(n * (size_t)s->max_gamma, sizeof(int32_t));
    s->active = calloc(n, sizeof(bool));
    if (!s->map_keys || !s->map_vals || !s->seqs || !s->res || !s->res_p || !s->res_st ||
        !s->res_msg || !s->slots || !s->idx || !s->c0 || !s->e_next || !s->e_ncached ||
        !s->e_nout || !s->e_nacc || !s->e_lens || !s->e_nlp || !s->e_st || !s->e_prompts ||
        !s->e_out || !s->e_outlp || !s->e_drafts || !s->active ||
        !grow_u32(&s->tok, &s->tok_cap, n * out_stride) ||
        !grow_f32(&s->lp, &s->lp_cap, n * out_stride)) {
        nb_set_err(err, err_len, "out of host memory");
        goto out_free;
    }
    memset(s->map_vals, 0xff, cap * sizeof(int32_t));
    if (bind && !setup_socket(s, exit_code, err, err_len)) goto out_free;
    *exit_code = NB_SERVER_EXIT_OK;
    return s;

out_free:
    nb_server_destroy(&s);
    return NULL;
}

void nb_server_destroy(nb_server **s_p) {
    if (!s_p || !*s_p) return;
    nb_server *s = *s_p;
    if (s->sock) zmq_close(s->sock);
    if (s->zctx) {
        zmq_ctx_shutdown(s->zctx); // wakes the ZAP thread with ETERM
        if (s->zap_running) pthread_join(s->zap_thread, NULL);
        zmq_ctx_term(s->zctx);
    }
    nb_engine_destroy(&s->eng);
    nb_model_free(&s->model);
    memset(s->secret, 0, sizeof(s->secret));
    free(s->allowed);
    free(s->map_keys);
    free(s->map_vals);
    free(s->seqs);
    free(s->res);
    free(s->res_p);
    free(s->res_st);
    free(s->res_msg);
    free(s->slots);
    free(s->idx);
    free(s->c0);
    free(s->e_next);
    free(s->e_ncached);
    free(s->e_nout);
    free(s->e_nacc);
    free(s->e_lens);
    free(s->e_nlp);
    free(s->e_st);
    free(s->e_prompts);
    free(s->e_out);
    free(s->e_outlp);
    free(s->e_drafts);
    free(s->active);
    free(s->tok);
    free(s->lp);
    free(s->out);
    free(s);
    *s_p = NULL;
}

// ---------------------------------------------------------------------------
// the loop
// ---------------------------------------------------------------------------

// Receives one message: envelope frames (identity first, then e.g. a REQ
// delimiter) and the payload (the last frame). Returns the number of
// envelope frames, 0 when nothing was received, -1 on a fatal socket error.
static int recv_message(nb_server *s, zmq_msg_t *env, zmq_msg_t *payload, bool *too_many) {
    int n = 0;
    *too_many = false;
    zmq_msg_t m;
    bool have = false;
    for (;;) {
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s->sock, have ? 0 : ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&m);
            if (e == EINTR && have) continue;
            for (int i = 0; i < n; i++) zmq_msg_close(&env[i]);
            if (have) zmq_msg_close(payload);
            return (e == EAGAIN || e == EINTR) ? 0 : -1;
        }
        bool more = zmq_msg_more(&m);
        if (have) {
            // the previous "payload" was an envelope frame after all
            if (n < MAX_ENVELOPE) {
                env[n++] = *payload;
            } else {
                *too_many = true;
                zmq_msg_close(payload);
            }
        }
        *payload = m;
        have = true;
        if (!more) break;
    }
    return n;
}

// Packs a reply with only a status (id 0) into s->out; returns its length.
static size_t pack_bare(nb_server *s, nb_proto_code code, const char *msg) {
    Nibbler__V1__Response r;
    Nibbler__V1__Status st;
    nibbler__v1__response__init(&r);
    nibbler__v1__status__init(&st);
    snprintf(s->msg, sizeof(s->msg), "%s", msg);
    nb_proto_status_set(&st, code, s->msg);
    r.status = &st;
    size_t n = 0;
    s->n_requests++;
    s->n_errors++;
    nb_log(NB_LOG_WARN, "request (undecoded): %s: %s", nb_proto_code_name(code), msg);
    return nb_proto_pack(&r.base, &s->out, &s->out_cap, &n) ? n : 0;
}

int nb_server_run(nb_server *s) {
    NB_ASSERT(s->sock);
    nb_log(NB_LOG_INFO, "worker listening on %s (model %s, %s backend, %d layers, vocab %d, "
           "max_context %d, max_seqs %d)", s->p.endpoint, nb_model_get_dir(s->model),
           nb_engine_params_get(s->eng)->backend, s->mc->n_layers, s->mc->vocab_size,
           (int)s->lim.max_context, s->max_seqs);
    zmq_pollitem_t item = {.socket = s->sock, .events = ZMQ_POLLIN};
    int code = NB_SERVER_EXIT_OK;
    for (;;) {
        if (g_stop) {
            nb_log(NB_LOG_INFO, "signal received: exiting after the request in flight");
            break;
        }
        int rc = zmq_poll(&item, 1, 200);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            nb_log(NB_LOG_ERROR, "zmq_poll: %s", zmq_strerror(zmq_errno()));
            code = NB_SERVER_EXIT_FAIL;
            break;
        }
        if (!(item.revents & ZMQ_POLLIN)) continue;
        zmq_msg_t env[MAX_ENVELOPE], payload;
        bool too_many = false;
        int ne = recv_message(s, env, &payload, &too_many);
        if (ne < 0) {
            nb_log(NB_LOG_ERROR, "zmq_msg_recv: %s", zmq_strerror(zmq_errno()));
            code = NB_SERVER_EXIT_FAIL;
            break;
        }
        if (ne == 0) continue; // nothing, or a message without an identity (cannot happen on ROUTER)
        const uint8_t *resp = NULL;
        size_t resp_len = 0;
        bool quit;
        if (too_many) {
            // Not a DEALER/REQ envelope: answer the identity only, MALFORMED.
            quit = false;
            resp_len = pack_bare(s, NIBBLER__V1__CODE__MALFORMED,
                                 "more than 8 envelope frames: send one frame per request");
            resp = s->out;
            for (int i = 1; i < ne; i++) zmq_msg_close(&env[i]);
            ne = 1;
        } else {
            quit = nb_server_handle(s, zmq_msg_data(&payload), zmq_msg_size(&payload), &resp,
                                    &resp_len);
        }
        zmq_msg_close(&payload);
        // ROUTER never blocks on send; a vanished client's reply is dropped.
        for (int i = 0; i < ne; i++) {
            zmq_send(s->sock, zmq_msg_data(&env[i]), zmq_msg_size(&env[i]), ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_msg_close(&env[i]);
        }
        if (zmq_send(s->sock, resp, resp_len, ZMQ_DONTWAIT) < 0)
            nb_log(NB_LOG_DEBUG, "reply dropped: %s", zmq_strerror(zmq_errno()));
        if (quit) break;
    }
    nb_log(NB_LOG_INFO, "worker exiting (%llu requests served, %d sequences live)",
           (unsigned long long)s->n_requests, s->n_live);
    return code;
}
