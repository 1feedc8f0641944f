#!/usr/bin/env python3
"""WordPiece parity with HF `tokenizers` on every Unicode code point.

1. For every code point c (assigned or not; surrogates excepted) the ids of "a" c "b " c — c inside a word
   and alone — from libdfm's WordPiece equal the ids from `tokenizers` with the real all-MiniLM-L6-v2
   tokenizer.json. This covers control and format characters, unassigned code points (which become
   [UNK]), combining marks (stripped after NFD), CJK ideographs and their compatibility forms
   (split off, then NFD), punctuation of every block, and case mappings.
2. The same on a few hundred random strings mixing those classes.
Exits non-zero on any difference, naming the first ones."""
import ctypes
import os
import random
import sys
import unicodedata

from tokenizers import Tokenizer

ROOT = os.environ.get("DFM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
MODEL = os.environ.get("DFM_MODEL", "/var/cache/dfm/models/all-MiniLM-L6-v2")
failed = 0


def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what)
    failed += 0 if ok else 1


lib = ctypes.CDLL(os.path.join(ROOT, "build", "libdfm.so"))
wp = ctypes.c_void_p()
rc = lib.dfm_wordpiece_load(MODEL.encode(), ctypes.byref(wp))
assert rc == 0, "dfm_wordpiece_load(%s) = %d" % (MODEL, rc)
lib.dfm_wordpiece_encode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int,
                                     ctypes.POINTER(ctypes.c_int32), ctypes.c_int, ctypes.c_void_p]
buf = (ctypes.c_int32 * 4096)()


def dfm_ids(text):
    b = text.encode("utf-8", "surrogatepass")
    n = lib.dfm_wordpiece_encode(wp, b, len(b), 0, buf, len(buf), None)
    assert 0 <= n <= len(buf), "dfm_wordpiece_encode returned %d" % n
    return list(buf[:n])


hf = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
hf.no_truncation()
hf.no_padding()


def compare(texts, label):
    bad = []
    for t, e in zip(texts, hf.encode_batch(texts, add_special_tokens=True)):
        mine = dfm_ids(t)
        if mine != e.ids:
            bad.append((t, mine, e.ids))
    check(not bad, "%s: %d texts, %d differ" % (label, len(texts), len(bad)))
    for t, mine, ref in bad[:8]:
        c = [hex(ord(x)) + "/" + unicodedata.category(x) for x in t if ord(x) > 127][:3]
        print("     %r %s dfm %s tokenizers %s" % (t, c, mine, ref))


cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
compare(["a" + chr(c) + "b " + chr(c) for c in cps], "every code point")

rng = random.Random(7)
pools = {
    "unassigned": [c for c in range(0x0370, 0x40000) if unicodedata.category(chr(c)) == "Cn"][:5000],
    "control/format": [c for c in range(0, 0x20000) if unicodedata.category(chr(c)) in ("Cc", "Cf")],
    "marks": [c for c in range(0, 0x20000) if unicodedata.category(chr(c)) in ("Mn", "Mc", "Me")],
    "cjk": list(range(0x4E00, 0x4E80)) + list(range(0xF900, 0xF980)) + list(range(0x20000, 0x20040)),
    "punct": [c for c in range(0, 0x20000) if unicodedata.category(chr(c)).startswith("P")],
    "latin": [c for c in range(0x41, 0x250) if unicodedata.category(chr(c)).startswith("L")],
    "space": [0x20, 0x09, 0x0A, 0x85, 0xA0, 0x2000, 0x2028, 0x3000, 0x1C, 0x0B],
}
names = sorted(pools)
texts = []
for _ in range(400):
    n = rng.randint(1, 40)
    texts.append("".join(chr(rng.choice(pools[rng.choice(names)])) for _ in range(n)))
compare(texts, "random mixed strings")

lib.dfm_wordpiece_free(wp)
print("%d failed" % failed)
sys.exit(1 if failed else 0)
