/* hidden_states.c — the hidden-states file (see hidden_states.h, hidden_states.md). */
#include "schemas/hidden_states.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "schemas/sealed.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

_Static_assert(sizeof(dfm_hidden_header) == DFM_HIDDEN_HEADER_BYTES, "hidden-states header is 128 bytes");

struct dfm_hidden_writer {
    dfm_atomic_file f;
    uint32_t dim;
    uint64_t n;
    uint32_t *values;   /* written after the keys, at close */
    size_t values_cap;
    XXH3_state_t *keys_hash;
};

int dfm_hidden_writer_open(const char *path, uint32_t dim, dfm_hidden_writer **out) {
    *out = NULL;
    if (!dim || dim > DFM_HIDDEN_MAX_DIM)
        return DFM_FAIL(DFM_EARG, "%s: key width %u outside 1..%u", path, dim, DFM_HIDDEN_MAX_DIM);
    dfm_hidden_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->keys_hash = XXH3_createState())) {
        free(w);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    XXH3_64bits_reset(w->keys_hash);
    w->dim = dim;
    int rc = dfm_atomic_open(&w->f, path);
    if (!rc) {
        /* the header's place; rewritten at close */
        static const uint8_t zero[DFM_HIDDEN_HEADER_BYTES];
        rc = dfm_atomic_write(&w->f, zero, sizeof zero);
    }
    if (rc) {
        dfm_hidden_writer_abort(w);
        return rc;
    }
    *out = w;
    return DFM_OK;
}

int dfm_hidden_writer_add(dfm_hidden_writer *w, const float *keys, const uint32_t *values, size_t n) {
    if (w->n + n > w->values_cap) {
        size_t cap = w->values_cap ? w->values_cap : 65536;
        while (cap < w->n + n) cap *= 2;
        uint32_t *v = realloc(w->values, cap * sizeof(uint32_t));
        if (!v) return DFM_FAIL(DFM_ENOMEM, "no memory for %zu token values", cap);
        w->values = v;
        w->values_cap = cap;
    }
    memcpy(w->values + w->n, values, n * sizeof(uint32_t));
    size_t bytes = n * w->dim * sizeof(float);
    XXH3_64bits_update(w->keys_hash, keys, bytes);
    DFM_TRY(dfm_atomic_write(&w->f, keys, bytes));
    w->n += n;
    return DFM_OK;
}

int dfm_hidden_writer_close(dfm_hidden_writer *w, const dfm_hidden_header *meta) {
    dfm_hidden_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, DFM_HIDDEN_MAGIC, 8);
    h.version = DFM_HIDDEN_VERSION;
    h.header_bytes = DFM_HIDDEN_HEADER_BYTES;
    h.n_keys = w->n;
    h.dim = w->dim;
    h.seq_len = meta->seq_len;
    h.tokens_read = meta->tokens_read;
    h.unseen = meta->unseen;
    h.backbone_hash = meta->backbone_hash;
    h.tokens_hash = meta->tokens_hash;
    h.payload_bytes = w->n * ((uint64_t)w->dim * 4 + 4);
    int rc = w->n ? dfm_atomic_write(&w->f, w->values, w->n * sizeof(uint32_t)) : DFM_OK;
    if (!rc) {
        /* the payload hash: keys then values, as one stream */
        XXH3_64bits_update(w->keys_hash, w->values, w->n * sizeof(uint32_t));
        h.payload_xxh64 = XXH3_64bits_digest(w->keys_hash);
        h.header_xxh64 = dfm_checksum64(&h, sizeof h);
        if (fflush(w->f.fp) || fseeko(w->f.fp, 0, SEEK_SET) || fwrite(&h, sizeof h, 1, w->f.fp) != 1 || fseeko(w->f.fp, 0, SEEK_END))
            rc = DFM_FAIL(DFM_EIO, "%s: writing the header failed", w->f.tmp_path);
    }
    if (!rc) rc = dfm_atomic_commit(&w->f);
    if (rc) dfm_atomic_abort(&w->f);
    XXH3_freeState(w->keys_hash);
    free(w->values);
    free(w);
    return rc;
}

void dfm_hidden_writer_abort(dfm_hidden_writer *w) {
    if (!w) return;
    dfm_atomic_abort(&w->f);
    if (w->keys_hash) XXH3_freeState(w->keys_hash);
    free(w->values);
    free(w);
}

