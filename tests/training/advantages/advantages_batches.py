"""Step-row batches for the advantage tests and ``benchmarks/bench_estimators.py speed``.

``build_batch`` turns readable trajectory specs into columns (hand-computed tests); ``random_walk_batch``
makes synthetic batches with realistic state repeats.

Each task group is a small deterministic world (``n_states`` rooms, a transition table per action, the goal
``goal_distance`` "progress" moves from the start). All G trajectories of a group start in the same room.
The policy has a preferred action per room (the progress action with probability ``p_prefer_progress``),
taken with a per-trajectory probability in [0.75, 0.98] (a sampled LLM mostly repeats its favourite
action), otherwise a uniformly random action; an invalid action (probability ``p_invalid``) leaves the
state unchanged, like ALFWorld's "Nothing happens.".
Reaching the goal ends the episode with reward 10 and ``won``; otherwise it is truncated at ``max_steps``.
So states repeat across trajectories (shared start, revisits, loops and self-loops), as in ALFWorld.
"""

from __future__ import annotations

import numpy as np
import xxhash


def _mix(a: np.ndarray, b: int) -> np.ndarray:
    x = (a.astype(np.uint64) + np.uint64(b)) * np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(29)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    return x ^ (x >> np.uint64(32))


def random_walk_batch(
    n_groups: int,
    traj_per_group: int = 8,
    max_steps: int = 50,
    n_states: int = 40,
    n_actions: int = 6,
    goal_distance: int = 12,
    p_invalid: float = 0.05,
    p_prefer_progress: float = 0.6,
    seed: int = 0,
    with_text: bool = False,
    n_rows: int | None = None,
) -> dict[str, np.ndarray]:
    """Build a batch (column dict, trajectory-major row order).

    Args:
        n_groups: task groups.
        traj_per_group: trajectories per group (G).
        max_steps: truncation length.
        n_states: rooms per group world.
        n_actions: actions per room; action 0 moves one step closer to the goal.
        goal_distance: progress moves from start to goal.
        p_invalid: probability of an invalid action per step.
        p_prefer_progress: probability that a room's preferred action is the progress action.
        seed: RNG seed (same seed -> same batch).
        with_text: add an ``obs_text`` column (a sentence per room, with cosmetic case/space noise).
        n_rows: keep only the first ``n_rows`` rows (the last trajectory may be cut: a truncation).

    Returns:
        dict of 1-D arrays with the columns of ``compute_advantages``.
    """
    rng = np.random.default_rng(seed)
    n_traj = n_groups * traj_per_group
    # World: room r in 0..goal_distance lies on the path; action 0 advances along it, others jump anywhere.
    table = rng.integers(0, n_states, size=(n_groups, n_states, n_actions))
    table[:, :, 0] = np.minimum(np.arange(n_states) + 1, goal_distance)[None, :]
    table[:, goal_distance:, 0] = rng.integers(0, n_states, size=(n_groups, n_states - goal_distance))
    group = np.repeat(np.arange(n_groups), traj_per_group)
    preferred = np.where(
        rng.random((n_groups, n_states)) < p_prefer_progress,
        0,
        rng.integers(1, n_actions, size=(n_groups, n_states)),
    )
    p_follow = rng.uniform(0.75, 0.98, size=n_traj)
    state = np.zeros(n_traj, dtype=np.int64)
    alive = np.ones(n_traj, dtype=bool)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("traj", "step", "state", "action", "valid", "won")}
    for t in range(max_steps):
        idx = np.flatnonzero(alive)
        if idx.size == 0:
            break
        act = np.where(
            rng.random(idx.size) < p_follow[idx],
            preferred[group[idx], state[idx]],
            rng.integers(0, n_actions, idx.size),
        )
        valid = rng.random(idx.size) >= p_invalid
        nxt = np.where(valid, table[group[idx], state[idx], act], state[idx])
        won = nxt == goal_distance
        for k, v in (
            ("traj", idx),
            ("step", np.full(idx.size, t)),
            ("state", state[idx]),
            ("action", act),
            ("valid", valid),
            ("won", won),
        ):
            cols[k].append(v)
        state[idx] = nxt
        alive[idx[won]] = False
    traj = np.concatenate(cols["traj"])
    order = np.lexsort((np.concatenate(cols["step"]), traj))
    out = {k: np.concatenate(v)[order] for k, v in cols.items()}
    if n_rows is not None:
        if n_rows > out["traj"].size:
            raise ValueError(f"asked for {n_rows} rows but the batch has {out['traj'].size}; add groups")
        out = {k: v[:n_rows] for k, v in out.items()}
    g = group[out["traj"]]
    batch = {
        "group_id": g.astype(np.int64),
        "traj_id": out["traj"].astype(np.int64),
        "step": out["step"].astype(np.int64),
        "reward": np.where(out["won"], 10.0, 0.0),
        "won": out["won"],
        "valid": out["valid"],
        "obs_key": _mix(g * n_states + out["state"], 1),
        "action_key": _mix(out["action"], 2),
    }
    if with_text:
        noise = rng.integers(0, 3, size=g.size)
        base = [
            f"You are in room {s} of house {h}. You see a drawer {s % 5}."
            for h, s in zip(g, out["state"], strict=True)
        ]
        batch["obs_text"] = np.array(
            [
                t if k == 0 else t.upper() if k == 1 else "  " + t.replace(" ", "  ")
                for t, k in zip(base, noise, strict=True)
            ],
            dtype=object,
        )
    return batch


