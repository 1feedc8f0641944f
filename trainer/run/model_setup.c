/* model_setup.c — a DfmModel from dfm-train's flags (see model_setup.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "schemas/safetensors.h"
#include "trainer/model/checkpoint.h"
#include "trainer/lm/hf_model.h"
#include "trainer/model/model_config.h"
#include "trainer/run/model_setup.h"

int setup_pretrain_config(const TrainOpts *o, const DataSet *ds, BackboneConfig *bc) {
    memset(bc, 0, sizeof *bc);
    snprintf(bc->arch, sizeof bc->arch, "%s", !strcmp(o->arch, "llama") ? "LlamaForCausalLM" : "Qwen3ForCausalLM");
    bc->vocab_size = o->vocab > 0 ? (int)o->vocab : (int)((ds->max_token + 1 + 63) / 64 * 64);
    if ((uint32_t)bc->vocab_size <= ds->max_token)
        return DFM_FAIL(DFM_EARG, "--vocab %d is not above the largest token id %u", bc->vocab_size, ds->max_token);
    bc->max_seq = (int)o->seq_len;
    bc->tie_embeddings = !o->untied;
    int hd = o->head_dim > 0 ? (int)o->head_dim : (int)(o->hidden / (o->heads > 0 ? o->heads : 1));
    bc->dec = (StackConfig){.n_layers = (int)o->layers, .hidden = (int)o->hidden, .n_heads = (int)o->heads,
                            .n_kv_heads = (int)o->kv_heads, .head_dim = hd,
                            .ffn = o->ffn > 0 ? (int)o->ffn : (int)(3 * o->hidden),
                            .qk_norm = !strcmp(o->arch, "qwen3"), .eps = 1e-6f, .rope_theta = 10000.0f};
    return DFM_OK;
}

/* The DFM config from flags given the backbone and (optional) targets' K, d. */
static int dfm_config_from_opts(const TrainOpts *o, const BackboneConfig *bc, int K, int d, DfmConfig *dc) {
    dfm_config_defaults(dc, bc);
    dc->chunk_len = (int)o->chunk_len;
    if (o->slots > 0) dc->n_slots = (int)o->slots;
    else if (K > 0) dc->n_slots = K;
    if (o->d_mem > 0) dc->d_mem = (int)o->d_mem;
    else if (d > 0) dc->d_mem = d;
    int P = o->pred_hidden > 0 ? (int)o->pred_hidden : dc->pred.hidden;
    int ph = o->pred_heads > 0 ? (int)o->pred_heads : (P >= 64 ? P / 64 : 1);
    if (P % ph) return DFM_FAIL(DFM_EARG, "--pred-heads %d must divide --pred-hidden %d", ph, P);
    dc->pred.hidden = P;
    dc->pred.n_heads = dc->pred.n_kv_heads = ph;
    dc->pred.head_dim = P / ph;
    dc->pred.ffn = 4 * P;
    dc->pred.n_layers = (int)o->pred_layers;
    if (o->proj_hidden > 0) dc->proj_hidden = (int)o->proj_hidden;
    if (o->fusion) DFM_TRY(dfm_parse_fusion_layers(o->fusion, dc));
    if (o->xattn_heads > 0) dc->xattn_heads = (int)o->xattn_heads;
    dc->gate_per_channel = !strcmp(o->gate, "channel");
    dc->gate_bias = (float)o->gate_bias;
    dc->mse_weight = (float)o->mse_weight;
    dc->fuse_first_chunk = (int)o->fuse_first;
    dc->content_only = (int)o->content_only;
    dc->init_std = (float)o->init_std;
    dc->pred_input_layer = (int)o->pred_input_layer;
    dc->pred_input_tokens = (int)o->pred_input_tokens;
    dc->pred_skip = (int)o->pred_skip;
    dc->mem_align = o->memory_align && !strcmp(o->memory_align, "same") ? MEM_ALIGN_SAME : MEM_ALIGN_NEXT;
    dc->pred_loss = o->pred_loss && !strcmp(o->pred_loss, "mse_elem") ? PRED_LOSS_MSE_ELEM : PRED_LOSS_MSE;
    if (o->fusion_memory) DFM_TRY(dfm_parse_fusion_memory(o->fusion_memory, dc));
    return DFM_OK;
}

static int is_safetensors(const char *path) {
    size_t len = strlen(path);
    return len > 12 && !strcmp(path + len - 12, ".safetensors");
}

