"""What a training run costs, from the model's shape: per-GPU memory by part, and the FLOPs of a forward.

**Memory.** What one rank holds, part by part (bytes; ``P`` parameters, ``E`` of them in the embedding and
output layer, ``W`` ranks, bf16 compute over fp32 masters as in the presets):

=====================  ==============================================================================
``params``             the fp32 masters, ``4P / W`` (FSDP2 shards them over the ranks)
``grads``              their fp32 gradients, ``4P / W``
``optimizer``          AdamW's two moments, ``8P / W``
``update_snapshot``    the copy ``params_changed_frac`` compares against (:mod:`training.update_size`),
                       ``4P / W``, alive during the update
``compute_weights``    the weights in the compute dtype while a forward runs: autocast's cast cache on one
                       GPU (``2P``); under FSDP2 two all-gathered decoder layers plus the root's embedding
                       and output layer, which stay gathered between forward and backward (``2E``)
``reference``          the frozen KL reference in the compute dtype: ``2P`` on one GPU; sharded under
                       FSDP2, ``2(P − E) / W``, except its root (``2E``), gathered at its first forward and
                       kept (it has no backward to reshard it)
``sampler``            transformers engine: nothing on one GPU (it samples with the trained model), a
                       compute-dtype copy ``2P`` under torchrun; vLLM: its share of the GPU
                       (``rollout.vllm_gpu_memory_utilization`` × the GPU's memory: its weights and KV cache)
``kv_cache``           the transformers engine's KV cache for this rank's sequences decoded together
                       (``min(sample_batch_size, envs per rank)`` × prompt+response positions)
``activations``        one micro-batch's forward/backward: with gradient checkpointing each layer's input
                       plus one layer recomputed, without it every layer; plus the vocabulary-sized
                       logits of ``optim.logit_chunk_tokens`` positions (fp32, with their gradient)
``sync``               the weight sync's largest transient: the embedding matrix gathered in fp32 and
                       cast to the compute dtype
=====================  ==============================================================================

The sum is a budget, not a measurement: allocator fragmentation, CUDA/NCCL workspaces (~1–3 GB) and the
activation estimate's constants are not exact. The static parts (``params``, ``grads``, ``optimizer``,
``reference``, ``sampler``) are exact, and the CPU rehearsal checks them against the tensors a run holds
(``tests/training/test_gpu_rehearsal.py``). ``benchmarks/bench_training.py memory_budget`` writes the presets'
budgets.

**FLOPs.** One forward over a sequence of ``s`` positions whose last ``r`` predict response tokens costs
``2·N_layers·s`` (the decoder's matmuls, ``N_layers`` = ``layers × layer_params``) + ``2·L·d·s²`` (causal
attention: ``QKᵀ`` and ``AV``, each ``2·d·s²/2`` per layer) + ``2·V·d·r`` (the output layer, applied to the
``r`` positions whose logits are needed); a backward costs twice its forward (:func:`forward_flops`; PaLM's
appendix B counts the same terms, without the causal halving). MFU counts every pass the update makes over
real (unpadded) tokens — the policy's forward and backward, the gradient-checkpoint recompute, the pi_old
recompute and the reference's forward — against the hardware's peak.

Example:
    >>> shape = ModelShape(vocab=1000, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2)
    >>> budget = memory_budget(shape, world_size=2, micro_batch_rows=2, sequence_tokens=64)
    >>> budget.parts["optimizer"] == 2 * budget.parts["params"]
    True
"""

from __future__ import annotations

import dataclasses
import resource

import torch

from training.config import TrainConfig
from training.update_size import local_tensor

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A Qwen2-architecture decoder's sizes (its ``config.json``).

    Attributes:
        vocab: Embedding rows.
        hidden: Model width.
        intermediate: MLP width.
        layers: Decoder layers.
        heads: Query heads.
        kv_heads: Key/value heads.
        tied: The output layer is the embedding matrix.
    """

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool = True

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    @property
    def embedding_params(self) -> int:
        """Parameters of the embedding and output layer (``E``)."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (q/k/v with biases, o, gate/up/down, two norms)."""
        kv = self.kv_heads * self.head_dim
        attention = (self.hidden + 1) * self.hidden + 2 * (self.hidden + 1) * kv + self.hidden * self.hidden
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def params(self) -> int:
        """All parameters (``P``)."""
        return self.embedding_params + self.layers * self.layer_params + self.hidden

    @classmethod
    def from_hf_config(cls, config: dict) -> ModelShape:
        """From a transformers ``config.json`` (as a dict)."""
        return cls(
            vocab=config["vocab_size"],
            hidden=config["hidden_size"],
            intermediate=config["intermediate_size"],
            layers=config["num_hidden_layers"],
            heads=config["num_attention_heads"],
            kv_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
            tied=config.get("tie_word_embeddings", True),
        )


