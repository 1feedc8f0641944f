/* tok_regex.h — the patterns of a tokenizer.json (Oniguruma syntax, as `tokenizers` compiles them) run by
 * PCRE2, with Oniguruma's match iteration.
 *
 * Translation: Oniguruma's \s \S \w \W \h (Unicode White_Space, word = letter/mark/decimal/connector,
 * hex digit) are written out as explicit classes, where PCRE2's differ. Iteration (rust-onig's find_iter):
 * matches are leftmost, non-overlapping; an empty match is reported unless it ends where the previous match
 * ended, in which case the search moves on one character. `tokenizers` turns those matches into the
 * pieces of Split, Replace and the Replace decoder, so empty matches matter (an empty pattern matches
 * between every two characters).
 */
#ifndef DFM_TOK_REGEX_H
#define DFM_TOK_REGEX_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* A compiled pattern. Where Oniguruma's Unicode table (newer than PCRE2's) adds code points to a property the
 * pattern uses, it is compiled twice: as PCRE2 writes it (fast: PCRE2 tests its properties by table lookup)
 * and with the additions written out (exact). A text holding none of those code points — nearly all text —
 * matches the same with either, so it gets the fast one. */
typedef struct dfm_regex dfm_regex;

/* Compile pattern pat[0..len) (literal: a plain string to match as it is, else an Oniguruma regex) with
 * UTF and Unicode properties, JIT when available. On failure returns DFM_EUNSUPPORTED with the PCRE2
 * message, naming `where`. */
int dfm_regex_compile(const char *pat, size_t len, int literal, const char *where, dfm_regex **out);
void dfm_regex_free(dfm_regex *re);
/* The length of the shortest possible match (0: the pattern can match the empty string). */
uint32_t dfm_regex_minlength(const dfm_regex *re);

/* Per-thread scratch for matching (zero-initialise; free with dfm_regex_scratch_free). */
typedef struct {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
} dfm_regex_scratch;
void dfm_regex_scratch_free(dfm_regex_scratch *sc);

/* An iteration over one text: dfm_regex_start picks the compiled form for s[0..n) (valid UTF-8); each
 * dfm_regex_next returns 1 with the next match in [*ms, *me), 0 when there is none left, or an error code. */
typedef struct {
    const pcre2_code *code;
    size_t pos, last;
} dfm_regex_iter;
void dfm_regex_start(dfm_regex_iter *it, const dfm_regex *re, const uint8_t *s, size_t n);
int dfm_regex_next(dfm_regex_scratch *sc, dfm_regex_iter *it, const uint8_t *s, size_t n, size_t *ms, size_t *me);

#endif
