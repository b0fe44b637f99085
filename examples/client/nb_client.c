// nb_client.c: the nibbler C client: one DEALER socket, one Request and one
// Response per call, matched by id (see nb_client.h).
#include "nb_client.h"

#include "nb_status.h"
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

struct nb_client {
    void *ctx;
    void *sock;
    char *endpoint;
    char *client_name;
    int timeout_ms;
    uint64_t next_id;     // id of the next request
    uint64_t next_seq;    // nb_client_generate's fresh sequence ids
    char err[512];
};

static int fail(nb_client *c, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return code;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

const char *nb_client_code_str(int code) {
    switch (code) {
    case NB_CLIENT_ERR_TIMEOUT: return "TIMEOUT";
    case NB_CLIENT_ERR_TRANSPORT: return "TRANSPORT";
    case NB_CLIENT_ERR_PROTOCOL: return "PROTOCOL";
    case NB_CLIENT_ERR_INVALID_ARG: return "CLIENT_INVALID_ARG";
    case NB_CLIENT_ERR_OUT_OF_MEMORY: return "CLIENT_OUT_OF_MEMORY";
    default: break;
    }
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&nibbler__v1__code__descriptor, code);
    return v ? v->name : "UNKNOWN_CODE";
}

nb_client_params nb_client_default_params(void) {
    return (nb_client_params){
        .endpoint = NULL,
        .timeout_ms = 120000,
        .client_name = "nb_client",
    };
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

nb_client *nb_client_new(const nb_client_params *p, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!p || !p->endpoint || !*p->endpoint) {
        nb_set_err(err, err_len, "nb_client_new: no endpoint");
        return NULL;
    }
    int n_curve = !!p->curve_server_key + !!p->curve_public_key + !!p->curve_secret_key;
    if (n_curve != 0 && n_curve != 3) {
        nb_set_err(err, err_len,
                   "nb_client_new: CURVE needs all of the server key and the client key pair");
        return NULL;
    }
    nb_client *c = calloc(1, sizeof *c);
    if (!c) {
        nb_set_err(err, err_len, "nb_client_new: out of memory");
        return NULL;
    }
    c->timeout_ms = p->timeout_ms;
    c->endpoint = dup_str(p->endpoint);
    c->client_name = dup_str(p->client_name ? p->client_name : "nb_client");
    if (!c->endpoint || !c->client_name) {
        nb_set_err(err, err_len, "nb_client_new: out of memory");
        goto out_free_client;
    }
    // NOTE: ids start at a random point so a worker log (or a reply to a
    // previous incarnation of this client) never aliases a fresh request.
    uint64_t r = mix64((uint64_t)getpid() ^ ((uint64_t)(uintptr_t)c << 16) ^
                       (uint64_t)(now_s() * 1e9));
    c->next_id = (r >> 16) + 1;
    c->next_seq = mix64(r) >> 2;
    if (!(c->ctx = zmq_ctx_new())) {
        nb_set_err(err, err_len, "zmq_ctx_new: %s", zmq_strerror(errno));
        goto out_free_client;
    }
    if (!(c->sock = zmq_socket(c->ctx, ZMQ_DEALER))) {
        nb_set_err(err, err_len, "zmq_socket: %s", zmq_strerror(errno));
        goto out_free_ctx;
    }
    int linger = 0;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
    if (n_curve == 3) {
        const char *keys[3] = {p->curve_server_key, p->curve_public_key, p->curve_secret_key};
        const char *what[3] = {"server key", "client public key", "client secret key"};
        const int opts[3] = {ZMQ_CURVE_SERVERKEY, ZMQ_CURVE_PUBLICKEY, ZMQ_CURVE_SECRETKEY};
        for (int i = 0; i < 3; i++) {
            if (strlen(keys[i]) != 40 ||
                zmq_setsockopt(c->sock, opts[i], keys[i], 41) != 0) {
                nb_set_err(err, err_len, "CURVE %s: not a 40-character Z85 key (%s)", what[i],
                           zmq_strerror(errno));
                goto out_close_sock;
            }
        }
    }
    if (zmq_connect(c->sock, c->endpoint) != 0) {
        nb_set_err(err, err_len, "cannot connect to %s: %s", c->endpoint, zmq_strerror(errno));
        goto out_close_sock;
    }
    return c;

out_close_sock:
    zmq_close(c->sock);
out_free_ctx:
    zmq_ctx_term(c->ctx);
out_free_client:
    free(c->endpoint);
    free(c->client_name);
    free(c);
    return NULL;
}

