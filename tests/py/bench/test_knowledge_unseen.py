"""Unseen entities of the knowledge probes (bench/memory/knowledge/: facts.py --unseen, probe_tokens.py, held_out.py,
score.py, each run as a program), read back independently:
  1. facts.py --entities 40 --unseen 12: twelve entities flagged unseen in the probes and in unseen.json; no unseen
     entity's name (a whole word) in any document before the tail, and three tail documents state each unseen fact
     (a sentence naming the entity with the answer); three head documents state each seen fact; the same check on the
     split moved one document later finds an unseen name in the head (the check can fail); --unseen 0 writes the
     bytes the script wrote before the option existed (checksums of seed 1, 40 entities); --unseen 3 is refused;
  2. probe_tokens.py --limit 24: spans carry the flag; both subsets, each with the same number of every fact;
  3. held_out.py on a `dfm chunk` run of the corpus (doc-aligned, 32-token chunks, 256-token sequences): with its
     --val-seqs, `dfm-train dump-batches` (the trainer's own loader) trains on no sequence naming an unseen entity,
     and with one sequence fewer held out it would; the same for the reading set (`--objective reconstruct`, after
     `dfm encode`), one chunk fewer; a corpus.jsonl of another order, and a run of another corpus with as many
     documents (the --unseen 0 one), are refused;
  4. score.py on reading-stage modules (one step) and a tokens-only probe run, two sequences of each subset:
     "seen" and "unseen" have every mode of "all", their n add up to all's, and all's means are their n-weighted
     means.
1 needs only Python; 2-4 SKIP without the LM (make lm), 3-4 without the build (make). Exits non-zero on failure.
Env: DFM, DFM_TRAIN, DFM_LM, DFM_MODEL (tests/run.sh sets them).
"""
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import check, finish, worst_diff  # noqa: E402

KNOW = os.path.join(ROOT, "bench", "memory", "knowledge")
DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))
DFM_TRAIN = os.environ.get("DFM_TRAIN", os.path.join(ROOT, "build", "dfm-train"))
LM = os.environ.get("DFM_LM", "/var/cache/dfm/models/smollm2-135m")
MODEL = os.environ.get("DFM_MODEL", "/var/cache/dfm/models/all-MiniLM-L6-v2")
TOK = os.path.join(LM, "tokenizer.json")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", DFM_LOG_LEVEL="warn",
           DFM_PROGRESS="0")
L, T = 32, 256
# sha256 of facts.py --entities 40 --seed 1 before --unseen existed (commit 838c9d1): --unseen 0 must keep them
GOLDEN = {"corpus.jsonl": "a03b216dc7d33e955c711c3bf36cd3ef1bf2e22c636f3f0e4da0c4879ebc92db",
          "probes.jsonl": "eedd8ec1e93c0d3463370f5d2f788067c1a0ff1f4172e922e9135593dd45642b"}


def sh(*args, ok=True):
    p = subprocess.run([str(a) for a in args], env=ENV, capture_output=True, text=True, errors="replace")
    if ok and p.returncode:
        print(p.stdout[-2000:], p.stderr[-2000:])
        raise SystemExit("failed: " + " ".join(str(a) for a in args[:4]))
    return p


def named(name, text):
    return re.search(r"\b%s\b" % re.escape(name), text) is not None


def stating(docs, probe):
    """how many of docs hold a sentence naming the probe's entity together with its answer"""
    return sum(any(named(probe["entity"], s) and probe["answer"] in s for s in re.split(r"(?<=\.) ", d["text"]))
               for d in docs)


def split_ok(docs, probes, head):
    """(no unseen name in docs[:head], every seen fact stated 3 times there, every unseen fact 3 times after it)"""
    unseen = {p["entity"] for p in probes if p["unseen"]}
    head_text = " ".join(d["text"] for d in docs[:head])
    clean = not any(named(e, head_text) for e in unseen)
    seen3 = all(stating(docs[:head], p) >= 3 for p in probes if not p["unseen"])
    unseen3 = all(stating(docs[head:], p) >= 3 for p in probes if p["unseen"])
    return clean, seen3, unseen3


