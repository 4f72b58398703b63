"""Evaluation-harness speed: its overhead over stepping the env directly, and OpenAI-agent throughput.

1. **Harness overhead** (target < 10%): ``agents.evaluate.evaluate`` with the expert agent on one env copy,
   against a baseline in the same run that resets a plain ``gym.make`` env to the same tasks and seeds and
   steps it with the same actions (read back from the harness's trajectories; the baseline checks it reaches
   the same outcomes). Both use the same env instances' settings (``expert=True``, so the env does the same
   work); env construction is outside both timings. ``loop overhead`` leaves out the final report (summary,
   Markdown, PNG: a fixed cost per run, also shown); ``total overhead`` includes it. Times are this
   process's CPU time (``time.process_time``: steadier than wall time on a shared machine; everything here
   runs in this process, sync mode), minimum over the repeats (5; 2 with ``--quick``) after one warm-up
   round; "vector env step" replays the same actions
   through the one-copy vector env's Gymnasium ``step`` (batched infos; no agent, no records). The harness
   itself takes ``GroupVectorEnv.step_copies`` and skips batching, so it can beat that.
2. **OpenAI agent**: WebShop episodes through an OpenAI-compatible endpoint served by a separate process on a
   loopback port (a scripted model with a fixed ``--latency`` per request, standing in for a model server),
   with ``num_envs`` = 32 copies and the agent's ``concurrency`` at 1, 8 and 32.

Run: ``.venv/bin/python benchmarks/bench_eval.py`` (``--quick`` for a short run). Writes
``benchmarks/results/eval.json`` and ``benchmarks/results/eval.png``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import gymnasium as gym
from rich.console import Console
from rich.table import Table

import agents.evaluate as evaluate_module
import progpo_envs  # noqa: F401
from agents.evaluate import EvalConfig, evaluate
from agents.llm_config import OpenAIConfig
from agents.report import write_reports
from benchmarks.common import RESULTS_DIR, machine_info, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path

REPO = Path(__file__).resolve().parents[1]


def _records(out: Path) -> list[dict]:
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["task_index"])


def replay_directly(env: gym.Env, records: list[dict]) -> float:
    """CPU seconds to play every recorded episode again by stepping ``env`` with the recorded actions."""
    start = time.process_time()
    for record in records:
        env.reset(seed=record["seed"], options={"task_index": record["task_index"]})
        info: dict = {}
        for step in record["trajectory"]:
            _, _, _, _, info = env.step(step["action"])
        if bool(info.get("won", False)) != record["won"]:
            raise RuntimeError(f"direct replay of task {record['task_index']} disagrees with the harness")
    return time.process_time() - start


def replay_vectorised(envs: gym.vector.VectorEnv, records: list[dict]) -> float:
    """CPU seconds to replay the episodes through a one-copy vector env's ``step`` (no agent, no records)."""
    start = time.process_time()
    for record in records:
        envs.reset(seed=record["seed"], options={"task_indices": [record["task_index"]]})
        for step in record["trajectory"]:
            envs.step([step["action"]])
    return time.process_time() - start


def timed_evaluate(config: EvalConfig, envs: gym.vector.VectorEnv) -> tuple[float, float]:
    """CPU seconds of ``evaluate`` and of the report it writes at its end (timed inside that same call)."""
    report_times: list[float] = []

    def timed_reports(*args, **kwargs):
        start = time.process_time()
        try:
            return write_reports(*args, **kwargs)
        finally:
            report_times.append(time.process_time() - start)

    with mock.patch.object(evaluate_module, "write_reports", timed_reports):
        start = time.process_time()
        evaluate(config, envs=envs, progress=False)
        total = time.process_time() - start
    return total, report_times[-1]


