/* tok_internal.h — private structures of the tokenizer (every tokenizer/tok_*.c and tokenizer.c).
 *
 * The pipeline is Hugging Face `tokenizers`' (TokenizerImpl::encode_single_sequence): added tokens cut out
 * of the raw text; each gap normalized (tok_normalize.c, tok_precompiled.c); added tokens with
 * normalized=true cut out of the normalized gap; pre-tokenizer stages split it into pieces
 * (tok_pretok.c); the model turns each piece into ids (tok_bpe.c, tok_unigram.c, tok_word.c, behind the
 * piece cache of tok_cache.c). Decoding runs the decoder chain over the tokens' strings (tok_decode.c).
 *
 * Vocabulary keys are the RAW bytes a token stands for: with a ByteLevel pre-tokenizer the token string of
 * tokenizer.json ("Ġworld") is mapped back through the GPT-2 byte alphabet (" world"), so the model, the
 * piece cache and decode work on plain bytes and never build the byte-level string. For other
 * tokenizers the key is the token string itself.
 */
#ifndef DFM_TOK_INTERNAL_H
#define DFM_TOK_INTERNAL_H

#include "tokenizer/tok_ids.h"
#include "tokenizer/tok_regex.h"
#include "tokenizer/tok_sbuf.h"
#include "tokenizer/tok_utf8.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* The tokenizer (struct below); the same typedef as tokenizer.h's, repeated (C11) so that the private floor
 * does not include the interface built on it. */
typedef struct dfm_tokenizer dfm_tokenizer;

/* ---- string -> id map (open addressing, keys are byte strings owned by the caller) ---- */

typedef struct {
    uint64_t *slots; /* (hash >> 32) << 32 | (index + 1); 0 = empty */
    size_t mask;
    const char *const *keys; /* index -> key bytes */
    const uint32_t *lens;    /* index -> key length */
} dfm_strmap;

uint64_t dfm_tok_hash(const void *p, size_t n);
int dfm_strmap_init(dfm_strmap *m, size_t n_keys_max, const char *const *keys, const uint32_t *lens);
/* Insert index i (its key is keys[i]); if the key is already present the old index is kept. */
void dfm_strmap_put(dfm_strmap *m, uint32_t i);
/* Index of key, or -1. */
int64_t dfm_strmap_get(const dfm_strmap *m, const void *key, size_t len);
void dfm_strmap_free(dfm_strmap *m);

/* ---- pair map: 64-bit key -> 64-bit value (open addressing; UINT64_MAX keys are free slots).
 * BPE: (left id << 32 | right id) -> (rank << 32 | merged id). */

typedef struct {
    uint64_t *kv; /* slot k: kv[2k] the key (UINT64_MAX: free), kv[2k + 1] its value; one cache line per probe */
    size_t mask, n;
} dfm_pairmap;

int dfm_pairmap_init(dfm_pairmap *m, size_t n);
/* Insert or overwrite. */
void dfm_pairmap_put(dfm_pairmap *m, uint64_t key, uint64_t val);

/* The first slot of key's probe sequence (the cache file keeps the table: changing this is a new format). */
static inline size_t dfm_pair_slot(uint64_t key, size_t mask) {
    key ^= key >> 31;
    key *= 0x9E3779B97F4A7C15ULL;
    return (size_t)(key >> 17) & mask;
}

/* The value, or UINT64_MAX when key is absent (inline: the BPE merge loop and the Unigram trie walk call
 * it for every symbol pair and byte). */
static inline uint64_t dfm_pairmap_get(const dfm_pairmap *m, uint64_t key) {
    for (size_t k = dfm_pair_slot(key, m->mask);; k = (k + 1) & m->mask) {
        uint64_t s = m->kv[2 * k];
        if (s == key) return m->kv[2 * k + 1];
        if (s == UINT64_MAX) return UINT64_MAX;
    }
}
void dfm_pairmap_free(dfm_pairmap *m);

