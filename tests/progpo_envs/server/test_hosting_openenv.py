"""The hosted envs as OpenEnv environments, driven by OpenEnv's own client (``openenv.GenericEnvClient``).

* the expert's plan (ours, in process) replayed through the client wins, with the in-process env's rewards,
  texts and content keys, on ALFWorld and WebShop;
* the same reset arguments give the same first observation in every session;
* 64 concurrent sessions step without errors; a killed env worker ends only the sessions on it, each with
  OpenEnv's typed error, and they play again after a reset;
* bad frames and bad actions: typed errors or invalid actions, the connection stays; a message past the
  bounds (size, nesting, integer digits, lone surrogates) is a typed error and the session lives on; the
  HTTP routes answer 4xx, never 5xx, to every bad body;
* a client's share of sessions, however opened (WebSockets, HTTP MCP), and idle expiry; sessions that come
  and go leave no engine behind in the workers;
* ``/metadata``, ``/schema``; ``openenv validate`` accepts the manifests and the running servers.

The ALFWorld and WebShop tests skip when the env cannot be built here (engine or data missing).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time

import gymnasium as gym
import pytest
import requests
from openenv import GenericEnvClient
from websockets.sync.client import connect

import progpo_envs  # noqa: F401  (registers the ids)
from progpo_envs.server.app import ServerConfig
from progpo_envs.server.openenv_app import OpenEnvServer, create_openenv_app
from progpo_envs.server.pool import PoolConfig
from progpo_envs.testing import KEY_DOOR_ENV_ID as TOY_ENV_ID
from tests.net import session_from
from tests.paths import REPO_ROOT as REPO

ALFWORLD = "progpo/ALFWorld-v0"
WEBSHOP = "progpo/WebShop-v0"
#: Small settings of each env, fixed by the operator on the server and passed in-process.
ENV_KWARGS = {ALFWORLD: {"split": "train"}, WEBSHOP: {"num_products": 200, "split": "test"}}


def serve(env_id: str, env_kwargs: dict | None = None, **pool: object) -> OpenEnvServer:
    config = ServerConfig(
        env_ids=(env_id,),
        env_kwargs={env_id: env_kwargs or {}},
        pool=PoolConfig(**{"num_workers": 2, "idle_timeout": 300.0, **pool}),
    )
    return OpenEnvServer(create_openenv_app(config)).start()


def _real_server(env_id: str):
    try:
        gym.make(env_id, **ENV_KWARGS[env_id]).close()
    except Exception as exc:  # noqa: BLE001 - any failure to build means "not available here"
        pytest.skip(f"{env_id} cannot be built here: {exc!r}")
    server = serve(env_id, ENV_KWARGS[env_id])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def alfworld_server():
    yield from _real_server(ALFWORLD)


@pytest.fixture(scope="module")
def webshop_server():
    yield from _real_server(WEBSHOP)


@pytest.fixture(scope="module")
def toy_server():
    server = serve(TOY_ENV_ID)
    yield server
    server.stop()


#: The real envs' server fixtures.
REAL_SERVERS = {ALFWORLD: "alfworld_server", WEBSHOP: "webshop_server"}


@pytest.fixture
def real_server(request):
    return request.getfixturevalue(REAL_SERVERS[request.param])


def expert_episode(env_id: str, task_index: int) -> tuple[list[str], list[tuple], dict]:
    """The in-process env played by its expert: the actions and each step's (text, reward, done, obs_hash)."""
    env = gym.make(env_id, **ENV_KWARGS[env_id], expert=True)
    observation, info = env.reset(options={"task_index": task_index})
    first = (observation, int(info["obs_hash"]), int(info["history_key"]))
    actions, trace = [], []
    done = False
    while not done:
        actions.append(info["expert_action"])
        observation, reward, terminated, truncated, info = env.step(actions[-1])
        done = terminated or truncated
        trace.append((observation, reward, done, int(info["obs_hash"]), int(info["history_key"])))
    env.close()
    return actions, trace, {"first": first, "won": info["won"], "task_id": info["task_id"]}


