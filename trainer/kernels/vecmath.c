/* vecmath.c — SIMD row primitives (see vecmath.h). GCC vector extensions over 16 floats; each exported
 * function is cloned for AVX-512F, AVX2 and the baseline, and the static inline helpers are compiled
 * into each clone. A tail shorter than 16 goes through a zero-padded copy, so every element takes the
 * same arithmetic. */
#include "trainer/kernels/vecmath.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* the helpers below pass 64-byte vectors but are always inlined: no ABI crosses a call */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float vf __attribute__((vector_size(64), aligned(16)));
typedef int32_t vi __attribute__((vector_size(64), aligned(16)));
typedef unsigned char vb __attribute__((vector_size(16)));
#define VN 16

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define VM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VM_CLONES
#endif
#define VM_INLINE static inline __attribute__((always_inline))

VM_INLINE vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
/* vector arguments go by pointer or through macros: a 64-byte vector parameter draws GCC's ABI note */
#define vstore(p, v)                                                                                           \
    do {                                                                                                       \
        vf vs_ = (v);                                                                                          \
        memcpy((p), &vs_, sizeof vs_);                                                                         \
    } while (0)
VM_INLINE vf vsplat(float x) { return (vf){0} + x; }
/* m ? a : b, m from a vector comparison (all bits set or clear) */
#define vsel(m, a, b) ((vf)(((vi)(a) & (m)) | ((vi)(b) & ~(m))))
/* a zero-padded copy of the last n < VN floats */
VM_INLINE vf vload_tail(const float *p, size_t n) {
    float t[VN] = {0};
    memcpy(t, p, n * sizeof(float));
    return vload(t);
}
#define vstore_tail(p, v, n)                                                                                   \
    do {                                                                                                       \
        float vt_[VN];                                                                                         \
        vf vs_ = (v);                                                                                          \
        memcpy(vt_, &vs_, sizeof vs_);                                                                         \
        memcpy((p), vt_, (n) * sizeof(float));                                                                 \
    } while (0)
VM_INLINE float vsum_p(const vf *vp) { /* fixed order: pairwise over the lanes */
    vf v = *vp;
    for (int w = VN / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) v[i] += v[i + w];
    return v[0];
}

/* Cephes expf: exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts) */
VM_INLINE vf vexp_p(const vf *xp) {
    vf x = *xp;
    const float lo = -87.33654475f, hi = 88.0f; /* above 88.38, n = 128 would overflow the exponent */
    vi under = x < vsplat(lo);
    x = vsel(x > vsplat(hi), vsplat(hi), x);
    x = vsel(under, vsplat(0.0f), x);
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits */
    vf t = x * 1.44269504088896341f + magic;
    vf n = t - magic;
    vi ni = (vi)t - (vi)vsplat(magic);
    vf r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vf z = r * r;
    vf y = vsplat(1.9875691500e-4f);
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * z + r + 1.0f;
    vf scale = (vf)((ni + 127) << 23);
    return vsel(under, vsplat(0.0f), y * scale);
}

#define vsum(v) ({ vf vv_ = (v); vsum_p(&vv_); })
#define vexp(x) ({ vf vx_ = (x); vexp_p(&vx_); })
#define vsigmoid(g) (1.0f / (1.0f + vexp(-(g))))

