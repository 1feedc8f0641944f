/* retrieve_cmd.c — `dfm index` and `dfm retrieve`: their flags, then the stages of stage.h (sources, the
 * stage contract and the manifest entry around the cores of retrieve.h). */
#include "retriever/retrieve.h"
#include "retriever/stage.h"

#include "common/error.h"
#include "common/opts.h"

#include <stdlib.h>
#include <string.h>

static int parse_metric(const char *s) {
    if (!s) return -1;
    return !strcmp(s, "l2") ? DFM_METRIC_L2 : DFM_METRIC_IP;
}

/* ---- dfm index ---- */

int dfm_cmd_index(int argc, char **argv) {
    dfm_mpi m;
    DFM_TRY(dfm_mpi_init(&argc, &argv, &m));
    char *factory = NULL, *metric_s = NULL;
    int64_t mem = 0, train = 0, seed = 0;
    int force = 0;
    dfm_opt table[] = {
        {"index", DFM_OPT_STR, &factory, "auto", "STR", "FAISS index-factory string (\"Flat\", \"IVF4096,Flat\", \"IVF4096,PQ32\", \"HNSW32\"; a PQ gets 'np': no polysemous training); auto: choose from N and --index-memory", 0},
        {"metric", DFM_OPT_STR, &metric_s, "ip", "ip|l2", "inner product (embeddings are normalised) or squared L2", 0, .choices = "ip|l2"},
        {"index-memory", DFM_OPT_INT, &mem, "4G", "BYTES", "memory budget per rank for the index (auto choice)", 0, .min = "0"},
        {"train-sample", DFM_OPT_INT, &train, "0", "N", "training points (0: ~100 per list, at least 39*256 for PQ)", 0, .min = "0"},
        {"seed", DFM_OPT_INT, &seed, "1234", "S", "seed of the training sample", 0},
        {"force", DFM_OPT_FLAG, &force, NULL, NULL, "redo the stage even if the manifest says it is complete, or differs", 1},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    json_t *cfg = NULL;
    int rc = dfm_opts_parse("index", "RUN",
                            "Build one FAISS index shard per rank from RUN's embeddings: train on a seeded sample spread over all "
                            "ranks (IVF: k-means of the coarse quantiser and the PQ codebooks on every rank, the same bytes for "
                            "any number of ranks; other indexes: FAISS on rank 0), broadcast the trained empty index (kept as "
                            "RUN/index/trained.faiss), add each rank's vectors with their global chunk ids, write "
                            "RUN/index/index-RRRRR.faiss + .json atomically.",
                            table, argc, argv, &pos, &npos, &cfg);
    if (rc == DFM_OPTS_HELP) return 0;
    int metric = parse_metric(metric_s);
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm index RUN [options] (see --help)");
    rc = dfm_mpi_agree(&m, rc);
    if (!rc) {
        dfm_index_opts o = {pos[0], factory, (uint32_t)metric, (uint64_t)mem, (uint64_t)train, (uint64_t)seed};
        rc = dfm_index_stage(&m, &o, cfg, force);
    }
    json_decref(cfg);
    free(pos);
    dfm_opts_free(table);
    return rc;
}

/* ---- dfm retrieve ---- */

int dfm_cmd_retrieve(int argc, char **argv) {
    dfm_mpi m;
    DFM_TRY(dfm_mpi_init(&argc, &argv, &m));
    char *exclude_s = NULL, *metric_s = NULL, *datastore = NULL;
    int64_t k = 0, margin = 0, max_margin = 0, window = 0, qblock = 0, nprobe = 0, ef = 0, measure = 0, seed = 0;
    double target = 0;
    int force = 0;
    dfm_opt table[] = {
        {"k", DFM_OPT_INT, &k, "16", "K", "neighbours per chunk (the neighbour mask is 64 bits)", 0, .min = "1", .max = "64"},
        {"margin", DFM_OPT_INT, &margin, "16", "M", "extra candidates fetched per shard before exclusions (k' = K + M)", 0, .min = "0", .max = "4096"},
        {"max-margin", DFM_OPT_INT, &max_margin, "256", "M",
         "with --target-recall, on an index of compressed codes (PQ, SQ): widen the margin up to M when visiting more lists "
         "stops raising the recall (the codes then bound it); --margin and below: the margin stays as given", 0, .min = "0", .max = "4096"},
        {"exclude", DFM_OPT_STR, &exclude_s, "sequence", "POLICY", "neighbours excluded by id (see retriever/topk.h)", 0, .choices = "none|self|sequence|document"},
        {"query-window", DFM_OPT_INT, &window, "1", "W", "the query is the mean of the W preceding chunks of the sequence (renormalised)", 0, .min = "1", .max = "1024"},
        {"query-block", DFM_OPT_INT, &qblock, "4096", "N", "queries per rank per round (bounds memory)", 0, .min = "1", .max = "1048576"},
        {"metric", DFM_OPT_STR, &metric_s, NULL, "ip|l2", "check the index's metric (default: use it)", 0, .choices = "ip|l2"},
        {"nprobe", DFM_OPT_INT, &nprobe, "0", "N", "IVF lists visited per query (0: tuned to --target-recall)", 0, .min = "0"},
        {"ef-search", DFM_OPT_INT, &ef, "0", "N", "HNSW search depth (0: tuned to --target-recall)", 0, .min = "0"},
        {"target-recall", DFM_OPT_DOUBLE, &target, "0.95", "R",
         "unless --nprobe / --ef-search is given, tune it to the smallest value reaching recall@K >= R against brute force on "
         "held-out queries (printed, and recorded in the manifest as \"tuning\"); 0: FAISS default", 0, .min = "0", .max = "1"},
        {"measure-recall", DFM_OPT_INT, &measure, "0", "N", "measure recall@K against brute force on N sampled queries", 0, .min = "0"},
        {"seed", DFM_OPT_INT, &seed, "1234", "S", "seed of the sampled queries", 0},
        {"datastore", DFM_OPT_STR, &datastore, NULL, "DS_RUN",
         "search the index and chunks of another run instead of RUN's own: RUN is then a query-only run (its chunk and encode "
         "stages suffice), its neighbours are DS_RUN's chunks (write-targets and inspect read them from there); needs --exclude none", 0},
        {"force", DFM_OPT_FLAG, &force, NULL, NULL, "redo the stage even if the manifest says it is complete, or differs", 1},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    json_t *cfg = NULL;
    int rc = dfm_opts_parse("retrieve", "RUN",
                            "Find the top-K neighbours of every chunk's query (the chunk before it) in all index shards: query "
                            "blocks visit every rank (IVF: with their probe lists, computed once by the query's owner), "
                            "candidates merge exactly (score, then id), exclusions by id, re-search deeper when too few "
                            "survive, pad with -1 otherwise. Writes RUN/retrieve/nbr-BBBBBB.bin; an interrupted run keeps "
                            "its finished blocks.",
                            table, argc, argv, &pos, &npos, &cfg);
    if (rc == DFM_OPTS_HELP) return 0;
    int excl = dfm_exclude_parse(exclude_s), metric = parse_metric(metric_s);
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm retrieve RUN [options] (see --help)");
    rc = dfm_mpi_agree(&m, rc);
    if (!rc) {
        dfm_retrieve_opts o = {pos[0], NULL,   (uint32_t)k, (uint32_t)margin, (uint32_t)excl,    (uint32_t)window, (uint64_t)qblock,
                               metric, nprobe, ef,          target,           (uint32_t)max_margin, (uint64_t)measure, (uint64_t)seed};
        rc = dfm_retrieve_stage(&m, &o, datastore, cfg, force);
    }
    json_decref(cfg);
    free(pos);
    dfm_opts_free(table);
    return rc;
}
