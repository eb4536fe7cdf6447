#!/usr/bin/env bash
# `etl fit --memory-mb` against the unbounded fit (issue 15): rows/s and
# peak RSS on synthetic Criteo rows whose vocabularies are several times the
# budget, with the thread count as given; and whether the two states are
# the same bytes.
#
# usage: bench/etl_spill.sh [ROWS] [MEMORY_MB]     (defaults 20000000, 64)
#
# The rows are `dlrec synth --max-cardinality 100000000`: the big columns
# have tens of millions of distinct values. Needs a built dlrec, GNU time
# for peak RSS, and about 250 bytes of disk a row (scratch in $TMPDIR).
set -euo pipefail

rows=${1:-20000000}
mb=${2:-64}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
py=${PYTHON:-python3}
[ -x "$bin" ] || { echo "etl_spill: no dlrec at $bin (make)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-spill-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
. "$root/bench/lib.sh"
[ -n "$timev" ] || { echo "etl_spill: needs GNU time (apt-get install time) for peak RSS" >&2; exit 1; }

echo "etl_spill: $rows rows, --memory-mb $mb, $(cpu_line), $(nproc) threads, dlrec $("$bin" version | head -1 | cut -d' ' -f2)"
"$bin" synth -q --rows "$rows" --max-cardinality 100000000 --out "$work/rows.tsv"
cat "$work/rows.tsv" > /dev/null
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
t0=$(date +%s.%N)
run_rss "$work/mem.rss" "$bin" etl fit -q --input "$work/rows.tsv" --out "$work/etl-mem"
t1=$(date +%s.%N)
run_rss "$work/disk.rss" "$bin" etl fit --input "$work/rows.tsv" --out "$work/etl-disk" --memory-mb "$mb" \
  2> "$work/disk.log"
t2=$(date +%s.%N)
same=no
cmp -s "$work/etl-mem/vocab.bin" "$work/etl-disk/vocab.bin" && cmp -s "$work/etl-mem/etl.json" "$work/etl-disk/etl.json" && same=yes
vocab=$(json_get "$work/etl-mem/etl.json" "sum(c['distinct'] for c in j['categorical'])")
spilled=$(sed -n 's/.*spilled \([0-9.]*\) MB.*/\1/p' "$work/disk.log")
awk -v rows="$rows" -v a="$(secs "$t0" "$t1")" -v b="$(secs "$t1" "$t2")" -v ra="$(cat "$work/mem.rss")" \
    -v rb="$(cat "$work/disk.rss")" -v mb="$mb" -v v="$vocab" -v sp="${spilled:-0}" -v same="$same" 'BEGIN {
  printf "  distinct values in all columns: %d (%.0f MiB as 16-byte pairs, %.1fx the budget)\n", v, v * 16 / 1048576, v * 16 / 1048576 / mb
  printf "  %-34s %8.2f s %10.0f rows/s  peak RSS %7.0f MiB\n", "etl fit (unbounded)", a, rows / a, ra / 1024
  printf "  %-34s %8.2f s %10.0f rows/s  peak RSS %7.0f MiB\n", "etl fit --memory-mb " mb, b, rows / b, rb / 1024
  printf "  bounded/unbounded: %.2fx the rows/s, %.2fx the peak RSS; %s MB spilled; same state: %s\n", a / b, rb / ra, sp, same
}'
[ "$same" = yes ]
