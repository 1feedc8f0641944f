/* ops.h — the trainer's kernels: pure functions over fp32 arrays with explicit sizes (llm.c style).
 *
 * Layout conventions (shared with the CUDA path, trainer/kernels/ops_cuda.cu, which keeps these names):
 *   - activations are row-major [N, C] with N = B*T rows;
 *   - a Linear weight is [OC, C] (Hugging Face / PyTorch order), out = inp @ W^T + bias;
 *   - every *_backward ACCUMULATES (+=) into its gradient outputs, so residual branches and shared
 *     weights need no extra adds; callers zero gradient buffers before a backward pass;
 *   - a NULL gradient pointer means "not needed" (frozen weights get NULL dweight).
 * Reductions use a fixed order (no atomics), so results do not depend on the thread count except
 * through BLAS, which is deterministic for a fixed thread count.
 */
#ifndef DFM_TRAINER_OPS_H
#define DFM_TRAINER_OPS_H

#include <stddef.h>
#include <stdint.h>

/* out[N,OC] = inp[N,C] @ weight[OC,C]^T (+ bias[OC] if not NULL), OpenBLAS sgemm. */
void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                    int OC);
/* out[N,OC] += inp[N,C] @ weight[OC,C]^T (a second path into the same output). */
void matmul_forward_acc(float *out, const float *inp, const float *weight, int N, int C, int OC);
/* dinp += dout @ W; dweight += dout^T @ inp; dbias += colsum(dout). Any output may be NULL. */
void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC);

/* out[t] = wte[tokens[t]] for t < N. */
void embedding_forward(float *out, const int *tokens, const float *wte, int N, int C);
void embedding_backward(float *dwte, const float *dout, const int *tokens, int N, int C);

/* RMSNorm over rows of C: out = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps). rstd[N] saved. */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps);
void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                      const float *rstd, int N, int C);

/* LayerNorm over rows of C with weight and bias; mean[N], rstd[N] saved. */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, int N, int C, float eps);
void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int N, int C);

/* Rotary tables for positions [0, T) and head size hd (HF "rotate_half" convention):
 * cos/sin are [T, hd/2], angle = pos * theta^(-2i/hd). */
void rope_tables(float *cos_t, float *sin_t, int T, int hd, float theta);
/* In-place-safe RoPE on x[B*T, nh*hd]; position of row r is r % T. */
void rope_forward(float *out, const float *inp, const float *cos_t, const float *sin_t, int B, int T, int nh,
                  int hd);
void rope_backward(float *dinp, const float *dout, const float *cos_t, const float *sin_t, int B, int T,
                   int nh, int hd);

/* Causal grouped-query self-attention. q[B*T, nh*hd], k,v[B*T, nkv*hd] (RoPE already applied);
 * att[B, nh, T, T] keeps the softmax probabilities (zero above the diagonal); out[B*T, nh*hd]. */
void attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                       int nh, int nkv, int hd);
/* datt is scratch [B, nh, T, T] (its causal blocks are overwritten, the rest is not read). dq, dk, dv
 * accumulate. */
void attention_backward(float *dq, float *dk, float *dv, float *datt, const float *dout, const float *att,
                        const float *q, const float *k, const float *v, int B, int T, int nh, int nkv, int hd);

/* SwiGLU: out = silu(gate) * up, elementwise over n. */
void swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);

/* Exact (erf) GELU, as torch.nn.GELU(). */
void gelu_forward(float *out, const float *inp, size_t n);
void gelu_backward(float *dinp, const float *dout, const float *inp, size_t n);

/* Chunk cross-attention: token row t = b*T + s attends to the K memory rows of chunk c = (s + shift) / L,
 * km/vm rows (b*NC + c)*K + j, with NC = T / L. shift = 0: the chunk the token sits in; shift = 1: the
 * chunk its next token (the one it predicts) sits in, so a chunk's last token already reads the next
 * chunk's memory (which depends only on earlier chunks), and the sequence's last token, whose chunk
 * would be NC, gets no update. 0 <= shift < L. Heads: nh of size hd (nh*hd = C). slot_mask[B*NC*K]
 * (1 = attend); a row with no unmasked slot gives out = 0 and p = 0 (no update).
 * p[B*T, nh, K] keeps probabilities. */
void crossattn_forward(float *out, float *p, const float *q, const float *km, const float *vm,
                       const uint8_t *slot_mask, int B, int T, int L, int shift, int K, int nh, int hd);
void crossattn_backward(float *dq, float *dkm, float *dvm, const float *dout, const float *p, const float *q,
                        const float *km, const float *vm, int B, int T, int L, int shift, int K, int nh, int hd);

