/* adamw.h — AdamW over the trainable parameter block, learning-rate schedule, gradient clipping.
 *
 * Weight decay applies to matrices (2-D tensors) only, never to norms, biases, gates' biases or the
 * predictor's placeholder. The update is the PyTorch AdamW one (decoupled decay, bias correction).
 * Everything runs in a fixed order, so a run resumed from a checkpoint is bit-identical.
 */
#ifndef DFM_TRAINER_ADAMW_H
#define DFM_TRAINER_ADAMW_H

#include <stddef.h>

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
} AdamWConfig;

/* One step over params[n] with grads[n] and moments m, v (zero at t = 1). decay[n] or NULL: 1 where
 * weight decay applies. t is the 1-based step count. */
void adamw_update(float *params, const float *grads, float *m, float *v, const unsigned char *decay, size_t n,
                  const AdamWConfig *c, long t);

/* Linear warm-up over `warmup` steps to max_lr, then cosine to max_lr * min_frac at `total`. step 0-based. */
float lr_schedule(long step, long warmup, long total, float max_lr, float min_frac);

/* L2 norm of g[n] (double, fixed order). */
double grad_norm(const float *g, size_t n);
/* g *= s */
void grad_scale(float *g, size_t n, float s);

#endif
