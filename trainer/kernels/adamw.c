/* adamw.c — AdamW, schedule, clipping (see adamw.h). */
#include "trainer/kernels/adamw.h"

#include <math.h>

#include "trainer/kernels/vecmath.h"

void adamw_update(float *params, const float *grads, float *m, float *v, const unsigned char *decay, size_t n,
                  const AdamWConfig *c, long t) {
    float b1c = 1.0f - powf(c->beta1, (float)t), b2c = 1.0f - powf(c->beta2, (float)t);
    const size_t blk = 1 << 16; /* SIMD inside a block (vecmath.h), threads over blocks */
    size_t nb = (n + blk - 1) / blk;
#pragma omp parallel for if (nb > 1)
    for (size_t b = 0; b < nb; b++) {
        size_t i = b * blk, k = n - i < blk ? n - i : blk;
        vm_adamw(params + i, grads + i, m + i, v + i, decay ? decay + i : NULL, k, c->lr, c->beta1, c->beta2, c->eps,
                 c->weight_decay, b1c, b2c);
    }
}

float lr_schedule(long step, long warmup, long total, float max_lr, float min_frac) {
    if (step < warmup) return max_lr * (float)(step + 1) / (float)warmup;
    if (total <= warmup) return max_lr;
    double p = (double)(step - warmup) / (double)(total - warmup);
    if (p > 1.0) p = 1.0;
    double cosv = 0.5 * (1.0 + cos(M_PI * p));
    return (float)(max_lr * (min_frac + (1.0 - min_frac) * cosv));
}

double grad_norm(const float *g, size_t n) { return sqrt(vm_sumsq(g, n)); }

void grad_scale(float *g, size_t n, float s) { vm_scale(g, n, s); }
