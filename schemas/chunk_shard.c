#include "schemas/chunk_shard.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

struct dfm_chunk_writer {
    dfm_atomic_file f;
    dfm_chunk_header hdr;
    XXH3_state_t *xx;
    uint8_t *rec; /* one record's bytes */
    size_t rec_bytes;
};

static size_t record_bytes(uint32_t chunk_len) { return sizeof(dfm_chunk_meta) + 4u * (size_t)chunk_len; }

static uint64_t header_checksum(const dfm_chunk_header *h) { return XXH3_64bits(h, offsetof(dfm_chunk_header, header_checksum)); }

int dfm_chunk_writer_open(const char *path, const dfm_chunk_header *hdr, dfm_chunk_writer **out) {
    *out = NULL;
    if (hdr->chunk_len == 0 || hdr->chunk_len > 65535 || hdr->seq_len == 0 || hdr->seq_len % hdr->chunk_len)
        return DFM_FAIL(DFM_EARG, "chunk shard %s: chunk_len %u / seq_len %u invalid (seq_len must be a positive multiple of chunk_len)",
                        path, hdr->chunk_len, hdr->seq_len);
    dfm_chunk_writer *w = calloc(1, sizeof *w);
    if (!w) return DFM_FAIL(DFM_ENOMEM, "no memory");
    w->hdr = *hdr;
    memcpy(w->hdr.magic, DFM_CHUNK_MAGIC, 8);
    w->hdr.version = DFM_CHUNK_VERSION;
    w->hdr.header_bytes = DFM_CHUNK_HEADER_BYTES;
    w->hdr.token_bytes = 4;
    w->hdr.n_chunks = 0;
    memset(w->hdr.reserved, 0, sizeof w->hdr.reserved);
    w->rec_bytes = record_bytes(hdr->chunk_len);
    w->rec = calloc(1, w->rec_bytes);
    w->xx = XXH3_createState();
    if (!w->rec || !w->xx) {
        dfm_chunk_writer_abort(w);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    XXH3_64bits_reset(w->xx);
    int rc = dfm_atomic_open(&w->f, path);
    if (!rc) {
        dfm_chunk_header zero = {0};
        rc = dfm_atomic_write(&w->f, &zero, sizeof zero);
    }
    if (rc) {
        dfm_chunk_writer_abort(w);
        return rc;
    }
    *out = w;
    return DFM_OK;
}

int dfm_chunk_writer_add(dfm_chunk_writer *w, const dfm_chunk_meta *meta, const uint32_t *tokens) {
    memcpy(w->rec, meta, sizeof *meta);
    memcpy(w->rec + sizeof *meta, tokens, 4u * (size_t)w->hdr.chunk_len);
    XXH3_64bits_update(w->xx, w->rec, w->rec_bytes);
    DFM_TRY(dfm_atomic_write(&w->f, w->rec, w->rec_bytes));
    w->hdr.n_chunks++;
    return DFM_OK;
}

int dfm_chunk_writer_close(dfm_chunk_writer *w) {
    w->hdr.payload_bytes = w->hdr.n_chunks * w->rec_bytes;
    w->hdr.payload_checksum = XXH3_64bits_digest(w->xx);
    w->hdr.header_checksum = header_checksum(&w->hdr);
    int rc = DFM_OK;
    if (fseek(w->f.fp, 0, SEEK_SET) != 0) rc = DFM_FAIL(DFM_EIO, "seek in %s: %s", w->f.tmp_path, strerror(errno));
    if (!rc && fwrite(&w->hdr, sizeof w->hdr, 1, w->f.fp) != 1)
        rc = DFM_FAIL(dfm_errno_code(errno), "writing the header of %s: %s", w->f.tmp_path, strerror(errno));
    if (!rc) rc = dfm_atomic_commit(&w->f);
    else dfm_atomic_abort(&w->f);
    XXH3_freeState(w->xx);
    free(w->rec);
    free(w);
    return rc;
}

void dfm_chunk_writer_abort(dfm_chunk_writer *w) {
    if (!w) return;
    dfm_atomic_abort(&w->f);
    if (w->xx) XXH3_freeState(w->xx);
    free(w->rec);
    free(w);
}

static int validate(dfm_chunk_shard *s) {
    const char *p = s->path;
    if (s->map_bytes < DFM_CHUNK_HEADER_BYTES)
        return DFM_FAIL(DFM_ETRUNCATED, "chunk shard %s is %zu bytes, shorter than its 128-byte header", p, s->map_bytes);
    memcpy(&s->hdr, s->map, sizeof s->hdr);
    const dfm_chunk_header *h = &s->hdr;
    if (memcmp(h->magic, DFM_CHUNK_MAGIC, 8) != 0)
        return DFM_FAIL(DFM_EFORMAT, "%s is not a dfm chunk shard (bad magic)", p);
    if (h->version != DFM_CHUNK_VERSION)
        return DFM_FAIL(DFM_EVERSION, "chunk shard %s has format version %u; this dfm reads version %u", p, h->version,
                        DFM_CHUNK_VERSION);
    if (header_checksum(h) != h->header_checksum)
        return DFM_FAIL(DFM_ECHECKSUM, "chunk shard %s: header checksum mismatch (the header is damaged)", p);
    if (h->header_bytes != DFM_CHUNK_HEADER_BYTES || h->token_bytes != 4 || h->chunk_len == 0 || h->chunk_len > 65535 ||
        h->seq_len == 0 || h->seq_len % h->chunk_len)
        return DFM_FAIL(DFM_EFORMAT, "chunk shard %s: impossible sizes (header_bytes %u, token_bytes %u, L %u, S %u)", p,
                        h->header_bytes, h->token_bytes, h->chunk_len, h->seq_len);
    s->record_bytes = record_bytes(h->chunk_len);
    if (h->n_chunks > (UINT64_MAX - DFM_CHUNK_HEADER_BYTES) / s->record_bytes || h->payload_bytes != h->n_chunks * s->record_bytes)
        return DFM_FAIL(DFM_EFORMAT, "chunk shard %s: payload_bytes %llu does not match %llu chunks", p,
                        (unsigned long long)h->payload_bytes, (unsigned long long)h->n_chunks);
    if ((uint64_t)s->map_bytes < DFM_CHUNK_HEADER_BYTES + h->payload_bytes)
        return DFM_FAIL(DFM_ETRUNCATED, "chunk shard %s is truncated: %zu bytes, header says %llu", p, s->map_bytes,
                        (unsigned long long)(DFM_CHUNK_HEADER_BYTES + h->payload_bytes));
    if ((uint64_t)s->map_bytes > DFM_CHUNK_HEADER_BYTES + h->payload_bytes)
        return DFM_FAIL(DFM_EFORMAT, "chunk shard %s has %llu bytes after its last record", p,
                        (unsigned long long)(s->map_bytes - DFM_CHUNK_HEADER_BYTES - h->payload_bytes));
    if (XXH3_64bits(s->map + DFM_CHUNK_HEADER_BYTES, h->payload_bytes) != h->payload_checksum)
        return DFM_FAIL(DFM_ECHECKSUM, "chunk shard %s: payload checksum mismatch (the records are damaged)", p);
    for (uint64_t i = 0; i < h->n_chunks; i++) {
        const dfm_chunk_meta *m = dfm_chunk_shard_meta(s, i);
        if (m->n_valid > h->chunk_len || m->doc_last < m->doc_first)
            return DFM_FAIL(DFM_EFORMAT, "chunk shard %s, chunk %llu: n_valid %u > L or doc range [%llu,%llu] reversed", p,
                            (unsigned long long)(h->first_chunk + i), m->n_valid, (unsigned long long)m->doc_first,
                            (unsigned long long)m->doc_last);
        const uint32_t *t = dfm_chunk_shard_tokens(s, i);
        for (uint32_t j = 0; j < h->chunk_len; j++)
            if (t[j] >= h->vocab_size)
                return DFM_FAIL(DFM_EFORMAT, "chunk shard %s, chunk %llu, position %u: token id %u >= vocab size %llu", p,
                                (unsigned long long)(h->first_chunk + i), j, t[j], (unsigned long long)h->vocab_size);
    }
    return DFM_OK;
}

int dfm_chunk_shard_open(const char *path, dfm_chunk_shard **out) {
    *out = NULL;
    dfm_chunk_shard *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    int rc = dfm_map_file(path, NULL, &s->map, &s->map_bytes);
    if (!rc) rc = validate(s);
    if (rc) {
        dfm_chunk_shard_close(s);
        return rc;
    }
    *out = s;
    return DFM_OK;
}

void dfm_chunk_shard_close(dfm_chunk_shard *s) {
    if (!s) return;
    dfm_unmap_file(s->map, s->map_bytes);
    free(s->path);
    free(s);
}

/* ---- chunk set ---- */

void dfm_chunk_set_close(dfm_chunk_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n_shards; i++) dfm_chunk_shard_close(set->shards[i]);
    free(set->shards);
    free(set);
}

