/* bench_corpus_read.c — dfm's corpus reader alone (pipeline/corpus: JSONL, .zst, .gz, Parquet), for
 * bench/corpus/bench_corpus_formats.py: every document of the given inputs (one rank's whole share), and what it
 * read, so the driver can check it against pyarrow's reading of the same column.
 *
 *   build/bench/bench_corpus_read [--text-field F] INPUT...
 *
 * Prints one JSON line: {"docs": non-empty documents, "bytes": their text bytes, "empty": empty or null
 * documents, "crc32": CRC-32 (zlib's) of the texts concatenated, "cpu_s": process CPU seconds, "wall_s"}.
 */
#include <isa-l/crc.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "pipeline/corpus/corpus.h"

typedef struct {
    uint64_t docs, bytes;
    uint32_t crc;
} tally;

static int on_doc(const dfm_doc *d, void *user) {
    tally *t = user;
    t->docs++;
    t->bytes += d->text_len;
    t->crc = crc32_gzip_refl(t->crc, (const unsigned char *)d->text, d->text_len);
    return DFM_OK;
}

static double now(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    const char *field = "text";
    int a = 1;
    if (a + 1 < argc && !strcmp(argv[a], "--text-field")) {
        field = argv[a + 1];
        a += 2;
    }
    if (a >= argc) {
        fprintf(stderr, "usage: %s [--text-field F] INPUT...\n", argv[0]);
        return 2;
    }
    double c0 = now(CLOCK_PROCESS_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC);
    dfm_input_list l;
    tally t = {0};
    dfm_read_opts o = {.text_field = field};
    int rc = dfm_inputs_expand(argv + a, argc - a, &l);
    if (!rc) rc = dfm_corpus_read_share(&l, 0, 1, &o, on_doc, &t);
    if (rc) {
        fprintf(stderr, "bench_corpus_read: %s\n", dfm_last_error());
        return 1;
    }
    dfm_inputs_free(&l);
    printf("{\"docs\": %llu, \"bytes\": %llu, \"empty\": %llu, \"crc32\": %u, \"cpu_s\": %.4f, \"wall_s\": %.4f}\n",
           (unsigned long long)t.docs, (unsigned long long)t.bytes, (unsigned long long)o.empty_docs, t.crc,
           now(CLOCK_PROCESS_CPUTIME_ID) - c0, now(CLOCK_MONOTONIC) - w0);
    return 0;
}
