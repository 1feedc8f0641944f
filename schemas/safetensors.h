/* safetensors.h — read (mmap, fully validated) and write (atomically) Hugging Face .safetensors files.
 * Spec and the exact checks: schemas/safetensors.md.
 *
 * File = u64 little-endian header size N, N bytes of JSON, then the data buffer:
 *   {"__metadata__": {"k": "v", ...},                                   (optional, string values)
 *    "name": {"dtype": "F32", "shape": [384, 1536], "data_offsets": [BEGIN, END]}, ...}
 * Offsets are relative to the data buffer. Reading checks, before any tensor is handed out: the header
 * size (8 <= N <= 100 MB and inside the file), the JSON (an object, every entry with a known dtype, a
 * shape of non-negative ints, 2 offsets), END - BEGIN == numel * dtype size, and that the tensors,
 * sorted by offset, tile the data buffer exactly (start at 0, no gaps, no overlaps, last END equal to
 * the buffer end), as the reference implementation does.
 *
 *   dfm_safetensors *st;
 *   DFM_TRY(dfm_safetensors_open("model.safetensors", &st));
 *   const dfm_st_tensor *t;
 *   int rc = dfm_safetensors_get(st, "pooler.dense.weight", 2, (int64_t[]){384, 384}, &t);
 *   float *w = malloc(t->numel * sizeof(float));
 *   rc = dfm_st_to_f32(t, w);    // F32 copied, F16 / BF16 converted
 *   dfm_safetensors_close(st);
 *
 * An open file is immutable and may be read by many threads at once.
 */
#ifndef DFM_SAFETENSORS_H
#define DFM_SAFETENSORS_H

#include "schemas/half.h" /* dfm_f16_to_f32 & co., used with F16/BF16 tensors */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* dtypes of the format. Callers that only compute in floats accept F32 / F16 / BF16 and reject the
 * rest with DFM_EUNSUPPORTED (dfm_st_to_f32 does). */
typedef enum {
    DFM_ST_F32 = 0,
    DFM_ST_F16,
    DFM_ST_BF16,
    DFM_ST_F64,
    DFM_ST_I64,
    DFM_ST_I32,
    DFM_ST_I16,
    DFM_ST_I8,
    DFM_ST_U64,
    DFM_ST_U32,
    DFM_ST_U16,
    DFM_ST_U8,
    DFM_ST_BOOL,
    DFM_ST_F8_E4M3,
    DFM_ST_F8_E5M2,
    DFM_ST_NDTYPES
} dfm_st_dtype;

#define DFM_ST_MAX_DIMS 8
/* Upper bound on the JSON header (the reference implementation's own limit). */
#define DFM_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

/* "F32", "BF16", ... ; "?" for an unknown value. */
const char *dfm_st_dtype_name(int dtype);
/* Bytes per element (1 for BOOL and F8), 0 for an unknown value. */
size_t dfm_st_dtype_size(int dtype);
/* Parse a dtype name; -1 if unknown. */
int dfm_st_dtype_parse(const char *name);

typedef struct {
    const char *name;            /* owned by the file handle */
    int dtype;                   /* dfm_st_dtype */
    int ndim;
    int64_t shape[DFM_ST_MAX_DIMS];
    uint64_t numel;              /* product of shape (1 for a scalar) */
    uint64_t begin, end;         /* data_offsets, relative to the data buffer */
    const void *data;            /* points into the mapping (aligned only as the file makes it) */
    const struct dfm_safetensors *file;
} dfm_st_tensor;

typedef struct dfm_safetensors {
    char *path;
    const uint8_t *map;          /* whole file, mmap'd read-only */
    size_t map_bytes;
    uint64_t header_bytes;       /* N */
    const uint8_t *data;         /* map + 8 + N */
    uint64_t data_bytes;
    int n_tensors;
    dfm_st_tensor *tensors;      /* sorted by name (lookups are binary searches) */
    json_t *metadata;            /* the "__metadata__" object or NULL (borrowed by callers) */
} dfm_safetensors;

/* Map and validate PATH (see the top of this file). Errors name the file and the offending tensor or
 * field: DFM_ENOTFOUND (no file), DFM_EIO, DFM_ETRUNCATED (file shorter than 8 bytes or than its
 * header), DFM_EFORMAT (bad JSON, dtype, shape or offsets), DFM_ERANGE (header size over the bound). */
int dfm_safetensors_open(const char *path, dfm_safetensors **out);
/* Unmap and free; NULL is a no-op. Tensors and names of the file become invalid. */
void dfm_safetensors_close(dfm_safetensors *st);

/* The tensor called name, or NULL. */
const dfm_st_tensor *dfm_safetensors_find(const dfm_safetensors *st, const char *name);

/* The tensor called name with exactly ndim dimensions of the given sizes (a size of -1 matches any).
 * DFM_ENOTFOUND names the file and the tensor; DFM_EMISMATCH names file, tensor, expected and found
 * shapes. shape may be NULL when ndim < 0 (no check). */
int dfm_safetensors_get(const dfm_safetensors *st, const char *name, int ndim, const int64_t *shape,
                        const dfm_st_tensor **out);

/* Copy t's elements into out (t->numel floats), converting F16 and BF16 to fp32. Other dtypes are
 * DFM_EUNSUPPORTED naming the file, tensor and dtype. */
int dfm_st_to_f32(const dfm_st_tensor *t, float *out);

/* The value of a "__metadata__" key, or NULL. */
const char *dfm_safetensors_meta(const dfm_safetensors *st, const char *key);

/* ---- writing ---------------------------------------------------------------------------------- */
typedef struct {
    const char *name;     /* unique, not "__metadata__" */
    int dtype;            /* dfm_st_dtype */
    int ndim;             /* 0..DFM_ST_MAX_DIMS */
    const int64_t *shape; /* ndim sizes >= 0 */
    const void *data;     /* numel * dtype size bytes, little-endian */
} dfm_st_write_tensor;

/* Write n tensors to PATH atomically (temp + fsync + rename). Tensors are laid out in the given order,
 * contiguous, each data offset a multiple of 8 relative to the file start when the sizes allow (the
 * JSON header is space-padded to a multiple of 8, as Hugging Face's writer does). metadata: a JSON
 * object of string values stored as "__metadata__", or NULL. DFM_EARG for a bad name, dtype, shape
 * or duplicate; DFM_EIO / DFM_ENOSPACE from the file system. */
int dfm_safetensors_write(const char *path, const dfm_st_write_tensor *tensors, int n, json_t *metadata);

#endif
