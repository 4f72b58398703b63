#!/usr/bin/env bash
# Set up (or update) the optional upstream-verl environment at .venv-verl/ (used only by .ci/run_verl).
#
#   scripts/setup_verl.sh
#
# What it does, and why (docs/verl_agent.md, "What CI checks"):
# * A SEPARATE venv: the project never depends on PyPI's `verl` (verl-agent installs itself under that name),
#   so verl stays out of .venv.
# * verl==0.9.1 with --no-deps: the checks exercise its plugin loader (`import verl`) and its advantage registry
#   (`verl.trainer.ppo.core_algos`), which import ray and tensordict; its other requirements (vLLM, wandb,
#   datasets, ...) are for training. Hydra and OmegaConf compose the launcher's config in the dry-run test.
#   Every one is pinned.
# * The project's .venv is reached through a .pth file (site.addsitedir): torch, transformers, the envs and the
#   editable project come from there, not installed twice; .venv-verl's own packages come first on the path.
# Idempotent: a second run reinstalls nothing that is already right.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-verl
VERL_PIN="verl==0.9.1"
DEPENDENCY_PINS=(
  "ray==2.60.0"
  "tensordict==0.10.0"
  "hydra-core==1.3.8"
  "omegaconf==2.3.1"
  "antlr4-python3-runtime==4.9.3"
  "codetiming==1.4.0"
)

[ -x .venv/bin/python ] || scripts/setup.sh --dev
if [ ! -x "$VENV/bin/python" ]; then
  "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv "$VENV"
fi
main_site=$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')
own_site=$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
echo "import site; site.addsitedir('$main_site')" > "$own_site/progpo-main-venv.pth"

PIP="$VENV/bin/python -m pip"
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('verl') != '0.9.1')" 2>/dev/null; then
  echo "[setup-verl] installing $VERL_PIN (--no-deps)"
  $PIP install --quiet --no-deps "$VERL_PIN"
fi
echo "[setup-verl] checking ${DEPENDENCY_PINS[*]}"
# pip then lists verl's own requirements that --no-deps left out (and its transformers range, which .venv's
# newer release is outside of: the registry does not import transformers): expected, said in one line.
$PIP install --quiet "${DEPENDENCY_PINS[@]}" 2>&1 | awk '
  /^verl 0\.9\.1 requires/ { skipped++; next }
  /^ERROR: pip.s dependency resolver does not currently take into account/ { next }
  { print }
  END { if (skipped) print "[setup-verl] pip: " skipped " of verl 0.9.1'"'"'s requirements left out on purpose (--no-deps)" }'

"$VENV/bin/python" -c "import verl, hydra, progpo_verl; print('[setup-verl] verl', verl.__version__, 'ready in $VENV')"
