"""Summary numbers, a Markdown report and a bar chart from the episode records of an evaluation run.

Success is ``info["won"]`` at the episode's last step (verl-agent's ``success_evaluator``). ALFWorld success
is also reported per task type, grouped into the six families of the papers by the task type's name
(verl-agent matches the same substrings in the game file name): pick, look, clean, heat, cool, pick_two.
WebShop's ``mean_score`` is the mean raw task score (``info["task_score"]``, 0–1) at the last step; for envs
without a score it is the success rate.

Episodes that ended with an agent error (a record with ``error``: an LLM request that failed, or the env
server the episode played on lost under it) are not scored: every rate is over the episodes played to their
end (``episodes``), and ``errors`` counts the others, so an unreachable endpoint never reads as a weak agent.
A run on several env servers has each one's state and share in ``servers`` (and a table in the report).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: (family, substring of the task type) in matching order: more specific names first.
TASK_FAMILIES = (
    ("pick_two", "pick_two_obj"),
    ("clean", "clean"),
    ("heat", "heat"),
    ("cool", "cool"),
    ("look", "look_at_obj"),
    ("pick", "pick_and_place"),
)
#: ALFWorld's numeric task types (alfworld ``TASK_TYPES``).
_NUMBERED = {"1": "pick", "2": "look", "3": "clean", "4": "heat", "5": "cool", "6": "pick_two"}

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
CHART_FILE = "success.png"


def task_family(task_type: str) -> str:
    """``"pick_heat_then_place_in_recep"`` → ``"heat"``; unknown types are returned unchanged."""
    if task_type in _NUMBERED:
        return _NUMBERED[task_type]
    lowered = task_type.lower()
    for family, needle in TASK_FAMILIES:
        if needle in lowered or lowered == family:
            return family
    return task_type


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def summarize(
    records: Sequence[dict[str, Any]],
    config: Any = None,
    *,
    planned: int | None = None,
    allowed_errors: int | None = None,
    servers: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The summary numbers of a list of episode records (see ``agents.evaluate``).

    Args:
        records: Episode records, errored ones included (they are counted, not scored).
        config: The run's settings (env, agent, model, split, seed are copied in, and the answer mode of an
            LLM agent: ``free`` or ``guided``, ``None`` for the scripted agents).
        planned: Episodes the run was to play (``None``: as many as ``records``).
        allowed_errors: Errored episodes the run tolerates (``failed`` says whether there were more).
        servers: Each env server's state and share, when the run played on several (the summary's
            ``servers``).
    """
    errored = [r for r in records if r.get("error") is not None]
    records = [r for r in records if r.get("error") is None]
    decisions = sum(r["steps"] for r in records)
    families: dict[str, list[bool]] = {}
    for r in records:
        if r.get("task_type"):
            families.setdefault(task_family(str(r["task_type"])), []).append(bool(r["won"]))
    order = [f for f, _ in TASK_FAMILIES] + sorted(set(families) - {f for f, _ in TASK_FAMILIES})
    summary: dict[str, Any] = {
        "env_id": getattr(config, "env_id", None),
        "agent": getattr(config, "agent", None),
        "mode": getattr(config, "answer_mode", None),
        "model": getattr(config, "model", None),
        "split": getattr(config, "split", None),
        "seed": getattr(config, "seed", None),
        "episodes": len(records),
        "success_rate": _mean([float(r["won"]) for r in records]),
        "per_task_type": {f: _mean([float(w) for w in families[f]]) for f in order if f in families},
        "per_task_type_episodes": {f: len(families[f]) for f in order if f in families},
        "mean_score": _mean([float(r["score"]) for r in records]),
        "mean_return": _mean([float(r["return"]) for r in records]),
        "mean_steps": _mean([float(r["steps"]) for r in records]),
        "actions": decisions,
        "invalid_action_rate": sum(r["invalid_actions"] for r in records) / decisions if decisions else 0.0,
        "inadmissible_action_rate": sum(r["inadmissible_actions"] for r in records) / decisions
        if decisions
        else 0.0,
        "truncated_rate": _mean([float(r["truncated"]) for r in records]),
        "prompt_tokens": sum(r["prompt_tokens"] for r in records),
        "completion_tokens": sum(r["completion_tokens"] for r in records),
    }
    summary["tokens"] = summary["prompt_tokens"] + summary["completion_tokens"]
    summary["errors"] = len(errored)
    summary["episodes_planned"] = planned if planned is not None else len(records) + len(errored)
    summary["allowed_errors"] = allowed_errors
    summary["failed"] = allowed_errors is not None and len(errored) > allowed_errors
    summary["first_error"] = errored[0]["error"] if errored else None
    if servers:
        summary["servers"] = [dict(server) for server in servers]
    return summary


