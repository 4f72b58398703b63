"""Straightforward per-row Python reference implementations of every estimator (dicts and lists, no numpy
vectorisation). They restate the formulas of ``docs/algorithms.md`` independently of
``training.advantages`` and serve as cross-check oracles in the tests and as the speed baseline of
``benchmarks/bench_estimators.py speed``. Defaults only cover the parameters the tests and benchmark vary.

The oracle of estimator ``<name>`` is the function ``ref_<name>`` (found by that name: :func:`reference`).
"""

from __future__ import annotations

import math
import unicodedata
from collections import defaultdict, deque

import numpy as np

EPS = 1e-6


class Rows:
    """The batch as Python lists plus per-trajectory row lists in step order."""

    def __init__(self, batch):
        self.n = len(batch["step"])
        self.group = batch["group_id"].tolist()
        self.traj = batch["traj_id"].tolist()
        self.step = batch["step"].tolist()
        self.reward = [float(r) for r in batch["reward"].tolist()]
        self.won = [bool(w) for w in batch["won"].tolist()]
        self.valid = [bool(v) for v in batch["valid"].tolist()]
        self.obs = batch["obs_key"].tolist()
        self.action = batch["action_key"].tolist()
        self.text = batch["obs_text"].tolist() if "obs_text" in batch else None
        self.rows_of: dict = defaultdict(list)
        for i in range(self.n):
            self.rows_of[self.traj[i]].append(i)
        for t in self.rows_of:
            self.rows_of[t].sort(key=lambda i: self.step[i])
        self.ep_return = {t: sum(self.reward[i] for i in rows) for t, rows in self.rows_of.items()}
        self.traj_won = {t: any(self.won[i] for i in rows) for t, rows in self.rows_of.items()}
        self.group_of = {t: self.group[rows[0]] for t, rows in self.rows_of.items()}
        self.next_row = [None] * self.n
        for rows in self.rows_of.values():
            for a, b in zip(rows, rows[1:], strict=False):
                self.next_row[a] = b


def _stats(values):
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return n, mean, std, max(values) == min(values)


def normalize_groups(members: dict, value: list, norm: str, singleton: str, out=None) -> list:
    """members: key -> list of rows; returns per-row normalised values (see common.segment_normalize)."""
    out = [0.0] * len(value) if out is None else out
    for rows in members.values():
        vals = [value[i] for i in rows]
        n, mean, std, constant = _stats(vals)
        for i in rows:
            if n == 1:
                if singleton == "raw":
                    out[i] = value[i] / (1 + EPS) if norm == "mean_std" else value[i]
                else:
                    out[i] = 0.0
            elif constant:
                out[i] = 0.0
            elif norm == "mean_std":
                out[i] = (value[i] - mean) / (std + EPS)
            else:
                out[i] = value[i] - mean
    return out


def _scores(r: Rows, penalty: float) -> list:
    return [r.ep_return[r.traj[i]] - penalty * (not r.valid[i]) for i in range(r.n)]


def _outcome(r: Rows, scores: list, traj_score: dict, norm: str, scope: str) -> list:
    if scope == "cross_steps":
        members = defaultdict(list)
        for i in range(r.n):
            members[r.group[i]].append(i)
        return normalize_groups(members, scores, norm, "raw")
    per_group = defaultdict(list)
    for t, g in r.group_of.items():
        per_group[g].append(traj_score[t])
    out = [0.0] * r.n
    for i in range(r.n):
        n, mean, std, constant = _stats(per_group[r.group[i]])
        if n == 1:
            out[i] = scores[i] / (1 + EPS) if norm == "mean_std" else scores[i]
        elif constant:
            out[i] = 0.0
        else:
            out[i] = (scores[i] - mean) / (std + EPS) if norm == "mean_std" else scores[i] - mean
    return out


def _episode(r: Rows, norm, scope, penalty):
    return _outcome(r, _scores(r, penalty), r.ep_return, norm, scope)


def _step_returns(r: Rows, gamma: float, penalty: float) -> list:
    ret = [0.0] * r.n
    for rows in r.rows_of.values():
        acc = 0.0
        for i in reversed(rows):
            acc = r.reward[i] + gamma * acc
            ret[i] = acc - penalty * (not r.valid[i])
    return ret


def ref_grpo(batch, norm="mean_std", stats_scope="cross_steps", invalid_penalty=0.1):
    return np.array(_episode(Rows(batch), norm, stats_scope, invalid_penalty))


