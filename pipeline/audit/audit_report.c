/* audit_report.c — `dfm audit RUN`: count (the manifest), measure (a sample), extrapolate, render
 * (audit.json, audit.md, audit.svg). See audit.h. */
#include "pipeline/audit/audit.h"
#include "pipeline/audit/audit_scale.h"
#include "pipeline/audit/audit_storage.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/runlock.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/version.h"
#include "retriever/index.h"
#include "schemas/chunk_shard.h"
#include "schemas/neighbor_shard.h"

#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

void openblas_set_num_threads(int n); /* cblas.h of some OpenBLAS builds lacks the prototype */

/* ---- manifest access -------------------------------------------------------------------------- */

/* stage.path1[.path2] as a number, or -1 when absent */
static double mnum(json_t *m, const char *stage, const char *obj, const char *key) {
    json_t *s = dfm_manifest_stage(m, stage);
    if (!s) return -1;
    json_t *o = obj ? json_object_get(s, obj) : s;
    json_t *v = o ? json_object_get(o, key) : NULL;
    return json_is_number(v) ? json_number_value(v) : -1;
}
static const char *mstr(json_t *m, const char *stage, const char *obj, const char *key) {
    json_t *s = dfm_manifest_stage(m, stage);
    if (!s) return NULL;
    json_t *o = obj ? json_object_get(s, obj) : s;
    json_t *v = o ? json_object_get(o, key) : NULL;
    return json_is_string(v) ? json_string_value(v) : NULL;
}
static uint64_t u64(double v) { return v > 0 ? (uint64_t)llround(v) : 0; }


/* ---- the measured sample ---------------------------------------------------------------------- */

typedef struct {
    uint64_t n_seq_total;      /* sequences in the run */
    uint64_t n_seq;            /* sampled */
    uint64_t *seq_first;       /* first chunk id of each sampled sequence */
    uint64_t tokens, chunks;   /* in the sample (real tokens; chunk slots) */
    uint64_t *tok_seed, n_tok; /* token-level keys (one per real token) */
    uint64_t *chk_seed, n_chk; /* chunk-level keys (one per non-empty chunk) */
    uint64_t *tok_q, n_tok_q;  /* token-level queries: every token */
    uint64_t *chk_q, n_chk_q;  /* chunk-level queries: non-empty chunks that are not a sequence's first */
} sample_t;

static void sample_free(sample_t *s) {
    free(s->seq_first);
    free(s->tok_seed);
    free(s->chk_seed);
    free(s->tok_q);
    free(s->chk_q);
    memset(s, 0, sizeof *s);
}

/* N sequences spread over the run (seeded stratified pick), their keys' seeds and the query lists. */
static int sample_build(const char *run, uint64_t want, uint64_t seed, sample_t *s) {
    memset(s, 0, sizeof *s);
    dfm_chunk_set *set = NULL;
    DFM_TRY(dfm_chunk_set_open(run, &set));
    int rc = DFM_OK;
    uint64_t *starts = NULL, *pick = NULL;
    uint64_t n_starts = 0;
    starts = malloc(sizeof(uint64_t) * (set->n_chunks + 1));
    if (!starts) {
        rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        goto done;
    }
    for (uint64_t c = 0; c < set->n_chunks; c++) {
        const dfm_chunk_meta *meta;
        const uint32_t *tok;
        if ((rc = dfm_chunk_set_get(set, c, &meta, &tok))) goto done;
        if ((meta->flags & DFM_CHUNK_SEQ_START) || c == 0) starts[n_starts++] = c;
    }
    starts[n_starts] = set->n_chunks; /* sentinel: end of the last sequence */
    s->n_seq_total = n_starts;
    s->n_seq = want < n_starts ? want : n_starts;
    pick = malloc(sizeof(uint64_t) * (s->n_seq ? s->n_seq : 1));
    s->seq_first = malloc(sizeof(uint64_t) * (s->n_seq ? s->n_seq : 1));
    if (!pick || !s->seq_first) {
        rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        goto done;
    }
    dfm_sample_ids(n_starts, s->n_seq, seed, pick);
    uint64_t slots = 0;
    for (uint64_t i = 0; i < s->n_seq; i++) slots += starts[pick[i] + 1] - starts[pick[i]];
    uint64_t L = set->chunk_len;
    s->tok_seed = malloc(sizeof(uint64_t) * (slots * L + 1));
    s->tok_q = malloc(sizeof(uint64_t) * (slots * L + 1));
    s->chk_seed = malloc(sizeof(uint64_t) * (slots + 1));
    s->chk_q = malloc(sizeof(uint64_t) * (slots + 1));
    if (!s->tok_seed || !s->tok_q || !s->chk_seed || !s->chk_q) {
        rc = DFM_FAIL(DFM_ENOMEM, "no memory for a sample of %llu chunks", (unsigned long long)slots);
        goto done;
    }
    for (uint64_t i = 0; i < s->n_seq; i++) {
        uint64_t a = starts[pick[i]], b = starts[pick[i] + 1];
        s->seq_first[i] = a;
        uint32_t prev = UINT32_MAX;
        for (uint64_t c = a; c < b; c++) {
            const dfm_chunk_meta *meta;
            const uint32_t *tok;
            if ((rc = dfm_chunk_set_get(set, c, &meta, &tok))) goto done;
            s->chunks++;
            for (uint32_t t = 0; t < meta->n_valid; t++) {
                /* a token's key stands for its hidden state: a function of its context, here (previous, token) */
                uint32_t pair[2] = {prev, tok[t]};
                s->tok_q[s->n_tok_q++] = s->n_tok;
                s->tok_seed[s->n_tok++] = XXH3_64bits_withSeed(pair, sizeof pair, seed);
                prev = tok[t];
            }
            s->tokens += meta->n_valid;
            if (meta->n_valid) {
                if (c != a) s->chk_q[s->n_chk_q++] = s->n_chk;
                s->chk_seed[s->n_chk++] = XXH3_64bits_withSeed(tok, sizeof(uint32_t) * meta->n_valid, seed ^ 0x5eedull);
            }
        }
    }
done:
    free(starts);
    free(pick);
    dfm_chunk_set_close(set);
    if (rc) sample_free(s);
    return rc;
}


static int measure_both(const dfm_audit_config *a, const sample_t *smp, const char *factory, uint32_t metric, uint32_t enc_dim, uint32_t K,
                        uint32_t margin, int64_t nprobe, dfm_audit_side *cs, dfm_audit_side *ts) {
    DFM_LOG_I("audit: measuring on %llu of %llu sequences: %llu tokens, %llu chunks", (unsigned long long)smp->n_seq,
              (unsigned long long)smp->n_seq_total, (unsigned long long)smp->tokens, (unsigned long long)smp->chunks);
    dfm_audit_side_opts co = {factory, metric, enc_dim ? enc_dim : 384, K + margin, nprobe, 0};
    DFM_TRY(dfm_audit_measure_side(&co, smp->chk_seed, smp->n_chk, smp->chk_q, smp->n_chk_q, cs));
    DFM_LOG_I("audit: chunk level: %llu queries of k=%u over %llu keys (%s, dim %u): %.6f s", (unsigned long long)cs->queries, cs->k,
              (unsigned long long)cs->keys, cs->factory, cs->dim, cs->search_s);
    dfm_audit_side_opts to = {factory, metric, (uint32_t)a->key_dim, (uint32_t)a->k_token, nprobe, 0};
    DFM_TRY(dfm_audit_measure_side(&to, smp->tok_seed, smp->n_tok, smp->tok_q, smp->n_tok_q, ts));
    DFM_LOG_I("audit: token level: %llu queries of k=%u over %llu keys (%s, dim %u): %.6f s", (unsigned long long)ts->queries, ts->k,
              (unsigned long long)ts->keys, ts->factory, ts->dim, ts->search_s);
    return DFM_OK;
}

