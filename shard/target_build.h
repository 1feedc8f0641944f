/* target_build.h — the MPI core of `dfm write-targets`: exact-embedding exchange and shard writing.
 *
 * Data comes through dfm_target_source, so the same code runs on the retrieve stage's neighbour
 * files and the encode stage's embeddings, or on synthetic data in tests:
 *   - neighbours can be read by any rank for any query range (shared files);
 *   - embedding rows are owned: rank r serves exactly the rows [own_first, own_first + own_count)
 *     (the ranks' ranges must tile [0, N)), as stored (exact fp32 values; never reconstructions).
 *
 * Shard s (of cfg->n_shards, ranges from dfm_target_shard_range) is written by rank s % P. Each writer
 * walks its shard in blocks of block_queries queries; per block, all ranks take part in one exchange
 * round: MPI_Alltoall of request counts, MPI_Alltoallv of the sorted unique neighbour ids, each owner
 * gathers its rows, MPI_Alltoallv of the rows back (bounded by block_queries * K * d floats). Ranks
 * without a block in a round take part with empty requests. With store = ids the requests are the
 * block's own chunk ids, whose rows go into the shard's table.bin.
 * Records depend only on the data and the configuration, never on P.
 */
#ifndef DFM_TARGET_BUILD_H
#define DFM_TARGET_BUILD_H

#include <stdint.h>

#include <jansson.h>

#include "common/mpiutil.h"
#include "shard/target_writer.h"

typedef struct {
    void *ctx;
    uint64_t n_chunks;
    uint32_t k, d;
    uint64_t n_rows;               /* 0: neighbour ids index this run's n_chunks rows; else the rows of another
                                    * run (the datastore of a query-only run) */
    uint64_t own_first, own_count; /* embedding rows this rank owns */
    /* Neighbours of queries [first, first+n): ids[n*k] (rank order), scores[n*k], mask[n] (bit r = slot r
     * valid), seq_start[n] (1 = first chunk of a training sequence: no query). */
    int (*neighbors)(void *ctx, uint64_t first, uint64_t n, int64_t *ids, float *scores, uint64_t *mask, uint8_t *seq_start);
    /* The stored rows of n ids, all inside this rank's own range, as fp32: out[n*d]. */
    int (*rows)(void *ctx, const uint64_t *ids, size_t n, float *out);
    /* Only for --slots-hold continuation|both, callable by any rank for any row id (not only its own):
     * *yes = 1 when row id + 1 is the continuation of row id (the next chunk of the document row id
     * ends in; the rule: schemas/target_record.md, "What the slots hold"), else 0. */
    int (*continues)(void *ctx, uint64_t id, int *yes);
} dfm_target_source;

/* Slots per record for K neighbours: K, or 2K with slots = DFM_TREC_SLOTS_BOTH. */
uint32_t dfm_target_slot_count(uint32_t k, int slots);

/* The slots of the records of queries [first, first+n) as src->neighbors gives them, then rewritten
 * for slots (DFM_TREC_SLOTS_*, schemas/target_record.h): ids[n*ks], scores[n*ks], mask[n] with
 * ks = dfm_target_slot_count(src->k, slots). A continuation slot takes its neighbour's score and the
 * id neighbour + 1, or is masked (id -1, score 0) where src->continues says no. seq_start as given.
 * The one home of the slot rule: dfm write-targets and dfm verify --recompute-records both use it. */
int dfm_target_slot_neighbors(const dfm_target_source *src, int slots, uint64_t first, uint64_t n, int64_t *ids, float *scores,
                              uint64_t *mask, uint8_t *seq_start);

typedef struct {
    uint32_t n_shards;
    dfm_trec_params rec;
    uint32_t block_queries; /* queries per exchange round (0 = 1024) */
    uint32_t batch_records; /* records per LMDB transaction (0 = 512) */
    uint64_t map_bytes;     /* initial LMDB map size (0 = estimate) */
    const char *fingerprint;
    int force;              /* rebuild shards that are already complete */
    uint32_t threads;       /* encoding threads per rank (0, 1 = this thread only); output does not depend on it */
} dfm_target_build_config;

typedef struct {
    uint64_t shards_built, shards_skipped;
    uint64_t records, raw_bytes, stored_bytes; /* of the shards built here */
    uint64_t rows_requested;                   /* rows this rank fetched (unique per block) */
    uint64_t rows_served;                      /* rows this rank sent to others (or itself) */
    uint64_t exchange_bytes;                   /* bytes of ids and rows this rank received */
    uint64_t rounds;
    double exchange_s, encode_s, write_s;
} dfm_target_build_stats;

/* Collective over m. Builds every incomplete shard owned by this rank (a complete shard whose
 * shard.json matches the configuration and fingerprint is skipped unless cfg->force). Returns the
 * same success or failure on every rank (dfm_mpi_agree); stats are this rank's. */
int dfm_target_build(const dfm_mpi *m, const char *run_dir, const dfm_target_source *src, const dfm_target_build_config *cfg,
                     dfm_target_build_stats *stats);

/* 1 if shard s of the run is complete and matches expect (shard-independent fields + fingerprint). */
int dfm_target_shard_complete(const char *run_dir, uint32_t s, const dfm_target_shard_meta *expect);

/* ---- the manifest's "targets" stage (rank 0 only) -----------------------------------------------
 * begin: compute the run fingerprint (upstream stages + format) into fp, then the stage contract
 *   (common/manifest.h, dfm_stage_begin with bc->force): *skip = 1 for a complete identical stage;
 *   otherwise the stage becomes {"state": "running", "ranks", "config" (copied), "format"}, saved. An
 *   interrupted stage resumes by shard (complete shards whose shard.json matches are kept).
 * finish: read every shard.json, set "counts" (records, seq_starts, empty_records, padded_slots,
 *   raw_bytes, stored_bytes, lmdb_bytes, table_bytes, shards_built, shards_skipped, rows_fetched,
 *   exchange_bytes, bytes_written = lmdb_bytes + table_bytes), "timings", "outputs" (one entry per
 *   shard with its records checksum) and "state": "complete", and save. st holds totals over ranks (may be NULL). */
int dfm_target_stage_begin(json_t *man, const char *run_dir, json_t *config, const dfm_target_build_config *bc, uint64_t n_chunks,
                           int ranks, char fp[17], int *skip);
int dfm_target_stage_finish(json_t *man, const char *run_dir, uint32_t n_shards, const dfm_target_build_stats *st, double total_s);

/* ---- synthetic source (tests, benchmarks: `dfm write-targets --synthetic N`) ---------------------
 * Deterministic: row c is a unit vector of hash-derived values; query q's neighbours are hash-derived
 * ids, sequences of seq_chunks chunks start at multiples of seq_chunks (no query), and every third
 * query has its last two slots padded. A synthetic document is a sequence (the whole run when
 * seq_chunks is 0): row c continues into c + 1 unless c + 1 starts a sequence or is past the end.
 * Rank r owns rows [r*ceil(N/P), ...). */
typedef struct {
    uint64_t n_chunks;
    uint32_t k, d, seq_chunks;
    uint64_t seed;
} dfm_target_synth;

void dfm_target_synth_source(dfm_target_synth *syn, int rank, int size, dfm_target_source *src);
/* Record the synthetic data's parameters as the manifest stage "synthetic" (its upstream). */
int dfm_target_synth_stage(json_t *man, const dfm_target_synth *syn);
/* Row c of the synthetic embeddings (d floats). */
void dfm_target_synth_row(const dfm_target_synth *syn, uint64_t c, float *out);

#endif
