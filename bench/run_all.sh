#!/usr/bin/env bash
# run_all.sh [STAGE...] — make (or check) the peer venv from bench/peers.sh, run each stage's benchmark
# against its peer, then print one ratio table (dfm/peer per CPU-second, above 1: dfm faster) from the
# result files the benchmarks write (bench/results/<stage>.json; the convention is in bench/README.md).
# The table also goes to bench/results/run_all.md.
#
#   bash bench/run_all.sh                      all stages: tokenizer encoder train faiss
#   bash bench/run_all.sh encoder faiss        only these
#   TABLE_ONLY=1 bash bench/run_all.sh         print the table from the result files already there
#   TABLE_ONLY=1 BENCH_RESULTS=DIR bash bench/run_all.sh    the same from DIR (run_all.md is written there)
#
# Each benchmark takes minutes to tens of minutes on 2 shared cores; their own knobs (N, ROUNDS, ...)
# pass through the environment. Exits non-zero if a benchmark fails or writes no fresh result file.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
cd "$ROOT"
declare -A SCRIPT=([tokenizer]=bench_tokenizer.sh [encoder]=bench_encoder_cpu.sh [train]=bench_train.sh
                   [faiss]=bench_faiss_build.sh)
STAGES=(tokenizer encoder train faiss)
[ $# -gt 0 ] && STAGES=("$@")
for s in "${STAGES[@]}"; do
  [ -n "${SCRIPT[$s]:-}" ] || { echo "run_all: unknown stage '$s' (tokenizer encoder train faiss)" >&2; exit 2; }
done
RES=${BENCH_RESULTS:-$HERE/results}
mkdir -p "$RES"

failed=()
if [ "${TABLE_ONLY:-0}" != 1 ]; then
  [ -z "${BENCH_RESULTS:-}" ] || { echo "run_all: BENCH_RESULTS is for TABLE_ONLY=1 (the benchmarks write bench/results)" >&2; exit 2; }
  bash "$HERE/peers.sh" || { echo "run_all: bench/peers.sh could not make the peer venv" >&2; exit 1; }
  PEERS_PYTHON=$(bash "$HERE/peers.sh" --python)
  export PEERS_PYTHON
  START=$(mktemp /tmp/dfm-run-all-XXXXXX)
  trap 'rm -f "$START"' EXIT
  for s in "${STAGES[@]}"; do
    echo "=== $s: bench/${SCRIPT[$s]} ($(date -u +%FT%TZ), load $(cut -d' ' -f1 /proc/loadavg))"
    if ! bash "$HERE/${SCRIPT[$s]}"; then
      echo "run_all: bench/${SCRIPT[$s]} failed" >&2; failed+=("$s"); continue
    fi
    if [ ! "$RES/$s.json" -nt "$START" ]; then
      echo "run_all: bench/${SCRIPT[$s]} wrote no fresh bench/results/$s.json" >&2; failed+=("$s")
    fi
  done
fi

rc=0
python3 - "$RES" "${STAGES[@]}" <<'PY' | tee "$RES/run_all.md" || rc=$?
import json, os, sys, time
res, stages = sys.argv[1], sys.argv[2:]
need = ("stage", "peer", "peer_version", "dfm_cpu_s", "peer_cpu_s", "ratio", "agree")
HEAD = ("| stage | peer | peer version | setting | dfm CPU-s | peer CPU-s | dfm/peer | outputs agree | measured |\n"
        "|---|---|---|---|---|---|---|---|---|")

def row(s, x, date):
    ag = x["agree"]
    ok = ag.get("ok") if isinstance(ag, dict) else bool(ag)
    figs = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in ag.items() if k not in ("ok", "tol")) if isinstance(ag, dict) else ""
    setting = ", ".join(str(v) for v in (f"{x['threads']} thr" if "threads" in x else None, x.get("setting"),
                                         x.get("unit")) if v)
    mm = x.get("ratio_min_max")
    spread = f" ({mm[0]:.2f}–{mm[1]:.2f})" if isinstance(mm, list) and len(mm) == 2 else ""
    return (f"| {s} | {x['peer']} | {x['peer_version']} | {setting} | {x['dfm_cpu_s']:.3g} | {x['peer_cpu_s']:.3g} "
            f"| **{x['ratio']:.2f}×**{spread} | {'yes' if ok else 'NO'}{' (' + figs + ')' if figs else ''} | {date} |")

found, bad = {}, 0
for s in stages:
    p = os.path.join(res, s + ".json")
    try:
        r = json.load(open(p))
        miss = [k for k in need if k not in r] + [f"rows[{i}].{k}" for i, x in enumerate(r.get("rows") or [])
                                                  for k in need if k not in x]
        if miss:
            raise ValueError(f"missing fields {miss}")
        found[s] = (r, r.get("date", time.strftime("%Y-%m-%d", time.gmtime(os.path.getmtime(p)))))
    except (OSError, ValueError) as e:
        found[s] = e
        bad = 1
print(f"dfm against its peers, per CPU-second (dfm/peer above 1: dfm faster); "
      f"table made {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC")
print()
def lines(every):
    """The headline of each stage, or (every) each of its rows; a stage without a result says why."""
    for s in stages:
        f = found[s]
        if isinstance(f, Exception):
            yield f"| {s} | (no result: {f}) | | | | | | | |"
        else:
            yield from (row(s, x, f[1]) for x in ((f[0].get("rows") or [f[0]]) if every else [f[0]]))

print("\n\n".join("\n".join([title, "", HEAD, *lines(every)]) for title, every in (
    ("Headline per stage (the strongest peer at the benchmark's main setting):", False), ("Every comparison:", True))))
sys.exit(bad)
PY
if [ ${#failed[@]} -gt 0 ]; then echo "run_all: failed stages: ${failed[*]}" >&2; exit 1; fi
exit "$rc"
