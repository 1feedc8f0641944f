/* tokenizer.h — the language model's tokenizer, read from a Hugging Face tokenizer.json.
 *
 * Supported (anything else is DFM_EUNSUPPORTED naming the model / pre-tokenizer / normalizer type):
 *   - byte-level BPE as in GPT-2, Llama-3, Qwen2/Qwen3 and SmolLM2/StarCoder2: normalizer none or NFC,
 *     pre-tokenizer Split(regex, Isolated), Digits (individual or contiguous) and/or ByteLevel, merges
 *     applied by rank, added/special tokens matched
 *     in the raw text before pre-tokenization (as Hugging Face does);
 *   - SentencePiece-style BPE with byte fallback as in Mistral / Llama-2 (normalizer Prepend("▁") +
 *     Replace(" ", "▁"), or pre-tokenizer Metaspace; <0xNN> byte tokens for unknown characters).
 *     (Checked against HF on small tokenizer.json files built with HF itself: no real one is installed.)
 * Encoding gives the same ids as Hugging Face `tokenizers` with add_special_tokens=False.
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

typedef struct dfm_tokenizer dfm_tokenizer;

/* Growable id buffer; zero-initialise, free with dfm_ids_free. */
typedef struct {
    uint32_t *ids;
    size_t n, cap;
} dfm_ids;

void dfm_ids_free(dfm_ids *v);
int dfm_ids_push(dfm_ids *v, uint32_t id);

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
 * UTF-8 sequences replaced by U+FFFD. Thread-safe. */
int dfm_tokenizer_encode(const dfm_tokenizer *tok, const char *text, size_t len, dfm_ids *out,
                         size_t *n_replaced);

/* Decode ids to UTF-8 text (skip_special: drop special added tokens, as HF skip_special_tokens).
 * *text is malloc'd and NUL-terminated; *len excludes the NUL. Byte sequences that are not valid
 * UTF-8 on their own (a chunk cut inside a character) decode to U+FFFD, as Hugging Face does.
 * An id >= vocab size is DFM_ERANGE. */
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
/* A short description ("byte-level BPE, 151643 merges, pre-tokenizer Split+ByteLevel"). */
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
