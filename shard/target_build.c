/* target_build.c — exchange exact embeddings between ranks and write target shards. See target_build.h. */
#include "shard/target_build.h"

#include "common/error.h"
#include "common/stop.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/version.h"

#include <dirent.h>
#include <limits.h>
#include <omp.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int dfm_target_shard_complete(const char *run_dir, uint32_t s, const dfm_target_shard_meta *expect) {
    char *dir = dfm_target_shard_dir(run_dir, s, 0);
    if (!dir) return 0;
    dfm_target_shard_meta m, e = *expect;
    e.shard = s;
    dfm_target_shard_range(e.n_chunks_total, e.n_shards, s, &e.first_chunk, &e.n_chunks);
    int ok = 0;
    if (dfm_target_meta_read(dir, &m) == DFM_OK && dfm_target_meta_same_config(dir, &m, &e) == DFM_OK && m.records == e.n_chunks) {
        char *data = dfm_path_join(dir, "data.mdb");
        uint64_t size = 0;
        ok = data && dfm_file_size(data, &size) == DFM_OK && size == m.data_bytes;
        free(data);
    }
    dfm_error_clear();
    free(dir);
    return ok;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    uint32_t shard;
    uint64_t first, n;
    int opens, closes; /* first / last block of its shard */
} block_t;

typedef struct {
    /* per block */
    int64_t *ids;
    float *scores;
    uint64_t *mask;
    uint8_t *seq;
    uint64_t *req;   /* sorted unique requested ids */
    size_t n_req;
    float *got;      /* rows of req, in req order */
    /* serving */
    uint64_t *served;
    float *serve_rows;
    size_t served_cap;
    /* encoding */
    float *emb;      /* k*d rows of one record */
    void *tab;       /* dtype rows for table.bin */
    uint8_t *rec;
    size_t rec_cap;
    int *scount, *sdispl, *rcount, *rdispl, *scount_r, *sdispl_r, *rcount_r, *rdispl_r;
    /* threaded encoding: one block of records, their lengths and codes */
    uint8_t *recs;
    size_t *lens;
    int *rcs;
} bufs_t;

static void bufs_free(bufs_t *b) {
    free(b->ids); free(b->scores); free(b->mask); free(b->seq); free(b->req); free(b->got);
    free(b->served); free(b->serve_rows); free(b->emb); free(b->tab); free(b->rec);
    free(b->scount); free(b->sdispl); free(b->rcount); free(b->rdispl);
    free(b->scount_r); free(b->sdispl_r); free(b->rcount_r); free(b->rdispl_r);
    free(b->recs); free(b->lens); free(b->rcs);
}

uint32_t dfm_target_slot_count(uint32_t k, int slots) { return slots == DFM_TREC_SLOTS_BOTH ? 2 * k : k; }

int dfm_target_slot_neighbors(const dfm_target_source *src, int slots, uint64_t first, uint64_t n, int64_t *ids, float *scores,
                              uint64_t *mask, uint8_t *seq) {
    if (slots == DFM_TREC_SLOTS_NEIGHBOUR) return src->neighbors(src->ctx, first, n, ids, scores, mask, seq);
    const uint32_t K = src->k, KS = dfm_target_slot_count(K, slots);
    const uint32_t at = slots == DFM_TREC_SLOTS_BOTH ? K : 0; /* first continuation slot */
    if (!src->continues) return DFM_FAIL(DFM_EINTERNAL, "this data source cannot tell continuations (slots %s)", dfm_trec_slots_name(slots));
    int64_t *nid = malloc(sizeof(int64_t) * (n ? n : 1) * K);
    float *nsc = malloc(sizeof(float) * (n ? n : 1) * K);
    uint64_t *nmask = malloc(sizeof(uint64_t) * (n ? n : 1));
    int rc = nid && nsc && nmask ? src->neighbors(src->ctx, first, n, nid, nsc, nmask, seq) : DFM_FAIL(DFM_ENOMEM, "no memory");
    for (uint64_t q = 0; !rc && q < n; q++) {
        int64_t *oid = ids + q * KS;
        float *osc = scores + q * KS;
        uint64_t m = 0;
        if (slots == DFM_TREC_SLOTS_BOTH) { /* neighbours first, as they are */
            memcpy(oid, nid + q * K, sizeof(int64_t) * K);
            memcpy(osc, nsc + q * K, sizeof(float) * K);
            m = nmask[q];
        }
        for (uint32_t r = 0; r < K && !rc; r++) {
            int64_t id = nid[q * K + r];
            int yes = 0;
            if (((nmask[q] >> r) & 1u) && id >= 0) rc = src->continues(src->ctx, (uint64_t)id, &yes);
            oid[at + r] = yes ? id + 1 : -1;
            osc[at + r] = yes ? nsc[q * K + r] : 0.0f;
            if (yes) m |= 1ULL << (at + r);
        }
        mask[q] = m;
    }
    free(nid);
    free(nsc);
    free(nmask);
    return rc;
}

