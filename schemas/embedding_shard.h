/* embedding_shard.h — the embedding blocks written by `dfm encode`, read by index / retrieve / targets.
 * Spec: schemas/embedding_shard.md.
 *
 * Files RUN/encode/emb-BBBBBB.bin (six-digit block number). Block b holds the embeddings of chunk ids
 * [b*B, min((b+1)*B, N)) where B = the encode stage's "block_chunks" (manifest) and N the number of
 * chunks. Block files therefore do not depend on the number of ranks, and a re-run skips finished,
 * valid blocks.
 *
 * File = 128-byte header, then n_rows rows of dim values in chunk-id order (row i = chunk
 * first_chunk + i), dtype fp32 / fp16 / bf16, little-endian, no padding. Every row is L2-normalised
 * (in fp32, before any down-conversion). The header holds checksums of itself and of the payload;
 * readers check magic, version, sizes against the file length and both checksums before any row.
 */
#ifndef DFM_EMBEDDING_SHARD_H
#define DFM_EMBEDDING_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define DFM_EMB_MAGIC "DFMEMBD1"
#define DFM_EMB_VERSION 1u
#define DFM_EMB_HEADER_BYTES 128u
#define DFM_EMB_DEFAULT_BLOCK_CHUNKS 65536u

enum { DFM_EMB_F32 = 0, DFM_EMB_F16 = 1, DFM_EMB_BF16 = 2 };

typedef struct {
    char magic[8];             /* "DFMEMBD1" */
    uint32_t version;          /* DFM_EMB_VERSION */
    uint32_t header_bytes;     /* 128 */
    uint32_t dim;              /* values per row */
    uint32_t dtype;            /* DFM_EMB_F32 / F16 / BF16 */
    uint64_t first_chunk;      /* global chunk id of row 0 (= block * block_chunks) */
    uint64_t n_rows;           /* rows in this file */
    uint64_t model_hash;       /* XXH3-64 of the encoder's weights file (dfm_encoder_model_hash) */
    uint64_t tokenizer_hash;   /* dfm_tokenizer_hash() of the LM tokenizer that made the chunks */
    uint64_t payload_bytes;    /* n_rows * dim * dtype size */
    uint64_t payload_checksum; /* XXH3-64 of the payload */
    uint8_t reserved[48];      /* zero */
    uint64_t header_checksum;  /* XXH3-64 of the 120 bytes before this field */
} dfm_emb_header;

_Static_assert(sizeof(dfm_emb_header) == 128, "embedding header is 128 bytes");

/* "fp32" / "fp16" / "bf16" ("?" otherwise); bytes per value (0 for an unknown dtype). */
const char *dfm_emb_dtype_name(uint32_t dtype);
size_t dfm_emb_dtype_size(uint32_t dtype);
/* Parse "fp32" / "fp16" / "bf16" (also "f32", "float32", ...); -1 if unknown. */
int dfm_emb_dtype_parse(const char *name);

/* Relative file name of block b inside the run folder: "encode/emb-000042.bin" (malloc'd; NULL on no
 * memory). */
char *dfm_emb_block_name(uint64_t block);

/* ---- writing ---------------------------------------------------------------------------------- */
typedef struct dfm_emb_writer dfm_emb_writer;

/* Start a file at PATH (written under a temporary name; nothing appears under PATH until close).
 * hdr supplies dim, dtype, first_chunk, model_hash, tokenizer_hash; the rest is filled in. */
int dfm_emb_writer_open(const char *path, const dfm_emb_header *hdr, dfm_emb_writer **out);
/* Append n rows of hdr->dim fp32 values, converted to the file's dtype (round to nearest even). */
int dfm_emb_writer_add(dfm_emb_writer *w, const float *rows, size_t n);
/* Finish: header with counts and checksums, fsync, rename. Frees w, also on failure. */
int dfm_emb_writer_close(dfm_emb_writer *w);
/* Give up: remove the temporary. Frees w. NULL is a no-op. */
void dfm_emb_writer_abort(dfm_emb_writer *w);

/* ---- reading one file --------------------------------------------------------------------------- */
typedef struct {
    char *path;
    dfm_emb_header hdr;
    const uint8_t *map; /* whole file, mmap'd read-only */
    size_t map_bytes;
    size_t row_bytes;   /* dim * dtype size */
} dfm_emb_shard;

/* Open and validate (magic, version, header_bytes, header checksum, dtype, dim > 0, payload_bytes vs
 * n_rows*dim and vs the file length, reserved zero, payload checksum). Errors name the file and the
 * field: DFM_ENOTFOUND, DFM_ETRUNCATED, DFM_EFORMAT, DFM_EVERSION, DFM_ECHECKSUM. */
int dfm_emb_shard_open(const char *path, dfm_emb_shard **out);
/* Same, without the payload checksum (cheap; for a re-run deciding whether a block is done it is not
 * enough — use dfm_emb_shard_open). */
int dfm_emb_shard_open_nocheck(const char *path, dfm_emb_shard **out);
void dfm_emb_shard_close(dfm_emb_shard *s);
/* DFM_OK if the file at path opens whole (dfm_emb_shard_open's checks), else its error. */
int dfm_emb_shard_check(const char *path);
/* Raw pointer to row i (0-based within the file), in the file's dtype. */
static inline const void *dfm_emb_shard_row(const dfm_emb_shard *s, uint64_t i) {
    return s->map + DFM_EMB_HEADER_BYTES + i * s->row_bytes;
}
/* Rows [i, i+n) of the file as fp32 into out (n * dim floats). DFM_ERANGE past the end. */
int dfm_emb_shard_rows_f32(const dfm_emb_shard *s, uint64_t i, uint64_t n, float *out);

/* ---- a run's embeddings, as one id space ---------------------------------------------------------
 * Opens every file listed in RUN/manifest.json's "encode" stage (which must be complete), validates
 * each, and checks that they tile [0, n_rows) in block order, agree on dim, dtype, model and tokenizer
 * with each other and with the stage's "dim" / "dtype" / "block_chunks", and that n_rows equals the
 * chunk stage's chunk count. */
typedef struct {
    int n_shards;
    dfm_emb_shard **shards; /* sorted by first_chunk; shard k holds ids [k*block_chunks, ...) */
    uint64_t n_rows;
    uint64_t block_chunks;
    uint32_t dim, dtype;
    uint64_t model_hash, tokenizer_hash;
} dfm_emb_set;

int dfm_emb_set_open(const char *run_dir, dfm_emb_set **out);
void dfm_emb_set_close(dfm_emb_set *set);
/* Rows of chunk ids [first_id, first_id + n) as fp32 into out (n * dim floats); may span files.
 * DFM_ERANGE if first_id + n > n_rows. */
int dfm_emb_set_rows_f32(const dfm_emb_set *set, uint64_t first_id, uint64_t n, float *out);
/* Raw pointer (file dtype) to the row of one chunk id, or NULL if out of range. */
const void *dfm_emb_set_row(const dfm_emb_set *set, uint64_t id);

#endif
