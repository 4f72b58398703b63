#!/usr/bin/env bash
# Image install: the serving subset of scripts/setup.sh (steps 2 and 3) without torch, which the env services
# never import. Keep ALFWORLD_PINS in step with scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip wheel setuptools
ALFWORLD_PINS="alfworld==0.4.2 textworld==1.7.0 fast-downward-textworld==20.6.4 jericho==3.3.1 tatsu==5.8.3"
$PIP install --quiet --no-deps $ALFWORLD_PINS
$PIP install --quiet -e ".[webshop,serve]"
