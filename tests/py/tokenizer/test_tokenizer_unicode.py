#!/usr/bin/env python3
"""dfm's tokenizer against the installed HF `tokenizers` on every Unicode code point and on random strings.

For each tokenizer.json below (oracle sets of tests/ref/make_tokenizer_oracle.py: one per Unicode table dfm
takes from tok_unicode_tables.h) and every code point c of planes 0-3 (surrogates excepted; the unassigned
and private-use planes above are sampled), the ids of "a" c "b " c — c inside a word and alone — from libdfm (dfm_tokenizer_encode) must
equal `tokenizers`' (encode, add_special_tokens=False), and dfm's decode of HF's ids must equal HF's decode.
Code points go 192 to a text; a text that differs is named with its code points. Then the same on random
strings drawn from the hard classes (seeded, not the golden sets' seed). This is what keeps the generated
tables honest: a newer `tokenizers` with other Unicode tables fails here (HINT: regenerate
tokenizer/tok_unicode_tables.h with tests/ref/make_tokenizer_unicode.py). Exits non-zero on any difference.
"""
import ctypes
import json
import os
import random
import sys
import tempfile

ROOT = os.environ.get("DFM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
import make_tokenizer_oracle as oracle  # noqa: E402

CACHE = os.environ.get("DFM_CACHE", "/var/cache/dfm")
# one per table of tok_unicode_tables.h: punctuation, numeric, \w, scripts, regex properties, normal forms
# (decomposition and composition), lowercase, combining marks, BertNormalizer's classes, the charsmap
CONFIGS = ["pre-punctuation-isolated", "pre-digits", "pre-whitespace", "pre-unicodescripts", "pre-split-props",
           "pre-split-scripts",
           "norm-nfc", "norm-nfkd", "norm-lowercase", "norm-stripaccents", "norm-bert-default", "family-t5"]
PER_TEXT = 192


class Ids(ctypes.Structure):
    _fields_ = [("ids", ctypes.POINTER(ctypes.c_uint32)), ("n", ctypes.c_size_t), ("cap", ctypes.c_size_t)]


lib = ctypes.CDLL(os.path.join(ROOT, "build", "libdfm.so"))
lib.dfm_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
lib.dfm_tokenizer_encode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(Ids),
                                     ctypes.c_void_p]
lib.dfm_tokenizer_decode.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t, ctypes.c_int,
                                     ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
lib.dfm_ids_free.argtypes = [ctypes.POINTER(Ids)]
lib.dfm_tokenizer_free.argtypes = [ctypes.c_void_p]
lib.dfm_last_error.restype = ctypes.c_char_p
libc = ctypes.CDLL(None)
libc.free.argtypes = [ctypes.c_void_p]
failed = 0


def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failed += 0 if ok else 1


def dfm_encode(h, text):
    b = text.encode("utf-8")
    ids = Ids()
    rc = lib.dfm_tokenizer_encode(h, b, len(b), ctypes.byref(ids), None)
    out = [ids.ids[i] for i in range(ids.n)] if rc == 0 else ("error", lib.dfm_last_error().decode())
    lib.dfm_ids_free(ctypes.byref(ids))
    return out


def dfm_decode(h, ids):
    arr = (ctypes.c_uint32 * max(1, len(ids)))(*ids)
    p, n = ctypes.c_void_p(), ctypes.c_size_t()
    rc = lib.dfm_tokenizer_decode(h, arr, len(ids), 0, ctypes.byref(p), ctypes.byref(n))
    if rc:
        return ("error", lib.dfm_last_error().decode())
    s = ctypes.string_at(p, n.value).decode("utf-8")
    libc.free(p)
    return s


def compare(name, tok, h, texts, label):
    bad = []
    encs = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    decs = tok.decode_batch(encs, skip_special_tokens=False)
    for t, ids, ref in zip(texts, encs, decs):
        mine = dfm_encode(h, t)
        dec = dfm_decode(h, ids)
        if mine != ids or dec != ref:
            bad.append((t, mine, ids, dec, ref))
    check(not bad, "%s: %s: %d texts, %d differ" % (name, label, len(texts), len(bad)))
    for t, mine, ref, dec, rdec in bad[:4]:
        print("     %r\n     dfm %s %r\n     tokenizers %s %r" % (t[:60], str(mine)[:80], dec[:40] if isinstance(dec, str)
                                                                 else dec, str(ref)[:80], rdec[:40]))


def main():
    # planes 0-3 whole (everything assigned up to Unicode 16 lies there, save tags, variation selectors and
    # private use), then every 61st code point of the unassigned and private-use planes
    cps = [c for c in range(0x40000) if not 0xD800 <= c <= 0xDFFF] + list(range(0x40000, 0x110000, 61)) + \
        list(range(0xE0000, 0xE0200))
    every = ["".join("a" + chr(c) + "b " + chr(c) + " " for c in cps[i:i + PER_TEXT]) for i in range(0, len(cps), PER_TEXT)]
    rng = random.Random(int(os.environ.get("FUZZ_SEED", "7")))
    words = ["the", "word", "Caf\u00e9", "na\u00efve", "\u6587\u5b57", "ひらがな", "\ud55c\uad6d"]
    fuzz = [c for _, c in oracle.fuzz_cases(rng, words)] + [c for _, c in oracle.fuzz_cases(rng, words)]
    with tempfile.TemporaryDirectory() as d:
        os.environ["DFM_TOKENIZER_CACHE"] = "off"
        for name in CONFIGS[:int(os.environ.get("N_CONFIGS", len(CONFIGS)))]:
            base, patch, model_patch = oracle.SETS[name]
            tok, _ = oracle.build(CACHE, base, patch, model_patch)
            path = os.path.join(d, name + ".json")
            with open(path, "w", encoding="utf-8") as f:
                f.write(tok.to_str())
            h = ctypes.c_void_p()
            rc = lib.dfm_tokenizer_load(path.encode(), ctypes.byref(h))
            check(rc == 0, "%s loads (%s)" % (name, lib.dfm_last_error().decode() if rc else "ok"))
            if rc:
                continue
            compare(name, tok, h, every, "every code point")
            compare(name, tok, h, fuzz, "random strings")
            lib.dfm_tokenizer_free(h)
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
