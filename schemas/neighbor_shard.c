#include "schemas/neighbor_shard.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

static uint64_t header_checksum(const dfm_nbr_header *h) { return XXH3_64bits(h, offsetof(dfm_nbr_header, header_checksum)); }

int dfm_nbr_row_check(const dfm_nbr_row *row, uint32_t metric, uint64_t id_bound) {
    uint32_t k = row->k;
    if (k == 0 || k > DFM_NBR_MAX_K) return DFM_FAIL(DFM_EFORMAT, "row of chunk %llu: K = %u outside 1..64", (unsigned long long)row->chunk_id, k);
    if (k < 64 && (row->mask >> k))
        return DFM_FAIL(DFM_EFORMAT, "row of chunk %llu: mask 0x%llx has bits at or above K = %u", (unsigned long long)row->chunk_id,
                        (unsigned long long)row->mask, k);
    int seen_empty = 0;
    for (uint32_t j = 0; j < k; j++) {
        int real = (int)((row->mask >> j) & 1u);
        int64_t id = row->ids[j];
        float s = row->scores[j];
        if (!real) {
            seen_empty = 1;
            if (id != -1 || s != 0.0f)
                return DFM_FAIL(DFM_EFORMAT, "row of chunk %llu, slot %u: empty slot holds id %lld score %g (must be -1 and 0)",
                                (unsigned long long)row->chunk_id, j, (long long)id, (double)s);
            continue;
        }
        if (seen_empty)
            return DFM_FAIL(DFM_EFORMAT, "row of chunk %llu, slot %u: a real slot after an empty one (mask 0x%llx)",
                            (unsigned long long)row->chunk_id, j, (unsigned long long)row->mask);
        if (id < 0 || (uint64_t)id >= id_bound)
            return DFM_FAIL(DFM_EFORMAT, "row of chunk %llu, slot %u: id %lld outside [0, %llu)", (unsigned long long)row->chunk_id, j,
                            (long long)id, (unsigned long long)id_bound);
        if (!isfinite(s))
            return DFM_FAIL(DFM_EFORMAT, "row of chunk %llu, slot %u: score is not finite", (unsigned long long)row->chunk_id, j);
        if (j > 0) {
            float p = row->scores[j - 1];
            int worse_first = metric == DFM_METRIC_IP ? (s > p) : (s < p);
            if (worse_first || (s == p && row->ids[j - 1] >= id))
                return DFM_FAIL(DFM_EFORMAT,
                                "row of chunk %llu, slots %u-%u: (id %lld, score %.9g) then (id %lld, score %.9g) is not in rank order",
                                (unsigned long long)row->chunk_id, j - 1, j, (long long)row->ids[j - 1], (double)p, (long long)id,
                                (double)s);
        }
    }
    return DFM_OK;
}

/* ---- writer ---- */

struct dfm_nbr_writer {
    char *path;
    dfm_nbr_header hdr;
    uint8_t *buf; /* whole payload */
    uint64_t rows_added;
};

int dfm_nbr_writer_open(const char *path, const dfm_nbr_header *hdr, dfm_nbr_writer **out) {
    *out = NULL;
    if (hdr->k == 0 || hdr->k > DFM_NBR_MAX_K)
        return DFM_FAIL(DFM_EARG, "neighbour block %s: K = %u; K must be 1..64. HINT: use --k 64 or less", path, hdr->k);
    if (hdr->metric > DFM_METRIC_L2 || hdr->exclude > DFM_EXCLUDE_DOCUMENT)
        return DFM_FAIL(DFM_EARG, "neighbour block %s: unknown metric %u or exclusion %u", path, hdr->metric, hdr->exclude);
    uint64_t rb = dfm_nbr_row_bytes(hdr->k);
    if (hdr->n_rows > (UINT64_MAX / 2) / rb) return DFM_FAIL(DFM_EARG, "neighbour block %s: %llu rows is too many", path, (unsigned long long)hdr->n_rows);
    dfm_nbr_writer *w = calloc(1, sizeof *w);
    if (!w) return DFM_FAIL(DFM_ENOMEM, "no memory");
    w->hdr = *hdr;
    memcpy(w->hdr.magic, DFM_NBR_MAGIC, 8);
    w->hdr.version = DFM_NBR_VERSION;
    w->hdr.header_bytes = DFM_NBR_HEADER_BYTES;
    w->hdr.row_bytes = rb;
    w->hdr.payload_bytes = hdr->n_rows * rb;
    memset(w->hdr.reserved, 0, sizeof w->hdr.reserved);
    w->path = strdup(path);
    w->buf = calloc(1, w->hdr.payload_bytes ? (size_t)w->hdr.payload_bytes : 1);
    if (!w->path || !w->buf) {
        dfm_nbr_writer_abort(w);
        return DFM_FAIL(DFM_ENOMEM, "no memory for neighbour block %s (%llu bytes)", path, (unsigned long long)w->hdr.payload_bytes);
    }
    *out = w;
    return DFM_OK;
}

