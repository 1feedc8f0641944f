/* Unit tests of dfm audit: the counted savings for several L/K, the key generator, one measured side
 * (Flat and an IVF the sample cannot train as given), the SVG writer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pipeline/audit/audit.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "schemas/neighbor_shard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* L, K, expected 1 - 1/L and 1 - K/(L*1024), written out as literals */
static const struct {
    uint32_t L, K;
    double q, items;
} CASES[] = {
    {32, 16, 0.96875, 0.99951171875},  /* the paper's headline: 96.875 % and 99.951 % */
    {16, 8, 0.9375, 0.99951171875},    /* 1 - 8/16384 */
    {64, 32, 0.984375, 0.99951171875}, /* 1 - 32/65536 */
    {32, 8, 0.96875, 0.999755859375},  /* 1 - 8/32768 */
    {16, 16, 0.9375, 0.9990234375},    /* 1 - 16/16384 */
};

static void test_counted_formulas(void **state) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        /* a run of 249 sequences of 8 chunks: 1992 chunks, 137 padding tokens, 253 chunks without a query */
        uint64_t chunks = 1992;
        dfm_audit_counts_in in = {CASES[i].L, CASES[i].K, 1024, chunks, chunks * CASES[i].L - 137, chunks - 253,
                                  (chunks - 253) * CASES[i].K, (chunks - 253) * (CASES[i].K + 16)};
        dfm_audit_counted c;
        assert_int_equal(dfm_audit_count(&in, &c), DFM_OK);
        /* exact equality: these are the same quotient rounded once */
        assert_true(c.query_saving_formula == CASES[i].q);
        assert_true(c.item_saving_formula == CASES[i].items);
        assert_true(c.query_saving_per_chunk == CASES[i].q);
        assert_true(c.item_saving_per_chunk == CASES[i].items);
        assert_int_equal(c.chunk_queries, chunks);
        assert_int_equal(c.token_slot_queries, chunks * CASES[i].L);
        assert_int_equal(c.token_slot_items, chunks * CASES[i].L * 1024);
        /* as issued: fewer queries than chunks, fewer tokens than slots */
        assert_int_equal(c.token_queries, in.tokens);
        assert_true(fabs(c.query_saving_run - (1.0 - (double)in.queries / (double)in.tokens)) < 1e-15);
        assert_true(c.query_saving_run > c.query_saving_formula); /* no-query rows outweigh padding here */
        assert_true(fabs(c.item_saving_run - (1.0 - (double)in.items_kept / ((double)in.tokens * 1024))) < 1e-15);
        assert_true(c.candidate_saving_run < c.item_saving_run);
    }
    /* the paper's rounded figures */
    dfm_audit_counts_in in = {32, 16, 1024, 100, 3200, 100, 1600, 1600};
    dfm_audit_counted c;
    assert_int_equal(dfm_audit_count(&in, &c), DFM_OK);
    assert_true(fabs(100 * c.item_saving_formula - 99.951) < 0.001);
    assert_true(fabs(100 * c.query_saving_formula - 96.875) < 1e-12);
    /* no padding and a query for every chunk: the run's figures are the formulas */
    assert_true(c.query_saving_run == c.query_saving_formula);
    assert_true(c.item_saving_run == c.item_saving_formula);
    /* odd L and K: per-chunk still equals the formula */
    dfm_audit_counts_in odd = {7, 5, 1000, 12345, 12345 * 7, 12000, 60000, 60000};
    assert_int_equal(dfm_audit_count(&odd, &c), DFM_OK);
    assert_true(c.query_saving_per_chunk == 1.0 - 1.0 / 7);
    assert_true(c.item_saving_per_chunk == 1.0 - 5.0 / 7000.0);
}

static void test_counted_refuses(void **state) {
    dfm_audit_counted c;
    dfm_audit_counts_in in = {0, 16, 1024, 10, 320, 9, 144, 288};
    assert_int_equal(dfm_audit_count(&in, &c), DFM_EARG);
    assert_non_null(strstr(dfm_last_error(), "chunk-len"));
    in.L = 32;
    in.K = 0;
    assert_int_equal(dfm_audit_count(&in, &c), DFM_EARG);
    in.K = 16;
    in.tokens = 321; /* more tokens than 10 chunks of 32 hold */
    assert_int_equal(dfm_audit_count(&in, &c), DFM_EARG);
    in.tokens = 320;
    in.queries = 11;
    assert_int_equal(dfm_audit_count(&in, &c), DFM_EARG);
    in.queries = 9;
    in.k_token = 0;
    assert_int_equal(dfm_audit_count(&in, &c), DFM_EARG);
    in.k_token = 1024;
    in.chunks = 0;
    assert_int_equal(dfm_audit_count(&in, &c), DFM_EARG);
    dfm_error_clear();
}

