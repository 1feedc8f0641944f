/* model.c — the DFM model's allocation, initialisation, forward and hand-written backward.
 * See model.h for the architecture; kernels are in ops.c, decoder layers in stack.c. */
#include "trainer/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/error.h"
#include "trainer/kernels/attention_cpu.h"
#include "trainer/kernels/ops.h"
#include "trainer/kernels/rng.h"

int model_fusion_gates(const DfmModel *m) {
    return m->dc.gate_per_channel ? m->bc.dec.hidden : m->dc.xattn_heads;
}

void dfm_config_defaults(DfmConfig *dc, const BackboneConfig *bc) {
    memset(dc, 0, sizeof *dc);
    dc->enabled = 1;
    dc->chunk_len = 32;
    dc->n_slots = 16;
    dc->d_mem = 384;
    int C = bc->dec.hidden;
    int P = C < 256 ? C : 256;
    dc->pred = (StackConfig){.n_layers = 2, .hidden = P, .n_heads = P >= 64 ? P / 64 : 1,
                             .n_kv_heads = P >= 64 ? P / 64 : 1, .head_dim = P >= 64 ? 64 : P,
                             .ffn = 4 * P, .qk_norm = 0, .eps = 1e-6f, .rope_theta = 10000.0f};
    dc->proj_hidden = 2 * C;
    /* the paper's 9,16,24,31 of 32 layers, scaled: after layers at fractions 0.3, 0.5, 0.75, 1 */
    int NL = bc->dec.n_layers;
    const double fr[4] = {0.3125, 0.53125, 0.78125, 1.0};
    int n = 0;
    for (int i = 0; i < 4; i++) {
        int l = (int)lround(fr[i] * NL) - 1;
        if (l < 0) l = 0;
        if (n == 0 || l > dc->fusion_layers[n - 1]) dc->fusion_layers[n++] = l;
    }
    dc->n_fusion = n;
    dc->xattn_heads = bc->dec.n_heads;
    dc->gate_per_channel = 0;
    dc->gate_bias = 0.0f;
    dc->mse_weight = 1.0f;
    dc->fuse_first_chunk = 0;
    dc->mem_align = MEM_ALIGN_NEXT;
    dc->fusion_memory = FUSION_MEM_MIXED; /* the measurement behind it: trainer/README.md, "Teacher forcing" */
    dc->tf_prob = 0.5f;
    dc->tf_decay = 0;
    dc->pred_loss = PRED_LOSS_MSE;
    dc->init_std = 0.02f;
}

static int stack_check(const StackConfig *s, const char *what) {
    if (s->n_layers < 0 || s->hidden <= 0 || s->n_heads <= 0 || s->n_kv_heads <= 0 || s->head_dim <= 0 ||
        s->ffn <= 0 || s->head_dim % 2 || s->n_heads % s->n_kv_heads)
        return DFM_FAIL(DFM_EARG,
                        "%s: bad shape (layers %d, hidden %d, heads %d, kv heads %d, head dim %d, ffn %d). "
                        "HINT: heads must be a multiple of kv heads and head_dim even",
                        what, s->n_layers, s->hidden, s->n_heads, s->n_kv_heads, s->head_dim, s->ffn);
    return DFM_OK;
}

int model_config_check(const BackboneConfig *bc, const DfmConfig *dc) {
    DFM_TRY(stack_check(&bc->dec, "backbone"));
    if (bc->vocab_size <= 0 || bc->max_seq <= 0)
        return DFM_FAIL(DFM_EARG, "backbone: vocab %d, max_seq %d must be positive", bc->vocab_size, bc->max_seq);
    if (!dc->enabled) return DFM_OK;
    DFM_TRY(stack_check(&dc->pred, "predictor"));
    if (dc->chunk_len <= 0 || dc->n_slots <= 0 || dc->d_mem <= 0 || dc->proj_hidden <= 0)
        return DFM_FAIL(DFM_EARG, "dfm: L %d, K %d, d %d, projector hidden %d must be positive", dc->chunk_len,
                        dc->n_slots, dc->d_mem, dc->proj_hidden);
    if (bc->max_seq % dc->chunk_len)
        return DFM_FAIL(DFM_EARG, "sequence length %d is not a multiple of the chunk length %d. HINT: --seq-len",
                        bc->max_seq, dc->chunk_len);
    if (dc->xattn_heads <= 0 || bc->dec.hidden % dc->xattn_heads)
        return DFM_FAIL(DFM_EARG, "cross-attention heads %d must divide the hidden size %d", dc->xattn_heads,
                        bc->dec.hidden);
    if (dc->n_fusion < 1 || dc->n_fusion > DFM_MAX_FUSION)
        return DFM_FAIL(DFM_EARG, "need 1..%d fusion layers, got %d. HINT: --fusion-layers 1,3", DFM_MAX_FUSION,
                        dc->n_fusion);
    if (dc->mem_align != MEM_ALIGN_SAME && dc->mem_align != MEM_ALIGN_NEXT)
        return DFM_FAIL(DFM_EARG, "memory alignment %d: use next (%d) or same (%d). HINT: --memory-align",
                        dc->mem_align, MEM_ALIGN_NEXT, MEM_ALIGN_SAME);
    if (dc->fusion_memory < FUSION_MEM_PREDICTED || dc->fusion_memory > FUSION_MEM_MIXED || !(dc->tf_prob >= 0.0f) ||
        dc->tf_prob > 1.0f)
        return DFM_FAIL(DFM_EARG, "fusion memory %d with probability %g: use predicted, target or mixed:P with P in "
                        "[0, 1]. HINT: --fusion-memory", dc->fusion_memory, (double)dc->tf_prob);
    if (dc->pred_loss != PRED_LOSS_MSE && dc->pred_loss != PRED_LOSS_MSE_ELEM)
        return DFM_FAIL(DFM_EARG, "predictor loss %d: use mse or mse_elem. HINT: --pred-loss", dc->pred_loss);
    if (dc->pred_input_layer < 0 || dc->pred_input_layer > dc->fusion_layers[0])
        return DFM_FAIL(DFM_EARG, "predictor input layer %d must be in [0, %d] (frozen states below the first "
                        "fusion block). HINT: --pred-input-layer", dc->pred_input_layer, dc->fusion_layers[0]);
    if (dc->pred_skip != 0 && dc->pred_skip != 1)
        return DFM_FAIL(DFM_EARG, "predictor skip %d: 0 or 1. HINT: --pred-skip", dc->pred_skip);
    if (dc->pred_input_tokens < 0 || dc->pred_input_tokens > dc->chunk_len)
        return DFM_FAIL(DFM_EARG, "predictor input tokens %d must be in [0, %d] (0: the whole chunk; 1: its last "
                        "token). HINT: --pred-input-tokens", dc->pred_input_tokens, dc->chunk_len);
    for (int i = 0; i < dc->n_fusion; i++) {
        int l = dc->fusion_layers[i];
        if (l < 0 || l >= bc->dec.n_layers || (i && l <= dc->fusion_layers[i - 1]))
            return DFM_FAIL(DFM_EARG,
                            "fusion layer %d is out of range or not ascending (backbone has %d layers, 0-based). "
                            "HINT: --fusion-layers 1,3",
                            l, bc->dec.n_layers);
    }
    return DFM_OK;
}

