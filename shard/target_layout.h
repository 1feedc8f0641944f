/* target_layout.h — where a run's target shards live and how they announce themselves.
 * Spec: schemas/target_record.md ("Files").
 *
 *   RUN/targets/shard-SSSSS/          one LMDB environment per shard (a folder; no lock file)
 *       data.mdb                      records, key = chunk id (8-byte big-endian), ids [first, first+n)
 *       table.bin                     store = ids only: the embeddings of the shard's own chunks
 *       shard.json                    written last: counts, bytes, checksum of all records, fingerprint
 *   RUN/targets/shard-SSSSS.tmp/      the same while being built; renamed when complete
 *
 * Shard s holds the chunk ids [s*span, min(N, (s+1)*span)) with span = ceil(N / n_shards): the
 * layout depends on N and --target-shards only, never on the number of ranks.
 */
#ifndef DFM_TARGET_LAYOUT_H
#define DFM_TARGET_LAYOUT_H

#include <jansson.h>
#include <stdint.h>

#include "schemas/target_record.h"

#define DFM_TARGET_SHARD_FORMAT "dfm-target-shard"
#define DFM_TARGET_SHARD_VERSION 1
#define DFM_TTAB_MAGIC "DFMTTAB1"
#define DFM_TTAB_VERSION 1u
#define DFM_TTAB_HEADER_BYTES 64u

/* ceil(n_chunks / n_shards) (at least 1). */
uint64_t dfm_target_span(uint64_t n_chunks, uint32_t n_shards);
/* The id range of shard s. */
void dfm_target_shard_range(uint64_t n_chunks, uint32_t n_shards, uint32_t s, uint64_t *first, uint64_t *count);
/* malloc'd "RUN/targets/shard-SSSSS" (tmp = 0) or "....tmp" (tmp = 1); NULL on no memory. */
char *dfm_target_shard_dir(const char *run_dir, uint32_t s, int tmp);

/* What shard.json holds. */
typedef struct {
    uint32_t shard, n_shards;
    uint64_t n_chunks_total;  /* N of the run */
    uint64_t first_chunk, n_chunks; /* the shard's range */
    uint64_t records;         /* == n_chunks when complete */
    uint32_t k, d;
    int dtype, ids_only, shuffle, level;
    int slots;                /* DFM_TREC_SLOTS_*: what the slots hold; "slots" in shard.json and the format, written
                               * only when not neighbour (absent = neighbour, as in runs from before the option) */
    uint64_t raw_bytes;       /* sum of logical payload sizes */
    uint64_t stored_bytes;    /* sum of record sizes (header + stored payload) */
    uint64_t records_checksum; /* XXH3-64 stream over (key, payload checksum) of every record in order */
    uint64_t data_bytes;      /* size of data.mdb after the writer closed it */
    uint64_t table_bytes;     /* size of table.bin (ids only), else 0 */
    uint64_t empty_records;   /* records without any valid slot */
    uint64_t seq_starts;      /* records flagged SEQ_START */
    uint64_t padded_slots;    /* masked slots in records that have at least one valid slot */
    char fingerprint[17];     /* 16 hex digits: run fingerprint (see dfm_target_fingerprint) */
    uint64_t n_ids;           /* the targets format only: neighbour ids are chunks of a datastore run of n_ids chunks
                               * (a query-only run, dfm retrieve --datastore); 0: this run's own chunks */
} dfm_target_shard_meta;

/* Write DIR/shard.json atomically. */
int dfm_target_meta_write(const char *dir, const dfm_target_shard_meta *m);
/* Read and validate DIR/shard.json (format, version, field types). DFM_ENOTFOUND when absent. */
int dfm_target_meta_read(const char *dir, dfm_target_shard_meta *m);
/* DFM_EMISMATCH (naming the shard dir and the first differing field) unless a and b describe the
 * same shard of the same run and options (counts and checksums are not compared). */
int dfm_target_meta_same_config(const char *dir, const dfm_target_shard_meta *a, const dfm_target_shard_meta *b);

/* Fingerprints of the upstream stages present in a manifest: a new object {"chunk": "hex16", ...},
 * each the XXH3-64 of the stage's "config" and "inputs" (sorted, compact JSON). Stages considered:
 * chunk, encode, index, retrieve. */
json_t *dfm_target_upstream(json_t *manifest);
/* Run fingerprint: XXH3-64 of the upstream object and the target format (k, d, dtype, store,
 * shuffle, level, shards, N; n_ids and slots when not 0), as 16 hex digits. */
void dfm_target_fingerprint(json_t *upstream, const dfm_target_shard_meta *fmt, char out[17]);
/* Compare the upstream fingerprints a run's targets were built from (stored) with those of a
 * manifest now (current, from run 'where'). DFM_EMISMATCH naming the first differing stage. */
int dfm_target_upstream_check(json_t *stored, json_t *current, const char *targets_run, const char *where);

/* The "format" object of the manifest's targets stage: {"record_version", "k", "d", "dtype", "store",
 * "shuffle", "zstd_level", "n_shards", "n_chunks", "span", "fingerprint", "upstream"}, plus "n_ids" and
 * "slots" when not 0 / neighbour. make: a new
 * object from the shard-independent fields of f and upstream (borrowed). parse: DFM_EFORMAT naming
 * run_dir when a field is missing or impossible; *upstream is borrowed from fmt. */
json_t *dfm_target_format_make(const dfm_target_shard_meta *f, json_t *upstream);
int dfm_target_format_parse(json_t *fmt, const char *run_dir, dfm_target_shard_meta *f, json_t **upstream);

/* ---- the embedding table of store = ids (table.bin) ---------------------------------------------
 * 64-byte header then n_rows rows of d elements of dtype, rows for chunk ids first..first+n_rows-1. */
typedef struct {
    char magic[8];             /* "DFMTTAB1" */
    uint32_t version;          /* 1 */
    uint32_t dtype;
    uint32_t d;
    uint32_t reserved;
    uint64_t first_chunk;
    uint64_t n_rows;
    uint64_t payload_bytes;    /* n_rows * d * dtype size */
    uint64_t payload_checksum; /* XXH3-64 of the rows */
    uint64_t header_checksum;  /* XXH3-64 of the 56 bytes before */
} dfm_ttab_header;
_Static_assert(sizeof(dfm_ttab_header) == DFM_TTAB_HEADER_BYTES, "table header is 64 bytes");

/* remove a folder holding only plain files (a shard dir); missing is fine. */
int dfm_target_rmdir(const char *dir);

#endif