/* ---- JSON and text helpers -------------------------------------------------------------------- */

static json_t *side_json(const dfm_audit_side *s, uint64_t sample_tokens) {
    return json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:I, s:f, s:f}", "factory", s->factory, "index_choice",
                     s->why, "key_dim", (json_int_t)s->dim, "k", (json_int_t)s->k, "keys", (json_int_t)s->keys, "queries",
                     (json_int_t)s->queries, "index_bytes", (json_int_t)s->index_bytes, "results", (json_int_t)s->results, "build_s",
                     s->build_s, "search_s", s->search_s, "s_per_query", s->s_per_query, "bytes_per_key", s->bytes_per_key,
                     "search_repeats", (json_int_t)s->repeats, "search_s_per_token", sample_tokens ? s->search_s / (double)sample_tokens : 0.0, "index_bytes_per_token",
                     sample_tokens ? (double)s->index_bytes / (double)sample_tokens : 0.0);
}

/* exponent of per-query search cost in the datastore size: exact Flat scans all keys (1), IVF with
 * ~sqrt(N) lists and fixed nprobe scans ~sqrt(N) (0.5), HNSW grows ~log N (0: treated as constant) */
static double cost_exponent(const char *factory) {
    if (strstr(factory, "HNSW") && !strstr(factory, "IVF")) return 0;
    if (strstr(factory, "IVF") || strstr(factory, "IMI")) return 0.5;
    return 1;
}

typedef struct {
    double tokens;
    double q_chunk, q_token, items_chunk, items_token, keys_chunk, keys_token;
    double bytes_chunk, bytes_token;
    double t_chunk_const, t_token_const;  /* constant per-query cost: lower bound */
    double t_chunk_scaled, t_token_scaled; /* per-query cost grown with the datastore (cost_exponent) */
} extrap_t;

static void extrapolate(double T, double q_per_tok, double keys_per_tok, uint32_t K, uint32_t k_tok, const dfm_audit_side *c,
                        const dfm_audit_side *t, extrap_t *e) {
    memset(e, 0, sizeof *e);
    e->tokens = T;
    e->q_chunk = T * q_per_tok;
    e->q_token = T;
    e->items_chunk = e->q_chunk * K;
    e->items_token = T * k_tok;
    e->keys_chunk = T * keys_per_tok;
    e->keys_token = T;
    if (c && t) {
        e->bytes_chunk = e->keys_chunk * c->bytes_per_key;
        e->bytes_token = e->keys_token * t->bytes_per_key;
        e->t_chunk_const = e->q_chunk * c->s_per_query;
        e->t_token_const = e->q_token * t->s_per_query;
        double gc = c->keys ? pow(e->keys_chunk / (double)c->keys, cost_exponent(c->factory)) : 1;
        double gt = t->keys ? pow(e->keys_token / (double)t->keys, cost_exponent(t->factory)) : 1;
        e->t_chunk_scaled = e->t_chunk_const * (gc > 1 ? gc : 1);
        e->t_token_scaled = e->t_token_const * (gt > 1 ? gt : 1);
    }
}

static json_t *extrap_json(const char *name, const extrap_t *e, int measured) {
    json_t *o = json_pack("{s:s, s:f, s:{s:f, s:f, s:f}, s:{s:f, s:f, s:f}, s:{s:f, s:f}}", "name", name, "tokens", e->tokens, "chunk_level",
                          "queries", e->q_chunk, "items", e->items_chunk, "keys", e->keys_chunk, "token_level", "queries", e->q_token,
                          "items", e->items_token, "keys", e->keys_token, "savings", "queries", 1 - e->q_chunk / e->q_token, "items",
                          1 - e->items_chunk / e->items_token);
    if (o && measured) {
        json_t *cl = json_object_get(o, "chunk_level"), *tl = json_object_get(o, "token_level"), *sv = json_object_get(o, "savings");
        json_object_set_new(cl, "index_bytes", json_real(e->bytes_chunk));
        json_object_set_new(cl, "search_s_constant", json_real(e->t_chunk_const));
        json_object_set_new(cl, "search_s_scaled", json_real(e->t_chunk_scaled));
        json_object_set_new(tl, "index_bytes", json_real(e->bytes_token));
        json_object_set_new(tl, "search_s_constant", json_real(e->t_token_const));
        json_object_set_new(tl, "search_s_scaled", json_real(e->t_token_scaled));
        json_object_set_new(sv, "index_bytes", json_real(1 - e->bytes_chunk / e->bytes_token));
        json_object_set_new(sv, "search_s_constant", json_real(1 - e->t_chunk_const / e->t_token_const));
        json_object_set_new(sv, "search_s_scaled", json_real(1 - e->t_chunk_scaled / e->t_token_scaled));
    }
    return o;
}

static const char *H(double v, char *b) { return dfm_audit_human(v, b, 32); }
static const char *secs(double s, char *b) { return dfm_audit_secs(s, b, 32); }
static const char *bytes(double v, char *b) { return dfm_audit_bytes(v, b, 32); }
static double pct(double x) { return 100.0 * x; }
/* a saving in words: "N % less" / "N % more" (4 decimals) */
static const char *W(double saving, char *b) { return dfm_audit_saving_words(saving, 4, "less", b, 48); }


/* ---- one report's figures -------------------------------------------------------------------- */

typedef struct {
    const dfm_audit_config *a;
    json_t *m; /* the run's manifest */
    int have_targets, have_encode;
    /* configuration */
    uint32_t L, S, K, margin, enc_dim, metric;
    int64_t nprobe;
    const char *exclude, *factory, *metric_s, *index_req, *index_why;
    /* counts */
    uint64_t documents, tokens, pad_tokens, chunks, sequences, queries, no_query, fetched, excluded, kept, padded, re_search,
        vectors, index_bytes, nbr_bytes, records, raw_bytes, stored_bytes;
    double t_stage[DFM_AUDIT_N_STAGES], t_total, t_search;
    dfm_audit_counted ct;
    dfm_audit_storage st; /* target memory's storage per slot layout */
    char chash[33];
    /* measured */
    int measured, threads_used;
    sample_t smp;
    dfm_audit_side cs, ts;
    /* measured at several sizes (--measure-tokens) */
    int scaled;
    dfm_audit_scale sc;
    /* extrapolated */
    double q_per_tok, keys_per_tok;
    extrap_t ex[2];
    /* where and when */
    char cpu[256], host[128], when[32];
} audit_ctx;

/* count: the run's configuration, counts and timings from its manifest (index and retrieve complete),
 * the counted savings and the config hash */
