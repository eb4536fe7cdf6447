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
#   - wrk (Debian's wrk, a Lua script posting one request of that many raw
#     rows: dense and categorical as BYTES strings, as a client logs them,
#     once as JSON tensors and once with the binary tensor extension, which
#     tritonclient uses by default) with CONNS connections for SECONDS_EACH
#     seconds against `dlrec serve --threads THREADS`: requests/s,
#     predictions/s, p50/p99, and the share of the in-process forward at the
#     same batch size (share) and at the server's max batch (share_max).
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

. "$root/bench/lib.sh"
cpu_line
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
metrics_text() { exec 3<>"/dev/tcp/127.0.0.1/$port"; printf 'GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&3; cat <&3; exec 3<&-; }
# Waits until the previous run's requests have drained (wrk closes its
# connections at the deadline, but their queued requests still run).
drain() { for _ in $(seq 100); do [ "$(metrics_text | awk '$1 == "dlrec_queue_rows" { print $2 }')" = 0 ] && { sleep 0.3; return; }; sleep 0.1; done; }
results=()
for n in $sizes; do
  # One request body of n raw rows in each format: JSON tensors, and the
  # binary tensor extension (BYTES as 4-byte lengths + bytes, binary output:
  # what tritonclient sends by default).
  hl=$("$py" - "$work/rows.tsv" "$n" "$work/body-$n" <<'EOF'
import json, struct, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][: int(sys.argv[2])]
dense, cat = [r[:13] for r in rows], [r[13:] for r in rows]
open(sys.argv[3] + ".json", "w").write(json.dumps({"inputs": [
    {"name": "dense", "datatype": "BYTES", "shape": [len(rows), 13], "data": dense},
    {"name": "categorical", "datatype": "BYTES", "shape": [len(rows), 26], "data": cat}]}))
enc = lambda m: b"".join(struct.pack("<I", len(x.encode())) + x.encode() for r in m for x in r)
d, c = enc(dense), enc(cat)
hdr = json.dumps({"inputs": [
    {"name": "dense", "datatype": "BYTES", "shape": [len(rows), 13], "parameters": {"binary_data_size": len(d)}},
    {"name": "categorical", "datatype": "BYTES", "shape": [len(rows), 26], "parameters": {"binary_data_size": len(c)}}],
    "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
open(sys.argv[3] + ".bin", "wb").write(hdr + d + c)
print(len(hdr))
EOF
)
  fwd=$("$score" --model "$work/run" --rows "$work/rows.tsv" --batch "$n" --threads "$threads" \
    | "$py" -c 'import json,sys; print(json.load(sys.stdin)["rows_per_s"])')
  for fmt in json bin; do
    extra=
    [ "$fmt" = bin ] && extra="wrk.headers[\"Inference-Header-Content-Length\"] = \"$hl\""
    wrk_post_lua "$work/body-$n.$fmt" application/octet-stream "$extra" > "$work/post-$n-$fmt.lua"
    drain
    wrk -t1 -c"$conns" -d"${secs}s" --latency -s "$work/post-$n-$fmt.lua" \
      "http://127.0.0.1:$port/v2/models/dlrm/infer" > "$work/wrk.txt" 2> "$work/wrk.err" || true
    [ -s "$work/wrk.err" ] && head -3 "$work/wrk.err" >&2
    rps=$(awk '/^Requests\/sec:/ { print $2 }' "$work/wrk.txt")
    p50=$(awk '$1 == "50%" { print $2 }' "$work/wrk.txt")
    p99=$(awk '$1 == "99%" { print $2 }' "$work/wrk.txt")
    non2xx=$(awk '/Non-2xx/ { print $NF }' "$work/wrk.txt")
    results+=("$n $fmt $rps $p50 $p99 $fwd ${non2xx:-0}")
  done
done
batches=$(metrics_text | awk '/^dlrec_batch_rows_(sum|count)/ { v[$1] = $2 } END { if (v["dlrec_batch_rows_count"]) printf "%.1f", v["dlrec_batch_rows_sum"] / v["dlrec_batch_rows_count"] }')

echo
echo "dlrec serve ($threads workers, max batch $max_batch, delay 500 us) under wrk ($conns connections, raw rows)"
echo "in-process forward (bench_score, $threads threads): $limit rows/s at batch $max_batch; mean merged batch $batches rows"
printf '%9s %6s %12s %14s %10s %10s %16s %9s %9s %8s\n' rows/req format requests/s predictions/s p50 p99 \
  fwd_same_batch share share_max non2xx
for r in "${results[@]}"; do
  set -- $r
  awk -v n="$1" -v f="$2" -v rps="$3" -v p50="$4" -v p99="$5" -v fwd="$6" -v lim="$limit" -v bad="$7" 'BEGIN {
    printf "%9d %6s %12.0f %14.0f %10s %10s %16.0f %8.0f%% %8.0f%% %8s\n", n, f, rps, rps * n, p50, p99, fwd,
      100 * rps * n / fwd, 100 * rps * n / lim, bad }'
done
