/* wordpiece.c — BertNormalizer + BertPreTokenizer + WordPiece, matching Hugging Face `tokenizers`.
 * See wordpiece.h. The Unicode rules mirror tokenizers/src/normalizers/bert.rs and
 * pre_tokenizers/bert.rs:
 *   clean_text:   drop U+0000, U+FFFD and "other" chars except \t \n \r; map White_Space chars to ' '
 *   chinese:      ' ' c ' ' for c in the CJK ideograph blocks (is_chinese_char); c is then normalised
 *                 like any other character (a CJK compatibility ideograph decomposes under NFD)
 *   strip_accents NFD, then drop non-spacing marks
 * "Other", punctuation and non-spacing marks are the classes `tokenizers` itself uses, generated from it
 * into tokenizer/tok_unicode_tables.h: they come from an older Unicode table than utf8proc's, and unassigned code
 * points (Cn) are not "other" there (they reach WordPiece and become [UNK]). NFD and lowercase follow
 * current Unicode through utf8proc, as `tokenizers` does through Rust's own tables.
 *   lowercase:    per-char full lowercase (char::to_lowercase)
 *   pre-tokenize: split on White_Space (dropped) and on punctuation (ASCII punctuation or P*), kept
 *                 as one-char words
 *   WordPiece:    words over max_input_chars_per_word chars -> [UNK]; greedy longest match, "##"
 *                 before non-initial pieces; any unmatched remainder -> the whole word is [UNK]. */
#include "encoder/wordpiece.h"
#include "tokenizer/tok_unicode.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include <xxhash.h>

typedef struct {
    char *text;
    size_t len;
    int32_t id;
    int32_t first; /* first code point */
} added_tok;

struct dfm_wordpiece {
    char **tokens; /* id -> string (NULL for holes) */
    uint32_t n_tokens;
    uint32_t *table; /* open addressing: id + 1, 0 = empty */
    size_t table_mask;
    int lowercase, strip_accents, clean_text, chinese;
    int max_chars;
    char *prefix; /* "##" */
    size_t prefix_len;
    int32_t unk, cls, sep, pad;
    added_tok *added; /* raw-text special tokens, longest first */
    int n_added;
};

/* ---- vocabulary -------------------------------------------------------------------------------- */
static size_t hash_str(const char *s, size_t n) { return (size_t)XXH3_64bits(s, n); }

static int32_t lookup(const dfm_wordpiece *wp, const char *s, size_t n) {
    size_t h = hash_str(s, n) & wp->table_mask;
    for (;;) {
        uint32_t e = wp->table[h];
        if (!e) return -1;
        const char *t = wp->tokens[e - 1];
        if (strlen(t) == n && !memcmp(t, s, n)) return (int32_t)(e - 1);
        h = (h + 1) & wp->table_mask;
    }
}

static int build_table(dfm_wordpiece *wp, const char *file) {
    size_t cap = 16;
    while (cap < (size_t)wp->n_tokens * 2 + 2) cap <<= 1;
    wp->table = calloc(cap, sizeof *wp->table);
    if (!wp->table) return DFM_FAIL(DFM_ENOMEM, "no memory for the vocabulary of %s", file);
    wp->table_mask = cap - 1;
    for (uint32_t id = 0; id < wp->n_tokens; id++) {
        const char *t = wp->tokens[id];
        if (!t) continue;
        size_t n = strlen(t);
        if (lookup(wp, t, n) >= 0) continue; /* duplicate string: first id wins */
        size_t h = hash_str(t, n) & wp->table_mask;
        while (wp->table[h]) h = (h + 1) & wp->table_mask;
        wp->table[h] = id + 1;
    }
    return DFM_OK;
}

void dfm_wordpiece_free(dfm_wordpiece *wp) {
    if (!wp) return;
    if (wp->tokens)
        for (uint32_t i = 0; i < wp->n_tokens; i++) free(wp->tokens[i]);
    free(wp->tokens);
    free(wp->table);
    free(wp->prefix);
    for (int i = 0; i < wp->n_added; i++) free(wp->added[i].text);
    free(wp->added);
    free(wp);
}

