#!/usr/bin/env bash
# bench/peers.sh — create (or check) the ONE Python environment that holds every benchmark peer, with
# pinned versions that are known to work together. The benchmarks never look for peers anywhere else,
# and a benchmark whose peer is missing fails (it never substitutes another peer).
#
#   bash bench/peers.sh            create/refresh $PEERS_VENV (idempotent: a second run is a no-op)
#   bash bench/peers.sh --check    exit 0 if the venv is present and matches the pins, 1 otherwise
#   bash bench/peers.sh --python   print the venv's python path (after --check semantics: fails if absent)
#   bash bench/peers.sh --pins     print the pins (the stamp a current venv holds)
#
# Environment:
#   PEERS_VENV=DIR         where the venv lives (default /var/cache/dfm/peers-venv)
#   PEERS_BASE_PYTHON=PY   the interpreter the venv is made from (default python3)
#   TORCH_INDEX_URL=URL    a package index that serves CPU-only torch wheels. Unset: the first index URL
#                          in this machine's pip configuration (`pip config list`, PIP_* variables) whose
#                          path ends in /cpu; none configured: PyPI's own torch wheel (larger: it pulls
#                          the CUDA runtime wheels, which the CPU benchmarks never load).
#
# The stamp file $PEERS_VENV/peers.stamp holds the pins and the base interpreter's version; when it
# matches, nothing is done. Change a pin below and re-run to rebuild the venv from scratch.
set -euo pipefail
PEERS_VENV=${PEERS_VENV:-/var/cache/dfm/peers-venv}
PEERS_BASE_PYTHON=${PEERS_BASE_PYTHON:-python3}

# Peers and their pins. torch 2.x with numpy 2 is fine because this venv never sees Debian's torch
# (python3-torch 1.13 needs numpy < 2; the venv is created without system site-packages).
PINS_TORCH="torch==2.15.0"
PINS=(
  "numpy==2.4.6"
  "sentence-transformers==6.2.0"
  "transformers==5.24.0"
  "onnxruntime==1.32.0"
  "onnx==1.23.2"
  "onnxscript==0.7.2"
  "tiktoken==0.14.0"
  "tokenizers==0.23.3"
  "faiss-cpu==1.15.1"
  "gguf==0.19.0"
  "accelerate==1.15.0"
  "sentencepiece==0.2.3"
  "pyarrow==26.0.1"
)

say() { echo "[peers] $*" >&2; }
die() { echo "[peers] ERROR: $*" >&2; exit 1; }

command -v "$PEERS_BASE_PYTHON" >/dev/null || die "no $PEERS_BASE_PYTHON; set PEERS_BASE_PYTHON to a Python >= 3.10"
BASE_VER=$("$PEERS_BASE_PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
STAMP_WANT=$(printf 'python %s\n%s\n' "$BASE_VER" "$PINS_TORCH"; printf '%s\n' "${PINS[@]}")
STAMP=$PEERS_VENV/peers.stamp

is_current() { [ -x "$PEERS_VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_WANT" ]; }

case "${1:-}" in
  --check) is_current && exit 0
           say "peer venv $PEERS_VENV is missing or does not match the pins; run: bash bench/peers.sh"; exit 1 ;;
  --python) is_current || die "peer venv $PEERS_VENV is missing or stale; run: bash bench/peers.sh"
            echo "$PEERS_VENV/bin/python"; exit 0 ;;
  --pins) echo "$STAMP_WANT"; exit 0 ;;
  "") ;;
  *) die "unknown argument '$1' (use --check, --python, --pins or nothing)" ;;
esac

if is_current; then
  say "peer venv $PEERS_VENV is current (pins unchanged); nothing to do"
  exit 0
fi

# The CPU torch index: explicit, else from pip's configuration on this machine, else PyPI.
if [ -z "${TORCH_INDEX_URL:-}" ]; then
  TORCH_INDEX_URL=$( { "$PEERS_BASE_PYTHON" -m pip config list 2>/dev/null || true
                       env | grep '^PIP_.*INDEX' || true; } |
                     grep -oE "https?://[^' ]*/cpu/?" | head -1 || true)
