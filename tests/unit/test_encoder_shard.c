/* Unit tests of schemas/embedding_shard: round trip in each dtype, every validation the reader
 * promises, and the run-level set (manifest outputs tiling the id space, rows across blocks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"
#include "schemas/embedding_shard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dfm-test-emb-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}
static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

#define DIM 5

static void fill(float *v, uint64_t first, uint64_t n) {
    for (uint64_t r = 0; r < n; r++)
        for (int i = 0; i < DIM; i++) v[r * DIM + i] = (float)((first + r) * 0.25 + i * 0.01);
}

static char *write_block(const char *rel, uint32_t dtype, uint64_t first, uint64_t n) {
    char *p = dfm_path_join(tmpdir, rel);
    char *slash = strrchr(p, '/');
    *slash = 0;
    assert_int_equal(dfm_mkdir_p(p), DFM_OK);
    *slash = '/';
    dfm_emb_header h = {.dim = DIM, .dtype = dtype, .first_chunk = first, .model_hash = 0xabc, .tokenizer_hash = 0xdef};
    dfm_emb_writer *w;
    unlink(p);
    assert_int_equal(dfm_emb_writer_open(p, &h, &w), DFM_OK);
    assert_int_equal(dfm_path_exists(p), 0); /* nothing under the final name yet */
    float *v = malloc((n + 1) * DIM * sizeof(float));
    fill(v, first, n);
    /* in two pieces */
    assert_int_equal(dfm_emb_writer_add(w, v, n / 2), DFM_OK);
    assert_int_equal(dfm_emb_writer_add(w, v + (n / 2) * DIM, n - n / 2), DFM_OK);
    assert_int_equal(dfm_emb_writer_close(w), DFM_OK);
    free(v);
    return p;
}

static void test_round_trip(void **state) {
    for (uint32_t dt = 0; dt < 3; dt++) {
        char name[64];
        snprintf(name, sizeof name, "rt%u.bin", dt);
        char *p = write_block(name, dt, 1000, 7);
        dfm_emb_shard *s;
        assert_int_equal(dfm_emb_shard_open(p, &s), DFM_OK);
        assert_int_equal(s->hdr.n_rows, 7);
        assert_int_equal(s->hdr.first_chunk, 1000);
        assert_int_equal(s->hdr.dim, DIM);
        assert_int_equal(s->hdr.model_hash, 0xabc);
        float got[7 * DIM], want[7 * DIM];
        fill(want, 1000, 7);
        assert_int_equal(dfm_emb_shard_rows_f32(s, 0, 7, got), DFM_OK);
        double tol = dt == 0 ? 0 : dt == 1 ? 1e-3 : 1e-2;
        for (int i = 0; i < 7 * DIM; i++) assert_true(fabs(got[i] - want[i]) <= tol * fabs(want[i]) + 1e-6);
        assert_int_equal(dfm_emb_shard_rows_f32(s, 5, 3, got), DFM_ERANGE);
        dfm_emb_shard_close(s);
        free(p);
    }
    assert_string_equal(dfm_emb_dtype_name(DFM_EMB_BF16), "bf16");
    assert_int_equal(dfm_emb_dtype_parse("float16"), DFM_EMB_F16);
    assert_int_equal(dfm_emb_dtype_parse("int8"), -1);
    char *bn = dfm_emb_block_name(42);
    assert_string_equal(bn, "encode/emb-000042.bin");
    free(bn);
    dfm_emb_writer_abort(NULL);
    dfm_emb_shard_close(NULL);
}

static void corrupt(const char *p, long off, const void *bytes, size_t n) {
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    fseek(f, off, SEEK_SET);
    fwrite(bytes, 1, n, f);
    fclose(f);
}

static void expect_open(const char *p, int code, const char *needle) {
    dfm_emb_shard *s = (dfm_emb_shard *)1;
    int rc = dfm_emb_shard_open(p, &s);
    if (rc != code || !strstr(dfm_last_error(), needle)) fprintf(stderr, "rc %d: %s\n", rc, dfm_last_error());
    assert_int_equal(rc, code);
    assert_null(s);
    assert_non_null(strstr(dfm_last_error(), needle));
    assert_non_null(strstr(dfm_last_error(), p));
}

