/* Chunk shard format: round trip, and every kind of damage is refused with the file named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pipeline/chunk/pack.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "schemas/chunk_shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];
static char path[128];
enum { L = 8, S = 32, N = 20 };

static void write_sample(void) {
    unlink(path);
    dfm_chunk_header h = {.chunk_len = L, .seq_len = S, .first_chunk = 40, .vocab_size = 1000, .tokenizer_hash = 77, .eos_id = 1, .pad_id = 1};
    dfm_chunk_writer *w;
    assert_int_equal(dfm_chunk_writer_open(path, &h, &w), 0);
    for (int c = 0; c < N; c++) {
        uint32_t t[L];
        for (int j = 0; j < L; j++) t[j] = (uint32_t)(c * 31 + j * 7) % 1000;
        dfm_chunk_meta m = {.doc_first = (uint64_t)c / 3, .doc_last = (uint64_t)c / 3, .n_valid = L,
                            .flags = c % 4 == 0 ? DFM_CHUNK_SEQ_START : 0};
        assert_int_equal(dfm_chunk_writer_add(w, &m, t), 0);
    }
    assert_int_equal(access(path, F_OK), -1); /* not visible until closed */
    assert_int_equal(dfm_chunk_writer_close(w), 0);
}

static int setup(void **st) {
    snprintf(dir, sizeof dir, "/tmp/dfm-test-chunk-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/chunks-00000.bin", dir);
    return 0;
}
static int teardown(void **st) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static void test_round_trip(void **st) {
    write_sample();
    dfm_chunk_shard *s;
    assert_int_equal(dfm_chunk_shard_open(path, &s), 0);
    assert_int_equal(s->hdr.n_chunks, N);
    assert_int_equal(s->hdr.first_chunk, 40);
    for (int c = 0; c < N; c++) {
        const uint32_t *t = dfm_chunk_shard_tokens(s, (uint64_t)c);
        for (int j = 0; j < L; j++) assert_int_equal(t[j], (uint32_t)(c * 31 + j * 7) % 1000);
        assert_int_equal(dfm_chunk_shard_meta(s, (uint64_t)c)->doc_first, (uint64_t)c / 3);
    }
    dfm_chunk_shard_close(s);
}

/* rewrite one byte of the file */
static void poke(long off, uint8_t v) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, off, SEEK_SET);
    fputc(v, f);
    fclose(f);
}

static void expect_error(int code, const char *needle) {
    dfm_chunk_shard *s = NULL;
    int rc = dfm_chunk_shard_open(path, &s);
    if (rc != code) fprintf(stderr, "expected %d got %d: %s\n", code, rc, dfm_last_error());
    assert_int_equal(rc, code);
    assert_null(s);
    assert_non_null(strstr(dfm_last_error(), path));
    if (needle) assert_non_null(strstr(dfm_last_error(), needle));
}

static void test_flipped_payload_byte(void **st) {
    write_sample();
    poke(128 + 24 + 5, 0xEE);
    expect_error(DFM_ECHECKSUM, "payload");
}

static void test_flipped_header_byte(void **st) {
    write_sample();
    poke(40, 0x01); /* inside first_chunk */
    expect_error(DFM_ECHECKSUM, "header");
}

static void test_bad_magic_and_version(void **st) {
    write_sample();
    poke(0, 'X');
    expect_error(DFM_EFORMAT, "magic");
    write_sample();
    /* version 2 with a valid header checksum: must be a version error, not a checksum one */
    FILE *f = fopen(path, "r+b");
    dfm_chunk_header h;
    assert_int_equal(fread(&h, sizeof h, 1, f), 1);
    h.version = 2;
    h.header_checksum = dfm_checksum64(&h, offsetof(dfm_chunk_header, header_checksum));
    fseek(f, 0, SEEK_SET);
    fwrite(&h, sizeof h, 1, f);
    fclose(f);
    expect_error(DFM_EVERSION, "version 2");
}

static void test_truncated(void **st) {
    write_sample();
    assert_int_equal(truncate(path, 128 + 152 * 5 + 3), 0);
    expect_error(DFM_ETRUNCATED, "truncated");
    assert_int_equal(truncate(path, 100), 0);
    expect_error(DFM_ETRUNCATED, "header");
    assert_int_equal(truncate(path, 0), 0);
    expect_error(DFM_ETRUNCATED, NULL);
}

static void test_token_out_of_vocab(void **st) {
    /* a writer given an id >= vocab produces a file the reader refuses, naming chunk and position */
    dfm_chunk_header h = {.chunk_len = L, .seq_len = S, .vocab_size = 10};
    dfm_chunk_writer *w;
    assert_int_equal(dfm_chunk_writer_open(path, &h, &w), 0);
    uint32_t t[L] = {1, 2, 3, 4, 5, 6, 7, 10};
    dfm_chunk_meta m = {.n_valid = L};
    assert_int_equal(dfm_chunk_writer_add(w, &m, t), 0);
    assert_int_equal(dfm_chunk_writer_close(w), 0);
    expect_error(DFM_EFORMAT, "token id 10");
}

static void test_missing_file(void **st) {
    dfm_chunk_shard *s;
    assert_int_equal(dfm_chunk_shard_open("/nonexistent/x.bin", &s), DFM_ENOTFOUND);
}

static void test_pack_arithmetic(void **st) {
    uint64_t b, e;
    dfm_pack_owned(0, 100, 32, &b, &e);
    assert_int_equal(b, 0);
    assert_int_equal(e, 128);
    dfm_pack_owned(100, 20, 32, &b, &e); /* [100,120): no sequence starts here */
    assert_int_equal(b, e);
    dfm_pack_owned(100, 60, 32, &b, &e); /* starts at 128 */
    assert_int_equal(b, 128);
    assert_int_equal(e, 160);
    assert_int_equal(dfm_pack_head(100, 60, 32), 28);
    assert_int_equal(dfm_pack_head(100, 10, 32), 10);
    assert_int_equal(dfm_pack_head(96, 10, 32), 0);
    uint64_t off[] = {0, 100, 110, 130}, n[] = {100, 10, 20, 50};
    assert_int_equal(dfm_pack_owner(off, n, 4, 32, 3), 0);  /* position 96 */
    assert_int_equal(dfm_pack_owner(off, n, 4, 32, 4), 2);  /* position 128 lies in [110,130) */
    assert_int_equal(dfm_pack_doc_pad(33, 32), 31);
    assert_int_equal(dfm_pack_doc_pad(64, 32), 0);
}

int main(void) {
    const struct CMUnitTest t[] = {
        cmocka_unit_test(test_round_trip),        cmocka_unit_test(test_flipped_payload_byte),
        cmocka_unit_test(test_flipped_header_byte), cmocka_unit_test(test_bad_magic_and_version),
        cmocka_unit_test(test_truncated),         cmocka_unit_test(test_token_out_of_vocab),
        cmocka_unit_test(test_missing_file),      cmocka_unit_test(test_pack_arithmetic),
    };
    return cmocka_run_group_tests(t, setup, teardown);
}
