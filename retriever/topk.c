#include "retriever/topk.h"

#include "common/error.h"
#include "common/log.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- ordering and merging ---- */

static _Thread_local uint32_t tl_metric; /* qsort has no context argument */

static int cmp_hit(const void *a, const void *b) {
    const dfm_hit *x = a, *y = b;
    if (dfm_hit_before(x, y, tl_metric)) return -1;
    if (dfm_hit_before(y, x, tl_metric)) return 1;
    return 0;
}

void dfm_hits_sort(dfm_hit *h, size_t n, uint32_t metric) {
    tl_metric = metric;
    qsort(h, n, sizeof *h, cmp_hit);
}

size_t dfm_hits_merge(const dfm_hit *const *lists, const size_t *lens, int nlists, uint32_t k, uint32_t metric, dfm_hit *out) {
    /* nlists is small (ranks x shards): a linear scan of the heads per output is simpler than a heap */
    size_t pos_stack[64], *pos = nlists <= 64 ? pos_stack : calloc((size_t)nlists, sizeof *pos);
    if (!pos) return 0;
    memset(pos, 0, sizeof(size_t) * (size_t)nlists);
    size_t n = 0;
    while (n < k) {
        int best = -1;
        for (int l = 0; l < nlists; l++) {
            if (pos[l] >= lens[l]) continue;
            if (best < 0 || dfm_hit_before(&lists[l][pos[l]], &lists[best][pos[best]], metric)) best = l;
        }
        if (best < 0) break;
        out[n++] = lists[best][pos[best]++];
    }
    if (pos != pos_stack) free(pos);
    return n;
}

uint32_t dfm_hits_to_row(const dfm_hit *h, size_t n, uint32_t k, int64_t *ids, float *scores, uint64_t *mask) {
    *mask = 0;
    uint32_t pad = 0;
    for (uint32_t j = 0; j < k; j++) {
        if (j < n) {
            ids[j] = h[j].id;
            scores[j] = h[j].score;
            *mask |= 1ull << j;
        } else {
            ids[j] = -1;
            scores[j] = 0.0f;
            pad++;
        }
    }
    return pad;
}

float dfm_exact_score(const float *x, const float *y, uint32_t dim, uint32_t metric) {
    /* four fixed lanes (vectorisable, and the same order on every machine), combined pairwise */
    double a[4] = {0, 0, 0, 0};
    uint32_t i = 0, d4 = dim & ~3u;
    if (metric == DFM_METRIC_IP) {
        for (; i < d4; i += 4)
            for (int l = 0; l < 4; l++) a[l] += (double)x[i + l] * (double)y[i + l];
        for (; i < dim; i++) a[0] += (double)x[i] * (double)y[i];
    } else {
        for (; i < d4; i += 4)
            for (int l = 0; l < 4; l++) {
                double d = (double)x[i + l] - (double)y[i + l];
                a[l] += d * d;
            }
        for (; i < dim; i++) {
            double d = (double)x[i] - (double)y[i];
            a[0] += d * d;
        }
    }
    return (float)((a[0] + a[1]) + (a[2] + a[3]));
}

/* ---- corpus access ---- */

int dfm_vec_source_matrix_rows(void *ctx, uint64_t first, uint64_t n, float *out) {
    const dfm_matrix *m = ctx;
    if (first + n > m->n || first + n < first)
        return DFM_FAIL(DFM_ERANGE, "rows [%llu, +%llu) outside a matrix of %llu rows", (unsigned long long)first, (unsigned long long)n,
                        (unsigned long long)m->n);
    memcpy(out, m->data + first * m->dim, sizeof(float) * m->dim * n);
    return DFM_OK;
}

const dfm_chunk_meta *dfm_chunk_source_array_meta(void *ctx, uint64_t id) { return (const dfm_chunk_meta *)ctx + id; }

int dfm_exclude_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "none")) return DFM_EXCLUDE_NONE;
    if (!strcmp(s, "self")) return DFM_EXCLUDE_SELF;
    if (!strcmp(s, "sequence")) return DFM_EXCLUDE_SEQUENCE;
    if (!strcmp(s, "document")) return DFM_EXCLUDE_DOCUMENT;
    return -1;
}

