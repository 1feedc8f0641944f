#!/usr/bin/env bash
# dfm across several Slurm nodes: a localhost cluster of 2 nodes (tests/slurm/slurm_up.sh with
# SLURM_CI_NODES=2: one slurmd per node name on this host), jobs with --nodes 2, srun --mpi=pmix.
#  0. the cluster is real enough: one 4-task step runs 2 tasks on each node (SLURM_NODEID, SLURM_LOCALID),
#     and Open MPI's node-local communicator (MPI_COMM_TYPE_SHARED, what dfm-train's --gpu -1 uses) holds
#     the 2 ranks of each node, not all 4;
#  1. the pipeline chain (jobs/submit.sh --nodes 2 --ntasks 4) gives byte-identical files (chunk shards,
#     embedding blocks, index shards, neighbour blocks, target shards) and the same manifest, timings
#     aside, as a one-node `mpirun -np 4 dfm build`; its config has relative paths, submitted from the
#     folder they are relative to, and the job logs land in that run's jobs/ folder;
#  2. the run lock across nodes: while a 2-node job writes a run (its rank 0 held by SIGSTOP), a writer
#     started on the other node is refused, naming the holder's host, pid, Slurm job and node; the job
#     then completes;
#  3. a rank on the second node dies (DFM_FAULT on rank 3): the chain fails and stops; resubmitted, it
#     completes with the same records as the one-node run;
#  4. dfm-train across 2 nodes (submit_train.sh --nodes 2 --ntasks 2) == mpirun -np 2, byte for byte;
#  5. GPU encoding's request (2 fake GPUs per node, tests/slurm/slurm_up.sh SLURM_CI_GPUS): submit.sh
#     --encode-gpus 2 --nodes 2 --ntasks 4 shows each rank both GPUs of its node, and the node-local
#     ranks are 0 and 1 on each node, so the encoder's choice (node-local rank mod GPUs:
#     dfm_gpu_for_rank, unit-tested in tests/unit/test_common.c; this test checks what it is given) spreads
#     the ranks of a node over its GPUs. A stand-in for dfm prints what each rank sees.
# A 60 KB tokenizer from tests/data and a tiny random encoder (tests/tools/tiny_bert.py) keep it cheap.
# The two nodes share this host's file system, PIDs and host name: what differs between them here is
# Slurm's view (one slurmd, slurmstepd and PMIx server per node) and MPI's (node ids, node-local ranks,
# TCP between nodes).
source "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || fail "the Slurm test starts daemons and needs root"
TRAIN=${DFM_TRAIN:-$DFM_ROOT/build/dfm-train}
[ -x "$TRAIN" ] || fail "no $TRAIN: make build/dfm-train"
WAIT=$DFM_ROOT/tests/slurm/slurm_wait.sh
export SLURM_CI_DIR=$WORK/slurm SLURM_CI_NODES=2 SLURM_CI_GPUS=2
# Between the fake nodes, TCP: Open MPI's shared-memory transport names its segments by host name and
# node-local rank, which two nodes on one host share (on a real cluster they differ).
export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo
# one localhost cluster at a time (the other Slurm tests take the same lock)
exec 9>/tmp/dfm-slurm-tests.lock
flock -w 600 9 || fail "another Slurm test held /tmp/dfm-slurm-tests.lock for 10 minutes"
for _ in $(seq 600); do pgrep -x slurmctld >/dev/null || break; sleep 0.5; done
pgrep -x slurmctld >/dev/null && fail "a slurmctld not started by this test is running (pid $(pgrep -x slurmctld | xargs)):" \
  "another Slurm test, or a leftover; stop it with tests/slurm/slurm_down.sh and its SLURM_CI_DIR"
