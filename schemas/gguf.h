/* gguf.h — read GGUF files (llama.cpp's model format, versions 2 and 3), fully validated, and dequantize
 * their tensors to fp32. Spec and the exact checks: schemas/gguf.md.
 *
 * File = "GGUF", u32 version, u64 tensor count, u64 key-value count, the key-value pairs (string key,
 * u32 value type, value), the tensor infos (string name, u32 n_dims, u64 ne[n_dims] fastest first,
 * u32 ggml type, u64 offset into the data section), padding to general.alignment (default 32), the data.
 * A GGUF file is untrusted input: opening it bounds every count, length and offset by the bytes the file
 * holds before anything is allocated or handed out, and checks that the tensors lie inside the data
 * section without overlapping. The file is read whole into memory, its size taken once, rather than mapped:
 * a file another process truncates meanwhile is DFM_ETRUNCATED ("shrank while it was read"), never a SIGBUS
 * in a later read of a mapping. Keys, strings and tensor bytes point into that copy ("the mapping" below),
 * which lives until dfm_gguf_close. Memory: the file's size.
 *
 *   dfm_gguf *g;
 *   DFM_TRY(dfm_gguf_open("model.gguf", &g));
 *   uint32_t layers;
 *   int rc = dfm_gguf_get_u32(g, "llama.block_count", 1, 0, &layers);
 *   const dfm_gguf_tensor *t = dfm_gguf_tensor_find(g, "token_embd.weight");
 *   float *w = malloc(t->numel * sizeof(float));
 *   rc = dfm_gguf_dequantize(t, w);        // exact for the types dfm_gguf_type_dequantizable() accepts
 *   dfm_gguf_close(g);
 *
 * An open file is immutable and may be read by many threads at once.
 */
#ifndef DFM_GGUF_H
#define DFM_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* Value types of the key-value section. */
enum {
    DFM_GGUF_U8 = 0, DFM_GGUF_I8 = 1, DFM_GGUF_U16 = 2, DFM_GGUF_I16 = 3, DFM_GGUF_U32 = 4, DFM_GGUF_I32 = 5,
    DFM_GGUF_F32 = 6, DFM_GGUF_BOOL = 7, DFM_GGUF_STRING = 8, DFM_GGUF_ARRAY = 9, DFM_GGUF_U64 = 10,
    DFM_GGUF_I64 = 11, DFM_GGUF_F64 = 12, DFM_GGUF_NVTYPES
};

/* ggml tensor types dfm knows the block layout of (the numbering is ggml's). */
enum {
    DFM_GGML_F32 = 0, DFM_GGML_F16 = 1, DFM_GGML_Q4_0 = 2, DFM_GGML_Q4_1 = 3, DFM_GGML_Q5_0 = 6, DFM_GGML_Q5_1 = 7,
    DFM_GGML_Q8_0 = 8, DFM_GGML_Q8_1 = 9, DFM_GGML_Q2_K = 10, DFM_GGML_Q3_K = 11, DFM_GGML_Q4_K = 12,
    DFM_GGML_Q5_K = 13, DFM_GGML_Q6_K = 14, DFM_GGML_Q8_K = 15, DFM_GGML_BF16 = 30, DFM_GGML_NTYPES = 64
};

#define DFM_GGUF_MAX_DIMS 4
#define DFM_GGUF_MAX_NAME 64     /* tensor names (GGML_MAX_NAME) */
#define DFM_GGUF_MAX_DEPTH 4     /* nesting of arrays in values */

/* A string in the mapping: n bytes at p, not NUL-terminated, not checked for UTF-8. */
typedef struct {
    const char *p;
    uint64_t n;
} dfm_gguf_str;

typedef struct {
    dfm_gguf_str key;
    int type;             /* DFM_GGUF_* */
    int elem_type;        /* ARRAY: the elements' type; else == type */
    uint64_t count;       /* ARRAY: number of elements; else 1 */
    const uint8_t *data;  /* the value's bytes (ARRAY: its first element) */
    uint64_t bytes;       /* the value's size in the file (ARRAY: all elements) */
} dfm_gguf_kv;

typedef struct {
    char name[DFM_GGUF_MAX_NAME + 1]; /* NUL-terminated copy */
    int type;             /* DFM_GGML_* (any id dfm knows the layout of) */
    int n_dims;           /* 1..4 */
    int64_t ne[DFM_GGUF_MAX_DIMS]; /* elements per dimension, fastest first; unused ones 1 */
    uint64_t numel;
    uint64_t offset;      /* into the data section */
    uint64_t bytes;
    const uint8_t *data;  /* in the mapping */
} dfm_gguf_tensor;

