#!/usr/bin/env bash
# dfm estimate: per stage memory per rank, disk and time (--json), by the model of pipeline/driver/job_estimate.c (index and retrieve: retriever/estimate.c):
# chunk memory is bounded (the same at 1e6 and 1e11 tokens); index and retrieve memory shrink with more
# ranks; disk of the stages is what their formats hold (chunk shards, neighbour rows); index time from a
# run's own work record; the work model's times shrink with ranks; encode on GPUs at the assumed rate;
# the target-store advice follows the node memory.
source "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
est() { "$DFM" estimate "$@" --json > "$WORK/e.json" || fail "estimate $*"; }
q() { "$PY" -c "import json,sys; e=json.load(open('$WORK/e.json')); s={x['stage']: x for x in e['stages']}; print($1)"; }
printf '{"run": "%s/none"}\n' "$WORK" > "$WORK/c.json"

est "$WORK/c.json" --tokens 1000000 --ranks 4
m1=$(q "s['chunk']['memory_per_rank_bytes']"); d1=$(q "s['chunk']['disk_bytes']"); r1=$(q "s['retrieve']['disk_bytes']")
est "$WORK/c.json" --tokens 100000000000 --ranks 4 --index-memory 64G
m2=$(q "s['chunk']['memory_per_rank_bytes']"); i4=$(q "s['index']['memory_per_rank_bytes']")
[ "$m1" = "$m2" ] || fail "chunk memory per rank grows with the corpus: $m1 -> $m2"
ok "chunk memory per rank is bounded: $m1 bytes at 1e6 and 1e11 tokens"
# 1e6 tokens / 32 = 31250 chunks of 24 + 4*32 bytes; neighbour rows of K = 16: 8K + 4K + 8 bytes
[ "${d1%.*}" = $((31250 * 152)) ] || fail "chunk disk $d1, expected $((31250 * 152))"
[ "${r1%.*}" = $((31250 * 200)) ] || fail "retrieve disk $r1, expected $((31250 * 200))"
ok "chunk and retrieve disk are their formats' bytes"
est "$WORK/c.json" --tokens 100000000000 --ranks 64 --index-memory 64G
i64=$(q "s['index']['memory_per_rank_bytes']")
"$PY" -c "import sys; sys.exit(0 if $i64 < $i4 / 4 else 1)" || fail "index memory per rank does not shrink with ranks: $i4 (4) vs $i64 (64)"
ok "index memory per rank shrinks with more ranks ($i4 -> $i64 bytes)"
est "$WORK/c.json" --tokens 5000000000 --ranks 64 --node-memory 64G
[ "$(q "e['target_store']['recommend']")" = embeddings ] || fail "64 GB nodes for 120 GB of tables: expected embeddings"
est "$WORK/c.json" --tokens 5000000000 --ranks 64 --node-memory 512G
[ "$(q "e['target_store']['recommend']")" = ids ] || fail "512 GB nodes for 120 GB of tables: expected ids"
ok "store advice at 5e9 tokens: embeddings on 64 GB nodes, ids on 512 GB nodes"

# measured visits (--visits: the ranks a query's search visits, the slowest rank's share) replace the upper bound
# P (1 - (1 - 1/P)^nprobe): 250,000 chunks on 16 ranks at nprobe 16 give 250000 x 0.644 = 1.6e5 shard searches a
# rank; 4 visits give 250000 x 4 / 16 = 6.2e4; more visits than the bound leave the bound
vis() { est "$WORK/c.json" --tokens 1000000 --chunk-len 4 --ranks 16 --dim 384 --index IVF2000,PQ32np --nprobe 16 "$@"; }
vis; vb=$(q "s['retrieve']['seconds']"); nb=$(q "s['retrieve']['note']")
vis --visits 4; v4=$(q "s['retrieve']['seconds']"); n4=$(q "s['retrieve']['note']")
vis --visits 1000; vh=$(q "s['retrieve']['seconds']")
[[ "$nb" == *"1.6e+05 shard searches (visits: the upper bound)"* ]] || fail "the bound's shard searches: $nb"
[[ "$n4" == *"6.2e+04 shard searches (visits as given"* ]] || fail "--visits 4: $n4"
"$PY" -c "import sys; sys.exit(0 if $v4 < $vb and $vh == $vb else 1)" || fail "retrieve s: bound $vb, --visits 4 $v4, --visits 1000 $vh"
ok "--visits: 6.2e4 shard searches a rank instead of the bound's 1.6e5 (retrieve $vb -> $v4 s); never above the bound"

