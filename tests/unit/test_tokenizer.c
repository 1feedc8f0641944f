/* Unit tests of the tokenizer: every golden case of the real Qwen2.5, Llama-3.2 and SmolLM2 tokenizer.json
 * (made with HF `tokenizers` by tests/ref/make_tokenizer_golden.py) must give the same ids, decode,
 * decode with skip_special and single-token decodes; round trips; concurrent encodes; error paths.
 * Each golden set is checked twice: parsed from its JSON, then mapped from the cache file that load
 * wrote (DFM_TOKENIZER_CACHE points into this test's scratch folder).
 *
 * The tokenizers come from $DFM_CACHE/tokenizers/ and models/ (make deps, make lm); a missing one is a FAILURE.
 * Golden files: $DFM_ROOT/tests/data/tokenizer/ (DFM_ROOT defaults to the current folder). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <zstd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char tmpdir[256];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *cache_path(const char *rel) {
    const char *cache = getenv("DFM_CACHE");
    char home[512];
    if (!cache || !*cache) {
        if (getuid() == 0) cache = "/var/cache/dfm";
        else {
            snprintf(home, sizeof home, "%s/.cache/dfm", getenv("HOME") ? getenv("HOME") : ".");
            cache = home;
        }
    }
    return dfm_path_join(cache, rel);
}

static char *golden_path(const char *name) {
    const char *root = getenv("DFM_ROOT");
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/tokenizer/%s.golden.jsonl", name);
    return dfm_path_join(root && *root ? root : ".", rel);
}

/* ---------------------------------------------------------------- base64 */

static int b64val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static char *b64decode(const char *s, size_t *len) {
    size_t n = strlen(s);
    char *o = malloc(n / 4 * 3 + 4);
    size_t j = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64val((unsigned char)s[i]);
        if (v < 0) continue;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[j++] = (char)(acc >> bits);
        }
    }
    o[j] = 0;
    *len = j;
    return o;
}

/* ---------------------------------------------------------------- golden comparison */

typedef struct {
    const char *name;
    const char *rel;
    dfm_tokenizer *tok;    /* parsed from the JSON */
    dfm_tokenizer *cached; /* the same, mapped from the cache file the first load wrote */
    json_t **cases;
    size_t n_cases;
} golden_set;

static golden_set sets[] = {
    {"qwen2.5", "tokenizers/qwen2.5/tokenizer.json", NULL, NULL, NULL, 0},
    {"llama-3.2", "tokenizers/llama-3.2/tokenizer.json", NULL, NULL, NULL, 0},
    /* constructed SentencePiece-style BPE files (no real one is installable), golden made by HF */
    {"spm-llama2", "@spm-llama2.tokenizer.json", NULL, NULL, NULL, 0},
    {"spm-metaspace", "@spm-metaspace.tokenizer.json", NULL, NULL, NULL, 0},
    /* real files patched as the golden header says (GPT-2 layout; ignore_merges = true) */
    {"qwen2.5-gpt2", "%", NULL, NULL, NULL, 0},
    {"llama-3.2-ignore-merges", "%", NULL, NULL, NULL, 0},
    {"qwen2.5-added-flags", "%", NULL, NULL, NULL, 0},
    {"spm-llama2-unk", "%", NULL, NULL, NULL, 0},
    /* SmolLM2-135M's, built by dfm-train import-gguf from its GGUF (make lm): Digits(individual) + ByteLevel;
     * and patched to contiguous digits */
    {"smollm2", "models/smollm2-135m/tokenizer.json", NULL, NULL, NULL, 0},
    {"smollm2-digits-contiguous", "%", NULL, NULL, NULL, 0},
};

static char *data_path(const char *rel) {
    const char *root = getenv("DFM_ROOT");
    char p[512];
    snprintf(p, sizeof p, "tests/data/tokenizer/%s", rel);
    return dfm_path_join(root && *root ? root : ".", p);
}

/* A patch value {"$ref": "FILE#/json/pointer"} stands for that part of tests/data/tokenizer/FILE. */
static json_t *resolve_refs(json_t *v) {
    json_t *ref = json_object_get(v, "$ref");
    if (json_is_object(v) && json_object_size(v) == 1 && json_is_string(ref)) {
        char *file = strdup(json_string_value(ref)), *hash = strchr(file, '#');
        assert_non_null(hash);
        *hash = 0;
        char *path = data_path(file);
        json_error_t je;
        json_t *doc = json_load_file(path, 0, &je);
        if (!doc) print_error("%s: %s\n", path, je.text);
        assert_non_null(doc);
        json_t *node = doc;
        for (char *save = NULL, *k = strtok_r(hash + 1, "/", &save); k; k = strtok_r(NULL, "/", &save))
            node = json_is_array(node) ? json_array_get(node, (size_t)atoi(k)) : json_object_get(node, k);
        assert_non_null(node);
        json_incref(node);
        json_decref(doc);
        free(path), free(file);
        return node;
    }
    if (json_is_object(v)) {
        json_t *o = json_object();
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) json_object_set_new(o, k, resolve_refs(x));
        return o;
    }
    if (json_is_array(v)) {
        json_t *a = json_array();
        for (size_t i = 0; i < json_array_size(v); i++) json_array_append_new(a, resolve_refs(json_array_get(v, i)));
        return a;
    }
    return json_incref(v);
}

