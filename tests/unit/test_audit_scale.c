/* Unit tests of the audit at scale: min/median/max, the token-level
 * IVF-PQ rule, one datastore measured (recall of an exact and of a compressed index), and the
 * hidden-states file (round trip, damage refused). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "pipeline/audit/audit.h"
#include "pipeline/audit/audit_scale.h"
#include "schemas/hidden_states.h"
#include "schemas/neighbor_shard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_spread(void **state) {
    (void)state;
    double v[4] = {3, 1, 2, 10};
    dfm_audit_spread s = dfm_audit_spread_of(v, 3);
    assert_true(s.min == 1 && s.med == 2 && s.max == 3 && s.n == 3);
    s = dfm_audit_spread_of(v, 4);
    assert_true(s.min == 1 && s.med == 2.5 && s.max == 10 && s.n == 4);
    assert_true(v[0] == 3); /* the input is left as it was */
}

static void test_ivfpq_rule(void **state) {
    (void)state;
    char f[64], why[600];
    dfm_audit_ivfpq_factory(1000000, 64, f, sizeof f, why, sizeof why);
    assert_string_equal(f, "IVF1024,PQ16np");
    dfm_audit_ivfpq_factory(100000000, 1024, f, sizeof f, why, sizeof why); /* kNN-LM's scale: 64-byte codes */
    assert_string_equal(f, "IVF8192,PQ64np");
    dfm_audit_ivfpq_factory(62500, 384, f, sizeof f, why, sizeof why);
    assert_string_equal(f, "IVF256,PQ64np");
    dfm_audit_ivfpq_factory(1500, 32, f, sizeof f, why, sizeof why); /* lists capped at n / 39 */
    assert_string_equal(f, "IVF32,PQ8np");
    dfm_audit_ivfpq_factory(999, 64, f, sizeof f, why, sizeof why);
    assert_string_equal(f, "Flat");
    assert_non_null(strstr(why, "too few"));
}

/* clustered keys: 20 centres, each key a centre plus a little noise */
static float *clustered(uint64_t n, uint32_t d) {
    float *k = malloc(sizeof(float) * n * d), *c = malloc(sizeof(float) * 20 * d);
    for (int i = 0; i < 20; i++) dfm_audit_key(100 + i, d, c + i * d);
    for (uint64_t i = 0; i < n; i++) {
        dfm_audit_key(7 + i, d, k + i * d);
        for (uint32_t j = 0; j < d; j++) k[i * d + j] = c[(i % 20) * d + j] + 0.2f * k[i * d + j];
    }
    free(c);
    return k;
}

static void test_measure_point(void **state) {
    (void)state;
    const uint64_t N = 3000, NQ = 40;
    const uint32_t D = 16, K = 50;
    float *keys = clustered(N, D);
    uint64_t q[NQ];
    for (uint64_t i = 0; i < NQ; i++) q[i] = i * 71 % N;
    dfm_audit_point p;
    dfm_audit_point_opts flat = {"Flat", DFM_METRIC_L2, D, K, 0, 2, 2, 10};
    assert_int_equal(dfm_audit_measure_point(&flat, keys, N, q, NQ, &p), DFM_OK);
    assert_true(p.recall == 1.0 && p.recall_queries == 10 && p.keys == N && p.queries == NQ);
    assert_true(p.results == NQ * K && p.index_bytes > N * D * 4);
    assert_true(p.query_s.n == 2 && p.build_s.n == 2 && p.query_cpu.min > 0 && p.query_cpu.min <= p.query_cpu.max);
    dfm_audit_point_opts pq = {"ivfpq", DFM_METRIC_L2, D, K, 4, 1, 1, 10};
    assert_int_equal(dfm_audit_measure_point(&pq, keys, N, q, NQ, &p), DFM_OK);
    assert_string_equal(p.factory, "IVF64,PQ4np");
    assert_int_equal(p.nprobe, 4);
    assert_int_equal(p.train_n, N); /* 9984 wanted for the codebooks, the datastore holds fewer */
    assert_true(p.recall > 0.05 && p.recall < 1.0); /* a compressed index visiting 4 of 64 lists misses some */
    assert_true(p.index_bytes < N * D * 4);          /* 4-byte codes: smaller than the raw keys */
    assert_true(p.layout_bytes == (double)p.index_bytes); /* the layout arithmetic is FAISS's serialisation */
    /* too few keys for IVF-PQ: nothing built, and nothing called IVF-PQ */
    assert_int_equal(dfm_audit_measure_point(&pq, keys, 500, q, 5, &p), DFM_OK);
    assert_true(p.skipped && p.factory[0] == 0 && p.keys == 500 && p.index_bytes == 0);
    assert_non_null(strstr(p.why, "too few for IVF-PQ"));
    /* the repeats are bounded */
    dfm_audit_point_opts bad = {"Flat", DFM_METRIC_L2, D, K, 0, 0, 1, 0};
    assert_int_equal(dfm_audit_measure_point(&bad, keys, N, q, NQ, &p), DFM_EARG);
    dfm_error_clear();
    free(keys);
}

