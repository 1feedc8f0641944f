/* tok_cachefile.c — the parsed tokenizer as a binary file that loads by mmap (schemas/tokenizer_cache.md).
 *
 * Parsing Qwen2.5's 11 MB tokenizer.json costs each process about half a second of CPU; the tables it
 * yields (id -> bytes, the vocabulary map, the merge map or Unigram trie, the scores) are plain arrays, so
 * they are written once to a file named by the tokenizer.json's XXH3-64 and mapped read-only afterwards.
 * The file is untrusted: the header, every section bound, every string, every id and node in a table,
 * every score and the free slots the probing loops stop on are checked before a pointer into it is handed
 * out; a payload checksum catches bit rot and torn files.
 */
#include "tokenizer/tok_internal.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOKC_MAGIC "DFMTOKC"
#define TOKC_VERSION 2u
#define TOKC_HEADER 512u
#define TOKC_STR_MAX (1u << 20) /* one token's bytes: real ones are < 300 */
_Static_assert(64 + 16 * DFM_TOKC_NSEC <= 496, "the section table must end before the checksums");

enum { FL_KEY = 1, FL_STR = 2, FL_STR_IS_KEY = 4 };

/* Header field offsets (little-endian; see schemas/tokenizer_cache.md). */
enum {
    H_MAGIC = 0, H_VERSION = 8, H_NSEC = 12, H_SRC_HASH = 16, H_SRC_BYTES = 24, H_FILE_BYTES = 32, H_N_IDS = 40,
    H_N_PAIRS = 44, H_UNK = 48, H_MIN_SCORE = 56, H_SECTIONS = 64, H_PAYLOAD_SUM = 496, H_HEADER_SUM = 504
};

static uint64_t rd64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t rd32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void wr64(void *p, uint64_t v) { memcpy(p, &v, 8); }
static void wr32(void *p, uint32_t v) { memcpy(p, &v, 4); }

/* ================================================================ where */

int dfm_tokfile_path(uint64_t src_hash, char **out) {
    *out = NULL;
    const char *env = getenv("DFM_TOKENIZER_CACHE");
    char *dir;
    if (env) {
        if (!*env || !strcmp(env, "off") || !strcmp(env, "0")) return DFM_OK;
        dir = strdup(env);
    } else if (getenv("XDG_CACHE_HOME") && getenv("XDG_CACHE_HOME")[0]) {
        dir = dfm_path_join(getenv("XDG_CACHE_HOME"), "dfm/tokenizer-cache");
    } else if (getenv("HOME") && getenv("HOME")[0]) {
        dir = dfm_path_join(getenv("HOME"), ".cache/dfm/tokenizer-cache");
    } else {
        return DFM_OK; /* nowhere to keep it: parse every time */
    }
    if (!dir) return DFM_FAIL(DFM_ENOMEM, "no memory");
    /* the version in the name: dfm builds of different formats sharing a folder keep their own files */
    *out = dfm_strdupf("%s/%016llx.v%u.dfmtok", dir, (unsigned long long)src_hash, TOKC_VERSION);
    free(dir);
    return *out ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
}

/* ================================================================ write */

/* Start a section at the next 8-byte boundary; records its offset in the header table. */
static int sb_section(sbuf *b, int sec) {
    static const uint8_t zero[8] = {0};
    DFM_TRY(dfm_sbuf_add(b, zero, (8 - b->n % 8) % 8));
    wr64(b->p + H_SECTIONS + 16 * sec, b->n);
    return DFM_OK;
}

static void sb_section_end(sbuf *b, int sec) {
    wr64(b->p + H_SECTIONS + 16 * sec + 8, b->n - rd64(b->p + H_SECTIONS + 16 * sec));
}