/* Write the base tokenizer.json with the golden header's patch applied; returns the new path. */
static char *patched_tokenizer(const char *name, json_t *header) {
    const char *base = json_string_value(json_object_get(header, "base"));
    assert_non_null(base);
    char *bp;
    if (base[0] == '@') {
        const char *root = getenv("DFM_ROOT");
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/tokenizer/%s", base + 1);
        bp = dfm_path_join(root && *root ? root : ".", rel);
    } else {
        bp = cache_path(base);
    }
    if (!dfm_path_exists(bp)) {
        print_error("MISSING tokenizer %s (base of %s). Run 'bash scripts/deps.sh'. This test fails rather than "
                    "skips.\n", bp, name);
        free(bp);
        fail();
    }
    json_error_t je;
    json_t *root = json_load_file(bp, 0, &je);
    if (!root) print_error("%s: %s\n", bp, je.text);
    assert_non_null(root);
    free(bp);
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(header, "patch"), k, v) json_object_set_new(root, k, resolve_refs(v));
    json_t *mp = json_deep_copy(json_object_get(header, "model_patch")), *model = json_object_get(root, "model");
    json_t *append = json_incref(json_object_get(mp, "$append")); /* vocabulary entries, merges first and last */
    json_object_del(mp, "$append");
    assert_int_equal(json_object_update(model, mp), 0);
    if (append) {
        assert_int_equal(json_object_update(json_object_get(model, "vocab"), json_object_get(append, "vocab")), 0);
        json_t *merges = json_copy(json_object_get(append, "first_merges"));
        if (!merges) merges = json_array();
        assert_int_equal(json_array_extend(merges, json_object_get(model, "merges")), 0);
        if (json_object_get(append, "merges"))
            assert_int_equal(json_array_extend(merges, json_object_get(append, "merges")), 0);
        json_object_set_new(model, "merges", merges);
    }
    json_decref(append), json_decref(mp);
    char fn[160];
    snprintf(fn, sizeof fn, "%s.tokenizer.json", name);
    char *out = dfm_path_join(tmpdir, fn);
    assert_int_equal(json_dump_file(root, out, JSON_COMPACT), 0);
    json_decref(root);
    return out;
}

/* Load path twice into g: parsed from the JSON (writing a cache file into a folder of its own), then mapped
 * from that cache file; both must describe the same tokenizer. */
static void load_both(golden_set *g, const char *path) {
    char cache[400], *prev_cache = strdup(getenv("DFM_TOKENIZER_CACHE"));
    snprintf(cache, sizeof cache, "%s/cache-%s", tmpdir, g->name); /* a cache folder of its own, new: */
    setenv("DFM_TOKENIZER_CACHE", cache, 1);
    for (int pass = 0; pass < 2; pass++) { /* the first load parses and writes, the second maps */
        dfm_tokenizer **t = pass ? &g->cached : &g->tok;
        double t0 = now_s();
        int rc = dfm_tokenizer_load(path, t);
        if (rc) print_error("load %s: %s\n", path, dfm_last_error());
        assert_int_equal(rc, DFM_OK);
        assert_int_equal(dfm_tokenizer_from_cache(*t), pass);
        print_message("loaded %s %s in %.3fs: %s\n", g->name, pass ? "from the cache" : "from JSON", now_s() - t0,
                      dfm_tokenizer_describe(*t));
    }
    setenv("DFM_TOKENIZER_CACHE", prev_cache, 1);
    free(prev_cache);
    assert_string_equal(dfm_tokenizer_describe(g->tok), dfm_tokenizer_describe(g->cached));
    assert_int_equal(dfm_tokenizer_hash(g->tok), dfm_tokenizer_hash(g->cached));
}

static void load_set(golden_set *g) {
    if (g->tok) return;
    char *path;
    json_t *header = NULL;
    if (g->rel[0] == '%') {
        /* the header line of the golden file says how the tokenizer was made */
        char *gp = golden_path(g->name);
        FILE *f = fopen(gp, "r");
        if (!f) print_error("golden file %s missing\n", gp);
        assert_non_null(f);
        json_error_t je;
        header = json_loadf(f, JSON_DISABLE_EOF_CHECK, &je);
        fclose(f);
        free(gp);
        assert_non_null(header);
        path = patched_tokenizer(g->name, header);
        json_decref(header);
    } else if (g->rel[0] == '@') {
        const char *root = getenv("DFM_ROOT");
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/tokenizer/%s", g->rel + 1);
        path = dfm_path_join(root && *root ? root : ".", rel);
    } else {
        path = cache_path(g->rel);
    }
    if (!dfm_path_exists(path)) {
        print_error("MISSING tokenizer %s: %s does not exist. Run 'bash scripts/deps.sh' (or set DFM_CACHE). This "
                    "test fails rather than skips.\n", g->name, path);
        free(path);
        fail();
    }
    load_both(g, path);
    free(path);

    char *gp = golden_path(g->name);
    char *buf = NULL;
    size_t len = 0;
    int rc = dfm_read_file(gp, &buf, &len);
    if (rc) print_error("golden file %s: %s\n", gp, dfm_last_error());
    assert_int_equal(rc, DFM_OK);
    free(gp);
    size_t cap = 0;
    char *save = NULL;
    int line = 0;
    long long declared = -1;
    for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save), line++) {
        json_error_t je;
        json_t *j = json_loads(l, JSON_ALLOW_NUL, &je);
        if (!j) print_error("golden %s line %d: %s\n", g->name, line + 1, je.text);
        assert_non_null(j);
        if (line == 0) { /* header */
            assert_int_equal(json_integer_value(json_object_get(j, "golden")), 1);
            declared = json_integer_value(json_object_get(j, "cases"));
            print_message("golden %s: %lld cases, tokenizers %s\n", g->name,
                          (long long)json_integer_value(json_object_get(j, "cases")),
                          json_string_value(json_object_get(j, "tokenizers_version")));
            json_decref(j);
            continue;
        }
        if (g->n_cases == cap) {
            cap = cap ? cap * 2 : 512;
            g->cases = realloc(g->cases, cap * sizeof *g->cases);
        }
        g->cases[g->n_cases++] = j;
    }
    free(buf);
    assert_int_equal(g->n_cases, declared); /* a truncated golden file must not pass */
    assert_true(g->n_cases > 150);
}

