#include "retriever/retrieve.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/progress.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "schemas/neighbor_shard.h"

#include <faiss/c_api/Index_c.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static void block_range(uint64_t n, uint64_t block_chunks, int rank, int size, uint64_t *b0, uint64_t *b1) {
    uint64_t nb = (n + block_chunks - 1) / block_chunks;
    *b0 = (uint64_t)(((unsigned __int128)nb * (unsigned)rank) / (unsigned)size);
    *b1 = (uint64_t)(((unsigned __int128)nb * (unsigned)(rank + 1)) / (unsigned)size);
}

static int check_sources(const dfm_vec_source *vs, const dfm_chunk_source *cs, uint64_t block_chunks) {
    if (vs->n_rows != cs->n_chunks)
        return DFM_FAIL(DFM_EMISMATCH, "%llu embeddings for %llu chunks. HINT: re-run 'dfm encode' on this run's chunks",
                        (unsigned long long)vs->n_rows, (unsigned long long)cs->n_chunks);
    if (!block_chunks) return DFM_FAIL(DFM_EARG, "block size 0");
    return DFM_OK;
}

/* ---- index ---- */

typedef struct {
    uint64_t ntotal, first_id, end_id, bytes, padding;
    char xxh128[33];
    char pad_[7];
} shard_summary;

