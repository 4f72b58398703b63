"""Reliability under load, faults and bad input (loopback only, bounded in time)."""

from __future__ import annotations

import errno
import os
import random
import signal
import threading
import time

import psutil
import pytest
import requests
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from progpo_envs.server.remote import InstanceLostError, RemoteEnv, RemoteEnvError
from tests.progpo_envs.server.hosting_helpers import TOY_ENV_ID, concurrent_clients, serve_toy


def run_clients(url: str, clients: int, steps: int) -> list[str]:
    """``clients`` threads, each with its own remote env, ``steps`` steps each; returns every error seen."""
    barrier = threading.Barrier(clients)

    def play(index: int) -> None:
        rng = random.Random(index)
        env = RemoteEnv(url, TOY_ENV_ID, max_steps=25)
        barrier.wait(60)
        env.reset(seed=index)
        for _ in range(steps):
            _, _, terminated, truncated, info = env.step(rng.choice(info_actions(env)))
            if terminated or truncated:
                env.reset()
        env.close()

    return concurrent_clients(play, clients, timeout=600)


def info_actions(env: RemoteEnv) -> list[str]:
    return ["go left", "go right", "take key", "open door", "look", "sing"]


def test_32_clients_200_steps_zero_errors(toy_url):
    # about 20 s on 2 loaded cores, so it stays in the default set (the bound for that is 60 s)
    before = requests.get(f"{toy_url}/metrics", timeout=10).json()
    assert run_clients(toy_url, clients=32, steps=200) == []
    after = requests.get(f"{toy_url}/metrics", timeout=10).json()
    assert after["steps"] - before["steps"] == 32 * 200
    assert after["http"].get("errors_500", 0) == before["http"].get("errors_500", 0)
    assert after["live_instances"] == before["live_instances"]  # every client closed its instance