/* Gated residual: out = h + g_expand * o, g[N, G] with G = 1 gate per head (G = nh, channel c uses
 * gate c / (C/G)) or per channel (G = C). gl is the gate pre-activation; g = sigmoid(gl). */
void gate_forward(float *out, float *g, const float *gl, const float *h, const float *o, int N, int C, int G);
/* dh += dout; do += dout * g; dgl += sum_{channels of gate} dout * o * g(1-g). */
void gate_backward(float *dh, float *dgl, float *d_o, const float *dout, const float *g, const float *o, int N,
                   int C, int G);

/* Mean over each chunk of L rows of h[B*T, C] (the input embeddings or a frozen layer's hidden states):
 * chunk i of sequence b gets the mean of chunk i-1's last `tail` rows (tail in [1, L]; L: the whole chunk,
 * 1: its last token alone); chunk 0 gets zeros (replaced by the learned placeholder). out[B*NC, C]. */
void chunk_pool_forward(float *out, const float *h, int B, int T, int L, int tail, int C);

/* Fused LM head + softmax cross-entropy over N rows without materialising [N, V] logits:
 * row losses[N] (may be NULL) = logsumexp(x W^T) - logit[target]; top1[N] (may be NULL) = 1 where the
 * target's logit is the row's largest (greedy decoding would emit it; ties count), else 0; a row whose
 * target is negative is ignored (loss 0, top1 0, no gradient: padding). If dx or dweight is non-NULL the
 * gradient of sum_r dloss * loss_r is accumulated into them. scratch is [rows_block * V] floats with
 * rows_block = CE_ROWS_BLOCK. Returns the sum of row losses (double). */
#define CE_ROWS_BLOCK 256
double lmhead_ce_forward_backward(float *losses, float *top1, float *dx, float *dweight, const float *x, const float *weight,
                                  const int *targets, int N, int C, int V, float dloss, float *scratch);

/* Soft targets beside the hard ones (dfm-train train --teacher: distillation and gain-weighted CE). Row r's
 * loss becomes  w_r · CE_r + weight · has_r · KL(p_r ‖ softmax_r)  where the teacher's distribution is known on
 * the row's S ids (distinct; p_i its probabilities, Σ p_i <= 1) and as one bucket for the rest of the vocabulary,
 * p_rest = 1 − Σ p_i:  KL = Σ_i p_i (log p_i − log q_i) + p_rest (log p_rest − log q_rest), q_rest = 1 − Σ_i q_i
 * (the top-S ids renormalised alone would push every other token's probability to 0). Gradient with respect to
 * the logits, times dloss: (w_r + λ)q − w_r·onehot(target) − λ·p on the teacher's ids, and λ·q·(1 − p_rest/q_rest)
 * on the others (λ = weight · has_r); q_rest below 1e-6 counts as 1e-6. losses[] and top1[] stay the plain CE and
 * top-1 of each row. */
#define CE_MAX_SOFT 256
typedef struct {
    const int *ids;       /* [N*S] the teacher's token ids of each row */
    const float *p;       /* [N*S] their probabilities (the teacher's own: the rest of 1 is the tail bucket) */
    const uint8_t *has;   /* [N] 1 = the row has a teacher distribution */
    const float *row_w;   /* [N] the weight of each row's hard CE (NULL: 1) */
    int S;                /* ids per row, 1..CE_MAX_SOFT */
    float weight;         /* the KL's weight (0: the KL is computed and reported, not trained on) */
    double kl_sum;        /* out: Σ of KL over the rows with a teacher and a target */
    double wce_sum;       /* out: Σ of w_r · CE_r */
    long n_teacher;       /* out: rows with a teacher and a target */
} CeSoft;

/* lmhead_ce_forward_backward with soft targets (soft NULL: exactly the plain function). The returned sum
 * is the plain CE's; soft's outputs are set (summed in a fixed order: bit-reproducible). */
double lmhead_ce_soft_forward_backward(float *losses, float *top1, float *dx, float *dweight, const float *x,
                                       const float *weight, const int *targets, int N, int C, int V, float dloss,
                                       float *scratch, CeSoft *soft);

/* MSE over valid slots: pred, target [S, D], mask[S]. Returns sum over valid slots and dims of
 * (pred - target)^2 / (n_valid * D) (0 when none valid); dpred (may be NULL) += dloss * d/dpred. */
double mse_forward_backward(float *dpred, const float *pred, const float *target, const uint8_t *mask, int S,
                            int D, float dloss);

/* Small helpers. */
void vec_add(float *out, const float *a, const float *b, size_t n);
void vec_zero(float *x, size_t n);

#endif
