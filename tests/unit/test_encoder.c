/* The encoder on the CPU: the real all-MiniLM-L6-v2 against the independent NumPy reference
 * (tests/data/encoder/reference.jsonl, from tests/ref/encoder_reference.py unitref), a meaning test,
 * batching invariance, counts, and bad model folders (a tiny synthetic BERT written with the
 * safetensors writer): missing files, truncated or inconsistent weights, unsupported architecture. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "encoder/encoder.h"
#include "schemas/safetensors.h"
#include "tests/cuda/check_compare.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *model_dir(void) {
    const char *m = getenv("DFM_MODEL");
    return m && *m ? m : "/var/cache/dfm/models/all-MiniLM-L6-v2";
}

static dfm_encoder *load_real(void) {
    dfm_encoder *enc = NULL;
    int rc = dfm_encoder_load(model_dir(), DFM_DEVICE_CPU, DFM_COMPUTE_F32, &enc);
    if (rc) fprintf(stderr, "%s\n", dfm_last_error());
    assert_int_equal(rc, DFM_OK);
    return enc;
}

static double cosine(const float *a, const float *b, int d) {
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < d; i++) ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / sqrt(aa * bb);
}

static void test_reference(void **state) {
    dfm_encoder *enc = load_real();
    assert_int_equal(dfm_encoder_dim(enc), 384);
    assert_int_equal(dfm_encoder_max_len(enc), 256);
    printf("%s\n", dfm_encoder_describe(enc));
    const char *root = getenv("DFM_ROOT");
    char *path = dfm_path_join(root && *root ? root : ".", "tests/data/encoder/reference.jsonl");
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    const char *texts[64];
    size_t lens[64];
    float *ref = malloc(64 * 384 * sizeof(float));
    json_t *rows[64];
    int n = 0;
    char *line = NULL;
    size_t cap = 0;
    while (n < 64 && getline(&line, &cap, f) > 0) {
        rows[n] = json_loads(line, JSON_ALLOW_NUL, NULL);
        assert_non_null(rows[n]);
        texts[n] = json_string_value(json_object_get(rows[n], "text"));
        lens[n] = json_string_length(json_object_get(rows[n], "text"));
        json_t *e = json_object_get(rows[n], "emb");
        assert_int_equal(json_array_size(e), 384);
        for (int i = 0; i < 384; i++) ref[n * 384 + i] = (float)json_real_value(json_array_get(e, i));
        n++;
    }
    free(line);
    fclose(f);
    free(path);
    assert_true(n >= 20);
    float *out = malloc((size_t)n * 384 * sizeof(float));
    assert_int_equal(dfm_encoder_encode(enc, texts, lens, n, out), DFM_OK);
    double max_err = 0, min_cos = 1;
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < 384; i++) max_err = check_max(max_err, fabs(out[r * 384 + i] - ref[r * 384 + i]));
        min_cos = fmin(min_cos, cosine(out + r * 384, ref + r * 384, 384));
    }
    printf("reference (%d texts): max abs error %.3g, min cosine %.9f\n", n, max_err, min_cos);
    assert_true(max_err <= 1e-4);
    assert_true(min_cos >= 0.99999);
    dfm_encoder_stats st;
    dfm_encoder_get_stats(enc, &st);
    assert_int_equal(st.texts, (uint64_t)n);
    assert_int_equal(st.empty, 1);     /* the "" case */
    assert_int_equal(st.truncated, 1); /* the long case */
    assert_true(st.flops > 0);

    /* batching invariance: one at a time gives the same vectors (to float rounding) */
    assert_int_equal(dfm_encoder_set_batch(enc, 1), DFM_OK);
    float *one = malloc((size_t)n * 384 * sizeof(float));
    assert_int_equal(dfm_encoder_encode(enc, texts, lens, n, one), DFM_OK);
    double d = 0;
    for (int i = 0; i < n * 384; i++) d = check_max(d, fabs(one[i] - out[i]));
    printf("batch 1 vs batch 64: max abs difference %.3g\n", d);
    assert_true(d <= 1e-5);
    /* unit norm */
    for (int r = 0; r < n; r++) {
        double nn = 0;
        for (int i = 0; i < 384; i++) nn += (double)out[r * 384 + i] * out[r * 384 + i];
        assert_true(fabs(nn - 1) < 1e-5);
    }
    for (int r = 0; r < n; r++) json_decref(rows[r]);
    free(one);
    free(out);
    free(ref);
    dfm_encoder_free(enc);
}

