// test_worker_sigterm.c: SIGTERM while a long Decode runs: the Decode is
// finished and answered in full, then the worker exits 0.
#include "worker_harness.h"

int main(void) {
    const char *model = wh_model_or_skip("test_worker_sigterm");
    void *ctx = zmq_ctx_new();
    wh_worker w;
    const char *args[] = {"--model", model, "--endpoint", "{EP}", "--max-seqs", "16", NULL};
    if (!wh_start(&w, ctx, args)) return 1;
    void *c = wh_client(ctx, w.endpoint, 120000);
    Nibbler__V1__Response *r = wh_hello(c);
    uint32_t max_ctx = r->hello->model->max_context;
    wh_free(&r);
    uint64_t ids[16];
    uint32_t p[16][4], *pp[16];
    size_t pl[16];
    for (int i = 0; i < 16; i++) {
        ids[i] = 100 + (uint64_t)i;
        for (int j = 0; j < 4; j++) p[i][j] = 1 + (uint32_t)(i * 7 + j * 3);
        pp[i] = p[i];
        pl[i] = 4;
    }
    r = wh_add(c, ids, 16, 0.0f, NULL);
    wh_free(&r);
    r = wh_prefill(c, ids, 16, pp, pl);
    CHECK(wh_seq_code(r, 15) == NIBBLER__V1__CODE__OK);
    wh_free(&r);
    // Time a short decode to size the long one (>= ~1 s of work).
    double t0 = wh_now();
    r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_DECODE, ids, 16, 8);
    double per_step = (wh_now() - t0) / 8;
    wh_free(&r);
    // ~1.5 s of work at the measured rate (steps get slower as contexts grow).
    double want = per_step > 0 ? 1.5 / per_step : 1e9;
    uint32_t n = max_ctx - 4 - 8 - 2;
    if (n > 480) n = 480;
    if (want < n) n = want < 50 ? 50 : (uint32_t)want;
    printf("decode step of 16 sequences: %.2f ms; long decode: %u steps (~%.2f s)\n",
           per_step * 1e3, n, per_step * n);

    Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Decode d = NIBBLER__V1__DECODE__INIT;
    d.seq_ids = ids;
    d.n_seq_ids = 16;
    d.n = n;
    q.id = 4242;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_DECODE;
    q.decode = &d;
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    nb_proto_pack(&q.base, &buf, &cap, &len);
    wh_send_raw(c, buf, len);
    free(buf);
    double wait = per_step * n * 0.3;
    if (wait > 0.5) wait = 0.5;
    usleep((useconds_t)(wait * 1e6));
    double t_sig = wh_now();
    kill(w.pid, SIGTERM);
    r = wh_recv(c);
    double t_reply = wh_now();
    CHECKF(r != NULL && r->id == 4242, "no reply to the decode in flight");
    if (r && wh_code(r) == NIBBLER__V1__CODE__OK) {
        for (int i = 0; i < 16; i++)
            CHECKF(wh_seq_code(r, (size_t)i) == NIBBLER__V1__CODE__OK &&
                       r->batch->seqs[i]->n_tokens == n,
                   "sequence %d: %zu tokens", i, r->batch->seqs[i]->n_tokens);
    }
    printf("SIGTERM %.0f ms before the reply\n", (t_reply - t_sig) * 1e3);
    if (t_reply - t_sig < 0.01)
        printf("NOTE: the decode may have finished before the signal (machine too fast)\n");
    wh_free(&r);
    CHECK(wh_wait(&w, 30.0));
    CHECKF(w.exit_status == 0, "exit status %d", w.exit_status);
    CHECK(wh_log_contains(&w, "signal received"));
    zmq_close(c);
    wh_stop(&w);
    zmq_ctx_term(ctx);
    return nb_test_finish("test_worker_sigterm");
}