static int check_header(const char *path, const dfm_hidden_header *h, uint64_t file_bytes) {
    if (memcmp(h->magic, DFM_HIDDEN_MAGIC, 8))
        return DFM_FAIL(DFM_EFORMAT, "%s is not a hidden-states file (bad magic). HINT: write it with `dfm-train hidden`", path);
    if (h->version != DFM_HIDDEN_VERSION)
        return DFM_FAIL(DFM_EVERSION, "%s: hidden-states version %u; this dfm reads version %u", path, h->version, DFM_HIDDEN_VERSION);
    if (h->header_bytes != DFM_HIDDEN_HEADER_BYTES)
        return DFM_FAIL(DFM_EFORMAT, "%s: header_bytes %u, expected %u", path, h->header_bytes, DFM_HIDDEN_HEADER_BYTES);
    dfm_hidden_header z = *h;
    z.header_xxh64 = 0;
    if (dfm_checksum64(&z, sizeof z) != h->header_xxh64) return DFM_FAIL(DFM_ECHECKSUM, "%s: header checksum mismatch", path);
    if (!h->dim || h->dim > DFM_HIDDEN_MAX_DIM) return DFM_FAIL(DFM_EFORMAT, "%s: dim %u outside 1..%u", path, h->dim, DFM_HIDDEN_MAX_DIM);
    for (size_t i = 0; i < sizeof h->reserved; i++)
        if (h->reserved[i]) return DFM_FAIL(DFM_EFORMAT, "%s: reserved header byte %zu is not zero", path, i);
    uint64_t row = (uint64_t)h->dim * 4 + 4;
    if (h->n_keys > (UINT64_MAX - DFM_HIDDEN_HEADER_BYTES) / row || h->payload_bytes != h->n_keys * row)
        return DFM_FAIL(DFM_EFORMAT, "%s: payload_bytes %llu does not match %llu keys of width %u", path,
                        (unsigned long long)h->payload_bytes, (unsigned long long)h->n_keys, h->dim);
    if (file_bytes < DFM_HIDDEN_HEADER_BYTES + h->payload_bytes)
        return DFM_FAIL(DFM_ETRUNCATED, "%s: %llu bytes, the header promises %llu", path, (unsigned long long)file_bytes,
                        (unsigned long long)(DFM_HIDDEN_HEADER_BYTES + h->payload_bytes));
    if (file_bytes > DFM_HIDDEN_HEADER_BYTES + h->payload_bytes)
        return DFM_FAIL(DFM_EFORMAT, "%s: %llu bytes after the payload", path,
                        (unsigned long long)(file_bytes - DFM_HIDDEN_HEADER_BYTES - h->payload_bytes));
    return DFM_OK;
}

static int check_any(const char *path, const void *h, uint64_t file_bytes) { return check_header(path, h, file_bytes); }

int dfm_hidden_open(const char *path, dfm_hidden_file **out) {
    *out = NULL;
    static const dfm_sealed_spec spec = {
        .hint = "HINT: write it with `dfm-train hidden --backbone DIR --data TOKENS --out FILE`",
        .damaged = "the keys or values are damaged", .header_bytes = DFM_HIDDEN_HEADER_BYTES,
        .payload_bytes_at = offsetof(dfm_hidden_header, payload_bytes),
        .payload_xxh64_at = offsetof(dfm_hidden_header, payload_xxh64), .check = check_any};
    dfm_hidden_header h;
    const uint8_t *map = NULL;
    size_t n = 0;
    DFM_TRY(dfm_sealed_map(path, &spec, &h, &map, &n));
    dfm_hidden_file *f = calloc(1, sizeof *f);
    if (!f) {
        dfm_unmap_file(map, n);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    f->hdr = h;
    f->map = map;
    f->map_bytes = n;
    f->keys = (const float *)(map + DFM_HIDDEN_HEADER_BYTES); /* 128-byte offset in a page-aligned mapping */
    f->values = (const uint32_t *)(map + DFM_HIDDEN_HEADER_BYTES + f->hdr.n_keys * f->hdr.dim * 4);
    *out = f;
    return DFM_OK;
}

void dfm_hidden_close(dfm_hidden_file *f) {
    if (!f) return;
    dfm_unmap_file(f->map, f->map_bytes);
    free(f);
}
