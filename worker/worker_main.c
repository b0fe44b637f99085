// worker_main.c: the nibbler-worker command line. Parses flags into
// nb_server_params, installs the SIGTERM/SIGINT handlers and runs the server
// loop (server.h). Exit codes: 0 clean exit, 1 runtime failure, 2 refused
// configuration.
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

static void usage(FILE *f) {
    fprintf(f,
"usage: nibbler-worker --model DIR|synthetic:NAME --endpoint ipc:///path|tcp://host:port [flags]\n"
"\n"
"Serves one model to schedulers over ZeroMQ (ROUTER socket; clients use DEALER)\n"
"speaking nibbler.v1 protobuf messages (docs/protocol.md).\n"
"\n"
"  --model DIR|synthetic:NAME   HuggingFace Llama/Mistral/Qwen2 checkpoint directory, or\n"
"                               a built-in random-weight shape (tiny, llama-2-7b,\n"
"                               llama-3-8b; its output is noise)\n"
"  --endpoint E                 ipc:///path or tcp://host:port to bind. tcp off loopback\n"
"                               (not 127.x, ::1, localhost) is refused without CURVE keys\n"
"  --backend cpu|cuda           compute backend (default cpu; cuda in builds with CUDA,\n"
"                               else --backend cuda exits with status 2)\n"
"  --device N                   cuda device ordinal (default 0)\n"
"  --group-size G               tokens per KV block: 64, 128 (default) or 256\n"
"  --kv-memory BYTES            host/device bytes for the KV pools (suffix K, M, G;\n"
"                               default 256M)\n"
"  --gpu-memory-utilization F   share of the GPU's total memory this worker may use:\n"
"                               weights and workspace first, the KV pools get the rest\n"
"                               (cuda only; default 0.9 unless --kv-memory is given)\n"
"  --max-seqs N                 live sequences at once, also the most one command names\n"
"                               (default 16)\n"
"  --max-model-len N            tokens per sequence (default: the model's context)\n"
"  --target-weights model|int8  target precision: the checkpoint's dtype (default, exact)\n"
"                               or hierarchical 8-bit weights\n"
"  --kv-cache quant|fp16|fp     quant: hierarchical INT8/INT4 cache (default); fp16: an\n"
"                               unquantized f16 cache; fp: unquantized in the model's dtype\n"
"  --max-gamma N                most drafts per Draft/Speculate (default 8, < G, <= 16)\n"
"  --prefill-chunk N            prompt tokens per sequence per forward pass (default 1024;\n"
"                               at most --max-batch-rows and the context length)\n"
"  --max-batch-rows N           most rows in one forward pass (default 1024)\n"
"  --no-prefix-cache            do not share equal prompt prefixes between sequences\n"
"  --batch-invariant-draft      cuda: drafts with the row-invariant attention split too, so\n"
"                               a sampled sequence's tokens do not depend on its batch\n"
"                               (slower drafts; greedy output is the target's either way)\n"
"  --seed S                     weight seed of synthetic models (default 0)\n"
"  --max-message-bytes N        largest request accepted (default 64M); larger ones get\n"
"                               MESSAGE_TOO_LARGE; ZeroMQ drops above 2N+4K (ZMQ_MAXMSGSIZE)\n"
"  --curve-secret-key FILE      the server's Z85 CURVE secret key (40 characters); enables\n"
"                               encryption and client authentication\n"
"  --curve-allowed-clients FILE Z85 public keys of the clients to serve, one per line\n"
"                               ('#' comments); needed with --curve-secret-key\n"
"  --log-level L                debug, info (default), warn or error; logs go to stderr\n"
"  --help                       this text\n"
"\n"
"Signals: SIGTERM/SIGINT finish and answer the request in flight, then exit 0.\n"
"Exit status: 0 clean exit (Shutdown, completed Drain, signal), 1 runtime failure,\n"
"2 refused configuration.\n");
}

static bool parse_size(const char *s, size_t *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0)) return false;
    double m = 1;
    switch (*end) {
    case 'k': case 'K': m = 1024.0; end++; break;
    case 'm': case 'M': m = 1024.0 * 1024; end++; break;
    case 'g': case 'G': m = 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return false;
    *out = (size_t)(v * m);
    return true;
}

static bool parse_int(const char *s, long lo, long hi, int32_t *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int32_t)v;
    return true;
}

static void on_signal(int sig) {
    (void)sig;
    nb_server_request_stop();
}

enum {
    OPT_MODEL = 256, OPT_ENDPOINT, OPT_BACKEND, OPT_GROUP, OPT_KVMEM, OPT_GPUUTIL, OPT_DEVICE, OPT_MAXSEQS,
    OPT_MAXLEN, OPT_TARGET, OPT_KVCACHE, OPT_GAMMA, OPT_CHUNK, OPT_ROWS, OPT_NOPREFIX, OPT_SEED,
    OPT_MAXMSG, OPT_CURVE_SK, OPT_CURVE_CL, OPT_LOG, OPT_HELP, OPT_INVDRAFT,
};