static int build_image(const dfm_tokenizer *tok, const char *meta, size_t meta_len, uint64_t src_bytes, sbuf *b) {
    DFM_TRY(dfm_sbuf_reserve(b, TOKC_HEADER));
    memset(b->p, 0, TOKC_HEADER);
    b->n = TOKC_HEADER;
    memcpy(b->p + H_MAGIC, TOKC_MAGIC, 8);
    wr32(b->p + H_VERSION, TOKC_VERSION);
    wr32(b->p + H_NSEC, DFM_TOKC_NSEC);
    wr64(b->p + H_SRC_HASH, tok->hash);
    wr64(b->p + H_SRC_BYTES, src_bytes);
    wr32(b->p + H_N_IDS, tok->n_ids);
    wr32(b->p + H_N_PAIRS, tok->model == DFM_MODEL_UNIGRAM ? tok->n_trie_nodes : tok->n_merges);
    wr64(b->p + H_UNK, (uint64_t)tok->unk_id);
    double ms = tok->model == DFM_MODEL_UNIGRAM ? tok->min_score : 0;
    memcpy(b->p + H_MIN_SCORE, &ms, 8);

    DFM_TRY(sb_section(b, DFM_TOKC_META));
    DFM_TRY(dfm_sbuf_add(b, meta, meta_len));
    sb_section_end(b, DFM_TOKC_META);

    /* strings first (into a side buffer), so the per-id tables can be written in one pass each */
    uint32_t n = tok->n_ids;
    uint8_t *flags = calloc(n ? n : 1, 1);
    uint64_t *key_off = calloc(n ? n : 1, 8), *str_off = calloc(n ? n : 1, 8);
    uint32_t *key_len = calloc(n ? n : 1, 4), *str_len = calloc(n ? n : 1, 4);
    sbuf str = {0};
    int rc = flags && key_off && str_off && key_len && str_len ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    for (uint32_t i = 0; i < n && !rc; i++) {
        if (tok->key[i]) {
            flags[i] |= FL_KEY;
            key_off[i] = str.n, key_len[i] = tok->key_len[i];
            rc = dfm_sbuf_add(&str, tok->key[i], tok->key_len[i]);
            if (!rc) rc = dfm_sbuf_add(&str, "", 1);
        }
        if (!rc && tok->str[i] && tok->str[i] == tok->key[i]) {
            flags[i] |= FL_STR | FL_STR_IS_KEY;
            str_off[i] = key_off[i], str_len[i] = key_len[i];
        } else if (!rc && tok->str[i]) {
            flags[i] |= FL_STR;
            str_off[i] = str.n, str_len[i] = tok->str_len[i];
            rc = dfm_sbuf_add(&str, tok->str[i], tok->str_len[i]);
            if (!rc) rc = dfm_sbuf_add(&str, "", 1);
        }
    }
    const struct {
        int sec;
        const void *p;
        size_t n;
    } parts[] = {
        {DFM_TOKC_FLAGS, flags, n},
        {DFM_TOKC_KEY_OFF, key_off, (size_t)n * 8},
        {DFM_TOKC_KEY_LEN, key_len, (size_t)n * 4},
        {DFM_TOKC_STR_OFF, str_off, (size_t)n * 8},
        {DFM_TOKC_STR_LEN, str_len, (size_t)n * 4},
        {DFM_TOKC_STRINGS, str.p, str.n},
        {DFM_TOKC_VOCAB, tok->vocab.slots, (tok->vocab.mask + 1) * 8},
        {DFM_TOKC_PAIRS, tok->pairs.kv, (tok->pairs.mask + 1) * 16},
        {DFM_TOKC_SCORES, tok->scores, tok->model == DFM_MODEL_UNIGRAM ? (size_t)n * 8 : 0},
        {DFM_TOKC_TRIE_FIRST, tok->trie_first, tok->trie_first ? ((size_t)tok->n_trie_nodes + 1) * 4 : 0},
        {DFM_TOKC_TRIE_LABEL, tok->trie_label, tok->trie_label ? (size_t)tok->n_trie_nodes - 1 : 0},
        {DFM_TOKC_TRIE_PIECE, tok->trie_piece, tok->trie_piece ? (size_t)tok->n_trie_nodes * 4 : 0},
    };
    for (size_t k = 0; k < sizeof parts / sizeof parts[0] && !rc; k++) {
        rc = sb_section(b, parts[k].sec);
        if (!rc) rc = dfm_sbuf_add(b, parts[k].p, parts[k].n);
        if (!rc) sb_section_end(b, parts[k].sec);
    }
    free(flags), free(key_off), free(str_off), free(key_len), free(str_len), free(str.p);
    if (rc) return rc;
    wr64(b->p + H_FILE_BYTES, b->n);
    wr64(b->p + H_PAYLOAD_SUM, dfm_checksum64(b->p + TOKC_HEADER, b->n - TOKC_HEADER));
    wr64(b->p + H_HEADER_SUM, dfm_checksum64(b->p, H_HEADER_SUM));
    return DFM_OK;
}

