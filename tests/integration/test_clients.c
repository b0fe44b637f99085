// test_clients.c: the nibbler-worker process driven by the C client over ipc
// and tcp loopback, checked against the in-process engine.
//
//   argv[1] the nibbler-worker binary, argv[2] the nibbler-generate binary.
//
// - speculative (greedy and sampled) and target-only generation through the
//   worker equal the engine's own draft/verify/decode loop, token for token,
//   with the same model and engine parameters as the worker's flags;
// - four client threads, each with its own DEALER and sequences, at once;
// - thousands of sequences added and freed: block counts back to the start;
// - a client SIGKILLed mid-request leaves the worker serving the others;
// - nibbler-generate runs end to end (synthetic:tiny; stories260k when
//   present) and its --json parses.
// The model is stories260k from ../shared when present, else synthetic:tiny.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zmq.h>

#include "engine.h"
#include "model_loader.h"
#include "nb_client.h"
#include "nb_test.h"

// Engine parameters both sides use: the worker gets them as flags.
#define T_GROUP 64
#define T_KV_MEMORY ((size_t)32 << 20)
#define T_MAX_SEQS 8

static const char *g_worker_bin, *g_generate_bin;
static char g_tmp[64];
static char g_model[1024]; // worker --model
static nb_model *g_m;
static nb_engine *g_e;
static int32_t g_vocab;

// ---------------------------------------------------------------- worker process

typedef struct worker {
    pid_t pid;
    char endpoint[160];
    char log[160];
} worker;

static worker *g_current; // the worker the tests talk to now

// A dead worker fails the whole test at once, with its log, instead of
// every later call timing out.
static void die_if_worker_dead(void) {
    worker *w = g_current;
    int st;
    if (!w || w->pid <= 0 || waitpid(w->pid, &st, WNOHANG) != w->pid) return;
    fprintf(stderr, "FATAL: the worker on %s died (status %d); its log %s:\n", w->endpoint,
            st, w->log);
    FILE *f = fopen(w->log, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) fputs(line, stderr);
    if (f) fclose(f);
    exit(1);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static nb_client *client_new(const char *endpoint, int timeout_ms) {
    nb_client_params p = nb_client_default_params();
    p.endpoint = endpoint;
    p.timeout_ms = timeout_ms;
    p.client_name = "test_clients";
    char err[256];
    nb_client *c = nb_client_new(&p, err, sizeof err);
    if (!c) fprintf(stderr, "client: %s\n", err);
    return c;
}

// Starts the worker on endpoint (with up to 4 extra flags, NULL-terminated)
// and waits for its Hello through `hello` (NULL: a plain client). Exits on
// failure.
static void worker_start_ex(worker *w, const char *endpoint, const char *log_name,
                            const char *const *extra, nb_client *hello);

static void worker_start(worker *w, const char *endpoint, const char *log_name) {
    worker_start_ex(w, endpoint, log_name, NULL, NULL);
}

static void worker_start_ex(worker *w, const char *endpoint, const char *log_name,
                            const char *const *extra, nb_client *hello) {
    snprintf(w->endpoint, sizeof w->endpoint, "%s", endpoint);
    char log[160], kvm[32], g[16], ms[16];
    snprintf(log, sizeof log, "%s/%s", g_tmp, log_name);
    snprintf(w->log, sizeof w->log, "%s", log);
    snprintf(kvm, sizeof kvm, "%zu", T_KV_MEMORY);
    snprintf(g, sizeof g, "%d", T_GROUP);
    snprintf(ms, sizeof ms, "%d", T_MAX_SEQS);
    pid_t pid = fork();
    NB_ASSERT(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        const char *av[24] = {g_worker_bin, "--model", g_model, "--endpoint", endpoint,
                              "--group-size", g, "--kv-memory", kvm, "--max-seqs", ms,
                              "--log-level", "warn"};
        int a = 13;
        for (int i = 0; extra && extra[i] && a < 23; i++) av[a++] = extra[i];
        av[a] = NULL;
        execv(g_worker_bin, (char *const *)av);
        _exit(127);
    }
    w->pid = pid;
    nb_client *c = hello ? hello : client_new(endpoint, 500);
    NB_ASSERT(c);
    double t0 = now_s();
    for (;;) {
        int rc = nb_client_hello(c, NULL);
        if (rc == 0) break;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid || now_s() - t0 > 120) {
            fprintf(stderr, "worker on %s did not answer Hello (%s); log %s\n", endpoint,
                    nb_client_error(c), log);
            exit(1);
        }
    }
    if (!hello) nb_client_destroy(&c);
    g_current = w;
}

