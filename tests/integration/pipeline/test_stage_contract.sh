#!/usr/bin/env bash
# The stage contract (common/manifest.h, schemas/manifest.md) for every stage: a complete identical
# stage is skipped (a complete `dfm build` does no work), an interrupted one resumes, a changed one is
# refused unless --force, and --force removes the later stages from the manifest and the disk;
# temporaries of dead writers are removed; one writer per run directory (RUN/.lock).
source "$(dirname "$0")/../lib.sh"
head -n 6 "$DFM_CORPUS" > "$WORK/corpus.jsonl"
R=$WORK/run
mkcfg() {  # file [sed expression]
  cat > "$1" <<JSON
{"run": "$R", "inputs": ["$WORK/corpus.jsonl"], "tokenizer": "$DFM_TOKENIZER",
 "chunk": {"seq-len": 256}, "encode": {"device": "cpu", "model": "$DFM_MODEL", "block-chunks": 16},
 "index": {"index": "Flat"}, "retrieve": {"k": 16}, "write-targets": {"target-shards": 2}}
JSON
  [ -z "${2:-}" ] || sed -i "$2" "$1"
}
build() { "$DFM" build "$@" > "$WORK/log" 2>&1; }
state() { find "$R" -type f ! -name .lock -printf '%P %s %T@\n' | sort; }
mstate() { "$DFM_PYTHON" -c "import json,sys; m=json.load(open('$R/manifest.json'))['stages']; print(' '.join(k+':'+m[k]['state'] for k in m))"; }
mkcfg "$WORK/c.json"
build "$WORK/c.json" || { cat "$WORK/log"; fail "first build"; }
cp -r "$R" "$WORK/ref"

# 1. skip: a complete build again does nothing at all
state > "$WORK/s1"
build "$WORK/c.json" || { cat "$WORK/log"; fail "second build"; }
n=$(grep -c "build: stage .* skipped in" "$WORK/log" || true)
[ "$n" = 5 ] || { cat "$WORK/log"; fail "complete build: $n of 5 stages skipped"; }
grep -q "build: stage .* ran in" "$WORK/log" && { cat "$WORK/log"; fail "complete build ran a stage"; }
state > "$WORK/s2"; cmp -s "$WORK/s1" "$WORK/s2" || { diff "$WORK/s1" "$WORK/s2"; fail "complete build changed files"; }
for st in index retrieve; do
  "$DFM" $st "$R" --config "$WORK/c.json" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "$st again"; }
  grep -q "$st stage of $R is already complete" "$WORK/log" || { cat "$WORK/log"; fail "dfm $st did not skip"; }
done
state > "$WORK/s3"; cmp -s "$WORK/s1" "$WORK/s3" || fail "a skipped index/retrieve changed files"
ok "complete run: every stage skipped, no file touched"

# 2. refuse: each stage with a changed option, nothing changed on disk
for change in 's/"seq-len": 256/"seq-len": 512/:chunk' 's/"block-chunks": 16/"block-chunks": 32/:encode' \
              's/"Flat"/"HNSW16"/:index' 's/"k": 16/"k": 8/:retrieve' 's/"target-shards": 2/"target-shards": 3/:targets'; do
  mkcfg "$WORK/x.json" "${change%:*}"
  build "$WORK/x.json" && fail "changed ${change##*:}: build ran"
  grep -q "stage '${change##*:}' of run $R was made with other inputs or options" "$WORK/log" || { cat "$WORK/log"; fail "changed ${change##*:}: unclear refusal"; }
  state > "$WORK/s4"; cmp -s "$WORK/s1" "$WORK/s4" || fail "refused ${change##*:} changed files"
done
grep -q "'target-shards' was 2, now 3" "$WORK/log" || { cat "$WORK/log"; fail "refusal does not name the option"; }
ok "a changed option of every stage refused, run untouched"

# 3. force: build --stages index --force redoes index, removes retrieve and targets (manifest, then disk)
build "$WORK/c.json" --stages index --force || { cat "$WORK/log"; fail "build --stages index --force"; }
[ "$(mstate)" = "chunk:complete encode:complete index:complete" ] || fail "after index --force: $(mstate)"
[ ! -e "$R/retrieve" ] && [ ! -e "$R/targets" ] || fail "stale retrieve/targets folders left on disk"
expect_fail "dfm write-targets" "$DFM" verify "$R"
out=$("$DFM" verify "$R" 2>&1) && fail "verify passed on a run without targets"
grep -q "dfm targets" <<<"$out" && fail "verify suggests 'dfm targets': $out"
mkcfg "$WORK/k8.json" 's/"k": 16/"k": 8/'
build "$WORK/k8.json" --stages retrieve || { cat "$WORK/log"; fail "retrieve after the drop"; }
build "$WORK/c.json" --force --stages retrieve,write-targets || { cat "$WORK/log"; fail "retrieve --force back to k=16"; }
"$DFM" verify "$R" --compare "$WORK/ref" >/dev/null 2>&1 || fail "forced run differs from the first"
ok "--force redoes the stage and removes the later ones from manifest and disk; same records again"

