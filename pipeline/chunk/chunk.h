/* chunk.h — the chunk stage: tokenize a corpus with the LM tokenizer and cut it into chunks.
 *
 * Phases (all ranks): read and tokenize this rank's share of the inputs (corpus.h) into a flagged
 * token stream (pack.h); agree on global offsets (prefix scan); send each rank's head to the owner
 * of the sequence it belongs to (one Alltoallv); write one chunk shard per rank; rank 0 records the
 * stage in RUN/manifest.json. Chunk ids and contents do not depend on the number of ranks.
 *
 * Memory per rank is bounded, not proportional to the rank's share: the stream is held in a window
 * of window_tokens (4 bytes each) and what overflows it is spilled to RUN/chunk/.stream-RRRRR.tmp
 * (4 bytes per token of the share, removed at the end), then read back sequentially as the shard
 * is written. The rest: the tokenizer, one batch of documents being tokenized (<= 4096 documents or
 * 8 MB of text, or one larger document), the head exchange (< S tokens) and 2 MB of write buffer.
 */
#ifndef DFM_CHUNK_H
#define DFM_CHUNK_H

#include <stdint.h>

#include <jansson.h>

#include "common/mpiutil.h"

#define DFM_CHUNK_WINDOW_TOKENS (1 << 20) /* default window: 4 MiB of stream per rank */

typedef struct {
    char *tokenizer;       /* the LM's tokenizer.json */
    char *text_field;      /* JSONL field holding the text */
    int64_t chunk_len;     /* L: tokens per chunk */
    int64_t seq_len;       /* S: tokens per training sequence, a positive multiple of L */
    int64_t threads;       /* tokenizer threads per rank (< 1: 1) */
    int64_t window_tokens; /* stream tokens held in memory before spilling (< 1: DFM_CHUNK_WINDOW_TOKENS) */
    int64_t eos_id;        /* document separator (< 0: the tokenizer's EOS) */
    int64_t pad_id;        /* padding token (< 0: the EOS) */
    int doc_aligned;       /* pad every document to a chunk boundary (padding masked) */
    int skip_bad;          /* count and skip malformed lines/documents instead of failing */
    int64_t max_doc_bytes; /* longest document in bytes (< 1: DFM_MAX_DOC_BYTES, corpus.h); longer is malformed */
    int force;             /* redo a complete stage, or one made with other inputs or options */
} dfm_chunk_config;

/* Collective over m: chunk the inputs (paths or globs, n_inputs of them) into RUN/chunk/chunks-RRRRR.bin.
 * config: the options as recorded in the manifest's stage (the caller's; this adds the resolved
 * "eos-id", "pad-id" and "tokenizer_hash"). A stage already complete with the same config and inputs
 * is a no-op; one made with others is refused (DFM_EMISMATCH) unless cfg->force. Rank 0 prints a
 * one-line summary. Returns the same success or failure on every rank (dfm_mpi_agree). */
int dfm_chunk_run(const dfm_mpi *m, const dfm_chunk_config *cfg, const char *run, char **inputs, int n_inputs,
                  json_t *config);

#endif
