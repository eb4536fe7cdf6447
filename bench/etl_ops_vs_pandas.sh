#!/usr/bin/env bash
# The cost of the ETL's column operators (issue 15), dlrec against pandas.
#
# usage: bench/etl_ops_vs_pandas.sh [ROWS]      (default 5000000)
#
# Synthesizes ROWS Criteo rows and fits three ETL states on them: a plain
# one; one whose workflow fills every dense column's missing values with its
# median and clips it to [0, 1000]; and one that adds derived columns too
# (two hashed crosses, I1 bucketized by 10 quantiles and I2 by given
# boundaries, count encodings of C3 and C4, out-of-fold target encodings of
# C5 and C6). Times `dlrec etl apply` with each (the operators' cost is the
# difference), and bench/etl_pandas.py doing the same transforms (fit and
# apply in one); prints rows/s and the ratios, for apply alone and for
# fit + apply, each the best of RUNS runs (default 3). Goal (issue 15): at
# least 10x pandas. Needs /usr/bin/python3 with pandas and a built dlrec.
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
echo "etl_ops_vs_pandas: $rows rows, CPU ${cpu:-unknown} ($(nproc) cores), dlrec $("$bin" version | head -1 | cut -d' ' -f2)"
"$bin" synth --rows "$rows" --out "$data" -q
"$py" - "$work/wf.json" "$work/wf_all.json" <<'PY'
import json, sys
dense = {f"I{i}": {"fill_missing": "median", "clip": [0, 1000]} for i in range(1, 14)}
json.dump({"dense": dense}, open(sys.argv[1], "w"))
# bench/etl_pandas.py's DERIVED, as a workflow.
json.dump({"dense": dense,
           "cross": [{"columns": ["C1", "C2"], "buckets": 100000}, {"columns": ["C3", "C4", "C5"], "buckets": 100000}],
           "bucketize": [{"column": "I1", "quantiles": 10}, {"column": "I2", "boundaries": [1, 10, 100, 1000]}],
           "count": [{"column": "C3"}, {"column": "C4"}],
           "target": [{"column": "C5", "folds": 5, "smoothing": 20}, {"column": "C6", "folds": 5, "smoothing": 20}]},
          open(sys.argv[2], "w"))
PY
cat "$data" > /dev/null
# Each step's best of $runs runs (default 3), dlrec's and pandas' alike:
# wall times on a shared machine swing by a third between runs.
runs=${RUNS:-3}
best() { # CMD... -> the least seconds of $runs runs
  local b="" t0 t1 s
  for _ in $(seq "$runs"); do
    t0=$(now); "$@" > /dev/null; t1=$(now)
    s=$(secs "$t0" "$t1")
    b=$(awk -v a="$b" -v s="$s" 'BEGIN { print (a == "" || s < a) ? s : a }')
  done
  echo "$b"
}
best_py() { # ARGS... -> the least of etl_pandas.py's own timings (reading included)
  local b="" s
  for _ in $(seq "$runs"); do
    s=$("$py" "$root/bench/etl_pandas.py" "$@")
    b=$(awk -v a="$b" -v s="$s" 'BEGIN { print (a == "" || s < a) ? s : a }')
  done
  echo "$b"
}
"$bin" etl fit -q --input "$data" --out "$work/etl"
fit_ops=$(best "$bin" etl fit -q --input "$data" --out "$work/etl_ops" --workflow "$work/wf.json")
fit_all=$(best "$bin" etl fit -q --input "$data" --out "$work/etl_all" --workflow "$work/wf_all.json")
plain=$(best "$bin" etl apply -q --etl "$work/etl" --input "$data" --out "$work/plain.dlr")
ops=$(best "$bin" etl apply -q --etl "$work/etl_ops" --input "$data" --out "$work/ops.dlr")
all=$(best "$bin" etl apply -q --etl "$work/etl_all" --input "$data" --out "$work/all.dlr")
pandas_plain=$(best_py "$data" "$work/p.npz")
pandas_ops=$(best_py "$data" "$work/q.npz" --fill-clip 1000)
pandas_all=$(best_py "$data" "$work/r.npz" --fill-clip 1000 --derived)
awk -v rows="$rows" -v a="$plain" -v b="$ops" -v c="$pandas_plain" -v d="$pandas_ops" -v f="$fit_ops" \
    -v g="$all" -v h="$fit_all" -v p="$pandas_all" 'BEGIN {
  printf "  %-42s %8.2f s %12.0f rows/s\n", "dlrec etl apply", a, rows / a
  printf "  %-42s %8.2f s %12.0f rows/s\n", "dlrec etl apply, fill median + clip (13 cols)", b, rows / b
  printf "  %-42s %8.2f s %12.0f rows/s\n", "pandas, same transform", c, rows / c
  printf "  %-42s %8.2f s %12.0f rows/s\n", "pandas, same transform + fillna + clip", d, rows / d
  printf "  operators cost: dlrec %+.1f%% of apply (%.2f s), pandas %.2f s\n", 100 * (b - a) / a, b - a, d - c
  printf "  %-42s %8.2f s %12.0f rows/s\n", "dlrec etl fit with the workflow", f, rows / f
  printf "  with the operators: dlrec apply %.1fx pandas, fit + apply %.1fx\n", d / b, d / (f + b)
  printf "  %-42s %8.2f s %12.0f rows/s\n", "dlrec etl fit, dense ops + derived columns", h, rows / h
  printf "  %-42s %8.2f s %12.0f rows/s\n", "dlrec etl apply, dense ops + derived columns", g, rows / g
  printf "  %-42s %8.2f s %12.0f rows/s\n", "pandas, same transform + derived columns", p, rows / p
  printf "  derived columns cost: dlrec %+.1f%% of apply (%.2f s), pandas %.2f s\n", 100 * (g - b) / b, g - b, p - d
  printf "  with every operator: dlrec apply %.1fx pandas, fit + apply %.1fx\n", p / g, p / (h + g)
}'
