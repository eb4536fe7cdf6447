#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest): installs the package
# (pip install ./python, around the libdlrec.so just built) into a virtual
# environment under the build tree, with its test dependencies from PyPI
# (cffi, numpy, pandas, pyarrow, pytest; installed once), and runs pytest
# with DLREC_BIN, the CLI the tests compare against.
# usage: tests/python/run.sh DLREC_BIN LIBDLREC_SO WORKDIR
set -euo pipefail
bin=$1
so=$2
work=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$work/venv
mkdir -p "$work"
. "$root/tests/venv.sh"
venv_ready "$venv" 'import cffi, numpy, pandas, pyarrow, pytest, setuptools, wheel' cffi numpy pandas pyarrow pytest \
  setuptools wheel
# The package around this build's library, every time (the library changes).
rm -rf "$work/src"
cp -r "$root/python" "$work/src"
DLREC_LIBRARY=$so DLREC_API_HEADER=$root/include/dlrec.h "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
  --force-reinstall "$work/src" > "$work/pip.log" 2>&1 || { cat "$work/pip.log" >&2; exit 1; }
cd "$work"
DLREC_BIN=$bin "$venv/bin/python" -m pytest -q -p no:cacheprovider "$work/src/tests"
