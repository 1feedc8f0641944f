/* target_writer.c — one LMDB target shard, built under a temporary name. See target_writer.h. */
#include "shard/target_writer.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <errno.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <fcntl.h>
#include <lmdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

struct dfm_target_writer {
    dfm_target_writer_config cfg;
    dfm_target_shard_meta meta;
    char *dir, *tmp_dir, *fingerprint;
    MDB_env *env;
    size_t map_bytes;
    /* pending batch: concatenated records, with their ids and offsets */
    uint8_t *buf;
    size_t buf_len, buf_cap;
    uint64_t *ids;
    size_t *offs;
    uint32_t n_batch;
    uint64_t next_id;
    XXH3_state_t *sum;
    /* table.bin (store = ids) */
    FILE *table;
    XXH3_state_t *table_sum;
    uint64_t table_rows;
};

static uint64_t g_puts; /* fault injection counter (per process) */

uint64_t dfm_target_map_estimate(const dfm_trec_params *p, uint64_t n) {
    /* a value past ~2 KiB goes to overflow pages: round each record up to whole 4 KiB pages */
    uint64_t rec = dfm_trec_max_bytes(p->k, p->d, p->dtype, p->ids_only) + 16;
    uint64_t per = rec > 2000 ? (rec + 4095) / 4096 * 4096 : rec * 2;
    return n * per + n * 64 + (4u << 20);
}

/* LMDB turns a short write (disk full, file-size limit) into EIO: look at the disk and the limit */
static int out_of_space(const char *path) {
    struct statvfs v;
    struct rlimit lim;
    if (statvfs(path, &v) == 0 && (uint64_t)v.f_bavail * v.f_frsize < (64u << 20)) return 1;
    return getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY;
}

static int lmdb_fail(int rc, const char *what, const char *path) {
    if (rc == ENOSPC || rc == EFBIG || rc == EDQUOT || (rc == EIO && out_of_space(path)))
        return DFM_FAIL(DFM_ENOSPACE, "%s %s: %s: no space left on the disk or a file-size limit reached. HINT: free disk space (or raise the limit) and re-run; complete shards are kept",
                        what, path, mdb_strerror(rc));
    return DFM_FAIL(DFM_ELMDB, "%s %s: %s", what, path, mdb_strerror(rc));
}

static int open_env(dfm_target_writer *w) {
    int rc = mdb_env_create(&w->env);
    if (rc) return lmdb_fail(rc, "mdb_env_create for", w->tmp_dir);
    if ((rc = mdb_env_set_mapsize(w->env, w->map_bytes)) ||
        /* one writer, no readers while building: no lock file; durability comes from the final sync */
        (rc = mdb_env_open(w->env, w->tmp_dir, MDB_NOLOCK | MDB_NOSYNC | MDB_NOMETASYNC, 0644))) {
        mdb_env_close(w->env);
        w->env = NULL;
        return lmdb_fail(rc, "opening LMDB environment", w->tmp_dir);
    }
    return DFM_OK;
}

