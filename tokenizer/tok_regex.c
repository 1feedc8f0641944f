/* tok_regex.c — Oniguruma patterns on PCRE2 (see tok_regex.h). */
#include "tokenizer/tok_regex.h"
#include "tokenizer/tok_internal.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>

/* Oniguruma's Unicode \s (White_Space; PCRE2's UCP \s also matches U+180E and misses U+0085 in some
 * versions) and \w (Letter, Mark, Decimal_Number, Connector_Punctuation; PCRE2 10.42's UCP \w is
 * letters, all numbers and '_'). */
#define ONIG_WS "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define ONIG_W "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"
#define ONIG_H "0-9a-fA-F"

static int add_class(sbuf *out, int in_class, int negate, const char *body) {
    if (in_class) return dfm_sbuf_add(out, body, strlen(body));
    DFM_TRY(dfm_sbuf_add(out, negate ? "[^" : "[", negate ? 2 : 1));
    DFM_TRY(dfm_sbuf_add(out, body, strlen(body)));
    return dfm_sbuf_add(out, "]", 1);
}

static int translate(const char *pat, size_t len, sbuf *out) {
    int in_class = 0;
    for (size_t i = 0; i < len; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char e = pat[i + 1];
            i++;
            if (e == 's') DFM_TRY(add_class(out, in_class, 0, ONIG_WS));
            else if (e == 'S' && !in_class) DFM_TRY(add_class(out, 0, 1, ONIG_WS));
            else if (e == 'w') DFM_TRY(add_class(out, in_class, 0, ONIG_W));
            else if (e == 'W' && !in_class) DFM_TRY(add_class(out, 0, 1, ONIG_W));
            else if (e == 'h') DFM_TRY(add_class(out, in_class, 0, ONIG_H));
            else if (e == 'H' && !in_class) DFM_TRY(add_class(out, 0, 1, ONIG_H));
            else DFM_TRY(dfm_sbuf_add(out, pat + i - 1, 2));
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            DFM_TRY(dfm_sbuf_add(out, "[", 1));
            if (i + 1 < len && pat[i + 1] == '^') { DFM_TRY(dfm_sbuf_add(out, "^", 1)); i++; }
            if (i + 1 < len && pat[i + 1] == ']') { DFM_TRY(dfm_sbuf_add(out, "\\]", 2)); i++; } /* literal ']' first */
            continue;
        }
        if (in_class && c == ']') in_class = 0;
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

int dfm_regex_compile(const char *pat, size_t len, int literal, const char *where, pcre2_code **out) {
    sbuf t = {0};
    int rc = literal ? quote(pat, len, &t) : translate(pat, len, &t);
    if (rc) {
        free(t.p);
        return rc;
    }
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)t.p, t.n, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    free(t.p);
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

void dfm_regex_scratch_free(dfm_regex_scratch *sc) {
    pcre2_match_data_free(sc->md);
    pcre2_match_context_free(sc->mctx);
    pcre2_jit_stack_free(sc->jstack);
    memset(sc, 0, sizeof *sc);
}

int dfm_regex_next(dfm_regex_scratch *sc, const pcre2_code *re, const uint8_t *s, size_t n, size_t *pos, size_t *last,
                   size_t *ms, size_t *me) {
    if (!sc->md && !(sc->md = pcre2_match_data_create(4, NULL)))
        return DFM_FAIL(DFM_ENOMEM, "no memory for regex match data");
    while (*pos <= n) {
        int r = pcre2_match(re, s, n, *pos, PCRE2_NO_UTF_CHECK, sc->md, sc->mctx);
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
            return DFM_FAIL(DFM_EINTERNAL, "regex match failed at byte %zu: %s", *pos, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
        size_t a = ov[0], b = ov[1];
        if (a == b && *last == b) { /* an empty match right after the previous one: move on a character */
            if (*pos >= n) return 0;
            uint32_t cp;
            *pos += (size_t)dfm_utf8_next(s + *pos, n - *pos, &cp);
            continue;
        }
        *pos = *last = b;
        *ms = a, *me = b;
        return 1;
    }
    return 0;
}
