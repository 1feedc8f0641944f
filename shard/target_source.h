/* target_source.h — the real data source of `dfm write-targets`: the retrieve stage's neighbour blocks
 * (RUN/retrieve/nbr-*.bin, readable by every rank) and the encode stage's embedding blocks
 * (RUN/encode/emb-*.bin), of which rank r opens and serves only its own contiguous run of blocks
 * [r*B/P, (r+1)*B/P) of the B blocks. Rows are served exactly as stored (fp16/bf16 widened to fp32,
 * which is lossless), never reconstructed from an index. Sequence starts come from the chunk stage's
 * seq-len / chunk-len (chunk ids are packed in whole sequences).
 */
#ifndef DFM_TARGET_SOURCE_H
#define DFM_TARGET_SOURCE_H

#include "common/mpiutil.h"
#include "shard/target_build.h"

typedef struct dfm_target_real dfm_target_real;

/* Collective-free open on every rank; fills src. Needs the chunk, encode and retrieve stages complete
 * (DFM_ESTATE naming the missing one). */
int dfm_target_real_open(const dfm_mpi *m, const char *run_dir, dfm_target_real **out, dfm_target_source *src);
/* NULL is a no-op. */
void dfm_target_real_close(dfm_target_real *r);

#endif
