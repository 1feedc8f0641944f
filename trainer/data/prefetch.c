/* prefetch.c — the batch-reading thread and its ring of buffers (see prefetch.h). */
#include "trainer/data/prefetch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"

enum { SLOT_FREE = 0, SLOT_FILLING = 1, SLOT_READY = 2, SLOT_TAKEN = 3 };

struct Prefetcher {
    DataSet *ds;
    Loader *ld;
    int B, L, with_t, rank, world, depth, nthreads;
    PrefetchAllocator al;
    PrefetchBatch *slots;
    int *state;
    uint64_t next_seq;       /* the next batch to draw: slot next_seq % depth */
    uint64_t taken;          /* batches handed to the consumer: its next slot is taken % depth */
    int stop;
    pthread_t *thr;
    int started;             /* threads running */
    TargetReader **ts;       /* one target source per thread (a run's reader may not be shared) */
    size_t *skip;            /* [B] other ranks' indices (drawn under mu) */
    pthread_mutex_t mu;      /* ring state and the loader */
    pthread_cond_t cv;
    pthread_mutex_t data_mu; /* ds->tgt, for prefetch_data_batch */
};

typedef struct {
    Prefetcher *pf;
    int i;
} ProducerArg;

static void *sys_alloc(size_t n, void *u) { (void)u; return malloc(n ? n : 1); }
static void sys_free(void *p, void *u) { (void)u; free(p); }

/* Each thread claims the next batch in order (drawing its indices from the shared loader under the lock,
 * so the order is the synchronous loop's), then reads it with its own target source outside the lock. */
static void *producer(void *arg) {
    Prefetcher *pf = ((ProducerArg *)arg)->pf;
    TargetReader *ts = pf->ts[((ProducerArg *)arg)->i];
    free(arg);
    pthread_mutex_lock(&pf->mu);
    for (;;) {
        while (!pf->stop && pf->state[pf->next_seq % pf->depth] != SLOT_FREE) pthread_cond_wait(&pf->cv, &pf->mu);
        if (pf->stop) break;
        int slot = (int)(pf->next_seq++ % pf->depth);
        PrefetchBatch *b = &pf->slots[slot];
        pf->state[slot] = SLOT_FILLING;
        /* every rank advances the shared order and keeps its own slice (cmd_train.c) */
        for (int w = 0; w < pf->world; w++) loader_next(pf->ld, pf->B, w == pf->rank ? b->idx : pf->skip);
        b->epoch = pf->ld->epoch;
        b->pos = pf->ld->pos;
        pthread_mutex_unlock(&pf->mu);
        dfm_error_clear();
        b->rc = data_batch_from(pf->ds, ts, b->idx, pf->B, pf->L, b->inputs, b->targets, pf->with_t ? b->tmem : NULL,
                                pf->with_t ? b->tmask : NULL);
        snprintf(b->msg, sizeof b->msg, "%s", b->rc ? dfm_last_error() : "");
        pthread_mutex_lock(&pf->mu);
        pf->state[slot] = SLOT_READY;
        pthread_cond_broadcast(&pf->cv);
    }
    pthread_mutex_unlock(&pf->mu);
    return NULL;
}

