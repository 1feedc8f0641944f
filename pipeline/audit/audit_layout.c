/* audit_layout.c — index bytes and operation counts from an index's layout (audit_layout.h). */
#include "pipeline/audit/audit_layout.h"

#include "common/error.h"
#include "schemas/neighbor_shard.h"

#include <faiss/c_api/IndexIVF_c.h>
#include <faiss/c_api/MetaIndexes_c.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* "123" at *p: its value, *p moved past it; 0 when no digit is there */
static int take_uint(const char **p, uint64_t *v) {
    if (**p < '0' || **p > '9') return 0;
    char *end;
    *v = strtoull(*p, &end, 10);
    *p = end;
    return 1;
}

/* the component at *p equals word (up to ',' or the end): *p moved to the next component */
static int take_word(const char **p, const char *word) {
    size_t n = strlen(word);
    if (strncmp(*p, word, n) || ((*p)[n] != ',' && (*p)[n] != 0)) return 0;
    *p += n + ((*p)[n] == ',');
    return 1;
}

int dfm_audit_layout_parse(const char *factory, uint32_t dim, uint32_t metric, dfm_audit_layout *l) {
    memset(l, 0, sizeof *l);
    l->dim = dim;
    l->metric = metric;
    const char *p = factory ? factory : "";
    int idmap = take_word(&p, "IDMap");
    uint64_t v = 0;
    if (take_word(&p, "Flat") && !*p) {
        if (!idmap) return DFM_FAIL(DFM_EARG, "audit: index '%s': a Flat index without IDMap is not what dfm index builds. HINT: 'IDMap,Flat'", factory);
        l->family = DFM_AUDIT_FLAT;
        return DFM_OK;
    }
    if (!idmap && !strncmp(p, "IVF", 3)) {
        p += 3;
        if (take_uint(&p, &v) && v > 0 && *p == ',') {
            p++;
            l->nlist = v;
            if (take_word(&p, "Flat") && !*p) {
                l->family = DFM_AUDIT_IVF_FLAT;
                return DFM_OK;
            }
            uint64_t m = 0, nbits = 8;
            if (!strncmp(p, "PQ", 2)) {
                p += 2;
                int ok = take_uint(&p, &m) && m > 0;
                if (ok && *p == 'x') p++, ok = take_uint(&p, &nbits) && nbits >= 1 && nbits <= 16;
                if (ok && !strncmp(p, "np", 2)) p += 2;
                if (ok && !*p && dim % m == 0) {
                    l->family = DFM_AUDIT_IVF_PQ;
                    l->pq_m = (uint32_t)m;
                    l->pq_nbits = (uint32_t)nbits;
                    return DFM_OK;
                }
            }
        }
    }
    return DFM_FAIL(DFM_EARG, "audit: index '%s' (dim %u) is not a family the audit's cost model knows (IDMap,Flat; IVF<n>,Flat; "
                    "IVF<n>,PQ<m>[x<bits>][np] with m dividing the dim). HINT: audit a run indexed with --index auto or one of these",
                    factory ? factory : "(none)", dim);
}

uint64_t dfm_audit_nonempty_lists(const FaissIndex *idx) {
    FaissIndexIVF *ivf = faiss_IndexIVF_cast((FaissIndex *)idx);
    if (!ivf) {
        FaissIndexIDMap *m = faiss_IndexIDMap_cast((FaissIndex *)idx);
        ivf = m ? faiss_IndexIVF_cast(faiss_IndexIDMap_sub_index(m)) : NULL;
    }
    if (!ivf) return 0;
    uint64_t n = 0;
    for (size_t i = 0; i < faiss_IndexIVF_nlist(ivf); i++) n += faiss_IndexIVF_get_list_size(ivf, i) > 0;
    return n;
}

const char *dfm_audit_family_name(dfm_audit_family f) {
    return f == DFM_AUDIT_FLAT ? "Flat" : f == DFM_AUDIT_IVF_FLAT ? "IVF-Flat" : f == DFM_AUDIT_IVF_PQ ? "IVF-PQ" : "?";
}