const char *dfm_exclude_name(uint32_t policy) {
    static const char *names[] = {"none", "self", "sequence", "document"};
    return policy <= DFM_EXCLUDE_DOCUMENT ? names[policy] : "?";
}

static int seq_start(const dfm_chunk_source *cs, uint64_t i, const dfm_chunk_meta *m) {
    return (cs->chunks_per_seq && i % cs->chunks_per_seq == 0) || (m->flags & DFM_CHUNK_SEQ_START);
}

int dfm_query_build(const dfm_vec_source *vs, const dfm_chunk_source *cs, uint64_t i, uint32_t window, dfm_query *q, float *vec) {
    if (i >= cs->n_chunks) return DFM_FAIL(DFM_ERANGE, "query chunk %llu outside the corpus of %llu chunks", (unsigned long long)i,
                                          (unsigned long long)cs->n_chunks);
    if (window == 0) return DFM_FAIL(DFM_EARG, "--query-window 0: the window must be at least 1 chunk");
    const dfm_chunk_meta *mi = cs->meta(cs->ctx, i);
    if (mi->n_valid == 0 || seq_start(cs, i, mi)) return 0;
    /* sources: up to W chunks before i, stopping at the sequence start */
    uint64_t first = i;
    for (uint32_t w = 0; w < window && first > 0; w++) {
        first--;
        if (seq_start(cs, first, cs->meta(cs->ctx, first))) break;
    }
    uint32_t dim = vs->dim, used = 0;
    if (window == 1) {
        if (cs->meta(cs->ctx, first)->n_valid == 0) return 0;
        DFM_TRY(vs->rows(vs->ctx, first, 1, vec));
        used = 1;
    } else {
        double acc_stack[1024], *acc = dim <= 1024 ? acc_stack : calloc(dim, sizeof *acc);
        if (!acc) return DFM_FAIL(DFM_ENOMEM, "no memory");
        memset(acc, 0, sizeof(double) * dim);
        int rc = DFM_OK;
        for (uint64_t j = first; j < i && !rc; j++) {
            if (cs->meta(cs->ctx, j)->n_valid == 0) continue;
            rc = vs->rows(vs->ctx, j, 1, vec);
            for (uint32_t t = 0; t < dim && !rc; t++) acc[t] += vec[t];
            used++;
        }
        if (!rc && used) {
            double nrm = 0;
            for (uint32_t t = 0; t < dim; t++) nrm += acc[t] * acc[t];
            nrm = sqrt(nrm);
            for (uint32_t t = 0; t < dim; t++) vec[t] = (float)(nrm > 0 ? acc[t] / nrm : 0.0);
        }
        if (acc != acc_stack) free(acc);
        DFM_TRY(rc);
        if (!used) return 0;
    }
    q->chunk_id = (int64_t)i;
    q->src_first = (int64_t)first;
    q->doc_lo = cs->meta(cs->ctx, first)->doc_first;
    q->doc_hi = mi->doc_last;
    return 1;
}

int dfm_excluded(uint32_t policy, const dfm_query *q, uint64_t c, const dfm_chunk_meta *cm, uint32_t chunks_per_seq) {
    if (cm->n_valid == 0) return 1;
    int64_t ci = (int64_t)c;
    switch (policy) {
    case DFM_EXCLUDE_NONE: return 0;
    case DFM_EXCLUDE_SELF: return ci >= q->src_first && ci <= q->chunk_id;
    case DFM_EXCLUDE_SEQUENCE:
        if (!chunks_per_seq) return ci >= q->src_first && ci <= q->chunk_id;
        return c / chunks_per_seq == (uint64_t)q->chunk_id / chunks_per_seq;
    case DFM_EXCLUDE_DOCUMENT:
        if (ci >= q->src_first && ci <= q->chunk_id) return 1;
        return cm->doc_first <= q->doc_hi && cm->doc_last >= q->doc_lo;
    }
    return 1;
}

