"""The GPU presets' training path, checked on one GPU in a few minutes (``scripts/gpu_check.sh``).

What it proves. ``progpo train --config configs/webshop_progpo_qwen2.5-1.5b.yaml`` (the preset's exact
settings: free-text sampling with the papers' ``default`` prompt, bf16 compute over fp32 master weights,
pi_old recomputed by the training model, lr 1e-6, gradient checkpointing) on a random-initialised model of
Qwen2.5-1.5B-Instruct's exact shape (28 layers, hidden 1536, 12 query / 2 key-value heads, tied embeddings,
151,936 embedding rows, the full Qwen2.5 tokenizer), with only the group, episode and response sizes cut so
that it fits a borrowed machine's time, and asserts what a silently broken recipe would get wrong:

* ``nonfinite`` false: no NaN/inf in any logged loss, ratio, KL, entropy or gradient norm;
* ``params_changed_frac`` >= 0.5 in every iteration at lr 1e-6 (fp32 masters keep the ~1e-6 AdamW steps that
  bf16 weights would round away; ``tests/training/test_mixed_precision.py`` shows the contrast);
* ``first_ratio_max_abs_dev`` <= 1e-3: pi_old and the first update pass agree before any optimizer step
  (``algo.recompute_old_logprobs``);

and records ``rollout_tokens_per_s``, ``update_tokens_per_s``, the update's model-FLOPs utilisation against
the H200's 790 TFLOP/s dense bf16 (``mfu``: 6 x parameters x update tokens per second; the recomputed pi_old
and the reference forward are not counted) and ``peak_memory_bytes`` (GPU:
``torch.cuda.max_memory_allocated``).

The result file is written after every stage, so a run that fails part-way still says how far it got and why
(``status``, ``stage``, ``error``). ``--dry-run`` runs the same path on the CPU with a tiny model (bf16
autocast on the CPU) and writes the same keys: CI runs it, so the script is known to work before a GPU runs
it.

Usage::

    bash scripts/gpu_check.sh                      # on a CUDA machine: benchmarks/results/gpu.json
    bash scripts/gpu_check.sh --dry-run --out /tmp/gpu_dry.json

Example:
    >>> sorted(CHECKS)
    ['first_ratio_max_abs_dev', 'nonfinite', 'params_changed_frac']
    >>> numbers = {"params_changed_frac": 0.9, "first_ratio_max_abs_dev": 0.0, "nonfinite": False}
    >>> check_results(numbers)["passed"], check_results({**numbers, "params_changed_frac": 0.02})["passed"]
    (True, False)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS_DIR, git_commit, machine_info, save_result  # noqa: E402

#: The preset whose path is checked (WebShop: its env is pure Python, so it travels to any GPU machine).
PRESET = ROOT / "configs" / "webshop_progpo_qwen2.5-1.5b.yaml"
#: Dense bf16 peak of one H200 (NVIDIA's datasheet, without sparsity), the MFU denominator.
PEAK_BF16_FLOPS = 790e12

#: Qwen2.5-1.5B-Instruct's shape (its config.json), as ``model.tiny`` fields: random weights, real sizes.
QWEN25_1_5B_SHAPE = {
    "vocab_size": 151643,
    "embedding_rows": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
}
#: The dry run's tiny model (a truncated Qwen tokenizer; same architecture).
DRY_RUN_SHAPE = {
    "vocab_size": 4096,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What the check cuts from the preset (everything else is the preset's own setting)."""

    iterations: int
    num_groups: int
    group_size: int
    max_steps: int
    max_new_tokens: int
    max_prompt_tokens: int


#: One H200, well under 8 minutes with the model build: 3 iterations of 4 groups x 4 WebShop episodes.
GPU_SIZES = Sizes(
    iterations=3, num_groups=4, group_size=4, max_steps=5, max_new_tokens=128, max_prompt_tokens=2048
)
DRY_RUN_SIZES = Sizes(
    iterations=2, num_groups=2, group_size=2, max_steps=2, max_new_tokens=16, max_prompt_tokens=256
)

