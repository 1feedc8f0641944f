/* hidden_states.h — a token-level datastore's keys: a decoder's hidden states, one per token, written by
 * `dfm-train hidden` and read by `dfm audit --token-keys`. Spec: schemas/hidden_states.md.
 *
 * File = 128-byte header, then n_keys rows of dim fp32 values (key i = the final-normed hidden state at
 * the i-th non-padding token of the stream, in stream order), then n_keys uint32 values (the source
 * token id that follows key i's position, DFM_HIDDEN_NO_NEXT where none does): a kNN-LM datastore.
 * Little-endian. The header holds the sizes, where the keys came from, and XXH3-64 checksums of itself
 * and of the payload; the reader checks all of them against the file length before any row.
 */
#ifndef DFM_SCHEMAS_HIDDEN_STATES_H
#define DFM_SCHEMAS_HIDDEN_STATES_H

#include <stddef.h>
#include <stdint.h>

#define DFM_HIDDEN_MAGIC "DFMHIDN1"
#define DFM_HIDDEN_VERSION 1u
#define DFM_HIDDEN_HEADER_BYTES 128u
#define DFM_HIDDEN_MAX_DIM 65536u
#define DFM_HIDDEN_NO_NEXT 0xFFFFFFFFu

typedef struct {
    char magic[8];            /* DFM_HIDDEN_MAGIC, no NUL */
    uint32_t version;         /* DFM_HIDDEN_VERSION */
    uint32_t header_bytes;    /* 128 */
    uint64_t n_keys;          /* rows */
    uint32_t dim;             /* key width: the decoder's hidden size */
    uint32_t seq_len;         /* tokens per forward pass (the context a key saw is at most this) */
    uint64_t tokens_read;     /* token positions the forward passes covered (padding included) */
    uint64_t unseen;          /* input tokens the backbone's vocabulary lacks, replaced (see the spec) */
    uint64_t backbone_hash;   /* XXH3-64 of the backbone's fp32 weights (as dfm-train's checkpoints) */
    uint64_t tokens_hash;     /* XXH3-64 of the source token ids read, as uint32 */
    uint64_t payload_bytes;   /* n_keys * (dim * 4 + 4) */
    uint64_t payload_xxh64;   /* XXH3-64 of the payload */
    uint64_t header_xxh64;    /* XXH3-64 of the 128 header bytes with this field zero */
    uint8_t reserved[40];     /* zero */
} dfm_hidden_header;

/* ---- writing ---------------------------------------------------------------------------------- */
typedef struct dfm_hidden_writer dfm_hidden_writer;

/* Start PATH (written under a temporary name; nothing appears under PATH until close) for keys of
 * width dim (1..DFM_HIDDEN_MAX_DIM). DFM_EARG, DFM_EIO, DFM_ENOMEM. */
int dfm_hidden_writer_open(const char *path, uint32_t dim, dfm_hidden_writer **out);
/* Append n keys (n * dim floats) and their n values. DFM_EIO / DFM_ENOSPACE / DFM_ENOMEM. */
int dfm_hidden_writer_add(dfm_hidden_writer *w, const float *keys, const uint32_t *values, size_t n);
/* Finish with the provenance fields of meta (seq_len, tokens_read, unseen, backbone_hash, tokens_hash;
 * the rest is filled in): header, checksums, fsync, rename. Frees w, also on failure. */
int dfm_hidden_writer_close(dfm_hidden_writer *w, const dfm_hidden_header *meta);
/* Give up: remove the temporary. Frees w; NULL is a no-op. */
void dfm_hidden_writer_abort(dfm_hidden_writer *w);

/* ---- reading ---------------------------------------------------------------------------------- */
typedef struct {
    dfm_hidden_header hdr;
    const float *keys;        /* [n_keys, dim], inside the mapping */
    const uint32_t *values;   /* [n_keys] */
    const uint8_t *map;
    size_t map_bytes;
} dfm_hidden_file;

/* Map and validate PATH: magic, version, header_bytes, header checksum, dim in range, reserved zero,
 * payload_bytes against n_keys * (dim * 4 + 4) and against the file length, payload checksum. Errors
 * name the file and the field: DFM_ENOTFOUND, DFM_ETRUNCATED, DFM_EFORMAT, DFM_EVERSION, DFM_ECHECKSUM. */
int dfm_hidden_open(const char *path, dfm_hidden_file **out);
/* NULL is a no-op. */
void dfm_hidden_close(dfm_hidden_file *f);

#endif
