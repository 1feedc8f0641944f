/* hf_model.c — backbone folders and DFM module files in safetensors (schemas/safetensors.h). */
#include "trainer/lm/hf_model.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "schemas/safetensors.h"
#include "trainer/model/model_config.h"

static int open_files(const char *dir, dfm_safetensors ***files, int *nfiles);
static void close_files(dfm_safetensors **files, int n);

/* The sizes config.json claims must be stored in the folder's weight files (2 bytes or more per weight)
 * before the model is allocated from them: a crafted config cannot make dfm-train allocate what no file
 * holds. Counted in 128 bits over the large matrices only (a lower bound). A folder without weight files
 * is left to the loader, which names what is missing. */
static int check_weights_fit(const char *dir, const BackboneConfig *bc) {
    dfm_safetensors **files = NULL;
    int nfiles = 0;
    if (open_files(dir, &files, &nfiles)) {
        dfm_error_clear();
        return DFM_OK;
    }
    unsigned __int128 bytes = 0;
    for (int i = 0; i < nfiles; i++) bytes += files[i]->data_bytes;
    close_files(files, nfiles);
    const StackConfig *d = &bc->dec;
    unsigned __int128 C = (unsigned)d->hidden, V = (unsigned)bc->vocab_size, hd = (unsigned)d->head_dim;
    unsigned __int128 per_layer = C * hd * (2u * (unsigned)d->n_heads + 2u * (unsigned)d->n_kv_heads) +
                                  3 * C * (unsigned)d->ffn;
    unsigned __int128 weights = V * C * (bc->tie_embeddings ? 1u : 2u) + per_layer * (unsigned)d->n_layers;
    if (weights * 2 > bytes)
        return DFM_FAIL(DFM_EFORMAT, "%s: config.json (vocab_size %d, hidden_size %d, intermediate_size %d, %d layers) "
                        "implies at least %.3g weights, more than the %.3g bytes of its safetensors files hold. HINT: "
                        "config.json and the weights do not belong together", dir, bc->vocab_size, d->hidden, d->ffn,
                        d->n_layers, (double)weights, (double)bytes);
    return DFM_OK;
}

int hf_read_config(const char *dir, BackboneConfig *bc) {
    char *path = dfm_path_join(dir, "config.json");
    if (!path) return DFM_FAIL(DFM_ENOMEM, "path");
    json_error_t e;
    json_t *cfg = json_load_file(path, 0, &e);
    if (!cfg) {
        int rc = DFM_FAIL(dfm_path_exists(path) ? DFM_EFORMAT : DFM_ENOTFOUND,
                          "cannot read %s: %s (line %d). HINT: --backbone must be a Hugging Face model folder",
                          path, e.text, e.line);
        free(path);
        return rc;
    }
    int rc = backbone_config_from_hf(cfg, bc);
    if (rc) dfm_error_prefix("%s", path);
    json_decref(cfg);
    free(path);
    return rc ? rc : check_weights_fit(dir, bc);
}

/* Open the folder's safetensors files: model.safetensors, or the shards named by the index. */
static int open_files(const char *dir, dfm_safetensors ***files, int *nfiles) {
    *files = NULL;
    *nfiles = 0;
    char *single = dfm_path_join(dir, "model.safetensors");
    if (dfm_path_exists(single)) {
        *files = calloc(1, sizeof **files);
        int rc = dfm_safetensors_open(single, &(*files)[0]);
        free(single);
        if (rc) return rc;
        *nfiles = 1;
        return DFM_OK;
    }
    free(single);
    char *ip = dfm_path_join(dir, "model.safetensors.index.json");
    json_error_t e;
    json_t *idx = json_load_file(ip, 0, &e);
    if (!idx) {
        int rc = DFM_FAIL(DFM_ENOTFOUND, "%s has neither model.safetensors nor a readable %s (%s)", dir, ip, e.text);
        free(ip);
        return rc;
    }
    free(ip);
    json_t *wm = json_object_get(idx, "weight_map");
    /* distinct file names */
    const char *names[256];
    int n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
        const char *f = json_string_value(v);
        if (!f) continue;
        int seen = 0;
        for (int i = 0; i < n; i++) seen |= !strcmp(names[i], f);
        if (!seen && n < 256) names[n++] = f;
    }
    *files = calloc(n ? n : 1, sizeof **files);
    int rc = DFM_OK;
    for (int i = 0; i < n && !rc; i++) {
        char *p = dfm_path_join(dir, names[i]);
        rc = dfm_safetensors_open(p, &(*files)[i]);
        free(p);
        if (!rc) *nfiles = i + 1;
    }
    json_decref(idx);
    return rc;
}

static void close_files(dfm_safetensors **files, int n) {
    for (int i = 0; i < n; i++) dfm_safetensors_close(files[i]);
    free(files);
}

static int load_views(dfm_safetensors **files, int nfiles, const TensorView *views, int nv, const char *where) {
    for (int i = 0; i < nv; i++) {
        const dfm_st_tensor *t = NULL;
        int f = 0;
        for (; f < nfiles && !t; f++) t = dfm_safetensors_find(files[f], views[i].name);
        if (!t)
            return DFM_FAIL(DFM_ENOTFOUND, "%s: tensor %s is missing. HINT: is this a %s?", where, views[i].name,
                            "matching model folder / module file");
        DFM_TRY(dfm_safetensors_get(t->file, views[i].name, views[i].ndim, views[i].shape, &t));
        DFM_TRY(dfm_st_to_f32(t, views[i].data));
    }
    return DFM_OK;
}

