#include "retriever/retrieve.h"

#include "common/error.h"
#include "common/stop.h"
#include "common/fault.h"
#include "common/progress.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "schemas/neighbor_shard.h"

#include <faiss/c_api/IndexFlat_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/MetaIndexes_c.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

void dfm_block_range(uint64_t n, uint64_t block_chunks, int rank, int size, uint64_t *b0, uint64_t *b1) {
    uint64_t nb = (n + block_chunks - 1) / block_chunks;
    *b0 = (uint64_t)(((unsigned __int128)nb * (unsigned)rank) / (unsigned)size);
    *b1 = (uint64_t)(((unsigned __int128)nb * (unsigned)(rank + 1)) / (unsigned)size);
}

int dfm_check_sources(const dfm_vec_source *vs, const dfm_chunk_source *cs, uint64_t block_chunks) {
    if (vs->n_rows != cs->n_chunks)
        return DFM_FAIL(DFM_EMISMATCH, "%llu embeddings for %llu chunks. HINT: re-run 'dfm encode' on this run's chunks",
                        (unsigned long long)vs->n_rows, (unsigned long long)cs->n_chunks);
    if (!block_chunks) return DFM_FAIL(DFM_EARG, "block size 0");
    return DFM_OK;
}

/* ---- distributed search ---- */

/* one allgatherv of this rank's nq rows of `width` elements of type t (bytes each) into all */
static int allgather_rows(const dfm_mpi *m, const void *mine, int nq, MPI_Datatype t, int width, size_t bytes, void *all, const int *cnt,
                          const int *displ, dfm_work *w) {
    MPI_Datatype row = MPI_DATATYPE_NULL;
    int rc = DFM_MPI_CHECK(MPI_Type_contiguous(width, t, &row));
    if (rc) return rc;
    MPI_Type_commit(&row);
    rc = DFM_WORK_MPI(w, MPI_Allgatherv(mine, nq, row, all, cnt, displ, row, m->comm));
    MPI_Type_free(&row);
    if (w) w->bytes_sent += (uint64_t)nq * (uint64_t)width * bytes * (uint64_t)(m->size - 1);
    return rc;
}

/* one alltoallv of rows of `width` elements of type t: rows sidx[...] of mine, scnt[r] of them to rank r */
static int alltoall_rows(const dfm_mpi *m, const void *mine, const uint32_t *sidx, size_t ns, MPI_Datatype t, int width, size_t bytes,
                         const int *scnt, const int *sd, void *all, const int *rcnt, const int *rd, dfm_work *w) {
    size_t rb = (size_t)width * bytes;
    uint8_t *pack = malloc(ns * rb + 1);
    int rc = pack ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory for %zu queries to send", ns);
    if ((rc = dfm_work_agree(w, m, rc))) { /* every rank reaches the exchange, or none */
        free(pack);
        return rc;
    }
    for (size_t i = 0; i < ns; i++) memcpy(pack + i * rb, (const uint8_t *)mine + (size_t)sidx[i] * rb, rb);
    MPI_Datatype row = MPI_DATATYPE_NULL;
    rc = DFM_MPI_CHECK(MPI_Type_contiguous(width, t, &row));
    if (!rc) {
        MPI_Type_commit(&row);
        rc = DFM_WORK_MPI(w, MPI_Alltoallv(pack, scnt, sd, row, all, rcnt, rd, row, m->comm));
        MPI_Type_free(&row);
    }
    for (int r = 0; w && r < m->size; r++)
        if (r != m->rank) w->bytes_sent += (uint64_t)scnt[r] * rb;
    free(pack);
    return rc;
}

/* the ranks each query goes to: every rank (route NULL), or the ranks that hold entries of one of its
 * probe lists. Per destination r, scnt[r] queries at sd[r] in sidx, in query order. */