void nb_client_destroy(nb_client **c_p) {
    if (!c_p || !*c_p) return;
    nb_client *c = *c_p;
    zmq_close(c->sock);
    zmq_ctx_term(c->ctx);
    free(c->endpoint);
    free(c->client_name);
    free(c);
    *c_p = NULL;
}

const char *nb_client_error(const nb_client *c) { return c ? c->err : "no client"; }

void nb_client_response_free(nb_client_response **r_p) {
    if (!r_p || !*r_p) return;
    nibbler__v1__response__free_unpacked(*r_p, NULL);
    *r_p = NULL;
}

// Receives one message and decodes its last frame (a ROUTER may put an
// empty delimiter before the payload). Returns 0, or a client error.
static int recv_one(nb_client *c, nb_client_response **resp) {
    zmq_msg_t msg;
    zmq_msg_t last;
    zmq_msg_init(&last);
    int more = 1;
    while (more) {
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, c->sock, 0) < 0) {
            int e = errno;
            zmq_msg_close(&msg);
            zmq_msg_close(&last);
            return fail(c, NB_CLIENT_ERR_TRANSPORT, "receive from %s: %s", c->endpoint,
                        zmq_strerror(e));
        }
        more = zmq_msg_more(&msg);
        if (zmq_msg_size(&msg) > 0 || !more) zmq_msg_move(&last, &msg);
        zmq_msg_close(&msg);
    }
    *resp = nibbler__v1__response__unpack(NULL, zmq_msg_size(&last), zmq_msg_data(&last));
    size_t n = zmq_msg_size(&last);
    zmq_msg_close(&last);
    if (!*resp)
        return fail(c, NB_CLIENT_ERR_PROTOCOL, "%s sent %zu bytes that are not a Response",
                    c->endpoint, n);
    return 0;
}

// The status of one Status message (NULL: OK), with its message in c->err
// prefixed by `what`.
static int status_code(nb_client *c, const Nibbler__V1__Status *s, const char *what) {
    if (!s || s->code == NIBBLER__V1__CODE__OK) return 0;
    return fail(c, (int)s->code, "%s%s: %s", what, nb_client_code_str((int)s->code),
                s->message && *s->message ? s->message : "(no message)");
}

int nb_client_call(nb_client *c, Nibbler__V1__Request *req, nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    c->err[0] = '\0';
    if (!req) return fail(c, NB_CLIENT_ERR_INVALID_ARG, "nb_client_call: NULL request");
    const uint64_t id = c->next_id++;
    req->id = id;
    size_t len = nibbler__v1__request__get_packed_size(req);
    uint8_t stackbuf[4096];
    uint8_t *buf = len <= sizeof stackbuf ? stackbuf : malloc(len);
    if (!buf) return fail(c, NB_CLIENT_ERR_OUT_OF_MEMORY, "out of memory packing %zu bytes", len);
    nibbler__v1__request__pack(req, buf);
    const double t0 = now_s();
    int rc;
    do {
        rc = zmq_send(c->sock, buf, len, 0);
    } while (rc < 0 && errno == EINTR);
    int send_errno = errno;
    if (buf != stackbuf) free(buf);
    if (rc < 0)
        return fail(c, NB_CLIENT_ERR_TRANSPORT, "send to %s: %s", c->endpoint,
                    zmq_strerror(send_errno));

    for (;;) {
        long wait_ms = -1;
        if (c->timeout_ms >= 0) {
            wait_ms = c->timeout_ms - (long)((now_s() - t0) * 1000.0);
            if (wait_ms < 0) wait_ms = 0;
        }
        zmq_pollitem_t item = {.socket = c->sock, .events = ZMQ_POLLIN};
        int n = zmq_poll(&item, 1, wait_ms);
        if (n < 0) {
            if (errno == EINTR) continue;
            return fail(c, NB_CLIENT_ERR_TRANSPORT, "poll on %s: %s", c->endpoint,
                        zmq_strerror(errno));
        }
        if (n == 0)
            return fail(c, NB_CLIENT_ERR_TIMEOUT, "no reply from %s to request %llu within %d ms",
                        c->endpoint, (unsigned long long)id, c->timeout_ms);
        nb_client_response *resp = NULL;
        if ((rc = recv_one(c, &resp))) return rc;
        if (resp->id != id) {
            // NOTE: a reply to a request that timed out earlier: drop it.
            nb_client_response_free(&resp);
            continue;
        }
        rc = status_code(c, resp->status, "");
        if (out)
            *out = resp;
        else
            nb_client_response_free(&resp);
        return rc;
    }
}

