/* eval_cmd.c — `dfm-train eval`: held-out CE of trained DFM modules with predicted, no and target
 * memory (also by position inside the chunk), MSE and cosine of the slots (evaluate() of evaluate.h),
 * printed as one JSON line (eval_json). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/mpiutil.h"
#include "common/opts.h"
#include "trainer/cmd/commands.h"
#include "trainer/run/model_setup.h"
#include "trainer/run/evaluate.h"
#include "trainer/data/vocab_map.h"

/* The held-out split of ds on the engine --device selects; the result logged and printed. */
static int eval_held_out(const TrainOpts *o, DfmModel *m, DataSet *ds) {
    size_t nval = train_held_out(o, ds);
    if (nval > ds->n_seq) nval = ds->n_seq;
    EvalResult e;
    EngineOptions eo;
    dfm_mpi mp;
    Engine *en = NULL;
    int rc = train_engine_options(o, &eo);
    if (!rc) rc = dfm_mpi_init(NULL, NULL, &mp);
    if (!rc) rc = engine_create(m, &eo, &mp, &en);
    if (!rc) rc = evaluate(en, m, ds, NULL, ds->n_seq - nval, nval, (int)o->batch, o->eval_batches, train_eval_modes(o), &e);
    engine_free(en);
    if (rc) return rc;
    eval_print(NULL, 0, m, &e, ds->tgt != NULL);
    json_t *j = eval_json(m, &e, ds->tgt != NULL);
    char *txt = json_dumps(j, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    if (txt) printf("%s\n", txt);
    free(txt);
    json_decref(j);
    eval_result_free(&e);
    return DFM_OK;
}

int cmd_eval(int argc, char **argv) {
    TrainOpts o;
    memset(&o, 0, sizeof o);
    dfm_opt opts[] = {
        TRAIN_OPTS_COMMON(&o),
        TRAIN_OPTS_DFM(&o),
        {"backbone", DFM_OPT_STR, &o.backbone, NULL, "DIR", "frozen backbone: Hugging Face folder", 0},
        {"modules", DFM_OPT_STR, &o.modules, NULL, "FILE", "trained modules: ckpt_*.bin or dfm_modules.safetensors", 0},
        {"targets", DFM_OPT_STR, &o.targets, NULL, "PATH", "target memory (for MSE, cosine and the target-memory CE)", 0},
        {"objective", DFM_OPT_STR, &o.objective, "dfm", "OBJ", "dfm: the held-out sequences of --data; reconstruct: the reading set of the run --data (as dfm-train train --objective reconstruct: each held-out chunk regenerated from its own slot, no --targets)", 0, .choices = "dfm|reconstruct"},
        {"reading-prompt", DFM_OPT_STR, &o.reading_prompt, "Text:", "TEXT", "reconstruct: the constant context before each chunk (as in training)", 0},
        {"reading-slots", DFM_OPT_STR, &o.reading_slots, NULL, "FILE", "reconstruct: each chunk's own slots from this targets file (as in training)", 0},
        {0},
    };
    int rc = dfm_opts_parse("eval", "--backbone DIR --modules FILE --data TOKENS [--targets PATH]",
                            "Held-out CE with fusion off (the frozen backbone alone), with predicted memory (DFM at "
                            "inference, no retrieval) and with the target memory fused instead (a retrieval bound when "
                            "the modules were trained with target memory), each also by position inside the chunk; MSE "
                            "and mean cosine of predicted vs target slots. The held-out split is the last --val-seqs "
                            "sequences, as in training.",
                            opts, argc, argv, NULL, NULL, NULL);
    if (rc == DFM_OPTS_HELP) return 0; /* the parser freed the options */
    DataSet ds;
    memset(&ds, 0, sizeof ds);
    DfmModel *m = NULL;
    if (!rc && (!o.data || !o.backbone || !o.modules)) rc = DFM_FAIL(DFM_EARG, "--backbone, --modules and --data are required");
    if (!rc) { /* chunk length and slot shape come from the modules */
        DfmConfig mc;
        rc = setup_modules_config(o.modules, &mc);
        if (!rc) o.chunk_len = mc.chunk_len, o.slots = mc.n_slots, o.d_mem = mc.d_mem;
    }
    int reading = o.objective && !strcmp(o.objective, "reconstruct");
    if (!rc && reading && o.targets)
        rc = DFM_FAIL(DFM_EARG, "--objective reconstruct reads its targets from the run --data: leave out --targets");
    if (!rc) train_set_threads(o.threads);
    if (!rc) rc = reading ? train_open_reading(&o, &ds) : data_open(o.data, (int)o.seq_len, &ds);
    if (!rc) rc = vocab_map_apply_backbone(o.backbone, &ds);
    if (!rc && o.targets) rc = train_open_targets(&o, &ds);
    if (!rc) rc = setup_dfm_model(&o, (int)o.seq_len, (int)o.batch, ds.K, ds.d, &m);
    if (!rc) rc = setup_load_modules(m, o.modules);
    if (!rc) rc = eval_held_out(&o, m, &ds);
    model_free(m);
    data_close(&ds);
    dfm_opts_free(opts);
    return rc;
}
