/* index_build.c — the index stage over abstract sources: train with every rank (index_train.h), add
 * each rank's vectors to its shard, write the shards, the trained empty index and the stage object. */
#include "retriever/retrieve.h"

#include "common/error.h"
#include "common/stop.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "retriever/estimate.h"
#include "retriever/index_train.h"
#include "retriever/ivf.h"
#include "retriever/kmeans.h"
#include "schemas/neighbor_shard.h"

#include <faiss/c_api/IndexFlat_c.h>
#include <faiss/c_api/Index_c.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct {
    uint64_t ntotal, first_id, end_id, bytes, padding;
    char xxh128[33];
    char pad_[7];
} shard_summary;

/* 4. indexes other than a plain IVF are sharded by id: this rank's vectors [lo, hi) into idx with their
 * global ids, all-padding chunks left out (counted in *padding) */
static int add_vectors(const dfm_vec_source *vs, const dfm_chunk_source *cs, FaissIndex *idx, uint64_t lo, uint64_t hi,
                       uint64_t *padding, dfm_work *w) {
    int rc = DFM_OK;
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
    }
    free(buf);
    free(gid);
    return rc;
}

/* 4. An IVF index with a flat quantiser is sharded by list: every inverted list lives whole in the shard
 * of one rank, so that a query visits only the ranks that hold its probe lists (retrieve.c routes it).
 * Each rank adds its vectors to a local index (FAISS assigns and encodes each vector once); the list
 * sizes are summed over ranks; the lists are ordered by group of neighbouring centroids (group_lists);
 * in that order, the lists are cut into P consecutive runs of about equal retrieve work (own_lists: the
 * codes their probes scan and the visits of the queries probing them), rank r taking run r;
 * then every rank sends each list's codes and ids to its rank (through FAISS's
 * serialisation, ivf.h: nothing is assigned or encoded again), which assembles its shard with each
 * list's entries in id order, as one index built from every vector would hold them. */
typedef struct {
    uint64_t nlist, code_size;
    int32_t *owner; /* the rank of each list */
} list_owners;

/* Neighbouring lists on the same rank: a query's nprobe lists are the nearest to it, so they lie near
 * each other; grouped, they are held by a few ranks, and the query visits only those. Rank 0 clusters
 * the coarse centroids into P groups (kmeans.h, on its own: MPI_COMM_SELF) and orders the lists by group,
 * then by list; order[] gets that order. With one rank, or fewer lists than ranks: list order. */
static int group_lists(const dfm_mpi *m, const dfm_ivf *v, uint32_t *order, dfm_work *w) {
    const uint64_t nlist = v->nlist;
    int rc = DFM_OK;
    for (uint64_t l = 0; l < nlist; l++) order[l] = (uint32_t)l;
    if (m->size < 2 || nlist <= (uint64_t)m->size) return DFM_OK;
    if (m->rank == 0) {
        float *xb = NULL;
        size_t nx = 0;
        faiss_IndexFlat_xb(faiss_IndexFlat_cast(v->quantizer), &xb, &nx);
        const uint32_t d = (uint32_t)faiss_Index_d(v->quantizer), G = (uint32_t)m->size;
        float *cent = malloc((size_t)G * d * sizeof *cent);
        int32_t *grp = malloc(nlist * sizeof *grp);
        uint64_t *blocks = malloc(((nlist + 255) / 256 + 1) * sizeof *blocks), nb = 0, *picks = malloc(G * sizeof *picks);
        if (!xb || nx != nlist * d || !cent || !grp || !blocks || !picks) rc = DFM_FAIL(DFM_ENOMEM, "no memory to group %llu lists", (unsigned long long)nlist);
        dfm_mpi self = {0, 1, MPI_COMM_SELF};
        dfm_kmeans_opts ko = {d, 1, G, DFM_COARSE_ITERATIONS, 0, 0};
        for (uint64_t i = 0; !rc && i < nlist; i += 256) blocks[nb++] = nlist - i < 256 ? nlist - i : 256;
        if (!rc) {
            dfm_sample_ids(nlist, G, 0x67726f7570ull, picks);
            for (uint32_t g = 0; g < G; g++) memcpy(cent + (size_t)g * d, xb + picks[g] * d, d * sizeof *cent);
            rc = dfm_kmeans_train(&self, &ko, xb, d, blocks, (size_t)nb, nlist, cent, NULL, w);
        }
        if (!rc) rc = dfm_kmeans_assign(&ko, cent, xb, d, nlist, grp, w);
        /* counting sort by group, lists ascending within a group */
        uint64_t *start = rc ? NULL : calloc((size_t)G + 1, sizeof *start);
        if (!rc && !start) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        for (uint64_t l = 0; !rc && l < nlist; l++) start[grp[l] + 1]++;
        for (uint32_t g = 0; !rc && g < G; g++) start[g + 1] += start[g];
        for (uint64_t l = 0; !rc && l < nlist; l++) order[start[grp[l]]++] = (uint32_t)l;
        free(start);
        free(cent);
        free(grp);
        free(blocks);
        free(picks);
    }
    if ((rc = dfm_work_agree(w, m, rc))) return rc;
    rc = DFM_WORK_MPI(w, MPI_Bcast(order, (int)nlist, MPI_UINT32_T, 0, m->comm));
    dfm_work_ring(w, nlist * 4, m->size);
    return rc;
}

