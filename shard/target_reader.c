/* target_reader.c — open, check, iterate (with a prefetch thread) and random-access target shards. */
#include "shard/target_reader.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"
#include "shard/target_layout.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

typedef struct {
    dfm_target_shard_meta meta;
    char *dir;
    MDB_env *env;
    MDB_dbi dbi;
    MDB_txn *txn; /* read transaction of the caller's thread (get/raw) */
    uint8_t *table_map;
    size_t table_len;
} shard_t;

typedef struct {
    int rc;         /* DFM_OK, DFM_TARGET_END or an error */
    char *msg;      /* error message when rc < 0 */
    uint64_t chunk_id, mask;
    uint32_t flags;
    int64_t *ids;
    float *scores, *emb;
} slot_t;

struct dfm_target_reader {
    dfm_target_info info;
    dfm_trec_params params;
    char *run_dir;
    shard_t *shards;
    dfm_trec_codec *codec; /* for get() */
    /* iterator */
    int prefetch;
    uint64_t it_next;      /* next id the consumer expects */
    int it_started;
    pthread_t thr;
    int thr_live;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    slot_t *ring;
    int cap, head, count, stop, done;
    uint64_t thr_first;
    /* synchronous iteration state (prefetch < 0) */
    struct iter *sync_it;
};

/* --------------------------------------------------------------------------------------------- */
static int lmdb_err(int rc, const char *what, const char *dir) {
    return DFM_FAIL(DFM_ELMDB, "%s %s: %s", what, dir, mdb_strerror(rc));
}

/* The current message without its leading "<code text>: " (so re-raising it does not repeat that). */
static const char *bare_message(char *buf, size_t n) {
    int code = dfm_last_error_code();
    snprintf(buf, n, "%s", dfm_last_error());
    size_t pl = strlen(dfm_strerror(code));
    return (!strncmp(buf, dfm_strerror(code), pl) && buf[pl] == ':' && buf[pl + 1] == ' ') ? buf + pl + 2 : buf;
}

/* Put the shard and key in front of the current error. */
static int name_key(const shard_t *s, uint64_t id) {
    char buf[2048];
    int code = dfm_last_error_code();
    const char *m = bare_message(buf, sizeof buf);
    return DFM_FAIL(code ? code : DFM_EINTERNAL, "shard %s key %016llx (chunk %llu): %s", s->dir, (unsigned long long)id,
                    (unsigned long long)id, m);
}

static int open_table(shard_t *s) {
    char *path = dfm_path_join(s->dir, "table.bin");
    if (!path) return DFM_FAIL(DFM_ENOMEM, "no memory");
    int rc = DFM_OK;
    int fd = open(path, O_RDONLY);
    uint64_t size = 0;
    if (fd < 0) rc = DFM_FAIL(DFM_ENOTFOUND, "cannot open %s: %s (store = ids needs it)", path, strerror(errno));
    else if ((rc = dfm_file_size(path, &size))) {
    } else if (size != s->meta.table_bytes || size < DFM_TTAB_HEADER_BYTES) {
        rc = DFM_FAIL(DFM_ETRUNCATED, "%s is %llu bytes, shard.json says %llu (truncated or modified). HINT: delete the shard folder and re-run 'dfm write-targets'",
                      path, (unsigned long long)size, (unsigned long long)s->meta.table_bytes);
    } else {
        void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) rc = DFM_FAIL(DFM_EIO, "mmap %s: %s", path, strerror(errno));
        else {
            s->table_map = m;
            s->table_len = size;
            dfm_ttab_header h;
            memcpy(&h, m, sizeof h);
            const dfm_target_shard_meta *mt = &s->meta;
            if (memcmp(h.magic, DFM_TTAB_MAGIC, 8) != 0) rc = DFM_FAIL(DFM_EFORMAT, "%s: not a target table (bad magic)", path);
            else if (h.version != DFM_TTAB_VERSION)
                rc = DFM_FAIL(DFM_EVERSION, "%s: table version %u; this dfm reads %u", path, h.version, DFM_TTAB_VERSION);
            else if (dfm_checksum64(&h, DFM_TTAB_HEADER_BYTES - 8) != h.header_checksum)
                rc = DFM_FAIL(DFM_ECHECKSUM, "%s: header checksum mismatch (damaged file)", path);
            else if (h.dtype != (uint32_t)mt->dtype || h.d != mt->d || h.first_chunk != mt->first_chunk || h.n_rows != mt->n_chunks ||
                     h.payload_bytes != size - DFM_TTAB_HEADER_BYTES || h.payload_bytes != h.n_rows * h.d * dfm_dtype_size(mt->dtype))
                rc = DFM_FAIL(DFM_EFORMAT, "%s: header (dtype %u, d %u, first %llu, rows %llu) disagrees with shard.json", path, h.dtype,
                              h.d, (unsigned long long)h.first_chunk, (unsigned long long)h.n_rows);
            else if (dfm_checksum64((uint8_t *)m + DFM_TTAB_HEADER_BYTES, h.payload_bytes) != h.payload_checksum)
                rc = DFM_FAIL(DFM_ECHECKSUM, "%s: rows checksum mismatch (damaged file). HINT: delete the shard folder and re-run 'dfm write-targets'",
                              path);
        }
    }
    if (fd >= 0) close(fd);
    free(path);
    return rc;
}

