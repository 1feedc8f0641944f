/* Unit tests of the retriever core: ordering and merging, exclusions, queries, per-shard top-K with
 * padding and ties, index choice ('np' added to PQs, fast-scan refused, L2's precomputed table counted),
 * training-point errors, index files (round trip, corrupted, mismatched), the neighbour block format,
 * k-means, PQ codebooks put into a FAISS index, whole lists moved through the serialisation, and search
 * with given probe lists (never routed for fast-scan). One MPI rank, no run directory: in-memory corpora. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "retriever/index.h"
#include "retriever/ivf.h"
#include "retriever/ivf_lists_kind.h"
#include "retriever/kmeans.h"
#include "retriever/retrieve.h"
#include "retriever/topk.h"
#include "schemas/neighbor_shard.h"

#include <faiss/c_api/IndexIVF_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

static int setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dfm-test-retriever-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}
static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

/* ---- a tiny corpus ---- */

typedef struct {
    uint32_t n, dim, cps;
    float *x;
    dfm_chunk_meta *meta;
    dfm_matrix mat;
    dfm_vec_source vs;
    dfm_chunk_source cs;
} corpus;

static uint64_t rng_state = 42;
static double urand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* n chunks, sequences of cps chunks, documents of 3 chunks (doc d = chunks [3d, 3d+2]) */
static void corpus_make(corpus *c, uint32_t n, uint32_t dim, uint32_t cps, int normalise) {
    c->n = n;
    c->dim = dim;
    c->cps = cps;
    c->x = malloc(sizeof(float) * n * dim);
    c->meta = calloc(n, sizeof *c->meta);
    for (uint32_t i = 0; i < n; i++) {
        double s = 0;
        for (uint32_t t = 0; t < dim; t++) {
            c->x[i * dim + t] = (float)(urand() * 2 - 1);
            s += c->x[i * dim + t] * c->x[i * dim + t];
        }
        if (normalise)
            for (uint32_t t = 0; t < dim; t++) c->x[i * dim + t] = (float)(c->x[i * dim + t] / sqrt(s));
        c->meta[i].doc_first = c->meta[i].doc_last = i / 3;
        c->meta[i].n_valid = 32;
        c->meta[i].flags = (i % cps == 0) ? DFM_CHUNK_SEQ_START : 0;
    }
    c->mat = (dfm_matrix){c->x, dim, n};
    c->vs = (dfm_vec_source){dim, n, dfm_vec_source_matrix_rows, &c->mat, NULL};
    c->cs = (dfm_chunk_source){n, cps, dfm_chunk_source_array_meta, c->meta};
}
static void corpus_free(corpus *c) {
    free(c->x);
    free(c->meta);
}

/* ---- ordering ---- */

static void test_order_and_merge(void **state) {
    (void)state;
    dfm_hit h[] = {{5, 0.5f, 0}, {3, 0.9f, 0}, {7, 0.5f, 0}, {1, 0.1f, 0}, {2, 0.5f, 0}};
    dfm_hits_sort(h, 5, DFM_METRIC_IP);
    int64_t want_ip[] = {3, 2, 5, 7, 1}; /* ties by id ascending */
    for (int i = 0; i < 5; i++) assert_int_equal(h[i].id, want_ip[i]);
    dfm_hits_sort(h, 5, DFM_METRIC_L2);
    int64_t want_l2[] = {1, 2, 5, 7, 3};
    for (int i = 0; i < 5; i++) assert_int_equal(h[i].id, want_l2[i]);

    /* merge of three sorted lists, IP and L2 */
    dfm_hit a[] = {{10, 0.9f, 0}, {4, 0.5f, 0}}, b[] = {{2, 0.9f, 0}, {8, 0.7f, 0}, {9, 0.1f, 0}}, c[] = {{6, 0.5f, 0}};
    const dfm_hit *lists[] = {a, b, c};
    size_t lens[] = {2, 3, 1};
    dfm_hit out[4];
    assert_int_equal(dfm_hits_merge(lists, lens, 3, 4, DFM_METRIC_IP, out), 4);
    int64_t want_m[] = {2, 10, 8, 4};
    for (int i = 0; i < 4; i++) assert_int_equal(out[i].id, want_m[i]);
    dfm_hit la[] = {{3, 0.1f, 0}, {1, 2.0f, 0}}, lb[] = {{2, 0.1f, 0}, {5, 0.2f, 0}};
    const dfm_hit *l2lists[] = {la, lb};
    size_t l2lens[] = {2, 2};
    assert_int_equal(dfm_hits_merge(l2lists, l2lens, 2, 8, DFM_METRIC_L2, out), 4);
    int64_t want_l[] = {2, 3, 5, 1};
    for (int i = 0; i < 4; i++) assert_int_equal(out[i].id, want_l[i]);

    /* rows: padding with -1 and cleared mask bits, never a real entry */
    int64_t ids[4];
    float sc[4];
    uint64_t mask;
    assert_int_equal(dfm_hits_to_row(out, 2, 4, ids, sc, &mask), 2);
    assert_int_equal(mask, 0x3);
    assert_int_equal(ids[2], -1);
    assert_int_equal(ids[3], -1);
    assert_true(sc[3] == 0.0f);
}

static void test_exact_score(void **state) {
    (void)state;
    float x[] = {1, 2, 3}, y[] = {4, -5, 6};
    assert_true(dfm_exact_score(x, y, 3, DFM_METRIC_IP) == 12.0f);
    assert_true(dfm_exact_score(x, y, 3, DFM_METRIC_L2) == 9.0f + 49.0f + 9.0f);
}

/* ---- exclusions and queries ---- */

