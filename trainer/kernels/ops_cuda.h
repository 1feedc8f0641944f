/* ops_cuda.h — the trainer's kernels on NVIDIA GPUs, one per CPU kernel of trainer/kernels/ops.h.
 *
 * Same names with a `_cuda` suffix, same argument order, same layouts and the same ACCUMULATE (+=)
 * convention for every *_backward; a NULL gradient pointer still means "not needed". Differences:
 *   - every pointer is DEVICE memory, except the AdamWConfig, the CeSoft struct (its arrays are device
 *     memory) and the host `double *` results;
 *   - every function returns DFM_OK or DFM_ECUDA (common/error.h) with a message naming
 *     the failing call and its file:line; nothing exits;
 *   - the last argument is the stream (cudaStream_t), or an OpsCudaContext for anything that calls
 *     cuBLAS (matmul, the fused LM head + CE) or that needs a result on the host;
 *   - reductions are in fp32 (the CPU sums some in double) and in a fixed order: no atomics, so a
 *     kernel gives bit-identical results run to run on the same GPU.
 * Matmuls use cublasGemmEx: fp32 (CUBLAS_COMPUTE_32F, no TF32) or, with ctx->bf16, operands rounded to
 * bf16 in a scratch buffer and fp32 accumulation, fp32 output.
 * Status: compiled in CI (make CUDA=1) and checked against trainer/kernels/ops.c by tests/cuda/ops_cuda_check.cu,
 * in CI through a host emulation of CUDA (tests/cuda/host_emu_cuda.h), on a GPU machine with
 * tests/gpu/gpu_check_trainer.sh, which has not been run yet (trainer/README.md, "CUDA path").
 */
#ifndef DFM_TRAINER_OPS_CUDA_H
#define DFM_TRAINER_OPS_CUDA_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "trainer/kernels/adamw.h" /* AdamWConfig; C linkage for C++ includers */
#include "trainer/kernels/ops.h"   /* CeSoft, CE_MAX_SOFT */

/* One per GPU stream of work: the cuBLAS handle bound to `stream`, the matmul precision and a scratch
 * buffer for bf16 copies of matmul operands (grown on demand, stream-ordered). */
typedef struct {
    cublasHandle_t cublas;
    cudaStream_t stream;
    int bf16;             /* 0: fp32 GEMMs; 1: bf16 operands, fp32 accumulation and output */
    void *scratch;        /* device, scratch_bytes */
    size_t scratch_bytes;
    const float *mirror_src;  /* a bf16 mirror of fp32 weights (ops_cuda_set_bf16_mirror), or NULL */
    const uint16_t *mirror16;
    size_t mirror_n;
} OpsCudaContext;

/* Select `device`, create a stream and a cuBLAS handle. bf16 as above. On failure ctx is left freed. */
int ops_cuda_init(OpsCudaContext *ctx, int device, int bf16);
/* Release everything; a zeroed or NULL ctx is a no-op. */
void ops_cuda_free(OpsCudaContext *ctx);

/* A bf16 copy `mirror` of the fp32 block [src, src + n) (the trainable weights): while it is set, a bf16
 * GEMM operand lying inside the block is read from the mirror instead of being rounded again into the
 * scratch buffer (the same values: both round to nearest even). The caller refreshes the mirror with
 * to_bf16_cuda(mirror, src, n) whenever the block changes (after each optimizer step). src NULL clears it. */
void ops_cuda_set_bf16_mirror(OpsCudaContext *ctx, const float *src, const uint16_t *mirror, size_t n);

/* out[N,OC] = inp[N,C] @ weight[OC,C]^T (+ bias[OC] if not NULL). */
/* out += inp @ weight^T (as matmul_forward_acc). */
int matmul_forward_acc_cuda(float *out, const float *inp, const float *weight, int N, int C, int OC,
                            OpsCudaContext *ctx);
int matmul_forward_cuda(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                        int OC, OpsCudaContext *ctx);
/* dinp += dout @ W; dweight += dout^T @ inp; dbias += colsum(dout). Any output may be NULL. */
int matmul_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                         const float *weight, int N, int C, int OC, OpsCudaContext *ctx);

/* out[t] = wte[tokens[t]]. The backward groups rows by token (a stable sort on the host, which synchronises
 * `stream`) and adds each token's rows in row order: bit-identical to embedding_backward, no atomics. */
