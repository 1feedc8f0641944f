#!/usr/bin/env bash
# dfm build: the same records on 1..4 ranks; a rank killed (SIGKILL) inside each stage, a full disk,
# and changed inputs/options — after each, a re-run gives exactly the uninterrupted result
# (dfm verify --compare: same records, no duplicates, no gaps), or a clear refusal.
source "$(dirname "$0")/../lib.sh"
head -n 10 "$DFM_CORPUS" > "$WORK/corpus.jsonl"
mkcfg() {  # name [extra top-level json] -> $WORK/name.json for run $WORK/name
  cat > "$WORK/$1.json" <<JSON
{"run": "$WORK/$1", "inputs": ["$WORK/${2:-corpus}.jsonl"], "tokenizer": "$DFM_TOKENIZER",
 "chunk": {"seq-len": 256}, "encode": {"device": "cpu", "model": "$DFM_MODEL", "block-chunks": 64},
 "write-targets": {"target-shards": 3}}
JSON
}
build() {  # np name [env...]
  local np=$1 name=$2; shift 2
  env "$@" mpirun -np "$np" "$DFM" build "$WORK/$name.json" > "$WORK/$name.log" 2>&1
}
same_as_ref() { "$DFM" verify "$WORK/$1" --compare "$WORK/ref" > "$WORK/$1.verify" 2>&1 || { cat "$WORK/$1.verify"; fail "$2"; }; }

mkcfg ref; build 1 ref || { cat "$WORK/ref.log"; fail "reference build"; }
"$DFM" verify "$WORK/ref" >/dev/null || fail "reference run does not verify"
ok "reference build (np=1) verifies"

for np in 2 3 4; do
  mkcfg np$np; build $np np$np || { cat "$WORK/np$np.log"; fail "build np=$np"; }
  same_as_ref np$np "np=$np differs from np=1"; ok "np=$np records identical to np=1"
done

# SIGKILL of rank 1 at a named point inside each stage, then the same command again
POINTS=${DFM_FAULT_POINTS:-"chunk:tokenized chunk:shard-written encode:block-written index:shard-written retrieve:block-written write-targets:mid-shard write-targets:shard-complete"}
i=0
for point in $POINTS; do
  i=$((i + 1)); mkcfg kill$i
  if build 2 kill$i DFM_FAULT="$point" DFM_FAULT_RANK=1; then
    grep -q "fault injection" "$WORK/kill$i.log" && fail "$point: killed run reported success"
    fail "fault point $point was never reached: the run finished without the injected kill"
  fi
  grep -q "fault injection: killing rank 1 at '$point'" "$WORK/kill$i.log" || { cat "$WORK/kill$i.log"; fail "$point: failed without the injected kill"; }
  "$DFM" verify "$WORK/kill$i" >/dev/null 2>&1 && fail "$point: the killed run verifies as complete"
  # build --check (what jobs/dfm-stage.sbatch asks after its step): the killed stage is not complete
  st=${point%%:*} && chk=$("$DFM" build "$WORK/kill$i.json" --check --stages "$st" 2>&1) && fail "$point: build --check says complete: $chk"
  grep -qE "not complete|has no '|does not exist" <<<"$chk" || fail "$point: build --check does not say what is incomplete: $chk"
  build 2 kill$i || { cat "$WORK/kill$i.log"; fail "$point: re-run after the kill failed"; }
  chk=$("$DFM" build "$WORK/kill$i.json" --check 2>&1) && [ "$(grep -c 'complete in' <<<"$chk")" = 5 ] ||
    fail "$point: build --check after the re-run: $chk"
  same_as_ref kill$i "$point: resumed run differs"; ok "killed at $point, re-run identical"
done

# a full disk: the run directory on a 3 MB tmpfs (or, where mounting is not allowed, a 1 MB file-size
# limit on the dfm processes); the error names the stage and the path; with space the run completes
mkdir -p "$WORK/small"
if mount -t tmpfs -o size=3m tmpfs "$WORK/small" 2>/dev/null; then
  trap 'umount "$WORK/small" 2>/dev/null; [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"' EXIT
  mkcfg disk; sed -i "s|\"run\": \"$WORK/disk\"|\"run\": \"$WORK/small/disk\"|" "$WORK/disk.json"
  build 2 disk && fail "build on a full 3 MB filesystem succeeded"
  mount -o remount,size=256m "$WORK/small" || fail "cannot grow the tmpfs"
  DISKRUN=$WORK/small/disk
else
  mkcfg disk
  if mpirun -np 2 bash -c "ulimit -f 1024; exec '$DFM' build '$WORK/disk.json'" > "$WORK/disk.log" 2>&1; then
    fail "build under a 1 MB file-size limit succeeded"
  fi
  DISKRUN=$WORK/disk
fi
grep -q "no space left" "$WORK/disk.log" || { cat "$WORK/disk.log"; fail "full-disk error does not say so"; }
grep -q "stage" "$WORK/disk.log" || { cat "$WORK/disk.log"; fail "full-disk error does not name the stage"; }
grep -q "$DISKRUN/" "$WORK/disk.log" || { cat "$WORK/disk.log"; fail "full-disk error does not name the path"; }
build 2 disk || { cat "$WORK/disk.log"; fail "re-run with space failed"; }
"$DFM" verify "$DISKRUN" --compare "$WORK/ref" > "$WORK/disk.verify" 2>&1 || { cat "$WORK/disk.verify"; fail "run after the full disk differs"; }
ok "full disk reported, re-run identical"

# changed inputs or options after a run: refused, never mixed
cp "$WORK/corpus.jsonl" "$WORK/changed.jsonl"; mkcfg changed changed
build 2 changed || fail "changed: first build"
head -n 11 "$DFM_CORPUS" | tail -n 1 >> "$WORK/changed.jsonl"
build 2 changed && fail "a changed input was not detected"
grep -q "other inputs or options" "$WORK/changed.log" || { cat "$WORK/changed.log"; fail "changed input: unclear message"; }
ok "changed input refused"
head -n 10 "$DFM_CORPUS" > "$WORK/changed.jsonl"   # the original input again: the run is consistent
build 2 changed || { cat "$WORK/changed.log"; fail "changed: restoring the input did not restore the run"; }
sed -i 's/"seq-len": 256/"seq-len": 512/' "$WORK/changed.json"
build 2 changed && fail "changed options were not detected"
ok "changed options refused"
echo "all build determinism and fault checks passed"
