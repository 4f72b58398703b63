"""The compose file validates; the services start as the containers start them (same scripts, no Docker).

The ``test_compose_site_*`` tests drive the containerised WebShop site itself: ``.ci/compose_stage.sh`` runs
them against ``docker compose up`` with ``PROGPO_COMPOSE_SITE_URL`` set (they are skipped without it).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urljoin

import pytest
import requests
import yaml
from bs4 import BeautifulSoup

from progpo_envs.webshop.browser import WebShopBrowserEnv, chromium_available
from progpo_envs.webshop.env import WebShopEnv
from tests.paths import REPO_ROOT as REPO
from webshop_server.engine import WebShopEngine, parse_action

SITE_URL = os.environ.get("PROGPO_COMPOSE_SITE_URL")
compose_site = pytest.mark.skipif(SITE_URL is None, reason="needs the compose services: .ci/compose_stage.sh")


def _compose_clients() -> list[list[str]]:
    """The compose clients installed here: Debian's v1, the v2 plugin (`config` needs no engine)."""
    clients = [["docker-compose"]] if shutil.which("docker-compose") else []
    if shutil.which("docker"):
        version = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
        if version.returncode == 0:
            clients.append(["docker", "compose"])
    return clients


@pytest.mark.parametrize("path", ["docs/hosting.md", ".ci/compose_stage.sh"])
def test_no_registry_host_is_written_where_the_mirror_is_read_from_apt(path):
    """The stand-in base's Debian mirror comes from the machine's own apt configuration: every URL in these
    files, but the targets of Markdown links to projects' pages, is loopback, a placeholder or a shell
    variable (before: a registry's host was written in both, as the mirror debootstrap reads)."""
    text = re.sub(r"\]\(https?://[^)\s]+\)", "]()", (REPO / path).read_text())
    hosts = set(re.findall(r"\b[a-z][a-z0-9+]*://([^/\s:'\"`)]+)", text))
    allowed = {"127.0.0.1", "localhost", "host"}
    assert {h for h in hosts if h not in allowed and not h.startswith("$")} == set()


def test_compose_file_validates():
    clients = _compose_clients()
    if not clients:
        pytest.skip("neither docker-compose (Debian's v1) nor the compose v2 plugin is installed")
    for client in clients:
        for extra in (
            {},
            {"ALFWORLD_HOST_PORTS": "8000-8003", "MODEL_DIR": "/models/x", "PROGPO_BIND": "0.0.0.0"},
            {"ALFWORLD_REPLICAS": "3", "ALFWORLD_HOST_PORTS": "8000-8002", "WEBSHOP_ENV_REPLICAS": "2"},
        ):
            for profile in ([], ["--profile", "llm"], ["--profile", "openenv"]):
                result = subprocess.run(
                    [*client, "-f", str(REPO / "docker-compose.yml"), *profile, "config", "-q"],
                    capture_output=True,
                    text=True,
                    env={**os.environ, **extra},
                    timeout=60,
                )
                assert result.returncode == 0, (client, extra, result.stderr)


def test_compose_services_use_the_entry_point_scripts():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"webshop", "webshop-env", "alfworld", "alfworld-openenv", "webshop-openenv", "vllm"} <= set(
        services
    )
    assert services["vllm"]["profiles"] == ["llm"]
    env_services = ("webshop", "webshop-env", "alfworld", "alfworld-openenv", "webshop-openenv")
    for name in ("alfworld-openenv", "webshop-openenv"):  # OpenEnv's server, on its own port, opted into
        environment = services[name]["environment"]
        assert services[name]["profiles"] == ["openenv"] and environment["PROGPO_PROTOCOL"] == "openenv"
        assert services[name]["healthcheck"]["test"][-1].endswith(f":{environment['PROGPO_PORT']}/health")
    ports = [p.rsplit(":", 1)[-1] for name in env_services for p in services[name]["ports"]]
    assert len(ports) == len(set(ports)), ports
    for name in env_services:
        script = REPO / services[name]["command"][0]
        assert script.is_file() and os.access(script, os.X_OK), script
        assert "healthcheck" in services[name]
        assert (
            services[name]["image"] == "progpo-envs:latest" and services[name]["restart"] == "unless-stopped"
        )
    # many servers, one env: each env server service runs *_REPLICAS copies (one by default)
    replicas = {
        "webshop-env": "WEBSHOP_ENV",
        "alfworld": "ALFWORLD",
        "alfworld-openenv": "ALFWORLD_OPENENV",
        "webshop-openenv": "WEBSHOP_OPENENV",
    }
    for name, prefix in replicas.items():
        assert services[name]["deploy"]["replicas"] == f"${{{prefix}_REPLICAS:-1}}", name
        assert f"${{{prefix}_HOST_PORTS:-" in services[name]["ports"][0], name  # a range gives each a port
    # one image, built once: only `webshop` builds it, from the base image the user may replace
    assert [name for name in env_services if "build" in services[name]] == ["webshop"]
    assert (
        services["webshop"]["build"]["args"]["BASE_IMAGE"]
        == "${PROGPO_BASE_IMAGE:-python:3.11-slim-bookworm}"
    )
    # loopback unless the user opts in; a vllm without a model stops instead of restarting forever. Inside its
    # container a server listens on every interface of the container's own namespace (the engine forwards the
    # published port there, not to the container's loopback); the scripts alone listen on loopback (below)
    binds = {name: ("PROGPO_HOST", "WEBSHOP_HOST") for name in env_services} | {"vllm": ("VLLM_HOST",)}
    for name, variables in binds.items():
        assert all(port.startswith("${PROGPO_BIND:-127.0.0.1}:") for port in services[name]["ports"]), name
        assert all(services[name]["environment"][variable] == "0.0.0.0" for variable in variables), name
    assert services["vllm"]["restart"] == "no"
    for path in [
        "docker/Dockerfile",
        "docker/Dockerfile.vllm",
        "docker/prepare.py",
        "docker/healthcheck.py",
        "docker/install.sh",
        "docker/requirements.py",
        "docker/serve-vllm.sh",
        "scripts/wheelhouse.sh",
        ".dockerignore",
    ]:
        assert (REPO / path).is_file(), path


