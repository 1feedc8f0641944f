/* Unit tests of target shards: writer + build (MPI singleton) + reader, and every fault the reader
 * must name: flipped byte, truncated data.mdb, unknown record version, another run's shard,
 * an incomplete shard, a writer killed mid-shard. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"
#include "common/mpiutil.h"
#include "shard/target_build.h"
#include "shard/target_reader.h"
#include "shard/target_writer.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];
static dfm_mpi mpi;

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dfm-test-shard-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}
static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

typedef struct {
    uint64_t n;
    uint32_t k, d, shards, block;
    int dtype, ids_only, shuffle;
    uint64_t seed, map_bytes;
} run_spec;

static char *run_path(const char *name) { return dfm_path_join(tmpdir, name); }

static void make_run(const char *run, const run_spec *s) {
    assert_int_equal(dfm_mkdir_p(run), DFM_OK);
    json_t *man;
    assert_int_equal(dfm_manifest_load(run, 1, &man), DFM_OK);
    dfm_target_synth syn = {.n_chunks = s->n, .k = s->k, .d = s->d, .seq_chunks = 5, .seed = s->seed};
    dfm_target_source src;
    dfm_target_synth_source(&syn, mpi.rank, mpi.size, &src);
    assert_int_equal(dfm_target_synth_stage(man, &syn), DFM_OK);
    dfm_target_build_config bc = {.n_shards = s->shards,
                                  .rec = {.k = s->k, .d = s->d, .dtype = s->dtype, .ids_only = s->ids_only, .shuffle = s->shuffle, .level = 3},
                                  .block_queries = s->block, .batch_records = 16, .map_bytes = s->map_bytes,
                                  .threads = s->shuffle ? 2 : 1 /* both encoding paths */};
    char fp[17];
    int skip;
    assert_int_equal(dfm_target_stage_begin(man, run, NULL, &bc, s->n, 1, fp, &skip), DFM_OK);
    bc.fingerprint = fp;
    dfm_target_build_stats st;
    int rc = dfm_target_build(&mpi, run, &src, &bc, &st);
    if (rc) fail_msg("build: %s", dfm_last_error());
    assert_int_equal(dfm_target_stage_finish(man, run, s->shards, &st, 0.0), DFM_OK);
    json_decref(man);
}

static float through(int dtype, float v) {
    if (dtype == DFM_DTYPE_FP16) return dfm_f16_to_f32(dfm_f32_to_f16(v));
    if (dtype == DFM_DTYPE_BF16) return dfm_bf16_to_f32(dfm_f32_to_bf16(v));
    return v;
}

/* compare a decoded record with what the synthetic source says it must be */
static void check_record(const run_spec *s, const dfm_trec *t, uint64_t id) {
    dfm_target_synth syn = {.n_chunks = s->n, .k = s->k, .d = s->d, .seq_chunks = 5, .seed = s->seed};
    dfm_target_source src;
    dfm_target_synth_source(&syn, 0, 1, &src);
    int64_t ids[64];
    float scores[64], row[256];
    uint64_t mask;
    uint8_t seq;
    src.neighbors(src.ctx, id, 1, ids, scores, &mask, &seq);
    if (seq) mask = 0;
    assert_true(t->chunk_id == id);
    assert_true(t->mask == mask);
    assert_int_equal(!!(t->flags & DFM_TREC_F_SEQ_START), seq);
    for (uint32_t r = 0; r < s->k; r++) {
        int valid = (int)((mask >> r) & 1u);
        assert_true(t->ids[r] == (valid ? ids[r] : -1));
        assert_true(t->scores[r] == (valid ? scores[r] : 0.0f));
        if (valid) dfm_target_synth_row(&syn, (uint64_t)ids[r], row);
        for (uint32_t j = 0; j < s->d; j++) {
            float want = valid ? through(s->dtype, row[j]) : 0.0f;
            if (memcmp(&want, &t->emb[r * s->d + j], 4) != 0)
                fail_msg("chunk %llu slot %u value %u: %g, want %g", (unsigned long long)id, r, j, t->emb[r * s->d + j], want);
        }
    }
}

