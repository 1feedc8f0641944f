/* tok_regex.c — Oniguruma patterns on PCRE2 (see tok_regex.h). */
#include "tokenizer/tok_regex.h"
#include "tokenizer/tok_sbuf.h"
#include "tokenizer/tok_unicode.h"
#include "tokenizer/tok_utf8.h"

#include "common/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Oniguruma's Unicode \s (White_Space; PCRE2's UCP \s also matches U+180E and misses U+0085 in some
 * versions); its \w is Letter, Mark, Decimal_Number and Connector_Punctuation (PCRE2 10.42's is letters,
 * all numbers and '_'); its \h a hex digit (PCRE2's: horizontal space). */
#define ONIG_WS "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define ONIG_H "0-9a-fA-F"

static int add_class(sbuf *out, int in_class, int negate, const char *body, size_t n) {
    if (in_class) return dfm_sbuf_add(out, body, n);
    DFM_TRY(dfm_sbuf_add(out, negate ? "[^" : "[", negate ? 2 : 1));
    DFM_TRY(dfm_sbuf_add(out, body, n));
    return dfm_sbuf_add(out, "]", 1);
}

struct dfm_regex {
    pcre2_code *fast, *exact;  /* fast: NULL when the pattern has no property Oniguruma extends */
    uint32_t (*diff)[2];       /* the code points where they may differ, sorted ranges (may overlap) */
    size_t ndiff;
};

/* Translation state: exact (write Oniguruma's additions out) or fast; the additions met (exact pass). */
typedef struct {
    int exact, uses_tables;
    uint32_t (*diff)[2];
    size_t ndiff, cap;
} xlate;

/* The class body of Oniguruma's \p{name}: PCRE2's property plus what Oniguruma's newer table adds (only in
 * the exact pass), or the whole set written out (tok_unicode_tables.h). */
static int prop_body(xlate *x, const char *name, size_t len, sbuf *b, int *extended) {
    const char *pcre2;
    const uint32_t(*r)[2];
    size_t n;
    if (!dfm_uc_re_prop(name, len, &pcre2, &r, &n))
        return DFM_FAIL(DFM_EUNSUPPORTED, "the regex property \\p{%.*s} is not supported (only general categories "
                        "and the scripts of tok_unicode_tables.h, whose Oniguruma sets are checked)", (int)len, name);
    if (pcre2) {
        char t[32];
        snprintf(t, sizeof t, "\\p{%s}", pcre2);
        DFM_TRY(dfm_sbuf_add(b, t, strlen(t)));
    }
    if (pcre2 && n && x->exact) { /* remember where the fast form may differ */
        if (x->ndiff + n > x->cap) {
            size_t c = (x->ndiff + n) * 2;
            uint32_t(*q)[2] = realloc(x->diff, c * sizeof *q);
            if (!q) return DFM_FAIL(DFM_ENOMEM, "no memory");
            x->diff = q, x->cap = c;
        }
        memcpy(x->diff + x->ndiff, r, n * sizeof *r);
        x->ndiff += n;
    }
    for (size_t i = 0; i < (pcre2 && !x->exact ? 0 : n); i++) {
        char t[48];
        if (r[i][0] == r[i][1]) snprintf(t, sizeof t, "\\x{%x}", r[i][0]);
        else snprintf(t, sizeof t, "\\x{%x}-\\x{%x}", r[i][0], r[i][1]);
        DFM_TRY(dfm_sbuf_add(b, t, strlen(t)));
    }
    *extended = n > 0 || !pcre2;
    return DFM_OK;
}

/* Properties (names separated by ','), as a class or inside one; negated: only where that stays a class. */
static int add_props(xlate *x, sbuf *out, int in_class, int negate, const char *names) {
    sbuf b = {0};
    int rc = DFM_OK, ext = 0;
    for (const char *p = names; *p && !rc;) {
        const char *comma = strchr(p, ',');
        size_t l = comma ? (size_t)(comma - p) : strlen(p);
        int e = 0;
        rc = prop_body(x, p, l, &b, &e);
        ext |= e;
        p += l + (comma != NULL);
    }
    x->uses_tables = 1;
    if (!rc && in_class && negate) {
        if (ext || strchr(names, ','))
            rc = DFM_FAIL(DFM_EUNSUPPORTED, "a negated property (\\P{%s}, \\D or \\W) inside a class has no PCRE2 form "
                          "with Oniguruma's Unicode table", names);
        else {
            b.p[1] = 'P'; /* \p{X} -> \P{X} */
            rc = dfm_sbuf_add(out, b.p, b.n);
        }
    } else if (!rc) {
        if (!b.n) rc = dfm_sbuf_add(out, negate ? "\\x{0}-\\x{10ffff}" : "", 0); /* never: no property is empty */
        rc = rc ? rc : add_class(out, in_class, negate, b.p, b.n);
    }
    free(b.p);
    return rc;
}

/* Oniguruma allows a class inside a class ("[^(\\s|[.,!?])]", BLOOM's), meaning their union; PCRE2 reads
 * '[' there as a literal, so a nested class is flattened into its parent. A nested negated class or an
 * intersection (&&) has no flat form: refused. */
static int translate(xlate *x, const char *pat, size_t len, sbuf *out) {
    int depth = 0;
    for (size_t i = 0; i < len; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char e = pat[i + 1];
            i++;
            if (e == 's' || (e == 'S' && !depth)) DFM_TRY(add_class(out, depth, e == 'S', ONIG_WS, strlen(ONIG_WS)));
            else if (e == 'h' || (e == 'H' && !depth)) DFM_TRY(add_class(out, depth, e == 'H', ONIG_H, strlen(ONIG_H)));
            else if (e == 'w' || e == 'W') DFM_TRY(add_props(x, out, depth, e == 'W', "L,M,Nd,Pc"));
            else if (e == 'd' || e == 'D') DFM_TRY(add_props(x, out, depth, e == 'D', "Nd"));
            else if (e == 'p' || e == 'P') {
                int neg = e == 'P';
                char one[2] = {0, 0};
                const char *name = one;
                size_t nl = 1;
                if (i + 1 < len && pat[i + 1] == '{') {
                    const char *close = memchr(pat + i + 2, '}', len - i - 2);
                    if (!close) return DFM_FAIL(DFM_EUNSUPPORTED, "an unterminated \\p{");
                    name = pat + i + 2, nl = (size_t)(close - name);
                    if (nl && name[0] == '^') neg = !neg, name++, nl--;
                    i = (size_t)(close - pat);
                } else if (i + 1 < len) {
                    one[0] = pat[++i];
                }
                char nm[64];
                snprintf(nm, sizeof nm, "%.*s", (int)(nl < 63 ? nl : 63), name);
                DFM_TRY(add_props(x, out, depth, neg, nm));
            } else {
                DFM_TRY(dfm_sbuf_add(out, pat + i - 1, 2));
            }
            continue;
        }
        if (c == '[' && i + 1 < len && pat[i + 1] == ':' && depth) { /* a POSIX class [:alpha:] as it is */
            const char *end = memchr(pat + i, ']', len - i);
            size_t l = end ? (size_t)(end - (pat + i)) + 1 : len - i;
            DFM_TRY(dfm_sbuf_add(out, pat + i, l));
            i += l - 1;
            continue;
        }
        if (c == '[') {
            int neg = i + 1 < len && pat[i + 1] == '^';
            if (depth && neg) return DFM_FAIL(DFM_EUNSUPPORTED, "a negated class inside a class has no PCRE2 form");
            if (!depth) DFM_TRY(dfm_sbuf_add(out, neg ? "[^" : "[", neg ? 2 : 1));
            depth++;
            i += (size_t)neg;
            if (i + 1 < len && pat[i + 1] == ']') { DFM_TRY(dfm_sbuf_add(out, "\\]", 2)); i++; } /* literal ']' first */
            continue;
        }
        if (depth && c == '&' && i + 1 < len && pat[i + 1] == '&')
            return DFM_FAIL(DFM_EUNSUPPORTED, "class intersection (&&) has no PCRE2 form");
        if (depth && c == ']') {
            if (--depth == 0) DFM_TRY(dfm_sbuf_add(out, "]", 1));
            continue;
        }
        DFM_TRY(dfm_sbuf_add(out, &c, 1));
    }
    return dfm_sbuf_add(out, "", 0);
}

