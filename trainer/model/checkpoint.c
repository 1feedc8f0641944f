/* checkpoint.c — see checkpoint.h. */
#include "trainer/model/checkpoint.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"

#define CK_MAGIC "DFMCKPT1"
#define CK_HEADER 64

int ckpt_save(const char *path, const CkptInfo *info, json_t *config, const float *params, const float *m,
              const float *v) {
    char *js = json_dumps(config, JSON_COMPACT | JSON_SORT_KEYS);
    if (!js) return DFM_FAIL(DFM_ENOMEM, "checkpoint config");
    size_t jn = strlen(js), pn = info->n_params * sizeof(float);
    size_t body = jn + 3 * pn;
    uint8_t *buf = malloc(CK_HEADER + body);
    if (!buf) {
        free(js);
        return DFM_FAIL(DFM_ENOMEM, "checkpoint of %zu bytes", body);
    }
    memset(buf, 0, CK_HEADER);
    uint8_t *p = buf + CK_HEADER;
    memcpy(p, js, jn);
    memcpy(p + jn, params, pn);
    memcpy(p + jn + pn, m, pn);
    memcpy(p + jn + 2 * pn, v, pn);
    uint32_t ver = 1, mode = info->mode, jb = (uint32_t)jn;
    uint64_t n = info->n_params, ck = dfm_checksum64(p, body);
    memcpy(buf, CK_MAGIC, 8);
    memcpy(buf + 8, &ver, 4);
    memcpy(buf + 12, &mode, 4);
    memcpy(buf + 16, &n, 8);
    memcpy(buf + 24, &info->step, 8);
    memcpy(buf + 32, &info->epoch, 8);
    memcpy(buf + 40, &info->pos, 8);
    memcpy(buf + 48, &jb, 4);
    memcpy(buf + 56, &ck, 8);
    int rc = dfm_write_file_atomic(path, buf, CK_HEADER + body);
    free(buf);
    free(js);
    return rc;
}

static int read_header(const char *path, const uint8_t *buf, size_t len, CkptInfo *info, uint32_t *jb) {
    if (len < CK_HEADER || memcmp(buf, CK_MAGIC, 8))
        return DFM_FAIL(DFM_EFORMAT, "%s is not a dfm-train checkpoint (magic %s)", path, CK_MAGIC);
    uint32_t ver;
    uint64_t n;
    memcpy(&ver, buf + 8, 4);
    if (ver != 1) return DFM_FAIL(DFM_EVERSION, "%s: checkpoint version %u (1 known)", path, ver);
    memcpy(&info->mode, buf + 12, 4);
    memcpy(&n, buf + 16, 8);
    memcpy(&info->step, buf + 24, 8);
    memcpy(&info->epoch, buf + 32, 8);
    memcpy(&info->pos, buf + 40, 8);
    memcpy(jb, buf + 48, 4);
    info->n_params = n;
    if ((uint64_t)len != CK_HEADER + *jb + 3 * n * sizeof(float))
        return DFM_FAIL(DFM_ETRUNCATED, "%s: %zu bytes, header says %llu", path, len,
                        (unsigned long long)(CK_HEADER + *jb + 3 * n * sizeof(float)));
    uint64_t ck;
    memcpy(&ck, buf + 56, 8);
    if (dfm_checksum64(buf + CK_HEADER, len - CK_HEADER) != ck)
        return DFM_FAIL(DFM_ECHECKSUM, "%s: checkpoint checksum mismatch (file corrupt)", path);
    return DFM_OK;
}

static int load_common(const char *path, CkptInfo *info, json_t **config, float *params, float *m, float *v,
                       size_t n_params, int want_data) {
    char *raw;
    size_t len;
    DFM_TRY(dfm_read_file(path, &raw, &len));
    const uint8_t *buf = (const uint8_t *)raw;
    uint32_t jb = 0;
    int rc = read_header(path, buf, len, info, &jb);
    if (!rc && config) {
        json_error_t e;
        *config = json_loadb((const char *)buf + CK_HEADER, jb, 0, &e);
        if (!*config) rc = DFM_FAIL(DFM_EFORMAT, "%s: bad config JSON: %s", path, e.text);
    }
    if (!rc && want_data) {
        if (info->n_params != n_params)
            rc = DFM_FAIL(DFM_EMISMATCH, "%s holds %zu parameters, the model has %zu. HINT: same model flags as "
                          "the run that wrote it", path, info->n_params, n_params);
        else {
            size_t pn = n_params * sizeof(float);
            const uint8_t *p = buf + CK_HEADER + jb;
            memcpy(params, p, pn);
            memcpy(m, p + pn, pn);
            memcpy(v, p + 2 * pn, pn);
        }
    }
    free(raw);
    return rc;
}

int ckpt_load(const char *path, CkptInfo *info, json_t **config, float *params, float *m, float *v,
              size_t n_params) {
    return load_common(path, info, config, params, m, v, n_params, 1);
}

int ckpt_peek(const char *path, CkptInfo *info, json_t **config) {
    return load_common(path, info, config, NULL, NULL, NULL, 0, 0);
}

int ckpt_newest(const char *dir, uint64_t below_step, char **path, CkptInfo *info) {
    *path = NULL;
    DIR *d = opendir(dir);
    if (!d) return DFM_OK;
    uint64_t best = 0;
    for (struct dirent *e; (e = readdir(d));) {
        unsigned long long step = 0;
        int n = 0;
        int named = !strcmp(e->d_name, "ckpt_final.bin") ||
                    (sscanf(e->d_name, "ckpt_%llu.bin%n", &step, &n) == 1 && e->d_name[n] == 0);
        char *p = named ? dfm_path_join(dir, e->d_name) : NULL;
        CkptInfo ci;
        if (p && ckpt_peek(p, &ci, NULL) == DFM_OK && (!below_step || ci.step < below_step) && (!*path || ci.step > best)) {
            free(*path);
            *path = p, best = ci.step, *info = ci;
        } else {
            free(p);
        }
    }
    closedir(d);
    dfm_error_clear(); /* a damaged or foreign file is simply not a candidate */
    return DFM_OK;
}
