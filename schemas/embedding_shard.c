/* embedding_shard.c — see embedding_shard.h and embedding_shard.md. */
#include "schemas/embedding_shard.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"
#include "schemas/safetensors.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

const char *dfm_emb_dtype_name(uint32_t dtype) {
    switch (dtype) {
    case DFM_EMB_F32: return "fp32";
    case DFM_EMB_F16: return "fp16";
    case DFM_EMB_BF16: return "bf16";
    default: return "?";
    }
}
size_t dfm_emb_dtype_size(uint32_t dtype) {
    switch (dtype) {
    case DFM_EMB_F32: return 4;
    case DFM_EMB_F16:
    case DFM_EMB_BF16: return 2;
    default: return 0;
    }
}
int dfm_emb_dtype_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "fp32") || !strcmp(s, "f32") || !strcmp(s, "float32")) return DFM_EMB_F32;
    if (!strcmp(s, "fp16") || !strcmp(s, "f16") || !strcmp(s, "float16") || !strcmp(s, "half")) return DFM_EMB_F16;
    if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) return DFM_EMB_BF16;
    return -1;
}

char *dfm_emb_block_name(uint64_t block) { return dfm_strdupf("encode/emb-%06llu.bin", (unsigned long long)block); }

/* ---- writing ----------------------------------------------------------------------------------- */
struct dfm_emb_writer {
    dfm_atomic_file f;
    dfm_emb_header hdr;
    XXH3_state_t *xs;
    void *buf; /* conversion buffer */
    size_t buf_rows;
};

int dfm_emb_writer_open(const char *path, const dfm_emb_header *hdr, dfm_emb_writer **out) {
    *out = NULL;
    if (hdr->dim == 0 || dfm_emb_dtype_size(hdr->dtype) == 0)
        return DFM_FAIL(DFM_EARG, "%s: embedding writer needs dim > 0 (got %u) and dtype 0..2 (got %u)", path, hdr->dim,
                        hdr->dtype);
    dfm_emb_writer *w = calloc(1, sizeof *w);
    if (!w) return DFM_FAIL(DFM_ENOMEM, "no memory for %s", path);
    memset(&w->hdr, 0, sizeof w->hdr);
    memcpy(w->hdr.magic, DFM_EMB_MAGIC, 8);
    w->hdr.version = DFM_EMB_VERSION;
    w->hdr.header_bytes = DFM_EMB_HEADER_BYTES;
    w->hdr.dim = hdr->dim;
    w->hdr.dtype = hdr->dtype;
    w->hdr.first_chunk = hdr->first_chunk;
    w->hdr.model_hash = hdr->model_hash;
    w->hdr.tokenizer_hash = hdr->tokenizer_hash;
    w->xs = XXH3_createState();
    if (!w->xs || XXH3_64bits_reset(w->xs) != XXH_OK) {
        XXH3_freeState(w->xs);
        free(w);
        return DFM_FAIL(DFM_ENOMEM, "no memory for %s", path);
    }
    int rc = dfm_atomic_open(&w->f, path);
    if (!rc) rc = dfm_atomic_write(&w->f, &w->hdr, sizeof w->hdr); /* placeholder, rewritten at close */
    if (rc) {
        dfm_atomic_abort(&w->f);
        XXH3_freeState(w->xs);
        free(w);
        return rc;
    }
    *out = w;
    return DFM_OK;
}

/* Index of the first value in x[0..cnt) that is not finite or not below lim in magnitude, or cnt. */
static size_t first_bad_value(const float *x, size_t cnt, float lim) {
    for (size_t k = 0; k < cnt; k++)
        if (!(fabsf(x[k]) < lim)) return k; /* NaN compares false */
    return cnt;
}

