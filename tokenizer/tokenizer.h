/* tokenizer.h — the language model's tokenizer, read from a Hugging Face tokenizer.json.
 *
 * Supported: the models BPE (byte-level or not, byte fallback, ignore_merges, subword prefix and suffix),
 * Unigram, WordPiece and WordLevel, with every normalizer, pre-tokenizer and decoder of `tokenizers` 0.2x
 * that a published LM uses, and the added-token flags (tokenizer/README.md: the coverage table, and what is
 * refused). Anything else is DFM_EUNSUPPORTED naming the JSON path and the type.
 * Encoding gives the same ids as Hugging Face `tokenizers` with add_special_tokens=False (checked on
 * golden and fuzz sets made with the library itself); decoding gives its decode's text.
 * Input text must be valid UTF-8; dfm_tokenizer_encode replaces each invalid sequence by U+FFFD
 * exactly as Python's bytes.decode("utf-8", "replace") does and counts the replacements.
 *
 * A loaded tokenizer is immutable and may be used by many threads at once.
 */
#ifndef DFM_TOKENIZER_H
#define DFM_TOKENIZER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tok_ids.h" /* dfm_ids: what encode appends to */

typedef struct dfm_tokenizer dfm_tokenizer;


/* Load tokenizer.json (path to the file, or to a folder holding it). Errors name the file and the
 * JSON path of the problem.
 * The parsed tables are cached in a binary file keyed by the XXH3-64 of the tokenizer.json bytes
 * (schemas/tokenizer_cache.md), in $DFM_TOKENIZER_CACHE (a folder; "off", "0" or "" disables the
 * cache), else $XDG_CACHE_HOME/dfm/tokenizer-cache, else ~/.cache/dfm/tokenizer-cache. A valid cache
 * file is mapped read-only (milliseconds instead of ~0.5 s for Qwen2.5); a missing one is written after
 * parsing (temporary + rename: ranks that load at once are safe); a stale, truncated or corrupt one is
 * never used: a warning is logged and it is rebuilt. Failing to write the cache is a warning, not an
 * error. Either way the tokenizer encodes and decodes exactly the same. */
int dfm_tokenizer_load(const char *path, dfm_tokenizer **out);
/* 1 if tok's tables were mapped from the cache file, 0 if parsed from the JSON. */
int dfm_tokenizer_from_cache(const dfm_tokenizer *tok);
/* Free; NULL is a no-op. */
void dfm_tokenizer_free(dfm_tokenizer *tok);

/* Append the ids of text[0..len) to *out. *n_replaced (may be NULL) receives the number of invalid
 * UTF-8 sequences replaced by U+FFFD. Thread-safe. DFM_EFORMAT when the text needs an unknown token the
 * vocabulary lacks (as `tokenizers` fails then). */
int dfm_tokenizer_encode(const dfm_tokenizer *tok, const char *text, size_t len, dfm_ids *out,
                         size_t *n_replaced);

/* Decode ids to UTF-8 text through the tokenizer's decoder chain (skip_special: drop special added tokens,
 * as HF skip_special_tokens). *text is malloc'd and NUL-terminated; *len excludes the NUL. Byte sequences
 * that are not valid UTF-8 on their own (a chunk cut inside a character) decode to U+FFFD, as Hugging Face
 * does. An id >= vocab size, or one no token has, is DFM_ERANGE (Hugging Face skips it silently). */
int dfm_tokenizer_decode(const dfm_tokenizer *tok, const uint32_t *ids, size_t n, int skip_special,
                         char **text, size_t *len);

/* Number of ids (model vocabulary plus added tokens): every valid id is < this. */
uint32_t dfm_tokenizer_vocab_size(const dfm_tokenizer *tok);
/* Id of a token string (vocabulary or added token), or -1. */
int64_t dfm_tokenizer_token_id(const dfm_tokenizer *tok, const char *token);
/* End-of-sequence id used between documents: the first of <|endoftext|>, <|end_of_text|>, </s>,
 * <eos>, [SEP] present; -1 if none (then the caller must be told to pass one explicitly). Not the
 * eos_token of tokenizer_config.json: a chat model names its turn end there (Qwen2.5: <|im_end|>),
 * while documents of a pretraining corpus are separated by the end-of-text token. */
int64_t dfm_tokenizer_eos_id(const dfm_tokenizer *tok);
/* A short description ("byte-level BPE, 151387 merges, 151665 ids, normalizer NFC, pre-tokenizer
 * Split+ByteLevel, decoder ByteLevel"). */
const char *dfm_tokenizer_describe(const dfm_tokenizer *tok);
/* XXH3-64 of the tokenizer.json bytes: identifies the tokenizer in artefact headers. */
uint64_t dfm_tokenizer_hash(const dfm_tokenizer *tok);

/* A Hugging Face tokenizer.json and tokenizer_config.json made from a GGUF file's tokenizer.* metadata
 * (tok_gguf.c): byte-level BPE with the pre-tokenizer tokenizer.ggml.pre names (gpt-2, smollm, starcoder,
 * llama-bpe / llama3 / llama-v3, qwen2), control tokens as special added tokens. The file may hold at most
 * max_ids tokens (the model's embedding rows). Another tokenizer model or pre-tokenizer name is
 * DFM_EUNSUPPORTED naming it; malformed tokens or merges DFM_EFORMAT naming the entry. New references. */
struct dfm_gguf;
int dfm_tokenizer_json_from_gguf(const struct dfm_gguf *g, uint32_t max_ids, json_t **tokenizer, json_t **config);

#endif