int embedding_forward_cuda(float *out, const int *tokens, const float *wte, int N, int C, cudaStream_t stream);
int embedding_backward_cuda(float *dwte, const float *dout, const int *tokens, int N, int C, cudaStream_t stream);

/* RMSNorm over rows of C, rstd[N] saved (as rmsnorm_forward). */
int rmsnorm_forward_cuda(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps,
                         cudaStream_t stream);
int rmsnorm_backward_cuda(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                          const float *rstd, int N, int C, cudaStream_t stream);

/* LayerNorm with weight and bias, mean[N] and rstd[N] saved (as layernorm_forward). */
int layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, int N, int C, float eps, cudaStream_t stream);
int layernorm_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const float *mean, const float *rstd, int N, int C,
                            cudaStream_t stream);

/* RoPE tables [T, hd/2] (HF rotate_half; fp32 angle as rope_tables) and the rotation of x[B*T, nh*hd]. */
int rope_tables_cuda(float *cos_t, float *sin_t, int T, int hd, float theta, cudaStream_t stream);
int rope_forward_cuda(float *out, const float *inp, const float *cos_t, const float *sin_t, int B, int T, int nh,
                      int hd, cudaStream_t stream);
int rope_backward_cuda(float *dinp, const float *dout, const float *cos_t, const float *sin_t, int B, int T,
                       int nh, int hd, cudaStream_t stream);

/* Causal GQA self-attention, materialising att[B, nh, T, T] as the CPU does (zero above the diagonal):
 * the score, output and gradient products as strided-batched cuBLAS GEMMs (bf16 operands with ctx->bf16),
 * softmax kernels between them. datt is scratch [B, nh, T, T]; dq, dk, dv accumulate; a GQA group's heads
 * are added to dk/dv in a fixed order. For long T see attention_cuda.h (flash, no T x T matrix). */
int attention_forward_cuda(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                           int nh, int nkv, int hd, OpsCudaContext *ctx);
int attention_backward_cuda(float *dq, float *dk, float *dv, float *datt, const float *dout, const float *att,
                            const float *q, const float *k, const float *v, int B, int T, int nh, int nkv, int hd,
                            OpsCudaContext *ctx);

/* SwiGLU and exact (erf) GELU, elementwise over n. */
int swiglu_forward_cuda(float *out, const float *gate, const float *up, size_t n, cudaStream_t stream);
int swiglu_backward_cuda(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n,
                         cudaStream_t stream);
int gelu_forward_cuda(float *out, const float *inp, size_t n, cudaStream_t stream);
int gelu_backward_cuda(float *dinp, const float *dout, const float *inp, size_t n, cudaStream_t stream);

/* Chunk cross-attention (as crossattn_forward; slot_mask is device uint8). The backward allocates a
 * [B*T, nh, K] scratch with cudaMallocAsync on `stream`. */
int crossattn_forward_cuda(float *out, float *p, const float *q, const float *km, const float *vm,
                           const uint8_t *slot_mask, int B, int T, int L, int shift, int K, int nh, int hd,
                           cudaStream_t stream);
int crossattn_backward_cuda(float *dq, float *dkm, float *dvm, const float *dout, const float *p, const float *q,
                            const float *km, const float *vm, int B, int T, int L, int shift, int K, int nh, int hd,
                            cudaStream_t stream);

/* Gated residual (as gate_forward / gate_backward; dh may be NULL). */
int gate_forward_cuda(float *out, float *g, const float *gl, const float *h, const float *o, int N, int C, int G,
                      cudaStream_t stream);
int gate_backward_cuda(float *dh, float *dgl, float *d_o, const float *dout, const float *g, const float *o, int N,
                       int C, int G, cudaStream_t stream);

/* Chunk mean-pooling (as chunk_pool_forward). */
int chunk_pool_forward_cuda(float *out, const float *h, int B, int T, int L, int tail, int C, cudaStream_t stream);

/* Fused LM head + softmax CE over N rows, CE_ROWS_BLOCK_CUDA rows at a time (no [N, V] logits):
 * as lmhead_ce_forward_backward, with scratch [CE_ROWS_BLOCK_CUDA * V] floats on the device, losses[N]
 * and top1[N] (device, may be NULL) and the sum of row losses written to *total (host; summed in double in a fixed
 * order). Synchronises ctx->stream to return *total. */
