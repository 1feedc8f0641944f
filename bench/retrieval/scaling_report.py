#!/usr/bin/env python3
"""scaling_report.py — the tables, the per-rank work model and the 5e9-token prediction of bench/retrieval/scaling.sh.

    python3 bench/retrieval/scaling_report.py --out bench/results bench/results/scaling.jsonl [MORE.jsonl ...]

Reads the JSON lines scaling.sh wrote (one per side, stage and point; several files are read as one, e.g.
bench/results/scaling-d384.jsonl and bench/results/large_point.jsonl from bench/retrieval/large_point_jsonl.py)
and writes OUT/scaling.md and OUT/scaling_fit.json:

  1. wall and CPU seconds per point, this tree against OLD (the dfm before index and retrieve shrank with
     ranks), and how they shrink from np = 1;
  2. the work counts: totals against np = 1 and the largest rank's share of total / P;
  3. the model dfm estimate uses (retriever/estimate.c): a rank's CPU seconds outside MPI as a sum of
     rates times its work in units that do not depend on the machine (below), the rates fitted by
     non-negative least squares on relative error over every rank of every point; its error on every
     point (slowest rank), in-sample and with the largest size held out;
  4. the prediction for 5e9 tokens (156.25 M chunks of 32 tokens, d = 384) on 64 ranks, stage by stage.

The coarse assignment (FAISS's flat quantiser search, once per query in retrieve and once per vector in
index) is not fitted on the points: its cost per distance depends on the number of lists and the
dimension far beyond what the small points reach. bench/retrieval/bench_coarse.c measures it alone at the points'
sizes and at the big job's (50,000 lists, d = 384); its model, CPU s = distances x (a d + b) (a per
multiply-add in the SGEMM, b per distance for the heaps), is fitted on those measurements (add: 1
list per vector; search: nprobe lists per query), and the other rates are fitted on what is left.

Units of a rank's work (its "work" record in the manifest; d the dimension, M the PQ's sub-quantisers):
  index:    kmeans_flops; coarse_distances x d (assigning the added vectors, SGEMM); vectors_added x
            encode (PQ: 256 d, the nearest of 256 sub-centroids per sub-space; Flat: d); 1 (start-up)
  retrieve: coarse_distances x d (SGEMM); codes_scanned x (PQ: M look-ups; Flat: d); shard_searches x
            table (PQ: 256 d + nprobe d, FAISS's per-query look-up table and per-list inner products;
            Flat: nprobe d); exact_scores x d (dfm's double-precision rescoring); shard_searches (the fixed
            cost of a query's visit to a shard: heaps, filtering, sorting); queries (the owner's: query,
            merge, exclusions, writing)
"""
import argparse
import json
import math
import os
import sys
from collections import defaultdict

import numpy as np

BIG_TOKENS, BIG_CHUNKS, BIG_RANKS, BIG_DIM = 5e9, 5e9 / 32, 64, 384


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                r.setdefault("margin", 16)  # rows before scaling.sh's MARGINS: the default margin
                if r.get("ranks"):  # not the coarse-assignment rows
                    r["cpu"] = [u + s for _, u, s, _ in r["ranks"]]
                    r["cpu_max"] = max(r["cpu"])
                    r["cpu_sum"] = sum(r["cpu"])
                    r["rss_max"] = max(m for *_, m in r["ranks"]) * 1024.0
                elif "ranks" in r:  # timed as one mpirun (large_point_jsonl.py): no rank's own CPU seconds
                    r["cpu_max"] = float("nan")
                    r["cpu_sum"] = r.get("cpu_all_ranks", float("nan"))
                    r["rss_max"] = r.get("rss_max_kb", float("nan")) * 1024.0
                rows.append(r)
    return rows


def pq_m(factory):
    """M of an IVFn,PQMnp factory, or 0 for Flat"""
    for part in factory.split(","):
        if part.startswith("PQ"):
            return int("".join(c for c in part[2:] if c.isdigit()))
    return 0


# ---- the model ----

