// etu_text.h: a long real text for GPU engine tests and benchmarks: the
// first turns of every Spec-Bench question (../shared/data), concatenated
// and tokenized with the model's tokenizer, after a BOS id 1.
#ifndef NB_ETU_TEXT_H
#define NB_ETU_TEXT_H

#include "engine_test_util.h"
#include "tokenizer.h"

// Fills ids (at most cap) and returns the count; 0 when the data is absent.
static inline int etu_text_tokens(const nb_tokenizer *tk, int32_t *ids, int cap) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/data/spec_bench_questions.jsonl", nb_test_shared_dir());
    char *txt = etu_read_file(path, NULL);
    if (!txt) return 0;
    int n = 0;
    ids[n++] = 1;
    for (char *line = strtok(txt, "\n"); line && n < cap; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *t0 = j ? cJSON_GetArrayItem(cJSON_GetObjectItem(j, "turns"), 0) : NULL;
        int32_t nn = 0;
        if (cJSON_IsString(t0))
            nb_tokenizer_encode(tk, t0->valuestring, strlen(t0->valuestring), ids + n, cap - n, &nn);
        n += nn;
        cJSON_Delete(j);
    }
    free(txt);
    return n < cap ? n : cap;
}

#endif // NB_ETU_TEXT_H
