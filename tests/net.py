"""Network helpers shared by the tests of the servers (the env server's and the WebShop site's)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def half_open(port: int, addresses: list[str], per_address: int, path: str) -> list[socket.socket]:
    """Idle connections to the loopback server on ``port``: ``per_address`` from each source address in
    ``addresses``, each sending a ``GET path`` whose headers never end. Those the server refuses or resets
    are left out; the caller closes the rest."""
    held = []
    for address in addresses:
        for _ in range(per_address):
            sock = socket.socket()
            sock.bind((address, 0))
            sock.settimeout(5)
            try:
                sock.connect(("127.0.0.1", port))
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode())  # headers never finished
            except OSError:
                sock.close()
                continue
            held.append(sock)
    return held


def session_from(address: str):
    """A ``requests`` session whose connections come from ``address`` (another loopback address is another
    client to the server: ``127.0.0.2``, ``127.0.0.3``, ... all reach a server on ``127.0.0.1``)."""
    import requests
    from requests.adapters import HTTPAdapter

    class SourceAddressAdapter(HTTPAdapter):
        def init_poolmanager(self, *args, **kwargs):
            kwargs["source_address"] = (address, 0)
            super().init_poolmanager(*args, **kwargs)

    session = requests.Session()
    session.mount("http://", SourceAddressAdapter())
    return session


def recv_until(sock: socket.socket, marker: bytes, size: int = 65536) -> bytes:
    """What ``sock`` receives until ``marker`` is in it or the peer closes (then what came), ``size`` bytes a
    read at most (1: nothing after the marker is read, e.g. the frames behind a 101's head)."""
    received = b""
    while marker not in received:
        chunk = sock.recv(size)
        if not chunk:
            break
        received += chunk
    return received


def accept_each(listener: socket.socket, handle: Callable[[socket.socket], None]) -> None:
    """Hands each connection ``listener`` accepts to ``handle``, on a thread of its own, until ``listener``
    is closed (the accepting runs on a daemon thread; this returns at once)."""

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
