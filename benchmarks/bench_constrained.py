"""Constrained decoding: the allowed tokens' output rows against the whole vocabulary.

With ``rollout.constrained_actions`` the policy is renormalised over the tokens that continue an admissible
command, so only those tokens' logits matter. :func:`training.sampling.output_projection` lets the sampler and
the trainer compute just those rows of the output layer; the fallback (FSDP2-sharded models) computes all the
vocabulary's logits and gathers. This benchmark times both on the same batch, in the same run: a constrained
sampling pass and a trainer forward + backward, for the quickstart's tiny policy (8.8M parameters with its
65,536-token vocabulary) and a 56M one (hidden 512, 7 layers), and checks that both paths give the same
log-probs.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_constrained.py
    python benchmarks/bench_constrained.py --rows 32 --repeats 2

Writes ``benchmarks/results/constrained.json`` and ``benchmarks/results/constrained.png``.
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

SHAPES = {
    "tiny": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2},
    "m25": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 7},
}
#: An ALFWorld bedroom's admissible commands (the shape of a real step: ~25 commands, shared prefixes).
COMMANDS = (
    [f"go to {r} 1" for r in ("bed", "desk", "drawer", "dresser", "garbagecan", "shelf", "sidetable")]
    + [f"take {o} 1 from shelf 1" for o in ("alarmclock", "book", "cd", "keychain", "pen", "pencil")]
    + [f"examine {o} 1" for o in ("alarmclock", "book", "cd")]
    + ["look", "inventory", "examine shelf 1", "use desklamp 1", "open drawer 1", "close drawer 1"]
)


def _policy(shape: dict, folder: str):
    from training.config import TinyModelConfig
    from training.policy import build_tiny_policy, load_policy

    build_tiny_policy(folder, TinyModelConfig(**shape))
    return load_policy(folder, device="cpu")


def run_shape(name: str, settings: Settings) -> dict:
    import torch

    from agents.projection import demonstration_text
    from training import decoding, sampling
    from training.rollout import response_token_ids

    with tempfile.TemporaryDirectory() as folder:
        policy = _policy(SHAPES[name], folder)
    tok, model = policy.tokenizer, policy.model
    candidates = [response_token_ids(tok, demonstration_text(c)) for c in COMMANDS]
    prompt_text = (
        "Step 1: You are in the middle of a room. Looking quickly around you, you see a bed 1, a desk 1, "
        "a drawer 1, a dresser 1, a garbagecan 1, a shelf 1, and a sidetable 1.\nActions: "
        + " | ".join(COMMANDS)
        + "\nTask: put some alarmclock on desk."
    )
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": prompt_text}], add_generation_prompt=True, tokenize=False
    )
    prompts = [tok(prompt, add_special_tokens=False)["input_ids"]] * settings.rows
    fast_projection = sampling.output_projection
    full_vocabulary = lambda model: None  # noqa: E731 - the fallback path, as under FSDP2

    def timed(projection) -> dict:
        sampling.output_projection = decoding.output_projection = projection
        try:
            sample_s, update_s = [], []
            for repeat in range(settings.repeats):
                started = time.perf_counter()
                out = decoding.sample_responses(
                    model,
                    prompts,
                    max_new_tokens=40,
                    stop_token_ids=policy.stop_token_ids,
                    pad_token_id=tok.pad_token_id,
                    seeds=[repeat * len(prompts) + k for k in range(len(prompts))],
                    candidates=[candidates] * len(prompts),
                )
                sample_s.append(time.perf_counter() - started)
                packed = sampling.pack_sequences(prompts, out.token_ids, tok.pad_token_id)
                started = time.perf_counter()
                model.zero_grad()
                logprobs, entropy = sampling.policy_logprobs_and_entropy(
                    model, packed, out.token_ids, [candidates] * len(prompts)
                )
                ((logprobs + 0.01 * entropy) * packed.response_mask).sum().backward()
                update_s.append(time.perf_counter() - started)
            return {
                "sample_seconds": min(sample_s),
                "update_seconds": min(update_s),
                "out": out,
                "packed": packed,
            }
        finally:
            sampling.output_projection = decoding.output_projection = fast_projection

    fast, full = timed(fast_projection), timed(full_vocabulary)

    def trainer_logprobs(projection, run: dict) -> torch.Tensor:  # both paths on the same sampled tokens
        sampling.output_projection = projection
        try:
            with torch.no_grad():
                return sampling.policy_logprobs(
                    model, run["packed"], run["out"].token_ids, [candidates] * len(prompts)
                )
        finally:
            sampling.output_projection = fast_projection

    on_fast, on_full = trainer_logprobs(fast_projection, fast), trainer_logprobs(full_vocabulary, fast)
    recorded_diff = max(
        abs(a - b)
        for row, rec in enumerate(fast["out"].logprobs)
        for a, b in zip(rec, on_full[row, : len(rec)].tolist(), strict=True)
    )
    return {
        "model": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocabulary": model.get_output_embeddings().weight.shape[0],
        "rows": settings.rows,
        "full_vocabulary": {k: full[k] for k in ("sample_seconds", "update_seconds")},
        "allowed_rows": {k: fast[k] for k in ("sample_seconds", "update_seconds")},
        "sample_speedup": full["sample_seconds"] / fast["sample_seconds"],
        "update_speedup": full["update_seconds"] / fast["update_seconds"],
        # the sampler's recorded log-probs and the fast trainer path, against the full vocabulary's (same
        # tokens)
        "max_logprob_difference": max(recorded_diff, float((on_fast - on_full).abs().max())),
    }


@dataclass
class Settings:
    models: list[str] = option(list(SHAPES), "policy shapes to run", choices=list(SHAPES))
    rows: int = option(64, "constrained responses per batch")
    repeats: int = option(2, "timed repeats (the fastest is kept)")
    out: str = option(str(RESULTS_DIR / "constrained.json"), "result file (the plot is written beside it)")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.splitlines()[0])
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    started = time.time()
    results = [run_shape(name, settings) for name in settings.models]
    header = (
        f"{'model':6} {'vocab':>7} {'sample full/rows (s)':>22} {'x':>5} "
        f"{'update full/rows (s)':>22} {'x':>5}"
    )
    print(header)
    for r in results:
        full, fast = r["full_vocabulary"], r["allowed_rows"]
        print(
            f"{r['model']:6} {r['vocabulary']:>7} "
            f"{full['sample_seconds']:>10.2f} / {fast['sample_seconds']:<9.2f} {r['sample_speedup']:>5.1f} "
            f"{full['update_seconds']:>10.2f} / {fast['update_seconds']:<9.2f} {r['update_speedup']:>5.1f}"
        )
    out = save_result(
        {
            "benchmark": "constrained",
            "command": "python benchmarks/bench_constrained.py " + " ".join(argv or sys.argv[1:]),
            "args": asdict(settings),
            "results": results,
            "machine": machine_info(torch=torch.__version__, torch_threads=torch.get_num_threads()),
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

    fig, axes = plt.subplots(1, 2, figsize=(7, 3))
    for ax, key, title in zip(
        axes, ("sample_seconds", "update_seconds"), ("sampling", "forward + backward"), strict=True
    ):
        names = [r["model"] for r in results]
        width = 0.38
        xs = range(len(names))
        ax.bar([x - width / 2 for x in xs], [r["full_vocabulary"][key] for r in results], width, label="full")
        ax.bar(
            [x + width / 2 for x in xs],
            [r["allowed_rows"][key] for r in results],
            width,
            label="allowed rows",
        )
        ax.set_xticks(list(xs), names)
        ax.set_title(title)
        ax.set_ylabel("seconds")
    axes[0].legend()
    save_figure(fig, path)


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------

SPECS = (
    Benchmark(
        "constrained",
        script_path(__file__),
        "Constrained decoding: computing only the allowed tokens' output rows against the full vocabulary's "
        "logits, same batch, same run (sampling, and a trainer forward + backward), for the tiny and a "
        "larger policy (their parameters in the table; both with the quickstart's 65,536-token vocabulary); "
        "the log-prob difference between the paths.",
        "python benchmarks/bench_constrained.py",
        ["--models", "tiny", "--rows", "16", "--repeats", "1"],
    ),
)


if __name__ == "__main__":
    sys.exit(main())
