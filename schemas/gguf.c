/* gguf.c — the GGUF container: header, key-value pairs and tensor infos, every size bounded by the file
 * (schemas/gguf.md). Dequantization of the tensor blocks is in gguf_dequant.c. */
#include "schemas/gguf.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"

/* Bytes of one scalar value type; 0 for STRING and ARRAY (variable) and unknown types. */
static uint64_t scalar_bytes(int type) {
    switch (type) {
    case DFM_GGUF_U8: case DFM_GGUF_I8: case DFM_GGUF_BOOL: return 1;
    case DFM_GGUF_U16: case DFM_GGUF_I16: return 2;
    case DFM_GGUF_U32: case DFM_GGUF_I32: case DFM_GGUF_F32: return 4;
    case DFM_GGUF_U64: case DFM_GGUF_I64: case DFM_GGUF_F64: return 8;
    default: return 0;
    }
}

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* A bounded cursor over the mapping; the first failure is sticky and its message names the place. */
typedef struct {
    const dfm_gguf *g;
    const uint8_t *p, *end;
    int rc;
} cursor;

static uint64_t at(const cursor *c) { return (uint64_t)(c->p - c->g->map); }

static int need(cursor *c, uint64_t n, const char *what) {
    if (c->rc) return c->rc;
    if (n > (uint64_t)(c->end - c->p))
        c->rc = DFM_FAIL(DFM_ETRUNCATED, "%s: %s needs %llu bytes at offset %llu, but the file ends at %zu. HINT: "
                         "the file is truncated or damaged; download it again", c->g->path, what,
                         (unsigned long long)n, (unsigned long long)at(c), c->g->map_bytes);
    return c->rc;
}

static uint32_t take32(cursor *c, const char *what) {
    if (need(c, 4, what)) return 0;
    uint32_t v = rd32(c->p);
    c->p += 4;
    return v;
}

static uint64_t take64(cursor *c, const char *what) {
    if (need(c, 8, what)) return 0;
    uint64_t v = rd64(c->p);
    c->p += 8;
    return v;
}

static dfm_gguf_str take_str(cursor *c, const char *what) {
    dfm_gguf_str s = {NULL, 0};
    uint64_t n = take64(c, what);
    if (need(c, n, what)) return s;
    s.p = (const char *)c->p;
    s.n = n;
    c->p += n;
    return s;
}

/* Skip one value of type t (nested arrays to DFM_GGUF_MAX_DEPTH); key names the pair in messages. */
static void skip_value(cursor *c, int t, int depth, const dfm_gguf_str *key) {
    if (c->rc) return;
    uint64_t sb = scalar_bytes(t);
    if (sb) {
        need(c, sb, "a value");
        if (!c->rc) c->p += sb;
        return;
    }
    if (t == DFM_GGUF_STRING) {
        take_str(c, "a string value");
        return;
    }
    if (t != DFM_GGUF_ARRAY) {
        c->rc = DFM_FAIL(DFM_EFORMAT, "%s: key \"%.*s\": value type %d is not a GGUF type (0..12)", c->g->path,
                         (int)(key->n < 200 ? key->n : 200), key->p, t);
        return;
    }
    if (depth >= DFM_GGUF_MAX_DEPTH) {
        c->rc = DFM_FAIL(DFM_EFORMAT, "%s: key \"%.*s\": arrays nested deeper than %d", c->g->path,
                         (int)(key->n < 200 ? key->n : 200), key->p, DFM_GGUF_MAX_DEPTH);
        return;
    }
    int et = (int)take32(c, "an array's element type");
    uint64_t n = take64(c, "an array's length");
    if (c->rc) return;
    uint64_t eb = scalar_bytes(et);
    if (eb) { /* fixed-size elements: one bound check for all */
        if (n > (uint64_t)(c->end - c->p) / eb) {
            need(c, UINT64_MAX, "an array");
            return;
        }
        c->p += n * eb;
        return;
    }
    /* each element takes at least 8 bytes (a string's or an array's length): n is bounded by the file */
    if (n > (uint64_t)(c->end - c->p) / 8) {
        need(c, UINT64_MAX, "an array");
        return;
    }
    for (uint64_t i = 0; i < n && !c->rc; i++) skip_value(c, et, depth + 1, key);
}

static int key_eq(dfm_gguf_str a, dfm_gguf_str b) { return a.n == b.n && !memcmp(a.p, b.p, a.n); }

