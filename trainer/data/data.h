/* data.h — the trainer's data: a token stream cut into sequences, their chunks' target memory, and a
 * deterministic shuffling loader with a held-out split.
 *
 * Tokens (--data PATH), one of:
 *   - a run folder of `dfm chunk` (PATH/manifest.json): the chunk shards in chunk-id order
 *     (schemas/chunk_shard.h); token position p belongs to chunk p / L;
 *   - an llm.c-style token shard (schemas/token_shard.md).
 * Sequence i is tokens [i*T, i*T+T) with next-token targets [i*T+1, i*T+T+1) (the stream continues
 * into the next sequence), so there are (n_tokens - 1) / T sequences; T must be a multiple of L.
 * In doc-aligned chunk runs the filler after a chunk's n_valid tokens gets no target (-1), nor does the
 * position before a filler token.
 *
 * Target memory (--targets PATH), one of:
 *   - a run folder with a complete "targets" stage, read through shard/target_reader.h (random access
 *     by chunk id, checked against the token run's manifest);
 *   - a simple targets file (tests, synthetic demos): schemas/targets_file.md.
 * Chunk 0 of every sequence has no target (its mask is forced to 0: its query, the preceding context, is empty).
 */
#ifndef DFM_TRAINER_DATA_H
#define DFM_TRAINER_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct TargetReader TargetReader;

typedef struct {
    int *tokens;          /* [n_tokens] */
    uint8_t *pad;         /* [n_tokens] 1 = padding filler (doc-aligned chunk runs), or NULL */
    size_t n_tokens;
    int T;                /* sequence length */
    size_t n_seq;
    uint32_t max_token;   /* largest id seen */
    int chunk_len;        /* from a chunk run (0 for a .bin shard) */
    uint64_t tokenizer_hash;
    char tokens_generation[17]; /* the chunk stage's generation the tokens were read from ("" for a .bin) */
    TargetReader *tgt;    /* NULL without targets */
    int K, d;             /* of the targets */
} DataSet;

/* Load tokens from PATH (see above) for sequences of T tokens. */
int data_open(const char *path, int T, DataSet *ds);
/* Attach targets (file or run folder). chunk_len L of the model; K, d are taken from the targets
 * (and checked against want_k / want_d when > 0). tokens_run: the token run folder (for the target
 * reader's manifest check) or NULL. */
int data_open_targets(DataSet *ds, const char *path, const char *tokens_run, int L, int want_k, int want_d);
void data_close(DataSet *ds);
/* Attach targets built in memory (reading.h): table holds n_chunks*K masks (u8, chunk-major) followed by
 * n_chunks*K*d floats, the layout of a targets file's payload (schemas/targets_file.md); ds takes it
 * (freed by data_close, also on error). Chunk 0 of every sequence still gets no target. */
int data_attach_targets(DataSet *ds, int K, int d, uint64_t n_chunks, uint8_t *table);

/* Fill a batch of sequences idx[0..B): inputs/targets [B*T]; with targets attached, tmem
 * [B*NC*K*d] and tmask [B*NC*K] (NC = T / L) too (may be NULL to skip). */
int data_batch(DataSet *ds, const size_t *idx, int B, int L, int *inputs, int *targets, float *tmem,
               uint8_t *tmask);

/* data_batch with another target source (a clone): several threads may read batches at once, each with
 * its own source (a run's LMDB reader keeps one read transaction and may not be shared). */
int data_batch_from(const DataSet *ds, TargetReader *ts, const size_t *idx, int B, int L, int *inputs, int *targets,
                    float *tmem, uint8_t *tmask);
/* Chunk `chunk`'s stored target slots: emb [K*d], mask [K], without the first-chunk rule of data_batch (the
 * reading set's own slots, trainer/data/reading.h). DFM_ERANGE past the targets' chunks. */
int data_target_row(const DataSet *ds, uint64_t chunk, float *emb, uint8_t *mask);
/* A second source of ds's targets (a run folder: its own reader; a simple file: the same memory), or NULL
 * without targets. Free with data_targets_free (NULL is a no-op); the clone must not outlive ds. */
int data_targets_clone(const DataSet *ds, TargetReader **out);
void data_targets_free(TargetReader *ts);

/* Write the simple targets file (atomically). mask [n_chunks*k], emb [n_chunks*k*d]. */
int targets_file_write(const char *path, uint32_t k, uint32_t d, uint32_t chunk_len, uint64_t n_chunks,
                       const uint8_t *mask, const float *emb);
/* Write an llm.c-style token shard (version 2, uint32). */
int tokens_bin_write(const char *path, const uint32_t *tokens, size_t n);

/* Deterministic loader over sequences [first, first + count): a fresh permutation per epoch drawn
 * from (seed, epoch); position (epoch, pos) is all the state a checkpoint needs. */
typedef struct {
    size_t first, count;
    size_t *order;
    uint64_t seed, epoch;
    size_t pos;
    int shuffle;
} Loader;

int loader_init(Loader *l, size_t first, size_t count, uint64_t seed, int shuffle);
/* Jump to (epoch, pos), rebuilding that epoch's permutation. */
void loader_seek(Loader *l, uint64_t epoch, size_t pos);
/* Next B sequence indices (wraps into the next epoch). */
void loader_next(Loader *l, int B, size_t *idx);
void loader_free(Loader *l);

#endif