int dfm_index_build(const dfm_mpi *m, const dfm_index_opts *o, const dfm_vec_source *vs, const dfm_chunk_source *cs,
                    uint64_t block_chunks, json_t **stage) {
    *stage = NULL;
    DFM_TRY(check_sources(vs, cs, block_chunks));
    const uint64_t n = vs->n_rows;
    const uint32_t dim = vs->dim;
    double t0 = dfm_now();
    dfm_index_plan plan;
    int rc = dfm_index_plan_make(o->factory, n, dim, m->size, o->mem_budget, o->metric, o->train_sample, &plan);
    if ((rc = dfm_mpi_agree(m, rc))) return rc;
    if (m->rank == 0)
        DFM_LOG_I("index: %s — %s; %llu training points", plan.factory, plan.why, (unsigned long long)plan.train_n);
    uint64_t b0, b1;
    block_range(n, block_chunks, m->rank, m->size, &b0, &b1);
    uint64_t lo = b0 * block_chunks < n ? b0 * block_chunks : n, hi = b1 * block_chunks < n ? b1 * block_chunks : n;

    /* 1. training sample: every rank reads the sampled rows it owns; rank 0 gathers them in id order */
    uint64_t *ids = NULL;
    float *mine = NULL, *all = NULL;
    uint8_t *tbuf = NULL;
    size_t tlen = 0;
    FaissIndex *idx = NULL;
    int *cnt = NULL, *displ = NULL;
    MPI_Datatype vtype = MPI_DATATYPE_NULL;
    if (!rc && plan.train_n) {
        ids = malloc(plan.train_n * sizeof *ids);
        if (!ids) rc = DFM_FAIL(DFM_ENOMEM, "no memory for %llu sample ids", (unsigned long long)plan.train_n);
        if (!rc) dfm_sample_ids(n, plan.train_n, o->seed, ids);
        uint64_t a = 0, z = 0;
        while (!rc && a < plan.train_n && ids[a] < lo) a++;
        z = a;
        while (!rc && z < plan.train_n && ids[z] < hi) z++;
        int nmine = (int)(z - a);
        if (!rc && !(mine = malloc(((size_t)nmine + 1) * dim * sizeof *mine))) rc = DFM_FAIL(DFM_ENOMEM, "no memory for the training sample");
        for (int i = 0; !rc && i < nmine; i++) rc = vs->rows(vs->ctx, ids[a + (uint64_t)i], 1, mine + (size_t)i * dim);
        cnt = calloc((size_t)m->size, sizeof *cnt);
        displ = calloc((size_t)m->size, sizeof *displ);
        if (!rc && (!cnt || !displ)) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        if (!rc && m->rank == 0 && !(all = malloc(plan.train_n * dim * sizeof *all)))
            rc = DFM_FAIL(DFM_ENOMEM, "no memory for %llu training vectors. HINT: use a smaller --train-sample", (unsigned long long)plan.train_n);
        if ((rc = dfm_mpi_agree(m, rc))) goto done;
        if ((rc = DFM_MPI_CHECK(MPI_Type_contiguous((int)dim, MPI_FLOAT, &vtype)))) goto done;
        MPI_Type_commit(&vtype);
        rc = DFM_MPI_CHECK(MPI_Gather(&nmine, 1, MPI_INT, cnt, 1, MPI_INT, 0, m->comm));
        for (int r = 1; !rc && m->rank == 0 && r < m->size; r++) displ[r] = displ[r - 1] + cnt[r - 1];
        if (!rc) rc = DFM_MPI_CHECK(MPI_Gatherv(mine, nmine, vtype, all, cnt, displ, vtype, 0, m->comm));
        if (rc) goto done;
    }
    /* 2. rank 0 creates (and trains) the empty index and serialises it */
    if (m->rank == 0) {
        rc = dfm_index_create(&plan, dim, &idx);
        if (!rc && plan.train_n) {
            double tt = dfm_now();
            rc = DFM_FAISS_CHECK(faiss_Index_train(idx, (idx_t)plan.train_n, all), "training the index");
            if (!rc) DFM_LOG_I("index: trained %s on %llu points in %.2fs", plan.factory, (unsigned long long)plan.train_n, dfm_now() - tt);
        }
        if (!rc) rc = dfm_index_to_buffer(idx, &tbuf, &tlen);
        faiss_Index_free(idx);
        idx = NULL;
    }
    if ((rc = dfm_mpi_agree(m, rc))) goto done;
    /* 3. broadcast the trained empty index; every rank starts from the same bytes */
    {
        uint64_t len = tlen;
        if ((rc = DFM_MPI_CHECK(MPI_Bcast(&len, 1, MPI_UINT64_T, 0, m->comm)))) goto done;
        if (m->rank != 0 && !(tbuf = malloc(len ? len : 1))) rc = DFM_FAIL(DFM_ENOMEM, "no memory for the trained index (%llu bytes)", (unsigned long long)len);
        if ((rc = dfm_mpi_agree(m, rc))) goto done;
        for (uint64_t off = 0; off < len && !rc; off += 1u << 30) {
            uint64_t part = len - off < (1u << 30) ? len - off : (1u << 30);
            rc = DFM_MPI_CHECK(MPI_Bcast(tbuf + off, (int)part, MPI_BYTE, 0, m->comm));
        }
        tlen = len;
        if (rc) goto done;
    }
    rc = dfm_index_from_buffer(tbuf, tlen, &idx);
    dfm_index_info info = {0};
    info.dim = dim;
    info.metric = o->metric;
    snprintf(info.factory, sizeof info.factory, "%s", plan.factory);
    info.first_id = lo;
    info.end_id = hi;
    info.shard = m->rank;
    info.n_shards = m->size;
    info.exact_scores = plan.exact_scores;
    {
        XXH128_hash_t h = XXH3_128bits(tbuf, tlen);
        snprintf(info.trained_xxh128, sizeof info.trained_xxh128, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
    }
    /* 4. add this rank's vectors with their global ids, all-padding chunks left out */
    uint64_t padding = 0;
    double tadd = dfm_now();
    {
        const uint64_t step = 65536;
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
                    padding++;
                    continue;
                }
                if (kept != i) memmove(buf + kept * dim, buf + i * dim, sizeof(float) * dim);
                gid[kept++] = (idx_t)(off + i);
            }
            if (!rc && kept) rc = DFM_FAISS_CHECK(faiss_Index_add_with_ids(idx, (idx_t)kept, buf, gid), "adding vectors");
        }
        free(buf);
        free(gid);
    }
    if (!rc) {
        info.ntotal = (uint64_t)faiss_Index_ntotal(idx);
        char *dir = dfm_path_join(o->run_dir, "index");
        char *path = dfm_index_path(o->run_dir, m->rank, "faiss");
        if (!dir || !path) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        if (!rc) rc = dfm_mkdir_p(dir);
        if (!rc) rc = dfm_index_write(path, idx, &info);
        if (!rc) DFM_LOG_I("index: shard %d holds %llu vectors of ids [%llu, %llu) (%.2fs to add), %llu bytes", m->rank,
                           (unsigned long long)info.ntotal, (unsigned long long)lo, (unsigned long long)hi, dfm_now() - tadd,
                           (unsigned long long)info.bytes);
        free(dir);
        free(path);
    }
    if ((rc = dfm_mpi_agree(m, rc))) goto done;
    /* 5. rank 0 describes the stage */
    {
        shard_summary me = {info.ntotal, lo, hi, info.bytes, padding, {0}, {0}};
        memcpy(me.xxh128, info.xxh128, 33);
        shard_summary *sum = m->rank == 0 ? calloc((size_t)m->size, sizeof *sum) : NULL;
        if (m->rank == 0 && !sum) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        if ((rc = dfm_mpi_agree(m, rc))) goto done;
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
                               "complete", "ranks", m->size, "factory", plan.factory, "metric", o->metric == DFM_METRIC_IP ? "ip" : "l2", "dim",
                               (int)dim, "choice", "factory", plan.factory, "why", plan.why, "nlist", (json_int_t)plan.nlist, "train_points",
                               (json_int_t)plan.train_n, "exact_scores", plan.exact_scores, "counts", "vectors", (json_int_t)vectors,
                               "padding_skipped", (json_int_t)pads, "train_points", (json_int_t)plan.train_n, "shards", (json_int_t)m->size,
                               "bytes", (json_int_t)bytes, "timings", "total_s", dfm_now() - t0, "outputs", outs);
            if (!*stage) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
            else json_object_set_new(*stage, "trained_xxh128", json_string(info.trained_xxh128));
        }
        free(sum);
    }
    rc = dfm_mpi_agree(m, rc);
