#!/usr/bin/env bash
# The ETL's derived columns (cross, bucketize, count and target encoding;
# docs/etl.md) against an independent NumPy re-implementation of the docs
# (check.py, in a virtual environment under the build tree with numpy from
# PyPI): every row `dlrec etl apply` encodes, labels and ids exactly and
# dense values within 1e-6, and the ETL state's schema and statistics.
#
# Data: two `dlrec synth` files (so the fold hash's file index matters),
# edited by check.py (values seen once, so --min-count 2 gives OOV ids; one
# key written three ways; floats and a negative value in dense fields), and
# a third file fit never sees (unseen keys, an I1 beyond every bucket).
#
# Checks, in order:
#   base-*     no derived column (dense operators only), with the log
#              transform and with --dense-transform none --standardize
#              --hash-buckets: the vocabularies, hashing and dense values;
#   derived-*  the workflow below: out-of-fold and full target encoding on
#              the fit rows, full on the unseen rows;
#   std-*      the same with --dense-transform none --standardize and
#              --hash-buckets 16 (C3, a count and target source, hashed);
#   leak       line 10's label flipped and everything refit: its
#              out-of-fold target encoding is unchanged bitwise, another
#              row's changes, and its full encoding changes.
#
# usage: tests/etl_ops/run.sh DLREC_BIN WORKDIR
set -euo pipefail
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") # absolute: the script cds
work=$2
here=$(cd "$(dirname "$0")" && pwd)
venv=$work/venv
mkdir -p "$work"
. "$here/../venv.sh"
venv_ready "$venv" 'import numpy' numpy
py=$venv/bin/python
cd "$work"
rm -rf ./*.tsv ./*.json ./*.dlr etl-*

check() { "$py" "$here/check.py" "$@"; }

"$bin" synth -q --rows 3000 --seed 21 --max-cardinality 40 --out synth-a.tsv
"$bin" synth -q --rows 3000 --seed 22 --max-cardinality 40 --out synth-b.tsv
"$bin" synth -q --rows 1000 --seed 23 --max-cardinality 40 --out synth-c.tsv
check inject synth-a.tsv a.tsv --tag 0
check inject synth-b.tsv b.tsv --tag 1
check inject synth-c.tsv c.tsv --tag 2 --unseen
check flip a.tsv a-flipped.tsv --line 10

# Dense operators only: what dlrec could do before the derived columns.
cat > base.json <<'JSON'
{"dense": {"I2": {"fill_missing": "median", "clip": [0, 500]},
           "I3": {"fill_missing": 7, "clip": [null, 100]}}}
JSON
# The derived columns: crosses of few buckets (so buckets collide), given
# and fitted bucket boundaries (I2's quantiles fall on tied values, I5's
# between distinct ones, where the interpolation shows), count and target
# encodings (one with non-default folds, smoothing and seed).
cat > derived.json <<'JSON'
{"dense": {"I2": {"fill_missing": "median", "clip": [0, 500]},
           "I3": {"fill_missing": 7, "clip": [null, 100]}},
 "cross": [{"columns": ["C19", "C26"], "buckets": 50},
           {"columns": ["C3", "C9", "C20"], "buckets": 7, "name": "C3_C9_C20"}],
 "bucketize": [{"column": "I1", "boundaries": [0.5, 2, 10, 100, 1000]},
               {"column": "I2", "quantiles": 10, "name": "I2_decile"},
               {"column": "I3", "boundaries": [1, 5, 7.5, 50]},
               {"column": "I5", "quantiles": 7}],
 "count": [{"column": "C3"}, {"column": "C20"}],
 "target": [{"column": "C3"},
            {"column": "C9", "folds": 3, "smoothing": 5.5, "seed": 12345, "name": "C9_te"}]}
JSON

fit() { # NAME WORKFLOW INPUT... -- FIT_OPTIONS...
  local name=$1 wf=$2
  shift 2
  local inputs=()
  while [ "$1" != -- ]; do inputs+=("$1"); shift; done
  shift
  "$bin" etl fit -q --input "${inputs[@]}" --out "etl-$name" --workflow "$wf" "$@"
}
verify() { # NAME WORKFLOW ETL DLR TARGET_ENCODING "FIT_FILES" "APPLY_FILES" FIT_OPTIONS...
  local name=$1 wf=$2 etl=$3 dlr=$4 te=$5 fitf=$6 applyf=$7
  shift 7
  # shellcheck disable=SC2086
  check verify --label "$name" --bin "$bin" --workflow "$wf" --etl "$etl" --dlr "$dlr" \
    --target-encoding "$te" --fit $fitf --apply $applyf "$@"
}

log_opts=(--min-count 2)
std_opts=(--min-count 2 --dense-transform none --standardize --hash-buckets 16)

# base-*: dense operators only.
fit base-log base.json a.tsv b.tsv -- "${log_opts[@]}"
"$bin" etl apply -q --etl etl-base-log --input a.tsv b.tsv --out base-log.dlr
verify base-log base.json etl-base-log base-log.dlr oof "a.tsv b.tsv" "a.tsv b.tsv" "${log_opts[@]}"
fit base-std base.json a.tsv b.tsv -- "${std_opts[@]}"
"$bin" etl apply -q --etl etl-base-std --input a.tsv b.tsv --out base-std.dlr
verify base-std base.json etl-base-std base-std.dlr oof "a.tsv b.tsv" "a.tsv b.tsv" "${std_opts[@]}"

# derived-*: log transform, --min-count 2.
fit derived derived.json a.tsv b.tsv -- "${log_opts[@]}"
"$bin" etl apply -q --etl etl-derived --input a.tsv b.tsv --out derived-oof.dlr
"$bin" etl apply -q --etl etl-derived --input a.tsv b.tsv --out derived-full.dlr --target-encoding full
"$bin" etl apply -q --etl etl-derived --input c.tsv --out derived-unseen.dlr --target-encoding full
verify derived-oof derived.json etl-derived derived-oof.dlr oof "a.tsv b.tsv" "a.tsv b.tsv" "${log_opts[@]}"
verify derived-full derived.json etl-derived derived-full.dlr full "a.tsv b.tsv" "a.tsv b.tsv" "${log_opts[@]}"
verify derived-unseen derived.json etl-derived derived-unseen.dlr full "a.tsv b.tsv" c.tsv "${log_opts[@]}"

# std-*: no transform, standardized, hashed columns.
fit std derived.json a.tsv b.tsv -- "${std_opts[@]}"
"$bin" etl apply -q --etl etl-std --input a.tsv b.tsv --out std-oof.dlr
"$bin" etl apply -q --etl etl-std --input c.tsv --out std-unseen.dlr --target-encoding full
verify std-oof derived.json etl-std std-oof.dlr oof "a.tsv b.tsv" "a.tsv b.tsv" "${std_opts[@]}"
verify std-unseen derived.json etl-std std-unseen.dlr full "a.tsv b.tsv" c.tsv "${std_opts[@]}"

# leak: line 10 of a.tsv (row 9) with its label flipped.
fit flipped derived.json a-flipped.tsv b.tsv -- "${log_opts[@]}"
"$bin" etl apply -q --etl etl-flipped --input a-flipped.tsv b.tsv --out flipped-oof.dlr
"$bin" etl apply -q --etl etl-flipped --input a-flipped.tsv b.tsv --out flipped-full.dlr --target-encoding full
verify flipped-oof derived.json etl-flipped flipped-oof.dlr oof "a-flipped.tsv b.tsv" "a-flipped.tsv b.tsv" \
  "${log_opts[@]}"
check leak --bin "$bin" --workflow derived.json --row 9 derived-oof.dlr flipped-oof.dlr derived-full.dlr flipped-full.dlr
echo "etl_ops: dlrec's derived columns match the NumPy reference of docs/etl.md"