static void test_hidden_file(void **state) {
    (void)state;
    char dir[] = "/tmp/dfm-test-hidden-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = dfm_path_join(dir, "h.bin");
    const uint32_t D = 8;
    float keys[5 * 8];
    uint32_t vals[5] = {11, 12, 13, 14, DFM_HIDDEN_NO_NEXT};
    for (int i = 0; i < 5 * 8; i++) keys[i] = 0.125f * (float)i - 1.0f;
    dfm_hidden_writer *w;
    assert_int_equal(dfm_hidden_writer_open(path, D, &w), DFM_OK);
    assert_int_equal(dfm_hidden_writer_add(w, keys, vals, 2), DFM_OK);
    assert_int_equal(dfm_hidden_writer_add(w, keys + 2 * D, vals + 2, 3), DFM_OK);
    dfm_hidden_header meta = {.seq_len = 64, .tokens_read = 6, .unseen = 1, .backbone_hash = 0xabc, .tokens_hash = 0xdef};
    assert_int_equal(dfm_hidden_writer_close(w, &meta), DFM_OK);
    dfm_hidden_file *f;
    assert_int_equal(dfm_hidden_open(path, &f), DFM_OK);
    assert_int_equal(f->hdr.n_keys, 5);
    assert_int_equal(f->hdr.dim, D);
    assert_int_equal(f->hdr.unseen, 1);
    assert_int_equal(f->hdr.backbone_hash, 0xabc);
    assert_memory_equal(f->keys, keys, sizeof keys);
    assert_memory_equal(f->values, vals, sizeof vals);
    dfm_hidden_close(f);
    /* one flipped payload byte, a cut file, a flipped header byte: refused, naming the file */
    char *buf;
    size_t n;
    assert_int_equal(dfm_read_file(path, &buf, &n), DFM_OK);
    assert_int_equal(n, 128 + 5 * (D * 4 + 4));
    const struct {
        size_t at, len;
        int code;
    } cases[] = {{200, n, DFM_ECHECKSUM}, {0, n - 4, DFM_ETRUNCATED}, {20, n, DFM_ECHECKSUM}, {0, 100, DFM_ETRUNCATED}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *b = malloc(n);
        memcpy(b, buf, n);
        if (cases[c].at) b[cases[c].at] ^= 1;
        assert_int_equal(dfm_write_file_atomic(path, b, cases[c].len), DFM_OK);
        assert_int_equal(dfm_hidden_open(path, &f), cases[c].code);
        assert_non_null(strstr(dfm_last_error(), "h.bin"));
        dfm_error_clear();
        free(b);
    }
    assert_int_equal(dfm_hidden_writer_open(path, 0, &w), DFM_EARG);
    dfm_error_clear();
    free(buf);
    unlink(path);
    rmdir(dir);
    free(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spread),      cmocka_unit_test(test_ivfpq_rule),
        cmocka_unit_test(test_measure_point), cmocka_unit_test(test_hidden_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
