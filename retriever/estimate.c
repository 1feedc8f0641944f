/* estimate.c — `dfm estimate` (see estimate.h). */
#include "retriever/estimate.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"
#include "retriever/index.h"
#include "schemas/embedding_shard.h"
#include "schemas/neighbor_shard.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int dfm_estimate_run(const dfm_estimate_config *cfg, const char *arg) {
    int64_t tokens = cfg->tokens, chunk_len = cfg->chunk_len, dim_opt = cfg->dim, ranks = cfg->ranks, k = cfg->k,
            qblock = cfg->qblock, mem = cfg->mem, train = cfg->train;
    const char *factory = cfg->factory, *tdtype = cfg->tdtype;
    char *run = NULL;
    json_t *man = NULL;
    long long n = -1, n_tokens = -1;
    int rc = estimate_sizes(arg, tokens, chunk_len, &man, &run, &n, &n_tokens);
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
        printf("run %s: %lld tokens, %lld chunks, dim %lld, %lld rank(s)\n", run ? run : arg, n_tokens, n, dim, (long long)ranks);
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
    return rc;
}
