#!/usr/bin/env bash
# Packs what a lent GPU machine needs to run this build's programs into
# .device/ (ignored by git), for the `run` tool's carry: the machine has
# the CUDA toolkit and driver but none of dlrec's Debian libraries (cJSON,
# libmicrohttpd, hiredis, OpenBLAS, oneDNN, Open MPI), so build/dlrec, the
# tests, the benchmarks and the dev/cuda programs travel with the
# libraries they load (the C and C++ runtimes excepted: the machine's are
# newer), xz-compressed to fit the carry's 64 MiB.
#
#   scripts/device_bundle.sh            # after `make` (build/ with CUDA)
#   BUILD=build-portable scripts/device_bundle.sh   # a build made with
#       -DDLREC_NATIVE=OFF, for a GPU machine whose CPU may lack this one's
#       instructions (-march=native here is AVX-512 on Zen 4)
#   BASE=path/to/dlrec scripts/device_bundle.sh   # with an older build's
#       dlrec as bin/dlrec_base too, which gpu_checks.sh then times side by
#       side with this one (build it with the same -DDLREC_NATIVE=OFF)
#   run: carry [".device"], command:
#     eval "$(.device/setup.sh)" && .device/bin/test_backend
#
# setup.sh unpacks the bundle and prints the environment the tests want
# (the library path, DLREC_BIN and the rest, as CTest sets them).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.device
rm -rf "$out"
mkdir -p "$out/bin" "$out/libs"
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
b=${BUILD:-build}
progs=("$b"/dlrec "$b"/bench_* "$b"/tests/test_*)
cp "${progs[@]}" "$out/bin/"
if [ -n "${BASE:-}" ]; then
  cp "$BASE" "$out/bin/dlrec_base"
  progs+=("$BASE")
fi
[ -d "$b"/dev-cuda ] && cp -r "$b"/dev-cuda "$out/bin/"
for p in "${progs[@]}"; do ldd "$p" | awk '/=> \//{print $3}'; done | sort -u |
  grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' | xargs -I{} cp -L {} "$out/libs/"
strip "$out"/bin/* 2>/dev/null || true
(cd "$out" && tar -cJf bundle.tar.xz bin libs && rm -rf bin libs)
cat > "$out/setup.sh" <<'SETUP'
#!/usr/bin/env bash
# Unpacks the bundle's libraries (once) and prints the environment to eval.
set -e
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$here/libs" ] || (cd "$here" && tar -xJf bundle.tar.xz)
mkdir -p /tmp/dlrec-testtmp
echo "export LD_LIBRARY_PATH=$here/libs:/usr/local/cuda/lib64:\${LD_LIBRARY_PATH:-}"
echo "export DLREC_BIN=$here/bin/dlrec DLREC_SOURCE_DIR=$(cd "$here/.." && pwd) DLREC_TEST_TMP=/tmp/dlrec-testtmp"
echo "export DLREC_PROGRESS=0 OMP_WAIT_POLICY=PASSIVE"
SETUP
chmod +x "$out/setup.sh"
du -sh "$out"
