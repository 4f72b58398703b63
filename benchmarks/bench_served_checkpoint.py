"""The exported checkpoint, served: ``progpo train``'s ``final`` folder on vLLM's OpenAI-compatible server,
scored by ``progpo eval --agent openai`` against the trainer's own after-RL figure (issue 33, item 3).

The run folder (``--run-dir``, by default the free-text quickstart on vLLM, ``runs/quickstart_vllm``, made by
``benchmarks/quickstart.py --set rollout.engine=vllm``) holds what both sides need: ``final/`` (the export),
``config.yaml`` (the run's settings) and ``summary.json`` (the trainer's own held-out evaluation after RL:
success, and its spread over the evaluation's sampling seeds). The served side:

* vLLM's server (``.venv-vllm``'s Python, :func:`agents.vllm_server.serve_command` with its CPU flags) on
  ``final/``, its context the trainer's ``max_prompt_tokens + max_new_tokens``;
* ``progpo eval --agent openai`` as a user runs it (the main ``.venv``'s command, in a subprocess), once per
  evaluation seed, with the trainer's evaluation settings spelled as flags: the same split, the same tasks
  (``--task-order spread --episodes eval.num_tasks``: the trainer's held-out tasks), the env's kwargs, step
  limit, prompt template and history, temperature and response length;
* the prompts, checked: every recorded chat prompt of the first seed's run is tokenised by the server
  (``/tokenize`` with the messages, the generation prompt added) and by the trainer's
  :class:`training.rollout.PromptEncoder` with the exported tokenizer; the two must be equal token for token.

What differs by design, and is recorded: the sampled tokens. The trainer draws each response from its own
inverse-CDF stream (:func:`training.seeds.request_seed`), vLLM from its seeded sampler, so the two sides play
the same policy with other draws; the comparison is therefore of success rates, served against the trainer's
± its spread. The eval bounds prompts in characters (``--max-prompt-chars``, 13,000 by default) where the
trainer bounds them in tokens (``rollout.max_prompt_tokens``); the longest prompt recorded says whether either
bound was reached.

Run (needs .venv-vllm and a finished run; about 10 minutes on 2 cores):
    .venv/bin/python -m benchmarks.bench_served_checkpoint --run-dir runs/quickstart_vllm
Writes ``benchmarks/results/served_checkpoint.json``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import requests
import yaml
from rich.console import Console
from rich.progress import Progress

from agents.vllm_server import serve_command, server_environment
from benchmarks.common import RESULTS_DIR, ServerProcess, free_port, machine_info, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path
from training.config import config_from_dict
from training.policy import load_tokenizer
from training.rollout import PromptEncoder

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
PROGPO = REPO / ".venv" / "bin" / "progpo"
SERVED_NAME = "policy"


@dataclass
class Settings:
    run_dir: Path = option(Path("runs/quickstart_vllm"), "a finished progpo train run (final/, config.yaml)")
    seeds: int | None = option(None, "progpo eval runs, seeds 0..N-1 (unset: the run's eval.seeds)")
    prompt_checks: int = option(64, "recorded prompts tokenised by both sides")
    out: Path = option(RESULTS_DIR / "served_checkpoint.json", "result file")


def eval_command(config, server_url: str, seed: int, out_dir: Path) -> list[str]:
    """``progpo eval --agent openai`` with the trainer's held-out evaluation settings as flags."""
    command = [str(PROGPO), "eval", "--env", config.env.id, "--agent", "openai", "--no-progress"]
    command += ["--base-url", f"{server_url}/v1", "--model", SERVED_NAME, "--out", str(out_dir)]
    command += ["--split", config.env.eval_split, "--episodes", str(config.eval.num_tasks)]
    command += ["--task-order", "spread", "--max-steps", str(config.env.max_steps)]
    rollout = config.rollout
    command += ["--template", rollout.template, "--history-length", str(rollout.history_length)]
    command += ["--temperature", str(config.eval.temperature), "--max-tokens", str(rollout.max_new_tokens)]
    command += ["--seed", str(seed)]
    for key, value in config.env.kwargs.items():
        command += ["--env-arg", f"{key}={json.dumps(value)}"]
    if config.env.data_dir:
        command += ["--data-dir", config.env.data_dir]
    return command


def recorded_prompts(out_dir: Path) -> list[list[dict[str, str]]]:
    """Every chat prompt a ``progpo eval`` run recorded, in file order."""
    prompts = []
    for line in (out_dir / "trajectories.jsonl").read_text().splitlines():
        prompts += [step["prompt"] for step in json.loads(line)["trajectory"] if step.get("prompt")]
    return prompts


