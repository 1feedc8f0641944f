/* tok_normalize.c — the normalizers of tokenizer.json, as `tokenizers` applies them
 * (tokenizers/src/normalizers/ and NormalizedString in tokenizer/normalizer.rs):
 *
 *   NFC NFD NFKC NFKD   utf8proc, on the non-ASCII runs only (ASCII is its own normal form; the ASCII
 *                       character before a run joins it, as a starter a mark may compose with); code points
 *                       `tokenizers`' older table does not know are kept apart (dfm_uc_nf_keep)
 *   Lowercase           char::to_lowercase, per character (no final-sigma rule)
 *   Strip               White_Space off the left and/or right
 *   StripAccents        combining marks dropped (no decomposition)
 *   Replace             every match of a String (literal) or Regex pattern -> content
 *   Prepend             a prefix before a non-empty string
 *   BertNormalizer      clean_text (drop control/format/NUL/U+FFFD, whitespace -> ' '), spaces around CJK
 *                       ideographs, strip_accents (NFD, drop non-spacing marks; default: lowercase), lowercase
 *   Nmt                 drop some controls, map some spaces to ' '
 *   Precompiled         SentencePiece's charsmap (tok_precompiled.c)
 *   Sequence            each in turn
 *
 * Metaspace with prepend_scheme "first" prepends only to a piece that starts at the input's first
 * character, after normalization: so, when a tokenizer has one, each stage also reports how many leading
 * bytes of its output come from that character (`lead0`; the alignment rules of NormalizedString: a
 * mapped or inserted character inherits the alignment of the one it came from, a replacement that of the
 * last byte of its match, a removed one is gone).
 */
#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_unicode.h"

#include "common/error.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ================================================================ parsing */

static int push_norm(dfm_tokenizer *tok, dfm_norm_stage *st) {
    if (tok->n_norm == 64) return DFM_FAIL(DFM_EUNSUPPORTED, "normalizer: more than 64 normalizer stages");
    dfm_norm_stage *q = realloc(tok->norm, (tok->n_norm + 1) * sizeof *q);
    if (!q) return DFM_FAIL(DFM_ENOMEM, "no memory");
    tok->norm = q;
    tok->norm[tok->n_norm++] = *st;
    return DFM_OK;
}

static void stage_free(dfm_norm_stage *st) {
    free(st->a), free(st->b);
    dfm_regex_free(st->re);
    dfm_charsmap_free(st->charsmap);
}

void dfm_norm_free(dfm_tokenizer *tok) {
    for (size_t i = 0; i < tok->n_norm; i++) stage_free(&tok->norm[i]);
    free(tok->norm);
    tok->norm = NULL, tok->n_norm = 0;
}


static int need_bool(const dfm_load_ctx *lc, json_t *p, const char *key, const char *where, int *out) {
    if (!json_is_boolean(json_object_get(p, key)))
        return DFM_LFAIL(lc, DFM_EFORMAT, "%s.%s: missing or not true/false", where, key);
    *out = json_is_true(json_object_get(p, key));
    return DFM_OK;
}

static int64_t base64_val(int ch) {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    if (ch == '+') return 62;
    if (ch == '/') return 63;
    return -1;
}

/* Standard base64 with padding, as the `base64` crate's STANDARD engine accepts it. */
static int base64_decode(const char *s, size_t n, uint8_t **out, size_t *len) {
    if (n % 4) return -1;
    uint8_t *o = malloc(n / 4 * 3 + 1);
    if (!o) return -2;
    size_t j = 0;
    for (size_t i = 0; i < n; i += 4) {
        int64_t v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == n && k >= 2) { v[k] = 0; pad++; continue; }
            if (pad || (v[k] = base64_val((unsigned char)s[i + k])) < 0) { free(o); return -1; }
        }
        uint32_t w = (uint32_t)(v[0] << 18 | v[1] << 12 | v[2] << 6 | v[3]);
        o[j++] = (uint8_t)(w >> 16);
        if (pad < 2) o[j++] = (uint8_t)(w >> 8);
        if (pad < 1) o[j++] = (uint8_t)w;
    }
    *out = o;
    *len = j;
    return 0;
}