static int destinations(const dfm_mpi *m, const dfm_route *route, const int64_t *lists, size_t npr, size_t nq, int *scnt, int *sd,
                        uint32_t **sidx, size_t *ns) {
    const int P = m->size;
    uint8_t *to = calloc(nq * (size_t)P + 1, 1);
    if (!to) return DFM_FAIL(DFM_ENOMEM, "no memory");
    for (size_t q = 0; q < nq; q++) {
        if (!route) {
            memset(to + q * (size_t)P, 1, (size_t)P);
            continue;
        }
        for (size_t j = 0; j < npr; j++) {
            int64_t l = lists[q * npr + j];
            if (l < 0 || (uint64_t)l >= route->nlist) continue;
            for (uint32_t e = route->off[l]; e < route->off[l + 1]; e++) to[q * (size_t)P + (size_t)route->rank[e]] = 1;
        }
    }
    size_t n = 0;
    for (int r = 0; r < P; r++) {
        scnt[r] = 0;
        for (size_t q = 0; q < nq; q++) scnt[r] += to[q * (size_t)P + (size_t)r];
        sd[r] = (int)n;
        n += (size_t)scnt[r];
    }
    *sidx = malloc((n + 1) * sizeof **sidx);
    if (!*sidx) {
        free(to);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    for (int r = 0, k = 0; r < P; r++)
        for (size_t q = 0; q < nq; q++)
            if (to[q * (size_t)P + (size_t)r]) (*sidx)[k++] = (uint32_t)q;
    *ns = n;
    free(to);
    return DFM_OK;
}

/* every received query against each local shard; the shards' lists merged (loc / nloc) */
static int search_local(const dfm_shard_searcher *searchers, int n_searchers, const dfm_search_params *p, const dfm_probes *pr,
                        const dfm_query *q, const float *v, size_t n, const dfm_vec_source *vs, const dfm_chunk_source *cs, dfm_hit *loc,
                        uint32_t *nloc, dfm_search_counts *c) {
    const uint32_t k = dfm_search_cap(p);
    dfm_hit *tmp = n_searchers > 1 ? malloc((n + 1) * k * sizeof *tmp) : NULL, *mbuf = malloc((size_t)k * sizeof *mbuf);
    uint32_t *ntmp = n_searchers > 1 ? calloc(n + 1, sizeof *ntmp) : NULL;
    int rc = mbuf && (n_searchers <= 1 || (tmp && ntmp)) ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory for %zu queries", n);
    for (size_t i = 0; i < n; i++) nloc[i] = 0;
    for (int s = 0; s < n_searchers && !rc; s++) {
        rc = dfm_shard_topk(&searchers[s], p, pr, q, v, n, vs, cs, s == 0 ? loc : tmp, s == 0 ? nloc : ntmp, c);
        for (size_t i = 0; s > 0 && !rc && i < n; i++) {
            const dfm_hit *lists[2] = {loc + i * k, tmp + i * k};
            size_t lens[2] = {nloc[i], ntmp[i]};
            nloc[i] = (uint32_t)dfm_hits_merge(lists, lens, 2, k, p->metric, mbuf);
            memcpy(loc + i * k, mbuf, nloc[i] * sizeof *mbuf);
        }
    }
    free(tmp);
    free(ntmp);
    free(mbuf);
    return rc;
}

/* a query's lists from its destinations, merged into its top K (approximate indexes: the best K + margin
 * by the index's scores, rescored exactly here, once, and re-ranked) */
static int merge_query(const dfm_search_params *p, const dfm_hit *const *lists, const size_t *lens, int nl, const float *qv,
                       const dfm_vec_source *vs, dfm_hit *mbuf, float *vbuf, dfm_hit *out, uint32_t *n_out, dfm_search_counts *c) {
    const uint32_t k = dfm_search_cap(p);
    dfm_hit *dst = p->approx ? mbuf : out;
    uint32_t nm = (uint32_t)dfm_hits_merge(lists, lens, nl, k, p->metric, dst);
    if (p->approx) {
        for (uint32_t j = 0; j < nm; j++) {
            const float *row = vs->row ? vs->row(vs->ctx, (uint64_t)mbuf[j].id) : NULL;
            if (!row) {
                DFM_TRY(vs->rows(vs->ctx, (uint64_t)mbuf[j].id, 1, vbuf));
                row = vbuf;
            }
            mbuf[j].score = dfm_exact_score(qv, row, vs->dim, p->metric);
        }
        c->exact_scores += nm;
        dfm_hits_sort(mbuf, nm, p->metric);
        if (nm > p->k) nm = p->k;
        memcpy(out, mbuf, nm * sizeof *mbuf);
    }
    *n_out = nm;
    return DFM_OK;
}

int dfm_dsearch(const dfm_mpi *m, const dfm_shard_searcher *searchers, int n_searchers, const dfm_ivf *quant, const dfm_route *route,
                const dfm_search_params *p, const dfm_vec_source *vs, const dfm_chunk_source *cs, const dfm_query *qs, const float *qv,
                size_t nq, dfm_hit *out, uint32_t *n_out, dfm_search_counts *c, dfm_work *w) {
    const int P = m->size;
    const uint32_t k = dfm_search_cap(p), dim = vs->dim; /* k: hits per list while merging */
    const size_t npr = quant ? dfm_ivf_nprobe(quant) : 0;
    if (!quant) route = NULL;
    if (nq > INT_MAX / 2) return DFM_FAIL(DFM_EARG, "query block of %zu is too large", nq);
    int mynq = (int)nq, *scnt = calloc((size_t)P, sizeof *scnt), *sd = calloc((size_t)P, sizeof *sd);
    int *rcnt = calloc((size_t)P, sizeof *rcnt), *rd = calloc((size_t)P, sizeof *rd), *qoff = calloc(nq + 2, sizeof *qoff);
    uint32_t *sidx = NULL, *nloc = NULL, *nrecv = NULL;
    size_t ns = 0, rtotal = 0;
    dfm_query *rq = NULL;
    float *rv = NULL, *mydis = NULL, *rdis = NULL;
    int64_t *mylists = NULL, *rlists = NULL;
    int32_t *my32 = NULL, *r32 = NULL;
    dfm_hit *loc = NULL, *recv = NULL, *mbuf = malloc((size_t)k * sizeof *mbuf);
    const dfm_hit **lists = NULL;
    size_t *lens = NULL;
    MPI_Datatype htype = MPI_DATATYPE_NULL;
    int rc = (scnt && sd && rcnt && rd && qoff && mbuf) ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc && quant) {
        /* 1. this rank's queries to their probe lists, once: the lists travel with the queries */
        mylists = malloc((nq + 1) * npr * sizeof *mylists);
        mydis = malloc((nq + 1) * npr * sizeof *mydis);
        my32 = malloc((nq + 1) * npr * sizeof *my32);
        if (!mylists || !mydis || !my32) rc = DFM_FAIL(DFM_ENOMEM, "no memory for %zu x %zu probe lists", nq, npr);
        if (!rc) rc = dfm_ivf_assign(quant, nq, qv, npr, mylists, mydis);
        if (!rc && nq) c->coarse_distances += (uint64_t)(nq < DFM_MIN_SEARCH_BATCH ? DFM_MIN_SEARCH_BATCH : nq) * quant->nlist;
        for (size_t i = 0; !rc && i < nq * npr; i++) my32[i] = (int32_t)mylists[i]; /* nlist < 2^31 (checked at load) */
    }
    /* 2. where each query goes: every rank, or the ranks holding its lists */
    if (!rc) rc = destinations(m, route, mylists, npr, nq, scnt, sd, &sidx, &ns);
    if ((rc = dfm_work_agree(w, m, rc))) goto done;
    if (route) rc = DFM_WORK_MPI(w, MPI_Alltoall(scnt, 1, MPI_INT, rcnt, 1, MPI_INT, m->comm));
    else rc = DFM_WORK_MPI(w, MPI_Allgather(&mynq, 1, MPI_INT, rcnt, 1, MPI_INT, m->comm));
    if (w) w->bytes_sent += sizeof(int) * (uint64_t)(P - 1);
    if (rc) goto done;
    for (int r = 0; r < P; r++) {
        rd[r] = (int)rtotal;
        rtotal += (size_t)rcnt[r];
    }
    if (rtotal > INT_MAX) {
        rc = DFM_FAIL(DFM_EARG, "%zu queries in one round. HINT: use a smaller --query-block", rtotal);
        goto done;
    }
    rq = malloc((rtotal + 1) * sizeof *rq);
    rv = malloc((rtotal + 1) * dim * sizeof *rv);
    loc = malloc((rtotal + 1) * k * sizeof *loc);
    nloc = calloc(rtotal + 1, sizeof *nloc);
    recv = malloc((ns + 1) * k * sizeof *recv);
    nrecv = calloc(ns + 1, sizeof *nrecv);
    if (quant) {
        r32 = malloc((rtotal + 1) * npr * sizeof *r32);
        rlists = malloc((rtotal + 1) * npr * sizeof *rlists);
        rdis = malloc((rtotal + 1) * npr * sizeof *rdis);
    }
    if (!rq || !rv || !loc || !nloc || !recv || !nrecv || (quant && (!r32 || !rlists || !rdis)))
        rc = DFM_FAIL(DFM_ENOMEM, "no memory for %zu queries", rtotal);
    if ((rc = dfm_work_agree(w, m, rc))) goto done;
    /* 3. the queries (with their probe lists) to their destinations */
    if (route) {
        rc = alltoall_rows(m, qs, sidx, ns, MPI_BYTE, (int)sizeof(dfm_query), 1, scnt, sd, rq, rcnt, rd, w);
        if (!rc) rc = alltoall_rows(m, qv, sidx, ns, MPI_FLOAT, (int)dim, sizeof(float), scnt, sd, rv, rcnt, rd, w);
        if (!rc) rc = alltoall_rows(m, my32, sidx, ns, MPI_INT32_T, (int)npr, sizeof(int32_t), scnt, sd, r32, rcnt, rd, w);
        if (!rc) rc = alltoall_rows(m, mydis, sidx, ns, MPI_FLOAT, (int)npr, sizeof(float), scnt, sd, rdis, rcnt, rd, w);
    } else {
        rc = allgather_rows(m, qs, mynq, MPI_BYTE, (int)sizeof(dfm_query), 1, rq, rcnt, rd, w);
        if (!rc) rc = allgather_rows(m, qv, mynq, MPI_FLOAT, (int)dim, sizeof(float), rv, rcnt, rd, w);
        if (!rc && quant) rc = allgather_rows(m, my32, mynq, MPI_INT32_T, (int)npr, sizeof(int32_t), r32, rcnt, rd, w);
        if (!rc && quant) rc = allgather_rows(m, mydis, mynq, MPI_FLOAT, (int)npr, sizeof(float), rdis, rcnt, rd, w);
    }
    if (rc) goto done;
    for (size_t i = 0; quant && i < rtotal * npr; i++) rlists[i] = r32[i];
    /* 4. every received query against each local shard, in its given lists */
    dfm_probes pr = {npr, rlists, rdis};
    rc = search_local(searchers, n_searchers, p, quant ? &pr : NULL, rq, rv, rtotal, vs, cs, loc, nloc, c);
    if ((rc = dfm_work_agree(w, m, rc))) goto done;
    /* 5. the lists back to each query's owner */
    MPI_Type_contiguous((int)(k * sizeof(dfm_hit)), MPI_BYTE, &htype);
    MPI_Type_commit(&htype);
    rc = DFM_WORK_MPI(w, MPI_Alltoallv(loc, rcnt, rd, htype, recv, scnt, sd, htype, m->comm));
    if (!rc) rc = DFM_WORK_MPI(w, MPI_Alltoallv(nloc, rcnt, rd, MPI_UINT32_T, nrecv, scnt, sd, MPI_UINT32_T, m->comm));
    if (w) w->bytes_sent += (uint64_t)(rtotal - (size_t)rcnt[m->rank]) * (k * sizeof(dfm_hit) + sizeof(uint32_t));
    if (rc) goto done;
    /* 6. each query's lists, merged */
    for (size_t i = 0; i < ns; i++) qoff[sidx[i] + 1]++;
    for (size_t q = 0; q < nq; q++) qoff[q + 1] += qoff[q];
    lists = malloc((ns + 1) * sizeof *lists);
    lens = malloc((ns + 1) * sizeof *lens);
    if (!lists || !lens) {
        rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        goto done;
    }
    for (size_t i = 0; i < ns; i++) { /* sidx is in destination order, then query order: the merge does not depend on it */
        size_t at = (size_t)qoff[sidx[i]]++;
        lists[at] = recv + i * k;
        lens[at] = nrecv[i];
    }
    float *vbuf = malloc(sizeof(float) * dim);
    if (!vbuf) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    for (size_t q = 0, at = 0; !rc && q < nq; q++) {
        size_t nl = (size_t)qoff[q] - at;
        rc = merge_query(p, lists + at, lens + at, (int)nl, qv + q * dim, vs, mbuf, vbuf, out + q * p->k, &n_out[q], c);
        at = (size_t)qoff[q];
    }
    free(vbuf);
done:
    if (htype != MPI_DATATYPE_NULL) MPI_Type_free(&htype);
    free(scnt);
    free(sd);
    free(rcnt);
    free(rd);
    free(qoff);
    free(sidx);
    free(rq);
    free(rv);
    free(mylists);
    free(mydis);
    free(my32);
    free(r32);
    free(rlists);
    free(rdis);
    free(loc);
    free(nloc);
    free(recv);
    free(nrecv);
    free(mbuf);
    free((void *)lists);
    free(lens);
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
    dfm_ivf *ivf; /* per shard (ivf[i].ivf NULL: not a plain IVF index) */
    dfm_shard_searcher *faiss_s;
    dfm_shard_searcher bf_s; /* brute force over this rank's share of the ids (recall samples) */
    dfm_bf_ctx bf_ctx;
    int n;
    FaissIndex *trained; /* a rank without a shard: the trained empty index, for its quantiser */
    dfm_ivf trained_ivf;
} shards_t;

