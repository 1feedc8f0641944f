#!/usr/bin/env bash
# bench_tokenizer.sh — tokenizer throughput, dfm vs tiktoken (an Encoding made from the same
# tokenizer.json's ranks) and Hugging Face `tokenizers`, on cold and on warm text, in interleaved rounds.
#
#   bash bench/bench_tokenizer.sh            MB=4 THREADS="1 2" REPS=3, Qwen2.5 and Llama-3.2
#   MB=1 THREADS=1 REPS=3 TOKENIZERS=qwen2.5 bash bench/bench_tokenizer.sh
#
# Texts: the first MB megabytes of the corpus's "text" fields. Each measurement is one process
# (bench_tokenizer.c for dfm, bench_tokenizer_hf.py for a peer): it loads the tokenizer, encodes every
# text once from a fresh tokenizer ("cold": the pieces have not been seen, as when `dfm chunk` reads a
# corpus) and again ("warm": what the old version of this benchmark timed after its warm-up pass).
# Each round runs every side once, in a rotating order; tables give min / median / max over the rounds
# of MB per CPU-second (process CPU time, all threads; what to compare on a shared machine) and the
# median wall MB/s. The ids of every side are compared with dfm's, document by document, in the same
# run; a difference from HF (the reference) fails the benchmark, one from tiktoken is reported. Same thread count on every side (dfm: pthreads over documents;
# HF: RAYON_NUM_THREADS; tiktoken: encode_batch num_threads). add_special_tokens=False for HF; special
# tokens written in the text are matched on every side.
# Env: MB, THREADS, REPS, TOKENIZERS, PEERS ("tiktoken hf"), DFM_CORPUS, PEERS_PYTHON (default
#      /var/cache/dfm/peers-venv/bin/python from bench/peers.sh; missing, or without the peer's package,
#      is an error: no other Python is tried). Writes bench/results/tokenizer.md and tokenizer.json.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
PY=${PEERS_PYTHON:-/var/cache/dfm/peers-venv/bin/python}
CORPUS=${DFM_CORPUS:-$DFM_CACHE/corpus/gcide.jsonl}
MB=${MB:-4} REPS=${REPS:-3} THREADS=${THREADS:-"1 2"} TOKENIZERS=${TOKENIZERS:-"qwen2.5 llama-3.2"}
PEERS=${PEERS:-"tiktoken hf"}
declare -A MOD=([hf]=tokenizers [tiktoken]=tiktoken)
for p in $PEERS; do
  [ -n "${MOD[$p]:-}" ] || { echo "bench_tokenizer: unknown peer '$p' (tiktoken, hf)" >&2; exit 2; }
  if [ ! -x "$PY" ] || ! "$PY" -c "import ${MOD[$p]}" 2>/dev/null; then
    echo "bench_tokenizer: peer '$p' is missing: $PY cannot import ${MOD[$p]}." >&2
    echo "HINT: bash bench/peers.sh (makes /var/cache/dfm/peers-venv), or PEERS_PYTHON=/path/to/python with ${MOD[$p]}" >&2
    exit 1
  fi
