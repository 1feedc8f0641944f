/* tok_decode.c — the decoders of tokenizer.json, as `tokenizers` runs them (tokenizers/src/decoders/,
 * Tokenizer::decode): the ids' token strings (added tokens: their content, normalized if they are; special
 * ones dropped with skip_special) go through each decoder of the chain, each turning a list of strings
 * into another; the result is their concatenation. Without a decoder the strings are joined by spaces.
 *
 *   ByteLevel     every string back through the GPT-2 byte alphabet (one that has a character outside it
 *                 stays as it is), all joined, invalid UTF-8 replaced: one string
 *   Metaspace     replacement -> ' ', except in the first string when prepend_scheme is not "never" (dropped)
 *   WordPiece     strings after the first lose the prefix, or get a leading space; cleanup: " ." -> "." ...
 *   BPEDecoder    suffix -> ' ' (in the last string -> nothing)
 *   Replace       every match of a String or Regex pattern -> content
 *   ByteFallback  runs of <0xNN> strings -> their bytes, or one U+FFFD per byte when not valid UTF-8
 *   Fuse          all strings joined into one
 *   Strip         up to `start` leading and `stop` trailing copies of a character off each string
 *   CTC           repeats collapsed, pad tokens removed, cleanup and word delimiter -> ' ', empty ones dropped
 *   Sequence      each in turn
 */
#include "tokenizer/tok_internal.h"

#include "common/error.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ parsing */


static void stage_free(dfm_dec_stage *st) {
    free(st->a), free(st->b);
    dfm_regex_free(st->re);
}

void dfm_dec_free(dfm_tokenizer *tok) {
    for (size_t i = 0; i < tok->n_dec; i++) stage_free(&tok->dec[i]);
    free(tok->dec);
    tok->dec = NULL, tok->n_dec = 0;
}

static int push(dfm_tokenizer *tok, dfm_dec_stage *st) {
    dfm_dec_stage *q = tok->n_dec < 64 ? realloc(tok->dec, (tok->n_dec + 1) * sizeof *q) : NULL;
    if (!q) {
        stage_free(st);
        return DFM_FAIL(tok->n_dec < 64 ? DFM_ENOMEM : DFM_EUNSUPPORTED, "decoder: no memory, or more than 64 stages");
    }
    tok->dec = q;
    tok->dec[tok->n_dec++] = *st;
    return DFM_OK;
}

/* A string member with a default; *out malloc'd. */
static int str_or(const dfm_load_ctx *lc, json_t *p, const char *key, const char *def, const char *where, char **out,
                  size_t *len) {
    json_t *v = json_object_get(p, key);
    if (v && !json_is_null(v) && !json_is_string(v)) return DFM_LFAIL(lc, DFM_EFORMAT, "%s.%s: not a string", where, key);
    const char *s = json_is_string(v) ? json_string_value(v) : def;
    *len = json_is_string(v) ? json_string_length(v) : strlen(def);
    if (!(*out = dfm_tok_dupn(s, *len))) return DFM_FAIL(DFM_ENOMEM, "no memory");
    return DFM_OK;
}