static int teardown_sets(void **state) {
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        dfm_tokenizer_free(sets[s].tok);
        dfm_tokenizer_free(sets[s].cached);
        for (size_t i = 0; i < sets[s].n_cases; i++) json_decref(sets[s].cases[i]);
        free(sets[s].cases);
        sets[s].tok = sets[s].cached = NULL, sets[s].cases = NULL, sets[s].n_cases = 0;
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

static int setup_tmp(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dfm-test-tokenizer-XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    char cache[300];
    snprintf(cache, sizeof cache, "%s/tokenizer-cache", tmpdir);
    return setenv("DFM_TOKENIZER_CACHE", cache, 1);
}

static char *case_bytes(json_t *c, size_t *len) {
    const char *b64 = json_string_value(json_object_get(c, "b64"));
    if (b64) return b64decode(b64, len);
    json_t *t = json_object_get(c, "text");
    *len = json_string_length(t);
    char *o = malloc(*len + 1);
    memcpy(o, json_string_value(t), *len);
    o[*len] = 0;
    return o;
}

static int json_str_eq(json_t *s, const char *p, size_t n) {
    return json_is_string(s) && json_string_length(s) == n && !memcmp(json_string_value(s), p, n);
}

/* Compare every case of g with tok; returns how many cases differ (each is reported). */
static size_t run_golden_with(golden_set *g, const dfm_tokenizer *tok, const char *how) {
    size_t ok = 0, bad_ids = 0, bad_dec = 0, bad_skip = 0, bad_pieces = 0, bad_rep = 0, bad_rt = 0, n_rt = 0;
    size_t worst_diff = 0;
    char worst[2048] = "";
    double t0 = now_s();
    for (size_t ci = 0; ci < g->n_cases; ci++) {
        json_t *c = g->cases[ci];
        const char *name = json_string_value(json_object_get(c, "name"));
        size_t len;
        char *text = case_bytes(c, &len);
        dfm_ids ids = {0};
        size_t rep = 0;
        int rc = dfm_tokenizer_encode(tok, text, len, &ids, &rep);
        if (rc) print_error("%s %s: encode failed: %s\n", g->name, name, dfm_last_error());
        assert_int_equal(rc, DFM_OK);
        json_t *exp = json_object_get(c, "ids");
        size_t ne = json_array_size(exp), ndiff = 0, first = (size_t)-1;
        for (size_t i = 0; i < (ne > ids.n ? ne : ids.n); i++) {
            uint32_t e = i < ne ? (uint32_t)json_integer_value(json_array_get(exp, i)) : UINT32_MAX;
            uint32_t a = i < ids.n ? ids.ids[i] : UINT32_MAX;
            if (e != a) {
                ndiff++;
                if (first == (size_t)-1) first = i;
            }
        }
        int case_ok = 1;
        if (ndiff) {
            bad_ids++, case_ok = 0;
            if (ndiff > worst_diff) {
                worst_diff = ndiff;
                size_t f = first;
                snprintf(worst, sizeof worst, "%s: %zu of %zu ids differ (dfm gave %zu ids); first at %zu: HF %lld, dfm %lld; "
                         "text starts \"%.60s\"", name, ndiff, ne, ids.n, f,
                         f < ne ? (long long)json_integer_value(json_array_get(exp, f)) : -1LL,
                         f < ids.n ? (long long)ids.ids[f] : -1LL, text);
            }
            print_error("MISMATCH %s %s: %zu ids differ, first at %zu\n", g->name, name, ndiff, first);
        }
        json_t *jr = json_object_get(c, "n_replaced");
        if (jr && (size_t)json_integer_value(jr) != rep) {
            bad_rep++, case_ok = 0;
            print_error("MISMATCH %s %s: %zu replacements, Python made %lld\n", g->name, name, rep,
                        (long long)json_integer_value(jr));
        }
        /* decode the EXPECTED ids, so a decode bug is not hidden by an encode bug */
        uint32_t *eids = malloc((ne ? ne : 1) * sizeof *eids);
        for (size_t i = 0; i < ne; i++) eids[i] = (uint32_t)json_integer_value(json_array_get(exp, i));
        for (int skip = 0; skip < 2; skip++) {
            char *d = NULL;
            size_t dl = 0;
            rc = dfm_tokenizer_decode(tok, eids, ne, skip, &d, &dl);
            assert_int_equal(rc, DFM_OK);
            json_t *want = json_object_get(c, skip && json_object_get(c, "decode_skip") ? "decode_skip" : "decode");
            if (!json_str_eq(want, d, dl)) {
                (skip ? bad_skip++ : bad_dec++), case_ok = 0;
                print_error("MISMATCH %s %s: decode(skip_special=%d) \"%.80s\" vs HF \"%.80s\"\n", g->name, name, skip, d,
                            json_string_value(want));
            }
            free(d);
        }
        json_t *pieces = json_object_get(c, "pieces");
        for (size_t i = 0; pieces && i < ne; i++) {
            char *d = NULL;
            size_t dl = 0;
            assert_int_equal(dfm_tokenizer_decode(tok, eids + i, 1, 0, &d, &dl), DFM_OK);
            if (!json_str_eq(json_array_get(pieces, i), d, dl)) {
                bad_pieces++, case_ok = 0;
                print_error("MISMATCH %s %s: decode([%u]) \"%s\" vs HF \"%s\"\n", g->name, name, eids[i], d,
                            json_string_value(json_array_get(pieces, i)));
            }
            free(d);
        }
        /* round trip on valid NFC text, wherever HF's own decode gives the text back (not so for the
         * Metaspace decoder, which writes <0xNN> byte tokens literally) */
        if (!json_object_get(c, "b64") && json_is_true(json_object_get(c, "nfc")) &&
            json_str_eq(json_object_get(c, "decode"), text, len)) {
            char *d = NULL;
            size_t dl = 0;
            n_rt++;
            assert_int_equal(dfm_tokenizer_decode(tok, ids.ids, ids.n, 0, &d, &dl), DFM_OK);
            if (dl != len || memcmp(d, text, len)) {
                bad_rt++, case_ok = 0;
                print_error("ROUND TRIP %s %s: decode(encode(x)) != x\n", g->name, name);
            }
            free(d);
        }
        ok += case_ok;
        free(eids);
        free(text);
        dfm_ids_free(&ids);
    }
    print_message("%s (%s): %zu/%zu golden cases match exactly (ids mismatches %zu, decode %zu, decode skip_special %zu, "
                  "single-token decodes %zu, replacement counts %zu; round trips %zu/%zu) in %.2fs\n",
                  g->name, how, ok, g->n_cases, bad_ids, bad_dec, bad_skip, bad_pieces, bad_rep, n_rt - bad_rt, n_rt,
                  now_s() - t0);
    if (worst_diff) print_error("worst ids mismatch: %s\n", worst);
    return g->n_cases - ok;
}

static void run_golden(golden_set *g) {
    load_set(g);
    assert_int_equal(run_golden_with(g, g->tok, "parsed"), 0);
    assert_int_equal(run_golden_with(g, g->cached, "cached"), 0);
}

static void test_golden_qwen(void **state) { run_golden(&sets[0]); }
static void test_golden_llama(void **state) { run_golden(&sets[1]); }
static void test_golden_spm_llama2(void **state) { run_golden(&sets[2]); }
static void test_golden_spm_metaspace(void **state) { run_golden(&sets[3]); }
static void test_golden_qwen_gpt2_layout(void **state) { run_golden(&sets[4]); }
static void test_golden_llama_ignore_merges(void **state) { run_golden(&sets[5]); }
static void test_golden_qwen_added_flags(void **state) { run_golden(&sets[6]); }
static void test_golden_spm_unk(void **state) { run_golden(&sets[7]); }
static void test_golden_smollm2(void **state) { run_golden(&sets[8]); }
static void test_golden_smollm2_digits_contiguous(void **state) { run_golden(&sets[9]); }

/* ---------------------------------------------------------------- the component oracle */

/* tests/data/tokenizer/oracle/oracle.golden.jsonl.zst (tests/ref/make_tokenizer_oracle.py): for every
 * component and family combination, a header (base tokenizer.json + patch) and HF's ids and decodes of the
 * shared cases of oracle/cases.jsonl. Every set is loaded parsed and cached and compared case by case; all
 * sets run, and the test fails at the end naming every set that differs. */
static char *read_zst(const char *path, size_t *len) {
    char *z = NULL;
    size_t zn = 0;
    int rc = dfm_read_file(path, &z, &zn);
    if (rc) print_error("%s: %s\n", path, dfm_last_error());
    assert_int_equal(rc, DFM_OK);
    unsigned long long n = ZSTD_getFrameContentSize(z, zn);
    assert_true(n != ZSTD_CONTENTSIZE_ERROR && n != ZSTD_CONTENTSIZE_UNKNOWN && n < (1ull << 31));
    char *out = malloc(n + 1);
    size_t got = ZSTD_decompress(out, n, z, zn);
    assert_false(ZSTD_isError(got));
    assert_int_equal(got, n);
    out[n] = 0;
    free(z);
    *len = n;
    return out;
}

static void oracle_set_run(golden_set *g, json_t *header, size_t *n_sets, char *failed, size_t failed_cap) {
    long long declared = json_integer_value(json_object_get(header, "n"));
    assert_int_equal(g->n_cases, declared); /* a truncated set must not pass */
    char *path = patched_tokenizer(g->name, header);
    load_both(g, path);
    free(path);
    size_t bad = run_golden_with(g, g->tok, "parsed") + run_golden_with(g, g->cached, "cached");
    if (bad) snprintf(failed + strlen(failed), failed_cap - strlen(failed), " %s(%zu)", g->name, bad);
    (*n_sets)++;
    dfm_tokenizer_free(g->tok), dfm_tokenizer_free(g->cached);
    for (size_t i = 0; i < g->n_cases; i++) json_decref(g->cases[i]);
    free(g->cases);
    free((char *)g->name);
    memset(g, 0, sizeof *g);
}

static void test_oracle(void **state) {
    char *cp = data_path("oracle/cases.jsonl"), *zp = data_path("oracle/oracle.golden.jsonl.zst");
    char *buf = NULL;
    size_t len = 0;
    int rc = dfm_read_file(cp, &buf, &len);
    if (rc) print_error("%s: %s\n", cp, dfm_last_error());
    assert_int_equal(rc, DFM_OK);
    json_t *inputs = json_object();
    char *save = NULL;
    for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        json_t *j = json_loads(l, JSON_ALLOW_NUL, NULL);
        assert_non_null(j);
        json_object_set_new(inputs, json_string_value(json_object_get(j, "name")), j);
    }
    free(buf);
    buf = read_zst(zp, &len);
    golden_set g = {0};
    json_t *header = NULL;
    size_t n_sets = 0, cap = 0;
    char failed[4096] = "";
    double t0 = now_s();
    save = NULL;
    for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        json_error_t je;
        json_t *j = json_loads(l, JSON_ALLOW_NUL, &je);
        if (!j) print_error("oracle line: %s\n", je.text);
        assert_non_null(j);
        if (json_object_get(j, "golden")) {
            if (header) oracle_set_run(&g, header, &n_sets, failed, sizeof failed), json_decref(header);
            header = j;
            g.name = strdup(json_string_value(json_object_get(j, "tokenizer")));
            g.rel = "%";
            cap = 0;
            continue;
        }
        json_t *in = json_object_get(inputs, json_string_value(json_object_get(j, "name")));
        if (!in) print_error("oracle case %s is not in %s\n", json_string_value(json_object_get(j, "name")), cp);
        assert_non_null(in);
        json_t *c = json_deep_copy(in);
        json_object_update(c, j);
        if (!json_object_get(c, "decode")) json_object_set(c, "decode", json_object_get(c, "text"));
        json_decref(j);
        if (g.n_cases == cap) {
            cap = cap ? cap * 2 : 512;
            g.cases = realloc(g.cases, cap * sizeof *g.cases);
        }
        g.cases[g.n_cases++] = c;
    }
    assert_non_null(header);
    oracle_set_run(&g, header, &n_sets, failed, sizeof failed);
    json_decref(header);
    free(buf), free(cp), free(zp);
    json_decref(inputs);
    print_message("oracle: %zu component sets in %.1fs; differing:%s\n", n_sets, now_s() - t0, *failed ? failed : " none");
    assert_true(n_sets >= 80);
    assert_string_equal(failed, "");
}

