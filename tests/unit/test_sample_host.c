// test_sample_host: the forward-batch sampling requests served on the host
// (worker/sample_host.c), which the cpu backend runs and the GPU sampler is
// compared with. Pins the conventions a backend must follow: a logit row at
// position t samples with counter t + 1 (stream 2 for target rows, 0 for
// drafts), a draft's distribution is kept in its (slot, step) until VERIFY,
// acceptance uses counter0 = the first verify row's position + 1, greedy
// rows take the argmax; and every malformed request is refused up front.
#include <math.h>
#include <string.h>

#include "nb_test.h"
#include "ops_ref.h"
#include "sample_host.h"

#define V 300
#define SLOTS 3
#define MG 4

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static float rnd_logit(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (float)((g_rng * 0x2545F4914F6CDD1Dull) >> 40) * 0x1p-24f * 8.0f - 4.0f;
}

static void fill(float *lg, int rows) {
    for (int i = 0; i < rows * V; i++) lg[i] = rnd_logit();
}

static int32_t ref_token(const float *lg, const nb_sampling_params *sp, uint64_t counter,
                         uint32_t stream, float *probs_out) {
    float p[V], w[V];
    float *dst = probs_out ? probs_out : p;
    if (nb_ref_probs(dst, lg, V, sp, w) != NB_OK) return -1;
    return nb_ref_sample(dst, V, nb_rng_uniform(sp->seed, counter, stream));
}

