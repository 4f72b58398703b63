#!/usr/bin/env bash
# Fill a wheelhouse for docker/Dockerfile: every wheel the image installs, for the image's Python, so that
# `docker compose build` needs no package index (an offline or air-gapped build; CI's Docker stage).
#
#   scripts/wheelhouse.sh .wheelhouse && docker compose build
#
# The image installs from .wheelhouse/ alone when the build context holds it (docs/hosting.md). Run this on a
# host that reaches the index, then carry the checkout with its .wheelhouse/ to the machine that builds.
#
# * Binary wheels are resolved for the image's Python and platform, not this host's: pip checks every release
#   against Python $WHEELHOUSE_PYTHON (so e.g. soupsieve stops at 2.7, the last release that takes 3.11.2) and
#   takes manylinux wheels up to glibc $WHEELHOUSE_GLIBC.
# * The two packages published only as sources, fast-downward-textworld (the ALFWorld planner, a C++ build of
#   ~5 min on 2 cores: needs cmake, g++, make) and jericho, are built into wheels here. They are pure-Python
#   wheels around their binaries. pip keeps built wheels in its cache, so after scripts/setup.sh has built the
#   planner once, this takes seconds.
#
# Environment (defaults in brackets):
#   PYTHON               Python >= 3.11 that runs pip here [.venv/bin/python when present, else python3]
#   WHEELHOUSE_PYTHON    the image's Python version [3.11.2: Debian bookworm's python3, the oldest base we build on]
#   WHEELHOUSE_GLIBC     the image's glibc [2.36: Debian bookworm, also python:3.11-slim-bookworm's]
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: scripts/wheelhouse.sh DIR" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
mkdir -p "$1"
DIR=$(cd "$1" && pwd)
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
TARGET=${WHEELHOUSE_PYTHON:-3.11.2}
GLIBC=${WHEELHOUSE_GLIBC:-2.36}
ARCH=$(uname -m)
REQS=$(mktemp -d)
trap 'rm -rf "$REQS"' EXIT
for kind in build engine deps; do "$PY" docker/requirements.py "$kind" >"$REQS/$kind.txt"; done

# The ALFWorld engine (installed --no-deps in the image): the source-only packages built here, the rest fetched.
"$PY" -m pip wheel --quiet --no-deps --wheel-dir "$DIR" -r "$REQS/engine.txt"

# Everything else with its dependencies, as binary wheels for the image's interpreter and platform.
major_minor=$(echo "$TARGET" | cut -d. -f1,2 | tr -d .)
platforms=()
for ((minor = ${GLIBC#*.}; minor >= 17; minor--)); do platforms+=(--platform "manylinux_2_${minor}_${ARCH}"); done
platforms+=(--platform "manylinux2014_${ARCH}")  # pip adds manylinux2010 and manylinux1
"$PY" -m pip download --quiet --only-binary=:all: --dest "$DIR" \
  --python-version "$TARGET" --implementation cp --abi "cp$major_minor" "${platforms[@]}" \
  -r "$REQS/build.txt" -r "$REQS/deps.txt"

echo "[wheelhouse] $(find "$DIR" -maxdepth 1 -name '*.whl' | wc -l) wheels, $(du -sh "$DIR" | cut -f1), in $DIR (Python $TARGET, glibc $GLIBC, $ARCH)"
