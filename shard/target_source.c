/* target_source.c — neighbour blocks + owned embedding blocks as a dfm_target_source. The embedding rows are
 * the run's own, or, for a query-only run (retrieved from another run with `dfm retrieve --datastore`), the
 * datastore run's, which its retrieve stage names. */
#include "shard/target_source.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"
#include "schemas/chunk_shard.h"
#include "schemas/embedding_shard.h"
#include "schemas/neighbor_shard.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    char *path;
    uint64_t first, n;
    dfm_nbr_block *blk; /* opened (and fully validated) on first use */
} nbr_ref;

struct dfm_target_real {
    nbr_ref *nbr;       /* the retrieve stage's blocks, sorted by first chunk, tiling [0, N) */
    size_t n_nbr;
    uint64_t n_chunks;
    dfm_emb_shard **emb; /* this rank's blocks */
    uint64_t first_block, n_blocks, block_chunks;
    uint32_t d, k;
    uint64_t seq_chunks;
    char *rows_dir;       /* the run whose chunks the neighbour ids index (this run, or its datastore run) */
    uint64_t n_rows;      /* its chunks */
    dfm_chunk_set *rows_chunks; /* its chunk shards, opened on the first continuation question */
};

/* The block holding query q, opened on first use: a rank reads only the neighbour blocks of the
 * shards it writes, not the whole retrieve stage. */
static int nbr_block(dfm_target_real *r, uint64_t q, const dfm_nbr_block **out) {
    size_t lo = 0, hi = r->n_nbr;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (r->nbr[mid].first <= q) lo = mid;
        else hi = mid;
    }
    nbr_ref *b = &r->nbr[lo];
    if (q < b->first || q >= b->first + b->n) return DFM_FAIL(DFM_ERANGE, "no neighbour block holds chunk %llu", (unsigned long long)q);
    if (!b->blk) {
        DFM_TRY(dfm_nbr_block_open(b->path, &b->blk));
        const dfm_nbr_header *h = &b->blk->hdr;
        if (h->first_chunk != b->first || h->n_rows != b->n || h->n_chunks_total != r->n_chunks || h->k != r->k)
            return DFM_FAIL(DFM_EMISMATCH, "%s: first chunk %llu, %llu rows, %llu chunks, K %u; the manifest says %llu, %llu, %llu, K %u. "
                            "HINT: the run folder was modified; re-run 'dfm retrieve'", b->path, (unsigned long long)h->first_chunk,
                            (unsigned long long)h->n_rows, (unsigned long long)h->n_chunks_total, h->k, (unsigned long long)b->first,
                            (unsigned long long)b->n, (unsigned long long)r->n_chunks, r->k);
    }
    *out = b->blk;
    return DFM_OK;
}

static int real_neighbors(void *ctx, uint64_t first, uint64_t n, int64_t *ids, float *scores, uint64_t *mask, uint8_t *seq) {
    dfm_target_real *r = ctx;
    for (uint64_t i = 0; i < n; i++) {
        const dfm_nbr_block *blk;
        DFM_TRY(nbr_block(r, first + i, &blk));
        dfm_nbr_row row = dfm_nbr_block_row(blk, first + i - blk->hdr.first_chunk);
        memcpy(ids + i * r->k, row.ids, sizeof(int64_t) * r->k);
        memcpy(scores + i * r->k, row.scores, sizeof(float) * r->k);
        mask[i] = row.mask;
        seq[i] = r->seq_chunks && (first + i) % r->seq_chunks == 0;
    }
    return DFM_OK;
}

static int real_rows(void *ctx, const uint64_t *ids, size_t n, float *out) {
    dfm_target_real *r = ctx;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = ids[i] / r->block_chunks;
        if (b < r->first_block || b >= r->first_block + r->n_blocks)
            return DFM_FAIL(DFM_EINTERNAL, "row %llu is not in this rank's embedding blocks", (unsigned long long)ids[i]);
        const dfm_emb_shard *s = r->emb[b - r->first_block];
        DFM_TRY(dfm_emb_shard_rows_f32(s, ids[i] - s->hdr.first_chunk, 1, out + i * r->d));
    }
    return DFM_OK;
}

/* Row id + 1 continues row id when it exists, is not all padding, and starts inside the document row id
 * ends in (doc_first(id + 1) == doc_last(id)): the text runs on from one into the other. Training
 * sequences do not matter (they cut the same stream); a document end inside row id, or exactly at its
 * end (its EOS is the last valid token), does. Spec: schemas/target_record.md, "What the slots hold". */