static int cmp_offset(const void *a, const void *b) {
    const dfm_gguf_tensor *x = *(const dfm_gguf_tensor *const *)a, *y = *(const dfm_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const dfm_gguf_tensor *const *)a)->name, (*(const dfm_gguf_tensor *const *)b)->name);
}

static int cmp_key(const void *a, const void *b) {
    const dfm_gguf_kv *x = *(const dfm_gguf_kv *const *)a, *y = *(const dfm_gguf_kv *const *)b;
    int c = memcmp(x->key.p, y->key.p, x->key.n < y->key.n ? x->key.n : y->key.n);
    return c ? c : (x->key.n > y->key.n) - (x->key.n < y->key.n);
}

/* Duplicate keys and tensor names, found by sorting (the counts are bounded by the file, not small). */
static int check_unique(dfm_gguf *g) {
    uint64_t n = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors;
    void **by = malloc((n ? n : 1) * sizeof *by);
    if (!by) return DFM_FAIL(DFM_ENOMEM, "no memory");
    int rc = DFM_OK;
    for (uint64_t i = 0; i < g->n_kv; i++) by[i] = &g->kv[i];
    qsort(by, g->n_kv, sizeof *by, cmp_key);
    for (uint64_t i = 1; i < g->n_kv && !rc; i++)
        if (!cmp_key(&by[i - 1], &by[i])) {
            const dfm_gguf_kv *kv = by[i];
            rc = DFM_FAIL(DFM_EFORMAT, "%s: key \"%.*s\" appears twice", g->path, (int)(kv->key.n < 200 ? kv->key.n : 200),
                          kv->key.p);
        }
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) by[i] = &g->tensors[i];
    if (!rc) qsort(by, g->n_tensors, sizeof *by, cmp_name);
    for (uint64_t i = 1; i < g->n_tensors && !rc; i++)
        if (!cmp_name(&by[i - 1], &by[i]))
            rc = DFM_FAIL(DFM_EFORMAT, "%s: tensor name %s appears twice", g->path, ((dfm_gguf_tensor *)by[i])->name);
    free(by);
    return rc;
}

static int parse_kv(cursor *c, dfm_gguf *g) {
    for (uint64_t i = 0; i < g->n_kv; i++) {
        dfm_gguf_kv *kv = &g->kv[i];
        kv->key = take_str(c, "a key");
        kv->type = (int)take32(c, "a value type");
        if (c->rc) return c->rc;
        if (kv->key.n == 0 || kv->key.n > 65535 || memchr(kv->key.p, 0, kv->key.n))
            return DFM_FAIL(DFM_EFORMAT, "%s: key-value pair %llu has an empty, NUL-holding or over-long key",
                            g->path, (unsigned long long)i);
        kv->elem_type = kv->type;
        kv->count = 1;
        if (kv->type == DFM_GGUF_ARRAY) { /* peek at the element type and count, then skip the whole value */
            if (need(c, 12, "an array header")) return c->rc;
            kv->elem_type = (int)rd32(c->p);
            kv->count = rd64(c->p + 4);
            kv->data = c->p + 12;
        } else {
            kv->data = c->p;
        }
        skip_value(c, kv->type, 0, &kv->key);
        if (c->rc) return dfm_error_prefix("key \"%.*s\"", (int)(kv->key.n < 200 ? kv->key.n : 200), kv->key.p);
        kv->bytes = (uint64_t)(c->p - kv->data);
    }
    return DFM_OK;
}

