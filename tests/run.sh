#!/usr/bin/env bash
# tests/run.sh — run every test program and print one closing line: "N passed, N failed, N skipped".
#
# Runs, in order: unit tests (build/tests/test_*), the same under ASan+UBSan (build-san/tests/test_*),
# the fuzzers for FUZZ_RUNS inputs (build-fuzz/fuzz/*, default 2000), integration tests
# (tests/integration/*/test_*.sh) and Python-reference tests (tests/py/*/test_*.py, among them the CUDA
# checkers built for the CPU by `make emu-checks`). `make test` builds everything first. Integration and
# Python tests live in sub-folders by subject; each is named, and run in the order of, its file name alone
# (integration/test_X, py/test_X), so no two may share one.
# Each program is one test; its own output says which case failed. A unit test that is not built counts
# as failed. A passing test that could not run part of its checks says so on a line of its output that
# starts with "SKIP: " (what was not checked and why); each such line counts as one skipped section in
# the closing line, named above it, so that a skip is never read as a pass. Exit status is non-zero if
# any failed, 2 if none was selected.
#   TESTS=REGEX tests/run.sh    run only tests whose name matches REGEX (one that matches nothing is an error)
#   KEEP=1                      keep the scratch folders of integration tests
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
export DFM_CACHE
eval "$(sed -n 's/^\([A-Z_]*\) *:\?= *\(.*\)$/export \1="\2"/p' "$DFM_CACHE/paths.mk")"
export DFM_ROOT=$ROOT DFM=$ROOT/build/dfm DFM_TRAIN=$ROOT/build/dfm-train
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
FILTER=${TESTS:-.}
pass=0; fail=0; failed=(); skipped=()
LOGDIR=$ROOT/build/test-logs; mkdir -p "$LOGDIR"

run_one() {  # name, command...
  local name=$1; shift
  [[ $name =~ $FILTER ]] || return 0
  local t0=$(date +%s%N) log="$LOGDIR/${name//\//_}.log"
  echo "=== $name"
  "$@" >"$log" 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 )) dt
  dt=$(printf '%d.%d' $((ms / 1000)) $(((ms % 1000) / 100)))
  if [ $rc = 0 ]; then
    pass=$((pass + 1)); echo "PASS $name (${dt}s)"
    local why
    while IFS= read -r why; do skipped+=("$name: ${why#SKIP: }"); echo "    $why"; done < <(grep -a '^SKIP: ' "$log")
    [ "${VERBOSE:-0}" = 1 ] && cat "$log"
  else
    fail=$((fail + 1)); failed+=("$name"); echo "FAIL $name (${dt}s, exit $rc); last lines of $log:"
    tail -40 "$log" | sed 's/^/    /'
  fi
}

# a unit test whose program is missing fails: a test that was not built has not passed
not_built() {  # name, program, how to build it
  [[ $1 =~ $FILTER ]] || return 0
  fail=$((fail + 1)); failed+=("$1"); echo "FAIL $1: $2 is not built ($3)"
}
for src in tests/unit/test_*.c; do
  t=build/tests/$(basename "$src" .c)
  if [ -x "$t" ]; then run_one "unit/${t##*/}" "$t"; else not_built "unit/${t##*/}" "$t" "make unit-tests"; fi
done
# Leak checking is on, except for tests that start MPI: Open MPI keeps allocations (some in plugins
# it unloads, which no suppression can name) until exit, and those are not ours to fix.
for src in tests/unit/test_*.c; do
  t=build-san/tests/$(basename "$src" .c)
  [ -x "$t" ] || { not_built "asan/${t##*/}" "$t" "make SAN=1 unit-tests"; continue; }
  leaks=1; grep -qE 'MPI_Init|dfm_mpi_init' "$src" && leaks=0
  run_one "asan/${t##*/}" env ASAN_OPTIONS=detect_leaks=$leaks:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 "$t"
done
# libFuzzer harnesses (make fuzzers, under ASan+UBSan): FUZZ_RUNS inputs each from the committed seeds,
# new inputs into a scratch folder; a crashing input is kept as build/test-logs/fuzz-NAME-crash-*
for src in tests/fuzz/fuzz_*.c; do
  n=$(basename "$src" .c); n=${n#fuzz_}; t=build-fuzz/fuzz/$n
  [ -x "$t" ] || { not_built "fuzz/$n" "$t" "make fuzzers, which needs clang"; continue; }
  run_one "fuzz/$n" bash -c 'd=$(mktemp -d); "$1" -runs="$2" -artifact_prefix="$3" "$d" "$4"; rc=$?; rm -rf "$d"; exit $rc' \
    _ "$t" "${FUZZ_RUNS:-2000}" "$LOGDIR/fuzz-$n-" "tests/fuzz/seeds/$n"
done
# tests_in DIR EXT: the test_*.EXT files anywhere under DIR, in the order of their file names; refuses two
# with the same name (a test's name is its file name, without the folder)
tests_in() {
  local list dup
  list=$(find "$1" -type f -name "test_*.$2" -printf '%f\t%p\n' | LC_ALL=C sort)
  dup=$(cut -f1 <<<"$list" | uniq -d)
  [ -z "$dup" ] || { echo "tests/run.sh: two tests under $1 share a name: $dup" >&2; exit 2; }
  cut -f2 <<<"$list"
}
integration=$(tests_in tests/integration sh) || exit 2
py=$(tests_in tests/py py) || exit 2
for t in $integration; do run_one "integration/$(basename "$t" .sh)" bash "$t"; done
for t in $py; do run_one "py/$(basename "$t" .py)" "$DFM_PYTHON" "$t"; done

if [ $((pass + fail)) = 0 ]; then
  echo "no test matches TESTS='$FILTER' (names are unit/test_X, asan/test_X, integration/test_X, py/test_X)" >&2
  exit 2
fi
echo
[ $fail -gt 0 ] && echo "failed: ${failed[*]}"
[ ${#skipped[@]} -gt 0 ] && printf 'skipped: %s\n' "${skipped[@]}"
echo "$pass passed, $fail failed, ${#skipped[@]} skipped"
[ $fail = 0 ]
