#!/usr/bin/env bash
# Byte-identity check of the working tree against a base commit, for changes
# that must not change behaviour (a refactor, a redesign of the internals).
#
# It builds the base commit (default ead59da) and the working tree as it is,
# uncommitted changes included, trains the same fixed deterministic configs
# with both binaries in separate run directories, and compares the two sides
# byte for byte: every file of every checkpoint, metrics.jsonl and the
# training summary with their timings masked, `dlrec eval`, `dlrec predict`
# on a .dlr file and on raw TSV rows, the served scores of `dlrec serve`
# (KServe v2 JSON, and the binary tensor extension) and the ONNX export.
# One line per comparison says `same` or `DIFFERS: ...` (cmp's first
# differing file and byte); the exit status is 0 when every comparison is
# the same, 1 when one differs, 2 on a usage, build or setup error (also
# when the BASE binary fails a run: the configs are then wrong, not the
# change).
#
# What it runs (data made once by the base binary: `dlrec synth`, an ETL
# with vocabularies and one with --raw-keys, both applied with a 10%
# validation split), every run with --deterministic and a fixed thread count:
#   dlrm        examples/dlrm_criteo.json, the Kaggle shape (13 dense, 26
#               categorical; MLPs 512-256-64-16 and 512-256-1), fp32 SGD,
#               500 steps, 2 threads, validations and checkpoints every 125
#               steps; served, exported to ONNX
#   dlrm-resume the same, stopped at step 250 and resumed to 500
#   dlrm-1t     examples/dlrm_synth.json's Adam + lazy Adam on 1 thread
#   deepfm      dropout 0.2 and batch norm, Adam + lazy Adam with L2 on the
#               rows, gradient clipping, 2 epochs validated each, lr plateau,
#               RUN/best kept and restored (predict --checkpoint best too)
#   dcn-moe     examples/dcn_v2_stacked_moe.json (a mixture of 4 low-rank
#               experts, batch norm, dropout)
#   bf16        DCN-v2 parallel, training.precision "bf16" and a bf16 table
#               (stochastic rounding). On a CPU without AVX512-BF16 or AMX the
#               bf16 GEMMs are emulated (operands rounded to bf16 in fp32,
#               fp32 GEMMs: docs/config.md), deterministic either way; both
#               binaries run on this machine, so they take the same path
#   fp16-scaled DLRM in "fp16" (emulated on a CPU) with dynamic loss scaling
#               that overflows, skips steps and backs off, an fp16 table,
#               clipping, warmup and polynomial decay
#   wd-scale    Wide & Deep in fp32 with a fixed loss scale of 1024 (allowed
#               in fp32: a power of two, exact) and clipping
#   fm, lr      the two small model types
#   tiered      storage.kind "tiered" with a cache of a fraction of the
#               table: full and journaled checkpoints (journal.bin,
#               journal_optim.bin, hard links to the base's files)
#   tiered-resume  the same stopped mid-run and resumed
#   hash        storage.kind "hash" on the --raw-keys data, fewer rows than
#               keys (admission at the second sighting, LFU eviction,
#               expiry): hash.bin in every checkpoint
#   hash-resume the same stopped mid-run and resumed
#   mpi2        `mpirun -np 2` DeepFM (dropout, batch norm, bf16 table), one
#               thread a rank: the sharded step (src/dist/sharded.c) has its
#               own embedding stage and dense update, which no run in one
#               process reaches (skipped, saying so, where there is no
#               mpirun or the binaries lack MPI)
#
# What is compared, per run, and what is left out:
#   - every file under RUN/: each checkpoint directory whole (manifest.json,
#     config.json, etl/, dense.bin, table.bin, optim.bin, hash.bin,
#     journal*.bin), `latest`, `best`; the lists of files must match too.
#     A checkpoint carries no timestamp or path (docs/formats.md: the
#     manifest holds steps, positions, loss sums, the validation rules'
#     state, tensor names and the files' sizes and CRC32Cs; config.json has
#     storage.path "" unless set, and these configs leave it unset), so no
#     checkpoint file is left out. Left out of RUN/: `lock` (the trainer's
#     pid), `report.html` (rendered from the timings: throughput, where the
#     step's time went) and the tiered table's scratch file (removed when
#     the run ends; the checkpoints hold its rows).
#   - RUN/metrics.jsonl, RUN/summary.json and the summary `dlrec train`
#     prints: byte for byte after masking the values of the timing keys,
#     `samples_per_s`, `seconds`, every key ending in `_seconds` and
#     `profile` (the whole object: seconds and rates per phase) with
#     "<timing>"; every other byte, whitespace, key order and the text of
#     every number included, must match. `backend`, `precision` and
#     `bf16_native` describe the machine, which both sides share, so they
#     are compared.
#   - `dlrec eval` (JSON) and `dlrec predict` on valid.dlr and on raw TSV
#     rows, each side's binary on its own run, 2 threads.
#   - dlrm served: `dlrec serve` of each side on a free loopback port, the
#     same KServe v2 request of 16 raw rows posted to each; the response
#     bodies compared whole (their `outputs` are the scores' JSON text),
#     then once more with binary output (the scores' float bytes).
#
# Both builds are release CMake builds of the `dlrec` target only, with
# -DDLREC_CUDA=OFF: the CPU code path is what is compared, and nvcc would
# double the build time. The base is exported with `git archive` (no
# worktree, no branch, nothing in the repository changes) into
# WORK/base-COMMIT/src, removed at the end unless --keep; its build
# directory WORK/base-COMMIT/build and the working tree's WORK/build-new
# stay, and later runs build them incrementally (an archive's files carry
# the commit's time, so an unchanged base is not rebuilt). The data and the
# runs (WORK/data, WORK/runs) are removed when everything is the same,
# unless --keep, and kept when something differs, so that the paths the
# DIFFERS lines name can be looked at.
#
# usage: scripts/bitcheck.sh [--base COMMIT] [--work DIR] [-j N] [--keep]
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/bitcheck.sh [--base COMMIT] [--work DIR] [-j N] [--keep]