static int audit_count(audit_ctx *x) {
    const char *run = x->a->run;
    DFM_TRY(dfm_manifest_load(run, 0, &x->m));
    json_t *m = x->m;
    for (int i = 0; i < 4; i++)
        if (i != 1) DFM_TRY(dfm_manifest_require_complete(m, dfm_audit_stages[i], run));
    x->have_targets = dfm_manifest_require_complete(m, "targets", run) == DFM_OK;
    x->have_encode = dfm_manifest_require_complete(m, "encode", run) == DFM_OK;
    dfm_error_clear();

    /* configuration */
    x->L = (uint32_t)u64(mnum(m, "chunk", "config", "chunk-len"));
    x->S = (uint32_t)u64(mnum(m, "chunk", "config", "seq-len"));
    x->K = (uint32_t)u64(mnum(m, "retrieve", "config", "k"));
    x->margin = (uint32_t)u64(mnum(m, "retrieve", "config", "margin"));
    if (mnum(m, "retrieve", NULL, "margin") >= 0) x->margin = (uint32_t)u64(mnum(m, "retrieve", NULL, "margin")); /* as searched */
    x->nprobe = (int64_t)u64(mnum(m, "retrieve", "config", "nprobe"));
    json_t *tuning = json_object_get(dfm_manifest_stage(m, "retrieve"), "tuning"); /* the nprobe the run searched with */
    const char *tuned = tuning ? json_string_value(json_object_get(tuning, "parameter")) : NULL;
    if (tuned && !strcmp(tuned, "nprobe")) x->nprobe = (int64_t)json_number_value(json_object_get(tuning, "value"));
    x->exclude = mstr(m, "retrieve", "config", "exclude");
    x->factory = mstr(m, "index", NULL, "factory");
    x->metric_s = mstr(m, "index", NULL, "metric");
    x->index_req = mstr(m, "index", "config", "index");
    json_t *choice = json_object_get(dfm_manifest_stage(m, "index"), "choice");
    x->index_why = choice ? json_string_value(json_object_get(choice, "why")) : NULL;
    x->enc_dim = (uint32_t)u64(mnum(m, "index", NULL, "dim"));
    x->metric = x->metric_s && !strcmp(x->metric_s, "l2") ? DFM_METRIC_L2 : DFM_METRIC_IP;
    if (!x->factory) x->factory = "IDMap,Flat";

    /* counts */
    x->documents = u64(mnum(m, "chunk", "counts", "documents"));
    x->tokens = u64(mnum(m, "chunk", "counts", "tokens"));
    x->pad_tokens = u64(mnum(m, "chunk", "counts", "pad_tokens"));
    x->chunks = u64(mnum(m, "chunk", "counts", "chunks"));
    x->sequences = u64(mnum(m, "chunk", "counts", "sequences"));
    x->queries = u64(mnum(m, "retrieve", "counts", "queries"));
    x->no_query = u64(mnum(m, "retrieve", "counts", "no_query_rows"));
    x->fetched = u64(mnum(m, "retrieve", "counts", "candidates_fetched"));
    x->excluded = u64(mnum(m, "retrieve", "counts", "excluded"));
    x->kept = u64(mnum(m, "retrieve", "counts", "items_kept"));
    x->padded = u64(mnum(m, "retrieve", "counts", "padded_slots"));
    x->re_search = u64(mnum(m, "retrieve", "counts", "re_searches"));
    x->vectors = u64(mnum(m, "index", "counts", "vectors"));
    x->index_bytes = u64(mnum(m, "index", "counts", "bytes"));
    x->nbr_bytes = u64(mnum(m, "retrieve", "counts", "bytes"));
    x->records = u64(mnum(m, "targets", "counts", "records"));
    x->raw_bytes = u64(mnum(m, "targets", "counts", "raw_bytes"));
    x->stored_bytes = u64(mnum(m, "targets", "counts", "stored_bytes"));
    for (int i = 0; i < DFM_AUDIT_N_STAGES; i++) {
        x->t_stage[i] = mnum(m, dfm_audit_stages[i], "timings", "total_s");
        if (x->t_stage[i] > 0) x->t_total += x->t_stage[i];
    }
    x->t_search = mnum(m, "retrieve", "timings", "search_s");

    const char *dtype = mstr(m, "targets", "config", "dtype"), *store = mstr(m, "targets", "config", "store");
    const char *hold = mstr(m, "targets", "config", "slots-hold");
    uint32_t vb = dtype && !strcmp(dtype, "fp32") ? 4 : 2; /* fp16, bf16 */
    /* a record's slots: K, or 2K with --slots-hold both (the neighbours, then their continuations) */
    uint32_t slots = hold && !strcmp(hold, "both") ? 2 * x->K : x->K;
    dfm_audit_storage_of(slots, x->L, x->enc_dim, (uint32_t)x->a->lm_width, vb, !store || strcmp(store, "ids"), x->records, x->raw_bytes,
                         x->stored_bytes, &x->st);
    dfm_audit_counts_in in = {x->L, x->K, (uint32_t)x->a->k_token, x->chunks, x->tokens, x->queries, x->kept, x->fetched};
    DFM_TRY(dfm_audit_count(&in, &x->ct));
    return dfm_audit_config_hash(m, x->chash);
}

/* measure: both datastores built and searched on a sample of the run's sequences (--token-level-sample) */
static int audit_measure(audit_ctx *x) {
    const dfm_audit_config *a = x->a;
    x->threads_used = omp_get_max_threads();
    if (a->sample <= 0 && a->measure_tokens <= 0) return DFM_OK;
    /* one thread by default: on a shared, loaded machine a parallel region waits for its slowest
     * descheduled thread, which would swamp the small chunk-level searches with scheduler noise */
    int prev_threads = omp_get_max_threads();
    if (a->threads > 0) omp_set_num_threads((int)a->threads);
    x->threads_used = omp_get_max_threads();
    openblas_set_num_threads(x->threads_used); /* FAISS's training and exact search run BLAS: its threads too */
    int rc = DFM_OK;
    if (a->sample > 0) {
        rc = sample_build(a->run, (uint64_t)a->sample, (uint64_t)a->seed, &x->smp);
        if (!rc) rc = measure_both(a, &x->smp, x->factory, x->metric, x->enc_dim, x->K, x->margin, x->nprobe, &x->cs, &x->ts);
        if (!rc) x->measured = 1;
    }
    if (!rc && a->measure_tokens > 0) {
        if (!x->have_encode) {
            rc = DFM_FAIL(DFM_ESTATE, "audit: --measure-tokens needs the run's chunk embeddings (the encode stage) as chunk-level keys");
        } else {
            dfm_audit_scale_cfg c = {
                .run = a->run, .token_keys = a->token_keys, .random_dim = (uint32_t)a->key_dim, .max_tokens = (uint64_t)a->measure_tokens,
                .sizes = (int)a->measure_sizes, .repeats = (int)a->repeats, .build_repeats = (int)a->build_repeats, .queries = (uint64_t)a->measure_queries,
                .recall_queries = (uint64_t)a->recall_queries, .k_token = (uint32_t)a->k_token, .k_chunk = x->K + x->margin,
                .token_nprobe = a->token_nprobe, .chunk_nprobe = x->nprobe, .chunk_index = x->index_req ? x->index_req : x->factory,
                .chunk_metric = x->metric, .chunk_keys_per_token = x->tokens ? (double)(x->vectors ? x->vectors : x->chunks) / (double)x->tokens : 0,
                .chunk_queries_per_token = x->tokens ? (double)x->queries / (double)x->tokens : 0, .seed = (uint64_t)a->seed};
            rc = dfm_audit_scale_run(&c, &x->sc);
            if (!rc) x->scaled = 1;
        }
    }
    omp_set_num_threads(prev_threads);
    return rc;
}