static int parse_stage(const dfm_load_ctx *lc, dfm_tokenizer *tok, json_t *p, const char *where) {
    const char *type = dfm_jstr(p, "type", NULL);
    if (!type) return DFM_LFAIL(lc, DFM_EFORMAT, "%s has no \"type\"", where);
    dfm_norm_stage st = {0};
    int rc = DFM_OK;
    if (!strcmp(type, "Sequence")) return dfm_jsequence(lc, tok, p, "normalizers", where, parse_stage);
    if (!strcmp(type, "NFC")) st.kind = DFM_NORM_NFC;
    else if (!strcmp(type, "NFD")) st.kind = DFM_NORM_NFD;
    else if (!strcmp(type, "NFKC")) st.kind = DFM_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) st.kind = DFM_NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) st.kind = DFM_NORM_LOWERCASE;
    else if (!strcmp(type, "StripAccents")) st.kind = DFM_NORM_STRIP_ACCENTS;
    else if (!strcmp(type, "Nmt")) st.kind = DFM_NORM_NMT;
    else if (!strcmp(type, "Strip")) {
        st.kind = DFM_NORM_STRIP;
        DFM_TRY(need_bool(lc, p, "strip_left", where, &st.left));
        DFM_TRY(need_bool(lc, p, "strip_right", where, &st.right));
    } else if (!strcmp(type, "Prepend")) {
        size_t n;
        const char *s = dfm_jstr(p, "prepend", &n);
        if (!s) return DFM_LFAIL(lc, DFM_EFORMAT, "%s.prepend: missing or not a string", where);
        st.kind = DFM_NORM_PREPEND;
        if (!(st.a = dfm_tok_dupn(s, n))) return DFM_FAIL(DFM_ENOMEM, "no memory");
        st.alen = n;
    } else if (!strcmp(type, "Replace")) {
        st.kind = DFM_NORM_REPLACE;
        rc = dfm_jreplace(lc, p, where, &st.a, &st.alen, &st.b, &st.blen, &st.re);
        if (!rc && st.re && !dfm_regex_minlength(st.re))
            rc = DFM_LFAIL(lc, DFM_EUNSUPPORTED, "%s.pattern: a Replace pattern that can match the empty string is not "
                           "supported (`tokenizers` fails on the text it makes: an index out of bounds when it "
                           "pre-tokenizes)", where);
    } else if (!strcmp(type, "BertNormalizer")) {
        st.kind = DFM_NORM_BERT;
        DFM_TRY(need_bool(lc, p, "clean_text", where, &st.clean_text));
        DFM_TRY(need_bool(lc, p, "handle_chinese_chars", where, &st.chinese));
        DFM_TRY(need_bool(lc, p, "lowercase", where, &st.lowercase));
        DFM_TRY(dfm_jbool(lc, p, "strip_accents", st.lowercase, where, &st.strip_accents));
    } else if (!strcmp(type, "Precompiled")) {
        size_t n;
        const char *b64 = dfm_jstr(p, "precompiled_charsmap", &n);
        if (!b64) return DFM_LFAIL(lc, DFM_EFORMAT, "%s.precompiled_charsmap: missing or not a base64 string", where);
        uint8_t *bytes = NULL;
        size_t len = 0;
        int br = base64_decode(b64, n, &bytes, &len);
        if (br == -2) return DFM_FAIL(DFM_ENOMEM, "no memory");
        if (br) return DFM_LFAIL(lc, DFM_EFORMAT, "%s.precompiled_charsmap: not valid base64", where);
        st.kind = DFM_NORM_PRECOMPILED;
        char w[300];
        snprintf(w, sizeof w, "%s.precompiled_charsmap", where);
        rc = dfm_charsmap_parse(lc, bytes, len, w, &st.charsmap);
        free(bytes);
    } else {
        return DFM_LFAIL(lc, DFM_EUNSUPPORTED, "%s: normalizer type \"%s\" is not supported (supported: NFC, NFD, NFKC, "
                         "NFKD, Lowercase, Strip, StripAccents, Replace, Prepend, BertNormalizer, Nmt, Precompiled, "
                         "Sequence)", where, type);
    }
    if (!rc && (st.kind == DFM_NORM_NFC || st.kind == DFM_NORM_NFD || st.kind == DFM_NORM_NFKC || st.kind == DFM_NORM_NFKD ||
                (st.kind == DFM_NORM_BERT && st.strip_accents)) &&
        strcmp(utf8proc_unicode_version(), dfm_uc_tables_utf8proc_version()))
        rc = DFM_LFAIL(lc, DFM_EUNSUPPORTED, "%s: %s needs Unicode normalization, and this dfm's table of what "
                       "`tokenizers` normalizes differently was made for utf8proc's Unicode %s, not the linked %s. "
                       "HINT: regenerate tokenizer/tok_unicode_tables.h with tests/ref/make_tokenizer_unicode.py",
                       where, type, dfm_uc_tables_utf8proc_version(), utf8proc_unicode_version());
    if (!rc) rc = push_norm(tok, &st);
    if (rc) stage_free(&st);
    return rc;
}