static void read_all(const char *run, const run_spec *s, int prefetch) {
    dfm_target_reader *r;
    dfm_target_open_opts o = {.k = s->k, .d = s->d, .n_chunks = s->n, .prefetch = prefetch};
    int rc = dfm_target_reader_open(run, &o, &r);
    if (rc) fail_msg("open: %s", dfm_last_error());
    const dfm_target_info *inf = dfm_target_reader_info(r);
    assert_true(inf->n_chunks == s->n && inf->k == s->k && inf->d == s->d && inf->dtype == s->dtype && inf->ids_only == s->ids_only);
    int64_t ids[64];
    float scores[64], *emb = malloc(sizeof(float) * s->k * s->d);
    dfm_trec t = {.ids = ids, .scores = scores, .emb = emb};
    uint64_t n = 0;
    while ((rc = dfm_target_reader_next(r, &t)) == DFM_OK) check_record(s, &t, n++);
    if (rc != DFM_TARGET_END) fail_msg("next: %s", dfm_last_error());
    assert_true(n == s->n);
    assert_int_equal(dfm_target_reader_next(r, &t), DFM_TARGET_END);
    /* random access, and a seek into the middle of a shard */
    for (uint64_t id = 0; id < s->n; id += 37) {
        assert_int_equal(dfm_target_reader_get(r, id, &t), DFM_OK);
        check_record(s, &t, id);
    }
    assert_int_equal(dfm_target_reader_get(r, s->n, &t), DFM_ERANGE);
    assert_int_equal(dfm_target_reader_seek(r, s->n / 2 + 1), DFM_OK);
    for (uint64_t id = s->n / 2 + 1; id < s->n; id++) {
        assert_int_equal(dfm_target_reader_next(r, &t), DFM_OK);
        check_record(s, &t, id);
    }
    assert_int_equal(dfm_target_reader_next(r, &t), DFM_TARGET_END);
    free(emb);
    dfm_target_reader_close(r);
}

static void test_roundtrip_dtypes_and_stores(void **state) {
    int dtypes[] = {DFM_DTYPE_FP32, DFM_DTYPE_FP16, DFM_DTYPE_BF16};
    int i = 0;
    for (int t = 0; t < 3; t++) {
        for (int ids_only = 0; ids_only < 2; ids_only++) {
            run_spec s = {.n = 203, .k = 6, .d = 20, .shards = 3, .block = 32, .dtype = dtypes[t], .ids_only = ids_only,
                          .shuffle = t != 1, .seed = 7, .map_bytes = 40960 /* forces map growth */};
            char name[32];
            snprintf(name, sizeof name, "rt%d", i++);
            char *run = run_path(name);
            make_run(run, &s);
            read_all(run, &s, 0);
            read_all(run, &s, -1);
            read_all(run, &s, 1);
            free(run);
        }
    }
    dfm_target_reader_close(NULL);
}

static void test_more_shards_than_chunks(void **state) {
    run_spec s = {.n = 3, .k = 2, .d = 4, .shards = 5, .block = 2, .dtype = DFM_DTYPE_FP16, .seed = 1};
    char *run = run_path("tiny");
    make_run(run, &s);
    read_all(run, &s, 0);
    free(run);
}

/* ---- corruption helpers ---------------------------------------------------------------------- */
static uint8_t *slurp(const char *path, size_t *n) {
    char *buf;
    assert_int_equal(dfm_read_file(path, &buf, n), DFM_OK);
    return (uint8_t *)buf;
}

static void spit(const char *path, const uint8_t *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
}

/* Apply fn to every copy of chunk id's record inside its shard's data.mdb (LMDB's copy-on-write
 * leaves stale copies of rewritten pages in the file; the live one is among them). */
