#!/usr/bin/env bash
# bench_tokenizer.sh — tokenizer throughput, dfm against Hugging Face `tokenizers` (every tokenizer),
# tiktoken (byte-level BPE: an Encoding made from the same tokenizer.json's ranks) and SentencePiece (a
# Unigram model it trained), on cold and on warm text, in interleaved rounds.
#
#   bash bench/tokenizer/bench_tokenizer.sh            MB=4 THREADS="1 2" REPS=3, every tokenizer below
#   MB=1 THREADS=1 REPS=3 TOKENIZERS="qwen2.5 t5" bash bench/tokenizer/bench_tokenizer.sh
#
# Tokenizers (TOKENIZERS), one per model path dfm has:
#   qwen2.5, llama-3.2  byte-level BPE (NFC / Split regex / ByteLevel): the baseline of the speed goal
#   bert                WordPiece: all-MiniLM-L6-v2's (BertNormalizer, BertPreTokenizer)
#   spm-bpe             SentencePiece-style BPE with byte fallback, no pre-tokenizer (Llama-2's layout;
#                       tests/data/tokenizer/spm-llama2.tokenizer.json)
#   t5                  Unigram with SentencePiece's nmt_nfkc charsmap, converted as transformers converts
#                       T5 (Precompiled, Strip, Replace, Metaspace; tests/data/tokenizer/oracle/t5.tokenizer.json)
#   spm-unigram         a SentencePiece Unigram model trained here on the corpus (8000 pieces, nmt_nfkc) and
#                       converted the way that encodes like SentencePiece itself (transformers'
#                       SpmConverter.build_tokenizer_from_spm_proto): the row SentencePiece runs on too
# Texts: the first MB megabytes of the corpus's "text" fields. Each measurement is one process
# (bench_tokenizer.c for dfm, bench_tokenizer_hf.py for a peer): it loads the tokenizer, encodes every
# text once from a fresh tokenizer ("cold": the pieces have not been seen, as when `dfm chunk` reads a
# corpus) and again ("warm"). Each round runs every side once, in a rotating order; tables give min /
# median / max over the rounds of MB per CPU-second (process CPU time, all threads; what to compare on a
# shared machine) and the median wall MB/s. The ids of every side are compared with dfm's, document by
# document, in the same run; a difference from HF (the reference) fails the benchmark, one from tiktoken or
# SentencePiece is reported. Same thread count on every side (dfm: pthreads over documents; HF:
# RAYON_NUM_THREADS; tiktoken: encode_batch num_threads; SentencePiece: encode num_threads).
# add_special_tokens=False for HF; special tokens written in the text are matched on every side.
# Speed goal: on every path, dfm's cold MB per CPU-second is at least 1/1.5 of its byte-level BPE's
# (qwen2.5) in the same round, for every round (when qwen2.5 is in the run).
# Env: MB, THREADS, REPS, TOKENIZERS, DFM_CORPUS, PEERS_PYTHON (default /var/cache/dfm/peers-venv/bin/python
#      from bench/peers.sh; missing, or without a peer's package, is an error: no other Python is tried).
#      Writes bench/results/tokenizer.md and tokenizer.json.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
PY=${PEERS_PYTHON:-/var/cache/dfm/peers-venv/bin/python}
CORPUS=${DFM_CORPUS:-$DFM_CACHE/corpus/gcide.jsonl}
MB=${MB:-4} REPS=${REPS:-3} THREADS=${THREADS:-"1 2"} TOKENIZERS=${TOKENIZERS:-"qwen2.5 llama-3.2 bert spm-bpe t5 spm-unigram"}
declare -A MOD=([hf]=tokenizers [tiktoken]=tiktoken [sp]=sentencepiece)
B=$(mktemp -d /tmp/dfm-bench-tokenizer-XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$B"' EXIT
export DFM_TOKENIZER_CACHE=$B/dfm-cache

tok_path() {  # name -> tokenizer.json
  case $1 in
    qwen2.5|llama-3.2) echo "$DFM_CACHE/tokenizers/$1/tokenizer.json" ;;
    bert) echo "$DFM_CACHE/models/all-MiniLM-L6-v2/tokenizer.json" ;;
    spm-bpe) echo "$ROOT/tests/data/tokenizer/spm-llama2.tokenizer.json" ;;
    t5) echo "$ROOT/tests/data/tokenizer/oracle/t5.tokenizer.json" ;;
    spm-unigram) echo "$B/spm-unigram/tokenizer.json" ;;
    *) echo "bench_tokenizer: unknown tokenizer '$1' (qwen2.5 llama-3.2 bert spm-bpe t5 spm-unigram)" >&2; exit 2 ;;
  esac
}
peers_of() {  # name -> its peers
  case $1 in
    qwen2.5|llama-3.2) echo "tiktoken hf" ;;
    spm-unigram) echo "sp hf" ;;
    *) echo "hf" ;;
  esac
}
need=$(for t in $TOKENIZERS; do peers_of "$t"; done | tr ' ' '\n' | sort -u)
for p in $need; do
  if [ ! -x "$PY" ] || ! "$PY" -c "import ${MOD[$p]}" 2>/dev/null; then
    echo "bench_tokenizer: peer '$p' is missing: $PY cannot import ${MOD[$p]}." >&2
    echo "HINT: bash bench/peers.sh (makes /var/cache/dfm/peers-venv), or PEERS_PYTHON=/path/to/python with ${MOD[$p]}" >&2
    exit 1
  fi
