#!/usr/bin/env bash
# submit.sh CONFIG [options] — submit the dfm pipeline as a chain of Slurm jobs, one per stage,
# each waiting for the previous one (--dependency=afterok; a failed stage cancels the rest).
# Re-submitting the same CONFIG after a failure or a cancel resumes: complete stages do nothing.
# Relative paths in CONFIG are relative to the folder submit.sh runs in (the jobs run there), as for
# a direct `dfm build CONFIG` from that folder.
#
#   --ntasks N          MPI ranks per stage (default 4)
#   --nodes N           nodes per stage (default: let Slurm choose)
#   --encode-gpus G     GPUs per node for the encode stage (default 1; 0 for CPU encoding)
#   --partition P       partition (default: the cluster's default)
#   --time T            time limit per stage (default 24:00:00)
#   --stages LIST       stages to submit (default chunk,encode,index,retrieve,write-targets)
#   --after JOBID       make the first stage wait for JOBID too
#   --dfm PATH          the dfm binary (default: build/dfm next to this script)
#   --overcommit        allow more ranks than CPUs (srun --overcommit; for small test clusters)
# Prints one line per job ("STAGE JOBID") and writes them to RUN/jobs/submitted.txt; logs go to
# RUN/jobs/STAGE-JOBID.out.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
[ $# -ge 1 ] || usage
CONFIG=""
NTASKS=4 NODES="" GPUS=1 PART="" TIME=24:00:00 STAGES=chunk,encode,index,retrieve,write-targets AFTER="" DFM=$HERE/../build/dfm OVER=0
while [ $# -gt 0 ]; do
  case $1 in
    --ntasks) NTASKS=$2; shift 2 ;; --nodes) NODES=$2; shift 2 ;; --encode-gpus) GPUS=$2; shift 2 ;;
    --partition) PART=$2; shift 2 ;; --time) TIME=$2; shift 2 ;; --stages) STAGES=$2; shift 2 ;;
    --after) AFTER=$2; shift 2 ;; --dfm) DFM=$2; shift 2 ;; --overcommit) OVER=1; shift ;;
    -h|--help) usage 0 ;; -*) echo "submit.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$CONFIG" ] || { echo "submit.sh: one CONFIG only" >&2; usage; }; CONFIG=$(realpath "$1"); shift ;;
  esac
done
[ -n "$CONFIG" ] || usage
DFM=$(realpath "$DFM")
[ -x "$DFM" ] || { echo "submit.sh: no dfm binary at $DFM (run make, or pass --dfm)" >&2; exit 1; }
command -v sbatch >/dev/null || { echo "submit.sh: sbatch not found: is this a Slurm login node?" >&2; exit 1; }
RUN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run"])' "$CONFIG") ||
  { echo "submit.sh: $CONFIG has no \"run\"" >&2; exit 1; }
# dfm resolves the config's relative paths ("run", "inputs", models) against its working folder: the jobs
# run here (--chdir), so RUN/jobs is the folder the run's files go to, on every node
case $RUN in /*) ;; *) RUN=$PWD/$RUN ;; esac
mkdir -p "$RUN/jobs"
prev=$AFTER
: > "$RUN/jobs/submitted.txt.tmp"
IFS=, read -ra LIST <<<"$STAGES"
for stage in "${LIST[@]}"; do
  export_vars="ALL,DFM_BIN=$DFM,DFM_CONFIG=$CONFIG,DFM_STAGE=$stage,DFM_JOBS_DIR=$HERE"
  [ "$OVER" = 1 ] && export_vars="$export_vars,DFM_SRUN_FLAGS=--overcommit"
  args=(--parsable --job-name "dfm-$stage" --ntasks "$NTASKS" --time "$TIME" --kill-on-invalid-dep=yes
        --output "$RUN/jobs/$stage-%j.out" --export "$export_vars" --chdir "$PWD")
  [ -n "$NODES" ] && args+=(--nodes "$NODES")
  [ -n "$PART" ] && args+=(--partition "$PART")
  [ -n "$prev" ] && args+=(--dependency "afterok:$prev")
  [ "$stage" = encode ] && [ "$GPUS" != 0 ] && args+=(--gres "gpu:$GPUS")
  [ "$OVER" = 1 ] && args+=(--overcommit)
  id=$(sbatch "${args[@]}" "$HERE/dfm-stage.sbatch")
  id=${id%%;*}
  echo "$stage $id" | tee -a "$RUN/jobs/submitted.txt.tmp"
  prev=$id
done
mv "$RUN/jobs/submitted.txt.tmp" "$RUN/jobs/submitted.txt"