/* ---- piece cache (tok_cache.c): piece bytes -> ids ----
 * Read-mostly and lock-free for readers: each shard is a seqlock (Boehm, "Can seqlocks get along with
 * programming language memory models?", 2012). Readers take no lock and write nothing shared: they
 * read the sequence number, probe with relaxed atomic loads, and keep the result only if the sequence
 * number is unchanged and even. Writers (a miss being filled) serialise on the shard's mutex. A full
 * shard is cleared and refilled (the working set of a corpus is mostly a few thousand words). */
#define DFM_TOK_CACHE_SHARDS 64
#define DFM_TOK_CACHE_MAX_KEY 48 /* longer pieces are not cached */
#define DFM_TOK_CACHE_MAX_IDS 24
typedef struct {
    pthread_mutex_t mu;      /* writers only */
    _Atomic unsigned seq;    /* odd while a writer changes the shard */
    _Atomic uint64_t *slots; /* hash fragment << 32 | (entry word offset + 1); 0 = empty */
    _Atomic uint32_t *arena; /* entries: [key len | n ids << 16] [key, zero-padded words] [ids] */
    size_t used, n;          /* words used, entries; writers only */
} dfm_tok_cache_shard;

/* ---- normalizers (tok_normalize.c) ---- */

enum {
    DFM_NORM_NFC = 1, DFM_NORM_NFD, DFM_NORM_NFKC, DFM_NORM_NFKD, DFM_NORM_LOWERCASE, DFM_NORM_STRIP,
    DFM_NORM_STRIP_ACCENTS, DFM_NORM_REPLACE, DFM_NORM_PREPEND, DFM_NORM_BERT, DFM_NORM_NMT, DFM_NORM_PRECOMPILED
};

typedef struct dfm_charsmap dfm_charsmap; /* tok_precompiled.c */

typedef struct {
    int kind;
    char *a, *b;     /* PREPEND: a = prefix; REPLACE: a -> b (a: the string pattern, unless re) */
    size_t alen, blen;
    dfm_regex *re;   /* REPLACE with a Regex pattern, or an empty String pattern */
    int left, right; /* STRIP */
    int clean_text, chinese, strip_accents, lowercase; /* BERT */
    dfm_charsmap *charsmap;                              /* PRECOMPILED */
} dfm_norm_stage;

/* ---- pre-tokenizers (tok_pretok.c) ---- */

#define DFM_TOK_PRE_MAX 16

enum {
    DFM_PRE_SPLIT = 1,       /* regex (or quoted string) matches, a behavior, invert */
    DFM_PRE_CHARS,           /* each character of a class is a match (Punctuation, Digits, WhitespaceSplit, ...) */
    DFM_PRE_WHITESPACE,      /* \w+|[^\w\s]+ are the pieces, whitespace dropped */
    DFM_PRE_SCRIPTS,         /* UnicodeScripts */
    DFM_PRE_FIXED,           /* FixedLength */
    DFM_PRE_BYTELEVEL,
    DFM_PRE_METASPACE
};
enum { DFM_BEH_ISOLATED = 1, DFM_BEH_REMOVED, DFM_BEH_MERGED_PREV, DFM_BEH_MERGED_NEXT, DFM_BEH_CONTIGUOUS };
enum { DFM_CLASS_WS = 1, DFM_CLASS_PUNCT, DFM_CLASS_NUMERIC, DFM_CLASS_CHAR };

typedef struct {
    int kind;
    int behavior, invert;
    dfm_regex *re;        /* SPLIT; BYTELEVEL with use_regex */
    int cls;              /* CHARS: DFM_CLASS_* */
    uint32_t ch;          /* CHARS with DFM_CLASS_CHAR: the delimiter; METASPACE: the replacement */
    char rep[4];          /* METASPACE: the replacement as UTF-8 */
    int rep_len;
    int prefix;           /* BYTELEVEL: add_prefix_space; METASPACE: 0 never, 1 always, 2 first */
    int split;            /* METASPACE */
    size_t length;        /* FIXED */
    int map_out;          /* BYTELEVEL: later stages see the byte-level string (Falcon: Digits after it) */
    const char *label;    /* the tokenizer.json type, for describe() */
} dfm_pre_stage;

