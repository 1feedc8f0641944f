/* check_compare.h — how the GPU-vs-CPU checkers of tests/cuda/ compare a result with its reference, and
 * the one rule they share: a value that is not finite (NaN, ±inf) on either side is a failure, never a
 * difference of 0. (fmax(0, NaN) is 0 and NaN > x is false, so a running maximum of |gpu - cpu| silently
 * drops NaN: an all-NaN gradient would score 0.) C and C++; the unit tests keep their maxima of errors
 * with check_max. tests/unit/test_check_compare.c tests it. */
#ifndef DFM_TESTS_CHECK_COMPARE_H
#define DFM_TESTS_CHECK_COMPARE_H

#include <math.h>
#include <stddef.h>

typedef struct {
    double max_abs;   /* max |gpu - ref| over the finite pairs */
    double max_ref;   /* max |ref| over the finite values */
    double rel;       /* max_abs / max_ref (max_abs when max_ref is 0); INFINITY if any value is not finite */
    double cosine;    /* of the two vectors (1 when both are 0); NAN if any value is not finite */
    size_t nonfinite; /* values that are not finite, both sides counted */
} check_diff;

static inline check_diff check_compare(const float *gpu, const float *ref, size_t n) {
    check_diff d = {0, 0, 0, 1, 0};
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        double g = gpu[i], r = ref[i];
        int bad = !isfinite(g) + !isfinite(r);
        if (bad) {
            d.nonfinite += (size_t)bad;
            continue;
        }
        double e = fabs(g - r);
        if (e > d.max_abs) d.max_abs = e;
        if (fabs(r) > d.max_ref) d.max_ref = fabs(r);
        ab += g * r, aa += g * g, bb += r * r;
    }
    if (d.nonfinite) {
        d.rel = INFINITY, d.cosine = NAN;
        return d;
    }
    d.rel = d.max_ref > 0 ? d.max_abs / d.max_ref : d.max_abs;
    d.cosine = (aa == 0 && bb == 0) ? 1.0 : ab / (sqrt(aa * bb) + 1e-300);
    return d;
}

/* a running maximum of errors that keeps NaN (fmax(worst, NaN) is worst): worst = check_max(worst, e) */
static inline double check_max(double worst, double x) { return (x > worst || isnan(x)) ? x : worst; }

/* |gpu - ref| / max(|ref|, floor) of two scalars; INFINITY if either is not finite */
static inline double check_scalar_rel(double gpu, double ref, double floor) {
    if (!isfinite(gpu) || !isfinite(ref)) return INFINITY;
    double den = fabs(ref) > floor ? fabs(ref) : floor;
    return fabs(gpu - ref) / den;
}

#endif
