"""AgentGym's env-server protocol (ALFWorld shape) over the toy env: the calls AgentGym's clients make."""

from __future__ import annotations

import requests


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