/* ---- parameter layout ------------------------------------------------------------------------------ */
#define BB_NUM (3 + STACK_NUM_TENSORS)
static void bb_layout(const BackboneConfig *bc, BackboneParams *p, float **ptrs[BB_NUM], size_t sizes[BB_NUM]) {
    size_t V = bc->vocab_size, C = bc->dec.hidden;
    ptrs[0] = &p->wte;
    sizes[0] = V * C;
    float **sp[STACK_NUM_TENSORS];
    size_t ss[STACK_NUM_TENSORS];
    stack_param_ptrs(&p->dec, sp);
    stack_param_sizes(&bc->dec, ss);
    for (int i = 0; i < STACK_NUM_TENSORS; i++) {
        ptrs[1 + i] = sp[i];
        sizes[1 + i] = ss[i];
    }
    ptrs[1 + STACK_NUM_TENSORS] = &p->lnf;
    sizes[1 + STACK_NUM_TENSORS] = C;
    ptrs[2 + STACK_NUM_TENSORS] = &p->lm_head;
    sizes[2 + STACK_NUM_TENSORS] = bc->tie_embeddings ? 0 : V * C;
}

size_t model_carve_backbone(const BackboneConfig *bc, BackboneParams *p, float *base) {
    float **ptrs[BB_NUM];
    size_t sizes[BB_NUM];
    bb_layout(bc, p, ptrs, sizes);
    size_t n = carve_floats(base, ptrs, sizes, BB_NUM);
    if (base && bc->tie_embeddings) p->lm_head = p->wte;
    return n;
}

static void dfm_layout(const BackboneConfig *bc, const DfmConfig *dc, DfmParams *p, float **ptrs[DFM_NUM_TENSORS],
                       size_t sizes[DFM_NUM_TENSORS]) {
    size_t C = bc->dec.hidden, P = dc->pred.hidden, K = dc->n_slots, d = dc->d_mem, H = dc->proj_hidden,
           NF = dc->n_fusion, G = dc->gate_per_channel ? C : (size_t)dc->xattn_heads;
    int i = 0;
#define ADD(ptr, n) (ptrs[i] = &(ptr), sizes[i] = (n), i++)
    ADD(p->pred_win, P * C);
    ADD(p->pred_bin, P);
    ADD(p->pred_placeholder, P);
    float **sp[STACK_NUM_TENSORS];
    size_t ss[STACK_NUM_TENSORS];
    stack_param_ptrs(&p->pred, sp);
    stack_param_sizes(&dc->pred, ss);
    for (int j = 0; j < STACK_NUM_TENSORS; j++) ADD(*sp[j], ss[j]);
    ADD(p->pred_lnf, P);
    ADD(p->pred_wout, K * d * P);
    ADD(p->pred_bout, K * d);
    ADD(p->pred_wskip, dc->pred_skip ? K * d * C : 0);
    ADD(p->proj_lnw, d);
    ADD(p->proj_lnb, d);
    ADD(p->proj_w1, H * d);
    ADD(p->proj_b1, H);
    ADD(p->proj_w2, C * H);
    ADD(p->proj_b2, C);
    ADD(p->fu_lnw, NF * C);
    ADD(p->fu_wq, NF * C * C);
    ADD(p->fu_wk, NF * C * C);
    ADD(p->fu_wv, NF * C * C);
    ADD(p->fu_wo, NF * C * C);
    ADD(p->fu_wg, NF * G * C);
    ADD(p->fu_bg, NF * G);
#undef ADD
}

size_t model_carve_dfm(const BackboneConfig *bc, const DfmConfig *dc, DfmParams *p, float *base) {
    float **ptrs[DFM_NUM_TENSORS];
    size_t sizes[DFM_NUM_TENSORS];
    dfm_layout(bc, dc, p, ptrs, sizes);
    return carve_floats(base, ptrs, sizes, DFM_NUM_TENSORS);
}

/* ---- activations ----------------------------------------------------------------------------------- */
#define MAX_ACTS 160
typedef struct {
    float **ptrs[MAX_ACTS];
    size_t sizes[MAX_ACTS];
    int n;
} ActList;
static void al_add(ActList *a, float **p, size_t n) {
    a->ptrs[a->n] = p;
    a->sizes[a->n] = n;
    a->n++;
}

static void act_layout(DfmModel *m, ActList *al, int ce_rows, int flash) {
    const BackboneConfig *bc = &m->bc;
    const DfmConfig *dc = &m->dc;
    size_t B = m->maxB, T = m->maxT, N = B * T, C = bc->dec.hidden, V = bc->vocab_size, NL = bc->dec.n_layers;
    al->n = 0;
    al_add(al, &m->rope_cos, T * bc->dec.head_dim / 2);
    al_add(al, &m->rope_sin, T * bc->dec.head_dim / 2);
    al_add(al, &m->raw_inputs, N);
    al_add(al, &m->raw_targets, N);
    al_add(al, &m->x_layer_in, (NL + 1) * N * C);
    al_add(al, &m->lnf_out, N * C);
    al_add(al, &m->lnf_rstd, N);
    al_add(al, &m->row_losses, N);
    al_add(al, &m->row_top1, N);
    al_add(al, &m->tmp, N * C);
    al_add(al, &m->ce_scratch, (size_t)ce_rows * V);
    al_add(al, &m->d_x, N * C);
    al_add(al, &m->d_x2, N * C);
    {
        float **p[STACK_NUM_ACTS];
        size_t s[STACK_NUM_ACTS];
        stack_act_ptrs(&m->dec_acts, p);
        stack_act_sizes(&bc->dec, B, T, s);
        if (flash) s[9] = NL * B * bc->dec.n_heads * T; /* att holds the softmax log-sum-exp [NL, B, nh, T] */
        for (int i = 0; i < STACK_NUM_ACTS; i++) al_add(al, p[i], s[i]);
    }
    {
        float **p[STACK_NUM_SCRATCH];
        size_t s[STACK_NUM_SCRATCH];
        stack_scratch_ptrs(&m->dec_scr, p);
        stack_scratch_sizes(&bc->dec, B, T, s);
        if (flash) s[11] = B * bc->dec.n_heads * T; /* datt holds rowsum(dout * out) [B, nh, T] */
        /* frozen layers below the lowest fusion block never run backward, but the ones above do */
        for (int i = 0; i < STACK_NUM_SCRATCH; i++) al_add(al, p[i], s[i]);
    }
    if (!dc->enabled) return;
    size_t L = dc->chunk_len, NCc = T / L, Np = B * NCc, P = dc->pred.hidden, K = dc->n_slots, d = dc->d_mem,
           H = dc->proj_hidden, S = Np * K, NF = dc->n_fusion, NLp = dc->pred.n_layers,
           G = dc->gate_per_channel ? C : (size_t)dc->xattn_heads, nhx = dc->xattn_heads;
    al_add(al, &m->prope_cos, NCc * dc->pred.head_dim / 2);
    al_add(al, &m->prope_sin, NCc * dc->pred.head_dim / 2);
    al_add(al, &m->x_fuse_in, NF * N * C);
    al_add(al, &m->pool, Np * C);
    al_add(al, &m->pred_x, (NLp + 1) * Np * P);
    al_add(al, &m->pred_ln, Np * P);
    al_add(al, &m->pred_rstd, Np);
    al_add(al, &m->pred_tmp, Np * P);
    al_add(al, &m->slots, S * d);
    {
        float **p[STACK_NUM_ACTS];
        size_t s[STACK_NUM_ACTS];
        stack_act_ptrs(&m->pred_acts, p);
        stack_act_sizes(&dc->pred, B, NCc, s);
        if (flash) s[9] = (size_t)NLp * B * dc->pred.n_heads * NCc;
        for (int i = 0; i < STACK_NUM_ACTS; i++) al_add(al, p[i], s[i]);
        float **q[STACK_NUM_SCRATCH];
        size_t t[STACK_NUM_SCRATCH];
        stack_scratch_ptrs(&m->pred_scr, q);
        stack_scratch_sizes(&dc->pred, B, NCc, t);
        if (flash) t[11] = B * dc->pred.n_heads * NCc;
        for (int i = 0; i < STACK_NUM_SCRATCH; i++) al_add(al, q[i], t[i]);
    }
    al_add(al, &m->mem_in, S * d);
    al_add(al, &m->pj_ln, S * d);
    al_add(al, &m->pj_mean, S);
    al_add(al, &m->pj_rstd, S);
    al_add(al, &m->pj_h, S * H);
    al_add(al, &m->pj_a, S * H);
    al_add(al, &m->mem, S * C);
    al_add(al, &m->raw_slot_mask, (S + 3) / 4);
    al_add(al, &m->raw_tgt_mask, (S + 3) / 4);
    al_add(al, &m->tgt_mem, S * d);
    al_add(al, &m->fu_xn, NF * N * C);
    al_add(al, &m->fu_rstd, NF * N);
    al_add(al, &m->fu_q, NF * N * C);
    al_add(al, &m->fu_km, NF * S * C);
    al_add(al, &m->fu_vm, NF * S * C);
    al_add(al, &m->fu_p, NF * N * nhx * K);
    al_add(al, &m->fu_y, NF * N * C);
    al_add(al, &m->fu_o, NF * N * C);
    al_add(al, &m->fu_gl, NF * N * G);
    al_add(al, &m->fu_g, NF * N * G);
    al_add(al, &m->d_mem, S * C);
    al_add(al, &m->d_pj_a, S * H);
    al_add(al, &m->d_pj_h, S * H);
    al_add(al, &m->d_pj_ln, S * d);
    al_add(al, &m->d_slots, S * d);
    al_add(al, &m->d_fu_a, N * C);
    al_add(al, &m->d_fu_b, N * C);
    al_add(al, &m->d_fu_c, N * C);
    al_add(al, &m->d_fu_kv, S * C);
    al_add(al, &m->d_fu_kv2, S * C);
    al_add(al, &m->d_fu_gl, N * G);
    al_add(al, &m->d_pred_a, Np * P);
    al_add(al, &m->d_pred_b, Np * P);
    al_add(al, &m->d_pred_c, Np * P);
}

