/* tok_bpe.c — the BPE model: vocabulary and merge-rank hash maps, the merge loop, the piece cache.
 *
 * Merge loop (as Hugging Face's BPE::merge_word): symbols in a doubly linked list, candidate pairs in
 * a binary min-heap keyed (rank, left position); a popped candidate is used only if its left symbol
 * is alive and the pair there still merges to the same id (stale entries are skipped, not removed).
 * O(n log n) in the piece length.
 */
#include "tokenizer/tok_internal.h"

#include "common/error.h"

#include <stdatomic.h>
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

/* ---------------------------------------------------------------- merge map */

static inline size_t pair_slot(uint64_t key, size_t mask) {
    key ^= key >> 31;
    key *= 0x9E3779B97F4A7C15ULL;
    return (size_t)(key >> 17) & mask;
}

int dfm_mergemap_init(dfm_mergemap *m, size_t n) {
    size_t cap = pow2_at_least(n * 2 + 1);
    m->keys = malloc(cap * sizeof *m->keys);
    m->vals = malloc(cap * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        free(m->keys), free(m->vals);
        m->keys = m->vals = NULL;
        return DFM_FAIL(DFM_ENOMEM, "no memory for a %zu-slot merge map", cap);
    }
    memset(m->keys, 0xff, cap * sizeof *m->keys);
    m->mask = cap - 1;
    m->n = 0;
    return DFM_OK;
}

void dfm_mergemap_put(dfm_mergemap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id) {
    uint64_t key = (uint64_t)a << 32 | b;
    for (size_t k = pair_slot(key, m->mask);; k = (k + 1) & m->mask) {
        if (m->keys[k] == UINT64_MAX) {
            m->keys[k] = key;
            m->vals[k] = (uint64_t)rank << 32 | id;
            m->n++;
            return;
        }
        if (m->keys[k] == key) { /* a repeated pair: the later line wins, as in HF */
            m->vals[k] = (uint64_t)rank << 32 | id;
            return;
        }
    }
}

/* rank << 32 | merged id, or UINT64_MAX when the pair does not merge. */
static inline uint64_t merge_get(const dfm_mergemap *m, uint32_t a, uint32_t b) {
    uint64_t key = (uint64_t)a << 32 | b;
    for (size_t k = pair_slot(key, m->mask);; k = (k + 1) & m->mask) {
        uint64_t s = m->keys[k];
        if (s == key) return m->vals[k];
        if (s == UINT64_MAX) return UINT64_MAX;
    }
}

void dfm_mergemap_free(dfm_mergemap *m) {
    free(m->keys);
    free(m->vals);
    m->keys = m->vals = NULL;
}

/* ---------------------------------------------------------------- cache */

#define CACHE_SLOTS 4096         /* per shard, power of two */
#define CACHE_ENTRIES 2048       /* load factor <= 1/2 */
#define CACHE_WORDS (32u << 10)  /* arena words per shard (128 KiB) */

int dfm_tok_cache_init(dfm_tokenizer *tok) {
    for (int i = 0; i < DFM_TOK_CACHE_SHARDS; i++) {
        dfm_tok_cache_shard *sh = &tok->cache[i];
        pthread_mutex_init(&sh->mu, NULL);
        atomic_init(&sh->seq, 0);
        sh->used = sh->n = 0;
        /* calloc: the pages stay unmapped until a shard is used */
        sh->slots = calloc(CACHE_SLOTS, sizeof *sh->slots);
        sh->arena = calloc(CACHE_WORDS, sizeof *sh->arena);
        if (!sh->slots || !sh->arena)
            return DFM_FAIL(DFM_ENOMEM, "no memory for the tokenizer's piece cache");
    }
    return DFM_OK;
}

void dfm_tok_cache_free(dfm_tokenizer *tok) {
    for (int i = 0; i < DFM_TOK_CACHE_SHARDS; i++) {
        free((void *)tok->cache[i].slots);
        free((void *)tok->cache[i].arena);
        tok->cache[i].slots = NULL, tok->cache[i].arena = NULL;
        pthread_mutex_destroy(&tok->cache[i].mu);
    }
}

#define RLX memory_order_relaxed

/* The key as zero-padded 32-bit words (what the arena holds). */
static size_t key_words(const uint8_t *s, size_t n, uint32_t *w) {
    size_t kw = (n + 3) / 4;
    w[kw ? kw - 1 : 0] = 0;
    memcpy(w, s, n);
    return kw;
}