INDEX_TERMS = ["kmeans_flops", "sample", "train_start", "assign", "encode", "add_start"]
RETRIEVE_TERMS = ["coarse", "scan", "tables", "exact", "visits", "queries"]
# the index's two phases are fitted apart (work record: train_cpu_s, add_cpu_s): their units grow together
INDEX_PHASES = {"train_cpu_s": [0, 1, 2], "add_cpu_s": [3, 4, 5]}


def index_units(w, d, M):
    enc = 256 * d if M else d
    return [w["kmeans_flops"], w["train_points"] * d, 1.0, w["coarse_distances"] * d, w["vectors_added"] * enc, 1.0]


def retrieve_units(w, d, M, nprobe):
    table = (256 * d + nprobe * d) if M else nprobe * d
    return [w["coarse_distances"] * d, w["codes_scanned"] * (M if M else d), w["shard_searches"] * table, w["exact_scores"] * d,
            w["shard_searches"], w["queries"]]


def units(stage, w, row):
    M = pq_m(row["factory"])
    return index_units(w, row["dim"], M) if stage == "index" else retrieve_units(w, row["dim"], M, row["nprobe"])


def nnls(A, b):
    """min |Ax - b| with x >= 0 (Lawson-Hanson)"""
    m, n = A.shape
    P, x = [], np.zeros(n)
    w = A.T @ (b - A @ x)
    for _ in range(3 * n + 10):
        Z = [j for j in range(n) if j not in P]
        if not Z or max(w[j] for j in Z) <= 1e-12 * max(1.0, abs(w).max()):
            break
        P.append(max(Z, key=lambda j: w[j]))
        while True:
            z = np.zeros(n)
            z[P] = np.linalg.lstsq(A[:, P], b, rcond=None)[0]
            if all(z[j] > 0 for j in P):
                x = z
                break
            alpha = min(x[j] / (x[j] - z[j]) for j in P if z[j] <= 0)
            x = x + alpha * (z - x)
            P = [j for j in P if x[j] > 1e-15]
        w = A.T @ (b - A @ x)
    return x


def coarse_fit(rows, add):
    """(a, b) of CPU s = n x nlist x (a d + b), from bench_coarse's rows (nprobe 1: add; else search)"""
    pts = [r for r in rows if (r["nprobe"] == 1) == add]
    return fit([([r["nq"] * r["nlist"] * r["dim"], r["nq"] * r["nlist"]], r["cpu_s"]) for r in pts]) if pts else np.zeros(2)


def coarse_seconds(ab, distances, d):
    return distances * (ab[0] * d + ab[1])


def fit(samples):
    """rates minimising the relative error of every rank's CPU seconds; samples: (units, cpu_s)"""
    U = np.array([u for u, _ in samples], float)
    y = np.array([c for _, c in samples], float)
    scale = U.max(axis=0)
    scale[scale == 0] = 1
    A = (U / scale) / y[:, None]  # relative: (pred - y) / y
    x = nnls(A, np.ones(len(y)))
    return x / scale


def predict(rates, u):
    return float(np.dot(rates, u))


# ---- the 5e9-token job: each rank's counts, as retriever/estimate.c computes them ----

