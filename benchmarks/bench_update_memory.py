"""Peak memory of one update micro-batch with Qwen2.5's 151,936-token vocabulary: full logits vs chunked.

One update micro-batch is a forward and backward of the free-text policy objective (the response tokens'
log-probs and entropy, :func:`training.sampling.policy_logprobs_and_entropy`). Before issue 15 it made the
fp32 logits of every response position over the whole vocabulary, ``rows x response x 151,936 x 4`` bytes a
copy, several copies alive at once; now it computes ``optim.logit_chunk_tokens`` positions' logits at a time
inside a checkpointed function (:func:`training.sampling.chunked_logprobs_and_entropy`). This benchmark
measures both in one run, on a random Qwen2 with Qwen2.5-1.5B's width (hidden 1536, 12 query / 2 KV heads,
MLP 8960, tied embeddings, the full vocabulary) cut to one decoder layer, and checks that both give the same
objective and gradient.

Each variant runs in its own process (so one variant's freed memory cannot hide the next one's peak): it
builds the model and the batch, resets the process's peak resident set (``/proc/self/clear_refs``), runs the
micro-batch, and reports the peak (``VmHWM``) minus the resident set before it. CPU only (Linux ``/proc``).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_update_memory.py
    python benchmarks/bench_update_memory.py --rows 2 --response-tokens 128   # quick

Writes ``benchmarks/results/update_memory.json`` and ``benchmarks/results/update_memory.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.common import RESULTS_DIR, machine_info, save_figure, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path

ROOT = Path(__file__).resolve().parents[1]

#: Qwen2.5-1.5B's shape (config.json of Qwen/Qwen2.5-1.5B-Instruct), with fewer decoder layers.
QWEN25_15B = {
    "vocab_size": 151_936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}
MIB = 1024**2


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def run_variant(settings: Settings, variant: str, chunk_tokens: int) -> dict:
    """One micro-batch in this process; ``variant`` is ``full`` or ``chunked`` (by ``chunk_tokens``)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from training.sampling import (
        pack_sequences,
        policy_logprobs_and_entropy,
        response_logits,
        token_logprobs_and_entropy,
    )

    torch.set_num_threads(settings.threads)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_15B, num_hidden_layers=settings.layers))
    generator = torch.Generator().manual_seed(1)
    rows = settings.rows
    prompts = torch.randint(0, 151_643, (rows, settings.prompt_tokens), generator=generator).tolist()
    responses = torch.randint(0, 151_643, (rows, settings.response_tokens), generator=generator).tolist()
    packed = pack_sequences(prompts, responses, pad_token_id=151_643)
    mask = packed.response_mask.float()
    params = sum(p.numel() for p in model.parameters())

    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    before_kib = _status_kib("VmRSS")
    started = time.perf_counter()
    if variant == "full":  # the free-text path before issue 15
        logits = response_logits(model, packed, settings.temperature)
        logprobs, entropy = token_logprobs_and_entropy(logits, packed.response_ids)
        del logits
    else:
        logprobs, entropy = policy_logprobs_and_entropy(
            model, packed, responses, [[]] * settings.rows, settings.temperature, chunk_tokens=chunk_tokens
        )
    objective = -(logprobs * mask).sum() - 0.001 * (entropy * mask).sum()
    objective.backward()
    seconds = time.perf_counter() - started
    peak_kib = _status_kib("VmHWM")
    grad_norm = torch.sqrt(sum(p.grad.double().square().sum() for p in model.parameters()))
    return {
        "variant": variant,
        "chunk_tokens": chunk_tokens if variant == "chunked" else None,
        "peak_increase_mib": (peak_kib - before_kib) / 1024,
        "rss_before_mib": before_kib / 1024,
        "seconds": seconds,
        "objective": float(objective),
        "grad_norm": float(grad_norm),
        "parameters": params,
    }


