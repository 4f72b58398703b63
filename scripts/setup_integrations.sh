#!/usr/bin/env bash
# Set up (or update) the trainers' own clients, each in its own venv (used by .ci/run_integrations and
# benchmarks/bench_integrations.py; docs/hosting.md, "Trainers").
#
#   scripts/setup_integrations.sh            # both
#   scripts/setup_integrations.sh skyrl      # or one: skyrl, verifiers
#
# * .venv-skyrl: PyPI's skyrl-gym (SkyRL's env API and registry) and the project's .venv through a .pth file
#   (site.addsitedir, as scripts/setup_verl.sh does): agents.skyrl registers our envs with skyrl_gym and plays
#   them through agents.hosted, so it needs the project; skyrl-gym's own requirements are small and pinned.
# * .venv-verifiers: PyPI's verifiers with its openenv extra, and our verifiers environment package
#   (integrations/verifiers, installed editable) with nothing of the project: it is what a verifiers or
#   prime-rl user installs. verifiers 0.4.0 pins mcp==2.0.0, which openenv 0.10.0 (the project's) refuses, so
#   its extra resolves openenv 0.4.1, whose client plays our 0.10.0 server. uv runs verifiers' chat program
#   (its `null` harness) and is installed here, pinned, so verifiers never downloads one.
# Idempotent: a second run reinstalls nothing that is already right.
set -euo pipefail
cd "$(dirname "$0")/.."

SKYRL_PINS=("skyrl-gym==0.4.0" "func-timeout==4.3.5")
VERIFIERS_PINS=("verifiers[openenv]==0.4.0" "uv==0.13.9")
which=("${@:-skyrl verifiers}")
read -r -a which <<<"${which[*]}"

[ -x .venv/bin/python ] || scripts/setup.sh --dev
base_python=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')

make_venv() {  # folder
  [ -x "$1/bin/python" ] || "$base_python" -m venv "$1"
}

installed() {  # venv, distribution, version
  "$1/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$2') != '$3')" 2>/dev/null
}

setup_skyrl() {
  local venv=.venv-skyrl
  make_venv "$venv"
  local main_site own_site
  main_site=$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')
  own_site=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
  echo "import site; site.addsitedir('$main_site')" >"$own_site/progpo-main-venv.pth"
  if ! installed "$venv" skyrl-gym 0.4.0; then
    echo "[setup-integrations] installing ${SKYRL_PINS[*]} into $venv"
    "$venv/bin/python" -m pip install --quiet "${SKYRL_PINS[@]}"
  fi
  "$venv/bin/python" -c "import importlib.metadata as m, agents.skyrl, skyrl_gym; \
print('[setup-integrations] skyrl-gym', m.version('skyrl-gym'), 'ready in $venv:', \
', '.join(sorted(agents.skyrl.ENV_CLASSES)))"
}

setup_verifiers() {
  local venv=.venv-verifiers
  make_venv "$venv"
  if ! installed "$venv" verifiers 0.4.0 || ! installed "$venv" uv 0.13.9; then
    echo "[setup-integrations] installing ${VERIFIERS_PINS[*]} into $venv (a few minutes)"
    "$venv/bin/python" -m pip install --quiet "${VERIFIERS_PINS[@]}"
  fi
  if ! installed "$venv" progpo-verifiers 0.1.0; then
    "$venv/bin/python" -m pip install --quiet --no-deps -e integrations/verifiers
  fi
  "$venv/bin/python" -c "import importlib.metadata as m, progpo_verifiers; \
print('[setup-integrations] verifiers', m.version('verifiers'), '+ openenv', m.version('openenv'), \
'ready in $venv, with progpo_verifiers', m.version('progpo-verifiers'))"
}

for client in "${which[@]}"; do
  case "$client" in
    skyrl) setup_skyrl ;;
    verifiers) setup_verifiers ;;
    *)
      echo "usage: scripts/setup_integrations.sh [skyrl] [verifiers]" >&2
      exit 2
      ;;
  esac
done