static int size_member(const dfm_load_ctx *lc, json_t *p, const char *key, const char *where, size_t *out) {
    json_t *v = json_object_get(p, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return DFM_LFAIL(lc, DFM_EFORMAT, "%s.%s: missing or not a non-negative integer", where, key);
    *out = (size_t)json_integer_value(v);
    return DFM_OK;
}

static int parse_stage(const dfm_load_ctx *lc, dfm_tokenizer *tok, json_t *p, const char *where) {
    const char *type = dfm_jstr(p, "type", NULL);
    if (!type) return DFM_LFAIL(lc, DFM_EFORMAT, "%s has no \"type\"", where);
    dfm_dec_stage st = {0};
    int rc = DFM_OK;
    if (!strcmp(type, "Sequence")) return dfm_jsequence(lc, tok, p, "decoders", where, parse_stage);
    if (!strcmp(type, "ByteLevel")) st.kind = DFM_DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) st.kind = DFM_DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) st.kind = DFM_DEC_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        st.kind = DFM_DEC_METASPACE;
        DFM_TRY(dfm_jchar(lc, p, "replacement", where, &st.ch));
        const char *scheme = dfm_jstr(p, "prepend_scheme", NULL);
        int aps;
        DFM_TRY(dfm_jbool(lc, p, "add_prefix_space", 1, where, &aps));
        if (scheme && strcmp(scheme, "always") && strcmp(scheme, "first") && strcmp(scheme, "never"))
            return DFM_LFAIL(lc, DFM_EFORMAT, "%s.prepend_scheme: \"%s\" is not always, first or never", where, scheme);
        st.prefix = scheme ? strcmp(scheme, "never") != 0 : 1;
        if (!aps && st.prefix)
            return DFM_LFAIL(lc, DFM_EFORMAT, "%s: add_prefix_space does not match declared prepend_scheme", where);
    } else if (!strcmp(type, "WordPiece")) {
        st.kind = DFM_DEC_WORDPIECE;
        DFM_TRY(str_or(lc, p, "prefix", "##", where, &st.a, &st.alen));
        DFM_TRY(dfm_jbool(lc, p, "cleanup", 1, where, &st.cleanup));
    } else if (!strcmp(type, "BPEDecoder")) {
        st.kind = DFM_DEC_BPE;
        DFM_TRY(str_or(lc, p, "suffix", "</w>", where, &st.a, &st.alen));
    } else if (!strcmp(type, "CTC")) {
        st.kind = DFM_DEC_CTC;
        rc = str_or(lc, p, "pad_token", "<pad>", where, &st.a, &st.alen);
        if (!rc) rc = str_or(lc, p, "word_delimiter_token", "|", where, &st.b, &st.blen);
        if (!rc) rc = dfm_jbool(lc, p, "cleanup", 1, where, &st.cleanup);
    } else if (!strcmp(type, "Strip")) {
        st.kind = DFM_DEC_STRIP;
        DFM_TRY(dfm_jchar(lc, p, "content", where, &st.ch));
        DFM_TRY(size_member(lc, p, "start", where, &st.start));
        DFM_TRY(size_member(lc, p, "stop", where, &st.stop));
    } else if (!strcmp(type, "Replace")) {
        st.kind = DFM_DEC_REPLACE;
        rc = dfm_jreplace(lc, p, where, &st.a, &st.alen, &st.b, &st.blen, &st.re);
    } else {
        return DFM_LFAIL(lc, DFM_EUNSUPPORTED, "%s: decoder type \"%s\" is not supported (supported: ByteLevel, "
                         "Metaspace, WordPiece, BPEDecoder, Replace, ByteFallback, Fuse, Strip, CTC, Sequence)", where, type);
    }
    if (rc) {
        stage_free(&st);
        return rc;
    }
    return push(tok, &st);
}

int dfm_dec_parse(const dfm_load_ctx *lc, dfm_tokenizer *tok, void *json, const char *where) {
    json_t *p = json;
    if (!p || json_is_null(p)) return DFM_OK;
    if (!json_is_object(p)) return DFM_LFAIL(lc, DFM_EFORMAT, "%s is not an object", where);
    tok->has_decoder = 1;
    return parse_stage(lc, tok, p, where);
}

/* ================================================================ a list of strings */

typedef struct {
    sbuf buf;
    size_t *off, *len;
    size_t n, cap;
} toklist;

static void tl_free(toklist *t) {
    free(t->buf.p), free(t->off), free(t->len);
    memset(t, 0, sizeof *t);
}

/* Start a new string; its bytes are then added to t->buf. */
static int tl_open(toklist *t) {
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 64;
        size_t *o = realloc(t->off, c * sizeof *o);
        if (o) t->off = o;
        size_t *l = realloc(t->len, c * sizeof *l);
        if (l) t->len = l;
        if (!o || !l) return DFM_FAIL(DFM_ENOMEM, "no memory for %zu decoded strings", c);
        t->cap = c;
    }
    t->off[t->n] = t->buf.n;
    t->len[t->n++] = 0;
    return DFM_OK;
}

static int tl_add(toklist *t, const void *s, size_t n) {
    DFM_TRY(dfm_sbuf_add(&t->buf, s, n));
    t->len[t->n - 1] += n;
    return DFM_OK;
}

