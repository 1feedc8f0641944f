/* model_config.c — BackboneConfig <-> Hugging Face config.json, DfmConfig <-> JSON. */
#include "trainer/model/model_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* An integer field within [lo, hi] (JSON integers are 64-bit: a value is range-checked before it is narrowed,
 * so hidden_size 2^32+32 is refused, not read as 32). */
static int get_int(json_t *o, const char *key, int required, int def, long long lo, long long hi, int *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) return DFM_FAIL(DFM_EFORMAT, "config.json: missing integer \"%s\"", key);
        *out = def;
        return DFM_OK;
    }
    if (!json_is_integer(v)) return DFM_FAIL(DFM_EFORMAT, "config.json: \"%s\" is not an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return DFM_FAIL(DFM_ERANGE, "config.json: \"%s\" is %lld, outside %lld..%lld. HINT: the file is corrupt or "
                        "not a decoder's config", key, (long long)x, lo, hi);
    *out = (int)x;
    return DFM_OK;
}

/* A number field within the open interval (lo, hi), finite. */
static int get_num(json_t *o, const char *key, double def, double lo, double hi, float *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = (float)def;
        return DFM_OK;
    }
    if (!json_is_number(v)) return DFM_FAIL(DFM_EFORMAT, "config: \"%s\" is not a number", key);
    double x = json_number_value(v);
    if (!(x > lo && x < hi) || !isfinite((float)x) || (float)x == 0.0f)
        return DFM_FAIL(DFM_ERANGE, "config: \"%s\" is %g, outside (%g, %g)", key, x, lo, hi);
    *out = (float)x;
    return DFM_OK;
}