static void shards_free(shards_t *s) {
    for (int i = 0; i < s->n; i++) {
        dfm_ivf_close(&s->ivf[i]);
        if (s->idx[i]) faiss_Index_free(s->idx[i]);
    }
    dfm_ivf_close(&s->trained_ivf);
    if (s->trained) faiss_Index_free(s->trained);
    free(s->idx);
    free(s->info);
    free(s->ivf);
    free(s->faiss_s);
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
    if (sh->trained) DFM_TRY(dfm_index_set_param(sh->trained, name, v));
    return DFM_OK;
}

/* One retrieve stage's state. */
typedef struct {
    const dfm_mpi *m;
    const dfm_retrieve_opts *o;
    const dfm_vec_source *vs;   /* the queries' run: query vectors, their sequences, the output rows */
    const dfm_chunk_source *cs;
    const dfm_vec_source *dvs;  /* the datastore the index holds: rescoring, brute force, exclusions (= vs, cs */
    const dfm_chunk_source *dcs; /* unless --datastore names another run) */
    const char *index_run;      /* the run whose index files are searched */
    json_t *index_stage, *outputs;
    uint64_t block_chunks, n, nd, index_hash; /* n: query rows; nd: datastore rows (ids < nd) */
    uint32_t dim, k, metric;
    const char *metric_s, *factory;
    shards_t sh;
    const dfm_ivf *quant;           /* this rank's coarse quantiser (NULL on every rank: each shard assigns) */
    dfm_route route;                /* with quant: the ranks holding each list */
    dfm_search_params sp, sp_exact; /* the index's search; brute force */
    dfm_search_counts cnt;          /* the run's rounds */
    dfm_search_counts side, side_bf; /* tuning and recall: the index's searches; brute force */
    dfm_work w;
    uint64_t blocks_kept, blocks_searched;
    const char *tuned_name;         /* nprobe, efSearch, or NULL (nothing tuned but the margin, or nothing) */
    double tuned_value, tuned_recall, measured_recall;
    json_t *tuning_tries;           /* rank 0: every setting the tuning tried, with its recall */
    double t0, search_s;
} retrieve_ctx;

