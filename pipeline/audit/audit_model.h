/* audit_model.h — the audit's cost model: seconds = a fixed cost + operations × a rate, with the operations
 * counted from the index's layout (audit_layout.h) and the two fitted on the measured sizes; validated by fitting
 * the smaller sizes only and predicting the largest one; extrapolated with a band that widens with the
 * distance from the measurements.
 *
 *   search, per query  = fixed + r · (flops + codes)           (dfm_audit_search_ops)
 *   build              = fixed + r · (train flops + add flops)  (dfm_audit_build_ops)
 *
 * One rate for every operation: at the sizes a demo measures the kinds of operation grow together (flops and
 * code look-ups are nearly proportional from one size to the next), so separate rates per kind cannot be told
 * apart by a fit, while a fixed cost (the k-selection's sort, call overheads, start-up) and one rate can. The
 * generic fit below takes any two columns: x[i] = {1, operations}. Rates are fitted by non-negative least
 * squares on relative residuals (each size weighs the same, whatever its time). Two sizes fit both exactly; a
 * validation needs three sizes or more.
 */
#ifndef DFM_AUDIT_MODEL_H
#define DFM_AUDIT_MODEL_H

#include <stdint.h>

/* a validated prediction may miss the measurement by this much (the goal: 25 %) */
#define DFM_AUDIT_VALID_MAX 0.25
/* extrapolating further than this factor past the largest measured size is shown as a model only */
#define DFM_AUDIT_DEFENSIBLE 100.0
/* the smallest error per step a band is drawn with: a model validated within DFM_AUDIT_VALID_MAX is trusted to
 * that much a step, not to its own (luckier) error. Measured over three runs: the demo's model (16384 SmolLM2 hidden
 * states) predicted a 10^6-key datastore (three x4 steps) search 13-32 % low and build 1.6-2.1x high; the band
 * there, 1.25^3, holds the search each time and the build in two runs of three (bench/results/report-audit.md). */
#define DFM_AUDIT_BAND_FLOOR DFM_AUDIT_VALID_MAX

typedef struct {
    double rate[2]; /* seconds per operation of each kind */
    int points;     /* sizes fitted */
    double max_rel; /* largest |fit / measured - 1| over them */
} dfm_audit_rates;

/* Fit rate[0], rate[1] >= 0 to n points: y[i] ≈ rate[0]·x[i][0] + rate[1]·x[i][1] (relative residuals).
 * Points with y <= 0 or no operations are skipped. DFM_EARG when none is left. */
int dfm_audit_fit_rates(const double (*x)[2], const double *y, int n, dfm_audit_rates *r);
double dfm_audit_rates_eval(const dfm_audit_rates *r, const double x[2]);

/* The validation: rates fitted on the n - 1 smaller points (x sorted by size, the last the largest) predict
 * the last: *err = prediction / measured - 1. With `planted` (not NULL) those rates are used instead of fitted
 * ones (tests plant a wrong rate and check that the validation catches it). Returns 1 when |err| <=
 * DFM_AUDIT_VALID_MAX, 0 when not, -1 when it cannot be done (fewer than 3 points: *err NAN). */
int dfm_audit_validate(const double (*x)[2], const double *y, int n, const dfm_audit_rates *planted, double *err);

/* The band factor at `beyond` times the largest measured size, whose sizes step by `step` (x4): the one-step
 * validation error compounded per step, (1 + max(|err|, DFM_AUDIT_BAND_FLOOR))^max(1, log(beyond) / log(step)).
 * An err of NAN (no validation possible, or rates carried to an unmeasured family) counts as 100 % per step. */
double dfm_audit_band(double err, double beyond, double step);

#endif
