"""The ``verl.plugins`` entry point: what upstream verl (>= 0.9, the ``verl`` on PyPI) gets from us.

Upstream verl imports every ``verl.plugins`` entry point when ``verl`` is imported; this module registers, on
import, each of our estimator names (:func:`progpo_verl.verl_agent.settings.adv_estimator_names`) in its
advantage-estimator registry (``verl.trainer.ppo.core_algos.register_adv_est``). That registry calls an
estimator with ``token_level_rewards``, ``response_mask``, ``config`` and, when the batch has them, ``index``
(the group uid) and ``reward_baselines``: one row per sequence, with no trajectory, step or anchor (verl
0.9.1, ``ray_trainer.compute_advantage``; only GDPO gets the raw batch, by name). Our estimators need step
rows, so selecting one in upstream verl fails with :class:`StepRowsNeeded`, which names the keyword
arguments verl passed and the way that works (verl-agent, ``python -m progpo_verl.verl_agent``), instead of
verl's "Unknown advantage estimator". ``tests/progpo_verl/test_upstream_verl.py`` (``.ci/run_verl``)
checks that verl 0.9.1 loads this module and still passes exactly those arguments: when a verl release
passes step metadata, that test fails and these names can compute.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from progpo_verl.verl_agent.settings import adv_estimator_names

#: The keyword arguments upstream verl 0.9.1 passes a registered estimator (``index`` and
#: ``reward_baselines`` when present).
UPSTREAM_KWARGS = ("config", "index", "response_mask", "reward_baselines", "token_level_rewards")


class StepRowsNeeded(NotImplementedError):
    """Upstream verl called a step-level estimator of ours without step rows."""


def refusing_estimator(name: str) -> Callable[..., None]:
    """A registry entry for ``name`` that explains why it cannot run on what upstream verl passes."""

    def estimator(**kwargs):
        raise StepRowsNeeded(
            f"{name} is a step-level estimator: it needs one row per (trajectory, step) with the trajectory, "
            f"step and anchor of each row, and upstream verl passed only {sorted(kwargs)}. Run it in "
            "verl-agent: python -m progpo_verl.verl_agent algorithm.adv_estimator=" + name
        )

    estimator.__name__ = f"{name}_needs_step_rows"
    return estimator


def register() -> list[str]:
    """Register our names that verl's registry does not hold yet; returns them (none in a verl without the
    registry: verl-agent's, where :func:`progpo_verl.verl_agent.install.install` is the way in)."""
    from verl.trainer.ppo import core_algos

    if not hasattr(core_algos, "register_adv_est"):
        return []
    names = [name for name in adv_estimator_names() if name not in core_algos.ADV_ESTIMATOR_REGISTRY]
    for name in names:
        core_algos.register_adv_est(name)(refusing_estimator(name))
    return names


#: The names registered when this module was imported (by verl's plugin loader; none without a verl).
REGISTERED = register() if importlib.util.find_spec("verl") is not None else []
