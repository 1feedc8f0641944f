/* Unit tests of the audit's cost model (audit_model.h, audit_scale.h): rates fitted to operation counts recover
 * the rates that made the times; the validation passes a consistent model and catches a planted wrong rate; the
 * band widens with the distance from the measurements; the extrapolated index bytes are the layout arithmetic
 * of the index each side would have; and a saving is written in words that cannot contradict themselves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "pipeline/audit/audit.h"
#include "pipeline/audit/audit_layout.h"
#include "pipeline/audit/audit_model.h"
#include "pipeline/audit/audit_scale.h"
#include "pipeline/audit/audit_storage.h"
#include "schemas/neighbor_shard.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* the token level's operations at 3 sizes x4 apart, and times made from known rates */
static void ops3(double x[3][2], double y[3], const double rate[2]) {
    for (int i = 0; i < 3; i++) {
        uint64_t n = 16000ull << (2 * i);
        char f[64], why[600];
        dfm_audit_ivfpq_factory(n, 576, f, sizeof f, why, sizeof why);
        dfm_audit_layout l;
        assert_int_equal(dfm_audit_layout_parse(f, 576, DFM_METRIC_L2, &l), DFM_OK);
        dfm_audit_search_ops o;
        dfm_audit_search_ops_of(&l, (double)n, 32, 1024, &o);
        x[i][0] = o.flops, x[i][1] = o.codes;
        y[i] = rate[0] * o.flops + rate[1] * o.codes;
    }
}

static void test_fit_and_validate(void **state) {
    (void)state;
    const double truth[2] = {2e-10, 1.5e-9};
    double x[3][2], y[3];
    ops3(x, y, truth);
    dfm_audit_rates r;
    assert_int_equal(dfm_audit_fit_rates((const double(*)[2])x, y, 3, &r), DFM_OK);
    assert_true(fabs(r.rate[0] / truth[0] - 1) < 1e-6 && fabs(r.rate[1] / truth[1] - 1) < 1e-6 && r.max_rel < 1e-9 && r.points == 3);
    double err;
    assert_int_equal(dfm_audit_validate((const double(*)[2])x, y, 3, NULL, &err), 1);
    assert_true(fabs(err) < 1e-6);
    /* a planted wrong rate: the code rate 3x too high; the validation must catch it */
    dfm_audit_rates wrong = r;
    wrong.rate[1] *= 3;
    assert_int_equal(dfm_audit_validate((const double(*)[2])x, y, 3, &wrong, &err), 0);
    assert_true(err > DFM_AUDIT_VALID_MAX);
    /* and a slightly wrong one (10 %) passes: the check is not a tautology either way */
    wrong = r;
    wrong.rate[0] *= 1.1, wrong.rate[1] *= 1.1;
    assert_int_equal(dfm_audit_validate((const double(*)[2])x, y, 3, &wrong, &err), 1);
    assert_true(fabs(err - 0.1) < 1e-9);
    /* a largest size that grew much faster than the operations say: fitted on the smaller two, caught */
    double y2[3] = {y[0], y[1], y[2] * 2};
    assert_int_equal(dfm_audit_validate((const double(*)[2])x, y2, 3, NULL, &err), 0);
    assert_true(fabs(err - (0.5 - 1)) < 1e-6);
    /* two sizes: fitted, but not validated */
    assert_int_equal(dfm_audit_validate((const double(*)[2])x, y, 2, NULL, &err), -1);
    assert_true(isnan(err));
    /* rates are never negative: times that fall with the operations fit one rate at 0 */
    double yneg[3] = {3 * y[0], y[1], y[2]};
    assert_int_equal(dfm_audit_fit_rates((const double(*)[2])x, yneg, 3, &r), DFM_OK);
    assert_true(r.rate[0] >= 0 && r.rate[1] >= 0 && r.max_rel > 0.1);
    double none[3] = {0, 0, 0};
    assert_int_equal(dfm_audit_fit_rates((const double(*)[2])x, none, 3, &r), DFM_EARG);
    dfm_error_clear();
}

static void test_band(void **state) {
    (void)state;
    const double f = DFM_AUDIT_BAND_FLOOR;
    assert_true(fabs(dfm_audit_band(0.4, 4, 4) - 1.4) < 1e-12);          /* one step: the validated error */
    assert_true(fabs(dfm_audit_band(-0.4, 64, 4) - pow(1.4, 3)) < 1e-12); /* three steps of x4 */
    assert_true(fabs(dfm_audit_band(0.001, 16, 4) - pow(1 + f, 2)) < 1e-12); /* never tighter than the floor */
    assert_true(fabs(dfm_audit_band(NAN, 16, 4) - 4.0) < 1e-12);          /* not validated: 100 % a step */
    assert_true(fabs(dfm_audit_band(0.5, 0.5, 4) - 1.5) < 1e-12);         /* inside the measured range: one step */
}

