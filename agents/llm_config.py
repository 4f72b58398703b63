"""The settings of the LLM agents: the endpoint and sampling of :class:`~agents.openai_agent.OpenAIChatAgent`,
the model and sampling of :class:`~agents.transformers_agent.TransformersAgent`.

They are the ``openai`` and ``transformers`` sections of ``progpo eval``'s config
(:class:`agents.evaluate.EvalConfig`: ``progpo eval openai.max_retries=2``), so they live apart from the
agents: a config names them without importing openai or torch.

Example:
    >>> OpenAIConfig(model="policy", base_url="http://127.0.0.1:8000/v1").timeout_s
    60.0
"""

from __future__ import annotations

import dataclasses
from typing import Any

from progpo_base.config import documented_field


@dataclasses.dataclass
class OpenAIConfig:
    """How to reach and sample from an OpenAI-compatible endpoint."""

    model: str = documented_field("", "model name as the server knows it (openai)")
    base_url: str | None = documented_field(
        None, "OpenAI-compatible endpoint root, e.g. http://127.0.0.1:8000/v1 (unset: api.openai.com)"
    )
    api_key_env: str = documented_field(
        "OPENAI_API_KEY", "environment variable with the API key (unset: EMPTY, which a local vLLM accepts)"
    )
    concurrency: int = documented_field(
        32,
        "requests in flight at once (32 keeps a local vLLM server's batch full; progpo eval plays as many "
        "episodes at once by default)",
    )
    timeout_s: float = documented_field(
        60.0,
        "seconds one request may take in all, a wall-clock deadline (not a per-read timeout); then it is "
        "retried",
    )
    max_retries: int = documented_field(
        5, "retries after the first attempt, for 429/5xx/timeouts/connection errors"
    )
    backoff_s: float = documented_field(
        0.5, "first backoff; doubles each retry (plus up to 25% jitter), capped at max_backoff_s"
    )
    max_backoff_s: float = documented_field(30.0, "longest single wait between retries")
    temperature: float = documented_field(0.0, "sampling temperature (0: greedy)")
    top_p: float = documented_field(1.0, "nucleus sampling mass")
    max_tokens: int = documented_field(512, "completion tokens per step")
    send_seed: bool = documented_field(
        True, "send a per-request seed (fixed by task and step) for reproducible sampling where supported"
    )
    extra_body: dict[str, Any] = documented_field(
        {}, "extra JSON fields (vLLM's top_k, repetition_penalty, ...)"
    )


@dataclasses.dataclass
class TransformersConfig:
    """Which local causal LM to load and how to sample from it."""

    model_path: str = documented_field(
        "",
        "a folder written by save_pretrained (model + tokenizer with a chat template), or a hub id already "
        "in the local Hugging Face cache (transformers)",
    )
    device: str | None = documented_field(
        None, "torch device: cpu, cuda, cuda:1, ... (unset: CUDA when available)"
    )
    dtype: str = documented_field("auto", "auto | float32 | bfloat16 | float16")
    batch_size: int = documented_field(
        8, "rows generated together (one forward pass per step); guided: candidate answers scored together"
    )
    threads: int | None = documented_field(
        None,
        "torch CPU threads (unset: half the CPUs this process may use, at least 1; on a small or busy "
        "machine 1 decodes fastest)",
    )
    temperature: float = documented_field(0.0, "sampling temperature (0: greedy)")
    top_p: float = documented_field(1.0, "nucleus sampling mass")
    max_new_tokens: int = documented_field(512, "completion tokens per step")
    max_prompt_tokens: int = documented_field(
        4096, "prompts longer than this are cut from the left (keeps the latest text)"
    )
