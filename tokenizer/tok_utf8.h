/* tok_utf8.h — UTF-8 decoding, encoding and repair, and GPT-2's byte-level alphabet (tok_utf8.c). */
#ifndef DFM_TOK_UTF8_H
#define DFM_TOK_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 prefix of s[0..n) (== n when valid). */
size_t dfm_utf8_valid_prefix(const uint8_t *s, size_t n);
/* Replace each maximal invalid subpart by U+FFFD (Python's decode("utf-8", "replace")). *out is
 * malloc'd; *n_rep receives the number of replacements. */
int dfm_utf8_replace(const uint8_t *s, size_t n, char **out, size_t *out_len, size_t *n_rep);
/* Decode one code point of valid UTF-8 at s (n > 0 bytes left); returns its byte length. */
int dfm_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);
/* Encode cp into out (4 bytes room); returns the byte count. */
int dfm_utf8_put(uint32_t cp, uint8_t *out);
/* GPT-2 byte alphabet: byte -> code point, and code point -> byte (-1 when not in the alphabet). */
uint32_t dfm_bytelevel_cp(uint8_t b);
int dfm_bytelevel_byte(uint32_t cp);

#endif
