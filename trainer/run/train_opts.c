/* train_opts.c — what dfm-train derives from its shared flags (see train_opts.h). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "trainer/run/train_opts.h"

void openblas_set_num_threads(int n); /* cblas.h of some OpenBLAS builds lacks the prototype */

void train_set_threads(int64_t n) {
    if (n <= 0) return;
    omp_set_num_threads((int)n);
    openblas_set_num_threads((int)n);
}

json_t *train_opts_json(const TrainOpts *o) {
    return json_pack("{s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:f, s:f, s:f, s:I, s:I}", "seq_len", (json_int_t)o->seq_len,
                     "batch", (json_int_t)o->batch, "accum", (json_int_t)o->accum, "steps", (json_int_t)o->steps, "lr",
                     o->lr, "min_lr_frac", o->min_lr_frac, "warmup", (json_int_t)o->warmup, "wd", o->wd, "clip", o->clip,
                     "beta2", o->beta2, "seed", (json_int_t)o->seed, "val_seqs", (json_int_t)o->val_seqs);
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
