/* fuzz_safetensors.c — libFuzzer harness: a .safetensors file (8-byte header size, JSON header, data)
 * through dfm_safetensors_open, then every tensor's lookup, its size (numel x dtype size = its bytes,
 * computed without wrapping) and, for small ones, the fp32 conversion. */
#include <stdint.h>
#include <stdlib.h>

#include "schemas/safetensors.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("model.safetensors", data, size);
    dfm_safetensors *st;
    if (!path || dfm_safetensors_open(path, &st)) return 0;
    for (int i = 0; i < st->n_tensors; i++) {
        const dfm_st_tensor *t = &st->tensors[i];
        if (dfm_safetensors_find(st, t->name) != t) abort(); /* names are unique: lookup finds this one */
        /* the storage a tensor claims is exactly what its shape needs (no wrapped product) */
        if ((unsigned __int128)t->numel * dfm_st_dtype_size(t->dtype) != t->end - t->begin) abort();
        if (t->numel > (1u << 16)) continue;
        float *out = malloc((t->numel ? t->numel : 1) * sizeof *out);
        if (out) dfm_st_to_f32(t, out);
        free(out);
    }
    dfm_safetensors_meta(st, "format");
    dfm_safetensors_close(st);
    return 0;
}
