"""Multi-process training with ``torchrun``: process group, FSDP2 sharding, rank-split work, reductions.

``torchrun --nproc_per_node N -m training.cli --config ...`` starts N ranks (NCCL on GPUs, gloo on CPU). Each
rank rolls out its own share of the task groups (groups never span ranks, so every estimator sees whole
groups), the step rows stay on the rank that produced them, and the update runs on an FSDP2 model
(:func:`torch.distributed.fsdp.fully_shard` on every decoder layer, then the root): gradients are
reduce-scattered and averaged, so each rank scales its loss by ``world_size / global_tokens`` to get the exact
token-mean of the whole batch. Ranks must run the same number of forward/backward passes; ranks with fewer
micro-batches run padded ones with zero weight. The legacy ``FullyShardedDataParallel`` wrapper refuses CPU;
FSDP2 works on gloo (``docs/training_stack.md`` §4).

Sampling runs on each rank's own sampler — a plain copy of the model in the compute dtype, or a vLLM engine on
the rank's device — into which the trained weights are streamed after each update, one gathered tensor at a
time (:mod:`training.weight_sync`).

Example:
    >>> ctx = DistContext.from_env()  # not under torchrun: a single process
    >>> ctx.world_size, ctx.is_main
    (1, True)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import torch.distributed as dist


@dataclasses.dataclass
class DistContext:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> DistContext:
        """Read ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (torchrun) and start the process group if > 1."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        ctx = cls(
            rank=int(os.environ.get("RANK", "0")),
            world_size=world,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        )
        if world > 1 and not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(ctx.local_rank)
            dist.init_process_group(backend=backend)
        return ctx

    @property
    def enabled(self) -> bool:
        """More than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 (writes files, shows progress)."""
        return self.rank == 0

    def device(self, requested: str) -> str:
        """The device of this rank (``cuda:<local_rank>`` under torchrun on GPUs)."""
        if self.enabled and requested in ("auto", "cuda") and torch.cuda.is_available():
            return f"cuda:{self.local_rank}"
        return requested

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.enabled:
            dist.barrier()

    def all_reduce_sum(self, value: float) -> float:
        """Sum of ``value`` over ranks."""
        if not self.enabled:
            return float(value)
        tensor = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(tensor)
        return float(tensor.item())

    def all_reduce_max(self, value: float) -> float:
        """Max of ``value`` over ranks."""
        if not self.enabled:
            return float(value)
        tensor = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (a list in rank order) on every rank."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def shard(self, items: list) -> list:
        """This rank's contiguous share of ``items`` (sizes differ by at most one)."""
        n = len(items)
        start = (n * self.rank) // self.world_size
        stop = (n * (self.rank + 1)) // self.world_size
        return items[start:stop]

    def log(self, message: str) -> None:
        """Print ``message`` once, from the main rank, as ``[progpo train] message``."""
        if self.is_main:
            print(f"[progpo train] {message}", flush=True)

    def close(self) -> None:
        """Destroy the process group."""
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


def shard_model(model: torch.nn.Module, compute_dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Apply FSDP2 ``fully_shard`` to each decoder layer, then to the whole model (in place).

    The sharded parameters keep their dtype (fp32 masters: the optimizer steps them). With a
    ``compute_dtype`` other than float32, FSDP2's ``MixedPrecisionPolicy(param_dtype=compute_dtype,
    reduce_dtype=float32)`` all-gathers them in that dtype for forward/backward and reduce-scatters the
    gradients in float32 (PyTorch FSDP2's mixed precision, as verl's ``mixed_precision`` defaults).

    The root keeps its parameters (embeddings, final norm, output layer) gathered after its forward
    (``reshard_after_forward=False``, FSDP2's default for the root, made explicit): the chunked log-probs of
    :func:`training.sampling.policy_logprobs_and_entropy` multiply the decoder's hidden states with the
    gathered output weight after the forward.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mixed_precision = (
        MixedPrecisionPolicy()
        if compute_dtype == torch.float32
        else MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    )
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        base = getattr(model, "base_model", None)
        layers = getattr(getattr(getattr(base, "model", None), "model", None), "layers", None)
    for layer in layers or []:
        fully_shard(layer, mp_policy=mixed_precision)
    fully_shard(model, mp_policy=mixed_precision, reshard_after_forward=False)
    return model