static int real_continues(void *ctx, uint64_t id, int *yes) {
    dfm_target_real *r = ctx;
    *yes = 0;
    if (!r->rows_chunks) {
        DFM_TRY(dfm_chunk_set_open(r->rows_dir, &r->rows_chunks));
        if (r->rows_chunks->n_chunks != r->n_rows)
            return DFM_FAIL(DFM_EMISMATCH, "%s: %llu chunks in its chunk shards, %llu embedding rows. HINT: re-run its stages with --force",
                            r->rows_dir, (unsigned long long)r->rows_chunks->n_chunks, (unsigned long long)r->n_rows);
    }
    if (id + 1 >= r->n_rows) return DFM_OK;
    const dfm_chunk_meta *a, *b;
    const uint32_t *tok;
    DFM_TRY(dfm_chunk_set_get(r->rows_chunks, id, &a, &tok));
    DFM_TRY(dfm_chunk_set_get(r->rows_chunks, id + 1, &b, &tok));
    *yes = a->n_valid > 0 && b->n_valid > 0 && b->doc_first == a->doc_last;
    return DFM_OK;
}

void dfm_target_real_close(dfm_target_real *r) {
    if (!r) return;
    dfm_chunk_set_close(r->rows_chunks);
    free(r->rows_dir);
    for (size_t i = 0; r->nbr && i < r->n_nbr; i++) {
        dfm_nbr_block_close(r->nbr[i].blk);
        free(r->nbr[i].path);
    }
    free(r->nbr);
    for (uint64_t i = 0; r->emb && i < r->n_blocks; i++) dfm_emb_shard_close(r->emb[i]);
    free(r->emb);
    free(r);
}