/* ---------------------------------------------------------------- threads */

typedef struct {
    golden_set *g;
    int start, fails;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    for (int rep = 0; rep < 2; rep++)
        for (size_t ci = (size_t)a->start; ci < a->g->n_cases; ci += 1) {
            json_t *c = a->g->cases[(ci * 7 + (size_t)a->start) % a->g->n_cases];
            size_t len;
            char *text = case_bytes(c, &len);
            dfm_ids ids = {0};
            if (dfm_tokenizer_encode(a->g->tok, text, len, &ids, NULL)) a->fails++;
            json_t *exp = json_object_get(c, "ids");
            if (json_array_size(exp) != ids.n) a->fails++;
            else
                for (size_t i = 0; i < ids.n; i++)
                    if ((uint32_t)json_integer_value(json_array_get(exp, i)) != ids.ids[i]) { a->fails++; break; }
            dfm_ids_free(&ids);
            free(text);
        }
    return NULL;
}

static void test_concurrent_encode(void **state) {
    golden_set *g = &sets[0];
    load_set(g);
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){g, i * 37, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thr_main, &args[i]), 0);
    }
    int fails = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        fails += args[i].fails;
    }
    assert_int_equal(fails, 0);
}

/* Many distinct pieces (more than the cache holds, so shards are cleared and refilled while other
 * threads read them): every thread must get the single-threaded ids. */
