"""The stream door for a run's whole length (issue 38): its bounds are per message, never per connection (F2,
F3: a connection carries more than 8 MiB of calls and more than 64 MiB of answers, one server and a fleet),
no connection outlives its deadline or holds memory whatever its parser holds (F1, F4), and its edge cases are
answered (F10: ``HEAD``, ``//stream``, absurd frame lengths, a 1001 close on a drain, an answer too big for
the client)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import time

import gymnasium as gym
import pytest
import requests

from progpo_envs.server.app import ServerConfig, create_app
from progpo_envs.server.pool import PoolConfig
from progpo_envs.server.remote import REMOTE_ENV_ID, RemoteEnv, RemoteEnvError, largest_stream_connections
from progpo_envs.server.serving import BackgroundServer
from progpo_envs.server.websocket import (
    OP_CONTINUATION,
    OP_PING,
    OP_TEXT,
    FrameParser,
    WebSocketClient,
    encode_frame,
)
from tests.net import recv_until
from tests.progpo_envs.server.hosting_big_env import BIG_ENV_ID, WRITING
from tests.progpo_envs.server.hosting_helpers import (
    TOY_ENV_ID,
    CliServer,
    MisbehavingWebSocketServer,
    call,
    close_code,
    raw_upgrade,
    serve_toy,
    ws_url,
)

MIB = 1 << 20


def stream_connections(url: str) -> int:
    return requests.get(f"{url}/metrics", timeout=10).json()["http"].get("stream_connections", 0)


def serve_big(num_workers: int = 1) -> BackgroundServer:
    pool = PoolConfig(num_workers=num_workers, max_instances=16)
    return BackgroundServer(create_app(ServerConfig(env_ids=(BIG_ENV_ID,), pool=pool))).__enter__()


@pytest.fixture(scope="module")
def big_servers():
    servers = [serve_big(), serve_big()]
    yield servers
    for server in servers:
        server.stop()


# --- F2, F3: per message, never per connection ---------------------------------------------------------


@pytest.mark.parametrize("masked", [True, False])
def test_a_parser_bounds_each_message_never_the_connection(masked):
    """25 MiB of whole messages and 20 fragmented ones through a parser whose message bound is 1 MiB."""
    parser = FrameParser(MIB, masked=masked)
    payload = b"x" * (256 << 10)
    for _ in range(100):
        assert parser.feed(encode_frame(OP_TEXT, payload, mask=masked)) == [(OP_TEXT, payload)]
    for _ in range(20):
        fragments = [(OP_TEXT, False)] + [(OP_CONTINUATION, False)] * 2 + [(OP_CONTINUATION, True)]
        out = []
        for opcode, fin in fragments:
            frame = bytearray(encode_frame(opcode, payload[:200_000], mask=masked))
            frame[0] = (0x80 if fin else 0) | opcode
            out += parser.feed(bytes(frame))
        assert out == [(OP_TEXT, payload[:200_000] * 4)]
    assert parser.buffered == 0


def test_more_than_8_mib_of_calls_on_one_stream_connection(toy_url):
    """Twelve calls of 1 MiB each (steps with an over-long action: invalid actions, answered 200), then an
    ordinary step, all on one connection."""
    before = stream_connections(toy_url)
    ws = WebSocketClient(ws_url(toy_url), time.monotonic() + 10)
    try:
        created = call(ws, {"op": "create", "body": {"env_id": TOY_ENV_ID, "seed": 0}})
        instance = created["body"]["instance_id"]
        call(ws, {"op": "reset", "instance_id": instance, "body": {"seed": 0}})
        statuses = [
            call(ws, {"op": "step", "instance_id": instance, "body": {"action": "x" * MIB}})["status"]
            for _ in range(12)
        ]
        assert statuses == [200] * 12
        step = call(ws, {"op": "step", "instance_id": instance, "body": {"action": "look"}})
        assert step["status"] == 200 and "room" in step["body"]["observation"]
        call(ws, {"op": "close", "instance_id": instance})
    finally:
        ws.close()
    assert stream_connections(toy_url) - before == 1


def test_more_than_64_mib_of_answers_on_one_connection(big_servers):
    """70 answers of ~1 MiB through ``progpo/Remote-v0`` on one pooled connection."""
    url = big_servers[0].url
    before = stream_connections(url)
    env = RemoteEnv(url, BIG_ENV_ID, transport="stream")
    try:
        env.reset(seed=0)
        received = 0
        for _ in range(70):
            observation, *_ = env.step("look")
            assert len(observation) > WRITING
            received += len(observation)
        assert received > 64 * MIB
    finally:
        env.close()
    assert stream_connections(url) - before == 1


def test_a_fleet_carries_more_than_64_mib_of_answers_and_8_mib_of_calls_per_connection():
    """Two servers of their own, a group on each: 50 vector steps of 600 KiB actions and ~1 MiB observations
    per copy, ~60 MiB of calls and ~100 MiB of answers per server. One connection to each carries at least
    150 MiB of it (so more than 64 MiB of answers and more than 8 MiB of calls), and no episode fails."""
    servers = [serve_big(), serve_big()]
    urls = [server.url for server in servers]
    envs = gym.make_vec(
        REMOTE_ENV_ID, num_envs=4, group_size=2, url=urls, env_id=BIG_ENV_ID, transport="stream"
    )
    try:
        envs.reset(seed=0)
        for _ in range(50):
            observations, _, _, _, infos = envs.step(["y" * (600 << 10)] * 4)
            assert "env_error" not in infos and all(len(o) > WRITING for o in observations)
        assert [s["state"] for s in envs.unwrapped.servers()] == ["up", "up"]
        assert sorted(s["groups"] for s in envs.unwrapped.servers()) == [1, 1]
    finally:
        envs.close()
        for server in servers:
            server.stop()
    carried = largest_stream_connections()
    assert all(carried[ws_url(url)] >= 150 * MIB for url in urls), carried


def test_a_long_lived_connection_keeps_no_answers_it_sent(big_servers):
    """Waitress keeps what a connection sent in its out-buffer until 16 MiB have gone through it: a server's
    memory (or disk) grew with each long-lived connection's traffic. After 12 answers of ~1 MiB, the
    connection's buffer holds at most the recycling bound and one answer."""
    from webshop_server.serving import OUTBUF_RECYCLE_BYTES

    server = big_servers[1]
    ws = WebSocketClient(ws_url(server.url), time.monotonic() + 10)
    try:
        created = call(ws, {"op": "create", "body": {"env_id": BIG_ENV_ID, "seed": 0}})
        instance = created["body"]["instance_id"]
        step = {"op": "step", "instance_id": instance, "body": {"action": "look"}}
        assert [call(ws, step)["status"] for _ in range(12)] == [200] * 12
        held = [c.current_outbuf_count for c in _stream_channels(server)]
        assert held and max(held) <= OUTBUF_RECYCLE_BYTES + 2 * MIB
        call(ws, {"op": "close", "instance_id": instance})
    finally:
        ws.close()


