"""KV-cached decoding with continuous batching: requests join the batch between decode steps and leave it as
soon as they end (:class:`DecodeBatch`), each sampled from its own seed.

A :class:`~training.sampling.SampleRequest` is a prompt (token ids), its seed, temperature, length limit and,
with constrained decoding, its candidate responses (:mod:`training.constrained`). :meth:`DecodeBatch.step`
runs one decode step for every row in the batch, first admitting queued requests into free rows (their
prompts are prefilled together in a second forward and their KV cache is merged into the batch's), samples
one token per row, and retires the rows that ended (a stop token, a complete candidate, or the length limit),
returning their :class:`~training.sampling.SampleResult`. A finished row is never decoded as padding, and a
new request starts at the next step rather than after the whole batch: the lock-step engine call
(:func:`sample_responses`, all requests at once) and the per-episode rollouts (requests arriving one by one,
:mod:`training.engine_loop`) drive the same batch.

Rows are left-padded to a common width with ``position_ids = cumsum(attention_mask) - 1``, the layout the
trainer's forward uses (:mod:`training.sampling`), so a row's log-probs do not depend on its neighbours
beyond floating-point rounding. Merging a prefilled group of rows left-pads whichever cache is narrower; a
retired row's columns go, and columns no row uses any more are trimmed.

Per-request sampling. Each request draws its tokens by inverse-CDF sampling from its own stream of uniforms
(numpy's PCG64 seeded with the request's seed: the same numbers on every machine and device): token ``t`` is
the first whose cumulative probability exceeds ``u_t``. A response therefore depends on its prompt, its seed
and the model only — not on which other requests share its batch, how many rows the batch holds, or the
world size — which is what makes per-episode rollouts reproduce the lock-step ones
(``tests/training/test_async_rollout.py``). (One generator shared by a batch cannot: ``torch.multinomial``
draws ``rows × vocabulary`` numbers per step from it, so a row's draw depends on every other row in the
batch and on the length of every earlier call.) The recorded log-prob of each token is that of the
tempered distribution (renormalised over the allowed tokens when constrained), as before.

Why not transformers' own continuous batching (``generate_batch`` / ``ContinuousBatchingManager``, paged
attention): it samples every request from one manager-wide seed and applies a fixed set of logits processors,
so it has neither per-request seeds nor per-request allowed-token sets (constrained decoding), and its paged
kernels are not the trainer's forward path.

Example:
    >>> import torch
    >>> from transformers import Qwen2Config, Qwen2ForCausalLM
    >>> from training.sampling import SampleRequest
    >>> model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32,
    ...                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)).eval()
    >>> batch = DecodeBatch(model, stop_token_ids=[0], pad_token_id=0, capacity=2)
    >>> requests = [SampleRequest([1, 2, 3], seed=s, temperature=1.0, max_new_tokens=4) for s in (0, 1, 2)]
    >>> ids = [batch.add(request) for request in requests]
    >>> results = batch.run()
    >>> sorted(r.request_id for r in results) == ids, all(len(r.token_ids) <= 4 for r in results)
    (True, True)
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from training.constrained import ChoiceTrie
from training.sampling import (
    SampleOutput,
    SampleRequest,
    SampleResult,
    filter_top_p,
    left_pad,
    output_projection,
    positions_from_mask,
)


def inverse_cdf_draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the first column whose cumulative probability exceeds ``uniform × total``: a draw from the
    row's distribution (``probs`` ``(B, V)``, each row summing to about 1; ``uniforms`` ``(B,)`` in [0, 1)).

    Columns with zero probability are never drawn (the cumulative sum does not rise there), so a row's draw
    over a vocabulary subset that also holds other rows' tokens equals its draw over its own tokens.

    Example:
        >>> probs = torch.tensor([[0.25, 0.0, 0.75], [0.5, 0.5, 0.0]])
        >>> inverse_cdf_draw(probs, torch.tensor([0.2, 0.2], dtype=torch.float64)).tolist()
        [0, 0]
        >>> inverse_cdf_draw(probs, torch.tensor([0.3, 0.9], dtype=torch.float64)).tolist()
        [2, 1]
    """
    cumulative = probs.double().cumsum(-1)
    target = uniforms.to(cumulative.device, torch.float64) * cumulative[:, -1]
    picked = torch.searchsorted(cumulative, target[:, None], right=True).squeeze(-1)
    return picked.clamp_(max=probs.shape[-1] - 1)


