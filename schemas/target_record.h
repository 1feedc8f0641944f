/* target_record.h — one target record: a chunk's K neighbours, in retrieval rank order.
 * Spec: schemas/target_record.md. Written by `dfm write-targets`, read by shard/target_reader.h.
 *
 * Record = 48-byte header (dfm_trec_header) + stored payload (zstd frame, or raw when zstd does not
 * shrink it). The logical (uncompressed) payload, all little-endian:
 *
 *   uint64  mask             bit i set = slot i holds a real neighbour (K <= 64)
 *   int64   ids[K]           neighbour chunk ids in rank order; -1 in every masked slot
 *   float32 scores[K]        retrieval scores; 0 in every masked slot
 *   dtype   emb[K][d]        the neighbours' stored embeddings; zeros in masked slots
 *                            (absent when flag IDS_ONLY: rows come from the shard's table.bin)
 *
 * With flag SHUFFLE the emb section is byte-shuffled before zstd (all first bytes of each element,
 * then all second bytes, ...). The checksum is XXH3-64 of the logical payload (unshuffled,
 * uncompressed), so two records with equal content have equal checksums whatever their options.
 * A first chunk of a training sequence has no query: flag SEQ_START, mask 0, ids -1, scores 0,
 * zero embeddings (its loss is masked). Keys in LMDB: the chunk id as 8-byte big-endian.
 */
#ifndef DFM_TARGET_RECORD_H
#define DFM_TARGET_RECORD_H

#include "schemas/half.h" /* fp16/bf16 scalar conversions */
#include <stddef.h>
#include <stdint.h>

#define DFM_TREC_MAGIC "DFTR"
#define DFM_TREC_VERSION 1u
#define DFM_TREC_HEADER_BYTES 48u
#define DFM_TREC_MAX_K 64u
#define DFM_TREC_MAX_D 65536u
#define DFM_TREC_KEY_BYTES 8u

/* dtype of stored embeddings */
enum { DFM_DTYPE_FP32 = 1, DFM_DTYPE_FP16 = 2, DFM_DTYPE_BF16 = 3 };

/* What the K slots of a record hold (header byte 19, `dfm write-targets --slots-hold`). The id of a
 * valid slot is always the chunk whose embedding the slot holds (so store = ids reads alike):
 *   NEIGHBOUR     slot r = neighbour r (rank order)
 *   CONTINUATION  slot r = the continuation of neighbour r: the chunk after it in its own document
 *                 (neighbour id + 1), masked where the neighbour ends its document
 *   BOTH          K = 2J: slots 0..J-1 as NEIGHBOUR, slots J..2J-1 as CONTINUATION of the same J
 *                 neighbours (slot J + r is valid only with slot r, and then holds id[r] + 1)
 * Rule for "the chunk after it in its own document": schemas/target_record.md. */
enum { DFM_TREC_SLOTS_NEIGHBOUR = 0, DFM_TREC_SLOTS_CONTINUATION = 1, DFM_TREC_SLOTS_BOTH = 2 };
/* "neighbour", "continuation", "both" (or "?"), and the reverse (DFM_EARG for another name). */
const char *dfm_trec_slots_name(int slots);
int dfm_trec_slots_parse(const char *name, int *slots);

/* header flags */
enum {
    DFM_TREC_F_SHUFFLE = 1u,   /* emb section byte-shuffled before compression */
    DFM_TREC_F_RAW = 2u,       /* payload stored uncompressed (zstd did not shrink it) */
    DFM_TREC_F_IDS_ONLY = 4u,  /* no emb section (store = ids; embeddings in the shard's table) */
    DFM_TREC_F_SEQ_START = 8u, /* first chunk of a training sequence: no query, all slots masked */
    DFM_TREC_F_EMPTY = 16u,    /* no valid slot at all (SEQ_START, or every neighbour excluded) */
    DFM_TREC_F_KNOWN = 31u,
};

typedef struct {
    char magic[4];             /* "DFTR" */
    uint16_t version;          /* DFM_TREC_VERSION; checked before anything else after magic */
    uint16_t flags;            /* DFM_TREC_F_* */
    uint64_t chunk_id;         /* equals the key */
    uint16_t k;                /* slots, 1..64 */
    uint8_t dtype;             /* DFM_DTYPE_* of emb (or of the shard table with IDS_ONLY) */
    uint8_t slots;             /* DFM_TREC_SLOTS_*: what the slots hold (0 = neighbours; was "reserved, zero") */
    uint32_t d;                /* embedding width, 1..65536 */
    uint32_t payload_bytes;    /* logical payload size (must equal dfm_trec_payload_bytes()) */
    uint32_t stored_bytes;     /* bytes after the header */
    uint64_t payload_checksum; /* XXH3-64 of the logical payload */
    uint64_t header_checksum;  /* XXH3-64 of the stored bytes, seeded with XXH3-64 of the 40 bytes before
                                * this field: covers the whole record as stored */
} dfm_trec_header;
_Static_assert(sizeof(dfm_trec_header) == DFM_TREC_HEADER_BYTES, "target record header is 48 bytes");

