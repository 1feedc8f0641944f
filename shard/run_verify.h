/* run_verify.h — `dfm verify`: every stage's files of a run against their headers, checksums and the
 * manifest, then the target records (shard/target_check.h). Readers only: no lock is taken. */
#ifndef DFM_RUN_VERIFY_H
#define DFM_RUN_VERIFY_H

#include "shard/target_check.h"

/* The stages `dfm verify` can check, in pipeline order. */
enum {
    DFM_VERIFY_CHUNK = 1u << 0,    /* chunk shards: header, payload checksum, token ids, tiling, counts */
    DFM_VERIFY_ENCODE = 1u << 1,   /* embedding blocks: header, payload checksum, tiling, dim/dtype, row count */
    DFM_VERIFY_INDEX = 1u << 2,    /* index shards: sidecar, size, hash, FAISS load, ids tiling, manifest entries */
    DFM_VERIFY_RETRIEVE = 1u << 3, /* neighbour blocks: header, payload checksum, every row, tiling, counts */
    DFM_VERIFY_TARGETS = 1u << 4,  /* target shards: every record (dfm_target_verify) */
    DFM_VERIFY_ALL = (1u << 5) - 1
};

/* "chunk,encode,..." (names as in the manifest; "all") into a mask of the bits above. DFM_EARG naming
 * an unknown stage. */
int dfm_verify_stages_parse(const char *list, unsigned *mask);

/* Check the stages in mask, in pipeline order. A stage in mask that the run lacks is an error, except
 * that with DFM_VERIFY_ALL a missing upstream stage (chunk to retrieve: a synthetic run has none) is
 * skipped with a line; the targets, what a run is for, must be there. A stage recorded "running" is
 * an error (it is not finished). Prints one line per stage checked; errors name the stage and the file
 * and what is wrong. cfg applies to the targets stage. */
int dfm_run_verify(const char *run, unsigned mask, const dfm_target_verify_config *cfg);

#endif
