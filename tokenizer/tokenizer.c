/* tokenizer.c — load a Hugging Face tokenizer.json; encode (added tokens, normalizer, pre-tokenizer,
 * BPE) and decode, with the same results as HF `tokenizers` (checked by tests/unit/test_tokenizer.c on
 * golden files made by tests/ref/make_tokenizer_golden.py).
 *
 * Encode order, as HF's TokenizerImpl::encode_single_sequence:
 *   1. invalid UTF-8 -> U+FFFD (the caller of HF does this when turning bytes into a str);
 *   2. added tokens with normalized=false are cut out of the RAW text (leftmost, longest first);
 *   3. each gap is normalized (NFC / Prepend / Replace), then added tokens with normalized=true are
 *      cut out of the normalized gap;
 *   4. each remaining piece goes through the pre-tokenizer stages (Split regex, ByteLevel, Metaspace);
 *   5. each pre-token is BPE-encoded (tok_bpe.c, cached).
 */
#include "tokenizer/tok_internal.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

/* ================================================================ ids */

void dfm_ids_free(dfm_ids *v) {
    if (!v) return;
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

int dfm_ids_push(dfm_ids *v, uint32_t id) {
    if (v->n == v->cap) {
        size_t c = v->cap ? v->cap * 2 : 64;
        uint32_t *p = realloc(v->ids, c * sizeof *p);
        if (!p) return DFM_FAIL(DFM_ENOMEM, "no memory for %zu token ids", c);
        v->ids = p;
        v->cap = c;
    }
    v->ids[v->n++] = id;
    return DFM_OK;
}

/* ================================================================ small helpers */

int dfm_sbuf_reserve(sbuf *b, size_t need) {
    if (b->cap >= need) return DFM_OK;
    size_t c = b->cap ? b->cap : 256;
    while (c < need) c *= 2;
    char *q = realloc(b->p, c);
    if (!q) return DFM_FAIL(DFM_ENOMEM, "no memory for %zu bytes of text", c);
    b->p = q;
    b->cap = c;
    return DFM_OK;
}

int dfm_sbuf_add(sbuf *b, const void *s, size_t n) {
    DFM_TRY(dfm_sbuf_reserve(b, b->n + n + 1));
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return DFM_OK;
}

/* Rust's char::is_whitespace (the White_Space property), also Oniguruma's Unicode \s. */
static int is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static int is_word_cp(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* Code point ending just before position i of valid UTF-8 s. */
static uint32_t cp_before(const uint8_t *s, size_t i, size_t *start) {
    size_t j = i - 1;
    while (j > 0 && (s[j] & 0xC0) == 0x80) j--;
    uint32_t cp;
    dfm_utf8_next(s + j, i - j, &cp);
    if (start) *start = j;
    return cp;
}

/* ================================================================ loading */

typedef struct {
    const char *file;
} load_ctx;

#define LFAIL(lc, code, ...) fail_in((lc), __FILE__, __LINE__, (code), __VA_ARGS__)
static int fail_in(load_ctx *lc, const char *src, int line, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail_in(load_ctx *lc, const char *src, int line, int code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dfm_fail_at(src, line, code, "%s: %s", lc->file, msg);
}

static const char *jstr(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int jbool(json_t *o, const char *key, int def) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

/* Map a token string of tokenizer.json to the raw bytes it stands for (byte-level: through the
 * byte alphabet; a string with a character outside the alphabet is kept as its UTF-8, which is
 * also what HF's ByteLevel decoder emits for it). Appends to b, returns the length. */
static int token_raw(const dfm_tokenizer *tok, const char *s, size_t n, sbuf *b, size_t *len) {
    size_t start = b->n;
    if (tok->byte_level) {
        DFM_TRY(dfm_sbuf_reserve(b, b->n + n + 1));
        size_t i = 0;
        while (i < n) {
            uint32_t cp;
            int l = dfm_utf8_next((const uint8_t *)s + i, n - i, &cp);
            int byte = dfm_bytelevel_byte(cp);
            if (byte < 0) break;
            b->p[b->n++] = (char)byte;
            i += (size_t)l;
        }
        if (i == n) {
            *len = b->n - start;
            return DFM_OK;
        }
        b->n = start;
    }
    DFM_TRY(dfm_sbuf_add(b, s, n));
    *len = n;
    return DFM_OK;
}

/* Translate Oniguruma \s / \S (Unicode White_Space) to explicit classes: PCRE2's UCP \s also
 * matches U+180E and misses U+0085 in some versions; this makes the two engines agree. */
#define ONIG_WS "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
static int translate_regex(const char *pat, sbuf *out) {
    int in_class = 0;
    for (size_t i = 0; pat[i]; i++) {
        char c = pat[i];
        if (c == '\\' && pat[i + 1]) {
            char e = pat[i + 1];
            if (e == 's') DFM_TRY(in_class ? dfm_sbuf_add(out, ONIG_WS, strlen(ONIG_WS)) : dfm_sbuf_add(out, "[" ONIG_WS "]", strlen(ONIG_WS) + 2));
            else if (e == 'S' && !in_class) DFM_TRY(dfm_sbuf_add(out, "[^" ONIG_WS "]", strlen(ONIG_WS) + 3));
            else DFM_TRY(dfm_sbuf_add(out, pat + i, 2));
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            DFM_TRY(dfm_sbuf_add(out, "[", 1));
            if (pat[i + 1] == '^') { DFM_TRY(dfm_sbuf_add(out, "^", 1)); i++; }
            if (pat[i + 1] == ']') { DFM_TRY(dfm_sbuf_add(out, "]", 1)); i++; } /* literal ']' first in a class */
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        DFM_TRY(dfm_sbuf_add(out, &c, 1));
    }
    if (!out->p) DFM_TRY(dfm_sbuf_add(out, "", 0));
    return DFM_OK;
}

static int compile_regex(load_ctx *lc, const char *pat, const char *where, pcre2_code **out) {
    sbuf t = {0};
    int rc = translate_regex(pat, &t);
    if (rc) return rc;
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)t.p, t.n, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    free(t.p);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return LFAIL(lc, DFM_EUNSUPPORTED, "%s: regex /%s/ does not compile with PCRE2 at offset %zu: %s", where, pat,
                     (size_t)off, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT the interpreter still matches the same */
    *out = re;
    return DFM_OK;
}

/* GPT-2's pattern, used by ByteLevel with use_regex = true. */
static const char *GPT2_RE = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_pre_stage(load_ctx *lc, dfm_tokenizer *tok, json_t *p, const char *where);

static int push_pre(dfm_tokenizer *tok, dfm_pre_stage st) {
    if (tok->n_pre == 8) {
        pcre2_code_free(st.re);
        return DFM_FAIL(DFM_EUNSUPPORTED, "pre_tokenizer: more than 8 pre-tokenizer stages are not supported");
    }
    dfm_pre_stage *q = realloc(tok->pre, (tok->n_pre + 1) * sizeof *q);
    if (!q) return DFM_FAIL(DFM_ENOMEM, "no memory");
    tok->pre = q;
    tok->pre[tok->n_pre++] = st;
    return DFM_OK;
}

static int add_pre_stage(load_ctx *lc, dfm_tokenizer *tok, json_t *p, const char *where) {
    if (!p || json_is_null(p)) return DFM_OK;
    const char *type = jstr(p, "type");
    char sub[200];
    if (!type) return LFAIL(lc, DFM_EFORMAT, "%s has no \"type\"", where);
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers");
        if (!json_is_array(arr)) return LFAIL(lc, DFM_EFORMAT, "%s.pretokenizers is not an array", where);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", where, i);
            DFM_TRY(add_pre_stage(lc, tok, json_array_get(arr, i), sub));
        }
        return DFM_OK;
    }
    dfm_pre_stage st = {0};
    if (!strcmp(type, "Split")) {
        const char *beh = jstr(p, "behavior");
        json_t *pat = json_object_get(p, "pattern");
        const char *re = jstr(pat, "Regex");
        const char *lit = jstr(pat, "String");
        if (!beh || strcmp(beh, "Isolated"))
            return LFAIL(lc, DFM_EUNSUPPORTED, "%s: Split behavior \"%s\" is not supported (only Isolated)", where,
                         beh ? beh : "(none)");
        if (jbool(p, "invert", 0)) return LFAIL(lc, DFM_EUNSUPPORTED, "%s: Split with invert=true is not supported", where);
        if (!re && !lit) return LFAIL(lc, DFM_EFORMAT, "%s.pattern has neither Regex nor String", where);
        st.kind = DFM_PRE_SPLIT;
        if (re) {
            DFM_TRY(compile_regex(lc, re, where, &st.re));
        } else { /* a literal string: quote it for PCRE2 */
            sbuf q = {0};
            DFM_TRY(dfm_sbuf_add(&q, "\\Q", 2));
            DFM_TRY(dfm_sbuf_add(&q, lit, strlen(lit)));
            DFM_TRY(dfm_sbuf_add(&q, "\\E", 2));
            int err;
            PCRE2_SIZE off;
            st.re = pcre2_compile((PCRE2_SPTR)q.p, q.n, PCRE2_UTF, &err, &off, NULL);
            free(q.p);
            if (!st.re) return LFAIL(lc, DFM_EUNSUPPORTED, "%s: literal split pattern does not compile", where);
        }
        return push_pre(tok, st);
    }
    if (!strcmp(type, "Digits")) {
        /* tokenizers splits on char::is_numeric, Unicode's N* categories: PCRE2's \p{N}. Isolated, one piece per
         * digit, or Contiguous, one per run of digits. */
        st.kind = DFM_PRE_SPLIT;
        st.label = "Digits";
        DFM_TRY(compile_regex(lc, jbool(p, "individual_digits", 0) ? "\\p{N}" : "\\p{N}+", where, &st.re));
        return push_pre(tok, st);
    }
    if (!strcmp(type, "ByteLevel")) {
        st.kind = DFM_PRE_BYTELEVEL;
        st.add_prefix_space = jbool(p, "add_prefix_space", 1);
        if (jbool(p, "use_regex", 1)) DFM_TRY(compile_regex(lc, GPT2_RE, where, &st.re));
        tok->byte_level = 1;
        return push_pre(tok, st);
    }
    if (!strcmp(type, "Metaspace")) {
        const char *rep = jstr(p, "replacement");
        const char *scheme = jstr(p, "prepend_scheme");
        if (rep && strcmp(rep, "\xe2\x96\x81"))
            return LFAIL(lc, DFM_EUNSUPPORTED, "%s: Metaspace replacement other than \"\xe2\x96\x81\" is not supported", where);
        st.kind = DFM_PRE_METASPACE;
        st.add_prefix_space = scheme ? strcmp(scheme, "never") != 0 : jbool(p, "add_prefix_space", 1);
        st.prepend_first_only = scheme && !strcmp(scheme, "first");
        if (!jbool(p, "split", 1)) st.re = NULL; else {
            int err;
            PCRE2_SIZE off;
            /* MergedWithNext on "▁": each piece starts at a ▁ */
            st.re = pcre2_compile((PCRE2_SPTR) "\xe2\x96\x81[^\xe2\x96\x81]*|[^\xe2\x96\x81]+", PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF, &err, &off, NULL);
            if (!st.re) return LFAIL(lc, DFM_EINTERNAL, "%s: Metaspace split regex", where);
            pcre2_jit_compile(st.re, PCRE2_JIT_COMPLETE);
        }
        return push_pre(tok, st);
    }
    return LFAIL(lc, DFM_EUNSUPPORTED, "%s: pre-tokenizer type \"%s\" is not supported (supported: Sequence, Split, "
                 "Digits, ByteLevel, Metaspace)", where, type);
}

static int push_norm(dfm_tokenizer *tok, dfm_norm_stage st) {
    dfm_norm_stage *q = realloc(tok->norm, (tok->n_norm + 1) * sizeof *q);
    if (!q) return DFM_FAIL(DFM_ENOMEM, "no memory");
    tok->norm = q;
    tok->norm[tok->n_norm++] = st;
    return DFM_OK;
}

static int add_norm_stage(load_ctx *lc, dfm_tokenizer *tok, json_t *p, const char *where) {
    if (!p || json_is_null(p)) return DFM_OK;
    const char *type = jstr(p, "type");
    char sub[200];
    if (!type) return LFAIL(lc, DFM_EFORMAT, "%s has no \"type\"", where);
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "normalizers");
        if (!json_is_array(arr)) return LFAIL(lc, DFM_EFORMAT, "%s.normalizers is not an array", where);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", where, i);
            DFM_TRY(add_norm_stage(lc, tok, json_array_get(arr, i), sub));
        }
        return DFM_OK;
    }
    dfm_norm_stage st = {0};
    if (!strcmp(type, "NFC")) {
        st.kind = DFM_NORM_NFC;
        return push_norm(tok, st);
    }
    if (!strcmp(type, "Prepend")) {
        const char *s = jstr(p, "prepend");
        if (!s) return LFAIL(lc, DFM_EFORMAT, "%s.prepend is missing", where);
        st.kind = DFM_NORM_PREPEND;
        st.a = strdup(s);
        st.alen = strlen(s);
        if (!st.a) return DFM_FAIL(DFM_ENOMEM, "no memory");
        return push_norm(tok, st);
    }
    if (!strcmp(type, "Replace")) {
        const char *from = jstr(json_object_get(p, "pattern"), "String");
        const char *to = jstr(p, "content");
        if (!from || !to || !*from)
            return LFAIL(lc, DFM_EUNSUPPORTED, "%s: Replace is supported with a non-empty String pattern only", where);
        st.kind = DFM_NORM_REPLACE;
        st.a = strdup(from), st.alen = strlen(from);
        st.b = strdup(to), st.blen = strlen(to);
        if (!st.a || !st.b) { free(st.a), free(st.b); return DFM_FAIL(DFM_ENOMEM, "no memory"); }
        return push_norm(tok, st);
    }
    return LFAIL(lc, DFM_EUNSUPPORTED, "%s: normalizer type \"%s\" is not supported (supported: NFC, Prepend, Replace, "
                 "Sequence)", where, type);
}

