"""The trainers' own clients, installed as their users install them, against our servers (issue 41).

Needs ``.venv-verifiers`` and ``.venv-skyrl`` (``scripts/setup_integrations.sh``): the ``integrations``
marker keeps these tests out of the default set; ``.ci/run_integrations`` runs them with ``.venv-skyrl``'s
Python (skyrl_gym and the project), ``vf-eval`` from ``.venv-verifiers`` in a subprocess.

* verifiers: ``vf-eval @ file.toml`` on our ``progpo_verifiers`` package, its groups (``num_rollouts``)
  against ``progpo serve --protocol openenv`` with the expert on: every rollout of a task starts from the
  same first turn, other tasks from others, each wins with the stand-in, and no turn holds the expert; our
  TOML files parse (``--dry-run``); ``load_environment`` builds the env in Python.
* SkyRL: ``agents.skyrl``'s env classes driven as SkyRL's generator drives them, given several servers of
  either protocol (each session placed by load); the rest of its tests are in
  ``test_agents_trainer_clients.py`` (which skips them where skyrl_gym is not installed).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from agents.expert_stand_in import MODEL_NAME, EpisodeSpec, ExpertStandIn, StandInServer
from progpo_envs.server.app import ServerConfig, create_app
from progpo_envs.server.openenv_app import OpenEnvServer, create_openenv_app
from progpo_envs.server.pool import PoolConfig
from progpo_envs.server.serving import BackgroundServer
from tests.paths import REPO_ROOT

pytestmark = pytest.mark.integrations

ALFWORLD = "progpo/ALFWorld-v0"
VERIFIERS_BIN = REPO_ROOT / ".venv-verifiers" / "bin"
TASKS = (2, 4)


def _config(expert: bool = True) -> ServerConfig:
    kwargs = {ALFWORLD: {"expert": True}} if expert else {}
    return ServerConfig(env_ids=(ALFWORLD,), env_kwargs=kwargs, pool=PoolConfig(num_workers=1))


@pytest.fixture(scope="module")
def openenv_url():
    with OpenEnvServer(create_openenv_app(_config())) as server:
        yield server.url


@pytest.fixture(scope="module")
def model_url():
    stand_in = ExpertStandIn(ALFWORLD, [EpisodeSpec(t, t, "train") for t in TASKS])
    with StandInServer(stand_in) as server:
        yield f"{server.url}/v1"
    stand_in.close()


def _vf_eval(*args: str, cwd) -> subprocess.CompletedProcess:
    if not (VERIFIERS_BIN / "vf-eval").exists():
        pytest.fail(".venv-verifiers is missing: run scripts/setup_integrations.sh")
    env = {
        **os.environ,
        "PATH": f"{VERIFIERS_BIN}{os.pathsep}{os.environ['PATH']}",
        "OPENAI_API_KEY": "EMPTY",
    }
    env.pop("PYTHONPATH", None)  # verifiers' venv has nothing of the project: as its users install it
    done = subprocess.run(
        [str(VERIFIERS_BIN / "vf-eval"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def test_vf_eval_groups_share_their_start_and_win(openenv_url, model_url, tmp_path):
    toml = (REPO_ROOT / "integrations" / "verifiers" / "alfworld.toml").read_text()
    toml = toml.replace("http://127.0.0.1:8002/v1", model_url).replace("http://127.0.0.1:8010", openenv_url)
    toml = toml.replace('model = "policy"', f'model = "{MODEL_NAME}"').replace("limit = 16", "limit = 2")
    toml = toml.replace("num_rollouts = 4", "num_rollouts = 3").replace(
        'output_dir = "outputs"', 'output_dir = "out"'
    )
    toml = toml.replace("seed = 0 ", f"task_indices = {list(TASKS)}\nseed = 0 ")
    (tmp_path / "run.toml").write_text(toml)
    _vf_eval("@", "run.toml", "--no-rich", cwd=tmp_path)
    firsts: dict[int, set[str]] = {}
    traces = [
        json.loads(line)["traces"][0] for f in (tmp_path / "out").glob("*/traces.jsonl") for line in f.open()
    ]
    assert len(traces) == 3 * len(TASKS)
    for trace in traces:
        messages = [node["message"] for node in trace["nodes"]]
        firsts.setdefault(trace["info"]["task_index"], set()).add(messages[0]["content"])
        assert trace["rewards"]["success"]["score"] == 1.0 and trace["metrics"]["invalid_actions"] == 0
        assert "Your admissible actions of the current situation are" in messages[0]["content"]
        assert not any("expert_action" in str(m.get("content", "")) for m in messages)
    assert sorted(firsts) == list(TASKS)
    assert all(len(starts) == 1 for starts in firsts.values())  # a group shares its start
    assert firsts[TASKS[0]] != firsts[TASKS[1]]


@pytest.mark.parametrize("name", ["alfworld.toml", "webshop.toml"])
def test_our_vf_eval_files_parse(name, tmp_path):
    path = REPO_ROOT / "integrations" / "verifiers" / name
    _vf_eval("@", str(path), "--dry-run", "--output-dir", str(tmp_path), cwd=tmp_path)
    resolved = json.loads(next(tmp_path.rglob("configs/resolved/eval.json")).read_text())
    assert resolved["env"]["taskset"]["id"] == "progpo_verifiers" and resolved["push"] is False
    assert resolved["env"]["player"]["runtime"]["type"] == "subprocess"


def test_load_environment_builds_the_env_in_python(openenv_url):
    code = (
        "import progpo_verifiers; "
        f"env = progpo_verifiers.load_environment({openenv_url!r}, 'alfworld', task_indices=[0, 3]); "
        "print(type(env).__name__, [t.data.reset for t in env.taskset]); "
        f"every = progpo_verifiers.load_environment({openenv_url!r}, 'alfworld', split='train'); "
        "print('tasks:', len(list(every.taskset)))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(VERIFIERS_BIN / "python"), "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ProgpoEnv" in done.stdout and "'task_index': 3, 'seed': 3" in done.stdout
    assert "tasks: 36" in done.stdout  # every task of the split, as the server counts them


@pytest.mark.parametrize("protocol", ["openenv", "native"])
def test_skyrl_envs_play_over_several_servers(protocol, model_url):
    """Two servers of one protocol in one URL string (each session placed by load): every rollout wins."""
    pytest.importorskip("skyrl_gym", reason="run in .venv-skyrl (scripts/setup_integrations.sh)")
    import agents.skyrl
    from agents.skyrl_rollouts import play_rows

    if protocol == "openenv":
        apps = [create_openenv_app(_config(expert=False)) for _ in range(2)]
        servers = [OpenEnvServer(app).start() for app in apps]
    else:
        servers = [BackgroundServer(create_app(_config(expert=False))).__enter__() for _ in range(2)]
    try:
        rows = [row for row in agents.skyrl.task_rows("progpo_alfworld", TASKS) for _ in range(2)]
        env_config = {"server": ",".join(s.url for s in servers), "protocol": protocol}
        records = play_rows(rows, env_config, model_url, MODEL_NAME)
    finally:
        for server in servers:
            server.stop()
    assert [r["success"] for r in records] == [1.0] * len(rows)
    assert records[0]["chat"][0] == records[1]["chat"][0]  # one group, one start
