#!/usr/bin/env bash
# Two dlrec binaries on the same training run, interleaved (A, B, A, B, ...),
# so that a shared machine's drift falls on both alike: the way to tell
# whether a change of a few percent is real. Prints each binary's
# samples/s (median, best, every round) and the ratio of the medians.
#
# usage: bench/ab_train.sh BIN_A BIN_B ROUNDS -- TRAIN_ARGS...
#   TRAIN_ARGS  what `dlrec train` gets besides --out and -q (--config,
#               --train, --etl, ...); each round writes a fresh run directory
#   environment: OMP_WAIT_POLICY (PASSIVE, as the other benchmarks)
# example:
#   bench/ab_train.sh /tmp/dlrec_before build/dlrec 6 -- --config dcn.json \
#     --train train.dlr --etl etl
set -euo pipefail
[ $# -ge 4 ] && [ "$4" = "--" ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
a=$1 b=$2 rounds=$3
shift 4
for bin in "$a" "$b"; do [ -x "$bin" ] || { echo "ab_train: $bin is not an executable" >&2; exit 1; }; done
work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-ab.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
for r in $(seq "$rounds"); do
  for side in A B; do
    bin=$a
    [ $side = B ] && bin=$b
    rm -rf "$work/run"
    "$bin" train -q "$@" --out "$work/run" > "$work/out.json"
    echo "$side $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples_per_s"])' "$work/out.json")"
  done
done | python3 -c '
import statistics, sys
runs = {"A": [], "B": []}
for line in sys.stdin:
    side, v = line.split()
    runs[side].append(float(v))
names = {"A": sys.argv[1], "B": sys.argv[2]}
for side in "AB":
    v = runs[side]
    print("%s %-40s median %9.0f  best %9.0f  rounds %s" % (side, names[side][-40:], statistics.median(v), max(v),
          " ".join("%.0f" % x for x in v)))
print("B / A: %.3f (medians)" % (statistics.median(runs["B"]) / statistics.median(runs["A"])))
' "$a" "$b"
