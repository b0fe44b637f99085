// bench_acceptance: acceptance rate of nibbler's self-speculative draft
// against its target on a real checkpoint, and the perplexity cost of the
// quantized KV cache. Prints markdown tables; never fails on the numbers.
//
//   bench_acceptance MODEL_DIR SHARED_DATA_DIR [--prompts specbench|essays]
//       [--n-prompts N] [--ctx TOKENS] [--gen TOKENS] [--ppl TOKENS]
//       [--ablations both,kv,w4]
//
// Ablations (QuantSpec's): "both" = 4-bit weights + INT4 (upper-nibble) KV,
// "kv" = INT4 KV with the target's weights, "w4" = 4-bit weights with the
// INT8 KV view. Acceptance = accepted drafts / proposed drafts, per gamma,
// greedy and at temperature 0.7. Perplexity: teacher-forced NLL of held-out
// essay text, one token per pass (so each row sees the cache exactly as
// decoding would), unquantized cache vs INT8 (target view) cache.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "tokenizer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

typedef struct prompt { int32_t *ids; int32_t n; } prompt;

// Spec-Bench: the first turn of evenly spaced questions.
static int load_specbench(const char *data, const nb_tokenizer *tok, int bos, prompt *out, int n) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/spec_bench_questions.jsonl", data);
    char *txt = read_file(path, NULL);
    if (!txt) return 0;
    int lines = 0;
    for (char *p = txt; *p; p++) lines += *p == '\n';
    int step = lines / n > 0 ? lines / n : 1, got = 0, li = 0;
    for (char *line = strtok(txt, "\n"); line && got < n; line = strtok(NULL, "\n"), li++) {
        if (li % step) continue;
        cJSON *j = cJSON_Parse(line);
        const cJSON *turns = j ? cJSON_GetObjectItem(j, "turns") : NULL;
        const cJSON *t0 = turns ? cJSON_GetArrayItem(turns, 0) : NULL;
        if (cJSON_IsString(t0)) {
            int32_t cap = 4096, nn = 0;
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)(cap + 1));
            ids[0] = bos;
            if (nb_tokenizer_encode(tok, t0->valuestring, strlen(t0->valuestring), ids + 1, cap, &nn) == NB_OK) {
                out[got].ids = ids;
                out[got].n = nn + 1;
                got++;
            } else {
                free(ids);
            }
        }
        cJSON_Delete(j);
    }
    free(txt);
    return got;
}

// Essays: ctx tokens from evenly spaced offsets of the collection.
static int load_essays(const char *data, const nb_tokenizer *tok, int bos, int ctx, int skip,
                       prompt *out, int n) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/paul_graham_essays.json", data);
    char *txt = read_file(path, NULL);
    if (!txt) return 0;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    const cJSON *t = j ? cJSON_GetObjectItem(j, "text") : NULL;
    if (!cJSON_IsString(t)) { cJSON_Delete(j); return 0; }
    size_t len = strlen(t->valuestring);
    int32_t cap = (int32_t)(len / 2 + 16), nn = 0;
    int32_t *all = malloc(sizeof(int32_t) * (size_t)cap);
    nb_status st = nb_tokenizer_encode(tok, t->valuestring, len, all, cap, &nn);
    cJSON_Delete(j);
    if (st != NB_OK) { free(all); return 0; }
    int got = 0;
    int64_t stride = (nn - ctx - skip) / (n > 0 ? n : 1);
    for (int k = 0; k < n && stride > 0; k++) {
        out[got].ids = malloc(sizeof(int32_t) * (size_t)(ctx + 1));
        out[got].ids[0] = bos;
        memcpy(out[got].ids + 1, all + skip + k * stride, sizeof(int32_t) * (size_t)ctx);
        out[got].n = ctx + 1;
        got++;
    }
    free(all);
    return got;
}

