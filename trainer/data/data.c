/* data.c — token sequences, target memory and the shuffling loader (see data.h). */
#include "trainer/data/data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/manifest.h"
#include "schemas/chunk_shard.h"
#include "shard/target_reader.h"
#include "trainer/kernels/rng.h"

#define TGT_MAGIC "DFMTGTS1"
#define TGT_HEADER 64
#define BIN_MAGIC 20240520
#define BIN_MAGIC_U32 20240801
#define BIN_VERSION_U32 7

struct TargetReader {
    /* simple file */
    uint8_t *file;          /* whole file */
    size_t file_bytes;
    const uint8_t *mask;    /* [n_chunks*k] */
    const float *emb;       /* [n_chunks*k*d] (memcpy'd out: the file may be unaligned) */
    uint64_t n_chunks;
    /* run folder */
    dfm_target_reader *reader;
    int64_t *ids;
    float *scores;
    /* what opened it (for data_targets_clone); a clone of a simple file borrows the original's memory */
    char *path, *tokens_run;
    int want_k, want_d, borrowed;
};

static int load_bin(const char *path, DataSet *ds) {
    char *buf;
    size_t len;
    DFM_TRY(dfm_read_file(path, &buf, &len));
    int rc = DFM_OK;
    int32_t h[256];
    if (len < sizeof h) {
        rc = DFM_FAIL(DFM_ETRUNCATED, "%s: %zu bytes, shorter than the 1024-byte token-shard header", path, len);
        goto out;
    }
    memcpy(h, buf, sizeof h);
    /* schemas/token_shard.md: llm.c's 20240520/1 (uint16 ids) and 20240801/7 (uint32 ids), as dfm chunk
     * reads them; 20240520/2 (uint32) is what dfm-train wrote before and is still read */
    size_t w = 0;
    if (h[0] == BIN_MAGIC && h[1] == 1) w = 2;
    else if ((h[0] == BIN_MAGIC_U32 && h[1] == BIN_VERSION_U32) || (h[0] == BIN_MAGIC && h[1] == 2)) w = 4;
    if (!w) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: token shard magic %d version %d unknown (20240520/1 = uint16, 20240801/7 = "
                      "uint32). HINT: --data takes an llm.c token shard or a chunk run", path, h[0], h[1]);
        goto out;
    }
    size_t n = (uint32_t)h[2];
    if (len != sizeof h + n * w) {
        rc = DFM_FAIL(DFM_ETRUNCATED, "%s: header says %zu tokens of %zu bytes but the file has %zu bytes", path, n,
                      w, len);
        goto out;
    }
    ds->tokens = malloc(n * sizeof(int));
    if (!ds->tokens) {
        rc = DFM_FAIL(DFM_ENOMEM, "%zu tokens", n);
        goto out;
    }
    const uint8_t *p = (const uint8_t *)buf + sizeof h;
    for (size_t i = 0; i < n; i++) {
        uint32_t v;
        if (w == 2) {
            uint16_t s;
            memcpy(&s, p + 2 * i, 2);
            v = s;
        } else {
            memcpy(&v, p + 4 * i, 4);
        }
        if (v > 0x7fffffffu) {
            rc = DFM_FAIL(DFM_EFORMAT, "%s: token %zu = %u is out of range", path, i, v);
            goto out;
        }
        ds->tokens[i] = (int)v;
        if (v > ds->max_token) ds->max_token = v;
    }
    ds->n_tokens = n;
out:
    free(buf);
    return rc;
}

