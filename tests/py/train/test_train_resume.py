"""dfm-train end to end on synthetic data: pretraining, DFM training, evaluation, generation, and
bit-identical resume from a checkpoint (pretraining and DFM mode).

A run of N steps that writes a checkpoint at step N/2 is compared with a second run resumed from that
checkpoint: the final checkpoints (parameters, AdamW moments, data position) must be byte-identical,
and so must the saved backbone / exported modules. Exits non-zero on any failure.
Run: $DFM_PYTHON tests/py/train/test_train_resume.py   (DFM_TRAIN = path of dfm-train)
"""
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import DFM_TRAIN, FAILS, check, run, worst_diff  # noqa: E402


def main():
    with tempfile.TemporaryDirectory() as w:
        data = os.path.join(w, "data")
        run("synth", "--out", data, "--seqs", 64, "--seq-len", 32, "--chunk-len", 8, "--vocab", 200,
            "--slots", 3, "--d-mem", 16)
        tokens, targets = os.path.join(data, "tokens.bin"), os.path.join(data, "targets.bin")
        common = ["--seq-len", 32, "--batch", 4, "--steps", 6, "--lr", 3e-3, "--warmup", 2, "--val-seqs", 8,
                  "--threads", 1, "--seed", 5]
        shape = ["--layers", 2, "--hidden", 32, "--heads", 4, "--kv-heads", 2]
        # pretraining: uninterrupted run with a checkpoint at step 3, then a run resumed from it
        a, b = os.path.join(w, "pre_a"), os.path.join(w, "pre_b")
        run("pretrain", "--data", tokens, "--out", a, "--ckpt-every", 3, *shape, *common)
        run("pretrain", "--data", tokens, "--out", b, "--resume", os.path.join(a, "ckpt_000003.bin"), *shape, *common)
        check(filecmp.cmp(os.path.join(a, "ckpt_final.bin"), os.path.join(b, "ckpt_final.bin"), shallow=False),
              "pretrain: resumed run's final checkpoint is byte-identical")
        check(filecmp.cmp(os.path.join(a, "model", "model.safetensors"), os.path.join(b, "model", "model.safetensors"),
                          shallow=False), "pretrain: resumed run's saved backbone is byte-identical")
        cfg = json.load(open(os.path.join(a, "model", "config.json")))
        check(cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["num_hidden_layers"] == 2,
              "pretrain: config.json is a Qwen3ForCausalLM config")
        log = [json.loads(l) for l in open(os.path.join(a, "log.jsonl"))]
        steps = [r for r in log if "loss" in r]
        check(len(steps) == 6 and all(r["loss"] > 0 for r in steps), "pretrain: JSONL log has one line per step")

        check(all(0.0 <= r["stall"] <= 1.0 for r in steps), "pretrain: the log reports the data-stall fraction")

        # a checkpoint exactly at an epoch's end (56 training sequences / batch 4 = 14 steps) resumes
        # into the next epoch; the loader thread's read-ahead depth changes nothing
        e1, e2, e3 = (os.path.join(w, n) for n in ("ep_a", "ep_b", "ep_c"))
        ep = [x if x != 6 else 16 for x in common]
        run("pretrain", "--data", tokens, "--out", e1, "--ckpt-every", 14, *shape, *ep)
        run("pretrain", "--data", tokens, "--out", e2, "--resume", os.path.join(e1, "ckpt_000014.bin"), *shape, *ep)
        run("pretrain", "--data", tokens, "--out", e3, "--prefetch", 7, *shape, *ep)
        check(filecmp.cmp(os.path.join(e1, "ckpt_final.bin"), os.path.join(e2, "ckpt_final.bin"), shallow=False),
              "pretrain: resumed from a checkpoint at an epoch's end, byte-identical")
        check(filecmp.cmp(os.path.join(e1, "ckpt_final.bin"), os.path.join(e3, "ckpt_final.bin"), shallow=False),
              "pretrain: --prefetch 7 gives the same bytes as the default read-ahead")

        # gradient accumulation: 2 micro-batches of 2 follow one batch of 4 up to rounding
        acc = os.path.join(w, "pre_acc")
        args = ["pretrain", "--data", tokens, "--out", acc, *shape, *common, "--accum", 2]
        args[args.index("--batch") + 1] = 2
        run(*args)
        l1 = [r["loss"] for r in map(json.loads, open(os.path.join(a, "log.jsonl"))) if "loss" in r]
        l3 = [r["loss"] for r in map(json.loads, open(os.path.join(acc, "log.jsonl"))) if "loss" in r]
        dev = worst_diff(l1, l3)
        check(len(l1) == len(l3) and dev < 1e-4, "accum 2 x batch 2 matches batch 4 (max loss diff %.1e)" % dev)
        # resuming with other flags is refused
        p = subprocess.run([DFM_TRAIN, "pretrain", "--data", tokens, "--out", os.path.join(w, "pre_x"), "--resume",
                            os.path.join(a, "ckpt_000003.bin")] + [str(x) for x in shape + common] + ["--lr", "1e-2"],
                           capture_output=True, text=True, errors="replace")
        check(p.returncode != 0 and "another train configuration" in p.stderr, "resume with another --lr is refused")

        # data parallel: 2 ranks x batch 2 must follow 1 rank x batch 4 up to the summation order
        if shutil.which("mpirun"):
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_rmaps_base_oversubscribe="1")
            mp = os.path.join(w, "pre_mpi")
            args = [str(x) for x in ["pretrain", "--data", tokens, "--out", mp, *shape, *common]]
            args[args.index("--batch") + 1] = "2"
            p = subprocess.run(["mpirun", "-np", "2", DFM_TRAIN] + args, capture_output=True, text=True, errors="replace", env=env)
            check(p.returncode == 0, "pretrain under mpirun -np 2 runs")
            if p.returncode == 0:
                l1 = [r["loss"] for r in map(json.loads, open(os.path.join(a, "log.jsonl"))) if "loss" in r]
                l2 = [r["loss"] for r in map(json.loads, open(os.path.join(mp, "log.jsonl"))) if "loss" in r]
                dev = worst_diff(l1, l2)
                check(len(l1) == len(l2) and dev < 1e-4, "2 ranks x batch 2 match 1 rank x batch 4 (max loss diff %.1e)" % dev)
        else:
            print("SKIP: data parallel pretraining (no mpirun on PATH)")

        # DFM mode on the frozen backbone
        backbone = os.path.join(a, "model")
        dfm = ["--backbone", backbone, "--data", tokens, "--targets", targets, "--chunk-len", 8,
               "--fusion-layers", "0,1", "--pred-hidden", 32, "--pred-heads", 2, "--proj-hidden", 24]
        c, d = os.path.join(w, "dfm_c"), os.path.join(w, "dfm_d")
        run("train", "--out", c, "--ckpt-every", 3, *dfm, *common)
        run("train", "--out", d, "--resume", os.path.join(c, "ckpt_000003.bin"), *dfm, *common)
        check(filecmp.cmp(os.path.join(c, "ckpt_final.bin"), os.path.join(d, "ckpt_final.bin"), shallow=False),
              "train: resumed DFM run's final checkpoint is byte-identical")
        check(filecmp.cmp(os.path.join(c, "dfm_modules.safetensors"), os.path.join(d, "dfm_modules.safetensors"),
                          shallow=False), "train: resumed DFM run's exported modules are byte-identical")
        # a resumed run that differs in data order must not be identical (the test can fail)
        e = os.path.join(w, "dfm_e")
        run("train", "--out", e, *dfm, *(common[:-1] + [6]))
        check(not filecmp.cmp(os.path.join(c, "ckpt_final.bin"), os.path.join(e, "ckpt_final.bin"), shallow=False),
              "train: a run with another seed differs (the comparison is sensitive)")

        # evaluation from the checkpoint and from the exported modules agree
        ev = ["--backbone", backbone, "--data", tokens, "--targets", targets, "--chunk-len", 8,
              "--fusion-layers", "0,1", "--pred-hidden", 32, "--pred-heads", 2, "--proj-hidden", 24,
              "--seq-len", 32, "--batch", 4, "--val-seqs", 8, "--threads", 1]
        r1 = json.loads(run("eval", "--modules", os.path.join(c, "ckpt_final.bin"), *ev).stdout.strip().splitlines()[-1])
        r2 = json.loads(run("eval", "--modules", os.path.join(c, "dfm_modules.safetensors"), *ev).stdout.strip()
                        .splitlines()[-1])
        check(r1 == r2, "eval: checkpoint and exported modules give the same numbers %s" % r1)
        check(all(k in r1 for k in ("ce_pred", "ce_none", "ce_target", "mse", "cos")), "eval reports all five numbers")
        # the modules carry their own shape: no DFM flags needed, and flags that disagree are overridden
        bare = ["--backbone", backbone, "--data", tokens, "--targets", targets, "--seq-len", 32, "--batch", 4,
                "--val-seqs", 8, "--threads", 1]
        r3 = json.loads(run("eval", "--modules", os.path.join(c, "ckpt_final.bin"), *bare).stdout.strip()
                        .splitlines()[-1])
        r4 = json.loads(run("eval", "--modules", os.path.join(c, "dfm_modules.safetensors"), *bare,
                            "--pred-layers", 3, "--slots", 5).stdout.strip().splitlines()[-1])
        check(r3 == r1 and r4 == r1, "eval reads the DFM shape from the modules (checkpoint and export)")
        # DFM modules trained on one backbone are refused on another of the same shape
        s9 = os.path.join(w, "pre_s9")
        args = ["pretrain", "--data", tokens, "--out", s9, *shape, *common]
        args[args.index("--seed") + 1] = 9
        run(*args)
        ev9 = list(ev)
        ev9[ev9.index("--backbone") + 1] = os.path.join(s9, "model")
        p = subprocess.run([DFM_TRAIN, "eval", "--modules", os.path.join(c, "ckpt_final.bin")] + [str(x) for x in ev9],
                           capture_output=True, text=True, errors="replace")
        check(p.returncode != 0 and "another backbone" in p.stderr, "eval: modules of another backbone are refused")
        p = subprocess.run([DFM_TRAIN, "eval", "--modules", os.path.join(c, "dfm_modules.safetensors")] +
                           [str(x) for x in ev9], capture_output=True, text=True, errors="replace")
        check(p.returncode != 0 and "another backbone" in p.stderr,
              "eval: exported modules of another backbone are refused")

        g = run("generate", "--backbone", backbone, "--modules", os.path.join(c, "dfm_modules.safetensors"),
                "--prompt-ids", ",".join(str(i) for i in range(1, 20)), "--max-new", 10)
        ids = g.stdout.split("ids:")[1].split()[0].split(",")
        check(len(ids) == 10 and all(0 <= int(i) < 256 for i in ids), "generate: 10 greedy tokens")
    if FAILS:
        print("FAILED: " + "; ".join(FAILS))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
