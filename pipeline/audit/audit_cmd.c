/* audit_cmd.c — `dfm audit RUN` (the report, dfm_audit_run) and `dfm audit --compare RUN_A RUN_B`
 * (reproducibility, dfm_audit_compare): flags, then the core of audit.h. */
#include "pipeline/audit/audit.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/opts.h"

#include <stdlib.h>
#include <string.h>

int dfm_cmd_audit(int argc, char **argv) {
    char *out = NULL;
    int compare = 0;
    dfm_audit_config a = {0};
    char *out_dir = NULL, *token_keys = NULL, *keys_path = NULL;
    dfm_opt opts[] = {
        {"out", DFM_OPT_STR, &out, NULL, "DIR", "write audit.json, audit.md, audit.svg here (default RUN/audit)", 1},
        {"token-level-sample", DFM_OPT_INT, &a.sample, "2", "N",
         "sequences of the run's corpus on which to build and search a real token-level datastore and the chunk-level one (0: skip)", 0, .min = "0"},
        {"token-k", DFM_OPT_INT, &a.k_token, "1024", "k", "neighbours per token-level query (kNN-LM, Memory Decoder, MLP Memory: 1024)", 0, .min = "1", .max = "65536"},
        {"token-key-dim", DFM_OPT_INT, &a.key_dim, "4096", "D", "token-level key width: the LM hidden size (4096 for a 7B model)", 0, .min = "1", .max = "65536"},
        {"extrapolate-tokens", DFM_OPT_DOUBLE, &a.large, "5e9", "T", "the large corpus to extrapolate both pipelines to", 0, .min = "1"},
        {"seed", DFM_OPT_INT, &a.seed, "1234", "S", "seed of the sample and of the keys", 0},
        {"measure-tokens", DFM_OPT_INT, &a.measure_tokens, "0", "N",
         "build and search both datastores over the first n tokens of the same text at --measure-sizes sizes up to N (token level: "
         "--token-keys, IVF-PQ; chunk level: the run's embeddings and index), fit the cost model, validate it on the largest size and extrapolate (0: skip)", 0, .min = "0"},
        {"token-keys", DFM_OPT_STR, &token_keys, NULL, "FILE",
         "token-level keys for --measure-tokens: a hidden-states file of `dfm-train hidden` (default RUN/audit/hidden_states.bin), "
         "or 'random' for seeded random keys of width --token-key-dim (labelled as such)", 0},
        {"measure-sizes", DFM_OPT_INT, &a.measure_sizes, "4", "S", "sizes for --measure-tokens, each 4x the previous", 0, .min = "2", .max = "12"},
        {"repeats", DFM_OPT_INT, &a.repeats, "3", "R", "timed passes over the queries per size and side (min/median/max)", 0, .min = "1", .max = "15"},
        {"build-repeats", DFM_OPT_INT, &a.build_repeats, "3", "R", "timed builds per size and side (min/median/max)", 0, .min = "1", .max = "15"},
        {"measure-queries", DFM_OPT_INT, &a.measure_queries, "500", "Q", "timed queries per size and side", 0, .min = "1"},
        {"recall-queries", DFM_OPT_INT, &a.recall_queries, "50", "Q", "of those, also searched exactly for recall@k", 0, .min = "0"},
        {"token-nprobe", DFM_OPT_INT, &a.token_nprobe, "32", "N", "IVF lists visited per token-level query (kNN-LM: 32)", 0, .min = "1"},
        {"lm-width", DFM_OPT_INT, &a.lm_width, "576", "W",
         "the frozen LM's hidden width, for the storage of LM-state slots (`dfm-train slots`; SmolLM2-135M: 576; 0: no such rows)", 0,
         .min = "0", .max = "65536"},
        {"threads", DFM_OPT_INT, &a.threads, "1", "N", "OpenMP threads for the measured searches, both sides alike (0: OpenMP's default)", 0, .min = "0"},
        {"compare", DFM_OPT_FLAG, &compare, NULL, NULL, "dfm audit --compare RUN_A RUN_B: check that two runs' counts and target records agree", 1},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("audit", "RUN [options] | --compare RUN_A RUN_B",
                            "Audit a run's retrieval cost against token-level retrieval (one query per token, k neighbours each): "
                            "counted from the manifest, measured on a sample on this machine, extrapolated; writes audit.json, "
                            "audit.md and audit.svg. With --compare, check that two runs agree.",
                            opts, argc, argv, &pos, &npos, NULL);
    if (rc == DFM_OPTS_HELP) return 0;
    if (rc) return rc;
    if (compare) {
        if (npos != 2) rc = DFM_FAIL(DFM_EARG, "usage: dfm audit --compare RUN_A RUN_B");
        else rc = dfm_audit_compare(pos[0], pos[1]);
        goto done;
    }
    if (npos != 1) {
        rc = DFM_FAIL(DFM_EARG, "usage: dfm audit RUN [--out DIR] [--token-level-sample N]");
        goto done;
    }
    a.run = pos[0];
    a.out_dir = out_dir = out ? strdup(out) : dfm_path_join(pos[0], "audit");
    if (!out_dir) {
        rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        goto done;
    }
    if (token_keys) a.token_keys = token_keys;
    else if (!(a.token_keys = keys_path = dfm_path_join(out_dir, "hidden_states.bin"))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = dfm_audit_run(&a);
done:
    free(keys_path);
    free(out_dir);
    free(pos);
    dfm_opts_free(opts);
    return rc;
}
