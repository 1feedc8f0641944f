"""dfm-train on the pipeline's own artefacts: a `dfm chunk` run and its LMDB target shards.

Builds a tiny run (a few GCIDE documents: chunk -> encode -> index -> retrieve -> write-targets), pretrains
a 1-layer backbone on the run's tokens for two steps, trains the DFM modules with --targets RUN (read
through shard/target_reader.h: K and d come from the run) and evaluates. Then checks that targets are
refused for tokens of another run (manifest mismatch), and that targets written with --slots-hold both (2K
slots: the neighbours, then their continuations) train and evaluate with K = 2K read from the run. Exits
non-zero on failure.
Env: DFM (dfm), DFM_TRAIN (dfm-train), DFM_CORPUS, DFM_TOKENIZER, DFM_MODEL (set by tests/run.sh).
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))
DFM_TRAIN = os.environ.get("DFM_TRAIN", os.path.join(ROOT, "build", "dfm-train"))
CORPUS = os.environ.get("DFM_CORPUS", "/var/cache/dfm/corpus/gcide.jsonl")
TOKENIZER = os.environ.get("DFM_TOKENIZER", "/var/cache/dfm/tokenizers/qwen2.5/tokenizer.json")


def run(*args, ok=True):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, errors="replace")
    if ok and p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        raise SystemExit("failed: %s" % " ".join(str(a) for a in args[:3]))
    return p


def make_run(w, name, first, n):
    lines = open(CORPUS).read().splitlines()[first:first + n]
    src = os.path.join(w, name + ".jsonl")
    open(src, "w").write("\n".join(lines) + "\n")
    r = os.path.join(w, name)
    run(DFM, "chunk", r, src, "--tokenizer", TOKENIZER, "--seq-len", 64, "--doc-aligned")  # padding: no targets
    return r


def main():
    fails = []
    with tempfile.TemporaryDirectory() as w:
        r = make_run(w, "run", 0, 6)
        run(DFM, "encode", r, "--device", "cpu")
        run(DFM, "index", r)
        run(DFM, "retrieve", r, "--k", 4)
        run(DFM, "write-targets", r, "--target-shards", 2)
        common = ["--seq-len", 64, "--batch", 2, "--steps", 2, "--val-seqs", 2, "--eval-batches", 1, "--threads", 1]
        run(DFM_TRAIN, "pretrain", "--data", r, "--out", os.path.join(w, "pre"), "--layers", 1, "--hidden", 16,
            "--heads", 2, "--kv-heads", 1, *common)
        bb = os.path.join(w, "pre", "model")
        p = run(DFM_TRAIN, "train", "--backbone", bb, "--data", r, "--targets", r, "--out", os.path.join(w, "dfm"),
                "--chunk-len", 32, "--fusion-layers", 0, "--pred-hidden", 16, "--pred-heads", 2, *common)
        ok = "K=4 d=384" in p.stderr
        print(("ok" if ok else "FAIL") + ": DFM training read K=4, d=384 targets from the run's LMDB shards")
        if not ok:
            fails.append("K/d from run")
        ev = [r2 for r2 in map(json.loads, open(os.path.join(w, "dfm", "log.jsonl"))) if "eval" in r2]
        ok = len(ev) == 1 and ev[0]["eval"]["mse"] > 0 and ev[0]["eval"]["ce_target"] == ev[0]["eval"]["ce_target"]
        print(("ok" if ok else "FAIL") + ": evaluation with target memory: %s" % (ev[0]["eval"] if ev else None))
        if not ok:
            fails.append("eval")
        # --slots-hold both: 2K slots, K read from the targets, nothing else to change
        run(DFM, "write-targets", r, "--target-shards", 2, "--slots-hold", "both", "--force")
        p = run(DFM_TRAIN, "train", "--backbone", bb, "--data", r, "--targets", r, "--out", os.path.join(w, "dfm-both"),
                "--chunk-len", 32, "--fusion-layers", 0, "--pred-hidden", 16, "--pred-heads", 2, *common)
        ev = [r2 for r2 in map(json.loads, open(os.path.join(w, "dfm-both", "log.jsonl"))) if "eval" in r2]
        ok = "K=8 d=384" in p.stderr and len(ev) == 1 and ev[0]["eval"]["mse"] > 0
        print(("ok" if ok else "FAIL") + ": --slots-hold both targets: K=8 read from the run, evaluated: mse %s"
              % (ev[0]["eval"]["mse"] if ev else p.stderr[-300:]))
        if not ok:
            fails.append("slots both")
        # dfm inspect prints the text of a continuation slot (the chunk after the neighbour, in its document)
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import dfm_targets
        with dfm_targets.TargetRun(r) as t:
            hit = next((rec for rec in t.records() if rec["mask"][4:].any()), None)
        if hit is None:
            ok, why = False, "no record with a valid continuation slot"
        else:
            slot = 4 + int(hit["mask"][4:].argmax())
            out = run(DFM, "inspect", r, "--chunk", hit["chunk_id"]).stdout
            want = "continuation (chunk after neighbour %d) text: " % (hit["ids"][slot] - 1)
            ok, why = want in out and "slots both" in out, out[-600:]
        print(("ok" if ok else "FAIL") + ": inspect shows a continuation slot's text" + ("" if ok else ": " + why))
        if not ok:
            fails.append("inspect continuation")
        # tokens of another run with these targets: refused by the manifest check
        other = make_run(w, "other", 10, 6)
        p = run(DFM_TRAIN, "train", "--backbone", bb, "--data", other, "--targets", r, "--out",
                os.path.join(w, "dfm2"), "--chunk-len", 32, "--fusion-layers", 0, "--pred-hidden", 16,
                "--pred-heads", 2, *common, ok=False)
        ok = p.returncode != 0 and "error" in p.stderr
        print(("ok" if ok else "FAIL") + ": targets of another run are refused: %s" % p.stderr.strip()[-300:])
        if not ok:
            fails.append("mismatch refused")
    if fails:
        print("FAILED: " + ", ".join(fails))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