static void patch_record(const char *run, uint64_t id, size_t at, uint8_t xor_mask, int set, uint8_t value) {
    dfm_target_reader *r;
    assert_int_equal(dfm_target_reader_open(run, NULL, &r), DFM_OK);
    const void *rec;
    size_t n;
    assert_int_equal(dfm_target_reader_raw(r, id, &rec, &n), DFM_OK);
    assert_true(at < n);
    uint8_t *copy = malloc(n);
    memcpy(copy, rec, n);
    uint64_t s = id / dfm_target_reader_info(r)->span;
    dfm_target_reader_close(r);
    char rel[64];
    snprintf(rel, sizeof rel, "targets/shard-%05llu/data.mdb", (unsigned long long)s);
    char *path = dfm_path_join(run, rel);
    size_t fn;
    uint8_t *file = slurp(path, &fn), *p = file;
    int hits = 0;
    while ((p = memmem(p, fn - (size_t)(p - file), copy, n))) {
        if (set) p[at] = value;
        else p[at] ^= xor_mask;
        p += n;
        hits++;
    }
    assert_true(hits >= 1);
    spit(path, file, fn);
    free(file);
    free(path);
    free(copy);
}

static void expect_open_fails(const char *run, const dfm_target_open_opts *o, int code, const char *needle) {
    dfm_target_reader *r = NULL;
    int rc = dfm_target_reader_open(run, o, &r);
    if (rc != code) fail_msg("open gave %d (%s), want %d", rc, dfm_last_error(), code);
    if (needle && !strstr(dfm_last_error(), needle)) fail_msg("message '%s' does not name '%s'", dfm_last_error(), needle);
    assert_null(r);
}

static void expect_get_fails(const char *run, uint64_t id, int code, const char *needle) {
    dfm_target_reader *r;
    assert_int_equal(dfm_target_reader_open(run, NULL, &r), DFM_OK);
    int64_t ids[64];
    float sc[64], emb[64 * 64];
    dfm_trec t = {.ids = ids, .scores = sc, .emb = emb};
    int rc = dfm_target_reader_get(r, id, &t);
    if (rc != code) fail_msg("get gave %d (%s), want %d", rc, dfm_last_error(), code);
    if (!strstr(dfm_last_error(), needle)) fail_msg("message '%s' does not name '%s'", dfm_last_error(), needle);
    /* the iterator finds it too */
    while ((rc = dfm_target_reader_next(r, &t)) == DFM_OK) {
    }
    if (rc != code) fail_msg("iteration gave %d (%s), want %d", rc, dfm_last_error(), code);
    if (!strstr(dfm_last_error(), needle)) fail_msg("message '%s' does not name '%s'", dfm_last_error(), needle);
    dfm_target_reader_close(r);
}

static void test_flipped_byte_named(void **state) {
    run_spec s = {.n = 120, .k = 4, .d = 32, .shards = 2, .block = 50, .dtype = DFM_DTYPE_FP16, .shuffle = 1, .seed = 3};
    char *run = run_path("flip");
    make_run(run, &s);
    patch_record(run, 77, 100, 0x10, 0, 0); /* inside the compressed payload */
    expect_get_fails(run, 77, DFM_ECHECKSUM, "shard-00001 key 000000000000004d (chunk 77)");
    patch_record(run, 77, 100, 0x10, 0, 0); /* undo */
    patch_record(run, 77, 9, 0x01, 0, 0);   /* the header's chunk id */
    expect_get_fails(run, 77, DFM_ECHECKSUM, "shard-00001 key 000000000000004d");
    free(run);
}

static void test_unknown_version_named(void **state) {
    run_spec s = {.n = 60, .k = 4, .d = 8, .shards = 1, .block = 50, .dtype = DFM_DTYPE_FP32, .shuffle = 1, .seed = 3};
    char *run = run_path("ver");
    make_run(run, &s);
    patch_record(run, 12, 4, 0, 1, 2); /* version 2 */
    expect_get_fails(run, 12, DFM_EVERSION, "shard-00000 key 000000000000000c (chunk 12)");
    free(run);
}

static void test_truncated_and_incomplete(void **state) {
    run_spec s = {.n = 100, .k = 4, .d = 16, .shards = 2, .block = 50, .dtype = DFM_DTYPE_FP16, .shuffle = 1, .seed = 3};
    char *run = run_path("trunc");
    make_run(run, &s);
    char *data = dfm_path_join(run, "targets/shard-00001/data.mdb");
    uint64_t size;
    assert_int_equal(dfm_file_size(data, &size), DFM_OK);
    assert_int_equal(truncate(data, (off_t)size - 4096), 0);
    expect_open_fails(run, NULL, DFM_ETRUNCATED, "shard-00001/data.mdb");
    /* a shard without shard.json is incomplete */
    char *side = dfm_path_join(run, "targets/shard-00000/shard.json");
    assert_int_equal(unlink(side), 0);
    expect_open_fails(run, NULL, DFM_ENOTFOUND, "shard-00000/shard.json");
    free(side);
    free(data);
    free(run);
}

