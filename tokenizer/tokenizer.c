/* tokenizer.c — load a Hugging Face tokenizer.json (the model, its vocabulary and options, and the stages
 * the tok_*.c files parse); encode and decode with the same results as HF `tokenizers` (checked by
 * tests/unit/test_tokenizer.c on golden files made by tests/ref/make_tokenizer_golden.py, and by
 * tests/py/tokenizer/test_tokenizer_unicode.py against the library itself).
 *
 * Encode order, as HF's TokenizerImpl::encode_single_sequence:
 *   1. invalid UTF-8 -> U+FFFD (the caller of HF does this when turning bytes into a str);
 *   2. added tokens with normalized=false are cut out of the RAW text (leftmost, longest first);
 *   3. each gap is normalized, then added tokens with normalized=true are cut out of the normalized gap;
 *   4. each remaining piece goes through the pre-tokenizer stages;
 *   5. each pre-token is encoded by the model (BPE, Unigram, WordPiece, WordLevel), through the piece cache.
 */
#include "tokenizer/tokenizer.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_unicode.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int dfm_token_raw(const dfm_tokenizer *tok, const char *s, size_t n, sbuf *b, size_t *len) {
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
            b->p[b->n] = 0;
            *len = b->n - start;
            return DFM_OK;
        }
        b->n = start;
    }
    DFM_TRY(dfm_sbuf_add(b, s, n));
    *len = n;
    return DFM_OK;
}

/* ================================================================ the id tables */

static int grow_ids(dfm_tokenizer *tok, uint32_t need) {
    if (need <= tok->n_ids) return DFM_OK;
    uint32_t n = need;
    char **k = realloc(tok->key, n * sizeof *k);
    if (k) tok->key = k;
    uint32_t *kl = realloc(tok->key_len, n * sizeof *kl);
    if (kl) tok->key_len = kl;
    char **d = realloc(tok->str, n * sizeof *d);
    if (d) tok->str = d;
    uint32_t *dl = realloc(tok->str_len, n * sizeof *dl);
    if (dl) tok->str_len = dl;
    uint8_t *sp = realloc(tok->is_special, n);
    if (sp) tok->is_special = sp;
    if (!k || !kl || !d || !dl || !sp) return DFM_FAIL(DFM_ENOMEM, "no memory for %u token ids", n);
    for (uint32_t i = tok->n_ids; i < n; i++) {
        tok->key[i] = tok->str[i] = NULL;
        tok->key_len[i] = tok->str_len[i] = 0;
        tok->is_special[i] = 0;
    }
    tok->n_ids = n;
    return DFM_OK;
}

/* The raw key of id (only ever set once: callers check). */
static int set_key(dfm_tokenizer *tok, uint32_t id, const char *s, size_t n) {
    sbuf b = {0};
    size_t len;
    DFM_TRY(dfm_token_raw(tok, s, n, &b, &len));
    if (!b.p) DFM_TRY(dfm_sbuf_add(&b, "", 0));
    tok->key[id] = b.p;
    tok->key_len[id] = (uint32_t)len;
    return DFM_OK;
}