#: name -> (test, threshold): the assertions, applied to the run's worst iteration.
CHECKS = {
    "nonfinite": (lambda value, limit: value is limit, False),
    "params_changed_frac": (lambda value, limit: value is not None and value >= limit, 0.5),
    "first_ratio_max_abs_dev": (lambda value, limit: value is not None and value <= limit, 1e-3),
}
#: Logged quantities that must be finite in every iteration.
FINITE_KEYS = ("pg_loss", "ratio", "kl", "entropy", "grad_norm", "approx_kl", "update_to_weight_ratio")


def overrides(shape: dict, sizes: Sizes, run_dir: Path, device: str, threads: int) -> list[str]:
    """``progpo train`` overrides on top of the preset: the model shape, the cut sizes, no evaluation."""
    return [
        f"run_dir={run_dir}",
        "model.path=",  # build the random model of `shape` into <run_dir>/tiny_policy
        *(f"model.tiny.{key}={value}" for key, value in shape.items()),
        "model.compute_dtype=bfloat16",  # the preset's (also on the dry run's CPU: bf16 autocast)
        f"device={device}",
        f"num_threads={threads}",
        f"iterations={sizes.iterations}",
        f"rollout.num_groups={sizes.num_groups}",
        f"rollout.group_size={sizes.group_size}",
        f"env.max_steps={sizes.max_steps}",
        f"rollout.max_new_tokens={sizes.max_new_tokens}",
        f"rollout.max_prompt_tokens={sizes.max_prompt_tokens}",
        "env.vector_mode=sync",
        "eval.num_tasks=0",
        "eval.before_rl=false",
        "checkpoint_every=0",
        "tensorboard=false",
    ]


def summarise(records: list[dict], parameters: int, on_gpu: bool) -> dict:
    """The result's numbers from the run's ``train`` records: the worst iteration for each check, mean
    throughputs, MFU."""
    train = [r for r in records if r.get("kind") == "train"]
    values = [r.get(k) for r in train for k in FINITE_KEYS if r.get(k) is not None]
    rollout = [r["rollout_tokens_per_s"] for r in train]
    update = [r["update_tokens_per_s"] for r in train]
    update_tokens_per_s = sum(update) / len(update) if update else None
    return {
        "iterations": len(train),
        "nonfinite": not all(math.isfinite(v) for v in values) or not train,
        "params_changed_frac": min((r.get("params_changed_frac", 0.0) for r in train), default=None),
        "update_to_weight_ratio": min((r.get("update_to_weight_ratio", 0.0) for r in train), default=None),
        "first_ratio_max_abs_dev": max(
            (r.get("first_ratio_max_abs_dev", math.inf) for r in train), default=None
        ),
        "first_ratio_mean_abs_dev": max(
            (r.get("first_ratio_mean_abs_dev", math.inf) for r in train), default=None
        ),
        "rollout_tokens_per_s": sum(rollout) / len(rollout) if rollout else None,
        "update_tokens_per_s": update_tokens_per_s,
        "mfu": (
            6 * parameters * update_tokens_per_s / PEAK_BF16_FLOPS
            if on_gpu and update_tokens_per_s is not None
            else None
        ),
        "per_iteration": [
            {
                k: r.get(k)
                for k in (
                    "params_changed_frac",
                    "update_to_weight_ratio",
                    "first_ratio_max_abs_dev",
                    "first_ratio_mean_abs_dev",
                    "rollout_tokens_per_s",
                    "update_tokens_per_s",
                    "update_tokens",
                    "time_rollout",
                    "time_update",
                    "grad_norm",
                )
            }
            for r in train
        ],
    }


def check_results(numbers: dict) -> dict:
    """Each check's value, threshold and verdict, and whether all passed."""
    checks = {
        name: {"value": numbers.get(name), "threshold": limit, "passed": bool(test(numbers.get(name), limit))}
        for name, (test, limit) in CHECKS.items()
    }
    return {"checks": checks, "passed": all(c["passed"] for c in checks.values())}


