/* retrieve_cmd.c — `dfm index`, `dfm retrieve`, `dfm estimate`: flags and the stage's manifest entry around
 * the cores (retrieve.h over run_sources.h; estimate.h). */
#include "retriever/estimate.h"
#include "retriever/retrieve.h"
#include "retriever/run_sources.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/opts.h"
#include "schemas/chunk_shard.h"
#include "schemas/embedding_shard.h"
#include "schemas/neighbor_shard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_metric(const char *s) {
    if (!s) return -1;
    return !strcmp(s, "l2") ? DFM_METRIC_L2 : DFM_METRIC_IP;
}

/* one index shard, whole: sidecar, size, hash, and FAISS can read it */
static int index_file_ok(const char *path) {
    FaissIndex *idx = NULL;
    dfm_index_info info;
    DFM_TRY(dfm_index_load(path, 0, -1, &idx, &info));
    faiss_Index_free(idx);
    return DFM_OK;
}

/* The stage contract (common/manifest.h) on rank 0, its outcome on every rank (*skip); agreed. An
 * interrupted index is redone whole; an interrupted retrieve keeps its finished blocks (retrieve.c). */
static int stage_begin(const dfm_mpi *m, const char *run, const char *name, json_t *cfg, int force, int *skip) {
    int rc = DFM_OK, sk = 0;
    if (m->rank == 0) {
        json_t *man = NULL;
        dfm_stage_spec spec = {name, cfg, NULL, force, m->size};
        spec.file_ok = !strcmp(name, "index") ? index_file_ok : dfm_nbr_block_check;
        dfm_stage_action act = DFM_STAGE_FRESH;
        rc = dfm_manifest_load(run, 0, &man);
        if (!rc) rc = dfm_stage_begin(man, run, &spec, &act);
        sk = act == DFM_STAGE_SKIP;
        json_decref(man);
    }
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = DFM_MPI_CHECK(MPI_Bcast(&sk, 1, MPI_INT, 0, m->comm));
    *skip = sk;
    return rc;
}

/* rank 0: the finished stage object st into the manifest, with the config recorded at its begin
 * (what later runs compare against, whatever the core resolved since) */
static int stage_end(const dfm_mpi *m, const char *run, const char *name, json_t *st) {
    if (m->rank != 0) return DFM_OK;
    json_t *man = NULL;
    DFM_TRY(dfm_manifest_load(run, 0, &man));
    json_t *cfg = json_object_get(dfm_manifest_stage(man, name), "config");
    json_incref(st);
    if (cfg) json_object_set(st, "config", cfg);
    int rc = dfm_manifest_set_stage(man, name, st);
    if (!rc) rc = dfm_manifest_save(run, man);
    json_decref(man);
    return rc;
}

/* ---- dfm index ---- */

int dfm_cmd_index(int argc, char **argv) {
    dfm_mpi m;
    DFM_TRY(dfm_mpi_init(&argc, &argv, &m));
    char *factory = NULL, *metric_s = NULL;
    int64_t mem = 0, train = 0, seed = 0;
    int force = 0, skip = 0;
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
    json_t *cfg = NULL, *stage = NULL;
    dfm_run_sources src = {0};
    int rc = dfm_opts_parse("index", "RUN",
                            "Build one FAISS index shard per rank from RUN's embeddings: train on a seeded sample spread over all "
                            "ranks (IVF: k-means of the coarse quantiser and the PQ codebooks on every rank, the same bytes for "
                            "any number of ranks; other indexes: FAISS on rank 0), broadcast the trained empty index (kept as "
                            "RUN/index/trained.faiss), add each rank's vectors with their global chunk ids, write "
                            "RUN/index/index-RRRRR.faiss + .json atomically.",
                            table, argc, argv, &pos, &npos, &cfg);
    if (rc == DFM_OPTS_HELP) {
        return 0;
    }
    int metric = parse_metric(metric_s);
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm index RUN [options] (see --help)");
    const char *run = npos ? pos[0] : NULL;
    if (!rc) rc = dfm_run_sources_open(run, &src);
    rc = dfm_mpi_agree(&m, rc);
    if (!rc) rc = stage_begin(&m, run, "index", cfg, force, &skip);
    if (!rc && !skip) {
        dfm_index_opts o = {run, factory, (uint32_t)metric, (uint64_t)mem, (uint64_t)train, (uint64_t)seed};
        rc = dfm_index_build(&m, &o, &src.vs, &src.cs, src.emb->block_chunks, &stage);
    }
    if (!rc && !skip) rc = stage_end(&m, run, "index", stage);
    rc = dfm_mpi_agree(&m, rc);
    json_decref(stage);
    json_decref(cfg);
    dfm_run_sources_close(&src);
    free(pos);
    dfm_opts_free(table);
    return rc;
}

/* ---- dfm retrieve ---- */