Builds COMMIT and the working tree (uncommitted changes included), trains
fixed deterministic configs with both binaries, and compares checkpoints,
metrics.jsonl (timings masked), eval, predict and served scores byte for
byte. One line per comparison: `same` or `DIFFERS: ...`.

  --base COMMIT  the reference commit (default ead59da)
  --work DIR     builds, data and runs (default build-bitcheck/ under the
                 repository root, which .gitignore ignores)
  -j N           build jobs (default 2)
  --keep         keep the base's source tree, the data and the runs
  -h, --help     this text

Exit status: 0 all the same, 1 something differs, 2 usage or build error.
The script's header says what runs, what is compared and what is left out.
EOF
}

die() { echo "bitcheck: $*" >&2; exit 2; }

base=ead59da
work=
jobs=2
keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --base) [ $# -ge 2 ] || die "--base needs a commit"; base=$2; shift 2 ;;
    --base=*) base=${1#*=}; shift ;;
    --work) [ $# -ge 2 ] || die "--work needs a directory"; work=$2; shift 2 ;;
    --work=*) work=${1#*=}; shift ;;
    -j) [ $# -ge 2 ] || die "-j needs a number"; jobs=$2; shift 2 ;;
    -j[0-9]*) jobs=${1#-j}; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; echo >&2; die "unknown argument '$1'" ;;
  esac
done
case $jobs in ''|*[!0-9]*|0) die "-j: '$jobs' is not a positive number" ;; esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
for tool in git cmake python3 tar cmp; do
  command -v "$tool" > /dev/null || die "$tool not found"
done
sha=$(git -C "$root" rev-parse --verify --quiet "$base^{commit}") ||
  die "--base: '$base' is not a commit of $root"
short=${sha:0:12}
work=${work:-$root/build-bitcheck}
mkdir -p "$work"
work=$(cd "$work" && pwd)
base_dir=$work/base-$short
new_build=$work/build-new
data=$work/data
runs=$work/runs
logs=$work/logs
export DLREC_PROGRESS=0

# --- bookkeeping ---------------------------------------------------------
t_start=$(date +%s.%N)
t_phase=$t_start
phases=()
phase_done() { # NAME: the time since the previous phase ended
  local now
  now=$(date +%s.%N)
  phases+=("$(awk -v a="$t_phase" -v b="$now" -v n="$1" 'BEGIN { printf "%-22s %7.1f s", n, b - a }')")
  t_phase=$now
}
n_same=0
n_diff=0
n_skip=0
report() { # CONFIG WHAT RESULT
  printf '%-14s %-44s %s\n' "$1" "$2" "$3"
  case $3 in
    same*) n_same=$((n_same + 1)) ;;
    DIFFERS*) n_diff=$((n_diff + 1)) ;;
    *) n_skip=$((n_skip + 1)) ;;
  esac
}
rel() { echo "${1#"$work"/}"; }

