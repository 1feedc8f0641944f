/* fuzz_chunk_shard.c — libFuzzer harness: a chunk shard (schemas/chunk_shard.h) through
 * dfm_chunk_shard_open, resealed so that mutations reach the checks behind the checksums; every record
 * of a shard that opens is read and must keep the promises the reader documents. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "schemas/chunk_shard.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *b = fuzz_reseal_128(data, size, offsetof(dfm_chunk_header, payload_checksum));
    const char *path = b ? fuzz_file("shard.chunks", b, size) : NULL;
    free(b);
    dfm_chunk_shard *s;
    if (!path || dfm_chunk_shard_open(path, &s)) return 0;
    for (uint64_t i = 0; i < s->hdr.n_chunks; i++) {
        const dfm_chunk_meta *m = dfm_chunk_shard_meta(s, i);
        const uint32_t *t = dfm_chunk_shard_tokens(s, i);
        if (m->n_valid > s->hdr.chunk_len) abort();
        for (uint32_t j = 0; j < m->n_valid; j++)
            if (t[j] >= s->hdr.vocab_size) abort();
    }
    dfm_chunk_shard_close(s);
    return 0;
}