int backbone_config_from_hf(json_t *cfg, BackboneConfig *bc) {
    if (!json_is_object(cfg)) return DFM_FAIL(DFM_EFORMAT, "config.json is not a JSON object");
    json_t *archs = json_object_get(cfg, "architectures");
    const char *arch = json_is_array(archs) ? json_string_value(json_array_get(archs, 0)) : NULL;
    if (!arch) return DFM_FAIL(DFM_EFORMAT, "config.json: no \"architectures\" list");
    int qwen3 = !strcmp(arch, "Qwen3ForCausalLM"), llama = !strcmp(arch, "LlamaForCausalLM"),
        mistral = !strcmp(arch, "MistralForCausalLM");
    if (!qwen3 && !llama && !mistral)
        return DFM_FAIL(DFM_EUNSUPPORTED,
                        "backbone architecture %s is not supported. HINT: dfm-train loads Qwen3ForCausalLM, "
                        "LlamaForCausalLM and MistralForCausalLM",
                        arch);
    int max_seq = bc->max_seq;
    memset(bc, 0, sizeof *bc);
    snprintf(bc->arch, sizeof bc->arch, "%s", arch);
    /* the bounds of model_config.h */
    DFM_TRY(get_int(cfg, "vocab_size", 1, 0, 1, DFM_MAX_VOCAB, &bc->vocab_size));
    DFM_TRY(get_int(cfg, "hidden_size", 1, 0, 1, DFM_MAX_HIDDEN, &bc->dec.hidden));
    DFM_TRY(get_int(cfg, "intermediate_size", 1, 0, 1, DFM_MAX_FFN, &bc->dec.ffn));
    DFM_TRY(get_int(cfg, "num_hidden_layers", 1, 0, 1, DFM_MAX_LAYERS, &bc->dec.n_layers));
    DFM_TRY(get_int(cfg, "num_attention_heads", 1, 0, 1, DFM_MAX_HEADS, &bc->dec.n_heads));
    DFM_TRY(get_int(cfg, "num_key_value_heads", 0, bc->dec.n_heads, 1, bc->dec.n_heads, &bc->dec.n_kv_heads));
    if (bc->dec.n_heads % bc->dec.n_kv_heads)
        return DFM_FAIL(DFM_EFORMAT, "config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                        bc->dec.n_heads, bc->dec.n_kv_heads);
    DFM_TRY(get_int(cfg, "head_dim", 0, bc->dec.hidden / bc->dec.n_heads, 2, DFM_MAX_HEAD_DIM, &bc->dec.head_dim));
    if (bc->dec.head_dim % 2)
        return DFM_FAIL(DFM_EFORMAT, "config.json: head_dim %d is odd (RoPE rotates pairs)", bc->dec.head_dim);
    DFM_TRY(get_num(cfg, "rms_norm_eps", 1e-6, 0, 1, &bc->dec.eps));
    DFM_TRY(get_num(cfg, "rope_theta", 10000.0, 0, 1e12, &bc->dec.rope_theta));
    json_t *tie = json_object_get(cfg, "tie_word_embeddings");
    bc->tie_embeddings = tie ? json_is_true(tie) : 0;
    bc->dec.qk_norm = qwen3;
    json_t *bias = json_object_get(cfg, "attention_bias");
    if (bias && json_is_true(bias))
        return DFM_FAIL(DFM_EUNSUPPORTED, "config.json: attention_bias = true is not supported");
    json_t *rs = json_object_get(cfg, "rope_scaling");
    if (rs && !json_is_null(rs)) return DFM_FAIL(DFM_EUNSUPPORTED, "config.json: rope_scaling is not supported");
    json_t *act = json_object_get(cfg, "hidden_act");
    if (act && json_is_string(act) && strcmp(json_string_value(act), "silu"))
        return DFM_FAIL(DFM_EUNSUPPORTED, "config.json: hidden_act %s is not supported (silu only)",
                        json_string_value(act));
    int mpe = 0;
    DFM_TRY(get_int(cfg, "max_position_embeddings", 0, 4096, 1, 0x7fffffff, &mpe));
    bc->max_seq = max_seq > 0 ? max_seq : (mpe < 4096 ? mpe : 4096);
    json_t *sw = json_object_get(cfg, "sliding_window");
    json_t *usw = json_object_get(cfg, "use_sliding_window");
    if (sw && json_is_integer(sw) && json_integer_value(sw) < bc->max_seq && !(usw && json_is_false(usw)))
        return DFM_FAIL(DFM_EUNSUPPORTED, "config.json: sliding_window %lld < sequence length %d is not supported",
                        (long long)json_integer_value(sw), bc->max_seq);
    return DFM_OK;
}

json_t *backbone_config_to_hf(const BackboneConfig *bc) {
    int qwen3 = !strcmp(bc->arch, "Qwen3ForCausalLM");
    json_t *j = json_object();
    json_t *a = json_array();
    json_array_append_new(a, json_string(bc->arch));
    json_object_set_new(j, "architectures", a);
    json_object_set_new(j, "model_type", json_string(qwen3 ? "qwen3" : "llama"));
    json_object_set_new(j, "vocab_size", json_integer(bc->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(bc->dec.hidden));
    json_object_set_new(j, "intermediate_size", json_integer(bc->dec.ffn));
    json_object_set_new(j, "num_hidden_layers", json_integer(bc->dec.n_layers));
    json_object_set_new(j, "num_attention_heads", json_integer(bc->dec.n_heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(bc->dec.n_kv_heads));
    json_object_set_new(j, "head_dim", json_integer(bc->dec.head_dim));
    json_object_set_new(j, "rms_norm_eps", json_real(bc->dec.eps));
    json_object_set_new(j, "rope_theta", json_real(bc->dec.rope_theta));
    json_object_set_new(j, "max_position_embeddings", json_integer(bc->max_seq));
    json_object_set_new(j, "tie_word_embeddings", json_boolean(bc->tie_embeddings));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    json_object_set_new(j, "attention_bias", json_false());
    json_object_set_new(j, "rope_scaling", json_null());
    json_object_set_new(j, "torch_dtype", json_string("float32"));
    return j;
}

static json_t *stack_to_json(const StackConfig *s) {
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:f, s:f}", "n_layers", s->n_layers, "hidden", s->hidden,
                     "n_heads", s->n_heads, "n_kv_heads", s->n_kv_heads, "head_dim", s->head_dim, "ffn", s->ffn,
                     "qk_norm", s->qk_norm, "eps", (double)s->eps, "rope_theta", (double)s->rope_theta);
}

json_t *dfm_config_to_json(const DfmConfig *dc) {
    json_t *fl = json_array();
    for (int i = 0; i < dc->n_fusion; i++) json_array_append_new(fl, json_integer(dc->fusion_layers[i]));
    json_t *j = json_pack("{s:b, s:i, s:i, s:i, s:o, s:i, s:o, s:i, s:s, s:f, s:f, s:b, s:f, s:i}", "enabled", dc->enabled,
                     "chunk_len", dc->chunk_len, "n_slots", dc->n_slots, "d_mem", dc->d_mem, "predictor",
                     stack_to_json(&dc->pred), "proj_hidden", dc->proj_hidden, "fusion_layers", fl, "xattn_heads",
                     dc->xattn_heads, "gate", dc->gate_per_channel ? "channel" : "head", "gate_bias",
                     (double)dc->gate_bias, "mse_weight", (double)dc->mse_weight, "fuse_first_chunk",
                     dc->fuse_first_chunk, "init_std", (double)dc->init_std, "pred_input_layer",
                     dc->pred_input_layer);
    if (dc->pred_input_tokens) json_object_set_new(j, "pred_input_tokens", json_integer(dc->pred_input_tokens));
    if (dc->pred_skip) json_object_set_new(j, "pred_skip", json_true());
    json_object_set_new(j, "memory_align", json_string(dc->mem_align == MEM_ALIGN_NEXT ? "next" : "same"));
    const char *fm[] = {"predicted", "target", "mixed"};
    json_object_set_new(j, "fusion_memory", json_string(fm[dc->fusion_memory]));
    if (dc->fusion_memory == FUSION_MEM_MIXED) {
        json_object_set_new(j, "teacher_forcing_p", json_real(dc->tf_prob));
        json_object_set_new(j, "teacher_forcing_decay", json_boolean(dc->tf_decay));
    }
    json_object_set_new(j, "pred_loss", json_string(dc->pred_loss == PRED_LOSS_MSE ? "mse" : "mse_elem"));
    if (dc->content_only) json_object_set_new(j, "content_only_fusion", json_true()); /* absent: off */
    if (dc->n_centre > 0) { /* absent: no centring (floats as doubles: exact) */
        json_t *c = json_array();
        for (int i = 0; i < dc->n_centre; i++) json_array_append_new(c, json_real(dc->mem_centre[i]));
        json_object_set_new(j, "memory_centre", c);
    }
    return j;
}

int dfm_config_from_json(json_t *j, DfmConfig *dc) {
    memset(dc, 0, sizeof *dc);
    json_t *p = NULL, *fl = NULL;
    const char *gate = NULL;
    int en = 0, ffc = 0, qk = 0;
    double gb = 0, mw = 0, is = 0, peps = 0, ptheta = 0;
    json_error_t e;
    if (json_unpack_ex(j, &e, 0, "{s:b, s:i, s:i, s:i, s:o, s:i, s:o, s:i, s:s, s:F, s:F, s:b, s:F}", "enabled", &en,
                       "chunk_len", &dc->chunk_len, "n_slots", &dc->n_slots, "d_mem", &dc->d_mem, "predictor", &p,
                       "proj_hidden", &dc->proj_hidden, "fusion_layers", &fl, "xattn_heads", &dc->xattn_heads, "gate",
                       &gate, "gate_bias", &gb, "mse_weight", &mw, "fuse_first_chunk", &ffc, "init_std", &is))
        return DFM_FAIL(DFM_EFORMAT, "DFM config: %s", e.text);
    StackConfig *s = &dc->pred;
    if (json_unpack_ex(p, &e, 0, "{s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:F, s:F}", "n_layers", &s->n_layers, "hidden",
                       &s->hidden, "n_heads", &s->n_heads, "n_kv_heads", &s->n_kv_heads, "head_dim", &s->head_dim,
                       "ffn", &s->ffn, "qk_norm", &qk, "eps", &peps, "rope_theta", &ptheta))
        return DFM_FAIL(DFM_EFORMAT, "DFM config predictor: %s", e.text);
    s->qk_norm = qk;
    s->eps = (float)peps;
    s->rope_theta = (float)ptheta;
    dc->enabled = en;
    dc->fuse_first_chunk = ffc;
    dc->gate_bias = (float)gb;
    dc->mse_weight = (float)mw;
    dc->init_std = (float)is;
    dc->gate_per_channel = !strcmp(gate, "channel");
    json_t *pil = json_object_get(j, "pred_input_layer"); /* optional: 0 (input embeddings) when absent */
    dc->pred_input_layer = json_is_integer(pil) ? (int)json_integer_value(pil) : 0;
    json_t *pit = json_object_get(j, "pred_input_tokens"); /* optional: 0 (the whole chunk) when absent */
    dc->pred_input_tokens = json_is_integer(pit) ? (int)json_integer_value(pit) : 0;
    dc->pred_skip = json_is_true(json_object_get(j, "pred_skip")); /* optional: no skip path when absent */
    /* optional: configurations written before the alignment choice existed used the same chunk */
    const char *al = json_string_value(json_object_get(j, "memory_align"));
    if (al && strcmp(al, "next") && strcmp(al, "same"))
        return DFM_FAIL(DFM_EFORMAT, "DFM config: memory_align \"%s\" is neither next nor same", al);
    dc->mem_align = al && !strcmp(al, "next") ? MEM_ALIGN_NEXT : MEM_ALIGN_SAME;
    /* optional, likewise: trained on predicted memory, loss averaged over the K*d elements */
    const char *fm = json_string_value(json_object_get(j, "fusion_memory"));
    dc->fusion_memory = !fm || !strcmp(fm, "predicted") ? FUSION_MEM_PREDICTED
                        : !strcmp(fm, "target")           ? FUSION_MEM_TARGET
                        : !strcmp(fm, "mixed")            ? FUSION_MEM_MIXED
                                                          : -1;
    if (dc->fusion_memory < 0)
        return DFM_FAIL(DFM_EFORMAT, "DFM config: fusion_memory \"%s\" is not predicted, target or mixed", fm);
    json_t *tp = json_object_get(j, "teacher_forcing_p");
    if (json_is_number(tp)) dc->tf_prob = (float)json_number_value(tp);
    dc->tf_decay = json_is_true(json_object_get(j, "teacher_forcing_decay"));
    const char *pl = json_string_value(json_object_get(j, "pred_loss"));
    if (pl && strcmp(pl, "mse") && strcmp(pl, "mse_elem"))
        return DFM_FAIL(DFM_EFORMAT, "DFM config: pred_loss \"%s\" is neither mse nor mse_elem", pl);
    dc->pred_loss = pl && !strcmp(pl, "mse") ? PRED_LOSS_MSE : PRED_LOSS_MSE_ELEM;
    dc->content_only = json_is_true(json_object_get(j, "content_only_fusion"));
    json_t *mc = json_object_get(j, "memory_centre");
    if (mc) {
        size_t n = json_is_array(mc) ? json_array_size(mc) : 0;
        if (n == 0 || n != (size_t)dc->d_mem || n > DFM_MAX_CENTRE)
            return DFM_FAIL(DFM_EFORMAT, "DFM config: memory_centre must be a list of d_mem = %d numbers (at most %d)",
                            dc->d_mem, DFM_MAX_CENTRE);
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_array_get(mc, i);
            if (!json_is_number(v) || !isfinite(json_number_value(v)))
                return DFM_FAIL(DFM_EFORMAT, "DFM config: memory_centre[%zu] is not a finite number", i);
            dc->mem_centre[i] = (float)json_number_value(v);
        }
        dc->n_centre = (int)n;
    }
    if (!json_is_array(fl) || json_array_size(fl) > DFM_MAX_FUSION)
        return DFM_FAIL(DFM_EFORMAT, "DFM config: fusion_layers must be a list of at most %d", DFM_MAX_FUSION);
    dc->n_fusion = (int)json_array_size(fl);
    for (int i = 0; i < dc->n_fusion; i++) dc->fusion_layers[i] = (int)json_integer_value(json_array_get(fl, i));
    return DFM_OK;
}