servers=()
cleanup() {
  local p
  for p in ${servers[@]+"${servers[@]}"}; do kill "$p" 2> /dev/null || true; done
  for p in ${servers[@]+"${servers[@]}"}; do wait "$p" 2> /dev/null || true; done
  if [ "$keep" = 0 ]; then
    rm -rf "$base_dir/src"
  fi
}
trap cleanup EXIT
trap 'exit 2' INT TERM

# --- 1. builds -------------------------------------------------------------
build() { # SRC BUILD LOG
  local src=$1 dir=$2 log=$3
  mkdir -p "$logs"
  if ! { nice cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DDLREC_CUDA=OFF &&
         nice cmake --build "$dir" -j "$jobs" --target dlrec; } > "$log" 2>&1; then
    tail -30 "$log" >&2
    die "the build of $src failed (log: $log)"
  fi
  [ -x "$dir/dlrec" ] || die "the build of $src made no $dir/dlrec"
}

echo "bitcheck: base $short vs the working tree of $root (HEAD $(git -C "$root" rev-parse --short=12 HEAD)," \
  "$(git -C "$root" status --porcelain | wc -l | tr -d ' ') paths in git status)"
echo "bitcheck: work directory $work"
rm -rf "$base_dir/src"
mkdir -p "$base_dir/src"
git -C "$root" archive --format=tar "$sha" | tar -x -C "$base_dir/src" ||
  die "git archive of $sha failed"
echo "bitcheck: building the base ($base_dir/build) ..."
build "$base_dir/src" "$base_dir/build" "$logs/build-base.log"
phase_done "build base"
echo "bitcheck: building the working tree ($new_build) ..."
# A build directory made for another tree (--work shared between clones)
# would make CMake refuse: start it afresh.
if [ -f "$new_build/CMakeCache.txt" ] &&
   ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$root" "$new_build/CMakeCache.txt"; then
  echo "bitcheck: $new_build was built from another tree; building it afresh"
  rm -rf "$new_build"
fi
build "$root" "$new_build" "$logs/build-new.log"
phase_done "build working tree"
bin_base=$base_dir/build/dlrec
bin_new=$new_build/dlrec

# --- 2. data, once, by the base binary -------------------------------------
echo "bitcheck: data and runs ..."
rm -rf "$data" "$runs"
mkdir -p "$data" "$runs/base" "$runs/new" "$runs/cmp"
(
  cd "$data"
  B=$bin_base
  # 100k rows: 90k to train (704 steps of 128), 10k to validate. The cap on
  # the categories keeps the table (about 72k rows) small enough that the
  # tiered and hash runs below evict.
  "$B" synth --rows 100000 --seed 11 --max-cardinality 20000 --threads 2 --out clicks.tsv -q
  "$B" etl fit --input clicks.tsv --out etl --min-count 2 --threads 2 -q
  "$B" etl apply --etl etl --input clicks.tsv --out train.dlr --valid-fraction 0.1 --valid-out valid.dlr \
    --seed 5 --threads 2 -q
  "$B" etl fit --input clicks.tsv --out etl-raw --raw-keys --threads 2 -q
  "$B" etl apply --etl etl-raw --input clicks.tsv --out train-raw.dlr --valid-fraction 0.1 \
    --valid-out valid-raw.dlr --seed 5 --threads 2 -q
  # Raw rows for predict (labelled), and unlabelled ones for the server.
  head -3000 clicks.tsv > rows.tsv
  head -16 clicks.tsv | cut -f2- > rows-nolabel.tsv
) > "$logs/data.log" 2>&1 || { tail -20 "$logs/data.log" >&2; die "making the data with the base binary failed"; }
phase_done "data (base binary)"

# The configs: the base's examples, shrunk where the time asks, each with
# checkpoints along the way (all kept) so that drift shows at every one.
python3 - "$base_dir/src/examples" "$data" <<'PY' || die "writing the configs failed"
import json, os, sys
ex, out = sys.argv[1], sys.argv[2]
def load(name):
    with open(os.path.join(ex, name)) as f:
        return json.load(f)
def save(name, c):
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(c, f, indent=1)