enum { DEC_BYTELEVEL = 1, DEC_SPM = 2, DEC_METASPACE = 3 };

/* SentencePiece decoders: Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)] or
 * Metaspace. Both give: "▁" -> " ", <0xNN> tokens -> bytes, one leading space removed. */
static int check_decoder(load_ctx *lc, dfm_tokenizer *tok, json_t *d) {
    const char *type = jstr(d, "type");
    if (!type) return LFAIL(lc, DFM_EUNSUPPORTED, "decoder: none given; only ByteLevel and SentencePiece-style "
                            "decoders are supported");
    if (!strcmp(type, "ByteLevel")) {
        tok->decoder_kind = DEC_BYTELEVEL;
        return DFM_OK;
    }
    if (!strcmp(type, "Metaspace")) {
        const char *rep = jstr(d, "replacement"), *scheme = jstr(d, "prepend_scheme");
        if (rep && strcmp(rep, "\xe2\x96\x81"))
            return LFAIL(lc, DFM_EUNSUPPORTED, "decoder: Metaspace replacement other than \"\xe2\x96\x81\" is not supported");
        tok->decoder_kind = DEC_METASPACE;
        /* HF: in the first token every "▁" is dropped unless prepend_scheme is "never" */
        tok->dec_strip = scheme ? strcmp(scheme, "never") != 0 : jbool(d, "add_prefix_space", 1);
        return DFM_OK;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(d, "decoders");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            json_t *x = json_array_get(arr, i);
            const char *t = jstr(x, "type");
            int ok = 0;
            if (t && !strcmp(t, "Replace")) {
                const char *from = jstr(json_object_get(x, "pattern"), "String"), *to = jstr(x, "content");
                ok = from && to && !strcmp(from, "\xe2\x96\x81") && !strcmp(to, " ");
            } else if (t && !strcmp(t, "ByteFallback")) {
                ok = 1;
                tok->dec_byte_fallback = 1;
            } else if (t && !strcmp(t, "Fuse")) {
                ok = 1;
            } else if (t && !strcmp(t, "Strip")) {
                const char *c = jstr(x, "content");
                json_t *st = json_object_get(x, "start"), *sp = json_object_get(x, "stop");
                ok = c && !strcmp(c, " ") && json_integer_value(st) == 1 && json_integer_value(sp) == 0;
                tok->dec_strip = 1;
            }
            if (!ok)
                return LFAIL(lc, DFM_EUNSUPPORTED, "decoder.decoders[%zu]: decoder \"%s\" is not supported in this "
                             "sequence (supported: Replace(\"\xe2\x96\x81\",\" \"), ByteFallback, Fuse, Strip(\" \",1,0))",
                             i, t ? t : "(no type)");
        }
        tok->decoder_kind = DEC_SPM;
        return DFM_OK;
    }
    return LFAIL(lc, DFM_EUNSUPPORTED, "decoder: type \"%s\" is not supported (supported: ByteLevel, Metaspace, "
                 "SentencePiece Sequence)", type);
}

