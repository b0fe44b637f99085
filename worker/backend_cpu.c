// backend_cpu.c: the cpu backend, a Llama forward pass over the paged,
// hierarchically quantized KV cache built from the scalar C reference
// kernels. It is the backend CI and GPU-less machines run, and the reference
// every CUDA kernel is compared with.
//
// The one idea: all rows of all sequences go through the dense layers
// together (one matmul per weight), while attention runs per sequence over
// that sequence's block table, split where rows see different numbers of
// quantized groups (pre-quantization, block_manager.h).
#include "nb_status.h"
#include <jemalloc/jemalloc.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "attention_ref.h"
#include "backend.h"
#include "kv_quant.h"
#include "ops_ref.h"
#include "sample_host.h"
#include "wquant.h"

typedef struct lin {
    nb_tensor_view w; // checkpoint weights [m][k]
    nb_wq_tensor q;   // hierarchical quantized copy; q.upper == NULL when absent
    void *buf;        // owns q's planes and scales
    size_t buf_bytes;
    int m, k;
} lin;

typedef struct layer_lin {
    lin wq, wk, wv, wo, gate, up, down;
} layer_lin;

typedef struct cpu_backend {
    nb_backend base;
    nb_backend_config cfg;
    const nb_model_config *mc;
    const nb_model_weights *mw;
    layer_lin *layers; // [n_layers]
    lin lm_head;
    float *inv_freq;   // [D/2]
    nb_kv_layout lay;
    nb_kv_pools pools;
    size_t kv_bytes;
    size_t wq_bytes;
    // workspace, rows = cfg.max_rows
    float *x, *xb, *q, *k, *v, *att, *gate, *up, *tmp;
    int32_t *tok, *pos;
    float *attn_work;
    int32_t *qb_tmp; // [max_seq_len/G + 2]
    nb_host_sampler hs; // sampling requests, with the draft slots
} cpu_backend;

// Quantizes one linear layer when a quantized copy is wanted and its input
// width is supported; otherwise it stays in checkpoint precision only.
static nb_status lin_init(lin *L, const nb_tensor_view *w, bool want_q, bool want_lower,
                          size_t *total, char *err, size_t err_len) {
    memset(L, 0, sizeof(*L));
    L->w = *w;
    L->m = (int)w->shape[0];
    L->k = (int)w->shape[1];
    if (!want_q) return NB_OK;
    size_t plane = 0, n_groups = 0;
    if (nb_wq_sizes(L->m, L->k, &plane, &n_groups) != NB_OK) return NB_OK; // stays full precision
    size_t bytes = plane * (want_lower ? 2 : 1) + 2 * n_groups * sizeof(uint16_t);
    uint8_t *buf = malloc(bytes);
    if (!buf) {
        nb_set_err(err, err_len, "cpu backend: out of memory quantizing %s", w->name);
        return NB_ERR_OUT_OF_MEMORY;
    }
    uint8_t *upper = buf, *lower = want_lower ? buf + plane : NULL;
    uint16_t *scale = (uint16_t *)(buf + plane * (want_lower ? 2 : 1));
    uint16_t *zero = scale + n_groups;
    nb_status st = nb_wq_quantize(w->data, w->dtype, L->m, L->k, upper, lower, scale, zero);
    if (st != NB_OK) {
        free(buf);
        nb_set_err(err, err_len, "cpu backend: cannot quantize %s: %s", w->name, nb_status_str(st));
        return st;
    }
    L->buf = buf;
    L->buf_bytes = bytes;
    L->q = (nb_wq_tensor){.upper = upper, .lower = lower, .scale = scale, .zero = zero};
    *total += bytes;
    return NB_OK;
}

// out[n][m] = x[n][k] W^T + bias, in the precision `mode` asks for.
static void lin_apply(const cpu_backend *be, float *out, const float *x, int n, const lin *L,
                      const nb_tensor_view *bias, nb_fwd_mode mode) {
    const void *bd = bias && bias->data ? bias->data : NULL;
    nb_dtype bt = bd ? bias->dtype : NB_DTYPE_F32;
    bool draft_q = mode == NB_FWD_DRAFT && be->cfg.draft_w4 && L->q.upper;
    bool int8 = be->cfg.target_weights == NB_TARGET_WEIGHTS_INT8 && L->q.lower;
    if (draft_q) nb_ref_matmul_wq(out, x, &L->q, 0, bd, bt, n, L->m, L->k);
    else if (int8) nb_ref_matmul_wq(out, x, &L->q, 1, bd, bt, n, L->m, L->k);
    else nb_ref_matmul(out, x, L->w.data, L->w.dtype, bd, bt, n, L->m, L->k);
}

