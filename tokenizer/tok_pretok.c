/* tok_pretok.c — the pre-tokenizers of tokenizer.json, as `tokenizers` splits (tokenizers/src/pre_tokenizers/
 * and NormalizedString::split):
 *
 *   Split               regex (Oniguruma) or string matches; behavior Removed, Isolated, MergedWithPrevious,
 *                       MergedWithNext or Contiguous; invert swaps matches and the text between them
 *   Punctuation         each punctuation character is a match (any behavior; default Isolated)
 *   Digits              each numeric character (Isolated), or runs of them (individual_digits=false: Contiguous)
 *   WhitespaceSplit     White_Space characters, Removed
 *   CharDelimiterSplit  the delimiter character, Removed
 *   BertPreTokenizer    WhitespaceSplit, then Punctuation (Isolated)
 *   Whitespace          the pieces are \w+ and [^\w\s]+ (regex crate classes), whitespace dropped
 *   UnicodeScripts      cut where the script changes ("Any" never cuts; as in `tokenizers`, text before the
 *                       first cut, such as leading spaces, is dropped)
 *   FixedLength         pieces of `length` characters
 *   ByteLevel           a space before a piece that lacks one (add_prefix_space), then GPT-2's regex
 *                       (use_regex), Isolated. Stages after it see the byte-level string (GPT-2 alphabet),
 *                       as in `tokenizers`: pieces are mapped there and back
 *   Metaspace           ' ' -> replacement; the replacement prepended (prepend_scheme always, or first: only
 *                       to the piece that starts at the input's first character), then (split) a piece
 *                       before each replacement (MergedWithNext)
 *   Sequence            each in turn
 *
 * A split yields the text between matches (false) and the matches (true), empty matches included (they
 * matter to MergedWith* and Contiguous); the behavior groups them into pieces; empty pieces are dropped.
 */
#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_unicode.h"

#include "common/error.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define PRE_MAX DFM_TOK_PRE_MAX

/* GPT-2's pattern, used by ByteLevel with use_regex = true. */
static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ================================================================ parsing */

