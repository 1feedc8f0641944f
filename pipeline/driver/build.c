/* build.c — `dfm build`: the stages from one config (see build.h). */
#include "pipeline/driver/build.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/runlock.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DFM_COMMAND(name, fn, summary) int fn(int argc, char **argv);
#include "pipeline/commands.def"
#undef DFM_COMMAND

typedef struct {
    const char *name;
    int (*fn)(int, char **);
} stage_fn;

static const stage_fn all_stages[] = {
    {"chunk", dfm_cmd_chunk},
    {"encode", dfm_cmd_encode},
    {"index", dfm_cmd_index},
    {"retrieve", dfm_cmd_retrieve},
    {"write-targets", dfm_cmd_write_targets},
};
#define N_STAGES ((int)(sizeof all_stages / sizeof all_stages[0]))

static int wanted(const char *list, const char *name) {
    if (!list || !*list) return 1;
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return 1;
    return 0;
}

static double num(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : -1;
}

/* the count a stage is measured by, and its unit */
static void stage_items(json_t *counts, const char *stage, double *items, const char **unit) {
    static const struct { const char *stage, *key, *unit; } map[] = {
        {"chunk", "tokens", "tokens"},       {"encode", "chunks", "chunks"},     {"index", "vectors", "vectors"},
        {"retrieve", "queries", "queries"},  {"targets", "records", "records"},
    };
    *items = -1;
    *unit = "";
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].stage, stage)) {
            *items = num(counts, map[i].key);
            *unit = map[i].unit;
        }
    if (*items < 0) { /* first integer count of the stage */
        const char *k;
        json_t *v;
        json_object_foreach(counts, k, v) if (json_is_integer(v)) {
            *items = (double)json_integer_value(v);
            *unit = k;
            break;
        }
    }
}

static void print_summary(json_t *man, const char *run) {
    printf("\n%-14s %-9s %10s %14s %-9s %14s %12s\n", "stage", "state", "time (s)", "items", "unit", "items/s", "bytes");
    json_t *stages = json_object_get(man, "stages");
    const char *name;
    json_t *st;
    double total = 0;
    json_object_foreach(stages, name, st) {
        json_t *counts = json_object_get(st, "counts"), *tim = json_object_get(st, "timings");
        double t = num(tim, "total_s"), items;
        const char *unit;
        stage_items(counts, name, &items, &unit);
        double bytes = -1;
        const char *bk[] = {"bytes_written", "bytes", "compressed_bytes", "bytes_read"};
        for (size_t i = 0; i < 4 && bytes < 0; i++) bytes = num(counts, bk[i]);
        char ts[32] = "-", is[32] = "-", rs[32] = "-", bs[32] = "-";
        if (t >= 0) snprintf(ts, sizeof ts, "%.2f", t), total += t;
        if (items >= 0) snprintf(is, sizeof is, "%.0f", items);
        if (items >= 0 && t > 0) snprintf(rs, sizeof rs, "%.0f", items / t);
        if (bytes >= 0) snprintf(bs, sizeof bs, "%.0f", bytes);
        printf("%-14s %-9s %10s %14s %-9s %14s %12s\n", name, json_string_value(json_object_get(st, "state")) ?: "?", ts, is,
               unit, rs, bs);
    }
    printf("%-14s %-9s %10.2f\n\noutputs: %s (manifest: %s/manifest.json)\n", "total", "", total, run, run);
}

/* rank 0: a copy of the manifest's object for stage (NULL: none or no manifest) */
static json_t *stage_copy(const char *run, const char *stage) {
    json_t *man = NULL, *st = NULL;
    if (dfm_manifest_load(run, 0, &man) == DFM_OK) st = json_deep_copy(dfm_manifest_stage(man, stage));
    json_decref(man);
    return st;
}

/* The stages in order, each called as `dfm STAGE RUN [INPUTS] --config CONFIG [--force]`; agreed.
 * Rank 0 logs each stage's wall time in this build and whether it did anything ("skipped": its
 * manifest entry is unchanged). */
static int run_stages(const dfm_mpi *m, const dfm_build_config *o, const char *run, char **inputs, int n_inputs, int query_only) {
    const char *stages = o->stages;
    char *config = (char *)o->config;
    int force = o->force, rc = DFM_OK;
    dfm_mpi_hold(1);
    for (int s = 0; !rc && s < N_STAGES; s++) {
        if (!wanted(stages, all_stages[s].name)) continue;
        if (query_only && !strcmp(all_stages[s].name, "index")) { /* retrieve searches the datastore's index */
            if (m->rank == 0) DFM_LOG_I("build: no index stage: a query-only run (\"retrieve\": {\"datastore\": ...}) searches its datastore's");
            continue;
        }
        if (m->rank == 0) DFM_LOG_I("build: stage %s", all_stages[s].name);
        char *av[512];
        int ac = 0;
        av[ac++] = (char *)all_stages[s].name;
        av[ac++] = (char *)run;
        if (s == 0) {
            if (n_inputs == 0) rc = DFM_FAIL(DFM_EARG, "config %s has no \"inputs\" for the chunk stage", config);
            for (int i = 0; i < n_inputs && ac < 500; i++) av[ac++] = inputs[i];
        }
        av[ac++] = "--config";
        av[ac++] = config;
        if (force) av[ac++] = "--force";
        av[ac] = NULL;
        const char *key = !strcmp(all_stages[s].name, "write-targets") ? "targets" : all_stages[s].name;
        json_t *before = m->rank == 0 && !rc ? stage_copy(run, key) : NULL;
        double t0 = dfm_now();
        if (!rc) rc = all_stages[s].fn(ac, av);
        if (!rc && m->rank == 0) {
            json_t *after = stage_copy(run, key);
            int same = before && after && json_equal(before, after);
            DFM_LOG_I("build: stage %s %s in %.3fs", all_stages[s].name, same ? "skipped" : "ran", dfm_now() - t0);
            json_decref(after);
        }
        json_decref(before);
        if (rc) dfm_error_prefix("dfm build, stage %s", all_stages[s].name);
        rc = dfm_mpi_agree(m, rc);
    }
    dfm_mpi_hold(0);
    return rc;
}