/* The ids [*lo, *hi] that can hold every id q excludes under policy (dfm_excluded decides each). */
static void excluded_span(uint32_t policy, const dfm_query *q, const dfm_chunk_source *cs, uint64_t *lo, uint64_t *hi) {
    uint64_t a = (uint64_t)q->src_first, z = (uint64_t)q->chunk_id, cps = cs->chunks_per_seq;
    if (policy == DFM_EXCLUDE_SEQUENCE && cps) {
        a = z / cps * cps;
        z = a + cps - 1 < cs->n_chunks ? a + cps - 1 : cs->n_chunks - 1;
    } else if (policy == DFM_EXCLUDE_DOCUMENT) {
        /* documents run in chunk-id order; padding chunks carry no document and are stepped over */
        for (const dfm_chunk_meta *m; a > 0 && ((m = cs->meta(cs->ctx, a - 1))->n_valid == 0 || m->doc_last >= q->doc_lo);) a--;
        for (const dfm_chunk_meta *m; z + 1 < cs->n_chunks && ((m = cs->meta(cs->ctx, z + 1))->n_valid == 0 || m->doc_first <= q->doc_hi);) z++;
    }
    *lo = a;
    *hi = z;
}

int dfm_count_excluded(const dfm_search_params *p, const dfm_query *q, const float *qv, const dfm_hit *kept, uint32_t nkept,
                       const dfm_vec_source *vs, const dfm_chunk_source *cs, uint64_t *count) {
    *count = 0;
    if (p->exclude == DFM_EXCLUDE_NONE) return DFM_OK; /* only padding, which no index holds */
    uint64_t lo, hi;
    excluded_span(p->exclude, q, cs, &lo, &hi);
    float *vbuf = NULL;
    int rc = DFM_OK;
    for (uint64_t c = lo; c <= hi && !rc; c++) {
        const dfm_chunk_meta *cm = cs->meta(cs->ctx, c);
        if (cm->n_valid == 0 || !dfm_excluded(p->exclude, q, c, cm, cs->chunks_per_seq)) continue;
        const float *row = vs->row ? vs->row(vs->ctx, c) : NULL;
        if (!row) {
            if (!vbuf && !(vbuf = malloc(sizeof(float) * vs->dim))) {
                rc = DFM_FAIL(DFM_ENOMEM, "no memory");
                break;
            }
            if ((rc = vs->rows(vs->ctx, c, 1, vbuf))) break;
            row = vbuf;
        }
        dfm_hit h = {(int64_t)c, dfm_exact_score(qv, row, vs->dim, p->metric), 0};
        if (nkept < p->k || dfm_hit_before(&h, &kept[p->k - 1], p->metric)) (*count)++;
    }
    free(vbuf);
    return rc;
}

/* ---- one shard's top-K ---- */

/* One query's candidates: drop excluded ids, rescore exactly, sort, and decide whether the search was
 * deep enough (*again = 0: result written to out / *n_out) or must be repeated deeper (*again = 1). */