size_t model_carve_acts(DfmModel *m, float *base, int ce_rows, int flash) {
    ActList al;
    act_layout(m, &al, ce_rows, flash);
    size_t n = carve_floats(base, al.ptrs, al.sizes, al.n);
    if (base) { /* int and byte buffers live in the float block (same size / smaller alignment) */
        m->inputs = (int *)(void *)m->raw_inputs;
        m->targets = (int *)(void *)m->raw_targets;
        m->slot_mask = (uint8_t *)m->raw_slot_mask;
        m->tgt_mask = (uint8_t *)m->raw_tgt_mask;
    }
    return n;
}

int model_create(const BackboneConfig *bc, const DfmConfig *dc, int maxB, int maxT, DfmModel **out) {
    return model_create_ex(bc, dc, maxB, maxT, 1, out);
}

int model_create_ex(const BackboneConfig *bc, const DfmConfig *dc, int maxB, int maxT, int host_acts,
                    DfmModel **out) {
    *out = NULL;
    DFM_TRY(model_config_check(bc, dc));
    if (maxB <= 0 || maxT <= 0 || maxT > bc->max_seq || (dc->enabled && maxT % dc->chunk_len))
        return DFM_FAIL(DFM_EARG, "batch %d x %d does not fit (max_seq %d, chunk %d)", maxB, maxT, bc->max_seq,
                        dc->chunk_len);
    DfmModel *m = calloc(1, sizeof *m);
    if (!m) return DFM_FAIL(DFM_ENOMEM, "model struct");
    m->bc = *bc;
    m->dc = *dc;
    m->maxB = maxB;
    m->maxT = maxT;
    m->bb_num = model_carve_backbone(bc, &m->bb, NULL);
    m->bb_memory = calloc(m->bb_num, sizeof(float));
    if (dc->enabled) {
        m->dfm_num = model_carve_dfm(bc, dc, &m->dp, NULL);
        m->dfm_memory = calloc(m->dfm_num, sizeof(float));
        m->grad_num = m->dfm_num;
    } else {
        m->grad_num = m->bb_num;
    }
    m->grad_memory = calloc(m->grad_num, sizeof(float));
    /* without host activations (the model computes on a GPU): only the RoPE tables, which it uploads */
    size_t rope = (size_t)maxT * bc->dec.head_dim / 2,
           prope = dc->enabled ? (size_t)(maxT / dc->chunk_len) * dc->pred.head_dim / 2 : 0;
    /* CPU flash attention where the kernels take both stacks' head sizes: no [B, nh, T, T] matrices */
    int flash = host_acts && attention_flash_cpu_supported(bc->dec.head_dim) &&
                (!dc->enabled || attention_flash_cpu_supported(dc->pred.head_dim));
    if (flash) {
        size_t per = attention_flash_scratch_floats(maxT, bc->dec.head_dim);
        if (dc->enabled) {
            size_t pp = attention_flash_scratch_floats(maxT / dc->chunk_len, dc->pred.head_dim);
            per = pp > per ? pp : per;
        }
#ifdef _OPENMP
        m->flash.threads = omp_get_max_threads();
#else
        m->flash.threads = 1;
#endif
        m->flash.per_thread = per;
        m->flash.buf = malloc(per * m->flash.threads * sizeof(float));
    }
    m->act_num = host_acts ? model_carve_acts(m, NULL, CE_ROWS_BLOCK, flash) : 2 * (rope + prope);
    m->act_memory = calloc(m->act_num ? m->act_num : 1, sizeof(float));
    size_t nchunks = dc->enabled ? (size_t)maxB * (maxT / dc->chunk_len) : 1;
    m->mem_src = calloc(nchunks, 1);
    m->mix_src = calloc(nchunks, 1);
    if (!m->bb_memory || (dc->enabled && !m->dfm_memory) || !m->grad_memory || !m->act_memory || !m->mem_src ||
        !m->mix_src || (flash && !m->flash.buf)) {
        size_t total = (m->bb_num + m->dfm_num + m->grad_num + m->act_num) * 4;
        model_free(m);
        return DFM_FAIL(DFM_ENOMEM, "model needs %.1f MiB (params, grads, activations for %d x %d). "
                        "HINT: smaller --batch or --seq-len", total / 1048576.0, maxB, maxT);
    }
    model_carve_backbone(bc, &m->bb, m->bb_memory);
    if (dc->enabled) {
        model_carve_dfm(bc, dc, &m->dp, m->dfm_memory);
        model_carve_dfm(bc, dc, &m->dp_grad, m->grad_memory);
    } else {
        model_carve_backbone(bc, &m->bb_grad, m->grad_memory);
    }
    if (host_acts) {
        model_carve_acts(m, m->act_memory, CE_ROWS_BLOCK, flash);
    } else {
        m->rope_cos = m->act_memory;
        m->rope_sin = m->rope_cos + rope;
        m->prope_cos = m->rope_sin + rope;
        m->prope_sin = m->prope_cos + prope;
    }
    rope_tables(m->rope_cos, m->rope_sin, maxT, bc->dec.head_dim, bc->dec.rope_theta);
    if (dc->enabled)
        rope_tables(m->prope_cos, m->prope_sin, maxT / dc->chunk_len, dc->pred.head_dim, dc->pred.rope_theta);
    *out = m;
    return DFM_OK;
}

