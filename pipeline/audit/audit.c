/* audit.c — the counted figures, the measured datastore/search of one side, and the SVG chart. */
#include "pipeline/audit/audit.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/manifest.h"
#include "retriever/index.h"
#include "schemas/neighbor_shard.h"

#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- counted ---------------------------------------------------------------------------------- */

int dfm_audit_count(const dfm_audit_counts_in *in, dfm_audit_counted *out) {
    memset(out, 0, sizeof *out);
    if (!in->L) return DFM_FAIL(DFM_EARG, "audit: chunk length L is 0. HINT: the manifest's chunk.config.chunk-len is missing");
    if (!in->K) return DFM_FAIL(DFM_EARG, "audit: K is 0. HINT: the manifest's retrieve.config.k is missing");
    if (!in->k_token) return DFM_FAIL(DFM_EARG, "audit: --token-k must be positive");
    if (!in->chunks) return DFM_FAIL(DFM_EARG, "audit: the run has no chunks");
    if (in->tokens > in->chunks * (uint64_t)in->L)
        return DFM_FAIL(DFM_EARG, "audit: %llu tokens do not fit in %llu chunks of %u", (unsigned long long)in->tokens,
                        (unsigned long long)in->chunks, in->L);
    if (in->queries > in->chunks)
        return DFM_FAIL(DFM_EARG, "audit: %llu queries for %llu chunks (at most one per chunk)", (unsigned long long)in->queries,
                        (unsigned long long)in->chunks);
    const double L = in->L, K = in->K, k = in->k_token;
    out->query_saving_formula = 1.0 - 1.0 / L;
    out->item_saving_formula = 1.0 - K / (L * k);
    out->chunk_queries = in->chunks;
    out->token_slot_queries = in->chunks * in->L;
    out->chunk_items = in->chunks * in->K;
    out->token_slot_items = in->chunks * in->L * (uint64_t)in->k_token;
    /* chunks / (chunks·L) is the exact quotient 1/L rounded once, so this equals the formula bit for bit */
    out->query_saving_per_chunk = 1.0 - (double)out->chunk_queries / (double)out->token_slot_queries;
    out->item_saving_per_chunk = 1.0 - (double)out->chunk_items / (double)out->token_slot_items;
    out->token_queries = in->tokens;
    out->token_items = in->tokens * (uint64_t)in->k_token;
    if (in->tokens) {
        out->query_saving_run = 1.0 - (double)in->queries / (double)in->tokens;
        out->item_saving_run = 1.0 - (double)in->items_kept / (double)out->token_items;
        out->candidate_saving_run = 1.0 - (double)in->candidates / (double)out->token_items;
    }
    return DFM_OK;
}

/* ---- measured --------------------------------------------------------------------------------- */