static int grow_ids(dfm_tokenizer *tok, uint32_t need) {
    if (need <= tok->n_ids) return DFM_OK;
    uint32_t n = need;
    char **k = realloc(tok->key, n * sizeof *k);
    if (k) tok->key = k;
    uint32_t *kl = realloc(tok->key_len, n * sizeof *kl);
    if (kl) tok->key_len = kl;
    char **d = realloc(tok->dec, n * sizeof *d);
    if (d) tok->dec = d;
    uint32_t *dl = realloc(tok->dec_len, n * sizeof *dl);
    if (dl) tok->dec_len = dl;
    uint8_t *sp = realloc(tok->is_special, n);
    if (sp) tok->is_special = sp;
    if (!k || !kl || !d || !dl || !sp) return DFM_FAIL(DFM_ENOMEM, "no memory for %u token ids", n);
    for (uint32_t i = tok->n_ids; i < n; i++) {
        tok->key[i] = tok->dec[i] = NULL;
        tok->key_len[i] = tok->dec_len[i] = 0;
        tok->is_special[i] = 0;
    }
    tok->n_ids = n;
    return DFM_OK;
}

/* Bytes decode emits for token string s (SentencePiece: "▁" -> " "; <0xNN> handled at decode). */
static int make_dec(dfm_tokenizer *tok, uint32_t id, const char *s, size_t n) {
    sbuf b = {0};
    size_t len = 0;
    if (tok->decoder_kind == DEC_BYTELEVEL) {
        int save = tok->byte_level;
        tok->byte_level = 1;
        int rc = token_raw(tok, s, n, &b, &len);
        tok->byte_level = save;
        DFM_TRY(rc);
    } else {
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && !memcmp(s + i, "\xe2\x96\x81", 3)) { DFM_TRY(dfm_sbuf_add(&b, " ", 1)); i += 3; }
            else { DFM_TRY(dfm_sbuf_add(&b, s + i, 1)); i++; }
        }
        len = b.n;
    }
    if (!b.p) DFM_TRY(dfm_sbuf_add(&b, "", 0));
    if (tok->dec[id] != tok->key[id]) free(tok->dec[id]);
    tok->dec[id] = b.p;
    tok->dec_len[id] = (uint32_t)len;
    return DFM_OK;
}

static int set_key(dfm_tokenizer *tok, uint32_t id, const char *s, size_t n) {
    sbuf b = {0};
    size_t len;
    DFM_TRY(token_raw(tok, s, n, &b, &len));
    if (!b.p) DFM_TRY(dfm_sbuf_add(&b, "", 0));
    tok->key[id] = b.p; /* only ever set once (callers check), so nothing to free */
    tok->key_len[id] = (uint32_t)len;
    return DFM_OK;
}

static int is_byte_token(const char *s, size_t n, int *byte) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return 0;
    unsigned v;
    char hex[3] = {s[3], s[4], 0};
    if (sscanf(hex, "%2x", &v) != 1) return 0;
    *byte = (int)v;
    return 1;
}

static int build_matcher(dfm_tokenizer *tok, dfm_added_matcher *m, int normalized) {
    size_t n = 0;
    for (size_t i = 0; i < tok->n_added; i++) n += (tok->added[i].normalized == normalized && tok->added[i].len);
    m->order = calloc(n ? n : 1, sizeof *m->order);
    if (!m->order) return DFM_FAIL(DFM_ENOMEM, "no memory");
    m->n = n;
    /* counting sort by first byte, then longest first within a byte (insertion sort: few tokens) */
    uint32_t count[257] = {0};
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].normalized == normalized && tok->added[i].len) count[(uint8_t)tok->added[i].content[0] + 1]++;
    for (int b = 0; b < 256; b++) count[b + 1] += count[b];
    memcpy(m->first, count, sizeof count);
    uint32_t fill[256];
    memcpy(fill, count, sizeof fill);
    for (size_t i = 0; i < tok->n_added; i++) {
        const dfm_added_token *a = &tok->added[i];
        if (a->normalized != normalized || !a->len) continue;
        uint8_t b = (uint8_t)a->content[0];
        uint32_t j = fill[b]++;
        while (j > m->first[b] && tok->added[m->order[j - 1]].len < a->len) {
            m->order[j] = m->order[j - 1];
            j--;
        }
        m->order[j] = (uint32_t)i;
    }
    return DFM_OK;
}

static int normalize_segment(const dfm_tokenizer *tok, const char *s, size_t n, sbuf *out, sbuf *tmp);

