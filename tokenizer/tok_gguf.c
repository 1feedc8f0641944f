/* tok_gguf.c — a Hugging Face tokenizer.json and tokenizer_config.json from a GGUF file's tokenizer.*
 * metadata (llama.cpp stores the vocabulary, merges, token types and the name of the pre-tokenizer there,
 * and no tokenizer.json).
 *
 * Byte-level BPE ("gpt2") only. tokenizer.ggml.pre names a known tokenizer, not a model: llama.cpp picks
 * the name whose splitting reproduces the original's, so each name below is the pre-tokenizer of the
 * tokenizer.json it was converted from:
 *   gpt-2                      ByteLevel with GPT-2's pattern
 *   smollm, starcoder          Digits(individual_digits) then ByteLevel: every digit its own piece
 *   llama-bpe, llama3, llama-v3  Split(Llama-3's pattern, Isolated) then ByteLevel without its pattern;
 *                              BPE with ignore_merges
 *   qwen2                      the same with Qwen2's pattern (one digit per piece), after an NFC normalizer
 * Any other name, or another tokenizer model, is refused naming it: a wrong split gives wrong ids silently.
 */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "schemas/gguf.h"

static const char LLAMA3_SPLIT[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
static const char QWEN2_SPLIT[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

static json_t *byte_level(int use_regex) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex",
                     use_regex);
}

static json_t *split_then_byte_level(const char *pattern) {
    json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", pattern, "behavior",
                              "Isolated", "invert", 0);
    return json_pack("{s:s, s:[o, o]}", "type", "Sequence", "pretokenizers", split, byte_level(0));
}

/* The normalizer and pre-tokenizer of a tokenizer.ggml.pre name, and whether a pre-token found whole in the
 * vocabulary skips the merges (llama.cpp does so for Llama-3, as Meta's tokenizer.json says); 0 when the name
 * is not known. */
static int pre_for(const char *pre, json_t **normalizer, json_t **pre_tokenizer, int *ignore_merges) {
    *normalizer = json_null();
    *ignore_merges = 0;
    if (!strcmp(pre, "gpt-2")) {
        *pre_tokenizer = byte_level(1);
    } else if (!strcmp(pre, "smollm") || !strcmp(pre, "starcoder")) {
        *pre_tokenizer = json_pack("{s:s, s:[{s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type", "Digits",
                                   "individual_digits", 1, byte_level(1));
    } else if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "llama-v3")) {
        *pre_tokenizer = split_then_byte_level(LLAMA3_SPLIT);
        *ignore_merges = 1;
    } else if (!strcmp(pre, "qwen2")) {
        *normalizer = json_pack("{s:s}", "type", "NFC");
        *pre_tokenizer = split_then_byte_level(QWEN2_SPLIT);
    } else {
        json_decref(*normalizer);
        *normalizer = NULL;
        return 0;
    }
    return 1;
}

/* The vocabulary key of a GGUF token: its own spelling when every character is in GPT-2's byte alphabet
 * (llama.cpp writes byte-level tokens so), else its UTF-8 bytes spelled in that alphabet (some converters
 * wrote a token's decoded text). *key is malloc'd. */
static int byte_level_key(const char *s, size_t n, char **key) {
    size_t i = 0;
    int in_alphabet = 1;
    while (i < n && in_alphabet) {
        uint32_t cp;
        i += (size_t)dfm_utf8_next((const uint8_t *)s + i, n - i, &cp);
        in_alphabet = dfm_bytelevel_byte(cp) >= 0;
    }
    size_t cap = in_alphabet ? n : 2 * n; /* every byte respelled takes at most 2 bytes of UTF-8 */
    if (!(*key = malloc(cap + 1))) return DFM_FAIL(DFM_ENOMEM, "no memory");
    if (in_alphabet) {
        memcpy(*key, s, n);
        (*key)[n] = 0;
        return DFM_OK;
    }
    size_t o = 0;
    for (i = 0; i < n; i++) o += (size_t)dfm_utf8_put(dfm_bytelevel_cp((uint8_t)s[i]), (uint8_t *)*key + o);
    (*key)[o] = 0;
    return DFM_OK;
}

