/* bert_model.c — loading a BERT-family model folder, tokenising, length-bucketed batching and the
 * device dispatch of the encoder (encoder.h). The forward passes are in bert_cpu.c / bert_cuda.cu. */
#include "encoder/bert.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "schemas/safetensors.h"

#include <cblas.h>
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- config ------------------------------------------------------------------------------------ */
static int cfg_int(json_t *root, const char *file, const char *key, int dflt, int *out) {
    json_t *v = json_object_get(root, key);
    if (!v) {
        if (dflt < 0) return DFM_FAIL(DFM_EFORMAT, "%s: field \"%s\" is missing", file, key);
        *out = dflt;
        return DFM_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 24))
        return DFM_FAIL(DFM_EFORMAT, "%s: field \"%s\" must be a positive integer", file, key);
    *out = (int)json_integer_value(v);
    return DFM_OK;
}

static int is_bert_arch(const char *a) {
    return !strcmp(a, "BertModel") || !strncmp(a, "BertFor", 7);
}

static int load_config(const char *dir, dfm_bert_config *c) {
    char *file = dfm_path_join(dir, "config.json");
    if (!file) return DFM_FAIL(DFM_ENOMEM, "no memory");
    int rc = DFM_OK;
    json_error_t err;
    json_t *root = NULL;
    if (!dfm_path_exists(file)) {
        rc = DFM_FAIL(DFM_ENOTFOUND, "%s: not found. HINT: --model must be a Hugging Face model folder (config.json, "
                      "model.safetensors, tokenizer.json); run 'make deps' for the default all-MiniLM-L6-v2", file);
        goto done;
    }
    root = json_load_file(file, 0, &err);
    if (!root || !json_is_object(root)) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: invalid JSON at line %d: %s", file, err.line, root ? "not an object" : err.text);
        goto done;
    }
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    json_t *archs = json_object_get(root, "architectures");
    const char *arch = json_string_value(json_array_get(archs, 0));
    int ok = mt ? !strcmp(mt, "bert") : 0;
    if (arch && !is_bert_arch(arch)) ok = 0;
    if (!mt && arch && is_bert_arch(arch)) ok = 1;
    if (!ok) {
        rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: unsupported architecture \"%s\" (model_type \"%s\"); the encoder runs "
                      "BERT-family models (\"architectures\": [\"BertModel\"], \"model_type\": \"bert\"). HINT: pick a "
                      "BERT-based sentence-transformers model (all-MiniLM-L6-v2, bge-small-en, e5-small, gte-small)",
                      file, arch ? arch : "(none)", mt ? mt : "(none)");
        goto done;
    }
    snprintf(c->arch, sizeof c->arch, "%s", arch ? arch : "BertModel");
    if ((rc = cfg_int(root, file, "hidden_size", -1, &c->hidden)) || (rc = cfg_int(root, file, "num_hidden_layers", -1, &c->layers)) ||
        (rc = cfg_int(root, file, "num_attention_heads", -1, &c->heads)) ||
        (rc = cfg_int(root, file, "intermediate_size", -1, &c->inter)) || (rc = cfg_int(root, file, "vocab_size", -1, &c->vocab)) ||
        (rc = cfg_int(root, file, "max_position_embeddings", 512, &c->max_pos)) ||
        (rc = cfg_int(root, file, "type_vocab_size", 2, &c->type_vocab)))
        goto done;
    if (c->hidden % c->heads) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d", file, c->hidden, c->heads);
        goto done;
    }
    json_t *eps = json_object_get(root, "layer_norm_eps");
    if (eps && !json_is_number(eps)) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: field \"layer_norm_eps\" must be a number", file);
        goto done;
    }
    double e = eps ? json_number_value(eps) : 1e-12;
    /* eps <= 0 lets a constant row divide by zero (NaN embeddings); eps >= 1 is no layer norm at all */
    if (!(e > 0 && e < 1) || (float)e == 0.0f) {
        rc = DFM_FAIL(DFM_ERANGE, "%s: layer_norm_eps %g is outside (0, 1) (BERT models use 1e-12). HINT: the "
                      "config.json is corrupt or not the one published with the model", file, e);
        goto done;
    }
    c->ln_eps = (float)e;
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    if (act && strcmp(act, "gelu")) {
        rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported (only \"gelu\", the erf form)", file, act);
        goto done;
    }
    const char *pe = json_string_value(json_object_get(root, "position_embedding_type"));
    if (pe && strcmp(pe, "absolute")) {
        rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: position_embedding_type \"%s\" is not supported (only \"absolute\")", file, pe);
        goto done;
    }
