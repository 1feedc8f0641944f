/* tok_precompiled.c — the Precompiled normalizer: SentencePiece's `precompiled_charsmap`, which T5, mT5,
 * ALBERT, XLNet and XLM-R tokenizer.json files carry (their NFKC-like rules compiled into a trie).
 *
 * Format (SentencePiece's normalizer.cc, read by `tokenizers` through the spm_precompiled crate):
 * u32 trie size in bytes (little-endian), that many bytes of Darts double-array units (u32), then the
 * replacement strings, each ended by a NUL. A unit holds a label (bits 0-7, with bit 31 set on non-labels),
 * a has-leaf flag (bit 8) and an offset ((unit >> 10) << (bit 9 ? 8 : 0)); a leaf unit's low 31 bits are the
 * position of its replacement string.
 *
 * Normalizing, as `tokenizers`' normalizers/precompiled.rs does (it says: "Yes, this is weird"): the text is
 * cut into extended grapheme clusters; a cluster shorter than 6 bytes whose bytes have a prefix in the trie
 * is replaced whole by the replacement of the SHORTEST such prefix; otherwise each of its characters is
 * replaced by its own entry, or kept. Lookups stop at a NUL byte. Clusters come from utf8proc (UAX #29).
 *
 * `tokenizers` panics on a trie position or a replacement offset outside the data (a crafted charsmap);
 * here such an entry is simply no match.
 */
#include "tokenizer/tok_internal.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

struct dfm_charsmap {
    uint32_t *unit;
    size_t n_units;
    char *norm; /* the replacement strings */
    size_t norm_len;
    int32_t ascii_off[128]; /* the replacement of each ASCII character alone: offset, or -1 */
    uint16_t ascii_len[128];
};

void dfm_charsmap_free(dfm_charsmap *m) {
    if (!m) return;
    free(m->unit);
    free(m->norm);
    free(m);
}

/* The replacement of the shortest prefix of key[0..n) with an entry: 1 with its bytes, or 0. */
static int lookup(const dfm_charsmap *m, const uint8_t *key, size_t n, const char **out, size_t *len) {
    size_t pos = 0;
    uint32_t u = m->unit[0];
    pos ^= (size_t)(u >> 10) << ((u & (1u << 9)) >> 6);
    for (size_t i = 0; i < n; i++) {
        uint8_t c = key[i];
        if (!c) return 0;
        pos ^= c;
        if (pos >= m->n_units) return 0;
        u = m->unit[pos];
        if ((u & ((1u << 31) | 0xFFu)) != c) return 0;
        pos ^= (size_t)(u >> 10) << ((u & (1u << 9)) >> 6);
        if ((u >> 8) & 1) {
            if (pos >= m->n_units) return 0;
            size_t at = m->unit[pos] & ((1u << 31) - 1), e = at;
            if (at > m->norm_len || (at < m->norm_len && ((uint8_t)m->norm[at] & 0xC0) == 0x80)) return 0;
            while (e < m->norm_len && m->norm[e]) e++;
            *out = m->norm + at;
            *len = e - at;
            return 1;
        }
    }
    return 0;
}

