/* Unit tests of the target record format: conversions, shuffle, keys, encode/decode, corruption. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "schemas/target_record.h"

#include <xxhash.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x1234567887654321ULL;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float next_float(void) { return (float)((double)(next_u64() >> 40) / (double)(1u << 24) * 2.0 - 1.0); }

/* fp16: every finite half survives half -> float -> half; float -> half agrees with the compiler's
 * _Float16 conversion (round to nearest even) on random, tie and edge values. */
static void test_fp16_conversion(void **state) {
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) { /* NaN stays NaN */
            assert_true(isnan(dfm_f16_to_f32((uint16_t)h)));
            continue;
        }
        float f = dfm_f16_to_f32((uint16_t)h);
        assert_int_equal(dfm_f32_to_f16(f), h);
        _Float16 ref = (_Float16)f;
        assert_true((float)ref == f || (isnan(f) && isnan((float)ref)));
    }
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)next_u64();
        float f;
        memcpy(&f, &bits, 4);
        if (isnan(f)) continue;
        _Float16 ref = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &ref, 2);
        assert_int_equal(dfm_f32_to_f16(f), rb);
    }
    /* exact ties: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 -> even (1.0) */
    assert_int_equal(dfm_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(dfm_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(dfm_f32_to_f16(65520.0f), 0x7c00); /* rounds to infinity */
    assert_int_equal(dfm_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(dfm_f32_to_f16(0x1p-25f), 0x0000);   /* tie between 0 and the smallest subnormal: even */
    assert_int_equal(dfm_f32_to_f16(0x1.8p-24f), 0x0002); /* 1.5 ulp -> 2 (even) */
    assert_int_equal(dfm_f32_to_f16(-0.0f), 0x8000);
}

/* bf16 against a reference written differently: nearest of the two truncation candidates in double
 * arithmetic, ties to the even one. */
static uint16_t bf16_ref(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t lo = (uint16_t)(x >> 16), hi = (uint16_t)(lo + 1);
    float flo = dfm_bf16_to_f32(lo), fhi = dfm_bf16_to_f32(hi);
    if ((x & 0xffff) == 0) return lo;
    double dl = fabs((double)f - (double)flo), dh = fabs((double)f - (double)fhi);
    if (isinf(fhi) && !isinf(f)) dh = fabs((double)f - copysign(ldexp(1.0, 128), (double)f)); /* rounds like 2^128 */
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return (lo & 1) ? hi : lo;
}

static void test_bf16_conversion(void **state) {
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)next_u64();
        float f;
        memcpy(&f, &bits, 4);
        if (isnan(f) || isinf(f)) continue;
        assert_int_equal(dfm_f32_to_bf16(f), bf16_ref(f));
    }
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dfm_bf16_to_f32((uint16_t)h);
        if (isnan(f)) {
            assert_true(isnan(dfm_bf16_to_f32(dfm_f32_to_bf16(f))));
            continue;
        }
        assert_int_equal(dfm_f32_to_bf16(f), h);
    }
    assert_int_equal(dfm_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);     /* tie -> even */
    assert_int_equal(dfm_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie -> even (up) */
}

/* The array conversions (F16C where the CPU has it) equal the scalar ones bit for bit, NaNs included. */
static void test_array_conversions_match_scalar(void **state) {
    uint16_t *h = malloc(2 * 65536), *h2 = malloc(2 * 65536);
    float *f = malloc(4 * 65536), *g = malloc(4 * 65536);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    dfm_convert_to_f32(DFM_DTYPE_FP16, h, 65536, f);
    for (uint32_t i = 0; i < 65536; i++) {
        float want = dfm_f16_to_f32((uint16_t)i);
        uint32_t a, b;
        memcpy(&a, &f[i], 4);
        memcpy(&b, &want, 4);
        if (a != b) fail_msg("half 0x%04x: array %08x, scalar %08x", i, a, b);
    }
    for (uint32_t i = 0; i < 65536; i++) {
        uint32_t bits = i < 4096 ? 0x7f800000u + i * 997u : (uint32_t)next_u64(); /* NaNs and infinities, then anything */
        memcpy(&g[i], &bits, 4);
    }
    dfm_convert_from_f32(DFM_DTYPE_FP16, g, 65535, h2); /* odd length: the scalar tail too */
    for (uint32_t i = 0; i < 65535; i++) {
        uint32_t bits;
        memcpy(&bits, &g[i], 4);
        if (h2[i] != dfm_f32_to_f16(g[i])) fail_msg("float %08x: array 0x%04x, scalar 0x%04x", bits, h2[i], dfm_f32_to_f16(g[i]));
    }
    free(h);
    free(h2);
    free(f);
    free(g);
}