/* Lists placed on ranks by the retrieve work they draw. Queries are the datastore's own vectors (each
 * chunk's context searches the chunks), so list j's cnt[j] entries stand for cnt[j] queries near its
 * centroid, which probe the DFM_PLACEMENT_NPROBE lists nearest that centroid (j itself first). A rank's
 * work is then, in codes scanned: each probe of one of its lists scans that list (probes[l] x cnt[l]), and
 * each query that probes any of its lists visits it once, at a fixed cost (FAISS's per-query tables: `cv`
 * codes, dfm_estimate_visit_in_codes, by the fitted retrieve rates). Visits do not add up over lists: a
 * query whose lists sit together visits once. In the group order of group_lists, the lists are cut into P
 * consecutive runs with the smallest largest work (a bisection on the cap, each run filled greedily up to
 * it). Placing by entries alone left the most-visited rank 2.3x the mean rank's visits at 64 ranks
 * (bench/results/scaling.md, "Visits"). Each rank computes its share of the centroids' nearest lists, which
 * every rank then gathers; the cut is integer arithmetic on the same inputs, so every rank finds the same
 * owners, for any number of ranks. */
enum { DFM_PLACEMENT_NPROBE = 16 };

typedef struct {
    uint64_t nlist, np;
    const int64_t *cnt;     /* entries per list (all ranks) */
    const int32_t *near;    /* [nlist][np]: the lists each list's queries probe */
    const uint64_t *probes; /* queries probing each list */
    const uint64_t *inv_start; /* CSR of near by probed list: the lists whose queries probe l */
    const uint32_t *inv;
    uint64_t cv;            /* a visit, in codes */
    uint32_t *stamp;        /* per query list: 1 + the run that counted its visit last */
} placement;

/* Cut order[] into runs of work at most cap (a list heavier than cap alone in its run): the runs needed;
 * owner (when not NULL) gets each list's run. */
static uint64_t place_runs(placement *p, const uint32_t *order, unsigned __int128 cap, int32_t *owner) {
    memset(p->stamp, 0, p->nlist * sizeof *p->stamp);
    uint64_t run = 1;
    unsigned __int128 load = 0;
    for (uint64_t i = 0; i < p->nlist; i++) {
        const uint64_t l = order[i];
        unsigned __int128 codes = (unsigned __int128)p->probes[l] * (uint64_t)p->cnt[l], fresh = 0, all = 0;
        for (uint64_t e = p->inv_start[l]; e < p->inv_start[l + 1]; e++) {
            uint32_t j = p->inv[e];
            all += (uint64_t)p->cnt[j];
            if (p->stamp[j] != run) fresh += (uint64_t)p->cnt[j];
        }
        unsigned __int128 add = codes + fresh * p->cv;
        if (i > 0 && load + add > cap) { /* a new run: every query of l visits it for the first time */
            run++;
            load = 0;
            add = codes + all * p->cv;
        }
        load += add;
        for (uint64_t e = p->inv_start[l]; e < p->inv_start[l + 1]; e++) p->stamp[p->inv[e]] = (uint32_t)run;
        if (owner) owner[l] = (int32_t)(run - 1);
    }
    return run;
}

