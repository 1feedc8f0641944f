/* tok_bpe.c — the hash maps of the tokenizer (vocabulary, pairs) and the BPE model.
 *
 * BPE, as `tokenizers`' models/bpe (BPE::merge_word, Word::merge_all):
 *   - ignore_merges: a piece found whole in the vocabulary is that one id;
 *   - one symbol per character (per byte with a ByteLevel pre-tokenizer); every symbol but the first carries
 *     continuing_subword_prefix, the last one end_of_word_suffix; a symbol not in the vocabulary becomes
 *     its bytes' <0xNN> tokens when byte_fallback is on and all of them exist (prefix and suffix bytes
 *     included), else the unknown token (consecutive ones fused into one with fuse_unk; an unknown token
 *     waits for the next known symbol, so byte-fallback tokens may come before it, as in `tokenizers`),
 *     else nothing;
 *   - merges by rank: symbols in a doubly linked list, candidate pairs in a binary min-heap keyed (rank,
 *     left position); a popped candidate is used only if its left symbol is alive and the pair there still
 *     merges with the same rank (stale entries are skipped, not removed). O(n log n) in the piece length.
 */
#include "tokenizer/tok_internal.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

uint64_t dfm_tok_hash(const void *p, size_t n) { return XXH3_64bits(p, n); }

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---------------------------------------------------------------- string map */

int dfm_strmap_init(dfm_strmap *m, size_t n_keys_max, const char *const *keys, const uint32_t *lens) {
    size_t cap = pow2_at_least(n_keys_max * 2 + 1);
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return DFM_FAIL(DFM_ENOMEM, "no memory for a %zu-slot vocabulary map", cap);
    m->mask = cap - 1;
    m->keys = keys;
    m->lens = lens;
    return DFM_OK;
}

void dfm_strmap_put(dfm_strmap *m, uint32_t i) {
    uint64_t h = dfm_tok_hash(m->keys[i], m->lens[i]);
    uint64_t frag = h >> 32 << 32;
    for (size_t k = h & m->mask;; k = (k + 1) & m->mask) {
        uint64_t s = m->slots[k];
        if (!s) { m->slots[k] = frag | ((uint64_t)i + 1); return; }
        if ((s >> 32 << 32) == frag) {
            uint32_t j = (uint32_t)(s & 0xffffffffu) - 1;
            if (m->lens[j] == m->lens[i] && !memcmp(m->keys[j], m->keys[i], m->lens[i])) return;
        }
    }
}

int64_t dfm_strmap_get(const dfm_strmap *m, const void *key, size_t len) {
    if (!m->slots) return -1;
    uint64_t h = dfm_tok_hash(key, len);
    uint64_t frag = h >> 32 << 32;
    for (size_t k = h & m->mask;; k = (k + 1) & m->mask) {
        uint64_t s = m->slots[k];
        if (!s) return -1;
        if ((s >> 32 << 32) == frag) {
            uint32_t j = (uint32_t)(s & 0xffffffffu) - 1;
            if (m->lens[j] == len && !memcmp(m->keys[j], key, len)) return j;
        }
    }
}

void dfm_strmap_free(dfm_strmap *m) {
    free(m->slots);
    m->slots = NULL;
}

/* ---------------------------------------------------------------- pair map */

int dfm_pairmap_init(dfm_pairmap *m, size_t n) {
    size_t cap = pow2_at_least(n * 2 + 1);
    m->kv = malloc(cap * 2 * sizeof *m->kv);
    if (!m->kv) return DFM_FAIL(DFM_ENOMEM, "no memory for a %zu-slot pair map", cap);
    for (size_t k = 0; k < cap; k++) m->kv[2 * k] = UINT64_MAX, m->kv[2 * k + 1] = 0;
    m->mask = cap - 1;
    m->n = 0;
    return DFM_OK;
}

void dfm_pairmap_put(dfm_pairmap *m, uint64_t key, uint64_t val) {
    for (size_t k = dfm_pair_slot(key, m->mask);; k = (k + 1) & m->mask) {
        if (m->kv[2 * k] == UINT64_MAX) {
            m->kv[2 * k] = key;
            m->kv[2 * k + 1] = val;
            m->n++;
            return;
        }
        if (m->kv[2 * k] == key) {
            m->kv[2 * k + 1] = val;
            return;
        }
    }
}

void dfm_pairmap_free(dfm_pairmap *m) {
    free(m->kv);
    m->kv = NULL;
}

/* rank << 32 | merged id, or UINT64_MAX when the pair does not merge. */
static inline uint64_t merge_get(const dfm_pairmap *m, uint32_t a, uint32_t b) {
    return dfm_pairmap_get(m, (uint64_t)a << 32 | b);
}

