"""``progpo_verl.verl_agent.install()`` against a stand-in verl-agent (``standin/``: verl-agent's signatures
and the behaviour the plugin relies on), end to end: ``run_ppo`` -> our env manager in verl-agent's loop ->
rows tagged, padded, shuffled -> our estimator through ``compute_advantage``."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import progpo_envs.testing  # noqa: F401  (registers agents-test/ToyALFWorld-v0)
from progpo_verl.rows import ACTION_COLUMN, STEP_COLUMN
from progpo_verl.verl_agent import contract
from progpo_verl.verl_agent.envs import ProGPOEnvManager
from progpo_verl.verl_agent.install import WRAPPED, action_text, install
from tests.progpo_verl.verl_batches import Batch, ScriptedActor, VocabTokenizer
from training.advantages import compute_advantages
from training.config import algo_parameters

STANDIN = Path(__file__).parent / "standin"
TOY_ENV = progpo_envs.testing.TOY_ALFWORLD_ENV_ID
PENALTY = 0.1


@pytest.fixture
def verl_agent(monkeypatch):
    """The stand-in's modules, imported fresh (and forgotten afterwards, wrappers and all)."""
    monkeypatch.syspath_prepend(str(STANDIN))
    import importlib

    modules = {hook.module: importlib.import_module(hook.module) for hook in contract.HOOKS}
    yield modules
    for name in list(sys.modules):
        if name in ("verl", "agent_system") or name.startswith(("verl.", "agent_system.")):
            del sys.modules[name]


def config(estimator: str, env_name: str = TOY_ENV, **algorithm) -> dict:
    """verl-agent's keys the stand-in and the plugin read (plain dicts: DictConfig is a mapping too)."""
    return {
        "algorithm": {"adv_estimator": estimator, "gamma": 0.95, "use_kl_in_reward": False, **algorithm},
        "actor_rollout_ref": {
            "actor": {"use_invalid_action_penalty": True, "invalid_action_penalty_coef": PENALTY},
            "rollout": {"multi_turn": {"enable": False}},
        },
        "env": {"env_name": env_name, "seed": 3, "max_steps": 6, "history_length": 2, "rollout": {"n": 4}},
        "data": {"train_batch_size": 3, "val_batch_size": 2},
        "trainer": {"total_training_steps": 2, "balance_batch": True, "size_divisor": 16, "seed": 0},
        "_standin": {
            "tokenizer": VocabTokenizer(),
            "actor": ScriptedActor(seed=1),
            "gen_batch": Batch({}, {"uid": np.array(["prompt"] * 3, dtype=object)}),
        },
    }


def reference_advantages(batch, tokenizer: VocabTokenizer, estimator: str, **params) -> np.ndarray:
    """Our estimator on the batch's rows, identified by the stand-in loop's own step counter and the
    responses (not by the plugin's tags); one value per (trajectory, step), given to every copy of it."""
    nt = batch.non_tensor_batch
    texts = tokenizer.batch_decode(batch.batch["responses"])
    key = np.array([f"{t}|{s}" for t, s in zip(nt["traj_uid"], nt["standin_step"], strict=True)])
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    traj = np.unique(nt["traj_uid"].astype(str), return_inverse=True)[1]
    episode = nt["episode_rewards"].astype(float)
    step = nt["standin_step"].astype(int)
    last = np.array([step[i] == step[traj == traj[i]].max() for i in range(len(step))])
    columns = {
        "group_id": np.unique(nt["uid"].astype(str), return_inverse=True)[1][first],
        "traj_id": traj[first],
        "step": step[first],
        "reward": nt["rewards"].astype(float)[first],
        "won": (last & (episode >= 10.0))[first],
        "valid": nt["is_action_valid"].astype(bool)[first],
        "obs_key": nt["anchor_obs"][first],
        "action_key": np.array([action_text(t) for t in texts], dtype=object)[first],
        "obs_text": nt["anchor_obs"][first],
    }
    return compute_advantages(estimator, columns, invalid_penalty=PENALTY, **params)[inverse.reshape(-1)]


