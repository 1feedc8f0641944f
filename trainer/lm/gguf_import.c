/* gguf_import.c — GGUF file -> Hugging Face folder (config.json, model.safetensors F32, tokenizer.json,
 * tokenizer_config.json). See gguf_import.h. */
#include "trainer/lm/gguf_import.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "tokenizer/tokenizer.h"
#include "schemas/gguf.h"
#include "schemas/safetensors.h"
#include "trainer/model/model_config.h"

/* ---- the decoder's hyper-parameters ------------------------------------------------------------------ */

/* "{arch}.{name}" */
static const char *akey(const char *arch, const char *name) {
    static __thread char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, name);
    return k;
}

static int refuse_if_present(const dfm_gguf *g, const char *arch, const char *name, const char *why) {
    const dfm_gguf_kv *kv = dfm_gguf_find(g, akey(arch, name));
    if (!kv) return DFM_OK;
    uint32_t v = 1;
    if (kv->type != DFM_GGUF_STRING && kv->type != DFM_GGUF_ARRAY && !dfm_gguf_get_u32(g, akey(arch, name), 1, 0, &v) &&
        v == 0)
        return DFM_OK; /* e.g. expert_count 0 */
    dfm_error_clear();
    return DFM_FAIL(DFM_EUNSUPPORTED, "%s: %s is set: %s, which dfm-train's decoder does not implement", g->path,
                    akey(arch, name), why);
}

/* {arch}.{name} as an integer within lo..hi (def when absent and not required); a value outside names the key
 * and the value, before anything is sized by it */
static int hparam(const dfm_gguf *g, const char *arch, const char *name, int required, uint32_t def, uint64_t lo,
                  uint64_t hi, uint32_t *out) {
    uint64_t v;
    DFM_TRY(dfm_gguf_get_u64(g, akey(arch, name), required, def, &v));
    if (v < lo || v > hi)
        return DFM_FAIL(DFM_ERANGE, "%s: %s is %llu, outside %llu..%llu (the limits of dfm-train's decoder, "
                        "trainer/model/model_config.h). HINT: the file is damaged, or not a model dfm-train can run",
                        g->path, akey(arch, name), (unsigned long long)v, (unsigned long long)lo,
                        (unsigned long long)hi);
    *out = (uint32_t)v;
    return DFM_OK;
}

