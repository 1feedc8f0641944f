/* bench_loader.c — how fast dfm-train's loader threads (trainer/data/prefetch.h) deliver micro-batches with
 * target memory read from a run's LMDB shards: batches/s and target records/s for 1, 2, 4 threads.
 * Built by `make bench-programs`, run by bench/loader/bench_loader.sh:
 *   bench_loader RUN SEQ_LEN BATCH N_BATCHES [CHUNK_LEN] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/error.h"
#include "trainer/data/data.h"
#include "trainer/data/prefetch.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: bench_loader RUN SEQ_LEN BATCH N_BATCHES [CHUNK_LEN]\n");
        return 2;
    }
    const char *run = argv[1];
    int T = atoi(argv[2]), B = atoi(argv[3]), NB = atoi(argv[4]), L = argc > 5 ? atoi(argv[5]) : 32;
    DataSet ds = {0};
    if (data_open(run, T, &ds) || data_open_targets(&ds, run, run, L, 0, 0)) {
        fprintf(stderr, "bench_loader: %s\n", dfm_last_error());
        return 1;
    }
    printf("| loader threads | batches/s (%d x %d) | target records/s | ms per batch |\n|---:|---:|---:|---:|\n", B, T);
    for (int th = 1; th <= 4; th *= 2) {
        Loader ld;
        Prefetcher *pf;
        if (loader_init(&ld, 0, ds.n_seq, 1, 1) || prefetch_start(&pf, &ds, &ld, B, L, 1, 0, 1, 8, th, NULL)) {
            fprintf(stderr, "bench_loader: %s\n", dfm_last_error());
            return 1;
        }
        double t0 = now();
        for (int i = 0; i < NB; i++) {
            PrefetchBatch *b;
            if (prefetch_next(pf, &b, NULL)) {
                fprintf(stderr, "bench_loader: %s\n", dfm_last_error());
                return 1;
            }
            prefetch_release(pf, b);
        }
        double dt = now() - t0;
        printf("| %d | %.1f | %.0f | %.2f |\n", th, NB / dt, NB / dt * B * (T / L), dt / NB * 1e3);
        prefetch_stop(pf);
        loader_free(&ld);
    }
    data_close(&ds);
    return 0;
}
