#!/usr/bin/env bash
# make CUDA=1 compiles and links every CUDA path with nvcc on a machine without a GPU (so CUDA code
# never rots), and the CUDA build refuses --device cuda clearly when no GPU is present.
source "$(dirname "$0")/lib.sh"
command -v nvcc >/dev/null || fail "nvcc not found: the CUDA toolkit is required to check the CUDA build"
make -C "$DFM_ROOT" --no-print-directory CUDA=1 BUILD="$WORK/build-cuda" -j2 all > "$WORK/make.log" 2>&1 ||
  { tail -n 40 "$WORK/make.log"; fail "make CUDA=1 failed"; }
ls "$WORK"/build-cuda/obj/*/*.cu.o >/dev/null 2>&1 || fail "no .cu object was compiled"
nm -D "$WORK/build-cuda/dfm" | grep -q cublas || ldd "$WORK/build-cuda/dfm" | grep -q cublas || fail "dfm is not linked with cuBLAS"
ok "make CUDA=1: $(ls "$WORK"/build-cuda/obj/*/*.cu.o | wc -l) CUDA objects compiled and linked"
printf '{"text": "a test sentence"}\n' > "$WORK/t.jsonl"
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_fail "GPU" "$WORK/build-cuda/dfm" encode --texts "$WORK/t.jsonl" --out "$WORK/e.bin" --device cuda --model "$DFM_MODEL"
fi
echo "CUDA build checks passed"
