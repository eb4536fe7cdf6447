#!/usr/bin/env bash
# `dlrec train` on a GPU against the same machine's CPU cores, side by side
# in one run: synthetic click logs (dlrec synth), the ETL, one epoch of the
# config's model on each device, then samples/s, the ratio and each run's
# validation AUC. Needs a GPU (dlrec version lists it) and python3.
#
#   bench/gpu_train.sh [ROWS] [BATCH] [CONFIG]
#     ROWS    rows to synthesize (default 1000000; 10% validation)
#     BATCH   training.batch_size (default 8192)
#     CONFIG  the training config (default examples/dlrm_synth.json)
#   DEVICES="cuda cpu": the two runs compared, the first against the second:
#     a device, or DEVICE/PRECISION for training.precision too ("cuda/bf16
#     cuda/fp32": mixed precision against fp32 on the GPU)
#   PLACEMENT=host: training.table_placement for both runs (default: the
#     config's; "host" keeps the table in host memory on the GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/dlrec}
ROWS=${1:-1000000}
BATCH=${2:-8192}
CFG=${3:-examples/dlrm_synth.json}
read -r A B <<< "${DEVICES:-cuda cpu}"
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT

if [[ "$A $B" == *cuda* ]] && ! "$BIN" version | grep -q '^  cuda  cuda:0 '; then
  echo "gpu_train.sh: no GPU: $("$BIN" version | grep '^  cuda')" >&2
  exit 1
fi
"$BIN" synth --rows "$ROWS" --seed 1 --max-cardinality 200000 --out "$D/c.tsv" --probs "$D/p" 2>/dev/null
"$BIN" etl fit --input "$D/c.tsv" --out "$D/etl" --min-count 4 >/dev/null 2>&1
"$BIN" etl apply --etl "$D/etl" --input "$D/c.tsv" --out "$D/t.dlr" --valid-fraction 0.1 --valid-out "$D/v.dlr" \
  --seed 7 >/dev/null 2>&1
for run in "$A" "$B"; do
  name=${run//\//_}
  python3 - "$CFG" "$BATCH" "$D/cfg_$name.json" "${PLACEMENT:-}" "$([[ $run == */* ]] && echo "${run#*/}")" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.setdefault("training", {})["batch_size"] = int(sys.argv[2])
if sys.argv[4]:
    c["training"]["table_placement"] = sys.argv[4]
if sys.argv[5]:
    c["training"]["precision"] = sys.argv[5]
c.setdefault("eval", {})["interval_steps"] = 10**9  # validation at the end only
json.dump(c, open(sys.argv[3], "w"))
PY
  "$BIN" train -q --config "$D/cfg_$name.json" --train "$D/t.dlr" --valid "$D/v.dlr" --etl "$D/etl" \
    --out "$D/run_$name" --device "${run%%/*}" > "$D/$name.json"
done
python3 - "$D" "$("$BIN" version | grep '^  cuda' | sed 's/^  cuda  //')" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" \
  "$(nproc)" "$CFG" "$BATCH" "$A" "$B" <<'PY'
import json, sys
d, gpu, cpu, cores, cfg, batch, a, b = sys.argv[1:]
r = {dev: json.load(open(f"{d}/{dev.replace('/', '_')}.json")) for dev in (a, b)}
print(f"{cfg}, batch {batch}; GPU: {gpu}; CPU:{cpu}, {cores} cores")
print(f"{'run':10} {'samples/s':>12} {'valid AUC':>10} {'steps':>6}")
for dev in (a, b):
    print(f"{dev:10} {r[dev]['samples_per_s']:12.0f} {r[dev]['valid']['auc']:10.5f} {r[dev]['steps']:6d}")
print(f"{a} / {b}: {r[a]['samples_per_s'] / r[b]['samples_per_s']:.2f}x, "
      f"|dAUC| {abs(r[a]['valid']['auc'] - r[b]['valid']['auc']):.5f}")
PY
