/* flops.c — the training-step FLOP count of flops.h. */
#include "trainer/model/flops.h"

/* forward FLOPs per token of one decoder layer of stack c (matrices, and attention over T positions) */
static void layer_flops(const StackConfig *c, int T, double *mat, double *attn) {
    double C = c->hidden, nq = (double)c->n_heads * c->head_dim, nk = (double)c->n_kv_heads * c->head_dim,
           F = c->ffn;
    *mat = 2.0 * (C * nq + 2.0 * C * nk + nq * C + 3.0 * C * F);
    *attn = 2.0 * T * nq; /* QK^T and AV, causal: T/2 keys on average, 2 FLOPs each, two products */
}

double model_train_flops_per_token(const DfmModel *m, int T) {
    const BackboneConfig *bc = &m->bc;
    const DfmConfig *dc = &m->dc;
    double mat, attn, f = 0.0;
    layer_flops(&bc->dec, T, &mat, &attn);
    double head = 2.0 * bc->vocab_size * bc->dec.hidden;
    if (!dc->enabled) /* pretraining: everything trains */
        return bc->dec.n_layers * 3.0 * (mat + attn) + 3.0 * head;
    /* model_backward stops at the lowest fusion block f0: layers 0..f0 run forward only, those above
     * pass gradients (2x matrices, 3x attention) */
    int f0 = dc->fusion_layers[0], above = bc->dec.n_layers - f0 - 1;
    f += (f0 + 1) * (mat + attn) + above * (2.0 * mat + 3.0 * attn);
    f += 2.0 * head; /* forward + input gradient */
    double C = bc->dec.hidden, L = dc->chunk_len, K = dc->n_slots, d = dc->d_mem, H = dc->proj_hidden,
           P = dc->pred.hidden, G = dc->gate_per_channel ? C : dc->xattn_heads, NC = T / dc->chunk_len;
    double pmat, pattn;
    layer_flops(&dc->pred, (int)NC, &pmat, &pattn);
    /* per sequence: the predictor's input projection over the NC - 1 real chunk means (its input is frozen:
     * 2x), its layers and output projection (3x); the projector on K slots per chunk */
    double seq = 2.0 * (2.0 * (NC - 1) * C * P) + 3.0 * NC * dc->pred.n_layers * (pmat + pattn) +
                 3.0 * (2.0 * NC * P * K * d) + 3.0 * (2.0 * NC * K * (d * H + H * C));
    for (int i = 0; i < dc->n_fusion; i++) { /* the lowest block's q and gate need no input gradient: 2x */
        double qg = 2.0 * T * C * C + 2.0 * T * C * G, kv = 2.0 * (2.0 * NC * K * C * C), o = 2.0 * T * C * C,
               xatt = 2.0 * (2.0 * T * K * C);
        seq += (i == 0 ? 2.0 : 3.0) * qg + 3.0 * (kv + o + xatt);
    }
    (void)L;
    f += seq / T;
    return f;
}