static void test_exclusions(void **state) {
    (void)state;
    corpus c;
    corpus_make(&c, 24, 4, 8, 1);
    /* chunk 11: sequence 1 (chunks 8..15), document 3 (9..11); window 2 -> sources 9, 10 */
    dfm_query q;
    float v[4];
    assert_int_equal(dfm_query_build(&c.vs, &c.cs, 11, 2, &q, v), 1);
    assert_int_equal(q.chunk_id, 11);
    assert_int_equal(q.src_first, 9);
    assert_int_equal(q.doc_lo, 3);
    assert_int_equal(q.doc_hi, 3);
    struct {
        uint32_t policy;
        uint64_t cand;
        int excluded;
    } cases[] = {
        {DFM_EXCLUDE_NONE, 11, 0},     {DFM_EXCLUDE_NONE, 10, 0},     {DFM_EXCLUDE_SELF, 11, 1},     {DFM_EXCLUDE_SELF, 10, 1},
        {DFM_EXCLUDE_SELF, 9, 1},      {DFM_EXCLUDE_SELF, 8, 0},      {DFM_EXCLUDE_SELF, 12, 0},     {DFM_EXCLUDE_SEQUENCE, 8, 1},
        {DFM_EXCLUDE_SEQUENCE, 15, 1}, {DFM_EXCLUDE_SEQUENCE, 16, 0}, {DFM_EXCLUDE_SEQUENCE, 7, 0},  {DFM_EXCLUDE_DOCUMENT, 10, 1},
        {DFM_EXCLUDE_DOCUMENT, 8, 0},  {DFM_EXCLUDE_DOCUMENT, 12, 0}, {DFM_EXCLUDE_DOCUMENT, 11, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(dfm_excluded(cases[i].policy, &q, cases[i].cand, &c.meta[cases[i].cand], 8), cases[i].excluded);
    /* a chunk spanning documents 4..5 overlaps a query touching document 5 */
    c.meta[12].doc_last = 5;
    dfm_query q2 = {17, 16, 5, 5};
    assert_int_equal(dfm_excluded(DFM_EXCLUDE_DOCUMENT, &q2, 12, &c.meta[12], 8), 1);
    assert_int_equal(dfm_excluded(DFM_EXCLUDE_SEQUENCE, &q2, 12, &c.meta[12], 8), 0);
    /* all-padding chunks are never neighbours, whatever the policy */
    c.meta[20].n_valid = 0;
    assert_int_equal(dfm_excluded(DFM_EXCLUDE_NONE, &q, 20, &c.meta[20], 8), 1);
    assert_int_equal(dfm_exclude_parse("document"), DFM_EXCLUDE_DOCUMENT);
    assert_int_equal(dfm_exclude_parse("doc"), -1);
    corpus_free(&c);
}

static void test_queries(void **state) {
    (void)state;
    corpus c;
    corpus_make(&c, 16, 4, 8, 1);
    dfm_query q;
    float v[4];
    /* first chunk of each sequence: no query */
    assert_int_equal(dfm_query_build(&c.vs, &c.cs, 0, 1, &q, v), 0);
    assert_int_equal(dfm_query_build(&c.vs, &c.cs, 8, 1, &q, v), 0);
    /* window 1: the previous chunk's embedding as stored */
    assert_int_equal(dfm_query_build(&c.vs, &c.cs, 9, 1, &q, v), 1);
    assert_memory_equal(v, c.x + 8 * 4, sizeof v);
    /* window 3 at chunk 10 stops at the sequence start: mean of 8, 9 renormalised */
    assert_int_equal(dfm_query_build(&c.vs, &c.cs, 10, 3, &q, v), 1);
    assert_int_equal(q.src_first, 8);
    double m[4], nrm = 0;
    for (int t = 0; t < 4; t++) {
        m[t] = (double)c.x[8 * 4 + t] + c.x[9 * 4 + t];
        nrm += m[t] * m[t];
    }
    for (int t = 0; t < 4; t++) assert_float_equal(v[t], m[t] / sqrt(nrm), 1e-6);
    /* an all-padding chunk has no query; a padding source is left out */
    c.meta[12].n_valid = 0;
    assert_int_equal(dfm_query_build(&c.vs, &c.cs, 12, 1, &q, v), 0);
    assert_int_equal(dfm_query_build(&c.vs, &c.cs, 13, 1, &q, v), 0);
    assert_int_equal(dfm_query_build(&c.vs, &c.cs, 14, 2, &q, v), 1);
    assert_memory_equal(v, c.x + 13 * 4, sizeof v); /* mean of one vector, unit norm already */
    corpus_free(&c);
}

/* ---- per-shard top-K ---- */

/* brute-force reference: best k eligible by exact score, then id */
static uint32_t reference_topk(const corpus *c, const dfm_query *q, const float *qv, uint32_t k, uint32_t metric, uint32_t policy,
                               uint64_t lo, uint64_t hi, dfm_hit *out) {
    dfm_hit *all = malloc(sizeof *all * c->n);
    size_t na = 0;
    for (uint64_t i = lo; i < hi; i++) {
        if (dfm_excluded(policy, q, i, &c->meta[i], c->cps)) continue;
        all[na].id = (int64_t)i;
        all[na].score = dfm_exact_score(qv, c->x + i * c->dim, c->dim, metric);
        na++;
    }
    dfm_hits_sort(all, na, metric);
    uint32_t n = na < k ? (uint32_t)na : k;
    memcpy(out, all, n * sizeof *out);
    free(all);
    return n;
}

/* dfm_count_excluded against a count over every id: excluded, indexed, and ranked before the K-th
 * kept neighbour. A long document (chunks 40..90, across sequences, with a padding chunk inside) and
 * a chunk spanning two documents exercise the document span. */
static void test_count_excluded(void **state) {
    (void)state;
    corpus c;
    corpus_make(&c, 200, 8, 8, 1);
    for (uint32_t i = 40; i <= 90; i++) c.meta[i].doc_first = c.meta[i].doc_last = 14;
    c.meta[95].doc_last = 32;
    c.meta[47].n_valid = 0; /* a padding chunk carries no document: its doc fields are not read */
    c.meta[47].doc_first = c.meta[47].doc_last = 0;
    c.meta[119].n_valid = 0;
    const uint32_t k = 4;
    dfm_hit kept[4];
    uint64_t checked = 0, total = 0;
    for (uint32_t metric = DFM_METRIC_IP; metric <= DFM_METRIC_L2; metric++)
        for (uint32_t policy = DFM_EXCLUDE_NONE; policy <= DFM_EXCLUDE_DOCUMENT; policy++)
            for (uint32_t window = 1; window <= 2; window++)
                for (uint64_t i = 0; i < c.n; i++) {
                    dfm_query q;
                    float v[8];
                    if (dfm_query_build(&c.vs, &c.cs, i, window, &q, v) != 1) continue;
                    uint32_t nk = reference_topk(&c, &q, v, k, metric, policy, 0, c.n, kept);
                    uint64_t want = 0, got = 99;
                    for (uint64_t j = 0; j < c.n; j++) {
                        if (c.meta[j].n_valid == 0 || !dfm_excluded(policy, &q, j, &c.meta[j], c.cps)) continue;
                        dfm_hit h = {(int64_t)j, dfm_exact_score(v, c.x + j * 8, 8, metric), 0};
                        want += nk < k || dfm_hit_before(&h, &kept[k - 1], metric);
                    }
                    dfm_search_params p = {k, 4, metric, policy, 0};
                    assert_int_equal(dfm_count_excluded(&p, &q, v, kept, nk, &c.vs, &c.cs, &got), 0);
                    assert_int_equal(got, want);
                    checked++;
                    total += got;
                }
    assert_true(checked > 1000 && total > 0);
    corpus_free(&c);
}

static void check_shard_topk(uint32_t metric, int use_faiss, int duplicates) {
    corpus c;
    corpus_make(&c, 600, 16, 8, metric == DFM_METRIC_IP);
    if (duplicates) /* exact ties: 40 copies of one vector, more than k + margin */
        for (uint32_t i = 100; i < 140; i++) memcpy(c.x + i * 16, c.x + 50 * 16, sizeof(float) * 16);
    const uint32_t k = 8;
    dfm_bf_ctx bf = {&c.vs, 0, c.n, metric};
    dfm_shard_searcher s = {dfm_bf_search, &bf, c.n, 1};
    FaissIndex *idx = NULL;
    if (use_faiss) {
        dfm_index_plan plan;
        assert_int_equal(dfm_index_plan_make("Flat", c.n, 16, 1, 0, metric, 0, &plan), 0);
        assert_string_equal(plan.factory, "IDMap,Flat");
        assert_int_equal(dfm_index_create(&plan, 16, &idx), 0);
        int64_t *ids = malloc(sizeof *ids * c.n);
        for (uint32_t i = 0; i < c.n; i++) ids[i] = i;
        assert_int_equal(faiss_Index_add_with_ids(idx, c.n, c.x, ids), 0);
        free(ids);
        s = (dfm_shard_searcher){dfm_faiss_search, idx, c.n, 1};
    }
    dfm_query qs[60];
    float qv[60 * 16];
    size_t nq = 0;
    for (uint64_t i = 1; i < c.n && nq < 60; i += 10)
        if (dfm_query_build(&c.vs, &c.cs, i, 1, &qs[nq], qv + nq * 16) == 1) nq++;
    if (duplicates) { /* queries equal to the duplicated vector */
        memcpy(qv, c.x + 50 * 16, sizeof(float) * 16);
        memcpy(qv + 16, c.x + 50 * 16, sizeof(float) * 16);
    }
    for (uint32_t policy = 0; policy <= DFM_EXCLUDE_DOCUMENT; policy++) {
        dfm_search_params p = {k, 2, metric, policy, 0};
        dfm_hit out[60 * 8], ref[8];
        uint32_t n_out[60];
        dfm_search_counts cnt = {0};
        assert_int_equal(dfm_shard_topk(&s, &p, NULL, qs, qv, nq, &c.vs, &c.cs, out, n_out, &cnt), 0);
        for (size_t q = 0; q < nq; q++) {
            uint32_t nr = reference_topk(&c, &qs[q], qv + q * 16, k, metric, policy, 0, c.n, ref);
            assert_int_equal(n_out[q], nr);
            for (uint32_t j = 0; j < nr; j++) {
                assert_int_equal(out[q * k + j].id, ref[j].id);
                assert_true(out[q * k + j].score == ref[j].score);
            }
        }
        if (duplicates) assert_true(cnt.researches > 0); /* ties forced a deeper search */
    }
    if (idx) faiss_Index_free(idx);
    corpus_free(&c);
}

static void test_shard_topk_bruteforce_ip(void **state) { (void)state; check_shard_topk(DFM_METRIC_IP, 0, 0); }
static void test_shard_topk_faiss_ip(void **state) { (void)state; check_shard_topk(DFM_METRIC_IP, 1, 0); }
static void test_shard_topk_faiss_l2(void **state) { (void)state; check_shard_topk(DFM_METRIC_L2, 1, 0); }
static void test_shard_topk_ties(void **state) { (void)state; check_shard_topk(DFM_METRIC_IP, 1, 1); }

static void test_padding_tiny_corpus(void **state) {
    (void)state;
    /* 10 chunks in one sequence: with --exclude sequence nothing survives; with self, 10 - 2 = 8 < k */
    corpus c;
    corpus_make(&c, 10, 4, 10, 1);
    dfm_bf_ctx bf = {&c.vs, 0, c.n, DFM_METRIC_IP};
    dfm_shard_searcher s = {dfm_bf_search, &bf, c.n, 1};
    dfm_query q;
    float v[4];
    assert_int_equal(dfm_query_build(&c.vs, &c.cs, 5, 1, &q, v), 1);
    c.meta[7].n_valid = 0; /* an all-padding chunk is never a neighbour */
    dfm_hit out[16];
    uint32_t n_out;
    dfm_search_counts cnt = {0};
    dfm_search_params p = {16, 0, DFM_METRIC_IP, DFM_EXCLUDE_SEQUENCE, 0};
    assert_int_equal(dfm_shard_topk(&s, &p, NULL, &q, v, 1, &c.vs, &c.cs, out, &n_out, &cnt), 0);
    assert_int_equal(n_out, 0);
    p.exclude = DFM_EXCLUDE_SELF;
    assert_int_equal(dfm_shard_topk(&s, &p, NULL, &q, v, 1, &c.vs, &c.cs, out, &n_out, &cnt), 0);
    assert_int_equal(n_out, 7); /* 10 minus self (5), source (4), padding (7) */
    for (uint32_t j = 0; j < n_out; j++) assert_true(out[j].id != 4 && out[j].id != 5 && out[j].id != 7);
    int64_t ids[16];
    float sc[16];
    uint64_t mask;
    assert_int_equal(dfm_hits_to_row(out, n_out, 16, ids, sc, &mask), 9);
    assert_int_equal(mask, 0x7f);
    dfm_nbr_row row = {5, 16, ids, sc, mask};
    assert_int_equal(dfm_nbr_row_check(&row, DFM_METRIC_IP, 10), 0);
    /* with margin 0 and k 2 the first search is too shallow after exclusions: it searches again */
    p.k = 2;
    p.exclude = DFM_EXCLUDE_SELF;
    cnt = (dfm_search_counts){0};
    dfm_query q9;
    assert_int_equal(dfm_query_build(&c.vs, &c.cs, 9, 1, &q9, v), 1);
    memcpy(v, c.x + 8 * 4, sizeof v); /* the query is chunk 8, which is excluded, as is 9 */
    assert_int_equal(dfm_shard_topk(&s, &p, NULL, &q9, v, 1, &c.vs, &c.cs, out, &n_out, &cnt), 0);
    assert_int_equal(n_out, 2);
    assert_true(cnt.researches >= 1);
    corpus_free(&c);
}

/* ---- index choice and training errors ---- */

static void test_index_plan(void **state) {
    (void)state;
    dfm_index_plan p;
    assert_int_equal(dfm_index_plan_make(NULL, 5000, 384, 1, 0, DFM_METRIC_IP, 0, &p), 0);
    assert_string_equal(p.factory, "IDMap,Flat");
    assert_int_equal(p.train_n, 0);
    assert_true(p.exact_scores);
    assert_int_equal(dfm_index_plan_make("auto", 1000000, 384, 2, 4ull << 30, DFM_METRIC_IP, 0, &p), 0);
    assert_string_equal(p.factory, "IVF4000,Flat"); /* 4 * sqrt(1e6) */
    assert_int_equal(p.nlist, 4000);
    assert_int_equal(p.train_n, 400000); /* 100 per list */
    assert_non_null(strstr(p.why, "IVF4000"));
    /* a budget too small for full vectors: PQ */
    assert_int_equal(dfm_index_plan_make(NULL, 1000000, 384, 1, 100ull << 20, DFM_METRIC_IP, 0, &p), 0);
    assert_non_null(strstr(p.factory, ",PQ"));
    assert_false(p.exact_scores);
    assert_true(p.bytes_per_rank > 0);
    /* nothing fits */
    assert_int_equal(dfm_index_plan_make(NULL, 1000000000, 384, 1, 1 << 20, DFM_METRIC_IP, 0, &p), DFM_EARG);
    assert_non_null(strstr(dfm_last_error(), "--index-memory"));
    /* too few training points for the lists: a clear error before any work */
    assert_int_equal(dfm_index_plan_make("IVF1024,Flat", 500, 64, 1, 0, DFM_METRIC_IP, 0, &p), DFM_EARG);
    assert_non_null(strstr(dfm_last_error(), "needs at least 1024 training points"));
    assert_non_null(strstr(dfm_last_error(), "HINT"));
    assert_int_equal(dfm_index_plan_make("IVF64,Flat", 50000, 64, 1, 0, DFM_METRIC_IP, 10, &p), DFM_EARG);
    assert_int_equal(dfm_index_plan_make("IVF64,Flat", 50000, 64, 1, 0, DFM_METRIC_IP, 0, &p), 0);
    assert_int_equal(p.train_n, 6400);
    assert_int_equal(dfm_index_plan_make("IVF16,PQ8", 200, 64, 1, 0, DFM_METRIC_IP, 0, &p), DFM_EARG); /* 256 PQ centroids */
    assert_int_equal(dfm_index_plan_make("IVF16,PQ7", 20000, 64, 1, 0, DFM_METRIC_IP, 0, &p), DFM_EARG); /* 7 does not divide 64 */
    assert_int_equal(dfm_index_plan_make("HNSW16", 100, 8, 1, 0, DFM_METRIC_L2, 0, &p), 0);
    assert_string_equal(p.factory, "IDMap,HNSW16");
    /* no polysemous training: 'np' after every plain PQ, other forms untouched */
    static const char *const np_in[] = {"IVF16,PQ8", "PQ8", "IVF16,PQ8x4", "HNSW16_PQ8", "OPQ8_64,IVF16,PQ8", "IVF16,PQ8np", "IVF16,PQ8+4"};
    static const char *const np_out[] = {"IVF16,PQ8np", "IDMap,PQ8np", "IVF16,PQ8x4np", "IDMap,HNSW16_PQ8np", "OPQ8_64,IVF16,PQ8np",
                                          "IVF16,PQ8np", "IVF16,PQ8+4"};
    for (size_t i = 0; i < sizeof np_in / sizeof np_in[0]; i++) {
        assert_int_equal(dfm_index_plan_make(np_in[i], 20000, 64, 1, 0, DFM_METRIC_IP, 0, &p), 0);
        assert_string_equal(p.factory, np_out[i]);
        assert_true((strstr(p.why, "polysemous") != NULL) == (strcmp(np_in[i] + strlen(np_in[i]) - 2, "np") && !strchr(np_in[i], '+') &&
                                                             !strstr(np_in[i], "fs")));
    }
    assert_int_equal(dfm_index_plan_make("IVF8,Flat", 100, 8, 1, 0, DFM_METRIC_IP, 500, &p), DFM_EARG); /* sample > n */
    /* an unusable factory string is a FAISS error naming the string */
    assert_int_equal(dfm_index_plan_make("Bogus99", 1000, 8, 1, 0, DFM_METRIC_IP, 0, &p), 0);
    FaissIndex *idx = NULL;
    assert_int_equal(dfm_index_create(&p, 8, &idx), DFM_EFAISS);
    assert_non_null(strstr(dfm_last_error(), "Bogus99"));
    assert_null(idx);
}

/* fast-scan PQ is refused before any work, saying why (the crash, the missing AVX2) and what to use */
static void test_index_plan_fast_scan(void **state) {
    (void)state;
    dfm_index_plan p;
    static const char *const fs[] = {"IVF16,PQ8x4fs", "IVF16,PQ16x4fsr", "PQ8x4fs", "IVF16,PQ8x4fs,RFlat", "OPQ8_64,IVF16,PQ8x4fs_64"};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
        dfm_error_clear();
        assert_int_equal(dfm_index_plan_make(fs[i], 20000, 64, 1, 0, DFM_METRIC_IP, 0, &p), DFM_EARG);
        const char *e = dfm_last_error();
        assert_non_null(strstr(e, fs[i]));
        assert_non_null(strstr(e, "fast-scan"));
        assert_non_null(strstr(e, "search_preassigned"));
        assert_non_null(strstr(e, "AVX2"));
        assert_non_null(strstr(e, "HINT"));
    }
    /* the hint names the plain 8-bit PQ to use, and the one of the same bytes */
    assert_int_equal(dfm_index_plan_make("IVF16,PQ16x4fs", 20000, 64, 1, 0, DFM_METRIC_L2, 0, &p), DFM_EARG);
    assert_non_null(strstr(dfm_last_error(), "with 'PQ16np'"));
    assert_non_null(strstr(dfm_last_error(), "PQ8np for the same 8 bytes"));
    /* not fast-scan: accepted */
    static const char *const ok[] = {"IVF16,PQ8x4", "IVF16,PQ8np", "IVF16,Flat", "IVF16,SQfp16"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) assert_int_equal(dfm_index_plan_make(ok[i], 20000, 64, 1, 0, DFM_METRIC_IP, 0, &p), 0);
}

/* L2 IVF-PQ: FAISS's precomputed table (nlist x M x 2^nbits floats) is in the memory plan while FAISS builds
 * it (<= 2 GiB), and not above; inner product needs none; the automatic choice makes room for it */
static void test_index_plan_l2_table(void **state) {
    (void)state;
    dfm_index_plan ip, l2;
    assert_int_equal(dfm_index_plan_make("IVF1000,PQ16", 1000000, 64, 1, 0, DFM_METRIC_IP, 0, &ip), 0);
    assert_int_equal(ip.l2_table_bytes, 0);
    assert_int_equal(dfm_index_plan_make("IVF1000,PQ16", 1000000, 64, 1, 0, DFM_METRIC_L2, 0, &l2), 0);
    assert_int_equal(l2.l2_table_bytes, 1000ull * 16 * 256 * 4);
    assert_true(l2.l2_table_used);
    assert_int_equal(l2.bytes_per_rank, ip.bytes_per_rank + l2.l2_table_bytes);
    assert_non_null(strstr(l2.why, "precomputed table"));
    assert_int_equal(dfm_index_plan_make("IVF1000,PQ16x6", 1000000, 64, 1, 0, DFM_METRIC_L2, 0, &l2), 0);
    assert_int_equal(l2.l2_table_bytes, 1000ull * 16 * 64 * 4); /* 2^nbits */
    assert_int_equal(dfm_index_plan_make("IVF1000,Flat", 1000000, 64, 1, 0, DFM_METRIC_L2, 0, &l2), 0);
    assert_int_equal(l2.l2_table_bytes, 0);
    /* the paper's PQ48 x 50,000 lists: 2.46 GB, over FAISS's cap: not built, not counted, said in the plan */
    assert_int_equal(dfm_index_plan_make("IVF50000,PQ48", 100000000, 384, 64, 0, DFM_METRIC_IP, 0, &ip), 0);
    assert_int_equal(dfm_index_plan_make("IVF50000,PQ48", 100000000, 384, 64, 0, DFM_METRIC_L2, 0, &l2), 0);
    assert_int_equal(l2.l2_table_bytes, 50000ull * 48 * 256 * 4);
    assert_false(l2.l2_table_used);
    assert_int_equal(l2.bytes_per_rank, ip.bytes_per_rank);
    assert_non_null(strstr(l2.why, "over its 2 GiB cap"));
    assert_int_equal(dfm_index_plan_make("IVF50000,PQ32", 100000000, 384, 64, 0, DFM_METRIC_L2, 0, &l2), 0);
    assert_true(l2.l2_table_used); /* 1.64 GB: built */
    /* auto, 1e6 vectors of 384 in 150 MB: PQ128 for inner product; for L2 its 524 MB table does not fit */
    assert_int_equal(dfm_index_plan_make("auto", 1000000, 384, 1, 150000000, DFM_METRIC_IP, 0, &ip), 0);
    assert_string_equal(ip.factory, "IVF4000,PQ128np");
    assert_int_equal(dfm_index_plan_make("auto", 1000000, 384, 1, 150000000, DFM_METRIC_L2, 0, &l2), 0);
    assert_string_equal(l2.factory, "IVF4000,PQ24np"); /* 1e6 x 32 + 4000 x 384 x 4 + 4000 x 24 x 1024 <= 150 MB */
    assert_int_equal(l2.l2_table_bytes, 4000ull * 24 * 256 * 4);
}

static void test_sample_ids(void **state) {
    (void)state;
    uint64_t a[100], b[100];
    dfm_sample_ids(1000, 100, 7, a);
    dfm_sample_ids(1000, 100, 7, b);
    assert_memory_equal(a, b, sizeof a);
    /* a rank's part of the sample, drawn alone, is that part of the whole */
    uint64_t part[30];
    dfm_sample_ids_range(1000, 100, 7, 40, 70, part);
    assert_memory_equal(part, a + 40, sizeof part);
    for (int i = 0; i < 100; i++) {
        assert_true(a[i] >= (uint64_t)i * 10 && a[i] < (uint64_t)(i + 1) * 10);
        if (i) assert_true(a[i] > a[i - 1]);
    }
    dfm_sample_ids(1000, 100, 8, b);
    assert_true(memcmp(a, b, sizeof a) != 0);
    dfm_sample_ids(5, 5, 1, a);
    for (int i = 0; i < 5; i++) assert_int_equal(a[i], i);
}

/* ---- index files ---- */

static void write_small_index(const char *path, uint32_t metric, dfm_index_info *info) {
    corpus c;
    corpus_make(&c, 300, 8, 10, 1);
    dfm_index_plan plan;
    assert_int_equal(dfm_index_plan_make("IVF4,Flat", c.n, 8, 1, 0, metric, 0, &plan), 0);
    FaissIndex *idx = NULL;
    assert_int_equal(dfm_index_create(&plan, 8, &idx), 0);
    assert_int_equal(faiss_Index_train(idx, c.n, c.x), 0);
    /* the trained empty index survives a round trip through a buffer */
    uint8_t *buf;
    size_t n;
    assert_int_equal(dfm_index_to_buffer(idx, &buf, &n), 0);
    FaissIndex *copy = NULL;
    assert_int_equal(dfm_index_from_buffer(buf, n, &copy), 0);
    free(buf);
    faiss_Index_free(idx);
    int64_t ids[300];
    for (int i = 0; i < 300; i++) ids[i] = 1000 + i;
    assert_int_equal(faiss_Index_add_with_ids(copy, c.n, c.x, ids), 0);
    memset(info, 0, sizeof *info);
    info->dim = 8;
    info->metric = metric;
    snprintf(info->factory, sizeof info->factory, "%s", plan.factory);
    info->ntotal = 300;
    info->first_id = 1000;
    info->end_id = 1300;
    info->n_shards = 1;
    info->exact_scores = 1;
    assert_int_equal(dfm_index_write(path, copy, info), 0);
    faiss_Index_free(copy);
    corpus_free(&c);
}

static void test_index_files(void **state) {
    (void)state;
    char *path = dfm_strdupf("%s/index-00000.faiss", tmpdir);
    dfm_index_info info, got;
    write_small_index(path, DFM_METRIC_IP, &info);
    FaissIndex *idx = NULL;
    assert_int_equal(dfm_index_load(path, 8, DFM_METRIC_IP, &idx, &got), 0);
    assert_int_equal(got.ntotal, 300);
    assert_int_equal(got.first_id, 1000);
    assert_string_equal(got.xxh128, info.xxh128);
    assert_int_equal(faiss_Index_ntotal(idx), 300);
    faiss_Index_free(idx);
    /* wrong dimension, wrong metric: clear errors naming the file */
    assert_int_equal(dfm_index_load(path, 16, DFM_METRIC_IP, &idx, &got), DFM_EMISMATCH);
    assert_non_null(strstr(dfm_last_error(), "index-00000.faiss"));
    assert_non_null(strstr(dfm_last_error(), "dimension 8"));
    assert_null(idx);
    assert_int_equal(dfm_index_load(path, 8, DFM_METRIC_L2, &idx, &got), DFM_EMISMATCH);
    assert_non_null(strstr(dfm_last_error(), "metric ip"));
    /* one flipped byte: checksum error naming the file */
    FILE *f = fopen(path, "r+b");
    fseek(f, 200, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, 200, SEEK_SET);
    fputc(ch ^ 0x5a, f);
    fclose(f);
    assert_int_equal(dfm_index_load(path, 8, DFM_METRIC_IP, &idx, &got), DFM_ECHECKSUM);
    assert_non_null(strstr(dfm_last_error(), "index-00000.faiss"));
    /* truncated */
    write_small_index(path, DFM_METRIC_IP, &info);
    assert_int_equal(truncate(path, 100), 0);
    assert_int_equal(dfm_index_load(path, 8, DFM_METRIC_IP, &idx, &got), DFM_ETRUNCATED);
    /* an index whose sidecar lies about the metric (a file swapped in from another run) */
    write_small_index(path, DFM_METRIC_L2, &info);
    char *side = dfm_strdupf("%s/index-00000.json", tmpdir);
    char *text;
    size_t n;
    assert_int_equal(dfm_read_file(side, &text, &n), 0);
    char *m = strstr(text, "\"l2\"");
    assert_non_null(m);
    memcpy(m, "\"ip\"", 4);
    assert_int_equal(dfm_write_file_atomic(side, text, n), 0);
    free(text);
    assert_int_equal(dfm_index_load(path, 8, DFM_METRIC_IP, &idx, &got), DFM_EMISMATCH);
    assert_non_null(strstr(dfm_last_error(), "its sidecar says"));
    /* missing sidecar */
    unlink(side);
    assert_int_equal(dfm_index_load(path, 8, -1, &idx, &got), DFM_ENOTFOUND);
    free(side);
    free(path);
}

static void test_set_param(void **state) {
    (void)state;
    dfm_index_plan plan;
    assert_int_equal(dfm_index_plan_make("IVF4,Flat", 1000, 8, 1, 0, DFM_METRIC_IP, 0, &plan), 0);
    FaissIndex *idx = NULL;
    assert_int_equal(dfm_index_create(&plan, 8, &idx), 0);
    assert_int_equal(dfm_index_set_param(idx, "nprobe", 2), 0);
    assert_int_equal(dfm_index_set_param(idx, "efSearch", 2), DFM_EARG);
    faiss_Index_free(idx);
}

/* ---- neighbour blocks ---- */

static void test_neighbor_block(void **state) {
    (void)state;
    char *path = dfm_strdupf("%s/nbr-000001.bin", tmpdir);
    for (uint32_t k = 3; k <= 4; k++) { /* odd K has a pad float: rows stay 8-byte aligned */
        dfm_nbr_header h = {0};
        h.k = k;
        h.metric = DFM_METRIC_IP;
        h.first_chunk = 10;
        h.n_rows = 3;
        h.n_chunks_total = 100;
        h.exclude = DFM_EXCLUDE_SEQUENCE;
        h.query_window = 1;
        dfm_nbr_writer *w;
        assert_int_equal(dfm_nbr_writer_open(path, &h, &w), 0);
        int64_t ids[4] = {5, 7, -1, -1}, none[4] = {-1, -1, -1, -1};
        float sc[4] = {0.9f, 0.9f, 0, 0}, zero[4] = {0};
        assert_int_equal(dfm_nbr_writer_add(w, none, zero, 0), 0);
        assert_int_equal(dfm_nbr_writer_add(w, ids, sc, 0x3), 0);
        int64_t bad[4] = {7, 5, -1, -1}; /* tie out of id order */
        assert_int_equal(dfm_nbr_writer_add(w, bad, sc, 0x3), DFM_EINTERNAL);
        int64_t hole[4] = {5, -1, 7, -1}; /* a real slot after an empty one */
        assert_int_equal(dfm_nbr_writer_add(w, hole, sc, 0x5), DFM_EINTERNAL);
        assert_int_equal(dfm_nbr_writer_add(w, ids, sc, 0x3), 0);
        assert_int_equal(dfm_nbr_writer_close(w), 0);
        dfm_nbr_block *b;
        assert_int_equal(dfm_nbr_block_open(path, &b), 0);
        assert_int_equal(b->hdr.row_bytes, dfm_nbr_row_bytes(k));
        assert_int_equal(b->hdr.row_bytes % 8, 0);
        dfm_nbr_row r = dfm_nbr_block_row(b, 1);
        assert_int_equal(r.chunk_id, 11);
        assert_int_equal(r.ids[1], 7);
        assert_true(r.scores[0] == 0.9f);
        assert_int_equal(r.mask, 0x3);
        assert_int_equal(dfm_nbr_block_row(b, 0).mask, 0);
        dfm_nbr_block_close(b);
    }
    /* damage: payload byte, header byte, truncation */
    uint64_t size;
    assert_int_equal(dfm_file_size(path, &size), 0);
    FILE *f = fopen(path, "r+b");
    fseek(f, 140, SEEK_SET);
    fputc(0x7f, f);
    fclose(f);
    dfm_nbr_block *b = NULL;
    assert_int_equal(dfm_nbr_block_open(path, &b), DFM_ECHECKSUM);
    assert_non_null(strstr(dfm_last_error(), "nbr-000001.bin"));
    f = fopen(path, "r+b");
    fseek(f, 16, SEEK_SET);
    fputc(0x7f, f);
    fclose(f);
    assert_int_equal(dfm_nbr_block_open(path, &b), DFM_ECHECKSUM);
    assert_int_equal(truncate(path, (off_t)size - 8), 0);
    assert_int_equal(dfm_nbr_block_open(path, &b), DFM_ECHECKSUM); /* header checked first, then sizes */
    dfm_nbr_header h = {0};
    h.k = 65;
    dfm_nbr_writer *w;
    assert_int_equal(dfm_nbr_writer_open(path, &h, &w), DFM_EARG);
    free(path);
}

/* ---- shard split independence (the distributed merge, on one rank) ---- */

static dfm_mpi g_mpi;

/* The same vectors as one shard or as three: dfm_dsearch must give identical rows, for an exact index
 * (Flat) and an approximate one (IVF-PQ: merge by the index's scores to k + margin, then exact re-rank). */
static void check_split(const char *factory, int approx, uint32_t policy) {
    corpus c;
    corpus_make(&c, 2000, 16, 20, 1);
    for (uint32_t i = 300; i < 330; i++) memcpy(c.x + i * 16, c.x + 7 * 16, sizeof(float) * 16); /* ties */
    dfm_index_plan plan;
    assert_int_equal(dfm_index_plan_make(factory, c.n, 16, 1, 0, DFM_METRIC_IP, 2000, &plan), 0);
    assert_int_equal(plan.exact_scores, !approx);
    FaissIndex *tr = NULL;
    assert_int_equal(dfm_index_create(&plan, 16, &tr), 0);
    if (plan.train_n) assert_int_equal(faiss_Index_train(tr, c.n, c.x), 0);
    uint8_t *buf;
    size_t nbuf;
    assert_int_equal(dfm_index_to_buffer(tr, &buf, &nbuf), 0);
    faiss_Index_free(tr);
    const uint64_t bounds[2][4] = {{0, 2000}, {0, 700, 1400, 2000}}; /* one shard, then three */
    const int nsh[] = {1, 3};
    dfm_hit *res[2];
    uint32_t *nres[2];
    dfm_query qs[80];
    float qv[80 * 16];
    size_t nq = 0;
    for (uint64_t i = 1; i < c.n && nq < 80; i += 25)
        if (dfm_query_build(&c.vs, &c.cs, i, 1, &qs[nq], qv + nq * 16) == 1) nq++;
    memcpy(qv, c.x + 7 * 16, sizeof(float) * 16);
    for (int v = 0; v < 2; v++) {
        FaissIndex *idx[3] = {0};
        dfm_shard_searcher ss[3];
        for (int s = 0; s < nsh[v]; s++) {
            uint64_t lo = bounds[v][s], hi = bounds[v][s + 1];
            assert_int_equal(dfm_index_from_buffer(buf, nbuf, &idx[s]), 0);
            int64_t *ids = malloc(sizeof *ids * (hi - lo));
            for (uint64_t i = lo; i < hi; i++) ids[i - lo] = (int64_t)i;
            assert_int_equal(faiss_Index_add_with_ids(idx[s], (idx_t)(hi - lo), c.x + lo * 16, ids), 0);
            free(ids);
            if (plan.nlist) assert_int_equal(dfm_index_set_param(idx[s], "nprobe", 2), 0);
            ss[s] = (dfm_shard_searcher){dfm_faiss_search, idx[s], hi - lo, plan.exact_scores};
        }
        dfm_search_params p = {8, 4, DFM_METRIC_IP, policy, approx};
        res[v] = malloc(sizeof(dfm_hit) * nq * 8);
        nres[v] = malloc(sizeof(uint32_t) * nq);
        dfm_search_counts cnt = {0};
        assert_int_equal(dfm_dsearch(&g_mpi, ss, nsh[v], NULL, NULL, &p, &c.vs, &c.cs, qs, qv, nq, res[v], nres[v], &cnt, NULL), 0);
        for (int s = 0; s < nsh[v]; s++) faiss_Index_free(idx[s]);
    }
    for (size_t q = 0; q < nq; q++) {
        assert_int_equal(nres[0][q], nres[1][q]);
        assert_true(nres[0][q] > 0);
        for (uint32_t j = 0; j < nres[0][q]; j++) {
            assert_int_equal(res[0][q * 8 + j].id, res[1][q * 8 + j].id);
            assert_true(res[0][q * 8 + j].score == res[1][q * 8 + j].score);
            if (j) assert_true(res[0][q * 8 + j].score <= res[0][q * 8 + j - 1].score); /* exact order */
        }
    }
    for (int v = 0; v < 2; v++) {
        free(res[v]);
        free(nres[v]);
    }
    free(buf);
    corpus_free(&c);
}

static void test_split_flat(void **state) { (void)state; check_split("Flat", 0, DFM_EXCLUDE_SEQUENCE); }
static void test_split_ivfpq(void **state) { (void)state; check_split("IVF4,PQ4np", 1, DFM_EXCLUDE_DOCUMENT); }


/* ---- k-means, codebooks in FAISS, lists through the serialisation, search with given lists ---- */

/* points around 8 well-separated centres: k-means finds them (each centroid within noise of a centre),
 * in any block split the same bits, an empty centroid is split from the largest, and the result does
 * not depend on the blocks' sizes as long as every block is computed the same way */
static void test_kmeans(void **state) {
    (void)state;
    const uint32_t dim = 8, k = 8, n = 4000;
    float *x = malloc(sizeof(float) * n * dim), centres[8 * 8];
    for (uint32_t c = 0; c < k; c++)
        for (uint32_t t = 0; t < dim; t++) centres[c * dim + t] = (t == c) ? 10.0f : 0.0f;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t t = 0; t < dim; t++) x[i * dim + t] = centres[(i % k) * dim + t] + (float)(urand() - 0.5) * 0.2f;
    uint64_t blocks[16], nb = 0;
    for (uint64_t i = 0; i < n; i += 256) blocks[nb++] = n - i < 256 ? n - i : 256;
    dfm_kmeans_opts o = {dim, 1, k, 10, 0, 0};
    float c1[64], c2[64];
    for (uint32_t c = 0; c < k; c++) memcpy(c1 + c * dim, x + c * dim, sizeof(float) * dim); /* one point of each cluster */
    memcpy(c2, c1, sizeof c1);
    dfm_work w;
    dfm_work_start(&w);
    double obj = 0;
    assert_int_equal(dfm_kmeans_train(&g_mpi, &o, x, dim, blocks, nb, n, c1, &obj, &w), 0);
    assert_int_equal(w.kmeans_distances, 10ull * n * k);
    for (uint32_t c = 0; c < k; c++) {
        double d = 0;
        for (uint32_t t = 0; t < dim; t++) d += (c1[c * dim + t] - centres[c * dim + t]) * (c1[c * dim + t] - centres[c * dim + t]);
        assert_true(d < 0.01);
    }
    assert_true(obj > 0 && obj < n * dim * 0.02);
    /* the same again: the same bits */
    assert_int_equal(dfm_kmeans_train(&g_mpi, &o, x, dim, blocks, nb, n, c2, NULL, NULL), 0);
    assert_memory_equal(c1, c2, sizeof c1);
    /* two centroids start on the same point: one is empty after the first assignment and is split */
    for (uint32_t c = 0; c < k; c++) memcpy(c2 + c * dim, x + c * dim, sizeof(float) * dim);
    memcpy(c2 + 1 * dim, c2, sizeof(float) * dim);
    assert_int_equal(dfm_kmeans_train(&g_mpi, &o, x, dim, blocks, nb, n, c2, NULL, NULL), 0);
    for (uint32_t c = 0; c < k; c++) assert_true(isfinite(c2[c * dim]));
    assert_true(memcmp(c2, c2 + dim, sizeof(float) * dim) != 0);
    /* non-finite input: refused */
    x[5] = NAN;
    assert_int_equal(dfm_kmeans_train(&g_mpi, &o, x, dim, blocks, nb, n, c2, NULL, NULL), DFM_EARG);
    free(x);
}