static void test_shuffle_and_keys(void **state) {
    uint8_t in[60], sh[60], back[60];
    for (int i = 0; i < 60; i++) in[i] = (uint8_t)(i * 7 + 3);
    dfm_byte_shuffle(in, 15, 4, sh);
    assert_int_equal(sh[0], in[0]);
    assert_int_equal(sh[1], in[4]);
    assert_int_equal(sh[15], in[1]);
    dfm_byte_unshuffle(sh, 15, 4, back);
    assert_memory_equal(in, back, 60);
    /* big-endian keys sort as the ids do */
    uint64_t ids[] = {0, 1, 255, 256, 65535, 65536, 1ULL << 40, UINT64_MAX - 1};
    for (size_t i = 0; i + 1 < sizeof ids / sizeof ids[0]; i++) {
        uint8_t a[8], b[8];
        dfm_trec_key(ids[i], a);
        dfm_trec_key(ids[i + 1], b);
        assert_true(memcmp(a, b, 8) < 0);
        uint64_t back_id;
        assert_int_equal(dfm_trec_key_id(b, 8, &back_id), DFM_OK);
        assert_true(back_id == ids[i + 1]);
    }
    uint64_t x;
    assert_int_equal(dfm_trec_key_id("abc", 3, &x), DFM_EFORMAT);
}

typedef struct {
    uint32_t k, d;
    int64_t ids[64], ids_out[64];
    float scores[64], scores_out[64];
    float *emb, *emb_out;
    uint8_t *rec;
    size_t cap;
} fixture;

static void fixture_init(fixture *f, uint32_t k, uint32_t d, int dtype, int ids_only) {
    memset(f, 0, sizeof *f);
    f->k = k;
    f->d = d;
    f->emb = malloc(sizeof(float) * k * d);
    f->emb_out = malloc(sizeof(float) * k * d);
    for (uint32_t i = 0; i < k * d; i++) f->emb[i] = next_float() * 0.2f;
    for (uint32_t i = 0; i < k; i++) {
        f->ids[i] = (int64_t)(next_u64() % 100000);
        f->scores[i] = 0.9f - 0.01f * (float)i;
    }
    f->cap = dfm_trec_max_bytes(k, d, dtype, ids_only);
    f->rec = malloc(f->cap);
}

static void fixture_free(fixture *f) {
    free(f->emb);
    free(f->emb_out);
    free(f->rec);
}

static float through(int dtype, float v) {
    if (dtype == DFM_DTYPE_FP16) return dfm_f16_to_f32(dfm_f32_to_f16(v));
    if (dtype == DFM_DTYPE_BF16) return dfm_bf16_to_f32(dfm_f32_to_bf16(v));
    return v;
}

