"""Readers while the run is rebuilt: a reader reads the one generation it opened, whole, or is refused
naming the rebuild; it never mixes two generations and never fails with another error.

A small run is built; its targets are rebuilt again and again with `dfm write-targets --force`, alternating
--dtype fp16 and bf16 (two generations whose records differ), and twice with `dfm build --force` (every
stage again). Each trial starts a rebuild and, at a random moment of it, one reader:
  - the C reader through the dfm package (dfm.open_run), pausing half-way through the records;
  - the pure-Python reader (backend="python"), the same way;
  - dfm.Batches with 2 reader threads (each thread opens its own reader, some after the pause);
  - dfm-train's loader (`dfm-train dump-batches`, 2 loader threads).
A reader that finishes must give exactly the records (or batches) of one generation: fp16 or bf16, never
a mix; a refusal must be DFM_ESTATE / TargetStateError saying "being rebuilt" or "rebuilt". Draws from
DFM_TEST_SEED (printed). Exits non-zero on any failure.
Run: $DFM_PYTHON tests/py/pkg/test_readers_rebuild.py   (DFM, DFM_TRAIN: the programs; DFM_MODEL etc. from paths.mk)
"""
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import FAILS, check, finish  # noqa: E402  (the tests' shared check and verdict)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import numpy as np  # noqa: E402

import dfm  # noqa: E402

DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))
DFM_TRAIN = os.environ.get("DFM_TRAIN", os.path.join(ROOT, "build", "dfm-train"))
ENV = dict(os.environ, DFM_PROGRESS="0", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")



def sh(*args):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, errors="replace", env=ENV)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
        raise SystemExit("%s failed (exit %d)" % (" ".join(map(str, args[:3])), p.returncode))
    return p


def refusal(msg):
    """A rebuild's refusal, as the rule says (not a missing file, a checksum or any other error)."""
    return "being rebuilt" in msg or "were rebuilt" in msg


# ---- the readers: each returns ("ok", digest) or ("refused", message); anything else is a failure ----
def read_records(run, backend, pause):
    try:
        with dfm.open_run(run, backend=backend) as r:
            h = hashlib.sha256()
            for c in range(r.n_chunks):
                rec = r.get(c)
                h.update(np.asarray(rec["ids"]).tobytes())
                h.update(np.asarray(rec["emb"], np.float32).tobytes())
                if c == r.n_chunks // 2:
                    time.sleep(pause)  # the rebuild goes on meanwhile: this reader keeps its generation
            return "ok", h.hexdigest()
    except dfm.TargetError as e:
        return "refused", str(e)


def read_batches(run, pause, seq_len):
    try:
        b = dfm.Batches(run, seq_len=seq_len, batch=2, seed=3, threads=2)
        h = hashlib.sha256()
        for i, x in enumerate(b):
            h.update(x.memory.tobytes())
            h.update(x.mask.tobytes())
            if i == 1:
                time.sleep(pause)
        b.close()
        return "ok", h.hexdigest()
    except dfm.TargetError as e:
        return "refused", str(e)


def read_loader(run, out, seq_len):
    p = subprocess.run([DFM_TRAIN, "dump-batches", "--data", run, "--targets", run, "--out", out, "--seq-len", str(seq_len),
                        "--batch", "2", "--loader-threads", "2"], capture_output=True, text=True, errors="replace", env=ENV)
    if p.returncode == 0:
        with open(out, "rb") as f:
            return "ok", hashlib.sha256(f.read()).hexdigest()
    return "refused", p.stderr.strip()[-600:]


