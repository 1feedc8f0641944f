/* audit_scale.c — one datastore measured at one size (audit_scale.h). */
#include "pipeline/audit/audit_scale.h"

#include "common/error.h"
#include "common/log.h"
#include "pipeline/audit/audit.h"
#include "retriever/index.h"
#include "schemas/neighbor_shard.h"

#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

dfm_audit_spread dfm_audit_spread_of(const double *v, int n) {
    double s[DFM_AUDIT_MAX_REPEATS];
    dfm_audit_spread r = {0, 0, 0, 0};
    if (n <= 0) return r;
    if (n > DFM_AUDIT_MAX_REPEATS) n = DFM_AUDIT_MAX_REPEATS;
    memcpy(s, v, sizeof(double) * n);
    qsort(s, n, sizeof(double), cmp_double);
    r.min = s[0];
    r.max = s[n - 1];
    r.med = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    r.n = n;
    return r;
}

/* ---- the token-level index ------------------------------------------------------------------------ */

void dfm_audit_ivfpq_factory(uint64_t n, uint32_t dim, char *out, size_t n_out, char *why, size_t n_why) {
    if (n < 1000) {
        snprintf(out, n_out, "Flat");
        snprintf(why, n_why, "%llu keys are too few to train IVF-PQ (PQ codebooks need 256 points per sub-quantizer): exact Flat",
                 (unsigned long long)n);
        return;
    }
    uint64_t nl = 1;
    double want = sqrt((double)n);
    while ((double)(nl * 2) <= want * M_SQRT2) nl *= 2; /* the power of two nearest sqrt(n) on a log scale */
    while (nl > 1 && nl * 39 > n) nl /= 2;
    uint32_t m = 1, cap = dim / 4 < 64 ? dim / 4 : 64;
    for (uint32_t c = cap; c >= 1; c--)
        if (dim % c == 0) {
            m = c;
            break;
        }
    /* "np": no polysemous training (FAISS's factory adds it to IVF-PQ; kNN-LM's index has none, and it costs minutes) */
    snprintf(out, n_out, "IVF%llu,PQ%unp", (unsigned long long)nl, m);
    snprintf(why, n_why, "token-level datastore as kNN-LM / Memory Decoder build it (IVF-PQ: 4096 lists and 64-byte codes for ~10^8 "
                         "keys of width 1024), scaled to %llu keys of width %u: %llu lists (~sqrt(n)), %u-byte PQ codes (%u dims per byte; theirs: 16)",
             (unsigned long long)n, dim, (unsigned long long)nl, m, dim / m);
}

/* ---- one datastore at one size ---------------------------------------------------------------------- */

int dfm_audit_choose(const char *factory, uint32_t metric, uint32_t dim, uint64_t n, dfm_audit_choice *c, char *why, size_t n_why) {
    memset(c, 0, sizeof *c);
    c->metric = metric;
    if (factory && !strcmp(factory, "ivfpq")) {
        dfm_audit_ivfpq_factory(n, dim, c->factory, sizeof c->factory, why, n_why);
        if (!strncmp(c->factory, "Flat", 4)) {
            /* an exact Flat index is not IVF-PQ: nothing is built under that name */
            c->factory[0] = 0;
            c->too_small = 1;
            snprintf(why, n_why, "%llu keys are too few for IVF-PQ (its PQ codebooks need 256 points per sub-quantizer; the audit's "
                                 "rule starts at 1000 keys): not measured, and no Flat index is labelled IVF-PQ",
                     (unsigned long long)n);
            return DFM_OK;
        }
        const char *ivf = strstr(c->factory, "IVF");
        c->nlist = ivf ? strtoull(ivf + 3, NULL, 10) : 0;
        /* FAISS's minimum, 39 points per list (its k-means would keep up to 256): training is a one-off cost
         * that grows with the lists, not with the datastore, and dominates small builds */
        uint64_t t = c->nlist ? 39 * c->nlist : 0;
        if (t && t < 9984) t = 9984; /* 39 * 256: a PQ codebook's minimum */
        c->train_n = t > n ? n : t;
        return DFM_OK;
    }
    dfm_index_plan plan;
    DFM_TRY(dfm_audit_plan(factory, metric, dim, n, &plan, why, n_why));
    snprintf(c->factory, sizeof c->factory, "%s", plan.factory);
    c->metric = plan.metric;
    c->nlist = plan.nlist;
    c->train_n = plan.train_n > n ? n : plan.train_n;
    return DFM_OK;
}

