#!/usr/bin/env python3
"""ladder_report.py — the memory ladder of #37/#44 in one table: each variant against each rung, the memory's own
effect (own memory minus its shuffled control) with its spread over the seeds, read from the benchmarks' result
lines. Nothing is measured here.

    python3 bench/memory/ladder_report.py [RESULTS_DIR] > bench/results/ladder.md

Rungs (columns):
    2 information   information.jsonl: the copy readout (`selfread`, fitted on another seed's entities) ranks the
                    probe answer's first token first: own memory against shuffled, percentage points
    3 reading       reading*.jsonl "reading" lines: held-out chunks regenerated from their own slot(s), nats per
                    token, shuffled slot minus own
    answer          the probe answer's log-prob (nats, mean over seeds) with target and with predicted memory; fusion
                    off (the frozen LM alone) is about −19.4 to −20.8 on these probes
    4 target        reading*.jsonl DFM arms: the probe answer's log-prob with target memory minus its shuffled
                    control, nats per answer; beside it the arm against scratch (the same DFM budget without the
                    lever) with target memory
    4 predicted     the same with predicted memory (no retrieval at inference)
    EM              target / predicted exact match
    held-out text   the arm's held-out corpus CE, shuffled minus target (nats per token)
    unseen          reading-unseen.jsonl: target minus shuffled on the probes of entities no training read
    CPU-s           everything the arm needed a seed (mean): DFM training, its reading stage, its teacher
A cell is "mean [min, max] (n seeds)"; "—" where the rung does not apply or was not run.
"""
import glob
import json
import os
import sys

from reading_report import label_steps, scratch_of
from real_memory_report import text_arm