static int read_hparams(const dfm_gguf *g, const char *arch, BackboneConfig *bc, uint32_t *ctx_len) {
    memset(bc, 0, sizeof *bc);
    int llama = !strcmp(arch, "llama"), qwen3 = !strcmp(arch, "qwen3");
    if (!llama && !qwen3)
        return DFM_FAIL(DFM_EUNSUPPORTED, "%s: general.architecture \"%s\" is not supported. HINT: dfm-train runs Llama- "
                        "and Qwen3-architecture decoders (llama, qwen3)", g->path, arch);
    snprintf(bc->arch, sizeof bc->arch, "%s", llama ? "LlamaForCausalLM" : "Qwen3ForCausalLM");
    uint32_t nl, C, ffn, nh, nkv, hd = 0, kl = 0, vl = 0, rd = 0;
    /* every count is bounded before it sizes anything: by the decoder's limits, and the layers also by the
     * tensors the file holds (9 or more per layer) */
    DFM_TRY(hparam(g, arch, "block_count", 1, 0, 1, DFM_MAX_LAYERS, &nl));
    if (nl > g->n_tensors / 9)
        return DFM_FAIL(DFM_EFORMAT, "%s: %s is %u, but the file holds %llu tensors, fewer than the 9 of each layer",
                        g->path, akey(arch, "block_count"), nl, (unsigned long long)g->n_tensors);
    DFM_TRY(hparam(g, arch, "embedding_length", 1, 0, 1, DFM_MAX_HIDDEN, &C));
    DFM_TRY(hparam(g, arch, "feed_forward_length", 1, 0, 1, DFM_MAX_FFN, &ffn));
    DFM_TRY(hparam(g, arch, "attention.head_count", 1, 0, 1, DFM_MAX_HEADS, &nh));
    const dfm_gguf_kv *kvh = dfm_gguf_find(g, akey(arch, "attention.head_count_kv"));
    if (kvh && kvh->type == DFM_GGUF_ARRAY)
        return DFM_FAIL(DFM_EUNSUPPORTED, "%s: %s is a per-layer list; dfm-train needs one head count for every layer",
                        g->path, akey(arch, "attention.head_count_kv"));
    DFM_TRY(hparam(g, arch, "attention.head_count_kv", 0, nh, 1, nh, &nkv));
    if (nh % nkv)
        return DFM_FAIL(DFM_EFORMAT, "%s: %u heads are not a multiple of %u KV heads", g->path, nh, nkv);
    DFM_TRY(hparam(g, arch, "attention.key_length", 0, 0, 0, DFM_MAX_HEAD_DIM, &kl));
    DFM_TRY(hparam(g, arch, "attention.value_length", 0, kl, 0, DFM_MAX_HEAD_DIM, &vl));
    DFM_TRY(hparam(g, arch, "rope.dimension_count", 0, 0, 0, DFM_MAX_HEAD_DIM, &rd));
    hd = kl ? kl : C / nh;
    if (vl != kl)
        return DFM_FAIL(DFM_EUNSUPPORTED, "%s: key length %u differs from value length %u", g->path, kl, vl);
    if (rd && rd != hd)
        return DFM_FAIL(DFM_EUNSUPPORTED, "%s: RoPE on %u of a head's %u dimensions (partial rotary) is not supported",
                        g->path, rd, hd);
    DFM_TRY(refuse_if_present(g, arch, "rope.scaling.type", "rope scaling"));
    DFM_TRY(refuse_if_present(g, arch, "rope.scaling.factor", "rope scaling"));
    DFM_TRY(refuse_if_present(g, arch, "expert_count", "a mixture of experts"));
    DFM_TRY(refuse_if_present(g, arch, "attention.sliding_window", "sliding-window attention"));
    bc->dec.n_layers = (int)nl;
    bc->dec.hidden = (int)C;
    bc->dec.ffn = (int)ffn;
    bc->dec.n_heads = (int)nh;
    bc->dec.n_kv_heads = (int)nkv;
    bc->dec.head_dim = (int)hd;
    bc->dec.qk_norm = qwen3;
    DFM_TRY(dfm_gguf_get_f32(g, akey(arch, "attention.layer_norm_rms_epsilon"), 1, 0, &bc->dec.eps));
    DFM_TRY(dfm_gguf_get_f32(g, akey(arch, "rope.freq_base"), 0, 10000.0f, &bc->dec.rope_theta));
    DFM_TRY(dfm_gguf_get_u32(g, akey(arch, "context_length"), 0, 4096, ctx_len));
    const dfm_gguf_tensor *emb = dfm_gguf_tensor_find(g, "token_embd.weight");
    if (!emb)
        return DFM_FAIL(DFM_ENOTFOUND, "%s: no token_embd.weight tensor. HINT: not a decoder LM file", g->path);
    bc->vocab_size = (int)(emb->ne[1] < DFM_MAX_VOCAB ? emb->ne[1] : 0);
    if (emb->n_dims != 2 || emb->ne[0] != (int64_t)C || !bc->vocab_size)
        return DFM_FAIL(DFM_EFORMAT, "%s: token_embd.weight is not [%u, V] with V < 2^24", g->path, C);
    bc->tie_embeddings = !dfm_gguf_tensor_find(g, "output.weight");
    bc->max_seq = (int)(*ctx_len < 0x7fffffff ? *ctx_len : 0x7fffffff);
    return DFM_OK;
}

/* ---- the tensors ------------------------------------------------------------------------------------ */

typedef struct {
    char gguf[DFM_GGUF_MAX_NAME + 1];
    char hf[96];
    int64_t shape[2]; /* Hugging Face order: [out, in]; shape[1] == 0 for a vector */
    int permute_heads; /* > 0: undo llama.cpp's RoPE row permutation with this many heads */
} TensorPlan;

/* Entry *n of plan (NULL: only counted). */
static void add_plan(TensorPlan *plan, int *n, const char *gguf, const char *hf, int64_t rows, int64_t cols, int perm) {
    if (plan) {
        TensorPlan *p = &plan[*n];
        snprintf(p->gguf, sizeof p->gguf, "%s", gguf);
        snprintf(p->hf, sizeof p->hf, "%s", hf);
        p->shape[0] = rows;
        p->shape[1] = cols;
        p->permute_heads = perm;
    }
    (*n)++;
}

