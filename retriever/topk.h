/* topk.h — the exact part of retrieval: ordering, merging, exclusions, queries, per-shard top-K.
 *
 * Everything here is pure (no MPI, no files) and works on in-memory arrays plus two callbacks that
 * supply stored embeddings and chunk metadata by global chunk id, so it is unit-tested without a run.
 *
 * Ordering. A hit is (id, score). Inner product: higher score first; squared L2: lower first; equal
 * scores: lower id first. Scores are always the *exact* metric of the stored fp32 vectors (computed in
 * double, rounded to float), never the index's approximation, so the order is the same on any number
 * of ranks and equals a brute-force reference.
 *
 * Queries. The query of chunk i is the mean of the W chunks before it in the same training sequence
 * (W = --query-window, default 1: just chunk i-1, used as stored). For W > 1 the mean is renormalised
 * to unit L2 norm. Sources that are all padding (n_valid == 0) are left out of the mean. Chunk i has
 * no query (its row is all-masked) when it starts a sequence, is itself all padding, or has no
 * non-padding source.
 *
 * Exclusions (by id, after over-fetching). Never returned: all-padding chunks (n_valid == 0).
 *   none      nothing else
 *   self      the query chunk i and its sources [i-W', i)
 *   sequence  every chunk of i's training sequence (this includes self)          [the default]
 *   document  self, plus every chunk sharing a document with chunk i or a source
 *             (its [doc_first, doc_last] overlaps [doc_first(first source), doc_last(i)])
 */
#ifndef DFM_RETRIEVER_TOPK_H
#define DFM_RETRIEVER_TOPK_H

#include "schemas/chunk_shard.h"
#include "schemas/neighbor_shard.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t id;
    float score; /* the value hits are ordered by (see dfm_search_params.approx) */
    float aux;   /* spare (0); the ordering score is in score */
} dfm_hit;

/* 1 if a ranks before b (metric order, then id ascending). */
static inline int dfm_hit_before(const dfm_hit *a, const dfm_hit *b, uint32_t metric) {
    if (a->score != b->score) return metric == DFM_METRIC_IP ? a->score > b->score : a->score < b->score;
    return a->id < b->id;
}
/* Sort hits best first. */
void dfm_hits_sort(dfm_hit *h, size_t n, uint32_t metric);
/* Merge nlists sorted lists into the best k (out holds k); returns how many were written (<= k). */
size_t dfm_hits_merge(const dfm_hit *const *lists, const size_t *lens, int nlists, uint32_t k, uint32_t metric, dfm_hit *out);
/* Fill a neighbour row from n sorted hits: ids/scores of the first min(n,k), the rest id -1 score 0,
 * mask bit j set for each real slot. Returns the number of padded slots. */
uint32_t dfm_hits_to_row(const dfm_hit *h, size_t n, uint32_t k, int64_t *ids, float *scores, uint64_t *mask);

/* Exact score of x against y (dim values), in double then rounded: IP = x.y, L2 = |x-y|^2. */
float dfm_exact_score(const float *x, const float *y, uint32_t dim, uint32_t metric);

/* ---- corpus access ---------------------------------------------------------------------------- */
/* Stored vectors: rows of global ids [first, first+n) as fp32 into out (n*dim). */
typedef struct {
    uint32_t dim;
    uint64_t n_rows;
    int (*rows)(void *ctx, uint64_t first, uint64_t n, float *out);
    void *ctx;
    /* optional: a pointer to the stored fp32 row of an id, or NULL (not fp32, or no such shortcut) */
    const float *(*row)(void *ctx, uint64_t id);
} dfm_vec_source;

/* Chunk metadata by global id (id < n_chunks; never NULL). A chunk's sequence is id / chunks_per_seq. */
typedef struct {
    uint64_t n_chunks;
    uint32_t chunks_per_seq;
    const dfm_chunk_meta *(*meta)(void *ctx, uint64_t id);
    void *ctx;
} dfm_chunk_source;

/* A vec source over an in-memory row-major matrix; ctx = a dfm_matrix. */
typedef struct {
    const float *data;
    uint32_t dim;
    uint64_t n;
} dfm_matrix;
int dfm_vec_source_matrix_rows(void *ctx, uint64_t first, uint64_t n, float *out);
/* A chunk source over an array of metas indexed by id; ctx = the array. */
const dfm_chunk_meta *dfm_chunk_source_array_meta(void *ctx, uint64_t id);

/* Exclusion policies: parse "none|self|sequence|document" (-1 if unknown) and name them. */
int dfm_exclude_parse(const char *s);
const char *dfm_exclude_name(uint32_t policy);

/* One query, as every rank sees it. */
typedef struct {
    int64_t chunk_id;  /* the chunk whose target this is */
    int64_t src_first; /* first source chunk; sources are [src_first, chunk_id) */
    uint64_t doc_lo;   /* doc_first of chunk src_first */
    uint64_t doc_hi;   /* doc_last of chunk chunk_id */
} dfm_query;

/* Build the query of chunk i with window W. Returns 1 and fills q and vec (dim floats) when the chunk
 * has a query, 0 when it has none (see above), or a negative DFM_E* code. */
int dfm_query_build(const dfm_vec_source *vs, const dfm_chunk_source *cs, uint64_t i, uint32_t window, dfm_query *q, float *vec);

/* 1 if candidate c must not be a neighbour of q under policy. */
int dfm_excluded(uint32_t policy, const dfm_query *q, uint64_t c, const dfm_chunk_meta *cm, uint32_t chunks_per_seq);

/* ---- one shard's top-K ------------------------------------------------------------------------ */
/* A k-nearest search over one shard: for nq queries (row-major), the kp best labels (global ids, -1
 * where fewer exist) and their scores in the index's own order. */
