#!/usr/bin/env bash
# Builds and runs every dev/cuda program on a machine with a GPU (a lent
# device machine: one call, from the repository root), and prints each
# program's checks and timings; with OUT set, the log also goes to
# $OUT/dev-cuda.log. Exits 1 if any program fails (77, no GPU, counts as a
# failure here: this script is meant for a machine that has one).
#
# usage: dev/cuda/run_on_device.sh [SIZE]   SIZE: full (defaults) or quick
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
size=${1:-full}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
bin=$root/build-dev-cuda
mkdir -p "$bin"
log=${OUT:+$OUT/dev-cuda.log}
[ -z "$log" ] || mkdir -p "$OUT"
say() { if [ -n "$log" ]; then echo "$*" | tee -a "$log"; else echo "$*"; fi; }
say "dev/cuda on $(hostname): $("$nvcc" --version | tail -1)"
command -v nvidia-smi > /dev/null && say "$(nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader)"
failed=0
for src in "$root"/dev/cuda/*.cu; do
  name=$(basename "$src" .cu)
  if ! "$nvcc" -O3 -std=c++17 -I"$root/src" -I"$root/include" -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
      -Werror all-warnings -Xcompiler -Wall,-Wextra,-ffp-contract=off -o "$bin/$name" "$src" -lcublasLt; then
    say "$name: does not build"; failed=1; continue
  fi
  case "$size:$name" in
  quick:embedding_bag_forward) args="200000 128 8192 26 1" ;;
  quick:sparse_update) args="200000 128 8192 26 1" ;;
  quick:dot_interaction) args="8192 26 128" ;;
  quick:linear_cublaslt) args="8192 512 512" ;;
  quick:small_ops) args="1048576" ;;
  quick:step_pipeline) args="8192 26 128 50" ;;
  *) args="" ;;
  esac
  # shellcheck disable=SC2086
  out=$(timeout 600 "$bin/$name" $args 2>&1); rc=$?
  say "$out"
  say "$name: exit $rc"
  [ $rc -eq 0 ] || failed=1
done
exit $failed
