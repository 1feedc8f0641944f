#!/usr/bin/env bash
# The tests' own checks can fail: none of tests/ holds a pattern that makes a check pass whatever happens.
#  1. `cmd | grep -q X && fail`: under pipefail the pipeline's status is cmd's when cmd fails, so `fail`
#     never runs exactly when something is wrong; capture the output, then grep it;
#  2. a running maximum of errors through fmax (C) or max(abs(x - y) for ...) without a finiteness test
#     (Python): fmax(worst, NaN) is worst and max() keeps the first of NaN and a number, so a NaN result
#     scores as no error; use check_max (tests/cuda/check_compare.h) or train_cli.worst_diff;
#  3. a skip said in words ("skip: ...") instead of a "SKIP: " line, which tests/run.sh counts in its
#     summary line (a skipped section is not a pass);
#  4. each pattern is found in a planted file, so this check can fail too.
source "$(dirname "$0")/../lib.sh"
cd "$DFM_ROOT"

# scan DIR...: prints FILE:LINE: text for every line that holds one of the patterns above
scan() {
  local pipe_fail='\|[[:space:]]*grep[[:space:]]+-[a-zA-Z]*q[^|]*&&[[:space:]]*fail'
  local c_max='(\*?[A-Za-z_][A-Za-z_0-9]*(\[[^]]*\])?)[[:space:]]*=[[:space:]]*fmaxf?\(\1,[[:space:]]*fabsf?\('
  local py_max='(^|[^.[:alnum:]_])max\(abs\(.*[[:space:]]for[[:space:]]'  # a generator of |differences|
  local word_skip='(echo|print)[[:space:](]+f?["'"'"']skip'
  grep -rnE --include='*.sh' "$pipe_fail" "$@" | sed 's/$/   <- cmd | grep -q \&\& fail/'
  grep -rnE --include='*.c' --include='*.cu' --include='*.h' "$c_max" "$@" | sed 's/$/   <- fmax drops NaN/'
  grep -rnE --include='*.py' --include='*.sh' "$py_max" "$@" | grep -v 'finite' | sed 's/$/   <- max() drops NaN/'
  grep -rnE --include='*.py' --include='*.sh' "$word_skip" "$@" | sed 's/$/   <- a skip not on a SKIP: line/'
  return 0
}

found=$(scan tests | grep -v '^tests/integration/repo/test_checks_can_fail.sh:' || true)
[ -z "$found" ] || fail "checks in tests/ that cannot fail:
$found"
ok "no check in tests/ passes whatever happens (pipelines into grep -q && fail, NaN-dropping maxima, skips in words)"

# the patterns find what they should: one planted line each, and the good forms pass
mkdir -p "$WORK/t"
cat > "$WORK/t/bad.sh" <<'EOF'
"$DFM" verify "$R" 2>&1 | grep -q "dfm targets" && fail "verify suggests 'dfm targets'"
echo "skip: GPU requests (no GPUs)"
err = max(abs(x - y) for x, y in zip(a, b))
EOF
cat > "$WORK/t/bad.cu" <<'EOF'
        md = fmax(md, fabs((double)a[i] - b[i]));
EOF
cat > "$WORK/t/good.sh" <<'EOF'
out=$("$DFM" verify "$R" 2>&1) && fail "verify passed"
grep -q "dfm targets" <<<"$out" && fail "verify suggests 'dfm targets'"
"$DFM" chunk a b | grep -q "already complete" || fail "rerun not skipped"
echo "SKIP: GPU requests (no GPUs)"
worst = worst_diff(a, b)
EOF
cat > "$WORK/t/good.c" <<'EOF'
        md = check_max(md, fabs((double)a[i] - b[i]));
        mx = fmax(mx, x[i]);
EOF
out=$(scan "$WORK/t")
for needle in "bad.sh:1:" "bad.sh:2:" "bad.sh:3:" "bad.cu:1:"; do
  grep -qF "$needle" <<<"$out" || fail "the scan missed the planted line $needle: $out"
done
[ "$(grep -c . <<<"$out")" = 4 ] || fail "the scan reported more than the 4 planted lines: $out"
ok "the scan finds each planted pattern and passes their good forms"