/* Seqlock read: 1 and ids appended on a hit; 0 on a miss or when a writer got in the way. */
static int cache_get(dfm_tok_cache_shard *sh, uint64_t h, const uint8_t *s, size_t n, dfm_ids *out, int *err) {
    uint32_t kw_buf[DFM_TOK_CACHE_MAX_KEY / 4], ids[DFM_TOK_CACHE_MAX_IDS];
    size_t kw = key_words(s, n, kw_buf), nids = 0;
    unsigned s1 = atomic_load_explicit(&sh->seq, memory_order_acquire);
    if (s1 & 1) return 0;
    uint64_t frag = h >> 32 << 32;
    int hit = 0;
    size_t k = h & (CACHE_SLOTS - 1);
    for (size_t probe = 0; probe < CACHE_SLOTS; probe++, k = (k + 1) & (CACHE_SLOTS - 1)) {
        uint64_t v = atomic_load_explicit(&sh->slots[k], RLX);
        if (!v) break;
        if ((v >> 32 << 32) != frag) continue;
        size_t off = (uint32_t)v - 1;
        if (off >= CACHE_WORDS) break; /* torn by a writer: the sequence check rejects it anyway */
        uint32_t w0 = atomic_load_explicit(&sh->arena[off], RLX);
        nids = w0 >> 16;
        if ((w0 & 0xffff) != n || nids > DFM_TOK_CACHE_MAX_IDS || off + 1 + kw + nids > CACHE_WORDS) continue;
        size_t i = 0;
        while (i < kw && atomic_load_explicit(&sh->arena[off + 1 + i], RLX) == kw_buf[i]) i++;
        if (i < kw) continue;
        for (size_t j = 0; j < nids; j++) ids[j] = atomic_load_explicit(&sh->arena[off + 1 + kw + j], RLX);
        hit = 1;
        break;
    }
    atomic_thread_fence(memory_order_acquire);
    if (!hit || atomic_load_explicit(&sh->seq, RLX) != s1) return 0;
    for (size_t j = 0; j < nids; j++)
        if (dfm_ids_push(out, ids[j])) { *err = DFM_ENOMEM; break; }
    return 1;
}

static void cache_put(dfm_tok_cache_shard *sh, uint64_t h, const uint8_t *s, size_t n, const uint32_t *ids,
                      size_t nids) {
    uint32_t kw_buf[DFM_TOK_CACHE_MAX_KEY / 4];
    size_t kw = key_words(s, n, kw_buf), need = 1 + kw + nids;
    uint64_t frag = h >> 32 << 32;
    pthread_mutex_lock(&sh->mu);
    unsigned seq = atomic_load_explicit(&sh->seq, RLX);
    /* another thread may have inserted it meanwhile (we hold the only write access: plain reads) */
    size_t k = h & (CACHE_SLOTS - 1);
    for (;; k = (k + 1) & (CACHE_SLOTS - 1)) {
        uint64_t v = atomic_load_explicit(&sh->slots[k], RLX);
        if (!v) break;
        if ((v >> 32 << 32) != frag) continue;
        size_t off = (uint32_t)v - 1, i = 0;
        if ((atomic_load_explicit(&sh->arena[off], RLX) & 0xffff) != n) continue;
        while (i < kw && atomic_load_explicit(&sh->arena[off + 1 + i], RLX) == kw_buf[i]) i++;
        if (i == kw) goto out;
    }
    atomic_store_explicit(&sh->seq, seq + 1, RLX);
    atomic_thread_fence(memory_order_release);
    if (sh->n >= CACHE_ENTRIES || sh->used + need > CACHE_WORDS) { /* full: start over */
        for (size_t i = 0; i < CACHE_SLOTS; i++) atomic_store_explicit(&sh->slots[i], 0, RLX);
        sh->n = 0, sh->used = 0;
        k = h & (CACHE_SLOTS - 1);
    }
    size_t off = sh->used;
    atomic_store_explicit(&sh->arena[off], (uint32_t)n | (uint32_t)nids << 16, RLX);
    for (size_t i = 0; i < kw; i++) atomic_store_explicit(&sh->arena[off + 1 + i], kw_buf[i], RLX);
    for (size_t j = 0; j < nids; j++) atomic_store_explicit(&sh->arena[off + 1 + kw + j], ids[j], RLX);
    atomic_store_explicit(&sh->slots[k], frag | (off + 1), RLX);
    sh->used += need;
    sh->n++;
    atomic_store_explicit(&sh->seq, seq + 2, memory_order_release);
out:
    pthread_mutex_unlock(&sh->mu);
}

/* ---------------------------------------------------------------- merge loop */

struct dfm_bpe_sym {
    uint32_t id;
    int32_t prev, next;
    uint32_t len; /* bytes covered; 0 = merged away */
};

void dfm_bpe_work_free(dfm_bpe_work *w) {
    free(w->sym);
    free(w->heap);
    memset(w, 0, sizeof *w);
}

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

