"""Does the CPU kernel path change the quickstart policy's numbers? Same machine, same packages, same seeds;
only the kernels PyTorch dispatches to differ.

Issue 20: the README's quickstart did not reproduce on a fresh machine: the warm start already differed. One
candidate is the CPU: PyTorch picks its vectorised kernels (``torch.backends.cpu.get_cpu_capability()``:
AVX2, AVX512, or the generic ``DEFAULT`` code) by the CPU it runs on, and different kernels sum in a different
order, so a float rounds differently. A rounding difference alone is harmless, but RL samples its own data:
one sampled token that flips changes the rest of that episode, the batch the update sees, and so every later
trajectory. A run on another CPU type (or another torch build) then follows another path, and its success
rates are another draw, not a wrong result.

This benchmark reproduces that on one machine. Each setting runs in its own process, with the environment
variable ``ATEN_CPU_CAPABILITY`` choosing the kernels: unset (the CPU's best), unset again (a repeat: the same
kernels must give bit-identical numbers) and ``default`` (the generic code path, as a CPU without those
instructions would take). Each process loads the same quickstart tiny policy (built once,
:func:`training.policy.build_tiny_policy` with :class:`training.config.TinyModelConfig`'s defaults) with the
quickstart's torch threads, then

1. runs a forward pass on a fixed batch (the logits at initialisation),
2. takes ``--steps`` AdamW steps of next-token prediction at the warm start's learning rate
   (``warm_start.lr``, linear decay to 0, gradients clipped at ``optim.grad_clip``, as
   ``training/warm_start.py``) over a few fixed token batches, cycled as the warm start's epochs are,
3. samples ``--sample-tokens`` tokens per sequence at temperature 1 from one seeded generator, keeping each
   sampled token's log-probability.

The parent compares every setting with the first (:func:`compare_runs`): the largest logit difference at
initialisation, the fraction of parameter elements that differ after the steps and the largest difference,
each setting's final loss, the fraction of sampled tokens that agree, the largest difference of a sampled
token's log-probability while both settings still sampled the same sequence, and whether everything is
bit-identical. That last difference sizes the risk of a flip: a draw lands within it of the boundary between
two tokens with roughly that probability, so over as many sampled tokens as its inverse one flip is expected.

Usage::

    python benchmarks/bench_kernel_paths.py              # about two minutes on 2 shared cores
    python benchmarks/bench_kernel_paths.py --steps 2 --sample-tokens 4   # a smoke run: under a minute

Writes ``benchmarks/results/kernel_paths.json`` and ``benchmarks/results/kernel_paths.png``.

Example:
    >>> import torch
    >>> reference = {"logits": torch.zeros(2, 3), "params": {"w": torch.zeros(4)},
    ...              "tokens": torch.tensor([[1, 2], [3, 4]]), "losses": [2.0, 1.5],
    ...              "sampled_logprobs": torch.full((2, 2), -1.0)}
    >>> other = {"logits": torch.tensor([[0.0, 1e-6, 0.0], [0.0, 0.0, 0.0]]),
    ...          "params": {"w": torch.tensor([0.0, 0.0, 0.0, 2e-7])},
    ...          "tokens": torch.tensor([[1, 2], [3, 9]]), "losses": [2.0, 1.25],
    ...          "sampled_logprobs": torch.tensor([[-1.0, -1.5], [-1.25, -3.0]])}
    >>> diff = compare_runs(reference, other)
    >>> diff["param_fraction_differing"], diff["token_agreement"], diff["final_loss"]
    (0.25, 0.75, 1.25)
    >>> diff["max_abs_sampled_logprob_diff"]  # the flipped token's own log-prob is not compared
    0.5
    >>> diff["bit_identical"], compare_runs(reference, reference)["bit_identical"]
    (False, True)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, machine_info, save_figure, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path

ROOT = Path(__file__).resolve().parents[1]

#: ``(setting, ATEN_CPU_CAPABILITY)``; None = unset (PyTorch picks the CPU's best kernels). The first is the
#: reference every other setting is compared with; the second repeats it (same kernels: bit-identical).
SETTINGS: list[tuple[str, str | None]] = [("best", None), ("best_again", None), ("default", "default")]
#: Rows and length of each language-modelling batch, of the initial forward's batch and of the prompts.
BATCH_ROWS, BATCH_TOKENS = 4, 64
#: Distinct language-modelling batches, cycled over the steps (the warm start's epochs over its data).
NUM_BATCHES = 4
SAMPLE_ROWS, PROMPT_TOKENS = 16, 16


def compare_runs(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """How far one setting's outputs are from the reference setting's.

    Args:
        reference: one setting's outputs: ``logits`` (the forward at initialisation, any shape), ``params``
            (parameter name -> tensor after the steps), ``tokens`` (sampled ids, ``[rows, tokens]``),
            ``sampled_logprobs`` (each sampled token's log-probability, ``[rows, tokens]``), ``losses`` (the
            loss of each step).
        other: another setting's outputs, of the same shapes and parameter names.

    Returns:
        ``max_abs_logit_diff_init``, ``param_fraction_differing`` (fraction of all parameter elements not
        bit-equal), ``max_abs_param_diff``, ``final_loss`` (``other``'s), ``final_loss_diff`` (``other`` minus
        ``reference``), ``token_agreement`` (fraction of sampled positions with the same id) and
        ``max_abs_sampled_logprob_diff`` (over the positions of each row before its first differing token:
        the same context and token in both), ``bit_identical`` (logits, parameters, losses, tokens and
        log-probs all exactly equal).

    Raises:
        ValueError: the two settings' parameters or shapes do not match.
    """
    import torch

    if set(reference["params"]) != set(other["params"]):
        raise ValueError("the two settings have different parameter names")
    for key in ("logits", "tokens", "sampled_logprobs"):
        if reference[key].shape != other[key].shape:
            raise ValueError(
                f"{key} shapes differ: {tuple(reference[key].shape)} vs {tuple(other[key].shape)}"
            )
    differing = total = 0
    max_param_diff = 0.0
    for name, ref in reference["params"].items():
        oth = other["params"][name]
        if ref.shape != oth.shape:
            raise ValueError(f"parameter {name}: shapes differ: {tuple(ref.shape)} vs {tuple(oth.shape)}")
        differing += int((ref != oth).sum())
        total += ref.numel()
        max_param_diff = max(max_param_diff, float((ref.double() - oth.double()).abs().max()))
    logit_diff = float((reference["logits"].double() - other["logits"].double()).abs().max())
    same_tokens = reference["tokens"] == other["tokens"]
    token_agreement = float(same_tokens.double().mean())
    same_so_far = same_tokens.int().cumprod(dim=1).bool()  # no token differed up to and including here
    logprob_diffs = (reference["sampled_logprobs"].double() - other["sampled_logprobs"].double()).abs()
    logprob_diff = float(logprob_diffs[same_so_far].max()) if same_so_far.any() else 0.0
    bit_identical = (
        torch.equal(reference["logits"], other["logits"])
        and differing == 0
        and list(reference["losses"]) == list(other["losses"])
        and torch.equal(reference["tokens"], other["tokens"])
        and torch.equal(reference["sampled_logprobs"], other["sampled_logprobs"])
    )
    return {
        "max_abs_logit_diff_init": logit_diff,
        "param_fraction_differing": differing / total,
        "max_abs_param_diff": max_param_diff,
        "final_loss": float(other["losses"][-1]),
        "final_loss_diff": float(other["losses"][-1]) - float(reference["losses"][-1]),
        "token_agreement": token_agreement,
        "max_abs_sampled_logprob_diff": logprob_diff,
        "bit_identical": bit_identical,
    }


def run_setting(options: Options) -> dict[str, Any]:
    """One setting in this process (its kernels chosen by the environment it was started with): forward,
    steps, sampling; saves the tensors to ``<out>/<setting>.pt`` and returns the scalars."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.config import TinyModelConfig, TrainConfig

    config = TrainConfig()
    torch.set_num_threads(config.num_threads)
    model = AutoModelForCausalLM.from_pretrained(options.policy, dtype=torch.float32)
    ids = TinyModelConfig().vocab_size  # the BPE ids the tokenizer keeps
    generator = torch.Generator().manual_seed(0)
    probe = torch.randint(0, ids, (BATCH_ROWS, BATCH_TOKENS), generator=generator)
    corpus = [
        torch.randint(0, ids, (BATCH_ROWS, BATCH_TOKENS), generator=generator) for _ in range(NUM_BATCHES)
    ]
    prompts = torch.randint(0, ids, (SAMPLE_ROWS, PROMPT_TOKENS), generator=generator)
    with torch.no_grad():
        logits = model(probe).logits

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.warm_start.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / max(options.steps, 1))
    losses = []
    for step in range(options.steps):
        batch = corpus[step % NUM_BATCHES]
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.optim.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())

    sampler = torch.Generator().manual_seed(1)
    sequences, sampled_logprobs = prompts, []
    with torch.no_grad():
        for _ in range(options.sample_tokens):
            logprobs = torch.log_softmax(model(sequences, logits_to_keep=1).logits[:, -1], dim=-1)
            next_ids = torch.multinomial(logprobs.exp(), 1, generator=sampler)  # temperature 1
            sampled_logprobs.append(logprobs.gather(1, next_ids))
            sequences = torch.cat([sequences, next_ids], dim=1)
    tensors = {
        "logits": logits,
        "params": {name: p.detach().clone() for name, p in model.named_parameters()},
        "tokens": sequences[:, PROMPT_TOKENS:],
        "sampled_logprobs": torch.cat(sampled_logprobs, dim=1),
        "losses": losses,
    }
    torch.save(tensors, Path(options.out) / f"{options.child}.pt")
    return {
        "setting": options.child,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "losses": losses,
    }