static void test_meaning(void **state) {
    dfm_encoder *enc = load_real();
    const char *t[] = {
        "A man is playing a guitar on stage.",   "Someone performs music with a guitar in front of an audience.",
        "The cat sleeps on the warm windowsill.", "A kitten is napping by the sunny window.",
        "How do I reset my password?",           "What are the steps to change my login password?",
        "The stock market fell sharply today.",  "Share prices dropped steeply this afternoon.",
    };
    float e[8 * 384];
    assert_int_equal(dfm_encoder_encode(enc, t, NULL, 8, e), DFM_OK);
    double worst_para = 1, best_unrel = -1;
    for (int i = 0; i < 8; i += 2) worst_para = fmin(worst_para, cosine(e + i * 384, e + (i + 1) * 384, 384));
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++)
            if (i / 2 != j / 2) best_unrel = check_max(best_unrel, cosine(e + i * 384, e + j * 384, 384));
    printf("meaning: weakest paraphrase pair %.3f > strongest unrelated pair %.3f\n", worst_para, best_unrel);
    assert_true(worst_para > best_unrel);
    assert_true(worst_para > 0.5);
    dfm_encoder_free(enc);
}

static void test_device_and_args(void **state) {
    dfm_encoder *enc = NULL;
#ifndef DFM_HAVE_CUDA
    assert_int_equal(dfm_encoder_load(model_dir(), DFM_DEVICE_CUDA, DFM_COMPUTE_F16, &enc), DFM_ECUDA);
    assert_non_null(strstr(dfm_last_error(), "CUDA"));
    assert_int_equal(dfm_encoder_cuda_available(), 0);
#endif
    assert_int_equal(dfm_encoder_load(model_dir(), DFM_DEVICE_CPU, DFM_COMPUTE_F16, &enc), DFM_EUNSUPPORTED);
    assert_int_equal(dfm_encoder_load(model_dir(), 7, DFM_COMPUTE_F32, &enc), DFM_EARG);
    assert_null(enc);
    dfm_encoder_free(NULL);
}

/* ---- a tiny synthetic BERT for the bad-input cases --------------------------------------------------- */
static char tmpdir[256];

static void put(const char *name, const char *text) {
    char *p = dfm_path_join(tmpdir, name);
    assert_int_equal(dfm_write_file_atomic(p, text, strlen(text)), DFM_OK);
    free(p);
}

#define TH 8
#define TL 2
#define TI 16
#define TV 12
#define TP 16

static const char *good_config =
    "{\"architectures\": [\"BertModel\"], \"model_type\": \"bert\", \"hidden_size\": 8, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 2, \"intermediate_size\": 16, \"vocab_size\": 12, \"max_position_embeddings\": 16,"
    " \"type_vocab_size\": 2, \"layer_norm_eps\": 1e-12, \"hidden_act\": \"gelu\"}";

