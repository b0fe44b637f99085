// driver.c: prefill, then draft/verify rounds or decode steps, on one
// sequence. See driver.h.
#include "driver.h"

#include <stdbool.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static bool is_eos(const nb_driver_opts *o, int32_t t) {
    for (int32_t i = 0; i < o->n_eos; i++)
        if (o->eos_ids[i] == t) return true;
    return false;
}

nb_status nb_driver_generate(nb_engine *e, const int32_t *prompt, int32_t n_prompt,
                             const nb_driver_opts *o, int32_t *out, nb_driver_stats *stats) {
    nb_driver_stats s = {0};
    double t0 = now_s();
    if (!e || !prompt || !o || !out || o->max_tokens < 1 || o->gamma < 0 ||
        (o->n_eos > 0 && !o->eos_ids))
        return NB_ERR_INVALID_ARG;
    int32_t seq, next;
    nb_status st = nb_engine_seq_add(e, &o->sampling, &seq), sst = NB_OK;
    if (st != NB_OK) return st;
    st = nb_engine_prefill(e, 1, &seq, &prompt, &n_prompt, &next, NULL, NULL, &sst);
    if (st == NB_OK) st = sst;
    bool done = st != NB_OK;
    if (!done) {
        out[s.n_tokens++] = next;
        done = is_eos(o, next) || s.n_tokens >= o->max_tokens;
    }
    int32_t buf[NB_ENGINE_MAX_GAMMA + 1];
    while (!done) {
        int32_t n_out = 0;
        if (o->gamma == 0) {
            st = nb_engine_decode(e, 1, &seq, 1, buf, NULL, &n_out, &sst);
        } else {
            int32_t drafts[NB_ENGINE_MAX_GAMMA], n_acc = 0;
            st = nb_engine_draft(e, 1, &seq, o->gamma, drafts, &sst);
            if (st == NB_OK && sst == NB_OK)
                st = nb_engine_verify(e, 1, &seq, buf, NULL, &n_out, &n_acc, &sst);
            if (st == NB_OK && sst == NB_OK) {
                s.n_drafted += o->gamma;
                s.n_accepted += n_acc;
            }
        }
        if (st == NB_OK) st = sst;
        if (st != NB_OK) break;
        s.n_rounds++;
        for (int32_t j = 0; j < n_out && !done; j++) {
            out[s.n_tokens++] = buf[j];
            done = is_eos(o, buf[j]) || s.n_tokens >= o->max_tokens;
        }
    }
    nb_engine_seq_free(e, seq);
    s.seconds = now_s() - t0;
    if (stats) *stats = s;
    return st;
}
