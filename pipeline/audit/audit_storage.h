/* audit_storage.h — what a chunk's target memory costs to store: per chunk, at the run's corpus and at a large
 * corpus, for the slot layouts the trainer reads.
 *
 * A target record (schemas/target_record.h) holds a mask (8 bytes), K ids (8 bytes each), K scores (4 each) and,
 * with `--store embeddings`, the values of its K slots; with `--store ids` the values live once per datastore
 * chunk in the shard's table and the record holds the ids alone. The values of a layout: M slots a neighbour of
 * width w, b bytes a value (the run's dtype):
 *   in every record   8 + 12·K + K·M·w·b   bytes per chunk (each datastore row copied into every record naming it)
 *   ids + one table   8 + 12·K + M·w·b     bytes per chunk (the datastore is the corpus: one row per chunk)
 * uncompressed and without the record's 48-byte header and 8-byte key (zstd then takes what it can: the run's own
 * stored bytes are given beside). Layouts:
 *   the run's own     M = 1, w = the encoder's width (today's memory: one sentence vector a neighbour);
 *   LM states         the frozen LM's residual stream (`dfm-train slots`), w = its width, pooled to M = 1 (one mean
 *                     a neighbour), 4, or L (one a token: the RETRO-like upper bound).
 * The run's measured raw bytes per record must equal the arithmetic (`raw_matches`: tests/integration/audit checks it). */
#ifndef DFM_AUDIT_STORAGE_H
#define DFM_AUDIT_STORAGE_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#define DFM_AUDIT_STORAGE_ROWS 4

typedef struct {
    char what[96];
    uint32_t per_neighbour; /* M */
    uint32_t width;         /* w */
    double in_records;      /* bytes per chunk, values in every record */
    double with_table;      /* bytes per chunk, ids in the records and one table row per chunk */
} dfm_audit_storage_row;

typedef struct {
    uint32_t K, L, value_bytes;
    int n;
    dfm_audit_storage_row row[DFM_AUDIT_STORAGE_ROWS]; /* [0] the run's own layout */
    int stores_embeddings;          /* the run's records carry the values (--store embeddings) */
    double raw_per_record, stored_per_record; /* the run's measured bytes per record (0: no targets) */
    int raw_matches;                /* 1: raw_per_record is the arithmetic (row[0]'s in-records figure, or 8 + 12·K with --store
                                     * ids); 0 not; -1 no records */
} dfm_audit_storage;

/* The rows for K slots a record (the run's K, or 2K with --slots-hold both) of chunks of L tokens, the encoder's width enc_dim, the LM's width lm_width (0: no LM
 * rows), values of value_bytes; the run's measured records, raw and stored bytes (records 0: none). */
void dfm_audit_storage_of(uint32_t K, uint32_t L, uint32_t enc_dim, uint32_t lm_width, uint32_t value_bytes, int stores_embeddings,
                          uint64_t records, uint64_t raw_bytes, uint64_t stored_bytes, dfm_audit_storage *s);

/* The "storage" object of audit.json at the given corpus sizes in chunks (schemas/audit.md); NULL on no memory. */
json_t *dfm_audit_storage_json(const dfm_audit_storage *s, const double *chunks, const char *const *names, int n);

/* The "Target memory: what it costs to store" section of audit.md. */
void dfm_audit_storage_md(FILE *mf, const dfm_audit_storage *s, const double *chunks, const char *const *names, int n);

#endif
