// generate.c: nibbler-generate, the one-command demo. Connects to a worker
// (--endpoint) or starts one on a private ipc socket, sends a prompt, runs
// the speculative (or target-only) loop through the C client, prints the
// text and a summary, and stops the worker it started.
//
// The one idea: this is a scheduler in miniature. Tokenization happens here
// (the worker speaks ids), the worker is driven only through nibbler.proto,
// and everything printed comes from the worker's replies.
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "nb_client.h"
#ifdef NB_HAVE_TOKENIZER
#include "tokenizer.h"
#endif

#define MAX_WORKER_ARGS 32

typedef struct gen_opts {
    const char *model;
    const char *endpoint;
    const char *prompt;
    const char *prompt_ids;
    uint32_t max_tokens;
    nb_client_mode mode;
    uint32_t gamma;
    float temperature;
    uint32_t top_k;
    float top_p;
    uint64_t seed;
    bool json;
    bool verbose;
    bool ignore_eos;
    int timeout_s;
    int start_timeout_s;
    // passed to a worker this tool starts
    const char *worker;
    const char *kv_cache;
    const char *backend;
    const char *group_size;
    const char *kv_memory;
    const char *target_weights;
    const char *max_model_len;
} gen_opts;

static void usage(FILE *f, const char *argv0) {
    fprintf(f,
        "usage: %s --model DIR|synthetic:NAME [options]\n"
        "\n"
        "Generates text with a nibbler worker: speculative decoding (the model drafts\n"
        "with 4-bit weights and a 4-bit view of its KV cache, then verifies) or\n"
        "target-only decoding. Without --endpoint it starts nibbler-worker itself on a\n"
        "private ipc socket and stops it afterwards.\n"
        "\n"
        "model and prompt:\n"
        "  --model DIR|synthetic:NAME  HF Llama checkpoint directory (its tokenizer.bin\n"
        "                       or tokenizer.json is used for text), or a built-in\n"
        "                       synthetic shape (tiny, llama-2-7b, llama-3-8b): random\n"
        "                       weights, the output is noise. Optional with --endpoint\n"
        "                       (then the worker's model name is used).\n"
        "  --prompt TEXT        prompt text; the model's BOS id is prepended\n"
        "  --prompt-ids 1,2,3   prompt token ids, sent as given (no BOS added)\n"
        "                       (neither: the prompt is the BOS token alone)\n"
        "generation:\n"
        "  --max-tokens N       tokens to generate (default 64)\n"
        "  --mode spec|ar       spec: Speculate rounds (default); ar: target-only Decode\n"
        "  --gamma N            drafts per speculative round (default 4)\n"
        "  --temperature T      0 = greedy (default 0)\n"
        "  --top-k K            keep the K most probable tokens (default 0: all)\n"
        "  --top-p P            nucleus mass (default 1: all)\n"
        "  --seed S             the sequence's sampling seed (default 0)\n"
        "  --ignore-eos         do not stop at the model's end-of-sequence ids\n"
        "worker:\n"
        "  --endpoint E         connect to a running worker (ipc://PATH or tcp://HOST:PORT)\n"
        "                       instead of starting one\n"
        "  --worker PATH        nibbler-worker binary to start (default: $NIBBLER_WORKER,\n"
        "                       then ../worker/nibbler-worker next to this program, then\n"
        "                       next to it, then PATH)\n"
        "  --kv-cache quant|fp16|fp  cache of a started worker: hierarchical INT8/INT4\n"
        "                       (default), unquantized f16, or unquantized in the model's\n"
        "                       dtype\n"
        "  --backend B          backend of a started worker (cpu, cuda)\n"
        "  --group-size G       tokens per KV block of a started worker\n"
        "  --kv-memory BYTES    KV pool bytes of a started worker\n"
        "  --target-weights model|int8  target weights of a started worker\n"
        "  --max-model-len N    context limit of a started worker\n"
        "  --start-timeout S    seconds to wait for a started worker's Hello (default 900)\n"
        "  --timeout S          seconds to wait for any one reply (default 600)\n"
        "  --verbose            show the started worker's log on stderr\n"
        "output:\n"
        "  --json               print one JSON object: tokens (count), token_ids, drafted,\n"
        "                       accepted, acceptance_rate, tokens_per_s, elapsed_s,\n"
        "                       prefill_s, finish_reason, model, synthetic, text (when a\n"
        "                       tokenizer was read)\n"
        "  -h, --help           this text\n",
        argv0);
}