int dfm_parse_fusion_memory(const char *s, DfmConfig *dc) {
    if (!strcmp(s, "predicted") || !strcmp(s, "target")) {
        dc->fusion_memory = !strcmp(s, "target") ? FUSION_MEM_TARGET : FUSION_MEM_PREDICTED;
        return DFM_OK;
    }
    char *end = NULL;
    double p = !strncmp(s, "mixed:", 6) ? strtod(s + 6, &end) : -1.0;
    int decay = end && !strcmp(end, ":decay");
    if (p < 0.0 || p > 1.0 || !end || end == s + 6 || (*end && !decay))
        return DFM_FAIL(DFM_EARG, "--fusion-memory \"%s\": use predicted, target, mixed:P or mixed:P:decay with P in "
                        "[0, 1] (e.g. mixed:0.5)", s);
    dc->fusion_memory = FUSION_MEM_MIXED;
    dc->tf_prob = (float)p;
    dc->tf_decay = decay;
    return DFM_OK;
}

int dfm_parse_fusion_layers(const char *s, DfmConfig *dc) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || n >= DFM_MAX_FUSION)
            return DFM_FAIL(DFM_EARG, "--fusion-layers \"%s\": expected comma-separated layer indices (0-based), "
                                      "e.g. 1,3", s);
        dc->fusion_layers[n++] = (int)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) return DFM_FAIL(DFM_EARG, "--fusion-layers \"%s\": unexpected '%c'", s, *p);
    }
    if (!n) return DFM_FAIL(DFM_EARG, "--fusion-layers is empty");
    dc->n_fusion = n;
    return DFM_OK;
}
