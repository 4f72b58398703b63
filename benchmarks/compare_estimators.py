"""Estimator comparison at equal compute: the same policy, warm start, iterations, groups, group size and
seeds, trained with each advantage estimator (issue 8, part 1).

For every env the warm start runs **once** (``progpo train`` with ``iterations=0``: next-token prediction on
the expert demonstrations' prompts, behaviour cloning on their actions, its held-out evaluation, then export);
every (estimator, seed) run starts RL from that exported policy (``model.path=<warm start>/final``,
``warm_start.enabled=false``, ``eval.before_rl=false``) with identical settings, so runs differ only in
estimator and RL seed (task draws, sampling), and the spread over seeds is the RL noise. Each run is a
``python -m training.cli`` subprocess (``--jobs`` at once); its ``metrics.jsonl`` gives the learning curves
(training success per iteration; WebShop's purchase score too) and the held-out evaluation after RL:
success overall and per task type, WebShop score, invalid-action rate, mean episode steps (all episodes) and
steps to success (won episodes only); with the quickstart's RL task pool (``rollout.task_pool``,
``eval.rl_tasks``) also ``rl_tasks_success``, the success on the tasks RL trained on. The table shows mean ±
sample std over seeds; **every started run is listed**, failed and timed-out ones included, and is left out of
the means only because it has no result.

Settings (``--setting``; their keys are in ``benchmarks/settings/compare_estimators.yaml``):

* ``smoke``: 1 seed, GRPO + ProGPO, 1 iteration, tiny groups — checks the pipeline (a few minutes on CPU).
* ``cpu``: the quick comparison, 3 seeds × 7 estimators on the quickstart (generated ALFWorld tasks of two
  types, the tiny policy and its warm start, 10 RL iterations each, evaluated in the held-out bedroom
  FloorPlan308) and on WebShop goals (a 200-product generated catalog, 6 iterations each), two runs at a
  time: under 60 minutes on 2 cores.
* ``cpu_quickstart_rl``: the cpu setting's ALFWorld half with the quickstart's RL (30 iterations at learning
  rate 3e-4 instead of 10 at 1e-3) for GRPO, GiGPO and ProGPO, 3 seeds: 31 minutes on 2 cores (measured).
* ``quickstart_ablation``: ProGPO's reconstruction choices on the quickstart itself (its embedded defaults:
  30 RL iterations, held-out ``valid_seen`` tasks and RL's own 8 tasks), 3 seeds, paired with GRPO: the
  first reading's defaults, each later change alone, and the current defaults (``progpo``). Estimators
  are specs, ``name:key=value,...`` (:func:`benchmarks.lib.credit.parse_estimator_spec`), each
  spelling out every ablated parameter so that a later change of a default does not change what a row
  measured. About 45 minutes on 2 cores.
* ``gpu``: the larger setting: ALFWorld (all six task types, trained in every training scene, evaluated in
  ``valid_unseen``'s four held-out scenes) and WebShop, a ~25M-parameter policy (or ``--model-path`` to a
  local causal LM folder), 30 iterations of 8 groups × 8, 3 seeds.

ALFWorld's held-out evaluation is always ``valid_unseen`` (rooms RL never trained in), as the papers report
it.

Run: ``.venv/bin/python benchmarks/compare_estimators.py --setting cpu``. Writes
``benchmarks/results/compare_estimators.json`` and ``compare_estimators.png`` (learning curves); run folders
under ``runs/compare_estimators/<setting>/``. Reproduce a number with the command recorded in the JSON.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import re

import numpy as np
import yaml

from benchmarks.common import (
    RESULTS_DIR,
    git_commit,
    machine_info,
    mean_spread,
    paired_differences,
    save_figure,
    save_result,
)
from benchmarks.harness import Benchmark, option, parse_config, script_path
from benchmarks.lib.credit import parse_estimator_spec
from benchmarks.lib.markdown import fmt, markdown_table
from training.metrics import HELD_OUT_EVAL_KIND, RL_TASKS_EVAL_KIND

ROOT = Path(__file__).resolve().parents[1]

#: Headline metrics, in table order: held-out evaluation (``success_steps``: steps to success, won episodes
#: only), then success on RL's own task pool (``eval.rl_tasks``, when the setting has one); per-task-type
#: held-out success is added when present.
METRICS = [
    "success",
    "rl_tasks_success",
    "task_score",
    "score",
    "invalid_rate",
    "episode_steps",
    "success_steps",
]


@dataclass
class Setting:
    """One comparison setting; ``overrides`` are ``progpo train`` keys for every run (warm start and RL)."""

    envs: list[str]
    seeds: list[int]
    estimators: list[str]
    overrides: list[str]
    env_overrides: dict[str, list[str]] = field(default_factory=dict)
    timeout_s: float = 3600.0
    jobs: int = 1


#: The comparison's settings, its estimator list and the per-env keys of every setting, in YAML.
SETTINGS_FILE = Path(__file__).with_name("settings") / "compare_estimators.yaml"


def load_settings(path: Path = SETTINGS_FILE) -> tuple[list[str], dict[str, list[str]], dict[str, Setting]]:
    """``(estimators, env_overrides, settings)`` of a settings file (``SETTINGS_FILE``'s header says its
    form); each setting's ``overrides`` begin with the file's ``common`` keys."""
    data = yaml.safe_load(path.read_text())
    settings = {
        name: Setting(**{**entry, "overrides": [*data["common"], *entry["overrides"]]})
        for name, entry in data["settings"].items()
    }
    return data["estimators"], data["env_overrides"], settings


ESTIMATORS, ENV_OVERRIDES, SETTINGS = load_settings()


def train_command(overrides: list[str]) -> list[str]:
    """The ``progpo train`` subprocess command with ``overrides``."""
    return [sys.executable, "-m", "training.cli", *overrides]


def estimator_overrides(spec: str) -> list[str]:
    """``progpo train`` keys for an estimator spec (``name`` or ``name:key=value,...``).

    Example:
        >>> estimator_overrides("progpo:success_potential=0")
        ['algo.name=progpo', 'algo.params={"success_potential": 0}']
    """
    name, params = parse_estimator_spec(spec)
    return [f"algo.name={name}", *([f"algo.params={json.dumps(params)}"] if params else [])]


def run_folder_name(spec: str) -> str:
    """A folder name for an estimator spec (``:`` and ``,`` are awkward in paths and shells).

    Example:
        >>> run_folder_name("progpo:success_potential=0,semantic=exact")
        'progpo__success_potential=0__semantic=exact'
    """
    return spec.replace(":", "__").replace(",", "__")


def finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a finished ``progpo train`` run (its ``summary.json``, written last)."""
    return (run_dir / "summary.json").is_file()


