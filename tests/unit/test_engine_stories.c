// test_engine_stories: the engine on the real stories260k checkpoint (cpu
// backend): the golden greedy continuation in fp32-cache mode, and greedy
// speculative decoding == greedy target-only decoding with the quantized
// cache for gamma 1..8, across several G boundaries, with rollbacks.
#include "engine_test_util.h"

static nb_engine *make_engine(const nb_model *m, bool quant, int G, char *err) {
    nb_engine_params p = nb_engine_default_params();
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

// Greedy speculative == greedy target-only, quantized cache, many prompts.
static void test_spec_equals_target(const nb_model *m, int G) {
    char err[256];
    nb_engine *e = make_engine(m, true, G, err);
    CHECKF(e, "%s", err);
    nb_sampling_params sp = {0};
    int32_t prompt[300], ref[400], got[400];
    int n_cases = 0;
    for (int trial = 0; trial < 6; trial++) {
        int np = 1 + (int)(rnd() % 120);
        prompt[0] = 1;
        for (int i = 1; i < np; i++) prompt[i] = 3 + (int)(rnd() % 509);
        int n_new = 4 * G + 7 - np / 2; // crosses several group boundaries
        CHECK(etu_generate(e, &sp, prompt, np, n_new, 0, ref, NULL) == NB_OK);
        for (int gamma = 1; gamma <= 8; gamma++) {
            etu_gen_stats gs = {0};
            CHECK(etu_generate(e, &sp, prompt, np, n_new, gamma, got, &gs) == NB_OK);
            int same = 0;
            while (same < n_new && got[same] == ref[same]) same++;
            CHECKF(same == n_new, "G %d prompt %d gamma %d: equal for %d of %d tokens", G, trial,
                   gamma, same, n_new);
            n_cases++;
        }
    }
    printf("spec == target-only (G %d): %d cases\n", G, n_cases);
    nb_engine_destroy(&e);
}

int main(void) {
    nb_model *m = etu_load_model("stories260k");
    test_golden(m);
    test_spec_equals_target(m, 64);
    nb_model_free(&m);
    return nb_test_finish("test_engine_stories");
}
