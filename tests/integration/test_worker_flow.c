// test_worker_flow.c: the worker end to end, over ipc and tcp loopback.
// - greedy speculative generation (Speculate loop) emits exactly the tokens
//   of greedy target-only Decode;
// - stop conditions (eos, max_tokens) cut results and answer FINISHED;
// - Fork and Rollback continue exactly; several clients at once get their
//   own replies; thousands of sequences added and freed leave the block
//   counts where they started; Drain refuses new work and exits 0 when the
//   last sequence is freed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "worker_harness.h"

#define NGEN 48

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

static uint32_t g_prompt[9] = {1, 403, 407, 280, 261, 312, 270, 292, 269};
#define PLEN 9

static Nibbler__V1__Response *add_prefill(void *c, uint64_t id, Nibbler__V1__StopConditions *sc) {
    Nibbler__V1__Response *r = wh_add(c, &id, 1, 0.0f, sc);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK);
    wh_free(&r);
    r = wh_prefill1(c, id, g_prompt, PLEN);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK);
    return r;
}

static void flow(void *ctx, const char *ep) {
    void *c = wh_client(ctx, ep, 60000);
    Nibbler__V1__Response *r = wh_hello(c);
    uint32_t vocab = r->hello->model->vocab_size;
    for (int i = 0; i < PLEN; i++) g_prompt[i] %= vocab;
    wh_free(&r);

    // target-only reference
    uint32_t ar[NGEN + 1];
    r = add_prefill(c, 1, NULL);
    ar[0] = r->batch->seqs[0]->tokens[0];
    wh_free(&r);
    uint64_t one = 1;
    r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_DECODE, &one, 1, NGEN);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK && r->batch->seqs[0]->n_tokens == NGEN);
    memcpy(ar + 1, r->batch->seqs[0]->tokens, NGEN * sizeof(uint32_t));
    CHECK(r->batch->seqs[0]->n_context == PLEN + NGEN);
    wh_free(&r);

    // speculative
    uint32_t sp[NGEN + 16];
    size_t n = 0, drafted = 0, accepted = 0;
    r = add_prefill(c, 2, NULL);
    sp[n++] = r->batch->seqs[0]->tokens[0];
    wh_free(&r);
    uint64_t two = 2;
    while (n < NGEN + 1) {
        r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_SPECULATE, &two, 1, 4);
        if (wh_seq_code(r, 0) != NIBBLER__V1__CODE__OK) {
            CHECK(!"speculate failed");
            wh_free(&r);
            break;
        }
        const Nibbler__V1__SequenceResult *s = r->batch->seqs[0];
        for (size_t j = 0; j < s->n_tokens && n < NGEN + 16; j++) sp[n++] = s->tokens[j];
        drafted += s->n_drafted;
        accepted += s->n_accepted;
        CHECK(s->n_tokens == s->n_accepted + 1 && s->n_drafted == 4);
        wh_free(&r);
    }
    CHECKF(memcmp(sp, ar, sizeof(ar)) == 0, "%s: speculative tokens differ from target-only", ep);
    printf("%s: speculate drafted %zu accepted %zu (%.0f%%)\n", ep, drafted, accepted,
           drafted ? 100.0 * accepted / drafted : 0.0);

    // eos stop: the first generated token that did not appear before
    int k = 3;
    Nibbler__V1__StopConditions sc = NIBBLER__V1__STOP_CONDITIONS__INIT;
    uint32_t eos = ar[k];
    for (int j = 0; j < k; j++)
        if (ar[j] == eos) k = j;
    sc.eos_ids = &eos;
    sc.n_eos_ids = 1;
    r = add_prefill(c, 3, &sc);
    wh_free(&r);
    uint64_t three = 3;
    if (k == 0) {
        CHECK(1); // the first token is the eos: the prefill already finished it
    } else {
        r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_DECODE, &three, 1, 20);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK);
        if (wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK) {
            CHECKF(r->batch->seqs[0]->n_tokens == (size_t)k, "eos stop after %zu tokens, want %d",
                   r->batch->seqs[0]->n_tokens, k);
            CHECK(r->batch->seqs[0]->finish_reason == NIBBLER__V1__FINISH_REASON__EOS);
            CHECK(r->batch->seqs[0]->n_context == PLEN + (uint32_t)k);
        }
        wh_free(&r);
    }
    r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_DECODE, &three, 1, 1);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__FINISHED);
    wh_free(&r);
    // max_tokens with speculation: exactly 5 tokens, then FINISHED
    Nibbler__V1__StopConditions mt = NIBBLER__V1__STOP_CONDITIONS__INIT;
    mt.max_tokens = 5;
    r = add_prefill(c, 4, &mt);
    wh_free(&r);
    uint64_t four = 4;
    size_t got = 1;
    for (int it = 0; it < 10; it++) {
        r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_SPECULATE, &four, 1, 3);
        Nibbler__V1__Code sc4 = wh_seq_code(r, 0);
        if (sc4 == NIBBLER__V1__CODE__OK) {
            for (size_t j = 0; j < r->batch->seqs[0]->n_tokens; j++)
                CHECK(r->batch->seqs[0]->tokens[j] == ar[got + j]);
            got += r->batch->seqs[0]->n_tokens;
            if (r->batch->seqs[0]->finish_reason == NIBBLER__V1__FINISH_REASON__MAX_TOKENS)
                CHECK(r->batch->seqs[0]->n_context == PLEN + 4);
        }
        wh_free(&r);
        if (sc4 == NIBBLER__V1__CODE__FINISHED) break;
    }
    CHECKF(got == 5, "max_tokens 5 gave %zu tokens", got);
    // Rollback clears FINISHED and continues exactly
    r = wh_rollback1(c, 4, PLEN + 2);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK);
    wh_free(&r);
    r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_DECODE, &four, 1, 1);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK && r->batch->seqs[0]->tokens[0] == ar[3]);
    wh_free(&r);

    // Fork of sequence 1 and rollback of sequence 1: both continue exactly
    Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Fork f = NIBBLER__V1__FORK__INIT;
    r = wh_rollback1(c, 1, PLEN + 20);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK && r->batch->seqs[0]->n_context == PLEN + 20);
    wh_free(&r);
    f.parent_id = 1;
    f.child_id = 5;
    q.id = 55;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_FORK;
    q.fork = &f;
    r = wh_call(c, &q);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK && r->batch->seqs[0]->n_context == PLEN + 20);
    wh_free(&r);
    uint64_t fk[2] = {1, 5};
    r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_DECODE, fk, 2, 10);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK && wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK);
    if (wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK)
        for (int j = 0; j < 10; j++)
            CHECK(r->batch->seqs[0]->tokens[j] == ar[21 + j] && r->batch->seqs[1]->tokens[j] == ar[21 + j]);
    wh_free(&r);

    // Several clients at once: every client sends, then every client receives.
    enum { NC = 4 };
    void *cs[NC];
    for (int i = 0; i < NC; i++) cs[i] = wh_client(ctx, ep, 60000);
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < NC; i++) {
            Nibbler__V1__Request hq = NIBBLER__V1__REQUEST__INIT;
            Nibbler__V1__Health h = NIBBLER__V1__HEALTH__INIT;
            hq.id = (uint64_t)(i * 100 + round);
            hq.command_case = NIBBLER__V1__REQUEST__COMMAND_HEALTH;
            hq.health = &h;
            uint8_t *buf = NULL;
            size_t cap = 0, len = 0;
            nb_proto_pack(&hq.base, &buf, &cap, &len);
            wh_send_raw(cs[i], buf, len);
            wh_send_raw(cs[i], buf, len); // two in flight: answered in order
            free(buf);
        }
        for (int i = 0; i < NC; i++)
            for (int t = 0; t < 2; t++) {
                r = wh_recv(cs[i]);
                CHECK(r && r->id == (uint64_t)(i * 100 + round));
                wh_free(&r);
            }
    }
    for (int i = 0; i < NC; i++) zmq_close(cs[i]);

    // Thousands of sequences added and freed: block counts return.
    uint64_t rest[4] = {1, 2, 4, 5};
    r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_FREE, rest, 4, 0);
    wh_free(&r);
    r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_FREE, &three, 1, 0);
    wh_free(&r);
    r = wh_simple(c, NIBBLER__V1__REQUEST__COMMAND_STATS);
    uint32_t q0 = r->stats->cache->qblocks_free, f0 = r->stats->cache->fpblocks_free;
    CHECK(r->stats->n_seqs == 0);
    wh_free(&r);
    for (int b = 0; b < 2000 / 16; b++) {
        uint64_t ids[16];
        uint32_t *pp[16];
        size_t pl[16];
        for (int i = 0; i < 16; i++) {
            ids[i] = 10000 + (uint64_t)b * 16 + (uint64_t)i;
            pp[i] = g_prompt;
            pl[i] = 3 + (size_t)(i % 6);
        }
        r = wh_add(c, ids, 16, 0.0f, NULL);
        CHECK(wh_seq_code(r, 15) == NIBBLER__V1__CODE__OK);
        wh_free(&r);
        r = wh_prefill(c, ids, 16, pp, pl);
        CHECK(wh_seq_code(r, 15) == NIBBLER__V1__CODE__OK);
        wh_free(&r);
        r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_FREE, ids, 16, 0);
        CHECK(wh_seq_code(r, 15) == NIBBLER__V1__CODE__OK);
        wh_free(&r);
    }
    r = wh_simple(c, NIBBLER__V1__REQUEST__COMMAND_STATS);
    CHECK(r->stats->n_seqs == 0 && r->stats->cache->qblocks_free == q0 &&
          r->stats->cache->fpblocks_free == f0);
    CHECK(r->stats->tokens_generated > 2000 && r->stats->tokens_per_s > 0);
    CHECK(r->stats->acceptance_rate > 0 && r->stats->acceptance_rate <= 1);
    wh_free(&r);

    // Drain: new work refused, old work served, exit when the last is freed.
    r = add_prefill(c, 9, NULL);
    wh_free(&r);
    r = wh_simple(c, NIBBLER__V1__REQUEST__COMMAND_DRAIN);
    CHECK(wh_code(r) == NIBBLER__V1__CODE__OK && r->health->draining);
    wh_free(&r);
    r = wh_add1(c, 10);
    CHECK(wh_code(r) == NIBBLER__V1__CODE__DRAINING);
    wh_free(&r);
    uint64_t nine = 9;
    r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_DECODE, &nine, 1, 3);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK);
    wh_free(&r);
    r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_FREE, &nine, 1, 0);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK);
    wh_free(&r);
    zmq_close(c);
}

