/* bench_encoder.c — dfm's CPU encoder through its C API, timed in-process the way the Python peers time
 * themselves (bench/encoder/encoder_peer.py): load the model, one untimed warm-up call on the first 64 texts,
 * then REPS timed dfm_encoder_encode calls over all texts. Threads: OMP_NUM_THREADS (the encoder sets
 * BLAS to the same count). One line per timed pass:
 *   dfm pass=R threads=T texts=N tokens=K batch=B|default seconds=S cpu_seconds=C gflop=G blas=CORE
 * (cpu_seconds: process CPU time of the pass, all threads; gflop: the model FLOPs the pass spent; CORE:
 * OpenBLAS's kernel set, corrected as dfm-train does on CPUs OpenBLAS does not know: common/blas_core.h).
 * With OUT_F32, the last pass's vectors are written there as raw little-endian float32 rows, N x dim,
 * for the agreement check. PRECISION: fp32 (default), bf16 or int8 (dfm encode --precision; encoder.h).
 * usage: bench_encoder MODEL_DIR TEXTS_JSONL [REPS [OUT_F32 [BATCH [PRECISION]]]]
 * Built by `make bench-programs` (build/bench/bench_encoder), run by bench/encoder/bench_encoder_cpu.sh. */
#include "common/blas_core.h"
#include "common/error.h"
#include "encoder/encoder.h"

#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Reads the "text" field of every line; returns the count, or -1 with a message. */
static int read_texts(const char *path, char ***text, size_t **len) {
    FILE *f = fopen(path, "r");
    if (!f) { perror(path); return -1; }
    size_t cap = 1024, n = 0, lcap = 0;
    char **t = malloc(cap * sizeof *t), *line = NULL;
    size_t *l = malloc(cap * sizeof *l);
    while (t && l && getline(&line, &lcap, f) > 0) {
        json_error_t err;
        json_t *j = json_loads(line, JSON_ALLOW_NUL, &err);
        json_t *s = json_object_get(j, "text");
        if (!json_is_string(s)) {
            fprintf(stderr, "%s: line %zu has no string \"text\" (%s)\n", path, n + 1, j ? "field" : err.text);
            json_decref(j);
            n = (size_t)-1;
            break;
        }
        if (n == cap) {
            cap *= 2;
            char **t2 = realloc(t, cap * sizeof *t);
            size_t *l2 = realloc(l, cap * sizeof *l);
            if (t2) t = t2;
            if (l2) l = l2;
            if (!t2 || !l2) { json_decref(j); n = (size_t)-1; break; }
        }
        l[n] = json_string_length(s);
        t[n] = malloc(l[n] + 1);
        if (!t[n]) { json_decref(j); n = (size_t)-1; break; }
        memcpy(t[n], json_string_value(s), l[n] + 1);
        n++;
        json_decref(j);
    }
    free(line);
    fclose(f);
    if (n == (size_t)-1 || !t || !l || n > 1u << 30) { fprintf(stderr, "%s: cannot read the texts\n", path); return -1; }
    *text = t;
    *len = l;
    return (int)n;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR TEXTS_JSONL [REPS [OUT_F32 [BATCH [PRECISION]]]]\n", argv[0]);
        return 2;
    }
    /* OpenBLAS's SIMD kernels on CPUs its dispatcher does not know, as dfm-train's main does
     * (common/blas_core.h); the core in use is printed with every pass */
    if (dfm_blas_core_env()) dfm_reexec_self(argv);
    int reps = argc > 3 ? atoi(argv[3]) : 1;
    const char *out_path = argc > 4 && argv[4][0] ? argv[4] : NULL;
    int batch = argc > 5 ? atoi(argv[5]) : 0;
    const char *prec_name = argc > 6 ? argv[6] : "fp32";
    int prec = dfm_encoder_precision_parse(prec_name);
    if (prec < 0) {
        fprintf(stderr, "precision '%s': use fp32, bf16 or int8\n", prec_name);
        return 2;
    }
    char **text;
    size_t *len;
    int n = read_texts(argv[2], &text, &len);
    if (n <= 0) return 1;
    dfm_encoder *enc = NULL;
    if (dfm_encoder_load(argv[1], DFM_DEVICE_CPU, prec, &enc) ||
        (batch > 0 && dfm_encoder_set_batch(enc, batch))) {
        fprintf(stderr, "%s\n", dfm_last_error());
        return 1;
    }
    int dim = dfm_encoder_dim(enc);
    float *out = malloc((size_t)n * dim * sizeof *out);
    if (!out) { fprintf(stderr, "out of memory for %d x %d floats\n", n, dim); return 1; }
    int rc = dfm_encoder_encode(enc, (const char *const *)text, len, n < 64 ? n : 64, out); /* warm-up */
    for (int r = 0; r < reps && !rc; r++) {
        dfm_encoder_stats s0, s1;
        dfm_encoder_get_stats(enc, &s0);
        double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        rc = dfm_encoder_encode(enc, (const char *const *)text, len, n, out);
        double dt = clock_s(CLOCK_MONOTONIC) - t0, dc = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        dfm_encoder_get_stats(enc, &s1);
        if (!rc)
            printf("dfm pass=%d threads=%d texts=%d tokens=%llu batch=%s seconds=%.4f cpu_seconds=%.4f gflop=%.3f blas=%s "
                   "precision=%s\n", r, omp_get_max_threads(), n, (unsigned long long)(s1.tokens - s0.tokens),
                   batch > 0 ? argv[5] : "default", dt, dc, (s1.flops - s0.flops) * 1e-9, dfm_blas_core_name(), prec_name);
    }
    if (rc) { fprintf(stderr, "%s\n", dfm_last_error()); return 1; }
    if (out_path) {
        FILE *f = fopen(out_path, "wb");
        if (!f || fwrite(out, sizeof *out, (size_t)n * dim, f) != (size_t)n * dim || fclose(f)) {
            perror(out_path);
            return 1;
        }
    }
    for (int i = 0; i < n; i++) free(text[i]);
    free(text);
    free(len);
    free(out);
    dfm_encoder_free(enc);
    return 0;
}
