/* slots_cmd.c — `dfm-train slots`: memory slots in the frozen LM's own space (trainer/data/lm_slots.h), written as
 * a targets file for `dfm-train train --targets FILE` (neighbours) or `--reading-slots FILE` (--own). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/opts.h"
#include "shard/target_reader.h"
#include "trainer/cmd/commands.h"
#include "trainer/run/model_setup.h"
#include "trainer/data/data.h"
#include "trainer/data/lm_slots.h"
#include "trainer/lm/hf_model.h"
#include "trainer/model/model.h"
#include "trainer/run/train_opts.h"

typedef struct {
    char *backbone, *data, *targets, *datastore, *out, *prefix;
    int64_t chunk_len, layer, pool, neighbours, batch, threads;
    int own;
} SlotsOpts;

static int run_slots(const SlotsOpts *o) {
    DataSet ds, store;
    memset(&ds, 0, sizeof ds);
    memset(&store, 0, sizeof store);
    DfmModel *m = NULL;
    dfm_target_reader *tr = NULL;
    int L = (int)o->chunk_len, *prefix = NULL, n_prefix = 0;
    const char *targets = o->targets ? o->targets : o->data, *datastore = o->datastore ? o->datastore : targets;
    BackboneConfig bc;
    memset(&bc, 0, sizeof bc);
    int rc = data_open(o->data, L, &ds);
    if (!rc && (!ds.chunk_len || ds.chunk_len != L))
        rc = DFM_FAIL(DFM_EARG, "%s: slots are made for a `dfm chunk` run of chunks of %d tokens (this one: %d). HINT: "
                      "--chunk-len", o->data, L, ds.chunk_len);
    dfm_target_open_opts to = {.tokens_run = o->data};
    if (!rc && !o->own) rc = dfm_target_reader_open(targets, &to, &tr);
    if (!rc && !o->own) rc = data_open(datastore, L, &store);
    if (!rc) rc = train_encode_prompt(o->backbone, "--prefix", o->prefix, L, &prefix, &n_prefix);
    if (!rc) rc = setup_frozen_backbone(o->backbone, (int)o->batch, n_prefix + L, &bc, &m);
    if (rc) goto done;
    LmSlotOptions lo = {.layer = (int)o->layer, .pool = (int)o->pool, .neighbours = (int)o->neighbours,
                        .batch = (int)o->batch};
    LmSlotStats st;
    double t0 = dfm_now();
    DFM_LOG_I("slots: %s after %lld of %d blocks, %lld slot(s) per chunk, over the chunks of %s (%s)", o->backbone,
              (long long)o->layer, bc.dec.n_layers, (long long)o->pool, o->data,
              o->own ? "each chunk's own" : "its target records' neighbours");
    rc = lm_slots_build(m, &ds, tr, o->own ? &ds : &store, L, prefix, n_prefix, &lo, o->out, &st);
    if (!rc)
        printf("slots: %llu chunks x %d slots of d %d (%llu valid) from %llu distinct chunks through %lld blocks in %.1f s "
               "-> %s\n", (unsigned long long)st.chunks_out, st.k_out, st.d_out, (unsigned long long)st.slots_valid,
               (unsigned long long)st.states_chunks, (long long)o->layer, dfm_now() - t0, o->out);
done:
    free(prefix);
    model_free(m);
    dfm_target_reader_close(tr);
    data_close(&store);
    data_close(&ds);
    return rc;
}

int cmd_slots(int argc, char **argv) {
    SlotsOpts o;
    memset(&o, 0, sizeof o);
    dfm_opt opts[] = {
        {"backbone", DFM_OPT_STR, &o.backbone, NULL, "DIR", "the frozen decoder whose states the slots hold (a Hugging Face folder)", 0},
        {"data", DFM_OPT_STR, &o.data, NULL, "RUN", "the `dfm chunk` run whose chunks get slots (the file covers its chunks)", 0},
        {"targets", DFM_OPT_STR, &o.targets, NULL, "RUN", "the run whose target records name each chunk's neighbours (default: --data)", 0},
        {"datastore", DFM_OPT_STR, &o.datastore, NULL, "RUN", "the run whose chunks those ids name (default: --targets)", 0},
        {"own", DFM_OPT_FLAG, &o.own, NULL, NULL, "each chunk's own states instead of its neighbours' (the reading stage's slots: train --objective reconstruct --reading-slots FILE)", 0},
        {"out", DFM_OPT_STR, &o.out, NULL, "FILE", "the targets file to write (schemas/targets_file.md)", 0},
        {"layer", DFM_OPT_INT, &o.layer, "16", "N", "the residual stream after N decoder blocks", 0, .min = "1"},
        {"pool", DFM_OPT_INT, &o.pool, "1", "M", "slots per chunk: its tokens averaged in M consecutive groups (M = the chunk length: one slot per token)", 0, .min = "1"},
        {"neighbours", DFM_OPT_INT, &o.neighbours, "0", "J", "the first J slots of each target record, best-ranked first (0: all): J x M slots per chunk", 0, .min = "0", .max = "64"},
        {"prefix", DFM_OPT_STR, &o.prefix, "Text:", "TEXT", "the constant context each chunk is run after (as --reading-prompt)", 0},
        {"chunk-len", DFM_OPT_INT, &o.chunk_len, "32", "L", "tokens per chunk (as the run's)", 0, .min = "1"},
        {"batch", DFM_OPT_INT, &o.batch, "16", "B", "chunks per backbone forward", 1, .min = "1", .max = "4096"},
        {"threads", DFM_OPT_INT, &o.threads, "0", "N", "OpenMP/BLAS threads (0 = default)", 1},
        {0},
    };
    int rc = dfm_opts_parse("slots", "--backbone DIR --data RUN --out FILE [--own]",
                            "Memory slots in the frozen LM's own space: every datastore chunk a target record names is run "
                            "alone through the frozen decoder after a constant prefix, its states after --layer blocks "
                            "averaged in --pool groups of tokens and scaled to unit norm, and each chunk of --data gets its "
                            "first --neighbours neighbours' slots (or, with --own, its own) in a targets file that "
                            "`dfm-train train --targets`, `eval` and dfm.Batches read (trainer/data/lm_slots.h).",
                            opts, argc, argv, NULL, NULL, NULL);
    if (rc == DFM_OPTS_HELP) return 0; /* the parser freed the options */
    if (!rc && (!o.backbone || !o.data || !o.out)) rc = DFM_FAIL(DFM_EARG, "--backbone, --data and --out are required");
    if (!rc && o.own && (o.targets || o.datastore || o.neighbours))
        rc = DFM_FAIL(DFM_EARG, "--own reads no target records: leave out --targets, --datastore and --neighbours");
    if (!rc) {
        train_set_threads(o.threads);
        rc = run_slots(&o);
    }
    dfm_opts_free(opts);
    return rc;
}
