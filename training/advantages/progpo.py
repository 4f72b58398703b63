"""ProGPO — Progress- and Reliability-Oriented Group Policy Optimization (Fan & Liu, arXiv 2607.04242),
§6.1 of the spec. **Reconstructed from the paper's abstract**: no code or method section was available.

From the paper's text (abstract): critic-free, context-consistent step-level learning that keeps
*exact-prefix action comparison*, complemented, where peer comparisons are sparse, by *transition credit*
derived from *rollout-based state potentials*, which are estimated with *semantic expansion* and
*inverse-variance fusion across history depths*; depth weights use sample size and return variance
(secondary summary).

Our reading (every item is a :class:`ProGPOConfig` field; defaults = the spec's proposals):

1. Exact-prefix peers. key_inf(t) = (task group, o_0, a_0, ..., a_{t-1}, o_t). Rows sharing key_inf form a
   peer group; A^peer = normalize(R_t) inside it (R_t as GiGPO: discounted return minus invalid penalty).
   A row "has a peer" when its peer group has >= 2 members.
2. Potentials at history depths k in ``depths`` (k = 0: current observation only, with semantic expansion;
   ``"inf"``: the exact prefix). Per key: Phi_k = mean target, n_k = count, s_k^2 = sample variance.
   Depth k is eligible when n_k >= ``min_samples``; weight w_k = n_k / (s_k^2 + lambda) (precision of the
   mean, lambda = ``variance_floor``, default 1e-2 * success_reward^2).
   Phi(s) = sum_k w_k Phi_k / sum_k w_k, reliability rho(s) = sum_k w_k (precision of Phi). With no
   eligible depth, Phi = the task group's mean target and rho = 0.
   *De-duplicated depths* (``dedup_depths``, default on): the keys are nested (a deeper key refines a
   shallower one), and near the start of an episode (t <= k) several depths group exactly the same rows. Their
   means are then one estimate, not independent evidence, so a depth whose key groups exactly the same rows
   as a shallower depth adds no weight (summing them inflated rho up to 4x with four depths).
   *Leave-one-out* (``leave_one_out``, off by default): Phi_k, s_k and n_k of a row are computed over the
   other rows of its key (n_k - 1 of them), so the row's own return R_t is not part of the baseline it is
   compared with (as RLOO's baseline leaves the sample out).
   Terminal: Phi(after success) = ``success_potential``, Phi(after failure or truncation) = 0, both with
   infinite reliability. The default success_potential is 0 when the potential estimates the step return
   (R_t already contains the success reward on the winning step, so the TD error
   delta = r_T - Phi(s_T) must not add it again) and success_reward when it estimates success * r_succ.
3. Transition credit. delta_t = r_t - penalty * invalid_t + gamma * Phi(s_{t+1}) - Phi(s_t);
   A^trans = normalize(delta) over ``transition_scope`` (the task group's rows, or its peerless rows).
   Reliability gate c_rel = rho_delta / (rho_delta + kappa) with rho_delta = 1 / (1/rho(s_t) +
   gamma^2/rho(s_{t+1})) (precision of delta); kappa = ``reliability_kappa`` (default 1/lambda).
4. Step advantage. ``transition_mode="peerless"`` (default): A^step = A^peer where a peer exists, else
   transition_weight * c_rel * A^trans. ``"additive"``: A^step = [A^peer or 0] + transition_weight * c_rel *
   A^trans on every row.
5. A = A^E + step_weight * A^step, A^E the GiGPO/GRPO episode advantage.

The earlier "Progress-conditioned" version (first-visit coverage in all-failed groups) is the separate
estimator ``progpo_coverage``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum

import numpy as np

from training.advantages.batch import StepBatch
from training.advantages.common import (
    discounted_returns,
    episode_advantage,
    full_prefix_keys,
    group_scoped_ids,
    segment_normalize,
    window_keys,
)
from training.advantages.params import StepWeightedParams, check_range, parse_enum, set_checked
from training.advantages.registry import ESTIMATORS, register_estimator
from training.advantages.semantic import SemanticMode, state_keys


class PotentialTarget(str, Enum):
    """What a state potential estimates: the discounted step return R_t, or episode success * r_succ."""

    STEP_RETURN = "step_return"
    SUCCESS = "success"


class TransitionMode(str, Enum):
    """Where transition credit enters: only on peerless rows, or added to every row."""

    PEERLESS = "peerless"
    ADDITIVE = "additive"


class TransitionScope(str, Enum):
    """Population over which delta is normalised: the whole task group, or its peerless rows."""

    GROUP = "group"
    PEERLESS = "peerless"


@dataclass(frozen=True)
class ProGPOConfig(StepWeightedParams):
    """ProGPO parameters; every reconstructed choice of the spec (§6.1-6.2) is a field.

    The shared ones: ``gamma`` discounts step returns and the next-state potential, ``norm`` normalises A^E,
    A^peer and A^trans, ``invalid_penalty`` is subtracted from invalid rows' score, step return and transition
    reward. Enumerated fields become their enums and ``depths`` a sorted tuple without repeats.
    """

    success_reward: float = 10.0
    """Reward of a successful episode (r_succ; sets the default lambda and terminal potential)."""
    depths: tuple = (0, 1, 2, "inf")
    """History depths fused into the potential; ``"inf"`` = exact prefix (K in {0,1,2,inf}, history 2)."""
    semantic: str = "similarity"
    """Semantic expansion of the depth-0 key: exact, normalized_text, similarity (default: greedy clusters
    at Indel ratio >= ``similarity_threshold``, as GiGPO's option) or embedding. The envs already hash a
    normalised observation, so normalized_text (the first reading's default) merged nothing on ALFWorld."""
    similarity_threshold: float = 0.95
    """Indel-ratio threshold (0..1) for ``semantic="similarity"`` (GiGPO's 0.95)."""
    embedding_threshold: float = 0.9
    """Cosine threshold for ``semantic="embedding"``."""
    min_samples: int = 2
    """n_min: a depth's key needs this many rows to contribute to the potential."""
    variance_floor: float | None = None
    """lambda in w_k = n_k / (s_k^2 + lambda); None = 1e-2 * success_reward^2."""
    potential_target: str = "step_return"
    """``step_return`` (R_t, default) or ``success`` (success_reward if the episode succeeded, else 0)."""
    success_potential: float | None = None
    """Phi after a successful last step; None = 0 for the step-return target (R_t already holds the success
    reward: the TD reading), success_reward for the success target. The spec's old default was success_reward
    for both, which counts the terminal success twice under the step-return target."""
    dedup_depths: bool = True
    """A depth whose key groups exactly the same rows as a shallower depth adds no weight (not independent
    evidence). False sums every depth's precision, as the spec's first reading did."""
    leave_one_out: bool = False
    """Compute each row's potential without its own target (Phi_k over the other n_k - 1 rows of its key)."""
    transition_mode: str = "peerless"
    """``peerless`` (transition credit only where no exact-prefix peer exists) or ``additive``."""
    transition_weight: float = 1.0
    """Scale of the transition credit."""
    transition_scope: str = "group"
    """``group`` or ``peerless``: rows over which delta is normalised."""
    reliability_gate: bool = True
    """Scale transition credit by c_rel = rho_delta / (rho_delta + kappa)."""
    reliability_kappa: float | None = None
    """kappa of the gate; None = 1 / lambda."""

    def __post_init__(self) -> None:
        super().__post_init__()
        set_checked(
            self,
            semantic=parse_enum(SemanticMode, self.semantic, "semantic"),
            potential_target=parse_enum(PotentialTarget, self.potential_target, "potential_target"),
            transition_mode=parse_enum(TransitionMode, self.transition_mode, "transition_mode"),
            transition_scope=parse_enum(TransitionScope, self.transition_scope, "transition_scope"),
            success_reward=check_range(self.success_reward, "success_reward", 0.0, np.inf, low_open=True),
            variance_floor=_optional_positive(self.variance_floor, "variance_floor"),
            reliability_kappa=_optional_positive(self.reliability_kappa, "reliability_kappa"),
            min_samples=_min_samples(self.min_samples),
            depths=_parse_depths(self.depths),
            success_potential=None if self.success_potential is None else float(self.success_potential),
            transition_weight=float(self.transition_weight),
        )


@dataclass(frozen=True)
class ProGPOComponents:
    """All ``[N]`` canonical-order parts of a ProGPO advantage (for diagnostics and tests)."""

    episode: np.ndarray
    has_peer: np.ndarray
    peer: np.ndarray
    potential: np.ndarray
    reliability: np.ndarray
    delta: np.ndarray
    gate: np.ndarray
    transition: np.ndarray
    """Transition credit actually used in the step advantage (after mode, gate and weight)."""
    step: np.ndarray
    total: np.ndarray


def _optional_positive(value: float | None, param: str) -> float | None:
    """None (a default derived from other fields), or ``value`` as a float in (0, inf]."""
    return None if value is None else check_range(value, param, 0.0, np.inf, low_open=True)


def _min_samples(value: int) -> int:
    if int(value) < 1:
        raise ValueError(f"parameter 'min_samples' must be >= 1, got {value!r}")
    return int(value)


def _parse_depths(depths) -> tuple[int | str, ...]:
    """Sorted, de-duplicated history depths: ints >= 0, then ``"inf"`` (also accepted as None)."""
    out: set[int | str] = set()
    for d in depths:
        if d == "inf" or d is None:
            out.add("inf")
        elif isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0:
            out.add(int(d))
        else:
            raise ValueError(f"parameter 'depths': entries must be ints >= 0 or 'inf', got {d!r}")
    if not out:
        raise ValueError("parameter 'depths' must not be empty")
    return tuple(sorted(out, key=lambda d: np.inf if d == "inf" else d))


def _key_statistics(
    target: np.ndarray, seg: np.ndarray, n_seg: int, leave_one_out: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: sample count, mean and unbiased variance of ``target`` over the row's key segment.

    Args:
        target: ``[N]`` float64 values.
        seg: ``[N]`` int64 segment ids in ``0..n_seg-1``.
        n_seg: number of segments.
        leave_one_out: leave the row's own value out (n - 1 samples; mean and variance of the others).

    Returns:
        ``(n [N] float64, mean [N], var [N])``; var is 0 with fewer than two samples, mean is 0 with none.
    """
    count = np.bincount(seg, minlength=n_seg)[seg].astype(np.float64)
    total = np.bincount(seg, weights=target, minlength=n_seg)[seg]
    if not leave_one_out:
        mean = total / np.maximum(count, 1.0)
        dev = target - mean
        squares = np.bincount(seg, weights=dev * dev, minlength=n_seg)[seg]
        return count, mean, squares / np.maximum(count - 1.0, 1.0)
    # the others' sum of squared deviations from their own mean, from the segment's central moments:
    # S_others = S_all - (x - m_all)^2 * n / (n - 1)  (the one-sample downdate of Welford's update)
    mean_all = total / np.maximum(count, 1.0)
    dev = target - mean_all
    squares_all = np.bincount(seg, weights=dev * dev, minlength=n_seg)[seg]
    others = count - 1.0
    safe = np.maximum(others, 1.0)
    mean = np.where(others > 0, (total - target) / safe, 0.0)
    squares = np.maximum(squares_all - dev * dev * count / safe, 0.0)
    var = np.where(others > 1, squares / np.maximum(others - 1.0, 1.0), 0.0)
    return others, mean, var


def _same_rows(
    seg: np.ndarray, n_seg: int, row_count: np.ndarray, earlier_seg: np.ndarray, earlier_count: np.ndarray
) -> np.ndarray:
    """``[N]`` bool: the row's segment under ``seg`` holds exactly the rows of its segment under
    ``earlier_seg`` (same size, and every member shares one earlier segment)."""
    low = np.full(n_seg, np.iinfo(np.int64).max)
    high = np.full(n_seg, -1)
    np.minimum.at(low, seg, earlier_seg)
    np.maximum.at(high, seg, earlier_seg)
    inside_one = (low == high)[seg]
    return inside_one & (row_count == earlier_count)


def progpo_components(batch: StepBatch, cfg: ProGPOConfig) -> ProGPOComponents:
    """Compute every ProGPO part on a canonical batch (see the module docstring for the formulas)."""
    norm, eps, penalty, gamma = cfg.norm, cfg.eps, cfg.invalid_penalty, cfg.gamma
    r_succ = cfg.success_reward
    lam = 1e-2 * r_succ**2 if cfg.variance_floor is None else cfg.variance_floor
    kappa = 1.0 / lam if cfg.reliability_kappa is None else cfg.reliability_kappa
    invalid = (~batch.valid).astype(np.float64)

    episode = episode_advantage(batch, cfg)
    step_return = discounted_returns(batch, gamma) - penalty * invalid

    # (1) exact-prefix peer comparison
    prefix_seg, n_prefix = group_scoped_ids(batch, full_prefix_keys(batch))
    has_peer = np.bincount(prefix_seg, minlength=n_prefix)[prefix_seg] >= 2
    peer = segment_normalize(step_return, prefix_seg, n_prefix, norm, eps, singleton="zero")

    # (2) potentials fused across history depths by inverse variance
    if cfg.potential_target is PotentialTarget.STEP_RETURN:
        target = step_return
    else:
        target = r_succ * batch.traj_won[batch.traj].astype(np.float64)
    weighted = np.zeros(batch.n_rows)
    precision = np.zeros(batch.n_rows)
    shallower: list[tuple[np.ndarray, np.ndarray]] = []  # (segment ids, row counts) of the depths done
    for depth in cfg.depths:
        if depth == "inf":
            seg, n_seg = prefix_seg, n_prefix
        else:
            current = None
            if depth == 0:
                current = state_keys(
                    batch,
                    cfg.semantic,
                    similarity_threshold=cfg.similarity_threshold,
                    embedding_threshold=cfg.embedding_threshold,
                )
            seg, n_seg = group_scoped_ids(batch, window_keys(batch, depth, current))
        n_k, mean_k, var_k = _key_statistics(target, seg, n_seg, bool(cfg.leave_one_out))
        w = np.where(n_k >= cfg.min_samples, n_k / (var_k + lam), 0.0)
        if cfg.dedup_depths:
            row_count = np.bincount(seg, minlength=n_seg)[seg]
            for earlier_seg, earlier_count in shallower:
                w[_same_rows(seg, n_seg, row_count, earlier_seg, earlier_count)] = 0.0
            shallower.append((seg, row_count))
        weighted += w * mean_k
        precision += w
    group_count, group_mean, _ = _key_statistics(target, batch.group, batch.n_groups, bool(cfg.leave_one_out))
    fallback = np.where(group_count > 0, group_mean, target)  # a one-row group has no other rows
    potential = np.where(precision > 0, weighted / np.where(precision > 0, precision, 1.0), fallback)

    # (3) transition credit from the potential difference
    last = batch.is_last
    next_potential = np.empty(batch.n_rows)
    next_precision = np.empty(batch.n_rows)
    next_potential[:-1] = potential[1:]
    next_precision[:-1] = precision[1:]
    if cfg.success_potential is not None:
        success_potential = cfg.success_potential
    else:
        success_potential = 0.0 if cfg.potential_target is PotentialTarget.STEP_RETURN else r_succ
    next_potential[last] = np.where(batch.traj_won[batch.traj[last]], success_potential, 0.0)
    next_precision[last] = np.inf
    delta = batch.reward - penalty * invalid + gamma * next_potential - potential
    with np.errstate(divide="ignore"):
        inv_var = np.where(precision > 0, 1.0 / precision, np.inf) + gamma**2 * np.where(
            next_precision > 0, 1.0 / next_precision, np.inf
        )
        rho_delta = np.where(np.isfinite(inv_var), 1.0 / inv_var, 0.0)
    gate = rho_delta / (rho_delta + kappa) if cfg.reliability_gate else np.ones(batch.n_rows)
    if cfg.transition_scope is TransitionScope.GROUP:
        trans_seg, n_trans = batch.group, batch.n_groups
    else:
        trans_seg, n_trans = 2 * batch.group + has_peer, 2 * batch.n_groups
    trans_norm = segment_normalize(delta, trans_seg, n_trans, norm, eps, singleton="zero")
    transition = cfg.transition_weight * gate * trans_norm

    # (4) step advantage, (5) total
    if cfg.transition_mode is TransitionMode.PEERLESS:
        transition = np.where(has_peer, 0.0, transition)
    step = np.where(has_peer, peer, 0.0) + transition
    total = episode + cfg.step_weight * step
    return ProGPOComponents(
        episode=episode,
        has_peer=has_peer,
        peer=np.where(has_peer, peer, 0.0),
        potential=potential,
        reliability=precision,
        delta=delta,
        gate=gate,
        transition=transition,
        step=step,
        total=total,
    )


@register_estimator(
    "progpo", params=ProGPOConfig, episode_only={"step_weight": 0.0}, renamed={"omega": "step_weight"}
)
def progpo(batch: StepBatch, cfg: ProGPOConfig) -> np.ndarray:
    """ProGPO advantage: exact-prefix peer comparison plus reliability-gated transition credit.

    Args:
        batch: canonical ``StepBatch`` with N rows.
        cfg: see :class:`ProGPOConfig` (each field documents itself and its default).

    Returns:
        ``[N]`` float64 = A^E + step_weight * A^step.

    Example:
        >>> from training.advantages import compute_advantages
        >>> b = {"group_id": np.zeros(2, int), "traj_id": np.array([0, 1]), "step": np.zeros(2, int),
        ...      "reward": np.array([10.0, 0.0]), "won": np.array([True, False]),
        ...      "valid": np.ones(2, bool), "obs_key": np.zeros(2, np.uint64),
        ...      "action_key": np.arange(2, dtype=np.uint64)}
        >>> compute_advantages("progpo", b, norm="mean").tolist()   # one shared prefix: pure peer credit
        [10.0, -10.0]
    """
    return progpo_components(batch, cfg).total


def progpo_report(batch, **params) -> dict:
    """How much step signal comes from exact-prefix peers vs transition credit, on one batch.

    Args:
        batch: column mapping (as for ``compute_advantages``) or ``StepBatch``.
        **params: :class:`ProGPOConfig` fields (checked as ``compute_advantages`` checks them).

    Returns:
        dict with ``rows``, ``peer_fraction`` (rows with an exact-prefix peer), ``peerless_fraction``,
        ``peerless_with_credit_fraction`` (peerless rows whose transition credit is non-zero),
        ``transition_share`` (sum |transition credit| / sum |A^step|), ``mean_gate_peerless`` and the config.
    """
    cfg = ESTIMATORS["progpo"].config(**params)
    steps = StepBatch.from_columns(batch)
    parts = progpo_components(steps, cfg)
    peerless = ~parts.has_peer
    step_mass = float(np.abs(parts.step).sum())
    return {
        "rows": steps.n_rows,
        "peer_fraction": float(parts.has_peer.mean()),
        "peerless_fraction": float(peerless.mean()),
        "peerless_with_credit_fraction": float((parts.transition[peerless] != 0).mean())
        if peerless.any()
        else 0.0,
        "transition_share": float(np.abs(parts.transition).sum()) / step_mass if step_mass > 0 else 0.0,
        "mean_gate_peerless": float(parts.gate[peerless].mean()) if peerless.any() else 0.0,
        "config": {k: v.value if isinstance(v, Enum) else v for k, v in asdict(cfg).items()},
    }
