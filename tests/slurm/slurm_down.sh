#!/usr/bin/env bash
# slurm_down.sh — stop what slurm_up.sh started (only PIDs from its pid files). Safe to repeat.
#   KEEP_MUNGE=1 leaves munged running; PURGE=1 removes $SLURM_CI_DIR.
set -uo pipefail
DIR=${SLURM_CI_DIR:-/tmp/dfm-slurm}
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null && cat "$1"; }
PIDS="$(alive "$DIR/slurmctld.pid") $(alive "$DIR/slurmd.pid")"
for pf in "$DIR"/slurmd-*.pid; do PIDS="$PIDS $(alive "$pf")"; done # several nodes (SLURM_CI_NODES)
if [ -n "${PIDS// /}" ]; then
  jobs=$(squeue -h -o %A 2>/dev/null | sort -u)
  [ -n "$jobs" ] && scancel $jobs 2>/dev/null
  for _ in $(seq 100); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.1; done
  timeout 20 scontrol shutdown >/dev/null 2>&1
  for _ in $(seq 150); do
    left=""; for p in $PIDS; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
    [ -z "$left" ] && break; sleep 0.1
  done
  for p in $PIDS; do kill -0 "$p" 2>/dev/null && kill -KILL "$p"; done
fi
rm -f "$DIR/slurmctld.pid" "$DIR/slurmd.pid" "$DIR"/slurmd-*.pid
if [ "${KEEP_MUNGE:-0}" != 1 ] && [ -s "$DIR/munged.pid.ours" ]; then
  mp=$(cat "$DIR/munged.pid.ours")
  [ "$(cat /proc/"$mp"/comm 2>/dev/null)" = munged ] && kill -TERM "$mp"
  rm -f "$DIR/munged.pid.ours"
fi
[ "${PURGE:-0}" = 1 ] && rm -rf "$DIR"
exit 0
