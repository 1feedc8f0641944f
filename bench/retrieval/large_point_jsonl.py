#!/usr/bin/env python3
"""large_point_jsonl.py — the measured large point (bench/retrieval/large_point.sh) as scaling.sh's JSON lines.

    python3 bench/retrieval/large_point_jsonl.py /tmp/dfm-large-point/N2000000 > bench/results/large_point.jsonl

Reads OUT/manifest-np<P>.json (each stage's per-rank work record: counts and CPU seconds), OUT/time-<stage>-np<P>.txt
(/usr/bin/time -v of the whole mpirun) and OUT/settings.txt, and writes one line per stage and np in the format of
bench/retrieval/scaling.sh, so that bench/retrieval/scaling_report.py fits on it or holds it out. large_point.sh
timed all ranks together, not rank by rank: "ranks" is null and "cpu_all_ranks" holds user + system seconds of
every rank; the model uses only the work records (train_cpu_s + add_cpu_s, search_cpu_s).
"""
import glob
import json
import os
import re
import sys


def timev(path):
    t = open(path).read()
    g = lambda k: re.search(k + r": (.*)", t).group(1)
    w = g(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\)").split(":")
    wall = sum(float(x) * 60 ** i for i, x in enumerate(reversed(w)))
    return wall, float(g(r"User time \(seconds\)")) + float(g(r"System time \(seconds\)")), int(g(r"Maximum resident set size \(kbytes\)"))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: large_point_jsonl.py OUT (the folder of bench/retrieval/large_point.sh)")
    out = sys.argv[1]
    settings = open(os.path.join(out, "settings.txt")).read()
    mk = os.path.join(out, "mkrun.log")  # retrieve_mkrun's own report of the vectors it wrote
    minilm = 1 if os.path.exists(mk) and "MiniLM-like" in open(mk).read() else 0
    for path in sorted(glob.glob(os.path.join(out, "manifest-np*.json")), key=lambda p: int(re.search(r"np(\d+)", p).group(1))):
        np_ = int(re.search(r"np(\d+)\.json$", path).group(1))
        st = json.load(open(path))["stages"]
        n, d = st["chunk"]["counts"]["chunks"], st["encode"]["dim"]
        rc = st["retrieve"]["config"]
        for stage in ("index", "retrieve"):
            wall, cpu, rss = timev(os.path.join(out, f"time-{stage}-np{np_}.txt"))
            row = {"side": "new", "stage": stage, "n": n, "dim": d, "factory": st["index"]["factory"], "nprobe": rc["nprobe"], "k": rc["k"],
                   "np": np_, "minilm": minilm, "wall_s": wall, "ranks": None, "cpu_all_ranks": cpu, "rss_max_kb": rss,
                   "work": st[stage]["work"], "source": "large_point", "settings": settings.strip()}
            print(json.dumps(row))


if __name__ == "__main__":
    main()