/* ---------------------------------------------------------------- symbols */

struct dfm_bpe_sym {
    uint32_t id;
    int32_t prev, next;
    uint32_t len; /* bytes covered; 0 = merged away */
};

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (*cap >= need) return DFM_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return DFM_FAIL(DFM_ENOMEM, "no memory for BPE scratch (%zu entries)", c);
    *p = q;
    *cap = c;
    return DFM_OK;
}

static inline void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static inline uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = v;
    return top;
}

static inline void add_sym(dfm_enc_ctx *c, size_t *k, uint32_t id, uint32_t len) {
    c->sym[(*k)++] = (struct dfm_bpe_sym){id, 0, 0, len};
}

/* The general case (BPE::merge_word): prefix/suffix, byte fallback, unknown tokens. */
static int general_symbols(dfm_enc_ctx *c, const uint8_t *s, size_t n, size_t *nsym) {
    const dfm_tokenizer *tok = c->tok;
    sbuf *key = &c->word;
    size_t k = 0;
    int64_t unk = -1; /* the pending unknown symbol's length, or -1 */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tok->byte_level ? 1 : (size_t)dfm_utf8_next(s + i, n - i, &cp);
        int first = i == 0, last = i + l == n;
        key->n = 0;
        if (!first) DFM_TRY(dfm_sbuf_add(key, tok->prefix_raw, tok->prefix_raw_len));
        DFM_TRY(dfm_sbuf_add(key, s + i, l));
        if (last) DFM_TRY(dfm_sbuf_add(key, tok->suffix_raw, tok->suffix_raw_len));
        int64_t id = dfm_strmap_get(&tok->vocab, key->p, key->n);
        if (id >= 0) {
            if (unk >= 0) add_sym(c, &k, (uint32_t)tok->unk_id, (uint32_t)unk), unk = -1;
            add_sym(c, &k, (uint32_t)id, (uint32_t)l);
            i += l;
            continue;
        }
        if (tok->byte_fallback) { /* the bytes of the symbol's string in tokenizer.json's terms */
            sbuf *fb = &c->word2;
            fb->n = 0;
            if (!first) DFM_TRY(dfm_sbuf_add(fb, tok->prefix, tok->prefix_len));
            if (tok->byte_level) DFM_TRY(dfm_sbuf_cp(fb, dfm_bytelevel_cp(s[i])));
            else DFM_TRY(dfm_sbuf_add(fb, s + i, l));
            if (last) DFM_TRY(dfm_sbuf_add(fb, tok->suffix, tok->suffix_len));
            size_t j = 0;
            while (j < fb->n && tok->fb_id[(uint8_t)fb->p[j]] >= 0) j++;
            if (j == fb->n) {
                DFM_TRY(grow((void **)&c->sym, &c->sym_cap, k + fb->n + (n - i) + 2, sizeof *c->sym));
                for (j = 0; j < fb->n; j++) add_sym(c, &k, (uint32_t)tok->fb_id[(uint8_t)fb->p[j]], 1);
                i += l;
                continue;
            }
        }
        if (tok->unk_id >= 0) {
            if (unk >= 0 && tok->fuse_unk) unk += (int64_t)l;
            else {
                if (unk >= 0) add_sym(c, &k, (uint32_t)tok->unk_id, (uint32_t)unk);
                unk = (int64_t)l;
            }
        } else if (tok->unk_missing) {
            return DFM_FAIL(DFM_EFORMAT, "model.unk_token is not in the vocabulary, and the text holds a character "
                            "the vocabulary lacks (\"%.*s\"). HINT: the tokenizer.json is inconsistent; `tokenizers` "
                            "fails on this text too", (int)l, (const char *)s + i);
        } /* else: `tokenizers` drops the character */
        i += l;
    }
    if (unk >= 0) add_sym(c, &k, (uint32_t)tok->unk_id, (uint32_t)unk);
    *nsym = k;
    return DFM_OK;
}

/* Initial symbols: one per byte (byte-level, every byte in the vocabulary: the fast path) or per character. */
static int initial_symbols(dfm_enc_ctx *c, const uint8_t *s, size_t n, size_t *nsym) {
    const dfm_tokenizer *tok = c->tok;
    DFM_TRY(grow((void **)&c->sym, &c->sym_cap, 2 * n + 2, sizeof *c->sym));
    size_t k = 0;
    if (tok->byte_level && !tok->prefix_raw_len && !tok->suffix_raw_len) {
        for (; k < n && tok->byte_id[s[k]] >= 0; k++) c->sym[k] = (struct dfm_bpe_sym){(uint32_t)tok->byte_id[s[k]], 0, 0, 1};
    }
    if (k < n) DFM_TRY(general_symbols(c, s, n, &k));
    for (size_t i = 0; i < k; i++) {
        c->sym[i].prev = (int32_t)i - 1;
        c->sym[i].next = i + 1 < k ? (int32_t)i + 1 : -1;
    }
    *nsym = k;
    return DFM_OK;
}

