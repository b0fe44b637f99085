// worker_harness.h: spawns nibbler-worker (NB_WORKER_BIN) on a private ipc
// socket in a mkdtemp directory, waits until it answers Hello, and offers
// small request helpers for the integration tests. The worker's stderr goes
// to DIR/worker.log, printed when a test fails.
//
// The same tests run against another worker binary and backend from the
// environment (tests/gpu/run does, on a GPU machine):
//   NB_TEST_WORKER_BIN   the worker to spawn instead of NB_WORKER_BIN;
//   NB_TEST_WORKER_ARGS  arguments appended to every spawn's own, split at
//                        spaces (e.g. "--backend cuda");
//   NB_TEST_BACKEND      the backend Hello must name (wh_start fails
//                        otherwise), so a run cannot pass on the wrong one.
//
// Always wh_stop() the worker: it is killed and reaped, and the directory is
// removed, whatever state it is in.
#ifndef NB_WORKER_HARNESS_H
#define NB_WORKER_HARNESS_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "nb_proto.h"
#include "nb_test.h"

extern char **environ;

typedef struct wh_worker {
    pid_t pid;
    char dir[256];
    char endpoint[320];
    char log[320];
    int exit_status; // after wh_wait: the exit code, or 128+signal
} wh_worker;

static inline double wh_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// The model the tests use: ../shared's stories260k when present, else
// synthetic:tiny (random weights).
static inline const char *wh_model(void) {
    static char path[512];
    snprintf(path, sizeof(path), "%s/models/stories260k/config.json", nb_test_shared_dir());
    if (access(path, R_OK) == 0) {
        snprintf(path, sizeof(path), "%s/models/stories260k", nb_test_shared_dir());
        return path;
    }
    return "synthetic:tiny";
}

static inline const char *wh_model_or_skip(const char *test) {
    const char *m = wh_model();
    if (!m) {
        printf("SKIP %s: %s/models/stories260k is absent and this build has no synthetic models\n",
               test, nb_test_shared_dir());
        exit(NB_TEST_SKIP);
    }
    return m;
}

// The last spawned worker: killed at exit, and checked when a reply times out.
static wh_worker *wh_guard;
static void wh_guard_kill(void) {
    if (wh_guard && wh_guard->pid > 0) kill(wh_guard->pid, SIGKILL);
}