static int parse_tensors(cursor *c, dfm_gguf *g) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        dfm_gguf_tensor *t = &g->tensors[i];
        dfm_gguf_str name = take_str(c, "a tensor name");
        uint32_t nd = take32(c, "a tensor's dimension count");
        if (c->rc) return c->rc;
        if (name.n == 0 || name.n > DFM_GGUF_MAX_NAME || memchr(name.p, 0, name.n))
            return DFM_FAIL(DFM_EFORMAT, "%s: tensor %llu: name of %llu bytes (1..%d without NUL allowed)", g->path,
                            (unsigned long long)i, (unsigned long long)name.n, DFM_GGUF_MAX_NAME);
        memcpy(t->name, name.p, name.n);
        t->name[name.n] = 0;
        if (nd < 1 || nd > DFM_GGUF_MAX_DIMS)
            return DFM_FAIL(DFM_EFORMAT, "%s: tensor %s has %u dimensions (1..%d)", g->path, t->name, nd,
                            DFM_GGUF_MAX_DIMS);
        t->n_dims = (int)nd;
        t->numel = 1;
        for (int d = 0; d < DFM_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne = take64(c, "a tensor dimension");
            if (c->rc) return c->rc;
            /* the product stays at most 2^62 (its byte count is bounded by the file below) */
            if (ne == 0 || ne > ((uint64_t)1 << 62) / t->numel)
                return DFM_FAIL(DFM_EFORMAT, "%s: tensor %s: dimension %u is %llu (the element count must be 1..2^62)",
                                g->path, t->name, d, (unsigned long long)ne);
            t->ne[d] = (int64_t)ne;
            t->numel *= ne;
        }
        t->type = (int)take32(c, "a tensor type");
        t->offset = take64(c, "a tensor offset");
        if (c->rc) return c->rc;
        uint32_t be, bb;
        if (!dfm_ggml_type_layout(t->type, &be, &bb))
            return DFM_FAIL(DFM_EUNSUPPORTED, "%s: tensor %s has ggml type %d (%s), whose block layout dfm does not know. "
                            "HINT: convert the model with a common type (F16, BF16, Q8_0, Q4_K, Q6_K, ...)", g->path,
                            t->name, t->type, dfm_ggml_type_name(t->type));
        if ((uint64_t)t->ne[0] % be)
            return DFM_FAIL(DFM_EFORMAT, "%s: tensor %s: a row of %lld elements is not a whole number of %s blocks of %u",
                            g->path, t->name, (long long)t->ne[0], dfm_ggml_type_name(t->type), be);
        /* numel < 2^62 still overflows u64 in bytes (4 x 2^62 for F32): bounded by the file before multiplying */
        if (t->numel / be > (uint64_t)g->map_bytes / bb)
            return DFM_FAIL(DFM_ETRUNCATED, "%s: tensor %s: %llu elements of %s need more bytes than the whole file "
                            "(%zu). HINT: the file is damaged or not a GGUF file", g->path, t->name,
                            (unsigned long long)t->numel, dfm_ggml_type_name(t->type), g->map_bytes);
        t->bytes = t->numel / be * bb;
    }
    return DFM_OK;
}

/* The data section starts at the next multiple of the alignment; every tensor lies inside it, starts at a
 * multiple of the alignment, and no two overlap. */
static int place_tensors(cursor *c, dfm_gguf *g) {
    uint64_t hdr = at(c);
    uint64_t start = (hdr + g->alignment - 1) / g->alignment * g->alignment;
    if (start > g->map_bytes)
        return DFM_FAIL(DFM_ETRUNCATED, "%s: the data section would start at byte %llu, past the end of the file (%zu)",
                        g->path, (unsigned long long)start, g->map_bytes);
    g->data = g->map + start;
    g->data_bytes = g->map_bytes - start;
    if (!g->n_tensors) return DFM_OK;
    dfm_gguf_tensor **by = malloc(g->n_tensors * sizeof *by);
    if (!by) return DFM_FAIL(DFM_ENOMEM, "no memory for %llu tensor infos", (unsigned long long)g->n_tensors);
    int rc = DFM_OK;
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
        dfm_gguf_tensor *t = &g->tensors[i];
        by[i] = t;
        if (t->offset % g->alignment)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: tensor %s: offset %llu is not a multiple of the alignment %llu", g->path,
                          t->name, (unsigned long long)t->offset, (unsigned long long)g->alignment);
        else if (t->offset > g->data_bytes || t->bytes > g->data_bytes - t->offset)
            rc = DFM_FAIL(DFM_ETRUNCATED, "%s: tensor %s (%s, %llu bytes at data offset %llu) runs past the end of the "
                          "file (data section of %llu bytes). HINT: the file is truncated; download it again", g->path,
                          t->name, dfm_ggml_type_name(t->type), (unsigned long long)t->bytes,
                          (unsigned long long)t->offset, (unsigned long long)g->data_bytes);
        else
            t->data = g->data + t->offset;
    }
    if (!rc) {
        qsort(by, g->n_tensors, sizeof *by, cmp_offset);
        for (uint64_t i = 1; i < g->n_tensors && !rc; i++)
            if (by[i]->offset < by[i - 1]->offset + by[i - 1]->bytes)
                rc = DFM_FAIL(DFM_EFORMAT, "%s: tensors %s and %s overlap in the data section", g->path, by[i - 1]->name,
                              by[i]->name);
    }
    free(by);
    return rc;
}

