/* model.h — the DFM model: a frozen Llama/Qwen3 decoder plus the trainable DFM modules.
 *
 *   tokens ─► embed ─► layer 0 … layer f ─► [fusion f] ─► … ─► final RMSNorm ─► LM head ─► CE
 *                 │                              ▲
 *                 └► chunk mean-pool ─► predictor ─► slots [B,NC,K,d] ─► projector ─► M [B,NC,K,C]
 *                                                    └────────── MSE vs target slots
 *
 * - Predictor: input of chunk i is the mean of the frozen input embeddings (or, with pred_input_layer
 *   k > 0, of the frozen hidden states after layer k-1) of chunk i-1's tokens (its last pred_input_tokens
 *   tokens when that is set: 1 = the last token's state, which has read the whole context), projected C→P
 *   (Linear with bias); chunk 0 gets a learned placeholder [P]. A causal StackConfig
 *   over the NC chunk positions (RoPE by chunk index), final RMSNorm, Linear P→K·d with bias; with pred_skip,
 *   plus Linear C→K·d (no bias, zero at the start) of the pooled input itself.
 * - Projector (shared by all fusion blocks): LayerNorm(d) → Linear(d→H) → GELU(erf) → Linear(H→C).
 * - Fusion block after decoder layer f (0-based): x = RMSNorm(h); q = Wq x; k = Wk M; v = Wv M;
 *   token s attends (xattn_heads heads, no biases) to the K slots of chunk (s + 1) / L, the chunk of the
 *   token it predicts (mem_align = MEM_ALIGN_NEXT; the sequence's last token attends nothing), or of its
 *   own chunk s / L (MEM_ALIGN_SAME); o = Wo·attn;
 *   g = sigmoid(Wg h + bg) with G = xattn_heads (per head: channel c uses gate c / (C/G)) or G = C
 *   (per channel); h ← h + g ⊙ o. Wg starts at 0, bg at gate_bias. A chunk whose slots are all
 *   masked (chunk 0 unless fuse_first_chunk; padded target slots) gets no update.
 * - Loss = mean CE over the B·T next tokens that have a target (-1 = padding) + mse_weight · predictor loss,
 *   the squared error of predicted vs target slots summed over d and averaged over valid target slots
 *   (pred_loss = PRED_LOSS_MSE; PRED_LOSS_MSE_ELEM averages over the K·d elements instead). Chunk 0's
 *   target is absent: its mask is 0. The reported mse is always the per-element mean.
 * - Teacher forcing: a chunk may fuse its target slots instead of the predicted ones (MEM_TARGET, or per
 *   chunk with MEM_MIXED); no gradient reaches the predictor through such a chunk, only through the MSE.
 *
 * Pretraining mode (dfm.enabled = 0): no DFM modules, the backbone is trainable.
 * Parameters: backbone in one allocation (BackboneParams), DFM modules in another (DfmParams); the
 * trainable one has a same-shaped gradient block and AdamW state.
 */
#ifndef DFM_TRAINER_MODEL_H
#define DFM_TRAINER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/kernels/ops.h"
#include "trainer/kernels/stack.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DFM_MAX_FUSION 32
#define DFM_MAX_CENTRE 4096 /* the widest memory --centre-memory takes (d_mem) */
#define DFM_MAX_CENTRE 4096 /* the widest memory --centre-memory takes (d_mem) */

typedef struct {
    char arch[40];      /* "Qwen3ForCausalLM" or "LlamaForCausalLM" */
    int vocab_size;
    int max_seq;        /* longest T (RoPE table size) */
    int tie_embeddings;
    StackConfig dec;
} BackboneConfig;

