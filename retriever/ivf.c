/* ivf.c — FAISS IVF specifics through the C API (see ivf.h). */
#include "retriever/ivf.h"

#include "common/error.h"
#include "retriever/ivf_lists_kind.h"
#include "retriever/topk.h"

#include <faiss/c_api/IndexFlat_c.h>
#include <faiss/c_api/error_c.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dfm_ivf_open(FaissIndex *idx, dfm_ivf *v) {
    memset(v, 0, sizeof *v);
    FaissIndexIVF *ivf = faiss_IndexIVF_cast(idx);
    if (!ivf) return DFM_OK;
    /* never route an IVF without array lists and a list scanner to search_preassigned (fast-scan crashes there) */
    if (!dfm_ivf_plain_lists(ivf)) return DFM_OK;
    FaissIndex *q = faiss_IndexIVF_quantizer(ivf);
    if (!q || !faiss_IndexFlat_cast(q) || faiss_IndexIVF_quantizer_trains_alone(ivf) != 0) return DFM_OK;
    uint64_t nlist = (uint64_t)faiss_IndexIVF_nlist(ivf);
    if ((uint64_t)faiss_Index_ntotal(q) != nlist) return DFM_OK; /* untrained */
    v->list_sizes = malloc((nlist + 1) * sizeof *v->list_sizes);
    if (!v->list_sizes) return DFM_FAIL(DFM_ENOMEM, "no memory for %llu list sizes", (unsigned long long)nlist);
    for (uint64_t l = 0; l < nlist; l++) v->list_sizes[l] = faiss_IndexIVF_get_list_size(ivf, (size_t)l);
    v->ivf = ivf, v->quantizer = q, v->nlist = nlist;
    return DFM_OK;
}

void dfm_ivf_close(dfm_ivf *v) {
    free(v->list_sizes);
    memset(v, 0, sizeof *v);
}

size_t dfm_ivf_nprobe(const dfm_ivf *v) {
    size_t np = faiss_IndexIVF_nprobe(v->ivf);
    return np < v->nlist ? np : (size_t)v->nlist;
}

int dfm_ivf_assign(const dfm_ivf *v, size_t nq, const float *q, size_t nprobe, int64_t *lists, float *dis) {
    if (nq == 0) return DFM_OK;
    if (nq >= DFM_MIN_SEARCH_BATCH)
        return DFM_FAISS_CHECK(faiss_Index_search(v->quantizer, (idx_t)nq, q, (idx_t)nprobe, dis, (idx_t *)lists), "assigning queries to lists");
    /* a short batch repeats its last query up to DFM_MIN_SEARCH_BATCH: the same float path as a long one */
    const int d = faiss_Index_d(v->quantizer);
    const size_t nb = DFM_MIN_SEARCH_BATCH;
    float *qb = malloc(nb * (size_t)d * sizeof *qb), *db = malloc(nb * nprobe * sizeof *db);
    int64_t *lb = malloc(nb * nprobe * sizeof *lb);
    int rc = qb && db && lb ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) {
        memcpy(qb, q, nq * (size_t)d * sizeof *qb);
        for (size_t j = nq; j < nb; j++) memcpy(qb + j * (size_t)d, q + (nq - 1) * (size_t)d, (size_t)d * sizeof *qb);
        rc = DFM_FAISS_CHECK(faiss_Index_search(v->quantizer, (idx_t)nb, qb, (idx_t)nprobe, db, (idx_t *)lb), "assigning queries to lists");
    }
    if (!rc) {
        memcpy(lists, lb, nq * nprobe * sizeof *lists);
        memcpy(dis, db, nq * nprobe * sizeof *dis);
    }
    free(qb);
    free(db);
    free(lb);
    return rc;
}

int dfm_ivf_search_assigned(void *ctx, size_t nq, const float *q, size_t kp, size_t nprobe, const int64_t *lists, const float *dis,
                            float *dist, int64_t *labels) {
    const dfm_ivf *v = ctx;
    if (nq == 0) return DFM_OK;
    if (faiss_IndexIVF_nprobe(v->ivf) != nprobe) faiss_IndexIVF_set_nprobe(v->ivf, nprobe);
    const size_t d = (size_t)faiss_Index_d((FaissIndex *)v->ivf);
    int nt = omp_get_max_threads();
    if ((size_t)nt > nq) nt = (int)nq;
    int rc = DFM_OK;
    char msg[300] = "";
    /* FAISS's search() parallelises the same way: slices of queries, search_preassigned on each */
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int t = 0; t < nt; t++) {
        size_t i0 = nq * (size_t)t / (size_t)nt, i1 = nq * (size_t)(t + 1) / (size_t)nt;
        if (i1 > i0 && faiss_IndexIVF_search_preassigned(v->ivf, (idx_t)(i1 - i0), q + i0 * d, (idx_t)kp, (const idx_t *)lists + i0 * nprobe,
                                                         dis + i0 * nprobe, dist + i0 * kp, (idx_t *)labels + i0 * kp, 0) != 0) {
#pragma omp critical(dfm_ivf_err)
            if (!rc) { /* FAISS keeps its last error per thread */
                rc = DFM_EFAISS;
                snprintf(msg, sizeof msg, "%s", faiss_get_last_error() ? faiss_get_last_error() : "(no message)");
            }
        }
    }
    if (!rc) return DFM_OK;
    char *nl = strchr(msg, '\n');
    if (nl) *nl = 0;
    return DFM_FAIL(DFM_EFAISS, "FAISS failed searching the index's probe lists: %s", msg);
}