def run(verl_agent, cfg):
    install()
    main_ppo = verl_agent["verl.trainer.main_ppo"]
    main_ppo.run_ppo(cfg)
    return main_ppo.RUNS[-1]


def test_the_standin_has_the_contracts_signatures(verl_agent):
    """The stand-in is the contract: if verl-agent's signatures move, HOOKS and the stand-in move together
    (test_verl_agent_source.py checks HOOKS against a real checkout)."""
    contract.check_hooks(verl_agent)


@pytest.mark.parametrize("name", ["progpo", "g2po", "graphgpo", "progpo_coverage", "progpo_gigpo"])
def test_our_estimator_runs_inside_verl_agents_loop_on_our_env(verl_agent, name):
    cfg = config(name)
    trainer = run(verl_agent, cfg)
    assert trainer.estimator_at_init == "grpo"  # verl-agent's critic-free list was passed ...
    assert cfg["algorithm"]["adv_estimator"] == name  # ... and the config keeps our name
    assert isinstance(trainer.envs, ProGPOEnvManager)  # verl-agent's make_envs knows no such env
    estimator = "gigpo" if name == "progpo_gigpo" else name
    for batch in trainer.batches:
        nt = batch.non_tensor_batch
        assert len(batch) % 16 == 0  # padded with copies:
        assert len(set(zip(nt["traj_uid"], nt["standin_step"], strict=True))) < len(batch)
        np.testing.assert_array_equal(nt[STEP_COLUMN].astype(int), nt["standin_step"].astype(int))
        assert not np.all(np.diff(nt["standin_step"].astype(int)) >= 0)  # shuffled
        mask = batch.batch["response_mask"]
        params = {"gamma": 0.95} if "gamma" in algo_parameters(estimator) else {}
        reference = reference_advantages(batch, cfg["_standin"]["tokenizer"], estimator, **params)
        want = torch.tensor(reference, dtype=torch.float32)
        torch.testing.assert_close(batch.batch["advantages"], want[:, None] * mask, rtol=0, atol=1e-6)
        assert batch.batch["returns"] is batch.batch["advantages"]
        assert nt["episode_rewards"].astype(float).max() == 10.0  # some episodes were won


def test_estimator_parameters_reach_our_estimator(verl_agent):
    cfg = config("progpo_gigpo", progpo_gigpo={"step_weight": 0.0, "norm": "mean"})
    trainer = run(verl_agent, cfg)
    batch = trainer.batches[0]
    want = reference_advantages(
        batch, cfg["_standin"]["tokenizer"], "grpo", norm="mean"
    )  # GiGPO without its step term is GRPO
    got = batch.batch["advantages"][:, 0].numpy()
    assert np.abs(got - want).max() <= 1e-6


def test_verl_agents_own_estimators_and_envs_are_untouched(verl_agent):
    cfg = config("grpo")
    trainer = run(verl_agent, cfg)
    batch = trainer.batches[0]
    assert trainer.estimator_at_init == "grpo"
    assert STEP_COLUMN not in batch.non_tensor_batch and ACTION_COLUMN not in batch.non_tensor_batch
    nt = batch.non_tensor_batch
    scores = nt["episode_rewards"].astype(np.float32)
    centred = np.array([s - scores[nt["uid"] == u].mean() for s, u in zip(scores, nt["uid"], strict=True)])
    np.testing.assert_allclose(batch.batch["advantages"][:, 0].numpy(), centred, atol=1e-6)
    make_envs = verl_agent["agent_system.environments"].make_envs
    assert make_envs(config("grpo", env_name="alfworld/AlfredTWEnv"))[0] == "verl-agent's alfworld envs"
    with pytest.raises(NotImplementedError):  # an unknown name still reaches verl-agent's else branch
        verl_agent["verl.trainer.ppo.ray_trainer"].compute_advantage(batch, adv_estimator="nonesuch")