def main():
    seed = int(os.environ.get("DFM_TEST_SEED", str(int(time.time()) % 100000)))
    print("DFM_TEST_SEED=%d" % seed)
    rng = random.Random(seed)
    trials = int(os.environ.get("DFM_REBUILD_TRIALS", "16"))
    with tempfile.TemporaryDirectory() as w:
        corpus = os.path.join(w, "corpus.jsonl")
        with open(os.environ["DFM_CORPUS"]) as f, open(corpus, "w") as g:
            for _ in range(3):
                g.write(f.readline())
        run = os.path.join(w, "r")
        cfg = os.path.join(w, "r.json")
        with open(cfg, "w") as f:
            json.dump({"run": run, "inputs": [corpus], "tokenizer": os.environ["DFM_TOKENIZER"], "chunk": {"seq-len": 128},
                       "encode": {"device": "cpu", "model": os.environ["DFM_MODEL"], "block-chunks": 32},
                       "write-targets": {"target-shards": 3}}, f)
        sh(DFM, "build", cfg)
        seq_len = 128
        wt = [DFM, "write-targets", run, "--target-shards", "3", "--force"]

        # each generation's expected digests, per reader
        def digests():
            out = os.path.join(w, "dump.bin")
            return {"c": read_records(run, "c", 0), "python": read_records(run, "python", 0),
                    "batches": read_batches(run, 0, seq_len), "loader": read_loader(run, out, seq_len)}
        want = {}
        for dt in ("bf16", "fp16"):
            sh(*wt, "--dtype", dt)
            d = digests()
            check(all(v[0] == "ok" for v in d.values()), "generation %s reads with every reader" % dt)
            want[dt] = {k: v[1] for k, v in d.items()}
        check(all(want["fp16"][k] != want["bf16"][k] for k in want["fp16"]),
              "the two generations differ for every reader (the check can see a mix)")

        # a whole rebuild between two reads of one open reader: it goes on reading the generation it opened
        with dfm.open_run(run) as r:
            h = hashlib.sha256()
            for c in range(r.n_chunks):
                if c == r.n_chunks // 2:
                    sh(*wt, "--dtype", "bf16")
                rec = r.get(c)
                h.update(np.asarray(rec["ids"]).tobytes())
                h.update(np.asarray(rec["emb"], np.float32).tobytes())
        check(h.hexdigest() == want["fp16"]["c"], "a C reader open across a complete rebuild reads its own generation whole")
        # ... and a Batches that opens a reader after a rebuild (as a DataLoader worker started later, or after
        # close(), does) refuses to mix the new generation into the epoch
        b = dfm.Batches(run, seq_len=seq_len, batch=2, seed=3)
        it = iter(b)
        got = "no error"
        try:
            next(it)
            sh(*wt, "--dtype", "fp16")
            b.close()  # readers are opened again on the next read
            for _ in it:
                pass
        except dfm.TargetError as e:
            got = "%s: %s" % (type(e).__name__, e)
        b.close()
        check(got.startswith("TargetRebuiltError") and "were rebuilt since this Batches opened them" in got,
              "Batches: a reader opened after a rebuild is refused, not mixed in: %s" % got[:300])

        counts = {}
        dtype = "fp16"
        for t in range(trials):
            kind = rng.choice(["c", "python", "batches", "loader"])
            full = t in (trials // 3, 2 * trials // 3)  # two trials rebuild every stage
            new = "bf16" if dtype == "fp16" else "fp16"
            if full:  # dfm build --force keeps the config (fp16, the default): same records, a new generation
                new = "fp16"
                writer = subprocess.Popen([DFM, "build", cfg, "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
                delay = rng.uniform(0, 3.0)
            else:
                writer = subprocess.Popen(wt + ["--dtype", new], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
                delay = rng.uniform(0, 0.6)
            time.sleep(delay)
            pause = rng.uniform(0, 0.5)
            if kind in ("c", "python"):
                res = read_records(run, kind, pause)
            elif kind == "batches":
                res = read_batches(run, pause, seq_len)
            else:
                res = read_loader(run, os.path.join(w, "dump%d.bin" % t), seq_len)
            _, err = writer.communicate()
            check(writer.returncode == 0, "trial %d: the rebuild succeeded%s" % (t, "" if writer.returncode == 0 else ": " + err[-500:]))
            what = "trial %d: %s reader %.2fs into %s" % (t, kind, delay, "build --force" if full else "write-targets --force --dtype " + new)
            if res[0] == "ok":
                gen = [g for g in ("fp16", "bf16") if want[g][kind] == res[1]]
                check(len(gen) == 1 and gen[0] in (dtype, new),
                      "%s: read one whole generation (%s)" % (what, gen[0] if gen else "a MIX or other bytes"))
                outcome = "read " + (gen[0] if gen else "?")
            else:
                check(refusal(res[1]), "%s: refused naming the rebuild: %s" % (what, res[1][:300]))
                outcome = "refused"
            counts[outcome] = counts.get(outcome, 0) + 1
            dtype = new
        print("outcomes: %s" % counts)
        check(sum(v for k, v in counts.items() if k.startswith("read")) > 0, "some readers read during rebuilds")
    if FAILS:
        print("DFM_TEST_SEED=" + str(seed) + " reproduces this run")
    finish("readers during rebuilds")


if __name__ == "__main__":
    main()
