"""Against a real verl-agent checkout, when ``PROGPO_TEST_VERL_AGENT_SRC`` names one (CI never downloads it;
skipped without): the functions the plugin wraps have the contract's parameters (read with ``ast``, nothing
imported), verl-agent ships the estimator names the contract lists, and verl-agent's own GiGPO
(``gigpo/core_gigpo.py``, run on our DataProto-shaped batches) gives what our adapter and GiGPO give."""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from progpo_verl.estimator import estimator_spec
from progpo_verl.rows import RowOptions
from progpo_verl.verl_agent.contract import BUILTIN_ESTIMATORS, HOOKS
from tests.progpo_verl.verl_batches import pad_and_shuffle, rollout_batch

PENALTY = 0.1


def module_file(source: Path, module: str) -> Path:
    path = source.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def defined_parameters(source: Path, module: str, name: str) -> tuple[str, ...]:
    """The parameters of ``name`` (``Class.method`` too) where ``module`` defines it or imports it from."""
    tree = ast.parse(module_file(source, module).read_text(encoding="utf-8"))
    head, *rest = name.split(".")
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == head for a in node.names):
            origin = node.module if not node.level else f"{module}.{node.module}" if node.module else module
            return defined_parameters(source, origin, name)
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == head:
            found = node
            for part in rest:
                found = next(n for n in found.body if isinstance(n, ast.FunctionDef) and n.name == part)
            args = found.args
            names = [a.arg for a in (*args.posonlyargs, *args.args)]
            names += [f"*{args.vararg.arg}"] if args.vararg else []
            names += [a.arg for a in args.kwonlyargs]
            names += [f"**{args.kwarg.arg}"] if args.kwarg else []
            return tuple(names)
    raise AssertionError(f"{module}.{name} not found")


def test_the_wrapped_functions_have_the_contracts_parameters(verl_agent_source):
    for hook in HOOKS:
        assert defined_parameters(verl_agent_source, hook.module, hook.name) == hook.parameters, hook


def test_verl_agent_ships_the_estimators_the_contract_lists(verl_agent_source):
    ray_trainer = module_file(verl_agent_source, "verl.trainer.ppo.ray_trainer")
    tree = ast.parse(ray_trainer.read_text(encoding="utf-8"))
    enum = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AdvantageEstimator")
    values = [ast.literal_eval(n.value) for n in enum.body if isinstance(n, ast.Assign)]
    assert tuple(values) == BUILTIN_ESTIMATORS


@pytest.fixture(scope="module")
def core_gigpo(verl_agent_source):
    """verl-agent's ``gigpo/core_gigpo.py``, loaded with a bare ``verl`` module (it only names DataProto)."""
    stub = types.ModuleType("verl")
    stub.DataProto = object
    saved = sys.modules.get("verl")
    sys.modules["verl"] = stub
    try:
        spec = importlib.util.spec_from_file_location(
            "verl_agent_core_gigpo", verl_agent_source / "gigpo" / "core_gigpo.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["verl"]
        else:
            sys.modules["verl"] = saved
    return module


def verl_agent_gigpo(core_gigpo, batch, padded, mode: str, gamma: float = 0.95) -> np.ndarray:
    """verl-agent's GiGPO as its trainer runs it: step returns before ``adjust_batch`` (on ``batch``), the
    episode reward on each row's last response token (EpisodeRewardManager), the invalid-action penalty on
    both (apply_invalid_action_penalty), then ``compute_gigpo_outcome_advantage`` on ``padded``."""
    batch.batch["input_ids"] = batch.batch["responses"]
    returns = core_gigpo.compute_step_discounted_returns(batch, gamma).numpy()
    by_row = {
        (t, int(s)): r
        for t, s, r in zip(
            batch.non_tensor_batch["traj_uid"], batch.non_tensor_batch["progpo_step"], returns, strict=True
        )
    }
    nt = padded.non_tensor_batch
    invalid = torch.tensor(1.0 - nt["is_action_valid"].astype(np.float32))
    mask = padded.batch["response_mask"]
    last = mask.sum(-1) - 1
    rewards = torch.zeros(mask.shape, dtype=torch.float32)
    rewards[torch.arange(len(last)), last] = (
        torch.tensor(nt["episode_rewards"].astype(np.float32)) - PENALTY * invalid
    )
    step_rewards = torch.tensor(
        [by_row[(t, int(s))] for t, s in zip(nt["traj_uid"], nt["progpo_step"], strict=True)]
    )
    scores, _ = core_gigpo.compute_gigpo_outcome_advantage(
        token_level_rewards=rewards,
        step_rewards=step_rewards - PENALTY * invalid,
        response_mask=mask,
        anchor_obs=nt["anchor_obs"],
        index=nt["uid"],
        traj_index=nt["traj_uid"],
        step_advantage_w=1.0,
        mode=mode,
    )
    return scores[:, 0].numpy().astype(np.float64)


@pytest.mark.parametrize(("mode", "norm"), [("mean_std_norm", "mean_std"), ("mean_norm", "mean")])
def test_verl_agents_gigpo_is_ours_on_the_same_rows(core_gigpo, mode, norm, capsys):
    batch, _ = rollout_batch(21, groups=6, group_size=8, max_steps=8)
    shuffled, _ = pad_and_shuffle(batch, seed=22, copies=0)
    theirs = verl_agent_gigpo(core_gigpo, batch, shuffled, mode)
    ours = estimator_spec("gigpo", {"gamma": 0.95, "norm": norm}, invalid_penalty=PENALTY)
    diff = np.abs(ours.row_advantages(shuffled.non_tensor_batch) - theirs).max()
    with capsys.disabled():
        print(f"\n[verl-agent GiGPO {mode}] {len(shuffled)} shuffled rows: max |ours - theirs| = {diff:.2e}")
    assert diff <= 1e-5  # verl-agent computes in float32

    padded, _ = pad_and_shuffle(batch, seed=23, copies=5)
    theirs = verl_agent_gigpo(core_gigpo, batch, padded, mode)
    diffs = {}
    for duplicates in ("dedupe", "count"):
        spec = estimator_spec(
            "gigpo",
            {"gamma": 0.95, "norm": norm},
            invalid_penalty=PENALTY,
            rows=RowOptions(duplicates=duplicates),
        )
        diffs[duplicates] = np.abs(spec.row_advantages(padded.non_tensor_batch) - theirs).max()
    with capsys.disabled():
        print(
            f"[verl-agent GiGPO {mode}] {len(padded)} rows with 5 copies: max |ours - theirs| = "
            f"{diffs['dedupe']:.2e} (dedupe), {diffs['count']:.2e} (count)"
        )
    assert diffs["count"] < diffs["dedupe"]
