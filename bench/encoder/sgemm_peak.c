/* sgemm_peak.c — OpenBLAS SGEMM GFLOP/s at a thread count: a large square product and the encoder's FFN
 * shape, best of 5, the peak bench/encoder/bench_encoder_cpu.sh measures the encoder's achieved GFLOP/s against.
 *
 *   sgemm_peak THREADS        prints "<2048^3 GFLOP/s> <4096x1536x384 GFLOP/s>"
 *
 * Built by `make bench-programs` (build/bench/sgemm_peak). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static double run(int M, int N, int K, int reps) {
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * N * K), *c = malloc(sizeof(float) * M * N);
    for (long i = 0; i < (long)M * K; i++) a[i] = (float)(i % 7) * 0.1f;
    for (long i = 0; i < (long)N * K; i++) b[i] = (float)(i % 5) * 0.1f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a, K, b, K, 0, c, N);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a, K, b, K, 0, c, N);
        double g = 2.0 * M * N * K / (now() - t) * 1e-9;
        if (g > best) best = g;
    }
    free(a), free(b), free(c);
    return best;
}
int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: sgemm_peak THREADS\n"); return 2; }
    int th = atoi(argv[1]);
    openblas_set_num_threads(th);
    printf("%.1f %.1f\n", run(2048, 2048, 2048, 5), run(4096, 1536, 384, 5));
    return 0;
}