typedef int (*dfm_search_fn)(void *ctx, size_t nq, const float *q, size_t kp, float *dist, int64_t *labels);
/* The same with each query's probe lists given (IVF: nprobe lists and coarse distances per query, from
 * dfm_ivf_assign), so that the shard does not assign the queries again. */
typedef int (*dfm_search_assigned_fn)(void *ctx, size_t nq, const float *q, size_t kp, size_t nprobe, const int64_t *lists,
                                      const float *dis, float *dist, int64_t *labels);

typedef struct {
    dfm_search_fn search;
    void *ctx;
    uint64_t ntotal;  /* vectors in the shard: the deepest useful k' */
    int exact_scores; /* 1 when the search ranks by exact distances (Flat, IVF-Flat, HNSW-Flat) */
    /* optional (IVF indexes): search with given probe lists, and the shard's entries per list */
    dfm_search_assigned_fn search_assigned;
    void *actx;
    const uint64_t *list_sizes;
    /* codes compared, for the work counts: scans_all = 1 when every search compares the whole shard
     * (Flat, brute force); else scanned (optional) is a running count the searcher keeps */
    int scans_all;
    uint64_t (*scanned)(void *ctx);
} dfm_shard_searcher;

/* Probe lists of the queries of one search (row q: lists[q*nprobe ...], dis[q*nprobe ...]). */
typedef struct {
    size_t nprobe;
    const int64_t *lists;
    const float *dis;
} dfm_probes;

/* approx = 0 (Flat, IVF-Flat, HNSW-Flat, brute force): a shard keeps its best k eligible hits by exact
 * score, and lists merge by exact score. approx = 1 (PQ, SQ, ... : the index's own scores are
 * approximate): a shard keeps its best k + margin eligible hits by the *index's* score (ties by id),
 * lists merge by that score to the global best k + margin, and only those are rescored exactly, by the
 * query's owner, and re-ranked to the final k. Either way the result does not depend on how the vectors
 * are split into shards. */
typedef struct {
    uint32_t k, margin, metric, exclude;
    int approx;
} dfm_search_params;

/* Hits a shard keeps per query: k, or k + margin for an approximate index. */
static inline uint32_t dfm_search_cap(const dfm_search_params *p) { return p->approx ? p->k + p->margin : p->k; }

/* Counts of a retrieval. The first group is a property of the run: counted once per query at its
 * owner, the same on any number of ranks (dfm audit --compare relies on it). The second group is
 * operational: summed over shard visits, so it grows with the number of index shards. */
typedef struct {
    uint64_t kept;     /* real slots written (final rows only) */
    uint64_t padded;   /* empty slots in rows that had a query */
    uint64_t no_query; /* rows without a query (all masked) */
    uint64_t excluded; /* per query: ids the exclusion policy took from its plain top-K (dfm_count_excluded) */
    uint64_t shard_searches;   /* queries searched, one per query and shard */
    uint64_t shard_candidates; /* labels fetched from indexes, all shards and all searches */
    uint64_t shard_excluded;   /* of those, dropped by exclusions */
    uint64_t researches;       /* shard searches repeated deeper */
    uint64_t codes_scanned;    /* vectors or codes the shards' searches compared (dfm_shard_searcher) */
    uint64_t exact_scores;     /* candidates rescored exactly */
    uint64_t coarse_distances; /* query x centroid distances of the probe-list assignments */
    double search_s;           /* seconds inside the index's search (the raw FAISS cost) */
} dfm_search_counts;

/* How many indexed ids (n_valid > 0) the exclusion policy removed from the plain top-K of query q:
 * those excluded by p->exclude whose exact score ranks before the query's K-th neighbour (every one of
 * them when fewer than K were kept). kept/nkept: the query's final neighbours, best first, scored
 * exactly. The count depends only on the corpus, the query and the policy, never on the sharding.
 * It enumerates the policy's id range (self: W + 1 ids; sequence: the sequence; document: the chunks
 * overlapping the documents' range) and scores each, so "document" costs that range per query. */
int dfm_count_excluded(const dfm_search_params *p, const dfm_query *q, const float *qv, const dfm_hit *kept, uint32_t nkept,
                       const dfm_vec_source *vs, const dfm_chunk_source *cs, uint64_t *count);

/* Smallest batch handed to a search function (see dfm_shard_topk). */
#define DFM_MIN_SEARCH_BATCH 32

/* Best cap = dfm_search_cap(p) non-excluded hits of each query in one shard, in rank order:
 * out[q*cap ...], n_out[q] of them. Searches k' = cap + margin first; a query whose survivors are too
 * few, or whose cap-th survivor is not clearly ahead of the deepest candidate fetched (a tie or float
 * noise at the boundary), is searched again with k' doubled up to the shard size. The result is then
 * exactly the shard's best cap eligible vectors in the index's order. With pr (not NULL) and a searcher
 * that has search_assigned, every search, the deeper ones too, uses the queries' given probe lists. */
int dfm_shard_topk(const dfm_shard_searcher *s, const dfm_search_params *p, const dfm_probes *pr, const dfm_query *qs, const float *qv,
                   size_t nq, const dfm_vec_source *vs, const dfm_chunk_source *cs, dfm_hit *out, uint32_t *n_out, dfm_search_counts *c);

/* A brute-force searcher over the vectors [first, first+n) of a vec source (blocked SGEMM). Used for
 * recall measurement and as a reference; ctx must outlive the searcher. */
typedef struct {
    const dfm_vec_source *vs;
    uint64_t first, n;
    uint32_t metric;
} dfm_bf_ctx;
int dfm_bf_search(void *ctx, size_t nq, const float *q, size_t kp, float *dist, int64_t *labels);

#endif