static int load_run_once(const char *dir, DataSet *ds) {
    dfm_chunk_set *set;
    DFM_TRY(dfm_chunk_set_open(dir, &set));
    size_t L = set->chunk_len, n = (size_t)set->n_chunks * L;
    ds->tokens = malloc((n ? n : 1) * sizeof(int));
    if (!ds->tokens) {
        dfm_chunk_set_close(set);
        return DFM_FAIL(DFM_ENOMEM, "%zu tokens", n);
    }
    for (uint64_t c = 0; c < set->n_chunks; c++) {
        const dfm_chunk_meta *meta;
        const uint32_t *tok;
        int rc = dfm_chunk_set_get(set, c, &meta, &tok);
        if (rc) {
            dfm_chunk_set_close(set);
            return rc;
        }
        for (size_t j = 0; j < L; j++) {
            ds->tokens[c * L + j] = (int)tok[j];
            if (tok[j] > ds->max_token) ds->max_token = tok[j];
        }
        if (meta->n_valid < L) { /* filler after a document's end (doc-aligned runs) */
            if (!ds->pad && !(ds->pad = calloc(n ? n : 1, 1))) {
                dfm_chunk_set_close(set);
                return DFM_FAIL(DFM_ENOMEM, "padding map of %zu tokens", n);
            }
            memset(ds->pad + c * L + meta->n_valid, 1, L - meta->n_valid);
        }
    }
    ds->n_tokens = n;
    ds->chunk_len = (int)L;
    ds->tokenizer_hash = set->n_shards ? set->shards[0]->hdr.tokenizer_hash : 0;
    dfm_chunk_set_close(set);
    return DFM_OK;
}

/* The tokens of one generation of the chunk stage (schemas/manifest.md, "Readers"): its generation before
 * and after copying them must agree, else a rebuild ran meanwhile and they are read again. */
static int load_run(const char *dir, DataSet *ds) {
    for (int attempt = 0;; attempt++) {
        char before[17], now[17];
        int rc = dfm_manifest_read_generation(dir, "chunk", before);
        if (!rc) rc = load_run_once(dir, ds);
        int nrc = dfm_manifest_read_generation(dir, "chunk", now);
        if (!nrc && !strcmp(before, now)) {
            memcpy(ds->tokens_generation, now, 17);
            return rc;
        }
        free(ds->tokens), ds->tokens = NULL;
        free(ds->pad), ds->pad = NULL;
        if (attempt == 4) return nrc ? nrc : DFM_FAIL(DFM_ESTATE, "the chunks of %s were rebuilt while dfm-train read them, "
                                                      "5 times. HINT: start it again when the rebuild is over", dir);
        struct timespec ts = {0, 50000000L << attempt};
        nanosleep(&ts, NULL);
    }
}

int data_open(const char *path, int T, DataSet *ds) {
    memset(ds, 0, sizeof *ds);
    if (T <= 0) return DFM_FAIL(DFM_EARG, "sequence length %d must be positive", T);
    char *man = dfm_path_join(path, "manifest.json");
    int is_run = man && dfm_path_exists(man);
    free(man);
    int rc = is_run ? load_run(path, ds) : load_bin(path, ds);
    if (rc) {
        dfm_error_prefix("while loading tokens from %s", path);
        data_close(ds);
        return rc;
    }
    ds->T = T;
    ds->n_seq = ds->n_tokens > 1 ? (ds->n_tokens - 1) / T : 0;
    if (ds->n_seq < 2) {
        size_t have = ds->n_tokens;
        data_close(ds);
        return DFM_FAIL(DFM_EARG, "%s: %zu tokens make fewer than 2 sequences of %d. HINT: more data or --seq-len",
                        path, have, T);
    }
    DFM_LOG_I("data: %zu tokens from %s, %zu sequences of %d, max token id %u", ds->n_tokens, path, ds->n_seq, T,
              ds->max_token);
    return DFM_OK;
}

