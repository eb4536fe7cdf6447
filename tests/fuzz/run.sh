#!/bin/sh
# Runs every libFuzzer target of a fuzz build for a fixed number of
# executions, one target at a time, and prints each target's executions,
# executions per second and result. `make fuzz` calls it; CTest's fuzz tests
# (bounded in seconds, not executions) are the quick version of the same.
#
#   tests/fuzz/run.sh BUILD_DIR [RUNS] [JOBS] [TARGET...]
#
# RUNS (default 10000000) is the total per target, split evenly over JOBS
# processes (default 1) that share one working corpus. Each target starts
# from its seed corpus (tests/fuzz/corpus/NAME, never written to) copied into
# BUILD_DIR/fuzz-corpus/NAME, which keeps what the fuzzer found between runs.
# A crash, leak, timeout or sanitizer report leaves its input in
# BUILD_DIR/fuzz-artifacts/ and the log in BUILD_DIR/fuzz-logs/, and makes the
# script exit 1 after the remaining targets have run.
set -u
build=${1:?usage: tests/fuzz/run.sh BUILD_DIR [RUNS] [JOBS] [TARGET...]}
runs=${2:-10000000}
jobs=${3:-1}
shift $(($# < 3 ? $# : 3))
src=$(cd "$(dirname "$0")" && pwd)
targets=${*:-$(cd "$src" && ls fuzz_*.c | sed 's/\.c$//')}
per_job=$(((runs + jobs - 1) / jobs))
mkdir -p "$build/fuzz-artifacts" "$build/fuzz-logs"
# Leaks are findings too; abort_on_error gives a core-style stop libFuzzer
# reports as a crash.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export OMP_WAIT_POLICY=PASSIVE

failed=0
printf '%-12s %12s %10s %8s  %s\n' target executions exec/s seconds result
for t in $targets; do
  bin=$build/tests/$t
  if [ ! -x "$bin" ]; then
    printf '%-12s %12s %10s %8s  %s\n' "$t" - - - "MISSING ($bin; configure with -DDLREC_FUZZ=ON)"
    failed=1
    continue
  fi
  work=$build/fuzz-corpus/$t
  mkdir -p "$work"
  cp -r "$src/corpus/$t/." "$work/" 2>/dev/null
  start=$(date +%s)
  pids=
  j=0
  while [ $j -lt "$jobs" ]; do
    "$bin" -runs="$per_job" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$build/fuzz-artifacts/$t-" "$work" >"$build/fuzz-logs/$t.$j.log" 2>&1 &
    pids="$pids $!"
    j=$((j + 1))
  done
  result=ok
  for p in $pids; do wait "$p" || result=FAILED; done
  secs=$(($(date +%s) - start))
  # libFuzzer's final stats say how many inputs each process ran.
  execs=$(cat "$build/fuzz-logs/$t".*.log | sed -n 's/^stat::number_of_executed_units: *//p' |
    awk '{s += $1} END {print s + 0}')
  [ "$execs" -lt "$runs" ] && result=FAILED
  rate=$((execs / (secs > 0 ? secs : 1)))
  if [ "$result" != ok ]; then
    failed=1
    result="FAILED (see $build/fuzz-logs/$t.*.log and $build/fuzz-artifacts/)"
    grep -h -m1 -E '^(==[0-9]+==ERROR|SUMMARY)' "$build/fuzz-logs/$t".*.log | sed 's/^/    /'
  fi
  printf '%-12s %12s %10s %8s  %s\n' "$t" "$execs" "$rate" "$secs" "$result"
done
exit $failed