uint64_t dfm_ivf_stats_scanned(void *ctx) {
    (void)ctx;
    FaissIndexIVFStats *st = faiss_get_indexIVF_stats();
    return st ? (uint64_t)st->ndis : 0;
}

/* ---- a trained index from codebooks trained outside FAISS ---- */

static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

int dfm_ivf_encoding(const dfm_index_plan *plan, uint32_t dim, char *kind, uint32_t *pq_m, uint32_t *pq_nbits) {
    *kind = 0, *pq_m = *pq_nbits = 0;
    FaissIndex *idx = NULL;
    DFM_TRY(dfm_index_create(plan, dim, &idx));
    int rc = DFM_OK;
    FaissIndexIVF *ivf = faiss_IndexIVF_cast(idx);
    FaissIndex *q = ivf ? faiss_IndexIVF_quantizer(ivf) : NULL;
    uint8_t *buf = NULL;
    size_t n = 0;
    /* an untrained IVF with a flat quantiser (dfm_ivf_open wants a trained one) */
    if (!rc && ivf && q && faiss_IndexFlat_cast(q) && faiss_IndexIVF_quantizer_trains_alone(ivf) == 0) rc = dfm_index_to_buffer(idx, &buf, &n);
    if (!rc && buf && n >= 4) {
        *kind = !memcmp(buf, "IwFl", 4) ? 'F' : !memcmp(buf, "IwPQ", 4) ? 'P' : 'O';
        /* IwPQ ends with: pq d, M, nbits (size_t each), the centroid vector, 32 bytes of empty lists */
        if (*kind == 'P' && n > 32 + 32) {
            /* from the end: the centroids are d * 2^nbits floats, after d, M, nbits and their count */
            for (uint32_t nb = 1; nb <= 16; nb++) {
                uint64_t ksub_d = (uint64_t)dim << nb;
                if (n < 32 + 32 + ksub_d * 4) break;
                const uint8_t *c = buf + n - 32 - ksub_d * 4 - 32;
                if (rd64(c) == dim && rd64(c + 16) == nb && rd64(c + 24) == ksub_d && rd64(c + 8) > 0 && dim % rd64(c + 8) == 0) {
                    *pq_m = (uint32_t)rd64(c + 8), *pq_nbits = nb;
                    break;
                }
            }
            if (!*pq_m) *kind = 'O'; /* not the layout dfm_ivf_trained patches: FAISS trains it */
        }
    }
    free(buf);
    faiss_Index_free(idx);
    return rc;
}

/* ---- whole lists through the serialisation ---- */

#define EMPTY_LISTS_BYTES 32 /* "ilar", nlist, code_size, "sprs", an empty size vector */

/* the trained empty index's list record, checked; its prefix length */
static int empty_tail(const uint8_t *tbuf, size_t tlen, uint64_t *nlist, uint64_t *code_size) {
    const uint8_t *t = tbuf + tlen - EMPTY_LISTS_BYTES;
    if (tlen < 40 + EMPTY_LISTS_BYTES || memcmp(t, "ilar", 4) || memcmp(t + 20, "sprs", 4) || rd64(t + 24) != 0)
        return DFM_FAIL(DFM_EINTERNAL, "the trained index does not end with FAISS 1.7.3's empty list record. HINT: build dfm against FAISS 1.7.3");
    *nlist = rd64(t + 4);
    *code_size = rd64(t + 12);
    return DFM_OK;
}

