"""The OpenEnv door's connections (issue 35, item 1): one host's half-sent connections cost that host, never
the others, with the native servers' shares, deadlines and quiet logs
(:mod:`progpo_envs.server.uvicorn_serving`).

* ``progpo serve --protocol openenv`` with 1,024 open files (``ulimit -n``'s usual default): while one host
  holds 1,100 half-sent connections (3,000 in the ``slow`` test) another host's ``/health`` and WebSocket
  reset answer within 2 s, and the log stays a few lines (before: both timed out, and the log grew by
  ~4 MB/s of "Too many open files" tracebacks); with 300 open files, too few, the door still answers and
  logs one such traceback every 10 s;
* a half-sent request head is dropped after the read deadline, a silent connection after the idle one; a
  WebSocket session outlives both;
* past its share a host's oldest idle connection makes room for its next one (its own health check is never
  locked out behind its stale connections), and past the limit a new connection is closed;
* :class:`~webshop_server.serving.FloodFilter` lets one record of a kind through per interval, with a count.
"""

from __future__ import annotations

import json
import logging
import resource
import socket
import sys
import time
from pathlib import Path

import pytest
import requests
from websockets.sync.client import connect

from progpo_envs.server.app import ServerConfig
from progpo_envs.server.openenv_app import OpenEnvServer, create_openenv_app
from progpo_envs.server.pool import PoolConfig
from progpo_envs.server.uvicorn_serving import FairShareProtocol, fair_share_protocol
from progpo_envs.testing import KEY_DOOR_ENV_ID as TOY_ENV_ID
from tests.net import half_open, session_from
from tests.progpo_envs.server.hosting_helpers import CliServer
from webshop_server.serving import FloodFilter, connections_per_host


def _open_files_at_least(needed: int) -> None:
    """This process's soft limit on open files raised to ``needed`` (the attack's sockets are ours too)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"this process may open at most {hard} files; the test needs {needed}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _reset_from(url: str, address: str, timeout: float) -> dict:
    with connect(url.replace("http", "ws") + "/ws", open_timeout=timeout, source_address=(address, 0)) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"task_index": 0}}))
        return json.loads(ws.recv(timeout=timeout))


@pytest.mark.parametrize(
    "held, open_files", [(1100, 1024), (1100, 300), pytest.param(3000, 1024, marks=pytest.mark.slow)]
)
def test_one_hosts_half_sent_connections_leave_the_door_to_every_other_host(
    second_host_address, held, open_files
):
    """The issue's attack on the CLI's server with 1,024 open files: one host (every loopback address is one)
    opens ``held`` connections whose request heads never end. Another host's ``/health`` and WebSocket reset
    answer within 2 s, the server holds no more than its share of them, and its log stays quiet. With 300
    open files (fewer than a share and a pass of accepts) the server does run out of descriptors: it still
    answers, and logs one traceback every 10 s with a count of the others."""
    _open_files_at_least(held + 512)
    server = CliServer(
        "--protocol", "openenv", "--import", "progpo_envs.testing", "--env", TOY_ENV_ID, "--workers", "1",
        ready_path="/health",
        open_files=open_files,
    )  # fmt: skip
    sockets = []
    try:
        sockets = half_open(server.port, ["127.0.0.2", "127.0.0.3"], held // 2, "/health")
        time.sleep(1.0)
        started = time.monotonic()
        assert session_from(second_host_address).get(f"{server.url}/health", timeout=2).status_code == 200
        assert _reset_from(server.url, second_host_address, timeout=2)["type"] == "observation"
        assert time.monotonic() - started < 2.0
        descriptors = len(list(Path(f"/proc/{server.process.pid}/fd").iterdir()))
        assert descriptors < connections_per_host(1024) + 64, descriptors
        time.sleep(2.0)
        output = server.output()
        assert output.count("Traceback") <= 3 and len(output) < 16_000, output[-2000:]
        if open_files >= 1024:
            assert "Too many open files" not in output and output.count("\n") < 10, output[-2000:]
    finally:
        for sock in sockets:
            sock.close()
        server.stop()


@pytest.fixture
def quick_server():
    """The toy env's OpenEnv door with short deadlines (read 1 s, idle 2 s) and 8 connections (2 a host)."""
    config = ServerConfig(env_ids=(TOY_ENV_ID,), pool=PoolConfig(num_workers=1, idle_timeout=300.0))
    protocol = fair_share_protocol(connection_limit=8, idle_timeout=2.0, read_timeout=1.0)
    server = OpenEnvServer(create_openenv_app(config), protocol=protocol).start()
    yield server
    server.stop()


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (``None``: still open after ``seconds``)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except OSError:
        pass
    return time.monotonic() - started


