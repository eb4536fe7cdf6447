#!/bin/bash
# Builds the FuxiCTR virtual environment that bench/fuxictr_vs.sh runs its peer in, from PyPI only.
#
# usage: bench/fuxictr/setup.sh [VENV_DIR]     (default: .venv-fuxictr at the repo root)
#
# torch comes the way bench/torchrec/setup.sh installs it (that script is run on
# this venv: the PyPI torch 2.14.1 with --no-deps and only the CUDA libraries
# libtorch_cuda.so links against, CUDA never used; it also brings torchrec and
# fbgemm-gpu-cpu, unused here). Then FuxiCTR 2.3.9 with --no-deps and exactly
# the pure-Python packages `import fuxictr` and its PyTorch layers, FeatureProcessor,
# build_dataset and parquet loader import: polars, pandas (with python-dateutil,
# pytz, tzdata, six), pyarrow (pandas' parquet engine), scikit-learn (its AUC and
# log loss; with scipy, joblib, threadpoolctl; 1.4.2: metrics.py passes log_loss an
# eps, which 1.5 removed; 1.4.2 is the first built for numpy 2), h5py, PyYAML, tqdm and
# keras-preprocessing (tokenizer.py's pad_sequences).
#
# Why 2.3.9 and not 2.3.10: 2.3.10's build_dataset and data loaders import ray
# (`ray[data]`, some hundred MB of further dependencies) at module level; 2.3.9
# is the last 2.3.x whose data pipeline is polars + pandas + pyarrow. The layers
# and BaseModel (training loop, regularizer, plateau, early stop) are the same
# code in both. The models themselves (LR, FM, DNN, WideDeep, DeepFM, DCNv2, DLRM)
# live in FuxiCTR's model_zoo, which no wheel ships: bench/fuxictr/run_fuxictr.py
# composes them from the wheel's layers as model_zoo does.
#
# bench/fuxictr/requirements-lock.txt lists what the venv ends up holding. The
# MovieLens-100K wheel (RecBole 1.2.1, for its data set) is kept under VENV_DIR/cache.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
V=${1:-$root/.venv-fuxictr}
case $V in /*) ;; *) V=$PWD/$V ;; esac
"$root/bench/torchrec/setup.sh" "$V"
P="$V/bin/pip"
"$P" install -q --no-deps fuxictr==2.3.9
"$P" install -q --no-deps \
    polars==1.33.1 pandas==2.3.3 python-dateutil==2.9.0.post0 pytz==2025.2 tzdata==2025.2 six==1.17.0 \
    pyarrow==21.0.0 scikit-learn==1.4.2 scipy==1.16.2 joblib==1.5.2 threadpoolctl==3.6.0 \
    h5py==3.14.0 PyYAML==6.0.3 keras-preprocessing==1.1.2
# The MovieLens-100K rows of bench/fuxictr/data.py: RecBole 1.2.1's wheel ships them
# (recbole/dataset_example/ml-100k/); only the wheel is kept, never installed.
mkdir -p "$V/cache"
[ -f "$V/cache/recbole-1.2.1-py3-none-any.whl" ] || "$P" download -q --no-deps -d "$V/cache" recbole==1.2.1
cd /tmp && "$V/bin/python" - <<'PY'
import fuxictr, polars, pandas, sklearn
from fuxictr.preprocess import FeatureProcessor, build_dataset
from fuxictr.pytorch.dataloaders import RankDataLoader
from fuxictr.pytorch.models import BaseModel
from fuxictr.pytorch.layers import FeatureEmbedding, MLP_Block, FactorizationMachine, LogisticRegression
from fuxictr.pytorch.layers import CrossNetV2, InnerProductInteraction
print("ok: fuxictr", fuxictr.__version__, "| polars", polars.__version__, "| pandas", pandas.__version__,
      "| scikit-learn", sklearn.__version__)
PY
