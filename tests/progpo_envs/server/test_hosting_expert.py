"""No door shows the expert's next command to a policy; the expert's own route does (issue 41).

A server started with the expert on (``expert: true``, which ``progpo eval --agent expert`` needs) serves
ALFWorld; through every door a policy reads (the native HTTP routes, batch routes included, the stream door,
AgentGym's routes, OpenEnv's observations and schema) no answer holds ``expert_action``, while the expert's
route (``GET /instances/<id>/expert``, the stream door's ``expert`` op, OpenEnv's ``GET /expert``) gives the
command, and ``progpo eval --agent expert`` through ``progpo/Remote-v0`` still wins with it.
"""

from __future__ import annotations

import json

import pytest
import requests

from agents.cli import main as eval_main
from progpo_envs.core.http_client import DeadlineSession
from progpo_envs.server.app import ServerConfig, create_app
from progpo_envs.server.openenv_app import OpenEnvServer, create_openenv_app
from progpo_envs.server.pool import PoolConfig
from progpo_envs.server.remote import RemoteEnv, RemoteEnvError
from progpo_envs.server.serving import BackgroundServer
from progpo_envs.testing import KEY_DOOR_ENV_ID as TOY_ENV_ID

ENV = "progpo/ALFWorld-v0"
KEY = "expert_action"


def _pool() -> PoolConfig:
    return PoolConfig(num_workers=1, max_instances=64, idle_timeout=300.0)


@pytest.fixture(scope="module")
def expert_server():
    """The native server with the expert on, AgentGym's ALFWorld routes at its root."""
    config = ServerConfig(env_ids=(ENV,), env_kwargs={ENV: {"expert": True}}, pool=_pool(), agentgym=ENV)
    with BackgroundServer(create_app(config)) as server:
        yield server


@pytest.fixture(scope="module")
def openenv_expert_server():
    config = ServerConfig(env_ids=(ENV,), env_kwargs={ENV: {"expert": True}}, pool=_pool())
    app = create_openenv_app(config)
    with OpenEnvServer(app) as server:
        yield server
    app.state.progpo_pool.shutdown()


def _text(answer: requests.Response) -> str:
    assert answer.status_code < 300, answer.text
    return answer.text


def test_the_native_routes_never_carry_the_expert(expert_server):
    http, url = DeadlineSession(60.0), expert_server.url
    created = http.post(f"{url}/instances", json={"env_id": ENV, "seed": 0, "options": {"task_index": 0}})
    assert KEY not in _text(created)
    instance = created.json()["instance_id"]
    assert KEY not in _text(http.post(f"{url}/instances/{instance}/reset", json={"seed": 3}))
    assert KEY not in _text(http.post(f"{url}/instances/{instance}/step", json={"action": "look"}))
    assert KEY not in _text(http.get(f"{url}/instances/{instance}"))
    batch = http.post(f"{url}/batch/step", json={"steps": [{"instance_id": instance, "action": "inventory"}]})
    assert KEY not in _text(batch) and batch.json()["results"][0]["ok"]
    expert = http.get(f"{url}/instances/{instance}/expert").json()[KEY]
    admissible = http.get(f"{url}/instances/{instance}/available_actions").json()["available_actions"]
    assert expert in admissible  # the expert's own route answers


@pytest.mark.parametrize("transport", ["stream", "http"])
def test_a_remote_env_sees_the_expert_only_when_it_asks(expert_server, transport):
    """Without ``expert=True`` no info holds it (the server has it on); with it, it is read from the
    expert's route (the stream door's ``expert`` op, or the HTTP route) and plays the task to a win."""
    plain = RemoteEnv(expert_server.url, ENV, transport=transport)
    _, info = plain.reset(seed=0, options={"task_index": 2})
    assert KEY not in info
    assert KEY not in plain.step(info["admissible_actions"][0])[4]
    plain.close()
    env = RemoteEnv(expert_server.url, ENV, transport=transport, expert=True)
    _, info = env.reset(seed=0, options={"task_index": 2})
    for _ in range(50):
        _, _, terminated, truncated, info = env.step(info[KEY])
        if terminated or truncated:
            break
    assert info["won"]
    env.close()


def test_agentgym_routes_never_carry_the_expert(expert_server):
    http, url = DeadlineSession(60.0), expert_server.url
    created = http.post(f"{url}/create").json()
    for path, body in (("reset", {"game": 0, "world_type": "Text"}), ("step", {"action": "look"})):
        assert KEY not in _text(http.post(f"{url}/{path}", json={**body, "id": created["id"]}))
    for path in ("observation", "available_actions", "detail"):
        assert KEY not in _text(http.get(f"{url}/{path}", params={"id": created["id"]}))


def test_a_server_without_the_expert_refuses_its_route(toy_url):
    env = RemoteEnv(toy_url, TOY_ENV_ID)
    env.reset(seed=0)
    with pytest.raises(RemoteEnvError) as refused:
        env.expert_action()
    assert refused.value.status == 409 and "expert" in refused.value.message
    env.close()


def test_openenv_observations_never_carry_the_expert_and_its_route_does(openenv_expert_server):
    from openenv import GenericEnvClient

    url = openenv_expert_server.url
    assert KEY not in _text(requests.get(f"{url}/schema", timeout=30))
    with GenericEnvClient(base_url=url).sync() as env:
        result = env.reset(task_index=2, split="train", episode_id="episode-a")
        for _ in range(50):
            assert KEY not in result.observation and KEY not in json.dumps(result.observation)
            expert = requests.get(f"{url}/expert", params={"episode_id": "episode-a"}, timeout=30).json()[KEY]
            assert expert in result.observation["admissible_actions"]
            result = env.step({"command": expert})
            if result.done:
                break
        assert result.observation["won"]
    unknown = requests.get(f"{url}/expert", params={"episode_id": "no-such-episode"}, timeout=30)
    assert unknown.status_code == 404


def test_progpo_eval_expert_still_wins_through_the_server(expert_server, tmp_path, capsys):
    """``progpo eval --agent expert`` on ``progpo/Remote-v0`` reads the expert from its route."""
    argv = [
        "--env", "progpo/Remote-v0", "--env-arg", f"env_id={ENV}", "--env-url", expert_server.url,
        "--env-kind", "alfworld", "--agent", "expert", "--episodes", "2", "--task-order", "sequential",
        "--out", str(tmp_path / "run"), "--no-progress",
    ]  # fmt: skip
    assert eval_main(argv) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["success_rate"] == 1.0 and summary["episodes"] == 2