static int push(dfm_tokenizer *tok, dfm_pre_stage *st) {
    if (tok->n_pre == PRE_MAX) {
        dfm_regex_free(st->re);
        return DFM_FAIL(DFM_EUNSUPPORTED, "pre_tokenizer: more than %d pre-tokenizer stages are not supported", PRE_MAX);
    }
    dfm_pre_stage *q = realloc(tok->pre, (tok->n_pre + 1) * sizeof *q);
    if (!q) {
        dfm_regex_free(st->re);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    tok->pre = q;
    tok->pre[tok->n_pre++] = *st;
    return DFM_OK;
}

void dfm_pre_free(dfm_tokenizer *tok) {
    for (size_t i = 0; i < tok->n_pre; i++) dfm_regex_free(tok->pre[i].re);
    free(tok->pre);
    tok->pre = NULL, tok->n_pre = 0;
}

static int behavior(const dfm_load_ctx *lc, json_t *p, const char *where, int def, int *out) {
    json_t *b = json_object_get(p, "behavior");
    if (!b || (json_is_null(b) && def)) {
        if (!def) return DFM_LFAIL(lc, DFM_EFORMAT, "%s.behavior: missing", where);
        *out = def;
        return DFM_OK;
    }
    static const char *names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    static const int vals[] = {DFM_BEH_ISOLATED, DFM_BEH_REMOVED, DFM_BEH_MERGED_PREV, DFM_BEH_MERGED_NEXT,
                               DFM_BEH_CONTIGUOUS};
    const char *s = json_string_value(b);
    for (int i = 0; s && i < 5; i++)
        if (!strcmp(s, names[i])) {
            *out = vals[i];
            return DFM_OK;
        }
    return DFM_LFAIL(lc, DFM_EFORMAT, "%s.behavior: \"%s\" is not one of Removed, Isolated, MergedWithPrevious, "
                     "MergedWithNext, Contiguous", where, s ? s : "(not a string)");
}

static int parse_stage(const dfm_load_ctx *lc, dfm_tokenizer *tok, json_t *p, const char *where) {
    const char *type = dfm_jstr(p, "type", NULL);
    if (!type) return DFM_LFAIL(lc, DFM_EFORMAT, "%s has no \"type\"", where);
    dfm_pre_stage st = {.label = NULL};
    if (!strcmp(type, "Sequence")) return dfm_jsequence(lc, tok, p, "pretokenizers", where, parse_stage);
    dfm_pre_stage *bl = NULL; /* what follows ByteLevel splits its byte-level string */
    for (size_t i = 0; i < tok->n_pre; i++)
        if (tok->pre[i].kind == DFM_PRE_BYTELEVEL) bl = &tok->pre[i];
    if (bl && (!strcmp(type, "ByteLevel") || !strcmp(type, "Metaspace")))
        return DFM_LFAIL(lc, DFM_EUNSUPPORTED, "%s: a %s pre-tokenizer after ByteLevel is not supported (only "
                         "splitting ones may follow it)", where, type);
    if (bl) bl->map_out = 1;
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        size_t sl = 0, rl = 0;
        const char *s = dfm_jstr(pat, "String", &sl), *re = dfm_jstr(pat, "Regex", &rl);
        if (!s && !re) return DFM_LFAIL(lc, DFM_EFORMAT, "%s.pattern has neither \"Regex\" nor \"String\"", where);
        st.kind = DFM_PRE_SPLIT;
        DFM_TRY(behavior(lc, p, where, 0, &st.behavior));
        DFM_TRY(dfm_jbool(lc, p, "invert", 0, where, &st.invert));
        char w[300];
        snprintf(w, sizeof w, "%s.pattern", where);
        int rc = dfm_regex_compile(s ? s : re, s ? sl : rl, s != NULL, w, &st.re);
        if (rc) {
            dfm_error_prefix("%s", lc->file);
            return rc;
        }
        st.label = "Split";
        return push(tok, &st);
    }
    if (!strcmp(type, "Punctuation") || !strcmp(type, "Digits") || !strcmp(type, "WhitespaceSplit") ||
        !strcmp(type, "CharDelimiterSplit")) {
        st.kind = DFM_PRE_CHARS;
        st.behavior = DFM_BEH_REMOVED;
        if (!strcmp(type, "Punctuation")) {
            st.cls = DFM_CLASS_PUNCT, st.label = "Punctuation";
            DFM_TRY(behavior(lc, p, where, DFM_BEH_ISOLATED, &st.behavior));
        } else if (!strcmp(type, "Digits")) {
            int individual;
            DFM_TRY(dfm_jbool(lc, p, "individual_digits", 0, where, &individual));
            st.cls = DFM_CLASS_NUMERIC, st.label = "Digits";
            st.behavior = individual ? DFM_BEH_ISOLATED : DFM_BEH_CONTIGUOUS;
        } else if (!strcmp(type, "WhitespaceSplit")) {
            st.cls = DFM_CLASS_WS, st.label = "WhitespaceSplit";
        } else {
            st.cls = DFM_CLASS_CHAR, st.label = "CharDelimiterSplit";
            DFM_TRY(dfm_jchar(lc, p, "delimiter", where, &st.ch));
        }
        return push(tok, &st);
    }
    if (!strcmp(type, "BertPreTokenizer")) {
        st.kind = DFM_PRE_CHARS, st.cls = DFM_CLASS_WS, st.behavior = DFM_BEH_REMOVED, st.label = "BertPreTokenizer";
        DFM_TRY(push(tok, &st));
        st.cls = DFM_CLASS_PUNCT, st.behavior = DFM_BEH_ISOLATED, st.label = "";
        return push(tok, &st);
    }
    if (!strcmp(type, "Whitespace")) {
        st.kind = DFM_PRE_WHITESPACE, st.label = "Whitespace";
        return push(tok, &st);
    }
    if (!strcmp(type, "UnicodeScripts")) {
        st.kind = DFM_PRE_SCRIPTS, st.label = "UnicodeScripts";
        return push(tok, &st);
    }
    if (!strcmp(type, "FixedLength")) {
        json_t *l = json_object_get(p, "length");
        st.kind = DFM_PRE_FIXED, st.label = "FixedLength";
        st.length = 5;
        if (l && !json_is_null(l)) {
            if (!json_is_integer(l) || json_integer_value(l) < 1)
                return DFM_LFAIL(lc, DFM_EFORMAT, "%s.length: not a positive integer", where);
            st.length = (size_t)json_integer_value(l);
        }
        return push(tok, &st);
    }
    if (!strcmp(type, "ByteLevel")) {
        int use_regex;
        st.kind = DFM_PRE_BYTELEVEL, st.label = "ByteLevel";
        DFM_TRY(dfm_jbool(lc, p, "add_prefix_space", 1, where, &st.prefix));
        DFM_TRY(dfm_jbool(lc, p, "use_regex", 1, where, &use_regex));
        if (use_regex) DFM_TRY(dfm_regex_compile(GPT2_RE, sizeof GPT2_RE - 1, 0, where, &st.re));
        tok->byte_level = 1;
        return push(tok, &st);
    }
    if (!strcmp(type, "Metaspace")) {
        st.kind = DFM_PRE_METASPACE, st.label = "Metaspace";
        DFM_TRY(dfm_jchar(lc, p, "replacement", where, &st.ch));
        st.rep_len = dfm_utf8_put(st.ch, (uint8_t *)st.rep);
        const char *scheme = dfm_jstr(p, "prepend_scheme", NULL);
        json_t *sc = json_object_get(p, "prepend_scheme");
        st.prefix = 1;
        if (scheme) {
            if (!strcmp(scheme, "always")) st.prefix = 1;
            else if (!strcmp(scheme, "first")) st.prefix = 2;
            else if (!strcmp(scheme, "never")) st.prefix = 0;
            else return DFM_LFAIL(lc, DFM_EFORMAT, "%s.prepend_scheme: \"%s\" is not always, first or never", where, scheme);
        } else if (sc && !json_is_null(sc)) {
            return DFM_LFAIL(lc, DFM_EFORMAT, "%s.prepend_scheme: not a string", where);
        }
        int aps;
        DFM_TRY(dfm_jbool(lc, p, "add_prefix_space", 1, where, &aps));
        if (!aps) { /* as `tokenizers`: false must come with "never" (the default scheme is "always") */
            if (st.prefix) return DFM_LFAIL(lc, DFM_EFORMAT, "%s: add_prefix_space does not match declared prepend_scheme", where);
        }
        DFM_TRY(dfm_jbool(lc, p, "split", 1, where, &st.split));
        if (st.prefix == 2) tok->track_first = 1;
        return push(tok, &st);
    }
    return DFM_LFAIL(lc, DFM_EUNSUPPORTED, "%s: pre-tokenizer type \"%s\" is not supported (supported: Sequence, Split, "
                     "Punctuation, Digits, Whitespace, WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit, "
                     "UnicodeScripts, FixedLength, ByteLevel, Metaspace)", where, type);
}

