"""The reading objective interleaved with DFM training (`dfm-train train --reconstruct-weight W`,
trainer/run/reconstruct_mix.h), on a tiny real run with targets and the real frozen SmolLM2.

- the gradient is the DFM gradient plus W times the reading pass's: one step's gradient norm n(W) at W = 0, 1, 2 fixes
  |a|^2 + 2W a.b + W^2 |b|^2, and n(3) must lie on that parabola (a reading pass that replaced the DFM gradient
  instead of adding to it, or a weight applied to the logged loss but not the gradient, falls off it); and the logged
  loss is the DFM loss plus W times the logged reading CE;
- the held-out reconstruction is evaluated on the chunks of the DFM run's held-out sequences: own slot, shuffled slot,
  fusion off, finite, over as many batches as those chunks fill;
- resuming from a checkpoint gives the uninterrupted run's modules byte for byte (the reading draw is a function of
  seed and step); --cache-frozen gives the same bytes as without;
- --reconstruct-context: `dump-batches --objective reconstruct-context` hands the model the run's own sequences with
  chunk c's memory exactly chunk c's embedding in slot 0 (read here from the encode stage's shards; chunk 0 and the
  other slots masked), a planted off-by-one caught; a run with it keeps loss = DFM + W x reading CE and evaluates the
  held-out sequences;
- --reconstruct-memory shuffled: the first step's reading CE differs from the own-slot run's while its DFM part
  (loss - W x reading CE) is the same to 1e-5 (only the reading pass's memory moved); with --memory-ablation zero the
  reading CE of own and shuffled is identical and differs from the unablated own run's (the ablation reaches the reading
  pass: zeros shuffled are zeros);
- refusals: with --objective reconstruct; a reading batch larger than the DFM micro-batch; shuffled reading memory
  with one sequence a micro-batch; --memory-ablation random beside it.
Exits non-zero on failure. Env: DFM, DFM_TRAIN, DFM_CORPUS, DFM_LM, DFM_MODEL (tests/run.sh sets them).
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_cli import check, finish, finite, run, workdir  # noqa: E402
from test_train_reading import LM, chunks, embeddings, targets_run  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "python"))
from dfm.data import read_dump  # noqa: E402
import numpy as np  # noqa: E402

L, T, K, DOCS = 16, 64, 4, 6


def log(out):
    return [json.loads(x) for x in open(os.path.join(out, "log.jsonl"))]


def train(w, name, *extra, steps=1, val=2, ok=True):
    out = os.path.join(w, name)
    last = str(json.load(open(os.path.join(LM, "config.json")))["num_hidden_layers"] - 1)
    p = run("train", "--backbone", LM, "--data", os.path.join(w, "run"), "--targets", os.path.join(w, "run"), "--out", out,
            "--chunk-len", L, "--seq-len", T, "--batch", 2, "--steps", steps, "--fusion-layers", last, "--val-seqs", val,
            "--threads", 2, "--pred-layers", 1, "--lr", "2e-3", "--warmup", 1, "--seed", 3, *extra, ok=ok)
    return out, p


def main():
    w = workdir("dfm-recon-mix-")
    targets_run(w, DOCS, L, T, K)
    ch = chunks(os.path.join(w, "run"))
    n_seq = (len(ch) * L - 1) // T
    ntrain, NC = n_seq - 2, T // L
    held = sum(1 for c in range(ntrain * NC, len(ch)) if ch[c][1] > 0)
    trained = sum(1 for c in range(ntrain * NC) if ch[c][1] > 0)
    check(n_seq >= 6 and held >= 4, "the run: %d chunks, %d sequences of %d tokens; %d chunks of the 2 held-out "
          "sequences hold tokens, %d of the training ones" % (len(ch), n_seq, T, held, trained))

    # the gradient: DFM's plus W times the reading pass's (W = 5 u, u = 0..3)
    norms, steps = {}, {}
    for u in (0, 1, 2, 3):
        out, _ = train(w, "g%d" % u, "--reconstruct-weight", 5 * u, "--no-ckpt", "--memory-control", "none",
                    "--eval-batches", 1)
        steps[u] = [e for e in log(out) if "loss" in e][0]
        norms[u] = steps[u]["grad_norm"]
    A = norms[0] ** 2
    b2 = (norms[2] ** 2 - 2 * norms[1] ** 2 + A) / 2
    ab = (norms[1] ** 2 - A - b2) / 2
    want3 = A + 6 * ab + 9 * b2
    check(b2 > 1e-3 * A, "the reading pass has a gradient of its own: |5 b|^2 %.4g beside the DFM gradient's |a|^2 %.4g"
          % (b2, A))
    check(abs(norms[3] ** 2 - want3) <= 2e-6 * want3, "gradient norm^2 at W = 15 on the parabola of W = 0, 5, 10: %.6f, "
          "predicted %.6f (norms %s)" % (norms[3] ** 2, want3, norms))
    check("rec_ce" not in steps[0] and all(finite(steps[x].get("rec_ce")) for x in (1, 2, 3)),
          "the step log reports the reading CE only when it is on: %s" % [steps[x].get("rec_ce") for x in (0, 1, 2, 3)])
    rce = steps[1].get("rec_ce", float("nan"))
    check(all(abs(steps[x]["loss"] - (steps[0]["loss"] + 5 * x * rce)) <= 1e-4 for x in (1, 2, 3))
          and all(abs(steps[x].get("rec_ce", 0) - rce) <= 1e-6 for x in (2, 3)),
          "loss = DFM loss + W x reading CE (%.4f) at W = 5, 10, 15: %s against %.4f" %
          (rce, [steps[x]["loss"] for x in (1, 2, 3)], steps[0]["loss"]))

    # the held-out reconstruction: the chunks of the held-out sequences
    out, _ = train(w, "ev", "--reconstruct-weight", 1, "--reconstruct-batch", 2, "--no-ckpt", steps=2)
    rec = [e["reconstruct"] for e in log(out) if "reconstruct" in e]
    ev = rec[-1] if rec else {}
    check(len(rec) == 1 and all(finite(ev.get(k)) for k in ("ce_target", "ce_target_shuffled", "ce_none", "acc_target")),
          "the final evaluation reports reconstruction: own slot %s, shuffled slot %s, fusion off %s"
          % (ev.get("ce_target"), ev.get("ce_target_shuffled"), ev.get("ce_none")))
    check(ev.get("batches") == held // 2, "it covers the %d chunks of the held-out sequences in batches of 2: %s batches"
          % (held, ev.get("batches")))
    check([e for e in log(out) if "eval" in e] != [], "the DFM evaluation still runs beside it")

    # resume and the frozen cache: the same bytes. All but 4 sequences held out, so that 6 steps of 4 reading chunks
    # draw some of the training sequences' chunks twice (the cache is then taken)
    val, small = n_seq - 4, sum(1 for c in range(4 * NC) if ch[c][1] > 0)
    common = ("--reconstruct-weight", 1, "--memory-control", "none", "--eval-batches", 1)
    full, _ = train(w, "full", *common, "--ckpt-every", 3, steps=6, val=val)
    part, _ = train(w, "part", *common, "--resume", os.path.join(full, "ckpt_000003.bin"), steps=6, val=val)
    mods = lambda d: open(os.path.join(d, "dfm_modules.safetensors"), "rb").read()  # noqa: E731
    check(mods(full) == mods(part), "resumed at step 3 of 6: the uninterrupted run's modules, byte for byte")
    cached, p = train(w, "cached", *common, "--cache-frozen", "--no-ckpt", steps=6, val=val)
    plain, _ = train(w, "plain", *common, "--no-ckpt", steps=6, val=val)
    hits = [x for x in p.stderr.splitlines() if "reading batches took the cache" in x]
    check(mods(cached) == mods(plain) and hits and not hits[-1].split("cache-frozen: ")[-1].startswith("0 "),
          "--cache-frozen over 24 reading draws of %d chunks: the same bytes as without (%s)"
          % (small, hits[-1].split(": ", 1)[-1] if hits else "no cache line"))

    # in context: the run's own sequences, each chunk's memory its own embedding
    emb = embeddings(os.path.join(w, "run"))
    dump = os.path.join(w, "ctx.bin")
    run("dump-batches", "--objective", "reconstruct-context", "--data", os.path.join(w, "run"), "--chunk-len", L,
        "--seq-len", T, "--slots", K, "--batch", 3, "--val-seqs", 2, "--steps", 4, "--seed", 5, "--out", dump)
    batches = read_dump(dump)

    def ctx_bad(shift):
        bad = []
        for bt in batches:
            for b, i in enumerate(bt.idx):
                i = int(i)
                want_tok = np.concatenate([ch[i * NC + j][0] for j in range(NC)])
                if not np.array_equal(np.asarray(bt.tokens[b], np.int64), want_tok):
                    bad.append("seq %d: tokens" % i)
                mk = np.asarray(bt.mask[b])
                if mk[0].any() or not all(mk[j][0] == 1 and not mk[j][1:].any() for j in range(1, NC)):
                    bad.append("seq %d: mask %s" % (i, mk.tolist()))
                for j in range(1, NC):
                    c = min(i * NC + j + shift, len(emb) - 1)
                    if not np.allclose(np.asarray(bt.memory[b][j][0]), emb[c], atol=1e-6):
                        bad.append("seq %d chunk %d: slot 0 is not its own embedding" % (i, j))
        return bad
    bad = ctx_bad(0)
    check(len(batches) == 4 and not bad, "in-context reading batches: the run's sequences, chunk c's slot 0 = chunk c's "
          "embedding (%d batches; %s)" % (len(batches), "; ".join(bad[:3]) or "all equal"))
    planted = ctx_bad(1)
    check(len(planted) > 0, "a planted off-by-one (chunk c+1's embedding) is caught: %s" % (planted[:1] or "nothing"))
    out, _ = train(w, "ctx", "--reconstruct-weight", 2, "--reconstruct-context", "--no-ckpt", "--memory-control",
                   "none", steps=2)
    lg = log(out)
    st = [e for e in lg if "loss" in e]
    rec = [e["reconstruct"] for e in lg if "reconstruct" in e]
    base, _ = train(w, "ctx0", "--no-ckpt", "--memory-control", "none", steps=1)
    st0 = [e for e in log(base) if "loss" in e][0]
    check(abs(st[0]["loss"] - (st0["loss"] + 2 * st[0].get("rec_ce", float("nan")))) <= 1e-4,
          "--reconstruct-context: loss %.4f = DFM %.4f + 2 x reading CE %s" % (st[0]["loss"], st0["loss"], st[0].get("rec_ce")))
    check(len(rec) == 1 and rec[0].get("batches") == 1 and finite(rec[0].get("ce_target")) and
          finite(rec[0].get("ce_none")), "--reconstruct-context evaluates the 2 held-out sequences with their own slots: %s"
          % {k: rec[0].get(k) for k in ("batches", "ce_target", "ce_none")} if rec else "no reconstruct line")

    # --reconstruct-memory shuffled, and --memory-ablation zero reaching the reading pass
    def step1(name, *extra):
        out, _ = train(w, name, "--reconstruct-weight", 1, "--reconstruct-batch", 4, "--no-ckpt", "--memory-control",
                       "none", *extra)
        return [e for e in log(out) if "loss" in e][0]
    own, shuf = step1("own"), step1("shuf", "--reconstruct-memory", "shuffled")
    dfm_own, dfm_shuf = own["loss"] - own["rec_ce"], shuf["loss"] - shuf["rec_ce"]
    check(abs(own["rec_ce"] - shuf["rec_ce"]) > 1e-4 and abs(dfm_own - dfm_shuf) <= 1e-5,
          "shuffled reading memory: reading CE %.6f against own %.6f; the DFM part %.6f against %.6f"
          % (shuf["rec_ce"], own["rec_ce"], dfm_shuf, dfm_own))
    own_z = step1("own0", "--memory-ablation", "zero")
    shuf_z = step1("shuf0", "--memory-ablation", "zero", "--reconstruct-memory", "shuffled")
    check(own_z["rec_ce"] == shuf_z["rec_ce"] and abs(own_z["rec_ce"] - own["rec_ce"]) > 1e-4,
          "--memory-ablation zero empties the reading pass's slots: reading CE own %.6f = shuffled %.6f, against "
          "%.6f with real slots" % (own_z["rec_ce"], shuf_z["rec_ce"], own["rec_ce"]))

    # refusals
    _, p = train(w, "bad1", "--reconstruct-weight", 1, "--objective", "reconstruct", ok=False)
    check(p.returncode != 0 and "--reconstruct-weight adds" in p.stderr, "refused beside --objective reconstruct: %s"
          % (p.stderr.strip().splitlines() or ["(nothing)"])[-1])
    _, p = train(w, "bad2", "--reconstruct-weight", 1, "--reconstruct-batch", 5, ok=False)
    check(p.returncode != 0 and "--reconstruct-batch 4 or less" in p.stderr,
          "a reading batch beyond the DFM micro-batch's 2 x %d tokens is refused: %s"
          % (T, (p.stderr.strip().splitlines() or ["(nothing)"])[-1]))
    _, p = train(w, "bad3", "--reconstruct-weight", 1, "--reconstruct-batch", 1, "--reconstruct-memory", "shuffled",
                 ok=False)
    check(p.returncode != 0 and "--reconstruct-batch 2 or more" in p.stderr,
          "shuffled reading memory with one sequence a micro-batch is refused: %s"
          % (p.stderr.strip().splitlines() or ["(nothing)"])[-1])
    _, p = train(w, "bad4", "--reconstruct-weight", 1, "--memory-ablation", "random", ok=False)
    check(p.returncode != 0 and "--memory-ablation random" in p.stderr and "HINT" in p.stderr,
          "--memory-ablation random beside the reading pass is refused: %s"
          % (p.stderr.strip().splitlines() or ["(nothing)"])[-1])
    finish("reading interleaved with DFM training")


if __name__ == "__main__":
    main()
