#!/usr/bin/env python3
"""real_memory_report.py — bench/results/real_memory.md from bench_real_memory.sh's JSON lines: per corpus, the
held-out CE in every mode with the memory effect (shuffled control minus real memory) beside fusion off; per
probe form, answer log-prob and exact match in every mode, the in-context reference and the share of its gain
that memory recovers; the analysis; and the goals of the benchmark, met or not on every seed.

    python3 bench/memory/real_memory_report.py bench/results/real_memory.jsonl > bench/results/real_memory.md
"""
import json
import statistics
import sys


def text_arm(r):
    """a held-out-text line's arm, with its reading steps where they differ from the first runs' 200"""
    a, n = r.get("arm", "scratch"), r.get("read_steps", 200)
    return a if n == 200 else "%s (%d reading steps)" % (a, n)


def spread(v, fmt="%.4f"):
    """mean (min .. max) over the seeds"""
    if not v:
        return "n/a"
    if len(v) == 1:
        return fmt % v[0]
    return (fmt + " (" + fmt + " .. " + fmt + ")") % (statistics.mean(v), min(v), max(v))


def main():
    rows = [json.loads(l) for l in open(sys.argv[1])]
    text = [r for r in rows if r["part"] == "text"]
    probes = [r for r in rows if r["part"] == "probes"]
    goals = []
    print("# What memory does for a real frozen LM (SmolLM2-135M)\n")
    print("`bash bench/memory/bench_real_memory.sh`. Values are the mean over the seeds, then (min .. max). Δ is a mode's "
          "CE minus fusion off (negative helps); the **memory effect** is the shuffled control's CE minus the real "
          "memory's: the same trained modules fusing another sequence's memory, so capacity cancels (positive: "
          "the sequence's own memory helps).\n")
    if text:
        print("## Held-out real text (datastore: the training part; held-out chunks retrieve from it)\n")
        print("Redundancy: the share of the held-out part's word 8-grams that occur anywhere in the training part "
              "(the datastore), measured on each seed's split: how much of what a held-out chunk says was already "
              "written elsewhere.%s\n" % (
                  " Lines written before the benchmark measured it carry it measured afterwards on the same split (%s)."
                  % ", ".join(sorted({"%s seed %d" % (r["corpus"], r["seed"]) for r in text
                                      if r.get("redundancy", {}).get("measured")}))
                  if any(r.get("redundancy", {}).get("measured") for r in text) else ""))
        print("| corpus | arm | seeds | redundancy | fusion off | Δ predicted | Δ target | memory effect, predicted "
              "| memory effect, target | cosine | CPU-s |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        arms = sorted({(r["corpus"], text_arm(r)) for r in text}, key=lambda k: (k[0], k[1] != "scratch", k[1]))
        of = lambda corpus, arm: [r for r in text if r["corpus"] == corpus and text_arm(r) == arm]
        for corpus, arm in arms:
            rs = of(corpus, arm)
            es = [r["eval"] for r in rs]
            red = [100 * r["redundancy"]["in_training_part"] for r in rs if "redundancy" in r]
            cpu = [r["cpu_s"] for r in rs if "cpu_s" in r]
            print("| %s | %s | %d | %s | %s | %s | %s | **%s** | **%s** | %s | %s |" % (
                corpus, arm, len(es), spread(red, "%.1f %%") if red else "not measured", spread([e["ce_none"] for e in es]),
                spread([e["ce_pred"] - e["ce_none"] for e in es], "%+.4f"),
                spread([e["ce_target"] - e["ce_none"] for e in es], "%+.4f"),
                spread([e["memory_effect_pred"] for e in es], "%+.4f"),
                spread([e["memory_effect_target"] for e in es], "%+.4f"), spread([e["cos"] for e in es], "%.3f"),
                spread(cpu, "%.0f") if cpu else "n/a"))
            name = corpus if arm == "scratch" else f"{corpus}, {arm}"
            goals.append((f"{name}: predicted memory ≥ 0.03 nats below its shuffled control on every seed",
                          all(e["memory_effect_pred"] >= 0.03 for e in es), [e["memory_effect_pred"] for e in es]))
            goals.append((f"{name}: target memory ≥ 0.10 nats below its shuffled control on every seed",
                          all(e["memory_effect_target"] >= 0.10 for e in es), [e["memory_effect_target"] for e in es]))
        rd = [(c, a) for c, a in arms if any("reading" in r for r in of(c, a))]
        if rd:
            print("\nThe reading stage on the training part (arms that read first): its held-out chunks regenerated "
                  "from their own embedding against another chunk's, nats per token and top-1 token accuracy:\n")
            for corpus, arm in rd:
                g = [r["reading"] for r in of(corpus, arm) if "reading" in r]
                print("- %s, %s: own %s, shuffled %s, fusion off %s; accuracy %s against %s" % (
                    corpus, arm, spread([x["ce_target"] for x in g], "%.3f"), spread([x["ce_target_shuffled"] for x in g], "%.3f"),
                    spread([x["ce_none"] for x in g], "%.3f"), spread([100 * x.get("acc_target", 0) for x in g], "%.1f %%"),
                    spread([100 * x.get("acc_target_shuffled", 0) for x in g], "%.1f %%")))
        print("\nCE by position of the predicted token inside its chunk (0 = a chunk's first token; mean over seeds), "
              "fusion off / predicted / predicted's control:\n")
        for corpus, arm in arms:
            es = [r["eval"] for r in of(corpus, arm)]
            L = len(es[0]["ce_pos_none"])
            m = lambda k, j: statistics.mean(e[k][j] for e in es)
            cols = [0, 1, 2, 4, 8, 16, L - 1]
            print(f"- {corpus}, {arm}: " + "; ".join("%d: %.3f / %.3f / %.3f" % (j, m("ce_pos_none", j), m("ce_pos_pred", j),
                                                                                   m("ce_pos_pred_shuffled", j)) for j in cols if j < L))
        print()
    if probes:
        modes = ("none", "predicted", "target", "predicted_shuffled", "target_shuffled", "in_context")
        names = {"none": "fusion off", "predicted": "predicted memory", "target": "target memory",
                 "predicted_shuffled": "predicted, shuffled control", "target_shuffled": "target, shuffled control",
                 "in_context": "in-context reference (fact pasted)"}
        print("## Knowledge probes (invented entities; facts stated three times in the corpus)\n")
        sc = [r["score"] for r in probes]
        print("%d probes per seed in two forms; answer log-prob summed over the answer's tokens, exact match = greedy "
              "decoding gives the answer.\n" % sc[0]["probes"])
        for form in ("question", "cloze"):
            print(f"### {form} form\n")
            print("| mode | answer log-prob | exact match |")
            print("|---|---:|---:|")
            for m in modes:
                print("| %s | %s | %s |" % (names[m], spread([s["by_form"][form][m]["logprob"] for s in sc], "%.2f"),
                                            spread([100 * s["by_form"][form][m]["exact"] for s in sc], "%.1f %%")))
            print()
        def share(s, m, form):
            b = s["by_form"][form]
            gain = b["in_context"]["logprob"] - b["none"]["logprob"]
            return (b[m]["logprob"] - b["none"]["logprob"]) / gain if gain > 0 else float("nan")
        print("Share of the in-context reference's gain over fusion off (answer log-prob) that each mode recovers:\n")
        print("| form | in-context gain (nats) | target memory | predicted memory | predicted − its control (nats) |")
        print("|---|---:|---:|---:|---:|")
        for form in ("question", "cloze"):
            gains = [s["by_form"][form]["in_context"]["logprob"] - s["by_form"][form]["none"]["logprob"] for s in sc]
            eff = [s["by_form"][form]["predicted"]["logprob"] - s["by_form"][form]["predicted_shuffled"]["logprob"]
                   for s in sc]
            print("| %s | %s | %s | %s | %s |" % (form, spread(gains, "%.2f"),
                                                 spread([100 * share(s, "target", form) for s in sc], "%.0f %%"),
                                                 spread([100 * share(s, "predicted", form) for s in sc], "%.0f %%"),
                                                 spread(eff, "%+.2f")))
            goals.append((f"probes, {form}: target memory recovers ≥ 50 % of the in-context gain on every seed",
                          all(share(s, "target", form) >= 0.5 for s in sc), [round(share(s, "target", form), 3) for s in sc]))
            goals.append((f"probes, {form}: predicted memory recovers ≥ 25 % of it on every seed",
                          all(share(s, "predicted", form) >= 0.25 for s in sc),
                          [round(share(s, "predicted", form), 3) for s in sc]))
            goals.append((f"probes, {form}: predicted memory ≥ 0.5 nats above its shuffled control on every seed",
                          all(e >= 0.5 for e in eff), [round(e, 3) for e in eff]))
            icx = [s["by_form"][form]["in_context"]["exact"] for s in sc]
            if all(x >= 0.2 for x in icx):
                goals.append((f"probes, {form}: in-context exact match ≥ 20 %, so predicted memory reaches half of it",
                              all(s["by_form"][form]["predicted"]["exact"] >= 0.5 * s["by_form"][form]["in_context"]["exact"]
                                  for s in sc), [s["by_form"][form]["predicted"]["exact"] for s in sc]))
        print("\n### Analysis\n")
        an = [s["analysis"] for s in sc]
        print("- predictor cosine to the target slots of the answer's chunk: %s" %
              spread([a["predictor_cosine_answer_chunk"] for a in an], "%.3f"))
        print("- retrieval recall (a neighbour of the answer's chunk holds the answer): %s" %
              spread([a["retrieval_recall"] for a in an], "%.3f"))
        for m in ("predicted", "target"):
            g = [a["gate_mean_answer_rows"][m] for a in an if a["gate_mean_answer_rows"][m]]
            if g:
                print("- mean fusion gate where the answer is predicted, %s memory, per block: %s" % (
                    m, ", ".join(spread([x[i] for x in g], "%.3f") for i in range(len(g[0])))))
        print("- CE of answer tokens / other tokens (nats per token):")
        for m in modes:
            other = [a["ce_other_tokens"].get(m) for a in an]
            print("  - %s: %s / %s" % (names[m], spread([a["ce_answer_tokens"][m] for a in an], "%.3f"),
                                     spread(other, "%.3f") if all(o is not None for o in other) else "n/a"))
        er = [a["exact_by_recall"] for a in an]
        ret = [x["retrieved"]["logprob"] for x in er if x["retrieved"]]
        mis = [x["missed"]["logprob"] for x in er if x["missed"]]
        print("- target memory's answer log-prob when retrieval found the fact / missed it: %s / %s" %
              (spread(ret, "%.2f"), spread(mis, "%.2f")))
        print()
    print("## Goals (each must hold on every seed)\n")
    for g, ok, vals in goals:
        print("- %s %s: %s" % ("**met**" if ok else "**not met**", g, vals))


if __name__ == "__main__":
    main()
