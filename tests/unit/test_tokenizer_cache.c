/* Unit tests of the tokenizer cache file (tokenizer/tok_cachefile.c, schemas/tokenizer_cache.md):
 * written on the first load and mapped on the next; the same ids either way; a stale, truncated,
 * corrupt, wrong-version or empty cache file is never used but rebuilt; resealed mutations (valid
 * checksums, bad contents) are refused or give in-range ids, never a crash (run under ASan by
 * tests/run.sh); caching off or an unwritable folder still loads; processes racing to write it all
 * load; and mapping costs a small fraction of parsing.
 * (That the cached tokenizer passes every golden case is checked by test_tokenizer.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char tmpdir[256], cachedir[300], small_json[300];

static const char TEXT[] = "Hello, world! The quick brown fox \xc3\xa9t\xc3\xa9 \xe2\x80\x94 123 <s> tabs\tand\nlines </s>";

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *repo_path(const char *rel) {
    const char *root = getenv("DFM_ROOT");
    return dfm_path_join(root && *root ? root : ".", rel);
}

static char *qwen_path(void) {
    const char *cache = getenv("DFM_CACHE");
    char home[512];
    if (!cache || !*cache) {
        snprintf(home, sizeof home, "%s/.cache/dfm", getenv("HOME") ? getenv("HOME") : ".");
        cache = getuid() == 0 ? "/var/cache/dfm" : home;
    }
    return dfm_path_join(cache, "tokenizers/qwen2.5/tokenizer.json");
}

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dfm-test-tokcache-XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    snprintf(cachedir, sizeof cachedir, "%s/cache", tmpdir);
    snprintf(small_json, sizeof small_json, "%s/tokenizer.json", tmpdir);
    char *src = repo_path("tests/data/tokenizer/spm-llama2.tokenizer.json"), *buf = NULL;
    size_t len = 0;
    int rc = dfm_read_file(src, &buf, &len);
    if (rc) fprintf(stderr, "%s: %s\n", src, dfm_last_error());
    if (!rc) rc = dfm_write_file_atomic(small_json, buf, len);
    free(src), free(buf);
    return rc || setenv("DFM_TOKENIZER_CACHE", cachedir, 1) ? -1 : 0;
}

static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

/* The cache file path of a tokenizer.json (from its bytes' hash, as load names it). */
static char *cache_file_of(const char *json) {
    char *buf = NULL, *p = NULL;
    size_t len = 0;
    assert_int_equal(dfm_read_file(json, &buf, &len), DFM_OK);
    assert_int_equal(dfm_tokfile_path(dfm_checksum64(buf, len), &p), DFM_OK);
    free(buf);
    assert_non_null(p);
    return p;
}

static dfm_tokenizer *load_ok(const char *json, int want_from_cache) {
    dfm_tokenizer *tok = NULL;
    int rc = dfm_tokenizer_load(json, &tok);
    if (rc) print_error("load %s: %s\n", json, dfm_last_error());
    assert_int_equal(rc, DFM_OK);
    if (dfm_tokenizer_from_cache(tok) != want_from_cache)
        print_error("%s: loaded %s, expected %s\n", json, dfm_tokenizer_from_cache(tok) ? "from the cache" : "from JSON",
                    want_from_cache ? "from the cache" : "from JSON");
    assert_int_equal(dfm_tokenizer_from_cache(tok), want_from_cache);
    return tok;
}

static void encode_text(const dfm_tokenizer *tok, dfm_ids *ids) {
    ids->n = 0;
    assert_int_equal(dfm_tokenizer_encode(tok, TEXT, strlen(TEXT), ids, NULL), DFM_OK);
    assert_true(ids->n > 10);
}

static void assert_same_ids(const dfm_ids *a, const dfm_ids *b) {
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->ids, b->ids, a->n * sizeof *a->ids);
}

static void rm_cache(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cachedir);
    assert_int_equal(system(cmd), 0);
}

static void read_all(const char *p, uint8_t **buf, size_t *n) {
    char *b = NULL;
    assert_int_equal(dfm_read_file(p, &b, n), DFM_OK);
    *buf = (uint8_t *)b;
}