# a run that has indexed, estimated without --index: its own index (IVF16,Flat, not the automatic Flat), its time
# from its own work record (the model calibrated by its slowest rank's
# CPU seconds outside MPI, training and adding), scaled by the work of more chunks
make -s --no-print-directory -C "$ROOT" build/tools/retrieve_mkrun
"$ROOT/build/tools/retrieve_mkrun" "$WORK/run" 3000 32 16 700 7 >/dev/null
"$DFM" index "$WORK/run" --index IVF16,Flat > /dev/null 2>&1 || fail "index"
est "$WORK/run"
[ "$(q "s['index']['time_source']")" = "this run's work" ] || fail "index time not from the run's work: $(cat "$WORK/e.json")"
[ "$(q "s['retrieve']['time_source']")" = "work model" ] || fail "retrieve has not run, yet its time is not the work model's"
t1=$(q "s['index']['seconds']")
run_s=$("$PY" -c "import json; print(max(r['train_cpu_s'] + r['add_cpu_s'] for r in json.load(open('$WORK/run/manifest.json'))['stages']['index']['work']['ranks']))")
# within 5 %: the job's counts are formulas (all-padding chunks counted as vectors), the run's are counted
"$PY" -c "import sys; sys.exit(0 if abs($t1 / $run_s - 1) < 0.05 else 1)" || fail "index estimate $t1 s for the run itself, whose slowest rank took $run_s CPU s"
# 400x the chunks: the refitted rates' fixed start-up of a training (0.54 s, fitted on 10^5..2*10^6 chunks) is most of
# the model's time for so small a run, so the job grows far less than its work (x 1.2 when this was written)
est "$WORK/run" --tokens $((400 * 4 * 3000)) --chunk-len 4 --index IVF16,Flat
t4=$(q "s['index']['seconds']")
"$PY" -c "import sys; r = $t4 / $t1; sys.exit(0 if 1.1 < r < 400 else 1)" || fail "400x the chunks: index time x $("$PY" -c "print($t4 / $t1)")"
ok "index time from the run's work ($run_s CPU s outside MPI), x $("$PY" -c "print(round($t4 / $t1, 2))") for 400x the chunks"
# an index of another kind than the run's: the run's rates say nothing of it (a Flat run of an IVF-PQ job)
est "$WORK/run" --index Flat
[ "$(q "s['index']['time_source']")" = "work model; the run's index is of another kind, not used" ] ||
  fail "--index Flat on an IVF16,Flat run was calibrated by it: $(q "s['index']['time_source']")"
[ "$(q "e['index']['factory']")" = "IDMap,Flat" ] || fail "--index Flat was not the plan: $(q "e['index']['factory']")"
ok "the run's work calibrates only an index of its own kind"
# the work model: 64 ranks do the index's and retrieve's scans in about 1/64 of one rank's time, but not
# their per-query visits (every query visits every shard)
est "$WORK/c.json" --tokens 5000000000 --ranks 1 --index IVF50000,PQ32 --nprobe 16
r1=$(q "s['retrieve']['seconds']"); i1=$(q "s['index']['seconds']")
est "$WORK/c.json" --tokens 5000000000 --ranks 64 --index IVF50000,PQ32 --nprobe 16
r64=$(q "s['retrieve']['seconds']"); i64=$(q "s['index']['seconds']")
"$PY" -c "import sys; sys.exit(0 if 40 < $i1 / $i64 <= 64.01 else 1)" || fail "index: 64 ranks take $i64 s against $i1 s on one (want 40-64x less)"
"$PY" -c "import sys; sys.exit(0 if 1 < $r1 / $r64 < 64 else 1)" || fail "retrieve: 64 ranks take $r64 s against $r1 s on one"
ok "5e9 tokens: index $i1 s on 1 rank, $i64 s on 64; retrieve $r1 s -> $r64 s"
est "$WORK/c.json" --tokens 5000000000 --ranks 64 --encode-gpus 8 --gpu-rate 10000
[ "$(q "s['encode']['time_source']")" = "assumed GPU rate" ] || fail "--encode-gpus: encode time not from the assumed GPU rate"
"$PY" -c "import sys; sys.exit(0 if abs($(q "s['encode']['seconds']") - 156250000 / 80000) < 1 else 1)" || fail "8 GPUs at 10,000 chunks/s: encode should take 1953 s"
ok "encode on 8 GPUs at an assumed 10,000 chunks/s: $(q "s['encode']['seconds']") s"
out=$("$DFM" estimate "$WORK/run" --ranks 2) || fail "dfm estimate (text output) failed"
grep -q "recommended: --store" <<<"$out" || fail "text output lacks the store advice: $out"
echo "all estimate checks passed"