/* Build and encode the record of query q of a block (emb: K*D scratch; out: cap bytes). */
static int encode_one(dfm_trec_codec *c, const bufs_t *b, uint64_t first, uint64_t q, uint32_t K, uint32_t D, int ids_only, float *emb,
                      uint8_t *out, size_t cap, size_t *len) {
    dfm_trec rec = {.chunk_id = first + q, .flags = b->seq[q] ? DFM_TREC_F_SEQ_START : 0, .mask = b->mask[q],
                    .ids = b->ids + q * K, .scores = b->scores + q * K, .emb = ids_only ? NULL : emb};
    if (!ids_only) {
        for (uint32_t r = 0; r < K; r++) {
            if (!((b->mask[q] >> r) & 1u)) continue;
            uint64_t id = (uint64_t)b->ids[q * K + r];
            const uint64_t *hit = bsearch(&id, b->req, b->n_req, sizeof *b->req, cmp_u64);
            if (!hit) return DFM_FAIL(DFM_EINTERNAL, "chunk %llu slot %u: row %llu was not fetched", (unsigned long long)(first + q), r,
                                      (unsigned long long)id);
            memcpy(emb + (size_t)r * D, b->got + (size_t)(hit - b->req) * D, sizeof(float) * D);
        }
    }
    return dfm_trec_encode(c, &rec, out, cap, len);
}

/* One build's state on this rank. */
typedef struct {
    const dfm_mpi *m;
    const char *run_dir;
    const dfm_target_source *src;
    const dfm_target_build_config *cfg;
    dfm_target_build_stats *st;
    uint32_t Q;          /* queries per block */
    int nt;              /* encoding threads */
    uint64_t *own;       /* [2P]: every rank's first embedding row and count */
    block_t *blocks;     /* this rank's blocks, one per round */
    size_t nb;
    bufs_t b;
    dfm_trec_codec *codec, **tcodec; /* this thread's; one per encoding thread when nt > 1 */
    float **temb;
    dfm_target_writer *w; /* the shard being written */
} build_ctx;

/* Who owns which embedding rows: every rank's (first, count), which must tile [0, N) in rank order (N: the rows
the neighbour ids index). Agreed. */
static int row_owners(build_ctx *x) {
    int rc = DFM_OK;
    const dfm_mpi *m = x->m;
    const int P = m->size;
    const dfm_target_source *src = x->src;
    const uint64_t N = src->n_rows ? src->n_rows : src->n_chunks;
    uint64_t mine[2] = {src->own_first, src->own_count};
    x->own = malloc(sizeof(uint64_t) * 2 * (size_t)P);
    if (!x->own) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = DFM_MPI_CHECK(MPI_Allgather(mine, 2, MPI_UINT64_T, x->own, 2, MPI_UINT64_T, m->comm));
    uint64_t at = 0;
    for (int p = 0; !rc && p < P; p++) {
        if (x->own[2 * p] != at && x->own[2 * p + 1])
            rc = DFM_FAIL(DFM_EINTERNAL, "embedding rows of rank %d start at %llu, expected %llu (ranks must own consecutive ranges)",
                          p, (unsigned long long)x->own[2 * p], (unsigned long long)at);
        at += x->own[2 * p + 1];
        if (p == P - 1 && at != N)
            rc = DFM_FAIL(DFM_EINTERNAL, "ranks own %llu embedding rows of %llu", (unsigned long long)at, (unsigned long long)N);
    }
    return dfm_mpi_agree(m, rc);
}

/* This rank's shards (s = rank, rank + P, ...; complete ones skipped unless --force) cut into blocks of
 * at most Q queries: x->blocks, x->nb. */
static int plan_blocks(build_ctx *x) {
    const dfm_mpi *m = x->m;
    const int P = m->size;
    const uint32_t K = x->cfg->rec.k, D = x->cfg->rec.d;
    const uint64_t N = x->src->n_chunks;
    const int ids_only = x->cfg->rec.ids_only;
    const dfm_target_build_config *cfg = x->cfg;
    dfm_target_build_stats *st = x->st;
    dfm_target_shard_meta expect = {0};
    expect.n_shards = cfg->n_shards;
    expect.n_chunks_total = N;
    expect.k = K;
    expect.d = D;
    expect.dtype = cfg->rec.dtype;
    expect.ids_only = ids_only;
    expect.shuffle = cfg->rec.shuffle;
    expect.level = cfg->rec.level;
    expect.slots = cfg->rec.slots;
    snprintf(expect.fingerprint, sizeof expect.fingerprint, "%s", cfg->fingerprint);
    size_t cap = 0;
    int rc = DFM_OK;
    for (uint32_t s = (uint32_t)m->rank; s < cfg->n_shards; s += (uint32_t)P) {
        if (!cfg->force && dfm_target_shard_complete(x->run_dir, s, &expect)) {
            st->shards_skipped++;
            DFM_LOG_D("shard %u is complete: skipped", s);
            continue;
        }
        uint64_t first, n;
        dfm_target_shard_range(N, cfg->n_shards, s, &first, &n);
        uint64_t nblk = n ? (n + x->Q - 1) / x->Q : 1; /* an empty shard still gets one (empty) block */
        if (x->nb + nblk > cap) {
            cap = (x->nb + nblk) * 2;
            block_t *nbk = realloc(x->blocks, cap * sizeof *x->blocks);
            if (!nbk) { rc = DFM_FAIL(DFM_ENOMEM, "no memory"); break; }
            x->blocks = nbk;
        }
        for (uint64_t b = 0; b < nblk; b++) {
            block_t *bk = &x->blocks[x->nb++];
            bk->shard = s;
            bk->first = first + b * x->Q;
            bk->n = n ? (b + 1 < nblk ? x->Q : n - b * x->Q) : 0;
            bk->opens = b == 0;
            bk->closes = b + 1 == nblk;
        }
    }
    return rc;
}

