/* prefetch.c — the batch-reading thread and its ring of buffers (see prefetch.h). */
#include "trainer/prefetch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"

enum { SLOT_FREE = 0, SLOT_READY = 1, SLOT_TAKEN = 2 };

struct Prefetcher {
    DataSet *ds;
    Loader *ld;
    int B, L, with_t, rank, world, depth;
    PrefetchAllocator al;
    PrefetchBatch *slots;
    int *state;
    int head;   /* next slot the consumer takes */
    int tail;   /* next slot the producer fills */
    int stop;
    pthread_t thr;
    int started;
    pthread_mutex_t mu;      /* ring state */
    pthread_cond_t cv;
    pthread_mutex_t data_mu; /* data_batch */
};

static void *sys_alloc(size_t n, void *u) { (void)u; return malloc(n ? n : 1); }
static void sys_free(void *p, void *u) { (void)u; free(p); }

static void *producer(void *arg) {
    Prefetcher *pf = arg;
    size_t *skip = malloc((size_t)pf->B * sizeof(size_t));
    for (;;) {
        pthread_mutex_lock(&pf->mu);
        while (!pf->stop && pf->state[pf->tail] != SLOT_FREE) pthread_cond_wait(&pf->cv, &pf->mu);
        if (pf->stop) {
            pthread_mutex_unlock(&pf->mu);
            break;
        }
        PrefetchBatch *b = &pf->slots[pf->tail];
        pthread_mutex_unlock(&pf->mu);
        /* every rank advances the shared order and keeps its own slice (cmd_train.c) */
        for (int w = 0; w < pf->world; w++) loader_next(pf->ld, pf->B, w == pf->rank ? b->idx : skip);
        b->epoch = pf->ld->epoch;
        b->pos = pf->ld->pos;
        pthread_mutex_lock(&pf->data_mu);
        dfm_error_clear();
        b->rc = skip ? data_batch(pf->ds, b->idx, pf->B, pf->L, b->inputs, b->targets, pf->with_t ? b->tmem : NULL,
                                  pf->with_t ? b->tmask : NULL)
                     : DFM_FAIL(DFM_ENOMEM, "prefetch index buffer");
        snprintf(b->msg, sizeof b->msg, "%s", b->rc ? dfm_last_error() : "");
        pthread_mutex_unlock(&pf->data_mu);
        pthread_mutex_lock(&pf->mu);
        pf->state[pf->tail] = SLOT_READY;
        pf->tail = (pf->tail + 1) % pf->depth;
        pthread_cond_broadcast(&pf->cv);
        pthread_mutex_unlock(&pf->mu);
    }
    free(skip);
    return NULL;
}

int prefetch_start(Prefetcher **out, DataSet *ds, Loader *ld, int B, int L, int with_targets, int rank, int world,
                   int depth, const PrefetchAllocator *alloc) {
    *out = NULL;
    if (depth < 2 || B < 1 || world < 1) return DFM_FAIL(DFM_EARG, "prefetch: depth %d, batch %d", depth, B);
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
    pf->al = alloc ? *alloc : (PrefetchAllocator){sys_alloc, sys_free, NULL};
    pthread_mutex_init(&pf->mu, NULL);
    pthread_cond_init(&pf->cv, NULL);
    pthread_mutex_init(&pf->data_mu, NULL);
    pf->slots = calloc((size_t)depth, sizeof *pf->slots);
    pf->state = calloc((size_t)depth, sizeof *pf->state);
    if (!pf->slots || !pf->state) {
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
    if (pthread_create(&pf->thr, NULL, producer, pf)) {
        prefetch_stop(pf);
        return DFM_FAIL(DFM_EIO, "cannot start the prefetch thread");
    }
    pf->started = 1;
    *out = pf;
    return DFM_OK;
}

int prefetch_next(Prefetcher *pf, PrefetchBatch **batch, double *waited) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_mutex_lock(&pf->mu);
    while (pf->state[pf->head] != SLOT_READY) pthread_cond_wait(&pf->cv, &pf->mu);
    PrefetchBatch *b = &pf->slots[pf->head];
    pf->state[pf->head] = SLOT_TAKEN;
    pf->head = (pf->head + 1) % pf->depth;
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
        pthread_join(pf->thr, NULL);
    }
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