// Spawns the worker with `args` (NULL-terminated, after the binary name);
// "{EP}" in args is replaced by the private endpoint. Does not wait.
static inline bool wh_spawn(wh_worker *w, const char *const *args) {
    memset(w, 0, sizeof(*w));
    snprintf(w->dir, sizeof(w->dir), "/tmp/nbw-XXXXXX");
    if (!mkdtemp(w->dir)) return false;
    snprintf(w->endpoint, sizeof(w->endpoint), "ipc://%s/w.sock", w->dir);
    snprintf(w->log, sizeof(w->log), "%s/worker.log", w->dir);
    const char *bin = getenv("NB_TEST_WORKER_BIN");
    if (!bin || !*bin) bin = NB_WORKER_BIN;
    const char *argv[64];
    int n = 0;
    argv[n++] = bin;
    for (int i = 0; args[i] && n < 62; i++)
        argv[n++] = strcmp(args[i], "{EP}") == 0 ? w->endpoint : args[i];
    // NB_TEST_WORKER_ARGS: split at spaces into a buffer that outlives the spawn.
    static char extra[512];
    const char *ea = getenv("NB_TEST_WORKER_ARGS");
    snprintf(extra, sizeof(extra), "%s", ea ? ea : "");
    for (char *save = NULL, *tok = strtok_r(extra, " ", &save); tok && n < 63; tok = strtok_r(NULL, " ", &save))
        argv[n++] = tok;
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, w->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int rc = posix_spawn(&w->pid, bin, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    static bool registered = false;
    if (!registered) atexit(wh_guard_kill);
    registered = true;
    wh_guard = w;
    return rc == 0;
}

static inline void wh_print_log(const wh_worker *w) {
    FILE *f = fopen(w->log, "r");
    if (!f) return;
    char line[1024];
    fprintf(stderr, "---- worker log %s\n", w->log);
    while (fgets(line, sizeof(line), f)) fputs(line, stderr);
    fprintf(stderr, "----\n");
    fclose(f);
}

// Waits up to timeout_s for the worker to exit; true when it did.
static inline bool wh_wait(wh_worker *w, double timeout_s) {
    double t0 = wh_now();
    for (;;) {
        int st;
        pid_t r = waitpid(w->pid, &st, WNOHANG);
        if (r == w->pid) {
            w->exit_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            w->pid = 0;
            return true;
        }
        if (wh_now() - t0 > timeout_s) return false;
        usleep(10000);
    }
}

static inline bool wh_log_contains(const wh_worker *w, const char *needle) {
    FILE *f = fopen(w->log, "r");
    if (!f) return false;
    char line[2048];
    bool hit = false;
    while (!hit && fgets(line, sizeof(line), f)) hit = strstr(line, needle) != NULL;
    fclose(f);
    return hit;
}

// Kills (if still running) and reaps the worker, removes its directory.
static inline void wh_stop(wh_worker *w) {
    if (w->pid > 0) {
        kill(w->pid, SIGKILL);
        wh_wait(w, 10.0);
    }
    if (nb_test_failures) wh_print_log(w);
    char p[400];
    snprintf(p, sizeof(p), "%s/worker.log", w->dir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/w.sock", w->dir);
    unlink(p);
    rmdir(w->dir);
}

// A DEALER connected to endpoint; replies wait at most timeout_ms.
static inline void *wh_client(void *ctx, const char *endpoint, int timeout_ms) {
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms));
    if (zmq_connect(s, endpoint) != 0) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

static inline bool wh_send_raw(void *sock, const void *data, size_t len) {
    return zmq_send(sock, data, len, 0) == (int)len;
}

// Receives one Response (NULL on timeout or undecodable bytes). Caller frees
// with nibbler__v1__response__free_unpacked(r, NULL).
static inline Nibbler__V1__Response *wh_recv(void *sock) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, sock, 0) < 0) {
        zmq_msg_close(&m);
        return NULL;
    }
    Nibbler__V1__Response *r =
        nibbler__v1__response__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
    zmq_msg_close(&m);
    return r;
}

static inline uint64_t wh_next_id(void) {
    static uint64_t id = 1000;
    return ++id;
}

// Sends req and returns the reply with req's id. A request without an id
// (0) gets a fresh one, so that a reply arriving after its request timed out
// (a slow machine, a sanitizer build) is recognised and dropped instead of
// being taken as the answer to every later request on the socket.
static inline Nibbler__V1__Response *wh_call(void *sock, const Nibbler__V1__Request *req) {
    Nibbler__V1__Request q = *req;
    if (q.id == 0) q.id = wh_next_id();
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    if (!nb_proto_pack(&q.base, &buf, &cap, &len)) return NULL;
    bool ok = wh_send_raw(sock, buf, len);
    free(buf);
    Nibbler__V1__Response *r = ok ? wh_recv(sock) : NULL;
    while (r && r->id != q.id) {
        fprintf(stderr, "wh_call: dropped a late reply (id %llu) while waiting for id %llu\n",
                (unsigned long long)r->id, (unsigned long long)q.id);
        nibbler__v1__response__free_unpacked(r, NULL);
        r = wh_recv(sock);
    }
    int st;
    if (!r && wh_guard && wh_guard->pid > 0 && waitpid(wh_guard->pid, &st, WNOHANG) == wh_guard->pid) {
        wh_guard->pid = 0;
        fprintf(stderr, "the worker died (status 0x%x) during a request\n", st);
        wh_print_log(wh_guard);
        exit(1);
    }
    return r;
}

static inline void wh_free(Nibbler__V1__Response **r) {
    if (*r) nibbler__v1__response__free_unpacked(*r, NULL);
    *r = NULL;
}