int dfm_ivf_lists_view(const uint8_t *buf, size_t n, const uint8_t *tbuf, size_t tlen, dfm_ivf_lists *lists) {
    memset(lists, 0, sizeof *lists);
    uint64_t nlist, cs;
    DFM_TRY(empty_tail(tbuf, tlen, &nlist, &cs));
    size_t at = tlen - EMPTY_LISTS_BYTES;
    /* the same prefix but the vector count (bytes 8..16 of the header) */
    if (n < at + 28 || memcmp(buf, tbuf, 8) || memcmp(buf + 16, tbuf + 16, at - 16) || memcmp(buf + at, "ilar", 4) || rd64(buf + at + 4) != nlist ||
        rd64(buf + at + 12) != cs)
        return DFM_FAIL(DFM_EINTERNAL, "a shard's serialisation does not start like the trained index's (FAISS 1.7.3 layout expected)");
    lists->sizes = calloc(nlist + 1, sizeof *lists->sizes);
    if (!lists->sizes) return DFM_FAIL(DFM_ENOMEM, "no memory");
    lists->nlist = nlist, lists->code_size = cs;
    const uint8_t *p = buf + at + 20, *end = buf + n;
    uint64_t cnt = rd64(p + 4);
    int full = !memcmp(p, "full", 4), ok = full || !memcmp(p, "sprs", 4);
    p += 12;
    if (ok && (full ? cnt != nlist : cnt % 2) ) ok = 0;
    if (ok && (uint64_t)(end - p) / 8 < cnt) ok = 0;
    for (uint64_t i = 0; ok && i < cnt; i++) {
        if (full) lists->sizes[i] = rd64(p + 8 * i);
        else if (i % 2 == 0) {
            uint64_t l = rd64(p + 8 * i);
            if (l >= nlist) ok = 0;
            else lists->sizes[l] = rd64(p + 8 * i + 8);
        }
    }
    p += 8 * cnt;
    uint64_t bytes = 0;
    for (uint64_t l = 0; ok && l < nlist; l++) {
        if (lists->sizes[l] > (uint64_t)(end - p) / (cs + 8)) ok = 0;
        lists->ntotal += lists->sizes[l];
        bytes += lists->sizes[l] * (cs + 8);
    }
    if (ok && bytes != (uint64_t)(end - p)) ok = 0; /* the lists are the last record */
    if (!ok) {
        free(lists->sizes);
        memset(lists, 0, sizeof *lists);
        return DFM_FAIL(DFM_EINTERNAL, "a shard's inverted lists are not FAISS 1.7.3's ArrayInvertedLists layout");
    }
    lists->data = p;
    return DFM_OK;
}

int dfm_ivf_from_lists(const uint8_t *tbuf, size_t tlen, uint64_t nlist, uint64_t code_size, const uint64_t *sizes, const uint8_t *data,
                       size_t data_len, FaissIndex **out) {
    *out = NULL;
    uint64_t tn, tcs, ntotal = 0, bytes = 0;
    DFM_TRY(empty_tail(tbuf, tlen, &tn, &tcs));
    for (uint64_t l = 0; l < nlist; l++) ntotal += sizes[l], bytes += sizes[l] * (code_size + 8);
    if (tn != nlist || tcs != code_size || bytes != data_len)
        return DFM_FAIL(DFM_EINTERNAL, "lists of %llu x %llu-byte codes (%llu bytes) for an index of %llu x %llu", (unsigned long long)nlist,
                        (unsigned long long)code_size, (unsigned long long)data_len, (unsigned long long)tn, (unsigned long long)tcs);
    size_t at = tlen - EMPTY_LISTS_BYTES, n = at + 32 + 8 * nlist + data_len;
    uint8_t *b = malloc(n);
    if (!b) return DFM_FAIL(DFM_ENOMEM, "no memory for a shard of %llu vectors", (unsigned long long)ntotal);
    memcpy(b, tbuf, at);
    memcpy(b + 8, &ntotal, 8);
    uint8_t *p = b + at;
    memcpy(p, "ilar", 4);
    memcpy(p + 4, &nlist, 8);
    memcpy(p + 12, &code_size, 8);
    memcpy(p + 20, "full", 4);
    memcpy(p + 24, &nlist, 8);
    memcpy(p + 32, sizes, 8 * nlist);
    memcpy(p + 32 + 8 * nlist, data, data_len);
    int rc = dfm_index_from_buffer(b, n, out);
    free(b);
    if (rc) return rc;
    FaissIndexIVF *ivf = faiss_IndexIVF_cast(*out);
    int ok = ivf && (uint64_t)faiss_Index_ntotal(*out) == ntotal;
    for (uint64_t l = 0; ok && l < nlist; l++) ok = faiss_IndexIVF_get_list_size(ivf, (size_t)l) == sizes[l];
    if (!ok) {
        faiss_Index_free(*out);
        *out = NULL;
        return DFM_FAIL(DFM_EINTERNAL, "a shard assembled from whole lists does not read back with its %llu vectors", (unsigned long long)ntotal);
    }
    return DFM_OK;
}

