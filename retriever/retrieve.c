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

/* 1. the training sample: every rank reads the sampled rows it owns in [lo, hi); rank 0 gathers them
 * in id order into *all (plan->train_n rows). Agreed. */
static int gather_train_sample(const dfm_mpi *m, const dfm_index_opts *o, const dfm_vec_source *vs, const dfm_index_plan *plan,
                               uint64_t lo, uint64_t hi, float **all) {
    const uint64_t n = vs->n_rows;
    const uint32_t dim = vs->dim;
    uint64_t *ids = malloc(plan->train_n * sizeof *ids);
    float *mine = NULL;
    int *cnt = NULL, *displ = NULL, rc = DFM_OK;
    MPI_Datatype vtype = MPI_DATATYPE_NULL;
    if (!ids) rc = DFM_FAIL(DFM_ENOMEM, "no memory for %llu sample ids", (unsigned long long)plan->train_n);
    if (!rc) dfm_sample_ids(n, plan->train_n, o->seed, ids);
    uint64_t a = 0, z = 0;
    while (!rc && a < plan->train_n && ids[a] < lo) a++;
    z = a;
    while (!rc && z < plan->train_n && ids[z] < hi) z++;
    int nmine = (int)(z - a);
    if (!rc && !(mine = malloc(((size_t)nmine + 1) * dim * sizeof *mine))) rc = DFM_FAIL(DFM_ENOMEM, "no memory for the training sample");
    for (int i = 0; !rc && i < nmine; i++) rc = vs->rows(vs->ctx, ids[a + (uint64_t)i], 1, mine + (size_t)i * dim);
    cnt = calloc((size_t)m->size, sizeof *cnt);
    displ = calloc((size_t)m->size, sizeof *displ);
    if (!rc && (!cnt || !displ)) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc && m->rank == 0 && !(*all = malloc(plan->train_n * dim * sizeof **all)))
        rc = DFM_FAIL(DFM_ENOMEM, "no memory for %llu training vectors. HINT: use a smaller --train-sample", (unsigned long long)plan->train_n);
    if (!(rc = dfm_mpi_agree(m, rc)) && !(rc = DFM_MPI_CHECK(MPI_Type_contiguous((int)dim, MPI_FLOAT, &vtype)))) {
        MPI_Type_commit(&vtype);
        rc = DFM_MPI_CHECK(MPI_Gather(&nmine, 1, MPI_INT, cnt, 1, MPI_INT, 0, m->comm));
        for (int r = 1; !rc && m->rank == 0 && r < m->size; r++) displ[r] = displ[r - 1] + cnt[r - 1];
        if (!rc) rc = DFM_MPI_CHECK(MPI_Gatherv(mine, nmine, vtype, *all, cnt, displ, vtype, 0, m->comm));
    }
    if (vtype != MPI_DATATYPE_NULL) MPI_Type_free(&vtype);
    free(ids);
    free(mine);
    free(cnt);
    free(displ);
    return rc;
}

/* 2-3. rank 0 creates (and trains on all) the empty index and serialises it; the bytes are broadcast,
 * so every rank starts from the same trained empty index (*tbuf, *tlen). */
static int trained_index(const dfm_mpi *m, const dfm_index_plan *plan, uint32_t dim, const float *all, uint8_t **tbuf,
                         size_t *tlen) {
    int rc = DFM_OK;
    if (m->rank == 0) {
        FaissIndex *idx = NULL;
        rc = dfm_index_create(plan, dim, &idx);
        if (!rc && plan->train_n) {
            double tt = dfm_now();
            rc = DFM_FAISS_CHECK(faiss_Index_train(idx, (idx_t)plan->train_n, all), "training the index");
            if (!rc) DFM_LOG_I("index: trained %s on %llu points in %.2fs", plan->factory, (unsigned long long)plan->train_n, dfm_now() - tt);
        }
        if (!rc) rc = dfm_index_to_buffer(idx, tbuf, tlen);
        faiss_Index_free(idx);
    }
    DFM_TRY(dfm_mpi_agree(m, rc));
    uint64_t len = *tlen;
    DFM_TRY(DFM_MPI_CHECK(MPI_Bcast(&len, 1, MPI_UINT64_T, 0, m->comm)));
    if (m->rank != 0 && !(*tbuf = malloc(len ? len : 1))) rc = DFM_FAIL(DFM_ENOMEM, "no memory for the trained index (%llu bytes)", (unsigned long long)len);
    DFM_TRY(dfm_mpi_agree(m, rc));
    for (uint64_t off = 0; off < len && !rc; off += 1u << 30) {
        uint64_t part = len - off < (1u << 30) ? len - off : (1u << 30);
        rc = DFM_MPI_CHECK(MPI_Bcast(*tbuf + off, (int)part, MPI_BYTE, 0, m->comm));
    }
    *tlen = len;
    return rc;
}