/* The whole file into memory, its size taken once (schemas/gguf.md: a file that shrinks while it is read is an
 * error here, never a SIGBUS later on a mapping). */
static int read_whole(dfm_gguf *g) {
    int fd, rc;
    DFM_TRY(dfm_open_regular(g->path, "HINT: pass the path of a .gguf model file", &fd));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = DFM_FAIL(DFM_EIO, "cannot stat %s: %s", g->path, strerror(errno));
        close(fd);
        return rc;
    }
    size_t n = (size_t)st.st_size, got = 0;
    uint8_t *buf = n ? malloc(n) : NULL;
    if (n && !buf) {
        close(fd);
        return DFM_FAIL(DFM_ENOMEM, "no memory to read %s (%zu bytes)", g->path, n);
    }
    dfm_fault_point("gguf:sized", 0); /* tests stop here and truncate the file */
    int err = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got > (1u << 30) ? (1u << 30) : n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) err = errno;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got < n) {
        free(buf);
        return err ? DFM_FAIL(DFM_EIO, "cannot read %s at byte %zu: %s", g->path, got, strerror(err))
                   : DFM_FAIL(DFM_ETRUNCATED, "%s shrank while it was read: %zu bytes, %zu when it was opened. HINT: "
                              "another process is writing or truncating it; import it once it is complete", g->path,
                              got, n);
    }
    g->map = buf;
    g->map_bytes = n;
    return DFM_OK;
}

int dfm_gguf_open(const char *path, dfm_gguf **out) {
    *out = NULL;
    dfm_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    int rc = read_whole(g);
    if (rc) {
        dfm_gguf_close(g);
        return rc;
    }
    if (g->map_bytes < 4 || memcmp(g->map, "GGUF", 4)) { /* an empty file maps to NULL */
        rc = DFM_FAIL(DFM_EFORMAT, "%s is not a GGUF file (it does not start with \"GGUF\")", path);
        goto fail;
    }
    cursor c = {g, g->map, g->map + g->map_bytes, 0};
    c.p += 4;
    g->version = take32(&c, "the version");
    if (c.rc) {
        rc = c.rc;
        goto fail;
    }
    if (g->version < 2 || g->version > 3) {
        int swapped = g->version > 0xffff; /* a big-endian file reads its version byte-swapped */
        rc = DFM_FAIL(DFM_EVERSION, "%s: GGUF version %u%s is not supported (versions 2 and 3 are). HINT: %s", path,
                      swapped ? __builtin_bswap32(g->version) : g->version, swapped ? ", big-endian," : "",
                      swapped ? "convert the model on a little-endian machine" : "re-convert it with a current llama.cpp");
        goto fail;
    }
    g->n_tensors = take64(&c, "the tensor count");
    g->n_kv = take64(&c, "the key-value count");
    if (c.rc) {
        rc = c.rc;
        goto fail;
    }
    /* each pair takes at least 12 bytes (key length, value type), each tensor info at least 24: the counts
     * are bounded by the bytes left before anything is allocated for them */
    uint64_t left = (uint64_t)(c.end - c.p);
    if (g->n_kv > left / 12 || g->n_tensors > left / 24) {
        rc = DFM_FAIL(DFM_ETRUNCATED, "%s: header claims %llu key-value pairs and %llu tensors, more than its %llu "
                      "remaining bytes can hold. HINT: the file is truncated or not a GGUF file", path,
                      (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, (unsigned long long)left);
        goto fail;
    }
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        rc = DFM_FAIL(DFM_ENOMEM, "no memory for the GGUF header of %s", path);
        goto fail;
    }
    if ((rc = parse_kv(&c, g))) goto fail;
    g->alignment = 32;
    const dfm_gguf_kv *al = dfm_gguf_find(g, "general.alignment");
    if (al) {
        uint32_t a;
        if ((rc = dfm_gguf_get_u32(g, "general.alignment", 1, 0, &a))) goto fail;
        if (a == 0 || (a & (a - 1)) || a > (1u << 20)) {
            rc = DFM_FAIL(DFM_EFORMAT, "%s: general.alignment %u is not a power of two up to 2^20", path, a);
            goto fail;
        }
        g->alignment = a;
    }
    if ((rc = parse_tensors(&c, g))) goto fail;
    if ((rc = check_unique(g))) goto fail;
    if ((rc = place_tensors(&c, g))) goto fail;
    *out = g;
    return DFM_OK;
fail:
    dfm_gguf_close(g);
    return rc;
}

