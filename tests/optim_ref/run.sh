#!/usr/bin/env bash
# optimizer.sparse "adam" and l2_scope "table" (docs/config.md, "Table-wide
# updates") against check.py's NumPy re-implementation of torch.optim.Adam
# (and SGD, row-wise Adagrad) over an nn.Embedding whose loss carries
# (weight_decay / 2) ||W||^2 (FuxiCTR's embedding_regularizer): model type
# lr trained on a small all-categorical CSV, checkpointed after every step,
# each checkpoint's table and optimizer state against NumPy's, which starts
# from the first checkpoint (numpy from PyPI, in a virtual environment under
# the build tree).
#
# usage: tests/optim_ref/run.sh DLREC_BIN WORKDIR
set -euo pipefail
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") # absolute: the script cds
mkdir -p "$2"
work=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
venv=$work/venv
. "$here/../venv.sh"
venv_ready "$venv" 'import numpy' numpy
cd "$work"
rm -rf ./*.csv ./*.json ./*.dlr etl run-*
"$venv/bin/python" "$here/check.py" --bin "$bin" --work "$work"