int dfm_pre_parse(const dfm_load_ctx *lc, dfm_tokenizer *tok, void *json, const char *where) {
    json_t *p = json;
    if (!p || json_is_null(p)) return DFM_OK;
    if (!json_is_object(p)) return DFM_LFAIL(lc, DFM_EFORMAT, "%s is not an object", where);
    DFM_TRY(parse_stage(lc, tok, p, where));
    for (size_t i = 0; i < tok->n_pre; i++)
        if (tok->pre[i].map_out) tok->bl_mapped = 1;
    return DFM_OK;
}

/* ================================================================ splitting */

/* A piece [a, b) of s for the next stage (ByteLevel with map_out: as its byte-level string). */
static int emit(dfm_enc_ctx *c, size_t stage, const uint8_t *s, size_t a, size_t b, size_t lead0) {
    if (b <= a) return DFM_OK; /* empty pieces are dropped */
    const dfm_pre_stage *st = &c->tok->pre[stage];
    if (st->map_out) {
        sbuf *o = &c->stage_out[stage];
        o->n = 0;
        for (size_t i = a; i < b; i++) DFM_TRY(dfm_sbuf_cp(o, dfm_bytelevel_cp(s[i])));
        return dfm_pre_tokenize(c, stage + 1, (const uint8_t *)o->p, o->n, 0);
    }
    return dfm_pre_tokenize(c, stage + 1, s + a, b - a, lead0 > a ? lead0 - a : 0);
}

