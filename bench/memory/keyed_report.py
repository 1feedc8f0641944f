"""Tables (and the ablation chart) of the keyed memory benchmark, from the JSON lines that
bench/memory/bench_memory.sh and bench/memory/ablations.sh collect (one object per DFM run: "eval" = the trainer's
final held-out evaluation record, "ideal" = bench/memory/keyed_ideal.py's output, plus labels).

  python3 bench/memory/keyed_report.py memory RUNS.jsonl OUT.md [--command CMD] [--seconds S] [--load X]
  python3 bench/memory/keyed_report.py ablations RUNS.jsonl OUT.md OUT.svg [--command CMD] [--seconds S] [--load X]

Evaluation modes are every scalar "ce_*" key of the record, named below when known; list-valued keys are
per-position CE inside a chunk. Pure Python (the chart is hand-written SVG).
"""
import argparse
import json
import os
import platform
import time

MODE_NAMES = {
    "ce_none": "fusion off",
    "ce_pred": "predicted memory",
    "ce_target": "target memory through this model",
}


def mode_name(k):
    return MODE_NAMES.get(k, k)


def modes_of(ev):
    keys = [k for k, v in ev.items() if k.startswith("ce_") and isinstance(v, (int, float)) and v == v]
    order = list(MODE_NAMES)
    return sorted(keys, key=lambda k: (order.index(k) if k in order else len(order), k))


def per_position(ev):
    return {k: v for k, v in ev.items() if isinstance(v, list) and v and isinstance(v[0], (int, float))}


def header(title, command, seconds, load=None):
    return ["# %s" % title, "",
            "Run %s UTC on %s (%d CPUs, load average %.1f at the end)%s." % (
                time.strftime("%Y-%m-%d %H:%M", time.gmtime()), platform.machine(), os.cpu_count() or 0,
                os.getloadavg()[0] if load is None else load, ", %d s in all" % seconds if seconds else ""),
            "Command: `%s`" % command if command else "", ""]


def fmt(x):
    return "%.4f" % x if isinstance(x, (int, float)) else "n/a"


def memory(runs, out, command, seconds, load):
    lines = header("Keyed memory benchmark", command, seconds, load)
    modes = []
    for r in runs:
        modes += [m for m in modes_of(r["eval"]) if m not in modes]
    lines.append("Held-out CE (nats per token); Δ = mode − fusion off (negative: memory helps).")
    lines.append("")
    cols = [mode_name(m) for m in modes] + ["Δ " + mode_name(m) for m in modes if m != "ce_none"]
    lines.append("| corpus | backbone pretrained on | DFM flags | " + " | ".join(cols) +
                 " | cosine | MSE | trained with target | DFM s |")
    lines.append("|---|---|---|" + "---:|" * (len(cols) + 4))
    for r in runs:
        ev = r["eval"]
        base = ev.get("ce_none")
        cells = [fmt(ev.get(m)) for m in modes]
        cells += ["%+.4f" % (ev[m] - base) if m in ev and base is not None else "n/a" for m in modes if m != "ce_none"]
        twt = {True: "yes (target memory = retrieval at inference)", False: "no"}.get(ev.get("trained_with_target"), "n/a")
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["corpus"], r.get("backbone", r["corpus"]), r["flags"], " | ".join(cells), fmt(ev.get("cos")),
            fmt(ev.get("mse")), twt, ev.get("seconds", "")))
    lines += ["", "Ideal cross-entropies of each corpus on the same held-out tokens (bench/memory/keyed_ideal.py):", "",
              "| corpus | key known (best target memory) | Bayes from context (best predicted memory, best backbone) "
              "| Bayes from the chunk's own tokens | key worth (in-chunk − key known) |", "|---|---:|---:|---:|---:|"]
    for r in {r["corpus"]: r for r in runs}.values():
        i = r["ideal"]
        lines.append("| %s | %.4f | %.4f | %.4f | %.4f |" % (r["corpus"], i["key_known"], i["from_context"],
                                                           i["in_chunk"], i["in_chunk"] - i["key_known"]))
    an = [r for r in runs if r.get("analysis")]
    if an:
        lines += ["", "Where the gain goes (bench/memory/keyed_analysis.py, the same trained modules in PyTorch): held-out CE of "
                  "chunks 1.. of each sequence, split by whether the chunk's key followed the chain (predicted memory "
                  "can know it) or was drawn fresh (predicted memory is confidently wrong); and the frozen head's "
                  "ceiling, the best CE any final hidden state gives each key's token distribution, against that "
                  "distribution's entropy (both on the corpus's empirical p(token | key)):", "",
                  "| corpus | backbone pretrained on | DFM flags | chunks followed / fresh | followed: fusion off | "
                  "followed: predicted | followed: target | fresh: fusion off | fresh: predicted | fresh: target | "
                  "head ceiling | key entropy |", "|---|---|---|---|" + "---:|" * 8]
        for r in an:
            a = r["analysis"]
            lines.append("| %s | %s | %s | %d / %d | %s | %s |" % (
                r["corpus"], r.get("backbone", r["corpus"]), r["flags"], a["chunks_followed"], a["chunks_fresh"],
                " | ".join(fmt(a[m][k]) for k in ("followed", "fresh") for m in ("none", "predicted", "target")),
                " | ".join(fmt(a[k]) for k in ("head_ceiling", "key_entropy"))))
    for r in runs:
        pp = per_position(r["eval"])
        L = r["ideal"]["chunk_len"]
        rows = [(mode_name(k.replace("_pos", "")), v) for k, v in pp.items()]
        rows += [("ideal: " + k.replace("_per_position", "").replace("_", " "), r["ideal"][k])
                 for k in ("key_known_per_position", "from_context_per_position", "in_chunk_per_position")]
        if not pp:
            rows.insert(0, ("(the trainer logs no per-position CE)", [None] * L))
        lines += ["", "Per-position CE inside a chunk, %s, backbone pretrained on %s, %s (position of the predicted "
                  "token, 0 = a chunk's first):" % (r["corpus"], r.get("backbone", r["corpus"]), r["flags"]), "",
                  "| | " + " | ".join(str(j) for j in range(L)) + " |", "|---|" + "---:|" * L]
        for name, v in rows:
            lines.append("| %s | %s |" % (name, " | ".join("%.2f" % x if isinstance(x, (int, float)) else "" for x in v[:L])))
    open(out, "w").write("\n".join(lines) + "\n")


