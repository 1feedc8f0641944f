#!/usr/bin/env python3
"""growth_report.py — the tables, fits, prediction and chart of bench/retrieval/growth.sh.

    python3 bench/retrieval/growth_report.py --out bench/results [--dfm build/dfm] growth-*.jsonl

Reads the JSON lines growth.sh wrote (one per stage, size and rank count), and writes OUT/growth.md and
OUT/growth.svg (hand-drawn SVG: matplotlib is not in the environment). Per stage it fits the per-rank
CPU time (slowest rank), wall time, peak RSS per rank and disk against the size n on log-log axes
(power law n^b), compares with one-parameter linear and n log n fits, checks the power law fitted on
all but the largest size against the largest (held-out error), and predicts a 5e9-token job (156.25 M
chunks of 32 tokens, d = 384) on 64 ranks. With --dfm it runs `dfm estimate --json` at every measured
point and states its error against the measurement.
"""
import argparse
import json
import math
import subprocess
import sys
from collections import defaultdict

BIG_TOKENS, BIG_CHUNKS, BIG_RANKS, BIG_DIM = 5e9, 5e9 / 32, 64, 384


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line:
                    r = json.loads(line)
                    ranks = r["ranks"]
                    r["cpu_max"] = max(u + s for _, u, s, _ in ranks)
                    r["cpu_sum"] = sum(u + s for _, u, s, _ in ranks)
                    r["rss_max"] = max(m for *_, m in ranks) * 1024.0
                    rows.append(r)
    return rows


def fit_power(xs, ys):
    """least squares of log y = log a + b log x; returns a, b, rms of the log residuals"""
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    n = len(lx)
    mx, my = sum(lx) / n, sum(ly) / n
    sxx = sum((x - mx) ** 2 for x in lx)
    b = sum((x - mx) * (y - my) for x, y in zip(lx, ly)) / sxx if sxx > 0 else 1.0
    a = math.exp(my - b * mx)
    rms = math.sqrt(sum((math.log(a) + b * x - y) ** 2 for x, y in zip(lx, ly)) / n)
    return a, b, rms


def fit_shape(xs, ys, shape):
    """one-parameter fit y = c * shape(x) in log space; returns c and rms of the log residuals"""
    r = [math.log(max(y, 1e-9)) - math.log(shape(x)) for x, y in zip(xs, ys)]
    lc = sum(r) / len(r)
    return math.exp(lc), math.sqrt(sum((v - lc) ** 2 for v in r) / len(r))


def fit_affine(xs, ys):
    """least squares of y = t0 + c x on linear axes; returns t0, c, rms of the log residuals"""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    c = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    t0 = my - c * mx
    rms = math.sqrt(sum((math.log(max(t0 + c * x, 1e-9)) - math.log(max(y, 1e-9))) ** 2 for x, y in zip(xs, ys)) / n)
    return t0, c, rms


# the part of a stage's per-rank time that does not shrink with more ranks, by design (pipeline/driver/job_estimate.c, retriever/estimate.c)
DESIGN_S = {"chunk": 0.0, "index": 0.5, "retrieve": 2 / 3, "targets-embeddings": 0.0, "targets-ids": 0.0}


def pct(x):
    return f"{100 * x:+.0f} %"


def mb(x):
    return f"{x / 1e6:,.1f}"