void dfm_gguf_close(dfm_gguf *g) {
    if (!g) return;
    free((void *)g->map);
    free(g->kv);
    free(g->tensors);
    free(g->path);
    free(g);
}

const dfm_gguf_kv *dfm_gguf_find(const dfm_gguf *g, const char *key) {
    dfm_gguf_str k = {key, strlen(key)};
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (key_eq(g->kv[i].key, k)) return &g->kv[i];
    return NULL;
}

/* An integer scalar of any integer type (or BOOL) as int64; 0 when it is not one or does not fit. */
static int int_value(int type, const uint8_t *p, int64_t *v) {
    switch (type) {
    case DFM_GGUF_U8: *v = *p; return 1;
    case DFM_GGUF_I8: *v = (int8_t)*p; return 1;
    case DFM_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); *v = x; return 1; }
    case DFM_GGUF_I16: { int16_t x; memcpy(&x, p, 2); *v = x; return 1; }
    case DFM_GGUF_U32: *v = rd32(p); return 1;
    case DFM_GGUF_I32: *v = (int32_t)rd32(p); return 1;
    case DFM_GGUF_U64: { uint64_t x = rd64(p); if (x > INT64_MAX) return 0; *v = (int64_t)x; return 1; }
    case DFM_GGUF_I64: *v = (int64_t)rd64(p); return 1;
    default: return 0;
    }
}

static int missing(const dfm_gguf *g, const char *key) {
    return DFM_FAIL(DFM_ENOTFOUND, "%s: metadata key \"%s\" is missing. HINT: the file was not written by a llama.cpp "
                    "converter for a supported architecture", g->path, key);
}

int dfm_gguf_get_u64(const dfm_gguf *g, const char *key, int required, uint64_t def, uint64_t *out) {
    const dfm_gguf_kv *kv = dfm_gguf_find(g, key);
    if (!kv) {
        if (required) return missing(g, key);
        *out = def;
        return DFM_OK;
    }
    int64_t v;
    if (kv->type == DFM_GGUF_U64) {
        *out = rd64(kv->data);
        return DFM_OK;
    }
    if (kv->type == DFM_GGUF_ARRAY || !int_value(kv->type, kv->data, &v))
        return DFM_FAIL(DFM_EFORMAT, "%s: metadata \"%s\" is not an integer (GGUF value type %d)", g->path, key,
                        kv->type);
    if (v < 0)
        return DFM_FAIL(DFM_EFORMAT, "%s: metadata \"%s\" is %lld, not an unsigned integer", g->path, key, (long long)v);
    *out = (uint64_t)v;
    return DFM_OK;
}

int dfm_gguf_get_u32(const dfm_gguf *g, const char *key, int required, uint32_t def, uint32_t *out) {
    uint64_t v;
    DFM_TRY(dfm_gguf_get_u64(g, key, required, def, &v));
    if (v > UINT32_MAX)
        return DFM_FAIL(DFM_EFORMAT, "%s: metadata \"%s\" is %llu, not an unsigned 32-bit integer", g->path, key,
                        (unsigned long long)v);
    *out = (uint32_t)v;
    return DFM_OK;
}

int dfm_gguf_get_f32(const dfm_gguf *g, const char *key, int required, float def, float *out) {
    const dfm_gguf_kv *kv = dfm_gguf_find(g, key);
    if (!kv) {
        if (required) return missing(g, key);
        *out = def;
        return DFM_OK;
    }
    double v;
    if (kv->type == DFM_GGUF_F32) {
        float f;
        memcpy(&f, kv->data, 4);
        v = f;
    } else if (kv->type == DFM_GGUF_F64) {
        memcpy(&v, kv->data, 8);
    } else {
        return DFM_FAIL(DFM_EFORMAT, "%s: metadata \"%s\" is not a floating-point number", g->path, key);
    }
    if (!isfinite(v) || !isfinite((float)v))
        return DFM_FAIL(DFM_EFORMAT, "%s: metadata \"%s\" is %g, not a finite fp32 number", g->path, key, v);
    *out = (float)v;
    return DFM_OK;
}