int dfm_emb_writer_add(dfm_emb_writer *w, const float *rows, size_t n) {
    size_t dim = w->hdr.dim, es = dfm_emb_dtype_size(w->hdr.dtype);
    /* every vector stored is finite, also after rounding to fp16 (largest finite value 65504) */
    float lim = w->hdr.dtype == DFM_EMB_F16 ? 65520.0f : INFINITY;
    size_t bad = first_bad_value(rows, n * dim, lim);
    if (bad < n * dim)
        return DFM_FAIL(DFM_EFORMAT, "%s: the embedding of chunk %llu has a non-finite value (%g at dimension %zu%s). "
                        "HINT: the encoder's weights or config.json are corrupt (NaN/Inf weights, a bad "
                        "layer_norm_eps); nothing non-finite is ever stored",
                        w->f.path, (unsigned long long)(w->hdr.first_chunk + w->hdr.n_rows + bad / dim),
                        (double)rows[bad], bad % dim, isfinite(rows[bad]) ? ", beyond fp16's range" : "");
    const void *src = rows;
    if (w->hdr.dtype != DFM_EMB_F32) {
        if (n > w->buf_rows) {
            void *nb = realloc(w->buf, n * dim * es);
            if (!nb) return DFM_FAIL(DFM_ENOMEM, "no memory converting %zu rows for %s", n, w->f.path);
            w->buf = nb;
            w->buf_rows = n;
        }
        uint16_t *o = w->buf;
        if (w->hdr.dtype == DFM_EMB_F16)
            for (size_t i = 0; i < n * dim; i++) o[i] = dfm_f32_to_f16(rows[i]);
        else
            for (size_t i = 0; i < n * dim; i++) o[i] = dfm_f32_to_bf16(rows[i]);
        src = w->buf;
    }
    size_t nb = n * dim * es;
    DFM_TRY(dfm_atomic_write(&w->f, src, nb));
    XXH3_64bits_update(w->xs, src, nb);
    w->hdr.n_rows += n;
    w->hdr.payload_bytes += nb;
    return DFM_OK;
}

static void writer_free(dfm_emb_writer *w) {
    XXH3_freeState(w->xs);
    free(w->buf);
    free(w);
}

int dfm_emb_writer_close(dfm_emb_writer *w) {
    w->hdr.payload_checksum = XXH3_64bits_digest(w->xs);
    w->hdr.header_checksum = dfm_checksum64(&w->hdr, offsetof(dfm_emb_header, header_checksum));
    int rc = DFM_OK;
    if (fseeko(w->f.fp, 0, SEEK_SET) != 0 || fwrite(&w->hdr, sizeof w->hdr, 1, w->f.fp) != 1) {
        int e = errno ? errno : EIO;
        rc = DFM_FAIL(dfm_errno_code(e), "rewriting the header of %s: %s", w->f.tmp_path, strerror(e));
    }
    if (rc) dfm_atomic_abort(&w->f);
    else rc = dfm_atomic_commit(&w->f);
    writer_free(w);
    return rc;
}

void dfm_emb_writer_abort(dfm_emb_writer *w) {
    if (!w) return;
    dfm_atomic_abort(&w->f);
    writer_free(w);
}

