/* train_opts.c — what dfm-train derives from its shared flags (see train_opts.h). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "tokenizer/tokenizer.h"
#include "trainer/data/reading.h"
#include "trainer/run/train_opts.h"

void openblas_set_num_threads(int n); /* cblas.h of some OpenBLAS builds lacks the prototype */

void train_set_threads(int64_t n) {
    if (n <= 0) return;
    omp_set_num_threads((int)n);
    openblas_set_num_threads((int)n);
}

json_t *train_opts_json(const TrainOpts *o) {
    json_t *j = json_pack("{s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:f, s:f, s:f, s:I, s:I}", "seq_len", (json_int_t)o->seq_len,
                     "batch", (json_int_t)o->batch, "accum", (json_int_t)o->accum, "steps", (json_int_t)o->steps, "lr",
                     o->lr, "min_lr_frac", o->min_lr_frac, "warmup", (json_int_t)o->warmup, "wd", o->wd, "clip", o->clip,
                     "beta2", o->beta2, "seed", (json_int_t)o->seed, "val_seqs", (json_int_t)o->val_seqs);
    if (j && o->margin_weight > 0) { /* only when on: runs without it keep their configuration (and resume) */
        json_object_set_new(j, "margin_weight", json_real(o->margin_weight));
        json_object_set_new(j, "margin", json_real(o->margin));
    }
    if (j && o->teacher) { /* the file's own name is not configuration; what is taken from it is */
        json_object_set_new(j, "distill_weight", json_real(o->distill_weight));
        json_object_set_new(j, "gain_weighting", json_real(o->gain_weighting));
        json_object_set_new(j, "ce_weight", json_real(o->ce_weight));
    }
    if (j && o->reconstruct_weight > 0) { /* the reading set's own slots file is named data, like --targets */
        json_object_set_new(j, "reconstruct_weight", json_real(o->reconstruct_weight));
        json_object_set_new(j, "reconstruct_batch", json_integer((json_int_t)o->reconstruct_batch));
        json_object_set_new(j, "reading_prompt", json_string(o->reading_prompt ? o->reading_prompt : ""));
        json_object_set_new(j, "reconstruct_context", json_boolean(o->reconstruct_context));
        if (o->reconstruct_memory && strcmp(o->reconstruct_memory, "own")) /* only when on: earlier runs resume */
            json_object_set_new(j, "reconstruct_memory", json_string(o->reconstruct_memory));
    }
    if (j && o->memory_ablation && strcmp(o->memory_ablation, "none"))
        json_object_set_new(j, "memory_ablation", json_string(o->memory_ablation));
    return j;
}

int train_engine_options(const TrainOpts *o, EngineOptions *eo) {
    memset(eo, 0, sizeof *eo);
    eo->cuda = !strcmp(o->device, "cuda");
    eo->bf16 = eo->cuda && !strcmp(o->precision, "bf16");
    eo->flash = !strcmp(o->attention, "auto") ? -1 : !strcmp(o->attention, "flash");
    eo->gpu = (int)o->gpu;
    return DFM_OK;
}

size_t train_held_out(const TrainOpts *o, const DataSet *ds) {
    size_t nval = o->val_seqs > 0 ? (size_t)o->val_seqs : ds->n_seq / 20;
    return nval < (size_t)o->batch ? (size_t)o->batch : nval;
}

int train_open_targets(const TrainOpts *o, DataSet *ds) {
    const char *trun = o->tokens_run;
    char *man = dfm_path_join(o->data, "manifest.json");
    if (!trun && man && dfm_path_exists(man)) trun = o->data;
    int rc = data_open_targets(ds, o->targets, trun, (int)o->chunk_len, (int)o->slots, (int)o->d_mem);
    free(man);
    return rc;
}

int train_encode_prompt(const char *backbone, const char *flag, const char *text, int L, int **ids, int *n) {
    *ids = NULL;
    *n = 0;
    char *tp = dfm_path_join(backbone, "tokenizer.json");
    dfm_tokenizer *tok = NULL;
    dfm_ids v = {0};
    int rc = tp ? dfm_tokenizer_load(tp, &tok) : DFM_FAIL(DFM_ENOMEM, "path");
    if (rc) dfm_error_prefix("%s is encoded with the backbone's tokenizer", flag);
    if (!rc) rc = dfm_tokenizer_encode(tok, text, strlen(text), &v, 0);
    if (!rc && (v.n < 1 || v.n > (size_t)L))
        rc = DFM_FAIL(DFM_EARG, "%s \"%s\" is %zu tokens; it must fill 1 to %d (one chunk)", flag, text, v.n, L);
    if (!rc && !(*ids = malloc(v.n * sizeof(int)))) rc = DFM_FAIL(DFM_ENOMEM, "prompt");
    for (size_t i = 0; !rc && i < v.n; i++) (*ids)[i] = (int)v.ids[i];
    if (!rc) *n = (int)v.n;
    dfm_ids_free(&v);
    dfm_tokenizer_free(tok);
    free(tp);
    return rc;
}

int train_open_reading(TrainOpts *o, DataSet *ds) {
    int L = (int)o->chunk_len, K = o->slots > 0 ? (int)o->slots : 16;
    int *ids = NULL, n = 0;
    int rc = train_encode_prompt(o->backbone, "--reading-prompt", o->reading_prompt, L, &ids, &n);
    if (!rc) rc = data_open_reading(o->data, L, K, ids, n, o->reading_slots, 0, NULL, ds);
    free(ids);
    if (rc) return rc;
    if (o->seq_len != 2 * L) DFM_LOG_I("--objective reconstruct: sequences of 2 x %d tokens (--seq-len %lld ignored)", L,
                                       (long long)o->seq_len);
    if (o->fusion_memory && strcmp(o->fusion_memory, TRAIN_FUSION_MEMORY_DEFAULT) && strcmp(o->fusion_memory, "target"))
        DFM_LOG_I("--objective reconstruct: fusion reads the target slot (--fusion-memory %s ignored)", o->fusion_memory);
    if (o->mse_weight != 1.0 && o->mse_weight != 0.0)
        DFM_LOG_I("--objective reconstruct: the predictor is not trained (--mse-weight %g ignored)", o->mse_weight);
    o->seq_len = 2 * L;
    char *fm = strdup("target"); /* the option table frees its strings */
    if (!fm) return DFM_FAIL(DFM_ENOMEM, "options");
    free(o->fusion_memory);
    o->fusion_memory = fm;
    o->mse_weight = 0;
    return DFM_OK;
}