int dfm_tokfile_write(const dfm_tokenizer *tok, const char *meta, size_t meta_len, uint64_t src_bytes,
                      const char *path) {
    if (!tok->vocab.slots || !tok->pairs.kv)
        return DFM_FAIL(DFM_EINTERNAL, "tokenizer cache: the tokenizer has no vocabulary or pair map to write");
    const char *slash = strrchr(path, '/');
    if (slash) {
        char *dir = strndup(path, (size_t)(slash - path));
        if (!dir) return DFM_FAIL(DFM_ENOMEM, "no memory");
        int rc = dfm_mkdir_p(dir);
        free(dir);
        DFM_TRY(rc);
    }
    sbuf b = {0};
    int rc = build_image(tok, meta, meta_len, src_bytes, &b);
    /* temporary + rename (fsutil): ranks that build it at the same moment each rename a whole file */
    if (!rc) rc = dfm_write_file_atomic(path, b.p, b.n);
    free(b.p);
    return rc;
}

/* ================================================================ read */

#define BAD(...) DFM_FAIL(DFM_EFORMAT, __VA_ARGS__)

int dfm_tokfile_check(const uint8_t *p, size_t n, uint64_t src_hash, uint64_t src_bytes, dfm_tokfile *f) {
    memset(f, 0, sizeof *f);
    if (n < TOKC_HEADER) return DFM_FAIL(DFM_ETRUNCATED, "%zu bytes is shorter than the %u-byte header", n, TOKC_HEADER);
    if (memcmp(p + H_MAGIC, TOKC_MAGIC, 8)) return BAD("not a dfm tokenizer cache (bad magic)");
    if (rd32(p + H_VERSION) != TOKC_VERSION)
        return DFM_FAIL(DFM_EVERSION, "format version %u, this dfm reads %u", rd32(p + H_VERSION), TOKC_VERSION);
    if (dfm_checksum64(p, H_HEADER_SUM) != rd64(p + H_HEADER_SUM)) return DFM_FAIL(DFM_ECHECKSUM, "header checksum mismatch");
    if (rd32(p + H_NSEC) != DFM_TOKC_NSEC) return BAD("%u sections, expected %u", rd32(p + H_NSEC), DFM_TOKC_NSEC);
    if (rd64(p + H_SRC_HASH) != src_hash || rd64(p + H_SRC_BYTES) != src_bytes)
        return DFM_FAIL(DFM_EMISMATCH, "made from another tokenizer.json (stale)");
    if (rd64(p + H_FILE_BYTES) != n)
        return DFM_FAIL(DFM_ETRUNCATED, "%zu bytes, the header says %llu", n, (unsigned long long)rd64(p + H_FILE_BYTES));
    if (dfm_checksum64(p + TOKC_HEADER, n - TOKC_HEADER) != rd64(p + H_PAYLOAD_SUM))
        return DFM_FAIL(DFM_ECHECKSUM, "payload checksum mismatch");
    for (int s = 0; s < DFM_TOKC_NSEC; s++) {
        uint64_t off = rd64(p + H_SECTIONS + 16 * s), len = rd64(p + H_SECTIONS + 16 * s + 8);
        if (off < TOKC_HEADER || off % 8 || off > n || len > n - off)
            return BAD("section %d [%llu, +%llu) is outside the %zu-byte file or misaligned", s, (unsigned long long)off,
                       (unsigned long long)len, n);
        f->sec[s] = p + off;
        f->sec_bytes[s] = (size_t)len;
    }
    f->n_ids = rd32(p + H_N_IDS);
    f->n_pairs = rd32(p + H_N_PAIRS);
    f->unk_id = (int64_t)rd64(p + H_UNK);
    memcpy(&f->min_score, p + H_MIN_SCORE, 8);
    uint64_t ni = f->n_ids;
    if (f->sec_bytes[DFM_TOKC_FLAGS] != ni || f->sec_bytes[DFM_TOKC_KEY_OFF] != ni * 8 ||
        f->sec_bytes[DFM_TOKC_STR_OFF] != ni * 8 || f->sec_bytes[DFM_TOKC_KEY_LEN] != ni * 4 ||
        f->sec_bytes[DFM_TOKC_STR_LEN] != ni * 4)
        return BAD("per-id tables do not hold %u entries each", f->n_ids);
    if (f->unk_id < -1 || f->unk_id >= (int64_t)ni) return BAD("unknown-token id %lld out of range", (long long)f->unk_id);
    return DFM_OK;
}

/* One string of the strings section: inside it, NUL-terminated, of a sane length. */
static int str_at(const dfm_tokfile *f, uint64_t off, uint32_t len, uint32_t id, const char **out) {
    size_t sb = f->sec_bytes[DFM_TOKC_STRINGS];
    if (len > TOKC_STR_MAX || off >= sb || len >= sb - off || f->sec[DFM_TOKC_STRINGS][off + len])
        return BAD("the string of id %u ([%llu, +%u)) is outside the strings section or not terminated", id,
                   (unsigned long long)off, len);
    *out = (const char *)f->sec[DFM_TOKC_STRINGS] + off;
    return DFM_OK;
}

