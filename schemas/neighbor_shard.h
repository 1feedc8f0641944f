/* neighbor_shard.h — the neighbour block: top-K retrieval results of a range of query chunks.
 * Spec: schemas/neighbor_shard.md. Written by `dfm retrieve`, read by the target writer.
 *
 * RUN/retrieve/nbr-BBBBBB.bin holds the rows of chunk ids [first_chunk, first_chunk + n_rows), one row
 * per chunk, in id order. Blocks use the embedding blocks' geometry, so the files (and their bytes) do
 * not depend on the number of ranks.
 *
 * File = 128-byte header, then n_rows rows. One row (row_bytes = 8*K + 4*K2 + 8, K2 = K rounded up to
 * even, so every row starts 8-byte aligned):
 *   int64  ids[K]      neighbour chunk ids in rank order (best first); -1 in an empty slot
 *   float  scores[K]   the metric's value for each slot (inner product: higher is better; L2: squared
 *                      distance, lower is better); 0 in an empty slot
 *   float  pad         only when K is odd; zero
 *   uint64 mask        bit j set <=> slot j holds a real neighbour (ids[j] >= 0)
 * Real slots always come first: if bit j is clear, every bit above j is clear. mask == 0 means the chunk
 * has no target (first chunk of a training sequence, or nothing survived the exclusions).
 * Within the real slots, scores are ordered best first; equal scores are ordered by id ascending.
 * All integers and floats little-endian. K <= 64.
 */
#ifndef DFM_NEIGHBOR_SHARD_H
#define DFM_NEIGHBOR_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define DFM_NBR_MAGIC "DFMNBRS1"
#define DFM_NBR_VERSION 1u
#define DFM_NBR_HEADER_BYTES 128u
#define DFM_NBR_MAX_K 64u

/* metric (header field) */
enum { DFM_METRIC_IP = 0u, DFM_METRIC_L2 = 1u };
/* exclusion policy recorded in the header (see dfm retrieve --exclude) */
enum { DFM_EXCLUDE_NONE = 0u, DFM_EXCLUDE_SELF = 1u, DFM_EXCLUDE_SEQUENCE = 2u, DFM_EXCLUDE_DOCUMENT = 3u };

typedef struct {
    char magic[8];             /*   0: "DFMNBRS1" */
    uint32_t version;          /*   8: DFM_NBR_VERSION */
    uint32_t header_bytes;     /*  12: 128 */
    uint32_t k;                /*  16: slots per row, 1..64 */
    uint32_t metric;           /*  20: DFM_METRIC_IP or DFM_METRIC_L2 */
    uint64_t first_chunk;      /*  24: global chunk id of row 0 */
    uint64_t n_rows;           /*  32: rows in this block */
    uint64_t row_bytes;        /*  40: 8*K + 4*K2 + 8 */
    uint64_t n_chunks_total;   /*  48: chunks in the corpus; every real id is < this */
    uint32_t exclude;          /*  56: DFM_EXCLUDE_* used */
    uint32_t query_window;     /*  60: W, preceding chunks averaged into a query */
    uint64_t payload_bytes;    /*  64: n_rows * row_bytes */
    uint64_t payload_checksum; /*  72: XXH3-64 of the payload */
    uint64_t index_hash;       /*  80: identifies the index the rows came from (0 = unknown) */
    uint64_t n_ids;            /*  88: 0: ids are this run's chunks (< n_chunks_total); else ids are chunks of a
                                *      datastore run of n_ids chunks (dfm retrieve --datastore), every real id < n_ids */
    uint8_t reserved[24];      /*  96: zero */
    uint64_t header_checksum;  /* 120: XXH3-64 of the 120 bytes before this field */
} dfm_nbr_header;

_Static_assert(sizeof(dfm_nbr_header) == 128, "neighbour header is 128 bytes");

/* Bytes of one row for K slots. */
static inline uint64_t dfm_nbr_row_bytes(uint32_t k) { return 8ull * k + 4ull * ((k + 1u) & ~1u) + 8ull; }

/* One row, as pointers into a block (or a caller's arrays). */
typedef struct {
    uint64_t chunk_id;
    uint32_t k;
    const int64_t *ids;  /* K */
    const float *scores; /* K */
    uint64_t mask;
} dfm_nbr_row;

