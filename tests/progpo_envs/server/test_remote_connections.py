"""How ``progpo/Remote-v0`` uses its connections (issue 38, item 2): many envs of one host stay within the
server's per-host share and lose nothing (F6), every call is safe to retry (a create too: its idempotency
key), and a URL that cannot work fails at once, naming itself (F9)."""

from __future__ import annotations

import socket
import threading
import time

import gymnasium as gym
import pytest
import requests

from progpo_envs.server.fleet import ServerFleet, server_urls
from progpo_envs.server.remote import (
    MAX_CONNECTIONS_PER_SERVER,
    REMOTE_ENV_ID,
    RemoteEnv,
    RemoteEnvError,
    ServerUnavailableError,
    _connections,
)
from progpo_envs.server.websocket import ClientPool, DeadlineExceeded
from tests.net import accept_each
from tests.progpo_envs.server.hosting_helpers import TOY_ENV_ID, CliServer, serve_toy

# --- F6: 400 envs of one host -------------------------------------------------------------------------------


def _play_one(url: str, transport: str, start: threading.Barrier, failures: list, index: int) -> None:
    try:
        start.wait(60)
        env = gym.make(REMOTE_ENV_ID, url=url, env_id=TOY_ENV_ID, transport=transport)
        try:
            env.reset(seed=index)
            for action in ("look", "go right", "take key"):
                env.step(action)
        finally:
            env.close()
    except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
        failures.append(f"env {index}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("transport", ["stream", "http"])
def test_400_concurrent_envs_of_one_host_lose_none(transport):
    """Before: 3-5.5% of 300-400 concurrent envs failed at create (HTTP: 15 of 300). The pool opened a
    connection per call in flight, past the server's share of 256 per host, so the server closed the host's
    oldest idle connection, often the pooled one a create was about to use, and a create was not retried.
    Now a process opens at most 64 per server and waits for one past that, and a create whose connection
    closed is sent again with its idempotency key: 400 envs, 400 instances, none lost or made twice."""
    server = CliServer("--import", "progpo_envs.testing", "--env", TOY_ENV_ID, "--workers", "2")
    try:
        count, failures = 400, []
        start = threading.Barrier(count)
        threads = [
            threading.Thread(target=_play_one, args=(server.url, transport, start, failures, i))
            for i in range(count)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        assert not failures, f"{len(failures)} of {count} envs failed, e.g. {failures[:3]}"
        metrics = requests.get(f"{server.url}/metrics", timeout=10).json()
        assert metrics["created"] == count and metrics["live_instances"] == 0  # none made twice, all closed
        connections = _connections(server.url, None, 5.0)
        assert connections.stream.open_connections <= MAX_CONNECTIONS_PER_SERVER
        assert connections.http.open_connections <= MAX_CONNECTIONS_PER_SERVER
    finally:
        server.stop()


def test_a_client_pool_waits_for_a_connection_at_its_bound(toy_url):
    """At its bound a pool lends no new connection: the next call waits for one given back, and gets
    :class:`DeadlineExceeded` if none is by its deadline."""
    pool = ClientPool(toy_url.replace("http", "ws") + "/stream", max_connections=2)
    first, second = pool.connect(time.monotonic() + 10), pool.connect(time.monotonic() + 10)
    with pytest.raises(DeadlineExceeded, match="all 2 connections"):
        pool.connect(time.monotonic() + 0.3)
    threading.Timer(0.3, pool.give_back, args=(second,)).start()
    assert pool.connect(time.monotonic() + 10) is second and pool.open_connections == 2
    pool.discard(first)
    pool.discard(second)
    assert pool.open_connections == 0


def test_a_client_pool_lends_the_connection_it_opened_first(toy_url):
    """A burst of calls opens several connections; the calls after it keep to the first one, whichever was
    given back last (before: the last given back, so calls rotated over the burst's connections and none
    of them carried a long run's traffic or went idle long enough to be closed)."""
    pool = ClientPool(toy_url.replace("http", "ws") + "/stream", max_connections=3)
    burst = [pool.connect(time.monotonic() + 10) for _ in range(3)]
    for connection in burst:
        pool.give_back(connection)
    for _ in range(3):
        taken = pool.connect(time.monotonic() + 10)
        assert taken is burst[0]
        pool.give_back(taken)
    pool.discard(pool.connect(time.monotonic() + 10))  # the first one fails: the second opened is next
    assert pool.connect(time.monotonic() + 10) is burst[1]


class _AnswerDroppingProxy:
    """A TCP proxy to ``port`` whose first connection passes everything on but closes the client's side
    instead of passing on the server's answer after the first ``passed`` ones (the stream door's 101 is
    one): the call happened, its answer never arrived (as when a connection breaks after the server
    acted)."""

    def __init__(self, port: int, passed: int):
        self.port, self.passed = port, passed
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        accept_each(self.listener, self._relay)

    def _relay(self, client: socket.socket) -> None:
        self.connections += 1  # the next connection comes after this one failed
        passed = self.passed if self.connections == 1 else None
        upstream = socket.create_connection(("127.0.0.1", self.port))

        def forward() -> None:
            try:
                while data := client.recv(65536):
                    upstream.sendall(data)
            except OSError:
                pass

        threading.Thread(target=forward, daemon=True).start()
        try:
            while data := upstream.recv(65536):
                if passed is not None:
                    if passed == 0:
                        break
                    passed -= 1
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):  # shut down first: the other thread's recv is woken too
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("transport", ["stream", "http"])
def test_a_create_whose_answer_was_lost_is_retried_without_a_second_instance(transport):
    """The first create reaches the server, which makes the instance, but its answer never comes back
    (before: an ``http`` create was not retried at all, ``ServerUnavailableError``: "the call may or may
    not have happened"). It is sent again with its idempotency key, and the server answers with the
    instance it made: one instance, and the env plays on it."""
    server = serve_toy(num_workers=1)
    proxy = _AnswerDroppingProxy(server.port, passed=1 if transport == "stream" else 0)
    try:
        env = RemoteEnv(proxy.url, TOY_ENV_ID, transport=transport, backoff=0.01, timeout=30)
        assert proxy.connections >= 2  # the first one lost the answer
        metrics = requests.get(f"{server.url}/metrics", timeout=10).json()
        assert metrics["created"] == 1 and metrics["live_instances"] == 1
        env.reset(seed=0)
        env.step("look")
        env.close()
        assert requests.get(f"{server.url}/metrics", timeout=10).json()["live_instances"] == 0
    finally:
        proxy.close()
        server.stop()


def test_the_server_answers_a_create_once_per_key_and_client(toy_url):
    body = {"env_id": TOY_ENV_ID, "idempotency_key": "k-1"}
    first = requests.post(f"{toy_url}/instances", json=body, timeout=10)
    again = requests.post(f"{toy_url}/instances", json=body, timeout=10)
    other = requests.post(f"{toy_url}/instances", json={**body, "idempotency_key": "k-2"}, timeout=10)
    plain = [requests.post(f"{toy_url}/instances", json={"env_id": TOY_ENV_ID}, timeout=10) for _ in range(2)]
    assert first.status_code == again.status_code == 201 and again.json() == first.json()
    ids = {r.json()["instance_id"] for r in (first, other, *plain)}
    assert len(ids) == 4  # another key, or none: another instance
    refused = requests.post(f"{toy_url}/instances", json={**body, "idempotency_key": 7}, timeout=10)
    assert refused.status_code == 400 and "idempotency_key" in refused.json()["error"]
    for instance in ids:
        requests.delete(f"{toy_url}/instances/{instance}", timeout=10)


# --- F9: URLs that cannot work ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:notaport", "the port must be a number from 1 to 65535, not 'notaport'"),
        ("http://127.0.0.1:0", "not '0'"),
        ("http://127.0.0.1:70000", "not '70000'"),
        ("ftp://127.0.0.1:8000", "must start with http:// or https://"),
        ("http://:8000", "name a host"),
        ("http://127.0.0.1:8000?x=1", "no query"),
    ],
)
def test_a_url_that_names_no_server_is_a_one_line_error_at_once(url, message):
    """Before: a bad port was tried as any other and reported the server ``down`` (or an answer "that is
    not JSON"); now it is a ``ValueError`` naming the URL, before any request, for one server or many."""
    for urls in (url, f"http://127.0.0.1:9,{url}"):
        with pytest.raises(ValueError, match=message) as raised:
            gym.make(REMOTE_ENV_ID, url=urls, env_id=TOY_ENV_ID)
        assert "\n" not in str(raised.value) and url.split("?")[0] in str(raised.value)
    with pytest.raises(ValueError, match=message):
        server_urls(url)