/* A hash table section: a power of two of 8-byte slots, at least 16. */
static int table_mask(const dfm_tokfile *f, int sec, const char *what, size_t *mask) {
    size_t slots = f->sec_bytes[sec] / 8;
    if (slots < 16 || f->sec_bytes[sec] % 8 || (slots & (slots - 1))) return BAD("%s table of %zu bytes", what, f->sec_bytes[sec]);
    *mask = slots - 1;
    return DFM_OK;
}

/* The pair map: BPE merges name ids below n_ids; Unigram trie edges name nodes below the node count and
 * pieces below n_ids; a free slot ends every probe. */
static int fill_pairs(dfm_tokenizer *tok, const dfm_tokfile *f) {
    size_t slots = f->sec_bytes[DFM_TOKC_PAIRS] / 16, mask = slots - 1;
    if (slots < 16 || f->sec_bytes[DFM_TOKC_PAIRS] % 16 || (slots & (slots - 1)))
        return BAD("pair table of %zu bytes", f->sec_bytes[DFM_TOKC_PAIRS]);
    const uint64_t *kv = (const uint64_t *)(const void *)f->sec[DFM_TOKC_PAIRS];
    int uni = tok->model == DFM_MODEL_UNIGRAM;
    size_t used = 0;
    for (size_t k = 0; k <= mask; k++) {
        uint64_t key = kv[2 * k], val = kv[2 * k + 1];
        if (key == UINT64_MAX) continue;
        used++;
        if ((uint32_t)val >= f->n_ids) return BAD("merge slot %zu makes id %u, outside the %u ids", k, (uint32_t)val, f->n_ids);
        (void)key;
    }
    if (used > mask) return BAD("pair table has no free slot");
    if (tok->model != DFM_MODEL_BPE && used) return BAD("a model without merges has %zu", used);
    tok->pairs.kv = (uint64_t *)kv;
    tok->pairs.mask = mask;
    tok->pairs.n = used;
    if (!uni) tok->n_merges = f->n_pairs;
    return DFM_OK;
}

/* The Unigram trie: node v's edges [first[v], first[v + 1]) within the labels, first[nodes] = nodes - 1 edges,
 * labels increasing within a node, every edge leading further (edge e makes node e + 1 > v, so a walk ends),
 * pieces -1 or below n_ids. */
static int fill_trie(dfm_tokenizer *tok, const dfm_tokfile *f) {
    uint32_t nodes = f->n_pairs;
    if (!nodes || f->sec_bytes[DFM_TOKC_TRIE_FIRST] != ((size_t)nodes + 1) * 4 ||
        f->sec_bytes[DFM_TOKC_TRIE_LABEL] != (size_t)nodes - 1 || f->sec_bytes[DFM_TOKC_TRIE_PIECE] != (size_t)nodes * 4)
        return BAD("a Unigram trie of %u nodes in sections of %zu, %zu and %zu bytes", nodes,
                   f->sec_bytes[DFM_TOKC_TRIE_FIRST], f->sec_bytes[DFM_TOKC_TRIE_LABEL], f->sec_bytes[DFM_TOKC_TRIE_PIECE]);
    const uint32_t *first = (const uint32_t *)(const void *)f->sec[DFM_TOKC_TRIE_FIRST];
    const uint8_t *label = f->sec[DFM_TOKC_TRIE_LABEL];
    const int32_t *piece = (const int32_t *)(const void *)f->sec[DFM_TOKC_TRIE_PIECE];
    if (first[0] != 0 || first[nodes] != nodes - 1) return BAD("the trie's edge index does not span its %u edges", nodes - 1);
    for (uint32_t v = 0; v < nodes; v++) {
        if (first[v + 1] < first[v] || (first[v + 1] > first[v] && first[v] < v))
            return BAD("trie node %u: edges [%u, %u) out of order", v, first[v], first[v + 1]);
        for (uint32_t e = first[v] + 1; e < first[v + 1]; e++)
            if (label[e] <= label[e - 1]) return BAD("trie node %u: edge labels not increasing", v);
        if (piece[v] < -1 || (piece[v] >= 0 && (uint32_t)piece[v] >= f->n_ids))
            return BAD("trie node %u ends piece %d, outside the %u ids", v, piece[v], f->n_ids);
    }
    tok->n_trie_nodes = nodes;
    tok->trie_first = (uint32_t *)first;
    tok->trie_label = (uint8_t *)label;
    tok->trie_piece = (int32_t *)piece;
    return DFM_OK;
}