/* one build: create, train on the sample, add every key (ids 0..n-1) */
static int build_once(const dfm_audit_choice *pl, uint32_t dim, const float *keys, uint64_t n, const float *train, uint64_t train_n,
                      const int64_t *ids, FaissIndex **out) {
    FaissIndex *idx = NULL;
    int rc = DFM_FAISS_CHECK(faiss_index_factory(&idx, (int)dim, pl->factory, pl->metric == DFM_METRIC_IP ? METRIC_INNER_PRODUCT : METRIC_L2),
                             "creating the audit index");
    if (rc) return dfm_error_prefix("audit: factory '%s' (dim %u)", pl->factory, dim);
    if (!faiss_Index_is_trained(idx)) rc = DFM_FAISS_CHECK(faiss_Index_train(idx, (int64_t)train_n, train), "training the audit index");
    if (!rc) rc = DFM_FAISS_CHECK(faiss_Index_add_with_ids(idx, (int64_t)n, keys, ids), "adding keys to the audit index");
    if (rc) {
        faiss_Index_free(idx);
        return rc;
    }
    *out = idx;
    return DFM_OK;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* mean over nq queries of |approx ∩ exact| / k (labels < 0 never count) */
static double recall_at_k(const int64_t *approx, int64_t *exact, uint64_t nq, uint32_t k) {
    double sum = 0;
    for (uint64_t q = 0; q < nq; q++) {
        int64_t *e = exact + q * k;
        qsort(e, k, sizeof(int64_t), cmp_i64);
        uint64_t hit = 0;
        for (uint32_t j = 0; j < k; j++) {
            int64_t a = approx[q * k + j];
            if (a >= 0 && bsearch(&a, e, k, sizeof(int64_t), cmp_i64)) hit++;
        }
        sum += (double)hit / k;
    }
    return nq ? sum / (double)nq : 0;
}

/* One timed repeat: run(ctx) again and again until DFM_AUDIT_MIN_TIMED_S of CPU has passed, and keep the median
 * run's CPU and wall seconds. A Flat build of a few keys or a search of 500 queries in a small index is microseconds,
 * under the clock's and the scheduler's noise; other processes on a shared machine add time to some runs (evicted
 * caches, preemption), which the median of many runs sets aside. (The fastest run would be biased: the minimum of
 * many samples falls with their number, and a small index gets a thousand runs where a large one gets one.) */
#define TIMED_MAX_RUNS 8192
static int timed_median(int (*run)(void *), void *ctx, double *cpu, double *wall, int *runs) {
    static double c[TIMED_MAX_RUNS], t[TIMED_MAX_RUNS];
    double c_start = cpu_now();
    int n = 0;
    do {
        double t0 = dfm_now(), c0 = cpu_now();
        DFM_TRY(run(ctx));
        c[n] = cpu_now() - c0, t[n] = dfm_now() - t0;
        n++;
    } while (n < TIMED_MAX_RUNS && cpu_now() - c_start < DFM_AUDIT_MIN_TIMED_S);
    qsort(c, (size_t)n, sizeof(double), cmp_double);
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    *cpu = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    *wall = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    *runs = n;
    return DFM_OK;
}

typedef struct {
    const dfm_audit_choice *pl;
    uint32_t d;
    const float *keys;
    uint64_t n;
    const float *train;
    uint64_t train_n;
    const int64_t *ids;
    FaissIndex **idx; /* the last build is kept */
} build_ctx;

static int build_run(void *p) {
    build_ctx *b = p;
    if (*b->idx) faiss_Index_free(*b->idx);
    *b->idx = NULL;
    return build_once(b->pl, b->d, b->keys, b->n, b->train, b->train_n, b->ids, b->idx);
}

typedef struct {
    FaissIndex *idx;
    uint64_t nq;
    const float *q;
    uint32_t k;
    float *dist;
    int64_t *lab;
} search_ctx;

static int search_run(void *p) {
    search_ctx *x = p;
    return DFM_FAISS_CHECK(faiss_Index_search(x->idx, (int64_t)x->nq, x->q, x->k, x->dist, x->lab), "searching the audit index");
}

int dfm_audit_measure_point(const dfm_audit_point_opts *o, const float *keys, uint64_t n, const uint64_t *qidx, uint64_t nq,
                            dfm_audit_point *p) {
    memset(p, 0, sizeof *p);
    if (!n || !o->dim || !o->k) return DFM_FAIL(DFM_EARG, "audit: a datastore of %llu keys of width %u, k %u", (unsigned long long)n, o->dim, o->k);
    if (o->repeats < 1 || o->repeats > DFM_AUDIT_MAX_REPEATS || o->build_repeats < 1 || o->build_repeats > DFM_AUDIT_MAX_REPEATS)
        return DFM_FAIL(DFM_EARG, "audit: --repeats %d / --build-repeats %d outside 1..%d", o->repeats, o->build_repeats, DFM_AUDIT_MAX_REPEATS);
    for (uint64_t q = 0; q < nq; q++)
        if (qidx[q] >= n) return DFM_FAIL(DFM_EINTERNAL, "audit: query %llu is key %llu of %llu", (unsigned long long)q, (unsigned long long)qidx[q], (unsigned long long)n);
    dfm_audit_choice pl;
    DFM_TRY(dfm_audit_choose(o->factory, o->metric, o->dim, n, &pl, p->why, sizeof p->why));
    p->keys = n;
    p->layout_bytes = NAN;
    if (pl.too_small) {
        p->skipped = 1;
        return DFM_OK;
    }
    snprintf(p->factory, sizeof p->factory, "%s", pl.factory);
    p->queries = nq;
    p->nlist = pl.nlist;
    p->train_n = pl.train_n;
    uint32_t d = o->dim, k = o->k;
    uint64_t rq = o->recall_queries < nq ? o->recall_queries : nq;
    int64_t *ids = malloc(sizeof(int64_t) * n);
    uint64_t *tid = malloc(sizeof(uint64_t) * (pl.train_n ? pl.train_n : 1));
    float *train = malloc(sizeof(float) * d * (pl.train_n ? pl.train_n : 1));
    float *qbuf = malloc(sizeof(float) * d * (nq ? nq : 1));
    float *dist = malloc(sizeof(float) * k * (nq ? nq : 1));
    int64_t *lab = malloc(sizeof(int64_t) * k * (nq ? nq : 1));
    int64_t *exact = malloc(sizeof(int64_t) * k * (rq ? rq : 1));
    FaissIndex *idx = NULL, *flat = NULL;
    uint8_t *ser = NULL;
    size_t ser_n = 0;
    int rc = DFM_OK;
    if (!ids || !tid || !train || !qbuf || !dist || !lab || !exact) {
        rc = DFM_FAIL(DFM_ENOMEM, "audit: no memory for %llu queries of k=%u", (unsigned long long)nq, k);
        goto done;
    }
    for (uint64_t i = 0; i < n; i++) ids[i] = (int64_t)i;
    if (pl.train_n) {
        dfm_sample_ids(n, pl.train_n, 0x7a11ull, tid);
        for (uint64_t i = 0; i < pl.train_n; i++) memcpy(train + i * d, keys + tid[i] * d, sizeof(float) * d);
    }
    for (uint64_t q = 0; q < nq; q++) memcpy(qbuf + q * d, keys + qidx[q] * d, sizeof(float) * d);

    double bt[DFM_AUDIT_MAX_REPEATS], qt[DFM_AUDIT_MAX_REPEATS], bc[DFM_AUDIT_MAX_REPEATS], qc[DFM_AUDIT_MAX_REPEATS];
    build_ctx bx = {&pl, d, keys, n, train, pl.train_n, ids, &idx};
    for (int r = 0; r < o->build_repeats; r++) {
        int runs = 0;
        if ((rc = timed_median(build_run, &bx, &bc[r], &bt[r], &runs))) goto done;
        p->build_passes += (uint64_t)runs;
    }
    p->build_s = dfm_audit_spread_of(bt, o->build_repeats);
    p->build_cpu = dfm_audit_spread_of(bc, o->build_repeats);
    if (pl.nlist && o->nprobe > 0) {
        p->nprobe = o->nprobe < (int64_t)pl.nlist ? o->nprobe : (int64_t)pl.nlist;
        if ((rc = dfm_index_set_param(idx, "nprobe", (double)p->nprobe))) goto done;
    } else if (pl.nlist) {
        p->nprobe = 1; /* FAISS's default */
    }
    if (nq) {
        /* one untimed pass over a few queries: thread start-up and first touch are not the index's cost */
        int64_t nw = nq < 8 ? (int64_t)nq : 8;
        if ((rc = DFM_FAISS_CHECK(faiss_Index_search(idx, nw, qbuf, k, dist, lab), "searching the audit index"))) goto done;
        search_ctx sx = {idx, nq, qbuf, k, dist, lab};
        for (int r = 0; r < o->repeats; r++) {
            int runs = 0;
            if ((rc = timed_median(search_run, &sx, &qc[r], &qt[r], &runs))) goto done;
            qc[r] /= (double)nq, qt[r] /= (double)nq;
            p->search_passes += (uint64_t)runs;
        }
        p->query_s = dfm_audit_spread_of(qt, o->repeats);
        p->query_cpu = dfm_audit_spread_of(qc, o->repeats);
        for (uint64_t j = 0; j < nq * k; j++) p->results += lab[j] >= 0;
        int64_t wide = p->nprobe * DFM_AUDIT_WIDE_PROBES < (int64_t)pl.nlist ? p->nprobe * DFM_AUDIT_WIDE_PROBES : (int64_t)pl.nlist;
        if (o->wide && pl.nlist && wide > p->nprobe) {
            /* the operation-mix check, after the timed passes (whose labels the recall below reads), then back */
            float *wd = malloc(sizeof(float) * k * nq);
            int64_t *wl = malloc(sizeof(int64_t) * k * nq);
            if (!wd || !wl) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
            if (!rc) rc = dfm_index_set_param(idx, "nprobe", (double)wide);
            search_ctx wx = {idx, nq, qbuf, k, wd, wl};
            for (int r = 0; !rc && r < o->repeats; r++) {
                int runs = 0;
                double wall;
                rc = timed_median(search_run, &wx, &qc[r], &wall, &runs);
                qc[r] /= (double)nq;
            }
            if (!rc) rc = dfm_index_set_param(idx, "nprobe", (double)p->nprobe);
            free(wd);
            free(wl);
            if (rc) goto done;
            p->wide_nprobe = wide;
            p->wide_query_cpu = dfm_audit_spread_of(qc, o->repeats);
        }
    }
    if (rq) {
        if (!strcmp(pl.factory, "IDMap,Flat") || !strcmp(pl.factory, "Flat")) {
            p->recall = 1.0; /* the index is the exact search */
        } else {
            dfm_audit_choice fl = pl;
            snprintf(fl.factory, sizeof fl.factory, "IDMap,Flat");
            if ((rc = build_once(&fl, d, keys, n, NULL, 0, ids, &flat))) goto done;
            float *ed = malloc(sizeof(float) * k * rq);
            if (!ed) {
                rc = DFM_FAIL(DFM_ENOMEM, "no memory");
                goto done;
            }
            rc = DFM_FAISS_CHECK(faiss_Index_search(flat, (int64_t)rq, qbuf, k, ed, exact), "exact search for recall");
            free(ed);
            if (rc) goto done;
            p->recall = recall_at_k(lab, exact, rq, k);
        }
        p->recall_queries = rq;
    }
    if ((rc = dfm_index_to_buffer(idx, &ser, &ser_n))) goto done;
    p->index_bytes = ser_n;
    dfm_audit_layout lay;
    if (!dfm_audit_layout_parse(pl.factory, d, pl.metric, &lay)) p->layout_bytes = dfm_audit_layout_bytes(&lay, n, dfm_audit_nonempty_lists(idx));
    else dfm_error_clear(); /* a family without a model (the run's own HNSW, say): the report says so */
done:
    if (idx) faiss_Index_free(idx);
    if (flat) faiss_Index_free(flat);
    free(ser);
    free(ids);
    free(tid);
    free(train);
    free(qbuf);
    free(dist);
    free(lab);
    free(exact);
    return rc;
}