done:
    json_decref(root);
    free(file);
    return rc;
}

/* sentence-transformers side files: max length, pooling, normalisation (all optional) */
static int load_st_config(const char *dir, dfm_bert_config *c) {
    c->pooling = DFM_POOL_MEAN;
    c->normalize = 0;
    c->max_len = c->max_pos < 512 ? c->max_pos : 512;
    char *f = dfm_path_join(dir, "sentence_bert_config.json");
    int rc = DFM_OK;
    json_error_t err;
    if (f && dfm_path_exists(f)) {
        json_t *j = json_load_file(f, 0, &err);
        json_t *m = json_object_get(j, "max_seq_length");
        if (!j) rc = DFM_FAIL(DFM_EFORMAT, "%s: invalid JSON at line %d: %s", f, err.line, err.text);
        else if (m && (!json_is_integer(m) || json_integer_value(m) < 2))
            rc = DFM_FAIL(DFM_EFORMAT, "%s: \"max_seq_length\" must be an integer >= 2", f);
        else if (m)
            c->max_len = (int)json_integer_value(m);
        json_decref(j);
    }
    free(f);
    DFM_TRY(rc);
    if (c->max_len > c->max_pos) c->max_len = c->max_pos;
    /* modules.json: pooling folder and Normalize */
    char *pool_dir = strdup("1_Pooling");
    f = dfm_path_join(dir, "modules.json");
    if (f && dfm_path_exists(f)) {
        json_t *j = json_load_file(f, 0, &err);
        if (!j || !json_is_array(j)) rc = DFM_FAIL(DFM_EFORMAT, "%s: expected a JSON array of modules", f);
        size_t i;
        json_t *mod;
        json_array_foreach(j, i, mod) {
            const char *type = json_string_value(json_object_get(mod, "type"));
            const char *path = json_string_value(json_object_get(mod, "path"));
            if (!type) continue;
            if (strstr(type, "Normalize")) c->normalize = 1;
            if (strstr(type, "Pooling") && path) {
                free(pool_dir);
                pool_dir = strdup(path);
            }
        }
        json_decref(j);
    }
    free(f);
    if (rc || !pool_dir) {
        free(pool_dir);
        return rc ? rc : DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    char *pd = dfm_path_join(dir, pool_dir);
    f = pd ? dfm_path_join(pd, "config.json") : NULL;
    free(pd);
    free(pool_dir);
    if (f && dfm_path_exists(f)) {
        json_t *j = json_load_file(f, 0, &err);
        if (!j) rc = DFM_FAIL(DFM_EFORMAT, "%s: invalid JSON at line %d: %s", f, err.line, err.text);
        else {
            int mean = json_is_true(json_object_get(j, "pooling_mode_mean_tokens"));
            int cls = json_is_true(json_object_get(j, "pooling_mode_cls_token"));
            int mx = json_is_true(json_object_get(j, "pooling_mode_max_tokens"));
            int other = json_is_true(json_object_get(j, "pooling_mode_mean_sqrt_len_tokens")) ||
                        json_is_true(json_object_get(j, "pooling_mode_weightedmean_tokens")) ||
                        json_is_true(json_object_get(j, "pooling_mode_lasttoken"));
            json_t *dim = json_object_get(j, "word_embedding_dimension");
            if (mean + cls + mx != 1 || other)
                rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: exactly one of pooling_mode_mean_tokens / _cls_token / "
                              "_max_tokens must be true (other modes are not supported)", f);
            else if (dim && json_integer_value(dim) != c->hidden)
                rc = DFM_FAIL(DFM_EMISMATCH, "%s: word_embedding_dimension %lld but config.json hidden_size %d", f,
                              (long long)json_integer_value(dim), c->hidden);
            else
                c->pooling = mean ? DFM_POOL_MEAN : cls ? DFM_POOL_CLS : DFM_POOL_MAX;
        }
        json_decref(j);
    }
    free(f);
    return rc;
}

