/* Unit tests of the audit's layout arithmetic (audit_layout.h): the bytes it computes equal FAISS's own
 * serialisation of real indexes, for every family `dfm index` chooses (its three automatic choices, made by
 * dfm_index_plan_make) and the audit's token-level IVF-PQ, with full and sparse inverted lists, both metrics
 * and 4-bit PQ codes; and the operation counts follow the layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "pipeline/audit/audit.h"
#include "pipeline/audit/audit_layout.h"
#include "pipeline/audit/audit_scale.h"
#include "retriever/index.h"
#include "schemas/neighbor_shard.h"

#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* build factory over n keys of width d (trained on train_n of them), serialise it, and compare with the arithmetic */
static void check_family(const char *factory, uint32_t d, uint32_t metric, uint64_t train_n, uint64_t n) {
    uint64_t rows = n > train_n ? n : train_n;
    float *keys = malloc(sizeof(float) * d * (rows ? rows : 1));
    int64_t *ids = malloc(sizeof(int64_t) * (n ? n : 1));
    for (uint64_t i = 0; i < rows; i++) dfm_audit_key(0x1a7 + i, d, keys + i * d);
    for (uint64_t i = 0; i < n; i++) ids[i] = (int64_t)(i * 3 + 1);
    FaissIndex *idx = NULL;
    assert_int_equal(faiss_index_factory(&idx, (int)d, factory, metric == DFM_METRIC_IP ? METRIC_INNER_PRODUCT : METRIC_L2), 0);
    if (!faiss_Index_is_trained(idx)) assert_int_equal(faiss_Index_train(idx, (int64_t)train_n, keys), 0);
    if (n) assert_int_equal(faiss_Index_add_with_ids(idx, (int64_t)n, keys, ids), 0);
    uint8_t *buf = NULL;
    size_t got = 0;
    assert_int_equal(dfm_index_to_buffer(idx, &buf, &got), DFM_OK);
    dfm_audit_layout l;
    assert_int_equal(dfm_audit_layout_parse(factory, d, metric, &l), DFM_OK);
    uint64_t ne = dfm_audit_nonempty_lists(idx);
    double want = dfm_audit_layout_bytes(&l, n, ne);
    printf("  %-18s d %3u %s n %6llu (%llu of %llu lists hold keys): FAISS %zu bytes, layout %.0f\n", factory, d,
           metric == DFM_METRIC_IP ? "ip" : "l2", (unsigned long long)n, (unsigned long long)ne, (unsigned long long)l.nlist, got, want);
    assert_true(want == (double)got);
    free(buf);
    faiss_Index_free(idx);
    free(keys);
    free(ids);
}

static void test_flat(void **state) {
    (void)state;
    check_family("IDMap,Flat", 24, DFM_METRIC_L2, 0, 300);
    check_family("IDMap,Flat", 24, DFM_METRIC_IP, 0, 0);
    check_family("IDMap,Flat", 384, DFM_METRIC_IP, 0, 77);
}

static void test_ivf_flat(void **state) {
    (void)state;
    check_family("IVF16,Flat", 24, DFM_METRIC_L2, 640, 1000); /* every list holds keys: "full" sizes */
    check_family("IVF64,Flat", 16, DFM_METRIC_IP, 200, 10);   /* at most 10 of 64 lists: "sprs" sizes */
}

static void test_ivf_pq(void **state) {
    (void)state;
    check_family("IVF16,PQ8np", 32, DFM_METRIC_L2, 600, 2000);
    check_family("IVF32,PQ4x4np", 32, DFM_METRIC_IP, 300, 5); /* 2-byte codes of 4-bit sub-quantizers, sparse lists */
    check_family("IVF8,PQ16np", 64, DFM_METRIC_L2, 512, 900);
}

