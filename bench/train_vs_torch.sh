#!/usr/bin/env bash
# DLRM training speed and quality, dlrec against PyTorch, on the same data.
#
# usage: bench/train_vs_torch.sh            (ROWS=1000000 CAP=200000 by default)
#        ROWS=100000 bench/train_vs_torch.sh
#
# Synthesizes ROWS Criteo-like rows (categorical columns capped at CAP
# distinct values), fits the ETL (--min-count 2) and encodes train.dlr and
# valid.dlr (10% held out). Then, for each batch size in BATCHES (default
# "128 2048"), trains one epoch of the Kaggle-shaped DLRM
# (examples/dlrm_criteo.json: SGD lr 0.1 dense and sparse) with
#   - dlrec train, THREADS compute threads (default 2);
#   - bench/torch_dlrm.py, the same architecture, init scheme and optimizer in
#     PyTorch (nn.EmbeddingBag sparse=True + torch.optim.SGD), with 1 and with
#     2 threads (TORCH_THREADS), keeping the faster run;
# in REPEATS rounds (default 2, the engines alternating, each keeping its
# fastest run), and prints samples/s (the training loop, data loading
# included, evaluation excluded, on both sides), the validation AUC and
# calibration of each, and peak RSS. Before each batch size, build/bench_roofline
# measures the machine's limits in the same run: the fp32 GEMMs' peak and
# their rate on the step's own GEMM shapes (oneDNN's or OpenBLAS's, whichever
# dlrec's fp32 runs on here), and a prefetching gather of the file's ids;
# the last table puts dlrec's own profile (`dlrec train`'s "profile") against
# them.
# Needs /usr/bin/python3 with torch and numpy (Debian python3-torch) and a
# built dlrec (build/dlrec and build/bench_roofline, or DLREC_BIN).
set -euo pipefail

rows=${ROWS:-1000000}
cap=${CAP:-200000}
batches=${BATCHES:-128 2048}
threads=${THREADS:-2}
torch_threads=${TORCH_THREADS:-1 2}
repeats=${REPEATS:-2}
# Both engines run under the same OpenMP wait policy, passive by default: with
# an active (spinning) policy on a machine with as many cores as compute
# threads, idle OpenMP workers spin against the other threads of the process
# (dlrec's prefetching loader, PyTorch's autograd) and time out of the run.
wait=${OMP_WAIT_POLICY:-PASSIVE}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
roofline=${ROOFLINE_BIN:-$(dirname "$bin")/bench_roofline}
py=${PYTHON:-/usr/bin/python3}
[ -x "$bin" ] || { echo "train_vs_torch: no dlrec at $bin (run 'make build' or set DLREC_BIN)" >&2; exit 1; }
[ -x "$roofline" ] || { echo "train_vs_torch: no bench_roofline at $roofline (run 'make build')" >&2; exit 1; }
if ! "$py" -c 'import torch, numpy' 2>/dev/null; then
  echo "install python3-torch (apt-get install python3-torch)"
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-train-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

# run_rss, json_get, faster, make_criteo_data, dlrm_config
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

echo "train_vs_torch: $rows rows (cap $cap), $(nproc) cores, dlrec $("$bin" version | head -1 | cut -d' ' -f2)," \
  "torch $("$py" -c 'import torch; print(torch.__version__)')"
make_criteo_data "$rows" "$cap"
echo "  data: $train_rows train rows, $valid_rows valid rows, 26 tables with $table_rows rows in all"

results=() roofs=()
for b in $batches; do
  # dlrec: examples/dlrm_criteo.json with this batch size, THREADS threads, one epoch
  cfg=$work/cfg-$b.json
  dlrm_config "$cfg" "$b" "$threads"
  # REPEATS rounds, the engines alternating; each keeps its fastest run, so
  # that a burst of load from elsewhere on a shared machine hits both alike.
  # Each round also measures the machine's limits for this batch size, and
  # the best of each is kept.
  d_sps=0 d_rss= t_sps=0 t_auc=nan t_cal=nan t_thr=0 t_rss=
  for round in $(seq "$repeats"); do
    OMP_WAIT_POLICY=$wait "$roofline" --data "$work/train.dlr" --batch "$b" --threads "$threads" \
      > "$work/roof-$b-$round.json"
    echo "  batch $b, round $round: limits $(cat "$work/roof-$b-$round.json")"
    echo "  batch $b, round $round: dlrec ($threads threads) ..."
    OMP_WAIT_POLICY=$wait run_rss "$work/dlrec.rss" "$bin" train --config "$cfg" --train "$work/train.dlr" \
      --valid "$work/valid.dlr" --etl "$work/etl" --out "$work/run-$b" -q > "$work/dlrec.json"
    rm -rf "$work/run-$b"
    s=$(json_get "$work/dlrec.json" "j['samples_per_s']")
    echo "    $(tr -d ' \t\n' < "$work/dlrec.json")"
    if faster "$s" "$d_sps"; then
      d_sps=$s d_rss=$(cat "$work/dlrec.rss")
      cp "$work/dlrec.json" "$work/dlrec-$b.json"
    fi
    for t in $torch_threads; do
      echo "  batch $b, round $round: pytorch ($t threads) ..."
      OMP_WAIT_POLICY=$wait run_rss "$work/torch.rss" "$py" "$root/bench/torch_dlrm.py" \
        --train "$work/train.dlr" --valid "$work/valid.dlr" --batch "$b" --threads "$t" > "$work/torch.json"
      s=$(json_get "$work/torch.json" "j['samples_per_s']")
      echo "    $(cat "$work/torch.json")"
      if faster "$s" "$t_sps"; then
        t_sps=$s t_thr=$t t_rss=$(cat "$work/torch.rss")
        t_auc=$(json_get "$work/torch.json" "j['auc']")
        t_cal=$(json_get "$work/torch.json" "j['calibration']")
      fi
    done
  done
  "$py" -c 'import json, sys
