"""What ``progpo train`` tells its user: a banner before anything is built, and a short result block.

The banner says what runs (estimator, env and its data, sizes, the model, the sampler, the processes) and on
which CPU kernels: torch dispatches its CPU kernels by the instruction set (``AVX2``, ``AVX512``, the
generic ``DEFAULT``), which changes the last bits of every result, so a run repeats another bit for bit only
on the same path (``ATEN_CPU_CAPABILITY`` chooses it; the README says which path its numbers were measured
on). The result block, at most ten lines, gives success before → after RL, where the files went and the
SHA-256 of the warm-start and final weights (``summary.json``'s ``weights_sha256``: equal digests, a run
repeated bit for bit).

Example:
    >>> from training.config import TrainConfig
    >>> "ProGPO" in describe_run(TrainConfig(), resume=False, world_size=1)[0]
    True
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

from training.config import TrainConfig
from training.envs import data_dir_value

PREFIX = "[progpo train]"
#: The run folder's weights whose SHA-256 the result block prints and ``summary.json`` records
#: (``weights_sha256``): the warm start's (RL's starting point and KL reference) and the final ones.
WEIGHTS_FOLDERS = ("reference", "final")


def cpu_kernels() -> str:
    """The CPU kernel path torch dispatches to here (``AVX2``, ``AVX512``, ``DEFAULT``...)."""
    return torch.backends.cpu.get_cpu_capability()


def describe_run(config: TrainConfig, resume: bool, world_size: int) -> list[str]:
    """The banner's lines."""
    rollout, env = config.rollout, config.env
    data = f"data {data_dir_value(env.data_dir)}" if env.data_dir else ""
    model = config.model.path or (
        f"a tiny Qwen2 ({config.model.tiny.num_hidden_layers} layers, width {config.model.tiny.hidden_size}, "
        f"built in {Path(config.run_dir) / 'tiny_policy'})"
    )
    algo = {"progpo": "ProGPO", "progpo_coverage": "ProGPO-coverage"}.get(config.algo.name, config.algo.name)
    what = "resuming" if resume else "starting"
    return [
        f"{what} {algo} on {env.id}{f' ({data})' if data else ''}: {config.iterations} iterations of "
        f"{rollout.num_groups} groups x {rollout.group_size}, {env.max_steps} steps at most"
        + (
            ", after a warm start on expert demonstrations"
            if config.warm_start.enabled and not resume
            else ""
        ),
        f"policy {model}; sampler {rollout.engine}; {world_size} process{'es' if world_size > 1 else ''}",
        f"run dir {config.run_dir}; CPU kernels {cpu_kernels()} (ATEN_CPU_CAPABILITY picks them: results "
        "repeat bit for bit only on the same path)",
    ]


def print_banner(config: TrainConfig, resume: bool, world_size: int) -> None:
    """Print the banner (before the model is loaded: the first thing a run says)."""
    for line in describe_run(config, resume, world_size):
        print(f"{PREFIX} {line}", flush=True)


def _success(record: dict[str, Any] | None) -> str:
    if not record or "success" not in record:
        return "-"
    spread = record.get("success_std")
    return f"{record['success']:.1%}" + (f" ± {spread:.1%}" if spread is not None else "")


def result_lines(summary: dict[str, Any], config: TrainConfig, seconds: float) -> list[str]:
    """The result block's lines (at most ten)."""
    minutes, secs = divmod(int(round(seconds)), 60)
    lines = [f"done: {summary['iterations']} iterations of {summary['algo']} in {minutes} min {secs} s"]
    for prefix, name in (("", "held-out success"), ("rl_tasks_", "success on RL's own tasks")):
        before, after = summary.get(prefix + "before_rl"), summary.get(prefix + "after_rl")
        if before or after:
            lines.append(f"  {name}: {_success(before)} -> {_success(after)} (before -> after RL)")
    run_dir = Path(config.run_dir)
    lines += [
        f"  summary   {run_dir / 'summary.json'}",
        f"  metrics   {run_dir / 'metrics.jsonl'}"
        + (f" (TensorBoard: {run_dir / 'tensorboard'})" if config.tensorboard else ""),
        f"  plot      {run_dir / 'learning_curve.png'}",
        f"  model     {run_dir / 'final'} (from_pretrained, progpo eval, vLLM)",
        f"  CPU kernels {cpu_kernels()}",
    ]
    digests = summary.get("weights_sha256") or {}
    notes = {"reference": " (the warm start: RL's starting point)"}
    lines += [
        f"  sha256    {digests[name]}  {run_dir / name / 'model.safetensors'}{notes.get(name, '')}"
        for name in WEIGHTS_FOLDERS
        if digests.get(name)
    ]
    return lines


def print_result(summary: dict[str, Any], config: TrainConfig, seconds: float) -> None:
    """Print the result block."""
    for line in result_lines(summary, config, seconds):
        print(f"{PREFIX} {line}" if not line.startswith("  ") else line, flush=True)


class RLProgress:
    """What the RL phase shows on ``main`` (the rank that prints), iteration by iteration: rich's progress bar
    at a terminal with ``progress`` on; otherwise (a log file, ``progress=false``) one plain line per
    iteration, ``[progpo train] RL iteration 3/30: success 0.50, 2 min 14 s``, since rich draws nothing but
    its last state where stdout is not a terminal; nothing on the other ranks.

    Args:
        enabled: The run's ``progress`` setting.
        total: The run's RL iterations.
        completed: Those done before (a resumed run).
        main: Whether this rank prints.
    """

    def __init__(self, enabled: bool, total: int, completed: int = 0, main: bool = True):
        self.total, self.main, self.started, self.bar = total, main, time.monotonic(), None
        if main and enabled and sys.stdout.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
            self.bar = Progress(TextColumn("{task.description}"), *columns)
            self.task = self.bar.add_task("RL iterations", total=total, completed=completed)

    def __enter__(self) -> RLProgress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.bar is not None:
            self.bar.stop()

    def iteration_done(self, iteration: int, success: float) -> None:
        """RL iteration ``iteration`` (counted from 1) ended with ``success`` on its training episodes."""
        if self.bar is not None:
            description = f"RL it {iteration} success {success:.2f}"
            self.bar.update(self.task, completed=iteration, description=description)
        elif self.main:
            minutes, seconds = divmod(int(time.monotonic() - self.started), 60)
            elapsed = f"{minutes} min {seconds} s"
            print(
                f"{PREFIX} RL iteration {iteration}/{self.total}: success {success:.2f}, {elapsed}",
                flush=True,
            )
