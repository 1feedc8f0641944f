/* safetensors.c — see safetensors.h and safetensors.md. */
#include "schemas/safetensors.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
    const char *name;
    size_t size;
} st_dtypes[DFM_ST_NDTYPES] = {
    [DFM_ST_F32] = {"F32", 4},     [DFM_ST_F16] = {"F16", 2},        [DFM_ST_BF16] = {"BF16", 2},
    [DFM_ST_F64] = {"F64", 8},     [DFM_ST_I64] = {"I64", 8},        [DFM_ST_I32] = {"I32", 4},
    [DFM_ST_I16] = {"I16", 2},     [DFM_ST_I8] = {"I8", 1},          [DFM_ST_U64] = {"U64", 8},
    [DFM_ST_U32] = {"U32", 4},     [DFM_ST_U16] = {"U16", 2},        [DFM_ST_U8] = {"U8", 1},
    [DFM_ST_BOOL] = {"BOOL", 1},   [DFM_ST_F8_E4M3] = {"F8_E4M3", 1}, [DFM_ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *dfm_st_dtype_name(int dtype) {
    return (dtype >= 0 && dtype < DFM_ST_NDTYPES) ? st_dtypes[dtype].name : "?";
}
size_t dfm_st_dtype_size(int dtype) {
    return (dtype >= 0 && dtype < DFM_ST_NDTYPES) ? st_dtypes[dtype].size : 0;
}
int dfm_st_dtype_parse(const char *name) {
    for (int i = 0; i < DFM_ST_NDTYPES; i++)
        if (!strcmp(st_dtypes[i].name, name)) return i;
    return -1;
}

/* ---- reading ----------------------------------------------------------------------------------- */
static int cmp_name(const void *a, const void *b) {
    return strcmp(((const dfm_st_tensor *)a)->name, ((const dfm_st_tensor *)b)->name);
}
static int cmp_offset_idx(const void *a, const void *b, void *ctx) {
    const dfm_st_tensor *t = ctx;
    const dfm_st_tensor *x = &t[*(const int *)a], *y = &t[*(const int *)b];
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

typedef struct {
    dfm_safetensors st;
    json_t *root;
} st_impl;

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = 0;
    n += snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static int parse_entry(dfm_safetensors *st, const char *name, json_t *v, dfm_st_tensor *t) {
    const char *path = st->path;
    if (!json_is_object(v))
        return DFM_FAIL(DFM_EFORMAT, "%s: header entry \"%s\" is not an object", path, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return DFM_FAIL(DFM_EFORMAT, "%s: tensor \"%s\" has no string \"dtype\"", path, name);
    t->dtype = dfm_st_dtype_parse(json_string_value(jd));
    if (t->dtype < 0)
        return DFM_FAIL(DFM_EFORMAT, "%s: tensor \"%s\" has unknown dtype \"%s\"", path, name, json_string_value(jd));
    if (!json_is_array(js) || json_array_size(js) > DFM_ST_MAX_DIMS)
        return DFM_FAIL(DFM_EFORMAT, "%s: tensor \"%s\": \"shape\" must be an array of at most %d sizes", path, name,
                        DFM_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    unsigned __int128 numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return DFM_FAIL(DFM_EFORMAT, "%s: tensor \"%s\": shape[%d] is not a non-negative integer", path, name, i);
        t->shape[i] = json_integer_value(d);
        numel *= (uint64_t)t->shape[i];
        if (numel > ((unsigned __int128)1 << 62))
            return DFM_FAIL(DFM_EFORMAT, "%s: tensor \"%s\": shape is impossibly large", path, name);
    }
    t->numel = (uint64_t)numel;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return DFM_FAIL(DFM_EFORMAT, "%s: tensor \"%s\": \"data_offsets\" must be [begin, end]", path, name);
    json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b)
        return DFM_FAIL(DFM_EFORMAT, "%s: tensor \"%s\": data_offsets [%lld, %lld] are not 0 <= begin <= end", path,
                        name, (long long)b, (long long)e);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    if ((uint64_t)e > st->data_bytes)
        return DFM_FAIL(DFM_EFORMAT,
                        "%s: tensor \"%s\": data_offsets end %llu is beyond the data buffer (%llu bytes). HINT: the "
                        "file is truncated or corrupt; fetch it again",
                        path, name, (unsigned long long)e, (unsigned long long)st->data_bytes);
    /* numel may be up to 2^62 and the dtype 8 bytes: the product is taken in 128 bits so that a huge shape
     * claiming a few bytes of storage cannot wrap around to match them */
    unsigned __int128 want = (unsigned __int128)t->numel * dfm_st_dtype_size(t->dtype);
    if ((unsigned __int128)(t->end - t->begin) != want) {
        char sh[256];
        shape_str(sh, sizeof sh, t->ndim, t->shape);
        return DFM_FAIL(DFM_EFORMAT, "%s: tensor \"%s\": %llu bytes in data_offsets but dtype %s shape %s needs %llu",
                        path, name, (unsigned long long)(t->end - t->begin), dfm_st_dtype_name(t->dtype), sh,
                        want > UINT64_MAX ? UINT64_MAX : (unsigned long long)want);
    }
    t->data = st->data + t->begin;
    t->file = st;
    return DFM_OK;
}

static int st_validate(st_impl *im) {
    dfm_safetensors *st = &im->st;
    const char *path = st->path;
    if (st->map_bytes < 8)
        return DFM_FAIL(DFM_ETRUNCATED, "%s: %zu bytes, shorter than the 8-byte header size. HINT: the file is "
                        "truncated; fetch it again", path, st->map_bytes);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | st->map[i];
    if (n > DFM_ST_MAX_HEADER)
        return DFM_FAIL(DFM_ERANGE, "%s: header size %llu is over the %llu-byte bound; not a safetensors file?", path,
                        (unsigned long long)n, (unsigned long long)DFM_ST_MAX_HEADER);
    if (n < 2)
        return DFM_FAIL(DFM_EFORMAT, "%s: header size %llu is too small for a JSON object", path, (unsigned long long)n);
    if (8 + n > st->map_bytes)
        return DFM_FAIL(DFM_ETRUNCATED, "%s: header says %llu bytes of JSON but the file has only %zu bytes after the "
                        "size. HINT: the file is truncated; fetch it again",
                        path, (unsigned long long)n, st->map_bytes - 8);
    st->header_bytes = n;
    st->data = st->map + 8 + n;
    st->data_bytes = st->map_bytes - 8 - n;
    if (st->map[8] != '{')
        return DFM_FAIL(DFM_EFORMAT, "%s: header does not start with '{'", path);
    json_error_t jerr;
    im->root = json_loadb((const char *)st->map + 8, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!im->root)
        return DFM_FAIL(DFM_EFORMAT, "%s: header JSON is invalid at byte %d: %s", path, jerr.position, jerr.text);
    if (!json_is_object(im->root)) return DFM_FAIL(DFM_EFORMAT, "%s: header JSON is not an object", path);
    size_t cap = json_object_size(im->root);
    st->tensors = calloc(cap ? cap : 1, sizeof *st->tensors);
    if (!st->tensors) return DFM_FAIL(DFM_ENOMEM, "%s: no memory for %zu tensor entries", path, cap);
    const char *key;
    json_t *v;
    json_object_foreach(im->root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) return DFM_FAIL(DFM_EFORMAT, "%s: \"__metadata__\" is not an object", path);
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv))
                    return DFM_FAIL(DFM_EFORMAT, "%s: \"__metadata__\".\"%s\" is not a string", path, mk);
            }
            st->metadata = v;
            continue;
        }
        dfm_st_tensor *t = &st->tensors[st->n_tensors];
        t->name = key;
        DFM_TRY(parse_entry(st, key, v, t));
        st->n_tensors++;
    }
    /* tiling: sorted by offset, each begins where the previous ended, the last ends at the buffer end */
    int *idx = malloc((st->n_tensors ? st->n_tensors : 1) * sizeof *idx);
    if (!idx) return DFM_FAIL(DFM_ENOMEM, "no memory");
    for (int i = 0; i < st->n_tensors; i++) idx[i] = i;
    qsort_r(idx, st->n_tensors, sizeof *idx, cmp_offset_idx, st->tensors);
    uint64_t pos = 0;
    int rc = DFM_OK;
    for (int i = 0; i < st->n_tensors && !rc; i++) {
        const dfm_st_tensor *t = &st->tensors[idx[i]];
        if (t->begin < pos)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: tensor \"%s\" [%llu, %llu) overlaps the previous tensor (ends at %llu)", path,
                          t->name, (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)pos);
        else if (t->begin > pos)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: gap in the data buffer before tensor \"%s\" (begins at %llu, previous ends "
                          "at %llu)", path, t->name, (unsigned long long)t->begin, (unsigned long long)pos);
        pos = t->end;
    }
    free(idx);
    DFM_TRY(rc);
    if (pos != st->data_bytes)
        return DFM_FAIL(DFM_EFORMAT, "%s: the tensors end at data byte %llu but the data buffer has %llu bytes. HINT: "
                        "the file is truncated, padded or corrupt",
                        path, (unsigned long long)pos, (unsigned long long)st->data_bytes);
    qsort(st->tensors, st->n_tensors, sizeof *st->tensors, cmp_name);
    return DFM_OK;
}

