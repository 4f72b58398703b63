"""The compose file validates; the services start as the containers start them (same scripts, no Docker)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests
import yaml

REPO = Path(__file__).resolve().parents[2]


def test_compose_file_validates():
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose (Debian's v1) is not installed")
    for extra in ({}, {"ALFWORLD_HOST_PORTS": "8000-8003", "MODEL_DIR": "/models/x"}):
        for profile in ([], ["--profile", "llm"]):
            result = subprocess.run(
                ["docker-compose", "-f", str(REPO / "docker-compose.yml"), *profile, "config", "-q"],
                capture_output=True,
                text=True,
                env={**os.environ, **extra},
                timeout=60,
            )
            assert result.returncode == 0, result.stderr


def test_compose_services_use_the_entry_point_scripts():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"webshop", "webshop-env", "alfworld", "vllm"} <= set(services)
    assert services["vllm"]["profiles"] == ["llm"]
    for name in ("webshop", "webshop-env", "alfworld"):
        script = REPO / services[name]["command"][0]
        assert script.is_file() and os.access(script, os.X_OK), script
        assert "healthcheck" in services[name]
    for path in [
        "docker/Dockerfile",
        "docker/Dockerfile.vllm",
        "docker/prepare.py",
        "docker/healthcheck.py",
        "docker/install.sh",
        "docker/serve-vllm.sh",
    ]:
        assert (REPO / path).is_file(), path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_script(script: str, env: dict[str, str], ready_url: str, timeout: float = 240.0):
    log = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(
        [str(REPO / "docker" / script)],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            pytest.fail(f"{script} exited ({process.returncode}):\n{log.read()[-3000:]}")
        try:
            if requests.get(ready_url, timeout=2).status_code == 200:
                return process, log
        except requests.ConnectionError:
            pass
        time.sleep(0.3)
    _stop(process)
    log.seek(0)
    pytest.fail(f"{script} not ready in {timeout}s:\n{log.read()[-3000:]}")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()  # exec'd: the server itself gets the signal
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def test_alfworld_service_script_starts_the_env_server():
    port = _free_port()
    process, _ = _run_script(
        "serve-env.sh",
        {
            "PROGPO_ENV": "progpo/ALFWorld-v0",
            "PROGPO_ENV_KWARGS": '{"split": "train"}',
            "PROGPO_HOST": "127.0.0.1",
            "PROGPO_PORT": str(port),
            "PROGPO_WORKERS": "1",
        },
        f"http://127.0.0.1:{port}/ready",
    )
    try:
        url = f"http://127.0.0.1:{port}"
        assert (
            requests.get(f"{url}/", timeout=10).json() == "This is environment AlfWorld."
        )  # AgentGym mounted
        created = requests.post(
            f"{url}/instances", json={"env_id": "progpo/ALFWorld-v0", "seed": 0}, timeout=60
        )
        assert created.status_code == 201 and created.json()["observation"]
    finally:
        _stop(process)


def test_webshop_site_script_starts_the_site():
    port = _free_port()
    process, _ = _run_script(
        "serve-webshop.sh",
        {"WEBSHOP_HOST": "127.0.0.1", "WEBSHOP_PORT": str(port), "WEBSHOP_NUM_PRODUCTS": "200"},
        f"http://127.0.0.1:{port}/api/health",
    )
    try:
        info = requests.get(f"http://127.0.0.1:{port}/api/info", timeout=10).json()
        assert info
    finally:
        _stop(process)