int dfm_charsmap_parse(const dfm_load_ctx *lc, const uint8_t *p, size_t n, const char *where, dfm_charsmap **out) {
    *out = NULL;
    if (n < 4) return DFM_LFAIL(lc, DFM_EFORMAT, "%s: %zu bytes, shorter than its 4-byte trie size", where, n);
    uint32_t trie_bytes;
    memcpy(&trie_bytes, p, 4);
    size_t units = trie_bytes / 4;
    if (units > (n - 4) / 4)
        return DFM_LFAIL(lc, DFM_EFORMAT, "%s: a trie of %u bytes in %zu bytes of charsmap", where, trie_bytes, n - 4);
    if (!units) return DFM_LFAIL(lc, DFM_EFORMAT, "%s: the trie is empty", where);
    size_t norm_at = 4 + units * 4, norm_len = n - norm_at;
    if (dfm_utf8_valid_prefix(p + norm_at, norm_len) != norm_len)
        return DFM_LFAIL(lc, DFM_EFORMAT, "%s: the replacement strings are not valid UTF-8", where);
    dfm_charsmap *m = calloc(1, sizeof *m);
    if (m) {
        m->unit = malloc(units * 4);
        m->norm = malloc(norm_len + 1);
    }
    if (!m || !m->unit || !m->norm) {
        dfm_charsmap_free(m);
        return DFM_FAIL(DFM_ENOMEM, "no memory for a %zu-byte charsmap", n);
    }
    for (size_t i = 0; i < units; i++) { /* little-endian u32 */
        const uint8_t *q = p + 4 + 4 * i;
        m->unit[i] = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    }
    m->n_units = units;
    memcpy(m->norm, p + norm_at, norm_len);
    m->norm[norm_len] = 0;
    m->norm_len = norm_len;
    for (int c = 0; c < 128; c++) {
        uint8_t k = (uint8_t)c;
        const char *r;
        size_t l;
        m->ascii_off[c] = -1;
        if (lookup(m, &k, 1, &r, &l) && l < 65536) m->ascii_off[c] = (int32_t)(r - m->norm), m->ascii_len[c] = (uint16_t)l;
    }
    *out = m;
    return DFM_OK;
}

int dfm_charsmap_apply(const dfm_charsmap *m, const char *s, size_t n, size_t lead0, sbuf *out, size_t *lead0_out) {
    const uint8_t *u = (const uint8_t *)s;
    size_t lo = 0;
    for (size_t i = 0; i < n;) {
        /* an ASCII character followed by another (or the end) is a cluster of its own, except CR LF; a run
         * of those the charsmap leaves alone is copied at once */
        size_t run = i;
        while (run < n && u[run] < 0x80 && m->ascii_off[u[run]] < 0 &&
               (run + 1 == n || (u[run + 1] < 0x80 && !(u[run] == '\r' && u[run + 1] == '\n'))))
            run++;
        if (run > i) {
            DFM_TRY(dfm_sbuf_add(out, s + i, run - i));
            if (i < lead0) lo = out->n - (run - (lead0 < run ? lead0 : run));
            i = run;
            continue;
        }
        if (u[i] < 0x80 && (i + 1 == n || (u[i + 1] < 0x80 && !(u[i] == '\r' && u[i + 1] == '\n')))) {
            DFM_TRY(dfm_sbuf_add(out, m->norm + m->ascii_off[u[i]], m->ascii_len[u[i]]));
            if (i < lead0) lo = out->n;
            i++;
            continue;
        }
        uint32_t prev, cp;
        size_t j = i + (size_t)dfm_utf8_next(u + i, n - i, &prev);
        utf8proc_int32_t state = 0;
        while (j < n) {
            size_t l = (size_t)dfm_utf8_next(u + j, n - j, &cp);
            if (utf8proc_grapheme_break_stateful((utf8proc_int32_t)prev, (utf8proc_int32_t)cp, &state)) break;
            prev = cp;
            j += l;
        }
        const char *r;
        size_t rl;
        if (j - i < 6 && lookup(m, u + i, j - i, &r, &rl)) {
            DFM_TRY(dfm_sbuf_add(out, r, rl));
        } else {
            for (size_t k = i; k < j;) {
                size_t l = (size_t)dfm_utf8_next(u + k, j - k, &cp);
                if (lookup(m, u + k, l, &r, &rl)) DFM_TRY(dfm_sbuf_add(out, r, rl));
                else DFM_TRY(dfm_sbuf_add(out, s + k, l));
                k += l;
            }
        }
        if (i < lead0) lo = out->n;
        i = j;
    }
    *lead0_out = lo;
    return DFM_OK;
}
