"""AgentGym's env-server protocol: the calls AgentGym's clients make, and AgentGym's scores on the real envs.

The toy env checks the protocol's shape and errors; ALFWorld and WebShop, served as the hosting docs say, are
played by a client that does what AgentGym's own code does (``agentgym_client``), scored by AgentGym's rule.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import gymnasium as gym
import pytest
import requests

from progpo_envs.alfworld.data import load_tasks
from progpo_envs.server.app import ServerConfig, create_app
from progpo_envs.server.cli import build_config, parse_args
from progpo_envs.server.pool import EnvPool, PoolConfig
from progpo_envs.server.remote import RemoteEnv
from progpo_envs.server.serving import BackgroundServer
from tests.progpo_envs.server.agentgym_client import AlfWorldClient, WebShopClient, is_success, play
from tests.progpo_envs.server.hosting_helpers import TOY_ENV_ID, CliServer


def test_agentgym_client_has_a_deadline_against_a_trickling_server(trickling_server):
    """The AgentGym-style client ends each request by its deadline, however slowly the server answers."""
    import time

    from progpo_envs.core.http_client import DeadlineExceeded

    server = trickling_server(["/reset"], what="headers", reply={"id": 7})
    client = AlfWorldClient(server.url, timeout=1.0)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="/reset did not finish within its 1 s deadline"):
        client.reset(0)
    assert time.monotonic() - started < 3.0


def test_alfworld_protocol_episode(toy_url):
    assert requests.get(f"{toy_url}/", timeout=10).json() == "This is environment AlfWorld."
    created = requests.post(f"{toy_url}/create", timeout=10)
    assert created.status_code == 200
    env_id = created.json()["id"]
    assert isinstance(env_id, int) and 0 <= env_id < 2**53
    reset = requests.post(
        f"{toy_url}/reset", json={"id": env_id, "game": 2, "world_type": "Text"}, timeout=10
    ).json()
    assert reset["id"] == env_id and "Find the key" in reset["observation"]
    assert reset["available_actions"] == ["go right", "look"]  # task 2: key in room (14 % 5) = 4
    step = requests.post(f"{toy_url}/step", json={"id": env_id, "action": "go right"}, timeout=10).json()
    assert set(step) == {"observation", "reward", "available_actions", "done"} and step["done"] is False
    assert (
        requests.get(f"{toy_url}/observation", params={"id": env_id}, timeout=10).json()
        == step["observation"]
    )
    assert (
        requests.get(f"{toy_url}/available_actions", params={"id": env_id}, timeout=10).json()
        == step["available_actions"]
    )
    detail = requests.get(f"{toy_url}/detail", params={"id": env_id}, timeout=10).json()
    assert detail["task_index"] == 2 and detail["won"] is False
    assert requests.post(f"{toy_url}/close", json={"id": env_id}, timeout=10).json() == {"closed": True}
    gone = requests.post(f"{toy_url}/step", json={"id": env_id, "action": "look"}, timeout=10)
    assert gone.status_code == 404 and "not valid" in gone.json()["error"]


def test_alfworld_protocol_errors_are_4xx(toy_url):
    env_id = requests.post(f"{toy_url}/create", timeout=10).json()["id"]
    cases = [
        ("post", "/reset", {"id": env_id, "game": 0, "world_type": "Embody"}, 400),
        ("post", "/reset", {"id": env_id, "game": 10_000}, 400),
        ("post", "/reset", {"id": env_id, "game": "first"}, 400),
        ("post", "/reset", {"id": "abc", "game": 0}, 400),
        ("post", "/step", {"id": env_id, "action": "look"}, 409),  # not reset yet
        ("post", "/step", {"id": env_id + 1, "action": "look"}, 404),
        ("post", "/step", {"id": env_id, "action": ["look"]}, 400),
        ("get", "/observation?id=", None, 400),
        ("get", "/list_envs", None, 404),
    ]
    for method, path, body, status in cases:
        response = requests.request(method, toy_url + path, json=body, timeout=10)
        assert response.status_code == status, (path, body, response.text)
        assert response.json()["error"]


# --- AgentGym's scoring on the real envs, through a client that does what AgentGym's code does -------------

ALFWORLD = "progpo/ALFWorld-v0"
WEBSHOP = "progpo/WebShop-v0"
#: Where CI points these tests at AgentGym's mapping files and real ALFWorld trials (unset: generated ones).
MAPPINGS_ENV_VAR = "PROGPO_TEST_AGENTGYM_MAPPINGS"
REAL_DATA_ENV_VAR = "PROGPO_TEST_ALFWORLD_DATA"


def expert_episode(env_id: str, task_index: int, **kwargs) -> tuple[str, dict, list[str]]:
    """The first observation and info of a task played in-process, and the expert's winning plan for it."""
    env = gym.make(env_id, expert=True, **kwargs)
    observation, info = env.reset(options={"task_index": task_index})
    first, plan = (observation, info), []
    terminated = truncated = False
    while not (terminated or truncated):
        plan.append(info["expert_action"])
        _, _, terminated, truncated, info = env.step(plan[-1])
    env.close()
    assert terminated and info["won"], "the expert must win the task it is tested on"
    return first[0], first[1], plan


