"""The run's sampler: which generation engine a training run samples with, over which weights, and whether it
runs in an engine loop (``rollout.engine``, ``rollout.mode``)."""

from __future__ import annotations

from pathlib import Path

import torch

from training.config import TrainConfig
from training.engine_loop import EngineLoop
from training.engines import GenerationEngine, TransformersEngine
from training.policy import Policy, load_reference


def samples_from_a_copy(config: TrainConfig, *, torchrun: bool) -> bool:
    """Whether the run's sampler holds its own copy of the weights, which every update syncs: with vLLM, under
    ``torchrun`` (FSDP2's shards cannot decode alone) and when rollouts overlap the update
    (``rollout.mode=async`` with ``rollout.max_staleness`` ≥ 1: they must not sample from weights the
    optimizer is changing). Otherwise, on one process with the transformers engine, it is the trained model
    itself."""
    overlapped = config.rollout.mode == "async" and config.rollout.max_staleness > 0
    return torchrun or config.rollout.engine == "vllm" or overlapped


def make_sampler(
    config: TrainConfig,
    policy: Policy,
    policy_path: Path,
    device: torch.device,
    compute_dtype: torch.dtype,
    *,
    copy: bool,
    torchrun: bool,
) -> GenerationEngine | EngineLoop:
    """The run's sampler (``rollout.engine``): a vLLM engine of the policy at ``policy_path`` on this
    process's device (:mod:`training.vllm_engine`), or the transformers engine over the trained model itself,
    or with ``copy`` over a plain copy in the compute dtype (FSDP2's shards cannot decode alone; rollouts that
    overlap the update must not sample from weights the optimizer is changing). With ``rollout.mode=async``
    it runs in an :class:`~training.engine_loop.EngineLoop`, which every caller (per-episode rollouts,
    evaluations) shares."""
    cfg = config.rollout
    if cfg.engine == "vllm":
        from training.vllm_engine import VLLMEngine  # vLLM is optional

        engine = VLLMEngine(
            str(policy_path),
            policy.tokenizer,
            top_p=cfg.top_p,
            seed=config.seed,
            dtype=config.model.compute_dtype,
            max_model_len=cfg.max_prompt_tokens + cfg.max_new_tokens,
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            enforce_eager=cfg.vllm_enforce_eager,
            torchrun=torchrun,
        )
    else:
        model = load_reference(policy_path, device, config.model.compute_dtype) if copy else policy.model
        engine = TransformersEngine(
            model,
            policy.stop_token_ids,
            policy.tokenizer.pad_token_id,
            top_p=cfg.top_p,
            batch_size=cfg.sample_batch_size,
            compute_dtype=compute_dtype,
        )
    return EngineLoop(engine, device=device) if cfg.mode == "async" else engine