def _oversized_answer(conn: socket.socket) -> None:
    """A frame header claiming 100 MiB."""
    conn.sendall(struct.pack("!BBQ", 0x81, 127, 100 * MIB) + b"{" * 65536)
    time.sleep(30)


def test_an_answer_over_the_clients_limit_fails_the_call_at_once():
    """The client's parser reports the oversized answer from its header; the call fails naming the limit,
    instead of waiting out its timeout for an answer that will never come."""
    server = MisbehavingWebSocketServer(_oversized_answer)
    started = time.monotonic()
    try:
        with pytest.raises(RemoteEnvError, match="more than 67108864 bytes"):
            RemoteEnv(server.url, TOY_ENV_ID, timeout=60, transport="stream")
        assert time.monotonic() - started < 20  # the timeout is 60 s
    finally:
        server.close()


# --- F1, F4: nothing outlives its deadline, nothing unfinished held in memory --------------------------


def _stream_channels(server: BackgroundServer) -> list:
    return [c for c in list(server._server.active_channels.values()) if getattr(c, "parser", None)]


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_an_http_request_pipelined_behind_the_upgrade_is_refused_and_its_connection_freed(toy_server):
    """The upgrade and an HTTP request in one packet: the 101, then a 1002 close (the request is never taken
    for a message), and the server holds no connection stuck with a request in flight."""
    sock = socket.create_connection(("127.0.0.1", toy_server.port), timeout=10)
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    try:
        sock.sendall(
            (
                "GET /stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            ).encode()
        )
        head = recv_until(sock, b"\r\n\r\n", size=1)  # not a byte of the frame behind it
        assert head.startswith(b"HTTP/1.1 101")
        assert close_code(sock) == 1002
    finally:
        sock.close()
    assert _wait(lambda: not [c for c in _stream_channels(toy_server) if c.requests], 10)


def _trickle_mid_frame(sock: socket.socket) -> None:
    sock.sendall(encode_frame(OP_TEXT, b'{"op": "dance"}' * 100, mask=True)[:50])


def _trickle_mid_fragmented_message(sock: socket.socket) -> None:
    first = bytearray(encode_frame(OP_TEXT, b'{"op": ', mask=True))
    first[0] = OP_TEXT  # not final
    sock.sendall(bytes(first) + encode_frame(OP_CONTINUATION, b"x" * 4000, mask=True)[:30])


def _trickle_mid_oversized_frame(sock: socket.socket) -> None:
    sock.sendall(struct.pack("!BBQ", 0x81, 0x80 | 127, 9 * MIB) + b"\0\0\0\0" + b"x" * 1000)


@pytest.mark.parametrize(
    "start", [_trickle_mid_frame, _trickle_mid_fragmented_message, _trickle_mid_oversized_frame]
)
def test_no_stream_connection_outlives_the_idle_deadline_whatever_its_parser_holds(start):
    """A client that trickles a byte every 0.2 s of a frame it never finishes is idle: the server closes it at
    the idle deadline (1 s here), though bytes keep coming."""
    server = serve_toy(num_workers=1)
    server._server.adj.channel_timeout = 1.0
    server._server.adj.cleanup_interval = 0.2
    sock = raw_upgrade(server.port)
    try:
        start(sock)
        sock.settimeout(0.2)
        started, closed = time.monotonic(), False
        while time.monotonic() - started < 15 and not closed:
            try:
                sock.sendall(b"x")
                closed = sock.recv(65536) == b""  # a 413 answer may come first (the oversized frame)
            except TimeoutError:
                pass
            except OSError:  # reset: closed
                closed = True
        assert closed, "the connection outlived its idle deadline by 14 s"
    finally:
        sock.close()
        server.stop()


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return kib << 10


@pytest.mark.parametrize("fragmented", [False, True])
def test_an_unfinished_long_message_goes_to_disk_not_memory(fragmented):
    """A parser with a 512 KiB spill bound holds 8 MiB less a byte of one message, or of 16 fragments, with
    at most 512 KiB in memory, and returns the whole message once its last byte comes."""
    parser = FrameParser(8 * MIB, masked=True, spill_bytes=512 << 10)
    message = os.urandom(8 * MIB)
    if fragmented:
        parts = [message[i : i + MIB // 2] for i in range(0, len(message), MIB // 2)]
        wire = b""
        for i, part in enumerate(parts):
            frame = bytearray(encode_frame(OP_CONTINUATION if i else OP_TEXT, part, mask=True))
            frame[0] = (0x80 if i == len(parts) - 1 else 0) | (OP_CONTINUATION if i else OP_TEXT)
            wire += bytes(frame)
    else:
        wire = encode_frame(OP_TEXT, message, mask=True)
    for i in range(0, len(wire) - 1, 65536):
        assert parser.feed(wire[i : min(i + 65536, len(wire) - 1)]) == []
        assert parser.buffered_in_memory <= 2 * (512 << 10) + 65536  # whole fragments, an unfinished one
    assert parser.buffered >= 8 * MIB - 1
    assert parser.feed(wire[-1:]) == [(OP_TEXT, message)]
    assert parser.buffered == parser.buffered_in_memory == 0


def test_unfinished_8_mib_frames_cost_the_server_disk_not_memory():
    """32 connections each send an 8 MiB frame but its last byte: the server's memory grows by far less than
    the 256 MiB they sent (the frames are spilled to files), and the files are closed with the connections."""
    server = serve_toy(num_workers=1)
    frame = encode_frame(OP_TEXT, b"z" * (8 * MIB), mask=True)[:-1]
    socks = []
    try:
        files_before, rss_before = len(os.listdir("/proc/self/fd")), _rss_bytes()
        for _ in range(32):
            sock = raw_upgrade(server.port)
            sock.sendall(frame)
            socks.append(sock)
        assert _wait(
            lambda: sum(c.parser.buffered for c in _stream_channels(server)) >= 32 * (8 * MIB - 16), 60
        )
        assert sum(c.parser.buffered_in_memory for c in _stream_channels(server)) <= 32 * (600 << 10)
        assert _rss_bytes() - rss_before < 128 * MIB  # the frames held in memory would be +256 MiB
        for sock in socks:
            sock.close()
        socks = []
        assert _wait(lambda: not _stream_channels(server), 10)
        assert len(os.listdir("/proc/self/fd")) <= files_before + 2
    finally:
        for sock in socks:
            sock.close()
        server.stop()


# --- F10 ----------------------------------------------------------------------------------------------------


def _upgrade_request(method: str, path: str) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def _first_answer(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        return recv_until(sock, b"\r\n\r\n")


def test_head_is_refused_with_405_and_a_doubled_slash_is_the_door(toy_server):
    """``HEAD /stream`` is not the door (405 saying to use GET), where it used to read "no stream door" (an
    ``auto`` client would have left for the HTTP routes); ``GET //stream`` is the door, as the routes
    merge slashes."""
    head = _first_answer(toy_server.port, _upgrade_request("HEAD", "/stream"))
    assert head.startswith(b"HTTP/1.1 405")
    assert _first_answer(toy_server.port, _upgrade_request("GET", "//stream")).startswith(b"HTTP/1.1 101")


@pytest.mark.parametrize(
    "length, code",
    [
        (1 << 63, 1002),  # a 64-bit length's most significant bit set: a protocol error (RFC 6455, 5.2)
        (1 << 40, 1009),  # more than the server would drop for a connection to go on
    ],
)
def test_an_absurd_frame_length_closes_the_connection_at_once(toy_server, length, code):
    sock = raw_upgrade(toy_server.port)
    try:
        sock.sendall(struct.pack("!BBQ", 0x81, 0x80 | 127, length) + b"\0\0\0\0")
        started = time.monotonic()
        assert close_code(sock) == code
        assert time.monotonic() - started < 5  # not the idle deadline's silence
    finally:
        sock.close()


def test_a_drain_closes_idle_stream_connections_with_1001():
    """SIGTERM: an idle stream connection gets a WebSocket close "going away" (1001), not a bare TCP close;
    a connection whose call is in flight gets its answer first, then the same close."""
    server = CliServer(
        "--import",
        "tests.progpo_envs.server.hosting_slow_env",
        "--env",
        "progpo/SlowToy-v0",
        "--env-kwargs",
        'progpo/SlowToy-v0={"step_delay": 1.5}',
        "--agentgym",
        "none",
    )
    idle = busy = None
    try:
        idle = raw_upgrade(server.port)
        busy = raw_upgrade(server.port)
        created = {"op": "create", "body": {"env_id": "progpo/SlowToy-v0", "seed": 0}}
        busy.sendall(encode_frame(OP_TEXT, json.dumps(created).encode(), mask=True))
        parser = FrameParser(16 * MIB, masked=False)
        instance = None
        while instance is None:
            for _, payload in parser.feed(busy.recv(65536)):
                instance = json.loads(payload)["body"]["instance_id"]
        busy.sendall(encode_frame(OP_PING, b"", mask=True))
        step = {"op": "step", "instance_id": instance, "body": {"action": "look"}}
        busy.sendall(encode_frame(OP_TEXT, json.dumps(step).encode(), mask=True))
        time.sleep(0.5)
        server.process.send_signal(signal.SIGTERM)
        assert close_code(idle) == 1001
        frames = []
        while not frames or frames[-1][0] != 0x8:
            chunk = busy.recv(65536)
            assert chunk, f"closed without a close frame after {frames}"
            frames += parser.feed(chunk)
        answers = [json.loads(payload) for opcode, payload in frames if opcode == OP_TEXT]
        assert [a["status"] for a in answers] == [200]  # the step in flight was answered
        assert struct.unpack("!H", frames[-1][1][:2])[0] == 1001
        assert server.process.wait(30) == 0
    finally:
        for sock in (idle, busy):
            if sock is not None:
                sock.close()
        server.stop()