/* The string the decoder sees for id: shares the key's bytes when equal. */
static int set_str(dfm_tokenizer *tok, uint32_t id, const char *s, size_t n) {
    if (tok->str[id] != tok->key[id]) free(tok->str[id]);
    tok->str[id] = NULL;
    if (tok->key[id] && tok->key_len[id] == n && !memcmp(tok->key[id], s, n)) {
        tok->str[id] = tok->key[id];
    } else if (!(tok->str[id] = dfm_tok_dupn(s, n))) {
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    tok->str_len[id] = (uint32_t)n;
    return DFM_OK;
}

/* ================================================================ the model's options and the stages */

static int load_model_head(dfm_load_ctx *lc, dfm_tokenizer *tok, json_t *root) {
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return DFM_LFAIL(lc, DFM_EFORMAT, "model: missing or not an object");
    const char *mtype = dfm_jstr(model, "type", NULL);
    json_t *vocab = json_object_get(model, "vocab");
    if (!mtype) { /* `tokenizers` tells the models apart by their fields when "type" is missing */
        if (json_object_get(model, "merges")) mtype = "BPE";
        else if (json_is_array(vocab)) mtype = "Unigram";
        else return DFM_LFAIL(lc, DFM_EFORMAT, "model.type: missing");
    }
    if (!strcmp(mtype, "BPE")) tok->model = DFM_MODEL_BPE;
    else if (!strcmp(mtype, "Unigram")) tok->model = DFM_MODEL_UNIGRAM;
    else if (!strcmp(mtype, "WordPiece")) tok->model = DFM_MODEL_WORDPIECE;
    else if (!strcmp(mtype, "WordLevel")) tok->model = DFM_MODEL_WORDLEVEL;
    else return DFM_LFAIL(lc, DFM_EUNSUPPORTED, "model.type: \"%s\" is not supported (supported: BPE, Unigram, WordPiece, "
                          "WordLevel)", mtype);
    if (tok->model == DFM_MODEL_UNIGRAM ? !json_is_array(vocab) : !json_is_object(vocab))
        return DFM_LFAIL(lc, DFM_EFORMAT, "model.vocab: missing or not an %s", tok->model == DFM_MODEL_UNIGRAM ? "array" : "object");
    const char *pre = NULL, *suf = NULL;
    size_t pre_len = 0, suf_len = 0;
    if (tok->model == DFM_MODEL_BPE) {
        if (!json_is_array(json_object_get(model, "merges")))
            return DFM_LFAIL(lc, DFM_EFORMAT, "model.merges: missing or not an array");
        json_t *dropout = json_object_get(model, "dropout");
        if (dropout && !json_is_null(dropout) && !json_is_number(dropout))
            return DFM_LFAIL(lc, DFM_EFORMAT, "model.dropout: not a number");
        if (json_is_number(dropout) && json_number_value(dropout) != 0)
            return DFM_LFAIL(lc, DFM_EUNSUPPORTED, "model.dropout: BPE dropout %g is not supported (it makes encoding "
                             "random). HINT: set it to null", json_number_value(dropout));
        DFM_TRY(dfm_jbool(lc, model, "byte_fallback", 0, "model", &tok->byte_fallback));
        DFM_TRY(dfm_jbool(lc, model, "fuse_unk", 0, "model", &tok->fuse_unk));
        DFM_TRY(dfm_jbool(lc, model, "ignore_merges", 0, "model", &tok->ignore_merges));
        pre = dfm_jstr(model, "continuing_subword_prefix", &pre_len);
        suf = dfm_jstr(model, "end_of_word_suffix", &suf_len);
    } else if (tok->model == DFM_MODEL_UNIGRAM) {
        DFM_TRY(dfm_jbool(lc, model, "byte_fallback", 0, "model", &tok->byte_fallback));
        json_t *u = json_object_get(model, "unk_id");
        if (u && !json_is_null(u) && (!json_is_integer(u) || json_integer_value(u) < 0))
            return DFM_LFAIL(lc, DFM_EFORMAT, "model.unk_id: not null or a non-negative integer");
    } else if (tok->model == DFM_MODEL_WORDPIECE) {
        pre = "##", pre_len = 2;
        json_t *p = json_object_get(model, "continuing_subword_prefix"), *m = json_object_get(model, "max_input_chars_per_word");
        if (p && !json_is_null(p)) {
            if (!json_is_string(p)) return DFM_LFAIL(lc, DFM_EFORMAT, "model.continuing_subword_prefix: not a string");
            pre = json_string_value(p), pre_len = json_string_length(p);
        }
        tok->max_word_chars = 100;
        if (m && !json_is_null(m)) {
            if (!json_is_integer(m) || json_integer_value(m) < 0)
                return DFM_LFAIL(lc, DFM_EFORMAT, "model.max_input_chars_per_word: not a non-negative integer");
            tok->max_word_chars = (size_t)json_integer_value(m);
        }
    }
    if ((pre && !(tok->prefix = dfm_tok_dupn(pre, pre_len))) || (suf && !(tok->suffix = dfm_tok_dupn(suf, suf_len))))
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    tok->prefix_len = pre ? pre_len : 0;
    tok->suffix_len = suf ? suf_len : 0;

    DFM_TRY(dfm_norm_parse(lc, tok, json_object_get(root, "normalizer"), "normalizer"));
    DFM_TRY(dfm_pre_parse(lc, tok, json_object_get(root, "pre_tokenizer"), "pre_tokenizer"));
    DFM_TRY(dfm_dec_parse(lc, tok, json_object_get(root, "decoder"), "decoder"));
    if (tok->byte_level && tok->model != DFM_MODEL_BPE)
        return DFM_LFAIL(lc, DFM_EUNSUPPORTED, "pre_tokenizer: a ByteLevel pre-tokenizer with a %s model is not "
                         "supported (only with BPE)", mtype);
    /* the prefix and suffix as raw key bytes */
    sbuf b = {0};
    size_t l1 = 0, l2 = 0;
    int rc = dfm_token_raw(tok, tok->prefix ? tok->prefix : "", tok->prefix_len, &b, &l1);
    if (!rc) rc = dfm_token_raw(tok, tok->suffix ? tok->suffix : "", tok->suffix_len, &b, &l2);
    if (!rc && (!(tok->prefix_raw = dfm_tok_dupn(b.p, l1)) || !(tok->suffix_raw = dfm_tok_dupn(b.p + l1, l2))))
        rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    tok->prefix_raw_len = l1, tok->suffix_raw_len = l2;
    free(b.p);
    return rc;
}

/* ================================================================ vocabulary */

/* Ids index tables, so their number is bounded by what the file holds, not by the largest id it claims:
 * one added token with id 2^31-1 would otherwise allocate and zero ~50 GB. Real tokenizers number their
 * entries densely (every id below the count is used); a few holes are allowed. */
static int check_id_bound(dfm_load_ctx *lc, uint32_t max_id, size_t n_entries) {
    uint64_t bound = 2 * (uint64_t)n_entries + 1024;
    if (max_id > bound)
        return DFM_LFAIL(lc, DFM_EFORMAT, "token id %u is far beyond the %zu entries of model.vocab and added_tokens "
                         "(ids must stay below 2 x entries + 1024 = %llu). HINT: the file is corrupt or crafted; use "
                         "the tokenizer.json published with the model", max_id - 1, n_entries, (unsigned long long)bound);
    return DFM_OK;
}

/* The ids the added tokens claim: *max_id raised past them. */
static int added_ids(dfm_load_ctx *lc, json_t *added, uint32_t *max_id) {
    if (added && !json_is_null(added) && !json_is_array(added)) return DFM_LFAIL(lc, DFM_EFORMAT, "added_tokens: not an array");
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i), *id = json_object_get(a, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1LL << 31) ||
            !dfm_jstr(a, "content", NULL))
            return DFM_LFAIL(lc, DFM_EFORMAT, "added_tokens[%zu]: needs an integer \"id\" and a string \"content\"", i);
        if ((uint32_t)json_integer_value(id) + 1 > *max_id) *max_id = (uint32_t)json_integer_value(id) + 1;
    }
    return DFM_OK;
}

