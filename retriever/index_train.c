/* index_train.c — distributed index training (see index_train.h). */
#include "retriever/index_train.h"

#include "common/error.h"
#include "common/log.h"
#include "retriever/ivf.h"
#include "retriever/kmeans.h"
#include "schemas/neighbor_shard.h"

#include <faiss/c_api/Index_c.h>
#include <stdlib.h>
#include <string.h>

/* this rank's part of the sample: points [g0, g1) of m_total, in blocks of DFM_TRAIN_BLOCK */
typedef struct {
    uint64_t m_total, g0, g1;
    uint64_t b0, b1; /* its blocks */
    float *x;        /* (g1 - g0) x dim */
} sample_part;

static int read_part(const dfm_mpi *m, const dfm_index_plan *plan, const dfm_vec_source *vs, uint64_t seed, sample_part *sp) {
    memset(sp, 0, sizeof *sp);
    const uint64_t M = plan->train_n, nb = (M + DFM_TRAIN_BLOCK - 1) / DFM_TRAIN_BLOCK;
    sp->m_total = M;
    sp->b0 = (uint64_t)(((unsigned __int128)nb * (unsigned)m->rank) / (unsigned)m->size);
    sp->b1 = (uint64_t)(((unsigned __int128)nb * (unsigned)(m->rank + 1)) / (unsigned)m->size);
    sp->g0 = sp->b0 * DFM_TRAIN_BLOCK < M ? sp->b0 * DFM_TRAIN_BLOCK : M;
    sp->g1 = sp->b1 * DFM_TRAIN_BLOCK < M ? sp->b1 * DFM_TRAIN_BLOCK : M;
    uint64_t n = sp->g1 - sp->g0;
    uint64_t *ids = malloc((n + 1) * sizeof *ids);
    sp->x = malloc((n + 1) * vs->dim * sizeof *sp->x);
    if (!ids || !sp->x) {
        free(ids);
        return DFM_FAIL(DFM_ENOMEM, "no memory for %llu training vectors of dim %u. HINT: use a smaller --train-sample or more ranks",
                        (unsigned long long)n, vs->dim);
    }
    dfm_sample_ids_range(vs->n_rows, M, seed, sp->g0, sp->g1, ids);
    int rc = DFM_OK;
    for (uint64_t i = 0; i < n && !rc; i++) rc = vs->rows(vs->ctx, ids[i], 1, sp->x + i * vs->dim);
    free(ids);
    return rc;
}

/* rows per block of this rank's points selected by keep(j) (every s-th sample point: j % s == 0) */
static uint64_t *strided_blocks(const sample_part *sp, uint64_t stride, uint64_t *n_sel) {
    size_t nblk = (size_t)(sp->b1 - sp->b0);
    uint64_t *rows = calloc(nblk + 1, sizeof *rows);
    *n_sel = 0;
    if (!rows) return NULL;
    for (uint64_t j = sp->g0; j < sp->g1; j++)
        if (j % stride == 0) {
            rows[(j - sp->g0) / DFM_TRAIN_BLOCK]++;
            (*n_sel)++;
        }
    return rows;
}

/* broadcast rank 0's buffer (*buf, *len) to every rank */
static int bcast_buffer(const dfm_mpi *m, uint8_t **buf, size_t *len, dfm_work *w) {
    uint64_t n = *len;
    int rc = DFM_WORK_MPI(w, MPI_Bcast(&n, 1, MPI_UINT64_T, 0, m->comm));
    if (rc) return rc;
    if (m->rank != 0 && !(*buf = malloc(n ? n : 1))) rc = DFM_FAIL(DFM_ENOMEM, "no memory for the trained index (%llu bytes)", (unsigned long long)n);
    if ((rc = dfm_work_agree(w, m, rc))) return rc;
    for (uint64_t off = 0; off < n && !rc; off += 1u << 30) {
        uint64_t part = n - off < (1u << 30) ? n - off : (1u << 30);
        rc = DFM_WORK_MPI(w, MPI_Bcast(*buf + off, (int)part, MPI_BYTE, 0, m->comm));
    }
    dfm_work_ring(w, n, m->size);
    *len = n;
    return rc;
}

