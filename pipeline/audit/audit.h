/* audit.h — `dfm audit`: the retrieval cost of a run, counted and measured, beside token-level retrieval.
 *
 * DFM's claim: one query per L-token chunk instead of one per token is 1 − 1/L fewer
 * queries (96.875 % at L = 32), and K items per chunk instead of k = 1024 per token is 1 − K/(L·k)
 * fewer retrieved items (99.951 % at L = 32, K = 16). The audit has three parts:
 *
 *   counted   pure arithmetic over the run's manifest counts (dfm_audit_count);
 *   measured  a real token-level baseline and the chunk-level side built the same way on the same
 *             N sequences of the run's corpus, same FAISS index family and metric, same machine
 *             (dfm_audit_measure_side), then extrapolated to the whole corpus and a large one;
 *   report    audit.json, audit.md and audit.svg in RUN/audit/ (dfm_audit_run, dfm_audit_write_svg).
 *
 * Spec of audit.json: schemas/audit.md.
 */
#ifndef DFM_AUDIT_H
#define DFM_AUDIT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "pipeline/audit/audit_scale.h"
#include "retriever/index.h"

/* ---- counted ---------------------------------------------------------------------------------- */

typedef struct {
    uint32_t L;              /* tokens per chunk */
    uint32_t K;              /* items kept per chunk-level query */
    uint32_t k_token;        /* items per token-level query (1024 for kNN-LM, Memory Decoder, MLP Memory) */
    uint64_t chunks;         /* chunks in the run (chunk slots; each holds L token slots) */
    uint64_t tokens;         /* real (non-padding) tokens of the corpus: one token-level query each */
    uint64_t queries;        /* chunk-level queries the run issued (first chunks of sequences have none) */
    uint64_t items_kept;     /* neighbours kept by the run (K per query, minus padded slots) */
    uint64_t candidates;     /* neighbours fetched by the run before exclusions (K + margin per query) */
} dfm_audit_counts_in;

typedef struct {
    /* the formulas */
    double query_saving_formula; /* 1 − 1/L */
    double item_saving_formula;  /* 1 − K/(L·k) */
    /* per chunk slot: one query per chunk vs one per token slot (chunks·L), K vs L·k items per chunk.
     * Equal to the formulas for any number of chunks (the same quotient, rounded once). */
    uint64_t chunk_queries, token_slot_queries;
    uint64_t chunk_items, token_slot_items;
    double query_saving_per_chunk;
    double item_saving_per_chunk;
    /* as issued by the run: queries / tokens, items kept / (tokens·k), candidates / (tokens·k) */
    uint64_t token_queries, token_items;
    double query_saving_run;
    double item_saving_run;
    double candidate_saving_run;
} dfm_audit_counted;

/* Fill out from in. Pure; no allocation. DFM_EARG (message names the field) when L, K, k_token or
 * chunks is 0, when tokens > chunks·L, or when queries > chunks. */
int dfm_audit_count(const dfm_audit_counts_in *in, dfm_audit_counted *out);

/* ---- measured --------------------------------------------------------------------------------- */

/* One side of the measured comparison: a datastore of n_keys keys of width dim, n_queries queries
 * (each query is one of the keys, as a token-level method queries with the hidden state of a
 * position that is itself in its training datastore), top-k each. */
typedef struct {
    const char *index;       /* the run's --index value: "auto" or a FAISS factory string */
    uint32_t metric;         /* DFM_METRIC_IP / DFM_METRIC_L2 */
    uint32_t dim;            /* key width */
    uint32_t k;              /* neighbours per query */
    int64_t nprobe;          /* IVF lists visited (0: FAISS default) */
    uint64_t query_block;    /* queries per search call (0: 1024) */
} dfm_audit_side_opts;

typedef struct {
    char factory[256];       /* factory string actually used */
    char why[600];           /* how it was chosen (and why it differs from the run's, if it does) */
    uint32_t dim, k;
    uint64_t keys, queries;
    uint64_t index_bytes;    /* serialised FAISS index (faiss_write_index) */
    uint64_t results;        /* valid (label >= 0) neighbours returned over all queries */
    double build_s;          /* generate keys, train, add */
    double search_s;         /* all queries (fastest of `repeats` passes, after one untimed warm-up search) */
    int repeats;             /* passes over the query set (more when one pass is short) */
    double s_per_query;
    double bytes_per_key;
} dfm_audit_side;