int dfm_norm_parse(const dfm_load_ctx *lc, dfm_tokenizer *tok, void *json, const char *where) {
    json_t *p = json;
    if (!p || json_is_null(p)) return DFM_OK;
    if (!json_is_object(p)) return DFM_LFAIL(lc, DFM_EFORMAT, "%s is not an object", where);
    return parse_stage(lc, tok, p, where);
}

/* ================================================================ applying */

static inline size_t cp_at(const char *s, size_t n, size_t i, uint32_t *cp) {
    return (size_t)dfm_utf8_next((const uint8_t *)s + i, n - i, cp);
}

/* ---- Unicode normal forms ---- */

static utf8proc_option_t nf_options(int kind) {
    switch (kind) {
    case DFM_NORM_NFC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    case DFM_NORM_NFD: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    case DFM_NORM_NFKC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    default: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    }
}

static int nf_map(utf8proc_option_t opt, const char *s, size_t n, sbuf *out) {
    if (!n) return DFM_OK;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt);
    if (r < 0) {
        free(dst);
        return DFM_FAIL(DFM_EINTERNAL, "utf8proc normalization failed: %s", utf8proc_errmsg(r));
    }
    int rc = dfm_sbuf_add(out, dst, (size_t)r);
    free(dst);
    return rc;
}

/* A non-ASCII run (with the ASCII character before it), cut at the code points kept apart. */
static int nf_run(utf8proc_option_t opt, const char *s, size_t n, sbuf *out) {
    size_t seg = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = cp_at(s, n, i, &cp);
        if (cp >= 0x300 && dfm_uc_nf_keep(cp)) {
            DFM_TRY(nf_map(opt, s + seg, i - seg, out));
            DFM_TRY(dfm_sbuf_add(out, s + i, l));
            seg = i + l;
        }
        i += l;
    }
    return nf_map(opt, s + seg, n - seg, out);
}

/* Only runs holding non-ASCII bytes go through utf8proc, each with the one ASCII character before it:
 * ASCII never decomposes, has combining class 0 and is never the second of a composition, so the normal
 * form of the whole is that of the pieces cut before every ASCII character that precedes another one. */
static int nf_append(int kind, const char *s, size_t n, sbuf *out) {
    utf8proc_option_t opt = nf_options(kind);
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && (uint8_t)s[j] < 0x80) j++;
        if (j == n) return dfm_sbuf_add(out, s + i, n - i);
        size_t start = j > i ? j - 1 : j;
        DFM_TRY(dfm_sbuf_add(out, s + i, start - i));
        size_t e = j;
        while (e < n && (uint8_t)s[e] >= 0x80) e++;
        DFM_TRY(nf_run(opt, s + start, e - start, out));
        i = e;
    }
    return DFM_OK;
}

/* lead0 after a normal form: the normal form of the prefix through the marks that follow it (which may
 * compose into or reorder with its last character). */
