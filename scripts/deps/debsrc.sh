#!/usr/bin/env bash
# debsrc.sh — print one-line deb-src entries derived from the machine's own apt sources.
#
# Reads the 'deb' entries already configured (one-line /etc/apt/sources.list and *.list, and deb822
# *.sources files) and prints the matching 'deb-src' lines for the machine's release suite, keeping
# each entry's URI and signed-by key. A site mirror or proxy thus keeps working, and no host is named
# here. Exits 1 if no entry for the release is found.
#
#   APT_ETC=DIR   the apt configuration folder (default /etc/apt; tests point it elsewhere)
#   CODENAME=X    the release suite (default VERSION_CODENAME of /etc/os-release)
set -euo pipefail
APT_ETC=${APT_ETC:-/etc/apt}
if [ -z "${CODENAME:-}" ]; then
  CODENAME=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
fi
[ -n "$CODENAME" ] || { echo "debsrc.sh: no VERSION_CODENAME in /etc/os-release; set CODENAME" >&2; exit 1; }

files=()
[ -f "$APT_ETC/sources.list" ] && files+=("$APT_ETC/sources.list")
for f in "$APT_ETC"/sources.list.d/*.list "$APT_ETC"/sources.list.d/*.sources; do
  [ -f "$f" ] && files+=("$f")
done
[ ${#files[@]} -gt 0 ] || exit 1

awk -v suite="$CODENAME" '
  function flush(   n, i, j, t, u, s, isdeb) {
    if (!inrec) return
    inrec = 0
    if (enabled == "no") return
    isdeb = 0; n = split(types, t, /[ \t]+/); for (i = 1; i <= n; i++) if (t[i] == "deb") isdeb = 1
    if (!isdeb) return
    n = split(uris, u, /[ \t]+/)
    m = split(suites, s, /[ \t]+/)
    for (i = 1; i <= n; i++) for (j = 1; j <= m; j++)
      if (u[i] != "" && s[j] == suite) emit(u[i], s[j], comps, signed)
  }
  function emit(uri, st, cs, key,   line) {
    if (key !~ /^\//) key = ""   # an inline key block cannot go on one line: apt then uses its keyrings
    line = "deb-src" (key != "" ? " [signed-by=" key "]" : "") " " uri " " st " " cs
    if (!(line in seen)) { seen[line] = 1; print line }
  }
  FNR == 1 { flush(); deb822 = (FILENAME ~ /\.sources$/) }
  deb822 {
    if ($0 ~ /^[ \t]*$/) { flush(); next }
    if ($0 ~ /^[ \t]*#/) next
    if (!inrec) { inrec = 1; types = uris = suites = comps = signed = ""; enabled = "yes" }
    key = tolower($1); sub(/:$/, "", key); val = $0; sub(/^[^:]*:[ \t]*/, "", val)
    if (key == "types") types = val
    else if (key == "uris") uris = val
    else if (key == "suites") suites = val
    else if (key == "components") comps = val
    else if (key == "signed-by") signed = val
    else if (key == "enabled") enabled = tolower(val)
    next
  }
  {
    sub(/#.*/, "")
    if ($1 != "deb") next
    opts = ""; i = 2
    if ($2 ~ /^\[/) {
      while (i <= NF) { opts = opts " " $i; if ($i ~ /\]$/) { i++; break } i++ }
    }
    uri = $i; st = $(i + 1); cs = ""
    for (k = i + 2; k <= NF; k++) cs = cs (cs == "" ? "" : " ") $k
    key = ""
    if (match(opts, /signed-by=[^ \]]+/)) key = substr(opts, RSTART + 10, RLENGTH - 10)
    if (st == suite) emit(uri, st, cs, key)
  }
  END { flush(); if (length(seen) == 0) exit 1 }
' "${files[@]}"