static int open_shard(dfm_target_reader *r, uint32_t i, const dfm_target_shard_meta *want) {
    shard_t *s = &r->shards[i];
    s->dir = dfm_target_shard_dir(r->run_dir, i, 0);
    if (!s->dir) return DFM_FAIL(DFM_ENOMEM, "no memory");
    dfm_target_shard_meta expect = *want;
    expect.shard = i;
    dfm_target_shard_range(want->n_chunks_total, want->n_shards, i, &expect.first_chunk, &expect.n_chunks);
    DFM_TRY(dfm_target_meta_read(s->dir, &s->meta));
    DFM_TRY(dfm_target_meta_same_config(s->dir, &s->meta, &expect));
    if (s->meta.records != s->meta.n_chunks)
        return DFM_FAIL(DFM_EFORMAT, "%s: shard.json says %llu records for %llu chunks", s->dir, (unsigned long long)s->meta.records,
                        (unsigned long long)s->meta.n_chunks);
    char *data = dfm_path_join(s->dir, "data.mdb");
    uint64_t size = 0;
    int rc = data ? dfm_file_size(data, &size) : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc && size != s->meta.data_bytes)
        rc = DFM_FAIL(DFM_ETRUNCATED, "%s is %llu bytes, shard.json says %llu (truncated or modified). HINT: delete %s and re-run 'dfm write-targets'",
                      data, (unsigned long long)size, (unsigned long long)s->meta.data_bytes, s->dir);
    free(data);
    DFM_TRY(rc);
    if ((rc = mdb_env_create(&s->env))) return lmdb_err(rc, "mdb_env_create for", s->dir);
    mdb_env_set_mapsize(s->env, (size + 4095) / 4096 * 4096 + 4096);
    if ((rc = mdb_env_open(s->env, s->dir, MDB_RDONLY | MDB_NOLOCK | MDB_NOTLS, 0444))) return lmdb_err(rc, "opening", s->dir);
    if ((rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &s->txn))) return lmdb_err(rc, "read transaction on", s->dir);
    if ((rc = mdb_dbi_open(s->txn, NULL, 0, &s->dbi))) return lmdb_err(rc, "opening the database of", s->dir);
    MDB_stat st;
    if ((rc = mdb_stat(s->txn, s->dbi, &st))) return lmdb_err(rc, "mdb_stat on", s->dir);
    if (st.ms_entries != s->meta.records)
        return DFM_FAIL(DFM_EFORMAT, "%s: data.mdb holds %zu records, shard.json says %llu", s->dir, (size_t)st.ms_entries,
                        (unsigned long long)s->meta.records);
    if (s->meta.ids_only) DFM_TRY(open_table(s));
    return DFM_OK;
}

/* One attempt at opening; before[] and tbefore[] get the generations of the targets stage and of the
 * tokens run's chunk stage as the manifests said when it began (also when it fails). */