int dfm_target_real_open(const dfm_mpi *m, const char *run_dir, dfm_target_real **out, dfm_target_source *src) {
    *out = NULL;
    json_t *man = NULL;
    DFM_TRY(dfm_manifest_load(run_dir, 0, &man));
    int rc = dfm_manifest_require_complete(man, "chunk", run_dir);
    if (!rc) rc = dfm_manifest_require_complete(man, "encode", run_dir);
    if (!rc) rc = dfm_manifest_require_complete(man, "retrieve", run_dir);
    dfm_target_real *r = calloc(1, sizeof *r);
    if (!rc && !r) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    long long n_chunks = dfm_manifest_count(man, "chunk", "chunks");
    json_t *ccfg = json_object_get(dfm_manifest_stage(man, "chunk"), "config");
    json_int_t L = json_integer_value(json_object_get(ccfg, "chunk-len")), S = json_integer_value(json_object_get(ccfg, "seq-len"));
    json_t *enc = dfm_manifest_stage(man, "encode");
    json_int_t bc = json_integer_value(json_object_get(enc, "block_chunks"));
    json_int_t dim = json_integer_value(json_object_get(enc, "dim"));
    if (!rc && (n_chunks <= 0 || L <= 0 || S <= 0 || S % L || bc <= 0 || dim <= 0))
        rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: need chunk counts.chunks, config chunk-len/seq-len and encode block_chunks/dim", run_dir);
    /* the neighbour blocks listed by the retrieve stage; K from the first one */
    json_t *outs = json_object_get(dfm_manifest_stage(man, "retrieve"), "outputs");
    if (!rc && (!json_is_array(outs) || !json_array_size(outs)))
        rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: retrieve stage has no \"outputs\" list", run_dir);
    if (!rc) {
        r->n_chunks = (uint64_t)n_chunks;
        r->n_nbr = json_array_size(outs);
        r->nbr = calloc(r->n_nbr, sizeof *r->nbr);
        if (!r->nbr) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    for (size_t i = 0; !rc && i < r->n_nbr; i++) {
        json_t *o = json_array_get(outs, i);
        const char *file = json_string_value(json_object_get(o, "file"));
        json_t *fc = json_object_get(o, "first_chunk"), *nr = json_object_get(o, "n_rows");
        if (!file || !json_is_integer(fc) || !json_is_integer(nr) || json_integer_value(fc) < 0 || json_integer_value(nr) < 0)
            rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: retrieve output %zu needs \"file\", \"first_chunk\", \"n_rows\"", run_dir, i);
        else if (!(r->nbr[i].path = dfm_path_join(run_dir, file)))
            rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        else {
            r->nbr[i].first = (uint64_t)json_integer_value(fc);
            r->nbr[i].n = (uint64_t)json_integer_value(nr);
        }
    }
    for (size_t i = 1; !rc && i < r->n_nbr; i++) /* insertion sort by first chunk (few blocks) */
        for (size_t j = i; j > 0 && r->nbr[j].first < r->nbr[j - 1].first; j--) {
            nbr_ref t = r->nbr[j];
            r->nbr[j] = r->nbr[j - 1];
            r->nbr[j - 1] = t;
        }
    for (size_t i = 0, at = 0; !rc && i < r->n_nbr; at += r->nbr[i].n, i++)
        if (r->nbr[i].first != at)
            rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: neighbour blocks do not tile the chunk ids (block %s starts at %llu, expected %llu). "
                          "HINT: re-run 'dfm retrieve'", run_dir, r->nbr[i].path, (unsigned long long)r->nbr[i].first, (unsigned long long)at);
    if (!rc && r->nbr[r->n_nbr - 1].first + r->nbr[r->n_nbr - 1].n != (uint64_t)n_chunks)
        rc = DFM_FAIL(DFM_EMISMATCH, "%s: the neighbour blocks hold %llu query rows, the chunk stage %lld chunks. HINT: re-run 'dfm retrieve'",
                      run_dir, (unsigned long long)(r->nbr[r->n_nbr - 1].first + r->nbr[r->n_nbr - 1].n), n_chunks);
    if (!rc) {
        rc = dfm_nbr_block_open(r->nbr[0].path, &r->nbr[0].blk);
        if (!rc) r->k = r->nbr[0].blk->hdr.k;
        const dfm_nbr_block *b0;
        if (!rc) rc = nbr_block(r, 0, &b0); /* checks block 0 against the manifest */
    }
    /* the embedding rows the neighbour ids index: this run's, or its datastore run's (a query-only run,
     * retrieved with --datastore: the retrieve stage names that run) */
    json_t *ds = json_object_get(dfm_manifest_stage(man, "retrieve"), "datastore");
    const char *rows_dir = run_dir;
    json_t *dman = NULL;
    long long n_rows = n_chunks;
    if (!rc && ds) {
        rows_dir = json_string_value(json_object_get(ds, "run"));
        if (!rows_dir) rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: the retrieve stage's \"datastore\" names no run", run_dir);
        if (!rc) rc = dfm_manifest_load(rows_dir, 0, &dman);
        if (!rc) rc = dfm_manifest_require_complete(dman, "encode", rows_dir);
        if (!rc) {
            json_t *denc = dfm_manifest_stage(dman, "encode");
            n_rows = dfm_manifest_count(dman, "chunk", "chunks");
            if (json_integer_value(json_object_get(denc, "dim")) != dim || n_rows <= 0 ||
                n_rows != json_integer_value(json_object_get(ds, "chunks")))
                rc = DFM_FAIL(DFM_EMISMATCH, "%s: its datastore run %s holds %lld chunks of dim %lld; the retrieve stage recorded "
                              "%lld chunks of dim %lld. HINT: the datastore changed after 'dfm retrieve'; re-run it with --force",
                              run_dir, rows_dir, n_rows, (long long)json_integer_value(json_object_get(denc, "dim")),
                              (long long)json_integer_value(json_object_get(ds, "chunks")), (long long)dim);
            bc = json_integer_value(json_object_get(denc, "block_chunks"));
        }
    }
    if (!rc) {
        r->rows_dir = strdup(rows_dir);
        r->n_rows = (uint64_t)n_rows;
        if (!r->rows_dir) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    if (!rc) {
        r->d = (uint32_t)dim;
        r->block_chunks = (uint64_t)bc;
        r->seq_chunks = (uint64_t)(S / L);
        uint64_t nb = ((uint64_t)n_rows + r->block_chunks - 1) / r->block_chunks;
        r->first_block = nb * (uint64_t)m->rank / (uint64_t)m->size;
        r->n_blocks = nb * (uint64_t)(m->rank + 1) / (uint64_t)m->size - r->first_block;
        r->emb = calloc(r->n_blocks ? r->n_blocks : 1, sizeof *r->emb);
        if (!r->emb) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        for (uint64_t i = 0; !rc && i < r->n_blocks; i++) {
            char *name = dfm_emb_block_name(r->first_block + i);
            char *p = name ? dfm_path_join(rows_dir, name) : NULL;
            rc = p ? dfm_emb_shard_open(p, &r->emb[i]) : DFM_FAIL(DFM_ENOMEM, "no memory");
            if (!rc && (r->emb[i]->hdr.dim != r->d || r->emb[i]->hdr.first_chunk != (r->first_block + i) * r->block_chunks))
                rc = DFM_FAIL(DFM_EFORMAT, "%s: dim %u / first chunk %llu disagree with the encode stage", p, r->emb[i]->hdr.dim,
                              (unsigned long long)r->emb[i]->hdr.first_chunk);
            free(name);
            free(p);
        }
    }
    json_decref(dman);
    json_decref(man);
    if (rc) {
        dfm_target_real_close(r);
        return rc;
    }
    memset(src, 0, sizeof *src);
    src->ctx = r;
    src->n_chunks = (uint64_t)n_chunks;
    src->n_rows = ds ? (uint64_t)n_rows : 0; /* 0: the run's own rows */
    src->k = r->k;
    src->d = r->d;
    src->own_first = r->first_block * r->block_chunks;
    uint64_t end = (r->first_block + r->n_blocks) * r->block_chunks;
    if (end > (uint64_t)n_rows) end = (uint64_t)n_rows;
    src->own_count = r->n_blocks ? end - src->own_first : 0;
    if (!r->n_blocks) src->own_first = end > 0 ? (r->first_block * r->block_chunks < (uint64_t)n_rows ? r->first_block * r->block_chunks : (uint64_t)n_rows) : 0;
    src->neighbors = real_neighbors;
    src->rows = real_rows;
    src->continues = real_continues;
    *out = r;
    return DFM_OK;
}
