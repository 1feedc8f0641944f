#include "retriever/index.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "schemas/neighbor_shard.h"

#include <faiss/c_api/AutoTune_c.h>
#include <faiss/c_api/error_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <faiss/c_api/index_io_c.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dfm_faiss_check_at(int frc, const char *what, const char *file, int line) {
    if (frc == 0) return DFM_OK;
    const char *e = faiss_get_last_error();
    /* FAISS messages are long multi-line C++ exception texts; keep the first line */
    char msg[600];
    snprintf(msg, sizeof msg, "%s", e ? e : "(no message)");
    char *nl = strchr(msg, '\n');
    if (nl) *nl = 0;
    return dfm_fail_at(file, line, DFM_EFAISS, "FAISS failed %s: %s", what, msg);
}

/* ---- plan ---- */

static int find_int_after(const char *s, const char *tok, uint64_t *v, const char **after) {
    const char *p = s;
    while ((p = strstr(p, tok))) {
        const char *q = p + strlen(tok);
        if (*q >= '0' && *q <= '9') {
            char *end;
            *v = strtoull(q, &end, 10);
            if (after) *after = end;
            return 1;
        }
        p = q;
    }
    return 0;
}

static int has_token(const char *s, const char *tok) {
    /* token at the start of a comma-separated component, e.g. ",PQ32" or "SQ8" */
    size_t n = strlen(tok);
    for (const char *p = s; *p;) {
        const char *c = p;
        while (*c == ' ') c++;
        if (!strncmp(c, tok, n)) return 1;
        const char *comma = strchr(p, ',');
        if (!comma) break;
        p = comma + 1;
    }
    return 0;
}

/* Insert "np" after every product quantiser of a factory string that lacks it ("PQ16", "PQ16x8", at the
 * start of a component or after '_'): FAISS then skips polysemous training, which only a Hamming-filtered
 * search uses (polysemous_ht, never set by dfm) and which took 91 s on 2,032 vectors. Returns how many
 * were inserted; 0 when f has no room. Forms with a suffix (x4fs, +8, np) are left as they are. */
static int add_no_polysemous(char *f, size_t cap) {
    int added = 0;
    for (size_t i = 0; f[i]; i++) {
        if (f[i] != 'P' || f[i + 1] != 'Q' || (i > 0 && f[i - 1] != ',' && f[i - 1] != '_')) continue;
        size_t j = i + 2;
        if (f[j] < '0' || f[j] > '9') continue;
        while (f[j] >= '0' && f[j] <= '9') j++;
        if (f[j] == 'x' && f[j + 1] >= '0' && f[j + 1] <= '9') {
            j++;
            while (f[j] >= '0' && f[j] <= '9') j++;
        }
        if (f[j] != 0 && f[j] != ',') continue;
        size_t n = strlen(f);
        if (n + 3 > cap) return 0;
        memmove(f + j + 2, f + j, n - j + 1);
        f[j] = 'n', f[j + 1] = 'p';
        added++;
        i = j + 1;
    }
    return added;
}

/* The first fast-scan product quantiser of f ("PQ48x4fs", "PQ32x4fsr", "PQ16fs": a PQ component whose code
 * suffix starts with "fs"): its start, and in *len its length up to the end of the component. NULL if none. */
static const char *find_fast_scan(const char *f, size_t *len) {
    for (const char *p = f; (p = strstr(p, "PQ")); p += 2) {
        const char *q = p + 2;
        if (*q < '0' || *q > '9') continue;
        while (*q >= '0' && *q <= '9') q++;
        if (*q == 'x' && q[1] >= '0' && q[1] <= '9') {
            q++;
            while (*q >= '0' && *q <= '9') q++;
        }
        if (q[0] != 'f' || q[1] != 's') continue;
        *len = strcspn(p, ",");
        return p;
    }
    return NULL;
}

/* FAISS 1.7.3's fast-scan codes, refused before any work (issue 39, measured): IndexIVFFastScan has no
 * inverted-list scanner, so search_preassigned (dfm's per-shard search, retriever/ivf.c) dereferences a
 * null pointer; its block-packed lists ("ilbl") are not the array lists dfm moves between shards; and
 * Debian's libfaiss has no AVX2 kernels for them, so a 4-bit code scans ~2.8x slower per byte than an
 * 8-bit PQ code, and recalls less. */