/* The exchange and encoding buffers of a block, and one record codec per encoding thread. */
static int bufs_alloc(build_ctx *x) {
    size_t es = dfm_dtype_size(x->cfg->rec.dtype);
    size_t max_req = x->cfg->rec.ids_only ? x->Q : (size_t)x->Q * x->cfg->rec.k;
    int rc = DFM_OK;
    const dfm_mpi *m = x->m;
    const int P = m->size;
    const uint32_t K = x->cfg->rec.k, D = x->cfg->rec.d;
    const int ids_only = x->cfg->rec.ids_only;
    const dfm_target_build_config *cfg = x->cfg;
    x->b.ids = malloc(sizeof(int64_t) * x->Q * K);
    x->b.scores = malloc(sizeof(float) * x->Q * K);
    x->b.mask = malloc(sizeof(uint64_t) * x->Q);
    x->b.seq = malloc(x->Q);
    x->b.req = malloc(sizeof(uint64_t) * max_req);
    x->b.got = malloc(sizeof(float) * max_req * D);
    x->b.emb = malloc(sizeof(float) * K * D);
    x->b.tab = malloc(es * x->Q * D);
    x->b.rec_cap = dfm_trec_max_bytes(K, D, cfg->rec.dtype, ids_only);
    x->b.rec = malloc(x->b.rec_cap);
    x->b.scount = calloc((size_t)P, sizeof(int)); x->b.sdispl = calloc((size_t)P, sizeof(int));
    x->b.rcount = calloc((size_t)P, sizeof(int)); x->b.rdispl = calloc((size_t)P, sizeof(int));
    x->b.scount_r = calloc((size_t)P, sizeof(int)); x->b.sdispl_r = calloc((size_t)P, sizeof(int));
    x->b.rcount_r = calloc((size_t)P, sizeof(int)); x->b.rdispl_r = calloc((size_t)P, sizeof(int));
    if (!x->b.ids || !x->b.scores || !x->b.mask || !x->b.seq || !x->b.req || !x->b.got || !x->b.emb || !x->b.tab || !x->b.rec || !x->b.scount || !x->b.sdispl ||
        !x->b.rcount || !x->b.rdispl || !x->b.scount_r || !x->b.sdispl_r || !x->b.rcount_r || !x->b.rdispl_r)
        rc = DFM_FAIL(DFM_ENOMEM, "no memory for exchange buffers (block of %u queries, K %u, d %u)", x->Q, K, D);
    if (!rc) rc = dfm_trec_codec_create(&cfg->rec, &x->codec);
    if (!rc && x->nt > 1) {
        x->b.recs = malloc(x->b.rec_cap * x->Q);
        x->b.lens = calloc(x->Q, sizeof *x->b.lens);
        x->b.rcs = calloc(x->Q, sizeof *x->b.rcs);
        x->tcodec = calloc((size_t)x->nt, sizeof *x->tcodec);
        x->temb = calloc((size_t)x->nt, sizeof *x->temb);
        if (!x->b.recs || !x->b.lens || !x->b.rcs || !x->tcodec || !x->temb) rc = DFM_FAIL(DFM_ENOMEM, "no memory for %d encoding threads", x->nt);
        for (int t = 0; !rc && t < x->nt; t++) {
            rc = dfm_trec_codec_create(&cfg->rec, &x->tcodec[t]);
            if (!rc && !(x->temb[t] = malloc(sizeof(float) * K * D))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        }
    }
    return rc;
}

/* A: this round's requests: the sorted unique neighbour ids of block bk's queries (with store = ids,
 * the block's own ids); the block's writer opened first. On failure no requests (the rank still takes
 * part in the exchange). */
static int round_requests(build_ctx *x, const block_t *bk) {
    const uint32_t K = x->cfg->rec.k;
    const uint64_t N = x->src->n_chunks;
    const int ids_only = x->cfg->rec.ids_only;
    const dfm_target_build_config *cfg = x->cfg;
    const dfm_target_source *src = x->src;
    int lrc = DFM_OK;
    x->b.n_req = 0;
    if (bk && bk->opens) {
        dfm_target_writer_config wc = {.run_dir = x->run_dir, .shard = bk->shard, .n_shards = cfg->n_shards, .n_chunks_total = N,
                                       .rec = cfg->rec, .fingerprint = cfg->fingerprint, .batch_records = cfg->batch_records,
                                       .map_bytes = cfg->map_bytes};
        lrc = dfm_target_writer_open(&wc, &x->w);
    }
    if (!lrc && bk && bk->n) {
        lrc = dfm_target_slot_neighbors(src, cfg->rec.slots, bk->first, bk->n, x->b.ids, x->b.scores, x->b.mask, x->b.seq);
        if (lrc) dfm_error_prefix("reading the neighbours of chunks [%llu, %llu)", (unsigned long long)bk->first,
                                  (unsigned long long)(bk->first + bk->n));
        for (uint64_t q = 0; !lrc && q < bk->n; q++) {
            if (x->b.seq[q]) x->b.mask[q] = 0;
            if (ids_only) continue;
            for (uint32_t r = 0; r < K; r++) {
                if (!((x->b.mask[q] >> r) & 1u)) continue;
                int64_t id = x->b.ids[q * K + r];
                uint64_t NR = src->n_rows ? src->n_rows : N;
                if (id < 0 || (uint64_t)id >= NR) {
                    lrc = DFM_FAIL(DFM_ERANGE, "chunk %llu slot %u: neighbour id %lld outside [0, %llu) in a valid slot",
                                   (unsigned long long)(bk->first + q), r, (long long)id, (unsigned long long)NR);
                    break;
                }
                x->b.req[x->b.n_req++] = (uint64_t)id;
            }
        }
        if (ids_only)
            for (uint64_t q = 0; q < bk->n; q++) x->b.req[x->b.n_req++] = bk->first + q;
        if (!lrc && x->b.n_req) {
            qsort(x->b.req, x->b.n_req, sizeof *x->b.req, cmp_u64);
            size_t u = 1;
            for (size_t i = 1; i < x->b.n_req; i++)
                if (x->b.req[i] != x->b.req[u - 1]) x->b.req[u++] = x->b.req[i];
            x->b.n_req = u;
        }
    }
    if (lrc) x->b.n_req = 0; /* still take part in the exchange, with nothing */
    return lrc;
}

/* B: the exchange of one round, every rank taking part: request counts (Alltoall), the ids
 * (Alltoallv), the rows this rank serves, the rows back (Alltoallv). lrc: this rank's state so far;
 * returns it, or the exchange's failure. */
static int round_exchange(build_ctx *x, int lrc) {
    const dfm_mpi *m = x->m;
    const int P = m->size;
    const uint32_t D = x->cfg->rec.d;
    const dfm_target_source *src = x->src;
    dfm_target_build_stats *st = x->st;
    /* requests per owner (req is sorted, owners hold ascending ranges) */
    for (int p = 0, i = 0; p < P; p++) {
        int c = 0;
        while ((size_t)i < x->b.n_req && x->b.req[i] < x->own[2 * p] + x->own[2 * p + 1]) i++, c++;
        x->b.scount[p] = c;
        x->b.sdispl[p] = p ? x->b.sdispl[p - 1] + x->b.scount[p - 1] : 0;
    }
    int mrc = DFM_MPI_CHECK(MPI_Alltoall(x->b.scount, 1, MPI_INT, x->b.rcount, 1, MPI_INT, m->comm));
    size_t n_serve = 0;
    for (int p = 0; p < P; p++) {
        x->b.rdispl[p] = (int)n_serve;
        n_serve += (size_t)x->b.rcount[p];
    }
    if (!mrc && n_serve > x->b.served_cap) {
        free(x->b.served);
        free(x->b.serve_rows);
        x->b.served = malloc(sizeof(uint64_t) * n_serve);
        x->b.serve_rows = malloc(sizeof(float) * n_serve * D);
        x->b.served_cap = n_serve;
        if (!x->b.served || !x->b.serve_rows) {
            /* cannot even receive: abort the whole job rather than deadlock on mismatched counts */
            DFM_FAIL(DFM_ENOMEM, "no memory to serve %zu rows", n_serve);
            MPI_Abort(m->comm, 1);
        }
    }
    if (!mrc)
        mrc = DFM_MPI_CHECK(MPI_Alltoallv(x->b.req, x->b.scount, x->b.sdispl, MPI_UINT64_T, x->b.served, x->b.rcount, x->b.rdispl, MPI_UINT64_T,
                                          m->comm));
    /* B: serve the rows asked of this rank */
    if (!mrc && n_serve) {
        int src_rc = DFM_OK;
        for (size_t i = 0; i < n_serve && !src_rc; i++)
            if (x->b.served[i] < src->own_first || x->b.served[i] >= src->own_first + src->own_count)
                src_rc = DFM_FAIL(DFM_EINTERNAL, "asked for row %llu outside this rank's rows", (unsigned long long)x->b.served[i]);
        if (!src_rc) src_rc = src->rows(src->ctx, x->b.served, n_serve, x->b.serve_rows);
        if (src_rc) {
            memset(x->b.serve_rows, 0, sizeof(float) * n_serve * D); /* sent, but the round fails below */
            if (!lrc) lrc = src_rc;
        }
        st->rows_served += n_serve;
    }
    for (int p = 0; p < P; p++) {
        x->b.scount_r[p] = x->b.rcount[p] * (int)D;
        x->b.sdispl_r[p] = x->b.rdispl[p] * (int)D;
        x->b.rcount_r[p] = x->b.scount[p] * (int)D;
        x->b.rdispl_r[p] = x->b.sdispl[p] * (int)D;
    }
    if (!mrc)
        mrc = DFM_MPI_CHECK(MPI_Alltoallv(x->b.serve_rows, x->b.scount_r, x->b.sdispl_r, MPI_FLOAT, x->b.got, x->b.rcount_r, x->b.rdispl_r, MPI_FLOAT,
                                          m->comm));
    if (mrc && !lrc) lrc = mrc;
    st->rows_requested += x->b.n_req;
    st->exchange_bytes += (uint64_t)n_serve * 8 + (uint64_t)x->b.n_req * D * 4;
    st->rounds++;
    return lrc;
}

/* C: encode block bk's records and write them (and, with store = ids, its rows), then finish its
 * shard when bk is the shard's last block. */
static int round_write(build_ctx *x, const block_t *bk) {
    const dfm_mpi *m = x->m;
    const uint32_t K = x->cfg->rec.k, D = x->cfg->rec.d;
    const uint64_t N = x->src->n_chunks;
    const int ids_only = x->cfg->rec.ids_only;
    const dfm_target_build_config *cfg = x->cfg;
    dfm_target_build_stats *st = x->st;
    int lrc = DFM_OK;
    if (bk && bk->n) {
        double ta = dfm_now();
        if (x->nt > 1) {
            /* encode the block on nt threads (records are independent: the bytes do not depend on nt),
             * then append them in key order on this thread */
#pragma omp parallel for num_threads(x->nt) schedule(static)
            for (long q = 0; q < (long)bk->n; q++) {
                int t = omp_get_thread_num();
                x->b.rcs[q] = encode_one(x->tcodec[t], &x->b, bk->first, (uint64_t)q, K, D, ids_only, x->temb[t], x->b.recs + (size_t)q * x->b.rec_cap,
                                      x->b.rec_cap, &x->b.lens[q]);
            }
        }
        for (uint64_t q = 0; q < bk->n && !lrc; q++) {
            uint64_t cid = bk->first + q;
            const uint8_t *rec = x->b.rec;
            size_t len = 0;
            if (x->nt > 1) {
                rec = x->b.recs + q * x->b.rec_cap;
                len = x->b.lens[q];
                /* a worker's message stayed on its thread: redo that record here for it */
                if (x->b.rcs[q]) lrc = encode_one(x->codec, &x->b, bk->first, q, K, D, ids_only, x->b.emb, x->b.rec, x->b.rec_cap, &len);
                if (x->b.rcs[q] && !lrc) lrc = DFM_FAIL(x->b.rcs[q], "encoding chunk %llu failed on a worker thread", (unsigned long long)cid);
            } else {
                lrc = encode_one(x->codec, &x->b, bk->first, q, K, D, ids_only, x->b.emb, x->b.rec, x->b.rec_cap, &len);
            }
            if (!lrc) lrc = dfm_target_writer_put(x->w, cid, rec, len, x->b.seq[q] ? 0 : x->b.mask[q]);
            /* crash-and-resume tests (DFM_FAULT=write-targets:mid-shard): die half-way through a shard */
            if (!lrc) {
                uint64_t sf, sn;
                dfm_target_shard_range(N, cfg->n_shards, bk->shard, &sf, &sn);
                if (cid == sf + sn / 2) dfm_fault_point("write-targets:mid-shard", m->rank);
            }
            if (!lrc) {
                st->records++;
                st->stored_bytes += len;
                st->raw_bytes += dfm_trec_payload_bytes(K, D, cfg->rec.dtype, ids_only);
            }
        }
        double te = dfm_now() - ta;
        if (!lrc && ids_only) {
            /* req = the block's own ids in order */
            dfm_convert_from_f32(cfg->rec.dtype, x->b.got, (size_t)bk->n * D, x->b.tab);
            lrc = dfm_target_writer_put_rows(x->w, x->b.tab, bk->n);
        }
        st->encode_s += te;
    }
    if (!lrc && bk && bk->closes) {
        dfm_target_shard_meta meta;
        lrc = dfm_target_writer_finish(x->w, &meta);
        x->w = NULL;
        if (!lrc) {
            dfm_fault_point("write-targets:shard-complete", m->rank);
            st->shards_built++;
            DFM_LOG_I("shard %u complete: %llu records, %.1f MB raw, %.1f MB stored", bk->shard, (unsigned long long)meta.records,
                      meta.raw_bytes / 1e6, meta.stored_bytes / 1e6);
        }
    }
    return lrc;
}

/* The configuration against the source. */
static int check_config(const dfm_target_source *src, const dfm_target_build_config *cfg, uint32_t Q) {
    const uint32_t K = cfg->rec.k, D = cfg->rec.d;
    if (dfm_target_slot_count(src->k, cfg->rec.slots) != K || src->d != D)
        return DFM_FAIL(DFM_EMISMATCH, "the neighbours/embeddings have K %u, d %u; the targets were asked for %u slots (%s), d %u", src->k,
                        src->d, K, dfm_trec_slots_name(cfg->rec.slots), D);
    if (cfg->rec.slots != DFM_TREC_SLOTS_NEIGHBOUR && !src->continues)
        return DFM_FAIL(DFM_EINTERNAL, "this data source cannot tell continuations (slots %s)", dfm_trec_slots_name(cfg->rec.slots));
    if (!cfg->n_shards) return DFM_FAIL(DFM_EARG, "--target-shards must be at least 1");
    if ((uint64_t)Q * K * D > INT_MAX)
        return DFM_FAIL(DFM_EARG, "--block-queries %u x K %u x d %u exceeds an MPI count. HINT: lower --block-queries", Q, K, D);
    return DFM_OK;
}

static void build_ctx_free(build_ctx *x) {
    if (x->w) dfm_target_writer_abort(x->w);
    for (int t = 0; x->tcodec && t < x->nt; t++) dfm_trec_codec_free(x->tcodec[t]);
    for (int t = 0; x->temb && t < x->nt; t++) free(x->temb[t]);
    free(x->tcodec);
    free(x->temb);
    dfm_trec_codec_free(x->codec);
    bufs_free(&x->b);
    free(x->blocks);
    free(x->own);
}

int dfm_target_build(const dfm_mpi *m, const char *run_dir, const dfm_target_source *src, const dfm_target_build_config *cfg,
                     dfm_target_build_stats *st) {
    memset(st, 0, sizeof *st);
    build_ctx x;
    memset(&x, 0, sizeof x);
    x.m = m, x.run_dir = run_dir, x.src = src, x.cfg = cfg, x.st = st;
    x.Q = cfg->block_queries ? cfg->block_queries : 1024;
    x.nt = cfg->threads > 1 ? (int)cfg->threads : 1;
    DFM_TRY(dfm_mpi_agree(m, check_config(src, cfg, x.Q)));
    int rc = row_owners(&x);
    if (rc) {
        build_ctx_free(&x);
        return rc;
    }
    rc = plan_blocks(&x);
    uint64_t rounds = x.nb, max_rounds = 0;
    if (!rc) rc = DFM_MPI_CHECK(MPI_Allreduce(&rounds, &max_rounds, 1, MPI_UINT64_T, MPI_MAX, m->comm));
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = bufs_alloc(&x);
    rc = dfm_mpi_agree(m, rc);
    for (uint64_t t = 0; !rc && t < max_rounds; t++) {
        const block_t *bk = t < x.nb ? &x.blocks[t] : NULL;
        double t0 = dfm_now();
        int lrc = round_exchange(&x, round_requests(&x, bk));
        double t1 = dfm_now();
        st->exchange_s += t1 - t0;
        rc = dfm_mpi_agree(m, lrc);
        if (rc) break;
        lrc = round_write(&x, bk);
        st->write_s += dfm_now() - t1;
        rc = lrc; /* a local failure here is agreed at the start of the next round's check below */
        /* a stop abandons a shard in progress (its writer is aborted below); finished shards are kept */
        if (!rc) rc = dfm_stop_check("after round %llu of %llu (the finished target shards are kept)",
                                     (unsigned long long)t + 1, (unsigned long long)max_rounds);
        rc = dfm_mpi_agree(m, rc);
    }
    build_ctx_free(&x);
    return dfm_mpi_agree(m, rc);
}

/* ---- synthetic source ------------------------------------------------------------------------ */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

void dfm_target_synth_row(const dfm_target_synth *s, uint64_t c, float *out) {
    double norm = 0;
    for (uint32_t j = 0; j < s->d; j++) {
        uint64_t h = mix64(s->seed * 0x9e3779b97f4a7c15ULL ^ (c * s->d + j));
        float v = (float)((double)(h >> 40) / (double)(1u << 24) * 2.0 - 1.0);
        out[j] = v;
        norm += (double)v * v;
    }
    float inv = norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
    for (uint32_t j = 0; j < s->d; j++) out[j] *= inv;
}

static int synth_neighbors(void *ctx, uint64_t first, uint64_t n, int64_t *ids, float *scores, uint64_t *mask, uint8_t *seq) {
    const dfm_target_synth *s = ctx;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t q = first + i;
        seq[i] = s->seq_chunks && q % s->seq_chunks == 0;
        uint32_t valid = s->k - (q % 3 == 0 && s->k > 2 ? 2 : 0);
        mask[i] = seq[i] ? 0 : (valid >= 64 ? ~0ULL : ((1ULL << valid) - 1));
        for (uint32_t r = 0; r < s->k; r++) {
            int on = (int)((mask[i] >> r) & 1u);
            ids[i * s->k + r] = on ? (int64_t)(mix64(s->seed + q * 131 + r) % s->n_chunks) : -1;
            scores[i * s->k + r] = on ? 0.9f - 0.01f * (float)r - (float)(mix64(q + r) % 1000) * 1e-6f : 0.0f;
        }
    }
    return DFM_OK;
}