static inline Nibbler__V1__Response *wh_hello(void *sock) {
    Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Hello h = NIBBLER__V1__HELLO__INIT;
    h.protocol_version = NB_PROTO_VERSION;
    h.client_name = "nibbler-test";
    q.id = wh_next_id();
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_HELLO;
    q.hello = &h;
    return wh_call(sock, &q);
}

// Whether Hello's OK reply r names the backend NB_TEST_BACKEND asks for
// (true when that is unset); says which it is either way when it is set.
static inline bool wh_backend_ok(const Nibbler__V1__Response *r) {
    const char *want = getenv("NB_TEST_BACKEND");
    if (!want || !*want) return true;
    const char *got = r && r->result_case == NIBBLER__V1__RESPONSE__RESULT_HELLO && r->hello->backend
                          ? r->hello->backend
                          : "(none)";
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "worker runs backend %s, NB_TEST_BACKEND asks for %s\n", got, want);
        return false;
    }
    printf("worker backend: %s\n", got);
    return true;
}

static inline Nibbler__V1__Response *wh_health(void *sock) {
    Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Health h = NIBBLER__V1__HEALTH__INIT;
    q.id = wh_next_id();
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_HEALTH;
    q.health = &h;
    return wh_call(sock, &q);
}

static inline Nibbler__V1__Response *wh_simple(void *sock, Nibbler__V1__Request__CommandCase c) {
    Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Stats e = NIBBLER__V1__STATS__INIT; // every empty command has the same shape
    q.id = wh_next_id();
    q.command_case = c;
    q.stats = &e;
    return wh_call(sock, &q);
}

// AddSequence of n ids with temperature temp (0: greedy), seed = id, stop
// (may be NULL).
static inline Nibbler__V1__Response *wh_add(void *sock, const uint64_t *ids, size_t n, float temp,
                                            Nibbler__V1__StopConditions *stop) {
    Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__AddSequence a = NIBBLER__V1__ADD_SEQUENCE__INIT;
    Nibbler__V1__SequenceSpec specs[n > 0 ? n : 1], *sp[n > 0 ? n : 1];
    Nibbler__V1__SamplingParams smp[n > 0 ? n : 1];
    for (size_t i = 0; i < n; i++) {
        nibbler__v1__sequence_spec__init(&specs[i]);
        nibbler__v1__sampling_params__init(&smp[i]);
        smp[i].temperature = temp;
        smp[i].seed = ids[i];
        specs[i].seq_id = ids[i];
        specs[i].sampling = &smp[i];
        specs[i].stop = stop;
        sp[i] = &specs[i];
    }
    a.n_seqs = n;
    a.seqs = sp;
    q.id = wh_next_id();
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_ADD_SEQUENCE;
    q.add_sequence = &a;
    return wh_call(sock, &q);
}

static inline Nibbler__V1__Response *wh_add1(void *sock, uint64_t id) {
    return wh_add(sock, &id, 1, 0.0f, NULL);
}

// Prefill of n sequences; prompts[i] has lens[i] tokens.
static inline Nibbler__V1__Response *wh_prefill(void *sock, const uint64_t *ids, size_t n,
                                                uint32_t *const *prompts, const size_t *lens) {
    Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Prefill p = NIBBLER__V1__PREFILL__INIT;
    Nibbler__V1__PrefillItem items[n > 0 ? n : 1], *ip[n > 0 ? n : 1];
    for (size_t i = 0; i < n; i++) {
        nibbler__v1__prefill_item__init(&items[i]);
        items[i].seq_id = ids[i];
        items[i].tokens = prompts[i];
        items[i].n_tokens = lens[i];
        ip[i] = &items[i];
    }
    p.n_items = n;
    p.items = ip;
    q.id = wh_next_id();
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_PREFILL;
    q.prefill = &p;
    return wh_call(sock, &q);
}

static inline Nibbler__V1__Response *wh_prefill1(void *sock, uint64_t id, uint32_t *toks, size_t n) {
    return wh_prefill(sock, &id, 1, &toks, &n);
}

