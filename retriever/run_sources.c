/* run_sources.c — a run directory's embeddings and chunks as sources (see run_sources.h). */
#include "retriever/run_sources.h"

#include "common/error.h"

#include <string.h>

static int emb_rows(void *ctx, uint64_t first, uint64_t n, float *out) { return dfm_emb_set_rows_f32(ctx, first, n, out); }

static const float *emb_row(void *ctx, uint64_t id) {
    const dfm_emb_set *e = ctx;
    return e->dtype == DFM_EMB_F32 ? (const float *)dfm_emb_set_row(e, id) : NULL;
}

static const dfm_chunk_meta *chunk_meta(void *ctx, uint64_t id) {
    const dfm_chunk_meta *m = NULL;
    if (dfm_chunk_set_get(ctx, id, &m, NULL)) {
        static const dfm_chunk_meta none = {0}; /* callers check ids first; never reached */
        return &none;
    }
    return m;
}

int dfm_run_sources_open(const char *run, dfm_run_sources *s) {
    memset(s, 0, sizeof *s);
    DFM_TRY(dfm_chunk_set_open(run, &s->chunks));
    int rc = dfm_emb_set_open(run, &s->emb);
    if (rc) return rc;
    if (s->emb->n_rows != s->chunks->n_chunks)
        return DFM_FAIL(DFM_EMISMATCH, "run %s has %llu embeddings for %llu chunks. HINT: re-run 'dfm encode'", run,
                        (unsigned long long)s->emb->n_rows, (unsigned long long)s->chunks->n_chunks);
    s->vs = (dfm_vec_source){s->emb->dim, s->emb->n_rows, emb_rows, s->emb, emb_row};
    s->cs = (dfm_chunk_source){s->chunks->n_chunks, s->chunks->chunk_len ? s->chunks->seq_len / s->chunks->chunk_len : 0, chunk_meta,
                               s->chunks};
    return DFM_OK;
}

void dfm_run_sources_close(dfm_run_sources *s) {
    dfm_emb_set_close(s->emb);
    dfm_chunk_set_close(s->chunks);
    memset(s, 0, sizeof *s);
}

/* --metric (the tables allow ip and l2); -1 when unset */