c = load("dlrm_criteo.json")                         # the Kaggle shape, SGD
c["training"].update(max_steps=500, seed=1)
c["eval"] = {"interval_steps": 125, "batch_size": 4096, "train_rows": 4096}
c["checkpoint"] = {"interval_steps": 125, "keep": 100}
c["log"] = {"interval_steps": 25}
save("dlrm", c)

c = load("dlrm_synth.json")                          # Adam + lazy Adam
c["model"].update(bottom_mlp=[128, 64, 16], top_mlp=[128, 64, 1])
c["training"].update(batch_size=256, epochs=1, seed=3)
c["eval"] = {"interval_steps": 100, "train_rows": 4096}
c["checkpoint"] = {"interval_steps": 100, "keep": 100}
c["log"] = {"interval_steps": 25}
save("dlrm-1t", c)

c = load("fuxictr_deepfm.json")                      # dropout, batch norm, clipping, plateau, best
c["model"].update(embedding_dim=8, mlp=[128, 64])
c["optimizer"]["dense"]["lr"] = 0.003
c["optimizer"]["sparse"]["lr"] = 0.01
c["training"].update(batch_size=512, epochs=2, seed=7, early_stopping_patience=3)
c["schedule"] = {"plateau_factor": 0.5, "plateau_patience": 0}
c["eval"].update(train_rows=4096)
c["checkpoint"] = {"keep_best": True, "keep": 100, "interval_steps": 60}
c["log"] = {"interval_steps": 20}
save("deepfm", c)

c = load("dcn_v2_stacked_moe.json")                  # mixture of low-rank experts
c["training"].update(max_steps=300, seed=5)
c["eval"] = {"interval_steps": 100, "train_rows": 4096}
c["checkpoint"] = {"interval_steps": 100, "keep": 100}
c["log"] = {"interval_steps": 25}
save("dcn-moe", c)

c = load("dcn_v2.json")                              # bf16 GEMMs, bf16 table
c["model"].update(mlp=[128, 64], low_rank=16)
c["training"].update(batch_size=256, max_steps=300, seed=9, precision="bf16", table_dtype="bf16")
c["eval"] = {"interval_steps": 100, "train_rows": 4096}
c["checkpoint"] = {"interval_steps": 100, "keep": 100}
c["log"] = {"interval_steps": 25}
save("bf16", c)

c = load("dlrm_synth.json")                          # fp16, dynamic loss scale, clipping, schedule
c["model"].update(bottom_mlp=[128, 64, 16], top_mlp=[128, 64, 1])
c["optimizer"]["clip_grad_norm"] = 5
c["schedule"] = {"warmup_steps": 50, "decay_start_step": 200, "decay_steps": 150, "min_lr_scale": 0.1}
# Batches of 64 and a scale doubling every 20 steps: it reaches the scales
# at which the loss gradient overflows fp16, so steps are skipped and the
# scale backs off (about 10 times in 400 steps).
c["training"].update(batch_size=64, max_steps=400, seed=4, precision="fp16", table_dtype="fp16",
                     loss_scale="dynamic", loss_scale_growth_interval=20)
c["eval"] = {"interval_steps": 100, "train_rows": 4096}
c["checkpoint"] = {"interval_steps": 100, "keep": 100}
c["log"] = {"interval_steps": 25}
save("fp16-scaled", c)

c = load("wide_deep.json")                           # fp32 with a fixed loss scale, clipping
c["model"].update(mlp=[128, 64])
c["optimizer"]["clip_grad_norm"] = 1
c["training"].update(batch_size=256, max_steps=300, seed=6, loss_scale=1024)
c["eval"] = {"interval_steps": 100, "train_rows": 4096}
c["checkpoint"] = {"interval_steps": 100, "keep": 100}
c["log"] = {"interval_steps": 25}
save("wd-scale", c)

for name in ("fm", "lr"):
    c = load(name + ".json")
    c["training"].update(batch_size=256, max_steps=300, seed=8)
    c["eval"] = {"interval_steps": 150, "train_rows": 4096}
    c["checkpoint"] = {"interval_steps": 150, "keep": 100}
    c["log"] = {"interval_steps": 25}
    save(name, c)