/* codebooks trained outside FAISS, put into an IVF-PQ index: a vector that is a centroid plus one
 * codeword per sub-space is encoded exactly, so FAISS reconstructs it */
static void test_ivf_pq_codebooks(void **state) {
    (void)state;
    const uint32_t dim = 16, M = 4, dsub = 4, nlist = 4, ksub = 256;
    dfm_index_plan plan;
    assert_int_equal(dfm_index_plan_make("IVF4,PQ4", 20000, dim, 1, 0, DFM_METRIC_L2, 0, &plan), 0);
    char kind;
    uint32_t m_, nb_;
    assert_int_equal(dfm_ivf_encoding(&plan, dim, &kind, &m_, &nb_), 0);
    assert_int_equal(kind, 'P');
    assert_int_equal(m_, M);
    assert_int_equal(nb_, 8);
    float coarse[4 * 16], *pq = malloc(sizeof(float) * dim * ksub);
    for (uint32_t i = 0; i < nlist * dim; i++) coarse[i] = (float)(i % 7) * 3.0f;
    for (uint32_t i = 0; i < dim * ksub; i++) pq[i] = (float)(urand() * 2 - 1);
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(dfm_ivf_trained(&plan, dim, coarse, pq, 0, NULL, &buf, &len), 0);
    FaissIndex *idx = NULL;
    assert_int_equal(dfm_index_from_buffer(buf, len, &idx), 0);
    assert_true(faiss_Index_is_trained(idx));
    float v[16];
    const uint32_t code[4] = {3, 200, 17, 99};
    for (uint32_t s = 0; s < M; s++)
        for (uint32_t t = 0; t < dsub; t++) v[s * dsub + t] = coarse[2 * dim + s * dsub + t] + pq[(s * ksub + code[s]) * dsub + t];
    idx_t id = 0; /* FAISS's direct map wants sequential ids */
    assert_int_equal(faiss_Index_add_with_ids(idx, 1, v, &id), 0);
    assert_int_equal(faiss_IndexIVF_get_list_size(faiss_IndexIVF_cast(idx), 2), 1);
    assert_int_equal(faiss_IndexIVF_make_direct_map(faiss_IndexIVF_cast(idx), 1), 0);
    float back[16];
    assert_int_equal(faiss_Index_reconstruct(idx, 0, back), 0);
    for (uint32_t t = 0; t < dim; t++) assert_true(fabsf(back[t] - v[t]) < 1e-4f);
    faiss_Index_free(idx);
    free(buf);
    free(pq);
}

