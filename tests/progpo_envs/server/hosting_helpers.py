"""Helpers of the env-server tests: the toy env served on loopback (in this process or as `progpo serve`)."""

from __future__ import annotations

import base64
import json
import math
import os
import socket
import struct
import threading
import time
from collections.abc import Callable

import numpy as np

from progpo_envs.server.app import ServerConfig, create_app
from progpo_envs.server.pool import PoolConfig
from progpo_envs.server.serving import BackgroundServer
from progpo_envs.server.websocket import FrameParser, WebSocketClient, accept_key
from progpo_envs.testing import KEY_DOOR_ENV_ID as TOY_ENV_ID
from tests.net import ServerCli, accept_each, recv_until


def same(a, b) -> bool:
    """Equal values of identical types, recursively (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        pairs = zip(a, b, strict=False)
        return len(a) == len(b) and all(same(k1, k2) and same(a[k1], b[k2]) for k1, k2 in pairs)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, np.ndarray):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and all(same(x, y) for x, y in zip(a.ravel(), b.ravel(), strict=False))
        )
    if isinstance(a, (float, np.floating)) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def plain(value):
    """Arrays as lists, recursively (vector infos compare by value)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/stream"


def call(ws: WebSocketClient, message: dict | bytes, timeout: float = 30) -> dict:
    """One message and its answer."""
    payload = message if isinstance(message, bytes) else json.dumps(message).encode()
    ws.send(payload, time.monotonic() + timeout)
    return json.loads(ws.receive(time.monotonic() + timeout))


def raw_upgrade(port: int, source: str = "127.0.0.1", headers: str = "") -> socket.socket:
    """A socket through the handshake (its 101 read), for frames written by hand."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{headers}\r\n"
        ).encode()
    )
    head = recv_until(sock, b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101") and accept_key(key).encode() in head, head
    return sock


def read_message(sock: socket.socket) -> bytes:
    """The next message the server sends on a raw socket."""
    parser = FrameParser(1 << 24, masked=False)
    while True:
        messages = parser.feed(sock.recv(65536))
        if messages:
            return messages[0][1]


def close_code(sock: socket.socket) -> int | None:
    """The close code of the close frame the server sends (``None`` if it closed without one)."""
    data = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    if len(data) >= 4 and data[0] & 0x0F == 0x8:
        return struct.unpack("!H", data[2:4])[0]
    return None


class MisbehavingWebSocketServer:
    """A WebSocket server on loopback that accepts the upgrade and reads the client's first message, then
    does ``misbehave(conn)`` (a stalled, trickling or oversized answer): one thread per connection."""

    def __init__(self, misbehave: Callable[[socket.socket], None]):
        self.misbehave = misbehave
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        accept_each(self.sock, self._one)

    def _one(self, conn: socket.socket) -> None:
        try:
            head = recv_until(conn, b"\r\n\r\n")
            key = next(
                line.split(b":", 1)[1].strip().decode()
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"sec-websocket-key")
            )
            conn.sendall(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                + f"Sec-WebSocket-Accept: {accept_key(key)}\r\n\r\n".encode()
            )
            conn.recv(65536)
            self.misbehave(conn)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


def concurrent_clients(play: Callable[[int], None], clients: int, timeout: float) -> list[str]:
    """``play(index)`` for ``clients`` indices at once, a thread each (each joined within ``timeout`` s);
    every error raised, as ``client <index>: <error>``."""
    errors: list[str] = []

    def client(index: int) -> None:
        try:
            play(index)
        except Exception as exc:  # noqa: BLE001 - collected and asserted on
            errors.append(f"client {index}: {exc!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    return errors


def serve_toy(**pool_kwargs) -> BackgroundServer:
    """A started background server hosting the toy env (AgentGym protocol mounted for it)."""
    pool = PoolConfig(**{"num_workers": 2, "max_instances": 256, "idle_timeout": 120.0, **pool_kwargs})
    app = create_app(ServerConfig(env_ids=(TOY_ENV_ID,), pool=pool, agentgym=TOY_ENV_ID))
    return BackgroundServer(app).__enter__()


class CliServer(ServerCli):
    """``progpo serve`` (the CLI's ``main``) in a subprocess (:class:`tests.net.ServerCli`); ready once
    ``ready_path`` answers 200 (``/health`` for ``--protocol openenv``)."""

    def __init__(self, *args: str, ready_path: str = "/ready", **kwargs):
        super().__init__("progpo_envs.server.cli", *args, ready_path=ready_path, **kwargs)


#: The toy ALFWorld whose steps sleep (``tests/progpo_envs/server/hosting_slow_env.py`` registers it).
SLOW_ENV_ID = "progpo/SlowToy-v0"


def slow_toy_cli_server(*args: str, **env_kwargs) -> CliServer:
    """``progpo serve`` hosting :data:`SLOW_ENV_ID` alone, built with ``env_kwargs`` (``step_delay``: seconds
    each step sleeps), without AgentGym's door; ``args``: more of the command line."""
    kwargs = f"{SLOW_ENV_ID}={json.dumps(env_kwargs)}"
    module = "tests.progpo_envs.server.hosting_slow_env"  # CliServer puts the repo root on PYTHONPATH
    return CliServer(
        "--import", module, "--env", SLOW_ENV_ID, "--env-kwargs", kwargs, "--agentgym", "none", *args
    )
