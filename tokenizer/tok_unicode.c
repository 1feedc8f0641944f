/* tok_unicode.c — lookups in the generated tables of tok_unicode_tables.h (see tok_unicode.h). ASCII is
 * answered from the generated 128-entry bit table. */
#include "tokenizer/tok_unicode.h"
#include "tokenizer/tok_unicode_tables.h"

#include <stddef.h>
#include <string.h>

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t c) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c < r[mid][0]) hi = mid;
        else if (c > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}
#define IN(t, c) in_ranges(t, sizeof t / sizeof t[0], c)

int dfm_uc_is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

const uint8_t *const dfm_uc_ascii = tok_uc_ascii;

static inline int ascii_has(uint32_t c, int bit) { return tok_uc_ascii[c] & bit; }

int dfm_uc_is_punct(uint32_t c) { return c < 128 ? ascii_has(c, DFM_UC_PUNCT) != 0 : IN(tok_uc_punct, c); }
int dfm_uc_is_numeric(uint32_t c) { return c < 128 ? ascii_has(c, DFM_UC_NUMERIC) != 0 : IN(tok_uc_numeric, c); }
int dfm_uc_is_word(uint32_t c) { return c < 128 ? ascii_has(c, DFM_UC_WORD) != 0 : IN(tok_uc_word, c); }
int dfm_uc_is_other(uint32_t c) { return c < 128 ? ascii_has(c, DFM_UC_OTHER) != 0 : IN(tok_uc_other, c); }
int dfm_uc_is_mn(uint32_t c) { return c < 128 ? ascii_has(c, DFM_UC_MN) != 0 : IN(tok_uc_mn, c); }
int dfm_uc_is_mark(uint32_t c) { return c < 128 ? ascii_has(c, DFM_UC_MARK) != 0 : IN(tok_uc_mark, c); }
int dfm_uc_nf_keep(uint32_t c) { return c >= tok_uc_nf_keep[0][0] && IN(tok_uc_nf_keep, c); }

int dfm_uc_is_chinese(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

int dfm_uc_lower(uint32_t c, uint32_t out[3]) {
    if (c < 128) {
        out[0] = c >= 'A' && c <= 'Z' ? c + 32 : c;
        return 1;
    }
    size_t lo = 0, hi = sizeof tok_uc_lower / sizeof tok_uc_lower[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c < tok_uc_lower[mid][0]) hi = mid;
        else if (c > tok_uc_lower[mid][0]) lo = mid + 1;
        else {
            out[0] = tok_uc_lower[mid][1];
            return 1;
        }
    }
    for (size_t i = 0; i < sizeof tok_uc_lower_multi / sizeof tok_uc_lower_multi[0]; i++)
        if (tok_uc_lower_multi[i][0] == c) {
            int n = (int)tok_uc_lower_multi[i][1];
            for (int k = 0; k < n; k++) out[k] = tok_uc_lower_multi[i][2 + k];
            return n;
        }
    out[0] = c;
    return 1;
}

int dfm_uc_script(uint32_t c) {
    size_t lo = 0, hi = sizeof tok_uc_script / sizeof tok_uc_script[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c < tok_uc_script[mid][0]) hi = mid;
        else if (c > tok_uc_script[mid][1]) lo = mid + 1;
        else return (int)tok_uc_script[mid][2];
    }
    return -1;
}

const char *dfm_uc_tables_utf8proc_version(void) { return TOK_UC_UTF8PROC_UNICODE; }
const char *dfm_uc_tables_pcre2_version(void) { return TOK_UC_PCRE2_UNICODE; }

int dfm_uc_re_prop(const char *name, size_t len, const char **pcre2, const uint32_t (**r)[2], size_t *n) {
    static const char *longname[][2] = {
        {"letter", "l"}, {"uppercaseletter", "lu"}, {"lowercaseletter", "ll"}, {"titlecaseletter", "lt"},
        {"modifierletter", "lm"}, {"otherletter", "lo"}, {"mark", "m"}, {"combiningmark", "m"},
        {"nonspacingmark", "mn"}, {"spacingmark", "mc"}, {"enclosingmark", "me"}, {"number", "n"},
        {"decimalnumber", "nd"}, {"digit", "nd"}, {"letternumber", "nl"}, {"othernumber", "no"},
        {"punctuation", "p"}, {"connectorpunctuation", "pc"}, {"dashpunctuation", "pd"}, {"openpunctuation", "ps"},
        {"closepunctuation", "pe"}, {"initialpunctuation", "pi"}, {"finalpunctuation", "pf"},
        {"otherpunctuation", "po"}, {"symbol", "s"}, {"mathsymbol", "sm"}, {"currencysymbol", "sc"},
        {"modifiersymbol", "sk"}, {"othersymbol", "so"}, {"separator", "z"}, {"spaceseparator", "zs"},
        {"lineseparator", "zl"}, {"paragraphseparator", "zp"}, {"other", "c"}, {"control", "cc"}, {"format", "cf"},
        {"privateuse", "co"}, {"unassigned", "cn"}, {"hani", "han"}, {"hira", "hiragana"}, {"kana", "katakana"},
        {"hang", "hangul"}, {"latn", "latin"}, {"grek", "greek"}, {"cyrl", "cyrillic"}, {"arab", "arabic"},
        {"hebr", "hebrew"}, {"zyyy", "common"}, {"zinh", "inherited"}, {"qaai", "inherited"}};
    char key[40];
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (c == ' ' || c == '_' || c == '-') continue;
        if (k + 1 >= sizeof key) return 0;
        key[k++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
    }
    key[k] = 0;
    for (size_t i = 0; i < sizeof longname / sizeof longname[0]; i++)
        if (!strcmp(key, longname[i][0])) {
            strcpy(key, longname[i][1]);
            break;
        }
    for (size_t i = 0; i < sizeof tok_uc_re_props / sizeof tok_uc_re_props[0]; i++)
        if (!strcmp(key, tok_uc_re_props[i].name)) {
            *pcre2 = tok_uc_re_props[i].pcre2;
            *r = tok_uc_re_props[i].r;
            *n = tok_uc_re_props[i].n;
            return 1;
        }
    return 0;
}
