#!/usr/bin/env bash
# The cost of checkpoints of a tiered table: every checkpoint full against
# journaled checkpoints (checkpoint.journal_max_fraction, docs/formats.md).
#
# usage: bench/checkpoint.sh                 (ROWS=1000000 INTERVAL=20 BATCH=2048)
#        ROWS=300000 INTERVAL=10 FRACTIONS="0 0.1 0.25" bench/checkpoint.sh
#
# Synthesizes ROWS Criteo-like rows with Criteo Kaggle's cardinalities (CAP
# caps them, default none), fits the ETL with --min-count 1 (every id seen
# gets a row: the long tail, as in bench/tiered.sh) and trains one epoch of the
# Kaggle-shaped DLRM (examples/dlrm_criteo.json, row-wise Adagrad) with the
# table tiered (a cache of a tenth of its rows) and a checkpoint every
# INTERVAL steps, once per journal_max_fraction in FRACTIONS (default "0
# 0.25"; 0: every checkpoint full). Prints per run the number of full and
# journaled checkpoints, the mean seconds of each kind, the journals' mean
# share of the table's rows, the bytes a checkpoint directory adds on disk
# (its own files, links not counted), the seconds spent checkpointing in all
# and the run's samples/s, checkpoints included. The run directory goes to
# TMPDIR (put it on the disk to measure).
set -euo pipefail

rows=${ROWS:-1000000}
cap=${CAP:-1000000000}
interval=${INTERVAL:-20}
batch=${BATCH:-2048}
threads=${THREADS:-2}
fractions=${FRACTIONS:-0 0.25}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
py=${PYTHON:-python3}
[ -x "$bin" ] || { echo "checkpoint: no dlrec at $bin (run 'make build' or set DLREC_BIN)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-checkpoint-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
# json_get, cpu_line, make_criteo_data, dlrm_config
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

cpu_line
echo "synthesizing $rows rows ..."
make_criteo_data "$rows" "$cap" 1
cache_rows=$((table_rows / 10))
echo "  $train_rows training rows; table: $table_rows rows x 16 fp32 + Adagrad; cache: $cache_rows rows"

results=()
for f in $fractions; do
  cfg=$work/cfg.json
  dlrm_config "$cfg" "$batch" "$threads" "storage.kind=\"tiered\"" "storage.cache_rows=$cache_rows" \
    "checkpoint.interval_steps=$interval" "checkpoint.keep=1000" "checkpoint.journal_max_fraction=$f" \
    "log.interval_steps=1000000000"
  echo "  journal_max_fraction $f ..."
  rm -rf "$work/run"
  "$bin" train -v --config "$cfg" --train "$work/train.dlr" --etl "$work/etl" --out "$work/run" \
    > "$work/out.json" 2> "$work/log"
  results+=("$("$py" - "$work/out.json" "$work/log" "$work/run" "$f" <<'EOF'
import json, os, re, sys
out, log, run, f = sys.argv[1:]
d = json.load(open(out))
full, jour, share = [], [], []
for line in open(log):
    m = re.search(r"checkpoint at step \d+ in ([\d.]+) s: (full|a journal of \d+ rows \(([\d.]+)% of the table\))", line)
    if not m:
        continue
    if m.group(2) == "full":
        full.append(float(m.group(1)))
    else:
        jour.append(float(m.group(1)))
        share.append(float(m.group(3)))
own = []  # bytes each checkpoint directory adds: files not linked from another
for c in sorted(x for x in os.listdir(run) if x.startswith("ckpt-")):
    n = 0
    for dp, _, fs in os.walk(os.path.join(run, c)):
        for name in fs:
            st = os.stat(os.path.join(dp, name))
            if st.st_nlink == 1 or not os.path.exists(os.path.join(dp, "journal.bin")) or name not in ("table.bin", "optim.bin"):
                n += st.st_size
    own.append(n)
mean = lambda v: sum(v) / len(v) if v else float("nan")
print("%8s %5d %8.2f %7d %8.2f %8.1f%% %10.1f %10.2f %10.0f" % (f, len(full), mean(full), len(jour), mean(jour),
      mean(share), mean(own) / 2**20, sum(full) + sum(jour), d["samples_per_s"]))
EOF
)")
done

echo
echo "DLRM (Kaggle shape, dim 16), row-wise Adagrad, batch $batch, 1 epoch of $train_rows rows; table $table_rows rows" \
  "($(awk -v n="$table_rows" 'BEGIN { printf "%.0f MiB", n * 68 / 1048576 }') with its Adagrad state), tiered cache" \
  "$cache_rows rows; a checkpoint every $interval steps"
printf '%8s %5s %8s %7s %8s %9s %10s %10s %10s\n' fraction full full_s journal journal_s rows_share MiB/ckpt \
  ckpt_s_all samples/s
for r in "${results[@]}"; do echo "$r"; done