int dfm_bpe_piece(dfm_enc_ctx *c, const uint8_t *s, size_t n, dfm_ids *out) {
    const dfm_tokenizer *tok = c->tok;
    if (tok->ignore_merges) {
        int64_t id = dfm_strmap_get(&tok->vocab, s, n);
        if (id >= 0) return dfm_ids_push(out, (uint32_t)id);
    }
    size_t k = 0;
    DFM_TRY(initial_symbols(c, s, n, &k));
    struct dfm_bpe_sym *sym = c->sym;
    DFM_TRY(grow((void **)&c->heap, &c->heap_cap, k + 1, sizeof *c->heap));
    uint64_t *heap = c->heap;
    size_t hn = 0;
    const dfm_pairmap *mm = &tok->pairs;
    for (size_t i = 0; i + 1 < k; i++) {
        uint64_t m = merge_get(mm, sym[i].id, sym[i + 1].id);
        if (m != UINT64_MAX) heap_push(heap, &hn, (m >> 32) << 32 | i);
    }
    /* each merge removes a symbol and pushes at most 2 entries */
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        uint32_t rank = (uint32_t)(top >> 32), pos = (uint32_t)top;
        struct dfm_bpe_sym *a = &sym[pos];
        if (!a->len || a->next < 0) continue;
        struct dfm_bpe_sym *b = &sym[a->next];
        uint64_t m = merge_get(mm, a->id, b->id);
        if (m == UINT64_MAX || (uint32_t)(m >> 32) != rank) continue; /* stale */
        a->id = (uint32_t)m;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) sym[b->next].prev = (int32_t)pos;
        if (hn + 2 > c->heap_cap) {
            DFM_TRY(grow((void **)&c->heap, &c->heap_cap, hn + 2, sizeof *c->heap));
            heap = c->heap;
        }
        if (a->prev >= 0) {
            uint64_t mp = merge_get(mm, sym[a->prev].id, a->id);
            if (mp != UINT64_MAX) heap_push(heap, &hn, (mp >> 32) << 32 | (uint32_t)a->prev);
        }
        if (a->next >= 0) {
            uint64_t mn = merge_get(mm, a->id, sym[a->next].id);
            if (mn != UINT64_MAX) heap_push(heap, &hn, (mn >> 32) << 32 | pos);
        }
    }
    for (int32_t i = k ? 0 : -1; i >= 0; i = sym[i].next) DFM_TRY(dfm_ids_push(out, sym[i].id));
    return DFM_OK;
}

/* SentencePiece-style BPE without a pre-tokenizer (Llama-2, Mistral) gets a whole text as one piece. When
 * "\u2581" is a token and no merge makes a token with a "\u2581" after some other character (runs of
 * "\u2581" at its start are fine: Llama-2 has "\u2581\u2581\u2581\u2581"), a "\u2581" that follows another
 * character starts a token of the result, and merges never cross it: encoding the text word by word (cut
 * before each such "\u2581") gives the same ids, and lets the piece cache work. Not with ignore_merges (the
 * whole piece is looked up first), a prefix or suffix (first and last symbols differ), or byte-level. */
void dfm_bpe_prepare(dfm_tokenizer *tok) {
    static const char meta[] = "\xe2\x96\x81";
    tok->split_meta = 0;
    if (tok->model != DFM_MODEL_BPE || tok->byte_level || tok->ignore_merges || tok->prefix_raw_len ||
        tok->suffix_raw_len || dfm_strmap_get(&tok->vocab, meta, 3) < 0)
        return;
    for (size_t k = 0; k <= tok->pairs.mask; k++) {
        if (tok->pairs.kv[2 * k] == UINT64_MAX) continue;
        uint32_t id = (uint32_t)tok->pairs.kv[2 * k + 1];
        if (id >= tok->n_ids || !tok->key[id]) return;
        const char *key = tok->key[id];
        size_t n = tok->key_len[id], p = 0;
        while (p + 3 <= n && !memcmp(key + p, meta, 3)) p += 3; /* the leading run */
        if (p < n && memmem(key + p, n - p, meta, 3)) return;
    }
    tok->split_meta = 1;
}
