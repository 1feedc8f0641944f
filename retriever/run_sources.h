/* run_sources.h — a run directory's embeddings and chunks as the sources retrieve.h reads
 * (dfm_vec_source, dfm_chunk_source): the encode stage's embedding blocks and the chunk stage's shards. */
#ifndef DFM_RETRIEVER_RUN_SOURCES_H
#define DFM_RETRIEVER_RUN_SOURCES_H

#include "retriever/topk.h"
#include "schemas/chunk_shard.h"
#include "schemas/embedding_shard.h"

typedef struct {
    dfm_chunk_set *chunks;
    dfm_emb_set *emb;
    dfm_vec_source vs;  /* rows by chunk id (fp32 rows are read in place) */
    dfm_chunk_source cs; /* chunk metadata by id */
} dfm_run_sources;

/* Open RUN's chunk and embedding sets; DFM_EMISMATCH when they do not hold the same number of rows.
 * On failure call dfm_run_sources_close (what was opened is released). */
int dfm_run_sources_open(const char *run, dfm_run_sources *s);

/* Release (safe on a zeroed or partly opened s). */
void dfm_run_sources_close(dfm_run_sources *s);

#endif
