#!/usr/bin/env bash
# Online serving throughput and latency: `dlrec serve` under wrk on loopback,
# against the same model's in-process scoring (build/bench_score) in the same
# run.
#
# usage: bench/serve_vs_forward.sh      (SIZES="1 64 1024" CONNS=16 SECONDS_EACH=10)
#
# Synthesizes 200k Criteo-like rows, fits the ETL, trains the Kaggle-shaped
# DLRM (examples/dlrm_synth.json) for 200 steps, then for each request size
# in SIZES:
#   - bench_score: rows/s of the forward alone at that batch and at the
#     server's --max-batch, on THREADS threads (one OpenMP thread each, as the
#     server's workers run);
#   - wrk (Debian's wrk, a Lua script posting one JSON request of that many
#     raw rows: dense and categorical as BYTES strings, as a client logs
#     them) with CONNS connections for SECONDS_EACH seconds against
#     `dlrec serve --threads THREADS`: requests/s, predictions/s, p50/p99.
# wrk runs on the same 2 cores as the server, so the server's share is a
# lower bound.
set -euo pipefail

sizes=${SIZES:-1 64 1024}
conns=${CONNS:-16}
secs=${SECONDS_EACH:-10}
threads=${THREADS:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
score=$(dirname "$bin")/bench_score
py=${PYTHON:-/usr/bin/python3}
for x in "$bin" "$score"; do [ -x "$x" ] || { echo "serve_vs_forward: no $x (run 'make build')" >&2; exit 1; }; done
command -v wrk >/dev/null || { echo "serve_vs_forward: install wrk (scripts/deps.sh bench)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-serve-bench.XXXXXX")
server=
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

echo "serve_vs_forward: $(nproc) cores, wrk $conns connections, $secs s per size, server $threads workers"
"$bin" synth --rows 200000 --out "$work/clicks.tsv" -q
"$bin" etl fit --input "$work/clicks.tsv" --out "$work/etl" -q
"$bin" etl apply --etl "$work/etl" --input "$work/clicks.tsv" --out "$work/train.dlr" -q
"$bin" train --config "$root/examples/dlrm_synth.json" --train "$work/train.dlr" --etl "$work/etl" \
  --out "$work/run" --max-steps 200 -q > /dev/null
head -4096 "$work/clicks.tsv" | cut -f2- > "$work/rows.tsv"

"$bin" serve --model "$work/run" --port 0 --port-file "$work/port" --threads "$threads" -q &
server=$!
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
port=$(cat "$work/port")

max_batch=1024
limit=$("$score" --model "$work/run" --rows "$work/rows.tsv" --batch "$max_batch" --threads "$threads" \
  | "$py" -c 'import json,sys; print(json.load(sys.stdin)["rows_per_s"])')
results=()
for n in $sizes; do
  # One request body of n raw rows.
  "$py" - "$work/rows.tsv" "$n" > "$work/body-$n.json" <<'EOF'
import json, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][: int(sys.argv[2])]
print(json.dumps({"inputs": [
    {"name": "dense", "datatype": "BYTES", "shape": [len(rows), 13], "data": [r[:13] for r in rows]},
    {"name": "categorical", "datatype": "BYTES", "shape": [len(rows), 26], "data": [r[13:] for r in rows]}]}))
EOF
  cat > "$work/post-$n.lua" <<EOF
local f = io.open("$work/body-$n.json", "rb")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
function response(status, headers, body)
  if status ~= 200 then io.stderr:write("status " .. status .. ": " .. body .. "\n") end
end
EOF
  fwd=$("$score" --model "$work/run" --rows "$work/rows.tsv" --batch "$n" --threads "$threads" \
    | "$py" -c 'import json,sys; print(json.load(sys.stdin)["rows_per_s"])')
  wrk -t1 -c"$conns" -d"${secs}s" --latency -s "$work/post-$n.lua" "http://127.0.0.1:$port/v2/models/dlrm/infer" \
    > "$work/wrk-$n.txt" 2> "$work/wrk-$n.err" || true
  [ -s "$work/wrk-$n.err" ] && head -3 "$work/wrk-$n.err" >&2
  rps=$(awk '/^Requests\/sec:/ { print $2 }' "$work/wrk-$n.txt")
  p50=$(awk '$1 == "50%" { print $2 }' "$work/wrk-$n.txt")
  p99=$(awk '$1 == "99%" { print $2 }' "$work/wrk-$n.txt")
  non2xx=$(awk '/Non-2xx/ { print $NF }' "$work/wrk-$n.txt")
  results+=("$n $rps $p50 $p99 $fwd ${non2xx:-0}")
done
metrics_text() { exec 3<>"/dev/tcp/127.0.0.1/$port"; printf 'GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&3; cat <&3; exec 3<&-; }
batches=$(metrics_text | awk '/^dlrec_batch_rows_(sum|count)/ { v[$1] = $2 } END { if (v["dlrec_batch_rows_count"]) printf "%.1f", v["dlrec_batch_rows_sum"] / v["dlrec_batch_rows_count"] }')

echo
echo "dlrec serve ($threads workers, max batch $max_batch, delay 500 us) under wrk ($conns connections, JSON raw rows)"
echo "in-process forward (bench_score, $threads threads): $limit rows/s at batch $max_batch; mean merged batch $batches rows"
printf '%9s %12s %14s %10s %10s %16s %9s %9s %8s\n' rows/req requests/s predictions/s p50 p99 fwd_same_batch share share_max non2xx
for r in "${results[@]}"; do
  set -- $r
  awk -v n="$1" -v rps="$2" -v p50="$3" -v p99="$4" -v fwd="$5" -v lim="$limit" -v bad="$6" 'BEGIN {
    printf "%9d %12.0f %14.0f %10s %10s %16.0f %8.0f%% %8.0f%% %8s\n", n, rps, rps * n, p50, p99, fwd, 100 * rps * n / fwd,
      100 * rps * n / lim, bad }'
done
