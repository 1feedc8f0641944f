/* cmd.c — `dfm index`, `dfm retrieve`, `dfm estimate`: flags, manifest, and the run's real readers. */
#include "retriever/retrieve.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/opts.h"
#include "schemas/chunk_shard.h"
#include "schemas/embedding_shard.h"
#include "schemas/neighbor_shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the run's embeddings and chunks as sources ---- */

static int emb_rows(void *ctx, uint64_t first, uint64_t n, float *out) { return dfm_emb_set_rows_f32(ctx, first, n, out); }

static const float *emb_row(void *ctx, uint64_t id) {
    const dfm_emb_set *e = ctx;
    return e->dtype == DFM_EMB_F32 ? (const float *)dfm_emb_set_row(e, id) : NULL;
}

static const dfm_chunk_meta *chunk_meta(void *ctx, uint64_t id) {
    const dfm_chunk_meta *m = NULL;
    if (dfm_chunk_set_get(ctx, id, &m, NULL)) {
        static const dfm_chunk_meta none = {0}; /* callers check ids first; never reached */
        return &none;
    }
    return m;
}

typedef struct {
    dfm_chunk_set *chunks;
    dfm_emb_set *emb;
    dfm_vec_source vs;
    dfm_chunk_source cs;
} run_sources;

static int sources_open(const char *run, run_sources *s) {
    memset(s, 0, sizeof *s);
    DFM_TRY(dfm_chunk_set_open(run, &s->chunks));
    int rc = dfm_emb_set_open(run, &s->emb);
    if (rc) return rc;
    if (s->emb->n_rows != s->chunks->n_chunks)
        return DFM_FAIL(DFM_EMISMATCH, "run %s has %llu embeddings for %llu chunks. HINT: re-run 'dfm encode'", run,
                        (unsigned long long)s->emb->n_rows, (unsigned long long)s->chunks->n_chunks);
    s->vs = (dfm_vec_source){s->emb->dim, s->emb->n_rows, emb_rows, s->emb, emb_row};
    s->cs = (dfm_chunk_source){s->chunks->n_chunks, s->chunks->chunk_len ? s->chunks->seq_len / s->chunks->chunk_len : 0, chunk_meta,
                               s->chunks};
    return DFM_OK;
}

static void sources_close(run_sources *s) {
    dfm_emb_set_close(s->emb);
    dfm_chunk_set_close(s->chunks);
    memset(s, 0, sizeof *s);
}

/* --metric (the tables allow ip and l2); -1 when unset */
static int parse_metric(const char *s) {
    if (!s) return -1;
    return !strcmp(s, "l2") ? DFM_METRIC_L2 : DFM_METRIC_IP;
}