/* The options and the index stage (its files, metric, factory) before anything is loaded. */
static int retrieve_check(retrieve_ctx *r) {
    const dfm_retrieve_opts *o = r->o;
    DFM_TRY(dfm_check_sources(r->vs, r->cs, r->block_chunks));
    if (o->k == 0 || o->k > DFM_NBR_MAX_K) return DFM_FAIL(DFM_EARG, "--k %u: K must be 1..64", o->k);
    if (o->window == 0) return DFM_FAIL(DFM_EARG, "--query-window must be at least 1");
    if (o->query_block == 0) return DFM_FAIL(DFM_EARG, "--query-block must be at least 1");
    if (o->exclude > DFM_EXCLUDE_DOCUMENT) return DFM_FAIL(DFM_EARG, "unknown exclusion policy %u", o->exclude);
    if (o->target_recall < 0 || o->target_recall > 1) return DFM_FAIL(DFM_EARG, "--target-recall %g must be in (0, 1]", o->target_recall);
    r->n = r->vs->n_rows;
    r->nd = r->dvs->n_rows;
    r->dim = r->vs->dim, r->k = o->k;
    if (r->dvs != r->vs) {
        if (r->dcs->n_chunks != r->dvs->n_rows)
            return DFM_FAIL(DFM_EMISMATCH, "datastore run %s: %llu chunks but %llu embedding rows. HINT: re-run its 'dfm encode'", r->index_run,
                            (unsigned long long)r->dcs->n_chunks, (unsigned long long)r->dvs->n_rows);
        if (r->dvs->dim != r->dim)
            return DFM_FAIL(DFM_EMISMATCH, "%s holds embeddings of dim %u but its datastore run %s of dim %u. HINT: encode both with the same "
                            "encoder", o->run_dir, r->dim, r->index_run, r->dvs->dim);
        if (o->exclude != DFM_EXCLUDE_NONE)
            return DFM_FAIL(DFM_EARG, "--exclude %s with --datastore: the datastore's sequences and documents are not the queries'. HINT: use "
                            "--exclude none (keep the datastore free of the query texts instead)", dfm_exclude_name(o->exclude));
    }
    r->outputs = json_object_get(r->index_stage, "outputs");
    r->metric_s = json_string_value(json_object_get(r->index_stage, "metric"));
    r->factory = json_string_value(json_object_get(r->index_stage, "factory")) ?: "?";
    if (!json_is_array(r->outputs) || !json_array_size(r->outputs) || !r->metric_s)
        return DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: the index stage lists no index files or no metric. HINT: re-run 'dfm index'", r->index_run);
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

/* 1 when the index compares every vector of the shard per search (Flat, in IDMap or not) */
static int flat_index(FaissIndex *idx) {
    FaissIndexIDMap *map = faiss_IndexIDMap_cast(idx);
    return faiss_IndexFlat_cast(map ? faiss_IndexIDMap_sub_index(map) : idx) != NULL;
}

/* one loaded shard's searchers: FAISS (with its probe lists when a plain IVF) and brute force */
static void shard_searchers(retrieve_ctx *r, int i) {
    shards_t *sh = &r->sh;
    dfm_shard_searcher *s = &sh->faiss_s[i];
    *s = (dfm_shard_searcher){dfm_faiss_search, sh->idx[i], sh->info[i].ntotal, sh->info[i].exact_scores};
    if (sh->ivf[i].ivf) {
        s->search_assigned = dfm_ivf_search_assigned;
        s->actx = &sh->ivf[i];
        s->list_sizes = sh->ivf[i].list_sizes;
    }
    s->scans_all = flat_index(sh->idx[i]);
    s->scanned = s->scans_all ? NULL : dfm_ivf_stats_scanned; /* FAISS counts the IVF codes it compares */
}

/* brute force over this rank's share [rank*n/P, (rank+1)*n/P) of the ids, whatever the index's sharding */
static void bf_searcher(retrieve_ctx *r) {
    shards_t *sh = &r->sh;
    uint64_t a = (uint64_t)(((unsigned __int128)r->nd * (unsigned)r->m->rank) / (unsigned)r->m->size);
    uint64_t z = (uint64_t)(((unsigned __int128)r->nd * (unsigned)(r->m->rank + 1)) / (unsigned)r->m->size);
    sh->bf_ctx = (dfm_bf_ctx){r->dvs, a, z - a, r->metric};
    sh->bf_s = (dfm_shard_searcher){dfm_bf_search, &sh->bf_ctx, z - a, 1};
    sh->bf_s.scans_all = 1;
}

/* The route of every list (quant set): each rank's lists with entries, allgathered as bitmaps; a list
 * goes to every rank that holds some of it (one rank when the index is sharded by list). */
static int build_route(retrieve_ctx *r) {
    const dfm_mpi *m = r->m;
    const uint64_t nlist = r->quant->nlist, words = (nlist + 63) / 64;
    uint64_t *mine = calloc(words + 1, 8), *all = calloc((size_t)m->size * words + 1, 8);
    dfm_route *rt = &r->route;
    rt->nlist = nlist;
    rt->off = calloc(nlist + 1, sizeof *rt->off);
    int rc = mine && all && rt->off ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory for the routes of %llu lists", (unsigned long long)nlist);
    for (int i = 0; !rc && i < r->sh.n; i++)
        for (uint64_t l = 0; l < nlist; l++)
            if (r->sh.ivf[i].list_sizes && r->sh.ivf[i].list_sizes[l]) mine[l / 64] |= 1ull << (l % 64);
    if (!(rc = dfm_mpi_agree(m, rc))) rc = DFM_MPI_CHECK(MPI_Allgather(mine, (int)words, MPI_UINT64_T, all, (int)words, MPI_UINT64_T, m->comm));
    uint64_t n = 0, shared = 0;
    for (uint64_t l = 0; !rc && l < nlist; l++) {
        uint32_t c = 0;
        for (int q = 0; q < m->size; q++) c += (uint32_t)(all[(size_t)q * words + l / 64] >> (l % 64) & 1);
        rt->off[l + 1] = rt->off[l] + c;
        shared += c > 1;
        n += c;
    }
    if (!rc && !(rt->rank = malloc((n + 1) * sizeof *rt->rank))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    for (uint64_t l = 0, e = 0; !rc && l < nlist; l++)
        for (int q = 0; q < m->size; q++)
            if (all[(size_t)q * words + l / 64] >> (l % 64) & 1) rt->rank[e++] = q;
    if (!rc && m->rank == 0)
        DFM_LOG_I("retrieve: %llu of %llu lists are whole in one rank's shard; a query goes only to the ranks holding its lists",
                  (unsigned long long)(nlist - shared), (unsigned long long)nlist);
    free(mine);
    free(all);
    return dfm_mpi_agree(m, rc);
}

/* The coarse quantiser that assigns this rank's queries: its first shard's, or, on a rank without a
 * shard, the trained empty index's. Used only when every rank has one (agreed); otherwise each shard
 * assigns the queries itself, as FAISS's search does (indexes that are not plain IVF; runs indexed
 * before the trained index was kept). */
static int choose_quantizer(retrieve_ctx *r) {
    shards_t *sh = &r->sh;
    const dfm_ivf *q = NULL;
    int rc = DFM_OK;
    if (sh->n > 0 && sh->ivf[0].ivf) {
        q = &sh->ivf[0];
    } else if (sh->n == 0 && strstr(r->factory, "IVF")) {
        const char *h = json_string_value(json_object_get(r->index_stage, "trained_xxh128"));
        rc = dfm_index_load_trained(r->index_run, h, &sh->trained);
        if (rc == DFM_ENOTFOUND) {
            DFM_LOG_W("%s; each shard assigns the queries itself", dfm_last_error());
            dfm_error_clear();
            rc = DFM_OK;
        }
        if (!rc && sh->trained) rc = dfm_ivf_open(sh->trained, &sh->trained_ivf);
        if (!rc && sh->trained_ivf.ivf) q = &sh->trained_ivf;
    }
    if (q && q->nlist > INT32_MAX) q = NULL;
    int have = q != NULL, all = 0;
    if ((rc = dfm_mpi_agree(r->m, rc))) return rc;
    DFM_TRY(DFM_MPI_CHECK(MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, r->m->comm)));
    r->quant = all ? q : NULL;
    if (r->m->rank == 0)
        DFM_LOG_I("retrieve: %s", r->quant ? "each query is assigned to its probe lists once, by its owner; shards scan only those lists"
                                           : "each shard assigns the queries itself (not a plain IVF index, or no trained index on a rank without a shard)");
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
    sh->ivf = calloc((size_t)nmine + 1, sizeof *sh->ivf);
    sh->faiss_s = calloc((size_t)nmine + 1, sizeof *sh->faiss_s);
    if (!sh->idx || !sh->info || !sh->ivf || !sh->faiss_s) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    bf_searcher(r);
    for (int j = m->rank; j < n_shards && !rc; j += m->size) {
        const char *file = json_string_value(json_object_get(json_array_get(r->outputs, (size_t)j), "file"));
        char *path = file ? dfm_path_join(r->index_run, file) : NULL;
        if (!path) rc = DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: index output %d has no \"file\"", r->index_run, j);
        int i = sh->n;
        if (!rc) rc = dfm_index_load(path, r->dim, (int)r->metric, &sh->idx[i], &sh->info[i]);
        if (!rc && sh->info[i].end_id > r->nd)
            rc = DFM_FAIL(DFM_EMISMATCH, "index %s holds ids up to %llu but the corpus has %llu chunks. HINT: re-run 'dfm index'", path,
                          (unsigned long long)sh->info[i].end_id, (unsigned long long)r->nd);
        if (!rc) {
            sh->n++;
            rc = dfm_ivf_open(sh->idx[i], &sh->ivf[i]);
        }
        if (!rc) shard_searchers(r, i);
        free(path);
    }
    if ((rc = dfm_mpi_agree(m, rc))) return rc;
    DFM_TRY(choose_quantizer(r));
    if (r->quant) DFM_TRY(build_route(r));
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
    int rc = sample_queries(m, r->vs, r->cs, r->o->window, want, seed, &s->sq, &s->sv, &s->snq);
    s->ex = malloc((s->snq + 1) * k * sizeof *s->ex);
    s->ap = malloc((s->snq + 1) * k * sizeof *s->ap);
    s->nex = calloc(s->snq + 1, sizeof *s->nex);
    s->nap = calloc(s->snq + 1, sizeof *s->nap);
    if (!rc && (!s->ex || !s->ap || !s->nex || !s->nap)) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = dfm_work_agree(&r->w, m, rc);
    if (!rc)
        rc = dfm_dsearch(m, &r->sh.bf_s, 1, NULL, NULL, &r->sp_exact, r->dvs, r->dcs, s->sq, s->sv, s->snq, s->ex, s->nex, &r->side_bf, &r->w);
    return rc;
}

