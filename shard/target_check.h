/* target_check.h — looking at and checking a run's target shards: one record with its texts, and
 * every record against the shards' metadata, the manifest, a second run or a rebuild. */
#ifndef DFM_TARGET_CHECK_H
#define DFM_TARGET_CHECK_H

#include <stdint.h>

/* Print record chunk of run: flags, the neighbours' ids, scores and mask in rank order, the first nvals
 * values of each embedding and, when the run has chunks and a tokenizer (tokenizer, else the chunk
 * stage's), the texts of the query chunk, its context and its neighbours. */
int dfm_target_inspect(const char *run, uint64_t chunk, int64_t nvals, const char *tokenizer);

typedef struct {
    const char *compare;      /* a second run whose records must be identical (NULL: none) */
    const char *tokens_run;   /* check the targets against this run's upstream stages (NULL: run) */
    double recompute_records; /* rebuild this fraction of the records from RUN/retrieve and RUN/encode (0: none) */
    uint64_t seed;            /* of that sample */
} dfm_target_verify_config;

/* Check every record of run (header, checksum, decode, key order without gaps or duplicates), the
 * counts and per-shard records checksums against the manifest, and what cfg asks for; prints one line
 * on success. Errors name the shard and key of the first problem. */
int dfm_target_verify(const char *run, const dfm_target_verify_config *cfg);

#endif