/* Check one row's invariants: mask bits only below K, real slots first, ids[j] >= 0 exactly where the
 * bit is set and < id_bound (dfm_nbr_id_bound), empty slots hold id -1, scores finite and ordered (metric order,
 * then id ascending on ties). Returns DFM_OK or DFM_EFORMAT saying which slot and why (the caller
 * prefixes the file name). */
int dfm_nbr_row_check(const dfm_nbr_row *row, uint32_t metric, uint64_t id_bound);
/* Every real neighbour id of a block with header h is below this: n_ids when set (a datastore run's
 * chunks), else n_chunks_total. */
static inline uint64_t dfm_nbr_id_bound(const dfm_nbr_header *h) { return h->n_ids ? h->n_ids : h->n_chunks_total; }

/* ---- writing ---------------------------------------------------------------------------------- */
typedef struct dfm_nbr_writer dfm_nbr_writer;

/* Start a block at PATH (buffered in memory, written under a temporary name at close). hdr supplies
 * k, metric, first_chunk, n_rows, n_chunks_total, n_ids, exclude, query_window, index_hash; the rest is
 * filled in. DFM_EARG if K is 0 or > 64, or the metric/exclusion is unknown. */
int dfm_nbr_writer_open(const char *path, const dfm_nbr_header *hdr, dfm_nbr_writer **out);
/* Append the next row (ids and scores have K entries). The row is checked with dfm_nbr_row_check;
 * a bad row is DFM_EINTERNAL (the writer never produces one). */
int dfm_nbr_writer_add(dfm_nbr_writer *w, const int64_t *ids, const float *scores, uint64_t mask);
/* Finish: all n_rows rows must have been added; header with checksums, fsync, rename. Frees w. */
int dfm_nbr_writer_close(dfm_nbr_writer *w);
/* Give up: nothing is left on disk. Frees w. NULL is a no-op. */
void dfm_nbr_writer_abort(dfm_nbr_writer *w);

/* ---- reading ---------------------------------------------------------------------------------- */
typedef struct {
    char *path;
    dfm_nbr_header hdr;
    const uint8_t *map; /* whole file, mmap'd read-only */
    size_t map_bytes;
} dfm_nbr_block;

/* Open and fully validate: magic, version, header checksum, K, metric, row_bytes, payload size vs
 * file length, payload checksum, and dfm_nbr_row_check on every row. Errors name the file, the
 * field or row, and the fix. */
int dfm_nbr_block_open(const char *path, dfm_nbr_block **out);
void dfm_nbr_block_close(dfm_nbr_block *b); /* NULL is a no-op */
/* DFM_OK if the file at path opens whole (dfm_nbr_block_open's checks), else its error. */
int dfm_nbr_block_check(const char *path);
/* Row i (0-based within the block), i < n_rows. */
static inline dfm_nbr_row dfm_nbr_block_row(const dfm_nbr_block *b, uint64_t i) {
    const uint8_t *p = b->map + DFM_NBR_HEADER_BYTES + i * b->hdr.row_bytes;
    uint32_t k = b->hdr.k;
    dfm_nbr_row r = {b->hdr.first_chunk + i, k, (const int64_t *)p, (const float *)(p + 8u * k),
                     *(const uint64_t *)(p + b->hdr.row_bytes - 8)};
    return r;
}

/* ---- a run's neighbours, as one id space ------------------------------------------------------
 * Opens every block listed in RUN/manifest.json's "retrieve" stage (which must be complete; its
 * "outputs" entries have "file", "first_chunk", "n_rows"), validates each, and checks that they tile
 * [0, n_chunks) without gaps or overlaps and agree on K, metric and n_chunks_total. */
typedef struct {
    int n_blocks;
    dfm_nbr_block **blocks; /* sorted by first_chunk */
    uint64_t n_chunks;
    uint32_t k, metric;
} dfm_nbr_set;

int dfm_nbr_set_open(const char *run_dir, dfm_nbr_set **out);
void dfm_nbr_set_close(dfm_nbr_set *set); /* NULL is a no-op */
/* Row of a global chunk id; DFM_ERANGE if id >= n_chunks. */
int dfm_nbr_set_get(const dfm_nbr_set *set, uint64_t chunk_id, dfm_nbr_row *row);

#endif