static int set_token(dfm_wordpiece *wp, const char *file, json_int_t id, const char *s) {
    if (id < 0 || id > 10000000) return DFM_FAIL(DFM_EFORMAT, "%s: token \"%s\" has id %lld out of range", file, s, (long long)id);
    if ((uint32_t)id >= wp->n_tokens) {
        uint32_t n = (uint32_t)id + 1;
        char **nt = realloc(wp->tokens, n * sizeof *nt);
        if (!nt) return DFM_FAIL(DFM_ENOMEM, "no memory");
        memset(nt + wp->n_tokens, 0, (n - wp->n_tokens) * sizeof *nt);
        wp->tokens = nt;
        wp->n_tokens = n;
    }
    if (wp->tokens[id]) return DFM_OK; /* keep the vocabulary's own entry */
    wp->tokens[id] = strdup(s);
    return wp->tokens[id] ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
}

static int cmp_added(const void *a, const void *b) {
    const added_tok *x = a, *y = b;
    return x->len < y->len ? 1 : x->len > y->len ? -1 : 0;
}

static int add_raw_token(dfm_wordpiece *wp, const char *s, int32_t id) {
    added_tok *na = realloc(wp->added, (wp->n_added + 1) * sizeof *na);
    if (!na) return DFM_FAIL(DFM_ENOMEM, "no memory");
    wp->added = na;
    na[wp->n_added].text = strdup(s);
    na[wp->n_added].len = strlen(s);
    na[wp->n_added].id = id;
    utf8proc_int32_t c0 = -1;
    utf8proc_iterate((const utf8proc_uint8_t *)s, -1, &c0);
    na[wp->n_added].first = c0;
    if (!na[wp->n_added].text) return DFM_FAIL(DFM_ENOMEM, "no memory");
    wp->n_added++;
    return DFM_OK;
}