void model_free(DfmModel *m) {
    if (!m) return;
    free(m->bb_memory);
    free(m->dfm_memory);
    free(m->grad_memory);
    free(m->act_memory);
    free(m->flash.buf);
    free(m->mem_src);
    free(m->mix_src);
    free(m);
}

/* ---- initialisation ---------------------------------------------------------------------------------- */
static void init_stack(dfm_rng *r, const StackConfig *c, StackParams *p, float std) {
    float **ptrs[STACK_NUM_TENSORS];
    size_t sizes[STACK_NUM_TENSORS];
    stack_param_ptrs(p, ptrs);
    stack_param_sizes(c, sizes);
    for (int i = 0; i < STACK_NUM_TENSORS; i++) {
        if (!sizes[i]) continue;
        int is_norm = (i == 0 || i == 4 || i == 5 || i == 7);
        if (is_norm)
            for (size_t j = 0; j < sizes[i]; j++) (*ptrs[i])[j] = 1.0f;
        else
            rng_normal(r, *ptrs[i], sizes[i], std);
    }
}

void model_init_backbone_random(DfmModel *m, uint64_t seed) {
    dfm_rng r;
    rng_seed(&r, seed);
    const BackboneConfig *bc = &m->bc;
    size_t V = bc->vocab_size, C = bc->dec.hidden;
    rng_normal(&r, m->bb.wte, V * C, 0.02f);
    init_stack(&r, &bc->dec, &m->bb.dec, 0.02f);
    for (size_t i = 0; i < C; i++) m->bb.lnf[i] = 1.0f;
    if (!bc->tie_embeddings) rng_normal(&r, m->bb.lm_head, V * C, 0.02f);
}

void model_init_dfm_random(DfmModel *m, uint64_t seed) {
    if (!m->dc.enabled) return;
    dfm_rng r;
    rng_seed(&r, seed ^ 0xD1F3ull);
    const DfmConfig *dc = &m->dc;
    DfmParams *p = &m->dp;
    float std = dc->init_std;
    size_t C = m->bc.dec.hidden, P = dc->pred.hidden, K = dc->n_slots, d = dc->d_mem, H = dc->proj_hidden,
           NF = dc->n_fusion, G = model_fusion_gates(m);
    memset(m->dfm_memory, 0, m->dfm_num * sizeof(float));
    rng_normal(&r, p->pred_win, P * C, std);
    rng_normal(&r, p->pred_placeholder, P, std);
    init_stack(&r, &dc->pred, &p->pred, std);
    for (size_t i = 0; i < P; i++) p->pred_lnf[i] = 1.0f;
    /* with the skip path, the Transformer's output projection starts at 0 as the skip does: its random start
     * (std init_std over P normalised inputs, about 6x the targets' per-element size) is noise the skip path's
     * input-dependent map must first outgrow (bench/memory/predictor_fit.py --out-std) */
    if (!dc->pred_skip) rng_normal(&r, p->pred_wout, K * d * P, std);
    for (size_t i = 0; i < d; i++) p->proj_lnw[i] = 1.0f;
    /* projector and fusion: std 1/sqrt(fan_in) (PyTorch's Linear scale), so memory reaches the residual
     * stream at a useful size from the first step; at --init-std their product of four matrices starts
     * near zero and grows slowly. The zero gate weight below keeps the gate at sigmoid(gate_bias). */
    rng_normal(&r, p->proj_w1, H * d, 1.0f / sqrtf((float)d));
    rng_normal(&r, p->proj_w2, C * H, 1.0f / sqrtf((float)H));
    for (size_t i = 0; i < NF * C; i++) p->fu_lnw[i] = 1.0f;
    rng_normal(&r, p->fu_wq, NF * C * C, 1.0f / sqrtf((float)C));
    rng_normal(&r, p->fu_wk, NF * C * C, 1.0f / sqrtf((float)C));
    rng_normal(&r, p->fu_wv, NF * C * C, 1.0f / sqrtf((float)C));
    rng_normal(&r, p->fu_wo, NF * C * C, 1.0f / sqrtf((float)C));
    /* gate: zero weight, bias = gate_bias (the paper's best: 0) */
    for (size_t i = 0; i < NF * G; i++) p->fu_bg[i] = dc->gate_bias;
}

/* ---- DFM module forward/backward ---------------------------------------------------------------------- */
static void predictor_forward(DfmModel *m, int B, int T) {
    const DfmConfig *dc = &m->dc;
    const DfmParams *p = &m->dp;
    int C = m->bc.dec.hidden, P = dc->pred.hidden, NCc = T / dc->chunk_len, Np = B * NCc, NLp = dc->pred.n_layers;
    size_t NCs = (size_t)B * T * C;
    if (m->prefix_pool) memcpy(m->pool, m->prefix_pool, (size_t)Np * C * sizeof(float));
    else chunk_pool_forward(m->pool, m->x_layer_in + (size_t)dc->pred_input_layer * NCs, B, T, dc->chunk_len,
                                          dfm_pred_tail(dc), C);
    matmul_forward(m->pred_x, m->pool, p->pred_win, p->pred_bin, Np, C, P);
    for (int b = 0; b < B; b++) memcpy(m->pred_x + (size_t)b * NCc * P, p->pred_placeholder, P * sizeof(float));
    for (int l = 0; l < NLp; l++)
        stack_layer_forward(&dc->pred, &p->pred, &m->pred_acts, l, m->pred_x + (size_t)(l + 1) * Np * P,
                            m->pred_x + (size_t)l * Np * P, B, NCc, m->prope_cos, m->prope_sin,
                            model_flash(m));
    rmsnorm_forward(m->pred_ln, m->pred_rstd, m->pred_x + (size_t)NLp * Np * P, p->pred_lnf, Np, P, dc->pred.eps);
    matmul_forward(m->slots, m->pred_ln, p->pred_wout, p->pred_bout, Np, P, dc->n_slots * dc->d_mem);
    if (p->pred_wskip) matmul_forward_acc(m->slots, m->pool, p->pred_wskip, Np, C, dc->n_slots * dc->d_mem);
}

static void predictor_backward(DfmModel *m, int B, int T) {
    const DfmConfig *dc = &m->dc;
    const DfmParams *p = &m->dp;
    DfmParams *g = &m->dp_grad;
    int C = m->bc.dec.hidden, P = dc->pred.hidden, NCc = T / dc->chunk_len, Np = B * NCc, NLp = dc->pred.n_layers;
    size_t NP = (size_t)Np * P;
    float *da = m->d_pred_a, *db = m->d_pred_b, *dc_ = m->d_pred_c;
    vec_zero(da, NP);
    matmul_backward(da, g->pred_wout, g->pred_bout, m->d_slots, m->pred_ln, p->pred_wout, Np, P,
                    dc->n_slots * dc->d_mem);
    if (p->pred_wskip) /* the pooled input is frozen: the skip path's weight alone has a gradient */
        matmul_backward(NULL, g->pred_wskip, NULL, m->d_slots, m->pool, p->pred_wskip, Np, C, dc->n_slots * dc->d_mem);
    vec_zero(db, NP);
    rmsnorm_backward(db, g->pred_lnf, da, m->pred_x + (size_t)NLp * NP, p->pred_lnf, m->pred_rstd, Np, P);
    for (int l = NLp - 1; l >= 0; l--) {
        vec_zero(dc_, NP);
        stack_layer_backward(&dc->pred, &p->pred, &g->pred, &m->pred_acts, &m->pred_scr, l, dc_, db,
                             m->pred_x + (size_t)l * NP, B, NCc, m->prope_cos, m->prope_sin, model_flash(m));
        float *t = db;
        db = dc_;
        dc_ = t;
    }
    for (int b = 0; b < B; b++) {
        float *row = db + (size_t)b * NCc * P;
        for (int i = 0; i < P; i++) {
            g->pred_placeholder[i] += row[i];
            row[i] = 0.0f;
        }
    }
    matmul_backward(NULL, g->pred_win, g->pred_bin, db, m->pool, p->pred_win, Np, C, P);
}