static int nf_lead0(int kind, const char *s, size_t n, size_t lead0, sbuf *scratch, size_t *out) {
    size_t b = lead0;
    while (b < n) {
        uint32_t cp;
        size_t l = cp_at(s, n, b, &cp);
        if (utf8proc_get_property((utf8proc_int32_t)cp)->combining_class == 0 && !(cp >= 0x1161 && cp <= 0x11C2)) break;
        b += l;
    }
    scratch->n = 0;
    DFM_TRY(nf_append(kind, s, b, scratch));
    *out = scratch->n;
    return DFM_OK;
}

/* ---- character-wise stages: each input character becomes zero or more output characters ---- */

/* Nmt's two sets */
static int nmt_drop(uint32_t c) {
    return (c >= 1 && c <= 8) || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || c == 0x8F || c == 0x9F;
}
static int nmt_space(uint32_t c) {
    return c == 9 || c == 10 || c == 12 || c == 13 || c == 0x1680 || (c >= 0x200B && c <= 0x200F) || c == 0x2028 ||
           c == 0x2029 || c == 0x2581 || c == 0xFEFF || c == 0xFFFD;
}

enum { CW_LOWER = 1, CW_STRIP_ACCENTS, CW_NMT, CW_BERT_CLEAN, CW_BERT_CHINESE, CW_DROP_MN };

/* What a character-wise stage makes of an ASCII byte: the byte, or -1 (dropped). No stage turns an ASCII
 * character into more than one. */
static int ascii_out(int op, uint8_t b) {
    uint8_t k = dfm_uc_ascii[b];
    switch (op) {
    case CW_LOWER: return b >= 'A' && b <= 'Z' ? b + 32 : b;
    case CW_NMT: return nmt_drop(b) ? -1 : nmt_space(b) ? ' ' : b;
    case CW_BERT_CLEAN: return k & DFM_UC_OTHER ? -1 : k & DFM_UC_WS ? ' ' : b;
    case CW_STRIP_ACCENTS: return k & DFM_UC_MARK ? -1 : b;
    case CW_DROP_MN: return k & DFM_UC_MN ? -1 : b;
    default: return b;
    }
}

/* One pass of a character-wise stage, writing straight into out (room for the worst growth, 5/3: a CJK
 * ideograph with a space on each side). ASCII goes through a 128-entry map. */
static int charwise(int op, const char *s, size_t n, size_t lead0, sbuf *out, size_t *lead0_out) {
    int16_t amap[128];
    for (int b = 0; b < 128; b++) amap[b] = (int16_t)ascii_out(op, (uint8_t)b);
    DFM_TRY(dfm_sbuf_reserve(out, out->n + 2 * n + 16));
    uint8_t *base = (uint8_t *)out->p, *o = base + out->n;
    const uint8_t *u = (const uint8_t *)s;
    size_t lo = 0;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) {
            int16_t m = amap[u[i]];
            if (m >= 0) *o++ = (uint8_t)m;
            if (i < lead0) lo = (size_t)(o - base);
            i++;
            continue;
        }
        uint32_t cp;
        size_t l = (size_t)dfm_utf8_next(u + i, n - i, &cp);
        switch (op) {
        case CW_LOWER: {
            uint32_t low[3];
            int k = dfm_uc_lower(cp, low);
            for (int q = 0; q < k; q++) o += dfm_utf8_put(low[q], o);
            break;
        }
        case CW_STRIP_ACCENTS:
            if (!dfm_uc_is_mark(cp)) memcpy(o, u + i, l), o += l;
            break;
        case CW_DROP_MN:
            if (!dfm_uc_is_mn(cp)) memcpy(o, u + i, l), o += l;
            break;
        case CW_NMT:
            if (nmt_drop(cp)) break;
            if (nmt_space(cp)) *o++ = ' ';
            else memcpy(o, u + i, l), o += l;
            break;
        case CW_BERT_CLEAN:
            if (dfm_uc_is_other(cp)) break;
            if (dfm_uc_is_ws(cp)) *o++ = ' ';
            else memcpy(o, u + i, l), o += l;
            break;
        default: /* CW_BERT_CHINESE */
            if (dfm_uc_is_chinese(cp)) {
                *o++ = ' ';
                memcpy(o, u + i, l), o += l;
                *o++ = ' ';
            } else {
                memcpy(o, u + i, l), o += l;
            }
        }
        if (i < lead0) lo = (size_t)(o - base);
        i += l;
    }
    out->n = (size_t)(o - base);
    out->p[out->n] = 0;
    *lead0_out = lo;
    return DFM_OK;
}

