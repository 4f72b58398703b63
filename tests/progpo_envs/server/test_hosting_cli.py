"""`progpo serve` argument handling and the kwargs allow-lists."""

from __future__ import annotations

import pytest

from progpo_base.usage import UsageError
from progpo_envs.server.cli import app_from_environment, build_config, parse_args
from progpo_envs.server.policy import EnvPolicy, PolicyError
from tests.progpo_envs.server.hosting_helpers import TOY_ENV_ID


def test_defaults_and_agentgym_auto():
    config = build_config(parse_args([]))
    assert config.env_ids == ("progpo/ALFWorld-v0",) and config.agentgym == "progpo/ALFWorld-v0"
    config = build_config(parse_args(["--env", TOY_ENV_ID, "--env", "progpo/WebShop-v0"]))
    assert config.agentgym is None  # the first env is neither ALFWorld nor WebShop
    config = build_config(
        parse_args(
            [
                "--env",
                "progpo/WebShop-v0",
                "--agentgym",
                "none",
                "--workers",
                "3",
                "--env-kwargs",
                'progpo/WebShop-v0={"num_products": 200}',
            ]
        )
    )
    assert config.agentgym is None and config.pool.num_workers == 3
    assert config.env_kwargs == {"progpo/WebShop-v0": {"num_products": 200}}


@pytest.mark.parametrize(
    "argv",
    [
        ["--workers", "0"],
        ["--idle-timeout", "-1"],  # 0 is allowed: never expire
        ["--env-kwargs", "nojson"],
        ["--env-kwargs", "progpo/ALFWorld-v0=[1]"],
        ["--env-kwargs", "x={bad"],
    ],
)
def test_bad_arguments_exit(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_agentgym_env_must_be_hosted():
    with pytest.raises(UsageError, match="choose from progpo/ALFWorld-v0, auto, none"):
        build_config(parse_args(["--agentgym", "progpo/WebShop-v0"]))


@pytest.mark.parametrize(
    "env_id", ["progpo/Remote-v0", "gymnasium/CartPole-v1", "CartPole-v1", "progpo/Nope-v0"]
)
def test_only_registered_progpo_text_envs_are_hosted(env_id):
    with pytest.raises(PolicyError):
        EnvPolicy.from_registry(env_id)


def test_default_allow_lists_leave_out_paths_urls_and_data_builders():
    webshop = EnvPolicy.from_registry("progpo/WebShop-v0")
    assert {"split", "max_steps", "history_depths", "observation_mode"} <= webshop.allowed_kwargs
    assert not {"data_dir", "url", "engine", "seed", "num_products", "render_mode"} & webshop.allowed_kwargs
    assert "expert" not in webshop.allowed_kwargs  # operator-only: it would hand clients the answer
    alfworld = EnvPolicy.from_registry("progpo/ALFWorld-v0")
    assert {"split", "max_steps", "history_depths"} <= alfworld.allowed_kwargs
    assert not {"data_dir", "generator_seed", "num_generated", "engine_patches"} & alfworld.allowed_kwargs


def test_operator_kwargs_are_fixed():
    policy = EnvPolicy.from_registry(
        TOY_ENV_ID, fixed_kwargs={"rooms": 3}, allowed_kwargs=["rooms", "max_steps"]
    )
    assert policy.resolve_kwargs({"max_steps": 4}) == {"rooms": 3, "max_steps": 4}
    with pytest.raises(PolicyError, match="not allowed"):
        policy.resolve_kwargs({"rooms": 9})
    with pytest.raises(PolicyError):
        policy.resolve_kwargs({"max_steps": [[1]]})
    with pytest.raises(PolicyError):
        policy.resolve_kwargs("max_steps=3")


def test_app_from_environment_reads_the_serve_flags_for_gunicorn(monkeypatch, capsys):
    flags = f"--import progpo_envs.testing --env {TOY_ENV_ID} --agentgym none"
    monkeypatch.setenv("PROGPO_SERVE_ARGS", flags)
    app = app_from_environment()
    try:
        client = app.test_client()
        assert list(client.get("/envs").json) == [TOY_ENV_ID]
        assert client.post("/create").status_code == 404  # --agentgym none: no AgentGym routes
    finally:
        app.extensions["progpo_pool"].shutdown()
    assert '"serving": ["progpo/ServerToy-v0"]' in capsys.readouterr().out
