/* index_train.h — train an index with every rank of `dfm index`.
 *
 * The training sample (dfm_sample_ids: plan->train_n seeded, stratified ids) is cut into blocks of
 * DFM_TRAIN_BLOCK sample points; rank r of P holds the blocks [r*nb/P, (r+1)*nb/P) and reads only their
 * rows, so no rank holds the whole sample. For an IVF index with a flat coarse quantiser:
 *
 *   1. the coarse quantiser: k-means of the sample into nlist centroids (retriever/kmeans.h: 10
 *      iterations, spherical for inner product, as FAISS's IVF training), the initial centroids the
 *      sample points of a seeded stratified draw;
 *   2. IVF-PQ: the product quantiser: k-means of the residuals (point minus its nearest centroid) of
 *      every s-th sample point (at most 256 x 2^nbits points, as FAISS caps it) into M codebooks of
 *      2^nbits centroids (25 iterations, L2); no polysemous training;
 *      IVF-Flat: nothing more; other encodings (SQ, ...): FAISS trains them on rank 0 on every s-th
 *      point (at most 65,536), after the coarse quantiser is set;
 *   3. rank 0 makes the trained empty index from those codebooks (dfm_ivf_trained) and broadcasts it.
 *
 * Every reduction is exact (kmeans.h), every SGEMM has the same shape whichever rank runs it, so the
 * trained index is the same bytes on any number of ranks. Indexes without such an IVF level (HNSW,
 * PCA / OPQ transforms, IMI, an HNSW coarse quantiser) are trained by FAISS on rank 0, which then
 * gathers the whole sample: the one case where rank 0 holds it.
 */
#ifndef DFM_RETRIEVER_INDEX_TRAIN_H
#define DFM_RETRIEVER_INDEX_TRAIN_H

#include "common/mpiutil.h"
#include "retriever/index.h"
#include "retriever/topk.h"
#include "retriever/work.h"

#include <jansson.h>

#define DFM_TRAIN_BLOCK 256 /* sample points per block (small: the blocks spread evenly over many ranks) */
#define DFM_COARSE_ITERATIONS 10
#define DFM_PQ_ITERATIONS 25

/* Collective. The trained empty index (FAISS's serialisation) in *tbuf / *tlen on every rank; rank 0
 * gets how it was trained in *training ({"mode": "distributed" | "rank 0", ...}; others NULL). seed:
 * dfm index --seed. Counts the work (k-means distances, training points, traffic) in w. */
int dfm_index_train(const dfm_mpi *m, const dfm_index_plan *plan, const dfm_vec_source *vs, uint64_t seed, uint8_t **tbuf, size_t *tlen,
                    json_t **training, dfm_work *w);

#endif