static int own_lists(const dfm_mpi *m, const dfm_ivf *v, uint64_t code_size, list_owners *lo, dfm_work *w) {
    const uint64_t nlist = v->nlist, P = (uint64_t)m->size;
    const uint64_t np = nlist < DFM_PLACEMENT_NPROBE ? nlist : DFM_PLACEMENT_NPROBE;
    const uint64_t first = nlist * (uint64_t)m->rank / P, end = nlist * (uint64_t)(m->rank + 1) / P;
    int64_t *cnt = malloc((nlist + 1) * sizeof *cnt), *mine = malloc(((end - first) * np + 1) * sizeof *mine);
    uint32_t *order = malloc((nlist + 1) * sizeof *order), *inv = malloc((nlist * np + 1) * sizeof *inv),
             *stamp = malloc((nlist + 1) * sizeof *stamp);
    int32_t *near = malloc((nlist * np + 1) * sizeof *near);
    uint64_t *probes = calloc(nlist + 1, sizeof *probes), *inv_start = calloc(nlist + 2, sizeof *inv_start);
    float *dis = malloc(((end - first) * np + 1) * sizeof *dis);
    int *counts = malloc(P * sizeof *counts), *displs = malloc(P * sizeof *displs);
    lo->owner = malloc((nlist + 1) * sizeof *lo->owner);
    int rc = cnt && mine && order && inv && stamp && near && probes && inv_start && dis && counts && displs && lo->owner
                 ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory to place %llu lists", (unsigned long long)nlist);
    if (!rc && nlist * np > INT_MAX) rc = DFM_FAIL(DFM_EARG, "%llu lists are too many to place. HINT: use fewer lists", (unsigned long long)nlist);
    for (uint64_t l = 0; !rc && l < nlist; l++) cnt[l] = (int64_t)v->list_sizes[l];
    if (!(rc = dfm_work_agree(w, m, rc))) rc = DFM_WORK_MPI(w, MPI_Allreduce(MPI_IN_PLACE, cnt, (int)nlist, MPI_INT64_T, MPI_SUM, m->comm));
    dfm_work_ring(w, nlist * 8, m->size);
    if (!rc) rc = group_lists(m, v, order, w);
    /* this rank's share of the centroids' nearest lists, then every rank's */
    if (!rc && end > first) {
        float *xb = NULL;
        size_t nx = 0;
        faiss_IndexFlat_xb(faiss_IndexFlat_cast(v->quantizer), &xb, &nx);
        const size_t d = (size_t)faiss_Index_d(v->quantizer);
        if (!xb || nx != nlist * d) rc = DFM_FAIL(DFM_EFORMAT, "the coarse quantiser holds %zu values, not %llu lists x %zu", nx,
                                                 (unsigned long long)nlist, d);
        if (!rc) rc = dfm_ivf_assign(v, (size_t)(end - first), xb + first * d, (size_t)np, mine, dis);
        w->coarse_distances += (end - first) * nlist;
        for (uint64_t e = 0; !rc && e < (end - first) * np; e++)
            near[first * np + e] = mine[e] >= 0 && (uint64_t)mine[e] < nlist ? (int32_t)mine[e] : -1;
    }
    for (uint64_t r = 0; !rc && r < P; r++) {
        counts[r] = (int)((nlist * (r + 1) / P - nlist * r / P) * np);
        displs[r] = (int)(nlist * r / P * np);
    }
    if (!(rc = dfm_work_agree(w, m, rc)))
        rc = DFM_WORK_MPI(w, MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, near, counts, displs, MPI_INT32_T, m->comm));
    w->bytes_sent += (end - first) * np * 4 * (P - 1);
    /* queries per list and, by probed list, whose queries probe it */
    for (uint64_t j = 0; !rc && j < nlist; j++)
        for (uint64_t k = 0; k < np; k++)
            if (near[j * np + k] >= 0) probes[near[j * np + k]] += (uint64_t)cnt[j], inv_start[near[j * np + k] + 2]++;
    for (uint64_t l = 0; !rc && l < nlist; l++) inv_start[l + 2] += inv_start[l + 1];
    for (uint64_t j = 0; !rc && j < nlist; j++)
        for (uint64_t k = 0; k < np; k++)
            if (near[j * np + k] >= 0) inv[inv_start[near[j * np + k] + 1]++] = (uint32_t)j;
    if (!rc) {
        const double cvd = dfm_estimate_visit_in_codes((double)faiss_Index_d(v->quantizer), (double)code_size, (double)np);
        placement p = {nlist, np, cnt, near, probes, inv_start, inv, cvd < 1 ? 1 : (uint64_t)(cvd + 0.5), stamp};
        /* the smallest cap that P runs hold: between a run per list and one run */
        unsigned __int128 lo_cap = 0, hi_cap = 0;
        for (uint64_t l = 0; l < nlist; l++) hi_cap += (unsigned __int128)probes[l] * ((uint64_t)cnt[l] + p.cv);
        while (lo_cap < hi_cap) {
            unsigned __int128 mid = lo_cap + (hi_cap - lo_cap) / 2;
            if (place_runs(&p, order, mid, NULL) <= P) hi_cap = mid;
            else lo_cap = mid + 1;
        }
        place_runs(&p, order, hi_cap, lo->owner);
    }
    free(cnt);
    free(mine);
    free(order);
    free(inv);
    free(stamp);
    free(near);
    free(probes);
    free(inv_start);
    free(dis);
    free(counts);
    free(displs);
    return rc;
}