typedef struct dfm_gguf {
    char *path;
    const uint8_t *map;       /* the file's bytes, read whole */
    size_t map_bytes;
    uint32_t version;
    uint64_t alignment;
    uint64_t n_kv;
    dfm_gguf_kv *kv;          /* file order */
    uint64_t n_tensors;
    dfm_gguf_tensor *tensors; /* file order */
    const uint8_t *data;      /* the data section */
    uint64_t data_bytes;
} dfm_gguf;

/* Read and validate PATH. Errors name the file and the offending key or tensor: DFM_ENOTFOUND (no file),
 * DFM_EARG (not a regular file: a FIFO would block), DFM_EIO, DFM_EFORMAT (wrong magic, bad value type,
 * duplicate key or tensor name, impossible sizes, tensors outside the data section or overlapping),
 * DFM_ETRUNCATED (a count, length or tensor size runs past the end of the file, or the file shrank while
 * it was read), DFM_EVERSION (GGUF v0 or v1, a version above 3, or a big-endian file), DFM_EUNSUPPORTED
 * (a tensor of a ggml type whose layout dfm does not know). */
int dfm_gguf_open(const char *path, dfm_gguf **out);
/* Free; NULL is a no-op. */
void dfm_gguf_close(dfm_gguf *g);

/* The key-value pair called key, or NULL. */
const dfm_gguf_kv *dfm_gguf_find(const dfm_gguf *g, const char *key);
/* Typed scalars. An absent key gives def, or DFM_ENOTFOUND naming the file and key when required.
 * Integers of any integer type are accepted when the value fits; DFM_EFORMAT names the key otherwise. */
int dfm_gguf_get_u32(const dfm_gguf *g, const char *key, int required, uint32_t def, uint32_t *out);
/* Any non-negative integer value (for a caller that bounds it itself and names the key and value). */
int dfm_gguf_get_u64(const dfm_gguf *g, const char *key, int required, uint64_t def, uint64_t *out);
/* F32 or F64 values, finite. */
int dfm_gguf_get_f32(const dfm_gguf *g, const char *key, int required, float def, float *out);
int dfm_gguf_get_bool(const dfm_gguf *g, const char *key, int def, int *out);
/* A string value as a malloc'd NUL-terminated copy; *out = NULL when absent and not required. A value
 * holding a NUL byte is DFM_EFORMAT. */
int dfm_gguf_get_str(const dfm_gguf *g, const char *key, int required, char **out);

/* The strings of an ARRAY of STRING kv: *out is a malloc'd array of kv->count views into the mapping. */
int dfm_gguf_strings(const dfm_gguf *g, const dfm_gguf_kv *kv, dfm_gguf_str **out);
/* The elements of an ARRAY of integers (any integer type whose values fit in int64) as int64. */
int dfm_gguf_ints(const dfm_gguf *g, const dfm_gguf_kv *kv, int64_t **out);

/* The tensor called name, or NULL. */
const dfm_gguf_tensor *dfm_gguf_tensor_find(const dfm_gguf *g, const char *name);

/* "Q4_K", "F32", ... for a ggml type id; "?" when unknown. */
const char *dfm_ggml_type_name(int type);
/* Elements per block and bytes per block of a ggml type; 0 when dfm does not know its layout. */
int dfm_ggml_type_layout(int type, uint32_t *block_elems, uint32_t *block_bytes);
/* 1 if dfm_gguf_dequantize converts this type: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K. */
int dfm_gguf_type_dequantizable(int type);

/* Dequantize n elements (a multiple of the type's block) of type at src into dst, with the arithmetic of
 * ggml's reference dequantize_row_* in fp32, one rounding per operation in the same order (no fused
 * multiply-add), so the result equals llama.cpp's and the `gguf` package's bit for bit. DFM_EUNSUPPORTED
 * names the type when it is not dequantizable; DFM_EARG when n is not a multiple of the block. */
int dfm_ggml_dequantize(int type, const void *src, float *dst, uint64_t n);
/* The whole tensor into dst (t->numel floats); errors name the file and the tensor. */
int dfm_gguf_dequantize(const dfm_gguf *g, const dfm_gguf_tensor *t, float *dst);

#endif