/* Every tensor of the decoder, GGUF name -> HF name and shape. Returns the count (plan may be NULL). */
static int plan_tensors(const BackboneConfig *bc, int llama, TensorPlan *plan) {
    int n = 0;
    const StackConfig *d = &bc->dec;
    int64_t C = d->hidden, hd = d->head_dim, qd = (int64_t)d->n_heads * hd, kd = (int64_t)d->n_kv_heads * hd;
    char g[DFM_GGUF_MAX_NAME + 8], h[96];
#define PLAN(gn, hn, r, c, perm) add_plan(plan, &n, gn, hn, r, c, perm)
    PLAN("token_embd.weight", "model.embed_tokens.weight", bc->vocab_size, C, 0);
    for (int l = 0; l < d->n_layers; l++) {
        static const struct { const char *g, *h; int kind; } M[] = {
            {"attn_norm", "input_layernorm", 0},  {"attn_q", "self_attn.q_proj", 1},   {"attn_k", "self_attn.k_proj", 2},
            {"attn_v", "self_attn.v_proj", 3},   {"attn_output", "self_attn.o_proj", 4}, {"ffn_norm", "post_attention_layernorm", 0},
            {"ffn_gate", "mlp.gate_proj", 5},    {"ffn_up", "mlp.up_proj", 5},          {"ffn_down", "mlp.down_proj", 6},
            {"attn_q_norm", "self_attn.q_norm", 7}, {"attn_k_norm", "self_attn.k_norm", 7},
        };
        for (size_t i = 0; i < sizeof M / sizeof M[0]; i++) {
            if (M[i].kind == 7 && !d->qk_norm) continue;
            snprintf(g, sizeof g, "blk.%d.%s.weight", l, M[i].g);
            snprintf(h, sizeof h, "model.layers.%d.%s.weight", l, M[i].h);
            switch (M[i].kind) {
            case 0: PLAN(g, h, C, 0, 0); break;
            case 1: PLAN(g, h, qd, C, llama ? d->n_heads : 0); break;
            case 2: PLAN(g, h, kd, C, llama ? d->n_kv_heads : 0); break;
            case 3: PLAN(g, h, kd, C, 0); break;
            case 4: PLAN(g, h, C, qd, 0); break;
            case 5: PLAN(g, h, d->ffn, C, 0); break;
            case 6: PLAN(g, h, C, d->ffn, 0); break;
            case 7: PLAN(g, h, hd, 0, 0); break;
            }
        }
    }
    PLAN("output_norm.weight", "model.norm.weight", C, 0, 0);
    if (!bc->tie_embeddings) PLAN("output.weight", "lm_head.weight", bc->vocab_size, C, 0);
#undef PLAN
    return n;
}

/* llama.cpp stores q/k rows of head h as (h, j, a) for j < hd/2, a < 2 where Hugging Face has (h, a, j):
 * row h*hd + 2j + a of the file is row h*hd + a*hd/2 + j of the model. */
static int unpermute_rows(float *w, int64_t rows, int64_t cols, int heads) {
    int64_t hd = rows / heads;
    float *tmp = malloc((size_t)rows * (size_t)cols * sizeof *tmp);
    if (!tmp) return DFM_FAIL(DFM_ENOMEM, "no memory");
    for (int64_t h = 0; h < heads; h++)
        for (int64_t j = 0; j < hd / 2; j++)
            for (int a = 0; a < 2; a++)
                memcpy(tmp + (h * hd + a * hd / 2 + j) * cols, w + (h * hd + 2 * j + a) * cols, (size_t)cols * sizeof *w);
    memcpy(w, tmp, (size_t)rows * (size_t)cols * sizeof *w);
    free(tmp);
    return DFM_OK;
}