// Runs a request whose result is a BatchResult: the request's code, or the
// first failing sequence's.
static int call_batch(nb_client *c, Nibbler__V1__Request *req, nb_client_response **out) {
    nb_client_response *resp = NULL;
    int rc = nb_client_call(c, req, &resp);
    if (rc == 0 && resp) {
        if (resp->result_case != NIBBLER__V1__RESPONSE__RESULT_BATCH || !resp->batch) {
            rc = fail(c, NB_CLIENT_ERR_PROTOCOL, "reply to request %llu has no batch result",
                      (unsigned long long)resp->id);
        } else {
            for (size_t i = 0; i < resp->batch->n_seqs && rc == 0; i++) {
                const Nibbler__V1__SequenceResult *s = resp->batch->seqs[i];
                char what[48];
                snprintf(what, sizeof what, "seq %llu: ", (unsigned long long)s->seq_id);
                rc = status_code(c, s->status, what);
            }
        }
    }
    if (out)
        *out = resp;
    else
        nb_client_response_free(&resp);
    return rc;
}

// Runs a request whose reply must carry result `want`.
static int call_result(nb_client *c, Nibbler__V1__Request *req, int want,
                       nb_client_response **out) {
    nb_client_response *resp = NULL;
    int rc = nb_client_call(c, req, &resp);
    if (rc == 0 && resp && want != NIBBLER__V1__RESPONSE__RESULT__NOT_SET &&
        (int)resp->result_case != want)
        rc = fail(c, NB_CLIENT_ERR_PROTOCOL, "reply to request %llu lacks its result",
                  (unsigned long long)resp->id);
    if (out)
        *out = resp;
    else
        nb_client_response_free(&resp);
    return rc;
}

int nb_client_hello(nb_client *c, nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Hello h = NIBBLER__V1__HELLO__INIT;
    h.protocol_version = NIBBLER__V1__PROTOCOL_VERSION__PROTOCOL_VERSION;
    h.client_name = c->client_name;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_HELLO;
    req.hello = &h;
    int rc = call_result(c, &req, NIBBLER__V1__RESPONSE__RESULT_HELLO, out);
    if (rc == 0 && out && *out && !(*out)->hello) rc = NB_CLIENT_ERR_PROTOCOL;
    return rc;
}

// Fills the sampling and stop messages of a spec (pointing into spec).
static void spec_to_proto(const nb_client_seq_spec *s, Nibbler__V1__SamplingParams *sp,
                          Nibbler__V1__StopConditions *stop) {
    nibbler__v1__sampling_params__init(sp);
    nibbler__v1__stop_conditions__init(stop);
    sp->temperature = s->temperature;
    sp->top_k = s->top_k;
    sp->top_p = s->top_p;
    sp->seed = s->seed;
    stop->n_eos_ids = s->eos_ids ? s->n_eos_ids : 0;
    stop->eos_ids = (uint32_t *)s->eos_ids; // NOTE: only read while packing
    stop->max_tokens = s->max_tokens;
}

int nb_client_add_sequence(nb_client *c, size_t n, const nb_client_seq_spec *specs,
                           nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    if (n && !specs) return fail(c, NB_CLIENT_ERR_INVALID_ARG, "add_sequence: NULL specs");
    // One allocation: the messages, their sampling/stop parts, the pointer array.
    size_t each = sizeof(Nibbler__V1__SequenceSpec) + sizeof(Nibbler__V1__SamplingParams) +
                  sizeof(Nibbler__V1__StopConditions) + sizeof(Nibbler__V1__SequenceSpec *);
    unsigned char *mem = malloc(n ? n * each : 1);
    if (!mem) return fail(c, NB_CLIENT_ERR_OUT_OF_MEMORY, "add_sequence: out of memory");
    Nibbler__V1__SequenceSpec *ss = (void *)mem;
    Nibbler__V1__SamplingParams *sp = (void *)(ss + n);
    Nibbler__V1__StopConditions *st = (void *)(sp + n);
    Nibbler__V1__SequenceSpec **ptrs = (void *)(st + n);
    for (size_t i = 0; i < n; i++) {
        nibbler__v1__sequence_spec__init(&ss[i]);
        ss[i].seq_id = specs[i].seq_id;
        spec_to_proto(&specs[i], &sp[i], &st[i]);
        ss[i].sampling = &sp[i];
        ss[i].stop = &st[i];
        ptrs[i] = &ss[i];
    }
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__AddSequence a = NIBBLER__V1__ADD_SEQUENCE__INIT;
    a.n_seqs = n;
    a.seqs = ptrs;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_ADD_SEQUENCE;
    req.add_sequence = &a;
    int rc = call_batch(c, &req, out);
    free(mem);
    return rc;
}