/* The index's search of the sample and its recall against the exact lists (the same on every rank). */
static int recall_of_index(retrieve_ctx *r, recall_sample *s, double *recall) {
    DFM_TRY(dfm_dsearch(r->m, r->sh.faiss_s, r->sh.n, r->quant, r->quant ? &r->route : NULL, &r->sp, r->dvs, r->dcs, s->sq, s->sv, s->snq, s->ap,
                        s->nap, &r->side, &r->w));
    *recall = r->m->rank == 0 ? dfm_recall(s->ap, s->nap, s->ex, s->nex, s->snq, r->k) : 0;
    DFM_TRY(DFM_WORK_MPI(&r->w, MPI_Bcast(recall, 1, MPI_DOUBLE, 0, r->m->comm)));
    return DFM_OK;
}

/* The search parameter --target-recall tunes: nprobe of an IVF index, efSearch of an HNSW one; NULL
 * when the index has none, or when the user set it (an explicit --nprobe / --ef-search wins). */
static const char *tuned_parameter(const retrieve_ctx *r) {
    if (strstr(r->factory, "IVF")) return r->o->nprobe > 0 ? NULL : "nprobe";
    if (strstr(r->factory, "HNSW")) return r->o->ef_search > 0 ? NULL : "efSearch";
    return NULL;
}

/* A doubling that raises the sample's recall@K by less than this has stalled: 10 of the 4096 neighbours of
 * the default sample (256 queries x 16). */
#define DFM_RECALL_STALL 0.0025

/* The recall of the sample at (v, margin): v the tuned parameter's value (ignored without one). Each try
 * is logged and kept for the manifest's "tuning" record. */
static int try_setting(retrieve_ctx *r, recall_sample *s, double v, uint32_t margin, double *rec) {
    const dfm_mpi *m = r->m;
    int rc = r->tuned_name ? set_param_all(&r->sh, r->tuned_name, v) : DFM_OK;
    DFM_TRY(dfm_work_agree(&r->w, m, rc));
    r->sp.margin = margin;
    DFM_TRY(recall_of_index(r, s, rec));
    if (m->rank == 0) {
        char what[64] = "";
        if (r->tuned_name) snprintf(what, sizeof what, "%s=%g ", r->tuned_name, v);
        DFM_LOG_I("retrieve: tuning %smargin=%u: recall@%u %.4f", what, margin, r->k, *rec);
        if (!r->tuning_tries) r->tuning_tries = json_array();
        json_array_append_new(r->tuning_tries, json_pack("{s:f, s:i, s:f}", "value", r->tuned_name ? v : 0.0, "margin", (int)margin,
                                                         "recall", *rec));
    }
    return DFM_OK;
}

/* 2. --target-recall (on by default): the cheapest setting found that reaches R on a held-out sample, against
 * brute force. Two knobs bound an approximate index's recall: the lists it visits (nprobe; efSearch for HNSW)
 * and, with compressed codes, whether the true neighbours survive among the K + margin candidates that are
 * rescored exactly. Starting from nprobe 1 (efSearch 16) and --margin, each step doubles the tuned parameter;
 * when a doubling stalls (recall up by less than DFM_RECALL_STALL) it is undone and the margin doubles instead,
 * up to --max-margin: the codes, not the lists, bound the recall then. It stops at R, or when neither knob
 * moves the recall. An explicit --nprobe / --ef-search is kept and only the margin is tuned. */