static void test_rejects(void **state) {
    char *p = write_block("bad.bin", 0, 0, 4);
    uint64_t sz;
    assert_int_equal(dfm_file_size(p, &sz), DFM_OK);
    /* payload flipped */
    corrupt(p, 128 + 3, "\x55", 1);
    expect_open(p, DFM_ECHECKSUM, "payload checksum");
    dfm_emb_shard *s;
    assert_int_equal(dfm_emb_shard_open_nocheck(p, &s), DFM_OK); /* cheap open skips it */
    dfm_emb_shard_close(s);
    free(p);
    p = write_block("bad.bin", 0, 0, 4);
    corrupt(p, 40, "\x01", 1); /* n_rows field changed: header checksum */
    expect_open(p, DFM_ECHECKSUM, "header checksum");
    p = (free(p), write_block("bad.bin", 0, 0, 4));
    corrupt(p, 0, "XXXX", 4);
    expect_open(p, DFM_EFORMAT, "magic");
    p = (free(p), write_block("bad.bin", 0, 0, 4));
    assert_int_equal(truncate(p, (off_t)sz - 4), 0);
    expect_open(p, DFM_ETRUNCATED, "truncated");
    assert_int_equal(truncate(p, 100), 0);
    expect_open(p, DFM_ETRUNCATED, "shorter than the 128-byte header");
    p = (free(p), write_block("bad.bin", 0, 0, 4));
    FILE *f = fopen(p, "ab");
    fputc(0, f);
    fclose(f);
    expect_open(p, DFM_EFORMAT, "trailing");
    free(p);
    p = dfm_path_join(tmpdir, "none.bin");
    expect_open(p, DFM_ENOTFOUND, "dfm encode");
    free(p);
    /* a version from the future, with a valid header checksum */
    p = write_block("ver.bin", 0, 0, 2);
    dfm_emb_header h;
    f = fopen(p, "r+b");
    assert_int_equal(fread(&h, sizeof h, 1, f), 1);
    h.version = 9;
    h.header_checksum = dfm_checksum64(&h, 120);
    fseek(f, 0, SEEK_SET);
    fwrite(&h, sizeof h, 1, f);
    fclose(f);
    expect_open(p, DFM_EVERSION, "version 9");
    free(p);
    /* writer refusals */
    dfm_emb_writer *w;
    dfm_emb_header bad = {.dim = 0};
    assert_int_equal(dfm_emb_writer_open("/tmp/x.bin", &bad, &w), DFM_EARG);
}

static void write_manifest(int n_blocks, uint64_t block, uint64_t n, long long chunk_count, int skip_block) {
    json_t *m;
    assert_int_equal(dfm_manifest_load(tmpdir, 1, &m), DFM_OK);
    if (chunk_count >= 0)
        dfm_manifest_set_stage(m, "chunk", json_pack("{s:s, s:{s:I}}", "state", "complete", "counts", "chunks", (json_int_t)chunk_count));
    json_t *outs = json_array();
    for (int b = 0; b < n_blocks; b++) {
        if (b == skip_block) continue;
        char *name = dfm_emb_block_name(b);
        uint64_t first = b * block, rows = n - first < block ? n - first : block;
        json_array_append_new(outs, json_pack("{s:s, s:I, s:I}", "file", name, "first_chunk", (json_int_t)first, "n_rows", (json_int_t)rows));
        free(name);
    }
    dfm_manifest_set_stage(m, "encode", json_pack("{s:s, s:o, s:I, s:i, s:s}", "state", "complete", "outputs", outs,
                                                  "block_chunks", (json_int_t)block, "dim", DIM, "dtype", "fp16"));
    assert_int_equal(dfm_manifest_save(tmpdir, m), DFM_OK);
    json_decref(m);
}

