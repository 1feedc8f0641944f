/* fuzz_tokenizer_json.c — libFuzzer harness: a Hugging Face tokenizer.json through dfm_tokenizer_load;
 * a tokenizer that loads must encode a fixed text and the input's own bytes (every kind of character its
 * vocabulary and patterns hold) to ids below its vocabulary size, decode them with and without special
 * tokens, and have no more ids than the file has bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setenv("DFM_TOKENIZER_CACHE", "off", 1); /* the JSON parser only (fuzz_tokenizer_cache: the cache file) */
    const char *path = fuzz_file("tokenizer.json", data, size);
    dfm_tokenizer *tok;
    if (!path || dfm_tokenizer_load(path, &tok)) return 0;
    static const char text[] = "Hello, world! 123 \xc3\xa9t\xc3\xa9 \xe2\x80\x94 <|endoftext|>  tabs\tand\nlines "
                               "\xef\xac\x81 e\xcc\x81 \xe6\x97\xa5\xe6\x9c\xac \xe2\x96\x81x ##y </s> A\r\n";
    for (int k = 0; k < 2; k++) {
        const char *t = k ? (const char *)data : text;
        size_t n = k ? (size < 512 ? size : 512) : strlen(text);
        dfm_ids ids = {0};
        if (dfm_tokenizer_encode(tok, t, n, &ids, NULL) == 0) {
            for (size_t i = 0; i < ids.n; i++)
                if (ids.ids[i] >= dfm_tokenizer_vocab_size(tok)) abort();
            for (int skip = 0; skip < 2; skip++) {
                char *s = NULL;
                size_t dn = 0;
                if (dfm_tokenizer_decode(tok, ids.ids, ids.n, skip, &s, &dn) == 0) free(s);
            }
        }
        dfm_ids_free(&ids);
    }
    /* ids are bounded by the entries the file holds, not by the largest id it claims: every id needs at
     * least a byte of JSON */
    if (dfm_tokenizer_vocab_size(tok) > size) abort();
    dfm_tokenizer_eos_id(tok);
    dfm_tokenizer_describe(tok);
    dfm_tokenizer_free(tok);
    return 0;
}