int dfm_safetensors_open(const char *path, dfm_safetensors **out) {
    *out = NULL;
    st_impl *im = calloc(1, sizeof *im);
    if (!im) return DFM_FAIL(DFM_ENOMEM, "no memory opening %s", path);
    dfm_safetensors *st = &im->st;
    st->path = strdup(path);
    if (!st->path) {
        free(im);
        return DFM_FAIL(DFM_ENOMEM, "no memory opening %s", path);
    }
    int rc = dfm_map_file(path, "HINT: check the model folder (run 'make deps' for the default model)", &st->map, &st->map_bytes);
    if (rc) {
        dfm_safetensors_close(st);
        return rc;
    }
    rc = st_validate(im);
    if (rc) {
        dfm_safetensors_close(st);
        return rc;
    }
    *out = st;
    return DFM_OK;
}

void dfm_safetensors_close(dfm_safetensors *st) {
    if (!st) return;
    st_impl *im = (st_impl *)st;
    dfm_unmap_file(st->map, st->map_bytes);
    json_decref(im->root);
    free(st->tensors);
    free(st->path);
    free(im);
}

const dfm_st_tensor *dfm_safetensors_find(const dfm_safetensors *st, const char *name) {
    dfm_st_tensor key = {.name = name};
    return bsearch(&key, st->tensors, st->n_tensors, sizeof key, cmp_name);
}