/* ---- rank 0 trains (indexes without a flat IVF level) ---- */

/* every rank reads its blocks' rows; rank 0 gathers them in sample order (plan->train_n rows) */
static int train_on_rank0(const dfm_mpi *m, const dfm_index_plan *plan, const dfm_vec_source *vs, uint64_t seed, uint8_t **tbuf, size_t *tlen,
                          dfm_work *w) {
    const uint32_t dim = vs->dim;
    sample_part sp;
    int rc = read_part(m, plan, vs, seed, &sp);
    float *all = NULL;
    int *cnt = calloc((size_t)m->size, sizeof *cnt), *displ = calloc((size_t)m->size, sizeof *displ);
    if (!rc && (!cnt || !displ)) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc && m->rank == 0 && !(all = malloc(plan->train_n * dim * sizeof *all)))
        rc = DFM_FAIL(DFM_ENOMEM, "no memory for %llu training vectors. HINT: use a smaller --train-sample", (unsigned long long)plan->train_n);
    w->train_points = sp.g1 - sp.g0;
    MPI_Datatype vtype = MPI_DATATYPE_NULL;
    int mine = (int)(sp.g1 - sp.g0);
    if (!(rc = dfm_work_agree(w, m, rc)) && !(rc = DFM_MPI_CHECK(MPI_Type_contiguous((int)dim, MPI_FLOAT, &vtype)))) {
        MPI_Type_commit(&vtype);
        rc = DFM_WORK_MPI(w, MPI_Gather(&mine, 1, MPI_INT, cnt, 1, MPI_INT, 0, m->comm));
        for (int r = 1; !rc && m->rank == 0 && r < m->size; r++) displ[r] = displ[r - 1] + cnt[r - 1];
        if (!rc) rc = DFM_WORK_MPI(w, MPI_Gatherv(sp.x, mine, vtype, all, cnt, displ, vtype, 0, m->comm));
        if (m->rank != 0) w->bytes_sent += (uint64_t)mine * dim * 4;
    }
    if (vtype != MPI_DATATYPE_NULL) MPI_Type_free(&vtype);
    free(sp.x);
    free(cnt);
    free(displ);
    if (!rc && m->rank == 0) {
        FaissIndex *idx = NULL;
        rc = dfm_index_create(plan, dim, &idx);
        if (!rc) {
            double tt = dfm_now();
            rc = DFM_FAISS_CHECK(faiss_Index_train(idx, (idx_t)plan->train_n, all), "training the index");
            if (!rc) DFM_LOG_I("index: FAISS trained %s on %llu points on rank 0 in %.2fs", plan->factory, (unsigned long long)plan->train_n, dfm_now() - tt);
        }
        if (!rc) rc = dfm_index_to_buffer(idx, tbuf, tlen);
        if (idx) faiss_Index_free(idx);
    }
    free(all);
    return dfm_work_agree(w, m, rc);
}

/* ---- every rank trains (IVF with a flat coarse quantiser) ---- */

