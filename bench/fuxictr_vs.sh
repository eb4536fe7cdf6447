#!/usr/bin/env bash
# dlrec against FuxiCTR itself: every model type both have, the same rows, split and protocol.
#
# usage: bench/fuxictr_vs.sh [--models lr,fm,dnn,wide_deep,deepfm,dcn_v2,dlrm] [--data ml100k|synth|both]
#                            [--epochs N] [--batch N] [--protocol fuxictr|lazy]
#   environment: DLREC_BIN (build/dlrec), VENV (.venv-fuxictr: built by bench/fuxictr/setup.sh when
#                missing), WORK (.bench-fuxictr: data, parquet, runs), OUT (WORK/results-DATE),
#                THREADS (2, both engines), SEED (2019), SYNTH_ROWS (100000), SYNTH_CAP (10000),
#                EMB_REG_ML100K (0.01), EMB_REG_SYNTH (1e-5), MIN_COUNT (1)
#
# Data (bench/fuxictr/data.py; one random 80/10/10 split, seed SEED, written once as
# train/valid/test CSVs that both engines read):
#   ml100k  MovieLens-100K from RecBole 1.2.1's wheel (setup.sh keeps it in VENV/cache):
#           label = rating >= 4; user_id, item_id, age, gender, occupation, zip_code,
#           release_year and the genre set as one token, all categorical.
#   synth   SYNTH_ROWS rows of `dlrec synth` (categories capped at SYNTH_CAP), its 26
#           categorical columns only; the true probabilities' test AUC is shown (they also
#           depend on the 13 dropped numeric columns, so no model here reaches it).
# Each engine builds its own vocabulary from train.csv with the same policy (a value seen
# MIN_COUNT times or more gets its id, the rest one out-of-vocabulary id): dlrec etl fit
# --min-count, FuxiCTR's FeatureProcessor min_categr_count.
#
# Per model (bench/fuxictr/configs.py writes both configs from one set of numbers): BARS's
# protocol, embedding dim 10, Adam 1e-3, L2 on the embeddings (EMB_REG_*: BARS's 0.01 of
# its MovieLens configs, 1e-5 of its Criteo ones), MLPs [400, 400, 400] with dropout 0.2
# and batch norm, gradient norm clipped to 10, batch BATCH (1024: BARS's 4096 would give 20
# steps an epoch on 80k rows), validation AUC every epoch, lr x0.1 on each validation that
# does not improve, early stop after 2, the best weights restored, EPOCHS (20) at most.
# --protocol fuxictr (default) gives dlrec FuxiCTR's initializers (embeddings N(0, 1e-4),
# biases zero), dense Adam over every embedding row and the L2 over the whole table;
# --protocol lazy leaves dlrec's own (uniform init, normal biases, lazy Adam and L2 on
# the rows a batch touches).
#   dlrec:   dlrec train --threads THREADS, then dlrec eval --checkpoint best on test.dlr
#   FuxiCTR: bench/fuxictr/run_fuxictr.py, torch.set_num_threads(THREADS), its BaseModel.fit
# samples/s: the training loop's rows per second (data loading in, validations out), both.
#
# Prints one table per data set: the per-epoch validation AUC of both, best epochs, test
# AUC (and the gap) and logloss, samples/s and the ratio; writes them to OUT/results.md
# and OUT/results.json, the runs' JSON beside them. Names the CPU.
set -euo pipefail

models=lr,fm,dnn,wide_deep,deepfm,dcn_v2,dlrm data=both epochs=20 batch=1024 protocol=fuxictr
while [ $# -gt 0 ]; do
  case $1 in
    --models) models=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --protocol) protocol=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fuxictr_vs: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case $data in ml100k) sets=(ml100k) ;; synth) sets=(synth) ;; both) sets=(ml100k synth) ;;
  *) echo "fuxictr_vs: --data: '$data' is not ml100k, synth or both" >&2; exit 2 ;; esac
case $protocol in fuxictr|lazy) ;; *) echo "fuxictr_vs: --protocol: '$protocol' is not fuxictr or lazy" >&2; exit 2 ;; esac
for n in "$epochs" "$batch"; do
  case $n in '' | *[!0-9]* | 0) echo "fuxictr_vs: '$n' is not a positive count" >&2; exit 2 ;; esac
done
IFS=, read -r -a mlist <<< "$models"
for m in "${mlist[@]}"; do
  case $m in lr | fm | dnn | wide_deep | deepfm | dcn_v2 | dlrm) ;;
    *) echo "fuxictr_vs: --models: unknown model '$m' (lr fm dnn wide_deep deepfm dcn_v2 dlrm)" >&2; exit 2 ;; esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
