/* chunk_shard.h — the chunk shard: the token chunks of one rank's part of the corpus.
 * Spec: schemas/chunk_shard.md. Written by `dfm chunk`, read by encode, retrieve, the trainer.
 *
 * File = 128-byte header, then n_chunks records in chunk-id order. One record =
 *   dfm_chunk_meta (24 bytes) + chunk_len uint32 token ids.
 * All integers little-endian. The header carries a checksum of itself and of the payload; readers
 * check magic, version, sizes, file length and both checksums before handing out any record.
 */
#ifndef DFM_CHUNK_SHARD_H
#define DFM_CHUNK_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define DFM_CHUNK_MAGIC "DFMCHNK1"
#define DFM_CHUNK_VERSION 1u
#define DFM_CHUNK_HEADER_BYTES 128u

enum {
    DFM_CHUNK_F_DOC_ALIGNED = 1u, /* header flag: documents were padded to chunk boundaries */
};
enum {
    DFM_CHUNK_SEQ_START = 1u, /* record flag: first chunk of a training sequence (no query) */
    DFM_CHUNK_DOC_START = 2u, /* record flag: a document starts inside this chunk */
};

typedef struct {
    char magic[8];             /* "DFMCHNK1" */
    uint32_t version;          /* DFM_CHUNK_VERSION */
    uint32_t header_bytes;     /* 128 */
    uint32_t chunk_len;        /* L, tokens per chunk */
    uint32_t seq_len;          /* S, tokens per training sequence (multiple of L) */
    uint32_t token_bytes;      /* 4: token ids are uint32 */
    uint32_t flags;            /* DFM_CHUNK_F_* */
    uint64_t first_chunk;      /* global id of the first record */
    uint64_t n_chunks;         /* number of records */
    uint64_t vocab_size;       /* every token id is < vocab_size */
    uint64_t tokenizer_hash;   /* dfm_tokenizer_hash() of the LM tokenizer */
    uint32_t eos_id;           /* document separator */
    uint32_t pad_id;           /* filler after a chunk's n_valid tokens */
    uint64_t payload_bytes;    /* n_chunks * (24 + 4 * chunk_len) */
    uint64_t payload_checksum; /* XXH3-64 of the payload */
    uint8_t reserved[32];      /* zero */
    uint64_t header_checksum;  /* XXH3-64 of the 120 bytes before this field */
} dfm_chunk_header;

typedef struct {
    uint64_t doc_first; /* global index of the document of the chunk's first valid token */
    uint64_t doc_last;  /* ... of its last valid token (== doc_first unless a boundary is inside) */
    uint16_t n_valid;   /* tokens before padding (chunk_len except at padded ends); 0 = all padding */
    uint16_t flags;     /* DFM_CHUNK_SEQ_START | DFM_CHUNK_DOC_START */
    uint32_t reserved;  /* zero */
} dfm_chunk_meta;

_Static_assert(sizeof(dfm_chunk_header) == 128, "chunk header is 128 bytes");
_Static_assert(sizeof(dfm_chunk_meta) == 24, "chunk meta is 24 bytes");

/* ---- writing ---------------------------------------------------------------------------------- */
typedef struct dfm_chunk_writer dfm_chunk_writer;

/* Start a shard at PATH (written under a temporary name). hdr supplies chunk_len, seq_len, flags,
 * first_chunk, vocab_size, tokenizer_hash, eos_id, pad_id; the rest is filled in. */
int dfm_chunk_writer_open(const char *path, const dfm_chunk_header *hdr, dfm_chunk_writer **out);
/* Append one record (tokens has chunk_len ids). */
int dfm_chunk_writer_add(dfm_chunk_writer *w, const dfm_chunk_meta *meta, const uint32_t *tokens);
/* Finish: header with counts and checksums, fsync, rename. Frees w. */
int dfm_chunk_writer_close(dfm_chunk_writer *w);
/* Give up: remove the temporary. Frees w. NULL is a no-op. */
void dfm_chunk_writer_abort(dfm_chunk_writer *w);

/* ---- reading ---------------------------------------------------------------------------------- */
typedef struct {
    char *path;
    dfm_chunk_header hdr;
    const uint8_t *map; /* whole file, mmap'd read-only */
    size_t map_bytes;
    size_t record_bytes;
} dfm_chunk_shard;

/* Open and fully validate (magic, version, header checksum, sizes vs file length, payload checksum,
 * every token id < vocab_size, n_valid <= chunk_len). Errors name the file and the field. */
int dfm_chunk_shard_open(const char *path, dfm_chunk_shard **out);
void dfm_chunk_shard_close(dfm_chunk_shard *s);
/* DFM_OK if the file at path opens whole (dfm_chunk_shard_open's checks), else its error. */
int dfm_chunk_shard_check(const char *path);
/* Record i (0-based within the shard). */
static inline const dfm_chunk_meta *dfm_chunk_shard_meta(const dfm_chunk_shard *s, uint64_t i) {
    return (const dfm_chunk_meta *)(s->map + DFM_CHUNK_HEADER_BYTES + i * s->record_bytes);
}
static inline const uint32_t *dfm_chunk_shard_tokens(const dfm_chunk_shard *s, uint64_t i) {
    return (const uint32_t *)(s->map + DFM_CHUNK_HEADER_BYTES + i * s->record_bytes + sizeof(dfm_chunk_meta));
}

/* ---- a run's chunks, as one id space -------------------------------------------------------------
 * Opens every shard listed in RUN/manifest.json's "chunk" stage (which must be complete), checks
 * that they tile [0, n_chunks) without gaps or overlaps and agree on L, S, tokenizer. */
typedef struct {
    int n_shards;
    dfm_chunk_shard **shards; /* sorted by first_chunk */
    uint64_t n_chunks;
    uint32_t chunk_len, seq_len;
    uint64_t n_docs; /* documents in the corpus */
} dfm_chunk_set;

int dfm_chunk_set_open(const char *run_dir, dfm_chunk_set **out);
void dfm_chunk_set_close(dfm_chunk_set *set);
/* Record of a global chunk id; DFM_ERANGE if id >= n_chunks. */
int dfm_chunk_set_get(const dfm_chunk_set *set, uint64_t chunk_id, const dfm_chunk_meta **meta,
                      const uint32_t **tokens);

#endif
