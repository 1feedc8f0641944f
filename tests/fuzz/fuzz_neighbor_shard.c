/* fuzz_neighbor_shard.c — libFuzzer harness: a neighbour block (schemas/neighbor_shard.h) through
 * dfm_nbr_block_open, resealed so that mutations reach the row checks behind the checksums; every row
 * of a block that opens must pass dfm_nbr_row_check again (the reader promises it checked them). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "schemas/neighbor_shard.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *b = fuzz_reseal_128(data, size, offsetof(dfm_nbr_header, payload_checksum));
    const char *path = b ? fuzz_file("block.nbrs", b, size) : NULL;
    free(b);
    dfm_nbr_block *blk;
    if (!path || dfm_nbr_block_open(path, &blk)) return 0;
    for (uint64_t i = 0; i < blk->hdr.n_rows; i++) {
        dfm_nbr_row r = dfm_nbr_block_row(blk, i);
        if (dfm_nbr_row_check(&r, blk->hdr.metric, dfm_nbr_id_bound(&blk->hdr))) abort();
    }
    dfm_nbr_block_close(blk);
    return 0;
}