/* ggml token types (llama.cpp's llama_token_type) */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

typedef struct {
    const dfm_gguf *g;
    dfm_gguf_str *tokens;
    int64_t *types;
    uint64_t n_tokens;
    char **keys;
} build_ctx;

static void ctx_free(build_ctx *c) {
    if (c->keys)
        for (uint64_t i = 0; i < c->n_tokens; i++) free(c->keys[i]);
    free(c->keys);
    free(c->tokens);
    free(c->types);
}

static int load_tokens(build_ctx *c, uint32_t max_ids) {
    const dfm_gguf *g = c->g;
    const dfm_gguf_kv *kv = dfm_gguf_find(g, "tokenizer.ggml.tokens");
    if (!kv) return DFM_FAIL(DFM_ENOTFOUND, "%s: no tokenizer.ggml.tokens. HINT: the file carries no tokenizer; pass "
                             "the model's own tokenizer.json with --tokenizer", g->path);
    DFM_TRY(dfm_gguf_strings(g, kv, &c->tokens));
    c->n_tokens = kv->count;
    if (c->n_tokens == 0 || c->n_tokens > max_ids)
        return DFM_FAIL(DFM_EFORMAT, "%s: %llu tokens in tokenizer.ggml.tokens, but the model has %u embedding rows",
                        g->path, (unsigned long long)c->n_tokens, max_ids);
    const dfm_gguf_kv *tt = dfm_gguf_find(g, "tokenizer.ggml.token_type");
    if (tt) {
        DFM_TRY(dfm_gguf_ints(g, tt, &c->types));
        if (tt->count != c->n_tokens)
            return DFM_FAIL(DFM_EFORMAT, "%s: tokenizer.ggml.token_type has %llu entries for %llu tokens", g->path,
                            (unsigned long long)tt->count, (unsigned long long)c->n_tokens);
    }
    if (!(c->keys = calloc(c->n_tokens, sizeof *c->keys))) return DFM_FAIL(DFM_ENOMEM, "no memory");
    for (uint64_t i = 0; i < c->n_tokens; i++) {
        const dfm_gguf_str *t = &c->tokens[i];
        if (t->n == 0 || memchr(t->p, 0, t->n) || dfm_utf8_valid_prefix((const uint8_t *)t->p, t->n) != t->n)
            return DFM_FAIL(DFM_EFORMAT, "%s: token %llu is empty, holds a NUL byte or is not valid UTF-8", g->path,
                            (unsigned long long)i);
        DFM_TRY(byte_level_key(t->p, t->n, &c->keys[i]));
    }
    return DFM_OK;
}

static json_t *vocab_json(const build_ctx *c, uint64_t *duplicates) {
    json_t *v = json_object();
    *duplicates = 0;
    for (uint64_t i = 0; i < c->n_tokens && v; i++) {
        if (json_object_get(v, c->keys[i])) (*duplicates)++; /* the later id wins, as a Python dict keeps it */
        if (json_object_set_new(v, c->keys[i], json_integer((json_int_t)i))) {
            json_decref(v);
            v = NULL;
        }
    }
    return v;
}

/* Whether the merge of a and b is a vocabulary entry (tokenizers refuses a merge whose result is not). */
static int in_vocab_joined(json_t *vocab, json_t *a, json_t *b) {
    size_t la = json_string_length(a), lb = json_string_length(b);
    char *ab = malloc(la + lb + 1);
    if (!ab) return 0;
    memcpy(ab, json_string_value(a), la);
    memcpy(ab + la, json_string_value(b), lb + 1);
    int ok = json_object_get(vocab, ab) != NULL;
    free(ab);
    return ok;
}