// Shutdown, then the exit status must be 0.
static void worker_stop(worker *w) {
    nb_client *c = client_new(w->endpoint, 10000);
    CHECK(c && nb_client_shutdown(c, NULL) == 0);
    nb_client_destroy(&c);
    int st = 0;
    double t0 = now_s();
    while (waitpid(w->pid, &st, WNOHANG) == 0) {
        if (now_s() - t0 > 30) {
            kill(w->pid, SIGKILL);
            waitpid(w->pid, &st, 0);
            CHECKF(0, "worker did not exit after Shutdown");
            return;
        }
        usleep(10000);
    }
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker exit status %d", st);
    g_current = NULL;
}

static int free_tcp_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    NB_ASSERT(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
    NB_ASSERT(getsockname(s, (struct sockaddr *)&a, &l) == 0);
    int port = ntohs(a.sin_port);
    close(s);
    return port;
}

// ---------------------------------------------------------------- reference

typedef struct gen_case {
    int n_prompt;
    int32_t prompt[64];
    int max_tokens;
    int gamma;      // 0: target-only
    float temperature;
    uint64_t seed;
    int32_t want[256];
    int n_want;
    int64_t drafted, accepted;
} gen_case;

// The engine's own loop: prefill, then draft(gamma)+verify or decode(1)
// rounds, tokens past max_tokens dropped. Not thread safe (one engine).
static void reference(gen_case *gc) {
    nb_sampling_params sp = {.temperature = gc->temperature, .top_k = 0, .top_p = 1,
                             .seed = gc->seed};
    int32_t seq, next, n = 0;
    nb_status sst;
    NB_ASSERT(nb_engine_seq_add(g_e, &sp, &seq) == NB_OK);
    const int32_t *pp[1] = {gc->prompt};
    NB_ASSERT(nb_engine_prefill(g_e, 1, &seq, pp, &gc->n_prompt, &next, NULL, NULL, &sst) ==
                  NB_OK && sst == NB_OK);
    gc->want[n++] = next;
    gc->drafted = gc->accepted = 0;
    while (n < gc->max_tokens) {
        int32_t buf[NB_ENGINE_MAX_GAMMA + 1], drafts[NB_ENGINE_MAX_GAMMA], n_out = 0, n_acc = 0;
        if (gc->gamma == 0) {
            NB_ASSERT(nb_engine_decode(g_e, 1, &seq, 1, buf, NULL, &n_out, &sst) == NB_OK &&
                      sst == NB_OK);
        } else {
            NB_ASSERT(nb_engine_draft(g_e, 1, &seq, gc->gamma, drafts, &sst) == NB_OK &&
                      sst == NB_OK);
            NB_ASSERT(nb_engine_verify(g_e, 1, &seq, buf, NULL, &n_out, &n_acc, &sst) ==
                          NB_OK && sst == NB_OK);
            gc->drafted += gc->gamma;
            gc->accepted += n_acc;
        }
        for (int j = 0; j < n_out && n < gc->max_tokens; j++) gc->want[n++] = buf[j];
    }
    gc->n_want = n;
    nb_engine_seq_free(g_e, seq);
}

static void make_case(gen_case *gc, int which, int gamma, float temp, uint64_t seed, int max) {
    memset(gc, 0, sizeof *gc);
    gc->n_prompt = 1 + (which * 7) % 40;
    gc->prompt[0] = 1; // BOS
    for (int i = 1; i < gc->n_prompt; i++) gc->prompt[i] = (i * 31 + which * 17 + 3) % g_vocab;
    gc->gamma = gamma;
    gc->temperature = temp;
    gc->seed = seed;
    gc->max_tokens = max;
    reference(gc);
}

