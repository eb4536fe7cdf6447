#!/usr/bin/env bash
# Training across ranks on one machine (docs/distributed.md): 2 ranks of 1
# thread (mpirun) against 1 rank of 2 threads, side by side, at batch 2048
# and 65536, and the bytes rank 0 sends per step against the model's own
# estimate of them.
#
# usage: bench/dist.sh                 (ROWS=1000000 BATCHES="2048 65536" RANKS=2)
#        ROWS=300000 REPEAT=3 bench/dist.sh
#
# Synthesizes ROWS Criteo-like rows (Kaggle's cardinalities capped at CAP,
# default 200000), fits the ETL, and trains one epoch of the Kaggle-shaped
# DLRM (examples/dlrm_criteo.json, fp32) per batch size: once as one process
# of RANKS threads, once as RANKS processes of one thread (the same model,
# bit for bit: tests/dist/run.sh), REPEAT times each (default 1, alternating)
# keeping each side's best samples/s. The estimate of the bytes a rank sends
# in a step, for P ranks, B rows a batch, F one-hot columns of dim D, a
# row's table bytes R, U the unique rows a part looks up (measured) and W
# dense parameters:
#   requests (P-1)/P U 4  +  rows back (P-1)/P U R  +  gradients (P-1)/P (B/P) F (4 + 4D)
#   + the dense allreduce 2 (P-1)/P W 4  + the counts and agreements (P-1) 52
set -euo pipefail

rows=${ROWS:-1000000}
cap=${CAP:-200000}
batches=${BATCHES:-2048 65536}
ranks=${RANKS:-2}
repeat=${REPEAT:-1}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
py=${PYTHON:-python3}
mpirun=${MPIRUN:-mpirun}
[ -x "$bin" ] || { echo "dist: no dlrec at $bin (run 'make build' or set DLREC_BIN)" >&2; exit 1; }
command -v "$mpirun" > /dev/null || { echo "dist: no mpirun (scripts/deps.sh bench installs Open MPI)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export DLREC_PROGRESS=0

work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-dist-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

cpu_line
echo "synthesizing $rows rows ..."
make_criteo_data "$rows" "$cap"
echo "train rows $train_rows, table rows $table_rows, $ranks ranks"
printf '%-7s %14s %14s %7s %14s %14s %9s %9s\n' batch "1x${ranks}thr/s" "${ranks}x1thr/s" ratio \
  "bytes/step" "estimate" "exchange" "compute"
for batch in $batches; do
  dlrm_config "$work/cfg.json" "$batch" 0
  best1=0 bestn=0
  for _ in $(seq "$repeat"); do
    rm -rf "$work/one" "$work/mpi"
    "$bin" train --config "$work/cfg.json" --train "$work/train.dlr" --etl "$work/etl" --out "$work/one" \
      --threads "$ranks" -q > "$work/one.json"
    "$mpirun" --oversubscribe --bind-to none -np "$ranks" "$bin" train --config "$work/cfg.json" \
      --train "$work/train.dlr" --etl "$work/etl" --out "$work/mpi" --threads 1 -q > "$work/mpi.json"
    s1=$(json_get "$work/one.json" "j['samples_per_s']")
    sn=$(json_get "$work/mpi.json" "j['samples_per_s']")
    if faster "$s1" "$best1"; then best1=$s1; fi
    if faster "$sn" "$bestn"; then bestn=$sn; cp "$work/mpi.json" "$work/mpi-best.json"; fi
  done
  "$py" - "$work/mpi-best.json" "$work/cfg.json" "$ranks" "$batch" "$best1" "$bestn" <<'EOF'
import json, sys
res, cfg, P, B, s1, sn = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
d = res["distributed"]
m = cfg["model"]
D = m["embedding_dim"]
F = 26
R = ((D + 3) // 4 * 4) * 4
dims = [13] + m["bottom_mlp"]
W = sum(a * b + b for a, b in zip(dims, dims[1:]))
inter = F + 1
top_in = m["bottom_mlp"][-1] + inter * (inter - 1) // 2
tops = [top_in] + m["top_mlp"]
W += sum(a * b + b for a, b in zip(tops, tops[1:]))
U = d["rank0_unique_rows_per_step"]
f = (P - 1) / P
est = f * U * 4 + f * U * R + f * (B / P) * F * (4 + 4 * D) + 2 * f * W * 4 + (P - 1) * 52
print("%-7d %14.0f %14.0f %6.2fx %14.0f %14.0f %8.2fs %8.2fs" % (B, s1, sn, sn / s1, d["rank0_bytes_sent_per_step"], est,
      d["exchange_seconds"], d["compute_seconds"]))
open(sys.argv[1] + ".params", "w").write(str(W))
EOF
  cp "$work/mpi-best.json" "$work/mpi-$batch.json"
  cp "$work/mpi-best.json.params" "$work/mpi-$batch.params"
done
echo "ratio: ${ranks} ranks of 1 thread against 1 rank of ${ranks} threads (>1: the ranks are faster);"
echo "bytes/step: what rank 0 sent to the other ranks a step; estimate: the formula above with the measured unique rows"
# The scaling model (docs/distributed.md) fed with each batch's measured run.
for batch in $batches; do
  echo
  "$py" "$root/bench/dist_model.py" --measured "$work/mpi-$batch.json" --ranks "$ranks" --batch "$batch" \
    --params "$(cat "$work/mpi-$batch.params")"
done
