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
 * The trie is built in a hash map ((node << 8 | byte) -> child) and laid out breadth first: a node's edges
 * are contiguous, sorted by byte, and edge e leads to node e + 1, so a walk reads a few nearby bytes per
 * step instead of a random hash slot (the walk is most of the time). A piece string that occurs twice in
 * the vocabulary maps to its last id, as `tokenizers`' token_to_ids does.
 */
#include "tokenizer/tok_internal.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>

/* The breadth-first layout of the hash trie in m (next nodes, the root 0). */
static int layout(dfm_tokenizer *tok, const dfm_pairmap *m, uint32_t nodes) {
    uint32_t *cnt = calloc((size_t)nodes + 1, sizeof *cnt), *at = NULL, *queue = NULL;
    uint64_t *edges = NULL; /* per parent, in counting-sort order: byte << 32 | old child */
    int32_t *leaf_of = malloc((size_t)nodes * sizeof *leaf_of);
    tok->trie_first = malloc(((size_t)nodes + 1) * sizeof *tok->trie_first);
    tok->trie_label = malloc(nodes ? nodes : 1);
    tok->trie_piece = malloc((size_t)nodes * sizeof *tok->trie_piece);
    if (cnt) at = malloc(((size_t)nodes + 1) * sizeof *at);
    if (at) edges = malloc((m->n ? m->n : 1) * sizeof *edges);
    if (edges) queue = malloc((size_t)nodes * sizeof *queue);
    int rc = queue && leaf_of && tok->trie_first && tok->trie_label && tok->trie_piece ? DFM_OK
             : DFM_FAIL(DFM_ENOMEM, "no memory for a %u-node trie", nodes);
    for (size_t k = 0; !rc && k <= m->mask; k++)
        if (m->kv[2 * k] != UINT64_MAX) cnt[(uint32_t)(m->kv[2 * k] >> 8)]++;
    for (uint32_t v = 0, sum = 0; !rc && v <= nodes; v++) at[v] = sum, sum += v < nodes ? cnt[v] : 0;
    for (uint32_t v = 0; !rc && v < nodes; v++) leaf_of[v] = -1;
    for (size_t k = 0; !rc && k <= m->mask; k++) {
        uint64_t key = m->kv[2 * k], val = m->kv[2 * k + 1];
        if (key == UINT64_MAX) continue;
        uint32_t parent = (uint32_t)(key >> 8), child = (uint32_t)val;
        edges[at[parent]++] = (key & 0xff) << 32 | child;
        leaf_of[child] = (int32_t)(val >> 32) - 1;
    }
    if (!rc) { /* breadth first from the root: edge e (in order) makes node e + 1 */
        size_t head = 0, tail = 0, e = 0;
        queue[tail++] = 0;
        tok->trie_piece[0] = -1;
        while (head < tail) {
            uint32_t old = queue[head], v = (uint32_t)head++;
            uint64_t *es = edges + (at[old] - cnt[old]);
            for (uint32_t i = 1; i < cnt[old]; i++) /* sort the node's edges by byte (few: insertion) */
                for (uint32_t j = i; j > 0 && es[j - 1] > es[j]; j--) {
                    uint64_t t = es[j];
                    es[j] = es[j - 1], es[j - 1] = t;
                }
            tok->trie_first[v] = (uint32_t)e;
            for (uint32_t i = 0; i < cnt[old]; i++, e++) {
                uint32_t child = (uint32_t)es[i];
                tok->trie_label[e] = (uint8_t)(es[i] >> 32);
                tok->trie_piece[e + 1] = leaf_of[child];
                queue[tail++] = child;
            }
        }
        tok->trie_first[nodes] = (uint32_t)e;
    }
    free(cnt), free(at), free(edges), free(queue), free(leaf_of);
    return rc;
}

int dfm_unigram_build(const dfm_load_ctx *lc, dfm_tokenizer *tok) {
    size_t bytes = 0;
    for (uint32_t id = 0; id < tok->n_ids; id++)
        if (tok->key[id] && dfm_strmap_get(&tok->vocab, tok->key[id], tok->key_len[id]) >= 0) bytes += tok->key_len[id];
    if (bytes >= UINT32_MAX / 2) return DFM_LFAIL(lc, DFM_EUNSUPPORTED, "model.vocab: %zu bytes of pieces", bytes);
    dfm_pairmap trie = {0};
    DFM_TRY(dfm_pairmap_init(&trie, bytes));
    uint32_t next = 1;
    for (uint32_t id = 0; id < tok->n_ids; id++) {
        const uint8_t *k = (const uint8_t *)tok->key[id];
        uint32_t n = tok->key_len[id];
        int64_t leaf = k && n ? dfm_strmap_get(&tok->vocab, k, n) : -1;
        if (leaf < 0) continue; /* not a vocabulary piece (an added token), or "" (never matched) */
        uint64_t node = 0, edge = 0, val = 0;
        for (uint32_t i = 0; i < n; i++) {
            edge = node << 8 | k[i];
            val = dfm_pairmap_get(&trie, edge);
            if (val == UINT64_MAX) {
                val = next++;
                dfm_pairmap_put(&trie, edge, val);
            }
            node = (uint32_t)val;
        }
        dfm_pairmap_put(&trie, edge, (uint64_t)(leaf + 1) << 32 | (uint32_t)val);
    }
    tok->n_trie_nodes = next;
    int rc = layout(tok, &trie, next);
    dfm_pairmap_free(&trie);
    if (!rc) rc = dfm_pairmap_init(&tok->pairs, 0); /* no merges: the cache file holds an empty map */
    if (!rc) dfm_unigram_prepare(tok);
    return rc;
}

/* The child of node v on byte b, or 0 (the root is no node's child). */
static inline uint32_t trie_child(const dfm_tokenizer *tok, uint32_t v, uint8_t b) {
    uint32_t lo = tok->trie_first[v], hi = tok->trie_first[v + 1];
    const uint8_t *l = tok->trie_label;
    if (hi - lo > 8) { /* binary search */
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (l[mid] < b) lo = mid + 1;
            else hi = mid;
        }
        return lo < tok->trie_first[v + 1] && l[lo] == b ? lo + 1 : 0;
    }
    for (; lo < hi && l[lo] <= b; lo++)
        if (l[lo] == b) return lo + 1;
    return 0;
}

void dfm_unigram_prepare(dfm_tokenizer *tok) {
    for (int b = 0; b < 256; b++) tok->trie_root[b] = tok->n_trie_nodes ? trie_child(tok, 0, (uint8_t)b) : 0;
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
    for (size_t pos = 0; pos < n;) {
        size_t mb = 1;
        if (s[pos] >= 0x80) {
            uint32_t cp;
            mb = (size_t)dfm_utf8_next(s + pos, n - pos, &cp);
        }
        double here = score[pos];
        int single = 0;
        uint32_t v = tok->trie_root[s[pos]]; /* the first byte from the root table */
        for (size_t j = pos; v;) {
            int32_t id = tok->trie_piece[v];
            if (id >= 0) {
                double cand = tok->scores[id] + here;
                if (start[j + 1] < 0 || cand > score[j + 1]) score[j + 1] = cand, start[j + 1] = (int64_t)pos, vid[j + 1] = id;
                if (j + 1 - pos == mb) single = 1;
            }
            if (++j >= n) break;
            v = trie_child(tok, v, s[j]);
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
