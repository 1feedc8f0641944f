/* wordpiece.h — the BERT-family WordPiece tokenizer of the frozen encoder, as Hugging Face `tokenizers`
 * runs it for tokenizer.json files with:
 *   normalizer    BertNormalizer {clean_text, handle_chinese_chars, strip_accents (null = lowercase),
 *                 lowercase}
 *   pre_tokenizer BertPreTokenizer (split on whitespace, every punctuation char its own word)
 *   model         WordPiece {unk_token, continuing_subword_prefix "##", max_input_chars_per_word}
 *   post          [CLS] A [SEP] (TemplateProcessing / BertProcessing)
 * Special added tokens with "normalized": false ([CLS], [SEP], [MASK], ...) are matched in the raw text
 * first (leftmost, longest), as Hugging Face does. Without tokenizer.json, vocab.txt plus
 * tokenizer_config.json ("do_lower_case", "strip_accents", "tokenize_chinese_chars") are used.
 * Other normalizers, pre-tokenizers or models are DFM_EUNSUPPORTED naming the field.
 *
 * Immutable once loaded; safe to use from many threads.
 */
#ifndef DFM_WORDPIECE_H
#define DFM_WORDPIECE_H

#include <stddef.h>
#include <stdint.h>

typedef struct dfm_wordpiece dfm_wordpiece;

/* Load from a model folder (tokenizer.json, else vocab.txt). Errors name the file and field. */
int dfm_wordpiece_load(const char *model_dir, dfm_wordpiece **out);
void dfm_wordpiece_free(dfm_wordpiece *wp);

/* Tokenize text[0..len) into ids: [CLS] pieces... [SEP], keeping at most max_len ids in all (the
 * pieces are cut to max_len - 2; max_len <= 0: no limit). Invalid UTF-8 becomes U+FFFD (which clean_text
 * then drops). Writes at most cap ids to ids; returns the number of ids (which may exceed cap when
 * max_len <= 0: call again with a larger buffer) or a negative DFM_E* code. *truncated (may be NULL)
 * is set to 1 when pieces were cut off. */
int dfm_wordpiece_encode(const dfm_wordpiece *wp, const char *text, size_t len, int max_len, int32_t *ids,
                         int cap, int *truncated);

uint32_t dfm_wordpiece_vocab_size(const dfm_wordpiece *wp);
int32_t dfm_wordpiece_cls_id(const dfm_wordpiece *wp);
int32_t dfm_wordpiece_sep_id(const dfm_wordpiece *wp);
int32_t dfm_wordpiece_pad_id(const dfm_wordpiece *wp);
/* Id of a vocabulary token, or -1. */
int32_t dfm_wordpiece_token_id(const dfm_wordpiece *wp, const char *token);
/* The token string of an id (NULL if out of range). */
const char *dfm_wordpiece_token(const dfm_wordpiece *wp, int32_t id);

#endif