static nb_engine *make_engine(const nb_model *m, bool quant, bool w4, bool kv4, int max_len,
                              char *err) {
    nb_engine_params p = nb_engine_default_params();
    p.quantized_cache = quant;
    p.group_size = 128;
    p.max_seqs = 4;
    p.max_seq_len = max_len;
    p.max_gamma = 8;
    p.prefill_chunk = 256;
    p.max_batch_rows = 512;
    p.kv_memory = (size_t)512 << 20;
    p.draft_w4 = w4;
    p.draft_int4_kv = kv4;
    return nb_engine_new(m, &p, err, 256);
}

// Speculative generation of `gen` tokens; returns acceptance counts.
static nb_status spec_run(nb_engine *e, const prompt *pr, float temp, uint64_t seed, int gamma,
                          int gen, int64_t *drafted, int64_t *accepted) {
    nb_sampling_params sp = {temp, 0, 1.0f, seed};
    int32_t s, next, done = 0;
    nb_status st, sst;
    if ((st = nb_engine_seq_add(e, &sp, &s)) != NB_OK) return st;
    const int32_t *pp[1] = {pr->ids};
    st = nb_engine_prefill(e, 1, &s, pp, &pr->n, &next, NULL, NULL, &sst);
    if (st == NB_OK) st = sst;
    while (st == NB_OK && done < gen) {
        int32_t d[16], out[16], n_out, n_acc;
        st = nb_engine_draft(e, 1, &s, gamma, d, &sst);
        if (st == NB_OK) st = sst;
        if (st == NB_OK) st = nb_engine_verify(e, 1, &s, out, NULL, &n_out, &n_acc, &sst);
        if (st == NB_OK) st = sst;
        if (st != NB_OK) break;
        *drafted += gamma;
        *accepted += n_acc;
        done += n_out;
    }
    nb_engine_seq_free(e, s);
    return st;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR SHARED_DATA_DIR [--prompts specbench|essays] "
                        "[--n-prompts N] [--ctx T] [--gen T] [--ppl T] [--ablations both,kv,w4]\n",
                argv[0]);
        return 2;
    }
    const char *model_dir = argv[1], *data = argv[2], *which = "specbench", *abl = "both,kv,w4";
    int n_prompts = 8, ctx = 512, gen = 64, ppl = 0;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--prompts")) which = argv[i + 1];
        else if (!strcmp(argv[i], "--n-prompts")) n_prompts = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ctx")) ctx = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gen")) gen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ppl")) ppl = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ablations")) abl = argv[i + 1];
        else { fprintf(stderr, "unknown flag %s\n", argv[i]); return 2; }
    }
    char err[512];
    nb_model *m = NULL;
    if (nb_model_load(model_dir, &m, err, sizeof(err)) != NB_OK) { fprintf(stderr, "%s\n", err); return 1; }
    nb_tokenizer *tok = NULL;
    if (nb_tokenizer_load(model_dir, &tok, err, sizeof(err)) != NB_OK) { fprintf(stderr, "%s\n", err); return 1; }
    const nb_model_config *mc = nb_model_get_config(m);
    int bos = mc->bos_token_id >= 0 ? mc->bos_token_id : 0;
    int max_len = 4096;

    if (ppl > 0) {
        prompt ess[2];
        int ne = load_essays(data, tok, bos, ppl, 400000, ess, 2);
        printf("## Perplexity, %s, %d essay passages x %d tokens, one token per pass\n\n", model_dir, ne, ppl);
        printf("| KV cache read by | NLL/token | perplexity | vs unquantized |\n|---|---|---|---|\n");
        // (quantized cache?, draft path?, draft uses 4-bit weights?, label)
        struct { bool quant, draft, w4; const char *name; } cfgs[4] = {
            {false, false, false, "target, unquantized bf16 cache"},
            {true, false, false, "target, INT8 (both nibbles) + FP buffer"},
            {true, true, false, "target weights, INT4 (upper nibbles) + FP buffer"},
            {true, true, true, "draft (4-bit weights), INT4 + FP buffer"}};
        double base = 0;
        for (int q = 0; q < 4; q++) {
            nb_engine *e = make_engine(m, cfgs[q].quant, cfgs[q].w4, true, max_len, err);
            if (!e) { fprintf(stderr, "%s\n", err); return 1; }
            double nll = 0;
            int64_t cnt = 0;
            double t0 = now_s();
            for (int k = 0; k < ne; k++) {
                nb_sampling_params sp = {0};
                int32_t s;
                nb_engine_seq_add(e, &sp, &s);
                nb_status st = nb_engine_score(e, s, ess[k].ids, ess[k].n, 1,
                                               cfgs[q].draft ? NB_FWD_DRAFT : NB_FWD_TARGET, &nll, NULL);
                if (st != NB_OK) { fprintf(stderr, "score: %s\n", nb_status_str(st)); return 1; }
                cnt += ess[k].n - 1;
                nb_engine_seq_free(e, s);
            }
            double per = nll / cnt, p = exp(per);
            if (q == 0) base = p;
            printf("| %s | %.5f | %.4f | %+.3f%% |\n", cfgs[q].name, per, p, 100.0 * (p / base - 1.0));
            fflush(stdout);
            fprintf(stderr, "  ppl pass %d: %.1f s\n", q, now_s() - t0);
            nb_engine_destroy(&e);
        }
        for (int k = 0; k < ne; k++) free(ess[k].ids);
        printf("\n");
    }
    if (gen <= 0) {
        nb_tokenizer_free(&tok);
        nb_model_free(&m);
        return 0;
    }

    prompt prs[64];
    if (n_prompts > 64) n_prompts = 64;
    int np = !strcmp(which, "essays") ? load_essays(data, tok, bos, ctx, 0, prs, n_prompts)
                                      : load_specbench(data, tok, bos, prs, n_prompts);
    if (np == 0) { fprintf(stderr, "no prompts from %s\n", data); return 1; }
    double mean_len = 0;
    for (int k = 0; k < np; k++) mean_len += prs[k].n;
    mean_len /= np;
    const int gammas[5] = {1, 2, 4, 6, 8};
    const float temps[2] = {0.0f, 0.7f};
    struct { const char *key, *name; bool w4, kv4; } abls[3] = {
        {"both", "4-bit weights + INT4 KV (nibbler's draft)", true, true},
        {"kv", "INT4 KV only (target weights)", false, true},
        {"w4", "4-bit weights only (INT8 KV)", true, false}};
    printf("## Acceptance rate, %s, %s prompts (%d, mean %.0f tokens), %d generated tokens each\n\n",
           model_dir, which, np, mean_len, gen);
    printf("| draft | temperature | gamma 1 | gamma 2 | gamma 4 | gamma 6 | gamma 8 |\n|---|---|---|---|---|---|---|\n");
    for (int a = 0; a < 3; a++) {
        if (!strstr(abl, abls[a].key)) continue;
        nb_engine *e = make_engine(m, true, abls[a].w4, abls[a].kv4, max_len, err);
        if (!e) { fprintf(stderr, "%s\n", err); return 1; }
        for (int ti = 0; ti < 2; ti++) {
            printf("| %s | %.1f |", abls[a].name, temps[ti]);
            for (int gi = 0; gi < 5; gi++) {
                int64_t dr = 0, ac = 0;
                double t0 = now_s();
                for (int k = 0; k < np; k++) {
                    nb_status st = spec_run(e, &prs[k], temps[ti], 1000 + k, gammas[gi], gen, &dr, &ac);
                    if (st != NB_OK) { fprintf(stderr, "spec: %s\n", nb_status_str(st)); return 1; }
                }
                printf(" %.3f |", dr ? (double)ac / dr : 0.0);
                fflush(stdout);
                fprintf(stderr, "  %s T%.1f gamma %d: %.1f s\n", abls[a].key, temps[ti], gammas[gi], now_s() - t0);
            }
            printf("\n");
        }
        nb_engine_destroy(&e);
    }
    printf("\n");
    for (int k = 0; k < np; k++) free(prs[k].ids);
    nb_tokenizer_free(&tok);
    nb_model_free(&m);
    return 0;
}
