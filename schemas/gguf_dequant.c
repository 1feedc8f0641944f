/* gguf_dequant.c — ggml's tensor types: their block layouts, and dequantization to fp32.
 *
 * Each block type is dequantized with the arithmetic of ggml's reference dequantize_row_* (ggml-quants.c),
 * which the `gguf` Python package's NumPy code repeats: fp16 scales widened exactly to fp32, then fp32
 * products and sums, one rounding per operation, in the same order. This file is compiled in ISO C mode,
 * where GCC does not contract a*b+c into a fused multiply-add, so the results are bit-identical to both
 * (tests/py/lm/test_gguf_import.py compares every type with the `gguf` package on random blocks). */
#include "schemas/gguf.h"

#include <string.h>

#include "common/error.h"
#include "schemas/half.h"

#define QK 32   /* elements of a Q4_0 .. Q8_0 block */
#define QK_K 256 /* elements of a K-quant super-block */

typedef struct {
    const char *name;
    uint32_t block_elems, block_bytes;
} type_info;

/* ggml's type table (ggml.c type_traits: elements and bytes per block), for every id whose layout dfm
 * knows: enough to validate the sizes of any tensor in a file, whether or not it can be dequantized. */
static const type_info TYPES[DFM_GGML_NTYPES] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},          [2] = {"Q4_0", 32, 18},      [3] = {"Q4_1", 32, 20},
    [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},       [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 40},
    [10] = {"Q2_K", 256, 84},    [11] = {"Q3_K", 256, 110},    [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},    [16] = {"IQ2_XXS", 256, 66}, [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},    [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82},   [23] = {"IQ4_XS", 256, 136},  [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},         [28] = {"F64", 1, 8},        [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},    [35] = {"TQ2_0", 256, 66},   [39] = {"MXFP4", 32, 17},
    [40] = {"NVFP4", 64, 36},    [41] = {"Q1_0", 128, 18},
};

const char *dfm_ggml_type_name(int type) {
    return type >= 0 && type < DFM_GGML_NTYPES && TYPES[type].name ? TYPES[type].name : "?";
}

int dfm_ggml_type_layout(int type, uint32_t *block_elems, uint32_t *block_bytes) {
    if (type < 0 || type >= DFM_GGML_NTYPES || !TYPES[type].name) return 0;
    *block_elems = TYPES[type].block_elems;
    *block_bytes = TYPES[type].block_bytes;
    return 1;
}

int dfm_gguf_type_dequantizable(int type) {
    switch (type) {
    case DFM_GGML_F32: case DFM_GGML_F16: case DFM_GGML_BF16: case DFM_GGML_Q4_0: case DFM_GGML_Q4_1:
    case DFM_GGML_Q5_0: case DFM_GGML_Q5_1: case DFM_GGML_Q8_0: case DFM_GGML_Q2_K: case DFM_GGML_Q3_K:
    case DFM_GGML_Q4_K: case DFM_GGML_Q5_K: case DFM_GGML_Q6_K: return 1;
    default: return 0;
    }
}

static float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return dfm_f16_to_f32(h);
}

static uint32_t u32le(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- 32-element blocks. A block's nibble j (0..15) is element j, its high nibble element j + 16. ---- */

static void q4_0(const uint8_t *b, float *y) { /* d, qs[16]: x = d * (q - 8) */
    float d = f16(b);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)((b[2 + j] & 0x0F) - 8);
        y[j + QK / 2] = d * (float)((b[2 + j] >> 4) - 8);
    }
}

static void q4_1(const uint8_t *b, float *y) { /* d, m, qs[16]: x = d * q + m */
    float d = f16(b), m = f16(b + 2);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)(b[4 + j] & 0x0F) + m;
        y[j + QK / 2] = d * (float)(b[4 + j] >> 4) + m;
    }
}