def cell(xs, fmt="%+.2f"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    m = sum(xs) / len(xs)
    if len(xs) == 1:
        return (fmt % m) + " (1)"
    return "%s [%s, %s] (%d)" % (fmt % m, fmt % min(xs), fmt % max(xs), len(xs))


def pct(xs):
    xs = [x for x in xs if x is not None]
    return "—" if not xs else "%.1f %%" % (100 * sum(xs) / len(xs))


def lines(path):
    return [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []


def all_stages_cpu(r, reading):
    """CPU-seconds of everything an arm's line needed on its seed: its DFM training, plus the reading stage it
    started from (read: "reading", or "reading+lmM" with an LM-state lever) and the in-context teacher its loss used
    (distill, kd, gain); None where a stage's line is missing. The LM-state slot files (about 90 CPU-s a seed) are
    not in any line and not counted."""
    levers = r["arm"].split(" (")[0].split("+")
    need = []
    if "read" in levers:
        need.append("+".join(["reading"] + [lv for lv in levers if lv[:2] == "lm" and lv[2:].isdigit() or lv == "lm"]))
    if any(lv in ("distill", "kd", "gain") or lv.startswith("distill(") for lv in levers):
        need.append("teacher")
    total = r.get("cpu_s")
    for stage in need:
        found = [x.get("cpu_s") for x in reading if x["arm"] == stage and x["seed"] == r["seed"]]
        total = None if total is None or not found or found[0] is None else total + found[0]
    return total


ENTITIES = 240  # the facts corpus of every rung-4 line pooled here (bench_reading.sh's default)


def main():
    res = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "results")
    info = [r for r in lines(os.path.join(res, "information.jsonl")) if r.get("train") == "other"]
    reading = []
    for p in sorted(glob.glob(os.path.join(res, "reading*.jsonl"))):
        if not p.endswith("reading-unseen.jsonl"):
            reading += lines(p)
    # the ladder's probes are the 240-entity corpus; lines of another entity count (bench_reading.sh ENTITIES, e.g.
    # reading-many.jsonl) are another experiment, with their own table, and never pool with these
    reading = label_steps([r for r in reading if r.get("entities", ENTITIES) == ENTITIES])
    unseen = label_steps([r for r in lines(os.path.join(res, "reading-unseen.jsonl")) if r.get("entities", ENTITIES) == ENTITIES])
    text = [r for r in lines(os.path.join(res, "real_memory.jsonl")) if r.get("part") == "text"]

    out = ["# The memory ladder: every variant at every rung", "",
           "Made by `bench/memory/ladder_report.py` from the result lines of `bench_information.sh`, `bench_reading.sh` "
           "and `bench_real_memory.sh` (nothing is measured by the report). Each cell is the memory's own effect, own "
           "memory minus its shuffled control (the same modules or readout fed another example's memory), as mean "
           "[min, max] (seeds); positive means the memory's content helps. Knowledge probes: %d invented entities (lines of "
           "other entity counts are left to their own tables), " % ENTITIES +
           "frozen SmolLM2-135M, 150 DFM steps unless the arm says otherwise (then against scratch at its steps). Goals (#37): target − shuffled ≥ 3 nats per answer with ≥ 50 % EM, "
           "predicted − shuffled ≥ 1.5 nats with ≥ 25 % EM, every seed.", ""]

    out += ["## Rungs 2 and 3: what the slots hold, and whether the fusion can read them", "",
            "| slots hold | rung 2: copy readout top-1, own − shuffled (points) | rung 3: reconstruction, shuffled − own "
            "(nats/token) | rung 3: top-1 token accuracy own / shuffled |", "|---|---:|---:|---|"]
    for v in ("neighbour", "continuation", "both"):
        rs = [r for r in info if r.get("variant") == v]
        top = [100 * (r["selfread"]["probes_lift"]["own"]["top1"] - r["selfread"]["probes_lift"]["shuffled"]["top1"])
               for r in rs]
        rd = [r for r in reading if r["arm"] == "reading"] if v == "neighbour" else []
        last = [r["curve"][-1] for r in rd if r.get("curve")]
        out.append("| %s | %s | %s | %s / %s |" % (
            {"neighbour": "MiniLM vector of each neighbour (today)", "continuation": "MiniLM vector of each continuation",
             "both": "MiniLM vectors of both"}[v], cell(top, "%+.1f"), cell([c["ce_target_shuffled"] - c["ce_target"] for c in last]),
            pct([c.get("acc_target") for c in last]), pct([c.get("acc_target_shuffled") for c in last])))
    for stage in dict.fromkeys(r["arm"] for r in reading if r["arm"].startswith("reading+lm")):
        rd = [r for r in reading if r["arm"] == stage]
        last = [r["curve"][-1] for r in rd if r.get("curve")]
        lever = stage[len("reading+"):]
        out.append("| %s (`%s`) | — | %s | %s / %s |" % (
            "LM states of each neighbour token" if lever == "lm" else "LM states of each neighbour pooled to %s" % lever[2:], lever,
            cell([c["ce_target_shuffled"] - c["ce_target"] for c in last]), pct([c.get("acc_target") for c in last]),
            pct([c.get("acc_target_shuffled") for c in last])))

    out += ["", "## Rung 4: the DFM arms on the knowledge probes (nats per answer)", "",
            "| arm | answer log-prob, target / predicted | target − shuffled | target − scratch's target | target EM | predicted − shuffled | predicted − "
            "scratch's predicted | predicted EM | held-out text, shuffled − target (nats/token) | unseen entities: "
            "target − shuffled | CPU-s, all stages |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    arms = [a for a in dict.fromkeys(r["arm"] for r in reading if "probes" in r)]
    for a in arms:
        sc = {r["seed"]: r for r in reading if r["arm"] == scratch_of(a) and "probes" in r}
        rs = [r for r in reading if r["arm"] == a and "probes" in r]
        P = lambda r, m, k="logprob": r["probes"][m][k]
        gap = lambda m: [P(r, m) - P(r, m + "_shuffled") for r in rs]
        vs = lambda m: [P(r, m) - P(sc[r["seed"]], m) for r in rs if r["seed"] in sc] if a != scratch_of(a) else []
        held = [r["curve"][-1]["ce_target_shuffled"] - r["curve"][-1]["ce_target"] for r in rs if r.get("curve")]
        un = [r["probes_unseen"]["target"]["logprob"] - r["probes_unseen"]["target_shuffled"]["logprob"]
              for r in unseen if r["arm"] == a and "probes_unseen" in r]
        cost = [all_stages_cpu(r, reading) for r in rs]
        mean = lambda xs: sum(xs) / len(xs)
        out.append("| %s | %.2f / %.2f | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            a, mean([P(r, "target") for r in rs]), mean([P(r, "predicted") for r in rs]), cell(gap("target")), cell(vs("target")), pct([P(r, "target", "exact") for r in rs]), cell(gap("predicted")),
            cell(vs("predicted")), pct([P(r, "predicted", "exact") for r in rs]), cell(held, "%+.3f"), cell(un),
            "—" if None in cost else "%.0f" % (sum(cost) / len(cost))))

    if text:
        out += ["", "## Rung 5: held-out real text (nats per token, shuffled − own)", "",
                "| corpus | arm | redundancy | predicted | target | CPU-s a seed |", "|---|---|---:|---:|---:|---:|"]
        for c, a in dict.fromkeys((r["corpus"], text_arm(r)) for r in text):
            rs = [r for r in text if r["corpus"] == c and text_arm(r) == a]
            red = [100 * r["redundancy"]["in_training_part"] for r in rs if "redundancy" in r]
            cpu = [r["cpu_s"] for r in rs if "cpu_s" in r]
            out.append("| %s | %s | %s | %s | %s | %s |" % (
                c, a, "%.1f–%.1f %%" % (min(red), max(red)) if red else "—",
                cell([r["eval"]["ce_pred_shuffled"] - r["eval"]["ce_pred"] for r in rs], "%+.4f"),
                cell([r["eval"]["ce_target_shuffled"] - r["eval"]["ce_target"] for r in rs], "%+.4f"),
                "%.0f" % (sum(cpu) / len(cpu)) if cpu else "—"))
    print("\n".join(out))


if __name__ == "__main__":
    main()
