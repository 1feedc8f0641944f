/* target_layout.c — shard ranges, paths, shard.json, run fingerprints. */
#include "shard/target_layout.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

uint64_t dfm_target_span(uint64_t n, uint32_t shards) {
    if (!shards) shards = 1;
    uint64_t s = (n + shards - 1) / shards;
    return s ? s : 1;
}

void dfm_target_shard_range(uint64_t n, uint32_t shards, uint32_t s, uint64_t *first, uint64_t *count) {
    uint64_t span = dfm_target_span(n, shards);
    uint64_t a = (uint64_t)s * span;
    if (a > n) a = n;
    uint64_t b = a + span;
    if (b > n) b = n;
    *first = a;
    *count = b - a;
}

char *dfm_target_shard_dir(const char *run_dir, uint32_t s, int tmp) {
    return dfm_strdupf("%s%stargets/shard-%05u%s", run_dir, run_dir[0] && run_dir[strlen(run_dir) - 1] == '/' ? "" : "/", s,
                       tmp ? ".tmp" : "");
}

int dfm_target_rmdir(const char *dir) {
    DIR *dp = opendir(dir);
    if (!dp) {
        if (errno == ENOENT) return DFM_OK;
        return DFM_FAIL(DFM_EIO, "cannot open folder %s: %s", dir, strerror(errno));
    }
    struct dirent *e;
    int rc = DFM_OK;
    while ((e = readdir(dp))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = dfm_path_join(dir, e->d_name);
        if (!p) { rc = DFM_FAIL(DFM_ENOMEM, "no memory"); break; }
        if (unlink(p) != 0 && errno != ENOENT) rc = DFM_FAIL(DFM_EIO, "cannot remove %s: %s", p, strerror(errno));
        free(p);
        if (rc) break;
    }
    closedir(dp);
    if (!rc && rmdir(dir) != 0 && errno != ENOENT) rc = DFM_FAIL(DFM_EIO, "cannot remove folder %s: %s", dir, strerror(errno));
    return rc;
}

static char *hex64(uint64_t v, char out[17]) {
    snprintf(out, 17, "%016" PRIx64, v);
    return out;
}

static int parse_hex64(const char *s, uint64_t *v) {
    if (!s || strlen(s) != 16) return -1;
    char *end;
    *v = strtoull(s, &end, 16);
    return *end ? -1 : 0;
}

/* The optional "slots" of shard.json or the format (absent: neighbour). */
static int slots_of(json_t *o, const char *where, int *slots) {
    json_t *v = json_object_get(o, "slots");
    *slots = DFM_TREC_SLOTS_NEIGHBOUR;
    if (v && (!json_is_string(v) || dfm_trec_slots_parse(json_string_value(v), slots) != DFM_OK))
        return DFM_FAIL(DFM_EFORMAT, "%s: \"slots\" must be \"continuation\" or \"both\" (absent: neighbour)", where);
    return DFM_OK;
}

int dfm_target_meta_write(const char *dir, const dfm_target_shard_meta *m) {
    char h1[17], h2[17];
    json_t *o = json_pack(
        "{s:s, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:b, s:I, s:I, s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:s}",
        "format", DFM_TARGET_SHARD_FORMAT, "version", DFM_TARGET_SHARD_VERSION, "shard", (json_int_t)m->shard, "n_shards",
        (json_int_t)m->n_shards, "n_chunks_total", (json_int_t)m->n_chunks_total, "first_chunk", (json_int_t)m->first_chunk,
        "n_chunks", (json_int_t)m->n_chunks, "records", (json_int_t)m->records, "k", (json_int_t)m->k, "d", (json_int_t)m->d,
        "dtype", dfm_dtype_name(m->dtype), "store", m->ids_only ? "ids" : "embeddings", "shuffle", m->shuffle, "zstd_level",
        (json_int_t)m->level, "raw_bytes", (json_int_t)m->raw_bytes, "stored_bytes", (json_int_t)m->stored_bytes,
        "records_checksum", hex64(m->records_checksum, h1), "data_bytes", (json_int_t)m->data_bytes, "table_bytes",
        (json_int_t)m->table_bytes, "empty_records", (json_int_t)m->empty_records, "seq_starts", (json_int_t)m->seq_starts,
        "padded_slots", (json_int_t)m->padded_slots, "fingerprint", m->fingerprint);
    (void)h2;
    if (o && m->slots) json_object_set_new(o, "slots", json_string(dfm_trec_slots_name(m->slots))); /* absent: neighbour */
    if (!o) return DFM_FAIL(DFM_ENOMEM, "no memory for shard.json");
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    char *path = dfm_path_join(dir, "shard.json");
    int rc;
    if (!text || !path) rc = DFM_FAIL(DFM_ENOMEM, "no memory for shard.json");
    else rc = dfm_write_file_atomic(path, text, strlen(text));
    free(text);
    free(path);
    return rc;
}