/* ---- decoders (tok_decode.c) ---- */

enum {
    DFM_DEC_BYTELEVEL = 1, DFM_DEC_METASPACE, DFM_DEC_WORDPIECE, DFM_DEC_BPE, DFM_DEC_REPLACE, DFM_DEC_BYTEFALLBACK,
    DFM_DEC_FUSE, DFM_DEC_STRIP, DFM_DEC_CTC
};

typedef struct {
    int kind;
    char *a, *b;          /* METASPACE: a = replacement; WORDPIECE: a = prefix; BPE: a = suffix; REPLACE: a -> b;
                             CTC: a = pad token, b = word delimiter token */
    size_t alen, blen;
    dfm_regex *re;        /* REPLACE */
    uint32_t ch;          /* METASPACE: replacement; STRIP: content */
    int prefix;           /* METASPACE: prepend_scheme != never */
    int cleanup;          /* WORDPIECE, CTC */
    size_t start, stop;   /* STRIP */
} dfm_dec_stage;

/* ---- the tokenizer ---- */

typedef struct {
    char *content;     /* as matched in text (normalized form when normalized) */
    uint32_t len;
    uint32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} dfm_added_token;

/* One added-token matcher: tokens indexed by first byte, longest first. */
typedef struct {
    uint32_t *order;           /* indices into tok->added, grouped by first byte, longest first */
    uint32_t first[257];       /* order[first[b] .. first[b+1]) start with byte b */
    size_t n;
} dfm_added_matcher;

enum { DFM_MODEL_BPE = 1, DFM_MODEL_UNIGRAM, DFM_MODEL_WORDPIECE, DFM_MODEL_WORDLEVEL };

struct dfm_tokenizer {
    uint64_t hash;
    char describe[240];
    int model;        /* DFM_MODEL_* */
    int byte_level;   /* vocab keys are raw bytes (ByteLevel pre-tokenizer) */
    int byte_fallback, fuse_unk, ignore_merges;
    int64_t unk_id;   /* -1: none */
    int unk_missing;  /* an unk_token is named but not in the vocabulary: an error when it is needed */
    char *prefix, *suffix; /* BPE continuing_subword_prefix / end_of_word_suffix (token strings); WordPiece
                              continuing_subword_prefix */
    size_t prefix_len, suffix_len;
    char *prefix_raw, *suffix_raw; /* the same as raw key bytes */
    size_t prefix_raw_len, suffix_raw_len;
    size_t max_word_chars; /* WordPiece max_input_chars_per_word */
    double min_score;      /* Unigram: the lowest piece score (unknown characters score min - 10) */
    double *scores;        /* Unigram: per id (0 for ids outside the model's vocabulary) */
    /* Unigram: the trie of the pieces, nodes numbered breadth first so a node's edges are contiguous and edge
     * e leads to node e + 1 (tok_unigram.c) */
    uint32_t n_trie_nodes;
    uint32_t *trie_first;   /* node v's edges are [trie_first[v], trie_first[v + 1]); n_trie_nodes + 1 entries */
    uint8_t *trie_label;    /* each edge's byte, increasing within a node; n_trie_nodes - 1 entries */
    int32_t *trie_piece;    /* the piece a node ends, or -1 */
    uint32_t trie_root[256]; /* the root's child for each byte, 0 if none (derived, for speed) */

    /* id -> raw key (encode side) and id -> the token's string (decode side) */
    uint32_t n_ids;
    char **key;       /* NULL for holes */
    uint32_t *key_len;
    char **str;       /* the string the decoder sees: the token of tokenizer.json, or an added token's
                         content (its normalized form when it is normalized); == key when identical */
    uint32_t *str_len;
    uint8_t *is_special; /* per id */
    dfm_strmap vocab; /* raw key -> id (model vocabulary) */
    dfm_pairmap pairs; /* BPE merges or the Unigram trie */
    uint32_t n_merges;
    int32_t byte_id[256]; /* byte-level: the id of each single byte (its alphabet character), or -1 */
    int32_t fb_id[256];   /* byte fallback: the id of <0xNN>, or -1 */

