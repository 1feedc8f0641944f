/* estimate.c — the cost model of index and retrieve: a rank's CPU seconds as fitted rates times its counted
 * work (see estimate.h). */
#include "retriever/estimate.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Index and retrieve: the CPU seconds of a rank outside MPI = rates x its work, in units that do not
 * depend on the machine (retriever/work.h counts them; bench/retrieval/scaling_report.py defines the same units
 * and fits the rates by non-negative least squares on every rank of bench/retrieval/scaling.sh's points, the
 * index's training and adding apart: bench/results/scaling.md and scaling_fit.json, where the model's
 * error on each measured point is).
 *   index:    kmeans_flops; train_points x d; 1 | vectors_added x (PQ: 256 d; Flat: d); 1
 *   retrieve: codes_scanned x (PQ: M; Flat: d); shard_searches x (PQ: 256 d + nprobe d; Flat:
 *             nprobe d); exact_scores x d; shard_searches; queries
 * and in both the coarse assignment, coarse_distances x (a d + b): a per multiply-add of FAISS's SGEMM,
 * b per distance (its heaps), fitted on bench/retrieval/bench_coarse.c's measurements of the assignment alone up
 * to a big job's size (50,000 lists, d = 384), which the small points cannot reach. */
/* seconds per unit, bench/results/scaling_fit.json: fitted on bench/results/scaling.jsonl (d = 64, 10^5 chunks),
 * scaling-d384.jsonl (d = 384, 2.5·10^5 to 10^6, PQ32, MiniLM-like vectors), scaling-margin.jsonl (2.5·10^5, d = 384,
 * margins 16, 64 and 256: the exact rescorings' rate, which needs a varying margin) and large_point.jsonl (2·10^6, d = 384);
 * fitted without the 2·10^6 point, how well they predict it: bench/results/large_point.md, "Refit at d = 384" */
#define RATE_INDEX_KMEANS 1.144e-11
#define RATE_INDEX_SAMPLE 3.140e-07
#define RATE_INDEX_TRAIN_START 5.819e-01
#define RATE_INDEX_ENCODE 5.747e-10
#define RATE_INDEX_ADD_START 1.594e-02
#define RATE_INDEX_COARSE_A 1.192e-11
#define RATE_INDEX_COARSE_B 4.361e-09
#define RATE_RET_SCAN 2.731e-10
#define RATE_RET_TABLES 5.125e-10
#define RATE_RET_EXACT 1.521e-09
#define RATE_RET_VISITS 1.351e-05
#define RATE_RET_QUERIES 3.487e-05
#define RATE_RET_COARSE_A 6.335e-12
#define RATE_RET_COARSE_B 6.740e-09
enum { IU_KMEANS, IU_SAMPLE, IU_TRAIN_START, IU_ENCODE, IU_ADD_START, N_IU };
enum { RU_SCAN, RU_TABLES, RU_EXACT, RU_VISITS, RU_QUERIES, N_RU };
static const double index_rates[N_IU] = {RATE_INDEX_KMEANS, RATE_INDEX_SAMPLE, RATE_INDEX_TRAIN_START, RATE_INDEX_ENCODE, RATE_INDEX_ADD_START};
static const double retrieve_rates[N_RU] = {RATE_RET_SCAN, RATE_RET_TABLES, RATE_RET_EXACT, RATE_RET_VISITS, RATE_RET_QUERIES};

double dfm_estimate_visit_in_codes(double d, double code_size, double nprobe) {
    const double M = code_size >= 4 * d ? 0 : code_size; /* as dfm_estimate_retrieve_seconds: 0 for a flat index */
    const double visit = ((M > 0 ? 256 * d : 0) + nprobe * d) * RATE_RET_TABLES + RATE_RET_VISITS;
    return visit / ((M > 0 ? M : d) * RATE_RET_SCAN);
}

double dfm_estimate_index_seconds(const dfm_work_counts *w, double d, double M) {
    double u[N_IU] = {w->kmeans_flops, w->train_points * d, 1, w->vectors_added * (M > 0 ? 256 * d : d), 1};
    double t = w->coarse_distances * (RATE_INDEX_COARSE_A * d + RATE_INDEX_COARSE_B);
    for (int i = 0; i < N_IU; i++) t += index_rates[i] * u[i];
    return t;
}