/* Initial symbols: one per byte (byte-level) or per character (with <0xNN> byte fallback). */
static int initial_symbols(const dfm_tokenizer *tok, dfm_bpe_work *w, const uint8_t *s, size_t n, size_t *nsym) {
    DFM_TRY(grow((void **)&w->sym, &w->sym_cap, n, sizeof *w->sym));
    size_t k = 0;
    if (tok->byte_level) {
        for (size_t i = 0; i < n; i++) {
            int32_t id = tok->byte_id[s[i]];
            if (id < 0)
                return DFM_FAIL(DFM_EFORMAT, "byte 0x%02x has no token in the byte-level vocabulary. HINT: the "
                                "tokenizer.json is incomplete", s[i]);
            w->sym[k++] = (struct dfm_bpe_sym){(uint32_t)id, 0, 0, 1};
        }
    } else {
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            int l = dfm_utf8_next(s + i, n - i, &cp);
            int64_t id = dfm_strmap_get(&tok->vocab, s + i, (size_t)l);
            if (id >= 0) {
                w->sym[k++] = (struct dfm_bpe_sym){(uint32_t)id, 0, 0, (uint32_t)l};
            } else if (tok->byte_fallback && tok->byte_id[s[i]] >= 0) {
                for (int j = 0; j < l; j++) {
                    int32_t b = tok->byte_id[s[i + j]];
                    if (b < 0) return DFM_FAIL(DFM_EFORMAT, "byte fallback token <0x%02X> missing", s[i + j]);
                    w->sym[k++] = (struct dfm_bpe_sym){(uint32_t)b, 0, 0, 1};
                }
            } else if (tok->unk_id >= 0) {
                /* one unk per unknown character, or one per run of them with fuse_unk */
                if (tok->fuse_unk && k && w->sym[k - 1].id == (uint32_t)tok->unk_id) w->sym[k - 1].len += (uint32_t)l;
                else w->sym[k++] = (struct dfm_bpe_sym){(uint32_t)tok->unk_id, 0, 0, (uint32_t)l};
            } /* else: HF drops the character */
            i += (size_t)l;
        }
    }
    for (size_t i = 0; i < k; i++) {
        w->sym[i].prev = (int32_t)i - 1;
        w->sym[i].next = i + 1 < k ? (int32_t)i + 1 : -1;
    }
    *nsym = k;
    return DFM_OK;
}

static int merge_word(const dfm_tokenizer *tok, dfm_bpe_work *w, const uint8_t *s, size_t n, dfm_ids *out) {
    size_t k = 0;
    DFM_TRY(initial_symbols(tok, w, s, n, &k));
    struct dfm_bpe_sym *sym = w->sym;
    DFM_TRY(grow((void **)&w->heap, &w->heap_cap, k + 1, sizeof *w->heap));
    uint64_t *heap = w->heap;
    size_t hn = 0;
    const dfm_mergemap *mm = &tok->merges;
    for (size_t i = 0; i + 1 < k; i++) {
        uint64_t m = merge_get(mm, sym[i].id, sym[i + 1].id);
        if (m != UINT64_MAX) heap_push(heap, &hn, (m >> 32) << 32 | i);
    }
    /* each merge removes a symbol and pushes at most 2 entries: the heap never exceeds 2k */
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
        if (hn + 2 > w->heap_cap) {
            DFM_TRY(grow((void **)&w->heap, &w->heap_cap, hn + 2, sizeof *w->heap));
            heap = w->heap;
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
    for (int32_t i = k ? 0 : -1; i >= 0; i = sym[i].next)
        if (dfm_ids_push(out, sym[i].id)) return DFM_FAIL(DFM_ENOMEM, "no memory for token ids");
    return DFM_OK;
}

int dfm_bpe_word(const dfm_tokenizer *tok, dfm_bpe_work *w, const uint8_t *s, size_t n, dfm_ids *out) {
    if (!n) return DFM_OK;
    if (tok->ignore_merges) {
        int64_t id = dfm_strmap_get(&tok->vocab, s, n);
        if (id >= 0) return dfm_ids_push(out, (uint32_t)id) ? DFM_FAIL(DFM_ENOMEM, "no memory for token ids") : DFM_OK;
    }
    if (n > DFM_TOK_CACHE_MAX_KEY) return merge_word(tok, w, s, n, out);
    uint64_t h = dfm_tok_hash(s, n);
    /* the cache is the one mutable part of a const tokenizer (see the seqlock note in tok_internal.h) */
    dfm_tok_cache_shard *sh = (dfm_tok_cache_shard *)&tok->cache[(h >> 26) % DFM_TOK_CACHE_SHARDS];
    int err = 0;
    if (cache_get(sh, h, s, n, out, &err)) return err ? DFM_FAIL(DFM_ENOMEM, "no memory for token ids") : DFM_OK;
    size_t before = out->n;
    DFM_TRY(merge_word(tok, w, s, n, out));
    if (out->n - before <= DFM_TOK_CACHE_MAX_IDS) cache_put(sh, h, s, n, out->ids + before, out->n - before);
    return DFM_OK;
}
