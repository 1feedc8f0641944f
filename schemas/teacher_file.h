/* teacher_file.h — the in-context teacher's next-token distributions over a token run, written by
 * `dfm-train teacher` and read by `dfm-train train --teacher FILE` (distillation, gain-weighted CE).
 * Spec: schemas/teacher_file.md.
 *
 * File = 128-byte header, then n_seq * seq_len rows of row_bytes each: row r of sequence s is the input
 * position s*T + r of the run's token stream (it predicts position s*T + r + 1, the trainer's target of
 * that row). A row holds the teacher's top `top` token ids and their log-probabilities (log-softmax over the
 * whole vocabulary, largest first), the teacher's and the LM alone's log-probability of the row's target,
 * and flags. Little-endian. The header holds the sizes, where the rows came from, and XXH3-64 checksums of
 * itself and of the payload; the reader checks them all against the file's length before any row.
 */
#ifndef DFM_SCHEMAS_TEACHER_FILE_H
#define DFM_SCHEMAS_TEACHER_FILE_H

#include <stddef.h>
#include <stdint.h>

#define DFM_TEACHER_MAGIC "DFMTCHR1"
#define DFM_TEACHER_VERSION 1u
#define DFM_TEACHER_HEADER_BYTES 128u
#define DFM_TEACHER_MAX_TOP 256u
#define DFM_TEACHER_MAX_PASTE 64u
#define DFM_TEACHER_MAX_SEQ 65536u

/* row flags */
enum {
    DFM_TEACHER_F_TARGET = 1u,  /* the row has a target (lp_alone is set; else the row is ignored) */
    DFM_TEACHER_F_TEACHER = 2u, /* the teacher saw pasted text for this row (ids, logp, lp_teacher are set) */
};

typedef struct {
    char magic[8];          /* DFM_TEACHER_MAGIC, no NUL */
    uint32_t version;       /* DFM_TEACHER_VERSION */
    uint32_t header_bytes;  /* 128 */
    uint64_t n_seq;         /* sequences */
    uint32_t seq_len;       /* T: rows per sequence */
    uint32_t chunk_len;     /* L */
    uint32_t top;           /* S: ids and log-probs per row, 1..DFM_TEACHER_MAX_TOP */
    uint32_t paste;         /* neighbours (ranked first) whose text the teacher saw, 1..DFM_TEACHER_MAX_PASTE */
    uint32_t vocab;         /* the backbone's vocabulary: every id is below it */
    uint32_t row_bytes;     /* 8 * top + 16 */
    uint64_t backbone_hash; /* XXH3-64 of the backbone's fp32 weights (as dfm-train's checkpoints) */
    uint64_t tokens_hash;   /* XXH3-64 of the run's token ids over the n_seq * seq_len + 1 positions read, as int32 */
    uint64_t payload_bytes; /* n_seq * seq_len * row_bytes */
    uint64_t payload_xxh64; /* XXH3-64 of the payload */
    uint64_t header_xxh64;  /* XXH3-64 of the 128 header bytes with this field zero */
    uint32_t slots;         /* DFM_TREC_SLOTS_* of the targets the pasted ids came from */
    uint32_t tokens_generation_len; /* bytes used of tokens_generation */
    char tokens_generation[16];     /* the token run's chunk-stage generation (manifest), no NUL */
    uint8_t reserved[16];   /* zero */
} dfm_teacher_header;

/* One row's fixed part after its ids and log-probs. */
typedef struct {
    float lp_teacher; /* the teacher's log-probability of the row's target (F_TEACHER) */
    float lp_alone;   /* the LM alone's (no pasted text, the same preceding tokens of the sequence; F_TARGET) */
    uint32_t flags;   /* DFM_TEACHER_F_* */
    uint32_t reserved; /* zero */
} dfm_teacher_row_tail;

/* Bytes of a row with top S. */
static inline uint32_t dfm_teacher_row_bytes(uint32_t top) { return 8u * top + 16u; }

/* ---- writing ---------------------------------------------------------------------------------- */
typedef struct dfm_teacher_writer dfm_teacher_writer;

/* Start PATH (a temporary name until close) for rows of `top` ids. DFM_EARG, DFM_EIO, DFM_ENOMEM. */
int dfm_teacher_writer_open(const char *path, uint32_t top, dfm_teacher_writer **out);
/* Append n rows: ids [n*top] (uint32), logp [n*top], tails [n]. DFM_EIO / DFM_ENOSPACE. */
int dfm_teacher_writer_add(dfm_teacher_writer *w, const uint32_t *ids, const float *logp,
                           const dfm_teacher_row_tail *tails, size_t n);
/* Finish with meta's provenance and shape fields (n_seq, seq_len, chunk_len, paste, vocab, slots,
 * backbone_hash, tokens_hash, tokens_generation[_len]; the rest is filled in). The rows added must be
 * n_seq * seq_len (else DFM_EARG). Header, checksums, fsync, rename. Frees w, also on failure. */
int dfm_teacher_writer_close(dfm_teacher_writer *w, const dfm_teacher_header *meta);
/* Give up: remove the temporary. Frees w; NULL is a no-op. */
void dfm_teacher_writer_abort(dfm_teacher_writer *w);

/* ---- reading ---------------------------------------------------------------------------------- */
typedef struct {
    dfm_teacher_header hdr;
    const uint8_t *rows; /* [n_seq * seq_len * row_bytes], inside the mapping */
    const uint8_t *map;
    size_t map_bytes;
} dfm_teacher_file;

/* Row i's parts (i < n_seq * seq_len). The ids and log-probs may be unaligned for top not a multiple of
 * 1: copy them out (dfm_teacher_row). */
void dfm_teacher_row(const dfm_teacher_file *f, uint64_t i, uint32_t *ids, float *logp, dfm_teacher_row_tail *tail);

/* Map and validate PATH: magic, version, header_bytes, header checksum, shape fields in range, reserved
 * zero, payload_bytes against the shape and the file's length, the payload checksum, and every row (flags
 * known, ids below vocab, log-probs finite, <= 0 and non-increasing where F_TEACHER). Errors name the
 * file, the field or the row: DFM_ENOTFOUND, DFM_ETRUNCATED, DFM_EFORMAT, DFM_EVERSION, DFM_ECHECKSUM. */
int dfm_teacher_open(const char *path, dfm_teacher_file **out);
/* NULL is a no-op. */
void dfm_teacher_close(dfm_teacher_file *f);

#endif
