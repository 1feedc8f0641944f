#!/usr/bin/env python3
"""text_split.py — the held-out-text benchmark's split of a JSONL corpus, and its cross-document redundancy.

The corpus's first lines, up to --max-bytes characters of JSONL (whole lines; characters, as the benchmark has always
counted them), are split by document: a document is held out when the SHA-256
of seed + its id is 0 modulo --every (about one in --every, drawn by the seed, independent of order). The rest is
the training part, which is also the datastore the held-out part retrieves from.

Redundancy is a property of the split, measured before anything is trained: the share of the held-out part's word
n-grams (whitespace words, --ngram 8) that occur anywhere in the training part. A dictionary says each thing once
(near 0); a manual whose pages share paragraphs does not. It is what a held-out chunk's memory could hold of what
the chunk goes on to say.

    python3 bench/memory/text_split.py CORPUS.jsonl OUTDIR --seed 1 [--max-bytes 250000] [--every 8] [--ngram 8]
writes OUTDIR/train.jsonl, OUTDIR/heldout.jsonl (the corpus's own lines) and OUTDIR/redundancy.json
({"ngram", "heldout_ngrams", "in_training_part"}). Refuses a split with fewer than 2 documents on either side.
"""
import argparse
import hashlib
import json
import os
import sys


def ngrams(texts, n):
    out = []
    for t in texts:
        w = t.split()
        out += [tuple(w[i:i + n]) for i in range(len(w) - n + 1)]
    return out


def redundancy(train_texts, heldout_texts, n):
    seen, asked = set(ngrams(train_texts, n)), ngrams(heldout_texts, n)
    return {"ngram": n, "heldout_ngrams": len(asked),
            "in_training_part": sum(g in seen for g in asked) / len(asked) if asked else 0.0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--seed", required=True)
    ap.add_argument("--max-bytes", type=int, default=250000, help="split the corpus's first lines up to this many characters")
    ap.add_argument("--every", type=int, default=8, help="hold out about one document in this many")
    ap.add_argument("--ngram", type=int, default=8)
    a = ap.parse_args()
    if a.every < 2 or a.ngram < 1:
        sys.exit("text_split: --every must be at least 2 and --ngram at least 1")
    n, train, held = 0, [], []
    with open(a.corpus, encoding="utf-8") as f:
        for line in f:
            if n >= a.max_bytes:
                break
            n += len(line)
            doc = json.loads(line)
            h = int(hashlib.sha256((a.seed + doc["id"]).encode()).hexdigest(), 16)
            (held if h % a.every == 0 else train).append((line, doc["text"]))
    if len(held) < 2 or len(train) < 2:
        sys.exit("text_split: %s: %d documents held out, %d kept in the first %d bytes: raise --max-bytes or lower --every"
                 % (a.corpus, len(held), len(train), a.max_bytes))
    os.makedirs(a.out, exist_ok=True)
    for name, part in (("train", train), ("heldout", held)):
        with open(os.path.join(a.out, name + ".jsonl"), "w", encoding="utf-8") as f:
            f.writelines(line for line, _ in part)
    r = redundancy([t for _, t in train], [t for _, t in held], a.ngram)
    with open(os.path.join(a.out, "redundancy.json"), "w") as f:
        json.dump(r, f)
    print("text_split: %d documents for training, %d held out; %.1f %% of the held-out %d-grams are in the training part"
          % (len(train), len(held), 100 * r["in_training_part"], a.ngram))


if __name__ == "__main__":
    main()
