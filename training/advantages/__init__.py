"""Step-level group advantage estimators for LLM-agent RL (pure numpy, registered by name).

Public API::

    from training.advantages import compute_advantages, ESTIMATORS
    adv = compute_advantages("progpo", batch, gamma=0.95)   # -> float64 [N], caller's row order

Estimators: ``grpo``, ``rloo``, ``dapo``, ``gigpo``, ``g2po``, ``graphgpo``, ``progpo``,
``progpo_coverage`` (one module each). Formulas and sources: each module's docstring and
``docs/algorithms.md``. To add one (the checklist is ``docs/algorithms.md`` §10): write a module with a
frozen params dataclass extending one of ``params.py``'s shared bases and a function
``fn(batch: StepBatch, params) -> [N]`` decorated by
``@register_estimator("name", params=..., episode_only=..., renamed=...)``, import it below, and add
``ref_<name>`` to ``tests/training/advantages/advantages_reference.py``.
``ESTIMATORS[name]`` holds those facts (``.parameters``, ``.episode_only``, ``.renamed``);
``check_parameter_names`` checks a parameter dict without a batch (unknown names; renamed ones, such as
GiGPO's ``omega``, now ``step_weight``, answer with their new name), for callers that validate configs early.
"""

from training.advantages import (  # noqa: F401  (importing registers the estimators)
    dapo,
    g2po,
    gigpo,
    graphgpo,
    grpo,
    progpo,
    progpo_coverage,
    rloo,
)
from training.advantages.batch import StepBatch
from training.advantages.params import NormalizedParams, SharedParams, StepWeightedParams
from training.advantages.progpo import ProGPOConfig, progpo_report
from training.advantages.registry import (
    ESTIMATORS,
    Estimator,
    check_parameter_names,
    compute_advantages,
    register_estimator,
)

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "NormalizedParams",
    "ProGPOConfig",
    "SharedParams",
    "StepBatch",
    "StepWeightedParams",
    "check_parameter_names",
    "compute_advantages",
    "progpo_report",
    "register_estimator",
]
