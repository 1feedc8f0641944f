/* WordPiece tokenisation against the golden file made with Hugging Face `tokenizers`
 * (tests/data/encoder/wordpiece.golden.jsonl, made by tests/ref/encoder_reference.py golden):
 * 300 real 32-token chunk texts, hard cases (accents, CJK, punctuation, controls, long words,
 * special tokens in the text) and truncation at several lengths. Every case must match exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "encoder/wordpiece.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *model_dir(void) {
    const char *m = getenv("DFM_MODEL");
    return m && *m ? m : "/var/cache/dfm/models/all-MiniLM-L6-v2";
}

static char *golden_path(void) {
    const char *root = getenv("DFM_ROOT");
    return dfm_path_join(root && *root ? root : ".", "tests/data/encoder/wordpiece.golden.jsonl");
}

static void test_golden(void **state) {
    dfm_wordpiece *wp;
    int rc = dfm_wordpiece_load(model_dir(), &wp);
    if (rc) fprintf(stderr, "%s\n", dfm_last_error());
    assert_int_equal(rc, DFM_OK);
    char *path = golden_path();
    FILE *f = fopen(path, "r");
    if (!f) fprintf(stderr, "cannot open %s (run from the repository root or set DFM_ROOT)\n", path);
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int n = 0, ok = 0, n_trunc = 0, header = 1;
    int32_t ids[4096];
    while (getline(&line, &cap, f) > 0) {
        json_error_t err;
        json_t *c = json_loads(line, JSON_ALLOW_NUL, &err);
        assert_non_null(c);
        if (header) {
            header = 0;
            json_decref(c);
            continue;
        }
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t len = json_string_length(json_object_get(c, "text"));
        int max_len = (int)json_integer_value(json_object_get(c, "max_len"));
        json_t *want = json_object_get(c, "ids");
        int tr = -1;
        int k = dfm_wordpiece_encode(wp, text, len, max_len, ids, 4096, &tr);
        int same = k == (int)json_array_size(want);
        for (int i = 0; same && i < k; i++) same = ids[i] == json_integer_value(json_array_get(want, i));
        json_t *wt = json_object_get(c, "truncated");
        if (wt) {
            n_trunc++;
            if (tr != json_is_true(wt)) same = 0;
        }
        if (same) ok++;
        else {
            fprintf(stderr, "MISMATCH %s (max_len %d): got %d ids:", json_string_value(json_object_get(c, "name")), max_len, k);
            for (int i = 0; i < k && i < 40; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n  want %zu:", json_array_size(want));
            for (size_t i = 0; i < json_array_size(want) && i < 40; i++)
                fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(want, i)));
            fprintf(stderr, "\n");
        }
        n++;
        json_decref(c);
    }
    free(line);
    fclose(f);
    free(path);
    printf("wordpiece golden: %d / %d cases identical to HF tokenizers (%d truncation cases)\n", ok, n, n_trunc);
    assert_true(n >= 300);
    assert_int_equal(ok, n);
    /* the capped output: count beyond cap is still reported */
    int k = dfm_wordpiece_encode(wp, "hello world", 11, 0, ids, 1, NULL);
    assert_int_equal(k, 4);
    assert_int_equal(ids[0], dfm_wordpiece_cls_id(wp));
    assert_int_equal(dfm_wordpiece_token_id(wp, "hello"), 7592);
    assert_string_equal(dfm_wordpiece_token(wp, 7592), "hello");
    assert_null(dfm_wordpiece_token(wp, -1));
    dfm_wordpiece_free(wp);
    dfm_wordpiece_free(NULL);
}

static void test_missing_and_unsupported(void **state) {
    dfm_wordpiece *wp;
    assert_int_equal(dfm_wordpiece_load("/nonexistent-model-dir", &wp), DFM_ENOTFOUND);
    assert_non_null(strstr(dfm_last_error(), "tokenizer.json"));
    assert_null(wp);
    char dir[] = "/tmp/dfm-test-wp-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *p = dfm_path_join(dir, "tokenizer.json");
    const char *bpe = "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}";
    assert_int_equal(dfm_write_file_atomic(p, bpe, strlen(bpe)), DFM_OK);
    assert_int_equal(dfm_wordpiece_load(dir, &wp), DFM_EUNSUPPORTED);
    assert_non_null(strstr(dfm_last_error(), "BPE"));
    assert_non_null(strstr(dfm_last_error(), p));
    /* vocab.txt fallback */
    unlink(p);
    char *v = dfm_path_join(dir, "vocab.txt");
    const char *vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n##s\nworld\n,\n";
    assert_int_equal(dfm_write_file_atomic(v, vocab, strlen(vocab)), DFM_OK);
    assert_int_equal(dfm_wordpiece_load(dir, &wp), DFM_OK);
    int32_t ids[16];
    int k = dfm_wordpiece_encode(wp, "Hellos, WORLD zz", 16, 0, ids, 16, NULL);
    int32_t want[] = {2, 4, 5, 7, 6, 1, 3};
    assert_int_equal(k, 7);
    assert_memory_equal(ids, want, sizeof want);
    dfm_wordpiece_free(wp);
    unlink(v);
    rmdir(dir);
    free(p);
    free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_missing_and_unsupported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
