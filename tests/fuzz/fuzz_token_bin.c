/* fuzz_token_bin.c — libFuzzer harness: an llm.c token shard (.bin: 256 int32 header, then uint16 or
 * uint32 ids) through both of its readers: the pipeline's corpus reader (dfm_corpus_read_share on a
 * pretokenized input) and the trainer's data_open. */
#include <stdint.h>
#include <stdlib.h>

#include "pipeline/corpus/corpus.h"
#include "tests/fuzz/fuzz_file.h"
#include "trainer/data/data.h"

enum { VOCAB = 50257, EOS = 50256 };

static int on_doc(const dfm_doc *doc, void *user) {
    if (!doc->tokens) abort();
    for (size_t i = 0; i < doc->n_tokens; i++)
        if (doc->tokens[i] >= VOCAB) abort(); /* the reader promises ids below vocab_size */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("tokens.bin", data, size);
    if (!path) return 0;
    char *pat[1] = {(char *)path};
    dfm_input_list l;
    if (dfm_inputs_expand(pat, 1, &l) == 0) {
        for (int skip = 0; skip < 2; skip++) {
            dfm_read_opts o = {.skip_bad = skip, .vocab_size = VOCAB, .eos_id = EOS};
            dfm_corpus_read_share(&l, 0, 1, &o, on_doc, NULL);
        }
        dfm_inputs_free(&l);
    }
    DataSet ds;
    if (data_open(path, 4, &ds) == 0) data_close(&ds);
    return 0;
}