def facts(w):
    py = sys.executable
    sh(py, os.path.join(KNOW, "facts.py"), "--out", w + "/f0", "--entities", 40, "--seed", 1, "--unseen", 0)
    for f, h in GOLDEN.items():
        got = hashlib.sha256(open(os.path.join(w, "f0", f), "rb").read()).hexdigest()
        check(got == h, "--unseen 0: %s is byte for byte what facts.py wrote before --unseen (sha256 %s)" % (f, got[:12]))
    check(not os.path.exists(w + "/f0/unseen.json"), "--unseen 0 writes no unseen.json")
    p = sh(py, os.path.join(KNOW, "facts.py"), "--out", w + "/bad", "--entities", 40, "--unseen", 3, ok=False)
    check(p.returncode != 0 and "--unseen 3" in p.stderr, "--unseen 3 is refused (a world of fewer than 5 entities)")
    out = sh(py, os.path.join(KNOW, "facts.py"), "--out", w + "/f", "--entities", 40, "--seed", 3, "--unseen", 12).stdout
    docs = [json.loads(l) for l in open(w + "/f/corpus.jsonl")]
    probes = [json.loads(l) for l in open(w + "/f/probes.jsonl")]
    split = json.load(open(w + "/f/unseen.json"))
    head = split["head_documents"]
    unseen = sorted({p["entity"] for p in probes if p["unseen"]})
    check(len(unseen) == 12 and unseen == sorted(split["unseen_entities"]) and all("unseen" in p for p in probes),
          "12 unseen entities, the same in probes.jsonl and unseen.json; every probe flagged")
    check(split["documents"] == len(docs) and docs[head]["id"] == split["first_unseen_document"],
          "unseen.json: %d documents, the tail from document %d (%s)" % (len(docs), head, docs[head]["id"]))
    tail_chars = len(" ".join(d["text"] for d in docs[head:]))
    check(split["tail_characters"] == tail_chars and ("(%d characters)" % tail_chars) in out,
          "the tail's %d characters recorded and printed: %s" % (tail_chars, out.strip()))
    clean, seen3, unseen3 = split_ok(docs, probes, head)
    check(clean, "no unseen entity is named in the %d head documents" % head)
    check(seen3, "every seen fact is stated in three head documents")
    check(unseen3, "every unseen fact is stated in three tail documents")
    check(not split_ok(docs, probes, head + 1)[0], "planted: the split one document later names an unseen entity "
                                                   "in the head (the check can fail)")
    return docs, probes, split, unseen


def probe_spans(w):
    sh(sys.executable, os.path.join(KNOW, "probe_tokens.py"), "--probes", w + "/f/probes.jsonl", "--tokenizer", TOK,
       "--out", w + "/pt", "--limit", 24, "--seed", 3)
    spans = [json.loads(l) for l in open(w + "/pt/spans.jsonl")]
    count = {}
    for s in spans:
        count.setdefault(s["unseen"], {}).setdefault(s["fact"], 0)
        count[s["unseen"]][s["fact"]] += 1
    per = {u: sorted(set(c.values())) for u, c in count.items()}
    check(all("unseen" in s for s in spans) and set(count) == {False, True}
          and all(len(c) == 12 and len(per[u]) == 1 for u, c in count.items()),
          "probe_tokens --limit 24: spans flagged, both subsets, every fact the same number of times in each "
          "(sequences per fact: seen %s, unseen %s)" % (per.get(False), per.get(True)))
    return spans


def decode_fn():
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(TOK)
    return lambda ids: tk.decode([int(i) for i in ids if i >= 0])


def trained_text(w, name, decode, val, reading):
    """the text of every sequence of one epoch of dfm-train's training split (--batch 1) with --val-seqs val"""
    from dfm.data import read_dump
    out = os.path.join(w, name + ".dump")
    args = ["dump-batches", "--data", w + "/run", "--out", out, "--batch", 1, "--chunk-len", L, "--val-seqs", val]
    args += ["--objective", "reconstruct", "--backbone", LM] if reading else ["--seq-len", T]
    sh(DFM_TRAIN, *args)
    batches = read_dump(out)
    # reading: the chunk is the sequence's second half (the first is the constant prompt)
    return [decode(b.tokens[0][L:] if reading else b.tokens[0]) for b in batches], [int(b.idx[0]) for b in batches]