def command_text(overrides: list[str], run_dir: Path) -> str:
    """The recorded form of a run's command (``python -m training.cli ...``)."""
    return shlex.join(["python", "-m", "training.cli", *overrides, f"run_dir={run_dir}"])


def reused_record(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """The record of a finished run kept by ``--reuse`` (its time was not measured by this invocation)."""
    return {
        "status": "ok",
        "returncode": 0,
        "seconds": None,
        "reused": True,
        "command": command_text(overrides, run_dir),
    }


def run_training(overrides: list[str], run_dir: Path, timeout_s: float, log_path: Path) -> dict[str, Any]:
    """Run ``progpo train`` in a subprocess; returns ``{status, returncode, seconds, command}``."""
    command = train_command([*overrides, f"run_dir={run_dir}"])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    start = time.perf_counter()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        try:
            proc = subprocess.run(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
            )
            status = "ok" if proc.returncode == 0 else "failed"
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            status, returncode = "timeout", None
    return {
        "status": status,
        "returncode": returncode,
        "seconds": time.perf_counter() - start,
        "command": command_text(overrides, run_dir),
    }


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl`` records ([] when absent)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def final_metrics(records: list[dict[str, Any]], label: str = "after_rl") -> dict[str, float]:
    """Headline and per-task-type numbers of the last held-out evaluation with ``label``, plus
    ``rl_tasks_success`` from the last evaluation on RL's task pool with that label (when there is one)."""
    evals = [r for r in records if r.get("kind") == HELD_OUT_EVAL_KIND and r.get("label") == label]
    if not evals:
        return {}
    rec = evals[-1]
    out = {
        k: v
        for k, v in rec.items()
        if (k in METRICS or k.startswith("success/")) and isinstance(v, int | float)
    }
    pool = [r for r in records if r.get("kind") == RL_TASKS_EVAL_KIND and r.get("label") == label]
    if pool:
        out["rl_tasks_success"] = pool[-1]["success"]
    return out


def curve(records: list[dict[str, Any]], key: str = "success") -> list[tuple[int, float]]:
    """``(iteration, value)`` of the training records."""
    return [(int(r["iteration"]), float(r[key])) for r in records if r.get("kind") == "train" and key in r]


def summarise(
    runs: list[dict[str, Any]],
) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, Any]], list[str]]:
    """Per ``env / estimator`` over finished runs: display strings ``mean ± std (n)`` and raw statistics."""
    metric_names = list(METRICS)
    for r in runs:
        metric_names += sorted(k for k in r.get("final", {}) if k not in metric_names)
    display: dict[str, dict[str, str]] = {}
    stats: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys(f"{r['env']} / {r['estimator']}" for r in runs):
        members = [r for r in runs if f"{r['env']} / {r['estimator']}" == key]
        stats[key] = {"started": len(members), "finished": sum(bool(r.get("final")) for r in members)}
        display[key] = {}
        for m in metric_names:
            s = mean_spread([r["final"][m] for r in members if m in r.get("final", {})])
            stats[key][m] = s
            display[key][m] = "—" if s["n"] == 0 else f"{s['mean']:.3f} ± {s['std']:.3f} (n={s['n']})"
        display[key]["runs finished / started"] = f"{stats[key]['finished']} / {stats[key]['started']}"
    return display, stats, [*metric_names, "runs finished / started"]


