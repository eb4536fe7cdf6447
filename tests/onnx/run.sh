#!/usr/bin/env bash
# ONNX export of every model type, scored by onnxruntime (PyPI, in a virtual
# environment under the build tree, installed once) against `dlrec predict`
# on the same rows: every probability within 1e-5, and a batch of 0 rows
# scored (check.py). Each type's first config and the models on CSV rows
# also score ids outside the table (negative or too large) as the zero row.
#
# Models: every registered type in each of the configs its registry entry
# gives the tests (`dlrec models --json`: batch normalization and dropout,
# every DCN-v2 cross variant, DLRM's interactions...), on Criteo-like rows;
# then deepfm, dlrm and dcn_v2 on CSV rows with a multi-hot column of each
# pooling, and lr, dlrm and wide_deep on categorical-only rows (dlrm
# without a bottom MLP, lr without a dense term). Each trains a few dozen steps first, so
# that no parameter (or running statistic) is still at its initial value.
# Then a raw-key (hash table) model is refused with a clear error.
#
# usage: tests/onnx/run.sh DLREC_BIN WORKDIR
set -euo pipefail
bin=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
venv=$work/venv
mkdir -p "$work"
. "$here/../venv.sh"
venv_ready "$venv" 'import onnxruntime, numpy' onnxruntime numpy
py=$venv/bin/python
cd "$work"
rm -rf data-* run-* *.onnx *.scores models.json models.list

# Criteo-like rows.
mkdir -p data-criteo
"$bin" synth -q --rows 4000 --seed 4 --max-cardinality 300 --out data-criteo/rows.tsv
"$bin" etl fit -q --input data-criteo/rows.tsv --out data-criteo/etl --min-count 2
"$bin" etl apply -q --etl data-criteo/etl --input data-criteo/rows.tsv --out data-criteo/train.dlr \
  --valid-fraction 0.2 --valid-out data-criteo/valid.dlr --seed 1

# CSV rows with two multi-hot columns (sum and mean pooling), and the same
# columns without the dense one (categorical only).
"$py" - <<'PY'
import random
random.seed(7)
genres = ["Action", "Drama", "Comedy", "Horror", "Romance", "SciFi", "Docs", "Kids"]
with open("multi.csv", "w") as f, open("cats.csv", "w") as g:
    f.write("y,rating,movie,genres,tags\n")
    g.write("y,movie,city,genres\n")
    for i in range(3000):
        k = random.randint(0, 4)  # empty lists too
        gs = "|".join(random.sample(genres, k))
        ts = "/".join(random.sample(genres, random.randint(1, 3)))
        y = int(random.random() < 0.2 + 0.1 * k)
        movie = f"m{random.randint(0, 200)}"
        f.write(f"{y},{random.random() * 5:.3f},{movie},{gs},{ts}\n")
        g.write(f"{y},{movie},c{random.randint(0, 40)},{gs}\n")
PY
for d in multi cats; do
  mkdir -p "data-$d"
  if [ "$d" = multi ]; then
    spec='label=y;dense=rating;cat=movie,genres,tags;multi=genres:|,tags:/:mean'
  else
    spec='label=y;cat=movie,city,genres;multi=genres:|'
  fi
  "$bin" etl fit -q --format csv --schema "$spec" --input "$d.csv" --out "data-$d/etl" --min-count 1
  "$bin" etl apply -q --etl "data-$d/etl" --input "$d.csv" --out "data-$d/train.dlr" \
    --valid-fraction 0.2 --valid-out "data-$d/valid.dlr" --seed 1
done

mlp='"mlp": [32, 16], "batch_norm": true, "dropout": 0.1'
check() { # NAME DATA MODEL_JSON [--out-of-table]
  local name=$1 data=data-$2 model=$3
  cat > "run-$name.json" <<JSON
{"model": $model,
 "optimizer": {"dense": {"type": "adam", "lr": 0.01}, "sparse": {"type": "rowwise_adagrad", "lr": 0.1}},
 "training": {"batch_size": 64, "epochs": 1, "threads": 1, "seed": 3},
 "eval": {"train_rows": 0}}
JSON
  "$bin" train -q --config "run-$name.json" --train "$data/train.dlr" --etl "$data/etl" --out "run-$name" \
    --max-steps 30 > /dev/null
  "$bin" export -q --model "run-$name" --onnx "$name.onnx" > /dev/null
  "$bin" predict -q --model "run-$name" --input "$data/valid.dlr" --out "$name.scores"
  "$py" "$here/check.py" "$bin" "$name.onnx" "$data/valid.dlr" "$name.scores" 500 "${@:4}"
}
# Every registered type's test configs, named TYPE-J.
"$bin" models --json > models.json
"$py" - > models.list <<'PY'
import json
for t in json.load(open("models.json")):
    for j, c in enumerate(t["tests"]):
        print(f"{t['type']}-{j}\t{json.dumps(dict(type=t['type'], **c['model']))}")
PY
[ -s models.list ] || { echo "run.sh: dlrec models --json listed no model type" >&2; exit 1; }
while IFS=$'\t' read -r name model <&3; do
  oot=()
  [ "${name##*-}" != 0 ] || oot=(--out-of-table)
  check "$name" criteo "$model" "${oot[@]}"
done 3< models.list
oot=--out-of-table
check deepfm_multi multi "{\"type\": \"deepfm\", \"embedding_dim\": 8, $mlp}" $oot
check dlrm_multi_mean multi \
  '{"type": "dlrm", "embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [16, 1], "pooling": "mean"}' $oot
check dcn_v2_multi multi '{"type": "dcn_v2", "embedding_dim": 4, "cross_layers": 2, "mlp": [16]}' $oot
check lr_cats cats '{"type": "lr"}' $oot
check dlrm_cats cats '{"type": "dlrm", "embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [16, 1]}' $oot
check wide_deep_cats cats "{\"type\": \"wide_deep\", \"embedding_dim\": 8, $mlp}" $oot

# A raw-key model: refused, saying why.
mkdir -p data-keys
"$bin" etl fit -q --input data-criteo/rows.tsv --out data-keys/etl --raw-keys
"$bin" etl apply -q --etl data-keys/etl --input data-criteo/rows.tsv --out data-keys/train.dlr
cat > run-keys.json <<'JSON'
{"model": {"type": "lr"}, "storage": {"kind": "hash", "cache_rows": 4096}, "training": {"batch_size": 64, "threads": 1},
 "eval": {"train_rows": 0}}
JSON
"$bin" train -q --config run-keys.json --train data-keys/train.dlr --etl data-keys/etl --out run-keys \
  --max-steps 5 > /dev/null
if "$bin" export -q --model run-keys --onnx keys.onnx 2> keys.err; then
  echo "run.sh: a raw-key model was exported" >&2
  exit 1
fi
grep -q 'hash table' keys.err || { echo "run.sh: unclear refusal: $(cat keys.err)" >&2; exit 1; }
[ ! -e keys.onnx ] || { echo "run.sh: a refused export left keys.onnx" >&2; exit 1; }
echo "every model type exported and scored by onnxruntime within 1e-5 of dlrec predict" \
  "(ids outside the table as the zero row)"
