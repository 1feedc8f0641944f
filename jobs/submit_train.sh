#!/usr/bin/env bash
# submit_train.sh MODE [options] -- [dfm-train flags...] — submit `dfm-train MODE FLAGS` (pretrain,
# train or eval) as one Slurm job (jobs/dfm-train.sbatch): --ntasks MPI ranks, data-parallel replicas.
# FLAGS must contain --out DIR (the job log goes there too). Resubmitting the same command resumes from
# the newest checkpoint in DIR (add --ckpt-every N); a complete DIR makes the job exit 0 at once; a
# second job for a DIR whose job is still queued or running is refused.
#
#   --ntasks N          MPI ranks (default 1)
#   --nodes N           nodes (default: let Slurm choose)
#   --gpus-per-task G   GPUs per rank (default 1 if FLAGS has --device cuda, else 0); dfm-train uses one
#   --gpus-per-node G   request --gres=gpu:G per node instead (clusters without select/cons_tres)
#   --gpu-bind TYPE     srun --gpu-bind=TYPE (default: Slurm's; one GPU visible per rank with
#                       --gpus-per-task; see jobs/dfm-train.sbatch before choosing none)
#   --cpus-per-task C   CPUs per rank = OMP/BLAS threads (default 1)
#   --partition P       partition (default: the cluster's default)
#   --time T            time limit (default 24:00:00)
#   --signal-before S   checkpoint, stop and requeue S seconds before the time limit (default 120; 0 = off)
#   --no-requeue        neither requeue on USR1 nor after a node failure
#   --after JOBID       start after JOBID completed successfully (e.g. the pretrain job)
#   --dfm-train PATH    the binary (default build/dfm-train, or build-cuda/dfm-train with GPUs)
#   --overcommit        allow more ranks than CPUs (srun --overcommit; for small test clusters)
#   --sbatch-arg ARG    one more sbatch option, e.g. --sbatch-arg=--account=proj (repeatable)
#   --dry-run           print the sbatch command instead of running it
# Prints the job id; appends "MODE JOBID" to OUT/jobs/submitted.txt; the job logs to
# OUT/jobs/train-JOBID.out (a requeued job appends to the same file).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
die() { echo "submit_train.sh: $*" >&2; exit 1; }
[ $# -ge 1 ] || usage
MODE="" NTASKS=1 NODES="" GPT="" GPN="" BIND="" CPT=1 PART="" TIME=24:00:00 SIG=120 REQUEUE=1 AFTER="" BIN="" OVER=0 DRY=0
EXTRA=()
while [ $# -gt 0 ]; do
  case $1 in
    --ntasks) NTASKS=$2; shift 2 ;; --nodes) NODES=$2; shift 2 ;;
    --gpus-per-task) GPT=$2; shift 2 ;; --gpus-per-node) GPN=$2; shift 2 ;; --gpu-bind) BIND=$2; shift 2 ;;
    --cpus-per-task) CPT=$2; shift 2 ;; --partition) PART=$2; shift 2 ;; --time) TIME=$2; shift 2 ;;
    --signal-before) SIG=$2; shift 2 ;; --no-requeue) REQUEUE=0; shift ;;
    --after) AFTER=$2; shift 2 ;; --dfm-train) BIN=$2; shift 2 ;; --overcommit) OVER=1; shift ;;
    --sbatch-arg) EXTRA+=("$2"); shift 2 ;; --sbatch-arg=*) EXTRA+=("${1#--sbatch-arg=}"); shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    pretrain|train|eval) [ -z "$MODE" ] || { echo "submit_train.sh: one MODE only" >&2; usage; }; MODE=$1; shift ;;
    -*) echo "submit_train.sh: unknown option $1 (dfm-train's flags go after --)" >&2; usage ;;
    *) echo "submit_train.sh: MODE must be pretrain, train or eval, not '$1'" >&2; usage ;;
  esac
done
[ -n "$MODE" ] || { echo "submit_train.sh: no MODE (pretrain, train or eval)" >&2; usage; }
FLAGS=("$@")