#: Learning curves a run record may hold: its key, the training metric it follows, the panel's label.
CURVES = [("curve", "success", "success"), ("score_curve", "task_score", "purchase score (0-1)")]


def run_results(run_dir: Path, finished: bool) -> dict[str, Any]:
    """A run's numbers from its folder: ``final`` (empty unless the run finished) and its learning curves."""
    records = read_metrics(run_dir)
    return {
        "final": final_metrics(records) if finished else {},
        **{key: curve(records, metric) for key, metric, _ in CURVES},
    }


def plot_curves(runs: list[dict[str, Any]], path: Path) -> None:
    """Training success per iteration, and WebShop's purchase score where runs logged it: mean over seeds
    (line) and min-max (band), one panel per env and curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (env, key, label)
        for env in dict.fromkeys(r["env"] for r in runs)
        for key, _, label in CURVES
        if any(r.get(key) for r in runs if r["env"] == env)
    ]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4), squeeze=False)
    for ax, (env, key, label) in zip(axes[0], panels, strict=True):
        for est in dict.fromkeys(r["estimator"] for r in runs if r["env"] == env):
            curves = [
                dict(map(tuple, r[key]))
                for r in runs
                if r["env"] == env and r["estimator"] == est and r.get(key)
            ]
            if not curves:
                continue
            its = sorted(set().union(*curves))
            vals = [[c[i] for c in curves if i in c] for i in its]
            ax.plot(its, [np.mean(v) for v in vals], marker="o", label=f"{est} (n={len(curves)})")
            ax.fill_between(its, [min(v) for v in vals], [max(v) for v in vals], alpha=0.15)
        ax.set(
            title=f"{env}: training {label} per iteration",
            xlabel="iteration",
            ylabel=label,
            ylim=(-0.02, 1.02),
        )
        ax.legend(fontsize=7)
    save_figure(fig, path)


@dataclass
class Settings:
    setting: str = option("cpu", "the comparison's setting (SETTINGS)", choices=sorted(SETTINGS))
    seeds: list[int] | None = option(None, "override the setting's seeds")
    estimators: list[str] | None = option(None, "override the setting's estimators")
    envs: list[str] | None = option(None, "override the setting's envs", choices=sorted(ENV_OVERRIDES))
    model_path: str | None = option(None, "start from this local causal-LM folder instead of the tiny model")
    extra: list[str] = option([], "more progpo train overrides (key=value)", nargs="*")
    runs_dir: Path | None = option(None, "run folders (default runs/compare_estimators/<setting>)")
    timeout: float | None = option(None, "seconds per training run (default: the setting's)")
    out: Path = option(
        RESULTS_DIR / "compare_estimators.json", "result file (the plots are written beside it)"
    )
    jobs: int | None = option(None, "training runs at once (default: the setting's)")
    reuse: bool = option(
        False,
        "keep the warm start and every run whose folder already holds a finished run (its summary.json, "
        "written at the end of training) instead of running them again; run only what is missing (after an "
        "interruption, or to add estimators or seeds)",
    )
    resummarise: bool = option(
        False, "run nothing: read --out's runs again from their folders with this code and rewrite it"
    )


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])

    from rich.console import Console

    if settings.resummarise:
        write_result(resummarise(json.loads(settings.out.read_text())), settings.out, Console(width=160))
        return 0

    setting = SETTINGS[settings.setting]
    seeds = settings.seeds if settings.seeds is not None else setting.seeds
    estimators = settings.estimators or setting.estimators
    for spec in estimators:
        parse_estimator_spec(spec)  # a bad name or parameter fails here, before any training
    envs = settings.envs or setting.envs
    timeout_s = settings.timeout or setting.timeout_s
    jobs = settings.jobs or setting.jobs
    runs_dir = settings.runs_dir or ROOT / "runs" / "compare_estimators" / settings.setting
    base = [
        *setting.overrides,
        *([f"model.path={settings.model_path}"] if settings.model_path else []),
        *settings.extra,
    ]
    console = Console(width=160)
    started = time.perf_counter()
    warm_starts: list[dict[str, Any]] = []
    jobs: list[tuple[dict[str, Any], list[str], Path]] = []
    for env in envs:
        env_base = [*base, *ENV_OVERRIDES[env], *setting.env_overrides.get(env, [])]
        # One warm start per env, shared by every estimator and seed: runs differ only in estimator and RL
        # seed. Its held-out evaluation is every run's ``before_rl``.
        ws_dir = runs_dir / env / "warm_start"
        ws_overrides = [*env_base, f"seed={seeds[0]}", "iterations=0", "warm_start.enabled=true"]
        if settings.reuse and finished(ws_dir) and (ws_dir / "final").is_dir():
            console.print(f"[bold]{env}: warm start reused from {ws_dir}")
            ws = reused_record(ws_overrides, ws_dir)
        else:
            console.print(f"[bold]{env}: warm start (seed {seeds[0]})")
            ws = run_training(ws_overrides, ws_dir, timeout_s, ws_dir / "train.log")
        ws.update(env=env, seed=seeds[0], run_dir=str(ws_dir))
        ws["before_rl"] = final_metrics(read_metrics(ws_dir), "before_rl")
        warm_starts.append(ws)
        console.print(f"  {ws['status']}; held-out {ws['before_rl'] or '—'}")
        policy = ws_dir / "final"
        for seed in seeds:
            for est in estimators:
                run_dir = runs_dir / env / f"seed{seed}" / run_folder_name(est)
                record: dict[str, Any] = {"env": env, "seed": seed, "estimator": est, "run_dir": str(run_dir)}
                record["before_rl"] = ws["before_rl"]
                if ws["status"] != "ok" or not policy.is_dir():
                    record.update(status="skipped: warm start failed", seconds=0.0, final={})
                    jobs.append((record, [], run_dir))
                    continue
                overrides = [
                    *env_base,
                    f"seed={seed}",
                    *estimator_overrides(est),
                    f"model.path={policy}",
                    "warm_start.enabled=false",
                    "eval.before_rl=false",
                ]
                if settings.reuse and finished(run_dir):
                    record.update(reused_record(overrides, run_dir), **run_results(run_dir, finished=True))
                    jobs.append((record, [], run_dir))
                    continue
                jobs.append((record, overrides, run_dir))

    def run_one(job: tuple[dict[str, Any], list[str], Path]) -> dict[str, Any]:
        record, overrides, run_dir = job
        if not overrides:
            return record
        record.update(run_training(overrides, run_dir, timeout_s, run_dir / "train.log"))
        record.update(run_results(run_dir, finished=record["status"] == "ok"))
        console.print(
            f"  {record['env']} seed {record['seed']} {record['estimator']}: {record['status']} in "
            f"{record['seconds']:.0f} s; success {record['final'].get('success', '—')}"
        )
        return record

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # runs are subprocesses: threads suffice
        runs = list(pool.map(run_one, jobs))
    display, stats, metric_names = summarise(runs)
    result = {
        "benchmark": "compare_estimators",
        "command": "python benchmarks/compare_estimators.py "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "setting": settings.setting,
        "config": {
            **asdict(setting),
            "seeds": seeds,
            "estimators": estimators,
            "envs": envs,
            "model_path": settings.model_path,
            "extra": settings.extra,
            "timeout_s": timeout_s,
        },
        "machine": machine_info(load_average_1m=os.getloadavg()[0], numpy=np.__version__, **_torch_info()),
        "git": git_commit(),
        "seconds": time.perf_counter() - started,
        "metric_names": metric_names,
        "summary": display,
        "statistics": stats,
        "warm_starts": warm_starts,
        "runs": runs,
    }
    write_result(result, settings.out, console)
    return 0 if all(r["status"] == "ok" for r in runs) and runs else 1


def write_result(result: dict[str, Any], out: Path, console: Any) -> None:
    """Print the summary table, write the JSON to ``out`` and the learning curves beside it (``.png``)."""
    from rich.table import Table

    names = result["metric_names"]
    table = Table(
        title=f"estimator comparison ({result['setting']}): held-out after RL, mean ± std over seeds"
    )
    table.add_column("env / estimator")
    for m in names[:8]:
        table.add_column(m, justify="right")
    for key, row in result["summary"].items():
        table.add_row(key, *(row[m] for m in names[:8]))
    console.print(table)
    save_result(result, out)
    plot_curves(result["runs"], out.with_suffix(".png"))
    console.print(f"wrote {out} ({result['seconds']:.0f} s)")


def resummarise(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` (a comparison's JSON) with every number read again from the run folders by this code's
    :func:`final_metrics` and :func:`curve`, and the summary rebuilt; no run is repeated.

    For when the extraction changed after the runs (a metric the training logged that the comparison did not
    collect yet). The runs' ``git``, ``machine`` and ``seconds`` are kept; ``resummarised_by`` records the
    commit that read them again.
    """
    result = json.loads(json.dumps(result))  # a deep copy
    for ws in result.get("warm_starts", []):
        ws["before_rl"] = final_metrics(read_metrics(ROOT / ws["run_dir"]), "before_rl")
    before = {ws["env"]: ws["before_rl"] for ws in result.get("warm_starts", [])}
    for run in result["runs"]:
        run["before_rl"] = before.get(run["env"], {})
        run.update(run_results(ROOT / run["run_dir"], finished=run.get("status") == "ok"))
    display, stats, names = summarise(result["runs"])
    result.update(summary=display, statistics=stats, metric_names=names, resummarised_by=git_commit())
    return result


