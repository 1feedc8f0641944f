/* encode.h — the encode stage: embed every chunk of a run with the frozen encoder (MPI).
 *
 * Each chunk's n_valid LM tokens are decoded to text (special tokens such as <|endoftext|> dropped),
 * tokenised with the encoder's WordPiece, encoded, pooled and L2-normalised, and written to embedding
 * blocks RUN/encode/emb-BBBBBB.bin (schemas/embedding_shard.h): block b holds chunk ids
 * [b*B, min((b+1)*B, N)), B = block_chunks. Rank r encodes blocks b = r, r+P, r+2P, ...; a block's
 * bytes depend only on its chunks and the options (windows start at block boundaries, GEMM tiles are
 * fixed), so the files are identical for any number of ranks or threads. A re-run keeps every
 * finished block whose header matches (model, tokenizer, dim, dtype, rows) and whose checksums hold.
 *
 * Also dfm_encode_texts: the "text" field of each JSONL line into one embedding file (first_chunk 0),
 * for tests, references and ad-hoc queries, optionally with the WordPiece ids of each line as JSONL.
 */
#ifndef DFM_ENCODE_H
#define DFM_ENCODE_H

#include <stdint.h>

#include <jansson.h>

#include "common/mpiutil.h"

typedef struct {
    char *model;        /* BERT-family sentence-transformers model folder */
    char *device;       /* "auto" (or NULL: cuda when a GPU is visible), "cpu" or "cuda" */
    char *dtype;        /* stored embedding dtype: "fp32", "fp16" or "bf16" */
    char *precision;    /* linear layers' precision: fp32, fp16 (CUDA), bf16, int8 (CPU); NULL or "auto": fp16
                         * on CUDA, fp32 on the CPU. Recorded (resolved) in the stage's config: a run never
                         * mixes precisions */
    char *tokenizer;    /* run mode: the LM tokenizer.json (NULL: the one the chunk stage recorded) */
    char *texts;        /* texts mode: JSONL input */
    char *out;          /* texts mode: the embedding file to write */
    char *tokens_out;   /* texts mode: also write WordPiece ids as JSONL (NULL: no) */
    int64_t batch;      /* texts per forward batch (0: the encoder's default) */
    int64_t block_chunks; /* chunks per embedding block file */
    int64_t window;     /* chunks decoded, sorted by length and encoded together */
    int64_t max_len;    /* token limit per text (0: the model's) */
    int force;          /* re-encode every block even if finished */
} dfm_encode_config;

/* Collective over m: the encode stage of RUN (its chunk stage must be complete). config: the options
 * as recorded in the manifest's stage (the caller's; this adds "dtype", "model_hash", "max_len" and the
 * resolved "precision", so resuming under another precision is DFM_EMISMATCH).
 * A stage already complete with the same config is a no-op. Rank 0 prints a one-line summary.
 * Returns the same success or failure on every rank. */
int dfm_encode_run(const dfm_mpi *m, const dfm_encode_config *cfg, const char *run, json_t *config);

/* Texts mode (one process): cfg->texts into cfg->out (and cfg->tokens_out); prints a summary line.
 * DFM_EARG without cfg->out, DFM_EFORMAT for a line that is not an object with a string "text". */
int dfm_encode_texts(const dfm_encode_config *cfg);

#endif
