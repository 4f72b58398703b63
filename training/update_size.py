"""How much an optimizer update moved the parameters: ``params_changed_frac`` and ``update_to_weight_ratio``.

The diagnostic that catches updates lost to rounding (issue 15): an AdamW step of ~1e-6 is below half a
bf16 ulp for any weight above ~2.4e-4 in magnitude, so a model whose trained weights are bf16 silently stops
learning at the presets' learning rate, while its loss curve still looks alive. Snapshot the parameters
before an update, compare after it:

* ``params_changed_frac``: the fraction of parameter elements whose stored value changed at all;
* ``update_to_weight_ratio``: ``||theta_after - theta_before|| / ||theta_before||`` over all parameters
  (the update-to-weight ratio; it is 0 exactly when every update rounded away).

The comparison is exact (a copy of every parameter in its own dtype on its own device) and costs one copy and
one elementwise pass per parameter; under FSDP2 each rank measures its own shards and the sums add up over
ranks (:meth:`UpdateSize.all_reduce`).

Example:
    >>> import torch
    >>> weight = torch.nn.Parameter(torch.ones(4))
    >>> before = snapshot_parameters([weight])
    >>> with torch.no_grad():
    ...     weight[:2] += 0.5
    >>> size = update_size(before, [weight])
    >>> size.params_changed_frac, round(size.update_to_weight_ratio, 4)
    (0.5, 0.3536)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence

import torch


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2 parameter), else the tensor itself, detached."""
    from torch.distributed.tensor import DTensor

    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach()


@dataclasses.dataclass(frozen=True)
class UpdateSize:
    """Sums over parameter elements (of this rank, or of every rank after :meth:`all_reduce`).

    Attributes:
        changed: Elements whose value changed.
        elements: All elements.
        delta_sq: ``sum((after - before) ** 2)``.
        weight_sq: ``sum(before ** 2)``.
    """

    changed: float
    elements: float
    delta_sq: float
    weight_sq: float

    @property
    def params_changed_frac(self) -> float:
        """Fraction of parameter elements the update changed (0 when there are none)."""
        return self.changed / self.elements if self.elements else 0.0

    @property
    def update_to_weight_ratio(self) -> float:
        """``||delta theta|| / ||theta||`` (0 for all-zero weights)."""
        return math.sqrt(self.delta_sq / self.weight_sq) if self.weight_sq > 0 else 0.0

    def all_reduce(self, reduce_sum: Callable[[float], float]) -> UpdateSize:
        """The sums over every rank, given a rank-sum of floats (``DistContext.all_reduce_sum``)."""
        return UpdateSize(*(reduce_sum(getattr(self, f.name)) for f in dataclasses.fields(self)))

    def metrics(self) -> dict[str, float]:
        """``{"params_changed_frac": ..., "update_to_weight_ratio": ...}`` for a metrics record."""
        return {
            "params_changed_frac": self.params_changed_frac,
            "update_to_weight_ratio": self.update_to_weight_ratio,
        }


def snapshot_parameters(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """A copy of each parameter (this rank's shard under FSDP2), in its own dtype, on its own device."""
    return [local_tensor(p).clone() for p in params]


@torch.no_grad()
def update_size(before: Sequence[torch.Tensor], params: Iterable[torch.Tensor]) -> UpdateSize:
    """Compare parameters with a :func:`snapshot_parameters` taken before the update (same order).

    Args:
        before: The snapshot.
        params: The same parameters, now.

    Raises:
        ValueError: the parameters do not match the snapshot in number or shape.
    """
    params = list(params)
    if len(params) != len(before):
        raise ValueError(f"{len(params)} parameters but a snapshot of {len(before)}")
    changed = elements = 0
    delta_sq = weight_sq = 0.0
    for old, param in zip(before, params, strict=True):
        new = local_tensor(param)
        if new.shape != old.shape:
            raise ValueError(
                f"a parameter of shape {tuple(new.shape)} was {tuple(old.shape)} in the snapshot"
            )
        changed += int((new != old).sum())
        elements += new.numel()
        delta = new.float() - old.float()
        delta_sq += float((delta * delta).sum(dtype=torch.float64))
        weight_sq += float(old.float().square().sum(dtype=torch.float64))
    return UpdateSize(float(changed), float(elements), delta_sq, weight_sq)
