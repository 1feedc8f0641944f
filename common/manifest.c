#include "common/manifest.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/runlock.h"
#include "common/version.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* the pipeline's stages in order; each writes only under RUN/<stage> */
static const char *const stage_order[] = {"chunk", "encode", "index", "retrieve", "targets", "audit", NULL};

int dfm_manifest_load(const char *run_dir, int create, json_t **out) {
    *out = NULL;
    char *path = dfm_path_join(run_dir, "manifest.json");
    if (!path) return DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!dfm_path_exists(path)) {
        int rc = DFM_OK;
        if (!create) {
            rc = DFM_FAIL(DFM_ENOTFOUND, "%s does not exist. HINT: is %s a dfm run directory? run 'dfm chunk' first",
                          path, run_dir);
        } else {
            *out = json_pack("{s:s, s:i, s:s, s:{}}", "format", "dfm-manifest", "version", DFM_MANIFEST_VERSION,
                             "dfm_version", DFM_VERSION, "stages");
            if (!*out) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        }
        free(path);
        return rc;
    }
    json_error_t e;
    json_t *m = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    int rc = DFM_OK;
    if (!m) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s line %d: %s. HINT: the manifest is damaged; restore it or start a new run directory",
                      path, e.line, e.text);
    } else if (!json_is_object(m) || strcmp(json_string_value(json_object_get(m, "format")) ?: "", "dfm-manifest") != 0 ||
               !json_is_object(json_object_get(m, "stages"))) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s is not a dfm manifest (no \"format\": \"dfm-manifest\" or no \"stages\")", path);
    } else if (json_integer_value(json_object_get(m, "version")) != DFM_MANIFEST_VERSION) {
        rc = DFM_FAIL(DFM_EVERSION, "%s has manifest version %lld; this dfm reads version %d. HINT: use the dfm that wrote it",
                      path, (long long)json_integer_value(json_object_get(m, "version")), DFM_MANIFEST_VERSION);
    }
    if (rc) json_decref(m);
    else *out = m;
    free(path);
    return rc;
}

/* A new generation id: 16 hex digits from the time in ns, the host, the process and a counter: unique per
 * completion of a stage, so readers tell a rebuilt stage from the one they opened even when its bytes
 * are the same. */
static void new_generation(const char *stage, char out[17]) {
    static unsigned counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char buf[512];
    int n = snprintf(buf, sizeof buf, "%lld.%09ld %s %ld %u %s", (long long)ts.tv_sec, ts.tv_nsec, host, (long)getpid(),
                     counter++, stage);
    snprintf(out, 17, "%016llx", (unsigned long long)dfm_checksum64(buf, n > 0 ? (size_t)n : 0));
}

