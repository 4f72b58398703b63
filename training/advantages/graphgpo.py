"""GraphGPO — Graph-based Group Policy Optimization (Cheng et al., ICML 2026, arXiv 2605.26684), §5 of the
spec: paper §4 equations, conventions of the reference recipe (``verl-agent/recipe/GraphGPO``) as documented
by the Relax reproduction.

Per task group, nodes are distinct states; every row is an edge occurrence (s, a, s') with unit cost; the
last action of a successful trajectory points to the sink s_succ.

    State:      s = obs_key                              state_key="observation" (default)
                s = mix(obs_key, admissible_key)         state_key="observation_actions"
                (the reference recipe keys ALFWorld states by observation + tracker + sorted admissible
                commands; see :mod:`training.advantages.state_key`)

    Distance:   d(s_succ) = 0,  d(s) = min_{(s, s')} [1 + d(s')]     (reverse BFS from the sink)
                unreachable: d = d_max + 1 (d_max = largest finite distance in the group's graph)
                a failed/truncated last step targets the unseen final observation: unreachable
    Reward:     R^G = r_succ * distance_discount^(d(s'))        reward_convention="reference" (default)
                R^G = r_succ * distance_discount^(d(s') + 1)    reward_convention="paper" (Eq. 4, c = 1)
                (distance_discount is the paper's omega)
    Advantage:  A^G = normalize_{edges leaving s} R^G    (ddof 1; singleton or zero spread -> 0;
                                                          no success in the group -> 0)
    Final:      A = beta_g * A^G + beta_e * A^E
Both conventions differ by the constant factor distance_discount inside a same-source group, which the
z-score removes (paper vs reference give equal advantages up to eps); ranking is by distance reduction
(Prop. 4.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from training.advantages.batch import StepBatch, expand_ranges
from training.advantages.common import dense_ids, episode_advantage, group_scoped_ids, segment_normalize
from training.advantages.params import NormalizedParams, check_range, parse_enum, set_checked
from training.advantages.registry import register_estimator
from training.advantages.state_key import StateKey, state_keys


class RewardConvention(str, Enum):
    """Exponent of the distance discount: d(s') (the reference recipe) or d(s') + 1 (the paper's Eq. 4)."""

    REFERENCE = "reference"
    PAPER = "paper"


@dataclass(frozen=True)
class GraphGPOParams(NormalizedParams):
    """GraphGPO's parameters: the shared normalising ones (``norm``, the paper's z-score, for A^G and A^E;
    ``stats_scope``, cross-steps in the reference implementation; ``invalid_penalty`` on the episode score)
    and the graph reward's."""

    distance_discount: float = 0.1
    """Per-step discount of the graph reward, in (0, 1] (the paper's omega; the reference recipe's
    ``OMEGA=0.1``)."""
    success_reward: float = 10.0
    """r_succ."""
    reward_convention: str = "reference"
    """``reference`` (discount^d(s')) or ``paper`` (discount^(d(s') + 1)); becomes a
    :class:`RewardConvention`."""
    beta_g: float = 1.0
    """Weight of the graph advantage A^G."""
    beta_e: float = 1.0
    """Weight of the episode advantage A^E."""
    state_key: str = "observation"
    """Graph node identity: ``observation`` (``obs_key``) or ``observation_actions`` (``obs_key`` and the
    ``admissible_key`` column; see :mod:`training.advantages.state_key`); becomes a :class:`StateKey`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        set_checked(
            self,
            distance_discount=check_range(
                self.distance_discount, "distance_discount", 0.0, 1.0, low_open=True
            ),
            success_reward=float(self.success_reward),
            reward_convention=parse_enum(RewardConvention, self.reward_convention, "reward_convention"),
            beta_g=float(self.beta_g),
            beta_e=float(self.beta_e),
            state_key=parse_enum(StateKey, self.state_key, "state_key"),
        )


def reverse_bfs(src: np.ndarray, dst: np.ndarray, sources: np.ndarray, n_nodes: int) -> np.ndarray:
    """Unit-cost shortest distance from every node to the nearest of ``sources`` along edges src -> dst.

    Args:
        src, dst: ``[E]`` int64 edge endpoints (duplicates allowed).
        sources: ``[K]`` int64 nodes at distance 0.
        n_nodes: number of nodes.

    Returns:
        ``[n_nodes]`` int64 distance, -1 where no source is reachable. Cost O(E log E + n_nodes): each
        reversed edge is scanned once, level by level.
    """
    edge = dst * np.int64(n_nodes) + src
    ids, n_distinct = dense_ids(edge.view(np.uint64))
    distinct = np.empty(n_distinct, dtype=np.int64)
    distinct[ids] = edge
    pairs = np.sort(distinct)  # deduplicated edges sorted by dst: CSR of the reverse graph
    rdst, rsrc = pairs // n_nodes, pairs % n_nodes
    ptr = np.searchsorted(rdst, np.arange(n_nodes + 1))
    dist = np.full(n_nodes, -1, dtype=np.int64)
    frontier = np.unique(sources)
    dist[frontier] = 0
    level = 0
    while frontier.size:
        cand = rsrc[expand_ranges(ptr[frontier], ptr[frontier + 1])]
        cand = np.unique(cand[dist[cand] < 0])
        level += 1
        dist[cand] = level
        frontier = cand
    return dist


@register_estimator(
    "graphgpo", params=GraphGPOParams, episode_only={"beta_g": 0.0}, renamed={"omega": "distance_discount"}
)
def graphgpo(batch: StepBatch, params: GraphGPOParams) -> np.ndarray:
    """GraphGPO advantage: same-source comparison of graph rewards from distance-to-success.

    Args:
        batch: canonical ``StepBatch`` with N rows.
        params: see :class:`GraphGPOParams`.

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
        >>> np.round(compute_advantages("graphgpo", b, norm="mean"), 4).tolist()
        [9.95, -9.95]
        >>> b["admissible_key"] = np.array([1, 2], np.uint64)  # two states now: singleton sources, A^G = 0
        >>> compute_advantages("graphgpo", b, norm="mean", state_key="observation_actions").round(4).tolist()
        [5.0, -5.0]
    """
    adv_e = episode_advantage(batch, params)
    node, n_nodes = group_scoped_ids(batch, state_keys(batch, params.state_key))
    sink = n_nodes + batch.group  # one success sink per task group, after the state nodes
    last = batch.is_last
    won_last = last & batch.traj_won[batch.traj]
    target = np.full(batch.n_rows, -1, dtype=np.int64)  # -1: the unseen final obs of a failed trajectory
    target[:-1][~last[:-1]] = node[1:][~last[:-1]]
    target[won_last] = sink[won_last]
    has_edge = target >= 0
    n_all = n_nodes + batch.n_groups
    dist = reverse_bfs(node[has_edge], target[has_edge], np.unique(sink[won_last]), n_all)

    node_group = np.empty(n_all, dtype=np.int64)
    node_group[node] = batch.group
    node_group[n_nodes:] = np.arange(batch.n_groups)
    d_max = np.zeros(batch.n_groups, dtype=np.int64)
    np.maximum.at(d_max, node_group, dist)
    d_target = np.where(has_edge, dist[np.maximum(target, 0)], -1)
    d_target = np.where(d_target < 0, d_max[batch.group] + 1, d_target).astype(np.float64)
    exponent = d_target + (1.0 if params.reward_convention is RewardConvention.PAPER else 0.0)
    graph_reward = params.success_reward * params.distance_discount**exponent
    adv_g = segment_normalize(graph_reward, node, n_nodes, params.norm, params.eps, singleton="zero")
    group_won = np.bincount(batch.traj_group, weights=batch.traj_won, minlength=batch.n_groups) > 0
    adv_g = np.where(group_won[batch.group], adv_g, 0.0)
    return params.beta_g * adv_g + params.beta_e * adv_e