/* model: type BPE and its options; then the normalizer, pre-tokenizer and decoder stages */
static int load_model_head(load_ctx *lc, dfm_tokenizer *tok, json_t *root) {
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return LFAIL(lc, DFM_EFORMAT, "model: missing or not an object");
    const char *mtype = jstr(model, "type");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (!mtype && !merges) return LFAIL(lc, DFM_EFORMAT, "model.type: missing");
    if (mtype && strcmp(mtype, "BPE"))
        return LFAIL(lc, DFM_EUNSUPPORTED, "model.type: \"%s\" is not supported (only BPE). HINT: use a byte-level BPE "
                     "(GPT-2, Llama-3, Qwen) or SentencePiece-BPE (Llama-2, Mistral) tokenizer", mtype);
    if (!json_is_object(vocab)) return LFAIL(lc, DFM_EFORMAT, "model.vocab: missing or not an object");
    if (!json_is_array(merges)) return LFAIL(lc, DFM_EFORMAT, "model.merges: missing or not an array");
    json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0)
        return LFAIL(lc, DFM_EUNSUPPORTED, "model.dropout: BPE dropout is not supported");
    const char *cs = jstr(model, "continuing_subword_prefix"), *ew = jstr(model, "end_of_word_suffix");
    if ((cs && *cs) || (ew && *ew))
        return LFAIL(lc, DFM_EUNSUPPORTED, "model.%s: subword prefixes/suffixes are not supported",
                     cs && *cs ? "continuing_subword_prefix" : "end_of_word_suffix");
    tok->byte_fallback = jbool(model, "byte_fallback", 0);
    tok->fuse_unk = jbool(model, "fuse_unk", 0);
    tok->ignore_merges = jbool(model, "ignore_merges", 0);

    DFM_TRY(add_norm_stage(lc, tok, json_object_get(root, "normalizer"), "normalizer"));
    DFM_TRY(add_pre_stage(lc, tok, json_object_get(root, "pre_tokenizer"), "pre_tokenizer"));
    DFM_TRY(check_decoder(lc, tok, json_object_get(root, "decoder")));
    if (tok->decoder_kind == DEC_BYTELEVEL && !tok->byte_level)
        return LFAIL(lc, DFM_EUNSUPPORTED, "decoder: ByteLevel decoder without a ByteLevel pre-tokenizer is not supported");
    if (tok->byte_level && tok->decoder_kind != DEC_BYTELEVEL)
        return LFAIL(lc, DFM_EUNSUPPORTED, "decoder: a ByteLevel pre-tokenizer needs the ByteLevel decoder");
    return DFM_OK;
}

/* model.vocab and the ids of added_tokens: the id tables, keys, decode strings and the vocabulary map */
static int load_vocab(load_ctx *lc, dfm_tokenizer *tok, json_t *vocab, json_t *added) {
    uint32_t max_id = 0;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1LL << 31))
            return LFAIL(lc, DFM_EFORMAT, "model.vocab[\"%s\"]: id is not a non-negative integer", k);
        if ((uint32_t)json_integer_value(v) + 1 > max_id) max_id = (uint32_t)json_integer_value(v) + 1;
    }
    if (added && !json_is_array(added)) return LFAIL(lc, DFM_EFORMAT, "added_tokens: not an array");
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        json_t *id = json_object_get(a, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1LL << 31) || !jstr(a, "content"))
            return LFAIL(lc, DFM_EFORMAT, "added_tokens[%zu]: needs an integer \"id\" and a string \"content\"", i);
        if ((uint32_t)json_integer_value(id) + 1 > max_id) max_id = (uint32_t)json_integer_value(id) + 1;
    }
    /* The id tables are indexed by id, so their size must be bounded by what the file holds, not by the
     * largest id it claims: one added token with id 2^31-1 would otherwise allocate and zero ~50 GB. Real
     * tokenizers number their entries densely (Qwen2.5, Llama-3: every id below the count is used); a few
     * holes are allowed. */
    size_t n_entries = json_object_size(vocab) + json_array_size(added);
    uint64_t id_bound = 2 * (uint64_t)n_entries + 1024;
    if (max_id > id_bound)
        return LFAIL(lc, DFM_EFORMAT, "token id %u is far beyond the %zu entries of model.vocab and added_tokens "
                     "(ids must stay below 2 x entries + 1024 = %llu). HINT: the file is corrupt or crafted; use "
                     "the tokenizer.json published with the model", max_id - 1, n_entries, (unsigned long long)id_bound);
    DFM_TRY(grow_ids(tok, max_id));
    size_t n_vocab = 0;
    json_object_foreach(vocab, k, v) {
        uint32_t id = (uint32_t)json_integer_value(v);
        size_t kl = strlen(k);
        if (tok->key[id]) return LFAIL(lc, DFM_EFORMAT, "model.vocab[\"%s\"]: id %u used twice", k, id);
        DFM_TRY(set_key(tok, id, k, kl));
        if (tok->decoder_kind == DEC_BYTELEVEL) { /* the raw bytes are exactly what decode emits */
            tok->dec[id] = tok->key[id];
            tok->dec_len[id] = tok->key_len[id];
        } else {
            DFM_TRY(make_dec(tok, id, k, kl));
        }
        n_vocab++;
    }
    DFM_TRY(dfm_strmap_init(&tok->vocab, n_vocab, (const char *const *)tok->key, tok->key_len));
    for (uint32_t id = 0; id < tok->n_ids; id++)
        if (tok->key[id]) dfm_strmap_put(&tok->vocab, id);
    return DFM_OK;
}

/* the byte tokens (byte-level alphabet or byte fallback) and the unknown token */
static int load_byte_tokens(dfm_tokenizer *tok, json_t *model) {
    for (int b = 0; b < 256; b++) tok->byte_id[b] = -1;
    if (tok->byte_level) {
        for (int b = 0; b < 256; b++) {
            uint8_t c = (uint8_t)b;
            int64_t id = dfm_strmap_get(&tok->vocab, &c, 1);
            tok->byte_id[b] = (int32_t)id;
        }
    } else if (tok->byte_fallback) {
        for (uint32_t id = 0; id < tok->n_ids; id++) {
            int byte;
            if (tok->key[id] && is_byte_token(tok->key[id], tok->key_len[id], &byte) && tok->byte_id[byte] < 0)
                tok->byte_id[byte] = (int32_t)id;
        }
    }
    tok->unk_id = -1;
    const char *unk = jstr(model, "unk_token");
    if (unk) {
        sbuf b = {0};
        size_t len;
        DFM_TRY(token_raw(tok, unk, strlen(unk), &b, &len));
        tok->unk_id = dfm_strmap_get(&tok->vocab, b.p, len);
        free(b.p);
    }
    return DFM_OK;
}

/* model.merges ("a b" or ["a", "b"]) into the merge map, ranked by position */
static int load_merges(load_ctx *lc, dfm_tokenizer *tok, json_t *merges) {
    size_t nm = json_array_size(merges);
    DFM_TRY(dfm_mergemap_init(&tok->merges, nm));
    sbuf kb = {0};
    int rc = DFM_OK;
    for (size_t i = 0; i < nm && !rc; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = LFAIL(lc, DFM_EFORMAT, "model.merges[%zu]: \"%s\" is not two tokens separated by one space", i, a);
                break;
            }
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            al = json_string_length(json_array_get(m, 0));
            bl = json_string_length(json_array_get(m, 1));
        } else {
            rc = LFAIL(lc, DFM_EFORMAT, "model.merges[%zu]: neither \"a b\" nor [\"a\", \"b\"]", i);
            break;
        }
        size_t ka, kbn;
        kb.n = 0;
        if ((rc = token_raw(tok, a, al, &kb, &ka))) break;
        if ((rc = token_raw(tok, b, bl, &kb, &kbn))) break;
        int64_t ia = dfm_strmap_get(&tok->vocab, kb.p, ka);
        int64_t ib = dfm_strmap_get(&tok->vocab, kb.p + ka, kbn);
        int64_t im = dfm_strmap_get(&tok->vocab, kb.p, ka + kbn);
        if (ia < 0 || ib < 0 || im < 0) {
            rc = LFAIL(lc, DFM_EFORMAT, "model.merges[%zu]: \"%.*s\" + \"%.*s\": %s is not in model.vocab", i, (int)al, a,
                       (int)bl, b, ia < 0 ? "the first token" : ib < 0 ? "the second token" : "the merged token");
            break;
        }
        dfm_mergemap_put(&tok->merges, (uint32_t)ia, (uint32_t)ib, (uint32_t)i, (uint32_t)im);
    }
    free(kb.p);
    if (!rc) tok->n_merges = (uint32_t)nm;
    return rc;
}

