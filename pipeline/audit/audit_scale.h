/* audit_scale.h — `dfm audit --measure-tokens N`: both datastores built and searched at several sizes of the
 * same text, and a cost model (audit_layout.h, audit_model.h) fitted to them, validated on the largest size and
 * extrapolated with its band.
 *
 * Token level: one key per token (a decoder's hidden states, schemas/hidden_states.h, or seeded random
 * keys when asked), IVF-PQ as kNN-LM and Memory Decoder use (lists scaled to the size, PQ codes, k =
 * 1024). Chunk level: one key per chunk (the run's encoder embeddings), the run's own index family, k = K
 * + margin. At each size: build time, search seconds per query (min/median/max over repeats), index
 * bytes, recall@k against exact search on a sample of the queries. Spec of the figures: schemas/audit.md.
 */
#ifndef DFM_AUDIT_SCALE_H
#define DFM_AUDIT_SCALE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pipeline/audit/audit_layout.h"
#include "pipeline/audit/audit_model.h"

#define DFM_AUDIT_MAX_REPEATS 15
#define DFM_AUDIT_MAX_SIZES 12
#define DFM_AUDIT_SIDES 3 /* chunk level with the run's index, token level, chunk level with IVF-PQ */
/* A timed build or search pass repeats until it has used this much CPU, and counts the median run: the demo's Flat
 * indexes build in microseconds and search 500 queries in under a millisecond, where one call is mostly the
 * clock's and the scheduler's noise (their smaller sizes predicted the largest 27-75 % off with one call each). */
#define DFM_AUDIT_MIN_TIMED_S 0.25

/* ---- one datastore at one size ---------------------------------------------------------------------- */

typedef struct {
    double min, med, max;
    int n;
} dfm_audit_spread;

/* min / median / max of n values (n >= 1) */
dfm_audit_spread dfm_audit_spread_of(const double *v, int n);

typedef struct {
    const char *factory;  /* FAISS factory string, or "ivfpq" (dfm_audit_ivfpq_factory) or "auto" (as dfm index) */
    uint32_t metric;      /* DFM_METRIC_IP / DFM_METRIC_L2 */
    uint32_t dim, k;
    int64_t nprobe;       /* IVF lists visited (capped at the lists; 0: FAISS's default) */
    int repeats;          /* timed passes over the queries (1..DFM_AUDIT_MAX_REPEATS) */
    int build_repeats;    /* timed builds (1..DFM_AUDIT_MAX_REPEATS) */
    uint64_t recall_queries; /* queries also searched exactly for recall@k (0: none) */
    int wide;             /* IVF only: also time the search at DFM_AUDIT_WIDE_PROBES x nprobe (the operation-mix check) */
} dfm_audit_point_opts;

/* The operation-mix check: the largest size of an IVF side is also searched visiting this many times the lists.
 * That multiplies the codes scanned and the per-list tables and leaves the coarse distances as they were, so the
 * mix of operations moves (toward code look-ups where lists hold more codes than a PQ table has entries, as at
 * 5e9 tokens, where look-ups are most of a query); the model's one rate, fitted at the run's nprobe, must predict
 * that time too. */
#define DFM_AUDIT_WIDE_PROBES 4

typedef struct {
    int skipped;              /* the size is too small for the family asked for: nothing built (why says so) */
    uint64_t keys, queries;
    char factory[256];
    char why[600];
    uint64_t nlist;
    int64_t nprobe;
    uint64_t train_n;         /* keys the index was trained on */
    dfm_audit_spread build_s; /* train + add, wall seconds, over `repeats` builds */
    dfm_audit_spread query_s; /* wall seconds per query, over `repeats` timed passes after an untimed warm-up */
    dfm_audit_spread build_cpu, query_cpu; /* the same in process CPU seconds (all threads) */
    uint64_t build_passes, search_passes; /* builds and searches of the whole batch timed in all (DFM_AUDIT_MIN_TIMED_S) */
    int64_t wide_nprobe;      /* the operation-mix check's lists visited (0: not done) */
    dfm_audit_spread wide_query_cpu; /* its CPU seconds per query */
    uint64_t index_bytes;     /* serialised FAISS index */
    double layout_bytes;      /* the same from the layout arithmetic (dfm_audit_layout_bytes; NAN: no model) */
    uint64_t results;         /* valid neighbours returned in one pass */
    double recall;            /* mean |approx top-k ∩ exact top-k| / k over recall_queries (1 for an exact index) */
    uint64_t recall_queries;
} dfm_audit_point;