tiny = {"type": "dlrm", "embedding_dim": 16, "bottom_mlp": [64, 16], "top_mlp": [64, 1]}
c = {"name": "tiered", "model": tiny,                # a cache of a ninth of the table
     "optimizer": {"dense": {"type": "sgd", "lr": 0.1}, "sparse": {"type": "rowwise_adagrad", "lr": 0.05}},
     "training": {"batch_size": 128, "max_steps": 400, "seed": 2},
     "storage": {"kind": "tiered", "cache_rows": 8000},
     # A validation batch resolves through the cache too: 256 x 26 ids at most.
     "eval": {"interval_steps": 100, "train_rows": 4096, "batch_size": 256},
     "checkpoint": {"interval_steps": 50, "keep": 100, "journal_max_fraction": 0.5},
     "log": {"interval_steps": 25}}
save("tiered", c)

c = {"name": "hash", "model": dict(tiny, type="dlrm"),   # fewer rows than keys
     "optimizer": {"dense": {"type": "adam", "lr": 0.002}, "sparse": {"type": "lazy_adam", "lr": 0.005}},
     "training": {"batch_size": 128, "max_steps": 400, "seed": 2},
     "storage": {"kind": "hash", "cache_rows": 12000, "admit_min_count": 2, "evict": "lfu", "ttl_steps": 150},
     "eval": {"interval_steps": 100, "train_rows": 4096},
     "checkpoint": {"interval_steps": 50, "keep": 100, "journal_max_fraction": 0.5},
     "log": {"interval_steps": 25}}
save("hash", c)

c = load("deepfm.json")                              # across 2 ranks
c["model"].update(embedding_dim=8, mlp=[64, 32], dropout=0.2, batch_norm=True)
c["training"].update(batch_size=250, max_steps=300, seed=2, table_dtype="bf16")
c["eval"] = {"interval_steps": 100, "train_rows": 4096}
c["checkpoint"] = {"interval_steps": 100, "keep": 100}
c["log"] = {"interval_steps": 25}
c["distributed"] = {"rowwise_share": 0.1}
save("mpi2", c)
PY

# The timing mask: JSON text (one document, or one a line) with the value of
# every timing key replaced by "<timing>", every other byte kept.
cat > "$runs/mask.py" <<'PY'
import re, sys
WS = re.compile(r'[ \t\r\n]*')
STR = re.compile(r'"(?:[^"\\]|\\.)*"')
SCALAR = re.compile(r'-?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|[A-Za-z]+)|[A-Za-z]+')
def timing(key):
    return key in ("samples_per_s", "seconds", "profile") or key.endswith("_seconds")
def ws(s, i, out):
    j = WS.match(s, i).end()
    out.append(s[i:j])
    return j
def value(s, i, out):
    c = s[i:i + 1]
    if c in ("{", "["):
        close = "}" if c == "{" else "]"
        out.append(c)
        i = ws(s, i + 1, out)
        if s[i:i + 1] == close:
            out.append(close)
            return i + 1
        while True:
            if c == "{":
                m = STR.match(s, i)
                if not m:
                    raise ValueError("no key at offset %d" % i)
                out.append(m.group())
                i = ws(s, m.end(), out)
                if s[i:i + 1] != ":":
                    raise ValueError("no ':' at offset %d" % i)
                out.append(":")
                i = ws(s, i + 1, out)
                if timing(m.group()[1:-1]):
                    i = value(s, i, [])
                    out.append('"<timing>"')
                else:
                    i = value(s, i, out)
            else:
                i = value(s, i, out)
            i = ws(s, i, out)
            if s[i:i + 1] == ",":
                out.append(",")
                i = ws(s, i + 1, out)
            elif s[i:i + 1] == close:
                out.append(close)
                return i + 1
            else:
                raise ValueError("unexpected text at offset %d" % i)
    m = STR.match(s, i) or SCALAR.match(s, i)
    if not m or m.end() == i:
        raise ValueError("not JSON at offset %d" % i)
    out.append(m.group())
    return m.end()
src, dst = sys.argv[1], sys.argv[2]
with open(src, encoding="utf-8", errors="surrogateescape") as f:
    s = f.read()
out = []
try:
    i = ws(s, 0, out)
    while i < len(s):
        i = value(s, i, out)
        i = ws(s, i, out)
    text = "".join(out)
except (ValueError, RecursionError) as e:
    text = "bitcheck: not JSON (%s); the text unmasked:\n%s" % (e, s)
with open(dst, "w", encoding="utf-8", errors="surrogateescape") as f:
    f.write(text)
PY