/* BPE, WordPiece, WordLevel: {"token": id, ...} */
static int load_vocab_object(dfm_load_ctx *lc, dfm_tokenizer *tok, json_t *vocab, json_t *added) {
    uint32_t max_id = 0;
    const char *k;
    size_t kl;
    json_t *v;
    json_object_keylen_foreach(vocab, k, kl, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1LL << 31))
            return DFM_LFAIL(lc, DFM_EFORMAT, "model.vocab[\"%.*s\"]: id is not a non-negative integer", (int)kl, k);
        if ((uint32_t)json_integer_value(v) + 1 > max_id) max_id = (uint32_t)json_integer_value(v) + 1;
    }
    DFM_TRY(added_ids(lc, added, &max_id));
    DFM_TRY(check_id_bound(lc, max_id, json_object_size(vocab) + json_array_size(added)));
    DFM_TRY(grow_ids(tok, max_id));
    json_object_keylen_foreach(vocab, k, kl, v) {
        uint32_t id = (uint32_t)json_integer_value(v);
        if (tok->key[id]) return DFM_LFAIL(lc, DFM_EFORMAT, "model.vocab[\"%.*s\"]: id %u used twice", (int)kl, k, id);
        DFM_TRY(set_key(tok, id, k, kl));
        DFM_TRY(set_str(tok, id, k, kl));
    }
    DFM_TRY(dfm_strmap_init(&tok->vocab, json_object_size(vocab), (const char *const *)tok->key, tok->key_len));
    for (uint32_t id = 0; id < tok->n_ids; id++)
        if (tok->key[id]) dfm_strmap_put(&tok->vocab, id);
    return DFM_OK;
}

