"""The env server's routes: lifecycle, validation (4xx with a message), isolation, expiry, limits, metrics."""

from __future__ import annotations

import time

import pytest
import requests

from progpo_envs.server.codec import decode
from tests.progpo_envs.server.hosting_helpers import TOY_ENV_ID, serve_toy


def create(url: str, **body) -> str:
    response = requests.post(f"{url}/instances", json={"env_id": TOY_ENV_ID, **body}, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()["instance_id"]


def test_health_ready_envs(toy_url):
    health = requests.get(f"{toy_url}/health", timeout=10).json()
    ready = requests.get(f"{toy_url}/ready", timeout=10).json()
    assert health == {"status": "ok", "server_id": health["server_id"]} and len(health["server_id"]) == 16
    assert ready == {"ready": True, "server_id": health["server_id"]}  # one server, one id
    envs = requests.get(f"{toy_url}/envs", timeout=10).json()
    assert set(envs) == {TOY_ENV_ID} and "rooms" in envs[TOY_ENV_ID]["allowed_kwargs"]


def test_full_episode_and_close(toy_url):
    instance = create(toy_url, kwargs={"rooms": 2, "num_tasks": 1})
    reset = requests.post(f"{toy_url}/instances/{instance}/reset", json={"seed": 0}, timeout=10).json()
    assert "Find the key" in reset["observation"] and decode(reset["info"])["task_index"] == 0
    for action in ["take key", "go right"]:
        requests.post(
            f"{toy_url}/instances/{instance}/step", json={"action": action}, timeout=10
        ).raise_for_status()
    assert requests.get(f"{toy_url}/instances/{instance}/available_actions", timeout=10).json() == {
        "available_actions": ["go left", "open door", "look"]
    }
    final = requests.post(
        f"{toy_url}/instances/{instance}/step", json={"action": "open door"}, timeout=10
    ).json()
    assert final["reward"] == 1.0 and final["terminated"] and decode(final["info"])["won"]
    assert requests.get(f"{toy_url}/instances/{instance}/observation", timeout=10).json() == {
        "observation": "The door opens. You win."
    }
    assert requests.delete(f"{toy_url}/instances/{instance}", timeout=10).json() == {"closed": True}
    assert requests.get(f"{toy_url}/instances/{instance}", timeout=10).status_code == 404
    assert requests.delete(f"{toy_url}/instances/{instance}", timeout=10).status_code == 404


def test_create_with_seed_resets(toy_url):
    answer = requests.post(
        f"{toy_url}/instances",
        json={"env_id": TOY_ENV_ID, "seed": 5, "options": {"task_index": 3}},
        timeout=10,
    ).json()
    assert decode(answer["info"])["task_id"] == "toy-3" and answer["max_steps"] == 30
    requests.delete(f"{toy_url}/instances/{answer['instance_id']}", timeout=10)


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("post", "/instances", {"env_id": "progpo/Nope-v0"}, 404),
        ("post", "/instances", {"env_id": TOY_ENV_ID, "kwargs": {"crash_on_import": "os"}}, 400),
        ("post", "/instances", {"env_id": TOY_ENV_ID, "kwargs": {"rooms": {"a": 1}}}, 400),
        (
            "post",
            "/instances",
            {"env_id": TOY_ENV_ID, "kwargs": {"rooms": 1}},
            400,
        ),  # the env's own ValueError
        ("post", "/instances", {"env_id": TOY_ENV_ID, "kwargs": {"rooms": "five"}}, 400),
        ("post", "/instances", [1, 2], 400),
        ("post", "/instances", {"env_id": TOY_ENV_ID, "kwargs": {"$np": "x"}}, 400),
        ("post", "/instances/abc/step", {"action": "look"}, 404),
        ("get", "/instances/abc", None, 404),
        ("put", "/instances", {}, 405),
        ("get", "/no/such/route", None, 404),
    ],
)
def test_malformed_requests_are_4xx_with_a_message(toy_url, method, path, body, status):
    response = requests.request(method, toy_url + path, json=body, timeout=10)
    assert response.status_code == status, response.text
    assert response.json()["error"]


@pytest.mark.parametrize(
    ("route", "body", "status"),
    [
        ("reset", {"seed": -1}, 400),
        ("reset", {"seed": 2**64}, 400),
        ("reset", {"seed": "1"}, 400),
        ("reset", {"seed": True}, 400),
        ("reset", {"options": [1]}, 400),
        ("reset", {"options": {"task_index": 99}}, 400),
        ("reset", {"options": {"task_index": "x"}}, 400),
        ("reset", {"seq": 0}, 400),
        ("step", {}, 400),
        ("step", {"action": 5}, 400),
        ("step", {"action": "look"}, 409),
    ],
)
def test_bad_reset_and_step_arguments(toy_url, route, body, status):
    instance = create(toy_url)
    response = requests.post(f"{toy_url}/instances/{instance}/{route}", json=body, timeout=10)
    assert response.status_code == status, response.text
    assert response.json()["error"]
    requests.delete(f"{toy_url}/instances/{instance}", timeout=10)


