"""The native protocol's stream door (``GET /stream`` as a WebSocket): the same answers as the HTTP routes,
and the same protections (per-host connection share, client tokens and shares, limits per message, 4xx on
bad input, idle timeout, drain), spoken by an independent WebSocket client as well as
``progpo/Remote-v0``."""

from __future__ import annotations

import json
import random
import signal
import socket
import struct
import threading
import time

import gymnasium as gym
import pytest
import requests

from progpo_envs.server.remote import (
    REMOTE_ENV_ID,
    RemoteEnv,
    RemoteEnvError,
    ServerUnavailableError,
    step_batch,
)
from progpo_envs.server.websocket import (
    OP_TEXT,
    ClientPool,
    ConnectionClosed,
    WebSocketClient,
    encode_frame,
)
from tests.net import half_open
from tests.progpo_envs.server.hosting_helpers import (
    SLOW_ENV_ID,
    TOY_ENV_ID,
    MisbehavingWebSocketServer,
    call,
    close_code,
    raw_upgrade,
    read_message,
    same,
    serve_toy,
    slow_toy_cli_server,
    ws_url,
)
from webshop_server.serving import CONNECTION_LIMIT, connections_per_host

ACTIONS = ["go left", "go right", "take key", "open door", "look", "dance", "", "x" * 5000, 17, None]


def play(env: gym.Env, seed: int | None, steps: int, rng: random.Random) -> list:
    trace = [env.reset(seed=seed)]
    for _ in range(steps):
        trace.append(env.step(rng.choice(ACTIONS)))
    return trace


def metrics(url: str) -> dict:
    return requests.get(f"{url}/metrics", timeout=10).json()


@pytest.fixture
def ws(toy_url):
    client = WebSocketClient(ws_url(toy_url), time.monotonic() + 10)
    yield client
    client.close()


# --- the same answers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["stream", "http"])
def test_both_transports_play_as_in_process(toy_url, transport):
    kwargs = {"rooms": 4, "max_steps": 12, "history_depths": (1, 2)}
    local = gym.make(TOY_ENV_ID, **kwargs)
    remote = gym.make(REMOTE_ENV_ID, url=toy_url, env_id=TOY_ENV_ID, transport=transport, **kwargs)
    for episode in range(2):
        seed = 5 if episode == 0 else None
        rng_seed = 5 + episode
        assert same(
            play(remote, seed, 14, random.Random(rng_seed)), play(local, seed, 14, random.Random(rng_seed))
        )
    assert remote.unwrapped._client.uses_stream() == (transport == "stream")
    remote.close()


def test_a_stream_answer_is_the_http_routes_answer(toy_url, ws):
    """The body of every op's answer is byte for byte what its HTTP route answers (a second instance, the
    same seeds and actions)."""
    created = call(ws, {"op": "create", "body": {"env_id": TOY_ENV_ID, "seed": 3}})
    assert created["status"] == 201
    over_stream = created["body"]["instance_id"]
    over_http = requests.post(
        f"{toy_url}/instances", json={"env_id": TOY_ENV_ID, "seed": 3}, timeout=30
    ).json()
    assert {k: v for k, v in created["body"].items() if k != "instance_id"} == {
        k: v for k, v in over_http.items() if k != "instance_id"
    }
    http = over_http["instance_id"]
    for op, method, suffix, body in [
        ("step", "POST", "/step", {"action": "go right", "seq": 1}),
        ("step", "POST", "/step", {"action": "take key", "seq": 2}),
        ("get", "GET", "", None),
        ("observation", "GET", "/observation", None),
        ("available_actions", "GET", "/available_actions", None),
        ("reset", "POST", "/reset", {"seed": 7, "seq": 3}),
    ]:
        answer = call(ws, {"op": op, "instance_id": over_stream, "body": body})
        expected = requests.request(method, f"{toy_url}/instances/{http}{suffix}", json=body, timeout=30)
        assert answer["status"] == expected.status_code == 200
        assert answer["body"] == expected.json()
    steps = [
        {"instance_id": over_stream, "action": "look", "seq": 4},
        {"instance_id": "nope", "action": "look"},
    ]
    batch = call(ws, {"op": "batch_step", "body": {"steps": steps}})
    assert batch["status"] == 200
    assert [r["ok"] for r in batch["body"]["results"]] == [True, False]
    assert batch["body"]["results"][1]["status"] == 404
    assert call(ws, {"op": "close", "instance_id": over_stream})["body"] == {"closed": True}
    requests.delete(f"{toy_url}/instances/{http}", timeout=30)


