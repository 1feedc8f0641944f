/* work.h — what one rank of `dfm index` or `dfm retrieve` did, counted rather than timed.
 *
 * CPU time is a poor measure of work on a shared or oversubscribed machine: a rank waiting inside a
 * collective spins in MPI's busy polling at full CPU. So each rank counts its work in units that do not
 * depend on the machine (distances computed, codes scanned, bytes sent) and keeps apart the CPU time
 * of the MPI calls it makes (dfm_work_mpi_begin / _end around each one, on the calling thread). Every
 * rank's record goes into its stage's manifest entry as "work" (schemas/manifest.md, "Work"), which
 * `dfm estimate` and bench/retrieval/scaling.sh read.
 *
 * What is counted (each rank its own share):
 *   coarse_distances  vector or query x coarse centroid distances, d-dimensional: index assigns its
 *                     vectors to lists when adding them; retrieve computes each query's probe lists once,
 *                     at its owner
 *   codes_scanned     vectors or codes compared in the rank's index shards: the probed inverted lists'
 *                     entries of the shard (IVF), or the whole shard (Flat); re-searches count again
 *   bf_scanned        vectors compared by brute force (recall measurement and nprobe tuning samples)
 *   exact_scores      exact rescorings (one d-dimensional dot product or distance in double each)
 *   shard_searches    queries searched in the rank's shards (IVF: a query visits only the ranks that hold
 *                     its probe lists; other indexes: every rank); each visit has a fixed cost (FAISS's
 *                     per-query tables, filtering, rescoring)
 *   kmeans_distances  point x centroid distances in k-means iterations (coarse: d dimensions; product
 *                     quantiser: d/M dimensions), and kmeans_flops = 2 x dimensions x those
 *   bytes_sent        bytes this rank sent to other ranks (allgather: its part x (P-1); alltoallv: what
 *                     it addressed to others; allreduce and bcast of S bytes: 2S(P-1)/P, as a ring moves it)
 *   cpu_s             CPU seconds of the process (all threads) minus those spent inside MPI calls
 */
#ifndef DFM_RETRIEVER_WORK_H
#define DFM_RETRIEVER_WORK_H

#include "common/mpiutil.h"

#include <jansson.h>
#include <stdint.h>

typedef struct {
    uint64_t coarse_distances, codes_scanned, bf_scanned, exact_scores;
    uint64_t kmeans_distances, kmeans_flops;
    uint64_t queries;       /* retrieve: queries this rank owned */
    uint64_t shard_searches; /* retrieve: queries searched in this rank's shards (every query visits every shard) */
    uint64_t vectors_added; /* index: vectors added to this rank's shard */
    uint64_t train_points;  /* index: training points this rank held */
    uint64_t bytes_sent;
    double mpi_s, mpi_cpu_s; /* wall and this thread's CPU seconds inside MPI calls */
    double cpu0, wall0;      /* at dfm_work_start */
    double open_wall, open_cpu; /* the MPI call in progress */
    double phase_cpu[2], mark;  /* CPU seconds outside MPI of two phases (dfm_work_phase) */
} dfm_work;

/* Zero w and note the process's CPU time and the wall clock. */
void dfm_work_start(dfm_work *w);
/* Around an MPI call (w may be NULL). */
void dfm_work_mpi_begin(dfm_work *w);
void dfm_work_mpi_end(dfm_work *w);
/* dfm_mpi_agree, accounted as an MPI call. */
int dfm_work_agree(dfm_work *w, const dfm_mpi *m, int rc);
/* An MPI call's return code through DFM_MPI_CHECK, with the call accounted in w. */
#define DFM_WORK_MPI(w, call) (dfm_work_mpi_begin(w), dfm_work_mpi_done((w), DFM_MPI_CHECK(call)))
static inline int dfm_work_mpi_done(dfm_work *w, int rc) {
    dfm_work_mpi_end(w);
    return rc;
}
/* The CPU seconds outside MPI since the last call (or the start) go to phase 0 or 1 (index: training,
 * adding; retrieve: tuning and recall, the rounds). */
void dfm_work_phase(dfm_work *w, int phase);
/* bytes_sent of an allreduce or bcast of `bytes` on P ranks (ring: 2 S (P-1) / P). */
void dfm_work_ring(dfm_work *w, uint64_t bytes, int P);
/* CPU seconds of the process so far. */
double dfm_cpu_now(void);

/* Collective: every rank's record to rank 0, which gets {"ranks": [{...}, ...], "total": {...},
 * "max_rank": {...}} in *out (others NULL): the counts, "cpu_s" (outside MPI), the two phases' CPU
 * seconds under the names phase0 and phase1, "mpi_s", "mpi_cpu_s" and "wall_s" of each rank, their
 * sums and the largest of each. */
int dfm_work_gather(const dfm_mpi *m, dfm_work *w, const char *phase0, const char *phase1, json_t **out);

#endif
