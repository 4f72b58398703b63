"""The harness on the real envs: the experts score 100% through it (generated ALFWorld games, WebShop goals).

Skipped with a reason when an env package cannot be imported (e.g. the engine is not installed).
"""

import json
from pathlib import Path

import pytest

from agents.evaluate import EvalConfig, evaluate
from tests.paths import REPO_ROOT

SHARED_ALFWORLD = REPO_ROOT.parent / "shared" / "data" / "alfworld"


def _require(module: str) -> None:
    try:
        __import__(module)
    except Exception as error:  # an env that cannot load is a skip with its reason, not an error of this area
        pytest.skip(f"{module} is not usable here: {error!r}")


def _expert_summary(env_id: str, split: str, out: Path, **settings) -> dict:
    """The expert agent's evaluation on ``env_id``'s ``split`` (``settings``: the rest of its config)."""
    config = EvalConfig(env_id=env_id, agent="expert", split=split, out_dir=str(out), **settings)
    return evaluate(config, progress=False)


@pytest.fixture
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PROGPO_CACHE", str(tmp_path_factory.getbasetemp() / "agents-progpo-cache"))
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)


def test_expert_wins_every_generated_alfworld_game(tmp_path, private_cache):
    _require("progpo_envs.alfworld.env")
    summary = _expert_summary(
        "progpo/ALFWorld-v0", "train", tmp_path, num_envs=3, env_kwargs={"num_generated": 6}
    )
    assert summary["episodes"] == 6 and summary["success_rate"] == 1.0
    assert set(summary["per_task_type"]) == {"pick", "look", "clean", "heat", "cool", "pick_two"}
    assert summary["inadmissible_action_rate"] == 0.0
    first = json.loads((tmp_path / "trajectories.jsonl").read_text().splitlines()[0])
    assert first["task_text"] and first["trajectory"][0]["observation"].count("Your task is to:") == 1


def test_expert_buys_every_webshop_goal(tmp_path):
    _require("progpo_envs.webshop.env")
    settings = {"episodes": 10, "num_envs": 2, "env_kwargs": {"num_products": 200}}
    summary = _expert_summary("progpo/WebShop-v0", "test", tmp_path, **settings)
    assert summary["episodes"] == 10 and summary["success_rate"] == 1.0 and summary["mean_score"] == 1.0
    records = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert all(r["task_text"] and r["task_text"] in r["trajectory"][0]["observation"] for r in records)
    assert summary["inadmissible_action_rate"] == 0.0


@pytest.mark.slow
def test_expert_on_real_alfworld_valid_seen(tmp_path, private_cache):
    _require("progpo_envs.alfworld.env")
    if not (SHARED_ALFWORLD / "json_2.1.1" / "valid_seen").is_dir():
        pytest.skip(f"real ALFWorld trials not found at {SHARED_ALFWORLD}")
    settings = {"episodes": 12, "num_envs": 2, "data_dir": str(SHARED_ALFWORLD)}
    summary = _expert_summary("progpo/ALFWorld-v0", "valid_seen", tmp_path, **settings)
    assert summary["episodes"] == 12 and summary["success_rate"] == 1.0


def test_env_url_plays_alfworld_through_the_env_server(tmp_path, private_cache):
    _require("progpo_envs.alfworld.env")
    _require("progpo_envs.server.app")
    import gymnasium as gym

    from progpo_envs.server.app import ServerConfig, create_app
    from progpo_envs.server.policy import default_allowed_kwargs
    from progpo_envs.server.pool import PoolConfig
    from progpo_envs.server.serving import BackgroundServer

    # the expert agent needs the env's expert: `expert` is operator-only, so this operator allows it
    allowed = (*default_allowed_kwargs(gym.spec("progpo/ALFWorld-v0").entry_point), "expert")
    app = create_app(
        ServerConfig(
            env_ids=("progpo/ALFWorld-v0",),
            allowed_kwargs={"progpo/ALFWorld-v0": allowed},
            pool=PoolConfig(num_workers=1),
            env_kwargs={"progpo/ALFWorld-v0": {"num_generated": 6}},
        )
    )
    _expert_summary(
        "progpo/ALFWorld-v0", "train", tmp_path / "local", episodes=3, env_kwargs={"num_generated": 6}
    )
    with BackgroundServer(app) as server:
        settings = {"episodes": 3, "num_envs": 3, "env_url": server.url}
        summary = _expert_summary("progpo/ALFWorld-v0", "train", tmp_path / "remote", **settings)
    assert summary["success_rate"] == 1.0

    def episodes(name):
        lines = (tmp_path / name / "trajectories.jsonl").read_text().splitlines()
        return sorted((json.loads(line) for line in lines), key=lambda r: r["task_index"])

    assert episodes("remote") == episodes("local")  # same observations, actions, rewards and hashes