@pytest.mark.parametrize("real_server", [ALFWORLD, WEBSHOP], indirect=True)
@pytest.mark.parametrize("task_index", [0, 3])
def test_the_experts_plan_replayed_through_openenvs_client_wins_as_in_process(real_server, task_index):
    (env_id,) = real_server.app.state.progpo_pool.policies
    actions, trace, local = expert_episode(env_id, task_index)
    assert local["won"], "the expert wins in process"
    with GenericEnvClient(base_url=real_server.url).sync() as client:
        result = client.reset(task_index=task_index, split=ENV_KWARGS[env_id]["split"])
        first = result.observation
        assert (first["text"], first["obs_hash"], first["history_key"]) == local["first"]
        assert result.reward is None and result.done is False and first["task_id"] == local["task_id"]
        total_remote, total_local = 0.0, 0.0
        for action, (text, reward, done, obs_hash, history_key) in zip(actions, trace, strict=True):
            result = client.step({"command": action})
            obs = result.observation
            assert (obs["text"], result.reward, result.done) == (text, reward, done)
            assert (obs["obs_hash"], obs["history_key"]) == (obs_hash, history_key)
            total_remote += result.reward
            total_local += reward
        assert result.done and obs["won"] is True and total_remote == total_local > 0
        assert obs["task_score"] == 1.0
        state = client.state()
        assert state["step_count"] == len(actions) and state["done"] is True


def test_the_same_reset_gives_the_same_first_observation_in_every_session(alfworld_server):
    local = gym.make(ALFWORLD, **ENV_KWARGS[ALFWORLD])
    observation, info = local.reset(seed=5)
    local.close()
    firsts = []
    for _ in range(2):
        with GenericEnvClient(base_url=alfworld_server.url).sync() as client:
            firsts.append(client.reset(seed=5).observation)
            client.step({"command": "look"})
            again = client.reset(seed=5).observation  # a reused instance starts the same way
            assert again == firsts[-1]
    assert firsts[0] == firsts[1]
    assert (firsts[0]["text"], firsts[0]["obs_hash"], firsts[0]["task_index"]) == (
        observation,
        int(info["obs_hash"]),
        info["task_index"],
    )
    assert firsts[0]["admissible_actions"] == info["admissible_actions"]


def test_64_concurrent_sessions_step_without_errors(alfworld_server):
    num_tasks = 8

    async def session(index: int) -> int:
        rng = random.Random(index)
        steps = 0
        async with GenericEnvClient(base_url=alfworld_server.url, message_timeout_s=300) as client:
            result = await client.reset(task_index=index % num_tasks)
            for _ in range(4):
                command = rng.choice(result.observation["admissible_actions"] + ["dance wildly", ""])
                result = await client.step({"command": command})
                steps += 1
                if result.done:
                    result = await client.reset(task_index=index % num_tasks)
        return steps

    async def run() -> list:
        return await asyncio.gather(*(session(i) for i in range(64)), return_exceptions=True)

    results = asyncio.run(run())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    assert sum(results) == 64 * 4
    assert alfworld_server.app.state.progpo_pool.metrics()["worker_restarts"] == 0


def test_a_killed_worker_ends_only_its_own_sessions_with_openenvs_error(toy_server):
    pool = toy_server.app.state.progpo_pool
    clients = [GenericEnvClient(base_url=toy_server.url).sync() for _ in range(6)]
    try:
        for i, client in enumerate(clients):
            client.connect()
            client.reset(task_index=i % 2)
        live = [w["live_instances"] for w in pool.metrics()["workers"]]
        assert sum(live) >= 6 and all(n > 0 for n in live), live
        victim = pool.metrics()["workers"][0]
        os.kill(victim["pid"], signal.SIGKILL)
        time.sleep(0.5)
        lost, served = [], []
        for client in clients:
            try:
                client.step({"command": "look"})
                served.append(client)
            except RuntimeError as exc:
                lost.append(str(exc))
        assert len(lost) == victim["live_instances"] and len(served) == len(clients) - len(lost)
        assert all("instance lost" in message and "(code: EXECUTION_ERROR)" in message for message in lost)
        for client in clients:  # the connection stayed: a reset starts a new episode on a live worker
            result = client.reset(task_index=0)
            assert not result.done
            client.step({"command": "look"})
    finally:
        for client in clients:
            client.close()