#define CHURN_TEXTS 300
#define CHURN_WORDS 500
typedef struct {
    const dfm_tokenizer *tok;
    char **texts;
    dfm_ids *ref;
    int start, fails;
} churn_arg;

static void *churn_main(void *p) {
    churn_arg *a = p;
    dfm_ids ids = {0};
    for (int k = 0; k < CHURN_TEXTS; k++) {
        int i = (k + a->start) % CHURN_TEXTS;
        ids.n = 0;
        if (dfm_tokenizer_encode(a->tok, a->texts[i], strlen(a->texts[i]), &ids, NULL) || ids.n != a->ref[i].n ||
            memcmp(ids.ids, a->ref[i].ids, ids.n * sizeof *ids.ids))
            a->fails++;
    }
    dfm_ids_free(&ids);
    return NULL;
}

static void test_concurrent_cache_churn(void **state) {
    golden_set *g = &sets[0];
    load_set(g);
    uint64_t x = 88172645463325252ULL; /* xorshift: random lowercase words, 2..9 letters */
    char **texts = calloc(CHURN_TEXTS, sizeof *texts);
    dfm_ids *ref = calloc(CHURN_TEXTS, sizeof *ref);
    for (int i = 0; i < CHURN_TEXTS; i++) {
        texts[i] = malloc(CHURN_WORDS * 11 + 1);
        char *p = texts[i];
        for (int w = 0; w < CHURN_WORDS; w++) {
            *p++ = ' ';
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int len = 2 + (int)(x % 8);
            for (int c = 0; c < len; c++) *p++ = (char)('a' + (x >> (8 + 5 * c)) % 26);
        }
        *p = 0;
        assert_int_equal(dfm_tokenizer_encode(g->tok, texts[i], strlen(texts[i]), &ref[i], NULL), DFM_OK);
    }
    pthread_t th[3];
    churn_arg args[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (churn_arg){g->tok, texts, ref, i * 101, 0};
        assert_int_equal(pthread_create(&th[i], NULL, churn_main, &args[i]), 0);
    }
    int fails = 0;
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        fails += args[i].fails;
    }
    for (int i = 0; i < CHURN_TEXTS; i++) free(texts[i]), dfm_ids_free(&ref[i]);
    free(texts), free(ref);
    assert_int_equal(fails, 0);
}

