#!/usr/bin/env python3
"""The committed tokenizer golden files and component oracle still equal a fresh run of HF `tokenizers`
(catches a changed tokenizers version or tokenizer.json); `dfm tokenize` agrees with HF on a few texts end to end
(encode through the command line, and --decode back); and on 1500 random strings per tokenizer drawn
from an alphabet of hard pieces (Unicode spaces, combining marks, contractions, CJK, emoji, special
tokens), via `dfm tokenize --jsonl`. Exits non-zero on any difference."""
import json
import os
import random
import subprocess
import sys
import time

ROOT = os.environ.get("DFM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CACHE = os.environ.get("DFM_CACHE", "/var/cache/dfm")
DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))



def run_dfm(args, **kw):
    """subprocess.run for build/dfm, retried a few times if the binary is being relinked right now
    (parallel builds in the same tree: EACCES / ETXTBSY / ENOEXEC while the linker writes it)."""
    for attempt in range(10):
        try:
            return subprocess.run([DFM] + args, capture_output=True, **kw)
        except OSError:
            if attempt == 9:
                raise
            time.sleep(1)


fails = 0
r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "ref", "make_tokenizer_golden.py"), "--check",
                    "--cache", CACHE, "--out", os.path.join(ROOT, "tests", "data", "tokenizer")],
                   capture_output=True, text=True)
print(r.stdout + r.stderr, end="")
if r.returncode != 0:
    print("FAIL: golden files differ from a fresh HF run: regenerate with tests/ref/make_tokenizer_golden.py "
          "and review the diff")
    fails += 1
r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "ref", "make_tokenizer_oracle.py"), "--check",
                    "--cache", CACHE], capture_output=True, text=True)
print(r.stdout + r.stderr[-2000:], end="")
if r.returncode != 0:
    print("FAIL: the component oracle differs from a fresh HF run: regenerate with tests/ref/make_tokenizer_oracle.py "
          "and review the diff")
    fails += 1

from tokenizers import Tokenizer  # noqa: E402

TOKENIZER_FILES = {"qwen2.5": os.path.join(CACHE, "tokenizers", "qwen2.5", "tokenizer.json"),
                   "llama-3.2": os.path.join(CACHE, "tokenizers", "llama-3.2", "tokenizer.json"),
                   "smollm2": os.path.join(CACHE, "models", "smollm2-135m", "tokenizer.json"),  # Digits + ByteLevel
                   "bert": os.path.join(CACHE, "models", "all-MiniLM-L6-v2", "tokenizer.json"),  # WordPiece
                   "t5": os.path.join(ROOT, "tests", "data", "tokenizer", "oracle", "t5.tokenizer.json")}  # Unigram

texts = ["Hello, world! It's 2026.", "  spaces\tand\ttabs\r\n", "naïve café 東京 😀👍🏽", "x<|endoftext|>y",
         "12345678901234567890", "'S 'll 'Re don't"]
if not os.access(DFM, os.X_OK):
    print(f"FAIL: {DFM} is not built (make build/dfm)")
    fails += 1
else:
    for name, path in TOKENIZER_FILES.items():
        hf = Tokenizer.from_file(path)
        hf.no_truncation()  # all-MiniLM-L6-v2's file truncates to 128 tokens; dfm encodes them all
        hf.no_padding()
        all_ids = []
        for t in texts:
            want = hf.encode(t, add_special_tokens=False).ids
            all_ids += want
            out = run_dfm(["tokenize", "--tokenizer", path, "-"], input=t.encode())
            got = [int(x) for x in out.stdout.split()]
            if out.returncode != 0 or got != want:
                print(f"FAIL {name} encode {t!r}: dfm {got} (rc {out.returncode}, {out.stderr.decode()[-200:]}), HF {want}")
                fails += 1
        for skip in (False, True):  # one decode of all the ids, with and without special tokens
            out = run_dfm(["tokenize", "--tokenizer", path, "--decode"] + (["--skip-special"] if skip else [])
                          + [" ".join(map(str, all_ids))])
            dec = out.stdout.decode()[:-1]  # the command adds one newline
            if out.returncode != 0 or dec != hf.decode(all_ids, skip_special_tokens=skip):
                print(f"FAIL {name} decode (skip_special={skip}): dfm {dec!r}, HF "
                      f"{hf.decode(all_ids, skip_special_tokens=skip)!r}")
                fails += 1
        print(f"ok: dfm tokenize agrees with HF on {len(texts)} texts with {name}")
# random strings (fixed seed): every one must give HF's ids
ALPHA = list("abcXYZ019 '\"-_.,!?") + [
    "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u0085", "\u180e", "\u200b", "\u0301", "\u0308",
    "é", "e\u0301", "ß", "İ", "ſ", "\u212a", "中", "文", "ひ", "한", "\u1100\u1161", "😀", "👍🏽", "\u200d", "\ufe0f",
    "'s", "'S", "'ll", "'LL", "'re", "'Ve", "'d", "'M", "'t", "١", "²", "½", "Ⅻ", "<|endoftext|>", "<|im_start|>",
    "<|begin_of_text|>", "\x00", "\x7f", "\ufffd", "ﬁ", "\U0001F1EB\U0001F1F7", "ـ", "ि", "्", "…", "—", "«", "\\",
    "$", "%", "\U00010000"]
rng = random.Random(20261129)
rand_texts = ["".join(rng.choice(ALPHA) for _ in range(rng.randint(0, 40))) for _ in range(1500)]
if os.access(DFM, os.X_OK):
    for name, path in TOKENIZER_FILES.items():
        hf = Tokenizer.from_file(path)
        hf.no_truncation()
        hf.no_padding()
        inp = "".join(json.dumps(t) + "\n" for t in rand_texts).encode()
        out = run_dfm(["tokenize", "--tokenizer", path, "--jsonl", "-"], input=inp)
        lines = out.stdout.decode().split("\n")
        bad = 0
        for i, t in enumerate(rand_texts):
            want = hf.encode(t, add_special_tokens=False).ids
            got = [int(x) for x in lines[i].split()] if i < len(lines) else None
            if out.returncode != 0 or got != want:
                bad += 1
                if bad <= 5:
                    print(f"FAIL {name} random {t!r}: dfm {got}, HF {want} (rc {out.returncode})")
        print(f"{name}: {len(rand_texts) - bad}/{len(rand_texts)} random strings match HF")
        fails += bad
print("PASS" if not fails else f"{fails} failure(s)")
sys.exit(1 if fails else 0)
