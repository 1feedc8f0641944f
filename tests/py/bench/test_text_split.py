"""The held-out-text benchmark's split and redundancy (bench/memory/text_split.py, run as a program), recomputed
independently on a planted corpus:
  1. which documents are held out: SHA-256 of seed + id, 0 modulo --every, over the first --max-bytes (whole lines);
     the two parts hold the corpus's own lines, in order, and nothing else;
  2. redundancy: held-out documents planted to repeat known word spans of training documents; the share of their
     8-grams found in the training part equals a count made here by searching each 8-gram as a word sequence in
     the training texts (a different algorithm: no n-gram set);
  3. a split with fewer than 2 documents on a side is refused and names the corpus.
Needs only Python. Exits non-zero on failure.
"""
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import check, finish  # noqa: E402

SCRIPT = os.path.join(ROOT, "bench", "memory", "text_split.py")
WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lam", "mu", "nu", "xi"]


def occurs(gram, text_words):
    """gram (a list of words) as a contiguous word sequence of some text"""
    n = len(gram)
    return any(tw[i:i + n] == gram for tw in text_words for i in range(len(tw) - n + 1))


def main():
    rng = random.Random(7)
    w = tempfile.mkdtemp(prefix="dfm-text-split-")
    try:
        docs = []
        for i in range(120):
            words = [rng.choice(WORDS) + str(rng.randrange(50)) for _ in range(rng.randrange(20, 60))]
            if i % 3 == 0 and docs:  # plant a span copied from an earlier document
                src = docs[rng.randrange(len(docs))]["text"].split()
                a = rng.randrange(max(1, len(src) - 12))
                words[5:5] = src[a:a + 12]
            docs.append({"id": "doc-%04d" % i, "text": " ".join(words)})
        corpus = os.path.join(w, "c.jsonl")
        lines = [json.dumps(d) + "\n" for d in docs]
        open(corpus, "w").writelines(lines)
        limit = sum(len(l) for l in lines[:100]) - 1  # the 100th line is the last one read
        out = os.path.join(w, "out")
        p = subprocess.run([sys.executable, SCRIPT, corpus, out, "--seed", "3", "--max-bytes", str(limit), "--every", "4"],
                           capture_output=True, text=True)
        check(p.returncode == 0, "split runs (%s)" % (p.stderr.strip()[-200:] or p.stdout.strip()))
        read = lines[:100]
        held = [l for l in read if int(hashlib.sha256(("3" + json.loads(l)["id"]).encode()).hexdigest(), 16) % 4 == 0]
        kept = [l for l in read if l not in held]
        got_h, got_k = open(os.path.join(out, "heldout.jsonl")).readlines(), open(os.path.join(out, "train.jsonl")).readlines()
        check(got_h == held and got_k == kept, "held out: %d, kept: %d, as SHA-256(seed + id) mod 4 over the first 100 lines "
              "(got %d / %d)" % (len(held), len(kept), len(got_h), len(got_k)))
        tw = [json.loads(l)["text"].split() for l in kept]
        asked = [g for l in held for ws in [json.loads(l)["text"].split()] for g in (ws[i:i + 8] for i in range(len(ws) - 7))]
        want = sum(occurs(g, tw) for g in asked) / len(asked)
        r = json.load(open(os.path.join(out, "redundancy.json")))
        check(r["ngram"] == 8 and r["heldout_ngrams"] == len(asked), "%d held-out 8-grams counted (%s)" % (len(asked), r))
        check(abs(r["in_training_part"] - want) < 1e-12 and want > 0.02,
              "redundancy %.4f equals the word-sequence search's %.4f (planted spans make it non-zero)" % (r["in_training_part"], want))
        p = subprocess.run([sys.executable, SCRIPT, corpus, os.path.join(w, "few"), "--seed", "3", "--max-bytes", "100",
                            "--every", "4"], capture_output=True, text=True)
        check(p.returncode != 0 and "c.jsonl" in p.stderr and "held out" in p.stderr,
              "a split of one line is refused, naming the corpus (%s)" % p.stderr.strip()[-120:])
    finally:
        shutil.rmtree(w, ignore_errors=True)
    finish("the held-out text split")


if __name__ == "__main__":
    main()
