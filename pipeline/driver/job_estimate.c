/* job_estimate.c — `dfm estimate`: memory per rank, disk and time of every stage of a job (see job_estimate.h). */
#include "pipeline/driver/job_estimate.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"
#include "pipeline/chunk/chunk.h"
#include "retriever/estimate.h"
#include "retriever/index.h"
#include "retriever/ivf.h"
#include "schemas/embedding_shard.h"
#include "schemas/neighbor_shard.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void human(char *out, size_t n, double bytes) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int i = 0;
    while (bytes >= 1024 && i < 5) {
        bytes /= 1024;
        i++;
    }
    snprintf(out, n, "%.1f %s", bytes, u[i]);
}

/* The cost model of chunk, encode and write-targets, fitted by bench/retrieval/growth.sh on its np = 1 points
 * (bench/results/growth.md, 2026-12-01, the shared 2-core VM; 1e5, 3e5 and 1e6 chunks, 1.3M to 21M
 * tokens for chunk). CPU-seconds of the slowest rank
 *     t = t0 + a * n^b / P * (d / 64)^e
 * n the stage's items, P the ranks. t0 is a fixed start-up (loading the tokenizer). e from the point at
 * d = 384 (write-targets 0.46: zstd and LMDB costs per record that do not grow with d). base_rss is the
 * measured peak RSS per rank at the smallest point minus the stage's own buffers (process, MPI,
 * libraries; for chunk the tokenizer). encode's rate is the CPU encoder's on real chunk texts, one
 * thread: 127.6 chunks per CPU-second (bench/results/encoder_cpu.md, 2026-12-01). Index and retrieve
 * are modelled from their work instead (retriever/estimate.h). */
typedef struct {
    const char *stage, *count;
    double t0, a, b, e;
    double base_rss;
} stage_model;
static const stage_model models[] = {
    {"chunk", "stream_tokens", 0.87, 1.99e-7, 1.0, 0.0, 148e6},
    {"encode", "chunks", 0.0, 1.0 / 127.6, 1.0, 0.0, 330e6},
    {"index", "vectors", 0.0, 0, 0, 0, 32e6},
    {"retrieve", "queries", 0.0, 0, 0, 0, 43e6},
    {"targets", "records", 0.0, 2.23e-5, 1.03, 0.46, 25e6},
};
enum { M_CHUNK, M_ENCODE, M_INDEX, M_RETRIEVE, M_TARGETS, M_STAGES };

/* bytes of a target record after zstd 3 (random-mantissa embeddings keep about 0.86 of their bytes;
 * ids and scores 12 per slot; header 64), and what LMDB stores for it: a record over a third of a
 * 4 KiB page takes whole pages (measured: a 2.0 KB record one page, a 10.5 KB one three), smaller
 * ones pack with about 15 % overhead. An ids-only record measured 190 bytes. */
static double trec_disk(double rec) { return rec > 1360 ? ceil((rec + 16) / 4096) * 4096 : rec * 1.15; }
#define EST_TREC_RATIO 0.86
#define EST_IDS_RECORD_BYTES 190.0

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

/* one stage's line of the estimate */
typedef struct {
    const char *name;
    double mem, disk, seconds;
    const char *source; /* "growth fit" or "this run" */
    char note[160];
} est_line;

/* seconds of chunk, encode or targets for n items on P ranks at dimension D: the run's own timing scaled
 * by the model's exponent where the manifest has one, else the fitted model */
static double stage_seconds(json_t *man, int st, double n, double P, double D, const char **src) {
    const stage_model *md = &models[st];
    double t = md->t0 + md->a * pow(n, md->b) / P * pow(D / 64.0, md->e);
    *src = st == M_ENCODE ? "CPU encoder rate" : "growth fit";
    json_t *ms = man ? dfm_manifest_stage(man, md->stage) : NULL;
    double t_run = json_number_value(json_object_get(json_object_get(ms, "timings"), "total_s"));
    json_t *cnt = json_object_get(json_object_get(ms, "counts"), md->count);
    double p_run = (double)json_integer_value(json_object_get(ms, "ranks"));
    if (t_run > 0 && json_is_integer(cnt) && json_integer_value(cnt) > 0) {
        double n_run = (double)json_integer_value(cnt);
        t = t_run * pow(n / n_run, md->b) * (p_run > 0 ? p_run : 1) / P;
        *src = "this run";
    }
    return t;
}

