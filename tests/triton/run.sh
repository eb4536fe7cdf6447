#!/usr/bin/env bash
# The official Triton HTTP client against `dlrec serve`: installs
# tritonclient[http] from PyPI into a virtual environment under the build
# tree (once), trains a small model, serves it, and runs infer.py, which
# requires the client's scores to equal `dlrec predict`'s bit for bit.
# usage: tests/triton/run.sh DLREC_BIN WORKDIR
set -euo pipefail
bin=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=$work/venv
mkdir -p "$work"
. "$root/tests/venv.sh"
venv_ready "$venv" 'import tritonclient.http, numpy' 'tritonclient[http]'
run=$work/run
rm -rf "$run" "$work/port"
"$bin" synth --rows 20000 --out "$work/clicks.tsv" -q
"$bin" etl fit --input "$work/clicks.tsv" --out "$work/etl" -q
"$bin" etl apply --etl "$work/etl" --input "$work/clicks.tsv" --out "$work/train.dlr" -q
"$bin" train --config "$root/examples/dlrm_synth.json" --train "$work/train.dlr" --etl "$work/etl" \
  --out "$run" --max-steps 5 -q > /dev/null
head -50 "$work/clicks.tsv" | cut -f2- > "$work/rows.tsv"
"$bin" predict --model "$run" --input "$work/rows.tsv" --no-label --out "$work/scores.txt" -q
"$bin" serve --model "$run" --port 0 --port-file "$work/port" -q &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 400); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || { echo "run.sh: the server did not start" >&2; exit 1; }
"$venv/bin/python" "$here/infer.py" "$(cat "$work/port")" "$work/rows.tsv" "$work/scores.txt"
kill "$server"
wait "$server"
trap - EXIT
