#!/usr/bin/env bash
# Training across ranks (docs/distributed.md), with Open MPI's mpirun:
#   1. N ranks of one thread train the same model, bit for bit, as one
#      process whose steps split N ways (N threads): N = 1 to 4, for DLRM
#      (fp32, SGD) and for DeepFM (dropout, Adam, row-wise Adagrad, a bf16
#      table whose rounding is keyed by the job's update count); the
#      sanitizer pass takes each N once, alternating the two models;
#   2. a checkpoint written by 4 ranks, resumed by 2, then scored by one
#      process: the same checkpoint bytes and scores as one process's;
#   3. a rank killed with SIGKILL mid-step: mpirun ends every rank of the
#      job by itself (not its --timeout), the last checkpoint loads, and 3
#      ranks resume it;
#   4. SIGTERM to one rank stops every rank at the same step, with a
#      checkpoint that resumes;
#   5. a config that cannot run across ranks (a tiered table) stops every
#      rank with a clear error, not a hang;
#   6. ranks started differently (a config field, a --train file, --resume)
#      are refused at the start on every rank, naming what differs;
#   7. SIGSTOP to one rank of three: the others end the job after
#      distributed.timeout_s, naming the stopped rank alone.
#   Also: batch normalization across ranks, fp16 with dynamic loss scaling
#   (the ranks agree on each step's overflow), dense features only,
#   validations across ranks, each bit for bit one process's.
# usage: tests/dist/run.sh DLREC_BIN MPIRUN WORKDIR
set -euo pipefail
bin=$1
mpirun=$2
work=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
rm -rf "$work"
mkdir -p "$work"
cd "$work"
fail() { echo "dist/run.sh: $*" >&2; exit 1; }
# Open MPI leaves allocations of its own at exit, which an ASan build's
# LeakSanitizer would report from every rank (tests/CMakeLists.txt,
# comm_mpi); the runs in one process keep their leak checks.
# MPI_TIMEOUT: seconds after which mpirun ends a job that hangs.
mpi() { ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$mpirun" --oversubscribe --bind-to none \
  --timeout "${MPI_TIMEOUT:-300}" -np "$@"; }
# The pids of the ranks (dlrec processes below the background job $1:
# mpirun's children), as "PID RANK" lines. A job's own processes, not
# pgrep -f's matches of its arguments, which another run of this test on
# the machine (another build's) has too.
ranks_of() {
  local p q r
  for p in $(pgrep -P "$1"); do
    for q in "$p" $(pgrep -P "$p"); do
      [ "$(cat /proc/"$q"/comm 2>/dev/null)" = dlrec ] || continue
      r=$(tr '\0' '\n' < /proc/"$q"/environ 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
      [ -n "$r" ] && echo "$q $r"
    done
  done
}
rank_pid() { ranks_of "$1" | awk -v r="$2" '$2 == r { print $1 }'; } # JOB RANK
# PID is still the process recorded as START (its /proc start time) and runs
# (a zombie has ended: only its parent has not reaped it yet).
still_runs() { # PID START
  local stat
  stat=$(cat /proc/"$1"/stat 2>/dev/null) || return 1
  stat=${stat##*) }
  set -- "$2" $stat
  [ "$2" != Z ] && [ "${21}" = "$1" ]
}
start_of() { # PID: its start time (/proc/PID/stat's 22nd field)
  local stat
  stat=$(cat /proc/"$1"/stat 2>/dev/null) || return 0
  stat=${stat##*) }
  set -- $stat
  echo "${20}"
}
# Of the processes "PID START" (lines), those still running after 60 s:
# mpirun may leave before a rank it killed has ended (one in the middle of a
# write ends when the write does), and 60 s more is a hang.
left_running() {
  local p start left
  for _ in $(seq 1200); do
    left=$(echo "$1" | while read -r p start; do if still_runs "$p" "$start"; then echo "$p"; fi; done)
    [ -z "$left" ] && return 0
    sleep 0.05
  done
  echo $left
}

"$bin" synth --rows 30000 --seed 3 --out clicks.tsv -q
"$bin" etl fit --input clicks.tsv --out etl --min-count 2 -q
"$bin" etl apply --etl etl --input clicks.tsv --out train.dlr --valid-fraction 0.1 --valid-out valid.dlr --seed 5 -q
# Batches of 250 (the epoch's last one short). DLRM's plan mixes row-wise
# and table-wise columns; DeepFM's splits every column row-wise. DLRM's
# rows of 128 floats and lazy Adam make its table.bin and its optimizer
# state several 8 MiB chunks, which checkpoints stream through rank 0.
cat > dlrm.json <<'EOF'
{
  "model": { "type": "dlrm", "embedding_dim": 128, "bottom_mlp": [64, 128], "top_mlp": [64, 1] },
  "optimizer": { "dense": { "type": "sgd", "lr": 0.1 }, "sparse": { "type": "lazy_adam", "lr": 0.01 } },
  "training": { "batch_size": 250, "epochs": 1, "seed": 1 },
  "log": { "interval_steps": 50 },
  "distributed": { "rowwise_share": 0.06 }
}
EOF
cat > deepfm.json <<'EOF'
{
  "model": { "type": "deepfm", "embedding_dim": 8, "mlp": [64, 32], "dropout": 0.2, "batch_norm": false,
             "embedding_init": { "type": "normal", "std": 0.01, "columns": { "C3": "xavier_uniform" } } },
  "optimizer": { "dense": { "type": "adam", "lr": 0.001 }, "sparse": { "type": "rowwise_adagrad", "lr": 0.05 } },
  "training": { "batch_size": 250, "epochs": 1, "seed": 2, "table_dtype": "bf16" },
  "log": { "interval_steps": 50 },
  "distributed": { "rowwise_share": 0 }
}
EOF
for n in 2 3 4; do
  "$bin" train --config dlrm.json --etl etl --plan --ranks $n > plan.txt
  grep -q 'row-wise' plan.txt && grep -q 'table-wise' plan.txt || fail "DLRM's plan on $n ranks is not mixed"
done
"$bin" train --config deepfm.json --train train.dlr --etl etl --out check --max-steps 1 -q > /dev/null ||
  fail "deepfm.json does not train in one process"

same_model() { # RUN_A RUN_B: their latest checkpoints' parameters, bit for bit
  local a b f
  a=$1/$(cat "$1/latest")
  b=$2/$(cat "$2/latest")
  for f in dense.bin table.bin optim.bin; do
    cmp -s "$a/$f" "$b/$f" || fail "$a/$f and $b/$f differ"
  done
}

# 1. N ranks x 1 thread == 1 process x N threads: every pair of model and
# N in the release pass; the sanitizer pass (DLREC_TEST_RELEASE_ONLY, 5 to
# 10 times slower) takes each N once, alternating the models. DeepFM trains
# the whole epoch, its last batch short; DLRM, whose rows of 128 floats
# make the slow steps, 40 (its checkpoint's chunks are as many).
pairs="dlrm:1 dlrm:2 dlrm:3 dlrm:4 deepfm:1 deepfm:2 deepfm:3 deepfm:4"
[ -n "${DLREC_TEST_RELEASE_ONLY:-}" ] && pairs="dlrm:1 deepfm:2 dlrm:3 deepfm:4"
for pair in $pairs; do
  cfg=${pair%:*} n=${pair#*:}
  steps=()
  [ "$cfg" = dlrm ] && steps=(--max-steps 40)
  "$bin" train --config $cfg.json --train train.dlr --valid valid.dlr --etl etl --out one-$cfg-$n \
    --threads $n --deterministic "${steps[@]}" -q > one.json
  mpi $n "$bin" train --config $cfg.json --train train.dlr --valid valid.dlr --etl etl --out mpi-$cfg-$n \
    --threads 1 --deterministic "${steps[@]}" -q > mpi.json
  same_model one-$cfg-$n mpi-$cfg-$n
  # The validations ran on the same model: the same AUC.
  python3 -c 'import json,sys; a,b=(json.load(open(f))["valid"]["auc"] for f in sys.argv[1:]); sys.exit(a!=b)' \
    one.json mpi.json || fail "$cfg, $n ranks: another validation AUC than one process's"
  echo "dist: $cfg, $n ranks: the same model as one process of $n threads"
done

# Batch normalization across ranks: its statistics summed over the ranks in
# rank order, as one process sums its ways: the same model, bit for bit.
# Then an epoch whose last batch has 2 rows for 4 ranks: the ranks without
# a row still meet the others' sums (with zeros), and nothing hangs.
python3 - deepfm.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["model"]["batch_norm"] = True
json.dump(c, open("deepfm-bn.json", "w"))
c["training"]["batch_size"] = 8977  # 26,933 rows: 3 batches, then 2 rows
json.dump(c, open("deepfm-bn-short.json", "w"))
PY
for n in 2 3; do
  "$bin" train --config deepfm-bn.json --train train.dlr --etl etl --out one-bn-$n --threads $n --deterministic -q \
    > /dev/null
  mpi $n "$bin" train --config deepfm-bn.json --train train.dlr --etl etl --out mpi-bn-$n --threads 1 --deterministic \
    -q > /dev/null
  same_model one-bn-$n mpi-bn-$n
done
[ "$("$bin" inspect train.dlr --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["rows"])')" = 26933 ] ||
  fail "the data is not the 26,933 rows the short-batch check is made for"
MPI_TIMEOUT=60 mpi 4 "$bin" train --config deepfm-bn-short.json --train train.dlr --etl etl --out mpi-bn-short \
  --threads 1 -q > short.json ||
  fail "batch normalization across 4 ranks with a last batch of 2 rows did not finish"
python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["steps"] != 4)' short.json ||
  fail "the short-batch run did not train its 4 steps"
echo "dist: batch normalization across 2 and 3 ranks: the same model as one process; a 2-row batch on 4 ranks"

# Loss scaling across ranks (the one step of src/train/step.c): fp16 with a
# dynamic scale that overflows, skips steps and backs off; the ranks agree
# on each step's overflow, so 2 ranks train one process's model bit for bit
# and skip the same steps. 400 full batches of 64: a last short batch would
# run whole in one process (a way needs 32 rows) and split across ranks.
cat > scaled.json <<'EOF'
{
  "model": { "type": "dlrm", "embedding_dim": 16, "bottom_mlp": [128, 64, 16], "top_mlp": [128, 64, 1] },
  "optimizer": { "dense": { "type": "sgd", "lr": 0.1 }, "sparse": { "type": "sgd", "lr": 0.1 } },
  "training": { "batch_size": 64, "epochs": 1, "max_steps": 400, "seed": 4, "precision": "fp16",
                "table_dtype": "fp16", "loss_scale": "dynamic", "loss_scale_growth_interval": 20 },
  "distributed": { "rowwise_share": 0.06 }
}
EOF
"$bin" train --config scaled.json --train train.dlr --etl etl --out one-scaled --threads 2 --deterministic -q \
  > one.json
mpi 2 "$bin" train --config scaled.json --train train.dlr --etl etl --out mpi-scaled --threads 1 --deterministic -q \
  > mpi.json
same_model one-scaled mpi-scaled
python3 -c 'import json,sys; a,b=(json.load(open(f))["skipped_steps"] for f in sys.argv[1:]); sys.exit(not (a == b and a > 0))' \
  one.json mpi.json || fail "loss scaling across 2 ranks: no skipped step, or other steps skipped than one process's"
echo "dist: fp16 loss scaling across 2 ranks: the same model and skipped steps as one process of 2 threads"

# Data without a categorical column (logistic regression on dense
# features): no shard holds a row, and the checkpoint's one-row table is
# one process's.
python3 - > dense.csv <<'PY'
import random
random.seed(1)
print("click,a,b,c")
for i in range(5000):
    a, b, c = random.random(), random.random(), random.random()
    print("%d,%.4f,%.4f,%.4f" % (random.random() < 0.2 + 0.5 * a * b, a, b, c))
PY
"$bin" etl fit --format csv --schema 'label=click;dense=*' --input dense.csv --out etl-dense -q
"$bin" etl apply --etl etl-dense --input dense.csv --out dense.dlr -q
echo '{"model": {"type": "lr"}, "optimizer": {"dense": {"type": "adam", "lr": 0.01}},
  "training": {"batch_size": 100, "epochs": 1, "seed": 1}}' > lr.json
"$bin" train --config lr.json --train dense.dlr --etl etl-dense --out one-dense --threads 2 --deterministic -q > /dev/null
mpi 2 "$bin" train --config lr.json --train dense.dlr --etl etl-dense --out mpi-dense --threads 1 --deterministic -q \
  > /dev/null
same_model one-dense mpi-dense
echo "dist: dense features only, 2 ranks: the same model as one process of 2 threads"

# Validations across ranks: every rank scores its part of each validation
# batch and rank 0 computes the metrics over all rows (several batches, a
# row limit), and decides best, plateau and early stop for every rank.
python3 - deepfm.json > deepfm-valid.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["eval"] = {"interval_steps": 15, "batch_size": 700, "max_rows": 2500}
c["checkpoint"] = {"keep_best": True}
c["schedule"] = {"plateau_factor": 0.5, "plateau_patience": 1}
c["training"].update(restore_best=True, early_stopping_patience=3, epochs=2)
print(json.dumps(c))
PY
valid_lines() { python3 -c 'import json,sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    if "valid" in j: print(json.dumps(j, sort_keys=True))' "$1/metrics.jsonl"; }
"$bin" train --config deepfm-valid.json --train train.dlr --valid valid.dlr --etl etl --out one-v --threads 3 \
  --deterministic -q > one.json
mpi 3 "$bin" train --config deepfm-valid.json --train train.dlr --valid valid.dlr --etl etl --out mpi-v --threads 1 \
  --deterministic -q > mpi.json
same_model one-v mpi-v
[ "$(valid_lines one-v)" = "$(valid_lines mpi-v)" ] || fail "validations across 3 ranks differ from one process's"
[ "$(cat one-v/best)" = "$(cat mpi-v/best)" ] || fail "RUN/best differs across 3 ranks"
n=$(valid_lines mpi-v | wc -l)
[ "$n" -ge 3 ] || fail "only $n validations"
echo "dist: $n validations on 3 ranks (best, plateau, early stopping): the same as one process's"

# 2. Written by 4 ranks, resumed by 2 for 20 steps, scored by one process:
# the rows and the optimizers' state (Adagrad's, Adam's) and the bf16
# rounding's count move between rank counts.
for cfg in deepfm dlrm; do
  "$bin" train --config $cfg.json --train train.dlr --etl etl --out one-r-$cfg --threads 4 --deterministic \
    --max-steps 50 -q >/dev/null
  "$bin" train --config $cfg.json --train train.dlr --etl etl --out one-r-$cfg --threads 2 --deterministic \
    --resume --max-steps 70 -q >/dev/null
  mpi 4 "$bin" train --config $cfg.json --train train.dlr --etl etl --out mpi-r-$cfg --threads 1 --deterministic \
    --max-steps 50 -q >/dev/null
  mpi 2 "$bin" train --config $cfg.json --train train.dlr --etl etl --out mpi-r-$cfg --threads 1 --deterministic \
    --resume --max-steps 70 -q >/dev/null
  same_model one-r-$cfg mpi-r-$cfg
  "$bin" predict --model one-r-$cfg --input valid.dlr --out one-scores.txt -q
  "$bin" predict --model mpi-r-$cfg --input valid.dlr --out mpi-scores.txt -q
  cmp -s one-scores.txt mpi-scores.txt || fail "$cfg: predict scores differ between the 4->2-rank run and one process's"
  echo "dist: $cfg written by 4 ranks, resumed by 2, scored by one process: the same as one process"
done

# 3. A rank killed mid-step.
python3 - dlrm.json > long.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["training"]["epochs"] = 50
c["checkpoint"] = {"interval_steps": 20, "keep": 2}
print(json.dumps(c))
PY
# What is asserted is that mpirun ends the job by itself, every rank of it,
# not how fast (a loaded machine can take long to reap a rank writing a
# checkpoint): its --timeout, 300 s, is only the backstop against a hang,
# and its own message tells which of the two ended the job.
mpi 2 "$bin" train --config long.json --train train.dlr --etl etl --out killed --threads 1 -q > /dev/null 2> killed.err &
job=$!
for _ in $(seq 1200); do [ -e killed/latest ] && break; sleep 0.05; done
[ -e killed/latest ] || fail "no checkpoint before the kill"
pids=$(ranks_of "$job" | awk '{ print $1 }')
victim=$(rank_pid "$job" 1)
[ "$(echo $pids | wc -w)" = 2 ] && [ -n "$victim" ] || fail "not the 2 ranks of the job: $(ranks_of "$job")"
starts=$(for p in $pids; do echo "$p $(start_of "$p")"; done)
t0=$(date +%s.%N)
kill -9 "$victim"
set +e
wait "$job"
rc=$?
set -e
t1=$(date +%s.%N)
[ "$rc" -ne 0 ] || fail "mpirun exited 0 after a rank was killed"
grep -q 'time limit for job execution has been reached' killed.err &&
  fail "the killed job hung until mpirun's --timeout"
grep -q 'signal 9' killed.err || { cat killed.err >&2; fail "mpirun did not report the killed rank"; }
left=$(left_running "$starts")
[ -z "$left" ] || fail "ranks of the job still running 60 s after it ended: $left"
python3 -c "print('dist: a rank killed: mpirun ended the job in %.1f s' % ($t1 - $t0))"
"$bin" eval --model killed --data valid.dlr > /dev/null || fail "the checkpoint left by the killed job does not load"
step=$(cat killed/latest)
step=$((10#${step#ckpt-} + 20))
mpi 3 "$bin" train --config long.json --train train.dlr --etl etl --out killed --threads 1 --resume --max-steps $step \
  -q > resumed.json || fail "3 ranks cannot resume the killed job"
python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["steps"] != int(sys.argv[2]))' resumed.json $step ||
  fail "the resumed job did not run to step $step"
echo "dist: the killed job resumed on 3 ranks, to step $step"

# 4. SIGTERM to one rank: every rank stops at the same step (the stop is
# agreed on), rank 0 saves a checkpoint, and the job resumes.
mpi 2 "$bin" train --config long.json --train train.dlr --etl etl --out stopped --threads 1 -q > stopped.json 2> stopped.err &
job=$!
for _ in $(seq 1200); do [ -e stopped/latest ] && break; sleep 0.05; done
[ -e stopped/latest ] || fail "no checkpoint before the signal"
victim=$(rank_pid "$job" 1)
[ -n "$victim" ] || fail "no rank 1 to signal: $(ranks_of "$job")"
kill -TERM "$victim"
# A rank that stopped alone would leave the other waiting until the
# ranks' timeout (distributed.timeout_s, 1800 s): 120 s is a hang.
for _ in $(seq 2400); do kill -0 "$job" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$job" 2>/dev/null; then
  pkill -9 -P "$job" # mpirun, the background shell's child, and with it the ranks
  kill -9 "$job"
  fail "SIGTERM to one rank did not stop the job within 120 s"
fi
set +e
wait "$job"
set -e
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(not j.get("interrupted"))' stopped.json ||
  fail "rank 0 did not report an interrupted run"
step=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["steps"])' stopped.json)
[ "$(cat stopped/latest)" = "$(printf 'ckpt-%012d' "$step")" ] || fail "no checkpoint at the stopped step $step"
mpi 2 "$bin" train --config long.json --train train.dlr --etl etl --out stopped --threads 1 --resume \
  --max-steps $((step + 20)) -q > /dev/null || fail "the stopped job does not resume"
echo "dist: SIGTERM to one rank stopped both at step $step with a checkpoint; resumed"

# 5. A config that cannot run across ranks.
sed 's/"training":/"storage": { "kind": "tiered", "cache_rows": 1000 }, "training":/' dlrm.json > tiered.json
set +e
mpi 2 "$bin" train --config tiered.json --train train.dlr --etl etl --out tiered -q > /dev/null 2> tiered.err
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "a tiered table trained across ranks"
grep -q 'storage.kind "tiered" trains in one process only' tiered.err || { cat tiered.err >&2; fail "no clear error for a tiered table across ranks"; }
echo "dist: a tiered table across ranks: $(grep -m1 'tiered' tiered.err)"

# 6. Ranks started differently: through a wrapper, rank 1's argument FROM
# becomes TO. Every rank refuses at the start, before any exchange, with
# the same error naming what differs (before, another learning rate
# trained silently, and another --resume could hang the job).
cat > as_rank1.sh <<'SH'
#!/usr/bin/env bash
args=()
for a in "$@"; do
  if [ "${OMPI_COMM_WORLD_RANK:-}" = 1 ] && [ "$a" = "$FROM" ]; then args+=("$TO"); else args+=("$a"); fi
done
exec "${args[@]}"
SH
chmod +x as_rank1.sh
sed 's/"lr": 0.001/"lr": 0.002/' deepfm.json > deepfm-lr.json
unlike() { # FROM TO WHAT: the job refused on both ranks with an error naming WHAT
  set +e
  FROM=$1 TO=$2 MPI_TIMEOUT=60 mpi 2 ./as_rank1.sh "$bin" train --config deepfm.json --train train.dlr --etl etl \
    --out unlike --threads 1 -q > /dev/null 2> unlike.err
  local rc=$?
  set -e
  [ "$rc" -ne 0 ] || fail "ranks started with $1 and $2 trained"
  [ "$(grep -c "the ranks were started differently: $3" unlike.err)" = 2 ] ||
    { cat unlike.err >&2; fail "ranks started with $1 and $2: not both refused naming $3"; }
  echo "dist: ranks started with $1 and $2: $(grep -m1 -o 'started differently: .* on rank 0' unlike.err)"
}
unlike deepfm.json deepfm-lr.json 'optimizer.dense.lr is 0.002 on rank 1 but 0.001 on rank 0'
unlike train.dlr valid.dlr '--train (file 1) is valid.dlr (content [0-9a-f]*) on rank 1 but train.dlr'
unlike -q --resume '--resume is yes on rank 1 but no on rank 0'

# 7. SIGSTOP to rank 2 of 3 mid-training: ranks 0 and 1 wait in an
# exchange for distributed.timeout_s (3 s here), and rank 0 names rank 2
# alone (rank 1, waiting too, told it so) and ends the job, which mpirun
# would otherwise leave hanging until its --timeout (60 s here).
python3 - deepfm.json > stall.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["training"]["epochs"] = 50
c["log"]["interval_steps"] = 5
c["distributed"]["timeout_s"] = 3
print(json.dumps(c))
PY
MPI_TIMEOUT=60 mpi 3 "$bin" train --config stall.json --train train.dlr --etl etl --out stall --threads 1 -q \
  > /dev/null 2> stall.err &
job=$!
for _ in $(seq 1200); do [ -s stall/metrics.jsonl ] && break; sleep 0.05; done
[ -s stall/metrics.jsonl ] || fail "no step before the stop"
victim=$(rank_pid "$job" 2)
[ -n "$victim" ] || fail "no rank 2 to stop: $(ranks_of "$job")"
start=$(start_of "$victim")
kill -STOP "$victim"
set +e
wait "$job"
rc=$?
set -e
left=$(left_running "$victim $start")
[ -z "$left" ] || { kill -KILL "$victim"; fail "the stopped rank outlived its job by 60 s"; }
[ "$rc" -ne 0 ] || fail "mpirun exited 0 with a rank stopped"
grep -q 'time limit for job execution has been reached' stall.err &&
  fail "the stalled job hung until mpirun's --timeout"
grep -q "rank 0: .* past the ranks' timeout of 3 s (distributed.timeout_s): rank 2 never reached it" stall.err ||
  { cat stall.err >&2; fail "rank 0 did not name the stopped rank 2 alone"; }
echo "dist: SIGSTOP to rank 2 of 3: $(grep -m1 -o 'rank 0: .*never reached it' stall.err)"