int main(void) {
    const char *model = wh_model_or_skip("test_worker_flow");
    void *ctx = zmq_ctx_new();
    for (int t = 0; t < 2; t++) {
        wh_worker w;
        char tcp[64];
        snprintf(tcp, sizeof(tcp), "tcp://127.0.0.1:%d", free_port());
        const char *args[] = {"--model", model, "--endpoint", t ? tcp : "{EP}", "--group-size", "32",
                              "--max-gamma", "4", NULL};
        if (!wh_spawn(&w, args)) return 1;
        const char *ep = t ? tcp : w.endpoint;
        // wait for Hello
        bool up = false;
        double t0 = wh_now();
        while (!up && wh_now() - t0 < 60 && !wh_wait(&w, 0.0)) {
            void *c = wh_client(ctx, ep, 500);
            Nibbler__V1__Response *r = wh_hello(c);
            up = wh_code(r) == NIBBLER__V1__CODE__OK;
            CHECK(!up || wh_backend_ok(r));
            wh_free(&r);
            zmq_close(c);
        }
        CHECK(up);
        if (up) flow(ctx, ep);
        CHECKF(wh_wait(&w, 10.0) && w.exit_status == 0, "%s: drained worker exit %d", ep, w.exit_status);
        wh_stop(&w);
    }
    zmq_ctx_term(ctx);
    return nb_test_finish("test_worker_flow");
}