VM_CLONES float vm_max(const float *x, size_t n) {
    vf m = vsplat(-INFINITY);
    size_t i = 0;
    for (; i + VN <= n; i += VN) {
        vf v = vload(x + i);
        m = vsel(v > m, v, m);
    }
    float r = -INFINITY;
    for (int l = 0; l < VN; l++) r = m[l] > r ? m[l] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

VM_CLONES float vm_exp_sum(float *x, size_t n, float sub) {
    vf s = vsplat(0.0f), c = vsplat(sub);
    size_t i = 0;
    for (; i + VN <= n; i += VN) {
        vf e = vexp(vload(x + i) - c);
        vstore(x + i, e);
        s += e;
    }
    if (i < n) {
        vf e = vexp(vload_tail(x + i, n - i) - c);
        vstore_tail(x + i, e, n - i);
        vi keep = (vi){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15} < (int32_t)(n - i);
        s += vsel(keep, e, vsplat(0.0f));
    }
    return vsum(s);
}

VM_CLONES void vm_scale(float *x, size_t n, float s) {
    size_t i = 0;
    for (; i + VN <= n; i += VN) vstore(x + i, vload(x + i) * s);
    for (; i < n; i++) x[i] *= s;
}

VM_CLONES float vm_dot(const float *a, const float *b, size_t n) {
    vf s = vsplat(0.0f);
    size_t i = 0;
    for (; i + VN <= n; i += VN) s += vload(a + i) * vload(b + i);
    if (i < n) s += vload_tail(a + i, n - i) * vload_tail(b + i, n - i);
    return vsum(s);
}

VM_CLONES void vm_axpy(float *y, float a, const float *x, size_t n) {
    size_t i = 0;
    for (; i + VN <= n; i += VN) vstore(y + i, vload(y + i) + a * vload(x + i));
    if (i < n) vstore_tail(y + i, vload_tail(y + i, n - i) + a * vload_tail(x + i, n - i), n - i);
}

VM_CLONES void vm_softmax_backward(float *d, const float *p, size_t n, float scale) {
    vf s = vsplat(0.0f);
    size_t i = 0;
    for (; i + VN <= n; i += VN) s += vload(p + i) * vload(d + i);
    if (i < n) s += vload_tail(p + i, n - i) * vload_tail(d + i, n - i);
    float pdp = vsum(s);
    for (i = 0; i + VN <= n; i += VN) vstore(d + i, vload(p + i) * (vload(d + i) - pdp) * scale);
    if (i < n) vstore_tail(d + i, vload_tail(p + i, n - i) * (vload_tail(d + i, n - i) - pdp) * scale, n - i);
}

VM_CLONES void vm_swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    size_t i = 0;
    for (; i + VN <= n; i += VN) {
        vf g = vload(gate + i);
        vstore(out + i, g * vsigmoid(g) * vload(up + i));
    }
    if (i < n) {
        vf g = vload_tail(gate + i, n - i);
        vstore_tail(out + i, g * vsigmoid(g) * vload_tail(up + i, n - i), n - i);
    }
}

VM_CLONES void vm_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                  size_t n) {
    size_t i = 0;
    for (; i + VN <= n; i += VN) {
        vf g = vload(gate + i), s = vsigmoid(g), dy = vload(dout + i);
        vstore(dgate + i, vload(dgate + i) + dy * vload(up + i) * s * (1.0f + g * (1.0f - s)));
        vstore(dup + i, vload(dup + i) + dy * (g * s));
    }
    if (i < n) {
        size_t k = n - i;
        vf g = vload_tail(gate + i, k), s = vsigmoid(g), dy = vload_tail(dout + i, k);
        vstore_tail(dgate + i, vload_tail(dgate + i, k) + dy * vload_tail(up + i, k) * s * (1.0f + g * (1.0f - s)), k);
        vstore_tail(dup + i, vload_tail(dup + i, k) + dy * (g * s), k);
    }
}

VM_CLONES float vm_rmsnorm_row(float *y, const float *x, const float *w, size_t n, float eps) {
    vf s = vsplat(0.0f);
    size_t i = 0;
    for (; i + VN <= n; i += VN) {
        vf v = vload(x + i);
        s += v * v;
    }
    if (i < n) {
        vf v = vload_tail(x + i, n - i);
        s += v * v;
    }
    float r = 1.0f / sqrtf(vsum(s) / (float)n + eps);
    for (i = 0; i + VN <= n; i += VN) vstore(y + i, vload(x + i) * r * vload(w + i));
    if (i < n) vstore_tail(y + i, vload_tail(x + i, n - i) * r * vload_tail(w + i, n - i), n - i);
    return r;
}