static void q5_0(const uint8_t *b, float *y) { /* d, qh (bit j = fifth bit of element j), qs[16]: x = d * (q - 16) */
    float d = f16(b);
    uint32_t qh = u32le(b + 2);
    for (int j = 0; j < QK / 2; j++) {
        int lo = (b[6 + j] & 0x0F) | (int)((qh >> j) & 1) << 4;
        int hi = (b[6 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (float)(lo - 16);
        y[j + QK / 2] = d * (float)(hi - 16);
    }
}

static void q5_1(const uint8_t *b, float *y) { /* d, m, qh, qs[16]: x = d * q + m */
    float d = f16(b), m = f16(b + 2);
    uint32_t qh = u32le(b + 4);
    for (int j = 0; j < QK / 2; j++) {
        int lo = (b[8 + j] & 0x0F) | (int)((qh >> j) & 1) << 4;
        int hi = (b[8 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (float)lo + m;
        y[j + QK / 2] = d * (float)hi + m;
    }
}

static void q8_0(const uint8_t *b, float *y) { /* d, qs[32] int8: x = q * d */
    float d = f16(b);
    for (int j = 0; j < QK; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

/* ---- 256-element super-blocks ---- */

static void q2_k(const uint8_t *b, float *y) {
    /* scales[16] (low nibble: scale, high: min, per 16 elements), qs[64] (2 bits), d, dmin.
     * Element 128*h + 32*s + l (h < 2, s < 4, l < 32) is bits 2s..2s+1 of qs[32*h + l]. */
    const uint8_t *sc = b, *qs = b + 16;
    float d = f16(b + 80), dmin = f16(b + 82);
    for (int i = 0; i < QK_K; i++) {
        int h = i / 128, s = (i / 32) % 4, l = i % 32, g = i / 16;
        float dl = d * (float)(sc[g] & 0x0F), ml = dmin * (float)(sc[g] >> 4);
        y[i] = dl * (float)((qs[32 * h + l] >> (2 * s)) & 3) - ml;
    }
}

static void q3_k(const uint8_t *b, float *y) {
    /* hmask[32], qs[64], scales[12] (sixteen 6-bit scales, offset 32), d. Element 128*h + 32*s + l has low
     * bits 2s..2s+1 of qs[32*h + l] and high bit (i / 32) of hmask[l]; a clear high bit subtracts 4. */
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    float d = f16(b + 108);
    float dl[16];
    for (int g = 0; g < 16; g++) {
        int lo = (sc[g % 8] >> (4 * (g / 8))) & 0x0F, hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
        dl[g] = d * (float)((int8_t)(lo | hi << 4) - 32);
    }
    for (int i = 0; i < QK_K; i++) {
        int h = i / 128, s = (i / 32) % 4, l = i % 32;
        int q = ((qs[32 * h + l] >> (2 * s)) & 3) - (((hm[l] >> (i / 32)) & 1) ? 0 : 4);
        y[i] = dl[i / 16] * (float)q;
    }
}

/* Q4_K / Q5_K's eight 6-bit scales and mins, packed in 12 bytes. */
static void k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void q4_k(const uint8_t *b, float *y) {
    /* d, dmin, scales[12], qs[128]. Sub-block g = 2c + t (32 elements) is nibble t of qs[32c .. 32c+32). */
    float d = f16(b), dmin = f16(b + 2);
    const uint8_t *qs = b + 16;
    for (int g = 0; g < 8; g++) {
        int sc, m;
        k_scale_min(b + 4, g, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        for (int l = 0; l < 32; l++) y[32 * g + l] = d1 * (float)((qs[32 * (g / 2) + l] >> (4 * (g % 2))) & 0x0F) - m1;
    }
}

static void q5_k(const uint8_t *b, float *y) {
    /* d, dmin, scales[12], qh[32] (bit g of qh[l]: fifth bit of element 32g + l), qs[128] as Q4_K. */
    float d = f16(b), dmin = f16(b + 2);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int g = 0; g < 8; g++) {
        int sc, m;
        k_scale_min(b + 4, g, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            int q = ((qs[32 * (g / 2) + l] >> (4 * (g % 2))) & 0x0F) | ((qh[l] >> g) & 1) << 4;
            y[32 * g + l] = d1 * (float)q - m1;
        }
    }
}

static void q6_k(const uint8_t *b, float *y) {
    /* ql[128], qh[64], scales[16] int8, d. Element 128*h + 64*t + l (l < 64) has low nibble t of ql[64h + l];
     * element 128*h + 32*s + l (l < 32) has high bits 2s..2s+1 of qh[32h + l]; x = (d * scale) * (q - 32). */
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16(b + 208);
    for (int i = 0; i < QK_K; i++) {
        int h = i / 128, r = i % 128;
        int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
        int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        y[i] = d * (float)sc[i / 16] * (float)((lo | hi << 4) - 32);
    }
}

int dfm_ggml_dequantize(int type, const void *src, float *dst, uint64_t n) {
    const uint8_t *s = src;
    if (type == DFM_GGML_F32) {
        memcpy(dst, s, n * 4);
        return DFM_OK;
    }
    if (type == DFM_GGML_F16 || type == DFM_GGML_BF16) {
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = type == DFM_GGML_F16 ? dfm_f16_to_f32(h) : dfm_bf16_to_f32(h);
        }
        return DFM_OK;
    }
    void (*fn)(const uint8_t *, float *) = NULL;
    switch (type) {
    case DFM_GGML_Q4_0: fn = q4_0; break;
    case DFM_GGML_Q4_1: fn = q4_1; break;
    case DFM_GGML_Q5_0: fn = q5_0; break;
    case DFM_GGML_Q5_1: fn = q5_1; break;
    case DFM_GGML_Q8_0: fn = q8_0; break;
    case DFM_GGML_Q2_K: fn = q2_k; break;
    case DFM_GGML_Q3_K: fn = q3_k; break;
    case DFM_GGML_Q4_K: fn = q4_k; break;
    case DFM_GGML_Q5_K: fn = q5_k; break;
    case DFM_GGML_Q6_K: fn = q6_k; break;
    default:
        return DFM_FAIL(DFM_EUNSUPPORTED, "ggml type %s (%d) cannot be dequantized by dfm (supported: F32, F16, BF16, "
                        "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K). HINT: re-quantize the model to "
                        "one of these with llama.cpp's llama-quantize", dfm_ggml_type_name(type), type);
    }
    const type_info *ti = &TYPES[type];
    if (n % ti->block_elems)
        return DFM_FAIL(DFM_EARG, "%llu elements are not a whole number of %s blocks of %u", (unsigned long long)n,
                        ti->name, ti->block_elems);
    for (uint64_t k = 0; k < n / ti->block_elems; k++) fn(s + k * ti->block_bytes, dst + k * ti->block_elems);
    return DFM_OK;
}
