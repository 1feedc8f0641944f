#!/usr/bin/env python3
"""make_tokenizer_unicode.py — write tokenizer/tok_unicode_tables.h: the Unicode classes and mappings that
HF `tokenizers` uses, read off the installed library itself, code point by code point.

`tokenizers` takes its character classes from several Unicode tables of different ages: Rust's standard
library (is_numeric, is_whitespace, to_lowercase), the old `unicode_categories` crate (punctuation,
"other", non-spacing marks), `unicode-normalization-alignments` (NFD/NFKD/NFC/NFKC and combining marks)
and a SentencePiece-derived script table (UnicodeScripts). Matching it id for id therefore needs its own
classes, not today's Unicode categories; each is probed through the component that uses it:

  punct    Punctuation splits "a" c "b" into "a", c, "b"            (also BertPreTokenizer's)
  numeric  Digits(individual_digits) does the same                   (char::is_numeric)
  word     Whitespace keeps "a" c "b" whole (regex crate \\w)
  other    BertNormalizer(clean_text) drops c from "a" c "b"          (control, format, private use, NUL, U+FFFD)
  mn       BertNormalizer(strip_accents) drops c, which NFD keeps     (non-spacing marks)
  mark     StripAccents drops c                                      (combining marks)
  lower    Lowercase maps c to something else                        (char::to_lowercase, full mapping)
  script   UnicodeScripts: the class c shares with its neighbours (Hiragana and Katakana are Han, U+30FC is
           Han, " " and code points the table lacks are "Any", which never splits)
  re_*     regex properties (\\p{L}, \\p{Han}, ...): Oniguruma's (`tokenizers`' regex engine) sets beside PCRE2's,
           which runs the patterns here: a general category as what Oniguruma adds to PCRE2's (its table is
           newer), a script (Oniguruma: Script; PCRE2: Script_Extensions) as the whole set
  nf_keep  code points whose normalization in `tokenizers` differs from utf8proc's (a decomposition,
           combining class or composition that its older Unicode table lacks): tokenizer/tok_normalize.c
           leaves them as they are and normalizes the text on each side of them separately, which is what
           `tokenizers` does (each is its own NFD/NFKD/NFC/NFKC there: checked here)

    $DFM_PYTHON tests/ref/make_tokenizer_unicode.py > tokenizer/tok_unicode_tables.h
"""
import ctypes
import sys

import tokenizers
from tokenizers import normalizers as N
from tokenizers import pre_tokenizers as P

CPS = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def ranges(cps):
    out = []
    for c in cps:
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def utf8proc():
    lib = ctypes.CDLL("libutf8proc.so.2")
    lib.utf8proc_unicode_version.restype = ctypes.c_char_p
    for f in ("utf8proc_NFD", "utf8proc_NFC", "utf8proc_NFKD", "utf8proc_NFKC"):
        getattr(lib, f).restype = ctypes.c_void_p
        getattr(lib, f).argtypes = [ctypes.c_char_p]
    lib.utf8proc_get_property.restype = ctypes.POINTER(ctypes.c_int16)
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]

    def norm(form, s):
        p = getattr(lib, "utf8proc_" + form)(s.encode())
        out = ctypes.string_at(p).decode()
        libc.free(p)
        return out

    def ccc(c):
        return lib.utf8proc_get_property(c)[1]
    return lib, norm, ccc


GC = ["L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No", "P", "Pc", "Pd", "Ps", "Pe",
      "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So", "Z", "Zs", "Zl", "Zp", "C", "Cc", "Cf", "Co", "Cn"]
SCRIPTS = ["Han", "Hiragana", "Katakana", "Hangul", "Latin", "Greek", "Cyrillic", "Arabic", "Hebrew", "Thai",
           "Devanagari", "Bengali", "Tamil", "Armenian", "Georgian", "Ethiopic", "Khmer", "Lao", "Tibetan", "Common",
           "Inherited"]


