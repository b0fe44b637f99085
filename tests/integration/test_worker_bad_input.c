// test_worker_bad_input.c: every kind of bad input a client can send gets a
// clear error reply, and a good request right after it succeeds: the worker
// keeps serving and no other sequence is touched.
#include "worker_harness.h"

static void *g_c; // the main client
static uint32_t g_vocab, g_max_ctx, g_max_gamma;

// The good request after each bad one: a Decode step on sequence 1, whose
// tokens must equal those of a twin sequence 2 decoded in lock-step.
static void good_request(const char *after) {
    uint64_t ids[2] = {1, 2};
    Nibbler__V1__Response *r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_DECODE, ids, 2, 1);
    CHECKF(wh_code(r) == NIBBLER__V1__CODE__OK, "good request after %s", after);
    CHECKF(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK && wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK,
           "good request after %s: per-sequence status", after);
    if (wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK)
        CHECKF(r->batch->seqs[0]->n_tokens == 1 && r->batch->seqs[1]->n_tokens == 1 &&
                   r->batch->seqs[0]->tokens[0] == r->batch->seqs[1]->tokens[0],
               "after %s, sequences 1 and 2 diverged", after);
    wh_free(&r);
}

static void expect_request_code(Nibbler__V1__Response *r, Nibbler__V1__Code want, const char *what) {
    CHECKF(r != NULL, "%s: no reply", what);
    CHECKF(wh_code(r) == want, "%s: got %s, want %s (%s)", what,
           nb_proto_code_name(wh_code(r)), nb_proto_code_name(want),
           r && r->status ? r->status->message : "");
    if (r && r->status && want != NIBBLER__V1__CODE__OK)
        CHECKF(r->status->message && strlen(r->status->message) > 5, "%s: no message", what);
}

