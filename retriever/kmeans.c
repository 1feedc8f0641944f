/* kmeans.c — distributed k-means with an order-free reduction (see kmeans.h). */
#include "retriever/kmeans.h"

#include "common/error.h"
#include "common/log.h"

#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* nearest centroid of rows [0, n) of x for sub-space s; best score into *obj (when not NULL) */
static void assign_sub(const dfm_kmeans_opts *o, uint32_t s, const float *cent, const float *cnorm, const float *x, size_t ld, size_t n,
                       float *buf, int32_t *assign, double *obj) {
    const uint32_t dim = o->dim, k = o->k;
    float *best = buf + (size_t)n * DFM_KMEANS_TILE;
    for (size_t i = 0; i < n; i++) {
        best[i] = -FLT_MAX;
        assign[i * o->nsub + s] = 0;
    }
    for (uint32_t t0 = 0; t0 < k; t0 += DFM_KMEANS_TILE) {
        uint32_t T = k - t0 < DFM_KMEANS_TILE ? k - t0 : DFM_KMEANS_TILE;
        const float *c = cent + ((size_t)s * k + t0) * dim;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)T, (int)dim, 1.0f, x + (size_t)s * dim, (int)ld, c, (int)dim, 0.0f,
                    buf, (int)T);
        const float *cn = cnorm + (size_t)s * k + t0;
#pragma omp parallel for schedule(static) if (n * T > 65536)
        for (size_t i = 0; i < n; i++) {
            const float *row = buf + i * T;
            float b = best[i];
            int32_t bi = assign[i * o->nsub + s];
            for (uint32_t j = 0; j < T; j++) {
                /* L2: |x - c|^2 = |x|^2 - (2 x.c - |c|^2); the largest score is the nearest */
                float v = o->ip ? row[j] : 2.0f * row[j] - cn[j];
                if (v > b) b = v, bi = (int32_t)(t0 + j); /* strict: ties keep the lowest centroid */
            }
            best[i] = b;
            assign[i * o->nsub + s] = bi;
        }
    }
    if (obj) {
        double sum = 0;
        for (size_t i = 0; i < n; i++) {
            double v = best[i];
            if (!o->ip) {
                double xn = 0;
                for (uint32_t t = 0; t < dim; t++) xn += (double)x[i * ld + (size_t)s * dim + t] * x[i * ld + (size_t)s * dim + t];
                v = xn - v;
            }
            sum += v;
        }
        *obj += sum;
    }
}

static void centroid_norms(const dfm_kmeans_opts *o, const float *cent, float *cnorm) {
    size_t nc = (size_t)o->nsub * o->k;
    for (size_t c = 0; c < nc; c++) {
        double s = 0;
        for (uint32_t t = 0; t < o->dim; t++) s += (double)cent[c * o->dim + t] * cent[c * o->dim + t];
        cnorm[c] = (float)s;
    }
}

#define ROWS_PER_CALL 1024 /* rows per SGEMM inside dfm_kmeans_assign */

static int assign_rows(const dfm_kmeans_opts *o, const float *cent, const float *cnorm, const float *x, size_t ld, uint64_t n, int32_t *assign,
                       double *obj, dfm_work *w) {
    size_t rows = n < ROWS_PER_CALL ? (size_t)n : ROWS_PER_CALL;
    float *buf = malloc(((size_t)rows * DFM_KMEANS_TILE + rows + 1) * sizeof *buf);
    if (!buf) return DFM_FAIL(DFM_ENOMEM, "no memory for k-means distances");
    for (uint64_t i0 = 0; i0 < n; i0 += ROWS_PER_CALL) {
        size_t nr = n - i0 < ROWS_PER_CALL ? (size_t)(n - i0) : ROWS_PER_CALL;
        for (uint32_t s = 0; s < o->nsub; s++) assign_sub(o, s, cent, cnorm, x + i0 * ld, ld, nr, buf, assign + i0 * o->nsub, obj);
    }
    free(buf);
    if (w) {
        w->kmeans_distances += n * o->nsub * o->k;
        w->kmeans_flops += 2 * n * o->nsub * o->k * o->dim;
    }
    return DFM_OK;
}

int dfm_kmeans_assign(const dfm_kmeans_opts *o, const float *cent, const float *x, size_t ld, uint64_t n, int32_t *assign, dfm_work *w) {
    float *cnorm = malloc(((size_t)o->nsub * o->k + 1) * sizeof *cnorm);
    if (!cnorm) return DFM_FAIL(DFM_ENOMEM, "no memory");
    centroid_norms(o, cent, cnorm);
    int rc = assign_rows(o, cent, cnorm, x, ld, n, assign, NULL, w);
    free(cnorm);
    return rc;
}

