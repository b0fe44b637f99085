// test_client_stub.c: the C client against a scripted stub worker (a ROUTER
// thread in this process), so the client's own logic is tested without the
// real worker: id matching, stale replies after a timeout, worker and
// per-sequence status codes with their messages, the generate loop's
// trimming at max_tokens and eos, and the Free it sends at the end.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "nb_client.h"
#include "nb_status.h"
#include "nb_test.h"

static char g_endpoint[128];
static int g_frees;          // Free commands seen
static int g_stub_ready;

static Nibbler__V1__SequenceResult *seq_result(uint64_t id, int code, const char *msg) {
    Nibbler__V1__SequenceResult *s = calloc(1, sizeof *s);
    nibbler__v1__sequence_result__init(s);
    s->seq_id = id;
    s->status = calloc(1, sizeof *s->status);
    nibbler__v1__status__init(s->status);
    s->status->code = code;
    s->status->message = (char *)msg;
    return s;
}

static void free_batch(Nibbler__V1__BatchResult *b) {
    for (size_t i = 0; i < b->n_seqs; i++) {
        free(b->seqs[i]->status);
        free(b->seqs[i]->tokens);
        free(b->seqs[i]);
    }
    free(b->seqs);
}

static void *stub_main(void *arg) {
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    NB_ASSERT(zmq_bind(sock, g_endpoint) == 0);
    __atomic_store_n(&g_stub_ready, 1, __ATOMIC_RELEASE);
    bool stop = false;
    while (!stop) {
        zmq_msg_t idm, body;
        zmq_msg_init(&idm);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&idm, sock, 0) < 0) break;
        zmq_msg_recv(&body, sock, 0);
        while (zmq_msg_more(&body)) { // skip to the last frame
            zmq_msg_close(&body);
            zmq_msg_init(&body);
            zmq_msg_recv(&body, sock, 0);
        }
        Nibbler__V1__Request *req =
            nibbler__v1__request__unpack(NULL, zmq_msg_size(&body), zmq_msg_data(&body));
        NB_ASSERT(req);
        Nibbler__V1__Response resp = NIBBLER__V1__RESPONSE__INIT;
        Nibbler__V1__Status st = NIBBLER__V1__STATUS__INIT;
        Nibbler__V1__BatchResult batch = NIBBLER__V1__BATCH_RESULT__INIT;
        Nibbler__V1__HelloResult hello = NIBBLER__V1__HELLO_RESULT__INIT;
        Nibbler__V1__ModelInfo mi = NIBBLER__V1__MODEL_INFO__INIT;
        Nibbler__V1__HealthResult health = NIBBLER__V1__HEALTH_RESULT__INIT;
        Nibbler__V1__StatsResult stats = NIBBLER__V1__STATS_RESULT__INIT;
        uint32_t eos[1] = {2};
        resp.id = req->id;
        resp.status = &st;
        switch (req->command_case) {
        case NIBBLER__V1__REQUEST__COMMAND_HELLO:
            mi.name = "stub";
            mi.vocab_size = 100;
            mi.bos_id = 1;
            mi.n_eos_ids = 1;
            mi.eos_ids = eos;
            hello.protocol_version = 1;
            hello.model = &mi;
            resp.result_case = NIBBLER__V1__RESPONSE__RESULT_HELLO;
            resp.hello = &hello;
            break;
        case NIBBLER__V1__REQUEST__COMMAND_ADD_SEQUENCE: {
            Nibbler__V1__AddSequence *a = req->add_sequence;
            batch.n_seqs = a->n_seqs;
            batch.seqs = calloc(a->n_seqs, sizeof *batch.seqs);
            for (size_t i = 0; i < a->n_seqs; i++) {
                bool dup = a->seqs[i]->seq_id == 666;
                batch.seqs[i] = seq_result(a->seqs[i]->seq_id,
                                           dup ? NIBBLER__V1__CODE__ALREADY_EXISTS : 0,
                                           dup ? "sequence 666 exists" : "");
            }
            resp.result_case = NIBBLER__V1__RESPONSE__RESULT_BATCH;
            resp.batch = &batch;
            break;
        }
        case NIBBLER__V1__REQUEST__COMMAND_PREFILL:
        case NIBBLER__V1__REQUEST__COMMAND_SPECULATE:
        case NIBBLER__V1__REQUEST__COMMAND_DECODE:
        case NIBBLER__V1__REQUEST__COMMAND_FREE: {
            size_t n;
            const uint64_t *ids = NULL;
            const Nibbler__V1__Request *r = req;
            uint64_t one;
            if (r->command_case == NIBBLER__V1__REQUEST__COMMAND_PREFILL) {
                n = r->prefill->n_items;
                one = n ? r->prefill->items[0]->seq_id : 0;
                ids = &one;
                n = n ? 1 : 0;
            } else if (r->command_case == NIBBLER__V1__REQUEST__COMMAND_SPECULATE) {
                n = r->speculate->n_seq_ids;
                ids = r->speculate->seq_ids;
            } else if (r->command_case == NIBBLER__V1__REQUEST__COMMAND_DECODE) {
                n = r->decode->n_seq_ids;
                ids = r->decode->seq_ids;
            } else {
                n = r->free->n_seq_ids;
                ids = r->free->seq_ids;
                g_frees++;
            }
            batch.n_seqs = n;
            batch.seqs = calloc(n ? n : 1, sizeof *batch.seqs);
            for (size_t i = 0; i < n; i++) {
                Nibbler__V1__SequenceResult *s = batch.seqs[i] = seq_result(ids[i], 0, "");
                if (r->command_case == NIBBLER__V1__REQUEST__COMMAND_PREFILL) {
                    s->n_tokens = 1;
                    s->tokens = malloc(sizeof(uint32_t));
                    s->tokens[0] = 10;
                } else if (r->command_case == NIBBLER__V1__REQUEST__COMMAND_SPECULATE) {
                    // gamma drafts, gamma-1 accepted, + a correction: gamma tokens
                    uint32_t g = r->speculate->gamma;
                    s->n_tokens = g;
                    s->tokens = malloc(sizeof(uint32_t) * g);
                    for (uint32_t j = 0; j < g; j++) s->tokens[j] = 11 + j;
                    s->n_drafted = g;
                    s->n_accepted = g - 1;
                } else if (r->command_case == NIBBLER__V1__REQUEST__COMMAND_DECODE) {
                    s->n_tokens = r->decode->n;
                    s->tokens = malloc(sizeof(uint32_t) * r->decode->n);
                    for (uint32_t j = 0; j < r->decode->n; j++) s->tokens[j] = 20;
                }
            }
            resp.result_case = NIBBLER__V1__RESPONSE__RESULT_BATCH;
            resp.batch = &batch;
            break;
        }
        case NIBBLER__V1__REQUEST__COMMAND_STATS:
            usleep(300 * 1000); // past the client's timeout: this reply goes stale
            stats.n_seqs = 7;
            resp.result_case = NIBBLER__V1__RESPONSE__RESULT_STATS;
            resp.stats = &stats;
            break;
        case NIBBLER__V1__REQUEST__COMMAND_HEALTH:
            health.serving = true;
            resp.result_case = NIBBLER__V1__RESPONSE__RESULT_HEALTH;
            resp.health = &health;
            break;
        case NIBBLER__V1__REQUEST__COMMAND_DRAIN:
            st.code = NIBBLER__V1__CODE__DRAINING;
            st.message = "already draining";
            break;
        case NIBBLER__V1__REQUEST__COMMAND_SHUTDOWN: stop = true; break;
        default:
            st.code = NIBBLER__V1__CODE__UNKNOWN_COMMAND;
            st.message = "stub: not scripted";
            break;
        }
        size_t len = nibbler__v1__response__get_packed_size(&resp);
        uint8_t *buf = malloc(len ? len : 1);
        nibbler__v1__response__pack(&resp, buf);
        zmq_msg_send(&idm, sock, ZMQ_SNDMORE);
        zmq_send(sock, buf, len, 0);
        free(buf);
        if (resp.batch) free_batch(&batch);
        zmq_msg_close(&body);
        nibbler__v1__request__free_unpacked(req, NULL);
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return arg;
}