static int refuse_fast_scan(const char *factory, uint32_t dim) {
    size_t len = 0;
    const char *fs = find_fast_scan(factory, &len);
    if (!fs) return DFM_OK;
    char *x = memchr(fs, 'x', len);
    uint64_t m = strtoull(fs + 2, NULL, 10), bits = x ? strtoull(x + 1, NULL, 10) : 4, bytes = (m * bits + 7) / 8;
    char same[96] = "";
    if (bytes && bytes < m && dim % bytes == 0)
        snprintf(same, sizeof same, ", or PQ%llunp for the same %llu bytes a vector", (unsigned long long)bytes, (unsigned long long)bytes);
    return DFM_FAIL(DFM_EARG,
                    "--index %s: fast-scan PQ ('%.*s') is refused with this FAISS (1.7.3): an IVF fast-scan index crashes (SIGSEGV) when "
                    "dfm searches a shard's probe lists with search_preassigned, its block-packed inverted lists are not the array "
                    "lists dfm moves between shards, and this FAISS build has no AVX2 kernels for it, so it scans ~2.8x slower per "
                    "byte than 8-bit PQ and recalls less. HINT: use 8-bit PQ without polysemous training (IVF<lists>,PQ<M>np): "
                    "replace '%.*s' with 'PQ%llunp'%s",
                    factory, (int)len, fs, (int)len, fs, (unsigned long long)m, same);
}

/* FAISS's precomputed table for an L2 IVF-PQ search by residual (IndexIVFPQ::precompute_table, 1.7.3): nlist x
 * M x 2^nbits floats, built after training and on every read of the index, used only while it is at most
 * DFM_FAISS_PRECOMPUTED_TABLE_MAX bytes (precomputed_table_max_bytes); above that FAISS silently builds a
 * table per (query, list) instead. Inner product needs none. */
static uint64_t l2_table_bytes(uint64_t nlist, uint64_t m, uint64_t nbits) { return nlist * m * (1ull << nbits) * 4ull; }

static int needs_idmap(const char *f) {
    return !strstr(f, "IVF") && !strstr(f, "IMI") && strncmp(f, "IDMap", 5) != 0;
}