static int open_targets_file(const char *path, TargetReader *ts, int L, int *K, int *d) {
    char *buf;
    size_t len;
    DFM_TRY(dfm_read_file(path, &buf, &len));
    ts->file = (uint8_t *)buf;
    ts->file_bytes = len;
    if (len < TGT_HEADER || memcmp(buf, TGT_MAGIC, 8))
        return DFM_FAIL(DFM_EFORMAT, "%s is not a targets file (magic %s). HINT: --targets takes a targets file "
                        "or a run folder with a targets stage", path, TGT_MAGIC);
    uint32_t ver, k, dd, cl;
    uint64_t n, ck;
    memcpy(&ver, buf + 8, 4);
    memcpy(&k, buf + 12, 4);
    memcpy(&dd, buf + 16, 4);
    memcpy(&cl, buf + 20, 4);
    memcpy(&n, buf + 24, 8);
    memcpy(&ck, buf + 32, 8);
    if (ver != 1) return DFM_FAIL(DFM_EVERSION, "%s: targets file version %u (1 known)", path, ver);
    if (!k || !dd || k > 4096 || dd > 65536) return DFM_FAIL(DFM_EFORMAT, "%s: k %u, d %u out of range", path, k, dd);
    /* the chunk count is a claim: its payload is computed in 128 bits and must be exactly what the file holds */
    unsigned __int128 want = (unsigned __int128)n * k * (1u + 4u * (uint64_t)dd);
    if (want != (unsigned __int128)(len - TGT_HEADER))
        return DFM_FAIL(DFM_ETRUNCATED, "%s: %zu bytes, but its header's %llu chunks x %u slots x d %u need %.0f",
                        path, len, (unsigned long long)n, k, dd, (double)want + TGT_HEADER);
    size_t payload = (size_t)want;
    if (dfm_checksum64(buf + TGT_HEADER, payload) != ck)
        return DFM_FAIL(DFM_ECHECKSUM, "%s: payload checksum mismatch (file corrupt)", path);
    /* finite target vectors only: a NaN target would poison the MSE and every gradient */
    const uint8_t *e = (const uint8_t *)buf + TGT_HEADER + (size_t)n * k; /* not float-aligned: read by memcpy */
    for (size_t i = 0; i < (size_t)n * k * dd; i++) {
        float x;
        memcpy(&x, e + 4 * i, 4);
        if (!isfinite(x))
            return DFM_FAIL(DFM_EFORMAT, "%s: the target memory of chunk %llu (slot %zu) holds a non-finite value. "
                            "HINT: rebuild the targets file", path, (unsigned long long)(i / ((size_t)k * dd)),
                            (size_t)(i / dd % k));
    }
    if ((int)cl != L)
        return DFM_FAIL(DFM_EMISMATCH, "%s: targets were built for chunks of %u tokens, the model uses %d. "
                        "HINT: --chunk-len %u", path, cl, L, cl);
    ts->mask = (const uint8_t *)buf + TGT_HEADER;
    ts->emb = (const float *)(void *)(buf + TGT_HEADER + (size_t)n * k);
    ts->n_chunks = n;
    *K = (int)k;
    *d = (int)dd;
    return DFM_OK;
}

