#!/usr/bin/env python3
"""probe_tokens.py — the probes of facts.py as LM token sequences laid out on DFM's chunks: an llm.c token
shard for `dfm chunk` (one document per probe and form) and the answer spans to score.

A probe sequence is exactly three chunks of L tokens. Neutral filler fills chunk 0 and the start of chunk 1,
the prompt (question form, or cloze form) ends on chunk 1's last token, and the answer begins chunk 2:

    chunk 0                 chunk 1                          chunk 2
    [filler ............] [.... filler | prompt ......... ] [answer . EOS pad...]

So the answer is predicted by chunk 1's last token, which reads chunk 2's memory (memory_align next): the
memory predicted from chunk 1, or retrieved with chunk 1 (the prompt) as the query. Chunk 0 has no memory.
Each document ends with the EOS id; `dfm chunk --doc-aligned --seq-len 3L` pads it to exactly one sequence. A
short last document follows them, so that the last probe's final token has a successor (its label).

    python3 bench/memory/knowledge/probe_tokens.py --probes P.jsonl --tokenizer tokenizer.json --out DIR [--chunk-len 32]
        [--limit N] [--seed S]
writes DIR/probes.bin (u32 llm.c shard) and DIR/spans.jsonl: one line per sequence, in shard order:
{"seq", "probe", "form", "start", "end", "entity", "fact", "answer"[, "unseen"]}; start/end index the answer's
tokens in the sequence; "unseen" is the probe's (facts.py --unseen), when it has one. --limit N keeps N probes, the
same number of each fact, drawn with --seed. With unseen probes, both subsets are kept, each with the same number of
each fact, and the subsets share the N per fact in proportion to their probes: P = N // facts per fact, of which
the unseen subset takes max(1, round(P x unseen share)) and the seen subset the rest, at least 1 (so N is exceeded
when P < 2), each capped at the probes the subset has of its rarest fact.
"""
import argparse
import json
import os
import random

import numpy as np

FILLER = ("The notes below were copied from an old ledger kept by a county archive. Each entry was checked against "
          "the registers of births, trades and property, and where two sources disagreed the older one was kept. "
          "Spelling follows the originals. Questions put to the archive are answered from these records alone.")


def prompt_ids(filler, prompt, L):
    """The first two chunks of a probe sequence: the filler's tail, then the prompt's tokens ending on chunk 1's last
    token, so that the answer begins chunk 2; None when the prompt does not fit (longer than 2L - 1 tokens, or longer
    than what the filler leaves). FILLER and PROMPT are token ids."""
    need = 2 * L - len(prompt)
    if need < 1 or need > len(filler):
        return None
    return filler[-need:] + prompt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--probes", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--chunk-len", type=int, default=32)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(a.tokenizer)
    enc = lambda s: tk.encode(s, add_special_tokens=False).ids
    eos = tk.token_to_id("<|endoftext|>")
    L = a.chunk_len
    probes = [json.loads(l) for l in open(a.probes)]
    if a.limit:
        rng = random.Random(a.seed)
        facts = sorted({p["fact"] for p in probes})
        per = max(1, a.limit // len(facts))
        subsets = (False, True) if any(p.get("unseen") for p in probes) else (False,)
        pool = {u: {f: [q for q in probes if q["fact"] == f and bool(q.get("unseen")) == u] for f in facts}
                for u in subsets}
        take = {False: per}
        if len(subsets) == 2:  # the subsets share each fact's per in proportion to their probes
            if not all(all(pool[u].values()) for u in subsets):
                raise SystemExit("probe_tokens: the seen and the unseen probes must each hold every fact")
            take[True] = max(1, round(per * sum(p["unseen"] for p in probes) / len(probes)))
            take[False] = max(1, per - take[True])
            take = {u: min(k, min(len(v) for v in pool[u].values())) for u, k in take.items()}
        probes = [p for f in facts for u in subsets for p in rng.sample(pool[u][f], take[u])]
        probes.sort(key=lambda p: p["id"])
    filler = enc(FILLER)
    tokens, spans = [], []
    for p in probes:
        for form in ("question", "cloze"):
            prompt, answer, stop = enc(" " + p[form]), enc(" " + p["answer"]), enc(".")
            doc = prompt_ids(filler, prompt, L)
            if doc is None or len(answer) + len(stop) + 1 > L:
                raise SystemExit(f"probe {p['id']} ({form}): prompt of {len(prompt)} or answer of {len(answer)} tokens "
                                 f"does not fit chunks of {L}")
            assert len(doc) == 2 * L
            seq = len(spans)
            spans.append({"seq": seq, "probe": p["id"], "form": form, "start": 2 * L, "end": 2 * L + len(answer),
                          "entity": p["entity"], "fact": p["fact"], "answer": p["answer"]})
            if "unseen" in p:
                spans[-1]["unseen"] = p["unseen"]
            tokens += doc + answer + stop + [eos]
    # a last short document: every probe sequence's last token then has a next token, as a loader needs
    tokens += filler[:8] + [eos]
    os.makedirs(a.out, exist_ok=True)
    hdr = np.zeros(256, np.int32)
    hdr[:3] = (20240801, 7, len(tokens))
    with open(os.path.join(a.out, "probes.bin"), "wb") as f:
        f.write(hdr.tobytes() + np.asarray(tokens, np.uint32).tobytes())
    with open(os.path.join(a.out, "spans.jsonl"), "w") as f:
        for s in spans:
            f.write(json.dumps(s) + "\n")
    note = ", %d of them unseen" % sum(p["unseen"] for p in probes) if any("unseen" in p for p in probes) else ""
    print(f"probe_tokens: {len(spans)} sequences of {3 * L} ({len(probes)} probes x 2 forms{note}) -> {a.out}")


if __name__ == "__main__":
    main()
