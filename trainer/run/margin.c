/* margin.c — the margin against shuffled memory: the partner's slots and the passes of one micro-batch. */
#include "trainer/run/margin.h"

#include <string.h>

#include "common/error.h"

void margin_partner_memory(const float *tmem, const uint8_t *tmask, int B, size_t per_seq, int d, float *mem_out,
                           uint8_t *mask_out) {
    for (int b = 0; b < B; b++) {
        size_t p = (size_t)((b + B / 2) % B);
        memcpy(mem_out + (size_t)b * per_seq * d, tmem + p * per_seq * d, per_seq * d * sizeof(float));
        memcpy(mask_out + (size_t)b * per_seq, tmask + p * per_seq, per_seq);
    }
}

/* one forward of the margin's pass p: own (shuffled = 0) or the partner's memory, staged first (pass 0's own
 * arrays were staged by the caller) */
static int pass_forward(Engine *en, const MarginBatch *b, const MarginHooks *h, int p, int shuffled, int mode,
                        int train, float grad_scale) {
    if (p > 0)
        DFM_TRY(engine_stage(en, b->inputs, b->targets, shuffled ? b->shuf_mem : b->tmem,
                             shuffled ? b->shuf_mask : b->tmask, b->B, b->T));
    if (h && h->before) h->before(h->ctx, p);
    int rc = engine_forward(en, NULL, NULL, NULL, NULL, b->B, b->T, mode, train, grad_scale);
    if (!rc && h && h->after) h->after(h->ctx, p);
    return rc;
}

static int margin_passes(Engine *en, const DfmModel *m, const MarginConfig *c, const MarginBatch *b, int mode,
                         float scale, float mse_weight, const MarginHooks *h, MarginResult *r) {
    int L = m->dc.chunk_len, K = m->dc.n_slots, d = m->dc.d_mem;
    margin_partner_memory(b->tmem, b->tmask, b->B, (size_t)(b->T / L) * K, d, b->shuf_mem, b->shuf_mask);
    DFM_TRY(pass_forward(en, b, h, 0, 0, mode, 0, 1.0f));
    r->ce_own = m->ce;
    engine_set_mse_weight(en, 0.0f);
    DFM_TRY(pass_forward(en, b, h, 1, 1, mode, 0, 1.0f));
    r->ce_shuf = m->ce;
    double gap = c->margin + r->ce_own - r->ce_shuf;
    r->active = gap > 0;
    /* the own pass: CE's gradient (1 + W·active) times, the predictor loss's once */
    float own = 1.0f + (r->active ? c->weight : 0.0f);
    engine_set_mse_weight(en, mse_weight / own);
    DFM_TRY(pass_forward(en, b, h, 2, 0, mode, 1, scale * own));
    r->mse = m->mse;
    r->loss = m->ce + (m->loss - m->ce) * own + (r->active ? c->weight * gap : 0.0);
    DFM_TRY(engine_backward(en));
    if (!r->active) return DFM_OK;
    engine_set_mse_weight(en, 0.0f);
    DFM_TRY(pass_forward(en, b, h, 3, 1, mode, 1, -scale * c->weight));
    return engine_backward(en);
}

int margin_step(Engine *en, const DfmModel *m, const MarginConfig *c, const MarginBatch *b, int mode, float scale,
                float mse_weight, const MarginHooks *h, MarginResult *r) {
    memset(r, 0, sizeof *r);
    if (b->B < 2) return DFM_FAIL(DFM_EARG, "--margin-weight needs a partner sequence: --batch 2 or more (it is %d)", b->B);
    if (mode != MEM_TARGET && mode != MEM_MIXED)
        return DFM_FAIL(DFM_EARG, "--margin-weight swaps target slots: --fusion-memory target or mixed:P (not predicted)");
    if (!b->tmem || !b->tmask) return DFM_FAIL(DFM_EARG, "--margin-weight needs target memory (--targets)");
    int rc = margin_passes(en, m, c, b, mode, scale, mse_weight, h, r);
    engine_set_mse_weight(en, mse_weight);
    return rc;
}
