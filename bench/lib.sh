# shellcheck shell=bash disable=SC2034,SC2154
# Shell helpers shared by the benchmarks (bench/train_vs_torch.sh,
# bench/train_vs_torchrec.sh, the serving ones). Sourced, never run. The caller sets (and this
# file sets train_rows, valid_rows and table_rows for it):
#   root  the repository root
#   bin   the dlrec executable
#   py    a python3 with the standard library (json) for reading results
#   work  a scratch directory the caller removes

# Peak RSS through GNU time when there is one; otherwise none is reported.
timev=
if [ -x /usr/bin/time ] && /usr/bin/time -v true 2>/dev/null; then timev=/usr/bin/time; fi

# run_rss RSSFILE CMD...: runs CMD (stdout passes through), its peak RSS in KiB
# into RSSFILE (an empty line without GNU time). CMD's exit status is returned.
run_rss() {
  local rss=$1 rc=0
  shift
  if [ -n "$timev" ]; then
    "$timev" -v -o "$rss.time" "$@" || rc=$?
    awk -F': *' '/Maximum resident set size/ { print $2 }' "$rss.time" > "$rss"
  else
    "$@" || rc=$?
    echo "" > "$rss"
  fi
  return $rc
}

# json_get FILE EXPR: a value from a JSON file (python's json; EXPR indexes 'j').
json_get() { "$py" -c "import json,sys; j=json.load(open(sys.argv[1])); v=$2; print('nan' if v is None else v)" "$1"; }

# faster NEW BEST: true when samples/s NEW beats BEST (both may be decimals).
faster() { awk -v s="$1" -v best="$2" 'BEGIN { exit !(s > best) }'; }

# cpu_line: the CPU's model and the ISA flags that decide the 16-bit GEMMs'
# speed (avx512_bf16 and AMX: without them bf16 math is emulated in fp32).
cpu_line() {
  local model fam flags f have=
  model=$(LC_ALL=C lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
  [ -n "$model" ] || model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
  # The family tells a VM's bare "AMD EPYC" apart: 25 is Zen 3/4, 26 Zen 5.
  fam=$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -1)
  model="${model:-unknown}${fam:+ family $fam}"
  flags=$(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -1)
  for f in avx2 avx512f avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_fp16; do
    case " $flags " in *" $f "*) have="$have $f" ;; esac
  done
  echo "CPU: ${model:-unknown} ($(nproc) cores); flags:${have:- none of avx2/avx512/amx}"
}

# wrk_post_lua BODY CONTENT_TYPE [LUA]: a wrk script on stdout that POSTs
# the file BODY with that Content-Type (and LUA, a line of its own, after
# the headers) and reports on stderr any answer but 200.
wrk_post_lua() {
  cat <<EOF
local f = io.open("$1", "rb")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "$2"
${3:-}
function response(status, headers, body)
  if status ~= 200 then io.stderr:write("status " .. status .. ": " .. body .. "\n") end
end
EOF
}

# make_criteo_data ROWS CAP [MIN_COUNT]: synthesizes ROWS Criteo-like rows
# (categorical columns capped at CAP distinct values), fits the ETL
# (--min-count MIN_COUNT, default 2) into
# $work/etl and encodes $work/train.dlr and $work/valid.dlr (10% held out).
# Sets train_rows, valid_rows and table_rows (the 26 tables' rows in all).
make_criteo_data() {
  "$bin" synth --rows "$1" --max-cardinality "$2" --out "$work/clicks.tsv" -q
  "$bin" etl fit --input "$work/clicks.tsv" --out "$work/etl" --min-count "${3:-2}" -q
  "$bin" etl apply --etl "$work/etl" --input "$work/clicks.tsv" --out "$work/train.dlr" \
    --valid-fraction 0.1 --valid-out "$work/valid.dlr" --seed 7 -q
  rm -f "$work/clicks.tsv"
  "$bin" inspect "$work/train.dlr" --json > "$work/inspect.json"
  "$bin" inspect "$work/valid.dlr" --json > "$work/inspect-valid.json"
  train_rows=$(json_get "$work/inspect.json" "j['rows']")
  table_rows=$(json_get "$work/inspect.json" "j['sparse'][-1]['id_end']")
  valid_rows=$(json_get "$work/inspect-valid.json" "j['rows']")
}

# dlrm_config OUT BATCH THREADS [KEY=JSON ...]: examples/dlrm_criteo.json for
# one epoch at this batch size and thread count, into OUT; each KEY=JSON
# (e.g. training.precision='"bf16"') sets one more key.
dlrm_config() {
  "$py" - "$root/examples/dlrm_criteo.json" "$@" <<'EOF'
import json, sys
src, out, batch, threads, *sets = sys.argv[1:]
c = json.load(open(src))
c["training"].update(batch_size=int(batch), threads=int(threads), epochs=1)
for s in sets:
    path, value = s.split("=", 1)
    *parents, key = path.split(".")
    node = c
    for p in parents:
        node = node.setdefault(p, {})
    node[key] = json.loads(value)
json.dump(c, open(out, "w"), indent=2)
EOF
}