/* Deterministic key generator: key i is the unit vector drawn from seeds[i] (splitmix64 stream,
 * uniform in [-1, 1) per component, L2-normalised). Equal seeds give equal keys. */
void dfm_audit_key(uint64_t seed, uint32_t dim, float *out);

/* The index for n_keys keys of width dim: the given family when that many keys can train it (IVF with
 * keys/39 lists if need be), otherwise what `dfm index` would choose for this size ("auto" chooses as
 * dfm index does); the reason into why. DFM_EARG when nothing fits. */
int dfm_audit_plan(const char *index, uint32_t metric, uint32_t dim, uint64_t n_keys, dfm_index_plan *plan, char *why, size_t n_why);

/* Build the datastore from n_keys seeded keys, then run one query for each index in qidx (n_queries
 * of them, indexes into the keys) with top-k, timing both. The index follows o->index: "auto" is
 * chosen for n_keys like `dfm index` does; a factory string is used as given when the sample can
 * train it, else the automatic choice, with the reason in side->why. Errors: DFM_EARG (n_keys 0,
 * dim 0), DFM_ENOMEM, DFM_EFAISS. */
int dfm_audit_measure_side(const dfm_audit_side_opts *o, const uint64_t *seeds, uint64_t n_keys, const uint64_t *qidx,
                           uint64_t n_queries, dfm_audit_side *side);

/* ---- chart ------------------------------------------------------------------------------------ */

typedef struct {
    const char *label;       /* "queries", "items", ... */
    const char *unit;        /* shown after the numbers */
    double chunk, token;     /* values (> 0 to be drawn) */
    const char *less;        /* the word of a positive saving: NULL "fewer" (counts), "less" (times, bytes) */
} dfm_audit_bar;

#define DFM_AUDIT_CURVE 48 /* model samples per curve */

/* One side's growth in a panel: measured (x = corpus tokens, y) and the cost model sampled at m sizes (mx, my)
 * with its band (lo, hi). n 0 and m 0: not drawn. */
typedef struct {
    int n;
    double x[DFM_AUDIT_MAX_SIZES], y[DFM_AUDIT_MAX_SIZES];
    int m;
    double mx[DFM_AUDIT_CURVE], my[DFM_AUDIT_CURVE], lo[DFM_AUDIT_CURVE], hi[DFM_AUDIT_CURVE];
} dfm_audit_series;

typedef struct {
    const char *title, *unit;
    dfm_audit_series side[DFM_AUDIT_SIDES]; /* chunk level (the run's index), token level, chunk level (IVF-PQ) */
} dfm_audit_panel;

/* The x range the chart marks: [lo, hi] measured (the model is validated on its largest size), and beyond
 * `defensible` the model alone (its band widening). */
typedef struct {
    double measured_lo, measured_hi, defensible, x_hi;
} dfm_audit_range;

/* Write audit.svg atomically to path (audit_chart.c): the title and legend, n_panels growth panels side
 * by side (log-log; the measured range shaded, the defensible limit a dashed rule; measured points as dots,
 * the model as a line, solid over the measured range and dashed beyond, its band shaded), then the savings
 * bars (log10 scale, chunk- vs token-level bars per group, the saving in words), then note (NULL: none). The
 * canvas is sized from estimated text widths (dfm_audit_text_width) so every label lies inside it.
 * DFM_ENOMEM, DFM_EIO. */
int dfm_audit_write_chart(const char *path, const char *title, const dfm_audit_panel *panels, int n_panels, const dfm_audit_range *range,
                          const char *note, const dfm_audit_bar *bars, int n_bars);
/* The scale measurement's three panels (search, build, index bytes; audit_scale_report.c): measured points and the
 * cost model (dfm_audit_scale_extrapolate) sampled from the smallest measured size to x_hi, with the range. */