/* an IVF index's lists moved whole through the serialisation (as dfm index moves them between ranks):
 * the lists read back with their sizes, and a search with given probe lists finds what search() finds */
static void test_ivf_lists_and_assigned_search(void **state) {
    (void)state;
    corpus c;
    corpus_make(&c, 3000, 16, 20, 1);
    dfm_index_plan plan;
    assert_int_equal(dfm_index_plan_make("IVF16,Flat", c.n, 16, 1, 0, DFM_METRIC_IP, 3000, &plan), 0);
    FaissIndex *tr = NULL;
    assert_int_equal(dfm_index_create(&plan, 16, &tr), 0);
    assert_int_equal(faiss_Index_train(tr, c.n, c.x), 0);
    uint8_t *tbuf, *full;
    size_t tlen, flen;
    assert_int_equal(dfm_index_to_buffer(tr, &tbuf, &tlen), 0);
    idx_t *ids = malloc(sizeof(idx_t) * c.n);
    for (uint32_t i = 0; i < c.n; i++) ids[i] = (idx_t)(i + 100);
    assert_int_equal(faiss_Index_add_with_ids(tr, c.n, c.x, ids), 0);
    assert_int_equal(dfm_index_to_buffer(tr, &full, &flen), 0);
    dfm_ivf_lists L;
    assert_int_equal(dfm_ivf_lists_view(full, flen, tbuf, tlen, &L), 0);
    assert_int_equal(L.nlist, 16);
    assert_int_equal(L.ntotal, c.n);
    FaissIndex *back = NULL;
    size_t data_len = (size_t)(full + flen - L.data);
    assert_int_equal(dfm_ivf_from_lists(tbuf, tlen, L.nlist, L.code_size, L.sizes, L.data, data_len, &back), 0);
    uint8_t *again;
    size_t alen;
    assert_int_equal(dfm_index_to_buffer(back, &again, &alen), 0);
    assert_int_equal(alen, flen);
    assert_memory_equal(again, full, flen); /* the same index, byte for byte */
    assert_int_equal(dfm_ivf_lists_view(full, flen - 1, tbuf, tlen, &L) == DFM_EINTERNAL, 1); /* truncated: refused */
    dfm_ivf v;
    assert_int_equal(dfm_ivf_open(back, &v), 0);
    assert_non_null(v.ivf);
    assert_int_equal(dfm_index_set_param(back, "nprobe", 3), 0);
    size_t np = dfm_ivf_nprobe(&v), nq = 50, kp = 10;
    assert_int_equal(np, 3);
    int64_t *lists = malloc(sizeof(int64_t) * nq * np), *l1 = malloc(sizeof(int64_t) * nq * kp), *l2 = malloc(sizeof(int64_t) * nq * kp);
    float *dis = malloc(sizeof(float) * nq * np), *d1 = malloc(sizeof(float) * nq * kp), *d2 = malloc(sizeof(float) * nq * kp);
    assert_int_equal(dfm_ivf_assign(&v, nq, c.x, np, lists, dis), 0);
    assert_int_equal(dfm_faiss_search(back, nq, c.x, kp, d1, l1), 0);
    assert_int_equal(dfm_ivf_search_assigned(&v, nq, c.x, kp, np, lists, dis, d2, l2), 0);
    assert_memory_equal(l1, l2, sizeof(int64_t) * nq * kp);
    assert_memory_equal(d1, d2, sizeof(float) * nq * kp);
    /* a short batch is padded: the same lists as inside a long one */
    int64_t one[3];
    float onedis[3];
    assert_int_equal(dfm_ivf_assign(&v, 1, c.x + 7 * 16, np, one, onedis), 0);
    assert_memory_equal(one, lists + 7 * np, sizeof one);
    assert_memory_equal(onedis, dis + 7 * np, sizeof onedis);
    dfm_ivf_close(&v);
    free(L.sizes);
    free(lists), free(l1), free(l2), free(dis), free(d1), free(d2), free(ids);
    free(tbuf), free(full), free(again);
    faiss_Index_free(tr);
    faiss_Index_free(back);
    corpus_free(&c);
}