static int bool_or_null(json_t *o, const char *key, int dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int load_tokenizer_json(dfm_wordpiece *wp, const char *file) {
    json_error_t err;
    json_t *root = json_load_file(file, 0, &err);
    if (!root) return DFM_FAIL(DFM_EFORMAT, "%s: invalid JSON at line %d: %s", file, err.line, err.text);
    int rc = DFM_OK;
    json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    json_t *norm = json_object_get(root, "normalizer"), *pre = json_object_get(root, "pre_tokenizer");
    const char *ntype = json_string_value(json_object_get(norm, "type"));
    const char *ptype = json_string_value(json_object_get(pre, "type"));
    if (!mtype || strcmp(mtype, "WordPiece"))
        rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: model.type is \"%s\"; the encoder supports WordPiece (BERT family) only",
                      file, mtype ? mtype : "(missing)");
    else if (!json_is_null(norm) && norm && (!ntype || strcmp(ntype, "BertNormalizer")))
        rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: normalizer.type is \"%s\"; only BertNormalizer is supported", file,
                      ntype ? ntype : "(missing)");
    else if (!json_is_null(pre) && pre && (!ptype || strcmp(ptype, "BertPreTokenizer")))
        rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: pre_tokenizer.type is \"%s\"; only BertPreTokenizer is supported", file,
                      ptype ? ptype : "(missing)");
    if (!rc) {
        if (ntype) {
            wp->clean_text = bool_or_null(norm, "clean_text", 1);
            wp->chinese = bool_or_null(norm, "handle_chinese_chars", 1);
            wp->lowercase = bool_or_null(norm, "lowercase", 1);
            wp->strip_accents = bool_or_null(norm, "strip_accents", wp->lowercase);
        }
        json_t *mc = json_object_get(model, "max_input_chars_per_word");
        wp->max_chars = json_is_integer(mc) ? (int)json_integer_value(mc) : 100;
        if (wp->max_chars < 1 || wp->max_chars > 100000)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: model.max_input_chars_per_word %d is outside 1..100000", file, wp->max_chars);
        const char *pfx = json_string_value(json_object_get(model, "continuing_subword_prefix"));
        wp->prefix = strdup(pfx ? pfx : "##");
        wp->prefix_len = wp->prefix ? strlen(wp->prefix) : 0;
        if (!rc && (!wp->prefix || wp->prefix_len > 16))
            rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: model.continuing_subword_prefix longer than 16 bytes", file);
        json_t *vocab = json_object_get(model, "vocab");
        if (!json_is_object(vocab) || json_object_size(vocab) == 0)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: model.vocab is missing or empty", file);
        const char *k;
        json_t *v;
        json_object_foreach(vocab, k, v) {
            if (rc) break;
            if (!json_is_integer(v)) rc = DFM_FAIL(DFM_EFORMAT, "%s: model.vocab[\"%s\"] is not an integer", file, k);
            else rc = set_token(wp, file, json_integer_value(v), k);
        }
        json_t *added = json_object_get(root, "added_tokens");
        size_t i;
        json_array_foreach(added, i, v) {
            if (rc) break;
            const char *content = json_string_value(json_object_get(v, "content"));
            json_t *jid = json_object_get(v, "id");
            if (!content || !json_is_integer(jid)) {
                rc = DFM_FAIL(DFM_EFORMAT, "%s: added_tokens[%zu] needs \"content\" and \"id\"", file, i);
                break;
            }
            rc = set_token(wp, file, json_integer_value(jid), content);
            /* tokens with normalized=false are matched in the raw text; normalized ones (rare for BERT) are
             * treated the same way, which is exact when the token survives normalisation unchanged */
            if (!rc && content[0]) rc = add_raw_token(wp, content, (int32_t)json_integer_value(jid));
        }
        const char *unk = json_string_value(json_object_get(model, "unk_token"));
        if (!rc) {
            wp->unk = -1;
            rc = build_table(wp, file);
            if (!rc && unk) wp->unk = lookup(wp, unk, strlen(unk));
            if (!rc && wp->unk < 0)
                rc = DFM_FAIL(DFM_EFORMAT, "%s: model.unk_token \"%s\" is not in the vocabulary", file, unk ? unk : "(missing)");
        }
        /* post-processor: [CLS] ... [SEP] (TemplateProcessing or BertProcessing) */
        json_t *post = json_object_get(root, "post_processor");
        const char *cls = "[CLS]", *sep = "[SEP]";
        const char *post_type = json_string_value(json_object_get(post, "type"));
        if (!rc && post_type && !strcmp(post_type, "BertProcessing")) {
            cls = json_string_value(json_array_get(json_object_get(post, "cls"), 0));
            sep = json_string_value(json_array_get(json_object_get(post, "sep"), 0));
        } else if (!rc && post_type && !strcmp(post_type, "TemplateProcessing")) {
            json_t *single = json_object_get(post, "single");
            size_t n = json_array_size(single);
            const char *first = json_string_value(json_object_get(json_object_get(json_array_get(single, 0), "SpecialToken"), "id"));
            const char *last = json_string_value(json_object_get(json_object_get(json_array_get(single, n ? n - 1 : 0), "SpecialToken"), "id"));
            if (n != 3 || !first || !last)
                rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: post_processor.single is not [CLS] $A [SEP]", file);
            cls = first;
            sep = last;
        } else if (!rc && post_type) {
            rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: post_processor.type \"%s\" is not supported", file, post_type);
        }
        if (!rc) {
            wp->cls = cls ? lookup(wp, cls, strlen(cls)) : -1;
            wp->sep = sep ? lookup(wp, sep, strlen(sep)) : -1;
            wp->pad = lookup(wp, "[PAD]", 5);
            if (wp->pad < 0) wp->pad = 0;
            if (wp->cls < 0 || wp->sep < 0)
                rc = DFM_FAIL(DFM_EFORMAT, "%s: the post-processor's special tokens are not in the vocabulary", file);
        }
    }
    json_decref(root);
    return rc;
}

