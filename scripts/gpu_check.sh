#!/usr/bin/env bash
# The GPU presets' training path on one GPU, with assertions (training/gpu_check.py says what it proves).
#
#   bash scripts/gpu_check.sh                          # on a CUDA machine: writes benchmarks/results/gpu.json
#   bash scripts/gpu_check.sh --dry-run --out FILE     # the same script on the CPU with a tiny model (CI runs it)
#
# It needs the project importable with its WebShop and training dependencies (scripts/setup.sh, or on a machine
# without internet: torch, transformers, ... preinstalled and the rest from a wheelhouse: PIP_FIND_LINKS=DIR).
# Nothing is downloaded: the model is random-initialised at Qwen2.5-1.5B's shape and the tokenizer is built from
# files on disk. About 5 minutes on one H200 (model build included); the dry run about a minute on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$PYTHON" -m training.gpu_check "$@"
