#!/usr/bin/env bash
# All benchmarks, side by side with their peers or the machine's limit.
# (make bench; never part of the tests.)
set -euo pipefail
cd "$(dirname "$0")/.."
bench/etl_vs_pandas.sh "${ETL_ROWS:-5000000}"
echo
build/bench_loader --rows "${LOADER_ROWS:-5000000}"
echo
bench/train_vs_torch.sh
echo
# The TorchRec peer needs its own venv (bench/torchrec/setup.sh, from PyPI).
if [ -x .venv-torchrec/bin/python ]; then
  bench/train_vs_torchrec.sh
else
  echo "train_vs_torchrec: skipped (no .venv-torchrec; run bench/torchrec/setup.sh)"
fi
echo
bench/serve_vs_forward.sh