static void roundtrip(int dtype, int ids_only, int shuffle) {
    const uint32_t k = 16, d = 96;
    fixture f;
    fixture_init(&f, k, d, dtype, ids_only);
    dfm_trec_params p = {.k = k, .d = d, .dtype = dtype, .ids_only = ids_only, .shuffle = shuffle, .level = 3};
    dfm_trec_codec *c;
    assert_int_equal(dfm_trec_codec_create(&p, &c), DFM_OK);
    /* slots 13..15 padded; a real id and a score in a padded slot must be normalised away */
    uint64_t mask = (1ULL << 13) - 1;
    f.ids[14] = 77;
    dfm_trec in = {.chunk_id = 4242, .flags = 0, .mask = mask, .ids = f.ids, .scores = f.scores, .emb = ids_only ? NULL : f.emb};
    size_t n = 0;
    assert_int_equal(dfm_trec_encode(c, &in, f.rec, f.cap, &n), DFM_OK);
    dfm_trec_header h;
    assert_int_equal(dfm_trec_check_header(f.rec, n, &h), DFM_OK);
    assert_int_equal(h.payload_bytes, dfm_trec_payload_bytes(k, d, dtype, ids_only));
    assert_int_equal(!!(h.flags & DFM_TREC_F_SHUFFLE), shuffle && !ids_only);
    assert_int_equal(!!(h.flags & DFM_TREC_F_IDS_ONLY), ids_only);
    for (uint32_t i = 0; i < k * d; i++) f.emb_out[i] = 12345.0f;
    dfm_trec out = {.ids = f.ids_out, .scores = f.scores_out, .emb = f.emb_out};
    assert_int_equal(dfm_trec_decode(c, f.rec, n, &out, NULL, NULL), DFM_OK);
    assert_true(out.chunk_id == 4242);
    assert_true(out.mask == mask);
    for (uint32_t i = 0; i < k; i++) {
        int valid = i < 13;
        assert_true(out.ids[i] == (valid ? f.ids[i] : -1));
        assert_true(out.scores[i] == (valid ? f.scores[i] : 0.0f));
        for (uint32_t j = 0; j < d && !ids_only; j++) {
            float want = valid ? through(dtype, f.emb[i * d + j]) : 0.0f;
            assert_true(memcmp(&out.emb[i * d + j], &want, 4) == 0);
        }
    }
    if (ids_only) assert_true(f.emb_out[0] == 12345.0f); /* left for the reader's table */

    /* first chunk of a sequence: SEQ_START forces an all-masked record */
    dfm_trec first = in;
    first.flags = DFM_TREC_F_SEQ_START;
    assert_int_equal(dfm_trec_encode(c, &first, f.rec, f.cap, &n), DFM_OK);
    assert_int_equal(dfm_trec_decode(c, f.rec, n, &out, NULL, NULL), DFM_OK);
    assert_true(out.mask == 0);
    assert_true((out.flags & (DFM_TREC_F_SEQ_START | DFM_TREC_F_EMPTY)) == (DFM_TREC_F_SEQ_START | DFM_TREC_F_EMPTY));
    for (uint32_t i = 0; i < k; i++) assert_true(out.ids[i] == -1 && out.scores[i] == 0.0f);
    for (uint32_t i = 0; i < k * d && !ids_only; i++) assert_true(out.emb[i] == 0.0f);
    dfm_trec_codec_free(c);
    fixture_free(&f);
}

static void test_roundtrip_all(void **state) {
    int dtypes[] = {DFM_DTYPE_FP32, DFM_DTYPE_FP16, DFM_DTYPE_BF16};
    for (int i = 0; i < 3; i++)
        for (int ids_only = 0; ids_only < 2; ids_only++)
            for (int sh = 0; sh < 2; sh++) roundtrip(dtypes[i], ids_only, sh);
}

static void test_encode_rejects(void **state) {
    fixture f;
    fixture_init(&f, 4, 8, DFM_DTYPE_FP16, 0);
    dfm_trec_params p = {.k = 4, .d = 8, .dtype = DFM_DTYPE_FP16, .shuffle = 1};
    dfm_trec_codec *c;
    assert_int_equal(dfm_trec_codec_create(&p, &c), DFM_OK);
    size_t n;
    dfm_trec in = {.chunk_id = 1, .mask = 0x10, .ids = f.ids, .scores = f.scores, .emb = f.emb}; /* bit 4 >= K */
    assert_int_equal(dfm_trec_encode(c, &in, f.rec, f.cap, &n), DFM_EARG);
    in.mask = 0x1;
    f.ids[0] = -1; /* valid slot with id -1 */
    assert_int_equal(dfm_trec_encode(c, &in, f.rec, f.cap, &n), DFM_EARG);
    dfm_trec_params bad = {.k = 65, .d = 8, .dtype = DFM_DTYPE_FP16};
    dfm_trec_codec *c2 = NULL;
    assert_int_equal(dfm_trec_codec_create(&bad, &c2), DFM_EARG);
    bad.k = 4;
    bad.dtype = 9;
    assert_int_equal(dfm_trec_codec_create(&bad, &c2), DFM_EARG);
    dfm_trec_codec_free(c);
    dfm_trec_codec_free(NULL);
    fixture_free(&f);
}