def svg_bars(groups, path, title):
    """groups: [(group label, [(bar label, delta), ...]), ...]; horizontal bars of Δ CE."""
    bars = sum(len(b) for _, b in groups)
    w, row, left, top = 760, 18, 250, 40
    h = top + row * (bars + len(groups)) + 6 * len(groups) + 40
    lo = min([0.0] + [d for _, b in groups for _, d in b])
    hi = max([0.0] + [d for _, b in groups for _, d in b])
    span = (hi - lo) or 1.0
    x = lambda d: left + (d - lo) / span * (w - left - 80)
    s = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (w, h),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="10" y="18" font-size="13" font-weight="bold">%s</text>' % title]
    y = top
    for g, b in groups:
        s.append('<text x="10" y="%d" font-weight="bold">%s</text>' % (y + 12, g))  # a row of its own
        y += row
        for label, d in b:
            x0, x1 = sorted((x(0), x(d)))
            s.append('<text x="%d" y="%d" text-anchor="end">%s</text>' % (left - 6, y + 12, label))
            s.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>' % (
                x0, y + 2, max(x1 - x0, 1), row - 4, "#3b7dd8" if d < 0 else "#d8603b"))
            s.append('<text x="%.1f" y="%d">%+.3f</text>' % (max(x1, x0) + 4, y + 12, d))
            y += row
        y += 6
    s.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>' % (x(0), top - 4, x(0), y))
    s.append('<text x="%.1f" y="%d" text-anchor="middle">Δ held-out CE vs fusion off (nats; left = memory helps)</text>'
             % ((left + w - 80) / 2, y + 16))
    s.append("</svg>")
    open(path, "w").write("\n".join(s) + "\n")


def ablations(runs, out, svg, command, seconds, load):
    lines = header("Ablations on the keyed memory benchmark", command, seconds, load)
    lines += ["Each row: DFM modules trained with the default flags except the one named; held-out CE (nats); "
              "Δ = mode − fusion off of the same backbone.", ""]
    lines.append("| ablation | setting | fusion off | predicted memory | target memory | Δ predicted | Δ target | cosine | s |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    groups = {}
    for r in runs:
        ev = r["eval"]
        base = ev.get("ce_none")
        dp = ev["ce_pred"] - base if "ce_pred" in ev and base is not None else None
        dt = ev["ce_target"] - base if ev.get("ce_target") == ev.get("ce_target") and "ce_target" in ev and base is not None else None
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["ablation"], r["setting"], fmt(base), fmt(ev.get("ce_pred")), fmt(ev.get("ce_target")),
            "%+.4f" % dp if dp is not None else "n/a", "%+.4f" % dt if dt is not None else "n/a",
            fmt(ev.get("cos")), ev.get("seconds", "")))
        if dp is not None:
            groups.setdefault(r["ablation"], []).append((r["setting"], dp))
    lines += ["", "Chart: `%s` (Δ CE with predicted memory per setting)." % os.path.basename(svg)]
    open(out, "w").write("\n".join(lines) + "\n")
    svg_bars(list(groups.items()), svg, "Keyed benchmark: predicted memory vs fusion off")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["memory", "ablations"])
    ap.add_argument("runs")
    ap.add_argument("out")
    ap.add_argument("svg", nargs="?")
    ap.add_argument("--command", default="")
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--load", type=float, help="load average at the end of the runs (default: now)")
    a = ap.parse_args()
    runs = [json.loads(l) for l in open(a.runs) if l.strip()]
    if a.what == "memory":
        memory(runs, a.out, a.command, a.seconds, a.load)
    else:
        ablations(runs, a.out, a.svg or os.path.splitext(a.out)[0] + ".svg", a.command, a.seconds, a.load)


if __name__ == "__main__":
    main()