/* A record's content, as pointers to caller-owned arrays. */
typedef struct {
    uint64_t chunk_id;
    uint32_t flags;     /* on encode: only SEQ_START is read; on decode: the header's flags */
    uint64_t mask;      /* bit i = slot i valid */
    int64_t *ids;       /* [k] */
    float *scores;      /* [k] */
    float *emb;         /* [k*d] fp32; encode: source rows (NULL with store ids); decode: may be NULL */
} dfm_trec;

/* Bytes of one element of dtype (4, 2, 2), 0 for an unknown dtype. */
size_t dfm_dtype_size(int dtype);
/* "fp32", "fp16", "bf16" (or "?"), and the reverse (DFM_EARG for another name). */
const char *dfm_dtype_name(int dtype);
int dfm_dtype_parse(const char *name, int *dtype);

/* Logical payload size for (k, d, dtype, ids_only). */
size_t dfm_trec_payload_bytes(uint32_t k, uint32_t d, int dtype, int ids_only);
/* Upper bound of an encoded record's size (header + zstd bound of the payload). */
size_t dfm_trec_max_bytes(uint32_t k, uint32_t d, int dtype, int ids_only);

/* Key of a chunk id: 8 bytes big-endian, so LMDB's memcmp order is id order. */
void dfm_trec_key(uint64_t chunk_id, uint8_t key[8]);
/* Inverse; DFM_EFORMAT when the key is not 8 bytes. */
int dfm_trec_key_id(const void *key, size_t n, uint64_t *chunk_id);

/* Convert n floats to dtype (out holds n * dfm_dtype_size(dtype) bytes), and back. */
void dfm_convert_from_f32(int dtype, const float *in, size_t n, void *out);
void dfm_convert_to_f32(int dtype, const void *in, size_t n, float *out);

/* Byte shuffle of n elements of es bytes (out[b*n + i] = in[i*es + b]), and its inverse. */
void dfm_byte_shuffle(const void *in, size_t n, size_t es, void *out);
void dfm_byte_unshuffle(const void *in, size_t n, size_t es, void *out);

/* ---- codec: reusable zstd contexts and scratch (one per thread) -------------------------------- */
typedef struct dfm_trec_codec dfm_trec_codec;

typedef struct {
    uint32_t k, d;
    int dtype;    /* DFM_DTYPE_* */
    int ids_only; /* 1: store = ids */
    int shuffle;  /* 1: byte-shuffle emb before zstd */
    int level;    /* zstd level (1..19; 0 = zstd's default 3) */
    int slots;    /* DFM_TREC_SLOTS_*: recorded in every header; decode requires the header's to equal it */
} dfm_trec_params;

/* Create a codec for records of these parameters. DFM_EARG on impossible parameters. */
int dfm_trec_codec_create(const dfm_trec_params *p, dfm_trec_codec **out);
/* NULL is a no-op. */
void dfm_trec_codec_free(dfm_trec_codec *c);

/* Encode rec into out (cap bytes, at least dfm_trec_max_bytes()); *out_bytes gets the record size.
 * Masked slots are normalised (id -1, score 0, zero embedding); SEQ_START forces mask 0. The mask must
 * have no bit at or above k, and every valid id must be >= 0 (DFM_EARG otherwise); with slots = BOTH a
 * continuation slot J + r may be valid only with slot r, holding ids[r] + 1 (DFM_EARG). */
int dfm_trec_encode(dfm_trec_codec *c, const dfm_trec *rec, void *out, size_t cap, size_t *out_bytes);

/* Validate a record without decompressing it: magic (DFM_EFORMAT), version (DFM_EVERSION), fields
 * and sizes vs n (DFM_EFORMAT / DFM_ETRUNCATED), the record checksum over header and stored bytes
 * (DFM_ECHECKSUM). Fills *hdr. */
int dfm_trec_check_header(const void *rec, size_t n, dfm_trec_header *hdr);

/* Decode and fully validate a record (header, decompressed size, checksum, mask/ids consistency)
 * into rec's caller arrays (ids, scores: k each; emb: k*d floats, or NULL to skip). With IDS_ONLY the
 * emb array is left untouched (the reader fills it from the table). The codec's k, d, dtype must
 * match the header, and so must its slots (DFM_EMISMATCH); slots = BOTH records are checked as encode
 * requires. If payload (may be NULL) is non-NULL it receives a pointer to
 * the logical payload inside the codec (valid until the next call). Errors name the chunk id; the
 * caller adds the shard and key. */
int dfm_trec_decode(dfm_trec_codec *c, const void *rec, size_t n, dfm_trec *out, const uint8_t **payload,
                    size_t *payload_bytes);

#endif
