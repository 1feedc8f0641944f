#!/usr/bin/env bash
# dfm write-targets under MPI: the same records on 1..4 ranks (both store options), complete shards
# skipped on a re-run, and a rank killed mid-shard leaves nothing verify/readers take for complete.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
DFM=${DFM:-$ROOT/build/dfm}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader} OMPI_MCA_btl_vader_single_copy_mechanism=none DFM_LOG_LEVEL=warn
T=$(mktemp -d /tmp/dfm-targets-mpi-XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ARGS=(--synthetic 1500 --k 8 --d 48 --target-shards 5 --block-queries 97 --seq-chunks 8)

for store in embeddings ids; do
  for np in 1 2 3 4; do
    mpirun -np $np "$DFM" write-targets "$T/$store-$np" "${ARGS[@]}" --store $store --threads $(( np % 2 + 1 )) >"$T/out" 2>&1 || { cat "$T/out"; fail "write-targets -np $np --store $store"; }
    grep -q "1500 records in 5 shards (5 built" "$T/out" || { cat "$T/out"; fail "unexpected summary"; }
    "$DFM" verify "$T/$store-$np" --recompute-records 0.2 >/dev/null || fail "verify of -np $np --store $store"
    if [ $np -gt 1 ]; then
      "$DFM" verify "$T/$store-$np" --compare "$T/$store-1" >/dev/null || fail "records on $np ranks differ from 1 rank ($store)"
    fi
  done
  echo "ok: --store $store: identical records on 1, 2, 3, 4 ranks (1 or 2 encoding threads)"
done
# both store options serve the same embeddings
"$DFM" verify "$T/ids-2" --compare "$T/embeddings-3" >/dev/null || fail "store ids and store embeddings read differently"
# a different seed must NOT compare equal
mpirun -np 2 "$DFM" write-targets "$T/other" "${ARGS[@]}" --seed 5 >/dev/null 2>&1 || fail "write other"
if "$DFM" verify "$T/other" --compare "$T/embeddings-1" >/dev/null 2>"$T/err"; then fail "--compare passed on different runs"; fi
grep -q "differs between" "$T/err" || { cat "$T/err"; fail "--compare did not name the differing key"; }
echo "ok: --compare tells different runs apart: $(tail -1 "$T/err")"

# re-run: everything complete, the stage is skipped
DFM_LOG_LEVEL=info mpirun -np 3 "$DFM" write-targets "$T/embeddings-2" "${ARGS[@]}" >"$T/out" 2>&1 || fail "re-run"
grep -q "targets stage of .* is already complete" "$T/out" || { cat "$T/out"; fail "re-run of a complete stage not skipped"; }
# changing a format option is refused, and with --force rebuilds everything
if mpirun -np 2 "$DFM" write-targets "$T/embeddings-2" "${ARGS[@]}" --dtype bf16 >"$T/out" 2>&1; then fail "a changed dtype was not refused"; fi
grep -q "'dtype' was" "$T/out" || { cat "$T/out"; fail "the refusal does not name --dtype"; }
mpirun -np 2 "$DFM" write-targets "$T/embeddings-2" "${ARGS[@]}" --dtype bf16 --force >"$T/out" 2>&1 || fail "re-run bf16"
grep -q "(5 built, 0 complete already)" "$T/out" || { cat "$T/out"; fail "a changed dtype did not rebuild"; }
# fewer shards: the surplus folders of the earlier configuration go away, the records stay the same
mpirun -np 2 "$DFM" write-targets "$T/embeddings-2" "${ARGS[@]}" --target-shards 3 --force >"$T/out" 2>&1 || fail "re-run with 3 shards"
[ "$(ls "$T/embeddings-2/targets" | tr '\n' ' ')" = "shard-00000 shard-00001 shard-00002 " ] || { ls "$T/embeddings-2/targets"; fail "stale shard folders left"; }
"$DFM" verify "$T/embeddings-2" --compare "$T/embeddings-1" >/dev/null || fail "3 shards differ from 5 shards"
echo "ok: re-runs skip complete shards and rebuild changed ones; shard count changes keep the records"

# a rank killed mid-shard (fault injection: SIGKILL after 400 records of that process)
R=$T/killed
if DFM_FAULT_TARGETS_KILL_AFTER=400 mpirun -np 2 "$DFM" write-targets "$R" "${ARGS[@]}" >"$T/out" 2>&1; then fail "the killed run succeeded"; fi
compgen -G "$R/targets/*.tmp" >/dev/null || { ls -la "$R/targets"; fail "no .tmp folder left by the killed writer"; }
if "$DFM" verify "$R" >/dev/null 2>"$T/err"; then fail "verify passed on a killed run"; fi
grep -q "not complete" "$T/err" || { cat "$T/err"; fail "verify did not say the targets are incomplete"; }
# pretend the manifest had been completed by hand: the shard folders still give it away
sed -i 's/"state": "running"/"state": "complete"/' "$R/manifest.json"
if "$DFM" verify "$R" >/dev/null 2>"$T/err"; then fail "verify passed on a killed run with a doctored manifest"; fi
grep -q "incomplete\|shard.json" "$T/err" || { cat "$T/err"; fail "verify did not name the incomplete shard"; }
mpirun -np 3 "$DFM" write-targets "$R" "${ARGS[@]}" >"$T/out" 2>&1 || { cat "$T/out"; fail "re-run after kill"; }
[ -d "$R/targets" ] || fail "no targets folder after the re-run"
compgen -G "$R/targets/*.tmp" >/dev/null && fail ".tmp folder left after the re-run: $(ls "$R/targets")"
"$DFM" verify "$R" --compare "$T/embeddings-1" >/dev/null || fail "re-run after kill differs from the reference"
echo "ok: killed writer leaves only .tmp; re-run completes it ($(grep -o '[0-9]* built, [0-9]* complete already' "$T/out"))"
# the shared fault points (common/fault.h): rank 1 dies half-way through its first shard
R=$T/fault
if DFM_FAULT=write-targets:mid-shard DFM_FAULT_RANK=1 mpirun -np 2 "$DFM" write-targets "$R" "${ARGS[@]}" >"$T/out" 2>&1; then fail "DFM_FAULT run succeeded"; fi
if "$DFM" verify "$R" >/dev/null 2>&1; then fail "verify passed after DFM_FAULT"; fi
mpirun -np 4 "$DFM" write-targets "$R" "${ARGS[@]}" >"$T/out" 2>&1 || { cat "$T/out"; fail "re-run after DFM_FAULT"; }
"$DFM" verify "$R" --compare "$T/embeddings-1" >/dev/null || fail "re-run after DFM_FAULT differs from the reference"
echo "ok: DFM_FAULT=write-targets:mid-shard on rank 1, then a re-run on 4 ranks: same records ($(grep -o '[0-9]* built, [0-9]* complete already' "$T/out"))"
# rank 0 dies right after its first shard is complete: the re-run keeps that shard
R=$T/fault2
if DFM_FAULT=write-targets:shard-complete DFM_FAULT_RANK=0 mpirun -np 2 "$DFM" write-targets "$R" "${ARGS[@]}" >"$T/out" 2>&1; then fail "DFM_FAULT run succeeded"; fi
[ -f "$R/targets/shard-00000/shard.json" ] || fail "the shard completed before the fault is missing"
mpirun -np 3 "$DFM" write-targets "$R" "${ARGS[@]}" >"$T/out" 2>&1 || { cat "$T/out"; fail "re-run after shard-complete fault"; }
grep -Eq "\([1-4] built, [1-4] complete already\)" "$T/out" || { cat "$T/out"; fail "re-run did not keep the complete shard"; }
"$DFM" verify "$R" --compare "$T/embeddings-1" >/dev/null || fail "re-run after shard-complete fault differs"
echo "ok: DFM_FAULT=write-targets:shard-complete on rank 0: re-run keeps it ($(grep -o '[0-9]* built, [0-9]* complete already' "$T/out"))"
echo "test_targets_mpi: all ok"
