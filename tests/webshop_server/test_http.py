"""The production server (waitress, in a subprocess on a loopback port) against the in-process env."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import requests

from progpo_envs.webshop.env import WebShopEnv
from webshop_server.engine import WebShopEngine


def play(env, task_index):
    obs, info = env.reset(options={"task_index": task_index})
    trace = [obs]
    while True:
        obs, reward, terminated, truncated, info = env.step(info["expert_action"])
        trace.append((obs, reward, terminated, truncated, info["task_score"], int(info["history_key"])))
        if terminated or truncated:
            return trace


def test_url_env_matches_in_process_env(http_server, tmp_path):
    url, num_products = http_server
    remote = WebShopEnv(url=url, split="test", expert=True)
    local = WebShopEnv(
        engine=WebShopEngine.shared(num_products, 0, cache_dir=tmp_path), split="test", expert=True
    )
    assert remote.num_tasks == local.num_tasks
    for task_index in range(5):
        remote_trace, local_trace = play(remote, task_index), play(local, task_index)
        assert remote_trace == local_trace
        assert remote_trace[-1][4] == 1.0
    # an invalid action through HTTP is an invalid action, not an error
    remote.reset(options={"task_index": 0})
    obs, reward, terminated, truncated, info = remote.step("click[nothing here]")
    assert info["action_valid"] is False and not terminated
    remote.close()
    local.close()


def test_concurrent_clients(http_server):
    url, _ = http_server

    def episode(task_index):
        env = WebShopEnv(url=url, split="train", expert=True)
        try:
            return play(env, task_index)[-1][4]
        finally:
            env.close()

    with ThreadPoolExecutor(8) as pool:
        scores = list(pool.map(episode, range(16)))
    assert scores == [1.0] * 16


def test_malformed_http_gets_4xx(http_server):
    url, _ = http_server
    assert requests.post(url + "/api/sessions", data="garbage", timeout=5).status_code == 400
    reply = requests.post(url + "/api/sessions/" + "x" * 3000 + "/step", json={"action": "a"}, timeout=5)
    assert 400 <= reply.status_code < 500
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"GARBAGE / HTTP/9.9\r\n\r\n")
        status = sock.recv(200).split(b" ")[1]
    assert status.startswith(b"4")


def test_http_backend_has_a_deadline_against_a_trickling_server(trickling_server):
    """Every call of the env's HTTP backend ends by its deadline, whatever the server sends (before: a server
    answering a byte at a time held it for ever)."""
    import time

    import pytest

    from progpo_envs.webshop.env import HttpBackend

    server = trickling_server(["/api/sessions"], reply={"num_goals": 4, "fingerprint": "f"})
    backend = HttpBackend(server.url, timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"POST /api/sessions failed: .*1 s deadline"):
        backend.create(0)
    assert time.monotonic() - started < 3.0
    backend.close()