int dfm_index_plan_make(const char *factory, uint64_t n, uint32_t dim, int nranks, uint64_t mem_budget, uint32_t metric,
                        uint64_t train_sample, dfm_index_plan *plan) {
    memset(plan, 0, sizeof *plan);
    plan->metric = metric;
    if (n == 0) return DFM_FAIL(DFM_EARG, "no vectors to index. HINT: the encode stage produced no embeddings");
    if (dim == 0) return DFM_FAIL(DFM_EARG, "embedding dimension 0");
    if (metric > DFM_METRIC_L2) return DFM_FAIL(DFM_EARG, "unknown metric %u (ip or l2)", metric);
    if (nranks < 1) nranks = 1;
    if (!mem_budget) mem_budget = 4ull << 30;
    uint64_t per_rank = (n + (uint64_t)nranks - 1) / (uint64_t)nranks;
    uint64_t flat_bytes = per_rank * (4ull * dim + 8);
    int automatic = !factory || !factory[0] || !strcmp(factory, "auto");
    if (automatic) {
        uint64_t nlist = (uint64_t)llround(4.0 * sqrt((double)n));
        if (n <= DFM_INDEX_FLAT_MAX && flat_bytes <= mem_budget) {
            snprintf(plan->factory, sizeof plan->factory, "IDMap,Flat");
            snprintf(plan->why, sizeof plan->why,
                     "Flat (exact): %llu vectors <= %llu, so brute force is cheap; %.1f MiB per rank fits --index-memory %.1f MiB",
                     (unsigned long long)n, DFM_INDEX_FLAT_MAX, flat_bytes / 1048576.0, mem_budget / 1048576.0);
        } else if (flat_bytes + nlist * 4ull * dim <= mem_budget) {
            snprintf(plan->factory, sizeof plan->factory, "IVF%llu,Flat", (unsigned long long)nlist);
            snprintf(plan->why, sizeof plan->why,
                     "IVF%llu,Flat: %llu vectors > %llu, lists = 4*sqrt(N); full vectors (%.1f MiB per rank) fit --index-memory %.1f MiB",
                     (unsigned long long)nlist, (unsigned long long)n, DFM_INDEX_FLAT_MAX, flat_bytes / 1048576.0, mem_budget / 1048576.0);
        } else {
            static const uint32_t ms[] = {128, 96, 64, 48, 32, 24, 16, 12, 8, 4, 2, 1};
            uint32_t m = 0;
            for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
                if (ms[i] > dim / 2 || dim % ms[i]) continue;
                /* an L2 search keeps FAISS's precomputed table while it is small enough to be built */
                uint64_t table = metric == DFM_METRIC_L2 ? l2_table_bytes(nlist, ms[i], 8) : 0;
                if (table > DFM_FAISS_PRECOMPUTED_TABLE_MAX) table = 0;
                if (per_rank * (ms[i] + 8ull) + nlist * 4ull * dim + table <= mem_budget) {
                    m = ms[i];
                    break;
                }
            }
            if (!m)
                return DFM_FAIL(DFM_EARG,
                                "no index of %llu vectors (dim %u) fits --index-memory %llu bytes per rank on %d ranks (even the smallest PQ code needs ~%llu). HINT: raise --index-memory or use more ranks",
                                (unsigned long long)n, dim, (unsigned long long)mem_budget, nranks,
                                (unsigned long long)(per_rank * 9ull + nlist * 4ull * dim));
            /* "np": no polysemous training (slow, and only for Hamming-filtered search, which dfm does not use) */
            snprintf(plan->factory, sizeof plan->factory, "IVF%llu,PQ%unp", (unsigned long long)nlist, m);
            snprintf(plan->why, sizeof plan->why,
                     "IVF%llu,PQ%u: full vectors need %.1f MiB per rank > --index-memory %.1f MiB; %u-byte PQ codes need %.1f MiB",
                     (unsigned long long)nlist, m, flat_bytes / 1048576.0, mem_budget / 1048576.0, m,
                     (per_rank * (m + 8ull)) / 1048576.0);
        }
    } else {
        if (strlen(factory) + 7 >= sizeof plan->factory) return DFM_FAIL(DFM_EARG, "--index string is too long (%zu characters)", strlen(factory));
        DFM_TRY(refuse_fast_scan(factory, dim));
        snprintf(plan->factory, sizeof plan->factory, "%s%s", needs_idmap(factory) ? "IDMap," : "", factory);
        int np = add_no_polysemous(plan->factory, sizeof plan->factory);
        snprintf(plan->why, sizeof plan->why, "given with --index%s%s", needs_idmap(factory) ? " (wrapped in IDMap for global ids)" : "",
                 np ? "; 'np' added: no polysemous training (dfm's search does not use it)" : "");
    }
    const char *f = plan->factory;
    uint64_t v = 0;
    const char *after = NULL;
    if (find_int_after(f, "IVF", &v, NULL)) plan->nlist = v;
    else if (find_int_after(f, "IMI2x", &v, NULL) && v < 32) plan->nlist = 1ull << v; /* each half-quantiser has 2^b centroids */
    plan->min_train = plan->nlist;
    uint64_t pq_nbits = 0, pq_m = 0;
    if (find_int_after(f, "PQ", &v, &after)) {
        pq_nbits = 8;
        pq_m = v;
        if (*after == 'x' && after[1] >= '0' && after[1] <= '9') pq_nbits = strtoull(after + 1, NULL, 10);
        if (pq_nbits > 16) return DFM_FAIL(DFM_EARG, "--index %s: PQ with %llu bits per code is not supported", f, (unsigned long long)pq_nbits);
        if (v == 0 || dim % v) return DFM_FAIL(DFM_EARG, "--index %s: PQ%llu must divide the dimension %u. HINT: pick M with %u %% M == 0", f,
                                              (unsigned long long)v, dim, dim);
        if ((1ull << pq_nbits) > plan->min_train) plan->min_train = 1ull << pq_nbits;
    }
    int trains = plan->nlist || pq_nbits || has_token(f, "SQ") || has_token(f, "OPQ") || has_token(f, "PCA") || has_token(f, "LSH");
    plan->exact_scores = !strstr(f, "PQ") && !has_token(f, "SQ") && !has_token(f, "LSH") && !has_token(f, "RQ") && !has_token(f, "LSQ") &&
                         !has_token(f, "PCA") && !has_token(f, "OPQ");
    plan->bytes_per_rank = plan->exact_scores ? flat_bytes : per_rank * 40ull;
    if (metric == DFM_METRIC_L2 && pq_nbits && find_int_after(f, "IVF", &v, NULL)) {
        plan->l2_table_bytes = l2_table_bytes(plan->nlist, pq_m, pq_nbits);
        plan->l2_table_used = plan->l2_table_bytes <= DFM_FAISS_PRECOMPUTED_TABLE_MAX;
        size_t w = strlen(plan->why);
        if (plan->l2_table_used) {
            plan->bytes_per_rank += plan->l2_table_bytes;
            snprintf(plan->why + w, sizeof plan->why - w, "; L2: FAISS's precomputed table, %.1f MiB per loaded shard, counted",
                     plan->l2_table_bytes / 1048576.0);
        } else {
            snprintf(plan->why + w, sizeof plan->why - w, "; L2: FAISS's precomputed table (%.2f GiB) is over its 2 GiB cap and is not built",
                     plan->l2_table_bytes / 1073741824.0);
            DFM_LOG_W("index %s with --metric l2: FAISS's precomputed table would take %llu x %llu x %llu x 4 = %.2f GiB, over FAISS 1.7.3's "
                      "2 GiB cap (precomputed_table_max_bytes), so FAISS silently builds a table per (query, list) instead, ~9x slower "
                      "per list scanned (measured at d=384). HINT: use --metric ip (no table needed; the same order for unit vectors), "
                      "fewer lists or a smaller M",
                      f, (unsigned long long)plan->nlist, (unsigned long long)pq_m, 1ull << pq_nbits, plan->l2_table_bytes / 1073741824.0);
        }
    }
    if (trains) {
        if (plan->min_train < 1) plan->min_train = 1;
        uint64_t want = train_sample;
        if (!want) {
            want = plan->nlist ? 100 * plan->nlist : 0;
            if (pq_nbits && want < 39ull << pq_nbits) want = 39ull << pq_nbits;
            if (want < 1000) want = 1000;
            if (want > n) want = n;
        }
        if (want > n)
            return DFM_FAIL(DFM_EARG, "--train-sample %llu is more than the %llu vectors there are. HINT: use --train-sample %llu or less",
                            (unsigned long long)want, (unsigned long long)n, (unsigned long long)n);
        if (want < plan->min_train)
            return DFM_FAIL(DFM_EARG,
                            "index %s needs at least %llu training points (%s) but only %llu are available (%llu vectors, --train-sample %llu). HINT: use fewer lists, e.g. --index IVF%llu,Flat (about 100 points per list), or 'Flat' for a corpus this small",
                            f, (unsigned long long)plan->min_train, plan->nlist >= plan->min_train ? "one per list" : "one per PQ centroid",
                            (unsigned long long)want, (unsigned long long)n, (unsigned long long)train_sample,
                            (unsigned long long)(want / 100 > 1 ? want / 100 : 1));
        if (plan->nlist && want < 39 * plan->nlist)
            DFM_LOG_W("index %s: %llu training points is fewer than 39 per list; the lists will be poorly balanced", f, (unsigned long long)want);
        plan->train_n = want;
    }
    return DFM_OK;
}