int main(void) {
    char dir[] = "/tmp/nb-client-stub-XXXXXX";
    NB_ASSERT(mkdtemp(dir));
    snprintf(g_endpoint, sizeof g_endpoint, "ipc://%s/s.sock", dir);
    pthread_t th;
    pthread_create(&th, NULL, stub_main, NULL);
    while (!__atomic_load_n(&g_stub_ready, __ATOMIC_ACQUIRE)) usleep(1000);

    char err[256];
    nb_client_params p = nb_client_default_params();
    CHECK(nb_client_new(&p, err, sizeof err) == NULL && strstr(err, "endpoint"));
    p.endpoint = g_endpoint;
    p.curve_server_key = "x";
    CHECK(nb_client_new(&p, err, sizeof err) == NULL && strstr(err, "CURVE"));
    p.curve_server_key = NULL;
    p.timeout_ms = 100;
    nb_client *c = nb_client_new(&p, err, sizeof err);
    CHECKF(c != NULL, "%s", err);

    nb_client_response *r = NULL;
    CHECK(nb_client_hello(c, &r) == 0);
    CHECK(r && r->hello && r->hello->model && r->hello->model->vocab_size == 100);
    nb_client_response_free(&r);
    CHECK(r == NULL);

    // Timeout, then the stale Stats reply is skipped by the next call.
    CHECK(nb_client_stats(c, &r) == NB_CLIENT_ERR_TIMEOUT);
    CHECK(r == NULL);
    CHECK(strstr(nb_client_error(c), "within 100 ms") != NULL);
    usleep(400 * 1000);
    CHECK(nb_client_health(c, &r) == 0);
    CHECK(r && r->result_case == NIBBLER__V1__RESPONSE__RESULT_HEALTH && r->health->serving);
    nb_client_response_free(&r);

    // A request-level worker status and its message.
    CHECK(nb_client_drain(c, &r) == NIBBLER__V1__CODE__DRAINING);
    CHECK(r != NULL);
    CHECKF(strstr(nb_client_error(c), "DRAINING: already draining") != NULL, "%s",
           nb_client_error(c));
    nb_client_response_free(&r);
    CHECK(nb_client_verify(c, 0, NULL, false, NULL) == NIBBLER__V1__CODE__UNKNOWN_COMMAND);

    // A per-sequence status: the first failing sequence's code, named.
    nb_client_seq_spec specs[2] = {{.seq_id = 5}, {.seq_id = 666}};
    CHECK(nb_client_add_sequence(c, 2, specs, &r) == NIBBLER__V1__CODE__ALREADY_EXISTS);
    CHECK(r && r->batch && r->batch->n_seqs == 2 && r->batch->seqs[0]->status->code == 0);
    CHECKF(strstr(nb_client_error(c), "seq 666: ALREADY_EXISTS: sequence 666 exists") != NULL,
           "%s", nb_client_error(c));
    nb_client_response_free(&r);
    CHECK(!strcmp(nb_client_code_str(NIBBLER__V1__CODE__NO_FREE_BLOCKS), "NO_FREE_BLOCKS"));
    CHECK(!strcmp(nb_client_code_str(NB_CLIENT_ERR_TIMEOUT), "TIMEOUT"));

    // generate: prefill [10], rounds of gamma 3 -> [11, 12, 13], trimmed.
    uint32_t prompt[3] = {1, 5, 6};
    nb_client_gen_params gp = nb_client_gen_default_params();
    gp.gamma = 3;
    gp.max_tokens = 10;
    nb_client_gen_result res;
    int frees0 = g_frees;
    CHECKF(nb_client_generate(c, &gp, prompt, 3, &res) == 0, "%s", nb_client_error(c));
    const uint32_t want[10] = {10, 11, 12, 13, 11, 12, 13, 11, 12, 13};
    CHECK(res.n_tokens == 10 && !memcmp(res.tokens, want, sizeof want));
    CHECK(res.n_drafted == 9 && res.n_accepted == 6 && res.n_rounds == 3);
    CHECK(res.finish_reason == NIBBLER__V1__FINISH_REASON__MAX_TOKENS);
    CHECK(g_frees == frees0 + 1);
    nb_client_gen_result_clear(&res);
    CHECK(res.tokens == NULL);

    gp.max_tokens = 9; // the last round is cut after 2 of its 3 tokens
    CHECK(nb_client_generate(c, &gp, prompt, 3, &res) == 0);
    CHECK(res.n_tokens == 9 && res.tokens[8] == 12);
    nb_client_gen_result_clear(&res);

    uint32_t eos = 12;
    gp.eos_ids = &eos;
    gp.n_eos_ids = 1;
    CHECK(nb_client_generate(c, &gp, prompt, 3, &res) == 0);
    CHECK(res.n_tokens == 3 && res.tokens[2] == 12);
    CHECK(res.finish_reason == NIBBLER__V1__FINISH_REASON__EOS);
    nb_client_gen_result_clear(&res);

    gp.eos_ids = NULL;
    gp.n_eos_ids = 0;
    gp.mode = NB_CLIENT_MODE_AR;
    gp.decode_steps = 4;
    gp.max_tokens = 6;
    CHECK(nb_client_generate(c, &gp, prompt, 3, &res) == 0);
    CHECK(res.n_tokens == 6 && res.tokens[0] == 10 && res.tokens[5] == 20);
    CHECK(res.n_rounds == 2 && res.n_drafted == 0); // 4 + the last 1
    nb_client_gen_result_clear(&res);
    gp.seq_id = 666; // AddSequence fails: nothing generated, the error named
    CHECK(nb_client_generate(c, &gp, prompt, 3, &res) == NIBBLER__V1__CODE__ALREADY_EXISTS);
    nb_client_gen_result_clear(&res);
    CHECK(nb_client_generate(c, &gp, prompt, 0, &res) == NB_CLIENT_ERR_INVALID_ARG);

    CHECK(nb_client_shutdown(c, NULL) == 0);
    pthread_join(th, NULL);
    // No worker now: a call times out, it does not hang.
    CHECK(nb_client_health(c, NULL) == NB_CLIENT_ERR_TIMEOUT);
    nb_client_destroy(&c);
    CHECK(c == NULL);
    nb_client_destroy(NULL);
    char sock[160];
    snprintf(sock, sizeof sock, "%s/s.sock", dir);
    unlink(sock);
    rmdir(dir);
    return nb_test_finish("test_client_stub");
}