/* "" while no byte was added (buf.p is still NULL: NULL + 0 is undefined in C) */
static const char *tl_at(const toklist *t, size_t i) { return t->buf.p ? t->buf.p + t->off[i] : ""; }

/* Rust's str::replace: every non-overlapping occurrence of pat, left to right (an empty pat matches at
 * every character boundary, the ends included). */
static int add_replaced(toklist *t, const char *s, size_t n, const char *pat, size_t pn, const char *rep, size_t rn) {
    if (!pn) {
        for (size_t i = 0; i < n;) {
            DFM_TRY(tl_add(t, rep, rn));
            uint32_t cp;
            size_t l = (size_t)dfm_utf8_next((const uint8_t *)s + i, n - i, &cp);
            DFM_TRY(tl_add(t, s + i, l));
            i += l;
        }
        return tl_add(t, rep, rn);
    }
    size_t last = 0;
    for (const char *hit; last + pn <= n && (hit = memmem(s + last, n - last, pat, pn));) {
        size_t at = (size_t)(hit - s);
        DFM_TRY(tl_add(t, s + last, at - last));
        DFM_TRY(tl_add(t, rep, rn));
        last = at + pn;
    }
    return tl_add(t, s + last, n - last);
}

/* WordPiece's cleanup, its replacements in order. */
static int cleanup(toklist *t, const char *s, size_t n, sbuf *x, sbuf *y) {
    static const char *from[] = {" .", " ?", " !", " ,", " ' ", " n't", " 'm", " do not", " 's", " 've", " 're"};
    static const char *to[] = {".", "?", "!", ",", "'", "n't", "'m", " don't", "'s", "'ve", "'re"};
    x->n = 0;
    DFM_TRY(dfm_sbuf_add(x, s, n));
    for (int k = 0; k < 11; k++) {
        if (!memmem(x->p, x->n, from[k], strlen(from[k]))) continue;
        toklist one = {0};
        int rc = tl_open(&one);
        if (!rc) rc = add_replaced(&one, x->p, x->n, from[k], strlen(from[k]), to[k], strlen(to[k]));
        if (!rc) {
            y->n = 0;
            rc = dfm_sbuf_add(y, one.buf.p ? one.buf.p : "", one.buf.n);
        }
        tl_free(&one);
        DFM_TRY(rc);
        sbuf tmp = *x;
        *x = *y;
        *y = tmp;
    }
    return tl_add(t, x->p, x->n);
}

/* <0xNN> (as u8::from_str_radix, which also takes a '+' sign): the byte, or -1. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0 && !(i == 3 && c == '+')) return -1;
        if (d >= 0) v = v * 16 + d;
    }
    return v;
}

/* ================================================================ the stages */

