#!/usr/bin/env bash
# Serving latency with the Redis tier: `dlrec serve --redis` against the same
# server without it, one request at a time, in one run.
#
# usage: bench/serve_redis.sh                 (REQUESTS=2000 SIZES="1 64")
#
# Starts redis-server on a free loopback port, synthesizes 200k Criteo-like
# rows, fits the ETL and trains the Kaggle-shaped DLRM (examples/dlrm_synth.json,
# 200 steps) publishing its rows to that Redis (publish.redis). Then, for
# each request size in SIZES and each cache setting, a client on one
# persistent connection sends REQUESTS requests of raw rows one after the
# other (bench/serve_redis.py) and reports p50 and p99 latency, with the
# share of embedding rows served from the server's cache, read from Redis,
# or taken from the checkpoint's table (from /metrics):
#   table   no Redis tier (the checkpoint's table alone): the baseline
#   0%      --redis-cache-rows 0: every row read from Redis (one MGET a request)
#   warmW   a cache, with each request's rows drawn W% from rows sent before
#           and the rest from rows never sent; WARM (default "40 94") sets the
#           W's, chosen so that about 90% and 99% of the embedding rows come
#           from the cache (a new data row's 26 rows are mostly hot categorical
#           values, cached whatever row they come in)
# The cached shares are measured and printed, not set.
# The server runs one scoring worker; client, server and Redis share the
# machine's cores.
set -euo pipefail

requests=${REQUESTS:-2000}
warms=${WARM:-40 94}
sizes=${SIZES:-1 64}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
py=${PYTHON:-python3}
[ -x "$bin" ] || { echo "serve_redis: no dlrec at $bin (run 'make build')" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "serve_redis: install redis-server (scripts/deps.sh bench)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-redis-bench.XXXXXX")
server= redis=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null
  [ -n "$redis" ] && kill "$redis" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

rport=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no > "$work/redis.log" 2>&1 &
redis=$!
for _ in $(seq 100); do redis-cli -p "$rport" ping > /dev/null 2>&1 && break; sleep 0.05; done

echo "serve_redis: $(nproc) cores; redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on port $rport"
"$bin" synth --rows 200000 --out "$work/clicks.tsv" -q
"$bin" etl fit --input "$work/clicks.tsv" --out "$work/etl" -q
"$bin" etl apply --etl "$work/etl" --input "$work/clicks.tsv" --out "$work/train.dlr" -q
"$py" - "$root/examples/dlrm_synth.json" "$work/cfg.json" "127.0.0.1:$rport" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["publish"] = {"redis": sys.argv[3], "interval_steps": 50}
json.dump(c, open(sys.argv[2], "w"))
EOF
"$bin" train --config "$work/cfg.json" --train "$work/train.dlr" --etl "$work/etl" --out "$work/run" --max-steps 200 \
  -q > /dev/null
echo "  trained 200 steps; Redis holds $(redis-cli -p "$rport" dbsize) keys"

serve() { # serve ARGS...: starts the server, sets $port
  rm -f "$work/port"
  "$bin" serve --model "$work/run" --port 0 --port-file "$work/port" --threads 1 -q "$@" &
  server=$!
  for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
  port=$(cat "$work/port")
}
stop() { kill "$server"; wait "$server" 2>/dev/null || true; server=; }

results=()
for n in $sizes; do
  for setting in table 0 $warms; do
    case $setting in
      table) serve; warm=0 ;;
      0) serve --redis "127.0.0.1:$rport" --redis-cache-rows 0; warm=0 ;;
      *) serve --redis "127.0.0.1:$rport" --redis-max-age-ms 3600000; warm=$setting ;;
    esac
    results+=("$("$py" "$root/bench/serve_redis.py" --port "$port" --rows "$work/clicks.tsv" --size "$n" \
      --requests "$requests" --warm "$warm" --label "$setting")")
    stop
  done
done

echo
echo "One request at a time on one connection, $requests requests per line (after a warm-up); one scoring worker"
printf '%5s %-8s %10s %10s %8s %8s %8s\n' rows setting p50_us p99_us cache redis table
for r in "${results[@]}"; do echo "$r"; done
