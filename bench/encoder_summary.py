"""encoder_summary.py — turn bench/bench_encoder_cpu.sh's raw rows into its Markdown table and its result file
bench/results/encoder.json (the convention in bench/README.md). Standard library only.

Input files (whitespace-separated):
  --runs     T side round wall_s cpu_s batch gflop blas one line per timed run (gflop, blas: dfm only)
  --agree    T pair rows=R max_abs_err=E min_cos=C      one line per compared pair
  --versions "st: ..." / "ort: ..." lines               the peers' own version strings
"""
import argparse
import json
import statistics
import sys
import time

NAMES = {"st": "sentence-transformers (PyTorch)", "ort": "ONNX Runtime, fused graph"}
AGREE_TOL = 1e-5  # max abs error against a peer that counts as agreement (issue 18's goal against st)
SANE_COS = 0.9999  # below this the outputs are wrong, not merely rounded differently: the run fails


def mmm(xs):
    return min(xs), statistics.median(xs), max(xs)


def main():
    ap = argparse.ArgumentParser()
    for f in ("runs", "agree", "versions", "dfm-rev", "export", "md", "json", "cpu"):
        ap.add_argument("--" + f, required=f not in ("export",))
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    a = ap.parse_args()

    runs = {}  # (T, side) -> {round: (wall, cpu, batch, gflop)}
    for l in open(a.runs):
        t, side, r, wall, cpu, batch, gf, blas = l.split()
        runs.setdefault((int(t), side), {})[int(r)] = (float(wall), float(cpu), batch, float(gf), blas)
    agree = {}
    for l in open(a.agree):
        t, pair, *kv = l.split()
        d = dict(x.split("=") for x in kv)
        agree[(int(t), pair)] = {"max_abs_err": float(d["max_abs_err"]), "min_cos": float(d["min_cos"])}
    versions = dict(l.rstrip("\n").split(": ", 1) for l in open(a.versions) if ": " in l)
    export = open(a.export).read().strip() if a.export else ""

    threads = sorted({t for t, _ in runs})
    peers = [p for p in ("st", "ort") if any((t, p) in runs for t in threads)]
    rows, md = [], []
    md.append(f"Encoder, all-MiniLM-L6-v2 fp32 on the CPU: {a.n} real chunk texts per timed pass, "
              f"{a.rounds} interleaved rounds per thread count, {time.strftime('%Y-%m-%d', time.gmtime())}, {a.cpu}.")
    md.append("CPU-s = process CPU time of one timed encode of all texts (all threads, tokenisation included, "
              "model loading excluded); min / median / max over rounds. dfm/peer = peer CPU-s / dfm CPU-s of the "
              "same round (above 1: dfm faster), min / median / max.")
    md.append("")
    md.append("| threads | side | batch | CPU-s min / med / max | wall s min / med / max | texts per CPU-s (med) "
              "| dfm/peer per CPU-s | dfm/peer wall | max abs err vs dfm | min cosine vs dfm |")
    md.append("|---|---|---|---|---|---|---|---|---|---|")
    bad = []
    for t in threads:
        d = runs[(t, "dfm")]
        dc, dw = [v[1] for v in d.values()], [v[0] for v in d.values()]
        gf = statistics.median(v[3] for v in d.values())
        gfs = gf / statistics.median(dc) if gf else 0
        note = f", {gfs:.1f} GFLOP per CPU-s" if gf else ""
        md.append(f"| {t} | dfm (C API{note}) | {d[min(d)][2]} | {'%.2f / %.2f / %.2f' % mmm(dc)} | "
                  f"{'%.2f / %.2f / %.2f' % mmm(dw)} | {a.n / statistics.median(dc):.1f} | | | | |")
        for p in peers:
            q = runs.get((t, p))
            if not q:
                continue
            common = sorted(set(q) & set(d))
            pc, pw = [q[r][1] for r in common], [q[r][0] for r in common]
            rc = [q[r][1] / d[r][1] for r in common]
            rw = [q[r][0] / d[r][0] for r in common]
            ag = agree.get((t, f"dfm-vs-{p}"), {})
            md.append(f"| {t} | {NAMES[p]} | {q[common[0]][2]} | {'%.2f / %.2f / %.2f' % mmm(pc)} | "
                      f"{'%.2f / %.2f / %.2f' % mmm(pw)} | {a.n / statistics.median(pc):.1f} | "
                      f"{'%.2f / **%.2f** / %.2f' % mmm(rc)} | {'%.2f / %.2f / %.2f' % mmm(rw)} | "
                      f"{ag.get('max_abs_err', float('nan')):.2g} | {ag.get('min_cos', float('nan')):.9f} |")
            if ag and ag["min_cos"] < SANE_COS:
                bad.append(f"dfm vs {p} at {t} threads: min cosine {ag['min_cos']}")
            rows.append({
                "stage": "encoder", "peer": NAMES[p], "peer_version": versions.get(p, "?"), "threads": t,
                "batch": int(q[common[0]][2]), "unit": f"CPU-seconds to encode {a.n} texts",
                "setting": f"MiniLM fp32, peer batch {q[common[0]][2]}, dfm batch {d[min(d)][2]}",
                "case": f"MiniLM fp32, {a.n} texts, {t} thread(s)",  # what the peers are compared on
                "dfm_cpu_s": round(statistics.median([d[r][1] for r in common]), 4),
                "peer_cpu_s": round(statistics.median(pc), 4),
                "ratio": round(statistics.median(rc), 4),
                "ratio_min_max": [round(min(rc), 4), round(max(rc), 4)],
                "dfm_wall_s": round(statistics.median([d[r][0] for r in common]), 4),
                "peer_wall_s": round(statistics.median(pw), 4),
                "rounds": len(common),
                "agree": {**ag, "tol": AGREE_TOL, "ok": bool(ag) and ag["max_abs_err"] <= AGREE_TOL},
            })
    md.append("")
    for (t, pair), ag in sorted(agree.items()):
        if pair == "ort-vs-st":
            md.append(f"- ONNX Runtime vs sentence-transformers at {t} thread(s): max abs error "
                      f"{ag['max_abs_err']:.2g}, min cosine {ag['min_cos']:.9f}.")
    blas = sorted({v[4] for (t, side), q in runs.items() if side == "dfm" for v in q.values()})
    md.append(f"- dfm: commit {a.dfm_rev}; OpenBLAS's kernel set in its process: {', '.join(blas)} "
              "(corrected on CPUs OpenBLAS does not know, as dfm-train does: common/blas_core.h).")
    for p in peers:
        md.append(f"- {p}: {versions.get(p, '?')}")
    if export:
        md.append(f"- ONNX export: {export}")
    md.append("- Command: `bash bench/bench_encoder_cpu.sh` (peers from `bash bench/peers.sh`).")
    open(a.md, "w").write("\n".join(md) + "\n")

    # headline: the strongest peer measured (the lowest dfm/peer) at the fewest threads
    first = [r for r in rows if r["threads"] == min(r["threads"] for r in rows)]
    head = min(first, key=lambda r: r["ratio"]) if first else None
    if head is None:
        print("encoder_summary: no peer rows", file=sys.stderr)
        return 1
    res = dict(head)
    res["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res["dfm_version"] = a.dfm_rev
    res["rows"] = rows
    json.dump(res, open(a.json, "w"), indent=1)
    if bad:
        print("encoder outputs disagree: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
