"""Many readers at once on one run: 64 reader processes (32 of the C reader holding 3 readers each, as
dfm-train's loader threads or dfm.Batches threads do, and 32 of the pure-Python reader) hold their readers
open at the same moment (a barrier), 130 LMDB readers in all, more than LMDB's default reader table of 126;
one more process is killed (SIGKILL) in the middle of its reads. Every survivor reads the same records;
nothing is left behind by the killed one (no lock file, no slot: the readers open LMDB with MDB_NOLOCK,
the shards being immutable once renamed in), and a reader started after it reads as before.
What bounds the readers of one process is the open-files limit (one file per shard per reader): below
the hard limit the soft one is raised, and beyond it the reader is refused, saying what to set.
Exits non-zero on any failure.
Run: $DFM_PYTHON tests/py/pkg/test_many_readers.py   (DFM = build/dfm; build/tools/targets_read from `make tools`)
"""
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import check, finish  # noqa: E402  (the tests' shared check and verdict)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))
TOOL = os.path.join(os.path.dirname(DFM), "tools", "targets_read")
PY = sys.executable

# the pure-Python reader process: the same barrier and digest as targets_read (XXH3-64 over each record's
# chunk id, mask bits, ids, float32 embeddings)
PURE = r'''
import os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, xxhash, dfm_targets
run, bar, want = sys.argv[2], sys.argv[3], int(sys.argv[4])
r = dfm_targets.TargetRun(run)
open(os.path.join(bar, "ready.%d" % os.getpid()), "w").close()
t0 = time.time()
while len([f for f in os.listdir(bar) if f.startswith("ready.")]) < want and time.time() - t0 < 120:
    time.sleep(0.01)
h = xxhash.xxh3_64()
for c in range(r.n_chunks):
    rec = r.get(c)
    bits = sum(1 << j for j, v in enumerate(rec["mask"]) if v)
    h.update(np.uint64(c).tobytes()); h.update(np.uint64(bits).tobytes())
    h.update(np.asarray(rec["ids"], np.int64).tobytes()); h.update(np.asarray(rec["emb"], np.float32).tobytes())
print("digest %016x" % h.intdigest())
'''



def main():
    if not os.access(TOOL, os.X_OK):
        print("FAIL: %s is not built (make tools)" % TOOL)
        return 1
    with tempfile.TemporaryDirectory() as w:
        run = os.path.join(w, "r")
        p = subprocess.run([DFM, "write-targets", run, "--synthetic", "3000", "--k", "4", "--d", "16", "--target-shards", "8"],
                           capture_output=True, text=True)
        check(p.returncode == 0, "a synthetic run of 8 target shards" + ("" if p.returncode == 0 else ": " + p.stderr[-800:]))
        ref = subprocess.run([TOOL, run, "1"], capture_output=True, text=True)
        check(ref.returncode == 0, "one reader reads the run" + ("" if ref.returncode == 0 else ": " + ref.stderr))
        want = ref.stdout.strip()
        pure = os.path.join(w, "pure.py")
        with open(pure, "w") as f:
            f.write(PURE)

        bar = os.path.join(w, "barrier")
        os.mkdir(bar)
        n_c, n_py, per_c = 32, 32, 3
        total = n_c + n_py + 1
        env = dict(os.environ, OMP_NUM_THREADS="1")
        procs = [subprocess.Popen([TOOL, run, str(per_c), bar, str(total)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env) for _ in range(n_c)]
        procs += [subprocess.Popen([PY, pure, os.path.join(ROOT, "python"), run, bar, str(total)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env) for _ in range(n_py)]
        victim = subprocess.Popen([TOOL, run, "2", bar, str(total), "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t0 = time.time()
        while len(glob.glob(os.path.join(bar, "ready.*"))) < total and time.time() - t0 < 150 and victim.poll() is None:
            time.sleep(0.05)
        ready = len(glob.glob(os.path.join(bar, "ready.*")))
        check(ready == total, "%d reader processes held %d LMDB readers open at once (LMDB's default table: 126)"
              % (ready, n_c * per_c + n_py + 2))
        time.sleep(0.3)  # the victim is reading (5 ms a record)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        check(victim.returncode == -signal.SIGKILL, "one reader killed in the middle of its reads")
        outs = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
        bad = [(o, e, rc) for o, e, rc in outs if rc != 0 or o.strip() != want]
        check(not bad, "all %d readers read the same records (%s)%s" % (len(procs), want,
                                                                         "" if not bad else ": " + repr(bad[:3])[:1500]))
        locks = glob.glob(os.path.join(run, "targets", "*", "lock.mdb"))
        check(not locks, "no reader left a lock file or a reader slot behind (%s)" % (locks[:3] or "none"))
        after = subprocess.run([TOOL, run, "4"], capture_output=True, text=True)
        check(after.returncode == 0 and after.stdout.strip() == want, "readers started after the kill read as before")

        # the open-files limit: 8 readers of 8 shards need 64 files and more
        low = subprocess.run(["bash", "-c", 'ulimit -Sn 40 && ulimit -Hn 40 && exec "$0" "$1" 8', TOOL, run], capture_output=True, text=True)
        check(low.returncode == 1 and "ulimit -n" in low.stderr and "open fewer readers" in low.stderr,
              "beyond the hard open-files limit the reader is refused saying what to set: %s" % low.stderr.strip()[-400:])
        soft = subprocess.run(["bash", "-c", 'ulimit -Sn 40 && ulimit -Hn 4096 && exec "$0" "$1" 8', TOOL, run],
                              capture_output=True, text=True)
        check(soft.returncode == 0 and soft.stdout.strip() == want,
              "under a low soft limit (40) the readers raise it themselves: %s" % (soft.stdout + soft.stderr).strip()[-300:])
    finish("many readers at once")


if __name__ == "__main__":
    main()
