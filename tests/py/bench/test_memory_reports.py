"""The memory reports' arithmetic (bench/memory/ladder_report.py, real_memory_report.py), run as programs on planted
result lines whose figures are known here:
  1. rung 5 of the ladder keeps each corpus's arms apart (DFM from scratch, reading first, reading first with another
     number of reading steps): one row each, its mean, min and max over its own seeds only, its redundancy range and
     its mean CPU-seconds; a report that pooled the arms (as the ladder did until 2026-12-06) fails here;
  2. real_memory_report.py gives the same arms the same effects;
  3. rung 4 (knowledge probes, reading*.jsonl) keeps arms of another DFM budget apart ("ARM (600 DFM steps)") and
     measures each arm against scratch at its own budget: a report that pooled budgets or compared a 600-step arm
     with 150-step scratch fails here.
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
        # rung 4: (arm, DFM steps, seed, target log-prob, shuffled target log-prob, predicted log-prob)
        probe_lines = [("scratch", 150, 1, -16.0, -16.5, -17.0), ("scratch", 150, 2, -18.0, -18.5, -19.0),
                       ("scratch", 600, 1, -12.0, -13.0, -14.0), ("pred16", 600, 1, -10.0, -12.0, -11.0)]
        with open(os.path.join(d, "reading.jsonl"), "w") as f:
            def probe(t, ts, p):
                return {m: {"logprob": v, "exact": 0.0, "n": 10} for m, v in
                        (("none", -20.0), ("target", t), ("target_shuffled", ts), ("predicted", p), ("predicted_shuffled", p),
                         ("in_context", -7.0))}
            for arm, steps, seed, t, ts, p in probe_lines:
                pr = probe(t, ts, p)
                f.write(json.dumps({"seed": seed, "arm": arm, "train_steps": steps, "curve": [], "probes": pr}) + "\n")
            # a line of another corpus (bench_reading.sh ENTITIES=2400): its own table, never pooled into the ladder's rows
            f.write(json.dumps({"seed": 3, "arm": "scratch", "entities": 2400, "train_steps": 150, "curve": [],
                                "probes": pr}) + "\n")
            # an arm started from the reading stage: its CPU-seconds, all stages, are the stage's plus its own
            f.write(json.dumps({"seed": 1, "arm": "reading", "train_steps": 200, "curve": [], "cpu_s": 1000.0}) + "\n")
            f.write(json.dumps({"seed": 1, "arm": "read+dfm", "train_steps": 150, "curve": [], "probes": probe(-16.0, -16.5, -17.0),
                                "cpu_s": 600.0}) + "\n")
            # an arm with --reconstruct-weight: its held-out reconstruction by step
            f.write(json.dumps({"seed": 1, "arm": "recon", "train_steps": 150, "curve": [], "probes": pr, "reconstruct": [
                {"step": 75, "ce_none": 5.0, "ce_target": 3.25, "ce_target_shuffled": 4.5},
                {"step": 150, "ce_none": 5.0, "ce_target": 3.125, "ce_target_shuffled": 4.625}]}) + "\n")
        ladder = subprocess.run([sys.executable, os.path.join(BENCH, "ladder_report.py"), d], capture_output=True, text=True)
        rows = {[c.strip() for c in r.strip("|").split("|")][0]: [c.strip() for c in r.strip("|").split("|")]
                for r in ladder.stdout.split("## Rung 4")[-1].split("## Rung 5")[0].splitlines() if r.startswith("| ")
                and not r.startswith("| arm") and not r.startswith("|---")}
        want4 = {"scratch": ("+0.50 [+0.50, +0.50] (2)", "—"), "scratch (600 DFM steps)": ("+1.00 (1)", "—"),
                 "recon": ("+2.00 (1)", "+6.00 (1)"), "read+dfm": ("+0.50 (1)", "+0.00 (1)"),
                 "pred16 (600 DFM steps)": ("+2.00 (1)", "+2.00 (1)")}
        check(sorted(rows) == sorted(want4), "rung 4 has one row per arm and budget (the 2400-entity line apart): %s"
              % sorted(rows))
        for arm, (gap, vs) in want4.items():
            got = rows.get(arm, [None] * 4)[2:4]
            check(got == [gap, vs], "rung 4 %s: target − shuffled and target − its budget's scratch %s = %s" %
                  (arm, got, [gap, vs]))
        got = [rows.get("read+dfm", [None] * 11)[i] for i in (1, 10)]
        check(got == ["-16.00 / -17.00", "1600"], "rung 4 read+dfm: answer log-prob target / predicted, and CPU-s of all "
              "stages (its reading stage's 1000 + its own 600) %s = %s" % (got, ["-16.00 / -17.00", "1600"]))
        check(rows.get("scratch", [None] * 11)[10] == "—", "rung 4: CPU-s '—' where the lines carry none (%s)"
              % rows.get("scratch"))
        rr = subprocess.run([sys.executable, os.path.join(BENCH, "reading_report.py"), os.path.join(d, "reading.jsonl")],
                            capture_output=True, text=True)
        check(rr.returncode == 0 and "pred16 (600 DFM steps) against the same DFM steps without it" not in rr.stdout and
              "The predictor reading the LM's states after 16 blocks (600 DFM steps) against the same DFM steps" in rr.stdout
              and "pred16 (600 DFM steps) − scratch (600 DFM steps), answer log-prob): target memory 2.000" in rr.stdout,
              "reading_report.py names the lever and compares it with scratch at 600 steps (+2.000): %s" %
              [l for l in rr.stdout.splitlines() if "against the same" in l][:1])
        check("- recon, seed 1: 75: 3.250 / 4.500 / 5.000, 150: 3.125 / 4.625 / 5.000" in rr.stdout and
              "The reading objective kept during DFM training against the same DFM steps" in rr.stdout,
              "reading_report.py lists an arm's held-out reconstruction by step (own / shuffled / off) and names the lever: %s"
              % [l for l in rr.stdout.splitlines() if l.startswith("- recon")][:1])
        # the reading pass against its controls: without it (scratch), at twice the steps, with shuffled reading slots
        with open(os.path.join(d, "pairs.jsonl"), "w") as f:
            for arm, steps, t in (("scratch", 150, -16.0), ("recon", 150, -10.0), ("recon+rshuf", 150, -12.5),
                                  ("scratch", 300, -11.0)):
                pr = {m: {"logprob": v, "exact": 0.0, "n": 10} for m, v in
                      (("none", -20.0), ("target", t), ("target_shuffled", t - 1), ("predicted", t), ("predicted_shuffled", t),
                       ("in_context", -7.0))}
                f.write(json.dumps({"seed": 1, "arm": arm, "train_steps": steps, "curve": [], "probes": pr}) + "\n")
        rp = subprocess.run([sys.executable, os.path.join(BENCH, "reading_report.py"), os.path.join(d, "pairs.jsonl")],
                            capture_output=True, text=True)
        got = {tuple(c.strip() for c in r.strip("|").split("|")[:2]): [c.strip() for c in r.strip("|").split("|")][4]
               for r in rp.stdout.split("against its controls")[-1].splitlines() if r.startswith("| recon")}
        want = {("recon", "scratch"): "+6.00", ("recon", "scratch (300 DFM steps)"): "+1.00", ("recon", "recon+rshuf"): "+2.50"}
        check(rp.returncode == 0 and got == want, "reading_report.py puts the reading pass against its three controls "
              "(target, arm − control): %s = %s" % (got, want))
    finish("memory reports")


if __name__ == "__main__":
    main()