/* drop stages that depend on `stage` (they are stale once it is redone) */
/* rank 0: mark the stage running (or finish it with st) in the manifest */
static int manifest_stage(const dfm_mpi *m, const char *run, const char *name, json_t *cfg, json_t *st) {
    if (m->rank != 0) return DFM_OK;
    json_t *man = NULL;
    DFM_TRY(dfm_manifest_load(run, 0, &man));
    if (!st) {
        st = json_pack("{s:s, s:i}", "state", "running", "ranks", m->size);
        dfm_manifest_drop_later(man, name);
    } else {
        json_incref(st);
    }
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
    dfm_opt table[] = {
        {"index", DFM_OPT_STR, &factory, "auto", "STR", "FAISS index-factory string (\"Flat\", \"IVF4096,Flat\", \"IVF4096,PQ32\", \"HNSW32\"); auto: choose from N and --index-memory", 0},
        {"metric", DFM_OPT_STR, &metric_s, "ip", "ip|l2", "inner product (embeddings are normalised) or squared L2", 0, .choices = "ip|l2"},
        {"index-memory", DFM_OPT_INT, &mem, "4G", "BYTES", "memory budget per rank for the index (auto choice)", 0, .min = "0"},
        {"train-sample", DFM_OPT_INT, &train, "0", "N", "training points (0: ~100 per list, at least 39*256 for PQ)", 0, .min = "0"},
        {"seed", DFM_OPT_INT, &seed, "1234", "S", "seed of the training sample", 0},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    json_t *cfg = NULL, *stage = NULL;
    run_sources src = {0};
    int rc = dfm_opts_parse("index", "RUN",
                            "Build one FAISS index shard per rank from RUN's embeddings: train once on a seeded sample gathered "
                            "from all ranks (rank 0), broadcast the trained empty index, add each rank's vectors with their "
                            "global chunk ids, write RUN/index/index-RRRRR.faiss + .json atomically.",
                            table, argc, argv, &pos, &npos, &cfg);
    if (rc == DFM_OPTS_HELP) {
        dfm_mpi_finalize();
        return 0;
    }
    int metric = parse_metric(metric_s);
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm index RUN [options] (see --help)");
    const char *run = npos ? pos[0] : NULL;
    if (!rc) rc = sources_open(run, &src);
    rc = dfm_mpi_agree(&m, rc);
    if (!rc) rc = manifest_stage(&m, run, "index", cfg, NULL);
    rc = dfm_mpi_agree(&m, rc);
    if (!rc) {
        dfm_index_opts o = {run, factory, (uint32_t)metric, (uint64_t)mem, (uint64_t)train, (uint64_t)seed};
        rc = dfm_index_build(&m, &o, &src.vs, &src.cs, src.emb->block_chunks, &stage);
    }
    if (!rc) rc = manifest_stage(&m, run, "index", cfg, stage);
    rc = dfm_mpi_agree(&m, rc);
    json_decref(stage);
    json_decref(cfg);
    sources_close(&src);
    free(pos);
    dfm_opts_free(table);
    dfm_mpi_finalize();
    return rc;
}

/* ---- dfm retrieve ---- */

int dfm_cmd_retrieve(int argc, char **argv) {
    dfm_mpi m;
    DFM_TRY(dfm_mpi_init(&argc, &argv, &m));
    char *exclude_s = NULL, *metric_s = NULL;
    int64_t k = 0, margin = 0, window = 0, qblock = 0, nprobe = 0, ef = 0, measure = 0, seed = 0;
    double target = 0;
    dfm_opt table[] = {
        {"k", DFM_OPT_INT, &k, "16", "K", "neighbours per chunk (the neighbour mask is 64 bits)", 0, .min = "1", .max = "64"},
        {"margin", DFM_OPT_INT, &margin, "16", "M", "extra candidates fetched per shard before exclusions (k' = K + M)", 0, .min = "0", .max = "4096"},
        {"exclude", DFM_OPT_STR, &exclude_s, "sequence", "POLICY", "neighbours excluded by id (see retriever/topk.h)", 0, .choices = "none|self|sequence|document"},
        {"query-window", DFM_OPT_INT, &window, "1", "W", "the query is the mean of the W preceding chunks of the sequence (renormalised)", 0, .min = "1", .max = "1024"},
        {"query-block", DFM_OPT_INT, &qblock, "4096", "N", "queries per rank per round (bounds memory)", 0, .min = "1", .max = "1048576"},
        {"metric", DFM_OPT_STR, &metric_s, NULL, "ip|l2", "check the index's metric (default: use it)", 0, .choices = "ip|l2"},
        {"nprobe", DFM_OPT_INT, &nprobe, "0", "N", "IVF lists visited per query (0: FAISS default, or tuned)", 0, .min = "0"},
        {"ef-search", DFM_OPT_INT, &ef, "0", "N", "HNSW search depth (0: FAISS default, or tuned)", 0, .min = "0"},
        {"target-recall", DFM_OPT_DOUBLE, &target, "0", "R", "tune nprobe / efSearch to reach recall@K >= R on held-out queries", 0, .min = "0", .max = "1"},
        {"measure-recall", DFM_OPT_INT, &measure, "0", "N", "measure recall@K against brute force on N sampled queries", 0, .min = "0"},
        {"seed", DFM_OPT_INT, &seed, "1234", "S", "seed of the sampled queries", 0},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    json_t *cfg = NULL, *stage = NULL, *man = NULL;
    run_sources src = {0};
    int rc = dfm_opts_parse("retrieve", "RUN",
                            "Find the top-K neighbours of every chunk's query (the chunk before it) in all index shards: query "
                            "blocks visit every rank, candidates merge exactly (score, then id), exclusions by id, re-search "
                            "deeper when too few survive, pad with -1 otherwise. Writes RUN/retrieve/nbr-BBBBBB.bin.",
                            table, argc, argv, &pos, &npos, &cfg);
    if (rc == DFM_OPTS_HELP) {
        dfm_mpi_finalize();
        return 0;
    }
    int excl = dfm_exclude_parse(exclude_s), metric = parse_metric(metric_s);
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm retrieve RUN [options] (see --help)");
    const char *run = npos ? pos[0] : NULL;
    if (!rc) rc = sources_open(run, &src);
    if (!rc) rc = dfm_manifest_load(run, 0, &man);
    if (!rc) rc = dfm_manifest_require_complete(man, "index", run);
    rc = dfm_mpi_agree(&m, rc);
    if (!rc) rc = manifest_stage(&m, run, "retrieve", cfg, NULL);
    rc = dfm_mpi_agree(&m, rc);
    if (!rc) {
        dfm_retrieve_opts o = {run,    (uint32_t)k, (uint32_t)margin, (uint32_t)excl,    (uint32_t)window, (uint64_t)qblock,
                               metric, nprobe,      ef,               target,            (uint64_t)measure, (uint64_t)seed};
        rc = dfm_retrieve_run(&m, &o, &src.vs, &src.cs, src.emb->block_chunks, dfm_manifest_stage(man, "index"), &stage);
    }
    if (!rc) rc = manifest_stage(&m, run, "retrieve", cfg, stage);
    rc = dfm_mpi_agree(&m, rc);
    json_decref(stage);
    json_decref(man);
    json_decref(cfg);
    sources_close(&src);
    free(pos);
    dfm_opts_free(table);
    dfm_mpi_finalize();
    return rc;
}

/* ---- dfm estimate ---- */

static void human(char *out, size_t n, double bytes) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int i = 0;
    while (bytes >= 1024 && i < 5) {
        bytes /= 1024;
        i++;
    }
    snprintf(out, n, "%.1f %s", bytes, u[i]);
}

/* Throughput per rank used when the run has not measured a stage yet: what the 2-core CI machine
 * does (BENCHMARKS.md, 2026-11-29); a run's own manifest timings replace them stage by stage. */
static const struct {
    const char *stage, *count;
    double per_rank_s; /* items per second per rank */
    const char *unit;
} default_rates[] = {
    {"chunk", "tokens", 90000, "tokens"},       {"encode", "chunks", 35, "chunks (CPU)"},
    {"index", "vectors", 60000, "vectors"},      {"retrieve", "queries", 3500, "queries"},
    {"targets", "records", 7500, "records"},
};

/* estimate's sizes: from a run's manifest when there is one, else from a config and a token count */
static int estimate_sizes(const char *arg, int64_t tokens_opt, int64_t chunk_len, json_t **man, char **run_out,
                          long long *n_chunks, long long *n_tokens) {
    *man = NULL;
    *run_out = NULL;
    *n_chunks = *n_tokens = -1;
    size_t la = strlen(arg);
    json_t *cfg = NULL;
    uint64_t input_bytes = 0;
    if (la > 5 && !strcmp(arg + la - 5, ".json") && dfm_path_exists(arg)) { /* a dfm build config */
        json_error_t e;
        cfg = json_load_file(arg, 0, &e);
        if (!cfg) return DFM_FAIL(DFM_EARG, "config %s, line %d: %s", arg, e.line, e.text);
        const char *r = json_string_value(json_object_get(cfg, "run"));
        if (r) *run_out = strdup(r);
        json_t *in = json_object_get(cfg, "inputs"), *v;
        size_t i;
        if (json_is_array(in)) json_array_foreach(in, i, v) {
                uint64_t sz = 0;
                if (json_is_string(v) && !dfm_file_size(json_string_value(v), &sz)) input_bytes += sz;
            }
        dfm_error_clear();
    } else {
        *run_out = strdup(arg);
    }
    json_decref(cfg);
    if (*run_out) {
        char *mp = dfm_path_join(*run_out, "manifest.json");
        if (mp && dfm_path_exists(mp)) DFM_TRY(dfm_manifest_load(*run_out, 0, man));
        free(mp);
    }
    if (*man) {
        *n_chunks = dfm_manifest_count(*man, "chunk", "chunks");
        *n_tokens = dfm_manifest_count(*man, "chunk", "stream_tokens");
    }
    if (*n_chunks < 0 || tokens_opt > 0) { /* --tokens: size a bigger corpus with this run's rates */
        double t = tokens_opt > 0 ? (double)tokens_opt : input_bytes ? (double)input_bytes / 4.0 : -1;
        if (t < 0)
            return DFM_FAIL(DFM_ESTATE, "%s: no chunk stage yet. HINT: pass --tokens N (corpus size in LM tokens), or a config whose inputs exist", arg);
        *n_tokens = (long long)t;
        *n_chunks = (long long)(t / (double)chunk_len + 0.999);
        if (!tokens_opt)
            printf("(corpus size guessed from %.1f MB of inputs at about 4 bytes per token; --tokens N sets it)\n", (double)input_bytes / 1e6);
    }
    return DFM_OK;
}

int dfm_cmd_estimate(int argc, char **argv) {
    char *factory = NULL, *tdtype = NULL;
    int64_t mem = 0, train = 0, k = 0, qblock = 0, ranks = 0, dim_opt = 0, tokens = 0, chunk_len = 0;
    dfm_opt table[] = {
        {"ranks", DFM_OPT_INT, &ranks, "1", "P", "ranks the stages will run on", 0, .min = "1"},
        {"tokens", DFM_OPT_INT, &tokens, "0", "N", "corpus size in LM tokens, when no chunk stage has run (0: from the manifest or the inputs)", 0},
        {"chunk-len", DFM_OPT_INT, &chunk_len, "32", "L", "as for dfm chunk (used with --tokens)", 0, .min = "1", .max = "4096"},
        {"index", DFM_OPT_STR, &factory, "auto", "STR", "as for dfm index", 0},
        {"index-memory", DFM_OPT_INT, &mem, "4G", "BYTES", "as for dfm index", 0, .min = "0"},
        {"train-sample", DFM_OPT_INT, &train, "0", "N", "as for dfm index", 0, .min = "0"},
        {"k", DFM_OPT_INT, &k, "16", "K", "as for dfm retrieve", 0, .min = "1", .max = "64"},
        {"query-block", DFM_OPT_INT, &qblock, "4096", "N", "as for dfm retrieve", 0, .min = "1", .max = "1048576"},
        {"dim", DFM_OPT_INT, &dim_opt, "0", "D", "embedding dimension (0: from the manifest, else 384)", 0},
        {"target-dtype", DFM_OPT_STR, &tdtype, "fp16", "T", "dtype of target embeddings", 0, .choices = "fp32|fp16|bf16"},
        {0},
    };
    char **pos = NULL, *run = NULL;
    int npos = 0;
    json_t *man = NULL;
    int rc = dfm_opts_parse("estimate", "RUN | CONFIG",
                            "Before submitting the jobs: memory per rank, disk and a rough time per stage for a corpus "
                            "and a rank count. Sizes come from RUN's manifest, or, before any stage has run, from a "
                            "dfm build CONFIG's inputs or --tokens; times from the run's own measured rates where a "
                            "stage has run, else from this machine class's (BENCHMARKS.md).",
                            table, argc, argv, &pos, &npos, NULL);
    if (rc == DFM_OPTS_HELP) return 0;
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm estimate RUN|CONFIG [options]");
    long long n = -1, n_tokens = -1;
    if (!rc) rc = estimate_sizes(pos[0], tokens, chunk_len, &man, &run, &n, &n_tokens);
    json_t *enc = rc ? NULL : dfm_manifest_stage(man, "encode");
    long long dim = dim_opt ? dim_opt : enc ? (long long)json_integer_value(json_object_get(enc, "dim")) : 384;
    const char *edt = enc ? json_string_value(json_object_get(enc, "dtype")) : NULL;
    if (!rc && dim <= 0) rc = DFM_FAIL(DFM_ESTATE, "no embedding dimension: pass --dim");
    int tdt = dfm_emb_dtype_parse(tdtype);
    dfm_index_plan plan;
    if (!rc) rc = dfm_index_plan_make(factory, (uint64_t)n, (uint32_t)dim, (int)ranks, (uint64_t)mem, DFM_METRIC_IP, (uint64_t)train, &plan);
    if (!rc) {
        char a[32], b[32], c[32], d[32], e[32];
        double N = (double)n, P = (double)ranks, D = (double)dim;
        double emb_bytes = N * D * (edt ? (double)dfm_emb_dtype_size((uint32_t)dfm_emb_dtype_parse(edt)) : 4.0);
        double idx_disk = plan.exact_scores ? N * (4 * D + 8) : (double)plan.bytes_per_rank * P;
        if (plan.nlist) idx_disk += P * (double)plan.nlist * 4 * D;
        double idx_mem = idx_disk / P;
        double train_mem = (double)plan.train_n * 4 * D;
        double round_q = P * (double)qblock;
        double ret_mem = idx_mem + round_q * (4 * D + 32 + 2.0 * 16 * (double)k) + (double)qblock * (4 * D + 16 * (double)k) +
                         (double)DFM_EMB_DEFAULT_BLOCK_CHUNKS * (double)dfm_nbr_row_bytes((uint32_t)k);
        double ret_disk = N * (double)dfm_nbr_row_bytes((uint32_t)k);
        double tgt = N * ((double)k * D * (double)dfm_emb_dtype_size((uint32_t)tdt) + 12.0 * (double)k + 64);
        printf("run %s: %lld tokens, %lld chunks, dim %lld, %lld rank(s)\n", run ? run : pos[0], n_tokens, n, dim, (long long)ranks);
        human(a, sizeof a, 4.0 * (double)n_tokens / P + 150e6);
        printf("  chunk: memory/rank about %s (4 bytes per token of the rank's share + the tokenizer)\n", a);
        human(a, sizeof a, emb_bytes);
        printf("  embeddings on disk:           %s\n", a);
        human(a, sizeof a, idx_mem);
        human(b, sizeof b, idx_disk);
        human(c, sizeof c, train_mem);
        printf("  index  %-22s memory/rank %s, disk %s, training sample %s on rank 0\n", plan.factory, a, b, c);
        printf("         why: %s\n", plan.why);
        human(a, sizeof a, ret_mem);
        human(b, sizeof b, ret_disk);
        printf("  retrieve (K=%lld, block %lld): memory/rank %s (index + query rounds), disk %s\n", (long long)k, (long long)qblock, a, b);
        human(d, sizeof d, tgt);
        human(e, sizeof e, tgt / P);
        printf("  targets (%s, before zstd):   disk up to %s (%s per rank)\n", dfm_emb_dtype_name((uint32_t)tdt), d, e);
        /* rough time per stage: items / (rate per rank * ranks); the run's own rates where it has them */
        double items[5] = {(double)n_tokens, N, N, N, N}, total = 0;
        printf("  rough time per stage on %lld rank(s):\n", (long long)ranks);
        for (int st = 0; st < 5; st++) {
            double rate = default_rates[st].per_rank_s;
            const char *src = "default";
            json_t *ms = man ? dfm_manifest_stage(man, default_rates[st].stage) : NULL;
            double t = json_number_value(json_object_get(json_object_get(ms, "timings"), "total_s"));
            json_t *cnt = json_object_get(json_object_get(ms, "counts"), default_rates[st].count);
            int pr = (int)json_integer_value(json_object_get(ms, "ranks"));
            if (t > 0 && json_is_integer(cnt) && json_integer_value(cnt) > 0) {
                rate = (double)json_integer_value(cnt) / t / (pr > 0 ? pr : 1);
                src = "this run";
            }
            double sec = items[st] / (rate * P);
            total += sec;
            printf("    %-9s %10.0f s  (%.0f %s/s per rank, %s)\n", default_rates[st].stage, sec, rate, default_rates[st].unit, src);
        }
        printf("    %-9s %10.0f s  (%.1f h)\n", "total", total, total / 3600);
    }
    json_decref(man);
    free(run);
    free(pos);
    dfm_opts_free(table);
    return rc;
}
