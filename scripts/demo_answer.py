#!/usr/bin/env python3
"""demo_answer.py — the demo's answer from memory: one held-out passage continued by `dfm-train generate`,
with fusion off (the frozen LM alone) and with the memory the trained predictor gives (DFM at inference,
no retrieval), beside the text that really follows.

Which passage: among the chunks of the run's held-out sequences (the last VAL of its sequences, which no
training step saw), the one whose target record holds the neighbour closest to it (token-set Jaccard of
the neighbour with the chunk itself, over the tokens of text, never the filler after a document's end): the place where retrieval found the same words on another page, so
where memory has something to give. The choice reads the retrieval only, never the model's output. The
prompt is its sequence from the start up to that chunk; one chunk's length of tokens is generated greedily.

Both continuations are scored by the tokens they get right, position by position, against the true chunk.

  python3 scripts/demo_answer.py RUN --train dfm-train --backbone DIR --modules FILE --tokenizer FILE
                                  [--val 8] [--pred-input-layer K] [--fusion-layers LIST] [--threads N]
Needs the dfm Python package (python/, on PYTHONPATH) and the `tokenizers` wheel.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

import dfm


def pick(run, val):
    """(sequence start chunk, chosen chunk, its best neighbour id, Jaccard) among the held-out sequences"""
    tok, pad, L = dfm.load_tokens(run)
    chunks = tok.reshape(-1, L)
    text = pad.reshape(-1, L) == 0 if pad is not None else np.ones_like(chunks, bool)
    seq_len = json.load(open(os.path.join(run, "manifest.json")))["stages"]["chunk"]["config"]["seq-len"]
    per_seq = seq_len // L
    n_seq = len(chunks) // per_seq
    if n_seq < val + 1:
        sys.exit(f"demo_answer: {run} has {n_seq} sequences, too few to hold out {val}")
    sets = [frozenset(c[t].tolist()) for c, t in zip(chunks, text)]
    best = None
    with dfm.open_run(run) as tr:
        for s in range(n_seq - val, n_seq):
            for c in range(s * per_seq + 1, (s + 1) * per_seq):  # chunk 0 of a sequence has no memory
                rec = tr.get(c)
                for n in rec["ids"][rec["mask"]]:
                    j = len(sets[n] & sets[c]) / max(len(sets[n] | sets[c]), 1)
                    if best is None or j > best[3]:
                        best = (s * per_seq, c, int(n), j)
    return chunks, best


def generate(a, prompt, memory, n):
    cmd = [a.train, "generate", "--backbone", a.backbone, "--modules", a.modules, "--tokenizer", a.tokenizer,
           "--prompt-ids", ",".join(map(str, prompt)), "--max-new", str(n), "--chunk-len", str(n), "--threads", str(a.threads),
           "--pred-input-layer", str(a.pred_input_layer), "--fusion-layers", a.fusion_layers]
    if not memory:
        cmd.append("--no-memory")
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"demo_answer: {' '.join(cmd[:2])} failed:\n{out.stderr[-2000:]}")
    ids = [ln for ln in out.stdout.splitlines() if ln.startswith("ids:")][0][4:].strip()
    return [int(x) for x in ids.split(",")] if ids else []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("--train", required=True)
    ap.add_argument("--backbone", required=True)
    ap.add_argument("--modules", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--val", type=int, default=8)
    ap.add_argument("--pred-input-layer", type=int, default=0)
    ap.add_argument("--fusion-layers", default="26,29")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(a.tokenizer)
    chunks, (start, c, nbr, jac) = pick(a.run, a.val)
    prompt = chunks[start:c].reshape(-1).tolist()
    L = chunks.shape[1]
    truth = chunks[c].tolist()

    def show(ids):
        return tk.decode(ids).replace("\n", " ").strip()

    def right(ids):
        return sum(x == y for x, y in zip(ids, truth))

    off, pred = generate(a, prompt, False, L), generate(a, prompt, True, L)
    exclude = json.load(open(os.path.join(a.run, "manifest.json")))["stages"]["retrieve"]["config"].get("exclude")
    where = "another document" if exclude == "document" else "the datastore (exclusion: %s)" % exclude
    print(f"   held-out chunk {c}: its memory holds chunk {nbr} of {where} (token Jaccard {jac:.2f} with it)")
    print(f"   prompt: its sequence from the start, {len(prompt)} tokens; the last 160 characters: ...{show(prompt)[-160:]}")
    print(f"   what follows           : {show(truth)}")
    print(f"   fusion off             : {show(off)}   [{right(off)}/{L} tokens right]")
    print(f"   predicted memory (DFM) : {show(pred)}   [{right(pred)}/{L} tokens right]")
    print(f"   the memory's neighbour : {show(chunks[nbr].tolist())}")


if __name__ == "__main__":
    main()
