#!/usr/bin/env bash
# Training with the embedding table tiered (storage.kind "tiered": the table in
# a file, a RAM cache of a fraction of its rows) against the same run with the
# table in RAM.
#
# usage: bench/tiered.sh                        (ROWS=1000000 FRACTION=0.1 BATCHES="2048")
#        ROWS=300000 BATCHES="128 2048" REPEATS=1 bench/tiered.sh
#
# Synthesizes ROWS Criteo-like rows with Criteo Kaggle's cardinalities
# (Zipf-distributed ids; CAP caps them, default none) and fits the ETL with
# --min-count 1, so that the table holds every id seen, most of them rare:
# the long tail a cache must live with. Then, for each batch size, trains one
# epoch of the Kaggle-shaped DLRM (examples/dlrm_criteo.json; SPARSE sets the
# sparse optimizer, default rowwise_adagrad, whose per-row state travels with
# the rows) with the table in RAM and tiered with a cache of FRACTION of the
# table's rows, in REPEATS rounds (default 2), alternating, each keeping its
# fastest, and prints samples/s, tiered's share of ram's, the cache's hit
# rate, the file bytes read and written per step, the seconds spent resolving
# ids, the validation AUC (the same bits are expected: test_train checks them)
# and peak RSS. The table file goes to TMPDIR (put it on the disk to measure).
# Goal (issue 12): tiered at least 75% of ram's samples/s with a cache of 10%.
set -euo pipefail

rows=${ROWS:-1000000}
cap=${CAP:-0}
fraction=${FRACTION:-0.1}
batches=${BATCHES:-2048}
threads=${THREADS:-2}
repeats=${REPEATS:-2}
sparse=${SPARSE:-rowwise_adagrad}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DLREC_BIN:-$root/build/dlrec}
py=${PYTHON:-python3}
[ -x "$bin" ] || { echo "tiered: no dlrec at $bin (run 'make build' or set DLREC_BIN)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-tiered-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
# run_rss, json_get, faster, cpu_line, dlrm_config
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

cpu_line
echo "synthesizing $rows rows (cap: ${cap/#0/none}), ETL with --min-count 1 ..."
cap_opt=()
[ "$cap" -gt 0 ] && cap_opt=(--max-cardinality "$cap")
"$bin" synth --rows "$rows" "${cap_opt[@]}" --out "$work/clicks.tsv" -q
"$bin" etl fit --input "$work/clicks.tsv" --out "$work/etl" --min-count 1 -q
"$bin" etl apply --etl "$work/etl" --input "$work/clicks.tsv" --out "$work/train.dlr" \
  --valid-fraction 0.1 --valid-out "$work/valid.dlr" --seed 7 -q
rm -f "$work/clicks.tsv"
"$bin" inspect "$work/train.dlr" --json > "$work/inspect.json"
train_rows=$(json_get "$work/inspect.json" "j['rows']")
table_rows=$(json_get "$work/inspect.json" "j['sparse'][-1]['id_end']")
cache_rows=$(awk -v n="$table_rows" -v f="$fraction" 'BEGIN { printf "%d", n * f }')
echo "  $train_rows training rows; table: $table_rows rows x 16 fp32; cache: $cache_rows rows ($fraction)"

results=()
for b in $batches; do
  declare -A best=()
  for round in $(seq "$repeats"); do
    for kind in ram tiered; do
      cfg=$work/cfg-$kind.json
      dlrm_config "$cfg" "$b" "$threads" "optimizer.sparse.type=\"$sparse\"" "optimizer.sparse.lr=0.05" \
        "storage.kind=\"$kind\"" "storage.cache_rows=$([ "$kind" = tiered ] && echo "$cache_rows" || echo 0)" \
        "log.interval_steps=1000000000"
      echo "  batch $b, round $round: $kind ..."
      run_rss "$work/out.rss" "$bin" train --config "$cfg" --train "$work/train.dlr" --valid "$work/valid.dlr" \
        --etl "$work/etl" --out "$work/run" -q > "$work/out.json"
      s=$(json_get "$work/out.json" "j['samples_per_s']")
      if faster "$s" "${best[$kind]:-0}"; then
        best[$kind]=$s
        cp "$work/out.json" "$work/best-$b-$kind.json"
        cp "$work/out.rss" "$work/best-$b-$kind.rss"
        cp "$work/run/metrics.jsonl" "$work/best-$b-$kind.metrics"
      fi
      rm -rf "$work/run"
    done
  done
  for kind in ram tiered; do
    results+=("$("$py" - "$work/best-$b-$kind.json" "$work/best-$b-$kind.metrics" "$(cat "$work/best-$b-$kind.rss")" \
      "${best[ram]}" "$b" "$kind" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
lines = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
rss, ram_sps, b, kind = sys.argv[3], float(sys.argv[4]), sys.argv[5], sys.argv[6]
t = next((l["table_storage"] for l in reversed(lines) if "table_storage" in l), None)
steps = d["steps"]
hit = "%.3f" % t["hit_rate"] if t else "-"
rd = "%.0f" % (t["bytes_read"] / steps / 1024) if t else "-"
wr = "%.0f" % (t["bytes_written"] / steps / 1024) if t else "-"
rss_s = "%.0f MiB" % (int(rss) / 1024) if rss.strip() else "-"
print("%6s %-7s %10.0f %6.0f%% %8s %12s %12s %9.2f %9.4f %10s" % (b, kind, d["samples_per_s"],
      100 * d["samples_per_s"] / ram_sps, hit, rd, wr, d["profile"]["table_storage_seconds"], d["valid"]["auc"], rss_s))
EOF
)")
  done
  unset best
done

echo
echo "DLRM (Kaggle shape, dim 16), sparse $sparse, 1 epoch of $train_rows rows; table $table_rows rows" \
  "($(awk -v n="$table_rows" 'BEGIN { printf "%.0f MiB", n * 64 / 1048576 }') of rows), tiered cache $cache_rows rows;" \
  "best of $repeats rounds"
printf '%6s %-7s %10s %7s %8s %12s %12s %9s %9s %10s\n' batch table samples/s vs_ram hit_rate KiB_read/step \
  KiB_wrtn/step resolve_s valid_AUC peak_RSS
for r in "${results[@]}"; do echo "$r"; done