static int open_once(const char *run_dir, const dfm_target_open_opts *opts, dfm_target_reader **out, char before[17],
                     char tbefore[17]) {
    *out = NULL;
    dfm_target_open_opts o = {0};
    if (opts) o = *opts;
    json_t *m = NULL, *mt = NULL, *cur = NULL;
    dfm_target_reader *r = calloc(1, sizeof *r);
    if (!r) return DFM_FAIL(DFM_ENOMEM, "no memory");
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->prefetch = o.prefetch == 0 ? 64 : o.prefetch;
    r->run_dir = strdup(run_dir);
    int rc = r->run_dir ? dfm_manifest_load(run_dir, 0, &m) : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) snprintf(before, 17, "%s", dfm_manifest_generation(m, "targets"));
    if (!rc) rc = dfm_manifest_require_readable(m, "targets", run_dir);
    if (rc == DFM_ESTATE) dfm_error_prefix("targets of %s are not complete", run_dir);
    dfm_target_shard_meta f;
    json_t *upstream = NULL;
    if (!rc) rc = dfm_target_format_parse(json_object_get(dfm_manifest_stage(m, "targets"), "format"), run_dir, &f, &upstream);
    if (!rc) {
        const char *where = o.tokens_run ? o.tokens_run : run_dir;
        if (o.tokens_run) rc = dfm_manifest_load(o.tokens_run, 0, &mt);
        if (!rc) snprintf(tbefore, 17, "%s", dfm_manifest_generation(mt ? mt : m, "chunk"));
        if (!rc) {
            cur = dfm_target_upstream(mt ? mt : m);
            rc = cur ? dfm_target_upstream_check(upstream, cur, run_dir, where) : DFM_FAIL(DFM_ENOMEM, "no memory");
        }
        char fp[17];
        if (!rc) {
            dfm_target_fingerprint(upstream, &f, fp);
            if (strcmp(fp, f.fingerprint) != 0)
                rc = DFM_FAIL(DFM_EMISMATCH, "%s/manifest.json: targets fingerprint %s does not match its own format (%s); the manifest was edited. HINT: re-run 'dfm write-targets'",
                              run_dir, f.fingerprint, fp);
        }
    }
    if (!rc && ((o.k && o.k != f.k) || (o.d && o.d != f.d) || (o.n_chunks && o.n_chunks != f.n_chunks_total)))
        rc = DFM_FAIL(DFM_EMISMATCH, "targets of %s have K %u, d %u, %llu chunks; the caller expects K %u, d %u, %llu chunks. HINT: use targets built for this model and data",
                      run_dir, f.k, f.d, (unsigned long long)f.n_chunks_total, o.k, o.d, (unsigned long long)o.n_chunks);
    if (!rc) {
        r->info.n_chunks = f.n_chunks_total;
        r->info.n_ids = f.n_ids;
        r->info.k = f.k;
        r->info.d = f.d;
        r->info.dtype = f.dtype;
        r->info.ids_only = f.ids_only;
        r->info.slots = f.slots;
        r->info.n_shards = f.n_shards;
        r->info.span = dfm_target_span(f.n_chunks_total, f.n_shards);
        memcpy(r->info.fingerprint, f.fingerprint, 17);
        memcpy(r->info.generation, before, 17);
        memcpy(r->info.tokens_generation, tbefore, 17);
        r->params = (dfm_trec_params){.k = f.k, .d = f.d, .dtype = f.dtype, .ids_only = f.ids_only, .shuffle = f.shuffle, .level = f.level,
                                      .slots = f.slots};
        r->shards = calloc(f.n_shards, sizeof *r->shards);
        rc = r->shards ? dfm_trec_codec_create(&r->params, &r->codec) : DFM_FAIL(DFM_ENOMEM, "no memory");
        /* a reader holds one open file per shard (its data.mdb; tables are mapped and closed): many readers
         * of many shards meet the open-files limit before anything else (no LMDB reader table: MDB_NOLOCK) */
        char what[4200];
        snprintf(what, sizeof what, "a reader of the %u target shards of %s", f.n_shards, run_dir);
        if (!rc) rc = dfm_fd_reserve(f.n_shards, what, "open fewer readers: each of dfm-train's --loader-threads, each "
                                     "dfm.Batches thread and each DataLoader worker opens one");
        for (uint32_t i = 0; !rc && i < f.n_shards; i++) {
            rc = open_shard(r, i, &f);
            r->info.raw_bytes += r->shards[i].meta.raw_bytes;
            r->info.stored_bytes += r->shards[i].meta.stored_bytes;
        }
    }
    json_decref(m);
    json_decref(mt);
    json_decref(cur);
    if (rc) {
        dfm_target_reader_close(r);
        return rc;
    }
    *out = r;
    return DFM_OK;
}

