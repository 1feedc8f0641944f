/* teacher_file.c — the teacher file (see teacher_file.h, teacher_file.md). */
#include "schemas/teacher_file.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "schemas/sealed.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

_Static_assert(sizeof(dfm_teacher_header) == DFM_TEACHER_HEADER_BYTES, "teacher header is 128 bytes");
_Static_assert(sizeof(dfm_teacher_row_tail) == 16, "teacher row tail is 16 bytes");

struct dfm_teacher_writer {
    dfm_atomic_file f;
    uint32_t top;
    uint64_t rows;
    uint8_t *buf; /* one row */
    XXH3_state_t *hash;
};

int dfm_teacher_writer_open(const char *path, uint32_t top, dfm_teacher_writer **out) {
    *out = NULL;
    if (!top || top > DFM_TEACHER_MAX_TOP)
        return DFM_FAIL(DFM_EARG, "%s: top %u outside 1..%u", path, top, DFM_TEACHER_MAX_TOP);
    dfm_teacher_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->buf = malloc(dfm_teacher_row_bytes(top))) || !(w->hash = XXH3_createState())) {
        if (w) free(w->buf);
        free(w);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    XXH3_64bits_reset(w->hash);
    w->top = top;
    int rc = dfm_atomic_open(&w->f, path);
    if (!rc) {
        static const uint8_t zero[DFM_TEACHER_HEADER_BYTES]; /* the header's place; rewritten at close */
        rc = dfm_atomic_write(&w->f, zero, sizeof zero);
    }
    if (rc) {
        dfm_teacher_writer_abort(w);
        return rc;
    }
    *out = w;
    return DFM_OK;
}

int dfm_teacher_writer_add(dfm_teacher_writer *w, const uint32_t *ids, const float *logp,
                           const dfm_teacher_row_tail *tails, size_t n) {
    size_t S = w->top, rb = dfm_teacher_row_bytes(w->top);
    for (size_t i = 0; i < n; i++) {
        memcpy(w->buf, ids + i * S, S * 4);
        memcpy(w->buf + S * 4, logp + i * S, S * 4);
        memcpy(w->buf + S * 8, tails + i, sizeof *tails);
        XXH3_64bits_update(w->hash, w->buf, rb);
        DFM_TRY(dfm_atomic_write(&w->f, w->buf, rb));
    }
    w->rows += n;
    return DFM_OK;
}

int dfm_teacher_writer_close(dfm_teacher_writer *w, const dfm_teacher_header *meta) {
    dfm_teacher_header h = *meta;
    memcpy(h.magic, DFM_TEACHER_MAGIC, 8);
    h.version = DFM_TEACHER_VERSION;
    h.header_bytes = DFM_TEACHER_HEADER_BYTES;
    h.top = w->top;
    h.row_bytes = dfm_teacher_row_bytes(w->top);
    h.payload_bytes = w->rows * h.row_bytes;
    memset(h.reserved, 0, sizeof h.reserved);
    int rc = DFM_OK;
    if (h.n_seq * (uint64_t)h.seq_len != w->rows)
        rc = DFM_FAIL(DFM_EARG, "%s: %llu rows written for %llu sequences of %u", w->f.tmp_path,
                      (unsigned long long)w->rows, (unsigned long long)h.n_seq, h.seq_len);
    if (!rc) {
        h.payload_xxh64 = XXH3_64bits_digest(w->hash);
        h.header_xxh64 = 0;
        h.header_xxh64 = dfm_checksum64(&h, sizeof h);
        if (fflush(w->f.fp) || fseeko(w->f.fp, 0, SEEK_SET) || fwrite(&h, sizeof h, 1, w->f.fp) != 1 ||
            fseeko(w->f.fp, 0, SEEK_END))
            rc = DFM_FAIL(DFM_EIO, "%s: writing the header failed", w->f.tmp_path);
    }
    if (!rc) rc = dfm_atomic_commit(&w->f);
    if (rc) dfm_atomic_abort(&w->f);
    XXH3_freeState(w->hash);
    free(w->buf);
    free(w);
    return rc;
}

void dfm_teacher_writer_abort(dfm_teacher_writer *w) {
    if (!w) return;
    dfm_atomic_abort(&w->f);
    if (w->hash) XXH3_freeState(w->hash);
    free(w->buf);
    free(w);
}

