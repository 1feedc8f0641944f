/* bench_tokenizer.c — dfm tokenizer throughput: encode the first MB megabytes of a corpus's texts
 * with T threads (pthreads, documents handed out by an atomic counter), one untimed warm-up pass
 * then REPS timed passes; prints one line per pass and a final "best" line:
 *   dfm threads=T bytes=B docs=D tokens=N seconds=S MB/s=X tokens/s=Y cpu_seconds=C MB/cpu-s=Z
 * (cpu_seconds: process CPU time of the best pass, all threads; robust to a machine shared with
 * other work, where wall time is not)
 * usage: bench_tokenizer TOKENIZER_JSON CORPUS_JSONL MB THREADS [REPS]
 * Built by `make bench-programs` (build/bench/bench_tokenizer), run by bench/bench_tokenizer.sh. */
#include "common/error.h"
#include "pipeline/tokenizer/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const dfm_tokenizer *tok;
    char **text;
    size_t *len, n;
    atomic_size_t next;
    atomic_size_t tokens;
    atomic_int failed;
} job;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *worker(void *p) {
    job *j = p;
    dfm_ids ids = {0};
    size_t ntok = 0;
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n) break;
        ids.n = 0;
        if (dfm_tokenizer_encode(j->tok, j->text[i], j->len[i], &ids, NULL)) {
            fprintf(stderr, "encode failed: %s\n", dfm_last_error());
            atomic_store(&j->failed, 1);
            break;
        }
        ntok += ids.n;
    }
    dfm_ids_free(&ids);
    atomic_fetch_add(&j->tokens, ntok);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON CORPUS_JSONL MB THREADS [REPS]\n", argv[0]);
        return 2;
    }
    double mb = atof(argv[3]);
    int threads = atoi(argv[4]), reps = argc > 5 ? atoi(argv[5]) : 3;
    dfm_tokenizer *tok = NULL;
    if (dfm_tokenizer_load(argv[1], &tok)) {
        fprintf(stderr, "%s\n", dfm_last_error());
        return 1;
    }
    FILE *f = fopen(argv[2], "r");
    if (!f) { perror(argv[2]); return 1; }
    size_t cap = 1024, n = 0, bytes = 0, limit = (size_t)(mb * 1e6);
    char **text = malloc(cap * sizeof *text);
    size_t *len = malloc(cap * sizeof *len);
    char *line = NULL;
    size_t lcap = 0;
    while (bytes < limit && getline(&line, &lcap, f) > 0) {
        json_t *j = json_loads(line, JSON_ALLOW_NUL, NULL);
        json_t *t = json_object_get(j, "text");
        if (json_is_string(t)) {
            size_t l = json_string_length(t);
            if (bytes + l > limit) l = limit - bytes; /* may cut a character: encode replaces it, as HF's input would be cut too */
            if (n == cap) cap *= 2, text = realloc(text, cap * sizeof *text), len = realloc(len, cap * sizeof *len);
            text[n] = malloc(l + 1);
            memcpy(text[n], json_string_value(t), l);
            text[n][l] = 0;
            len[n++] = l;
            bytes += l;
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
    double best = 1e30, best_cpu = 1e30;
    size_t tokens = 0;
    for (int r = -1; r < reps; r++) {
        job jb = {.tok = tok, .text = text, .len = len, .n = n};
        pthread_t th[64];
        double t0 = now(), c0 = cpu_now();
        for (int i = 0; i < threads && i < 64; i++) pthread_create(&th[i], NULL, worker, &jb);
        for (int i = 0; i < threads && i < 64; i++) pthread_join(th[i], NULL);
        double dt = now() - t0, dc = cpu_now() - c0;
        if (jb.failed) return 1;
        tokens = jb.tokens;
        if (r < 0) continue; /* warm-up (fills the piece cache, as HF's) */
        if (dt < best) best = dt;
        if (dc < best_cpu) best_cpu = dc;
        printf("dfm pass %d threads=%d seconds=%.3f cpu_seconds=%.3f\n", r, threads, dt, dc);
    }
    printf("dfm threads=%d bytes=%zu docs=%zu tokens=%zu seconds=%.3f MB/s=%.2f tokens/s=%.0f cpu_seconds=%.3f "
           "MB/cpu-s=%.2f\n", threads, bytes, n, tokens, best, bytes / best / 1e6, tokens / best, best_cpu,
           bytes / best_cpu / 1e6);
    for (size_t i = 0; i < n; i++) free(text[i]);
    free(text);
    free(len);
    dfm_tokenizer_free(tok);
    return 0;
}