def test_non_json_and_oversized_bodies(toy_url):
    instance = create(toy_url)
    bad = requests.post(
        f"{toy_url}/instances/{instance}/reset",
        data=b"\xff{not json",
        timeout=10,
        headers={"Content-Type": "application/json"},
    )
    assert bad.status_code == 400
    huge = requests.post(f"{toy_url}/instances/{instance}/step", data=b"x" * (9 << 20), timeout=30)
    assert huge.status_code == 413


def test_seq_makes_retries_idempotent(toy_url):
    instance = create(toy_url, kwargs={"rooms": 3})
    url = f"{toy_url}/instances/{instance}"
    first = requests.post(f"{url}/reset", json={"seed": 1, "seq": 1}, timeout=10).json()
    step = requests.post(f"{url}/step", json={"action": "go right", "seq": 2}, timeout=10).json()
    again = requests.post(f"{url}/step", json={"action": "go right", "seq": 2}, timeout=10).json()
    assert again == step and "room 1 of 3" in step["observation"]  # the retry did not move a second time
    assert requests.post(f"{url}/step", json={"action": "look", "seq": 5}, timeout=10).status_code == 409
    assert first["observation"]


def test_one_client_cannot_reach_another_instance(toy_url):
    mine, theirs = create(toy_url), create(toy_url)
    assert mine != theirs and len(mine) >= 32  # token_urlsafe(24): 192 random bits
    # no route lists instances; a guessed or altered id is unknown
    assert requests.get(f"{toy_url}/instances", timeout=10).status_code == 405
    assert requests.get(f"{toy_url}/metrics", timeout=10).text.count(theirs) == 0
    for guess in [theirs[:-1] + ("A" if theirs[-1] != "A" else "B"), theirs.upper(), "0", "../" + theirs]:
        assert requests.post(
            f"{toy_url}/instances/{guess}/step", json={"action": "look"}, timeout=10
        ).status_code in (404, 405)


def test_batch_step_mixes_results(toy_url):
    a, b = create(toy_url, seed=0), create(toy_url, seed=1)
    answer = requests.post(
        f"{toy_url}/batch/step",
        json={
            "steps": [
                {"instance_id": a, "action": "look"},
                {"instance_id": "missing", "action": "look"},
                {"instance_id": b, "action": "go right"},
            ]
        },
        timeout=10,
    ).json()["results"]
    assert [r["ok"] for r in answer] == [True, False, True] and answer[1]["status"] == 404
    assert (
        requests.post(f"{toy_url}/batch/step", json={"steps": [{"instance_id": a}]}, timeout=10).status_code
        == 400
    )
    assert requests.post(f"{toy_url}/batch/step", json={"steps": "x"}, timeout=10).status_code == 400
    resets = requests.post(
        f"{toy_url}/batch/reset",
        json={"resets": [{"instance_id": a, "seed": 3}, {"instance_id": b, "seed": 3}]},
        timeout=10,
    )
    first, second = resets.json()["results"]
    assert first["observation"] == second["observation"]


def test_env_crash_is_an_answer_and_the_server_keeps_serving(toy_url):
    instance = create(toy_url, kwargs={"crash_on": "explode"}, seed=0)
    crashed = requests.post(f"{toy_url}/instances/{instance}/step", json={"action": "explode"}, timeout=10)
    assert crashed.status_code == 500 and "crashed on purpose" in crashed.json()["error"]
    ok = requests.post(f"{toy_url}/instances/{instance}/step", json={"action": "look"}, timeout=10)
    assert ok.status_code == 200


def test_metrics_count(toy_url):
    before = requests.get(f"{toy_url}/metrics", timeout=10).json()
    instance = create(toy_url, seed=0)
    for _ in range(3):
        requests.post(f"{toy_url}/instances/{instance}/step", json={"action": "look"}, timeout=10)
    requests.get(f"{toy_url}/instances/nope", timeout=10)
    after = requests.get(f"{toy_url}/metrics", timeout=10).json()
    assert after["steps"] - before["steps"] == 3 and after["created"] - before["created"] == 1
    assert after["http"]["errors_404"] > before["http"].get("errors_404", 0)
    assert all(w["alive"] and w["rss_bytes"] > 0 for w in after["workers"])


def test_idle_instances_expire_and_the_limit_is_a_429():
    server = serve_toy(num_workers=1, max_instances=3, max_instances_per_client=3, idle_timeout=0.5)
    try:
        ids = [create(server.url) for _ in range(3)]
        full = requests.post(f"{server.url}/instances", json={"env_id": TOY_ENV_ID}, timeout=10)
        assert full.status_code == 429 and "limit" in full.json()["error"]
        time.sleep(1.2)
        assert requests.get(f"{server.url}/instances/{ids[0]}", timeout=10).status_code == 404
        metrics = requests.get(f"{server.url}/metrics", timeout=10).json()
        assert metrics["expired"] == 3 and metrics["live_instances"] == 0
        create(server.url)  # room again
    finally:
        server.stop()