STOPPED=""
cleanup() {
  [ -n "$STOPPED" ] && kill -CONT "$STOPPED" 2>/dev/null
  "$DFM_ROOT/tests/slurm/slurm_down.sh" >/dev/null 2>&1
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
cd "$WORK" || exit 1
wait_until() { local secs=$1; shift; for _ in $(seq $((secs * 20))); do eval "$1" && return 0; sleep 0.05; done; return 1; }

# ---- data: 3 documents, a tiny encoder; configs with paths relative to $WORK
head -n 3 "$DFM_CORPUS" > corpus.jsonl
"$DFM_PYTHON" "$DFM_ROOT/tests/tools/tiny_bert.py" "$DFM_MODEL" tiny || fail "tiny_bert.py"
mkdir -p cfg
for r in one multi lost gpu; do
  cat > "cfg/$r.json" <<JSON
{"run": "runs/$r", "inputs": ["corpus.jsonl"], "tokenizer": "$DFM_ROOT/tests/data/tokenizer/spm-llama2.tokenizer.json",
 "chunk": {"seq-len": 128}, "encode": {"device": "cpu", "model": "tiny"},
 "write-targets": {"target-shards": 3}}
JSON
done
mpirun -np 4 "$DFM" build cfg/one.json > one.log 2>&1 || { cat one.log; fail "one-node mpirun -np 4 dfm build"; }
ok "one-node reference: mpirun -np 4 dfm build ($(grep -o '[0-9]* records in [0-9]* shards' one.log))"

"$DFM_ROOT/tests/slurm/slurm_up.sh"

# ---- 0. tasks and node-local ranks across the 2 nodes
salloc -N 2 -n 4 --overcommit -t 5 srun --mpi=pmix bash -c 'echo "$SLURM_PROCID $SLURMD_NODENAME $SLURM_NODEID $SLURM_LOCALID"' \
  2>/dev/null | sort -n > tasks.txt
[ "$(xargs < tasks.txt)" = "0 dfm-n1 0 0 1 dfm-n1 0 1 2 dfm-n2 1 0 3 dfm-n2 1 1" ] ||
  fail "4 tasks on 2 nodes should be ranks 0,1 on dfm-n1 and 2,3 on dfm-n2: $(xargs < tasks.txt)"
cat > nodelocal.c <<'C'
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) { /* rank, node-local rank and size of MPI_COMM_TYPE_SHARED, SLURM_NODEID */
    int r, lr, ln;
    MPI_Comm node;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &lr), MPI_Comm_size(node, &ln);
    printf("%d %d/%d %s\n", r, lr, ln, getenv("SLURM_NODEID"));
    MPI_Finalize();
    return 0;
}
C
mpicc -o nodelocal nodelocal.c || fail "mpicc"
salloc -N 2 -n 4 --overcommit -t 5 srun --mpi=pmix ./nodelocal 2>salloc.err | sort -n > nodelocal.txt
[ "$(xargs < nodelocal.txt)" = "0 0/2 0 1 1/2 0 2 0/2 1 3 1/2 1" ] ||
  { cat salloc.err; fail "node-local ranks (rank local/size nodeid): $(xargs < nodelocal.txt)"; }
ok "2 nodes: ranks 0,1 on dfm-n1 and 2,3 on dfm-n2; MPI_COMM_TYPE_SHARED gives node-local ranks 0,1 on each"

SUB=("$DFM_ROOT/jobs/submit.sh" --nodes 2 --ntasks 4 --encode-gpus 0 --overcommit --time 5:00 --dfm "$DFM")
# same(A, B): every stage file of run A equals run B's, byte for byte; the manifests agree but for what is
# measured (timings, seconds in the work records, generations)
same_run() {
  local a=$1 b=$2 f n=0
  for f in $(cd "$b" && find chunk encode index retrieve targets -type f | sort); do
    cmp -s "$a/$f" "$b/$f" || fail "$a/$f differs from $b/$f"
    n=$((n + 1))
  done
  [ "$(cd "$a" && find chunk encode index retrieve targets -type f | sort | xargs)" = \
    "$(cd "$b" && find chunk encode index retrieve targets -type f | sort | xargs)" ] || fail "$a and $b hold different files"
  "$DFM_PYTHON" - "$a/manifest.json" "$b/manifest.json" <<'PY' || fail "the manifests of $a and $b differ"
import json, sys
def strip(x):
    if isinstance(x, dict):
        # measured, not produced: timings, clocks, and the work records' seconds (cpu_s, mpi_s, search_cpu_s, ...)
        return {k: strip(v) for k, v in x.items()
                if k not in ("timings", "time_s", "started", "finished", "generation") and not k.endswith("_s")}
    return [strip(v) for v in x] if isinstance(x, list) else x
a, b = (strip(json.load(open(p))) for p in sys.argv[1:])
if a != b:
    for s in sorted(set(a["stages"]) | set(b["stages"])):
        if a["stages"].get(s) != b["stages"].get(s):
            print(f"stage {s}:\n  {json.dumps(a['stages'].get(s))[:600]}\n  {json.dumps(b['stages'].get(s))[:600]}")
    sys.exit(1)
PY
  "$DFM" verify "$a" --compare "$b" > verify.log 2>&1 || { cat verify.log; fail "dfm verify $a --compare $b"; }
  echo "$n files"
}

