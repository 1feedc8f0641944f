/* attention_cpu.h — causal grouped-query self-attention on the CPU with AVX-512 FMA kernels, flash-style: it
 * keeps no [B, nh, T, T] matrix. Layouts and the score are ops.h's: q[B*T, nh*hd], k, v[B*T,
 * nkv*hd] (RoPE applied), query head h reads kv head h / (nh / nkv), causal, scaled by 1/sqrt(hd).
 * Results differ from the sgemm path in rounding only; each output element sums in one fixed order, so they
 * are reproducible on a machine whatever the thread count.
 */
#ifndef DFM_TRAINER_ATTENTION_CPU_H
#define DFM_TRAINER_ATTENTION_CPU_H

#include <stddef.h>

/* Flash-style: the math of attention_forward / attention_backward (trainer/kernels/ops.h) without the [B, nh, T, T]
 * matrices (as attention_flash_*_cuda, trainer/kernels/attention_cuda.h). AVX-512 FMA kernels over
 * blocks of 8 query rows; taken where attention_flash_cpu_supported(hd) (AVX-512F and hd a multiple of
 * 16; the callers use attention_forward / attention_backward otherwise). The forward writes out and
 * lse[B, nh, T] (log-sum-exp of each query row's scaled scores); the backward recomputes the probabilities
 * from q, k and lse, and dq, dk, dv accumulate. Scratch: fs->threads blocks of fs->per_thread >=
 * attention_flash_scratch_floats(T, hd) floats (one per OpenMP thread; more threads than blocks run as
 * fewer). dK and dV of a KV head sum its query heads and query rows in a fixed order: results do not
 * depend on the thread count. */
typedef struct {
    float *buf;
    size_t per_thread;
    int threads;
} AttnFlashScratch;
int attention_flash_cpu_supported(int hd);
size_t attention_flash_scratch_floats(int T, int hd);
void attention_flash_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                             int nh, int nkv, int hd, const AttnFlashScratch *fs);
void attention_flash_backward(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *q,
                              const float *k, const float *v, int B, int T, int nh, int nkv, int hd,
                              const AttnFlashScratch *fs);

#endif