// Runs gc through the worker; true when tokens (and the draft counts of a
// greedy or sampled speculative run, round for round) match.
static bool run_case(nb_client *c, const gen_case *gc, const char *what) {
    nb_client_gen_params p = nb_client_gen_default_params();
    p.mode = gc->gamma ? NB_CLIENT_MODE_SPEC : NB_CLIENT_MODE_AR;
    p.gamma = gc->gamma ? (uint32_t)gc->gamma : 4;
    p.max_tokens = (uint32_t)gc->max_tokens;
    p.temperature = gc->temperature;
    p.seed = gc->seed;
    uint32_t prompt[64];
    for (int i = 0; i < gc->n_prompt; i++) prompt[i] = (uint32_t)gc->prompt[i];
    nb_client_gen_result r;
    int rc = nb_client_generate(c, &p, prompt, (size_t)gc->n_prompt, &r);
    bool ok = rc == 0 && r.n_tokens == (size_t)gc->n_want;
    for (size_t i = 0; ok && i < r.n_tokens; i++) ok = r.tokens[i] == (uint32_t)gc->want[i];
    if (ok && gc->gamma) ok = r.n_drafted == (uint64_t)gc->drafted &&
                              r.n_accepted == (uint64_t)gc->accepted;
    if (!ok) {
        if (rc) die_if_worker_dead();
        fprintf(stderr, "%s: rc %d (%s), %zu tokens vs %d; drafted %llu/%lld accepted %llu/%lld\n",
                what, rc, nb_client_error(c), r.n_tokens, gc->n_want,
                (unsigned long long)r.n_drafted, (long long)gc->drafted,
                (unsigned long long)r.n_accepted, (long long)gc->accepted);
        for (size_t i = 0; i < r.n_tokens && i < (size_t)gc->n_want; i++)
            if (r.tokens[i] != (uint32_t)gc->want[i]) {
                fprintf(stderr, "  first difference at %zu: %u vs %d\n", i, r.tokens[i],
                        gc->want[i]);
                break;
            }
    }
    nb_client_gen_result_clear(&r);
    return ok;
}

// ---------------------------------------------------------------- tests

#define N_CASES 6
static gen_case g_cases[N_CASES];

static void test_hello(const char *endpoint) {
    nb_client *c = client_new(endpoint, 30000);
    nb_client_response *r = NULL;
    CHECK(nb_client_hello(c, &r) == 0);
    if (r && r->hello && r->hello->model && r->hello->cache && r->hello->limits) {
        const nb_model_config *mc = nb_model_get_config(g_m);
        const Nibbler__V1__HelloResult *h = r->hello;
        CHECK(h->protocol_version == 1);
        CHECK(h->model->vocab_size == (uint32_t)mc->vocab_size);
        CHECK(h->model->n_layers == (uint32_t)mc->n_layers);
        CHECK(h->model->n_kv_heads == (uint32_t)mc->n_kv_heads);
        CHECK(h->model->head_dim == (uint32_t)mc->head_dim);
        CHECK(h->model->synthetic == nb_model_is_synthetic(g_m));
        CHECK(h->cache->group_size == T_GROUP);
        CHECK(h->limits->max_seqs == T_MAX_SEQS);
        printf("hello: %s, vocab %u, cache %u/%u qblocks %u/%u fpblocks free\n",
               h->model->name, h->model->vocab_size, h->cache->qblocks_free,
               h->cache->qblocks_total, h->cache->fpblocks_free, h->cache->fpblocks_total);
    }
    nb_client_response_free(&r);
    nb_client_destroy(&c);
}

static void test_equal_to_engine(const char *endpoint, const char *name) {
    nb_client *c = client_new(endpoint, 60000);
    for (int i = 0; i < N_CASES; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s case %d (gamma %d, T %.1f)", name, i, g_cases[i].gamma,
                 g_cases[i].temperature);
        CHECKF(run_case(c, &g_cases[i], what), "%s", what);
    }
    nb_client_destroy(&c);
}

