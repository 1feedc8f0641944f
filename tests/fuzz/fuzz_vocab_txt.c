/* fuzz_vocab_txt.c — libFuzzer harness: a BERT vocab.txt (one token a line) through dfm_wordpiece_load
 * from a model folder holding only that file; a vocabulary that loads must tokenize a fixed text. */
#include <stdint.h>
#include <string.h>

#include "encoder/wordpiece.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fuzz_dir("vocab_model");
    char d[1024];
    strcpy(d, dir);
    if (!fuzz_file("vocab_model/vocab.txt", data, size)) return 0;
    dfm_wordpiece *wp;
    if (dfm_wordpiece_load(d, &wp)) return 0;
    static const char text[] = "Hello, World! unaffable caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 [MASK] x";
    int32_t ids[64];
    int n = dfm_wordpiece_encode(wp, text, strlen(text), 64, ids, 64, NULL);
    uint32_t v = dfm_wordpiece_vocab_size(wp);
    for (int i = 0; i < n && i < 64; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= v || !dfm_wordpiece_token(wp, ids[i])) abort();
    dfm_wordpiece_free(wp);
    return 0;
}