/* The generations the manifests say now (targets of run_dir, chunk of the tokens run); 0 when they load and
 * the targets are complete, else the error of dfm_manifest_require_readable (or of the load). */
static int generations_now(const char *run_dir, const char *tokens_run, char now[17], char tnow[17]) {
    json_t *m = NULL, *mt = NULL;
    now[0] = tnow[0] = 0;
    int rc = dfm_manifest_load(run_dir, 0, &m);
    if (!rc && tokens_run) rc = dfm_manifest_load(tokens_run, 0, &mt);
    if (!rc) {
        snprintf(now, 17, "%s", dfm_manifest_generation(m, "targets"));
        snprintf(tnow, 17, "%s", dfm_manifest_generation(mt ? mt : m, "chunk"));
        rc = dfm_manifest_require_readable(m, "targets", run_dir);
    }
    json_decref(m);
    json_decref(mt);
    return rc;
}

int dfm_target_reader_open(const char *run_dir, const dfm_target_open_opts *opts, dfm_target_reader **out) {
    const char *tokens_run = opts ? opts->tokens_run : NULL;
    char first[17] = "";
    for (int attempt = 0;; attempt++) {
        char before[17] = "", tbefore[17] = "", now[17], tnow[17];
        int rc = open_once(run_dir, opts, out, before, tbefore);
        if (!attempt) memcpy(first, before, 17);
        /* a rebuild that ran while the files were opened shows as another generation, or a stage not complete
         * (a check that passes sets no error: the open's own stays the message) */
        int nrc = generations_now(run_dir, tokens_run, now, tnow);
        if (!strcmp(before, now) && !strcmp(tbefore, tnow) && (!nrc || rc)) return rc; /* (not complete all along) */
        dfm_target_reader_close(*out);
        *out = NULL;
        if (attempt < 4) { /* the rebuild may be over in a moment: open the new generation whole */
            struct timespec ts = {0, 50000000L << attempt};
            nanosleep(&ts, NULL);
            continue;
        }
        if (nrc) return dfm_error_prefix("while opening the targets");
        return DFM_FAIL(DFM_ESTATE, "the targets of %s were rebuilt while this reader opened them, %d times (generation %s, "
                        "now %s). HINT: open them again when the rebuild ('dfm write-targets --force', 'dfm build --force') "
                        "is over", run_dir, attempt + 1, first[0] ? first : "none", now[0] ? now : "none");
    }
}

const dfm_target_info *dfm_target_reader_info(const dfm_target_reader *r) { return &r->info; }

/* embeddings of an ids-only record from the tables */
static int fill_from_tables(const dfm_target_reader *r, const dfm_trec *t) {
    const uint32_t d = r->info.d;
    size_t es = dfm_dtype_size(r->info.dtype);
    for (uint32_t i = 0; i < r->info.k; i++) {
        float *row = t->emb + (size_t)i * d;
        if (!((t->mask >> i) & 1u)) {
            memset(row, 0, sizeof(float) * d);
            continue;
        }
        uint64_t id = (uint64_t)t->ids[i];
        if (id >= r->info.n_chunks)
            return DFM_FAIL(DFM_ERANGE, "chunk %llu slot %u: neighbour id %llu >= %llu chunks", (unsigned long long)t->chunk_id, i,
                            (unsigned long long)id, (unsigned long long)r->info.n_chunks);
        const shard_t *s = &r->shards[id / r->info.span];
        const uint8_t *src = s->table_map + DFM_TTAB_HEADER_BYTES + (id - s->meta.first_chunk) * d * es;
        dfm_convert_to_f32(r->info.dtype, src, d, row);
    }
    return DFM_OK;
}

