/* audit_layout.h — the bytes of a serialised FAISS index from its layout, and the operations one query and one
 * build do in it: the cost model of `dfm audit --measure-tokens` (audit_model.h fits rates to these counts).
 *
 * The families are those `dfm index` chooses (retriever/index.c) and the audit's token-level IVF-PQ:
 *   "IDMap,Flat"          header, n·d floats, n ids
 *   "IVF<nlist>,Flat"     header, the coarse quantizer (nlist·d floats), the inverted lists (n·(4d + 8) bytes,
 *                         a list-size table)
 *   "IVF<nlist>,PQ<m>"    the same with m-byte codes (n·(m + 8)) and the PQ codebooks (2^nbits·d floats)
 * ("np" after PQ<m> and "x<nbits>" are understood). The byte count is exact arithmetic over FAISS 1.7.3's
 * serialisation (faiss/impl/index_write.cpp: a 37-byte index header with fourcc, vectors as an 8-byte length
 * and their bytes, the "ilar" array lists written "full" when more than half the lists hold vectors and
 * "sprs" otherwise); tests/unit/test_audit_layout.c checks it against faiss_write_index of real indexes. */
#ifndef DFM_AUDIT_LAYOUT_H
#define DFM_AUDIT_LAYOUT_H

#include <faiss/c_api/Index_c.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { DFM_AUDIT_FLAT = 1, DFM_AUDIT_IVF_FLAT = 2, DFM_AUDIT_IVF_PQ = 3 } dfm_audit_family;

typedef struct {
    dfm_audit_family family;
    uint32_t dim;
    uint32_t metric;   /* DFM_METRIC_IP / DFM_METRIC_L2 */
    uint64_t nlist;    /* IVF lists (0 for Flat) */
    uint32_t pq_m;     /* PQ sub-quantizers (IVF-PQ) */
    uint32_t pq_nbits; /* bits per sub-quantizer code (8 unless "x<nbits>") */
} dfm_audit_layout;

/* The layout of factory (as dfm_index_plan_make writes it) over keys of width dim. DFM_EARG naming the string
 * when it is not one of the families above (e.g. HNSW, SQ, OPQ: the audit has no cost model for them). */
int dfm_audit_layout_parse(const char *factory, uint32_t dim, uint32_t metric, dfm_audit_layout *l);

/* Lists of an IVF index (found through an IDMap wrapper) that hold at least one key; 0 for any other index. */
uint64_t dfm_audit_nonempty_lists(const FaissIndex *idx);

/* The family's name for a person: "Flat", "IVF-Flat", "IVF-PQ". */
const char *dfm_audit_family_name(dfm_audit_family f);

/* Bytes per stored key (code + id): 4·dim + 8 for Flat families, ceil(m·nbits/8) + 8 for IVF-PQ. */
double dfm_audit_layout_bytes_per_key(const dfm_audit_layout *l);

/* Serialised bytes of the index holding n keys, of which nonempty_lists IVF lists hold at least one (pass
 * nlist, or the count from the index; ignored for Flat). Exact for FAISS 1.7.3. */
double dfm_audit_layout_bytes(const dfm_audit_layout *l, uint64_t n, uint64_t nonempty_lists);

/* Operations of one search of top-k in an index of n keys visiting nprobe lists (capped at nlist; 0: 1, FAISS's
 * default), as expected values (n/nlist keys per list):
 *   flops    float multiply-adds: coarse distances (nlist·d), full-vector distances of the keys scanned
 *            (Flat, IVF-Flat: ·d each), the PQ distance tables (2^nbits·d per query, plus 2^nbits·m per list
 *            visited under L2, where FAISS adds the residual term)
 *   codes    code bytes looked up and candidates compared: each key scanned costs m table look-ups (IVF-PQ)
 *            or 1 comparison (Flat, IVF-Flat), plus the k-selection of the result, k·log2(k)
 *   scanned  keys scanned (for the report) */
typedef struct {
    double flops, codes, scanned;
} dfm_audit_search_ops;
void dfm_audit_search_ops_of(const dfm_audit_layout *l, double n, double nprobe, double k, dfm_audit_search_ops *o);

/* Operations of one build (train on train_n keys, add n): FAISS's k-means runs 25 iterations (ClusteringParameters)
 * on at most 256 points per centroid, the coarse one over nlist centroids and each PQ sub-quantizer over
 * 2^nbits centroids of d/m dims;
 *   train  25·(min(train_n, 256·nlist)·nlist·d + min(train_n, 256·2^nbits)·2^nbits·d) flops
 *   add    n·(nlist·d (assignment) + 2^nbits·d (PQ encoding of the residual) + d (copy)) flops */
typedef struct {
    double train, add;
} dfm_audit_build_ops;
void dfm_audit_build_ops_of(const dfm_audit_layout *l, double n, double train_n, dfm_audit_build_ops *o);

#endif
