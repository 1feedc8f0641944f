/* fuzz_tokenizer_cache.c — libFuzzer harness: a tokenizer cache file (schemas/tokenizer_cache.md) through
 * dfm_tokenizer_load_cachefile. The input is resealed first (both checksums recomputed) and loaded for the
 * source hash and size its own header names, so mutations get past the checksums and the stale check to
 * the section, string, table and meta checks behind them. A tokenizer that loads must encode a fixed
 * text to ids below its vocabulary size and decode them. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *b = malloc(size ? size : 1);
    if (!b) return 0;
    memcpy(b, data, size);
    uint64_t src_hash = 0, src_bytes = 0;
    if (size >= 512) { /* the checksums: payload at 496 over [512, n), header at 504 over [0, 504) */
        memcpy(&src_hash, b + 16, 8);
        memcpy(&src_bytes, b + 24, 8);
        uint64_t pc = XXH3_64bits(b + 512, size - 512), hc;
        memcpy(b + 496, &pc, 8);
        hc = XXH3_64bits(b, 504);
        memcpy(b + 504, &hc, 8);
    }
    const char *path = fuzz_file("t.dfmtok", b, size);
    free(b);
    dfm_tokenizer *tok;
    if (!path || dfm_tokenizer_load_cachefile(path, src_hash, src_bytes, &tok)) return 0;
    static const char text[] = "Hello, world! 123 \xc3\xa9t\xc3\xa9 \xe2\x80\x94 <|endoftext|> <s>  tabs\tand\nlines";
    dfm_ids ids = {0};
    if (dfm_tokenizer_encode(tok, text, strlen(text), &ids, NULL) == 0) {
        for (size_t i = 0; i < ids.n; i++)
            if (ids.ids[i] >= dfm_tokenizer_vocab_size(tok)) abort();
        char *s = NULL;
        size_t n = 0;
        if (dfm_tokenizer_decode(tok, ids.ids, ids.n, 0, &s, &n) == 0) free(s);
    }
    dfm_ids_free(&ids);
    dfm_tokenizer_eos_id(tok);
    dfm_tokenizer_describe(tok);
    dfm_tokenizer_free(tok);
    return 0;
}