done
B=$(mktemp -d /tmp/dfm-bench-tokenizer-XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$B"' EXIT
make -s --no-print-directory -j2 build/bench/bench_tokenizer

run_side() {  # side tokenizer threads round
  local side=$1 name=$2 t=$3 r=$4 tj=$DFM_CACHE/tokenizers/$2/tokenizer.json line ids=$B/ids-$1-$2-$3.bin
  if [ "$side" = dfm ]; then
    line=$(./build/bench/bench_tokenizer "$tj" "$CORPUS" "$MB" "$t" "$ids")
  else
    line=$(RAYON_NUM_THREADS=$t "$PY" bench/bench_tokenizer_hf.py "$side" "$tj" "$CORPUS" "$MB" "$t" "$ids")
  fi
  echo "tokenizer=$name round=$r $line" | tee -a "$B/times" >&2
  if [ "$side" != dfm ] && [ "$r" = 0 ]; then  # ids, document by document, against dfm's of this round
    python3 - "$ids" "$B/ids-dfm-$name-$t.bin" "$name $t $side" >>"$B/agree" <<'PYEOF'
import struct, sys
def docs(p):
    b, i, out = open(p, "rb").read(), 0, []
    while i < len(b):
        n = struct.unpack_from("<I", b, i)[0]
        out.append(b[i + 4:i + 4 + 4 * n])
        i += 4 + 4 * n
    return out
a, d = docs(sys.argv[1]), docs(sys.argv[2])
diff = sum(x != y for x, y in zip(a, d)) + abs(len(a) - len(d))
print("ids", sys.argv[3], diff, len(d))
PYEOF
  fi
}

echo "tokenizer throughput: $(date -u '+%F %T') UTC, $(uname -m), $(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "texts: first ${MB} MB of $(basename "$CORPUS"); $REPS interleaved rounds; peers: $PEERS"
sides=(dfm $PEERS)
for name in $TOKENIZERS; do
  # dfm's first load of a tokenizer.json parses it and writes the cache file; later loads map it
  ./build/bench/bench_tokenizer "$DFM_CACHE/tokenizers/$name/tokenizer.json" "$CORPUS" 0.001 1 >/dev/null
  for t in $THREADS; do
    for ((r = 0; r < REPS; r++)); do
      # dfm runs first in round 0 (its ids are the reference), then the order rotates
      for ((i = 0; i < ${#sides[@]}; i++)); do run_side "${sides[$(((i + r) % ${#sides[@]}))]}" "$name" "$t" "$r"; done
    done
  done
done

python3 - "$B" "$ROOT/bench/results" "$MB" "$(basename "$CORPUS")" <<'PYEOF'
import json, os, re, statistics, sys, time
b, res, mb, corpus = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
rows = [dict(re.findall(r"(\S+)=(\S+)", l)) for l in open(f"{b}/times")]
for r, l in zip(rows, open(f"{b}/times").read().splitlines()):
    r["side"] = l.split()[2]  # "tokenizer=.. round=.. SIDE threads=.."
agree, differ = {}, {}
for l in open(f"{b}/agree"):
    _, name, t, side, ndiff, ndocs = l.split()
    agree[(name, t, side)] = ndiff == "0"
    differ[(name, t, side)] = f"{ndiff} of {ndocs} docs differ"
def med3(v):
    v = sorted(v)
    return v[0], statistics.median(v), v[-1]
order = list(dict.fromkeys(r["tokenizer"] for r in rows))  # as TOKENIZERS lists them
keys = sorted({(r["tokenizer"], r["threads"]) for r in rows}, key=lambda k: (order.index(k[0]), int(k[1])))
peers = [s for s in ("tiktoken", "hf") if any(r["side"] == s for r in rows)]
names = {"dfm": "dfm", "hf": "HF tokenizers", "tiktoken": "tiktoken"}
out = []
out.append(f"Texts: first {mb:g} MB of {corpus}; {max(int(r['round']) for r in rows) + 1} interleaved rounds; "
           f"MB/CPU-s min / median / max (process CPU, all threads), wall MB/s median; tokenizer load: median ms CPU.")
out.append("")
out.append("| tokenizer | thr | side | cold MB/CPU-s | warm MB/CPU-s | cold wall MB/s | load ms CPU | ids = dfm |")
out.append("|---|---|---|---|---|---|---|---|")
result_rows = []
versions = {}
for name, t in keys:
    sel = {s: [r for r in rows if r["tokenizer"] == name and r["threads"] == t and r["side"] == s] for s in ["dfm"] + peers}
    nbytes = int(sel["dfm"][0]["bytes"])
    for s, rs in sel.items():
        if not rs:
            continue
        if "version" in rs[0]:
            versions[s] = rs[0]["version"].replace("-", " ")
        cold = med3([nbytes / 1e6 / float(r["cold_cpu"]) for r in rs])
        warm = med3([nbytes / 1e6 / float(r["warm_cpu"]) for r in rs])
        wall = statistics.median([nbytes / 1e6 / float(r["cold_s"]) for r in rs])
        load = statistics.median([float(r["load_cpu"]) * 1e3 for r in rs])
        eq = "—" if s == "dfm" else ("yes" if agree.get((name, t, s)) else "**no**: " + differ.get((name, t, s), "not compared"))
        out.append(f"| {name} | {t} | {names[s]} | {cold[0]:.2f} / {cold[1]:.2f} / {cold[2]:.2f} | "
                   f"{warm[0]:.2f} / {warm[1]:.2f} / {warm[2]:.2f} | {wall:.2f} | {load:.0f} | {eq} |")
    for s in peers:
        if not sel[s]:
            continue
        for temp in ("cold", "warm"):
            by_round = {r["round"]: float(r[temp + "_cpu"]) for r in sel[s]}
            pairs = [(float(d[temp + "_cpu"]), by_round[d["round"]]) for d in sel["dfm"] if d["round"] in by_round]
            ratios = sorted(p / d for d, p in pairs)
            result_rows.append({
                "stage": "tokenizer", "peer": f"{names[s]}, {temp} text, {name}", "peer_version": versions.get(s, s),
                "setting": f"{name}, {temp} text, {t} thread(s), {mb:g} MB", "threads": int(t),
                "dfm_cpu_s": round(statistics.median(d for d, _ in pairs), 4),
                "peer_cpu_s": round(statistics.median(p for _, p in pairs), 4),
                "ratio": round(statistics.median(ratios), 3), "ratio_min_max": [round(ratios[0], 3), round(ratios[-1], 3)],
                "rounds": len(pairs), "agree": {"ok": bool(agree.get((name, t, s))), "ids_equal": bool(agree.get((name, t, s))),
                                                **({} if agree.get((name, t, s)) else {"ids": differ.get((name, t, s))})},
                "unit": f"CPU-seconds to encode {mb:g} MB"})
out.append("")
out.append("dfm/peer per CPU-second (median of the per-round ratios peer CPU-s / dfm CPU-s, min–max; above 1: dfm faster):")
out.append("")
out.append("| tokenizer | thr | peer | cold | warm |")
out.append("|---|---|---|---|---|")
for name, t in keys:
    for s in peers:
        c = [x for x in result_rows if x["setting"].startswith(f"{name}, cold") and x["threads"] == int(t) and x["peer"].startswith(names[s])]
        w = [x for x in result_rows if x["setting"].startswith(f"{name}, warm") and x["threads"] == int(t) and x["peer"].startswith(names[s])]
        if c and w:
            fmt = lambda x: f"{x['ratio']:.2f}× ({x['ratio_min_max'][0]:.2f}–{x['ratio_min_max'][1]:.2f})"
            out.append(f"| {name} | {t} | {names[s]} | {fmt(c[0])} | {fmt(w[0])} |")
out.append("")
out.append("A peer whose ids differ from dfm's did different work on those documents: its ratio is not a like-for-like "
           "comparison. HF `tokenizers` is the reference (the golden tests are made with it); tiktoken stands in "
           "through an Encoding built from the tokenizer.json, which is exact only where HF's pipeline reduces to "
           "tiktoken's (Qwen2.5 here).")
print("\n".join(out))
# HF tokenizers is the reference: its ids must equal dfm's; a tiktoken difference is reported, not fatal
ok = len(agree) > 0 and all(v for (n, t, s), v in agree.items() if s == "hf")
# headline: the strongest peer (lowest CPU) with equal ids, cold text, the first tokenizer, fewest threads
cold1 = [x for x in result_rows if ", cold text," in x["setting"] and x["threads"] == min(int(k[1]) for k in keys)
         and x["setting"].startswith(keys[0][0] + ",") and x["agree"]["ok"]]
if not cold1:
    sys.exit("bench_tokenizer: no peer gave dfm's ids on " + keys[0][0])
doc = dict(min(cold1, key=lambda x: x["peer_cpu_s"]))
doc.update({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": result_rows})
os.makedirs(res, exist_ok=True)
json.dump(doc, open(os.path.join(res, "tokenizer.json"), "w"), indent=1)
with open(os.path.join(res, "tokenizer.md"), "w") as f:
    f.write("# Tokenizer throughput: dfm vs tiktoken and HF tokenizers, cold and warm text\n\n")
    f.write(f"`bash bench/bench_tokenizer.sh` ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; "
            f"peers: {', '.join(versions.get(s, s) for s in peers)}).\n\n")
    f.write("\n".join(out) + "\n")
if not ok:
    sys.exit("bench_tokenizer: HF tokenizers' ids differ from dfm's (see the table)")
PYEOF