/* 4. this rank's vectors [lo, hi) into idx with their global ids, all-padding chunks left out (counted
 * in *padding) */
static int add_vectors(const dfm_vec_source *vs, const dfm_chunk_source *cs, FaissIndex *idx, uint64_t lo, uint64_t hi,
                       uint64_t *padding) {
    const uint64_t step = 65536;
    const uint32_t dim = vs->dim;
    float *buf = NULL;
    idx_t *gid = NULL;
    int rc = DFM_OK;
    if (hi > lo) {
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
    }
    free(buf);
    free(gid);
    return rc;
}

/* 5. rank 0: the "index" stage object from every rank's shard summary (collective; agreed) */
static int index_stage(const dfm_mpi *m, const dfm_index_opts *o, const dfm_index_plan *plan, const dfm_index_info *info,
                       uint64_t padding, double t0, json_t **stage) {
    shard_summary me = {info->ntotal, info->first_id, info->end_id, info->bytes, padding, {0}, {0}};
    memcpy(me.xxh128, info->xxh128, 33);
    shard_summary *sum = m->rank == 0 ? calloc((size_t)m->size, sizeof *sum) : NULL;
    int rc = m->rank == 0 && !sum ? DFM_FAIL(DFM_ENOMEM, "no memory") : DFM_OK;
    if ((rc = dfm_mpi_agree(m, rc))) return rc;
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
        else json_object_set_new(*stage, "trained_xxh128", json_string(info->trained_xxh128));
    }
    free(sum);
    return dfm_mpi_agree(m, rc);
}