def test_worker_killed_mid_run():
    server = serve_toy(num_workers=2)
    try:
        pool = server.app.extensions["progpo_pool"]
        envs = [RemoteEnv(server.url, TOY_ENV_ID) for _ in range(4)]  # least-loaded placement: 2 per worker
        for i, env in enumerate(envs):
            env.reset(seed=i)
        victim_pid = pool.worker_pids()[0]
        on_victim = [env for env in envs if pool._records[env.instance_id].worker == 0]
        survivors = [env for env in envs if env not in on_victim]
        assert on_victim and survivors
        outcomes: dict[int, str] = {}
        stop = threading.Event()

        def hammer(env: RemoteEnv, key: int) -> None:
            try:
                while not stop.is_set():
                    env.step("look")
                outcomes[key] = "ok"
            except InstanceLostError as exc:
                outcomes[key] = f"lost: {exc}"
            except Exception as exc:  # noqa: BLE001
                outcomes[key] = f"other: {exc!r}"

        threads = [threading.Thread(target=hammer, args=(env, i)) for i, env in enumerate(envs)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        os.kill(victim_pid, signal.SIGKILL)
        time.sleep(1.5)
        stop.set()
        for thread in threads:
            thread.join(60)
        for i, env in enumerate(envs):
            if env in on_victim:
                assert outcomes[i].startswith("lost:") and "worker" in outcomes[i], outcomes[i]
            else:
                assert outcomes[i] == "ok", outcomes[i]
        metrics = requests.get(f"{server.url}/metrics", timeout=10).json()
        assert metrics["worker_restarts"] == 1 and metrics["lost"] == len(on_victim)
        assert requests.get(f"{server.url}/ready", timeout=10).status_code == 200
        assert pool.worker_pids()[0] != victim_pid
        fresh = RemoteEnv(server.url, TOY_ENV_ID)  # the restarted worker serves new instances
        fresh.reset(seed=0)
        fresh.step("look")
    finally:
        server.stop()


def test_stopping_with_open_connections_raises_nothing_on_the_serving_thread():
    """stop() closes the open channels from the caller's thread while the serving thread sits in select();
    that race used to surface, rarely, as an EBADF exception on the serving thread. Too rare to provoke on
    demand, so the loop is also made to meet a closed descriptor: while stopping that is the stop; otherwise
    it is a fault and is raised."""
    from progpo_envs.server.serving import BackgroundServer

    owner = serve_toy(num_workers=1)  # owns the app's env pool; the servers below share it
    raised: list[BaseException | None] = []
    previous_hook = threading.excepthook
    threading.excepthook = lambda args: raised.append(args.exc_value)
    try:
        for _ in range(5):
            server = BackgroundServer(owner.app, shutdown_pool=False).__enter__()
            sessions = [requests.Session() for _ in range(3)]
            for session in sessions:  # keep-alive: each leaves a channel open in the serving loop
                assert session.get(f"{server.url}/health", timeout=10).status_code == 200
            server.stop()
            assert not server._thread.is_alive()
            for session in sessions:
                session.close()

        server = BackgroundServer(owner.app, shutdown_pool=False)  # not started: its loop is called directly

        def loop_meets_a_closed_descriptor() -> None:
            raise OSError(errno.EBADF, "Bad file descriptor")

        server._server.run = loop_meets_a_closed_descriptor
        with pytest.raises(OSError):
            server._serve()  # not stopping: a real fault
        server._stopping.set()  # what stop() sets first
        server._serve()  # stopping: the closed descriptor is the stop itself
        server._server.close()
    finally:
        threading.excepthook = previous_hook
        owner.stop()
    assert raised == []


def churn(url: str, count: int) -> None:
    session = requests.Session()
    for _ in range(count):
        created = session.post(f"{url}/instances", json={"env_id": TOY_ENV_ID, "seed": 0}, timeout=30)
        assert created.status_code == 201
        assert (
            session.delete(f"{url}/instances/{created.json()['instance_id']}", timeout=30).status_code == 200
        )


def rss(pids: list[int]) -> int:
    return sum(psutil.Process(pid).memory_info().rss for pid in pids + [os.getpid()])


def _memory_growth(count: int) -> tuple[int, dict]:
    server = serve_toy(num_workers=1)
    try:
        pids = server.app.extensions["progpo_pool"].worker_pids()
        churn(server.url, 300)  # warm-up: allocator pools, caches, connection
        before = rss(pids)
        churn(server.url, count)
        metrics = requests.get(f"{server.url}/metrics", timeout=10).json()
        return rss(pids) - before, metrics
    finally:
        server.stop()


def test_instance_churn_does_not_leak_small():
    growth, metrics = _memory_growth(1000)
    assert metrics["live_instances"] == 0 and metrics["created"] == 1300
    assert growth < 8 << 20, f"grew {growth / 2**20:.1f} MiB over 1000 instances"


@pytest.mark.slow
def test_10000_instances_without_memory_growth():
    growth, metrics = _memory_growth(10_000)
    assert metrics["live_instances"] == 0 and metrics["closed"] == 10_300
    assert growth < 16 << 20, f"grew {growth / 2**20:.1f} MiB over 10,000 instances"


_json = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=30),
    ),
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=10), kids, max_size=4)
    ),
    max_leaves=12,
)
_fields = st.dictionaries(
    st.sampled_from(
        [
            "env_id",
            "kwargs",
            "seed",
            "options",
            "action",
            "seq",
            "steps",
            "resets",
            "instance_id",
            "id",
            "env_idx",
            "game",
            "session_id",
            "world_type",
        ]
    ),
    _json,
    max_size=5,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["GET", "POST", "DELETE", "PUT"]),
    path=st.sampled_from(
        [
            "/instances",
            "/instances/{id}",
            "/instances/{id}/reset",
            "/instances/{id}/step",
            "/instances/{id}/observation",
            "/instances/{id}/available_actions",
            "/batch/step",
            "/batch/reset",
            "/create",
            "/reset",
            "/step",
            "/observation?id=5",
            "/available_actions?id=x",
            "/detail?id=",
            "/close",
            "/metrics",
            "/envs",
            "/",
        ]
    ),
    body=st.one_of(_fields, _json, st.binary(max_size=40)),
    valid_id=st.booleans(),
)
# Found by a CI run: a non-string env id reached a dict lookup (TypeError, 500).
@example(method="POST", path="/instances", body={"env_id": []}, valid_id=False)
def test_fuzzed_requests_never_500(toy_server, fuzz_instance, method, path, body, valid_id):
    url = toy_server.url + path.replace("{id}", fuzz_instance if valid_id else "zz")
    if isinstance(body, bytes):
        response = requests.request(
            method, url, data=body, timeout=30, headers={"Content-Type": "application/json"}
        )
    else:
        if isinstance(body, dict) and valid_id and "steps" in body and isinstance(body["steps"], list):
            body["steps"] = [
                {**s, "instance_id": fuzz_instance} if isinstance(s, dict) else s for s in body["steps"]
            ]
        response = requests.request(method, url, json=body, timeout=30)
    assert response.status_code < 500, (method, path, body, response.text)
    if response.status_code >= 400:
        assert response.json()["error"]


@pytest.fixture(scope="module")
def fuzz_instance(toy_url) -> str:
    return requests.post(f"{toy_url}/instances", json={"env_id": TOY_ENV_ID, "seed": 0}, timeout=30).json()[
        "instance_id"
    ]


def test_server_still_healthy_after_fuzzing(toy_url):
    assert requests.get(f"{toy_url}/ready", timeout=10).status_code == 200
    with pytest.raises(RemoteEnvError):
        RemoteEnv(toy_url, TOY_ENV_ID, rooms=-3)