done:
    if (vtype != MPI_DATATYPE_NULL) MPI_Type_free(&vtype);
    if (idx) faiss_Index_free(idx);
    free(ids);
    free(mine);
    free(all);
    free(tbuf);
    free(cnt);
    free(displ);
    return rc;
}

/* ---- distributed search ---- */

int dfm_dsearch(const dfm_mpi *m, const dfm_shard_searcher *searchers, int n_searchers, const dfm_search_params *p,
                const dfm_vec_source *vs, const dfm_chunk_source *cs, const dfm_query *qs, const float *qv, size_t nq, dfm_hit *out,
                uint32_t *n_out, dfm_search_counts *c) {
    const int P = m->size;
    const uint32_t k = dfm_search_cap(p), dim = vs->dim; /* k: hits per list while merging */
    if (nq > INT_MAX / 2) return DFM_FAIL(DFM_EARG, "query block of %zu is too large", nq);
    int mynq = (int)nq, *cnt = calloc((size_t)P, sizeof *cnt), *displ = calloc((size_t)P, sizeof *displ);
    int *rcnt = calloc((size_t)P, sizeof *rcnt), *rdispl = calloc((size_t)P, sizeof *rdispl);
    dfm_query *allq = NULL;
    float *allv = NULL;
    dfm_hit *loc = NULL, *tmp = NULL, *recv = NULL, *mbuf = NULL;
    uint32_t *nloc = NULL, *ntmp = NULL, *nrecv = NULL;
    MPI_Datatype qtype = MPI_DATATYPE_NULL, vtype = MPI_DATATYPE_NULL, htype = MPI_DATATYPE_NULL;
    int rc = (cnt && displ && rcnt && rdispl) ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if ((rc = dfm_mpi_agree(m, rc))) goto done;
    if ((rc = DFM_MPI_CHECK(MPI_Allgather(&mynq, 1, MPI_INT, cnt, 1, MPI_INT, m->comm)))) goto done;
    size_t total = 0;
    for (int r = 0; r < P; r++) {
        displ[r] = (int)total;
        total += (size_t)cnt[r];
    }
    if (total > INT_MAX) {
        rc = DFM_FAIL(DFM_EARG, "%zu queries in one round. HINT: use a smaller --query-block", total);
        goto done;
    }
    allq = malloc((total + 1) * sizeof *allq);
    allv = malloc((total + 1) * dim * sizeof *allv);
    loc = malloc((total + 1) * k * sizeof *loc);
    tmp = malloc((total + 1) * k * sizeof *tmp);
    nloc = calloc(total + 1, sizeof *nloc);
    ntmp = calloc(total + 1, sizeof *ntmp);
    recv = malloc(((size_t)P * nq + 1) * k * sizeof *recv);
    nrecv = calloc((size_t)P * nq + 1, sizeof *nrecv);
    mbuf = malloc((size_t)k * sizeof *mbuf);
    if (!mbuf || !allq || !allv || !loc || !tmp || !nloc || !ntmp || !recv || !nrecv) rc = DFM_FAIL(DFM_ENOMEM, "no memory for %zu queries", total);
    if ((rc = dfm_mpi_agree(m, rc))) goto done;
    MPI_Type_contiguous((int)sizeof(dfm_query), MPI_BYTE, &qtype);
    MPI_Type_commit(&qtype);
    MPI_Type_contiguous((int)dim, MPI_FLOAT, &vtype);
    MPI_Type_commit(&vtype);
    MPI_Type_contiguous((int)(k * sizeof(dfm_hit)), MPI_BYTE, &htype);
    MPI_Type_commit(&htype);
    rc = DFM_MPI_CHECK(MPI_Allgatherv(qs, mynq, qtype, allq, cnt, displ, qtype, m->comm));
    if (!rc) rc = DFM_MPI_CHECK(MPI_Allgatherv(qv, mynq, vtype, allv, cnt, displ, vtype, m->comm));
    if (rc) goto done;
    /* every query against each local shard; merge the shards' lists */
    for (int s = 0; s < n_searchers && !rc; s++) {
        rc = dfm_shard_topk(&searchers[s], p, allq, allv, total, vs, cs, s == 0 ? loc : tmp, s == 0 ? nloc : ntmp, c);
        for (size_t q = 0; s > 0 && !rc && q < total; q++) {
            const dfm_hit *lists[2] = {loc + q * k, tmp + q * k};
            size_t lens[2] = {nloc[q], ntmp[q]};
            nloc[q] = (uint32_t)dfm_hits_merge(lists, lens, 2, k, p->metric, mbuf);
            memcpy(loc + q * k, mbuf, nloc[q] * sizeof *mbuf);
        }
    }
    if ((rc = dfm_mpi_agree(m, rc))) goto done;
    /* each owner gets every rank's lists for its queries */
    for (int r = 0; r < P; r++) {
        rcnt[r] = mynq;
        rdispl[r] = r * mynq;
    }
    rc = DFM_MPI_CHECK(MPI_Alltoallv(loc, cnt, displ, htype, recv, rcnt, rdispl, htype, m->comm));
    if (!rc) rc = DFM_MPI_CHECK(MPI_Alltoallv(nloc, cnt, displ, MPI_UINT32_T, nrecv, rcnt, rdispl, MPI_UINT32_T, m->comm));
    if (rc) goto done;
    {
        const dfm_hit *lists_stack[64], **lists = P <= 64 ? lists_stack : malloc((size_t)P * sizeof *lists);
        size_t lens_stack[64], *lens = P <= 64 ? lens_stack : malloc((size_t)P * sizeof *lens);
        if (!lists || !lens) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        for (size_t q = 0; !rc && q < nq; q++) {
            for (int r = 0; r < P; r++) {
                lists[r] = recv + ((size_t)r * nq + q) * k;
                lens[r] = nrecv[(size_t)r * nq + q];
            }
            dfm_hit *merged = mbuf, *dst = p->approx ? merged : out + q * p->k;
            uint32_t nm = (uint32_t)dfm_hits_merge(lists, lens, P, k, p->metric, dst);
            if (p->approx) { /* re-rank the global best k + margin by exact score, keep k */
                for (uint32_t j = 0; j < nm; j++) merged[j].score = merged[j].aux;
                dfm_hits_sort(merged, nm, p->metric);
                if (nm > p->k) nm = p->k;
                memcpy(out + q * p->k, merged, nm * sizeof *merged);
            }
            n_out[q] = nm;
        }
        if (lists != lists_stack) free(lists);
        if (lens != lens_stack) free(lens);
    }
done:
    if (qtype != MPI_DATATYPE_NULL) MPI_Type_free(&qtype);
    if (vtype != MPI_DATATYPE_NULL) MPI_Type_free(&vtype);
    if (htype != MPI_DATATYPE_NULL) MPI_Type_free(&htype);
    free(cnt);
    free(displ);
    free(rcnt);
    free(rdispl);
    free(allq);
    free(allv);
    free(loc);
    free(tmp);
    free(nloc);
    free(ntmp);
    free(recv);
    free(nrecv);
    free(mbuf);
    return rc;
}