/* added tokens: content, flags; ids outside the model vocabulary get their key and decode here (unless
 * ids_ready: the id tables came from a cache file that already holds them); then the matchers that find
 * them in raw and normalized text */
static int load_added(load_ctx *lc, dfm_tokenizer *tok, json_t *added, int ids_ready) {
    int rc = DFM_OK;
    if (added && !json_is_array(added)) return LFAIL(lc, DFM_EFORMAT, "added_tokens: not an array");
    tok->n_added = json_array_size(added);
    tok->added = calloc(tok->n_added ? tok->n_added : 1, sizeof *tok->added);
    if (!tok->added) return DFM_FAIL(DFM_ENOMEM, "no memory");
    sbuf nb = {0}, tb = {0};
    for (size_t i = 0; i < tok->n_added && !rc; i++) {
        json_t *a = json_array_get(added, i);
        dfm_added_token *t = &tok->added[i];
        const char *content = jstr(a, "content");
        size_t clen = json_string_length(json_object_get(a, "content"));
        json_t *jid = json_object_get(a, "id");
        if (!content || !json_is_integer(jid) || json_integer_value(jid) < 0 || json_integer_value(jid) >= tok->n_ids) {
            rc = LFAIL(lc, DFM_EFORMAT, "added_tokens[%zu]: needs a string \"content\" and an integer \"id\" below %u", i,
                       tok->n_ids);
            break;
        }
        t->id = (uint32_t)json_integer_value(jid);
        t->special = jbool(a, "special", 0);
        t->lstrip = jbool(a, "lstrip", 0);
        t->rstrip = jbool(a, "rstrip", 0);
        t->single_word = jbool(a, "single_word", 0);
        t->normalized = jbool(a, "normalized", !t->special);
        if (t->normalized) { /* matched against normalized text: normalize the content the same way */
            nb.n = 0;
            if ((rc = normalize_segment(tok, content, clen, &nb, &tb))) break;
            t->content = malloc(nb.n + 1);
            if (t->content) memcpy(t->content, nb.p ? nb.p : "", nb.n), t->content[nb.n] = 0;
            t->len = (uint32_t)nb.n;
        } else {
            t->content = strdup(content);
            t->len = (uint32_t)clen;
        }
        if (!t->content) { rc = DFM_FAIL(DFM_ENOMEM, "no memory"); break; }
        if (t->special) tok->is_special[t->id] = 1;
        if (ids_ready) {
            if (!tok->key[t->id] || !tok->dec[t->id])
                rc = LFAIL(lc, DFM_EFORMAT, "added_tokens[%zu]: id %u has no token", i, t->id);
            continue;
        }
        /* HF decodes added tokens by their content (normalized, if the token is) through the decoder */
        if ((rc = t->normalized ? make_dec(tok, t->id, t->content, t->len) : make_dec(tok, t->id, content, clen))) break;
        if (!tok->key[t->id] && (rc = set_key(tok, t->id, content, clen))) break;
    }
    free(nb.p);
    free(tb.p);
    if (rc) return rc;
    DFM_TRY(build_matcher(tok, &tok->raw_matcher, 0));
    DFM_TRY(build_matcher(tok, &tok->norm_matcher, 1));
    return DFM_OK;
}

/* the one-line description */
static void describe(dfm_tokenizer *tok) {
    char pre[96] = "", nrm[64] = "";
    for (size_t i = 0; i < tok->n_pre; i++) {
        const char *nm2 = tok->pre[i].label                   ? tok->pre[i].label
                          : tok->pre[i].kind == DFM_PRE_SPLIT     ? "Split"
                          : tok->pre[i].kind == DFM_PRE_BYTELEVEL ? "ByteLevel"
                                                                  : "Metaspace";
        snprintf(pre + strlen(pre), sizeof pre - strlen(pre), "%s%s", i ? "+" : "", nm2);
    }
    for (size_t i = 0; i < tok->n_norm; i++) {
        const char *nm2 = tok->norm[i].kind == DFM_NORM_NFC ? "NFC" : tok->norm[i].kind == DFM_NORM_PREPEND ? "Prepend" : "Replace";
        snprintf(nrm + strlen(nrm), sizeof nrm - strlen(nrm), "%s%s", i ? "+" : "", nm2);
    }
    snprintf(tok->describe, sizeof tok->describe, "%s BPE, %u merges, %u ids, normalizer %s, pre-tokenizer %s",
             tok->byte_level ? "byte-level" : tok->byte_fallback ? "SentencePiece-style (byte fallback)" : "SentencePiece-style",
             tok->n_merges, tok->n_ids, tok->n_norm ? nrm : "none", tok->n_pre ? pre : "none");
}

static int load_json(load_ctx *lc, dfm_tokenizer *tok, json_t *root) {
    DFM_TRY(load_model_head(lc, tok, root));
    json_t *model = json_object_get(root, "model");
    json_t *added = json_object_get(root, "added_tokens");
    DFM_TRY(load_vocab(lc, tok, json_object_get(model, "vocab"), added));
    DFM_TRY(load_byte_tokens(tok, model));
    DFM_TRY(load_merges(lc, tok, json_object_get(model, "merges")));
    DFM_TRY(load_added(lc, tok, added, 0));
    describe(tok);
    return DFM_OK;
}

/* tokenizer.json without model.vocab and model.merges (they are in the cache file's tables), as
 * compact JSON: what load_model_head and load_added read again when the cache is mapped. */
static char *meta_json(json_t *root, size_t *len) {
    json_t *meta = json_object(), *model = json_object();
    json_t *src_model = json_object_get(root, "model");
    const char *k;
    json_t *v;
    char *s = NULL;
    if (meta && model) {
        json_object_foreach(root, k, v) if (strcmp(k, "model")) json_object_set(meta, k, v);
        json_object_foreach(src_model, k, v) {
            if (strcmp(k, "vocab") && strcmp(k, "merges")) json_object_set(model, k, v);
        }
        json_object_set_new(model, "vocab", json_object());
        json_object_set_new(model, "merges", json_array());
        json_object_set(meta, "model", model);
        s = json_dumps(meta, JSON_COMPACT);
    }
    json_decref(model);
    json_decref(meta);
    if (s) *len = strlen(s);
    return s;
}

