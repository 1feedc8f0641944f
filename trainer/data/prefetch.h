/* prefetch.h — background threads that read the next micro-batches (tokens, and target memory from
 * the LMDB shards) while the model computes, into a ring of host buffers.
 *
 * The training loop takes batches in order with prefetch_next (which reports how long it waited: the
 * stall, the time compute sat idle on data) and hands them back with prefetch_release. The buffers come
 * from an allocator the caller chooses: plain malloc on the CPU, pinned (page-locked) memory for the
 * CUDA trainer, so the host-to-device copy of a batch runs asynchronously and overlaps compute
 * (model_cuda_stage). Batches are exactly those the synchronous loop drew: the thread advances the
 * shared Loader W times per micro-batch and keeps rank r's slice (cmd_train.c's data-parallel rule), and
 * each batch carries the loader position after it, which is what a checkpoint stores.
 *
 * A run's target reader keeps one LMDB read transaction and may not be shared: each loader thread reads
 * through its own reader (data_targets_clone), and prefetch_data_batch serialises other callers
 * (evaluation) on ds's own.
 */
#ifndef DFM_TRAINER_PREFETCH_H
#define DFM_TRAINER_PREFETCH_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/data/data.h"

typedef struct {
    size_t *idx;         /* [B] sequence indices */
    int *inputs;         /* [B*T] */
    int *targets;        /* [B*T] */
    float *tmem;         /* [B*NC*K*d] or NULL (no targets) */
    uint8_t *tmask;      /* [B*NC*K] or NULL */
    uint64_t epoch, pos; /* the loader's position after this batch */
    int rc;              /* data_batch's result for this batch (DFM_OK or an error, message in msg) */
    char msg[512];
} PrefetchBatch;

/* Host buffer allocator: alloc returns NULL on failure; free(NULL) is a no-op. */
typedef struct {
    void *(*alloc)(size_t bytes, void *user);
    void (*free)(void *p, void *user);
    void *user;
} PrefetchAllocator;

typedef struct Prefetcher Prefetcher;

/* Start `threads` loader threads over loader ld (positioned; owned by them until prefetch_stop) for
 * batches of B sequences of ds->T tokens, chunk length L, with targets when with_targets (ds->tgt
 * attached; each thread reads through its own clone, data_targets_clone); rank of world ranks; depth >= 2
 * buffers (at most depth batches in flight, read in parallel by the threads, handed out in order).
 * alloc NULL: malloc. */
int prefetch_start(Prefetcher **out, DataSet *ds, Loader *ld, int B, int L, int with_targets, int rank, int world,
                   int depth, int threads, const PrefetchAllocator *alloc);
/* The next batch in order (blocks until it is read). *waited gets the seconds spent blocked. Returns
 * the batch's rc (its error message is set again on this thread). */
int prefetch_next(Prefetcher *pf, PrefetchBatch **batch, double *waited);
/* Hand a batch's buffers back for reuse (in the order they were taken). */
void prefetch_release(Prefetcher *pf, PrefetchBatch *batch);
/* data_batch for other callers, serialised with the thread. */
int prefetch_data_batch(Prefetcher *pf, const size_t *idx, int B, int L, int *inputs, int *targets, float *tmem,
                        uint8_t *tmask);
/* Stop and join the thread, free the buffers. NULL is a no-op. */
void prefetch_stop(Prefetcher *pf);

#endif