static int load_tensor(const dfm_gguf *g, const TensorPlan *p, float **out, GgufImportReport *rep) {
    *out = NULL;
    const dfm_gguf_tensor *t = dfm_gguf_tensor_find(g, p->gguf);
    if (!t) return DFM_FAIL(DFM_ENOTFOUND, "%s: tensor %s (%s) is missing", g->path, p->gguf, p->hf);
    int vec = p->shape[1] == 0;
    if (t->n_dims != (vec ? 1 : 2) || t->ne[0] != (vec ? p->shape[0] : p->shape[1]) || (!vec && t->ne[1] != p->shape[0]))
        return DFM_FAIL(DFM_EMISMATCH, "%s: tensor %s is [%lld, %lld] (GGUF order), the metadata implies [%lld, %lld]",
                        g->path, p->gguf, (long long)t->ne[0], (long long)t->ne[1],
                        (long long)(vec ? p->shape[0] : p->shape[1]), (long long)(vec ? 1 : p->shape[0]));
    if (!dfm_gguf_type_dequantizable(t->type))
        return DFM_FAIL(DFM_EUNSUPPORTED, "%s: tensor %s is %s, which dfm cannot dequantize (F32, F16, BF16, Q4_0, Q4_1, "
                        "Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K). HINT: re-quantize with llama.cpp's "
                        "llama-quantize, or convert the original Hugging Face model instead", g->path, p->gguf,
                        dfm_ggml_type_name(t->type));
    float *w = malloc(t->numel * sizeof *w);
    if (!w) return DFM_FAIL(DFM_ENOMEM, "no memory for tensor %s (%llu floats)", p->gguf, (unsigned long long)t->numel);
    int rc = dfm_gguf_dequantize(g, t, w);
    for (uint64_t i = 0; !rc && i < t->numel; i++)
        if (!isfinite(w[i]))
            rc = DFM_FAIL(DFM_EFORMAT, "%s: tensor %s holds a non-finite value at element %llu after dequantization. "
                          "HINT: the file is damaged", g->path, p->gguf, (unsigned long long)i);
    if (!rc && p->permute_heads) {
        if (p->shape[0] % p->permute_heads || (p->shape[0] / p->permute_heads) % 2)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: tensor %s: %lld rows are not %d heads of an even size", g->path, p->gguf,
                          (long long)p->shape[0], p->permute_heads);
        else
            rc = unpermute_rows(w, p->shape[0], p->shape[1], p->permute_heads);
    }
    if (rc) {
        free(w);
        return rc;
    }
    if (rep) {
        rep->type_counts[t->type]++;
        rep->n_params += t->numel;
    }
    *out = w;
    return DFM_OK;
}

/* Tensors in the file that are not the decoder's: refused by name (biases, rope_freqs, extra heads, ...). */
static int check_no_extra(const dfm_gguf *g, const TensorPlan *plan, int n) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const char *name = g->tensors[i].name;
        int known = 0;
        for (int j = 0; j < n && !known; j++) known = !strcmp(plan[j].gguf, name);
        if (known) continue;
        if (!strcmp(name, "rope_freqs.weight"))
            return DFM_FAIL(DFM_EUNSUPPORTED, "%s: tensor rope_freqs.weight (Llama-3.1-style rope scaling) is not "
                            "supported by dfm-train's decoder", g->path);
        return DFM_FAIL(DFM_EUNSUPPORTED, "%s: tensor %s is not part of a %s decoder dfm-train runs (biases, extra heads "
                        "and adapters are not supported)", g->path, name, "Llama/Qwen3");
    }
    return DFM_OK;
}

/* ---- the folder -------------------------------------------------------------------------------------- */

/* Remove a folder of plain files (a partial import); a subfolder is refused rather than deleted. quiet: on
 * failure return -1 without setting the error (cleaning up after another error, which stays the one reported). */
static int remove_files_dir(const char *dir, int quiet) {
#define RMFAIL(...) (quiet ? -1 : DFM_FAIL(DFM_EIO, __VA_ARGS__))
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? DFM_OK : RMFAIL("cannot open %s: %s", dir, strerror(errno));
    int rc = DFM_OK;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = dfm_path_join(dir, e->d_name);
        struct stat st;
        if (!p || lstat(p, &st) || S_ISDIR(st.st_mode))
            rc = RMFAIL("%s is not a folder of files dfm-train wrote (it holds %s). HINT: remove it yourself", dir,
                        e->d_name);
        else if (unlink(p))
            rc = RMFAIL("cannot remove %s: %s", p, strerror(errno));
        free(p);
    }
    closedir(d);
    if (!rc && rmdir(dir)) rc = RMFAIL("cannot remove %s: %s", dir, strerror(errno));
    return rc;
#undef RMFAIL
}

