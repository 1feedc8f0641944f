/* target_record.c — encode/decode of target records. Spec: schemas/target_record.md. */
#include "schemas/target_record.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zstd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dfm target records are little-endian and this code copies them as they are: port before use"
#endif

size_t dfm_dtype_size(int dtype) {
    switch (dtype) {
    case DFM_DTYPE_FP32: return 4;
    case DFM_DTYPE_FP16: return 2;
    case DFM_DTYPE_BF16: return 2;
    default: return 0;
    }
}

const char *dfm_dtype_name(int dtype) {
    switch (dtype) {
    case DFM_DTYPE_FP32: return "fp32";
    case DFM_DTYPE_FP16: return "fp16";
    case DFM_DTYPE_BF16: return "bf16";
    default: return "?";
    }
}

int dfm_dtype_parse(const char *name, int *dtype) {
    if (name && !strcmp(name, "fp32")) *dtype = DFM_DTYPE_FP32;
    else if (name && !strcmp(name, "fp16")) *dtype = DFM_DTYPE_FP16;
    else if (name && !strcmp(name, "bf16")) *dtype = DFM_DTYPE_BF16;
    else return DFM_FAIL(DFM_EARG, "unknown dtype '%s'. HINT: use fp32, fp16 or bf16", name ? name : "(null)");
    return DFM_OK;
}

size_t dfm_trec_payload_bytes(uint32_t k, uint32_t d, int dtype, int ids_only) {
    size_t n = 8 + (size_t)k * 12;
    if (!ids_only) n += (size_t)k * d * dfm_dtype_size(dtype);
    return n;
}

size_t dfm_trec_max_bytes(uint32_t k, uint32_t d, int dtype, int ids_only) {
    size_t p = dfm_trec_payload_bytes(k, d, dtype, ids_only);
    size_t b = ZSTD_compressBound(p);
    return DFM_TREC_HEADER_BYTES + (b > p ? b : p);
}

void dfm_trec_key(uint64_t id, uint8_t key[8]) {
    for (int i = 0; i < 8; i++) key[i] = (uint8_t)(id >> (56 - 8 * i));
}

int dfm_trec_key_id(const void *key, size_t n, uint64_t *id) {
    if (n != 8) return DFM_FAIL(DFM_EFORMAT, "key of %zu bytes; target keys are 8-byte big-endian chunk ids", n);
    const uint8_t *k = key;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | k[i];
    *id = v;
    return DFM_OK;
}

/* F16C fast paths (x86-64 with AVX and F16C, checked at run time); bit-identical to the scalar code
 * above (tests/unit/test_shard_record.c compares them over every half and random floats). Not under
 * clang (the fuzz build): clang 14's __builtin_cpu_supports does not know "f16c". */
#if defined(__x86_64__) && !defined(__clang__)
#include <immintrin.h>
#define DFM_HAVE_F16C_PATH 1
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const uint16_t *in, size_t n, float *out) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(in + i))));
    for (; i < n; i++) out[i] = dfm_f16_to_f32(in[i]);
}
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(const float *in, size_t n, uint16_t *out) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) out[i] = dfm_f32_to_f16(in[i]);
}
static int have_f16c(void) {
    if (getenv("DFM_NO_F16C")) return 0; /* tests: force the scalar path */
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}
#endif

void dfm_convert_from_f32(int dtype, const float *in, size_t n, void *out) {
    if (dtype == DFM_DTYPE_FP32) {
        memcpy(out, in, n * 4);
    } else if (dtype == DFM_DTYPE_FP16) {
#ifdef DFM_HAVE_F16C_PATH
        if (have_f16c()) {
            f32_to_f16_f16c(in, n, out);
            return;
        }
#endif
        uint16_t *o = out;
        for (size_t i = 0; i < n; i++) o[i] = dfm_f32_to_f16(in[i]);
    } else if (dtype == DFM_DTYPE_BF16) {
        uint16_t *o = out;
        for (size_t i = 0; i < n; i++) o[i] = dfm_f32_to_bf16(in[i]);
    }
}

