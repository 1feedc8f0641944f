"""What the dfm-train Python tests share: run a dfm-train command (its output shown and the test stopped
when it fails, unless ok=False), record checks, and finish with the exit status (non-zero on any failed
check). DFM_TRAIN is the path of dfm-train (default build/dfm-train). workdir() gives a test its scratch folder,
removed when the test passes and kept (its path printed) when it fails or DFM_KEEP_TEST_DIRS is set."""
import atexit
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DFM_TRAIN = os.environ.get("DFM_TRAIN", os.path.join(ROOT, "build", "dfm-train"))
FAILS = []
PASSED = []  # set by finish() when every check passed: only then is a workdir() removed


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


def finite(x):
    """x is a finite number (not None, which is how dfm-train's JSON writes NaN, and not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def worst_diff(a, b):
    """max |x - y| over the pairs of a and b; inf when a value is not finite or the lengths differ (Python's
    max() keeps the first of NaN and a number, so a NaN would drop out of a plain max of differences)."""
    a, b = list(a), list(b)
    if len(a) != len(b) or not a:
        return math.inf
    return max(abs(x - y) if finite(x) and finite(y) else math.inf for x, y in zip(a, b))


def ce_modes(ev, what):
    """The eval's CE of every mode (the ce_* numbers), each checked to be a finite number: a mode whose CE is
    NaN (null in the JSON) fails here rather than dropping out of the comparisons. Lists (ce_pos_*: CE by
    position in the chunk) are checked element by element and not returned."""
    out = {}
    for k, v in ev.items():
        if not k.startswith("ce_"):
            continue
        if isinstance(v, list):
            check(len(v) > 0 and all(finite(x) for x in v), "%s: every value of %s is a finite number: %s" % (what, k, v))
        else:
            check(finite(v), "%s: %s is a finite number: %r" % (what, k, v))
            out[k] = v
    check(len(out) > 0, "%s: the eval reports CE values: %s" % (what, sorted(ev)))
    return out


def workdir(prefix):
    """A new scratch folder under the system's temporary folder, removed at exit when the test passed (finish() with
    no failed check); kept, with its path printed, when a check failed, a command stopped the test, or
    DFM_KEEP_TEST_DIRS is set, so that what went wrong can be looked at."""
    w = tempfile.mkdtemp(prefix=prefix)

    def clean():
        if PASSED and not os.environ.get("DFM_KEEP_TEST_DIRS"):
            shutil.rmtree(w, ignore_errors=True)
        else:
            print("scratch folder kept: %s" % w)
    atexit.register(clean)
    return w


def finish(what):
    """Print the verdict on `what` and exit 1 if any check failed."""
    if FAILS:
        print("%d check(s) failed: %s" % (len(FAILS), what))
        sys.exit(1)
    PASSED.append(what)
    print("all checks passed: %s" % what)


def run_arrays(script, arrays, w, name):
    """Run a bench script on planted arrays (`SCRIPT --arrays W/NAME.npz --out W/NAME.json`, NumPy's npz format);
    returns (its JSON result, the result's bytes). Its output is shown and the test stopped when it fails."""
    import numpy as np
    path, out = os.path.join(w, name + ".npz"), os.path.join(w, name + ".json")
    np.savez(path, **arrays)
    p = subprocess.run([sys.executable, script, "--arrays", path, "--out", out], capture_output=True, text=True)
    if p.returncode:
        print(p.stdout[-2000:], p.stderr[-3000:])
        raise SystemExit("%s failed on the %s arrays" % (os.path.basename(script), name))
    raw = open(out, "rb").read()
    return json.loads(raw), raw