static int tune_recall(retrieve_ctx *r) {
    const dfm_mpi *m = r->m;
    const dfm_retrieve_opts *o = r->o;
    const char *factory = r->factory;
    recall_sample s = {0};
    r->tuned_name = tuned_parameter(r);
    int margin_tuned = r->sp.approx && o->max_margin > o->margin;
    if (!r->tuned_name && !margin_tuned) return DFM_OK;
    int rc = recall_sample_exact(r, o->measure_recall ? o->measure_recall : 256, o->seed + 1, &s);
    if (!rc) {
        double limit = strstr(factory, "IVF") ? 1e9 : 1 << 16, v = strstr(factory, "IVF") ? 1 : 16, rec = 0;
        long long nlist = json_integer_value(json_object_get(json_object_get(r->index_stage, "choice"), "nlist"));
        if (nlist > 0) limit = (double)nlist;
        if (!r->tuned_name) v = limit = 0;
        uint32_t margin = o->margin;
        rc = try_setting(r, &s, v, margin, &rec);
        while (!rc && rec < o->target_recall) {
            double rec2 = 0;
            if (r->tuned_name && v < limit) { /* more lists, unless that has stalled */
                double v2 = v * 2 > limit ? limit : v * 2;
                if ((rc = try_setting(r, &s, v2, margin, &rec2))) break;
                if (rec2 - rec >= DFM_RECALL_STALL || !margin_tuned || margin >= o->max_margin) {
                    v = v2, rec = rec2;
                    continue;
                }
                /* stalled: undo it (rec2 < rec + stall), and widen the rescored candidates instead */
            }
            if (!margin_tuned || margin >= o->max_margin) break;
            uint32_t m2 = margin < r->k ? r->k : margin * 2;
            if (m2 > o->max_margin) m2 = o->max_margin;
            if ((rc = try_setting(r, &s, v, m2, &rec2))) break;
            if (rec2 - rec < DFM_RECALL_STALL) { /* neither knob moves it: keep the better, stop */
                if (rec2 > rec) margin = m2, rec = rec2;
                break;
            }
            margin = m2, rec = rec2;
        }
        if (!rc && r->tuned_name) rc = set_param_all(&r->sh, r->tuned_name, v);
        rc = dfm_work_agree(&r->w, m, rc);
        r->sp.margin = margin;
        r->tuned_value = v;
        r->tuned_recall = rec;
        if (!rc && m->rank == 0) {
            char what[64] = "";
            if (r->tuned_name) snprintf(what, sizeof what, "%s=%g ", r->tuned_name, v);
            printf("retrieve: %smargin=%u %s recall@%u = %.4f (target %.4f) on %zu held-out queries\n", what, margin,
                   rec >= o->target_recall ? "reaches" : "falls short at", r->k, rec, o->target_recall, s.snq);
        }
    }
    recall_sample_free(&s);
    return rc;
}

/* The neighbour file of one block being written, and this rank's place in its blocks. */
typedef struct {
    const char *outdir;
    uint64_t b, b0, b1, pos; /* current block, this rank's blocks [b0, b1), next row of the current block */
    uint8_t *done;           /* per block of this rank: 1 when a finished file was kept (resume) */
    dfm_nbr_writer *w;
    dfm_query *qs;
    float *qv;
    int64_t *rowq; /* per row of the round: its query's index, or -1 (no query) */
    dfm_hit *hits;
    uint32_t *nh;
} round_state;

/* the header every block of this run has (first_chunk and n_rows per block) */
static dfm_nbr_header block_header(const retrieve_ctx *r, uint64_t b) {
    uint64_t first = b * r->block_chunks;
    dfm_nbr_header h = {0};
    h.k = r->k;
    h.metric = r->metric;
    h.first_chunk = first;
    h.n_rows = (first + r->block_chunks < r->n ? first + r->block_chunks : r->n) - first;
    h.n_chunks_total = r->n;
    h.n_ids = r->dvs != r->vs ? r->nd : 0;
    h.exclude = r->o->exclude;
    h.query_window = r->o->window;
    h.index_hash = r->index_hash;
    return h;
}

static char *block_path(const char *outdir, uint64_t b) { return dfm_strdupf("%s/nbr-%06llu.bin", outdir, (unsigned long long)b); }

/* One row as the run counts it: a row with a query adds its kept and padded slots and the ids the
 * exclusion policy took from its plain top-K; a row without one is no_query. The same counts whether
 * the row was searched now or kept from an interrupted run. */
static int count_row(retrieve_ctx *r, int has_query, const dfm_query *q, const float *qv, const dfm_hit *hits, uint32_t nh) {
    if (!has_query) {
        r->cnt.no_query++;
        return DFM_OK;
    }
    r->cnt.kept += nh;
    r->cnt.padded += r->k - nh;
    uint64_t excl = 0;
    DFM_TRY(dfm_count_excluded(&r->sp, q, qv, hits, nh, r->dvs, r->dcs, &excl));
    r->cnt.excluded += excl;
    return DFM_OK;
}

/* Resume: block b's file, finished by an interrupted run with this run's header, is kept and its rows
 * counted (returns 1); a missing, damaged or different file is searched again (0). */
static int keep_block(retrieve_ctx *r, const char *outdir, uint64_t b, int *kept) {
    *kept = 0;
    char *path = block_path(outdir, b);
    if (!path) return DFM_FAIL(DFM_ENOMEM, "no memory");
    dfm_nbr_block *blk = NULL;
    dfm_nbr_header want = block_header(r, b);
    int rc = DFM_OK;
    if (dfm_path_exists(path)) {
        if (dfm_nbr_block_open(path, &blk) != DFM_OK) {
            DFM_LOG_W("retrieve: %s is damaged (%s); searching its block again", path, dfm_last_error());
            dfm_error_clear();
        } else if (blk->hdr.k != want.k || blk->hdr.metric != want.metric || blk->hdr.first_chunk != want.first_chunk ||
                   blk->hdr.n_rows != want.n_rows || blk->hdr.n_chunks_total != want.n_chunks_total || blk->hdr.n_ids != want.n_ids || blk->hdr.exclude != want.exclude ||
                   blk->hdr.query_window != want.query_window || blk->hdr.index_hash != want.index_hash) {
            DFM_LOG_W("retrieve: %s was written with other settings or another index; searching its block again", path);
        } else {
            dfm_query q;
            float *qv = malloc(sizeof(float) * r->dim);
            dfm_hit hits[DFM_NBR_MAX_K];
            if (!qv) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
            for (uint64_t i = 0; !rc && i < blk->hdr.n_rows; i++) {
                dfm_nbr_row row = dfm_nbr_block_row(blk, i);
                int hq = dfm_query_build(r->vs, r->cs, row.chunk_id, r->o->window, &q, qv);
                uint32_t nh = 0;
                while (nh < r->k && (row.mask >> nh & 1)) {
                    hits[nh] = (dfm_hit){row.ids[nh], row.scores[nh], 0};
                    nh++;
                }
                rc = hq < 0 ? hq : count_row(r, hq, &q, qv, hits, nh);
            }
            free(qv);
            if (!rc) *kept = 1;
        }
    }
    dfm_nbr_block_close(blk);
    free(path);
    return rc;
}

/* This rank's queries of the round: rows [*lo, *hi) of block rs->b (opening its file first; blocks
 * kept from an interrupted run are skipped); *bend its end. None once this rank's blocks are done. */