void dfm_convert_to_f32(int dtype, const void *in, size_t n, float *out) {
    if (dtype == DFM_DTYPE_FP32) {
        memcpy(out, in, n * 4);
    } else if (dtype == DFM_DTYPE_FP16) {
#ifdef DFM_HAVE_F16C_PATH
        if (have_f16c()) {
            f16_to_f32_f16c(in, n, out);
            return;
        }
#endif
        const uint16_t *p = in;
        for (size_t i = 0; i < n; i++) out[i] = dfm_f16_to_f32(p[i]);
    } else if (dtype == DFM_DTYPE_BF16) {
        const uint16_t *p = in;
        for (size_t i = 0; i < n; i++) out[i] = dfm_bf16_to_f32(p[i]);
    }
}

void dfm_byte_shuffle(const void *in, size_t n, size_t es, void *out) {
    const uint8_t *s = in;
    uint8_t *d = out;
    for (size_t b = 0; b < es; b++)
        for (size_t i = 0; i < n; i++) d[b * n + i] = s[i * es + b];
}

void dfm_byte_unshuffle(const void *in, size_t n, size_t es, void *out) {
    const uint8_t *s = in;
    uint8_t *d = out;
    for (size_t b = 0; b < es; b++)
        for (size_t i = 0; i < n; i++) d[i * es + b] = s[b * n + i];
}

/* The header checksum covers the whole record as stored: XXH3-64 of the stored bytes, seeded with
 * the XXH3-64 of the 40 header bytes before the checksum field. */
static uint64_t record_checksum(const dfm_trec_header *h, const void *stored, size_t n) {
    return XXH3_64bits_withSeed(stored, n, dfm_checksum64(h, DFM_TREC_HEADER_BYTES - 8));
}

const char *dfm_trec_slots_name(int slots) {
    switch (slots) {
    case DFM_TREC_SLOTS_NEIGHBOUR: return "neighbour";
    case DFM_TREC_SLOTS_CONTINUATION: return "continuation";
    case DFM_TREC_SLOTS_BOTH: return "both";
    default: return "?";
    }
}

int dfm_trec_slots_parse(const char *name, int *slots) {
    for (int s = DFM_TREC_SLOTS_NEIGHBOUR; s <= DFM_TREC_SLOTS_BOTH; s++)
        if (name && !strcmp(name, dfm_trec_slots_name(s))) {
            *slots = s;
            return DFM_OK;
        }
    return DFM_FAIL(DFM_EARG, "slots '%s': expected neighbour, continuation or both", name ? name : "(null)");
}

/* slots = BOTH (k = 2J): continuation slot J + r is valid only with neighbour slot r, and holds its id + 1. */
static int both_pairs_ok(uint32_t k, uint64_t mask, const int64_t *ids) {
    const uint32_t J = k / 2;
    for (uint32_t r = 0; r < J; r++)
        if (((mask >> (J + r)) & 1u) && (!((mask >> r) & 1u) || ids[J + r] != ids[r] + 1)) return 0;
    return 1;
}

/* ---- codec ----------------------------------------------------------------------------------- */
struct dfm_trec_codec {
    dfm_trec_params p;
    size_t es, payload_bytes, emb_off, emb_elems;
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    uint8_t *payload; /* logical payload */
    uint8_t *stage;   /* shuffled copy (encode) / decompressed bytes (decode) */
};