static void projector_forward(DfmModel *m, int S) {
    const DfmConfig *dc = &m->dc;
    const DfmParams *p = &m->dp;
    int d = dc->d_mem, H = dc->proj_hidden, C = m->bc.dec.hidden;
    layernorm_forward(m->pj_ln, m->pj_mean, m->pj_rstd, m->mem_in, p->proj_lnw, p->proj_lnb, S, d, 1e-5f);
    matmul_forward(m->pj_h, m->pj_ln, p->proj_w1, p->proj_b1, S, d, H);
    gelu_forward(m->pj_a, m->pj_h, (size_t)S * H);
    matmul_forward(m->mem, m->pj_a, p->proj_w2, p->proj_b2, S, H, C);
}

static void projector_backward(DfmModel *m, int S) {
    const DfmConfig *dc = &m->dc;
    const DfmParams *p = &m->dp;
    DfmParams *g = &m->dp_grad;
    int d = dc->d_mem, H = dc->proj_hidden, C = m->bc.dec.hidden, co = dc->content_only; /* biases held at 0 */
    vec_zero(m->d_pj_a, (size_t)S * H);
    matmul_backward(m->d_pj_a, g->proj_w2, co ? NULL : g->proj_b2, m->d_mem, m->pj_a, p->proj_w2, S, H, C);
    vec_zero(m->d_pj_h, (size_t)S * H);
    gelu_backward(m->d_pj_h, m->d_pj_a, m->pj_h, (size_t)S * H);
    vec_zero(m->d_pj_ln, (size_t)S * d);
    matmul_backward(m->d_pj_ln, g->proj_w1, co ? NULL : g->proj_b1, m->d_pj_h, m->pj_ln, p->proj_w1, S, d, H);
    layernorm_backward(m->d_slots, g->proj_lnw, co ? NULL : g->proj_lnb, m->d_pj_ln, m->mem_in, p->proj_lnw, m->pj_mean,
                       m->pj_rstd, S, d);
}

size_t model_content_only_apply(DfmModel *m) {
    if (!m->dc.enabled || !m->dc.content_only) return 0;
    DfmParams *p = &m->dp;
    size_t d = (size_t)m->dc.d_mem, H = (size_t)m->dc.proj_hidden, C = (size_t)m->bc.dec.hidden, nz = 0;
    float *b[3] = {p->proj_lnb, p->proj_b1, p->proj_b2};
    size_t n[3] = {d, H, C};
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < n[t]; i++) {
            nz += b[t][i] != 0.0f;
            b[t][i] = 0.0f;
        }
    return nz;
}

FusionView model_fusion_view(const DfmModel *m, const DfmParams *p, int f) {
    size_t C = m->bc.dec.hidden, N = (size_t)m->B * m->T, G = model_fusion_gates(m), K = m->dc.n_slots,
           S = (size_t)m->B * (m->T / m->dc.chunk_len) * K, nhx = m->dc.xattn_heads;
    /* activation slabs are laid out for maxB x maxT; index them with the max sizes */
    size_t Nm = (size_t)m->maxB * m->maxT, Sm = (size_t)m->maxB * (m->maxT / m->dc.chunk_len) * K;
    (void)N;
    (void)S;
    FusionView v;
    v.lnw = p->fu_lnw + f * C;
    v.wq = p->fu_wq + f * C * C;
    v.wk = p->fu_wk + f * C * C;
    v.wv = p->fu_wv + f * C * C;
    v.wo = p->fu_wo + f * C * C;
    v.wg = p->fu_wg + f * G * C;
    v.bg = p->fu_bg + f * G;
    v.xn = m->fu_xn + f * Nm * C;
    v.rstd = m->fu_rstd + f * Nm;
    v.q = m->fu_q + f * Nm * C;
    v.km = m->fu_km + f * Sm * C;
    v.vm = m->fu_vm + f * Sm * C;
    v.p = m->fu_p + f * Nm * nhx * K;
    v.y = m->fu_y + f * Nm * C;
    v.o = m->fu_o + f * Nm * C;
    v.gl = m->fu_gl + f * Nm * G;
    v.g = m->fu_g + f * Nm * G;
    return v;
}

static void fusion_forward(DfmModel *m, int f, float *out, const float *h) {
    int B = m->B, T = m->T, N = B * T, C = m->bc.dec.hidden, K = m->dc.n_slots, L = m->dc.chunk_len;
    int S = B * (T / L) * K, nhx = m->dc.xattn_heads, G = model_fusion_gates(m);
    FusionView v = model_fusion_view(m, &m->dp, f);
    rmsnorm_forward(v.xn, v.rstd, h, v.lnw, N, C, m->bc.dec.eps);
    matmul_forward(v.q, v.xn, v.wq, NULL, N, C, C);
    matmul_forward(v.km, m->mem, v.wk, NULL, S, C, C);
    matmul_forward(v.vm, m->mem, v.wv, NULL, S, C, C);
    crossattn_forward(v.y, v.p, v.q, v.km, v.vm, m->slot_mask, B, T, L, m->dc.mem_align, K, nhx, C / nhx);
    matmul_forward(v.o, v.y, v.wo, NULL, N, C, C);
    matmul_forward(v.gl, h, v.wg, v.bg, N, C, G);
    gate_forward(out, v.g, v.gl, h, v.o, N, C, G);
}

static void fusion_backward(DfmModel *m, int f, float *dh, const float *dout, const float *h) {
    int B = m->B, T = m->T, N = B * T, C = m->bc.dec.hidden, K = m->dc.n_slots, L = m->dc.chunk_len;
    int S = B * (T / L) * K, nhx = m->dc.xattn_heads, G = model_fusion_gates(m);
    FusionView v = model_fusion_view(m, &m->dp, f);
    FusionView gv = model_fusion_view(m, &m->dp_grad, f);
    size_t NCs = (size_t)N * C, SC = (size_t)S * C;
    float *d_o = m->d_fu_a, *d_y = m->d_fu_b, *d_q = m->d_fu_c, *d_xn = m->d_fu_a;
    vec_zero(d_o, NCs);
    vec_zero(m->d_fu_gl, (size_t)N * G);
    gate_backward(dh, m->d_fu_gl, d_o, dout, v.g, v.o, N, C, G);
    matmul_backward(dh, gv.wg, gv.bg, m->d_fu_gl, h, v.wg, N, C, G);
    vec_zero(d_y, NCs);
    matmul_backward(d_y, gv.wo, NULL, d_o, v.y, v.wo, N, C, C);
    vec_zero(d_q, NCs);
    vec_zero(m->d_fu_kv, SC);
    vec_zero(m->d_fu_kv2, SC);
    crossattn_backward(d_q, m->d_fu_kv, m->d_fu_kv2, d_y, v.p, v.q, v.km, v.vm, B, T, L, m->dc.mem_align, K, nhx,
                       C / nhx);
    matmul_backward(m->d_mem, gv.wk, NULL, m->d_fu_kv, m->mem, v.wk, S, C, C);
    matmul_backward(m->d_mem, gv.wv, NULL, m->d_fu_kv2, m->mem, v.wv, S, C, C);
    vec_zero(d_xn, NCs);
    matmul_backward(d_xn, gv.wq, NULL, d_q, v.xn, v.wq, N, C, C);
    rmsnorm_backward(dh, gv.lnw, d_xn, h, v.lnw, v.rstd, N, C);
}