int dfm_nbr_writer_add(dfm_nbr_writer *w, const int64_t *ids, const float *scores, uint64_t mask) {
    if (w->rows_added >= w->hdr.n_rows)
        return DFM_FAIL(DFM_EINTERNAL, "neighbour block %s: more than %llu rows added", w->path, (unsigned long long)w->hdr.n_rows);
    uint32_t k = w->hdr.k;
    dfm_nbr_row row = {w->hdr.first_chunk + w->rows_added, k, ids, scores, mask};
    if (dfm_nbr_row_check(&row, w->hdr.metric, dfm_nbr_id_bound(&w->hdr))) {
        dfm_error_prefix("writing %s", w->path);
        return DFM_FAIL(DFM_EINTERNAL, "%s", dfm_last_error());
    }
    uint8_t *p = w->buf + w->rows_added * w->hdr.row_bytes;
    memcpy(p, ids, 8u * k);
    memcpy(p + 8u * k, scores, 4u * k);
    memcpy(p + w->hdr.row_bytes - 8, &mask, 8);
    w->rows_added++;
    return DFM_OK;
}

int dfm_nbr_writer_close(dfm_nbr_writer *w) {
    int rc = DFM_OK;
    if (w->rows_added != w->hdr.n_rows)
        rc = DFM_FAIL(DFM_EINTERNAL, "neighbour block %s: %llu rows added, header promises %llu", w->path,
                      (unsigned long long)w->rows_added, (unsigned long long)w->hdr.n_rows);
    if (!rc) {
        w->hdr.payload_checksum = XXH3_64bits(w->buf, w->hdr.payload_bytes);
        w->hdr.header_checksum = header_checksum(&w->hdr);
        dfm_atomic_file f;
        rc = dfm_atomic_open(&f, w->path);
        if (!rc) rc = dfm_atomic_write(&f, &w->hdr, sizeof w->hdr);
        if (!rc) rc = dfm_atomic_write(&f, w->buf, w->hdr.payload_bytes);
        if (!rc) rc = dfm_atomic_commit(&f);
        else dfm_atomic_abort(&f);
    }
    dfm_nbr_writer_abort(w);
    return rc;
}

void dfm_nbr_writer_abort(dfm_nbr_writer *w) {
    if (!w) return;
    free(w->buf);
    free(w->path);
    free(w);
}

/* ---- reader ---- */