def test_bad_parameters_fail_when_the_trainer_is_built(verl_agent):
    install()
    run_ppo = verl_agent["verl.trainer.main_ppo"].run_ppo
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['step_weigth'\]"):
        run_ppo(config("progpo", progpo={"step_weigth": 0.5}))
    with pytest.raises(ValueError, match="algorithm.gamma sets it"):
        run_ppo(config("progpo", progpo={"gamma": 0.9}))
    with pytest.raises(ValueError, match="invalid_action_penalty_coef sets it"):
        run_ppo(config("g2po", g2po={"invalid_penalty": 0.0}))
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        run_ppo(config("progpo", use_kl_in_reward=True))
    with pytest.raises(ValueError, match="progpo_rows: unknown key"):
        run_ppo(config("progpo", progpo_rows={"dedupe": True}))
    assert not verl_agent["verl.trainer.main_ppo"].RUNS


def test_our_estimator_outside_fit_is_an_error(verl_agent):
    install()
    ray_trainer = verl_agent["verl.trainer.ppo.ray_trainer"]
    with pytest.raises(RuntimeError, match="outside a RayPPOTrainer.fit"):
        ray_trainer.compute_advantage(Batch({}, {}), adv_estimator="progpo")


def test_install_is_idempotent(verl_agent):
    install()
    first = {hook.name: contract.resolve(verl_agent, hook) for hook in contract.HOOKS}
    install()
    for hook in contract.HOOKS:
        fn = contract.resolve(verl_agent, hook)
        assert fn is first[hook.name]
        if hook.name != "run_ppo":
            assert hasattr(fn, WRAPPED) and not hasattr(getattr(fn, WRAPPED), WRAPPED)
    env_manager = verl_agent["agent_system.environments"].env_manager
    assert env_manager.make_envs is verl_agent["agent_system.environments"].make_envs


def test_a_changed_signature_stops_install(verl_agent, monkeypatch):
    ray_trainer = verl_agent["verl.trainer.ppo.ray_trainer"]
    original = ray_trainer.compute_advantage

    def compute_advantage(data, adv_estimator, gamma=1.0, lam=1.0, config=None, **kwargs):
        return original(data, adv_estimator, gamma, lam, **kwargs)

    monkeypatch.setattr(ray_trainer, "compute_advantage", compute_advantage)
    with pytest.raises(contract.ContractError, match=r"compute_advantage\('data', 'adv_estimator', 'gamma'"):
        install()
    assert not hasattr(ray_trainer.RayPPOTrainer.__init__, WRAPPED)  # nothing wrapped


def test_a_missing_hook_stops_install(verl_agent, monkeypatch):
    monkeypatch.delattr(verl_agent["agent_system.multi_turn_rollout"].TrajectoryCollector, "multi_turn_loop")
    with pytest.raises(contract.ContractError, match="TrajectoryCollector.multi_turn_loop is missing"):
        install()


def test_an_estimator_shipped_under_our_name_stops_install(verl_agent, monkeypatch):
    import enum

    ray_trainer = verl_agent["verl.trainer.ppo.ray_trainer"]
    names = {e.name: e.value for e in ray_trainer.AdvantageEstimator}
    monkeypatch.setattr(
        ray_trainer, "AdvantageEstimator", enum.Enum("AdvantageEstimator", {**names, "G2PO": "g2po"})
    )
    with pytest.raises(contract.ContractError, match=r"named \['g2po'\]"):
        install()


def test_contract_parameters_read_the_signature():
    def hook(data, adv_estimator, *args, gamma=1.0, **kwargs): ...

    assert contract.parameters(hook) == ("data", "adv_estimator", "*args", "gamma", "**kwargs")
    assert list(inspect.signature(hook).parameters)[:2] == ["data", "adv_estimator"]