/* ---- whole model ------------------------------------------------------------------------------------ */
int model_fusion_after(const DfmModel *m, int l) {
    if (!m->dc.enabled) return -1;
    for (int f = 0; f < m->dc.n_fusion; f++)
        if (m->dc.fusion_layers[f] == l) return f;
    return -1;
}

/* ---- teacher forcing, loss scale, per-position CE ---------------------------------------------------- */
static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void model_memory_mix_draw(uint8_t *src, const size_t *seq, int B, int NC, double p, uint64_t seed) {
    for (int b = 0; b < B; b++)
        for (int c = 0; c < NC; c++) {
            uint64_t h = mix64(mix64(seed ^ mix64((uint64_t)seq[b])) + (uint64_t)c);
            src[(size_t)b * NC + c] = (double)(h >> 11) * 0x1.0p-53 < p;
        }
}

int model_set_memory_mix(DfmModel *m, const uint8_t *src, int n) {
    if (!m->dc.enabled || n <= 0 || n > m->maxB * (m->maxT / m->dc.chunk_len))
        return DFM_FAIL(DFM_EARG, "memory mix of %d chunks: the model takes 1..%d (DFM mode only)", n,
                        m->maxB * (m->maxT / m->dc.chunk_len));
    memcpy(m->mix_src, src, (size_t)n);
    return DFM_OK;
}

int model_memory_sources(DfmModel *m, int B, int NC, int mem_mode) {
    int n = 0;
    for (int i = 0; i < B * NC; i++) {
        m->mem_src[i] = (uint8_t)(mem_mode == MEM_TARGET || (mem_mode == MEM_MIXED && m->mix_src[i]));
        n += m->mem_src[i];
    }
    return n;
}

double model_pred_loss_scale(const DfmConfig *dc) { return dc->pred_loss == PRED_LOSS_MSE ? (double)dc->d_mem : 1.0; }

void model_set_losses(DfmModel *m, double ce_sum, int denom, const CeSoft *soft) {
    const DfmConfig *dc = &m->dc;
    m->ce = ce_sum / denom;
    double lm_loss = m->ce;
    if (soft) {
        lm_loss = (soft->wce_sum + soft->weight * soft->kl_sum) / denom;
        m->n_teacher = soft->n_teacher;
        m->kl = m->n_teacher ? soft->kl_sum / (double)m->n_teacher : 0.0;
    }
    m->loss = lm_loss + (dc->enabled && m->have_targets ? dc->mse_weight * model_pred_loss_scale(dc) * m->mse : 0.0);
}

void model_ce_by_position(const float *row_losses, const int *targets, int B, int T, int L, double *sum,
                          long *count) {
    for (int i = 0; i < B * T; i++) {
        if (targets[i] < 0) continue;
        int j = (i % T + 1) % L;
        sum[j] += row_losses[i];
        count[j]++;
    }
}

/* Predictor (when predicting or when targets allow an MSE), the memory fed to the projector and its
 * slot mask (each chunk's predicted or target slots, m->mem_src), the projector, and MSE / cosine
 * against the targets. Runs right before fusion block 0. */
static void prepare_memory(DfmModel *m, int B, int T, int mem_mode) {
    const DfmConfig *dc = &m->dc;
    int L = dc->chunk_len, NCc = T / L, K = dc->n_slots, d = dc->d_mem;
    int S = B * NCc * K;
    if (mem_mode == MEM_PREDICTED || m->have_targets) predictor_forward(m, B, T);
    model_memory_sources(m, B, NCc, mem_mode);
    if (mem_mode != MEM_NONE) {
        for (int i = 0; i < B * NCc; i++) {
            size_t r0 = (size_t)i * K;
            if (m->mem_src[i]) {
                memcpy(m->mem_in + r0 * d, m->tgt_mem + r0 * d, (size_t)K * d * sizeof(float));
                memcpy(m->slot_mask + r0, m->tgt_mask + r0, K);
            } else {
                memcpy(m->mem_in + r0 * d, m->slots + r0 * d, (size_t)K * d * sizeof(float));
                memset(m->slot_mask + r0, (i % NCc > 0 || dc->fuse_first_chunk) ? 1 : 0, K);
            }
        }
        if (dc->n_centre == d) /* centred memory (the projector's input only: the MSE compares the raw slots) */
            for (size_t s = 0; s < (size_t)S; s++)
                for (int k = 0; k < d; k++) m->mem_in[s * d + k] -= dc->mem_centre[k];
        projector_forward(m, S);
    }
    if (!m->have_targets) return;
    m->mse = mse_forward_backward(NULL, m->slots, m->tgt_mem, m->tgt_mask, S, d, 0.0f);
    double cs = 0.0;
    size_t nv = 0;
    for (int s = 0; s < S; s++) {
        if (!m->tgt_mask[s]) continue;
        const float *a = m->slots + (size_t)s * d, *t = m->tgt_mem + (size_t)s * d;
        double ab = 0, aa = 0, tt = 0;
        for (int i = 0; i < d; i++) {
            ab += (double)a[i] * t[i];
            aa += (double)a[i] * a[i];
            tt += (double)t[i] * t[i];
        }
        cs += ab / (sqrt(aa * tt) + 1e-12);
        nv++;
    }
    m->cos = nv ? cs / nv : 0.0;
}

