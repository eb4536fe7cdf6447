#!/usr/bin/env bash
# `etl fit --memory-mb` under an address-space limit (ulimit -v): a column
# of 3 million distinct values, whose count table alone needs about 200 MB
# of address space in memory, fits within a limit where the unbounded fit
# runs out of memory, and writes the same state byte for byte.
#
# The limit is found on the machine: about the least at which a fit of a
# tiny file succeeds (the process's own address space: libraries, thread
# stacks), plus 150 MB, far less than the big table needs. One malloc arena
# (MALLOC_ARENA_MAX=1): each further arena would reserve 64 MB of address
# space or not, as threads happen to contend, and make the limit a race.
export MALLOC_ARENA_MAX=1
#
# usage: tests/etl_spill/run.sh DLREC_BIN WORKDIR
set -euo pipefail
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
work=$2
mkdir -p "$work"
cd "$work"
rm -rf ./*.csv etl-*

# y,k: a label and a key of 3M distinct values (some seen twice).
awk 'BEGIN { print "y,k"; for (i = 0; i < 3200000; i++) printf "%d,k%d\n", i % 3 == 0, (i * 7919) % 3000017 }' > big.csv
printf 'y,k\n1,a\n0,b\n' > tiny.csv
fit=("$bin" etl fit --format csv --schema 'label=y;cat=k' --threads 2)
# within KB SECONDS ARGS...: the fit under `ulimit -v KB`, killed after SECONDS.
within() { (ulimit -v "$1"; timeout "$2" "${fit[@]}" "${@:3}"); }

"${fit[@]}" -q --input big.csv --out etl-mem
# Binary search in 10 MB steps (below some 370 MB OpenBLAS's start-up spins
# instead of failing: the timeout ends those tries).
tiny_ok() { within "$1" 3 -q --input tiny.csv --out etl-tiny > /dev/null 2>&1; }
lo=200000 hi=2000000
tiny_ok "$hi" || { echo "etl_spill: a tiny fit does not run within 2 GB of address space" >&2; exit 1; }
while [ $((hi - lo)) -gt 10000 ]; do
  mid=$(((lo + hi) / 2))
  if tiny_ok "$mid"; then hi=$mid; else lo=$mid; fi
done
limit=$((hi + 150000))
echo "etl_spill: a tiny fit runs at ulimit -v $((limit - 150000)) kB; the big ones get $limit kB"

if within "$limit" 120 -q --input big.csv --out etl-unbounded > unbounded.log 2>&1; then
  echo "etl_spill: the unbounded fit ran within $limit kB: the limit does not bite" >&2
  exit 1
fi
grep -q "out of memory" unbounded.log || { echo "etl_spill: the unbounded fit failed otherwise:" >&2; cat unbounded.log >&2; exit 1; }
echo "etl_spill: unbounded fit refused: $(tail -1 unbounded.log)"

within "$limit" 120 --input big.csv --out etl-budget --memory-mb 24 2>&1 | tail -2
cmp etl-mem/etl.json etl-budget/etl.json
cmp etl-mem/vocab.bin etl-budget/vocab.bin
[ -z "$(ls -A etl-budget | grep -v -e etl.json -e vocab.bin)" ] || { echo "etl_spill: spill files left behind" >&2; exit 1; }
echo "etl_spill: --memory-mb 24 within $limit kB wrote the unbounded fit's state byte for byte"