done
make -s --no-print-directory -j2 build/bench/bench_tokenizer

if [[ " $TOKENIZERS " == *" spm-unigram "* ]]; then  # a SentencePiece Unigram model and its tokenizer.json
  mkdir -p "$B/spm-unigram"
  "$PY" - "$CORPUS" "$B/spm-unigram" <<'PYEOF'
import json, os, sys
import sentencepiece as spm
from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf
corpus, out = sys.argv[1], sys.argv[2]
with open(os.path.join(out, "train.txt"), "w", encoding="utf-8") as f:
    for i, line in enumerate(open(corpus, encoding="utf-8")):
        if i >= 3000:
            break
        f.write(json.loads(line)["text"].replace("\n", " ") + "\n")
spm.SentencePieceTrainer.train(input=os.path.join(out, "train.txt"), model_prefix=os.path.join(out, "spm"),
                               vocab_size=8000, model_type="unigram", normalization_rule_name="nmt_nfkc",
                               character_coverage=0.9995, num_threads=1, minloglevel=2)
m = import_protobuf().ModelProto()
m.ParseFromString(open(os.path.join(out, "spm.model"), "rb").read())
SpmConverter.build_tokenizer_from_spm_proto(m, [(p.piece, p.score) for p in m.pieces]).save(os.path.join(out, "tokenizer.json"))
PYEOF
fi