static int filter_one(const dfm_shard_searcher *s, const dfm_search_params *p, const dfm_query *q, const float *qv, const int64_t *L,
                      const float *D, size_t kp, const dfm_vec_source *vs, const dfm_chunk_source *cs, dfm_hit *surv, float *vbuf,
                      size_t *m_out, size_t *ns_out, size_t *nexcl_out, size_t *nscored, dfm_hit *out, uint32_t *n_out, int8_t *again) {
    const uint32_t k = dfm_search_cap(p), dim = vs->dim;
    size_t m = 0, ns = 0, nexcl = 0;
    float last = 0;
    *again = 0;
    for (size_t t = 0; t < kp; t++) {
        int64_t id = L[t];
        if (id < 0) continue;
        m++;
        last = D[t];
        if ((uint64_t)id >= cs->n_chunks)
            return DFM_FAIL(DFM_EMISMATCH, "the index returned id %lld but the corpus has %llu chunks. HINT: the index belongs to another run; re-run 'dfm index'",
                            (long long)id, (unsigned long long)cs->n_chunks);
        if (dfm_excluded(p->exclude, q, (uint64_t)id, cs->meta(cs->ctx, (uint64_t)id), cs->chunks_per_seq)) {
            nexcl++;
            continue;
        }
        surv[ns].id = id;
        surv[ns].score = D[t];
        surv[ns].aux = 0;
        ns++;
    }
    *m_out = m;
    *ns_out = ns;
    *nexcl_out = nexcl;
    /* exact scores for every survivor of an exact index (they decide the order); an approximate one is
     * ordered by its own scores here, and the query's owner rescores only the global best k + margin */
    if (p->approx) dfm_hits_sort(surv, ns, p->metric);
    size_t nscore = p->approx ? 0 : ns;
    *nscored = nscore;
    for (size_t j = 0; j < nscore; j++) {
        const float *row = vs->row ? vs->row(vs->ctx, (uint64_t)surv[j].id) : NULL;
        if (!row) {
            DFM_TRY(vs->rows(vs->ctx, (uint64_t)surv[j].id, 1, vbuf));
            row = vbuf;
        }
        surv[j].aux = dfm_exact_score(qv, row, dim, p->metric);
        if (!p->approx) surv[j].score = surv[j].aux;
    }
    if (!p->approx) dfm_hits_sort(surv, ns, p->metric);
    int done = m < kp || kp >= s->ntotal; /* exhausted: nothing more to fetch */
    if (!done && ns >= k) {
        if (p->approx) {
            /* ordered by the index's own (deterministic) scores: a strict gap is enough */
            float sk = surv[k - 1].score;
            done = p->metric == DFM_METRIC_IP ? sk > last : sk < last;
        } else if (!s->exact_scores) {
            done = 1;
        } else {
            /* ties and float noise: the k-th survivor must beat anything not fetched, whose index
             * score is no better than `last`, by more than the index's rounding error */
            double qn = 0;
            for (uint32_t t = 0; t < dim; t++) qn += (double)qv[t] * qv[t];
            double eps = (1.0 + fabs((double)last) + qn) * (1e-4 + 2.4e-7 * dim);
            double sk = surv[k - 1].score;
            done = p->metric == DFM_METRIC_IP ? sk > (double)last + eps : sk < (double)last - eps;
        }
    }
    if (!done) {
        *again = 1;
        return DFM_OK;
    }
    size_t keep = ns < k ? ns : k;
    memcpy(out, surv, keep * sizeof *surv);
    *n_out = (uint32_t)keep;
    return DFM_OK;
}

/* the codes one search of queries pend[0..np) compares in shard s */
static uint64_t scanned_by(const dfm_shard_searcher *s, const dfm_probes *pr, const size_t *pend, size_t np, size_t nsearch) {
    if (pr) {
        uint64_t n = 0;
        for (size_t j = 0; j < np; j++)
            for (size_t t = 0; t < pr->nprobe; t++) {
                int64_t l = pr->lists[pend[j] * pr->nprobe + t];
                if (l >= 0) n += s->list_sizes[l];
            }
        return n;
    }
    return s->scans_all ? (uint64_t)nsearch * s->ntotal : 0;
}

