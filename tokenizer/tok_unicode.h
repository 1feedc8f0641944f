/* tok_unicode.h — the character classes and mappings of Hugging Face `tokenizers`, code point by code point.
 *
 * `tokenizers` mixes Unicode tables of several ages (Rust's standard library, the old `unicode_categories`
 * crate, `unicode-normalization-alignments`, a SentencePiece script table), so today's Unicode categories
 * do not reproduce it. These answer exactly what it answers: the classes are generated from the library
 * itself (tests/ref/make_tokenizer_unicode.py -> tok_unicode_tables.h; tests/py/tokenizer/test_tokenizer_unicode.py
 * checks the file is current and every code point against the library). Also used by the encoder's
 * WordPiece tokenizer. Every function is pure and thread-safe; c is any value (> 0x10FFFF: no class).
 */
#ifndef DFM_TOK_UNICODE_H
#define DFM_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* The classes of the ASCII characters, as bits (hot loops test them directly). */
enum { DFM_UC_PUNCT = 1, DFM_UC_NUMERIC = 2, DFM_UC_WORD = 4, DFM_UC_OTHER = 8, DFM_UC_MN = 16, DFM_UC_MARK = 32,
       DFM_UC_WS = 64 };
extern const uint8_t *const dfm_uc_ascii;

/* char::is_whitespace (the White_Space property). */
int dfm_uc_is_ws(uint32_t c);
/* Punctuation and BertPreTokenizer: ASCII punctuation or a P* category of the old table. */
int dfm_uc_is_punct(uint32_t c);
/* Digits: char::is_numeric (N* categories, Rust's table). */
int dfm_uc_is_numeric(uint32_t c);
/* Whitespace pre-tokenizer: the regex crate's \w. */
int dfm_uc_is_word(uint32_t c);
/* BertNormalizer clean_text: dropped (U+0000, U+FFFD, control, format, private use; not \t \n \r). */
int dfm_uc_is_other(uint32_t c);
/* BertNormalizer strip_accents: a non-spacing mark (dropped after NFD). */
int dfm_uc_is_mn(uint32_t c);
/* StripAccents: a combining mark. */
int dfm_uc_is_mark(uint32_t c);
/* BertNormalizer handle_chinese_chars: a CJK ideograph block of bert.rs. */
int dfm_uc_is_chinese(uint32_t c);
/* char::to_lowercase: writes 1 to 3 code points to out, returns how many. */
int dfm_uc_lower(uint32_t c, uint32_t out[3]);
/* UnicodeScripts: a script class (>= 0; Hiragana and Katakana count as Han), or -1 for "Any" (never
 * splits: " " and code points outside its table). */
int dfm_uc_script(uint32_t c);
/* Normalization: 1 if `tokenizers` leaves c alone where utf8proc would decompose, reorder or compose it
 * (newer Unicode): text is normalized on each side of it separately. */
int dfm_uc_nf_keep(uint32_t c);
/* A regex property \p{name} (name[0..len): a general category such as L, Lu, N, P or its long name
 * ("Letter"), or a script such as Han or Latin; case, spaces, '_' and '-' ignored) as Oniguruma matches it:
 * *pcre2 is PCRE2's property to extend with the ranges (Oniguruma's table is newer), or NULL when the
 * ranges are the whole set. Returns 0 for a property outside the checked list. */
int dfm_uc_re_prop(const char *name, size_t len, const char **pcre2, const uint32_t (**r)[2], size_t *n);
/* The Unicode versions of the utf8proc and the PCRE2 these tables were made against; the normalizers and
 * patterns that rely on them refuse to load when the linked libraries differ (HINT: regenerate the tables). */
const char *dfm_uc_tables_utf8proc_version(void);
const char *dfm_uc_tables_pcre2_version(void);

#endif