def regex_props():
    """{name: (pcre2 spelling or None, ranges)}: a general category as Oniguruma's additions to PCRE2's set
    (None when Oniguruma lacks some of PCRE2's: then the whole set), a script as the whole set."""
    from tokenizers import Regex
    pc = ctypes.CDLL("libpcre2-8.so.0")
    pc.pcre2_compile_8.restype = ctypes.c_void_p
    pc.pcre2_compile_8.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int),
                                   ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
    pc.pcre2_match_data_create_8.restype = ctypes.c_void_p
    pc.pcre2_match_data_create_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
    pc.pcre2_match_8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint32,
                                 ctypes.c_void_p, ctypes.c_void_p]
    pc.pcre2_get_ovector_pointer_8.restype = ctypes.POINTER(ctypes.c_size_t)
    pc.pcre2_get_ovector_pointer_8.argtypes = [ctypes.c_void_p]
    md = pc.pcre2_match_data_create_8(4, None)
    cps = [c for c in CPS if c]
    text = "".join(chr(c) for c in cps).encode()
    at, off = {}, 0
    for c in cps:
        at[off] = c
        off += len(chr(c).encode())
    out = {}
    for name in GC + SCRIPTS:
        onig = set()
        sp = P.Split(Regex("\\p{%s}" % name), behavior="removed")
        for k in range(0, len(cps), 4096):
            chunk = cps[k:k + 4096]
            kept = set()
            for _, (a, e) in sp.pre_tokenize_str("".join(chr(c) for c in chunk)):
                kept.update(range(a, e))
            onig.update(chunk[i] for i in range(len(chunk)) if i not in kept)
        pat = ("\\p{%s}" % name).encode()
        err, eoff = ctypes.c_int(), ctypes.c_size_t()
        re_ = pc.pcre2_compile_8(pat, len(pat), 0x00080000 | 0x00020000, ctypes.byref(err), ctypes.byref(eoff), None)
        pcre, pos = set(), 0
        while re_ and pc.pcre2_match_8(re_, text, len(text), pos, 0x40000000, md, None) >= 0:  # NO_UTF_CHECK
            ov = pc.pcre2_get_ovector_pointer_8(md)
            pcre.add(at[ov[0]])
            pos = ov[1]
        if name in GC and re_ and not (pcre - onig):
            out[name] = (name, ranges(sorted(onig - pcre)))
        else:
            out[name] = (None, ranges(sorted(onig)))
    pc.pcre2_config_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
    buf = ctypes.create_string_buffer(64)
    pc.pcre2_config_8(10, buf)  # PCRE2_CONFIG_UNICODE_VERSION
    return out, buf.value.decode()