static int load_vocab_txt(dfm_wordpiece *wp, const char *dir, const char *file) {
    char *buf;
    size_t len;
    DFM_TRY(dfm_read_file(file, &buf, &len));
    int rc = DFM_OK;
    json_int_t id = 0;
    for (char *p = buf, *end = buf + len; p < end && !rc; id++) {
        char *nl = memchr(p, '\n', end - p);
        if (!nl) nl = end;
        char *e = nl;
        if (e > p && e[-1] == '\r') e--;
        char save = *e;
        *e = 0;
        rc = set_token(wp, file, id, p);
        *e = save;
        p = nl + 1;
    }
    free(buf);
    DFM_TRY(rc);
    /* tokenizer_config.json, if present, says how to normalise */
    wp->clean_text = wp->chinese = wp->lowercase = 1;
    char *cfg = dfm_path_join(dir, "tokenizer_config.json");
    json_t *c = cfg && dfm_path_exists(cfg) ? json_load_file(cfg, 0, NULL) : NULL;
    if (c) {
        wp->lowercase = bool_or_null(c, "do_lower_case", 1);
        wp->chinese = bool_or_null(c, "tokenize_chinese_chars", 1);
    }
    wp->strip_accents = c ? bool_or_null(c, "strip_accents", wp->lowercase) : wp->lowercase;
    json_decref(c);
    free(cfg);
    wp->max_chars = 100;
    wp->prefix = strdup("##");
    wp->prefix_len = 2;
    DFM_TRY(build_table(wp, file));
    wp->unk = lookup(wp, "[UNK]", 5);
    wp->cls = lookup(wp, "[CLS]", 5);
    wp->sep = lookup(wp, "[SEP]", 5);
    wp->pad = lookup(wp, "[PAD]", 5);
    if (wp->pad < 0) wp->pad = 0;
    if (wp->unk < 0 || wp->cls < 0 || wp->sep < 0)
        return DFM_FAIL(DFM_EFORMAT, "%s: [UNK], [CLS] or [SEP] is missing from the vocabulary", file);
    static const char *specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (int i = 0; i < 5; i++) {
        int32_t sid = lookup(wp, specials[i], strlen(specials[i]));
        if (sid >= 0) DFM_TRY(add_raw_token(wp, specials[i], sid));
    }
    return DFM_OK;
}

int dfm_wordpiece_load(const char *model_dir, dfm_wordpiece **out) {
    *out = NULL;
    dfm_wordpiece *wp = calloc(1, sizeof *wp);
    if (!wp) return DFM_FAIL(DFM_ENOMEM, "no memory");
    char *tj = dfm_path_join(model_dir, "tokenizer.json"), *vt = dfm_path_join(model_dir, "vocab.txt");
    int rc;
    if (!tj || !vt) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    else if (dfm_path_exists(tj)) rc = load_tokenizer_json(wp, tj);
    else if (dfm_path_exists(vt)) rc = load_vocab_txt(wp, model_dir, vt);
    else
        rc = DFM_FAIL(DFM_ENOTFOUND, "%s: neither tokenizer.json nor vocab.txt found. HINT: point --model at a Hugging "
                      "Face BERT-family model folder", model_dir);
    free(tj);
    free(vt);
    if (!rc && wp->n_added) qsort(wp->added, wp->n_added, sizeof *wp->added, cmp_added);
    if (rc) {
        dfm_wordpiece_free(wp);
        return rc;
    }
    *out = wp;
    return DFM_OK;
}

uint32_t dfm_wordpiece_vocab_size(const dfm_wordpiece *wp) { return wp->n_tokens; }
int32_t dfm_wordpiece_cls_id(const dfm_wordpiece *wp) { return wp->cls; }
int32_t dfm_wordpiece_sep_id(const dfm_wordpiece *wp) { return wp->sep; }
int32_t dfm_wordpiece_pad_id(const dfm_wordpiece *wp) { return wp->pad; }
int32_t dfm_wordpiece_token_id(const dfm_wordpiece *wp, const char *t) { return lookup(wp, t, strlen(t)); }
const char *dfm_wordpiece_token(const dfm_wordpiece *wp, int32_t id) {
    return (id >= 0 && (uint32_t)id < wp->n_tokens) ? wp->tokens[id] : NULL;
}

/* ---- encoding ---------------------------------------------------------------------------------- */
typedef struct {
    int32_t *v;
    int n, cap;
} i32buf;

static int push(i32buf *b, int32_t x) {
    if (b->n == b->cap) {
        int nc = b->cap ? b->cap * 2 : 256;
        int32_t *nv = realloc(b->v, nc * sizeof *nv);
        if (!nv) return DFM_FAIL(DFM_ENOMEM, "no memory while tokenizing");
        b->v = nv;
        b->cap = nc;
    }
    b->v[b->n++] = x;
    return DFM_OK;
}

