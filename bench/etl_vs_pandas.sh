#!/usr/bin/env bash
# ETL speed, dlrec against pandas, on the same synthetic Criteo file.
#
# usage: bench/etl_vs_pandas.sh [ROWS]      (default 5000000)
#
# Synthesizes ROWS rows with `dlrec synth`, times `dlrec etl fit` and
# `dlrec etl apply` separately, then bench/etl_pandas.py doing the same work
# (read_csv with Criteo's names and dtypes, frequency-ordered category codes,
# log1p of clipped dense values, a binary numpy file) on the same file, and
# prints rows/s for each and the ratio. The file is read once beforehand so
# both sides start from a warm page cache. Needs /usr/bin/python3 with pandas
# (Debian python3-pandas; scripts/deps.sh bench) and a built dlrec
# (build/dlrec, or DLREC_BIN).
set -euo pipefail

rows=${1:-5000000}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
py=${PYTHON:-/usr/bin/python3}
[ -x "$bin" ] || { echo "etl_vs_pandas: no dlrec at $bin (run 'make build' or set DLREC_BIN)" >&2; exit 1; }
"$py" -c 'import pandas' 2>/dev/null || { echo "etl_vs_pandas: $py has no pandas (apt-get install python3-pandas)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-etl-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
data=$work/data.tsv

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f", b - a }'; }

echo "etl_vs_pandas: $rows rows, $(nproc) cores, dlrec $("$bin" version | head -1 | cut -d' ' -f2)"
"$bin" synth --rows "$rows" --out "$data" -q
bytes=$(stat -c %s "$data")
cat "$data" > /dev/null

t0=$(now)
"$bin" etl fit --input "$data" --out "$work/etl" -q
t1=$(now)
"$bin" etl apply --etl "$work/etl" --input "$data" --out "$work/data.dlr" -q
t2=$(now)
pandas_s=$("$py" "$root/bench/etl_pandas.py" "$data" "$work/pandas.npz")

fit_s=$(secs "$t0" "$t1")
apply_s=$(secs "$t1" "$t2")
awk -v rows="$rows" -v bytes="$bytes" -v fit="$fit_s" -v apply="$apply_s" -v pandas="$pandas_s" 'BEGIN {
  both = fit + apply
  printf "  input            %d rows, %.1f MB\n", rows, bytes / 1e6
  printf "  dlrec etl fit    %7.2f s  %10.0f rows/s\n", fit, rows / fit
  printf "  dlrec etl apply  %7.2f s  %10.0f rows/s\n", apply, rows / apply
  printf "  dlrec fit+apply  %7.2f s  %10.0f rows/s\n", both, rows / both
  printf "  pandas           %7.2f s  %10.0f rows/s\n", pandas, rows / pandas
  printf "  speedup: fit+apply %.1fx pandas (apply alone %.1fx)\n", pandas / both, pandas / apply
}'