int dfm_shard_topk(const dfm_shard_searcher *s, const dfm_search_params *p, const dfm_probes *pr, const dfm_query *qs, const float *qv,
                   size_t nq, const dfm_vec_source *vs, const dfm_chunk_source *cs, dfm_hit *out, uint32_t *n_out, dfm_search_counts *c) {
    const uint32_t k = dfm_search_cap(p), dim = vs->dim;
    for (size_t q = 0; q < nq; q++) n_out[q] = 0;
    if (nq == 0 || s->ntotal == 0) return DFM_OK;
    if (!s->search_assigned || !s->list_sizes) pr = NULL; /* this shard assigns its queries itself */
    const size_t npr = pr ? pr->nprobe : 0;
    c->shard_searches += nq;
    size_t kp = (size_t)k + p->margin;
    if (kp > s->ntotal) kp = (size_t)s->ntotal;
    size_t *pend = malloc(nq * sizeof *pend);
    float *qsub = NULL, *dist = NULL, *vbuf = malloc(sizeof(float) * dim), *dsub = NULL;
    int64_t *lab = NULL, *lsub = NULL;
    int8_t *again = malloc(nq);
    int rc = (pend && vbuf && again) ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc && pr && (!(lsub = malloc(nq * npr * sizeof *lsub)) || !(dsub = malloc(nq * npr * sizeof *dsub))))
        rc = DFM_FAIL(DFM_ENOMEM, "no memory for %zu x %zu probe lists", nq, npr);
    size_t npend = nq;
    for (size_t q = 0; q < nq && !rc; q++) pend[q] = q;
    while (!rc && npend) {
        /* FAISS computes small batches (< 20 queries) with other float code than large ones; a
         * re-search of a few queries is padded (repeating the last query) so that every query is
         * scored the same way whatever the batch, hence whatever the number of ranks. A search with
         * given probe lists computes each query on its own and needs no padding. */
        size_t nsearch = !pr && npend < DFM_MIN_SEARCH_BATCH ? DFM_MIN_SEARCH_BATCH : npend;
        float *nq_sub = realloc(qsub, nsearch * dim * sizeof *qsub);
        if (nq_sub) qsub = nq_sub;
        float *nd = realloc(dist, nsearch * kp * sizeof *dist);
        if (nd) dist = nd;
        int64_t *nl = realloc(lab, nsearch * kp * sizeof *lab);
        if (nl) lab = nl;
        if (!nq_sub || !nd || !nl) {
            rc = DFM_FAIL(DFM_ENOMEM, "no memory for %zu queries x k' %zu", nsearch, kp);
            break;
        }
        for (size_t j = 0; j < npend; j++) memcpy(qsub + j * dim, qv + pend[j] * dim, sizeof(float) * dim);
        for (size_t j = npend; j < nsearch; j++) memcpy(qsub + j * dim, qsub + (npend - 1) * dim, sizeof(float) * dim);
        uint64_t scan0 = !pr && s->scanned ? s->scanned(s->ctx) : 0;
        double t_search = dfm_now();
        if (pr) {
            /* the deeper re-search reuses the probe lists: no query is assigned twice */
            for (size_t j = 0; j < npend; j++) {
                memcpy(lsub + j * npr, pr->lists + pend[j] * npr, npr * sizeof *lsub);
                memcpy(dsub + j * npr, pr->dis + pend[j] * npr, npr * sizeof *dsub);
            }
            rc = s->search_assigned(s->actx, npend, qsub, kp, npr, lsub, dsub, dist, lab);
        } else {
            rc = s->search(s->ctx, nsearch, qsub, kp, dist, lab);
        }
        c->search_s += dfm_now() - t_search;
        if (rc) break;
        c->codes_scanned += !pr && s->scanned ? s->scanned(s->ctx) - scan0 : scanned_by(s, pr, pend, npend, nsearch);
        /* filter, rescore and decide per query, in parallel (callbacks only read mapped files) */
        uint64_t cand = 0, excl = 0, scored = 0;
        int prc = DFM_OK;
        char errmsg[512] = "";
        const size_t np_ = npend, kp_ = kp;
#pragma omp parallel reduction(+ : cand, excl, scored) if (np_ > 16)
        {
            dfm_hit *ts = malloc(kp_ * sizeof *ts);
            float *tv = malloc(sizeof(float) * dim);
            if (!ts || !tv) {
#pragma omp critical(dfm_topk_err)
                if (!prc) {
                    prc = DFM_ENOMEM;
                    snprintf(errmsg, sizeof errmsg, "no memory for k' = %zu", kp_);
                }
            }
#pragma omp for schedule(dynamic, 16)
            for (size_t j = 0; j < np_; j++) {
                if (prc) continue;
                size_t m = 0, ns = 0, nexcl = 0, nsc = 0;
                int r = filter_one(s, p, &qs[pend[j]], qv + pend[j] * dim, lab + j * kp_, dist + j * kp_, kp_, vs, cs, ts, tv, &m, &ns, &nexcl,
                                   &nsc, out + pend[j] * k, &n_out[pend[j]], &again[j]);
                cand += m;
                scored += nsc;
                if (!again[j]) excl += nexcl;
                if (r) {
#pragma omp critical(dfm_topk_err)
                    if (!prc) {
                        prc = r;
                        snprintf(errmsg, sizeof errmsg, "%s", dfm_last_error());
                    }
                }
            }
            free(ts);
            free(tv);
        }
        if (prc) {
            rc = DFM_FAIL(prc, "%s", errmsg);
            break;
        }
        c->shard_candidates += cand;
        c->shard_excluded += excl;
        c->exact_scores += scored;
        size_t newpend = 0;
        for (size_t j = 0; j < npend; j++)
            if (again[j]) pend[newpend++] = pend[j];
        if (rc || !newpend) break;
        c->researches += newpend;
        npend = newpend;
        kp = kp * 2 > s->ntotal ? (size_t)s->ntotal : kp * 2;
    }
    free(pend);
    free(qsub);
    free(dist);
    free(lab);
    free(lsub);
    free(dsub);
    free(vbuf);
    free(again);
    return rc;
}