int dfm_target_meta_read(const char *dir, dfm_target_shard_meta *m) {
    memset(m, 0, sizeof *m);
    char *path = dfm_path_join(dir, "shard.json");
    if (!path) return DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!dfm_path_exists(path)) {
        int rc = DFM_FAIL(DFM_ENOTFOUND, "%s does not exist: the shard is incomplete. HINT: re-run 'dfm write-targets' to rebuild it",
                          path);
        free(path);
        return rc;
    }
    json_error_t e;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    int rc = DFM_OK;
    json_int_t shard, n_shards, ntot, first, n, rec, k, d, level, raw, stored, data, table, empty, seqs, padded, version;
    const char *fmt, *dtype, *store, *sum, *fp;
    int shuffle;
    if (!o) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s line %d: %s (damaged shard.json)", path, e.line, e.text);
    } else if (json_unpack_ex(o, &e, 0,
                              "{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:b, s:I, s:I, s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:s}",
                              "format", &fmt, "version", &version, "shard", &shard, "n_shards", &n_shards, "n_chunks_total", &ntot,
                              "first_chunk", &first, "n_chunks", &n, "records", &rec, "k", &k, "d", &d, "dtype", &dtype, "store",
                              &store, "shuffle", &shuffle, "zstd_level", &level, "raw_bytes", &raw, "stored_bytes", &stored,
                              "records_checksum", &sum, "data_bytes", &data, "table_bytes", &table, "empty_records", &empty,
                              "seq_starts", &seqs, "padded_slots", &padded, "fingerprint", &fp) != 0) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: %s (damaged shard.json)", path, e.text);
    } else if (strcmp(fmt, DFM_TARGET_SHARD_FORMAT) != 0) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: format '%s', want '%s'", path, fmt, DFM_TARGET_SHARD_FORMAT);
    } else if (version != DFM_TARGET_SHARD_VERSION) {
        rc = DFM_FAIL(DFM_EVERSION, "%s: shard format version %lld; this dfm reads version %d. HINT: use the dfm that wrote it", path,
                      (long long)version, DFM_TARGET_SHARD_VERSION);
    } else if (dfm_dtype_parse(dtype, &m->dtype) != 0 || (strcmp(store, "ids") && strcmp(store, "embeddings")) ||
               parse_hex64(sum, &m->records_checksum) || strlen(fp) != 16 || shard < 0 || n_shards <= 0 || shard >= n_shards ||
               first < 0 || n < 0 || rec < 0 || k < 1 || k > DFM_TREC_MAX_K || d < 1 || d > DFM_TREC_MAX_D || data < 0) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: impossible values (dtype %s, store %s, checksum %s, shard %lld/%lld, K %lld, d %lld)", path,
                      dtype, store, sum, (long long)shard, (long long)n_shards, (long long)k, (long long)d);
    } else {
        m->shard = (uint32_t)shard;
        m->n_shards = (uint32_t)n_shards;
        m->n_chunks_total = (uint64_t)ntot;
        m->first_chunk = (uint64_t)first;
        m->n_chunks = (uint64_t)n;
        m->records = (uint64_t)rec;
        m->k = (uint32_t)k;
        m->d = (uint32_t)d;
        m->ids_only = !strcmp(store, "ids");
        m->shuffle = shuffle;
        m->level = (int)level;
        m->raw_bytes = (uint64_t)raw;
        m->stored_bytes = (uint64_t)stored;
        m->data_bytes = (uint64_t)data;
        m->table_bytes = (uint64_t)table;
        m->empty_records = (uint64_t)empty;
        m->seq_starts = (uint64_t)seqs;
        m->padded_slots = (uint64_t)padded;
        memcpy(m->fingerprint, fp, 17);
        rc = slots_of(o, path, &m->slots);
    }
    json_decref(o);
    free(path);
    return rc;
}