int dfm_kmeans_gather_rows(const dfm_mpi *m, const float *x, size_t ld, uint64_t g0, uint64_t n_local, const uint64_t *picks, size_t npick,
                           size_t width, float *out, dfm_work *w) {
    memset(out, 0, npick * width * sizeof *out);
    for (size_t i = 0; i < npick; i++)
        if (picks[i] >= g0 && picks[i] < g0 + n_local) memcpy(out + i * width, x + (picks[i] - g0) * ld, width * sizeof *out);
    /* bit-wise OR: exactly the owner's bits (an addition would turn -0.0 into +0.0 on some ranks only) */
    int rc = DFM_OK;
    for (size_t off = 0; !rc && off < npick * width; off += 1u << 28) {
        size_t part = npick * width - off < (1u << 28) ? npick * width - off : (1u << 28);
        rc = DFM_WORK_MPI(w, MPI_Allreduce(MPI_IN_PLACE, out + off, (int)part, MPI_UINT32_T, MPI_BOR, m->comm));
        dfm_work_ring(w, part * 4, m->size);
    }
    return rc;
}

/* the fixed-point scale 2^e: n_global points whose coordinates are at most maxabs sum to below 2^62 */
static double fixed_scale(float maxabs, uint64_t n_global) {
    if (!(maxabs > 0) || !n_global) return 1.0;
    int ex = 0;
    frexp((double)maxabs * (double)n_global, &ex); /* maxabs * n < 2^ex */
    int e = 62 - ex;
    if (e > 1000) e = 1000;
    return ldexp(1.0, e);
}

/* an empty centroid takes half of the largest (ties: the lowest index), pushed apart as FAISS does */
static uint32_t split_empty(const dfm_kmeans_opts *o, uint32_t s, float *cent, int64_t *cnt) {
    const uint32_t k = o->k, dim = o->dim;
    const float EPS = 1.0f / 1024.0f;
    int64_t *c = cnt + (size_t)s * k;
    float *cs = cent + (size_t)s * k * dim;
    uint32_t nsplit = 0;
    for (uint32_t ci = 0; ci < k; ci++) {
        if (c[ci] != 0) continue;
        uint32_t cj = 0;
        for (uint32_t j = 1; j < k; j++)
            if (c[j] > c[cj]) cj = j;
        memcpy(cs + (size_t)ci * dim, cs + (size_t)cj * dim, sizeof(float) * dim);
        for (uint32_t t = 0; t < dim; t++) {
            cs[(size_t)ci * dim + t] *= t % 2 == 0 ? 1 + EPS : 1 - EPS;
            cs[(size_t)cj * dim + t] *= t % 2 == 0 ? 1 - EPS : 1 + EPS;
        }
        c[ci] = c[cj] / 2;
        c[cj] -= c[ci];
        nsplit++;
    }
    return nsplit;
}

/* new centroids from the reduced fixed-point sums (the same integers on every rank) */
static uint32_t update_centroids(const dfm_kmeans_opts *o, const int64_t *acc, int64_t *cnt, double scale, float *cent) {
    const uint32_t dim = o->dim;
    size_t nc = (size_t)o->nsub * o->k;
    uint32_t nsplit = 0;
    for (size_t c = 0; c < nc; c++) {
        if (cnt[c] == 0) continue;
        for (uint32_t t = 0; t < dim; t++) cent[c * dim + t] = (float)((double)acc[c * dim + t] / scale / (double)cnt[c]);
    }
    for (uint32_t s = 0; s < o->nsub; s++) nsplit += split_empty(o, s, cent, cnt);
    if (o->spherical)
        for (size_t c = 0; c < nc; c++) {
            double nrm = 0;
            for (uint32_t t = 0; t < dim; t++) nrm += (double)cent[c * dim + t] * cent[c * dim + t];
            nrm = sqrt(nrm);
            if (nrm > 0)
                for (uint32_t t = 0; t < dim; t++) cent[c * dim + t] = (float)((double)cent[c * dim + t] / nrm);
        }
    return nsplit;
}