/* this rank's local lists, packed per owner: records (list, n, n codes, n ids), lists ascending */
static int pack_lists(const dfm_mpi *m, const dfm_ivf_lists *L, const list_owners *lo, uint8_t **sbuf, int *sc, int *sd) {
    const int P = m->size;
    uint64_t *bytes = calloc((size_t)P, sizeof *bytes), total = 0;
    if (!bytes) return DFM_FAIL(DFM_ENOMEM, "no memory");
    for (uint64_t l = 0; l < L->nlist; l++)
        if (L->sizes[l]) bytes[lo->owner[l]] += 16 + L->sizes[l] * (L->code_size + 8);
    int rc = DFM_OK;
    for (int r = 0; r < P; r++) {
        if (bytes[r] > INT_MAX || total + bytes[r] > (uint64_t)INT_MAX)
            rc = DFM_FAIL(DFM_EARG, "index shard too large to move in one exchange (%llu bytes to rank %d). HINT: use more ranks",
                          (unsigned long long)bytes[r], r);
        sd[r] = (int)total;
        sc[r] = (int)bytes[r];
        total += bytes[r];
    }
    if (!rc && !(*sbuf = malloc(total + 1))) rc = DFM_FAIL(DFM_ENOMEM, "no memory for %llu bytes of lists", (unsigned long long)total);
    uint64_t *fill = calloc((size_t)P, sizeof *fill);
    if (!rc && !fill) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    const uint8_t *src = L->data;
    for (uint64_t l = 0; !rc && l < L->nlist; l++) {
        uint64_t n = L->sizes[l], nb = n * (L->code_size + 8);
        if (!n) continue;
        uint8_t *p = *sbuf + sd[lo->owner[l]] + fill[lo->owner[l]];
        memcpy(p, &l, 8);
        memcpy(p + 8, &n, 8);
        memcpy(p + 16, src, nb); /* codes, then ids: the serialisation's own order */
        fill[lo->owner[l]] += 16 + nb;
        src += nb;
    }
    free(fill);
    free(bytes);
    return rc;
}

