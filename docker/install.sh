#!/usr/bin/env bash
# The image's dependency layer (docker/Dockerfile, stage `deps`): /app/.venv with what the three services
# import, without the project itself, whose code comes in the next stage (editing code reuses this layer).
#
#   docker/install.sh DIR    DIR holds pyproject.toml and requirements.py, and the wheels of a wheelhouse if any
#
# With wheels in DIR (scripts/wheelhouse.sh) everything installs from DIR and nothing else (--no-index: an
# offline build). Without, from the package index as scripts/setup.sh does, building the two source-only
# packages (fast-downward-textworld, jericho) with cmake, g++ and make from apt.
set -euo pipefail
SRC=$1
python3 -m venv /app/.venv
PIP=(/app/.venv/bin/python -m pip --disable-pip-version-check --no-cache-dir)
SOURCE=()
if compgen -G "$SRC/*.whl" >/dev/null; then
  echo "[install] from the wheelhouse alone ($(find "$SRC" -maxdepth 1 -name '*.whl' | wc -l) wheels, no index)"
  SOURCE=(--no-index --find-links "$SRC")
else
  echo "[install] from the package index (no .wheelhouse/ in the build context)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends cmake g++ make >/dev/null
fi
requirements() { python3 "$SRC/requirements.py" "$1"; }
"${PIP[@]}" install "${SOURCE[@]}" --quiet --upgrade -r <(requirements build)
# The ALFWorld engine without spaCy (its runtime dependencies are in pyproject's core list).
"${PIP[@]}" install "${SOURCE[@]}" --quiet --no-deps -r <(requirements engine)
"${PIP[@]}" install "${SOURCE[@]}" --quiet -r <(requirements deps)