def _frame(ws, message) -> dict:
    ws.send(message if isinstance(message, (bytes, str)) else json.dumps(message))
    return json.loads(ws.recv(timeout=60))


def test_bad_frames_and_actions_are_typed_errors_or_invalid_actions_and_the_connection_stays(toy_server):
    with connect(toy_server.url.replace("http", "ws") + "/ws", open_timeout=30) as ws:
        cases = [
            ("not json at all", "INVALID_JSON"),
            ("[1, 2, 3]", "VALIDATION_ERROR"),
            ('"a string"', "VALIDATION_ERROR"),
            (b"\x00\x01binary", "INVALID_JSON"),
            ({"type": "teleport"}, "UNKNOWN_TYPE"),
            ({"type": "step", "data": {"command": "look"}}, "EXECUTION_ERROR"),  # before any reset
            ({"type": "reset", "data": {"task_index": -1}}, "EXECUTION_ERROR"),
            ({"type": "reset", "data": {"split": "../../etc"}}, "EXECUTION_ERROR"),
            ({"type": "reset", "data": {"no_such_kwarg": 1}}, "EXECUTION_ERROR"),
            ({"type": "reset", "data": "not an object"}, "VALIDATION_ERROR"),
        ]
        for message, code in cases:
            answer = _frame(ws, message)
            assert answer["type"] == "error" and answer["data"]["code"] == code, (message, answer)
        assert _frame(ws, {"type": "reset", "data": {"task_index": 1}})["type"] == "observation"
        for command in ["", "x" * 100_000, "\x00\x07", "definitely not a command"]:
            answer = _frame(ws, {"type": "step", "data": {"command": command}})
            assert answer["type"] == "observation" and answer["data"]["reward"] == 0.0, answer
        for data in [{"command": 5}, {}, {"command": "look", "extra": 1}]:
            answer = _frame(ws, {"type": "step", "data": data})
            assert answer["data"]["code"] == "VALIDATION_ERROR", (data, answer)
        assert _frame(ws, {"type": "step", "data": {"command": "look"}})["type"] == "observation"


def test_a_message_past_the_bounds_is_a_typed_error_and_the_session_lives_on(toy_server):
    """Issue 35, item 5: bounded decoding of every message (before: a 5,000-digit integer or 100,000-deep
    nesting ended the sender's session, OpenEnv's loop failing on them)."""
    deep = '{"a":' * 100_000 + "1" + "}" * 100_000
    cases = [
        ('{"type": "step", "data": {"command": "look", "n": ' + "9" * 5000 + "}}", "VALIDATION_ERROR"),
        ("[" * 100_000 + "]" * 100_000, "VALIDATION_ERROR"),
        ('{"type": "reset", "data": ' + deep + "}", "VALIDATION_ERROR"),
        (json.dumps({"type": "step", "data": {"command": "x" * (2 << 20)}}), "VALIDATION_ERROR"),  # 2 MiB
        ('{"type": "reset", "data": {"episode_id": "\\ud800"}}', "VALIDATION_ERROR"),
        ('{"type": "reset", "data": {"seed": NaN}}', "INVALID_JSON"),
        ('{"type": "reset", "data": {"seed": Infinity}}', "INVALID_JSON"),
        ({"type": "reset", "data": {"seed": "3"}}, "EXECUTION_ERROR"),
        ({"type": "reset", "data": {"seed": 2**70}}, "EXECUTION_ERROR"),
    ]
    with connect(toy_server.url.replace("http", "ws") + "/ws", open_timeout=30) as ws:
        assert _frame(ws, {"type": "reset", "data": {"task_index": 1}})["type"] == "observation"
        assert _frame(ws, {"type": "step", "data": {"command": "look"}})["type"] == "observation"
        for message, code in cases:
            answer = _frame(ws, message)
            assert answer["type"] == "error" and answer["data"]["code"] == code, (str(message)[:60], answer)
        state = _frame(ws, {"type": "state"})["data"]
        assert state["step_count"] == 1 and state["task_index"] == 1  # the same episode, still there
        assert _frame(ws, {"type": "step", "data": {"command": "look"}})["type"] == "observation"
    with connect(toy_server.url.replace("http", "ws") + "/mcp", open_timeout=30) as mcp:
        for message in ["[1, 2]", b"binary", '{"jsonrpc": "2.0", "id": ' + "9" * 5000 + "}", "[" * 100_000]:
            answer = _frame(mcp, message)
            assert answer["jsonrpc"] == "2.0" and answer["error"]["code"] in (-32700, -32600), answer
        listed = _frame(mcp, {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}})
        assert listed["id"] == 7  # the connection read on


