/* fuzz_jsonl.c — libFuzzer harness: a JSONL corpus file (one {"text": ...} object a line) through
 * dfm_corpus_read_share, whole and split between two ranks, strict and with skip_bad. Every document
 * handed out must lie inside the file. */
#include <stdint.h>
#include <stdlib.h>

#include "pipeline/corpus/corpus.h"
#include "tests/fuzz/fuzz_file.h"

static int on_doc(const dfm_doc *doc, void *user) {
    uint64_t size = *(const uint64_t *)user;
    if (!doc->text || doc->offset >= size || doc->text_len > size) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("corpus.jsonl", data, size);
    if (!path) return 0;
    char *pat[1] = {(char *)path};
    dfm_input_list l;
    if (dfm_inputs_expand(pat, 1, &l)) return 0;
    uint64_t n = size;
    for (int skip = 0; skip < 2; skip++)
        for (int ranks = 1; ranks <= 2; ranks++)
            for (int r = 0; r < ranks; r++) {
                dfm_read_opts o = {.text_field = "text", .skip_bad = skip};
                dfm_corpus_read_share(&l, r, ranks, &o, on_doc, &n);
            }
    dfm_inputs_free(&l);
    return 0;
}