/* write model.safetensors with hidden h, layers l (l may differ from the config to test mismatches) */
static void write_tiny_weights(int h, int layers, int drop_last) {
    dfm_st_write_tensor t[64];
    int64_t shapes[64][2];
    static float buf[1 << 16];
    for (int i = 0; i < (int)(sizeof buf / sizeof *buf); i++) buf[i] = 0.01f * (float)((i * 37) % 23 - 11);
    int n = 0;
#define T2(nm, a, b)                                                                    \
    do {                                                                                \
        shapes[n][0] = a, shapes[n][1] = b;                                             \
        t[n] = (dfm_st_write_tensor){strdup(nm), DFM_ST_F32, (b) ? 2 : 1, shapes[n], buf}; \
        n++;                                                                            \
    } while (0)
    T2("embeddings.word_embeddings.weight", TV, h);
    T2("embeddings.position_embeddings.weight", TP, h);
    T2("embeddings.token_type_embeddings.weight", 2, h);
    T2("embeddings.LayerNorm.weight", h, 0);
    T2("embeddings.LayerNorm.bias", h, 0);
    char nm[128];
    for (int l = 0; l < layers; l++) {
        const char *lin[][3] = {{"attention.self.query", "h", "h"}, {"attention.self.key", "h", "h"},
                                {"attention.self.value", "h", "h"}, {"attention.output.dense", "h", "h"},
                                {"intermediate.dense", "i", "h"},   {"output.dense", "h", "i"}};
        for (int k = 0; k < 6; k++) {
            int a = lin[k][1][0] == 'h' ? h : TI, b = lin[k][2][0] == 'h' ? h : TI;
            snprintf(nm, sizeof nm, "encoder.layer.%d.%s.weight", l, lin[k][0]);
            T2(nm, a, b);
            snprintf(nm, sizeof nm, "encoder.layer.%d.%s.bias", l, lin[k][0]);
            T2(nm, a, 0);
        }
        const char *lns[] = {"attention.output.LayerNorm", "output.LayerNorm"};
        for (int k = 0; k < 2; k++) {
            snprintf(nm, sizeof nm, "encoder.layer.%d.%s.weight", l, lns[k]);
            T2(nm, h, 0);
            snprintf(nm, sizeof nm, "encoder.layer.%d.%s.bias", l, lns[k]);
            T2(nm, h, 0);
        }
    }
#undef T2
    if (drop_last) free((char *)t[--n].name);
    char *p = dfm_path_join(tmpdir, "model.safetensors");
    assert_int_equal(dfm_safetensors_write(p, t, n, NULL), DFM_OK);
    free(p);
    for (int i = 0; i < n; i++) free((char *)t[i].name);
}

static int load_tiny(void) {
    dfm_encoder *enc = NULL;
    int rc = dfm_encoder_load(tmpdir, DFM_DEVICE_CPU, DFM_COMPUTE_F32, &enc);
    if (!rc) {
        const char *txt[2] = {"hello world", ""};
        float out[2 * TH];
        assert_int_equal(dfm_encoder_encode(enc, txt, NULL, 2, out), DFM_OK);
        for (int i = 0; i < 2 * TH; i++) assert_true(isfinite(out[i]));
        dfm_encoder_free(enc);
    } else {
        assert_null(enc);
    }
    return rc;
}

static void expect_msg(const char *a, const char *b) {
    if (!strstr(dfm_last_error(), a) || (b && !strstr(dfm_last_error(), b)))
        fprintf(stderr, "message lacks \"%s\"/\"%s\": %s\n", a, b ? b : "", dfm_last_error());
    assert_non_null(strstr(dfm_last_error(), a));
    if (b) assert_non_null(strstr(dfm_last_error(), b));
}

