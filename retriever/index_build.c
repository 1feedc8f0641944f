/* index_build.c — the index stage over abstract sources: train with every rank (index_train.h), add
 * each rank's vectors to its shard, write the shards, the trained empty index and the stage object. */
#include "retriever/retrieve.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "retriever/index_train.h"
#include "retriever/ivf.h"
#include "schemas/neighbor_shard.h"

#include <faiss/c_api/Index_c.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct {
    uint64_t ntotal, first_id, end_id, bytes, padding;
    char xxh128[33];
    char pad_[7];
} shard_summary;

/* 4. this rank's vectors [lo, hi) into idx with their global ids, all-padding chunks left out (counted
 * in *padding) */
static int add_vectors(const dfm_vec_source *vs, const dfm_chunk_source *cs, FaissIndex *idx, uint64_t lo, uint64_t hi,
                       uint64_t *padding, dfm_work *w) {
    dfm_ivf v; /* FAISS assigns each added vector to its list: nlist distances each */
    int rc = dfm_ivf_open(idx, &v);
    uint64_t nlist = v.nlist;
    dfm_ivf_close(&v);
    const uint64_t step = 65536;
    const uint32_t dim = vs->dim;
    float *buf = NULL;
    idx_t *gid = NULL;
    if (!rc && hi > lo) {
        size_t rows = hi - lo < step ? (size_t)(hi - lo) : step;
        buf = malloc(rows * dim * sizeof *buf);
        gid = malloc(rows * sizeof *gid);
        if (!buf || !gid) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    for (uint64_t off = lo; !rc && off < hi; off += step) {
        uint64_t nr = hi - off < step ? hi - off : step;
        rc = vs->rows(vs->ctx, off, nr, buf);
        size_t kept = 0;
        for (uint64_t i = 0; !rc && i < nr; i++) {
            if (cs->meta(cs->ctx, off + i)->n_valid == 0) {
                (*padding)++;
                continue;
            }
            if (kept != i) memmove(buf + kept * dim, buf + i * dim, sizeof(float) * dim);
            gid[kept++] = (idx_t)(off + i);
        }
        if (!rc && kept) rc = DFM_FAISS_CHECK(faiss_Index_add_with_ids(idx, (idx_t)kept, buf, gid), "adding vectors");
        w->vectors_added += kept;
        w->coarse_distances += kept * nlist;
    }
    free(buf);
    free(gid);
    return rc;
}

/* 5. rank 0: the "index" stage object from every rank's shard summary (collective; agreed) */
static int index_stage(const dfm_mpi *m, const dfm_index_opts *o, const dfm_index_plan *plan, const dfm_index_info *info,
                       uint64_t padding, double t0, uint64_t tlen, json_t *training, dfm_work *w, json_t **stage) {
    json_t *work = NULL;
    DFM_TRY(dfm_work_gather(m, w, &work));
    shard_summary me = {info->ntotal, info->first_id, info->end_id, info->bytes, padding, {0}, {0}};
    memcpy(me.xxh128, info->xxh128, 33);
    shard_summary *sum = m->rank == 0 ? calloc((size_t)m->size, sizeof *sum) : NULL;
    int rc = m->rank == 0 && !sum ? DFM_FAIL(DFM_ENOMEM, "no memory") : DFM_OK;
    if ((rc = dfm_mpi_agree(m, rc))) {
        json_decref(work);
        return rc;
    }
    rc = DFM_MPI_CHECK(MPI_Gather(&me, sizeof me, MPI_BYTE, sum, sizeof me, MPI_BYTE, 0, m->comm));
    if (!rc && m->rank == 0) {
        uint64_t vectors = 0, pads = 0, bytes = 0;
        json_t *outs = json_array();
        for (int r = 0; r < m->size; r++) {
            vectors += sum[r].ntotal;
            pads += sum[r].padding;
            bytes += sum[r].bytes;
            char f[64], sc[64];
            snprintf(f, sizeof f, "index/index-%05d.faiss", r);
            snprintf(sc, sizeof sc, "index/index-%05d.json", r);
            json_array_append_new(outs, json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:s}", "file", f, "sidecar", sc, "first_id",
                                                  (json_int_t)sum[r].first_id, "end_id", (json_int_t)sum[r].end_id, "ntotal",
                                                  (json_int_t)sum[r].ntotal, "bytes", (json_int_t)sum[r].bytes, "xxh128", sum[r].xxh128));
        }
        *stage = json_pack("{s:s, s:i, s:s, s:s, s:i, s:{s:s, s:s, s:I, s:I, s:b}, s:{s:I, s:I, s:I, s:I, s:I}, s:{s:f}, s:o}", "state",
                           "complete", "ranks", m->size, "factory", plan->factory, "metric", o->metric == DFM_METRIC_IP ? "ip" : "l2", "dim",
                           (int)info->dim, "choice", "factory", plan->factory, "why", plan->why, "nlist", (json_int_t)plan->nlist, "train_points",
                           (json_int_t)plan->train_n, "exact_scores", plan->exact_scores, "counts", "vectors", (json_int_t)vectors,
                           "padding_skipped", (json_int_t)pads, "train_points", (json_int_t)plan->train_n, "shards", (json_int_t)m->size,
                           "bytes", (json_int_t)bytes, "timings", "total_s", dfm_now() - t0, "outputs", outs);
        if (!*stage) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        else {
            json_object_set_new(*stage, "trained_xxh128", json_string(info->trained_xxh128));
            json_object_set_new(*stage, "trained", json_pack("{s:s, s:I, s:s}", "file", DFM_INDEX_TRAINED_FILE, "bytes", (json_int_t)tlen,
                                                              "xxh128", info->trained_xxh128));
            json_object_set(*stage, "training", training ? training : json_null());
            json_object_set(*stage, "work", work);
        }
    }
    json_decref(work);
    free(sum);
    return dfm_mpi_agree(m, rc);
}

