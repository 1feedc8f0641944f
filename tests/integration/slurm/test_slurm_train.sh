#!/usr/bin/env bash
# dfm-train as Slurm jobs (jobs/submit_train.sh, jobs/dfm-train.sbatch) on a real localhost cluster
# (tests/slurm/), on the CPU:
#  0. without Slurm: the job script's choice of checkpoint and its srun line (a stand-in srun), and
#     submit_train.sh's GPU request (--dry-run);
#  1. pretrain (1 task) and train (2 tasks, --after the pretrain job) give byte-identical files to direct
#     runs (dfm-train pretrain; mpirun -np 2 dfm-train train); an eval job prints the same numbers;
#  2. a train job cancelled after its first checkpoint and resubmitted resumes from the newest
#     checkpoint and ends byte-identical (a submission while it runs is refused); resubmitting a
#     complete run does nothing;
#  3. USR1 (what --signal=B:USR1@S sends before the time limit): the job script passes it to the ranks,
#     dfm-train checkpoints the step it is at and exits 75, the script requeues the job; the restart
#     resumes from that checkpoint (every step logged exactly once: none lost, none redone) and ends
#     byte-identical. The same through `scontrol requeue` (SIGTERM from Slurm), and through a real short
#     --time with --signal (a 1-minute limit, USR1 50 s before it);
#  4. a bad flag: the job FAILS (non-zero exit code) and its log names the flag;
#  5. GPU requests on 2 fake GPUs (part of the set-up: tests/slurm/slurm_up.sh with SLURM_CI_GPUS=2; the
#     test fails without them): --device cuda gets one GPU per rank, each rank sees its own;
#     --gpus-per-node 2 shows both to each rank; asking for more GPUs than the node has is refused at
#     submission. A stand-in prints what each rank sees (the rank's choice among what it sees:
#     dfm_gpu_for_rank, tests/unit/test_common.c).
source "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || fail "the Slurm test starts daemons and needs root"
TRAIN=${DFM_TRAIN:-$DFM_ROOT/build/dfm-train}
[ -x "$TRAIN" ] || fail "no $TRAIN: make build/dfm-train"
SUB=$DFM_ROOT/jobs/submit_train.sh
WAIT=$DFM_ROOT/tests/slurm/slurm_wait.sh
export SLURM_CI_DIR=$WORK/slurm
# one localhost cluster at a time: a lock for tests that take it, and a wait for any other slurmctld
exec 9>/tmp/dfm-slurm-tests.lock
flock -w 600 9 || fail "another Slurm test held /tmp/dfm-slurm-tests.lock for 10 minutes"
for _ in $(seq 600); do pgrep -x slurmctld >/dev/null || break; sleep 0.5; done
pgrep -x slurmctld >/dev/null && fail "a slurmctld not started by this test is running (pid $(pgrep -x slurmctld | xargs)):" \
  "another Slurm test, or a leftover; stop it with tests/slurm/slurm_down.sh and its SLURM_CI_DIR"