int dfm_trec_codec_create(const dfm_trec_params *p, dfm_trec_codec **out) {
    *out = NULL;
    if (p->k < 1 || p->k > DFM_TREC_MAX_K)
        return DFM_FAIL(DFM_EARG, "K = %u is outside 1..%u. HINT: target records hold at most 64 slots", p->k,
                        DFM_TREC_MAX_K);
    if (p->d < 1 || p->d > DFM_TREC_MAX_D) return DFM_FAIL(DFM_EARG, "d = %u is outside 1..%u", p->d, DFM_TREC_MAX_D);
    if (!dfm_dtype_size(p->dtype)) return DFM_FAIL(DFM_EARG, "unknown dtype code %d", p->dtype);
    if (p->slots < DFM_TREC_SLOTS_NEIGHBOUR || p->slots > DFM_TREC_SLOTS_BOTH || (p->slots == DFM_TREC_SLOTS_BOTH && p->k % 2))
        return DFM_FAIL(DFM_EARG, "slots %d with K = %u: expected neighbour, continuation, or both with an even K", p->slots, p->k);
    if (p->level < 0 || p->level > ZSTD_maxCLevel())
        return DFM_FAIL(DFM_EARG, "zstd level %d is outside 0..%d", p->level, ZSTD_maxCLevel());
    dfm_trec_codec *c = calloc(1, sizeof *c);
    if (!c) return DFM_FAIL(DFM_ENOMEM, "no memory for a record codec");
    c->p = *p;
    c->es = dfm_dtype_size(p->dtype);
    c->payload_bytes = dfm_trec_payload_bytes(p->k, p->d, p->dtype, p->ids_only);
    c->emb_off = 8 + (size_t)p->k * 12;
    c->emb_elems = p->ids_only ? 0 : (size_t)p->k * p->d;
    c->cctx = ZSTD_createCCtx();
    c->dctx = ZSTD_createDCtx();
    c->payload = malloc(c->payload_bytes);
    c->stage = malloc(c->payload_bytes);
    if (!c->cctx || !c->dctx || !c->payload || !c->stage) {
        dfm_trec_codec_free(c);
        return DFM_FAIL(DFM_ENOMEM, "no memory for a record codec (%zu-byte payloads)", dfm_trec_payload_bytes(p->k, p->d, p->dtype, p->ids_only));
    }
    *out = c;
    return DFM_OK;
}

void dfm_trec_codec_free(dfm_trec_codec *c) {
    if (!c) return;
    ZSTD_freeCCtx(c->cctx);
    ZSTD_freeDCtx(c->dctx);
    free(c->payload);
    free(c->stage);
    free(c);
}

