#!/usr/bin/env bash
# Mutation testing: do the unit tests notice a plausible bug?
#
# Each tests/mutants/*.mut is one small bug (an off-by-one, `<` for `<=`, a
# skipped check, two arguments swapped, a wrong constant) as lines to find in
# a file and their replacement, anchored by context rather than line numbers
# (scripts/mutant_apply.py). For each, this script applies it to a scratch copy
# of the tree, rebuilds the release build of that copy, runs the unit tests
# that cover the file, and says whether a test failed (the mutant is killed)
# or every test passed (it survived: the tests assert less than they seem to).
# The working tree is never modified, not even on Ctrl-C.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: scripts/mutate.sh [options] [MUTANT...]
       scripts/mutate.sh --check [MUTANT...]

Applies each mutant (default: every tests/mutants/*.mut) to a scratch copy
of the working tree, rebuilds the release build there, runs the unit tests,
and prints one line per mutant and the score:

  killed      a test failed or crashed (good)
  timeout     the tests ran past --timeout (counted as killed: a hang is noticed)
  SURVIVED    every test passed: no test checks what the mutant breaks
  no-apply    the mutant does not anchor in today's tree (not counted)
  no-build    the mutated tree does not compile (not counted)

score = (killed + timeout) / (killed + timeout + survived).

A mutant is a header of `#` lines, then one or more sections:

  # add overwrites y with x
  # tests: test_backend test_models
  @@ src/backend/cpu/rows.c
  -  for (size_t i = 0; i < n; i++) y[i] += x[i];
  +  for (size_t i = 0; i < n; i++) y[i] = x[i];

A section starts with `@@ PATH` (relative to the tree's root) and holds lines
that begin with ' ' (context), '-' (removed) or '+' (added), like a hunk of a
unified diff without line numbers. Its ' ' and '-' lines, in order, are the
block to find; its ' ' and '+' lines replace them. Lines match whole, leading
and trailing whitespace ignored, and the block must match at exactly one
place in the file, so that the mutant still applies after the code moves to
other lines (or, with its path updated, to another file) and never lands on
a look-alike. Several sections may name one file: they apply in order, each
to the file as the previous ones left it. The header may hold
  # DESCRIPTION            the first such line is printed with the result
  # tests: test_nn test_embed
                           the test executables (tests/test_*.c names), or the
                           script tests (dist_mpi: tests/dist/run.sh under mpirun;
                           onnx_export, report_chromium, python, etl_ops,
                           etl_spill, optim_ref),
                           that cover the mutated code; without it every unit test runs.
Tests run one executable at a time and stop at the first failure.

Before the mutants, the same tests run on the unmutated copy; if one of them
fails there, the script stops (every mutant would look killed).

options:
  -c, --check           build and test nothing: check that every mutant
                        anchors exactly once in the working tree and print
                        the ones that do not (the CTest test mutants_anchor
                        runs this, so that a change that breaks an anchor
                        fails there rather than at the next mutation run)
  -b, --build-dir DIR   scratch root (default build-mutate): DIR/src is the copy
                        of the tree, DIR/build its release build, DIR/logs the
                        build and test output of each mutant. Kept between runs
                        so that each mutant rebuilds only what it touched.
  -t, --timeout SEC     limit for one mutant's tests (default 300; the baseline
                        gets 10 times as long)
  -j, --jobs N          build jobs (default 2)
  -k, --keep-logs       keep the logs of killed mutants too (default: only of
                        survivors and failures to apply or build)
  -h, --help            this text

Make a mutant: write tests/mutants/NAME.mut by hand, the header lines and a
section with the line to break as '-' and its broken form as '+' (add ' '
lines around it only if the '-' lines alone match more than once), then run
`scripts/mutate.sh --check tests/mutants/NAME.mut` (does it anchor?) and
`scripts/mutate.sh tests/mutants/NAME.mut` (is it killed?).
Exit status: 0 when every counted mutant was killed (with --check: when every
mutant anchors), 1 when one survived or failed to apply or build (with
--check: did not anchor), 2 on a usage error or a failing baseline.
EOF
}

root=$(cd "$(dirname "$0")/.." && pwd)
scratch_root=build-mutate
timeout_s=300
jobs=2
keep_logs=0
check=0
mutants=()
while [ $# -gt 0 ]; do
  case "$1" in
    -b | --build-dir) scratch_root=$2; shift 2 ;;
    -t | --timeout) timeout_s=$2; shift 2 ;;
    -j | --jobs) jobs=$2; shift 2 ;;
    -k | --keep-logs) keep_logs=1; shift ;;
    -c | --check) check=1; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "mutate.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) mutants+=("$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"); shift ;;
  esac
done
cd "$root" || exit 2
command -v python3 >/dev/null || { echo "mutate.sh: needs python3 (scripts/mutant_apply.py)" >&2; exit 2; }
[ ${#mutants[@]} -eq 0 ] && mutants=("$root"/tests/mutants/*.mut)
[ -e "${mutants[0]}" ] || { echo "mutate.sh: no mutants (tests/mutants/*.mut)" >&2; exit 2; }
for m in "${mutants[@]}"; do
  case "$m" in *.mut) ;; *) echo "mutate.sh: $m is not a .mut mutant (see --help)" >&2; exit 2 ;; esac
done
mutant_apply() { python3 "$root/scripts/mutant_apply.py" "$@"; }
# Only whether each mutant anchors once in the working tree: no copy, no build.
[ $check -eq 1 ] && { mutant_apply check --root "$root" "${mutants[@]}"; exit $?; }
case "$scratch_root" in /*) ;; *) scratch_root=$root/$scratch_root ;; esac
copy=$scratch_root/src
bdir=$scratch_root/build
logs=$scratch_root/logs
mkdir -p "$copy" "$bdir" "$logs"
# Two runs in one scratch root would build each other's mutants.
exec 9>"$scratch_root/lock"
flock -n 9 || { echo "mutate.sh: another run is using $scratch_root" >&2; exit 2; }
run_start=$(date +%s)

# The copy holds what `git ls-files` lists (tracked and untracked, not
# ignored). Only files that differ are copied, so that the build stays
# incremental; a plain cp gives them a new mtime, so make rebuilds them.
mapfile -t files < <(git ls-files -co --exclude-standard)
sync_copy() {
  local f
  for f in "$@"; do
    if [ -e "$f" ]; then
      cmp -s "$f" "$copy/$f" || { mkdir -p "$copy/$(dirname "$f")" && cp "$f" "$copy/$f"; }
    else
      rm -f "$copy/$f"
    fi
  done
}
# A run stopped half-way (Ctrl-C, a crash) may have left a mutant in the
# copy: syncing everything first removes it.
sync_copy "${files[@]}"

current_files=()
restore() { [ ${#current_files[@]} -gt 0 ] && sync_copy "${current_files[@]}"; current_files=(); }
trap 'restore; echo; echo "mutate.sh: interrupted; the scratch copy is restored" >&2; exit 130' INT TERM

all_tests=$(cd tests && ls test_*.c | sed 's/\.c$//' | tr '\n' ' ')
tests_of() {
  local t
  t=$(sed -n '/^@@/q; s/^# *tests: *//p' "$1" | head -1)
  echo "${t:-$all_tests}"
}
describe() { sed -n '/^@@/q; /^# *tests:/d; s/^# *//p' "$1" | head -1; }