/* A plain string as a pattern: every ASCII character that is not a letter or digit escaped (a backslash
 * before one is always literal in PCRE2), the rest as it is. */
static int quote(const char *s, size_t len, sbuf *out) {
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        int alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (c < 0x80 && !alnum) DFM_TRY(dfm_sbuf_add(out, "\\", 1));
        DFM_TRY(dfm_sbuf_add(out, s + i, 1));
    }
    return dfm_sbuf_add(out, "", 0);
}

static int compile_one(const char *pat, size_t len, const sbuf *t, const char *where, int literal, pcre2_code **out) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)t->p, t->n, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return DFM_FAIL(DFM_EUNSUPPORTED, "%s: %s /%.*s/ does not compile with PCRE2 at offset %zu: %s", where,
                        literal ? "pattern" : "regex", (int)(len > 200 ? 200 : len), pat, (size_t)off, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT the interpreter matches the same */
    *out = re;
    return DFM_OK;
}

int dfm_regex_compile(const char *pat, size_t len, int literal, const char *where, dfm_regex **out) {
    *out = NULL;
    dfm_regex *re = calloc(1, sizeof *re);
    if (!re) return DFM_FAIL(DFM_ENOMEM, "no memory");
    sbuf t = {0}, f = {0};
    xlate xe = {.exact = 1}, xf = {0};
    int rc = literal ? quote(pat, len, &t) : translate(&xe, pat, len, &t);
    if (!rc && !literal && xe.ndiff) rc = translate(&xf, pat, len, &f);
    if (rc) dfm_error_prefix("%s: regex /%.*s/", where, (int)(len > 200 ? 200 : len), pat);
    char pv[64] = "";
    pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, pv);
    if (!rc && xe.uses_tables && strcmp(pv, dfm_uc_tables_pcre2_version()))
        rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: its Unicode properties were checked against PCRE2's Unicode %s, not the "
                      "linked %s. HINT: regenerate tokenizer/tok_unicode_tables.h with tests/ref/make_tokenizer_unicode.py",
                      where, dfm_uc_tables_pcre2_version(), pv);
    if (!rc) rc = compile_one(pat, len, &t, where, literal, &re->exact);
    if (!rc && xe.ndiff) rc = compile_one(pat, len, &f, where, literal, &re->fast);
    free(t.p), free(f.p), free(xf.diff);
    re->diff = xe.diff, re->ndiff = xe.ndiff;
    if (rc) {
        dfm_regex_free(re);
        return rc;
    }
    *out = re;
    return DFM_OK;
}