/* the records received from every rank (rank order: ascending ids) into this rank's shard */
static int assemble_lists(const uint8_t *rbuf, const int *rcn, const int *rd, int P, const uint8_t *tbuf, size_t tlen, uint64_t nlist,
                          uint64_t cs, FaissIndex **out, uint64_t *first, uint64_t *end) {
    uint64_t *sizes = calloc(nlist + 1, sizeof *sizes), total = 0;
    size_t *cur = calloc((size_t)P, sizeof *cur);
    int rc = sizes && cur ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    for (int r = 0; !rc && r < P; r++)
        for (size_t at = 0; at < (size_t)rcn[r];) {
            uint64_t l, n;
            memcpy(&l, rbuf + rd[r] + at, 8);
            memcpy(&n, rbuf + rd[r] + at + 8, 8);
            if (l >= nlist || at + 16 + n * (cs + 8) > (size_t)rcn[r]) {
                rc = DFM_FAIL(DFM_EINTERNAL, "a malformed list record from rank %d", r);
                break;
            }
            sizes[l] += n;
            total += n * (cs + 8);
            at += 16 + n * (cs + 8);
        }
    uint8_t *data = rc ? NULL : malloc(total + 1), *dp = data;
    if (!rc && !data) rc = DFM_FAIL(DFM_ENOMEM, "no memory for a shard of %llu bytes", (unsigned long long)total);
    *first = UINT64_MAX, *end = 0;
    for (uint64_t l = 0; !rc && l < nlist; l++) { /* each rank's records come in list order: one cursor per rank */
        if (!sizes[l]) continue;
        uint8_t *codes = dp, *ids = dp + sizes[l] * cs;
        for (int r = 0; r < P; r++) {
            uint64_t rl, n;
            if (cur[r] >= (size_t)rcn[r]) continue;
            memcpy(&rl, rbuf + rd[r] + cur[r], 8);
            if (rl != l) continue;
            memcpy(&n, rbuf + rd[r] + cur[r] + 8, 8);
            const uint8_t *rec = rbuf + rd[r] + cur[r] + 16;
            memcpy(codes, rec, n * cs);
            memcpy(ids, rec + n * cs, n * 8);
            for (uint64_t i = 0; i < n; i++) {
                int64_t id;
                memcpy(&id, ids + 8 * i, 8);
                if ((uint64_t)id < *first) *first = (uint64_t)id;
                if ((uint64_t)id + 1 > *end) *end = (uint64_t)id + 1;
            }
            codes += n * cs;
            ids += n * 8;
            cur[r] += 16 + n * (cs + 8);
        }
        dp += sizes[l] * (cs + 8);
    }
    if (!rc) rc = dfm_ivf_from_lists(tbuf, tlen, nlist, cs, sizes, data, total, out);
    if (*first == UINT64_MAX) *first = *end = 0;
    free(sizes);
    free(cur);
    free(data);
    return rc;
}

/* the shard of this rank, sharded by list; *idx: in, the local index with this rank's vectors; out, the shard */
static int shard_by_list(const dfm_mpi *m, const uint8_t *tbuf, size_t tlen, FaissIndex **idx, dfm_index_info *info, dfm_work *w) {
    const int P = m->size;
    dfm_ivf v;
    list_owners lo = {0};
    dfm_ivf_lists L = {0};
    uint8_t *ser = NULL, *sbuf = NULL, *rbuf = NULL;
    size_t nser = 0;
    int *sc = calloc((size_t)P, sizeof *sc), *sd = calloc((size_t)P, sizeof *sd), *rcn = calloc((size_t)P, sizeof *rcn),
        *rd = calloc((size_t)P, sizeof *rd);
    int rc = dfm_ivf_open(*idx, &v);
    if (!rc && !(sc && sd && rcn && rd)) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = dfm_index_to_buffer(*idx, &ser, &nser);
    if (!rc) rc = dfm_ivf_lists_view(ser, nser, tbuf, tlen, &L); /* the code size, for own_lists */
    if (!(rc = dfm_work_agree(w, m, rc))) rc = own_lists(m, &v, L.code_size, &lo, w);
    const uint64_t nlist = v.nlist;
    dfm_ivf_close(&v);
    if (*idx) {
        faiss_Index_free(*idx); /* its lists are in ser now */
        *idx = NULL;
    }
    if (!rc) rc = pack_lists(m, &L, &lo, &sbuf, sc, sd);
    free(ser);
    ser = NULL;
    if (!(rc = dfm_work_agree(w, m, rc))) rc = DFM_WORK_MPI(w, MPI_Alltoall(sc, 1, MPI_INT, rcn, 1, MPI_INT, m->comm));
    uint64_t rtotal = 0;
    for (int r = 0; !rc && r < P; r++) {
        rd[r] = (int)rtotal;
        rtotal += (uint64_t)rcn[r];
        if (r != m->rank) w->bytes_sent += (uint64_t)sc[r];
    }
    if (!rc && rtotal > INT_MAX) rc = DFM_FAIL(DFM_EARG, "a shard of %llu bytes is too large to receive in one exchange. HINT: use more ranks",
                                               (unsigned long long)rtotal);
    if (!rc && !(rbuf = malloc(rtotal + 1))) rc = DFM_FAIL(DFM_ENOMEM, "no memory for %llu bytes of lists", (unsigned long long)rtotal);
    if (!(rc = dfm_work_agree(w, m, rc))) rc = DFM_WORK_MPI(w, MPI_Alltoallv(sbuf, sc, sd, MPI_BYTE, rbuf, rcn, rd, MPI_BYTE, m->comm));
    free(sbuf);
    if (!rc) rc = assemble_lists(rbuf, rcn, rd, P, tbuf, tlen, nlist, L.code_size, idx, &info->first_id, &info->end_id);
    info->by_list = 1;
    free(rbuf);
    free(L.sizes);
    free(lo.owner);
    free(sc);
    free(sd);
    free(rcn);
    free(rd);
    return dfm_work_agree(w, m, rc);
}