void dfm_audit_scale_panels(const dfm_audit_scale *s, double x_hi, dfm_audit_panel panels[3], dfm_audit_range *r);
/* The bars alone. */
int dfm_audit_write_svg(const char *path, const char *title, const dfm_audit_bar *bars, int n_bars);
/* Estimated width in pixels of UTF-8 text s at font size `size` in DejaVu Sans (bold: 1), rounded up per
 * character class; tests/integration/audit/audit_chart_check.py uses the same table. */
double dfm_audit_text_width(const char *s, double size, int bold);

/* ---- helpers --------------------------------------------------------------------------------------- */

/* "1.23 k", "4.56 M", "7.89 G" ... into buf (engineering prefixes, 3 significant digits). */
const char *dfm_audit_human(double v, char *buf, size_t n);
/* A duration in the unit that reads best ("12.3 ms", "4.5 h", "3.2 years"; "0" for s <= 0) into buf. */
const char *dfm_audit_secs(double s, char *buf, size_t n);
/* A size in bytes with binary prefixes ("512 B", "23.2 MiB") into buf. */
const char *dfm_audit_bytes(double v, char *buf, size_t n);

/* A saving (1 − chunk / token) in words that cannot contradict themselves: "51.596 % less" (less: the word for
 * a positive saving, "less" or "fewer"), "77.034 % more" for a negative one, "the same" for 0, "not measured"
 * for NAN; digits after the point. The caller says why when it is more. Into b. */
const char *dfm_audit_saving_words(double saving, int digits, const char *less, char *b, size_t n);

/* The stages an audit reads, in pipeline order: chunk, encode, index, retrieve, targets. */
#define DFM_AUDIT_N_STAGES 5
extern const char *const dfm_audit_stages[DFM_AUDIT_N_STAGES];

/* XXH3-128 of the stages' configs in manifest (keys sorted, compact JSON) as 32 hex digits into out.
 * DFM_ENOMEM. */
int dfm_audit_config_hash(json_t *manifest, char out[33]);

/* ---- the report (audit_report.c) and the comparison (audit_compare.c) --------------------------------
 * One process, no MPI: the audit reads a finished run. */

typedef struct {
    const char *run;     /* the run folder: chunk, index and retrieve complete */
    const char *out_dir; /* where audit.json, audit.md and audit.svg go */
    int64_t sample;      /* sequences to measure on (0: no measured part) */
    int64_t k_token;     /* neighbours per token-level query */
    int64_t key_dim;     /* token-level key width (the LM hidden size) */
    int64_t seed;        /* of the sample and of the keys */
    int64_t threads;     /* OpenMP threads for the measured searches (0: OpenMP's default) */
    double large;        /* the large corpus, in tokens, to extrapolate both pipelines to */
    /* the measurement at several sizes (audit_scale.h; measure_tokens 0: not run) */
    int64_t measure_tokens, measure_sizes, repeats, build_repeats, measure_queries, recall_queries, token_nprobe;
    const char *token_keys; /* a hidden-states file or "random" */
    int64_t lm_width;       /* the frozen LM's width, for the LM-state storage rows (0: none) */
} dfm_audit_config;

/* The report of cfg->run: count (the run's manifest, dfm_audit_count), measure (cfg->sample sequences,
 * dfm_audit_measure_side for both sides), extrapolate (to the corpus and to cfg->large tokens), render
 * (audit.json, audit.md, audit.svg written atomically; a summary on stdout). It holds the run lock of
 * cfg->run like a writing stage (common/runlock.h): DFM_ESTATE naming the holder while a stage writes the
 * run, and stages are refused while it runs. DFM_ESTATE when a needed stage is not complete; the errors
 * of the parts. */
int dfm_audit_run(const dfm_audit_config *cfg);

/* Reproducibility: the rank-independent counts of two runs' manifests are equal and, when both have
 * targets, every target record is byte-identical. Prints the result; DFM_EMISMATCH names the first
 * difference. */
int dfm_audit_compare(const char *run_a, const char *run_b);

#endif