/* The classes of `tokenizers` itself (tokenizer/tok_unicode.h, generated from the library). */
static int is_ws(int32_t c) { return dfm_uc_is_ws((uint32_t)c); }
static int is_other(int32_t c) { return dfm_uc_is_other((uint32_t)c); }
static int is_mark(int32_t c) { return dfm_uc_is_mn((uint32_t)c); }
static int is_chinese(int32_t c) { return dfm_uc_is_chinese((uint32_t)c); }
static int is_punct(int32_t c) { return dfm_uc_is_punct((uint32_t)c); }

/* Decode UTF-8 (invalid sequences -> U+FFFD, one per maximal invalid prefix as utf8proc_iterate
 * reports it). */
static int decode_utf8(const char *s, size_t len, i32buf *out) {
    size_t i = 0;
    while (i < len) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &c);
        if (k <= 0) {
            c = 0xFFFD;
            k = 1;
        }
        DFM_TRY(push(out, c));
        i += (size_t)k;
    }
    return DFM_OK;
}

/* Accent stripping and lowercasing of one character, appended to out. */
static int normalize_char(const dfm_wordpiece *wp, int32_t c, i32buf *out) {
    if (wp->strip_accents && c >= 0x80) {
        utf8proc_int32_t d[32];
        int last = 0;
        utf8proc_ssize_t k = utf8proc_decompose_char(c, d, 32, UTF8PROC_DECOMPOSE, &last);
        if (k > 0 && k <= 32) {
            for (int j = 0; j < k; j++) {
                if (is_mark(d[j])) continue;
                int32_t x = wp->lowercase ? utf8proc_tolower(d[j]) : d[j];
                if (wp->lowercase && d[j] == 0x130) {
                    DFM_TRY(push(out, 'i'));
                    x = 0x307;
                }
                DFM_TRY(push(out, x));
            }
            return DFM_OK;
        }
    }
    if (wp->lowercase) {
        if (c == 0x130) { /* the one unconditional multi-char lowercase mapping */
            DFM_TRY(push(out, 'i'));
            c = 0x307;
        } else if (c >= 'A' && c <= 'Z') {
            c += 32;
        } else if (c >= 0x80) {
            c = utf8proc_tolower(c);
        }
    }
    return push(out, c);
}

/* Normalise code points in[0..n) into out (BertNormalizer). */
static int normalize(const dfm_wordpiece *wp, const int32_t *in, int n, i32buf *out) {
    for (int i = 0; i < n; i++) {
        int32_t c = in[i];
        if (wp->clean_text) {
            if (c == 0 || c == 0xFFFD || (c != '\t' && c != '\n' && c != '\r' && is_other(c))) continue;
            if (is_ws(c)) c = ' ';
        }
        int pad = wp->chinese && is_chinese(c);
        if (pad) DFM_TRY(push(out, ' '));
        DFM_TRY(normalize_char(wp, c, out));
        if (pad) DFM_TRY(push(out, ' '));
    }
    return DFM_OK;
}
/* WordPiece one word (code points w[0..n)); appends pieces. */
static int wordpiece_word(const dfm_wordpiece *wp, const int32_t *w, int n, i32buf *ids, char *scratch) {
    if (n > wp->max_chars) return push(ids, wp->unk);
    /* UTF-8 of the word with char boundaries; scratch holds (max_chars + 2) ints, then the bytes */
    int *off = (int *)scratch;
    scratch += sizeof(int) * ((size_t)wp->max_chars + 2);
    char *u = scratch + wp->prefix_len; /* leave room for the prefix before it */
    int pos = 0;
    for (int i = 0; i < n; i++) {
        off[i] = pos;
        pos += (int)utf8proc_encode_char(w[i], (utf8proc_uint8_t *)u + pos);
    }
    off[n] = pos;
    int start = 0, first = ids->n;
    while (start < n) {
        int end = n, found = -1;
        while (end > start) {
            const char *key = u + off[start];
            size_t klen = (size_t)(off[end] - off[start]);
            int32_t id;
            if (start > 0) {
                /* "##" + piece: build in place just before the piece */
                char save[16];
                char *k2 = (char *)key - wp->prefix_len;
                memcpy(save, k2, wp->prefix_len);
                memcpy(k2, wp->prefix, wp->prefix_len);
                id = lookup(wp, k2, klen + wp->prefix_len);
                memcpy(k2, save, wp->prefix_len);
            } else {
                id = lookup(wp, key, klen);
            }
            if (id >= 0) {
                found = id;
                break;
            }
            end--;
        }
        if (found < 0) {
            ids->n = first;
            return push(ids, wp->unk);
        }
        DFM_TRY(push(ids, found));
        start = end;
    }
    return DFM_OK;
}

