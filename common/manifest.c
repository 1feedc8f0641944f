#include "common/manifest.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/version.h"

#include <stdlib.h>
#include <string.h>

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
    if (json_object_set_new(json_object_get(m, "stages"), stage, obj) != 0)
        return DFM_FAIL(DFM_ENOMEM, "cannot set stage %s in manifest", stage);
    return DFM_OK;
}

void dfm_manifest_drop_later(json_t *m, const char *stage) {
    static const char *const order[] = {"chunk", "encode", "index", "retrieve", "targets", "audit", NULL};
    json_t *stages = json_object_get(m, "stages");
    int after = 0;
    for (int i = 0; order[i]; i++) {
        if (after) json_object_del(stages, order[i]);
        if (!strcmp(order[i], stage)) after = 1;
    }
}

int dfm_manifest_require_complete(json_t *m, const char *stage, const char *run_dir) {
    json_t *s = dfm_manifest_stage(m, stage);
    const char *state = json_string_value(json_object_get(s, "state"));
    if (!s)
        return DFM_FAIL(DFM_ESTATE, "run %s has no '%s' stage. HINT: run 'dfm %s' on it first", run_dir, stage, stage);
    if (!state || strcmp(state, "complete") != 0)
        return DFM_FAIL(DFM_ESTATE, "stage '%s' of run %s is '%s', not complete. HINT: re-run 'dfm %s' to finish it",
                        stage, run_dir, state ? state : "?", stage);
    return DFM_OK;
}

long long dfm_manifest_count(json_t *m, const char *stage, const char *count) {
    json_t *v = json_object_get(json_object_get(dfm_manifest_stage(m, stage), "counts"), count);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}
