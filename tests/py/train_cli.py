"""What the dfm-train Python tests share: run a dfm-train command (its output shown and the test stopped
when it fails, unless ok=False), record checks, and finish with the exit status (non-zero on any failed
check). DFM_TRAIN is the path of dfm-train (default build/dfm-train)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DFM_TRAIN = os.environ.get("DFM_TRAIN", os.path.join(ROOT, "build", "dfm-train"))
FAILS = []


def run(*args, ok=True):
    p = subprocess.run([DFM_TRAIN] + [str(a) for a in args], capture_output=True, text=True, errors="replace")
    if ok and p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        raise SystemExit("dfm-train %s failed (exit %d)" % (args[0], p.returncode))
    return p


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        FAILS.append(what)


def finish(what):
    """Print the verdict on `what` and exit 1 if any check failed."""
    if FAILS:
        print("%d check(s) failed: %s" % (len(FAILS), what))
        sys.exit(1)
    print("all checks passed: %s" % what)