/* ---- sampling ---- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void dfm_sample_ids_range(uint64_t n, uint64_t m, uint64_t seed, uint64_t j0, uint64_t j1, uint64_t *out) {
    /* draw j of the seeded splitmix64 stream, directly: its state after j + 1 steps is st0 + (j+1) * gamma */
    const uint64_t st0 = seed * 0x2545F4914F6CDD1Dull + 1;
    for (uint64_t j = j0; j < j1; j++) {
        uint64_t st = st0 + j * 0x9e3779b97f4a7c15ull;
        uint64_t r = splitmix64(&st);
        /* stratum [j*n/m, (j+1)*n/m), computed without overflow in 128-bit */
        uint64_t lo = (uint64_t)(((unsigned __int128)j * n) / m), hi = (uint64_t)(((unsigned __int128)(j + 1) * n) / m);
        out[j - j0] = lo + (hi > lo ? r % (hi - lo) : 0);
    }
}

void dfm_sample_ids(uint64_t n, uint64_t m, uint64_t seed, uint64_t *out) { dfm_sample_ids_range(n, m, seed, 0, m, out); }

/* ---- create, serialise ---- */

int dfm_index_create(const dfm_index_plan *plan, uint32_t dim, FaissIndex **out) {
    *out = NULL;
    int rc = DFM_FAISS_CHECK(faiss_index_factory(out, (int)dim, plan->factory, plan->metric == DFM_METRIC_IP ? METRIC_INNER_PRODUCT : METRIC_L2),
                             "creating the index");
    if (rc) {
        *out = NULL;
        return dfm_error_prefix("--index '%s' (dim %u). HINT: see the FAISS index-factory documentation for valid strings", plan->factory, dim);
    }
    return DFM_OK;
}