double dfm_recall(const dfm_hit *approx, const uint32_t *na, const dfm_hit *exact, const uint32_t *ne, size_t nq, uint32_t k) {
    uint64_t hit = 0, tot = 0;
    for (size_t q = 0; q < nq; q++) {
        tot += ne[q];
        for (uint32_t i = 0; i < ne[q]; i++)
            for (uint32_t j = 0; j < na[q]; j++)
                if (approx[q * k + j].id == exact[q * k + i].id) {
                    hit++;
                    break;
                }
    }
    return tot ? (double)hit / (double)tot : 1.0;
}

/* ---- retrieve ---- */

typedef struct {
    FaissIndex **idx;
    dfm_index_info *info;
    dfm_shard_searcher *faiss_s, *bf_s;
    dfm_bf_ctx *bf_ctx;
    int n;
} shards_t;

static void shards_free(shards_t *s) {
    for (int i = 0; i < s->n; i++)
        if (s->idx[i]) faiss_Index_free(s->idx[i]);
    free(s->idx);
    free(s->info);
    free(s->faiss_s);
    free(s->bf_s);
    free(s->bf_ctx);
}

/* rank 0 samples up to want queries (seeded); the others get none */
static int sample_queries(const dfm_mpi *m, const dfm_vec_source *vs, const dfm_chunk_source *cs, uint32_t window, uint64_t want,
                          uint64_t seed, dfm_query **qs, float **qv, size_t *nq) {
    *qs = NULL;
    *qv = NULL;
    *nq = 0;
    if (m->rank != 0 || !want) return DFM_OK;
    uint64_t n = cs->n_chunks, draw = want * 4 < n ? want * 4 : n;
    uint64_t *ids = malloc((draw + 1) * sizeof *ids);
    *qs = malloc((want + 1) * sizeof **qs);
    *qv = malloc((want + 1) * vs->dim * sizeof **qv);
    if (!ids || !*qs || !*qv) {
        free(ids);
        return DFM_FAIL(DFM_ENOMEM, "no memory for %llu sample queries", (unsigned long long)want);
    }
    dfm_sample_ids(n, draw, seed ^ 0x5eed5eedull, ids);
    int rc = DFM_OK;
    for (uint64_t i = 0; i < draw && *nq < want && !rc; i++) {
        int r = dfm_query_build(vs, cs, ids[i], window, &(*qs)[*nq], *qv + *nq * vs->dim);
        if (r < 0) rc = r;
        else if (r == 1) (*nq)++;
    }
    free(ids);
    return rc;
}

static int set_param_all(shards_t *sh, const char *name, double v) {
    for (int i = 0; i < sh->n; i++) DFM_TRY(dfm_index_set_param(sh->idx[i], name, v));
    return DFM_OK;
}