/* The behaviors, fed one segment at a time (NormalizedString::split's folds, run forward). */
typedef struct {
    int beh, have, prev_match;
    size_t a, b;
} splitter;

static int seg(dfm_enc_ctx *c, size_t stage, const uint8_t *s, size_t lead0, splitter *sp, size_t a, size_t b, int m) {
    switch (sp->beh) {
    case DFM_BEH_ISOLATED: return emit(c, stage, s, a, b, lead0);
    case DFM_BEH_REMOVED: return m ? DFM_OK : emit(c, stage, s, a, b, lead0);
    case DFM_BEH_CONTIGUOUS:
    case DFM_BEH_MERGED_PREV: {
        int join = sp->beh == DFM_BEH_CONTIGUOUS ? m == sp->prev_match : m && !sp->prev_match;
        sp->prev_match = m;
        if (join && sp->have) {
            sp->b = b;
            return DFM_OK;
        }
        if (sp->have) DFM_TRY(emit(c, stage, s, sp->a, sp->b, lead0));
        sp->have = 1, sp->a = a, sp->b = b;
        return DFM_OK;
    }
    default: /* MergedWithNext: a match joins the non-match after it */
        if (sp->have) {
            sp->have = 0;
            if (!m) return emit(c, stage, s, sp->a, b, lead0);
            DFM_TRY(emit(c, stage, s, sp->a, sp->b, lead0));
        }
        if (m) {
            sp->have = 1, sp->a = a, sp->b = b;
            return DFM_OK;
        }
        return emit(c, stage, s, a, b, lead0);
    }
}

static int seg_end(dfm_enc_ctx *c, size_t stage, const uint8_t *s, size_t lead0, splitter *sp) {
    return sp->have && sp->beh != DFM_BEH_ISOLATED && sp->beh != DFM_BEH_REMOVED ? emit(c, stage, s, sp->a, sp->b, lead0)
                                                                                  : DFM_OK;
}

static int in_class(const dfm_pre_stage *st, uint32_t cp) {
    switch (st->cls) {
    case DFM_CLASS_WS: return dfm_uc_is_ws(cp);
    case DFM_CLASS_PUNCT: return dfm_uc_is_punct(cp);
    case DFM_CLASS_NUMERIC: return dfm_uc_is_numeric(cp);
    default: return cp == st->ch;
    }
}

/* Segments of a character class: each member is a match of its own. */
static int split_chars(dfm_enc_ctx *c, size_t stage, const dfm_pre_stage *st, const uint8_t *s, size_t n, size_t lead0,
                       int beh) {
    splitter sp = {.beh = beh};
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = (size_t)dfm_utf8_next(s + i, n - i, &cp);
        if (in_class(st, cp)) {
            if (last < i) DFM_TRY(seg(c, stage, s, lead0, &sp, last, i, 0));
            DFM_TRY(seg(c, stage, s, lead0, &sp, i, i + l, 1));
            last = i + l;
        }
        i += l;
    }
    if (last < n) DFM_TRY(seg(c, stage, s, lead0, &sp, last, n, 0));
    return seg_end(c, stage, s, lead0, &sp);
}

