/* write_targets.h — the write-targets stage: the run's (or synthetic) data source, the manifest's
 * "targets" stage and dfm_target_build (target_build.h) over an MPI context. */
#ifndef DFM_WRITE_TARGETS_H
#define DFM_WRITE_TARGETS_H

#include <stdint.h>

#include <jansson.h>

#include "common/mpiutil.h"

typedef struct {
    int64_t shards;     /* output shards (fixed id ranges; independent of the ranks) */
    int64_t level;      /* zstd level */
    int64_t block;      /* queries per exchange round */
    int64_t batch;      /* records per LMDB transaction */
    int64_t map_bytes;  /* initial LMDB map size (0 = estimate) */
    int64_t synthetic;  /* > 0: this many synthetic chunks instead of the retrieve stage (tests, benchmarks) */
    int64_t k, d, seq_chunks, seed; /* the synthetic data's shape and seed */
    int64_t threads;    /* encoding threads per rank */
    char *dtype;        /* stored embedding type: fp32, fp16 or bf16 */
    char *store;        /* "embeddings" or "ids" */
    char *slots_hold;   /* what a slot holds: "neighbour", "continuation" or "both" (schemas/target_record.md) */
    char *shuffle;      /* byte-shuffle before zstd: "yes", "no" or "auto" (yes unless fp16) */
    int force;          /* rebuild shards that are already complete */
} dfm_write_targets_config;

/* Collective over m: the target shards of RUN (its retrieve stage complete, unless cfg->synthetic),
 * recorded in the manifest's "targets" stage with config (the options as the caller records them).
 * Rank 0 prints a one-line summary. Returns the same success or failure on every rank. */
int dfm_write_targets_run(const dfm_mpi *m, const dfm_write_targets_config *cfg, const char *run, json_t *config);

#endif
