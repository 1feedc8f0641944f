#!/usr/bin/env python3
"""reading_report.py — the table of bench/memory/bench_reading.sh from its JSONL (one line per seed and arm).

    python3 bench/memory/reading_report.py bench/results/reading.jsonl > bench/results/reading.md

Rows: the reading stage (held-out reconstruction CE with the chunk's own slot, another chunk's slot, fusion off),
then each DFM arm (probe answer log-prob and exact match in every mode, held-out corpus CE of target memory and its
control, cost); with unseen entities (bench_reading.sh UNSEEN > 0: lines with probes_seen and probes_unseen), a table
of the probes of the entities no training read beside the seen ones, and each arm against scratch on them. Each figure
is the mean over the seeds with its range when there are several; the verdict columns say whether a gap holds on
EVERY seed.
"""
import json
import re
import sys


def stat(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    m = sum(xs) / len(xs)
    return "%.3f" % m if len(xs) == 1 else "%.3f [%.3f, %.3f]" % (m, min(xs), max(xs))


def pct(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    m = 100 * sum(xs) / len(xs)
    return "%.1f %%" % m if len(xs) == 1 else "%.1f %% [%.1f, %.1f]" % (m, 100 * min(xs), 100 * max(xs))


def secs(xs):
    xs = [x for x in xs if x is not None]
    return "%.0f" % (sum(xs) / len(xs)) if xs else "—"


def every(xs, pred):
    xs = [x for x in xs if x is not None]
    return "yes" if xs and all(pred(x) for x in xs) else "no"


DFM_STEPS = 150  # bench_reading.sh's default DFM budget: an arm trained for another is its own row, "ARM (N DFM steps)"


def label_steps(rows):
    """each DFM arm line trained for other than DFM_STEPS gets its budget in its arm name, so that rows of different
    budgets never pool, and its same-budget-without-the-lever baseline is scratch at that budget (scratch_of)"""
    for r in rows:
        a = r["arm"]
        if a != "teacher" and not a.startswith("reading") and r.get("train_steps", DFM_STEPS) != DFM_STEPS:
            r["arm"] = "%s (%d DFM steps)" % (a, r["train_steps"])
    return rows


def scratch_of(arm):
    """the arm's same budget without its levers: scratch at its number of DFM steps"""
    i = arm.find(" (")
    return "scratch" + (arm[i:] if i >= 0 else "")


def without(arm, lever):
    """the arm's name with one lever taken out, as the bench names arms: read alone is read+dfm, nothing is scratch"""
    rest = [t for t in arm.split(" (")[0].split("+") if t != lever]
    base = "read+dfm" if rest == ["read"] else "+".join(rest) or "scratch"
    return base + (arm[arm.find(" ("):] if " (" in arm else "")


def control_pairs(arms):
    """(arm, its control, what the pair measures) for the reading pass kept during DFM (recon): against the same arm
    without it, against the same arm whose reading pass reads shuffled slots (rshuf: the same text passes, nothing to
    read), and against the arm without it at twice the DFM steps (about the same CPU-seconds: a reading micro-batch
    costs a DFM one)"""
    pairs = []
    for a in arms:
        lv = a.split(" (")[0].split("+")
        if "recon" not in lv or "rshuf" in lv or " (" in a:
            continue
        pairs.append((a, without(a, "recon"), "the reading pass kept, against the same DFM steps without it"))
        pairs.append((a, "%s (%d DFM steps)" % (without(a, "recon"), 2 * DFM_STEPS),
                      "the same, against twice the DFM steps without it (about the same CPU-seconds)"))
        pairs.append((a, a + "+rshuf", "own slots in the reading pass, against shuffled slots (the same text passes)"))
    return [p for p in pairs if p[1] in arms]


def lm_pool(lever):
    """slots per neighbour of an LM-state lever: lmM pools to M; lm is the bench's default, one per token (32)"""
    return int(lever[2:]) if lever[2:].isdigit() else 32


def entities(rows):
    """the facts corpus' entity count of the lines (bench_reading.sh ENTITIES; lines written before it was recorded
    used the default, 240)"""
    return " and ".join(map(str, sorted({r.get("entities", 240) for r in rows})))


def main():
    rows = label_steps([json.loads(l) for l in open(sys.argv[1]) if l.strip()])
    seeds = sorted({r["seed"] for r in rows})
    by = lambda arm: [r for r in rows if r["arm"] == arm]
    out = ["# The reading lever: reconstruction pretraining, then DFM", "",
           "Made by `bench/memory/bench_reading.sh` (seeds %s); every figure is the mean over the seeds, with its range "
           "when there are several. Probe answer log-prob is summed over the answer's tokens (higher is better); EM is "
           "greedy exact match. \"Shuffled\" is the same modules fusing another probe's (or sequence's) memory. "
           "The facts corpus holds %s invented entities." %
           (", ".join(map(str, seeds)), entities(rows)), ""]
    for stage in dict.fromkeys(r["arm"] for r in rows if r["arm"].startswith("reading")):
        rd = by(stage)
        last = [r["curve"][-1] for r in rd if r["curve"]]
        out += ["## Reading: held-out chunks regenerated from their own %s (nats per token)" %
                (("LM-state slots (`dfm-train slots --own`, %s per chunk: arms with %s)" % (lm_pool(stage[8:]), stage[8:]))
                 if stage.startswith("reading+lm") else "embedding"), "",
                "| steps | own slot | shuffled slot | fusion off | shuffled − own: the memory's effect | own beats shuffled on every seed | top-1 token accuracy, own / shuffled slot | CPU-s |",
                "|---:|---:|---:|---:|---:|---|---|---:|",
                "| %s | %s | %s | %s | %s | %s | %s / %s | %s |" % (
                    "%d" % max(r["train_steps"] for r in rd), stat([c["ce_target"] for c in last]),
                    stat([c["ce_target_shuffled"] for c in last]), stat([c["ce_none"] for c in last]),
                    stat([c["ce_target_shuffled"] - c["ce_target"] for c in last]),
                    every([c["ce_target_shuffled"] - c["ce_target"] for c in last], lambda x: x > 0),
                    pct([c.get("acc_target") for c in last]), pct([c.get("acc_target_shuffled") for c in last]),
                    secs([r.get("cpu_s") for r in rd]))]
        out += ["", "Learning curve (seed, step: own / shuffled):", ""]
        for r in rd:
            out.append("- seed %d: " % r["seed"] + ", ".join("%d: %.3f / %.3f" % (c["step"], c["ce_target"], c["ce_target_shuffled"])
                                                           for c in r["curve"]))
        out.append("")
    te = by("teacher")
    if te:
        out += ["## The in-context teacher: the frozen LM with each chunk's first neighbours' text pasted (nats per token)", "",
                "Over the corpus rows it covers (every chunk but each sequence's first); `dfm-train teacher`, computed once "
                "per seed.", "",
                "| neighbours pasted | rows | LM alone | teacher | gain | CPU-s |", "|---:|---:|---:|---:|---:|---:|",
                "| %s | %s | %s | %s | %s | %s |" % (
                    "/".join(sorted({str(r["paste"]) for r in te})), secs([r["rows"] for r in te]),
                    stat([r["ce_alone"] for r in te]), stat([r["ce_teacher"] for r in te]),
                    stat([r["ce_alone"] - r["ce_teacher"] for r in te]), secs([r.get("cpu_s") for r in te])), ""]
    arms = ["scratch"] if by("scratch") else []  # then every other arm in the order the file first has it
    arms += [a for a in dict.fromkeys(r["arm"] for r in rows) if a not in ("scratch", "teacher") and not a.startswith("reading")]
    arms.sort(key=lambda a: a != scratch_of(a))  # each budget's scratch first (a stable sort keeps the file's order)
    if arms:
        out += ["## DFM arms against the same DFM budget from scratch: knowledge probes", "",
                "Each arm: the same DFM steps as scratch (%d unless the arm says otherwise, when its baseline is scratch "
                "at the same steps), with its levers (reading first, the margin, the content-only fusion, centred "
                "memory, zeroed memory, distillation, gain weighting, the predictor's input layer); CPU-s is the DFM "
                "training's (threads as the run's THREADS). The predictor's cosine to the answer chunk's target slots "
                "is given against its control, the cosine to another probe's target slots." % DFM_STEPS, "",
                "| arm | fusion off | target | target shuffled | target − shuffled | target EM | predicted | predicted shuffled | "
                "predicted − shuffled | predicted EM | in context | held-out CE target / shuffled | predictor cosine, "
                "own / another probe's target | CPU-s (DFM) |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|"]
        for a in arms:
            rs = [r for r in by(a) if "probes" in r]
            P = lambda m, k="logprob": [r["probes"][m][k] for r in rs]
            last = [r["curve"][-1] for r in rs if r["curve"]]
            A = lambda k: [(r.get("probes_analysis") or {}).get(k) for r in rs]
            out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %s / %s | %s |" % (
                a, stat(P("none")), stat(P("target")), stat(P("target_shuffled")),
                stat([x - y for x, y in zip(P("target"), P("target_shuffled"))]), pct(P("target", "exact")),
                stat(P("predicted")), stat(P("predicted_shuffled")),
                stat([x - y for x, y in zip(P("predicted"), P("predicted_shuffled"))]), pct(P("predicted", "exact")),
                stat(P("in_context")), stat([c["ce_target"] for c in last]), stat([c["ce_target_shuffled"] for c in last]),
                stat(A("predictor_cosine_answer_chunk")), stat(A("predictor_cosine_partner_target")),
                secs([r.get("cpu_s") for r in rs])))
        names = {"read": "reading first", "dfm": None, "margin": "the margin", "content": "the content-only fusion",
                 "centre": "centred memory", "zero": "training with zeroed memory (the matched-capacity control)",
                 "random": "training on random-vector targets", "distill": "distillation from the in-context teacher",
                 "kd": "the in-context teacher's KL alone (no hard CE)", "gain": "the teacher-gain-weighted CE",
                 "lm": "slots in the LM's own space", "recon": "the reading objective kept during DFM training",
                 "ctx": "its chunks read after their real context",
                 "skip": "the predictor's linear skip path from its input to its slots"}
        names.update({t: "the predictor reading the LM's states after %s blocks" % t[4:]
                      for a in arms for t in a.split(" (")[0].split("+") if re.fullmatch(r"pred\d+", t)})
        names.update({t: "the predictor's loss weighted %s" % t[3:]
                      for a in arms for t in a.split(" (")[0].split("+") if re.fullmatch(r"mse\d+", t)})
        names.update({t: "the predictor's input pooled over the chunk's last %s tokens" % t[4:]
                      for a in arms for t in a.split(" (")[0].split("+") if re.fullmatch(r"last\d+", t)})

        def what(arm):
            parts = [names.get(t, t) if not re.fullmatch(r"lm\d+", t) else
                     "slots in the LM's own space pooled to %s a neighbour" % t[2:] for t in arm.split(" (")[0].split("+") if names.get(t, t)]
            s = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
            return s[0].upper() + s[1:] + (arm[arm.find(" ("):] if " (" in arm else "")

        def against_scratch(key, where):
            """per arm, its probes (r[key]: all, or the unseen entities') against scratch's on the seeds both have"""
            lines = []
            for a in arms:
                if a == scratch_of(a):
                    continue
                sc = {r["seed"]: r for r in by(scratch_of(a)) if key in r}
                lv = {r["seed"]: r for r in by(a) if key in r}
                common = sorted(set(sc) & set(lv))
                if not common:
                    continue
                gain = [lv[s][key]["target"]["logprob"] - sc[s][key]["target"]["logprob"] for s in common]
                gainp = [lv[s][key]["predicted"]["logprob"] - sc[s][key]["predicted"]["logprob"] for s in common]
                eff = [(lv[s][key]["target"]["logprob"] - lv[s][key]["target_shuffled"]["logprob"]) -
                       (sc[s][key]["target"]["logprob"] - sc[s][key]["target_shuffled"]["logprob"]) for s in common]
                lines += ["", "%s against the same DFM steps without it%s (per seed %s, %s − %s, answer log-prob): "
                          "target memory %s (better on every seed: %s); predicted memory %s (better on every seed: %s); "
                          "target − shuffled gap %s (wider on every seed: %s)." % (
                              what(a), where, ", ".join(map(str, common)), a, scratch_of(a), stat(gain), every(gain, lambda x: x > 0),
                              stat(gainp), every(gainp, lambda x: x > 0), stat(eff), every(eff, lambda x: x > 0))]
            return lines
        curves = [(a, r) for a in arms for r in by(a) if len(r.get("curve") or []) > 1]
        if curves:
            out += ["", "Learning curves of the DFM arms (held-out corpus CE, target memory / its shuffled control, by "
                    "step; seed):", ""]
            out += ["- %s, seed %d: %s" % (a, r["seed"], ", ".join("%d: %.3f / %.3f" % (
                c["step"], c["ce_target"], c["ce_target_shuffled"]) for c in r["curve"])) for a, r in curves]
        recs = [(a, r) for a in arms for r in by(a) if r.get("reconstruct")]
        if recs:
            out += ["", "Reading kept during DFM training (--reconstruct-weight): the held-out sequences' chunks regenerated "
                    "after the reading prompt, CE per token with their own slot / a shuffled slot / fusion off, by step; "
                    "seed:", ""]
            out += ["- %s, seed %d: %s" % (a, r["seed"], ", ".join("%d: %.3f / %.3f / %.3f" % (
                c["step"], c["ce_target"], c["ce_target_shuffled"], c["ce_none"]) for c in r["reconstruct"])) for a, r in recs]
        out += against_scratch("probes", "")
        pairs = control_pairs(arms)
        if pairs:
            out += ["", "## The reading pass against its controls: knowledge probes", "",
                    "Per seed, the arm minus its control (answer log-prob; positive: the arm answers better); the memory "
                    "gap is target − shuffled; held-out text is the corpus' held-out sequences, shuffled − target CE "
                    "(nats per token).", "",
                    "| arm | control | what it measures | seeds | target: arm − control | predicted: arm − control | "
                    "target − shuffled: arm / control | target EM: arm / control | held-out text: arm / control | "
                    "CPU-s: arm / control |", "|---|---|---|---|---:|---:|---|---|---|---|"]
            for a, c, what_ in pairs:
                ar, cr = {r["seed"]: r for r in by(a)}, {r["seed"]: r for r in by(c)}
                sd = sorted(set(ar) & set(cr))
                if not sd:
                    continue
                P = lambda rs, m, k="logprob": [rs[x]["probes"][m][k] for x in sd]
                gap = lambda rs: [x - y for x, y in zip(P(rs, "target"), P(rs, "target_shuffled"))]
                txt = lambda rs: [rs[x]["curve"][-1]["ce_target_shuffled"] - rs[x]["curve"][-1]["ce_target"]
                                  for x in sd if rs[x].get("curve")]
                out.append("| %s | %s | %s | %s | %s | %s | %s / %s | %s / %s | %s / %s | %s / %s |" % (
                    a, c, what_, ", ".join(map(str, sd)),
                    ", ".join("%+.2f" % (x - y) for x, y in zip(P(ar, "target"), P(cr, "target"))),
                    ", ".join("%+.2f" % (x - y) for x, y in zip(P(ar, "predicted"), P(cr, "predicted"))),
                    stat(gap(ar)), stat(gap(cr)), pct(P(ar, "target", "exact")), pct(P(cr, "target", "exact")),
                    stat(txt(ar)), stat(txt(cr)), secs([ar[x].get("cpu_s") for x in sd]), secs([cr[x].get("cpu_s") for x in sd])))
        # UNSEEN > 0 (bench_reading.sh): the probes of the entities no training read, beside the seen ones
        un = [a for a in arms if any("probes_unseen" in r for r in by(a))]
        if un:
            out += ["", "## Unseen entities: probes of entities whose documents no training read", "",
                    "facts.py --unseen: their documents are the run's last sequences, held out of the reading stage and "
                    "of DFM training; the datastore (target memory) still retrieves them. Answer log-prob; a gap is the "
                    "mode minus its shuffled control.", "",
                    "| arm | sequences seen / unseen | unseen: fusion off | target | target − shuffled | target EM | "
                    "predicted | predicted − shuffled | predicted EM | in context | seen: target − shuffled | "
                    "seen: predicted − shuffled |",
                    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for a in un:
                rs = [r for r in by(a) if "probes_unseen" in r and "probes_seen" in r]
                U = lambda m, k="logprob", key="probes_unseen": [r[key][m][k] for r in rs]
                gap = lambda m, key="probes_unseen": [x - y for x, y in zip(U(m, key=key), U(m + "_shuffled", key=key))]
                out.append("| %s | %s / %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                    a, secs(U("none", "n", "probes_seen")), secs(U("none", "n")), stat(U("none")), stat(U("target")),
                    stat(gap("target")), pct(U("target", "exact")), stat(U("predicted")), stat(gap("predicted")),
                    pct(U("predicted", "exact")), stat(U("in_context")), stat(gap("target", "probes_seen")),
                    stat(gap("predicted", "probes_seen"))))
            out += against_scratch("probes_unseen", " on the unseen entities")
    print("\n".join(out))


if __name__ == "__main__":
    main()