int nb_client_prefill(nb_client *c, size_t n, const uint64_t *seq_ids,
                      const uint32_t *const *tokens, const size_t *lens, bool logprobs,
                      nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    if (n && (!seq_ids || !tokens || !lens))
        return fail(c, NB_CLIENT_ERR_INVALID_ARG, "prefill: NULL argument");
    size_t each = sizeof(Nibbler__V1__PrefillItem) + sizeof(Nibbler__V1__PrefillItem *);
    unsigned char *mem = malloc(n ? n * each : 1);
    if (!mem) return fail(c, NB_CLIENT_ERR_OUT_OF_MEMORY, "prefill: out of memory");
    Nibbler__V1__PrefillItem *items = (void *)mem;
    Nibbler__V1__PrefillItem **ptrs = (void *)(items + n);
    for (size_t i = 0; i < n; i++) {
        nibbler__v1__prefill_item__init(&items[i]);
        items[i].seq_id = seq_ids[i];
        items[i].n_tokens = lens[i];
        items[i].tokens = (uint32_t *)tokens[i];
        ptrs[i] = &items[i];
    }
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Prefill pf = NIBBLER__V1__PREFILL__INIT;
    pf.n_items = n;
    pf.items = ptrs;
    pf.return_logprobs = logprobs;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_PREFILL;
    req.prefill = &pf;
    int rc = call_batch(c, &req, out);
    free(mem);
    return rc;
}

int nb_client_draft(nb_client *c, size_t n, const uint64_t *seq_ids, uint32_t gamma,
                    nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Draft d = NIBBLER__V1__DRAFT__INIT;
    d.n_seq_ids = n;
    d.seq_ids = (uint64_t *)seq_ids;
    d.gamma = gamma;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_DRAFT;
    req.draft = &d;
    return call_batch(c, &req, out);
}

int nb_client_verify(nb_client *c, size_t n, const uint64_t *seq_ids, bool logprobs,
                     nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Verify v = NIBBLER__V1__VERIFY__INIT;
    v.n_seq_ids = n;
    v.seq_ids = (uint64_t *)seq_ids;
    v.return_logprobs = logprobs;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_VERIFY;
    req.verify = &v;
    return call_batch(c, &req, out);
}

int nb_client_speculate(nb_client *c, size_t n, const uint64_t *seq_ids, uint32_t gamma,
                        bool logprobs, nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Speculate s = NIBBLER__V1__SPECULATE__INIT;
    s.n_seq_ids = n;
    s.seq_ids = (uint64_t *)seq_ids;
    s.gamma = gamma;
    s.return_logprobs = logprobs;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_SPECULATE;
    req.speculate = &s;
    return call_batch(c, &req, out);
}

int nb_client_decode(nb_client *c, size_t n, const uint64_t *seq_ids, uint32_t steps,
                     bool logprobs, nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Decode d = NIBBLER__V1__DECODE__INIT;
    d.n_seq_ids = n;
    d.seq_ids = (uint64_t *)seq_ids;
    d.n = steps;
    d.return_logprobs = logprobs;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_DECODE;
    req.decode = &d;
    return call_batch(c, &req, out);
}

