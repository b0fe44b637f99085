// test_engine_semantics: command semantics of the engine on stories260k
// (cpu backend, quantized cache unless said otherwise):
// - greedy speculative == greedy target-only with explicit rollbacks in
//   between (both flows are brought to the same committed length, then
//   rolled back identically, shallow and deep), for target weights from the
//   checkpoint and hierarchical INT8;
// - a sequence's tokens do not depend on its batch (sampling, seeds);
// - fork continues exactly like its parent; prefix reuse gives the same
//   tokens as computing the prefix;
// - rejection sampling through the whole engine emits tokens with the
//   target's distribution (chi-square homogeneity test).
#include <math.h>

#include "engine_test_util.h"

static nb_engine *make_engine(const nb_model *m, int G, nb_target_weights tw, int chunk, char *err) {
    nb_engine_params p = nb_engine_default_params();
    p.group_size = G;
    p.max_seqs = 8;
    p.max_gamma = 8;
    p.prefill_chunk = chunk;
    p.max_batch_rows = 256;
    p.kv_memory = (size_t)64 << 20;
    p.target_weights = tw;
    return nb_engine_new(m, &p, err, 256);
}

static uint64_t rng = 0x5eed;
static uint32_t rnd(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

static int32_t committed(nb_engine *e, int32_t s) {
    nb_engine_seq_info in;
    NB_ASSERT(nb_engine_seq_info_get(e, s, &in) == NB_OK);
    return in.n_committed;
}

static int32_t next_of(nb_engine *e, int32_t s) {
    nb_engine_seq_info in;
    NB_ASSERT(nb_engine_seq_info_get(e, s, &in) == NB_OK);
    return in.next_token;
}

static nb_status spec_round(nb_engine *e, int32_t s, int gamma, int *acc) {
    int32_t d[NB_ENGINE_MAX_GAMMA], out[NB_ENGINE_MAX_GAMMA + 1], n_out, n_acc;
    nb_status st, sst;
    st = nb_engine_draft(e, 1, &s, gamma, d, &sst);
    if (st == NB_OK) st = sst;
    if (st == NB_OK) st = nb_engine_verify(e, 1, &s, out, NULL, &n_out, &n_acc, &sst);
    if (st == NB_OK) st = sst;
    if (acc) *acc = n_acc;
    return st;
}

static void test_rollbacks(const nb_model *m, nb_target_weights tw, int n_prompts) {
    const int G = 64;
    char err[256];
    nb_engine *e = make_engine(m, G, tw, 64, err);
    CHECKF(e, "%s", err);
    nb_sampling_params sp = {0};
    int cases = 0, deep = 0;
    for (int pi = 0; pi < n_prompts; pi++) {
        int32_t prompt[200];
        int np = 2 + (int)(rnd() % 150);
        prompt[0] = 1;
        for (int i = 1; i < np; i++) prompt[i] = 3 + (int)(rnd() % 509);
        for (int gamma = 1; gamma <= 8; gamma++) {
            int32_t A, B;
            nb_status sst;
            CHECK(nb_engine_seq_add(e, &sp, &A) == NB_OK);
            CHECK(nb_engine_seq_add(e, &sp, &B) == NB_OK);
            const int32_t *pp[2] = {prompt, prompt};
            int32_t lens[2] = {np, np}, seqs[2] = {A, B}, nexts[2];
            nb_status sts[2];
            CHECK(nb_engine_prefill(e, 2, seqs, pp, lens, nexts, NULL, NULL, sts) == NB_OK);
            CHECK(sts[0] == NB_OK && sts[1] == NB_OK && nexts[0] == nexts[1]);
            for (int phase = 0; phase < 5; phase++) {
                int rounds = 3 + (int)(rnd() % 12);
                for (int r = 0; r < rounds && committed(e, B) + 10 < 500; r++)
                    CHECK(spec_round(e, B, gamma, NULL) == NB_OK);
                int32_t cb = committed(e, B), ca = committed(e, A);
                if (cb > ca) {
                    int32_t steps = cb - ca, out[512], n_out;
                    CHECK(nb_engine_decode(e, 1, &A, steps, out, NULL, &n_out, &sst) == NB_OK);
                    CHECK(sst == NB_OK && n_out == steps);
                }
                CHECK(committed(e, A) == cb);
                const int32_t *ta = nb_engine_seq_tokens(e, A), *tb = nb_engine_seq_tokens(e, B);
                int same = 0;
                while (same < cb && ta[same] == tb[same]) same++;
                CHECKF(same == cb && next_of(e, A) == next_of(e, B),
                       "tw %d prompt %d gamma %d phase %d: %d of %d tokens equal", (int)tw, pi,
                       gamma, phase, same, cb);
                // Roll both back to the same length: sometimes shallow, often deep.
                int32_t lo = cb - 3 * G > 1 ? cb - 3 * G : 1;
                int32_t to = lo + (int32_t)(rnd() % (uint32_t)(cb - lo + 1));
                nb_engine_seq_info before;
                nb_engine_seq_info_get(e, B, &before);
                int32_t want_next = to < cb ? tb[to] : before.next_token;
                CHECK(nb_engine_rollback(e, A, to) == NB_OK);
                CHECK(nb_engine_rollback(e, B, to) == NB_OK);
                nb_engine_seq_info after;
                nb_engine_seq_info_get(e, B, &after);
                if (after.n_qblocks < before.n_qblocks) deep++;
                CHECK(next_of(e, A) == want_next && next_of(e, B) == want_next);
                cases++;
            }
            nb_engine_seq_free(e, A);
            nb_engine_seq_free(e, B);
        }
    }
    printf("rollbacks (%s target weights): %d phases equal, %d deep rollbacks\n",
           tw == NB_TARGET_WEIGHTS_INT8 ? "int8" : "model", cases, deep);
    CHECK(deep > 0);
    nb_engine_destroy(&e);
}

// Sampling: tokens of a sequence do not depend on the rest of its batch.
static void test_batch_independence(const nb_model *m) {
    char err[256];
    nb_engine *e = make_engine(m, 64, NB_TARGET_WEIGHTS_MODEL, 64, err);
    CHECKF(e, "%s", err);
    nb_sampling_params sps[3] = {{0.8f, 0, 0.95f, 11}, {1.0f, 20, 1.0f, 22}, {0.0f, 0, 1.0f, 0}};
    int32_t prompts[3][40];
    int lens[3] = {40, 17, 29};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < lens[k]; i++) prompts[k][i] = i ? 3 + (int)(rnd() % 509) : 1;
    int32_t solo[3][120], batch[3][120];
    // (a) each alone, spec rounds of gamma 4 until 100 tokens.
    for (int k = 0; k < 3; k++) {
        etu_gen_stats gs = {0};
        CHECK(etu_generate(e, &sps[k], prompts[k], lens[k], 100, 4, solo[k], &gs) == NB_OK);
    }
    // (b) all three in one batch, same commands.
    int32_t seqs[3], nexts[3], n_have[3] = {0, 0, 0};
    nb_status sts[3];
    for (int k = 0; k < 3; k++) CHECK(nb_engine_seq_add(e, &sps[k], &seqs[k]) == NB_OK);
    const int32_t *pp[3] = {prompts[0], prompts[1], prompts[2]};
    CHECK(nb_engine_prefill(e, 3, seqs, pp, lens, nexts, NULL, NULL, sts) == NB_OK);
    for (int k = 0; k < 3; k++) batch[k][n_have[k]++] = nexts[k];
    while (n_have[0] < 100 || n_have[1] < 100 || n_have[2] < 100) {
        int32_t d[3 * 8], out[3 * 9], n_out[3], n_acc[3];
        CHECK(nb_engine_draft(e, 3, seqs, 4, d, sts) == NB_OK);
        CHECK(nb_engine_verify(e, 3, seqs, out, NULL, n_out, n_acc, sts) == NB_OK);
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < n_out[k] && n_have[k] < 100; j++) batch[k][n_have[k]++] = out[k * 9 + j];
    }
    for (int k = 0; k < 3; k++) {
        int same = 0;
        while (same < 100 && solo[k][same] == batch[k][same]) same++;
        CHECKF(same == 100, "seq %d (T=%.1f): batched equals alone for %d of 100 tokens", k,
               sps[k].temperature, same);
    }
    printf("batch independence: 3 sequences x 100 tokens equal alone and batched\n");
    nb_engine_destroy(&e);
}