double dfm_estimate_retrieve_seconds(const dfm_work_counts *w, double d, double M, double nprobe) {
    double u[N_RU] = {w->codes_scanned * (M > 0 ? M : d), w->shard_searches * ((M > 0 ? 256 * d : 0) + nprobe * d), w->exact_scores * d,
                      w->shard_searches, w->queries};
    double t = w->coarse_distances * (RATE_RET_COARSE_A * d + RATE_RET_COARSE_B);
    for (int i = 0; i < N_RU; i++) t += retrieve_rates[i] * u[i];
    return t;
}

/* The work of one rank of a job: N chunks on P ranks, dimension d, nlist lists, M PQ bytes (0: flat),
 * nprobe, cand = K + margin candidates rescored, train_n training points. The training, the scans and the coarse
 * assignments shrink as 1/P. An IVF index is sharded by list: a query visits the ranks that hold its
 * nprobe lists. Were the lists placed at random, that would be P (1 - (1 - 1/P)^nprobe) ranks, and a
 * rank would search N (1 - (1 - 1/P)^nprobe) queries: an upper bound, since dfm index puts neighbouring
 * lists on the same rank. visits > 0 (measured: the slowest rank's shard searches x P / queries) replaces
 * it, a rank then searching N visits / P queries (never more than the bound); other indexes: every query
 * visits every rank (N). */
void dfm_estimate_job_counts(double N, double P, double d, double nlist, double M, double nprobe, double cand, double train_n, double visits,
                       dfm_work_counts *idx, dfm_work_counts *ret) {
    memset(idx, 0, sizeof *idx);
    memset(ret, 0, sizeof *ret);
    if (nlist > 0) {
        idx->kmeans_flops = 10 * (train_n / P) * nlist * 2 * d;
        if (M > 0) {
            double n_pq = train_n < 65536 ? train_n : 65536;
            idx->kmeans_flops += 25 * (n_pq / P) * 256 * 2 * d + (n_pq / P) * nlist * 2 * d;
        }
        idx->coarse_distances = N / P * nlist;
        ret->coarse_distances = N / P * nlist;
        ret->codes_scanned = N * (nprobe < nlist ? nprobe : nlist) * (N / nlist) / P;
        ret->shard_searches = N * (1 - pow(1 - 1 / P, nprobe < nlist ? nprobe : nlist));
        if (visits > 0 && N * visits / P < ret->shard_searches) ret->shard_searches = N * visits / P;
    } else {
        ret->codes_scanned = N * N / P; /* flat shards: every vector */
        ret->shard_searches = N;
    }
    idx->train_points = train_n / P;
    idx->vectors_added = N / P;
    /* exact rescorings: an exact index's shards rescore their survivors; an approximate one's owner rescores
     * the merged best K + margin once */
    ret->exact_scores = (M > 0 ? N / P : ret->shard_searches) * cand;
    ret->queries = N / P;
}

/* PQ bytes of a factory string ("IVF..,PQ32np" -> 32), 0 without a PQ */
double dfm_estimate_factory_pq(const char *f) {
    const char *p = f ? strstr(f, "PQ") : NULL;
    while (p && p > f && p[-1] != ',' && p[-1] != '_') p = strstr(p + 2, "PQ");
    return p ? atof(p + 2) : 0;
}

/* The slowest rank's work and CPU seconds outside MPI in what the model covers (index: training and
 * adding; retrieve: the rounds) in a stage's "work" record (0: none) */
double dfm_estimate_slowest_rank(json_t *stage, int index, dfm_work_counts *w) {
    json_t *ranks = json_object_get(json_object_get(stage, "work"), "ranks"), *r, *best = NULL;
    size_t i;
    double top = 0;
    json_array_foreach(ranks, i, r) {
        double c = index ? json_number_value(json_object_get(r, "train_cpu_s")) + json_number_value(json_object_get(r, "add_cpu_s"))
                         : json_number_value(json_object_get(r, "search_cpu_s"));
        if (c > top) top = c, best = r;
    }
    if (!best) return 0;
#define WNUM(k) (double)json_integer_value(json_object_get(best, k))
    *w = (dfm_work_counts){WNUM("kmeans_flops"),  WNUM("train_points"),   WNUM("coarse_distances"), WNUM("vectors_added"),
                       WNUM("codes_scanned"), WNUM("shard_searches"), WNUM("exact_scores"),     WNUM("queries")};
#undef WNUM
    return top;
}