int dfm_target_meta_same_config(const char *dir, const dfm_target_shard_meta *a, const dfm_target_shard_meta *b) {
#define SAME(f)                                                                                                         \
    if (a->f != b->f)                                                                                                   \
        return DFM_FAIL(DFM_EMISMATCH, "%s: %s is %llu, the run expects %llu. HINT: these targets belong to another run " \
                        "or configuration; re-run 'dfm write-targets'",                                                  \
                        dir, #f, (unsigned long long)a->f, (unsigned long long)b->f);
    SAME(shard) SAME(n_shards) SAME(n_chunks_total) SAME(first_chunk) SAME(n_chunks) SAME(k) SAME(d) SAME(dtype)
    SAME(ids_only) SAME(shuffle) SAME(level) SAME(slots)
#undef SAME
    if (strcmp(a->fingerprint, b->fingerprint) != 0)
        return DFM_FAIL(DFM_EMISMATCH, "%s: run fingerprint %s, the run expects %s (targets of another run or of changed inputs). "
                        "HINT: re-run 'dfm write-targets' on this run",
                        dir, a->fingerprint, b->fingerprint);
    return DFM_OK;
}

/* "synthetic" is the data stage of `write-targets --synthetic` runs (tests, benchmarks) */
static const char *const upstream_stages[] = {"chunk", "encode", "index", "retrieve", "synthetic"};

json_t *dfm_target_upstream(json_t *manifest) {
    json_t *out = json_object();
    if (!out) return NULL;
    for (size_t i = 0; i < sizeof upstream_stages / sizeof upstream_stages[0]; i++) {
        json_t *st = json_object_get(json_object_get(manifest, "stages"), upstream_stages[i]);
        if (!st) continue;
        json_t *pick = json_pack("{s:O?, s:O?}", "config", json_object_get(st, "config"), "inputs", json_object_get(st, "inputs"));
        char *text = pick ? json_dumps(pick, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
        json_decref(pick);
        if (!text) { json_decref(out); return NULL; }
        char h[17];
        json_object_set_new(out, upstream_stages[i], json_string(hex64(XXH3_64bits(text, strlen(text)), h)));
        free(text);
    }
    return out;
}

void dfm_target_fingerprint(json_t *upstream, const dfm_target_shard_meta *f, char out[17]) {
    char *up = json_dumps(upstream, JSON_SORT_KEYS | JSON_COMPACT);
    char ids[40] = "";
    if (f->n_ids) snprintf(ids, sizeof ids, "|n_ids=%llu", (unsigned long long)f->n_ids); /* absent for a run's own ids */
    char slots[40] = "";
    if (f->slots) snprintf(slots, sizeof slots, "|slots=%s", dfm_trec_slots_name(f->slots)); /* absent for neighbours */
    char *all = dfm_strdupf("%s|k=%u|d=%u|dtype=%d|ids=%d|shuffle=%d|level=%d|shards=%u|n=%llu|v=%u%s%s", up ? up : "", f->k, f->d,
                            f->dtype, f->ids_only, f->shuffle, f->level, f->n_shards, (unsigned long long)f->n_chunks_total,
                            DFM_TREC_VERSION, ids, slots);
    hex64(all ? XXH3_64bits(all, strlen(all)) : 0, out);
    free(up);
    free(all);
}

int dfm_target_upstream_check(json_t *stored, json_t *current, const char *targets_run, const char *where) {
    for (size_t i = 0; i < sizeof upstream_stages / sizeof upstream_stages[0]; i++) {
        const char *a = json_string_value(json_object_get(stored, upstream_stages[i]));
        const char *b = json_string_value(json_object_get(current, upstream_stages[i]));
        if (!a && !b) continue;
        if (!a || !b || strcmp(a, b) != 0)
            return DFM_FAIL(DFM_EMISMATCH,
                            "the targets of %s were built from a '%s' stage with fingerprint %s, but %s's manifest now has %s. "
                            "HINT: the tokens/embeddings/neighbours changed or belong to another run; re-run 'dfm write-targets' on %s",
                            targets_run, upstream_stages[i], a ? a : "(none)", where, b ? b : "(none)", where);
    }
    return DFM_OK;
}

json_t *dfm_target_format_make(const dfm_target_shard_meta *f, json_t *upstream) {
    json_t *fmt = json_pack("{s:i, s:I, s:I, s:s, s:s, s:b, s:I, s:I, s:I, s:I, s:s, s:O}", "record_version", (int)DFM_TREC_VERSION, "k",
                     (json_int_t)f->k, "d", (json_int_t)f->d, "dtype", dfm_dtype_name(f->dtype), "store",
                     f->ids_only ? "ids" : "embeddings", "shuffle", f->shuffle, "zstd_level", (json_int_t)f->level, "n_shards",
                     (json_int_t)f->n_shards, "n_chunks", (json_int_t)f->n_chunks_total, "span",
                     (json_int_t)dfm_target_span(f->n_chunks_total, f->n_shards), "fingerprint", f->fingerprint, "upstream",
                     upstream);
    if (fmt && f->n_ids) json_object_set_new(fmt, "n_ids", json_integer((json_int_t)f->n_ids));
    if (fmt && f->slots) json_object_set_new(fmt, "slots", json_string(dfm_trec_slots_name(f->slots)));
    return fmt;
}

int dfm_target_format_parse(json_t *fmt, const char *run_dir, dfm_target_shard_meta *f, json_t **upstream) {
    memset(f, 0, sizeof *f);
    json_int_t ver, k, d, level, shards, n, span;
    const char *dtype, *store, *fp;
    int shuffle;
    json_t *up;
    json_error_t e;
    if (!fmt || json_unpack_ex(fmt, &e, 0, "{s:I, s:I, s:I, s:s, s:s, s:b, s:I, s:I, s:I, s:I, s:s, s:o}", "record_version", &ver,
                               "k", &k, "d", &d, "dtype", &dtype, "store", &store, "shuffle", &shuffle, "zstd_level", &level,
                               "n_shards", &shards, "n_chunks", &n, "span", &span, "fingerprint", &fp, "upstream", &up) != 0)
        return DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: targets stage has no valid \"format\" (%s). HINT: re-run 'dfm write-targets'",
                        run_dir, fmt ? e.text : "missing");
    if (ver != DFM_TREC_VERSION)
        return DFM_FAIL(DFM_EVERSION, "%s: targets written with record format version %lld; this dfm reads %u. HINT: use the dfm that wrote them",
                        run_dir, (long long)ver, DFM_TREC_VERSION);
    if (k < 1 || k > DFM_TREC_MAX_K || d < 1 || d > DFM_TREC_MAX_D || shards < 1 || shards > 99999 || n < 0 || strlen(fp) != 16 ||
        dfm_dtype_parse(dtype, &f->dtype) != 0 || (strcmp(store, "ids") && strcmp(store, "embeddings")) ||
        (uint64_t)span != dfm_target_span((uint64_t)n, (uint32_t)shards))
        return DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: impossible targets format (K %lld, d %lld, shards %lld, N %lld, span %lld)",
                        run_dir, (long long)k, (long long)d, (long long)shards, (long long)n, (long long)span);
    f->k = (uint32_t)k;
    f->d = (uint32_t)d;
    f->ids_only = !strcmp(store, "ids");
    f->shuffle = shuffle;
    f->level = (int)level;
    f->n_shards = (uint32_t)shards;
    f->n_chunks_total = (uint64_t)n;
    json_t *ni = json_object_get(fmt, "n_ids");
    if (ni && (!json_is_integer(ni) || json_integer_value(ni) < 1))
        return DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: targets format \"n_ids\" must be a positive integer", run_dir);
    f->n_ids = ni ? (uint64_t)json_integer_value(ni) : 0;
    char where[600];
    snprintf(where, sizeof where, "%s/manifest.json: targets format", run_dir);
    DFM_TRY(slots_of(fmt, where, &f->slots));
    if (f->slots == DFM_TREC_SLOTS_BOTH && f->k % 2)
        return DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: targets format has slots \"both\" with an odd K %u", run_dir, f->k);
    memcpy(f->fingerprint, fp, 17);
    if (upstream) *upstream = up;
    return DFM_OK;
}
