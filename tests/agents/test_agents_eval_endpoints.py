"""``progpo eval``'s URLs, through the real command against real servers (issue 39, items 1, 2 and 7):
``--env-url`` is an env server for every env, WebShop's shop site is ``--shop-url``, the wrong kind of server
or nothing listening is one line (exit status 2) before anything is built, and an env server that refuses the
expert agent is answered with how its operator turns the expert on.

The two servers are the real commands (``progpo serve`` hosting both envs, ``progpo webshop serve``) over the
same generated 200-product catalog, started once for the module.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from agents.cli import main
from tests.paths import REPO_ROOT as REPO

WEBSHOP = "progpo/WebShop-v0"
CATALOG = {"num_products": 200}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(command: list[str], ready: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "progpo.cli", *command], cwd=REPO, env=env, stdout=out, stderr=out
        )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{command[0]} exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if requests.get(ready, timeout=2).status_code == 200:
                return process
        except requests.ConnectionError:
            pass
        time.sleep(0.3)
    process.kill()
    pytest.fail(f"{command[0]} not ready in 240 s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[str, str, str]]:
    """``(env server URL, WebShop site URL, env server hosting WebShop only)``; the first two share the
    catalog: ``progpo serve`` with WebShop's and ALFWorld's envs, the expert not turned on."""
    cache = tmp_path_factory.mktemp("endpoints-cache")
    env = {**os.environ, "PROGPO_CACHE": str(cache), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("ALFWORLD_DATA", None)
    logs = tmp_path_factory.mktemp("endpoints-logs")
    site_port, server_port, webshop_port = _free_port(), _free_port(), _free_port()
    site = _start(
        ["webshop", "serve", "--port", str(site_port), "--num-products", "200"],
        f"http://127.0.0.1:{site_port}/api/health",
        env,
        logs / "site.log",
    )  # first: it builds the catalog and index the env servers then read from the cache
    fixed = f"{WEBSHOP}={json.dumps(CATALOG)}"
    server = _start(
        [
            "serve",
            "--env",
            WEBSHOP,
            "--env",
            "progpo/ALFWorld-v0",
            "--env-kwargs",
            fixed,
            "--port",
            str(server_port),
        ],
        f"http://127.0.0.1:{server_port}/ready",
        env,
        logs / "server.log",
    )
    webshop_only = _start(
        ["serve", "--env", WEBSHOP, "--env-kwargs", fixed, "--port", str(webshop_port)],
        f"http://127.0.0.1:{webshop_port}/ready",
        env,
        logs / "webshop-only.log",
    )
    try:
        yield (
            f"http://127.0.0.1:{server_port}",
            f"http://127.0.0.1:{site_port}",
            f"http://127.0.0.1:{webshop_port}",
        )
    finally:
        for process in (site, server, webshop_only):
            process.terminate()
        for process in (site, server, webshop_only):
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def _eval(out: Path, *argv: str) -> int:
    return main(["--agent", "random", "--episodes", "3", "--out", str(out), "--no-progress", *argv])


def _played(out: Path) -> list[tuple]:
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    records = sorted((json.loads(line) for line in lines), key=lambda r: r["task_index"])
    return [
        (r["task_index"], [(s["observation"], s["action"], s["reward"]) for s in r["trajectory"]])
        for r in records
    ]


def test_webshop_env_url_is_the_env_server_as_for_alfworld(servers, tmp_path, capsys):
    """Before: ``--env progpo/WebShop-v0 --env-url <env server>`` read the URL as the shop site and failed
    with ``WebShop server GET /api/info -> 404``; only the ``progpo/Remote-v0`` form played."""
    env_server, site, _ = servers
    assert _eval(tmp_path / "short", "--env", WEBSHOP, "--env-url", env_server) == 0
    remote_form = ["--env", "progpo/Remote-v0", "--env-arg", f"env_id={WEBSHOP}", "--env-url", env_server]
    assert _eval(tmp_path / "remote-form", *remote_form) == 0
    assert _eval(tmp_path / "site", "--env", WEBSHOP, "--shop-url", site) == 0
    assert _played(tmp_path / "short") == _played(tmp_path / "remote-form")  # the same episodes
    assert _played(tmp_path / "short") == _played(tmp_path / "site")  # the same catalog, whichever door
    assert len(_played(tmp_path / "short")) == 3
    capsys.readouterr()


@pytest.mark.parametrize(
    "flag, which, expected",
    [
        (
            "--env-url",
            1,
            "is a WebShop site (it answers /api/info), not an env server: give it as --shop-url to play "
            "progpo/WebShop-v0 against it, or give the env server's URL (progpo serve; docker compose: "
            "ALFWorld :8000, WebShop :8001)",
        ),
        (
            "--shop-url",
            0,
            "is an env server (it answers /envs), not a WebShop site: give it as --env-url to play through "
            "it, or give the site's URL (progpo webshop serve; docker compose: :3000)",
        ),
    ],
)
def test_the_wrong_kind_of_server_is_one_line_saying_which_flag_takes_it(
    servers, tmp_path, capsys, flag, which, expected
):
    url = servers[which]
    assert _eval(tmp_path / "out", "--env", WEBSHOP, flag, url) == 2
    err = capsys.readouterr().err
    assert err == f"progpo eval: error: {flag} {url} {expected}\n"
    assert not (tmp_path / "out").exists()


def test_an_env_server_that_does_not_host_the_env_is_one_line_naming_what_it_hosts(servers, tmp_path, capsys):
    url = servers[2]
    assert _eval(tmp_path / "out", "--env", "progpo/ALFWorld-v0", "--env-url", url) == 2
    err = capsys.readouterr().err
    hosts = f"hosts {WEBSHOP}, not progpo/ALFWorld-v0: give the server that hosts it"
    assert err == f"progpo eval: error: --env-url {url} {hosts}\n"


@pytest.mark.parametrize("env_id", [WEBSHOP, "progpo/ALFWorld-v0"])
def test_the_expert_agent_refused_by_an_env_server_says_how_its_operator_allows_it(
    servers, tmp_path, capsys, env_id
):
    """Issue 39, item 2. Before: ``[400] kwarg 'expert' is not allowed`` and no word of the server setting."""
    argv = ["--env", env_id, "--agent", "expert", "--episodes", "1", "--env-url", servers[0]]
    assert main([*argv, "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "progpo eval: error: the env server refused the expert agent"
    )
    assert f"kwarg 'expert' is not allowed for {env_id}" in err
    assert f"""start it with --env-kwargs '{env_id}={{"expert": true}}'""" in err
    assert "PROGPO_SERVE_EXPERT=true docker compose up" in err


def test_env_url_and_shop_url_together_is_one_line(servers, tmp_path, capsys):
    assert _eval(tmp_path / "out", "--env", WEBSHOP, "--env-url", servers[0], "--shop-url", servers[1]) == 2
    assert capsys.readouterr().err.startswith("progpo eval: error: --env-url and --shop-url: give one")


@pytest.mark.parametrize(
    "flags",
    [
        [
            "--env",
            WEBSHOP,
            "--agent",
            "openai",
            "--model",
            "policy",
            "--base-url",
            "http://127.0.0.1:{port}/v1",
        ],
        ["--env", WEBSHOP, "--agent", "random", "--env-url", "http://127.0.0.1:{port}"],
        ["--env", WEBSHOP, "--agent", "random", "--shop-url", "http://127.0.0.1:{port}"],
    ],
    ids=["base-url", "env-url", "shop-url"],
)
def test_a_refused_endpoint_is_one_line_within_seconds(tmp_path, flags):
    """Issue 39, item 7 (bound: 8 s). Before: ``--base-url`` on a port nothing listens on retried for ~20 s
    (6 attempts with back-off), then wrote a summary of errored episodes and exited 1."""
    port = _free_port()  # nothing listens on it
    argv = [arg.format(port=port) for arg in flags]
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "progpo.cli",
            "eval",
            *argv,
            "--episodes",
            "2",
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    flag = argv[-2]
    url = argv[-1]
    assert done.stderr == (
        f"progpo eval: error: {flag} {url}: nothing listens there (connection refused): start the server, or "
        "fix the URL\n"
    )
    assert seconds < 8, seconds
    assert not (tmp_path / "out").exists()