/* Unigram: [["piece", score], ...], ids in order; a repeated piece maps to its last id */
static int load_vocab_unigram(dfm_load_ctx *lc, dfm_tokenizer *tok, json_t *vocab, json_t *added, json_t *model) {
    size_t nv = json_array_size(vocab);
    uint32_t max_id = (uint32_t)(nv < (1u << 31) ? nv : (1u << 31));
    if (nv >= (1u << 31)) return DFM_LFAIL(lc, DFM_EFORMAT, "model.vocab: %zu pieces", nv);
    DFM_TRY(added_ids(lc, added, &max_id));
    DFM_TRY(check_id_bound(lc, max_id, nv + json_array_size(added)));
    DFM_TRY(grow_ids(tok, max_id));
    tok->scores = calloc(tok->n_ids ? tok->n_ids : 1, sizeof *tok->scores);
    if (!tok->scores) return DFM_FAIL(DFM_ENOMEM, "no memory for %u scores", tok->n_ids);
    tok->min_score = INFINITY;
    for (size_t i = 0; i < nv; i++) {
        json_t *e = json_array_get(vocab, i), *p = json_array_get(e, 0), *sc = json_array_get(e, 1);
        if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_string(p) || !json_is_number(sc))
            return DFM_LFAIL(lc, DFM_EFORMAT, "model.vocab[%zu]: not a [\"piece\", score] pair", i);
        DFM_TRY(set_key(tok, (uint32_t)i, json_string_value(p), json_string_length(p)));
        DFM_TRY(set_str(tok, (uint32_t)i, json_string_value(p), json_string_length(p)));
        tok->scores[i] = json_number_value(sc);
        if (tok->scores[i] < tok->min_score) tok->min_score = tok->scores[i];
    }
    if (!nv) tok->min_score = 0; /* no piece: nothing is ever scored (an unknown character is an error) */
    DFM_TRY(dfm_strmap_init(&tok->vocab, nv, (const char *const *)tok->key, tok->key_len));
    for (size_t i = nv; i-- > 0;) dfm_strmap_put(&tok->vocab, (uint32_t)i); /* the last of equal pieces wins */
    json_t *u = json_object_get(model, "unk_id");
    tok->unk_id = json_is_integer(u) ? json_integer_value(u) : -1;
    if (tok->unk_id >= (int64_t)nv)
        return DFM_LFAIL(lc, DFM_EFORMAT, "model.unk_id: %lld is not below the %zu pieces of model.vocab",
                         (long long)tok->unk_id, nv);
    return dfm_unigram_build(lc, tok);
}

/* The byte tokens (byte-level alphabet, <0xNN> byte fallback) and, for BPE and the word models, the
 * unknown token; from the vocabulary map, so the same for a parsed and a mapped tokenizer. */
static int load_byte_tokens(dfm_tokenizer *tok, json_t *model) {
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        tok->byte_id[b] = tok->byte_level ? (int32_t)dfm_strmap_get(&tok->vocab, &c, 1) : -1;
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b); /* ASCII: the same as raw key and as token string */
        tok->fb_id[b] = (int32_t)dfm_strmap_get(&tok->vocab, name, 6);
    }
    if (tok->model == DFM_MODEL_UNIGRAM) return DFM_OK; /* unk_id is an index */
    size_t n = 0;
    const char *unk = dfm_jstr(model, "unk_token", &n);
    if (!unk && tok->model == DFM_MODEL_WORDPIECE) unk = "[UNK]", n = 5;
    if (!unk && tok->model == DFM_MODEL_WORDLEVEL) unk = "<unk>", n = 5;
    tok->unk_id = -1;
    tok->unk_missing = 0;
    if (unk) {
        sbuf b = {0};
        size_t len;
        DFM_TRY(dfm_token_raw(tok, unk, n, &b, &len));
        tok->unk_id = dfm_strmap_get(&tok->vocab, b.p, len);
        tok->unk_missing = tok->unk_id < 0;
        free(b.p);
    }
    return DFM_OK;
}

/* model.merges ("a b" or ["a", "b"]) into the pair map, ranked by position. The merged token is a + b
 * without b's first len(continuing_subword_prefix) bytes, as `tokenizers` builds it. */
static int load_merges(dfm_load_ctx *lc, dfm_tokenizer *tok, json_t *merges) {
    size_t nm = json_array_size(merges);
    DFM_TRY(dfm_pairmap_init(&tok->pairs, nm));
    sbuf kb = {0}, mb = {0};
    int rc = DFM_OK;
    for (size_t i = 0; i < nm && !rc; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(m)) {
            a = json_string_value(m);
            size_t ml = json_string_length(m);
            const char *sp = memchr(a, ' ', ml);
            if (!sp || memchr(sp + 1, ' ', ml - (size_t)(sp + 1 - a))) {
                rc = DFM_LFAIL(lc, DFM_EFORMAT, "model.merges[%zu]: \"%s\" is not two tokens separated by one space", i, a);
                break;
            }
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = ml - al - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            al = json_string_length(json_array_get(m, 0));
            bl = json_string_length(json_array_get(m, 1));
        } else {
            rc = DFM_LFAIL(lc, DFM_EFORMAT, "model.merges[%zu]: neither \"a b\" nor [\"a\", \"b\"]", i);
            break;
        }
        if (bl < tok->prefix_len) {
            rc = DFM_LFAIL(lc, DFM_EFORMAT, "model.merges[%zu]: \"%.*s\" is shorter than continuing_subword_prefix", i,
                           (int)bl, b);
            break;
        }
        mb.n = 0;
        if ((rc = dfm_sbuf_add(&mb, a, al)) || (rc = dfm_sbuf_add(&mb, b + tok->prefix_len, bl - tok->prefix_len))) break;
        size_t ka, kbn, km;
        kb.n = 0;
        if ((rc = dfm_token_raw(tok, a, al, &kb, &ka)) || (rc = dfm_token_raw(tok, b, bl, &kb, &kbn)) ||
            (rc = dfm_token_raw(tok, mb.p, mb.n, &kb, &km)))
            break;
        int64_t ia = dfm_strmap_get(&tok->vocab, kb.p, ka);
        int64_t ib = dfm_strmap_get(&tok->vocab, kb.p + ka, kbn);
        int64_t im = dfm_strmap_get(&tok->vocab, kb.p + ka + kbn, km);
        if (ia < 0 || ib < 0 || im < 0) {
            rc = DFM_LFAIL(lc, DFM_EFORMAT, "model.merges[%zu]: \"%.*s\" + \"%.*s\": %s is not in model.vocab", i, (int)al, a,
                           (int)bl, b, ia < 0 ? "the first token" : ib < 0 ? "the second token" : "the merged token");
            break;
        }
        dfm_pairmap_put(&tok->pairs, (uint64_t)ia << 32 | (uint64_t)ib, (uint64_t)i << 32 | (uint64_t)im);
    }
    free(kb.p), free(mb.p);
    if (!rc) tok->n_merges = (uint32_t)nm;
    return rc;
}