# Tests that are scripts rather than tests/test_*.c executables: the
# command that runs each (after the build dir, the copy and the scratch
# directory are known) and its environment, as tests/CMakeLists.txt has them.
script_test() { # NAME -> the command line, or nothing when NAME is none
  case "$1" in
  dist_mpi)
    echo "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" \
      "OMPI_MCA_btl_vader_single_copy_mechanism=none $copy/tests/dist/run.sh $bdir/dlrec" \
      "$(command -v mpirun) $bdir/testtmp/dist" ;;
  # Their virtual environments live outside testtmp, which each mutant's run
  # clears, so that PyPI is asked once.
  onnx_export) echo "$copy/tests/onnx/run.sh $bdir/dlrec $bdir/script-tests/onnx" ;;
  report_chromium) echo "$copy/tests/report/chromium.sh $bdir/dlrec $bdir/testtmp/report_chromium" ;;
  python) echo "$copy/tests/python/run.sh $bdir/dlrec $bdir/libdlrec.so $bdir/script-tests/python" ;;
  etl_ops) echo "$copy/tests/etl_ops/run.sh $bdir/dlrec $bdir/script-tests/etl_ops" ;;
  optim_ref) echo "$copy/tests/optim_ref/run.sh $bdir/dlrec $bdir/script-tests/optim_ref" ;;
  etl_spill) echo "$copy/tests/etl_spill/run.sh $bdir/dlrec $bdir/testtmp/etl_spill" ;;
  esac
}

build() { # TARGETS... -> 0 when built; output in $build_log
  local t targets=()
  for t in "$@"; do
    [ -n "$(script_test "$t")" ] || targets+=("$t")
    [ "$t" = python ] && targets+=(dlrec_shared)
  done
  nice -n 10 cmake --build "$bdir" -j "$jobs" --target dlrec "${targets[@]}" >>"$build_log" 2>&1
}