#define CE_ROWS_BLOCK_CUDA 1024
int lmhead_ce_forward_backward_cuda(double *total, float *losses, float *top1, float *dx, float *dweight,
                                    const float *x, const float *weight, const int *targets, int N, int C, int V,
                                    float dloss, float *scratch, OpsCudaContext *ctx);
/* Soft targets beside the hard ones (as lmhead_ce_soft_forward_backward; soft NULL: exactly
 * lmhead_ce_forward_backward_cuda). soft is a host struct whose arrays ids [N*S], p [N*S], has [N] and row_w [N]
 * (or NULL) are DEVICE memory; S (1..CE_MAX_SOFT) and weight are read on the host, and its outputs kl_sum,
 * wce_sum and n_teacher are set on the host, each summed in double in a fixed order (bit-reproducible, not
 * the CPU's order). A row's teacher ids must be distinct and in [0, V): not checked here (an id out of range
 * writes outside the logits). *total stays the plain CE's sum; losses[] and top1[] the plain CE and top-1. */
int lmhead_ce_soft_forward_backward_cuda(double *total, float *losses, float *top1, float *dx, float *dweight,
                                         const float *x, const float *weight, const int *targets, int N, int C,
                                         int V, float dloss, float *scratch, CeSoft *soft, OpsCudaContext *ctx);

/* Frozen weights held in bf16 on the device (raw bf16 bits as uint16_t; a frozen backbone needs no fp32
 * copy, no gradient and no optimizer state). The same products as matmul_forward_cuda / the dinp part of
 * matmul_backward_cuda / embedding_forward_cuda / lmhead_ce_(soft_)forward_backward_cuda (dx only), with the
 * activation operand rounded to bf16, fp32 accumulation and fp32 outputs. to_bf16_cuda rounds n floats
 * to nearest even (the same rounding as schemas/half.h). */
int to_bf16_cuda(uint16_t *out, const float *in, size_t n, cudaStream_t stream);
int matmul_forward_w16_cuda(float *out, const float *inp, const uint16_t *weight, const float *bias, int N, int C,
                            int OC, OpsCudaContext *ctx);
int matmul_backward_w16_cuda(float *dinp, const float *dout, const uint16_t *weight, int N, int C, int OC,
                             OpsCudaContext *ctx);
int embedding_forward_w16_cuda(float *out, const int *tokens, const uint16_t *wte, int N, int C, cudaStream_t stream);
int lmhead_ce_forward_backward_w16_cuda(double *total, float *losses, float *top1, float *dx, const float *x,
                                        const uint16_t *weight, const int *targets, int N, int C, int V, float dloss,
                                        float *scratch, OpsCudaContext *ctx);
int lmhead_ce_soft_forward_backward_w16_cuda(double *total, float *losses, float *top1, float *dx, const float *x,
                                             const uint16_t *weight, const int *targets, int N, int C, int V,
                                             float dloss, float *scratch, CeSoft *soft, OpsCudaContext *ctx);

/* Masked MSE (as mse_forward_backward): *result (host) = sum over valid slots of (pred-target)^2 /
 * (n_valid * D); dpred (may be NULL) += dloss * gradient. Synchronises ctx->stream. */
int mse_forward_backward_cuda(double *result, float *dpred, const float *pred, const float *target,
                              const uint8_t *mask, int S, int D, float dloss, OpsCudaContext *ctx);

/* AdamW step (as adamw_update; c on the host, decay device uint8 or NULL), L2 norm (host result,
 * double, fixed order; synchronises) and scaling of a gradient block. */
int adamw_update_cuda(float *params, const float *grads, float *m, float *v, const unsigned char *decay, size_t n,
                      const AdamWConfig *c, long t, cudaStream_t stream);
int grad_norm_cuda(double *norm, const float *g, size_t n, OpsCudaContext *ctx);
int grad_scale_cuda(float *g, size_t n, float s, cudaStream_t stream);

int vec_add_cuda(float *out, const float *a, const float *b, size_t n, cudaStream_t stream);
int vec_zero_cuda(float *x, size_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