def peak_memory_bytes(on_gpu: bool) -> int:
    """GPU: the most memory torch allocated; CPU: this process's peak resident set."""
    import torch

    if on_gpu:
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def run_check(dry_run: bool, out: Path, threads: int) -> int:
    """Run the check, writing ``out`` after every stage; returns the exit status (0 = every check passed)."""
    import torch

    on_gpu = not dry_run
    result: dict = {
        "benchmark": "gpu_check",
        "dry_run": dry_run,
        "preset": str(PRESET.relative_to(ROOT)),
        "status": "running",
        "stage": "start",
        "machine": machine_info(
            torch=torch.__version__,
            device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        ),
        "commit": git_commit(),
        "sizes": dataclasses.asdict(DRY_RUN_SIZES if dry_run else GPU_SIZES),
        "shape": DRY_RUN_SHAPE if dry_run else QWEN25_1_5B_SHAPE,
        "timings_s": {},
    }

    def stage(name: str) -> None:
        result["stage"] = name
        save_result(result, out)
        print(f"[gpu_check] {name}", flush=True)

    started = time.perf_counter()
    try:
        if on_gpu and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device is visible (run with --dry-run on a CPU)")
        from training.config import load_config
        from training.trainer import Trainer

        with tempfile.TemporaryDirectory(prefix="gpu_check-") as run_dir:
            config = load_config(
                PRESET,
                overrides(
                    result["shape"],
                    DRY_RUN_SIZES if dry_run else GPU_SIZES,
                    Path(run_dir),
                    "cpu" if dry_run else "cuda",
                    threads,
                ),
            )
            result["config"] = {
                "model": dataclasses.asdict(config.model),
                "rollout": dataclasses.asdict(config.rollout),
                "algo": dataclasses.asdict(config.algo),
                "optim": dataclasses.asdict(config.optim),
            }
            stage("building the model and loading it")
            trainer = Trainer(config)
            parameters = sum(p.numel() for p in trainer.model.parameters())
            result["parameters"] = parameters
            result["timings_s"]["setup"] = time.perf_counter() - started
            stage(f"training {config.iterations} iterations")
            trained = time.perf_counter()
            try:
                trainer.run()
            finally:
                trainer.close()
            result["timings_s"]["train"] = time.perf_counter() - trained
            result.update(summarise(trainer.metrics.read(), parameters, on_gpu))
        result["peak_memory_bytes"] = peak_memory_bytes(on_gpu)
        result.update(check_results(result))
        result["status"] = "passed" if result["passed"] else "failed"
    except Exception as exc:  # record how far it got, then fail
        result["status"] = "error"
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-4000:]
    result["timings_s"]["total"] = time.perf_counter() - started
    result["stage"] = "done"
    save_result(result, out)
    print_table(result)
    return 0 if result["status"] == "passed" else 1


def print_table(result: dict) -> None:
    """The checks and throughputs as a table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"gpu_check ({'dry run, CPU' if result['dry_run'] else 'GPU'}): {result['status']}")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("check")
    for name, check in result.get("checks", {}).items():
        table.add_row(
            name,
            str(check["value"]),
            f"threshold {check['threshold']}: {'ok' if check['passed'] else 'FAIL'}",
        )
    for name in ("rollout_tokens_per_s", "update_tokens_per_s", "mfu", "peak_memory_bytes"):
        value = result.get(name)
        table.add_row(name, "-" if value is None else f"{value:.4g}", "recorded")
    Console().print(table)
    if "error" in result:
        print(f"[gpu_check] error at stage {result['stage']!r}: {result['error']}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the same path on the CPU with a tiny model")
    parser.add_argument(
        "--out", help="result JSON (default: benchmarks/results/gpu.json, or gpu_dry_run.json)"
    )
    parser.add_argument("--threads", type=int, default=8, help="torch CPU threads")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else RESULTS_DIR / ("gpu_dry_run.json" if args.dry_run else "gpu.json")
    return run_check(args.dry_run, out, args.threads)


if __name__ == "__main__":
    sys.exit(main())