/* ---- brute force ---- */

/* keep the best kp of a query in a binary heap whose root is the worst kept */
static int worse(float a, int64_t ia, float b, int64_t ib, uint32_t metric) {
    dfm_hit x = {ia, a, 0}, y = {ib, b, 0};
    return dfm_hit_before(&y, &x, metric);
}

static void heap_push(float *hd, int64_t *hl, size_t *n, size_t cap, float d, int64_t l, uint32_t metric) {
    if (*n == cap) {
        if (!worse(hd[0], hl[0], d, l, metric)) return; /* not better than the worst kept */
        /* replace root, sift down */
        size_t i = 0;
        for (;;) {
            size_t a = 2 * i + 1, b = a + 1, w = i;
            float wd = d;
            int64_t wl = l;
            if (a < *n && worse(hd[a], hl[a], wd, wl, metric)) { w = a; wd = hd[a]; wl = hl[a]; }
            if (b < *n && worse(hd[b], hl[b], wd, wl, metric)) { w = b; }
            if (w == i) break;
            hd[i] = hd[w];
            hl[i] = hl[w];
            i = w;
        }
        hd[i] = d;
        hl[i] = l;
        return;
    }
    size_t i = (*n)++;
    while (i > 0) {
        size_t par = (i - 1) / 2;
        if (!worse(d, l, hd[par], hl[par], metric)) break;
        hd[i] = hd[par];
        hl[i] = hl[par];
        i = par;
    }
    hd[i] = d;
    hl[i] = l;
}

int dfm_bf_search(void *ctx, size_t nq, const float *q, size_t kp, float *dist, int64_t *labels) {
    const dfm_bf_ctx *b = ctx;
    const uint32_t dim = b->vs->dim;
    const size_t blk = 4096;
    float *vecs = malloc(blk * dim * sizeof *vecs), *sc = malloc(blk * nq * sizeof *sc), *qn = malloc(nq * sizeof *qn);
    size_t *cnt = calloc(nq, sizeof *cnt);
    int rc = (vecs && sc && qn && cnt) ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory for brute-force search");
    for (size_t i = 0; !rc && i < nq; i++) {
        double s = 0;
        for (uint32_t t = 0; t < dim; t++) s += (double)q[i * dim + t] * q[i * dim + t];
        qn[i] = (float)s;
    }
    for (uint64_t off = 0; !rc && off < b->n; off += blk) {
        size_t nb = b->n - off < blk ? (size_t)(b->n - off) : blk;
        rc = b->vs->rows(b->vs->ctx, b->first + off, nb, vecs);
        if (rc) break;
        /* sc[nb x nq] = vecs . q^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)nq, (int)dim, 1.0f, vecs, (int)dim, q, (int)dim, 0.0f, sc,
                    (int)nq);
        for (size_t r = 0; r < nb; r++) {
            float vn = 0;
            if (b->metric == DFM_METRIC_L2)
                for (uint32_t t = 0; t < dim; t++) vn += vecs[r * dim + t] * vecs[r * dim + t];
            for (size_t i = 0; i < nq; i++) {
                float s = sc[r * nq + i];
                if (b->metric == DFM_METRIC_L2) s = qn[i] + vn - 2 * s;
                heap_push(dist + i * kp, labels + i * kp, &cnt[i], kp, s, (int64_t)(b->first + off + r), b->metric);
            }
        }
    }
    if (!rc) {
        dfm_hit *tmp = malloc(kp * sizeof *tmp);
        if (!tmp) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        for (size_t i = 0; !rc && i < nq; i++) {
            for (size_t j = 0; j < cnt[i]; j++) tmp[j] = (dfm_hit){labels[i * kp + j], dist[i * kp + j], 0};
            dfm_hits_sort(tmp, cnt[i], b->metric);
            for (size_t j = 0; j < kp; j++) {
                labels[i * kp + j] = j < cnt[i] ? tmp[j].id : -1;
                dist[i * kp + j] = j < cnt[i] ? tmp[j].score : 0.0f;
            }
        }
        free(tmp);
    }
    free(vecs);
    free(sc);
    free(qn);
    free(cnt);
    return rc;
}