static int forward_impl(DfmModel *m, const int *inputs, const int *targets, const float *tgt_mem,
                        const uint8_t *tgt_mask, int B, int T, int mem_mode, int train, float grad_scale) {
    const BackboneConfig *bc = &m->bc;
    const DfmConfig *dc = &m->dc;
    if (!model_batch_fits(m, B, T))
        return DFM_FAIL(DFM_EARG, "batch %d x %d does not fit the model's %d x %d (chunk %d)", B, T, m->maxB,
                        m->maxT, dc->chunk_len);
    if (!dc->enabled) mem_mode = MEM_NONE;
    if ((mem_mode == MEM_TARGET || mem_mode == MEM_MIXED) && (!tgt_mem || !tgt_mask))
        return DFM_FAIL(DFM_EARG, "target-memory forward needs target slots and mask. HINT: --targets");
    if (train && dc->enabled && mem_mode == MEM_NONE)
        return DFM_FAIL(DFM_EARG, "a training forward must fuse memory (predicted, target or mixed)");
    int V = bc->vocab_size, C = bc->dec.hidden, NL = bc->dec.n_layers, N = B * T;
    int n_valid = 0;
    for (int i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || targets[i] < -1 || targets[i] >= V)
            return DFM_FAIL(DFM_ERANGE, "token id %d / %d at %d outside the vocabulary of %d",
                            inputs[i], targets[i], i, V);
        n_valid += targets[i] >= 0;
    }
    m->n_valid = n_valid;
    int denom = n_valid ? n_valid : 1;
    m->B = B;
    m->T = T;
    m->mem_mode = mem_mode;
    memcpy(m->inputs, inputs, N * sizeof(int));
    memcpy(m->targets, targets, N * sizeof(int));
    size_t NCs = (size_t)N * C;

    m->have_targets = 0;
    m->mse = m->cos = 0.0;
    if (dc->enabled && tgt_mem && tgt_mask) {
        size_t S = (size_t)B * (T / dc->chunk_len) * dc->n_slots;
        memcpy(m->tgt_mem, tgt_mem, S * dc->d_mem * sizeof(float));
        memcpy(m->tgt_mask, tgt_mask, S);
        m->have_targets = 1;
    }

    /* decoder with fusion blocks; with a frozen prefix, from fusion block 0's input */
    int l0 = 0;
    if (m->prefix_fuse_in && dc->enabled) {
        l0 = dc->fusion_layers[0];
        memcpy(m->x_fuse_in, m->prefix_fuse_in, NCs * sizeof(float));
    } else {
        embedding_forward(m->x_layer_in, inputs, m->bb.wte, N, C);
    }
    for (int l = l0; l < NL; l++) {
        int f = model_fusion_after(m, l);
        float *in = m->x_layer_in + (size_t)l * NCs, *next = m->x_layer_in + (size_t)(l + 1) * NCs;
        float *dst = f >= 0 ? m->x_fuse_in + (size_t)f * m->maxB * m->maxT * C : next;
        if (!(l0 && l == l0))
            stack_layer_forward(&bc->dec, &m->bb.dec, &m->dec_acts, l, dst, in, B, T, m->rope_cos,
                                m->rope_sin, model_flash(m));
        if (f >= 0) {
            if (f == 0) prepare_memory(m, B, T, mem_mode); /* its input lies below: ready now */
            if (mem_mode == MEM_NONE) memcpy(next, dst, NCs * sizeof(float));
            else fusion_forward(m, f, next, dst);
        }
    }
    float *x_final = m->x_layer_in + (size_t)NL * NCs;
    rmsnorm_forward(m->lnf_out, m->lnf_rstd, x_final, m->bb.lnf, N, C, bc->dec.eps);
    double ce_sum;
    if (train) {
        m->grad_scale = grad_scale;
        vec_zero(m->d_x2, NCs);
        float *dhead = dc->enabled ? NULL : m->bb_grad.lm_head;
        ce_sum = lmhead_ce_soft_forward_backward(m->row_losses, m->row_top1, m->d_x2, dhead, m->lnf_out, m->bb.lm_head,
                                                 targets, N, C, V, grad_scale / denom, m->ce_scratch, m->soft);
    } else {
        ce_sum = lmhead_ce_forward_backward(m->row_losses, m->row_top1, NULL, NULL, m->lnf_out, m->bb.lm_head, targets, N, C, V,
                                            0.0f, m->ce_scratch);
    }
    model_set_losses(m, ce_sum, denom, train ? m->soft : NULL);
    return DFM_OK;
}

int model_forward(DfmModel *m, const int *inputs, const int *targets, const float *tgt_mem,
                  const uint8_t *tgt_mask, int B, int T, int mem_mode, int train, float grad_scale) {
    int rc = forward_impl(m, inputs, targets, tgt_mem, tgt_mask, B, T, mem_mode, train, grad_scale);
    m->prefix_fuse_in = m->prefix_pool = NULL; /* a frozen prefix serves one forward, whatever its outcome */
    m->soft = NULL;                            /* and so do soft targets */
    return rc;
}

void model_frozen_prefix_export(const DfmModel *m, int b, float *fuse_in, float *pool) {
    const DfmConfig *dc = &m->dc;
    int T = m->T, C = m->bc.dec.hidden;
    size_t NCs = (size_t)m->B * T * C, row = (size_t)b * T * C;
    memcpy(fuse_in, m->x_fuse_in + row, (size_t)T * C * sizeof(float));
    chunk_pool_forward(pool, m->x_layer_in + (size_t)dc->pred_input_layer * NCs + row, 1, T, dc->chunk_len,
                       dfm_pred_tail(dc), C);
}

void model_set_soft_targets(DfmModel *m, CeSoft *soft) { m->soft = soft; }

const float *model_backbone_states(DfmModel *m, const int *inputs, int B, int T, int n_layers) {
    const BackboneConfig *bc = &m->bc;
    int C = bc->dec.hidden, N = B * T;
    size_t NCs = (size_t)N * C;
    embedding_forward(m->x_layer_in, inputs, m->bb.wte, N, C);
    for (int l = 0; l < n_layers; l++)
        stack_layer_forward(&bc->dec, &m->bb.dec, &m->dec_acts, l, m->x_layer_in + (size_t)(l + 1) * NCs,
                            m->x_layer_in + (size_t)l * NCs, B, T, m->rope_cos, m->rope_sin, model_flash(m));
    return m->x_layer_in + (size_t)n_layers * NCs;
}

void model_backbone_forward(DfmModel *m, const int *inputs, int B, int T) {
    const BackboneConfig *bc = &m->bc;
    int NL = bc->dec.n_layers;
    const float *top = model_backbone_states(m, inputs, B, T, NL);
    rmsnorm_forward(m->lnf_out, m->lnf_rstd, top, m->bb.lnf, B * T, bc->dec.hidden, bc->dec.eps);
}

void model_set_frozen_prefix(DfmModel *m, const float *fuse_in, const float *pool) {
    m->prefix_fuse_in = fuse_in;
    m->prefix_pool = pool;
}

int model_backward(DfmModel *m) {
    const BackboneConfig *bc = &m->bc;
    const DfmConfig *dc = &m->dc;
    int B = m->B, T = m->T, N = B * T, C = bc->dec.hidden, NL = bc->dec.n_layers;
    size_t NCs = (size_t)N * C;
    int pretrain = !dc->enabled;
    BackboneParams *bg = pretrain ? &m->bb_grad : NULL;
    float *d = m->d_x, *other = m->d_x2;
    /* d_x2 holds d(loss)/d(lnf_out) from the forward */
    vec_zero(d, NCs);
    rmsnorm_backward(d, bg ? bg->lnf : NULL, m->d_x2, m->x_layer_in + (size_t)NL * NCs, m->bb.lnf, m->lnf_rstd, N,
                     C);
    int S = 0;
    if (dc->enabled) {
        S = B * (T / dc->chunk_len) * dc->n_slots;
        vec_zero(m->d_mem, (size_t)S * C);
    }
    int lowest = pretrain ? 0 : dc->fusion_layers[0];
    for (int l = NL - 1; l >= lowest; l--) {
        int f = model_fusion_after(m, l);
        if (f >= 0) {
            vec_zero(other, NCs);
            fusion_backward(m, f, other, d, m->x_fuse_in + (size_t)f * m->maxB * m->maxT * C);
            float *t = d;
            d = other;
            other = t;
            if (l == lowest) break; /* nothing trainable below the lowest fusion block */
        }
        vec_zero(other, NCs);
        stack_layer_backward(&bc->dec, &m->bb.dec, bg ? &bg->dec : NULL, &m->dec_acts, &m->dec_scr, l, other, d,
                             m->x_layer_in + (size_t)l * NCs, B, T, m->rope_cos, m->rope_sin,
                             model_flash(m));
        float *t = d;
        d = other;
        other = t;
    }
    if (pretrain) {
        embedding_backward(bg->wte, d, m->inputs, N, C);
        return DFM_OK;
    }
    /* memory path: projector, MSE, predictor */
    vec_zero(m->d_slots, (size_t)S * dc->d_mem);
    projector_backward(m, S);
    /* a chunk that fused its target passes nothing to the predictor through the projector */
    size_t Kd = (size_t)dc->n_slots * dc->d_mem;
    for (int i = 0; i < B * (T / dc->chunk_len); i++)
        if (m->mem_src[i]) vec_zero(m->d_slots + i * Kd, Kd);
    if (m->have_targets)
        mse_forward_backward(m->d_slots, m->slots, m->tgt_mem, m->tgt_mask, S, dc->d_mem,
                             (float)(dc->mse_weight * model_pred_loss_scale(dc) * m->grad_scale));
    predictor_backward(m, B, T);
    return DFM_OK;
}