def big_counts(N, P, d, nlist, nprobe, M, k, margin, train_n):
    ksub, cap = 256, k + margin
    km = 10 * (train_n / P) * nlist * 2 * d
    if M:
        n_pq = min(train_n, 256 * ksub)
        km += 25 * (n_pq / P) * ksub * 2 * d + (n_pq / P) * nlist * 2 * d
    idx = {"kmeans_flops": km, "train_points": train_n / P, "coarse_distances": N / P * nlist, "vectors_added": N / P}
    # a query visits the ranks holding its nprobe lists: N / P queries x P (1 - (1 - 1/P)^nprobe) ranks each
    visits = N * (1 - (1 - 1 / P) ** nprobe)
    ret = {"coarse_distances": N / P * nlist, "codes_scanned": N * nprobe * (N / nlist) / P, "shard_searches": visits,
           "exact_scores": (N / P if M else visits) * cap, "queries": N / P}  # PQ: rescored once, at the owner
    return idx, ret


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dfm", help="build/dfm: also state `dfm estimate`'s error at every measured point")
    ap.add_argument("--c-defines", action="store_true", help="also print the rates as retriever/estimate.c's #define lines")
    ap.add_argument("jsonl", nargs="+")
    a = ap.parse_args()
    rows = [r for path in a.jsonl for r in load(path)]
    md = ["# Index and retrieve as ranks grow: bench/retrieval/scaling.sh", ""]
    new = [r for r in rows if r["side"] == "new" and r["stage"] in ("index", "retrieve")]
    old = {(r["stage"], r["n"], r["dim"], r["factory"], r["np"]): r for r in rows if r["side"] == "old" and r["stage"] in ("index", "retrieve")}

    # 1. times
    md += ["## Wall and CPU seconds", "",
           "CPU: user + system seconds of the slowest rank (/usr/bin/time); outside MPI: the slowest rank's CPU seconds minus those "
           "inside MPI calls (its work record). old: the dfm before this change, in the same round. ×np1: the slowest rank's CPU "
           "outside MPI at np = 1 over this one (ideal: np). A CPU s of - : the point was timed as one mpirun, not rank by rank "
           "(bench/retrieval/large_point_jsonl.py).", "",
           "| stage | n | d | index | margin | np | wall s | CPU s (slowest) | outside MPI | ×np1 | old wall s | old CPU s (slowest) | old CPU / new CPU |",
           "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = {}
    for r in sorted(new, key=lambda r: (r["stage"], r["dim"], r["n"], r["factory"], r["margin"], r["np"])):
        key = (r["stage"], r["n"], r["dim"], r["factory"], r["margin"])
        out = max(x["cpu_s"] for x in r["work"]["ranks"])
        if r["np"] == 1:
            base[key] = out
        o = old.get(key[:4] + (r["np"],)) if r["margin"] == 16 else None
        sp = f"{base[key] / out:.2f}" if key in base and out > 0 else ""
        cm = f"{r['cpu_max']:.1f}" if r["cpu_max"] == r["cpu_max"] else "-"
        md.append(f"| {r['stage']} | {r['n']:,} | {r['dim']} | {r['factory']} | {r['margin']} | {r['np']} | {r['wall_s']:.1f} | {cm} | {out:.1f} | {sp} | "
                  + (f"{o['wall_s']:.1f} | {o['cpu_max']:.1f} | {o['cpu_max'] / r['cpu_max']:.2f} |" if o else " | | |"))
    agree = [r for r in rows if r["side"] == "old-on-new"]
    md += ["", f"Outputs agree: the old retrieve on this tree's index wrote byte-identical neighbour blocks in "
           f"{sum(r['agree'] for r in agree)} of {len(agree)} checks."]

    # 2. counts
    md += ["", "## Work counts", "", "Total over ranks / np = 1's total, and the largest rank's count / (total / P).", "",
           "| stage | n | d | index | count | " + " | ".join(f"np={p}" for p in sorted({r['np'] for r in new})) + " |",
           "|---|---:|---:|---|---|" + "---|" * len({r['np'] for r in new})]
    keys = {"index": ["kmeans_distances", "coarse_distances", "vectors_added"], "retrieve": ["coarse_distances", "codes_scanned", "queries",
                                                                                           "shard_searches", "exact_scores", "bytes_sent"]}
    groups = defaultdict(dict)
    for r in new:
        if r["margin"] != 16:  # the counts as ranks grow, at the default margin
            continue
        groups[(r["stage"], r["n"], r["dim"], r["factory"])][r["np"]] = r
    for (stage, n, d, fac), byp in sorted(groups.items()):
        if 1 not in byp:
            continue
        for k in keys[stage]:
            t1 = byp[1]["work"]["total"][k]
            cells = []
            for p in sorted(byp):
                w = byp[p]["work"]
                tot, top = w["total"][k], w["max_rank"][k]
                cells.append(f"{tot / t1:.2f} / {top / (tot / p):.2f}" if t1 and tot else "-")
            md.append(f"| {stage} | {n:,} | {d} | {fac} | {k} | " + " | ".join(cells) + " |")

    # 3. the model
    fits, err_lines, held_rows, held_rates = {}, [], [], {}
    md += ["", "## The per-rank model", ""]
    crow = [r for r in rows if r["side"] == "coarse"]
    if crow:
        md += ["### The coarse assignment alone (bench/retrieval/bench_coarse.c)", "", "| lists | d | queries | nprobe | CPU s | s per distance x d |",
               "|---:|---:|---:|---:|---:|---:|"] + [f"| {r['nlist']:,} | {r['dim']} | {r['nq']:,} | {r['nprobe']} | {r['cpu_s']:.3f} | {r['s_per_unit']:.2e} |"
                                                    for r in crow] + [""]
    coarse_rows = [r for r in rows if r["side"] == "coarse"]
    ab = {"index": coarse_fit(coarse_rows, True), "retrieve": coarse_fit(coarse_rows, False)}
    fixed = {"index": INDEX_TERMS.index("assign"), "retrieve": RETRIEVE_TERMS.index("coarse")}

    def coarse_part(stage, w, r):
        return coarse_seconds(ab[stage], w["coarse_distances"], r["dim"])

    def fit_stage(stage, pts):
        """rates of every term but the coarse assignment's (measured apart): the index's phases apart,
        retrieve's rounds (search_cpu_s); the coarse seconds are taken off the measured ones first"""
        n = len(INDEX_TERMS if stage == "index" else RETRIEVE_TERMS)
        phases = INDEX_PHASES if stage == "index" else {"search_cpu_s": list(range(n))}
        rates = np.zeros(n)
        for ph, cols in phases.items():
            cols = [c for c in cols if c != fixed[stage]]
            take_coarse = fixed[stage] in (INDEX_PHASES[ph] if stage == "index" else range(n))
            smp = [([units(stage, w, r)[c] for c in cols], w[ph] - (coarse_part(stage, w, r) if take_coarse else 0))
                   for r in pts for w in r["work"]["ranks"] if w[ph] > 0.02]
            smp = [(u, y) for u, y in smp if y > 0.01]
            rates[cols] = fit(smp) if smp else float("nan")
        return rates

    def model(stage, rates, w, r):
        u = units(stage, w, r)
        return sum(rates[i] * u[i] for i in range(len(u)) if i != fixed[stage]) + coarse_part(stage, w, r)

    def measured(stage, w):
        return sum(w[ph] for ph in (INDEX_PHASES if stage == "index" else {"search_cpu_s": 0}))

    for stage, terms in (("index", INDEX_TERMS), ("retrieve", RETRIEVE_TERMS)):
        pts = [r for r in new if r["stage"] == stage]
        rates = fit_stage(stage, pts)
        fits[stage] = dict(zip(terms, rates.tolist()))
        biggest = max(r["n"] for r in pts)
        rest = [r for r in pts if r["n"] != biggest]
        held = fit_stage(stage, rest) if rest else rates * float("nan")  # one size only: nothing to hold out
        held_rates[stage] = dict(zip(terms, held.tolist()))
        fits[stage]["coarse_a"], fits[stage]["coarse_b"] = float(ab[stage][0]), float(ab[stage][1])
        md += [f"### {stage}", "", "| term | rate (s per unit) |", "|---|---:|"] + [f"| {t} | {v:.3e} |" for t, v in fits[stage].items()
                                                                                  if t not in (INDEX_TERMS[fixed["index"]] if stage == "index" else "coarse",)]
        md += ["", "| n | d | index | margin | np | measured s (slowest rank: " + ("training + adding" if stage == "index" else "the rounds")
               + ", outside MPI) | model | error | model fitted without n = "
               f"{biggest:,} | error |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        errs, herrs = [], []
        for r in sorted(pts, key=lambda r: (r["dim"], r["n"], r["factory"], r["margin"], r["np"])):
            slow = max(r["work"]["ranks"], key=lambda w: measured(stage, w))
            y = measured(stage, slow)
            pm, ph = model(stage, rates, slow, r), model(stage, held, slow, r)
            e, he = pm / y - 1, ph / y - 1
            errs.append(e)
            if r["n"] == biggest:
                herrs.append(he)
                held_rows.append({"stage": stage, "n": r["n"], "dim": r["dim"], "factory": r["factory"], "margin": r["margin"], "np": r["np"], "measured_s": y,
                                  "model_s": pm, "model_without_s": ph})
            md.append(f"| {r['n']:,} | {r['dim']} | {r['factory']} | {r['margin']} | {r['np']} | {y:.2f} | {pm:.2f} | {e:+.0%} | {ph:.2f} | {he:+.0%} |")
        err_lines.append(f"{stage}: in-sample error {min(errs):+.0%} to {max(errs):+.0%} (median |e| {np.median(np.abs(errs)):.0%}); "
                         f"n = {biggest:,} held out: {min(herrs):+.0%} to {max(herrs):+.0%}")
        md.append("")
    md += err_lines

    # 3b. dfm estimate itself (its counts are formulas, its rates those committed in retriever/estimate.c)
    if a.dfm:
        import subprocess, tempfile
        cfg = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        cfg.write('{"run": "/nonexistent-dfm-run"}')
        cfg.close()
        md += ["", "## `dfm estimate` against the measured points", "",
               "`dfm estimate CONFIG --tokens 4N --chunk-len 4 --dim d --index F --nprobe (the point's) --ranks np --json` (retrieve_mkrun's "
               "chunks are 4 tokens): its index and retrieve seconds against the slowest rank's measured CPU seconds (the phases "
               "the model covers). Its counts are formulas (every chunk a vector and a query: the synthetic runs have about 6 % "
               "fewer queries), its rates those committed in retriever/estimate.c.", "",
               "| n | d | index | margin | np | index measured / estimated s | error | retrieve measured / estimated s | error |",
               "|---:|---:|---|---:|---:|---|---:|---|---:|"]
        errs = {"index": [], "retrieve": []}
        byk = defaultdict(dict)
        for r in new:  # each retrieve (one a margin) with its index, which every margin shares
            byk[(r["n"], r["dim"], r["factory"], r["np"])][r["stage"] if r["stage"] == "index" else r["margin"]] = r
        for (n, d, fac, p), st in sorted(byk.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2], kv[0][3])):
            for mg in sorted(k for k in st if k != "index"):
                if "index" not in st:
                    continue
                ret = st[mg]
                out = subprocess.run([a.dfm, "estimate", cfg.name, "--tokens", str(4 * n), "--chunk-len", "4", "--dim", str(d), "--index",
                                      fac, "--nprobe", str(ret["nprobe"]), "--k", str(ret["k"]), "--margin", str(mg), "--ranks", str(p),
                                      "--json"], capture_output=True, text=True, check=True).stdout
                e = {x["stage"]: x["seconds"] for x in json.loads(out)["stages"]}
                cells = []
                for stage, r in (("index", st["index"]), ("retrieve", ret)):
                    y = max(measured(stage, w) for w in r["work"]["ranks"])
                    if stage == "retrieve" or mg == min(k for k in st if k != "index"):  # an index once
                        errs[stage].append(e[stage] / y - 1)
                    cells.append(f"{y:.2f} / {e[stage]:.2f} | {e[stage] / y - 1:+.0%}")
                md.append(f"| {n:,} | {d} | {fac} | {mg} | {p} | " + " | ".join(cells) + " |")
        for stage, v in errs.items():
            if v:
                err_lines.append(f"dfm estimate, {stage}: {min(v):+.0%} to {max(v):+.0%} (median |e| {np.median(np.abs(v)):.0%}) over {len(v)} points")
        md += ["", err_lines[-2] if len(err_lines) > 1 else "", err_lines[-1]]

    # 4. the 5e9-token job
    N, P, d = BIG_CHUNKS, BIG_RANKS, BIG_DIM
    nlist = round(4 * math.sqrt(N))
    md += ["", f"## Prediction: {BIG_TOKENS:.0e} tokens ({N / 1e6:.2f} M chunks), d = {d}, {P} ranks", "",
           f"nlist = 4 sqrt N = {nlist:,}; training sample 100 per list; K = 16; one core per rank. Counts per rank as "
           "retriever/estimate.c computes them, times the rates above.", "",
           "| index | nprobe | margin | stage | " + " | ".join(INDEX_TERMS + RETRIEVE_TERMS) + " | hours per rank |",
           "|---|---:|---:|---|" + "---:|" * (len(INDEX_TERMS) + len(RETRIEVE_TERMS) + 1)]
    pred = {}
    # margin 64: what recall@16 >= 0.95 took at the large point (bench/results/large_point.md)
    for M, nprobe, margin in ((32, 16, 16), (32, 16, 64), (32, 32, 16), (48, 32, 16), (0, 16, 16)):
        fac = f"IVF{nlist},PQ{M}np" if M else f"IVF{nlist},Flat"
        ic, rc = big_counts(N, P, d, nlist, nprobe, M, 16, margin, 100 * nlist)
        iu = index_units(ic, d, M)
        ru = retrieve_units(rc, d, M, nprobe)
        ti = [fits["index"][t] * v for t, v in zip(INDEX_TERMS, iu)]
        tr = [fits["retrieve"][t] * v for t, v in zip(RETRIEVE_TERMS, ru)]
        ti[fixed["index"]] = coarse_seconds(ab["index"], ic["coarse_distances"], d)
        tr[fixed["retrieve"]] = coarse_seconds(ab["retrieve"], rc["coarse_distances"], d)
        pred[f"{fac} nprobe {nprobe} margin {margin}"] = {"index_s": sum(ti), "retrieve_s": sum(tr), "index_terms_s": dict(zip(INDEX_TERMS, ti)),
                                          "retrieve_terms_s": dict(zip(RETRIEVE_TERMS, tr))}
        md.append(f"| {fac} | {nprobe} | {margin} | index | " + " | ".join(f"{v / 3600:.2f}" for v in ti) + " |" + " |" * len(RETRIEVE_TERMS)
                  + f" {sum(ti) / 3600:.2f} |")
        md.append(f"| | | | retrieve |" + " |" * len(INDEX_TERMS) + " " + " | ".join(f"{v / 3600:.2f}" for v in tr) + f" | {sum(tr) / 3600:.2f} |")
    poly = [r for r in rows if r["stage"] == "index-poly"]
    if poly:
        md += ["", "## Polysemous training", "", "| side | factory | np | CPU s (index stage) | wall s |", "|---|---|---:|---:|---:|"]
        md += [f"| {r['side']} | {r['factory']} | {r['np']} | {r['cpu_max']:.1f} | {r['wall_s']:.1f} |" for r in poly]
    with open(f"{a.out}/scaling.md", "w") as f:
        f.write("\n".join(md) + "\n")
    with open(f"{a.out}/scaling_fit.json", "w") as f:
        json.dump({"rates": fits, "errors": err_lines, "held_out": {"rates_without": held_rates, "points": held_rows},
                   "inputs": [os.path.basename(p) for p in a.jsonl], "prediction_5e9_64": pred}, f, indent=1)
    print("\n".join(err_lines))
    for k, v in pred.items():
        print(f"{k}: index {v['index_s'] / 3600:.2f} h, retrieve {v['retrieve_s'] / 3600:.2f} h per rank")
    if a.c_defines:
        names = {"index": ("RATE_INDEX_", {"kmeans_flops": "KMEANS", "sample": "SAMPLE", "train_start": "TRAIN_START", "encode": "ENCODE",
                                           "add_start": "ADD_START", "coarse_a": "COARSE_A", "coarse_b": "COARSE_B"}),
                 "retrieve": ("RATE_RET_", {"scan": "SCAN", "tables": "TABLES", "exact": "EXACT", "visits": "VISITS", "queries": "QUERIES",
                                            "coarse_a": "COARSE_A", "coarse_b": "COARSE_B"})}
        for stage, (pre, m) in names.items():
            for t, n in m.items():
                v = fits[stage][t]
                print(f"#define {pre}{n} {v:.3e}" if v else f"#define {pre}{n} 0.0")


if __name__ == "__main__":
    sys.exit(main())
