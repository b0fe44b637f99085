// test_engine_stories: the engine on the real stories260k checkpoint (cpu
// backend): the golden greedy continuation in fp32-cache mode, and greedy
// speculative decoding == greedy target-only decoding with the quantized
// cache for gamma 1..8, across several G boundaries, with rollbacks.
#include "engine_test_util.h"
#include "tokenizer.h"

// The prefix cache is off here: with it, a later run of the same prompt
// adopts the earlier run's quantized prefix and so reads a slightly
// different cache (docs/decisions.md), which is not what these tests compare.
static nb_engine *make_engine(const nb_model *m, bool quant, int G, char *err) {
    nb_engine_params p = nb_engine_default_params();
    p.prefix_cache = false;
    p.quantized_cache = quant;
    p.group_size = G;
    p.max_seqs = 8;
    p.max_gamma = 8;
    p.prefill_chunk = 64;
    p.max_batch_rows = 256;
    p.kv_memory = (size_t)64 << 20;
    return nb_engine_new(m, &p, err, 256);
}

static void test_golden(const nb_model *m) {
    cJSON *g = etu_read_json("models/stories260k/golden.json");
    int32_t prompt[8], want[128];
    int np = etu_ints(cJSON_GetObjectItem(g, "prompt_ids"), prompt, 8);
    int nw = etu_ints(cJSON_GetObjectItem(g, "greedy_ids"), want, 128);
    cJSON_Delete(g);
    CHECK(np == 1 && nw == 64);
    char err[256];
    nb_engine *e = make_engine(m, false, 64, err);
    CHECKF(e, "%s", err);
    nb_sampling_params sp = {0};
    int32_t got[128];
    CHECK(etu_generate(e, &sp, prompt, np, nw, 0, got, NULL) == NB_OK);
    int same = 0;
    while (same < nw && got[same] == want[same]) same++;
    CHECKF(same == nw, "fp32-cache greedy matches golden.json for %d of %d tokens", same, nw);
    printf("golden: %d/%d tokens equal\n", same, nw);
    nb_engine_destroy(&e);
}

static uint64_t rng = 0x1234567;
static uint32_t rnd(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

// Prompts for the equality test: the first turns of Spec-Bench questions
// (../shared/data), tokenized with the model's own tokenizer and cut to
// max_len tokens, plus a few random-token prompts of odd lengths.
static int load_prompts(int32_t prompts[][160], int *lens, int cap, int max_len) {
    char dir[1024], path[1024], err[256];
    snprintf(dir, sizeof(dir), "%s/models/stories260k", nb_test_shared_dir());
    snprintf(path, sizeof(path), "%s/data/spec_bench_questions.jsonl", nb_test_shared_dir());
    nb_tokenizer *tok = NULL;
    char *txt = etu_read_file(path, NULL);
    int n = 0;
    if (txt && nb_tokenizer_load(dir, &tok, err, sizeof(err)) == NB_OK) {
        int line_i = 0;
        for (char *line = strtok(txt, "\n"); line && n < cap - 3; line = strtok(NULL, "\n"), line_i++) {
            if (line_i % 37) continue; // spread over the categories
            cJSON *j = cJSON_Parse(line);
            const cJSON *t0 = j ? cJSON_GetArrayItem(cJSON_GetObjectItem(j, "turns"), 0) : NULL;
            int32_t ids[4096], nn = 0;
            if (cJSON_IsString(t0) &&
                nb_tokenizer_encode(tok, t0->valuestring, strlen(t0->valuestring), ids, 4096, &nn) == NB_OK) {
                prompts[n][0] = 1; // BOS
                lens[n] = 1 + (nn < max_len - 1 ? nn : max_len - 1);
                memcpy(&prompts[n][1], ids, sizeof(int32_t) * (size_t)(lens[n] - 1));
                n++;
            }
            cJSON_Delete(j);
        }
    }
    CHECKF(n >= cap - 3 || n >= 8, "only %d Spec-Bench prompts from %s", n, path);
    free(txt);
    nb_tokenizer_free(&tok);
    int odd[3] = {1, 63, 129};
    for (int k = 0; k < 3 && n < cap; k++, n++) {
        lens[n] = odd[k];
        prompts[n][0] = 1;
        for (int i = 1; i < odd[k]; i++) prompts[n][i] = 3 + (int)(rnd() % 509);
    }
    return n;
}

// Greedy speculative == greedy target-only, quantized cache, many prompts,
// generations crossing several group boundaries.
static void test_spec_equals_target(const nb_model *m, int G) {
    char err[256];
    nb_engine *e = make_engine(m, true, G, err);
    CHECKF(e, "%s", err);
    nb_sampling_params sp = {0};
    static int32_t prompts[20][160];
    int lens[20];
    int np = load_prompts(prompts, lens, NB_TEST_SCALE(20, 6), 150);
    int32_t ref[512], got[512];
    int n_cases = 0;
    double acc_sum = 0;
    for (int pi = 0; pi < np; pi++) {
        int n_new = 5 * G + 7 - lens[pi]; // crosses at least three group boundaries
        CHECK(etu_generate(e, &sp, prompts[pi], lens[pi], n_new, 0, ref, NULL) == NB_OK);
        for (int gamma = 1; gamma <= 8; gamma++) {
            etu_gen_stats gs = {0};
            CHECK(etu_generate(e, &sp, prompts[pi], lens[pi], n_new, gamma, got, &gs) == NB_OK);
            int same = 0;
            while (same < n_new && got[same] == ref[same]) same++;
            CHECKF(same == n_new, "G %d prompt %d (%d tokens) gamma %d: equal for %d of %d tokens",
                   G, pi, lens[pi], gamma, same, n_new);
            acc_sum += gs.drafted ? (double)gs.accepted / gs.drafted : 0;
            n_cases++;
        }
    }
    printf("spec == target-only (G %d): %d prompts x gamma 1..8 = %d cases, mean acceptance %.3f\n",
           G, np, n_cases, acc_sum / n_cases);
    nb_engine_destroy(&e);
}

int main(void) {
    nb_model *m = etu_load_model("stories260k");
    test_golden(m);
    test_spec_equals_target(m, 64);
    nb_model_free(&m);
    return nb_test_finish("test_engine_stories");
}
