"""Three measurements of the servers under load that a reliability attack left unconfirmed (issue 35).

* ``memory``: the resident memory of an ALFWorld OpenEnv server's env worker over ``--sessions`` sessions
  played one after the other, each a WebSocket session that resets a task of its own, steps twice and closes
  (one env worker, so every session's instance lived in it);
* ``gunicorn``: how long the WebShop site served by gunicorn keeps requests whose head was half sent and then
  never finished (``--held`` of them from one host: as many as both workers' threads), and a connection that
  sends nothing;
* ``loopback``: whether a health check from this machine (127.0.0.1) answers while another local address
  (127.0.0.2: the same client, loopback) holds a full share of half-sent connections, on the native env
  server, the OpenEnv door and the site (waitress): every loopback address is one client host, so the health
  check counts in the share the half-sent connections hold.

Usage::

    .venv/bin/python scripts/serving_probe.py memory --sessions 200
    .venv/bin/python scripts/serving_probe.py gunicorn
    .venv/bin/python scripts/serving_probe.py loopback

Each prints one JSON line per measurement. In another checkout (``PYTHONPATH=<checkout>``) it measures that
checkout's servers.

Measured 2026-12-03 on the shared 2-core machine (load average 4-7), before (the parent of issue 35's commits)
and after:

* ``memory``: the worker's resident memory went 81 -> 176 -> 235 -> 290 -> 344 -> 391 -> 442 -> 498 -> 544 MiB
  every 25 sessions, with no instance alive: each session's env left its ``libdownward`` copy behind (some
  2 MiB; ``progpo_envs.alfworld.engine``). After: 81 -> 127 -> 140 -> 143 -> 144 -> 145 -> 143 -> 145 ->
  142 MiB (the bounded caches of loaded games and translations filling, then flat);
* ``gunicorn``: a single half-sent request was dropped after 10.0 s, as claimed, and a silent connection
  after 7.0 s; but 8 half-sent requests from one host were dropped after 10, 10, 12, 12, 20, 22, 30 and 32 s
  (each waited for one of its host's threads before its 10 s began) and every drop stalled its worker 2 s
  (gunicorn's graceful close lingers): another host's health check took up to 5.9 s meanwhile. After: 10,
  10, 10, 11, 11, 12, 12 and 13 s, the other host's checks 0.01 s;
* ``loopback``: the health check from 127.0.0.1 was refused (a connection error) by the env server and the
  site, whose share the 300 connections from 127.0.0.2 held (the OpenEnv door had no share at all). After:
  200 in 0.01 s on all three (past its share a host's oldest idle connection makes room).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _routed_address() -> str:
    """This machine's non-loopback IPv4 address (a second client host to a server on 127.0.0.1)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the routed source address
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.3"
    finally:
        probe.close()


def _wait_healthy(url: str, process: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode})")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer")


