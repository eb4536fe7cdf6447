#!/usr/bin/env bash
# Every model type, dlrec against PyTorch, on the same data, in one run.
#
# usage: bench/models_vs_torch.sh [--quick] [MODEL ...]
#   MODEL: a model type this dlrec has (`dlrec models`), or dcn_v2_mix
#          (default: every type, then dcn_v2_mix)
#   --quick      a smoke run: ROWS=20000 CAP=20000 (seconds per model, figures
#                meaningless but every path exercised)
#   environment: ROWS (default 200000), CAP (100000), BATCHES ("128 4096"),
#                THREADS (2, both engines), REPEATS (1), SEEDS (1), SAME_INIT (1),
#                MIX_ACTIVATION (relu), DLREC_BIN, PYTHON (/usr/bin/python3),
#                PRECISION (fp32; bf16: dlrec's training.precision "bf16" against
#                PyTorch under torch.autocast bf16, both native on a CPU with
#                avx512_bf16 or AMX and emulated elsewhere)
#
# Synthesizes ROWS Criteo-like rows (`dlrec synth`, categorical columns capped
# at CAP distinct values), fits the ETL (--min-count 2) and encodes train.dlr
# and valid.dlr (10% held out), as bench/train_vs_torch.sh does. Then for each
# model and each batch size in BATCHES it trains one epoch of train.dlr with
#   - dlrec train, THREADS compute threads;
#   - bench/torch_models.py, the same model, optimizers and initialization
#     scheme in PyTorch, reading the same config file and the same .dlr rows
#     through bench/torch_dlrm.py's reader, torch.set_num_threads(THREADS);
# and prints, per model and batch, both engines' samples/s (the training
# loop with data loading, evaluation excluded, on both sides), their ratio,
# and both validation AUCs and their distance. The goal (issue 9) is dlrec
# at least 2x PyTorch at |dAUC| <= 0.002.
#
# SEEDS=N trains each model and batch from N initial states (training.seed
# 1..N, both engines starting from the same one), and the AUC columns are
# the means over the seeds: |dAUC| is then the mean of the N paired
# differences, and dAUC_sd their standard deviation. One seed measures how
# far the two engines' different rounding carries a single trajectory;
# where a model's AUC is that sensitive (dcn_v2 at batch 128 moves 0.003
# between one and two threads of dlrec alone), only the mean over seeds
# says whether the two train alike. samples/s is the best run over seeds
# and rounds.
#
# Before timing a model, the script checks that the two are one function:
# PyTorch loads the parameters of a dlrec checkpoint and scores valid.dlr,
# and its probabilities must equal `dlrec predict`'s to float rounding
# (column same_fn: the largest difference; a model over 1e-4 is flagged).
# PyTorch then starts from dlrec's initial values (SAME_INIT=1, the
# default), so that the two AUCs differ only by the engines' arithmetic and
# |dAUC| says whether dlrec's training matches PyTorch's. With SAME_INIT=0
# each side draws its own values by the same scheme, and |dAUC| also holds
# seed luck: at 54k rows, 0.0015 to 0.005 at batch 128 and 0.01 to 0.05 at
# batch 4096 (14 steps, where the initial values still dominate).
#
# Both sides see the same rows in the same order: the loader's shuffle is off
# on both (the synthetic rows are independent draws already, so shuffling
# them again changes nothing but the order, and a different order would be
# one more difference between the two AUCs). The
# steps are then equal too (ceil(rows / batch), the last batch short); the
# table shows both counts.
#
# The models: every type of this dlrec's registry (`dlrec models --json`),
# then dcn_v2_mix, each trained with its config below, identical on both
# sides:
#   lr, fm          examples/lr.json's and examples/fm.json's shapes and optimizers
#   dlrm            the Criteo Kaggle DLRM (examples/dlrm_criteo.json's shape)
#   wide_deep       embedding_dim 16, mlp [400, 400, 400]
#   deepfm          embedding_dim 16, mlp [400, 400, 400]
#   dcn_v2          stacked, 3 full-rank cross layers, mlp [400, 400, 400]
#   dcn_v2_mix      parallel, 3 cross layers of 4 experts of rank 64, mlp [400, 400, 400]
#   any other type  its defaults ({"type": TYPE})
# The MLP models (and any other type) train with Adam (lr 0.002) on the
# dense parameters and row-wise Adagrad (lr 0.05) on the embeddings. A type
# without a PyTorch twin in bench/torch_models.py (its --twins) gets a row
# of dlrec's figures alone, marked "no PyTorch twin"; a model that this
# `dlrec train` does not know is skipped, saying so.
#
# Needs a built dlrec (build/dlrec, or DLREC_BIN) and Debian's python3-torch
# (with numpy), which it installs with apt-get when missing, as
# scripts/deps.sh does.
set -euo pipefail

