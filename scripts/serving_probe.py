"""Measurements of the servers under load that a reliability attack left unconfirmed (issue 35), and of what
an ALFWorld worker keeps over a long run (issue 38).

* ``memory``: the resident memory of an ALFWorld OpenEnv server's env worker over ``--sessions`` sessions
  played one after the other, each a WebSocket session that resets a task of its own, steps twice and closes
  (one env worker, so every session's instance lived in it);
* ``gunicorn``: how long the WebShop site served by gunicorn keeps requests whose head was half sent and then
  never finished (``--held`` of them from one host: as many as both workers' threads), and a connection that
  sends nothing;
* ``loopback``: whether a health check from this machine (127.0.0.1) answers while another local address
  (127.0.0.2: the same client, loopback) holds a full share of half-sent connections, on the native env
  server, the OpenEnv door and the site (waitress): every loopback address is one client host, so the health
  check counts in the share the half-sent connections hold;
* ``copies``: what ``--extra`` ALFWorld engines opened beside ``--engines`` (for ``--steps`` random steps)
  leave in the process once closed (every game loaded before, as a worker's ``warm_up`` does): the planner
  copies a worker keeps after a failed server's groups move back;
* ``games``: an ALFWorld process meeting ``--games`` generated games one after another (as a worker meets a
  real split's 3,553): its RSS and the entries of TextWorld's table of interned propositions.

Usage::

    .venv/bin/python scripts/serving_probe.py memory --sessions 200
    .venv/bin/python scripts/serving_probe.py gunicorn
    .venv/bin/python scripts/serving_probe.py loopback
    .venv/bin/python scripts/serving_probe.py copies
    .venv/bin/python scripts/serving_probe.py games --games 480 --every 80

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

Measured 2026-12-06 (issue 38), before (4b00563) and after, on the same machine, quiet:

* ``copies``: 20 engines at 147.3 MiB, 172.1 with 12 more; once the 12 were closed, 171.7 MiB before (2.03 MiB
  kept per idle planner copy, +16.6%) and 153.1 after (0.5 MiB, +4.0%: an idle copy frees its planner task
  and its code leaves the resident set);
* ``games --games 480 --every 80``: the table of interned propositions held 11,501, 29,754, 44,524,
  53,887, 60,298 and 69,052 entries (RSS 121.8 -> 142.7 -> 169.1 -> 190.3 -> 195.6 -> 181.9 MiB); after, the
  same up to 240 games, then 14,917, 27,891 and 45,413 (RSS 182.3 -> 181.9 -> 168.2 MiB): bounded at 50,000.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
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


def _rss_mib() -> float:
    """This process's RSS once its heap's free pages are handed back (as an env worker's trimmer does)."""
    import psutil

    # ctypes here, not progpo_base.glibc: the script also measures older checkouts (PYTHONPATH), which lack it
    ctypes.CDLL(None).malloc_trim(0)
    return round(psutil.Process().memory_info().rss / 2**20, 1)


def _play(engines: list, rng: random.Random, steps: int) -> None:
    for _ in range(steps):
        for engine in engines:
            engine.step(rng.choice(engine.admissible_commands))


def copies(args: argparse.Namespace) -> None:
    """What ``--extra`` ALFWorld engines opened beside ``--engines`` leave behind in the process once closed
    (the planner copies a worker keeps after a failed server's groups move back)."""
    from progpo_envs.alfworld.data import generated_data_dir, load_tasks
    from progpo_envs.alfworld.engine import AlfredEngine

    games = [task.game_file() for task in load_tasks("train", generated_data_dir("train"))]
    rng = random.Random(0)
    warm = AlfredEngine(max_cached_games=len(games))  # every game loaded before, as a worker's warm_up does
    for game in games:
        warm.reset(game)
    warm.close()

    def opened(count: int) -> list:
        engines = [AlfredEngine() for _ in range(count)]
        for engine in engines:
            engine.reset(rng.choice(games))
        return engines

    engines = opened(args.engines)
    _play(engines, rng, args.steps)
    before = _rss_mib()
    extra = opened(args.extra)
    _play(engines + extra, rng, args.steps)
    with_extra = _rss_mib()
    for engine in extra:
        engine.close()
    _play(engines, rng, args.steps)
    after = _rss_mib()
    print(json.dumps({
        "measure": "alfworld_idle_planner_copies", "engines": args.engines, "extra": args.extra,
        "rss_mib": {"before": before, "with_extra": with_extra, "after_closing_extra": after},
        "kept_per_idle_copy_mib": round((after - before) / args.extra, 2),
        "growth": round(after / before - 1, 4),
    }))  # fmt: skip


def games(args: argparse.Namespace) -> None:
    """An ALFWorld engine's process meeting ``--games`` generated games one after another: its RSS and the
    entries of TextWorld's table of interned propositions every ``--every`` games."""
    from progpo_envs.alfworld.data import generated_data_dir, load_tasks
    from progpo_envs.alfworld.engine import AlfredEngine, interned_propositions

    tasks = load_tasks("train", generated_data_dir("train", num_games=args.games))
    engine, rng = AlfredEngine(), random.Random(0)
    for index, task in enumerate(tasks, 1):
        engine.reset(task.game_file())
        _play([engine], rng, 5)
        if index % args.every == 0:
            entries = interned_propositions()
            print(json.dumps({"games": index, "interned": entries, "rss_mib": _rss_mib()}), flush=True)


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
    four = commands.add_parser("copies", help="what ALFWorld engines opened a while and closed leave behind")
    four.add_argument("--engines", type=int, default=20)
    four.add_argument("--extra", type=int, default=12)
    four.add_argument("--steps", type=int, default=200, help="random steps of every open engine, each phase")
    five = commands.add_parser("games", help="an ALFWorld process meeting new games one after another")
    five.add_argument("--games", type=int, default=240)
    five.add_argument("--every", type=int, default=40)
    args = parser.parse_args(argv)
    measures = {
        "memory": memory,
        "gunicorn": gunicorn,
        "loopback": loopback,
        "copies": copies,
        "games": games,
    }
    measures[args.measure](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
