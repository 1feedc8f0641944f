#!/usr/bin/env bash
# slurm_wait.sh JOBID... — wait (polling every 0.5 s) until the jobs left the queue; print each
# job's state; exit 0 only if every one is COMPLETED with exit code 0:0.
set -uo pipefail
ids=$(IFS=,; echo "$*")
while [ -n "$(squeue -h -j "$ids" -o %i 2>/dev/null)" ]; do sleep 0.5; done
rc=0
for j in "$@"; do
  line=$(scontrol -o show job "$j" 2>/dev/null) || { echo "job $j: no record"; rc=1; continue; }
  st=$(grep -o 'JobState=[A-Z_]*' <<<"$line"); ex=$(grep -o 'ExitCode=[0-9:]*' <<<"$line")
  echo "job $j $st $ex"
  [ "$st $ex" = "JobState=COMPLETED ExitCode=0:0" ] || rc=1
done
exit $rc