static void test_saving_words(void **state) {
    (void)state;
    char b[48];
    assert_string_equal(dfm_audit_saving_words(0.51596, 3, "less", b, sizeof b), "51.596 % less");
    assert_string_equal(dfm_audit_saving_words(-0.77034, 3, "less", b, sizeof b), "77.034 % more");
    assert_string_equal(dfm_audit_saving_words(-0.77034, 3, "fewer", b, sizeof b), "77.034 % more");
    assert_string_equal(dfm_audit_saving_words(0.96875, 4, "fewer", b, sizeof b), "96.8750 % fewer");
    assert_string_equal(dfm_audit_saving_words(0, 3, "less", b, sizeof b), "the same");
    assert_string_equal(dfm_audit_saving_words(NAN, 3, "less", b, sizeof b), "not measured");
    /* never a minus sign before "less" or "fewer", whatever the value */
    for (double v = -3; v <= 1; v += 0.01) {
        dfm_audit_saving_words(v, 3, "less", b, sizeof b);
        assert_null(strchr(b, '-'));
    }
}

/* a measurement of three sizes made from the operation counts of the indexes chosen there and known rates */
static void synth_scale(dfm_audit_scale *s, const double rate_s[2], const double rate_b[2]) {
    memset(s, 0, sizeof *s);
    s->cfg = (dfm_audit_scale_cfg){.k_token = 1024, .k_chunk = 32, .token_nprobe = 32, .chunk_index = "auto", .chunk_metric = DFM_METRIC_IP,
                                   .chunk_keys_per_token = 1.0 / 32, .chunk_queries_per_token = 0.0273, .repeats = 1, .build_repeats = 1};
    s->token_dim = 576, s->chunk_dim = 384, s->n = 3;
    for (int i = 0; i < 3; i++) {
        dfm_audit_size *z = &s->s[i];
        z->tokens = 16384ull << (2 * i);
        for (int side = 0; side < DFM_AUDIT_SIDES; side++) {
            dfm_audit_point *p = (dfm_audit_point *)dfm_audit_side_point(z, side);
            uint64_t n = side == 1 ? z->tokens : z->tokens / 32;
            uint32_t d = side == 1 ? 576 : 384, metric = side == 1 ? DFM_METRIC_L2 : DFM_METRIC_IP;
            dfm_audit_choice c;
            assert_int_equal(dfm_audit_choose(side == 0 ? "auto" : "ivfpq", metric, d, n, &c, p->why, sizeof p->why), DFM_OK);
            p->keys = n;
            if (c.too_small) {
                p->skipped = 1;
                continue;
            }
            snprintf(p->factory, sizeof p->factory, "%s", c.factory);
            p->nlist = c.nlist, p->train_n = c.train_n, p->nprobe = c.nlist ? (c.nlist < 32 ? (int64_t)c.nlist : 32) : 0;
            dfm_audit_layout l;
            assert_int_equal(dfm_audit_layout_parse(c.factory, d, metric, &l), DFM_OK);
            dfm_audit_search_ops so;
            dfm_audit_build_ops bo;
            dfm_audit_search_ops_of(&l, (double)n, (double)p->nprobe, side == 1 ? 1024 : 32, &so);
            dfm_audit_build_ops_of(&l, (double)n, (double)c.train_n, &bo);
            p->query_cpu.med = rate_s[0] + rate_s[1] * (so.flops + so.codes);
            p->build_cpu.med = rate_b[0] + rate_b[1] * (bo.train + bo.add);
            p->index_bytes = (uint64_t)dfm_audit_layout_bytes(&l, n, c.nlist);
            p->layout_bytes = (double)p->index_bytes;
        }
    }
}