def served_token_ids(server_url: str, messages: list[dict[str, str]]) -> list[int]:
    """The server's own tokenisation of a chat prompt (vLLM's ``/tokenize``, generation prompt added)."""
    body = {"model": SERVED_NAME, "messages": messages, "add_generation_prompt": True}
    response = requests.post(f"{server_url}/tokenize", json=body, timeout=30)
    response.raise_for_status()
    return list(response.json()["tokens"])


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.splitlines()[0])
    console = Console(width=150)
    run_dir = settings.run_dir
    config = config_from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
    summary = json.loads((run_dir / "summary.json").read_text())
    trainer = summary["after_rl"]
    seeds = settings.seeds if settings.seeds is not None else config.eval.seeds
    max_model_len = config.rollout.max_prompt_tokens + config.rollout.max_new_tokens
    port = free_port()
    command = serve_command(
        str(run_dir / "final"), port=port, cpu=True, max_model_len=max_model_len, python=str(VLLM_PYTHON)
    )
    load_at_start = os.getloadavg()[0]
    per_seed, commands, started = [], [], time.perf_counter()
    console.print(f"[bold]serving[/] {run_dir / 'final'} with vLLM (starting, about a minute)")
    with (
        ServerProcess(command, port, "/health", timeout_s=900, env=server_environment(cpu=True)) as server,
        tempfile.TemporaryDirectory() as tmp,
        Progress(console=console) as progress,
    ):
        task = progress.add_task(f"progpo eval, {seeds} seeds x {config.eval.num_tasks} tasks", total=seeds)
        for seed in range(seeds):
            out_dir = Path(tmp) / f"seed{seed}"
            argv_eval = eval_command(config, server.url, seed, out_dir)
            done = subprocess.run(argv_eval, cwd=REPO, capture_output=True, text=True, timeout=3600)
            if done.returncode != 0:
                raise RuntimeError(f"progpo eval failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
            served = json.loads((out_dir / "summary.json").read_text())
            per_seed.append(float(served["success_rate"]))
            commands.append(shlex.join(["progpo", *argv_eval[1:]]).replace(server.url, "http://HOST:PORT"))
            progress.advance(task)
        prompts = recorded_prompts(Path(tmp) / "seed0")
        tokenizer = load_tokenizer(run_dir / "final")
        encoder = PromptEncoder(tokenizer, config.rollout.max_prompt_tokens)
        checked = prompts[: settings.prompt_checks]
        mismatched = sum(encoder.encode(p) != served_token_ids(server.url, p) for p in checked)
        longest = max(len(encoder.encode(p)) for p in prompts)
    served_success = float(np.mean(per_seed))
    spread = float(trainer["success_std"])
    result = {
        "benchmark": "served_checkpoint",
        "run_dir": str(run_dir),
        "tasks": int(config.eval.num_tasks),
        "split": config.env.eval_split,
        "seeds": seeds,
        "trainer_success": float(trainer["success"]),
        "trainer_per_seed": trainer.get("success_per_seed"),
        "spread": spread,
        "served_success": served_success,
        "served_per_seed": per_seed,
        "served_spread": float(np.std(per_seed)),
        "difference": served_success - float(trainer["success"]),
        "within_spread": abs(served_success - float(trainer["success"])) <= spread,
        "prompts": {
            "checked": len(checked),
            "token_mismatches": int(mismatched),
            "longest_prompt_tokens": int(longest),
            "trainer_bound_tokens": config.rollout.max_prompt_tokens,
        },
        "server_command": shlex.join(["python", *command[1:]]).replace(str(port), "PORT"),
        "eval_commands": commands,
        "wall_s": time.perf_counter() - started,
        "machine": machine_info(load_average_start=load_at_start, load_average_end=os.getloadavg()[0]),
    }
    save_result(result, settings.out)
    console.print(
        f"trainer after RL {result['trainer_success']:.1%} ± {spread:.1%}; served {served_success:.1%} "
        f"(per seed {', '.join(f'{v:.1%}' for v in per_seed)}): "
        f"{'within' if result['within_spread'] else 'OUTSIDE'} the trainer's spread; prompts token-equal "
        f"{len(checked) - mismatched}/{len(checked)}"
    )
    console.print(f"wrote {settings.out}")
    return 0


SPECS = (
    Benchmark(
        "served_checkpoint",
        script_path(__file__),
        "The quickstart's exported checkpoint (free text, trained on vLLM) served by vLLM's OpenAI server "
        "and scored by `progpo eval --agent openai` on the trainer's held-out tasks and seeds, against the "
        "trainer's own after-RL success ± its spread; the served chat prompts checked token for token "
        "against the trainer's. Needs `.venv-vllm` and the run: no quick version.",
        ".venv/bin/python -m benchmarks.bench_served_checkpoint --run-dir runs/quickstart_vllm",
    ),
)


if __name__ == "__main__":
    raise SystemExit(main())