def _torch_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {}
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------


def render_compare_estimators(data: dict) -> str:
    summary = data["summary"]
    metrics: list[str] = data["metric_names"]
    resummarised = data.get("resummarised_by") or {}
    parts = [
        f"Setting `{data.get('setting', '—')}`, seeds {fmt(data.get('config', {}).get('seeds'))}: held-out "
        "success etc. after RL, mean ± sample std over seeds (n = finished runs)."
        + (
            " The numbers were read again from the run folders by commit "
            f"`{str(resummarised['commit'])[:12]}` (`--resummarise`); the runs ran at the commit above."
            if resummarised.get("commit")
            else ""
        )
    ]
    for ws in data.get("warm_starts", []):
        before = ws.get("before_rl") or {}
        pool = (
            f", success on RL's task pool {fmt(before['rl_tasks_success'])}"
            if "rl_tasks_success" in before
            else ""
        )
        parts.append(
            f"Warm start of `{ws.get('env')}` (shared by every run): {ws.get('status')} in "
            f"{fmt(ws.get('seconds'))} s, held-out success {fmt(before.get('success'))}{pool}."
        )
    parts.append(
        f"Whole comparison: {fmt(data.get('seconds'))} s. `score` is the mean return (ALFWorld: 10 per "
        "win; WebShop with the cpu setting's `reward_mode: raw`: the 0-1 purchase score); `task_score` is "
        "WebShop's purchase score whatever the reward (— in results recorded before it was logged)."
    )
    if summary:
        # each env's warm start (the shared starting point, one run) heads its estimators' rows
        warm_rows = {ws.get("env"): ws.get("before_rl") or {} for ws in data.get("warm_starts", [])}
        rows, shown = [], set()
        for key, row in summary.items():
            env = key.split(" / ", 1)[0]
            if env in warm_rows and env not in shown:
                shown.add(env)
                before = warm_rows[env]
                rows.append([f"{env} / *warm start, before RL*", *(before.get(m) for m in metrics)])
            rows.append([key, *(row.get(m) for m in metrics)])
        parts.append(markdown_table(["env / estimator", *metrics], rows))
    else:
        parts.append("No run was started.")
    paired = _paired_table(data.get("runs", []), metrics)
    if paired:
        parts.append(paired)
    reproduce = _reproduce_commands(data)
    if reproduce:
        parts.append(reproduce)
    runs = data.get("runs", [])
    if runs:
        headline = [m for m in metrics if "/" not in m and m != "runs finished / started"]
        parts.append(
            "**Every started run**\n\n"
            + markdown_table(
                ["env", "estimator", "seed", "status", "seconds", "warm-start success", *headline],
                [
                    [
                        r.get("env"),
                        r.get("estimator"),
                        r.get("seed"),
                        r.get("status"),
                        r.get("seconds"),
                        r.get("before_rl", {}).get("success"),
                        *(r.get("final", {}).get(m) for m in headline),
                    ]
                    for r in runs
                ],
            )
        )
    return "\n\n".join(parts)