/* 4. this rank's shard: the trained empty index, its vectors, written with its sidecar */
static int build_shard(const dfm_mpi *m, const dfm_index_opts *o, const dfm_vec_source *vs, const dfm_chunk_source *cs,
                       const uint8_t *tbuf, size_t tlen, dfm_index_info *info, uint64_t *padding) {
    FaissIndex *idx = NULL;
    int rc = dfm_index_from_buffer(tbuf, tlen, &idx);
    double tadd = dfm_now();
    if (!rc) rc = add_vectors(vs, cs, idx, info->first_id, info->end_id, padding);
    if (!rc) {
        info->ntotal = (uint64_t)faiss_Index_ntotal(idx);
        char *dir = dfm_path_join(o->run_dir, "index");
        char *path = dfm_index_path(o->run_dir, m->rank, "faiss");
        if (!dir || !path) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        if (!rc) rc = dfm_mkdir_p(dir);
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
    float *all = NULL;
    uint8_t *tbuf = NULL;
    size_t tlen = 0;
    if (plan.train_n) rc = gather_train_sample(m, o, vs, &plan, lo, hi, &all);
    if (!rc) rc = trained_index(m, &plan, dim, all, &tbuf, &tlen);
    free(all);
    if (rc) {
        free(tbuf);
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
    rc = dfm_mpi_agree(m, build_shard(m, o, vs, cs, tbuf, tlen, &info, &padding));
    free(tbuf);
    return rc ? rc : index_stage(m, o, &plan, &info, padding, t0, stage);
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
            uint64_t excl = 0;
            rc = dfm_count_excluded(p, &qs[q], qv + q * dim, out + q * p->k, nm, vs, cs, &excl);
            c->excluded += excl;
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

/* One retrieve stage's state. */
typedef struct {
    const dfm_mpi *m;
    const dfm_retrieve_opts *o;
    const dfm_vec_source *vs;
    const dfm_chunk_source *cs;
    json_t *index_stage, *outputs;
    uint64_t block_chunks, n, index_hash;
    uint32_t dim, k, metric;
    const char *metric_s, *factory;
    shards_t sh;
    dfm_search_params sp, sp_exact; /* the index's search; brute force */
    dfm_search_counts cnt;
    const char *tuned_name;
    double tuned_value, tuned_recall, measured_recall;
    double t0, search_s;
} retrieve_ctx;

/* The options and the index stage (its files, metric, factory) before anything is loaded. */
static int retrieve_check(retrieve_ctx *r) {
    const dfm_retrieve_opts *o = r->o;
    DFM_TRY(check_sources(r->vs, r->cs, r->block_chunks));
    if (o->k == 0 || o->k > DFM_NBR_MAX_K) return DFM_FAIL(DFM_EARG, "--k %u: K must be 1..64", o->k);
    if (o->window == 0) return DFM_FAIL(DFM_EARG, "--query-window must be at least 1");
    if (o->query_block == 0) return DFM_FAIL(DFM_EARG, "--query-block must be at least 1");
    if (o->exclude > DFM_EXCLUDE_DOCUMENT) return DFM_FAIL(DFM_EARG, "unknown exclusion policy %u", o->exclude);
    if (o->target_recall < 0 || o->target_recall > 1) return DFM_FAIL(DFM_EARG, "--target-recall %g must be in (0, 1]", o->target_recall);
    r->n = r->vs->n_rows;
    r->dim = r->vs->dim, r->k = o->k;
    r->outputs = json_object_get(r->index_stage, "outputs");
    r->metric_s = json_string_value(json_object_get(r->index_stage, "metric"));
    r->factory = json_string_value(json_object_get(r->index_stage, "factory")) ?: "?";
    if (!json_is_array(r->outputs) || !json_array_size(r->outputs) || !r->metric_s)
        return DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: the index stage lists no index files or no metric. HINT: re-run 'dfm index'", o->run_dir);
    r->metric = !strcmp(r->metric_s, "ip") ? DFM_METRIC_IP : DFM_METRIC_L2;
    if (o->metric >= 0 && (uint32_t)o->metric != r->metric)
        return DFM_FAIL(DFM_EMISMATCH, "the index of %s uses metric %s but --metric %s was asked for. HINT: drop --metric or re-run 'dfm index --metric %s'",
                        o->run_dir, r->metric_s, o->metric == DFM_METRIC_IP ? "ip" : "l2", o->metric == DFM_METRIC_IP ? "ip" : "l2");
    return DFM_OK;
}

/* An id for the index that does not depend on the number of shards: the hash of the trained empty
 * index every shard started from (older stages without it: the shards' file hashes). */
static int index_hash(retrieve_ctx *r) {
    const char *trained = json_string_value(json_object_get(r->index_stage, "trained_xxh128"));
    if (trained) {
        r->index_hash = XXH3_64bits(trained, strlen(trained));
        return DFM_OK;
    }
    XXH3_state_t *st = XXH3_createState();
    if (!st) return DFM_FAIL(DFM_ENOMEM, "no memory");
    XXH3_64bits_reset(st);
    for (size_t j = 0; j < json_array_size(r->outputs); j++) {
        const char *h = json_string_value(json_object_get(json_array_get(r->outputs, j), "xxh128")) ?: "";
        XXH3_64bits_update(st, h, strlen(h));
    }
    r->index_hash = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return DFM_OK;
}

/* 1. this rank's shards (j = rank, rank + P, ...), with their FAISS and brute-force searchers; agreed */
static int load_shards(retrieve_ctx *r) {
    const dfm_mpi *m = r->m;
    const dfm_retrieve_opts *o = r->o;
    shards_t *sh = &r->sh;
    int n_shards = (int)json_array_size(r->outputs), nmine = 0, rc = DFM_OK;
    for (int j = m->rank; j < n_shards; j += m->size) nmine++;
    sh->idx = calloc((size_t)nmine + 1, sizeof *sh->idx);
    sh->info = calloc((size_t)nmine + 1, sizeof *sh->info);
    sh->faiss_s = calloc((size_t)nmine + 1, sizeof *sh->faiss_s);
    sh->bf_s = calloc((size_t)nmine + 1, sizeof *sh->bf_s);
    sh->bf_ctx = calloc((size_t)nmine + 1, sizeof *sh->bf_ctx);
    if (!sh->idx || !sh->info || !sh->faiss_s || !sh->bf_s || !sh->bf_ctx) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    for (int j = m->rank; j < n_shards && !rc; j += m->size) {
        const char *file = json_string_value(json_object_get(json_array_get(r->outputs, (size_t)j), "file"));
        char *path = file ? dfm_path_join(o->run_dir, file) : NULL;
        if (!path) rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: index output %d has no \"file\"", o->run_dir, j);
        int i = sh->n;
        if (!rc) rc = dfm_index_load(path, r->dim, (int)r->metric, &sh->idx[i], &sh->info[i]);
        if (!rc && sh->info[i].end_id > r->n)
            rc = DFM_FAIL(DFM_EMISMATCH, "index %s holds ids up to %llu but the corpus has %llu chunks. HINT: re-run 'dfm index'", path,
                          (unsigned long long)sh->info[i].end_id, (unsigned long long)r->n);
        if (!rc) {
            sh->n++;
            sh->faiss_s[i] = (dfm_shard_searcher){dfm_faiss_search, sh->idx[i], sh->info[i].ntotal, sh->info[i].exact_scores};
            sh->bf_ctx[i] = (dfm_bf_ctx){r->vs, sh->info[i].first_id, sh->info[i].end_id - sh->info[i].first_id, r->metric};
            sh->bf_s[i] = (dfm_shard_searcher){dfm_bf_search, &sh->bf_ctx[i], sh->bf_ctx[i].n, 1};
        }
        free(path);
    }
    if (!rc && o->nprobe > 0) rc = set_param_all(sh, "nprobe", (double)o->nprobe);
    if (!rc && o->ef_search > 0) rc = set_param_all(sh, "efSearch", (double)o->ef_search);
    return dfm_mpi_agree(m, rc);
}

/* Sampled queries (on rank 0) with their brute-force top-K (exact) and room for the index's (approx). */
typedef struct {
    dfm_query *sq;
    float *sv;
    size_t snq;
    dfm_hit *ex, *ap;
    uint32_t *nex, *nap;
} recall_sample;

static void recall_sample_free(recall_sample *s) {
    free(s->sq);
    free(s->sv);
    free(s->ex);
    free(s->ap);
    free(s->nex);
    free(s->nap);
    memset(s, 0, sizeof *s);
}

/* Draw up to want queries (seeded) and search them by brute force over every shard. */
static int recall_sample_exact(retrieve_ctx *r, uint64_t want, uint64_t seed, recall_sample *s) {
    const dfm_mpi *m = r->m;
    uint32_t k = r->k;
    dfm_search_counts scratch = {0};
    int rc = sample_queries(m, r->vs, r->cs, r->o->window, want, seed, &s->sq, &s->sv, &s->snq);
    s->ex = malloc((s->snq + 1) * k * sizeof *s->ex);
    s->ap = malloc((s->snq + 1) * k * sizeof *s->ap);
    s->nex = calloc(s->snq + 1, sizeof *s->nex);
    s->nap = calloc(s->snq + 1, sizeof *s->nap);
    if (!rc && (!s->ex || !s->ap || !s->nex || !s->nap)) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = dfm_dsearch(m, r->sh.bf_s, r->sh.n, &r->sp_exact, r->vs, r->cs, s->sq, s->sv, s->snq, s->ex, s->nex, &scratch);
    return rc;
}

/* The index's search of the sample and its recall against the exact lists (the same on every rank). */
static int recall_of_index(retrieve_ctx *r, recall_sample *s, double *recall) {
    dfm_search_counts scratch = {0};
    DFM_TRY(dfm_dsearch(r->m, r->sh.faiss_s, r->sh.n, &r->sp, r->vs, r->cs, s->sq, s->sv, s->snq, s->ap, s->nap, &scratch));
    *recall = r->m->rank == 0 ? dfm_recall(s->ap, s->nap, s->ex, s->nex, s->snq, r->k) : 0;
    MPI_Bcast(recall, 1, MPI_DOUBLE, 0, r->m->comm);
    return DFM_OK;
}

/* The search parameter --target-recall tunes: nprobe of an IVF index, efSearch of an HNSW one; NULL
 * when the index has none, or when the user set it (an explicit --nprobe / --ef-search wins). */
static const char *tuned_parameter(const retrieve_ctx *r) {
    if (strstr(r->factory, "IVF")) return r->o->nprobe > 0 ? NULL : "nprobe";
    if (strstr(r->factory, "HNSW")) return r->o->ef_search > 0 ? NULL : "efSearch";
    return NULL;
}

/* 2. --target-recall (on by default): the smallest nprobe / efSearch reaching R on a held-out sample,
 * against brute force */
static int tune_recall(retrieve_ctx *r) {
    const dfm_mpi *m = r->m;
    const dfm_retrieve_opts *o = r->o;
    const char *factory = r->factory;
    recall_sample s = {0};
    r->tuned_name = tuned_parameter(r);
    if (!r->tuned_name) return DFM_OK;
    int rc = recall_sample_exact(r, o->measure_recall ? o->measure_recall : 256, o->seed + 1, &s);
    if (!rc) {
        double limit = strstr(factory, "IVF") ? 1e9 : 1 << 16, v = strstr(factory, "IVF") ? 1 : 16;
        long long nlist = json_integer_value(json_object_get(json_object_get(r->index_stage, "choice"), "nlist"));
        if (nlist > 0) limit = (double)nlist;
        for (;; v *= 2) {
            if (v > limit) v = limit;
            rc = set_param_all(&r->sh, r->tuned_name, v);
            if ((rc = dfm_mpi_agree(m, rc))) break;
            double rec;
            if ((rc = recall_of_index(r, &s, &rec))) break;
            if (m->rank == 0) DFM_LOG_I("retrieve: tuning %s=%g: recall@%u %.4f", r->tuned_name, v, r->k, rec);
            r->tuned_value = v;
            r->tuned_recall = rec;
            if (rec >= o->target_recall || v >= limit) break;
        }
        if (!rc && m->rank == 0)
            printf("retrieve: %s=%g reaches recall@%u = %.4f (target %.4f) on %zu held-out queries\n", r->tuned_name, r->tuned_value,
                   r->k, r->tuned_recall, o->target_recall, s.snq);
    }
    recall_sample_free(&s);
    return rc;
}

/* The neighbour file of one block being written, and this rank's place in its blocks. */
typedef struct {
    const char *outdir;
    uint64_t b, b1, pos; /* current block, end of this rank's blocks, next row of the current block */
    dfm_nbr_writer *w;
    dfm_query *qs;
    float *qv;
    int64_t *rowq; /* per row of the round: its query's index, or -1 (no query) */
    dfm_hit *hits;
    uint32_t *nh;
} round_state;

/* This rank's queries of the round: rows [*lo, *hi) of block rs->b (opening its file first); *bend
 * its end. None once this rank's blocks are done. */
static int round_queries(retrieve_ctx *r, round_state *rs, size_t *nq, uint64_t *lo, uint64_t *hi, uint64_t *bend) {
    uint64_t n = r->n, B = r->block_chunks;
    int rc = DFM_OK;
    *nq = 0, *lo = *hi = *bend = 0;
    if (rs->b >= rs->b1) return DFM_OK;
    uint64_t bstart = rs->b * B;
    *bend = bstart + B < n ? bstart + B : n;
    if (!rs->w) {
        char *path = dfm_strdupf("%s/nbr-%06llu.bin", rs->outdir, (unsigned long long)rs->b);
        dfm_nbr_header h = {0};
        h.k = r->k;
        h.metric = r->metric;
        h.first_chunk = bstart;
        h.n_rows = *bend - bstart;
        h.n_chunks_total = n;
        h.exclude = r->o->exclude;
        h.query_window = r->o->window;
        h.index_hash = r->index_hash;
        rc = path ? dfm_nbr_writer_open(path, &h, &rs->w) : DFM_FAIL(DFM_ENOMEM, "no memory");
        free(path);
    }
    *lo = bstart + rs->pos;
    *hi = *lo + r->o->query_block < *bend ? *lo + r->o->query_block : *bend;
    for (uint64_t i = *lo; i < *hi && !rc; i++) {
        int q = dfm_query_build(r->vs, r->cs, i, r->o->window, &rs->qs[*nq], rs->qv + *nq * r->dim);
        if (q < 0) rc = q;
        rs->rowq[i - *lo] = q == 1 ? (int64_t)(*nq)++ : -1;
    }
    return rc;
}

/* The rows [lo, hi) of the round into the block's file (closed at the block's end). */
static int round_rows(retrieve_ctx *r, round_state *rs, uint64_t lo, uint64_t hi, uint64_t bend) {
    uint32_t k = r->k;
    int64_t ids[DFM_NBR_MAX_K];
    float scores[DFM_NBR_MAX_K];
    int rc = DFM_OK;
    for (uint64_t i = lo; i < hi && !rc; i++) {
        int64_t q = rs->rowq[i - lo];
        uint64_t mask = 0;
        if (q < 0) {
            dfm_hits_to_row(NULL, 0, k, ids, scores, &mask);
            r->cnt.no_query++;
        } else {
            uint32_t pad = dfm_hits_to_row(rs->hits + (size_t)q * k, rs->nh[q], k, ids, scores, &mask);
            r->cnt.padded += pad;
            r->cnt.kept += k - pad;
        }
        rc = dfm_nbr_writer_add(rs->w, ids, scores, mask);
    }
    if (!rc && rs->w && hi == bend) {
        rc = dfm_nbr_writer_close(rs->w);
        if (!rc) dfm_fault_point("retrieve:block-written", r->m->rank);
        rs->w = NULL;
        rs->b++;
        rs->pos = 0;
    } else if (rs->w) {
        rs->pos = hi - rs->b * r->block_chunks;
    }
    return rc;
}

/* 3. the retrieval proper: every rank takes part in the same number of rounds, one query block each */
static int search_rounds(retrieve_ctx *r, round_state *rs, uint64_t rounds) {
    const dfm_mpi *m = r->m;
    uint64_t b0 = rs->b, n = r->n, B = r->block_chunks;
    uint64_t c0 = b0 * B, c1 = rs->b1 * B < n ? rs->b1 * B : n, done_chunks = 0;
    dfm_progress *prog = NULL;
    dfm_progress_begin(m, "retrieve", "chunks", c1 > c0 ? c1 - c0 : 0, &prog);
    int rc = DFM_OK;
    for (uint64_t round = 0; round < rounds && !rc; round++) {
        size_t nq = 0;
        uint64_t lo = 0, hi = 0, bend = 0;
        rc = round_queries(r, rs, &nq, &lo, &hi, &bend);
        if ((rc = dfm_mpi_agree(m, rc))) break;
        rc = dfm_dsearch(m, r->sh.faiss_s, r->sh.n, &r->sp, r->vs, r->cs, rs->qs, rs->qv, nq, rs->hits, rs->nh, &r->cnt);
        if (rc) break;
        rc = round_rows(r, rs, lo, hi, bend);
        rc = dfm_mpi_agree(m, rc);
        if (hi > lo) done_chunks += hi - lo;
        dfm_progress_update(prog, done_chunks);
    }
    dfm_progress_end(prog);
    dfm_nbr_writer_abort(rs->w);
    rs->w = NULL;
    return rc;
}

/* 3. buffers, the output folder and the number of rounds, then the rounds */
static int retrieve_blocks(retrieve_ctx *r) {
    const dfm_mpi *m = r->m;
    uint64_t n = r->n, B = r->block_chunks;
    round_state rs = {0};
    uint64_t b0, my_rounds = 0, rounds = 0;
    block_range(n, B, m->rank, m->size, &b0, &rs.b1);
    rs.b = b0;
    for (uint64_t b = b0; b < rs.b1; b++) {
        uint64_t rows = (b + 1) * B < n ? B : n - b * B;
        my_rounds += (rows + r->o->query_block - 1) / r->o->query_block;
    }
    int rc = DFM_MPI_CHECK(MPI_Allreduce(&my_rounds, &rounds, 1, MPI_UINT64_T, MPI_MAX, m->comm));
    char *outdir = dfm_path_join(r->o->run_dir, "retrieve");
    if (!outdir) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = dfm_mkdir_p(outdir);
    size_t qb = (size_t)r->o->query_block;
    rs.outdir = outdir;
    rs.qs = malloc(qb * sizeof *rs.qs);
    rs.qv = malloc(qb * r->dim * sizeof *rs.qv);
    rs.rowq = malloc(qb * sizeof *rs.rowq);
    rs.hits = malloc(qb * r->k * sizeof *rs.hits);
    rs.nh = calloc(qb, sizeof *rs.nh);
    if (!rs.qs || !rs.qv || !rs.rowq || !rs.hits || !rs.nh) rc = DFM_FAIL(DFM_ENOMEM, "no memory for a query block of %zu", qb);
    if (!(rc = dfm_mpi_agree(m, rc))) rc = search_rounds(r, &rs, rounds);
    free(outdir);
    free(rs.qs);
    free(rs.qv);
    free(rs.rowq);
    free(rs.hits);
    free(rs.nh);
    return rc;
}

/* 4. --measure-recall: the run's search against brute force on sampled queries */
static int measure_recall(retrieve_ctx *r) {
    recall_sample s = {0};
    int rc = recall_sample_exact(r, r->o->measure_recall, r->o->seed + 2, &s);
    if (!rc) rc = recall_of_index(r, &s, &r->measured_recall);
    if (!rc && r->m->rank == 0) printf("recall@%u = %.4f on %zu sampled queries (%s)\n", r->k, r->measured_recall, s.snq, r->factory);
    recall_sample_free(&s);
    return dfm_mpi_agree(r->m, rc);
}

/* 5. rank 0: the "retrieve" stage object from the counts summed over ranks (sum) */
static json_t *stage_object(retrieve_ctx *r, const uint64_t *sum, double index_s) {
    const dfm_retrieve_opts *o = r->o;
    uint64_t n = r->n, B = r->block_chunks, nb = (n + B - 1) / B, queries_issued = n - sum[6], bytes = 0;
    uint32_t k = r->k;
    json_t *outs = json_array();
    for (uint64_t b = 0; b < nb; b++) {
        uint64_t first = b * B, rows = first + B < n ? B : n - first;
        char f[64];
        snprintf(f, sizeof f, "retrieve/nbr-%06llu.bin", (unsigned long long)b);
        uint64_t by = DFM_NBR_HEADER_BYTES + rows * dfm_nbr_row_bytes(k);
        bytes += by;
        json_array_append_new(outs, json_pack("{s:s, s:I, s:I, s:I}", "file", f, "first_chunk", (json_int_t)first, "n_rows",
                                              (json_int_t)rows, "bytes", (json_int_t)by));
    }
    /* the run's counts (per query, the same on any number of ranks), then the shard-level figures */
    json_t *counts = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "queries", (json_int_t)queries_issued,
                               "no_query_rows", (json_int_t)sum[6], "candidates_fetched", (json_int_t)(queries_issued * (k + o->margin)),
                               "excluded", (json_int_t)sum[2], "items_kept", (json_int_t)sum[4], "padded_slots", (json_int_t)sum[5],
                               "bytes", (json_int_t)bytes, "shard_searches", (json_int_t)sum[0], "shard_candidates_fetched",
                               (json_int_t)sum[1], "shard_excluded", (json_int_t)sum[7], "re_searches", (json_int_t)sum[3]);
    if (r->measured_recall >= 0) json_object_set_new(counts, "recall", json_real(r->measured_recall));
    char hashbuf[20];
    snprintf(hashbuf, sizeof hashbuf, "%016llx", (unsigned long long)r->index_hash);
    json_t *st = json_pack("{s:s, s:i, s:s, s:s, s:s, s:i, s:s, s:i, s:o, s:{s:f, s:f}, s:o}", "state", "complete", "ranks", r->m->size,
                           "factory", r->factory, "metric", r->metric_s, "index_hash", hashbuf, "k", (int)k, "exclude",
                           dfm_exclude_name(o->exclude), "query_window", (int)o->window, "counts", counts, "timings", "total_s",
                           dfm_now() - r->t0, "search_s", r->search_s, "outputs", outs);
    if (st) json_object_set_new(json_object_get(st, "timings"), "index_search_s_max_rank", json_real(index_s));
    if (st && r->tuned_name && r->tuned_recall >= 0)
        json_object_set_new(st, "tuning", json_pack("{s:s, s:f, s:f, s:f}", "parameter", r->tuned_name, "value", r->tuned_value, "recall",
                                                    r->tuned_recall, "target", o->target_recall));
    if (st && r->measured_recall >= 0) json_object_set_new(st, "recall", json_pack("{s:i, s:f, s:I}", "k", (int)k, "recall@k", r->measured_recall,
                                                                                  "queries", (json_int_t)o->measure_recall));
    DFM_LOG_I("retrieve: %llu queries, %llu kept, %llu padded slots, %llu excluded; %llu shard searches fetched %llu candidates, "
              "%llu re-searches, in %.2fs", (unsigned long long)queries_issued, (unsigned long long)sum[4], (unsigned long long)sum[5],
              (unsigned long long)sum[2], (unsigned long long)sum[0], (unsigned long long)sum[1], (unsigned long long)sum[3], r->search_s);
    return st;
}

/* 5. counts over ranks; rank 0 gets the stage object */
static int retrieve_finish(retrieve_ctx *r, json_t **stage) {
    const dfm_search_counts *cnt = &r->cnt;
    uint64_t mine[8] = {cnt->shard_searches, cnt->shard_candidates, cnt->excluded, cnt->researches, cnt->kept, cnt->padded, cnt->no_query,
                        cnt->shard_excluded},
             sum[8] = {0};
    double index_s = 0;
    int rc = DFM_MPI_CHECK(MPI_Reduce(mine, sum, 8, MPI_UINT64_T, MPI_SUM, 0, r->m->comm));
    if (!rc) rc = DFM_MPI_CHECK(MPI_Reduce(&cnt->search_s, &index_s, 1, MPI_DOUBLE, MPI_MAX, 0, r->m->comm));
    if (!rc && r->m->rank == 0) {
        *stage = stage_object(r, sum, index_s);
        if (!*stage) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    return dfm_mpi_agree(r->m, rc);
}

int dfm_retrieve_run(const dfm_mpi *m, const dfm_retrieve_opts *o, const dfm_vec_source *vs, const dfm_chunk_source *cs,
                     uint64_t block_chunks, json_t *index_stage, json_t **stage) {
    *stage = NULL;
    retrieve_ctx r;
    memset(&r, 0, sizeof r);
    r.m = m, r.o = o, r.vs = vs, r.cs = cs, r.block_chunks = block_chunks, r.index_stage = index_stage;
    r.tuned_recall = r.measured_recall = -1;
    DFM_TRY(retrieve_check(&r));
    r.t0 = dfm_now();
    DFM_TRY(index_hash(&r));
    int rc = load_shards(&r);
    if (!rc) {
        if (m->rank == 0)
            DFM_LOG_I("retrieve: %llu chunks, %d index shard(s) of %s on %d rank(s), K=%u margin=%u exclude=%s window=%u",
                      (unsigned long long)r.n, (int)json_array_size(r.outputs), r.factory, m->size, r.k, o->margin,
                      dfm_exclude_name(o->exclude), o->window);
        json_t *exact_j = json_object_get(json_object_get(index_stage, "choice"), "exact_scores");
        int approx = json_is_boolean(exact_j) ? !json_is_true(exact_j) : (r.sh.n ? !r.sh.info[0].exact_scores : 0);
        r.sp = (dfm_search_params){r.k, o->margin, r.metric, o->exclude, approx};
        r.sp_exact = (dfm_search_params){r.k, o->margin, r.metric, o->exclude, 0};
        if (o->target_recall > 0) rc = tune_recall(&r);
        rc = dfm_mpi_agree(m, rc);
    }
    double tsearch = dfm_now();
    if (!rc) rc = retrieve_blocks(&r);
    r.search_s = dfm_now() - tsearch;
    if (!rc && o->measure_recall) rc = measure_recall(&r);
    if (!rc) rc = retrieve_finish(&r, stage);
    shards_free(&r.sh);
    return rc;
}