def test_an_independent_websocket_client_plays_the_door(toy_url):
    """OpenEnv's dependency ``websockets`` (its own client, not ours) opens the door and plays a step."""
    sync_client = pytest.importorskip("websockets.sync.client")
    with sync_client.connect(ws_url(toy_url), open_timeout=10) as connection:
        connection.send(json.dumps({"op": "create", "body": {"env_id": TOY_ENV_ID, "seed": 0}}))
        created = json.loads(connection.recv(timeout=30))
        instance = created["body"]["instance_id"]
        connection.send(json.dumps({"op": "step", "instance_id": instance, "body": {"action": "look"}}))
        answer = json.loads(connection.recv(timeout=30))
        assert answer["status"] == 200 and "observation" in answer["body"]
        connection.ping()  # control frames are answered
        connection.send(json.dumps({"op": "close", "instance_id": instance}))
        assert json.loads(connection.recv(timeout=30))["status"] == 200


def test_the_remote_envs_of_a_process_share_a_few_connections(toy_url):
    before = metrics(toy_url)["http"].get("stream_connections", 0)
    envs = [RemoteEnv(toy_url, TOY_ENV_ID) for _ in range(12)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    step_batch(envs, ["look"] * 12)
    for env in envs:
        env.step("go left")
        env.close()
    assert metrics(toy_url)["http"]["stream_connections"] - before <= 2  # not one per env


# --- bad input: a 4xx answer, the connection stays -------------------------------------------------------


@pytest.mark.parametrize(
    "message, status, words",
    [
        (b"not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"op": "step", "instance_id": "x", "body": {"action": "look", "seed": NaN}}', 400, "NaN"),
        ({"op": "dance"}, 404, "unknown op"),
        ({"op": "step", "instance_id": "nope", "body": {"action": "look"}}, 404, "unknown instance"),
        ({"op": "step", "instance_id": 7, "body": {"action": "look"}}, 400, "string"),
        ({"op": "create", "body": {"env_id": "progpo/Nope-v0"}}, 404, "not hosted"),
        (
            {"op": "create", "body": {"env_id": TOY_ENV_ID, "kwargs": {"data_dir": "/etc"}}},
            400,
            "not allowed",
        ),
        ({"op": "create", "body": []}, 400, "JSON object"),
        ({"op": "batch_step", "body": {"steps": 3}}, 400, "must be a list"),
        (
            {
                "op": "create",
                "body": {"env_id": TOY_ENV_ID, "options": {"$nd": "<U50000000", "shape": [1], "v": ["a"]}},
            },
            400,
            "limit",
        ),
    ],
)
def test_a_bad_message_is_answered_4xx_and_the_connection_stays(ws, message, status, words):
    answer = call(ws, message)
    assert answer["status"] == status and words in answer["body"]["error"], answer
    assert call(ws, {"op": "dance"})["status"] == 404  # the same connection answers the next message


def test_an_action_of_the_wrong_type_and_an_out_of_order_seq(ws):
    instance = call(ws, {"op": "create", "body": {"env_id": TOY_ENV_ID, "seed": 0}})["body"]["instance_id"]
    assert call(ws, {"op": "step", "instance_id": instance, "body": {"action": 5}})["status"] == 400
    assert (
        call(ws, {"op": "step", "instance_id": instance, "body": {"action": "look", "seq": 9}})["status"]
        == 409
    )
    call(ws, {"op": "close", "instance_id": instance})


def test_too_many_json_values_is_a_413(ws):
    body = '{"op": "batch_step", "body": {"steps": [' + ",".join(["{}"] * 140_000) + "]}}"
    assert call(ws, body.encode())["status"] == 413


# --- protocol errors close the connection -------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame, code",
    [
        (encode_frame(OP_TEXT, b'{"op": "dance"}', mask=False), 1002),  # a client's frames must be masked
        (bytes([0xC1, 0x80]) + b"\0\0\0\0", 1002),  # a reserved bit set
        (bytes([0x83, 0x80]) + b"\0\0\0\0", 1002),  # an unknown opcode
        (
            struct.pack("!BBQ", 0x01, 0x80 | 127, 64 << 20),
            1009,
        ),  # a fragment of 64 MiB: refused on its header
    ],
)
def test_a_protocol_error_closes_the_connection_with_its_code(toy_server, frame, code):
    sock = raw_upgrade(toy_server.port)
    try:
        sock.sendall(frame)
        assert close_code(sock) == code
    finally:
        sock.close()


def test_a_frame_over_the_limit_is_answered_413_from_its_header_and_never_kept(toy_server):
    """A 64 MiB frame is answered as soon as its header is in (its payload is dropped as it arrives, never
    buffered), and the connection goes on."""
    sock = raw_upgrade(toy_server.port)
    try:
        sock.sendall(struct.pack("!BBQ", 0x81, 0x80 | 127, 64 << 20) + b"\0\0\0\0" + b"x" * 100_000)
        answer = json.loads(read_message(sock))
        assert answer["status"] == 413 and "at most" in answer["body"]["error"]
        channels = [c for c in toy_server._server.active_channels.values() if getattr(c, "parser", None)]
        assert all(c.parser.buffered_in_memory < (1 << 20) for c in channels)
    finally:
        sock.close()


def test_a_message_too_large_for_the_server_is_a_413_for_remote_v0(toy_url):
    env = RemoteEnv(toy_url, TOY_ENV_ID, transport="stream")
    env.reset(seed=0)
    with pytest.raises(RemoteEnvError) as caught:
        env._client.request("POST", "/batch/step", {"steps": [{"action": "x" * 1000}] * 9000})
    assert caught.value.status == 413
    env.step("look")  # the next call opens a new connection
    env.close()


# --- shares, tokens, idle connections, slow clients, drain --------------------------------------------------


def test_stream_connections_count_in_the_per_host_share(toy_server, second_host_address):
    share = connections_per_host(CONNECTION_LIMIT)
    held = []
    try:
        for _ in range(share + 8):
            try:
                held.append(raw_upgrade(toy_server.port, "127.0.0.3"))
            except (OSError, AssertionError):
                break
        time.sleep(0.3)
        live = [c for c in toy_server._server.active_channels.values() if getattr(c, "parser", None)]
        assert len([c for c in live if c.addr[0] == "127.0.0.3"]) <= share
        other = raw_upgrade(toy_server.port, second_host_address)  # another host: its own share
        other.sendall(encode_frame(OP_TEXT, b'{"op": "dance"}', mask=True))
        assert json.loads(read_message(other))["status"] == 404
        other.close()
    finally:
        for sock in held:
            sock.close()


def test_a_client_token_is_checked_at_the_upgrade_and_counts_for_the_shares():
    from progpo_envs.server.app import ServerConfig, create_app
    from progpo_envs.server.pool import PoolConfig
    from progpo_envs.server.serving import BackgroundServer
    from webshop_server.clients import ClientTokens

    config = ServerConfig(
        env_ids=(TOY_ENV_ID,),
        pool=PoolConfig(num_workers=1, max_instances=8),
        client_tokens=ClientTokens(["greedy-token-1", "polite-token-2"]),
    )
    server = BackgroundServer(create_app(config)).__enter__()
    try:
        with pytest.raises(Exception) as refused:
            WebSocketClient(
                ws_url(server.url), time.monotonic() + 10, headers={"Authorization": "Bearer made-up"}
            )
        assert getattr(refused.value, "status", None) == 401
        greedy = WebSocketClient(
            ws_url(server.url), time.monotonic() + 10, headers={"Authorization": "Bearer greedy-token-1"}
        )
        statuses = [
            call(greedy, {"op": "create", "body": {"env_id": TOY_ENV_ID}})["status"] for _ in range(6)
        ]
        assert statuses == [201] * 4 + [429] * 2  # half of the server's instances
        polite = RemoteEnv(server.url, TOY_ENV_ID, token="polite-token-2")
        assert polite._client.uses_stream()
        polite.close()
        greedy.close()
    finally:
        server.stop()


def test_an_idle_stream_connection_is_closed_and_remote_v0_opens_another():
    server = serve_toy(num_workers=1)
    server._server.adj.channel_timeout = 0.5
    server._server.adj.cleanup_interval = 0.2
    try:
        raw = WebSocketClient(ws_url(server.url), time.monotonic() + 10)
        env = RemoteEnv(server.url, TOY_ENV_ID)
        env.reset(seed=0)
        time.sleep(2.0)
        with pytest.raises(ConnectionClosed):
            raw.receive(time.monotonic() + 5)  # the server closed it (no call in flight)
        env.step("look")  # the env's idle connection went stale: a new one, no error
        assert metrics(server.url)["http"]["stream_connections"] >= 3
        env.close()
    finally:
        server.stop()


def test_half_sent_frames_hold_connections_not_threads():
    """Connections that stop in the middle of a frame cost no waitress thread: with 2 threads, 6 of them do
    not keep another client's step from its answer."""
    from progpo_envs.server.app import ServerConfig, create_app
    from progpo_envs.server.pool import PoolConfig
    from progpo_envs.server.serving import BackgroundServer

    app = create_app(ServerConfig(env_ids=(TOY_ENV_ID,), pool=PoolConfig(num_workers=1)))
    server = BackgroundServer(app, threads=2).__enter__()
    stuck = []
    try:
        for _ in range(6):
            sock = raw_upgrade(server.port)
            sock.sendall(encode_frame(OP_TEXT, b'{"op": "dance"}' * 100, mask=True)[:40])  # never finished
            stuck.append(sock)
        stuck += half_open(server.port, ["127.0.0.1"], 2, "/stream")  # and upgrades never finished
        env = RemoteEnv(server.url, TOY_ENV_ID, timeout=10)
        started = time.monotonic()
        env.reset(seed=0)
        env.step("look")
        assert time.monotonic() - started < 5
        env.close()
    finally:
        for sock in stuck:
            sock.close()
        server.stop()


def test_sigterm_finishes_a_stream_call_in_flight_then_exits():
    server = slow_toy_cli_server(step_delay=2.0)
    try:
        env = RemoteEnv(server.url, SLOW_ENV_ID, transport="stream", retries=0)
        env.reset(seed=0)
        answers: list = []
        in_flight = threading.Thread(target=lambda: answers.append(env.step("look")))
        in_flight.start()
        time.sleep(0.5)
        server.process.send_signal(signal.SIGTERM)
        in_flight.join(60)
        assert answers and isinstance(answers[0][0], str)
        assert server.process.wait(30) == 0
        with pytest.raises(ServerUnavailableError):
            env.step("look")
    finally:
        server.stop()


# --- without the door, and deadlines ------------------------------------------------------------------------


def test_auto_takes_the_http_routes_of_a_server_without_the_door():
    """The app served by plain waitress (as gunicorn would serve it: no stream channels): its /stream route
    answers 501, ``auto`` plays over HTTP, ``stream`` says why it cannot."""
    from progpo_envs.server.app import ServerConfig, create_app
    from webshop_server.serving import make_server

    app = create_app(ServerConfig(env_ids=(TOY_ENV_ID,)))
    plain = make_server(app, port=0, threads=4, ident="plain")
    thread = threading.Thread(target=plain.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{plain.effective_port}"
    try:
        env = RemoteEnv(url, TOY_ENV_ID)
        env.reset(seed=0)
        env.step("look")
        assert not env._client.uses_stream() and "501" in env._client.connections.no_door
        env.close()
        with pytest.raises(RemoteEnvError, match="no stream door"):
            RemoteEnv(url, TOY_ENV_ID, transport="stream")
    finally:
        plain.close()
        app.extensions["progpo_pool"].shutdown()


def _trickle(conn: socket.socket) -> None:
    """Answers a byte every 0.2 s, for ever."""
    answer = encode_frame(OP_TEXT, b'{"status": 201, "body": {"instance_id": "i"}}' * 50, mask=False)
    for byte in answer:
        conn.sendall(bytes([byte]))
        time.sleep(0.2)


def test_the_deadline_holds_against_a_trickling_stream():
    server = MisbehavingWebSocketServer(_trickle)
    started = time.monotonic()
    try:
        with pytest.raises(ServerUnavailableError, match=r"timeout=1\.5 s|may or may not"):
            RemoteEnv(server.url, TOY_ENV_ID, timeout=1.5, backoff=0.01, transport="stream")
        assert time.monotonic() - started < 4.0
    finally:
        server.close()


def test_a_client_pool_drops_connections_that_went_stale(toy_url):
    pool = ClientPool(ws_url(toy_url))
    first = pool.connect(time.monotonic() + 10)
    pool.give_back(first)
    first.sock.shutdown(socket.SHUT_RDWR)  # as if the server had closed it while idle
    second = pool.connect(time.monotonic() + 10)
    assert second is not first
    assert json.loads(pool.exchange(b'{"op": "dance"}', time.monotonic() + 10))["status"] == 404
    second.close()
    pool.close()