int prefetch_start(Prefetcher **out, DataSet *ds, Loader *ld, int B, int L, int with_targets, int rank, int world,
                   int depth, int threads, const PrefetchAllocator *alloc) {
    *out = NULL;
    if (depth < 2 || B < 1 || world < 1 || threads < 1 || threads > 64)
        return DFM_FAIL(DFM_EARG, "prefetch: depth %d, batch %d, threads %d", depth, B, threads);
    Prefetcher *pf = calloc(1, sizeof *pf);
    if (!pf) return DFM_FAIL(DFM_ENOMEM, "prefetcher");
    pf->ds = ds;
    pf->ld = ld;
    pf->B = B;
    pf->L = L;
    pf->with_t = with_targets && ds->tgt;
    pf->rank = rank;
    pf->world = world;
    pf->depth = depth;
    pf->nthreads = threads;
    pf->al = alloc ? *alloc : (PrefetchAllocator){sys_alloc, sys_free, NULL};
    pthread_mutex_init(&pf->mu, NULL);
    pthread_cond_init(&pf->cv, NULL);
    pthread_mutex_init(&pf->data_mu, NULL);
    pf->slots = calloc((size_t)depth, sizeof *pf->slots);
    pf->state = calloc((size_t)depth, sizeof *pf->state);
    pf->thr = calloc((size_t)threads, sizeof *pf->thr);
    pf->ts = calloc((size_t)threads, sizeof *pf->ts);
    pf->skip = malloc((size_t)B * sizeof(size_t));
    if (!pf->slots || !pf->state || !pf->thr || !pf->ts || !pf->skip) {
        prefetch_stop(pf);
        return DFM_FAIL(DFM_ENOMEM, "prefetcher ring");
    }
    size_t N = (size_t)B * ds->T, S = pf->with_t ? (size_t)B * (ds->T / L) * ds->K : 0;
    for (int i = 0; i < depth; i++) {
        PrefetchBatch *b = &pf->slots[i];
        b->idx = pf->al.alloc((size_t)B * sizeof(size_t), pf->al.user);
        b->inputs = pf->al.alloc(N * sizeof(int), pf->al.user);
        b->targets = pf->al.alloc(N * sizeof(int), pf->al.user);
        if (S) {
            b->tmem = pf->al.alloc(S * ds->d * sizeof(float), pf->al.user);
            b->tmask = pf->al.alloc(S, pf->al.user);
        }
        if (!b->idx || !b->inputs || !b->targets || (S && (!b->tmem || !b->tmask))) {
            prefetch_stop(pf);
            return DFM_FAIL(DFM_ENOMEM, "prefetch buffers: %d x %.1f MiB. HINT: smaller --batch or --prefetch",
                            depth, (N * 8.0 + S * (ds->d * 4.0 + 1)) / 1048576.0);
        }
    }
    for (int i = 0; i < threads; i++) {
        int rc = pf->with_t ? data_targets_clone(ds, &pf->ts[i]) : DFM_OK;
        if (rc) {
            prefetch_stop(pf);
            return rc;
        }
    }
    for (int i = 0; i < threads; i++) {
        ProducerArg *a = malloc(sizeof *a);
        if (a) a->pf = pf, a->i = i;
        if (!a || pthread_create(&pf->thr[i], NULL, producer, a)) {
            free(a);
            prefetch_stop(pf);
            return DFM_FAIL(DFM_EIO, "cannot start loader thread %d", i);
        }
        pf->started++;
    }
    *out = pf;
    return DFM_OK;
}

int prefetch_next(Prefetcher *pf, PrefetchBatch **batch, double *waited) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_mutex_lock(&pf->mu);
    int head = (int)(pf->taken % pf->depth);
    while (pf->state[head] != SLOT_READY) pthread_cond_wait(&pf->cv, &pf->mu);
    PrefetchBatch *b = &pf->slots[head];
    pf->state[head] = SLOT_TAKEN;
    pf->taken++;
    pthread_mutex_unlock(&pf->mu);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (waited) *waited = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    *batch = b;
    if (b->rc) return DFM_FAIL(b->rc, "%s", b->msg);
    return DFM_OK;
}

void prefetch_release(Prefetcher *pf, PrefetchBatch *batch) {
    pthread_mutex_lock(&pf->mu);
    pf->state[batch - pf->slots] = SLOT_FREE;
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->mu);
}

int prefetch_data_batch(Prefetcher *pf, const size_t *idx, int B, int L, int *inputs, int *targets, float *tmem,
                        uint8_t *tmask) {
    pthread_mutex_lock(&pf->data_mu);
    int rc = data_batch(pf->ds, idx, B, L, inputs, targets, tmem, tmask);
    pthread_mutex_unlock(&pf->data_mu);
    return rc;
}

void prefetch_stop(Prefetcher *pf) {
    if (!pf) return;
    if (pf->started) {
        pthread_mutex_lock(&pf->mu);
        pf->stop = 1;
        pthread_cond_broadcast(&pf->cv);
        pthread_mutex_unlock(&pf->mu);
        for (int i = 0; i < pf->started; i++) pthread_join(pf->thr[i], NULL);
    }
    for (int i = 0; pf->ts && i < pf->nthreads; i++) data_targets_free(pf->ts[i]);
    free(pf->ts);
    free(pf->thr);
    free(pf->skip);
    for (int i = 0; pf->slots && i < pf->depth; i++) {
        PrefetchBatch *b = &pf->slots[i];
        pf->al.free(b->idx, pf->al.user);
        pf->al.free(b->inputs, pf->al.user);
        pf->al.free(b->targets, pf->al.user);
        pf->al.free(b->tmem, pf->al.user);
        pf->al.free(b->tmask, pf->al.user);
    }
    free(pf->slots);
    free(pf->state);
    pthread_mutex_destroy(&pf->mu);
    pthread_cond_destroy(&pf->cv);
    pthread_mutex_destroy(&pf->data_mu);
    free(pf);
}
