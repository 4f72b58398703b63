#!/usr/bin/env bash
# Entry point of the optional `llm` profile: vLLM's OpenAI-compatible server for a model the user mounts at
# $VLLM_MODEL (a Hugging Face-format folder; nothing is downloaded). `progpo eval` then talks to it with
# --base-url http://<host>:${VLLM_PORT}/v1.
#
# Environment: VLLM_MODEL [/model], VLLM_SERVED_NAME [policy], VLLM_PORT [8002], VLLM_EXTRA_ARGS [""].
set -euo pipefail
MODEL=${VLLM_MODEL:-/model}
if [ ! -f "$MODEL/config.json" ]; then
  echo "serve-vllm: no model at $MODEL (mount a Hugging Face-format model folder there)" >&2
  exit 2
fi
export HF_HUB_OFFLINE=1
# shellcheck disable=SC2086  # VLLM_EXTRA_ARGS is a list of flags
exec vllm serve "$MODEL" --served-model-name "${VLLM_SERVED_NAME:-policy}" --host 0.0.0.0 \
  --port "${VLLM_PORT:-8002}" --generation-config vllm ${VLLM_EXTRA_ARGS:-}
