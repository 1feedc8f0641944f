/* kmeans.h — k-means over points spread across ranks, the same bytes on any number of ranks.
 *
 * The points form one global sequence (a training sample, in sample order) cut into blocks whose
 * boundaries do not depend on the number of ranks; each rank holds whole blocks. An iteration:
 *
 *   1. every point goes to its nearest centroid: one SGEMM per block and tile of DFM_KMEANS_TILE
 *      centroids (the same shapes, hence the same floats, whichever rank computes the block), ties to
 *      the lowest centroid; inner product (largest) or squared L2 (smallest);
 *   2. each rank sums its points per centroid in 64-bit fixed point (scale 2^e, e chosen from the largest
 *      |coordinate| of all points so that no sum can overflow): integer sums are exact, so the
 *      MPI reduction gives the same bits in any order and on any number of ranks;
 *   3. every rank computes the new centroids from the same integers: sum / count in double, rounded
 *      to float (renormalised to unit length when spherical). An empty centroid takes a copy of the
 *      largest one (ties: lowest index), the two pushed apart by ±1/1024 per coordinate, as FAISS does.
 *
 * FAISS's own k-means is the model (10 iterations for a coarse quantiser, spherical for inner product;
 * 25 for product-quantiser codebooks, L2); its random tie-breaking and random split of large clusters
 * are replaced by the deterministic rules above.
 *
 * nsub > 1 runs nsub independent k-means at once, one per sub-space: sub-space s of a point is its
 * dimensions [s*dim, (s+1)*dim) (a product quantiser's M codebooks). Collective; no rank holds more
 * than its own points plus nsub*k*dim centroids and their 64-bit sums.
 */
#ifndef DFM_RETRIEVER_KMEANS_H
#define DFM_RETRIEVER_KMEANS_H

#include "common/mpiutil.h"
#include "retriever/work.h"

#include <stddef.h>
#include <stdint.h>

#define DFM_KMEANS_TILE 1024 /* centroids per SGEMM */

typedef struct {
    uint32_t dim;   /* dimensions of one sub-space (the whole vector when nsub = 1) */
    uint32_t nsub;  /* sub-spaces (1, or a PQ's M) */
    uint32_t k;     /* centroids per sub-space */
    uint32_t niter; /* iterations (assignment + update) */
    int ip;         /* 1: nearest = largest inner product; 0: smallest squared L2 */
    int spherical;  /* renormalise centroids to unit L2 norm after each update */
} dfm_kmeans_opts;

/* Train. x: this rank's points, rows of ld floats (ld >= nsub*dim), in global order, split into nblk
 * blocks of blk_rows[b] rows (the same blocks on any number of ranks); n_global: points on all ranks.
 * cent (nsub*k*dim floats, sub-space-major): in, the initial centroids, the same on every rank; out,
 * the trained ones, the same on every rank. *objective (rank 0; may be NULL): the last iteration's sum
 * of nearest scores. Counts kmeans_distances / kmeans_flops and the MPI traffic in w. */
int dfm_kmeans_train(const dfm_mpi *m, const dfm_kmeans_opts *o, const float *x, size_t ld, const uint64_t *blk_rows, size_t nblk,
                     uint64_t n_global, float *cent, double *objective, dfm_work *w);

/* The nearest centroid of each of n rows of x (ld floats apart), per sub-space: assign[i*nsub + s].
 * One block of rows at a time, as in dfm_kmeans_train (the same floats for the same block). Not
 * collective; counts in w (may be NULL). DFM_ENOMEM only. */
int dfm_kmeans_assign(const dfm_kmeans_opts *o, const float *cent, const float *x, size_t ld, uint64_t n, int32_t *assign, dfm_work *w);

/* Collective: the rows with global indices picks[0..npick) (any order; each held by exactly one rank:
 * this rank holds global rows [g0, g0 + n_local) of x, ld floats apart) into out (npick x width floats)
 * on every rank, bit for bit (an OR of the owners' bits with zeros elsewhere). */
int dfm_kmeans_gather_rows(const dfm_mpi *m, const float *x, size_t ld, uint64_t g0, uint64_t n_local, const uint64_t *picks, size_t npick,
                           size_t width, float *out, dfm_work *w);

#endif
