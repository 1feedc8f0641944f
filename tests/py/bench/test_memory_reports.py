"""The memory reports' arithmetic (bench/memory/ladder_report.py, real_memory_report.py), run as programs on planted
result lines whose figures are known here:
  1. rung 5 of the ladder keeps each corpus's arms apart (DFM from scratch, reading first, reading first with another
     number of reading steps): one row each, its mean, min and max over its own seeds only, its redundancy range and
     its mean CPU-seconds; a report that pooled the arms (as the ladder did until 2026-12-06) fails here;
  2. real_memory_report.py gives the same arms the same effects.
Needs only Python. Exits non-zero on failure.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import check, finish  # noqa: E402

BENCH = os.path.join(ROOT, "bench", "memory")

# (arm, read_steps or None, seed, predicted effect, target effect, redundancy, CPU s)
PLANTED = [("scratch", None, 1, 0.010, 0.020, 0.05, 400.0), ("scratch", None, 2, 0.030, 0.060, 0.07, 500.0),
           ("read", 200, 1, 0.050, 0.100, 0.05, 1100.0), ("read", 200, 2, 0.070, 0.140, 0.07, 1300.0),
           ("read", 400, 1, 0.090, 0.180, 0.05, 2000.0)]


def line(arm, steps, seed, ep, et, red, cpu):
    ce_pred, ce_target = 2.5, 2.6
    r = {"part": "text", "corpus": "manual", "seed": seed, "arm": arm, "cpu_s": cpu,
         "redundancy": {"ngram": 8, "heldout_ngrams": 1000, "in_training_part": red},
         "eval": {"ce_none": 2.9, "ce_pred": ce_pred, "ce_target": ce_target, "ce_pred_shuffled": ce_pred + ep,
                  "ce_target_shuffled": ce_target + et, "memory_effect_pred": ep, "memory_effect_target": et, "cos": 0.5,
                  "ce_pos_none": [3.0] * 4, "ce_pos_pred": [2.5] * 4, "ce_pos_pred_shuffled": [2.5 + ep] * 4}}
    if steps is not None:
        r["read_steps"] = steps
    return r


def main():
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "real_memory.jsonl"), "w") as f:
            for p in PLANTED:
                f.write(json.dumps(line(*p)) + "\n")
        ladder = subprocess.run([sys.executable, os.path.join(BENCH, "ladder_report.py"), d], capture_output=True, text=True)
        check(ladder.returncode == 0, "ladder_report.py runs on planted lines (%s)" % ladder.stderr[-300:])
        rows = [r for r in ladder.stdout.splitlines() if r.startswith("| manual |")]
        want = {"scratch": ("+0.0200 [+0.0100, +0.0300] (2)", "+0.0400 [+0.0200, +0.0600] (2)", "5.0–7.0 %", "450"),
                "read": ("+0.0600 [+0.0500, +0.0700] (2)", "+0.1200 [+0.1000, +0.1400] (2)", "5.0–7.0 %", "1200"),
                "read (400 reading steps)": ("+0.0900 (1)", "+0.1800 (1)", "5.0–5.0 %", "2000")}
        check(len(rows) == len(want), "rung 5 has one row per arm: %d rows for %d arms" % (len(rows), len(want)))
        for r in rows:
            cells = [c.strip() for c in r.strip("|").split("|")]
            arm = cells[1]
            check(arm in want, "rung 5 row of a planted arm: %r" % arm)
            if arm in want:
                pred, target, red, cpu = want[arm]
                check(cells[2:] == [red, pred, target, cpu], "arm %s: redundancy, predicted, target, CPU-s %s = %s"
                      % (arm, cells[2:], [red, pred, target, cpu]))

        real = subprocess.run([sys.executable, os.path.join(BENCH, "real_memory_report.py"),
                               os.path.join(d, "real_memory.jsonl")], capture_output=True, text=True)
        check(real.returncode == 0, "real_memory_report.py runs on planted lines (%s)" % real.stderr[-300:])
        for arm, (pred, _, _, _) in want.items():
            mean = pred.split()[0]
            check(any(arm in r and mean in r for r in real.stdout.splitlines()),
                  "real_memory_report.py: arm %s with its predicted effect %s" % (arm, mean))
    finish("memory reports")


if __name__ == "__main__":
    main()