@dataclasses.dataclass
class _Row:
    """A request being decoded."""

    request_id: int
    request: SampleRequest
    uniforms: np.random.Generator
    limit: int  # tokens at most (a constrained row: at least its longest candidate)
    node: dict | None  # constrained decoding: the trie node after the tokens so far
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)

    @property
    def position(self) -> int:
        """Position id of the row's last sampled token (the next decode step's input)."""
        return len(self.request.prompt) + len(self.tokens) - 1


class DecodeBatch:
    """A continuously batched KV-cached decoder over one causal LM (see the module docstring).

    Not thread-safe: one caller steps it (:class:`training.engine_loop.EngineLoop` owns it in its thread).

    Args:
        model: The causal LM, in eval mode, under the caller's autocast (``forward(input_ids,
            attention_mask, position_ids, past_key_values, logits_to_keep)``).
        stop_token_ids: Tokens that end a response (kept as its last token).
        pad_token_id: Padding id.
        top_p: Nucleus filtering for sampling (the recorded log-probs are of the unfiltered tempered
            distribution, the one the trainer differentiates).
        capacity: Rows decoded together at most (``rollout.sample_batch_size``); further requests wait.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        stop_token_ids: Sequence[int],
        pad_token_id: int,
        *,
        top_p: float = 1.0,
        capacity: int = 64,
    ):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.model = model
        self.stop = frozenset(int(t) for t in stop_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.top_p = top_p
        self.capacity = capacity
        self.device = next(model.parameters()).device
        self.queue: deque[tuple[int, SampleRequest]] = deque()
        self.rows: list[_Row] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # (rows, width) attention mask of the cache's columns
        self._next_id = 0
        #: Decode steps run, and rows decoded summed over them (rows per step = the batch's fill).
        self.steps, self.row_steps = 0, 0

    def add(self, request: SampleRequest) -> int:
        """Queue ``request``; returns its id (its result's ``request_id``)."""
        if not request.prompt:
            raise ValueError("a request needs a non-empty prompt")
        request_id = self._next_id
        self._next_id += 1
        self.queue.append((request_id, request))
        return request_id

    def has_work(self) -> bool:
        """Whether requests are queued or being decoded."""
        return bool(self.queue or self.rows)

    def run(self) -> list[SampleResult]:
        """Step until every request ended; their results in the order they finished."""
        results = []
        while self.has_work():
            results += self.step()
        return results

    @torch.no_grad()
    def step(self) -> list[SampleResult]:
        """One decode step: admit queued requests into free rows, sample a token for every row, retire the
        rows that ended; their results."""
        old_rows = self.rows
        parts = []
        if old_rows:
            parts.append((old_rows, *self._decode_logits(old_rows)))
        admitted = [self.queue.popleft() for _ in range(min(len(self.queue), self.capacity - len(old_rows)))]
        new_rows, new_cache, new_mask = [], None, None
        if admitted:
            new_rows = [self._new_row(request_id, request) for request_id, request in admitted]
            logits, vocab, new_cache, new_mask = self._prefill_logits(new_rows)
            parts.append((new_rows, logits, vocab))
        for rows, logits, vocab in parts:
            self._sample(rows, logits, vocab)
        self.steps += 1
        self.row_steps += len(old_rows) + len(new_rows)
        if new_rows:
            self._merge(new_rows, new_cache, new_mask)
        return self._retire()

    # ------------------------------------------------------------------ rows and forwards
    def _new_row(self, request_id: int, request: SampleRequest) -> _Row:
        node, limit = None, request.max_new_tokens
        if request.candidates is not None:
            node = ChoiceTrie(request.candidates).root
            limit = max([limit, *(len(c) for c in request.candidates)])  # a whole candidate always fits
        uniforms = np.random.Generator(np.random.PCG64(int(request.seed)))
        return _Row(request_id, request, uniforms, max(limit, 1), node)

    def _vocab(self, rows: list[_Row]) -> torch.Tensor | None:
        """The tokens some constrained row may write next (None: the whole vocabulary)."""
        if any(row.node is None for row in rows):
            return None
        return torch.tensor(
            sorted(set().union(*(row.node for row in rows))), dtype=torch.long, device=self.device
        )

    def _logits(self, inputs: dict, vocab: torch.Tensor | None) -> torch.Tensor:
        """Logits of the last position, of ``vocab``'s tokens only when constrained (the output layer's rows
        of the allowed tokens: :func:`training.sampling.output_projection`)."""
        projection = output_projection(self.model) if vocab is not None else None
        if projection is not None:
            decoder, weight = projection
            hidden = decoder(**inputs).last_hidden_state[:, -1, :]
            return (hidden @ weight[vocab].T).float()
        logits = self.model(**inputs, logits_to_keep=1).logits[:, -1, :].float()
        return logits if vocab is None else logits[:, vocab]

    def _decode_logits(self, rows: list[_Row]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed every row its last token (one position) through the batch's cache."""
        ones = torch.ones((len(rows), 1), dtype=self.mask.dtype, device=self.device)
        self.mask = torch.cat([self.mask, ones], dim=1)
        inputs = dict(
            input_ids=torch.tensor([[row.tokens[-1]] for row in rows], dtype=torch.long, device=self.device),
            attention_mask=self.mask,
            position_ids=torch.tensor([[row.position] for row in rows], dtype=torch.long, device=self.device),
            past_key_values=self.cache,
            use_cache=True,
        )
        vocab = self._vocab(rows)
        return self._logits(inputs, vocab), vocab

    def _prefill_logits(self, rows: list[_Row]):
        """Prefill the new rows' prompts together, in a cache of their own."""
        ids, mask = left_pad([row.request.prompt for row in rows], self.pad_token_id, self.device)
        cache = DynamicCache()
        inputs = dict(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions_from_mask(mask),
            past_key_values=cache,
            use_cache=True,
        )
        vocab = self._vocab(rows)
        return self._logits(inputs, vocab), vocab, cache, mask

    def _sample(self, rows: list[_Row], logits: torch.Tensor, vocab: torch.Tensor | None) -> None:
        """One token per row from its tempered (constrained: renormalised) distribution, by its own
        uniform."""
        temperatures = torch.tensor([row.request.temperature for row in rows], device=self.device)
        scaled = logits / temperatures[:, None]
        if any(row.node is not None for row in rows):  # keep only the tokens that continue its candidates
            column = {int(token): c for c, token in enumerate(vocab.tolist())} if vocab is not None else None
            allowed = torch.ones_like(scaled, dtype=torch.bool)
            for r, row in enumerate(rows):
                if row.node is not None:
                    allowed[r] = False
                    allowed[r, [column[t] for t in row.node] if column is not None else list(row.node)] = True
            scaled = scaled.masked_fill(~allowed, float("-inf"))
        log_dist = torch.log_softmax(scaled, dim=-1)
        sample_dist = filter_top_p(scaled, self.top_p).softmax(-1)
        uniforms = torch.tensor([row.uniforms.random() for row in rows], dtype=torch.float64)
        picked = inverse_cdf_draw(sample_dist, uniforms)
        logprobs = log_dist.gather(-1, picked[:, None]).squeeze(-1).tolist()
        chosen = (vocab[picked] if vocab is not None else picked).tolist()
        for row, token, logprob in zip(rows, chosen, logprobs, strict=True):
            row.tokens.append(int(token))
            row.logprobs.append(float(logprob))
            if row.node is not None:
                row.node = row.node.get(int(token), {})

    def _ended(self, row: _Row) -> bool:
        return row.tokens[-1] in self.stop or len(row.tokens) >= row.limit or row.node == {}

    # ------------------------------------------------------------------ the batch's cache
    def _merge(self, rows: list[_Row], cache: DynamicCache, mask: torch.Tensor) -> None:
        """Append the prefilled rows (and their cache) to the batch, left-padding the narrower side."""
        if not self.rows:
            self.rows, self.cache, self.mask = list(rows), cache, mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for own, new in zip(self.cache.layers, cache.layers, strict=True):
            own.keys = torch.cat([_left_pad_columns(own.keys, width), _left_pad_columns(new.keys, width)])
            own.values = torch.cat(
                [_left_pad_columns(own.values, width), _left_pad_columns(new.values, width)]
            )
        self.mask = torch.cat([_left_pad_mask(self.mask, width), _left_pad_mask(mask, width)])
        self.rows = self.rows + list(rows)

    def _retire(self) -> list[SampleResult]:
        """Take the rows that ended out of the batch (and their cache rows); their results."""
        ended = [self._ended(row) for row in self.rows]
        if not any(ended):
            return []
        results = [
            SampleResult(
                row.request_id,
                row.tokens,
                row.logprobs,
                finished=row.tokens[-1] in self.stop or row.node == {},
            )
            for row, done in zip(self.rows, ended, strict=True)
            if done
        ]
        keep = [i for i, done in enumerate(ended) if not done]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache, self.mask = None, None
            return results
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = self.mask[index]
        used = mask.any(0).nonzero()
        first = int(used[0]) if len(used) else 0  # columns left of every remaining row's prompt
        self.mask = mask[:, first:]
        for layer in self.cache.layers:
            layer.keys = layer.keys[index][:, :, first:, :]
            layer.values = layer.values[index][:, :, first:, :]
        return results


def _left_pad_columns(states: torch.Tensor, width: int) -> torch.Tensor:
    """``(B, H, T, D)`` cache states left-padded with zeros to ``width`` columns (masked out)."""
    missing = width - states.shape[2]
    if missing == 0:
        return states
    pad = states.new_zeros((states.shape[0], states.shape[1], missing, states.shape[3]))
    return torch.cat([pad, states], dim=2)


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    return mask if missing == 0 else torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], dim=1)


