# mpitime.sh — time an MPI command rank by rank (sourced by growth.sh and scaling.sh).
#
#   mpitime NP TAG CMD...   runs CMD under mpirun -np NP, each rank under /usr/bin/time; sets WALL (seconds);
#                           rank r's "elapsed user sys maxrss_kb" goes to $B/t-TAG.r; the output to $B/log-TAG;
#                           a failure prints the log's tail and exits
#   ranks_json TAG          those rank lines as a JSON array of [elapsed, user, sys, maxrss_kb]
# Needs B (a scratch folder).
now() { date +%s.%N; }
calc() { echo "$*" | bc -l; }
mpitime() {
  local np=$1 tag=$2; shift 2
  rm -f "$B/t-$tag".*
  local t0; t0=$(now)
  if ! mpirun -np "$np" sh -c 'exec /usr/bin/time -f "%e %U %S %M" -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$B/t-$tag" "$@" \
    >"$B/log-$tag" 2>&1; then
    echo "$tag failed:"; tail -20 "$B/log-$tag"; exit 1
  fi
  WALL=$(calc "$(now) - $t0" | sed "s/^\./0./")
}
ranks_json() {
  local r; r=$(for f in "$B/t-$1".*; do tail -1 "$f"; done | awk '{printf "%s[%s,%s,%s,%s]", (NR > 1 ? "," : ""), $1, $2, $3, $4}')
  echo "[$r]"
}