void dfm_regex_free(dfm_regex *re) {
    if (!re) return;
    pcre2_code_free(re->fast);
    pcre2_code_free(re->exact);
    free(re->diff);
    free(re);
}

uint32_t dfm_regex_minlength(const dfm_regex *re) {
    uint32_t m = 1;
    return pcre2_pattern_info(re->exact, PCRE2_INFO_MINLENGTH, &m) ? 1 : m;
}

/* Does s hold a code point of the ranges? ASCII (below every addition) is skipped 8 bytes at a time. */
static int holds(const dfm_regex *re, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        i += (size_t)dfm_utf8_next(s + i, n - i, &cp);
        for (size_t k = 0; k < re->ndiff; k++)
            if (cp >= re->diff[k][0] && cp <= re->diff[k][1]) return 1;
    }
    return 0;
}

void dfm_regex_start(dfm_regex_iter *it, const dfm_regex *re, const uint8_t *s, size_t n) {
    it->code = re->fast && !holds(re, s, n) ? re->fast : re->exact;
    it->pos = 0;
    it->last = SIZE_MAX;
}

void dfm_regex_scratch_free(dfm_regex_scratch *sc) {
    pcre2_match_data_free(sc->md);
    pcre2_match_context_free(sc->mctx);
    pcre2_jit_stack_free(sc->jstack);
    memset(sc, 0, sizeof *sc);
}

int dfm_regex_next(dfm_regex_scratch *sc, dfm_regex_iter *it, const uint8_t *s, size_t n, size_t *ms, size_t *me) {
    if (!sc->md && !(sc->md = pcre2_match_data_create(4, NULL)))
        return DFM_FAIL(DFM_ENOMEM, "no memory for regex match data");
    while (it->pos <= n) {
        int r = pcre2_match(it->code, s, n, it->pos, PCRE2_NO_UTF_CHECK, sc->md, sc->mctx);
        if (r == PCRE2_ERROR_JIT_STACKLIMIT && !sc->jstack) { /* deep backtracking: retry with a big stack */
            sc->mctx = pcre2_match_context_create(NULL);
            sc->jstack = pcre2_jit_stack_create(32 << 10, 64 << 20, NULL);
            if (!sc->mctx || !sc->jstack) return DFM_FAIL(DFM_ENOMEM, "no memory for a regex JIT stack");
            pcre2_jit_stack_assign(sc->mctx, NULL, sc->jstack);
            continue;
        }
        if (r == PCRE2_ERROR_NOMATCH) return 0;
        if (r < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(r, msg, sizeof msg);
            return DFM_FAIL(DFM_EINTERNAL, "regex match failed at byte %zu: %s", it->pos, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
        size_t a = ov[0], b = ov[1];
        if (a == b && it->last == b) { /* an empty match right after the previous one: move on a character */
            if (it->pos >= n) return 0;
            uint32_t cp;
            it->pos += (size_t)dfm_utf8_next(s + it->pos, n - it->pos, &cp);
            continue;
        }
        it->pos = it->last = b;
        *ms = a, *me = b;
        return 1;
    }
    return 0;
}
