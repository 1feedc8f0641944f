/* fuzz_hidden_states.c — libFuzzer harness: a hidden-states file (schemas/hidden_states.h) through
 * dfm_hidden_open, resealed (payload checksum at 72 over the bytes after the header, header checksum at 80
 * over the header with that field zero) so that mutations reach the size checks behind the checksums; a
 * file that opens must hold its last key and value inside the mapping. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "schemas/hidden_states.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *b = malloc(size ? size : 1);
    if (!b) return 0;
    memcpy(b, data, size);
    if (size >= DFM_HIDDEN_HEADER_BYTES) {
        uint64_t pc = XXH3_64bits(b + DFM_HIDDEN_HEADER_BYTES, size - DFM_HIDDEN_HEADER_BYTES), zero = 0, hc;
        memcpy(b + offsetof(dfm_hidden_header, payload_xxh64), &pc, 8);
        memcpy(b + offsetof(dfm_hidden_header, header_xxh64), &zero, 8);
        hc = XXH3_64bits(b, DFM_HIDDEN_HEADER_BYTES);
        memcpy(b + offsetof(dfm_hidden_header, header_xxh64), &hc, 8);
    }
    const char *path = fuzz_file("h.bin", b, size);
    free(b);
    dfm_hidden_file *f;
    if (!path || dfm_hidden_open(path, &f)) return 0;
    uint64_t n = f->hdr.n_keys, dim = f->hdr.dim;
    const uint8_t *end = f->map + f->map_bytes;
    if (n) {
        const float *last = f->keys + (n - 1) * dim;
        if ((const uint8_t *)(last + dim) > end || (const uint8_t *)(f->values + n) > end) abort();
        volatile float k = last[dim - 1];
        volatile uint32_t v = f->values[n - 1];
        (void)k, (void)v;
    }
    dfm_hidden_close(f);
    return 0;
}