static int validate(dfm_nbr_block *b) {
    const char *p = b->path;
    if (b->map_bytes < DFM_NBR_HEADER_BYTES)
        return DFM_FAIL(DFM_ETRUNCATED, "neighbour block %s is %zu bytes, shorter than its 128-byte header. HINT: re-run 'dfm retrieve'",
                        p, b->map_bytes);
    memcpy(&b->hdr, b->map, sizeof b->hdr);
    const dfm_nbr_header *h = &b->hdr;
    if (memcmp(h->magic, DFM_NBR_MAGIC, 8) != 0) return DFM_FAIL(DFM_EFORMAT, "%s is not a dfm neighbour block (bad magic)", p);
    if (h->version != DFM_NBR_VERSION)
        return DFM_FAIL(DFM_EVERSION, "neighbour block %s has format version %u; this dfm reads version %u", p, h->version, DFM_NBR_VERSION);
    if (header_checksum(h) != h->header_checksum)
        return DFM_FAIL(DFM_ECHECKSUM, "neighbour block %s: header checksum mismatch (the header is damaged). HINT: re-run 'dfm retrieve'", p);
    if (h->header_bytes != DFM_NBR_HEADER_BYTES || h->k == 0 || h->k > DFM_NBR_MAX_K || h->metric > DFM_METRIC_L2 ||
        h->exclude > DFM_EXCLUDE_DOCUMENT || h->row_bytes != dfm_nbr_row_bytes(h->k))
        return DFM_FAIL(DFM_EFORMAT, "neighbour block %s: impossible header (header_bytes %u, K %u, metric %u, exclude %u, row_bytes %llu)",
                        p, h->header_bytes, h->k, h->metric, h->exclude, (unsigned long long)h->row_bytes);
    if (h->n_rows > (UINT64_MAX / 2) / h->row_bytes || h->payload_bytes != h->n_rows * h->row_bytes)
        return DFM_FAIL(DFM_EFORMAT, "neighbour block %s: payload_bytes %llu does not match %llu rows of %llu bytes", p,
                        (unsigned long long)h->payload_bytes, (unsigned long long)h->n_rows, (unsigned long long)h->row_bytes);
    if (h->first_chunk + h->n_rows > h->n_chunks_total || h->first_chunk + h->n_rows < h->first_chunk)
        return DFM_FAIL(DFM_EFORMAT, "neighbour block %s: rows [%llu, +%llu) beyond the corpus of %llu chunks", p,
                        (unsigned long long)h->first_chunk, (unsigned long long)h->n_rows, (unsigned long long)h->n_chunks_total);
    uint64_t want = DFM_NBR_HEADER_BYTES + h->payload_bytes;
    if ((uint64_t)b->map_bytes < want)
        return DFM_FAIL(DFM_ETRUNCATED, "neighbour block %s is truncated: %zu bytes, header says %llu. HINT: re-run 'dfm retrieve'", p,
                        b->map_bytes, (unsigned long long)want);
    if ((uint64_t)b->map_bytes > want)
        return DFM_FAIL(DFM_EFORMAT, "neighbour block %s has %llu bytes after its last row", p, (unsigned long long)(b->map_bytes - want));
    if (XXH3_64bits(b->map + DFM_NBR_HEADER_BYTES, h->payload_bytes) != h->payload_checksum)
        return DFM_FAIL(DFM_ECHECKSUM, "neighbour block %s: payload checksum mismatch (the rows are damaged). HINT: re-run 'dfm retrieve'", p);
    for (uint64_t i = 0; i < h->n_rows; i++) {
        dfm_nbr_row r = dfm_nbr_block_row(b, i);
        if (dfm_nbr_row_check(&r, h->metric, dfm_nbr_id_bound(h))) return dfm_error_prefix("neighbour block %s", p);
    }
    return DFM_OK;
}

int dfm_nbr_block_open(const char *path, dfm_nbr_block **out) {
    *out = NULL;
    dfm_nbr_block *b = calloc(1, sizeof *b);
    if (!b || !(b->path = strdup(path))) {
        free(b);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    int rc = dfm_map_file(path, "HINT: run 'dfm retrieve' first", &b->map, &b->map_bytes);
    if (!rc) rc = validate(b);
    if (rc) {
        dfm_nbr_block_close(b);
        return rc;
    }
    *out = b;
    return DFM_OK;
}

void dfm_nbr_block_close(dfm_nbr_block *b) {
    if (!b) return;
    dfm_unmap_file(b->map, b->map_bytes);
    free(b->path);
    free(b);
}

/* ---- set ---- */

void dfm_nbr_set_close(dfm_nbr_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n_blocks; i++) dfm_nbr_block_close(set->blocks[i]);
    free(set->blocks);
    free(set);
}

static int cmp_block(const void *a, const void *b) {
    const dfm_nbr_block *x = *(dfm_nbr_block *const *)a, *y = *(dfm_nbr_block *const *)b;
    return x->hdr.first_chunk < y->hdr.first_chunk ? -1 : x->hdr.first_chunk > y->hdr.first_chunk;
}

