"""The sampler's data (requests, results, outputs) and the trainer-side forward that matches its log-probs.

Both sides compute token log-probs as ``log_softmax(logits / temperature)`` over left-padded batches with
``position_ids = cumsum(attention_mask) - 1``, so a sequence gets the same positions in the sampler (prompt +
cache: :mod:`training.decoding`) and in the trainer (one forward over prompt + response). That is what makes
the first PPO ratio exactly 1 up to floating-point noise (tested in ``tests/training/test_sampling.py``). verl
computes "old" log-probs with a second forward pass; we record them at sampling time and *check* them against
the trainer's forward instead.

Example:
    >>> packed = pack_sequences([[5, 6, 7], [8]], [[1, 2], [3]], pad_token_id=0)
    >>> packed.input_ids.tolist(), packed.response_mask.tolist()
    ([[5, 6, 7, 1, 2], [0, 0, 8, 3, 0]], [[1, 1], [1, 0]])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch.utils.checkpoint import checkpoint

from training.constrained import (
    allowed_index_tensor,
    allowed_token_sets,
    constrained_logprobs_and_entropy,
)

#: Response positions whose vocabulary-sized logits exist at once in :func:`policy_logprobs_and_entropy`
#: (``optim.logit_chunk_tokens``): 1024 x 151,936 fp32 logits of Qwen2.5 are 0.6 GB a copy.
DEFAULT_LOGIT_CHUNK_TOKENS = 1024


@dataclasses.dataclass
class SampleRequest:
    """One response to sample (an engine's unit of work: :mod:`training.engines`).

    Attributes:
        prompt: Prompt token ids (no padding).
        seed: The request's own sampling seed (:func:`training.seeds.request_seed`): its draws depend on it
            alone, not on the other requests sampled with it.
        temperature: Logits are divided by it (also for the recorded log-probs).
        max_new_tokens: Response length limit (a constrained response may run to its longest candidate).
        candidates: Constrained decoding: the token sequences the response must be one of (None: free text).
    """

    prompt: list[int]
    seed: int
    temperature: float
    max_new_tokens: int
    candidates: list[list[int]] | None = None


@dataclasses.dataclass
class SampleResult:
    """A sampled response.

    Attributes:
        request_id: The id the engine gave the request when it was added.
        token_ids: Response token ids (including the stop token when one was sampled).
        logprobs: Log-probability of each response token (see :class:`SampleOutput`).
        finished: Whether the response ended with a stop token or a complete candidate.
        policy_version: The version of the weights that sampled it, when the engine keeps one
            (:class:`training.engine_loop.EngineLoop`; -1 otherwise).
    """

    request_id: int
    token_ids: list[int]
    logprobs: list[float]
    finished: bool
    policy_version: int = -1


@dataclasses.dataclass
class SampleOutput:
    """Sampled responses, one per prompt.

    Attributes:
        token_ids: Response token ids (including the stop token when one was sampled).
        logprobs: Log-probability of each response token under ``softmax(logits / temperature)``.
        finished: Whether the response ended with a stop token (else it hit ``max_new_tokens``).
    """

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    finished: list[bool]


def left_pad(
    sequences: Sequence[Sequence[int]], pad_token_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ``(input_ids, attention_mask)`` of shape ``(B, T)``."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids.to(device), mask.to(device)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 at each row's first real token (padding gets 0)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def output_projection(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.Tensor] | None:
    """``(decoder, weight)`` when the model's logits are ``decoder(...).last_hidden_state @ weight.T``, else
    None.

    Constrained rows need the logits of a few allowed tokens only; computing just those rows of the output
    layer instead of the whole vocabulary (65,536 logits a token in the quickstart, 151,936 for Qwen2.5) is
    most of the cost of a tiny model's forward and backward. Not available for FSDP2-sharded models (their
    root parameters are gathered only inside ``forward``) or heads that are not a plain bias-free linear
    layer with no logit post-processing; those compute the full logits and gather.
    """
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return None
    base = _plain_head_base(model)
    return None if base is None else (base.get_decoder(), base.get_output_embeddings().weight)


def _plain_head_base(model: torch.nn.Module) -> torch.nn.Module | None:
    """The transformers model under a peft wrapper when its logits are ``decoder(...) @ head.weight.T``
    (a bias-free linear head, no logit post-processing), else None."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft (LoRA) wrapper
    if not (hasattr(base, "get_decoder") and hasattr(base, "get_output_embeddings")):
        return None
    head = base.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return None
    if getattr(base.config, "final_logit_softcapping", None):
        return None
    return base


def filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """``logits`` with the tokens outside the smallest set reaching probability ``top_p`` masked to -inf."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cumulative = sorted_logits.softmax(-1).cumsum(-1)
    drop = cumulative - sorted_logits.softmax(-1) > top_p  # keep the smallest prefix reaching top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


@dataclasses.dataclass
class PackedBatch:
    """Prompt + response sequences, left-padded, with the response tokens aligned at the right end.

    Attributes:
        input_ids: ``(B, T)`` prompt + response, left-padded.
        attention_mask: ``(B, T)``.
        response_mask: ``(B, R)`` 1 on real response tokens; ``R`` is the longest response. Response token
            ``j`` of every row is ``input_ids[:, T - R + j]`` (responses start together, shorter ones padded
            after).
        response_ids: ``(B, R)`` response token ids (pad where masked).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    response_ids: torch.Tensor


def pack_sequences(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_token_id: int,
    device: torch.device | str = "cpu",
) -> PackedBatch:
    """Pack rows as ``[pad..., prompt, response, pad...]`` with every response starting at column ``T - R``.

    Prompts are left-padded to a common width and responses right-padded to ``R``; position ids from the
    attention mask give each real token the same position as in the sampler, and the logits needed are only
    the last ``R + 1`` columns (``logits_to_keep``), which bounds memory for large vocabularies.
    """
    width = max(len(r) for r in responses) if responses else 0
    width = max(width, 1)
    prompt_ids, prompt_mask = left_pad(prompts, pad_token_id)
    resp = torch.full((len(responses), width), pad_token_id, dtype=torch.long)
    resp_mask = torch.zeros((len(responses), width), dtype=torch.long)
    for row, seq in enumerate(responses):
        if len(seq):
            resp[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
            resp_mask[row, : len(seq)] = 1
    return PackedBatch(
        input_ids=torch.cat([prompt_ids, resp], 1).to(device),
        attention_mask=torch.cat([prompt_mask, resp_mask], 1).to(device),
        response_mask=resp_mask.to(device),
        response_ids=resp.to(device),
    )


def _forward_inputs(batch: PackedBatch) -> dict[str, torch.Tensor | bool]:
    """Keyword arguments of one cache-free forward over a packed batch (the sampler's positions)."""
    return dict(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=positions_from_mask(batch.attention_mask),
        use_cache=False,
    )


def response_logits(model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0) -> torch.Tensor:
    """Tempered logits ``(B, R, V)`` predicting each response token (one forward over prompt + response)."""
    width = batch.response_ids.shape[1]
    logits = model(**_forward_inputs(batch), logits_to_keep=width + 1).logits
    return logits[:, :-1, :].float() / temperature


def token_logprobs_and_entropy(
    logits: torch.Tensor, token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``(log p(token), entropy)`` from logits ``(B, R, V)`` and token ids ``(B, R)``."""
    log_dist = torch.log_softmax(logits, dim=-1)
    logprobs = log_dist.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_dist.exp() * log_dist).sum(-1)
    return logprobs, entropy


def allowed_logits(
    model: torch.nn.Module, batch: PackedBatch, index: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Tempered logits ``(B, R, K)`` of the tokens ``index`` (``(B, R, K)``) at each response position.

    Equal to ``response_logits(...).gather(-1, index)``; with an :func:`output_projection` only the output
    rows of the tokens in ``index`` are computed.
    """
    projection = output_projection(model)
    if projection is None:
        return response_logits(model, batch, temperature).gather(-1, index)
    decoder, weight = projection
    width = batch.response_ids.shape[1]
    hidden = decoder(**_forward_inputs(batch)).last_hidden_state[:, -(width + 1) : -1, :]
    vocab, column = torch.unique(index, return_inverse=True)
    return (hidden @ weight[vocab].T).float().gather(-1, column) / temperature


def _constrained_allowed(batch: PackedBatch, responses, choices) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The allowed-token index and mask of constrained rows; None for free-text rows."""
    if not any(choices):
        return None
    if not all(choices):
        raise ValueError("a batch mixes constrained and free-text rows")
    allowed = [allowed_token_sets(c, r) for c, r in zip(choices, responses, strict=True)]
    return allowed_index_tensor(allowed, batch.response_ids.shape[1], batch.response_ids.device)


def response_hidden_states(
    model: torch.nn.Module, batch: PackedBatch
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(hidden, weight)``: the decoder's last hidden states ``(B, R, H)`` at the positions predicting each
    response token, and the output weight ``(V, H)``, so the response logits are ``hidden @ weight.T``; None
    when the head is not a plain linear layer (see :func:`output_projection`).

    An FSDP2-sharded model runs its own forward (its root gathers the embeddings and the output layer only
    inside it) with one logit kept, a hook catching the decoder's output; the output weight is then the
    gathered one, which :func:`training.distributed.shard_model` keeps gathered after the root's forward, so
    gradients through it reach FSDP2's reduce-scatter like those of the model's own head.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    width = batch.response_ids.shape[1]
    projection = output_projection(model)
    if projection is not None:
        decoder, weight = projection
        hidden = decoder(**_forward_inputs(batch)).last_hidden_state
        return hidden[:, -(width + 1) : -1, :], weight
    base = _plain_head_base(model) if isinstance(model, FSDPModule) else None
    if base is None:
        return None
    caught: dict[str, torch.Tensor] = {}
    hook = base.get_decoder().register_forward_hook(
        lambda module, args, output: caught.__setitem__("hidden", output.last_hidden_state)
    )
    try:
        model(**_forward_inputs(batch), logits_to_keep=1)
    finally:
        hook.remove()
    weight = base.get_output_embeddings().weight
    if isinstance(weight, DTensor):
        raise RuntimeError(
            "the FSDP2 root resharded its output layer after forward: shard it with "
            "training.distributed.shard_model (reshard_after_forward=False on the root)"
        )
    return caught["hidden"][:, -(width + 1) : -1, :], weight


def _chunk_logprobs_and_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, token_ids: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log p, entropy)`` of ``token_ids`` (``(C,)``) from hidden states ``(C, H)``: the chunk's logits
    ``(C, V)`` exist only inside this function."""
    logits = (hidden @ weight.T).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_dist = torch.log_softmax(logits, dim=-1)
    logprobs = log_dist.gather(-1, token_ids[:, None]).squeeze(-1)
    return logprobs, -(log_dist.exp() * log_dist).sum(-1)


def _chunk_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, token_ids: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Only the log-probs of :func:`_chunk_logprobs_and_entropy`."""
    logits = (hidden @ weight.T).float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, token_ids[:, None]).squeeze(-1)


def chunked_logprobs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_LOGIT_CHUNK_TOKENS,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token ``(log p, entropy)`` ``(B, R)`` of ``softmax(hidden @ weight.T / temperature)``, computed
    over ``chunk_tokens`` positions at a time.

    Each chunk's fp32 logits ``(chunk, V)`` are made inside a checkpointed function (recomputed in backward),
    so forward and backward hold one chunk's vocabulary-sized tensors at a time instead of ``B x R x V``
    (Liger-Kernel's and verl's chunked/fused cross-entropy bound memory the same way). The values are the
    unchunked ones (each position's softmax is its own).

    Args:
        hidden: ``(B, R, H)`` decoder hidden states predicting each token.
        weight: ``(V, H)`` output layer weight.
        token_ids: ``(B, R)`` the tokens whose log-probs are wanted.
        temperature: logits are divided by it.
        chunk_tokens: positions per chunk; 0 = all at once.
        with_entropy: also return the entropy (else None: one vocabulary-sized pass less).

    Example:
        >>> hidden, weight = torch.randn(2, 3, 8), torch.randn(50, 8)
        >>> ids = torch.randint(50, (2, 3))
        >>> logprobs, entropy = chunked_logprobs_and_entropy(hidden, weight, ids, chunk_tokens=4)
        >>> full, _ = token_logprobs_and_entropy(hidden @ weight.T, ids)
        >>> torch.allclose(logprobs, full, atol=1e-6), tuple(entropy.shape)
        (True, (2, 3))
    """
    rows, width = token_ids.shape
    flat_hidden = hidden.reshape(rows * width, hidden.shape[-1])
    flat_ids = token_ids.reshape(-1)
    size = chunk_tokens if chunk_tokens > 0 else max(flat_ids.numel(), 1)
    fn = _chunk_logprobs_and_entropy if with_entropy else _chunk_logprobs
    outputs = []
    for start in range(0, flat_ids.numel(), size):
        args = (flat_hidden[start : start + size], weight, flat_ids[start : start + size], temperature)
        if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
            outputs.append(checkpoint(fn, *args, use_reentrant=False))
        else:
            outputs.append(fn(*args))
    if with_entropy:
        logprobs = torch.cat([lp for lp, _ in outputs]).reshape(rows, width)
        return logprobs, torch.cat([ent for _, ent in outputs]).reshape(rows, width)
    return torch.cat(outputs).reshape(rows, width), None


def _free_text_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    hidden_weight = response_hidden_states(model, batch)
    if hidden_weight is None:  # a head that is not a plain linear layer: the full logits
        logits = response_logits(model, batch, temperature)
        if with_entropy:
            return token_logprobs_and_entropy(logits, batch.response_ids)
        return torch.log_softmax(logits, -1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1), None
    hidden, weight = hidden_weight
    return chunked_logprobs_and_entropy(
        hidden, weight, batch.response_ids, temperature, chunk_tokens, with_entropy
    )


def policy_logprobs_and_entropy(
    model: torch.nn.Module,
    batch: PackedBatch,
    responses: Sequence[Sequence[int]],
    choices: Sequence[Sequence[Sequence[int]]],
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_LOGIT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``(log p, entropy)`` of the policy that sampled the rows (one forward of ``model``): the
    plain tempered softmax, or for constrained rows (non-empty ``choices``) the softmax renormalised over the
    allowed tokens.

    Free-text rows go through :func:`chunked_logprobs_and_entropy` (``chunk_tokens`` positions' logits at a
    time, ``optim.logit_chunk_tokens``); constrained rows need only the allowed tokens' logits."""
    constrained = _constrained_allowed(batch, responses, choices)
    if constrained is None:
        return _free_text_logprobs(model, batch, temperature, chunk_tokens, with_entropy=True)
    index, valid = constrained
    return constrained_logprobs_and_entropy(
        allowed_logits(model, batch, index, temperature), index, valid, batch.response_ids
    )


def policy_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    responses: Sequence[Sequence[int]],
    choices: Sequence[Sequence[Sequence[int]]],
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_LOGIT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Only the log-probs of :func:`policy_logprobs_and_entropy`, without the entropy pass over the vocabulary
    (the KL reference and the warm start need no entropy)."""
    if not any(choices):
        return _free_text_logprobs(model, batch, temperature, chunk_tokens, with_entropy=False)[0]
    return policy_logprobs_and_entropy(model, batch, responses, choices, temperature)[0]
