// test_worker_curve.c: security at start-up and with CURVE keys.
// - tcp off loopback without keys is refused (exit 2) before the model loads;
//   so are --backend cuda without a cuda backend or device, and
//   --gpu-memory-utilization with the cpu backend.
// - With real keypairs (zmq_curve_keypair): a listed client is served, an
//   unlisted client and a plain (no CURVE) client get no answer.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "worker_harness.h"

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

// Runs the worker with args and expects it to exit with `code` quickly and
// log `needle`.
static void expect_refused(const char *const *args, int code, const char *needle, const char *what) {
    wh_worker w;
    CHECK(wh_spawn(&w, args));
    bool exited = wh_wait(&w, 20.0);
    CHECKF(exited && w.exit_status == code, "%s: exit %d, want %d", what, exited ? w.exit_status : -1, code);
    CHECKF(wh_log_contains(&w, needle), "%s: the log does not say '%s'", what, needle);
    wh_stop(&w);
}

static void *curve_client(void *ctx, const char *ep, const char *server_pub, const char *pub,
                          const char *sec) {
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, to = 1500;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &to, sizeof(to));
    if (server_pub) {
        zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_pub, 40);
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 40);
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 40);
    }
    zmq_connect(s, ep);
    return s;
}

int main(void) {
    const char *model = wh_model_or_skip("test_worker_curve");
    if (!zmq_has("curve")) {
        printf("SKIP test_worker_curve: libzmq without CURVE\n");
        return NB_TEST_SKIP;
    }
    void *ctx = zmq_ctx_new();
    char ep[64], ep_any[64], ep_star[64];
    int port = free_port();
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
    snprintf(ep_any, sizeof(ep_any), "tcp://0.0.0.0:%d", port);
    snprintf(ep_star, sizeof(ep_star), "tcp://*:%d", port);

    // Start-up refusals.
    const char *a1[] = {"--model", "/nonexistent/model", "--endpoint", ep_any, NULL};
    expect_refused(a1, 2, "needs CURVE keys", "tcp 0.0.0.0 without keys");
    const char *a2[] = {"--model", model, "--endpoint", ep_star, NULL};
    expect_refused(a2, 2, "needs CURVE keys", "tcp * without keys");
    const char *a3[] = {"--model", model, "--endpoint", "{EP}", "--backend", "cuda", NULL};
    // A build without CUDA has no cuda backend; a CUDA build on a machine
    // without a GPU (CI) finds no device. Either way: exit 2, said clearly.
    {
        wh_worker w;
        CHECK(wh_spawn(&w, a3));
        bool exited = wh_wait(&w, 20.0);
        CHECKF(exited && w.exit_status == 2, "--backend cuda: exit %d, want 2", exited ? w.exit_status : -1);
        CHECKF(wh_log_contains(&w, "no cuda backend") || wh_log_contains(&w, "no CUDA device"),
               "--backend cuda: the log says neither 'no cuda backend' nor 'no CUDA device'");
        wh_stop(&w);
    }
    const char *a4[] = {"--model", model, "--endpoint", "{EP}", "--gpu-memory-utilization", "0.9", NULL};
    expect_refused(a4, 2, "only meaningful with --backend cuda", "--gpu-memory-utilization on cpu");
    const char *a5[] = {"--model", model, "--endpoint", "{EP}", "--curve-secret-key", "/nonexistent", NULL};
    expect_refused(a5, 2, "needs both", "half the CURVE flags");

    // Real keys.
    char spub[41], ssec[41], cpub[41], csec[41], bpub[41], bsec[41];
    CHECK(zmq_curve_keypair(spub, ssec) == 0);
    CHECK(zmq_curve_keypair(cpub, csec) == 0);
    CHECK(zmq_curve_keypair(bpub, bsec) == 0);
    char dir[] = "/tmp/nbw-keys-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char skf[128], akf[128];
    snprintf(skf, sizeof(skf), "%s/server.key", dir);
    snprintf(akf, sizeof(akf), "%s/allowed", dir);
    FILE *f = fopen(skf, "w");
    fprintf(f, "# nibbler worker secret key\n%s\n", ssec);
    fclose(f);
    f = fopen(akf, "w");
    fprintf(f, "# allowed schedulers\n\n%s\n", cpub);
    fclose(f);

    // CURVE on a non-loopback address is accepted; clients use 127.0.0.1.
    wh_worker w;
    const char *args[] = {"--model", model, "--endpoint", ep_any, "--curve-secret-key", skf,
                          "--curve-allowed-clients", akf, NULL};
    CHECK(wh_spawn(&w, args));
    // Wait until served (the listed client).
    bool served = false;
    double t0 = wh_now();
    while (!served && wh_now() - t0 < 60.0 && !wh_wait(&w, 0.0)) {
        void *c = curve_client(ctx, ep, spub, cpub, csec);
        Nibbler__V1__Response *r = wh_hello(c);
        served = wh_code(r) == NIBBLER__V1__CODE__OK;
        wh_free(&r);
        zmq_close(c);
    }
    CHECKF(served, "the authorised client was not served");
    {
        void *bad = curve_client(ctx, ep, spub, bpub, bsec);
        Nibbler__V1__Response *r = wh_hello(bad);
        CHECKF(r == NULL, "an unlisted client key got an answer");
        wh_free(&r);
        zmq_close(bad);
        void *plain = curve_client(ctx, ep, NULL, NULL, NULL);
        r = wh_hello(plain);
        CHECKF(r == NULL, "a client without CURVE got an answer");
        wh_free(&r);
        zmq_close(plain);
        // still serving the authorised one
        void *c = curve_client(ctx, ep, spub, cpub, csec);
        r = wh_health(c);
        CHECK(wh_code(r) == NIBBLER__V1__CODE__OK);
        wh_free(&r);
        r = wh_simple(c, NIBBLER__V1__REQUEST__COMMAND_SHUTDOWN);
        CHECK(wh_code(r) == NIBBLER__V1__CODE__OK);
        wh_free(&r);
        zmq_close(c);
        CHECK(wh_wait(&w, 10.0) && w.exit_status == 0);
        CHECK(wh_log_contains(&w, "curve: refused client key"));
    }
    wh_stop(&w);
    unlink(skf);
    unlink(akf);
    rmdir(dir);
    zmq_ctx_term(ctx);
    return nb_test_finish("test_worker_curve");
}
