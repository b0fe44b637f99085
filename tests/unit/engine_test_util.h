// engine_test_util.h: shared helpers of the engine tests: locating the
// checkpoints in ../shared, reading the golden files, and a reference
// generation loop written against the engine API.
#ifndef NB_ENGINE_TEST_UTIL_H
#define NB_ENGINE_TEST_UTIL_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine.h"
#include "nb_test.h"

// Loads ../shared/models/<name>, or exits 77 (skip) with a message if absent.
static inline nb_model *etu_load_model(const char *name) {
    char dir[1024], err[512];
    snprintf(dir, sizeof(dir), "%s/models/%s", nb_test_shared_dir(), name);
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        printf("SKIP: %s not found (set NB_SHARED_DIR to the shared/ folder)\n", dir);
        exit(NB_TEST_SKIP);
    }
    nb_model *m = NULL;
    if (nb_model_load(dir, &m, err, sizeof(err)) != NB_OK) {
        fprintf(stderr, "cannot load %s: %s\n", dir, err);
        exit(1);
    }
    return m;
}

static inline char *etu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf) buf[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

static inline cJSON *etu_read_json(const char *rel) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", nb_test_shared_dir(), rel);
    char *txt = etu_read_file(path, NULL);
    if (!txt) {
        printf("SKIP: %s not found\n", path);
        exit(NB_TEST_SKIP);
    }
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!j) {
        fprintf(stderr, "%s: bad JSON\n", path);
        exit(1);
    }
    return j;
}

// int array from a cJSON array; returns count.
static inline int etu_ints(const cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (n < cap) out[n] = (int32_t)it->valueint;
        n++;
    }
    return n;
}

typedef struct etu_gen_stats {
    int64_t drafted, accepted, rounds;
} etu_gen_stats;

// Prefill prompt into a fresh sequence, then produce n_new tokens either
// target-only (gamma == 0) or with draft/verify rounds of gamma. Tokens
// emitted after the prompt go to out[0..n_new). Returns NB_OK or a status.
static inline nb_status etu_generate(nb_engine *e, const nb_sampling_params *sp,
                                     const int32_t *prompt, int32_t n_prompt, int32_t n_new,
                                     int32_t gamma, int32_t *out, etu_gen_stats *gs) {
    int32_t seq, next;
    nb_status st = nb_engine_seq_add(e, sp, &seq), sst;
    if (st != NB_OK) return st;
    const int32_t *pp[1] = {prompt};
    st = nb_engine_prefill(e, 1, &seq, pp, &n_prompt, &next, NULL, NULL, &sst);
    if (st == NB_OK) st = sst;
    int32_t n = 0;
    if (st == NB_OK) out[n++] = next;
    int32_t buf[NB_ENGINE_MAX_GAMMA + 1];
    while (st == NB_OK && n < n_new) {
        if (gamma == 0) {
            int32_t t, cnt;
            st = nb_engine_decode(e, 1, &seq, 1, &t, NULL, &cnt, &sst);
            if (st == NB_OK) st = sst;
            if (st == NB_OK) out[n++] = t;
        } else {
            int32_t drafts[NB_ENGINE_MAX_GAMMA], n_out, n_acc;
            st = nb_engine_draft(e, 1, &seq, gamma, drafts, &sst);
            if (st == NB_OK) st = sst;
            if (st == NB_OK) st = nb_engine_verify(e, 1, &seq, buf, NULL, &n_out, &n_acc, &sst);
            if (st == NB_OK) st = sst;
            if (st != NB_OK) break;
            if (gs) {
                gs->drafted += gamma;
                gs->accepted += n_acc;
                gs->rounds++;
            }
            for (int32_t j = 0; j < n_out && n < n_new; j++) out[n++] = buf[j];
        }
    }
    nb_engine_seq_free(e, seq);
    return st;
}

#endif // NB_ENGINE_TEST_UTIL_H