void dfm_teacher_row(const dfm_teacher_file *f, uint64_t i, uint32_t *ids, float *logp, dfm_teacher_row_tail *tail) {
    size_t S = f->hdr.top;
    const uint8_t *r = f->rows + i * f->hdr.row_bytes;
    if (ids) memcpy(ids, r, S * 4);
    if (logp) memcpy(logp, r + S * 4, S * 4);
    if (tail) memcpy(tail, r + S * 8, sizeof *tail);
}

static int check_header(const char *path, const dfm_teacher_header *h, uint64_t file_bytes) {
    if (memcmp(h->magic, DFM_TEACHER_MAGIC, 8))
        return DFM_FAIL(DFM_EFORMAT, "%s is not a teacher file (bad magic). HINT: write it with `dfm-train teacher`", path);
    if (h->version != DFM_TEACHER_VERSION)
        return DFM_FAIL(DFM_EVERSION, "%s: teacher-file version %u; this dfm reads version %u. HINT: write it again "
                        "with this dfm's `dfm-train teacher`", path, h->version, DFM_TEACHER_VERSION);
    if (h->header_bytes != DFM_TEACHER_HEADER_BYTES)
        return DFM_FAIL(DFM_EFORMAT, "%s: header_bytes %u, expected %u", path, h->header_bytes, DFM_TEACHER_HEADER_BYTES);
    dfm_teacher_header z = *h;
    z.header_xxh64 = 0;
    if (dfm_checksum64(&z, sizeof z) != h->header_xxh64) return DFM_FAIL(DFM_ECHECKSUM, "%s: header checksum mismatch", path);
    if (!h->top || h->top > DFM_TEACHER_MAX_TOP) return DFM_FAIL(DFM_EFORMAT, "%s: top %u outside 1..%u", path, h->top, DFM_TEACHER_MAX_TOP);
    if (!h->paste || h->paste > DFM_TEACHER_MAX_PASTE)
        return DFM_FAIL(DFM_EFORMAT, "%s: paste %u outside 1..%u", path, h->paste, DFM_TEACHER_MAX_PASTE);
    if (!h->seq_len || h->seq_len > DFM_TEACHER_MAX_SEQ || !h->chunk_len || h->seq_len % h->chunk_len)
        return DFM_FAIL(DFM_EFORMAT, "%s: seq_len %u and chunk_len %u (seq_len 1..%u, a multiple of chunk_len)", path,
                        h->seq_len, h->chunk_len, DFM_TEACHER_MAX_SEQ);
    if (!h->vocab) return DFM_FAIL(DFM_EFORMAT, "%s: vocab 0", path);
    if (h->row_bytes != dfm_teacher_row_bytes(h->top))
        return DFM_FAIL(DFM_EFORMAT, "%s: row_bytes %u, expected %u for top %u", path, h->row_bytes,
                        dfm_teacher_row_bytes(h->top), h->top);
    if (h->tokens_generation_len > sizeof h->tokens_generation)
        return DFM_FAIL(DFM_EFORMAT, "%s: tokens_generation_len %u > %zu", path, h->tokens_generation_len,
                        sizeof h->tokens_generation);
    for (size_t i = 0; i < sizeof h->reserved; i++)
        if (h->reserved[i]) return DFM_FAIL(DFM_EFORMAT, "%s: reserved header byte %zu is not zero", path, i);
    uint64_t per_seq = (uint64_t)h->seq_len * h->row_bytes;
    if (h->n_seq > (UINT64_MAX - DFM_TEACHER_HEADER_BYTES) / per_seq || h->payload_bytes != h->n_seq * per_seq)
        return DFM_FAIL(DFM_EFORMAT, "%s: payload_bytes %llu does not match %llu sequences of %u rows of %u bytes", path,
                        (unsigned long long)h->payload_bytes, (unsigned long long)h->n_seq, h->seq_len, h->row_bytes);
    if (file_bytes < DFM_TEACHER_HEADER_BYTES + h->payload_bytes)
        return DFM_FAIL(DFM_ETRUNCATED, "%s: %llu bytes, the header promises %llu", path, (unsigned long long)file_bytes,
                        (unsigned long long)(DFM_TEACHER_HEADER_BYTES + h->payload_bytes));
    if (file_bytes > DFM_TEACHER_HEADER_BYTES + h->payload_bytes)
        return DFM_FAIL(DFM_EFORMAT, "%s: %llu bytes after the payload", path,
                        (unsigned long long)(file_bytes - DFM_TEACHER_HEADER_BYTES - h->payload_bytes));
    return DFM_OK;
}