def _paired_table(runs: list[dict], metrics: list[str]) -> str:
    """Each estimator minus GRPO, paired by env and seed, on the held-out and RL-task success."""
    columns = [m for m in ("success", "rl_tasks_success") if m in metrics]
    if not columns or not any(r.get("estimator") == "grpo" for r in runs):
        return ""
    per_metric = {m: paired_differences(runs, m) for m in columns}
    keys = list(per_metric[columns[0]])

    def cell(s: dict) -> str:
        return "—" if not s["n"] else f"{s['mean']:+.3f} ± {s['std']:.3f} (n={s['n']})"

    return (
        "**Paired with GRPO** (estimator − GRPO, same env and seed: same warm start, RL task draws, "
        "evaluation tasks and sampling seeds; mean ± sample std over seeds). A difference within its spread "
        "is no difference.\n\n"
        + markdown_table(
            ["env / estimator", *(f"Δ {m}" for m in columns)],
            [[key, *(cell(per_metric[m][key]) for m in columns)] for key in keys],
        )
    )


#: An absolute path up to a ``runs/`` folder (``/any/checkout/runs/...``): where a result was recorded.
_ABSOLUTE_RUNS_PREFIX = re.compile(r"/[^\s'=]*?/runs/")


def _reproduce_commands(data: dict) -> str:
    """How to rerun one number of the comparison: its env's warm start, then the run (paths shown relative to
    the repository root, where the commands run)."""
    runs = [r for r in data.get("runs", []) if r.get("command")]
    if not runs:
        return ""

    def shown(command: str) -> str:
        # the folders were recorded as absolute paths of the machine that ran them: show them from the root
        return f"`{_ABSOLUTE_RUNS_PREFIX.sub('runs/', command)}`"

    lines = [
        "**Reproduce one run** (from the repository root; the other runs change `seed=` and `algo.name=`):"
    ]
    for ws in data.get("warm_starts", []):
        example = next((r for r in runs if r.get("env") == ws.get("env")), None)
        if ws.get("command") and example:
            lines.append(f"- `{ws['env']}` warm start: {shown(ws['command'])}")
            run_name = f"`{ws['env']}` {example['estimator']}, seed {example['seed']}"
            lines.append(f"- then {run_name}: {shown(example['command'])}")
    return "\n".join(lines) if len(lines) > 1 else ""