/* Every single flipped byte of a record is detected: decode fails, never returns other content. */
static void test_every_flipped_byte_detected(void **state) {
    int dtypes[] = {DFM_DTYPE_FP32, DFM_DTYPE_FP16, DFM_DTYPE_BF16};
    for (int t = 0; t < 3; t++) {
        fixture f;
        fixture_init(&f, 4, 24, dtypes[t], 0);
        dfm_trec_params p = {.k = 4, .d = 24, .dtype = dtypes[t], .shuffle = 1, .level = 3};
        dfm_trec_codec *c;
        assert_int_equal(dfm_trec_codec_create(&p, &c), DFM_OK);
        dfm_trec in = {.chunk_id = 99, .mask = 0x7, .ids = f.ids, .scores = f.scores, .emb = f.emb};
        size_t n;
        assert_int_equal(dfm_trec_encode(c, &in, f.rec, f.cap, &n), DFM_OK);
        dfm_trec out = {.ids = f.ids_out, .scores = f.scores_out, .emb = f.emb_out};
        for (size_t i = 0; i < n; i++) {
            for (int bit = 0; bit < 8; bit += 3) {
                f.rec[i] ^= (uint8_t)(1u << bit);
                int rc = dfm_trec_decode(c, f.rec, n, &out, NULL, NULL);
                if (rc == DFM_OK) fail_msg("flipped bit %d of byte %zu of a %zu-byte %s record went undetected", bit, i, n,
                                           dfm_dtype_name(dtypes[t]));
                f.rec[i] ^= (uint8_t)(1u << bit);
            }
        }
        assert_int_equal(dfm_trec_decode(c, f.rec, n, &out, NULL, NULL), DFM_OK);
        /* truncated and over-long */
        assert_int_equal(dfm_trec_decode(c, f.rec, n - 1, &out, NULL, NULL), DFM_ETRUNCATED);
        assert_int_equal(dfm_trec_decode(c, f.rec, 20, &out, NULL, NULL), DFM_ETRUNCATED);
        /* unknown version: named as such, even though the header checksum no longer matches */
        dfm_trec_header h;
        memcpy(&h, f.rec, sizeof h);
        h.version = 7;
        memcpy(f.rec, &h, sizeof h);
        assert_int_equal(dfm_trec_decode(c, f.rec, n, &out, NULL, NULL), DFM_EVERSION);
        assert_non_null(strstr(dfm_last_error(), "version 7"));
        dfm_trec_codec_free(c);
        fixture_free(&f);
    }
}

static void test_codec_mismatch_and_raw(void **state) {
    fixture f;
    fixture_init(&f, 1, 1, DFM_DTYPE_FP32, 0);
    dfm_trec_params p = {.k = 1, .d = 1, .dtype = DFM_DTYPE_FP32, .shuffle = 1};
    dfm_trec_codec *c, *c16;
    assert_int_equal(dfm_trec_codec_create(&p, &c), DFM_OK);
    dfm_trec in = {.chunk_id = 5, .mask = 1, .ids = f.ids, .scores = f.scores, .emb = f.emb};
    size_t n;
    assert_int_equal(dfm_trec_encode(c, &in, f.rec, f.cap, &n), DFM_OK);
    dfm_trec_header h;
    assert_int_equal(dfm_trec_check_header(f.rec, n, &h), DFM_OK);
    assert_true(h.flags & DFM_TREC_F_RAW); /* a 24-byte payload does not shrink under zstd */
    dfm_trec out = {.ids = f.ids_out, .scores = f.scores_out, .emb = f.emb_out};
    assert_int_equal(dfm_trec_decode(c, f.rec, n, &out, NULL, NULL), DFM_OK);
    assert_true(out.emb[0] == f.emb[0] && out.ids[0] == f.ids[0]);
    p.dtype = DFM_DTYPE_FP16;
    assert_int_equal(dfm_trec_codec_create(&p, &c16), DFM_OK);
    assert_int_equal(dfm_trec_decode(c16, f.rec, n, &out, NULL, NULL), DFM_EMISMATCH);
    dfm_trec_codec_free(c);
    dfm_trec_codec_free(c16);
    fixture_free(&f);
}

/* slots (header byte 19): recorded, round-tripped, checked against the codec; with both, a continuation slot
 * J + r needs its neighbour slot r and id[r] + 1, at encode and at decode; an odd K is refused. */
