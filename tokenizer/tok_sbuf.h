/* tok_sbuf.h — the tokenizer's growable byte buffer (zero-initialise, free(b.p)) and string copies: the
 * ground floor of tokenizer/, used by the regex engine, the parsers and the encoder alike. */
#ifndef DFM_TOK_SBUF_H
#define DFM_TOK_SBUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

/* Room for need bytes in all. */
int dfm_sbuf_reserve(sbuf *b, size_t need);
/* Append n bytes and keep the content NUL-terminated (the NUL is not counted in n). */
int dfm_sbuf_add(sbuf *b, const void *s, size_t n);
/* Append code point cp as UTF-8. */
int dfm_sbuf_cp(sbuf *b, uint32_t cp);
/* A malloc'd NUL-terminated copy of n bytes (NULL: no memory). */
char *dfm_tok_dupn(const char *s, size_t n);

#endif
