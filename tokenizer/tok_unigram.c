/* tok_unigram.c — the Unigram model (SentencePiece's; `tokenizers`' models/unigram, encode_optimized).
 *
 * Each piece of the vocabulary has a score (a log probability). A pre-token is split into the pieces whose
 * scores sum highest (Viterbi, left to right over characters): at each character start, every vocabulary
 * piece that begins there (a walk down the byte trie) offers a path to its end; a character no single-
 * character piece covers is offered as the unknown token with score min_score - 10. Ties keep the path
 * found first. The best path is read back from the end; consecutive unknown tokens are fused into one
 * string, which is then looked up as a whole, else split into its bytes' <0xNN> tokens (byte_fallback,
 * when all exist), else the unknown id.
 *
 * The trie lives in the pair map: (node << 8 | byte) -> ((piece id + 1) << 32 | child node). A piece string
 * that occurs twice in the vocabulary maps to its last id, as `tokenizers`' token_to_ids does.
 */
#include "tokenizer/tok_internal.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>

int dfm_unigram_build(const dfm_load_ctx *lc, dfm_tokenizer *tok) {
    size_t bytes = 0;
    for (uint32_t id = 0; id < tok->n_ids; id++)
        if (tok->key[id] && dfm_strmap_get(&tok->vocab, tok->key[id], tok->key_len[id]) >= 0) bytes += tok->key_len[id];
    if (bytes >= UINT32_MAX / 2) return DFM_LFAIL(lc, DFM_EUNSUPPORTED, "model.vocab: %zu bytes of pieces", bytes);
    DFM_TRY(dfm_pairmap_init(&tok->pairs, bytes));
    uint32_t next = 1;
    for (uint32_t id = 0; id < tok->n_ids; id++) {
        const uint8_t *k = (const uint8_t *)tok->key[id];
        uint32_t n = tok->key_len[id];
        int64_t leaf = k && n ? dfm_strmap_get(&tok->vocab, k, n) : -1;
        if (leaf < 0) continue; /* not a vocabulary piece (an added token), or "" (never matched) */
        uint64_t node = 0, edge = 0, val = 0;
        for (uint32_t i = 0; i < n; i++) {
            edge = node << 8 | k[i];
            val = dfm_pairmap_get(&tok->pairs, edge);
            if (val == UINT64_MAX) {
                val = next++;
                dfm_pairmap_put(&tok->pairs, edge, val);
            }
            node = (uint32_t)val;
        }
        dfm_pairmap_put(&tok->pairs, edge, (uint64_t)(leaf + 1) << 32 | (uint32_t)val);
    }
    tok->n_trie_nodes = next;
    dfm_unigram_prepare(tok);
    return DFM_OK;
}

void dfm_unigram_prepare(dfm_tokenizer *tok) {
    for (int b = 0; b < 256; b++) tok->trie_root[b] = dfm_pairmap_get(&tok->pairs, (uint64_t)b);
}

static int grow(dfm_enc_ctx *c, size_t n) {
    if (c->v_cap >= n) return DFM_OK;
    size_t cap = c->v_cap ? c->v_cap : 256;
    while (cap < n) cap *= 2;
    double *s = realloc(c->vscore, cap * sizeof *s);
    if (s) c->vscore = s;
    int64_t *st = realloc(c->vstart, cap * sizeof *st);
    if (st) c->vstart = st;
    int64_t *id = realloc(c->vid, cap * sizeof *id);
    if (id) c->vid = id;
    uint32_t *t = realloc(c->tmp_ids, cap * sizeof *t);
    if (t) c->tmp_ids = t;
    if (!s || !st || !id || !t) return DFM_FAIL(DFM_ENOMEM, "no memory for a %zu-byte Viterbi lattice", n);
    c->v_cap = cap;
    return DFM_OK;
}

/* The ids of a fused run of unknown characters. */
static int unknown(const dfm_tokenizer *tok, const uint8_t *s, size_t n, dfm_ids *out) {
    int64_t id = dfm_strmap_get(&tok->vocab, s, n);
    if (id >= 0) return dfm_ids_push(out, (uint32_t)id);
    if (tok->byte_fallback) {
        size_t i = 0;
        while (i < n && tok->fb_id[s[i]] >= 0) i++;
        if (i == n) {
            for (i = 0; i < n; i++) DFM_TRY(dfm_ids_push(out, (uint32_t)tok->fb_id[s[i]]));
            return DFM_OK;
        }
    }
    return dfm_ids_push(out, (uint32_t)tok->unk_id);
}

int dfm_unigram_piece(dfm_enc_ctx *c, const uint8_t *s, size_t n, dfm_ids *out) {
    const dfm_tokenizer *tok = c->tok;
    DFM_TRY(grow(c, n + 1));
    double *score = c->vscore;
    int64_t *start = c->vstart, *vid = c->vid;
    for (size_t i = 0; i <= n; i++) score[i] = 0, start[i] = -1, vid[i] = 0;
    const double unk_score = tok->min_score - 10.0;
    const dfm_pairmap *trie = &tok->pairs;
    for (size_t pos = 0; pos < n;) {
        size_t mb = 1;
        if (s[pos] >= 0x80) {
            uint32_t cp;
            mb = (size_t)dfm_utf8_next(s + pos, n - pos, &cp);
        }
        double here = score[pos];
        int single = 0;
        uint64_t v = tok->trie_root[s[pos]]; /* the first byte from the root table, the rest from the map */
        for (size_t j = pos; v != UINT64_MAX;) {
            if (v >> 32) {
                uint32_t id = (uint32_t)(v >> 32) - 1;
                double cand = tok->scores[id] + here;
                if (start[j + 1] < 0 || cand > score[j + 1]) score[j + 1] = cand, start[j + 1] = (int64_t)pos, vid[j + 1] = id;
                if (j + 1 - pos == mb) single = 1;
            }
            if (++j >= n) break;
            v = dfm_pairmap_get(trie, (uint64_t)(uint32_t)v << 8 | s[j]);
        }
        if (!single) {
            if (tok->unk_id < 0)
                return DFM_FAIL(DFM_EFORMAT, "the Unigram model has no unk_id, and the text holds \"%.*s\", which no piece "
                                "covers. HINT: `tokenizers` fails on this text too", (int)mb, (const char *)s + pos);
            double cand = unk_score + here;
            if (start[pos + mb] < 0 || cand > score[pos + mb])
                score[pos + mb] = cand, start[pos + mb] = (int64_t)pos, vid[pos + mb] = tok->unk_id;
        }
        pos += mb;
    }
    /* the best path, read back: ends, last first */
    size_t cnt = 0;
    for (size_t e = n; e > 0; e = (size_t)start[e]) c->tmp_ids[cnt++] = (uint32_t)e;
    while (cnt) {
        size_t e = c->tmp_ids[--cnt], b = (size_t)start[e];
        if (vid[e] != tok->unk_id) {
            DFM_TRY(dfm_ids_push(out, (uint32_t)vid[e]));
            continue;
        }
        while (cnt && vid[c->tmp_ids[cnt - 1]] == tok->unk_id) e = c->tmp_ids[--cnt];
        DFM_TRY(unknown(tok, s + b, e - b, out));
    }
    return DFM_OK;
}