int dfm_trec_encode(dfm_trec_codec *c, const dfm_trec *rec, void *out, size_t cap, size_t *out_bytes) {
    const uint32_t k = c->p.k, d = c->p.d;
    if (cap < dfm_trec_max_bytes(k, d, c->p.dtype, c->p.ids_only))
        return DFM_FAIL(DFM_EINTERNAL, "record buffer of %zu bytes is below dfm_trec_max_bytes()", cap);
    uint64_t mask = rec->mask;
    int seq_start = (rec->flags & DFM_TREC_F_SEQ_START) != 0;
    if (seq_start) mask = 0;
    if (k < 64 && (mask >> k))
        return DFM_FAIL(DFM_EARG, "chunk %llu: mask 0x%llx has bits at or above K = %u", (unsigned long long)rec->chunk_id,
                        (unsigned long long)mask, k);
    if (!c->p.ids_only && !rec->emb && mask)
        return DFM_FAIL(DFM_EINTERNAL, "chunk %llu: no embeddings given for a record that stores them",
                        (unsigned long long)rec->chunk_id);
    if (c->p.slots == DFM_TREC_SLOTS_BOTH && !both_pairs_ok(k, mask, rec->ids))
        return DFM_FAIL(DFM_EARG, "chunk %llu: slots 'both' with a continuation slot that does not follow its neighbour slot",
                        (unsigned long long)rec->chunk_id);
    uint8_t *p = c->payload;
    memcpy(p, &mask, 8);
    int64_t *ids = (int64_t *)(void *)(p + 8);
    float *scores = (float *)(void *)(p + 8 + 8 * (size_t)k);
    uint8_t *emb = p + c->emb_off;
    for (uint32_t i = 0; i < k; i++) {
        int valid = (int)((mask >> i) & 1u);
        int64_t id = valid ? rec->ids[i] : -1;
        float sc = valid ? rec->scores[i] : 0.0f;
        if (valid && id < 0)
            return DFM_FAIL(DFM_EARG, "chunk %llu slot %u: valid slot with id %lld. HINT: a padded slot must have its mask bit clear",
                            (unsigned long long)rec->chunk_id, i, (long long)id);
        memcpy(&ids[i], &id, 8);
        memcpy(&scores[i], &sc, 4);
        if (!c->p.ids_only) {
            uint8_t *row = emb + (size_t)i * d * c->es;
            if (valid) dfm_convert_from_f32(c->p.dtype, rec->emb + (size_t)i * d, d, row);
            else memset(row, 0, (size_t)d * c->es);
        }
    }
    uint64_t sum = dfm_checksum64(p, c->payload_bytes);
    const uint8_t *src = p;
    uint16_t flags = 0;
    if (seq_start) flags |= DFM_TREC_F_SEQ_START;
    if (!mask) flags |= DFM_TREC_F_EMPTY;
    if (c->p.ids_only) flags |= DFM_TREC_F_IDS_ONLY;
    if (c->p.shuffle && c->emb_elems) {
        memcpy(c->stage, p, c->emb_off);
        dfm_byte_shuffle(emb, c->emb_elems, c->es, c->stage + c->emb_off);
        src = c->stage;
        flags |= DFM_TREC_F_SHUFFLE;
    }
    uint8_t *o = out;
    size_t z = ZSTD_compressCCtx(c->cctx, o + DFM_TREC_HEADER_BYTES, cap - DFM_TREC_HEADER_BYTES, src, c->payload_bytes,
                                 c->p.level ? c->p.level : ZSTD_CLEVEL_DEFAULT);
    if (ZSTD_isError(z) || z >= c->payload_bytes) {
        memcpy(o + DFM_TREC_HEADER_BYTES, src, c->payload_bytes);
        z = c->payload_bytes;
        flags |= DFM_TREC_F_RAW;
    }
    dfm_trec_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, DFM_TREC_MAGIC, 4);
    h.version = DFM_TREC_VERSION;
    h.flags = flags;
    h.chunk_id = rec->chunk_id;
    h.k = (uint16_t)k;
    h.dtype = (uint8_t)c->p.dtype;
    h.slots = (uint8_t)c->p.slots;
    h.d = d;
    h.payload_bytes = (uint32_t)c->payload_bytes;
    h.stored_bytes = (uint32_t)z;
    h.payload_checksum = sum;
    h.header_checksum = record_checksum(&h, o + DFM_TREC_HEADER_BYTES, z);
    memcpy(o, &h, sizeof h);
    *out_bytes = DFM_TREC_HEADER_BYTES + z;
    return DFM_OK;
}