# ---- 1. the chain across 2 nodes == the one-node run
"${SUB[@]}" cfg/multi.json > multi.ids
"$WAIT" $(awk '{print $2}' multi.ids) || { tail -n 20 runs/multi/jobs/*.out; fail "2-node chain did not complete"; }
for s in chunk encode index retrieve write-targets; do
  id=$(awk -v s=$s '$1 == s {print $2}' runs/multi/jobs/submitted.txt)
  grep -q "on dfm-n\[1-2\], 4 tasks" "runs/multi/jobs/$s-$id.out" || { cat "runs/multi/jobs/$s-$id.out"; fail "$s did not run 4 tasks on dfm-n[1-2]"; }
done
[ ! -e cfg/runs ] || fail "submit.sh resolved the relative run path against the config's folder, dfm against the working folder"
files=$(same_run runs/multi runs/one)
ok "chain on 2 nodes x 2 tasks == one node x 4 ranks: $files byte-identical, same manifest, dfm verify --compare"

# ---- 2. the run lock: a writer on the other node is refused while a 2-node job holds it
A=(--synthetic 30000 --k 8 --d 64 --target-shards 4)
a=$(sbatch --parsable -N 2 -n 4 --overcommit -t 5 -o lockjob.out --wrap "srun --mpi=pmix $DFM write-targets $WORK/lockrun ${A[*]}")
holder() {  # the pid in lockrun/.lock, if it is alive and a process of job $a
  local p
  p=$(sed -n 's/^host [^ ]* pid \([0-9]*\) .*/\1/p' lockrun/.lock 2>/dev/null)
  [ -n "$p" ] && grep -qx "SLURM_JOB_ID=$a" <<<"$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null)" && echo "$p"
}
wait_until 60 '[ -n "$(holder)" ]' || { cat lockjob.out; fail "job $a never held the lock of lockrun (too fast? make --synthetic larger)"; }
STOPPED=$(holder)
kill -STOP "$STOPPED"
env_of_holder=$(tr '\0' '\n' < "/proc/$STOPPED/environ")
grep -qx "SLURM_NODEID=0" <<<"$env_of_holder" ||
  fail "the lock holder (pid $STOPPED) is not on the first node: $(grep '^SLURM_NODE\|^SLURMD_NODENAME\|^SLURM_PROCID' <<<"$env_of_holder" | xargs)"
srun --mpi=pmix -w dfm-n2 -N 1 -n 1 -t 5 "$DFM" write-targets "$WORK/lockrun" "${A[@]}" > second.log 2>&1 &&
  fail "a second writer on dfm-n2 was not refused"
grep -q "is being written by another process: host $(hostname) pid $STOPPED command .* (Slurm job $a, node dfm-n1)" second.log ||
  { cat second.log; fail "the refusal does not name the holder's pid $STOPPED, job $a and node dfm-n1"; }
kill -CONT "$STOPPED"; STOPPED=""
"$WAIT" "$a" >/dev/null || { cat lockjob.out; fail "the lock-holding job did not complete"; }
"$DFM" verify lockrun > verify.log 2>&1 || { cat verify.log; fail "verify of the lock-holding job's run"; }
ok "run lock: rank 0 of a 2-node job holds it; a writer on dfm-n2 is refused naming its pid, job and node; the job completes"

# ---- 3. a rank on the second node dies in the chunk stage; the chain stops; resubmitted, it completes
DFM_FAULT=chunk:shard-written DFM_FAULT_RANK=3 "${SUB[@]}" cfg/lost.json > lost.ids
"$WAIT" $(awk '{print $2}' lost.ids) > lost.states && fail "a chain with a dead rank reported success"
grep -q "JobState=FAILED" lost.states && [ "$(grep -c CANCELLED lost.states)" = 4 ] ||
  fail "the chunk job should fail and the other 4 be cancelled: $(cat lost.states)"