/* ---------------------------------------------------------------- API details on the real files */

static void test_queries_and_range(void **state) {
    golden_set *q = &sets[0], *l = &sets[1];
    load_set(q);
    load_set(l);
    assert_int_equal(dfm_tokenizer_vocab_size(q->tok), 151669);
    assert_int_equal(dfm_tokenizer_vocab_size(l->tok), 128257);
    assert_int_equal(dfm_tokenizer_eos_id(q->tok), 151643);
    assert_int_equal(dfm_tokenizer_eos_id(l->tok), 128001);
    /* the stated choice: not tokenizer_config.json's eos_token, which for Qwen2.5 is the chat turn end */
    assert_int_equal(dfm_tokenizer_token_id(q->tok, "<|im_end|>"), 151645);
    assert_int_equal(dfm_tokenizer_token_id(q->tok, "\xc4\xa0world"), 1879); /* "Ġworld" */
    assert_int_equal(dfm_tokenizer_token_id(q->tok, "no-such-token-xyz"), -1);
    assert_int_not_equal(dfm_tokenizer_hash(q->tok), dfm_tokenizer_hash(l->tok));
    uint32_t bad[2] = {1879, 151669};
    char *d = NULL;
    size_t dl = 0;
    assert_int_equal(dfm_tokenizer_decode(q->tok, bad, 2, 0, &d, &dl), DFM_ERANGE);
    assert_null(d);
    assert_non_null(strstr(dfm_last_error(), "151669"));
    uint32_t huge = UINT32_MAX;
    assert_int_equal(dfm_tokenizer_decode(l->tok, &huge, 1, 1, &d, &dl), DFM_ERANGE);
    /* empty input */
    dfm_ids ids = {0};
    assert_int_equal(dfm_tokenizer_encode(q->tok, "", 0, &ids, NULL), DFM_OK);
    assert_int_equal(ids.n, 0);
    assert_int_equal(dfm_tokenizer_decode(q->tok, NULL, 0, 0, &d, &dl), DFM_OK);
    assert_int_equal(dl, 0);
    assert_string_equal(d, "");
    free(d);
    /* encode appends */
    assert_int_equal(dfm_tokenizer_encode(q->tok, "hi", 2, &ids, NULL), DFM_OK);
    size_t n1 = ids.n;
    assert_int_equal(dfm_tokenizer_encode(q->tok, "hi", 2, &ids, NULL), DFM_OK);
    assert_int_equal(ids.n, 2 * n1);
    dfm_ids_free(&ids);
    dfm_tokenizer_free(NULL);
}

/* ---------------------------------------------------------------- error paths */