// Prefix reuse: a second and third sequence with the same prompt adopt the
// first one's quantized blocks and produce identical tokens to each other.
// (They need not equal the first sequence's: rows right after an adopted
// prefix read its last group quantized where a fresh prefill read it in full
// precision; docs/decisions.md.) Fork: the child continues exactly like its
// parent.
static int32_t prefill_decode(nb_engine *e, const int32_t *prompt, int np, int n, int32_t *out,
                              int32_t *cached) {
    nb_sampling_params sp = {0};
    int32_t s, next, n_out;
    nb_status sst;
    CHECK(nb_engine_seq_add(e, &sp, &s) == NB_OK);
    CHECK(nb_engine_prefill(e, 1, &s, &prompt, &np, &next, NULL, cached, &sst) == NB_OK && sst == NB_OK);
    out[0] = next;
    CHECK(nb_engine_decode(e, 1, &s, n - 1, out + 1, NULL, &n_out, &sst) == NB_OK && n_out == n - 1);
    return s;
}

static void test_fork_and_prefix(const nb_model *m) {
    const int G = 64;
    char err[256];
    nb_engine *e = make_engine(m, G, NB_TARGET_WEIGHTS_MODEL, G, err);
    CHECKF(e, "%s", err);
    int32_t prompt[400];
    int np = 5 * G + 9;
    for (int i = 0; i < np; i++) prompt[i] = i ? 3 + (int)(rnd() % 509) : 1;
    int32_t first[80], second[80], third[80], c1 = -1, c2 = -1, c3 = -1;
    int32_t s1 = prefill_decode(e, prompt, np, 80, first, &c1);
    nb_engine_seq_free(e, s1);
    int32_t s2 = prefill_decode(e, prompt, np, 80, second, &c2);
    int32_t s3 = prefill_decode(e, prompt, np, 80, third, &c3);
    CHECKF(c1 == 0 && c2 >= 3 * G && c3 == c2, "cached tokens: %d, %d, %d", c1, c2, c3);
    int same = 0, same_fresh = 0;
    while (same < 80 && second[same] == third[same]) same++;
    while (same_fresh < 80 && second[same_fresh] == first[same_fresh]) same_fresh++;
    CHECKF(same == 80, "two adoptions of one prefix: %d of 80 tokens equal", same);
    nb_engine_seq_free(e, s3);
    // Fork mid-generation: the child continues exactly like the parent.
    nb_sampling_params sp = {0};
    int32_t child, a[60], b[60], n_out;
    nb_status sst;
    CHECK(nb_engine_seq_fork(e, s2, NULL, &child) == NB_OK);
    CHECK(nb_engine_decode(e, 1, &s2, 60, a, NULL, &n_out, &sst) == NB_OK);
    CHECK(nb_engine_decode(e, 1, &child, 60, b, NULL, &n_out, &sst) == NB_OK);
    int fsame = 0;
    while (fsame < 60 && a[fsame] == b[fsame]) fsame++;
    CHECKF(fsame == 60, "fork: %d of 60 equal", fsame);
    (void)sp;
    printf("prefix reuse: %d prompt tokens cached, adoptions agree (80/80), %d/80 equal to the "
           "fresh prefill; fork: child == parent\n", c2, same_fresh);
    nb_engine_seq_free(e, s2);
    nb_engine_seq_free(e, child);
    nb_engine_destroy(&e);
}