int dfm_tokenizer_load_cachefile(const char *cache_path, uint64_t src_hash, uint64_t src_bytes, dfm_tokenizer **out) {
    *out = NULL;
    const uint8_t *map = NULL;
    size_t bytes = 0;
    DFM_TRY(dfm_map_file(cache_path, NULL, &map, &bytes));
    load_ctx lc = {cache_path};
    dfm_tokfile f;
    json_t *root = NULL;
    dfm_tokenizer *tok = NULL;
    int rc = dfm_tokfile_check(map, bytes, src_hash, src_bytes, &f);
    if (rc) {
        dfm_error_prefix("%s", cache_path);
        dfm_unmap_file(map, bytes);
        return rc;
    }
    tok = calloc(1, sizeof *tok);
    if (!tok) {
        dfm_unmap_file(map, bytes);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    tok->map = map, tok->map_bytes = bytes, tok->hash = src_hash;
    rc = dfm_tok_cache_init(tok);
    if (!rc) rc = dfm_tokfile_fill(tok, &f);
    if (rc) dfm_error_prefix("%s", cache_path);
    if (!rc) {
        json_error_t jerr;
        root = json_loadb((const char *)f.sec[DFM_TOKC_META], f.sec_bytes[DFM_TOKC_META], JSON_REJECT_DUPLICATES,
                          &jerr);
        if (!json_is_object(root)) rc = LFAIL(&lc, DFM_EFORMAT, "meta section is not a JSON object: %s", jerr.text);
    }
    if (!rc) rc = load_model_head(&lc, tok, root);
    if (!rc) rc = load_added(&lc, tok, json_object_get(root, "added_tokens"), 1);
    json_decref(root);
    if (rc) {
        dfm_tokenizer_free(tok);
        return rc;
    }
    describe(tok);
    *out = tok;
    return DFM_OK;
}

/* Parse the JSON text; on success *meta (may be NULL) receives what a cache file needs besides the
 * tables. */
static int load_parsed(load_ctx *lc, const char *buf, size_t len, uint64_t hash, char **meta, size_t *meta_len,
                       dfm_tokenizer **out) {
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    dfm_tokenizer *tok = NULL;
    int rc = DFM_OK;
    if (!root) {
        rc = LFAIL(lc, DFM_EFORMAT, "not valid JSON at line %d column %d: %s", jerr.line, jerr.column, jerr.text);
        goto done;
    }
    if (!json_is_object(root)) {
        rc = LFAIL(lc, DFM_EFORMAT, "top level is not a JSON object");
        goto done;
    }
    tok = calloc(1, sizeof *tok);
    if (!tok) {
        rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        goto done;
    }
    tok->hash = hash;
    rc = dfm_tok_cache_init(tok);
    if (!rc) rc = load_json(lc, tok, root);
    if (!rc && meta) *meta = meta_json(root, meta_len);
done:
    json_decref(root);
    if (rc) {
        dfm_tokenizer_free(tok);
        return rc;
    }
    *out = tok;
    return DFM_OK;
}

int dfm_tokenizer_load(const char *path, dfm_tokenizer **out) {
    *out = NULL;
    char *file = NULL;
    struct stat st;
    if (!stat(path, &st) && S_ISDIR(st.st_mode)) file = dfm_path_join(path, "tokenizer.json");
    else file = strdup(path);
    if (!file) return DFM_FAIL(DFM_ENOMEM, "no memory");
    const uint8_t *map = NULL; /* mapped, not read: with a valid cache file only its hash is needed */
    size_t len = 0;
    int rc = dfm_map_file(file, NULL, &map, &len);
    if (rc) {
        dfm_error_prefix("loading tokenizer %s (HINT: pass a tokenizer.json or its folder; 'make deps' installs "
                         "the default ones)", file);
        free(file);
        return rc;
    }
    const char *buf = map ? (const char *)map : "";
    uint64_t hash = dfm_checksum64(buf, len);
    char *cache = NULL, *meta = NULL;
    size_t meta_len = 0;
    if (dfm_tokfile_path(hash, &cache)) dfm_error_clear(); /* no memory for a path: parse, as without a cache */
    if (cache && dfm_path_exists(cache)) {
        if (!dfm_tokenizer_load_cachefile(cache, hash, len, out)) goto done;
        /* stale, corrupt, truncated or unreadable: never trusted, rebuilt below */
        DFM_LOG_W("ignoring the tokenizer cache (%s); parsing %s and rewriting the cache", dfm_last_error(), file);
        dfm_error_clear();
    }
    load_ctx lc = {file};
    rc = load_parsed(&lc, buf, len, hash, cache ? &meta : NULL, &meta_len, out);
    if (!rc && cache) {
        if (!meta || dfm_tokfile_write(*out, meta, meta_len, len, cache)) {
            DFM_LOG_W("could not write the tokenizer cache %s (%s): each load parses %s again. HINT: set "
                      "DFM_TOKENIZER_CACHE to a writable folder, or to 'off'", cache, meta ? dfm_last_error() : "no memory",
                      file);
            dfm_error_clear();
        }
    }
done:
    free(meta);
    free(cache);
    dfm_unmap_file(map, len);
    free(file);
    return rc;
}

int dfm_tokenizer_from_cache(const dfm_tokenizer *tok) { return tok->map != NULL; }

void dfm_tokenizer_free(dfm_tokenizer *tok) {
    if (!tok) return;
    if (!tok->map) { /* from JSON: every string and table is ours; from a cache file they are in the mapping */
        for (uint32_t i = 0; tok->key && i < tok->n_ids; i++) {
            if (tok->dec[i] != tok->key[i]) free(tok->dec[i]);
            free(tok->key[i]);
        }
        dfm_strmap_free(&tok->vocab);
        dfm_mergemap_free(&tok->merges);
    }
    free(tok->key), free(tok->key_len), free(tok->dec), free(tok->dec_len), free(tok->is_special);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    free(tok->raw_matcher.order);
    free(tok->norm_matcher.order);
    for (size_t i = 0; i < tok->n_norm; i++) free(tok->norm[i].a), free(tok->norm[i].b);
    free(tok->norm);
    for (size_t i = 0; i < tok->n_pre; i++) pcre2_code_free(tok->pre[i].re);
    free(tok->pre);
    dfm_tok_cache_free(tok);
    dfm_unmap_file(tok->map, tok->map_bytes);
    free(tok);
}

/* ================================================================ encode */

typedef struct {
    const dfm_tokenizer *tok;
    dfm_ids *out;
    dfm_bpe_work w;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    sbuf norm, tmp;
    sbuf stage[8]; /* per pre-tokenizer stage: prefix-space copies */
    int first_piece;
} enc_ctx;

static void enc_free(enc_ctx *c) {
    dfm_bpe_work_free(&c->w);
    pcre2_match_data_free(c->md);
    pcre2_match_context_free(c->mctx);
    pcre2_jit_stack_free(c->jstack);
    free(c->norm.p), free(c->tmp.p);
    for (int i = 0; i < 8; i++) free(c->stage[i].p);
}

/* NFC of s[0..n) appended to out. Only runs holding non-ASCII bytes go through utf8proc, each with
 * the one ASCII character before it (a starter that may compose with a following combining mark):
 * ASCII never decomposes, has combining class 0 and never composes with what precedes it, so
 * NFC(x y) = NFC(x) NFC(y) at every ASCII character that precedes another ASCII character. */
static int nfc_append(const char *s, size_t n, sbuf *out) {
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && (uint8_t)s[j] < 0x80) j++;
        if (j == n) return dfm_sbuf_add(out, s + i, n - i);
        size_t start = j > i ? j - 1 : j; /* include the ASCII character before the run */
        DFM_TRY(dfm_sbuf_add(out, s + i, start - i));
        size_t e = j;
        while (e < n && (uint8_t)s[e] >= 0x80) e++;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s + start, (utf8proc_ssize_t)(e - start), &dst,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r < 0) {
            free(dst);
            return DFM_FAIL(DFM_EINTERNAL, "utf8proc NFC failed: %s", utf8proc_errmsg(r));
        }
        int rc = dfm_sbuf_add(out, dst, (size_t)r);
        free(dst);
        DFM_TRY(rc);
        i = e;
    }
    return DFM_OK;
}