/* extrapolate: the run's own query and key rates per token, to the corpus and to --extrapolate-tokens */
static void audit_extrapolate(audit_ctx *x) {
    const dfm_audit_side *c = x->measured ? &x->cs : NULL, *t = x->measured ? &x->ts : NULL;
    x->q_per_tok = x->tokens ? (double)x->queries / (double)x->tokens : 0;
    x->keys_per_tok = x->tokens ? (double)(x->vectors ? x->vectors : x->chunks) / (double)x->tokens : 0;
    extrapolate((double)x->tokens, x->q_per_tok, x->keys_per_tok, x->K, (uint32_t)x->a->k_token, c, t, &x->ex[0]);
    extrapolate(x->a->large, x->q_per_tok, x->keys_per_tok, x->K, (uint32_t)x->a->k_token, c, t, &x->ex[1]);
}

/* the machine and the time, for the report */
static void audit_environment(audit_ctx *x) {
    snprintf(x->cpu, sizeof x->cpu, "unknown");
    snprintf(x->host, sizeof x->host, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(x->cpu, sizeof x->cpu, "%s", strchr(line, ':') + 2);
            x->cpu[strcspn(x->cpu, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
    gethostname(x->host, sizeof x->host - 1);
    time_t now = time(NULL);
    strftime(x->when, sizeof x->when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
}

/* render, audit.json: identity, configuration, the run's counts and timings, the counted savings (NULL: no memory) */
static json_t *json_run(const audit_ctx *x) {
    json_t *chunk_stage = dfm_manifest_stage(x->m, "chunk");
    json_t *tgt_fmt = x->have_targets ? json_object_get(dfm_manifest_stage(x->m, "targets"), "format") : NULL;
    json_t *J = json_pack("{s:s, s:i, s:s, s:s, s:s, s:s, s:O, s:O}", "format", "dfm-audit", "version", 2, "dfm_version", DFM_VERSION, "created_utc",
                  x->when, "run", x->a->run, "config_hash", x->chash, "inputs",
                  json_object_get(chunk_stage, "inputs") ? json_object_get(chunk_stage, "inputs") : json_null(), "upstream",
                  tgt_fmt && json_object_get(tgt_fmt, "upstream") ? json_object_get(tgt_fmt, "upstream") : json_null());
    if (!J) return NULL;
    json_object_set_new(J, "config",
                        json_pack("{s:I, s:I, s:I, s:I, s:s?, s:s, s:s, s:s?, s:s?, s:I, s:I, s:I, s:I}", "chunk_len", (json_int_t)x->L,
                                  "seq_len", (json_int_t)x->S, "k", (json_int_t)x->K, "margin", (json_int_t)x->margin, "exclude", x->exclude,
                                  "index_factory", x->factory, "index_metric", x->metric_s ? x->metric_s : "ip", "index_requested", x->index_req,
                                  "index_why", x->index_why, "nprobe", (json_int_t)x->nprobe, "encoder_dim", (json_int_t)x->enc_dim,
                                  "token_k", (json_int_t)x->a->k_token, "token_key_dim", (json_int_t)x->a->key_dim));
    json_object_set_new(J, "run_counts",
                        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "documents",
                                  (json_int_t)x->documents, "tokens", (json_int_t)x->tokens, "pad_tokens", (json_int_t)x->pad_tokens, "chunks",
                                  (json_int_t)x->chunks, "sequences", (json_int_t)x->sequences, "queries", (json_int_t)x->queries,
                                  "no_query_rows", (json_int_t)x->no_query, "candidates_fetched", (json_int_t)x->fetched, "excluded",
                                  (json_int_t)x->excluded, "re_searches", (json_int_t)x->re_search, "items_kept", (json_int_t)x->kept,
                                  "padded_slots", (json_int_t)x->padded, "index_vectors", (json_int_t)x->vectors, "index_bytes",
                                  (json_int_t)x->index_bytes, "neighbor_bytes", (json_int_t)x->nbr_bytes, "target_records",
                                  (json_int_t)x->records, "target_stored_bytes", (json_int_t)x->stored_bytes));
    json_object_set_new(json_object_get(J, "run_counts"), "target_raw_bytes", json_integer((json_int_t)x->raw_bytes));
    json_t *tj = json_object();
    for (int i = 0; i < DFM_AUDIT_N_STAGES; i++) json_object_set_new(tj, dfm_audit_stages[i], x->t_stage[i] >= 0 ? json_real(x->t_stage[i]) : json_null());
    json_object_set_new(tj, "retrieve_search", x->t_search >= 0 ? json_real(x->t_search) : json_null());
    json_object_set_new(tj, "total", json_real(x->t_total));
    json_object_set_new(J, "timings_s", tj);
    json_object_set_new(
        J, "counted",
        json_pack("{s:f, s:f, s:{s:I, s:I, s:I, s:I, s:f, s:f}, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f}}", "query_saving_formula",
                  x->ct.query_saving_formula, "item_saving_formula", x->ct.item_saving_formula, "per_chunk", "chunk_queries",
                  (json_int_t)x->ct.chunk_queries, "token_queries", (json_int_t)x->ct.token_slot_queries, "chunk_items",
                  (json_int_t)x->ct.chunk_items, "token_items", (json_int_t)x->ct.token_slot_items, "query_saving", x->ct.query_saving_per_chunk,
                  "item_saving", x->ct.item_saving_per_chunk, "as_run", "chunk_queries", (json_int_t)x->queries, "token_queries",
                  (json_int_t)x->ct.token_queries, "chunk_items_kept", (json_int_t)x->kept, "chunk_candidates_fetched", (json_int_t)x->fetched,
                  "token_items", (json_int_t)x->ct.token_items, "no_query_rows", (json_int_t)x->no_query, "query_saving",
                  x->ct.query_saving_run, "item_saving", x->ct.item_saving_run, "candidate_saving", x->ct.candidate_saving_run));
    return J;
}

/* render, audit.json: the measured part */
static json_t *json_measured(const audit_ctx *x) {
    json_t *mj = json_pack("{s:{s:I, s:I, s:I, s:I, s:I, s:I}, s:s, s:s, s:i, s:s}", "sample", "sequences", (json_int_t)x->smp.n_seq,
                           "sequences_in_run", (json_int_t)x->smp.n_seq_total, "tokens", (json_int_t)x->smp.tokens, "chunks",
                           (json_int_t)x->smp.chunks, "token_pad_slots", (json_int_t)(x->smp.chunks * x->L - x->smp.tokens), "seed",
                           (json_int_t)x->a->seed, "cpu", x->cpu, "host", x->host, "threads", x->threads_used, "keys",
                           "seeded pseudo-random unit vectors (token level: from each (previous token, token) pair; chunk level: "
                           "from each chunk's tokens); their values carry no meaning: what is measured is the cost (build time, "
                           "search time per query, index bytes) of a datastore and queries of these sizes, widths, k and index type");
    json_t *first = json_array();
    for (uint64_t i = 0; i < x->smp.n_seq; i++) json_array_append_new(first, json_integer((json_int_t)x->smp.seq_first[i]));
    json_object_set_new(json_object_get(mj, "sample"), "first_chunks", first);
    json_object_set_new(mj, "chunk_level", side_json(&x->cs, x->smp.tokens));
    json_object_set_new(mj, "token_level", side_json(&x->ts, x->smp.tokens));
    json_object_set_new(mj, "savings",
                        json_pack("{s:f, s:f, s:f, s:f, s:f}", "queries", 1 - (double)x->cs.queries / (double)x->ts.queries, "items_fetched",
                                  1 - (double)x->cs.queries * x->cs.k / ((double)x->ts.queries * x->ts.k), "search_time",
                                  x->ts.search_s > 0 ? 1 - x->cs.search_s / x->ts.search_s : 0.0, "index_bytes",
                                  1 - (double)x->cs.index_bytes / (double)x->ts.index_bytes, "build_time",
                                  x->ts.build_s > 0 ? 1 - x->cs.build_s / x->ts.build_s : 0.0));
    json_object_set_new(mj, "ratios_token_over_chunk",
                        json_pack("{s:f, s:f, s:f, s:f}", "queries", (double)x->ts.queries / (double)(x->cs.queries ? x->cs.queries : 1),
                                  "search_time", x->cs.search_s > 0 ? x->ts.search_s / x->cs.search_s : 0.0, "index_bytes",
                                  (double)x->ts.index_bytes / (double)(x->cs.index_bytes ? x->cs.index_bytes : 1), "s_per_query",
                                  x->cs.s_per_query > 0 ? x->ts.s_per_query / x->cs.s_per_query : 0.0));
    return mj;
}

/* render: audit.json as a new object (NULL: no memory) */
static json_t *render_json(const audit_ctx *x) {
    json_t *J = json_run(x);
    if (!J) return NULL;
    json_object_set_new(J, "measured", x->measured ? json_measured(x) : json_null());
    json_t *ej = json_array();
    json_array_append_new(ej, extrap_json("corpus", &x->ex[0], x->measured));
    json_array_append_new(ej, extrap_json("large", &x->ex[1], x->measured));
    json_object_set_new(J, "extrapolated", ej);
    if (x->scaled) {
        const double tg[2] = {(double)x->tokens, x->a->large};
        const char *const nm[2] = {"corpus", "large"};
        json_t *sj = dfm_audit_scale_json(&x->sc, tg, nm, 2);
        if (sj) {
            json_object_set_new(sj, "cpu", json_string(x->cpu));
            json_object_set_new(sj, "threads", json_integer(x->threads_used));
            json_object_set_new(sj, "cpus_online", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
        }
        json_object_set_new(J, "scale", sj ? sj : json_null());
    } else {
        json_object_set_new(J, "scale", json_null());
    }
    {
        const double ch[2] = {(double)x->chunks, x->a->large / x->L};
        const char *const nm[2] = {"corpus", "large"};
        json_t *st = dfm_audit_storage_json(&x->st, ch, nm, 2);
        json_object_set_new(J, "storage", st ? st : json_null());
    }
    json_object_set_new(J, "scaling_model",
                        json_string("search_s_constant = queries x measured seconds per query (a lower bound: the per-query cost of "
                                    "the sample's small datastore); search_s_scaled also grows the per-query cost with the datastore: "
                                    "linearly for exact Flat, with sqrt(N) for IVF (sqrt(N) lists, fixed nprobe), not at all for HNSW"));
    return J;
}

/* render: the bar chart audit.svg */
static int render_svg(const audit_ctx *x, const char *path) {
    dfm_audit_bar bars[4] = {
        {"queries", "whole corpus", (double)x->queries, (double)x->tokens},
        {"items", "kept, whole corpus", (double)x->kept, (double)x->ct.token_items},
        {"search time", "not measured", 0, 0, "less"},
        {"index storage", "not measured", 0, 0, "less"},
    };
    dfm_audit_panel panels[3];
    dfm_audit_range range = {0, 0, 0, 0};
    char note[400] = "";
    if (x->scaled) {
        /* the corpus from the cost model */
        dfm_audit_extrap e;
        dfm_audit_scale_extrapolate(&x->sc, (double)x->tokens, &e);
        bars[2] = (dfm_audit_bar){"search time", "CPU s, all queries, model", e.search_s[0], e.search_s[1], "less"};
        bars[3] = (dfm_audit_bar){"index storage", "bytes, layout", e.index_bytes[0], e.index_bytes[1], "less"};
        dfm_audit_scale_panels(&x->sc, x->a->large, panels, &range);
        snprintf(note, sizeof note, "dots: measured (medians of %d); line: cost model, dashed past the measured (shaded) range; band shaded; "
                 "past the dotted rule (%.0fx) a model only. Token keys: %s.", x->sc.cfg.repeats,
                 DFM_AUDIT_DEFENSIBLE, strcmp(x->sc.cfg.token_keys, "random") ? "a decoder's hidden states" : "RANDOM (not hidden states)");
    } else if (x->measured) {
        bars[2] = (dfm_audit_bar){"search time", "s, corpus, sample rate", x->ex[0].t_chunk_const, x->ex[0].t_token_const, "less"};
        bars[3] = (dfm_audit_bar){"index storage", "bytes, corpus", x->ex[0].bytes_chunk, x->ex[0].bytes_token, "less"};
    }
    char title[256];
    snprintf(title, sizeof title, "dfm audit: chunk level (L=%u, K=%u) vs token level (k=%lld), %s tokens", x->L, x->K,
             (long long)x->a->k_token, H((double)x->tokens, (char[32]){0}));
    return dfm_audit_write_chart(path, title, panels, x->scaled ? 3 : 0, &range, note[0] ? note : NULL, bars, 4);
}

/* render, audit.md: title, inputs, chart, the claim counted */
static void md_counted(FILE *mf, const audit_ctx *x) {
    char b1[32];
    json_t *chunk_stage = dfm_manifest_stage(x->m, "chunk");
    fprintf(mf, "# Retrieval-cost audit of `%s`\n\n", x->a->run);
    fprintf(mf, "dfm %s, %s. Config hash `%s` (XXH3-128 of the stages' configs in manifest.json).", DFM_VERSION, x->when, x->chash);
    json_t *inputs = json_object_get(chunk_stage, "inputs");
    size_t ii;
    json_t *inp;
    json_array_foreach(inputs, ii, inp) fprintf(mf, " Input `%s` (%s bytes, xxh128 `%s`).", json_string_value(json_object_get(inp, "path")),
                                                H(json_number_value(json_object_get(inp, "bytes")), b1),
                                                json_string_value(json_object_get(inp, "xxh128")) ? json_string_value(json_object_get(inp, "xxh128")) : "?");
    fprintf(mf, "\n\n![chart](audit.svg)\n\n");
    fprintf(mf, "## The claim, counted\n\n");
    fprintf(mf, "DFM retrieves once per chunk of L = %u tokens and keeps K = %u neighbours; a token-level method (kNN-LM, Memory "
                "Decoder, MLP Memory) retrieves once per token and keeps k = %lld.\n\n", x->L, x->K, (long long)x->a->k_token);
    fprintf(mf, "| | chunk level | token level | saving | formula |\n|---|---:|---:|---:|---:|\n");
    fprintf(mf, "| queries, per chunk slot (one per chunk vs one per token slot) | %llu | %llu | **%.4f %%** | 1 − 1/%u = %.4f %% |\n",
            (unsigned long long)x->ct.chunk_queries, (unsigned long long)x->ct.token_slot_queries, pct(x->ct.query_saving_per_chunk), x->L,
            pct(x->ct.query_saving_formula));
    fprintf(mf, "| items, per chunk slot (K vs L·k) | %llu | %llu | **%.4f %%** | 1 − %u/(%u·%lld) = %.4f %% |\n",
            (unsigned long long)x->ct.chunk_items, (unsigned long long)x->ct.token_slot_items, pct(x->ct.item_saving_per_chunk), x->K, x->L,
            (long long)x->a->k_token, pct(x->ct.item_saving_formula));
    fprintf(mf, "| queries as issued by the run (vs one per real token) | %llu | %llu | %.4f %% | |\n", (unsigned long long)x->queries,
            (unsigned long long)x->ct.token_queries, pct(x->ct.query_saving_run));
    fprintf(mf, "| items kept by the run (vs k per real token) | %llu | %llu | %.4f %% | |\n", (unsigned long long)x->kept,
            (unsigned long long)x->ct.token_items, pct(x->ct.item_saving_run));
    fprintf(mf, "| candidates fetched by the run (K + margin = %u per query, before exclusions) | %llu | %llu | %.4f %% | |\n\n",
            x->K + x->margin, (unsigned long long)x->fetched, (unsigned long long)x->ct.token_items, pct(x->ct.candidate_saving_run));
    fprintf(mf, "The per-chunk rows are the formulas applied to the run's %llu chunks and equal them exactly. The run's own "
                "figures differ because %llu chunks issue no query (the first chunk of each of the %llu sequences has no "
                "preceding context; empty chunks have no embedding), %llu of the %llu token slots are padding (a token-level "
                "method would not query them), and %llu slots were padded after exclusions. Candidates fetched include the "
                "margin that over-fetching for exclusions costs; a token-level method that removes its self-match pays a "
                "similar margin, not counted here.\n\n",
            (unsigned long long)x->chunks, (unsigned long long)x->no_query, (unsigned long long)x->sequences, (unsigned long long)x->pad_tokens,
            (unsigned long long)(x->chunks * x->L), (unsigned long long)x->padded);
}

/* render, audit.md: the run's settings, counts and timings */
static void md_run(FILE *mf, const audit_ctx *x) {
    char b1[32], b2[32], b3[32];
    fprintf(mf, "## The run\n\n| setting | value |\n|---|---|\n");
    fprintf(mf, "| chunk length L / sequence length S | %u / %u |\n| K / margin | %u / %u |\n| exclusion | %s |\n", x->L, x->S, x->K, x->margin,
            x->exclude ? x->exclude : "?");
    fprintf(mf, "| index | `%s`, metric %s, dim %u%s%s%s |\n| nprobe | %lld |\n\n", x->factory, x->metric_s ? x->metric_s : "ip", x->enc_dim,
            x->index_why ? " (" : "", x->index_why ? x->index_why : "", x->index_why ? ")" : "", (long long)x->nprobe);
    fprintf(mf, "| stage | count | time |\n|---|---|---:|\n");
    fprintf(mf, "| chunk | %llu documents, %llu tokens (+%llu padding), %llu chunks, %llu sequences | %s |\n", (unsigned long long)x->documents,
            (unsigned long long)x->tokens, (unsigned long long)x->pad_tokens, (unsigned long long)x->chunks, (unsigned long long)x->sequences,
            secs(x->t_stage[0] > 0 ? x->t_stage[0] : 0, b1));
    fprintf(mf, "| encode | %s | %s |\n", x->have_encode ? "every chunk embedded once (the query of a chunk is its predecessor's embedding)" : "not complete",
            secs(x->t_stage[1] > 0 ? x->t_stage[1] : 0, b1));
    fprintf(mf, "| index | %llu vectors, %s | %s |\n", (unsigned long long)x->vectors, bytes((double)x->index_bytes, b2),
            secs(x->t_stage[2] > 0 ? x->t_stage[2] : 0, b1));
    fprintf(mf, "| retrieve | %llu queries, %llu candidates fetched, %llu excluded, %llu kept, %llu padded; neighbours %s | %s (search %s) |\n",
            (unsigned long long)x->queries, (unsigned long long)x->fetched, (unsigned long long)x->excluded, (unsigned long long)x->kept,
            (unsigned long long)x->padded, bytes((double)x->nbr_bytes, b2), secs(x->t_stage[3] > 0 ? x->t_stage[3] : 0, b1),
            secs(x->t_search > 0 ? x->t_search : 0, b3));
    if (x->have_targets)
        fprintf(mf, "| targets | %llu records, %s raw, %s stored (%.1f bytes per token) | %s |\n", (unsigned long long)x->records,
                bytes((double)x->raw_bytes, b2), bytes((double)x->stored_bytes, b3), x->tokens ? (double)x->stored_bytes / (double)x->tokens : 0.0,
                secs(x->t_stage[4] > 0 ? x->t_stage[4] : 0, b1));
    fprintf(mf, "| total | | %s |\n\n", secs(x->t_total, b1));
}

/* render, audit.md: the measured comparison */
static void md_measured(FILE *mf, const audit_ctx *x) {
    char b1[32], b2[32];
    if (x->measured) {
        fprintf(mf, "## Measured on this machine\n\n");
        fprintf(mf, "%llu of the run's %llu sequences (%llu tokens, %llu chunks), both datastores built and searched here, one after "
                    "the other, with %d OpenMP thread(s) (--threads) on %s (%s).\n\n",
                (unsigned long long)x->smp.n_seq, (unsigned long long)x->smp.n_seq_total, (unsigned long long)x->smp.tokens,
                (unsigned long long)x->smp.chunks, x->threads_used, x->cpu, x->host);
        fprintf(mf, "| | chunk level | token level | token / chunk |\n|---|---:|---:|---:|\n");
        fprintf(mf, "| index | `%s` | `%s` | |\n", x->cs.factory, x->ts.factory);
        fprintf(mf, "| key width | %u (the run's encoder) | %u (LM hidden size) | |\n", x->cs.dim, x->ts.dim);
        fprintf(mf, "| keys | %llu | %llu | %.1f× |\n", (unsigned long long)x->cs.keys, (unsigned long long)x->ts.keys,
                (double)x->ts.keys / (double)x->cs.keys);
        fprintf(mf, "| queries | %llu | %llu | %.1f× |\n", (unsigned long long)x->cs.queries, (unsigned long long)x->ts.queries,
                (double)x->ts.queries / (double)(x->cs.queries ? x->cs.queries : 1));
        fprintf(mf, "| k per query | %u (K + margin) | %u | |\n", x->cs.k, x->ts.k);
        fprintf(mf, "| build (keys, train, add) | %s | %s | |\n", secs(x->cs.build_s, b1), secs(x->ts.build_s, b2));
        fprintf(mf, "| search, all queries | %s | %s | %.1f× |\n", secs(x->cs.search_s, b1), secs(x->ts.search_s, b2),
                x->cs.search_s > 0 ? x->ts.search_s / x->cs.search_s : 0.0);
        fprintf(mf, "| time per query | %s | %s | %.1f× |\n", secs(x->cs.s_per_query, b1), secs(x->ts.s_per_query, b2),
                x->cs.s_per_query > 0 ? x->ts.s_per_query / x->cs.s_per_query : 0.0);
        fprintf(mf, "| search time per corpus token | %s | %s | |\n", secs(x->cs.search_s / (double)x->smp.tokens, b1),
                secs(x->ts.search_s / (double)x->smp.tokens, b2));
        fprintf(mf, "| index size | %s | %s | %.1f× |\n", bytes((double)x->cs.index_bytes, b1), bytes((double)x->ts.index_bytes, b2),
                (double)x->ts.index_bytes / (double)(x->cs.index_bytes ? x->cs.index_bytes : 1));
        fprintf(mf, "| index bytes per corpus token | %.1f | %.1f | |\n\n", (double)x->cs.index_bytes / (double)x->smp.tokens,
                (double)x->ts.index_bytes / (double)x->smp.tokens);
        fprintf(mf, "| saving (chunk vs token) | counted (formula) | measured on the sample |\n|---|---:|---:|\n");
        fprintf(mf, "| queries | %.4f %% | %.4f %% |\n", pct(x->ct.query_saving_formula), pct(1 - (double)x->cs.queries / (double)x->ts.queries));
        fprintf(mf, "| items (fetched per query × queries) | %.4f %% | %.4f %% |\n", pct(x->ct.item_saving_formula),
                pct(1 - (double)x->cs.queries * x->cs.k / ((double)x->ts.queries * x->ts.k)));
        fprintf(mf, "| search time | — | %s |\n", W(x->ts.search_s > 0 ? 1 - x->cs.search_s / x->ts.search_s : NAN, (char[48]){0}));
        fprintf(mf, "| index bytes | — | %s |\n\n", W(1 - (double)x->cs.index_bytes / (double)x->ts.index_bytes, (char[48]){0}));
        fprintf(mf, "Chunk-level items here are the K + margin candidates each query fetches, so the measured item saving is "
                    "below the formula's K-per-chunk figure by that margin. Index choice: chunk level — %s; token level — %s.\n\n",
                x->cs.why, x->ts.why);
        fprintf(mf, "**What the keys are.** Both datastores hold seeded pseudo-random unit vectors (token level: one per "
                    "token, drawn from its (previous token, token) pair; chunk level: one per chunk, drawn from its tokens). They "
                    "are not hidden states or embeddings and neighbours found among them mean nothing; the audit measures cost: "
                    "build time, time per query, index size, at the sizes, widths, k and index type each method needs.\n\n");
    } else {
        if (!x->scaled) fprintf(mf, "## Measured\n\nNot run (use `--measure-tokens N` or `--token-level-sample N`).\n\n");
    }
}

/* render, audit.md: extrapolation and how to read the report */
static void md_extrapolated(FILE *mf, const audit_ctx *x) {
    char b1[32], b2[32], b3[32], b4[32];
    fprintf(mf, "## Extrapolated\n\nQueries and keys per token are the run's (%.5f queries and %.5f keys per token at chunk level; 1 and "
                "1 at token level).%s\n\n",
            x->q_per_tok, x->keys_per_tok,
            x->measured ? " Search time: *constant* = queries × the measured time per query (a lower bound: the sample's datastore is "
                       "small); *scaled* also grows each query's cost with the datastore (linearly for exact Flat, √N for IVF)."
                     : "");
    fprintf(mf, "| corpus | | chunk level | token level | saving |\n|---|---|---:|---:|---:|\n");
    for (int i = 0; i < 2; i++) {
        const extrap_t *e = &x->ex[i];
        char nm[64];
        snprintf(nm, sizeof nm, "%s (%s tokens)", i ? "large" : "this corpus", H(e->tokens, b4));
        fprintf(mf, "| %s | queries | %s | %s | %.4f %% |\n", nm, H(e->q_chunk, b1), H(e->q_token, b2), pct(1 - e->q_chunk / e->q_token));
        fprintf(mf, "| | items | %s | %s | %.4f %% |\n", H(e->items_chunk, b1), H(e->items_token, b2),
                pct(1 - e->items_chunk / e->items_token));
        if (x->measured) {
            fprintf(mf, "| | index size | %s | %s | %s |\n", bytes(e->bytes_chunk, b1), bytes(e->bytes_token, b2),
                    W(1 - e->bytes_chunk / e->bytes_token, (char[48]){0}));
            fprintf(mf, "| | search time, constant | %s | %s | %s |\n", secs(e->t_chunk_const, b1), secs(e->t_token_const, b2),
                    W(1 - e->t_chunk_const / e->t_token_const, (char[48]){0}));
            fprintf(mf, "| | search time, scaled | %s | %s | %s |\n", secs(e->t_chunk_scaled, b1), secs(e->t_token_scaled, b2),
                    W(1 - e->t_chunk_scaled / e->t_token_scaled, (char[48]){0}));
        }
    }
    if (x->measured && (cost_exponent(x->cs.factory) >= 1 || cost_exponent(x->ts.factory) >= 1))
        fprintf(mf, "\nAn exact Flat index scans every key per query, so its *scaled* time grows with the square of the corpus; "
                    "at large scale a real run would use IVF or HNSW (`dfm index` chooses IVF above %llu vectors). The scaled Flat "
                    "figures show why, not what such a run would cost; the *constant* rows are the lower bound.\n",
                DFM_INDEX_FLAT_MAX);
    if (x->measured && x->t_search > 0 && x->queries)
        fprintf(mf, "\nFor reference, the run itself searched its whole corpus in %s (%s per query on %d ranks), against %s per query "
                    "measured here on the sample.\n",
                secs(x->t_search, b1), secs(x->t_search / (double)x->queries, b2), (int)mnum(x->m, "retrieve", NULL, "ranks"),
                secs(x->cs.s_per_query, b3));
    fprintf(mf, "\n## How to read this\n\n"
                "- *Counted* savings are arithmetic on the run's manifest; the per-chunk rows must equal the formulas "
                "1 − 1/L and 1 − K/(L·k) exactly — if they do not, the run is not what its config says.\n"
                "- *Measured* figures are wall-clock times and serialised index sizes from this machine; compare the two "
                "columns with each other, not with other machines. A small sample makes per-query times optimistic for both.\n"
                "- The token-level method's real cost is higher than shown: its keys are LM hidden states that need a forward "
                "pass of the LM over the whole corpus, which is not counted.\n"
                "- `audit.json` holds every figure (schemas/audit.md); `dfm audit --compare RUN_A RUN_B` checks two runs agree.\n");
}

/* the summary on stdout; paths: audit.json, audit.md, audit.svg */
static void print_summary(const audit_ctx *x, char *const paths[3]) {
    char b1[32], b2[32], b3[32], b4[32];
    printf("audit: %s\n", x->a->out_dir);
    printf("  counted  queries %.4f %% fewer (1 - 1/%u = %.4f %%; as issued %.4f %%), items %.4f %% fewer (formula %.4f %%; as kept %.4f %%)\n",
           pct(x->ct.query_saving_per_chunk), x->L, pct(x->ct.query_saving_formula), pct(x->ct.query_saving_run), pct(x->ct.item_saving_per_chunk),
           pct(x->ct.item_saving_formula), pct(x->ct.item_saving_run));
    if (x->measured)
        printf("  measured on %llu tokens: search %s (chunk) vs %s (token), index %s vs %s; corpus extrapolation %s vs %s\n",
               (unsigned long long)x->smp.tokens, secs(x->cs.search_s, b1), secs(x->ts.search_s, b2), bytes((double)x->cs.index_bytes, b3),
               bytes((double)x->ts.index_bytes, b4), secs(x->ex[0].t_chunk_const, (char[32]){0}), secs(x->ex[0].t_token_const, (char[32]){0}));
    if (x->scaled) {
        const dfm_audit_size *z = &x->sc.s[x->sc.n - 1];
        dfm_audit_extrap e;
        dfm_audit_scale_extrapolate(&x->sc, x->a->large, &e);
        printf("  at scale %llu tokens (%s): token level %s %.3g ms/query (CPU, median of %d), %s, recall@%u %.3f; chunk level %s %.3g ms/query, %s\n",
               (unsigned long long)z->tokens, strcmp(x->sc.cfg.token_keys, "random") ? "hidden states" : "RANDOM keys", z->tok.factory,
               z->tok.query_cpu.med * 1e3, z->tok.query_cpu.n, bytes((double)z->tok.index_bytes, b1), x->sc.cfg.k_token, z->tok.recall,
               z->chk.factory, z->chk.query_cpu.med * 1e3, bytes((double)z->chk.index_bytes, b2));
        {
            /* measured like for like at the largest size, all queries of its text */
            double qt = (double)z->tokens, qc = qt * x->sc.cfg.chunk_queries_per_token;
            double st = qt * z->tok.query_cpu.med, sp = qc * z->chk_pq.query_cpu.med;
            char w[48];
            if (z->chk_pq.skipped)
                printf("  measured at %llu tokens, like for like: the chunk level's %llu keys are too few for IVF-PQ (not measured; priced "
                       "with the token level's IVF-PQ rates below)\n", (unsigned long long)z->tokens, (unsigned long long)z->chk_pq.keys);
            else
                printf("  measured at %llu tokens, like for like (IVF-PQ both): search CPU, all queries, token level %s, chunk level %s: %s "
                       "(the model predicts these from the smaller sizes %+.1f %% and %+.1f %%)\n", (unsigned long long)z->tokens, secs(st, b1),
                       secs(sp, b2), dfm_audit_saving_words(1 - sp / st, 3, "less", w, sizeof w), 100 * x->sc.model[1].search_err,
                       100 * x->sc.model[2].search_err);
        }
        static const char *side_name[DFM_AUDIT_SIDES] = {"chunk level, run's index", "token level", "chunk level, IVF-PQ"};
        for (int i = 0; i < DFM_AUDIT_SIDES; i++) {
            const dfm_audit_side_model *m = &x->sc.model[i];
            if (!m->ok) printf("  model, %s: none (%s)\n", side_name[i], m->why);
            else
            {
                char mix[128] = "";
                if (!isnan(m->mix_err))
                    snprintf(mix, sizeof mix, "; at %lld lists (look-ups %.0f %% of operations, %.0f %% at its nprobe) %+.1f %%",
                             (long long)m->mix_nprobe, 100 * m->mix_codes_share, 100 * m->codes_share, 100 * m->mix_err);
                printf("  model, %s (%s, %d sizes): the smaller sizes predict the largest's search %+.1f %%, build %+.1f %%%s; layout = "
                       "serialised bytes within %.2g %%\n", side_name[i], dfm_audit_family_name(m->family), m->sizes, 100 * m->search_err,
                       100 * m->build_err, mix, 100 * m->bytes_err);
            }
        }
        char w0[48], w2[48], lo[3][32], hi[3][32];
        for (int i = 0; i < DFM_AUDIT_SIDES; i++) {
            secs(e.search_s[i] / e.search_band[i], lo[i]);
            secs(e.search_s[i] * e.search_band[i], hi[i]);
        }
        printf("  at %s tokens (%.3g× the largest measured%s), search CPU, all queries: token level %s (%s – %s); chunk level %s "
               "(%s – %s) with the run's index at that size, %s; %s in IVF-PQ, %s\n",
               H(x->a->large, b3), e.beyond, e.beyond > DFM_AUDIT_DEFENSIBLE ? ": a model, not a measurement" : "", secs(e.search_s[1], b4),
               lo[1], hi[1], secs(e.search_s[0], (char[32]){0}), lo[0], hi[0],
               e.ok[0] && e.ok[1] ? dfm_audit_saving_words(1 - e.search_s[0] / e.search_s[1], 3, "less", w0, sizeof w0) : "no model",
               e.ok[2] ? secs(e.search_s[2], (char[32]){0}) : "nothing",
               e.ok[2] && e.ok[1] ? dfm_audit_saving_words(1 - e.search_s[2] / e.search_s[1], 3, "less", w2, sizeof w2) : "no model");
        printf("  index bytes there (layout): token level %s, chunk level %s (run's index), %s (IVF-PQ)%s\n", bytes(e.index_bytes[1], b1),
               bytes(e.index_bytes[0], b2), bytes(e.index_bytes[2], (char[32]){0}),
               (e.ok[0] && e.search_s[0] > e.search_s[1]) || (e.ok[2] && e.search_s[2] > e.search_s[1]) ? "; where a saving is \"more\", audit.md says why" : "");
        printf("  conditions: %s, %d thread(s), load average %.2f before / %.2f after, %s\n", x->cpu, x->threads_used, x->sc.load_before[0],
               x->sc.load_after[0], secs(x->sc.wall_s, b1));
    }
    {
        /* what the memory costs to store at the large size, with a table (ids in the records): the run's layout and the
         * LM-state ones */
        double nc = x->a->large / x->L;
        printf("  storage  target memory at %s tokens (%s chunks, ids + one row a chunk):", H(x->a->large, b1), H(nc, b2));
        for (int i = 0; i < x->st.n; i++)
            printf("%s %s %s", i ? "," : "", i ? x->st.row[i].what : "the run's embeddings", bytes(nc * x->st.row[i].with_table, b3));
        printf("%s\n", x->st.raw_matches == 0 ? "; the run's raw record bytes differ from the arithmetic" : "");
    }
    printf("  report %s, chart %s, data %s\n", paths[1], paths[2], paths[0]);
}

/* render: audit.json, audit.svg and audit.md into the output folder, then the summary */
static int audit_render(const audit_ctx *x) {
    const char *dir = x->a->out_dir;
    DFM_TRY(dfm_mkdir_p(dir));
    char *paths[3] = {dfm_path_join(dir, "audit.json"), dfm_path_join(dir, "audit.md"), dfm_path_join(dir, "audit.svg")};
    char *txt = NULL, *md = NULL;
    size_t md_n = 0;
    json_t *J = render_json(x);
    int rc = paths[0] && paths[1] && paths[2] && J ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc && !(txt = json_dumps(J, JSON_INDENT(2) | JSON_REAL_PRECISION(17)))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = dfm_write_file_atomic(paths[0], txt, strlen(txt));
    if (!rc) rc = render_svg(x, paths[2]);
    FILE *mf = rc ? NULL : open_memstream(&md, &md_n);
    if (!rc && !mf) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) {
        md_counted(mf, x);
        md_run(mf, x);
        if (x->scaled) {
            const double tg[2] = {(double)x->tokens, x->a->large};
            const char *const nm[2] = {"this corpus", "large"};
            dfm_audit_scale_md(mf, &x->sc, x->cpu, x->threads_used, tg, nm, 2);
        }
        md_measured(mf, x);
        md_extrapolated(mf, x);
        {
            char nl[48];
            snprintf(nl, sizeof nl, "%s tokens", H(x->a->large, (char[32]){0}));
            const double ch[2] = {(double)x->chunks, x->a->large / x->L};
            const char *const nm[2] = {"this corpus", nl};
            dfm_audit_storage_md(mf, &x->st, ch, nm, 2);
        }
        fclose(mf);
        rc = dfm_write_file_atomic(paths[1], md, md_n);
    }
    if (!rc) print_summary(x, paths);
    free(txt);
    free(md);
    json_decref(J);
    for (int i = 0; i < 3; i++) free(paths[i]);
    return rc;
}

int dfm_audit_run(const dfm_audit_config *cfg) {
    audit_ctx x;
    memset(&x, 0, sizeof x);
    x.a = cfg;
    /* one writer per run: a stage rebuilding the run would change what is counted and measured under us,
     * and the report goes into it (common/runlock.h); a missing run is left to audit_count's message */
    int rc = dfm_path_exists(cfg->run) ? dfm_runlock_take(cfg->run) : DFM_OK;
    if (!rc) rc = audit_count(&x);
    if (!rc) rc = audit_measure(&x);
    if (!rc) {
        audit_extrapolate(&x);
        audit_environment(&x);
        rc = audit_render(&x);
    }
    json_decref(x.m);
    sample_free(&x.smp);
    return rc;
}
