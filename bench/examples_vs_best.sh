#!/usr/bin/env bash
# Every model type's example config and the built-in default config, on
# `dlrec synth` data, against the best AUC possible on it.
#
# usage: bench/examples_vs_best.sh [CONFIG ...]
#   CONFIG: an examples/ file name without .json, or "default" (a config of
#           {} : the built-in defaults, the Kaggle DLRM with SGD)
#           (default: default and one example per model type, below)
#   environment: ROWS (2000000, the demo's), CAP (200000, the demo's
#                --max-cardinality), THREADS (2), DLREC_BIN, PYTHON
#
# Synthesizes ROWS rows as `make demo` does (scripts/demo.sh: seed 1, the
# ETL at --min-count 4, 10% held out with seed 7), trains each config for
# its own epochs (one in every example) and prints its validation AUC, the
# best possible AUC (that of the true click probabilities synth drew), the
# gap between the two, and the training samples/s. This is where the docs' "distance to the best possible AUC" of
# each default comes from (docs/config.md, "Model types"); the demo prints
# the DLRM one.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
case $bin in /*) ;; *) bin=$PWD/$bin ;; esac # the runs happen in a scratch directory
py=${PYTHON:-/usr/bin/python3}
rows=${ROWS:-2000000}
cap=${CAP:-200000}
threads=${THREADS:-2}
[ -x "$bin" ] || { echo "examples_vs_best: no dlrec at $bin (run 'make build' or set DLREC_BIN)" >&2; exit 1; }
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(default dlrm_synth lr fm wide_deep deepfm dcn_v2 dnn)
for c in "${configs[@]}"; do
  [ "$c" = default ] || [ -f "$root/examples/$c.json" ] || { echo "examples_vs_best: no examples/$c.json" >&2; exit 2; }
done
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"

work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-examples-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
"$bin" synth --rows "$rows" --seed 1 --max-cardinality "$cap" --out clicks.tsv --probs clicks.probs 2> synth.log
"$bin" etl fit -q --input clicks.tsv --out etl --min-count 4
"$bin" etl apply -q --etl etl --input clicks.tsv --out train.dlr --valid-fraction 0.1 --valid-out valid.dlr --seed 7
# The best possible AUC: that of the true click probabilities, over every
# row synth wrote (as the demo prints it; the held-out tenth's differs by
# about 0.001).
best=$(grep -o 'true p: AUC [0-9.]*' synth.log | awk '{ print $4 }')
cpu_line
echo "rows: $rows (90% to train, 10% held out), --max-cardinality $cap, $threads threads"
printf '%-12s %8s %8s %8s %12s\n' config auc best gap samples/s
for c in "${configs[@]}"; do
  if [ "$c" = default ]; then echo '{}' > default.json; cfg=default.json; else cfg=$root/examples/$c.json; fi
  rm -rf run
  "$bin" train -q --config "$cfg" --threads "$threads" --train train.dlr --valid valid.dlr --etl etl --out run > out.json
  auc=$(json_get out.json "j['valid']['auc']")
  sps=$(json_get out.json "j['samples_per_s']")
  awk -v c="$c" -v a="$auc" -v b="$best" -v s="$sps" 'BEGIN { printf "%-12s %8.4f %8.4f %8.4f %12.0f\n", c, a, b, b - a, s }'
done