static void test_bad_models(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dfm-test-enc-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    /* nothing there */
    assert_int_equal(load_tiny(), DFM_ENOTFOUND);
    expect_msg("config.json", "HINT");
    put("config.json", good_config);
    put("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n##s\n,\n.\na\nb\n");
    /* no weights */
    assert_int_equal(load_tiny(), DFM_ENOTFOUND);
    expect_msg("model.safetensors", NULL);
    /* good tiny model loads and runs */
    write_tiny_weights(TH, TL, 0);
    assert_int_equal(load_tiny(), DFM_OK);
    /* unsupported architecture, named */
    put("config.json", "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 8}");
    assert_int_equal(load_tiny(), DFM_EUNSUPPORTED);
    expect_msg("LlamaForCausalLM", "config.json");
    put("config.json", "{\"architectures\": [\"RobertaModel\"], \"model_type\": \"roberta\"}");
    assert_int_equal(load_tiny(), DFM_EUNSUPPORTED);
    expect_msg("RobertaModel", NULL);
    /* a missing config field is named */
    put("config.json", "{\"architectures\": [\"BertModel\"], \"model_type\": \"bert\", \"hidden_size\": 8}");
    assert_int_equal(load_tiny(), DFM_EFORMAT);
    expect_msg("num_hidden_layers", "config.json");
    /* layer_norm_eps out of (0, 1): NaN embeddings otherwise */
    const char *eps_bad[] = {"-1", "0", "1e-60", "2", "\"x\""};
    for (size_t i = 0; i < sizeof eps_bad / sizeof *eps_bad; i++) {
        char cfg[600];
        snprintf(cfg, sizeof cfg,
                 "{\"architectures\": [\"BertModel\"], \"model_type\": \"bert\", \"hidden_size\": 8, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 2, \"intermediate_size\": 16, \"vocab_size\": 12, \"layer_norm_eps\": %s}",
                 eps_bad[i]);
        put("config.json", cfg);
        assert_int_not_equal(load_tiny(), DFM_OK);
        expect_msg("layer_norm_eps", "config.json");
    }
    /* sizes whose weights the file cannot hold are refused before anything is allocated for them */
    put("config.json", "{\"architectures\": [\"BertModel\"], \"model_type\": \"bert\", \"hidden_size\": 16777216,"
        " \"num_hidden_layers\": 16777216, \"num_attention_heads\": 2, \"intermediate_size\": 16777216,"
        " \"vocab_size\": 16777216}");
    assert_int_equal(load_tiny(), DFM_EFORMAT);
    expect_msg("data bytes", "do not belong together");
    put("config.json", good_config);
    /* weights of another shape than the config: names file, tensor, both shapes */
    write_tiny_weights(6, TL, 0);
    assert_int_equal(load_tiny(), DFM_EMISMATCH);
    expect_msg("model.safetensors", "embeddings.word_embeddings.weight");
    expect_msg("[12, 6]", "[12, 8]");
    /* more layers in the file than in the config */
    write_tiny_weights(TH, TL + 1, 0);
    assert_int_equal(load_tiny(), DFM_EMISMATCH);
    expect_msg("num_hidden_layers", NULL);
    /* a tensor missing */
    write_tiny_weights(TH, TL, 1);
    assert_int_equal(load_tiny(), DFM_ENOTFOUND);
    expect_msg("encoder.layer.1.output.LayerNorm.bias", NULL);
    /* truncated weights file */
    write_tiny_weights(TH, TL, 0);
    char *p = dfm_path_join(tmpdir, "model.safetensors");
    uint64_t sz;
    assert_int_equal(dfm_file_size(p, &sz), DFM_OK);
    assert_int_equal(truncate(p, (off_t)sz - 10), 0);
    assert_int_equal(load_tiny(), DFM_EFORMAT);
    expect_msg("model.safetensors", "truncated");
    /* header cut */
    assert_int_equal(truncate(p, 100), 0);
    assert_int_equal(load_tiny(), DFM_ETRUNCATED);
    free(p);
    /* bad pooling config */
    write_tiny_weights(TH, TL, 0);
    char *pd = dfm_path_join(tmpdir, "1_Pooling");
    assert_int_equal(dfm_mkdir_p(pd), DFM_OK);
    free(pd);
    put("1_Pooling/config.json", "{\"pooling_mode_mean_tokens\": true, \"pooling_mode_cls_token\": true}");
    assert_int_equal(load_tiny(), DFM_EUNSUPPORTED);
    expect_msg("1_Pooling/config.json", NULL);
    put("1_Pooling/config.json", "{\"pooling_mode_cls_token\": true, \"word_embedding_dimension\": 8}");
    assert_int_equal(load_tiny(), DFM_OK);
    put("1_Pooling/config.json", "{\"pooling_mode_max_tokens\": true}");
    assert_int_equal(load_tiny(), DFM_OK);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_meaning),
        cmocka_unit_test(test_device_and_args),
        cmocka_unit_test(test_bad_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