/* ---- reading ----------------------------------------------------------------------------------- */
static int shard_open(const char *path, int check_payload, dfm_emb_shard **out) {
    *out = NULL;
    dfm_emb_shard *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        return DFM_FAIL(DFM_ENOMEM, "no memory opening %s", path);
    }
    int rc = DFM_OK;
    rc = dfm_map_file(path, "HINT: run 'dfm encode RUN' (it resumes finished blocks)", &s->map, &s->map_bytes);
    if (rc) goto fail;
    if (s->map_bytes < DFM_EMB_HEADER_BYTES) {
        rc = DFM_FAIL(DFM_ETRUNCATED, "%s: %zu bytes, shorter than the %u-byte header. HINT: delete it and re-run "
                      "'dfm encode'", path, s->map_bytes, DFM_EMB_HEADER_BYTES);
        goto fail;
    }
    dfm_emb_header *h = &s->hdr;
    memcpy(h, s->map, sizeof *h);
    static const uint8_t zero[48];
    if (memcmp(h->magic, DFM_EMB_MAGIC, 8)) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: magic is not \"%s\"; not a dfm embedding file", path, DFM_EMB_MAGIC);
    } else if (h->version != DFM_EMB_VERSION) {
        rc = DFM_FAIL(DFM_EVERSION, "%s: format version %u, this dfm reads version %u. HINT: use the dfm that wrote "
                      "it or re-run 'dfm encode'", path, h->version, DFM_EMB_VERSION);
    } else if (h->header_bytes != DFM_EMB_HEADER_BYTES) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: header_bytes %u, expected %u", path, h->header_bytes, DFM_EMB_HEADER_BYTES);
    } else if (dfm_checksum64(h, offsetof(dfm_emb_header, header_checksum)) != h->header_checksum) {
        rc = DFM_FAIL(DFM_ECHECKSUM, "%s: header checksum mismatch. HINT: the file is corrupt; delete it and re-run "
                      "'dfm encode'", path);
    } else if (dfm_emb_dtype_size(h->dtype) == 0) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: dtype %u is not 0 (fp32), 1 (fp16) or 2 (bf16)", path, h->dtype);
    } else if (h->dim == 0) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: dim is 0", path);
    } else if (memcmp(h->reserved, zero, sizeof zero)) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: reserved header bytes are not zero", path);
    } else {
        s->row_bytes = (size_t)h->dim * dfm_emb_dtype_size(h->dtype);
        if (h->n_rows > (UINT64_MAX - DFM_EMB_HEADER_BYTES) / s->row_bytes ||
            h->payload_bytes != h->n_rows * s->row_bytes)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: payload_bytes %llu != n_rows %llu x dim %u x %zu bytes", path,
                          (unsigned long long)h->payload_bytes, (unsigned long long)h->n_rows, h->dim,
                          dfm_emb_dtype_size(h->dtype));
        else if (h->payload_bytes + DFM_EMB_HEADER_BYTES > s->map_bytes)
            rc = DFM_FAIL(DFM_ETRUNCATED, "%s: header promises %llu payload bytes but the file has %zu. HINT: the file "
                          "is truncated; delete it and re-run 'dfm encode'", path,
                          (unsigned long long)h->payload_bytes, s->map_bytes - DFM_EMB_HEADER_BYTES);
        else if (h->payload_bytes + DFM_EMB_HEADER_BYTES < s->map_bytes)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: %zu bytes of trailing garbage after the payload", path,
                          s->map_bytes - DFM_EMB_HEADER_BYTES - (size_t)h->payload_bytes);
        else if (check_payload &&
                 dfm_checksum64(s->map + DFM_EMB_HEADER_BYTES, h->payload_bytes) != h->payload_checksum)
            rc = DFM_FAIL(DFM_ECHECKSUM, "%s: payload checksum mismatch. HINT: the file is corrupt; delete it and "
                          "re-run 'dfm encode'", path);
    }
    if (rc) goto fail;
    *out = s;
    return DFM_OK;
fail:
    dfm_emb_shard_close(s);
    return rc;
}

int dfm_emb_shard_open(const char *path, dfm_emb_shard **out) { return shard_open(path, 1, out); }
int dfm_emb_shard_open_nocheck(const char *path, dfm_emb_shard **out) { return shard_open(path, 0, out); }

void dfm_emb_shard_close(dfm_emb_shard *s) {
    if (!s) return;
    dfm_unmap_file(s->map, s->map_bytes);
    free(s->path);
    free(s);
}