int dfm_tokfile_fill(dfm_tokenizer *tok, const dfm_tokfile *f) {
    uint32_t n = f->n_ids;
    const uint8_t *fl = f->sec[DFM_TOKC_FLAGS];
    const uint8_t *ko = f->sec[DFM_TOKC_KEY_OFF], *kl = f->sec[DFM_TOKC_KEY_LEN];
    const uint8_t *so = f->sec[DFM_TOKC_STR_OFF], *sl = f->sec[DFM_TOKC_STR_LEN];
    tok->n_ids = n;
    tok->key = calloc(n ? n : 1, sizeof *tok->key);
    tok->str = calloc(n ? n : 1, sizeof *tok->str);
    tok->key_len = calloc(n ? n : 1, sizeof *tok->key_len);
    tok->str_len = calloc(n ? n : 1, sizeof *tok->str_len);
    tok->is_special = calloc(n ? n : 1, 1);
    if (!tok->key || !tok->str || !tok->key_len || !tok->str_len || !tok->is_special)
        return DFM_FAIL(DFM_ENOMEM, "no memory for %u token ids", n);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t g = fl[i];
        if (g & ~(FL_KEY | FL_STR | FL_STR_IS_KEY) || ((g & FL_STR_IS_KEY) && (g & (FL_KEY | FL_STR)) != (FL_KEY | FL_STR)))
            return BAD("id %u has flags 0x%02x", i, g);
        if (g & FL_KEY) {
            tok->key_len[i] = rd32(kl + 4 * (size_t)i);
            DFM_TRY(str_at(f, rd64(ko + 8 * (size_t)i), tok->key_len[i], i, (const char **)&tok->key[i]));
        }
        if (g & FL_STR_IS_KEY) {
            tok->str[i] = tok->key[i];
            tok->str_len[i] = tok->key_len[i];
        } else if (g & FL_STR) {
            tok->str_len[i] = rd32(sl + 4 * (size_t)i);
            DFM_TRY(str_at(f, rd64(so + 8 * (size_t)i), tok->str_len[i], i, (const char **)&tok->str[i]));
        }
    }
    tok->unk_id = f->unk_id;

    /* vocabulary map: each used slot names a present key; a free slot ends every probe */
    size_t mask = 0, free_slots = 0;
    DFM_TRY(table_mask(f, DFM_TOKC_VOCAB, "vocabulary", &mask));
    const uint64_t *vs = (const uint64_t *)(const void *)f->sec[DFM_TOKC_VOCAB];
    for (size_t k = 0; k <= mask; k++) {
        uint64_t s = vs[k];
        if (!s) { free_slots++; continue; }
        uint32_t j = (uint32_t)s - 1;
        if (j >= n || !tok->key[j]) return BAD("vocabulary slot %zu names id %u, which has no token", k, j);
    }
    if (!free_slots) return BAD("vocabulary table has no free slot");
    tok->vocab.slots = (uint64_t *)vs;
    tok->vocab.mask = mask;
    tok->vocab.keys = (const char *const *)tok->key;
    tok->vocab.lens = tok->key_len;

    DFM_TRY(fill_pairs(tok, f));

    /* Unigram scores: one finite double per id */
    if (tok->model == DFM_MODEL_UNIGRAM) {
        if (f->sec_bytes[DFM_TOKC_SCORES] != (size_t)n * 8) return BAD("%zu bytes of scores for %u ids", f->sec_bytes[DFM_TOKC_SCORES], n);
        const double *sc = (const double *)(const void *)f->sec[DFM_TOKC_SCORES];
        for (uint32_t i = 0; i < n; i++)
            if (!isfinite(sc[i])) return BAD("the score of id %u is not finite", i);
        if (!isfinite(f->min_score)) return BAD("the lowest score is not finite");
        tok->scores = (double *)sc;
        tok->min_score = f->min_score;
        DFM_TRY(fill_trie(tok, f));
    } else if (f->sec_bytes[DFM_TOKC_SCORES] || f->sec_bytes[DFM_TOKC_TRIE_FIRST] || f->sec_bytes[DFM_TOKC_TRIE_LABEL] ||
               f->sec_bytes[DFM_TOKC_TRIE_PIECE]) {
        return BAD("scores or a trie in a tokenizer whose model has none");
    }
    return DFM_OK;
}