// Prefix reuse with prefill chunks smaller than a group: the adopted prefix
// and the chunk after it must still fit one append.
static void test_prefix_small_chunks(const nb_model *m) {
    char err[256];
    nb_engine *e = make_engine(m, 64, NB_TARGET_WEIGHTS_MODEL, 16, err);
    CHECKF(e, "%s", err);
    int32_t prompt[300], a[20], b[20], ca = -1, cb = -1;
    for (int i = 0; i < 300; i++) prompt[i] = i ? 3 + (int)(rnd() % 509) : 1;
    int32_t s1 = prefill_decode(e, prompt, 300, 20, a, &ca);
    nb_engine_seq_free(e, s1);
    int32_t s2 = prefill_decode(e, prompt, 300, 20, b, &cb);
    nb_engine_seq_free(e, s2);
    CHECKF(ca == 0 && cb > 0 && cb % 64 == 0, "chunk 16 < G 64: cached %d then %d", ca, cb);
    printf("prefix reuse with 16-token chunks: %d tokens cached\n", cb);
    nb_engine_destroy(&e);
}

// Chi-square homogeneity: the first token speculative decoding emits at a
// fixed context vs the token target-only decoding samples there, over many
// seeds. top_k 6 keeps 6 categories (dof 5); critical value at
// significance 1e-3: 20.515.
// Chi-square statistic of two equal-size samples over categories.
static double chi2_homogeneity(const int *a, const int *b, int V, int *cats) {
    double chi2 = 0;
    *cats = 0;
    for (int v = 0; v < V; v++) {
        int tot = a[v] + b[v];
        if (!tot) continue;
        (*cats)++;
        double ex = tot / 2.0;
        chi2 += (a[v] - ex) * (a[v] - ex) / ex + (b[v] - ex) * (b[v] - ex) / ex;
    }
    return chi2;
}