def held_out(w, unseen, decode):
    sh(DFM, "chunk", w + "/run", w + "/f/corpus.jsonl", "--tokenizer", TOK, "--chunk-len", L, "--seq-len", T,
       "--doc-aligned")
    p = sh(sys.executable, os.path.join(KNOW, "held_out.py"), "--run", w + "/run", "--split", w + "/f/unseen.json",
           "--tokenizer", TOK)
    dfm_val, read_val = map(int, p.stdout.split())
    print(p.stderr.strip())
    n_seq = (json.load(open(w + "/run/manifest.json"))["stages"]["chunk"]["counts"]["chunks"] * L - 1) // T
    texts, idx = trained_text(w, "train", decode, dfm_val, False)
    leak = [e for e in unseen if any(named(e, t) for t in texts)]
    check(sorted(idx) == list(range(n_seq - dfm_val)) and not leak,
          "dfm-train --val-seqs %d: it trains on sequences 0..%d, none naming an unseen entity %s"
          % (dfm_val, n_seq - dfm_val - 1, leak[:3]))
    texts, _ = trained_text(w, "train1", decode, dfm_val - 1, False)
    check(any(named(e, t) for e in unseen for t in texts), "with --val-seqs %d it would train on an unseen entity"
          % (dfm_val - 1))
    sh(DFM, "encode", w + "/run", "--model", MODEL, "--device", "cpu")
    texts, idx = trained_text(w, "read", decode, read_val, True)
    leak = [e for e in unseen if any(named(e, t) for t in texts)]
    check(len(idx) > 0 and not leak, "reading --val-seqs %d: its %d training chunks name no unseen entity %s"
          % (read_val, len(idx), leak[:3]))
    texts, _ = trained_text(w, "read1", decode, read_val - 1, True)
    check(any(named(e, t) for e in unseen for t in texts), "with --val-seqs %d the reading stage would train on an "
                                                             "unseen entity" % (read_val - 1))
    # a corpus.jsonl of another order (the run is not its run): refused
    lines = open(w + "/f/corpus.jsonl").read().splitlines()
    with open(w + "/other.jsonl", "w") as f:
        f.write("\n".join(lines[1:] + lines[:1]) + "\n")
    p = sh(sys.executable, os.path.join(KNOW, "held_out.py"), "--run", w + "/run", "--split", w + "/f/unseen.json",
           "--corpus", w + "/other.jsonl", "--tokenizer", TOK, ok=False)
    check(p.returncode != 0, "held_out.py refuses a corpus.jsonl of another order: %s" % p.stderr.strip()[-160:])
    # a stale run: built from the --unseen 0 corpus (as many documents, another text) in the same folder
    sh(DFM, "chunk", w + "/run0", w + "/f0/corpus.jsonl", "--tokenizer", TOK, "--chunk-len", L, "--seq-len", T,
       "--doc-aligned")
    p = sh(sys.executable, os.path.join(KNOW, "held_out.py"), "--run", w + "/run0", "--split", w + "/f/unseen.json",
           "--tokenizer", TOK, ok=False)
    check(p.returncode != 0, "held_out.py refuses a run of another corpus with as many documents: %s"
          % p.stderr.strip()[-160:])
    return read_val


def scores(w, read_val, spans):
    sh(DFM_TRAIN, "train", "--objective", "reconstruct", "--backbone", LM, "--data", w + "/run", "--out", w + "/read",
       "--chunk-len", L, "--slots", 4, "--batch", 2, "--steps", 1, "--lr", "1e-3", "--warmup", 1, "--val-seqs", read_val,
       "--eval-batches", 1, "--threads", 2, "--no-ckpt")
    sh(DFM, "chunk", w + "/probes", w + "/pt/probes.bin", "--tokenizer", TOK, "--chunk-len", L, "--seq-len", 3 * L,
       "--doc-aligned")
    # four sequences (two of each subset: the shuffled control needs another entity, which the other subset has) keep the
    # LM's forward passes few
    spans = [s for s in spans if not s["unseen"]][::8][:2] + [s for s in spans if s["unseen"]][::8][:2]
    with open(w + "/spans4.jsonl", "w") as f:
        f.write("".join(json.dumps(s) + "\n" for s in spans))
    sh(sys.executable, os.path.join(KNOW, "score.py"), "--backbone", LM, "--modules", w + "/read/dfm_modules.safetensors",
       "--run", w + "/probes", "--spans", w + "/spans4.jsonl", "--probes", w + "/f/probes.jsonl", "--corpus-run",
       w + "/run", "--tokenizer", TOK, "--out", w + "/score.json", "--threads", 2)
    r = json.load(open(w + "/score.json"))
    al, se, un = r["all"], r.get("seen"), r.get("unseen")
    check(se is not None and un is not None and set(se) == set(un) == set(al)
          and all(set(se[m]) == set(al[m]) for m in al), "score.json: seen and unseen summaries with all's modes "
                                                         "and keys (%s)" % sorted(al))
    if se is None or un is None:
        return
    n_un = sum(s["unseen"] for s in spans)
    bad = [m for m in al if se[m]["n"] + un[m]["n"] != al[m]["n"] or un[m]["n"] != n_un]
    check(not bad, "seen n + unseen n = all n in every mode (%d + %d = %d)" % (se["none"]["n"], un["none"]["n"],
                                                                             al["none"]["n"]))
    pairs = [(al[m][k], (se[m]["n"] * se[m][k] + un[m]["n"] * un[m][k]) / al[m]["n"]) for m in al
             for k in ("logprob", "exact")]
    off = worst_diff([a for a, _ in pairs], [b for _, b in pairs])  # NaN-safe: a NaN counts as inf
    check(off < 1e-9, "all's log-prob and exact match are the n-weighted means of seen and unseen (worst %.2g)" % off)


def main():
    with tempfile.TemporaryDirectory(prefix="dfm-test-unseen-") as w:
        _, _, _, unseen = facts(w)
        if not os.path.exists(TOK):
            print("SKIP: probe_tokens, held_out and score of unseen entities: no LM at %s (make lm)" % LM)
            return finish("unseen entities")
        spans = probe_spans(w)
        if not (os.access(DFM, os.X_OK) and os.access(DFM_TRAIN, os.X_OK)):
            print("SKIP: held_out and score of unseen entities: %s or %s not built (make)" % (DFM, DFM_TRAIN))
            return finish("unseen entities")
        read_val = held_out(w, unseen, decode_fn())
        scores(w, read_val, spans)
    finish("unseen entities")


if __name__ == "__main__":
    main()
