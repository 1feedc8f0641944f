/* audit_model.c — rates fitted to operation counts, the validation and the band (audit_model.h). */
#include "pipeline/audit/audit_model.h"

#include "common/error.h"

#include <math.h>
#include <string.h>

double dfm_audit_rates_eval(const dfm_audit_rates *r, const double x[2]) { return r->rate[0] * x[0] + r->rate[1] * x[1]; }

/* sum of squared relative residuals of rates (r0, r1) over the usable points */
static double sse(const double (*x)[2], const double *y, int n, double r0, double r1) {
    double s = 0;
    for (int i = 0; i < n; i++) {
        if (!(y[i] > 0) || !(x[i][0] + x[i][1] > 0)) continue;
        double e = (r0 * x[i][0] + r1 * x[i][1]) / y[i] - 1;
        s += e * e;
    }
    return s;
}

int dfm_audit_fit_rates(const double (*x)[2], const double *y, int n, dfm_audit_rates *r) {
    memset(r, 0, sizeof *r);
    /* normal equations of min Σ (r0·a_i + r1·b_i - 1)^2 with a = x0/y, b = x1/y */
    double aa = 0, ab = 0, bb = 0, a1 = 0, b1 = 0;
    for (int i = 0; i < n; i++) {
        if (!(y[i] > 0) || !(x[i][0] + x[i][1] > 0)) continue;
        double a = x[i][0] / y[i], b = x[i][1] / y[i];
        aa += a * a, ab += a * b, bb += b * b, a1 += a, b1 += b;
        r->points++;
    }
    if (!r->points) return DFM_FAIL(DFM_EARG, "audit: no measured size with a positive time and operations to fit rates to");
    /* candidates: both rates (when the system is well posed and both come out >= 0), each rate alone */
    double best = INFINITY, c[3][2] = {{NAN, NAN}, {aa > 0 ? a1 / aa : NAN, 0}, {0, bb > 0 ? b1 / bb : NAN}};
    double det = aa * bb - ab * ab;
    if (r->points >= 2 && det > 1e-12 * aa * bb) {
        c[0][0] = (a1 * bb - b1 * ab) / det;
        c[0][1] = (b1 * aa - a1 * ab) / det;
    }
    for (int k = 0; k < 3; k++) {
        if (!(c[k][0] >= 0) || !(c[k][1] >= 0)) continue; /* NAN or negative: not a candidate */
        double s = sse(x, y, n, c[k][0], c[k][1]);
        if (s < best) best = s, r->rate[0] = c[k][0], r->rate[1] = c[k][1];
    }
    if (!(best < INFINITY)) return DFM_FAIL(DFM_EARG, "audit: no non-negative rates fit the %d measured sizes", r->points);
    for (int i = 0; i < n; i++) {
        if (!(y[i] > 0) || !(x[i][0] + x[i][1] > 0)) continue;
        double e = fabs(dfm_audit_rates_eval(r, x[i]) / y[i] - 1);
        if (!(e <= r->max_rel)) r->max_rel = e;
    }
    return DFM_OK;
}

int dfm_audit_validate(const double (*x)[2], const double *y, int n, const dfm_audit_rates *planted, double *err) {
    *err = NAN;
    if (n < 3 || !(y[n - 1] > 0)) return -1;
    dfm_audit_rates r;
    if (planted) {
        r = *planted;
    } else if (dfm_audit_fit_rates(x, y, n - 1, &r)) {
        dfm_error_clear();
        return -1;
    }
    *err = dfm_audit_rates_eval(&r, x[n - 1]) / y[n - 1] - 1;
    return fabs(*err) <= DFM_AUDIT_VALID_MAX ? 1 : 0;
}

double dfm_audit_band(double err, double beyond, double step) {
    double e = isnan(err) ? 1.0 : fabs(err);
    if (!(e >= DFM_AUDIT_BAND_FLOOR)) e = DFM_AUDIT_BAND_FLOOR;
    double steps = beyond > 1 && step > 1 ? log(beyond) / log(step) : 0;
    if (!(steps >= 1)) steps = 1;
    return pow(1 + e, steps);
}
