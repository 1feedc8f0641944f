# tests/integration/lib.sh — helpers shared by the integration tests (sourced).
set -euo pipefail
: "${DFM:?run through tests/run.sh (DFM unset)}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 DFM_PROGRESS=0
WORK=$(mktemp -d /tmp/dfm-it-XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }
# expect_fail NEEDLE CMD...: the command must exit non-zero and its stderr contain NEEDLE
expect_fail() {
  local needle=$1; shift
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  [ $rc != 0 ] || fail "expected failure of: $* (output: $out)"
  grep -qF -- "$needle" <<<"$out" || fail "error of '$*' lacks '$needle': $out"
  ok "refused with '$needle'"
}
