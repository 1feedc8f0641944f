/* fuzz_embedding_shard.c — libFuzzer harness: an embedding block (schemas/embedding_shard.h) through
 * dfm_emb_shard_open, resealed so that mutations reach the checks behind the checksums; the rows of a
 * block that opens are converted to fp32 (the last one alone, then all of them when they are few). The
 * conversion may refuse a non-finite value (DFM_EFORMAT: the open does not look at values), never a row
 * inside the file as out of range. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/error.h"
#include "schemas/embedding_shard.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *b = fuzz_reseal_128(data, size, offsetof(dfm_emb_header, payload_checksum));
    const char *path = b ? fuzz_file("block.emb", b, size) : NULL;
    free(b);
    dfm_emb_shard *s;
    if (!path || dfm_emb_shard_open(path, &s)) return 0;
    uint64_t n = s->hdr.n_rows, dim = s->hdr.dim;
    if (n && dim <= (1u << 16)) {
        float *row = malloc(dim * sizeof *row);
        if (row && dfm_emb_shard_rows_f32(s, n - 1, 1, row) == DFM_ERANGE) abort();
        free(row);
        if (n * dim <= (1u << 16)) {
            float *all = malloc(n * dim * sizeof *all);
            if (all && dfm_emb_shard_rows_f32(s, 0, n, all) == DFM_ERANGE) abort();
            free(all);
        }
    }
    float one[1];
    if (dfm_emb_shard_rows_f32(s, n, 1, one) == 0 && dim) abort(); /* past the end is an error */
    dfm_emb_shard_close(s);
    return 0;
}