# --- 3. running both sides ------------------------------------------------
# both NAME FN ARGS...: FN SIDE BIN ARGS... runs once per side, from that
# side's runs directory, its output in NAME.out and NAME.err there. The base
# failing is a setup error (exit 2); the working tree failing where the base
# did not is a difference. Returns 1 when a side failed.
both() {
  local name=$1 fn=$2 rc_base rc_new
  shift 2
  set +e
  (cd "$runs/base" && "$fn" base "$bin_base" "$@") > "$runs/base/$name.out" 2> "$runs/base/$name.err"
  rc_base=$?
  (cd "$runs/new" && "$fn" new "$bin_new" "$@") > "$runs/new/$name.out" 2> "$runs/new/$name.err"
  rc_new=$?
  set -e
  if [ "$rc_base" != 0 ]; then
    tail -15 "$runs/base/$name.err" >&2
    die "$name: the base binary failed (exit $rc_base; $(rel "$runs/base/$name.err")): the check itself is broken"
  fi
  if [ "$rc_new" != 0 ]; then
    report "${name%%.*}" "${name#*.}" \
      "DIFFERS: the working tree's binary failed (exit $rc_new; $(rel "$runs/new/$name.err")): $(tail -1 "$runs/new/$name.err")"
    return 1
  fi
}

cmp_file() { # CONFIG WHAT PATH (relative to runs/base and runs/new)
  local msg
  if msg=$(cmp "$runs/base/$3" "$runs/new/$3" 2>&1); then
    report "$1" "$2" same
  else
    report "$1" "$2" "DIFFERS: ${msg//$work\//}"
  fi
}

cmp_masked() { # CONFIG WHAT PATH: JSON compared with its timings masked
  local b=$runs/cmp/base/$3 n=$runs/cmp/new/$3 msg
  if [ ! -f "$runs/base/$3" ] || [ ! -f "$runs/new/$3" ]; then
    report "$1" "$2" "DIFFERS: $3 is missing on the $([ -f "$runs/base/$3" ] && echo new || echo base) side"
    return
  fi
  mkdir -p "$(dirname "$b")" "$(dirname "$n")"
  python3 "$runs/mask.py" "$runs/base/$3" "$b" || die "masking $runs/base/$3 failed"
  python3 "$runs/mask.py" "$runs/new/$3" "$n" || die "masking $runs/new/$3 failed"
  if msg=$(cmp "$b" "$n" 2>&1); then
    report "$1" "$2" same
  else
    report "$1" "$2" "DIFFERS (timings masked): ${msg//$work\//}"
  fi
}

# Every file of RUN on both sides: the lists, then the checkpoints' files,
# then metrics.jsonl and summary.json with their timings masked.
cmp_run() { # CONFIG RUN
  local cfg=$1 run=$2 lb ln only f msg first= n=0 ckpts
  list() { (cd "$1" && find . \( -type f -o -type l \) ! -name lock ! -name report.html ! -name '*.tiered' |
    sed 's|^\./||' | LC_ALL=C sort); }
  lb=$(list "$runs/base/$run")
  ln=$(list "$runs/new/$run")
  if [ "$lb" != "$ln" ]; then
    only=$(diff <(echo "$lb") <(echo "$ln") | grep '^[<>]' | head -3 | sed 's/^</base only:/; s/^>/new only:/' |
      paste -sd ';' -)
    report "$cfg" "files of RUN/" "DIFFERS: $only"
  fi
  ckpts=$(echo "$lb" | grep -c '^ckpt-[0-9]*/manifest.json$' || true)
  while IFS= read -r f; do
    case $f in metrics.jsonl|summary.json|'') continue ;; esac
    [ -e "$runs/new/$run/$f" ] || continue
    n=$((n + 1))
    if [ -z "$first" ] && ! msg=$(cmp "$runs/base/$run/$f" "$runs/new/$run/$f" 2>&1); then
      first=${msg//$work\//}
    fi
  done <<< "$lb"
  if [ -z "$first" ]; then
    report "$cfg" "RUN/: $ckpts checkpoints, $n files" same
  else
    report "$cfg" "RUN/: $ckpts checkpoints, $n files" "DIFFERS: $first"
  fi
  cmp_masked "$cfg" "metrics.jsonl" "$run/metrics.jsonl"
  cmp_masked "$cfg" "summary.json" "$run/summary.json"
}