typedef struct {
    int enabled;        /* 0: pretraining the backbone only */
    int chunk_len;      /* L */
    int n_slots;        /* K */
    int d_mem;          /* d, the encoder's dimension */
    StackConfig pred;   /* predictor Transformer (hidden P) */
    int proj_hidden;    /* projector's hidden width H */
    int n_fusion;
    int fusion_layers[DFM_MAX_FUSION]; /* ascending, 0-based decoder layer after which a block sits */
    int xattn_heads;
    int gate_per_channel; /* 0: one gate per head (default), 1: one per channel */
    float gate_bias;
    float mse_weight;
    int fuse_first_chunk; /* 1: chunk 0 also fuses its (placeholder-based) predicted memory */
    int pred_input_layer; /* predictor input pooled from: 0 = the input embeddings, k = the hidden state
                             after decoder layer k-1 (frozen: k <= fusion_layers[0]) */
    int pred_skip;        /* 1: a linear path from the predictor's pooled input straight to its slots (pred_wskip,
                             zero at the start) beside the Transformer: slots = out_proj(...) + Wskip · input;
                             out_proj then starts at zero too */
    int pred_input_tokens; /* the predictor input averages the previous chunk's last pred_input_tokens tokens
                              (1 .. chunk_len); 0 = the whole chunk (the default) */
    int mem_align;        /* which chunk's memory token s attends: MEM_ALIGN_NEXT (default) chunk (s+1)/L,
                             the chunk of the token it predicts; MEM_ALIGN_SAME chunk s/L (the old rule) */
    int fusion_memory;    /* the memory fusion trains on: FUSION_MEM_PREDICTED, _TARGET or _MIXED (teacher
                             forcing: each chunk takes its target with probability tf_prob) */
    float tf_prob;        /* FUSION_MEM_MIXED: the probability at step 0 */
    int tf_decay;         /* FUSION_MEM_MIXED: 1 = tf_prob decays linearly to 0 at the last step */
    int pred_loss;        /* PRED_LOSS_MSE (default): squared error summed over d, mean over valid slots;
                             PRED_LOSS_MSE_ELEM: mean over the K*d elements of valid slots (~1/d smaller) */
    float init_std;       /* std of the predictor's initial matrices (projector, fusion: 1/sqrt(fan_in)) */
    int content_only;     /* 1: no bias path around the memory: the projector's LayerNorm, fc1 and fc2 biases are
                             held at 0 (zeroed at set-up, never given a gradient), so a zero memory slot projects
                             to 0 and adds exactly nothing; the fusion's update comes from memory content alone */
    int n_centre;         /* d_mem, or 0 (off): every slot enters the projector minus mem_centre (the training
                             targets' mean slot), so what all memories share is not a constant the fusion can use;
                             with content_only a slot equal to the centre then adds exactly nothing */
    float mem_centre[DFM_MAX_CENTRE];
} DfmConfig;

typedef struct {
    float *wte;     /* [V, C]   model.embed_tokens.weight */
    StackParams dec;
    float *lnf;     /* [C]      model.norm.weight */
    float *lm_head; /* [V, C]   lm_head.weight (== wte when tied; not allocated separately) */
} BackboneParams;

#define DFM_NUM_TENSORS (7 + STACK_NUM_TENSORS + 6 + 7)
typedef struct {
    /* predictor */
    float *pred_win, *pred_bin, *pred_placeholder; /* [P,C], [P], [P] */
    StackParams pred;
    float *pred_lnf;                               /* [P] */
    float *pred_wout, *pred_bout;                  /* [K*d, P], [K*d] */
    float *pred_wskip;                             /* [K*d, C] with pred_skip, else NULL */
    /* projector */
    float *proj_lnw, *proj_lnb;                    /* [d], [d] */
    float *proj_w1, *proj_b1, *proj_w2, *proj_b2;  /* [H,d], [H], [C,H], [C] */
    /* fusion blocks, slabs over NF */
    float *fu_lnw;                                 /* [NF, C] */
    float *fu_wq, *fu_wk, *fu_wv, *fu_wo;          /* [NF, C, C] */
    float *fu_wg, *fu_bg;                          /* [NF, G, C], [NF, G] */
} DfmParams;

/* Memory a forward fuses: none (fusion off), predicted, target, or per chunk (MEM_MIXED: the sources set
 * by model_set_memory_mix). */