def ref_dapo(
    batch, norm="mean_std", stats_scope="cross_steps", invalid_penalty=0.1, drop_uniform_groups=True
):
    r = Rows(batch)
    adv = _episode(r, norm, stats_scope, invalid_penalty)
    if drop_uniform_groups:
        returns = defaultdict(set)
        for t, g in r.group_of.items():
            returns[g].add(r.ep_return[t])
        adv = [a if len(returns[r.group[i]]) > 1 else 0.0 for i, a in enumerate(adv)]
    return np.array(adv)


def ref_rloo(batch, stats_scope="cross_steps", invalid_penalty=0.1):
    r = Rows(batch)
    scores = _scores(r, invalid_penalty)
    out = [0.0] * r.n
    if stats_scope == "cross_steps":
        members = defaultdict(list)
        for i in range(r.n):
            members[r.group[i]].append(i)
        for rows in members.values():
            total = sum(scores[i] for i in rows)
            for i in rows:
                out[i] = scores[i] - (total - scores[i]) / (len(rows) - 1) if len(rows) > 1 else scores[i]
    else:
        trajs = defaultdict(list)
        for t, g in r.group_of.items():
            trajs[g].append(t)
        for i in range(r.n):
            ts = trajs[r.group[i]]
            others = [r.ep_return[t] for t in ts if t != r.traj[i]]
            out[i] = scores[i] - sum(others) / len(others) if others else scores[i]
    return np.array(out)


def ref_gigpo(
    batch, gamma=0.95, step_weight=1.0, norm="mean_std", stats_scope="cross_steps", invalid_penalty=0.1
):
    r = Rows(batch)
    adv_e = _episode(r, norm, stats_scope, invalid_penalty)
    ret = _step_returns(r, gamma, invalid_penalty)
    anchors = defaultdict(list)
    for i in range(r.n):
        anchors[(r.group[i], r.obs[i])].append(i)
    adv_s = normalize_groups(anchors, ret, norm, "zero")
    return np.array([e + step_weight * s for e, s in zip(adv_e, adv_s, strict=True)])


def ref_g2po(
    batch,
    gamma=0.95,
    step_weight=1.0,
    norm="mean_std",
    stats_scope="cross_steps",
    invalid_penalty=0.1,
    success_reward=10.0,
):
    r = Rows(batch)
    adv_e = _episode(r, norm, stats_scope, invalid_penalty)
    visits = defaultdict(list)
    for t, rows in r.rows_of.items():
        length = len(rows)
        for i in rows:
            visits[(r.group[i], r.obs[i])].append(gamma ** (length - r.step[i]) * r.ep_return[t])
    value = {k: sum(v) / len(v) for k, v in visits.items()}
    v_src, v_dst = [0.0] * r.n, [0.0] * r.n
    for i in range(r.n):
        v_src[i] = value[(r.group[i], r.obs[i])]
        j = r.next_row[i]
        if j is not None:
            v_dst[i] = value[(r.group[j], r.obs[j])]
        else:
            v_dst[i] = success_reward if r.traj_won[r.traj[i]] else 0.0
    sources, groups = defaultdict(list), defaultdict(list)
    for i in range(r.n):
        sources[(r.group[i], r.obs[i])].append(i)
        groups[r.group[i]].append(i)
    c1 = normalize_groups(
        sources, [v_dst[i] - invalid_penalty * (not r.valid[i]) for i in range(r.n)], norm, "zero"
    )
    c2 = normalize_groups(groups, [v_dst[i] - v_src[i] for i in range(r.n)], norm, "zero")
    return np.array([adv_e[i] + step_weight * (c1[i] + c2[i]) for i in range(r.n)])


def ref_graphgpo(
    batch,
    distance_discount=0.1,
    success_reward=10.0,
    reward_convention="reference",
    beta_g=1.0,
    beta_e=1.0,
    norm="mean_std",
    stats_scope="cross_steps",
    invalid_penalty=0.1,
):
    r = Rows(batch)
    adv_e = _episode(r, norm, stats_scope, invalid_penalty)
    SUCC = ("success-sink",)
    target = [None] * r.n
    for i in range(r.n):
        j = r.next_row[i]
        if j is not None:
            target[i] = r.obs[j]
        elif r.traj_won[r.traj[i]]:
            target[i] = SUCC
    adv_g = [0.0] * r.n
    by_group = defaultdict(list)
    for i in range(r.n):
        by_group[r.group[i]].append(i)
    for rows in by_group.values():
        if not any(target[i] == SUCC for i in rows):
            continue
        preds = defaultdict(set)
        nodes = {SUCC}
        for i in rows:
            nodes.add(r.obs[i])
            if target[i] is not None:
                preds[target[i]].add(r.obs[i])
        dist = {SUCC: 0}
        queue = deque([SUCC])
        while queue:
            u = queue.popleft()
            for p in preds[u]:
                if p not in dist:
                    dist[p] = dist[u] + 1
                    queue.append(p)
        d_max = max(dist.values())
        reward = {}
        for i in rows:
            d = dist.get(target[i], d_max + 1) if target[i] is not None else d_max + 1
            reward[i] = success_reward * distance_discount ** (d + (1 if reward_convention == "paper" else 0))
        sources = defaultdict(list)
        for i in rows:
            sources[r.obs[i]].append(i)
        vals = [reward.get(i, 0.0) for i in range(r.n)]
        normalize_groups(sources, vals, norm, "zero", out=adv_g)
    return np.array([beta_g * g + beta_e * e for g, e in zip(adv_g, adv_e, strict=True)])