int dfm_safetensors_get(const dfm_safetensors *st, const char *name, int ndim, const int64_t *shape,
                        const dfm_st_tensor **out) {
    *out = NULL;
    const dfm_st_tensor *t = dfm_safetensors_find(st, name);
    if (!t)
        return DFM_FAIL(DFM_ENOTFOUND, "%s: no tensor \"%s\" (the file has %d tensors). HINT: is this the right "
                        "model for its config.json?", st->path, name, st->n_tensors);
    if (ndim >= 0) {
        int ok = t->ndim == ndim;
        for (int i = 0; ok && i < ndim; i++)
            if (shape[i] >= 0 && shape[i] != t->shape[i]) ok = 0;
        if (!ok) {
            char want[256], got[256];
            shape_str(want, sizeof want, ndim, shape);
            shape_str(got, sizeof got, t->ndim, t->shape);
            return DFM_FAIL(DFM_EMISMATCH, "%s: tensor \"%s\" has shape %s but %s was expected (from the config). "
                            "HINT: config.json and the weights do not belong together", st->path, name, got, want);
        }
    }
    *out = t;
    return DFM_OK;
}

int dfm_st_to_f32(const dfm_st_tensor *t, float *out) {
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case DFM_ST_F32: memcpy(out, p, t->numel * 4); return DFM_OK;
    case DFM_ST_F16:
        for (uint64_t i = 0; i < t->numel; i++) out[i] = dfm_f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        return DFM_OK;
    case DFM_ST_BF16:
        for (uint64_t i = 0; i < t->numel; i++) out[i] = dfm_bf16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        return DFM_OK;
    default:
        return DFM_FAIL(DFM_EUNSUPPORTED, "%s: tensor \"%s\" has dtype %s; only F32, F16 and BF16 can be read as floats",
                        t->file ? t->file->path : "?", t->name, dfm_st_dtype_name(t->dtype));
    }
}