run_side() {  # side tokenizer threads round
  local side=$1 name=$2 t=$3 r=$4 tj line ids=$B/ids-$1-$2-$3.bin
  tj=$(tok_path "$name")
  if [ "$side" = dfm ]; then
    line=$(./build/bench/bench_tokenizer "$tj" "$CORPUS" "$MB" "$t" "$ids")
  else
    [ "$side" = sp ] && tj=$(dirname "$tj")/spm.model
    line=$(RAYON_NUM_THREADS=$t "$PY" bench/tokenizer/bench_tokenizer_hf.py "$side" "$tj" "$CORPUS" "$MB" "$t" "$ids")
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
echo "texts: first ${MB} MB of $(basename "$CORPUS"); $REPS interleaved rounds; tokenizers: $TOKENIZERS"
for name in $TOKENIZERS; do
  # dfm's first load of a tokenizer.json parses it and writes the cache file; later loads map it
  ./build/bench/bench_tokenizer "$(tok_path "$name")" "$CORPUS" 0.001 1 >/dev/null
done
for t in $THREADS; do
  for ((r = 0; r < REPS; r++)); do
    # a round runs every tokenizer's sides; dfm first in round 0 (its ids are the reference), then rotated
    for name in $TOKENIZERS; do
      sides=(dfm $(peers_of "$name"))
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
order = list(dict.fromkeys(r["tokenizer"] for r in rows))
keys = sorted({(r["tokenizer"], r["threads"]) for r in rows}, key=lambda k: (order.index(k[0]), int(k[1])))
names = {"dfm": "dfm", "hf": "HF tokenizers", "tiktoken": "tiktoken", "sp": "SentencePiece"}
out = []
out.append(f"Texts: first {mb:g} MB of {corpus}; {max(int(r['round']) for r in rows) + 1} interleaved rounds; "
           f"MB/CPU-s min / median / max (process CPU, all threads), wall MB/s median; tokenizer load: median ms CPU.")
out.append("")
out.append("| tokenizer | thr | side | cold MB/CPU-s | warm MB/CPU-s | cold wall MB/s | load ms CPU | ids = dfm |")
out.append("|---|---|---|---|---|---|---|---|")
result_rows, versions = [], {}
for name, t in keys:
    sides = list(dict.fromkeys(r["side"] for r in rows if r["tokenizer"] == name))
    sel = {s: [r for r in rows if r["tokenizer"] == name and r["threads"] == t and r["side"] == s] for s in sides}
    nbytes = int(sel["dfm"][0]["bytes"])
    for s, rs in sel.items():
        if "version" in rs[0]:
            versions[s] = rs[0]["version"].replace("-", " ")
        cold = med3([nbytes / 1e6 / float(r["cold_cpu"]) for r in rs])
        warm = med3([nbytes / 1e6 / float(r["warm_cpu"]) for r in rs])
        wall = statistics.median([nbytes / 1e6 / float(r["cold_s"]) for r in rs])
        load = statistics.median([float(r["load_cpu"]) * 1e3 for r in rs])
        eq = "—" if s == "dfm" else ("yes" if agree.get((name, t, s)) else "**no**: " + differ.get((name, t, s), "not compared"))
        out.append(f"| {name} | {t} | {names[s]} | {cold[0]:.2f} / {cold[1]:.2f} / {cold[2]:.2f} | "
                   f"{warm[0]:.2f} / {warm[1]:.2f} / {warm[2]:.2f} | {wall:.2f} | {load:.0f} | {eq} |")
    for s in sides[1:]:
        for temp in ("cold", "warm"):
            by_round = {r["round"]: float(r[temp + "_cpu"]) for r in sel[s]}
            pairs = [(float(d[temp + "_cpu"]), by_round[d["round"]]) for d in sel["dfm"] if d["round"] in by_round]
            ratios = sorted(p / d for d, p in pairs)
            ok = bool(agree.get((name, t, s)))
            result_rows.append({
                "stage": "tokenizer", "peer": f"{names[s]}, {temp} text, {name}", "peer_version": versions.get(s, s),
                "setting": f"{name}, {temp} text, {t} thread(s), {mb:g} MB", "threads": int(t), "tokenizer": name,
                "side": s, "text": temp,
                "dfm_cpu_s": round(statistics.median(d for d, _ in pairs), 4),
                "peer_cpu_s": round(statistics.median(p for _, p in pairs), 4),
                "ratio": round(statistics.median(ratios), 3), "ratio_min_max": [round(ratios[0], 3), round(ratios[-1], 3)],
                "rounds": len(pairs), "agree": {"ok": ok, "ids_equal": ok,
                                                **({} if ok else {"ids": differ.get((name, t, s))})},
                "unit": f"CPU-seconds to encode {mb:g} MB"})
out.append("")
out.append("dfm/peer per CPU-second (median of the per-round ratios peer CPU-s / dfm CPU-s, min–max; above 1: dfm faster):")
out.append("")
out.append("| tokenizer | thr | peer | cold | warm |")
out.append("|---|---|---|---|---|")
fmt = lambda x: f"{x['ratio']:.2f}× ({x['ratio_min_max'][0]:.2f}–{x['ratio_min_max'][1]:.2f})"
for name, t in keys:
    for s in [x["side"] for x in result_rows if x["tokenizer"] == name and x["threads"] == int(t) and x["text"] == "cold"]:
        c = [x for x in result_rows if x["tokenizer"] == name and x["threads"] == int(t) and x["side"] == s and x["text"] == "cold"]
        w = [x for x in result_rows if x["tokenizer"] == name and x["threads"] == int(t) and x["side"] == s and x["text"] == "warm"]
        out.append(f"| {name} | {t} | {names[s]} | {fmt(c[0])} | {fmt(w[0])} |")
# the speed goal: every path's dfm cold speed per byte within 1.5x of dfm's byte-level BPE (qwen2.5), per round
goal_ok, goal = True, []
if any(k[0] == "qwen2.5" for k in keys):
    out.append("")
    out.append("Speed goal: dfm's cold CPU-seconds per byte on each path / on byte-level BPE (qwen2.5) in the same "
               "round; met when every round is at most 1.5:")
    out.append("")
    out.append("| tokenizer | thr | per-round ratios | max | goal ≤ 1.5 |")
    out.append("|---|---|---|---|---|")
    for name, t in keys:
        if name == "qwen2.5":
            continue
        base = {r["round"]: float(r["cold_cpu"]) / int(r["bytes"]) for r in rows
                if r["tokenizer"] == "qwen2.5" and r["threads"] == t and r["side"] == "dfm"}
        mine = [(r["round"], float(r["cold_cpu"]) / int(r["bytes"])) for r in rows
                if r["tokenizer"] == name and r["threads"] == t and r["side"] == "dfm" and r["round"] in base]
        ratios = [m / base[rd] for rd, m in mine]
        met = bool(ratios) and max(ratios) <= 1.5
        goal_ok &= met
        goal.append({"tokenizer": name, "threads": int(t), "ratios": [round(x, 3) for x in ratios], "met": met})
        out.append(f"| {name} | {t} | {', '.join(f'{x:.2f}' for x in ratios)} | {max(ratios):.2f} | "
                   f"{'yes' if met else '**no**'} |")
out.append("")
out.append("A peer whose ids differ from dfm's did different work on those documents: its ratio is not a like-for-like "
           "comparison. HF `tokenizers` is the reference (the golden tests are made with it); tiktoken stands in "
           "through an Encoding built from the tokenizer.json, which is exact only where HF's pipeline reduces to "
           "tiktoken's; SentencePiece runs its own model, which the tokenizer.json was converted from.")
print("\n".join(out))
ok = len(agree) > 0 and all(v for (n, t, s), v in agree.items() if s == "hf")
first = keys[0]
cold1 = [x for x in result_rows if x["text"] == "cold" and x["threads"] == int(first[1]) and x["tokenizer"] == first[0]
         and x["agree"]["ok"]]
if not cold1:
    sys.exit("bench_tokenizer: no peer gave dfm's ids on " + first[0])
doc = dict(min(cold1, key=lambda x: x["peer_cpu_s"]))
doc.update({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": result_rows,
            "speed_goal": {"met": goal_ok, "rows": goal}})
os.makedirs(res, exist_ok=True)
json.dump(doc, open(os.path.join(res, "tokenizer.json"), "w"), indent=1)
with open(os.path.join(res, "tokenizer.md"), "w") as f:
    f.write("# Tokenizer throughput: dfm vs HF tokenizers, tiktoken and SentencePiece, cold and warm text\n\n")
    f.write(f"`bash bench/tokenizer/bench_tokenizer.sh` ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; "
            f"peers: {', '.join(sorted(set(versions.values())))}).\n\n")
    f.write("\n".join(out) + "\n")
if not ok:
    sys.exit("bench_tokenizer: HF tokenizers' ids differ from dfm's (see the table)")
PYEOF