cleanup() { "$DFM_ROOT/tests/slurm/slurm_down.sh" >/dev/null 2>&1; [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT
# until COND is true (polling every 0.05 s, at most SECS seconds)
wait_until() { local secs=$1; shift; for _ in $(seq $((secs * 20))); do eval "$1" && return 0; sleep 0.05; done; return 1; }
same() { cmp -s "$1" "$2" || fail "$3: $1 differs from $2"; }
# the run OUT's log holds steps 1..N, each exactly once (through every stop and restart)
steps_once() {
  "$DFM_PYTHON" - "$1/log.jsonl" "$2" <<'PY'
import json, sys
s = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"loss"' in l]
n = int(sys.argv[2])
if s != list(range(1, n + 1)):
    sys.exit("steps logged: %d lines, %d distinct, want 1..%d once each" % (len(s), len(set(s)), n))
PY
}
cd "$WORK" || exit 1

# ---- tiny data, model and run: 120 steps of ~12 ms (time to cancel between checkpoints); 121 training
# sequences and 8 per step, so that no checkpoint falls on the end of an epoch (see the lead's report)
"$TRAIN" synth --out data --seqs 128 --seq-len 128 --chunk-len 16 --vocab 200 --slots 3 --d-mem 16 >synth.log 2>&1 ||
  { cat synth.log; fail "synth"; }
COMMON=(--seq-len 128 --batch 4 --lr 3e-3 --warmup 2 --val-seqs 7 --threads 1 --seed 5)
PRE=(--data data/tokens.bin --layers 2 --hidden 32 --heads 4 --kv-heads 2 --steps 4 --ckpt-every 2 "${COMMON[@]}")
DFMF=(--data data/tokens.bin --targets data/targets.bin --chunk-len 16 --fusion-layers '0,1' --pred-hidden 32
      --pred-heads 2 --proj-hidden 24 --steps 120 --ckpt-every 20 "${COMMON[@]}")
EVALF=(--data data/tokens.bin --targets data/targets.bin --seq-len 128 --batch 4 --val-seqs 7 --threads 1)

# ---- 0. without Slurm
mkdir -p fakebin fake/out
# the stand-in srun: records its arguments (one line a launch); with FAKE_NOLAUNCH=N it "fails to launch"
# its first N times (exit 0, nothing run, as Slurm 22.05's srun when a step aborts before it launched); then,
# with FAKE_FINISH=1, it finishes the run (ckpt_final.bin and the export)
cat > fakebin/srun <<EOF
#!/bin/sh
echo "\$@" >> $WORK/fake/srun.args
n=\$(cat $WORK/fake/nolaunch 2>/dev/null || echo 0)
[ "\$n" -gt 0 ] && { echo \$((n - 1)) > $WORK/fake/nolaunch; echo "srun: error: task 0 launch failed: Unspecified error" >&2; exit 0; }
[ "\${FAKE_FINISH:-0}" = 1 ] && echo x > $WORK/fake/out/ckpt_final.bin && echo x > $WORK/fake/out/dfm_modules.safetensors
exit 0
EOF
chmod +x fakebin/srun
fake_job() {  # GPU_BIND MODE FLAGS... -> the job script's stdout (its status is not checked); srun's arguments in fake/srun.args
  local g=$1; shift; rm -f fake/srun.args
  env PATH="$WORK/fakebin:$PATH" DFM_TRAIN_BIN=/bin/true DFM_OUT="$WORK/fake/out" DFM_GPU_BIND="$g" SLURM_JOB_ID=0 \
    SLURM_JOB_NODELIST=localhost SLURM_NTASKS=2 DFM_LAUNCH_TRIES=${TRIES:-1} bash "$DFM_ROOT/jobs/dfm-train.sbatch" "$@" 2>&1 || true
}
out=$(fake_job "" train --out fake/out)
grep -q -- '--mpi=pmix --kill-on-bad-exit=1 /bin/true train --out fake/out$' fake/srun.args ||
  fail "srun line without GPUs: $(cat fake/srun.args)"
grep -q "FAILED: dfm-train train did not run to the end" <<<"$out" ||
  fail "srun exited 0 with the run incomplete, and the job script did not fail: $out"
touch fake/out/ckpt_000090.bin fake/out/ckpt_000120.bin fake/out/ckpt_000150.bin.tmp.77 fake/out/ckpt_1000000.bin.x
fake_job closest train --out fake/out >/dev/null
grep -q -- "--gpu-bind=closest /bin/true train --out fake/out --resume $WORK/fake/out/ckpt_000120.bin$" fake/srun.args ||
  fail "--gpu-bind / newest checkpoint by step: $(cat fake/srun.args)"
touch fake/out/ckpt_999999.bin fake/out/ckpt_1000001.bin
fake_job "" train --out fake/out >/dev/null
grep -q -- "--resume $WORK/fake/out/ckpt_1000001.bin$" fake/srun.args || fail "newest checkpoint by number: $(cat fake/srun.args)"
rm fake/out/ckpt_999999.bin fake/out/ckpt_1000001.bin
echo x > fake/out/ckpt_final.bin
fake_job "" train --out fake/out >/dev/null
grep -q -- "--resume $WORK/fake/out/ckpt_final.bin$" fake/srun.args || fail "ckpt_final.bin without the export: $(cat fake/srun.args)"
echo x > fake/out/dfm_modules.safetensors
out=$(fake_job "" train --out fake/out)
[ ! -e fake/srun.args ] && grep -q "is complete" <<<"$out" || fail "a complete run started srun: $out"
ok "job script: newest checkpoint by step number, ckpt_final.bin, complete run, --gpu-bind passed on, srun's 0 with the run incomplete fails"
# a step that does not launch, twice, then runs: the script launches again (from the newest checkpoint) and ends done
rm -f fake/out/ckpt_final.bin fake/out/dfm_modules.safetensors && echo 2 > fake/nolaunch
out=$(TRIES=3 FAKE_FINISH=1 fake_job "" train --out fake/out)
[ "$(grep -c -- "--resume $WORK/fake/out/ckpt_000120.bin$" fake/srun.args)" = 3 ] && grep -q "launch 2 of 3" <<<"$out" &&
  grep -q "train done" <<<"$out" || fail "a step that did not launch was not launched again: $out"
ok "job script: a step that fails to launch (srun exits 0, nothing ran) is launched again, then done"
# a restart while the previous run's step 0.0 is still listed (a stand-in squeue lists it 3 more times): the
# job script waits for it to go before it launches
rm -f fake/out/ckpt_final.bin fake/out/dfm_modules.safetensors && echo 3 > fake/steps_left
printf '#!/bin/sh\nn=$(cat %s/fake/steps_left)\n[ "$n" -gt 0 ] && { echo $((n - 1)) > %s/fake/steps_left; printf "0.batch\\n0.0\\n"; exit 0; }\necho 0.batch\n' \
  "$WORK" "$WORK" > fakebin/squeue && chmod +x fakebin/squeue
out=$(SLURM_RESTART_COUNT=1 FAKE_FINISH=1 fake_job "" train --out fake/out)
[ "$(cat fake/steps_left)" = 0 ] && grep -q "previous run is still ending: waiting" <<<"$out" && grep -q "train done" <<<"$out" ||
  fail "a restart did not wait for the previous run's step: $out"
rm fakebin/squeue
ok "job script: a restart waits until the previous run's step is gone, then launches"
dry=$("$SUB" train --ntasks 2 --dry-run -- --out o --device cuda --ckpt-every 5 2>&1)
grep -q -- '--gpus-per-task 1 ' <<<"$dry" && grep -q 'build-cuda/dfm-train' <<<"$dry" ||
  fail "--device cuda does not request one GPU per task from build-cuda: $dry"
dry=$("$SUB" train --ntasks 2 --dry-run -- --out o --ckpt-every 5 2>&1)
if grep -qE -- '--gpus|--gres' <<<"$dry" || ! grep -q 'build/dfm-train' <<<"$dry"; then
  fail "a CPU run requests GPUs or the wrong binary: $dry"
fi
ok "submit_train.sh: --device cuda requests --gpus-per-task 1 and build-cuda/dfm-train; a CPU run no GPUs"
expect_fail "no --out DIR" "$SUB" train -- "${DFMF[@]}"
expect_fail "--device cuda with no GPUs" "$SUB" train --gpus-per-task 0 -- --out o --device cuda

# ---- direct runs (the reference)
"$TRAIN" pretrain --out direct_pre "${PRE[@]}" >direct_pre.log 2>&1 || { cat direct_pre.log; fail "direct pretrain"; }
mpirun -np 2 "$TRAIN" train --out direct "${DFMF[@]}" --backbone direct_pre/model >direct.log 2>&1 ||
  { cat direct.log; fail "direct mpirun -np 2 train"; }
"$TRAIN" eval --modules direct/dfm_modules.safetensors --backbone direct_pre/model "${EVALF[@]}" 2>/dev/null |
  tail -n 1 >direct_eval.json || fail "direct eval"
ok "direct pretrain, mpirun -np 2 train, eval"

export SLURM_CI_GPUS=2 # fake GPUs for check 5
"${SLURM_UP:-$DFM_ROOT/tests/slurm/slurm_up.sh}"
gres=$(sinfo -h -o %G)
grep -q 'gpu:2' <<<"$gres" || fail "the cluster advertises no 2 fake GPUs (sinfo: '$gres'): tests/slurm/slurm_up.sh with SLURM_CI_GPUS=2 should have made them"
S=("$SUB" --overcommit --time 10:00 --dfm-train "$TRAIN")
# the jobs that are cancelled or requeued while they run sleep this long before each step (common/fault.h): the
# 100 steps after their first checkpoint then take at least 10 s, so a loaded machine cannot finish them before the
# test's signal (it once did); what they compute is unchanged
HOLD_MS=100

# ---- 1. through Slurm == direct
pre=$("${S[@]}" pretrain -- --out slurm_pre "${PRE[@]}")
tr=$("${S[@]}" train --ntasks 2 --after "$pre" -- --out slurm "${DFMF[@]}" --backbone slurm_pre/model)
"$WAIT" "$pre" "$tr" || { tail -n 20 slurm_pre/jobs/*.out slurm/jobs/*.out; fail "pretrain/train jobs did not complete"; }
[ "$(cat slurm/jobs/submitted.txt)" = "train $tr" ] || fail "submitted.txt: $(cat slurm/jobs/submitted.txt)"
grep -q "2 tasks" "slurm/jobs/train-$tr.out" || fail "the train job did not run 2 tasks"
same slurm_pre/model/model.safetensors direct_pre/model/model.safetensors "Slurm pretrain"
same slurm/ckpt_final.bin direct/ckpt_final.bin "Slurm train (2 tasks)"
same slurm/dfm_modules.safetensors direct/dfm_modules.safetensors "Slurm train (2 tasks)"
ev=$("${S[@]}" eval -- --out slurm_eval --modules slurm/dfm_modules.safetensors --backbone slurm_pre/model "${EVALF[@]}")
"$WAIT" "$ev" || { cat slurm_eval/jobs/*.out; fail "eval job"; }
grep -qxF "$(cat direct_eval.json)" "slurm_eval/jobs/train-$ev.out" || fail "eval job's numbers differ from $(cat direct_eval.json)"
ok "Slurm pretrain -> train (2 tasks, --after) -> eval == direct runs, byte for byte"

# ---- 2. scancel after the first checkpoint, resubmit
c1=$(DFM_FAULT_DELAY_MS=$HOLD_MS "${S[@]}" train --ntasks 2 -- --out cancelled "${DFMF[@]}" --backbone direct_pre/model)
# (refused while the job is queued or running: checked first, so that the cancel follows the first checkpoint at
# once; checked between them, the run once finished under load before the cancel came)
expect_fail "job $c1 for $WORK/cancelled is still queued or running" "${S[@]}" train -- --out cancelled "${DFMF[@]}"
wait_until 120 '[ -e cancelled/ckpt_000020.bin ]' || { cat cancelled/jobs/*.out; fail "no first checkpoint"; }
scancel "$c1"
"$WAIT" "$c1" >/dev/null && fail "a cancelled job reported success"
[ -e cancelled/ckpt_final.bin ] && fail "the job ended before scancel stopped it: make the run longer"
newest=$(cd cancelled && printf '%s\n' ckpt_[0-9]*.bin | sort -t_ -k2,2n | tail -n 1)
c2=$("${S[@]}" train --ntasks 2 -- --out cancelled "${DFMF[@]}" --backbone direct_pre/model)
"$WAIT" "$c2" || { cat "cancelled/jobs/train-$c2.out"; fail "resubmitted job"; }
grep -q "resumed from $WORK/cancelled/$newest at step" "cancelled/jobs/train-$c2.out" ||
  { grep -v 'INFO\] step' "cancelled/jobs/train-$c2.out"; fail "the resubmitted job did not resume from $newest"; }
same cancelled/ckpt_final.bin direct/ckpt_final.bin "cancelled + resubmitted"
same cancelled/dfm_modules.safetensors direct/dfm_modules.safetensors "cancelled + resubmitted"
ok "cancelled after a checkpoint, resubmitted: resumed from $newest, identical result"
before=$(stat -c '%i %y' cancelled/ckpt_final.bin cancelled/dfm_modules.safetensors)
c3=$("${S[@]}" train --ntasks 2 -- --out cancelled "${DFMF[@]}" --backbone direct_pre/model)
"$WAIT" "$c3" >/dev/null || { cat "cancelled/jobs/train-$c3.out"; fail "resubmitted complete run"; }
grep -q "is complete" "cancelled/jobs/train-$c3.out" && ! grep -q "resumed from" "cancelled/jobs/train-$c3.out" &&
  [ "$(stat -c '%i %y' cancelled/ckpt_final.bin cancelled/dfm_modules.safetensors)" = "$before" ] ||
  { cat "cancelled/jobs/train-$c3.out"; fail "a complete run was trained again"; }
[ "$(wc -l <cancelled/jobs/submitted.txt)" = 3 ] || fail "submitted.txt should list 3 jobs"
ok "resubmitting a complete run exits 0 without training"

# restart_requeued JOB OUT SECS WHAT: wait until Slurm holds JOB requeued (PENDING, Restarts=1) and start
# it: Slurm holds a requeued job ~2 min before it may start again; start it now, but not within the
# second of the kill (a credential issued then counts as revoked: "Job credential revoked")
restart_requeued() {
  wait_until "$3" "scontrol -o show job $1 | grep -q 'JobState=PENDING.*Restarts=1'" ||
    { scontrol show job "$1"; grep -v 'INFO\] step' "$2"/jobs/*.out; fail "$4 did not requeue the job"; }
  [ -e "$2/ckpt_final.bin" ] && fail "the job ended before $4 stopped it: make the run longer"
  sleep 2
  scontrol update JobId="$1" StartTime=now
}
# stopped_resumed JOB OUT SIG WHAT: the requeued job completed, stopped by SIG with a checkpoint on the way,
# every one of its 120 steps logged once, and its result equals the direct run's
stopped_resumed() {
  "$WAIT" "$1" || { cat "$2/jobs/train-$1.out"; fail "$4: the requeued job did not complete"; }
  grep -q "restart 1" "$2/jobs/train-$1.out" && grep -q "stopped by $3 after step" "$2/jobs/train-$1.out" &&
    grep -q "resumed from $WORK/$2/ckpt_" "$2/jobs/train-$1.out" ||
    { grep -v 'INFO\] step' "$2/jobs/train-$1.out"; fail "$4: dfm-train did not stop with a checkpoint and resume"; }
  steps_once "$2" 120 || fail "$4: a step was lost or redone"
  same "$2/ckpt_final.bin" direct/ckpt_final.bin "$4"
  same "$2/dfm_modules.safetensors" direct/dfm_modules.safetensors "$4"
}

# ---- 3. USR1 before the time limit -> checkpoint -> requeue -> resume
r=$(DFM_FAULT_DELAY_MS=$HOLD_MS "${S[@]}" train --ntasks 2 -- --out requeued "${DFMF[@]}" --backbone direct_pre/model)
wait_until 120 '[ -e requeued/ckpt_000020.bin ]' || { cat requeued/jobs/*.out; fail "no first checkpoint"; }
scancel --batch --signal=USR1 "$r"
restart_requeued "$r" requeued 60 USR1
stopped_resumed "$r" requeued SIGUSR1 USR1
grep -q "stopped with a checkpoint" "requeued/jobs/train-$r.out" || fail "USR1: the job script did not requeue on status 75"
ok "USR1 -> checkpoint of the current step -> requeue -> $(grep -o 'resumed from [^ ]*' "requeued/jobs/train-$r.out" | head -n 1 | sed "s|$WORK/||"), every step once, identical result"

# ---- 3b. scontrol requeue of a running job: Slurm's SIGTERM stops dfm-train with a checkpoint
q=$(DFM_FAULT_DELAY_MS=$HOLD_MS "${S[@]}" train --ntasks 2 -- --out adminq "${DFMF[@]}" --backbone direct_pre/model)
wait_until 120 '[ -e adminq/ckpt_000020.bin ]' || { cat adminq/jobs/*.out; fail "no first checkpoint"; }
scontrol requeue "$q"
restart_requeued "$q" adminq 60 "scontrol requeue"
stopped_resumed "$q" adminq SIGTERM "scontrol requeue"
ok "scontrol requeue -> SIGTERM -> checkpoint of the current step -> restart, every step once, identical result"

# ---- 3c. a real time limit: --time 1 with USR1 50 s before it (Slurm checks time limits every ~30 s: the
# signal lands 10-40 s in). The run would need minutes: after the stop, the requeue and the resumed start,
# it is cancelled (scancel: SIGTERM, a checkpoint again)
LONG=(--data data/tokens.bin --layers 2 --hidden 32 --heads 4 --kv-heads 2 --steps 1000000 "${COMMON[@]}")
tl=$("$SUB" --overcommit --time 1 --signal-before 50 --dfm-train "$TRAIN" pretrain -- --out timed "${LONG[@]}")
restart_requeued "$tl" timed 90 "the time limit's USR1"
stop=$(grep -o 'stopped by SIGUSR1 after step [0-9]*' "timed/jobs/train-$tl.out" | grep -o '[0-9]*$') ||
  { grep -v 'INFO\] step' "timed/jobs/train-$tl.out"; fail "the time limit's USR1 did not stop dfm-train"; }
[ -e "timed/ckpt_$(printf %06d "$stop").bin" ] || fail "no checkpoint of step $stop"
wait_until 60 'grep -q "resumed from $WORK/timed/ckpt_$(printf %06d "$stop").bin at step $stop" "timed/jobs/train-$tl.out"' ||
  { grep -v 'INFO\] step' "timed/jobs/train-$tl.out"; fail "the restart did not resume from step $stop"; }
wait_until 30 '[ "$(grep -c "\"loss\"" timed/log.jsonl)" -gt $((stop + 5)) ]' || fail "the restart does not train"
scancel "$tl"
"$WAIT" "$tl" >/dev/null 2>&1 || true
last=$(tail -n 1 timed/log.jsonl | grep -o '"step": [0-9]*' | grep -o '[0-9]*$')
steps_once timed "$last" || fail "time limit: a step was lost or redone"
ok "--time 1 --signal B:USR1@50: stopped after step $stop with its checkpoint, requeued, resumed at $stop; steps 1..$last once each"

# ---- 4. a bad flag
b=$("${S[@]}" train --ntasks 2 -- --out bad "${DFMF[@]}" --backbone direct_pre/model --no-such-flag 3)
st=$("$WAIT" "$b") && fail "a job with a bad flag completed"
grep -q "JobState=FAILED ExitCode=[1-9]" <<<"$st" || fail "bad flag: $st (want FAILED, non-zero exit)"
grep -q "unknown option or missing value: '--no-such-flag'" "bad/jobs/train-$b.out" && grep -q "FAILED: dfm-train train exited" "bad/jobs/train-$b.out" ||
  { cat "bad/jobs/train-$b.out"; fail "the bad flag's job log does not say what failed"; }
ok "bad flag: $st, the log names --no-such-flag"

# ---- 5. GPU requests on the fake GPUs
# the stand-in dfm-train says what its rank sees and finishes the run (else the job script fails the job)
printf '#!/bin/sh\necho "RANK $SLURM_PROCID sees ${CUDA_VISIBLE_DEVICES-all} args: $*"\necho x > "$DFM_OUT/ckpt_final.bin" && echo x > "$DFM_OUT/dfm_modules.safetensors"\n' > stub.sh && chmod +x stub.sh
g1=$("${S[@]}" --ntasks 2 --dfm-train "$WORK/stub.sh" train -- --out gpu1 --device cuda --ckpt-every 5)
g2=$("${S[@]}" --ntasks 2 --gpus-per-node 2 --dfm-train "$WORK/stub.sh" train -- --out gpu2 --device cuda --ckpt-every 5)
"$WAIT" "$g1" "$g2" || { cat gpu1/jobs/*.out gpu2/jobs/*.out; fail "GPU jobs"; }
seen=$(grep -o 'RANK [0-9] sees [^ ]*' "gpu1/jobs/train-$g1.out" | sort | xargs)
[ "$seen" = "RANK 0 sees 0 RANK 1 sees 1" ] || fail "--gpus-per-task 1: each rank should see its own GPU, got: $seen"
seen=$(grep -o 'RANK [0-9] sees [^ ]*' "gpu2/jobs/train-$g2.out" | sort | xargs)
[ "$seen" = "RANK 0 sees 0,1 RANK 1 sees 0,1" ] || fail "--gpus-per-node 2: each rank should see both GPUs, got: $seen"
[ "$(grep -c 'args: train --out gpu1 --device cuda --ckpt-every 5$' "gpu1/jobs/train-$g1.out")" = 2 ] ||
  fail "dfm-train's flags were not passed on untouched: $(grep args: "gpu1/jobs/train-$g1.out")"
expect_fail "Requested node configuration is not available" \
  "${S[@]}" --ntasks 3 --dfm-train "$WORK/stub.sh" train -- --out gpu3 --device cuda --ckpt-every 5
ok "GPU requests: one GPU per rank (CUDA_VISIBLE_DEVICES 0 / 1), --gpus-per-node 2 (0,1 each), 3 GPUs on 2 refused"
echo "all Slurm training checks passed"