static int round_queries(retrieve_ctx *r, round_state *rs, size_t *nq, uint64_t *lo, uint64_t *hi, uint64_t *bend) {
    uint64_t n = r->n, B = r->block_chunks;
    int rc = DFM_OK;
    *nq = 0, *lo = *hi = *bend = 0;
    while (rs->b < rs->b1 && rs->done[rs->b - rs->b0]) rs->b++;
    if (rs->b >= rs->b1) return DFM_OK;
    uint64_t bstart = rs->b * B;
    *bend = bstart + B < n ? bstart + B : n;
    if (!rs->w) {
        char *path = block_path(rs->outdir, rs->b);
        dfm_nbr_header h = block_header(r, rs->b);
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
    r->w.queries += *nq;
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
            rc = count_row(r, 0, NULL, NULL, NULL, 0);
        } else {
            dfm_hits_to_row(rs->hits + (size_t)q * k, rs->nh[q], k, ids, scores, &mask);
            rc = count_row(r, 1, &rs->qs[q], rs->qv + (size_t)q * r->dim, rs->hits + (size_t)q * k, rs->nh[q]);
        }
        if (!rc) rc = dfm_nbr_writer_add(rs->w, ids, scores, mask);
    }
    if (!rc && rs->w && hi == bend) {
        rc = dfm_nbr_writer_close(rs->w);
        if (!rc) dfm_fault_point("retrieve:block-written", r->m->rank);
        rs->w = NULL;
        rs->b++;
        rs->pos = 0;
        r->blocks_searched++;
    } else if (rs->w) {
        rs->pos = hi - rs->b * r->block_chunks;
    }
    return rc;
}

/* 3. the retrieval proper: every rank takes part in the same number of rounds, one query block each */
static int search_rounds(retrieve_ctx *r, round_state *rs, uint64_t rounds, uint64_t todo) {
    const dfm_mpi *m = r->m;
    uint64_t done_chunks = 0;
    dfm_progress *prog = NULL;
    dfm_progress_begin(m, "retrieve", "chunks", todo, &prog);
    int rc = DFM_OK;
    for (uint64_t round = 0; round < rounds && !rc; round++) {
        size_t nq = 0;
        uint64_t lo = 0, hi = 0, bend = 0;
        rc = round_queries(r, rs, &nq, &lo, &hi, &bend);
        if ((rc = dfm_work_agree(&r->w, m, rc))) break;
        rc = dfm_dsearch(m, r->sh.faiss_s, r->sh.n, r->quant, r->quant ? &r->route : NULL, &r->sp, r->dvs, r->dcs, rs->qs, rs->qv, nq, rs->hits,
                         rs->nh, &r->cnt, &r->w);
        if (rc) break;
        rc = round_rows(r, rs, lo, hi, bend);
        /* every rank sees a stop at the same round; a block left open is abandoned below */
        if (!rc) rc = dfm_stop_check("after query round %llu of %llu (the finished blocks are kept)",
                                     (unsigned long long)round + 1, (unsigned long long)rounds);
        rc = dfm_work_agree(&r->w, m, rc);
        if (hi > lo) done_chunks += hi - lo;
        dfm_progress_update(prog, done_chunks);
    }
    dfm_progress_end(prog);
    dfm_nbr_writer_abort(rs->w);
    rs->w = NULL;
    return rc;
}

/* 3. buffers, the output folder, the blocks kept from an interrupted run and the number of rounds,
 * then the rounds */
static int retrieve_blocks(retrieve_ctx *r) {
    const dfm_mpi *m = r->m;
    uint64_t n = r->n, B = r->block_chunks;
    round_state rs = {0};
    uint64_t my_rounds = 0, rounds = 0, todo = 0;
    dfm_block_range(n, B, m->rank, m->size, &rs.b0, &rs.b1);
    rs.b = rs.b0;
    char *outdir = dfm_path_join(r->o->run_dir, "retrieve");
    rs.done = calloc(rs.b1 - rs.b0 + 1, 1);
    int rc = outdir && rs.done ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = dfm_mkdir_p(outdir);
    for (uint64_t b = rs.b0; !rc && b < rs.b1; b++) {
        int kept = 0;
        rc = keep_block(r, outdir, b, &kept); /* only after a resume: a fresh stage emptied the folder */
        rs.done[b - rs.b0] = (uint8_t)kept;
        r->blocks_kept += (uint64_t)kept;
        uint64_t rows = (b + 1) * B < n ? B : n - b * B;
        if (!kept) {
            my_rounds += (rows + r->o->query_block - 1) / r->o->query_block;
            todo += rows;
        }
    }
    if (!(rc = dfm_work_agree(&r->w, m, rc))) rc = DFM_WORK_MPI(&r->w, MPI_Allreduce(&my_rounds, &rounds, 1, MPI_UINT64_T, MPI_MAX, m->comm));
    uint64_t kept_all = 0;
    if (!rc) rc = DFM_WORK_MPI(&r->w, MPI_Allreduce(&r->blocks_kept, &kept_all, 1, MPI_UINT64_T, MPI_SUM, m->comm));
    if (!rc && kept_all && m->rank == 0) DFM_LOG_I("retrieve: resuming: %llu finished block(s) kept", (unsigned long long)kept_all);
    size_t qb = (size_t)r->o->query_block;
    rs.outdir = outdir;
    rs.qs = malloc(qb * sizeof *rs.qs);
    rs.qv = malloc(qb * r->dim * sizeof *rs.qv);
    rs.rowq = malloc(qb * sizeof *rs.rowq);
    rs.hits = malloc(qb * r->k * sizeof *rs.hits);
    rs.nh = calloc(qb, sizeof *rs.nh);
    if (!rc && (!rs.qs || !rs.qv || !rs.rowq || !rs.hits || !rs.nh)) rc = DFM_FAIL(DFM_ENOMEM, "no memory for a query block of %zu", qb);
    if (!(rc = dfm_work_agree(&r->w, m, rc))) rc = search_rounds(r, &rs, rounds, todo);
    free(outdir);
    free(rs.done);
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
    return dfm_work_agree(&r->w, r->m, rc);
}

enum { C_SEARCHES, C_CAND, C_EXCL, C_RESEARCH, C_KEPT, C_PADDED, C_NOQUERY, C_SHARD_EXCL, C_BLOCKS_KEPT, C_BLOCKS_SEARCHED, N_COUNTS };

