"""A toy estimator defined only in the tests (issue 28): its module and its registration are all it needs.

    A = A^E + step_weight * normalize_{task group}(R_t)       R_t = GiGPO's step return minus the penalty

The registration states every fact the suite reads (its parameters, the switch that leaves the episode term,
a renamed keyword), so every test that iterates ``ESTIMATORS`` covers it: ``tests/conftest.py`` imports this
module before any test is collected, so the API and property tests of this folder, the credit-diagnostics
tests and the verl rows tests all do. Its reference oracle is
``advantages_reference.ref_toy_return_baseline``.
"""

from __future__ import annotations

import numpy as np

from training.advantages import StepBatch, StepWeightedParams, register_estimator
from training.advantages.common import discounted_returns, episode_advantage, segment_normalize


@register_estimator(
    "toy_return_baseline",
    params=StepWeightedParams,
    episode_only={"step_weight": 0.0},
    renamed={"omega": "step_weight"},
)
def toy_return_baseline(batch: StepBatch, params: StepWeightedParams) -> np.ndarray:
    """GRPO's episode advantage plus the step return normalised over the task group's rows."""
    step_return = discounted_returns(batch, params.gamma) - params.invalid_penalty * (~batch.valid)
    step = segment_normalize(
        step_return, batch.group, batch.n_groups, params.norm, params.eps, singleton="zero"
    )
    return episode_advantage(batch, params) + params.step_weight * step