int data_open_targets(DataSet *ds, const char *path, const char *tokens_run, int L, int want_k, int want_d) {
    if (ds->chunk_len && ds->chunk_len != L)
        return DFM_FAIL(DFM_EMISMATCH, "tokens are cut in chunks of %d, the model uses %d. HINT: --chunk-len %d",
                        ds->chunk_len, L, ds->chunk_len);
    if (ds->T % L) return DFM_FAIL(DFM_EARG, "sequence length %d is not a multiple of the chunk length %d", ds->T, L);
    TargetReader *ts = calloc(1, sizeof *ts);
    if (!ts) return DFM_FAIL(DFM_ENOMEM, "targets");
    ds->tgt = ts;
    char *man = dfm_path_join(path, "manifest.json");
    int is_run = man && dfm_path_exists(man);
    free(man);
    int rc;
    if (is_run) {
        dfm_target_open_opts o = {.tokens_run = tokens_run, .k = (uint32_t)(want_k > 0 ? want_k : 0),
                                  .d = (uint32_t)(want_d > 0 ? want_d : 0), .prefetch = -1};
        rc = dfm_target_reader_open(path, &o, &ts->reader);
        const dfm_target_info *inf = rc ? NULL : dfm_target_reader_info(ts->reader);
        /* tokens and targets of one generation: the chunks the targets were checked against are those loaded */
        if (inf && ds->tokens_generation[0] && tokens_run && strcmp(inf->tokens_generation, ds->tokens_generation))
            rc = DFM_FAIL(DFM_ESTATE, "the chunks of %s were rebuilt after dfm-train loaded its tokens (generation %s, now "
                          "%s). HINT: start it again (with --resume from the newest checkpoint)", tokens_run,
                          ds->tokens_generation, inf->tokens_generation);
        if (!rc) {
            ds->K = (int)inf->k;
            ds->d = (int)inf->d;
            ts->n_chunks = inf->n_chunks;
            ts->ids = calloc(inf->k, sizeof(int64_t));
            ts->scores = calloc(inf->k, sizeof(float));
        }
    } else {
        rc = open_targets_file(path, ts, L, &ds->K, &ds->d);
    }
    if (!rc && want_k > 0 && ds->K != want_k)
        rc = DFM_FAIL(DFM_EMISMATCH, "%s has K = %d slots, the model %d. HINT: --slots %d", path, ds->K, want_k, ds->K);
    if (!rc && want_d > 0 && ds->d != want_d)
        rc = DFM_FAIL(DFM_EMISMATCH, "%s has d = %d, the model %d. HINT: --d-mem %d", path, ds->d, want_d, ds->d);
    if (!rc && ts->n_chunks * (uint64_t)L < (uint64_t)ds->n_seq * ds->T)
        rc = DFM_FAIL(DFM_EMISMATCH, "%s has targets for %llu chunks, the tokens need %zu", path,
                      (unsigned long long)ts->n_chunks, ds->n_seq * ds->T / L);
    if (!rc && is_run) {
        ts->path = strdup(path);
        ts->tokens_run = tokens_run ? strdup(tokens_run) : NULL;
        ts->want_k = ds->K, ts->want_d = ds->d;
    }
    if (rc) dfm_error_prefix("while opening targets %s", path);
    return rc;
}

int data_attach_targets(DataSet *ds, int K, int d, uint64_t n_chunks, uint8_t *table) {
    TargetReader *ts = calloc(1, sizeof *ts);
    if (!ts) {
        free(table);
        return DFM_FAIL(DFM_ENOMEM, "targets");
    }
    ts->file = table; /* owned, as a targets file's bytes are */
    ts->mask = table;
    ts->emb = (const float *)(void *)(table + n_chunks * (size_t)K);
    ts->n_chunks = n_chunks;
    ds->tgt = ts;
    ds->K = K, ds->d = d;
    return DFM_OK;
}

int data_targets_clone(const DataSet *ds, TargetReader **out) {
    *out = NULL;
    const TargetReader *src = ds->tgt;
    if (!src) return DFM_OK;
    TargetReader *ts = calloc(1, sizeof *ts);
    if (!ts) return DFM_FAIL(DFM_ENOMEM, "targets");
    if (!src->reader) { /* a simple file: read-only memory, shared */
        *ts = *src;
        ts->borrowed = 1;
        ts->path = ts->tokens_run = NULL;
        *out = ts;
        return DFM_OK;
    }
    dfm_target_open_opts o = {.tokens_run = src->tokens_run, .k = (uint32_t)src->want_k, .d = (uint32_t)src->want_d,
                              .prefetch = -1};
    int rc = dfm_target_reader_open(src->path, &o, &ts->reader);
    /* every loader thread reads the generation the first reader opened: never a mix within an epoch */
    const char *g0 = dfm_target_reader_info(src->reader)->generation, *g = rc ? g0 : dfm_target_reader_info(ts->reader)->generation;
    if (!rc && strcmp(g0, g))
        rc = DFM_FAIL(DFM_ESTATE, "the targets of %s were rebuilt since dfm-train opened them (generation %s, now %s); its "
                      "loader threads would mix the two. HINT: start it again (with --resume from the newest checkpoint)",
                      src->path, g0, g);
    if (!rc) {
        ts->n_chunks = src->n_chunks;
        ts->ids = calloc((size_t)ds->K, sizeof(int64_t));
        ts->scores = calloc((size_t)ds->K, sizeof(float));
        if (!ts->ids || !ts->scores) rc = DFM_FAIL(DFM_ENOMEM, "targets");
    }
    if (rc) {
        data_targets_free(ts);
        return dfm_error_prefix("while opening another reader of %s", src->path);
    }
    *out = ts;
    return DFM_OK;
}