/* An earlier output: a file is unlinked, a folder goes through remove_files_dir. */
static int remove_old(const char *path, int quiet) {
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? DFM_OK : quiet ? -1 : DFM_FAIL(DFM_EIO, "cannot stat %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return remove_files_dir(path, quiet);
    if (unlink(path) == 0) return DFM_OK;
    return quiet ? -1 : DFM_FAIL(DFM_EIO, "cannot remove %s: %s", path, strerror(errno));
}

/* --force replaces a file or a folder of files; a folder holding folders was not written here and is refused
 * before any work (once it was found only after the new model was in place, and the import exited 1). */
static int check_replaceable(const char *out) {
    struct stat st;
    if (lstat(out, &st) != 0 || !S_ISDIR(st.st_mode)) return DFM_OK;
    DIR *d = opendir(out);
    if (!d) return DFM_FAIL(DFM_EIO, "cannot open %s: %s", out, strerror(errno));
    int rc = DFM_OK;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = dfm_path_join(out, e->d_name);
        if (!p) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        else if (!lstat(p, &st) && S_ISDIR(st.st_mode))
            rc = DFM_FAIL(DFM_EMISMATCH, "%s holds the folder %s: --force replaces a model folder of files, which "
                          "this is not. HINT: remove it yourself, or choose another --out", out, e->d_name);
        free(p);
    }
    closedir(d);
    return rc;
}

/* JSON with 9 significant digits for reals: every value here is an fp32 one, which that many round-trip. */
static int write_json(const char *dir, const char *name, json_t *j) {
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    char *line = text ? dfm_strdupf("%s\n", text) : NULL;
    char *p = dfm_path_join(dir, name);
    int rc = !line || !p ? DFM_FAIL(DFM_ENOMEM, "no memory") : dfm_write_file_atomic(p, line, strlen(line));
    free(text);
    free(line);
    free(p);
    return rc;
}

/* The shortest decimal that reads back as the same fp32 value (1e-05, not 9.99999975e-06). */
static json_t *short_real(float f) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return json_real(strtod(buf, NULL));
}

static int config_json(const BackboneConfig *bc, const dfm_gguf *g, uint32_t ctx_len, json_t **out) {
    json_t *cfg = backbone_config_to_hf(bc);
    if (!cfg) return DFM_FAIL(DFM_ENOMEM, "no memory");
    json_object_set_new(cfg, "rms_norm_eps", short_real(bc->dec.eps));
    json_object_set_new(cfg, "rope_theta", short_real(bc->dec.rope_theta));
    json_object_set_new(cfg, "max_position_embeddings", json_integer(ctx_len));
    json_object_set_new(cfg, "mlp_bias", json_false());
    static const char *ids[][2] = {{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                   {"tokenizer.ggml.eos_token_id", "eos_token_id"},
                                   {"tokenizer.ggml.padding_token_id", "pad_token_id"}};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        uint32_t v;
        if (dfm_gguf_find(g, ids[i][0]) && !dfm_gguf_get_u32(g, ids[i][0], 1, 0, &v) && v < (uint32_t)bc->vocab_size)
            json_object_set_new(cfg, ids[i][1], json_integer(v));
        dfm_error_clear();
    }
    /* what dfm-train will make of it: the same checks as loading the folder */
    BackboneConfig back;
    memset(&back, 0, sizeof back);
    int rc = backbone_config_from_hf(cfg, &back);
    if (rc) {
        json_decref(cfg);
        return dfm_error_prefix("%s: the config.json it implies", g->path);
    }
    *out = cfg;
    return DFM_OK;
}