    dfm_added_token *added;
    size_t n_added;
    dfm_added_matcher raw_matcher, norm_matcher;

    dfm_norm_stage *norm;
    size_t n_norm;
    dfm_pre_stage *pre;
    size_t n_pre;
    int track_first;  /* a Metaspace pre-tokenizer with prepend_scheme "first": track which normalized
                         bytes come from the first character of the input */
    int bl_mapped;    /* pieces reach the model as byte-level strings (stages after ByteLevel) */
    int split_meta;   /* BPE whose merges never put "\u2581" inside a token: a long piece is encoded word by
                         word (each "\u2581" starts one), through the cache, with the same ids */
    dfm_dec_stage *dec;
    size_t n_dec;
    int has_decoder;  /* 0: tokens are joined with spaces, as `tokenizers` does without a decoder */
    uint8_t *key_not_bytes; /* byte-level with a lone ByteLevel decoder: 1 for the ids (added tokens) whose key
                               is not their string's ByteLevel decoding, so decode takes the general path for
                               them; NULL when none is */

    dfm_tok_cache_shard cache[DFM_TOK_CACHE_SHARDS];

    /* Loaded from a cache file (tok_cachefile.c): the id strings, the vocabulary slots, the pair map and
     * the scores point into this read-only mapping and are not freed one by one; NULL when parsed. */
    const uint8_t *map;
    size_t map_bytes;
};

/* ---- loading helpers shared by the tok_*.c parsers (tok_internal.c) ---- */

typedef struct {
    const char *file;
} dfm_load_ctx;