static void write_all(const char *p, const void *buf, size_t n) {
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Recompute both checksums (payload at 496 over [512, n), header at 504 over [0, 504)). */
static void reseal(uint8_t *b, size_t n) {
    if (n < 512) return;
    uint64_t pc = dfm_checksum64(b + 512, n - 512), hc;
    memcpy(b + 496, &pc, 8);
    hc = dfm_checksum64(b, 504);
    memcpy(b + 504, &hc, 8);
}

/* ---------------------------------------------------------------- tests */

static void test_written_then_mapped(void **state) {
    rm_cache();
    char *cf = cache_file_of(small_json);
    assert_false(dfm_path_exists(cf));
    dfm_tokenizer *parsed = load_ok(small_json, 0);
    assert_true(dfm_path_exists(cf));
    dfm_tokenizer *mapped = load_ok(small_json, 1);
    dfm_ids a = {0}, b = {0};
    encode_text(parsed, &a);
    encode_text(mapped, &b);
    assert_same_ids(&a, &b);
    assert_int_equal(dfm_tokenizer_vocab_size(parsed), dfm_tokenizer_vocab_size(mapped));
    assert_int_equal(dfm_tokenizer_eos_id(parsed), dfm_tokenizer_eos_id(mapped));
    char *da = NULL, *db = NULL;
    size_t la = 0, lb = 0;
    assert_int_equal(dfm_tokenizer_decode(parsed, a.ids, a.n, 1, &da, &la), DFM_OK);
    assert_int_equal(dfm_tokenizer_decode(mapped, b.ids, b.n, 1, &db, &lb), DFM_OK);
    assert_int_equal(la, lb);
    assert_memory_equal(da, db, la);
    free(da), free(db), free(cf);
    dfm_ids_free(&a), dfm_ids_free(&b);
    dfm_tokenizer_free(parsed), dfm_tokenizer_free(mapped);
}

/* A damaged cache file: load must ignore it, parse, rewrite it; the next load maps the new one. */
static void expect_rebuilt(const char *what, const uint8_t *bytes, size_t n, const dfm_ids *want) {
    char *cf = cache_file_of(small_json);
    write_all(cf, bytes, n);
    print_message("damaged cache (%s, %zu bytes): ", what, n);
    dfm_tokenizer *tok = load_ok(small_json, 0);
    print_message("ignored and rebuilt\n");
    dfm_ids ids = {0};
    encode_text(tok, &ids);
    assert_same_ids(&ids, want);
    dfm_tokenizer_free(tok);
    tok = load_ok(small_json, 1);
    ids.n = 0;
    encode_text(tok, &ids);
    assert_same_ids(&ids, want);
    dfm_ids_free(&ids);
    dfm_tokenizer_free(tok);
    free(cf);
}

static void test_damaged_caches_rebuilt(void **state) {
    rm_cache();
    dfm_tokenizer *ref = load_ok(small_json, 0);
    dfm_ids want = {0};
    encode_text(ref, &want);
    dfm_tokenizer_free(ref);
    char *cf = cache_file_of(small_json);
    uint8_t *good;
    size_t n;
    read_all(cf, &good, &n);
    assert_true(n > 4096);
    uint8_t *b = malloc(n);

    expect_rebuilt("empty", good, 0, &want);
    expect_rebuilt("header only", good, 512, &want);
    expect_rebuilt("truncated to half", good, n / 2, &want);
    expect_rebuilt("one byte short", good, n - 1, &want);
    memcpy(b, good, n), b[n - 100] ^= 0x40;
    expect_rebuilt("payload byte flipped", b, n, &want);
    memcpy(b, good, n), b[41] ^= 0x01; /* n_ids */
    expect_rebuilt("header byte flipped", b, n, &want);
    memcpy(b, good, n), b[8] = 99, reseal(b, n); /* version 99, checksums valid */
    expect_rebuilt("newer version", b, n, &want);
    memcpy(b, good, n), b[16] ^= 0xff, reseal(b, n); /* made from another tokenizer.json */
    expect_rebuilt("stale source hash", b, n, &want);
    memcpy(b, good, n), memcpy(b, "NOTACACH", 8);
    expect_rebuilt("bad magic", b, n, &want);
    /* the cache of another tokenizer under this name (a stale file with a valid checksum) */
    char other[400];
    snprintf(other, sizeof other, "%s/other.json", tmpdir);
    char *src = repo_path("tests/data/tokenizer/spm-metaspace.tokenizer.json");
    uint8_t *ob;
    size_t on;
    read_all(src, &ob, &on);
    write_all(other, ob, on);
    free(ob), free(src);
    dfm_tokenizer_free(load_ok(other, 0));
    char *ocf = cache_file_of(other);
    read_all(ocf, &ob, &on);
    expect_rebuilt("another tokenizer's cache", ob, on, &want);
    free(ob), free(ocf);
    free(b), free(good), free(cf);
    dfm_ids_free(&want);
}

/* Mutations behind valid checksums (what a crafted file can do): every one refused, or a tokenizer
 * whose ids stay below its vocabulary size and decode. For each model's tables: BPE merges (spm-llama2),
 * the Unigram trie and scores (oracle/unigram), WordPiece, and a charsmap in the meta (oracle/t5). */
static void mutate(const char *rel, int rounds) {
    char *src = repo_path(rel), json[400];
    uint8_t *jb;
    size_t jn;
    read_all(src, &jb, &jn);
    snprintf(json, sizeof json, "%s/mutate.json", tmpdir);
    write_all(json, jb, jn);
    free(jb), free(src);
    rm_cache();
    dfm_tokenizer_free(load_ok(json, 0));
    char *cf = cache_file_of(json);
    uint8_t *good;
    size_t n;
    read_all(cf, &good, &n);
    uint64_t src_hash, src_bytes;
    memcpy(&src_hash, good + 16, 8);
    memcpy(&src_bytes, good + 24, 8);
    uint8_t *b = malloc(n);
    char mpath[400];
    snprintf(mpath, sizeof mpath, "%s/mutant.dfmtok", tmpdir);
    uint64_t st = 12345;
    size_t loaded = 0, refused = 0;
    for (int r = 0; r < rounds; r++) {
        memcpy(b, good, n);
        int flips = 1 + r % 4;
        for (int k = 0; k < flips; k++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            /* a third of the flips in the header (sizes, counts, the section table), the rest anywhere */
            size_t pos = (st >> 33) % (r % 3 == 0 ? 496 : n);
            b[pos] ^= (uint8_t)(1u << ((st >> 20) & 7));
        }
        if (r % 3 == 0) memcpy(b, good, 40); /* keep magic .. file size: reach the counts and section table */
        reseal(b, n);
        write_all(mpath, b, n);
        dfm_tokenizer *tok = NULL;
        if (dfm_tokenizer_load_cachefile(mpath, src_hash, src_bytes, &tok)) {
            refused++;
            dfm_error_clear();
            continue;
        }
        loaded++;
        dfm_ids ids = {0};
        if (!dfm_tokenizer_encode(tok, TEXT, strlen(TEXT), &ids, NULL)) {
            for (size_t i = 0; i < ids.n; i++) assert_true(ids.ids[i] < dfm_tokenizer_vocab_size(tok));
            char *d = NULL;
            size_t dl = 0;
            if (!dfm_tokenizer_decode(tok, ids.ids, ids.n, 0, &d, &dl)) free(d);
            else dfm_error_clear();
        } else {
            dfm_error_clear();
        }
        dfm_ids_free(&ids);
        dfm_tokenizer_eos_id(tok);
        dfm_tokenizer_free(tok);
    }
    print_message("%s: %d resealed mutants: %zu refused, %zu loaded with in-range ids\n", rel, rounds, refused, loaded);
    assert_true(refused > 0);
    free(b), free(good), free(cf);
    rm_cache();
}

static void test_resealed_mutations(void **state) {
    mutate("tests/data/tokenizer/spm-llama2.tokenizer.json", 600);
    mutate("tests/data/tokenizer/oracle/unigram.tokenizer.json", 300);
    mutate("tests/data/tokenizer/oracle/wordpiece.tokenizer.json", 200);
    mutate("tests/data/tokenizer/oracle/t5.tokenizer.json", 100);
}

static void test_off_and_unwritable(void **state) {
    rm_cache();
    setenv("DFM_TOKENIZER_CACHE", "off", 1);
    dfm_tokenizer_free(load_ok(small_json, 0));
    dfm_tokenizer_free(load_ok(small_json, 0));
    setenv("DFM_TOKENIZER_CACHE", cachedir, 1);
    assert_false(dfm_path_exists(cachedir));
    /* a regular file where the folder should be: writing fails, loading does not */
    char blocker[400];
    snprintf(blocker, sizeof blocker, "%s/blocker", tmpdir);
    write_all(blocker, "x", 1);
    char sub[500];
    snprintf(sub, sizeof sub, "%s/cache", blocker);
    setenv("DFM_TOKENIZER_CACHE", sub, 1);
    dfm_tokenizer_free(load_ok(small_json, 0));
    dfm_tokenizer_free(load_ok(small_json, 0));
    setenv("DFM_TOKENIZER_CACHE", cachedir, 1);
}

/* Several processes load at once with no cache: each parses and renames its own whole file; all get
 * the same ids; afterwards the cache maps and no temporary is left. The real Qwen2.5 file, so the
 * writes overlap, and so the load costs can be compared. */
static void test_racing_processes_and_cost(void **state) {
    rm_cache();
    char *q = qwen_path();
    if (!dfm_path_exists(q)) {
        print_error("MISSING %s: run 'bash scripts/deps.sh'. This test fails rather than skips.\n", q);
        fail();
    }
    enum { KIDS = 3 };
    pid_t kid[KIDS];
    for (int k = 0; k < KIDS; k++) {
        kid[k] = fork();
        assert_true(kid[k] >= 0);
        if (kid[k] == 0) {
            dfm_tokenizer *tok = NULL;
            dfm_ids ids = {0};
            int ok = !dfm_tokenizer_load(q, &tok) && !dfm_tokenizer_encode(tok, TEXT, strlen(TEXT), &ids, NULL) && ids.n > 10;
            _exit(ok ? 0 : 1);
        }
    }
    for (int k = 0; k < KIDS; k++) {
        int wst = 0;
        assert_int_equal(waitpid(kid[k], &wst, 0), kid[k]);
        assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp", cachedir);
    FILE *p = popen(cmd, "r");
    int tmps = -1;
    assert_int_equal(fscanf(p, "%d", &tmps), 1);
    pclose(p);
    assert_int_equal(tmps, 0);

    double c0 = cpu_s();
    dfm_tokenizer *mapped = load_ok(q, 1);
    double c_map = cpu_s() - c0;
    setenv("DFM_TOKENIZER_CACHE", "off", 1);
    c0 = cpu_s();
    dfm_tokenizer *parsed = load_ok(q, 0);
    double c_parse = cpu_s() - c0;
    setenv("DFM_TOKENIZER_CACHE", cachedir, 1);
    print_message("Qwen2.5 load: %.1f ms CPU from the cache, %.1f ms CPU parsing the JSON\n", c_map * 1e3, c_parse * 1e3);
    dfm_ids a = {0}, b = {0};
    encode_text(parsed, &a);
    encode_text(mapped, &b);
    assert_same_ids(&a, &b);
    assert_true(c_map * 4 < c_parse);
    dfm_ids_free(&a), dfm_ids_free(&b);
    dfm_tokenizer_free(parsed), dfm_tokenizer_free(mapped);
    free(q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_written_then_mapped),
        cmocka_unit_test(test_damaged_caches_rebuilt),
        cmocka_unit_test(test_resealed_mutations),
        cmocka_unit_test(test_off_and_unwritable),
        cmocka_unit_test(test_racing_processes_and_cost),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
