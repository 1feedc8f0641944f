/* fuzz_gzip.c — libFuzzer harness: a gzip-compressed JSONL corpus file (corpus.jsonl.gz, one member or
 * several) through dfm_corpus_read_share, strict and with skip_bad, and the same bytes as a .txt.gz.
 * Corrupt, truncated or trailing data must end in an error code, never a crash; every document handed
 * out is non-empty and bounded by the decompressed sizes gzip allows (1032 bytes out per byte in). */
#include <stdint.h>
#include <stdlib.h>

#include "pipeline/corpus/corpus.h"
#include "tests/fuzz/fuzz_file.h"

static int on_doc(const dfm_doc *doc, void *user) {
    uint64_t size = *(const uint64_t *)user;
    if (!doc->text || doc->text_len == 0 || doc->text_len > 1032 * size + 64) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint64_t n = size;
    for (int kind = 0; kind < 2; kind++) {
        const char *path = fuzz_file(kind ? "corpus.txt.gz" : "corpus.jsonl.gz", data, size);
        if (!path) return 0;
        char *pat[1] = {(char *)path};
        dfm_input_list l;
        if (dfm_inputs_expand(pat, 1, &l)) return 0;
        for (int skip = 0; skip < 2; skip++) {
            dfm_read_opts o = {.text_field = "text", .skip_bad = skip};
            dfm_corpus_read_share(&l, 0, 1, &o, on_doc, &n);
        }
        dfm_inputs_free(&l);
    }
    return 0;
}