def _norm_text(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", str(text)).lower().split()).strip(" .!?,;:")


def _similarity_clusters(r, threshold):
    """Per row, its cluster's representative text: in each task group, distinct normalised texts in sorted
    order join the first earlier representative with Indel ratio >= threshold, else found a cluster."""
    from rapidfuzz import fuzz

    out = [None] * r.n
    for g in sorted(set(r.group)):
        rows = [i for i in range(r.n) if r.group[i] == g]
        reps, rep_of = [], {}
        for text in sorted({_norm_text(r.text[i]) for i in rows}):
            rep = next((q for q in reps if fuzz.ratio(text, q) >= 100 * threshold), None)
            if rep is None:
                reps.append(text)
                rep = text
            rep_of[text] = rep
        for i in rows:
            out[i] = rep_of[_norm_text(r.text[i])]
    return out


def ref_progpo(
    batch,
    gamma=0.95,
    step_weight=1.0,
    norm="mean_std",
    stats_scope="cross_steps",
    invalid_penalty=0.1,
    success_reward=10.0,
    depths=(0, 1, 2, "inf"),
    min_samples=2,
    variance_floor=None,
    transition_mode="peerless",
    transition_weight=1.0,
    reliability_gate=True,
    reliability_kappa=None,
    success_potential=None,
    dedup_depths=True,
    leave_one_out=False,
    semantic="similarity",
    similarity_threshold=0.95,
):
    """ProGPO, step-return target; depth-0 states by normalised text or greedy similarity clusters (obs keys
    without text)."""
    r = Rows(batch)
    lam = 1e-2 * success_reward**2 if variance_floor is None else variance_floor
    kappa = 1.0 / lam if reliability_kappa is None else reliability_kappa
    adv_e = _episode(r, norm, stats_scope, invalid_penalty)
    ret = _step_returns(r, gamma, invalid_penalty)
    # exact prefixes as trie node ids: (parent prefix, previous action, observation) -> id
    trie: dict = {}
    prefix = [0] * r.n
    for rows in r.rows_of.values():
        node = ("root", r.group[rows[0]])
        for k, i in enumerate(rows):
            node = trie.setdefault((node, r.action[rows[k - 1]] if k else None, r.obs[i]), len(trie))
            prefix[i] = node
    peers = defaultdict(list)
    for i in range(r.n):
        peers[prefix[i]].append(i)
    has_peer = [len(peers[prefix[i]]) >= 2 for i in range(r.n)]
    peer = normalize_groups(peers, ret, norm, "zero")
    if r.text is None:
        cur = r.obs
    elif semantic == "normalized_text":
        cur = [_norm_text(t) for t in r.text]
    else:
        cur = _similarity_clusters(r, similarity_threshold)
    num, den = [0.0] * r.n, [0.0] * r.n
    counted_sets: list[set] = [set() for _ in range(r.n)]  # member sets of the depths already fused, per row
    for depth in depths:
        keys = []
        for i in range(r.n):
            if depth == "inf":
                keys.append(("inf", prefix[i]))
                continue
            rows = r.rows_of[r.traj[i]]
            s = r.step[i]
            window = tuple((r.obs[rows[s - j]], r.action[rows[s - j]]) for j in range(1, min(depth, s) + 1))
            keys.append((depth, r.group[i], cur[i] if depth == 0 else r.obs[i], window))
        members = defaultdict(list)
        for i, k in enumerate(keys):
            members[k].append(i)
        for rows in members.values():
            members_set = frozenset(rows)
            for i in rows:
                if dedup_depths and members_set in counted_sets[i]:
                    continue  # the same rows as a shallower depth: the same estimate again
                counted_sets[i].add(members_set)
                sample = [ret[j] for j in rows if not (leave_one_out and j == i)]
                n, mean, std, _ = _stats(sample) if sample else (0, 0.0, 0.0, True)
                if n >= min_samples:
                    w = n / (std**2 + lam)
                    num[i] += w * mean
                    den[i] += w
    group_rows = defaultdict(list)
    for i in range(r.n):
        group_rows[r.group[i]].append(i)

    def group_baseline(i):
        others = [ret[j] for j in group_rows[r.group[i]] if not (leave_one_out and j == i)] or [ret[i]]
        return sum(others) / len(others)

    phi = [num[i] / den[i] if den[i] > 0 else group_baseline(i) for i in range(r.n)]
    s_pot = 0.0 if success_potential is None else success_potential  # the TD reading for the step return
    delta, gate = [0.0] * r.n, [0.0] * r.n
    for i in range(r.n):
        j = r.next_row[i]
        if j is None:
            nxt, inv_next = (s_pot if r.traj_won[r.traj[i]] else 0.0), 0.0
        else:
            nxt, inv_next = phi[j], (1.0 / den[j] if den[j] > 0 else math.inf)
        delta[i] = r.reward[i] - invalid_penalty * (not r.valid[i]) + gamma * nxt - phi[i]
        inv = (1.0 / den[i] if den[i] > 0 else math.inf) + gamma**2 * inv_next
        rho = 0.0 if math.isinf(inv) else 1.0 / inv
        gate[i] = rho / (rho + kappa) if reliability_gate else 1.0
    trans = normalize_groups(group_rows, delta, norm, "zero")
    out = []
    for i in range(r.n):
        t = transition_weight * gate[i] * trans[i]
        if transition_mode == "peerless":
            step = peer[i] if has_peer[i] else t
        else:
            step = (peer[i] if has_peer[i] else 0.0) + t
        out.append(adv_e[i] + step_weight * step)
    return np.array(out)


def ref_progpo_coverage(
    batch,
    gamma=0.95,
    step_weight=1.0,
    norm="mean_std",
    stats_scope="cross_steps",
    invalid_penalty=0.1,
    coverage="trajectory",
):
    r = Rows(batch)
    gig = ref_gigpo(batch, gamma, step_weight, norm, stats_scope, invalid_penalty)
    novel = [False] * r.n
    if coverage == "trajectory":
        for rows in r.rows_of.values():
            seen = set()
            for i in rows:
                novel[i] = r.obs[i] not in seen
                seen.add(r.obs[i])
    else:
        earliest: dict = {}
        for i in range(r.n):
            k = (r.group[i], r.obs[i])
            earliest[k] = min(earliest.get(k, r.step[i]), r.step[i])
        novel = [r.step[i] == earliest[(r.group[i], r.obs[i])] for i in range(r.n)]
    count = {t: sum(novel[i] for i in rows) for t, rows in r.rows_of.items()}
    cov_e = _outcome(
        r,
        [count[r.traj[i]] - invalid_penalty * (not r.valid[i]) for i in range(r.n)],
        count,
        norm,
        stats_scope,
    )
    bonus = [
        (float(novel[r.next_row[i]]) if r.next_row[i] is not None else 0.0)
        - invalid_penalty * (not r.valid[i])
        for i in range(r.n)
    ]
    anchors = defaultdict(list)
    for i in range(r.n):
        anchors[(r.group[i], r.obs[i])].append(i)
    cov_s = normalize_groups(anchors, bonus, norm, "zero")
    failed = defaultdict(lambda: True)
    for t, g in r.group_of.items():
        if r.ep_return[t] != 0:
            failed[g] = False
    return np.array([cov_e[i] + step_weight * cov_s[i] if failed[r.group[i]] else gig[i] for i in range(r.n)])


def ref_toy_return_baseline(
    batch, gamma=0.95, step_weight=1.0, norm="mean_std", stats_scope="cross_steps", invalid_penalty=0.1
):
    r = Rows(batch)
    adv_e = _episode(r, norm, stats_scope, invalid_penalty)
    members = defaultdict(list)
    for i in range(r.n):
        members[r.group[i]].append(i)
    step = normalize_groups(members, _step_returns(r, gamma, invalid_penalty), norm, "zero")
    return np.array([e + step_weight * s for e, s in zip(adv_e, step, strict=True)])


#: Estimator name -> its oracle, every ``ref_<name>`` of this module.
REFERENCES = {
    name.removeprefix("ref_"): fn for name, fn in dict(globals()).items() if name.startswith("ref_")
}


def reference(name: str):
    """The reference oracle of estimator ``name``; a missing one fails naming what to add."""
    if name not in REFERENCES:
        where = "tests/training/advantages/advantages_reference.py"
        raise LookupError(f"estimator {name!r} has no reference oracle: add ref_{name} to {where}")
    return REFERENCES[name]
