#!/usr/bin/env bash
# The cost of the ETL's column operators (issue 15), dlrec against pandas.
#
# usage: bench/etl_ops_vs_pandas.sh [ROWS]      (default 5000000)
#
# Synthesizes ROWS Criteo rows and fits two ETL states on them: a plain one,
# and one whose workflow fills every dense column's missing values with its
# median and clips it to [0, 1000]. Times `dlrec etl apply` with each
# (the operators' cost is the difference), and bench/etl_pandas.py doing the
# same transform (fit and apply in one) with and without `fillna(median)`
# and `clip` on every dense column; prints rows/s and the ratios, for apply
# alone and for fit + apply. Goal (issue 15): at least 10x
# pandas. Needs /usr/bin/python3 with pandas and a built dlrec.
set -euo pipefail

rows=${1:-5000000}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
py=${PYTHON:-/usr/bin/python3}
[ -x "$bin" ] || { echo "etl_ops_vs_pandas: no dlrec at $bin (make)" >&2; exit 1; }
"$py" -c 'import pandas' 2>/dev/null || { echo "etl_ops_vs_pandas: $py has no pandas (apt-get install python3-pandas)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-ops-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
data=$work/data.tsv
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

cpu=$(LC_ALL=C lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
echo "etl_ops_vs_pandas: $rows rows, CPU ${cpu:-unknown} ($(nproc) cores), dlrec $("$bin" version | cut -d' ' -f2)"
"$bin" synth --rows "$rows" --out "$data" -q
"$py" - "$work/wf.json" <<'PY'
import json, sys
json.dump({"dense": {f"I{i}": {"fill_missing": "median", "clip": [0, 1000]} for i in range(1, 14)}},
          open(sys.argv[1], "w"))
PY
cat "$data" > /dev/null
"$bin" etl fit -q --input "$data" --out "$work/etl"
tf=$(now)
"$bin" etl fit -q --input "$data" --out "$work/etl_ops" --workflow "$work/wf.json"
t0=$(now)
"$bin" etl apply -q --etl "$work/etl" --input "$data" --out "$work/plain.dlr"
t1=$(now)
"$bin" etl apply -q --etl "$work/etl_ops" --input "$data" --out "$work/ops.dlr"
t2=$(now)
fit_ops=$(secs "$tf" "$t0")
plain=$(secs "$t0" "$t1")
ops=$(secs "$t1" "$t2")
pandas_plain=$("$py" "$root/bench/etl_pandas.py" "$data" "$work/p.npz")
pandas_ops=$("$py" "$root/bench/etl_pandas.py" "$data" "$work/q.npz" --fill-clip 1000)
awk -v rows="$rows" -v a="$plain" -v b="$ops" -v c="$pandas_plain" -v d="$pandas_ops" -v f="$fit_ops" 'BEGIN {
  printf "  %-42s %8.2f s %12.0f rows/s\n", "dlrec etl apply", a, rows / a
  printf "  %-42s %8.2f s %12.0f rows/s\n", "dlrec etl apply, fill median + clip (13 cols)", b, rows / b
  printf "  %-42s %8.2f s %12.0f rows/s\n", "pandas, same transform", c, rows / c
  printf "  %-42s %8.2f s %12.0f rows/s\n", "pandas, same transform + fillna + clip", d, rows / d
  printf "  operators cost: dlrec %+.1f%% of apply (%.2f s), pandas %.2f s\n", 100 * (b - a) / a, b - a, d - c
  printf "  %-42s %8.2f s %12.0f rows/s\n", "dlrec etl fit with the workflow", f, rows / f
  printf "  with the operators: dlrec apply %.1fx pandas, fit + apply %.1fx\n", d / b, d / (f + b)
}'