/* The config as JSON, the run directory (--run or its "run") and the --stages names checked; on failure
 * everything is freed and an error set. */
static int load_config(const dfm_build_config *o, json_t **cfg_out, char **run_out) {
    const char *config = o->config;
    char *run = o->run ? strdup(o->run) : NULL;
    int rc = DFM_OK;
    json_error_t e;
    json_t *cfg = json_load_file(config, JSON_REJECT_DUPLICATES, &e);
    if (!cfg) rc = DFM_FAIL(DFM_EARG, "config %s, line %d: %s", config, e.line, e.text);
    else if (!json_is_object(cfg)) rc = DFM_FAIL(DFM_EARG, "config %s must hold a JSON object", config);
    if (!rc && !run) {
        const char *r = json_string_value(json_object_get(cfg, "run"));
        if (r) run = strdup(r);
        else rc = DFM_FAIL(DFM_EARG, "no run directory: put \"run\" in %s or pass --run DIR", config);
    }
    if (!rc && o->stages) { /* unknown stage names are typos */
        char *copy = strdup(o->stages), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
            int known = 0;
            for (int k = 0; k < N_STAGES; k++) known |= !strcmp(t, all_stages[k].name);
            if (!known) rc = DFM_FAIL(DFM_EARG, "--stages: unknown stage '%s' (stages: chunk,encode,index,retrieve,write-targets)", t);
        }
        free(copy);
    }
    if (rc) {
        json_decref(cfg);
        free(run);
        cfg = NULL, run = NULL;
    }
    *cfg_out = cfg;
    *run_out = run;
    return rc;
}

static int is_query_only(json_t *cfg) { return json_object_get(json_object_get(cfg, "retrieve"), "datastore") != NULL; }

int dfm_build_check(const dfm_build_config *o) {
    json_t *cfg = NULL, *man = NULL;
    char *run = NULL;
    int rc = load_config(o, &cfg, &run);
    if (!rc) rc = dfm_manifest_load(run, 0, &man);
    for (int s = 0; !rc && s < N_STAGES; s++) {
        const char *name = all_stages[s].name;
        if (!wanted(o->stages, name) || (is_query_only(cfg) && !strcmp(name, "index"))) continue;
        rc = dfm_manifest_require_complete(man, !strcmp(name, "write-targets") ? "targets" : name, run);
        if (!rc) printf("build --check: stage %s complete in %s\n", name, run);
    }
    json_decref(man);
    json_decref(cfg);
    free(run);
    return rc;
}

int dfm_build_run(const dfm_mpi *m, const dfm_build_config *o) {
    char *run = NULL;
    json_t *cfg = NULL, *man = NULL;
    char **inputs = NULL;
    int n_inputs = 0;
    int rc = load_config(o, &cfg, &run);
    if (!rc) {
        json_t *in = json_object_get(cfg, "inputs");
        if (json_is_string(in)) in = json_pack("[O]", in);
        else json_incref(in);
        n_inputs = (int)json_array_size(in);
        inputs = calloc((size_t)n_inputs + 1, sizeof *inputs);
        for (int i = 0; inputs && i < n_inputs; i++) inputs[i] = strdup(json_string_value(json_array_get(in, (size_t)i)) ?: "");
        json_decref(in);
        if (!inputs) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    /* one writer per run: the lock before the first stage, held until this process ends */
    if (!rc && m->rank == 0) rc = dfm_runlock_take(run);
    rc = dfm_mpi_agree(m, rc);
    double t0 = dfm_now();
    if (!rc) rc = run_stages(m, o, run, inputs, n_inputs, is_query_only(cfg));
    if (!rc && m->rank == 0) {
        rc = dfm_manifest_load(run, 0, &man);
        if (!rc) {
            print_summary(man, run);
            printf("build finished in %.1fs on %d rank%s\n", dfm_now() - t0, m->size, m->size > 1 ? "s" : "");
        }
    }
    json_decref(man);
    json_decref(cfg);
    for (int i = 0; inputs && i < n_inputs; i++) free(inputs[i]);
    free(inputs);
    free(run);
    return rc;
}