/* the "IwPQ" record of an untrained, empty IVF-PQ index: the offsets of is_trained and of the centroid
 * vector, each field around them checked */
static int pq_layout(const uint8_t *b, size_t n, uint32_t dim, uint64_t nlist, uint32_t M, uint32_t nbits, size_t *off_trained, size_t *off_cent) {
    uint64_t ncent = (uint64_t)dim << nbits;
    int32_t d32;
    if (n < 40 + 32 + 32 + ncent * 4 || memcmp(b, "IwPQ", 4)) return DFM_FAIL(DFM_EINTERNAL, "FAISS wrote no IwPQ record for an IVF-PQ index");
    memcpy(&d32, b + 4, 4);
    const uint8_t *t = b + n - 32; /* the empty lists: "ilar", nlist, code_size, "sprs", an empty size vector */
    const uint8_t *c = t - ncent * 4 - 32;
    int ok = d32 == (int32_t)dim && rd64(b + 8) == 0 && b[32] == 0 && !memcmp(t, "ilar", 4) && rd64(t + 4) == nlist && rd64(t + 12) == (M * nbits + 7) / 8 &&
             !memcmp(t + 20, "sprs", 4) && rd64(t + 24) == 0 && rd64(c) == dim && rd64(c + 8) == M && rd64(c + 16) == nbits && rd64(c + 24) == ncent;
    if (!ok)
        return DFM_FAIL(DFM_EINTERNAL, "the FAISS serialisation of an untrained IVF%llu,PQ%ux%u index (dim %u) is not the layout of FAISS 1.7.3. "
                                       "HINT: this FAISS build differs; build dfm against FAISS 1.7.3 (scripts/deps.sh)",
                        (unsigned long long)nlist, M, nbits, dim);
    *off_trained = 32;
    *off_cent = (size_t)(c + 32 - b);
    return DFM_OK;
}

int dfm_ivf_trained(const dfm_index_plan *plan, uint32_t dim, const float *coarse, const float *pq, uint64_t train_n, const float *train_x,
                    uint8_t **buf, size_t *len) {
    *buf = NULL, *len = 0;
    FaissIndex *idx = NULL, *back = NULL;
    DFM_TRY(dfm_index_create(plan, dim, &idx));
    FaissIndexIVF *ivf = faiss_IndexIVF_cast(idx);
    int rc = ivf ? DFM_OK : DFM_FAIL(DFM_EINTERNAL, "%s is not an IVF index", plan->factory);
    uint64_t nlist = ivf ? (uint64_t)faiss_IndexIVF_nlist(ivf) : 0;
    if (!rc) rc = DFM_FAISS_CHECK(faiss_Index_add(faiss_IndexIVF_quantizer(ivf), (idx_t)nlist, coarse), "setting the coarse centroids");
    uint8_t *b = NULL;
    size_t n = 0;
    if (!rc && pq) {
        char kind;
        uint32_t M, nbits;
        size_t off_t = 0, off_c = 0;
        rc = dfm_ivf_encoding(plan, dim, &kind, &M, &nbits);
        if (!rc) rc = dfm_index_to_buffer(idx, &b, &n);
        if (!rc) rc = pq_layout(b, n, dim, nlist, M, nbits, &off_t, &off_c);
        if (!rc) {
            b[off_t] = 1;
            memcpy(b + off_c, pq, ((size_t)dim << nbits) * sizeof(float));
            rc = dfm_index_from_buffer(b, n, &back);
        }
        uint8_t *b2 = NULL;
        size_t n2 = 0;
        if (!rc) rc = dfm_index_to_buffer(back, &b2, &n2);
        if (!rc && (n2 != n || memcmp(b, b2, n) || !faiss_Index_is_trained(back)))
            rc = DFM_FAIL(DFM_EINTERNAL, "the IVF-PQ index with dfm's codebooks does not read back as written. HINT: build dfm against FAISS 1.7.3");
        free(b2);
    } else if (!rc) {
        /* the quantiser is full (FAISS skips its training); only the residual encoder trains, if any */
        rc = DFM_FAISS_CHECK(faiss_Index_train(idx, (idx_t)(train_n ? train_n : 1), train_n ? train_x : coarse), "training the index's encoder");
        if (!rc) rc = dfm_index_to_buffer(idx, &b, &n);
    }
    if (back) faiss_Index_free(back);
    faiss_Index_free(idx);
    if (rc) {
        free(b);
        return rc;
    }
    *buf = b, *len = n;
    return DFM_OK;
}