def main():
    lib, up_norm, up_ccc = utf8proc()
    punct_pt, digits, ws = P.Punctuation(), P.Digits(individual_digits=True), P.Whitespace()
    clean = N.BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    strip_mn = N.BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=True, lowercase=False)
    strip_acc, lower = N.StripAccents(), N.Lowercase()
    forms = {"NFD": N.NFD(), "NFKD": N.NFKD(), "NFC": N.NFC(), "NFKC": N.NFKC()}
    scripts = P.UnicodeScripts()

    def pieces(pt, s):
        return [p for p, _ in pt.pre_tokenize_str(s)]

    cls = {k: [] for k in ("punct", "numeric", "word", "other", "mn", "mark")}
    lower_map, script_of, reps = [], {}, []
    for c in CPS:
        ch = chr(c)
        s = "a" + ch + "b"
        if pieces(punct_pt, s) == ["a", ch, "b"]:
            cls["punct"].append(c)
        if pieces(digits, s) == ["a", ch, "b"]:
            cls["numeric"].append(c)
        if pieces(ws, s) == [s]:
            cls["word"].append(c)
        if clean.normalize_str(s) == "ab":
            cls["other"].append(c)
        if forms["NFD"].normalize_str(ch) == ch and strip_mn.normalize_str(s) == "ab":
            cls["mn"].append(c)
        if strip_acc.normalize_str(s) == "ab":
            cls["mark"].append(c)
        lo = lower.normalize_str(ch)
        if lo != ch:
            lower_map.append((c, [ord(x) for x in lo]))
        # script class: "Any" joins every neighbour; otherwise the class of a representative it joins
        if len(pieces(scripts, "a" + ch)) == 1 and len(pieces(scripts, "\u03b1" + ch)) == 1:
            continue
        prev = script_of.get(c - 1)
        if prev is not None and len(pieces(scripts, reps[prev] + ch)) == 1:
            script_of[c] = prev
            continue
        for k, r in enumerate(reps):
            if len(pieces(scripts, r + ch)) == 1:
                script_of[c] = k
                break
        else:
            reps.append(ch)
            script_of[c] = len(reps) - 1

    # normalization: what tokenizers does differently from utf8proc
    refs = [0x0334, 0x093C, 0x05B0, 0x0651, 0x0E38, 0x0F71, 0x0321, 0x031B, 0x0316, 0x302A, 0x0300, 0x302E,
            0x0345]  # combining classes 1 7 10 33 103 129 202 216 220 218 230 224 240
    keep = set()
    for c in CPS:
        ch = chr(c)
        if c and any(f.normalize_str(ch) != up_norm(name, ch) for name, f in forms.items()):
            keep.add(c)
        elif up_ccc(c) != 0 and any(forms["NFD"].normalize_str(t) != up_norm("NFD", t)
                                    for r in refs for t in ("a" + ch + chr(r), "a" + chr(r) + ch)):
            keep.add(c)
    # compositions utf8proc makes and tokenizers does not: the second character is kept apart
    for c in CPS:
        d = up_norm("NFD", chr(c))
        if len(d) >= 2 and up_norm("NFC", d) == chr(c) and forms["NFC"].normalize_str(d) != chr(c):
            keep.add(ord(d[-1]))
    for c in sorted(keep):
        for name, f in forms.items():
            if f.normalize_str(chr(c)) != chr(c):
                sys.exit("U+%04X: tokenizers' %s changes it, yet it differs from utf8proc: a case this table "
                         "cannot express" % (c, name))

    w = sys.stdout.write
    w("/* tok_unicode_tables.h — generated by tests/ref/make_tokenizer_unicode.py from tokenizers %s and utf8proc "
      "%s;\n * do not edit. The classes and mappings HF `tokenizers` uses, read off the library code point by code "
      "point\n * (what each one is: the generator's header). Included by tokenizer/tok_unicode.c only. */\n"
      % (tokenizers.__version__, lib.utf8proc_unicode_version().decode()))
    w("#ifndef DFM_TOK_UNICODE_TABLES_H\n#define DFM_TOK_UNICODE_TABLES_H\n\n#include <stddef.h>\n#include <stdint.h>\n\n")
    w('#define TOK_UC_UTF8PROC_UNICODE "%s"\n\n' % lib.utf8proc_unicode_version().decode())
    for name in ("punct", "numeric", "word", "other", "mn", "mark"):
        rs = ranges(cls[name])
        w("static const uint32_t tok_uc_%s[][2] = {\n" % name)
        for i in range(0, len(rs), 6):
            w("    " + " ".join("{0x%X, 0x%X}," % (a, b) for a, b in rs[i:i + 6]) + "\n")
        w("};\n\n")
    # ASCII: the same classes as bits, so the hot loops test them without a search
    bits = {"punct": 1, "numeric": 2, "word": 4, "other": 8, "mn": 16, "mark": 32}
    ascii = [sum(b for k, b in bits.items() if c in set(cls[k])) | (64 if chr(c).isspace() and c not in range(0x1c, 0x20)
                                                                     else 0) for c in range(128)]
    w("/* ASCII: bit 1 punct, 2 numeric, 4 word, 8 other, 16 mn, 32 mark, 64 White_Space */\n")
    w("static const uint8_t tok_uc_ascii[128] = {\n")
    for i in range(0, 128, 16):
        w("    " + " ".join("%d," % x for x in ascii[i:i + 16]) + "\n")
    w("};\n\n")
    single = [(c, l[0]) for c, l in lower_map if len(l) == 1]
    multi = [(c, l) for c, l in lower_map if len(l) > 1]
    assert all(len(l) <= 3 for _, l in multi)
    w("/* to_lowercase: code point -> its one lowercase code point */\n")
    w("static const uint32_t tok_uc_lower[][2] = {\n")
    for i in range(0, len(single), 6):
        w("    " + " ".join("{0x%X, 0x%X}," % p for p in single[i:i + 6]) + "\n")
    w("};\n\n/* to_lowercase with more than one code point: {c, n, l1, l2, l3} */\n")
    w("static const uint32_t tok_uc_lower_multi[][5] = {\n")
    for c, l in multi:
        w("    {0x%X, %d, %s},\n" % (c, len(l), ", ".join("0x%X" % x for x in (l + [0, 0, 0])[:3])))
    w("};\n\n")
    sr = []
    for c in sorted(script_of):
        k = script_of[c]
        if sr and sr[-1][1] == c - 1 and sr[-1][2] == k:
            sr[-1][1] = c
        else:
            sr.append([c, c, k])
    w("/* UnicodeScripts: {first, last, class}; a code point in no range is \"Any\" (%d classes) */\n" % len(reps))
    w("static const uint32_t tok_uc_script[][3] = {\n")
    for i in range(0, len(sr), 4):
        w("    " + " ".join("{0x%X, 0x%X, %d}," % tuple(x) for x in sr[i:i + 4]) + "\n")
    w("};\n\n")
    props, pcre_unicode = regex_props()
    w('#define TOK_UC_PCRE2_UNICODE "%s"\n\n' % pcre_unicode)
    w("/* regex properties: {first, last} ranges; see tok_uc_re_props */\n")
    for name, (_, rs) in props.items():
        if rs:
            w("static const uint32_t tok_uc_re_%s[][2] = {\n" % name)
            for i in range(0, len(rs), 6):
                w("    " + " ".join("{0x%X, 0x%X}," % (a, b) for a, b in rs[i:i + 6]) + "\n")
            w("};\n")
    w("\n/* name (lowercase), PCRE2's \\\\p name to extend (NULL: the ranges are the whole set), ranges */\n")
    w("static const struct {\n    const char *name, *pcre2;\n    const uint32_t (*r)[2];\n    uint32_t n;\n} "
      "tok_uc_re_props[] = {\n")
    for name, (pname, rs) in props.items():
        w('    {"%s", %s, %s, %d},\n' % (name.lower(), '"%s"' % pname if pname else "NULL",
                                       "tok_uc_re_%s" % name if rs else "NULL", len(rs)))
    w("};\n\n")
    rs = ranges(sorted(keep))
    w("/* normalization: kept as it is, text on each side normalized apart */\n")
    w("static const uint32_t tok_uc_nf_keep[][2] = {\n")
    for i in range(0, len(rs), 6):
        w("    " + " ".join("{0x%X, 0x%X}," % (a, b) for a, b in rs[i:i + 6]) + "\n")
    w("};\n\n#endif\n")


if __name__ == "__main__":
    main()
