#!/usr/bin/env bash
# The Python package against the CLI and pandas, on the same rows (issue 14).
#
# usage: bench/python_vs_cli.sh [ROWS]       (default 1000000)
#
# Synthesizes ROWS Criteo rows (`dlrec synth`), and writes them with pyarrow
# as a Parquet file and as a CSV file with a header (label, I1..I13 as
# floats, C1..C26 as strings; missing values null / empty). Then, each timed
# from a warm page cache:
#   etl   the CLI's `etl fit` + `etl apply` on the CSV (--format csv), the
#         Python package's dlrec.etl_fit + dlrec.etl_apply on the Parquet
#         file (pyarrow reads it; the library encodes it), and
#         bench/etl_pandas.py doing the same transform in pandas from the
#         Parquet file; the two .dlr files must be equal byte for byte;
#   predict  a small DLRM trained on the rows (50 steps): the CLI's `dlrec
#         predict` on the CSV against Model.predict on the same rows as a
#         pandas DataFrame (read from Parquet beforehand, untimed); the scores
#         must be equal.
# Prints rows/s and the ratios. Builds a virtual environment (cffi, numpy,
# pandas, pyarrow from PyPI, and the package from ./python around
# build/libdlrec.so) in VENV (default build/venv-python). Needs a built
# dlrec (make).
set -euo pipefail

rows=${1:-1000000}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
so=${DLREC_LIBRARY:-$root/build/libdlrec.so}
venv=${VENV:-$root/build/venv-python}
[ -x "$bin" ] && [ -f "$so" ] || { echo "python_vs_cli: build first (make): no $bin or $so" >&2; exit 1; }
if ! "$venv/bin/python" -c 'import cffi, numpy, pandas, pyarrow, setuptools, wheel' 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check cffi numpy pandas pyarrow setuptools wheel
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-python-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -r "$root/python" "$work/pkg"
DLREC_LIBRARY=$so DLREC_API_HEADER=$root/include/dlrec.h "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
  --force-reinstall "$work/pkg" > /dev/null
py=$venv/bin/python
spec='label=label;dense=I1..I13;cat=C1..C26'

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
rate() { awk -v r="$rows" -v s="$1" 'BEGIN { printf "%.0f", r / s }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b / a }'; }

cpu=$(LC_ALL=C lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
echo "python_vs_cli: $rows rows, CPU ${cpu:-unknown} ($(nproc) cores), dlrec $("$bin" version | head -1 | cut -d' ' -f2)"
"$bin" synth --rows "$rows" --seed 3 --out "$work/rows.tsv" -q
"$py" - "$work" <<'PY'
import sys
import pyarrow as pa, pyarrow.csv as pacsv, pyarrow.parquet as pq
work = sys.argv[1]
names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
types = {"label": pa.int64(), **{f"I{i}": pa.float64() for i in range(1, 14)},
         **{f"C{i}": pa.string() for i in range(1, 27)}}
t = pacsv.read_csv(f"{work}/rows.tsv", read_options=pacsv.ReadOptions(column_names=names),
                   parse_options=pacsv.ParseOptions(delimiter="\t"),
                   convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True))
pq.write_table(t, f"{work}/rows.parquet", row_group_size=1 << 17)
pacsv.write_csv(t, f"{work}/rows.csv", write_options=pacsv.WriteOptions(quoting_style="needed"))
PY
cat "$work/rows.csv" "$work/rows.parquet" > /dev/null

t0=$(now)
"$bin" etl fit -q --format csv --schema "$spec" --input "$work/rows.csv" --out "$work/etl_cli" --min-count 4
"$bin" etl apply -q --etl "$work/etl_cli" --input "$work/rows.csv" --out "$work/cli.dlr"
t1=$(now)
"$py" - "$work" "$spec" <<'PY'
import sys, dlrec
work, spec = sys.argv[1], sys.argv[2]
dlrec.etl_fit(f"{work}/rows.parquet", f"{work}/etl_py", schema=spec, min_count=4)
dlrec.etl_apply(f"{work}/etl_py", f"{work}/rows.parquet", f"{work}/py.dlr")
PY
t2=$(now)
pandas_s=$("$py" "$root/bench/etl_pandas.py" "$work/rows.parquet" "$work/pandas.npz")
cmp -s "$work/cli.dlr" "$work/py.dlr" || { echo "python_vs_cli: the Parquet path wrote other .dlr bytes" >&2; exit 1; }
cli_etl=$(secs "$t0" "$t1")
py_etl=$(secs "$t1" "$t2")

cat > "$work/cfg.json" <<'JSON'
{"model": {"type": "dlrm"}, "training": {"batch_size": 2048, "threads": 0}, "eval": {"train_rows": 0}}
JSON
"$bin" train -q --config "$work/cfg.json" --train "$work/cli.dlr" --etl "$work/etl_cli" --out "$work/run" \
  --max-steps 50 > /dev/null
t3=$(now)
"$bin" predict -q --model "$work/run" --input "$work/rows.csv" --out "$work/cli.scores"
t4=$(now)
py_pred=$("$py" - "$work" <<'PY'
import sys, time
import numpy as np, pandas as pd, dlrec
work = sys.argv[1]
df = pd.read_parquet(f"{work}/rows.parquet")
m = dlrec.Model.load(f"{work}/run")
t = time.perf_counter()
p = m.predict(df)
s = time.perf_counter() - t
want = np.loadtxt(f"{work}/cli.scores", dtype=np.float32)
if not np.array_equal(p, want):
    sys.exit("python_vs_cli: Model.predict(df) differs from dlrec predict")
print(f"{s:.3f}")
PY
)
cli_pred=$(secs "$t3" "$t4")

echo
printf '%-44s %10s %12s\n' step seconds rows/s
printf '%-44s %10s %12s\n' "etl fit+apply: CLI on CSV" "$cli_etl" "$(rate "$cli_etl")"
printf '%-44s %10s %12s\n' "etl fit+apply: Python on Parquet" "$py_etl" "$(rate "$py_etl")"
printf '%-44s %10s %12s\n' "same transform: pandas on Parquet" "$pandas_s" "$(rate "$pandas_s")"
printf '%-44s %10s %12s\n' "predict: CLI on CSV" "$cli_pred" "$(rate "$cli_pred")"
printf '%-44s %10s %12s\n' "predict: Model.predict(DataFrame)" "$py_pred" "$(rate "$py_pred")"
echo
echo "Python Parquet ETL vs CLI CSV ETL: $(ratio "$py_etl" "$cli_etl")x the speed; vs pandas: $(ratio "$py_etl" "$pandas_s")x"
echo "Model.predict(DataFrame) vs CLI predict: $(ratio "$py_pred" "$cli_pred")x the speed (scores equal)"