/* Fail naming the file being loaded, then the message. */
#define DFM_LFAIL(lc, code, ...) dfm_tok_fail_in((lc), __FILE__, __LINE__, (code), __VA_ARGS__)
int dfm_tok_fail_in(const dfm_load_ctx *lc, const char *src, int line, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A string member: its value and length (*len may be NULL), or NULL when absent or not a string. */
const char *dfm_jstr(const void *obj, const char *key, size_t *len);
/* A boolean member, def when absent or null; DFM_EFORMAT naming where when it is another type. */
int dfm_jbool(const dfm_load_ctx *lc, const void *obj, const char *key, int def, const char *where, int *out);
/* A Replace component's pattern and content (normalizer or decoder): content into *b / *blen; a non-empty
 * String pattern into *a / *alen (matched literally), else the Regex (or empty String) compiled into *re.
 * DFM_EFORMAT naming where when a part is missing; what was set before a failure is the caller's to free. */
int dfm_jreplace(const dfm_load_ctx *lc, const void *obj, const char *where, char **a, size_t *alen, char **b, size_t *blen,
                 dfm_regex **re);
/* A component's parser: one JSON object at where (the JSON path) into tok. */
typedef int (*dfm_component_parser)(const dfm_load_ctx *lc, dfm_tokenizer *tok, json_t *obj, const char *where);
/* A "Sequence" component: each object of its array member key, in order, through parse (where.key[i] as
 * its path); DFM_EFORMAT when key is not an array of objects. */
int dfm_jsequence(const dfm_load_ctx *lc, dfm_tokenizer *tok, json_t *seq, const char *key, const char *where, dfm_component_parser parse);
/* One character given as a JSON string (Metaspace replacement, Strip content, CharDelimiterSplit). */
int dfm_jchar(const dfm_load_ctx *lc, const void *obj, const char *key, const char *where, uint32_t *out);
/* Map a token string of tokenizer.json to its raw key bytes (byte-level: through the byte alphabet when
 * every character is in it, else its UTF-8); appends to b and sets *len. */
int dfm_token_raw(const dfm_tokenizer *tok, const char *s, size_t n, sbuf *b, size_t *len);

/* Parsers: each adds its stages to tok, or fails naming the JSON path and what is not supported. */
int dfm_norm_parse(const dfm_load_ctx *lc, dfm_tokenizer *tok, void *json, const char *where);
int dfm_pre_parse(const dfm_load_ctx *lc, dfm_tokenizer *tok, void *json, const char *where);
int dfm_dec_parse(const dfm_load_ctx *lc, dfm_tokenizer *tok, void *json, const char *where);
void dfm_norm_free(dfm_tokenizer *tok);
void dfm_pre_free(dfm_tokenizer *tok);
void dfm_dec_free(dfm_tokenizer *tok);

/* ---- encoding (per call scratch; tokenizer.c owns it) ---- */

typedef struct dfm_bpe_sym dfm_bpe_sym;
typedef struct {
    const dfm_tokenizer *tok;
    dfm_ids *out;
    dfm_regex_scratch rx;
    sbuf norm, tmp, tmp2;   /* normalizer buffers */
    sbuf stage_in[DFM_TOK_PRE_MAX], stage_out[DFM_TOK_PRE_MAX]; /* per pre-tokenizer stage: its transformed input, a mapped piece */
    sbuf word, word2;       /* model scratch */
    dfm_bpe_sym *sym;       /* BPE symbols */
    size_t sym_cap;
    uint64_t *heap;         /* BPE merge candidates */
    size_t heap_cap;
    double *vscore;         /* Unigram Viterbi: best score ending at each byte */
    int64_t *vstart;        /*   where that best piece starts (-1 unreached) */
    int64_t *vid;           /*   and its id (-1: unknown) */
    size_t v_cap;
    uint32_t *tmp_ids;
    size_t tmp_ids_cap;
} dfm_enc_ctx;

void dfm_enc_ctx_free(dfm_enc_ctx *c);

/* Normalize s[0..n) with every stage into out (replacing its content). lead0: how many leading bytes of s
 * come from the first character of the input (0 when s does not start there); *lead0_out the same for
 * the result (only computed when tok->track_first). */
int dfm_normalize(dfm_enc_ctx *c, const char *s, size_t n, size_t lead0, sbuf *out, size_t *lead0_out);
/* The same for a stand-alone string (an added token's content): its own start is the input's start. */
int dfm_normalize_string(const dfm_tokenizer *tok, const char *s, size_t n, sbuf *out);
/* Split s[0..n) with the pre-tokenizer stages from `stage` on, and encode each piece with the model. */
int dfm_pre_tokenize(dfm_enc_ctx *c, size_t stage, const uint8_t *s, size_t n, size_t lead0);
/* Encode one piece with the model behind the piece cache (tok_cache.c) and append its ids. */
int dfm_model_piece(dfm_enc_ctx *c, const uint8_t *s, size_t n);

/* Models (tok_bpe.c, tok_unigram.c, tok_word.c): one piece, uncached, ids appended. */
int dfm_bpe_piece(dfm_enc_ctx *c, const uint8_t *s, size_t n, dfm_ids *out);
int dfm_unigram_piece(dfm_enc_ctx *c, const uint8_t *s, size_t n, dfm_ids *out);
int dfm_wordpiece_piece(dfm_enc_ctx *c, const uint8_t *s, size_t n, dfm_ids *out);
int dfm_wordlevel_piece(dfm_enc_ctx *c, const uint8_t *s, size_t n, dfm_ids *out);
/* After the vocabulary and merges (parsed or mapped): may BPE pieces be split before each "\u2581"? */
void dfm_bpe_prepare(dfm_tokenizer *tok);
/* Build the Unigram trie over every vocabulary key (after the vocabulary map); prepare: the root table
 * from the trie (parsed or mapped). */
int dfm_unigram_build(const dfm_load_ctx *lc, dfm_tokenizer *tok);
void dfm_unigram_prepare(dfm_tokenizer *tok);

/* Piece cache (tok_cache.c). */
int dfm_tok_cache_init(dfm_tokenizer *tok);
void dfm_tok_cache_free(dfm_tokenizer *tok);

/* Decoding (tok_decode.c): the decoder chain over the tokens of ids. */
int dfm_decode_ids(const dfm_tokenizer *tok, const uint32_t *ids, size_t n, int skip_special, sbuf *out);

/* ---- SentencePiece's precompiled charsmap (tok_precompiled.c) ---- */

/* Parse the charsmap bytes (decoded from base64); DFM_EFORMAT naming where when malformed. */
int dfm_charsmap_parse(const dfm_load_ctx *lc, const uint8_t *p, size_t n, const char *where, dfm_charsmap **out);
void dfm_charsmap_free(dfm_charsmap *m);
/* Normalize s[0..n) into out (appended), grapheme by grapheme as `tokenizers` does; lead0 as for
 * dfm_normalize. */
int dfm_charsmap_apply(const dfm_charsmap *m, const char *s, size_t n, size_t lead0, sbuf *out, size_t *lead0_out);

/* ---- the tokenizer cache file (tok_cachefile.c; format in schemas/tokenizer_cache.md) ---- */

enum {
    DFM_TOKC_META, DFM_TOKC_FLAGS, DFM_TOKC_KEY_OFF, DFM_TOKC_KEY_LEN, DFM_TOKC_STR_OFF, DFM_TOKC_STR_LEN,
    DFM_TOKC_STRINGS, DFM_TOKC_VOCAB, DFM_TOKC_PAIRS, DFM_TOKC_SCORES, DFM_TOKC_TRIE_FIRST, DFM_TOKC_TRIE_LABEL,
    DFM_TOKC_TRIE_PIECE, DFM_TOKC_NSEC
};

/* A cache file whose header, checksums and section bounds have been checked. */
typedef struct {
    const uint8_t *sec[DFM_TOKC_NSEC];
    size_t sec_bytes[DFM_TOKC_NSEC];
    uint32_t n_ids, n_pairs; /* BPE: merges; Unigram: trie nodes */
    int64_t unk_id;
    double min_score;
} dfm_tokfile;

/* The cache file for a tokenizer.json whose XXH3-64 is src_hash: $DFM_TOKENIZER_CACHE/<hash>.v<version>.dfmtok,
 * else under $XDG_CACHE_HOME/dfm/tokenizer-cache or ~/.cache/dfm/tokenizer-cache. *out is malloc'd, or
 * NULL when caching is off (DFM_TOKENIZER_CACHE set to "", "0" or "off"; or no HOME). */
int dfm_tokfile_path(uint64_t src_hash, char **out);
/* Write tok's tables and the tokenizer.json without its model vocabulary and merges (meta, JSON text) to
 * path (folder made; temporary + rename, so concurrent writers are safe). */
int dfm_tokfile_write(const dfm_tokenizer *tok, const char *meta, size_t meta_len, uint64_t src_bytes,
                      const char *path);
/* Check the n bytes at p: magic, version, header checksum, source hash and size, file size, payload
 * checksum, section bounds and the sizes of the per-id tables. DFM_EMISMATCH when it was made from
 * another tokenizer.json (stale); DFM_ETRUNCATED, DFM_ECHECKSUM, DFM_EVERSION or DFM_EFORMAT otherwise. */
int dfm_tokfile_check(const uint8_t *p, size_t n, uint64_t src_hash, uint64_t src_bytes, dfm_tokfile *f);
/* Point tok's id tables, vocabulary map, pair map and scores into a checked file, validating every string
 * bound, id, table and score (a crafted file can make wrong ids, never an out-of-range id, a read outside
 * the mapping or an endless probe). Allocates the per-id pointer arrays and is_special. tok->model must be
 * set (from the meta). DFM_EFORMAT on a bad entry. */
int dfm_tokfile_fill(dfm_tokenizer *tok, const dfm_tokfile *f);
/* Load a tokenizer from the cache file at cache_path made for a tokenizer.json of src_bytes bytes
 * hashing to src_hash (tokenizer.c; the fuzz harness calls it directly). */
int dfm_tokenizer_load_cachefile(const char *cache_path, uint64_t src_hash, uint64_t src_bytes, dfm_tokenizer **out);

#endif