static void test_set(void **state) {
    const uint64_t B = 10, N = 34;
    for (uint64_t b = 0; b * B < N; b++) {
        char *name = dfm_emb_block_name(b);
        free(write_block(name, DFM_EMB_F16, b * B, N - b * B < B ? N - b * B : B));
        free(name);
    }
    write_manifest(4, B, N, (long long)N, -1);
    dfm_emb_set *set;
    int rc = dfm_emb_set_open(tmpdir, &set);
    if (rc) fprintf(stderr, "%s\n", dfm_last_error());
    assert_int_equal(rc, DFM_OK);
    assert_int_equal(set->n_rows, N);
    assert_int_equal(set->n_shards, 4);
    assert_int_equal(set->dim, DIM);
    float got[20 * DIM], want[20 * DIM];
    assert_int_equal(dfm_emb_set_rows_f32(set, 7, 20, got), DFM_OK); /* spans three blocks */
    fill(want, 7, 20);
    for (int i = 0; i < 20 * DIM; i++) assert_true(fabs(got[i] - want[i]) <= 1e-3 * fabs(want[i]) + 1e-6);
    assert_int_equal(dfm_emb_set_rows_f32(set, 30, 5, got), DFM_ERANGE);
    assert_non_null(dfm_emb_set_row(set, 33));
    assert_null(dfm_emb_set_row(set, 34));
    dfm_emb_set_close(set);
    /* a missing block in the list: the tiling check names the file after the gap */
    write_manifest(4, B, N, (long long)N, 1);
    assert_int_equal(dfm_emb_set_open(tmpdir, &set), DFM_EFORMAT);
    assert_non_null(strstr(dfm_last_error(), "emb-000002.bin"));
    /* the chunk stage says more chunks than the blocks hold */
    write_manifest(4, B, N, (long long)N + 1, -1);
    assert_int_equal(dfm_emb_set_open(tmpdir, &set), DFM_EMISMATCH);
    assert_non_null(strstr(dfm_last_error(), "35 chunks"));
    /* manifest dtype disagrees with the files */
    write_manifest(4, B, N, (long long)N, -1);
    json_t *m;
    dfm_manifest_load(tmpdir, 0, &m);
    json_object_set_new(dfm_manifest_stage(m, "encode"), "dtype", json_string("fp32"));
    dfm_manifest_save(tmpdir, m);
    json_decref(m);
    assert_int_equal(dfm_emb_set_open(tmpdir, &set), DFM_EMISMATCH);
    /* stage not complete */
    dfm_manifest_load(tmpdir, 0, &m);
    json_object_set_new(dfm_manifest_stage(m, "encode"), "state", json_string("running"));
    dfm_manifest_save(tmpdir, m);
    json_decref(m);
    assert_int_equal(dfm_emb_set_open(tmpdir, &set), DFM_ESTATE);
}

/* Nothing non-finite is stored (NaN, Inf, or beyond fp16's range in an fp16 block), and a block that holds
 * such a value anyway (written by another tool) is refused when its rows are read. */
static void test_finite_only(void **state) {
    for (uint32_t dt = 0; dt < 3; dt++) {
        const float bad[] = {NAN, INFINITY, -INFINITY, 1e5f};
        for (int b = 0; b < 4; b++) {
            if (b == 3 && dt != DFM_EMB_F16) continue; /* 1e5 is finite in fp32 and bf16 */
            char *p = dfm_path_join(tmpdir, "nan.bin");
            dfm_emb_header h = {.dim = DIM, .dtype = dt, .first_chunk = 64};
            dfm_emb_writer *w;
            unlink(p);
            assert_int_equal(dfm_emb_writer_open(p, &h, &w), DFM_OK);
            float v[3 * DIM];
            fill(v, 64, 3);
            assert_int_equal(dfm_emb_writer_add(w, v, 1), DFM_OK);
            v[DIM + 2] = bad[b]; /* chunk 65 (the first row of this call is chunk 65) */
            assert_int_equal(dfm_emb_writer_add(w, v + DIM, 2), DFM_EFORMAT);
            assert_non_null(strstr(dfm_last_error(), "chunk 65"));
            assert_non_null(strstr(dfm_last_error(), "non-finite"));
            dfm_emb_writer_abort(w);
            assert_int_equal(dfm_path_exists(p), 0);
            free(p);
        }
    }
    /* a stored NaN: plant it in an fp32 block's payload and read with the checksum bypassed */
    char *p = write_block("plant.bin", DFM_EMB_F32, 10, 4);
    float nan = NAN;
    corrupt(p, DFM_EMB_HEADER_BYTES + (2 * DIM + 1) * 4, &nan, 4);
    dfm_emb_shard *s;
    assert_int_equal(dfm_emb_shard_open_nocheck(p, &s), DFM_OK);
    float got[4 * DIM];
    assert_int_equal(dfm_emb_shard_rows_f32(s, 0, 2, got), DFM_OK);
    assert_int_equal(dfm_emb_shard_rows_f32(s, 0, 4, got), DFM_EFORMAT);
    assert_non_null(strstr(dfm_last_error(), "chunk 12"));
    dfm_emb_shard_close(s);
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_set),
        cmocka_unit_test(test_finite_only),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
