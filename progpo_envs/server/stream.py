"""The native protocol's stream door: the env server's calls as WebSocket messages on one connection.

``GET /stream`` with ``Upgrade: websocket`` on the env server's port turns the connection into a WebSocket
(RFC 6455, :mod:`progpo_envs.server.websocket`). Each message a client sends is one call of the native API,
a JSON object ``{"op": ..., "instance_id": ..., "body": {...}}`` (``op`` one of
:data:`~progpo_envs.server.native.OPS`; ``instance_id`` for the instance ops; ``body`` what the HTTP route
takes), and each gets one message back, ``{"status": <the route's HTTP status>, "body": <the route's
answer>}``, in order. A reset or step answers with the bytes the env worker wrote, framed and sent: no HTTP
request line and headers to parse, no Flask, no second encoding.

The door is waitress's channel itself (:class:`StreamChannel`, the server's channel class), so a stream
connection is held to everything an HTTP connection is: the connection limit and the per-host share of
connections (:class:`~webshop_server.serving.FairShareChannel`, counted as it is accepted), the idle timeout
(a connection with no call in flight and no whole frame for ``channel_timeout`` seconds is closed, whatever
its parser holds: a trickled frame that never ends is not activity; the client opens a new one), the drain on
SIGTERM (a call in flight counts as a request in flight; then each connection gets a 1001 close). Frames are
read on waitress's event loop, so a slow or idle client costs a connection, never a thread; a whole message
becomes a task for waitress's threads, as a whole HTTP request does. Per call (never per connection), the
limits of the HTTP routes: a message of at most :data:`~progpo_envs.server.request_args.MAX_REQUEST_BYTES` (a
longer one is answered 413 from its frame's header, its payload dropped unread as it arrives, as HTTP answers
a body too large; an unfinished one past waitress's ``inbuf_overflow`` waits in a temporary file, as a body
does), at most :data:`~progpo_envs.server.request_args.MAX_JSON_VALUES` JSON values, the decode budget of its
size, the pool's instance limits and per-client share (the client is identified once, at the upgrade: its
host, or its ``Authorization: Bearer`` client token; an unknown token is refused with the HTTP 401 of any
route). A mistake in a message is answered with its 4xx status and the connection stays; a protocol error (an
unmasked frame, reserved bits, a bad opcode, bytes sent behind the upgrade request before its 101) closes it
with 1002, a fragmented message past the limit with 1009. A client may send a few messages before reading the
answers (:data:`MAX_QUEUED_MESSAGES`); past that the channel stops reading until the answers are out.

Example (the client side is ``progpo/Remote-v0``'s, :mod:`progpo_envs.server.remote`)::

    >>> from progpo_envs.server.websocket import WebSocketClient
    >>> ws = WebSocketClient(url.replace("http", "ws") + "/stream", time.monotonic() + 5)  # doctest: +SKIP
    >>> ws.send(b'{"op": "step", "instance_id": "...", "body": {"action": "look"}}', ...)  # doctest: +SKIP
    >>> json.loads(ws.receive(time.monotonic() + 5))["status"]  # doctest: +SKIP
    200
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from waitress.channel import ClientDisconnected

from progpo_base.http import json_object
from progpo_envs.server.native import error_status, json_bytes, run_op
from progpo_envs.server.pool import ServerError
from progpo_envs.server.request_args import MAX_JSON_VALUES, MAX_REQUEST_BYTES, request_budget
from progpo_envs.server.websocket import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    CLOSE_PROTOCOL_ERROR,
    MESSAGE_TOO_BIG,
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    STREAM_PATH,
    FrameParser,
    ProtocolError,
    accept_key,
    close_payload,
    encode_frame,
    handshake_problem,
)
from webshop_server.clients import UnknownClientToken, identify_client
from webshop_server.serving import FairShareChannel

#: Messages of one connection waiting or running at once; past it the channel reads no more until some are
#: answered (a client sends one at a time; a few in a row are fine).
MAX_QUEUED_MESSAGES = 4

_LOG = logging.getLogger("progpo_envs.server")


class _Message:
    """A whole message waiting for its task (in the channel's ``requests``, where waitress counts work in
    flight: the idle timeout and the drain see it)."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes | None):
        self.payload = payload  # None: a message over the size limit (not kept)

    def close(self) -> None:  # waitress closes the requests it drops
        pass