/* Normalise, pre-tokenize and WordPiece a span of raw code points; stop once ids->n >= limit. */
static int encode_span(const dfm_wordpiece *wp, const int32_t *cp, int n, i32buf *norm, i32buf *ids, int limit,
                       char *scratch) {
    norm->n = 0;
    DFM_TRY(normalize(wp, cp, n, norm));
    int ws = -1;
    for (int i = 0; i <= norm->n && ids->n < limit; i++) {
        int32_t c = i < norm->n ? norm->v[i] : ' ';
        int sp = is_ws(c), pu = !sp && is_punct(c);
        if (sp || pu) {
            if (ws >= 0) DFM_TRY(wordpiece_word(wp, norm->v + ws, i - ws, ids, scratch));
            ws = -1;
            if (pu && ids->n < limit) DFM_TRY(wordpiece_word(wp, &norm->v[i], 1, ids, scratch));
        } else if (ws < 0) {
            ws = i;
        }
    }
    return DFM_OK;
}

int dfm_wordpiece_encode(const dfm_wordpiece *wp, const char *text, size_t len, int max_len, int32_t *out, int cap,
                         int *truncated) {
    if (truncated) *truncated = 0;
    i32buf cp = {0}, norm = {0}, ids = {0};
    /* scratch for one word: char offsets, then its UTF-8 (<= 4 bytes a char) after room for the prefix */
    char *scratch = malloc(sizeof(int) * ((size_t)wp->max_chars + 2) + 4 * ((size_t)wp->max_chars + 1) + 32);
    if (!scratch) return DFM_FAIL(DFM_ENOMEM, "no memory while tokenizing");
    int limit = max_len > 0 ? (max_len > 2 ? max_len - 2 : 0) : 0x3fffffff;
    int stop = limit + 2; /* ids.n (with [CLS]) at which one piece more than the limit is known */
    int rc = decode_utf8(text, len, &cp);
    if (!rc) rc = push(&ids, wp->cls);
    /* split the raw text on special added tokens (leftmost, longest: the list is sorted longest first) */
    int span = 0;
    for (int i = 0; i < cp.n && !rc && ids.n < stop; i++) {
        for (int a = 0; a < wp->n_added; a++) {
            const added_tok *t = &wp->added[a];
            if (t->first != cp.v[i]) continue;
            size_t k = 0;
            int j = i;
            while (k < t->len && j < cp.n) {
                utf8proc_uint8_t b[4];
                utf8proc_ssize_t m = utf8proc_encode_char(cp.v[j], b);
                if (k + (size_t)m > t->len || memcmp(b, t->text + k, (size_t)m)) break;
                k += (size_t)m;
                j++;
            }
            if (k == t->len) {
                if (span < i) rc = encode_span(wp, cp.v + span, i - span, &norm, &ids, stop, scratch);
                if (!rc && ids.n < stop) rc = push(&ids, t->id);
                span = j;
                i = j - 1;
                break;
            }
        }
    }
    if (!rc && span < cp.n && ids.n < stop) rc = encode_span(wp, cp.v + span, cp.n - span, &norm, &ids, stop, scratch);
    int n = 0;
    if (!rc) {
        int pieces = ids.n - 1;
        if (pieces > limit) {
            pieces = limit;
            if (truncated) *truncated = 1;
        }
        ids.n = 1 + pieces;
        rc = push(&ids, wp->sep);
        n = ids.n;
        for (int i = 0; i < n && i < cap; i++) out[i] = ids.v[i];
    }
    free(cp.v);
    free(norm.v);
    free(ids.v);
    free(scratch);
    return rc ? rc : n;
}