static void cpu_destroy(nb_backend *base) {
    cpu_backend *be = (cpu_backend *)base;
    if (!be) return;
    if (be->layers) {
        for (int l = 0; l < be->mc->n_layers; l++) {
            layer_lin *ll = &be->layers[l];
            lin *all[] = {&ll->wq, &ll->wk, &ll->wv, &ll->wo, &ll->gate, &ll->up, &ll->down};
            for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]->buf);
        }
        free(be->layers);
    }
    free(be->lm_head.buf);
    nb_host_sampler_free(&be->hs);
    free(be->inv_freq);
    free(be->pools.upper);
    free(be->pools.lower);
    free(be->pools.scales);
    free(be->pools.fp);
    free(be->x);
    free(be->xb);
    free(be->q);
    free(be->k);
    free(be->v);
    free(be->att);
    free(be->gate);
    free(be->up);
    free(be->tmp);
    free(be->tok);
    free(be->pos);
    free(be->attn_work);
    free(be->qb_tmp);
    free(be);
}

static nb_status cpu_exec_work(nb_backend *base, const nb_bm_work *items, int32_t n) {
    cpu_backend *be = (cpu_backend *)base;
    for (int32_t i = 0; i < n; i++) {
        const nb_bm_work *w = &items[i];
        nb_status st = NB_ERR_INTERNAL;
        switch (w->kind) {
        case NB_BM_WORK_QUANTIZE: st = nb_kv_quantize_block(&be->lay, &be->pools, w->src, w->dst); break;
        case NB_BM_WORK_DEQUANTIZE:
            st = nb_kv_dequantize_block(&be->lay, &be->pools, w->src, w->dst);
            break;
        case NB_BM_WORK_COPY:
            st = nb_kv_copy_fp_block(&be->lay, &be->pools, w->src, w->dst, w->n_tokens);
            break;
        }
        if (st != NB_OK) return st;
    }
    return NB_OK;
}

static size_t cpu_weight_bytes(const nb_backend *base) { return ((const cpu_backend *)base)->wq_bytes; }
static size_t cpu_kv_bytes(const nb_backend *base) { return ((const cpu_backend *)base)->kv_bytes; }

// Writes rows' K and V (after RoPE) into their FP slots, rounded to the cache dtype.
static void write_kv(cpu_backend *be, int layer, const nb_fwd_seq *s, const float *k,
                     const float *v) {
    const nb_kv_layout *lay = &be->lay;
    const int G = lay->group_size, D = lay->head_dim, Hkv = lay->n_kv_heads;
    for (int i = 0; i < s->n_rows; i++) {
        int32_t idx = s->pos0 + i - s->view.n_qblocks * G;
        NB_ASSERT(idx >= 0 && idx / G < s->view.n_fpblocks);
        int32_t fb = s->view.fpblocks[idx / G];
        int32_t slot = idx % G;
        for (int h = 0; h < Hkv; h++) {
            size_t ko = nb_kv_fp_offset(lay, layer, fb, h, 0, slot);
            size_t vo = nb_kv_fp_offset(lay, layer, fb, h, 1, slot);
            for (int c = 0; c < D; c++) {
                nb_store_f32(be->pools.fp, lay->dtype, ko + c, k[((size_t)i * Hkv + h) * D + c]);
                nb_store_f32(be->pools.fp, lay->dtype, vo + c, v[((size_t)i * Hkv + h) * D + c]);
            }
        }
    }
}