static int synth_rows(void *ctx, const uint64_t *ids, size_t n, float *out) {
    const dfm_target_synth *s = ctx;
    for (size_t i = 0; i < n; i++) dfm_target_synth_row(s, ids[i], out + i * s->d);
    return DFM_OK;
}

static int synth_continues(void *ctx, uint64_t id, int *yes) {
    const dfm_target_synth *s = ctx;
    *yes = id + 1 < s->n_chunks && (!s->seq_chunks || (id + 1) % s->seq_chunks != 0);
    return DFM_OK;
}

void dfm_target_synth_source(dfm_target_synth *syn, int rank, int size, dfm_target_source *src) {
    memset(src, 0, sizeof *src);
    src->ctx = syn;
    src->n_chunks = syn->n_chunks;
    src->k = syn->k;
    src->d = syn->d;
    uint64_t span = (syn->n_chunks + (uint64_t)size - 1) / (uint64_t)size;
    src->own_first = (uint64_t)rank * span < syn->n_chunks ? (uint64_t)rank * span : syn->n_chunks;
    uint64_t end = src->own_first + span < syn->n_chunks ? src->own_first + span : syn->n_chunks;
    src->own_count = end - src->own_first;
    src->neighbors = synth_neighbors;
    src->rows = synth_rows;
    src->continues = synth_continues;
}

