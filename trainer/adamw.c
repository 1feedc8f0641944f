/* adamw.c — AdamW, schedule, clipping (see adamw.h). */
#include "trainer/adamw.h"

#include <math.h>

void adamw_update(float *params, const float *grads, float *m, float *v, const unsigned char *decay, size_t n,
                  const AdamWConfig *c, long t) {
    float b1c = 1.0f - powf(c->beta1, (float)t), b2c = 1.0f - powf(c->beta2, (float)t);
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float g = grads[i];
        float mi = c->beta1 * m[i] + (1.0f - c->beta1) * g;
        float vi = c->beta2 * v[i] + (1.0f - c->beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float wd = (decay && decay[i]) ? c->weight_decay : 0.0f;
        params[i] -= c->lr * ((mi / b1c) / (sqrtf(vi / b2c) + c->eps) + wd * params[i]);
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

double grad_norm(const float *g, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return sqrt(s);
}

void grad_scale(float *g, size_t n, float s) {
    for (size_t i = 0; i < n; i++) g[i] *= s;
}
