/* vecmath.h — SIMD row primitives of the CPU trainer's kernels (ops.c, adamw.c).
 *
 * The build targets generic x86-64 (SSE2); these functions are compiled three times (AVX-512F, AVX2 and
 * the baseline, GCC's target_clones) and the loader picks the widest the CPU runs. Every clone does the
 * same IEEE operations in the same order (ISO C: no FMA contraction), so results are bit-identical
 * whichever one runs, and a run is reproducible on any x86-64.
 *
 * The exp inside (vm_exp_sum, the SwiGLU sigmoid) is a Cephes-style expf (range reduction by ln 2 in
 * two parts, degree-6 polynomial): relative error below 2e-7 on [-87.3, 88], 0 below that range, exp(88)
 * above it. Sums are reduced over 16 lanes, then in a fixed order.
 */
#ifndef DFM_TRAINER_VECMATH_H
#define DFM_TRAINER_VECMATH_H

#include <stddef.h>

/* max of x[0..n) (n >= 1). */
float vm_max(const float *x, size_t n);
/* x[i] = exp(x[i] - sub); returns the sum of the new x. */
float vm_exp_sum(float *x, size_t n, float sub);
/* x[i] *= s */
void vm_scale(float *x, size_t n, float s);
/* sum of a[i] * b[i] */
float vm_dot(const float *a, const float *b, size_t n);
/* y[i] += a * x[i] */
void vm_axpy(float *y, float a, const float *x, size_t n);
/* softmax backward of one row: d[i] = p[i] * (d[i] - dot(p, d)) * scale */
void vm_softmax_backward(float *d, const float *p, size_t n, float scale);
/* out = silu(gate) * up */
void vm_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
/* dgate += dout * up * s * (1 + g (1 - s)), dup += dout * g * s, s = sigmoid(g) */
void vm_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);
/* AdamW on n elements (adamw.h): decay[i] (or NULL: none) selects weight decay wd; b1c, b2c the bias
 * corrections 1 - beta^t. */
void vm_adamw(float *params, const float *grads, float *m, float *v, const unsigned char *decay, size_t n, float lr,
              float beta1, float beta2, float eps, float wd, float b1c, float b2c);
/* RMSNorm of one row: y = (x * r) * w with r = 1 / sqrt(mean(x^2) + eps); returns r */
float vm_rmsnorm_row(float *y, const float *x, const float *w, size_t n, float eps);
/* its backward: dx += r * (dy * w - (x * r) * m), m = mean(dy * w * (x * r)); dw (or NULL) += dy * (x * r) */
void vm_rmsnorm_backward_row(float *dx, float *dw, const float *dy, const float *x, const float *w, float r, size_t n);
/* sum of g[i]^2 in double (lanes of 16, then fixed order) */
double vm_sumsq(const float *g, size_t n);

#endif