/* ---- weights ----------------------------------------------------------------------------------- */
static int load_tensor(const dfm_safetensors *st, const char *prefix, const char *name, int ndim, int64_t d0,
                       int64_t d1, float *dst) {
    char full[256];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    int64_t shape[2] = {d0, d1};
    const dfm_st_tensor *t;
    DFM_TRY(dfm_safetensors_get(st, full, ndim, shape, &t));
    return dfm_st_to_f32(t, dst);
}

static int load_weights(dfm_encoder *enc, const char *dir) {
    const dfm_bert_config *c = &enc->cfg;
    char *file = dfm_path_join(dir, "model.safetensors");
    if (!file) return DFM_FAIL(DFM_ENOMEM, "no memory");
    dfm_safetensors *st = NULL;
    int rc = dfm_safetensors_open(file, &st);
    if (rc) {
        if (rc == DFM_ENOTFOUND && dfm_path_exists(dir)) {
            char *bin = dfm_path_join(dir, "pytorch_model.bin");
            if (bin && dfm_path_exists(bin))
                rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: not found, only pytorch_model.bin. HINT: convert it once with "
                              "safetensors.torch.save_file (see scripts/deps.sh)", file);
            free(bin);
        }
        free(file);
        return rc;
    }
    enc->model_hash = XXH3_64bits(st->map, st->map_bytes);
    const char *pfx = "";
    if (!dfm_safetensors_find(st, "embeddings.word_embeddings.weight") &&
        dfm_safetensors_find(st, "bert.embeddings.word_embeddings.weight"))
        pfx = "bert.";
    /* config.json's sizes (each up to 2^24) are claims: the weights they imply must be stored in the file,
     * at 2 bytes or more each, before anything is allocated for them (128-bit arithmetic: no wrap-around) */
    unsigned __int128 H1 = (unsigned)c->hidden, F1 = (unsigned)c->inter;
    unsigned __int128 per_layer = 3 * H1 * H1 + 3 * H1 + H1 * H1 + H1 + 2 * H1 + F1 * H1 + F1 + H1 * F1 + H1 + 2 * H1;
    unsigned __int128 n128 = (unsigned)c->vocab * H1 + (unsigned)c->max_pos * H1 + (unsigned)c->type_vocab * H1 +
                             2 * H1 + per_layer * (unsigned)c->layers;
    if (n128 * 2 > st->data_bytes) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: its config.json (hidden_size %d, num_hidden_layers %d, intermediate_size %d, "
                      "vocab_size %d) implies %.3g weights, more than the %llu data bytes of the file can hold. HINT: "
                      "config.json and model.safetensors do not belong together", file, c->hidden, c->layers, c->inter,
                      c->vocab, (double)n128, (unsigned long long)st->data_bytes);
        dfm_safetensors_close(st);
        free(file);
        return rc;
    }
    size_t n = (size_t)n128;
    int64_t H = c->hidden, FF = c->inter;
    dfm_bert_weights *w = &enc->w;
    w->mem = malloc(n * sizeof(float));
    w->layer = calloc(c->layers, sizeof *w->layer);
    if (!w->mem || !w->layer) {
        rc = DFM_FAIL(DFM_ENOMEM, "no memory for %zu weights of %s", n, file);
        dfm_safetensors_close(st);
        free(file);
        return rc;
    }
    w->n_floats = n;
    float *p = w->mem;
