// nb_proto.c: status codes, bounded decoding, validation and packing for the
// nibbler wire protocol. See nb_proto.h; no ZeroMQ, no engine.
#include "nb_proto.h"

#include "nb_status.h"
#include <jemalloc/jemalloc.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

nb_proto_limits nb_proto_default_limits(uint32_t vocab_size, uint32_t max_context) {
    return (nb_proto_limits){
        .vocab_size = vocab_size,
        .max_context = max_context,
        .max_gamma = 8,
        .max_batch = 16,
        .max_decode_steps = max_context,
        .max_eos_ids = NB_PROTO_MAX_EOS_IDS,
        .max_message_bytes = 64u << 20,
    };
}

nb_proto_code nb_proto_code_from_status(nb_status s) {
    switch (s) {
    case NB_OK: return NIBBLER__V1__CODE__OK;
    case NB_ERR_INVALID_ARG: return NIBBLER__V1__CODE__INVALID_ARGUMENT;
    case NB_ERR_NO_FREE_BLOCKS: return NIBBLER__V1__CODE__NO_FREE_BLOCKS;
    case NB_ERR_NOT_FOUND: return NIBBLER__V1__CODE__NOT_FOUND;
    case NB_ERR_EXISTS: return NIBBLER__V1__CODE__ALREADY_EXISTS;
    case NB_ERR_NON_FINITE: return NIBBLER__V1__CODE__NON_FINITE;
    case NB_ERR_CONTEXT_TOO_LONG: return NIBBLER__V1__CODE__CONTEXT_TOO_LONG;
    case NB_ERR_FORMAT: return NIBBLER__V1__CODE__MALFORMED;
    case NB_ERR_UNSUPPORTED: return NIBBLER__V1__CODE__INVALID_ARGUMENT;
    case NB_ERR_STATE: return NIBBLER__V1__CODE__BAD_STATE;
    case NB_ERR_BACKEND: return NIBBLER__V1__CODE__BACKEND_ERROR;
    case NB_ERR_TOO_MANY_SEQS: return NIBBLER__V1__CODE__TOO_MANY_SEQUENCES;
    case NB_ERR_OUT_OF_MEMORY:
    case NB_ERR_IO:
    case NB_ERR_INTERNAL: return NIBBLER__V1__CODE__INTERNAL;
    }
    return NIBBLER__V1__CODE__INTERNAL;
}

const char *nb_proto_code_name(nb_proto_code c) {
    switch (c) {
    case NIBBLER__V1__CODE__OK: return "OK";
    case NIBBLER__V1__CODE__INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case NIBBLER__V1__CODE__NOT_FOUND: return "NOT_FOUND";
    case NIBBLER__V1__CODE__ALREADY_EXISTS: return "ALREADY_EXISTS";
    case NIBBLER__V1__CODE__NO_FREE_BLOCKS: return "NO_FREE_BLOCKS";
    case NIBBLER__V1__CODE__CONTEXT_TOO_LONG: return "CONTEXT_TOO_LONG";
    case NIBBLER__V1__CODE__TOO_MANY_SEQUENCES: return "TOO_MANY_SEQUENCES";
    case NIBBLER__V1__CODE__BAD_STATE: return "BAD_STATE";
    case NIBBLER__V1__CODE__MALFORMED: return "MALFORMED";
    case NIBBLER__V1__CODE__UNSUPPORTED_VERSION: return "UNSUPPORTED_VERSION";
    case NIBBLER__V1__CODE__UNKNOWN_COMMAND: return "UNKNOWN_COMMAND";
    case NIBBLER__V1__CODE__MESSAGE_TOO_LARGE: return "MESSAGE_TOO_LARGE";
    case NIBBLER__V1__CODE__DRAINING: return "DRAINING";
    case NIBBLER__V1__CODE__NON_FINITE: return "NON_FINITE";
    case NIBBLER__V1__CODE__BACKEND_ERROR: return "BACKEND_ERROR";
    case NIBBLER__V1__CODE__INTERNAL: return "INTERNAL";
    case NIBBLER__V1__CODE__FINISHED: return "FINISHED";
    default: break;
    }
    return "UNKNOWN_CODE";
}