typedef struct thread_arg {
    const char *endpoint;
    int index;
    int failures;
} thread_arg;

static void *client_thread(void *arg) {
    thread_arg *a = arg;
    nb_client *c = client_new(a->endpoint, 120000);
    if (!c) {
        a->failures++;
        return NULL;
    }
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < N_CASES; i++) {
            const gen_case *gc = &g_cases[(i + a->index) % N_CASES];
            char what[64];
            snprintf(what, sizeof what, "thread %d round %d case %d", a->index, r, i);
            if (!run_case(c, gc, what)) a->failures++;
        }
    nb_client_destroy(&c);
    return NULL;
}

static void test_concurrent_clients(const char *endpoint) {
    enum { N_THREADS = 4 };
    pthread_t th[N_THREADS];
    thread_arg args[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        args[i] = (thread_arg){.endpoint = endpoint, .index = i};
        pthread_create(&th[i], NULL, client_thread, &args[i]);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECKF(args[i].failures == 0, "thread %d: %d failures", i, args[i].failures);
    }
}

static bool cache_counts(nb_client *c, uint32_t *q, uint32_t *fp, uint32_t *n_seqs) {
    nb_client_response *r = NULL;
    bool ok = nb_client_stats(c, &r) == 0 && r->stats && r->stats->cache;
    if (ok) {
        *q = r->stats->cache->qblocks_free;
        *fp = r->stats->cache->fpblocks_free;
        *n_seqs = r->stats->n_seqs;
    }
    nb_client_response_free(&r);
    return ok;
}

static void test_many_sequences(const char *endpoint) {
    nb_client *c = client_new(endpoint, 60000);
    uint32_t q0, fp0, ns0, q1, fp1, ns1;
    CHECK(cache_counts(c, &q0, &fp0, &ns0));
    const int total = 2400;
    int failures = 0;
    uint64_t ids[T_MAX_SEQS];
    nb_client_seq_spec specs[T_MAX_SEQS];
    uint32_t prompts[T_MAX_SEQS][T_GROUP];
    const uint32_t *pp[T_MAX_SEQS];
    size_t lens[T_MAX_SEQS];
    for (int done = 0; done < total; done += T_MAX_SEQS) {
        for (int i = 0; i < T_MAX_SEQS; i++) {
            ids[i] = 1000000 + (uint64_t)(done + i);
            specs[i] = (nb_client_seq_spec){.seq_id = ids[i], .seed = ids[i]};
            // Shorter than a block: no full quantized block enters the prefix cache.
            lens[i] = 1 + (size_t)((done + i) % (T_GROUP - 2));
            for (size_t j = 0; j < lens[i]; j++)
                prompts[i][j] = (uint32_t)((done * 7 + i * 13 + (int)j) % g_vocab);
            pp[i] = prompts[i];
        }
        if (nb_client_add_sequence(c, T_MAX_SEQS, specs, NULL)) failures++;
        // Every other batch is prefilled (and one sequence decoded) before it is freed.
        if ((done / T_MAX_SEQS) % 2 == 0) {
            if (nb_client_prefill(c, T_MAX_SEQS, ids, pp, lens, false, NULL)) failures++;
            if (nb_client_decode(c, 1, ids, 2, false, NULL)) failures++;
        }
        if (nb_client_free(c, T_MAX_SEQS, ids, NULL)) failures++;
        if (failures) {
            die_if_worker_dead();
            fprintf(stderr, "many sequences at %d: %s\n", done, nb_client_error(c));
            break;
        }
    }
    CHECK(failures == 0);
    CHECK(cache_counts(c, &q1, &fp1, &ns1));
    CHECKF(q1 == q0 && fp1 == fp0 && ns1 == ns0, "qblocks free %u -> %u, fp %u -> %u, seqs %u -> %u",
           q0, q1, fp0, fp1, ns0, ns1);
    // A full table is a status, not a failure of the others.
    for (int i = 0; i < T_MAX_SEQS; i++) specs[i] = (nb_client_seq_spec){.seq_id = 50 + i};
    CHECK(nb_client_add_sequence(c, T_MAX_SEQS, specs, NULL) == 0);
    nb_client_seq_spec extra = {.seq_id = 99};
    CHECK(nb_client_add_sequence(c, 1, &extra, NULL) == NIBBLER__V1__CODE__TOO_MANY_SEQUENCES);
    for (int i = 0; i < T_MAX_SEQS; i++) ids[i] = 50 + (uint64_t)i;
    CHECK(nb_client_free(c, T_MAX_SEQS, ids, NULL) == 0);
    CHECK(nb_client_free(c, 1, ids, NULL) == NIBBLER__V1__CODE__NOT_FOUND);
    CHECK(cache_counts(c, &q1, &fp1, &ns1) && q1 == q0 && fp1 == fp0 && ns1 == ns0);
    printf("many sequences: %d added and freed; blocks free %u q, %u fp\n", total, q1, fp1);
    nb_client_destroy(&c);
}