static void test_other_run_named(void **state) {
    run_spec a = {.n = 90, .k = 4, .d = 8, .shards = 2, .block = 50, .dtype = DFM_DTYPE_FP16, .shuffle = 1, .seed = 1};
    run_spec b = a;
    b.seed = 2;
    char *ra = run_path("runa"), *rb = run_path("runb");
    make_run(ra, &a);
    make_run(rb, &b);
    /* targets of run A checked against the tokens of run B */
    dfm_target_open_opts o = {.tokens_run = rb};
    expect_open_fails(ra, &o, DFM_EMISMATCH, "'synthetic' stage");
    dfm_target_open_opts ok = {.tokens_run = ra};
    dfm_target_reader *r;
    assert_int_equal(dfm_target_reader_open(ra, &ok, &r), DFM_OK);
    dfm_target_reader_close(r);
    /* expected shape */
    dfm_target_open_opts kk = {.k = 16};
    expect_open_fails(ra, &kk, DFM_EMISMATCH, "K 4");
    /* run B's shard 1 dropped into run A */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf %s/targets/shard-00001 && cp -r %s/targets/shard-00001 %s/targets/", ra, rb, ra);
    assert_int_equal(system(cmd), 0);
    expect_open_fails(ra, NULL, DFM_EMISMATCH, "shard-00001: run fingerprint");
    free(ra);
    free(rb);
}

/* A writer killed mid-shard (SIGKILL through the fault-injection point) leaves only a .tmp folder:
 * nothing a reader or a re-run takes for complete; the re-run rebuilds it. */
static void test_killed_writer(void **state) {
    run_spec s = {.n = 200, .k = 4, .d = 16, .shards = 2, .block = 40, .dtype = DFM_DTYPE_FP16, .shuffle = 1, .seed = 5};
    char *run = run_path("killed");
    make_run(run, &s); /* complete run: manifest + 2 shards */
    /* rebuild shard 1 in a child that dies after 30 records */
    char *dir1 = dfm_path_join(run, "targets/shard-00001");
    dfm_target_shard_meta m1;
    assert_int_equal(dfm_target_meta_read(dir1, &m1), DFM_OK);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("DFM_FAULT_TARGETS_KILL_AFTER", "30", 1);
        dfm_target_writer_config wc = {.run_dir = run, .shard = 1, .n_shards = 2, .n_chunks_total = s.n,
                                       .rec = {.k = 4, .d = 16, .dtype = DFM_DTYPE_FP16, .shuffle = 1, .level = 3},
                                       .fingerprint = m1.fingerprint, .batch_records = 8};
        dfm_target_writer *w;
        if (dfm_target_writer_open(&wc, &w)) _exit(3);
        dfm_trec_codec *c;
        if (dfm_trec_codec_create(&wc.rec, &c)) _exit(4);
        static uint8_t rec[1 << 16];
        int64_t ids[4] = {1, 2, 3, 4};
        float sc[4] = {0}, emb[64] = {0};
        for (uint64_t id = m1.first_chunk; id < m1.first_chunk + m1.n_chunks; id++) {
            dfm_trec t = {.chunk_id = id, .mask = 0xf, .ids = ids, .scores = sc, .emb = emb};
            size_t n;
            if (dfm_trec_encode(c, &t, rec, sizeof rec, &n) || dfm_target_writer_put(w, id, rec, n, 0xf)) _exit(5);
        }
        _exit(6); /* not reached: killed at the 30th record */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    /* the complete shard 1 of before is still there (rename happens only at finish) and the .tmp is
     * not complete; now simulate the crash of a first build: no final folder at all */
    char *tmp1 = dfm_path_join(run, "targets/shard-00001.tmp");
    assert_true(dfm_path_exists(tmp1));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir1);
    assert_int_equal(system(cmd), 0);
    dfm_target_shard_meta expect = m1;
    assert_int_equal(dfm_target_shard_complete(run, 1, &expect), 0);
    assert_int_equal(dfm_target_shard_complete(run, 0, &expect), 1);
    expect_open_fails(run, NULL, DFM_ENOTFOUND, "shard-00001");
    /* re-run: shard 0 skipped, shard 1 rebuilt, .tmp gone, everything reads back */
    json_t *man;
    assert_int_equal(dfm_manifest_load(run, 0, &man), DFM_OK);
    dfm_target_synth syn = {.n_chunks = s.n, .k = s.k, .d = s.d, .seq_chunks = 5, .seed = s.seed};
    dfm_target_source src;
    dfm_target_synth_source(&syn, 0, 1, &src);
    dfm_target_build_config bc = {.n_shards = 2, .rec = {.k = 4, .d = 16, .dtype = DFM_DTYPE_FP16, .shuffle = 1, .level = 3},
                                  .block_queries = 40, .fingerprint = m1.fingerprint};
    dfm_target_build_stats st;
    assert_int_equal(dfm_target_build(&mpi, run, &src, &bc, &st), DFM_OK);
    assert_true(st.shards_skipped == 1 && st.shards_built == 1);
    assert_false(dfm_path_exists(tmp1));
    assert_int_equal(dfm_target_stage_finish(man, run, 2, &st, 0), DFM_OK);
    json_decref(man);
    read_all(run, &s, 0);
    free(tmp1);
    free(dir1);
    free(run);
}

