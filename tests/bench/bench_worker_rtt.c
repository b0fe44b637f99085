// bench_worker_rtt.c: round-trip latency of the worker protocol.
//   1. an empty command (Health) over ipc and tcp loopback: p50/p99/mean us;
//   2. a 64-sequence no-compute command (Rollback of every sequence to its
//      own length: the whole path — decode, validate, 64 map lookups, engine
//      calls, a 64-result reply — without a forward pass) over ipc;
//   3. the same command through nb_server_handle() in process: the worker's
//      host overhead per command without the socket.
// Figures only: never fails on speed. NB_BENCH_SMOKE=1 (the ctest) runs a
// short version. Usage: bench_worker_rtt [requests (default 20000)]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "server.h"
#include "worker_harness.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *us, int n) {
    qsort(us, (size_t)n, sizeof(double), cmp_d);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += us[i];
    printf("%-44s n=%6d  p50 %7.1f us  p99 %7.1f us  mean %7.1f us\n", what, n, us[n / 2],
           us[(int)(n * 0.99)], sum / n);
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

static bool wait_up(void *ctx, wh_worker *w, const char *ep) {
    double t0 = wh_now();
    while (wh_now() - t0 < 60 && !wh_wait(w, 0.0)) {
        void *c = wh_client(ctx, ep, 500);
        Nibbler__V1__Response *r = wh_hello(c);
        bool up = wh_code(r) == NIBBLER__V1__CODE__OK;
        wh_free(&r);
        zmq_close(c);
        if (up) return true;
    }
    return false;
}

// Times n sends of the packed request buf on sock.
static void time_rtt(void *sock, const uint8_t *buf, size_t len, int n, double *us) {
    for (int i = 0; i < n; i++) {
        double t0 = wh_now();
        zmq_send(sock, buf, len, 0);
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, sock, 0);
        us[i] = (wh_now() - t0) * 1e6;
        zmq_msg_close(&m);
    }
}

static uint8_t *pack(const Nibbler__V1__Request *q, size_t *len) {
    uint8_t *buf = NULL;
    size_t cap = 0;
    nb_proto_pack(&q->base, &buf, &cap, len);
    return buf;
}

#define NB 64

// The 64-item Rollback-to-same-length request for sequences 1..64 of length plen.
static uint8_t *rollback64(uint32_t plen, size_t *len) {
    static Nibbler__V1__RollbackItem it[NB], *ip[NB];
    Nibbler__V1__Rollback rb = NIBBLER__V1__ROLLBACK__INIT;
    for (int i = 0; i < NB; i++) {
        nibbler__v1__rollback_item__init(&it[i]);
        it[i].seq_id = (uint64_t)i + 1;
        it[i].n_tokens = plen;
        ip[i] = &it[i];
    }
    rb.items = ip;
    rb.n_items = NB;
    Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
    q.id = 7;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_ROLLBACK;
    q.rollback = &rb;
    return pack(&q, len);
}

static uint8_t *add_prefill64(void *c, uint32_t *prompt, uint32_t plen) {
    uint64_t ids[NB];
    uint32_t *pp[NB];
    size_t pl[NB];
    for (int i = 0; i < NB; i++) {
        ids[i] = (uint64_t)i + 1;
        pp[i] = prompt;
        pl[i] = plen;
    }
    Nibbler__V1__Response *r = wh_add(c, ids, NB, 0.0f, NULL);
    CHECK(wh_seq_code(r, NB - 1) == NIBBLER__V1__CODE__OK);
    wh_free(&r);
    r = wh_prefill(c, ids, NB, pp, pl);
    CHECK(wh_seq_code(r, NB - 1) == NIBBLER__V1__CODE__OK);
    wh_free(&r);
    return NULL;
}

