/* frozen_cache.c — the frozen prefixes of training sequences across epochs (see frozen_cache.h). */
#include "trainer/data/frozen_cache.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/error.h"

int frozen_cache_create(FrozenCache *c, const DfmModel *m, size_t n_seq, int B, int T) {
    memset(c, 0, sizeof *c);
    if (!m->dc.enabled) return DFM_FAIL(DFM_EARG, "--cache-frozen: a pretraining run has no frozen layers");
    int C = m->bc.dec.hidden, NC = T / m->dc.chunk_len;
    c->n_seq = n_seq;
    c->fuse_floats = (size_t)T * C;
    c->pool_floats = (size_t)NC * C;
    size_t bytes = n_seq * (c->fuse_floats + c->pool_floats) * sizeof(float);
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    double half = pages > 0 && psize > 0 ? 0.5 * (double)pages * (double)psize : 0.0;
    if (half > 0 && (double)bytes > half)
        return DFM_FAIL(DFM_EARG, "--cache-frozen needs %.1f GB for %zu training sequences of %d tokens (width %d), "
                        "more than half of this machine's %.1f GB. HINT: drop --cache-frozen, or train on fewer "
                        "sequences per run", bytes / 1e9, n_seq, T, C, 2 * half / 1e9);
    c->map_bytes = bytes ? bytes : 1;
    void *p = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return DFM_FAIL(DFM_ENOMEM, "--cache-frozen: cannot map %.1f GB", bytes / 1e9);
    c->fuse = p;
    c->pool = c->fuse + n_seq * c->fuse_floats;
    c->have = calloc(n_seq ? n_seq : 1, 1);
    c->batch_fuse = malloc((size_t)B * c->fuse_floats * sizeof(float));
    c->batch_pool = malloc((size_t)B * c->pool_floats * sizeof(float));
    if (!c->have || !c->batch_fuse || !c->batch_pool) {
        frozen_cache_free(c);
        return DFM_FAIL(DFM_ENOMEM, "--cache-frozen: no memory for a batch");
    }
    return DFM_OK;
}

void frozen_cache_free(FrozenCache *c) {
    if (c->fuse) munmap(c->fuse, c->map_bytes);
    free(c->have);
    free(c->batch_fuse);
    free(c->batch_pool);
    memset(c, 0, sizeof *c);
}

int frozen_cache_use(FrozenCache *c, DfmModel *m, const size_t *idx, int B) {
    for (int b = 0; b < B; b++)
        if (idx[b] >= c->n_seq || !c->have[idx[b]]) {
            c->misses++;
            return 0;
        }
    for (int b = 0; b < B; b++) {
        memcpy(c->batch_fuse + (size_t)b * c->fuse_floats, c->fuse + idx[b] * c->fuse_floats,
               c->fuse_floats * sizeof(float));
        memcpy(c->batch_pool + (size_t)b * c->pool_floats, c->pool + idx[b] * c->pool_floats,
               c->pool_floats * sizeof(float));
    }
    model_set_frozen_prefix(m, c->batch_fuse, c->batch_pool);
    c->hits++;
    return 1;
}

void frozen_cache_store(FrozenCache *c, const DfmModel *m, const size_t *idx, int B) {
    for (int b = 0; b < B; b++) {
        if (idx[b] >= c->n_seq || c->have[idx[b]]) continue;
        model_frozen_prefix_export(m, b, c->fuse + idx[b] * c->fuse_floats, c->pool + idx[b] * c->pool_floats);
        c->have[idx[b]] = 1;
    }
}
