// bench_block_manager: host cost of planning one speculative decode step for
// a batch of sequences (append gamma drafts, append the verify position,
// accept a random prefix, flush when C_F2 fills), plus reading each
// sequence's block table as the engine does. Prints figures; never fails on
// speed. Usage: bench_block_manager [batch=256] [gamma=4] [steps=2000] [G=128]
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "block_manager.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

int main(int argc, char **argv) {
    int batch = argc > 1 ? atoi(argv[1]) : 256;
    int gamma = argc > 2 ? atoi(argv[2]) : 4;
    int steps = argc > 3 ? atoi(argv[3]) : 2000;
    int G = argc > 4 ? atoi(argv[4]) : 128;
    int prompt = 1000;
    if (batch < 1 || gamma < 1 || gamma > 16 || steps < 1 || G < 1) {
        fprintf(stderr, "usage: bench_block_manager [batch] [gamma 1..16] [steps] [G]\n");
        return 2;
    }
    nb_bm_params p = nb_bm_default_params();
    p.group_size = G;
    p.max_seqs = batch;
    p.max_seq_len = prompt + steps * (gamma + 1) + 8;
    p.max_append = 512;
    p.n_qblocks = batch * (p.max_seq_len / G + 2);
    p.n_fpblocks = batch * nb_bm_fp_blocks_per_seq_max(&p);
    char err[256];
    nb_bm_t *bm = nb_bm_new(&p, err, sizeof(err));
    if (!bm) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int cap = nb_bm_work_max_per_op(bm) * batch * 3;
    nb_bm_work_list work = {.items = malloc(sizeof(nb_bm_work) * (size_t)cap), .n = 0, .cap = cap};
    int32_t *seqs = malloc(sizeof(int32_t) * (size_t)batch);
    int32_t toks[512];
    for (int i = 0; i < 512; i++) toks[i] = i;
    for (int b = 0; b < batch; b++) {
        if (nb_bm_seq_add(bm, &seqs[b]) != NB_OK) return 1;
        for (int done = 0; done < prompt;) {
            int n = prompt - done < 500 ? prompt - done : 500;
            toks[0] = b; // distinct prompts: no prefix sharing
            work.n = 0;
            if (nb_bm_seq_append(bm, seqs[b], toks, n, NB_BM_COMMITTED, NULL, &work) != NB_OK ||
                nb_bm_seq_flush(bm, seqs[b], &work) != NB_OK) {
                fprintf(stderr, "prefill failed\n");
                return 1;
            }
            done += n;
        }
    }
    long n_quant = 0, n_accepted = 0;
    volatile int64_t sink = 0;
    double t0 = now_us();
    for (int s = 0; s < steps; s++) {
        work.n = 0;
        for (int b = 0; b < batch; b++) { // DRAFT(gamma)
            if (nb_bm_seq_append(bm, seqs[b], toks, gamma, NB_BM_DRAFTED, NULL, &work) != NB_OK)
                return 1;
            nb_bm_seq_view v;
            nb_bm_seq_view_get(bm, seqs[b], &v);
            sink += v.n_qblocks + v.fpblocks[0];
        }
        for (int b = 0; b < batch; b++) { // VERIFY: one more position, then accept
            if (nb_bm_seq_append(bm, seqs[b], toks, 1, NB_BM_DRAFTED, NULL, &work) != NB_OK)
                return 1;
            nb_bm_seq_view v;
            nb_bm_seq_view_get(bm, seqs[b], &v);
            sink += v.n_qblocks + v.fpblocks[0];
            int acc = 1 + (int)(rnd() % (uint32_t)(gamma + 1));
            n_accepted += acc;
            if (nb_bm_seq_accept(bm, seqs[b], acc, &work) != NB_OK) return 1;
        }
        for (int i = 0; i < work.n; i++) n_quant += work.items[i].kind == NB_BM_WORK_QUANTIZE;
    }
    double dt = now_us() - t0;
    char cerr[256];
    nb_status st = nb_bm_check(bm, cerr, sizeof(cerr));
    printf("bench_block_manager: batch %d, gamma %d, G %d, %d steps, %.1f tokens accepted/seq/step\n",
           batch, gamma, G, steps, (double)n_accepted / steps / batch);
    printf("  plan one decode step (draft + verify + accept + flush, batch %d): %.2f us "
           "(%.1f ns per sequence), %ld quantize items planned\n",
           batch, dt / steps, dt * 1e3 / steps / batch, n_quant);
    printf("  target: < 50 us per step; state check: %s\n", st == NB_OK ? "ok" : cerr);
    free(seqs);
    free(work.items);
    nb_bm_destroy(&bm);
    return st == NB_OK ? 0 : 1;
}