def replay(client, task: int, plan: list[str]) -> list[tuple[float, bool]]:
    """Reset ``task`` and play ``plan``; every step's (reward, done)."""
    client.reset(task)
    return [client.step(action)[1:] for action in plan]


@pytest.fixture(scope="module")
def alfworld_default_server():
    """ALFWorld served as docker/serve-env.sh serves it with compose's defaults (train split, generated)."""
    server = CliServer(
        "--env", ALFWORLD, "--env-kwargs", f'{ALFWORLD}={{"split": "train"}}', "--workers", "1"
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def webshop_default_server():
    """The WebShop env server as compose starts it (1000 products, split train for the native API)."""
    kwargs = f'{WEBSHOP}={{"num_products": 1000, "split": "train"}}'
    server = CliServer("--env", WEBSHOP, "--env-kwargs", kwargs, "--workers", "1")
    yield server
    server.stop()


def test_alfworld_expert_scores_success_under_agentgym_rule(alfworld_default_server):
    url = alfworld_default_server.url
    observation, info, plan = expert_episode(ALFWORLD, 0, split="train")
    client = AlfWorldClient(url)
    answer = client.reset(0)
    # AgentGym's server: the text after the banner's blank line, paragraphs joined by single newlines
    assert answer["observation"] == "\n".join(observation.split("\n\n")[1:])
    assert (
        answer["observation"].startswith("You are in the middle of a room")
        and "Welcome" not in answer["observation"]
    )
    assert answer["task_type"] == info["task_id"] and answer["task_type"].count("/") == 1
    assert client.observe().endswith("AVAILABLE ACTIONS: " + ",".join(info["admissible_actions"]))
    steps = replay(client, 0, plan)
    assert steps == [(0.0, False)] * (len(plan) - 1) + [(1.0, True)]  # float(won), exactly 1.0
    assert is_success(steps[-1][0]) and play(client, 0, plan, max_rounds=len(plan)) == 1.0
    client.close()
    # the native API of the same server keeps the env's RL reward (success_reward 10)
    native = RemoteEnv(url, ALFWORLD)
    native.reset(options={"task_index": 0})
    rewards = [native.step(action)[1] for action in plan]
    native.close()
    assert rewards[-1] == 10.0


def test_webshop_session_is_the_absolute_goal_and_reward_the_raw_score(webshop_default_server):
    url = webshop_default_server.url
    observation, _, plan = expert_episode(WEBSHOP, 0, split="test")  # test goal 0 = absolute goal 0
    instruction = observation.split(" [SEP] ")[2]
    client = WebShopClient(url)
    assert client.reset(0) == [observation, None]
    assert requests.get(f"{url}/instruction_text", params={"env_idx": client.env_idx}, timeout=60).json() == (
        instruction
    )
    steps = replay(client, 0, plan)
    assert steps == [(0.0, False)] * (len(plan) - 1) + [(1.0, True)]  # done at the purchase, raw score 1.0
    assert is_success(steps[-1][0])
    client.close()
    # the native API indexes the hosted split (train): its task 0 is another goal, scored with the RL reward
    native = RemoteEnv(url, WEBSHOP)
    _, native_info = native.reset(options={"task_index": 0})
    native.close()
    assert native_info["goal_index"] > 0


def test_webshop_imperfect_purchase_scores_its_raw_score(webshop_default_server):
    _, _, plan = expert_episode(WEBSHOP, 0, split="test")
    client = WebShopClient(webshop_default_server.url)
    client.reset(0)
    for action in plan[:2]:  # search, open the right product
        client.step(action)
    _, reward, done = client.step("click[buy now]")  # without choosing its options
    client.close()
    assert done and 0.0 < reward < 1.0 and not is_success(reward)


@pytest.fixture(scope="module")
def agentgym_games(tmp_path_factory) -> dict:
    """AgentGym mapping files and the ALFWorld data they name.

    CI points ``PROGPO_TEST_AGENTGYM_MAPPINGS`` at AgentGym's own mapping files and
    ``PROGPO_TEST_ALFWORLD_DATA`` at real trials (AgentGym's 200 test trials, no train trials). Without them,
    mapping files in AgentGym's format are written for generated games: train ids 0 (present) and 1 (absent),
    test id 2.
    """
    mappings, data = os.environ.get(MAPPINGS_ENV_VAR), os.environ.get(REAL_DATA_ENV_VAR)
    if mappings and data:
        if not (Path(mappings, "mappings_test.json").is_file() and Path(data, "json_2.1.1").is_dir()):
            pytest.skip(
                f"{MAPPINGS_ENV_VAR} / {REAL_DATA_ENV_VAR} do not hold AgentGym's files and ALFWorld data"
            )
        return {"mappings": Path(mappings), "data": Path(data), "tested": [2420, 2619]}
    generated = load_tasks("train")
    root = tmp_path_factory.mktemp("agentgym")
    layout = {"train": [generated[0], None], "valid_train": [generated[7]]}
    entries, item = {"train": [], "valid_train": []}, 0
    for split, tasks in layout.items():
        for task in tasks:
            task_id = task.task_id if task else "pick_and_place_simple-Mug-None-Desk-1/trial_T_missing"
            if task:
                shutil.copytree(task.trial_dir, root / "json_2.1.1" / split / task_id)
            folder, trial = task_id.split("/")
            entries[split].append({"item_id": item, "task_type": folder, "task_id": trial})
            item += 1
    (root / "mappings_train.json").write_text(json.dumps(entries["train"]))
    (root / "mappings_test.json").write_text(json.dumps(entries["valid_train"]))
    return {"mappings": root, "data": root, "tested": [2, 0]}


def test_agentgym_game_ids_load_agentgym_games(agentgym_games):
    mappings, data = agentgym_games["mappings"], agentgym_games["data"]
    table = [
        (entry, split)
        for name, split in (("mappings_train.json", "train"), ("mappings_test.json", "valid_train"))
        for entry in json.loads((mappings / name).read_text())
    ]
    app = create_app(
        ServerConfig(
            env_ids=(ALFWORLD,),
            env_kwargs={ALFWORLD: {"data_dir": str(data), "split": "valid_train"}},
            pool=PoolConfig(num_workers=1),
            agentgym=ALFWORLD,
            agentgym_mappings=str(mappings),
        )
    )
    with BackgroundServer(app) as server:
        client = AlfWorldClient(server.url, timeout=600)
        for game in agentgym_games["tested"]:
            entry, split = table[game]
            task_id = f"{entry['task_type']}/{entry['task_id']}"
            tasks = [task.task_id for task in load_tasks(split, data)]
            observation, _, plan = expert_episode(
                ALFWORLD, tasks.index(task_id), split=split, data_dir=str(data)
            )
            answer = client.reset(game)
            assert answer["task_type"] == task_id  # exactly the trial AgentGym's server loads for this id
            assert answer["observation"] == "\n".join(observation.split("\n\n")[1:])
            steps = replay(client, game, plan)
            assert steps[-1] == (1.0, True) and is_success(steps[-1][0])
        trials = [data / "json_2.1.1" / split / e["task_type"] / e["task_id"] for e, split in table]
        missing = next((game for game, trial in enumerate(trials) if not trial.is_dir()), None)
        if missing is not None:
            answer = requests.post(
                f"{server.url}/reset", json={"id": client.env_id, "game": missing}, timeout=60
            )
            entry, split = table[missing]
            assert answer.status_code == 404
            assert f"json_2.1.1/{split}/{entry['task_type']}/{entry['task_id']}" in answer.json()["error"]
        beyond = requests.post(
            f"{server.url}/reset", json={"id": client.env_id, "game": len(table)}, timeout=60
        )
        assert beyond.status_code == 400 and f"0..{len(table) - 1}" in beyond.json()["error"]
        client.close()


def test_idle_timeout_zero_never_expires(toy_server):
    config = build_config(parse_args(["--idle-timeout", "0"]))
    assert config.pool.idle_timeout == math.inf
    pool = EnvPool(ServerConfig(env_ids=(TOY_ENV_ID,)).policies(), PoolConfig(idle_timeout=math.inf))
    try:
        instance_id, _ = pool.create(TOY_ENV_ID, {})
        assert pool.sweep() == 0 and pool.has(instance_id)
    finally:
        pool.shutdown()


def test_mappings_over_data_with_only_agentgyms_test_games(tmp_path, monkeypatch):
    """A data dir with AgentGym's test trials only (no ``train``), and no split chosen: the server starts, a
    test id plays, an absent train id answers 404 naming its trial (before: no start, a traceback about
    split 'train')."""
    generated = load_tasks("train")
    present, absent = generated[7], generated[0]
    data, folder = tmp_path / "data", tmp_path / "mappings"
    shutil.copytree(present.trial_dir, data / "json_2.1.1" / "valid_train" / present.task_id)
    folder.mkdir()
    for name, item, task in (("mappings_train.json", 0, absent), ("mappings_test.json", 1, present)):
        task_type, trial = task.task_id.split("/")
        (folder / name).write_text(json.dumps([{"item_id": item, "task_type": task_type, "task_id": trial}]))
    monkeypatch.setenv("ALFWORLD_DATA", str(data))
    server = CliServer("--env", ALFWORLD, "--agentgym-mappings", str(folder), "--workers", "1")
    try:
        client = AlfWorldClient(server.url, timeout=300)
        assert client.reset(1)["task_type"] == present.task_id
        answer = requests.post(f"{server.url}/reset", json={"id": client.env_id, "game": 0}, timeout=60)
        assert answer.status_code == 404
        assert f"json_2.1.1/train/{absent.task_id}" in answer.json()["error"]
    finally:
        server.stop()
        server.log.seek(0)
    assert "has no split 'train'" in server.log.read()
