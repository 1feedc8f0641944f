/* attention_cuda.h — flash-style causal grouped-query self-attention on NVIDIA GPUs: the same math as
 * attention_forward / attention_backward of trainer/kernels/ops.h, without the [B, nh, T, T] probability matrix.
 *
 * What it is: fp32 SIMT kernels (CUDA cores, no tensor cores), tiled with online softmax (FlashAttention-2
 * scheme). K/V (forward, dQ) or Q/dO (dK/dV) tiles are staged in static shared memory with coalesced
 * loads; each query (or key) row is owned by hd_max/32 consecutive threads that keep 32 of its dimensions
 * in registers (hd_max = 32, 64 or 128: the smallest of these >= hd; dimensions past hd are zero padding).
 * Memory: the forward saves only lse[B, nh, T] (log-sum-exp per query row) instead of att[B, nh, T, T],
 * and the backward's scratch is delta[B, nh, T] instead of datt[B, nh, T, T]: 2*T floats per (sequence,
 * head) in place of 2*T*T (at T = 4096: 32 KiB instead of 128 MiB); the probabilities are recomputed in the
 * backward from q, k and lse (the backward does about 3.5x the forward's multiply-adds: scores and dP are
 * computed by both of its kernels; the usual FlashAttention trade of arithmetic for memory).
 * Speed: bounded by shared-memory bandwidth and fp32 FMA throughput (about 4 FMAs per 16-byte shared
 * load); it should beat the materialising attention_forward_cuda at long T, and be several times slower
 * than a tensor-core (bf16/tf32 mma/wgmma) FlashAttention. Not measured: nothing here has run on a GPU.
 *
 * Conventions (as trainer/kernels/ops_cuda.h): every pointer is DEVICE memory; q is [B*T, nh*hd], k and v are
 * [B*T, nkv*hd] (RoPE already applied), rows b*T + t; query head h reads kv head h / (nh / nkv); the score
 * of query t and key u is (q_t . k_u) / sqrt(hd), causal (u <= t). Each function returns DFM_OK, or
 * DFM_EARG for sizes the kernels do not take (see attention_flash_supported), or DFM_ECUDA when a launch
 * fails (message with the call and file:line; nothing exits). Work is queued on `stream`; results are
 * ready after a stream or device synchronisation.
 * Determinism: no atomics. Every output element is written by one thread that sums in a fixed order
 * (dK/dV: group heads in order, then query rows in order; dQ: key rows in order), so the same inputs give
 * bit-identical results run to run on the same GPU. Results differ from trainer/kernels/ops.c in rounding only
 * (online vs two-pass softmax, other summation order): max|gpu-cpu| / max|cpu| about 1e-7..1e-6.
 * Status: compiled with nvcc (sm_90) and checked against trainer/kernels/ops.c by tests/cuda/attention_cuda_check.cu
 * through the host emulation of CUDA (tests/py/cuda/test_train_attention_emu.py); not yet run on a GPU.
 */
#ifndef DFM_TRAINER_ATTENTION_CUDA_H
#define DFM_TRAINER_ATTENTION_CUDA_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if the flash kernels take these sizes, else 0 (callers then use attention_forward_cuda /
 * attention_backward_cuda of trainer/kernels/ops_cuda.h). Supported: 1 <= hd <= 128 (any hd; 32, 64 and 128 waste
 * no work, others are padded up to the next of these) and T >= 1. nh % nkv == 0 is the caller's, as on
 * the CPU. */
int attention_flash_supported(int T, int hd);

/* Forward. out[B*T, nh*hd] = softmax(causal(q k^T / sqrt(hd))) v, per head, overwritten;
 * lse[B, nh, T] (index (b*nh + h)*T + t), overwritten, = log(sum_{u<=t} exp(score(t, u))) of the scaled
 * scores: the backward's input. nh % nkv == 0. out must not alias q, k, v. */
int attention_flash_forward_cuda(float *out, float *lse, const float *q, const float *k, const float *v, int B,
                                 int T, int nh, int nkv, int hd, cudaStream_t stream);

/* Backward from the forward's out and lse. dq[B*T, nh*hd], dk, dv[B*T, nkv*hd] ACCUMULATE (+=) like every
 * *_backward of trainer/kernels/ops.h (callers zero them first); all three are required (non-NULL).
 * delta is scratch [B, nh, T], overwritten with rowsum(dout * out) per query row. Two kernels: dq (which
 * also writes delta), then dk/dv (one block per (sequence, kv head, key tile), summing over the nh/nkv
 * query heads of its group). dq, dk, dv must not alias each other or the inputs. */
int attention_flash_backward_cuda(float *dq, float *dk, float *dv, float *delta, const float *dout,
                                  const float *out, const float *lse, const float *q, const float *k,
                                  const float *v, int B, int T, int nh, int nkv, int hd, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
