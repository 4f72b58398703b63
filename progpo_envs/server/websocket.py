"""WebSocket (RFC 6455) for the native protocol's stream door: the frames, and a blocking client connection.

The env server's stream door (:mod:`progpo_envs.server.stream`) and ``progpo/Remote-v0``
(:mod:`progpo_envs.server.remote`) speak it: one persistent connection, one frame per message (a JSON request
one way, its JSON answer the other), instead of an HTTP request with its headers for every step. This module
holds what both ends share and nothing that needs a server: no waitress, no Flask.

* :data:`STREAM_PATH` — where the env server's stream door is; :func:`handshake_problem` — what is wrong with
  an upgrade request (the status and message it is refused with), :func:`accept_key` — the handshake's
  ``Sec-WebSocket-Accept`` for a ``Sec-WebSocket-Key``;
* :func:`encode_frame` — one final frame (masked, as a client sends, or not, as a server does);
* :class:`FrameParser` — bytes in, whole messages and control frames out, bounded per message (never per
  connection: a connection carries any number of messages for as long as it lives): a frame longer than
  ``max_message`` bytes is never buffered (its payload is skipped as it arrives and the parser reports it,
  :data:`MESSAGE_TOO_BIG`, so the server answers it as HTTP answers a body too large); a frame declaring far
  more, a fragmented message that grows past it, an unmasked frame where masking is required, reserved bits,
  an unknown opcode, a 64-bit length with its top bit set or a fragmented or long control frame is a
  :class:`ProtocolError` with its close code (1009, 1002); an unfinished message past ``spill_bytes`` waits in
  a temporary file, not in memory;
* :class:`WebSocketClient` — a client connection (``ws://`` or ``wss://``) whose every call finishes or fails
  by a wall-clock deadline: each read waits at most the time left, so a server that trickles a byte at a time
  cannot hold it (:class:`DeadlineExceeded`). A server that answers the handshake with an HTTP status other
  than 101 raises :class:`HandshakeRefused` with that status (a server without the door, a proxy); a TLS
  handshake that fails, or gets no answer within the connect timeout, :class:`TLSFailed`.

Only what the door needs of RFC 6455 is here: no extensions (no compression), no subprotocols. Fragmented
messages are accepted and reassembled; this side always sends each message as one frame.

Example:
    >>> accept_key("dGhlIHNhbXBsZSBub25jZQ==")  # RFC 6455, section 1.3
    's3pPLMBiTxaQ9kYGzzhZRbK+xOo='
    >>> parser = FrameParser(max_message=1 << 20, masked=True)
    >>> parser.feed(encode_frame(OP_TEXT, b'{"op": "step"}', mask=True))
    [(1, b'{"op": "step"}')]
    >>> parser.feed(encode_frame(OP_TEXT, b"x", mask=False))  # a client's frame must be masked
    Traceback (most recent call last):
    ...
    progpo_envs.server.websocket.ProtocolError: [1002] a client's frames must be masked
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import os
import select
import socket
import ssl
import struct
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

#: The path of the env server's stream door (``GET`` with ``Upgrade: websocket``).
STREAM_PATH = "/stream"

#: The GUID of RFC 6455's handshake.
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONTINUATION, OP_TEXT, OP_BINARY = 0x0, 0x1, 0x2
OP_CLOSE, OP_PING, OP_PONG = 0x8, 0x9, 0xA
#: What :meth:`FrameParser.feed` reports for a frame longer than its limit (not an opcode of the wire).
MESSAGE_TOO_BIG = -1
_DATA_OPCODES = frozenset({OP_CONTINUATION, OP_TEXT, OP_BINARY})
_CONTROL_OPCODES = frozenset({OP_CLOSE, OP_PING, OP_PONG})
#: Close codes (RFC 6455, section 7.4.1).
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_PROTOCOL_ERROR, CLOSE_TOO_BIG = 1000, 1001, 1002, 1009
#: Most bytes of a handshake's answer (status line and headers) a client reads.
MAX_HANDSHAKE_BYTES = 64 << 10


def handshake_problem(header: Callable[[str], str | None]) -> tuple[int, str] | None:
    """Why an upgrade request cannot be accepted, as the HTTP status and message it is answered with, or
    ``None`` when it is a valid WebSocket upgrade (``header(name)``: the request's header, or ``None``)."""
    upgrade = (header("Upgrade") or "").lower()
    connection = {token.strip().lower() for token in (header("Connection") or "").split(",")}
    if "websocket" not in upgrade or "upgrade" not in connection:
        return 426, (
            f"GET {STREAM_PATH} is the stream door: open it as a WebSocket "
            "(Upgrade: websocket, Connection: Upgrade)"
        )
    if (header("Sec-WebSocket-Version") or "").strip() != "13":
        return 426, "the stream door speaks WebSocket version 13 (Sec-WebSocket-Version: 13)"
    try:
        key_ok = len(base64.b64decode(header("Sec-WebSocket-Key") or "", validate=True)) == 16
    except ValueError:
        key_ok = False
    if not key_ok:
        return 400, "Sec-WebSocket-Key must be 16 bytes in base64"
    return None


def accept_key(key: str) -> str:
    """The ``Sec-WebSocket-Accept`` value that answers ``Sec-WebSocket-Key: key``."""
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + _GUID).digest()).decode("ascii")