static void test_killed_client(const char *endpoint) {
    enum { N_VICTIMS = 4 };
    const uint64_t victims[N_VICTIMS] = {777, 778, 779, 780};
    int pipefd[2];
    NB_ASSERT(pipe(pipefd) == 0);
    pid_t pid = fork();
    NB_ASSERT(pid >= 0);
    if (pid == 0) {
        // NOTE: a fresh ZeroMQ context of its own; the parent's are not touched.
        close(pipefd[0]);
        nb_client *c = client_new(endpoint, 120000);
        nb_client_seq_spec s[N_VICTIMS];
        uint32_t prompt[2] = {1, 5};
        const uint32_t *pp[N_VICTIMS];
        size_t len[N_VICTIMS];
        for (int i = 0; i < N_VICTIMS; i++) {
            s[i] = (nb_client_seq_spec){.seq_id = victims[i], .seed = (uint64_t)i};
            pp[i] = prompt;
            len[i] = 2;
        }
        if (!c || nb_client_add_sequence(c, N_VICTIMS, s, NULL) ||
            nb_client_prefill(c, N_VICTIMS, victims, pp, len, false, NULL))
            _exit(3);
        // A long Decode (4 x 500 tokens); the parent kills us while we wait.
        if (write(pipefd[1], "x", 1) != 1) _exit(4);
        nb_client_decode(c, N_VICTIMS, victims, 500, false, NULL);
        _exit(0);
    }
    close(pipefd[1]);
    char b;
    CHECK(read(pipefd[0], &b, 1) == 1);
    close(pipefd[0]);
    usleep(20 * 1000); // the Decode is on its way or running
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
           "child status %d (it should still have been waiting for its Decode)", st);
    nb_client *c = client_new(endpoint, 120000);
    nb_client_response *r = NULL;
    CHECK(nb_client_health(c, &r) == 0 && r && r->health && r->health->serving);
    nb_client_response_free(&r);
    CHECKF(run_case(c, &g_cases[0], "after a killed client"), "generation after a kill");
    // The dead client's sequences are still the worker's: any client may free them.
    CHECK(nb_client_free(c, N_VICTIMS, victims, NULL) == 0);
    nb_client_destroy(&c);
}