def test_image_copies_every_package_its_code_imports_and_the_context_admits_them():
    """The Dockerfile copies each first-party package the copied code imports, and .dockerignore lets each in.

    A package added to the repo (``progpo_base``) but not to the build context fails only at ``docker compose
    build``, which runs in the compose stage alone; this catches it in the fast suite.
    """
    dockerfile = (REPO / "docker/Dockerfile").read_text()
    copied = set()
    for line in dockerfile.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(word.startswith("--from") for word in words):
            copied.update(source.rstrip("/").replace("[e]", "e") for source in words[1:-1])
    admitted = {
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert {Path(source).parts[0] for source in copied} <= admitted

    first_party = {path.parent.name for path in REPO.glob("*/__init__.py")}
    copied_packages = {source for source in copied if source in first_party}
    imported = set()
    for package in copied_packages:
        for source in (REPO / package).rglob("*.py"):
            imported.update(re.findall(r"^\s*(?:from|import) (\w+)", source.read_text(), flags=re.MULTILINE))
    # benchmarks and progpo_verl are not served; code that reaches them does so only behind their own commands
    missing = (imported & first_party) - copied_packages - {"benchmarks", "progpo_verl", "tests"}
    assert not missing, f"the image's code imports {sorted(missing)}, which docker/Dockerfile does not copy"


def test_vllm_entry_point_without_a_model_stops_with_one_line(tmp_path):
    """An empty MODEL_DIR: one clear line and a non-zero exit (compose does not restart `vllm`)."""
    result = subprocess.run(
        [str(REPO / "docker/serve-vllm.sh")],
        env={**os.environ, "VLLM_MODEL": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "MODEL_DIR" in result.stderr and str(tmp_path) in result.stderr


def test_image_requirements_follow_pyproject_and_setup():
    """The image installs (the wheelhouse holds) pyproject's lists; the engine pins match scripts/setup.sh."""

    def listed(kind: str) -> list[str]:
        result = subprocess.run(
            [sys.executable, str(REPO / "docker/requirements.py"), kind],
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.split()

    setup_pins = (
        re.search(r'ALFWORLD_PINS="([^"]+)"', (REPO / "scripts/setup.sh").read_text()).group(1).split()
    )
    assert listed("engine") == setup_pins
    deps = listed("deps")
    assert "flask>=3" in deps and "tantivy>=0.22" in deps and not any(d.startswith("torch") for d in deps)
    assert listed("build")[0] == "pip"


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


def test_alfworld_service_script_starts_the_env_server(monkeypatch):
    """Also: without PROGPO_HOST the script listens on loopback (issue 39, item 6: it bound 0.0.0.0, beside
    a page saying the servers have no authentication)."""
    for variable in ("PROGPO_HOST", "WEBSHOP_HOST"):
        monkeypatch.delenv(variable, raising=False)
    port = _free_port()
    process, log = _run_script(
        "serve-env.sh",
        {
            "PROGPO_ENV": "progpo/ALFWorld-v0",
            "PROGPO_ENV_KWARGS": '{"split": "train"}',
            "PROGPO_PORT": str(port),
            "PROGPO_WORKERS": "1",
        },
        f"http://127.0.0.1:{port}/ready",
    )
    try:
        log.seek(0)
        assert f'"url": "http://127.0.0.1:{port}"' in log.read()  # the address it listens on
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


def test_openenv_service_script_starts_openenvs_server():
    from openenv import GenericEnvClient

    port = _free_port()
    process, _ = _run_script(
        "serve-env.sh",
        {
            "PROGPO_PROTOCOL": "openenv",
            "PROGPO_ENV": "progpo/WebShop-v0",
            "PROGPO_ENV_KWARGS": '{"num_products": 200, "split": "test", "expert": true}',
            "PROGPO_HOST": "127.0.0.1",
            "PROGPO_PORT": str(port),
            "PROGPO_WORKERS": "1",
        },
        f"http://127.0.0.1:{port}/health",
    )
    try:
        with GenericEnvClient(base_url=f"http://127.0.0.1:{port}").sync() as env:
            result = env.reset(task_index=0, episode_id="script-check")
            while not result.done:  # the operator turned the expert on: its route plays to the purchase
                assert "expert_action" not in result.observation
                expert = requests.get(
                    f"http://127.0.0.1:{port}/expert", params={"episode_id": "script-check"}, timeout=60
                ).json()["expert_action"]
                result = env.step({"command": expert})
            assert result.observation["won"] and result.reward == 10.0
    finally:
        _stop(process)


def test_webshop_site_script_starts_the_site(monkeypatch):
    """Also: without WEBSHOP_HOST the script listens on loopback (issue 39, item 6)."""
    monkeypatch.delenv("WEBSHOP_HOST", raising=False)
    port = _free_port()
    process, log = _run_script(
        "serve-webshop.sh",
        {"WEBSHOP_PORT": str(port), "WEBSHOP_NUM_PRODUCTS": "200"},
        f"http://127.0.0.1:{port}/api/health",
    )
    try:
        log.seek(0)
        assert f"http://127.0.0.1:{port}/ (waitress" in log.read()  # the address it listens on
        info = requests.get(f"http://127.0.0.1:{port}/api/info", timeout=10).json()
        assert info
    finally:
        _stop(process)


# --- the containerised WebShop site (.ci/compose_stage.sh) -------------------------------------------------


@pytest.fixture(scope="module")
def same_catalog_env(tmp_path_factory):
    """An in-process WebShop env over the catalog the container serves, generated here from its size and seed
    (compose's WEBSHOP_SEED): it knows each goal, so its expert tells what to click on the site."""
    info = requests.get(f"{SITE_URL}/api/info", timeout=10).json()
    seed = int(os.environ.get("WEBSHOP_SEED", "0"))
    engine = WebShopEngine.shared(info["num_products"], seed, cache_dir=tmp_path_factory.mktemp("catalog"))
    assert str(engine.catalog.fingerprint) == info["fingerprint"], "the container serves another catalog"
    env = WebShopEnv(engine=engine, split="test", expert=True, reward_mode="raw")
    yield env
    env.close()


@compose_site
def test_compose_site_search_item_options_buy_over_http(same_catalog_env):
    """A person's episode on the site's pages: search, open the item, pick its options, buy; scored 1.0."""
    http = requests.Session()
    _, info = same_catalog_env.reset(options={"task_index": 0})
    page = http.get(f"{SITE_URL}/?goal=0&split=test", timeout=10)  # redirected to the session's search page
    visited = []
    terminated = False
    while not terminated:
        action = info["expert_action"]
        name, arg = parse_action(action)
        soup = BeautifulSoup(page.text, "html.parser")
        if name == "search":
            form = soup.find("form", class_="search-form")
            page = http.get(urljoin(page.url, form["action"]), params={"q": arg, "page": "1"}, timeout=10)
            visited.append("results")
        elif arg == "buy now":
            form = soup.find("form", class_="buy-form")
            fields = {field["name"]: field["value"] for field in form.find_all("input") if field.get("name")}
            page = http.post(urljoin(page.url, form["action"]), data=fields, timeout=10)  # 303 to "done"
            visited.append("done")
        else:
            link = next(a for a in soup.find_all("a") if a.get_text().strip().lower() == arg)
            page = http.get(urljoin(page.url, link["href"]), timeout=10)
            visited.append("item" if "/item_page/" in page.url else "page")
        assert page.status_code == 200, f"{action}: {page.status_code} {page.text[:300]}"
        _, reward, terminated, truncated, info = same_catalog_env.step(action)
        assert not truncated
    assert visited[0] == "results" and "item" in visited and visited[-1] == "done"
    assert reward == 1.0
    assert float(BeautifulSoup(page.text, "html.parser").select_one("#reward pre").text) == 1.0


@pytest.mark.browser
@compose_site
@pytest.mark.skipif(not chromium_available(), reason="needs apt packages chromium chromium-driver")
def test_compose_site_episode_in_chromium(same_catalog_env):
    """One episode in headless Chromium against the container: the same pages as in-process, scored 1.0."""
    browser = WebShopBrowserEnv(url=SITE_URL, split="test", reward_mode="raw")
    try:
        obs_b, _ = browser.reset(options={"task_index": 1})
        obs_l, info_l = same_catalog_env.reset(options={"task_index": 1})
        assert obs_b == obs_l
        terminated = truncated = False
        while not (terminated or truncated):
            action = info_l["expert_action"]
            obs_b, reward_b, terminated_b, _, _ = browser.step(action)
            obs_l, reward, terminated, truncated, info_l = same_catalog_env.step(action)
            assert obs_b == obs_l, action
        assert terminated and terminated_b and reward_b == reward == 1.0
    finally:
        browser.close()