/* whether two factory strings name the same kind of index, whatever their list counts: both IVF or
 * neither, and the same encoding after the first comma ("IVF5657,PQ32np" and "IVF50000,PQ32np": yes;
 * "Flat" and "IVF50000,PQ32np": no) */
static int same_index_kind(const char *a, const char *b) {
    if (!a || !b) return 0;
    int ivf_a = !strncmp(a, "IVF", 3), ivf_b = !strncmp(b, "IVF", 3);
    const char *ea = strchr(a, ','), *eb = strchr(b, ',');
    return ivf_a == ivf_b && !strcmp(ea ? ea + 1 : a, eb ? eb + 1 : b);
}

/* seconds of index (st = M_INDEX) or retrieve on the slowest rank of the job whose per-rank work is w:
 * the work model, calibrated by the run's own slowest rank where the manifest has its work record and
 * its index is of the same kind as factory (its measured CPU seconds outside MPI, of the phases the model
 * covers, over what the model gives for its counts; a Flat run says nothing of an IVF-PQ job's rates) */
static double work_seconds(json_t *man, int st, const dfm_work_counts *w, double D, double M, double nprobe, const char *factory,
                           const char **src) {
    double t = st == M_INDEX ? dfm_estimate_index_seconds(w, D, M) : dfm_estimate_retrieve_seconds(w, D, M, nprobe);
    *src = "work model";
    json_t *ms = man ? dfm_manifest_stage(man, models[st].stage) : NULL;
    dfm_work_counts rw;
    double cpu = ms ? dfm_estimate_slowest_rank(ms, st == M_INDEX, &rw) : 0;
    if (cpu > 0 && !same_index_kind(json_string_value(json_object_get(dfm_manifest_stage(man, "index"), "factory")), factory))
        *src = "work model; the run's index is of another kind, not used";
    else if (cpu > 0) {
        json_t *enc = dfm_manifest_stage(man, "encode"), *ix = dfm_manifest_stage(man, "index"), *rt = dfm_manifest_stage(man, "retrieve");
        double d_run = (double)json_integer_value(json_object_get(enc, "dim"));
        double m_run = dfm_estimate_factory_pq(json_string_value(json_object_get(ix, "factory")));
        double np_run = json_number_value(json_object_get(json_object_get(rt, "tuning"), "value"));
        if (np_run <= 0) np_run = (double)json_integer_value(json_object_get(json_object_get(rt, "config"), "nprobe"));
        double model_run = st == M_INDEX ? dfm_estimate_index_seconds(&rw, d_run > 0 ? d_run : D, m_run) : dfm_estimate_retrieve_seconds(&rw, d_run > 0 ? d_run : D, m_run, np_run);
        if (model_run > 0) {
            t *= cpu / model_run;
            *src = "this run's work";
        }
    }
    return t;
}

static double node_memory_default(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (double)pages * (double)psz : 16e9;
}