int dfm_kmeans_train(const dfm_mpi *m, const dfm_kmeans_opts *o, const float *x, size_t ld, const uint64_t *blk_rows, size_t nblk,
                     uint64_t n_global, float *cent, double *objective, dfm_work *w) {
    const uint32_t dim = o->dim, k = o->k;
    const size_t nc = (size_t)o->nsub * k, width = (size_t)o->nsub * dim;
    uint64_t n_local = 0, max_blk = 1;
    for (size_t b = 0; b < nblk; b++) {
        n_local += blk_rows[b];
        if (blk_rows[b] > max_blk) max_blk = blk_rows[b];
    }
    if (n_global < k) return DFM_FAIL(DFM_EARG, "k-means of %llu points into %u centroids. HINT: use a larger --train-sample", (unsigned long long)n_global, k);
    /* 1. the fixed-point scale, from the largest coordinate anywhere */
    float maxabs = 0;
    int finite = 1;
    for (uint64_t i = 0; i < n_local; i++)
        for (size_t t = 0; t < width; t++) {
            float a = fabsf(x[i * ld + t]);
            if (!isfinite(a)) finite = 0;
            else if (a > maxabs) maxabs = a;
        }
    int rc = finite ? DFM_OK : DFM_FAIL(DFM_EARG, "a training vector holds NaN or infinity. HINT: check the embeddings ('dfm verify RUN')");
    if ((rc = dfm_work_agree(w, m, rc))) return rc;
    rc = DFM_WORK_MPI(w, MPI_Allreduce(MPI_IN_PLACE, &maxabs, 1, MPI_FLOAT, MPI_MAX, m->comm));
    dfm_work_ring(w, sizeof maxabs, m->size);
    if (rc) return rc;
    const double scale = fixed_scale(maxabs, n_global);
    int64_t *acc = malloc((nc * dim + 1) * sizeof *acc), *cnt = malloc((nc + 1) * sizeof *cnt);
    float *cnorm = malloc((nc + 1) * sizeof *cnorm);
    int32_t *asg = malloc(((size_t)max_blk * o->nsub + 1) * sizeof *asg);
    rc = acc && cnt && cnorm && asg ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory for k-means of %u x %u centroids", o->nsub, k);
    rc = dfm_work_agree(w, m, rc);
    double obj = 0;
    for (uint32_t it = 0; !rc && it < o->niter; it++) {
        memset(acc, 0, nc * dim * sizeof *acc);
        memset(cnt, 0, nc * sizeof *cnt);
        centroid_norms(o, cent, cnorm);
        obj = 0;
        /* 2. assign block by block; sum in fixed point */
        const float *xb = x;
        for (size_t b = 0; !rc && b < nblk; b++) {
            rc = assign_rows(o, cent, cnorm, xb, ld, blk_rows[b], asg, &obj, w);
            for (uint64_t i = 0; !rc && i < blk_rows[b]; i++)
                for (uint32_t s = 0; s < o->nsub; s++) {
                    size_t c = (size_t)s * k + (size_t)asg[i * o->nsub + s];
                    const float *xs = xb + i * ld + (size_t)s * dim;
                    int64_t *a = acc + c * dim;
                    cnt[c]++;
                    for (uint32_t t = 0; t < dim; t++) a[t] += llrint((double)xs[t] * scale);
                }
            xb += blk_rows[b] * ld;
        }
        if ((rc = dfm_work_agree(w, m, rc))) break;
        /* 3. exact integer reduction, then the same update on every rank */
        for (size_t off = 0; !rc && off < nc * dim; off += 1u << 27) {
            size_t part = nc * dim - off < (1u << 27) ? nc * dim - off : (1u << 27);
            rc = DFM_WORK_MPI(w, MPI_Allreduce(MPI_IN_PLACE, acc + off, (int)part, MPI_INT64_T, MPI_SUM, m->comm));
            dfm_work_ring(w, part * 8, m->size);
        }
        if (!rc) rc = DFM_WORK_MPI(w, MPI_Allreduce(MPI_IN_PLACE, cnt, (int)nc, MPI_INT64_T, MPI_SUM, m->comm));
        if (!rc) rc = DFM_WORK_MPI(w, MPI_Allreduce(MPI_IN_PLACE, &obj, 1, MPI_DOUBLE, MPI_SUM, m->comm));
        dfm_work_ring(w, nc * 8 + 8, m->size);
        if (rc) break;
        uint32_t nsplit = update_centroids(o, acc, cnt, scale, cent);
        if (m->rank == 0)
            DFM_LOG_D("k-means %u x %u in %u dims, iteration %u: objective %.6g, %u empty centroid(s) split", o->nsub, k, dim, it + 1, obj, nsplit);
    }
    if (objective) *objective = obj;
    free(acc);
    free(cnt);
    free(cnorm);
    free(asg);
    return rc;
}
