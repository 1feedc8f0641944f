/* estimate.h — the cost model of index and retrieve: the CPU seconds of a rank outside MPI as rates fitted on
 * this machine class times its work, counted in units that do not depend on the machine (retriever/work.h
 * records them in a run's manifest). dfm index places IVF lists on ranks by it; `dfm estimate`
 * (pipeline/driver/job_estimate.h) plans a job's index and retrieve stages with it. */
#ifndef DFM_RETRIEVER_ESTIMATE_H
#define DFM_RETRIEVER_ESTIMATE_H

#include <jansson.h>

/* one rank's work, as the manifest's "work" records it */
typedef struct {
    double kmeans_flops, train_points, coarse_distances, vectors_added, codes_scanned, shard_searches, exact_scores, queries;
} dfm_work_counts;

/* What one shard search (a query visiting a rank: FAISS's per-query tables and the visit's fixed cost) costs,
 * in codes scanned, by the fitted retrieve rates: d dimensions, code_size bytes per code (4 d: a flat index,
 * else a PQ of code_size bytes), nprobe lists per query. dfm index places lists on ranks by it. */
double dfm_estimate_visit_in_codes(double d, double code_size, double nprobe);

/* CPU seconds of the work w: the index's training and adding, or the retrieve rounds; d dimensions, M PQ bytes
 * (0: a flat index), nprobe lists per query. */
double dfm_estimate_index_seconds(const dfm_work_counts *w, double d, double M);
double dfm_estimate_retrieve_seconds(const dfm_work_counts *w, double d, double M, double nprobe);

/* The work of one rank of a job: N chunks on P ranks, dimension d, nlist lists (0: not IVF), M PQ bytes (0: flat),
 * nprobe, cand = K + margin candidates rescored, train_n training points; visits > 0: ranks a query visits, as a
 * run measured it (else the bound for lists placed at random). */
void dfm_estimate_job_counts(double N, double P, double d, double nlist, double M, double nprobe, double cand, double train_n,
                             double visits, dfm_work_counts *idx, dfm_work_counts *ret);

/* PQ bytes of a factory string ("IVF..,PQ32np" -> 32), 0 without a PQ */
double dfm_estimate_factory_pq(const char *factory);

/* The slowest rank's work (into *w) and its CPU seconds outside MPI in what the model covers (index: training
 * and adding; retrieve: the rounds), from a stage's "work" record in a manifest (0: none) */
double dfm_estimate_slowest_rank(json_t *stage, int index, dfm_work_counts *w);

#endif