/* "IVF<lists>,PQ<m>" for n keys of width dim, the token-level datastore of kNN-LM / Memory Decoder scaled
 * down: lists = the power of two nearest sqrt(n) (at most n / 39), m = the largest divisor of dim that is
 * at most min(64, dim / 4) (64-byte codes for keys of 256 and wider, as theirs for 1024). Below 1000 keys, "Flat" (IVF-PQ cannot be
 * trained). The reason into why. */
void dfm_audit_ivfpq_factory(uint64_t n, uint32_t dim, char *out, size_t n_out, char *why, size_t n_why);

/* The index a datastore of n keys gets: for factory "ivfpq" the rule above, trained on 39 keys per list (at
 * least 9984 for the PQ codebooks, at most n) — and below 1000 keys too_small, with no factory: the audit
 * does not build a Flat index and call it IVF-PQ; otherwise dfm_audit_plan (as `dfm index` chooses). */
typedef struct {
    char factory[256];
    uint32_t metric;
    uint64_t nlist, train_n;
    int too_small;
} dfm_audit_choice;
int dfm_audit_choose(const char *factory, uint32_t metric, uint32_t dim, uint64_t n, dfm_audit_choice *c, char *why, size_t n_why);

/* Build o's index (dfm_audit_choose) over keys[n_keys * dim] `repeats` times, search the nq queries (rows of keys
 * given by qidx) `repeats` times, then recall@k of the first recall_queries of them against an exact Flat search;
 * the serialised bytes beside the layout arithmetic. A size too small for the family: p->skipped, DFM_OK.
 * DFM_EARG, DFM_ENOMEM, DFM_EFAISS. */
int dfm_audit_measure_point(const dfm_audit_point_opts *o, const float *keys, uint64_t n_keys, const uint64_t *qidx, uint64_t nq,
                            dfm_audit_point *p);

/* ---- the measurement at several sizes (audit_scale_run.c) ------------------------------------------ */

typedef struct {
    const char *run;          /* the audited run: its chunk embeddings are the chunk-level keys */
    const char *token_keys;   /* a hidden-states file, or "random" (seeded unit vectors of width random_dim) */
    uint32_t random_dim;      /* width of random token keys (--token-key-dim) */
    uint64_t max_tokens;      /* the largest size, in tokens (--measure-tokens) */
    int sizes;                /* sizes, each 4x the previous, ending at max_tokens (2..DFM_AUDIT_MAX_SIZES) */
    int repeats;              /* search passes per size */
    int build_repeats;        /* builds per size */
    uint64_t queries;         /* timed queries per size and side (fewer when the datastore is smaller) */
    uint64_t recall_queries;  /* of those, searched exactly too */
    uint32_t k_token, k_chunk;/* token_k; K + margin */
    int64_t token_nprobe, chunk_nprobe;
    const char *chunk_index;  /* the run's --index ("auto" or a factory string) */
    uint32_t chunk_metric;    /* the run's metric */
    double chunk_keys_per_token, chunk_queries_per_token; /* the run's rates */
    uint64_t seed;
} dfm_audit_scale_cfg;

/* One side's cost model, fitted on the sizes where that side was measured (CPU medians: on a shared machine wall
 * time carries other processes' load; with one thread they agree when idle). */
typedef struct {
    int ok;                  /* the side was measured at 2 sizes or more in a family the model knows */
    dfm_audit_family family; /* of the measured sizes (the largest's) */
    int sizes;               /* sizes measured (a skipped size is not one) */
    dfm_audit_rates search;  /* seconds per query: rate[0] fixed, rate[1] per operation (flop, code, candidate) */
    dfm_audit_rates build;   /* build seconds: rate[0] fixed, rate[1] per operation (training and adding flops) */
    double search_err, build_err; /* validation: the smaller sizes' rates predict the largest: prediction / measured - 1 (NAN: < 3 sizes) */
    int search_valid, build_valid; /* dfm_audit_validate: 1 within DFM_AUDIT_VALID_MAX, 0 not, -1 not done */
    double bytes_err;        /* largest |layout arithmetic / serialised - 1| over the sizes */
    /* the operation-mix check at the largest size (DFM_AUDIT_WIDE_PROBES): the rates fitted on every size predict the
     * search at wide_nprobe lists: prediction / measured - 1 (NAN: not done); codes_share: code look-ups and
     * comparisons over all operations of a query there, and at the run's nprobe */
    double mix_err, mix_codes_share, codes_share;
    int64_t mix_nprobe;
    char why[300];           /* when not ok: why */
} dfm_audit_side_model;