#define CARVE(dst, count) (dst = p, p += (count))
    CARVE(w->wte, (size_t)c->vocab * H);
    CARVE(w->wpe, (size_t)c->max_pos * H);
    CARVE(w->wtt, (size_t)c->type_vocab * H);
    CARVE(w->emb_ln_w, H);
    CARVE(w->emb_ln_b, H);
    if (!rc) rc = load_tensor(st, pfx, "embeddings.word_embeddings.weight", 2, c->vocab, H, w->wte);
    if (!rc) rc = load_tensor(st, pfx, "embeddings.position_embeddings.weight", 2, c->max_pos, H, w->wpe);
    if (!rc) rc = load_tensor(st, pfx, "embeddings.token_type_embeddings.weight", 2, c->type_vocab, H, w->wtt);
    if (!rc) rc = load_tensor(st, pfx, "embeddings.LayerNorm.weight", 1, H, 0, w->emb_ln_w);
    if (!rc) rc = load_tensor(st, pfx, "embeddings.LayerNorm.bias", 1, H, 0, w->emb_ln_b);
    for (int l = 0; l < c->layers && !rc; l++) {
        struct bert_layer *L = &w->layer[l];
        CARVE(L->qkv_w, 3 * H * H);
        CARVE(L->qkv_b, 3 * H);
        CARVE(L->ao_w, H * H);
        CARVE(L->ao_b, H);
        CARVE(L->ln1_w, H);
        CARVE(L->ln1_b, H);
        CARVE(L->fc_w, FF * H);
        CARVE(L->fc_b, FF);
        CARVE(L->proj_w, H * FF);
        CARVE(L->proj_b, H);
        CARVE(L->ln2_w, H);
        CARVE(L->ln2_b, H);
        char nm[128];
#define LT(suffix, nd, a, b, dst)                                                    \
    if (!rc) {                                                                       \
        snprintf(nm, sizeof nm, "encoder.layer.%d.%s", l, suffix);                   \
        rc = load_tensor(st, pfx, nm, nd, a, b, dst);                                \
    }
        LT("attention.self.query.weight", 2, H, H, L->qkv_w);
        LT("attention.self.key.weight", 2, H, H, L->qkv_w + H * H);
        LT("attention.self.value.weight", 2, H, H, L->qkv_w + 2 * H * H);
        LT("attention.self.query.bias", 1, H, 0, L->qkv_b);
        LT("attention.self.key.bias", 1, H, 0, L->qkv_b + H);
        LT("attention.self.value.bias", 1, H, 0, L->qkv_b + 2 * H);
        LT("attention.output.dense.weight", 2, H, H, L->ao_w);
        LT("attention.output.dense.bias", 1, H, 0, L->ao_b);
        LT("attention.output.LayerNorm.weight", 1, H, 0, L->ln1_w);
        LT("attention.output.LayerNorm.bias", 1, H, 0, L->ln1_b);
        LT("intermediate.dense.weight", 2, FF, H, L->fc_w);
        LT("intermediate.dense.bias", 1, FF, 0, L->fc_b);
        LT("output.dense.weight", 2, H, FF, L->proj_w);
        LT("output.dense.bias", 1, H, 0, L->proj_b);
        LT("output.LayerNorm.weight", 1, H, 0, L->ln2_w);
        LT("output.LayerNorm.bias", 1, H, 0, L->ln2_b);
#undef LT
    }
#undef CARVE
    if (!rc) {
        /* more layers in the file than the config says is a mismatch too */
        char nm[128];
        snprintf(nm, sizeof nm, "%sencoder.layer.%d.attention.self.query.weight", pfx, c->layers);
        if (dfm_safetensors_find(st, nm))
            rc = DFM_FAIL(DFM_EMISMATCH, "%s: holds tensor \"%s\" but config.json says num_hidden_layers = %d. HINT: "
                          "config.json and the weights do not belong together", file, nm, c->layers);
    }
    if (rc) dfm_error_prefix("loading the encoder from %s (config.json: hidden %d, layers %d, intermediate %d, vocab %d)",
                             dir, c->hidden, c->layers, c->inter, c->vocab);
    dfm_safetensors_close(st);
    free(file);
    return rc;
}