def bench_overhead(name: str, env_id: str, env_kwargs: dict, episodes: int, repeats: int, tmp: Path) -> dict:
    kwargs = {**env_kwargs, "expert": True}
    vector = gym.make_vec(env_id, num_envs=1, group_size=1, **kwargs)
    single = gym.make(env_id, **kwargs)
    harness_s, report_s, loop_s, direct_s, vector_s = [], [], [], [], []
    try:
        for repeat in range(repeats + 1):  # the first round warms caches and is not counted
            out = tmp / f"{name}-{repeat}"
            config = EvalConfig(
                env_id=env_id, agent="expert", out_dir=str(out), episodes=episodes, env_kwargs=env_kwargs
            )
            harness, report = timed_evaluate(config, vector)
            records = _records(out)
            direct = replay_directly(single, records)
            vectorised = replay_vectorised(vector, records)
            if repeat:
                vector_s.append(vectorised)
                harness_s.append(harness)
                report_s.append(report)
                loop_s.append(harness - report)  # the same call's report: no mix of two runs' minima
                direct_s.append(direct)
    finally:
        vector.close()
        single.close()
    # the minimum over repeats: the run least disturbed by other load on a shared machine (as timeit advises)
    harness, report, loop, direct, vectorised = (
        min(x) for x in (harness_s, report_s, loop_s, direct_s, vector_s)
    )
    steps = sum(r["steps"] for r in records)
    return {
        "env": name,
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "episodes": episodes,
        "steps": steps,
        "repeats": repeats,
        "harness_s": harness,
        "report_s": report,
        "loop_s": loop,
        "direct_s": direct,
        "vector_direct_s": vectorised,
        "harness_episodes_per_s": episodes / harness,
        "direct_episodes_per_s": episodes / direct,
        "loop_overhead": loop / direct - 1,
        "total_overhead": harness / direct - 1,
        # the cost of the vector env's Gymnasium step (dict-of-arrays infos) over stepping directly
        "vector_env_overhead": vectorised / direct - 1,
        "loop_overhead_over_vector_env": loop / vectorised - 1,
    }


# --- OpenAI-compatible endpoint in its own process
# ---------------------------------------------------------------
_QUOTED = re.compile(r"'([^'\n]+)'")


def _serve(port_queue, latency_s: float) -> None:
    import logging

    from flask import Flask, jsonify, request
    from werkzeug.serving import make_server

    app = Flask("bench-openai")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    @app.post("/v1/chat/completions")
    def chat():
        body = request.get_json(force=True)
        content = body["messages"][-1]["content"]
        listed = _QUOTED.findall(content[content.rfind("admissible actions") :])
        clicks = [a for a in listed if a.startswith("click[") and a != "click[back to search]"]
        action = clicks[0] if clicks else "search[comfortable cotton shirt]"
        time.sleep(latency_s)
        text = f"<think>Pick the first item.</think><action>{action}</action>"
        return jsonify(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
                ],
                "usage": {"prompt_tokens": len(content) // 4, "completion_tokens": len(text) // 4},
            }
        )

    server = make_server("127.0.0.1", 0, app, threaded=True)
    port_queue.put(server.server_port)
    server.serve_forever()