# 4. resume: encode killed after a block, a temporary of a dead writer left behind
"$DFM_PYTHON" - "$R/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["stages"]["encode"]["state"] = "running"
for k in ("index", "retrieve", "targets"): m["stages"].pop(k, None)
json.dump(m, open(sys.argv[1], "w"), indent=2)
PY
rm "$R/encode/emb-000001.bin"
echo junk > "$R/encode/emb-000001.bin.tmp.999999"
echo junk > "$R/manifest.json.tmp.999998"
build "$WORK/c.json" || { cat "$WORK/log"; fail "resume build"; }
grep -q "encode stage of $R was interrupted" "$WORK/log" || { cat "$WORK/log"; fail "encode did not resume"; }
[ -z "$(find "$R" -name '*.tmp.*')" ] || { find "$R" -name '*.tmp.*'; fail "temporaries of dead writers left"; }
"$DFM" verify "$R" --compare "$WORK/ref" >/dev/null 2>&1 || fail "resumed run differs"
ok "interrupted encode resumed, temporaries of dead writers removed, same records"
for point in index:shard-written retrieve:block-written; do
  DFM_FAULT=$point DFM_FAULT_RANK=0 "$DFM" build "$WORK/c.json" --stages ${point%%:*} --force > "$WORK/log" 2>&1 && fail "$point: no kill"
  build "$WORK/c.json" || { cat "$WORK/log"; fail "$point: resume"; }
  grep -q "${point%%:*} stage of $R was interrupted" "$WORK/log" || { cat "$WORK/log"; fail "$point: not resumed"; }
  "$DFM" verify "$R" --compare "$WORK/ref" >/dev/null 2>&1 || fail "$point: resumed run differs"
done
ok "index and retrieve killed mid-stage: redone on resume, same records"

# 5. a complete stage is re-checked before it is skipped: missing or partial files are redone
rm -rf "$R/targets/shard-00001"; rm "$R/retrieve/nbr-000000.bin"
build "$WORK/c.json" || { cat "$WORK/log"; fail "build over missing files"; }
grep -q "retrieve stage of $R is recorded complete, but .*nbr-000000.bin is missing" "$WORK/log" || { cat "$WORK/log"; fail "a missing neighbour block was trusted"; }
"$DFM" verify "$R" --compare "$WORK/ref" >/dev/null 2>&1 || fail "run rebuilt over missing files differs"
rm -rf "$R/targets/shard-00000"
build "$WORK/c.json" --stages write-targets || { cat "$WORK/log"; fail "write-targets over a missing shard"; }
grep -q "targets stage of $R is recorded complete, but" "$WORK/log" || { cat "$WORK/log"; fail "a missing target shard was trusted"; }
"$DFM" verify "$R" --compare "$WORK/ref" >/dev/null 2>&1 || fail "run with a redone shard differs"
ok "missing files of complete stages are redone, never trusted"
# damaged (not missing) files of complete stages: a flipped payload byte in a chunk shard, an embedding block
# and a neighbour block is found by the checksums before a skip, and the file is redone
flip() { local f=$1 off; off=$(( $(stat -c %s "$f") - 9 )); printf '\x5a' | dd of="$f" bs=1 seek="$off" conv=notrunc status=none; }
for f in "$R/chunk/$(ls "$R/chunk" | grep -m1 '\.bin$')" "$R/encode/emb-000000.bin" "$R/retrieve/nbr-000000.bin"; do
  [ -f "$f" ] || fail "no file $f to damage"
  flip "$f"
  build "$WORK/c.json" || { cat "$WORK/log"; fail "build over a damaged $f"; }
  grep -q "is recorded complete, but a file is damaged" "$WORK/log" || { cat "$WORK/log"; fail "a damaged $f was trusted"; }
  "$DFM" verify "$R" --compare "$WORK/ref" >/dev/null 2>&1 || fail "run rebuilt over a damaged $f differs"
done
ok "damaged files of complete stages are found by their checksums and redone"

# 6. one writer per run
S=$WORK/syn
"$DFM" write-targets "$S" --synthetic 100000 --target-shards 4 > "$WORK/w0.log" 2>&1 || { cat "$WORK/w0.log"; fail "synthetic"; }
"$DFM" write-targets "$S" --synthetic 100000 --target-shards 4 --force > "$WORK/w1.log" 2>&1 &
P=$!
# frozen once it holds the lock and has marked the stage running (frozen earlier, a reader still sees the
# complete run of the first write)
for _ in $(seq 1000); do
  grep -q "pid $P " "$S/.lock" 2>/dev/null && grep -q '"state": *"running"' "$S/manifest.json" 2>/dev/null && break
  sleep 0.01
done
kill -STOP $P
grep -q "pid $P " "$S/.lock" || { kill -CONT $P; fail "first writer never took the lock"; }
expect_fail "is being written by another process: host $(hostname) pid $P command" "$DFM" write-targets "$S" --synthetic 100000 --target-shards 4 --force
expect_fail "is being written by another process" "$DFM" build "$WORK/c.json" --run "$S"
expect_fail "re-run 'dfm write-targets'" "$DFM" verify "$S"   # a reader takes no lock: it sees an incomplete run
kill -CONT $P; wait $P || { cat "$WORK/w1.log"; fail "the first writer failed"; }
"$DFM" verify "$S" >/dev/null || fail "run of the first writer does not verify"
ok "a second writer refused at once naming the holder; readers take no lock"
echo "host gone pid 999999 command dfm build since 2000-01-01T00:00:00Z" > "$R/.lock"
build "$WORK/c.json" --stages index --force || { cat "$WORK/log"; fail "stale holder line"; }
grep -q "taking over from a writer that died" "$WORK/log" || { cat "$WORK/log"; fail "stale lock not reported"; }
[ ! -s "$R/.lock" ] || fail "a finished writer left its holder line"
ok "a stale lock of a dead writer is taken over"
echo "all stage contract checks passed"