static int decode_into(const dfm_target_reader *r, dfm_trec_codec *c, const shard_t *s, uint64_t key_id, const void *rec,
                       size_t n, dfm_trec *out, uint64_t *payload_sum) {
    int rc = dfm_trec_decode(c, rec, n, out, NULL, NULL);
    if (!rc && out->chunk_id != key_id)
        rc = DFM_FAIL(DFM_EFORMAT, "record header says chunk %llu", (unsigned long long)out->chunk_id);
    if (!rc) {
        for (uint32_t i = 0; i < r->info.k && !rc; i++)
            if (((out->mask >> i) & 1u) && (uint64_t)out->ids[i] >= (r->info.n_ids ? r->info.n_ids : r->info.n_chunks))
                rc = DFM_FAIL(DFM_ERANGE, "slot %u: neighbour id %lld is not a chunk of %s (%llu chunks)", i, (long long)out->ids[i],
                              r->info.n_ids ? "its datastore run" : "this run",
                              (unsigned long long)(r->info.n_ids ? r->info.n_ids : r->info.n_chunks));
    }
    if (!rc && r->info.ids_only && out->emb) rc = fill_from_tables(r, out);
    if (!rc && payload_sum) {
        dfm_trec_header h;
        memcpy(&h, rec, sizeof h);
        *payload_sum = h.payload_checksum;
    }
    if (rc) name_key(s, key_id);
    return rc;
}

int dfm_target_reader_raw(dfm_target_reader *r, uint64_t chunk_id, const void **rec, size_t *n) {
    if (chunk_id >= r->info.n_chunks)
        return DFM_FAIL(DFM_ERANGE, "chunk %llu is outside the run's %llu chunks", (unsigned long long)chunk_id,
                        (unsigned long long)r->info.n_chunks);
    shard_t *s = &r->shards[chunk_id / r->info.span];
    uint8_t key[8];
    dfm_trec_key(chunk_id, key);
    MDB_val k = {8, key}, v;
    int rc = mdb_get(s->txn, s->dbi, &k, &v);
    if (rc == MDB_NOTFOUND) {
        DFM_FAIL(DFM_ENOTFOUND, "no record");
        return name_key(s, chunk_id);
    }
    if (rc) {
        lmdb_err(rc, "mdb_get in", s->dir);
        return name_key(s, chunk_id);
    }
    *rec = v.mv_data;
    *n = v.mv_size;
    return DFM_OK;
}

int dfm_target_reader_get(dfm_target_reader *r, uint64_t chunk_id, dfm_trec *out) {
    const void *rec;
    size_t n;
    DFM_TRY(dfm_target_reader_raw(r, chunk_id, &rec, &n));
    return decode_into(r, r->codec, &r->shards[chunk_id / r->info.span], chunk_id, rec, n, out, NULL);
}

/* ---- iteration -------------------------------------------------------------------------------
 * One struct walks the shards in order from a first id; used by the prefetch thread or directly. */
typedef struct iter {
    dfm_target_reader *r;
    dfm_trec_codec *codec;
    uint32_t shard;
    MDB_txn *txn;
    MDB_cursor *cur;
    uint64_t next;           /* next expected id */
    int whole;               /* current shard read from its first record: check count and checksum */
    uint64_t seen;
    XXH3_state_t *sum;
    int started;
} iter;

static void iter_close_cursor(iter *it) {
    if (it->cur) mdb_cursor_close(it->cur);
    if (it->txn) mdb_txn_abort(it->txn);
    it->cur = NULL;
    it->txn = NULL;
}

static void iter_free(iter *it) {
    if (!it) return;
    iter_close_cursor(it);
    dfm_trec_codec_free(it->codec);
    XXH3_freeState(it->sum);
    free(it);
}

static int iter_new(dfm_target_reader *r, uint64_t first, iter **out) {
    iter *it = calloc(1, sizeof *it);
    if (!it) return DFM_FAIL(DFM_ENOMEM, "no memory");
    it->r = r;
    it->next = first;
    it->shard = r->info.n_chunks ? (uint32_t)(first / r->info.span) : r->info.n_shards;
    it->sum = XXH3_createState();
    int rc = it->sum ? dfm_trec_codec_create(&r->params, &it->codec) : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (rc) {
        iter_free(it);
        return rc;
    }
    *out = it;
    return DFM_OK;
}

