/* estimate_cmd.c — `dfm estimate`: its flags, then dfm_estimate_run (job_estimate.h). */
#include "pipeline/driver/job_estimate.h"

#include "common/error.h"
#include "common/opts.h"

#include <stdlib.h>

int dfm_cmd_estimate(int argc, char **argv) {
    char *factory = NULL, *tdtype = NULL;
    int64_t mem = 0, train = 0, k = 0, qblock = 0, ranks = 0, dim_opt = 0, tokens = 0, chunk_len = 0, window = 0, node_mem = 0;
    int64_t nprobe = 0, margin = 0, gpus = 0;
    double gpu_rate = 0, visits = 0;
    int as_json = 0;
    dfm_opt table[] = {
        {"ranks", DFM_OPT_INT, &ranks, "1", "P", "ranks the stages will run on", 0, .min = "1"},
        {"tokens", DFM_OPT_INT, &tokens, "0", "N", "corpus size in LM tokens, when no chunk stage has run (0: from the manifest or the inputs)", 0},
        {"chunk-len", DFM_OPT_INT, &chunk_len, "32", "L", "as for dfm chunk (used with --tokens)", 0, .min = "1", .max = "4096"},
        {"index", DFM_OPT_STR, &factory, "auto", "STR", "as for dfm index", 0},
        {"index-memory", DFM_OPT_INT, &mem, "4G", "BYTES", "as for dfm index", 0, .min = "0"},
        {"train-sample", DFM_OPT_INT, &train, "0", "N", "as for dfm index", 0, .min = "0"},
        {"k", DFM_OPT_INT, &k, "16", "K", "as for dfm retrieve", 0, .min = "1", .max = "64"},
        {"query-block", DFM_OPT_INT, &qblock, "4096", "N", "as for dfm retrieve", 0, .min = "1", .max = "1048576"},
        {"margin", DFM_OPT_INT, &margin, "16", "M", "as for dfm retrieve", 0, .min = "0", .max = "4096"},
        {"visits", DFM_OPT_DOUBLE, &visits, "0", "V", "ranks a query's IVF search visits, as measured (a run's work record: the slowest rank's shard searches x ranks / queries; dfm index places neighbouring lists on one rank, so a query's nearest lists sit on few); 0: the upper bound for lists placed at random, P (1 - (1 - 1/P)^nprobe)", 0, .min = "0"},
        {"nprobe", DFM_OPT_INT, &nprobe, "16", "N", "IVF lists searched per query (dfm retrieve tunes it to --target-recall; this is the assumption)", 0, .min = "1"},
        {"encode-gpus", DFM_OPT_INT, &gpus, "0", "G", "encode on G GPUs (0: on the CPU ranks)", 0, .min = "0"},
        {"gpu-rate", DFM_OPT_DOUBLE, &gpu_rate, "20000", "R", "chunks per second per GPU with --encode-gpus: an assumption until measured on a GPU", 0, .min = "1"},
        {"dim", DFM_OPT_INT, &dim_opt, "0", "D", "embedding dimension (0: from the manifest, else 384)", 0},
        {"target-dtype", DFM_OPT_STR, &tdtype, "fp16", "T", "dtype of target embeddings", 0, .choices = "fp32|fp16|bf16"},
        {"window-tokens", DFM_OPT_INT, &window, "0", "N", "as for dfm chunk (0: its default)", 0, .min = "0"},
        {"node-memory", DFM_OPT_INT, &node_mem, "0", "BYTES", "memory of a training node, for the target-store advice: --store ids when its tables fit in half of it (0: this machine's)", 0, .min = "0"},
        {"json", DFM_OPT_FLAG, &as_json, NULL, NULL, "print one JSON object (per stage: memory_per_rank_bytes, disk_bytes, seconds)", 0},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("estimate", "RUN | CONFIG",
                            "Before submitting the jobs: memory per rank, disk and time per stage for a corpus and a "
                            "rank count, and whether to write targets with --store embeddings or ids. Sizes come from "
                            "RUN's manifest, or, before any stage has run, from a dfm build CONFIG's inputs or --tokens; "
                            "times (CPU-seconds of the slowest rank, one core each): index and retrieve from the slowest "
                            "rank's work (k-means, distances, codes scanned, shard searches) times rates measured on this "
                            "machine class (bench/results/large_point.md, Refit at d = 384), calibrated by the run's own "
                            "work records where it has them and its index is of the planned kind (a run that has indexed is "
                            "planned with its own index unless --index or --tokens is given); the other stages from the run's timings or the growth fits "
                            "(bench/results/report-retrieval.md, Cost growth).",
                            table, argc, argv, &pos, &npos, NULL);
    if (rc == DFM_OPTS_HELP) return 0;
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm estimate RUN|CONFIG [options]");
    if (!rc) {
        dfm_estimate_config ec = {ranks, tokens, chunk_len, factory, mem, train, k, qblock, dim_opt, tdtype, window, node_mem, nprobe, margin, visits,
                                  gpus, gpu_rate, as_json};
        rc = dfm_estimate_run(&ec, pos[0]);
    }
    free(pos);
    dfm_opts_free(table);
    return rc;
}