VM_CLONES void vm_rmsnorm_backward_row(float *dx, float *dw, const float *dy, const float *x, const float *w, float r,
                                       size_t n) {
    vf s = vsplat(0.0f);
    size_t i = 0;
    for (; i + VN <= n; i += VN) s += vload(dy + i) * vload(w + i) * (vload(x + i) * r);
    if (i < n) s += vload_tail(dy + i, n - i) * vload_tail(w + i, n - i) * (vload_tail(x + i, n - i) * r);
    float m = vsum(s) / (float)n;
    for (i = 0; i + VN <= n; i += VN) {
        vf dyv = vload(dy + i), xh = vload(x + i) * r;
        vstore(dx + i, vload(dx + i) + r * (dyv * vload(w + i) - xh * m));
        if (dw) vstore(dw + i, vload(dw + i) + dyv * xh);
    }
    if (i < n) {
        size_t k = n - i;
        vf dyv = vload_tail(dy + i, k), xh = vload_tail(x + i, k) * r;
        vstore_tail(dx + i, vload_tail(dx + i, k) + r * (dyv * vload_tail(w + i, k) - xh * m), k);
        if (dw) vstore_tail(dw + i, vload_tail(dw + i, k) + dyv * xh, k);
    }
}

/* one lane block of AdamW; sqrt per lane, which GCC turns into the vector instruction only without errno
 * (the Makefile builds this file with -fno-math-errno; the optimize attribute does not get it there) */
VM_INLINE void adamw_block(float *p, const float *g, float *m, float *v, const vf *wdp, float lr, float beta1, float beta2,
                           float eps, float b1c, float b2c) {
    vf wdv = *wdp, gi = vload(g), mi = vload(m) * beta1 + gi * (1.0f - beta1);
    vf vi_ = vload(v) * beta2 + gi * gi * (1.0f - beta2);
    vstore(m, mi);
    vstore(v, vi_);
    vf vh = vi_ / b2c, den;
    for (int l = 0; l < VN; l++) den[l] = __builtin_sqrtf(vh[l]);
    vf pi = vload(p);
    vstore(p, pi - lr * ((mi / b1c) / (den + eps) + wdv * pi));
}

VM_CLONES void vm_adamw(float *params, const float *grads, float *m, float *v, const unsigned char *decay,
                                    size_t n, float lr, float beta1, float beta2, float eps, float wd, float b1c,
                                    float b2c) {
    size_t i = 0;
    for (; i + VN <= n; i += VN) {
        vf wdv = vsplat(0.0f);
        if (decay) {
            vb d;
            memcpy(&d, decay + i, sizeof d);
            wdv = __builtin_convertvector(__builtin_convertvector(d, vi), vf) * wd; /* via int32: one vector conversion */
        }
        adamw_block(params + i, grads + i, m + i, v + i, &wdv, lr, beta1, beta2, eps, b1c, b2c);
    }
    for (; i < n; i++) { /* the same operations, one element */
        float g = grads[i];
        float mi = m[i] * beta1 + g * (1.0f - beta1);
        float vi2 = v[i] * beta2 + g * g * (1.0f - beta2);
        m[i] = mi;
        v[i] = vi2;
        float w = (decay && decay[i]) ? wd : 0.0f;
        params[i] = params[i] - lr * ((mi / b1c) / (sqrtf(vi2 / b2c) + eps) + w * params[i]);
    }
}

VM_CLONES double vm_sumsq(const float *g, size_t n) {
    typedef double vd8 __attribute__((vector_size(64)));
    vd8 a = {0}, b = {0};
    size_t i = 0;
    for (; i + VN <= n; i += VN) {
        vf x = vload(g + i);
        vd8 lo = {x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]};
        vd8 hi = {x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15]};
        a += lo * lo;
        b += hi * hi;
    }
    a += b;
    double s = 0.0;
    for (int l = 0; l < 8; l++) s += a[l];
    for (; i < n; i++) s += (double)g[i] * g[i];
    return s;
}
