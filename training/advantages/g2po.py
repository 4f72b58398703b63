"""G2PO — Group-Graph Policy Optimization (Wang et al., arXiv 2606.22995), §4 of the spec, following the
official code (``github.com/Nala-YN/G2PO``, ``g2po/core_g2po.py``) as read for the spec.

Per task group, nodes are distinct anchor observations; every row is an edge occurrence v -> v' (v' = the
next row's node, or the SUCCESS / FAIL sink after a trajectory's last step).

    Node key:       v = obs_key                          state_key="observation" (default, the official code)
                    v = mix(obs_key, admissible_key)     state_key="observation_actions"
                    (see :mod:`training.advantages.state_key`)

    Node value:     V(v) = mean_{rows (j,k) at v} gamma^(T_j - k) * R_j       (R_j episode reward, no penalty)
                    V(SUCCESS) = success_reward, V(FAIL) = 0  (failure and truncation alike)
    Same-source:    c1(e) = normalize_{e' in out(v)} [ V(v') - penalty * invalid(e) ]   (0 if |out(v)| = 1)
    Global TD:      c2(e) = normalize_{e' in task group} [ V(v') - V(v) ]              (0 if one edge)
    Combined:       A = A^E + step_weight * (c1 + c2)         (the code's step_advantage_w)
Note the exponent T_j - k: the last step of a successful trajectory contributes gamma * R, not R.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.advantages.batch import StepBatch
from training.advantages.common import episode_advantage, group_scoped_ids, segment_normalize
from training.advantages.params import StepWeightedParams, parse_enum, set_checked
from training.advantages.registry import register_estimator
from training.advantages.state_key import StateKey, state_keys


@dataclass(frozen=True)
class G2POParams(StepWeightedParams):
    """G2PO's parameters: the shared step-weighted ones (``gamma`` is the node value's discount, hard-coded
    0.95 in the official code; ``step_weight`` the code's ``step_advantage_w``), the success value and the
    node key. ``invalid_penalty`` enters the episode score and c1, not V."""

    success_reward: float = 10.0
    """Value of the SUCCESS sink (a trajectory succeeds when ``won`` is set at any step; the code tests
    ``R == 10``, the same for ALFWorld/WebShop rewards)."""
    state_key: str = "observation"
    """Node identity: ``observation`` (``obs_key``) or ``observation_actions`` (``obs_key`` and the
    ``admissible_key`` column; see :mod:`training.advantages.state_key`); becomes a :class:`StateKey`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        set_checked(
            self,
            success_reward=float(self.success_reward),
            state_key=parse_enum(StateKey, self.state_key, "state_key"),
        )


def node_values(batch: StepBatch, node: np.ndarray, n_nodes: int, gamma: float) -> np.ndarray:
    """``[n_nodes]`` group-aggregated state value V(v) = mean of gamma^(T_j - k) * R_j over visits."""
    contrib = gamma ** (batch.traj_len[batch.traj] - batch.step) * batch.episode_return[batch.traj]
    return np.bincount(node, weights=contrib, minlength=n_nodes) / np.maximum(
        np.bincount(node, minlength=n_nodes), 1
    )


@register_estimator(
    "g2po", params=G2POParams, episode_only={"step_weight": 0.0}, renamed={"step_advantage_w": "step_weight"}
)
def g2po(batch: StepBatch, params: G2POParams) -> np.ndarray:
    """G2PO edge-centric advantage on the group's state graph.

    Args:
        batch: canonical ``StepBatch`` with N rows.
        params: see :class:`G2POParams`; ``norm`` applies to A^E, c1 and c2.

    Returns:
        ``[N]`` float64.

    Raises:
        ValueError: a bad parameter, or ``state_key="observation_actions"`` without ``admissible_key``.

    Example:
        >>> from training.advantages import compute_advantages
        >>> b = {"group_id": np.zeros(2, int), "traj_id": np.array([0, 1]), "step": np.zeros(2, int),
        ...      "reward": np.array([10.0, 0.0]), "won": np.array([True, False]),
        ...      "valid": np.ones(2, bool), "obs_key": np.zeros(2, np.uint64),
        ...      "action_key": np.arange(2, dtype=np.uint64)}
        >>> compute_advantages("g2po", b, norm="mean").tolist()
        [15.0, -15.0]
    """
    adv_e = episode_advantage(batch, params)
    node, n_nodes = group_scoped_ids(batch, state_keys(batch, params.state_key))
    value = node_values(batch, node, n_nodes, params.gamma)
    v_src = value[node]
    v_dst = np.empty(batch.n_rows)
    last = batch.is_last
    v_dst[~last] = v_src[1:][~last[:-1]]  # next row of the same trajectory is the next canonical row
    v_dst[last] = np.where(batch.traj_won[batch.traj[last]], params.success_reward, 0.0)
    norm, eps = params.norm, params.eps
    c1 = segment_normalize(
        v_dst - params.invalid_penalty * (~batch.valid), node, n_nodes, norm, eps, singleton="zero"
    )
    c2 = segment_normalize(v_dst - v_src, batch.group, batch.n_groups, norm, eps, singleton="zero")
    return adv_e + params.step_weight * (c1 + c2)