int dfm_index_to_buffer(const FaissIndex *idx, uint8_t **buf, size_t *n) {
    char *p = NULL;
    size_t sz = 0;
    FILE *f = open_memstream(&p, &sz);
    if (!f) return DFM_FAIL(DFM_ENOMEM, "no memory to serialise the index");
    int rc = DFM_FAISS_CHECK(faiss_write_index(idx, f), "serialising the index");
    fclose(f);
    if (rc) {
        free(p);
        return rc;
    }
    *buf = (uint8_t *)p;
    *n = sz;
    return DFM_OK;
}

int dfm_index_from_buffer(const uint8_t *buf, size_t n, FaissIndex **out) {
    *out = NULL;
    FILE *f = fmemopen((void *)buf, n, "rb");
    if (!f) return DFM_FAIL(DFM_ENOMEM, "no memory to read the index");
    int rc = DFM_FAISS_CHECK(faiss_read_index(f, 0, out), "reading a serialised index");
    fclose(f);
    if (rc) *out = NULL;
    return rc;
}

/* ---- files ---- */

char *dfm_index_path(const char *run_dir, int shard, const char *ext) { return dfm_strdupf("%s/index/index-%05d.%s", run_dir, shard, ext); }

static char *sidecar_path(const char *faiss_path) {
    size_t n = strlen(faiss_path);
    if (n > 6 && !strcmp(faiss_path + n - 6, ".faiss")) return dfm_strdupf("%.*s.json", (int)(n - 6), faiss_path);
    return dfm_strdupf("%s.json", faiss_path);
}

int dfm_index_write(const char *faiss_path, const FaissIndex *idx, dfm_index_info *info) {
    dfm_atomic_file f;
    DFM_TRY(dfm_atomic_open(&f, faiss_path));
    int rc = DFM_FAISS_CHECK(faiss_write_index(idx, f.fp), "writing the index");
    if (rc) {
        dfm_error_prefix("%s", faiss_path);
        dfm_atomic_abort(&f);
        return rc;
    }
    if (fflush(f.fp) != 0) {
        dfm_atomic_abort(&f);
        return DFM_FAIL(DFM_ENOSPACE, "writing %s: flush failed (disk full?)", faiss_path);
    }
    DFM_TRY(dfm_atomic_commit(&f));
    DFM_TRY(dfm_file_size(faiss_path, &info->bytes));
    DFM_TRY(dfm_file_hash(faiss_path, info->xxh128));
    const char *slash = strrchr(faiss_path, '/');
    json_t *j = json_pack("{s:s, s:i, s:s, s:i, s:s, s:s, s:I, s:I, s:I, s:i, s:i, s:I, s:s, s:s, s:b, s:s}", "format", DFM_INDEX_FORMAT,
                          "version", DFM_INDEX_VERSION, "file", slash ? slash + 1 : faiss_path, "dim", (int)info->dim, "metric",
                          info->metric == DFM_METRIC_IP ? "ip" : "l2", "factory", info->factory, "ntotal", (json_int_t)info->ntotal,
                          "first_id", (json_int_t)info->first_id, "end_id", (json_int_t)info->end_id, "shard", info->shard, "n_shards",
                          info->n_shards, "bytes", (json_int_t)info->bytes, "xxh128", info->xxh128, "trained_xxh128",
                          info->trained_xxh128, "exact_scores", info->exact_scores, "sharding", info->by_list ? "lists" : "ids");
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    char *sp = sidecar_path(faiss_path);
    if (!text || !sp) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    else rc = dfm_write_file_atomic(sp, text, strlen(text));
    free(text);
    free(sp);
    json_decref(j);
    if (!rc) dfm_fault_point("index:shard-written", -1);
    return rc;
}