static int all_ascii(const char *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ULL) return 0;
    }
    for (; i < n; i++)
        if ((uint8_t)s[i] >= 0x80) return 0;
    return 1;
}

/* ---- Replace ---- */

static int replace(dfm_enc_ctx *c, const dfm_norm_stage *st, const char *s, size_t n, size_t lead0, sbuf *out,
                   size_t *lead0_out) {
    size_t last = 0, lo = 0, ms = 0, me = 0;
    dfm_regex_iter it;
    if (st->re) dfm_regex_start(&it, st->re, (const uint8_t *)s, n);
    for (;;) {
        int found;
        if (!st->re) {
            const char *hit = last + st->alen <= n ? memmem(s + last, n - last, st->a, st->alen) : NULL;
            found = hit != NULL;
            if (found) ms = (size_t)(hit - s), me = ms + st->alen;
        } else {
            found = dfm_regex_next(&c->rx, &it, (const uint8_t *)s, n, &ms, &me);
            if (found < 0) return found;
        }
        if (!found) break;
        DFM_TRY(dfm_sbuf_add(out, s + last, ms - last));
        if (last < lead0) lo = out->n - (ms - (ms < lead0 ? ms : lead0)); /* the kept bytes below lead0 */
        DFM_TRY(dfm_sbuf_add(out, st->b, st->blen));
        if (lead0 && me <= lead0) lo = out->n; /* the content takes the alignment of the match's last byte */
        last = me;
    }
    DFM_TRY(dfm_sbuf_add(out, s + last, n - last));
    if (last < lead0) lo = out->n - (n - lead0);
    *lead0_out = lo;
    return DFM_OK;
}

/* ================================================================ the stages in turn */