/* what dfm index chooses automatically, each of its three branches, and the audit's token-level rule */
static void test_dfm_index_choices(void **state) {
    (void)state;
    dfm_index_plan p;
    assert_int_equal(dfm_index_plan_make("auto", 500, 16, 1, 0, DFM_METRIC_IP, 0, &p), DFM_OK);
    assert_string_equal(p.factory, "IDMap,Flat");
    check_family(p.factory, 16, DFM_METRIC_IP, 0, 500);
    const uint64_t N = DFM_INDEX_FLAT_MAX + 1;
    assert_int_equal(dfm_index_plan_make("auto", N, 8, 1, 0, DFM_METRIC_IP, 0, &p), DFM_OK);
    assert_non_null(strstr(p.factory, ",Flat"));
    assert_int_equal(strncmp(p.factory, "IVF", 3), 0);
    check_family(p.factory, 8, DFM_METRIC_IP, 2 * p.nlist, N);
    assert_int_equal(dfm_index_plan_make("auto", N, 16, 1, 3u << 20, DFM_METRIC_L2, 0, &p), DFM_OK); /* full vectors do not fit 3 MiB */
    assert_non_null(strstr(p.factory, ",PQ"));
    check_family(p.factory, 16, DFM_METRIC_L2, 2 * p.nlist > 512 ? 2 * p.nlist : 512, N);
    char f[64], why[600];
    dfm_audit_ivfpq_factory(4000, 64, f, sizeof f, why, sizeof why);
    check_family(f, 64, DFM_METRIC_L2, 4000, 4000);
}

static void test_parse_and_ops(void **state) {
    (void)state;
    dfm_audit_layout l;
    assert_int_equal(dfm_audit_layout_parse("IVF4096,PQ64np", 1024, DFM_METRIC_L2, &l), DFM_OK);
    assert_true(l.family == DFM_AUDIT_IVF_PQ && l.nlist == 4096 && l.pq_m == 64 && l.pq_nbits == 8);
    assert_true(dfm_audit_layout_bytes_per_key(&l) == 72);
    /* 10^8 keys of 64-byte codes: at least 7.2 GB, the centroids and codebooks on top */
    double b = dfm_audit_layout_bytes(&l, 100000000ull, 4096);
    assert_true(b > 7.2e9 && b < 7.2e9 + 4096.0 * 1024 * 4 + 256.0 * 1024 * 4 + 1e5);
    const char *bad[] = {"HNSW32", "IDMap,HNSW32", "IVF16,SQ8", "IVF16,PQ7", "PCA32,IVF16,Flat", "Flat", "IVF,Flat", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(dfm_audit_layout_parse(bad[i], 64, DFM_METRIC_L2, &l), DFM_EARG);
        assert_non_null(strstr(dfm_last_error(), "HINT"));
        dfm_error_clear();
    }
    /* search operations: Flat scans everything; IVF-PQ scans nprobe lists of n/nlist codes of m bytes */
    dfm_audit_search_ops o;
    assert_int_equal(dfm_audit_layout_parse("IDMap,Flat", 384, DFM_METRIC_IP, &l), DFM_OK);
    dfm_audit_search_ops_of(&l, 1000, 0, 32, &o);
    assert_true(o.scanned == 1000 && o.flops == 384000 && o.codes == 1000 + 32 * 5);
    assert_int_equal(dfm_audit_layout_parse("IVF1024,PQ16np", 64, DFM_METRIC_L2, &l), DFM_OK);
    dfm_audit_search_ops_of(&l, 1048576, 32, 1024, &o);
    assert_true(o.scanned == 32 * 1024 && o.codes == 32 * 1024 * 16 + 1024 * 10);
    assert_true(o.flops == 1024 * 64 + 256 * 64 + 32 * 256 * 16);
    dfm_audit_search_ops_of(&l, 1048576, 5000, 1024, &o); /* nprobe capped at the lists */
    assert_true(o.scanned == 1048576);
    dfm_audit_build_ops bo;
    dfm_audit_build_ops_of(&l, 1e6, 39936, &bo);
    assert_true(bo.train == 25 * (39936.0 * 1024 * 64 + 39936.0 * 256 * 64));
    assert_true(bo.add == 1e6 * (64 + 1024 * 64 + 256 * 64));
}

void openblas_set_num_threads(int n); /* cblas.h of some OpenBLAS builds lacks the prototype */

int main(void) {
    /* one thread: on a shared machine FAISS's parallel regions wait for descheduled threads (2 s become 50) */
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flat), cmocka_unit_test(test_ivf_flat), cmocka_unit_test(test_ivf_pq),
        cmocka_unit_test(test_dfm_index_choices), cmocka_unit_test(test_parse_and_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