int dfm_estimate_run(const dfm_estimate_config *cfg, const char *arg) {
    int64_t ranks = cfg->ranks, k = cfg->k, qblock = cfg->qblock;
    char *run = NULL;
    json_t *man = NULL;
    long long n = -1, n_tokens = -1;
    int rc = estimate_sizes(arg, cfg->tokens, cfg->chunk_len, &man, &run, &n, &n_tokens);
    json_t *enc = rc ? NULL : dfm_manifest_stage(man, "encode");
    long long dim = cfg->dim ? cfg->dim : enc ? (long long)json_integer_value(json_object_get(enc, "dim")) : 384;
    const char *edt = enc ? json_string_value(json_object_get(enc, "dtype")) : NULL;
    json_t *ccfg = json_object_get(dfm_manifest_stage(man, "chunk"), "config");
    long long L = json_integer_value(json_object_get(ccfg, "chunk-len")) > 0 ? (long long)json_integer_value(json_object_get(ccfg, "chunk-len")) : cfg->chunk_len;
    if (!rc && dim <= 0) rc = DFM_FAIL(DFM_ESTATE, "no embedding dimension: pass --dim");
    int tdt = dfm_emb_dtype_parse(cfg->tdtype);
    dfm_index_plan plan;
    /* a run that has indexed, estimated at its own size: its own index, not a fresh automatic choice */
    const char *factory = cfg->factory;
    const char *run_factory = json_string_value(json_object_get(dfm_manifest_stage(man, "index"), "factory"));
    if ((!factory || !*factory || !strcmp(factory, "auto")) && cfg->tokens <= 0 && run_factory) factory = run_factory;
    if (!rc) rc = dfm_index_plan_make(factory, (uint64_t)n, (uint32_t)dim, (int)ranks, (uint64_t)cfg->mem, DFM_METRIC_IP, (uint64_t)cfg->train, &plan);
    if (rc) {
        json_decref(man);
        free(run);
        return rc;
    }
    double N = (double)n, T = (double)n_tokens, P = (double)ranks, D = (double)dim, K = (double)k;
    double es = (double)dfm_emb_dtype_size((uint32_t)tdt), window = cfg->window > 0 ? (double)cfg->window : (double)DFM_CHUNK_WINDOW_TOKENS;
    est_line ln[M_STAGES + 1];
    memset(ln, 0, sizeof ln);
    /* chunk: bounded window (chunk.h); the spill file is transient, the shards stay */
    ln[M_CHUNK] = (est_line){"chunk", models[M_CHUNK].base_rss + 4 * window + 8e6 + 2e6, N * (24.0 + 4.0 * (double)L), 0, NULL, ""};
    snprintf(ln[M_CHUNK].note, sizeof ln[M_CHUNK].note, "bounded: tokenizer + %.0f-token window; %.1f GB per rank spilled while it runs",
             window, 4.0 * T / P / 1e9);
    /* encode: a window of 4096 chunks and one batch of activations (bench/results/report-encoder.md) */
    double emb_bytes = N * D * (edt ? (double)dfm_emb_dtype_size((uint32_t)dfm_emb_dtype_parse(edt)) : 4.0);
    ln[M_ENCODE] = (est_line){"encode", models[M_ENCODE].base_rss, emb_bytes, 0, NULL, "bounded: model weights + a 4096-chunk window"};
    /* index: the rank's shard, the coarse centroids, the training sample (its share; all of it on rank 0
     * for indexes that FAISS trains there), one embedding block */
    char kind = 0;
    uint32_t pq_m = 0, pq_nbits = 0;
    if (plan.nlist && dfm_ivf_encoding(&plan, (uint32_t)dim, &kind, &pq_m, &pq_nbits)) dfm_error_clear();
    /* FAISS's L2 precomputed table is in memory only (rebuilt on every read), never on disk */
    double l2_table = plan.l2_table_used ? (double)plan.l2_table_bytes : 0;
    double idx_disk = plan.exact_scores ? N * (4 * D + 8) : ((double)plan.bytes_per_rank - l2_table) * P;
    if (plan.nlist) idx_disk += P * (double)plan.nlist * 4 * D;
    /* the rank's embedding blocks are mapped whole (file-backed pages: counted in RSS, reclaimable) */
    double emb_rank = emb_bytes / P;
    double idx_mem = idx_disk / P + l2_table;
    double train_mem = kind ? (double)plan.train_n / P * 4 * D + (double)plan.nlist * D * 16 : (double)plan.train_n * 4 * D;
    ln[M_INDEX] = (est_line){"index", models[M_INDEX].base_rss + idx_mem + train_mem + emb_rank, idx_disk, 0, NULL, ""};
    snprintf(ln[M_INDEX].note, sizeof ln[M_INDEX].note, "%s; grows as N/P (shard + mapped embeddings) + %s", plan.factory,
             kind ? "its share of the training sample and the centroids' sums" : "the training sample (rank 0)");
    /* retrieve: the index shard + the query rounds (queries, probe lists, hits) + one neighbour block */
    double round_q = P * (double)qblock, nprobe = cfg->nprobe > 0 ? (double)cfg->nprobe : 16;
    if (plan.nlist && nprobe > (double)plan.nlist) nprobe = (double)plan.nlist;
    double ret_mem = idx_mem + emb_rank + round_q * (4 * D + 32 + 2.0 * 16 * K + (plan.nlist ? 12 * nprobe : 0)) + (double)qblock * (4 * D + 16 * K) +
                     (double)DFM_EMB_DEFAULT_BLOCK_CHUNKS * (double)dfm_nbr_row_bytes((uint32_t)k);
    ln[M_RETRIEVE] = (est_line){"retrieve", models[M_RETRIEVE].base_rss + ret_mem, N * (double)dfm_nbr_row_bytes((uint32_t)k), 0, NULL, ""};
    /* write-targets: bounded exchange blocks (1024 queries x K x d floats, sent and received) */
    double emb_store = N * trec_disk(K * D * es * EST_TREC_RATIO + 12.0 * K + 64), ids_store = N * (trec_disk(EST_IDS_RECORD_BYTES) + D * es);
    double nbr_rank = N / P * (double)dfm_nbr_row_bytes((uint32_t)k);
    ln[M_TARGETS] = (est_line){"targets", models[M_TARGETS].base_rss + 1024.0 * K * D * 4 * 3 + emb_rank + nbr_rank, emb_store, 0, NULL,
                               "1024-query exchange blocks + mapped embeddings and neighbours (N/P); disk for --store embeddings"};
    double items[M_STAGES] = {T, N, N, N, N}, total = 0;
    dfm_work_counts wi, wr;
    double M = pq_m ? (double)pq_m : dfm_estimate_factory_pq(plan.factory), cand = K + (double)cfg->margin;
    dfm_estimate_job_counts(N, P, D, (double)plan.nlist, M, nprobe, cand, (double)plan.train_n, cfg->visits, &wi, &wr);
    for (int st = 0; st < M_STAGES; st++) {
        if (st == M_INDEX || st == M_RETRIEVE) ln[st].seconds = work_seconds(man, st, st == M_INDEX ? &wi : &wr, D, M, nprobe, plan.factory, &ln[st].source);
        else ln[st].seconds = stage_seconds(man, st, items[st], P, D, &ln[st].source);
    }
    if (cfg->encode_gpus > 0) { /* encode on GPUs: the assumed rate per GPU, until one is measured */
        ln[M_ENCODE].seconds = N / ((double)cfg->encode_gpus * cfg->gpu_rate);
        ln[M_ENCODE].source = "assumed GPU rate";
        snprintf(ln[M_ENCODE].note, sizeof ln[M_ENCODE].note, "%lld GPU(s) at %.0f chunks/s each (--gpu-rate: assumed, not measured)",
                 (long long)cfg->encode_gpus, cfg->gpu_rate);
    }
    snprintf(ln[M_RETRIEVE].note, sizeof ln[M_RETRIEVE].note, "nprobe %.0f%s; per rank: %.2g coarse distances, %.2g codes scanned, %.2g shard searches (%s)",
             nprobe, cfg->nprobe > 0 ? "" : " (assumed: --nprobe)", wr.coarse_distances, wr.codes_scanned, wr.shard_searches,
             cfg->visits > 0 ? "visits as given: --visits" : "visits: the upper bound");
    for (int st = 0; st < M_STAGES; st++) total += ln[st].seconds;
    /* the target store: ids mode reads each neighbour's row from the shard tables (N x d x dtype in all);
     * a trainer's random lookups stay in memory while the tables fit a node's page cache */
    double node_mem = cfg->node_memory > 0 ? (double)cfg->node_memory : node_memory_default();
    double tables = N * D * es;
    const char *store = tables <= 0.5 * node_mem ? "ids" : "embeddings";
    char why[320];
    if (!strcmp(store, "ids"))
        snprintf(why, sizeof why, "the ids tables (%.1f GB) fit in half of a node's %.0f GB, so lookups hit memory; %.1fx less disk", tables / 1e9,
                 node_mem / 1e9, emb_store / ids_store);
    else
        snprintf(why, sizeof why, "the ids tables (%.1f GB) exceed half of a node's %.0f GB: each record would cost up to K random reads (tolerable on local NVMe, slow on a network file system)",
                 tables / 1e9, node_mem / 1e9);
    if (cfg->json) {
        json_t *o = json_pack("{s:s, s:f, s:f, s:I, s:I, s:I, s:f}", "run", run ? run : arg, "tokens", T, "chunks", N, "dim", (json_int_t)dim, "ranks",
                              (json_int_t)ranks, "k", (json_int_t)k, "total_s", total);
        json_t *arr = json_array();
        for (int st = 0; st < M_STAGES; st++)
            json_array_append_new(arr, json_pack("{s:s, s:f, s:f, s:f, s:s, s:s}", "stage", ln[st].name, "memory_per_rank_bytes", ln[st].mem,
                                                 "disk_bytes", ln[st].disk, "seconds", ln[st].seconds, "time_source", ln[st].source, "note",
                                                 ln[st].note));
        json_object_set_new(o, "stages", arr);
        json_object_set_new(o, "index", json_pack("{s:s, s:s}", "factory", plan.factory, "why", plan.why));
        json_object_set_new(o, "target_store", json_pack("{s:f, s:f, s:f, s:f, s:s, s:s}", "embeddings_bytes", emb_store, "ids_bytes", ids_store,
                                                         "ids_table_bytes", tables, "node_memory_bytes", node_mem, "recommend", store, "why", why));
        char *txt = json_dumps(o, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
        printf("%s\n", txt ? txt : "{}");
        free(txt);
        json_decref(o);
    } else {
        char a[32], b[32];
        printf("run %s: %lld tokens, %lld chunks, dim %lld, %lld rank(s)\n", run ? run : arg, n_tokens, n, dim, (long long)ranks);
        printf("  %-9s %14s %12s %12s  %s\n", "stage", "memory/rank", "disk", "time", "");
        for (int st = 0; st < M_STAGES; st++) {
            human(a, sizeof a, ln[st].mem);
            human(b, sizeof b, ln[st].disk);
            printf("  %-9s %14s %12s %10.0f s  (%s) %s\n", ln[st].name, a, b, ln[st].seconds, ln[st].source, ln[st].note);
        }
        printf("  %-9s %14s %12s %10.0f s  (%.1f h on %lld rank(s); CPU-seconds of the slowest rank, one core each)\n", "total", "", "", total,
               total / 3600, (long long)ranks);
        human(a, sizeof a, train_mem);
        printf("  index: %s; training: %s %s per rank (in its memory above)\n", plan.why, kind ? "distributed," : "FAISS on rank 0,", a);
        human(a, sizeof a, emb_store);
        human(b, sizeof b, ids_store);
        printf("  targets (%s, K=%lld): --store embeddings %s, --store ids %s (tables %.1f GB)\n", dfm_emb_dtype_name((uint32_t)tdt), (long long)k,
               a, b, tables / 1e9);
        printf("  recommended: --store %s (%s)\n", store, why);
    }
    json_decref(man);
    free(run);
    return DFM_OK;
}
