# Shared by the entry-point scripts (sourced): the repository root and the Python to run.
# In the image the project lives in /app with its venv in /app/.venv; in CI the scripts run from a checkout.
# shellcheck shell=bash
PROGPO_ROOT=${PROGPO_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
if [ -z "${PROGPO_PYTHON:-}" ]; then
  if [ -x "$PROGPO_ROOT/.venv/bin/python" ]; then PROGPO_PYTHON="$PROGPO_ROOT/.venv/bin/python"; else PROGPO_PYTHON=python3; fi
fi
export PROGPO_ROOT PROGPO_PYTHON
# One math thread per process: the services scale with processes (env workers), not BLAS threads.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cd "$PROGPO_ROOT"
