"""Network helpers shared by the tests of the servers (the env server's and the WebShop site's)."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from tests.paths import repo_on_pythonpath


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


class ServerCli:
    """A server command of the project (``python -m <module> *args --port <a free port>``) in a subprocess,
    as the containers and CI run it; in a process group of its own (its id is the server's pid), as a service
    manager starts it. The repository root is on its ``PYTHONPATH``, so ``--import tests.<package>.<module>``
    finds a test module.

    Its environment is this process's (``tests/conftest.py`` sets one OpenMP thread). ``ready_path`` is the
    route polled until it answers 200; ``open_files``, when given, is the server's limit on open files (soft
    and hard, as ``ulimit -n`` sets both for a service)."""

    def __init__(
        self,
        module: str,
        *args: str,
        ready_path: str,
        ready_timeout: float = 120.0,
        open_files: int | None = None,
    ):
        import resource

        import requests

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty server never blocks on it
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *args, "--port", str(self.port)],
            env=repo_on_pythonpath(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=None
            if open_files is None
            else lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files)),
        )
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.output()}")
            try:
                if requests.get(f"{self.url}{ready_path}", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not become ready: {self.output()}")

    def output(self) -> str:
        """What the server printed so far."""
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        """SIGTERM (the server drains), then SIGKILL if it has not exited within 15 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except Exception:  # noqa: BLE001
                self.process.kill()
                self.process.wait(5)
