// test_worker_pressure.c: running out of KV blocks is a per-sequence
// NO_FREE_BLOCKS status, never a crash, and the other sequences are intact:
// their continuation equals that of a worker with plenty of memory.
//
// The pressured worker has an unquantized cache (--kv-cache fp, G 16) of
// 10 blocks, so block accounting is exact: a sequence of t tokens holds
// ceil(t / 16) blocks.
#include "worker_harness.h"

#define G 16
#define NA 17 // prompt tokens of A and B: 2 blocks, room for 15 more tokens

static void prompts(uint32_t *a, uint32_t *b, uint32_t vocab) {
    for (int i = 0; i < NA; i++) {
        a[i] = 1 + (uint32_t)(i * 13 + 5) % (vocab - 1);
        b[i] = 1 + (uint32_t)(i * 29 + 11) % (vocab - 1);
    }
}

// Prefills A (id 1) and B (id 2), decodes 10 then 10 more tokens; writes the
// 1 + 20 generated tokens of each into out[2][21]. With pressure, a hog
// sequence exhausts the pool in between (checked here).
static bool run(void *ctx, const char *model, const char *kv_mem, bool pressure,
                uint32_t out[2][21], double *block_bytes) {
    wh_worker w;
    const char *args[] = {"--model", model, "--endpoint", "{EP}", "--kv-cache", "fp",
                          "--group-size", "16", "--max-gamma", "4", "--kv-memory", kv_mem,
                          "--max-seqs", "4", NULL};
    if (!wh_start(&w, ctx, args)) return false;
    void *c = wh_client(ctx, w.endpoint, 20000);
    Nibbler__V1__Response *r = wh_hello(c);
    uint32_t vocab = r->hello->model->vocab_size;
    uint32_t total = r->hello->cache->fpblocks_total;
    *block_bytes = r->hello->cache->fpbytes_per_token * G;
    if (pressure) CHECKF(total == 10, "pool of %u FP blocks, want 10", total);
    wh_free(&r);

    uint32_t pa[NA], pb[NA];
    prompts(pa, pb, vocab);
    uint64_t ids[3] = {1, 2, 3};
    r = wh_add(c, ids, pressure ? 3 : 2, 0.0f, NULL);
    wh_free(&r);
    // The hog asks for the whole pool in the same batch as A and B.
    uint32_t *hog = calloc(G * 10, sizeof(uint32_t));
    for (int i = 0; i < G * 10; i++) hog[i] = 1 + (uint32_t)(i % 50);
    uint32_t *pp[3] = {pa, pb, hog};
    size_t pl[3] = {NA, NA, G * 10};
    r = wh_prefill(c, ids, pressure ? 3 : 2, pp, pl);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK && wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK);
    for (int k = 0; k < 2 && wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK; k++)
        out[k][0] = r->batch->seqs[k]->tokens[0];
    if (pressure) {
        CHECKF(wh_seq_code(r, 2) == NIBBLER__V1__CODE__NO_FREE_BLOCKS, "hog prefill: %d",
               (int)wh_seq_code(r, 2));
        if (wh_seq_code(r, 2) == NIBBLER__V1__CODE__NO_FREE_BLOCKS) {
            CHECK(r->batch->seqs[2]->n_context == 0); // the partial prompt was rolled back
            CHECK(strstr(r->batch->seqs[2]->status->message, "free") != NULL);
        }
    }
    wh_free(&r);
    if (pressure) {
        // The hog takes exactly what is left, then cannot decode.
        r = wh_simple(c, NIBBLER__V1__REQUEST__COMMAND_STATS);
        uint32_t left = r->stats->cache->fpblocks_free;
        wh_free(&r);
        CHECKF(left == 6, "%u blocks free after A and B, want 6", left);
        r = wh_prefill1(c, 3, hog, (size_t)left * G);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK);
        wh_free(&r);
        r = wh_simple(c, NIBBLER__V1__REQUEST__COMMAND_STATS);
        CHECK(r->stats->cache->fpblocks_free == 0);
        wh_free(&r);
    }
    uint64_t dec[3] = {1, 3, 2}, dec_plain[2] = {1, 2};
    r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_DECODE, pressure ? dec : dec_plain,
                   pressure ? 3 : 2, 10);
    CHECK(wh_code(r) == NIBBLER__V1__CODE__OK);
    int ia = 0, ib = pressure ? 2 : 1;
    CHECK(wh_seq_code(r, ia) == NIBBLER__V1__CODE__OK && wh_seq_code(r, ib) == NIBBLER__V1__CODE__OK);
    if (pressure) {
        CHECKF(wh_seq_code(r, 1) == NIBBLER__V1__CODE__NO_FREE_BLOCKS, "hog decode: %d",
               (int)wh_seq_code(r, 1));
        if (wh_seq_code(r, 1) == NIBBLER__V1__CODE__NO_FREE_BLOCKS)
            CHECK(r->batch->seqs[1]->n_tokens == 0);
    }
    if (wh_seq_code(r, ib) == NIBBLER__V1__CODE__OK && r->batch->seqs[ia]->n_tokens == 10 &&
        r->batch->seqs[ib]->n_tokens == 10)
        for (int j = 0; j < 10; j++) {
            out[0][1 + j] = r->batch->seqs[ia]->tokens[j];
            out[1][1 + j] = r->batch->seqs[ib]->tokens[j];
        }
    else
        CHECK(!"A and B decode 10 tokens");
    wh_free(&r);
    if (pressure) {
        // Preempt: free the hog; A and B continue into new blocks.
        uint64_t h = 3;
        r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_FREE, &h, 1, 0);
        CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK);
        wh_free(&r);
    }
    r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_DECODE, ids, 2, 10);
    CHECK(wh_seq_code(r, 0) == NIBBLER__V1__CODE__OK && wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK);
    if (wh_seq_code(r, 1) == NIBBLER__V1__CODE__OK)
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 10; j++) out[k][11 + j] = r->batch->seqs[k]->tokens[j];
    wh_free(&r);
    // Everything back after Free.
    r = wh_ids_cmd(c, NIBBLER__V1__REQUEST__COMMAND_FREE, ids, 2, 0);
    wh_free(&r);
    r = wh_simple(c, NIBBLER__V1__REQUEST__COMMAND_STATS);
    CHECK(r->stats->cache->fpblocks_free == r->stats->cache->fpblocks_total && r->stats->n_seqs == 0);
    wh_free(&r);
    free(hog);
    zmq_close(c);
    wh_stop(&w);
    return true;
}

int main(void) {
    const char *model = wh_model_or_skip("test_worker_pressure");
    void *ctx = zmq_ctx_new();
    uint32_t tight[2][21] = {{0}}, roomy[2][21] = {{0}};
    double bb = 0;
    if (!run(ctx, model, "64M", false, roomy, &bb)) return 1;
    // A pool of exactly 10 FP blocks (the roomy worker reported their size).
    char mem[32];
    snprintf(mem, sizeof(mem), "%.0f", 10 * bb);
    if (!run(ctx, model, mem, true, tight, &bb)) return 1;
    CHECKF(memcmp(tight, roomy, sizeof(tight)) == 0,
           "A and B under pressure diverged from the unpressured run");
    zmq_ctx_term(ctx);
    return nb_test_finish("test_worker_pressure");
}