/* the coarse quantiser: nlist centroids, the same on every rank */
static int train_coarse(const dfm_mpi *m, const dfm_index_plan *plan, const sample_part *sp, uint32_t dim, uint64_t seed, float *cent, dfm_work *w,
                        double *objective) {
    const uint64_t nlist = plan->nlist, n = sp->g1 - sp->g0;
    uint64_t *picks = malloc(nlist * sizeof *picks), *rows = calloc(sp->b1 - sp->b0 + 1, sizeof *rows);
    int rc = picks && rows ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if ((rc = dfm_work_agree(w, m, rc))) goto done;
    dfm_sample_ids(sp->m_total, nlist, seed ^ 0x6b6d65616e73ull, picks); /* initial centroids: a stratified draw of sample points */
    rc = dfm_kmeans_gather_rows(m, sp->x, dim, sp->g0, n, picks, nlist, dim, cent, w);
    for (uint64_t b = sp->b0; b < sp->b1; b++) rows[b - sp->b0] = (b + 1) * DFM_TRAIN_BLOCK < sp->m_total ? DFM_TRAIN_BLOCK : sp->m_total - b * DFM_TRAIN_BLOCK;
    dfm_kmeans_opts ko = {dim, 1, (uint32_t)nlist, DFM_COARSE_ITERATIONS, plan->metric == DFM_METRIC_IP, plan->metric == DFM_METRIC_IP};
    if (!rc) rc = dfm_kmeans_train(m, &ko, sp->x, dim, rows, (size_t)(sp->b1 - sp->b0), sp->m_total, cent, objective, w);
done:
    free(picks);
    free(rows);
    return rc;
}

/* the points of every stride-th sample point (their residuals when res): n_sel rows, and their rows per block */
static int strided_points(const sample_part *sp, uint32_t dim, uint64_t stride, const float *cent, uint64_t nlist, int ip, float **out,
                          uint64_t **rows, uint64_t *n_sel, dfm_work *w) {
    *out = NULL;
    *rows = strided_blocks(sp, stride, n_sel);
    float *x = malloc((*n_sel + 1) * dim * sizeof *x);
    int32_t *asg = malloc((DFM_TRAIN_BLOCK + 1) * sizeof *asg);
    int rc = *rows && x && asg ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory for %llu residuals", (unsigned long long)*n_sel);
    uint64_t k = 0;
    for (uint64_t j = sp->g0; !rc && j < sp->g1; j++)
        if (j % stride == 0) memcpy(x + (k++) * dim, sp->x + (j - sp->g0) * dim, dim * sizeof *x);
    if (!rc && cent) {
        /* residual = point - its nearest coarse centroid, assigned block by block (the same SGEMMs on any P) */
        dfm_kmeans_opts ko = {dim, 1, (uint32_t)nlist, 0, ip, 0};
        float *xb = x;
        for (uint64_t b = 0; !rc && b < sp->b1 - sp->b0; b++) {
            rc = dfm_kmeans_assign(&ko, cent, xb, dim, (*rows)[b], asg, w);
            for (uint64_t i = 0; !rc && i < (*rows)[b]; i++)
                for (uint32_t t = 0; t < dim; t++) xb[i * dim + t] -= cent[(size_t)asg[i] * dim + t];
            xb += (*rows)[b] * dim;
        }
    }
    free(asg);
    if (rc) {
        free(x);
        free(*rows);
        *rows = NULL;
        return rc;
    }
    *out = x;
    return DFM_OK;
}