static int merges_json(const build_ctx *c, json_t *vocab, json_t **out) {
    const dfm_gguf *g = c->g;
    *out = NULL;
    const dfm_gguf_kv *kv = dfm_gguf_find(g, "tokenizer.ggml.merges");
    if (!kv) return DFM_FAIL(DFM_ENOTFOUND, "%s: a byte-level BPE tokenizer without tokenizer.ggml.merges", g->path);
    dfm_gguf_str *m;
    DFM_TRY(dfm_gguf_strings(g, kv, &m));
    json_t *arr = json_array();
    int rc = arr ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    for (uint64_t i = 0; i < kv->count && !rc; i++) {
        size_t valid = dfm_utf8_valid_prefix((const uint8_t *)m[i].p, m[i].n);
        if (valid != m[i].n) {
            rc = DFM_FAIL(DFM_EFORMAT, "%s: tokenizer.ggml.merges[%llu] is not valid UTF-8 (byte %zu of %llu). HINT: "
                          "the file is damaged", g->path, (unsigned long long)i, valid, (unsigned long long)m[i].n);
            break;
        }
        const char *sp = memchr(m[i].p, ' ', m[i].n);
        size_t la = sp ? (size_t)(sp - m[i].p) : 0, lb = sp ? m[i].n - la - 1 : 0;
        json_t *a = sp && la && lb && !memchr(sp + 1, ' ', lb) ? json_stringn(m[i].p, la) : NULL;
        json_t *b = a ? json_stringn(sp + 1, lb) : NULL;
        if (!b) {
            json_decref(a);
            rc = DFM_FAIL(DFM_EFORMAT, "%s: tokenizer.ggml.merges[%llu] is not two tokens separated by one space",
                          g->path, (unsigned long long)i);
        } else if (!json_object_get(vocab, json_string_value(a)) || !json_object_get(vocab, json_string_value(b)) ||
                   !in_vocab_joined(vocab, a, b)) {
            rc = DFM_FAIL(DFM_EFORMAT, "%s: tokenizer.ggml.merges[%llu] \"%s %s\": a token or their merge is not in "
                          "the vocabulary", g->path, (unsigned long long)i, json_string_value(a), json_string_value(b));
            json_decref(a);
            json_decref(b);
        } else {
            json_array_append_new(arr, json_pack("[o, o]", a, b));
        }
    }
    free(m);
    if (rc) json_decref(arr);
    else *out = arr;
    return rc;
}

/* Control tokens are special added tokens; user-defined ones are added tokens matched in the raw text. */
static json_t *added_json(const build_ctx *c) {
    json_t *arr = json_array();
    for (uint64_t i = 0; c->types && i < c->n_tokens; i++) {
        if (c->types[i] != TT_CONTROL && c->types[i] != TT_USER_DEFINED) continue;
        json_array_append_new(arr, json_pack("{s:I, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)i, "content",
                                             c->tokens[i].p, (size_t)c->tokens[i].n, "single_word", 0, "lstrip", 0,
                                             "rstrip", 0, "normalized", 0, "special", c->types[i] == TT_CONTROL));
    }
    return arr;
}

/* The token of an id key (tokenizer.ggml.bos_token_id, ...), or JSON null when absent or out of range. */
static json_t *token_of(const build_ctx *c, const char *key) {
    uint32_t id;
    if (!dfm_gguf_find(c->g, key) || dfm_gguf_get_u32(c->g, key, 1, 0, &id) || id >= c->n_tokens) {
        dfm_error_clear();
        return json_null();
    }
    return json_stringn(c->tokens[id].p, c->tokens[id].n);
}