#: Bodies of the reliability attack (issue 35, item 4) and what else a client can get wrong in one.
BAD_BODIES = [
    b'{"seed": Infinity}',
    b'{"seed": -Infinity}',
    b'{"seed": NaN}',
    b'{"seed": 1e400}',
    b'{"seed": ' + b"9" * 5000 + b"}",
    b'{"seed": ' + b"9" * 30 + b"}",
    b'{"seed": "3"}',
    b'{"seed": true}',
    b'{"seed": 1.5}',
    b'{"seed": [1]}',
    b'{"episode_id": "\\ud800"}',
    b'{"episode_id": 5}',
    b'{"episode_id": "' + b"e" * 300 + b'"}',
    b'{"task_index": "1"}',
    b'{"task_index": 1.0}',
    b'{"\\udfff": 1}',
    b'{"split": "\\ud800"}',
    b'{"max_steps": 1e999}',
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    b"[1, 2]",
    b"null",
    b"\xff\xfe",
    b"{" * 200_000,
    b'{"action": {"command": Infinity}}',
    b'{"action": {"command": "\\ud800"}}',
    b'{"action": {"command": 5}}',
    b'{"action": NaN}',
    b'{"action": "look"}',
    b'{"action": {"command": "look"}, "timeout_s": ' + b"9" * 5000 + b"}",
    b'{"action": {"command": "look"}, "timeout_s": "soon"}',
]


@pytest.mark.parametrize("route", ["/reset", "/step"])
def test_the_stateless_http_routes_answer_4xx_to_every_bad_body(toy_server, route):
    """Before: ``{"seed": Infinity}`` and a lone surrogate in ``episode_id`` were 500s (OpenEnv's error answer
    echoed a value JSON cannot hold)."""
    answers = {}
    for body in BAD_BODIES:
        answer = requests.post(
            f"{toy_server.url}{route}", data=body, headers={"content-type": "application/json"}, timeout=60
        )
        answers[body[:48]] = (answer.status_code, answer.text[:120])
        assert answer.headers["content-type"].startswith("application/json")
        answer.json()  # an answer that is JSON, whatever was sent
    assert all(400 <= status < 500 for status, _ in answers.values()), answers
    rpc = requests.post(f"{toy_server.url}/mcp", data=b'{"jsonrpc": "2.0", "id": NaN}', timeout=60)
    assert rpc.status_code == 400 and rpc.json()["error"]["code"] == -32700


def test_the_stateless_http_routes_answer_4xx_not_500(toy_server):
    url = toy_server.url
    assert requests.post(f"{url}/step", json={"action": {"command": "look"}}, timeout=60).status_code == 409
    assert requests.post(f"{url}/reset", json={"task_index": 10**9}, timeout=60).status_code == 400
    assert requests.post(f"{url}/reset", json={"bogus": 1}, timeout=60).status_code == 400
    assert requests.post(f"{url}/reset", json={"seed": -1}, timeout=60).status_code == 422
    answer = requests.post(f"{url}/reset", json={"task_index": 1}, timeout=60)
    assert answer.status_code == 200 and answer.json()["observation"]["task_index"] == 1
    assert requests.get(f"{url}/health", timeout=60).json()["status"] == "healthy"