def _child(settings: Settings, variant: str, chunk_tokens: int) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        variant,
        "--chunk-tokens",
        str(chunk_tokens),
        "--rows",
        str(settings.rows),
        "--prompt-tokens",
        str(settings.prompt_tokens),
        "--response-tokens",
        str(settings.response_tokens),
        "--layers",
        str(settings.layers),
        "--threads",
        str(settings.threads),
        "--temperature",
        str(settings.temperature),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(settings.threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"variant {variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class Settings:
    rows: int = option(8, "rows of the micro-batch (presets: 8)")
    prompt_tokens: int = option(256, "prompt positions")
    response_tokens: int = option(512, "response positions (presets: 512)")
    layers: int = option(1, "decoder layers (Qwen2.5-1.5B has 28)")
    chunk_tokens: list[int] = option([1024, 256], "chunk sizes to run")
    temperature: float = option(1.0, "sampling temperature of the objective")
    threads: int = option(1, "torch threads")
    child: str | None = option(None, argparse.SUPPRESS, choices=["full", "chunked"])  # one variant's process
    out: str = option(str(RESULTS_DIR / "update_memory.json"), "result file (the plot is written beside it)")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])
    if settings.child:
        print(json.dumps(run_variant(settings, settings.child, settings.chunk_tokens[0])))
        return 0
    import torch

    started = time.time()
    positions = settings.rows * settings.response_tokens
    logits_copy_mib = positions * QWEN25_15B["vocab_size"] * 4 / MIB
    print(
        f"micro-batch {settings.rows} rows x ({settings.prompt_tokens} prompt + "
        f"{settings.response_tokens} response) tokens, "
        f"vocabulary {QWEN25_15B['vocab_size']:,}: one fp32 logits copy = {logits_copy_mib:,.0f} MiB"
    )
    results = [_child(settings, "full", 0)]
    results += [_child(settings, "chunked", c) for c in settings.chunk_tokens]
    full = results[0]
    for r in results:
        r["ratio_to_full"] = r["peak_increase_mib"] / full["peak_increase_mib"]
        r["objective_rel_diff"] = abs(r["objective"] - full["objective"]) / abs(full["objective"])
        r["grad_norm_rel_diff"] = abs(r["grad_norm"] - full["grad_norm"]) / full["grad_norm"]
    header = f"{'variant':<16} {'peak MiB':>10} {'x full':>8} {'seconds':>9} {'objective diff':>15}"
    print(f"{header} {'grad diff':>10}")
    for r in results:
        name = "full logits" if r["variant"] == "full" else f"chunked {r['chunk_tokens']}"
        print(
            f"{name:<16} {r['peak_increase_mib']:>10,.0f} {r['ratio_to_full']:>8.3f} {r['seconds']:>9.1f} "
            f"{r['objective_rel_diff']:>15.1e} {r['grad_norm_rel_diff']:>10.1e}"
        )
    out = save_result(
        {
            "benchmark": "update_memory",
            "command": "python benchmarks/bench_update_memory.py " + " ".join(argv or sys.argv[1:]),
            "args": asdict(settings),
            "model": {**QWEN25_15B, "num_hidden_layers": settings.layers, "parameters": full["parameters"]},
            "fp32_logits_copy_mib": logits_copy_mib,
            "metric": "peak resident set increase (VmHWM after - VmRSS before) of forward + backward",
            "results": results,
            "machine": machine_info(
                torch=torch.__version__, torch_threads=settings.threads, load_average_1m=os.getloadavg()[0]
            ),
            "wall_seconds": time.time() - started,
        },
        settings.out,
    )
    _plot(results, out.with_suffix(".png"))
    return 0


def _plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["full logits" if r["variant"] == "full" else f"chunked {r['chunk_tokens']}" for r in results]
    fig, ax = plt.subplots(figsize=(5, 3))
    colors = ["#c44e52" if r["variant"] == "full" else "#4c72b0" for r in results]
    bars = ax.bar(names, [r["peak_increase_mib"] / 1024 for r in results], color=colors)
    for bar, r in zip(bars, results, strict=True):
        ax.annotate(
            f"x{r['ratio_to_full']:.2f}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_ylabel("peak memory of one micro-batch (GiB)")
    ax.set_title("update micro-batch, vocabulary 151,936", fontsize=9)
    save_figure(fig, path)


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------

SPECS = (
    Benchmark(
        "update_memory",
        script_path(__file__),
        "Peak memory of one update micro-batch (forward + backward of the log-prob/entropy objective) with "
        "Qwen2.5's real 151,936-token vocabulary at hidden 1536: the full fp32 logits against the chunked "
        "log-probs (`optim.logit_chunk_tokens`), same batch, same run; the values and gradients of the paths "
        "agree. Minutes on 2 cores: no quick version.",
        "python benchmarks/bench_update_memory.py",
    ),
)


if __name__ == "__main__":
    sys.exit(main())
