"""The credit diagnostics' library: recorded step rows, the expert-mixed-with-noise batches, their JSONL
format, the estimator specs and the per-estimator metrics.

:mod:`benchmarks.credit_diagnostics` defines the metrics and runs them; :mod:`benchmarks.compare_estimators`,
:mod:`benchmarks.progpo_ablation` and :mod:`benchmarks.record_policy_rollouts` share the specs, the rows and
the recorder from here, so that no benchmark imports another.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from progpo_envs.core.hashing import action_set_key, hex_key
from training.advantages import ESTIMATORS, check_parameter_names, compute_advantages

#: |value| at or below this counts as zero (estimators return exact zeros; this only absorbs float noise).
ZERO_TOL = 1e-9
#: Placeholder admissible actions (WebShop's ``search[<query>]``) that cannot be sent verbatim.
PLACEHOLDER_MARK = "<"

# ------------------------------------------------------------------------------------------------------------
# Recorded rows
# ------------------------------------------------------------------------------------------------------------


@dataclass
class StepRow:
    """One recorded step: the state it was taken in, the action, and what the expert says about it.

    Attributes:
        group_id: task group (the G rollouts of one task).
        traj_id: rollout id, unique in the batch.
        step: 0-based step index.
        obs: anchor observation text at this step (the raw env observation, no prompt or history).
        action: the action taken.
        reward: env reward of the step.
        won: the episode was won at this step.
        valid: the action was well-formed / admissible.
        expert_action: the expert's action at this state ("" when unknown).
        progress: ``d(s_t) - d(s_{t+1})`` with ``d`` the expert's remaining plan length (None when unknown).
        admissible_key: key of the state's set of admissible actions (:func:`action_set_key`; None when not
            recorded, e.g. rollout files written before it existed).
    """

    group_id: int
    traj_id: int
    step: int
    obs: str
    action: str
    reward: float
    won: bool
    valid: bool
    expert_action: str = ""
    progress: float | None = None
    admissible_key: int | None = None


def rows_to_batch(rows: Sequence[StepRow]) -> dict[str, np.ndarray]:
    """Columns for :func:`training.advantages.compute_advantages` (observation/action texts as keys); the
    ``admissible_key`` column only when every row has one (``state_key="observation_actions"`` needs it).

    Example:
        >>> b = rows_to_batch([StepRow(0, 0, 0, "room", "go", 10.0, True, True)])
        >>> sorted(b)[:4], b["reward"].tolist()
        (['action_key', 'group_id', 'obs_key', 'obs_text'], [10.0])
    """
    obs = np.array([r.obs for r in rows], dtype=object)
    admissible = (
        {"admissible_key": np.array([r.admissible_key for r in rows], dtype=np.uint64)}
        if rows and all(r.admissible_key is not None for r in rows)
        else {}
    )
    return {
        "group_id": np.array([r.group_id for r in rows], dtype=np.int64),
        "traj_id": np.array([r.traj_id for r in rows], dtype=np.int64),
        "step": np.array([r.step for r in rows], dtype=np.int64),
        "reward": np.array([r.reward for r in rows], dtype=np.float64),
        "won": np.array([r.won for r in rows], dtype=bool),
        "valid": np.array([r.valid for r in rows], dtype=bool),
        "obs_key": obs,
        "action_key": np.array([r.action for r in rows], dtype=object),
        "obs_text": obs,
        **admissible,
    }


# ------------------------------------------------------------------------------------------------------------
# Recording rollouts: expert mixed with a noisy policy
# ------------------------------------------------------------------------------------------------------------

#: ``distance(env) -> int | None``: the expert's remaining plan length in the env's current state.
DistanceFn = Callable[[Any], "int | None"]


def _random_action(info: dict, obs: str, rng: np.random.Generator) -> str:
    """A uniformly random admissible action; a placeholder such as ``search[<query>]`` becomes a search for
    three random words of the current observation."""
    admissible = list(info.get("admissible_actions") or [])
    if not admissible:
        return str(info.get("expert_action", ""))
    action = admissible[int(rng.integers(len(admissible)))]
    if PLACEHOLDER_MARK in action and action.startswith("search["):
        words = [w for w in obs.replace("[SEP]", " ").split() if w.isalpha()] or ["item"]
        picks = [words[int(i)] for i in rng.integers(len(words), size=3)]
        action = f"search[{' '.join(picks).lower()}]"
    return action


def record_group(
    env,
    task_index: int,
    group_size: int,
    noise: float,
    rng_seed: Sequence[int],
    distance: DistanceFn | None,
    *,
    group_id: int,
    first_traj_id: int,
) -> list[StepRow]:
    """Play ``group_size`` episodes of one task with the expert mixed with uniform random actions.

    Args:
        env: a Gymnasium env reporting ``info["expert_action"]`` and ``info["admissible_actions"]``.
        task_index: passed as ``reset(options={"task_index": ...})``.
        group_size: rollouts in the group (G).
        noise: probability ``p`` of a random admissible action at each step.
        rng_seed: entropy for ``numpy.random.default_rng``; rollout ``k`` uses ``[*rng_seed, k]``.
        distance: the expert's remaining plan length in the env's current state, or None (no progress labels).
        group_id: id written in the rows.
        first_traj_id: trajectory ids are ``first_traj_id .. first_traj_id + group_size - 1``.

    Returns:
        The step rows of the group, trajectory by trajectory.
    """
    rows: list[StepRow] = []
    for k in range(group_size):
        rng = np.random.default_rng([*rng_seed, k])
        obs, info = env.reset(options={"task_index": task_index})
        d_before = distance(env) if distance else None
        t = 0
        while True:
            expert_action = str(info.get("expert_action", ""))
            use_random = rng.random() < noise
            action = _random_action(info, obs, rng) if use_random or not expert_action else expert_action
            next_obs, reward, terminated, truncated, next_info = env.step(action)
            won = bool(next_info.get("won", False))
            d_after = 0 if won else (distance(env) if distance else None)
            progress = None if d_before is None or d_after is None else float(d_before - d_after)
            rows.append(
                StepRow(
                    group_id=group_id,
                    traj_id=first_traj_id + k,
                    step=t,
                    obs=obs,
                    action=action,
                    reward=float(reward),
                    won=won,
                    valid=bool(
                        next_info.get("action_valid", action in (info.get("admissible_actions") or [action]))
                    ),
                    expert_action=expert_action,
                    progress=progress,
                    admissible_key=int(action_set_key(info.get("admissible_actions") or ())),
                )
            )
            obs, info, d_before, t = next_obs, next_info, d_after, t + 1
            if terminated or truncated:
                break
    return rows


def alfworld_source(max_steps: int, generator_seed: int = 0, **env_kwargs: Any):
    """``(env, distance)`` for the generated ALFWorld games with the expert and its plan-length oracle
    (``env_kwargs``: more ``progpo/ALFWorld-v0`` options, e.g. a task restriction)."""
    import gymnasium as gym

    import progpo_envs  # noqa: F401  (registers the envs)
    from progpo_envs.alfworld.expert import ALFWorldExpert

    env = gym.make(
        "progpo/ALFWorld-v0", expert=True, max_steps=max_steps, generator_seed=generator_seed, **env_kwargs
    )
    experts: dict[str, ALFWorldExpert] = {}

    def distance(e) -> int | None:
        inner = e.unwrapped
        task = inner.task
        expert = experts.get(task.task_id)
        if expert is None:
            expert = experts[task.task_id] = ALFWorldExpert(task.traj_data())
        if inner.engine.won:
            return 0
        plan = expert.plan(inner.engine.facts())
        return len(plan) if plan else None  # empty and not won: no plan shape reaches the goal

    return env, distance


def alfworld_tasks(env, per_type: int) -> list[tuple[int, str]]:
    """The first ``per_type`` task indices of each task type as ``(task_index, task_type)``, types sorted."""
    by_type: dict[str, list[int]] = {}
    for i, task in enumerate(env.unwrapped.tasks):
        by_type.setdefault(task.task_type, []).append(i)
    return [(i, kind) for kind in sorted(by_type) for i in by_type[kind][:per_type]]


def webshop_source(max_steps: int, num_products: int):
    """``(env, None)`` for the self-hosted WebShop (generated catalog) with the scripted expert; WebShop has
    no plan-length oracle, so only ``corr_expert`` is defined there."""
    import gymnasium as gym

    import progpo_envs  # noqa: F401

    env = gym.make(
        "progpo/WebShop-v0", split="test", num_products=num_products, expert=True, max_steps=max_steps
    )
    return env, None


# ------------------------------------------------------------------------------------------------------------
# Rollout files (e.g. the warm-started policy's batches)
# ------------------------------------------------------------------------------------------------------------


def load_rollouts_jsonl(path: str | Path) -> list[StepRow]:
    """Read recorded rollouts: one JSON object per line, one line per step.

    Required keys: ``group_id`` and ``traj_id`` (int or str; rows of one rollout share ``traj_id``, rollouts
    of one task group share ``group_id``), ``step`` (0-based int), ``obs`` (the anchor observation text the
    action was taken from), ``action`` (str), ``reward`` (float), ``won`` (bool). Optional: ``valid`` (bool,
    default true), ``expert_action`` (str: the expert's action at that state), ``progress`` (float:
    decrease of
    the expert's remaining plan length caused by the step), ``admissible_key`` (16 hex digits: the key of the
    state's admissible-action set; files without it load with ``None``). Blank lines are skipped.

    Raises:
        ValueError: a line is not a JSON object or lacks a required key (the message names the line).

    Example:
        >>> import tempfile, json
        >>> p = Path(tempfile.mkdtemp()) / "r.jsonl"
        >>> _ = p.write_text(json.dumps({"group_id": "g", "traj_id": "a", "step": 0, "obs": "o",
        ...                              "action": "x", "reward": 0.0, "won": False}) + "\\n")
        >>> load_rollouts_jsonl(p)[0].group_id
        0
    """
    required = ("group_id", "traj_id", "step", "obs", "action", "reward", "won")
    ids: dict[str, dict[Any, int]] = {"group_id": {}, "traj_id": {}}
    rows: list[StepRow] = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
        missing = [k for k in required if k not in rec]
        if missing:
            raise ValueError(f"{path}:{lineno}: missing key(s) {missing}")
        dense = {k: ids[k].setdefault(json.dumps(rec[k]), len(ids[k])) for k in ids}
        progress = rec.get("progress")
        admissible_key = rec.get("admissible_key")
        try:
            admissible_key = None if admissible_key is None else int(admissible_key, 16)
        except (TypeError, ValueError):
            raise ValueError(
                f"{path}:{lineno}: admissible_key must be 16 hex digits, got {admissible_key!r}"
            ) from None
        rows.append(
            StepRow(
                group_id=dense["group_id"],
                traj_id=dense["traj_id"],
                step=int(rec["step"]),
                obs=str(rec["obs"]),
                action=str(rec["action"]),
                reward=float(rec["reward"]),
                won=bool(rec["won"]),
                valid=bool(rec.get("valid", True)),
                expert_action=str(rec.get("expert_action") or ""),
                progress=None if progress is None else float(progress),
                admissible_key=admissible_key,
            )
        )
    return rows


def save_rollouts_jsonl(rows: Iterable[StepRow], path: str | Path) -> None:
    """Write rows in the format of :func:`load_rollouts_jsonl` (``admissible_key`` as :func:`hex_key`)."""
    with Path(path).open("w", encoding="utf-8") as fh:
        for row in rows:
            rec = asdict(row)
            if row.admissible_key is not None:
                rec["admissible_key"] = hex_key(row.admissible_key)
            fh.write(json.dumps(rec) + "\n")


# ------------------------------------------------------------------------------------------------------------
# Metrics
# ------------------------------------------------------------------------------------------------------------


def peer_fractions(rows: Sequence[StepRow]) -> dict[str, float]:
    """Share of rows with another row of the same task group sharing (a) the whole history
    ``(o_0, a_0, ..., o_t)`` (exact prefix) or (b) the current observation (GiGPO's anchor state).

    Example:
        >>> r = [StepRow(0, 0, 0, "s", "a", 0, False, True), StepRow(0, 1, 0, "s", "b", 0, False, True),
        ...      StepRow(0, 0, 1, "x", "c", 0, False, True), StepRow(0, 1, 1, "x", "c", 0, False, True)]
        >>> peer_fractions(r)   # step 1: same obs "x" but different histories (a vs b)
        {'exact_prefix_peer_fraction': 0.5, 'anchor_peer_fraction': 1.0}
    """
    if not rows:
        return {"exact_prefix_peer_fraction": 0.0, "anchor_peer_fraction": 0.0}
    ordered = sorted(rows, key=lambda r: (r.traj_id, r.step))
    prefix_of: list[tuple] = []
    history: dict[int, tuple] = {}
    for r in ordered:
        prefix = history.get(r.traj_id, ()) + (r.obs,)
        prefix_of.append((r.group_id, prefix))
        history[r.traj_id] = prefix + (r.action,)
    anchors = [(r.group_id, r.obs) for r in ordered]
    count_prefix: dict[tuple, int] = {}
    count_anchor: dict[tuple, int] = {}
    for p, a in zip(prefix_of, anchors, strict=True):
        count_prefix[p] = count_prefix.get(p, 0) + 1
        count_anchor[a] = count_anchor.get(a, 0) + 1
    n = len(ordered)
    return {
        "exact_prefix_peer_fraction": sum(count_prefix[p] >= 2 for p in prefix_of) / n,
        "anchor_peer_fraction": sum(count_anchor[a] >= 2 for a in anchors) / n,
    }


def pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson correlation, or None with fewer than 3 points or a constant input.

    Example:
        >>> pearson(np.array([1.0, 2, 3]), np.array([2.0, 4, 7]))
        0.9933992677987828
    """
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def step_signal(name: str, batch: dict, advantages: np.ndarray, params: dict | None = None) -> np.ndarray:
    """The part of ``advantages`` (from estimator ``name``) that is not its episode-level advantage: minus the
    same estimator with its registration's ``episode_only`` parameters; 0 for one without a step term."""
    off = ESTIMATORS[name].episode_only
    if not off:
        return np.zeros_like(advantages)
    episode = compute_advantages(name, batch, **{**(params or {}), **off})
    return advantages - episode


def estimator_metrics(name: str, rows: Sequence[StepRow], params: dict | None = None) -> dict[str, Any]:
    """Every per-estimator diagnostic of the module docstring on one batch (None where undefined)."""
    batch = rows_to_batch(rows)
    adv = compute_advantages(name, batch, **(params or {}))
    step = step_signal(name, batch, adv, params)
    nonzero = np.abs(step) > ZERO_TOL
    has_progress = np.array([r.progress is not None for r in rows])
    progress = np.array([r.progress if r.progress is not None else 0.0 for r in rows])
    has_expert = np.array([bool(r.expert_action) for r in rows])
    agrees = np.array([float(r.action == r.expert_action) for r in rows])
    signed = nonzero & has_progress & (progress != 0)
    return {
        "nonzero_step_fraction": float(nonzero.mean()),
        "corr_progress": pearson(adv[has_progress], progress[has_progress]),
        "corr_expert": pearson(adv[has_expert], agrees[has_expert]),
        "step_corr_progress": pearson(step[nonzero & has_progress], progress[nonzero & has_progress]),
        "step_sign_accuracy": float((np.sign(step[signed]) == np.sign(progress[signed])).mean())
        if signed.any()
        else None,
        "advantage_var": float(adv.var()),
        "step_var": float(step.var()),
    }


def batch_stats(rows: Sequence[StepRow]) -> dict[str, Any]:
    """Estimator-independent facts of a batch: sizes, success, expert agreement, peer fractions."""
    trajs: dict[int, bool] = {}
    for r in rows:
        trajs[r.traj_id] = trajs.get(r.traj_id, False) or r.won
    labelled = [r for r in rows if r.progress is not None]
    return {
        "rows": len(rows),
        "trajectories": len(trajs),
        "groups": len({r.group_id for r in rows}),
        "success_rate": sum(trajs.values()) / len(trajs) if trajs else 0.0,
        "expert_agreement": float(np.mean([r.action == r.expert_action for r in rows if r.expert_action]))
        if any(r.expert_action for r in rows)
        else None,
        "progress_labelled_fraction": len(labelled) / len(rows) if rows else 0.0,
        "mean_progress": float(np.mean([r.progress for r in labelled])) if labelled else None,
        **peer_fractions(rows),
    }


#: ProGPO's first reading (before issue 20): terminal potential r_succ under the step-return target, every
#: depth's precision summed, normalised-text expansion, the row's own return inside its potential.
PROGPO_FIRST_READING = {
    "success_potential": 10,
    "dedup_depths": False,
    "semantic": "normalized_text",
    "leave_one_out": False,
}
#: Each change of issue 20 applied alone to the first reading.
PROGPO_CHANGES = {
    "success_potential": 0,
    "dedup_depths": True,
    "semantic": "similarity",
    "leave_one_out": True,
}


def progpo_spec(**changes: Any) -> str:
    """The estimator spec of ProGPO's first reading with ``changes`` applied (every ablated key spelled out).

    Example:
        >>> progpo_spec(success_potential=0)
        'progpo:success_potential=0,dedup_depths=false,semantic=normalized_text,leave_one_out=false'
    """
    params = {**PROGPO_FIRST_READING, **changes}
    return "progpo:" + ",".join(f"{k}={json.dumps(v).strip(chr(34))}" for k, v in params.items())


def parse_estimator_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"name"`` or ``"name:key=value,key=value"`` -> ``(name, params)``; values are JSON when they parse
    (numbers, true/false, null), else strings. Keys are checked against the estimator's parameters here, so a
    bad one fails before any rollout is recorded.

    Example:
        >>> parse_estimator_spec("progpo:success_potential=0,norm=mean")
        ('progpo', {'success_potential': 0, 'norm': 'mean'})
    """
    name, _, rest = spec.partition(":")
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r} in {spec!r}; registered: {sorted(ESTIMATORS)}")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"estimator spec {spec!r}: expected key=value, got {item!r}")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    check_parameter_names(name, params, ESTIMATORS[name].parameters)
    return name, params


def analyse(rows: Sequence[StepRow], estimators: Sequence[str]) -> dict[str, Any]:
    """``{"batch": batch_stats, "estimators": {spec: estimator_metrics}}`` for one batch; each spec is an
    estimator name with optional parameters (:func:`parse_estimator_spec`)."""
    metrics = {}
    for spec in estimators:
        name, params = parse_estimator_spec(spec)
        metrics[spec] = estimator_metrics(name, rows, params)
    return {"batch": batch_stats(rows), "estimators": metrics}


# ------------------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------------------


@dataclass
class DiagnosticsConfig:
    """Settings of one diagnostics run (recorded in the JSON)."""

    seed: int = 0
    noise: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])
    group_size: int = 8  # the papers' G
    alfworld_tasks_per_type: int = 2
    alfworld_max_steps: int = 50  # the papers' ALFWorld limit
    webshop_goals: int = 16
    webshop_max_steps: int = 15  # the papers' WebShop limit
    webshop_num_products: int = 200
    sources: list[str] = field(default_factory=lambda: ["alfworld", "webshop"])
    #: estimator specs (``name`` or ``name:key=value,...``): every registered estimator with its defaults,
    #: plus ProGPO's first reading (the defaults before issue 20; benchmarks/progpo_ablation.py has each
    #: change) and GraphGPO keyed by observation and admissible actions (``state_key``).
    estimators: list[str] = field(
        default_factory=lambda: [*sorted(ESTIMATORS), progpo_spec(), "graphgpo:state_key=observation_actions"]
    )


QUICK = {"noise": [0.3, 0.7], "alfworld_tasks_per_type": 1, "alfworld_max_steps": 30, "webshop_goals": 8}


def record_source(source: str, cfg: DiagnosticsConfig, noise_index: int, progress_cb=None) -> list[StepRow]:
    """All groups of one source at noise level ``cfg.noise[noise_index]``."""
    noise = cfg.noise[noise_index]
    if source == "alfworld":
        env, distance = alfworld_source(cfg.alfworld_max_steps)
        tasks = [i for i, _ in alfworld_tasks(env, cfg.alfworld_tasks_per_type)]
    elif source == "webshop":
        env, distance = webshop_source(cfg.webshop_max_steps, cfg.webshop_num_products)
        tasks = list(range(min(cfg.webshop_goals, env.unwrapped.num_tasks)))
    else:
        raise ValueError(f"unknown source {source!r}; choose alfworld or webshop")
    rows: list[StepRow] = []
    try:
        for g, task in enumerate(tasks):
            rows += record_group(
                env,
                task,
                cfg.group_size,
                noise,
                [cfg.seed, noise_index, task],
                distance,
                group_id=g,
                first_traj_id=g * cfg.group_size,
            )
            if progress_cb:
                progress_cb()
    finally:
        env.close()
    return rows