#: Qwen2.5-1.5B-Instruct and Qwen2.5-7B-Instruct (their ``config.json``).
QWEN25_SHAPES = {
    "Qwen2.5-1.5B": ModelShape(151936, 1536, 8960, 28, 12, 2, tied=True),
    "Qwen2.5-7B": ModelShape(152064, 3584, 18944, 28, 28, 4, tied=False),
}


def forward_flops(
    shape: ModelShape, sequence_tokens: float, squared_tokens: float, response_tokens: float
) -> float:
    """Model FLOPs of forward passes over sequences with these sums: ``Σs`` positions, ``Σs²``, ``Σr``
    response positions (see the module docstring).

    Example:
        >>> shape = ModelShape(vocab=10, hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1)
        >>> forward_flops(shape, 3, 9, 1) == 2 * shape.layer_params * 3 + 2 * 4 * 9 + 2 * 10 * 4
        True
    """
    return (
        2.0 * shape.layers * shape.layer_params * sequence_tokens
        + 2.0 * shape.layers * shape.hidden * squared_tokens
        + 2.0 * shape.vocab * shape.hidden * response_tokens
    )


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """Bytes per GPU, part by part (see the module docstring), and their total."""

    parts: dict[str, float]

    @property
    def total(self) -> float:
        """The sum of the parts."""
        return float(sum(self.parts.values()))

    def gib(self) -> dict[str, float]:
        """The parts and the total in GiB, rounded to 0.1."""
        return {**{k: round(v / GIB, 1) for k, v in self.parts.items()}, "total": round(self.total / GIB, 1)}


def memory_budget(
    shape: ModelShape,
    *,
    world_size: int,
    micro_batch_rows: int,
    sequence_tokens: int,
    engine: str = "transformers",
    decode_sequences: int = 0,
    vllm_share_bytes: float = 0.0,
    gradient_checkpointing: bool = True,
    logit_chunk_tokens: int = 1024,
    reference: bool = True,
    compute_bytes: int = 2,
) -> MemoryBudget:
    """The per-GPU budget of one rank (bytes).

    Args:
        shape: The model.
        world_size: Ranks (GPUs) the model is sharded over.
        micro_batch_rows: Rows per forward/backward (``optim.micro_batch_rows``).
        sequence_tokens: Prompt + response positions of the longest row (``rollout.max_prompt_tokens +
            rollout.max_new_tokens``).
        engine: ``transformers`` or ``vllm``.
        decode_sequences: Sequences the transformers engine decodes together on this rank.
        vllm_share_bytes: The vLLM engine's share of the GPU.
        gradient_checkpointing: ``model.gradient_checkpointing``.
        logit_chunk_tokens: ``optim.logit_chunk_tokens`` (0: every position at once).
        reference: A KL reference is loaded (``loss.kl_coef > 0``).
        compute_bytes: Bytes per element of the compute dtype (bf16: 2).
    """
    p, e, w = shape.params, shape.embedding_params, world_size
    tokens = micro_batch_rows * sequence_tokens
    per_layer_activations = tokens * (10 * shape.hidden + 4 * shape.intermediate) * compute_bytes
    if gradient_checkpointing:
        activations = shape.layers * tokens * shape.hidden * compute_bytes + per_layer_activations
    else:
        activations = shape.layers * per_layer_activations
    chunk = tokens if logit_chunk_tokens <= 0 else min(logit_chunk_tokens, tokens)
    activations += 3 * chunk * shape.vocab * 4
    synced = w > 1 or engine == "vllm"  # the sampler is a copy the weights are streamed into
    kv_per_position = shape.layers * 2 * shape.kv_heads * shape.head_dim * compute_bytes
    if engine == "vllm":
        sampler, kv_cache = vllm_share_bytes, 0.0
    else:
        sampler = compute_bytes * p if w > 1 else 0.0
        kv_cache = decode_sequences * sequence_tokens * kv_per_position
    if w > 1:  # two gathered layers and the policy's root; the reference's root is gathered for good
        compute_weights = compute_bytes * (2 * shape.layer_params + e)
        reference_bytes = compute_bytes * ((p - e) / w + e)
    else:
        compute_weights = reference_bytes = compute_bytes * p
    return MemoryBudget(
        {
            "params": 4 * p / w,
            "grads": 4 * p / w,
            "optimizer": 8 * p / w,
            "update_snapshot": 4 * p / w,
            "compute_weights": float(compute_weights),
            "reference": float(reference_bytes) if reference else 0.0,
            "sampler": float(sampler),
            "kv_cache": float(kv_cache),
            "activations": float(activations),
            "sync": float(shape.vocab * shape.hidden * (4 + compute_bytes)) if synced else 0.0,
        }
    )