int dfm_gguf_get_bool(const dfm_gguf *g, const char *key, int def, int *out) {
    const dfm_gguf_kv *kv = dfm_gguf_find(g, key);
    if (!kv) {
        *out = def;
        return DFM_OK;
    }
    if (kv->type != DFM_GGUF_BOOL || kv->data[0] > 1)
        return DFM_FAIL(DFM_EFORMAT, "%s: metadata \"%s\" is not a boolean", g->path, key);
    *out = kv->data[0];
    return DFM_OK;
}

int dfm_gguf_get_str(const dfm_gguf *g, const char *key, int required, char **out) {
    *out = NULL;
    const dfm_gguf_kv *kv = dfm_gguf_find(g, key);
    if (!kv) return required ? missing(g, key) : DFM_OK;
    if (kv->type != DFM_GGUF_STRING)
        return DFM_FAIL(DFM_EFORMAT, "%s: metadata \"%s\" is not a string", g->path, key);
    uint64_t n = rd64(kv->data);
    const char *p = (const char *)kv->data + 8;
    if (memchr(p, 0, n)) return DFM_FAIL(DFM_EFORMAT, "%s: metadata \"%s\" holds a NUL byte", g->path, key);
    if (!(*out = malloc(n + 1))) return DFM_FAIL(DFM_ENOMEM, "no memory for %s", key);
    memcpy(*out, p, n);
    (*out)[n] = 0;
    return DFM_OK;
}

static int not_array_of(const dfm_gguf *g, const dfm_gguf_kv *kv, const char *what) {
    return DFM_FAIL(DFM_EFORMAT, "%s: metadata \"%.*s\" is not an array of %s", g->path,
                    (int)(kv->key.n < 200 ? kv->key.n : 200), kv->key.p, what);
}

int dfm_gguf_strings(const dfm_gguf *g, const dfm_gguf_kv *kv, dfm_gguf_str **out) {
    *out = NULL;
    if (kv->type != DFM_GGUF_ARRAY || kv->elem_type != DFM_GGUF_STRING) return not_array_of(g, kv, "strings");
    /* open() walked every string inside the file: only the lengths are read again */
    dfm_gguf_str *s = malloc((kv->count ? kv->count : 1) * sizeof *s);
    if (!s) return DFM_FAIL(DFM_ENOMEM, "no memory for %llu strings", (unsigned long long)kv->count);
    const uint8_t *p = kv->data;
    for (uint64_t i = 0; i < kv->count; i++) {
        s[i].n = rd64(p);
        s[i].p = (const char *)p + 8;
        p += 8 + s[i].n;
    }
    *out = s;
    return DFM_OK;
}

int dfm_gguf_ints(const dfm_gguf *g, const dfm_gguf_kv *kv, int64_t **out) {
    *out = NULL;
    uint64_t eb = scalar_bytes(kv->elem_type);
    int64_t v;
    if (kv->type != DFM_GGUF_ARRAY || !eb || kv->elem_type == DFM_GGUF_BOOL || kv->elem_type == DFM_GGUF_F32 ||
        kv->elem_type == DFM_GGUF_F64)
        return not_array_of(g, kv, "integers");
    int64_t *a = malloc((kv->count ? kv->count : 1) * sizeof *a);
    if (!a) return DFM_FAIL(DFM_ENOMEM, "no memory for %llu integers", (unsigned long long)kv->count);
    for (uint64_t i = 0; i < kv->count; i++) {
        if (!int_value(kv->elem_type, kv->data + i * eb, &v)) {
            free(a);
            return DFM_FAIL(DFM_EFORMAT, "%s: metadata \"%.*s\"[%llu] does not fit in 64 bits", g->path,
                            (int)(kv->key.n < 200 ? kv->key.n : 200), kv->key.p, (unsigned long long)i);
        }
        a[i] = v;
    }
    *out = a;
    return DFM_OK;
}

const dfm_gguf_tensor *dfm_gguf_tensor_find(const dfm_gguf *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

int dfm_gguf_dequantize(const dfm_gguf *g, const dfm_gguf_tensor *t, float *dst) {
    int rc = dfm_ggml_dequantize(t->type, t->data, dst, t->numel);
    return rc ? dfm_error_prefix("%s: tensor %s", g->path, t->name) : DFM_OK;
}