/* 5. rank 0: the "retrieve" stage object from the counts summed over ranks (sum) */
static json_t *stage_object(retrieve_ctx *r, const uint64_t *sum, double index_s, json_t *work) {
    const dfm_retrieve_opts *o = r->o;
    uint64_t n = r->n, B = r->block_chunks, nb = (n + B - 1) / B, queries_issued = n - sum[C_NOQUERY], bytes = 0;
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
    /* the run's counts (per query, the same on any number of ranks, and after a resume), then the
     * shard-level figures of this invocation */
    json_t *counts = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "queries", (json_int_t)queries_issued,
                               "no_query_rows", (json_int_t)sum[C_NOQUERY], "candidates_fetched", (json_int_t)(queries_issued * (k + r->sp.margin)),
                               "excluded", (json_int_t)sum[C_EXCL], "items_kept", (json_int_t)sum[C_KEPT], "padded_slots",
                               (json_int_t)sum[C_PADDED], "bytes", (json_int_t)bytes, "shard_searches", (json_int_t)sum[C_SEARCHES],
                               "shard_candidates_fetched", (json_int_t)sum[C_CAND], "shard_excluded", (json_int_t)sum[C_SHARD_EXCL],
                               "re_searches", (json_int_t)sum[C_RESEARCH], "blocks_searched", (json_int_t)sum[C_BLOCKS_SEARCHED], "blocks_kept",
                               (json_int_t)sum[C_BLOCKS_KEPT]);
    if (r->measured_recall >= 0) json_object_set_new(counts, "recall", json_real(r->measured_recall));
    char hashbuf[20];
    snprintf(hashbuf, sizeof hashbuf, "%016llx", (unsigned long long)r->index_hash);
    json_t *st = json_pack("{s:s, s:i, s:s, s:s, s:s, s:i, s:s, s:i, s:o, s:{s:f, s:f}, s:o}", "state", "complete", "ranks", r->m->size,
                           "factory", r->factory, "metric", r->metric_s, "index_hash", hashbuf, "k", (int)k, "exclude",
                           dfm_exclude_name(o->exclude), "query_window", (int)o->window, "counts", counts, "timings", "total_s",
                           dfm_now() - r->t0, "search_s", r->search_s, "outputs", outs);
    if (st) json_object_set_new(json_object_get(st, "timings"), "index_search_s_max_rank", json_real(index_s));
    if (st) json_object_set_new(st, "assignment", json_string(r->quant ? "once per query, at its owner" : "by each shard"));
    if (st) json_object_set_new(st, "margin", json_integer(r->sp.margin));
    if (st && r->tuned_recall >= 0)
        json_object_set_new(st, "tuning", json_pack("{s:s?, s:f, s:i, s:f, s:f, s:b, s:O?}", "parameter", r->tuned_name, "value",
                                                    r->tuned_name ? r->tuned_value : 0.0, "margin", (int)r->sp.margin, "recall",
                                                    r->tuned_recall, "target", o->target_recall, "reached",
                                                    r->tuned_recall >= o->target_recall, "tries", r->tuning_tries));
    if (st && r->measured_recall >= 0) json_object_set_new(st, "recall", json_pack("{s:i, s:f, s:I}", "k", (int)k, "recall@k", r->measured_recall,
                                                                                  "queries", (json_int_t)o->measure_recall));
    if (st) json_object_set(st, "work", work);
    DFM_LOG_I("retrieve: %llu queries, %llu kept, %llu padded slots, %llu excluded; %llu shard searches fetched %llu candidates, "
              "%llu re-searches, in %.2fs", (unsigned long long)queries_issued, (unsigned long long)sum[C_KEPT], (unsigned long long)sum[C_PADDED],
              (unsigned long long)sum[C_EXCL], (unsigned long long)sum[C_SEARCHES], (unsigned long long)sum[C_CAND],
              (unsigned long long)sum[C_RESEARCH], r->search_s);
    return st;
}

/* 5. counts over ranks; rank 0 gets the stage object */
static int retrieve_finish(retrieve_ctx *r, json_t **stage) {
    const dfm_search_counts *cnt = &r->cnt;
    uint64_t mine[N_COUNTS] = {cnt->shard_searches, cnt->shard_candidates, cnt->excluded, cnt->researches, cnt->kept,
                               cnt->padded,         cnt->no_query,         cnt->shard_excluded, r->blocks_kept, r->blocks_searched},
             sum[N_COUNTS] = {0};
    double index_s = 0;
    /* the work record: the rounds' searches plus tuning and recall (their brute force apart) */
    r->w.coarse_distances += cnt->coarse_distances + r->side.coarse_distances;
    r->w.codes_scanned += cnt->codes_scanned + r->side.codes_scanned;
    r->w.bf_scanned += r->side_bf.codes_scanned;
    r->w.exact_scores += cnt->exact_scores + r->side.exact_scores + r->side_bf.exact_scores;
    r->w.shard_searches += cnt->shard_searches + r->side.shard_searches;
    json_t *work = NULL;
    int rc = dfm_work_gather(r->m, &r->w, "tune_cpu_s", "search_cpu_s", &work);
    if (!rc) rc = DFM_MPI_CHECK(MPI_Reduce(mine, sum, N_COUNTS, MPI_UINT64_T, MPI_SUM, 0, r->m->comm));
    if (!rc) rc = DFM_MPI_CHECK(MPI_Reduce(&cnt->search_s, &index_s, 1, MPI_DOUBLE, MPI_MAX, 0, r->m->comm));
    if (!rc && r->m->rank == 0) {
        *stage = stage_object(r, sum, index_s, work);
        if (!*stage) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    json_decref(work);
    return dfm_mpi_agree(r->m, rc);
}

int dfm_retrieve_run(const dfm_mpi *m, const dfm_retrieve_opts *o, const dfm_vec_source *vs, const dfm_chunk_source *cs,
                     uint64_t block_chunks, const dfm_vec_source *ds_vs, const dfm_chunk_source *ds_cs, json_t *index_stage, json_t **stage) {
    *stage = NULL;
    retrieve_ctx r;
    memset(&r, 0, sizeof r);
    r.m = m, r.o = o, r.vs = vs, r.cs = cs, r.block_chunks = block_chunks, r.index_stage = index_stage;
    r.dvs = ds_vs && ds_cs ? ds_vs : vs, r.dcs = ds_vs && ds_cs ? ds_cs : cs;
    r.index_run = o->datastore_run ? o->datastore_run : o->run_dir;
    r.tuned_recall = r.measured_recall = -1;
    DFM_TRY(retrieve_check(&r));
    r.t0 = dfm_now();
    dfm_work_start(&r.w);
    DFM_TRY(index_hash(&r));
    int rc = load_shards(&r);
    if (!rc) {
        if (m->rank == 0)
            DFM_LOG_I("retrieve: %llu chunks%s%s, %d index shard(s) of %s on %d rank(s), K=%u margin=%u exclude=%s window=%u",
                      (unsigned long long)r.n, r.dvs != vs ? " against the datastore " : "", r.dvs != vs ? r.index_run : "", (int)json_array_size(r.outputs), r.factory, m->size, r.k, o->margin,
                      dfm_exclude_name(o->exclude), o->window);
        json_t *exact_j = json_object_get(json_object_get(index_stage, "choice"), "exact_scores");
        int approx = json_is_boolean(exact_j) ? !json_is_true(exact_j) : (r.sh.n ? !r.sh.info[0].exact_scores : 0);
        r.sp = (dfm_search_params){r.k, o->margin, r.metric, o->exclude, approx};
        r.sp_exact = (dfm_search_params){r.k, o->margin, r.metric, o->exclude, 0};
        if (o->target_recall > 0) rc = tune_recall(&r);
        rc = dfm_mpi_agree(m, rc);
    }
    dfm_work_phase(&r.w, 0);
    double tsearch = dfm_now();
    if (!rc) rc = retrieve_blocks(&r);
    r.search_s = dfm_now() - tsearch;
    dfm_work_phase(&r.w, 1);
    if (!rc && o->measure_recall) rc = measure_recall(&r);
    dfm_work_phase(&r.w, 0);
    if (!rc) rc = retrieve_finish(&r, stage);
    shards_free(&r.sh);
    json_decref(r.tuning_tries);
    free(r.route.off);
    free(r.route.rank);
    return rc;
}
