"""Checks shared by the tests that run ``progpo eval`` against an OpenAI-compatible server (fake or vLLM).

:func:`check_run` reads an eval folder and asserts what every such run must hold: one line per task index,
every step's request (the prompt) and response (the raw output) recorded, and ``summary.json`` equal to the
numbers recomputed here from the trajectories (not through :mod:`agents.report`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def read_records(out: Path) -> list[dict]:
    """The episode records of ``out/trajectories.jsonl``, by task index."""
    lines = (Path(out) / "trajectories.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["task_index"])


def check_run(out: Path, episodes: int) -> tuple[dict, list[dict]]:
    """Assert the run in ``out`` is complete and consistent; returns ``(summary, records)``."""
    records = read_records(out)
    summary = json.loads((Path(out) / "summary.json").read_text())
    assert [r["task_index"] for r in records] == list(range(episodes))
    steps = [s for r in records for s in r["trajectory"]]
    for record in records:
        assert record["steps"] == len(record["trajectory"]) > 0
        assert [s["step"] for s in record["trajectory"]] == list(range(record["steps"]))
        assert record["terminated"] or record["truncated"]
    for step in steps:  # the request and the response of every step
        assert step["prompt"] and all(m["role"] and m["content"] for m in step["prompt"])
        assert isinstance(step["raw_output"], str) and isinstance(step["action"], str)
    assert summary["episodes"] == episodes
    assert summary["actions"] == len(steps)
    assert summary["success_rate"] == pytest.approx(sum(r["won"] for r in records) / episodes)
    assert summary["mean_score"] == pytest.approx(sum(r["score"] for r in records) / episodes)
    assert summary["mean_steps"] == pytest.approx(len(steps) / episodes)
    assert summary["invalid_action_rate"] == pytest.approx(sum(not s["valid"] for s in steps) / len(steps))
    assert summary["prompt_tokens"] == sum(s["prompt_tokens"] for s in steps)
    assert summary["completion_tokens"] == sum(s["completion_tokens"] for s in steps)
    return summary, records


def prompt_key(messages: list[dict]) -> str:
    """A canonical text of a chat request's messages (to match server-side requests with recorded steps)."""
    return json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False)
