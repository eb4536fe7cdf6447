#!/usr/bin/env bash
# Installs the Debian packages dlrec needs for one purpose, only when missing.
#   scripts/deps.sh build   compiler, CMake, cJSON, OpenBLAS, libmicrohttpd, oneDNN (the bf16
#                           GEMMs on CPUs with AMX or AVX512-BF16), hiredis (the Redis tier),
#                           Open MPI (training across processes; libopenmpi-dev depends on
#                           openmpi-bin, so mpirun comes with it)
#   scripts/deps.sh test    build + clang with its sanitizer/libFuzzer and OpenMP runtimes
#                           (the ASan+UBSan and fuzz build), python3-venv (the Triton
#                           client test installs tritonclient from PyPI into a venv),
#                           redis-server (the Redis tier's tests start one on loopback),
#                           openmpi-bin (the mpirun of the tests across processes; named
#                           although libopenmpi-dev brings it, since the tests run it),
#                           chromium (renders the training report headless in a test)
#   scripts/deps.sh bench   test + python3-pandas, python3-torch and wrk, the peers and load of the benchmarks
# Runs `apt-get update` itself the first time something is missing. Needs root
# (or sudo) only when it has something to install.
set -euo pipefail

want=(build-essential cmake pkg-config libcjson-dev libopenblas-openmp-dev libmicrohttpd-dev libdnnl-dev libhiredis-dev
      libopenmpi-dev)
case "${1:-build}" in
  build) ;;
  test) want+=(clang libclang-rt-dev libomp-dev python3-venv redis-server openmpi-bin chromium) ;;
  bench) want+=(clang libclang-rt-dev libomp-dev python3-venv redis-server openmpi-bin chromium python3 python3-pandas python3-torch wrk) ;;
  *) echo "usage: $0 build|test|bench" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