static void test_slots(void **state) {
    fixture f;
    fixture_init(&f, 4, 8, DFM_DTYPE_FP16, 0);
    dfm_trec_params p = {.k = 4, .d = 8, .dtype = DFM_DTYPE_FP16, .slots = DFM_TREC_SLOTS_BOTH};
    dfm_trec_codec *c, *cn;
    assert_int_equal(dfm_trec_codec_create(&p, &c), DFM_OK);
    f.ids[0] = 10, f.ids[1] = 20, f.ids[2] = 11, f.ids[3] = 21;
    dfm_trec in = {.chunk_id = 5, .mask = 0xf, .ids = f.ids, .scores = f.scores, .emb = f.emb};
    dfm_trec out = {.ids = f.ids_out, .scores = f.scores_out, .emb = f.emb_out};
    size_t n;
    assert_int_equal(dfm_trec_encode(c, &in, f.rec, f.cap, &n), DFM_OK);
    dfm_trec_header h;
    assert_int_equal(dfm_trec_check_header(f.rec, n, &h), DFM_OK);
    assert_int_equal(h.slots, DFM_TREC_SLOTS_BOTH);
    assert_int_equal(dfm_trec_decode(c, f.rec, n, &out, NULL, NULL), DFM_OK);
    assert_memory_equal(f.ids_out, f.ids, 4 * sizeof(int64_t));
    /* a neighbour-slots codec refuses it */
    dfm_trec_params pn = p;
    pn.slots = DFM_TREC_SLOTS_NEIGHBOUR;
    assert_int_equal(dfm_trec_codec_create(&pn, &cn), DFM_OK);
    assert_int_equal(dfm_trec_decode(cn, f.rec, n, &out, NULL, NULL), DFM_EMISMATCH);
    /* the continuation of neighbour 1 without neighbour 1, or not its id + 1: refused */
    in.mask = 0xd;
    assert_int_equal(dfm_trec_encode(c, &in, f.rec, f.cap, &n), DFM_EARG);
    in.mask = 0xf;
    f.ids[3] = 20;
    assert_int_equal(dfm_trec_encode(c, &in, f.rec, f.cap, &n), DFM_EARG);
    /* ... and at decode (the same record written by a neighbour codec, its header byte set to both) */
    assert_int_equal(dfm_trec_encode(cn, &in, f.rec, f.cap, &n), DFM_OK);
    memcpy(&h, f.rec, sizeof h);
    h.slots = DFM_TREC_SLOTS_BOTH;
    memcpy(f.rec, &h, sizeof h);
    uint64_t hc = XXH3_64bits_withSeed(f.rec + DFM_TREC_HEADER_BYTES, n - DFM_TREC_HEADER_BYTES, dfm_checksum64(f.rec, DFM_TREC_HEADER_BYTES - 8));
    memcpy(f.rec + DFM_TREC_HEADER_BYTES - 8, &hc, 8);
    assert_int_equal(dfm_trec_decode(c, f.rec, n, &out, NULL, NULL), DFM_EFORMAT);
    assert_non_null(strstr(dfm_last_error(), "does not follow its neighbour slot"));
    /* an odd K cannot hold both; an unknown slots value is refused */
    dfm_trec_params odd = p, unk = p;
    odd.k = 3;
    unk.slots = 3;
    dfm_trec_codec *c2 = NULL;
    assert_int_equal(dfm_trec_codec_create(&odd, &c2), DFM_EARG);
    assert_int_equal(dfm_trec_codec_create(&unk, &c2), DFM_EARG);
    int s = -1;
    assert_int_equal(dfm_trec_slots_parse("continuation", &s), DFM_OK);
    assert_int_equal(s, DFM_TREC_SLOTS_CONTINUATION);
    assert_int_equal(dfm_trec_slots_parse("next", &s), DFM_EARG);
    dfm_trec_codec_free(c);
    dfm_trec_codec_free(cn);
    fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_conversion),
        cmocka_unit_test(test_bf16_conversion),
        cmocka_unit_test(test_array_conversions_match_scalar),
        cmocka_unit_test(test_shuffle_and_keys),
        cmocka_unit_test(test_roundtrip_all),
        cmocka_unit_test(test_encode_rejects),
        cmocka_unit_test(test_every_flipped_byte_detected),
        cmocka_unit_test(test_codec_mismatch_and_raw),
        cmocka_unit_test(test_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