def test_a_client_holds_at_most_its_share_of_sessions_and_others_still_connect(second_host_address):
    """A client is its host (webshop_server.clients): another loopback address is the same client, another
    host still connects."""
    server = serve(TOY_ENV_ID, max_instances=6, max_instances_per_client=2)
    try:
        ws_url = server.url.replace("http", "ws") + "/ws"
        with contextlib.ExitStack() as held:
            for _ in range(2):
                held.enter_context(connect(ws_url, open_timeout=30))
            with connect(ws_url, open_timeout=30) as third:
                answer = json.loads(third.recv(timeout=30))
                assert answer["data"]["code"] == "CAPACITY_REACHED" and "share" in answer["data"]["message"]
            with connect(ws_url, open_timeout=30, source_address=("127.0.0.2", 0)) as same_host:
                answer = json.loads(same_host.recv(timeout=30))
                assert answer["data"]["code"] == "CAPACITY_REACHED"
            with connect(ws_url, open_timeout=30, source_address=(second_host_address, 0)) as other:
                assert _frame(other, {"type": "reset", "data": {}})["type"] == "observation"
        time.sleep(0.3)
        with connect(ws_url, open_timeout=30) as again:  # closing frees the share
            assert _frame(again, {"type": "reset", "data": {}})["type"] == "observation"
    finally:
        server.stop()


def _rpc(url: str, method: str, params: dict, session=requests) -> dict:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return session.post(f"{url}/mcp", json=body, timeout=30).json()


def test_sessions_opened_over_http_mcp_count_in_the_hosts_share(second_host_address):
    """Issue 35, item 2: ``POST /mcp`` ``openenv/session/create`` opens sessions from the same share as the
    WebSockets (before: one host took every session over HTTP, and every other host got ``CAPACITY_REACHED``
    until the idle timeout, which any call renews)."""
    server = serve(TOY_ENV_ID, max_instances=6, max_instances_per_client=2)
    try:
        ws_url = server.url.replace("http", "ws") + "/ws"
        opened = [_rpc(server.url, "openenv/session/create", {}) for _ in range(3)]
        assert all("session_id" in answer["result"] for answer in opened[:2]), opened
        assert "share" in opened[2]["error"]["message"], opened[2]
        with connect(ws_url, open_timeout=30, source_address=("127.0.0.2", 0)) as same_host:
            answer = json.loads(same_host.recv(timeout=30))
            assert answer["data"]["code"] == "CAPACITY_REACHED" and "share" in answer["data"]["message"]
        other = session_from(second_host_address)
        assert "session_id" in _rpc(server.url, "openenv/session/create", {}, other)["result"]
        with connect(ws_url, open_timeout=30, source_address=(second_host_address, 0)) as elsewhere:
            assert _frame(elsewhere, {"type": "reset", "data": {}})["type"] == "observation"
        # a WebSocket attached to an HTTP session opens none; closing one frees its place in the share
        session_id = opened[0]["result"]["session_id"]
        with connect(f"{ws_url}?session_id={session_id}", open_timeout=30) as attached:
            assert _frame(attached, {"type": "reset", "data": {}})["type"] == "observation"
        assert _rpc(server.url, "openenv/session/close", {"session_id": session_id})["result"]["closed"]
        with connect(ws_url, open_timeout=30) as again:
            assert _frame(again, {"type": "reset", "data": {}})["type"] == "observation"
    finally:
        server.stop()


def test_an_idle_session_expires_with_an_error_and_a_reset_starts_again():
    server = serve(TOY_ENV_ID, idle_timeout=1.0)
    try:
        with connect(server.url.replace("http", "ws") + "/ws", open_timeout=30) as ws:
            assert _frame(ws, {"type": "reset", "data": {"task_index": 0}})["type"] == "observation"
            time.sleep(3.0)
            assert server.app.state.progpo_pool.live_instances == 0
            answer = _frame(ws, {"type": "step", "data": {"command": "look"}})
            assert answer["data"]["code"] == "EXECUTION_ERROR" and "expired" in answer["data"]["message"]
            assert _frame(ws, {"type": "reset", "data": {"task_index": 0}})["type"] == "observation"
    finally:
        server.stop()


def _libdownward_copies(pid: int) -> int:
    """The copies of ``libdownward`` process ``pid`` has loaded (each from a file of its own)."""
    with open(f"/proc/{pid}/maps") as maps:
        return len({line.split()[5] for line in maps if "libdownward" in line})


