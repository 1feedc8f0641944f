/* tok_utf8.c — UTF-8 validation and replacement, and the GPT-2 byte-level alphabet. */
#include "tokenizer/tok_internal.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>

/* Length of the well-formed sequence starting at s[0] (1..4), or -(bytes of its maximal invalid
 * subpart) (Unicode 3.9, "U+FFFD substitution of maximal subparts", which Python and Rust follow).
 * Table 3-7: second-byte ranges depend on the lead byte (E0 A0.., ED ..9F, F0 90.., F4 ..8F). */
static int utf8_seq(const uint8_t *s, size_t n) {
    uint8_t b = s[0];
    if (b < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) { need = 2; lo = 0xA0; }
    else if (b == 0xED) { need = 2; hi = 0x9F; }
    else if (b >= 0xE1 && b <= 0xEF) need = 2;
    else if (b == 0xF0) { need = 3; lo = 0x90; }
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else if (b == 0xF4) { need = 3; hi = 0x8F; }
    else return -1;
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) return -k;
        uint8_t c = s[k];
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return -k;
    }
    return need + 1;
}

size_t dfm_utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        int k = utf8_seq(s + i, n - i);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

int dfm_utf8_replace(const uint8_t *s, size_t n, char **out, size_t *out_len, size_t *n_rep) {
    /* worst case: every byte becomes EF BF BD */
    uint8_t *o = malloc(n * 3 + 1);
    if (!o) return DFM_FAIL(DFM_ENOMEM, "no memory for %zu bytes of replaced text", n * 3 + 1);
    size_t i = 0, j = 0, r = 0;
    while (i < n) {
        int k = utf8_seq(s + i, n - i);
        if (k > 0) {
            memcpy(o + j, s + i, (size_t)k);
            j += (size_t)k;
            i += (size_t)k;
        } else {
            o[j++] = 0xEF, o[j++] = 0xBF, o[j++] = 0xBD;
            i += (size_t)(-k);
            r++;
        }
    }
    o[j] = 0;
    *out = (char *)o;
    *out_len = j;
    if (n_rep) *n_rep = r;
    return DFM_OK;
}

int dfm_utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t b = s[0];
    if (b < 0x80 || n < 2) { *cp = b; return 1; }
    if (b < 0xE0) { *cp = ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F); return 2; }
    if (b < 0xF0 || n < 4) {
        if (n < 3) { *cp = b; return 1; }
        *cp = ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
          (s[3] & 0x3F);
    return 4;
}

int dfm_utf8_put(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = (uint8_t)(0xC0 | (cp >> 6)); o[1] = (uint8_t)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2's bytes_to_unicode(): printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves,
 * the other 68 bytes to U+0100, U+0101, ... in byte order. */
static int printable(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

uint32_t dfm_bytelevel_cp(uint8_t b) {
    if (printable(b)) return b;
    uint32_t k = 0;
    for (int c = 0; c < b; c++) k += !printable(c);
    return 0x100 + k;
}

static int16_t cp_to_byte[0x100 + 68];
static pthread_once_t cp_once = PTHREAD_ONCE_INIT;
static void cp_table_init(void) {
    for (int b = 0; b < 256; b++) cp_to_byte[dfm_bytelevel_cp((uint8_t)b)] = (int16_t)b;
}

int dfm_bytelevel_byte(uint32_t cp) {
    if (cp >= 0x100 + 68) return -1;
    pthread_once(&cp_once, cp_table_init);
    if (cp < 0x100 && !printable((int)cp)) return -1;
    return cp_to_byte[cp];
}