static bool parse_u32(const char *s, uint32_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v > UINT32_MAX || s[0] == '-') return false;
    *out = (uint32_t)v;
    return true;
}

static bool parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end) return false;
    *out = v;
    return true;
}

// "1,2,3" -> ids (caller frees). Returns the count, or -1 on a bad list.
static long parse_id_list(const char *s, uint32_t **out) {
    size_t cap = 16, n = 0;
    uint32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return -1;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (errno || end == p || v > UINT32_MAX || *p == '-') {
            free(ids);
            return -1;
        }
        if (n == cap) {
            uint32_t *g = realloc(ids, 2 * cap * sizeof *ids);
            if (!g) {
                free(ids);
                return -1;
            }
            ids = g;
            cap *= 2;
        }
        ids[n++] = (uint32_t)v;
        p = end;
        if (*p && *p != ',' && *p != ' ') {
            free(ids);
            return -1;
        }
    }
    *out = ids;
    return (long)n;
}

// ---------------------------------------------------------------- the worker

static volatile sig_atomic_t g_worker_pid = 0;

static void on_signal(int sig) {
    if (g_worker_pid > 0) kill((pid_t)g_worker_pid, SIGTERM);
    signal(sig, SIG_DFL);
    raise(sig);
}

static bool is_exec(const char *p) { return p && access(p, X_OK) == 0; }

// The worker binary: --worker, $NIBBLER_WORKER, ../worker/nibbler-worker
// relative to this executable (the build tree), beside it (an install),
// then PATH (execvp). Writes into buf (PATH_MAX).
static const char *find_worker(const char *opt, char *buf) {
    if (opt) return opt;
    const char *env = getenv("NIBBLER_WORKER");
    if (env && *env) return env;
    char self[PATH_MAX - 64];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            snprintf(buf, PATH_MAX, "%s/../worker/nibbler-worker", self);
            if (is_exec(buf)) return buf;
            snprintf(buf, PATH_MAX, "%s/nibbler-worker", self);
            if (is_exec(buf)) return buf;
        }
    }
    return "nibbler-worker";
}

typedef struct worker_proc {
    pid_t pid;
    char dir[64];      // private temp dir holding the socket and the log
    char endpoint[128];
    char log[96];
} worker_proc;