int setup_modules_config(const char *path, DfmConfig *dc) {
    json_t *cfg = NULL;
    int rc;
    if (is_safetensors(path)) {
        dfm_safetensors *st;
        DFM_TRY(dfm_safetensors_open(path, &st));
        const char *txt = dfm_safetensors_meta(st, "dfm_config");
        json_error_t e;
        cfg = txt ? json_loads(txt, 0, &e) : NULL;
        dfm_safetensors_close(st);
        if (!cfg) return DFM_FAIL(DFM_EFORMAT, "%s has no readable dfm_config metadata. HINT: a file written by "
                                  "dfm-train train", path);
        rc = dfm_config_from_json(cfg, dc);
    } else {
        CkptInfo ci;
        DFM_TRY(ckpt_peek(path, &ci, &cfg));
        rc = ci.mode == 1 ? dfm_config_from_json(json_object_get(cfg, "dfm"), dc)
                          : DFM_FAIL(DFM_EMISMATCH, "%s is a pretraining checkpoint, not DFM modules", path);
    }
    json_decref(cfg);
    if (rc) dfm_error_prefix("%s", path);
    return rc;
}

int setup_frozen_backbone(const char *dir, int B, int T, BackboneConfig *bc, DfmModel **out) {
    memset(bc, 0, sizeof *bc);
    bc->max_seq = T; /* before the config: its checks (a sliding window) are against the sequences run, T */
    DFM_TRY(hf_read_config(dir, bc));
    bc->max_seq = T;
    DfmConfig dc;
    memset(&dc, 0, sizeof dc); /* the backbone alone */
    DfmModel *m;
    DFM_TRY(model_create(bc, &dc, B, T, &m));
    int rc = hf_load_backbone(m, dir);
    if (rc) {
        model_free(m);
        return rc;
    }
    *out = m;
    return DFM_OK;
}

int setup_dfm_model(const TrainOpts *o, int T, int B, int K, int d, DfmModel **out) {
    BackboneConfig bc;
    memset(&bc, 0, sizeof bc);
    bc.max_seq = T;
    DFM_TRY(hf_read_config(o->backbone, &bc));
    DfmConfig dc;
    DFM_TRY(dfm_config_from_opts(o, &bc, K, d, &dc));
    if (o->modules) DFM_TRY(setup_modules_config(o->modules, &dc)); /* eval / generate: the modules' own shape */
    DfmModel *m;
    DFM_TRY(model_create_ex(&bc, &dc, B, T, !o->device || strcmp(o->device, "cuda") != 0, &m));
    int rc = hf_load_backbone(m, o->backbone);
    if (rc) {
        model_free(m);
        return rc;
    }
    model_init_dfm_random(m, (uint64_t)o->seed);
    model_content_only_apply(m); /* (the initial biases are 0 already) */
    *out = m;
    DFM_LOG_I("backbone %s from %s (frozen, %zu parameters); DFM modules %zu parameters: K=%d d=%d L=%d, "
              "predictor %d x %d, %d fusion blocks (gate per %s)",
              bc.arch, o->backbone, m->bb_num, m->dfm_num, dc.n_slots, dc.d_mem, dc.chunk_len, dc.pred.n_layers,
              dc.pred.hidden, dc.n_fusion, dc.gate_per_channel ? "channel" : "head");
    return DFM_OK;
}

json_t *setup_backbone_hash(const DfmModel *m) {
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx",
             (unsigned long long)dfm_checksum64(m->bb_memory, m->bb_num * sizeof(float)));
    return json_string(hex);
}

static int load_modules(DfmModel *m, const char *path) {
    if (is_safetensors(path)) return dfm_modules_load(m, path);
    CkptInfo ci;
    size_t np;
    float *p = model_trainable_params(m, &np);
    float *tm = malloc(np * sizeof(float)), *tv = malloc(np * sizeof(float));
    json_t *saved = NULL;
    int rc = ckpt_load(path, &ci, &saved, p, tm, tv, np);
    if (!rc && ci.mode != 1) rc = DFM_FAIL(DFM_EMISMATCH, "%s is a pretraining checkpoint, not DFM modules", path);
    if (!rc) {
        json_t *h = setup_backbone_hash(m);
        if (!json_equal(json_object_get(saved, "backbone_hash"), h))
            rc = DFM_FAIL(DFM_EMISMATCH, "%s was trained on another backbone (weights hash %s, this one %s). "
                          "HINT: --backbone of the training run", path,
                          json_string_value(json_object_get(saved, "backbone_hash")), json_string_value(h));
        json_decref(h);
    }
    json_decref(saved);
    free(tm);
    free(tv);
    return rc;
}

int setup_load_modules(DfmModel *m, const char *path) {
    DFM_TRY(load_modules(m, path));
    size_t nz = model_content_only_apply(m);
    if (nz) DFM_LOG_I("--content-only-fusion: %zu projector biases of %s set to 0", nz, path);
    return DFM_OK;
}