static double code_bytes(const dfm_audit_layout *l) {
    if (l->family == DFM_AUDIT_IVF_PQ) return (double)(((uint64_t)l->pq_m * l->pq_nbits + 7) / 8);
    return 4.0 * l->dim;
}

double dfm_audit_layout_bytes_per_key(const dfm_audit_layout *l) { return code_bytes(l) + 8; }

/* FAISS 1.7.3's serialisation (faiss/impl/index_write.cpp) */
#define HEADER 37.0 /* fourcc 4, d 4, ntotal 8, two dummies 16, is_trained 1, metric 4 (no metric_arg for L2 / IP) */
#define VEC 8.0     /* a vector's length field */

double dfm_audit_layout_bytes(const dfm_audit_layout *l, uint64_t n, uint64_t nonempty) {
    double d = l->dim, N = (double)n;
    if (l->family == DFM_AUDIT_FLAT) /* IxMp header, IxF* header + codes, the id map */
        return HEADER + (HEADER + VEC + 4 * d * N) + VEC + 8 * N;
    double nl = (double)l->nlist;
    if (nonempty > l->nlist) nonempty = l->nlist;
    /* ivf header: index header, nlist, nprobe, the quantizer (IxF*), the direct map (type byte + empty vector) */
    double b = HEADER + 8 + 8 + (HEADER + VEC + 4 * d * nl) + 1 + VEC;
    if (l->family == DFM_AUDIT_IVF_PQ) /* by_residual, code_size, the PQ: d, M, nbits, centroids */
        b += 1 + 8 + (8 + 8 + 8 + VEC + 4 * d * (double)(1ull << l->pq_nbits));
    /* "ilar": fourcc, nlist, code_size, list type; sizes "full" (one per list) or "sprs" (list, size pairs) */
    b += 4 + 8 + 8 + 4 + VEC + ((double)nonempty > nl / 2 ? 8 * nl : 16 * (double)nonempty);
    return b + N * dfm_audit_layout_bytes_per_key(l);
}

void dfm_audit_search_ops_of(const dfm_audit_layout *l, double n, double nprobe, double k, dfm_audit_search_ops *o) {
    double d = l->dim, sel = k > 1 ? k * log2(k) : 1;
    memset(o, 0, sizeof *o);
    if (l->family == DFM_AUDIT_FLAT) {
        o->scanned = n;
        o->flops = n * d;
        o->codes = n + sel;
        return;
    }
    double nl = (double)l->nlist;
    if (!(nprobe >= 1)) nprobe = 1;
    if (nprobe > nl) nprobe = nl;
    o->scanned = nprobe * n / nl;
    o->flops = nl * d;
    if (l->family == DFM_AUDIT_IVF_FLAT) {
        o->flops += o->scanned * d;
        o->codes = o->scanned + sel;
        return;
    }
    double ksub = (double)(1ull << l->pq_nbits);
    o->flops += ksub * d + (l->metric == DFM_METRIC_L2 ? nprobe * ksub * l->pq_m : 0);
    o->codes = o->scanned * l->pq_m + sel;
}

void dfm_audit_build_ops_of(const dfm_audit_layout *l, double n, double train_n, dfm_audit_build_ops *o) {
    double d = l->dim;
    memset(o, 0, sizeof *o);
    o->add = n * d;
    if (l->family == DFM_AUDIT_FLAT) return;
    double nl = (double)l->nlist, tc = train_n < 256 * nl ? train_n : 256 * nl;
    o->train = 25 * tc * nl * d;
    o->add += n * nl * d;
    if (l->family == DFM_AUDIT_IVF_PQ) {
        double ksub = (double)(1ull << l->pq_nbits), tp = train_n < 256 * ksub ? train_n : 256 * ksub;
        o->train += 25 * tp * ksub * d;
        o->add += n * ksub * d;
    }
}