static int stage(const dfm_dec_stage *st, const toklist *in, toklist *out, dfm_regex_scratch *rx, sbuf *x, sbuf *y) {
    switch (st->kind) {
    case DFM_DEC_BYTELEVEL: {
        x->n = 0;
        for (size_t i = 0; i < in->n; i++) {
            const char *s = tl_at(in, i);
            size_t n = in->len[i], start = x->n, j = 0;
            int whole = 1;
            while (j < n && whole) {
                uint32_t cp;
                j += (size_t)dfm_utf8_next((const uint8_t *)s + j, n - j, &cp);
                int b = dfm_bytelevel_byte(cp);
                char c = (char)b;
                if (b < 0) whole = 0;
                else DFM_TRY(dfm_sbuf_add(x, &c, 1));
            }
            if (!whole) { /* a character outside the alphabet: the string as it is */
                x->n = start;
                DFM_TRY(dfm_sbuf_add(x, s, n));
            }
        }
        char *fixed;
        size_t fl;
        DFM_TRY(dfm_utf8_replace((const uint8_t *)(x->p ? x->p : ""), x->n, &fixed, &fl, NULL));
        int rc = tl_open(out);
        if (!rc) rc = tl_add(out, fixed, fl);
        free(fixed);
        return rc;
    }
    case DFM_DEC_FUSE:
        DFM_TRY(tl_open(out));
        for (size_t i = 0; i < in->n; i++) DFM_TRY(tl_add(out, tl_at(in, i), in->len[i]));
        return DFM_OK;
    case DFM_DEC_BYTEFALLBACK:
        for (size_t i = 0; i < in->n;) {
            if (byte_token(tl_at(in, i), in->len[i]) < 0) {
                DFM_TRY(tl_open(out));
                DFM_TRY(tl_add(out, tl_at(in, i), in->len[i]));
                i++;
                continue;
            }
            x->n = 0;
            size_t j = i;
            for (int b; j < in->n && (b = byte_token(tl_at(in, j), in->len[j])) >= 0; j++) {
                char c = (char)b;
                DFM_TRY(dfm_sbuf_add(x, &c, 1));
            }
            if (dfm_utf8_valid_prefix((const uint8_t *)x->p, x->n) == x->n) {
                DFM_TRY(tl_open(out));
                DFM_TRY(tl_add(out, x->p, x->n));
            } else {
                for (size_t k = i; k < j; k++) {
                    DFM_TRY(tl_open(out));
                    DFM_TRY(tl_add(out, "\xef\xbf\xbd", 3));
                }
            }
            i = j;
        }
        return DFM_OK;
    case DFM_DEC_CTC:
        for (size_t i = 0; i < in->n; i++) {
            if (i && in->len[i] == in->len[i - 1] && !memcmp(tl_at(in, i), tl_at(in, i - 1), in->len[i])) continue;
            toklist a = {0}, b = {0};
            int rc = tl_open(&a);
            if (!rc) rc = add_replaced(&a, tl_at(in, i), in->len[i], st->a, st->alen, "", 0);
            const char *s = a.buf.p ? a.buf.p : "";
            size_t n = a.buf.n;
            if (!rc && st->cleanup) {
                rc = tl_open(&b);
                if (!rc) rc = cleanup(&b, s, n, x, y);
                if (!rc) {
                    a.n = 0, a.buf.n = 0;
                    rc = tl_open(&a);
                    if (!rc) rc = add_replaced(&a, b.buf.p ? b.buf.p : "", b.buf.n, st->b, st->blen, " ", 1);
                    s = a.buf.p ? a.buf.p : "", n = a.buf.n;
                }
            }
            if (!rc && n) {
                rc = tl_open(out);
                if (!rc) rc = tl_add(out, s, n);
            }
            tl_free(&a), tl_free(&b);
            DFM_TRY(rc);
        }
        return DFM_OK;
    default:
        break;
    }
    for (size_t i = 0; i < in->n; i++) { /* the per-string decoders */
        const char *s = tl_at(in, i);
        size_t n = in->len[i];
        DFM_TRY(tl_open(out));
        switch (st->kind) {
        case DFM_DEC_METASPACE: {
            uint8_t rep[4];
            int rl = dfm_utf8_put(st->ch, rep);
            for (size_t j = 0; j < n;) {
                if (j + (size_t)rl <= n && !memcmp(s + j, rep, (size_t)rl)) {
                    if (!(i == 0 && st->prefix)) DFM_TRY(tl_add(out, " ", 1));
                    j += (size_t)rl;
                } else {
                    uint32_t cp;
                    size_t l = (size_t)dfm_utf8_next((const uint8_t *)s + j, n - j, &cp);
                    DFM_TRY(tl_add(out, s + j, l));
                    j += l;
                }
            }
            break;
        }
        case DFM_DEC_WORDPIECE: {
            sbuf t = {0}, u = {0};
            int rc = DFM_OK;
            if (i && !(n >= st->alen && !memcmp(s, st->a, st->alen))) rc = dfm_sbuf_add(&t, " ", 1);
            else if (i) s += st->alen, n -= st->alen;
            if (!rc) rc = dfm_sbuf_add(&t, s, n);
            if (!rc) rc = st->cleanup ? cleanup(out, t.p, t.n, x, &u) : tl_add(out, t.p, t.n);
            free(t.p), free(u.p);
            DFM_TRY(rc);
            break;
        }
        case DFM_DEC_BPE:
            DFM_TRY(add_replaced(out, s, n, st->a, st->alen, i + 1 == in->n ? "" : " ", i + 1 == in->n ? 0 : 1));
            break;
        case DFM_DEC_REPLACE:
            if (!st->re) {
                DFM_TRY(add_replaced(out, s, n, st->a, st->alen, st->b, st->blen));
            } else {
                size_t prev = 0, ms, me;
                int r;
                dfm_regex_iter it;
                dfm_regex_start(&it, st->re, (const uint8_t *)s, n);
                while ((r = dfm_regex_next(rx, &it, (const uint8_t *)s, n, &ms, &me)) == 1) {
                    DFM_TRY(tl_add(out, s + prev, ms - prev));
                    DFM_TRY(tl_add(out, st->b, st->blen));
                    prev = me;
                }
                if (r < 0) return r;
                DFM_TRY(tl_add(out, s + prev, n - prev));
            }
            break;
        default: { /* DFM_DEC_STRIP, counted in characters */
            uint8_t c[4];
            size_t cl = (size_t)dfm_utf8_put(st->ch, c), a = 0, b = n;
            for (size_t k = 0; k < st->start && a + cl <= b && !memcmp(s + a, c, cl); k++) a += cl;
            for (size_t k = 0; k < st->stop && b >= a + cl && !memcmp(s + b - cl, c, cl); k++) b -= cl;
            DFM_TRY(tl_add(out, s + a, b - a));
        }
        }
    }
    return DFM_OK;
}