int main(int argc, char **argv) {
    const char *model = wh_model_or_skip("bench_worker_rtt");
    bool smoke = getenv("NB_BENCH_SMOKE") != NULL;
    int n = argc > 1 ? atoi(argv[1]) : (smoke ? 2000 : 20000);
    if (n < 100) n = 100;
    int n64 = n / 4;
    double *us = malloc((size_t)n * sizeof(double));
    void *ctx = zmq_ctx_new();
    printf("model %s, %d requests per figure%s\n", model, n, smoke ? " (smoke run)" : "");

    Nibbler__V1__Request hq = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Health h = NIBBLER__V1__HEALTH__INIT;
    hq.id = 1;
    hq.command_case = NIBBLER__V1__REQUEST__COMMAND_HEALTH;
    hq.health = &h;
    size_t hlen = 0;
    uint8_t *hbuf = pack(&hq, &hlen);
    uint32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const uint32_t plen = 8;
    size_t rlen = 0;
    uint8_t *rbuf = rollback64(plen, &rlen);

    for (int t = 0; t < 2; t++) {
        wh_worker w;
        char tcp[64];
        snprintf(tcp, sizeof(tcp), "tcp://127.0.0.1:%d", free_port());
        const char *args[] = {"--model", model, "--endpoint", t ? tcp : "{EP}", "--max-seqs", "64",
                              "--log-level", "warn", NULL};
        if (!wh_spawn(&w, args)) return 1;
        const char *ep = t ? tcp : w.endpoint;
        if (!wait_up(ctx, &w, ep)) {
            wh_print_log(&w);
            return 1;
        }
        void *c = wh_client(ctx, ep, 10000);
        time_rtt(c, hbuf, hlen, n / 10, us); // warm-up
        time_rtt(c, hbuf, hlen, n, us);
        report(t ? "Health RTT, tcp loopback" : "Health RTT, ipc", us, n);
        add_prefill64(c, prompt, plen);
        time_rtt(c, rbuf, rlen, n64 / 10, us);
        time_rtt(c, rbuf, rlen, n64, us);
        report(t ? "Rollback x64 (no compute) RTT, tcp loopback" : "Rollback x64 (no compute) RTT, ipc",
               us, n64);
        zmq_close(c);
        wh_stop(&w);
    }

    // In process: the worker's own host time for the same command.
    nb_server_params p = nb_server_default_params();
    p.model = model;
    p.max_seqs = 64;
    nb_log_set_level(NB_LOG_WARN);
    char err[512];
    int code = 0;
    nb_server *s = nb_server_new(&p, false, &code, err, sizeof(err));
    if (!s) {
        fprintf(stderr, "nb_server_new: %s\n", err);
        return 1;
    }
    {
        // add + prefill through the same dispatch
        Nibbler__V1__SequenceSpec sp[NB], *spp[NB];
        Nibbler__V1__PrefillItem it[NB], *itp[NB];
        for (int i = 0; i < NB; i++) {
            nibbler__v1__sequence_spec__init(&sp[i]);
            sp[i].seq_id = (uint64_t)i + 1;
            spp[i] = &sp[i];
            nibbler__v1__prefill_item__init(&it[i]);
            it[i].seq_id = (uint64_t)i + 1;
            it[i].tokens = prompt;
            it[i].n_tokens = plen;
            itp[i] = &it[i];
        }
        Nibbler__V1__AddSequence a = NIBBLER__V1__ADD_SEQUENCE__INIT;
        a.seqs = spp;
        a.n_seqs = NB;
        Nibbler__V1__Prefill pf = NIBBLER__V1__PREFILL__INIT;
        pf.items = itp;
        pf.n_items = NB;
        Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
        q.command_case = NIBBLER__V1__REQUEST__COMMAND_ADD_SEQUENCE;
        q.add_sequence = &a;
        size_t l = 0;
        uint8_t *b = pack(&q, &l);
        const uint8_t *resp;
        size_t resp_len;
        nb_server_handle(s, b, l, &resp, &resp_len);
        free(b);
        q.command_case = NIBBLER__V1__REQUEST__COMMAND_PREFILL;
        q.prefill = &pf;
        b = pack(&q, &l);
        nb_server_handle(s, b, l, &resp, &resp_len);
        free(b);
        for (int i = 0; i < n64; i++) {
            double t0 = wh_now();
            nb_server_handle(s, rbuf, rlen, &resp, &resp_len);
            us[i] = (wh_now() - t0) * 1e6;
        }
        Nibbler__V1__Response *r = nibbler__v1__response__unpack(NULL, resp_len, resp);
        CHECK(wh_seq_code(r, NB - 1) == NIBBLER__V1__CODE__OK);
        wh_free(&r);
        report("Rollback x64 in process (nb_server_handle)", us, n64);
        for (int i = 0; i < n; i++) {
            double t0 = wh_now();
            nb_server_handle(s, hbuf, hlen, &resp, &resp_len);
            us[i] = (wh_now() - t0) * 1e6;
        }
        report("Health in process (nb_server_handle)", us, n);
    }
    nb_server_destroy(&s);
    free(hbuf);
    free(rbuf);
    free(us);
    zmq_ctx_term(ctx);
    return nb_test_finish("bench_worker_rtt");
}