/* an IVF whose lists are not FAISS's plain array lists (fast-scan: block lists, no scanner) is never routed
 * to search_preassigned, where FAISS 1.7.3 crashes on it: dfm_ivf_open leaves it to search() */
static void test_ivf_open_fast_scan(void **state) {
    (void)state;
    corpus c;
    corpus_make(&c, 2000, 16, 20, 1);
    FaissIndex *fs = NULL, *pq = NULL;
    assert_int_equal(faiss_index_factory(&fs, 16, "IVF4,PQ8x4fs", METRIC_INNER_PRODUCT), 0);
    assert_int_equal(faiss_index_factory(&pq, 16, "IVF4,PQ8x4np", METRIC_INNER_PRODUCT), 0);
    FaissIndex *both[2] = {fs, pq};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(faiss_Index_train(both[i], c.n, c.x), 0);
        assert_int_equal(faiss_Index_add(both[i], c.n, c.x), 0);
    }
    assert_non_null(faiss_IndexIVF_cast(fs)); /* an IVF to the C API ... */
    assert_int_equal(dfm_ivf_plain_lists(faiss_IndexIVF_cast(fs)), 0); /* ... but not one dfm routes */
    assert_int_equal(dfm_ivf_plain_lists(faiss_IndexIVF_cast(pq)), 1);
    assert_int_equal(dfm_ivf_plain_lists(NULL), 0);
    dfm_ivf v;
    assert_int_equal(dfm_ivf_open(fs, &v), 0);
    assert_null(v.ivf);
    assert_int_equal(dfm_ivf_open(pq, &v), 0);
    assert_non_null(v.ivf);
    dfm_ivf_close(&v);
    /* the fast-scan index is still searched, by FAISS's own search() */
    float d[8 * 4];
    int64_t l[8 * 4];
    assert_int_equal(dfm_faiss_search(fs, 8, c.x, 4, d, l), 0);
    for (int q = 0; q < 8; q++) assert_true(l[q * 4] >= 0);
    faiss_Index_free(fs);
    faiss_Index_free(pq);
    corpus_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_merge),
        cmocka_unit_test(test_exact_score),
        cmocka_unit_test(test_exclusions),
        cmocka_unit_test(test_queries),
        cmocka_unit_test(test_count_excluded),
        cmocka_unit_test(test_shard_topk_bruteforce_ip),
        cmocka_unit_test(test_shard_topk_faiss_ip),
        cmocka_unit_test(test_shard_topk_faiss_l2),
        cmocka_unit_test(test_shard_topk_ties),
        cmocka_unit_test(test_padding_tiny_corpus),
        cmocka_unit_test(test_index_plan),
        cmocka_unit_test(test_index_plan_fast_scan),
        cmocka_unit_test(test_index_plan_l2_table),
        cmocka_unit_test(test_ivf_open_fast_scan),
        cmocka_unit_test(test_sample_ids),
        cmocka_unit_test(test_index_files),
        cmocka_unit_test(test_set_param),
        cmocka_unit_test(test_neighbor_block),
        cmocka_unit_test(test_split_flat),
        cmocka_unit_test(test_split_ivfpq),
        cmocka_unit_test(test_kmeans),
        cmocka_unit_test(test_ivf_pq_codebooks),
        cmocka_unit_test(test_ivf_lists_and_assigned_search),
    };
    int argc = 1;
    char *args[] = {"test_retriever", NULL}, **argv = args;
    if (dfm_mpi_init(&argc, &argv, &g_mpi)) return 1;
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    dfm_mpi_finalize();
    return rc;
}