quick=0
models=()
for a in "$@"; do
  case $a in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "models_vs_torch: unknown option $a (see --help)" >&2; exit 2 ;;
    *) models+=("$a") ;;
  esac
done
if [ $quick = 1 ]; then
  rows=${ROWS:-20000} cap=${CAP:-20000}
else
  rows=${ROWS:-200000} cap=${CAP:-100000}
fi
batches=${BATCHES:-128 4096}
precision=${PRECISION:-fp32}
case $precision in fp32 | bf16) ;; *) echo "models_vs_torch: PRECISION: '$precision' is not fp32 or bf16" >&2; exit 2 ;; esac
torch_prec=()
[ "$precision" = bf16 ] && torch_prec=(--bf16)
threads=${THREADS:-2}
repeats=${REPEATS:-1}
seeds=${SEEDS:-1}
case $seeds in '' | *[!0-9]* | 0) echo "models_vs_torch: SEEDS: '$seeds' is not a positive count" >&2; exit 2 ;; esac
mix_act=${MIX_ACTIVATION:-relu}
same_init=${SAME_INIT:-1}
# Both engines run under the passive OpenMP wait policy, as in
# train_vs_torch.sh: spinning idle workers compete with the other threads of
# the process, and on a shared machine with everything else running.
wait=${OMP_WAIT_POLICY:-PASSIVE}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
py=${PYTHON:-/usr/bin/python3}
[ -x "$bin" ] || { echo "models_vs_torch: no dlrec at $bin (run 'make build' or set DLREC_BIN)" >&2; exit 1; }

# The models: the registry's types, then the variants this script adds.
types=$("$bin" models --json | "$py" -c 'import json, sys; print(" ".join(t["type"] for t in json.load(sys.stdin)))')
[ -n "$types" ] || { echo "models_vs_torch: $bin models --json listed no model type" >&2; exit 1; }
all_models=($types dcn_v2_mix)
[ ${#models[@]} -gt 0 ] || models=("${all_models[@]}")
for m in "${models[@]}"; do
  case " ${all_models[*]} " in *" $m "*) ;; *) echo "models_vs_torch: unknown model $m (one of ${all_models[*]})" >&2; exit 2 ;; esac
done

# PyTorch comes from Debian (python3-torch pulls numpy in), installed only
# when missing, with apt-get update first, as scripts/deps.sh installs.
if ! "$py" -c 'import torch, numpy' 2>/dev/null; then
  echo "models_vs_torch: installing python3-torch (the PyTorch peer)" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends python3-torch python3-numpy >/dev/null
  "$py" -c 'import torch, numpy' || { echo "models_vs_torch: $py still cannot import torch" >&2; exit 1; }
fi
# The types bench/torch_models.py has a twin of.
twins=" $("$py" "$root/bench/torch_models.py" --twins) "

work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-models-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

# json_get FILE EXPR: a value from a JSON file (python's json; EXPR indexes 'j')
json_get() { "$py" -c "import json,sys; j=json.load(open(sys.argv[1])); v=$2; print('nan' if v is None else v)" "$1"; }

cpu=$(LC_ALL=C lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
[ -n "$cpu" ] || cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
# The family tells a VM's bare "AMD EPYC" apart: 25 is Zen 3/4, 26 Zen 5.
fam=$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -1)
cpu="${cpu:-unknown}${fam:+ family $fam}"
echo "models_vs_torch: $rows rows (cap $cap), CPU ${cpu:-unknown} ($(nproc) cores), $threads threads each, $precision," \
  "dlrec $("$bin" version | head -1 | cut -d' ' -f2), torch $("$py" -c 'import torch; print(torch.__version__)')"