int dfm_emb_shard_rows_f32(const dfm_emb_shard *s, uint64_t i, uint64_t n, float *out) {
    if (i > s->hdr.n_rows || n > s->hdr.n_rows - i)
        return DFM_FAIL(DFM_ERANGE, "%s: rows [%llu, %llu) are beyond its %llu rows", s->path, (unsigned long long)i,
                        (unsigned long long)(i + n), (unsigned long long)s->hdr.n_rows);
    size_t cnt = (size_t)n * s->hdr.dim;
    const uint8_t *p = dfm_emb_shard_row(s, i);
    if (s->hdr.dtype == DFM_EMB_F32) {
        memcpy(out, p, cnt * 4);
    } else {
        for (size_t k = 0; k < cnt; k++) {
            uint16_t v = (uint16_t)(p[2 * k] | (p[2 * k + 1] << 8));
            out[k] = s->hdr.dtype == DFM_EMB_F16 ? dfm_f16_to_f32(v) : dfm_bf16_to_f32(v);
        }
    }
    size_t bad = first_bad_value(out, cnt, INFINITY);
    if (bad < cnt)
        return DFM_FAIL(DFM_EFORMAT, "%s: the embedding of chunk %llu holds a non-finite value at dimension %llu. "
                        "HINT: the block was written by a tool that does not check its vectors, or damaged; "
                        "re-run 'dfm encode --force'",
                        s->path, (unsigned long long)(s->hdr.first_chunk + i + bad / s->hdr.dim),
                        (unsigned long long)(bad % s->hdr.dim));
    return DFM_OK;
}

/* ---- the run's set ----------------------------------------------------------------------------- */
void dfm_emb_set_close(dfm_emb_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n_shards; i++) dfm_emb_shard_close(set->shards[i]);
    free(set->shards);
    free(set);
}

static int cmp_shard(const void *a, const void *b) {
    const dfm_emb_shard *x = *(dfm_emb_shard *const *)a, *y = *(dfm_emb_shard *const *)b;
    return x->hdr.first_chunk < y->hdr.first_chunk ? -1 : x->hdr.first_chunk > y->hdr.first_chunk;
}

int dfm_emb_set_open(const char *run_dir, dfm_emb_set **out) {
    *out = NULL;
    json_t *m = NULL;
    DFM_TRY(dfm_manifest_load(run_dir, 0, &m));
    dfm_emb_set *set = calloc(1, sizeof *set);
    if (!set) {
        json_decref(m);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    int rc = dfm_manifest_require_complete(m, "encode", run_dir);
    json_t *st = dfm_manifest_stage(m, "encode");
    json_t *outputs = st ? json_object_get(st, "outputs") : NULL;
    if (!rc && !json_is_array(outputs))
        rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: encode stage has no \"outputs\" list", run_dir);
    json_int_t bc = json_integer_value(json_object_get(st, "block_chunks"));
    json_int_t dim = json_integer_value(json_object_get(st, "dim"));
    int dtype = dfm_emb_dtype_parse(json_string_value(json_object_get(st, "dtype")));
    if (!rc && (bc <= 0 || dim <= 0 || dtype < 0))
        rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: encode stage needs positive \"block_chunks\", \"dim\" and a "
                      "\"dtype\" of fp32/fp16/bf16", run_dir);
    if (!rc) {
        size_t n = json_array_size(outputs);
        set->shards = calloc(n ? n : 1, sizeof *set->shards);
        if (!set->shards) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        for (size_t i = 0; i < n && !rc; i++) {
            json_t *o = json_array_get(outputs, i);
            const char *file = json_string_value(json_object_get(o, "file"));
            if (!file) {
                rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: encode output %zu has no \"file\"", run_dir, i);
                break;
            }
            char *p = dfm_path_join(run_dir, file);
            if (!p) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
            else rc = dfm_emb_shard_open(p, &set->shards[set->n_shards]);
            free(p);
            if (rc) break;
            dfm_emb_shard *s = set->shards[set->n_shards++];
            json_t *nr = json_object_get(o, "n_rows"), *fc = json_object_get(o, "first_chunk");
            if ((json_is_integer(nr) && (uint64_t)json_integer_value(nr) != s->hdr.n_rows) ||
                (json_is_integer(fc) && (uint64_t)json_integer_value(fc) != s->hdr.first_chunk))
                rc = DFM_FAIL(DFM_EMISMATCH, "%s: manifest says first_chunk %lld, n_rows %lld; the file says %llu, "
                              "%llu. HINT: the run folder was modified; re-run 'dfm encode'", s->path,
                              (long long)json_integer_value(fc), (long long)json_integer_value(nr),
                              (unsigned long long)s->hdr.first_chunk, (unsigned long long)s->hdr.n_rows);
        }
    }
    if (!rc) {
        qsort(set->shards, set->n_shards, sizeof *set->shards, cmp_shard);
        set->block_chunks = (uint64_t)bc;
        set->dim = (uint32_t)dim;
        set->dtype = (uint32_t)dtype;
        uint64_t next = 0;
        for (int i = 0; i < set->n_shards && !rc; i++) {
            const dfm_emb_shard *s = set->shards[i];
            const dfm_emb_header *h = &s->hdr;
            if (i == 0) {
                set->model_hash = h->model_hash;
                set->tokenizer_hash = h->tokenizer_hash;
            }
            if (h->first_chunk != next || h->first_chunk != (uint64_t)i * set->block_chunks)
                rc = DFM_FAIL(DFM_EFORMAT, "%s: starts at chunk %llu but block %d should start at %llu (previous file "
                              "ends at %llu). HINT: a block is missing; re-run 'dfm encode'", s->path,
                              (unsigned long long)h->first_chunk, i, (unsigned long long)((uint64_t)i * set->block_chunks),
                              (unsigned long long)next);
            else if (i + 1 < set->n_shards && h->n_rows != set->block_chunks)
                rc = DFM_FAIL(DFM_EFORMAT, "%s: %llu rows, but every block but the last holds block_chunks = %llu", s->path,
                              (unsigned long long)h->n_rows, (unsigned long long)set->block_chunks);
            else if (h->dim != set->dim || h->dtype != set->dtype)
                rc = DFM_FAIL(DFM_EMISMATCH, "%s: dim %u dtype %s, but the manifest says dim %u dtype %s", s->path, h->dim,
                              dfm_emb_dtype_name(h->dtype), set->dim, dfm_emb_dtype_name(set->dtype));
            else if (h->model_hash != set->model_hash || h->tokenizer_hash != set->tokenizer_hash)
                rc = DFM_FAIL(DFM_EMISMATCH, "%s: model or tokenizer hash differs from %s. HINT: blocks of different "
                              "runs were mixed; re-run 'dfm encode'", s->path, set->shards[0]->path);
            next = h->first_chunk + h->n_rows;
        }
        set->n_rows = next;
        long long nc = dfm_manifest_count(m, "chunk", "chunks");
        if (!rc && nc >= 0 && (uint64_t)nc != next)
            rc = DFM_FAIL(DFM_EMISMATCH, "%s: the encode blocks hold %llu rows but the chunk stage has %lld chunks. "
                          "HINT: re-run 'dfm encode' after 'dfm chunk'", run_dir, (unsigned long long)next, nc);
    }
    json_decref(m);
    if (rc) {
        dfm_emb_set_close(set);
        return rc;
    }
    *out = set;
    return DFM_OK;
}

