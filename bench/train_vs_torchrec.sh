#!/usr/bin/env bash
# DLRM training speed and quality, dlrec against TorchRec + FBGEMM, fp32 and bf16, on the same data.
#
# usage: bench/torchrec/setup.sh                 (once: the TorchRec venv, from PyPI)
#        bench/train_vs_torchrec.sh               (ROWS=1000000 CAP=200000 by default)
#        ROWS=200000 BATCHES="128 2048" REPEATS=1 bench/train_vs_torchrec.sh
#
# Synthesizes ROWS Criteo-like rows and encodes train.dlr and valid.dlr (10%
# held out) as bench/train_vs_torch.sh does. Then, for each batch size in
# BATCHES (default "128 2048"), trains one epoch of the Kaggle-shaped DLRM
# (examples/dlrm_criteo.json: SGD lr 0.1 dense and sparse) with
#   - dlrec train, THREADS compute threads (default 2), in each precision of
#     PRECISIONS (default "fp32 bf16"): bf16 through the config's
#     training.precision, skipped with dlrec's message where dlrec rejects it;
#   - bench/torchrec/trec_dlrm.py, the same model, init scheme and optimizer in
#     TorchRec (EmbeddingBagCollection + DistributedModelParallel, FBGEMM's
#     table-batched embeddings with SGD fused into backward), in each precision
#     of PRECISIONS (bf16: torch.autocast), with each thread count of
#     TREC_THREADS (default: THREADS), keeping the fastest;
# in REPEATS rounds (default 2, the runs alternating, each keeping its fastest
# run), and prints samples/s, its ratio to TorchRec fp32 and to TorchRec bf16,
# the validation AUC and peak RSS of each.
#
# What is timed: dlrec's samples_per_s counts its training loop with data
# loading; TorchRec's counts its training loop alone (its batches are built
# before the clock starts, as TorchRec's recipe does; TREC_TIME_LOADING=1 puts
# that inside the clock too). Evaluation is never timed.
#
# On a CPU without avx512_bf16 or AMX, PyTorch's bf16 matmuls are emulated and
# run about 10x slower than fp32, so TorchRec bf16 trains only its first
# BF16_ROWS rows there (default 16384) and evaluates on as many validation
# rows; its AUC is then marked and is not comparable. BF16_ROWS=0 trains on all.
#
# The last table (bench/step_shares.py) puts each dlrec run's step, phase by phase,
# against bench_roofline's GEMM limits on the same shapes, measured per batch size.
# Needs a built dlrec (build/dlrec and build/bench_roofline, or DLREC_BIN), /usr/bin/python3 and the
# venv of bench/torchrec/setup.sh (TREC_VENV, default .venv-torchrec).
set -euo pipefail

rows=${ROWS:-1000000}
cap=${CAP:-200000}
batches=${BATCHES:-128 2048}
threads=${THREADS:-2}
trec_threads=${TREC_THREADS:-$threads}
repeats=${REPEATS:-2}
precisions=${PRECISIONS:-fp32 bf16}
# Both engines run under the same OpenMP wait policy, passive by default (see
# bench/train_vs_torch.sh: spinning workers starve the process's other threads
# on a machine with as many cores as compute threads).
wait=${OMP_WAIT_POLICY:-PASSIVE}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
py=${PYTHON:-/usr/bin/python3}
venv=${TREC_VENV:-$root/.venv-torchrec}
tpy=$venv/bin/python
roofline=${ROOFLINE_BIN:-$(dirname "$bin")/bench_roofline}
[ -x "$roofline" ] || { echo "train_vs_torchrec: no bench_roofline at $roofline (run 'make build')" >&2; exit 1; }
[ -x "$bin" ] || { echo "train_vs_torchrec: no dlrec at $bin (run 'make build' or set DLREC_BIN)" >&2; exit 1; }
for p in $precisions; do
  case $p in fp32 | bf16) ;; *) echo "train_vs_torchrec: PRECISIONS: '$p' is not fp32 or bf16" >&2; exit 1 ;; esac
done
if ! "$tpy" -c 'import torch, torchrec, fbgemm_gpu' 2>/dev/null; then
  echo "train_vs_torchrec: no TorchRec venv at $venv (run bench/torchrec/setup.sh, or set TREC_VENV)" >&2
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-trec-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
# run_rss, json_get, faster, cpu_line, make_criteo_data, dlrm_config
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