/* the product quantiser's M codebooks (FAISS's layout: M x 2^nbits x dim/M), the same on every rank */
static int train_pq(const dfm_mpi *m, const sample_part *sp, uint32_t dim, const float *cent, uint64_t nlist, int ip, uint32_t M, uint32_t nbits,
                    uint64_t seed, float **pq, uint64_t *n_points, dfm_work *w) {
    const uint64_t ksub = 1ull << nbits, cap = 256 * ksub, stride = (sp->m_total + cap - 1) / cap;
    const uint32_t dsub = dim / M;
    float *res = NULL, *init = malloc(ksub * dim * sizeof *init);
    uint64_t *rows = NULL, n_sel = 0, *picks = malloc(ksub * sizeof *picks);
    *pq = malloc(ksub * dim * sizeof **pq);
    int rc = init && picks && *pq ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = strided_points(sp, dim, stride, cent, nlist, ip, &res, &rows, &n_sel, w);
    const uint64_t n_global = (sp->m_total + stride - 1) / stride, g0 = (sp->g0 + stride - 1) / stride;
    *n_points = n_global;
    if ((rc = dfm_work_agree(w, m, rc))) goto done;
    if (n_global < ksub) {
        rc = DFM_FAIL(DFM_EARG, "%llu training points for a product quantiser of %llu centroids. HINT: raise --train-sample", (unsigned long long)n_global,
                      (unsigned long long)ksub);
        goto done;
    }
    dfm_sample_ids(n_global, ksub, seed ^ 0x70716b6d65616eull, picks);
    rc = dfm_kmeans_gather_rows(m, res, dim, g0, n_sel, picks, ksub, dim, init, w);
    for (uint64_t c = 0; !rc && c < ksub; c++) /* point-major to FAISS's sub-space-major */
        for (uint32_t s = 0; s < M; s++) memcpy(*pq + ((size_t)s * ksub + c) * dsub, init + c * dim + (size_t)s * dsub, dsub * sizeof **pq);
    dfm_kmeans_opts ko = {dsub, M, (uint32_t)ksub, DFM_PQ_ITERATIONS, 0, 0};
    if (!rc) rc = dfm_kmeans_train(m, &ko, res, dim, rows, (size_t)(sp->b1 - sp->b0), n_global, *pq, NULL, w);
done:
    free(res);
    free(rows);
    free(init);
    free(picks);
    if (rc) {
        free(*pq);
        *pq = NULL;
    }
    return rc;
}

/* another residual encoder (SQ ...): every stride-th point gathered on rank 0, at most 65,536 */
static int gather_strided(const dfm_mpi *m, const sample_part *sp, uint32_t dim, float **all, uint64_t *n_all, dfm_work *w) {
    const uint64_t cap = 65536, stride = (sp->m_total + cap - 1) / cap;
    float *x = NULL;
    uint64_t *rows = NULL, n_sel = 0;
    int rc = strided_points(sp, dim, stride, NULL, 0, 0, &x, &rows, &n_sel, w);
    *n_all = (sp->m_total + stride - 1) / stride;
    int mine = (int)n_sel, *cnt = calloc((size_t)m->size, sizeof *cnt), *displ = calloc((size_t)m->size, sizeof *displ);
    if (!rc && (!cnt || !displ)) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc && m->rank == 0 && !(*all = malloc((*n_all + 1) * dim * sizeof **all))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    MPI_Datatype vt = MPI_DATATYPE_NULL;
    if (!(rc = dfm_work_agree(w, m, rc)) && !(rc = DFM_MPI_CHECK(MPI_Type_contiguous((int)dim, MPI_FLOAT, &vt)))) {
        MPI_Type_commit(&vt);
        rc = DFM_WORK_MPI(w, MPI_Gather(&mine, 1, MPI_INT, cnt, 1, MPI_INT, 0, m->comm));
        for (int r = 1; !rc && m->rank == 0 && r < m->size; r++) displ[r] = displ[r - 1] + cnt[r - 1];
        if (!rc) rc = DFM_WORK_MPI(w, MPI_Gatherv(x, mine, vt, *all, cnt, displ, vt, 0, m->comm));
        if (m->rank != 0) w->bytes_sent += (uint64_t)mine * dim * 4;
        MPI_Type_free(&vt);
    }
    free(x);
    free(rows);
    free(cnt);
    free(displ);
    return rc;
}