static int cmp_shard(const void *a, const void *b) {
    const dfm_chunk_shard *x = *(dfm_chunk_shard *const *)a, *y = *(dfm_chunk_shard *const *)b;
    return x->hdr.first_chunk < y->hdr.first_chunk ? -1 : x->hdr.first_chunk > y->hdr.first_chunk;
}

int dfm_chunk_set_open(const char *run_dir, dfm_chunk_set **out) {
    *out = NULL;
    json_t *m = NULL;
    DFM_TRY(dfm_manifest_load(run_dir, 0, &m));
    int rc = dfm_manifest_require_complete(m, "chunk", run_dir);
    json_t *outputs = json_object_get(dfm_manifest_stage(m, "chunk"), "outputs");
    dfm_chunk_set *set = NULL;
    if (!rc && !json_is_array(outputs))
        rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: chunk stage has no \"outputs\" list", run_dir);
    if (!rc) {
        set = calloc(1, sizeof *set);
        size_t n = json_array_size(outputs);
        if (!set || !(set->shards = calloc(n ? n : 1, sizeof *set->shards))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        for (size_t i = 0; !rc && i < n; i++) {
            const char *file = json_string_value(json_object_get(json_array_get(outputs, i), "file"));
            if (!file) {
                rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: chunk output %zu has no \"file\"", run_dir, i);
                break;
            }
            char *path = dfm_path_join(run_dir, file);
            rc = path ? dfm_chunk_shard_open(path, &set->shards[i]) : DFM_FAIL(DFM_ENOMEM, "no memory");
            free(path);
            if (!rc) set->n_shards++;
            json_t *nc = json_object_get(json_array_get(outputs, i), "n_chunks");
            if (!rc && json_is_integer(nc) && (uint64_t)json_integer_value(nc) != set->shards[i]->hdr.n_chunks)
                rc = DFM_FAIL(DFM_EMISMATCH, "%s: manifest says %lld chunks, the file holds %llu. HINT: the run directory was modified; re-run 'dfm chunk'",
                              file, (long long)json_integer_value(nc), (unsigned long long)set->shards[i]->hdr.n_chunks);
        }
    }
    if (!rc) {
        qsort(set->shards, (size_t)set->n_shards, sizeof *set->shards, cmp_shard);
        uint64_t next = 0;
        for (int i = 0; i < set->n_shards && !rc; i++) {
            const dfm_chunk_header *h = &set->shards[i]->hdr;
            if (i == 0) {
                set->chunk_len = h->chunk_len;
                set->seq_len = h->seq_len;
            } else if (h->chunk_len != set->chunk_len || h->seq_len != set->seq_len ||
                       h->tokenizer_hash != set->shards[0]->hdr.tokenizer_hash) {
                rc = DFM_FAIL(DFM_EMISMATCH, "chunk shards %s and %s disagree on L, S or tokenizer", set->shards[0]->path,
                              set->shards[i]->path);
            }
            if (h->n_chunks == 0) continue; /* a rank that owned no sequence */
            if (!rc && h->first_chunk != next)
                rc = DFM_FAIL(DFM_EFORMAT, "chunk shard %s starts at chunk %llu, expected %llu (gap or overlap)",
                              set->shards[i]->path, (unsigned long long)h->first_chunk, (unsigned long long)next);
            next = h->first_chunk + h->n_chunks;
        }
        set->n_chunks = next;
        long long nd = dfm_manifest_count(m, "chunk", "documents");
        set->n_docs = nd > 0 ? (uint64_t)nd : 0;
    }
    json_decref(m);
    if (rc) {
        dfm_chunk_set_close(set);
        return rc;
    }
    *out = set;
    return DFM_OK;
}

int dfm_chunk_set_get(const dfm_chunk_set *set, uint64_t chunk_id, const dfm_chunk_meta **meta, const uint32_t **tokens) {
    if (chunk_id >= set->n_chunks)
        return DFM_FAIL(DFM_ERANGE, "chunk id %llu out of range (the run has %llu chunks)", (unsigned long long)chunk_id,
                        (unsigned long long)set->n_chunks);
    int lo = 0, hi = set->n_shards - 1;
    while (lo < hi) { /* last shard with first_chunk <= id */
        int mid = (lo + hi + 1) / 2;
        if (set->shards[mid]->hdr.first_chunk <= chunk_id) lo = mid;
        else hi = mid - 1;
    }
    const dfm_chunk_shard *s = set->shards[lo];
    uint64_t i = chunk_id - s->hdr.first_chunk;
    if (meta) *meta = dfm_chunk_shard_meta(s, i);
    if (tokens) *tokens = dfm_chunk_shard_tokens(s, i);
    return DFM_OK;
}

int dfm_chunk_shard_check(const char *path) {
    dfm_chunk_shard *s;
    DFM_TRY(dfm_chunk_shard_open(path, &s));
    dfm_chunk_shard_close(s);
    return DFM_OK;
}