# Without native bf16 (avx512_bf16 or AMX), TorchRec bf16 trains on a prefix.
native_bf16=0
grep -qw -e avx512_bf16 -e amx_bf16 /proc/cpuinfo && native_bf16=1
bf16_rows=${BF16_ROWS:-$([ "$native_bf16" = 1 ] && echo 0 || echo 16384)}

echo "train_vs_torchrec: $rows rows (cap $cap), dlrec $("$bin" version | head -1 | cut -d' ' -f2)," \
  "$(cd /tmp && "$tpy" -c 'import torch; from importlib import metadata as m
print("torch", torch.__version__, "torchrec", m.version("torchrec"), "fbgemm-gpu-cpu", m.version("fbgemm-gpu-cpu"),
      "(cpu capability %s)" % torch.backends.cpu.get_cpu_capability())' 2>/dev/null)"
cpu_line
echo "load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
make_criteo_data "$rows" "$cap"
echo "  data: $train_rows train rows, $valid_rows valid rows, 26 tables with $table_rows rows in all"

# The engines of one batch size, in the order they run and print: each is
# ENGINE:PRECISION. dlrec bf16 is there only if dlrec accepts the config key.
engines=()
for p in $precisions; do
  if [ "$p" = bf16 ]; then
    dlrm_config "$work/probe.json" 128 "$threads" 'training.precision="bf16"'
    if "$bin" train --config "$work/probe.json" --train "$work/train.dlr" --etl "$work/etl" \
      --out "$work/probe-run" --max-steps 1 -q > /dev/null 2> "$work/probe.err"; then
      engines+=(dlrec:bf16)
    else
      echo "  dlrec bf16 skipped: $(head -1 "$work/probe.err")"
    fi
    rm -rf "$work/probe-run"
  else
    engines+=(dlrec:fp32)
  fi
done
for p in $precisions; do engines+=("torchrec:$p"); done
if [[ " ${engines[*]} " == *" torchrec:bf16 "* ]] && [ "$bf16_rows" -gt 0 ]; then
  echo "  torchrec bf16: this CPU has no avx512_bf16 or AMX; it trains on the first $bf16_rows rows only (BF16_ROWS)"
fi
trec_opts=()
[ "${TREC_TIME_LOADING:-0}" = 1 ] && trec_opts+=(--time-loading)

# run_engine ENGINE PRECISION BATCH THREADS OUT: one run, its JSON summary into OUT, peak RSS into OUT.rss
run_engine() {
  local eng=$1 prec=$2 b=$3 t=$4 out=$5
  if [ "$eng" = dlrec ]; then
    local cfg=$work/cfg-$b-$prec.json
    if [ "$prec" = bf16 ]; then
      dlrm_config "$cfg" "$b" "$t" 'training.precision="bf16"'
    else
      dlrm_config "$cfg" "$b" "$t"
    fi
    OMP_WAIT_POLICY=$wait run_rss "$out.rss" "$bin" train --config "$cfg" --train "$work/train.dlr" \
      --valid "$work/valid.dlr" --etl "$work/etl" --out "$work/run" -q > "$out"
    rm -rf "$work/run"
  else
    local opts=("${trec_opts[@]}")
    if [ "$prec" = bf16 ]; then
      opts+=(--bf16)
      [ "$bf16_rows" -gt 0 ] && opts+=(--max-rows "$bf16_rows" --max-valid-rows "$bf16_rows")
    fi
    OMP_WAIT_POLICY=$wait run_rss "$out.rss" "$tpy" "$root/bench/torchrec/trec_dlrm.py" --train "$work/train.dlr" \
      --valid "$work/valid.dlr" --batch "$b" --threads "$t" "${opts[@]}" > "$out" 2> "$out.err" ||
      { cat "$out.err" >&2; return 1; }
  fi
}