static int apply_stage(dfm_enc_ctx *c, const dfm_norm_stage *st, const char *s, size_t n, size_t lead0, sbuf *out,
                       size_t *lo) {
    const dfm_tokenizer *tok = c->tok;
    out->n = 0;
    switch (st->kind) {
    case DFM_NORM_NFC: case DFM_NORM_NFD: case DFM_NORM_NFKC: case DFM_NORM_NFKD:
        DFM_TRY(nf_append(st->kind, s, n, out));
        if (tok->track_first && lead0) return nf_lead0(st->kind, s, n, lead0, &c->word2, lo);
        *lo = 0;
        return DFM_OK;
    case DFM_NORM_LOWERCASE: return charwise(CW_LOWER, s, n, lead0, out, lo);
    case DFM_NORM_STRIP_ACCENTS: return charwise(CW_STRIP_ACCENTS, s, n, lead0, out, lo);
    case DFM_NORM_NMT: return charwise(CW_NMT, s, n, lead0, out, lo);
    case DFM_NORM_STRIP: {
        size_t a = 0, b = n;
        uint32_t cp;
        while (st->left && a < b) {
            size_t l = cp_at(s, n, a, &cp);
            if (!dfm_uc_is_ws(cp)) break;
            a += l;
        }
        while (st->right && b > a) {
            size_t j = b - 1;
            while (j > a && ((uint8_t)s[j] & 0xC0) == 0x80) j--;
            cp_at(s, n, j, &cp);
            if (!dfm_uc_is_ws(cp)) break;
            b = j;
        }
        *lo = lead0 > a ? (lead0 < b ? lead0 : b) - a : 0;
        return dfm_sbuf_add(out, s + a, b - a);
    }
    case DFM_NORM_REPLACE: return replace(c, st, s, n, lead0, out, lo);
    case DFM_NORM_PREPEND:
        *lo = n && lead0 ? lead0 + st->alen : 0;
        if (!n) return DFM_OK; /* an empty string stays empty */
        DFM_TRY(dfm_sbuf_add(out, st->a, st->alen));
        return dfm_sbuf_add(out, s, n);
    case DFM_NORM_PRECOMPILED: return dfm_charsmap_apply(st->charsmap, s, n, lead0, out, lo);
    default: { /* BertNormalizer: its four steps in order, through two scratch buffers */
        if (all_ascii(s, n) && !tok->track_first) { /* CJK spaces, NFD and marks do nothing to ASCII: one pass */
            DFM_TRY(dfm_sbuf_reserve(out, n + 1));
            char *o = out->p;
            for (size_t i = 0; i < n; i++) {
                int m = st->clean_text ? ascii_out(CW_BERT_CLEAN, (uint8_t)s[i]) : (uint8_t)s[i];
                if (m >= 0) *o++ = (char)(st->lowercase && m >= 'A' && m <= 'Z' ? m + 32 : m);
            }
            out->n = (size_t)(o - out->p);
            out->p[out->n] = 0;
            *lo = 0;
            return DFM_OK;
        }
        sbuf *x = &c->word, *y = &c->word2;
        x->n = 0;
        DFM_TRY(dfm_sbuf_add(x, s, n));
        size_t l0 = lead0;
        int steps[4] = {st->clean_text ? CW_BERT_CLEAN : 0, st->chinese ? CW_BERT_CHINESE : 0,
                        st->strip_accents ? CW_DROP_MN : 0, st->lowercase ? CW_LOWER : 0};
        for (int k = 0; k < 4; k++) {
            if (!steps[k]) continue;
            if (steps[k] == CW_DROP_MN) { /* NFD first */
                y->n = 0;
                DFM_TRY(nf_append(DFM_NORM_NFD, x->p, x->n, y));
                size_t l1 = 0;
                if (tok->track_first && l0) DFM_TRY(nf_lead0(DFM_NORM_NFD, x->p, x->n, l0, out, &l1));
                l0 = l1;
                sbuf t = *x; *x = *y; *y = t;
            }
            y->n = 0;
            DFM_TRY(charwise(steps[k], x->p, x->n, l0, y, &l0));
            sbuf t = *x; *x = *y; *y = t;
        }
        *lo = l0;
        out->n = 0;
        return dfm_sbuf_add(out, x->p, x->n);
    }
    }
}

int dfm_normalize(dfm_enc_ctx *c, const char *s, size_t n, size_t lead0, sbuf *out, size_t *lead0_out) {
    const dfm_tokenizer *tok = c->tok;
    size_t lo = lead0;
    const char *in = s;
    size_t in_n = n;
    for (size_t k = 0; k < tok->n_norm; k++) { /* out and c->tmp take turns; the result ends in out */
        sbuf *dst = (tok->n_norm - k) % 2 ? out : &c->tmp;
        size_t nl = 0;
        DFM_TRY(apply_stage(c, &tok->norm[k], in, in_n, lo, dst, &nl));
        lo = nl;
        in = dst->p ? dst->p : "", in_n = dst->n;
    }
    if (!tok->n_norm) {
        out->n = 0;
        DFM_TRY(dfm_sbuf_add(out, s, n));
    }
    if (!out->p) DFM_TRY(dfm_sbuf_add(out, "", 0));
    if (lead0_out) *lead0_out = tok->track_first ? lo : 0;
    return DFM_OK;
}

int dfm_normalize_string(const dfm_tokenizer *tok, const char *s, size_t n, sbuf *out) {
    dfm_enc_ctx c = {.tok = tok};
    sbuf r = {0};
    int rc = dfm_normalize(&c, s, n, 0, &r, NULL);
    if (!rc) {
        out->n = 0;
        rc = dfm_sbuf_add(out, r.p, r.n);
    }
    free(r.p);
    dfm_enc_ctx_free(&c);
    return rc;
}
