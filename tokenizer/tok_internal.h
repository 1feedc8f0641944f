/* tok_internal.h — private structures of the tokenizer (tokenizer.c, tok_bpe.c, tok_utf8.c).
 *
 * Vocabulary keys are the RAW bytes a token stands for: for byte-level BPE the token string of
 * tokenizer.json ("Ġworld") is mapped back through the GPT-2 byte alphabet (" world"), so the BPE
 * model, the pre-token cache and decode all work on plain bytes and never build the byte-level
 * unicode string. For other models the key is the token string itself.
 */
#ifndef DFM_TOK_INTERNAL_H
#define DFM_TOK_INTERNAL_H

#include "tokenizer/tokenizer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ---- growable byte buffer (tokenizer.c, tok_cachefile.c); zero-initialise, free(b.p) ---- */

typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

/* Room for need bytes in all (tokenizer.c). */
int dfm_sbuf_reserve(sbuf *b, size_t need);
/* Append n bytes and keep the content NUL-terminated (the NUL is not counted in n). */
int dfm_sbuf_add(sbuf *b, const void *s, size_t n);

/* ---- UTF-8 (tok_utf8.c) ---- */

/* Length of the valid UTF-8 prefix of s[0..n) (== n when valid). */
size_t dfm_utf8_valid_prefix(const uint8_t *s, size_t n);
/* Replace each maximal invalid subpart by U+FFFD (Python's decode("utf-8", "replace")). *out is
 * malloc'd; *n_rep receives the number of replacements. */
int dfm_utf8_replace(const uint8_t *s, size_t n, char **out, size_t *out_len, size_t *n_rep);
/* Decode one code point of valid UTF-8 at s (n > 0 bytes left); returns its byte length. */
int dfm_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);
/* Encode cp into out (4 bytes room); returns the byte count. */
int dfm_utf8_put(uint32_t cp, uint8_t *out);
/* GPT-2 byte alphabet: byte -> code point, and code point -> byte (-1 when not in the alphabet). */
uint32_t dfm_bytelevel_cp(uint8_t b);
int dfm_bytelevel_byte(uint32_t cp);

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

/* ---- merge ranks: (left id, right id) -> (rank, merged id) ---- */

typedef struct {
    uint64_t *keys; /* left << 32 | right; UINT64_MAX = empty */
    uint64_t *vals; /* rank << 32 | merged id */
    size_t mask, n;
} dfm_mergemap;

/* ---- pre-token cache: piece bytes -> ids ----
 * Read-mostly and lock-free for readers: each shard is a seqlock (Boehm, "Can seqlocks get along with
 * programming language memory models?", 2012). Readers take no lock and write nothing shared: they
 * read the sequence number, probe with relaxed atomic loads, and keep the result only if the sequence
 * number is unchanged and even. Writers (a miss being filled) serialise on the shard's mutex. A full
 * shard is cleared and refilled (the working set of a corpus is mostly a few thousand words). */
#define DFM_TOK_CACHE_SHARDS 64
#define DFM_TOK_CACHE_MAX_KEY 48  /* longer pieces are not cached */
#define DFM_TOK_CACHE_MAX_IDS 24
typedef struct {
    pthread_mutex_t mu;     /* writers only */
    _Atomic unsigned seq;   /* odd while a writer changes the shard */
    _Atomic uint64_t *slots; /* hash fragment << 32 | (entry word offset + 1); 0 = empty */
    _Atomic uint32_t *arena; /* entries: [key len | n ids << 16] [key, zero-padded words] [ids] */
    size_t used, n;          /* words used, entries; writers only */
} dfm_tok_cache_shard;

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

enum { DFM_PRE_SPLIT = 1, DFM_PRE_BYTELEVEL = 2, DFM_PRE_METASPACE = 3 };

typedef struct {
    int kind;
    pcre2_code *re;      /* SPLIT, or BYTELEVEL with use_regex */
    int add_prefix_space; /* BYTELEVEL; METASPACE: prepend_scheme != never */
    int prepend_first_only; /* METASPACE prepend_scheme "first" */
    const char *label;   /* the tokenizer.json type when it is not the kind's own name ("Digits": a SPLIT) */
} dfm_pre_stage;

enum { DFM_NORM_NFC = 1, DFM_NORM_PREPEND = 2, DFM_NORM_REPLACE = 3 };

typedef struct {
    int kind;
    char *a, *b; /* PREPEND: a = prefix; REPLACE: a -> b (plain strings) */
    size_t alen, blen;
} dfm_norm_stage;

struct dfm_tokenizer {
    uint64_t hash;
    char describe[160];
    int byte_level;   /* vocab keys are raw bytes (ByteLevel pre-tokenizer) */
    int byte_fallback, fuse_unk, ignore_merges, decoder_kind;
    int dec_byte_fallback, dec_strip; /* SentencePiece decoder sequence: ByteFallback, Strip(" ", 1, 0) present */
    int64_t unk_id;