def series(rows, stage, np_, dim, key):
    pts = sorted((r["n"], r[key]) for r in rows if r["stage"] == stage and r["np"] == np_ and r["dim"] == dim)
    return [p[0] for p in pts], [p[1] for p in pts]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dfm")
    args = ap.parse_args()
    rows = load(args.jsonl)
    if not rows:
        sys.exit("growth_report: no measurements")
    stages = []
    for r in rows:
        if r["stage"] not in stages:
            stages.append(r["stage"])
    main_dim = 64 if any(r["dim"] == 64 and r["stage"] == "index" for r in rows) else rows[0]["dim"]
    md = []
    w = md.append
    w("# Cost growth (bench/retrieval/growth.sh)\n")
    w("Per-rank CPU time is the CPU-seconds (user + sys) of the slowest rank: on the shared, overloaded VM wall time")
    w("mostly measures the neighbours' load, so the fits and predictions use CPU time (a dedicated core per rank")
    w("would take about that long). Wall time is listed for completeness. RSS is each rank's peak resident set")
    w("(`/usr/bin/time`), the largest over ranks. Disk is the stage's output folder (`du -sb`).\n")
    w("## Measured points\n")
    w("| stage | n | np | d | wall s | CPU s (slowest rank) | CPU s (all ranks) | peak RSS/rank MB | disk MB | trainer read records/s | reader open s |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for st in stages:
        for r in sorted((r for r in rows if r["stage"] == st), key=lambda r: (r["dim"], r["np"], r["n"])):
            rd = f"{r['read_records_s']:,}" if "read_records_s" in r else ""
            op = f"{r['read_open_s']:.3f}" if "read_open_s" in r else ""
            w(f"| {st} | {r['n']:,} | {r['np']} | {r['dim']} | {r['wall_s']:.1f} | {r['cpu_max']:.2f} | {r['cpu_sum']:.2f} | "
              f"{r['rss_max'] / 1e6:.0f} | {mb(r['disk_bytes'])} | {rd} | {op} |")
    w("\nn is the stage's size: stream tokens for chunk (the GCIDE corpus concatenated 1, 4 and 16 times), chunks for")
    w(f"the others (synthetic, d = {main_dim}, plus one point at d = 384). chunk-before is the build before the chunk")
    w("stage streamed (it held a rank's whole share in memory).\n")

    # fits
    w("## Fits: cost = a * n^b\n")
    w("b from a least-squares line on log-log axes; 'rms' is the root-mean-square of the log residuals (0.10 = about")
    w("10 %). The linear and n log n columns fit one constant to the same points: the smaller rms says which shape")
    w("the points follow. 'held-out' fits the model used without the largest n and states its error there.\n")
    w("A power law with b < 1 on stages whose work is linear by design (chunk, write-targets) is a fixed start-up")
    w("(loading the tokenizer, opening shards) on top of linear work: those use the affine fit t0 + c n instead.\n")
    w("| stage | np | points | b (CPU) | rms | linear rms | n log n rms | affine t0 s, c s/item (rms) | model used | held-out error at largest n | b (RSS) | b (disk) |")
    w("|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|")
    fits = {}
    for st in stages:
        for np_ in sorted({r["np"] for r in rows if r["stage"] == st}):
            xs, ys = series(rows, st, np_, rows_dim(rows, st), "cpu_max")
            if len(xs) < 2:
                continue
            a, b, rms = fit_power(xs, ys)
            _, lin = fit_shape(xs, ys, lambda x: x)
            _, nln = fit_shape(xs, ys, lambda x: x * math.log(x))
            t0, c, arms = fit_affine(xs, ys)
            affine = b < 1 and t0 > 0
            held = ""
            if len(xs) >= 3:
                if affine:
                    h0, hc, _ = fit_affine(xs[:-1], ys[:-1])
                    held = pct((h0 + hc * xs[-1]) / ys[-1] - 1)
                else:
                    ha, hb, _ = fit_power(xs[:-1], ys[:-1])
                    held = pct(ha * xs[-1] ** hb / ys[-1] - 1)
            _, yr = series(rows, st, np_, rows_dim(rows, st), "rss_max")
            _, yd = series(rows, st, np_, rows_dim(rows, st), "disk_bytes")
            br = fit_power(xs, yr)[1]
            bd = fit_power(xs, yd)[1]
            fits[(st, np_)] = (t0, c, 1.0) if affine else (0.0, a, b)
            w(f"| {st} | {np_} | {len(xs)} | {b:.2f} | {rms:.3f} | {lin:.3f} | {nln:.3f} | {t0:.2f}, {c:.3g} ({arms:.3f}) | "
              f"{'affine' if affine else 'power'} | {held} | {br:.2f} | {bd:.2f} |")

    # rank scaling and dimension factors
    w("\n## Rank count and dimension\n")
    w("s: the part of the per-rank CPU time that does not shrink with more ranks (Amdahl: t(P) = t(1) * (s + (1 - s) / P)),")
    w("from np = 1 vs np = 2 at the same n: s = 2 t(2) / t(1) - 1, from the mean ratio over the sizes both have")
    w("(s = 0 is perfect scaling). These measured values are not usable: on 2 cores shared with")
    w("~10 other jobs, an MPI rank that waits for the other busy-polls and is billed CPU for it, and fixed start-up")
    w("costs dominate the small points. The prediction and `dfm estimate` use s by design instead (last column):")
    w("chunk and write-targets split their work evenly; index trains on rank 0; retrieve quantises every query on every")
    w("rank (nlist·d flops per query, against nprobe·(N/nlist)/P·d for the scan: 2/3 of the work at P = 1, nprobe 8).")
    w("e: d = 384 vs d = 64 at the same n and np = 1 costs (384/64)^e.\n")
    w("| stage | t(2)/t(1) per rank | s (raw) | sizes | e (d 64 → 384) | s by design |")
    w("|---|---:|---:|---|---:|---:|")
    gs, es = {}, {}
    for st in stages:
        d = rows_dim(rows, st)
        one = {r["n"]: r["cpu_max"] for r in rows if r["stage"] == st and r["np"] == 1 and r["dim"] == d}
        two = {r["n"]: r["cpu_max"] for r in rows if r["stage"] == st and r["np"] == 2 and r["dim"] == d}
        common = sorted(set(one) & set(two))
        ratio = sum(two[n] / one[n] for n in common) / len(common) if common else float("nan")
        g = 2 * ratio - 1
        gs[st] = DESIGN_S.get(st, float("nan"))
        big = {r["n"]: r["cpu_max"] for r in rows if r["stage"] == st and r["np"] == 1 and r["dim"] == 384}
        cn = sorted(set(big) & set(one)) if d != 384 else []
        e = sum(math.log(big[n] / one[n]) / math.log(384 / d) for n in cn) / len(cn) if cn else float("nan")
        es[st] = e
        w(f"| {st} | {ratio:.2f} | {g:.2f} | {', '.join(f'{n:,}' for n in common)} | {'' if math.isnan(e) else f'{e:.2f}'} | {gs[st]:.2f} |")

    # prediction
    w(f"\n## Prediction: {BIG_TOKENS:.0e} tokens ({BIG_CHUNKS / 1e6:.2f} M chunks of 32 tokens), d = {BIG_DIM}, {BIG_RANKS} ranks\n")
    w("Per-rank CPU time = t0 + a * n^b (np = 1 fit) * (s + (1 - s) / 64) * (384/64)^e, each from the tables above (e = 1,")
    w("linear in d, where no d = 384 point was measured; 0 for chunk); an extrapolation")
    w(f"of {BIG_CHUNKS / 1e6:.0f} M / 1 M = 156x in n and 32x in ranks from 2 measured rank counts, so read it as an")
    w("order of magnitude. Memory and disk per rank: `dfm estimate`'s formulas (checked against the measured points")
    w("below), not an extrapolation of RSS.\n")
    w("| stage | n | fit (t0, a, b) | s | e | predicted CPU s per rank | hours |")
    w("|---|---:|---|---:|---:|---:|---:|")
    total = 0.0
    for st in stages:
        if st.endswith("-before") or (st, 1) not in fits:
            continue
        t0, a, b = fits[(st, 1)]
        n = BIG_TOKENS if st.startswith("chunk") else BIG_CHUNKS
        g = gs.get(st, 0.0)
        g = 0.0 if math.isnan(g) else g
        e = es.get(st, 1.0)
        e = 0.0 if st.startswith("chunk") else 1.0 if math.isnan(e) else e
        t = t0 + a * n ** b * (g + (1 - g) / BIG_RANKS) * (BIG_DIM / main_dim) ** e
        if st != "targets-ids":
            total += t
        w(f"| {st} | {n:.3g} | {t0:.2f}, {a:.3g}, {b:.2f} | {g:.2f} | {e:.2f} | {t:,.0f} | {t / 3600:.1f} |")
    w(f"\nSum over chunk, index, retrieve, write-targets (embeddings): {total:,.0f} s = {total / 3600:.1f} h per rank,")
    w("without the encoder (not part of this benchmark).\n")

    # targets at scale
    emb = {(r["n"], r["np"]): r for r in rows if r["stage"] == "targets-embeddings" and r["dim"] == main_dim}
    ids = {(r["n"], r["np"]): r for r in rows if r["stage"] == "targets-ids" and r["dim"] == main_dim}
    if emb and ids:
        w("## Targets at scale: what a trainer pays for `--store ids`\n")
        w("Records/s through the C reader (`shard/target_reader.h`, `bench_targets read`: every record decoded to fp32,")
        w("ids mode filling each slot from the shard tables), one process, right after the run was written (warm page")
        w("cache). Disk: the targets folder.\n")
        w("| n | np | embeddings records/s | ids records/s | ids / embeddings | embeddings MB | ids MB | disk ratio | ids open s |")
        w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for key in sorted(set(emb) & set(ids)):
            e_, i_ = emb[key], ids[key]
            w(f"| {key[0]:,} | {key[1]} | {e_['read_records_s']:,} | {i_['read_records_s']:,} | {i_['read_records_s'] / e_['read_records_s']:.2f}x | "
              f"{mb(e_['disk_bytes'])} | {mb(i_['disk_bytes'])} | {e_['disk_bytes'] / i_['disk_bytes']:.1f}x | {i_['read_open_s']:.3f} |")
        w("")

    # dfm estimate against the points
    if args.dfm:
        w("## `dfm estimate` against the measured points\n")
        w("`dfm estimate --json --tokens 4n --chunk-len 4 --dim d --ranks np --index <the run's> --k 16` at each point.")
        w("Its time model's constants come from the np = 1 fits above (pipeline/driver/job_estimate.c says which points and its")
        w("held-out error); memory and disk are its formulas, with a per-stage base RSS taken from the smallest point.")
        w("Error = estimate / measured - 1. Time is against the slowest rank's CPU seconds; np = 2 times use s by")
        w("design, while the measured np = 2 CPU includes busy polling.\n")
        w("| stage | n | np | d | memory est MB | RSS MB | error | disk est MB | disk MB | error | time est s | CPU s | error |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        errs = defaultdict(list)
        name = {"index": "index", "retrieve": "retrieve", "targets-embeddings": "targets", "chunk": "chunk"}
        for r in sorted(rows, key=lambda r: (r["stage"], r["dim"], r["np"], r["n"])):
            if r["stage"] not in name:
                continue
            if r["stage"] == "chunk":
                cmd = [args.dfm, "estimate", "x.json", "--json", "--tokens", str(r["n"]), "--chunk-len", "32", "--ranks", str(r["np"]),
                       "--dim", "384", "--k", "16"]
            else:
                cmd = [args.dfm, "estimate", "x.json", "--json", "--tokens", str(4 * r["n"]), "--chunk-len", "4", "--ranks", str(r["np"]),
                       "--dim", str(r["dim"]), "--k", "16", "--index", r.get("factory", "auto")]
            try:
                est = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            except (subprocess.CalledProcessError, json.JSONDecodeError) as ex:
                w(f"| {r['stage']} | {r['n']:,} | {r['np']} | {r['dim']} | estimate failed: {ex} |||||||||")
                continue
            s = next(x for x in est["stages"] if x["stage"] == name[r["stage"]])
            em, ed, et = s["memory_per_rank_bytes"] / r["rss_max"] - 1, s["disk_bytes"] / max(r["disk_bytes"], 1) - 1, s["seconds"] / r["cpu_max"] - 1
            for k_, v in (("memory", em), ("disk", ed), ("time", et)):
                errs[(name[r["stage"]], r["np"], k_)].append(abs(v))
            w(f"| {r['stage']} | {r['n']:,} | {r['np']} | {r['dim']} | {mb(s['memory_per_rank_bytes'])} | {mb(r['rss_max'])} | {pct(em)} | "
              f"{mb(s['disk_bytes'])} | {mb(r['disk_bytes'])} | {pct(ed)} | {s['seconds']:.1f} | {r['cpu_max']:.1f} | {pct(et)} |")
        w("\n| stage | np | points | worst memory error | worst disk error | worst time error |")
        w("|---|---:|---:|---:|---:|---:|")
        for st in ("chunk", "index", "retrieve", "targets"):
            for np_ in (1, 2):
                if (st, np_, "memory") in errs:
                    e_ = lambda k_: f"{100 * max(errs[(st, np_, k_)]):.0f} %"
                    w(f"| {st} | {np_} | {len(errs[(st, np_, 'memory')])} | {e_('memory')} | {e_('disk')} | {e_('time')} |")
        w("")
    if args.dfm:
        w("## Target store by corpus size (`dfm estimate`, K = 16, d = 384, fp16, training nodes of 256 GB)\n")
        w("| tokens | chunks | --store embeddings | --store ids | ids tables | recommended |")
        w("|---:|---:|---:|---:|---:|---|")
        for t in (1e7, 1e8, 1e9, 5e9, 2e10, 1e11):
            cmd = [args.dfm, "estimate", "x.json", "--json", "--tokens", str(int(t)), "--ranks", "64", "--dim", "384", "--k", "16",
                   "--node-memory", "256G", "--index-memory", "1024G"]
            try:
                e = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["target_store"]
            except (subprocess.CalledProcessError, json.JSONDecodeError) as ex:
                w(f"| {t:.0e} | estimate failed: {ex} |||||")
                continue
            w(f"| {t:.0e} | {t / 32:,.0f} | {e['embeddings_bytes'] / 1e9:,.1f} GB | {e['ids_bytes'] / 1e9:,.1f} GB | "
              f"{e['ids_table_bytes'] / 1e9:,.1f} GB | {e['recommend']} |")
        big = [args.dfm, "estimate", "x.json", "--tokens", str(int(BIG_TOKENS)), "--ranks", str(BIG_RANKS), "--dim", str(BIG_DIM),
               "--node-memory", "256G"]
        w(f"\n`{' '.join(['dfm'] + big[1:])}`:\n")
        w("```")
        w(subprocess.run(big, capture_output=True, text=True).stdout.rstrip())
        w("```\n")
    w("Chart: `growth.svg` (per-rank CPU seconds and peak RSS against n, log-log; np = 1 solid, np = 2 dashed).")
    with open(f"{args.out}/growth.md", "w") as f:
        f.write("\n".join(md) + "\n")
    svg(rows, stages, f"{args.out}/growth.svg")
    print("\n".join(md))


def rows_dim(rows, st):
    ds = sorted({r["dim"] for r in rows if r["stage"] == st})
    return 64 if 64 in ds else ds[0]


COLORS = {"chunk": "#1b9e77", "chunk-before": "#a6761d", "index": "#d95f02", "retrieve": "#7570b3",
          "targets-embeddings": "#e7298a", "targets-ids": "#66a61e"}


def svg(rows, stages, path):
    """two log-log panels: per-rank CPU s vs n, peak RSS per rank vs n"""
    W, H, M = 980, 430, 60
    pw = (W - 3 * M) / 2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    for panel, (key, title, unit) in enumerate((("cpu_max", "CPU seconds of the slowest rank", 1.0),
                                                 ("rss_max", "peak RSS per rank (MB)", 1e6))):
        x0, y0, ph = M + panel * (pw + M), 40, H - 110
        pts = [(r["n"], r[key] / unit) for r in rows if r["dim"] == rows_dim(rows, r["stage"])]
        lx = [math.log10(p[0]) for p in pts]
        ly = [math.log10(max(p[1], 1e-3)) for p in pts]
        xmin, xmax = math.floor(min(lx)), math.ceil(max(lx))
        ymin, ymax = math.floor(min(ly)), math.ceil(max(ly))
        X = lambda v: x0 + (math.log10(v) - xmin) / (xmax - xmin) * pw
        Y = lambda v: y0 + ph - (math.log10(max(v, 1e-3)) - ymin) / (ymax - ymin) * ph
        out.append(f'<text x="{x0 + pw / 2}" y="{y0 - 12}" text-anchor="middle" font-size="13">{title}</text>')
        out.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
        for e in range(xmin, xmax + 1):
            xx = x0 + (e - xmin) / (xmax - xmin) * pw
            out.append(f'<line x1="{xx}" y1="{y0}" x2="{xx}" y2="{y0 + ph}" stroke="#ddd"/>')
            out.append(f'<text x="{xx}" y="{y0 + ph + 15}" text-anchor="middle">1e{e}</text>')
        for e in range(ymin, ymax + 1):
            yy = y0 + ph - (e - ymin) / (ymax - ymin) * ph
            out.append(f'<line x1="{x0}" y1="{yy}" x2="{x0 + pw}" y2="{yy}" stroke="#ddd"/>')
            out.append(f'<text x="{x0 - 5}" y="{yy + 4}" text-anchor="end">{10.0 ** e:g}</text>')
        out.append(f'<text x="{x0 + pw / 2}" y="{y0 + ph + 32}" text-anchor="middle">n (tokens for chunk, chunks for the others)</text>')
        for st in stages:
            for np_ in (1, 2):
                xs, ys = series(rows, st, np_, rows_dim(rows, st), key)
                if not xs:
                    continue
                c = COLORS.get(st, "#333")
                d = " ".join(f"{X(x):.1f},{Y(y / unit):.1f}" for x, y in zip(xs, ys))
                dash = ' stroke-dasharray="5,3"' if np_ == 2 else ""
                out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
                for x, y in zip(xs, ys):
                    out.append(f'<circle cx="{X(x):.1f}" cy="{Y(y / unit):.1f}" r="3" fill="{c}"/>')
    lx = M
    for st in stages:
        out.append(f'<rect x="{lx}" y="{H - 28}" width="12" height="12" fill="{COLORS.get(st, "#333")}"/>')
        out.append(f'<text x="{lx + 16}" y="{H - 18}">{st}</text>')
        lx += 30 + 7 * len(st)
    out.append(f'<text x="{lx + 10}" y="{H - 18}">solid: np = 1, dashed: np = 2</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