int dfm_retrieve_run(const dfm_mpi *m, const dfm_retrieve_opts *o, const dfm_vec_source *vs, const dfm_chunk_source *cs,
                     uint64_t block_chunks, json_t *index_stage, json_t **stage) {
    *stage = NULL;
    DFM_TRY(check_sources(vs, cs, block_chunks));
    if (o->k == 0 || o->k > DFM_NBR_MAX_K) return DFM_FAIL(DFM_EARG, "--k %u: K must be 1..64", o->k);
    if (o->window == 0) return DFM_FAIL(DFM_EARG, "--query-window must be at least 1");
    if (o->query_block == 0) return DFM_FAIL(DFM_EARG, "--query-block must be at least 1");
    if (o->exclude > DFM_EXCLUDE_DOCUMENT) return DFM_FAIL(DFM_EARG, "unknown exclusion policy %u", o->exclude);
    if (o->target_recall < 0 || o->target_recall > 1) return DFM_FAIL(DFM_EARG, "--target-recall %g must be in (0, 1]", o->target_recall);
    const uint64_t n = vs->n_rows;
    const uint32_t dim = vs->dim, k = o->k;
    double t0 = dfm_now();
    json_t *outputs = json_object_get(index_stage, "outputs");
    const char *metric_s = json_string_value(json_object_get(index_stage, "metric"));
    const char *factory = json_string_value(json_object_get(index_stage, "factory")) ?: "?";
    if (!json_is_array(outputs) || !json_array_size(outputs) || !metric_s)
        return DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: the index stage lists no index files or no metric. HINT: re-run 'dfm index'", o->run_dir);
    uint32_t metric = !strcmp(metric_s, "ip") ? DFM_METRIC_IP : DFM_METRIC_L2;
    if (o->metric >= 0 && (uint32_t)o->metric != metric)
        return DFM_FAIL(DFM_EMISMATCH, "the index of %s uses metric %s but --metric %s was asked for. HINT: drop --metric or re-run 'dfm index --metric %s'",
                        o->run_dir, metric_s, o->metric == DFM_METRIC_IP ? "ip" : "l2", o->metric == DFM_METRIC_IP ? "ip" : "l2");
    int n_shards = (int)json_array_size(outputs);
    /* an id for the index that does not depend on the number of shards: the hash of the trained empty
     * index every shard started from (older stages without it: the shards' file hashes) */
    uint64_t index_hash;
    const char *trained = json_string_value(json_object_get(index_stage, "trained_xxh128"));
    if (trained) {
        index_hash = XXH3_64bits(trained, strlen(trained));
    } else {
        XXH3_state_t *st = XXH3_createState();
        if (!st) return DFM_FAIL(DFM_ENOMEM, "no memory");
        XXH3_64bits_reset(st);
        for (int j = 0; j < n_shards; j++) {
            const char *h = json_string_value(json_object_get(json_array_get(outputs, (size_t)j), "xxh128")) ?: "";
            XXH3_64bits_update(st, h, strlen(h));
        }
        index_hash = XXH3_64bits_digest(st);
        XXH3_freeState(st);
    }
    /* 1. load this rank's shards (j = rank, rank + P, ...) */
    shards_t sh = {0};
    int rc = DFM_OK;
    int nmine = 0;
    for (int j = m->rank; j < n_shards; j += m->size) nmine++;
    sh.idx = calloc((size_t)nmine + 1, sizeof *sh.idx);
    sh.info = calloc((size_t)nmine + 1, sizeof *sh.info);
    sh.faiss_s = calloc((size_t)nmine + 1, sizeof *sh.faiss_s);
    sh.bf_s = calloc((size_t)nmine + 1, sizeof *sh.bf_s);
    sh.bf_ctx = calloc((size_t)nmine + 1, sizeof *sh.bf_ctx);
    if (!sh.idx || !sh.info || !sh.faiss_s || !sh.bf_s || !sh.bf_ctx) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    for (int j = m->rank; j < n_shards && !rc; j += m->size) {
        const char *file = json_string_value(json_object_get(json_array_get(outputs, (size_t)j), "file"));
        char *path = file ? dfm_path_join(o->run_dir, file) : NULL;
        if (!path) rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: index output %d has no \"file\"", o->run_dir, j);
        int i = sh.n;
        if (!rc) rc = dfm_index_load(path, dim, (int)metric, &sh.idx[i], &sh.info[i]);
        if (!rc && sh.info[i].end_id > n)
            rc = DFM_FAIL(DFM_EMISMATCH, "index %s holds ids up to %llu but the corpus has %llu chunks. HINT: re-run 'dfm index'", path,
                          (unsigned long long)sh.info[i].end_id, (unsigned long long)n);
        if (!rc) {
            sh.n++;
            sh.faiss_s[i] = (dfm_shard_searcher){dfm_faiss_search, sh.idx[i], sh.info[i].ntotal, sh.info[i].exact_scores};
            sh.bf_ctx[i] = (dfm_bf_ctx){vs, sh.info[i].first_id, sh.info[i].end_id - sh.info[i].first_id, metric};
            sh.bf_s[i] = (dfm_shard_searcher){dfm_bf_search, &sh.bf_ctx[i], sh.bf_ctx[i].n, 1};
        }
        free(path);
    }
    if (!rc && o->nprobe > 0) rc = set_param_all(&sh, "nprobe", (double)o->nprobe);
    if (!rc && o->ef_search > 0) rc = set_param_all(&sh, "efSearch", (double)o->ef_search);
    if ((rc = dfm_mpi_agree(m, rc))) {
        shards_free(&sh);
        return rc;
    }
    if (m->rank == 0)
        DFM_LOG_I("retrieve: %llu chunks, %d index shard(s) of %s on %d rank(s), K=%u margin=%u exclude=%s window=%u", (unsigned long long)n,
                  n_shards, factory, m->size, k, o->margin, dfm_exclude_name(o->exclude), o->window);
    json_t *exact_j = json_object_get(json_object_get(index_stage, "choice"), "exact_scores");
    int approx = json_is_boolean(exact_j) ? !json_is_true(exact_j) : (sh.n ? !sh.info[0].exact_scores : 0);
    dfm_search_params sp = {k, o->margin, metric, o->exclude, approx};
    dfm_search_params sp_exact = {k, o->margin, metric, o->exclude, 0}; /* brute force */
    dfm_search_counts cnt = {0}, scratch = {0};
    double tuned_recall = -1, measured_recall = -1;
    const char *tuned_name = NULL;
    double tuned_value = 0;
    dfm_query *sq = NULL;
    float *sv = NULL;
    size_t snq = 0;
    dfm_hit *ex = NULL, *ap = NULL;
    uint32_t *nex = NULL, *nap = NULL;
    /* 2. --target-recall: smallest nprobe / efSearch reaching R on a held-out sample, against brute force */
    if (o->target_recall > 0) {
        tuned_name = strstr(factory, "IVF") ? "nprobe" : strstr(factory, "HNSW") ? "efSearch" : NULL;
        uint64_t want = o->measure_recall ? o->measure_recall : 256;
        rc = sample_queries(m, vs, cs, o->window, want, o->seed + 1, &sq, &sv, &snq);
        ex = malloc((snq + 1) * k * sizeof *ex);
        ap = malloc((snq + 1) * k * sizeof *ap);
        nex = calloc(snq + 1, sizeof *nex);
        nap = calloc(snq + 1, sizeof *nap);
        if (!rc && (!ex || !ap || !nex || !nap)) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        if (!rc) rc = dfm_mpi_agree(m, rc);
        if (!rc) rc = dfm_dsearch(m, sh.bf_s, sh.n, &sp_exact, vs, cs, sq, sv, snq, ex, nex, &scratch);
        if (!rc && !tuned_name) {
            if (m->rank == 0) DFM_LOG_W("retrieve: --target-recall has nothing to tune for %s (no nprobe or efSearch)", factory);
        } else if (!rc) {
            double limit = strstr(factory, "IVF") ? 1e9 : 1 << 16, v = strstr(factory, "IVF") ? 1 : 16;
            json_t *lists = json_object_get(index_stage, "choice");
            long long nlist = json_integer_value(json_object_get(lists, "nlist"));
            if (nlist > 0) limit = (double)nlist;
            for (;; v *= 2) {
                if (v > limit) v = limit;
                rc = set_param_all(&sh, tuned_name, v);
                if ((rc = dfm_mpi_agree(m, rc))) break;
                rc = dfm_dsearch(m, sh.faiss_s, sh.n, &sp, vs, cs, sq, sv, snq, ap, nap, &scratch);
                if (rc) break;
                double r = m->rank == 0 ? dfm_recall(ap, nap, ex, nex, snq, k) : 0;
                MPI_Bcast(&r, 1, MPI_DOUBLE, 0, m->comm);
                if (m->rank == 0) DFM_LOG_I("retrieve: tuning %s=%g: recall@%u %.4f", tuned_name, v, k, r);
                tuned_value = v;
                tuned_recall = r;
                if (r >= o->target_recall || v >= limit) break;
            }
            if (!rc && m->rank == 0)
                DFM_LOG_I("retrieve: %s=%g reaches recall@%u %.4f (target %.4f) on %zu held-out queries", tuned_name, tuned_value, k, tuned_recall,
                          o->target_recall, snq);
        }
        free(sq);
        free(sv);
        free(ex);
        free(ap);
        free(nex);
        free(nap);
        sq = NULL;
        sv = NULL;
        ex = ap = NULL;
        nex = nap = NULL;
    }
    if ((rc = dfm_mpi_agree(m, rc))) {
        shards_free(&sh);
        return rc;
    }
    /* 3. the retrieval proper, round by round */
    double tsearch = dfm_now();
    uint64_t b0, b1, nb = (n + block_chunks - 1) / block_chunks;
    block_range(n, block_chunks, m->rank, m->size, &b0, &b1);
    uint64_t my_rounds = 0, rounds = 0;
    for (uint64_t b = b0; b < b1; b++) {
        uint64_t rows = (b + 1) * block_chunks < n ? block_chunks : n - b * block_chunks;
        my_rounds += (rows + o->query_block - 1) / o->query_block;
    }
    rc = DFM_MPI_CHECK(MPI_Allreduce(&my_rounds, &rounds, 1, MPI_UINT64_T, MPI_MAX, m->comm));
    char *outdir = dfm_path_join(o->run_dir, "retrieve");
    if (!outdir) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = dfm_mkdir_p(outdir);
    size_t qb = (size_t)o->query_block;
    dfm_query *qs = malloc(qb * sizeof *qs);
    float *qv = malloc(qb * dim * sizeof *qv);
    int64_t *rowq = malloc(qb * sizeof *rowq);
    dfm_hit *hits = malloc(qb * k * sizeof *hits);
    uint32_t *nh = calloc(qb, sizeof *nh);
    if (!qs || !qv || !rowq || !hits || !nh) rc = DFM_FAIL(DFM_ENOMEM, "no memory for a query block of %zu", qb);
    if ((rc = dfm_mpi_agree(m, rc))) goto out;
    {
        uint64_t b = b0, pos = 0;
        dfm_nbr_writer *w = NULL;
        int64_t ids[DFM_NBR_MAX_K];
        float scores[DFM_NBR_MAX_K];
        uint64_t c0 = b0 * block_chunks, c1 = b1 * block_chunks < n ? b1 * block_chunks : n, done_chunks = 0;
        dfm_progress *prog = NULL;
        dfm_progress_begin(m, "retrieve", "chunks", c1 > c0 ? c1 - c0 : 0, &prog);
        for (uint64_t round = 0; round < rounds && !rc; round++) {
            size_t nq = 0;
            uint64_t lo = 0, hi = 0, bend = 0;
            if (b < b1) {
                uint64_t bstart = b * block_chunks;
                bend = bstart + block_chunks < n ? bstart + block_chunks : n;
                if (!w) {
                    char *path = dfm_strdupf("%s/nbr-%06llu.bin", outdir, (unsigned long long)b);
                    dfm_nbr_header h = {0};
                    h.k = k;
                    h.metric = metric;
                    h.first_chunk = bstart;
                    h.n_rows = bend - bstart;
                    h.n_chunks_total = n;
                    h.exclude = o->exclude;
                    h.query_window = o->window;
                    h.index_hash = index_hash;
                    rc = path ? dfm_nbr_writer_open(path, &h, &w) : DFM_FAIL(DFM_ENOMEM, "no memory");
                    free(path);
                }
                lo = bstart + pos;
                hi = lo + qb < bend ? lo + qb : bend;
                for (uint64_t i = lo; i < hi && !rc; i++) {
                    int r = dfm_query_build(vs, cs, i, o->window, &qs[nq], qv + nq * dim);
                    if (r < 0) rc = r;
                    rowq[i - lo] = r == 1 ? (int64_t)nq++ : -1;
                }
            }
            if ((rc = dfm_mpi_agree(m, rc))) break;
            rc = dfm_dsearch(m, sh.faiss_s, sh.n, &sp, vs, cs, qs, qv, nq, hits, nh, &cnt);
            if (rc) break;
            for (uint64_t i = lo; i < hi && !rc; i++) {
                int64_t q = rowq[i - lo];
                uint64_t mask = 0;
                if (q < 0) {
                    dfm_hits_to_row(NULL, 0, k, ids, scores, &mask);
                    cnt.no_query++;
                } else {
                    uint32_t pad = dfm_hits_to_row(hits + (size_t)q * k, nh[q], k, ids, scores, &mask);
                    cnt.padded += pad;
                    cnt.kept += k - pad;
                }
                rc = dfm_nbr_writer_add(w, ids, scores, mask);
            }
            if (!rc && w && hi == bend) {
                rc = dfm_nbr_writer_close(w);
                if (!rc) dfm_fault_point("retrieve:block-written", m->rank);
                w = NULL;
                b++;
                pos = 0;
            } else if (w) {
                pos = hi - b * block_chunks;
            }
            rc = dfm_mpi_agree(m, rc);
            if (hi > lo) done_chunks += hi - lo;
            dfm_progress_update(prog, done_chunks);
        }
        dfm_progress_end(prog);
        dfm_nbr_writer_abort(w);
    }
    if (rc) goto out;
    double search_s = dfm_now() - tsearch;
    /* 4. --measure-recall: the run's search against brute force on sampled queries */
    if (o->measure_recall) {
        rc = sample_queries(m, vs, cs, o->window, o->measure_recall, o->seed + 2, &sq, &sv, &snq);
        ex = malloc((snq + 1) * k * sizeof *ex);
        ap = malloc((snq + 1) * k * sizeof *ap);
        nex = calloc(snq + 1, sizeof *nex);
        nap = calloc(snq + 1, sizeof *nap);
        if (!rc && (!ex || !ap || !nex || !nap)) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        if (!rc) rc = dfm_mpi_agree(m, rc);
        if (!rc) rc = dfm_dsearch(m, sh.bf_s, sh.n, &sp_exact, vs, cs, sq, sv, snq, ex, nex, &scratch);
        if (!rc) rc = dfm_dsearch(m, sh.faiss_s, sh.n, &sp, vs, cs, sq, sv, snq, ap, nap, &scratch);
        if (!rc) {
            measured_recall = m->rank == 0 ? dfm_recall(ap, nap, ex, nex, snq, k) : 0;
            MPI_Bcast(&measured_recall, 1, MPI_DOUBLE, 0, m->comm);
            if (m->rank == 0) printf("recall@%u = %.4f on %zu sampled queries (%s)\n", k, measured_recall, snq, factory);
        }
        free(sq);
        free(sv);
        free(ex);
        free(ap);
        free(nex);
        free(nap);
        if ((rc = dfm_mpi_agree(m, rc))) goto out;
    }
    /* 5. counts and the stage object */
    {
        uint64_t mine[7] = {cnt.queries, cnt.candidates, cnt.excluded, cnt.researches, cnt.kept, cnt.padded, cnt.no_query}, sum[7] = {0};
        double index_s = 0;
        rc = DFM_MPI_CHECK(MPI_Reduce(mine, sum, 7, MPI_UINT64_T, MPI_SUM, 0, m->comm));
        if (!rc) rc = DFM_MPI_CHECK(MPI_Reduce(&cnt.search_s, &index_s, 1, MPI_DOUBLE, MPI_MAX, 0, m->comm));
        if (!rc && m->rank == 0) {
            uint64_t queries_issued = n - sum[6];
            json_t *outs = json_array();
            uint64_t bytes = 0;
            for (uint64_t b = 0; b < nb; b++) {
                uint64_t first = b * block_chunks, rows = first + block_chunks < n ? block_chunks : n - first;
                char f[64];
                snprintf(f, sizeof f, "retrieve/nbr-%06llu.bin", (unsigned long long)b);
                uint64_t by = DFM_NBR_HEADER_BYTES + rows * dfm_nbr_row_bytes(k);
                bytes += by;
                json_array_append_new(outs, json_pack("{s:s, s:I, s:I, s:I}", "file", f, "first_chunk", (json_int_t)first, "n_rows",
                                                      (json_int_t)rows, "bytes", (json_int_t)by));
            }
            json_t *counts = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "queries", (json_int_t)queries_issued, "no_query_rows",
                                       (json_int_t)sum[6], "shard_searches", (json_int_t)sum[0], "candidates_fetched", (json_int_t)sum[1],
                                       "excluded", (json_int_t)sum[2], "re_searches", (json_int_t)sum[3], "items_kept", (json_int_t)sum[4],
                                       "padded_slots", (json_int_t)sum[5], "bytes", (json_int_t)bytes);
            if (measured_recall >= 0) json_object_set_new(counts, "recall", json_real(measured_recall));
            char hashbuf[20];
            snprintf(hashbuf, sizeof hashbuf, "%016llx", (unsigned long long)index_hash);
            json_t *st = json_pack("{s:s, s:i, s:s, s:s, s:s, s:i, s:s, s:i, s:o, s:{s:f, s:f}, s:o}", "state", "complete", "ranks", m->size,
                                   "factory", factory, "metric", metric_s, "index_hash", hashbuf, "k", (int)k, "exclude",
                                   dfm_exclude_name(o->exclude), "query_window", (int)o->window, "counts", counts, "timings", "total_s",
                                   dfm_now() - t0, "search_s", search_s, "outputs", outs);
            if (st) json_object_set_new(json_object_get(st, "timings"), "index_search_s_max_rank", json_real(index_s));
            if (st && tuned_name && tuned_recall >= 0)
                json_object_set_new(st, "tuning", json_pack("{s:s, s:f, s:f, s:f}", "parameter", tuned_name, "value", tuned_value, "recall",
                                                            tuned_recall, "target", o->target_recall));
            if (st && measured_recall >= 0) json_object_set_new(st, "recall", json_pack("{s:i, s:f, s:I}", "k", (int)k, "recall@k", measured_recall,
                                                                                       "queries", (json_int_t)o->measure_recall));
            if (!st) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
            *stage = st;
            DFM_LOG_I("retrieve: %llu queries, %llu candidates fetched, %llu kept, %llu padded slots, %llu excluded, %llu re-searches in %.2fs",
                      (unsigned long long)queries_issued, (unsigned long long)sum[1], (unsigned long long)sum[4], (unsigned long long)sum[5],
                      (unsigned long long)sum[2], (unsigned long long)sum[3], search_s);
        }
        rc = dfm_mpi_agree(m, rc);
    }
out:
    free(outdir);
    free(qs);
    free(qv);
    free(rowq);
    free(hits);
    free(nh);
    shards_free(&sh);
    return rc;
}