def _serve(command: list[str], health: str) -> tuple[subprocess.Popen, str, int]:
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(
        [sys.executable, "-m", *command, "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url + health, process)
    return process, url, port


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def _half_sent(
    port: int, address: str, head: bytes = b"GET /health HTTP/1.1\r\nHost: x\r\n"
) -> socket.socket:
    sock = socket.socket()
    sock.bind((address, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    if head:
        sock.sendall(head)
    return sock


def _seconds_until_closed(socks: list[socket.socket], limit: float) -> list[float | None]:
    """Seconds from now until the server closed each of ``socks`` (``None``: open after ``limit`` s)."""
    started = time.monotonic()
    closed: dict[int, float] = {}
    for sock in socks:
        sock.setblocking(False)
    while len(closed) < len(socks) and time.monotonic() - started < limit:
        for index, sock in enumerate(socks):
            if index in closed:
                continue
            try:
                if sock.recv(4096) == b"":
                    closed[index] = time.monotonic() - started
            except BlockingIOError:
                pass
            except OSError:
                closed[index] = time.monotonic() - started
        time.sleep(0.02)
    return [round(closed[i], 2) if i in closed else None for i in range(len(socks))]


def _health_latencies(url: str, address: str, into: list[float], start: float = 8.0, stop: float = 16.0):
    """Seconds each health check from ``address`` took, one every 0.2 s from ``start`` to ``stop`` s on."""
    from requests.adapters import HTTPAdapter

    class FromAddress(HTTPAdapter):
        def init_poolmanager(self, *args, **kwargs):
            kwargs["source_address"] = (address, 0)
            super().init_poolmanager(*args, **kwargs)

    session = requests.Session()
    session.mount("http://", FromAddress())
    began = time.monotonic()
    time.sleep(start)
    while time.monotonic() - began < stop:
        sent = time.monotonic()
        try:
            session.get(url + "/api/health", timeout=10)
        except requests.RequestException:
            pass
        into.append(round(time.monotonic() - sent, 2))
        time.sleep(0.2)


def memory(args: argparse.Namespace) -> None:
    """RSS of the OpenEnv server's one env worker after every ``--every`` sessions."""
    from websockets.sync.client import connect

    from progpo_envs.server.app import ServerConfig
    from progpo_envs.server.openenv_app import OpenEnvServer, create_openenv_app
    from progpo_envs.server.pool import PoolConfig

    env_id = "progpo/ALFWorld-v0"
    config = ServerConfig(
        env_ids=(env_id,),
        env_kwargs={env_id: {"split": args.split}},
        pool=PoolConfig(num_workers=1, idle_timeout=600.0),
    )
    server = OpenEnvServer(create_openenv_app(config)).start()
    pool = server.app.state.progpo_pool
    ws_url = server.url.replace("http", "ws") + "/ws"
    try:
        rows = []
        started = time.monotonic()
        num_tasks = args.sessions  # until the first reset says how many the split has
        for session in range(args.sessions + 1):
            if session % args.every == 0:
                worker = pool.metrics()["workers"][0]
                rows.append((session, round(worker["rss_bytes"] / 2**20, 1), pool.live_instances))
                print(json.dumps({"sessions": session, "worker_rss_mib": rows[-1][1], "live": rows[-1][2]}))
            if session == args.sessions:
                break
            with connect(ws_url, open_timeout=60) as ws:
                ws.send(json.dumps({"type": "reset", "data": {"task_index": session % num_tasks}}))
                answer = json.loads(ws.recv(timeout=300))
                if answer["type"] != "observation":
                    raise RuntimeError(f"session {session}: {answer}")
                observation = answer["data"]["observation"]
                num_tasks = observation["num_tasks"]
                for command in observation["admissible_actions"][:2]:
                    ws.send(json.dumps({"type": "step", "data": {"command": command}}))
                    json.loads(ws.recv(timeout=300))
        print(
            json.dumps(
                {
                    "measure": "alfworld_openenv_worker_rss_mib",
                    "sessions": args.sessions,
                    "first": rows[0][1],
                    "last": rows[-1][1],
                    "by_sessions": {str(n): rss for n, rss, _ in rows},
                    "live_instances_after": pool.live_instances,
                    "seconds": round(time.monotonic() - started, 1),
                }
            )
        )
    finally:
        server.stop()


def gunicorn(args: argparse.Namespace) -> None:
    """Seconds until the gunicorn site drops a half-sent request and a silent connection."""
    command = [
        "webshop_server.cli",
        "serve",
        "--num-products",
        "200",
        "--server",
        "gunicorn",
        "--workers",
        "2",
    ]
    process, url, port = _serve(command, "/api/health")
    try:
        head = b"GET /api/health HTTP/1.1\r\nHost: x\r\n"
        halves = [_half_sent(port, "127.0.0.2", head) for _ in range(args.held)]
        silent = _half_sent(port, args.second_host, b"")
        kept_alive = _half_sent(port, args.second_host, head + b"\r\n")  # one whole request, answered
        kept_alive.settimeout(10)
        answer = kept_alive.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
        kept_alive.sendall(head)  # then the next one's head half sent, on the kept-alive connection
        latencies: list[float] = []
        monitor = threading.Thread(target=_health_latencies, args=(url, args.second_host, latencies))
        monitor.start()
        *half_closed, silent_closed, kept_closed = _seconds_until_closed(
            [*halves, silent, kept_alive], args.limit
        )
        monitor.join()
        print(
            json.dumps(
                {
                    "measure": "gunicorn_site_drops_after_s",
                    "half_sent_requests": half_closed,
                    "silent_connection_from_another_host": silent_closed,
                    "second_request_half_sent_on_a_kept_alive_connection": kept_closed,
                    "other_hosts_health_check_slowest_s_while_they_drop": max(latencies),
                    "limit_s": args.limit,
                }
            )
        )
    finally:
        _stop(process)


def loopback(args: argparse.Namespace) -> None:
    """A local health check while another loopback address holds a full share of half-sent connections."""
    toy = ["--import", "progpo_envs.testing", "--env", "progpo/ServerToy-v0", "--workers", "1"]
    servers = {
        "native": (["progpo_envs.server.cli", *toy], "/health"),
        "openenv": (["progpo_envs.server.cli", "--protocol", "openenv", *toy], "/health"),
        "site": (["webshop_server.cli", "serve", "--num-products", "200"], "/api/health"),
    }
    for name, (command, health) in servers.items():
        process, url, port = _serve(command, health)
        held = []
        try:
            for _ in range(args.held):
                try:
                    held.append(
                        _half_sent(port, "127.0.0.2", f"GET {health} HTTP/1.1\r\nHost: x\r\n".encode())
                    )
                except OSError:
                    pass
            time.sleep(1.0)
            started = time.monotonic()
            try:
                status = requests.get(url + health, timeout=args.limit).status_code
            except requests.RequestException as exc:
                status = type(exc).__name__
            print(
                json.dumps(
                    {
                        "measure": "local_health_check_behind_a_full_loopback_share",
                        "server": name,
                        "held_from_127.0.0.2": args.held,
                        "health_from_127.0.0.1": status,
                        "seconds": round(time.monotonic() - started, 2),
                    }
                )
            )
        finally:
            for sock in held:
                sock.close()
            _stop(process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="measure", required=True)
    one = commands.add_parser("memory", help="an ALFWorld OpenEnv worker's memory over many sessions")
    one.add_argument("--sessions", type=int, default=200)
    one.add_argument("--every", type=int, default=25)
    one.add_argument("--split", default="train")
    two = commands.add_parser("gunicorn", help="how long the gunicorn site keeps a half-sent request")
    two.add_argument("--limit", type=float, default=60.0)
    two.add_argument("--held", type=int, default=8, help="half-sent requests from 127.0.0.2 (2 workers x 4)")
    two.add_argument("--second-host", default=_routed_address(), help="this machine's non-loopback address")
    three = commands.add_parser("loopback", help="a local health check behind a full loopback share")
    three.add_argument("--held", type=int, default=300, help="half-sent connections (a share is 256)")
    three.add_argument("--limit", type=float, default=10.0)
    args = parser.parse_args(argv)
    {"memory": memory, "gunicorn": gunicorn, "loopback": loopback}[args.measure](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
