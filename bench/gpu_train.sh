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
#   HOT="A B": training.hot_fraction of the first and the second run (with
#     PLACEMENT=host: "0.1 0" times hot rows on the GPU against none)
#   BIN_B: the dlrec the second run uses (default BIN, the first's): with
#     DEVICES="cuda cuda", two builds side by side on one GPU
#   CARDINALITIES: dlrec synth's --cardinalities (criteo-1tb: the columns of
#     NVIDIA's DLRM benchmark, uncapped); default: Criteo Kaggle's, capped at
#     200000 values a column
#   MIN_COUNT: the ETL's --min-count (default 4); the table holds the values
#     seen that often, so its size follows ROWS
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/dlrec}
BIN_B=${BIN_B:-$BIN}
ROWS=${1:-1000000}
BATCH=${2:-8192}
CFG=${3:-examples/dlrm_synth.json}
read -r A B <<< "${DEVICES:-cuda cpu}"
read -r HOT_A HOT_B <<< "${HOT:-}"
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT

if [[ "$A $B" == *cuda* ]] && ! "$BIN" version | grep -q '^  cuda  cuda:0 '; then
  echo "gpu_train.sh: no GPU: $("$BIN" version | grep '^  cuda')" >&2
  exit 1
fi
synth=(--max-cardinality 200000)
[ -n "${CARDINALITIES:-}" ] && synth=(--cardinalities "$CARDINALITIES")
"$BIN" synth --rows "$ROWS" --seed 1 "${synth[@]}" --out "$D/c.tsv" --probs "$D/p" 2>/dev/null
"$BIN" etl fit --input "$D/c.tsv" --out "$D/etl" --min-count "${MIN_COUNT:-4}" >/dev/null 2>&1
"$BIN" etl apply --etl "$D/etl" --input "$D/c.tsv" --out "$D/t.dlr" --valid-fraction 0.1 --valid-out "$D/v.dlr" \
  --seed 7 >/dev/null 2>&1
echo "gpu_train.sh: $("$BIN" inspect "$D/t.dlr" --json | python3 -c \
  'import json, sys; j = json.load(sys.stdin); print(j["rows"], "training rows; the table:", j["table_rows"], "rows")')"
i=0
for run in "$A" "$B"; do
  i=$((i + 1))
  name=${i}_${run//\//_}
  bin=$BIN hot=${HOT_A:-}
  [ $i = 2 ] && bin=$BIN_B hot=${HOT_B:-}
  python3 - "$CFG" "$BATCH" "$D/cfg_$name.json" "${PLACEMENT:-}" "$([[ $run == */* ]] && echo "${run#*/}")" "$hot" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.setdefault("training", {})["batch_size"] = int(sys.argv[2])
if sys.argv[4]:
    c["training"]["table_placement"] = sys.argv[4]
if sys.argv[5]:
    c["training"]["precision"] = sys.argv[5]
if sys.argv[6]:
    c["training"]["hot_fraction"] = float(sys.argv[6])
c.setdefault("eval", {})["interval_steps"] = 10**9  # validation at the end only
json.dump(c, open(sys.argv[3], "w"))
PY
  "$bin" train -q --config "$D/cfg_$name.json" --train "$D/t.dlr" --valid "$D/v.dlr" --etl "$D/etl" \
    --out "$D/run_$name" --device "${run%%/*}" > "$D/$name.json"
done
python3 - "$D" "$("$BIN" version | grep '^  cuda' | sed 's/^  cuda  //')" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" \
  "$(nproc)" "$CFG" "$BATCH" "$A" "$B" "$([ "$BIN_B" != "$BIN" ] && echo "$BIN_B")" "${HOT:-}" <<'PY'
import json, sys
d, gpu, cpu, cores, cfg, batch, a, b, bin_b = sys.argv[1:10]
hot_a, hot_b = (sys.argv[10].split() + ["", ""])[:2]
runs = [(a + (f" hot {hot_a}" if hot_a else ""), f"{d}/1_{a.replace('/', '_')}.json"),
        (b + (f" hot {hot_b}" if hot_b else "") + (f" ({bin_b})" if bin_b else ""), f"{d}/2_{b.replace('/', '_')}.json")]
r = [(label, json.load(open(path))) for label, path in runs]
print(f"{cfg}, batch {batch}; GPU: {gpu}; CPU:{cpu}, {cores} cores")
w = max(10, max(len(label) for label, _ in r))
print(f"{'run':{w}} {'samples/s':>12} {'valid AUC':>10} {'steps':>6}")
for label, x in r:
    print(f"{label:{w}} {x['samples_per_s']:12.0f} {x['valid']['auc']:10.5f} {x['steps']:6d}")
(la, xa), (lb, xb) = r
print(f"{la} / {lb}: {xa['samples_per_s'] / xb['samples_per_s']:.2f}x, "
      f"|dAUC| {abs(xa['valid']['auc'] - xb['valid']['auc']):.5f}")
PY