int dfm_manifest_save(const char *run_dir, json_t *m) {
    char *text = json_dumps(m, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    char *path = dfm_path_join(run_dir, "manifest.json");
    int rc;
    if (!text || !path) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    else {
        char *withnl = dfm_strdupf("%s\n", text);
        rc = withnl ? dfm_write_file_atomic(path, withnl, strlen(withnl)) : DFM_FAIL(DFM_ENOMEM, "no memory");
        free(withnl);
    }
    free(text);
    free(path);
    return rc;
}

json_t *dfm_manifest_stage(json_t *m, const char *stage) {
    return json_object_get(json_object_get(m, "stages"), stage);
}

int dfm_manifest_set_stage(json_t *m, const char *stage, json_t *obj) {
    /* the stage's generation (given by dfm_stage_begin) stays when its object is replaced at completion */
    json_t *gen = json_object_get(dfm_manifest_stage(m, stage), "generation");
    if (obj && gen && !json_object_get(obj, "generation")) json_object_set(obj, "generation", gen);
    if (json_object_set_new(json_object_get(m, "stages"), stage, obj) != 0)
        return DFM_FAIL(DFM_ENOMEM, "cannot set stage %s in manifest", stage);
    return DFM_OK;
}

void dfm_manifest_drop_later(json_t *m, const char *stage) {
    json_t *stages = json_object_get(m, "stages");
    int after = 0;
    for (int i = 0; stage_order[i]; i++) {
        if (after) json_object_del(stages, stage_order[i]);
        if (!strcmp(stage_order[i], stage)) after = 1;
    }
}

const char *dfm_stage_command(const char *stage) { return !strcmp(stage, "targets") ? "write-targets" : stage; }

int dfm_manifest_require_complete(json_t *m, const char *stage, const char *run_dir) {
    json_t *s = dfm_manifest_stage(m, stage);
    const char *state = json_string_value(json_object_get(s, "state"));
    if (!s)
        return DFM_FAIL(DFM_ESTATE, "run %s has no '%s' stage. HINT: run 'dfm %s' on it first", run_dir, stage,
                        dfm_stage_command(stage));
    if (!state || strcmp(state, "complete") != 0)
        return DFM_FAIL(DFM_ESTATE, "stage '%s' of run %s is '%s', not complete. HINT: re-run 'dfm %s' to finish it",
                        stage, run_dir, state ? state : "?", dfm_stage_command(stage));
    return DFM_OK;
}

const char *dfm_manifest_generation(json_t *m, const char *stage) {
    const char *g = json_string_value(json_object_get(dfm_manifest_stage(m, stage), "generation"));
    return g ? g : "";
}

int dfm_manifest_require_readable(json_t *m, const char *stage, const char *run_dir) {
    json_t *s = dfm_manifest_stage(m, stage);
    const char *state = json_string_value(json_object_get(s, "state"));
    if (s && state && !strcmp(state, "complete")) return DFM_OK;
    char holder[1024];
    if (dfm_runlock_holder(run_dir, holder, sizeof holder))
        return DFM_FAIL(DFM_ESTATE, "the '%s' stage of run %s is being rebuilt by %s. HINT: open it again when that "
                        "finishes (a reader keeps the generation it opened; it never reads one being written)",
                        stage, run_dir, holder);
    return dfm_manifest_require_complete(m, stage, run_dir);
}

int dfm_manifest_read_generation(const char *run_dir, const char *stage, char gen[17]) {
    json_t *m = NULL;
    gen[0] = 0;
    int rc = dfm_manifest_load(run_dir, 0, &m);
    if (!rc) snprintf(gen, 17, "%s", dfm_manifest_generation(m, stage));
    if (!rc) rc = dfm_manifest_require_readable(m, stage, run_dir);
    json_decref(m);
    return rc;
}

long long dfm_manifest_count(json_t *m, const char *stage, const char *count) {
    json_t *v = json_object_get(json_object_get(dfm_manifest_stage(m, stage), "counts"), count);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

/* ---- the stage contract (manifest.h) ---- */

/* nftw callbacks: remove everything (rm -r), or only the temporaries "NAME.tmp.PID" */
static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

static int is_temporary(const char *name) {
    const char *t = strstr(name, ".tmp.");
    while (t && strstr(t + 1, ".tmp.")) t = strstr(t + 1, ".tmp.");
    if (!t || !t[5]) return 0;
    for (const char *p = t + 5; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

static int rm_temporary(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    if (!is_temporary(path + ftw->base)) return 0;
    if (flag == FTW_DP) { /* a temporary folder: its contents were visited first */
        if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) return -1;
    } else if (remove(path) != 0 && errno != ENOENT) {
        return -1;
    }
    (void)sb;
    DFM_LOG_I("removed %s (a temporary of a writer that died)", path);
    return 0;
}

/* rm -r RUN/name (absent: nothing to do) */
static int remove_tree(const char *run_dir, const char *name) {
    char *p = dfm_path_join(run_dir, name);
    if (!p) return DFM_FAIL(DFM_ENOMEM, "no memory");
    int rc = DFM_OK;
    if (dfm_path_exists(p) && nftw(p, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        rc = DFM_FAIL(DFM_EIO, "cannot remove %s: %s. HINT: check the permissions of the run directory", p, strerror(errno));
    free(p);
    return rc;
}

/* the temporaries of dead writers under RUN/name, and beside the manifest in RUN itself */
static int remove_temporaries(const char *run_dir, const char *name) {
    char *p = dfm_path_join(run_dir, name);
    if (!p) return DFM_FAIL(DFM_ENOMEM, "no memory");
    int rc = DFM_OK;
    if (dfm_path_exists(p) && nftw(p, rm_temporary, 16, FTW_DEPTH | FTW_PHYS) != 0)
        rc = DFM_FAIL(DFM_EIO, "cannot remove a temporary under %s: %s", p, strerror(errno));
    free(p);
    DIR *dp = rc ? NULL : opendir(run_dir);
    for (struct dirent *e; dp && !rc && (e = readdir(dp));) {
        if (e->d_type == DT_DIR || !is_temporary(e->d_name)) continue;
        char *f = dfm_path_join(run_dir, e->d_name);
        if (!f || (remove(f) != 0 && errno != ENOENT)) rc = DFM_FAIL(DFM_EIO, "cannot remove %s: %s", f ? f : run_dir, strerror(errno));
        else DFM_LOG_I("removed %s (a temporary of a writer that died)", f);
        free(f);
    }
    if (dp) closedir(dp);
    return rc;
}

/* "config key 'k': 16 then, 8 now" for the first key that differs, or "the input files" */
static char *describe_change(json_t *old, const dfm_stage_spec *s) {
    json_t *oc = json_object_get(old, "config"), *nc = s->config;
    const char *k;
    json_t *v;
    for (int pass = 0; pass < 2; pass++) {
        json_object_foreach(pass ? oc : nc, k, v) {
            json_t *a = json_object_get(oc, k), *b = json_object_get(nc, k);
            if (a && b && json_equal(a, b)) continue;
            char *as = a ? json_dumps(a, JSON_ENCODE_ANY | JSON_COMPACT) : NULL, *bs = b ? json_dumps(b, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            char *d = dfm_strdupf("'%s' was %s, now %s", k, as ? as : "unset", bs ? bs : "unset");
            free(as);
            free(bs);
            return d;
        }
    }
    if (!json_is_object(oc) || !json_is_object(nc)) return dfm_strdupf("the configuration");
    return dfm_strdupf("the input files");
}

/* a complete stage's files: every "outputs" file exists and the stage's own check passes */
static int outputs_intact(json_t *old, const char *run_dir, const dfm_stage_spec *s) {
    size_t i;
    json_t *o;
    json_array_foreach(json_object_get(old, "outputs"), i, o) {
        const char *f = json_string_value(json_object_get(o, "file"));
        char *p = f ? dfm_path_join(run_dir, f) : NULL;
        int there = p && dfm_path_exists(p);
        if (!there) DFM_LOG_W("%s stage of %s is recorded complete, but %s is missing: redoing what is missing", s->stage,
                              run_dir, p ? p : "an output");
        int whole = there && (!s->file_ok || s->file_ok(p) == DFM_OK);
        if (there && !whole) {
            DFM_LOG_W("%s stage of %s is recorded complete, but a file is damaged (%s): redoing it", s->stage, run_dir,
                      dfm_last_error());
            dfm_error_clear();
        }
        free(p);
        if (!whole) return 0;
    }
    if (s->intact && !s->intact(s->intact_ctx, run_dir)) {
        DFM_LOG_W("%s stage of %s is recorded complete, but its files are not whole: redoing what is missing", s->stage, run_dir);
        return 0;
    }
    return 1;
}

int dfm_stage_begin(json_t *m, const char *run_dir, const dfm_stage_spec *s, dfm_stage_action *action) {
    *action = DFM_STAGE_FRESH;
    json_t *old = dfm_manifest_stage(m, s->stage);
    const char *state = json_string_value(json_object_get(old, "state"));
    if (old && !s->force) {
        int same = json_equal(json_object_get(old, "config"), s->config) &&
                   (!s->inputs || json_equal(json_object_get(old, "inputs"), s->inputs));
        if (!same) {
            char *what = describe_change(old, s);
            int rc = DFM_FAIL(DFM_EMISMATCH, "stage '%s' of run %s was made with other inputs or options (%s). HINT: pass --force "
                              "to redo it (the stages after it are then removed), or use a new run directory",
                              s->stage, run_dir, what ? what : "?");
            free(what);
            return rc;
        }
        if (state && !strcmp(state, "complete") && outputs_intact(old, run_dir, s)) {
            *action = DFM_STAGE_SKIP;
            DFM_LOG_I("%s stage of %s is already complete with the same inputs and options; nothing to do (--force redoes it)",
                      s->stage, run_dir);
            return DFM_OK;
        }
        *action = DFM_STAGE_RESUME;
        if (!state || strcmp(state, "complete"))
            DFM_LOG_I("%s stage of %s was interrupted (state '%s'): resuming", s->stage, run_dir, state ? state : "?");
    }
    DFM_TRY(dfm_runlock_take(run_dir));
    /* manifest first, with this stage already "running": a crash after it leaves files no stage claims,
     * never a stage whose files are gone, and a reader opening now is told of the rebuild rather than
     * finding a "complete" stage with files missing */
    dfm_manifest_drop_later(m, s->stage);
    char gen[17];
    new_generation(s->stage, gen);
    json_t *st = json_pack("{s:s, s:s, s:i, s:O}", "state", "running", "generation", gen, "ranks", s->ranks, "config", s->config);
    if (!st) return DFM_FAIL(DFM_ENOMEM, "no memory");
    if (s->inputs) json_object_set(st, "inputs", s->inputs);
    DFM_TRY(dfm_manifest_set_stage(m, s->stage, st));
    DFM_TRY(dfm_manifest_save(run_dir, m));
    int after = 0;
    for (int i = 0; stage_order[i]; i++) {
        if (after) DFM_TRY(remove_tree(run_dir, stage_order[i]));
        if (!strcmp(stage_order[i], s->stage)) after = 1;
    }
    if (*action == DFM_STAGE_FRESH) DFM_TRY(remove_tree(run_dir, s->stage));
    char *own = dfm_path_join(run_dir, s->stage);
    int rc = own ? dfm_mkdir_p(own) : DFM_FAIL(DFM_ENOMEM, "no memory");
    free(own);
    if (!rc) rc = remove_temporaries(run_dir, s->stage);
    return rc;
}