static char *write_tmp(const char *name, const char *content) {
    char *p = dfm_path_join(tmpdir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
    return p;
}

static int load_expect(const char *json, int code, const char *must1, const char *must2) {
    char *p = write_tmp("t.json", json);
    dfm_tokenizer *tok = (dfm_tokenizer *)0x1;
    int rc = dfm_tokenizer_load(p, &tok);
    if (rc != code) print_error("expected %d, got %d: %s\n", code, rc, dfm_last_error());
    assert_int_equal(rc, code);
    if (code) {
        assert_null(tok);
        if (must1 && !strstr(dfm_last_error(), must1)) print_error("'%s' not in: %s\n", must1, dfm_last_error());
        if (must1) assert_non_null(strstr(dfm_last_error(), must1));
        if (must2) assert_non_null(strstr(dfm_last_error(), must2));
        assert_non_null(strstr(dfm_last_error(), p)); /* names the file */
    }
    dfm_tokenizer_free(code ? NULL : tok);
    free(p);
    return rc;
}

#define TINY_VOCAB "{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4,\"bc\":5,\"\xc4\xa0\":6,\"\xc4\xa0" "a\":7,\"x\":8}"
#define BL "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":true}"

static void test_errors(void **state) {
    dfm_tokenizer *tok = NULL;
    char *missing = dfm_path_join(tmpdir, "no-such-tokenizer.json");
    assert_int_equal(dfm_tokenizer_load(missing, &tok), DFM_ENOTFOUND);
    assert_null(tok);
    assert_non_null(strstr(dfm_last_error(), "no-such-tokenizer.json"));
    free(missing);
    load_expect("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, ", DFM_EFORMAT, "not valid JSON", "line 1");
    load_expect("[1, 2]", DFM_EFORMAT, "not a JSON object", NULL);
    load_expect("{\"model\":{\"type\":\"Foo\",\"vocab\":{\"a\":0}},\"decoder\":null}", DFM_EUNSUPPORTED, "Foo",
                "model.type");
    load_expect("{\"model\":{\"type\":\"Unigram\",\"unk_id\":3,\"vocab\":[[\"a\",0.0]]}}", DFM_EFORMAT, "unk_id",
                "below the 1 pieces");
    load_expect("{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",\"x\"]]}}", DFM_EFORMAT, "model.vocab[0]", NULL);
    load_expect("{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[" BL ",{\"type\":\"Metaspace\","
                "\"replacement\":\"_\"}]},\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB ",\"merges\":[]}}",
                DFM_EUNSUPPORTED, "after ByteLevel", "pre_tokenizer.pretokenizers[1]");
    load_expect("{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[" BL ",{\"type\":\"Foo\"}]},"
                "\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB ",\"merges\":[]}}",
                DFM_EUNSUPPORTED, "\"Foo\"", "pre_tokenizer.pretokenizers[1]");
    load_expect("{\"normalizer\":{\"type\":\"ByteLevel\"},\"pre_tokenizer\":" BL ",\"decoder\":" BL
                ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB ",\"merges\":[]}}",
                DFM_EUNSUPPORTED, "\"ByteLevel\"", "normalizer");
    load_expect("{\"normalizer\":{\"type\":\"Strip\",\"strip_left\":true},\"pre_tokenizer\":" BL ",\"decoder\":" BL
                ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB ",\"merges\":[]}}",
                DFM_EFORMAT, "strip_right", "normalizer");
    /* `tokenizers` fails on what a Replace that matches the empty string makes: refused here */
    load_expect("{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"x*\"},\"content\":\"y\"},\"pre_tokenizer\":"
                BL ",\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB ",\"merges\":[]}}",
                DFM_EUNSUPPORTED, "empty string", "normalizer.pattern");
    load_expect("{\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"AAE=\"},\"pre_tokenizer\":" BL
                ",\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB ",\"merges\":[]}}",
                DFM_EFORMAT, "precompiled_charsmap", "shorter than");
    load_expect("{\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"not base64!\"},\"pre_tokenizer\":" BL
                ",\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB ",\"merges\":[]}}",
                DFM_EFORMAT, "base64", NULL);
    load_expect("{\"pre_tokenizer\":" BL ",\"decoder\":{\"type\":\"Foo\"},\"model\":{\"type\":\"BPE\",\"vocab\":"
                TINY_VOCAB ",\"merges\":[]}}", DFM_EUNSUPPORTED, "\"Foo\"", "decoder");
    load_expect("{\"pre_tokenizer\":" BL ",\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":"
                TINY_VOCAB ",\"merges\":[]}}", DFM_EUNSUPPORTED, "dropout", NULL);
    load_expect("{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"_\",\"add_prefix_space\":false},"
                "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", DFM_EFORMAT, "prepend_scheme", NULL);
    load_expect("{\"pre_tokenizer\":" BL ",\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB
                ",\"merges\":[\"a q\"]}}", DFM_EFORMAT, "model.merges[0]", "not in model.vocab");
    load_expect("{\"pre_tokenizer\":" BL ",\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB
                ",\"merges\":[\"a b\", 7]}}", DFM_EFORMAT, "model.merges[1]", NULL);
    load_expect("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"},"
                "\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB ",\"merges\":[]}}",
                DFM_EUNSUPPORTED, "pre_tokenizer", "regex");
    load_expect("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"},"
                "\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB ",\"merges\":[]}}",
                DFM_EFORMAT, "Sideways", "behavior");
    /* Oniguruma constructs PCRE2 cannot say, and properties whose Oniguruma set is not checked */
    load_expect("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[a[^b]]\"},\"behavior\":\"Isolated\"},"
                "\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB ",\"merges\":[]}}",
                DFM_EUNSUPPORTED, "negated class inside a class", "pre_tokenizer.pattern");
    load_expect("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{Foo}\"},\"behavior\":\"Isolated\"},"
                "\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB ",\"merges\":[]}}",
                DFM_EUNSUPPORTED, "\\p{Foo}", NULL);
    /* an id far beyond the entries the file holds is refused before any table is sized by it */
    load_expect("{\"pre_tokenizer\":" BL ",\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB
                ",\"merges\":[]},\"added_tokens\":[{\"id\":2147483647,\"content\":\"<x>\"}]}",
                DFM_EFORMAT, "far beyond", "2147483647");
    load_expect("{\"pre_tokenizer\":" BL ",\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":5000000}"
                ",\"merges\":[]}}", DFM_EFORMAT, "far beyond", "5000000");
}

/* Merges as "a b" strings and as [a, b] pairs give the same model; ignore_merges=true emits a
 * whole pre-token found in the vocabulary directly (the merges alone would give "ab" "c"). */
