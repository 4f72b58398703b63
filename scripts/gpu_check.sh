#!/usr/bin/env bash
# GPU check of the training loop (run by hand on a CUDA machine; never in CI).
#
# The same loop as `progpo train` on CUDA with a random-initialised model of Qwen2.5-1.5B-Instruct's exact shape
# (28 layers, hidden 1536, 151,936 embedding rows, bf16, gradient checkpointing), a few iterations on generated
# ALFWorld games with 8 groups x 8. Prints rollout tokens/s, update tokens/s, time split and peak GPU memory, and
# writes benchmarks/results/gpu.json (+ gpu.png).
#
#   bash scripts/gpu_check.sh            # ~5-8 minutes on one H100/H200 (building the random 1.5B model included)
#   ITERATIONS=2 GROUPS=4 bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
"$PYTHON" - <<'PY'
import torch, sys
if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device visible (this check needs a GPU; install a CUDA build of torch)")
print("GPU:", torch.cuda.get_device_name(0), "| torch", torch.__version__)
PY
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$PYTHON" benchmarks/bench_training.py \
  --models qwen2.5-1.5b-shape --device cuda --threads "${THREADS:-8}" \
  --iterations "${ITERATIONS:-3}" --groups "${GROUPS:-8}" --group-size 8 --max-steps "${MAX_STEPS:-10}" \
  --max-new-tokens "${MAX_NEW_TOKENS:-128}" --out benchmarks/results/gpu.json \
  --extra model.dtype=bfloat16 model.gradient_checkpointing=true optim.micro_batch_rows=16 \
          optim.mini_batch_rows=256 rollout.sample_batch_size=128 rollout.max_prompt_tokens=2048 env.vector_mode=async
