"""The dfm Python package (python/dfm) against the C programs: records, batches, workers, ranks, errors.

- records: dfm.open_run (libdfm through ctypes) equals the pure-Python reader (python/dfm_targets.py) on
  synthetic target runs (fp16 embeddings, 3 shards; bf16 with store = ids), by get(), records() and
  sequences(); `python -m dfm inspect`
  prints what `dfm inspect` prints;
- batches: dfm.Batches equals `dfm-train dump-batches` (the loader dfm-train trains with) byte for byte:
  targets from a run and from a targets file, ranks of a 2-rank world, a later epoch, steps running
  over epoch ends, the held-out split, and tokens from a `dfm chunk` run with padding (labels -1);
- DDP: the ranks' batches of a step are the single-rank batch of world*B sequences, split in order; in a
  2-process torch.distributed (gloo) group, Batches takes rank and world size from it;
- workers: a torch DataLoader with num_workers=2 (format="torch") and threads=3 yield the serial batches in order;
- errors: a flipped byte in a shard's data.mdb and a truncated data.mdb raise dfm.TargetError
  subclasses from both backends.
Exits non-zero on failure. Env: DFM, DFM_TRAIN, DFM_CORPUS, DFM_TOKENIZER (tests/run.sh sets them).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dfm  # noqa: E402
import dfm_targets  # noqa: E402
from train_cli import check, finish  # noqa: E402

DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))
DFM_TRAIN = os.environ.get("DFM_TRAIN", os.path.join(ROOT, "build", "dfm-train"))
CORPUS = os.environ.get("DFM_CORPUS", "/var/cache/dfm/corpus/gcide-1mb.jsonl")
TOKENIZER = os.environ.get("DFM_TOKENIZER", "/var/cache/dfm/tokenizers/qwen2.5/tokenizer.json")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", DFM_LOG_LEVEL="warn")
T, L, B = 64, 16, 4


def sh(*args):
    p = subprocess.run([str(a) for a in args], env=ENV, capture_output=True, text=True)
    if p.returncode:
        print(p.stdout[-2000:], p.stderr[-2000:])
        raise SystemExit("failed: " + " ".join(str(a) for a in args[:3]))
    return p.stdout


def same_batches(a, b):
    """'' if the two lists of batches hold the same bytes, else what differs first."""
    if len(a) != len(b):
        return "%d vs %d batches" % (len(a), len(b))
    for i, (x, y) in enumerate(zip(a, b)):
        for f in ("idx", "tokens", "labels", "mask", "memory"):
            u, v = getattr(x, f), getattr(y, f)
            if (u is None) != (v is None) or (u is not None and (np.asarray(u).shape != np.asarray(v).shape or
                                                                 np.asarray(u).tobytes() != np.asarray(v).tobytes())):
                return "batch %d field %s" % (i, f)
        if (x.epoch, x.pos) != (y.epoch, y.pos):
            return "batch %d position %s vs %s" % (i, (x.epoch, x.pos), (y.epoch, y.pos))
    return ""


def dump(w, name, *flags, batch=B):
    out = os.path.join(w, name + ".bin")
    sh(DFM_TRAIN, "dump-batches", "--out", out, "--seq-len", T, "--batch", batch, "--chunk-len", L, *flags)
    return dfm.read_dump(out)


def check_records(run):
    c, p = dfm.open_run(run), dfm_targets.TargetRun(run)
    check(isinstance(c, dfm.TargetRun) and (c.n_chunks, c.k, c.d, c.dtype, c.n_shards) ==
          (p.n_chunks, p.k, p.d, p.dtype, p.n_shards), "run metadata: C %s vs Python %s" %
          ((c.n_chunks, c.k, c.d, c.dtype), (p.n_chunks, p.k, p.d, p.dtype)))
    ok = True
    for i in (0, 1, 57, c.n_chunks - 1):
        a, b = c.get(i), p.get(i)
        ok &= all(np.array_equal(a[f], b[f]) for f in ("mask", "ids", "scores", "emb")) and a["flags"] == b["flags"]
    check(ok, "get(): C and Python readers give the same records")
    n = sum(1 for a, b in zip(c.records(5), p.records(5)) if a["chunk_id"] == b["chunk_id"] and
            np.array_equal(a["emb"], b["emb"]) and np.array_equal(a["mask"], b["mask"]))
    check(n == c.n_chunks - 5, "records(5): %d of %d equal" % (n, c.n_chunks - 5))
    sc, sp = list(c.sequences()), list(p.sequences())
    check(len(sc) == len(sp) and all(np.array_equal(x["emb"], y["emb"]) and np.array_equal(x["chunk_ids"], y["chunk_ids"])
                                     for x, y in zip(sc, sp)), "sequences(): %d vs %d, equal" % (len(sc), len(sp)))
    try:
        c.get(c.n_chunks)
        check(False, "get(n_chunks) raises")
    except IndexError as e:
        check(isinstance(e, dfm.TargetError), "get(n_chunks) raises TargetRangeError (an IndexError)")
    c.close()
    p.close()
    a = sh(DFM, "inspect", run, "--chunk", 57)
    q = subprocess.run([sys.executable, "-m", "dfm", "inspect", run, "--chunk", "57"], capture_output=True, text=True,
                       env=dict(ENV, PYTHONPATH=os.path.join(ROOT, "python")))
    check(a == q.stdout and a.startswith("chunk 57"), "python -m dfm inspect prints what dfm inspect prints%s" %
          ("" if a == q.stdout else ":\n%s\nvs\n%s %s" % (a[:300], q.stdout[:300], q.stderr[-300:])))


def check_batches(w, toks, trun, tfile):
    data = ["--data", toks]
    for tname, tpath in (("run", trun), ("file", tfile)):
        for rank, world, epoch, steps, seed in ((0, 1, 0, 0, 1), (1, 2, 3, 0, 7), (0, 2, 0, 45, 2)):
            c = dump(w, "d", *data, "--targets", tpath, "--rank", rank, "--world", world, "--epoch", epoch,
                     "--steps", steps, "--seed", seed, "--loader-threads", 2)
            p = list(dfm.Batches(None, T, B, rank, world, seed, epoch, data=toks, targets=tpath, chunk_len=L,
                                 steps=steps or None))
            diff = same_batches(c, p)
            check(not diff and len(c) > 0, "targets %s, rank %d/%d, epoch %d, steps %d, seed %d: %d batches equal "
                  "dfm-train's %s" % (tname, rank, world, epoch, steps, seed, len(p), diff))
    c = dump(w, "h", *data, "--targets", trun, "--split", "heldout", "--val-seqs", 12)
    p = list(dfm.Batches(None, T, B, data=toks, targets=trun, chunk_len=L, val_seqs=12, split="heldout"))
    check(not same_batches(c, p) and len(p) == 3, "held-out split equals dfm-train eval's batches (%d)" % len(p))
    # DDP: rank r keeps the r-th B of each step's world*B sequences
    kw = dict(data=toks, targets=trun, chunk_len=L, steps=6, val_seqs=8)  # the same split for both batch sizes
    one = list(dfm.Batches(None, T, 2 * B, 0, 1, 5, **kw))
    r0, r1 = (list(dfm.Batches(None, T, B, r, 2, 5, **kw)) for r in (0, 1))
    ok = all(np.array_equal(o.idx, np.concatenate([a.idx, b.idx])) and
             np.array_equal(o.memory, np.concatenate([a.memory, b.memory])) for o, a, b in zip(one, r0, r1))
    disjoint = not (set(np.concatenate([a.idx for a in r0]).tolist()) & set(np.concatenate([b.idx for b in r1]).tolist()))
    check(ok and disjoint, "2 ranks split each step's %d sequences in order, disjoint within the epoch" % (2 * B))


def _ddp_rank(rank, store, toks, trun, out):
    """One process of a 2-process gloo group: Batches without rank/world takes them from torch.distributed."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
    b = dfm.Batches(None, T, B, seed=9, data=toks, targets=trun, chunk_len=L, steps=5)
    np.save(out, np.stack([x.idx for x in b]))
    dist.destroy_process_group()


