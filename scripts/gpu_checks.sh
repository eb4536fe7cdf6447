#!/usr/bin/env bash
# The GPU checks of issue 11 in one call on a lent machine, from the
# repository root, with .device carried (scripts/device_bundle.sh made it
# here): the op-by-op test, the whole-model agreement, train/eval/predict on
# the GPU against the CPU, the dev/cuda programs at quick sizes, the DLRM
# step benchmark (bf16, then tf32, then fp16, then bf16 with Criteo 1TB's
# table, then its per-op profile) and bench/gpu_train.sh (the table on the
# GPU, then in host memory, then in host memory with a tenth of its rows hot
# on the GPU against none, then fp16 against fp32, then issue 11's benchmark:
# examples/dlrm_dle_small.json, NVIDIA's small DLRM and its SGD recipe, on
# data with Criteo 1TB's columns, in bf16 against fp32 at batch 65536; then,
# when the bundle
# holds an older build's dlrec as dlrec_base, this build's training against
# it on the same GPU). About 4 minutes on an H100; each part has its own
# time limit (19.5 minutes in all at the worst: give the run 600 s, and the
# last parts are the ones cut), and the log goes to $OUT/gpu-checks.log when
# OUT is set (the run tool's), so what ran comes back even if the call is
# cut. Exits 1 if a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
log=${OUT:+$OUT/gpu-checks.log}
exec > >(tee ${log:+-a "$log"}) 2>&1
eval "$(.device/setup.sh)" || exit 1
t0=$(date +%s)
failed=0
part() { # name, seconds, command...
  local name=$1 secs=$2
  shift 2
  echo "== [+$(($(date +%s) - t0))s] $name"
  timeout "$secs" "$@"
  local rc=$?
  [ $rc -eq 0 ] || { echo "== $name: exit $rc"; failed=1; }
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
B=.device/bin
part "test_backend (every op, fp32 and bf16)" 60 $B/test_backend
part "whole-model agreement (cuda, cpu-mirror)" 90 env DLREC_TEST_VERBOSE=1 $B/test_models models_agree_across_backends
part "train, eval and predict on the GPU" 90 $B/test_train device_flag_trains_on_the_cpu_and_a_gpu_or_says_why
for p in $B/dev-cuda/*; do
  case $(basename "$p") in
  embedding_bag_forward | sparse_update) args="500000 128 16384 26 1" ;;
  dot_interaction) args="16384 26 128" ;;
  linear_cublaslt) args="8192 512 512" ;;
  small_ops) args="1048576" ;;
  step_pipeline) args="65536 26 128 50" ;;
  *) args="" ;;
  esac
  # shellcheck disable=SC2086
  part "dev/cuda $(basename "$p") $args" 30 "$p" $args
done
part "bench_step, the small DLRM's step with a 26 x 500k table" 60 $B/bench_step cuda bf16 65536 20 500000
part "bench_step, the same in tf32" 30 $B/bench_step cuda tf32 65536 20 500000
part "bench_step, the same in fp16" 30 $B/bench_step cuda fp16 65536 20 500000
part "bench_step with Criteo 1TB's table (4.19B parameters)" 90 $B/bench_step cuda bf16 65536 20 1tb
part "bench_step's per-op profile (a sync after each op)" 30 $B/bench_step cuda bf16 65536 10 500000 profile
part "bench/gpu_train.sh" 90 env BIN=$B/dlrec bench/gpu_train.sh 1000000 8192
part "bench/gpu_train.sh, the table in host memory" 60 env BIN=$B/dlrec PLACEMENT=host DEVICES="cuda cpu" \
  bench/gpu_train.sh 1000000 8192
part "bench/gpu_train.sh, the table in host memory, a tenth of its rows hot on the GPU against none" 60 env \
  BIN=$B/dlrec PLACEMENT=host HOT="0.1 0" DEVICES="cuda cuda" bench/gpu_train.sh 1000000 8192
part "bench/gpu_train.sh, fp16 (loss-scaled) against fp32 at batch 65536" 60 env BIN=$B/dlrec \
  DEVICES="cuda/fp16 cuda/fp32" bench/gpu_train.sh 4000000 65536
part "bench/gpu_train.sh, issue 11's benchmark: NVIDIA's small DLRM and recipe, bf16 against fp32 at batch 65536" \
  90 env BIN=$B/dlrec DEVICES="cuda/bf16 cuda/fp32" CARDINALITIES=criteo-1tb MIN_COUNT=1 \
  bench/gpu_train.sh 4000000 65536 examples/dlrm_dle_small.json
if [ -x $B/dlrec_base ]; then
  part "bench/gpu_train.sh, this build against dlrec_base, batch 8192" 60 env BIN=$B/dlrec BIN_B=$B/dlrec_base \
    DEVICES="cuda cuda" bench/gpu_train.sh 1000000 8192
  part "bench/gpu_train.sh, this build against dlrec_base, the small DLRM in bf16 at batch 65536" 90 env \
    BIN=$B/dlrec BIN_B=$B/dlrec_base DEVICES="cuda/bf16 cuda/bf16" bench/gpu_train.sh 4000000 65536 \
    examples/dlrm_dle_small.json
fi
echo "== [+$(($(date +%s) - t0))s] done, $([ $failed = 0 ] && echo 'all passed' || echo 'some FAILED')"
exit $failed
