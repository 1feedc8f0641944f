/* target_writer.h — build one target shard (an LMDB environment) safely.
 *
 * One writer per shard. The shard is built in RUN/targets/shard-SSSSS.tmp/ (any leftover from an
 * earlier, killed attempt is removed first), records are appended in chunk-id order in transactions
 * of batch_records, the map is sized from an estimate and doubled on MDB_MAP_FULL (the batch is
 * replayed), and dfm_target_writer_finish() syncs, writes shard.json last and renames the folder
 * to RUN/targets/shard-SSSSS/. A folder without shard.json, or a .tmp folder, is never complete.
 *
 *   dfm_target_writer *w;
 *   DFM_TRY(dfm_target_writer_open(&cfg, &w));
 *   for (id = first; id < first + n; id++) { encode...; rc = dfm_target_writer_put(w, id, rec, len, mask); }
 *   rc = dfm_target_writer_finish(w, &meta);   // or dfm_target_writer_abort(w) after an error
 *
 * Fault injection for tests: DFM_FAULT_TARGETS_KILL_AFTER=N makes the process SIGKILL itself after its
 * N-th put (counted over all shards of the process).
 */
#ifndef DFM_TARGET_WRITER_H
#define DFM_TARGET_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "shard/target_layout.h"

typedef struct dfm_target_writer dfm_target_writer;

typedef struct {
    const char *run_dir;
    uint32_t shard, n_shards;
    uint64_t n_chunks_total;  /* N: shard ranges come from N and n_shards */
    dfm_trec_params rec;      /* k, d, dtype, ids_only, shuffle, level */
    const char *fingerprint;  /* run fingerprint (16 hex digits) recorded in shard.json */
    uint32_t batch_records;   /* records per transaction (0 = 512) */
    uint64_t map_bytes;       /* initial map size (0 = estimate from the record size) */
} dfm_target_writer_config;

/* Start building shard cfg->shard. Creates RUN/targets/ if needed, removes a stale .tmp folder.
 * DFM_EARG on bad config, DFM_EIO / DFM_ELMDB naming the path. */
int dfm_target_writer_open(const dfm_target_writer_config *cfg, dfm_target_writer **out);

/* Append one encoded record (from dfm_trec_encode) for chunk_id, which must be the next id of the
 * shard's range (DFM_EINTERNAL otherwise: records go in key order without gaps). mask is the
 * record's validity mask (for the padded-slot count of shard.json). */
int dfm_target_writer_put(dfm_target_writer *w, uint64_t chunk_id, const void *rec, size_t n, uint64_t mask);

/* store = ids: append the table rows (d elements of dtype each) of the shard's next n chunk ids. */
int dfm_target_writer_put_rows(dfm_target_writer *w, const void *rows, uint64_t n);

/* Commit, sync, write shard.json and rename the folder into place. Every id of the range must have a
 * record (and a table row with store = ids): DFM_EINTERNAL otherwise. meta (may be NULL) receives
 * what shard.json holds. Frees w, also on failure (the .tmp folder is then removed). */
int dfm_target_writer_finish(dfm_target_writer *w, dfm_target_shard_meta *meta);

/* Give up: close and remove the .tmp folder. Frees w. NULL is a no-op. */
void dfm_target_writer_abort(dfm_target_writer *w);

/* Bytes of map a shard of n records of these parameters is estimated to need. */
uint64_t dfm_target_map_estimate(const dfm_trec_params *p, uint64_t n);

#endif