def _connection(port: int, address: str, data: bytes = b"") -> socket.socket:
    sock = socket.socket()
    sock.bind((address, 0))
    sock.connect(("127.0.0.1", port))
    if data:
        sock.sendall(data)
    return sock


def test_a_half_sent_head_is_dropped_after_the_read_deadline_and_a_silent_connection_after_the_idle_one(
    quick_server,
):
    """Before: uvicorn kept both for as long as the client liked."""
    half_sent = _connection(quick_server.port, "127.0.0.2", b"GET /health HTTP/1.1\r\nHost: x\r\n")
    silent = _connection(quick_server.port, "127.0.0.3")
    try:
        assert 0.8 < _closed_within(half_sent, 5.0) < 3.0
        assert _closed_within(silent, 5.0) is not None  # 2 s after it opened
        with connect(quick_server.url.replace("http", "ws") + "/ws", open_timeout=10) as ws:
            time.sleep(3.0)  # past both deadlines: a WebSocket session is not a request being read
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        assert requests.get(f"{quick_server.url}/health", timeout=10).status_code == 200
    finally:
        half_sent.close()
        silent.close()


def test_past_its_share_a_host_closes_its_oldest_idle_connection_and_past_the_limit_a_new_one_is_closed(
    quick_server, second_host_address
):
    """Two connections a host (a quarter of 8): a third from another loopback address of the same host closes
    the host's oldest idle one, so the host's own health check gets through its stale connections (before: it
    was locked out behind them); the other hosts keep theirs."""
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n"
    first, second = (_connection(quick_server.port, "127.0.0.2", head) for _ in range(2))
    others = [_connection(quick_server.port, second_host_address, head) for _ in range(2)]
    try:
        time.sleep(0.2)
        assert requests.get(f"{quick_server.url}/health", timeout=5).status_code == 200  # from 127.0.0.1
        assert _closed_within(first, 0.5) is not None and _closed_within(second, 0.3) is None
        assert all(_closed_within(sock, 0.2) is None for sock in others)
    finally:
        for sock in [first, second, *others]:
            sock.close()


def test_protocols_with_the_default_limits_are_the_default_protocol():
    assert fair_share_protocol() is FairShareProtocol
    quick = fair_share_protocol(read_timeout=1.0)
    assert issubclass(quick, FairShareProtocol) and quick.read_timeout == 1.0
    assert quick.connection_limit == FairShareProtocol.connection_limit


def test_the_flood_filter_lets_one_record_of_a_kind_through_per_interval_and_counts_the_others():
    """The log of a server out of descriptors (before: a traceback per failed accept, ~10,000 a second)."""
    flood = FloodFilter(interval=0.5)

    def record(message: str) -> logging.LogRecord:
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, None, sys.exc_info())

    passed = [flood.filter(record("socket.accept() out of system resource")) for _ in range(1000)]
    assert passed.count(True) == 1 and passed[0]
    assert flood.filter(record("another fault"))  # another kind shows at once
    time.sleep(0.6)
    again = record("socket.accept() out of system resource")
    assert flood.filter(again) and "999 more like it" in again.getMessage()
