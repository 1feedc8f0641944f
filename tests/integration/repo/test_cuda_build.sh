#!/usr/bin/env bash
# make CUDA=1 compiles and links every CUDA path with the CUDA compiler on a machine without a GPU (so
# CUDA code never rots), and the CUDA build refuses --device cuda clearly when no GPU is present.
source "$(dirname "$0")/../lib.sh"
command -v nvcc >/dev/null || fail "nvcc not found: the CUDA toolkit is required to check the CUDA build"
make -C "$DFM_ROOT" --no-print-directory CUDA=1 BUILD="$WORK/build-cuda" -j2 all > "$WORK/make.log" 2>&1 ||
  { tail -n 40 "$WORK/make.log"; fail "make CUDA=1 failed"; }
ncu=$(find "$WORK/build-cuda/obj" -name '*.cu.o' | wc -l)
nsrc=$(cd "$DFM_ROOT" && find encoder trainer -name '*.cu' | wc -l)
[ "$ncu" = "$nsrc" ] || fail "$ncu CUDA objects compiled, but encoder/ and trainer/ hold $nsrc .cu sources"
# read the whole listing first: `nm | grep -q` under pipefail fails when grep's early exit stops nm (SIGPIPE)
linked=$(nm -D "$WORK/build-cuda/dfm"; ldd "$WORK/build-cuda/dfm")
grep -q cublas <<<"$linked" || fail "dfm is not linked with cuBLAS"
ok "make CUDA=1: $ncu CUDA objects compiled and linked"
printf '{"text": "a test sentence"}\n' > "$WORK/t.jsonl"
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_fail "GPU" "$WORK/build-cuda/dfm" encode --texts "$WORK/t.jsonl" --out "$WORK/e.bin" --device cuda --model "$DFM_MODEL"
fi
# the trainer: --device cuda refused clearly without a GPU (and by a CPU build); the engine's multi-GPU
# path without NCCL (gradients through host memory and MPI) compiles too
"$DFM_TRAIN" synth --out "$WORK/s" --seqs 40 --seq-len 32 --chunk-len 8 --vocab 100 > /dev/null 2>&1 || fail "dfm-train synth"
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_fail "no usable GPU" "$WORK/build-cuda/dfm-train" pretrain --data "$WORK/s/tokens.bin" --out "$WORK/p" \
    --seq-len 32 --steps 1 --layers 1 --hidden 16 --heads 2 --kv-heads 1 --device cuda
fi
expect_fail "built without CUDA" "$DFM_TRAIN" pretrain --data "$WORK/s/tokens.bin" --out "$WORK/p" --seq-len 32 \
  --steps 1 --layers 1 --hidden 16 --heads 2 --kv-heads 1 --device cuda
make -C "$DFM_ROOT" --no-print-directory CUDA=1 NCCL=0 BUILD="$WORK/build-cuda-nonccl" \
  "$WORK/build-cuda-nonccl/obj/trainer/run/engine.o" > "$WORK/make-nonccl.log" 2>&1 ||
  { tail -n 20 "$WORK/make-nonccl.log"; fail "engine.c without NCCL does not compile"; }
ok "dfm-train --device cuda refused clearly without a GPU; engine.c builds with and without NCCL"
echo "CUDA build checks passed"