static int train_distributed(const dfm_mpi *m, const dfm_index_plan *plan, const dfm_vec_source *vs, uint64_t seed, char kind, uint32_t M,
                             uint32_t nbits, uint8_t **tbuf, size_t *tlen, json_t **training, dfm_work *w) {
    const uint32_t dim = vs->dim;
    const int ip = plan->metric == DFM_METRIC_IP;
    double t0 = dfm_now(), obj = 0, t_coarse = 0;
    sample_part sp;
    float *cent = malloc(plan->nlist * dim * sizeof *cent), *pq = NULL, *sub = NULL;
    uint64_t n_pq = 0, n_sub = 0;
    int rc = read_part(m, plan, vs, seed, &sp);
    if (!rc && !cent) rc = DFM_FAIL(DFM_ENOMEM, "no memory for %llu centroids", (unsigned long long)plan->nlist);
    w->train_points = sp.g1 - sp.g0;
    if (!(rc = dfm_work_agree(w, m, rc))) rc = train_coarse(m, plan, &sp, dim, seed, cent, w, &obj);
    t_coarse = dfm_now() - t0;
    if (!rc && kind == 'P') rc = train_pq(m, &sp, dim, cent, plan->nlist, ip, M, nbits, seed, &pq, &n_pq, w);
    if (!rc && kind == 'O') rc = gather_strided(m, &sp, dim, &sub, &n_sub, w);
    if (!rc && m->rank == 0) rc = dfm_ivf_trained(plan, dim, cent, pq, kind == 'O' ? n_sub : 0, sub, tbuf, tlen);
    if (!(rc = dfm_work_agree(w, m, rc)) && m->rank == 0) {
        DFM_LOG_I("index: trained %s on %d rank(s): coarse k-means of %llu points into %llu lists in %.2fs%s, %.2fs in all", plan->factory, m->size,
                  (unsigned long long)sp.m_total, (unsigned long long)plan->nlist, t_coarse,
                  kind == 'P' ? ", product quantiser on residuals" : kind == 'O' ? ", encoder by FAISS on rank 0" : "", dfm_now() - t0);
        *training = json_pack("{s:s, s:I, s:I, s:i, s:f, s:s, s:I}", "mode", "distributed", "sample_points", (json_int_t)sp.m_total, "block_points",
                              (json_int_t)DFM_TRAIN_BLOCK, "coarse_iterations", DFM_COARSE_ITERATIONS, "coarse_objective", obj, "encoder",
                              kind == 'P' ? "pq" : kind == 'F' ? "flat" : "faiss on rank 0", "encoder_points",
                              (json_int_t)(kind == 'P' ? n_pq : n_sub));
        if (kind == 'P') json_object_set_new(*training, "pq_iterations", json_integer(DFM_PQ_ITERATIONS));
    }
    free(sp.x);
    free(cent);
    free(pq);
    free(sub);
    return rc;
}

int dfm_index_train(const dfm_mpi *m, const dfm_index_plan *plan, const dfm_vec_source *vs, uint64_t seed, uint8_t **tbuf, size_t *tlen,
                    json_t **training, dfm_work *w) {
    *tbuf = NULL, *tlen = 0, *training = NULL;
    char kind = 0;
    uint32_t M = 0, nbits = 0;
    int rc = DFM_OK;
    if (plan->train_n && plan->nlist) rc = dfm_ivf_encoding(plan, vs->dim, &kind, &M, &nbits); /* the same on every rank */
    if ((rc = dfm_work_agree(w, m, rc))) return rc;
    if (kind) {
        rc = train_distributed(m, plan, vs, seed, kind, M, nbits, tbuf, tlen, training, w);
    } else if (plan->train_n) {
        rc = train_on_rank0(m, plan, vs, seed, tbuf, tlen, w);
        if (!rc && m->rank == 0)
            *training = json_pack("{s:s, s:I}", "mode", "rank 0", "sample_points", (json_int_t)plan->train_n);
    } else if (m->rank == 0) {
        FaissIndex *idx = NULL;
        rc = dfm_index_create(plan, vs->dim, &idx);
        if (!rc) rc = dfm_index_to_buffer(idx, tbuf, tlen);
        if (idx) faiss_Index_free(idx);
        if (!rc) *training = json_pack("{s:s}", "mode", "none");
    }
    if ((rc = dfm_work_agree(w, m, rc))) return rc;
    return bcast_buffer(m, tbuf, tlen, w);
}
