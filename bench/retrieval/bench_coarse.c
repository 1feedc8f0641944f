/* bench_coarse — the rate of an IVF index's coarse assignment (FAISS's flat quantiser search, the
 * step dfm_ivf_assign takes once per query and FAISS's add takes once per vector) at the sizes of a big
 * job, which bench/retrieval/scaling.sh's small points cannot reach: CPU seconds per query x centroid x dimension.
 *
 *   bench_coarse NLIST DIM NQ NPROBE [REPS]
 *
 * Random unit centroids (dfm_ivf_trained puts them into an IVFn,Flat index), NQ random unit queries,
 * assigned REPS times (default 3) with nprobe lists each (1: what add does); prints one JSON line with
 * the median CPU seconds (process CPU time, all threads) and the rate. One thread by default
 * (OMP_NUM_THREADS / OPENBLAS_NUM_THREADS as set by the caller). */
#include "common/blas_core.h"
#include "common/error.h"
#include "common/log.h"
#include "retriever/index.h"
#include "retriever/ivf.h"
#include "retriever/work.h"
#include "schemas/neighbor_shard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t st = 88172645463325252ull;
static float urand(void) {
    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
    return (float)((double)(st >> 11) / 9007199254740992.0 * 2 - 1);
}
static void unit_rows(float *x, size_t n, int d) {
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        for (int t = 0; t < d; t++) {
            x[i * d + t] = urand();
            s += (double)x[i * d + t] * x[i * d + t];
        }
        for (int t = 0; t < d; t++) x[i * d + t] = (float)(x[i * d + t] / sqrt(s));
    }
}
static int cmp_d(const void *a, const void *b) { return *(const double *)a < *(const double *)b ? -1 : *(const double *)a > *(const double *)b; }

int main(int argc, char **argv) {
    if (dfm_blas_core_env()) dfm_reexec_self(argv); /* OpenBLAS's own kernels, as dfm runs */
    if (argc < 5) {
        fprintf(stderr, "usage: %s NLIST DIM NQ NPROBE [REPS]\n", argv[0]);
        return 2;
    }
    const uint64_t nlist = strtoull(argv[1], NULL, 10), nq = strtoull(argv[3], NULL, 10), nprobe = strtoull(argv[4], NULL, 10);
    const int d = atoi(argv[2]), reps = argc > 5 ? atoi(argv[5]) : 3;
    if (!nlist || d <= 0 || !nq || !nprobe || nprobe > nlist || reps < 1 || reps > 99) return 2;
    char fac[64];
    snprintf(fac, sizeof fac, "IVF%llu,Flat", (unsigned long long)nlist);
    dfm_index_plan plan;
    if (dfm_index_plan_make(fac, nlist * 100, (uint32_t)d, 1, 0, DFM_METRIC_IP, 0, &plan)) goto fail;
    float *cent = malloc(sizeof(float) * nlist * d), *q = malloc(sizeof(float) * nq * d), *dis = malloc(sizeof(float) * nq * nprobe);
    int64_t *lists = malloc(sizeof(int64_t) * nq * nprobe);
    if (!cent || !q || !dis || !lists) return 1;
    unit_rows(cent, nlist, d);
    unit_rows(q, nq, d);
    uint8_t *buf = NULL;
    size_t len = 0;
    FaissIndex *idx = NULL;
    dfm_ivf v;
    if (dfm_ivf_trained(&plan, (uint32_t)d, cent, NULL, 0, NULL, &buf, &len) || dfm_index_from_buffer(buf, len, &idx) || dfm_ivf_open(idx, &v))
        goto fail;
    double cpu[99];
    for (int r = 0; r < reps; r++) {
        double c0 = dfm_cpu_now();
        if (dfm_ivf_assign(&v, (size_t)nq, q, (size_t)nprobe, lists, dis)) goto fail;
        cpu[r] = dfm_cpu_now() - c0;
    }
    qsort(cpu, (size_t)reps, sizeof *cpu, cmp_d);
    double med = cpu[reps / 2];
    printf("{\"nlist\":%llu,\"dim\":%d,\"nq\":%llu,\"nprobe\":%llu,\"reps\":%d,\"cpu_s\":%.6f,\"s_per_unit\":%.4e,\"blas\":\"%s\"}\n",
           (unsigned long long)nlist, d, (unsigned long long)nq, (unsigned long long)nprobe, reps, med,
           med / ((double)nq * (double)nlist * (double)d), dfm_blas_core_name());
    dfm_ivf_close(&v);
    faiss_Index_free(idx);
    free(buf), free(cent), free(q), free(dis), free(lists);
    return 0;
fail:
    fprintf(stderr, "bench_coarse: %s\n", dfm_last_error());
    return 1;
}