SPECS = (
    Benchmark(
        "compare_estimators_quickstart_ablation",
        script_path(__file__),
        "The RL half of the ProGPO ablation: the quickstart itself (its embedded defaults, held-out "
        "`valid_seen` tasks and RL's own 8 tasks), 3 seeds from one warm start, GRPO and each ProGPO "
        "variant (estimator specs: every ablated parameter spelled out).",
        "python benchmarks/compare_estimators.py --setting quickstart_ablation "
        "--out benchmarks/results/compare_estimators_quickstart_ablation.json",
        None,
        render_compare_estimators,
        full_args=[
            "--setting",
            "quickstart_ablation",
            "--out",
            "benchmarks/results/compare_estimators_quickstart_ablation.json",
        ],
    ),
    Benchmark(
        "compare_estimators",
        script_path(__file__),
        "The papers' comparison at small scale, on generated ALFWorld tasks and WebShop goals: the same "
        "small policy, warm start, iterations, groups, group size and seeds, trained with each estimator "
        "(GRPO, RLOO, GiGPO, G2PO, GraphGPO, ProGPO, ProGPO-coverage); held-out success (overall and per "
        "task type), success on RL's own task pool, WebShop score, invalid-action rate, steps, learning "
        "curves. Mean ± sample std over seeds; every started run is listed.",
        "python benchmarks/compare_estimators.py --setting cpu  (GPU: --setting gpu)",
        ["--setting", "smoke"],
        render_compare_estimators,
    ),
    Benchmark(
        "compare_estimators_quickstart_rl",
        script_path(__file__),
        "The comparison's ALFWorld half with the quickstart's own RL (30 iterations at learning rate 3e-4, "
        "where RL raised held-out success in the README's runs, instead of the cpu setting's 10 at 1e-3), "
        "for the estimators the claim is about: trajectory-level GRPO, anchor-state GiGPO and ProGPO. "
        "Same warm start, evaluation and table as above.",
        "python benchmarks/compare_estimators.py --setting cpu_quickstart_rl "
        "--out benchmarks/results/compare_estimators_quickstart_rl.json",
        None,
        render_compare_estimators,
        full_args=[
            "--setting",
            "cpu_quickstart_rl",
            "--out",
            "benchmarks/results/compare_estimators_quickstart_rl.json",
        ],
    ),
)


if __name__ == "__main__":
    sys.exit(main())
