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

With --probes (facts.py's probes.jsonl of the invented-entity facts the demo mixes into its corpus): questions about
those entities, in the question form no corpus document uses, each laid out as the knowledge probes are
(bench/memory/knowledge/probe_tokens.py: filler, then the question ending on chunk 1's last token, so the answer
begins chunk 2 and reads the memory predicted from the question's chunk). The first probe of each fact in the
file's order, taken in turn over the entity kinds, up to --n-probes: the choice never reads the model. Each is
answered greedily with fusion off and with predicted memory; an answer is exact when its first tokens are the true
answer's.

  python3 scripts/demo_answer.py RUN --train dfm-train --backbone DIR --modules FILE --tokenizer FILE
                                  [--val 8] [--pred-input-layer K] [--fusion-layers LIST] [--threads N]
                                  [--probes PROBES.jsonl] [--n-probes 6]
Needs the dfm Python package (python/, on PYTHONPATH) and the `tokenizers` wheel.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

import dfm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "memory", "knowledge"))


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


def generate(a, prompt, memory, n, L):
    cmd = [a.train, "generate", "--backbone", a.backbone, "--modules", a.modules, "--tokenizer", a.tokenizer,
           "--prompt-ids", ",".join(map(str, prompt)), "--max-new", str(n), "--chunk-len", str(L), "--threads", str(a.threads),
           "--pred-input-layer", str(a.pred_input_layer), "--fusion-layers", a.fusion_layers]
    if not memory:
        cmd.append("--no-memory")
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"demo_answer: {' '.join(cmd[:2])} failed:\n{out.stderr[-2000:]}")
    ids = [ln for ln in out.stdout.splitlines() if ln.startswith("ids:")][0][4:].strip()
    return [int(x) for x in ids.split(",")] if ids else []


def answer_probes(a, tk, L):
    """the questions about the invented entities, answered with fusion off and with predicted memory"""
    from probe_tokens import FILLER, prompt_ids
    enc = lambda text: tk.encode(text, add_special_tokens=False).ids
    first = {}  # the first probe of each fact, then taken in turn over the entity kinds (person, town, workshop)
    for p in map(json.loads, open(a.probes)):
        first.setdefault((p["kind"], p["fact"]), p)
    kinds = sorted({k for k, _ in first})
    turns = [[p for (k, _), p in first.items() if k == kind] for kind in kinds]
    chosen = [t[i] for i in range(max(map(len, turns))) for t in turns if i < len(t)][:a.n_probes]
    filler, right = enc(FILLER), {"off": 0, "pred": 0}
    print(f"   {len(chosen)} questions about the invented entities of the corpus's facts, each worded as no document words it")
    for p in chosen:
        prompt, answer = prompt_ids(filler, enc(" " + p["question"]), L), enc(" " + p["answer"])
        if prompt is None:
            sys.exit(f"demo_answer: probe {p['id']}: its question does not fit two chunks of {L} tokens")
        said = {}
        for mode in ("off", "pred"):
            ids = generate(a, prompt, mode == "pred", len(answer), L)
            said[mode] = "%s [%s]" % (tk.decode(ids).replace("\n", " ").strip(),
                                      "right" if ids[:len(answer)] == answer else "wrong")
            right[mode] += ids[:len(answer)] == answer
        print(f"   {p['question']}  (truth: {p['answer']})")
        print(f"       fusion off: {said['off']:<24} predicted memory: {said['pred']}")
    n = len(chosen)
    print(f"   answered exactly: fusion off {right['off']}/{n}, predicted memory {right['pred']}/{n}"
          " (bench/results/reading.md measures this on 240 probes a seed)")


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
    ap.add_argument("--probes", help="facts.py's probes.jsonl: also answer questions about the corpus's invented entities")
    ap.add_argument("--n-probes", type=int, default=6)
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

    off, pred = generate(a, prompt, False, L, L), generate(a, prompt, True, L, L)
    exclude = json.load(open(os.path.join(a.run, "manifest.json")))["stages"]["retrieve"]["config"].get("exclude")
    where = "another document" if exclude == "document" else "the datastore (exclusion: %s)" % exclude
    print(f"   held-out chunk {c}: its memory holds chunk {nbr} of {where} (token Jaccard {jac:.2f} with it)")
    print(f"   prompt: its sequence from the start, {len(prompt)} tokens; the last 160 characters: ...{show(prompt)[-160:]}")
    print(f"   what follows           : {show(truth)}")
    print(f"   fusion off             : {show(off)}   [{right(off)}/{L} tokens right]")
    print(f"   predicted memory (DFM) : {show(pred)}   [{right(pred)}/{L} tokens right]")
    print(f"   the memory's neighbour : {show(chunks[nbr].tolist())}")
    if a.probes:
        answer_probes(a, tk, L)


if __name__ == "__main__":
    main()