// Draft, Verify, Speculate, Decode, Free over ids; arg = gamma or n.
static inline Nibbler__V1__Response *wh_ids_cmd(void *sock, Nibbler__V1__Request__CommandCase c,
                                                uint64_t *ids, size_t n, uint32_t arg) {
    Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Draft d = NIBBLER__V1__DRAFT__INIT;
    Nibbler__V1__Verify v = NIBBLER__V1__VERIFY__INIT;
    Nibbler__V1__Speculate s = NIBBLER__V1__SPECULATE__INIT;
    Nibbler__V1__Decode de = NIBBLER__V1__DECODE__INIT;
    Nibbler__V1__Free f = NIBBLER__V1__FREE__INIT;
    q.id = wh_next_id();
    q.command_case = c;
    switch (c) {
    case NIBBLER__V1__REQUEST__COMMAND_DRAFT: d.seq_ids = ids; d.n_seq_ids = n; d.gamma = arg; q.draft = &d; break;
    case NIBBLER__V1__REQUEST__COMMAND_VERIFY: v.seq_ids = ids; v.n_seq_ids = n; q.verify = &v; break;
    case NIBBLER__V1__REQUEST__COMMAND_SPECULATE: s.seq_ids = ids; s.n_seq_ids = n; s.gamma = arg; q.speculate = &s; break;
    case NIBBLER__V1__REQUEST__COMMAND_DECODE: de.seq_ids = ids; de.n_seq_ids = n; de.n = arg; q.decode = &de; break;
    case NIBBLER__V1__REQUEST__COMMAND_FREE: f.seq_ids = ids; f.n_seq_ids = n; q.free = &f; break;
    default: return NULL;
    }
    return wh_call(sock, &q);
}

static inline Nibbler__V1__Response *wh_rollback1(void *sock, uint64_t id, uint32_t n_tokens) {
    Nibbler__V1__Request q = NIBBLER__V1__REQUEST__INIT;
    Nibbler__V1__Rollback r = NIBBLER__V1__ROLLBACK__INIT;
    Nibbler__V1__RollbackItem it = NIBBLER__V1__ROLLBACK_ITEM__INIT, *ip = &it;
    it.seq_id = id;
    it.n_tokens = n_tokens;
    r.items = &ip;
    r.n_items = 1;
    q.id = wh_next_id();
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_ROLLBACK;
    q.rollback = &r;
    return wh_call(sock, &q);
}

static inline Nibbler__V1__Code wh_code(const Nibbler__V1__Response *r) {
    return r && r->status ? r->status->code : (Nibbler__V1__Code)-1;
}

// The status of sequence result i, or -1 when the reply has no such result.
static inline Nibbler__V1__Code wh_seq_code(const Nibbler__V1__Response *r, size_t i) {
    if (!r || r->result_case != NIBBLER__V1__RESPONSE__RESULT_BATCH || i >= r->batch->n_seqs)
        return (Nibbler__V1__Code)-1;
    return r->batch->seqs[i]->status->code;
}

// Starts the worker with args and waits (up to 60 s) until it answers Hello
// on a fresh client. Returns false (logging) when it does not come up.
static inline bool wh_start(wh_worker *w, void *ctx, const char *const *args) {
    if (!wh_spawn(w, args)) return false;
    double t0 = wh_now();
    while (wh_now() - t0 < 60.0) {
        if (wh_wait(w, 0.0)) {
            fprintf(stderr, "worker exited early with status %d\n", w->exit_status);
            wh_print_log(w);
            return false;
        }
        void *c = wh_client(ctx, w->endpoint, 500);
        Nibbler__V1__Response *r = c ? wh_hello(c) : NULL;
        bool ok = wh_code(r) == NIBBLER__V1__CODE__OK;
        if (ok && !wh_backend_ok(r)) {
            wh_free(&r);
            zmq_close(c);
            return false;
        }
        wh_free(&r);
        if (c) zmq_close(c);
        if (ok) return true;
    }
    fprintf(stderr, "worker did not answer Hello within 60 s\n");
    wh_print_log(w);
    return false;
}

#endif // NB_WORKER_HARNESS_H