int dfm_trec_check_header(const void *rec, size_t n, dfm_trec_header *hp) {
    if (n < DFM_TREC_HEADER_BYTES)
        return DFM_FAIL(DFM_ETRUNCATED, "record of %zu bytes is shorter than its %u-byte header", n, DFM_TREC_HEADER_BYTES);
    dfm_trec_header h;
    memcpy(&h, rec, sizeof h);
    if (memcmp(h.magic, DFM_TREC_MAGIC, 4) != 0)
        return DFM_FAIL(DFM_EFORMAT, "not a target record (magic %02x%02x%02x%02x, want \"DFTR\")", (uint8_t)h.magic[0],
                        (uint8_t)h.magic[1], (uint8_t)h.magic[2], (uint8_t)h.magic[3]);
    if (h.version != DFM_TREC_VERSION)
        return DFM_FAIL(DFM_EVERSION, "target record format version %u; this dfm reads version %u. HINT: read it with the dfm that wrote it, or re-run 'dfm write-targets'",
                        h.version, DFM_TREC_VERSION);
    if (h.flags & ~DFM_TREC_F_KNOWN) return DFM_FAIL(DFM_EFORMAT, "chunk %llu: unknown flags 0x%x", (unsigned long long)h.chunk_id, h.flags);
    if (h.k < 1 || h.k > DFM_TREC_MAX_K || h.d < 1 || h.d > DFM_TREC_MAX_D || !dfm_dtype_size(h.dtype) || h.slots > DFM_TREC_SLOTS_BOTH ||
        (h.slots == DFM_TREC_SLOTS_BOTH && h.k % 2))
        return DFM_FAIL(DFM_EFORMAT, "chunk %llu: impossible header (K %u, d %u, dtype %u, slots %u)",
                        (unsigned long long)h.chunk_id, h.k, h.d, h.dtype, h.slots);
    int ids_only = (h.flags & DFM_TREC_F_IDS_ONLY) != 0;
    if (h.payload_bytes != dfm_trec_payload_bytes(h.k, h.d, h.dtype, ids_only))
        return DFM_FAIL(DFM_EFORMAT, "chunk %llu: payload_bytes %u, but K %u, d %u, %s give %zu", (unsigned long long)h.chunk_id,
                        h.payload_bytes, h.k, h.d, dfm_dtype_name(h.dtype), dfm_trec_payload_bytes(h.k, h.d, h.dtype, ids_only));
    if ((size_t)h.stored_bytes > n - DFM_TREC_HEADER_BYTES)
        return DFM_FAIL(DFM_ETRUNCATED, "chunk %llu: record of %zu bytes, header says %u stored bytes follow the header",
                        (unsigned long long)h.chunk_id, n, h.stored_bytes);
    if ((size_t)h.stored_bytes != n - DFM_TREC_HEADER_BYTES)
        return DFM_FAIL(DFM_EFORMAT, "chunk %llu: record of %zu bytes, header says %u stored bytes (trailing bytes)",
                        (unsigned long long)h.chunk_id, n, h.stored_bytes);
    if (record_checksum(&h, (const uint8_t *)rec + DFM_TREC_HEADER_BYTES, h.stored_bytes) != h.header_checksum)
        return DFM_FAIL(DFM_ECHECKSUM, "target record checksum mismatch (chunk id field %llu): the stored record is damaged. HINT: delete the shard and re-run 'dfm write-targets'",
                        (unsigned long long)h.chunk_id);
    if ((h.flags & DFM_TREC_F_RAW) && h.stored_bytes != h.payload_bytes)
        return DFM_FAIL(DFM_EFORMAT, "chunk %llu: raw record with %u stored bytes for a %u-byte payload", (unsigned long long)h.chunk_id,
                        h.stored_bytes, h.payload_bytes);
    *hp = h;
    return DFM_OK;
}