/* Next record into out; DFM_TARGET_END at the end. */
static int iter_next(iter *it, dfm_trec *out) {
    dfm_target_reader *r = it->r;
    for (;;) {
        if (it->next >= r->info.n_chunks || it->shard >= r->info.n_shards) return DFM_TARGET_END;
        shard_t *s = &r->shards[it->shard];
        if (!it->cur) {
            int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &it->txn);
            if (!rc) rc = mdb_cursor_open(it->txn, s->dbi, &it->cur);
            if (rc) {
                iter_close_cursor(it);
                return lmdb_err(rc, "opening a cursor on", s->dir);
            }
            it->whole = it->next == s->meta.first_chunk;
            it->seen = 0;
            XXH3_64bits_reset(it->sum);
            it->started = 0;
        }
        uint8_t key[8];
        dfm_trec_key(it->next, key);
        MDB_val k = {8, key}, v;
        int rc = mdb_cursor_get(it->cur, &k, &v, it->started ? MDB_NEXT : MDB_SET_RANGE);
        it->started = 1;
        if (rc == MDB_NOTFOUND) {
            /* end of this shard: it must have ended exactly at its range's end */
            if (it->next != s->meta.first_chunk + s->meta.n_chunks) {
                DFM_FAIL(DFM_EFORMAT, "records end before the shard's range [%llu, %llu) does (gap)",
                         (unsigned long long)s->meta.first_chunk, (unsigned long long)(s->meta.first_chunk + s->meta.n_chunks));
                return name_key(s, it->next);
            }
            if (it->whole && (it->seen != s->meta.records || XXH3_64bits_digest(it->sum) != s->meta.records_checksum))
                return DFM_FAIL(DFM_ECHECKSUM, "shard %s: %llu records with combined checksum %016llx; shard.json says %llu and %016llx",
                                s->dir, (unsigned long long)it->seen, (unsigned long long)XXH3_64bits_digest(it->sum),
                                (unsigned long long)s->meta.records, (unsigned long long)s->meta.records_checksum);
            iter_close_cursor(it);
            it->shard++;
            continue;
        }
        if (rc) return lmdb_err(rc, "reading", s->dir);
        uint64_t id;
        if (dfm_trec_key_id(k.mv_data, k.mv_size, &id)) return name_key(s, it->next);
        if (id != it->next) {
            DFM_FAIL(DFM_EFORMAT, "expected key of chunk %llu, found %llu (gap, duplicate or disorder)", (unsigned long long)it->next,
                     (unsigned long long)id);
            return name_key(s, id);
        }
        uint64_t psum = 0;
        DFM_TRY(decode_into(r, it->codec, s, id, v.mv_data, v.mv_size, out, &psum));
        XXH3_64bits_update(it->sum, key, 8);
        XXH3_64bits_update(it->sum, &psum, 8);
        it->seen++;
        it->next++;
        return DFM_OK;
    }
}

static void *prefetch_main(void *arg) {
    dfm_target_reader *r = arg;
    iter *it = NULL;
    int rc = iter_new(r, r->thr_first, &it);
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (!r->stop && r->count == r->cap) pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop) {
            pthread_mutex_unlock(&r->mu);
            break;
        }
        slot_t *sl = &r->ring[(r->head + r->count) % r->cap];
        pthread_mutex_unlock(&r->mu);
        /* decode outside the lock, into a slot the consumer cannot touch yet */
        if (!rc) {
            dfm_trec t = {.ids = sl->ids, .scores = sl->scores, .emb = sl->emb};
            rc = iter_next(it, &t);
            sl->chunk_id = t.chunk_id;
            sl->mask = t.mask;
            sl->flags = t.flags;
        }
        sl->rc = rc;
        free(sl->msg);
        sl->msg = rc < 0 ? strdup(dfm_last_error()) : NULL;
        pthread_mutex_lock(&r->mu);
        r->count++;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        if (rc) break; /* END or error: the slot tells the consumer */
    }
    iter_free(it);
    return NULL;
}

static void stop_thread(dfm_target_reader *r) {
    if (!r->thr_live) return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thr, NULL);
    r->thr_live = 0;
}