results=()
roofs=()
for b in $batches; do
  # The machine's limits on this step's own GEMM shapes, in the same run:
  # sgemm (what fp32 runs on) and oneDNN's bf16 matmul (what bf16 runs on
  # where the CPU has bf16 instructions).
  echo "  batch $b: bench_roofline ..."
  OMP_WAIT_POLICY=$wait "$roofline" --data "$work/train.dlr" --batch "$b" --threads "$threads" > "$work/roof-$b.json"
  # REPEATS rounds, the runs alternating; each keeps its fastest, so that a
  # burst of load from elsewhere on a shared machine hits all of them alike.
  declare -A best=()
  for round in $(seq "$repeats"); do
    for e in "${engines[@]}"; do
      eng=${e%:*} prec=${e#*:}
      tlist=$threads
      [ "$eng" = torchrec ] && tlist=$trec_threads
      for t in $tlist; do
        echo "  batch $b, round $round: $eng $prec ($t threads) ..."
        run_engine "$eng" "$prec" "$b" "$t" "$work/out.json"
        s=$(json_get "$work/out.json" "j['samples_per_s']")
        echo "    $(tr -d ' \t\n' < "$work/out.json" | cut -c1-400)"
        if faster "$s" "${best[$e]:-0}"; then
          best[$e]=$s
          cp "$work/out.json" "$work/best-$b-$eng-$prec.json"
          cp "$work/out.json.rss" "$work/best-$b-$eng-$prec.rss"
          echo "$t" > "$work/best-$b-$eng-$prec.thr"
        fi
      done
    done
  done
  tf=${best[torchrec:fp32]:-} tb=${best[torchrec:bf16]:-}
  for e in "${engines[@]}"; do
    eng=${e%:*} prec=${e#*:}
    f=$work/best-$b-$eng-$prec
    if [ "$eng" = dlrec ]; then
      auc=$(json_get "$f.json" "j['valid']['auc']") mark=
    else
      auc=$(json_get "$f.json" "j['auc']") mark=
      [ "$prec" = bf16 ] && [ "$bf16_rows" -gt 0 ] && mark='*'
    fi
    results+=("$b $eng $prec $(cat "$f.thr") ${best[$e]} ${tf:--} ${tb:--} $(printf '%.4f' "$auc")$mark $(cat "$f.rss")")
    [ "$eng" = dlrec ] && roofs+=("$("$py" "$root/bench/step_shares.py" "$f.json" "$work/roof-$b.json" "$b" "$prec")")
  done
  unset best
done

echo
echo "DLRM (13-512-256-64-16, 26 x EmbeddingBag dim 16, dot, 367-512-256-1), SGD lr 0.1, 1 epoch of $train_rows rows"
echo "dlrec: $threads threads; torchrec: best of threads {$trec_threads}; OMP_WAIT_POLICY=$wait; best of $repeats rounds"
echo "samples/s: dlrec's training loop with data loading; torchrec's training loop" \
  "$([ "${TREC_TIME_LOADING:-0}" = 1 ] && echo "with batch building" || echo "alone (batches built beforehand)")"
printf '%6s %-9s %-5s %4s %11s %10s %10s %9s %10s\n' batch engine prec thr samples/s vs_trec32 vs_trec16 valid_AUC peak_RSS
for r in "${results[@]}"; do
  set -- $r
  awk -v b="$1" -v e="$2" -v p="$3" -v t="$4" -v s="$5" -v tf="$6" -v tb="$7" -v auc="$8" -v rss="${9:--}" 'BEGIN {
    r32 = (tf == "-") ? "-" : sprintf("%.2fx", s / tf)
    r16 = (tb == "-") ? "-" : sprintf("%.2fx", s / tb)
    rs = (rss == "-" || rss == "") ? "-" : sprintf("%.0f MiB", rss / 1024)
    printf "%6d %-9s %-5s %4d %11.0f %10s %10s %9s %10s\n", b, e, p, t, s, r32, r16, auc, rs
  }'
done
if [[ " ${engines[*]} " == *" torchrec:bf16 "* ]] && [ "$bf16_rows" -gt 0 ]; then
  echo "* torchrec bf16 trained on the first $bf16_rows rows only and was evaluated on as many validation rows"
  echo "  (no avx512_bf16 or AMX here, so bf16 is emulated): its samples/s compares, its AUC does not"
fi
echo
echo "dlrec's step against the machine's limit (bench_roofline, same run): the MLPs' GFLOP/s against sgemm (fp32)"
echo "or oneDNN's bf16 matmul (bf16) on the step's own GEMM shapes, and each phase's share of the training loop"
printf '%6s %-5s %9s %9s %7s %6s %6s %6s %6s %6s %6s\n' batch prec mlp_GF/s limit share mlp emb_fw emb_up inter other load
for r in "${roofs[@]}"; do echo "$r"; done
