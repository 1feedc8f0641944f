#!/usr/bin/env bash
# bench_faiss_build.sh — IVF-PQ training, adding and search: the Debian FAISS 1.7.3 that dfm links (through
# its C API, bench/retrieval/bench_faiss_build.c) against the faiss-cpu wheel (a SIMD build: its run-time best
# level, and pinned to AVX2), on the same synthetic vectors, single thread, interleaved A/B runs.
#
#   bash bench/retrieval/bench_faiss_build.sh           N=200000 DIM=384 NLIST=1024 PQ=32 NPROBE=16 NQ=10000 REPS=3
#   N=50000 NLIST=256 TRAIN=20000 REPS=2 bash bench/retrieval/bench_faiss_build.sh     a quick look
#
# Env: N base vectors, DIM, NLIST, PQ (sub-quantizers, 8 bits each), NPROBE, K (16), NQ queries, TRAIN
#      (training rows, default 50000), REPS (interleaved rounds; each round runs every side once, in a
#      rotated order), SIDES ("debian wheel wheel-avx2"; also wheel-generic: the wheel without SIMD, which
#      separates the SIMD gain from the 1.7.3 -> 1.15 gain), KEEP=1 keeps the scratch folder, RESULTS
#      (default bench/results) where faiss.json and faiss_build.md go.
#      PEERS_PYTHON: the Python with faiss-cpu and numpy (default /var/cache/dfm/peers-venv/bin/python,
#      made by bench/peers.sh); missing, or without faiss, is an error: no other Python is tried.
# Data: unit vectors around N/20 random centres (seed 0); queries from the same distribution. Prints a
# Markdown table of min / median / max per phase, wall and CPU seconds, the search ratio, and how the
# sides agree: recall@K of each side's labels against the exact nearest neighbour of the first 1000
# queries, and the overlap@K of the labels of the sides. Writes bench/results/faiss_build.md and
# bench/results/faiss.json (bench/README.md; "dfm" there is the Debian build).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PEERS_PYTHON:-/var/cache/dfm/peers-venv/bin/python}
N=${N:-200000} DIM=${DIM:-384} NLIST=${NLIST:-1024} PQ=${PQ:-32} NPROBE=${NPROBE:-16} K=${K:-16}
NQ=${NQ:-10000} TRAIN=${TRAIN:-50000} REPS=${REPS:-3} SIDES=${SIDES:-"debian wheel wheel-avx2"}
FAC="IVF${NLIST},PQ${PQ}np"  # np: no polysemous training, as dfm index builds it
if [ ! -x "$PY" ] || ! "$PY" -c 'import faiss, numpy' 2>/dev/null; then
  echo "bench_faiss_build: the peer Python $PY is missing or has no faiss-cpu/numpy." >&2
  echo "HINT: bash bench/peers.sh (makes /var/cache/dfm/peers-venv), or PEERS_PYTHON=/path/to/python with faiss-cpu" >&2
  exit 1
fi
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
B=$(mktemp -d /tmp/dfm-bench-faiss-XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$B"' EXIT
make -s --no-print-directory -C "$ROOT" build/bench/bench_faiss_build

"$PY" - "$B" "$N" "$DIM" "$NQ" <<'PYEOF'
import sys
import numpy as np
out, n, d, nq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
centres = rng.standard_normal((max(n // 20, 1), d), dtype=np.float32)
def draw(m):
    x = centres[rng.integers(0, len(centres), m)] + 0.5 * rng.standard_normal((m, d), dtype=np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype("<f4")
draw(n).tofile(f"{out}/base.f32")
draw(nq).tofile(f"{out}/queries.f32")
PYEOF

run_side() {  # side, round -> appends one line to $B/times
  local side=$1 r=$2 line
  case $side in
    debian) line=$("$ROOT/build/bench/bench_faiss_build" "$B/base.f32" "$B/queries.f32" "$DIM" "$FAC" "$TRAIN" "$NPROBE" "$K" "$B/lab-$side.i64") ;;
    wheel) line=$("$PY" "$ROOT/bench/retrieval/bench_faiss_build.py" "$B/base.f32" "$B/queries.f32" "$DIM" "$FAC" "$TRAIN" "$NPROBE" "$K" "$B/lab-$side.i64") ;;
    wheel-avx2) line=$(FAISS_SIMD=AVX2 "$PY" "$ROOT/bench/retrieval/bench_faiss_build.py" "$B/base.f32" "$B/queries.f32" "$DIM" "$FAC" "$TRAIN" "$NPROBE" "$K" "$B/lab-$side.i64") ;;
    wheel-generic) line=$(FAISS_SIMD=NONE "$PY" "$ROOT/bench/retrieval/bench_faiss_build.py" "$B/base.f32" "$B/queries.f32" "$DIM" "$FAC" "$TRAIN" "$NPROBE" "$K" "$B/lab-$side.i64") ;;
    *) echo "unknown side $side (debian, wheel, wheel-avx2, wheel-generic)" >&2; exit 2 ;;
  esac
  echo "side=$side round=$r $line" | tee -a "$B/times" >&2
}

