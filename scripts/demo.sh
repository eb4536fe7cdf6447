#!/usr/bin/env bash
# The main job on an embedded default: synthesize Criteo-like click logs with
# known click probabilities, fit the ETL, encode train/valid .dlr files,
# verify them, train the Kaggle-shaped DLRM for one epoch, evaluate it, and
# report its AUC next to the best possible one (that of the true
# probabilities).
#   DEMO_ROWS   rows to synthesize (default 2000000)
#   DEMO_DIR    where the files go (default build/demo)
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=build/dlrec
ROWS=${DEMO_ROWS:-2000000}
DIR=${DEMO_DIR:-build/demo}
mkdir -p "$DIR"

say() { printf '\n== %s\n' "$*"; }
# Runs a step and prints its wall time; the rate is computed from the rows.
timed() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@"
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" -v r="$ROWS" 'BEGIN { s = b - a; printf "   %.2f s, %.2fM rows/s\n", s, r / s / 1e6 }'
}

say "synthesize $ROWS click-log rows (Criteo layout, hidden ground-truth model)"
timed $BIN synth --rows "$ROWS" --seed 1 --max-cardinality 200000 \
  --out "$DIR/clicks.tsv" --probs "$DIR/clicks.probs" 2> >(tee "$DIR/synth.log" >&2)
ls -l "$DIR/clicks.tsv" | awk '{ printf "   %s: %.1f MB\n", $9, $5 / 1e6 }'

say "etl fit: vocabularies (frequency-ordered, min count 4) and dense statistics"
timed $BIN etl fit --input "$DIR/clicks.tsv" --out "$DIR/etl" --min-count 4

say "etl apply: encode into train/valid .dlr files (10% validation)"
timed $BIN etl apply --etl "$DIR/etl" --input "$DIR/clicks.tsv" --out "$DIR/train.dlr" \
  --valid-fraction 0.1 --valid-out "$DIR/valid.dlr" --seed 7

say "inspect: schema and checksums of the validation file"
$BIN inspect "$DIR/valid.dlr"

say "train: the Kaggle-shaped DLRM (examples/dlrm_synth.json), one epoch"
rm -rf "$DIR/run"
$BIN train --config examples/dlrm_synth.json --train "$DIR/train.dlr" --valid "$DIR/valid.dlr" \
  --etl "$DIR/etl" --out "$DIR/run" > "$DIR/train.json"
grep -E '"(steps|samples_per_s)"' "$DIR/train.json" | tr -d ',\t' | sed 's/^/   /'

say "eval: the trained model on the validation rows"
$BIN eval --model "$DIR/run" --data "$DIR/valid.dlr" | tee "$DIR/eval.json"
auc=$(grep '"auc"' "$DIR/eval.json" | tr -dc '0-9.')
best=$(grep -o 'true p: AUC [0-9.]*' "$DIR/synth.log" | awk '{ print $4 }')
printf '\n   AUC %s; best possible (true click probabilities) %s\n' "$auc" "$best"

say "done: files in $DIR"
ls -l "$DIR" | awk 'NR > 1 { printf "   %-14s %10.1f MB\n", $9, $5 / 1e6 }'