int dfm_trec_decode(dfm_trec_codec *c, const void *rec, size_t n, dfm_trec *out, const uint8_t **payload_out,
                    size_t *payload_bytes_out) {
    dfm_trec_header h;
    DFM_TRY(dfm_trec_check_header(rec, n, &h));
    unsigned long long cid = (unsigned long long)h.chunk_id;
    int ids_only = (h.flags & DFM_TREC_F_IDS_ONLY) != 0;
    if (h.k != c->p.k || h.d != c->p.d || h.dtype != c->p.dtype || ids_only != c->p.ids_only || h.slots != c->p.slots)
        return DFM_FAIL(DFM_EMISMATCH, "chunk %llu: record has K %u, d %u, %s, store %s, slots %s; expected K %u, d %u, %s, store %s, slots %s",
                        cid, h.k, h.d, dfm_dtype_name(h.dtype), ids_only ? "ids" : "embeddings", dfm_trec_slots_name(h.slots), c->p.k,
                        c->p.d, dfm_dtype_name(c->p.dtype), c->p.ids_only ? "ids" : "embeddings", dfm_trec_slots_name(c->p.slots));
    const uint8_t *stored = (const uint8_t *)rec + DFM_TREC_HEADER_BYTES;
    const uint8_t *src;
    if (h.flags & DFM_TREC_F_RAW) {
        src = stored;
    } else {
        unsigned long long fcs = ZSTD_getFrameContentSize(stored, h.stored_bytes);
        if (fcs != h.payload_bytes)
            return DFM_FAIL(DFM_EFORMAT, "chunk %llu: zstd frame declares %llu bytes, header says %u (damaged record)", cid,
                            fcs, h.payload_bytes);
        size_t z = ZSTD_decompressDCtx(c->dctx, c->stage, c->payload_bytes, stored, h.stored_bytes);
        if (ZSTD_isError(z))
            return DFM_FAIL(DFM_EFORMAT, "chunk %llu: zstd frame does not decode: %s (damaged record)", cid, ZSTD_getErrorName(z));
        if (z != h.payload_bytes)
            return DFM_FAIL(DFM_EFORMAT, "chunk %llu: decompressed to %zu bytes, header says %u", cid, z, h.payload_bytes);
        src = c->stage;
    }
    const uint8_t *p;
    if (h.flags & DFM_TREC_F_SHUFFLE) {
        if (ids_only) return DFM_FAIL(DFM_EFORMAT, "chunk %llu: SHUFFLE flag on a record without embeddings", cid);
        memcpy(c->payload, src, c->emb_off);
        dfm_byte_unshuffle(src + c->emb_off, c->emb_elems, c->es, c->payload + c->emb_off);
        p = c->payload;
    } else {
        p = src;
    }
    if (dfm_checksum64(p, h.payload_bytes) != h.payload_checksum)
        return DFM_FAIL(DFM_ECHECKSUM, "chunk %llu: payload checksum mismatch. HINT: the shard is damaged; delete it and re-run 'dfm write-targets'",
                        cid);
    uint64_t mask;
    memcpy(&mask, p, 8);
    const uint32_t k = h.k;
    if (k < 64 && (mask >> k)) return DFM_FAIL(DFM_EFORMAT, "chunk %llu: mask 0x%llx has bits at or above K = %u", cid, (unsigned long long)mask, k);
    if (((h.flags & DFM_TREC_F_EMPTY) != 0) != (mask == 0) || ((h.flags & DFM_TREC_F_SEQ_START) && mask))
        return DFM_FAIL(DFM_EFORMAT, "chunk %llu: flags 0x%x disagree with mask 0x%llx", cid, h.flags, (unsigned long long)mask);
    const uint8_t *pid = p + 8, *psc = p + 8 + 8 * (size_t)k;
    for (uint32_t i = 0; i < k; i++) {
        int64_t id;
        memcpy(&id, pid + 8 * (size_t)i, 8);
        int valid = (int)((mask >> i) & 1u);
        if (valid ? id < 0 : id != -1)
            return DFM_FAIL(DFM_EFORMAT, "chunk %llu slot %u: id %lld with mask bit %d (valid slots need ids >= 0, masked ones -1)",
                            cid, i, (long long)id, valid);
    }
    if (h.slots == DFM_TREC_SLOTS_BOTH) {
        int64_t ids[DFM_TREC_MAX_K];
        memcpy(ids, pid, 8 * (size_t)k);
        if (!both_pairs_ok(k, mask, ids))
            return DFM_FAIL(DFM_EFORMAT, "chunk %llu: slots 'both' with a continuation slot that does not follow its neighbour slot "
                            "(mask 0x%llx)", cid, (unsigned long long)mask);
    }
    out->chunk_id = h.chunk_id;
    out->flags = h.flags;
    out->mask = mask;
    if (out->ids) memcpy(out->ids, pid, 8 * (size_t)k);
    if (out->scores) memcpy(out->scores, psc, 4 * (size_t)k);
    if (out->emb && !ids_only) dfm_convert_to_f32(h.dtype, p + c->emb_off, c->emb_elems, out->emb);
    if (payload_out) *payload_out = p;
    if (payload_bytes_out) *payload_bytes_out = h.payload_bytes;
    return DFM_OK;
}