enum { MEM_NONE = 0, MEM_PREDICTED = 1, MEM_TARGET = 2, MEM_MIXED = 3 };
enum { FUSION_MEM_PREDICTED = 0, FUSION_MEM_TARGET = 1, FUSION_MEM_MIXED = 2 };
enum { PRED_LOSS_MSE_ELEM = 0, PRED_LOSS_MSE = 1 };
/* DfmConfig.mem_align; the value is the row shift crossattn_forward takes */
enum { MEM_ALIGN_SAME = 0, MEM_ALIGN_NEXT = 1 };

/* A named view of one parameter tensor (for safetensors, checkpoints, debug dumps). */
typedef struct {
    char name[96];
    float *data;
    int ndim;
    int64_t shape[4];
    size_t numel;
} TensorView;

/* How many of the previous chunk's last tokens the predictor's input averages (chunk_pool_forward's tail). */
static inline int dfm_pred_tail(const DfmConfig *dc) {
    return dc->pred_input_tokens > 0 ? dc->pred_input_tokens : dc->chunk_len;
}

typedef struct DfmModel DfmModel;

struct DfmModel {
    BackboneConfig bc;
    DfmConfig dc;
    /* parameters */
    float *bb_memory; size_t bb_num; BackboneParams bb;
    float *dfm_memory; size_t dfm_num; DfmParams dp;
    /* gradients of the trainable block (backbone when pretraining, DFM modules otherwise) */
    float *grad_memory; size_t grad_num;
    BackboneParams bb_grad; DfmParams dp_grad;
    /* activations, sized for (maxB, maxT) */
    int maxB, maxT, B, T;
    float *act_memory; size_t act_num;
    /* CPU flash attention (attention_flash_cpu_supported for the decoder's and the predictor's head size):
     * its per-thread scratch, or flash.buf NULL (the [B, nh, T, T] probabilities are kept) */
    AttnFlashScratch flash;
    float *rope_cos, *rope_sin;             /* [maxT, hd/2] decoder */
    float *prope_cos, *prope_sin;           /* [NC, hdp/2] predictor */
    int *inputs, *targets;                  /* [B*T] */
    float *raw_inputs, *raw_targets, *raw_slot_mask, *raw_tgt_mask; /* their storage in the float block */
    float *x_layer_in;                      /* [NL, N, C] input of decoder layer l */
    float *x_fuse_in;                       /* [NF, N, C] input of fusion block f */
    float *x_final;                         /* [N, C] input of the final norm */
    float *lnf_out, *lnf_rstd;              /* [N, C], [N] */
    float *row_losses;                      /* [N] */
    float *row_top1;                        /* [N] 1: the target is the row's argmax (0 for padding) */
    float *tmp;                             /* [N, C] scratch of the CUDA stack (stack_cuda.cu) */
    float *ce_scratch;                      /* [CE_ROWS_BLOCK, V] */
    StackActs dec_acts;
    StackScratch dec_scr;
    /* DFM activations */
    float *pool;                            /* [B*NC, C] */
    float *pred_in;                         /* [B*NC, P] input of predictor layer 0 */
    float *pred_x;                          /* [NLp, B*NC, P] input of predictor layer l (l>0) / buffer */
    float *pred_out;                        /* [B*NC, P] output of last predictor layer */
    float *pred_ln, *pred_rstd;             /* [B*NC, P], [B*NC] */
    float *pred_tmp;                        /* [B*NC, P] scratch of the CUDA stack */
    float *slots;                           /* [B*NC*K, d] predicted memory */
    StackActs pred_acts;
    StackScratch pred_scr;
    float *mem_in;                          /* [B*NC*K, d] memory fed to the projector (pred or target) */
    float *pj_ln, *pj_mean, *pj_rstd;       /* [S,d], [S], [S] with S = B*NC*K */
    float *pj_h, *pj_a;                     /* [S,H] pre-/post-GELU */
    float *mem;                             /* [S, C] projected memory M */
    uint8_t *slot_mask;                     /* [S] attended slots in the current forward */
    uint8_t *tgt_mask;                      /* [S] valid target slots */
    uint8_t *mem_src;                       /* [B*NC] 1 = the chunk fused its target memory (last forward) */
    uint8_t *mix_src;                       /* [maxB*NC] the sources of the next MEM_MIXED forward */
    float *tgt_mem;                         /* [S, d] */
    float *fu_xn, *fu_rstd, *fu_q, *fu_km, *fu_vm, *fu_p, *fu_y, *fu_o, *fu_gl, *fu_g;
    /* backward buffers */
    float *d_x, *d_x2;                      /* [N, C] ping-pong residual gradient */
    float *d_mem;                           /* [S, C] */
    float *d_pj_a, *d_pj_h, *d_pj_ln;       /* [S,H], [S,H], [S,d] */
    float *d_slots;                         /* [S, d] */
    float *d_fu_a, *d_fu_b, *d_fu_c, *d_fu_kv, *d_fu_kv2, *d_fu_gl; /* fusion scratch */
    float *d_pred_a, *d_pred_b, *d_pred_c;  /* [B*NC, P] */
    /* results of the last forward */
    int mem_mode;
    double ce, mse, cos, loss;
    int n_valid;                            /* positions with a target in the last forward */
    int have_targets;
    double grad_scale;                      /* set by forward(train=1) */
    /* model_set_frozen_prefix: the next forward starts at the first fusion layer from these (host) */
    const float *prefix_fuse_in;            /* [B*T, C] */
    const float *prefix_pool;               /* [B*NC, C] */
    /* model_set_soft_targets: the next training forward's soft targets (host; used once), and what the last
     * training forward that had them measured */
    CeSoft *soft;
    double kl;                              /* mean KL(teacher ‖ model) over its rows with a teacher */
    long n_teacher;                         /* those rows */
};

