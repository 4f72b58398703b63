#!/usr/bin/env bash
# Entry point of the WebShop site + session API service: build (or reuse) the catalog and search index, then
# `progpo webshop serve`. The container runs it, and CI runs it directly (no Docker).
#
# Environment (defaults in brackets):
#   WEBSHOP_HOST           address to bind [127.0.0.1: no authentication; the container sets 0.0.0.0, its own
#                          network namespace, published on the host's 127.0.0.1 only]
#   WEBSHOP_PORT           port [3000]
#   WEBSHOP_NUM_PRODUCTS   generated catalog size [1000]
#   WEBSHOP_SEED           catalog generation seed [0]
#   WEBSHOP_THREADS        server threads [8]
#   WEBSHOP_MAX_SESSIONS   live sessions at most [10000]
#   WEBSHOP_IDLE_TIMEOUT   seconds before an idle session expires [1800]
#   WEBSHOP_DATA           real WebShop files to serve instead of the generated catalog [unset]
#   PROGPO_CACHE           generated catalogs and search indexes [~/.cache/progpo]
set -euo pipefail
# shellcheck source=docker/common.sh
source "$(dirname "$0")/common.sh"

NUM_PRODUCTS=${WEBSHOP_NUM_PRODUCTS:-1000}
SEED=${WEBSHOP_SEED:-0}

"$PROGPO_PYTHON" docker/prepare.py webshop "$NUM_PRODUCTS" "$SEED"
exec "$PROGPO_PYTHON" -m progpo.cli webshop serve \
  --host "${WEBSHOP_HOST:-127.0.0.1}" \
  --port "${WEBSHOP_PORT:-3000}" \
  --num-products "$NUM_PRODUCTS" \
  --seed "$SEED" \
  --workers "${WEBSHOP_THREADS:-8}" \
  --max-sessions "${WEBSHOP_MAX_SESSIONS:-10000}" \
  --idle-timeout "${WEBSHOP_IDLE_TIMEOUT:-1800}"