static void test_distribution(const nb_model *m) {
    char err[256];
    nb_engine *e = make_engine(m, 64, NB_TARGET_WEIGHTS_MODEL, 64, err);
    CHECKF(e, "%s", err);
    int32_t ctx[24];
    int nc = 24;
    for (int i = 0; i < nc; i++) ctx[i] = i ? 3 + (i * 37) % 509 : 1;
    enum { TRIALS = NB_TEST_SCALE(2500, 800), V = 512 };
    static int cnt[3][V]; // target-only, speculative, the draft's first proposal
    int64_t drafted = 0, accepted = 0;
    for (int mode = 0; mode < 2; mode++) {
        for (int t = 0; t < TRIALS; t++) {
            nb_sampling_params sp = {1.0f, 6, 1.0f, (uint64_t)(mode * 1000003 + t * 7919 + 1)};
            int32_t s, next, tok = -1;
            nb_status sst;
            const int32_t *pp[1] = {ctx};
            CHECK(nb_engine_seq_add(e, &sp, &s) == NB_OK);
            CHECK(nb_engine_prefill(e, 1, &s, pp, &nc, &next, NULL, NULL, &sst) == NB_OK);
            // Condition on the full context: next becomes ctx[nc-1] again.
            CHECK(nb_engine_rollback(e, s, nc - 1) == NB_OK);
            if (mode == 0) {
                int32_t n_out;
                CHECK(nb_engine_decode(e, 1, &s, 1, &tok, NULL, &n_out, &sst) == NB_OK);
            } else {
                int32_t d[3], out[9], n_out, n_acc;
                CHECK(nb_engine_draft(e, 1, &s, 3, d, &sst) == NB_OK && sst == NB_OK);
                CHECK(nb_engine_verify(e, 1, &s, out, NULL, &n_out, &n_acc, &sst) == NB_OK);
                tok = out[0];
                if (d[0] >= 0 && d[0] < V) cnt[2][d[0]]++;
                drafted += 3;
                accepted += n_acc;
            }
            if (tok >= 0 && tok < V) cnt[mode][tok]++;
            nb_engine_seq_free(e, s);
        }
    }
    int cats = 0;
    double chi2 = chi2_homogeneity(cnt[0], cnt[1], V, &cats);
    // Power check: "accept every draft" would emit the draft's proposals;
    // the same test at the same sample size must tell those apart.
    int cats_d = 0;
    double chi2_draft = chi2_homogeneity(cnt[0], cnt[2], V, &cats_d);
    printf("rejection sampling through the engine: %d categories, chi2 %.2f (critical 20.52 at "
           "1e-3, dof 5), draft acceptance %.3f; accept-always would give chi2 %.1f\n",
           cats, chi2, drafted ? (double)accepted / drafted : 0.0, chi2_draft);
    CHECKF(chi2_draft > 20.515, "the test cannot detect the draft's distribution (chi2 %.2f)",
           chi2_draft);
    CHECK(cats <= 6);
    CHECKF(chi2 < 20.515, "chi2 %.2f: speculative tokens are not distributed as the target's", chi2);
    CHECK(accepted < drafted); // the draft differs from the target
    nb_engine_destroy(&e);
}