static void test_keys(void **state) {
    float a[64], b[64], c[64];
    dfm_audit_key(42, 64, a);
    dfm_audit_key(42, 64, b);
    dfm_audit_key(43, 64, c);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    double n = 0;
    for (int i = 0; i < 64; i++) n += (double)a[i] * a[i];
    assert_true(fabs(n - 1.0) < 1e-5);
}

static void test_measure_flat(void **state) {
    enum { N = 200, D = 32, K = 8 };
    uint64_t seeds[N], q[N];
    for (int i = 0; i < N; i++) seeds[i] = (uint64_t)i * 7919u, q[i] = (uint64_t)i;
    dfm_audit_side_opts o = {"IDMap,Flat", DFM_METRIC_IP, D, K, 0, 64};
    dfm_audit_side s;
    assert_int_equal(dfm_audit_measure_side(&o, seeds, N, q, N, &s), DFM_OK);
    assert_string_equal(s.factory, "IDMap,Flat");
    assert_int_equal(s.keys, N);
    assert_int_equal(s.queries, N);
    assert_int_equal(s.results, (uint64_t)N * K); /* every query finds K neighbours among 200 keys */
    assert_true(s.index_bytes >= (uint64_t)N * (D * 4 + 8));
    assert_true(s.bytes_per_key >= D * 4 + 8);
    assert_true(s.search_s > 0 && s.s_per_query > 0 && s.repeats >= 1);
    /* k larger than the datastore: FAISS pads with -1, which are not counted as results */
    o.k = 300;
    assert_int_equal(dfm_audit_measure_side(&o, seeds, N, q, 10, &s), DFM_OK);
    assert_int_equal(s.results, 10 * N);
    /* "auto" picks Flat for a small datastore, as dfm index would */
    o.index = "auto";
    o.k = K;
    assert_int_equal(dfm_audit_measure_side(&o, seeds, N, q, N, &s), DFM_OK);
    assert_non_null(strstr(s.factory, "Flat"));
    /* errors */
    assert_int_equal(dfm_audit_measure_side(&o, seeds, 0, q, 0, &s), DFM_EARG);
    o.dim = 0;
    assert_int_equal(dfm_audit_measure_side(&o, seeds, N, q, N, &s), DFM_EARG);
    dfm_error_clear();
}

static void test_measure_ivf_rescaled(void **state) {
    enum { N = 400, D = 16, K = 4 };
    uint64_t *seeds = malloc(sizeof(uint64_t) * N), *q = malloc(sizeof(uint64_t) * N);
    for (int i = 0; i < N; i++) seeds[i] = (uint64_t)i + 1, q[i] = (uint64_t)i;
    /* 4096 lists cannot be trained on 400 keys: the same family with 400/39 = 10 lists is used */
    dfm_audit_side_opts o = {"IVF4096,Flat", DFM_METRIC_L2, D, K, 4, 0};
    dfm_audit_side s;
    assert_int_equal(dfm_audit_measure_side(&o, seeds, N, q, N, &s), DFM_OK);
    assert_string_equal(s.factory, "IVF10,Flat");
    assert_non_null(strstr(s.why, "IVF4096,Flat"));
    assert_true(s.results > 0 && s.results <= (uint64_t)N * K);
    free(seeds);
    free(q);
}

static void test_svg_and_human(void **state) {
    char dir[] = "/tmp/dfm-test-audit-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = dfm_path_join(dir, "c.svg");
    dfm_audit_bar bars[3] = {{"queries", "n", 1739, 63607}, {"items <&>", "n", 27824, 65133568.0}, {"time", "s", 0, 0.4}};
    assert_int_equal(dfm_audit_write_svg(path, "t & <t>", bars, 3), DFM_OK);
    char *txt = NULL;
    size_t n = 0;
    assert_int_equal(dfm_read_file(path, &txt, &n), DFM_OK);
    assert_non_null(strstr(txt, "<svg"));
    assert_non_null(strstr(txt, "</svg>"));
    assert_non_null(strstr(txt, "items &lt;&amp;&gt;"));
    assert_non_null(strstr(txt, "t &amp; &lt;t&gt;"));
    assert_non_null(strstr(txt, "97.266 % fewer"));
    assert_non_null(strstr(txt, "n/a")); /* a zero value is not drawn on a log scale */
    assert_null(strstr(txt, "<items"));
    free(txt);
    unlink(path);
    rmdir(dir);
    free(path);
    char b[32];
    assert_string_equal(dfm_audit_human(999, b, sizeof b), "999");
    assert_string_equal(dfm_audit_human(63607, b, sizeof b), "63.6 k");
    assert_string_equal(dfm_audit_human(5e9, b, sizeof b), "5 G");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counted_formulas),   cmocka_unit_test(test_counted_refuses), cmocka_unit_test(test_keys),
        cmocka_unit_test(test_measure_flat),       cmocka_unit_test(test_measure_ivf_rescaled),
        cmocka_unit_test(test_svg_and_human),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