int nb_client_rollback(nb_client *c, size_t n, const uint64_t *seq_ids,
                       const uint32_t *n_tokens, nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    if (n && (!seq_ids || !n_tokens))
        return fail(c, NB_CLIENT_ERR_INVALID_ARG, "rollback: NULL argument");
    size_t each = sizeof(Nibbler__V1__RollbackItem) + sizeof(Nibbler__V1__RollbackItem *);
    unsigned char *mem = malloc(n ? n * each : 1);
    if (!mem) return fail(c, NB_CLIENT_ERR_OUT_OF_MEMORY, "rollback: out of memory");
    Nibbler__V1__RollbackItem *items = (void *)mem;
    Nibbler__V1__RollbackItem **ptrs = (void *)(items + n);
    for (size_t i = 0; i < n; i++) {
        nibbler__v1__rollback_item__init(&items[i]);
        items[i].seq_id = seq_ids[i];
        items[i].n_tokens = n_tokens[i];
        ptrs[i] = &items[i];
    }
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Rollback r = NIBBLER__V1__ROLLBACK__INIT;
    r.n_items = n;
    r.items = ptrs;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_ROLLBACK;
    req.rollback = &r;
    int rc = call_batch(c, &req, out);
    free(mem);
    return rc;
}

int nb_client_free(nb_client *c, size_t n, const uint64_t *seq_ids, nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Free f = NIBBLER__V1__FREE__INIT;
    f.n_seq_ids = n;
    f.seq_ids = (uint64_t *)seq_ids;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_FREE;
    req.free = &f;
    return call_batch(c, &req, out);
}

int nb_client_fork(nb_client *c, uint64_t parent_id, uint64_t child_id,
                   const nb_client_seq_spec *spec, nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Fork f = NIBBLER__V1__FORK__INIT;
    Nibbler__V1__SamplingParams sp;
    Nibbler__V1__StopConditions stop;
    f.parent_id = parent_id;
    f.child_id = child_id;
    if (spec) {
        spec_to_proto(spec, &sp, &stop);
        f.sampling = &sp;
        f.stop = &stop;
    }
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_FORK;
    req.fork = &f;
    return call_batch(c, &req, out);
}

int nb_client_stats(nb_client *c, nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Stats s = NIBBLER__V1__STATS__INIT;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_STATS;
    req.stats = &s;
    return call_result(c, &req, NIBBLER__V1__RESPONSE__RESULT_STATS, out);
}

int nb_client_health(nb_client *c, nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Health h = NIBBLER__V1__HEALTH__INIT;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_HEALTH;
    req.health = &h;
    return call_result(c, &req, NIBBLER__V1__RESPONSE__RESULT_HEALTH, out);
}

int nb_client_drain(nb_client *c, nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Drain d = NIBBLER__V1__DRAIN__INIT;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_DRAIN;
    req.drain = &d;
    return call_result(c, &req, NIBBLER__V1__RESPONSE__RESULT__NOT_SET, out);
}

int nb_client_shutdown(nb_client *c, nb_client_response **out) {
    if (out) *out = NULL;
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    Nibbler__V1__Request req = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Shutdown s = NIBBLER__V1__SHUTDOWN__INIT;
    req.command_case = NIBBLER__V1__REQUEST__COMMAND_SHUTDOWN;
    req.shutdown = &s;
    return call_result(c, &req, NIBBLER__V1__RESPONSE__RESULT__NOT_SET, out);
}

// ---------------------------------------------------------------- generation

nb_client_gen_params nb_client_gen_default_params(void) {
    return (nb_client_gen_params){
        .mode = NB_CLIENT_MODE_SPEC,
        .gamma = 4,
        .decode_steps = 1,
        .max_tokens = 64,
        .top_p = 1.0f,
    };
}

void nb_client_gen_result_clear(nb_client_gen_result *r) {
    if (!r) return;
    free(r->tokens);
    memset(r, 0, sizeof *r);
}

static bool is_eos(const nb_client_gen_params *p, uint32_t t) {
    for (size_t i = 0; p->eos_ids && i < p->n_eos_ids; i++)
        if (p->eos_ids[i] == t) return true;
    return false;
}

// Appends a sequence result's tokens, stopping at max_tokens or an eos id.
// Returns true when generation is over.
static bool take_tokens(const nb_client_gen_params *p, const Nibbler__V1__SequenceResult *s,
                        nb_client_gen_result *r) {
    for (size_t j = 0; j < s->n_tokens; j++) {
        if (r->n_tokens >= p->max_tokens) return true;
        r->tokens[r->n_tokens++] = s->tokens[j];
        if (is_eos(p, s->tokens[j])) {
            r->finish_reason = NIBBLER__V1__FINISH_REASON__EOS;
            return true;
        }
    }
    if (s->finish_reason != NIBBLER__V1__FINISH_REASON__NOT_FINISHED) {
        r->finish_reason = (int)s->finish_reason;
        return true;
    }
    if (r->n_tokens >= p->max_tokens) {
        r->finish_reason = NIBBLER__V1__FINISH_REASON__MAX_TOKENS;
        return true;
    }
    return false;
}

