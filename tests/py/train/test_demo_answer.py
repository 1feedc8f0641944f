"""The demo's answer from memory (scripts/demo_answer.py) against an independent computation.

- A tiny real run (a few GCIDE documents: chunk, encode, index, retrieve with K = 4, write-targets), a 1-layer
  backbone pretrained on its tokens for two steps and DFM modules trained on it for three.
- The passage it chooses, at several hold-outs, equals the one chosen here by the rule it states: among the chunks of the last VAL
  sequences (never a sequence's chunk 0), the one whose target record holds the neighbour with the largest token-set
  Jaccard over text tokens (the filler after a document's end never counts); records read by the pure-Python reader
  (python/dfm_targets.py), tokens from the chunk shards' bytes. The Jaccard it prints is the one computed here.
- The text it says follows is that chunk's; its continuations are one chunk long, and the fusion-off one is what
  `dfm-train generate --no-memory` gives for the prompt built here (the sequence from its start up to the chunk);
  the tokens-right counts are recomputed from the ids; the prompt's length is that sequence's.
- With --probes (a facts.py probe file): the questions asked are the first probe of each fact, taken in turn over the
  entity kinds, as it states; each prompt is the knowledge probes' own layout (the first two chunks of that probe's
  question-form sequence in probe_tokens.py's shard, run here as a program); with modules on the real frozen LM (one
  step), whose answers depend on the prompt, the fusion-off answer is what `dfm-train generate --no-memory` gives for
  that prompt, as long as the answer, and is marked right exactly when its
  ids are the answer's; the tally of exact answers is the count of "[right]" marks.
- More held-out sequences than the run has is refused with its reason.
Exits non-zero on failure. Env: DFM, DFM_TRAIN, DFM_CORPUS, DFM_LM (tests/run.sh sets them).
"""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dfm.targets import open_run  # noqa: E402
from test_train_reading import chunks, targets_run  # noqa: E402  (the chunk shards' tokens; a tiny run with targets)
from train_cli import DFM_TRAIN, check, finish, run, workdir  # noqa: E402

LM = os.environ.get("DFM_LM", "/var/cache/dfm/models/smollm2-135m")
L, T, K, VAL = 16, 64, 4, 3


def choose(run_dir, val):
    """(chunks, (chunk, neighbour, Jaccard)) by demo_answer's stated rule, computed here"""
    ch = chunks(run_dir)
    per_seq = T // L
    n_seq = len(ch) // per_seq
    words = [set(t[:nv].tolist()) for t, nv in ch]  # doc-aligned chunks: text first, filler after
    tr = open_run(run_dir, backend="python")
    best = None
    for s in range(n_seq - val, n_seq):
        for c in range(s * per_seq + 1, (s + 1) * per_seq):
            rec = tr.get(c)
            for n, live in zip(rec["ids"], rec["mask"]):
                if not live:
                    continue
                u = words[int(n)] | words[c]
                j = len(words[int(n)] & words[c]) / max(len(u), 1)
                if best is None or j > best[2]:
                    best = (c, int(n), j)
    return ch, best