static int start_worker(const gen_opts *o, worker_proc *w) {
    memset(w, 0, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "/tmp/nibbler-generate-XXXXXX");
    if (!mkdtemp(w->dir)) {
        fprintf(stderr, "nibbler-generate: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    snprintf(w->endpoint, sizeof w->endpoint, "ipc://%s/worker.sock", w->dir);
    snprintf(w->log, sizeof w->log, "%s/worker.log", w->dir);
    char pathbuf[PATH_MAX];
    const char *bin = find_worker(o->worker, pathbuf);
    const char *argv[MAX_WORKER_ARGS];
    int a = 0;
    argv[a++] = bin;
    argv[a++] = "--model";
    argv[a++] = o->model;
    argv[a++] = "--endpoint";
    argv[a++] = w->endpoint;
#define PASS(flag, val)                                                                      \
    do {                                                                                     \
        if (val) {                                                                           \
            argv[a++] = flag;                                                                \
            argv[a++] = val;                                                                 \
        }                                                                                    \
    } while (0)
    PASS("--kv-cache", o->kv_cache);
    PASS("--backend", o->backend);
    PASS("--group-size", o->group_size);
    PASS("--kv-memory", o->kv_memory);
    PASS("--target-weights", o->target_weights);
    PASS("--max-model-len", o->max_model_len);
#undef PASS
    argv[a] = NULL;
    if (o->verbose) {
        fprintf(stderr, "nibbler-generate: starting");
        for (int i = 0; i < a; i++) fprintf(stderr, " %s", argv[i]);
        fputc('\n', stderr);
    }
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "nibbler-generate: fork: %s\n", strerror(errno));
        rmdir(w->dir);
        return -1;
    }
    if (pid == 0) {
        // NOTE: the worker dies with this process, even on SIGKILL.
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);
        int fd = o->verbose ? dup(2) : open(w->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            if (fd > 2) close(fd);
        }
        execvp(bin, (char *const *)argv);
        fprintf(stderr, "nibbler-generate: cannot run %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    w->pid = pid;
    g_worker_pid = pid;
    return 0;
}

static void print_worker_log(const worker_proc *w) {
    FILE *f = fopen(w->log, "r");
    if (!f) return;
    char line[1024];
    fprintf(stderr, "---- worker log (%s) ----\n", w->log);
    while (fgets(line, sizeof line, f)) fputs(line, stderr);
    fprintf(stderr, "----\n");
    fclose(f);
}

// Waits up to timeout_s for the worker to exit; then SIGTERM, then SIGKILL.
// Returns its wait status.
static int reap_worker(worker_proc *w, double timeout_s) {
    int status = 0;
    struct timespec ts = {0, 10 * 1000 * 1000};
    for (int stage = 0; stage < 3; stage++) {
        double waited = 0;
        double limit = stage == 0 ? timeout_s : 5.0;
        while (waited < limit) {
            pid_t r = waitpid(w->pid, &status, WNOHANG);
            if (r == w->pid || (r < 0 && errno == ECHILD)) {
                w->pid = 0;
                g_worker_pid = 0;
                return status;
            }
            nanosleep(&ts, NULL);
            waited += 0.01;
        }
        kill(w->pid, stage == 0 ? SIGTERM : SIGKILL);
    }
    waitpid(w->pid, &status, 0);
    w->pid = 0;
    g_worker_pid = 0;
    return status;
}

static void cleanup_worker_dir(const worker_proc *w) {
    char p[160];
    snprintf(p, sizeof p, "%s/worker.sock", w->dir);
    unlink(p);
    unlink(w->log);
    rmdir(w->dir);
}

// Hello, retried until the worker answers, exits, or start_timeout_s passes.
static int wait_hello(nb_client *c, worker_proc *w, int start_timeout_s,
                      nb_client_response **hello) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int rc = nb_client_hello(c, hello);
        if (rc != NB_CLIENT_ERR_TIMEOUT) return rc;
        if (w && w->pid) {
            int status;
            if (waitpid(w->pid, &status, WNOHANG) == w->pid) {
                w->pid = 0;
                g_worker_pid = 0;
                fprintf(stderr, "nibbler-generate: the worker exited before answering (%s %d)\n",
                        WIFEXITED(status) ? "exit status" : "signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
                return NB_CLIENT_ERR_TRANSPORT;
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > start_timeout_s) return rc;
    }
}

// ---------------------------------------------------------------- text

typedef struct text_buf {
    char *s;
    size_t len, cap;
} text_buf;

static void text_append(text_buf *b, const char *p, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 256) + n;
        char *g = realloc(b->s, cap);
        if (!g) return;
        b->s = g;
        b->cap = cap;
    }
    memcpy(b->s + b->len, p, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static const char *finish_name(int r) {
    switch (r) {
    case NIBBLER__V1__FINISH_REASON__EOS: return "eos";
    case NIBBLER__V1__FINISH_REASON__MAX_TOKENS: return "max_tokens";
    default: return "none";
    }
}

int main(int argc, char **argv) {
    gen_opts o = {
        .max_tokens = 64,
        .mode = NB_CLIENT_MODE_SPEC,
        .gamma = 4,
        .top_p = 1.0f,
        .timeout_s = 600,
        .start_timeout_s = 900,
    };
    enum {
        O_MODEL = 256, O_ENDPOINT, O_PROMPT, O_PROMPT_IDS, O_MAX_TOKENS, O_MODE, O_GAMMA,
        O_TEMP, O_TOPK, O_TOPP, O_SEED, O_JSON, O_KV_CACHE, O_WORKER, O_BACKEND, O_GROUP,
        O_KV_MEM, O_TW, O_MAXLEN, O_VERBOSE, O_TIMEOUT, O_START_TIMEOUT, O_IGNORE_EOS,
    };
    static const struct option longopts[] = {
        {"model", required_argument, 0, O_MODEL},
        {"endpoint", required_argument, 0, O_ENDPOINT},
        {"prompt", required_argument, 0, O_PROMPT},
        {"prompt-ids", required_argument, 0, O_PROMPT_IDS},
        {"max-tokens", required_argument, 0, O_MAX_TOKENS},
        {"mode", required_argument, 0, O_MODE},
        {"gamma", required_argument, 0, O_GAMMA},
        {"temperature", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP},
        {"seed", required_argument, 0, O_SEED},
        {"json", no_argument, 0, O_JSON},
        {"kv-cache", required_argument, 0, O_KV_CACHE},
        {"worker", required_argument, 0, O_WORKER},
        {"backend", required_argument, 0, O_BACKEND},
        {"group-size", required_argument, 0, O_GROUP},
        {"kv-memory", required_argument, 0, O_KV_MEM},
        {"target-weights", required_argument, 0, O_TW},
        {"max-model-len", required_argument, 0, O_MAXLEN},
        {"verbose", no_argument, 0, O_VERBOSE},
        {"timeout", required_argument, 0, O_TIMEOUT},
        {"start-timeout", required_argument, 0, O_START_TIMEOUT},
        {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int ch;
    uint32_t u;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        bool ok = true;
        switch (ch) {
        case O_MODEL: o.model = optarg; break;
        case O_ENDPOINT: o.endpoint = optarg; break;
        case O_PROMPT: o.prompt = optarg; break;
        case O_PROMPT_IDS: o.prompt_ids = optarg; break;
        case O_MAX_TOKENS: ok = parse_u32(optarg, &o.max_tokens) && o.max_tokens > 0; break;
        case O_MODE:
            if (!strcmp(optarg, "spec")) o.mode = NB_CLIENT_MODE_SPEC;
            else if (!strcmp(optarg, "ar")) o.mode = NB_CLIENT_MODE_AR;
            else ok = false;
            break;
        case O_GAMMA: ok = parse_u32(optarg, &o.gamma) && o.gamma > 0; break;
        case O_TEMP: ok = parse_float(optarg, &o.temperature) && o.temperature >= 0; break;
        case O_TOPK: ok = parse_u32(optarg, &o.top_k); break;
        case O_TOPP: ok = parse_float(optarg, &o.top_p) && o.top_p >= 0 && o.top_p <= 1; break;
        case O_SEED: {
            char *end;
            errno = 0;
            o.seed = strtoull(optarg, &end, 0);
            ok = !errno && end != optarg && !*end;
            break;
        }
        case O_JSON: o.json = true; break;
        case O_KV_CACHE:
            o.kv_cache = optarg;
            ok = !strcmp(optarg, "quant") || !strcmp(optarg, "fp16") || !strcmp(optarg, "fp");
            break;
        case O_WORKER: o.worker = optarg; break;
        case O_BACKEND: o.backend = optarg; break;
        case O_GROUP: o.group_size = optarg; ok = parse_u32(optarg, &u); break;
        case O_KV_MEM: o.kv_memory = optarg; break;
        case O_TW: o.target_weights = optarg; break;
        case O_MAXLEN: o.max_model_len = optarg; ok = parse_u32(optarg, &u); break;
        case O_VERBOSE: o.verbose = true; break;
        case O_TIMEOUT: ok = parse_u32(optarg, &u) && u > 0; o.timeout_s = (int)u; break;
        case O_START_TIMEOUT: ok = parse_u32(optarg, &u) && u > 0; o.start_timeout_s = (int)u; break;
        case O_IGNORE_EOS: o.ignore_eos = true; break;
        case 'h': usage(stdout, argv[0]); return 0;
        default: usage(stderr, argv[0]); return 2;
        }
        if (!ok) {
            fprintf(stderr, "nibbler-generate: bad value for --%s: \"%s\"\n",
                    longopts[ch - O_MODEL].name, optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "nibbler-generate: unexpected argument \"%s\" (see --help)\n",
                argv[optind]);
        return 2;
    }
    if (!o.model && !o.endpoint) {
        fprintf(stderr, "nibbler-generate: --model is required without --endpoint (see --help)\n");
        return 2;
    }
    if (o.prompt && o.prompt_ids) {
        fprintf(stderr, "nibbler-generate: give --prompt or --prompt-ids, not both\n");
        return 2;
    }
    if (o.endpoint && (o.kv_cache || o.backend || o.group_size || o.kv_memory ||
                       o.target_weights || o.max_model_len || o.worker))
        fprintf(stderr, "nibbler-generate: note: worker options are ignored with --endpoint "
                        "(the running worker's settings apply)\n");

    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);

    int ret = 1;
    worker_proc w = {0};
    bool started = false;
    if (!o.endpoint) {
        if (start_worker(&o, &w)) return 1;
        started = true;
    }
    nb_client_params cp = nb_client_default_params();
    cp.endpoint = o.endpoint ? o.endpoint : w.endpoint;
    cp.client_name = "nibbler-generate";
    cp.timeout_ms = started ? 1000 : o.timeout_s * 1000;
    char err[512];
    nb_client *c = nb_client_new(&cp, err, sizeof err);
    nb_client_response *hello = NULL;
    uint32_t *prompt = NULL;
    long n_prompt = 0;
    nb_client_gen_result res = {0};
    text_buf text = {0};
    cJSON *js = NULL;
#ifdef NB_HAVE_TOKENIZER
    nb_tokenizer *tok = NULL;
#endif
    if (!c) {
        fprintf(stderr, "nibbler-generate: %s\n", err);
        goto out_stop_worker;
    }
    int rc = started ? wait_hello(c, &w, o.start_timeout_s, &hello)
                     : nb_client_hello(c, &hello);
    if (rc) {
        fprintf(stderr, "nibbler-generate: no Hello from %s: %s\n", cp.endpoint,
                nb_client_error(c));
        if (started && !o.verbose) print_worker_log(&w);
        goto out_free_client;
    }
    nb_client_destroy(&c);
    cp.timeout_ms = o.timeout_s * 1000;
    if (!(c = nb_client_new(&cp, err, sizeof err))) {
        fprintf(stderr, "nibbler-generate: %s\n", err);
        goto out_free_client;
    }
    const Nibbler__V1__ModelInfo *mi = hello->hello->model;
    if (!mi) {
        fprintf(stderr, "nibbler-generate: Hello carries no model info\n");
        goto out_free_client;
    }
    const char *model_name = o.model ? o.model : mi->name;
    const bool synthetic = mi->synthetic || (model_name && !strncmp(model_name, "synthetic:", 10));
    if (synthetic)
        fprintf(stderr,
                "\n*** NOTE: %s is a SYNTHETIC model: random weights. Its output is NOISE;\n"
                "*** use it for speed and plumbing only, never for quality or acceptance.\n\n",
                model_name);

#ifdef NB_HAVE_TOKENIZER
    if (!synthetic && model_name) {
        char terr[256];
        if (nb_tokenizer_load(model_name, &tok, terr, sizeof terr) != NB_OK) {
            if (!o.json) fprintf(stderr, "nibbler-generate: no tokenizer (%s); printing ids\n", terr);
            tok = NULL;
        }
    }
#endif
    if (o.prompt_ids) {
        n_prompt = parse_id_list(o.prompt_ids, &prompt);
        if (n_prompt <= 0) {
            fprintf(stderr, "nibbler-generate: --prompt-ids wants a list like 1,2,3\n");
            goto out_free_client;
        }
    } else {
        size_t len = o.prompt ? strlen(o.prompt) : 0;
        prompt = malloc(sizeof *prompt * (len + 2));
        if (!prompt) goto out_free_client;
        prompt[n_prompt++] = mi->bos_id;
        if (len) {
#ifdef NB_HAVE_TOKENIZER
            if (tok) {
                int32_t need = 0;
                int32_t *ids = malloc(sizeof *ids * (len + 2));
                if (!ids || nb_tokenizer_encode(tok, o.prompt, len, ids, (int32_t)len + 2,
                                                &need) != NB_OK) {
                    fprintf(stderr, "nibbler-generate: cannot tokenize the prompt\n");
                    free(ids);
                    goto out_free_client;
                }
                uint32_t *g = realloc(prompt, sizeof *prompt * ((size_t)need + 1));
                if (!g) {
                    free(ids);
                    goto out_free_client;
                }
                prompt = g;
                for (int32_t i = 0; i < need; i++) prompt[n_prompt++] = (uint32_t)ids[i];
                free(ids);
            } else
#endif
            {
                if (!synthetic) {
                    fprintf(stderr, "nibbler-generate: cannot read a tokenizer for %s: give "
                                    "--prompt-ids\n", model_name ? model_name : "the model");
                    goto out_free_client;
                }
                // NOTE: synthetic models have no tokenizer; bytes stand in for
                // ids (noise in, noise out).
                for (size_t i = 0; i < len; i++)
                    prompt[n_prompt++] = ((unsigned char)o.prompt[i] + 3u) % mi->vocab_size;
            }
        }
    }

    nb_client_gen_params gp = nb_client_gen_default_params();
    gp.mode = o.mode;
    gp.gamma = o.gamma;
    gp.max_tokens = o.max_tokens;
    gp.temperature = o.temperature;
    gp.top_k = o.top_k;
    gp.top_p = o.top_p;
    gp.seed = o.seed;
    if (!o.ignore_eos) {
        gp.eos_ids = mi->eos_ids;
        gp.n_eos_ids = mi->n_eos_ids;
    }
    rc = nb_client_generate(c, &gp, prompt, (size_t)n_prompt, &res);
    if (rc) {
        fprintf(stderr, "nibbler-generate: generation failed after %zu tokens: %s\n",
                res.n_tokens, nb_client_error(c));
        goto out_free_client;
    }

    bool have_text = false;
#ifdef NB_HAVE_TOKENIZER
    if (tok) {
        have_text = true;
        char piece[512];
        int32_t prev = o.prompt_ids ? -1 : (int32_t)prompt[n_prompt - 1];
        if (o.prompt) text_append(&text, o.prompt, strlen(o.prompt));
        for (size_t i = 0; i < res.n_tokens; i++) {
            int n = nb_tokenizer_decode_token(tok, prev, (int32_t)res.tokens[i], piece, sizeof piece);
            if (n > 0) text_append(&text, piece, (size_t)n);
            prev = (int32_t)res.tokens[i];
        }
    }
#endif
    const double tps = res.elapsed_s > 0 ? (double)res.n_tokens / res.elapsed_s : 0;
    const double acc = res.n_drafted ? (double)res.n_accepted / (double)res.n_drafted : 0;
    if (o.json) {
        js = cJSON_CreateObject();
        cJSON *ids = cJSON_AddArrayToObject(js, "token_ids");
        for (size_t i = 0; i < res.n_tokens; i++)
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(res.tokens[i]));
        cJSON_AddNumberToObject(js, "tokens", (double)res.n_tokens);
        cJSON_AddNumberToObject(js, "prompt_tokens", (double)n_prompt);
        cJSON_AddNumberToObject(js, "drafted", (double)res.n_drafted);
        cJSON_AddNumberToObject(js, "accepted", (double)res.n_accepted);
        cJSON_AddNumberToObject(js, "acceptance_rate", acc);
        cJSON_AddNumberToObject(js, "tokens_per_s", tps);
        cJSON_AddNumberToObject(js, "elapsed_s", res.elapsed_s);
        cJSON_AddNumberToObject(js, "prefill_s", res.prefill_s);
        cJSON_AddNumberToObject(js, "rounds", res.n_rounds);
        cJSON_AddStringToObject(js, "finish_reason", finish_name(res.finish_reason));
        cJSON_AddStringToObject(js, "mode", o.mode == NB_CLIENT_MODE_SPEC ? "spec" : "ar");
        if (o.mode == NB_CLIENT_MODE_SPEC) cJSON_AddNumberToObject(js, "gamma", o.gamma);
        cJSON_AddStringToObject(js, "model", model_name ? model_name : "");
        cJSON_AddBoolToObject(js, "synthetic", synthetic);
        if (have_text) cJSON_AddStringToObject(js, "text", text.s ? text.s : "");
        char *s = cJSON_PrintUnformatted(js);
        if (s) {
            puts(s);
            free(s);
        }
    } else {
        if (have_text) {
            printf("%s\n", text.s ? text.s : "");
        } else {
            printf("%s", synthetic ? "token ids (noise): " : "token ids: ");
            for (size_t i = 0; i < res.n_tokens; i++)
                printf("%s%u", i ? "," : "", res.tokens[i]);
            printf("\n");
        }
        printf("\n[%s] %zu tokens in %.3f s (%.1f tokens/s, prefill %.3f s), ",
               o.mode == NB_CLIENT_MODE_SPEC ? "spec" : "ar", res.n_tokens, res.elapsed_s, tps,
               res.prefill_s);
        if (o.mode == NB_CLIENT_MODE_SPEC)
            printf("gamma %u, drafted %llu, accepted %llu, acceptance %.1f%%", o.gamma,
                   (unsigned long long)res.n_drafted, (unsigned long long)res.n_accepted,
                   100.0 * acc);
        else
            printf("target-only");
        printf(", finish: %s%s\n", finish_name(res.finish_reason),
               synthetic ? " (synthetic model: noise)" : "");
    }
    fflush(stdout);
    ret = 0;

out_free_client:
    if (started && c) {
        // Stop the worker we started: a short timeout, it answers at once.
        nb_client_destroy(&c);
        cp.timeout_ms = 10000;
        c = nb_client_new(&cp, err, sizeof err);
        if (c && w.pid) nb_client_shutdown(c, NULL);
    }
    nb_client_destroy(&c);
out_stop_worker:
    if (started) {
        if (w.pid) {
            int status = reap_worker(&w, 30.0);
            if (ret == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
                fprintf(stderr, "nibbler-generate: the worker did not exit cleanly (%s %d)\n",
                        WIFEXITED(status) ? "exit status" : "signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
                if (!o.verbose) print_worker_log(&w);
            }
        }
        cleanup_worker_dir(&w);
    }
    cJSON_Delete(js);
    free(text.s);
    free(prompt);
    nb_client_gen_result_clear(&res);
    nb_client_response_free(&hello);
#ifdef NB_HAVE_TOKENIZER
    nb_tokenizer_free(&tok);
#endif
    return ret;
}