# what the scripts need to know from dfm-train's flags (passed on untouched): --out and --device
OUT="" DEVICE="" CKPT=""
for ((i = 0; i < ${#FLAGS[@]}; i++)); do
  case ${FLAGS[i]} in
    --out) OUT=${FLAGS[i + 1]:-} ;; --out=*) OUT=${FLAGS[i]#--out=} ;;
    --device) DEVICE=${FLAGS[i + 1]:-} ;; --device=*) DEVICE=${FLAGS[i]#--device=} ;;
    --ckpt-every) CKPT=${FLAGS[i + 1]:-} ;; --ckpt-every=*) CKPT=${FLAGS[i]#--ckpt-every=} ;;
  esac
done
[ -n "$OUT" ] || die "the dfm-train flags have no --out DIR (needed for checkpoints, resuming and the job log)"
OUT=$(realpath -m "$OUT")
for n in "$NTASKS" "$CPT" "$SIG" ${GPT:+"$GPT"} ${GPN:+"$GPN"} ${NODES:+"$NODES"}; do
  [[ $n =~ ^[0-9]+$ ]] || die "'$n' is not a count"
done
[ -z "$GPT" ] && { [ "$DEVICE" = cuda ] && [ -z "$GPN" ] && GPT=1 || GPT=0; }
[ -n "$GPN" ] && [ "$GPT" != 0 ] && die "--gpus-per-task and --gpus-per-node: one or the other"
GPUS=$GPT; [ -n "$GPN" ] && GPUS=$GPN
[ "$DEVICE" = cuda ] && [ "$GPUS" = 0 ] && die "--device cuda with no GPUs requested (--gpus-per-task 0)"
[ "$GPUS" != 0 ] && [ "$DEVICE" != cuda ] &&
  echo "submit_train.sh: warning: GPUs requested but the dfm-train flags have no --device cuda" >&2
[ "$MODE" != eval ] && [ "${CKPT:-0}" = 0 ] &&
  echo "submit_train.sh: warning: no --ckpt-every: a time limit or requeue still checkpoints, but a job resubmitted after a crash restarts from step 0" >&2
if [ -z "$BIN" ]; then
  BIN=$HERE/../build/dfm-train
  [ "$GPUS" != 0 ] && BIN=$HERE/../build-cuda/dfm-train
fi
BIN=$(realpath -m "$BIN")
[ -x "$BIN" ] || [ "$DRY" = 1 ] || die "no dfm-train binary at $BIN (run make, make CUDA=1 BUILD=build-cuda, or pass --dfm-train)"
command -v sbatch >/dev/null || [ "$DRY" = 1 ] || die "sbatch not found: is this a Slurm login node?"

# the environment the job script reads; --export=ALL keeps it (and it survives a requeue)
export DFM_TRAIN_BIN=$BIN DFM_OUT=$OUT DFM_GPU_BIND=$BIND DFM_SRUN_FLAGS="" DFM_JOBS_DIR=$HERE
[ "$OVER" = 1 ] && DFM_SRUN_FLAGS=--overcommit
args=(--parsable --job-name "dfm-$MODE" --ntasks "$NTASKS" --cpus-per-task "$CPT" --time "$TIME"
      --chdir "$PWD" --output "$OUT/jobs/train-%j.out" --export ALL --kill-on-invalid-dep=yes)
[ -n "$NODES" ] && args+=(--nodes "$NODES")
[ -n "$PART" ] && args+=(--partition "$PART")
[ -n "$AFTER" ] && args+=(--dependency "afterok:$AFTER")
# --gpus-per-task scales with --ntasks, lets Slurm place ranks on any nodes with free GPUs (needs
# select/cons_tres) and makes srun show each rank only its own GPU; --gres=gpu:G is per node and only
# right when the ranks per node are fixed (--nodes with --ntasks a multiple)
[ "$GPT" != 0 ] && args+=(--gpus-per-task "$GPT")
[ -n "$GPN" ] && [ "$GPN" != 0 ] && args+=(--gres "gpu:$GPN")
[ "$OVER" = 1 ] && args+=(--overcommit)
if [ "$REQUEUE" = 1 ]; then
  [ "$SIG" != 0 ] && args+=(--signal "B:USR1@$SIG")
else
  args+=(--no-requeue)
fi
args+=(${EXTRA[@]+"${EXTRA[@]}"})
if [ "$DRY" = 1 ]; then
  printf '%q ' env DFM_TRAIN_BIN="$BIN" DFM_OUT="$OUT" DFM_GPU_BIND="$BIND" DFM_SRUN_FLAGS="$DFM_SRUN_FLAGS" DFM_JOBS_DIR="$HERE" \
    sbatch "${args[@]}" "$HERE/dfm-train.sbatch" "$MODE" ${FLAGS[@]+"${FLAGS[@]}"}
  echo
  exit 0
fi
# two jobs writing one OUT would overwrite each other's checkpoints
last=$(awk 'END {print $2}' "$OUT/jobs/submitted.txt" 2>/dev/null || true)
[ -n "$last" ] && [ -n "$(squeue -h -j "$last" -o %i 2>/dev/null)" ] &&
  die "job $last for $OUT is still queued or running: wait for it or scancel it first"
mkdir -p "$OUT/jobs"
id=$(sbatch "${args[@]}" "$HERE/dfm-train.sbatch" "$MODE" ${FLAGS[@]+"${FLAGS[@]}"})
id=${id%%;*}
echo "$id"
echo "$MODE $id" >> "$OUT/jobs/submitted.txt"