/* Sensible small defaults for the DFM modules given a backbone (fusion layers scaled to the depth,
 * predictor 2 layers of width min(C,256), K=16, d=384, L=32). */
void dfm_config_defaults(DfmConfig *dc, const BackboneConfig *bc);

/* Check a configuration (divisibility, ranges); DFM_EARG with a hint. */
int model_config_check(const BackboneConfig *bc, const DfmConfig *dc);

/* Allocate parameters, gradients (for the trainable block) and activations for batches up to
 * maxB x maxT. Parameters are zero; call model_init_random or load weights. */
int model_create(const BackboneConfig *bc, const DfmConfig *dc, int maxB, int maxT, DfmModel **out);
/* Whether a batch of B sequences of T tokens fits activations sized for maxB x maxT (CPU and CUDA alike): T at most
 * maxT (the RoPE tables), B x T tokens at most maxB x maxT, and whole chunks in DFM mode. Every activation is sized
 * by tokens (B T), chunks (B T / L) or attention scores (B T T, B (T/L)^2), each of which then fits too: so a model
 * made for DFM batches of B x T also runs reading batches of (B T / 2L) x 2L (trainer/run/reconstruct_mix.h). */
static inline int model_batch_fits(const DfmModel *m, int B, int T) {
    return B > 0 && T > 0 && T <= m->maxT && (size_t)B * (size_t)T <= (size_t)m->maxB * (size_t)m->maxT &&
           (!m->dc.enabled || T % m->dc.chunk_len == 0);
}
/* the CPU flash attention's scratch for stack_layer_forward / _backward, or NULL (probabilities kept) */
static inline const AttnFlashScratch *model_flash(const DfmModel *m) { return m->flash.buf ? &m->flash : NULL; }
/* As model_create; host_acts = 0 allocates no host activations (only the RoPE tables): for a model that
 * computes on a GPU (model_cuda.h), whose host side only holds parameters. model_forward is then invalid. */
int model_create_ex(const BackboneConfig *bc, const DfmConfig *dc, int maxB, int maxT, int host_acts,
                    DfmModel **out);
void model_free(DfmModel *m);

