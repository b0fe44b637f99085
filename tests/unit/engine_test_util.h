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

#include "driver.h"
#include "engine.h"
#include "nb_test.h"

// Exits 77 (skip) with a message unless ../shared/<rel> exists: a test
// that needs the shared data as well as the models checks it before its
// first check (a skip after a failed check would hide the failure).
// A path built from the shared folder, or exit 1 when it does not fit
// (a truncated path would look like a missing file and skip the test).
static inline void etu_path(char *out, size_t cap, const char *a, const char *b) {
    const int n = snprintf(out, cap, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= cap) {
        fprintf(stderr, "FAIL: path %s/%s is longer than %zu bytes\n", a, b, cap - 1);
        exit(1);
    }
}

static inline void etu_require_shared(const char *rel) {
    char path[1024];
    etu_path(path, sizeof(path), nb_test_shared_dir(), rel);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        printf("SKIP: %s not found (set NB_SHARED_DIR to a shared/ folder with models/ and data/)\n", path);
        exit(NB_TEST_SKIP);
    }
}

// Loads ../shared/models/<name>, or exits 77 (skip) with a message if absent.
static inline nb_model *etu_load_model(const char *name) {
    char dir[1024], err[512];
    etu_path(dir, sizeof(dir), "models", name);
    etu_require_shared(dir);
    char shared_models[1024];
    etu_path(shared_models, sizeof(shared_models), nb_test_shared_dir(), "models");
    etu_path(dir, sizeof(dir), shared_models, name);
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

// Generation through the library driver: target-only when gamma == 0.
static inline nb_status etu_generate(nb_engine *e, const nb_sampling_params *sp,
                                     const int32_t *prompt, int32_t n_prompt, int32_t n_new,
                                     int32_t gamma, int32_t *out, etu_gen_stats *gs) {
    nb_driver_opts o = {.max_tokens = n_new, .gamma = gamma, .sampling = *sp};
    nb_driver_stats ds;
    nb_status st = nb_driver_generate(e, prompt, n_prompt, &o, out, &ds);
    if (st == NB_OK && ds.n_tokens != n_new) st = NB_ERR_INTERNAL;
    if (gs) {
        gs->drafted += ds.n_drafted;
        gs->accepted += ds.n_accepted;
        gs->rounds += ds.n_rounds;
    }
    return st;
}

#endif // NB_ENGINE_TEST_UTIL_H