int dfm_tokenizer_json_from_gguf(const dfm_gguf *g, uint32_t max_ids, json_t **tokenizer, json_t **config) {
    *tokenizer = *config = NULL;
    char *model = NULL, *pre = NULL, *chat = NULL;
    build_ctx c = {.g = g};
    json_t *normalizer = NULL, *pre_tok = NULL, *vocab = NULL, *merges = NULL;
    int add_bos = 0, ignore_merges = 0;
    uint32_t ctx_len = 0;
    int rc = dfm_gguf_get_str(g, "tokenizer.ggml.model", 1, &model);
    if (!rc && strcmp(model, "gpt2"))
        rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: tokenizer.ggml.model \"%s\": dfm builds tokenizer.json for byte-level BPE "
                      "(\"gpt2\") only. HINT: pass the model's own tokenizer.json with --tokenizer", g->path, model);
    if (!rc) rc = dfm_gguf_get_str(g, "tokenizer.ggml.pre", 0, &pre);
    if (!rc && !pre_for(pre ? pre : "gpt-2", &normalizer, &pre_tok, &ignore_merges))
        rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: tokenizer.ggml.pre \"%s\" is not a pre-tokenizer dfm knows (gpt-2, smollm, "
                      "starcoder, llama-bpe, llama3, llama-v3, qwen2). HINT: pass the model's own tokenizer.json with "
                      "--tokenizer", g->path, pre);
    if (!rc) rc = load_tokens(&c, max_ids);
    uint64_t dups = 0;
    if (!rc && !(vocab = vocab_json(&c, &dups))) rc = DFM_FAIL(DFM_ENOMEM, "no memory for the vocabulary");
    if (!rc) rc = merges_json(&c, vocab, &merges);
    if (!rc) rc = dfm_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", 0, &add_bos);
    if (!rc) rc = dfm_gguf_get_str(g, "tokenizer.chat_template", 0, &chat);
    size_t chat_ok = chat ? dfm_utf8_valid_prefix((const uint8_t *)chat, strlen(chat)) : 0;
    if (!rc && chat && chat_ok != strlen(chat)) { /* JSON cannot hold it: said, not dropped silently */
        DFM_LOG_W("%s: tokenizer.chat_template is not valid UTF-8 (byte %zu of %zu); tokenizer_config.json is written "
                  "without a chat template", g->path, chat_ok, strlen(chat));
        free(chat);
        chat = NULL;
    }
    if (!rc) {
        char *arch = NULL;
        if (!dfm_gguf_get_str(g, "general.architecture", 0, &arch) && arch) {
            char key[128];
            snprintf(key, sizeof key, "%s.context_length", arch);
            rc = dfm_gguf_get_u32(g, key, 0, 0, &ctx_len);
        }
        free(arch);
    }
    if (!rc && dups)
        rc = DFM_FAIL(DFM_EFORMAT, "%s: %llu tokens of tokenizer.ggml.tokens spell the same vocabulary entry as an "
                      "earlier one. HINT: pass the model's own tokenizer.json with --tokenizer", g->path,
                      (unsigned long long)dups);
    if (!rc) {
        json_t *bpe = json_pack("{s:s, s:n, s:n, s:s, s:s, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
                                "unk_token", "continuing_subword_prefix", "", "end_of_word_suffix", "", "fuse_unk", 0,
                                "byte_fallback", 0, "ignore_merges", ignore_merges, "vocab", vocab, "merges", merges);
        vocab = merges = NULL;
        json_t *post = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 0,
                                 "use_regex", 1);
        json_t *dec = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1,
                                "use_regex", 1);
        *tokenizer = json_pack("{s:s, s:n, s:n, s:o, s:o, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation",
                               "padding", "added_tokens", added_json(&c), "normalizer", normalizer, "pre_tokenizer",
                               pre_tok, "post_processor", post, "decoder", dec, "model", bpe);
        normalizer = pre_tok = NULL;
        *config = json_pack("{s:b, s:b, s:o, s:o, s:o, s:o, s:b, s:s}", "add_bos_token", add_bos, "add_eos_token", 0,
                            "bos_token", token_of(&c, "tokenizer.ggml.bos_token_id"), "eos_token",
                            token_of(&c, "tokenizer.ggml.eos_token_id"), "unk_token",
                            token_of(&c, "tokenizer.ggml.unknown_token_id"), "pad_token",
                            token_of(&c, "tokenizer.ggml.padding_token_id"), "clean_up_tokenization_spaces", 0,
                            "tokenizer_class", "PreTrainedTokenizerFast");
        if (*config && ctx_len) json_object_set_new(*config, "model_max_length", json_integer(ctx_len));
        if (*config && chat) json_object_set_new(*config, "chat_template", json_string(chat));
        if (!*tokenizer || !*config) {
            json_decref(*tokenizer);
            json_decref(*config);
            *tokenizer = *config = NULL;
            rc = DFM_FAIL(DFM_ENOMEM, "no memory for tokenizer.json");
        }
    }
    json_decref(normalizer);
    json_decref(pre_tok);
    json_decref(vocab);
    json_decref(merges);
    ctx_free(&c);
    free(model);
    free(pre);
    free(chat);
    return rc;
}