def test_one_server_under_two_names_is_refused(toy_server):
    """Before: 127.0.0.1 and localhost were two servers to the fleet, which counted the one server's load
    apart for each name; now the server's id (``/ready``'s ``server_id``) gives it away."""
    twice = [toy_server.url, toy_server.url.replace("127.0.0.1", "localhost")]
    with pytest.raises(ValueError, match="names one env server more than once") as raised:
        ServerFleet(twice)
    assert all(url in str(raised.value) for url in twice)
    with pytest.raises(ValueError, match="more than once"):
        gym.make_vec(REMOTE_ENV_ID, num_envs=2, group_size=1, url=twice, env_id=TOY_ENV_ID)


@pytest.mark.parametrize("transport", ["stream", "http"])
def test_https_to_a_plain_http_server_fails_at_once(toy_server, transport):
    """Before: the TLS handshake waited for an answer the plain-HTTP server never gave, so the call waited
    out its whole ``timeout``; now the server answers a TLS handshake in plain HTTP, the handshake fails and
    the call says so at once, naming the URL."""
    url = toy_server.url.replace("http://", "https://")
    started = time.monotonic()
    with pytest.raises(ServerUnavailableError, match="TLS handshake") as raised:
        RemoteEnv(url, TOY_ENV_ID, transport=transport, timeout=60)
    assert time.monotonic() - started < 10 and url in str(raised.value)


def test_a_wrong_path_prefix_names_its_url(toy_server):
    """Before: ``[404] not found``, naming no URL; now every error names the server and the route."""
    url = f"{toy_server.url}/v1"
    with pytest.raises(RemoteEnvError, match="404") as raised:
        RemoteEnv(url, TOY_ENV_ID)
    assert f"{url}/instances" in str(raised.value)
