/* tok_sbuf.c — the tokenizer's growable byte buffer and string copies (see tok_sbuf.h). */
#include "tokenizer/tok_sbuf.h"
#include "tokenizer/tok_utf8.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>

int dfm_sbuf_reserve(sbuf *b, size_t need) {
    if (b->cap >= need) return DFM_OK;
    size_t c = b->cap ? b->cap : 256;
    while (c < need) c *= 2;
    char *q = realloc(b->p, c);
    if (!q) return DFM_FAIL(DFM_ENOMEM, "no memory for %zu bytes of text", c);
    b->p = q;
    b->cap = c;
    return DFM_OK;
}

int dfm_sbuf_add(sbuf *b, const void *s, size_t n) {
    DFM_TRY(dfm_sbuf_reserve(b, b->n + n + 1));
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return DFM_OK;
}

int dfm_sbuf_cp(sbuf *b, uint32_t cp) {
    uint8_t u[4];
    return dfm_sbuf_add(b, u, (size_t)dfm_utf8_put(cp, u));
}

char *dfm_tok_dupn(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) memcpy(p, s, n), p[n] = 0;
    return p;
}
