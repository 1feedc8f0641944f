#!/usr/bin/env bash
# The pipeline as a chain of Slurm jobs on a real localhost cluster (tests/slurm/):
#  1. jobs/submit.sh gives the same target records as a direct `dfm build` (dfm verify --compare);
#  2. a chain whose running job is cancelled midway completes when resubmitted, with the same records.
source "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || fail "the Slurm test starts daemons and needs root"
export SLURM_CI_DIR=$WORK/slurm
# one localhost cluster at a time (tests/integration/slurm/test_slurm_train.sh takes the same lock)
exec 9>/tmp/dfm-slurm-tests.lock
flock -w 600 9 || fail "another Slurm test held /tmp/dfm-slurm-tests.lock for 10 minutes"
cleanup() { "$DFM_ROOT/tests/slurm/slurm_down.sh" >/dev/null 2>&1; [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT
"$DFM_ROOT/tests/slurm/slurm_up.sh"
# no daemon holds this test's lock: one that outlived a killed test would block every later Slurm test
for p in $(pgrep -x munged) $(pgrep -x slurmctld) $(pgrep -x slurmd); do
  for f in /proc/"$p"/fd/*; do
    [ "$(readlink "$f" 2>/dev/null)" = /tmp/dfm-slurm-tests.lock ] && fail "daemon $p ($(cat /proc/"$p"/comm)) holds the test lock"
  done
done
ok "the Slurm daemons hold no caller's descriptor (the test lock)"

head -n 12 "$DFM_CORPUS" > "$WORK/corpus.jsonl"
mkcfg() {  # name -> config file for run directory $WORK/name
  cat > "$WORK/$1.json" <<JSON
{"run": "$WORK/$1", "inputs": ["$WORK/corpus.jsonl"], "tokenizer": "$DFM_TOKENIZER",
 "chunk": {"seq-len": 256}, "encode": {"device": "cpu", "model": "$DFM_MODEL"},
 "write-targets": {"target-shards": 2}}
JSON
}
for r in direct chain cancelled; do mkcfg $r; done

mpirun -np 2 "$DFM" build "$WORK/direct.json" > "$WORK/direct.log" 2>&1 || { cat "$WORK/direct.log"; fail "direct build"; }
ok "direct dfm build"

SUB=("$DFM_ROOT/jobs/submit.sh" --ntasks 2 --encode-gpus 0 --overcommit --time 20:00 --dfm "$DFM")
"${SUB[@]}" "$WORK/chain.json" > "$WORK/chain.ids"
"$DFM_ROOT/tests/slurm/slurm_wait.sh" $(awk '{print $2}' "$WORK/chain.ids") || { tail -n 30 "$WORK"/chain/jobs/*.out; fail "chain did not complete"; }
"$DFM" verify "$WORK/chain" --compare "$WORK/direct" > "$WORK/verify1.log" 2>&1 || { cat "$WORK/verify1.log"; fail "chain output differs from direct build"; }
ok "Slurm chain == direct build"

# cancel the encode job while it runs; its dependents are cancelled with it (kill_invalid_depend)
"${SUB[@]}" "$WORK/cancelled.json" > "$WORK/cancelled.ids"
enc=$(awk '$1 == "encode" {print $2}' "$WORK/cancelled.ids")
for _ in $(seq 600); do [ "$(squeue -h -j "$enc" -o %T 2>/dev/null)" = RUNNING ] && break; sleep 0.2; done
sleep 2
scancel "$enc"
"$DFM_ROOT/tests/slurm/slurm_wait.sh" $(awk '{print $2}' "$WORK/cancelled.ids") && fail "cancelled chain reported success"
"$DFM" verify "$WORK/cancelled" >/dev/null 2>&1 && fail "a cancelled run verified as complete"
ok "cancelled chain stopped and is not mistaken for complete"
"${SUB[@]}" "$WORK/cancelled.json" > "$WORK/resubmitted.ids"
"$DFM_ROOT/tests/slurm/slurm_wait.sh" $(awk '{print $2}' "$WORK/resubmitted.ids") || { tail -n 30 "$WORK"/cancelled/jobs/*.out; fail "resubmitted chain failed"; }
"$DFM" verify "$WORK/cancelled" --compare "$WORK/direct" > "$WORK/verify2.log" 2>&1 || { cat "$WORK/verify2.log"; fail "resubmitted output differs"; }
ok "resubmitted chain completes with the same records"
echo "all Slurm checks passed"
