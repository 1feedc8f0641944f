/* Unit tests of tests/cuda/check_compare.h, the comparison every CUDA checker uses: a value that is not
 * finite, on either side, fails; it is never a difference of 0 (the checkers' old running maximum,
 * md = fmax(md, |a - b|), scored an all-NaN gradient 0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "tests/cuda/check_compare.h"

#define N 64

static void fill(float *x, float v) {
    for (int i = 0; i < N; i++) x[i] = v;
}

static void test_equal_and_ordinary_error(void **state) {
    float a[N], b[N];
    for (int i = 0; i < N; i++) a[i] = b[i] = (float)(i - 20) * 0.5f;
    check_diff d = check_compare(a, b, N);
    assert_true(d.rel == 0.0 && d.nonfinite == 0);
    assert_true(fabs(d.cosine - 1.0) < 1e-12);
    a[7] += 0.25f;  // max |ref| is 21.5
    d = check_compare(a, b, N);
    assert_true(fabs(d.max_abs - 0.25) < 1e-12 && fabs(d.max_ref - 21.5) < 1e-12);
    assert_true(fabs(d.rel - 0.25 / 21.5) < 1e-12);
    float z[N];
    fill(z, 0.0f);
    fill(a, 0.0f);
    d = check_compare(a, z, N);  // both zero: no error, cosine 1
    assert_true(d.rel == 0.0 && d.cosine == 1.0);
}

// the review's case: a gradient tensor that is all NaN against a finite reference
static void test_all_nan_fails(void **state) {
    float g[N], r[N];
    fill(g, NAN);
    for (int i = 0; i < N; i++) r[i] = 0.01f * (float)i;
    check_diff d = check_compare(g, r, N);
    assert_int_equal(d.nonfinite, N);
    assert_true(isinf(d.rel) && !(d.rel <= 1e-4) && !(d.rel <= 5e-2));
    assert_true(!(d.cosine >= 0.999));  // the bf16 cosine bound fails too
    fill(r, 0.0f);                        // also against a reference of zeros (where the old code gave md = 0)
    d = check_compare(g, r, N);
    assert_true(isinf(d.rel));
}

// one bad value anywhere, on either side, in any form
static void test_one_nonfinite_fails(void **state) {
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++)
        for (int side = 0; side < 2; side++)
            for (int at = 0; at < N; at += N - 1) {  // first and last element
                float g[N], r[N];
                for (int i = 0; i < N; i++) g[i] = r[i] = 1.0f + (float)i;
                (side ? r : g)[at] = bad[k];
                check_diff d = check_compare(g, r, N);
                assert_int_equal(d.nonfinite, 1);
                assert_true(isinf(d.rel) && d.rel > 0);
            }
}

static void test_running_max_keeps_nan(void **state) {
    double w = 0.0;
    w = check_max(w, 0.5);
    w = check_max(w, 0.25);
    assert_true(w == 0.5);
    w = check_max(w, NAN);  // fmax(w, NaN) would be w
    assert_true(isnan(w));
    w = check_max(w, 3.0);  // and it stays
    assert_true(isnan(w) && !(w <= 1.0));
}

static void test_scalar(void **state) {
    assert_true(fabs(check_scalar_rel(1.01, 1.0, 1e-6) - 0.01) < 1e-12);
    assert_true(fabs(check_scalar_rel(1e-9, 0.0, 1e-6) - 1e-3) < 1e-12);  // the floor
    assert_true(isinf(check_scalar_rel(NAN, 1.0, 1e-6)));
    assert_true(isinf(check_scalar_rel(1.0, NAN, 1e-6)));
    assert_true(isinf(check_scalar_rel(INFINITY, INFINITY, 1e-6)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equal_and_ordinary_error),
        cmocka_unit_test(test_all_nan_fails),
        cmocka_unit_test(test_one_nonfinite_fails),
        cmocka_unit_test(test_running_max_keeps_nan),
        cmocka_unit_test(test_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
