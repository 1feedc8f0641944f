/* debug_state.c — tiny-model reference dump for the PyTorch parity test (see debug_state.h). */
#include "trainer/model/debug_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "schemas/safetensors.h"
#include "trainer/model/model_config.h"
#include "trainer/kernels/rng.h"

typedef struct {
    dfm_st_write_tensor *t;
    int64_t (*shapes)[4];
    char (*names)[128];
    int n, cap;
} Dump;

static void dump_add(Dump *d, const char *name, int dtype, const void *data, int ndim, int64_t a, int64_t b,
                     int64_t c) {
    if (d->n == d->cap) return;
    snprintf(d->names[d->n], 128, "%s", name);
    d->shapes[d->n][0] = a;
    d->shapes[d->n][1] = b;
    d->shapes[d->n][2] = c;
    d->t[d->n] = (dfm_st_write_tensor){.name = d->names[d->n], .dtype = dtype, .ndim = ndim,
                                       .shape = d->shapes[d->n], .data = data};
    d->n++;
}

int debug_state_write(const char *path, const char *variant, uint64_t seed) {
    int pretrain = !strcmp(variant, "pretrain"), channel = !strcmp(variant, "dfm-channel");
    if (!pretrain && !channel && strcmp(variant, "dfm-head"))
        return DFM_FAIL(DFM_EARG, "debug-state variant %s: use dfm-head, dfm-channel or pretrain", variant);
    BackboneConfig bc;
    memset(&bc, 0, sizeof bc);
    snprintf(bc.arch, sizeof bc.arch, "%s", channel ? "LlamaForCausalLM" : "Qwen3ForCausalLM");
    bc.vocab_size = 97;
    bc.max_seq = 16;
    bc.tie_embeddings = !channel;
    bc.dec = (StackConfig){.n_layers = 4, .hidden = 32, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8, .ffn = 48,
                           .qk_norm = !channel, .eps = 1e-6f, .rope_theta = 10000.0f};
    DfmConfig dc;
    dfm_config_defaults(&dc, &bc);
    dc.enabled = !pretrain;
    dc.chunk_len = 4;
    dc.n_slots = 3;
    dc.d_mem = 12;
    dc.pred = (StackConfig){.n_layers = 2, .hidden = 24, .n_heads = 3, .n_kv_heads = 1, .head_dim = 8, .ffn = 40,
                            .qk_norm = 0, .eps = 1e-6f, .rope_theta = 10000.0f};
    dc.proj_hidden = 20;
    dc.n_fusion = 2;
    dc.fusion_layers[0] = 1;
    dc.fusion_layers[1] = 3;
    dc.xattn_heads = 4;
    dc.gate_per_channel = channel;
    dc.gate_bias = 0.0f;
    dc.mse_weight = 0.7f;
    dc.init_std = 0.2f;
    dc.pred_input_layer = channel ? 1 : 0; /* dfm-channel: predictor reads layer 0's output */
    dc.pred_input_tokens = channel ? 2 : 0; /* dfm-channel: of the last 2 tokens of each chunk */
    dc.pred_skip = channel;                 /* dfm-channel: with the linear skip path to the slots */
    dc.mem_align = channel ? MEM_ALIGN_SAME : MEM_ALIGN_NEXT; /* both alignments, both loss scales */
    dc.pred_loss = channel ? PRED_LOSS_MSE_ELEM : PRED_LOSS_MSE;
    int B = 2, T = 16, N = B * T, NC = T / dc.chunk_len, S = B * NC * dc.n_slots;
    DfmModel *m = NULL;
    DFM_TRY(model_create(&bc, &dc, B, T, &m));
    model_init_backbone_random(m, seed);
    /* a backbone with some structure: weights std 0.1 */
    int nbv = model_backbone_tensors(m, NULL, 0);
    TensorView *bv = calloc(nbv, sizeof *bv);
    model_backbone_tensors(m, bv, 0);
    dfm_rng r;
    rng_seed(&r, seed + 7);
    for (int i = 0; i < nbv; i++) {
        if (bv[i].ndim == 2) rng_normal(&r, bv[i].data, bv[i].numel, 0.1f);
        else
            for (size_t j = 0; j < bv[i].numel; j++) bv[i].data[j] = 1.0f + 0.2f * (rng_f32(&r) - 0.5f);
    }
    model_init_dfm_random(m, seed + 1);
    if (m->dp.pred_wskip) /* away from its zero init, so that its forward path is tested too */
        rng_normal(&r, m->dp.pred_wskip, (size_t)dc.n_slots * dc.d_mem * bc.dec.hidden, 0.2f);
    if (!pretrain) { /* gates away from their zero init so every fusion weight is tested */
        size_t G = channel ? 32 : 4;
        rng_normal(&r, m->dp.fu_wg, 2 * G * 32, 0.2f);
        rng_normal(&r, m->dp.fu_bg, 2 * G, 0.2f);
    }
    int *tok = malloc(N * sizeof(int)), *tgt = malloc(N * sizeof(int));
    float *tmem = malloc((size_t)S * dc.d_mem * sizeof(float));
    uint8_t *tmask = malloc(S);
    for (int i = 0; i < N; i++) tok[i] = rng_u32(&r) % bc.vocab_size, tgt[i] = rng_u32(&r) % bc.vocab_size;
    tgt[3] = tgt[N - 5] = -1; /* padding positions: no target */
    rng_normal(&r, tmem, (size_t)S * dc.d_mem, 1.0f);
    for (int i = 0; i < S; i++) tmask[i] = (i / dc.n_slots) % NC != 0 && (rng_u32(&r) % 5 != 0);
    /* dfm-head trains with teacher forcing: some chunks fuse their target memory (in.mem_src) */
    uint8_t src[64]; /* B * NC = 8 */
    for (int i = 0; i < B * NC; i++) src[i] = (uint8_t)(!pretrain && !channel && i % 3 == 1);
    int mode = pretrain || channel ? MEM_PREDICTED : MEM_MIXED;
    int rc = mode == MEM_MIXED ? model_set_memory_mix(m, src, B * NC) : DFM_OK;
    model_zero_grad(m);
    if (!rc) rc = model_forward(m, tok, tgt, pretrain ? NULL : tmem, pretrain ? NULL : tmask, B, T, mode, 1, 1.0f);
    if (!rc) rc = model_backward(m);
    if (rc) goto done;

    int nd = model_dfm_tensors(m, NULL, 0);
    int cap = 2 * (nbv + nd) + 32;
    Dump d = {.t = calloc(cap, sizeof(dfm_st_write_tensor)), .shapes = calloc(cap, sizeof(int64_t[4])),
              .names = calloc(cap, 128), .cap = cap};
    TensorView *dv = calloc(nd + 1, sizeof *dv), *gv = calloc((nbv > nd ? nbv : nd) + 1, sizeof *gv);
    model_dfm_tensors(m, dv, 0);
    for (int i = 0; i < nbv; i++) dump_add(&d, bv[i].name, DFM_ST_F32, bv[i].data, bv[i].ndim, bv[i].shape[0], bv[i].shape[1], 0);
    for (int i = 0; i < nd; i++) dump_add(&d, dv[i].name, DFM_ST_F32, dv[i].data, dv[i].ndim, dv[i].shape[0], dv[i].shape[1], 0);
    int ng = pretrain ? model_backbone_tensors(m, gv, 1) : model_dfm_tensors(m, gv, 1);
    for (int i = 0; i < ng; i++) {
        char nm[140];
        snprintf(nm, sizeof nm, "grad.%s", gv[i].name);
        dump_add(&d, nm, DFM_ST_F32, gv[i].data, gv[i].ndim, gv[i].shape[0], gv[i].shape[1], 0);
    }
    float outs[3] = {(float)m->loss, (float)m->ce, (float)m->mse};
    dump_add(&d, "in.tokens", DFM_ST_I32, tok, 2, B, T, 0);
    dump_add(&d, "in.targets", DFM_ST_I32, tgt, 2, B, T, 0);
    if (!pretrain) {
        dump_add(&d, "in.tgt_mem", DFM_ST_F32, tmem, 2, S, dc.d_mem, 0);
        dump_add(&d, "in.tgt_mask", DFM_ST_U8, tmask, 1, S, 0, 0);
        if (mode == MEM_MIXED) dump_add(&d, "in.mem_src", DFM_ST_U8, src, 2, B, NC, 0);
        dump_add(&d, "act.slots", DFM_ST_F32, m->slots, 2, S, dc.d_mem, 0);
        dump_add(&d, "act.mem", DFM_ST_F32, m->mem, 2, S, bc.dec.hidden, 0);
    }
    dump_add(&d, "out.loss", DFM_ST_F32, &outs[0], 1, 1, 0, 0);
    dump_add(&d, "out.ce", DFM_ST_F32, &outs[1], 1, 1, 0, 0);
    dump_add(&d, "out.mse", DFM_ST_F32, &outs[2], 1, 1, 0, 0);
    dump_add(&d, "act.x_layer_in", DFM_ST_F32, m->x_layer_in, 3, bc.dec.n_layers + 1, N, bc.dec.hidden);
    dump_add(&d, "act.lnf_out", DFM_ST_F32, m->lnf_out, 2, N, bc.dec.hidden, 0);
    dump_add(&d, "act.row_losses", DFM_ST_F32, m->row_losses, 1, N, 0, 0);
    json_t *dj = dfm_config_to_json(&dc), *bj = backbone_config_to_hf(&bc);
    char *ds = json_dumps(dj, JSON_COMPACT), *bs = json_dumps(bj, JSON_COMPACT);
    json_t *meta = json_pack("{s:s, s:s, s:s}", "variant", variant, "dfm_config", ds, "backbone_config", bs);
    rc = dfm_safetensors_write(path, d.t, d.n, meta);
    json_decref(meta);
    json_decref(dj);
    json_decref(bj);
    free(ds);
    free(bs);
    free(d.t);
    free(d.shapes);
    free(d.names);
    free(dv);
    free(gv);
done:
    free(bv);
    free(tok);
    free(tgt);
    free(tmem);
    free(tmask);
    model_free(m);
    return rc;
}