/* 4. this rank's shard: the trained empty index, its vectors, written with its sidecar */
static int build_shard(const dfm_mpi *m, const dfm_index_opts *o, const dfm_vec_source *vs, const dfm_chunk_source *cs,
                       const uint8_t *tbuf, size_t tlen, dfm_index_info *info, uint64_t *padding, dfm_work *w) {
    FaissIndex *idx = NULL;
    int rc = dfm_index_from_buffer(tbuf, tlen, &idx);
    double tadd = dfm_now();
    if (!rc) rc = add_vectors(vs, cs, idx, info->first_id, info->end_id, padding, w);
    if (!rc) {
        info->ntotal = (uint64_t)faiss_Index_ntotal(idx);
        char *dir = dfm_path_join(o->run_dir, "index");
        char *path = dfm_index_path(o->run_dir, m->rank, "faiss");
        if (!dir || !path) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        if (!rc) rc = dfm_mkdir_p(dir);
        if (!rc && m->rank == 0) { /* the trained empty index, for ranks of dfm retrieve that hold no shard */
            char *tp = dfm_path_join(o->run_dir, DFM_INDEX_TRAINED_FILE);
            rc = tp ? dfm_write_file_atomic(tp, tbuf, tlen) : DFM_FAIL(DFM_ENOMEM, "no memory");
            free(tp);
        }
        if (!rc) rc = dfm_index_write(path, idx, info);
        if (!rc) DFM_LOG_I("index: shard %d holds %llu vectors of ids [%llu, %llu) (%.2fs to add), %llu bytes", m->rank,
                           (unsigned long long)info->ntotal, (unsigned long long)info->first_id, (unsigned long long)info->end_id,
                           dfm_now() - tadd, (unsigned long long)info->bytes);
        free(dir);
        free(path);
    }
    if (idx) faiss_Index_free(idx);
    return rc;
}

int dfm_index_build(const dfm_mpi *m, const dfm_index_opts *o, const dfm_vec_source *vs, const dfm_chunk_source *cs,
                    uint64_t block_chunks, json_t **stage) {
    *stage = NULL;
    DFM_TRY(dfm_check_sources(vs, cs, block_chunks));
    const uint64_t n = vs->n_rows;
    const uint32_t dim = vs->dim;
    double t0 = dfm_now();
    dfm_work w;
    dfm_work_start(&w);
    dfm_index_plan plan;
    int rc = dfm_index_plan_make(o->factory, n, dim, m->size, o->mem_budget, o->metric, o->train_sample, &plan);
    if ((rc = dfm_mpi_agree(m, rc))) return rc;
    if (m->rank == 0)
        DFM_LOG_I("index: %s — %s; %llu training points", plan.factory, plan.why, (unsigned long long)plan.train_n);
    uint64_t b0, b1;
    dfm_block_range(n, block_chunks, m->rank, m->size, &b0, &b1);
    uint64_t lo = b0 * block_chunks < n ? b0 * block_chunks : n, hi = b1 * block_chunks < n ? b1 * block_chunks : n;
    uint8_t *tbuf = NULL;
    size_t tlen = 0;
    json_t *training = NULL;
    rc = dfm_index_train(m, &plan, vs, o->seed, &tbuf, &tlen, &training, &w);
    if (rc) {
        free(tbuf);
        json_decref(training);
        return rc;
    }
    dfm_index_info info = {0};
    info.dim = dim;
    info.metric = o->metric;
    snprintf(info.factory, sizeof info.factory, "%s", plan.factory);
    info.first_id = lo;
    info.end_id = hi;
    info.shard = m->rank;
    info.n_shards = m->size;
    info.exact_scores = plan.exact_scores;
    XXH128_hash_t h = XXH3_128bits(tbuf, tlen);
    snprintf(info.trained_xxh128, sizeof info.trained_xxh128, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
    uint64_t padding = 0;
    rc = dfm_work_agree(&w, m, build_shard(m, o, vs, cs, tbuf, tlen, &info, &padding, &w));
    free(tbuf);
    if (!rc) rc = index_stage(m, o, &plan, &info, padding, t0, tlen, training, &w, stage);
    json_decref(training);
    return rc;
}