/* 5. rank 0: the "index" stage object from every rank's shard summary (collective; agreed) */
static int index_stage(const dfm_mpi *m, const dfm_index_opts *o, const dfm_index_plan *plan, const dfm_index_info *info,
                       uint64_t padding, double t0, uint64_t tlen, json_t *training, dfm_work *w, json_t **stage) {
    json_t *work = NULL;
    DFM_TRY(dfm_work_gather(m, w, "train_cpu_s", "add_cpu_s", &work));
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
            if (plan->l2_table_bytes) { /* L2 IVF-PQ: FAISS's precomputed table, per loaded shard */
                json_t *ch = json_object_get(*stage, "choice");
                json_object_set_new(ch, "l2_table_bytes", json_integer((json_int_t)plan->l2_table_bytes));
                json_object_set_new(ch, "l2_table_used", json_boolean(plan->l2_table_used));
            }
            json_object_set_new(*stage, "trained", json_pack("{s:s, s:I, s:s}", "file", DFM_INDEX_TRAINED_FILE, "bytes", (json_int_t)tlen,
                                                              "xxh128", info->trained_xxh128));
            json_object_set(*stage, "training", training ? training : json_null());
            json_object_set_new(*stage, "sharding", json_string(info->by_list ? "lists" : "ids"));
            if (info->by_list) /* own_lists: how the lists were placed on ranks */
                json_object_set_new(*stage, "placement", json_pack("{s:s, s:i}", "by", "expected retrieve work: codes scanned and visits",
                                                                   "nprobe", (int)DFM_PLACEMENT_NPROBE));
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
    dfm_ivf v = {0};
    if (!rc) rc = dfm_ivf_open(idx, &v); /* the same on every rank: one trained index */
    if ((rc = dfm_work_agree(w, m, rc))) {
        if (idx) faiss_Index_free(idx);
        return rc;
    }
    uint64_t nlist = v.nlist;
    int by_list = v.ivf != NULL;
    dfm_ivf_close(&v);
    rc = add_vectors(vs, cs, idx, info->first_id, info->end_id, padding, w);
    w->coarse_distances += w->vectors_added * nlist; /* FAISS assigns each added vector: nlist distances */
    if (by_list && !(rc = dfm_work_agree(w, m, rc))) rc = shard_by_list(m, tbuf, tlen, &idx, info, w);
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
        if (!rc) DFM_LOG_I("index: shard %d holds %llu vectors of ids in [%llu, %llu)%s (%.2fs to add), %llu bytes", m->rank,
                           (unsigned long long)info->ntotal, (unsigned long long)info->first_id, (unsigned long long)info->end_id,
                           info->by_list ? ", whole lists" : "", dfm_now() - tadd, (unsigned long long)info->bytes);
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
    if (!rc) rc = dfm_work_agree(&w, m, dfm_stop_check("after training the quantisers (the index stage starts over)"));
    dfm_work_phase(&w, 0);
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
    dfm_work_phase(&w, 1);
    free(tbuf);
    if (!rc) rc = index_stage(m, o, &plan, &info, padding, t0, tlen, training, &w, stage);
    json_decref(training);
    return rc;
}
