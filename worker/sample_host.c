// sample_host.c: forward-batch sampling on the host (sample_host.h).
#include "sample_host.h"

#include <jemalloc/jemalloc.h>
#include <math.h>
#include <string.h>

#include "ops_ref.h"

static bool params_valid(const nb_sampling_params *sp) {
    return sp && sp->temperature >= 0.0f && isfinite(sp->temperature) && sp->top_k >= 0 &&
           sp->top_p > 0.0f && sp->top_p <= 1.0f;
}

nb_status nb_fwd_sample_check(const nb_fwd_batch *b, int32_t V, int32_t n_slots,
                              int32_t max_gamma, char *err, size_t err_len) {
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const nb_fwd_seq *fs = &b->seqs[s];
        if (fs->sample == NB_FWD_SAMPLE_NONE) continue;
        const char *why = NULL;
        if (fs->sample != NB_FWD_SAMPLE_TARGET && fs->sample != NB_FWD_SAMPLE_DRAFT &&
            fs->sample != NB_FWD_SAMPLE_VERIFY)
            why = "unknown sampling request";
        else if (!b->sampled)
            why = "no output array for sampled tokens";
        else if (!params_valid(fs->sp))
            why = "invalid sampling parameters";
        else if (fs->sample != NB_FWD_SAMPLE_TARGET && (fs->slot < 0 || fs->slot >= n_slots))
            why = "draft slot out of range";
        else if (fs->sample == NB_FWD_SAMPLE_DRAFT &&
                 (fs->n_logits != 1 || fs->draft_step < 0 || fs->draft_step >= max_gamma))
            why = "a draft row needs one logit row and a step below max_gamma";
        else if (fs->sample == NB_FWD_SAMPLE_VERIFY &&
                 (fs->n_logits < 1 || fs->n_logits > max_gamma + 1 || !b->n_accepted ||
                  (fs->n_logits > 1 && !fs->drafts)))
            why = "a verify needs 1..max_gamma+1 logit rows, its drafts and n_accepted";
        for (int32_t i = 0; !why && fs->sample == NB_FWD_SAMPLE_VERIFY && i < fs->n_logits - 1; i++)
            if (fs->drafts[i] < 0 || fs->drafts[i] >= V) why = "draft token outside the vocabulary";
        if (why) {
            nb_set_err(err, err_len, "forward: sequence %d: %s", s, why);
            return NB_ERR_INVALID_ARG;
        }
    }
    return NB_OK;
}

bool nb_fwd_sample_needs_probs(const nb_fwd_batch *b) {
    for (int32_t s = 0; s < b->n_seqs; s++)
        if (nb_fwd_seq_needs_probs(&b->seqs[s])) return true;
    return false;
}

nb_status nb_host_sampler_init(nb_host_sampler *hs, int32_t V, int32_t n_slots, int32_t max_gamma,
                               bool greedy_only) {
    memset(hs, 0, sizeof(*hs));
    hs->V = V;
    hs->n_slots = n_slots;
    hs->max_gamma = max_gamma;
    size_t nq = max_gamma > 0 && !greedy_only ? (size_t)n_slots * max_gamma * V : 1;
    size_t np = greedy_only ? 1 : (size_t)(max_gamma + 1) * V;
    hs->q = malloc(nq * sizeof(float));
    hs->p = malloc(np * sizeof(float));
    hs->work = malloc((greedy_only ? 1 : (size_t)V) * sizeof(float));
    hs->am = malloc((size_t)(max_gamma + 1) * sizeof(int32_t));
    if (!hs->q || !hs->p || !hs->work || !hs->am) {
        nb_host_sampler_free(hs);
        return NB_ERR_OUT_OF_MEMORY;
    }
    return NB_OK;
}

void nb_host_sampler_free(nb_host_sampler *hs) {
    free(hs->q);
    free(hs->p);
    free(hs->work);
    free(hs->am);
    memset(hs, 0, sizeof(*hs));
}