/* Apply the normalizer stages to s; result in out (replacing its content). */
static int normalize_segment(const dfm_tokenizer *tok, const char *s, size_t n, sbuf *out, sbuf *tmp) {
    out->n = 0;
    DFM_TRY(dfm_sbuf_add(out, s, n));
    for (size_t k = 0; k < tok->n_norm; k++) {
        const dfm_norm_stage *st = &tok->norm[k];
        tmp->n = 0;
        if (st->kind == DFM_NORM_NFC) {
            DFM_TRY(nfc_append(out->p, out->n, tmp));
        } else if (st->kind == DFM_NORM_PREPEND) {
            if (!out->n) continue; /* HF: an empty string stays empty */
            DFM_TRY(dfm_sbuf_add(tmp, st->a, st->alen));
            DFM_TRY(dfm_sbuf_add(tmp, out->p, out->n));
        } else {
            for (size_t i = 0; i < out->n;) {
                if (i + st->alen <= out->n && !memcmp(out->p + i, st->a, st->alen)) {
                    DFM_TRY(dfm_sbuf_add(tmp, st->b, st->blen));
                    i += st->alen;
                } else {
                    DFM_TRY(dfm_sbuf_add(tmp, out->p + i, 1));
                    i++;
                }
            }
        }
        sbuf t = *out;
        *out = *tmp;
        *tmp = t;
    }
    if (!out->p) DFM_TRY(dfm_sbuf_add(out, "", 0));
    return DFM_OK;
}

static int pre_tokenize(enc_ctx *c, size_t stage, const uint8_t *s, size_t n);

