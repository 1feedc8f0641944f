/* bench_faiss_build.c — IVF-PQ training, adding and search through the FAISS C API that dfm links (the
 * Debian libfaiss 1.7.3 build), on vectors bench/retrieval/bench_faiss_build.sh wrote; the same steps as
 * bench/retrieval/bench_faiss_build.py, which runs them with the faiss-cpu wheel.
 *
 *   bench_faiss_build BASE.f32 QUERIES.f32 DIM FACTORY TRAIN_N NPROBE K LABELS_OUT
 *
 * BASE.f32 / QUERIES.f32: raw little-endian float32 rows of DIM values. Trains on the first TRAIN_N
 * base rows, adds all of them, searches every query for K neighbours with nprobe NPROBE, writes the
 * labels (int64, row-major) to LABELS_OUT and prints one line:
 *   faiss=c-api-debian train_s=.. train_cpu=.. add_s=.. add_cpu=.. search_s=.. search_cpu=.. nq=..
 * (wall seconds and process CPU seconds per phase). Run it with OMP_NUM_THREADS=1 for single-thread
 * numbers. Built by `make bench-programs` (build/bench/bench_faiss_build). */
#include "common/blas_core.h"
#include "common/log.h"

#include <faiss/c_api/AutoTune_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/error_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Process CPU seconds, all threads (wall time: dfm_now). */
static double cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Whole file of float32 rows; *rows = its size / (dim * 4), which must divide exactly. */
static float *read_rows(const char *path, int dim, size_t *rows) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return NULL; }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    size_t row = (size_t)dim * sizeof(float);
    if (sz <= 0 || (size_t)sz % row) {
        fprintf(stderr, "%s: %ld bytes is not a whole number of %d-dim float32 rows\n", path, sz, dim);
        fclose(f);
        return NULL;
    }
    float *x = malloc((size_t)sz);
    if (!x || fread(x, 1, (size_t)sz, f) != (size_t)sz) {
        fprintf(stderr, "%s: cannot read %ld bytes\n", path, sz);
        free(x);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *rows = (size_t)sz / row;
    return x;
}

static int check(int rc, const char *what) {
    if (rc) fprintf(stderr, "bench_faiss_build: %s failed: %s\n", what, faiss_get_last_error());
    return rc;
}

int main(int argc, char **argv) {
    /* as dfm does: OpenBLAS's kernels for this CPU, not its SSE3 fallback (common/blas_core.h) */
    if (dfm_blas_core_env()) dfm_reexec_self(argv);
    if (argc != 9) {
        fprintf(stderr, "usage: %s BASE.f32 QUERIES.f32 DIM FACTORY TRAIN_N NPROBE K LABELS_OUT\n", argv[0]);
        return 2;
    }
    int dim = atoi(argv[3]), k = atoi(argv[7]);
    size_t train_n = strtoull(argv[5], NULL, 10), nb = 0, nq = 0;
    double nprobe = atof(argv[6]);
    if (dim <= 0 || k <= 0 || nprobe <= 0) { fprintf(stderr, "DIM, NPROBE and K must be positive\n"); return 2; }
    float *xb = read_rows(argv[1], dim, &nb), *xq = read_rows(argv[2], dim, &nq);
    if (!xb || !xq) return 1;
    if (train_n == 0 || train_n > nb) train_n = nb;
    FaissIndex *idx = NULL;
    FaissParameterSpace *ps = NULL;
    float *dist = malloc(nq * (size_t)k * sizeof *dist);
    idx_t *lab = malloc(nq * (size_t)k * sizeof *lab);
    if (!dist || !lab) { fprintf(stderr, "no memory for %zu x %d results\n", nq, k); return 1; }
    if (check(faiss_index_factory(&idx, dim, argv[4], METRIC_L2), "index_factory")) return 1;
    double w0 = dfm_now(), c0 = cpu();
    if (check(faiss_Index_train(idx, (idx_t)train_n, xb), "train")) return 1;
    double w1 = dfm_now(), c1 = cpu();
    if (check(faiss_Index_add(idx, (idx_t)nb, xb), "add")) return 1;
    double w2 = dfm_now(), c2 = cpu();
    if (check(faiss_ParameterSpace_new(&ps), "ParameterSpace") ||
        check(faiss_ParameterSpace_set_index_parameter(ps, idx, "nprobe", nprobe), "setting nprobe"))
        return 1;
    double w3 = dfm_now(), c3 = cpu();
    if (check(faiss_Index_search(idx, (idx_t)nq, xq, k, dist, lab), "search")) return 1;
    double w4 = dfm_now(), c4 = cpu();
    FILE *f = fopen(argv[8], "wb");
    if (!f || fwrite(lab, sizeof *lab, nq * (size_t)k, f) != nq * (size_t)k || fclose(f)) {
        perror(argv[8]);
        return 1;
    }
    printf("faiss=c-api-debian nb=%zu nq=%zu train_n=%zu train_s=%.3f train_cpu=%.3f add_s=%.3f add_cpu=%.3f "
           "search_s=%.3f search_cpu=%.3f\n", nb, nq, train_n, w1 - w0, c1 - c0, w2 - w1, c2 - c1, w4 - w3, c4 - c3);
    faiss_ParameterSpace_free(ps);
    faiss_Index_free(idx);
    free(xb), free(xq), free(dist), free(lab);
    return 0;
}