int dfm_emb_set_rows_f32(const dfm_emb_set *set, uint64_t first_id, uint64_t n, float *out) {
    if (first_id > set->n_rows || n > set->n_rows - first_id)
        return DFM_FAIL(DFM_ERANGE, "embedding rows [%llu, %llu) are beyond the run's %llu rows",
                        (unsigned long long)first_id, (unsigned long long)(first_id + n),
                        (unsigned long long)set->n_rows);
    while (n > 0) {
        uint64_t b = first_id / set->block_chunks;
        const dfm_emb_shard *s = set->shards[b];
        uint64_t i = first_id - s->hdr.first_chunk, take = s->hdr.n_rows - i;
        if (take > n) take = n;
        DFM_TRY(dfm_emb_shard_rows_f32(s, i, take, out));
        out += take * set->dim;
        first_id += take;
        n -= take;
    }
    return DFM_OK;
}

const void *dfm_emb_set_row(const dfm_emb_set *set, uint64_t id) {
    if (id >= set->n_rows) return NULL;
    const dfm_emb_shard *s = set->shards[id / set->block_chunks];
    return dfm_emb_shard_row(s, id - s->hdr.first_chunk);
}

int dfm_emb_shard_check(const char *path) {
    dfm_emb_shard *s;
    DFM_TRY(dfm_emb_shard_open(path, &s));
    dfm_emb_shard_close(s);
    return DFM_OK;
}