def _is_upgrade(request: Any) -> bool:
    """Whether a parsed HTTP request is a valid upgrade to the stream door (``//stream`` is ``/stream``, as
    the app's routes take it)."""
    if request.error or request.command != "GET" or re.sub("/+", "/", request.path) != STREAM_PATH:
        return False
    headers = request.headers
    return handshake_problem(lambda name: headers.get(name.upper().replace("-", "_"))) is None


class StreamChannel(FairShareChannel):
    """Waitress's HTTP channel that also serves the stream door (see the module docstring).

    Args:
        native: The app's :class:`~progpo_envs.server.app.NativeServer` (calls, counters, client tokens).
        server, sock, addr, adj, map: Waitress's channel arguments.
    """

    def __init__(self, native, server, sock, addr, adj, map=None):  # noqa: A002 - waitress's signature
        self.native = native
        self.parser: FrameParser | None = None  # set once upgraded
        self.client: str | None = None
        self.leaving = False  # the server is stopping: a 1001 close once the calls in flight are answered
        super().__init__(server, sock, addr, adj, map)

    # --- the event loop's side ---
    def readable(self) -> bool:
        if self.parser is None:
            return super().readable()
        return not (
            self.will_close
            or self.close_when_flushed
            or self.leaving
            or len(self.requests) >= MAX_QUEUED_MESSAGES
            or self.total_outbufs_len
        )

    def handle_read(self) -> None:
        if self.parser is None:
            super().handle_read()
            return
        # waitress counts every byte as activity; on the stream door activity is a whole frame, so a peer that
        # trickles an unfinished frame is idle, and the idle deadline closes it whatever the parser holds
        try:
            data = self.recv(self.adj.recv_bytes)
        except OSError:
            self.handle_close()
            return
        if data:
            self.received(data)
        else:
            self.connected = False

    def received(self, data: bytes) -> bool:
        if self.parser is None:
            return super().received(data)
        with self.requests_lock:
            if self.will_close or self.close_when_flushed:
                return False
            try:
                frames = self.parser.feed(data)
            except ProtocolError as exc:
                self.native.stats.count(f"stream_closed_{exc.code}")
                self._end(exc.code, exc.reason)
                return False
            if frames:
                self.last_activity = time.time()
            for opcode, payload in frames:
                if opcode in (OP_TEXT, OP_BINARY, MESSAGE_TOO_BIG):
                    self.requests.append(_Message(payload if opcode != MESSAGE_TOO_BIG else None))
                    if len(self.requests) == 1:  # else the running task queues the next one
                        self.server.add_task(self)
                elif opcode == OP_PING:
                    self._queue(encode_frame(OP_PONG, payload, mask=False))
                elif opcode == OP_CLOSE:
                    self._end(CLOSE_NORMAL, "")
                    return False
                # a pong answers nothing
        return True

    def handle_write(self) -> None:
        if self.parser is None:
            super().handle_write()
            return
        # a task thread may be writing an answer at any time (unlike HTTP, where no task runs once the
        # requests are done): flush only with the outbuf lock, as waitress does while a task runs
        self._flush_exception(self._flush_some_if_lockable)
        if self.close_when_flushed and not self.total_outbufs_len:
            self.close_when_flushed = False
            self.will_close = True
        if self.will_close:
            self.handle_close()

    def _queue(self, data: bytes) -> None:
        """Put ``data`` out from the event loop (it flushes it when the socket is writable)."""
        with self.outbuf_lock:
            self.outbufs[-1].append(data)
            self.current_outbuf_count += len(data)
            self.total_outbufs_len += len(data)

    def _end(self, code: int, reason: str) -> None:
        """Send a close frame, drop what is queued, close once it is out (``requests_lock`` held)."""
        self._queue(encode_frame(OP_CLOSE, close_payload(code, reason), mask=False))
        for request in self.requests:
            request.close()
        self.requests = []
        self.close_when_flushed = True

    def going_away(self) -> None:
        """The server is stopping (its drain, on the event loop): read no more calls, and close with 1001 once
        the calls in flight are answered (at once when none is)."""
        if self.parser is None:
            return
        with self.requests_lock:
            self.leaving = True
            if not self.requests and not self.close_when_flushed:
                self._end(CLOSE_GOING_AWAY, "the server is stopping")

    def handle_close(self) -> None:
        if self.parser is not None:
            self.parser.close()  # an unfinished message's temporary file with it
        super().handle_close()

    # --- the task threads' side ---
    def service(self) -> None:
        if self.parser is None:
            request = self.requests[0]
            if _is_upgrade(request) and self._upgrade(request):
                return
            super().service()
            return
        message = self.requests[0]
        answer = self._answer(message.payload)
        try:
            self.write_soon(encode_frame(OP_TEXT, answer, mask=False))  # sent here unless the socket is full
        except ClientDisconnected:
            pass
        with self.requests_lock:
            was_full = len(self.requests) >= MAX_QUEUED_MESSAGES
            if self.requests and self.requests[0] is message:
                self.requests.pop(0)
            more = self.connected and bool(self.requests)
            if more:
                self.server.add_task(self)
            elif self.leaving and not self.close_when_flushed:
                self._end(CLOSE_GOING_AWAY, "the server is stopping")
        self.last_activity = time.time()
        # wake the event loop only when it must change what it waits for: reading again after a full queue,
        # or writing what the socket did not take
        if self.connected and (was_full or self.total_outbufs_len or self.close_when_flushed):
            self.server.pull_trigger()

    def _upgrade(self, request: Any) -> bool:
        """Switch to WebSocket (101); ``False`` leaves the request to the app (an unknown client token:
        401)."""
        headers = request.headers
        try:
            self.client = identify_client(
                self.native.client_tokens, headers.get("AUTHORIZATION"), self.addr[0] if self.addr else None
            )
        except UnknownClientToken:
            return False
        response = (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept_key(headers['SEC_WEBSOCKET_KEY'])}\r\n\r\n"
        ).encode("ascii")
        self.native.stats.count("stream_connections")
        with self.requests_lock:
            # bytes after the upgrade request, sent before its answer (a client must wait for the 101): a
            # request still being parsed, or whole ones queued behind it (an HTTP request pipelined in the
            # same packet); they are refused with 1002, never served as messages
            early = self.request is not None or any(r is not request for r in self.requests)
            if self.request is not None:
                self.request.close()
            self.request = None
            # before the 101: what follows it is frames (the upgrade request stays in ``requests`` until the
            # 101 is out, so the event loop flushes only with the outbuf lock meanwhile); an unfinished
            # message past waitress's in-memory bound for a request body goes to a file, as a body does
            self.parser = FrameParser(MAX_REQUEST_BYTES, masked=True, spill_bytes=self.adj.inbuf_overflow)
        try:
            self.write_soon(response)
        except ClientDisconnected:
            pass
        with self.requests_lock:
            request.close()
            if self.requests and self.requests[0] is request:
                self.requests.pop(0)
            if early:
                self._end(CLOSE_PROTOCOL_ERROR, "data sent before the handshake's answer")
            elif self.connected and self.requests:  # messages read since the 101 went out
                self.server.add_task(self)
        self.last_activity = time.time()
        self.server.pull_trigger()  # the event loop reads this connection again, as frames
        return True

    def _answer(self, payload: bytes | None) -> bytes:
        """The answer message to one call (never raises: a mistake is its status and error)."""
        stats = self.native.stats
        stats.count("requests")  # a call is a request, whichever door it came through
        stats.count("stream_messages")
        try:
            if payload is None:
                raise ServerError(413, f"a message is at most {MAX_REQUEST_BYTES} bytes")
            call = json_object(payload, MAX_JSON_VALUES)
            body = call.get("body")
            body = {} if body is None else body
            if not isinstance(body, dict):
                raise ServerError(400, "a stream message's body must be a JSON object")
            status, data = run_op(
                self.native.api,
                call.get("op"),
                call.get("instance_id"),
                body,
                self.client,
                request_budget(len(payload)),
            )
            return b'{"status":%d,"body":%s}' % (status, data)
        except Exception as exc:  # noqa: BLE001 - every failure is an answer; the connection stays
            known = error_status(exc)
            if known is None:  # a bug in the server itself: answer, log, keep serving
                _LOG.exception("unexpected error in a stream call")
                known = (500, f"internal error: {type(exc).__name__}")
            status, error = known
            stats.count(f"errors_{status}")
            return json_bytes({"status": status, "body": {"error": error}})


def stream_channel_class(native):
    """The channel class of a waitress server whose app's doors share ``native``
    (:class:`~progpo_envs.server.app.NativeServer`)."""

    def make(server, sock, addr, adj, map=None):  # noqa: A002 - waitress's signature
        return StreamChannel(native, server, sock, addr, adj, map)

    return make
