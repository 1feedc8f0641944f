/* teacher_cmd.c — `dfm-train teacher`: the in-context teacher's rows over a token run (trainer/data/teacher.h),
 * written as a teacher file (schemas/teacher_file.h) for `dfm-train train --teacher FILE`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/opts.h"
#include "shard/target_reader.h"
#include "trainer/cmd/commands.h"
#include "trainer/run/model_setup.h"
#include "trainer/data/data.h"
#include "trainer/data/teacher.h"
#include "trainer/lm/hf_model.h"
#include "trainer/model/model.h"
#include "trainer/run/train_opts.h"

typedef struct {
    char *backbone, *data, *targets, *datastore, *out;
    int64_t seq_len, chunk_len, paste, top, max_seq, threads;
} TeacherOpts;

static int run_teacher(const TeacherOpts *o) {
    DataSet ds, store;
    memset(&ds, 0, sizeof ds);
    memset(&store, 0, sizeof store);
    DfmModel *m = NULL;
    dfm_target_reader *tr = NULL;
    int T = (int)o->seq_len, L = (int)o->chunk_len, P = (int)o->paste;
    const char *targets = o->targets ? o->targets : o->data, *datastore = o->datastore ? o->datastore : targets;
    BackboneConfig bc;
    memset(&bc, 0, sizeof bc);
    int rc = data_open(o->data, T, &ds);
    dfm_target_open_opts to = {.tokens_run = o->data};
    if (!rc) rc = dfm_target_reader_open(targets, &to, &tr);
    if (!rc) rc = data_open(datastore, L, &store);
    if (!rc && (!ds.chunk_len || ds.chunk_len != L))
        rc = DFM_FAIL(DFM_EARG, "%s: the teacher reads a `dfm chunk` run of chunks of %d tokens (this one: %d). HINT: "
                      "--chunk-len", o->data, L, ds.chunk_len);
    const dfm_target_info *inf = tr ? dfm_target_reader_info(tr) : NULL;
    int slots_per = inf && inf->slots == DFM_TREC_SLOTS_BOTH ? 2 : 1;
    if (!rc && (uint32_t)(slots_per * P) > inf->k)
        rc = DFM_FAIL(DFM_EARG, "--paste %d: the targets of %s hold %u slots", P, targets, inf->k);
    if (!rc) rc = setup_frozen_backbone(o->backbone, 1, slots_per * P * L + T, &bc, &m);
    if (!rc && (int)ds.max_token >= bc.vocab_size)
        rc = DFM_FAIL(DFM_EMISMATCH, "%s holds token id %u; the backbone %s has %d", o->data, ds.max_token, o->backbone,
                      bc.vocab_size);
    if (rc) goto done;
    TeacherBuildOptions bo = {.paste = P, .top = (int)o->top, .max_seq = (int)o->max_seq};
    TeacherStats st;
    double t0 = dfm_now();
    DFM_LOG_I("teacher: %s over %zu sequences of %d tokens; the first %d valid slots of %s pasted from %s", o->backbone,
              ds.n_seq, T, P, targets, datastore);
    rc = teacher_build(m, &ds, tr, &store, L, &bo, dfm_checksum64(m->bb_memory, m->bb_num * sizeof(float)), o->out, &st);
    if (!rc) {
        double n = st.rows_teacher ? (double)st.rows_teacher : 1.0;
        printf("teacher: %llu rows with pasted text: teacher %.4f, LM alone %.4f nats per token (gain %.4f); %.1f pasted "
               "tokens per chunk; %llu tokens through the backbone in %.1f s -> %s\n",
               (unsigned long long)st.rows_teacher, -st.lp_teacher / n, -st.lp_alone / n, (st.lp_teacher - st.lp_alone) / n,
               st.rows_teacher ? (double)st.pasted_tokens * L / n : 0.0, (unsigned long long)st.forward_tokens,
               dfm_now() - t0, o->out);
    }
done:
    model_free(m);
    dfm_target_reader_close(tr);
    data_close(&store);
    data_close(&ds);
    return rc;
}

int cmd_teacher(int argc, char **argv) {
    TeacherOpts o;
    memset(&o, 0, sizeof o);
    dfm_opt opts[] = {
        {"backbone", DFM_OPT_STR, &o.backbone, NULL, "DIR", "the frozen decoder (a Hugging Face folder, e.g. $DFM_CACHE/models/smollm2-135m)", 0},
        {"data", DFM_OPT_STR, &o.data, NULL, "RUN", "the `dfm chunk` run training reads", 0},
        {"targets", DFM_OPT_STR, &o.targets, NULL, "RUN", "the run whose target records name each chunk's neighbours (default: --data)", 0},
        {"datastore", DFM_OPT_STR, &o.datastore, NULL, "RUN", "the run whose chunks those ids name (default: --targets)", 0},
        {"out", DFM_OPT_STR, &o.out, NULL, "FILE", "the teacher file to write (schemas/teacher_file.md)", 0},
        {"seq-len", DFM_OPT_INT, &o.seq_len, "256", "T", "tokens per training sequence (as dfm-train train's)", 0, .min = "1"},
        {"chunk-len", DFM_OPT_INT, &o.chunk_len, "32", "L", "tokens per chunk (as the run's)", 0, .min = "1"},
        {"paste", DFM_OPT_INT, &o.paste, "4", "P", "valid slots, best-ranked first, whose text is pasted before the context", 0, .min = "1", .max = "64"},
        {"top", DFM_OPT_INT, &o.top, "32", "S", "token ids and log-probs kept per row", 0, .min = "1", .max = "256"},
        {"max-seq", DFM_OPT_INT, &o.max_seq, "0", "N", "only the first N sequences (0: all; training needs all)", 1, .min = "0"},
        {"threads", DFM_OPT_INT, &o.threads, "0", "N", "OpenMP/BLAS threads (0 = default)", 1},
        {0},
    };
    int rc = dfm_opts_parse("teacher", "--backbone DIR --data RUN --out FILE",
                            "Run the frozen decoder as the in-context teacher: for every chunk of every training sequence, "
                            "the text of its retrieved neighbours pasted before the context, and keep the top log-probs "
                            "of each row (and the LM alone's log-prob of its target) for `dfm-train train --teacher "
                            "FILE --distill-weight W` and `--gain-weighting F` (trainer/README.md).",
                            opts, argc, argv, NULL, NULL, NULL);
    if (rc == DFM_OPTS_HELP) return 0; /* the parser freed the options */
    if (!rc && (!o.backbone || !o.data || !o.out)) rc = DFM_FAIL(DFM_EARG, "--backbone, --data and --out are required");
    if (!rc) {
        train_set_threads(o.threads);
        rc = run_teacher(&o);
    }
    dfm_opts_free(opts);
    return rc;
}