/* Layouts, shared with the CUDA model (trainer/model/model_cuda.cu), which carves the same structs out of
 * device allocations: each carves its tensors consecutively from base (NULL: only counts) and returns
 * the element count. model_carve_acts sets every activation pointer of m (sized for m->maxB x m->maxT
 * with m->bc / m->dc set) with a CE scratch of ce_rows x V floats; flash = 1 sizes the attention
 * buffers for flash attention: StackActs.att is the log-sum-exp [NL, B, nh, T], StackScratch.datt
 * [B, nh, T]. */
size_t model_carve_backbone(const BackboneConfig *bc, BackboneParams *p, float *base);
size_t model_carve_dfm(const BackboneConfig *bc, const DfmConfig *dc, DfmParams *p, float *base);
size_t model_carve_acts(DfmModel *m, float *base, int ce_rows, int flash);

/* Fusion block f's weights (in p: parameters or gradients) and activation slabs (in m); with a
 * device model the views are device pointers. */
typedef struct {
    float *lnw, *wq, *wk, *wv, *wo, *wg, *bg;
    float *xn, *rstd, *q, *km, *vm, *p, *y, *o, *gl, *g;
} FusionView;
FusionView model_fusion_view(const DfmModel *m, const DfmParams *p, int f);
/* Gates per fusion block (xattn heads or C); the fusion block after decoder layer l, or -1. */
int model_fusion_gates(const DfmModel *m);
int model_fusion_after(const DfmModel *m, int l);

/* Deterministic initialisation from seed: backbone (when random) and DFM modules (normal matrices: the
 * predictor's of std init_std, the projector's and fusion's of std 1/sqrt(fan_in); unit norms, zero
 * biases, gate weight 0 and bias gate_bias). */
void model_init_backbone_random(DfmModel *m, uint64_t seed);
void model_init_dfm_random(DfmModel *m, uint64_t seed);
/* DfmConfig.content_only: zero the projector's biases (LayerNorm, fc1, fc2) of the host parameters; returns
 * how many of them were not zero (0 when content_only is off: nothing is touched). */
size_t model_content_only_apply(DfmModel *m);

/* Forward over B x T tokens (T a multiple of L when DFM is on). targets[B*T] are next tokens; -1
 * marks a position without a target (padding), left out of the CE and its mean.
 * mem_mode: MEM_PREDICTED, MEM_TARGET or MEM_MIXED (tgt_mem required) or MEM_NONE (fusion off).
 * tgt_mem [B*NC*K*d] / tgt_mask [B*NC*K] may be NULL (then MSE is not computed).
 * train = 1 (any mode but MEM_NONE, or pretraining) also computes the LM-head part of the backward, scaled
 * by grad_scale (1/accumulation steps); model_backward then finishes it. Sets m->ce/mse/cos/loss. */
int model_forward(DfmModel *m, const int *inputs, const int *targets, const float *tgt_mem,
                  const uint8_t *tgt_mask, int B, int T, int mem_mode, int train, float grad_scale);
/* The frozen prefix of a DFM forward: decoder layers 0..f0 (f0 = fusion_layers[0]), whose output is fusion
 * block 0's input, and the chunk means the predictor reads (of the input embeddings or of layer
 * pred_input_layer-1's output). Both depend on the tokens alone and nothing below f0 runs backward, so a
 * training loop may keep them per sequence and start later forwards at f0 (trainer/data/frozen_cache.h).
 * model_frozen_prefix_export copies batch row b's prefix of the last forward into fuse_in [T*C] and pool
 * [NC*C] (the same values the forward computed, bit for bit). model_set_frozen_prefix makes the next
 * model_forward (DFM mode, the batch's B rows) take the prefix from fuse_in [B*T*C] and pool [B*NC*C]
 * instead of computing it; the pointers are used once. The CUDA model has no prefix path. */