"$DFM" verify runs/lost > /dev/null 2>&1 && fail "a failed run verified as complete"
"${SUB[@]}" cfg/lost.json > lost2.ids
"$WAIT" $(awk '{print $2}' lost2.ids) || { tail -n 20 runs/lost/jobs/*.out; fail "the resubmitted chain failed"; }
files=$(same_run runs/lost runs/one)
ok "a rank lost on dfm-n2: the chain stopped (chunk FAILED, 4 CANCELLED); resubmitted == one-node run ($files)"

# ---- 4. dfm-train across 2 nodes == mpirun -np 2
"$TRAIN" synth --out data --seqs 64 --seq-len 64 --chunk-len 16 --vocab 200 --slots 3 --d-mem 16 > synth.log 2>&1 ||
  { cat synth.log; fail "synth"; }
COMMON=(--seq-len 64 --batch 4 --lr 3e-3 --warmup 2 --val-seqs 4 --threads 1 --seed 5)
"$TRAIN" pretrain --out pre --data data/tokens.bin --layers 1 --hidden 32 --heads 4 --kv-heads 2 --steps 2 "${COMMON[@]}" \
  > pre.log 2>&1 || { cat pre.log; fail "pretrain"; }
DFMF=(--data data/tokens.bin --targets data/targets.bin --chunk-len 16 --fusion-layers 0 --pred-hidden 32 --pred-heads 2
      --proj-hidden 24 --steps 12 --ckpt-every 6 --backbone pre/model "${COMMON[@]}")
mpirun -np 2 "$TRAIN" train --out direct "${DFMF[@]}" > direct.log 2>&1 || { cat direct.log; fail "mpirun -np 2 dfm-train train"; }
t=$("$DFM_ROOT/jobs/submit_train.sh" train --nodes 2 --ntasks 2 --overcommit --time 10:00 --dfm-train "$TRAIN" -- --out slurm "${DFMF[@]}")
"$WAIT" "$t" || { cat slurm/jobs/*.out; fail "the 2-node train job did not complete"; }
grep -q "on dfm-n\[1-2\], 2 tasks" "slurm/jobs/train-$t.out" || { head -n 3 "slurm/jobs/train-$t.out"; fail "the train job did not run on dfm-n[1-2]"; }
for f in ckpt_000006.bin ckpt_final.bin dfm_modules.safetensors; do
  cmp -s "slurm/$f" "direct/$f" || fail "dfm-train on 2 nodes: $f differs from mpirun -np 2"
done
ok "dfm-train train on 2 nodes x 1 task == mpirun -np 2 (checkpoints and modules byte-identical)"

# ---- 5. GPU encoding on 2 nodes x 2 fake GPUs
printf '#!/bin/sh\necho "RANK $SLURM_PROCID $SLURMD_NODENAME local $SLURM_LOCALID sees ${CUDA_VISIBLE_DEVICES-all}"\n' > stub.sh
chmod +x stub.sh
"$DFM_ROOT/jobs/submit.sh" cfg/gpu.json --stages encode --nodes 2 --ntasks 4 --encode-gpus 2 --overcommit --time 5:00 \
  --dfm stub.sh > gpu.ids 2>&1 || { cat gpu.ids; fail "submit.sh --encode-gpus 2"; }
"$WAIT" "$(awk '{print $2}' gpu.ids)" > /dev/null || { cat runs/gpu/jobs/*.out; fail "the GPU encode job"; }
seen=$(grep -ho 'RANK .*' runs/gpu/jobs/encode-*.out | sort | xargs)
[ "$seen" = "RANK 0 dfm-n1 local 0 sees 0,1 RANK 1 dfm-n1 local 1 sees 0,1 RANK 2 dfm-n2 local 0 sees 0,1 RANK 3 dfm-n2 local 1 sees 0,1" ] ||
  fail "--encode-gpus 2 on 2 nodes: each rank should see its node's 2 GPUs, node-local ranks 0 and 1: $seen"
ok "--encode-gpus 2 on 2 nodes: every rank sees GPUs 0,1 of its node; node-local ranks 0,1 on each -> GPUs 0 and 1"
echo "all multi-node Slurm checks passed"