void data_targets_free(TargetReader *ts) {
    if (!ts) return;
    if (!ts->borrowed) free(ts->file);
    dfm_target_reader_close(ts->reader);
    free(ts->ids);
    free(ts->scores);
    free(ts->path);
    free(ts->tokens_run);
    free(ts);
}

void data_close(DataSet *ds) {
    if (!ds) return;
    free(ds->tokens);
    free(ds->pad);
    data_targets_free(ds->tgt);
    memset(ds, 0, sizeof *ds);
}

/* One chunk's K slots (d values each) and masks from a target source, as stored. */
static int read_row(TargetReader *ts, int K, int d, uint64_t chunk, float *emb, uint8_t *mask) {
    if (ts->reader) {
        dfm_trec rec = {.ids = ts->ids, .scores = ts->scores, .emb = emb};
        DFM_TRY(dfm_target_reader_get(ts->reader, chunk, &rec));
        for (int j = 0; j < K; j++) mask[j] = (rec.mask >> j) & 1;
    } else {
        memcpy(mask, ts->mask + chunk * K, K);
        memcpy(emb, (const uint8_t *)ts->emb + chunk * K * d * sizeof(float), (size_t)K * d * sizeof(float));
    }
    return DFM_OK;
}

int data_batch(DataSet *ds, const size_t *idx, int B, int L, int *inputs, int *targets, float *tmem,
               uint8_t *tmask) {
    return data_batch_from(ds, ds->tgt, idx, B, L, inputs, targets, tmem, tmask);
}

int data_batch_from(const DataSet *ds, TargetReader *ts, const size_t *idx, int B, int L, int *inputs, int *targets,
                    float *tmem, uint8_t *tmask) {
    int T = ds->T;
    for (int b = 0; b < B; b++) {
        if (idx[b] >= ds->n_seq) return DFM_FAIL(DFM_ERANGE, "sequence %zu of %zu", idx[b], ds->n_seq);
        const int *src = ds->tokens + idx[b] * T;
        memcpy(inputs + (size_t)b * T, src, T * sizeof(int));
        memcpy(targets + (size_t)b * T, src + 1, T * sizeof(int));
        if (ds->pad) { /* no target where the input or the next token is padding */
            const uint8_t *pd = ds->pad + idx[b] * T;
            for (int t = 0; t < T; t++)
                if (pd[t] || pd[t + 1]) targets[(size_t)b * T + t] = -1;
        }
    }
    if (!tmem || !tmask || !ts) return DFM_OK;
    int NC = T / L, K = ds->K, d = ds->d;
    for (int b = 0; b < B; b++)
        for (int c = 0; c < NC; c++) {
            size_t row = ((size_t)b * NC + c) * K;
            DFM_TRY(read_row(ts, K, d, (uint64_t)idx[b] * NC + c, tmem + row * d, tmask + row));
            if (c == 0) memset(tmask + row, 0, K); /* the first chunk of a sequence has no target */
        }
    return DFM_OK;
}

int data_target_row(const DataSet *ds, uint64_t chunk, float *emb, uint8_t *mask) {
    if (!ds->tgt) return DFM_FAIL(DFM_ESTATE, "no targets attached");
    if (chunk >= ds->tgt->n_chunks)
        return DFM_FAIL(DFM_ERANGE, "chunk %llu of targets for %llu", (unsigned long long)chunk,
                        (unsigned long long)ds->tgt->n_chunks);
    return read_row(ds->tgt, ds->K, ds->d, chunk, emb, mask);
}

