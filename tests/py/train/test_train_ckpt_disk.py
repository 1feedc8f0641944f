"""A full disk while dfm-train writes a checkpoint: the previous checkpoint stays intact and usable, the
error says so and names it, no temporary is left, and the run resumed from it (after space is freed) ends
byte-identical to an uninterrupted run.

Two ways to fill the disk: --out on a 600 KB tmpfs (room for one checkpoint of the tiny model, ~400 KB),
where mounting is allowed (root), and everywhere DFM_FAULT_ENOSPC=ckpt_000030 (common/fault.h: the
atomic writes to that file fail with ENOSPC). Exits non-zero on any failure.
Run: $DFM_PYTHON tests/py/train/test_train_ckpt_disk.py   (DFM_TRAIN = path of dfm-train)
"""
import filecmp
import glob
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import DFM_TRAIN, check, finish, run  # noqa: E402


def full_disk_case(name, out, ref, args, env, fail_step, prev_step):
    p = subprocess.run([DFM_TRAIN] + args + ["--out", out], capture_output=True, text=True, errors="replace",
                       env=dict(os.environ, **env))
    prev = os.path.join(out, "ckpt_%06d.bin" % prev_step)
    msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode != 0, "%s: the run stops when checkpoint %d cannot be written" % (name, fail_step))
    check("ckpt_%06d.bin of step %d was not written" % (fail_step, fail_step) in msg and "No space left" in msg and
          "the previous one, %s of step %d, is intact" % (prev, prev_step) in msg and "--resume %s" % prev in msg,
          "%s: the error names the lost checkpoint, the cause and the intact previous one: %s" % (name, msg[-600:]))
    check(not glob.glob(os.path.join(out, "*.tmp.*")), "%s: no temporary left" % name)
    check(filecmp.cmp(prev, os.path.join(ref, os.path.basename(prev)), shallow=False),
          "%s: the previous checkpoint is byte-identical to the uninterrupted run's" % name)
    return prev


def main():
    with tempfile.TemporaryDirectory() as w:
        data = os.path.join(w, "data")
        run("synth", "--out", data, "--seqs", 64, "--seq-len", 32, "--chunk-len", 8, "--vocab", 200,
            "--slots", 3, "--d-mem", 16)
        args = [str(a) for a in ["pretrain", "--data", os.path.join(data, "tokens.bin"), "--layers", 2, "--hidden", 32,
                                 "--heads", 4, "--kv-heads", 2, "--seq-len", 32, "--batch", 4, "--steps", 40, "--lr", 3e-3,
                                 "--warmup", 2, "--val-seqs", 8, "--threads", 1, "--seed", 5, "--ckpt-every", 10]]
        ref = os.path.join(w, "ref")
        run(*args, "--out", ref)

        # everywhere: the fault-injection hook fills the disk for one checkpoint
        out = os.path.join(w, "hook")
        prev = full_disk_case("DFM_FAULT_ENOSPC", out, ref, args, {"DFM_FAULT_ENOSPC": "ckpt_000030"}, 30, 20)
        run(*args, "--out", out, "--resume", prev)
        check(filecmp.cmp(os.path.join(ref, "ckpt_final.bin"), os.path.join(out, "ckpt_final.bin"), shallow=False),
              "DFM_FAULT_ENOSPC: resumed from the intact checkpoint, the final one is byte-identical")

        # a real full file system, where mounting is allowed
        mnt = os.path.join(w, "small")
        os.mkdir(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", mnt], capture_output=True).returncode != 0:
            print("SKIP: a real full tmpfs (mount not allowed here); the fault-injection case above ran")
        else:
            try:
                out = os.path.join(mnt, "o")
                prev = full_disk_case("600 KB tmpfs", out, ref, args, {}, 20, 10)
                subprocess.run(["mount", "-o", "remount,size=16m", mnt], check=True)
                run(*args, "--out", out, "--resume", prev)
                check(filecmp.cmp(os.path.join(ref, "ckpt_final.bin"), os.path.join(out, "ckpt_final.bin"), shallow=False),
                      "600 KB tmpfs: with space again, resumed from the intact checkpoint, the final one is byte-identical")
            finally:
                subprocess.run(["umount", mnt])
    finish("a full disk while checkpointing")


if __name__ == "__main__":
    main()