/* Byte-level BPE with a lone ByteLevel decoder (GPT-2, Llama-3, Qwen): each id's key is the bytes its string
 * decodes to, so the text is the keys joined, invalid UTF-8 replaced. 1 when done (or rc set), 0 when an id
 * needs the general path. */
static int decode_bytelevel(const dfm_tokenizer *tok, const uint32_t *ids, size_t n, int skip_special, sbuf *out,
                            int *rc) {
    sbuf raw = {0};
    for (size_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if (id >= tok->n_ids || !tok->str[id] || (tok->key_not_bytes && tok->key_not_bytes[id]) || !tok->key[id]) {
            free(raw.p);
            return 0;
        }
        if (skip_special && tok->is_special[id]) continue;
        if ((*rc = dfm_sbuf_add(&raw, tok->key[id], tok->key_len[id]))) break;
    }
    if (!*rc) {
        char *fixed;
        size_t fl;
        *rc = dfm_utf8_replace((const uint8_t *)(raw.p ? raw.p : ""), raw.n, &fixed, &fl, NULL);
        out->n = 0;
        if (!*rc) *rc = dfm_sbuf_add(out, fixed, fl), free(fixed);
    }
    free(raw.p);
    return 1;
}

int dfm_decode_ids(const dfm_tokenizer *tok, const uint32_t *ids, size_t n, int skip_special, sbuf *out) {
    int frc = DFM_OK;
    if (tok->byte_level && tok->n_dec == 1 && tok->dec[0].kind == DFM_DEC_BYTELEVEL &&
        decode_bytelevel(tok, ids, n, skip_special, out, &frc))
        return frc;
    toklist a = {0}, b = {0};
    sbuf x = {0}, y = {0};
    dfm_regex_scratch rx = {0};
    int rc = DFM_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        uint32_t id = ids[i];
        if (id >= tok->n_ids || !tok->str[id]) {
            rc = DFM_FAIL(DFM_ERANGE, "token id %u at position %zu is not in the tokenizer (%u ids). HINT: the ids "
                          "were made with another tokenizer?", id, i, tok->n_ids);
            break;
        }
        if (skip_special && tok->is_special[id]) continue;
        rc = tl_open(&a);
        if (!rc) rc = tl_add(&a, tok->str[id], tok->str_len[id]);
    }
    for (size_t k = 0; k < tok->n_dec && !rc; k++) {
        b.n = 0, b.buf.n = 0;
        rc = stage(&tok->dec[k], &a, &b, &rx, &x, &y);
        toklist t = a;
        a = b, b = t;
    }
    out->n = 0;
    for (size_t i = 0; i < a.n && !rc; i++) {
        if (i && !tok->has_decoder) rc = dfm_sbuf_add(out, " ", 1);
        if (!rc) rc = dfm_sbuf_add(out, tl_at(&a, i), a.len[i]);
    }
    if (!rc) rc = dfm_sbuf_add(out, "", 0);
    tl_free(&a), tl_free(&b);
    free(x.p), free(y.p);
    dfm_regex_scratch_free(&rx);
    return rc;
}