    /* id -> raw key (encode side) and id -> decoded bytes */
    uint32_t n_ids;
    char **key;       /* NULL for holes */
    uint32_t *key_len;
    char **dec;       /* bytes decode emits for this id */
    uint32_t *dec_len;
    uint8_t *is_special; /* per id */
    dfm_strmap vocab; /* raw key -> id (model vocabulary) */
    dfm_mergemap merges;
    uint32_t n_merges;
    int32_t byte_id[256]; /* byte-level: id of each single byte; SP byte fallback: id of <0xNN> */

    dfm_added_token *added;
    size_t n_added;
    dfm_added_matcher raw_matcher, norm_matcher;

    dfm_norm_stage *norm;
    size_t n_norm;
    dfm_pre_stage *pre;
    size_t n_pre;

    dfm_tok_cache_shard cache[DFM_TOK_CACHE_SHARDS];

    /* Loaded from a cache file (tok_cachefile.c): the id strings, the vocabulary slots and the merge
     * map point into this read-only mapping and are not freed one by one; NULL when parsed from JSON. */
    const uint8_t *map;
    size_t map_bytes;
};

/* ---- BPE (tok_bpe.c) ---- */

int dfm_mergemap_init(dfm_mergemap *m, size_t n);
void dfm_mergemap_put(dfm_mergemap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id);
void dfm_mergemap_free(dfm_mergemap *m);

/* Per-call scratch of the merge loop. */
typedef struct {
    struct dfm_bpe_sym *sym;
    size_t sym_cap;
    uint64_t *heap;
    size_t heap_cap;
} dfm_bpe_work;

void dfm_bpe_work_free(dfm_bpe_work *w);
/* BPE-encode one pre-token (raw bytes) and append its ids (cache consulted and filled). */
int dfm_bpe_word(const dfm_tokenizer *tok, dfm_bpe_work *w, const uint8_t *s, size_t n, dfm_ids *out);

int dfm_tok_cache_init(dfm_tokenizer *tok);
void dfm_tok_cache_free(dfm_tokenizer *tok);

/* ---- the tokenizer cache file (tok_cachefile.c; format in schemas/tokenizer_cache.md) ---- */

enum {
    DFM_TOKC_META, DFM_TOKC_BYTE_ID, DFM_TOKC_FLAGS, DFM_TOKC_KEY_OFF, DFM_TOKC_KEY_LEN, DFM_TOKC_DEC_OFF,
    DFM_TOKC_DEC_LEN, DFM_TOKC_STRINGS, DFM_TOKC_VOCAB, DFM_TOKC_MERGE_KEYS, DFM_TOKC_MERGE_VALS, DFM_TOKC_NSEC
};

/* A cache file whose header, checksums and section bounds have been checked. */
typedef struct {
    const uint8_t *sec[DFM_TOKC_NSEC];
    size_t sec_bytes[DFM_TOKC_NSEC];
    uint32_t n_ids, n_merges;
    int64_t unk_id;
} dfm_tokfile;

/* The cache file for a tokenizer.json whose XXH3-64 is src_hash: $DFM_TOKENIZER_CACHE/<hash>.dfmtok,
 * else under $XDG_CACHE_HOME/dfm/tokenizer-cache or ~/.cache/dfm/tokenizer-cache. *out is malloc'd, or
 * NULL when caching is off (DFM_TOKENIZER_CACHE set to "", "0" or "off"; or no HOME). */
int dfm_tokfile_path(uint64_t src_hash, char **out);
/* Write tok's tables and the tokenizer.json without model.vocab/merges (meta, JSON text) to path
 * (folder made; temporary + rename, so concurrent writers are safe). */
int dfm_tokfile_write(const dfm_tokenizer *tok, const char *meta, size_t meta_len, uint64_t src_bytes,
                      const char *path);
/* Check the n bytes at p: magic, version, header checksum, source hash and size, file size, payload
 * checksum, section bounds and the sizes of the per-id tables. DFM_EMISMATCH when it was made from
 * another tokenizer.json (stale); DFM_ETRUNCATED, DFM_ECHECKSUM, DFM_EVERSION or DFM_EFORMAT otherwise. */
int dfm_tokfile_check(const uint8_t *p, size_t n, uint64_t src_hash, uint64_t src_bytes, dfm_tokfile *f);
/* Point tok's id tables, vocabulary map and merge map into a checked file, validating every string
 * bound, id and table (a crafted file can make wrong ids, never an out-of-range id or an endless
 * probe). Allocates the per-id pointer arrays and is_special. DFM_EFORMAT on a bad entry. */
int dfm_tokfile_fill(dfm_tokenizer *tok, const dfm_tokfile *f);
/* Load a tokenizer from the cache file at cache_path made for a tokenizer.json of src_bytes bytes
 * hashing to src_hash (tokenizer.c; the fuzz harness calls it directly). */
int dfm_tokenizer_load_cachefile(const char *cache_path, uint64_t src_hash, uint64_t src_bytes, dfm_tokenizer **out);

#endif
