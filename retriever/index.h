/* index.h — FAISS index shards: choosing a factory string, training sample, files, search adapter.
 *
 * One index shard per rank of `dfm index`: RUN/index/index-RRRRR.faiss (FAISS's own serialisation,
 * written atomically) plus RUN/index/index-RRRRR.json (the sidecar: format "dfm-index", version,
 * dim, metric, factory, ntotal, id range, bytes, xxh128 of the .faiss file, trained_xxh128 of the
 * trained empty index every shard started from). Loading checks the sidecar against the file (size
 * and hash: a damaged file is DFM_ECHECKSUM naming it) and against what the caller expects (dim,
 * metric: DFM_EMISMATCH naming the file and both values).
 *
 * Ids in an index are global chunk ids (add_with_ids); indexes without their own id storage (Flat,
 * HNSW, PCA...,Flat) are wrapped with "IDMap,".
 */
#ifndef DFM_RETRIEVER_INDEX_H
#define DFM_RETRIEVER_INDEX_H

#include <faiss/c_api/Index_c.h>
#include <stddef.h>
#include <stdint.h>

#define DFM_INDEX_FORMAT "dfm-index"
#define DFM_INDEX_VERSION 1
#define DFM_INDEX_FLAT_MAX 100000ull /* auto choice: exact Flat up to this many vectors */
/* FAISS 1.7.3's precomputed_table_max_bytes: an L2 IVF-PQ builds its nlist x M x 2^nbits float table only
 * up to this size, and above it silently computes a table per (query, list) (IndexIVFPQ.cpp:389, 450-461) */
#define DFM_FAISS_PRECOMPUTED_TABLE_MAX (2ull << 30)
#define DFM_INDEX_TRAINED_FILE "index/trained.faiss" /* the trained empty index (hash: trained_xxh128) */

typedef struct {
    char factory[256];   /* the FAISS factory string actually used (with "IDMap," where needed) */
    uint32_t metric;     /* DFM_METRIC_IP / DFM_METRIC_L2 */
    uint64_t nlist;      /* inverted lists (0: not an IVF index) */
    uint64_t min_train;  /* fewest training points FAISS can use (lists; 2^nbits for PQ codebooks) */
    uint64_t train_n;    /* training points that will be used (0: the index needs no training) */
    int exact_scores;    /* the index ranks by exact distances (no PQ/SQ/LSH compression) */
    uint64_t bytes_per_rank; /* estimated index memory per rank (with l2_table_bytes when l2_table_used) */
    uint64_t l2_table_bytes; /* L2 IVF-PQ: FAISS's precomputed table, nlist x M x 2^nbits x 4 bytes, held by every
                                loaded copy of the index; 0 for other indexes and for inner product (needs none) */
    int l2_table_used;       /* l2_table_bytes <= DFM_FAISS_PRECOMPUTED_TABLE_MAX: FAISS builds and uses it */
    char why[512];       /* the reason for the choice, for the log and the manifest */
} dfm_index_plan;

/* Decide the index for n vectors of dim values on nranks ranks. factory NULL or "" or "auto": choose
 * (Flat up to DFM_INDEX_FLAT_MAX vectors when it fits mem_budget per rank; IVF with ~4*sqrt(n) lists
 * and Flat storage when that fits; IVF-PQ with the largest code that fits otherwise). train_sample 0
 * means the default (100 per list, at least 39*256 for PQ codebooks, at most n). With metric L2, an IVF-PQ
 * counts FAISS's precomputed table (l2_table_bytes) in bytes_per_rank and in the automatic choice's fit,
 * and logs a warning when it is over DFM_FAISS_PRECOMPUTED_TABLE_MAX (FAISS then builds no table and
 * searches slower). Errors, before any work: DFM_EARG for an unusable string, a fast-scan PQ ("x4fs":
 * FAISS 1.7.3 crashes searching it with search_preassigned and has no AVX2 kernels for it here; the
 * message says so and names the PQ<M>np to use), fewer training points than lists (or than a PQ
 * codebook needs), or no index that fits the budget — each with a HINT. */
int dfm_index_plan_make(const char *factory, uint64_t n, uint32_t dim, int nranks, uint64_t mem_budget, uint32_t metric,
                        uint64_t train_sample, dfm_index_plan *plan);

/* Deterministic stratified sample of m ids out of [0, n), sorted ascending (m <= n): id j is drawn
 * uniformly from the j-th of m equal strata with a seeded generator. */
void dfm_sample_ids(uint64_t n, uint64_t m, uint64_t seed, uint64_t *out);
/* Draws [j0, j1) of the same sample (out[j - j0]), without the others: a rank's part of it. */
void dfm_sample_ids_range(uint64_t n, uint64_t m, uint64_t seed, uint64_t j0, uint64_t j1, uint64_t *out);

/* FAISS error to DFM_EFAISS with FAISS's message; returns DFM_OK when frc == 0. */
int dfm_faiss_check_at(int frc, const char *what, const char *file, int line);
#define DFM_FAISS_CHECK(call, what) dfm_faiss_check_at((call), (what), __FILE__, __LINE__)

/* Create an untrained index from a plan. */
int dfm_index_create(const dfm_index_plan *plan, uint32_t dim, FaissIndex **out);
/* Serialise an index to a malloc'd buffer / read one back. */
int dfm_index_to_buffer(const FaissIndex *idx, uint8_t **buf, size_t *n);
int dfm_index_from_buffer(const uint8_t *buf, size_t n, FaissIndex **out);

typedef struct {
    uint32_t dim, metric;
    char factory[256];
    uint64_t ntotal;            /* vectors in this shard */
    uint64_t first_id, end_id;  /* the shard holds ids in [first_id, end_id) (by list: some of them) */
    int by_list;                /* sharding "lists": whole inverted lists per shard; else "ids": an id range */
    int shard, n_shards;
    uint64_t bytes;             /* size of the .faiss file */
    char xxh128[33];            /* hash of the .faiss file */
    char trained_xxh128[33];    /* hash of the trained empty index */
    int exact_scores;
} dfm_index_info;

/* RUN/index/index-RRRRR.faiss and .json (malloc'd). */
char *dfm_index_path(const char *run_dir, int shard, const char *ext);
/* Write idx to faiss_path atomically and its sidecar next to it; fills info->bytes and ->xxh128. */
int dfm_index_write(const char *faiss_path, const FaissIndex *idx, dfm_index_info *info);
/* Load and validate a shard (see above). expect_dim 0 / expect_metric < 0: not checked. */
int dfm_index_load(const char *faiss_path, uint32_t expect_dim, int expect_metric, FaissIndex **out, dfm_index_info *info);

/* The trained empty index every shard started from (RUN/index/trained.faiss, whose XXH3-128 must equal
 * xxh128, the index stage's trained_xxh128): DFM_ENOTFOUND when absent (runs indexed before it was
 * written), DFM_ECHECKSUM when damaged, both naming the file. */
int dfm_index_load_trained(const char *run_dir, const char *xxh128, FaissIndex **out);

/* Set a search parameter ("nprobe", "efSearch") on an index (through IDMap / PreTransform wrappers).
 * DFM_EARG if the index has no such parameter. */
int dfm_index_set_param(FaissIndex *idx, const char *name, double value);

/* dfm_search_fn over a FaissIndex (ctx = the index). */
int dfm_faiss_search(void *ctx, size_t nq, const float *q, size_t kp, float *dist, int64_t *labels);

#endif