/* ---- public API -------------------------------------------------------------------------------- */
int dfm_encoder_cuda_available(void) { return bert_cuda_device_count() > 0; }

void dfm_encoder_free(dfm_encoder *enc) {
    if (!enc) return;
    if (enc->cuda) bert_cuda_free(enc);
    dfm_wordpiece_free(enc->wp);
    free(enc->w.mem);
    free(enc->w.layer);
    bert_cpu_free(enc);
    free(enc->model_dir);
    free(enc);
}

static void describe(dfm_encoder *enc) {
    static const char *pools[] = {"mean", "cls", "max"};
    const dfm_bert_config *c = &enc->cfg;
    snprintf(enc->desc, sizeof enc->desc, "%s %d layers, hidden %d, %d heads, %s pooling, max %d tokens, %s %s",
             c->arch, c->layers, c->hidden, c->heads, pools[c->pooling], c->max_len,
             enc->device == DFM_DEVICE_CUDA ? "cuda" : "cpu", dfm_encoder_precision_name(enc->compute));
}

static const char *const precisions[] = {"fp32", "fp16", "bf16", "int8"};

int dfm_encoder_precision_parse(const char *s) {
    for (int i = 0; s && i < 4; i++)
        if (!strcmp(s, precisions[i])) return i;
    return -1;
}

const char *dfm_encoder_precision_name(int compute) {
    return compute >= 0 && compute < 4 ? precisions[compute] : "?";
}

int dfm_encoder_load(const char *model_dir, int device, int compute, dfm_encoder **out) {
    *out = NULL;
    if (device != DFM_DEVICE_CPU && device != DFM_DEVICE_CUDA)
        return DFM_FAIL(DFM_EARG, "encoder device %d is not cpu (0) or cuda (1)", device);
    if (compute < DFM_COMPUTE_F32 || compute > DFM_COMPUTE_INT8)
        return DFM_FAIL(DFM_EARG, "encoder precision %d is not fp32/fp16/bf16/int8", compute);
    if (device == DFM_DEVICE_CPU && compute == DFM_COMPUTE_F16)
        return DFM_FAIL(DFM_EUNSUPPORTED, "the CPU encoder has no fp16 path. HINT: use --precision fp32, bf16 or int8 on "
                        "the CPU (--dtype fp16 still stores fp16 embeddings)");
    if (device == DFM_DEVICE_CUDA && compute == DFM_COMPUTE_INT8)
        return DFM_FAIL(DFM_EUNSUPPORTED, "the CUDA encoder has no int8 path. HINT: use --precision fp16, bf16 or fp32 on "
                        "the GPU (int8 is the CPU's VNNI path)");
#ifndef DFM_HAVE_CUDA
    if (device == DFM_DEVICE_CUDA)
        return DFM_FAIL(DFM_ECUDA, "--device cuda, but this dfm was built without CUDA. HINT: rebuild with 'make "
                        "CUDA=1' on a machine with nvcc, or use --device cpu");
#else
    if (device == DFM_DEVICE_CUDA && bert_cuda_device_count() <= 0)
        return DFM_FAIL(DFM_ECUDA, "--device cuda, but no CUDA GPU is visible (driver missing, CUDA_VISIBLE_DEVICES "
                        "empty, or no device). HINT: run on a GPU node or use --device cpu");
#endif
    dfm_encoder *enc = calloc(1, sizeof *enc);
    if (!enc) return DFM_FAIL(DFM_ENOMEM, "no memory");
    enc->device = device;
    enc->compute = compute;
    enc->batch = device == DFM_DEVICE_CUDA ? 1024 : 64;
    enc->batch_tokens = device == DFM_DEVICE_CUDA ? 65536 : 8192;
    enc->model_dir = strdup(model_dir);
    int rc = enc->model_dir ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = load_config(model_dir, &enc->cfg);
    if (!rc) rc = load_st_config(model_dir, &enc->cfg);
    if (!rc) rc = dfm_wordpiece_load(model_dir, &enc->wp);
    if (!rc && dfm_wordpiece_vocab_size(enc->wp) > (uint32_t)enc->cfg.vocab)
        rc = DFM_FAIL(DFM_EMISMATCH, "%s: the tokenizer has %u tokens but config.json vocab_size is %d", model_dir,
                      dfm_wordpiece_vocab_size(enc->wp), enc->cfg.vocab);
    if (!rc) rc = load_weights(enc, model_dir);
    if (!rc && device == DFM_DEVICE_CUDA) rc = bert_cuda_init(enc);
    if (!rc && device == DFM_DEVICE_CPU) rc = bert_cpu_init(enc);
    if (rc) {
        dfm_encoder_free(enc);
        return rc;
    }
    if (!enc->cfg.normalize)
        DFM_LOG_D("%s: modules.json has no Normalize module; embeddings are L2-normalised anyway", model_dir);
    if (device == DFM_DEVICE_CPU) {
        openblas_set_num_threads(1); /* the BLAS fallback runs inside the forward's own OpenMP threads */
        DFM_LOG_D("%s: CPU GEMM kernel %s", model_dir, bert_cpu_kernel(enc));
    }
    describe(enc);
    *out = enc;
    return DFM_OK;
}

