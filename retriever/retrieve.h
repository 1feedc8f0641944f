/* retrieve.h — the index and retrieve stages over abstract sources (MPI collectives).
 *
 * Both stages take the corpus as a dfm_vec_source (stored embeddings by chunk id) and a
 * dfm_chunk_source (chunk metadata), plus the block geometry of the embedding files, so they run on a
 * real run directory (retriever/run_sources.h wraps its embedding and chunk sets) and on synthetic data in
 * tests alike. Rank r of P owns the contiguous blocks [r*nb/P, (r+1)*nb/P) of block_chunks ids each:
 * it adds those vectors to its index shard, and it asks the queries of those chunks.
 *
 * Distributed top-K (dfm_dsearch): every rank contributes a block of queries; for an IVF index it
 * first computes their probe lists and coarse distances itself (dfm_ivf_assign: each query is
 * quantised once, by its owner). An IVF index is sharded by list (every list whole in one rank's
 * shard): each query, with its lists, goes only to the ranks holding them; other indexes are sharded by
 * id, and every query goes to every rank. Each rank searches what it receives in each of its shards,
 * scanning only the given lists (dfm_shard_topk: exact scores, exclusions, deeper re-search with the
 * same lists), and the per-shard lists go back to the query's owner, which merges them into the global
 * top-K (score, then id). The result does not depend on P, on the sharding, nor on which rank assigned
 * a query.
 */
#ifndef DFM_RETRIEVER_RETRIEVE_H
#define DFM_RETRIEVER_RETRIEVE_H

#include "common/mpiutil.h"
#include "retriever/index.h"
#include "retriever/ivf.h"
#include "retriever/topk.h"
#include "retriever/work.h"

#include <jansson.h>

typedef struct {
    const char *run_dir;
    const char *factory;   /* NULL / "auto": dfm_index_plan_make decides */
    uint32_t metric;       /* DFM_METRIC_IP / L2 */
    uint64_t mem_budget;   /* bytes per rank (0: 4 GiB) */
    uint64_t train_sample; /* 0: default */
    uint64_t seed;
} dfm_index_opts;

/* Build the index shards RUN/index/index-RRRRR.{faiss,json} for rank r's blocks: every rank trains
 * (retriever/index_train.h), rank 0 writes the trained empty index (DFM_INDEX_TRAINED_FILE) and
 * broadcasts it, each rank adds its vectors. All-padding chunks (n_valid == 0) are not added.
 * Collective; on success rank 0 gets a new "index" stage object for the manifest in *stage (others
 * NULL), with every rank's work record ("work", retriever/work.h). */
int dfm_index_build(const dfm_mpi *m, const dfm_index_opts *o, const dfm_vec_source *vs, const dfm_chunk_source *cs,
                    uint64_t block_chunks, json_t **stage);

typedef struct {
    const char *run_dir;
    const char *datastore_run; /* NULL: RUN searches its own index; else the run whose index and rows it searches */
    uint32_t k, margin, exclude, window;
    uint64_t query_block;   /* queries per rank per round */
    int metric;             /* -1: the index's; else checked against it */
    int64_t nprobe;         /* > 0: used as given; 0: tuned to target_recall (IVF) */
    int64_t ef_search;      /* > 0: used as given; 0: tuned to target_recall (HNSW) */
    double target_recall;   /* the recall@K the untuned parameter is raised to (dfm retrieve: 0.95); 0: FAISS default */
    uint32_t max_margin;    /* approximate indexes: the tuning may widen margin up to this when more lists stop helping
                             * (<= margin: the margin stays as given) */
    uint64_t measure_recall; /* sampled queries for recall@K against brute force (0: none) */
    uint64_t seed;
} dfm_retrieve_opts;

/* Retrieve the top-K neighbours of every chunk into RUN/retrieve/nbr-BBBBBB.bin (one file per block).
 * vs, cs (block_chunks rows per block): RUN's chunks, whose queries are asked. ds_vs, ds_cs: NULL, or
 * the datastore run o->datastore_run (a query-only run: the neighbours are the datastore's chunks,
 * searched in its index and rescored from its rows; --exclude must be none; the blocks record the
 * datastore's chunk count as n_ids). index_stage is the manifest's "index" stage of the run searched
 * (borrowed). Collective; rank 0 gets the "retrieve" stage object in *stage. */
int dfm_retrieve_run(const dfm_mpi *m, const dfm_retrieve_opts *o, const dfm_vec_source *vs, const dfm_chunk_source *cs,
                     uint64_t block_chunks, const dfm_vec_source *ds_vs, const dfm_chunk_source *ds_cs, json_t *index_stage, json_t **stage);

/* Which ranks hold entries of each inverted list: ranks rank[off[l] .. off[l+1]) for list l. */
typedef struct {
    uint64_t nlist;
    uint32_t *off;
    int32_t *rank;
} dfm_route;

/* The collective search of one round: this rank's nq queries in, their merged top-K out (out[q*k],
 * n_out[q]). searchers: this rank's shards. quant: the IVF coarse quantiser that assigns this rank's
 * queries (the same nprobe on every rank; then every searcher that can searches with those lists), or
 * NULL on every rank (each shard assigns the queries itself). route (with quant; NULL on every rank or
 * on none): a query goes only to the ranks that hold entries of one of its lists (the index is sharded
 * by list); without it, to every rank. w (may be NULL): MPI time and bytes. */
int dfm_dsearch(const dfm_mpi *m, const dfm_shard_searcher *searchers, int n_searchers, const dfm_ivf *quant, const dfm_route *route,
                const dfm_search_params *p, const dfm_vec_source *vs, const dfm_chunk_source *cs, const dfm_query *qs, const float *qv,
                size_t nq, dfm_hit *out, uint32_t *n_out, dfm_search_counts *c, dfm_work *w);

/* Rank r's embedding blocks [*b0, *b1) of the ceil(n / block_chunks) blocks on size ranks. */
void dfm_block_range(uint64_t n, uint64_t block_chunks, int rank, int size, uint64_t *b0, uint64_t *b1);
/* DFM_EMISMATCH when the sources do not hold the same rows; DFM_EARG for block size 0. */
int dfm_check_sources(const dfm_vec_source *vs, const dfm_chunk_source *cs, uint64_t block_chunks);

/* recall of approx against exact lists: sum |approx ∩ exact| over sum |exact| (1 if both empty). */
double dfm_recall(const dfm_hit *approx, const uint32_t *na, const dfm_hit *exact, const uint32_t *ne, size_t nq, uint32_t k);

#endif