/* Every row: known flags, zero reserved, ids below vocab, log-probs finite, <= 0, non-increasing. */
static int check_rows(const char *path, const dfm_teacher_file *f) {
    const dfm_teacher_header *h = &f->hdr;
    uint64_t n = h->n_seq * h->seq_len;
    uint32_t S = h->top;
    uint32_t *ids = malloc(S * 4u);
    float *lp = malloc(S * 4u);
    if (!ids || !lp) {
        free(ids), free(lp);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    int rc = DFM_OK;
    for (uint64_t i = 0; i < n && !rc; i++) {
        dfm_teacher_row_tail t;
        dfm_teacher_row(f, i, ids, lp, &t);
        unsigned long long s = (unsigned long long)(i / h->seq_len), r = (unsigned long long)(i % h->seq_len);
        if ((t.flags & ~(uint32_t)(DFM_TEACHER_F_TARGET | DFM_TEACHER_F_TEACHER)) || t.reserved)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: sequence %llu row %llu: unknown flags 0x%x or reserved bits set", path, s, r, t.flags);
        else if ((t.flags & DFM_TEACHER_F_TEACHER) && !(t.flags & DFM_TEACHER_F_TARGET))
            rc = DFM_FAIL(DFM_EFORMAT, "%s: sequence %llu row %llu: a teacher row without a target", path, s, r);
        else if ((t.flags & DFM_TEACHER_F_TARGET) && !(isfinite(t.lp_alone) && t.lp_alone <= 0.0f))
            rc = DFM_FAIL(DFM_EFORMAT, "%s: sequence %llu row %llu: lp_alone %g is not a log-probability", path, s, r,
                          (double)t.lp_alone);
        if (rc || !(t.flags & DFM_TEACHER_F_TEACHER)) continue;
        if (!(isfinite(t.lp_teacher) && t.lp_teacher <= 0.0f))
            rc = DFM_FAIL(DFM_EFORMAT, "%s: sequence %llu row %llu: lp_teacher %g is not a log-probability", path, s, r,
                          (double)t.lp_teacher);
        for (uint32_t j = 0; j < S && !rc; j++) {
            if (ids[j] >= h->vocab)
                rc = DFM_FAIL(DFM_EFORMAT, "%s: sequence %llu row %llu: id %u at rank %u is not below vocab %u", path, s, r,
                              ids[j], j, h->vocab);
            else if (!(isfinite(lp[j]) && lp[j] <= 0.0f) || (j && !(lp[j] <= lp[j - 1])))
                rc = DFM_FAIL(DFM_EFORMAT, "%s: sequence %llu row %llu: log-prob %g at rank %u is not a log-probability "
                              "in non-increasing order", path, s, r, (double)lp[j], j);
        }
    }
    free(ids), free(lp);
    return rc;
}

static int check_any(const char *path, const void *h, uint64_t file_bytes) { return check_header(path, h, file_bytes); }

int dfm_teacher_open(const char *path, dfm_teacher_file **out) {
    *out = NULL;
    static const dfm_sealed_spec spec = {
        .hint = "HINT: write it with `dfm-train teacher --backbone DIR --data RUN --targets RUN --out FILE`",
        .damaged = "the rows are damaged", .header_bytes = DFM_TEACHER_HEADER_BYTES,
        .payload_bytes_at = offsetof(dfm_teacher_header, payload_bytes),
        .payload_xxh64_at = offsetof(dfm_teacher_header, payload_xxh64), .check = check_any};
    dfm_teacher_header h;
    const uint8_t *map = NULL;
    size_t n = 0;
    DFM_TRY(dfm_sealed_map(path, &spec, &h, &map, &n));
    dfm_teacher_file *f = calloc(1, sizeof *f);
    int rc = f ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) {
        f->hdr = h;
        f->map = map;
        f->map_bytes = n;
        f->rows = map + DFM_TEACHER_HEADER_BYTES;
        rc = check_rows(path, f);
    }
    if (rc) {
        free(f);
        dfm_unmap_file(map, n);
        return rc;
    }
    *out = f;
    return DFM_OK;
}

void dfm_teacher_close(dfm_teacher_file *f) {
    if (!f) return;
    dfm_unmap_file(f->map, f->map_bytes);
    free(f);
}