const char *nb_proto_command_name(Nibbler__V1__Request__CommandCase c) {
    switch (c) {
    case NIBBLER__V1__REQUEST__COMMAND_HELLO: return "hello";
    case NIBBLER__V1__REQUEST__COMMAND_ADD_SEQUENCE: return "add_sequence";
    case NIBBLER__V1__REQUEST__COMMAND_PREFILL: return "prefill";
    case NIBBLER__V1__REQUEST__COMMAND_DRAFT: return "draft";
    case NIBBLER__V1__REQUEST__COMMAND_VERIFY: return "verify";
    case NIBBLER__V1__REQUEST__COMMAND_SPECULATE: return "speculate";
    case NIBBLER__V1__REQUEST__COMMAND_DECODE: return "decode";
    case NIBBLER__V1__REQUEST__COMMAND_ROLLBACK: return "rollback";
    case NIBBLER__V1__REQUEST__COMMAND_FREE: return "free";
    case NIBBLER__V1__REQUEST__COMMAND_FORK: return "fork";
    case NIBBLER__V1__REQUEST__COMMAND_STATS: return "stats";
    case NIBBLER__V1__REQUEST__COMMAND_HEALTH: return "health";
    case NIBBLER__V1__REQUEST__COMMAND_DRAIN: return "drain";
    case NIBBLER__V1__REQUEST__COMMAND_SHUTDOWN: return "shutdown";
    default: break;
    }
    return "none";
}

bool nb_proto_peek_request_id(const void *data, size_t len, uint64_t *id) {
    const uint8_t *p = data;
    *id = 0;
    if (!p || len < 2 || p[0] != 0x08) return false; // field 1, wire type 0 (varint)
    uint64_t v = 0;
    for (size_t i = 1; i < len && i <= 10; i++) {
        v |= (uint64_t)(p[i] & 0x7f) << (7 * (i - 1));
        if (!(p[i] & 0x80)) {
            *id = v;
            return true;
        }
    }
    return false;
}

nb_proto_code nb_proto_request_decode(const void *data, size_t len, size_t max_len,
                                      Nibbler__V1__Request **out, char *err, size_t err_len) {
    *out = NULL;
    if (len > max_len) {
        nb_set_err(err, err_len, "message of %zu bytes exceeds the limit of %zu bytes", len, max_len);
        return NIBBLER__V1__CODE__MESSAGE_TOO_LARGE;
    }
    Nibbler__V1__Request *r = nibbler__v1__request__unpack(NULL, len, data);
    if (!r) {
        nb_set_err(err, err_len, "%zu bytes do not decode as a nibbler.v1.Request", len);
        return NIBBLER__V1__CODE__MALFORMED;
    }
    *out = r;
    return NIBBLER__V1__CODE__OK;
}

void nb_proto_request_free(Nibbler__V1__Request **req) {
    if (!req || !*req) return;
    nibbler__v1__request__free_unpacked(*req, NULL);
    *req = NULL;
}

// ---------------------------------------------------------------------------
// validation
// ---------------------------------------------------------------------------

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

// Batch size and duplicates. ids[i] = get(i). Returns OK or INVALID_ARGUMENT.
typedef uint64_t (*id_at_fn)(const void *arr, size_t i);
static uint64_t id_plain(const void *arr, size_t i) { return ((const uint64_t *)arr)[i]; }
static uint64_t id_spec(const void *arr, size_t i) {
    return ((Nibbler__V1__SequenceSpec *const *)arr)[i]->seq_id;
}
static uint64_t id_prefill(const void *arr, size_t i) {
    return ((Nibbler__V1__PrefillItem *const *)arr)[i]->seq_id;
}
static uint64_t id_rollback(const void *arr, size_t i) {
    return ((Nibbler__V1__RollbackItem *const *)arr)[i]->seq_id;
}