// Attention for one sequence's rows; rows are grouped by how many quantized
// groups they read (at most two groups of rows: before and after the
// pre-quantized C_F1 applies).
static nb_status attend(cpu_backend *be, int layer, nb_kv_view view, const nb_fwd_seq *s,
                        const float *q, float *out) {
    const nb_kv_layout *lay = &be->lay;
    const int G = lay->group_size, D = lay->head_dim, Hq = be->mc->n_heads;
    const float scale = 1.0f / sqrtf((float)D);
    const nb_bm_seq_view *v = &s->view;
    for (int i = 0; i < s->n_rows;) {
        int32_t nq = nb_bm_view_qblocks_for_row(be->cfg.bm, v, s->pos0 + i);
        int j = i + 1;
        while (j < s->n_rows && nb_bm_view_qblocks_for_row(be->cfg.bm, v, s->pos0 + j) == nq) j++;
        const int32_t *qb = v->qblocks;
        if (nq > v->n_qblocks) { // the pre-quantized C_F1 follows the table
            memcpy(be->qb_tmp, v->qblocks, (size_t)v->n_qblocks * sizeof(int32_t));
            be->qb_tmp[v->n_qblocks] = v->prequant_block;
            qb = be->qb_tmp;
        }
        const int32_t *fpb = v->fpblocks + (nq - v->n_qblocks);
        int32_t n_fp = s->pos0 + j - nq * G; // tokens up to the group's last row
        nb_status st = nb_ref_paged_attention(lay, &be->pools, layer, view, qb, nq, fpb, n_fp, Hq,
                                              q + (size_t)i * Hq * D, j - i, s->pos0 + i, scale,
                                              out + (size_t)i * Hq * D, be->attn_work);
        if (st != NB_OK) return st;
        i = j;
    }
    return NB_OK;
}

static nb_status cpu_forward(nb_backend *base, const nb_fwd_batch *b, char *err, size_t err_len) {
    cpu_backend *be = (cpu_backend *)base;
    const nb_model_config *mc = be->mc;
    const nb_model_weights *mw = be->mw;
    const int H = mc->hidden_size, D = mc->head_dim, I = mc->intermediate_size;
    const int Hq = mc->n_heads * D, Hkv = mc->n_kv_heads * D, V = mc->vocab_size;

    int R = 0, n_logits = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const nb_fwd_seq *fs = &b->seqs[s];
        if (fs->n_rows < 1 || fs->n_logits < 0 || fs->n_logits > fs->n_rows) {
            nb_set_err(err, err_len, "forward: sequence %d has %d rows, %d logits", s, fs->n_rows,
                    fs->n_logits);
            return NB_ERR_INVALID_ARG;
        }
        if (R + fs->n_rows > be->cfg.max_rows) {
            nb_set_err(err, err_len, "forward: more than %d rows in one pass", be->cfg.max_rows);
            return NB_ERR_INVALID_ARG;
        }
        for (int i = 0; i < fs->n_rows; i++) {
            if (fs->tokens[i] < 0 || fs->tokens[i] >= V) {
                nb_set_err(err, err_len, "forward: token id %d outside the vocabulary [0, %d)",
                        fs->tokens[i], V);
                return NB_ERR_INVALID_ARG;
            }
            be->tok[R + i] = fs->tokens[i];
            be->pos[R + i] = fs->pos0 + i;
        }
        R += fs->n_rows;
        n_logits += fs->n_logits;
    }
    if (b->n_seqs > 0 && n_logits > 0 && !b->logits) {
        nb_set_err(err, err_len, "forward: no logits buffer");
        return NB_ERR_INVALID_ARG;
    }
    nb_status st = nb_fwd_sample_check(b, V, be->hs.n_slots, be->hs.max_gamma, err, err_len);
    if (st != NB_OK) return st;
    const nb_fwd_mode mode = b->mode;
    const nb_kv_view view = mode == NB_FWD_DRAFT ? be->cfg.draft_view : NB_KV_VIEW_TARGET;

    st = nb_ref_embed(be->x, mw->tok_embd.data, mw->tok_embd.dtype, be->tok, R, H, V);
    if (st != NB_OK) return st;
    for (int l = 0; l < mc->n_layers; l++) {
        const nb_layer_weights *lw = &mw->layers[l];
        const layer_lin *ll = &be->layers[l];
        nb_ref_rmsnorm(be->xb, be->x, lw->attn_norm.data, lw->attn_norm.dtype, R, H, mc->rms_norm_eps);
        lin_apply(be, be->q, be->xb, R, &ll->wq, &lw->bq, mode);
        lin_apply(be, be->k, be->xb, R, &ll->wk, &lw->bk, mode);
        lin_apply(be, be->v, be->xb, R, &ll->wv, &lw->bv, mode);
        nb_ref_rope_apply(be->q, be->pos, R, mc->n_heads, D, be->inv_freq);
        nb_ref_rope_apply(be->k, be->pos, R, mc->n_kv_heads, D, be->inv_freq);
        int r0 = 0;
        for (int s = 0; s < b->n_seqs; s++) {
            const nb_fwd_seq *fs = &b->seqs[s];
            write_kv(be, l, fs, be->k + (size_t)r0 * Hkv, be->v + (size_t)r0 * Hkv);
            r0 += fs->n_rows;
        }
        r0 = 0;
        for (int s = 0; s < b->n_seqs; s++) {
            const nb_fwd_seq *fs = &b->seqs[s];
            st = attend(be, l, view, fs, be->q + (size_t)r0 * Hq, be->att + (size_t)r0 * Hq);
            if (st != NB_OK) {
                nb_set_err(err, err_len, "forward: attention failed at layer %d: %s", l,
                        nb_status_str(st));
                return st;
            }
            r0 += fs->n_rows;
        }
        lin_apply(be, be->tmp, be->att, R, &ll->wo, &lw->bo, mode);
        nb_ref_add(be->x, be->x, be->tmp, (size_t)R * H);
        nb_ref_rmsnorm(be->xb, be->x, lw->ffn_norm.data, lw->ffn_norm.dtype, R, H, mc->rms_norm_eps);
        lin_apply(be, be->gate, be->xb, R, &ll->gate, NULL, mode);
        lin_apply(be, be->up, be->xb, R, &ll->up, NULL, mode);
        nb_ref_silu_mul(be->gate, be->gate, be->up, (size_t)R * I);
        lin_apply(be, be->tmp, be->gate, R, &ll->down, NULL, mode);
        nb_ref_add(be->x, be->x, be->tmp, (size_t)R * H);
    }
    if (n_logits == 0) return NB_OK;
    // Gather the rows that need logits, then the final norm and the LM head.
    int r0 = 0, g = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const nb_fwd_seq *fs = &b->seqs[s];
        for (int i = fs->n_rows - fs->n_logits; i < fs->n_rows; i++, g++)
            memcpy(be->xb + (size_t)g * H, be->x + (size_t)(r0 + i) * H, (size_t)H * sizeof(float));
        r0 += fs->n_rows;
    }
    nb_ref_rmsnorm(be->xb, be->xb, mw->out_norm.data, mw->out_norm.dtype, n_logits, H,
                   mc->rms_norm_eps);
    lin_apply(be, b->logits, be->xb, n_logits, &be->lm_head, NULL, mode);
    if (b->argmax)
        for (int r = 0; r < n_logits; r++)
            b->argmax[r] = nb_ref_argmax(b->logits + (size_t)r * mc->vocab_size, mc->vocab_size);
    nb_host_sample(&be->hs, b, b->logits, b->argmax, false);
    return NB_OK;
}