const char *dfm_safetensors_meta(const dfm_safetensors *st, const char *key) {
    if (!st->metadata) return NULL;
    return json_string_value(json_object_get(st->metadata, key));
}

/* ---- writing ----------------------------------------------------------------------------------- */
int dfm_safetensors_write(const char *path, const dfm_st_write_tensor *tensors, int n, json_t *metadata) {
    if (n < 0) return DFM_FAIL(DFM_EARG, "writing %s: negative tensor count", path);
    json_t *root = json_object();
    if (!root) return DFM_FAIL(DFM_ENOMEM, "no memory");
    int rc = DFM_OK;
    if (metadata) {
        const char *k;
        json_t *v;
        if (!json_is_object(metadata)) rc = DFM_FAIL(DFM_EARG, "writing %s: metadata must be a JSON object", path);
        else
            json_object_foreach(metadata, k, v) {
                if (!json_is_string(v)) {
                    rc = DFM_FAIL(DFM_EARG, "writing %s: metadata \"%s\" must be a string", path, k);
                    break;
                }
            }
        if (!rc) json_object_set(root, "__metadata__", metadata);
    }
    uint64_t off = 0;
    for (int i = 0; i < n && !rc; i++) {
        const dfm_st_write_tensor *t = &tensors[i];
        if (!t->name || !t->name[0] || !strcmp(t->name, "__metadata__")) {
            rc = DFM_FAIL(DFM_EARG, "writing %s: tensor %d has an empty or reserved name", path, i);
            break;
        }
        if (json_object_get(root, t->name)) {
            rc = DFM_FAIL(DFM_EARG, "writing %s: duplicate tensor name \"%s\"", path, t->name);
            break;
        }
        if (dfm_st_dtype_size(t->dtype) == 0 || t->ndim < 0 || t->ndim > DFM_ST_MAX_DIMS) {
            rc = DFM_FAIL(DFM_EARG, "writing %s: tensor \"%s\" has a bad dtype or ndim", path, t->name);
            break;
        }
        uint64_t numel = 1;
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) rc = DFM_FAIL(DFM_EARG, "writing %s: tensor \"%s\" has a negative size", path, t->name);
            numel *= (uint64_t)t->shape[d];
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        uint64_t nb = numel * dfm_st_dtype_size(t->dtype);
        json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", dfm_st_dtype_name(t->dtype), "shape", shape,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + nb));
        if (!e) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        else json_object_set_new(root, t->name, e);
        off += nb;
    }
    char *js = NULL;
    if (!rc) {
        js = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!js) rc = DFM_FAIL(DFM_ENOMEM, "no memory for the header of %s", path);
    }
    json_decref(root);
    if (rc) return rc;
    size_t jlen = strlen(js), padded = (jlen + 8 + 7) / 8 * 8 - 8;
    uint8_t hdr[8];
    for (int i = 0; i < 8; i++) hdr[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    dfm_atomic_file f;
    rc = dfm_atomic_open(&f, path);
    if (!rc) rc = dfm_atomic_write(&f, hdr, 8);
    if (!rc) rc = dfm_atomic_write(&f, js, jlen);
    static const char spaces[8] = "        ";
    if (!rc) rc = dfm_atomic_write(&f, spaces, padded - jlen);
    for (int i = 0; i < n && !rc; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < tensors[i].ndim; d++) numel *= (uint64_t)tensors[i].shape[d];
        rc = dfm_atomic_write(&f, tensors[i].data, numel * dfm_st_dtype_size(tensors[i].dtype));
    }
    free(js);
    if (rc) {
        dfm_atomic_abort(&f);
        return rc;
    }
    return dfm_atomic_commit(&f);
}