int targets_file_write(const char *path, uint32_t k, uint32_t d, uint32_t chunk_len, uint64_t n_chunks,
                       const uint8_t *mask, const float *emb) {
    uint8_t h[TGT_HEADER] = {0};
    size_t nm = (size_t)n_chunks * k, ne = (size_t)n_chunks * k * d * 4;
    uint8_t *payload = malloc(nm + ne);
    if (!payload) return DFM_FAIL(DFM_ENOMEM, "targets payload");
    memcpy(payload, mask, nm);
    memcpy(payload + nm, emb, ne);
    uint32_t ver = 1;
    uint64_t ck = dfm_checksum64(payload, nm + ne);
    memcpy(h, TGT_MAGIC, 8);
    memcpy(h + 8, &ver, 4);
    memcpy(h + 12, &k, 4);
    memcpy(h + 16, &d, 4);
    memcpy(h + 20, &chunk_len, 4);
    memcpy(h + 24, &n_chunks, 8);
    memcpy(h + 32, &ck, 8);
    dfm_atomic_file f = {0};
    int rc = dfm_atomic_open(&f, path);
    if (!rc) rc = dfm_atomic_write(&f, h, sizeof h);
    if (!rc) rc = dfm_atomic_write(&f, payload, nm + ne);
    if (!rc) rc = dfm_atomic_commit(&f);
    else dfm_atomic_abort(&f);
    free(payload);
    return rc;
}

int tokens_bin_write(const char *path, const uint32_t *tokens, size_t n) {
    if (n > 0x7fffffff) return DFM_FAIL(DFM_ERANGE, "%zu tokens do not fit one shard", n);
    int32_t h[256] = {BIN_MAGIC_U32, BIN_VERSION_U32, (int32_t)n}; /* llm.c's uint32 shard, which dfm chunk reads */
    dfm_atomic_file f = {0};
    int rc = dfm_atomic_open(&f, path);
    if (!rc) rc = dfm_atomic_write(&f, h, sizeof h);
    if (!rc) rc = dfm_atomic_write(&f, tokens, n * 4);
    if (!rc) rc = dfm_atomic_commit(&f);
    else dfm_atomic_abort(&f);
    return rc;
}

/* ---- loader ---------------------------------------------------------------------------------------- */
static void make_order(Loader *l) {
    for (size_t i = 0; i < l->count; i++) l->order[i] = l->first + i;
    if (!l->shuffle) return;
    dfm_rng r;
    rng_seed(&r, l->seed * 1000003ull + l->epoch);
    for (size_t i = l->count; i > 1; i--) {
        size_t j = rng_u32(&r) % i;
        size_t t = l->order[i - 1];
        l->order[i - 1] = l->order[j];
        l->order[j] = t;
    }
}

int loader_init(Loader *l, size_t first, size_t count, uint64_t seed, int shuffle) {
    memset(l, 0, sizeof *l);
    if (!count) return DFM_FAIL(DFM_EARG, "empty data split");
    l->order = malloc(count * sizeof(size_t));
    if (!l->order) return DFM_FAIL(DFM_ENOMEM, "loader");
    l->first = first;
    l->count = count;
    l->seed = seed;
    l->shuffle = shuffle;
    make_order(l);
    return DFM_OK;
}

void loader_seek(Loader *l, uint64_t epoch, size_t pos) {
    /* a checkpoint taken exactly at the end of an epoch (pos == count) continues with the next one */
    l->epoch = epoch + pos / l->count;
    l->pos = pos % l->count;
    make_order(l);
}

void loader_next(Loader *l, int B, size_t *idx) {
    for (int b = 0; b < B; b++) {
        if (l->pos >= l->count) {
            l->epoch++;
            l->pos = 0;
            make_order(l);
        }
        idx[b] = l->order[l->pos++];
    }
}

void loader_free(Loader *l) {
    free(l->order);
    l->order = NULL;
}
