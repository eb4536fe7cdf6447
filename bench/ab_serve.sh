#!/usr/bin/env bash
# Two dlrec binaries serving the same checkpoint, in turns (A, B, A, B, ...),
# under the same wrk load: ab_train.sh's twin for `dlrec serve`, the way to
# tell whether a change moved serving's latency. Each round starts one
# binary's server, loads it for SECONDS seconds, stops it; the script prints
# each binary's requests/s, p50 and p99 (median over the rounds, and every
# round) and the ratios of the medians.
#
# usage: bench/ab_serve.sh BIN_A BIN_B ROUNDS
#   environment: ROWS (rows per request, default 64), CONNS (wrk
#   connections, 16), SECONDS_EACH (10), THREADS (server workers, 2),
#   OMP_WAIT_POLICY (PASSIVE, as the other benchmarks)
# The model is the Kaggle-shaped DLRM of examples/dlrm_synth.json trained
# 200 steps by BIN_A on 200k synthetic rows; both binaries must read its
# checkpoint (a change that keeps the bits does). Needs wrk
# (scripts/deps.sh bench).
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
a=$1 b=$2 rounds=$3
for bin in "$a" "$b"; do [ -x "$bin" ] || { echo "ab_serve: $bin is not an executable" >&2; exit 1; }; done
command -v wrk > /dev/null || { echo "ab_serve: wrk not found (scripts/deps.sh bench)" >&2; exit 1; }
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/lib.sh"
rows=${ROWS:-64} conns=${CONNS:-16} secs=${SECONDS_EACH:-10} threads=${THREADS:-2}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-abserve.XXXXXX")
server=
trap '[ -n "$server" ] && kill "$server" 2> /dev/null; rm -rf "$work"' EXIT

"$a" synth --rows 200000 --seed 1 --out "$work/clicks.tsv" -q
"$a" etl fit --input "$work/clicks.tsv" --out "$work/etl" -q
"$a" etl apply --etl "$work/etl" --input "$work/clicks.tsv" --out "$work/train.dlr" -q
"$a" train --config "$root/examples/dlrm_synth.json" --train "$work/train.dlr" --etl "$work/etl" \
  --out "$work/run" --max-steps 200 -q > /dev/null
python3 - "$work/clicks.tsv" "$rows" "$work/body.json" <<'EOF'
import json, sys
rows = [l.rstrip("\n").split("\t")[1:] for _, l in zip(range(int(sys.argv[2])), open(sys.argv[1]))]
json.dump({"inputs": [
    {"name": "dense", "datatype": "BYTES", "shape": [len(rows), 13], "data": [r[:13] for r in rows]},
    {"name": "categorical", "datatype": "BYTES", "shape": [len(rows), 26], "data": [r[13:] for r in rows]}]},
    open(sys.argv[3], "w"))
EOF
wrk_post_lua "$work/body.json" application/json > "$work/post.lua"

# One round: start BIN's server, warm it, load it, stop it; prints
# "requests/s p50_ms p99_ms".
round() {
  rm -f "$work/port"
  "$1" serve --model "$work/run" --port 0 --port-file "$work/port" --threads "$threads" -q &
  server=$!
  for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
  [ -s "$work/port" ] || { echo "ab_serve: $1 serve did not start" >&2; exit 1; }
  local url="http://127.0.0.1:$(cat "$work/port")/v2/models/dlrm/infer"
  wrk -t1 -c"$conns" -d1s -s "$work/post.lua" "$url" > /dev/null 2>&1 || true
  wrk -t1 -c"$conns" -d"${secs}s" --latency -s "$work/post.lua" "$url" > "$work/wrk.txt" 2> "$work/wrk.err" || true
  kill "$server"
  wait "$server" 2> /dev/null || true
  server=
  [ -s "$work/wrk.err" ] && { head -3 "$work/wrk.err" >&2; exit 1; }
  awk 'function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
       /^Requests\/sec:/ { rps = $2 } $1 == "50%" { p50 = ms($2) } $1 == "99%" { p99 = ms($2) }
       END { print rps, p50, p99 }' "$work/wrk.txt"
}

cpu_line
echo "ab_serve: $(nproc) cores, $rows rows a request, wrk $conns connections, $secs s a round, $threads workers"
for r in $(seq "$rounds"); do
  echo "A $(round "$a")"
  echo "B $(round "$b")"
done | python3 -c '
import statistics, sys
runs = {"A": [], "B": []}
for line in sys.stdin:
    side, *v = line.split()
    runs[side].append([float(x) for x in v])
med = {s: [statistics.median(r[k] for r in runs[s]) for k in range(3)] for s in "AB"}
for s, name in zip("AB", sys.argv[1:]):
    print("%s %-32s requests/s %8.0f  p50 %7.2f ms  p99 %7.2f ms  rounds (p99) %s" % (s, name[-32:], *med[s],
          " ".join("%.2f" % r[2] for r in runs[s])))
print("B / A: requests/s %.3f  p50 %.3f  p99 %.3f (medians)" % tuple(med["B"][k] / med["A"][k] for k in range(3)))
' "$a" "$b"