def main():
    w = workdir("dfm-demo-answer-")
    r = targets_run(w, 6, L, T, K)
    tok = os.path.join(LM, "tokenizer.json")
    common = ["--seq-len", T, "--batch", 2, "--val-seqs", 2, "--eval-batches", 1, "--threads", 1]
    run("pretrain", "--data", r, "--out", os.path.join(w, "pre"), "--layers", 1, "--hidden", 32, "--heads", 2,
        "--kv-heads", 1, "--steps", 2, *common)
    bb = os.path.join(w, "pre", "model")
    run("train", "--backbone", bb, "--data", r, "--targets", r, "--chunk-len", L, "--fusion-layers", 0,
        "--pred-hidden", 16, "--pred-heads", 2, "--steps", 3, "--no-ckpt", "--out", os.path.join(w, "dfm"), *common)
    mods = os.path.join(w, "dfm", "dfm_modules.safetensors")
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "demo_answer.py"), r, "--train", DFM_TRAIN, "--backbone", bb,
           "--modules", mods, "--tokenizer", tok, "--fusion-layers", "0", "--threads", "1"]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    ch = chunks(r)
    n_seq = len(ch) // (T // L)
    # the choice at several hold-outs (each a different set of candidates, so that a wrong rule shows somewhere)
    for val in sorted({1, 2, VAL, n_seq // 2, n_seq - 1}):
        p = subprocess.run(cmd + ["--val", str(val)], capture_output=True, text=True, env=env)
        check(p.returncode == 0, "demo_answer.py --val %d runs on a tiny run (exit %d): %s" % (
            val, p.returncode, p.stderr.strip()[-300:]))
        _, (c, nbr, jac) = choose(r, val)
        m = re.search(r"held-out chunk (\d+): its memory holds chunk (\d+) of .*\(token Jaccard ([\d.]+) with it\)",
                      p.stdout)
        check(m is not None and (int(m.group(1)), int(m.group(2))) == (c, nbr) and abs(float(m.group(3)) - jac) < 0.006,
              "--val %d: the chosen chunk and neighbour are those of the stated rule: printed %s, computed chunk %d, "
              "neighbour %d, Jaccard %.2f" % (val, (m.groups() if m else None), c, nbr, jac))
    out = p.stdout
    print(out)

    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(tok)
    show = lambda ids: tk.decode(ids).replace("\n", " ").strip()
    truth = ch[c][0].tolist()
    check(("what follows           : %s\n" % show(truth)) in out, "the text said to follow is the chunk's own")
    start = c - c % (T // L)
    prompt = [x for t, _ in ch[start:c] for x in t.tolist()]
    check(("prompt: its sequence from the start, %d tokens;" % len(prompt)) in out,
          "the prompt is the chunk's sequence from its start up to it: %d tokens" % len(prompt))
    g = run("generate", "--backbone", bb, "--modules", mods, "--tokenizer", tok, "--prompt-ids", ",".join(map(str, prompt)),
            "--max-new", L, "--chunk-len", L, "--threads", 1, "--no-memory")
    ids = [int(x) for x in [ln for ln in g.stdout.splitlines() if ln.startswith("ids:")][0][4:].strip().split(",")]
    right = sum(x == y for x, y in zip(ids, truth))
    check(len(ids) == L and ("fusion off             : %s   [%d/%d tokens right]" % (show(ids), right, L)) in out,
          "the fusion-off continuation is one chunk of dfm-train generate --no-memory on the sequence up to the chunk, "
          "%d of %d tokens right" % (right, L))
    mp = re.search(r"predicted memory \(DFM\) : .*\[(\d+)/(\d+) tokens right\]", out)
    check(mp is not None and int(mp.group(2)) == L and 0 <= int(mp.group(1)) <= L,
          "the predicted-memory continuation is scored out of one chunk: %s" % ((mp.groups() if mp else None),))
    check(("the memory's neighbour : %s\n" % show(ch[nbr][0].tolist())) in out, "the neighbour shown is the chosen one")

    # questions about invented entities: the stated choice, the knowledge probes' layout, generate's answers
    know = os.path.join(ROOT, "bench", "memory", "knowledge")
    subprocess.run([sys.executable, os.path.join(know, "facts.py"), "--out", os.path.join(w, "facts"), "--entities", "12",
                    "--seed", "2"], check=True, capture_output=True)
    probes_file = os.path.join(w, "facts", "probes.jsonl")
    probes = [json.loads(x) for x in open(probes_file)]
    first = {}
    for pr in probes:
        first.setdefault((pr["kind"], pr["fact"]), pr)
    kinds = sorted({k for k, _ in first})
    want = []
    for i in range(max(sum(k == kind for k, _ in first) for kind in kinds)):
        for kind in kinds:
            of_kind = [pr for (k, _), pr in first.items() if k == kind]
            if i < len(of_kind):
                want.append(of_kind[i])
    want = want[:4]
    sub = os.path.join(w, "facts", "chosen.jsonl")
    with open(sub, "w") as f:
        for pr in want:
            f.write(json.dumps(pr) + "\n")
    subprocess.run([sys.executable, os.path.join(know, "probe_tokens.py"), "--probes", sub, "--tokenizer", tok, "--out",
                    os.path.join(w, "facts", "pt"), "--chunk-len", str(L)], check=True, capture_output=True)
    import numpy as np
    shard = np.fromfile(os.path.join(w, "facts", "pt", "probes.bin"), np.uint32)[256:]
    spans = [json.loads(x) for x in open(os.path.join(w, "facts", "pt", "spans.jsonl"))]
    # modules on the real frozen LM (one step), so that what it answers depends on the prompt it is given
    run("train", "--backbone", LM, "--data", r, "--targets", r, "--chunk-len", L, "--fusion-layers", 29, "--steps", 1,
        "--no-ckpt", "--out", os.path.join(w, "dfm-lm"), *common)
    lm_mods = os.path.join(w, "dfm-lm", "dfm_modules.safetensors")
    lm_cmd = [sys.executable, os.path.join(ROOT, "scripts", "demo_answer.py"), r, "--train", DFM_TRAIN, "--backbone", LM,
              "--modules", lm_mods, "--tokenizer", tok, "--fusion-layers", "29", "--threads", "1"]
    p = subprocess.run(lm_cmd + ["--val", "1", "--probes", probes_file, "--n-probes", "4"], capture_output=True, text=True,
                       env=env)
    check(p.returncode == 0, "demo_answer.py --probes runs (exit %d): %s" % (p.returncode, p.stderr.strip()[-300:]))
    asked = re.findall(r"^   (.+\? Answer:)  \(truth: (.+)\)$", p.stdout, re.M)
    check(asked == [(pr["question"], pr["answer"]) for pr in want],
          "the questions asked are the first probe of each fact, in turn over the kinds: %s" % [q for q, _ in asked])
    said = re.findall(r"^       fusion off: (.*?) \[(right|wrong)\] +predicted memory: .* \[(right|wrong)\]$", p.stdout, re.M)
    check(len(said) == len(want), "each question has a fusion-off and a predicted-memory answer (%d lines)" % len(said))
    eos = tk.token_to_id("<|endoftext|>")
    docs, cur = [], []
    for t in shard.tolist():                      # the shard's documents: each probe's question form, then its cloze
        cur.append(t)
        if t == eos:
            docs.append(cur)
            cur = []
    n_right = 0
    for pr, (text, mark, pmark) in zip(want, said):
        sp = next(x for x in spans if x["probe"] == pr["id"] and x["form"] == "question")
        doc = docs[sp["seq"]]
        prompt, answer = doc[:2 * L], doc[sp["start"]:sp["end"]]
        g = run("generate", "--backbone", LM, "--modules", lm_mods, "--prompt-ids", ",".join(map(str, prompt)),
                "--max-new", len(answer), "--chunk-len", L, "--threads", 1, "--no-memory")
        ids = [int(x) for x in [ln for ln in g.stdout.splitlines() if ln.startswith("ids:")][0][4:].strip().split(",")]
        check(text == tk.decode(ids).replace("\n", " ").strip() and (mark == "right") == (ids == answer),
              "%s: the fusion-off answer is generate --no-memory on the probes' own prompt (%r, %s)" %
              (pr["question"], text, mark))
        n_right += (mark == "right") + (pmark == "right")
    tally = re.search(r"answered exactly: fusion off (\d+)/(\d+), predicted memory (\d+)/(\d+)", p.stdout)
    check(tally is not None and int(tally.group(1)) + int(tally.group(3)) == n_right and int(tally.group(2)) == len(want),
          "the tally counts the right marks: %s" % (tally.groups() if tally else None,))

    p = subprocess.run(cmd + ["--val", str(n_seq)], capture_output=True, text=True, env=env)
    check(p.returncode != 0 and "too few to hold out" in p.stderr,
          "holding out every sequence is refused: %s" % (p.stderr.strip().splitlines() or ["(nothing)"])[-1])
    finish("the demo's answer from memory")


if __name__ == "__main__":
    main()
