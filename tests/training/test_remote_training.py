"""Training on an env hosted by an env server (``env.url``) gives the run an in-process env gives."""

from __future__ import annotations

import json
from pathlib import Path

from tests.paths import REPO_ROOT
from tests.training.training_helpers import TINY_OVERRIDES, subprocess_env
from training.cli import main

CONFIGS = REPO_ROOT / "configs"
VOLATILE = ("time", "per_s", "peak")
#: The training toy env under a hostable id (env servers host ``progpo/*`` ids only).
HOSTED_ID = "progpo/ToyALFWorldTraining-v0"


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not any(w in k for w in VOLATILE)} for x in lines]


def test_remote_env_training_matches_in_process(tmp_path, monkeypatch):
    from progpo_envs.core.registration import register_text_env
    from progpo_envs.server.app import ServerConfig, create_app
    from progpo_envs.server.pool import PoolConfig
    from progpo_envs.server.serving import BackgroundServer

    register_text_env(HOSTED_ID, "progpo_envs.testing:DrawerEnv")
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])  # env workers import the toy env
    args = ["--config", str(CONFIGS / "quickstart.yaml"), *TINY_OVERRIDES, "iterations=2"]
    assert main([*args, f"run_dir={tmp_path / 'local'}"]) == 0
    from progpo_envs.server.policy import default_allowed_kwargs

    # the warm start plays the expert remotely: `expert` is operator-only, so this operator allows it
    allowed = (*default_allowed_kwargs("progpo_envs.testing:DrawerEnv"), "expert")
    server_config = ServerConfig(
        env_ids=(HOSTED_ID,), allowed_kwargs={HOSTED_ID: allowed}, pool=PoolConfig(num_workers=1)
    )
    with BackgroundServer(create_app(server_config)) as server:
        remote_args = [f"run_dir={tmp_path / 'remote'}", f"env.url={server.url}", f"env.id={HOSTED_ID}"]
        assert main([*args, *remote_args]) == 0
    local, remote = _records(tmp_path / "local"), _records(tmp_path / "remote")
    assert [r["kind"] for r in remote] == [r["kind"] for r in local]
    assert remote == local  # same tasks, same episodes, same updates
    assert any(r["kind"] == "train" and r["rows"] > 0 for r in remote)

    # over two servers (groups spread, batches in parallel): the same run, each server's share recorded too
    with (
        BackgroundServer(create_app(server_config)) as first,
        BackgroundServer(create_app(server_config)) as second,
    ):
        urls = f"{first.url},{second.url}"
        fleet_args = [f"run_dir={tmp_path / 'fleet'}", f"env.url={urls}", f"env.id={HOSTED_ID}"]
        assert main([*args, *fleet_args]) == 0
    fleet = _records(tmp_path / "fleet")
    trains = [r for r in fleet if r["kind"] == "train"]
    assert trains and all(r["server/0/groups"] >= 1 and r["server/1/groups"] >= 1 for r in trains)
    assert all(r["server/0/up"] == r["server/1/up"] == 1.0 and r["server/1/errors"] == 0 for r in trains)
    assert [{k: v for k, v in r.items() if not k.startswith("server/")} for r in fleet] == local