// CURVE through the client: the listed key is served, no key and an unlisted
// key are not (the handshake fails, so the call times out).
static void test_curve(void) {
    char spub[41], ssec[41], cpub[41], csec[41], opub[41], osec[41];
    if (zmq_curve_keypair(spub, ssec) != 0) {
        printf("CURVE: skipped (libzmq built without CURVE)\n");
        return;
    }
    zmq_curve_keypair(cpub, csec);
    zmq_curve_keypair(opub, osec);
    char skf[160], ckf[160];
    snprintf(skf, sizeof skf, "%s/server.key", g_tmp);
    snprintf(ckf, sizeof ckf, "%s/clients.txt", g_tmp);
    FILE *f = fopen(skf, "w");
    fprintf(f, "%s\n", ssec);
    fclose(f);
    f = fopen(ckf, "w");
    fprintf(f, "# the test client\n%s\n", cpub);
    fclose(f);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", free_tcp_port());
    nb_client_params p = nb_client_default_params();
    p.endpoint = ep;
    p.timeout_ms = 500;
    p.curve_server_key = spub;
    p.curve_public_key = cpub;
    p.curve_secret_key = csec;
    char err[256];
    nb_client *good = nb_client_new(&p, err, sizeof err);
    CHECKF(good != NULL, "%s", err);
    if (!good) return;
    const char *extra[] = {"--curve-secret-key", skf, "--curve-allowed-clients", ckf, NULL};
    worker w;
    worker_start_ex(&w, ep, "worker-curve.log", extra, good); // Hello through CURVE
    nb_client_destroy(&good);
    p.curve_public_key = opub;
    p.curve_secret_key = osec;
    nb_client *other = nb_client_new(&p, err, sizeof err);
    CHECK(other && nb_client_health(other, NULL) == NB_CLIENT_ERR_TIMEOUT);
    nb_client_destroy(&other);
    nb_client *plain = client_new(ep, 500);
    CHECK(plain && nb_client_health(plain, NULL) == NB_CLIENT_ERR_TIMEOUT);
    nb_client_destroy(&plain);
    p.curve_public_key = cpub;
    p.curve_secret_key = csec;
    p.timeout_ms = 30000;
    good = nb_client_new(&p, err, sizeof err);
    CHECK(good && nb_client_health(good, NULL) == 0);
    CHECK(good && nb_client_shutdown(good, NULL) == 0);
    nb_client_destroy(&good);
    int st = 0;
    waitpid(w.pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    unlink(skf);
    unlink(ckf);
    char lp[160];
    snprintf(lp, sizeof lp, "%s/worker-curve.log", g_tmp);
    if (nb_test_failures == 0) unlink(lp);
}

// ---------------------------------------------------------------- nibbler-generate

static cJSON *run_generate_json(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "NIBBLER_WORKER='%s' '%s' %s --json", g_worker_bin,
             g_generate_bin, args);
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    static char out[1 << 16];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: exit status %d", cmd, st);
    cJSON *j = cJSON_Parse(out);
    CHECKF(j != NULL, "%s: output is not JSON: %s", cmd, out);
    return j;
}