static int split_regex(dfm_enc_ctx *c, size_t stage, const dfm_regex *re, int beh, int invert, const uint8_t *s, size_t n,
                       size_t lead0) {
    splitter sp = {.beh = beh};
    size_t prev = 0, ms, me;
    int r;
    dfm_regex_iter it;
    dfm_regex_start(&it, re, s, n);
    if (beh == DFM_BEH_ISOLATED) { /* every segment is a piece (GPT-2, Llama-3, Qwen): no grouping */
        while ((r = dfm_regex_next(&c->rx, &it, s, n, &ms, &me)) == 1) {
            if (prev != ms) DFM_TRY(emit(c, stage, s, prev, ms, lead0));
            DFM_TRY(emit(c, stage, s, ms, me, lead0));
            prev = me;
        }
        return r < 0 ? r : emit(c, stage, s, prev, n, lead0);
    }
    while ((r = dfm_regex_next(&c->rx, &it, s, n, &ms, &me)) == 1) {
        if (prev != ms) DFM_TRY(seg(c, stage, s, lead0, &sp, prev, ms, invert));
        DFM_TRY(seg(c, stage, s, lead0, &sp, ms, me, !invert));
        prev = me;
    }
    if (r < 0) return r;
    if (prev != n) DFM_TRY(seg(c, stage, s, lead0, &sp, prev, n, invert));
    return seg_end(c, stage, s, lead0, &sp);
}

/* Whitespace: runs of \w, and runs of what is neither \w nor White_Space. */
static int split_whitespace(dfm_enc_ctx *c, size_t stage, const uint8_t *s, size_t n, size_t lead0) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = (size_t)dfm_utf8_next(s + i, n - i, &cp);
        if (dfm_uc_is_ws(cp)) {
            i += l;
            continue;
        }
        int word = dfm_uc_is_word(cp);
        size_t j = i + l;
        while (j < n) {
            size_t k = (size_t)dfm_utf8_next(s + j, n - j, &cp);
            if (word ? !dfm_uc_is_word(cp) : (dfm_uc_is_word(cp) || dfm_uc_is_ws(cp))) break;
            j += k;
        }
        DFM_TRY(emit(c, stage, s, i, j, lead0));
        i = j;
    }
    return DFM_OK;
}

/* UnicodeScripts (pre_tokenizers/unicode_scripts/pre_tokenizer.rs): a cut before each character whose
 * script is not Any and differs from the last script that was not Any (the first such character cuts
 * too); the pieces lie between consecutive cuts and the end. */
static int split_scripts(dfm_enc_ctx *c, size_t stage, const uint8_t *s, size_t n, size_t lead0) {
    int last = -2; /* none yet */
    size_t cut = SIZE_MAX;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = (size_t)dfm_utf8_next(s + i, n - i, &cp);
        int sc = dfm_uc_script(cp); /* the table is the fixed one: Hiragana, Katakana and U+30FC are Han, " " Any */
        if (sc != -1 && sc != last) {
            if (cut != SIZE_MAX) DFM_TRY(emit(c, stage, s, cut, i, lead0));
            cut = i;
        }
        if (sc != -1) last = sc;
        i += l;
    }
    return cut != SIZE_MAX ? emit(c, stage, s, cut, n, lead0) : DFM_OK;
}

static int split_fixed(dfm_enc_ctx *c, size_t stage, const dfm_pre_stage *st, const uint8_t *s, size_t n, size_t lead0) {
    size_t start = 0, k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)dfm_utf8_next(s + i, n - i, &cp);
        if (++k == st->length) {
            DFM_TRY(emit(c, stage, s, start, i, lead0));
            start = i, k = 0;
        }
    }
    return emit(c, stage, s, start, n, lead0);
}

/* ================================================================ the stages in turn */

/* The piece as the model sees it: back from the byte-level alphabet to raw bytes when stages after
 * ByteLevel worked on that string. */