train_fn() { # SIDE BIN RUN CFG TRAIN VALID ETL THREADS [ARGS...]
  local bin=$2 run=$3 cfg=$4 tr=$5 va=$6 etl=$7 th=$8
  shift 8
  "$bin" train --config "$data/$cfg.json" --train "$data/$tr" --valid "$data/$va" --etl "$data/$etl" \
    --out "$run" --threads "$th" --deterministic -q "$@"
}
mpi_fn() { # SIDE BIN RUN CFG TRAIN VALID ETL
  local bin=$2 run=$3 cfg=$4 tr=$5 va=$6 etl=$7
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
    mpirun --oversubscribe --bind-to none --timeout 300 -np 2 \
    "$bin" train --config "$data/$cfg.json" --train "$data/$tr" --valid "$data/$va" --etl "$data/$etl" \
    --out "$run" --threads 1 --deterministic -q
}
eval_fn() { # SIDE BIN RUN DATA [ARGS...]
  local bin=$2 run=$3 d=$4
  shift 4
  "$bin" eval --model "$run" --data "$data/$d" --threads 2 "$@"
}
predict_fn() { # SIDE BIN RUN INPUT [ARGS...]
  local bin=$2 run=$3 in=$4
  shift 4
  "$bin" predict --model "$run" --input "$data/$in" --out - --threads 2 -q "$@"
}
export_fn() { # SIDE BIN RUN OUT
  "$2" export --model "$3" --onnx "$4" -q
}

# Trains CONFIG on both sides, then compares the run and what scores it.
check() { # CONFIG CFG TRAIN VALID ETL THREADS [TRAIN ARGS...]
  local name=$1 cfg=$2 tr=$3 va=$4 etl=$5 th=$6
  shift 6
  both "$name.train" train_fn "$name" "$cfg" "$tr" "$va" "$etl" "$th" "$@" || return 0
  cmp_masked "$name" "train's stdout summary" "$name.train.out"
  scores "$name" "$va"
}
scores() { # CONFIG VALID: eval and predict of the run on both sides
  local name=$1 va=$2
  cmp_run "$name" "$name"
  if both "$name.eval" eval_fn "$name" "$va"; then cmp_file "$name" "eval $va" "$name.eval.out"; fi
  if both "$name.predict-dlr" predict_fn "$name" "$va"; then
    cmp_file "$name" "predict $va" "$name.predict-dlr.out"
  fi
  if both "$name.predict-raw" predict_fn "$name" rows.tsv; then
    cmp_file "$name" "predict rows.tsv (raw TSV)" "$name.predict-raw.out"
  fi
}
# A run stopped at step STOP and resumed with --resume to its end.
check_resume() { # CONFIG CFG TRAIN VALID ETL THREADS STOP
  local name=$1 cfg=$2 tr=$3 va=$4 etl=$5 th=$6 stop=$7
  both "$name.train" train_fn "$name" "$cfg" "$tr" "$va" "$etl" "$th" --max-steps "$stop" || return 0
  both "$name.resume" train_fn "$name" "$cfg" "$tr" "$va" "$etl" "$th" --resume || return 0
  cmp_masked "$name" "resumed train's stdout summary" "$name.resume.out"
  scores "$name" "$va"
}

check dlrm dlrm train.dlr valid.dlr etl 2
check_resume dlrm-resume dlrm train.dlr valid.dlr etl 2 250
check dlrm-1t dlrm-1t train.dlr valid.dlr etl 1
check deepfm deepfm train.dlr valid.dlr etl 2
if both "deepfm.predict-best" predict_fn deepfm valid.dlr --checkpoint best; then
  cmp_file deepfm "predict valid.dlr --checkpoint best" "deepfm.predict-best.out"
fi
check dcn-moe dcn-moe train.dlr valid.dlr etl 2
check bf16 bf16 train.dlr valid.dlr etl 2
check fp16-scaled fp16-scaled train.dlr valid.dlr etl 2
check wd-scale wd-scale train.dlr valid.dlr etl 2
check fm fm train.dlr valid.dlr etl 2
check lr lr train.dlr valid.dlr etl 2
check tiered tiered train.dlr valid.dlr etl 2
check_resume tiered-resume tiered train.dlr valid.dlr etl 2 175
check hash hash train-raw.dlr valid-raw.dlr etl-raw 2
check_resume hash-resume hash train-raw.dlr valid-raw.dlr etl-raw 2 175

# grep without -q: it reads all of ldd's output, where -q's early exit would
# fail the pipeline (pipefail) with ldd's SIGPIPE.
has_mpi() { ldd "$1" 2> /dev/null | grep libmpi > /dev/null; }
if ! command -v mpirun > /dev/null; then
  report mpi2 "mpirun -np 2" "skipped: no mpirun on this machine"