// A token from one logit row: argmax when greedy, else sampled from
// nb_ref_probs into dst with (seed, counter, stream); -1 on failure.
static int32_t sample_row(nb_host_sampler *hs, const nb_sampling_params *sp, const float *lg,
                          int32_t am, float *dst, uint64_t counter, uint32_t stream) {
    if (sp->temperature == 0.0f) return am;
    if (nb_ref_probs(dst, lg, hs->V, sp, hs->work) != NB_OK) return -1;
    return nb_ref_sample(dst, hs->V, nb_rng_uniform(sp->seed, counter, stream));
}

void nb_host_sample(nb_host_sampler *hs, const nb_fwd_batch *b, const float *logits,
                    const int32_t *argmax, bool greedy_only) {
    const int32_t V = hs->V;
    int32_t lr = 0; // first logit row of the sequence
    for (int32_t s = 0; s < b->n_seqs; lr += b->seqs[s].n_logits, s++) {
        const nb_fwd_seq *fs = &b->seqs[s];
        if (fs->sample == NB_FWD_SAMPLE_NONE || fs->n_logits == 0) continue;
        const nb_sampling_params *sp = fs->sp;
        if (greedy_only && sp->temperature != 0.0f) continue;
        const int32_t pos_l0 = fs->pos0 + fs->n_rows - fs->n_logits; // first logit row's position
        int32_t *am = hs->am; // greedy DRAFT/VERIFY: the argmax of each logit row
        const int32_t n_am = fs->sample == NB_FWD_SAMPLE_VERIFY ? fs->n_logits : 1;
        if (sp->temperature == 0.0f && fs->sample != NB_FWD_SAMPLE_TARGET)
            for (int32_t r = 0; r < n_am; r++)
                am[r] = argmax ? argmax[lr + r] : nb_ref_argmax(logits + (size_t)(lr + r) * V, V);
        switch (fs->sample) {
        case NB_FWD_SAMPLE_TARGET:
            for (int32_t r = 0; r < fs->n_logits; r++) {
                const float *lg = logits + (size_t)(lr + r) * V;
                int32_t a = sp->temperature != 0.0f ? -1 : argmax ? argmax[lr + r] : nb_ref_argmax(lg, V);
                b->sampled[lr + r] =
                    sample_row(hs, sp, lg, a, hs->p, (uint64_t)(pos_l0 + r) + 1, 2);
            }
            break;
        case NB_FWD_SAMPLE_DRAFT: {
            float *q = hs->q + ((size_t)fs->slot * hs->max_gamma + fs->draft_step) * V;
            b->sampled[lr] = sample_row(hs, sp, logits + (size_t)lr * V, am[0], q,
                                        (uint64_t)pos_l0 + 1, 0);
            break;
        }
        case NB_FWD_SAMPLE_VERIFY: {
            const int gamma = fs->n_logits - 1;
            int acc = 0;
            nb_status st = NB_OK;
            if (sp->temperature == 0.0f) {
                for (int32_t r = 0; r <= gamma; r++)
                    if (am[r] < 0) st = NB_ERR_NON_FINITE;
                if (st == NB_OK) nb_ref_spec_accept_greedy(gamma, fs->drafts, am, b->sampled + lr, &acc);
            } else {
                for (int32_t r = 0; r <= gamma && st == NB_OK; r++)
                    st = nb_ref_probs(hs->p + (size_t)r * V, logits + (size_t)(lr + r) * V, V, sp,
                                      hs->work);
                if (st == NB_OK)
                    st = nb_ref_spec_accept(gamma, V, hs->p,
                                            hs->q + (size_t)fs->slot * hs->max_gamma * V,
                                            fs->drafts, sp->seed, (uint64_t)pos_l0 + 1,
                                            b->sampled + lr, &acc, hs->work);
            }
            // NOTE: the checks leave only non-finite logits (or a p row with
            // no mass, their consequence) as a failure here.
            b->n_accepted[s] = st == NB_OK ? acc : NB_ERR_NON_FINITE;
            break;
        }
        default:
            break;
        }
    }
}