def apply_mask(payload: bytes, mask: bytes) -> bytes:
    """``payload`` XOR the repeated 4-byte ``mask`` (masking and unmasking are the same), at C speed."""
    n = len(payload)
    if not n:
        return b""
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def encode_frame(opcode: int, payload: bytes, *, mask: bool) -> bytes:
    """One final frame of ``payload`` (clients mask their frames, servers do not)."""
    n = len(payload)
    first = 0x80 | opcode
    mask_bit = 0x80 if mask else 0
    if n < 126:
        head = struct.pack("!BB", first, mask_bit | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", first, mask_bit | 126, n)
    else:
        head = struct.pack("!BBQ", first, mask_bit | 127, n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + apply_mask(payload, key)


def close_payload(code: int, reason: str = "") -> bytes:
    """A close frame's payload: the code and a reason of at most 123 bytes."""
    return struct.pack("!H", code) + reason.encode("utf-8")[:123]


class ProtocolError(Exception):
    """The peer broke the protocol; the connection ends with ``code`` (1002, or 1009 for a message too big).

    Attributes:
        code: The close code to send.
        reason: Why, in a few words.
    """

    def __init__(self, code: int, reason: str):
        super().__init__(f"[{code}] {reason}")
        self.code = code
        self.reason = reason


class FrameParser:
    """One direction's frames, parsed as bytes arrive (see the module docstring).

    Every bound is per message, never per connection: a connection carries any number of messages of at most
    ``max_message`` bytes each, for as long as it lives.

    Args:
        max_message: Most bytes of one message (its fragments together). A single frame over it is dropped
            as it arrives and reported (:data:`MESSAGE_TOO_BIG`); a fragmented message that grows past it is
            :class:`ProtocolError` 1009, as soon as a frame's header says so.
        masked: Whether the frames must be masked (a server reads masked frames, a client unmasked ones).
        spill_bytes: Most bytes of an unfinished message kept in memory (``None``: no bound below
            ``max_message``, as a client reading its own server's answers wants). A frame declared longer,
            and a fragmented message once longer, go to a temporary file as they arrive, as waitress spills a
            request body past its ``inbuf_overflow``: a peer that sends all of a large frame but its last byte
            holds a descriptor and disk, not memory.
        max_skip: Most bytes of an over-long frame dropped so that the connection can go on (default: 8
            times ``max_message``); a frame declared longer is :class:`ProtocolError` 1009 at once, since
            waiting for it to pass would leave the connection silent for as long as the peer keeps sending.
    """

    def __init__(
        self, max_message: int, masked: bool, *, spill_bytes: int | None = None, max_skip: int | None = None
    ):
        self.max_message = int(max_message)
        self.masked = masked
        self.spill_bytes = self.max_message if spill_bytes is None else int(spill_bytes)
        self.max_skip = 8 * self.max_message if max_skip is None else int(max_skip)
        self._buffer = bytearray()
        self._long_frame: _SpooledFrame | None = None  # a frame longer than spill_bytes, being received
        self._fragments: _Spool | None = None  # the fragments so far of a fragmented message
        self._fragment_opcode: int | None = None
        self._skipping = 0  # payload bytes of a frame too long, still to drop

    @property
    def buffered(self) -> int:
        """Bytes received and not yet part of a whole message (in memory or spilled)."""
        pending = len(self._buffer) + self._skipping
        if self._long_frame is not None:
            pending += self._long_frame.received
        if self._fragments is not None:
            pending += self._fragments.size
        return pending

    @property
    def buffered_in_memory(self) -> int:
        """The part of :attr:`buffered` held in this process's memory (the rest is on disk or skipped)."""
        in_memory = len(self._buffer)
        if self._long_frame is not None:
            in_memory += self._long_frame.spool.in_memory
        if self._fragments is not None:
            in_memory += self._fragments.in_memory
        return in_memory

    def close(self) -> None:
        """Drop what is buffered (its temporary files with it)."""
        self._buffer.clear()
        if self._long_frame is not None:
            self._long_frame.spool.close()
            self._long_frame = None
        if self._fragments is not None:
            self._fragments.close()
            self._fragments = None
        self._fragment_opcode, self._skipping = None, 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Take ``data``; return the messages it completed, as ``(opcode, payload)``: ``OP_TEXT`` or
        ``OP_BINARY`` for a whole message (fragments joined), ``OP_PING``/``OP_PONG``/``OP_CLOSE`` for each
        control frame, ``(MESSAGE_TOO_BIG, b"")`` for a frame over the limit (its payload dropped)."""
        self._buffer += data
        out: list[tuple[int, bytes]] = []
        while True:
            if self._skipping:
                dropped = min(self._skipping, len(self._buffer))
                del self._buffer[:dropped]
                self._skipping -= dropped
                if self._skipping:
                    return out
            if self._long_frame is not None:
                frame = self._long_frame.take(self._buffer)
                if frame is None:
                    return out
                self._long_frame = None
            else:
                frame = self._next_frame()
                if frame is None:
                    return out
            fin, opcode, payload = frame
            if opcode in _CONTROL_OPCODES or opcode == MESSAGE_TOO_BIG:
                out.append((opcode, payload))
                continue
            if opcode == OP_CONTINUATION:
                if self._fragment_opcode is None:
                    raise ProtocolError(CLOSE_PROTOCOL_ERROR, "a continuation frame without a message")
            elif self._fragment_opcode is not None:
                raise ProtocolError(CLOSE_PROTOCOL_ERROR, "a new message inside a fragmented one")
            elif fin:  # the common case: a whole message in one frame
                out.append((opcode, payload))
                continue
            else:
                self._fragment_opcode = opcode
                self._fragments = _Spool(self.spill_bytes)
            self._fragments.write(payload)
            if fin:
                out.append((self._fragment_opcode, self._fragments.read_all()))
                self._fragments, self._fragment_opcode = None, None

    def _next_frame(self) -> tuple[bool, int, bytes] | None:
        buffer = self._buffer
        if len(buffer) < 2:
            return None
        first, second = buffer[0], buffer[1]
        fin, opcode = bool(first & 0x80), first & 0x0F
        if first & 0x70:
            raise ProtocolError(CLOSE_PROTOCOL_ERROR, "reserved bits set (no extension was agreed)")
        if opcode not in _DATA_OPCODES and opcode not in _CONTROL_OPCODES:
            raise ProtocolError(CLOSE_PROTOCOL_ERROR, f"unknown opcode {opcode:#x}")
        masked = bool(second & 0x80)
        if masked != self.masked:
            rule = "a client's frames must be masked" if self.masked else "a server's must not be masked"
            raise ProtocolError(CLOSE_PROTOCOL_ERROR, rule)
        length, offset = second & 0x7F, 2
        if length == 126:
            if len(buffer) < 4:
                return None
            (length,), offset = struct.unpack_from("!H", buffer, 2), 4
        elif length == 127:
            if len(buffer) < 10:
                return None
            (length,), offset = struct.unpack_from("!Q", buffer, 2), 10
            if length >> 63:
                raise ProtocolError(CLOSE_PROTOCOL_ERROR, "a 64-bit length's most significant bit must be 0")
        if opcode in _CONTROL_OPCODES and (not fin or length > 125):
            raise ProtocolError(CLOSE_PROTOCOL_ERROR, "a control frame must be final and at most 125 bytes")
        key_bytes = 4 if masked else 0
        if opcode in _DATA_OPCODES:
            so_far = self._fragments.size if self._fragments is not None else 0  # of a fragmented message
            if so_far + length > self.max_message:
                if not fin or self._fragment_opcode is not None or length > self.max_skip:
                    raise ProtocolError(CLOSE_TOO_BIG, f"a message of more than {self.max_message} bytes")
                del buffer[:offset]  # the header; its mask key and payload are dropped as they come
                self._skipping = key_bytes + length
                return True, MESSAGE_TOO_BIG, b""
            if length > self.spill_bytes and len(buffer) < offset + key_bytes + length:
                if len(buffer) < offset + key_bytes:  # the mask key first: the header waits in the buffer
                    return None
                key = bytes(buffer[offset : offset + key_bytes])
                del buffer[: offset + key_bytes]
                self._long_frame = _SpooledFrame(fin, opcode, key, length, self.spill_bytes)
                return self._long_frame.take(buffer)  # None: the rest is still to come
        end = offset + key_bytes + length
        if len(buffer) < end:
            return None
        if masked:
            key = bytes(buffer[offset : offset + 4])
            payload = apply_mask(bytes(buffer[offset + 4 : end]), key)
        else:
            payload = bytes(buffer[offset:end])
        del buffer[:end]
        return fin, opcode, payload


class _Spool:
    """Bytes written in order and read back once: in memory up to ``spill_bytes``, then in a temporary file
    (removed when closed or read)."""

    def __init__(self, spill_bytes: int):
        self.file = tempfile.SpooledTemporaryFile(max_size=spill_bytes)
        self.spill_bytes = spill_bytes
        self.size = 0

    @property
    def in_memory(self) -> int:
        """Bytes held in memory (0 once past ``spill_bytes``: the file rolled over to disk)."""
        return self.size if self.size <= self.spill_bytes else 0

    def write(self, data: bytes | bytearray) -> None:
        self.file.write(data)
        self.size += len(data)

    def read_all(self) -> bytes:
        """Everything written; the spool is closed."""
        self.file.seek(0)
        data = self.file.read()
        self.close()
        return data

    def close(self) -> None:
        self.file.close()


class _SpooledFrame:
    """A frame longer than ``spill_bytes``: its payload goes to a :class:`_Spool` as it arrives and is
    unmasked once whole."""

    def __init__(self, fin: bool, opcode: int, key: bytes | None, length: int, spill_bytes: int):
        self.fin, self.opcode, self.key, self.length = fin, opcode, key, length
        self.spool = _Spool(spill_bytes)

    @property
    def received(self) -> int:
        return self.spool.size

    def take(self, buffer: bytearray) -> tuple[bool, int, bytes] | None:
        """Move the payload's next bytes out of ``buffer``; the whole frame once its last byte is in."""
        taken = min(self.length - self.spool.size, len(buffer))
        self.spool.write(buffer[:taken])
        del buffer[:taken]
        if self.spool.size < self.length:
            return None
        payload = self.spool.read_all()
        return self.fin, self.opcode, apply_mask(payload, self.key) if self.key else payload


class ConnectionClosed(ConnectionError):
    """The peer closed the connection: a close frame (``code``: its close code) or the end of the stream
    (``code`` ``None``)."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class DeadlineExceeded(TimeoutError):
    """A call had not finished when its deadline passed."""


class HandshakeRefused(ConnectionError):
    """The server answered the upgrade with an HTTP status other than 101.

    Attributes:
        status: That status.
        message: Its body's ``error`` (or the start of its body).
    """

    def __init__(self, status: int, message: str):
        super().__init__(f"the server answered the WebSocket upgrade with HTTP {status}: {message}")
        self.status = status
        self.message = message


class TLSFailed(ConnectionError):
    """A ``wss://`` connection's TLS handshake failed or went unanswered: a server that does not speak TLS
    there (an ``http://`` server named ``https://``), or a certificate this machine does not trust. Trying
    again does not help."""


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("the deadline passed")
    return left


class WebSocketClient:
    """A blocking WebSocket client connection; every call takes the ``time.monotonic()`` it must end by.

    Args:
        url: ``ws://host:port/path`` or ``wss://...`` (``http``/``https`` are taken as ``ws``/``wss``).
        deadline: When the connection and handshake must be done.
        connect_timeout: Seconds the TCP connection may take (at most until ``deadline``).
        headers: Extra handshake headers (``Authorization``, ...).
        max_message: Most bytes of one message from the server.

    Raises:
        OSError: The connection failed (``ConnectionRefusedError``: nothing reached the server).
        HandshakeRefused: The server answered with another HTTP status.
        TLSFailed: ``wss://`` and the TLS handshake failed or went unanswered.
        DeadlineExceeded: The handshake had not finished by ``deadline``.
    """

    def __init__(
        self,
        url: str,
        deadline: float,
        *,
        connect_timeout: float = 5.0,
        headers: Mapping[str, str] | None = None,
        max_message: int = 64 << 20,
    ):
        parts = urlsplit(url)
        secure = parts.scheme in ("wss", "https")
        host, port = parts.hostname or "127.0.0.1", parts.port or (443 if secure else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.pid = os.getpid()
        self.bytes_sent = self.bytes_received = 0  # over the connection's life, handshake included
        self._parser = FrameParser(max_message, masked=False)
        self._messages: list[tuple[int, bytes]] = []
        sock = socket.create_connection((host, port), timeout=min(connect_timeout, _left(deadline)))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if secure:  # the TLS handshake is part of connecting: it has the connect timeout
                sock = self._tls(sock, host, port, min(connect_timeout, _left(deadline)))
            self.sock = sock
            self._handshake(host, port, path, headers or {}, deadline)
        except BaseException:
            sock.close()
            raise

    @staticmethod
    def _tls(sock: socket.socket, host: str, port: int, seconds: float) -> ssl.SSLSocket:
        """``sock`` over TLS, or :class:`TLSFailed` (an error, or no answer within ``seconds``)."""
        sock.settimeout(seconds)
        try:
            return ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        except TimeoutError:
            raise TLSFailed(f"{host}:{port} did not answer the TLS handshake within {seconds:g} s") from None
        except ssl.SSLError as exc:
            raise TLSFailed(f"the TLS handshake with {host}:{port} failed ({exc})") from exc

    def _handshake(
        self, host: str, port: int, path: str, headers: Mapping[str, str], deadline: float
    ) -> None:
        key = base64.b64encode(os.urandom(16)).decode("ascii")
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        self._send_all(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), deadline)
        head = bytearray()
        while b"\r\n\r\n" not in head:
            if len(head) > MAX_HANDSHAKE_BYTES:
                raise ProtocolError(CLOSE_PROTOCOL_ERROR, "the handshake's answer is too long")
            head += self._recv(deadline)
        head, _, rest = bytes(head).partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        try:
            status = int(status_line.split()[1])
        except (IndexError, ValueError):
            raise ProtocolError(CLOSE_PROTOCOL_ERROR, f"not an HTTP answer: {status_line[:80]!r}") from None
        answer = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            answer[name.strip().lower()] = value.strip()
        if status != 101:
            raise HandshakeRefused(status, self._refusal(answer, rest, deadline))
        if answer.get("sec-websocket-accept") != accept_key(key) or answer.get("upgrade", "").lower() != (
            "websocket"
        ):
            raise ProtocolError(CLOSE_PROTOCOL_ERROR, "the server's handshake does not accept the key")
        if rest:
            self._messages += self._parser.feed(rest)

    def _refusal(self, headers: Mapping[str, str], rest: bytes, deadline: float) -> str:
        """The message of a refused handshake: its JSON body's ``error``, or the start of its body."""
        import json

        try:
            length = min(int(headers.get("content-length", "0")), MAX_HANDSHAKE_BYTES)
        except ValueError:
            length = 0
        body = bytearray(rest)
        try:
            while len(body) < length:
                body += self._recv(deadline)
        except (OSError, ConnectionClosed):
            pass  # the status is the answer; the body is only its explanation
        try:
            return str(json.loads(bytes(body[:length])).get("error", ""))
        except (ValueError, AttributeError):
            return bytes(body[:200]).decode("utf-8", "replace")

    # --- sending and receiving ---
    def _send_all(self, data: bytes, deadline: float) -> None:
        self.sock.settimeout(_left(deadline))
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise DeadlineExceeded("the deadline passed while sending") from None
        self.bytes_sent += len(data)

    def _recv(self, deadline: float) -> bytes:
        # each read waits at most the time left: a server that trickles bytes cannot reset it
        self.sock.settimeout(_left(deadline))
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            raise DeadlineExceeded("the deadline passed while waiting for the server") from None
        if not data:
            raise ConnectionClosed("the server closed the connection")
        self.bytes_received += len(data)
        return data

    def send(self, payload: bytes, deadline: float, opcode: int = OP_TEXT) -> None:
        """Send one message (one masked frame)."""
        self._send_all(encode_frame(opcode, payload, mask=True), deadline)

    def receive(self, deadline: float) -> bytes:
        """The next whole message's payload (a ping is answered on the way; a close frame is
        :class:`ConnectionClosed`)."""
        while True:
            while not self._messages:
                self._messages += self._parser.feed(self._recv(deadline))
            opcode, payload = self._messages.pop(0)
            if opcode in (OP_TEXT, OP_BINARY):
                return payload
            if opcode == MESSAGE_TOO_BIG:  # its payload is being dropped: no answer will come for this call
                raise ProtocolError(
                    CLOSE_TOO_BIG, f"the server sent a message of more than {self._parser.max_message} bytes"
                )
            if opcode == OP_PING:
                self._send_all(encode_frame(OP_PONG, payload, mask=True), deadline)
            elif opcode == OP_CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else CLOSE_NORMAL
                reason = payload[2:].decode("utf-8", "replace")
                raise ConnectionClosed(f"the server closed the connection ({code}: {reason})", code)

    def stale(self) -> bool:
        """Whether the connection can no longer carry a request: closed here, opened by another process
        (a fork), or the server closed it or sent something while idle (its idle timeout)."""
        if self.sock.fileno() < 0 or os.getpid() != self.pid or self._messages or self._parser.buffered:
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self, code: int = CLOSE_NORMAL) -> None:
        """Send a close frame (best effort, without waiting) and close the socket."""
        self._parser.close()
        if self.sock.fileno() < 0:
            return
        if os.getpid() == self.pid:
            try:
                self.sock.setblocking(False)
                self.sock.send(encode_frame(OP_CLOSE, close_payload(code), mask=True))
            except OSError:
                pass
        self.sock.close()


class ClientPool:
    """The connections of this process to one server, reused by every caller and at most
    ``max_connections`` of them: a call takes an idle one (or opens one, or waits for one while all are
    busy), sends its message, reads the answer and gives the connection back, so the connections open are
    as many as the calls in flight, never more than the bound, not as many as the callers (a vector env of
    1,024 remote envs stepped by one thread holds one; 400 envs stepped from 400 threads hold the bound). A
    connection that failed is closed, never given back; one that went stale while idle (the server's idle
    timeout closed it, or this process is a fork of its opener) is dropped when taken. A call takes the
    idle connection opened first: calls one at a time keep to one connection, and those a burst of calls
    opened (a group's copies made together) sit idle until the server's idle timeout closes them.

    The bound keeps a process within the share of connections a server gives one client host (a quarter of
    its connection limit: 256 of 1,024): past the share a server closes the host's oldest idle connection
    to make room, which is often the one this pool was about to use.

    Args:
        url: The WebSocket URL.
        headers: Handshake headers of every connection (``Authorization``).
        connect_timeout: Seconds a new connection may take.
        max_connections: Connections open at most (idle and in use); a call past it waits for one.
        opener: ``opener(deadline)`` opens a connection (default: a :class:`WebSocketClient` to ``url``);
            what it returns has ``pid``, ``stale()`` and ``close()`` (the HTTP routes' client lends its
            sessions through a pool of its own this way).
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        connect_timeout: float = 5.0,
        max_connections: int = 64,
        opener: Callable[[float], Any] | None = None,
    ):
        import threading

        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections!r}")
        self.url = url
        self.headers = dict(headers or {})
        self.connect_timeout = float(connect_timeout)
        self.max_connections = int(max_connections)
        #: The most bytes (both ways) one WebSocket connection carried, as of its last finished call.
        self.largest_connection_bytes = 0
        self._opener = opener or self._open_websocket
        self._idle: list[Any] = []  # in the order they were opened
        self._opened: dict[int, int] = {}  # id(connection) -> when it was opened (a count)
        self._opens = 0
        self._open = 0  # idle, in use, or being opened
        self._changed = threading.Condition()

    def _open_websocket(self, deadline: float) -> WebSocketClient:
        return WebSocketClient(self.url, deadline, connect_timeout=self.connect_timeout, headers=self.headers)

    @property
    def open_connections(self) -> int:
        """Connections open now (idle, in use, or being opened)."""
        with self._changed:
            return self._open

    def connect(self, deadline: float) -> Any:
        """An idle connection, or a new one within the bound, or the first one given back (raises as the
        opener does, or :class:`DeadlineExceeded` when none was free by ``deadline``)."""
        while True:
            with self._changed:
                while not self._idle and self._open >= self.max_connections:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise DeadlineExceeded(
                            f"all {self.max_connections} connections of this process to {self.url} stayed "
                            "busy until the deadline"
                        )
                    self._changed.wait(left)
                connection = self._idle.pop(0) if self._idle else None
                if connection is None:
                    self._open += 1
            if connection is None:
                try:
                    connection = self._opener(deadline)
                except BaseException:
                    self._closed()
                    raise
                with self._changed:
                    self._opens += 1
                    self._opened[id(connection)] = self._opens
                return connection
            if not connection.stale():
                return connection
            self.discard(connection)

    def give_back(self, connection: Any) -> None:
        """Keep ``connection`` for the next call (after a call that went right)."""
        with self._changed:
            if isinstance(connection, WebSocketClient):
                carried = connection.bytes_sent + connection.bytes_received
                self.largest_connection_bytes = max(self.largest_connection_bytes, carried)
            if connection.pid == os.getpid():
                bisect.insort(self._idle, connection, key=lambda c: self._opened.get(id(c), 0))
                self._changed.notify()
                return
        self.discard(connection)

    def discard(self, connection: Any) -> None:
        """Close ``connection`` (after a call that failed on it): its place goes to the next caller."""
        connection.close()
        with self._changed:
            self._opened.pop(id(connection), None)
        self._closed()

    def _closed(self) -> None:
        with self._changed:
            self._open -= 1
            self._changed.notify()

    def exchange(self, message: bytes, deadline: float) -> bytes:
        """Send ``message`` on a connection and return the answer.

        Raises:
            ExchangeFailed: The call failed once its message was being sent (the server may have acted);
                the connection is closed.
            OSError, HandshakeRefused, DeadlineExceeded: No connection could be had (the message was not
                sent: ``ConnectionRefusedError`` when nothing answered at all).
        """
        connection = self.connect(deadline)
        try:
            connection.send(message, deadline)
            answer = connection.receive(deadline)
        except OSError as exc:  # the server may have said why before it closed: its close frame
            failure: BaseException = exc
            if not isinstance(exc, ConnectionClosed):
                try:
                    connection.receive(min(deadline, time.monotonic() + 0.2))
                except ConnectionClosed as closed:
                    failure = closed
                except Exception:  # noqa: BLE001, S110 - nothing more to learn; the first failure stands
                    pass
            self.discard(connection)
            raise ExchangeFailed(failure) from exc
        except Exception as exc:
            self.discard(connection)
            raise ExchangeFailed(exc) from exc
        except BaseException:  # an interrupt: the connection's state is unknown
            self.discard(connection)
            raise
        self.give_back(connection)
        return answer

    def close(self) -> None:
        """Close the idle connections."""
        with self._changed:
            idle, self._idle = self._idle, []
        for connection in idle:
            self.discard(connection)


class ExchangeFailed(ConnectionError):
    """A call failed after its message was sent (or while sending it): the server may or may not have acted.

    Attributes:
        cause: What failed (:class:`ConnectionClosed` with its close code, :class:`DeadlineExceeded`, an
            ``OSError``).
    """

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