rs = [json.load(open(f)) for f in sys.argv[1:]]
print(json.dumps({k: max(r[k] for r in rs) for k in rs[0]}))' "$work"/roof-"$b"-*.json > "$work/roof-$b.json"
  d_auc=$(json_get "$work/dlrec-$b.json" "j['valid']['auc']")
  d_cal=$(json_get "$work/dlrec-$b.json" "j['valid']['calibration']")
  results+=("$b $d_sps $t_sps $t_thr $d_auc $t_auc $d_cal $t_cal ${d_rss:--} ${t_rss:--}")
  # Shares of the machine's limits: the MLPs' GFLOP/s against the fp32 GEMMs'
  # peak and against them on the same shapes; the embedding lookups' ids/s against a
  # plain prefetching gather of the same ids from cold caches (in a step the
  # MLPs' activations evict the table between lookups).
  mlp=$(json_get "$work/dlrec-$b.json" "j['profile']['mlp_gflops']")
  mlp_s=$(json_get "$work/dlrec-$b.json" "j['profile']['mlp_seconds']")
  emb=$(json_get "$work/dlrec-$b.json" "j['profile']['embedding_forward_ids_per_s']")
  secs=$(json_get "$work/dlrec-$b.json" "j['seconds']")
  gemms=$(json_get "$work/roof-$b.json" "j['fp32_gemms']")
  on=$(case $gemms in *oneDNN*) echo dnnl_f32 ;; *) echo sgemm ;; esac)
  peak=$(json_get "$work/roof-$b.json" "j['${on}_peak_gflops']")
  shapes=$(json_get "$work/roof-$b.json" "j['${on}_model_gflops']")
  gather=$(json_get "$work/roof-$b.json" "j['cold_gather_ids_per_s']")
  roofs+=("$(awk -v b="$b" -v mlp="$mlp" -v ms="$mlp_s" -v s="$secs" -v peak="$peak" -v shapes="$shapes" \
    -v emb="$emb" -v g="$gather" 'BEGIN {
    printf "%6d %9.1f %10.1f %6.0f%% %11.1f %6.0f%% %8.0f%% %12.0fM %10.0fM %6.0f%%", b, mlp, peak, 100 * mlp / peak,
      shapes, 100 * mlp / shapes, 100 * ms / s, emb / 1e6, g / 1e6, 100 * emb / g }')")
done

echo
echo "DLRM (13-512-256-64-16, 26 x EmbeddingBag dim 16, dot, 367-512-256-1), SGD lr 0.1, 1 epoch of $train_rows rows"
echo "dlrec: $threads threads; pytorch: best of threads {$torch_threads}; both OMP_WAIT_POLICY=$wait; best of $repeats rounds"
printf '%6s %14s %14s %8s %9s %9s %9s %9s %9s %11s %11s\n' batch dlrec_samp/s torch_samp/s speedup dlrec_AUC torch_AUC \
  AUC_diff dlrec_cal torch_cal dlrec_RSS torch_RSS
for r in "${results[@]}"; do
  set -- $r
  awk -v b="$1" -v ds="$2" -v ts="$3" -v tt="$4" -v da="$5" -v ta="$6" -v dc="$7" -v tc="$8" -v dr="$9" -v tr="${10}" 'BEGIN {
    drs = (dr == "-") ? "-" : sprintf("%.0f MiB", dr / 1024)
    trs = (tr == "-") ? "-" : sprintf("%.0f MiB", tr / 1024)
    printf "%6d %14.0f %11.0f(%dt) %7.2fx %9.4f %9.4f %+9.4f %9.3f %9.3f %11s %11s\n", b, ds, ts, tt, ds / ts, da, ta,
      da - ta, dc, tc, drs, trs
  }'
done
echo
echo "dlrec against the machine's limits (bench_roofline, same run): the MLPs' GFLOP/s against its $gemms on 2048^3"
echo "and on the step's own GEMM shapes, the MLPs' share of the loop, and embedding lookups against a"
echo "prefetching gather of the same ids from cold caches"
printf '%6s %9s %10s %7s %11s %7s %9s %13s %11s %7s\n' batch mlp_GF/s gemm_peak share gemm_shape share mlp_time \
  lookup_ids/s gather_ids share
for r in "${roofs[@]}"; do echo "$r"; done
# Embedding tables: table_rows x 16 f32 (dlrec pads rows to a multiple of 4
# floats: 16 already is). Plain SGD keeps no optimizer state on either side.
awk -v n="$table_rows" 'BEGIN {
  printf "embedding tables: %d rows x 16 f32 = %.1f MiB; optimizer state (SGD): 0 bytes\n", n, n * 16 * 4 / 1048576
}'
