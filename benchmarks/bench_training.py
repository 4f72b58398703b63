"""Per-iteration time split of the training loop (rollout / advantages / update) for two policy sizes.

Runs the real loop (:class:`training.trainer.Trainer`) on ALFWorld (generated games) with the quickstart's
tiny model and a ~25M-parameter Qwen2 (hidden 512, 7 layers, Qwen2.5 tokenizer cut to 8k ids), no warm start
and no validation, and reports per iteration: seconds in rollout, advantage estimation and update, their
shares, rollout tokens/s, update tokens/s and env steps/s. The claim checked: advantage computation takes
under 1% of an iteration (ratio in the same run, not a timed assertion).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_training.py                 # both models, 3 iterations each
    python benchmarks/bench_training.py --models tiny --iterations 2 --max-steps 4

Writes ``benchmarks/results/training.json`` and ``benchmarks/results/training.png``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.common import RESULTS_DIR, machine_info, save_figure, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "m25": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 7,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
    },
}
KEYS = (
    "time_rollout",
    "time_advantage",
    "time_update",
    "time_iteration",
    "rollout_tokens_per_s",
    "update_tokens_per_s",
    "env_steps_per_s",
    "rows",
    "update_tokens",
)


def run_model(name: str, settings: Settings) -> dict:
    from training.config import load_config
    from training.trainer import Trainer

    shape = MODELS[name]
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [
            f"run_dir={run_dir}",
            f"iterations={settings.iterations}",
            "warm_start.enabled=false",
            "eval.num_tasks=0",
            "checkpoint_every=0",
            "tensorboard=false",
            "progress=false",
            f"env.id={settings.env_id}",
            f"env.max_steps={settings.max_steps}",
            f"rollout.num_groups={settings.groups}",
            f"rollout.group_size={settings.group_size}",
            f"algo.name={settings.algo}",
            f"num_threads={settings.threads}",
            f"device={settings.device}",
            f"rollout.max_new_tokens={settings.max_new_tokens}",
            *settings.extra,
        ]
        overrides += [f"model.tiny.{k}={v}" for k, v in shape.items()]
        config = load_config(None, overrides)
        trainer = Trainer(config)
        params = sum(p.numel() for p in trainer.model.parameters())
        try:
            trainer.run()
        finally:
            trainer.close()
        records = [r for r in trainer.metrics.read() if r["kind"] == "train"]
    per_iteration = [{k: r.get(k) for k in KEYS} for r in records]
    import torch

    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    measured = per_iteration[1:] or per_iteration  # the first iteration pays one-off costs (game loading)
    mean = {k: sum(r[k] for r in measured) / len(measured) for k in KEYS}
    mean["advantage_share"] = mean["time_advantage"] / mean["time_iteration"]
    return {
        "model": name,
        "parameters": params,
        "shape": shape,
        "iterations": per_iteration,
        "mean": mean,
        "peak_gpu_memory_gib": peak,
    }


@dataclass
class Settings:
    models: list[str] = option(["tiny", "m25"], "policy sizes to time", choices=list(MODELS))
    iterations: int = option(3, "training iterations per model")
    env_id: str = option("progpo/ALFWorld-v0", "the env")
    max_steps: int = option(8, "env.max_steps")
    groups: int = option(4, "rollout.num_groups")
    group_size: int = option(4, "rollout.group_size")
    algo: str = option("progpo", "advantage estimator (algo.name)")
    threads: int = option(1, "torch threads")
    device: str = option("cpu", "cpu | cuda")
    max_new_tokens: int = option(40, "rollout.max_new_tokens")
    extra: list[str] = option([], "more config overrides (key=value)", nargs="*")
    out: str = option(str(RESULTS_DIR / "training.json"), "result file (the plot is written beside it)")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])
    os.environ.setdefault("OMP_NUM_THREADS", str(settings.threads))
    import torch
    from rich.console import Console
    from rich.table import Table

    torch.set_num_threads(settings.threads)
    started = time.time()
    out = Path(settings.out)
    results = []
    # the JSON is rewritten after each model, so a long run keeps what it measured
    for name in settings.models:
        results.append(run_model(name, settings))
        _write(out, settings, results, started)
    shape = f"{settings.groups}x{settings.group_size}"
    table = Table(title=f"training iteration split ({settings.env_id}, {shape}, {settings.algo})")
    for column in (
        "model",
        "params",
        "rollout s",
        "advantage s",
        "update s",
        "iteration s",
        "adv share",
        "rollout tok/s",
        "update tok/s",
        "env steps/s",
        "peak GiB",
    ):
        table.add_column(column, justify="right")
    for r in results:
        m = r["mean"]
        table.add_row(
            r["model"],
            f"{r['parameters'] / 1e6:.1f}M",
            f"{m['time_rollout']:.2f}",
            f"{m['time_advantage']:.4f}",
            f"{m['time_update']:.2f}",
            f"{m['time_iteration']:.2f}",
            f"{100 * m['advantage_share']:.3f}%",
            f"{m['rollout_tokens_per_s']:.0f}",
            f"{m['update_tokens_per_s']:.0f}",
            f"{m['env_steps_per_s']:.1f}",
            "-" if r["peak_gpu_memory_gib"] is None else f"{r['peak_gpu_memory_gib']:.1f}",
        )
    Console(width=170).print(table)
    _plot(results, out.with_suffix(".png"))
    print(f"wrote {out}")
    return 0


def _write(out: Path, settings: Settings, results: list[dict], started: float) -> None:
    import torch

    try:
        load = os.getloadavg()
    except OSError:
        load = None
    payload = {
        "benchmark": "training",
        "args": asdict(settings),
        "results": results,
        "claim_advantage_under_1pct": all(r["mean"]["advantage_share"] < 0.01 for r in results),
        "machine": machine_info(
            gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            torch=torch.__version__,
            load_avg=load,
            torch_threads=torch.get_num_threads(),
        ),
        "wall_seconds": time.time() - started,
    }
    save_result(payload, out)


def _plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    names = [r["model"] for r in results]
    bottom = [0.0] * len(results)
    for key, label in (
        ("time_rollout", "rollout"),
        ("time_advantage", "advantages"),
        ("time_update", "update"),
    ):
        values = [r["mean"][key] for r in results]
        ax.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("seconds per iteration")
    ax.legend()
    save_figure(fig, path)


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------

SPECS = (
    Benchmark(
        "training",
        script_path(__file__),
        "Training-loop time split per iteration (rollout / advantages / update) for the tiny and a larger "
        "policy (their parameters in the table); claim: the advantages take a negligible share of an "
        "iteration.",
        "python benchmarks/bench_training.py",
        ["--models", "tiny", "--iterations", "2", "--max-steps", "4"],
    ),
)


if __name__ == "__main__":
    sys.exit(main())
