/* Unit tests of schemas/safetensors: round trip, conversions, and every rejection the reader promises. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "schemas/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dfm-test-st-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}
static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

/* Write a raw file: 8-byte size (hdr_size, or strlen(json) when ~0), json, then data_bytes of data. */
static char *write_raw(const char *name, uint64_t hdr_size, const char *json, size_t data_bytes) {
    char *p = dfm_path_join(tmpdir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    uint64_t n = hdr_size == ~0ull ? strlen(json) : hdr_size;
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(n >> (8 * i));
    fwrite(b, 1, 8, f);
    fwrite(json, 1, strlen(json), f);
    for (size_t i = 0; i < data_bytes; i++) fputc((int)(i & 0x7f), f);
    fclose(f);
    return p;
}

static int open_rc(const char *path, const char *must_contain) {
    dfm_safetensors *st = (dfm_safetensors *)1;
    int rc = dfm_safetensors_open(path, &st);
    assert_null(st);
    if (must_contain) {
        if (!strstr(dfm_last_error(), must_contain)) fprintf(stderr, "message: %s\n", dfm_last_error());
        assert_non_null(strstr(dfm_last_error(), must_contain));
    }
    assert_non_null(strstr(dfm_last_error(), path));
    return rc;
}

static void test_round_trip(void **state) {
    float a[6] = {1.5f, -2.25f, 0.0f, 3.0e-5f, 65504.0f, -1e-8f};
    uint16_t h[4], bf[4];
    float hv[4] = {0.333333f, -7.0f, 1e-6f, 1000.5f};
    for (int i = 0; i < 4; i++) {
        h[i] = dfm_f32_to_f16(hv[i]);
        bf[i] = dfm_f32_to_bf16(hv[i]);
    }
    int64_t ids[3] = {7, -1, 1ll << 40};
    int64_t sa[2] = {2, 3}, sh[1] = {4}, si[1] = {3};
    dfm_st_write_tensor t[4] = {
        {"layer.a", DFM_ST_F32, 2, sa, a},
        {"half", DFM_ST_F16, 1, sh, h},
        {"brain", DFM_ST_BF16, 1, sh, bf},
        {"ids", DFM_ST_I64, 1, si, ids},
    };
    json_t *meta = json_pack("{s:s}", "format", "pt");
    char *p = dfm_path_join(tmpdir, "rt.safetensors");
    assert_int_equal(dfm_safetensors_write(p, t, 4, meta), DFM_OK);
    json_decref(meta);

    dfm_safetensors *st;
    assert_int_equal(dfm_safetensors_open(p, &st), DFM_OK);
    assert_int_equal(st->n_tensors, 4);
    assert_int_equal((8 + st->header_bytes) % 8, 0);
    assert_string_equal(dfm_safetensors_meta(st, "format"), "pt");
    assert_null(dfm_safetensors_meta(st, "nope"));
    const dfm_st_tensor *x;
    assert_int_equal(dfm_safetensors_get(st, "layer.a", 2, (int64_t[]){2, 3}, &x), DFM_OK);
    float out[6];
    assert_int_equal(dfm_st_to_f32(x, out), DFM_OK);
    assert_memory_equal(out, a, sizeof a);
    assert_int_equal(dfm_safetensors_get(st, "layer.a", 2, (int64_t[]){-1, 3}, &x), DFM_OK);
    assert_int_equal(dfm_safetensors_get(st, "half", 1, (int64_t[]){4}, &x), DFM_OK);
    assert_int_equal(dfm_st_to_f32(x, out), DFM_OK);
    for (int i = 0; i < 4; i++) assert_true(fabsf(out[i] - hv[i]) <= 1e-3f * fabsf(hv[i]) + 1e-7f);
    assert_int_equal(dfm_safetensors_get(st, "brain", 1, (int64_t[]){4}, &x), DFM_OK);
    assert_int_equal(dfm_st_to_f32(x, out), DFM_OK);
    for (int i = 0; i < 4; i++) assert_true(fabsf(out[i] - hv[i]) <= 8e-3f * fabsf(hv[i]));
    assert_int_equal(dfm_safetensors_get(st, "ids", 1, (int64_t[]){3}, &x), DFM_OK);
    assert_memory_equal(x->data, ids, sizeof ids);
    assert_int_equal(dfm_st_to_f32(x, out), DFM_EUNSUPPORTED);
    assert_non_null(strstr(dfm_last_error(), "I64"));

    /* shape mismatch names file, tensor, expected and found */
    assert_int_equal(dfm_safetensors_get(st, "layer.a", 2, (int64_t[]){3, 2}, &x), DFM_EMISMATCH);
    assert_null(x);
    assert_non_null(strstr(dfm_last_error(), p));
    assert_non_null(strstr(dfm_last_error(), "layer.a"));
    assert_non_null(strstr(dfm_last_error(), "[2, 3]"));
    assert_non_null(strstr(dfm_last_error(), "[3, 2]"));
    assert_int_equal(dfm_safetensors_get(st, "layer.a", 1, (int64_t[]){6}, &x), DFM_EMISMATCH);
    assert_int_equal(dfm_safetensors_get(st, "missing", 1, (int64_t[]){6}, &x), DFM_ENOTFOUND);
    assert_non_null(strstr(dfm_last_error(), "missing"));
    dfm_safetensors_close(st);
    dfm_safetensors_close(NULL);
    free(p);
}

static void test_half_conversions(void **state) {
    /* exact values, rounding, specials */
    assert_int_equal(dfm_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(dfm_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(dfm_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(dfm_f32_to_f16(1e6f), 0x7c00);
    assert_int_equal(dfm_f32_to_f16(5.9604645e-8f), 0x0001);
    assert_int_equal(dfm_f32_to_f16(0.0f), 0);
    assert_true(dfm_f16_to_f32(0x0001) == 5.9604645e-8f);
    assert_true(isnan(dfm_f16_to_f32(dfm_f32_to_f16(NAN))));
    assert_true(isinf(dfm_f16_to_f32(0x7c00)));
    /* 1 + 2^-11 is a tie between 1 and 1+2^-10: round to even (1) */
    assert_int_equal(dfm_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);
    assert_int_equal(dfm_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
    /* every finite half round-trips */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        assert_int_equal(dfm_f32_to_f16(dfm_f16_to_f32((uint16_t)h)), h);
    }
    assert_int_equal(dfm_f32_to_bf16(1.0f), 0x3f80);
    assert_true(dfm_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(isnan(dfm_bf16_to_f32(dfm_f32_to_bf16(NAN))));
    assert_int_equal(dfm_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80); /* tie to even */
}

static void test_reject_truncated(void **state) {
    char *p = write_raw("short.safetensors", 0, "", 0);
    /* write only 5 bytes */
    FILE *f = fopen(p, "wb");
    fwrite("\x10\0\0\0\0", 1, 5, f);
    fclose(f);
    assert_int_equal(open_rc(p, "8-byte"), DFM_ETRUNCATED);
    free(p);
    /* header size beyond the file */
    p = write_raw("hdr.safetensors", 4000, "{\"a\":{}}", 0);
    assert_int_equal(open_rc(p, "truncated"), DFM_ETRUNCATED);
    free(p);
    /* data cut short: last end offset beyond the buffer */
    p = write_raw("cut.safetensors", ~0ull, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12);
    assert_int_equal(open_rc(p, "\"w\""), DFM_EFORMAT);
    assert_non_null(strstr(dfm_last_error(), "beyond"));
    free(p);
    /* missing file */
    p = dfm_path_join(tmpdir, "nope.safetensors");
    assert_int_equal(open_rc(p, "cannot open"), DFM_ENOTFOUND);
    free(p);
}

static void test_reject_bad_offsets(void **state) {
    char *p;
    /* overlapping */
    p = write_raw("ov.safetensors", ~0ull,
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                  12);
    assert_int_equal(open_rc(p, "overlaps"), DFM_EFORMAT);
    free(p);
    /* gap */
    p = write_raw("gap.safetensors", ~0ull,
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                  12);
    assert_int_equal(open_rc(p, "gap"), DFM_EFORMAT);
    free(p);
    /* trailing bytes after the last tensor */
    p = write_raw("tail.safetensors", ~0ull, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 9);
    assert_int_equal(open_rc(p, "buffer has 9"), DFM_EFORMAT);
    free(p);
    /* size disagrees with shape x dtype */
    p = write_raw("sz.safetensors", ~0ull, "{\"a\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,4]}}", 4);
    assert_int_equal(open_rc(p, "needs 6"), DFM_EFORMAT);
    free(p);
    /* a huge shape whose byte count wraps around 2^64 to the 0 bytes it claims */
    p = write_raw("wrap.safetensors", ~0ull,
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],\"data_offsets\":[0,0]}}", 0);
    assert_int_equal(open_rc(p, "needs"), DFM_EFORMAT);
    free(p);
    p = write_raw("wrap8.safetensors", ~0ull,
                  "{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0);
    assert_int_equal(open_rc(p, "needs"), DFM_EFORMAT);
    free(p);
    /* begin > end */
    p = write_raw("be.safetensors", ~0ull, "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4);
    assert_int_equal(open_rc(p, "begin <= end"), DFM_EFORMAT);
    free(p);
}

static void test_reject_bad_header(void **state) {
    char *p;
    p = write_raw("json.safetensors", ~0ull, "{\"a\":{\"dtype\":\"F32\",", 0);
    assert_int_equal(open_rc(p, "JSON is invalid"), DFM_EFORMAT);
    free(p);
    p = write_raw("arr.safetensors", ~0ull, "[1,2]", 0);
    assert_int_equal(open_rc(p, "'{'"), DFM_EFORMAT);
    free(p);
    p = write_raw("big.safetensors", 1ull << 40, "{}", 0);
    assert_int_equal(open_rc(p, "bound"), DFM_ERANGE);
    free(p);
    p = write_raw("dt.safetensors", ~0ull, "{\"a\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,16]}}", 16);
    assert_int_equal(open_rc(p, "F128"), DFM_EFORMAT);
    free(p);
    p = write_raw("shape.safetensors", ~0ull, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4);
    assert_int_equal(open_rc(p, "shape[0]"), DFM_EFORMAT);
    free(p);
    p = write_raw("meta.safetensors", ~0ull, "{\"__metadata__\":{\"x\":1}}", 0);
    assert_int_equal(open_rc(p, "__metadata__"), DFM_EFORMAT);
    free(p);
    p = write_raw("dup.safetensors", ~0ull,
                  "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                  2);
    assert_int_equal(open_rc(p, "JSON"), DFM_EFORMAT);
    free(p);
    /* an empty file set with metadata only is valid */
    p = write_raw("empty.safetensors", ~0ull, "{\"__metadata__\":{\"x\":\"y\"}}", 0);
    dfm_safetensors *st;
    assert_int_equal(dfm_safetensors_open(p, &st), DFM_OK);
    assert_int_equal(st->n_tensors, 0);
    assert_null(dfm_safetensors_find(st, "a"));
    dfm_safetensors_close(st);
    free(p);
}

static void test_writer_rejects(void **state) {
    float a = 1;
    int64_t s1[1] = {1};
    dfm_st_write_tensor t[2] = {{"x", DFM_ST_F32, 1, s1, &a}, {"x", DFM_ST_F32, 1, s1, &a}};
    char *p = dfm_path_join(tmpdir, "w.safetensors");
    assert_int_equal(dfm_safetensors_write(p, t, 2, NULL), DFM_EARG);
    assert_non_null(strstr(dfm_last_error(), "duplicate"));
    assert_int_equal(dfm_path_exists(p), 0);
    t[1].name = "__metadata__";
    assert_int_equal(dfm_safetensors_write(p, t, 2, NULL), DFM_EARG);
    char *bad = dfm_path_join(tmpdir, "no/such/dir/w.safetensors");
    assert_int_equal(dfm_safetensors_write(bad, t, 1, NULL), DFM_EIO);
    free(bad);
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),        cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_reject_truncated),  cmocka_unit_test(test_reject_bad_offsets),
        cmocka_unit_test(test_reject_bad_header), cmocka_unit_test(test_writer_rejects),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