def config_budget(
    config: TrainConfig, shape: ModelShape, world_size: int, gpu_memory_bytes: float = 80e9
) -> MemoryBudget:
    """:func:`memory_budget` of a run's config on ``world_size`` GPUs of ``gpu_memory_bytes`` each."""
    rollout = config.rollout
    envs_per_rank = -(-rollout.num_groups // world_size) * rollout.group_size
    compute = config.model.compute_dtype
    return memory_budget(
        shape,
        world_size=world_size,
        micro_batch_rows=config.optim.micro_batch_rows,
        sequence_tokens=rollout.max_prompt_tokens + rollout.max_new_tokens,
        engine=rollout.engine,
        decode_sequences=min(rollout.sample_batch_size, envs_per_rank),
        vllm_share_bytes=rollout.vllm_gpu_memory_utilization * gpu_memory_bytes,
        gradient_checkpointing=config.model.gradient_checkpointing,
        logit_chunk_tokens=config.optim.logit_chunk_tokens,
        reference=config.loss.kl_coef > 0,
        compute_bytes=4 if compute == "float32" else 2,
    )


def peak_memory_bytes(device: torch.device) -> int:
    """The most memory this process has held: on a GPU what torch allocated there, on the CPU the process's
    peak resident set."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def update_flops(shape: ModelShape, stats: dict[str, float], config: TrainConfig) -> float:
    """Model FLOPs an update ran over real tokens on every rank, from its statistics
    (:func:`training.update.ppo_update`): the policy's forward and backward (and the gradient-checkpoint
    recompute) and the reference's forward in every epoch, the pi_old recompute once."""
    if "update_sequence_tokens" not in stats:  # the update was skipped
        return 0.0
    sums = (stats["update_sequence_tokens"], stats["update_squared_tokens"], stats["update_tokens"])
    forward = forward_flops(shape, *sums)
    passes = 3 + config.model.gradient_checkpointing + (config.loss.kl_coef > 0)
    recompute = forward / config.loss.ppo_epochs if config.algo.recompute_old_logprobs else 0.0
    return forward * passes + recompute


def measured_memory(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    reference: torch.nn.Module | None,
    sampler: torch.nn.Module | None,
    device: torch.device,
) -> dict[str, float]:
    """What this rank holds, from its tensors (under FSDP2 its shards): the static parts of
    :func:`memory_budget` (``params_bytes``, ``grads_bytes``, ``optimizer_bytes``, ``reference_bytes``,
    ``sampler_bytes``: a rollout copy's, 0 for none or a vLLM engine's own) and ``peak_bytes``."""

    def held(tensors) -> float:
        return float(sum(local_tensor(t).numel() * t.element_size() for t in tensors))

    moments = [
        t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t) and t.dim()
    ]
    return {
        "params_bytes": held(model.parameters()),
        "grads_bytes": held(p.grad for p in model.parameters() if p.grad is not None),
        "optimizer_bytes": held(moments),
        "reference_bytes": held(reference.parameters()) if reference is not None else 0.0,
        "sampler_bytes": held(sampler.parameters()) if isinstance(sampler, torch.nn.Module) else 0.0,
        "peak_bytes": float(peak_memory_bytes(device)),
    }
