#!/usr/bin/env bash
# The main job on an embedded default: synthesize Criteo-like click logs with
# known click probabilities, fit the ETL, encode train/valid .dlr files,
# verify them, train the Kaggle-shaped DLRM for one epoch, evaluate it,
# report its AUC next to the best possible one (that of the true
# probabilities), then serve the model over HTTP, score three rows through
# the server and through `dlrec predict`, and stop the server.
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
awk -v a="$auc" -v b="$best" 'BEGIN { printf "\n   AUC %.4f; best possible (true click probabilities) %.4f; gap %.4f\n", a, b, b - a }'

say "serve: the model over HTTP (KServe v2 / Triton protocol); three rows through the server and predict"
rm -f "$DIR/serve.port"
$BIN serve --model "$DIR/run" --port 0 --port-file "$DIR/serve.port" -q &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 200); do [ -s "$DIR/serve.port" ] && break; sleep 0.05; done
port=$(cat "$DIR/serve.port")
# A request without curl or python: bash's /dev/tcp. Prints the response body.
http() { # METHOD PATH [BODY]
  local body=${3:-}
  exec 3<>"/dev/tcp/127.0.0.1/$port"
  printf '%s %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
    "$1" "$2" "${#body}" "$body" >&3
  sed '1,/^\r$/d' <&3
  exec 3<&-
}
head -3 "$DIR/clicks.tsv" | cut -f2- > "$DIR/rows.tsv"
# The raw features as a client logs them: 13 dense and 26 categorical strings per row.
request=$(awk -F'\t' '
  function row(from, to,   i, s) { s = "["; for (i = from; i <= to; i++) s = s (i > from ? "," : "") "\"" $i "\""; return s "]" }
  { d = d (NR > 1 ? "," : "") row(1, 13); c = c (NR > 1 ? "," : "") row(14, 39) }
  END { printf "{\"id\":\"demo\",\"inputs\":[{\"name\":\"dense\",\"datatype\":\"BYTES\",\"shape\":[%d,13],\"data\":[%s]},", NR, d
        printf "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[%d,26],\"data\":[%s]}]}", NR, c }' "$DIR/rows.tsv")
printf '   GET /v2/health/ready: '; LC_ALL=C http GET /v2/health/ready >/dev/null && echo ok
printf '   GET /v2/models/dlrm:  '; LC_ALL=C http GET /v2/models/dlrm; echo
printf '   POST /v2/models/dlrm/infer: '; LC_ALL=C http POST /v2/models/dlrm/infer "$request"; echo
$BIN predict --model "$DIR/run" --input "$DIR/rows.tsv" --no-label --out "$DIR/rows.scores" -q
printf '   dlrec predict on the same rows: %s\n' "$(paste -sd, "$DIR/rows.scores")"
kill "$server"
wait "$server" || true
trap - EXIT

say "done: files in $DIR"
ls -l "$DIR" | awk 'NR > 1 { printf "   %-14s %10.1f MB\n", $9, $5 / 1e6 }'
say "the training report (curves, calibration, time, data, config; dlrec report RUN rebuilds it):"
echo "   $(cd "$DIR/run" && pwd)/report.html"