int dfm_index_load(const char *faiss_path, uint32_t expect_dim, int expect_metric, FaissIndex **out, dfm_index_info *info) {
    *out = NULL;
    memset(info, 0, sizeof *info);
    char *sp = sidecar_path(faiss_path);
    if (!sp) return DFM_FAIL(DFM_ENOMEM, "no memory");
    json_error_t e;
    json_t *j = json_load_file(sp, JSON_REJECT_DUPLICATES, &e);
    int rc = DFM_OK;
    if (!j) {
        rc = dfm_path_exists(sp) ? DFM_FAIL(DFM_EFORMAT, "index sidecar %s line %d: %s. HINT: re-run 'dfm index'", sp, e.line, e.text)
                                 : DFM_FAIL(DFM_ENOTFOUND, "index sidecar %s does not exist. HINT: run 'dfm index' first", sp);
    } else if (strcmp(json_string_value(json_object_get(j, "format")) ?: "", DFM_INDEX_FORMAT) ||
               json_integer_value(json_object_get(j, "version")) != DFM_INDEX_VERSION) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s is not a version-%d dfm index sidecar", sp, DFM_INDEX_VERSION);
    } else {
        info->dim = (uint32_t)json_integer_value(json_object_get(j, "dim"));
        const char *met = json_string_value(json_object_get(j, "metric")) ?: "";
        info->metric = !strcmp(met, "ip") ? DFM_METRIC_IP : DFM_METRIC_L2;
        snprintf(info->factory, sizeof info->factory, "%s", json_string_value(json_object_get(j, "factory")) ?: "");
        info->ntotal = (uint64_t)json_integer_value(json_object_get(j, "ntotal"));
        info->first_id = (uint64_t)json_integer_value(json_object_get(j, "first_id"));
        info->end_id = (uint64_t)json_integer_value(json_object_get(j, "end_id"));
        info->shard = (int)json_integer_value(json_object_get(j, "shard"));
        info->n_shards = (int)json_integer_value(json_object_get(j, "n_shards"));
        info->bytes = (uint64_t)json_integer_value(json_object_get(j, "bytes"));
        info->exact_scores = json_is_true(json_object_get(j, "exact_scores"));
        info->by_list = !strcmp(json_string_value(json_object_get(j, "sharding")) ?: "ids", "lists");
        snprintf(info->xxh128, sizeof info->xxh128, "%s", json_string_value(json_object_get(j, "xxh128")) ?: "");
        snprintf(info->trained_xxh128, sizeof info->trained_xxh128, "%s", json_string_value(json_object_get(j, "trained_xxh128")) ?: "");
        if (strcmp(met, "ip") && strcmp(met, "l2")) rc = DFM_FAIL(DFM_EFORMAT, "index sidecar %s: metric '%s' is neither ip nor l2", sp, met);
    }
    json_decref(j);
    free(sp);
    if (rc) return rc;
    if (expect_dim && info->dim != expect_dim)
        return DFM_FAIL(DFM_EMISMATCH, "index %s has dimension %u but the embeddings have %u. HINT: the index was built from other embeddings; re-run 'dfm index'",
                        faiss_path, info->dim, expect_dim);
    if (expect_metric >= 0 && info->metric != (uint32_t)expect_metric)
        return DFM_FAIL(DFM_EMISMATCH, "index %s uses metric %s but %s was asked for. HINT: drop --metric or re-run 'dfm index --metric %s'", faiss_path,
                        info->metric == DFM_METRIC_IP ? "ip" : "l2", expect_metric == DFM_METRIC_IP ? "ip" : "l2",
                        expect_metric == DFM_METRIC_IP ? "ip" : "l2");
    uint64_t size = 0;
    char hash[33];
    DFM_TRY(dfm_file_size(faiss_path, &size));
    if (size != info->bytes)
        return DFM_FAIL(DFM_ETRUNCATED, "index %s is %llu bytes, its sidecar says %llu (truncated or replaced). HINT: re-run 'dfm index'", faiss_path,
                        (unsigned long long)size, (unsigned long long)info->bytes);
    DFM_TRY(dfm_file_hash(faiss_path, hash));
    if (strcmp(hash, info->xxh128))
        return DFM_FAIL(DFM_ECHECKSUM, "index %s: checksum %s does not match its sidecar's %s (the file is damaged). HINT: re-run 'dfm index'",
                        faiss_path, hash, info->xxh128);
    FaissIndex *idx = NULL;
    rc = DFM_FAISS_CHECK(faiss_read_index_fname(faiss_path, 0, &idx), "reading the index");
    if (rc) return dfm_error_prefix("%s", faiss_path);
    int d = faiss_Index_d(idx);
    FaissMetricType mt = faiss_Index_metric_type(idx);
    uint64_t nt = (uint64_t)faiss_Index_ntotal(idx);
    if ((uint32_t)d != info->dim || (mt == METRIC_INNER_PRODUCT ? DFM_METRIC_IP : DFM_METRIC_L2) != info->metric || nt != info->ntotal ||
        (mt != METRIC_INNER_PRODUCT && mt != METRIC_L2)) {
        faiss_Index_free(idx);
        return DFM_FAIL(DFM_EMISMATCH, "index %s holds dim %d, metric %d, %llu vectors but its sidecar says dim %u, %s, %llu. HINT: re-run 'dfm index'",
                        faiss_path, d, (int)mt, (unsigned long long)nt, info->dim, info->metric == DFM_METRIC_IP ? "ip" : "l2",
                        (unsigned long long)info->ntotal);
    }
    *out = idx;
    return DFM_OK;
}

