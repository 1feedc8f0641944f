/* check_common.h — shared by the GPU-vs-CPU checker programs (ops_cuda_check.cu, attention_cuda_check.cu,
 * model_cuda_check.cu): error propagation that prints the failing call, a fixed-seed uniform RNG, and the
 * comparison of check_compare.h. Include after common/error.h and cuda_runtime.h. CHECK_SEED (before the
 * include) picks the seed. */
#ifndef DFM_TRAINER_CHECK_COMMON_H
#define DFM_TRAINER_CHECK_COMMON_H

#include <stdint.h>
#include <stdio.h>

#include "tests/cuda/check_compare.h"

/* a call returning a dfm code: report it with its message and propagate */
#define GT(call)                                                                                               \
    do {                                                                                                       \
        int rc_ = (call);                                                                                      \
        if (rc_) {                                                                                             \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, dfm_last_error());           \
            return rc_;                                                                                        \
        }                                                                                                      \
    } while (0)
/* a CUDA runtime call: report and return DFM_ECUDA */
#define CT(call)                                                                                               \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));     \
            return DFM_ECUDA;                                                                                  \
        }                                                                                                      \
    } while (0)

#ifndef CHECK_SEED
#define CHECK_SEED 0x9E3779B97F4A7C15ull
#endif
static uint64_t g_rng = CHECK_SEED;
/* uniform in [-1, 1) (xorshift64) */
static inline float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

#endif