int dfm_nbr_set_open(const char *run_dir, dfm_nbr_set **out) {
    *out = NULL;
    json_t *m = NULL;
    DFM_TRY(dfm_manifest_load(run_dir, 0, &m));
    int rc = dfm_manifest_require_complete(m, "retrieve", run_dir);
    json_t *outputs = json_object_get(dfm_manifest_stage(m, "retrieve"), "outputs");
    dfm_nbr_set *set = NULL;
    if (!rc && !json_is_array(outputs)) rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: retrieve stage has no \"outputs\" list", run_dir);
    if (!rc) {
        size_t n = json_array_size(outputs);
        set = calloc(1, sizeof *set);
        if (!set || !(set->blocks = calloc(n ? n : 1, sizeof *set->blocks))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        for (size_t i = 0; !rc && i < n; i++) {
            json_t *o = json_array_get(outputs, i);
            const char *file = json_string_value(json_object_get(o, "file"));
            if (!file) {
                rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: retrieve output %zu has no \"file\"", run_dir, i);
                break;
            }
            char *path = dfm_path_join(run_dir, file);
            rc = path ? dfm_nbr_block_open(path, &set->blocks[i]) : DFM_FAIL(DFM_ENOMEM, "no memory");
            free(path);
            if (rc) break;
            set->n_blocks++;
            json_t *nr = json_object_get(o, "n_rows");
            if (json_is_integer(nr) && (uint64_t)json_integer_value(nr) != set->blocks[i]->hdr.n_rows)
                rc = DFM_FAIL(DFM_EMISMATCH, "%s: manifest says %lld rows, the file holds %llu. HINT: the run directory was modified; re-run 'dfm retrieve'",
                              file, (long long)json_integer_value(nr), (unsigned long long)set->blocks[i]->hdr.n_rows);
        }
    }
    if (!rc) {
        qsort(set->blocks, (size_t)set->n_blocks, sizeof *set->blocks, cmp_block);
        uint64_t next = 0;
        for (int i = 0; i < set->n_blocks && !rc; i++) {
            const dfm_nbr_header *h = &set->blocks[i]->hdr, *h0 = &set->blocks[0]->hdr;
            if (h->k != h0->k || h->metric != h0->metric || h->n_chunks_total != h0->n_chunks_total || h->n_ids != h0->n_ids ||
                h->index_hash != h0->index_hash)
                rc = DFM_FAIL(DFM_EMISMATCH, "neighbour blocks %s and %s disagree on K, metric, corpus size or index", set->blocks[0]->path,
                              set->blocks[i]->path);
            if (!rc && h->first_chunk != next)
                rc = DFM_FAIL(DFM_EFORMAT, "neighbour block %s starts at chunk %llu, expected %llu (gap or overlap)", set->blocks[i]->path,
                              (unsigned long long)h->first_chunk, (unsigned long long)next);
            next = h->first_chunk + h->n_rows;
        }
        if (!rc && set->n_blocks) {
            set->k = set->blocks[0]->hdr.k;
            set->metric = set->blocks[0]->hdr.metric;
            if (next != set->blocks[0]->hdr.n_chunks_total)
                rc = DFM_FAIL(DFM_EFORMAT, "neighbour blocks of %s cover [0, %llu) but the corpus has %llu chunks", run_dir,
                              (unsigned long long)next, (unsigned long long)set->blocks[0]->hdr.n_chunks_total);
        }
        set->n_chunks = next;
    }
    json_decref(m);
    if (rc) {
        dfm_nbr_set_close(set);
        return rc;
    }
    *out = set;
    return DFM_OK;
}

int dfm_nbr_set_get(const dfm_nbr_set *set, uint64_t chunk_id, dfm_nbr_row *row) {
    if (chunk_id >= set->n_chunks)
        return DFM_FAIL(DFM_ERANGE, "chunk id %llu out of range (the run has neighbours for %llu chunks)", (unsigned long long)chunk_id,
                        (unsigned long long)set->n_chunks);
    int lo = 0, hi = set->n_blocks - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (set->blocks[mid]->hdr.first_chunk <= chunk_id) lo = mid;
        else hi = mid - 1;
    }
    *row = dfm_nbr_block_row(set->blocks[lo], chunk_id - set->blocks[lo]->hdr.first_chunk);
    return DFM_OK;
}

int dfm_nbr_block_check(const char *path) {
    dfm_nbr_block *b;
    DFM_TRY(dfm_nbr_block_open(path, &b));
    dfm_nbr_block_close(b);
    return DFM_OK;
}