int nb_client_generate(nb_client *c, const nb_client_gen_params *p, const uint32_t *prompt,
                       size_t n_prompt, nb_client_gen_result *out) {
    if (!c) return NB_CLIENT_ERR_INVALID_ARG;
    if (!p || !out || !prompt || n_prompt == 0 || p->max_tokens == 0)
        return fail(c, NB_CLIENT_ERR_INVALID_ARG,
                    "generate: needs params, a non-empty prompt and max_tokens > 0");
    if (p->mode == NB_CLIENT_MODE_SPEC && p->gamma == 0)
        return fail(c, NB_CLIENT_ERR_INVALID_ARG, "generate: gamma must be > 0");
    memset(out, 0, sizeof *out);
    // NOTE: room for a whole last round past max_tokens: the tokens are
    // trimmed, never the reply.
    if (!(out->tokens = malloc(sizeof *out->tokens * p->max_tokens)))
        return fail(c, NB_CLIENT_ERR_OUT_OF_MEMORY, "generate: out of memory");
    uint64_t seq = p->seq_id ? p->seq_id : c->next_seq++;
    out->seq_id = seq;

    nb_client_seq_spec spec = {
        .seq_id = seq,
        .temperature = p->temperature,
        .top_k = p->top_k,
        .top_p = p->top_p,
        .seed = p->seed,
        .eos_ids = p->eos_ids,
        .n_eos_ids = p->n_eos_ids,
        .max_tokens = p->max_tokens,
    };
    int rc = nb_client_add_sequence(c, 1, &spec, NULL);
    if (rc) return rc;

    nb_client_response *resp = NULL;
    const double t0 = now_s();
    rc = nb_client_prefill(c, 1, &seq, &prompt, &n_prompt, false, &resp);
    out->prefill_s = now_s() - t0;
    bool done = false;
    if (rc == 0) {
        if (!resp->batch || resp->batch->n_seqs != 1)
            rc = fail(c, NB_CLIENT_ERR_PROTOCOL, "prefill reply has %zu sequences, expected 1",
                      resp->batch ? resp->batch->n_seqs : (size_t)0);
        else
            done = take_tokens(p, resp->batch->seqs[0], out);
    }
    nb_client_response_free(&resp);
    while (rc == 0 && !done) {
        if (p->mode == NB_CLIENT_MODE_SPEC) {
            rc = nb_client_speculate(c, 1, &seq, p->gamma, false, &resp);
        } else {
            uint32_t steps = p->decode_steps ? p->decode_steps : 1;
            uint32_t left = p->max_tokens - (uint32_t)out->n_tokens;
            rc = nb_client_decode(c, 1, &seq, steps < left ? steps : left, false, &resp);
        }
        out->n_rounds++;
        if (rc == NIBBLER__V1__CODE__FINISHED) {
            // The worker's stop condition fired on an earlier round.
            if (out->finish_reason == NIBBLER__V1__FINISH_REASON__NOT_FINISHED)
                out->finish_reason = NIBBLER__V1__FINISH_REASON__MAX_TOKENS;
            rc = 0;
            c->err[0] = '\0';
            nb_client_response_free(&resp);
            break;
        }
        if (rc == 0) {
            if (!resp->batch || resp->batch->n_seqs != 1) {
                rc = fail(c, NB_CLIENT_ERR_PROTOCOL, "reply has %zu sequences, expected 1",
                          resp->batch ? resp->batch->n_seqs : (size_t)0);
            } else {
                const Nibbler__V1__SequenceResult *s = resp->batch->seqs[0];
                out->n_drafted += s->n_drafted;
                out->n_accepted += s->n_accepted;
                done = take_tokens(p, s, out);
            }
        }
        nb_client_response_free(&resp);
    }
    out->elapsed_s = now_s() - t0;
    if (!p->keep_sequence) {
        char keep[sizeof c->err];
        memcpy(keep, c->err, sizeof keep);
        int frc = nb_client_free(c, 1, &seq, NULL);
        if (rc == 0)
            rc = frc;
        else
            memcpy(c->err, keep, sizeof keep); // the first error is the one to report
    }
    return rc;
}