static nb_proto_code check_batch(const char *cmd, const void *arr, size_t n, id_at_fn at,
                                 const nb_proto_limits *lim, char *err, size_t err_len) {
    if (n == 0) {
        nb_set_err(err, err_len, "%s: the batch is empty (name at least one sequence)", cmd);
        return NIBBLER__V1__CODE__INVALID_ARGUMENT;
    }
    if (n > lim->max_batch) {
        nb_set_err(err, err_len, "%s: %zu sequences exceed max_batch %u", cmd, n, lim->max_batch);
        return NIBBLER__V1__CODE__INVALID_ARGUMENT;
    }
    if (n <= 64) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (at(arr, i) == at(arr, j)) {
                    nb_set_err(err, err_len, "%s: sequence %llu is named twice", cmd,
                            (unsigned long long)at(arr, i));
                    return NIBBLER__V1__CODE__INVALID_ARGUMENT;
                }
        return NIBBLER__V1__CODE__OK;
    }
    uint64_t *ids = malloc(n * sizeof(uint64_t));
    if (!ids) {
        nb_set_err(err, err_len, "%s: out of host memory", cmd);
        return NIBBLER__V1__CODE__INTERNAL;
    }
    for (size_t i = 0; i < n; i++) ids[i] = at(arr, i);
    qsort(ids, n, sizeof(uint64_t), cmp_u64);
    nb_proto_code c = NIBBLER__V1__CODE__OK;
    for (size_t i = 1; i < n; i++)
        if (ids[i] == ids[i - 1]) {
            nb_set_err(err, err_len, "%s: sequence %llu is named twice", cmd,
                    (unsigned long long)ids[i]);
            c = NIBBLER__V1__CODE__INVALID_ARGUMENT;
            break;
        }
    free(ids);
    return c;
}

static nb_proto_code check_sampling(const char *cmd, uint64_t seq,
                                    const Nibbler__V1__SamplingParams *sp,
                                    const nb_proto_limits *lim, char *err, size_t err_len) {
    if (!sp) return NIBBLER__V1__CODE__OK;
    if (!(sp->temperature >= 0.0f) || !isfinite(sp->temperature)) {
        nb_set_err(err, err_len, "%s: sequence %llu: temperature %g must be finite and >= 0", cmd,
                (unsigned long long)seq, (double)sp->temperature);
        return NIBBLER__V1__CODE__INVALID_ARGUMENT;
    }
    if (sp->top_k > lim->vocab_size) {
        nb_set_err(err, err_len, "%s: sequence %llu: top_k %u exceeds the vocabulary (%u)", cmd,
                (unsigned long long)seq, sp->top_k, lim->vocab_size);
        return NIBBLER__V1__CODE__INVALID_ARGUMENT;
    }
    if (!(sp->top_p >= 0.0f && sp->top_p <= 1.0f)) {
        nb_set_err(err, err_len, "%s: sequence %llu: top_p %g must be in [0, 1]", cmd,
                (unsigned long long)seq, (double)sp->top_p);
        return NIBBLER__V1__CODE__INVALID_ARGUMENT;
    }
    return NIBBLER__V1__CODE__OK;
}

static nb_proto_code check_stop(const char *cmd, uint64_t seq, const Nibbler__V1__StopConditions *sc,
                                const nb_proto_limits *lim, char *err, size_t err_len) {
    if (!sc) return NIBBLER__V1__CODE__OK;
    uint32_t most = lim->max_eos_ids < NB_PROTO_MAX_EOS_IDS ? lim->max_eos_ids : NB_PROTO_MAX_EOS_IDS;
    if (sc->n_eos_ids > most) {
        nb_set_err(err, err_len, "%s: sequence %llu: %zu eos ids exceed the limit of %u", cmd,
                (unsigned long long)seq, sc->n_eos_ids, most);
        return NIBBLER__V1__CODE__INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < sc->n_eos_ids; i++)
        if (sc->eos_ids[i] >= lim->vocab_size) {
            nb_set_err(err, err_len, "%s: sequence %llu: eos id %u is outside the vocabulary (%u)",
                    cmd, (unsigned long long)seq, sc->eos_ids[i], lim->vocab_size);
            return NIBBLER__V1__CODE__INVALID_ARGUMENT;
        }
    return NIBBLER__V1__CODE__OK;
}

