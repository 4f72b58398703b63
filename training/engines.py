"""Generation engines: what rollouts sample responses with (:class:`GenerationEngine`), and the in-process
transformers engine (:class:`TransformersEngine`); the vLLM engine is :mod:`training.vllm_engine`.

An engine batches requests continuously: :meth:`~GenerationEngine.add_request` queues a
:class:`~training.sampling.SampleRequest` (prompt token ids, its own seed, temperature, length limit and,
optionally, candidate responses: :mod:`training.constrained`), and each :meth:`~GenerationEngine.step` runs
one decode step over every request in flight and returns those that ended. The lock-step rollout calls
:meth:`~GenerationEngine.generate` once per turn (all the turn's prompts, :func:`run_requests`); per-episode
rollouts add each episode's request as its last env step returns (:class:`training.engine_loop.EngineLoop`).
A response depends on its prompt and its seed only, not on the requests it was batched with.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    >>> engine = TransformersEngine(model, stop_token_ids=[1], pad_token_id=0)
    >>> out = engine.generate([[2, 3, 4]], temperature=1.0, max_new_tokens=3, seeds=[0])
    >>> len(out.token_ids[0]) == len(out.logprobs[0]) <= 3
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from training.decoding import DecodeBatch, collect_results, requests_for
from training.policy import compute_context
from training.sampling import SampleOutput, SampleRequest, SampleResult
from training.weight_sync import stream_weights


class GenerationEngine(Protocol):
    """What rollouts need from a sampler (transformers in-process, or vLLM)."""

    def add_request(self, request: SampleRequest) -> int:
        """Queue ``request``; returns its id (its result's ``request_id``)."""

    def step(self) -> list[SampleResult]:
        """One decode step over the requests in flight (admitting queued ones); the results of those that
        ended."""

    def has_unfinished(self) -> bool:
        """Whether requests are queued or being decoded."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        temperature: float,
        max_new_tokens: int,
        seeds: Sequence[int],
        candidates: Sequence[Sequence[Sequence[int]]] | None = None,
    ) -> SampleOutput:
        """One sampled response per prompt (prompt ``k`` from ``seeds[k]``), with per-token log-probs
        (constrained to ``candidates`` per prompt when given: :mod:`training.constrained`), in prompt
        order."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load the trained ``model``'s current weights (:func:`training.weight_sync.stream_weights`: one
        tensor at a time; under FSDP2 a collective every rank runs)."""


def run_requests(engine: GenerationEngine, requests: Sequence[SampleRequest]) -> SampleOutput:
    """Add ``requests`` to an idle ``engine`` and step it until they all ended; their responses in order.

    Raises:
        RuntimeError: When the engine already had requests in flight (their results would be lost here).
    """
    if engine.has_unfinished():
        raise RuntimeError("a lock-step generate on an engine with requests in flight")
    ids = [engine.add_request(request) for request in requests]
    results = []
    while engine.has_unfinished():
        results += engine.step()
    return collect_results(results, ids)


class OneRequestPerPrompt:
    """:meth:`GenerationEngine.generate` as one request per prompt (:func:`training.decoding.requests_for`),
    answered in order by :meth:`answer`: an engine stepped until they all ended (:class:`SteppedEngine`), or
    the engine loop they join (:class:`training.engine_loop.EngineLoop`)."""

    def generate(self, prompts, *, temperature, max_new_tokens, seeds, candidates=None):
        """See :class:`GenerationEngine`."""
        requests = requests_for(
            prompts,
            seeds=seeds,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            candidates=candidates,
        )
        return self.answer(requests)

    def answer(self, requests: Sequence[SampleRequest]) -> SampleOutput:
        """The responses to ``requests``, in their order."""
        raise NotImplementedError


class SteppedEngine(OneRequestPerPrompt):
    """The lock-step :meth:`GenerationEngine.generate` of an engine that queues and steps its own requests
    (:class:`TransformersEngine`, :class:`training.vllm_engine.VLLMEngine`): the requests are added to the
    idle engine and stepped until they all ended (:func:`run_requests`)."""

    def answer(self, requests: Sequence[SampleRequest]) -> SampleOutput:
        return run_requests(self, requests)


class TransformersEngine(SteppedEngine):
    """Samples with a transformers model in this process (the trainer's own model, or a rollout copy), in a
    continuously batched KV-cached decoder (:class:`training.decoding.DecodeBatch`).

    Args:
        model: The causal LM to sample from.
        stop_token_ids: Tokens that end a response.
        pad_token_id: Padding id.
        top_p: Nucleus threshold.
        batch_size: Sequences decoded together at most.
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
        self.batch = DecodeBatch(model, stop_token_ids, pad_token_id, top_p=top_p, capacity=batch_size)

    def add_request(self, request: SampleRequest) -> int:
        """See :class:`GenerationEngine`."""
        return self.batch.add(request)

    def has_unfinished(self) -> bool:
        """See :class:`GenerationEngine`."""
        return self.batch.has_work()

    def step(self) -> list[SampleResult]:
        """See :class:`GenerationEngine` (the model in eval mode and the compute dtype for the step)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with compute_context(self.batch.device, self.compute_dtype):
                return self.batch.step()
        finally:
            self.model.train(was_training)

    @property
    def decode_steps(self) -> tuple[int, int]:
        """``(decode steps, rows decoded summed over them)`` so far (the batch's fill is their ratio)."""
        return self.batch.steps, self.batch.row_steps

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy the trained ``model``'s weights into this engine's model (a rollout copy), tensor by tensor
        in its dtype; a sampler that *is* the trained model needs no sync."""
        own = self.model.state_dict()
        dtype = next(self.model.parameters()).dtype
        for name, tensor in stream_weights(model, dtype):
            own[name].copy_(tensor)