static void test_tiny_merges_and_ignore_merges(void **state) {
    const char *fmt = "{\"added_tokens\":[{\"id\":9,\"content\":\"<|x|>\",\"special\":true,\"normalized\":false}],"
                      "\"pre_tokenizer\":" BL ",\"decoder\":" BL ",\"model\":{\"type\":\"BPE\",\"ignore_merges\":%s,"
                      "\"vocab\":" TINY_VOCAB ",\"merges\":%s}}";
    const char *merges[2] = {"[\"a b\", \"\xc4\xa0 a\"]", "[[\"a\",\"b\"],[\"\xc4\xa0\",\"a\"]]"};
    uint32_t expect_nom[] = {3, 2, 9, 6, 3, 2}; /* "abc<|x|> abc": ab c <|x|> Ġ ab c (a b is rank 0) */
    for (int ig = 0; ig < 2; ig++)
        for (int m = 0; m < 2; m++) {
            char json[2048];
            snprintf(json, sizeof json, fmt, ig ? "true" : "false", merges[m]);
            char *p = write_tmp("tiny.json", json);
            dfm_tokenizer *tok = NULL;
            int rc = dfm_tokenizer_load(p, &tok);
            if (rc) print_error("%s\n", dfm_last_error());
            assert_int_equal(rc, DFM_OK);
            dfm_ids ids = {0};
            assert_int_equal(dfm_tokenizer_encode(tok, "abc<|x|> abc", 12, &ids, NULL), DFM_OK);
            if (!ig) {
                assert_int_equal(ids.n, 6);
                assert_memory_equal(ids.ids, expect_nom, sizeof expect_nom);
            } else { /* "abc" is in the vocabulary: 4; " abc" is not: Ġ ab c */
                uint32_t e[] = {4, 9, 6, 3, 2};
                assert_int_equal(ids.n, 5);
                assert_memory_equal(ids.ids, e, sizeof e);
            }
            char *d;
            size_t dl;
            assert_int_equal(dfm_tokenizer_decode(tok, ids.ids, ids.n, 1, &d, &dl), DFM_OK);
            assert_string_equal(d, "abc abc");
            free(d);
            dfm_ids_free(&ids);
            dfm_tokenizer_free(tok);
            free(p);
        }
}

/* An unknown token the text needs but the vocabulary lacks is an encode error naming it, as in `tokenizers`
 * (WordPiece and WordLevel unk_token, Unigram without unk_id, BPE unk_token not in the vocabulary); text the
 * vocabulary covers encodes. */
static void test_missing_unknown_token(void **state) {
    static const char *models[] = {
        "{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"vocab\":{\"ab\":0,\"##c\":1}}",
        "{\"type\":\"WordLevel\",\"unk_token\":\"<unk>\",\"vocab\":{\"ab\":0,\"abc\":1}}",
        "{\"type\":\"Unigram\",\"unk_id\":null,\"vocab\":[[\"ab\",-1.0],[\"c\",-2.0],[\"a\",-3.0],[\"b\",-3.0]]}",
        "{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3},\"merges\":[\"a b\"]}"};
    for (int m = 0; m < 4; m++) {
        char json[512];
        snprintf(json, sizeof json, "{\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"},\"model\":%s}", models[m]);
        char *p = write_tmp("unk.json", json);
        dfm_tokenizer *tok = NULL;
        assert_int_equal(dfm_tokenizer_load(p, &tok), DFM_OK);
        dfm_ids ids = {0};
        assert_int_equal(dfm_tokenizer_encode(tok, "abc", 3, &ids, NULL), DFM_OK);
        assert_true(ids.n >= 1);
        ids.n = 0;
        int rc = dfm_tokenizer_encode(tok, "abc xyz", 7, &ids, NULL);
        if (rc != DFM_EFORMAT) print_error("model %d: %d %s\n", m, rc, dfm_last_error());
        assert_int_equal(rc, DFM_EFORMAT);
        assert_non_null(strstr(dfm_last_error(), "fails on this text too"));
        dfm_ids_free(&ids);
        dfm_tokenizer_free(tok);
        free(p);
    }
}

/* A folder path loads the tokenizer.json inside it. */
static void test_load_folder(void **state) {
    const char *root = getenv("DFM_ROOT");
    char *src = dfm_path_join(root && *root ? root : ".", "tests/data/tokenizer/spm-llama2.tokenizer.json");
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(dfm_read_file(src, &buf, &len), DFM_OK);
    char *dir = dfm_path_join(tmpdir, "folder");
    assert_int_equal(dfm_mkdir_p(dir), DFM_OK);
    char *dst = dfm_path_join(dir, "tokenizer.json");
    assert_int_equal(dfm_write_file_atomic(dst, buf, len), DFM_OK);
    dfm_tokenizer *tok = NULL;
    assert_int_equal(dfm_tokenizer_load(dir, &tok), DFM_OK);
    assert_non_null(strstr(dfm_tokenizer_describe(tok), "BPE, 1084 merges (byte fallback)"));
    assert_int_equal(dfm_tokenizer_eos_id(tok), 2); /* </s> */
    assert_int_equal(dfm_tokenizer_hash(tok), dfm_checksum64(buf, len));
    dfm_tokenizer_free(tok);
    free(buf), free(src), free(dir), free(dst);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_tiny_merges_and_ignore_merges),
        cmocka_unit_test(test_load_folder),
        cmocka_unit_test(test_missing_unknown_token),
        cmocka_unit_test(test_golden_qwen),
        cmocka_unit_test(test_golden_llama),
        cmocka_unit_test(test_golden_spm_llama2),
        cmocka_unit_test(test_golden_spm_metaspace),
        cmocka_unit_test(test_golden_qwen_gpt2_layout),
        cmocka_unit_test(test_golden_llama_ignore_merges),
        cmocka_unit_test(test_golden_qwen_added_flags),
        cmocka_unit_test(test_golden_spm_unk),
        cmocka_unit_test(test_golden_smollm2),
        cmocka_unit_test(test_golden_smollm2_digits_contiguous),
        cmocka_unit_test(test_oracle),
        cmocka_unit_test(test_queries_and_range),
        cmocka_unit_test(test_concurrent_encode),
        cmocka_unit_test(test_concurrent_cache_churn),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_sets);
}