int main(void) {
    const char *model = wh_model_or_skip("test_worker_bad_input");
    void *ctx = zmq_ctx_new();
    wh_worker w;
    const char *args[] = {"--model", model, "--endpoint", "{EP}", "--max-message-bytes", "65536",
                          "--max-seqs", "8", "--max-gamma", "6", "--log-level", "info", NULL};
    if (!wh_start(&w, ctx, args)) return 1;
    g_c = wh_client(ctx, w.endpoint, 30000);

    Nibbler__V1__Response *r = wh_hello(g_c);
    expect_request_code(r, NIBBLER__V1__CODE__OK, "hello");
    if (!r || r->result_case != NIBBLER__V1__RESPONSE__RESULT_HELLO) return 1;
    g_vocab = r->hello->model->vocab_size;
    g_max_ctx = r->hello->model->max_context;
    g_max_gamma = r->hello->limits->max_gamma;
    CHECK(r->hello->protocol_version == 1 && g_max_gamma == 6 && r->hello->limits->max_batch == 8);
    CHECK(r->hello->limits->max_message_bytes == 65536);
    wh_free(&r);

    // Two twin sequences that every good request advances in lock-step.
    uint64_t twins[2] = {1, 2};
    r = wh_add(g_c, twins, 2, 0.0f, NULL);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK && wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK);
    wh_free(&r);
    uint32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = (uint32_t)(1 + (i * 37) % (g_vocab - 1));
    uint32_t *pp[2] = {prompt, prompt};
    size_t pl[2] = {12, 12};
    r = wh_prefill(g_c, twins, 2, pp, pl);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK && wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK);
    wh_free(&r);
    good_request("setup");

    // 1. malformed bytes
    {
        const uint8_t junk[] = {0x08, 0x2a, 0xff, 0xff, 0xff, 0xff, 0x0f};
        wh_send_raw(g_c, junk, sizeof(junk));
        r = wh_recv(g_c);
        expect_request_code(r, NIBBLER__V1__CODE__MALFORMED, "malformed bytes");
        CHECKF(r && r->id == 42, "malformed bytes: the id is read from the prefix");
        wh_free(&r);
        good_request("malformed bytes");
    }
    // 2a. a Request with no command
    {
        Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
        q.id = 77;
        r = wh_call(g_c, &q);
        expect_request_code(r, NIBBLER__V1__CODE__UNKNOWN_COMMAND, "no command");
        CHECK(r && r->id == 77);
        wh_free(&r);
        good_request("no command");
    }
    // 2b. an unknown field number (a command from a future version: field 99)
    {
        const uint8_t fut[] = {0x08, 0x4e, 0x9a, 0x06, 0x00};
        wh_send_raw(g_c, fut, sizeof(fut));
        r = wh_recv(g_c);
        expect_request_code(r, NIBBLER__V1__CODE__UNKNOWN_COMMAND, "unknown field");
        CHECK(r && r->id == 78);
        wh_free(&r);
        good_request("unknown field");
    }
    // 3. wrong version, in the Request and in Hello
    {
        Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
        Nibbler__V1__Health h = NIBBLER__V1__HEALTH__INIT;
        q.id = 5;
        q.protocol_version = 7;
        q.command_case = NIBBLER__V1__REQUEST__COMMAND_HEALTH;
        q.health = &h;
        r = wh_call(g_c, &q);
        expect_request_code(r, NIBBLER__V1__CODE__UNSUPPORTED_VERSION, "request version 7");
        wh_free(&r);
        Nibbler__V1__Hello he = NIBBLER__V1__HELLO__INIT;
        he.protocol_version = 2;
        q.protocol_version = 0;
        q.command_case = NIBBLER__V1__REQUEST__COMMAND_HELLO;
        q.hello = &he;
        r = wh_call(g_c, &q);
        expect_request_code(r, NIBBLER__V1__CODE__UNSUPPORTED_VERSION, "hello version 2");
        wh_free(&r);
        good_request("wrong version");
    }
    // 4. unknown sequence id: per-sequence NOT_FOUND, the other sequence runs
    {
        uint64_t ids[2] = {999, 1};
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_DECODE, ids, 2, 1);
        expect_request_code(r, NIBBLER__V1__CODE__OK, "unknown id (request)");
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__NOT_FOUND);
        CHECK(wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK);
        wh_free(&r);
        // keep the twins in step
        uint64_t two = 2;
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_DECODE, &two, 1, 1);
        wh_free(&r);
        uint64_t gone = 12345;
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_FREE, &gone, 1, 0);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__NOT_FOUND);
        wh_free(&r);
        r = wh_rollback1(g_c, gone, 0);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__NOT_FOUND);
        wh_free(&r);
        good_request("unknown id");
    }
    // 5. duplicate sequence ids: in use, twice in one command, fork onto a live id
    {
        r = wh_add1(g_c, 1);
        expect_request_code(r, NIBBLER__V1__CODE__OK, "duplicate add (request)");
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__ALREADY_EXISTS);
        wh_free(&r);
        uint64_t dup[2] = {30, 30};
        r = wh_add(g_c, dup, 2, 0.0f, NULL);
        expect_request_code(r, NIBBLER__V1__CODE__INVALID_ARGUMENT, "id twice in one add");
        wh_free(&r);
        uint64_t dup2[3] = {1, 2, 1};
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_DECODE, dup2, 3, 1);
        expect_request_code(r, NIBBLER__V1__CODE__INVALID_ARGUMENT, "id twice in one decode");
        wh_free(&r);
        Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
        Nibbler__V1__Fork f = NIBBLER__V1__FORK__INIT;
        f.parent_id = 1;
        f.child_id = 2;
        q.id = 9;
        q.command_case = NIBBLER__V1__REQUEST__COMMAND_FORK;
        q.fork = &f;
        r = wh_call(g_c, &q);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__ALREADY_EXISTS);
        wh_free(&r);
        good_request("duplicate id");
    }
    // 6. token id outside the vocabulary (prompt and eos list)
    {
        r = wh_add1(g_c, 40);
        wh_free(&r);
        uint32_t bad[3] = {1, g_vocab, 2};
        r = wh_prefill1(g_c, 40, bad, 3);
        expect_request_code(r, NIBBLER__V1__CODE__INVALID_ARGUMENT, "token outside the vocabulary");
        CHECK(r && strstr(r->status->message, "vocabulary"));
        wh_free(&r);
        Nibbler__V1__StopConditions sc = NIBBLER__V1__STOP_CONDITIONS__INIT;
        uint32_t eos = g_vocab + 5;
        sc.eos_ids = &eos;
        sc.n_eos_ids = 1;
        uint64_t id41 = 41;
        r = wh_add(g_c, &id41, 1, 0.0f, &sc);
        expect_request_code(r, NIBBLER__V1__CODE__INVALID_ARGUMENT, "eos outside the vocabulary");
        wh_free(&r);
        bad[1] = 3;
        r = wh_prefill1(g_c, 40, bad, 3);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK);
        wh_free(&r);
        good_request("token outside the vocabulary");
    }
    // 7. context over the limit: a prompt longer than max_context, then a
    // sequence that decodes into the limit
    {
        size_t n = g_max_ctx + 1;
        uint32_t *big = calloc(n, sizeof(uint32_t));
        for (size_t i = 0; i < n; i++) big[i] = 1 + (uint32_t)(i % 7);
        r = wh_prefill1(g_c, 40, big, n);
        expect_request_code(r, NIBBLER__V1__CODE__CONTEXT_TOO_LONG, "prompt over max_context");
        wh_free(&r);
        // sequence 40 has 3 tokens; add max_ctx - 5 more -> committed max_ctx - 2
        r = wh_prefill1(g_c, 40, big, g_max_ctx - 5);
        CHECKF(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK, "near-full prefill: %s",
               r ? (r->status->code ? r->status->message : r->batch->seqs[0]->status->message) : "");
        wh_free(&r);
        uint64_t id40 = 40;
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_DECODE, &id40, 1, 10);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__CONTEXT_TOO_LONG);
        if (wh_seq_code(r, 0) == NIBBLER__V1__CODE__CONTEXT_TOO_LONG)
            CHECKF(r->batch->seqs[0]->n_tokens == 1, "decode into the limit made %zu tokens",
                   r->batch->seqs[0]->n_tokens);
        wh_free(&r);
        r = wh_prefill1(g_c, 40, big, 5);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__CONTEXT_TOO_LONG);
        wh_free(&r);
        free(big);
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_FREE, &id40, 1, 0);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK);
        wh_free(&r);
        good_request("context over the limit");
    }
    // 8. gamma out of range: 0 and max + 1, Draft and Speculate; decode n 0
    {
        uint64_t one = 1;
        uint32_t gs[2] = {0, g_max_gamma + 1};
        for (int i = 0; i < 2; i++) {
            r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_SPECULATE, &one, 1, gs[i]);
            expect_request_code(r, NIBBLER__V1__CODE__INVALID_ARGUMENT, "speculate gamma");
            wh_free(&r);
            r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_DRAFT, &one, 1, gs[i]);
            expect_request_code(r, NIBBLER__V1__CODE__INVALID_ARGUMENT, "draft gamma");
            wh_free(&r);
        }
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_DECODE, &one, 1, 0);
        expect_request_code(r, NIBBLER__V1__CODE__INVALID_ARGUMENT, "decode n 0");
        wh_free(&r);
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_DECODE, &one, 0, 1);
        expect_request_code(r, NIBBLER__V1__CODE__INVALID_ARGUMENT, "empty batch");
        wh_free(&r);
        good_request("gamma out of range");
    }
    // 9. oversize: above --max-message-bytes (answered), above ZMQ_MAXMSGSIZE
    // (the connection is dropped by ZeroMQ; the worker keeps serving)
    {
        size_t n = 70000;
        uint8_t *big = calloc(1, 400000);
        big[0] = 0x08;
        big[1] = 0x63; // id 99
        r = NULL;
        wh_send_raw(g_c, big, n);
        r = wh_recv(g_c);
        expect_request_code(r, NIBBLER__V1__CODE__MESSAGE_TOO_LARGE, "over --max-message-bytes");
        CHECK(r && r->id == 99);
        wh_free(&r);
        good_request("over --max-message-bytes");
        void *c2 = wh_client(ctx, w.endpoint, 1000);
        wh_send_raw(c2, big, 400000);
        r = wh_recv(c2);
        CHECKF(r == NULL, "a message over ZMQ_MAXMSGSIZE got an answer");
        wh_free(&r);
        zmq_close(c2);
        free(big);
        good_request("over ZMQ_MAXMSGSIZE");
    }
    // 10. verify without drafts; decode before prefill; rollback past the end
    {
        uint64_t one = 1;
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_VERIFY, &one, 1, 0);
        expect_request_code(r, NIBBLER__V1__CODE__OK, "verify without drafts (request)");
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__BAD_STATE);
        wh_free(&r);
        r = wh_add1(g_c, 50);
        wh_free(&r);
        uint64_t id50 = 50;
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_DECODE, &id50, 1, 1);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__BAD_STATE);
        wh_free(&r);
        r = wh_rollback1(g_c, 1, 100000);
        expect_request_code(r, NIBBLER__V1__CODE__INVALID_ARGUMENT, "rollback past max_context");
        wh_free(&r);
        r = wh_rollback1(g_c, 50, 3);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__INVALID_ARGUMENT);
        wh_free(&r);
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_FREE, &id50, 1, 0);
        wh_free(&r);
        good_request("verify without drafts");
        // the same pair drafted then verified works
        uint64_t ids[2] = {1, 2};
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_DRAFT, ids, 2, 3);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK && r->batch->seqs[0]->n_tokens == 3);
        wh_free(&r);
        r = wh_ids_cmd(g_c, NIBBLER__V1__REQUEST__COMMAND_VERIFY, ids, 2, 0);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK && wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK);
        if (wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK) {
            CHECK(r->batch->seqs[0]->n_tokens >= 1 && r->batch->seqs[0]->n_drafted == 3);
            CHECK(r->batch->seqs[0]->n_tokens == r->batch->seqs[1]->n_tokens);
        }
        wh_free(&r);
        good_request("draft + verify");
    }
    // 11. a REQ client (empty delimiter frame) is answered too
    {
        void *req = zmq_socket(ctx, ZMQ_REQ);
        int to = 5000, linger = 0;
        zmq_setsockopt(req, ZMQ_RCVTIMEO, &to, sizeof(to));
        zmq_setsockopt(req, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_connect(req, w.endpoint);
        r = wh_health(req);
        expect_request_code(r, NIBBLER__V1__CODE__OK, "REQ client");
        CHECK(r && r->result_case == NIBBLER__V1__RESPONSE__RESULT_HEALTH && r->health->serving);
        wh_free(&r);
        zmq_close(req);
    }
    // 12. a client that vanishes mid-request is harmless
    {
        void *c3 = wh_client(ctx, w.endpoint, 1000);
        uint64_t ids[2] = {1, 2};
        Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
        Nibbler__V1__Decode d = NIBBLER__V1__DECODE__INIT;
        d.seq_ids = ids;
        d.n_seq_ids = 2;
        d.n = 1;
        q.command_case = NIBBLER__V1__REQUEST__COMMAND_DECODE;
        q.decode = &d;
        uint8_t *buf = NULL;
        size_t cap = 0, len = 0;
        nb_proto_pack(&q.base, &buf, &cap, &len);
        wh_send_raw(c3, buf, len);
        free(buf);
        zmq_close(c3);
        usleep(200000);
        good_request("a vanished client");
    }
    // Stats still consistent: the errors were counted
    r = wh_simple(g_c, NIBBLER__V1__REQUEST__COMMAND_STATS);
    CHECK(r && r->result_case == NIBBLER__V1__RESPONSE__RESULT_STATS);
    if (r && r->result_case == NIBBLER__V1__RESPONSE__RESULT_STATS) {
        CHECK(r->stats->n_errors >= 15 && r->stats->n_seqs >= 2);
        CHECK(r->stats->jemalloc_allocated > 0 && r->stats->jemalloc_resident > 0);
    }
    wh_free(&r);

    r = wh_simple(g_c, NIBBLER__V1__REQUEST__COMMAND_SHUTDOWN);
    expect_request_code(r, NIBBLER__V1__CODE__OK, "shutdown");
    wh_free(&r);
    CHECK(wh_wait(&w, 10.0) && w.exit_status == 0);
    zmq_close(g_c);
    wh_stop(&w);
    zmq_ctx_term(ctx);
    return nb_test_finish("test_worker_bad_input");
}