int dfm_target_writer_open(const dfm_target_writer_config *cfg, dfm_target_writer **out) {
    *out = NULL;
    if (!cfg->n_shards || cfg->shard >= cfg->n_shards)
        return DFM_FAIL(DFM_EARG, "shard %u of %u does not exist", cfg->shard, cfg->n_shards);
    if (!cfg->fingerprint || strlen(cfg->fingerprint) != 16) return DFM_FAIL(DFM_EARG, "writer needs a 16-hex-digit run fingerprint");
    dfm_trec_codec *probe;
    DFM_TRY(dfm_trec_codec_create(&cfg->rec, &probe)); /* validates k, d, dtype, level */
    dfm_trec_codec_free(probe);
    dfm_target_writer *w = calloc(1, sizeof *w);
    if (!w) return DFM_FAIL(DFM_ENOMEM, "no memory");
    w->cfg = *cfg;
    w->cfg.run_dir = NULL;
    w->cfg.fingerprint = NULL;
    if (!w->cfg.batch_records) w->cfg.batch_records = 512;
    dfm_target_shard_meta *m = &w->meta;
    m->shard = cfg->shard;
    m->n_shards = cfg->n_shards;
    m->n_chunks_total = cfg->n_chunks_total;
    dfm_target_shard_range(cfg->n_chunks_total, cfg->n_shards, cfg->shard, &m->first_chunk, &m->n_chunks);
    m->k = cfg->rec.k;
    m->d = cfg->rec.d;
    m->dtype = cfg->rec.dtype;
    m->ids_only = cfg->rec.ids_only;
    m->shuffle = cfg->rec.shuffle;
    m->level = cfg->rec.level;
    m->slots = cfg->rec.slots;
    memcpy(m->fingerprint, cfg->fingerprint, 17);
    w->next_id = m->first_chunk;
    w->map_bytes = cfg->map_bytes ? cfg->map_bytes : dfm_target_map_estimate(&cfg->rec, m->n_chunks);
    w->dir = dfm_target_shard_dir(cfg->run_dir, cfg->shard, 0);
    w->tmp_dir = dfm_target_shard_dir(cfg->run_dir, cfg->shard, 1);
    w->ids = malloc(sizeof *w->ids * w->cfg.batch_records);
    w->offs = malloc(sizeof *w->offs * (w->cfg.batch_records + 1));
    w->sum = XXH3_createState();
    char *tdir = dfm_strdupf("%s%stargets", cfg->run_dir, cfg->run_dir[strlen(cfg->run_dir) - 1] == '/' ? "" : "/");
    int rc = DFM_OK;
    if (!w->dir || !w->tmp_dir || !w->ids || !w->offs || !w->sum || !tdir) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = dfm_mkdir_p(tdir);
    free(tdir);
    if (!rc) rc = dfm_target_rmdir(w->tmp_dir); /* a killed attempt's leftovers are never resumed */
    if (!rc && mkdir(w->tmp_dir, 0755) != 0)
        rc = DFM_FAIL(dfm_errno_code(errno), "cannot create %s: %s", w->tmp_dir, strerror(errno));
    if (!rc) XXH3_64bits_reset(w->sum);
    if (!rc) rc = open_env(w);
    if (!rc && cfg->rec.ids_only) {
        char *tp = dfm_path_join(w->tmp_dir, "table.bin");
        w->table = tp ? fopen(tp, "wb") : NULL;
        w->table_sum = XXH3_createState();
        uint8_t zero[DFM_TTAB_HEADER_BYTES] = {0};
        if (!w->table || !w->table_sum || fwrite(zero, 1, sizeof zero, w->table) != sizeof zero)
            rc = DFM_FAIL(DFM_EIO, "cannot create %s: %s", tp ? tp : "table.bin", strerror(errno));
        else XXH3_64bits_reset(w->table_sum);
        free(tp);
    }
    if (rc) {
        dfm_target_writer_abort(w);
        return rc;
    }
    *out = w;
    return DFM_OK;
}

static int commit_batch(dfm_target_writer *w) {
    if (!w->n_batch) return DFM_OK;
    for (int attempt = 0; attempt < 40; attempt++) {
        MDB_txn *txn;
        MDB_dbi dbi;
        int rc = mdb_txn_begin(w->env, NULL, 0, &txn);
        if (rc) return lmdb_fail(rc, "mdb_txn_begin on", w->tmp_dir);
        rc = mdb_dbi_open(txn, NULL, 0, &dbi);
        for (uint32_t i = 0; !rc && i < w->n_batch; i++) {
            uint8_t key[8];
            dfm_trec_key(w->ids[i], key);
            MDB_val k = {8, key}, v = {w->offs[i + 1] - w->offs[i], w->buf + w->offs[i]};
            rc = mdb_put(txn, dbi, &k, &v, MDB_APPEND);
        }
        if (rc) mdb_txn_abort(txn);
        else rc = mdb_txn_commit(txn);
        if (rc == MDB_MAP_FULL) {
            /* no transaction is open now: the map may be resized, then the whole batch replayed */
            size_t grown = w->map_bytes * 2;
            if ((rc = mdb_env_set_mapsize(w->env, grown))) return lmdb_fail(rc, "growing the map of", w->tmp_dir);
            DFM_LOG_D("shard %s: map full at %zu bytes, grown to %zu", w->tmp_dir, w->map_bytes, grown);
            w->map_bytes = grown;
            continue;
        }
        if (rc == MDB_KEYEXIST) return DFM_FAIL(DFM_EINTERNAL, "%s: records not in ascending key order", w->tmp_dir);
        if (rc) return lmdb_fail(rc, "writing records to", w->tmp_dir);
        w->n_batch = 0;
        w->buf_len = 0;
        return DFM_OK;
    }
    return DFM_FAIL(DFM_ENOSPACE, "%s: LMDB map still full at %zu bytes", w->tmp_dir, w->map_bytes);
}