echo "faiss build: $(date -u '+%F %T') UTC, $(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1-3 /proc/loadavg); N=$N DIM=$DIM $FAC nprobe=$NPROBE K=$K NQ=$NQ TRAIN=$TRAIN REPS=$REPS, 1 thread"
read -r -a sides <<<"$SIDES"
for ((r = 0; r < REPS; r++)); do
  for ((i = 0; i < ${#sides[@]}; i++)); do run_side "${sides[$(((i + r) % ${#sides[@]}))]}" "$r"; done
done

"$PY" - "$B" "$DIM" "$K" "$SIDES" "${RESULTS:-$ROOT/bench/results}" "N=$N DIM=$DIM $FAC nprobe=$NPROBE K=$K NQ=$NQ TRAIN=$TRAIN" <<'PYEOF'
import json, os, re, statistics, sys, time
import numpy as np
b, d, k, sides, res, setting = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), sys.argv[5], sys.argv[6]
out = []
print = lambda *a: out.append(" ".join(str(x) for x in a))  # the report goes to stdout and bench/results/faiss_build.md
times = [dict(re.findall(r"(\S+)=(\S+)", l)) for l in open(f"{b}/times")]
names = {s: next(r["faiss"] for r in times if r["side"] == s) for s in sides}
def stats(side, key):
    v = sorted(float(r[key]) for r in times if r["side"] == side)
    return v[0], statistics.median(v), v[-1]
print("| side | build | phase | wall s min / med / max | CPU s min / med / max |")
print("|---|---|---|---|---|")
for s in sides:
    for ph in ("train", "add", "search"):
        w, c = stats(s, ph + "_s"), stats(s, ph + "_cpu")
        print(f"| {s} | {names[s]} | {ph} | {w[0]:.2f} / {w[1]:.2f} / {w[2]:.2f} | {c[0]:.2f} / {c[1]:.2f} / {c[2]:.2f} |")
print()
base = "debian"
if base in sides:
    for s in sides:
        if s == base:
            continue
        r = [stats(base, ph + "_cpu")[1] / stats(s, ph + "_cpu")[1] for ph in ("train", "add", "search")]
        print(f"- {s} vs debian, median CPU-s ratio (>1: {s} faster): train {r[0]:.2f}x, add {r[1]:.2f}x, search {r[2]:.2f}x")
# agreement: recall@k against exact nearest neighbours, overlap@k between sides
xb = np.fromfile(f"{b}/base.f32", dtype="<f4").reshape(-1, d)
xq = np.fromfile(f"{b}/queries.f32", dtype="<f4").reshape(-1, d)[:1000]
gt = np.argmax(xq @ xb.T, axis=1)  # unit vectors: max inner product = min L2
labs = {s: np.fromfile(f"{b}/lab-{s}.i64", dtype="<i8").reshape(-1, k) for s in sides}
for s in sides:
    print(f"- {s}: recall@{k} of the exact nearest neighbour (first {len(xq)} queries) {np.mean([gt[i] in labs[s][i] for i in range(len(xq))]):.3f}")
recall = {s: float(np.mean([gt[i] in labs[s][i] for i in range(len(xq))])) for s in sides}
for i, s in enumerate(sides):
    for t in sides[i + 1:]:
        ov = np.mean([len(set(a) & set(c)) / k for a, c in zip(labs[s], labs[t])])
        print(f"- overlap@{k} of {s} and {t} labels: {ov:.3f}")
sys.stdout.write("\n".join(out) + "\n")
# bench/results/faiss.json (bench/README.md): "dfm" is the Debian build dfm links, the peer the wheel;
# ratio = peer CPU-s / dfm CPU-s per round, median (above 1: the Debian build is faster)
rows = []
if base in sides:
    for s in sides:
        if s == base:
            continue
        for ph in ("train", "add", "search"):
            dfm_r = {r["round"]: float(r[ph + "_cpu"]) for r in times if r["side"] == base}
            pairs = [(dfm_r[r["round"]], float(r[ph + "_cpu"])) for r in times if r["side"] == s and r["round"] in dfm_r]
            ratios = sorted(p / q for q, p in pairs)
            rows.append({"stage": "faiss", "peer": f"faiss-cpu wheel ({names[s]}), IVF-PQ {ph}", "peer_version": names[s],
                         "setting": f"{ph}: {setting}, 1 thread", "threads": 1,
                         "dfm_cpu_s": round(statistics.median(q for q, _ in pairs), 3),
                         "peer_cpu_s": round(statistics.median(p for _, p in pairs), 3),
                         "ratio": round(statistics.median(ratios), 3), "ratio_min_max": [round(ratios[0], 3), round(ratios[-1], 3)],
                         "rounds": len(pairs), "agree": {"ok": abs(recall[s] - recall[base]) <= 0.02,
                                                         "recall_dfm": recall[base], "recall_peer": recall[s]},
                         "unit": "CPU-seconds (dfm = Debian FAISS 1.7.3 through its C API)"})
    head = min((r for r in rows if r["peer"].endswith("search")), key=lambda r: r["peer_cpu_s"])
    doc = dict(head, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), rows=rows)
    os.makedirs(res, exist_ok=True)
    json.dump(doc, open(os.path.join(res, "faiss.json"), "w"), indent=1)
    with open(os.path.join(res, "faiss_build.md"), "w") as f:
        f.write("# FAISS IVF-PQ: Debian 1.7.3 (what dfm links) vs the faiss-cpu wheel\n\n")
        f.write(f"`bash bench/retrieval/bench_faiss_build.sh` ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC): {setting}, "
                "1 thread, interleaved rounds.\n\n" + "\n".join(out) + "\n")
PYEOF