def bench_openai(
    concurrencies: list[int], num_envs: int, max_steps: int, latency_s: float, env_kwargs: dict, tmp: Path
) -> list[dict]:
    ctx = mp.get_context("spawn")
    port_queue = ctx.Queue()
    server = ctx.Process(target=_serve, args=(port_queue, latency_s), daemon=True)
    server.start()
    rows = []
    try:
        base_url = f"http://127.0.0.1:{port_queue.get(timeout=60)}/v1"
        vector = gym.make_vec(
            "progpo/WebShop-v0", num_envs=num_envs, group_size=1, max_steps=max_steps, **env_kwargs
        )
        try:
            for concurrency in concurrencies:
                out = tmp / f"openai-{concurrency}"
                config = EvalConfig(
                    env_id="progpo/WebShop-v0",
                    agent="openai",
                    out_dir=str(out),
                    episodes=num_envs,
                    num_envs=num_envs,
                    max_steps=max_steps,
                    env_kwargs=env_kwargs,
                    openai=OpenAIConfig(model="bench", base_url=base_url, concurrency=concurrency),
                )
                start = time.perf_counter()
                summary = evaluate(config, envs=vector, progress=False)
                seconds = time.perf_counter() - start
                requests = summary["actions"]
                rows.append(
                    {
                        "concurrency": concurrency,
                        "episodes": summary["episodes"],
                        "requests": requests,
                        "seconds": seconds,
                        "episodes_per_s": summary["episodes"] / seconds,
                        "requests_per_s": requests / seconds,
                        "latency_s": latency_s,
                    }
                )
        finally:
            vector.close()
    finally:
        server.terminate()
        server.join(timeout=10)
    for row in rows:
        row["speedup_vs_concurrency_1"] = row["episodes_per_s"] / rows[0]["episodes_per_s"]
    return rows


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=100)
    names = [r["env"] for r in result["overhead"]]
    x = range(len(names))
    left.bar(
        [i - 0.2 for i in x],
        [1 + r["vector_env_overhead"] for r in result["overhead"]],
        0.4,
        label="vector env step (batched infos)",
        color="#9ecae1",
    )
    left.bar(
        [i + 0.2 for i in x],
        [1 + r["loop_overhead"] for r in result["overhead"]],
        0.4,
        label="harness (without report)",
        color="#1f77b4",
    )
    left.axhline(1 + result["overhead_target"], color="red", linestyle="--", linewidth=1, label="target")
    left.axhline(1, color="black", linewidth=0.8)
    left.set_xticks(list(x), names)
    left.set_ylabel("time / direct stepping")
    left.set_title("expert agent: time relative to stepping the env directly", fontsize=9)
    left.legend(fontsize=7)
    rows = result["openai"]
    right.bar([str(r["concurrency"]) for r in rows], [r["episodes_per_s"] for r in rows], color="#fd8d3c")
    right.set_xlabel("concurrency")
    right.set_ylabel("episodes / s")
    right.set_title(f"OpenAI agent, {rows[0]['latency_s'] * 1000:.0f} ms/request endpoint", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@dataclass
class Settings:
    quick: bool = option(False, "fewer episodes and repeats")
    latency: float = option(0.05, "seconds per request of the scripted endpoint")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])
    console = Console()
    repeats = 2 if settings.quick else 5
    webshop_kwargs = {"split": "test", "num_products": 200}
    alfworld_kwargs = {"split": "train"}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        overhead = [
            bench_overhead(
                "webshop", "progpo/WebShop-v0", webshop_kwargs, 20 if settings.quick else 50, repeats, tmp
            ),
            bench_overhead(
                "alfworld", "progpo/ALFWorld-v0", alfworld_kwargs, 6 if settings.quick else 12, repeats, tmp
            ),
        ]
        openai_rows = bench_openai(
            [1, 8, 32], 32, 3 if settings.quick else 5, settings.latency, webshop_kwargs, tmp
        )
    result = {
        "benchmark": "eval",
        "machine": machine_info(),
        "overhead_target": 0.10,
        "overhead": overhead,
        "openai": openai_rows,
    }
    out = save_result(result, RESULTS_DIR / "eval.json")
    plot(result, out.with_suffix(".png"))

    table = Table(title="harness overhead (expert agent, 1 env copy)")
    for column in (
        "env",
        "episodes",
        "steps",
        "direct ep/s",
        "harness ep/s",
        "loop overhead",
        "total overhead",
        "vector env step",
        "report s",
    ):
        table.add_column(column, justify="right")
    for r in overhead:
        table.add_row(
            r["env"],
            str(r["episodes"]),
            str(r["steps"]),
            f"{r['direct_episodes_per_s']:.1f}",
            f"{r['harness_episodes_per_s']:.1f}",
            f"{r['loop_overhead']:+.1%}",
            f"{r['total_overhead']:+.1%}",
            f"{r['vector_env_overhead']:+.1%}",
            f"{r['report_s']:.2f}",
        )
    console.print(table)
    table = Table(
        title=f"OpenAI agent on WebShop, 32 env copies, {settings.latency * 1000:.0f} ms/request endpoint"
    )
    for column in ("concurrency", "episodes", "requests", "seconds", "episodes/s", "requests/s", "speedup"):
        table.add_column(column, justify="right")
    for r in openai_rows:
        table.add_row(
            str(r["concurrency"]),
            str(r["episodes"]),
            str(r["requests"]),
            f"{r['seconds']:.2f}",
            f"{r['episodes_per_s']:.2f}",
            f"{r['requests_per_s']:.1f}",
            f"{r['speedup_vs_concurrency_1']:.1f}x",
        )
    console.print(table)
    console.print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------

SPECS = (
    Benchmark(
        "eval",
        script_path(__file__),
        "Evaluation harness overhead over stepping the env directly; OpenAI-compatible agent throughput at "
        "concurrency 1/8/32.",
        "python benchmarks/bench_eval.py",
        ["--quick"],
    ),
)


if __name__ == "__main__":
    raise SystemExit(main())