int setup_init_modules(DfmModel *m, const char *path) {
    DfmConfig dc;
    DFM_TRY(setup_modules_config(path, &dc));
    const DfmConfig *a = &m->dc;
    const char *field = a->chunk_len != dc.chunk_len     ? "chunk_len"
                        : a->n_slots != dc.n_slots       ? "slots"
                        : a->d_mem != dc.d_mem           ? "d_mem"
                        : a->proj_hidden != dc.proj_hidden ? "proj_hidden"
                        : a->n_fusion != dc.n_fusion ||
                                  memcmp(a->fusion_layers, dc.fusion_layers, sizeof(int) * (size_t)a->n_fusion)
                            ? "fusion_layers"
                        : a->xattn_heads != dc.xattn_heads           ? "xattn_heads"
                        : a->gate_per_channel != dc.gate_per_channel ? "gate"
                        : dc.pred_skip && !a->pred_skip              ? "pred_skip (the file has the skip path)"
                        : a->mem_align != dc.mem_align               ? "memory_align"
                        : a->pred.n_layers != dc.pred.n_layers || a->pred.hidden != dc.pred.hidden ||
                                  a->pred.n_heads != dc.pred.n_heads || a->pred.n_kv_heads != dc.pred.n_kv_heads ||
                                  a->pred.head_dim != dc.pred.head_dim || a->pred.ffn != dc.pred.ffn
                            ? "predictor shape"
                            : NULL;
    if (field)
        return DFM_FAIL(DFM_EMISMATCH, "--init-modules %s: its %s differs from this model's. HINT: give the flags the modules "
                        "were trained with (their config is in the file)", path, field);
    /* the predictor's input (its layer, its tokens) and a skip path the file lacks change no tensor the file holds:
     * a reading stage's modules, whose predictor never trained, start a DFM run with any of them */
    if (a->pred_input_layer != dc.pred_input_layer || dfm_pred_tail(a) != dfm_pred_tail(&dc))
        DFM_LOG_I("--init-modules %s: its predictor read layer %d, last %d tokens; it now reads layer %d, last %d", path,
                  dc.pred_input_layer, dfm_pred_tail(&dc), a->pred_input_layer, dfm_pred_tail(a));
    DFM_TRY(setup_load_modules(m, path));
    DFM_LOG_I("DFM modules start from %s", path);
    return DFM_OK;
}

int setup_memory_centre(DfmModel *m, DataSet *ds, size_t n_train, int B) {
    DfmConfig *dc = &m->dc;
    int T = ds->T, L = dc->chunk_len, K = dc->n_slots, d = dc->d_mem, NC = T / L;
    if (!ds->tgt) return DFM_FAIL(DFM_EARG, "--centre-memory takes the mean of the training targets: give --targets");
    if (d > DFM_MAX_CENTRE)
        return DFM_FAIL(DFM_EARG, "--centre-memory: the memory is %d wide, at most %d is supported", d, DFM_MAX_CENTRE);
    size_t n = n_train < SETUP_CENTRE_SEQS ? n_train : SETUP_CENTRE_SEQS, S = (size_t)B * NC * K;
    int *inp = malloc((size_t)B * T * sizeof(int)), *tgt = malloc((size_t)B * T * sizeof(int));
    float *tmem = malloc(S * d * sizeof(float));
    uint8_t *tmask = malloc(S);
    size_t *idx = malloc((size_t)B * sizeof(size_t));
    double *sum = calloc((size_t)d, sizeof(double));
    int rc = inp && tgt && tmem && tmask && idx && sum ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "--centre-memory buffers");
    size_t valid = 0;
    for (size_t i = 0; i < n && !rc; i += (size_t)B) {
        int nb = n - i < (size_t)B ? (int)(n - i) : B;
        for (int k = 0; k < nb; k++) idx[k] = i + (size_t)k;
        rc = data_batch(ds, idx, nb, L, inp, tgt, tmem, tmask);
        for (size_t s = 0; !rc && s < (size_t)nb * NC * K; s++) {
            if (!tmask[s]) continue;
            valid++;
            for (int k = 0; k < d; k++) sum[k] += tmem[s * d + k];
        }
    }
    if (!rc && !valid) rc = DFM_FAIL(DFM_EARG, "--centre-memory: the first %zu training sequences have no valid target slot", n);
    if (!rc) {
        for (int k = 0; k < d; k++) dc->mem_centre[k] = (float)(sum[k] / (double)valid);
        dc->n_centre = d;
        double nn = 0.0;
        for (int k = 0; k < d; k++) nn += (double)dc->mem_centre[k] * dc->mem_centre[k];
        DFM_LOG_I("--centre-memory: every slot enters the projector minus the mean of %zu target slots of the first %zu "
                  "training sequences (its norm %.4f)", valid, n, sqrt(nn));
    }
    free(inp), free(tgt), free(tmem), free(tmask), free(idx), free(sum);
    return rc;
}