def text_key(text: str) -> np.uint64:
    """xxh3-64 of a string as numpy uint64 (how tests build keys from readable names)."""
    return np.uint64(xxhash.xxh3_64_intdigest(text.encode("utf-8")))


def build_batch(trajs: list[dict], *, text: bool = False) -> dict[str, np.ndarray]:
    """Rows from readable trajectory specs, in trajectory-major order.

    Each spec: ``group`` (int), ``obs`` (list of state names), optional ``actions`` (names; default "a<i>"),
    ``success`` (bool: reward 10 and ``won`` on the last step), ``invalid`` (set of invalid step indices),
    ``texts`` (observation texts, used when ``text=True``). Keys are the names as str objects.
    """
    cols: dict[str, list] = {
        k: []
        for k in (
            "group_id",
            "traj_id",
            "step",
            "reward",
            "won",
            "valid",
            "obs_key",
            "action_key",
            "obs_text",
        )
    }
    for t, spec in enumerate(trajs):
        n = len(spec["obs"])
        actions = spec.get("actions", [f"a{i}" for i in range(n)])
        for s in range(n):
            last_success = spec.get("success", False) and s == n - 1
            cols["group_id"].append(spec["group"])
            cols["traj_id"].append(t)
            cols["step"].append(s)
            cols["reward"].append(10.0 if last_success else 0.0)
            cols["won"].append(last_success)
            cols["valid"].append(s not in spec.get("invalid", ()))
            cols["obs_key"].append(spec["obs"][s])
            cols["action_key"].append(actions[s])
            cols["obs_text"].append(spec.get("texts", spec["obs"])[s])
    out = {
        "group_id": np.array(cols["group_id"], dtype=np.int64),
        "traj_id": np.array(cols["traj_id"], dtype=np.int64),
        "step": np.array(cols["step"], dtype=np.int64),
        "reward": np.array(cols["reward"], dtype=np.float64),
        "won": np.array(cols["won"], dtype=bool),
        "valid": np.array(cols["valid"], dtype=bool),
        "obs_key": np.array(cols["obs_key"], dtype=object),
        "action_key": np.array(cols["action_key"], dtype=object),
    }
    if text:
        out["obs_text"] = np.array(cols["obs_text"], dtype=object)
    return out