static void test_writer_rejects_disorder(void **state) {
    char *run = run_path("disorder");
    dfm_target_writer_config wc = {.run_dir = run, .shard = 0, .n_shards = 1, .n_chunks_total = 10,
                                   .rec = {.k = 2, .d = 4, .dtype = DFM_DTYPE_FP32, .level = 3}, .fingerprint = "0123456789abcdef"};
    dfm_target_writer *w;
    assert_int_equal(dfm_target_writer_open(&wc, &w), DFM_OK);
    dfm_trec_codec *c;
    assert_int_equal(dfm_trec_codec_create(&wc.rec, &c), DFM_OK);
    uint8_t rec[4096];
    int64_t ids[2] = {1, 2};
    float sc[2] = {0}, emb[8] = {0};
    dfm_trec t = {.chunk_id = 1, .mask = 3, .ids = ids, .scores = sc, .emb = emb};
    size_t n;
    assert_int_equal(dfm_trec_encode(c, &t, rec, sizeof rec, &n), DFM_OK);
    assert_int_equal(dfm_target_writer_put(w, 1, rec, n, 3), DFM_EINTERNAL); /* 0 must come first */
    t.chunk_id = 0;
    assert_int_equal(dfm_trec_encode(c, &t, rec, sizeof rec, &n), DFM_OK);
    assert_int_equal(dfm_target_writer_put(w, 0, rec, n, 3), DFM_OK);
    assert_int_equal(dfm_target_writer_finish(w, NULL), DFM_EINTERNAL); /* 9 records missing */
    char *tmp = dfm_path_join(run, "targets/shard-00000.tmp"), *fin = dfm_path_join(run, "targets/shard-00000");
    assert_false(dfm_path_exists(tmp));
    assert_false(dfm_path_exists(fin));
    dfm_target_writer_abort(NULL);
    dfm_trec_codec_free(c);
    free(tmp);
    free(fin);
    free(run);
}

int main(int argc, char **argv) {
    if (dfm_mpi_init(&argc, &argv, &mpi)) {
        fprintf(stderr, "%s\n", dfm_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_dtypes_and_stores),
        cmocka_unit_test(test_more_shards_than_chunks),
        cmocka_unit_test(test_flipped_byte_named),
        cmocka_unit_test(test_unknown_version_named),
        cmocka_unit_test(test_truncated_and_incomplete),
        cmocka_unit_test(test_other_run_named),
        cmocka_unit_test(test_killed_writer),
        cmocka_unit_test(test_writer_rejects_disorder),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    dfm_mpi_finalize();
    return rc;
}