int main(void) {
    nb_host_sampler hs;
    CHECK(nb_host_sampler_init(&hs, V, SLOTS, MG, false) == NB_OK);
    const nb_sampling_params hot = {0.9f, 50, 0.95f, 77}, cold = {0.0f, 0, 1.0f, 0};
    char err[160];

    // Target rows: a prefill chunk of 10 rows at 40..49 with 2 logit rows
    // (positions 48, 49), and a greedy decode row at 12.
    static float lg[32 * V];
    fill(lg, 32);
    lg[2 * V + 17] = 50.0f; // the greedy row's argmax
    int32_t toks[10] = {0}, sampled[32], n_acc[4];
    nb_fwd_seq fs[3] = {
        {.pos0 = 40, .n_rows = 10, .tokens = toks, .n_logits = 2, .sample = NB_FWD_SAMPLE_TARGET, .sp = &hot},
        {.pos0 = 12, .n_rows = 1, .tokens = toks, .n_logits = 1, .sample = NB_FWD_SAMPLE_TARGET, .sp = &cold},
    };
    nb_fwd_batch b = {.n_seqs = 2, .seqs = fs, .sampled = sampled, .n_accepted = n_acc};
    CHECK(nb_fwd_sample_check(&b, V, SLOTS, MG, err, sizeof(err)) == NB_OK);
    CHECK(nb_fwd_sample_needs_probs(&b));
    nb_host_sample(&hs, &b, lg, NULL, false);
    CHECK(sampled[0] == ref_token(lg, &hot, 49, 2, NULL));
    CHECK(sampled[1] == ref_token(lg + V, &hot, 50, 2, NULL));
    CHECK(sampled[2] == 17);
    // greedy_only leaves the sampled sequence alone.
    sampled[0] = sampled[1] = -7;
    nb_host_sample(&hs, &b, lg, NULL, true);
    CHECK(sampled[0] == -7 && sampled[1] == -7 && sampled[2] == 17);

    // Drafts: slot 2, positions 60..62 (steps 0..2), then VERIFY of the
    // three drafts at 60..63 against the kept q.
    float qref[3][V];
    int32_t drafts[3];
    for (int step = 0; step < 3; step++) {
        fill(lg, 1);
        nb_fwd_seq d = {.pos0 = 60 + step, .n_rows = 1, .tokens = toks, .n_logits = 1,
                        .sample = NB_FWD_SAMPLE_DRAFT, .sp = &hot, .slot = 2, .draft_step = step};
        nb_fwd_batch bd = {.n_seqs = 1, .seqs = &d, .sampled = sampled};
        CHECK(nb_fwd_sample_check(&bd, V, SLOTS, MG, err, sizeof(err)) == NB_OK);
        nb_host_sample(&hs, &bd, lg, NULL, false);
        drafts[step] = ref_token(lg, &hot, (uint64_t)61 + step, 0, qref[step]);
        CHECK(sampled[0] == drafts[step]);
        CHECK(memcmp(hs.q + ((size_t)2 * MG + step) * V, qref[step], sizeof(qref[step])) == 0);
    }
    fill(lg, 4);
    nb_fwd_seq vs = {.pos0 = 60, .n_rows = 4, .tokens = toks, .n_logits = 4,
                     .sample = NB_FWD_SAMPLE_VERIFY, .sp = &hot, .slot = 2, .drafts = drafts};
    nb_fwd_batch bv = {.n_seqs = 1, .seqs = &vs, .sampled = sampled, .n_accepted = n_acc};
    CHECK(nb_fwd_sample_check(&bv, V, SLOTS, MG, err, sizeof(err)) == NB_OK);
    nb_host_sample(&hs, &bv, lg, NULL, false);
    float p[4 * V], w[V];
    for (int r = 0; r < 4; r++) CHECK(nb_ref_probs(p + r * V, lg + r * V, V, &hot, w) == NB_OK);
    int32_t want[4];
    int acc = -1;
    CHECK(nb_ref_spec_accept(3, V, p, &qref[0][0], drafts, hot.seed, 61, want, &acc, w) == NB_OK);
    CHECK(n_acc[0] == acc);
    for (int r = 0; r <= acc && r < 4; r++) CHECK(sampled[r] == want[r]);

    // Greedy verify: exact match against the argmax rows.
    for (int r = 0; r < 4; r++) {
        for (int j = 0; j < V; j++) lg[r * V + j] = (float)((j * 7 + r) % 13);
        lg[r * V + 100 + r] = 99.0f;
    }
    int32_t gd[3] = {100, 101, 5};
    vs.sp = &cold;
    vs.drafts = gd;
    nb_host_sample(&hs, &bv, lg, NULL, false);
    CHECK(n_acc[0] == 2 && sampled[0] == 100 && sampled[1] == 101 && sampled[2] == 102);

    // Non-finite logits: -1 for a target row, NB_ERR_NON_FINITE for a verify.
    lg[3] = NAN;
    fs[0].n_logits = 1;
    b.n_seqs = 1;
    nb_host_sample(&hs, &b, lg, NULL, false);
    CHECK(sampled[0] == -1);
    vs.sp = &hot;
    nb_host_sample(&hs, &bv, lg, NULL, false);
    CHECK(n_acc[0] == NB_ERR_NON_FINITE);

    // Refused requests.
    const nb_sampling_params bad_t = {-1.0f, 0, 1.0f, 0}, bad_p = {1.0f, 0, 0.0f, 0};
    int32_t bad_d[3] = {1, V, 2};
    struct {
        nb_fwd_seq s;
        bool no_out;
    } cases[] = {
        {{.n_rows = 1, .n_logits = 1, .sample = (nb_fwd_sample)9, .sp = &hot}, false},
        {{.n_rows = 1, .n_logits = 1, .sample = NB_FWD_SAMPLE_TARGET, .sp = NULL}, false},
        {{.n_rows = 1, .n_logits = 1, .sample = NB_FWD_SAMPLE_TARGET, .sp = &bad_t}, false},
        {{.n_rows = 1, .n_logits = 1, .sample = NB_FWD_SAMPLE_TARGET, .sp = &bad_p}, false},
        {{.n_rows = 1, .n_logits = 1, .sample = NB_FWD_SAMPLE_TARGET, .sp = &hot}, true},
        {{.n_rows = 1, .n_logits = 1, .sample = NB_FWD_SAMPLE_DRAFT, .sp = &hot, .slot = SLOTS}, false},
        {{.n_rows = 1, .n_logits = 1, .sample = NB_FWD_SAMPLE_DRAFT, .sp = &hot, .slot = -1}, false},
        {{.n_rows = 1, .n_logits = 1, .sample = NB_FWD_SAMPLE_DRAFT, .sp = &hot, .draft_step = MG}, false},
        {{.n_rows = 2, .n_logits = 2, .sample = NB_FWD_SAMPLE_DRAFT, .sp = &hot}, false},
        {{.n_rows = 6, .n_logits = MG + 2, .sample = NB_FWD_SAMPLE_VERIFY, .sp = &hot, .drafts = bad_d}, false},
        {{.n_rows = 4, .n_logits = 4, .sample = NB_FWD_SAMPLE_VERIFY, .sp = &hot, .drafts = bad_d}, false},
        {{.n_rows = 3, .n_logits = 3, .sample = NB_FWD_SAMPLE_VERIFY, .sp = &hot, .drafts = NULL}, false},
    };
    int refused = 0;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        cases[c].s.tokens = toks;
        nb_fwd_batch bc = {.n_seqs = 1, .seqs = &cases[c].s, .sampled = cases[c].no_out ? NULL : sampled,
                           .n_accepted = n_acc};
        err[0] = 0;
        nb_status st = nb_fwd_sample_check(&bc, V, SLOTS, MG, err, sizeof(err));
        CHECKF(st == NB_ERR_INVALID_ARG && err[0], "case %zu: status %d", c, (int)st);
        refused += st == NB_ERR_INVALID_ARG;
    }
    printf("sample_host: target/draft/verify match the reference chain with the pinned counters; "
           "%d malformed requests refused\n", refused);
    nb_host_sampler_free(&hs);
    return nb_test_finish("test_sample_host");
}