static void test_generate_cli(void) {
    cJSON *j = run_generate_json("--model synthetic:tiny --max-tokens 24 --gamma 3");
    if (j) {
        const cJSON *t = cJSON_GetObjectItem(j, "tokens");
        CHECK(cJSON_IsNumber(t) && t->valuedouble == 24);
        CHECK(cJSON_IsNumber(cJSON_GetObjectItem(j, "drafted")));
        CHECK(cJSON_IsNumber(cJSON_GetObjectItem(j, "accepted")));
        CHECK(cJSON_IsNumber(cJSON_GetObjectItem(j, "tokens_per_s")));
        CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "synthetic")));
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(j, "token_ids")) == 24);
        cJSON_Delete(j);
    }
    j = run_generate_json("--model synthetic:tiny --max-tokens 10 --mode ar --kv-cache fp16 "
                          "--prompt-ids 1,2,3");
    if (j) {
        CHECK(cJSON_GetObjectItem(j, "tokens")->valuedouble == 10);
        CHECK(cJSON_GetObjectItem(j, "drafted")->valuedouble == 0);
        cJSON_Delete(j);
    }
    char dir[1024], args[1400];
    snprintf(dir, sizeof dir, "%s/models/stories260k", nb_test_shared_dir());
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        printf("nibbler-generate on stories260k: skipped (%s absent)\n", dir);
        return;
    }
    snprintf(args, sizeof args, "--model '%s' --prompt 'Once upon a time' --max-tokens 40", dir);
    j = run_generate_json(args);
    if (j) {
        const cJSON *t = cJSON_GetObjectItem(j, "tokens");
        const cJSON *text = cJSON_GetObjectItem(j, "text");
        CHECK(cJSON_IsNumber(t) && t->valuedouble > 0);
        CHECK(cJSON_IsFalse(cJSON_GetObjectItem(j, "synthetic")));
        CHECKF(cJSON_IsString(text) && !strncmp(text->valuestring, "Once upon a time", 16) &&
                   strlen(text->valuestring) > 40,
               "text: %s", cJSON_IsString(text) ? text->valuestring : "(none)");
        printf("nibbler-generate: %s\n", cJSON_IsString(text) ? text->valuestring : "");
        cJSON_Delete(j);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s NIBBLER_WORKER NIBBLER_GENERATE\n", argv[0]);
        return 2;
    }
    g_worker_bin = argv[1];
    g_generate_bin = argv[2];
    if (access(g_worker_bin, X_OK) != 0) {
        printf("SKIP: %s not built\n", g_worker_bin);
        return NB_TEST_SKIP;
    }
    signal(SIGPIPE, SIG_IGN);
    snprintf(g_tmp, sizeof g_tmp, "/tmp/nb-test-clients-XXXXXX");
    NB_ASSERT(mkdtemp(g_tmp));

    char err[512];
    snprintf(g_model, sizeof g_model, "%s/models/stories260k", nb_test_shared_dir());
    struct stat sb;
    if (stat(g_model, &sb) == 0) {
        NB_ASSERT(nb_model_load(g_model, &g_m, err, sizeof err) == NB_OK);
    } else {
        printf("note: %s absent; using synthetic:tiny\n", g_model);
        snprintf(g_model, sizeof g_model, "synthetic:tiny");
        NB_ASSERT(nb_model_synthetic("tiny", 0, &g_m, err, sizeof err) == NB_OK);
    }
    nb_engine_params ep = nb_engine_default_params();
    ep.group_size = T_GROUP;
    ep.kv_memory = T_KV_MEMORY;
    ep.max_seqs = T_MAX_SEQS;
    g_e = nb_engine_new(g_m, &ep, err, sizeof err);
    if (!g_e) {
        fprintf(stderr, "engine: %s\n", err);
        return 1;
    }
    g_vocab = nb_model_get_config(g_m)->vocab_size;
    // Greedy and sampled speculation, and target-only decoding; contexts
    // cross several blocks so quantization happens on the way.
    make_case(&g_cases[0], 0, 4, 0.0f, 0, 150);
    make_case(&g_cases[1], 1, 3, 0.0f, 0, 100);
    make_case(&g_cases[2], 2, 4, 0.8f, 11, 120);
    make_case(&g_cases[3], 3, 6, 1.0f, 12345, 90);
    make_case(&g_cases[4], 4, 0, 0.0f, 0, 80);
    make_case(&g_cases[5], 5, 0, 0.7f, 99, 70);
    printf("model %s: reference acceptance %lld/%lld (case 0)\n", g_model,
           (long long)g_cases[0].accepted, (long long)g_cases[0].drafted);

    char ep_ipc[128], ep_tcp[64];
    snprintf(ep_ipc, sizeof ep_ipc, "ipc://%s/worker.sock", g_tmp);
    snprintf(ep_tcp, sizeof ep_tcp, "tcp://127.0.0.1:%d", free_tcp_port());

    worker w;
    worker_start(&w, ep_ipc, "worker-ipc.log");
    test_hello(ep_ipc);
    test_equal_to_engine(ep_ipc, "ipc");
    test_concurrent_clients(ep_ipc);
    test_many_sequences(ep_ipc);
    test_killed_client(ep_ipc);
    worker_stop(&w);

    worker_start(&w, ep_tcp, "worker-tcp.log");
    test_equal_to_engine(ep_tcp, "tcp");
    test_concurrent_clients(ep_tcp);
    worker_stop(&w);

    test_curve();
    test_generate_cli();

    nb_engine_destroy(&g_e);
    nb_model_free(&g_m);
    if (nb_test_failures == 0) {
        char p[160];
        snprintf(p, sizeof p, "%s/worker-ipc.log", g_tmp);
        unlink(p);
        snprintf(p, sizeof p, "%s/worker-tcp.log", g_tmp);
        unlink(p);
        snprintf(p, sizeof p, "%s/worker.sock", g_tmp);
        unlink(p);
        rmdir(g_tmp);
    } else {
        printf("worker logs kept in %s\n", g_tmp);
    }
    return nb_test_finish("test_clients");
}