static const nb_backend_ops cpu_ops = {
    .name = "cpu",
    .forward = cpu_forward,
    .exec_work = cpu_exec_work,
    .weight_bytes = cpu_weight_bytes,
    .kv_bytes = cpu_kv_bytes,
    .destroy = cpu_destroy,
};

const nb_kv_pools *nb_backend_cpu_pools(const nb_backend *base) {
    NB_ASSERT(base && base->ops == &cpu_ops);
    return &((const cpu_backend *)base)->pools;
}

static void *calloc_n(size_t n, size_t size) { return calloc(n > 0 ? n : 1, size); }

#define ALLOC_OR_FAIL(ptr, n)                                                                    \
    do {                                                                                         \
        (ptr) = calloc_n((size_t)(n), sizeof(*(ptr)));                                           \
        if (!(ptr)) goto out_oom;                                                                \
    } while (0)

nb_status nb_backend_cpu_new(const nb_backend_config *cfg, nb_backend **out, char *err,
                             size_t err_len) {
    if (!cfg || !out || !cfg->model || !cfg->bm || cfg->max_rows < 1 || cfg->max_seq_len < 1 ||
        !nb_kv_layout_valid(&cfg->layout)) {
        nb_set_err(err, err_len, "cpu backend: invalid configuration");
        return NB_ERR_INVALID_ARG;
    }
    *out = NULL;
    cpu_backend *be = calloc(1, sizeof(*be));
    if (!be) goto out_oom_early;
    be->base.ops = &cpu_ops;
    be->cfg = *cfg;
    be->mc = nb_model_get_config(cfg->model);
    be->mw = nb_model_get_weights(cfg->model);
    be->lay = cfg->layout;
    const nb_model_config *mc = be->mc;
    const nb_model_weights *mw = be->mw;
    nb_status st;

    bool want_q = cfg->draft_w4 || cfg->target_weights == NB_TARGET_WEIGHTS_INT8;
    bool want_lower = cfg->target_weights == NB_TARGET_WEIGHTS_INT8;
    ALLOC_OR_FAIL(be->layers, mc->n_layers);
    for (int l = 0; l < mc->n_layers; l++) {
        const nb_layer_weights *lw = &mw->layers[l];
        layer_lin *ll = &be->layers[l];
        struct {
            lin *dst;
            const nb_tensor_view *src;
        } map[] = {{&ll->wq, &lw->wq},       {&ll->wk, &lw->wk}, {&ll->wv, &lw->wv},
                   {&ll->wo, &lw->wo},       {&ll->gate, &lw->w_gate},
                   {&ll->up, &lw->w_up},     {&ll->down, &lw->w_down}};
        for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
            st = lin_init(map[i].dst, map[i].src, want_q, want_lower, &be->wq_bytes, err, err_len);
            if (st != NB_OK) goto out_fail;
        }
    }
    st = lin_init(&be->lm_head, &mw->lm_head, want_q, want_lower, &be->wq_bytes, err, err_len);
    if (st != NB_OK) goto out_fail;

    ALLOC_OR_FAIL(be->inv_freq, mc->head_dim / 2);
    st = nb_ref_rope_inv_freq(be->inv_freq, mc->head_dim, (float)mc->rope_theta, &mc->rope_scaling);
    if (st != NB_OK) {
        nb_set_err(err, err_len, "cpu backend: invalid RoPE parameters");
        goto out_fail;
    }

    const nb_kv_layout *lay = &be->lay;
    size_t plane = nb_kv_plane_bytes(lay), scales = nb_kv_scales_bytes(lay), fp = nb_kv_fp_bytes(lay);
    be->kv_bytes = 2 * plane + scales + fp;
    // NOTE: uninitialised on purpose: every slot is written before it is read,
    // which the tests check by poisoning; calloc would hide a missed write.
    be->pools.upper = malloc(plane ? plane : 1);
    be->pools.lower = malloc(plane ? plane : 1);
    be->pools.scales = malloc(scales ? scales : 1);
    be->pools.fp = malloc(fp ? fp : 1);
    if (!be->pools.upper || !be->pools.lower || !be->pools.scales || !be->pools.fp) goto out_oom;

    size_t R = (size_t)cfg->max_rows;
    size_t H = mc->hidden_size, I = mc->intermediate_size, D = mc->head_dim;
    size_t Hq = (size_t)mc->n_heads * D, Hkv = (size_t)mc->n_kv_heads * D;
    ALLOC_OR_FAIL(be->x, R * H);
    ALLOC_OR_FAIL(be->xb, R * H);
    ALLOC_OR_FAIL(be->q, R * Hq);
    ALLOC_OR_FAIL(be->k, R * Hkv);
    ALLOC_OR_FAIL(be->v, R * Hkv);
    ALLOC_OR_FAIL(be->att, R * Hq);
    ALLOC_OR_FAIL(be->gate, R * I);
    ALLOC_OR_FAIL(be->up, R * I);
    ALLOC_OR_FAIL(be->tmp, R * H);
    ALLOC_OR_FAIL(be->tok, R);
    ALLOC_OR_FAIL(be->pos, R);
    int32_t G = lay->group_size;
    int32_t max_groups = cfg->max_seq_len / G + 2;
    ALLOC_OR_FAIL(be->attn_work, nb_ref_paged_attention_work_size(lay, max_groups, 0));
    ALLOC_OR_FAIL(be->qb_tmp, max_groups);
    if (nb_host_sampler_init(&be->hs, mc->vocab_size, cfg->bm->max_seqs,
                             cfg->max_gamma > 0 ? cfg->max_gamma : 0, false) != NB_OK)
        goto out_oom;
    *out = &be->base;
    return NB_OK;

out_oom:
    nb_set_err(err, err_len, "cpu backend: out of host memory");
    st = NB_ERR_OUT_OF_MEMORY;
out_fail:
    cpu_destroy(&be->base);
    return st;
out_oom_early:
    nb_set_err(err, err_len, "cpu backend: out of host memory");
    return NB_ERR_OUT_OF_MEMORY;
}