static inline uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void dfm_audit_key(uint64_t seed, uint32_t dim, float *out) {
    uint64_t s = seed;
    double norm = 0;
    for (uint32_t j = 0; j < dim; j++) {
        float v = (float)((double)(splitmix64(&s) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
        out[j] = v;
        norm += (double)v * v;
    }
    float inv = norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.f;
    for (uint32_t j = 0; j < dim; j++) out[j] *= inv;
}

int dfm_audit_plan(const char *index, uint32_t metric, uint32_t dim, uint64_t n_keys, dfm_index_plan *plan, char *why, size_t n_why) {
    const char *want = index && index[0] ? index : "auto";
    int rc = dfm_index_plan_make(want, n_keys, dim, 1, 0, metric, n_keys, plan);
    if (rc && strcmp(want, "auto")) {
        char first[400];
        snprintf(first, sizeof first, "%s", dfm_last_error());
        dfm_error_clear();
        /* same family, fewer lists: IVF<n> becomes IVF<keys/39> so the sample can train it */
        char scaled[256] = "";
        const char *ivf = strstr(want, "IVF");
        if (ivf && ivf[3] >= '0' && ivf[3] <= '9' && strlen(want) < 200) {
            const char *end = ivf + 3;
            while (*end >= '0' && *end <= '9') end++;
            /* ~39 training points per list (FAISS's minimum), at most 4*sqrt(N) as dfm index chooses */
            uint64_t nl = n_keys / 39, cap = (uint64_t)llround(4.0 * sqrt((double)n_keys));
            if (nl > cap) nl = cap;
            snprintf(scaled, sizeof scaled, "%.*s%llu%s", (int)(ivf + 3 - want), want, (unsigned long long)(nl ? nl : 1), end);
            rc = dfm_index_plan_make(scaled, n_keys, dim, 1, 0, metric, n_keys, plan);
            if (rc) dfm_error_clear();
        }
        if (!rc) {
            snprintf(why, n_why, "the run's '%s' cannot be trained on %llu sample keys (%.200s); same family with keys/39 lists: %s",
                     want, (unsigned long long)n_keys, first, plan->factory);
        } else {
            rc = dfm_index_plan_make("auto", n_keys, dim, 1, 0, metric, n_keys, plan);
            if (!rc)
                snprintf(why, n_why, "the run's '%s' cannot be trained on %llu sample keys (%.200s); used %s: %.200s",
                         want, (unsigned long long)n_keys, first, plan->factory, plan->why);
        }
    } else if (!rc) {
        if (strcmp(want, "auto")) snprintf(why, n_why, "the run's factory %s", plan->factory);
        else snprintf(why, n_why, "chosen for %llu keys as dfm index would: %.450s", (unsigned long long)n_keys, plan->why);
    }
    return rc;
}

int dfm_audit_measure_side(const dfm_audit_side_opts *o, const uint64_t *seeds, uint64_t n_keys, const uint64_t *qidx,
                           uint64_t n_queries, dfm_audit_side *side) {
    memset(side, 0, sizeof *side);
    if (!n_keys) return DFM_FAIL(DFM_EARG, "audit: the sample holds no keys. HINT: raise --token-level-sample");
    if (!o->dim) return DFM_FAIL(DFM_EARG, "audit: key width 0. HINT: --token-key-dim must be positive");
    if (!o->k) return DFM_FAIL(DFM_EARG, "audit: k 0");
    side->dim = o->dim;
    side->k = o->k;
    side->keys = n_keys;
    side->queries = n_queries;

    dfm_index_plan plan;
    int rc = dfm_audit_plan(o->index, o->metric, o->dim, n_keys, &plan, side->why, sizeof side->why);
    if (rc) return rc;
    snprintf(side->factory, sizeof side->factory, "%s", plan.factory);

    float *keys = NULL, *dist = NULL, *qbuf = NULL;
    int64_t *lab = NULL, *ids = NULL;
    FaissIndex *idx = NULL;
    uint8_t *ser = NULL;
    size_t ser_n = 0;
    uint64_t block = o->query_block ? o->query_block : 1024;
    double t0 = dfm_now();
    keys = malloc(sizeof(float) * n_keys * o->dim);
    ids = malloc(sizeof(int64_t) * n_keys);
    qbuf = malloc(sizeof(float) * block * o->dim);
    dist = malloc(sizeof(float) * block * o->k);
    lab = malloc(sizeof(int64_t) * block * o->k);
    if (!keys || !ids || !qbuf || !dist || !lab) {
        rc = DFM_FAIL(DFM_ENOMEM, "audit: no memory for %llu keys of width %u (%.1f MiB)", (unsigned long long)n_keys, o->dim,
                      (double)n_keys * o->dim * 4 / 1048576.0);
        goto done;
    }
    for (uint64_t i = 0; i < n_keys; i++) {
        dfm_audit_key(seeds[i], o->dim, keys + i * o->dim);
        ids[i] = (int64_t)i;
    }
    rc = dfm_index_create(&plan, o->dim, &idx);
    if (rc) goto done;
    if (!faiss_Index_is_trained(idx)) {
        rc = DFM_FAISS_CHECK(faiss_Index_train(idx, (int64_t)n_keys, keys), "training the audit index");
        if (rc) goto done;
    }
    rc = DFM_FAISS_CHECK(faiss_Index_add_with_ids(idx, (int64_t)n_keys, keys, ids), "adding keys to the audit index");
    if (rc) goto done;
    if (o->nprobe > 0 && plan.nlist) {
        rc = dfm_index_set_param(idx, "nprobe", (double)o->nprobe);
        if (rc) goto done;
    }
    side->build_s = dfm_now() - t0;

    /* one untimed search first (thread pool start-up, first touch), then repeat the whole query set
     * while it is short (< 0.5 s in all, at most 20 times) and keep the fastest: a tiny sample must
     * not be measured as FAISS's start-up cost */
    if (n_queries) {
        uint64_t nw = n_queries < 8 ? n_queries : 8;
        for (uint64_t j = 0; j < nw; j++) memcpy(qbuf + j * o->dim, keys + qidx[j] * o->dim, sizeof(float) * o->dim);
        rc = DFM_FAISS_CHECK(faiss_Index_search(idx, (int64_t)nw, qbuf, (int64_t)o->k, dist, lab), "searching the audit index");
        if (rc) goto done;
    }
    double best = -1, spent = 0;
    for (int rep = 0; rep < 20 && (rep == 0 || spent < 0.5); rep++) {
        double t1 = dfm_now();
        for (uint64_t q0 = 0; q0 < n_queries; q0 += block) {
            uint64_t nb = n_queries - q0 < block ? n_queries - q0 : block;
            for (uint64_t j = 0; j < nb; j++) memcpy(qbuf + j * o->dim, keys + qidx[q0 + j] * o->dim, sizeof(float) * o->dim);
            rc = DFM_FAISS_CHECK(faiss_Index_search(idx, (int64_t)nb, qbuf, (int64_t)o->k, dist, lab), "searching the audit index");
            if (rc) goto done;
            if (rep == 0)
                for (uint64_t j = 0; j < nb * o->k; j++) side->results += lab[j] >= 0;
        }
        double dt = dfm_now() - t1;
        spent += dt;
        if (best < 0 || dt < best) best = dt;
        side->repeats = rep + 1;
    }
    side->search_s = best < 0 ? 0 : best;
    side->s_per_query = n_queries ? side->search_s / (double)n_queries : 0;

    rc = dfm_index_to_buffer(idx, &ser, &ser_n);
    if (rc) goto done;
    side->index_bytes = ser_n;
    side->bytes_per_key = (double)ser_n / (double)n_keys;
done:
    free(ser);
    if (idx) faiss_Index_free(idx);
    free(keys);
    free(ids);
    free(qbuf);
    free(dist);
    free(lab);
    return rc;
}

/* ---- helpers ---------------------------------------------------------------------------------- */

const char *dfm_audit_secs(double s, char *b, size_t n) {
    if (!(s > 0)) snprintf(b, n, "0");
    else if (s < 1e-3) snprintf(b, n, "%.3g µs", s * 1e6);
    else if (s < 1) snprintf(b, n, "%.3g ms", s * 1e3);
    else if (s < 100) snprintf(b, n, "%.3g s", s);
    else if (s < 3600) snprintf(b, n, "%.0f s", s);
    else if (s < 86400 * 3) snprintf(b, n, "%.3g h", s / 3600);
    else if (s < 86400 * 365.25 * 3) snprintf(b, n, "%.3g days", s / 86400);
    else snprintf(b, n, "%.3g years", s / (86400 * 365.25));
    return b;
}

const char *dfm_audit_bytes(double v, char *b, size_t n) {
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int i = 0;
    while (v >= 1000 && i < 6) v /= 1024, i++; /* "1000 KiB" reads better as "0.977 MiB" than as "1e+03 KiB" */
    snprintf(b, n, i ? "%.3g %s" : "%.0f %s", v, u[i]);
    return b;
}

const char *dfm_audit_human(double v, char *buf, size_t n) {
    static const char *pre[] = {"", " k", " M", " G", " T", " P", " E"};
    int i = 0;
    double a = fabs(v);
    while (a >= 1000 && i < 6) {
        a /= 1000;
        v /= 1000;
        i++;
    }
    if (i == 0 && v == floor(v)) snprintf(buf, n, "%.0f", v);
    else snprintf(buf, n, "%.3g%s", v, pre[i]);
    return buf;
}

const char *dfm_audit_saving_words(double saving, int digits, const char *less, char *b, size_t n) {
    if (isnan(saving)) snprintf(b, n, "not measured");
    else if (saving > 0) snprintf(b, n, "%.*f %% %s", digits, 100 * saving, less);
    else if (saving < 0) snprintf(b, n, "%.*f %% more", digits, -100 * saving);
    else snprintf(b, n, "the same");
    return b;
}

/* ---- helpers ---------------------------------------------------------------------------------------- */

const char *const dfm_audit_stages[DFM_AUDIT_N_STAGES] = {"chunk", "encode", "index", "retrieve", "targets"};

int dfm_audit_config_hash(json_t *m, char out[33]) {
    json_t *all = json_object();
    if (!all) return DFM_FAIL(DFM_ENOMEM, "no memory");
    for (int i = 0; i < DFM_AUDIT_N_STAGES; i++) {
        json_t *s = dfm_manifest_stage(m, dfm_audit_stages[i]);
        json_t *c = s ? json_object_get(s, "config") : NULL;
        json_object_set(all, dfm_audit_stages[i], c ? c : json_null());
    }
    char *txt = json_dumps(all, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(all);
    if (!txt) return DFM_FAIL(DFM_ENOMEM, "no memory");
    XXH128_hash_t h = XXH3_128bits(txt, strlen(txt));
    free(txt);
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
    return DFM_OK;
}