elif ! has_mpi "$bin_base" || ! has_mpi "$bin_new"; then
  report mpi2 "mpirun -np 2" "skipped: a binary was built without MPI (Debian: libopenmpi-dev)"
elif both mpi2.train mpi_fn mpi2 mpi2 train.dlr valid.dlr etl; then
  cmp_masked mpi2 "train's stdout summary (rank 0)" mpi2.train.out
  scores mpi2 valid.dlr
fi

if both dlrm.export export_fn dlrm dlrm.onnx; then cmp_file dlrm "export --onnx" dlrm.onnx; fi

# --- 4. served scores -----------------------------------------------------
# Each side serves its dlrm run on a free loopback port; the same requests
# go to both: 16 raw rows as KServe v2 JSON, then again with binary output.
python3 - "$data/rows-nolabel.tsv" "$runs" <<'PY' || die "writing the requests failed"
import json, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
req = {"id": "bitcheck", "inputs": [
    {"name": "dense", "datatype": "BYTES", "shape": [len(rows), 13], "data": [r[:13] for r in rows]},
    {"name": "categorical", "datatype": "BYTES", "shape": [len(rows), 26], "data": [r[13:39] for r in rows]}]}
with open(sys.argv[2] + "/request.json", "w") as f:
    json.dump(req, f)
req["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
with open(sys.argv[2] + "/request-binary.json", "w") as f:
    json.dump(req, f)
PY
serve_side() { # SIDE BIN: starts the server, waits for its port, posts both requests
  local side=$1 bin=$2 dir=$runs/$1 port pid
  rm -f "$dir/serve.port"
  "$bin" serve --model "$dir/dlrm" --port 0 --port-file "$dir/serve.port" --threads 1 -q \
    > "$dir/serve.log" 2>&1 &
  pid=$!
  servers+=("$pid")
  for _ in $(seq 600); do
    [ -s "$dir/serve.port" ] && break
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.05
  done
  [ -s "$dir/serve.port" ] || return 1
  port=$(cat "$dir/serve.port")
  python3 - "$port" "$runs" "$dir" <<'PY'
import sys, urllib.request
port, runs, out = sys.argv[1:4]
for name in ("request", "request-binary"):
    body = open(runs + "/" + name + ".json", "rb").read()
    r = urllib.request.Request("http://127.0.0.1:%s/v2/models/dlrm/infer" % port, data=body,
                               headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=60) as resp:
        data = resp.read()
        hdr = resp.headers.get("Inference-Header-Content-Length", "")
    open(out + "/serve." + name + ".body", "wb").write(data)
    open(out + "/serve." + name + ".header", "w").write(hdr + "\n")
PY
}
if [ -e "$runs/base/dlrm/latest" ] && [ -e "$runs/new/dlrm/latest" ]; then
  serve_side base "$bin_base" || die "the base's server did not answer ($(rel "$runs/base/serve.log"))"
  if serve_side new "$bin_new"; then
    cmp_file dlrm "serve: KServe v2 JSON response" serve.request.body
    cmp_file dlrm "serve: binary output response" serve.request-binary.body
    cmp_file dlrm "serve: binary output header length" serve.request-binary.header
  else
    report dlrm "serve" "DIFFERS: the working tree's server did not answer ($(rel "$runs/new/serve.log"))"
  fi
  for p in ${servers[@]+"${servers[@]}"}; do kill "$p" 2> /dev/null || true; wait "$p" 2> /dev/null || true; done
  servers=()
else
  report dlrm "serve" "skipped: the dlrm run did not finish on both sides"
fi
phase_done "runs and compares"

# --- 5. verdict ------------------------------------------------------------
echo
echo "bitcheck: phases (wall time):"
printf '  %s\n' "${phases[@]}"
awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN { printf "  %-22s %7.1f s\n", "total", b - a }'
if [ "$n_diff" -gt 0 ]; then
  echo "bitcheck: $n_diff of $((n_same + n_diff)) comparisons DIFFER ($n_skip skipped);" \
    "the runs are kept in $runs"
  exit 1
fi
echo "bitcheck: all $n_same comparisons the same ($n_skip skipped)"
if [ "$keep" = 0 ]; then
  rm -rf "$data" "$runs"
else
  echo "bitcheck: kept $data, $runs and $base_dir/src"
fi
exit 0
