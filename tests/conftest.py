"""Settings shared by every test: single-threaded math, no hub access, the real ALFWorld trials when given,
the tests' toy estimator registered."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Set before torch/transformers are imported anywhere: 2 shared cores make OpenMP barriers very slow.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# Generated games, catalogs and indexes go to a cache private to this test session (inherited by every server
# and worker subprocess), so tests never read what another version of the code left in the user's
# ~/.cache/progpo.
_OWN_CACHE = "PROGPO_CACHE" not in os.environ
if _OWN_CACHE:
    os.environ["PROGPO_CACHE"] = tempfile.mkdtemp(prefix="progpo-test-cache-")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# The toy estimator, defined in the tests only, is registered before any test module is collected: every test
# parametrised over ``training.advantages.ESTIMATORS``, in whichever folder and order, covers it.
import tests.training.advantages.advantages_toy  # noqa: E402,F401

# Property tests draw the same examples on every run and machine, so CI never fails by chance;
# `HYPOTHESIS_PROFILE=explore` draws fresh random examples when hunting for new failures.
settings.register_profile("deterministic", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

#: A folder holding real ALFWorld trials (`json_2.1.1/`), for the tests that compare against them; .ci/run
#: sets it where such a folder is at hand, and the tests that need it skip without it.
REAL_ALFWORLD_DATA_VAR = "PROGPO_TEST_ALFWORLD_DATA"
#: A verl-agent checkout, for the tests that read verl-agent's own sources; they skip without it.
VERL_AGENT_SOURCE_VAR = "PROGPO_TEST_VERL_AGENT_SRC"


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["PROGPO_CACHE"], ignore_errors=True)


def _folder_from_env(var: str, inside: str, what: str, where: str) -> Path:
    """The folder the environment variable ``var`` names; skips the test unless it holds the folder ``inside``
    (``what`` is missing: set ``var`` to ``where``)."""
    path = Path(os.environ.get(var, "/nonexistent"))
    if not (path / inside).is_dir():
        pytest.skip(f"no {what}: set {var} to {where}")
    return path


@pytest.fixture(scope="session")
def shared_alfworld_data() -> Path:
    """The folder that contains the real ALFWorld `json_2.1.1/` trials (skips if not given)."""
    return _folder_from_env(
        REAL_ALFWORLD_DATA_VAR, "json_2.1.1", "real ALFWorld trials", "a folder with json_2.1.1/"
    )


@pytest.fixture(scope="session")
def verl_agent_source() -> Path:
    """A verl-agent checkout (skips if not given)."""
    return _folder_from_env(VERL_AGENT_SOURCE_VAR, "agent_system", "verl-agent checkout", "one")


class TricklingServer:
    """A loopback HTTP server that answers slowly on purpose: the client side of a deadline test.

    A request whose path contains one of ``trickle_paths`` is answered a byte every ``interval`` seconds, for
    ever (its status line and headers too when ``what`` is ``"headers"``; else the headers at once, with a
    ``Content-Length`` the body never reaches), except the first ``after`` of them; any other request gets
    ``reply`` (JSON) at once. Every byte resets a per-read timeout, so only a wall-clock deadline ends such a
    request.
    """

    def __init__(
        self, trickle_paths=("",), what: str = "body", interval: float = 0.2, reply=None, after: int = 0
    ):
        import json
        import socket
        import threading

        self.trickle_paths, self.what, self.interval = tuple(trickle_paths), what, interval
        self.answered_left = after
        self._reply = json.dumps(reply if reply is not None else {}).encode()
        self._stop = threading.Event()
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._socket.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self.requests: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn) -> None:
        import time

        from tests.net import recv_until

        try:
            while not self._stop.is_set():
                head = recv_until(conn, b"\r\n\r\n")
                if b"\r\n\r\n" not in head:  # the client closed
                    return
                lines = head.split(b"\r\n")
                path = lines[0].split()[1].decode()
                self.requests.append(path)
                sizes = [int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length")]
                length = sizes[0] if sizes else 0
                body = head.split(b"\r\n\r\n", 1)[1]
                while len(body) < length:
                    body += conn.recv(65536)
                trickle = any(part in path for part in self.trickle_paths)
                if trickle and self.answered_left > 0:
                    self.answered_left -= 1
                    trickle = False
                if not trickle:
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                        + str(len(self._reply)).encode()
                        + b"\r\n\r\n"
                        + self._reply
                    )
                    continue
                headers = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                headers += b"Content-Length: 100000\r\n\r\n"
                if self.what == "body":
                    conn.sendall(headers)
                    headers = b""
                for byte in headers + b" " * 100000:
                    if self._stop.is_set():
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(self.interval)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._socket.close()


@pytest.fixture
def trickling_server():
    """``trickling_server(paths, what=..., reply=...)`` starts a :class:`TricklingServer` (closed after)."""
    servers: list[TricklingServer] = []

    def start(trickle_paths=("",), **kwargs) -> TricklingServer:
        servers.append(TricklingServer(trickle_paths, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture(scope="session")
def second_host_address() -> str:
    """A non-loopback IPv4 address of this machine, to connect from as a second host would.

    The servers count their clients per host and every loopback address is one host, so a test of fairness
    between hosts needs a source address that is not loopback: a connection from this machine's own network
    address to a server on 127.0.0.1 counts as another host's. Skips where the machine has none.
    """
    import ipaddress
    import socket

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the routed source address
        address = probe.getsockname()[0]
    except OSError:
        address = "127.0.0.1"
    finally:
        probe.close()
    if ipaddress.ip_address(address).is_loopback:
        pytest.skip("this machine has no non-loopback IPv4 address to act as a second host")
    return address


@pytest.fixture
def read_only():
    """``read_only(folder)`` makes ``folder`` read-only until the test ends, as a ``:ro`` volume is: a
    read-only bind mount of it as root (whom file modes do not stop), its files' modes otherwise. Skips
    where root cannot mount."""
    import subprocess

    mounted: list[Path] = []
    chmodded: list[Path] = []

    def make(folder: Path) -> Path:
        folder = Path(folder)
        if os.geteuid() == 0:
            bind = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
            if bind.returncode != 0:
                pytest.skip(f"cannot make a read-only mount here: {bind.stderr.decode().strip()}")
            mounted.append(folder)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True, capture_output=True)
        else:
            for path in [folder, *folder.rglob("*")]:
                if not path.is_symlink():
                    path.chmod(path.stat().st_mode & ~0o222)
            chmodded.append(folder)
        assert not os.access(folder, os.W_OK)
        return folder

    yield make
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)  # lazily: a server may still hold it
    for folder in chmodded:
        for path in [folder, *folder.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o200)


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(size)``: a folder on a file system of ``size`` (a tmpfs, e.g. ``"1m"``), unmounted after
    the test: a full disk on demand. Skips unless root can mount."""
    import subprocess

    mounted: list[Path] = []

    def make(size: str) -> Path:
        folder = tmp_path / f"disk-{len(mounted)}"
        folder.mkdir()
        if os.geteuid() != 0:
            pytest.skip("mounting a small file system needs root")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)])
        if done.returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        mounted.append(folder)
        return folder

    yield make
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)