fi
TORCH_ARGS=()
if [ -n "$TORCH_INDEX_URL" ]; then
  say "torch from the CPU-only index $TORCH_INDEX_URL"
  TORCH_ARGS=(--index-url "$TORCH_INDEX_URL")
  # the CPU index may publish the version with a local '+cpu' tag
  PINS_TORCH_SPEC="${PINS_TORCH%%==*}==${PINS_TORCH#*==}.*"
else
  say "no CPU-only torch index configured: torch from PyPI (its CUDA wheels come along, unused)"
  PINS_TORCH_SPEC=$PINS_TORCH
fi

mkdir -p "$(dirname "$PEERS_VENV")" || die "cannot create $(dirname "$PEERS_VENV"); set PEERS_VENV"
# one builder at a time (several people share the machine); a second waits, then finds the venv current
exec 9>"$PEERS_VENV.lock"
flock 9
if is_current; then say "peer venv $PEERS_VENV was built meanwhile; nothing to do"; exit 0; fi
# Built in place; the stamp is written last, so a half-built venv is never taken as current. A venv
# with another stamp (other pins) is rebuilt from scratch; one with no stamp is an interrupted build of
# these pins, and pip resumes it.
if [ -f "$STAMP" ] || { [ -e "$PEERS_VENV" ] && [ ! -x "$PEERS_VENV/bin/python" ]; }; then rm -rf "$PEERS_VENV"; fi
if [ ! -x "$PEERS_VENV/bin/python" ]; then
  say "creating $PEERS_VENV from $PEERS_BASE_PYTHON $BASE_VER (several minutes: torch is large)"
  "$PEERS_BASE_PYTHON" -m venv "$PEERS_VENV" || die "python -m venv failed (Debian: apt-get install python3-venv)"
else
  say "resuming the interrupted build of $PEERS_VENV"
fi
PIP=("$PEERS_VENV/bin/python" -m pip install -q --no-input --disable-pip-version-check)
"${PIP[@]}" "${TORCH_ARGS[@]}" "$PINS_TORCH_SPEC" || die "installing $PINS_TORCH_SPEC failed"
# torch is in; the rest must not replace it (the constraint keeps pip from choosing another torch)
TV=$("$PEERS_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')
"${PIP[@]}" "${PINS[@]}" -c <(echo "torch==$TV") || die "installing the peers (${PINS[*]}) failed"

# Every peer must import, and report the pinned version, before the venv is accepted.
"$PEERS_VENV/bin/python" - "$PINS_TORCH" "${PINS[@]}" <<'PY' || die "a peer does not import in the new venv"
import importlib.metadata as md, sys
mods = {"torch": "torch", "numpy": "numpy", "sentence-transformers": "sentence_transformers",
        "transformers": "transformers", "onnxruntime": "onnxruntime", "onnx": "onnx",
        "onnxscript": "onnxscript", "tiktoken": "tiktoken", "tokenizers": "tokenizers", "faiss-cpu": "faiss",
        "gguf": "gguf", "accelerate": "accelerate", "sentencepiece": "sentencepiece", "pyarrow": "pyarrow"}
bad = 0
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    __import__(mods[name])
    have = md.version(name)
    if have.split("+")[0] != want:
        print(f"[peers] {name}: have {have}, pinned {want}", file=sys.stderr); bad = 1
sys.exit(bad)
PY
echo "$STAMP_WANT" > "$STAMP"
say "peer venv ready: $PEERS_VENV/bin/python"
"$PEERS_VENV/bin/python" -m pip list --format=freeze 2>/dev/null |
  grep -iE '^(torch|numpy|sentence-transformers|transformers|onnxruntime|onnx|onnxscript|tiktoken|tokenizers|faiss-cpu|gguf|accelerate|sentencepiece|pyarrow)==' >&2