int dfm_encoder_dim(const dfm_encoder *enc) { return enc->cfg.hidden; }
int dfm_encoder_max_len(const dfm_encoder *enc) { return enc->cfg.max_len; }
uint64_t dfm_encoder_model_hash(const dfm_encoder *enc) { return enc->model_hash; }
const char *dfm_encoder_describe(const dfm_encoder *enc) { return enc->desc; }
void dfm_encoder_get_stats(const dfm_encoder *enc, dfm_encoder_stats *st) { *st = enc->stats; }

int dfm_encoder_set_max_len(dfm_encoder *enc, int max_len) {
    if (max_len < 2 || max_len > enc->cfg.max_pos)
        return DFM_FAIL(DFM_EARG, "max length %d must be in [2, %d] (max_position_embeddings)", max_len, enc->cfg.max_pos);
    enc->cfg.max_len = max_len;
    describe(enc);
    return DFM_OK;
}

int dfm_encoder_set_batch(dfm_encoder *enc, int batch) {
    if (batch < 1 || batch > 65536) return DFM_FAIL(DFM_EARG, "--batch %d must be in [1, 65536]", batch);
    enc->batch = batch;
    return DFM_OK;
}

int dfm_encoder_tokenize(const dfm_encoder *enc, const char *text, size_t len, int32_t *ids, int cap, int *truncated) {
    return dfm_wordpiece_encode(enc->wp, text, len, enc->cfg.max_len, ids, cap, truncated);
}

double bert_batch_flops(const dfm_bert_config *c, const dfm_bert_batch *b) {
    double H = c->hidden, FF = c->inter, M = b->n_tok, att = 0;
    for (int s = 0; s < b->n_seq; s++) {
        double T = b->off[s + 1] - b->off[s];
        att += 4.0 * T * T * H; /* QK^T and AV, 2 flops per MAC */
    }
    return c->layers * (2.0 * M * (4 * H * H + 2 * H * FF) + att);
}

typedef struct {
    int len;
    int idx;
} len_idx;