venv=${VENV:-$root/.venv-fuxictr}
work=${WORK:-$root/.bench-fuxictr}
out=${OUT:-$work/results-$(date +%Y%m%d-%H%M%S)}
threads=${THREADS:-2} seed=${SEED:-2019} min_count=${MIN_COUNT:-1}
[ -x "$bin" ] || { echo "fuxictr_vs: no dlrec at $bin (run 'make build' or set DLREC_BIN)" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/cache/recbole-1.2.1-py3-none-any.whl" ]; then
  "$root/bench/fuxictr/setup.sh" "$venv"
fi
py=$venv/bin/python
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cpu=$(cpu_line)
mkdir -p "$out"
echo "fuxictr_vs: $cpu; $threads threads each; dlrec $("$bin" version | head -1 | cut -d' ' -f2)," \
  "fuxictr $("$py" -c 'import fuxictr; print(fuxictr.__version__)'), protocol $protocol, batch $batch"

# prepare DATASET: the CSVs under $work/DATASET (once per seed), then dlrec's ETL and .dlr files.
prepare() {
  local ds=$1 d=$work/$1
  if [ ! -f "$d/info.json" ] || [ "$(json_get "$d/info.json" "j['seed']")" != "$seed" ]; then
    rm -rf "$d"
    if [ "$ds" = ml100k ]; then
      "$py" "$root/bench/fuxictr/data.py" ml100k --wheel "$venv/cache/recbole-1.2.1-py3-none-any.whl" \
        --out "$d" --seed "$seed" > /dev/null
    else
      mkdir -p "$d"
      "$bin" synth --rows "${SYNTH_ROWS:-100000}" --max-cardinality "${SYNTH_CAP:-10000}" --out "$d/clicks.tsv" \
        --probs "$d/clicks.probs" -q
      "$py" "$root/bench/fuxictr/data.py" synth --tsv "$d/clicks.tsv" --probs "$d/clicks.probs" --out "$d" \
        --seed "$seed" > /dev/null
      rm -f "$d/clicks.tsv" "$d/clicks.probs"
    fi
  fi
  rm -rf "$d/dlrec" "$work/fuxictr-$ds"
  mkdir -p "$d/dlrec"
  "$bin" etl fit --format csv --schema 'label=label;cat=*' --input "$d/train.csv" --out "$d/dlrec/etl" \
    --min-count "$min_count" -q
  for s in train valid test; do
    "$bin" etl apply --etl "$d/dlrec/etl" --input "$d/$s.csv" --out "$d/dlrec/$s.dlr" -q
  done
}

for ds in "${sets[@]}"; do
  prepare "$ds"
  d=$work/$ds r=$out/$ds
  mkdir -p "$r"
  cp "$d/info.json" "$r/info.json"
  reg=${EMB_REG_ML100K:-0.01}
  [ "$ds" = synth ] && reg=${EMB_REG_SYNTH:-1e-5}
  echo "$ds: $(json_get "$d/info.json" "j['rows']"), embedding L2 $reg"
  for m in "${mlist[@]}"; do
    "$py" "$root/bench/fuxictr/configs.py" "$m" --out-dir "$r/$m" --batch "$batch" --epochs "$epochs" \
      --seed "$seed" --emb-reg "$reg" --threads "$threads" --min-count "$min_count" --protocol "$protocol"
    rm -rf "$r/$m/run"
    "$bin" train --config "$r/$m/dlrec.json" --train "$d/dlrec/train.dlr" --valid "$d/dlrec/valid.dlr" \
      --etl "$d/dlrec/etl" --out "$r/$m/run" --threads "$threads" -q > "$r/$m/dlrec-summary.json"
    "$bin" eval --model "$r/$m/run" --checkpoint best --data "$d/dlrec/test.dlr" --threads "$threads" \
      > "$r/$m/dlrec-test.json"
    "$py" "$root/bench/fuxictr/report.py" dlrec "$r/$m/run" "$r/$m/dlrec-summary.json" "$r/$m/dlrec-test.json" \
      > "$r/$m.dlrec.json"
    rm -rf "$r/$m/run"
    "$py" "$root/bench/fuxictr/run_fuxictr.py" --data "$d" --work "$work/fuxictr-$ds" --model "$m" \
      --params "$r/$m/fuxictr.json" --threads "$threads" --out "$r/$m.fuxictr.json" > /dev/null \
      2> "$r/$m/fuxictr.log" || { tail -20 "$r/$m/fuxictr.log" >&2; exit 1; }
    echo "  $m: dlrec test AUC $(json_get "$r/$m.dlrec.json" "round(j['test_auc'], 4)")" \
      "($(json_get "$r/$m.dlrec.json" "round(j['samples_per_s'])") samples/s)," \
      "fuxictr $(json_get "$r/$m.fuxictr.json" "round(j['test_auc'], 4)")" \
      "($(json_get "$r/$m.fuxictr.json" "round(j['samples_per_s'])") samples/s)"
  done
done
echo
"$py" "$root/bench/fuxictr/report.py" table "$out" --cpu "$cpu; $threads threads each" \
  --note "protocol $protocol, batch $batch, at most $epochs epochs, seed $seed, min count $min_count"
echo "fuxictr_vs: results in $out"