int dfm_cmd_retrieve(int argc, char **argv) {
    dfm_mpi m;
    DFM_TRY(dfm_mpi_init(&argc, &argv, &m));
    char *exclude_s = NULL, *metric_s = NULL, *datastore = NULL;
    int64_t k = 0, margin = 0, window = 0, qblock = 0, nprobe = 0, ef = 0, measure = 0, seed = 0;
    double target = 0;
    int force = 0, skip = 0;
    dfm_opt table[] = {
        {"k", DFM_OPT_INT, &k, "16", "K", "neighbours per chunk (the neighbour mask is 64 bits)", 0, .min = "1", .max = "64"},
        {"margin", DFM_OPT_INT, &margin, "16", "M", "extra candidates fetched per shard before exclusions (k' = K + M)", 0, .min = "0", .max = "4096"},
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
    json_t *cfg = NULL, *stage = NULL, *man = NULL, *dman = NULL;
    dfm_run_sources src = {0}, dsrc = {0};
    char *ds_abs = NULL;
    int rc = dfm_opts_parse("retrieve", "RUN",
                            "Find the top-K neighbours of every chunk's query (the chunk before it) in all index shards: query "
                            "blocks visit every rank (IVF: with their probe lists, computed once by the query's owner), "
                            "candidates merge exactly (score, then id), exclusions by id, re-search deeper when too few "
                            "survive, pad with -1 otherwise. Writes RUN/retrieve/nbr-BBBBBB.bin; an interrupted run keeps "
                            "its finished blocks.",
                            table, argc, argv, &pos, &npos, &cfg);
    if (rc == DFM_OPTS_HELP) {
        return 0;
    }
    int excl = dfm_exclude_parse(exclude_s), metric = parse_metric(metric_s);
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm retrieve RUN [options] (see --help)");
    const char *run = npos ? pos[0] : NULL;
    if (!rc) rc = dfm_run_sources_open(run, &src);
    if (!rc) rc = dfm_manifest_load(run, 0, &man);
    if (!rc && !datastore) rc = dfm_manifest_require_complete(man, "index", run);
    if (!rc && datastore) { /* a query-only run: the datastore's index, chunks and rows */
        if (!(ds_abs = realpath(datastore, NULL))) rc = DFM_FAIL(DFM_ENOTFOUND, "--datastore %s: %s", datastore, strerror(errno));
        if (!rc) rc = dfm_run_sources_open(ds_abs, &dsrc);
        if (!rc) rc = dfm_manifest_load(ds_abs, 0, &dman);
        if (!rc) rc = dfm_manifest_require_complete(dman, "index", ds_abs);
        if (rc) dfm_error_prefix("--datastore %s", datastore);
    }
    rc = dfm_mpi_agree(&m, rc);
    if (!rc) rc = stage_begin(&m, run, "retrieve", cfg, force, &skip);
    if (!rc && !skip) {
        dfm_retrieve_opts o = {run,    ds_abs, (uint32_t)k, (uint32_t)margin, (uint32_t)excl,    (uint32_t)window, (uint64_t)qblock,
                               metric, nprobe, ef,          target,           (uint64_t)measure, (uint64_t)seed};
        rc = dfm_retrieve_run(&m, &o, &src.vs, &src.cs, src.emb->block_chunks, ds_abs ? &dsrc.vs : NULL, ds_abs ? &dsrc.cs : NULL,
                              dfm_manifest_stage(ds_abs ? dman : man, "index"), &stage);
    }
    if (!rc && !skip && stage && ds_abs) /* rank 0: which run the neighbour ids index (shard/target_source.c reads it) */
        json_object_set_new(stage, "datastore", json_pack("{s:s, s:I}", "run", ds_abs, "chunks", (json_int_t)dsrc.vs.n_rows));
    if (!rc && !skip) rc = stage_end(&m, run, "retrieve", stage);
    rc = dfm_mpi_agree(&m, rc);
    json_decref(stage);
    json_decref(man);
    json_decref(dman);
    free(ds_abs);
    dfm_run_sources_close(&dsrc);
    json_decref(cfg);
    dfm_run_sources_close(&src);
    free(pos);
    dfm_opts_free(table);
    return rc;
}

/* ---- dfm estimate ---- */

int dfm_cmd_estimate(int argc, char **argv) {
    char *factory = NULL, *tdtype = NULL;
    int64_t mem = 0, train = 0, k = 0, qblock = 0, ranks = 0, dim_opt = 0, tokens = 0, chunk_len = 0, window = 0, node_mem = 0;
    int64_t nprobe = 0, margin = 0, gpus = 0;
    double gpu_rate = 0;
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
                            "machine class (BENCHMARKS.md, Index and retrieve as ranks grow), calibrated by the run's own "
                            "work records where it has them; the other stages from the run's timings or the growth fits "
                            "(BENCHMARKS.md, Cost growth).",
                            table, argc, argv, &pos, &npos, NULL);
    if (rc == DFM_OPTS_HELP) return 0;
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm estimate RUN|CONFIG [options]");
    if (!rc) {
        dfm_estimate_config ec = {ranks, tokens, chunk_len, factory, mem, train, k, qblock, dim_opt, tdtype, window, node_mem, nprobe, margin, gpus,
                                  gpu_rate, as_json};
        rc = dfm_estimate_run(&ec, pos[0]);
    }
    free(pos);
    dfm_opts_free(table);
    return rc;
}