def check_ddp(w, toks, trun):
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    outs = [os.path.join(w, "ddp%d.npy" % r) for r in range(2)]
    ps = [ctx.Process(target=_ddp_rank, args=(r, os.path.join(w, "store"), toks, trun, outs[r])) for r in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(60)
    ok = all(p.exitcode == 0 for p in ps) and all(
        np.array_equal(np.load(outs[r]), np.stack([x.idx for x in dfm.Batches(None, T, B, r, 2, 9, data=toks, targets=trun,
                                                                               chunk_len=L, steps=5)]))
        for r in range(2))
    check(ok, "under torch.distributed (gloo, 2 processes) Batches takes each process's rank and world size")


def check_workers(toks, trun):
    try:
        import torch
        from torch.utils.data import DataLoader
    except ImportError:
        check(False, "torch is importable (the project venv has it)")
        return
    ds = dfm.Batches(None, T, B, 0, 1, 3, data=toks, targets=trun, chunk_len=L, format="torch")
    serial = list(dfm.Batches(None, T, B, 0, 1, 3, data=toks, targets=trun, chunk_len=L))
    got = list(DataLoader(ds, batch_size=None, num_workers=2))

    def tensor(a, dt):  # torch's NumPy bridge may be missing (NumPy 2 with torch 1.13): through the buffer
        return torch.frombuffer(bytearray(a.tobytes()), dtype=dt).view(a.shape)

    ok = len(got) == len(serial) and all(
        torch.equal(g.memory, tensor(s.memory, torch.float32)) and torch.equal(g.mask, tensor(s.mask, torch.uint8).bool())
        and torch.equal(g.tokens, tensor(s.tokens, torch.int32)) and torch.equal(g.idx, tensor(s.idx, torch.int64))
        for g, s in zip(got, serial))
    check(ok, "DataLoader(num_workers=2): %d torch batches equal the serial ones, in order" % len(got))
    threaded = list(dfm.Batches(None, T, B, 0, 1, 3, data=toks, targets=trun, chunk_len=L, threads=3))
    check(not same_batches(threaded, serial), "threads=3: %d batches equal the serial ones, in order" % len(threaded))


def check_chunk_run(w):
    src = os.path.join(w, "docs.jsonl")
    with open(CORPUS) as f, open(src, "w") as o:
        for _, line in zip(range(5), f):
            o.write(line)
    run = os.path.join(w, "crun")
    sh(DFM, "chunk", run, src, "--tokenizer", TOKENIZER, "--seq-len", 64, "--doc-aligned")
    c = dump(w, "c", "--data", run, "--val-seqs", 2, "--seed", 4)
    p = list(dfm.Batches(run, T, B, 0, 1, 4, with_targets=False, val_seqs=2))
    pad = sum(int((b.labels == -1).sum()) for b in p)
    check(not same_batches(c, p) and len(p) > 0, "tokens of a doc-aligned chunk run: %d batches equal dfm-train's "
          "(%d padded labels = -1)" % (len(p), pad))
    # one sequence per batch: a row's tokens and labels must not share memory (the labels' -1 once leaked
    # into the tokens, shifted by one)
    c1 = dump(w, "c1", "--data", run, "--val-seqs", 2, "--seed", 4, batch=1)
    p1 = list(dfm.Batches(run, T, 1, 0, 1, 4, with_targets=False, val_seqs=2))
    check(not same_batches(c1, p1) and min(int(b.tokens.min()) for b in p1) >= 0,
          "batch 1, doc-aligned run: %d batches equal dfm-train's, no token -1" % len(p1))
    # targets in the same run (synthetic records over its chunks): the one-argument use, and inspect's texts
    with open(os.path.join(run, "manifest.json")) as f:
        n = json.load(f)["stages"]["chunk"]["counts"]["chunks"]
    sh(DFM, "write-targets", run, "--synthetic", n, "--k", 3, "--d", 8, "--seq-chunks", 2)
    c = dump(w, "ct", "--data", run, "--targets", run, "--chunk-len", 32, "--val-seqs", 2, "--seed", 4)
    p = list(dfm.Batches(run, T, B, 0, 1, 4, chunk_len=32, val_seqs=2))
    check(not same_batches(c, p) and p[0].memory.shape == (B, 2, 3, 8),
          "dfm.Batches(RUN) with tokens and targets from one run equals dfm-train's batches")
    a = sh(DFM, "inspect", run, "--chunk", 3)
    b = subprocess.run([sys.executable, "-m", "dfm", "inspect", run, "--chunk", "3"], capture_output=True, text=True,
                       env=dict(ENV, PYTHONPATH=os.path.join(ROOT, "python"))).stdout
    check(a == b and "query chunk text:" in b, "python -m dfm inspect prints dfm inspect's chunk texts too")


def check_errors(w, trun):
    for how in ("flip", "truncate"):
        bad = os.path.join(w, "bad-" + how)
        shutil.copytree(trun, bad)
        mdb = os.path.join(bad, "targets", "shard-00001", "data.mdb")
        with open(mdb, "r+b") as f:
            if how == "flip":
                size = os.path.getsize(mdb)
                data = bytearray(f.read())
                # flip one byte inside every 4 KiB page after the meta pages: some record payload is hit
                for off in range(3 * 4096 + 2000, size, 4096):
                    data[off] ^= 0x5A
                f.seek(0)
                f.write(data)
            else:
                f.truncate(os.path.getsize(mdb) - 4096)
        for backend in ("c", "python"):
            try:
                with dfm.open_run(bad, backend=backend) as r:
                    for _ in r.records():
                        pass
                check(False, "%s shard, %s backend: raises" % (how, backend))
            except dfm.TargetError as e:
                check("shard-00001" in str(e), "%s shard, %s backend: %s naming the shard: %s" %
                      (how, backend, type(e).__name__, str(e)[:150]))


def main():
    with tempfile.TemporaryDirectory() as w:
        sh(DFM_TRAIN, "synth", "--out", os.path.join(w, "syn"), "--seqs", 120, "--seq-len", T, "--chunk-len", L)
        toks, tfile = os.path.join(w, "syn", "tokens.bin"), os.path.join(w, "syn", "targets.bin")
        trun = os.path.join(w, "trun")
        sh(DFM, "write-targets", trun, "--synthetic", 481, "--k", 4, "--d", 24, "--target-shards", 3,
           "--seq-chunks", T // L, "--dtype", "fp16")
        check_records(trun)
        ids_run = os.path.join(w, "ids")
        sh(DFM, "write-targets", ids_run, "--synthetic", 200, "--k", 5, "--d", 16, "--target-shards", 2,
           "--seq-chunks", 4, "--dtype", "bf16", "--store", "ids")
        check_records(ids_run)
        check_batches(w, toks, trun, tfile)
        check_workers(toks, trun)
        check_ddp(w, toks, trun)
        check_chunk_run(w)
        check_errors(w, trun)
    finish("dfm package: records, batches, ranks, workers, errors")


if __name__ == "__main__":
    main()
