"""Per-GPU memory budgets of the GPU presets (:mod:`training.costs`), for the numbers their headers state.

For each preset (``configs/*_qwen2.5-1.5b.yaml``), each model (Qwen2.5-1.5B-Instruct and -7B-Instruct at
their real shapes), each rollout engine (the transformers engine; vLLM at the preset's
``rollout.vllm_gpu_memory_utilization``) and 1 or 8 GPUs of 80 GB: the budget of one rank by part (fp32
masters, gradients, AdamW, the update's snapshot, compute-dtype weights, reference, sampler, KV cache,
activations, sync) and its total, against the GPU. It is computed, not measured; the static parts are checked
against a 2-layer run's tensors by the CPU rehearsal (``tests/training/test_gpu_rehearsal.py``).

Run (a second, no GPU):
    python benchmarks/memory_budget.py
Writes ``benchmarks/results/memory_budget.json`` and ``.png``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import RESULTS_DIR, machine_info, save_figure, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path
from training.config import load_config
from training.costs import GIB, QWEN25_SHAPES, config_budget

ROOT = Path(__file__).resolve().parents[1]

PRESETS = ("alfworld_progpo_qwen2.5-1.5b", "webshop_progpo_qwen2.5-1.5b")
GPU_MEMORY_BYTES = 80e9  # an 80 GB H100 / A100
WORLD_SIZES = (1, 8)
ENGINES = ("transformers", "vllm")


def budgets() -> list[dict]:
    """One row per (preset, model, engine, GPUs): the budget's parts and total in GiB, and whether it fits."""
    rows = []
    for preset in PRESETS:
        for engine in ENGINES:
            config = load_config(ROOT / "configs" / f"{preset}.yaml", [f"rollout.engine={engine}"])
            for model, shape in QWEN25_SHAPES.items():
                for gpus in WORLD_SIZES:
                    budget = config_budget(config, shape, gpus, GPU_MEMORY_BYTES)
                    rows.append(
                        {
                            "preset": preset,
                            "model": model,
                            "parameters": shape.params,
                            "engine": engine,
                            "gpus": gpus,
                            "gib": budget.gib(),
                            "gpu_gib": round(GPU_MEMORY_BYTES / GIB, 1),
                            "fits": budget.total <= GPU_MEMORY_BYTES,
                        }
                    )
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [k for k in rows[0]["gib"] if k != "total"]
    fig, axes = plt.subplots(1, len(PRESETS), figsize=(12, 4.6), sharey=True)
    for ax, preset in zip(axes, PRESETS, strict=True):
        mine = [r for r in rows if r["preset"] == preset]
        labels = [f"{r['model'].removeprefix('Qwen2.5-')} {r['engine'][:5]} x{r['gpus']}" for r in mine]
        bottom = [0.0] * len(mine)
        for part in parts:
            values = [r["gib"][part] for r in mine]
            ax.bar(labels, values, bottom=bottom, label=part)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.axhline(mine[0]["gpu_gib"], color="black", linestyle="--", linewidth=1, label="80 GB GPU")
        ax.set_title(preset, fontsize=9)
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
    axes[0].set_ylabel("GiB per GPU (budget)")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save_figure(fig, path)


@dataclass
class Settings:
    out: str = option(str(RESULTS_DIR / "memory_budget.json"), "result file (the plot is written beside it)")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])
    from rich.console import Console
    from rich.table import Table

    rows = budgets()
    result = {
        "benchmark": "memory_budget",
        "gpu_memory_bytes": GPU_MEMORY_BYTES,
        "rows": rows,
        "machine": machine_info(),
    }
    out = save_result(result, settings.out)
    plot(rows, out.with_suffix(".png"))
    table = Table(title="per-GPU memory budget (GiB, 80 GB GPUs)")
    for column in ("preset", "model", "engine", "GPUs", "total", "fits"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r["preset"], r["model"], r["engine"], str(r["gpus"]), f"{r['gib']['total']}", str(r["fits"])
        )
    Console().print(table)
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------

SPECS = (
    Benchmark(
        "memory_budget",
        script_path(__file__),
        "Per-GPU memory budgets of the two GPU presets (`training/costs.py`: fp32 masters, gradients, AdamW, "
        "the update's snapshot, compute-dtype weights, reference, sampler, KV cache, activations, sync) for "
        "Qwen2.5-1.5B and Qwen2.5-7B at their real shapes, with the transformers engine or vLLM, on 1 or 8 "
        "GPUs (`gpu_memory_bytes` each): computed, not measured; the CPU rehearsal checks the static parts "
        "against what a 2-layer run holds. The numbers the presets' headers state.",
        "python benchmarks/memory_budget.py",
        [],
    ),
)


if __name__ == "__main__":
    sys.exit(main())