int dfm_target_reader_seek(dfm_target_reader *r, uint64_t first) {
    if (first > r->info.n_chunks)
        return DFM_FAIL(DFM_ERANGE, "seek to chunk %llu past the run's %llu chunks", (unsigned long long)first,
                        (unsigned long long)r->info.n_chunks);
    stop_thread(r);
    iter_free(r->sync_it);
    r->sync_it = NULL;
    r->it_started = 1;
    if (r->prefetch < 0) return iter_new(r, first, &r->sync_it);
    if (!r->ring) {
        r->cap = r->prefetch;
        r->ring = calloc((size_t)r->cap, sizeof *r->ring);
        if (!r->ring) return DFM_FAIL(DFM_ENOMEM, "no memory");
        size_t kd = (size_t)r->info.k * r->info.d;
        for (int i = 0; i < r->cap; i++) {
            r->ring[i].ids = malloc(sizeof(int64_t) * r->info.k);
            r->ring[i].scores = malloc(sizeof(float) * r->info.k);
            r->ring[i].emb = malloc(sizeof(float) * kd);
            if (!r->ring[i].ids || !r->ring[i].scores || !r->ring[i].emb) return DFM_FAIL(DFM_ENOMEM, "no memory for prefetch buffers");
        }
    }
    r->head = r->count = r->stop = 0;
    r->thr_first = first;
    if (pthread_create(&r->thr, NULL, prefetch_main, r) != 0) return DFM_FAIL(DFM_EINTERNAL, "cannot start the prefetch thread");
    r->thr_live = 1;
    return DFM_OK;
}

int dfm_target_reader_next(dfm_target_reader *r, dfm_trec *out) {
    if (!r->it_started) DFM_TRY(dfm_target_reader_seek(r, 0));
    if (r->prefetch < 0) {
        if (!r->sync_it) return DFM_FAIL(DFM_ESTATE, "iterator failed earlier; seek again");
        return iter_next(r->sync_it, out);
    }
    if (!r->thr_live) return DFM_FAIL(DFM_ESTATE, "iterator not started; call dfm_target_reader_seek");
    pthread_mutex_lock(&r->mu);
    while (r->count == 0) pthread_cond_wait(&r->cv, &r->mu);
    slot_t *sl = &r->ring[r->head];
    pthread_mutex_unlock(&r->mu);
    int rc = sl->rc;
    if (rc < 0) {
        /* re-raise the prefetch thread's error on this thread, as it was */
        const char *m = sl->msg ? sl->msg : "prefetch failed";
        size_t pl = strlen(dfm_strerror(rc));
        if (!strncmp(m, dfm_strerror(rc), pl) && m[pl] == ':' && m[pl + 1] == ' ') m += pl + 2;
        return DFM_FAIL(rc, "%s", m);
    }
    if (rc == DFM_TARGET_END) return DFM_TARGET_END; /* the slot stays: further calls keep saying END */
    size_t k = r->info.k;
    out->chunk_id = sl->chunk_id;
    out->mask = sl->mask;
    out->flags = sl->flags;
    if (out->ids) memcpy(out->ids, sl->ids, sizeof(int64_t) * k);
    if (out->scores) memcpy(out->scores, sl->scores, sizeof(float) * k);
    if (out->emb) memcpy(out->emb, sl->emb, sizeof(float) * k * r->info.d);
    pthread_mutex_lock(&r->mu);
    r->head = (r->head + 1) % r->cap;
    r->count--;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return DFM_OK;
}

void dfm_target_reader_close(dfm_target_reader *r) {
    if (!r) return;
    stop_thread(r);
    iter_free(r->sync_it);
    if (r->ring) {
        for (int i = 0; i < r->cap; i++) {
            free(r->ring[i].ids);
            free(r->ring[i].scores);
            free(r->ring[i].emb);
            free(r->ring[i].msg);
        }
        free(r->ring);
    }
    if (r->shards) {
        for (uint32_t i = 0; i < r->info.n_shards; i++) {
            shard_t *s = &r->shards[i];
            if (s->txn) mdb_txn_abort(s->txn);
            if (s->env) mdb_env_close(s->env);
            if (s->table_map) munmap(s->table_map, s->table_len);
            free(s->dir);
        }
        free(r->shards);
    }
    dfm_trec_codec_free(r->codec);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->run_dir);
    free(r);
}