int main(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, OPT_MODEL},
        {"endpoint", required_argument, 0, OPT_ENDPOINT},
        {"backend", required_argument, 0, OPT_BACKEND},
        {"group-size", required_argument, 0, OPT_GROUP},
        {"kv-memory", required_argument, 0, OPT_KVMEM},
        {"gpu-memory-utilization", required_argument, 0, OPT_GPUUTIL},
        {"device", required_argument, 0, OPT_DEVICE},
        {"max-seqs", required_argument, 0, OPT_MAXSEQS},
        {"max-model-len", required_argument, 0, OPT_MAXLEN},
        {"target-weights", required_argument, 0, OPT_TARGET},
        {"kv-cache", required_argument, 0, OPT_KVCACHE},
        {"max-gamma", required_argument, 0, OPT_GAMMA},
        {"prefill-chunk", required_argument, 0, OPT_CHUNK},
        {"max-batch-rows", required_argument, 0, OPT_ROWS},
        {"no-prefix-cache", no_argument, 0, OPT_NOPREFIX},
        {"batch-invariant-draft", no_argument, 0, OPT_INVDRAFT},
        {"seed", required_argument, 0, OPT_SEED},
        {"max-message-bytes", required_argument, 0, OPT_MAXMSG},
        {"curve-secret-key", required_argument, 0, OPT_CURVE_SK},
        {"curve-allowed-clients", required_argument, 0, OPT_CURVE_CL},
        {"log-level", required_argument, 0, OPT_LOG},
        {"help", no_argument, 0, OPT_HELP},
        {0, 0, 0, 0},
    };
    nb_server_params p = nb_server_default_params();
    bool have_kvmem = false;
    int c, li = -1;
    opterr = 0;
    while ((li = -1, c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        const char *a = optarg;
        bool ok = true;
        switch (c) {
        case OPT_MODEL: p.model = a; break;
        case OPT_ENDPOINT: p.endpoint = a; break;
        case OPT_BACKEND: p.backend = a; break;
        case OPT_GROUP: ok = parse_int(a, 1, 4096, &p.group_size); break;
        case OPT_KVMEM: ok = parse_size(a, &p.kv_memory) && p.kv_memory > 0; have_kvmem = true; break;
        case OPT_GPUUTIL: {
            char *end = NULL;
            p.gpu_memory_utilization = strtod(a, &end);
            ok = end != a && !*end && p.gpu_memory_utilization > 0 && p.gpu_memory_utilization <= 1;
            break;
        }
        case OPT_DEVICE: ok = parse_int(a, 0, 1023, &p.device); break;
        case OPT_MAXSEQS: ok = parse_int(a, 1, 1 << 20, &p.max_seqs); break;
        case OPT_MAXLEN: ok = parse_int(a, 2, 1 << 24, &p.max_model_len); break;
        case OPT_TARGET:
            if (strcmp(a, "model") == 0) p.target_weights = NB_TARGET_WEIGHTS_MODEL;
            else if (strcmp(a, "int8") == 0) p.target_weights = NB_TARGET_WEIGHTS_INT8;
            else ok = false;
            break;
        case OPT_KVCACHE:
            if (strcmp(a, "quant") == 0) { p.kv_quant = true; p.kv_dtype = -1; }
            else if (strcmp(a, "fp16") == 0) { p.kv_quant = false; p.kv_dtype = 1; /* NB_DTYPE_F16 */ }
            else if (strcmp(a, "fp") == 0) { p.kv_quant = false; p.kv_dtype = -1; }
            else ok = false;
            break;
        case OPT_GAMMA: ok = parse_int(a, 1, 16, &p.max_gamma); break;
        case OPT_CHUNK: ok = parse_int(a, 1, 1 << 20, &p.prefill_chunk); break;
        case OPT_ROWS: ok = parse_int(a, 1, 1 << 24, &p.max_batch_rows); break;
        case OPT_NOPREFIX: p.prefix_cache = false; break;
        case OPT_INVDRAFT: p.draft_batch_invariant = true; break;
        case OPT_SEED: {
            char *end = NULL;
            p.seed = strtoull(a, &end, 0);
            ok = end != a && !*end;
            break;
        }
        case OPT_MAXMSG: ok = parse_size(a, &p.max_message_bytes); break;
        case OPT_CURVE_SK: p.curve_secret_key_file = a; break;
        case OPT_CURVE_CL: p.curve_allowed_clients_file = a; break;
        case OPT_LOG: {
            nb_log_level l;
            ok = nb_log_level_parse(a, &l);
            if (ok) nb_log_set_level(l);
            break;
        }
        case OPT_HELP: usage(stdout); return 0;
        default:
            fprintf(stderr, "nibbler-worker: unknown or incomplete option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "nibbler-worker: bad value '%s' for --%s (see --help)\n", a,
                    li >= 0 ? opts[li].name : "?");
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "nibbler-worker: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (!p.model || !p.endpoint) {
        fprintf(stderr, "nibbler-worker: --model and --endpoint are required (see --help)\n");
        return 2;
    }
    if (have_kvmem && p.gpu_memory_utilization > 0) {
        nb_log(NB_LOG_ERROR, "--kv-memory and --gpu-memory-utilization exclude each other");
        return 2;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    char err[1024] = "";
    int code = 0;
    nb_server *s = nb_server_new(&p, true, &code, err, sizeof(err));
    if (!s) {
        nb_log(NB_LOG_ERROR, "%s", err);
        return code;
    }
    code = nb_server_run(s);
    nb_server_destroy(&s);
    return code;
}