int dfm_target_writer_put(dfm_target_writer *w, uint64_t chunk_id, const void *rec, size_t n, uint64_t mask) {
    dfm_target_shard_meta *m = &w->meta;
    if (chunk_id != w->next_id || chunk_id >= m->first_chunk + m->n_chunks)
        return DFM_FAIL(DFM_EINTERNAL, "%s: record for chunk %llu, expected %llu (range [%llu, %llu))", w->tmp_dir,
                        (unsigned long long)chunk_id, (unsigned long long)w->next_id, (unsigned long long)m->first_chunk,
                        (unsigned long long)(m->first_chunk + m->n_chunks));
    /* the record comes from dfm_trec_encode in this process: check its header fields, not its checksum
     * (every reader and verify check that) */
    dfm_trec_header h;
    if (n < DFM_TREC_HEADER_BYTES) return DFM_FAIL(DFM_EINTERNAL, "record of %zu bytes put into %s", n, w->tmp_dir);
    memcpy(&h, rec, sizeof h);
    if (memcmp(h.magic, DFM_TREC_MAGIC, 4) != 0 || h.version != DFM_TREC_VERSION || h.stored_bytes != n - DFM_TREC_HEADER_BYTES ||
        h.k != w->meta.k || h.d != w->meta.d || h.dtype != w->meta.dtype || h.slots != w->meta.slots)
        return DFM_FAIL(DFM_EINTERNAL, "malformed record put into %s (chunk %llu)", w->tmp_dir, (unsigned long long)chunk_id);
    if (h.chunk_id != chunk_id) return DFM_FAIL(DFM_EINTERNAL, "record of chunk %llu put as %llu", (unsigned long long)h.chunk_id, (unsigned long long)chunk_id);
    if (w->buf_len + n > w->buf_cap) {
        size_t cap = (w->buf_len + n) * 2;
        uint8_t *b = realloc(w->buf, cap);
        if (!b) return DFM_FAIL(DFM_ENOMEM, "no memory for a batch of records");
        w->buf = b;
        w->buf_cap = cap;
    }
    memcpy(w->buf + w->buf_len, rec, n);
    w->offs[w->n_batch] = w->buf_len;
    w->ids[w->n_batch] = chunk_id;
    w->buf_len += n;
    w->offs[++w->n_batch] = w->buf_len;
    uint8_t key[8];
    dfm_trec_key(chunk_id, key);
    XXH3_64bits_update(w->sum, key, 8);
    XXH3_64bits_update(w->sum, &h.payload_checksum, 8);
    m->records++;
    m->raw_bytes += h.payload_bytes;
    m->stored_bytes += n;
    if (h.flags & DFM_TREC_F_EMPTY) m->empty_records++;
    else m->padded_slots += (uint64_t)h.k - (uint64_t)__builtin_popcountll(mask);
    if (h.flags & DFM_TREC_F_SEQ_START) m->seq_starts++;
    w->next_id++;
    if (w->n_batch == w->cfg.batch_records) DFM_TRY(commit_batch(w));
    g_puts++;
    const char *fault = getenv("DFM_FAULT_TARGETS_KILL_AFTER"); /* read each time: a forked child may set it */
    long long kill_after = fault ? atoll(fault) : -1;
    if (kill_after >= 0 && g_puts >= (uint64_t)kill_after) {
        DFM_LOG_W("fault injection: killing myself after %llu records (DFM_FAULT_TARGETS_KILL_AFTER)", (unsigned long long)g_puts);
        raise(SIGKILL);
    }
    return DFM_OK;
}

int dfm_target_writer_put_rows(dfm_target_writer *w, const void *rows, uint64_t n) {
    if (!w->table) return DFM_FAIL(DFM_EINTERNAL, "table rows for a shard that stores embeddings");
    if (w->table_rows + n > w->meta.n_chunks) return DFM_FAIL(DFM_EINTERNAL, "%s: more table rows than chunks", w->tmp_dir);
    size_t bytes = (size_t)n * w->meta.d * dfm_dtype_size(w->meta.dtype);
    if (bytes && fwrite(rows, 1, bytes, w->table) != bytes)
        return DFM_FAIL(dfm_errno_code(errno), "writing %s/table.bin: %s", w->tmp_dir, strerror(errno));
    XXH3_64bits_update(w->table_sum, rows, bytes);
    w->table_rows += n;
    return DFM_OK;
}