typedef struct {
    uint64_t tokens;          /* the size: tokens of the text's prefix */
    dfm_audit_point tok, chk;
    dfm_audit_point chk_pq;   /* the chunk-level keys in the token level's family (IVF-PQ, same rule): like for like
                               * (skipped below 1000 chunk keys) */
    uint64_t chunk_real_keys; /* chunk-level keys that are the run's embeddings (the rest: seeded random) */
} dfm_audit_size;

typedef struct {
    dfm_audit_scale_cfg cfg;
    char token_keys_desc[600];/* where the token keys came from */
    uint64_t text_keys;       /* keys the token-key source holds */
    uint64_t run_chunks;      /* chunk embeddings the run holds */
    uint64_t text_agree;      /* tokens over which the hidden states' text equals the run's (next-token values) */
    int64_t text_differs_at;  /* first differing token, -1 when none */
    uint32_t token_dim, chunk_dim;
    int n;
    dfm_audit_size s[DFM_AUDIT_MAX_SIZES];
    /* the cost model of each side [0 chunk (run's index), 1 token, 2 chunk (IVF-PQ)] (dfm_audit_scale_model) */
    dfm_audit_side_model model[DFM_AUDIT_SIDES];
    double wall_s;
    double load_before[3], load_after[3];
} dfm_audit_scale;

/* Measure both sides at cfg->sizes sizes (see the top of this file). Progress on the log. DFM_EARG for
 * a size the text cannot hold (the sizes shrink to what it holds, with a note, unless fewer than two
 * remain), the errors of the reader and of dfm_audit_measure_point. */
int dfm_audit_scale_run(const dfm_audit_scale_cfg *cfg, dfm_audit_scale *out);

/* ---- extrapolation and the report's scale section (audit_scale_report.c) --------------------------- */

/* Fit each side's model on the measured sizes, validate it (dfm_audit_validate on search and build) and check
 * the layout arithmetic against the serialised bytes. A side without two measured sizes or whose family has no
 * model gets ok 0 and why. Called by dfm_audit_scale_run; exposed for tests. */
void dfm_audit_scale_model(dfm_audit_scale *s);

/* The sides at a corpus of `tokens` tokens from the cost model: [0] chunk level (the run's index, chosen for
 * that size as `dfm index` would on one rank with its default memory), [1] token level (the IVF-PQ rule),
 * [2] chunk level in IVF-PQ. Index bytes are the layout arithmetic of that index; times are its operation
 * counts times the rates of a side measured in the same family (the side's own, else the token level's IVF-PQ
 * rates, else the side's own rates carried to the new family: rates_side and carried say which), with the band
 * dfm_audit_band(validation error of those rates, tokens / largest measured, the size step). */
typedef struct {
    double tokens, beyond;    /* beyond: tokens / the largest measured size */
    int ok[DFM_AUDIT_SIDES];  /* a model for this side */
    char factory[DFM_AUDIT_SIDES][256];
    int rates_side[DFM_AUDIT_SIDES], carried[DFM_AUDIT_SIDES];
    double keys[DFM_AUDIT_SIDES], queries[DFM_AUDIT_SIDES];
    double s_per_query[DFM_AUDIT_SIDES], search_s[DFM_AUDIT_SIDES], search_band[DFM_AUDIT_SIDES]; /* band: a factor, low = s / band, high = s·band */
    double index_bytes[DFM_AUDIT_SIDES];
    double build_s[DFM_AUDIT_SIDES], build_band[DFM_AUDIT_SIDES];
    double codes_share[DFM_AUDIT_SIDES]; /* code look-ups and comparisons over all operations of a query there */
} dfm_audit_extrap;

/* A size's point of side 0, 1 or 2. */
const dfm_audit_point *dfm_audit_side_point(const dfm_audit_size *z, int side);

void dfm_audit_scale_extrapolate(const dfm_audit_scale *s, double tokens, dfm_audit_extrap *e);

/* The "scale" object of audit.json (schemas/audit.md), with the extrapolations to each of targets[n]
 * (named names[n]); NULL on no memory. */
json_t *dfm_audit_scale_json(const dfm_audit_scale *s, const double *targets, const char *const *names, int n);

/* The "Measured at scale" section of audit.md. */
void dfm_audit_scale_md(FILE *mf, const dfm_audit_scale *s, const char *cpu, int threads, const double *targets,
                        const char *const *names, int n);

#endif