// The FP pool is planned per pass (nb_bm_fp_pool_blocks): every sequence
// at once prefilling prompts of several chunks, then a gamma-8 round each,
// then more prompt: no command runs short of FP blocks, where the pool is
// well under the old per-sequence plan (room for a whole chunk in each).
static void test_fp_pool_full_batch(const nb_model *m) {
    const int G = 16, S = 8;
    nb_engine_params p = nb_engine_default_params();
    p.group_size = G;
    p.max_seqs = S;
    p.max_gamma = 8;
    p.prefill_chunk = 128;
    p.max_batch_rows = 256;
    p.kv_memory = (size_t)64 << 20;
    char err[256];
    nb_engine *e = nb_engine_new(m, &p, err, sizeof(err));
    CHECKF(e, "%s", err);
    if (!e) return;
    int32_t pool = nb_engine_params_get(e)->n_fpblocks;
    // 8 x (ceil((2G + G) / G) + 1) + 256 / G; the old plan, 8 x (ceil((2G + 128) / G) + 1) = 88.
    CHECKF(pool == S * 4 + 16, "FP pool %d blocks", pool);
    nb_sampling_params sp = {0};
    int32_t seqs[S], next[S], lens[S], prompts[S][450];
    const int32_t *pp[S];
    nb_status st[S];
    for (int k = 0; k < S; k++) {
        CHECK(nb_engine_seq_add(e, &sp, &seqs[k]) == NB_OK);
        lens[k] = 300 + 7 * k;
        for (int i = 0; i < 450; i++) prompts[k][i] = i ? 3 + (int)(rnd() % 509) : 1;
        pp[k] = prompts[k];
    }
    nb_bm_stats bs;
    CHECK(nb_engine_prefill(e, S, seqs, pp, lens, next, NULL, NULL, st) == NB_OK);
    for (int k = 0; k < S; k++) CHECKF(st[k] == NB_OK, "prefill seq %d: %s", k, nb_status_str(st[k]));
    int32_t d[S * 8], out[S * 9], n_out[S], n_acc[S];
    CHECK(nb_engine_draft(e, S, seqs, 8, d, st) == NB_OK);
    for (int k = 0; k < S; k++) CHECKF(st[k] == NB_OK, "draft seq %d: %s", k, nb_status_str(st[k]));
    CHECK(nb_engine_verify(e, S, seqs, out, NULL, n_out, n_acc, st) == NB_OK);
    for (int k = 0; k < S; k++) CHECKF(st[k] == NB_OK, "verify seq %d: %s", k, nb_status_str(st[k]));
    for (int k = 0; k < S; k++) {
        lens[k] = 130;
        pp[k] = prompts[k] + 300;
    }
    CHECK(nb_engine_prefill(e, S, seqs, pp, lens, next, NULL, NULL, st) == NB_OK);
    for (int k = 0; k < S; k++) CHECKF(st[k] == NB_OK, "second prefill seq %d: %s", k, nb_status_str(st[k]));
    nb_bm_stats_get(nb_engine_block_manager(e), &bs);
    CHECK(bs.n_fpblocks_total == pool && bs.n_fpblocks_free >= 0);
    for (int k = 0; k < S; k++) CHECK(nb_engine_seq_free(e, seqs[k]) == NB_OK);
    nb_bm_stats_get(nb_engine_block_manager(e), &bs);
    CHECK(bs.n_fpblocks_free == pool);
    printf("fp pool: %d sequences prefilled in chunks, drafted and verified in %d FP blocks\n", S, pool);
    nb_engine_destroy(&e);
}

// The default chunk (1,024) shrinks to what a pass and the context hold,
// rather than making the engine refuse a smaller --max-batch-rows.
static void test_chunk_clamps(const nb_model *m) {
    char err[256];
    nb_engine_params p = nb_engine_default_params();
    p.group_size = 16;
    p.kv_memory = (size_t)16 << 20;
    p.max_batch_rows = 200;
    nb_engine *e = nb_engine_new(m, &p, err, sizeof(err));
    CHECKF(e, "%s", err);
    if (e) CHECKF(nb_engine_params_get(e)->prefill_chunk == 200, "chunk %d", nb_engine_params_get(e)->prefill_chunk);
    nb_engine_destroy(&e);
    p = nb_engine_default_params();
    p.group_size = 16;
    p.kv_memory = (size_t)16 << 20;
    p.max_seq_len = 300;
    e = nb_engine_new(m, &p, err, sizeof(err));
    CHECKF(e, "%s", err);
    if (e) CHECKF(nb_engine_params_get(e)->prefill_chunk == 300, "chunk %d", nb_engine_params_get(e)->prefill_chunk);
    nb_engine_destroy(&e);
    p.max_batch_rows = 8; // still refused: fewer rows than G
    CHECK(nb_engine_new(m, &p, err, sizeof(err)) == NULL && err[0] != 0);
}

int main(void) {
    nb_model *m = etu_load_model("stories260k");
    test_rollbacks(m, NB_TARGET_WEIGHTS_MODEL, NB_TEST_SCALE(4, 1));
    test_rollbacks(m, NB_TARGET_WEIGHTS_INT8, NB_TEST_SCALE(2, 1));
    test_batch_independence(m);
    test_fork_and_prefix(m);
    test_prefix_small_chunks(m);
    test_fp_pool_full_batch(m);
    test_chunk_clamps(m);
    test_distribution(m);
    nb_model_free(&m);
    return nb_test_finish("test_engine_semantics");
}