static void test_extrapolation(void **state) {
    (void)state;
    const double rs[2] = {2e-5, 1e-9}, rb[2] = {0.01, 2e-10};
    dfm_audit_scale s;
    synth_scale(&s, rs, rb);
    dfm_audit_scale_model(&s);
    /* token level: IVF-PQ at all three sizes; the chunk level in IVF-PQ: 512..8192 chunk keys, measured at two */
    assert_true(s.model[1].ok && s.model[1].family == DFM_AUDIT_IVF_PQ && s.model[1].sizes == 3);
    assert_int_equal(s.model[1].search_valid, 1);
    assert_true(fabs(s.model[1].search_err) < 1e-6 && fabs(s.model[1].build_err) < 1e-6 && s.model[1].bytes_err == 0);
    assert_true(s.model[0].ok && s.model[0].family == DFM_AUDIT_FLAT);
    assert_true(s.s[0].chk_pq.skipped && !s.s[1].chk_pq.skipped);
    assert_int_equal(s.model[2].sizes, 2);
    dfm_audit_extrap e;
    dfm_audit_scale_extrapolate(&s, 5e9, &e);
    /* the goal: index bytes at 5e9 tokens equal the layout arithmetic within 5 %, both sides — here exactly, and
     * at least codes + ids of every key: 5e9 keys of 64-byte codes (width 576) are 3.6e11 bytes */
    for (int i = 0; i < DFM_AUDIT_SIDES; i++) {
        assert_true(e.ok[i]);
        dfm_audit_layout l;
        uint32_t d = i == 1 ? 576 : 384;
        assert_int_equal(dfm_audit_layout_parse(e.factory[i], d, i == 1 ? DFM_METRIC_L2 : DFM_METRIC_IP, &l), DFM_OK);
        double want = dfm_audit_layout_bytes(&l, (uint64_t)llround(e.keys[i]), l.nlist);
        assert_true(fabs(e.index_bytes[i] / want - 1) < 0.05);
        assert_true(e.index_bytes[i] >= e.keys[i] * dfm_audit_layout_bytes_per_key(&l));
    }
    assert_string_equal(e.factory[1], "IVF65536,PQ64np");
    assert_true(e.index_bytes[1] > 3.6e11 && e.index_bytes[1] < 3.62e11);
    /* the chunk level's own index at 1.56e8 keys is no longer Flat, and is priced with rates of its new family */
    assert_int_equal(strncmp(e.factory[0], "IVF", 3), 0);
    /* times from the true rates are exact, beyond the measurement, with a band > 1 */
    dfm_audit_layout l;
    assert_int_equal(dfm_audit_layout_parse(e.factory[1], 576, DFM_METRIC_L2, &l), DFM_OK);
    dfm_audit_search_ops so;
    dfm_audit_search_ops_of(&l, 5e9, 32, 1024, &so);
    assert_true(fabs(e.s_per_query[1] / (rs[0] + rs[1] * (so.flops + so.codes)) - 1) < 1e-6);
    assert_true(e.beyond > DFM_AUDIT_DEFENSIBLE && fabs(e.search_band[1] - pow(1 + DFM_AUDIT_BAND_FLOOR, log(e.beyond) / log(4))) < 1e-9);
    assert_true(fabs(e.search_s[1] - 5e9 * e.s_per_query[1]) < 1e-6 * e.search_s[1]);
    /* a planted wrong rate in the measurement (token level's largest size 2x slower than its operations say): the
     * validation catches it, and the band at 5e9 widens */
    s.s[2].tok.query_cpu.med *= 2;
    dfm_audit_scale_model(&s);
    assert_int_equal(s.model[1].search_valid, 0);
    dfm_audit_extrap e2;
    dfm_audit_scale_extrapolate(&s, 5e9, &e2);
    assert_true(e2.search_band[1] > 2 * e.search_band[1]);
}

/* the target memory's storage: the arithmetic per layout, the run's raw bytes checked against it (with 2K slots a
 * record under --slots-hold both), and no verdict without measured bytes */
static void test_storage(void **state) {
    (void)state;
    dfm_audit_storage st;
    dfm_audit_storage_of(16, 32, 384, 576, 2, 1, 10, 10 * (8 + 12 * 16 + 16 * 384 * 2), 1000, &st);
    assert_int_equal(st.n, 4);
    assert_true(st.row[0].in_records == 8 + 12 * 16 + 16.0 * 384 * 2 && st.row[0].with_table == 8 + 12 * 16 + 384.0 * 2);
    assert_true(st.row[2].per_neighbour == 4 && st.row[2].with_table == 8 + 12 * 16 + 4.0 * 576 * 2);
    assert_true(st.row[3].per_neighbour == 32 && st.row[3].in_records == 8 + 12 * 16 + 16.0 * 32 * 576 * 2);
    assert_int_equal(st.raw_matches, 1);
    /* --slots-hold both: 32 slots a record; the same bytes read as 16 slots would not match */
    dfm_audit_storage_of(32, 32, 384, 0, 2, 1, 10, 10 * (8 + 12 * 32 + 32 * 384 * 2), 1000, &st);
    assert_int_equal(st.n, 1);
    assert_int_equal(st.raw_matches, 1);
    dfm_audit_storage_of(16, 32, 384, 0, 2, 1, 10, 10 * (8 + 12 * 32 + 32 * 384 * 2), 1000, &st);
    assert_int_equal(st.raw_matches, 0);
    /* --store ids: mask, ids and scores only */
    dfm_audit_storage_of(16, 32, 384, 0, 2, 0, 10, 10 * (8 + 12 * 16), 1000, &st);
    assert_int_equal(st.raw_matches, 1);
    /* records without measured bytes: no verdict */
    dfm_audit_storage_of(16, 32, 384, 0, 2, 1, 10, 0, 0, &st);
    assert_int_equal(st.raw_matches, -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fit_and_validate),
        cmocka_unit_test(test_band),
        cmocka_unit_test(test_saving_words),
        cmocka_unit_test(test_extrapolation),
        cmocka_unit_test(test_storage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
