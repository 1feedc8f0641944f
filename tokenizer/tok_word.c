/* tok_word.c — the word models of `tokenizers`: WordPiece (BERT) and WordLevel.
 *
 * WordPiece (models/wordpiece): a pre-token longer than max_input_chars_per_word characters is the unknown
 * token; otherwise, from the start, the longest prefix in the vocabulary (continuing_subword_prefix before
 * every piece but the first), shortening one character at a time; if some position has no piece, the whole
 * pre-token is the unknown token.
 * WordLevel (models/wordlevel): the pre-token's id, or the unknown token's.
 * A missing unknown token, when it is needed, is an error there and here.
 */
#include "tokenizer/tok_internal.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>

static int push_unk(const dfm_tokenizer *tok, const char *model, const uint8_t *s, size_t n, dfm_ids *out) {
    if (tok->unk_id < 0)
        return DFM_FAIL(DFM_EFORMAT, "the %s model's unk_token is not in its vocabulary, and \"%.*s\" needs it. HINT: "
                        "`tokenizers` fails on this text too", model, (int)(n > 60 ? 60 : n), (const char *)s);
    return dfm_ids_push(out, (uint32_t)tok->unk_id);
}

int dfm_wordpiece_piece(dfm_enc_ctx *c, const uint8_t *s, size_t n, dfm_ids *out) {
    const dfm_tokenizer *tok = c->tok;
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += (s[i] & 0xC0) != 0x80;
    if (chars > tok->max_word_chars) return push_unk(tok, "WordPiece", s, n, out);
    size_t before = out->n;
    sbuf *key = &c->word;
    for (size_t start = 0; start < n;) {
        size_t end = n;
        int64_t id = -1;
        while (start < end) {
            key->n = 0;
            if (start) DFM_TRY(dfm_sbuf_add(key, tok->prefix, tok->prefix_len));
            DFM_TRY(dfm_sbuf_add(key, s + start, end - start));
            if ((id = dfm_strmap_get(&tok->vocab, key->p, key->n)) >= 0) break;
            do end--; while (end > start && (s[end] & 0xC0) == 0x80); /* one character shorter */
        }
        if (id < 0) {
            out->n = before;
            return push_unk(tok, "WordPiece", s, n, out);
        }
        DFM_TRY(dfm_ids_push(out, (uint32_t)id));
        start = end;
    }
    return DFM_OK;
}

int dfm_wordlevel_piece(dfm_enc_ctx *c, const uint8_t *s, size_t n, dfm_ids *out) {
    int64_t id = dfm_strmap_get(&c->tok->vocab, s, n);
    if (id >= 0) return dfm_ids_push(out, (uint32_t)id);
    return push_unk(c->tok, "WordLevel", s, n, out);
}
