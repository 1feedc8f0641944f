/* stack.h — a stack of Llama/Qwen3 decoder layers, used twice: as the frozen backbone's layers and
 * as the DFM memory predictor (a small causal Transformer over chunks).
 *
 * One layer:  a = x + Wo · Attn(RoPE(QKNorm(Wq·n1)), RoPE(QKNorm(Wk·n1)), Wv·n1),  n1 = RMSNorm(x)
 *             y = a + Wdown · (silu(Wgate·n2) * (Wup·n2)),                         n2 = RMSNorm(a)
 * with grouped-query heads (n_kv_heads divides n_heads), no biases, optional per-head RMSNorm of q
 * and k over head_dim (Qwen3), RoPE in the Hugging Face rotate_half convention.
 *
 * Parameters of all layers live in one StackParams whose tensors are [n_layers, ...] slabs carved
 * from the caller's single allocation (llm.c's ParameterTensors); activations likewise.
 */
#ifndef DFM_TRAINER_STACK_H
#define DFM_TRAINER_STACK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "trainer/kernels/attention_cpu.h" /* AttnFlashScratch */

typedef struct {
    int n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn;
    int qk_norm;       /* 1: Qwen3 per-head q_norm / k_norm */
    float eps;         /* RMSNorm epsilon */
    float rope_theta;
} StackConfig;

#define STACK_NUM_TENSORS 11
typedef struct {
    float *ln1w;  /* [NL, C]            input_layernorm */
    float *wq;    /* [NL, nh*hd, C]     q_proj */
    float *wk;    /* [NL, nkv*hd, C]    k_proj */
    float *wv;    /* [NL, nkv*hd, C]    v_proj */
    float *qnorm; /* [NL, hd]           q_norm (empty without qk_norm) */
    float *knorm; /* [NL, hd]           k_norm */
    float *wo;    /* [NL, C, nh*hd]     o_proj */
    float *ln2w;  /* [NL, C]            post_attention_layernorm */
    float *wgate; /* [NL, F, C]         gate_proj */
    float *wup;   /* [NL, F, C]         up_proj */
    float *wdown; /* [NL, C, F]         down_proj */
} StackParams;

/* Element counts of the 11 tensors (whole stack). */
void stack_param_sizes(const StackConfig *c, size_t sizes[STACK_NUM_TENSORS]);
/* The 11 tensor pointers as an array (for carving and for generic loops). */
void stack_param_ptrs(StackParams *p, float **ptrs[STACK_NUM_TENSORS]);
/* Hugging Face names of the per-layer tensors, e.g. "self_attn.q_proj.weight". */
extern const char *const stack_tensor_names[STACK_NUM_TENSORS];

#define STACK_NUM_ACTS 17
typedef struct {
    float *ln1, *ln1_rstd; /* [NL,N,C], [NL,N] */
    float *q, *k, *v;      /* raw projections [NL,N,nq], [NL,N,nk], [NL,N,nk] */
    float *q_rstd, *k_rstd;/* [NL,N*nh], [NL,N*nkv] (qk_norm) */
    float *qr, *kr;        /* after QK-norm and RoPE */
    float *att;            /* [NL,B,nh,T,T] softmax probabilities */
    float *atty;           /* [NL,N,nq] */
    float *res_mid;        /* [NL,N,C] x + attention */
    float *ln2, *ln2_rstd; /* [NL,N,C], [NL,N] */
    float *hg, *hu, *hact; /* [NL,N,F] */
} StackActs;

/* Scratch for one layer's backward (reused across layers). */
#define STACK_NUM_SCRATCH 12
typedef struct {
    float *d_res_mid, *d_ln;  /* [N,C] */
    float *d_hact, *d_hg, *d_hu; /* [N,F] */
    float *d_atty, *d_qr, *d_qn; /* [N,nq] */
    float *d_kr, *d_kn, *d_v;    /* [N,nk] */
    float *datt;                 /* [B,nh,T,T] */
} StackScratch;

void stack_act_sizes(const StackConfig *c, int B, int T, size_t sizes[STACK_NUM_ACTS]);
void stack_act_ptrs(StackActs *a, float **ptrs[STACK_NUM_ACTS]);
void stack_scratch_sizes(const StackConfig *c, int B, int T, size_t sizes[STACK_NUM_SCRATCH]);
void stack_scratch_ptrs(StackScratch *s, float **ptrs[STACK_NUM_SCRATCH]);

/* Layer l forward: out[N,C] from inp[N,C] (out may not alias inp). cos_t/sin_t from rope_tables(T, head_dim).
 * fs non-NULL: flash attention (attention_flash_forward, trainer/kernels/ops.h) with that scratch, and StackActs.att
 * is the log-sum-exp [NL, B, nh, T] (model_carve_acts(..., flash = 1)); NULL: att keeps the probabilities. */
void stack_layer_forward(const StackConfig *c, const StackParams *p, StackActs *a, int l, float *out,
                         const float *inp, int B, int T, const float *cos_t, const float *sin_t,
                         const AttnFlashScratch *fs);
/* Layer l backward: din += d(loss)/d(inp) given dout. g may be NULL (frozen: no weight gradients). */
void stack_layer_backward(const StackConfig *c, const StackParams *p, StackParams *g, const StackActs *a,
                          StackScratch *s, int l, float *din, const float *dout, const float *inp, int B, int T,
                          const float *cos_t, const float *sin_t, const AttnFlashScratch *fs);

/* Carve n tensors of sizes[] out of base (consecutive); returns the total count. base may be NULL
 * (only counts). */
size_t carve_floats(float *base, float **ptrs[], const size_t sizes[], int n);

#ifdef __cplusplus
}
#endif

#endif