/* ================================================================ added tokens */

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

/* added tokens: content, flags; their ids' key (when the model lacks them) and decode string (unless
 * ids_ready: the id tables came from a cache file that holds them); then the matchers that find them in
 * raw and normalized text */
static int load_added(dfm_load_ctx *lc, dfm_tokenizer *tok, json_t *added, int ids_ready) {
    int rc = DFM_OK;
    if (added && !json_is_null(added) && !json_is_array(added)) return DFM_LFAIL(lc, DFM_EFORMAT, "added_tokens: not an array");
    tok->n_added = json_array_size(added);
    tok->added = calloc(tok->n_added ? tok->n_added : 1, sizeof *tok->added);
    if (!tok->added) return DFM_FAIL(DFM_ENOMEM, "no memory");
    sbuf nb = {0}, raw = {0};
    for (size_t i = 0; i < tok->n_added && !rc; i++) {
        json_t *a = json_array_get(added, i);
        dfm_added_token *t = &tok->added[i];
        size_t clen = 0;
        const char *content = dfm_jstr(a, "content", &clen);
        json_t *jid = json_object_get(a, "id");
        if (!content || !json_is_integer(jid) || json_integer_value(jid) < 0 || json_integer_value(jid) >= tok->n_ids) {
            rc = DFM_LFAIL(lc, DFM_EFORMAT, "added_tokens[%zu]: needs a string \"content\" and an integer \"id\" below %u", i,
                           tok->n_ids);
            break;
        }
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        int flags[5];
        static const char *names[5] = {"special", "lstrip", "rstrip", "single_word", "normalized"};
        for (int f = 0; f < 5 && !rc; f++) rc = dfm_jbool(lc, a, names[f], f == 4 ? -1 : 0, where, &flags[f]);
        if (rc) break;
        t->id = (uint32_t)json_integer_value(jid);
        t->special = (uint8_t)flags[0], t->lstrip = (uint8_t)flags[1], t->rstrip = (uint8_t)flags[2];
        t->single_word = (uint8_t)flags[3];
        t->normalized = (uint8_t)(flags[4] < 0 ? !t->special : flags[4]);
        if (t->normalized && tok->n_norm) { /* matched against normalized text: normalize the content the same way */
            if ((rc = dfm_normalize_string(tok, content, clen, &nb))) break;
            t->content = dfm_tok_dupn(nb.p ? nb.p : "", nb.n);
            t->len = (uint32_t)nb.n;
        } else {
            t->content = dfm_tok_dupn(content, clen);
            t->len = (uint32_t)clen;
        }
        if (!t->content) { rc = DFM_FAIL(DFM_ENOMEM, "no memory"); break; }
        if (ids_ready) {
            if (!tok->key[t->id] || !tok->str[t->id]) rc = DFM_LFAIL(lc, DFM_EFORMAT, "%s: id %u has no token", where, t->id);
            continue;
        }
        if (!tok->key[t->id] && (rc = set_key(tok, t->id, content, clen))) break;
        /* `tokenizers` decodes an added token by its content (normalized, if the token is) */
        if ((rc = t->normalized ? set_str(tok, t->id, t->content, t->len) : set_str(tok, t->id, content, clen))) break;
    }
    /* skip_special drops a token whose string is a special token's content, whatever its id */
    for (size_t i = 0; i < tok->n_added && !rc; i++) {
        const dfm_added_token *t = &tok->added[i];
        if (!t->special) continue;
        tok->is_special[t->id] = 1;
        size_t clen = 0, len;
        const char *content = dfm_jstr(json_array_get(added, i), "content", &clen);
        raw.n = 0;
        if ((rc = dfm_token_raw(tok, content, clen, &raw, &len))) break;
        int64_t id = dfm_strmap_get(&tok->vocab, raw.p ? raw.p : "", len);
        if (id >= 0 && tok->str_len[id] == clen && !memcmp(tok->str[id], content, clen)) tok->is_special[id] = 1;
    }
    /* decode's fast path (a lone ByteLevel decoder: every id's key is its bytes) must skip the added tokens
     * whose key came from another string than the one the decoder sees */
    for (size_t i = 0; i < tok->n_added && !rc && tok->byte_level; i++) {
        uint32_t id = tok->added[i].id;
        size_t len;
        raw.n = 0;
        if ((rc = dfm_token_raw(tok, tok->str[id], tok->str_len[id], &raw, &len))) break;
        if (len == tok->key_len[id] && !memcmp(raw.p ? raw.p : "", tok->key[id], len)) continue;
        if (!tok->key_not_bytes && !(tok->key_not_bytes = calloc(tok->n_ids, 1))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        else tok->key_not_bytes[id] = 1;
    }
    free(nb.p), free(raw.p);
    if (rc) return rc;
    DFM_TRY(build_matcher(tok, &tok->raw_matcher, 0));
    DFM_TRY(build_matcher(tok, &tok->norm_matcher, 1));
    return DFM_OK;
}

/* ================================================================ description */

static void describe(dfm_tokenizer *tok) {
    static const char *norm_names[] = {"", "NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Strip", "StripAccents",
                                       "Replace", "Prepend", "BertNormalizer", "Nmt", "Precompiled"};
    static const char *dec_names[] = {"", "ByteLevel", "Metaspace", "WordPiece", "BPEDecoder", "Replace",
                                      "ByteFallback", "Fuse", "Strip", "CTC"};
    char nrm[200] = "", pre[200] = "", dec[200] = "", model[96];
    for (size_t i = 0; i < tok->n_norm; i++)
        snprintf(nrm + strlen(nrm), sizeof nrm - strlen(nrm), "%s%s", i ? "+" : "", norm_names[tok->norm[i].kind]);
    for (size_t i = 0; i < tok->n_pre; i++)
        if (*tok->pre[i].label) snprintf(pre + strlen(pre), sizeof pre - strlen(pre), "%s%s", *pre ? "+" : "", tok->pre[i].label);
    for (size_t i = 0; i < tok->n_dec; i++)
        snprintf(dec + strlen(dec), sizeof dec - strlen(dec), "%s%s", i ? "+" : "", dec_names[tok->dec[i].kind]);
    const char *fb = tok->byte_fallback ? " (byte fallback)" : "";
    switch (tok->model) {
    case DFM_MODEL_BPE:
        snprintf(model, sizeof model, "%sBPE, %u merges%s", tok->byte_level ? "byte-level " : "", tok->n_merges, fb);
        break;
    case DFM_MODEL_UNIGRAM: snprintf(model, sizeof model, "Unigram%s", fb); break;
    case DFM_MODEL_WORDPIECE: snprintf(model, sizeof model, "WordPiece"); break;
    default: snprintf(model, sizeof model, "WordLevel");
    }
    snprintf(tok->describe, sizeof tok->describe, "%s, %u ids, normalizer %s, pre-tokenizer %s, decoder %s", model,
             tok->n_ids, tok->n_norm ? nrm : "none", *pre ? pre : "none", tok->n_dec ? dec : "none");
}

/* ================================================================ loading */

static int load_json(dfm_load_ctx *lc, dfm_tokenizer *tok, json_t *root) {
    DFM_TRY(load_model_head(lc, tok, root));
    json_t *model = json_object_get(root, "model");
    json_t *added = json_object_get(root, "added_tokens");
    json_t *vocab = json_object_get(model, "vocab");
    if (tok->model == DFM_MODEL_UNIGRAM) DFM_TRY(load_vocab_unigram(lc, tok, vocab, added, model));
    else DFM_TRY(load_vocab_object(lc, tok, vocab, added));
    DFM_TRY(load_byte_tokens(tok, model));
    if (tok->model == DFM_MODEL_BPE) DFM_TRY(load_merges(lc, tok, json_object_get(model, "merges")));
    else if (tok->model != DFM_MODEL_UNIGRAM) DFM_TRY(dfm_pairmap_init(&tok->pairs, 0)); /* empty: the cache file has one */
    dfm_bpe_prepare(tok);
    DFM_TRY(load_added(lc, tok, added, 0));
    describe(tok);
    return DFM_OK;
}

/* tokenizer.json without model.vocab and model.merges (they are in the cache file's tables), as compact
 * JSON: what load_model_head and load_added read again when the cache is mapped. */
static char *meta_json(const dfm_tokenizer *tok, json_t *root, size_t *len) {
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
        json_object_set_new(model, "vocab", tok->model == DFM_MODEL_UNIGRAM ? json_array() : json_object());
        if (tok->model == DFM_MODEL_BPE) json_object_set_new(model, "merges", json_array());
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
    dfm_load_ctx lc = {cache_path};
    dfm_tokfile f;
    json_t *root = NULL;
    int rc = dfm_tokfile_check(map, bytes, src_hash, src_bytes, &f);
    if (rc) {
        dfm_error_prefix("%s", cache_path);
        dfm_unmap_file(map, bytes);
        return rc;
    }
    dfm_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        dfm_unmap_file(map, bytes);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    tok->map = map, tok->map_bytes = bytes, tok->hash = src_hash;
    rc = dfm_tok_cache_init(tok);
    if (!rc) {
        json_error_t jerr;
        root = json_loadb((const char *)f.sec[DFM_TOKC_META], f.sec_bytes[DFM_TOKC_META],
                          JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
        if (!json_is_object(root)) rc = DFM_LFAIL(&lc, DFM_EFORMAT, "meta section is not a JSON object: %s", jerr.text);
    }
    if (!rc) rc = load_model_head(&lc, tok, root);
    if (!rc) {
        rc = dfm_tokfile_fill(tok, &f);
        if (rc) dfm_error_prefix("%s", cache_path);
    }
    if (!rc) {
        json_t *model = json_object_get(root, "model");
        if (tok->model == DFM_MODEL_UNIGRAM) {
            json_t *u = json_object_get(model, "unk_id");
            if ((json_is_integer(u) ? json_integer_value(u) : -1) != tok->unk_id)
                rc = DFM_LFAIL(&lc, DFM_EFORMAT, "the header's unknown id differs from model.unk_id");
            rc = rc ? rc : load_byte_tokens(tok, model);
        } else {
            int64_t unk = tok->unk_id;
            rc = load_byte_tokens(tok, model); /* the unknown id again, from the mapped vocabulary */
            if (!rc && unk != tok->unk_id) rc = DFM_LFAIL(&lc, DFM_EFORMAT, "the header's unknown id differs from model.unk_token");
        }
    }
    if (!rc) rc = load_added(&lc, tok, json_object_get(root, "added_tokens"), 1);
    if (!rc) dfm_bpe_prepare(tok);
    if (!rc && tok->model == DFM_MODEL_UNIGRAM) dfm_unigram_prepare(tok);
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
static int load_parsed(dfm_load_ctx *lc, const char *buf, size_t len, uint64_t hash, char **meta, size_t *meta_len,
                       dfm_tokenizer **out) {
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    dfm_tokenizer *tok = NULL;
    int rc = DFM_OK;
    if (!root) {
        rc = DFM_LFAIL(lc, DFM_EFORMAT, "not valid JSON at line %d column %d: %s", jerr.line, jerr.column, jerr.text);
        goto done;
    }
    if (!json_is_object(root)) {
        rc = DFM_LFAIL(lc, DFM_EFORMAT, "top level is not a JSON object");
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
    if (!rc && meta) *meta = meta_json(tok, root, meta_len);
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
    dfm_load_ctx lc = {file};
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
            if (tok->str[i] != tok->key[i]) free(tok->str[i]);
            free(tok->key[i]);
        }
        dfm_strmap_free(&tok->vocab);
        dfm_pairmap_free(&tok->pairs);
        free(tok->scores), free(tok->trie_first), free(tok->trie_label), free(tok->trie_piece);
    }
    free(tok->key), free(tok->key_len), free(tok->str), free(tok->str_len), free(tok->is_special), free(tok->key_not_bytes);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    free(tok->raw_matcher.order);
    free(tok->norm_matcher.order);
    free(tok->prefix), free(tok->suffix), free(tok->prefix_raw), free(tok->suffix_raw);
    dfm_norm_free(tok);
    dfm_pre_free(tok);
    dfm_dec_free(tok);
    dfm_tok_cache_free(tok);
    dfm_unmap_file(tok->map, tok->map_bytes);
    free(tok);
}

/* ================================================================ encode */

/* Code point ending just before position i of valid UTF-8 s. */
static uint32_t cp_before(const uint8_t *s, size_t i, size_t *start) {
    size_t j = i - 1;
    while (j > 0 && (s[j] & 0xC0) == 0x80) j--;
    uint32_t cp;
    dfm_utf8_next(s + j, i - j, &cp);
    if (start) *start = j;
    return cp;
}

/* The next added token of matcher m in s[*pos..n), as HF's AddedVocabulary::find_matches: the
 * leftmost, then longest match; a single_word token next to a word character (regex \\w) is not a match (and,
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
            if ((st > 0 && dfm_uc_is_word(cp_before(u, st, NULL))) ||
                (en < n && (dfm_utf8_next(u + en, n - en, &cp), dfm_uc_is_word(cp)))) {
                i = en;
                continue;
            }
        }
        if (hit->lstrip)
            while (st > last) {
                size_t prev;
                if (!dfm_uc_is_ws(cp_before(u, st, &prev))) break;
                st = prev;
            }
        if (hit->rstrip)
            while (en < n) {
                uint32_t cp;
                int l = dfm_utf8_next(u + en, n - en, &cp);
                if (!dfm_uc_is_ws(cp)) break;
                en += (size_t)l;
            }
        *ms = st, *me = en, *pos = en;
        return hit;
    }
    *pos = n;
    return NULL;
}

/* Raw gap between non-normalized added tokens: normalize, split on normalized added tokens, pre-tokenize.
 * lead0: the length of the input's first character when the gap starts there, else 0. */
static int encode_gap(dfm_enc_ctx *c, const char *s, size_t n, size_t lead0) {
    const dfm_tokenizer *tok = c->tok;
    const char *p = s;
    size_t pn = n, lo = lead0;
    if (tok->n_norm) { /* c->norm is not touched again until the next gap */
        DFM_TRY(dfm_normalize(c, s, n, lead0, &c->norm, &lo));
        p = c->norm.p, pn = c->norm.n;
    }
    if (!tok->norm_matcher.n) return dfm_pre_tokenize(c, 0, (const uint8_t *)p, pn, lo);
    size_t last = 0, pos = 0, ms, me;
    const dfm_added_token *hit;
    while ((hit = next_added(tok, &tok->norm_matcher, p, pn, &pos, last, &ms, &me))) {
        if (ms > last) DFM_TRY(dfm_pre_tokenize(c, 0, (const uint8_t *)p + last, ms - last, lo > last ? lo - last : 0));
        DFM_TRY(dfm_ids_push(c->out, hit->id));
        last = me;
    }
    return last < pn ? dfm_pre_tokenize(c, 0, (const uint8_t *)p + last, pn - last, lo > last ? lo - last : 0) : DFM_OK;
}

int dfm_tokenizer_encode(const dfm_tokenizer *tok, const char *text, size_t len, dfm_ids *out, size_t *n_replaced) {
    if (n_replaced) *n_replaced = 0;
    char *fixed = NULL;
    if (dfm_utf8_valid_prefix((const uint8_t *)text, len) != len) {
        size_t fl;
        DFM_TRY(dfm_utf8_replace((const uint8_t *)text, len, &fixed, &fl, n_replaced));
        text = fixed, len = fl;
    }
    dfm_enc_ctx c = {.tok = tok, .out = out};
    size_t first = 0; /* bytes of the input's first character, when the first gap starts there */
    if (len && tok->track_first) {
        uint32_t cp;
        first = (size_t)dfm_utf8_next((const uint8_t *)text, len, &cp);
    }
    size_t last = 0, pos = 0, ms, me;
    int rc = DFM_OK;
    const dfm_added_token *hit;
    while (!rc && (hit = next_added(tok, &tok->raw_matcher, text, len, &pos, last, &ms, &me))) {
        if (ms > last) rc = encode_gap(&c, text + last, ms - last, last == 0 ? first : 0);
        if (!rc) rc = dfm_ids_push(out, hit->id);
        last = me;
    }
    if (!rc && last < len) rc = encode_gap(&c, text + last, len - last, last == 0 ? first : 0);
    dfm_enc_ctx_free(&c);
    free(fixed);
    return rc;
}

/* ================================================================ decode */

int dfm_tokenizer_decode(const dfm_tokenizer *tok, const uint32_t *ids, size_t n, int skip_special, char **text,
                         size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    sbuf b = {0};
    int rc = dfm_decode_ids(tok, ids, n, skip_special, &b);
    if (rc) {
        free(b.p);
        return rc;
    }
    *text = b.p;
    if (len) *len = b.n;
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
    if (dfm_token_raw(tok, token, n, &b, &len)) {
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