def requests_for(
    prompts: Sequence[Sequence[int]],
    *,
    seeds: Sequence[int],
    temperature: float,
    max_new_tokens: int,
    candidates: Sequence[Sequence[Sequence[int]]] | None = None,
) -> list[SampleRequest]:
    """One :class:`~training.sampling.SampleRequest` per prompt (the lock-step engine call's arguments)."""
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts need as many seeds, got {len(seeds)}")
    if candidates is not None and len(candidates) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts need as many candidate lists, got {len(candidates)}")
    return [
        SampleRequest(
            list(prompt),
            seed=int(seed),
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            candidates=None if candidates is None else [list(c) for c in candidates[k]],
        )
        for k, (prompt, seed) in enumerate(zip(prompts, seeds, strict=True))
    ]


def collect_results(results: Sequence[SampleResult], request_ids: Sequence[int]) -> SampleOutput:
    """The results of ``request_ids``, in that order, as one :class:`~training.sampling.SampleOutput`."""
    by_id = {r.request_id: r for r in results}
    out = SampleOutput([], [], [])
    for request_id in request_ids:
        result = by_id[request_id]
        out.token_ids.append(list(result.token_ids))
        out.logprobs.append(list(result.logprobs))
        out.finished.append(result.finished)
    return out


def sample_responses(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_token_ids: Sequence[int],
    pad_token_id: int,
    seeds: Sequence[int],
    temperature: float = 1.0,
    top_p: float = 1.0,
    batch_size: int = 64,
    candidates: Sequence[Sequence[Sequence[int]]] | None = None,
) -> SampleOutput:
    """Sample one response per prompt (prompt ``k`` from seed ``seeds[k]``) in a :class:`DecodeBatch` of
    ``batch_size`` rows, recording each sampled token's log-prob; the responses in prompt order.

    Args:
        model: A causal LM (see :class:`DecodeBatch`), in eval mode.
        prompts: Prompt token ids (no padding).
        max_new_tokens: Response length limit; a constrained response may run to its longest candidate.
        stop_token_ids: Tokens that end a response (kept as its last token).
        pad_token_id: Padding id.
        seeds: One sampling seed per prompt.
        temperature: Logits are divided by it (also for the recorded log-probs).
        top_p: Nucleus filtering for sampling.
        batch_size: Rows decoded together at most.
        candidates: Constrained decoding (:mod:`training.constrained`): per prompt, the token sequences the
            response must be one of.
    """
    batch = DecodeBatch(model, stop_token_ids, pad_token_id, top_p=top_p, capacity=batch_size)
    requests = requests_for(
        prompts, seeds=seeds, temperature=temperature, max_new_tokens=max_new_tokens, candidates=candidates
    )
    ids = [batch.add(request) for request in requests]
    return collect_results(batch.run(), ids)