def _child(options: Options, setting: str, capability: str | None, policy: Path, out: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", setting, "--policy", str(policy), "--out", str(out)]
    command += ["--steps", str(options.steps), "--sample-tokens", str(options.sample_tokens)]
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["OMP_NUM_THREADS"] = "1"
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"setting {setting} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["ATEN_CPU_CAPABILITY"] = capability
    result["seconds"] = time.perf_counter() - started
    return result


@dataclass
class Options:
    steps: int = option(40, "AdamW steps of language modelling")
    sample_tokens: int = option(32, "tokens sampled per sequence")
    out: str = option(str(RESULTS_DIR / "kernel_paths.json"), "result file")
    child: str | None = option(None, argparse.SUPPRESS)  # one setting, in this process
    policy: str | None = option(None, argparse.SUPPRESS)

    def __post_init__(self):
        if self.steps < 1 or self.sample_tokens < 1:
            raise ValueError("--steps and --sample-tokens must be >= 1")


def main(argv: list[str] | None = None) -> int:
    options = parse_config(Options, argv, __doc__.split("\n\n")[0])
    if options.child:
        print(json.dumps(run_setting(options)))
        return 0

    import torch
    from rich.console import Console
    from rich.table import Table

    from training.config import TinyModelConfig, TrainConfig
    from training.policy import build_tiny_policy

    started = time.time()
    config = TrainConfig()
    with tempfile.TemporaryDirectory(prefix="kernel_paths_") as tmp:
        policy = build_tiny_policy(Path(tmp) / "policy", TinyModelConfig())
        runs = [_child(options, name, capability, policy, Path(tmp)) for name, capability in SETTINGS]
        tensors = [torch.load(Path(tmp) / f"{r['setting']}.pt") for r in runs]
    results = {}
    for run, outputs in zip(runs, tensors, strict=True):
        results[run["setting"]] = {
            "ATEN_CPU_CAPABILITY": run["ATEN_CPU_CAPABILITY"] or "unset",
            "capability": run["capability"],
            **compare_runs(tensors[0], outputs),
            "seconds": run["seconds"],
        }

    table = Table(
        title=f"kernel paths vs '{SETTINGS[0][0]}': logits at init, params after {options.steps} AdamW "
        "steps, sampling at temperature 1"
    )
    for column in ("setting", "ISA"):
        table.add_column(column)
    columns = ("max |Δ logit|", "params ≠", "max |Δ param|", "final loss", "tokens =", "max |Δ logp|")
    for column in (*columns, "identical"):
        table.add_column(column, justify="right")
    for name, r in results.items():
        table.add_row(
            name,
            r["capability"],
            f"{r['max_abs_logit_diff_init']:.2e}",
            f"{r['param_fraction_differing']:.1%}",
            f"{r['max_abs_param_diff']:.2e}",
            f"{r['final_loss']:.6f}",
            f"{r['token_agreement']:.1%}",
            f"{r['max_abs_sampled_logprob_diff']:.2e}",
            "yes" if r["bit_identical"] else "no",
        )
    Console(width=120).print(table)

    out = save_result(
        {
            "benchmark": "kernel_paths",
            "command": " ".join(["python benchmarks/bench_kernel_paths.py", *(argv or sys.argv[1:])]),
            "reference_setting": SETTINGS[0][0],
            "steps": options.steps,
            "lr": config.warm_start.lr,
            "batch": f"{BATCH_ROWS} rows x {BATCH_TOKENS} tokens, {NUM_BATCHES} batches cycled",
            "sampled_tokens": SAMPLE_ROWS * options.sample_tokens,
            "results": results,
            "losses": {r["setting"]: r["losses"] for r in runs},
            "machine": machine_info(
                torch=torch.__version__,
                torch_threads=config.num_threads,
                load_average_1m=os.getloadavg()[0],
            ),
            "wall_seconds": time.time() - started,
        },
        options.out,
    )
    _plot(results, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def _plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{name}\n({r['capability']})" for name, r in results.items()]
    values = list(results.values())
    x = range(len(names))
    fig, (fraction_ax, diff_ax) = plt.subplots(1, 2, figsize=(10, 3.2))
    for offset, key, label in (
        (-0.2, "param_fraction_differing", "parameters differing"),
        (0.2, "token_agreement", "sampled tokens equal"),
    ):
        fraction_ax.bar([i + offset for i in x], [r[key] for r in values], 0.4, label=label)
    fraction_ax.set_ylim(0, 1.2)
    fraction_ax.set_title("fractions", fontsize=9)
    diffs = (
        ("max_abs_logit_diff_init", "logits at init"),
        ("max_abs_param_diff", "params after the steps"),
        ("max_abs_sampled_logprob_diff", "sampled tokens' log-probs"),
    )
    nonzero = [r[key] for r in values for key, _ in diffs if r[key] > 0]
    floor = min(nonzero, default=1e-6) / 100  # the axis floor: a bit-identical zero is written, not drawn
    for j, (key, label) in enumerate(diffs):
        offsets = [i + (j - 1) * 0.27 for i in x]
        diff_ax.bar(offsets, [r[key] or floor for r in values], 0.27, bottom=0, label=label)
        for position, r in zip(offsets, values, strict=True):
            if r[key] == 0:
                diff_ax.annotate("0", (position, floor), ha="center", va="bottom", fontsize=7)
    diff_ax.set_yscale("log")
    diff_ax.set_ylim(floor, max(nonzero, default=1.0) * 10)
    diff_ax.set_title("largest absolute difference (log scale; 0 = bit-identical)", fontsize=9)
    for ax in (fraction_ax, diff_ax):
        ax.set_xticks(list(x), names)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(
        f"vs '{next(iter(results))}': same machine and packages, only the kernels differ", fontsize=9
    )
    save_figure(fig, path)


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------

SPECS = (
    Benchmark(
        "kernel_paths",
        script_path(__file__),
        "Whether the CPU kernel path changes the quickstart policy's numbers (issue 20: the quickstart did "
        "not reproduce on a fresh machine): one process per `ATEN_CPU_CAPABILITY` setting (unset: the CPU's "
        "best kernels; unset again: a repeat; `default`: the generic code another CPU would take), each "
        "loading the same tiny policy for a forward pass, AdamW steps of language modelling at the warm "
        "start's learning rate and seeded sampling at temperature one; compared with the first setting: the "
        "largest logit and parameter differences, the share of parameters that differ, the final loss, the "
        "share of sampled tokens that agree, and whether the repeat is bit-identical.",
        "python benchmarks/bench_kernel_paths.py",
        ["--steps", "10"],
    ),
)


if __name__ == "__main__":
    sys.exit(main())