static int cmp_len(const void *a, const void *b) {
    const len_idx *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

int dfm_encoder_encode(dfm_encoder *enc, const char *const *texts, const size_t *lens, int n, float *out) {
    if (n <= 0) return n < 0 ? DFM_FAIL(DFM_EARG, "negative text count %d", n) : DFM_OK;
    int T = enc->cfg.max_len, H = enc->cfg.hidden;
    int32_t *ids = malloc((size_t)n * T * sizeof *ids);
    len_idx *li = malloc((size_t)n * sizeof *li);
    int *off = malloc(((size_t)enc->batch + 1) * sizeof *off);
    int32_t *packed = malloc((size_t)enc->batch * T * sizeof *packed);
    float *pooled = malloc((size_t)enc->batch * H * sizeof *pooled);
    if (!ids || !li || !off || !packed || !pooled) {
        free(ids), free(li), free(off), free(packed), free(pooled);
        return DFM_FAIL(DFM_ENOMEM, "no memory for a window of %d texts", n);
    }
    double t0 = dfm_now();
    int rc = DFM_OK;
    char emsg[1024] = "";
    uint64_t n_trunc = 0, n_empty = 0;
#pragma omp parallel for schedule(dynamic, 16) reduction(+ : n_trunc, n_empty)
    for (int i = 0; i < n; i++) {
        int tr = 0;
        size_t len = lens ? lens[i] : strlen(texts[i]);
        int k = dfm_wordpiece_encode(enc->wp, texts[i], len, T, ids + (size_t)i * T, T, &tr);
        if (k < 0) {
#pragma omp critical(dfm_encode_rc)
            if (!rc) {
                rc = k; /* the message lives in this worker thread: carry it over */
                snprintf(emsg, sizeof emsg, "%s", dfm_last_error());
            }
            li[i].len = 2;
            li[i].idx = i;
            continue;
        }
        li[i].len = k;
        li[i].idx = i;
        n_trunc += tr;
        n_empty += k <= 2;
    }
    double t1 = dfm_now();
    enc->stats.tokenize_s += t1 - t0;
    if (rc) rc = DFM_FAIL(rc, "tokenizing: %s", emsg);
    if (!rc) {
        /* length bucketing: sorted by token count, batches of similar length */
        qsort(li, n, sizeof *li, cmp_len);
        for (int s = 0, nb; s < n && !rc; s += nb) {
            /* up to enc->batch texts and about enc->batch_tokens tokens (bounded activations) */
            int tok = 0;
            for (nb = 0; s + nb < n && nb < enc->batch; nb++) {
                if (nb > 0 && tok + li[s + nb].len > enc->batch_tokens) break;
                tok += li[s + nb].len;
            }
            dfm_bert_batch b = {.n_seq = nb, .ids = packed, .off = off, .max_seq_len = 0};
            off[0] = 0;
            for (int j = 0; j < nb; j++) {
                const len_idx *e = &li[s + j];
                memcpy(packed + off[j], ids + (size_t)e->idx * T, e->len * sizeof *packed);
                off[j + 1] = off[j] + e->len;
                if (e->len > b.max_seq_len) b.max_seq_len = e->len;
            }
            b.n_tok = off[nb];
            rc = enc->device == DFM_DEVICE_CUDA ? bert_forward_cuda(enc, &b, pooled) : bert_forward_cpu(enc, &b, pooled);
            for (int j = 0; j < nb && !rc; j++)
                memcpy(out + (size_t)li[s + j].idx * H, pooled + (size_t)j * H, H * sizeof(float));
            enc->stats.flops += bert_batch_flops(&enc->cfg, &b);
            enc->stats.tokens += b.n_tok;
        }
    }
    enc->stats.forward_s += dfm_now() - t1;
    if (!rc) {
        enc->stats.texts += n;
        enc->stats.truncated += n_trunc;
        enc->stats.empty += n_empty;
    }
    free(ids), free(li), free(off), free(packed), free(pooled);
    return rc;
}

#ifndef DFM_HAVE_CUDA
/* Built without CUDA: the GPU entry points exist and say so. Weak, so that a program linking encoder/bert_cuda.cu
 * built for the host emulation of CUDA (tests/cuda/encoder_cuda_check.cu) gets the real ones. */
__attribute__((weak)) int bert_cuda_device_count(void) { return 0; }
__attribute__((weak)) int bert_cuda_init(dfm_encoder *enc) {
    return DFM_FAIL(DFM_ECUDA, "this dfm was built without CUDA. HINT: rebuild with 'make CUDA=1'");
}
__attribute__((weak)) void bert_cuda_free(dfm_encoder *enc) {}
__attribute__((weak)) int bert_forward_cuda(dfm_encoder *enc, const dfm_bert_batch *b, float *out) {
    return DFM_FAIL(DFM_ECUDA, "this dfm was built without CUDA. HINT: rebuild with 'make CUDA=1'");
}
#endif
