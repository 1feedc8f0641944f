/* frozen_cache.h — `dfm-train train --cache-frozen`: each training sequence's frozen prefix (decoder layers up
 * to the first fusion layer and the predictor's pooled input: model_frozen_prefix_export) kept after its first
 * forward, so that later epochs start their forwards at the first fusion layer.
 *
 * The prefix depends on the tokens alone, and a row's values do not depend on the other rows of its batch,
 * so a cached run gives the bytes of an uncached one (tests/py/train/test_train_frozen_cache.py). A forward takes
 * the cache only when every row of its batch is cached (the first epoch computes and stores; a batch that
 * mixes the end of one epoch with the next is computed whole). Storage: an anonymous mapping of
 * n_seq x (T + NC) x C floats, touched only where filled; refused when it would exceed half the machine's
 * memory. CPU engine only. */
#ifndef DFM_TRAINER_FROZEN_CACHE_H
#define DFM_TRAINER_FROZEN_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/model/model.h"

typedef struct {
    size_t n_seq, fuse_floats, pool_floats; /* sequences it holds; floats per sequence of each part */
    float *fuse, *pool;                     /* [n_seq, T*C], [n_seq, NC*C] */
    uint8_t *have;                          /* [n_seq] */
    float *batch_fuse, *batch_pool;         /* one batch assembled for model_set_frozen_prefix */
    size_t map_bytes, hits, misses;         /* batches that took the cache / computed it */
} FrozenCache;

/* For sequences 0..n_seq-1 of T tokens in batches of B, on model m's shape (DFM mode). DFM_EARG (with the
 * size and a hint) when it would exceed half the physical memory; DFM_ENOMEM. */
int frozen_cache_create(FrozenCache *c, const DfmModel *m, size_t n_seq, int B, int T);
void frozen_cache_free(FrozenCache *c);
/* When every idx[0..B) is cached: the batch's prefix assembled and set on m for its next forward; returns 1.
 * Else 0 (the forward computes it). */
int frozen_cache_use(FrozenCache *c, DfmModel *m, const size_t *idx, int B);
/* After a forward that computed the prefix: store the rows of idx not cached yet. */
void frozen_cache_store(FrozenCache *c, const DfmModel *m, const size_t *idx, int B);

#endif