def test_sessions_that_come_and_go_leave_no_engine_behind_in_the_workers(alfworld_server):
    """Issue 35, item 6: every session left its env's ``libdownward`` copy in the worker (an ALFWorld worker
    grew from 81 to 544 MiB over 200 sessions, ``scripts/serving_probe.py memory``); now the next session's
    env takes it over."""
    pool = alfworld_server.app.state.progpo_pool

    def sessions(count: int) -> int:
        for index in range(count):
            with GenericEnvClient(base_url=alfworld_server.url, message_timeout_s=300).sync() as client:
                client.step({"command": client.reset(task_index=index).observation["admissible_actions"][0]})
        return sum(_libdownward_copies(worker["pid"]) for worker in pool.metrics()["workers"])

    warm = sessions(4)
    assert sessions(8) == warm


def test_metadata_names_the_env_its_splits_and_task_types_and_the_schema_is_openenvs(alfworld_server):
    metadata = requests.get(f"{alfworld_server.url}/metadata", timeout=60).json()
    assert metadata["name"] == ALFWORLD
    for name in ("train", "valid_seen", "valid_unseen", "pick_and_place_simple", "pick_two_obj_and_place"):
        assert name in metadata["description"] and name in metadata["readme_content"]
    schema = requests.get(f"{alfworld_server.url}/schema", timeout=60).json()
    assert schema["action"]["required"] == ["command"]
    assert schema["action"]["properties"]["command"]["type"] == "string"
    fields = set(schema["observation"]["properties"])
    assert {"text", "admissible_actions", "obs_hash", "history_key", "task_id", "task_type", "won"} <= fields
    assert "task_score" in fields and "env_id" in schema["state"]["properties"]


def test_webshop_declares_its_available_actions(webshop_server):
    schema = requests.get(f"{webshop_server.url}/schema", timeout=60).json()
    assert "available_actions" in schema["observation"]["properties"]
    with GenericEnvClient(base_url=webshop_server.url).sync() as client:
        obs = client.reset(task_index=0).observation
        assert obs["available_actions"]["has_search_bar"] is True and obs["action_valid"] is True
        obs = client.step({"command": "click[nothing here]"}).observation
        assert obs["action_valid"] is False  # an invalid action, not an error


def openenv_validate(*args: str) -> tuple[int, str]:
    """``openenv validate ARGS`` (OpenEnv's own command line, run in this process: its imports are costly)."""
    from openenv.cli.__main__ import app
    from typer.testing import CliRunner

    done = CliRunner().invoke(app, ["validate", *args])
    return done.exit_code, done.output


@pytest.mark.parametrize("name", ["alfworld", "webshop"])
def test_openenv_validate_accepts_the_manifests(name):
    code, output = openenv_validate(str(REPO / "openenv-envs" / name), "--level", "static", "--skip-build")
    assert code == 0 and "Verdict: PASS" in output, output


def test_openenv_validate_refuses_a_manifest_without_a_validation_block(tmp_path):
    manifest = (REPO / "openenv-envs" / "alfworld" / "openenv.yaml").read_text()
    (tmp_path / "openenv.yaml").write_text(manifest.split("validation:")[0])
    code, output = openenv_validate(str(tmp_path), "--level", "static", "--skip-build")
    assert code != 0 and "PASS" not in output.split("Verdict")[-1]


@pytest.mark.parametrize("real_server", [ALFWORLD, WEBSHOP], indirect=True)
def test_openenv_validate_accepts_the_running_servers(real_server):
    code, output = openenv_validate("--url", real_server.url, "--timeout", "60")
    assert code == 0 and "Verdict: PASS" in output, output


def test_the_observation_model_and_task_types_are_the_env_classs_statements():
    """The OpenEnv door reads what the env class states (its metadata), never its id: WebShop's page actions,
    ALFWorld's six task types, the admissible-action model and no types for an env that states neither."""
    from progpo_envs.alfworld.task_types import TASK_TYPES
    from progpo_envs.core.registration import env_statements
    from progpo_envs.server.openenv_models import ALFWorldObservation, WebShopObservation, observation_class

    webshop = env_statements(gym.spec("progpo/WebShop-v0").entry_point)
    alfworld = env_statements(gym.spec("progpo/ALFWorld-v0").entry_point)
    toy = env_statements(gym.spec(TOY_ENV_ID).entry_point)
    assert observation_class(webshop) is WebShopObservation and "task_types" not in webshop
    assert observation_class(alfworld) is ALFWorldObservation and alfworld["task_types"] == TASK_TYPES
    assert observation_class(toy) is ALFWorldObservation and "task_types" not in toy
