/* bench_tokenizer.c — dfm tokenizer throughput on cold and warm text: the first MB megabytes of a
 * corpus's texts, T threads (pthreads, documents handed out by an atomic counter).
 *
 *   bench_tokenizer TOKENIZER_JSON CORPUS_JSONL MB THREADS [IDS_OUT]
 *
 * One process is one measurement: load the tokenizer (timed: with the cache file of
 * schemas/tokenizer_cache.md this is a mapping), encode every text once with an empty piece cache
 * ("cold": what `dfm chunk` does with a corpus) and then again ("warm": every piece already cached,
 * which is all an earlier version of this benchmark timed). The two passes must give the same ids.
 * IDS_OUT receives the ids, per document a u32 count then the u32 ids (little-endian), for
 * bench_tokenizer.sh to compare with the peers'. Prints one line:
 *   dfm threads=T bytes=B docs=D tokens=N load_s=.. load_cpu=.. cold_s=.. cold_cpu=.. warm_s=.. warm_cpu=..
 * (wall seconds and process CPU seconds, all threads). Built by `make bench-programs`
 * (build/bench/bench_tokenizer); run by bench/tokenizer/bench_tokenizer.sh, which interleaves it with the peers. */
#include "common/error.h"
#include "tokenizer/tokenizer.h"

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
    dfm_ids *out; /* per document */
    atomic_size_t next;
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
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n) break;
        j->out[i].n = 0;
        if (dfm_tokenizer_encode(j->tok, j->text[i], j->len[i], &j->out[i], NULL)) {
            fprintf(stderr, "encode failed: %s\n", dfm_last_error());
            atomic_store(&j->failed, 1);
            break;
        }
    }
    return NULL;
}

/* Encode every text with `threads` threads into out[]; wall and CPU seconds. */
static int pass(const dfm_tokenizer *tok, char **text, size_t *len, size_t n, int threads, dfm_ids *out, double *wall,
                double *cpu) {
    job jb = {.tok = tok, .text = text, .len = len, .n = n, .out = out};
    pthread_t th[64];
    double t0 = now(), c0 = cpu_now();
    for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, worker, &jb);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    *wall = now() - t0, *cpu = cpu_now() - c0;
    return jb.failed ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON CORPUS_JSONL MB THREADS [IDS_OUT]\n", argv[0]);
        return 2;
    }
    double mb = atof(argv[3]);
    int threads = atoi(argv[4]);
    if (threads < 1 || threads > 64) { fprintf(stderr, "THREADS must be 1..64\n"); return 2; }
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
            if (bytes + l > limit) l = limit - bytes; /* may cut a character: encode replaces it, as the peers' input is cut */
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

    dfm_tokenizer *tok = NULL;
    double l0 = now(), lc0 = cpu_now();
    if (dfm_tokenizer_load(argv[1], &tok)) {
        fprintf(stderr, "%s\n", dfm_last_error());
        return 1;
    }
    double load_s = now() - l0, load_cpu = cpu_now() - lc0;
    dfm_ids *cold = calloc(n ? n : 1, sizeof *cold), *warm = calloc(n ? n : 1, sizeof *warm);
    double cold_s, cold_cpu, warm_s, warm_cpu;
    if (pass(tok, text, len, n, threads, cold, &cold_s, &cold_cpu) ||
        pass(tok, text, len, n, threads, warm, &warm_s, &warm_cpu))
        return 1;
    size_t tokens = 0;
    for (size_t i = 0; i < n; i++) {
        if (cold[i].n != warm[i].n || (cold[i].n && memcmp(cold[i].ids, warm[i].ids, cold[i].n * sizeof(uint32_t)))) {
            fprintf(stderr, "document %zu: the warm pass gave other ids than the cold pass\n", i);
            return 1;
        }
        tokens += cold[i].n;
    }
    if (argc > 5) {
        FILE *o = fopen(argv[5], "wb");
        if (!o) { perror(argv[5]); return 1; }
        for (size_t i = 0; i < n; i++) {
            uint32_t c = (uint32_t)cold[i].n;
            fwrite(&c, 4, 1, o);
            if (c) fwrite(cold[i].ids, 4, c, o);
        }
        if (fclose(o)) { perror(argv[5]); return 1; }
    }
    printf("dfm threads=%d bytes=%zu docs=%zu tokens=%zu load_s=%.4f load_cpu=%.4f cold_s=%.3f cold_cpu=%.3f "
           "warm_s=%.3f warm_cpu=%.3f from_cache=%d\n", threads, bytes, n, tokens, load_s, load_cpu, cold_s, cold_cpu,
           warm_s, warm_cpu, dfm_tokenizer_from_cache(tok));
    for (size_t i = 0; i < n; i++) free(text[i]), dfm_ids_free(&cold[i]), dfm_ids_free(&warm[i]);
    free(text), free(len), free(cold), free(warm);
    dfm_tokenizer_free(tok);
    return 0;
}