static int regex_pieces(enc_ctx *c, size_t stage, pcre2_code *re, const uint8_t *s, size_t n) {
    if (!c->md) {
        c->md = pcre2_match_data_create(4, NULL);
        if (!c->md) return DFM_FAIL(DFM_ENOMEM, "no memory for regex match data");
    }
    size_t off = 0, last = 0;
    while (off < n) {
        int r = pcre2_match(re, s, n, off, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        if (r == PCRE2_ERROR_JIT_STACKLIMIT && !c->jstack) { /* deep backtracking: retry with a big stack */
            c->mctx = pcre2_match_context_create(NULL);
            c->jstack = pcre2_jit_stack_create(32 << 10, 64 << 20, NULL);
            if (!c->mctx || !c->jstack) return DFM_FAIL(DFM_ENOMEM, "no memory for a regex JIT stack");
            pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
            continue;
        }
        if (r == PCRE2_ERROR_NOMATCH) break;
        if (r < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(r, msg, sizeof msg);
            return DFM_FAIL(DFM_EINTERNAL, "pre-tokenizer regex failed at byte %zu: %s", off, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step one character, as Oniguruma's find_iter */
            uint32_t cp;
            off = ms + (size_t)dfm_utf8_next(s + ms, n - ms, &cp);
            continue;
        }
        if (ms > last) DFM_TRY(pre_tokenize(c, stage + 1, s + last, ms - last));
        DFM_TRY(pre_tokenize(c, stage + 1, s + ms, me - ms));
        last = off = me;
    }
    if (last < n) DFM_TRY(pre_tokenize(c, stage + 1, s + last, n - last));
    return DFM_OK;
}

static int pre_tokenize(enc_ctx *c, size_t stage, const uint8_t *s, size_t n) {
    const dfm_tokenizer *tok = c->tok;
    if (!n) return DFM_OK;
    if (stage == tok->n_pre) return dfm_bpe_word(tok, &c->w, s, n, c->out);
    const dfm_pre_stage *st = &tok->pre[stage];
    sbuf *b = &c->stage[stage];
    if (st->kind == DFM_PRE_SPLIT) return regex_pieces(c, stage, st->re, s, n);
    if (st->kind == DFM_PRE_BYTELEVEL) {
        if (st->add_prefix_space && s[0] != ' ') {
            b->n = 0;
            DFM_TRY(dfm_sbuf_add(b, " ", 1));
            DFM_TRY(dfm_sbuf_add(b, s, n));
            s = (const uint8_t *)b->p, n = b->n; /* b stays valid: deeper stages have their own buffers */
        }
        if (st->re) return regex_pieces(c, stage, st->re, s, n);
        return pre_tokenize(c, stage + 1, s, n);
    }
    /* Metaspace: ' ' -> '▁', prepend '▁', split before each '▁' */
    b->n = 0;
    int prepend = st->add_prefix_space && (!st->prepend_first_only || c->first_piece);
    /* HF replaces ' ' first, then prepends unless the piece already starts with "▁" */
    if (prepend && s[0] != ' ' && !(n >= 3 && !memcmp(s, "\xe2\x96\x81", 3))) DFM_TRY(dfm_sbuf_add(b, "\xe2\x96\x81", 3));
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') DFM_TRY(dfm_sbuf_add(b, "\xe2\x96\x81", 3));
        else DFM_TRY(dfm_sbuf_add(b, s + i, 1));
    }
    c->first_piece = 0;
    const uint8_t *m = (const uint8_t *)b->p; /* b stays valid: deeper stages have their own buffers */
    return st->re ? regex_pieces(c, stage, st->re, m, b->n) : pre_tokenize(c, stage + 1, m, b->n);
}

/* The next added token of matcher m in s[*pos..n), as HF's AddedVocabulary::find_matches: the
 * leftmost, then longest match; a single_word token next to a word character is not a match (and,
 * like the Aho-Corasick scan HF uses, scanning resumes after it); lstrip / rstrip widen the span over
 * whitespace (lstrip not past `last`, the end of the previous match). Returns NULL when none is left;
 * else the token, its span [*ms, *me), and *pos moved past it. */
static const dfm_added_token *next_added(const dfm_tokenizer *tok, const dfm_added_matcher *m, const char *s,
                                         size_t n, size_t *pos, size_t last, size_t *ms, size_t *me) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = *pos;
    while (m->n && i < n) {
        const dfm_added_token *hit = NULL;
        uint8_t b = u[i];
        for (uint32_t k = m->first[b]; k < m->first[b + 1]; k++) {
            const dfm_added_token *a = &tok->added[m->order[k]];
            if (a->len <= n - i && !memcmp(s + i, a->content, a->len)) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t st = i, en = i + hit->len;
        if (hit->single_word) {
            uint32_t cp = 0;
            if ((st > 0 && is_word_cp(cp_before(u, st, NULL))) ||
                (en < n && (dfm_utf8_next(u + en, n - en, &cp), is_word_cp(cp)))) {
                i = en;
                continue;
            }
        }
        if (hit->lstrip)
            while (st > last) {
                size_t prev;
                if (!is_ws(cp_before(u, st, &prev))) break;
                st = prev;
            }
        if (hit->rstrip)
            while (en < n) {
                uint32_t cp;
                int l = dfm_utf8_next(u + en, n - en, &cp);
                if (!is_ws(cp)) break;
                en += (size_t)l;
            }
        *ms = st, *me = en, *pos = en;
        return hit;
    }
    *pos = n;
    return NULL;
}

static int encode_normalized(enc_ctx *c, const char *s, size_t n) {
    return pre_tokenize(c, 0, (const uint8_t *)s, n);
}

/* Raw gap between non-normalized added tokens: normalize, split on normalized added tokens, pre-tokenize. */
static int encode_gap(enc_ctx *c, const char *s, size_t n) {
    const dfm_tokenizer *tok = c->tok;
    const char *p = s;
    size_t pn = n;
    if (tok->n_norm) { /* c->norm is not touched again until the next gap */
        DFM_TRY(normalize_segment(tok, s, n, &c->norm, &c->tmp));
        p = c->norm.p, pn = c->norm.n;
    }
    int rc, gap_first = c->first_piece;
    if (tok->norm_matcher.n) {
        /* split on normalized added tokens; gaps go straight to the pre-tokenizer */
        size_t last = 0, pos = 0, ms, me;
        const dfm_added_token *hit;
        rc = DFM_OK;
        while (!rc && (hit = next_added(tok, &tok->norm_matcher, p, pn, &pos, last, &ms, &me))) {
            c->first_piece = gap_first && last == 0;
            if (ms > last) rc = encode_normalized(c, p + last, ms - last);
            if (!rc && dfm_ids_push(c->out, hit->id)) rc = DFM_FAIL(DFM_ENOMEM, "no memory for token ids");
            last = me;
        }
        c->first_piece = gap_first && last == 0;
        if (!rc && last < pn) rc = encode_normalized(c, p + last, pn - last);
    } else {
        rc = encode_normalized(c, p, pn);
    }
    return rc;
}

int dfm_tokenizer_encode(const dfm_tokenizer *tok, const char *text, size_t len, dfm_ids *out, size_t *n_replaced) {
    if (n_replaced) *n_replaced = 0;
    char *fixed = NULL;
    if (dfm_utf8_valid_prefix((const uint8_t *)text, len) != len) {
        size_t fl;
        DFM_TRY(dfm_utf8_replace((const uint8_t *)text, len, &fixed, &fl, n_replaced));
        text = fixed, len = fl;
    }
    enc_ctx c = {.tok = tok, .out = out, .first_piece = 1};
    size_t last = 0, pos = 0, ms, me;
    int rc = DFM_OK;
    const dfm_added_token *hit;
    while (!rc && (hit = next_added(tok, &tok->raw_matcher, text, len, &pos, last, &ms, &me))) {
        c.first_piece = last == 0; /* Metaspace "first": only the piece at offset 0 of the input */
        if (ms > last) rc = encode_gap(&c, text + last, ms - last);
        if (!rc && dfm_ids_push(out, hit->id)) rc = DFM_FAIL(DFM_ENOMEM, "no memory for token ids");
        last = me;
    }
    c.first_piece = last == 0;
    if (!rc && last < len) rc = encode_gap(&c, text + last, len - last);
    enc_free(&c);
    free(fixed);
    return rc;
}

/* ================================================================ decode */

int dfm_tokenizer_decode(const dfm_tokenizer *tok, const uint32_t *ids, size_t n, int skip_special, char **text,
                         size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    sbuf b = {0};
    int rc = dfm_sbuf_add(&b, "", 0), first_done = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        uint32_t id = ids[i];
        if (id >= tok->n_ids || !tok->dec[id]) {
            rc = DFM_FAIL(DFM_ERANGE, "token id %u at position %zu is not in the tokenizer (%u ids). HINT: the ids "
                          "were made with another tokenizer?", id, i, tok->n_ids);
            break;
        }
        if (skip_special && tok->is_special[id]) continue;
        int byte;
        if (tok->decoder_kind == DEC_METASPACE && tok->dec_strip && !first_done) {
            /* HF's Metaspace decoder drops every "▁" of the first token */
            first_done = 1;
            const char *k = tok->key[id] ? tok->key[id] : tok->dec[id];
            size_t kn = tok->key[id] ? tok->key_len[id] : tok->dec_len[id];
            for (size_t q = 0; q < kn && !rc;) {
                if (q + 3 <= kn && !memcmp(k + q, "\xe2\x96\x81", 3)) q += 3;
                else rc = dfm_sbuf_add(&b, k + q, 1), q++;
            }
            continue;
        }
        first_done = 1;
        if (tok->decoder_kind == DEC_SPM && tok->dec_byte_fallback && is_byte_token(tok->dec[id], tok->dec_len[id], &byte)) {
            /* ByteFallback: a run of <0xNN> tokens is one byte string; if it is not valid UTF-8,
             * every byte of the run becomes U+FFFD */
            size_t j = i;
            sbuf run = {0};
            while (j < n && !rc && ids[j] < tok->n_ids && tok->dec[ids[j]] &&
                   is_byte_token(tok->dec[ids[j]], tok->dec_len[ids[j]], &byte)) {
                uint8_t c = (uint8_t)byte;
                rc = dfm_sbuf_add(&run, &c, 1);
                j++;
            }
            if (!rc) {
                if (dfm_utf8_valid_prefix((uint8_t *)run.p, run.n) == run.n) rc = dfm_sbuf_add(&b, run.p, run.n);
                else
                    for (size_t q = 0; q < run.n && !rc; q++) rc = dfm_sbuf_add(&b, "\xef\xbf\xbd", 3);
            }
            free(run.p);
            i = j - 1;
            continue;
        }
        rc = dfm_sbuf_add(&b, tok->dec[id], tok->dec_len[id]);
    }
    if (rc) {
        free(b.p);
        return rc;
    }
    char *start = b.p;
    size_t sn = b.n;
    if (tok->decoder_kind == DEC_SPM && tok->dec_strip && sn && start[0] == ' ') start++, sn--; /* Strip(" ", 1, 0) */
    char *outp;
    size_t outn;
    rc = dfm_utf8_replace((const uint8_t *)start, sn, &outp, &outn, NULL);
    free(b.p);
    if (rc) return rc;
    *text = outp;
    if (len) *len = outn;
    return DFM_OK;
}

/* ================================================================ small queries */

uint32_t dfm_tokenizer_vocab_size(const dfm_tokenizer *tok) { return tok->n_ids; }

int64_t dfm_tokenizer_token_id(const dfm_tokenizer *tok, const char *token) {
    size_t n = strlen(token);
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == n && !memcmp(tok->added[i].content, token, n)) return tok->added[i].id;
    sbuf b = {0};
    size_t len;
    if (token_raw(tok, token, n, &b, &len)) {
        dfm_error_clear();
        return -1;
    }
    int64_t id = dfm_strmap_get(&tok->vocab, b.p ? b.p : "", len);
    free(b.p);
    return id;
}

int64_t dfm_tokenizer_eos_id(const dfm_tokenizer *tok) {
    static const char *names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[SEP]"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int64_t id = dfm_tokenizer_token_id(tok, names[i]);
        if (id >= 0) return id;
    }
    return -1;
}

const char *dfm_tokenizer_describe(const dfm_tokenizer *tok) { return tok->describe; }

uint64_t dfm_tokenizer_hash(const dfm_tokenizer *tok) { return tok->hash; }
