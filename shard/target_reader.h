/* target_reader.h — read a run's target shards (the trainer's interface to its targets).
 *
 *   dfm_target_open_opts o = {.tokens_run = NULL, .k = 16};
 *   dfm_target_reader *r;
 *   if ((rc = dfm_target_reader_open("RUN", &o, &r))) { fprintf(stderr, "%s\n", dfm_last_error()); ... }
 *   const dfm_target_info *inf = dfm_target_reader_info(r);
 *   int64_t ids[64]; float scores[64]; float *emb = malloc(sizeof(float) * inf->k * inf->d);
 *   dfm_trec t = {.ids = ids, .scores = scores, .emb = emb};
 *   while ((rc = dfm_target_reader_next(r, &t)) == DFM_OK) { ... t.chunk_id, t.mask ... }
 *   if (rc != DFM_TARGET_END) ...error...
 *   dfm_target_reader_close(r);
 *
 * Every record is decoded and checked (header, checksum, mask/ids) before it is handed out;
 * embeddings are always returned as fp32 whatever the stored dtype, and with store = ids they are
 * looked up in the shard tables, so both store options read the same. Errors name the shard folder
 * and the key. Thread safety: one reader per thread, or serialise calls; the iterator's prefetch
 * thread is internal.
 *
 * Many readers: shards are opened MDB_RDONLY | MDB_NOLOCK (they never change once renamed in), so readers
 * take no slot in an LMDB reader table: any number of reader processes and threads, and a reader that
 * dies leaves nothing to reclaim (no lock.mdb, no slot for mdb_reader_check). What a reader holds is one
 * open file per shard; R readers of S shards in one process (dfm-train's --loader-threads up to 64,
 * dfm.Batches threads, each DataLoader worker its own process) need R x S. Open raises the soft
 * RLIMIT_NOFILE up to the hard one as needed and, beyond the hard one, is refused (DFM_ERANGE) saying
 * which limit to set (common/fsutil.h, dfm_fd_reserve). tests/py/pkg/test_many_readers.py.
 */
#ifndef DFM_TARGET_READER_H
#define DFM_TARGET_READER_H

#include <stdint.h>

#include "schemas/target_record.h"

/* dfm_target_reader_next() return value at the end of the records (positive: not an error). */
#define DFM_TARGET_END 1

typedef struct dfm_target_reader dfm_target_reader;

typedef struct {
    /* Run whose tokens the caller trains on (NULL = the targets' own run). Its manifest's upstream
     * stages (chunk, encode, index, retrieve: config and input hashes) must equal those the targets
     * were built from, or open fails with DFM_EMISMATCH naming the stage. */
    const char *tokens_run;
    uint32_t k, d;     /* expected K and d (0 = accept the run's) */
    uint64_t n_chunks; /* expected number of chunks (0 = accept) */
    int prefetch;      /* records decoded ahead by the iterator's thread: 0 = 64, < 0 = no thread */
} dfm_target_open_opts;

typedef struct {
    uint64_t n_chunks;  /* records in the run, ids 0..n_chunks-1 */
    uint32_t k, d;
    int dtype;          /* stored dtype (DFM_DTYPE_*); output is always fp32 */
    int ids_only;       /* 1: store = ids (embeddings from the tables) */
    uint32_t n_shards;
    uint64_t span;      /* chunk ids per shard (shard s holds [s*span, (s+1)*span)) */
    uint64_t raw_bytes, stored_bytes; /* totals over all records */
    char fingerprint[17];
    char generation[17];        /* the targets stage's generation (schemas/manifest.md): new per rebuild */
    char tokens_generation[17]; /* the chunk stage's of the tokens run (opts->tokens_run, else this run) */
    uint64_t n_ids;     /* neighbour ids are < n_ids: a datastore run's chunks (a query-only run); 0: ids < n_chunks */
    int slots;          /* DFM_TREC_SLOTS_* (schemas/target_record.h): neighbours, their continuations, or both
                         * (k = 2J: J neighbours, then their J continuations); each valid id is the chunk whose
                         * embedding its slot holds */
} dfm_target_info;

/* Open RUN's target shards and check them: the manifest's "targets" stage must be complete
 * (DFM_ESTATE; while a writer rebuilds it the message names that writer), upstream fingerprints must match (DFM_EMISMATCH), every shard folder must be complete
 * (DFM_ENOTFOUND: no shard.json) and belong to this run and configuration (DFM_EMISMATCH), data.mdb
 * must have the size recorded when it was written (DFM_ETRUNCATED), the record count must match,
 * and with store = ids each table.bin is checked (header, size, checksum). opts may be NULL. */
/*
 * Readers during rebuilds (schemas/manifest.md, "Readers"): the reader opens one generation whole. It
 * reads the manifests, opens and maps every shard, then reads them again; if the targets (or the tokens
 * run's chunks) changed generation meanwhile, it closes and opens again (5 attempts within ~1.5 s), then
 * fails with DFM_ESTATE naming the rebuild. Once open it reads that generation until it is closed,
 * whatever a rebuild does to the run: no dfm writer changes a file in place (new files are renamed in,
 * old ones unlinked), and the reader's mappings keep unlinked files alive. */
int dfm_target_reader_open(const char *run_dir, const dfm_target_open_opts *opts, dfm_target_reader **out);

/* Stop the prefetch thread, close everything. NULL is a no-op. */
void dfm_target_reader_close(dfm_target_reader *r);

/* The run's shape (borrowed; valid until close). */
const dfm_target_info *dfm_target_reader_info(const dfm_target_reader *r);

/* Random access: decode chunk_id's record into out's caller arrays (ids[k], scores[k], emb[k*d] fp32
 * or NULL). DFM_ERANGE if chunk_id >= n_chunks; DFM_ENOTFOUND if the key is missing; decode errors
 * (DFM_ECHECKSUM, DFM_EVERSION, DFM_EFORMAT) name the shard and key. */
int dfm_target_reader_get(dfm_target_reader *r, uint64_t chunk_id, dfm_trec *out);

/* Position the iterator at first_chunk (restarting its prefetch thread). next() without a seek
 * starts at chunk 0. DFM_ERANGE if first_chunk > n_chunks. */
int dfm_target_reader_seek(dfm_target_reader *r, uint64_t first_chunk);

/* The next record in key (= training) order, decoded into out as for get(). Returns DFM_OK,
 * DFM_TARGET_END after the last record, or an error naming shard and key; also checks that keys
 * follow each other without gaps and, when a shard was read from its first record, that its record
 * count and the checksum over all its records equal shard.json's. */
int dfm_target_reader_next(dfm_target_reader *r, dfm_trec *out);

/* The stored bytes of chunk_id's record (valid until the next call on r). For tools. */
int dfm_target_reader_raw(dfm_target_reader *r, uint64_t chunk_id, const void **rec, size_t *n);

#endif
