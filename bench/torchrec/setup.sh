#!/bin/bash
# Builds the TorchRec + FBGEMM CPU virtual environment that bench/train_vs_torchrec.sh
# runs its peer in, from PyPI only.
#
# usage: bench/torchrec/setup.sh [VENV_DIR]     (default: .venv-torchrec at the repo root)
#
# PyPI has no CPU-only torch wheel for Linux x86_64 (the "+cpu" wheels live on
# PyTorch's own index, which this project does not reach), so the PyPI torch
# (its CUDA 13 build) is installed with --no-deps plus only what `import torch`
# needs on the CPU. libtorch_cuda.so is linked against the CUDA libraries: the
# toolkit in /usr/local/cuda-13.0/lib (in ld.so.conf) supplies most of them, and
# the four that are missing or too old there come from PyPI (with --no-deps):
#   nvidia-cufile, nvidia-cusparselt-cu13, nvidia-nvshmem-cu13, nvidia-nccl-cu13
# (a system NCCL 2.28.9 lacks ncclCommResume, which torch 2.14.1 needs). CUDA is
# never used. Without /usr/local/cuda-13.0, torch is installed with its full
# dependencies instead (about 3 GB).
#
# torch is pinned to 2.14.1 because fbgemm-gpu-cpu 1.9.0 is built for torch 2.14
# (fbgemm_gpu/__init__.py, _fbgemm_torch_compat_table). torchrec 1.9.2 declares
# the CUDA `fbgemm-gpu` as a dependency, so it is installed with --no-deps too.
# bench/torchrec/requirements-lock.txt lists what the venv ends up holding.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
V=${1:-$root/.venv-torchrec}
case $V in /*) ;; *) V=$PWD/$V ;; esac  # the import check below runs from /tmp
DL=${DL:-$V/dl}
command -v /usr/bin/python3 >/dev/null
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || { apt-get update && apt-get install -y python3-venv; }
[ -x "$V/bin/python" ] || /usr/bin/python3 -m venv "$V"
P="$V/bin/pip"
"$P" install -q --upgrade pip
mkdir -p "$DL"
if [ -d /usr/local/cuda-13.0/lib ]; then
  "$P" download -q --no-deps -d "$DL" \
      torch==2.14.1 fbgemm-gpu-cpu==1.9.0 torchrec==1.9.2 \
      tensordict==0.15.3 torchmetrics==1.0.3 pyre-extensions==0.0.32 \
      nvidia-cufile==1.15.1.6 nvidia-cusparselt-cu13==0.8.1 nvidia-nvshmem-cu13==3.4.5 nvidia-nccl-cu13==2.30.7
  "$P" install -q --no-deps \
      "$DL"/torch-2.14.1-cp311-*.whl "$DL"/fbgemm_gpu_cpu-1.9.0-*.whl "$DL"/torchrec-1.9.2-*.whl \
      "$DL"/tensordict-0.15.3-*.whl "$DL"/torchmetrics-1.0.3-*.whl "$DL"/pyre_extensions-0.0.32-*.whl \
      "$DL"/nvidia_cufile-1.15.1.6-*.whl "$DL"/nvidia_cusparselt_cu13-0.8.1-*.whl \
      "$DL"/nvidia_nvshmem_cu13-3.4.5-*.whl "$DL"/nvidia_nccl_cu13-2.30.7-*.whl
else
  "$P" install -q torch==2.14.1
  "$P" download -q --no-deps -d "$DL" fbgemm-gpu-cpu==1.9.0 torchrec==1.9.2 \
      tensordict==0.15.3 torchmetrics==1.0.3 pyre-extensions==0.0.32
  "$P" install -q --no-deps "$DL"/fbgemm_gpu_cpu-1.9.0-*.whl "$DL"/torchrec-1.9.2-*.whl \
      "$DL"/tensordict-0.15.3-*.whl "$DL"/torchmetrics-1.0.3-*.whl "$DL"/pyre_extensions-0.0.32-*.whl
fi
# The pure-Python dependencies that torch, torchrec, tensordict and torchmetrics really import.
"$P" install -q \
    filelock==4.2.11 typing_extensions==4.16.0 sympy==1.14.0 mpmath==1.3.0 networkx==3.6.1 \
    Jinja2==3.1.6 MarkupSafe==3.0.4 fsspec==2026.9.0 setuptools==84.2.1 numpy==2.4.6 \
    cloudpickle==3.1.2 pyvers==0.2.3 packaging==26.3 lightning-utilities==0.15.3 \
    typing-inspect==0.9.0 mypy_extensions==1.2.0 tqdm==4.70.1
# The wheels are installed; keeping them would double the venv's size on disk.
rm -rf "$DL"
cd /tmp && "$V/bin/python" - <<'PY'
import torch, fbgemm_gpu, torchrec
from importlib import metadata as md
a = torch.randn(256, 256)
assert torch.allclose(a @ torch.eye(256), a)
print("ok: torch", torch.__version__, "| torchrec", md.version("torchrec"),
      "| fbgemm-gpu-cpu", md.version("fbgemm-gpu-cpu"), "| cuda available:", torch.cuda.is_available(),
      "| cpu capability:", torch.backends.cpu.get_cpu_capability())
PY
