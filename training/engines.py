"""Generation engines: what rollouts sample responses with (:class:`GenerationEngine`), and the in-process
transformers engine (:class:`TransformersEngine`); the vLLM engine is :mod:`training.vllm_engine`.

An engine takes a batch of prompts (token ids) and returns one sampled response per prompt with the per-token
log-probs of the sampling distribution (:class:`training.sampling.SampleOutput`), optionally constrained to a
list of candidate responses per prompt (:mod:`training.constrained`).

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    >>> engine = TransformersEngine(model, stop_token_ids=[1], pad_token_id=0)
    >>> out = engine.generate([[2, 3, 4]], temperature=1.0, max_new_tokens=3,
    ...                       generator=torch.Generator().manual_seed(0))
    >>> len(out.token_ids[0]) == len(out.logprobs[0]) <= 3
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from training.policy import compute_context
from training.sampling import SampleOutput, sample_responses
from training.weight_sync import stream_weights


class GenerationEngine(Protocol):
    """What rollouts need from a sampler (transformers in-process, or vLLM)."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        temperature: float,
        max_new_tokens: int,
        generator: torch.Generator | None,
        candidates: Sequence[Sequence[Sequence[int]]] | None = None,
    ) -> SampleOutput:
        """One sampled response per prompt, with per-token log-probs (constrained to ``candidates`` per
        prompt when given: :mod:`training.constrained`)."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load the trained ``model``'s current weights (:func:`training.weight_sync.stream_weights`: one
        tensor at a time; under FSDP2 a collective every rank runs)."""


class TransformersEngine:
    """Samples with a transformers model in this process (the trainer's own model, or a rollout copy).

    Args:
        model: The causal LM to sample from.
        stop_token_ids: Tokens that end a response.
        pad_token_id: Padding id.
        top_p: Nucleus threshold.
        batch_size: Sequences decoded together.
        compute_dtype: Autocast dtype of the decoding passes over the model's (fp32 master) weights, the
            trainer's ``model.compute_dtype``; float32 = no autocast.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        stop_token_ids: Sequence[int],
        pad_token_id: int,
        top_p: float = 1.0,
        batch_size: int = 64,
        compute_dtype: torch.dtype = torch.float32,
    ):
        self.model = model
        self.compute_dtype = compute_dtype
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.top_p = top_p
        self.batch_size = batch_size

    def generate(self, prompts, *, temperature, max_new_tokens, generator, candidates=None):
        """See :class:`GenerationEngine`."""
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        try:
            with compute_context(device, self.compute_dtype):
                return sample_responses(
                    self.model,
                    prompts,
                    max_new_tokens=max_new_tokens,
                    stop_token_ids=self.stop_token_ids,
                    pad_token_id=self.pad_token_id,
                    temperature=temperature,
                    top_p=self.top_p,
                    generator=generator,
                    batch_size=self.batch_size,
                    candidates=candidates,
                )
        finally:
            self.model.train(was_training)

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy the trained ``model``'s weights into this engine's model (a rollout copy), tensor by tensor
        in its dtype; a sampler that *is* the trained model needs no sync."""
        own = self.model.state_dict()
        dtype = next(self.model.parameters()).dtype
        for name, tensor in stream_weights(model, dtype):
            own[name].copy_(tensor)