"$bin" synth --rows "$rows" --max-cardinality "$cap" --out "$work/clicks.tsv" -q
"$bin" etl fit --input "$work/clicks.tsv" --out "$work/etl" --min-count 2 -q
"$bin" etl apply --etl "$work/etl" --input "$work/clicks.tsv" --out "$work/train.dlr" \
  --valid-fraction 0.1 --valid-out "$work/valid.dlr" --seed 7 -q
rm -f "$work/clicks.tsv"
train_rows=$("$bin" inspect "$work/train.dlr" --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["rows"])')
valid_rows=$("$bin" inspect "$work/valid.dlr" --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["rows"])')
echo "  data: $train_rows train rows, $valid_rows valid rows"

# write_config MODEL BATCH OUT SEED [LR_SCALE]: the config both engines read
# (its learning rates times LR_SCALE, default 1).
write_config() {
  "$py" - "$1" "$2" "$threads" "$3" "${5:-1}" "$precision" "$4" <<'EOF'
import json, sys
name, batch, threads, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lr_scale, precision, seed = float(sys.argv[5]), sys.argv[6], int(sys.argv[7])
mlp_opt = {"dense": {"type": "adam", "lr": 0.002}, "sparse": {"type": "rowwise_adagrad", "lr": 0.05}}
deep = {"embedding_dim": 16, "mlp": [400, 400, 400]}
models = {
    "lr": ({"type": "lr"},
           {"dense": {"type": "adam", "lr": 0.01}, "sparse": {"type": "rowwise_adagrad", "lr": 0.05}}),
    "fm": ({"type": "fm", "embedding_dim": 16},
           {"dense": {"type": "adam", "lr": 0.01}, "sparse": {"type": "rowwise_adagrad", "lr": 0.02}}),
    "dlrm": ({"type": "dlrm", "embedding_dim": 16, "bottom_mlp": [512, 256, 64, 16], "top_mlp": [512, 256, 1]},
             mlp_opt),
    "wide_deep": (dict(type="wide_deep", **deep), mlp_opt),
    "deepfm": (dict(type="deepfm", **deep), mlp_opt),
    "dcn_v2": (dict(type="dcn_v2", structure="stacked", cross_layers=3, **deep), mlp_opt),
    "dcn_v2_mix": (dict(type="dcn_v2", structure="parallel", cross_layers=3, low_rank=64, experts=4, **deep),
                   mlp_opt),
}
# A type without an entry here trains its defaults, as the MLP models train.
model, opt = models.get(name, ({"type": name}, mlp_opt))
for o in opt.values():
    o["lr"] *= lr_scale
json.dump({"name": name, "model": model, "optimizer": opt,
           "training": {"batch_size": batch, "epochs": 1, "threads": threads, "seed": seed, "precision": precision},
           "loader": {"shuffle": False}, "eval": {"interval_steps": 0, "batch_size": 4096},
           "log": {"interval_steps": 1000}}, open(out, "w"), indent=2)
EOF
}

