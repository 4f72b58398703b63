#!/usr/bin/env bash
# Entry point of the env-server services (ALFWorld, WebShop env): prepare the env's data, then `progpo serve`.
# The containers run it, and CI runs it directly (no Docker) to start the same service the same way.
#
# Environment (defaults in brackets):
#   PROGPO_PROTOCOL       native (the env server's API and AgentGym's) or openenv (OpenEnv's server) [native]
#   PROGPO_ENV            env id to host [progpo/ALFWorld-v0]
#   PROGPO_ENV_KWARGS     JSON object of constructor kwargs fixed by the operator [{}]
#   PROGPO_HOST           address to bind [127.0.0.1: the servers have no authentication; the containers set
#                         0.0.0.0, their own network namespace, published on the host's 127.0.0.1 only]
#   PROGPO_PORT           port [8000]
#   PROGPO_WORKERS        env worker processes [2]
#   PROGPO_THREADS        HTTP threads [48]
#   PROGPO_MAX_INSTANCES  live instances at most, then 429 [1024]
#   PROGPO_IDLE_TIMEOUT   seconds before an idle instance expires [600]
#   PROGPO_AGENTGYM       env served through AgentGym's protocol at the root: auto|none|ENV_ID [auto]
#   PROGPO_CACHE          generated games, catalogs and search indexes [~/.cache/progpo]
#   ALFWORLD_DATA         real ALFWorld data (folder containing json_2.1.1/) [unset: generated games]
#   WEBSHOP_DATA          real WebShop files [unset: generated catalog]
set -euo pipefail
# shellcheck source=docker/common.sh
source "$(dirname "$0")/common.sh"

ENV_ID=${PROGPO_ENV:-progpo/ALFWorld-v0}
ENV_KWARGS=${PROGPO_ENV_KWARGS:-"{}"}

"$PROGPO_PYTHON" docker/prepare.py env "$ENV_ID" "$ENV_KWARGS"
exec "$PROGPO_PYTHON" -m progpo.cli serve \
  --protocol "${PROGPO_PROTOCOL:-native}" \
  --env "$ENV_ID" \
  --env-kwargs "$ENV_ID=$ENV_KWARGS" \
  --host "${PROGPO_HOST:-127.0.0.1}" \
  --port "${PROGPO_PORT:-8000}" \
  --workers "${PROGPO_WORKERS:-2}" \
  --threads "${PROGPO_THREADS:-48}" \
  --max-instances "${PROGPO_MAX_INSTANCES:-1024}" \
  --idle-timeout "${PROGPO_IDLE_TIMEOUT:-600}" \
  --agentgym "${PROGPO_AGENTGYM:-auto}" \
  ${PROGPO_AGENTGYM_MAPPINGS:+--agentgym-mappings "$PROGPO_AGENTGYM_MAPPINGS"}