static int write_folder(const dfm_gguf *g, const char *dir, const BackboneConfig *bc, uint32_t ctx_len,
                        const GgufImportOpts *o, GgufImportReport *rep) {
    int llama = !strcmp(bc->arch, "LlamaForCausalLM");
    int n = plan_tensors(bc, llama, NULL);
    TensorPlan *plan = calloc((size_t)n, sizeof *plan);
    float **data = calloc((size_t)n, sizeof *data);
    dfm_st_write_tensor *w = calloc((size_t)n, sizeof *w);
    json_t *cfg = NULL, *tok = NULL, *tok_cfg = NULL, *meta = NULL;
    int rc = plan && data && w ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) {
        plan_tensors(bc, llama, plan);
        rc = check_no_extra(g, plan, n);
    }
    if (!rc) rc = config_json(bc, g, ctx_len, &cfg);
    /* the tokenizer first: it is small, and a refusal should not wait for the weights */
    if (!rc && !o->tokenizer) rc = dfm_tokenizer_json_from_gguf(g, (uint32_t)bc->vocab_size, &tok, &tok_cfg);
    if (!rc && o->tokenizer) {
        dfm_tokenizer *t = NULL;
        rc = dfm_tokenizer_load(o->tokenizer, &t); /* it must be one dfm can use, with ids the model has */
        if (!rc && dfm_tokenizer_vocab_size(t) > (uint32_t)bc->vocab_size)
            rc = DFM_FAIL(DFM_EMISMATCH, "%s has %u token ids, the model only %d embedding rows", o->tokenizer,
                          dfm_tokenizer_vocab_size(t), bc->vocab_size);
        dfm_tokenizer_free(t);
        json_error_t e;
        if (!rc && !(tok = json_load_file(o->tokenizer, 0, &e)))
            rc = DFM_FAIL(DFM_EFORMAT, "%s: %s", o->tokenizer, e.text);
    }
    for (int i = 0; i < n && !rc; i++) {
        rc = load_tensor(g, &plan[i], &data[i], rep);
        w[i].name = plan[i].hf;
        w[i].dtype = DFM_ST_F32;
        w[i].ndim = plan[i].shape[1] ? 2 : 1;
        w[i].shape = plan[i].shape;
        w[i].data = data[i];
    }
    if (!rc) {
        char src_hash[33];
        const char *base = strrchr(g->path, '/');
        rc = dfm_file_hash(g->path, src_hash);
        meta = json_pack("{s:s, s:s, s:s, s:s}", "format", "pt", "dfm_import", "dfm-train import-gguf", "dfm_source",
                         base ? base + 1 : g->path, "dfm_source_xxh3_128", src_hash);
    }
    if (!rc) rc = dfm_mkdir_p(dir);
    if (!rc) {
        char *p = dfm_path_join(dir, "model.safetensors");
        rc = p ? dfm_safetensors_write(p, w, n, meta) : DFM_FAIL(DFM_ENOMEM, "no memory");
        free(p);
    }
    if (!rc) rc = write_json(dir, "config.json", cfg);
    if (!rc) rc = write_json(dir, "tokenizer.json", tok);
    if (!rc && tok_cfg) rc = write_json(dir, "tokenizer_config.json", tok_cfg);
    if (rep && !rc) {
        snprintf(rep->arch, sizeof rep->arch, "%s", bc->arch);
        rep->n_layers = bc->dec.n_layers;
        rep->hidden = bc->dec.hidden;
        rep->vocab = bc->vocab_size;
        rep->permuted = llama;
        rep->tokenizer_built = !o->tokenizer;
    }
    for (int i = 0; data && i < n; i++) free(data[i]);
    free(data);
    free(plan);
    free(w);
    json_decref(cfg);
    json_decref(tok);
    json_decref(tok_cfg);
    json_decref(meta);
    return rc;
}

int gguf_import(const char *path, const char *out, const GgufImportOpts *o, GgufImportReport *rep) {
    if (rep) memset(rep, 0, sizeof *rep);
    if (dfm_path_exists(out) && !o->force)
        return DFM_FAIL(DFM_EMISMATCH, "%s exists. HINT: --force replaces it, or choose another --out", out);
    dfm_gguf *g = NULL;
    char *arch = NULL, *partial = dfm_strdupf("%s.partial", out), *old = dfm_strdupf("%s.old", out);
    BackboneConfig bc;
    uint32_t ctx_len = 0;
    int rc = partial && old ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = check_replaceable(out);
    if (!rc) rc = dfm_gguf_open(path, &g);
    if (!rc) rc = dfm_gguf_get_str(g, "general.architecture", 1, &arch);
    if (!rc) rc = read_hparams(g, arch, &bc, &ctx_len);
    if (!rc) rc = remove_files_dir(partial, 0); /* a killed earlier import */
    if (!rc) rc = write_folder(g, partial, &bc, ctx_len, o, rep);
    if (!rc && dfm_path_exists(out)) { /* --force: the old output goes only once the new one is complete */
        rc = remove_old(old, 0);
        if (!rc && rename(out, old)) rc = DFM_FAIL(DFM_EIO, "cannot rename %s to %s: %s", out, old, strerror(errno));
    }
    if (!rc && rename(partial, out)) rc = DFM_FAIL(DFM_EIO, "cannot rename %s to %s: %s", partial, out, strerror(errno));
    if (!rc && remove_old(old, 0)) { /* the new model is in place: the import has succeeded */
        DFM_LOG_W("%s is installed; the old output left in %s could not be removed (%s). HINT: remove it yourself",
                  out, old, dfm_last_error());
        dfm_error_clear();
    }
    if (rc && partial) remove_files_dir(partial, 1); /* nothing half-written is left behind */
    dfm_gguf_close(g);
    free(arch);
    free(partial);
    free(old);
    return rc;
}