int dfm_target_synth_stage(json_t *man, const dfm_target_synth *syn) {
    json_t *sc = json_pack("{s:s, s:{s:I, s:I, s:I, s:I, s:I}, s:[]}", "state", "complete", "config", "n_chunks",
                           (json_int_t)syn->n_chunks, "k", (json_int_t)syn->k, "d", (json_int_t)syn->d, "seq_chunks",
                           (json_int_t)syn->seq_chunks, "seed", (json_int_t)syn->seed, "inputs");
    return sc ? dfm_manifest_set_stage(man, "synthetic", sc) : DFM_FAIL(DFM_ENOMEM, "no memory");
}

/* the stage contract's re-check of a complete stage: every shard's shard.json matches the format */
typedef struct {
    const dfm_target_shard_meta *expect;
    uint32_t n_shards;
} shards_ctx;

static int shards_intact(void *ctx, const char *run) {
    const shards_ctx *c = ctx;
    for (uint32_t s = 0; s < c->n_shards; s++)
        if (!dfm_target_shard_complete(run, s, c->expect)) return 0;
    return 1;
}

int dfm_target_stage_begin(json_t *man, const char *run, json_t *config, const dfm_target_build_config *bc, uint64_t n_chunks,
                           int ranks, char fp[17], int *skip) {
    *skip = 0;
    json_t *upstream = dfm_target_upstream(man);
    if (!upstream) return DFM_FAIL(DFM_ENOMEM, "no memory");
    dfm_target_shard_meta f = {0};
    f.k = bc->rec.k;
    f.d = bc->rec.d;
    f.dtype = bc->rec.dtype;
    f.ids_only = bc->rec.ids_only;
    f.shuffle = bc->rec.shuffle;
    f.level = bc->rec.level;
    f.slots = bc->rec.slots;
    f.n_shards = bc->n_shards;
    f.n_chunks_total = n_chunks;
    /* a query-only run: its neighbour ids are the datastore run's chunks (shard/target_source.c) */
    json_int_t ds_chunks = json_integer_value(json_object_get(json_object_get(dfm_manifest_stage(man, "retrieve"), "datastore"), "chunks"));
    f.n_ids = ds_chunks > 0 ? (uint64_t)ds_chunks : 0;
    dfm_target_fingerprint(upstream, &f, fp);
    memcpy(f.fingerprint, fp, 17);
    json_t *fmt = dfm_target_format_make(&f, upstream);
    json_decref(upstream);
    if (!fmt) return DFM_FAIL(DFM_ENOMEM, "no memory");
    json_t *cfg = config ? json_incref(config) : json_object();
    shards_ctx sc = {&f, bc->n_shards};
    dfm_stage_spec spec = {"targets", cfg, NULL, bc->force, ranks, shards_intact, &sc};
    dfm_stage_action act = DFM_STAGE_FRESH;
    int rc = dfm_stage_begin(man, run, &spec, &act);
    json_decref(cfg);
    *skip = act == DFM_STAGE_SKIP;
    if (!rc && !*skip) {
        json_object_set(dfm_manifest_stage(man, "targets"), "format", fmt);
        rc = dfm_manifest_save(run, man);
    }
    json_decref(fmt);
    return rc;
}