int hf_load_backbone(DfmModel *m, const char *dir) {
    int nv = model_backbone_tensors(m, NULL, 0);
    TensorView *views = calloc(nv, sizeof *views);
    if (!views) return DFM_FAIL(DFM_ENOMEM, "tensor list");
    model_backbone_tensors(m, views, 0);
    dfm_safetensors **files;
    int nfiles;
    int rc = open_files(dir, &files, &nfiles);
    if (!rc) rc = load_views(files, nfiles, views, nv, dir);
    close_files(files, nfiles);
    free(views);
    return rc;
}

static int write_views(const char *path, const TensorView *views, int nv, json_t *meta) {
    dfm_st_write_tensor *w = calloc(nv, sizeof *w);
    if (!w) return DFM_FAIL(DFM_ENOMEM, "tensor list");
    for (int i = 0; i < nv; i++) {
        w[i].name = views[i].name;
        w[i].dtype = DFM_ST_F32;
        w[i].ndim = views[i].ndim;
        w[i].shape = views[i].shape;
        w[i].data = views[i].data;
    }
    int rc = dfm_safetensors_write(path, w, nv, meta);
    free(w);
    return rc;
}

int hf_save_backbone(const DfmModel *m, const char *dir) {
    DFM_TRY(dfm_mkdir_p(dir));
    json_t *cfg = backbone_config_to_hf(&m->bc);
    char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(cfg);
    char *cp = dfm_path_join(dir, "config.json");
    int rc = dfm_write_file_atomic(cp, text, strlen(text));
    free(cp);
    free(text);
    if (rc) return rc;
    int nv = model_backbone_tensors(m, NULL, 0);
    TensorView *views = calloc(nv, sizeof *views);
    model_backbone_tensors(m, views, 0);
    json_t *meta = json_pack("{s:s}", "format", "pt");
    char *sp = dfm_path_join(dir, "model.safetensors");
    rc = write_views(sp, views, nv, meta);
    json_decref(meta);
    free(sp);
    free(views);
    return rc;
}

int dfm_modules_save(const DfmModel *m, const char *path) {
    if (!m->dc.enabled) return DFM_FAIL(DFM_EARG, "no DFM modules to save (pretraining model)");
    int nv = model_dfm_tensors(m, NULL, 0);
    TensorView *views = calloc(nv, sizeof *views);
    model_dfm_tensors(m, views, 0);
    json_t *dj = dfm_config_to_json(&m->dc), *bj = backbone_config_to_hf(&m->bc);
    char *ds = json_dumps(dj, JSON_COMPACT | JSON_SORT_KEYS), *bs = json_dumps(bj, JSON_COMPACT | JSON_SORT_KEYS);
    char hash[17];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)dfm_checksum64(m->bb_memory, m->bb_num * sizeof(float)));
    json_t *meta = json_pack("{s:s, s:s, s:s, s:s}", "format", "dfm", "dfm_config", ds, "backbone_config", bs,
                             "backbone_hash", hash);
    int rc = write_views(path, views, nv, meta);
    json_decref(meta);
    json_decref(dj);
    json_decref(bj);
    free(ds);
    free(bs);
    free(views);
    return rc;
}

int dfm_modules_load(DfmModel *m, const char *path) {
    if (!m->dc.enabled) return DFM_FAIL(DFM_EARG, "model has no DFM modules");
    dfm_safetensors *st;
    DFM_TRY(dfm_safetensors_open(path, &st));
    char hash[17];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)dfm_checksum64(m->bb_memory, m->bb_num * sizeof(float)));
    const char *saved = dfm_safetensors_meta(st, "backbone_hash");
    if (saved && strcmp(saved, hash)) {
        int rc = DFM_FAIL(DFM_EMISMATCH, "%s was trained on another backbone (weights hash %s, this one %s). "
                          "HINT: --backbone of the training run", path, saved, hash);
        dfm_safetensors_close(st); /* after the message: saved points into the file's metadata */
        return rc;
    }
    int nv = model_dfm_tensors(m, NULL, 0);
    TensorView *views = calloc(nv, sizeof *views);
    model_dfm_tensors(m, views, 0);
    /* modules trained without the predictor's skip path (a reading stage, the paper's predictor) start a model
     * with one: the skip path keeps its start (zero), every other tensor comes from the file */
    for (int i = 0; i < nv; i++)
        if (!strcmp(views[i].name, "dfm.predictor.skip.weight") && !dfm_safetensors_find(st, views[i].name)) {
            DFM_LOG_I("%s has no predictor skip path: it starts at zero", path);
            memmove(&views[i], &views[i + 1], (size_t)(nv - i - 1) * sizeof *views);
            nv--;
            break;
        }
    int rc = load_views(&st, 1, views, nv, path);
    free(views);
    dfm_safetensors_close(st);
    return rc;
}