def plot_success(summary: dict[str, Any], path: Path) -> None:
    """A bar chart: overall success, success per task type (if any) and mean score."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["overall"] + list(summary["per_task_type"]) + ["mean score"]
    values = [summary["success_rate"]] + list(summary["per_task_type"].values()) + [summary["mean_score"]]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(labels)), 3.2), dpi=100)
    bars = ax.bar(labels, values, color=["#1f77b4"] + ["#6baed6"] * (len(labels) - 2) + ["#fd8d3c"])
    for bar, value in zip(bars, values, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, value + 0.02, f"{value:.2f}", ha="center", fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("success rate / score")
    ax.set_title(f"{summary['env_id']} · {summary['agent']} · {summary['episodes']} episodes", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render_markdown(summary: dict[str, Any]) -> str:
    """The report page."""
    lines = [
        f"# Evaluation: {summary['env_id']} with the {summary['agent']} agent",
        "",
        f"Model: `{summary['model'] or '-'}` · mode: {summary.get('mode') or '-'} · "
        f"split: `{summary['split'] or 'default'}` · seed: {summary['seed']}",
        "",
        "| metric | value |",
        "|---|---|",
        f"| episodes | {summary['episodes']} |",
        f"| success rate | {summary['success_rate']:.4f} |",
        f"| mean score | {summary['mean_score']:.4f} |",
        f"| mean steps | {summary['mean_steps']:.2f} |",
        f"| invalid-action rate | {summary['invalid_action_rate']:.4f} |",
        f"| inadmissible-action rate | {summary['inadmissible_action_rate']:.4f} |",
        f"| truncated episodes | {summary['truncated_rate']:.4f} |",
        f"| tokens (prompt + completion) | {summary['prompt_tokens']} + {summary['completion_tokens']} |",
        "",
    ]
    if summary.get("errors"):
        lines += [
            f"**{summary['errors']} of {summary['episodes_planned']} episodes ended with an agent error** "
            f"(not scored above; rerun with the same `--out` to play them again). The first: "
            f"`{summary['first_error']}`",
            "",
        ]
    if summary.get("servers"):
        lines += [
            "## Env servers",
            "",
            "| server | state | groups | sessions | episodes its failures ended | groups lost there |",
            "|---|---|---|---|---|---|",
        ]
        for server in summary["servers"]:
            lines.append(
                f"| {server['url']} | {server['state']} | {server['groups']} | {server['sessions']} | "
                f"{server['failed_episodes']} | {server['lost_groups']} |"
            )
        lines.append("")
    if summary["per_task_type"]:
        lines += ["## Success per task type", "", "| task type | episodes | success rate |", "|---|---|---|"]
        for family, rate in summary["per_task_type"].items():
            lines.append(f"| {family} | {summary['per_task_type_episodes'][family]} | {rate:.4f} |")
        lines.append("")
    lines += [
        f"![success]({CHART_FILE})",
        "",
        "Trajectories: `trajectories.jsonl` (one episode per line).",
        "",
    ]
    return "\n".join(lines)


def write_reports(
    out_dir: Path, records: Sequence[dict[str, Any]], config: Any = None, **counts: Any
) -> dict[str, Any]:
    """Write ``summary.json``, ``report.md`` and ``success.png`` into ``out_dir``; returns the summary
    (``counts``: :func:`summarize`'s ``planned``, ``allowed_errors`` and ``servers``)."""
    summary = summarize(records, config, **counts)
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    plot_success(summary, out_dir / CHART_FILE)
    (out_dir / REPORT_FILE).write_text(render_markdown(summary))
    return summary
