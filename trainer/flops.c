/* flops.c — the training-step FLOP count of flops.h. */
#include "trainer/flops.h"

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
    for (int l = 0; l < bc->dec.n_layers; l++) {
        int through = l >= dc->fusion_layers[0]; /* gradients pass through (frozen) */
        f += through ? 2.0 * mat + 3.0 * attn : mat + attn;
    }
    f += 2.0 * head; /* forward + input gradient */
    double C = bc->dec.hidden, L = dc->chunk_len, K = dc->n_slots, d = dc->d_mem, H = dc->proj_hidden,
           P = dc->pred.hidden, G = dc->gate_per_channel ? C : dc->xattn_heads;
    double pmat, pattn;
    layer_flops(&dc->pred, T / dc->chunk_len, &pmat, &pattn);
    double pred = 2.0 * C * P + dc->pred.n_layers * (pmat + pattn) + 2.0 * P * K * d; /* per chunk */
    double proj = K * (2.0 * d * H + 2.0 * H * C);                                     /* per chunk */
    double fuse = 2.0 * C * C * 2.0 + 2.0 * G * C + 2.0 * (K / L) * 2.0 * C * C + 4.0 * K * C; /* per token */
    f += 3.0 * ((pred + proj) / L + dc->n_fusion * fuse);
    return f;
}