# Runs the given test executables one after another under one deadline of
# LIMIT seconds, with the environment CTest gives them; stops at the first
# failure. Prints killed / timeout / survived.
run_tests() {
  local limit=$1 log=$2 t rc deadline left
  shift 2
  deadline=$(($(date +%s) + limit))
  rm -rf "$bdir/testtmp"
  for t in "$@"; do
    left=$((deadline - $(date +%s)))
    [ $left -le 0 ] && { echo timeout; return; }
    echo "== $t" >>"$log"
    local cmd
    cmd=$(script_test "$t")
    # shellcheck disable=SC2086
    (cd "$bdir/tests" && DLREC_BIN=$bdir/dlrec DLREC_SOURCE_DIR=$copy DLREC_TEST_TMP=$bdir/testtmp \
      DLREC_PROGRESS=0 OMP_WAIT_POLICY=PASSIVE nice -n 10 timeout -k 5 "$left" ${cmd:-"./$t"}) >>"$log" 2>&1
    rc=$?
    echo "== $t: exit $rc after $((left - (deadline - $(date +%s)))) s" >>"$log"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && { echo timeout; return; }
    [ $rc -ne 0 ] && { echo "killed by $t"; return; }
  done
  echo survived
}

# Baseline: the union of the tests the mutants name, on the unmutated copy.
declare -A want=()
for p in "${mutants[@]}"; do
  for t in $(tests_of "$p"); do
    [ -f "tests/$t.c" ] || [ -n "$(script_test "$t")" ] ||
      { echo "mutate.sh: $p names $t, which is not a tests/test_*.c nor a script test" >&2; exit 2; }
    want[$t]=1
  done
done
echo "mutate.sh: configuring $bdir" >&2
nice -n 10 cmake -S "$copy" -B "$bdir" -DCMAKE_BUILD_TYPE=Release >"$logs/configure.log" 2>&1 ||
  { echo "mutate.sh: cmake failed, see $logs/configure.log" >&2; exit 2; }

base_tests=$(printf '%s\n' "${!want[@]}" | sort | tr '\n' ' ')
build_log=$logs/baseline.build.log
: >"$build_log"
echo "mutate.sh: baseline build and tests: $base_tests" >&2
start=$(date +%s)
# shellcheck disable=SC2086
build $base_tests || { echo "mutate.sh: the unmutated tree does not build, see $build_log" >&2; exit 2; }
: >"$logs/baseline.test.log"
# shellcheck disable=SC2086
res=$(run_tests $((10 * timeout_s)) "$logs/baseline.test.log" $base_tests)
if [ "$res" != survived ]; then
  echo "mutate.sh: baseline: $res on the unmutated tree, see $logs/baseline.test.log" >&2
  exit 2
fi
echo "mutate.sh: baseline passed in $(($(date +%s) - start)) s" >&2

killed=0 survived=0 unapplied=0 unbuilt=0
survivors=()
printf '%-40s %-26s %5s  %s\n' mutant result sec description
for p in "${mutants[@]}"; do
  name=$(basename "$p" .mut)
  build_log=$logs/$name.build.log
  test_log=$logs/$name.test.log
  : >"$build_log"
  : >"$test_log"
  start=$(date +%s)
  # The files named by its @@ lines; the applier writes all of them or none.
  mapfile -t current_files < <(mutant_apply files "$p" 2>/dev/null)
  if [ ${#current_files[@]} -eq 0 ] || ! mutant_apply apply --root "$copy" "$p" >>"$build_log" 2>&1; then
    current_files=()
    res=no-apply
    unapplied=$((unapplied + 1))
  else
    # shellcheck disable=SC2046
    if ! build $(tests_of "$p"); then
      res=no-build
      unbuilt=$((unbuilt + 1))
    else
      # shellcheck disable=SC2046
      res=$(run_tests "$timeout_s" "$test_log" $(tests_of "$p"))
      case "$res" in
        killed* | timeout) killed=$((killed + 1)) ;;
        survived) res=SURVIVED; survived=$((survived + 1)); survivors+=("$name") ;;
      esac
    fi
    restore
  fi
  if [ $keep_logs -eq 0 ] && { [ "${res%% *}" = killed ] || [ "$res" = timeout ]; }; then
    rm -f "$build_log" "$test_log"
  fi
  printf '%-40s %-26s %5s  %s\n' "$name" "$res" "$(($(date +%s) - start))" "$(describe "$p")"
done
trap - INT TERM

counted=$((killed + survived))
echo
echo "killed $killed, survived $survived, did not apply $unapplied, did not build $unbuilt" \
  "($(($(date +%s) - run_start)) s)"
if [ $counted -gt 0 ]; then
  echo "score: $killed/$counted = $((100 * killed / counted))%"
fi
[ ${#survivors[@]} -gt 0 ] && echo "survivors: ${survivors[*]} (logs in $logs)"
[ $survived -eq 0 ] && [ $unapplied -eq 0 ] && [ $unbuilt -eq 0 ]
