/* ivf.h — FAISS inverted-file indexes through the C API, the parts dfm uses beyond search():
 *
 *   - the coarse quantiser on its own: a query's probe lists and coarse distances, computed once (at the
 *     query's owner) and then used by every shard (faiss_IndexIVF_search_preassigned), instead of every
 *     shard quantising every query again;
 *   - each shard's list sizes, to count the codes a search scans;
 *   - a trained empty IVF index made from codebooks trained outside FAISS (retriever/index_train.c).
 *
 * Identical results: FAISS's IndexIVF::search is quantizer->search followed by search_preassigned with
 * the same lists and distances, and both compute each query on its own; so a query's result does not
 * depend on which batch, which rank or which path assigned it, provided the quantiser search takes the
 * same float path: FAISS's flat search uses other float code below 20 queries, so the assignment runs
 * on at least DFM_MIN_SEARCH_BATCH queries (padded) — as dfm_shard_topk pads its own searches.
 */
#ifndef DFM_RETRIEVER_IVF_H
#define DFM_RETRIEVER_IVF_H

#include "retriever/index.h"

#include <faiss/c_api/IndexIVF_c.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    FaissIndexIVF *ivf;    /* the index as an IVF (borrowed; NULL: not a plain IVF index) */
    FaissIndex *quantizer; /* its coarse quantiser (borrowed) */
    uint64_t nlist;
    uint64_t *list_sizes;  /* entries per list in this index (owned) */
} dfm_ivf;

/* v for idx: an IVF index whose coarse quantiser is a flat index (IVFn,Flat / PQ / SQ ...; not
 * wrapped in a transform, not IMI or HNSW-quantised) and whose inverted lists are FAISS's plain array
 * lists with a list scanner (dfm_ivf_plain_lists: not fast-scan, whose search_preassigned crashes in
 * FAISS 1.7.3, nor on-disk or block lists). Otherwise DFM_OK with v->ivf = NULL: such indexes are
 * searched with faiss_Index_search, assign their queries themselves and are sharded by id range. */
int dfm_ivf_open(FaissIndex *idx, dfm_ivf *v);
void dfm_ivf_close(dfm_ivf *v);
/* Probe lists per query: min(the index's nprobe, nlist). */
size_t dfm_ivf_nprobe(const dfm_ivf *v);

/* The nprobe nearest lists of each of nq queries and their coarse distances (lists[q*nprobe + j],
 * dis[q*nprobe + j], nearest first): the search FAISS's IndexIVF::search makes. */
int dfm_ivf_assign(const dfm_ivf *v, size_t nq, const float *q, size_t nprobe, int64_t *lists, float *dis);

/* kp nearest entries of each query among its given lists (FAISS's order and labels, as search()),
 * the queries split over OpenMP threads. The index's nprobe is set to nprobe. */
int dfm_ivf_search_assigned(void *ctx, size_t nq, const float *q, size_t kp, size_t nprobe, const int64_t *lists, const float *dis,
                            float *dist, int64_t *labels);

/* A running count of the codes FAISS's IVF searches compared (its global statistics; for searches that
 * assign their queries themselves). ctx is unused. */
uint64_t dfm_ivf_stats_scanned(void *ctx);

/* A trained, empty IVF index of plan->factory (an IVF with a flat quantiser) as FAISS serialises it:
 * coarse centroids (nlist x dim) put into the quantiser; then either pq (IVF-PQ: the M codebooks of
 * 2^nbits centroids of dim/M values, M-major, as FAISS's ProductQuantizer stores them) written into
 * the serialised index, or the residual encoder trained by FAISS on the train_n points train_x (Flat:
 * nothing to train; SQ and others). The PQ codebook goes in through the serialisation because the
 * C API has no setter: the untrained index is written, its layout checked field by field (FAISS's
 * "IwPQ" record: header, quantiser, by_residual, code_size, pq d/M/nbits, centroid vector, empty
 * "ilar"/"sprs" lists), is_trained and the centroids replaced, read back and written again, which must
 * give the same bytes. DFM_EINTERNAL if the layout is not the expected one. */
int dfm_ivf_trained(const dfm_index_plan *plan, uint32_t dim, const float *coarse, const float *pq, uint64_t train_n, const float *train_x,
                    uint8_t **buf, size_t *len);

/* Whole inverted lists moved between shards without FAISS assigning or encoding their vectors again,
 * through FAISS 1.7.3's serialisation of an IVF index: the prefix of the trained empty index (header,
 * quantiser, encoder: its serialisation less the 32-byte empty list record) followed by the
 * ArrayInvertedLists record "ilar": nlist, code_size, "full" (nlist sizes) or "sprs" ((list, size)
 * pairs), then each non-empty list's codes (size x code_size bytes) and ids (size x 8 bytes), in list
 * order; nothing follows it (IwFl, IwPQ, IwSq ...). Every field is checked; DFM_EINTERNAL names what
 * differs. */
typedef struct {
    uint64_t nlist, code_size, ntotal;
    uint64_t *sizes;     /* entries per list (owned) */
    const uint8_t *data; /* per non-empty list, in list order: codes, then ids */
} dfm_ivf_lists;

/* The lists of buf (a serialised IVF index), whose prefix is the trained empty index's (tbuf, tlen):
 * the same bytes but the vector count. lists->data points into buf. */
int dfm_ivf_lists_view(const uint8_t *buf, size_t n, const uint8_t *tbuf, size_t tlen, dfm_ivf_lists *lists);
/* An index made of the trained empty index (tbuf, tlen) and the lists sizes / data (the layout of
 * dfm_ivf_lists.data), read by FAISS; its vector count and list sizes are checked. */
int dfm_ivf_from_lists(const uint8_t *tbuf, size_t tlen, uint64_t nlist, uint64_t code_size, const uint64_t *sizes, const uint8_t *data,
                       size_t data_len, FaissIndex **out);

/* The index's encoding after the IVF level, from the serialised untrained index: 'F' flat vectors
 * ("IwFl"), 'P' product quantiser ("IwPQ"), 'O' other (SQ, fast-scan, refine ...); with its PQ's M and
 * bits for 'P'. *kind 0 when plan->factory is not an IVF index with a flat quantiser. */
int dfm_ivf_encoding(const dfm_index_plan *plan, uint32_t dim, char *kind, uint32_t *pq_m, uint32_t *pq_nbits);

#endif