int dfm_index_load_trained(const char *run_dir, const char *xxh128, FaissIndex **out) {
    *out = NULL;
    char *path = dfm_path_join(run_dir, DFM_INDEX_TRAINED_FILE), hash[33];
    if (!path) return DFM_FAIL(DFM_ENOMEM, "no memory");
    int rc = DFM_OK;
    if (!dfm_path_exists(path)) rc = DFM_FAIL(DFM_ENOTFOUND, "%s does not exist (indexed by an older dfm). HINT: re-run 'dfm index --force'", path);
    if (!rc) rc = dfm_file_hash(path, hash);
    if (!rc && (!xxh128 || strcmp(hash, xxh128)))
        rc = DFM_FAIL(DFM_ECHECKSUM, "%s: checksum %s is not the index stage's trained_xxh128 %s (damaged or from another index). HINT: re-run 'dfm index --force'",
                      path, hash, xxh128 ? xxh128 : "(none)");
    if (!rc && DFM_FAISS_CHECK(faiss_read_index_fname(path, 0, out), "reading the trained index")) rc = dfm_error_prefix("%s", path);
    free(path);
    return rc;
}

int dfm_index_set_param(FaissIndex *idx, const char *name, double value) {
    FaissParameterSpace *ps = NULL;
    int rc = DFM_FAISS_CHECK(faiss_ParameterSpace_new(&ps), "creating a parameter space");
    if (rc) return rc;
    if (faiss_ParameterSpace_set_index_parameter(ps, idx, name, value) != 0) {
        const char *e = faiss_get_last_error();
        char msg[300];
        snprintf(msg, sizeof msg, "%s", e ? e : "");
        char *nl = strchr(msg, '\n');
        if (nl) *nl = 0;
        rc = DFM_FAIL(DFM_EARG, "cannot set search parameter %s=%g on this index (%s). HINT: nprobe applies to IVF indexes, efSearch to HNSW", name,
                      value, msg);
    }
    faiss_ParameterSpace_free(ps);
    return rc;
}

int dfm_faiss_search(void *ctx, size_t nq, const float *q, size_t kp, float *dist, int64_t *labels) {
    return DFM_FAISS_CHECK(faiss_Index_search((FaissIndex *)ctx, (idx_t)nq, q, (idx_t)kp, dist, (idx_t *)labels), "searching the index");
}