void model_frozen_prefix_export(const DfmModel *m, int b, float *fuse_in, float *pool);
/* Soft targets for the next training forward (trainer/kernels/ops.h CeSoft, rows = the batch's B*T positions;
 * used once, like the frozen prefix). That forward's loss becomes (Σ w_r·CE_r + weight·Σ KL_r) / (rows with a
 * target) plus the predictor's term; m->ce stays the plain CE, m->kl and m->n_teacher are set. soft's arrays
 * stay the caller's and must live until the forward returns. The CUDA model reads them from its host model
 * (model_forward_cuda: copied to the device for that forward, outputs set here as well, reset after it). */
void model_set_soft_targets(DfmModel *m, CeSoft *soft);
/* The backbone alone over B sequences of T tokens (no fusion, no LM head, nothing kept for a backward):
 * m->lnf_out [B*T, C] holds the final-normed hidden states the LM head reads. */
void model_backbone_forward(DfmModel *m, const int *inputs, int B, int T);
/* The residual stream after the first n_layers decoder blocks (0 <= n_layers <= n_layers of the backbone; 0: the
 * token embeddings) over B sequences of T tokens, nothing kept for a backward: [B*T, C] inside m's activations,
 * valid until the next forward (the memory slots in the LM's own space, trainer/data/lm_slots.h). */
const float *model_backbone_states(DfmModel *m, const int *inputs, int B, int T, int n_layers);
void model_set_frozen_prefix(DfmModel *m, const float *fuse_in, const float *pool);

/* Teacher forcing. model_memory_mix_draw fills src[B*NC] (1 = the chunk fuses its target memory) with
 * independent draws of probability p, a pure function of (seed, seq[b], chunk): the same sequence gets
 * the same draws whatever its batch row or rank. model_set_memory_mix stores src[n] (n = B*NC of the forwards
 * to come) for the next MEM_MIXED forwards (the CUDA model reads it from its host model too). model_memory_sources gives
 * the sources of a forward of mode mem_mode into m->mem_src and returns how many chunks take targets. */
void model_memory_mix_draw(uint8_t *src, const size_t *seq, int B, int NC, double p, uint64_t seed);
int model_set_memory_mix(DfmModel *m, const uint8_t *src, int n);
int model_memory_sources(DfmModel *m, int B, int NC, int mem_mode);
/* The weight of the per-element MSE in the predictor loss: d_mem (PRED_LOSS_MSE) or 1. */
double model_pred_loss_scale(const DfmConfig *dc);
/* A forward's loss terms from its LM head's sums: m->ce = ce_sum / denom (denom: the rows with a target) and
 * m->loss, that CE (with soft targets, the training forward's: (wce_sum + weight * kl_sum) / denom) plus the
 * predictor's term from m->mse; with soft also m->kl and m->n_teacher. model_forward's and the CUDA model's. */
void model_set_losses(DfmModel *m, double ce_sum, int denom, const CeSoft *soft);
/* Per-position CE: adds row_losses[B*T] of rows with a target to sum[j] / count[j], j = the position of the
 * predicted token inside its chunk ((s + 1) % L for row s; j = 0 is a chunk's first token). */
void model_ce_by_position(const float *row_losses, const int *targets, int B, int T, int L, double *sum,
                          long *count);

/* Accumulate the gradients of the last train forward into the gradient block. */
int model_backward(DfmModel *m);
void model_zero_grad(DfmModel *m);

/* Logits [V] of row r of the last forward (after final norm). */
void model_logits_row(const DfmModel *m, int r, float *logits);

/* Named tensor lists. Backbone names are Hugging Face's (model.layers.3.self_attn.q_proj.weight);
 * DFM names start with "dfm.". Returns the count; views may be NULL to count. grads = 1 gives the
 * gradient tensors of the trainable block instead (same names). */
int model_backbone_tensors(const DfmModel *m, TensorView *views, int grads);
int model_dfm_tensors(const DfmModel *m, TensorView *views, int grads);

/* The trainable block: pointer/size of parameters and gradients. */
float *model_trainable_params(DfmModel *m, size_t *n);
float *model_trainable_grads(DfmModel *m);

#ifdef __cplusplus
}
#endif

#endif
