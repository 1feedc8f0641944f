/* tok_cache.c — the piece cache: piece bytes -> ids, shared by every thread that encodes with one tokenizer
 * (the seqlock design is described in tok_internal.h). Pieces up to DFM_TOK_CACHE_MAX_KEY bytes with at most
 * DFM_TOK_CACHE_MAX_IDS ids are cached; the model is deterministic, so a hit gives what a miss computes. */
#include "tokenizer/tok_internal.h"

#include "common/error.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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
static int shard_get(dfm_tok_cache_shard *sh, uint64_t h, const uint8_t *s, size_t n, dfm_ids *out, int *err) {
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

static void shard_put(dfm_tok_cache_shard *sh, uint64_t h, const uint8_t *s, size_t n, const uint32_t *ids,
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


/* The cache is the one mutable part of a const tokenizer. */
static dfm_tok_cache_shard *shard_of(const dfm_tokenizer *tok, uint64_t h) {
    return (dfm_tok_cache_shard *)&tok->cache[(h >> 26) % DFM_TOK_CACHE_SHARDS];
}

/* The model behind the cache: a hit appends the cached ids, a miss runs the model and stores its ids. */
int dfm_model_piece(dfm_enc_ctx *c, const uint8_t *s, size_t n) {
    const dfm_tokenizer *tok = c->tok;
    dfm_ids *out = c->out;
    if (!n) return DFM_OK;
    if (tok->split_meta && n > DFM_TOK_CACHE_MAX_KEY) { /* word by word (dfm_bpe_prepare) */
        size_t start = 0;
        for (size_t i = 1; i + 3 <= n; i++) /* before a "\u2581" that does not follow another */
            if (s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81 && !(i >= 3 && s[i - 3] == 0xE2 &&
                                                                           s[i - 2] == 0x96 && s[i - 1] == 0x81)) {
                DFM_TRY(dfm_model_piece(c, s + start, i - start));
                start = i;
            }
        if (start) return dfm_model_piece(c, s + start, n - start);
    }
    int cache = n <= DFM_TOK_CACHE_MAX_KEY;
    uint64_t h = 0;
    if (cache) {
        h = dfm_tok_hash(s, n);
        int err = 0;
        if (shard_get(shard_of(tok, h), h, s, n, out, &err))
            return err ? DFM_FAIL(DFM_ENOMEM, "no memory for token ids") : DFM_OK;
    }
    size_t before = out->n;
    int rc;
    switch (tok->model) {
    case DFM_MODEL_BPE: rc = dfm_bpe_piece(c, s, n, out); break;
    case DFM_MODEL_UNIGRAM: rc = dfm_unigram_piece(c, s, n, out); break;
    case DFM_MODEL_WORDPIECE: rc = dfm_wordpiece_piece(c, s, n, out); break;
    default: rc = dfm_wordlevel_piece(c, s, n, out);
    }
    if (!rc && cache && out->n - before <= DFM_TOK_CACHE_MAX_IDS)
        shard_put(shard_of(tok, h), h, s, n, out->n > before ? out->ids + before : NULL, out->n - before);
    return rc;
}