static int finish_table(dfm_target_writer *w) {
    dfm_target_shard_meta *m = &w->meta;
    if (w->table_rows != m->n_chunks)
        return DFM_FAIL(DFM_EINTERNAL, "%s: %llu table rows for %llu chunks", w->tmp_dir, (unsigned long long)w->table_rows,
                        (unsigned long long)m->n_chunks);
    dfm_ttab_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, DFM_TTAB_MAGIC, 8);
    h.version = DFM_TTAB_VERSION;
    h.dtype = (uint32_t)m->dtype;
    h.d = m->d;
    h.first_chunk = m->first_chunk;
    h.n_rows = m->n_chunks;
    h.payload_bytes = m->n_chunks * m->d * dfm_dtype_size(m->dtype);
    h.payload_checksum = XXH3_64bits_digest(w->table_sum);
    h.header_checksum = dfm_checksum64(&h, DFM_TTAB_HEADER_BYTES - 8);
    int rc = DFM_OK;
    if (fseek(w->table, 0, SEEK_SET) != 0 || fwrite(&h, 1, sizeof h, w->table) != sizeof h || fflush(w->table) != 0 ||
        fsync(fileno(w->table)) != 0)
        rc = DFM_FAIL(dfm_errno_code(errno), "finishing %s/table.bin: %s", w->tmp_dir, strerror(errno));
    if (fclose(w->table) != 0 && !rc) rc = DFM_FAIL(DFM_EIO, "closing %s/table.bin: %s", w->tmp_dir, strerror(errno));
    w->table = NULL;
    m->table_bytes = DFM_TTAB_HEADER_BYTES + h.payload_bytes;
    return rc;
}

static void sync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

static void writer_free(dfm_target_writer *w) {
    if (w->env) mdb_env_close(w->env);
    if (w->table) fclose(w->table);
    XXH3_freeState(w->sum);
    XXH3_freeState(w->table_sum);
    free(w->dir);
    free(w->tmp_dir);
    free(w->fingerprint);
    free(w->buf);
    free(w->ids);
    free(w->offs);
    free(w);
}

int dfm_target_writer_finish(dfm_target_writer *w, dfm_target_shard_meta *meta) {
    dfm_target_shard_meta *m = &w->meta;
    int rc = commit_batch(w);
    if (!rc && m->records != m->n_chunks)
        rc = DFM_FAIL(DFM_EINTERNAL, "%s: %llu records for a range of %llu chunks", w->tmp_dir, (unsigned long long)m->records,
                      (unsigned long long)m->n_chunks);
    if (!rc && m->n_chunks == 0) {
        /* an empty shard still gets a valid (empty) environment */
        MDB_txn *txn;
        MDB_dbi dbi;
        int lr = mdb_txn_begin(w->env, NULL, 0, &txn);
        if (!lr) lr = mdb_dbi_open(txn, NULL, 0, &dbi);
        if (!lr) lr = mdb_txn_commit(txn);
        if (lr) rc = lmdb_fail(lr, "initialising", w->tmp_dir);
    }
    if (!rc) {
        int lr = mdb_env_sync(w->env, 1);
        if (lr) rc = lmdb_fail(lr, "syncing", w->tmp_dir);
    }
    if (w->env) {
        mdb_env_close(w->env);
        w->env = NULL;
    }
    if (!rc && w->table) rc = finish_table(w);
    m->records_checksum = XXH3_64bits_digest(w->sum);
    char *data = dfm_path_join(w->tmp_dir, "data.mdb");
    if (!rc) rc = data ? dfm_file_size(data, &m->data_bytes) : DFM_FAIL(DFM_ENOMEM, "no memory");
    free(data);
    if (!rc) rc = dfm_target_meta_write(w->tmp_dir, m);
    if (!rc) {
        sync_dir(w->tmp_dir);
        rc = dfm_target_rmdir(w->dir); /* an old shard of another configuration */
    }
    if (!rc && rename(w->tmp_dir, w->dir) != 0)
        rc = DFM_FAIL(DFM_EIO, "renaming %s to %s: %s", w->tmp_dir, w->dir, strerror(errno));
    if (!rc) {
        char *parent = dfm_strdupf("%s", w->dir);
        if (parent) {
            char *slash = strrchr(parent, '/');
            if (slash) *slash = 0;
            sync_dir(parent);
        }
        free(parent);
        if (meta) *meta = *m;
        writer_free(w);
        return DFM_OK;
    }
    dfm_target_rmdir(w->tmp_dir);
    writer_free(w);
    return rc;
}

void dfm_target_writer_abort(dfm_target_writer *w) {
    if (!w) return;
    if (w->env) {
        mdb_env_close(w->env);
        w->env = NULL;
    }
    if (w->table) {
        fclose(w->table);
        w->table = NULL;
    }
    if (w->tmp_dir) dfm_target_rmdir(w->tmp_dir);
    writer_free(w);
}