static int to_model(dfm_enc_ctx *c, const uint8_t *s, size_t n) {
    if (!c->tok->bl_mapped) return dfm_model_piece(c, s, n);
    sbuf *b = &c->tmp2;
    b->n = 0;
    DFM_TRY(dfm_sbuf_reserve(b, n + 1));
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)dfm_utf8_next(s + i, n - i, &cp);
        int byte = dfm_bytelevel_byte(cp);
        if (byte < 0) return DFM_FAIL(DFM_EINTERNAL, "a byte-level piece holds U+%04X, outside the byte alphabet", cp);
        b->p[b->n++] = (char)byte;
    }
    return dfm_model_piece(c, (const uint8_t *)b->p, b->n);
}

int dfm_pre_tokenize(dfm_enc_ctx *c, size_t stage, const uint8_t *s, size_t n, size_t lead0) {
    const dfm_tokenizer *tok = c->tok;
    if (!n) return DFM_OK;
    if (stage == tok->n_pre) return to_model(c, s, n);
    const dfm_pre_stage *st = &tok->pre[stage];
    if (st->kind == DFM_PRE_BYTELEVEL && !st->re && !st->map_out && (!st->prefix || s[0] == ' '))
        return dfm_pre_tokenize(c, stage + 1, s, n, lead0); /* nothing to add or split: raw bytes go on */
    sbuf *b = &c->stage_in[stage]; /* this stage's copy of its input: deeper stages have their own */
    switch (st->kind) {
    case DFM_PRE_SPLIT: return split_regex(c, stage, st->re, st->behavior, st->invert, s, n, lead0);
    case DFM_PRE_CHARS: return split_chars(c, stage, st, s, n, lead0, st->behavior);
    case DFM_PRE_WHITESPACE: return split_whitespace(c, stage, s, n, lead0);
    case DFM_PRE_SCRIPTS: return split_scripts(c, stage, s, n, lead0);
    case DFM_PRE_FIXED: return split_fixed(c, stage, st, s, n, lead0);
    case DFM_PRE_BYTELEVEL:
        if (st->prefix && s[0] != ' ') { /* the space takes the alignment of the first character */
            b->n = 0;
            DFM_TRY(dfm_sbuf_add(b, " ", 1));
            DFM_TRY(dfm_sbuf_add(b, s, n));
            s = (const uint8_t *)b->p, n = b->n, lead0 = lead0 ? lead0 + 1 : 0;
        }
        if (st->re) return split_regex(c, stage, st->re, DFM_BEH_ISOLATED, 0, s, n, lead0);
        return emit(c, stage, s, 0, n, lead0);
    default: { /* Metaspace */
        b->n = 0;
        size_t lo = 0;
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') DFM_TRY(dfm_sbuf_add(b, st->rep, (size_t)st->rep_len));
            else DFM_TRY(dfm_sbuf_add(b, s + i, 1));
            if (i < lead0) lo = b->n;
        }
        int starts = b->n >= (size_t)st->rep_len && !memcmp(b->p, st->rep, (size_t)st->rep_len);
        if (!starts && (st->prefix == 1 || (st->prefix == 2 && lead0))) {
            DFM_TRY(dfm_sbuf_reserve(b, b->n + (size_t)st->rep_len + 1));
            memmove(b->p + st->rep_len, b->p, b->n + 1);
            memcpy(b->p, st->rep, (size_t)st->rep_len);
            b->n += (size_t)st->rep_len;
            lo = lo ? lo + (size_t)st->rep_len : 0;
        }
        const uint8_t *m = (const uint8_t *)b->p;
        if (!st->split) return emit(c, stage, m, 0, b->n, lo);
        dfm_pre_stage rep = {.cls = DFM_CLASS_CHAR, .ch = st->ch};
        return split_chars(c, stage, &rep, m, b->n, lo, DFM_BEH_MERGED_NEXT);
    }
    }
}