void model_zero_grad(DfmModel *m) { vec_zero(m->grad_memory, m->grad_num); }

void model_logits_row(const DfmModel *m, int r, float *logits) {
    matmul_forward(logits, m->lnf_out + (size_t)r * m->bc.dec.hidden, m->bb.lm_head, NULL, 1, m->bc.dec.hidden,
                   m->bc.vocab_size);
}

float *model_trainable_params(DfmModel *m, size_t *n) {
    *n = m->grad_num;
    return m->dc.enabled ? m->dfm_memory : m->bb_memory;
}
float *model_trainable_grads(DfmModel *m) { return m->grad_memory; }

/* ---- named tensors ---------------------------------------------------------------------------------- */
static void view_set(TensorView *v, const char *name, float *data, int ndim, int64_t d0, int64_t d1) {
    snprintf(v->name, sizeof v->name, "%s", name);
    v->data = data;
    v->ndim = ndim;
    v->shape[0] = d0;
    v->shape[1] = d1;
    v->numel = ndim == 1 ? (size_t)d0 : (size_t)d0 * d1;
}

/* per-layer shapes of a stack's 11 tensors */
static void stack_shapes(const StackConfig *c, int64_t sh[STACK_NUM_TENSORS][2], int nd[STACK_NUM_TENSORS]) {
    int64_t C = c->hidden, nq = (int64_t)c->n_heads * c->head_dim, nk = (int64_t)c->n_kv_heads * c->head_dim,
            F = c->ffn, hd = c->head_dim;
    int64_t s[STACK_NUM_TENSORS][2] = {{C, 0}, {nq, C}, {nk, C}, {nk, C}, {hd, 0}, {hd, 0},
                                       {C, nq}, {C, 0}, {F, C}, {F, C}, {C, F}};
    for (int i = 0; i < STACK_NUM_TENSORS; i++) {
        sh[i][0] = s[i][0];
        sh[i][1] = s[i][1];
        nd[i] = s[i][1] ? 2 : 1;
    }
}

static int stack_views(const StackConfig *c, StackParams *p, const char *prefix, TensorView *views, int n) {
    int64_t sh[STACK_NUM_TENSORS][2];
    int nd[STACK_NUM_TENSORS];
    stack_shapes(c, sh, nd);
    float **ptrs[STACK_NUM_TENSORS];
    stack_param_ptrs(p, ptrs);
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < STACK_NUM_TENSORS; i++) {
            if ((i == 4 || i == 5) && !c->qk_norm) continue;
            if (views) {
                char name[96];
                snprintf(name, sizeof name, "%s.layers.%d.%s", prefix, l, stack_tensor_names[i]);
                size_t per = (size_t)sh[i][0] * (nd[i] == 2 ? sh[i][1] : 1);
                view_set(&views[n], name, *ptrs[i] ? *ptrs[i] + l * per : NULL, nd[i], sh[i][0], sh[i][1]);
            }
            n++;
        }
    return n;
}

int model_backbone_tensors(const DfmModel *m, TensorView *views, int grads) {
    const BackboneConfig *bc = &m->bc;
    BackboneParams p = grads ? m->bb_grad : m->bb;
    if (grads && m->dc.enabled) memset(&p, 0, sizeof p); /* frozen: no gradients */
    int64_t V = bc->vocab_size, C = bc->dec.hidden;
    int n = 0;
    if (views) view_set(&views[n], "model.embed_tokens.weight", p.wte, 2, V, C);
    n++;
    n = stack_views(&bc->dec, &p.dec, "model", views, n);
    if (views) view_set(&views[n], "model.norm.weight", p.lnf, 1, C, 0);
    n++;
    if (!bc->tie_embeddings) {
        if (views) view_set(&views[n], "lm_head.weight", p.lm_head, 2, V, C);
        n++;
    }
    return n;
}

int model_dfm_tensors(const DfmModel *m, TensorView *views, int grads) {
    if (!m->dc.enabled) return 0;
    const DfmConfig *dc = &m->dc;
    DfmParams p = grads ? m->dp_grad : m->dp;
    int64_t C = m->bc.dec.hidden, P = dc->pred.hidden, K = dc->n_slots, d = dc->d_mem, H = dc->proj_hidden,
            G = model_fusion_gates(m);
    int n = 0;
#define V1(name, ptr, a) (views ? view_set(&views[n], name, ptr, 1, a, 0) : (void)0, n++)
#define V2(name, ptr, a, b) (views ? view_set(&views[n], name, ptr, 2, a, b) : (void)0, n++)
    V2("dfm.predictor.in_proj.weight", p.pred_win, P, C);
    V1("dfm.predictor.in_proj.bias", p.pred_bin, P);
    V1("dfm.predictor.placeholder", p.pred_placeholder, P);
    n = stack_views(&dc->pred, &p.pred, "dfm.predictor", views, n);
    V1("dfm.predictor.norm.weight", p.pred_lnf, P);
    V2("dfm.predictor.out_proj.weight", p.pred_wout, K * d, P);
    V1("dfm.predictor.out_proj.bias", p.pred_bout, K * d);
    if (dc->pred_skip) V2("dfm.predictor.skip.weight", p.pred_wskip, K * d, C);
    V1("dfm.projector.norm.weight", p.proj_lnw, d);
    V1("dfm.projector.norm.bias", p.proj_lnb, d);
    V2("dfm.projector.fc1.weight", p.proj_w1, H, d);
    V1("dfm.projector.fc1.bias", p.proj_b1, H);
    V2("dfm.projector.fc2.weight", p.proj_w2, C, H);
    V1("dfm.projector.fc2.bias", p.proj_b2, C);
    for (int f = 0; f < dc->n_fusion; f++) {
        char nm[96];
#define FN(s) (snprintf(nm, sizeof nm, "dfm.fusion.%d.%s", f, s), nm)
        V1(FN("norm.weight"), p.fu_lnw + f * C, C);
        V2(FN("q_proj.weight"), p.fu_wq + f * C * C, C, C);
        V2(FN("k_proj.weight"), p.fu_wk + f * C * C, C, C);
        V2(FN("v_proj.weight"), p.fu_wv + f * C * C, C, C);
        V2(FN("o_proj.weight"), p.fu_wo + f * C * C, C, C);
        V2(FN("gate.weight"), p.fu_wg + f * G * C, G, C);
        V1(FN("gate.bias"), p.fu_bg + f * G, G);
#undef FN
    }
#undef V1
#undef V2
    return n;
}