static nb_proto_code check_gamma(const char *cmd, uint32_t gamma, const nb_proto_limits *lim,
                                 char *err, size_t err_len) {
    if (gamma < 1 || gamma > lim->max_gamma) {
        nb_set_err(err, err_len, "%s: gamma %u is outside 1..%u", cmd, gamma, lim->max_gamma);
        return NIBBLER__V1__CODE__INVALID_ARGUMENT;
    }
    return NIBBLER__V1__CODE__OK;
}

#define TRY(x)                                                                \
    do {                                                                      \
        nb_proto_code c_ = (x);                                               \
        if (c_ != NIBBLER__V1__CODE__OK) return c_;                           \
    } while (0)

nb_proto_code nb_proto_validate_request(const Nibbler__V1__Request *req,
                                        const nb_proto_limits *lim, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!req || !lim) {
        nb_set_err(err, err_len, "no request");
        return NIBBLER__V1__CODE__INTERNAL;
    }
    if (req->protocol_version > NB_PROTO_VERSION) {
        nb_set_err(err, err_len, "protocol_version %u is not supported (this worker speaks %u)",
                req->protocol_version, NB_PROTO_VERSION);
        return NIBBLER__V1__CODE__UNSUPPORTED_VERSION;
    }
    const char *cmd = nb_proto_command_name(req->command_case);
    switch (req->command_case) {
    case NIBBLER__V1__REQUEST__COMMAND_HELLO:
        if (req->hello->protocol_version > NB_PROTO_VERSION) {
            nb_set_err(err, err_len, "hello: protocol_version %u is not supported (this worker speaks %u)",
                    req->hello->protocol_version, NB_PROTO_VERSION);
            return NIBBLER__V1__CODE__UNSUPPORTED_VERSION;
        }
        return NIBBLER__V1__CODE__OK;
    case NIBBLER__V1__REQUEST__COMMAND_ADD_SEQUENCE: {
        const Nibbler__V1__AddSequence *c = req->add_sequence;
        TRY(check_batch(cmd, c->seqs, c->n_seqs, id_spec, lim, err, err_len));
        for (size_t i = 0; i < c->n_seqs; i++) {
            TRY(check_sampling(cmd, c->seqs[i]->seq_id, c->seqs[i]->sampling, lim, err, err_len));
            TRY(check_stop(cmd, c->seqs[i]->seq_id, c->seqs[i]->stop, lim, err, err_len));
        }
        return NIBBLER__V1__CODE__OK;
    }
    case NIBBLER__V1__REQUEST__COMMAND_PREFILL: {
        const Nibbler__V1__Prefill *c = req->prefill;
        TRY(check_batch(cmd, c->items, c->n_items, id_prefill, lim, err, err_len));
        for (size_t i = 0; i < c->n_items; i++) {
            const Nibbler__V1__PrefillItem *it = c->items[i];
            if (it->n_tokens == 0) {
                nb_set_err(err, err_len, "prefill: sequence %llu: empty prompt",
                        (unsigned long long)it->seq_id);
                return NIBBLER__V1__CODE__INVALID_ARGUMENT;
            }
            if (it->n_tokens > lim->max_context) {
                nb_set_err(err, err_len, "prefill: sequence %llu: %zu prompt tokens exceed max_context %u",
                        (unsigned long long)it->seq_id, it->n_tokens, lim->max_context);
                return NIBBLER__V1__CODE__CONTEXT_TOO_LONG;
            }
            for (size_t t = 0; t < it->n_tokens; t++)
                if (it->tokens[t] >= lim->vocab_size) {
                    nb_set_err(err, err_len,
                            "prefill: sequence %llu: token %u at position %zu is outside the vocabulary (%u)",
                            (unsigned long long)it->seq_id, it->tokens[t], t, lim->vocab_size);
                    return NIBBLER__V1__CODE__INVALID_ARGUMENT;
                }
        }
        return NIBBLER__V1__CODE__OK;
    }
    case NIBBLER__V1__REQUEST__COMMAND_DRAFT:
        TRY(check_batch(cmd, req->draft->seq_ids, req->draft->n_seq_ids, id_plain, lim, err, err_len));
        return check_gamma(cmd, req->draft->gamma, lim, err, err_len);
    case NIBBLER__V1__REQUEST__COMMAND_VERIFY:
        return check_batch(cmd, req->verify->seq_ids, req->verify->n_seq_ids, id_plain, lim, err,
                           err_len);
    case NIBBLER__V1__REQUEST__COMMAND_SPECULATE:
        TRY(check_batch(cmd, req->speculate->seq_ids, req->speculate->n_seq_ids, id_plain, lim,
                        err, err_len));
        return check_gamma(cmd, req->speculate->gamma, lim, err, err_len);
    case NIBBLER__V1__REQUEST__COMMAND_DECODE:
        TRY(check_batch(cmd, req->decode->seq_ids, req->decode->n_seq_ids, id_plain, lim, err,
                        err_len));
        if (req->decode->n < 1 || req->decode->n > lim->max_decode_steps) {
            nb_set_err(err, err_len, "decode: n %u is outside 1..%u", req->decode->n,
                    lim->max_decode_steps);
            return NIBBLER__V1__CODE__INVALID_ARGUMENT;
        }
        return NIBBLER__V1__CODE__OK;
    case NIBBLER__V1__REQUEST__COMMAND_ROLLBACK: {
        const Nibbler__V1__Rollback *c = req->rollback;
        TRY(check_batch(cmd, c->items, c->n_items, id_rollback, lim, err, err_len));
        for (size_t i = 0; i < c->n_items; i++)
            if (c->items[i]->n_tokens > lim->max_context) {
                nb_set_err(err, err_len, "rollback: sequence %llu: n_tokens %u exceeds max_context %u",
                        (unsigned long long)c->items[i]->seq_id, c->items[i]->n_tokens,
                        lim->max_context);
                return NIBBLER__V1__CODE__INVALID_ARGUMENT;
            }
        return NIBBLER__V1__CODE__OK;
    }
    case NIBBLER__V1__REQUEST__COMMAND_FREE:
        return check_batch(cmd, req->free->seq_ids, req->free->n_seq_ids, id_plain, lim, err,
                           err_len);
    case NIBBLER__V1__REQUEST__COMMAND_FORK: {
        const Nibbler__V1__Fork *c = req->fork;
        if (c->parent_id == c->child_id) {
            nb_set_err(err, err_len, "fork: child_id %llu equals parent_id",
                    (unsigned long long)c->child_id);
            return NIBBLER__V1__CODE__INVALID_ARGUMENT;
        }
        TRY(check_sampling(cmd, c->child_id, c->sampling, lim, err, err_len));
        return check_stop(cmd, c->child_id, c->stop, lim, err, err_len);
    }
    case NIBBLER__V1__REQUEST__COMMAND_STATS:
    case NIBBLER__V1__REQUEST__COMMAND_HEALTH:
    case NIBBLER__V1__REQUEST__COMMAND_DRAIN:
    case NIBBLER__V1__REQUEST__COMMAND_SHUTDOWN: return NIBBLER__V1__CODE__OK;
    default: break;
    }
    nb_set_err(err, err_len, "request %llu names no command this worker knows (protocol version %u)",
            (unsigned long long)req->id, NB_PROTO_VERSION);
    return NIBBLER__V1__CODE__UNKNOWN_COMMAND;
}

// ---------------------------------------------------------------------------
// packing
// ---------------------------------------------------------------------------

bool nb_proto_pack(const ProtobufCMessage *m, uint8_t **buf, size_t *cap, size_t *len) {
    size_t need = protobuf_c_message_get_packed_size(m);
    size_t alloc = need ? need : 1;
    if (!*buf || *cap < alloc) {
        size_t ncap = *cap ? *cap : 256;
        while (ncap < alloc) ncap *= 2;
        uint8_t *nb = realloc(*buf, ncap);
        if (!nb) return false;
        *buf = nb;
        *cap = ncap;
    }
    *len = protobuf_c_message_pack(m, *buf);
    return true;
}

void nb_proto_status_set(Nibbler__V1__Status *st, nb_proto_code code, char *message) {
    st->code = code;
    st->message = message ? message : (char *)protobuf_c_empty_string;
}
