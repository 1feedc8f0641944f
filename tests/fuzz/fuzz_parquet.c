/* fuzz_parquet.c — libFuzzer harness: a Parquet file (corpus.parquet) through dfm_corpus_read_share,
 * i.e. dfm's shim over Arrow's C++ reader (pipeline/corpus/parquet_text.cc): whole and split between two
 * and three ranks by row group, strict and with skip_bad. A damaged footer, page header or page must end
 * in an error code (the shim turns every exception into one), never a crash, a hang or an allocation
 * above the reader's memory cap; every document handed out is non-empty valid text of bounded size.
 * Arrow itself is not instrumented here (the pyarrow wheel's build): upstream fuzzes it in OSS-Fuzz
 * (parquet-arrow-fuzz); this harness covers the shim, the row-group split and what the library returns. */
#include <stdint.h>
#include <stdlib.h>

#include "pipeline/corpus/corpus.h"
#include "pipeline/corpus/parquet_text.h"
#include "tests/fuzz/fuzz_file.h"

static int on_doc(const dfm_doc *doc, void *user) {
    (void)user;
    if (!doc->text || doc->text_len == 0 || doc->text_len > DFM_PARQUET_MAX_MEMORY) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("corpus.parquet", data, size);
    if (!path) return 0;
    char *pat[1] = {(char *)path};
    dfm_input_list l;
    if (dfm_inputs_expand(pat, 1, &l)) return 0;
    for (int ranks = 1; ranks <= 3; ranks++)
        for (int r = 0; r < ranks; r++) {
            dfm_read_opts o = {.text_field = "text", .skip_bad = ranks == 2};
            dfm_corpus_read_share(&l, r, ranks, &o, on_doc, NULL);
        }
    dfm_inputs_free(&l);
    return 0;
}