/* Shard folders of an earlier configuration with more shards (shard-SSSSS with S >= n_shards, or
 * their .tmp) would only confuse people and tools: remove them. */
static int remove_stale_shards(const char *run, uint32_t n_shards) {
    char *tdir = dfm_path_join(run, "targets");
    if (!tdir) return DFM_FAIL(DFM_ENOMEM, "no memory");
    DIR *dp = opendir(tdir);
    int rc = DFM_OK;
    struct dirent *e;
    while (dp && !rc && (e = readdir(dp))) {
        unsigned s;
        char tail[8] = "";
        if (sscanf(e->d_name, "shard-%5u%7s", &s, tail) < 1 || strlen(e->d_name) < 11 || (tail[0] && strcmp(tail, ".tmp")) || s < n_shards)
            continue;
        char *p = dfm_path_join(tdir, e->d_name);
        rc = p ? dfm_target_rmdir(p) : DFM_FAIL(DFM_ENOMEM, "no memory");
        if (!rc) DFM_LOG_I("removed %s (shard of an earlier configuration with more shards)", p);
        free(p);
    }
    if (dp) closedir(dp);
    free(tdir);
    return rc;
}

int dfm_target_stage_finish(json_t *man, const char *run, uint32_t n_shards, const dfm_target_build_stats *stp, double total_s) {
    DFM_TRY(remove_stale_shards(run, n_shards));
    dfm_target_build_stats z = {0};
    const dfm_target_build_stats *st = stp ? stp : &z;
    json_t *outs = json_array();
    if (!outs) return DFM_FAIL(DFM_ENOMEM, "no memory");
    uint64_t recs = 0, raw = 0, stored = 0, empty = 0, seqs = 0, padded = 0, data = 0, tab = 0;
    int rc = DFM_OK;
    for (uint32_t s = 0; !rc && s < n_shards; s++) {
        char *dir = dfm_target_shard_dir(run, s, 0);
        dfm_target_shard_meta mt;
        rc = dir ? dfm_target_meta_read(dir, &mt) : DFM_FAIL(DFM_ENOMEM, "no memory");
        free(dir);
        if (rc) break;
        char name[64], sum[17];
        snprintf(name, sizeof name, "targets/shard-%05u", s);
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)mt.records_checksum);
        json_array_append_new(outs, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:s}", "file", name, "first_chunk", (json_int_t)mt.first_chunk,
                                              "n_chunks", (json_int_t)mt.n_chunks, "records", (json_int_t)mt.records, "raw_bytes",
                                              (json_int_t)mt.raw_bytes, "stored_bytes", (json_int_t)mt.stored_bytes, "records_checksum", sum));
        recs += mt.records;
        raw += mt.raw_bytes;
        stored += mt.stored_bytes;
        empty += mt.empty_records;
        seqs += mt.seq_starts;
        padded += mt.padded_slots;
        data += mt.data_bytes;
        tab += mt.table_bytes;
    }
    json_t *stage = dfm_manifest_stage(man, "targets");
    if (!rc && !stage) rc = DFM_FAIL(DFM_ESTATE, "%s: no targets stage to finish", run);
    if (rc) {
        json_decref(outs);
        return rc;
    }
    json_object_set_new(stage, "state", json_string("complete"));
    json_object_set_new(stage, "counts",
                        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "records", (json_int_t)recs, "seq_starts",
                                  (json_int_t)seqs, "empty_records", (json_int_t)empty, "padded_slots", (json_int_t)padded, "raw_bytes",
                                  (json_int_t)raw, "stored_bytes", (json_int_t)stored, "lmdb_bytes", (json_int_t)data, "table_bytes",
                                  (json_int_t)tab, "shards_built", (json_int_t)st->shards_built, "shards_skipped",
                                  (json_int_t)st->shards_skipped, "rows_fetched", (json_int_t)st->rows_requested, "exchange_bytes",
                                  (json_int_t)st->exchange_bytes, "bytes_written", (json_int_t)(data + tab)));
    json_object_set_new(stage, "timings", json_pack("{s:f, s:f, s:f, s:f}", "exchange_s", st->exchange_s, "encode_s", st->encode_s,
                                                    "write_s", st->write_s, "total_s", total_s));
    json_object_set_new(stage, "outputs", outs);
    json_object_set_new(stage, "dfm_version", json_string(DFM_VERSION));
    return dfm_manifest_save(run, man);
}