results=() skipped=()
for m in "${models[@]}"; do
  # A type this dlrec does not know yet is skipped: two steps on the small
  # valid file tell, from the config error naming model.type. They run at
  # learning rate 0, so that the probe's checkpoint holds dlrec's initial
  # parameters (for SAME_INIT=1).
  write_config "$m" 128 "$work/probe.json" 1 0
  rm -rf "$work/probe"
  if ! OMP_WAIT_POLICY=$wait "$bin" train --config "$work/probe.json" --train "$work/valid.dlr" --etl "$work/etl" \
      --out "$work/probe" --max-steps 2 -q > /dev/null 2> "$work/probe.err"; then
    # Any other failure (a key this dlrec names otherwise, say) skips the
    # model too, so that the others are still measured.
    if grep -q "field 'type'" "$work/probe.err"; then
      why="this dlrec train does not know the model type"
    else
      why="dlrec train failed: $(head -1 "$work/probe.err")"
    fi
    echo "  $m: skipped: $(head -1 "$work/probe.err")" >&2
    skipped+=("$m|$why")
    continue
  fi
  # Are the two models one function? The PyTorch model loads the probe's
  # checkpoint and scores valid.dlr; its probabilities must equal `dlrec
  # predict`'s to float rounding (1e-4), else the comparison is of two
  # different models, and the table says so. A type without a PyTorch twin
  # is timed on dlrec alone.
  mtype=$(json_get "$work/probe.json" "j['model']['type']")
  twin=1
  case $twins in *" $mtype "*) ;; *) twin=0 ;; esac
  same=unchecked
  if [ $twin = 0 ]; then
    same=no_twin
    echo "  $m: no PyTorch twin in bench/torch_models.py: dlrec's figures alone" >&2
  else
    "$bin" predict --model "$work/probe" --input "$work/valid.dlr" --out "$work/probe.scores" --threads "$threads" \
      2> /dev/null
    if OMP_WAIT_POLICY=$wait "$py" "$root/bench/torch_models.py" --config "$work/probe.json" --train "$work/train.dlr" \
        --valid "$work/valid.dlr" --threads "$threads" --mix-activation "$mix_act" --check "$work/probe" \
        --scores "$work/probe.scores" > "$work/check.json" 2> "$work/check.err"; then
      same=$(json_get "$work/check.json" "'%.1e' % j['max_abs_diff']")
      echo "  $m: same function: max |p_dlrec - p_torch| = $same on $valid_rows rows (same parameters)"
    elif [ -s "$work/check.json" ]; then
      same="DIFFERS($(json_get "$work/check.json" "'%.1e' % j['max_abs_diff']"))"
      echo "  $m: THE MODELS DIFFER: max |p_dlrec - p_torch| = ${same#DIFFERS} with the same parameters" >&2
    else
      echo "  $m: not checked for equal functions: $(tail -3 "$work/check.err")" >&2
    fi
  fi
  # PyTorch's initial values: dlrec's (the probe's checkpoint, one per
  # seed), unless its tensors did not map onto the PyTorch model, which then
  # draws its own from the same seed.
  init=$same_init
  if [ $twin = 0 ]; then
    init=0
  elif [ "$same_init" = 1 ] && [ "$same" = unchecked ]; then
    echo "  $m: PyTorch draws its own initial values (dlrec's do not map onto it)" >&2
    init=0
  elif [ "$same_init" = 1 ]; then
    rm -rf "$work"/init-*
    mv "$work/probe" "$work/init-1"
    for seed in $(seq 2 "$seeds"); do
      write_config "$m" 128 "$work/probe.json" "$seed" 0
      OMP_WAIT_POLICY=$wait "$bin" train --config "$work/probe.json" --train "$work/valid.dlr" --etl "$work/etl" \
        --out "$work/init-$seed" --max-steps 2 -q > /dev/null
    done
  fi
  rm -rf "$work/probe"
  for b in $batches; do
    # For each seed, REPEATS rounds, the engines alternating; each engine
    # keeps its fastest run over all of them, and each seed's AUCs (the
    # same in every round: both engines are deterministic at a fixed
    # thread count) go to the means.
    d_sps=0 t_sps=0 aucs=""
    for seed in $(seq "$seeds"); do
      cfg=$work/$m-$b-$seed.json
      write_config "$m" "$b" "$cfg" "$seed"
      model_init=()
      [ "$init" = 1 ] && model_init=(--init-from "$work/init-$seed")
      for round in $(seq "$repeats"); do
        echo "  $m, batch $b, seed $seed, round $round: dlrec ..."
        OMP_WAIT_POLICY=$wait "$bin" train --config "$cfg" --train "$work/train.dlr" --valid "$work/valid.dlr" \
          --etl "$work/etl" --out "$work/run" -q > "$work/dlrec.json"
        rm -rf "$work/run"
        s=$(json_get "$work/dlrec.json" "j['samples_per_s']")
        if awk -v s="$s" -v best="$d_sps" 'BEGIN { exit !(s > best) }'; then
          d_sps=$s
          cp "$work/dlrec.json" "$work/dlrec-best.json"
        fi
        if [ $twin = 0 ]; then
          echo '{"samples_per_s": 0, "auc": null, "steps": 0}' > "$work/torch.json"
          cp "$work/torch.json" "$work/torch-best.json"
        else
          echo "  $m, batch $b, seed $seed, round $round: pytorch ..."
          OMP_WAIT_POLICY=$wait "$py" "$root/bench/torch_models.py" --config "$cfg" --train "$work/train.dlr" \
            --valid "$work/valid.dlr" --batch "$b" --threads "$threads" --no-shuffle --mix-activation "$mix_act" \
            --seed "$seed" ${model_init[@]+"${model_init[@]}"} ${torch_prec[@]+"${torch_prec[@]}"} > "$work/torch.json"
          s=$(json_get "$work/torch.json" "j['samples_per_s']")
          if awk -v s="$s" -v best="$t_sps" 'BEGIN { exit !(s > best) }'; then
            t_sps=$s
            cp "$work/torch.json" "$work/torch-best.json"
          fi
        fi
        echo "    dlrec $(json_get "$work/dlrec.json" "round(j['samples_per_s'])") samples/s," \
          "AUC $(json_get "$work/dlrec.json" "round(j['valid']['auc'], 4)");" \
          "pytorch $(json_get "$work/torch.json" "round(j['samples_per_s'])") samples/s," \
          "AUC $(json_get "$work/torch.json" "j['auc'] and round(j['auc'], 4)")"
      done
      aucs="$aucs $(json_get "$work/dlrec.json" "j['valid']['auc']"):$(json_get "$work/torch.json" "j['auc']")"
    done
    # The means of each engine's AUCs and the paired differences' standard
    # deviation ("-" for one seed).
    set -- $(echo "$aucs" | tr ' :' '\n ' | awk 'NF == 2 { n++; d += $1; t += $2; x[n] = $1 - $2 }
      END { m = (d - t) / n; v = 0; for (i = 1; i <= n; i++) v += (x[i] - m) ^ 2
            sd = "-"; if (n > 1) sd = sprintf("%.4f", sqrt(v / (n - 1)))
            printf "%.6f %.6f %s\n", d / n, t / n, sd }')
    d_auc=$1 t_auc=$2 sd=$3
    d_steps=$(json_get "$work/dlrec-best.json" "j['steps']")
    t_steps=$(json_get "$work/torch-best.json" "j['steps']")
    results+=("$m $b $d_sps $t_sps $d_auc $t_auc $d_steps $t_steps $same $sd")
  done
done

echo
echo "Models, dlrec against PyTorch: one epoch of $train_rows rows, AUC on $valid_rows rows; CPU ${cpu:-unknown}"
echo "($(nproc) cores); $threads threads each, $precision (both engines), OMP_WAIT_POLICY=$wait; best of $repeats round(s)"
echo "of $seeds seed(s), AUCs the means over the seeds; goal >= 2x at |dAUC| <= 0.002"
echo "same_fn: max |p_dlrec - p_torch| on the valid rows with the same parameters (dlrec's, loaded into PyTorch)"
printf '%-11s %6s %14s %14s %7s %9s %9s %7s %7s %7s %9s %s\n' model batch dlrec_samp/s torch_samp/s ratio \
  dlrec_AUC torch_AUC '|dAUC|' dAUC_sd steps same_fn goal
for r in ${results[@]+"${results[@]}"}; do
  set -- $r
  awk -v m="$1" -v b="$2" -v ds="$3" -v ts="$4" -v da="$5" -v ta="$6" -v dst="$7" -v tst="$8" -v same="$9" \
      -v sd="${10}" 'BEGIN {
    if (same == "no_twin") {
      printf "%-11s %6d %14.0f %14s %7s %9.4f %9s %7s %7s %7s %9s %s\n", m, b, ds, "-", "-", da, "-", "-", "-", dst,
        "-", "no PyTorch twin"
      exit
    }
    d = da - ta; if (d < 0) d = -d
    ratio = ts > 0 ? ds / ts : 0
    goal = (ratio >= 2 ? "" : "slow") (d <= 0.002 ? "" : ((ratio >= 2 ? "" : ",") "auc"))
    steps = dst == tst ? dst : dst "/" tst
    printf "%-11s %6d %14.0f %14.0f %6.2fx %9.4f %9.4f %7.4f %7s %7s %9s %s\n", m, b, ds, ts, ratio, da, ta, d, sd,
      steps, same, goal == "" ? "met" : goal
  }'
done
for x in ${skipped[@]+"${skipped[@]}"}; do
  printf '%-11s skipped: %s\n' "${x%%|*}" "${x#*|}"
done
