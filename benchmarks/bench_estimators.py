"""The advantage estimators: their speed against per-row Python references (``speed``), and RL with each at
equal compute (``rl``, its settings in ``benchmarks/settings/compare_estimators.yaml``).

``python benchmarks/bench_estimators.py PART``; what each measures is its result's section of
``benchmarks/measures.md`` (the results page shows it).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import shlex
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import numpy as np
import yaml
from rich.console import Console
from rich.progress import track

from benchmarks.common import ROOT, git_commit, mean_spread, paired_differences, run_measured
from benchmarks.harness import Benchmark, Part, PartSettings, option, result_path, script_main, script_path
from benchmarks.lib.markdown import fmt, markdown_table
from progpo_base.config import parse_override
from training.advantages import ESTIMATORS, check_parameter_names, compute_advantages
from training.cli import train_command
from training.metrics import HELD_OUT_EVAL_KIND, RL_TASKS_EVAL_KIND, read_metrics

console = Console(width=160)
SCRIPT = script_path(__file__)

# --- speed: every estimator against its per-row Python reference ---

TARGET_SECONDS, TARGET_SPEEDUP = 2.0, 10.0


def test_module(name: str):
    """A module of ``tests/training/advantages/`` (the batches and the per-row references live with the
    tests), loaded from its file: the benchmark needs no ``tests`` package on ``sys.path``."""
    path = ROOT / "tests" / "training" / "advantages" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(fn, repeats: int) -> tuple[float, float, np.ndarray]:
    """``(best CPU seconds, median wall seconds, output)`` over ``repeats`` calls."""
    cpu, wall, out = [], [], None
    for _ in range(repeats):
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        out = fn()
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start_wall)
    return min(cpu), statistics.median(wall), out


@dataclass
class SpeedSettings(PartSettings):
    sizes: list[int] = option([250_000, 500_000, 1_000_000], "step rows per batch")
    reference_rows: int = option(100_000, "rows the Python references are timed on (then scaled linearly)")
    repeats: int = option(3, "timed calls per size (the best is kept)")
    seed: int = option(0, "batch seed")
    quick: bool = option(False, "100k and 200k rows, references on 20k, one repeat")

    def __post_init__(self):
        if self.quick:
            self.sizes, self.reference_rows, self.repeats = [100_000, 200_000], 20_000, 1


def run_speed(s: SpeedSettings) -> dict:
    """Every estimator's CPU seconds at each size, shuffled, and against its per-row Python reference."""
    names, largest = sorted(ESTIMATORS), max(s.sizes)
    batches, references = test_module("advantages_batches"), test_module("advantages_reference").REFERENCES
    full = batches.random_walk_batch(largest // 200 + 16, seed=s.seed, n_rows=largest)
    lengths = np.bincount(full["traj_id"])
    fast, wall = {n: {} for n in names}, {n: {} for n in names}
    for size in s.sizes:
        batch = {k: v[:size] for k, v in full.items()}
        for name in track(names, description=f"estimators at {size} rows", console=console):
            run = functools.partial(compute_advantages, name, batch)
            fast[name][size], wall[name][size], _ = timed(run, s.repeats)
    shuffled_batch = {k: v[np.random.default_rng(s.seed).permutation(largest)] for k, v in full.items()}
    shuffled = {}
    for name in track(names, description=f"estimators, {largest} rows in random order", console=console):
        shuffled[name] = timed(lambda n=name: compute_advantages(n, shuffled_batch), s.repeats)[0]
    small = {k: v[: s.reference_rows] for k, v in full.items()}
    scale, results = largest / s.reference_rows, {}
    for name in track(names, description=f"Python references at {s.reference_rows} rows", console=console):
        reference, _, expected = timed(lambda n=name: references[n](small), 1)
        at_reference, _, got = timed(lambda n=name: compute_advantages(n, small), s.repeats)
        t_big, ref_big = fast[name][largest], reference * scale
        results[name] = {
            "seconds_by_rows": {str(size): fast[name][size] for size in s.sizes},
            "wall_seconds_median_by_rows": {str(size): wall[name][size] for size in s.sizes},
            "seconds_per_million_rows_by_rows": {str(n): fast[name][n] / n * 1e6 for n in s.sizes},
            "seconds_shuffled_rows": shuffled[name],
            "growth_largest_over_smallest": t_big / fast[name][min(s.sizes)],
            "reference_seconds_measured": reference,
            "reference_rows": s.reference_rows,
            "reference_seconds_scaled_to_largest": ref_big,
            "fast_seconds_at_reference_rows": at_reference,
            "speedup_same_size": reference / at_reference,
            "speedup_vs_scaled_reference": ref_big / t_big,
            "max_abs_diff_vs_reference": float(np.abs(expected - got).max()),
            "meets_time_target": t_big < TARGET_SECONDS,
            "meets_speedup_target": ref_big / t_big >= TARGET_SPEEDUP,
        }
    return {
        "claim": f"every estimator on {largest} rows < {TARGET_SECONDS} s on one core, "
        f">= {TARGET_SPEEDUP}x a per-row Python-dict reference, linear in rows",
        "batch": {
            "rows": largest,
            "groups": int(len(np.unique(full["group_id"]))),
            "trajectories": int(lengths.size),
            "trajectory_length_mean": float(lengths.mean()),
            "trajectory_length_max": int(lengths.max()),
            "success_rate": float(full["won"].sum() / lengths.size),
            "generator": "tests/training/advantages/advantages_batches.py:random_walk_batch; smaller sizes "
            "are prefixes of the largest batch; rows in trajectory-major order unless 'shuffled'",
            "seed": s.seed,
        },
        "reference_note": f"Python references timed once on the first {s.reference_rows} rows and scaled "
        f"linearly (x{scale:g}) to {largest} rows; 'speedup_same_size' compares both at {s.reference_rows} "
        "rows",
        "timing": f"seconds = best of {s.repeats} runs of process CPU time (single-threaded code, "
        "OMP_NUM_THREADS=1: time on one core); median wall time recorded too; the reference is timed once",
        "results": results,
        "all_meet_time_target": all(r["meets_time_target"] for r in results.values()),
        "all_meet_speedup_target": all(r["meets_speedup_target"] for r in results.values()),
        "machine": {"numpy": np.__version__},
    }


def plot_speed(result: dict, path: Path) -> None:
    from benchmarks.lib.plots import figure, lines

    with figure(path, width=7, height=4.5) as (ax,):
        curves = {}
        for name, r in result["results"].items():
            sizes = sorted(map(int, r["seconds_by_rows"]))
            curves[name] = ([n / 1e6 for n in sizes], [r["seconds_by_rows"][str(n)] for n in sizes])
        lines(ax, curves, xlabel="rows (millions)", ylabel="CPU seconds (one core)", title="time vs rows")
        ax.axhline(TARGET_SECONDS, color="red", linestyle="--")
        ax.set_ylim(bottom=0)


def render_speed(data: dict) -> str:
    largest = str(data["batch"]["rows"])
    header = ["estimator", f"CPU s at {int(largest):,} rows", "speed-up vs Python reference"]
    header += ["time growth, largest / smallest size", "max abs diff vs reference", "time target met"]
    keys = ["speedup_vs_scaled_reference", "growth_largest_over_smallest", "max_abs_diff_vs_reference"]
    keys += ["meets_time_target", "meets_speedup_target"]
    rows = [
        [name, r["seconds_by_rows"][largest], *(r[k] for k in keys)] for name, r in data["results"].items()
    ]
    return f"Claim: {data['claim']}\n\n" + markdown_table([*header, "speed-up target met"], rows)


# --- rl: the estimators compared at equal compute ---


def parse_estimator_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"name"`` or ``"name:key=value,key=value"`` -> ``(name, params)``; each ``key=value`` read as a
    ``progpo train`` override (:func:`progpo_base.config.parse_override`: YAML values). Keys are checked
    against the estimator's parameters here, so a bad one fails before any rollout is recorded.

    Example:
        >>> parse_estimator_spec("progpo:success_potential=0,norm=mean")
        ('progpo', {'success_potential': 0, 'norm': 'mean'})
    """
    name, _, rest = spec.partition(":")
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r} in {spec!r}; registered: {sorted(ESTIMATORS)}")
    params = dict(parse_override(item) for item in filter(None, rest.split(",")))
    check_parameter_names(name, params, ESTIMATORS[name].parameters)
    return name, params


#: Headline metrics, in table order: the held-out evaluation (``success_steps``: steps to success, won
#: episodes only), then RL's own task pool; per-task-type success is added where present.
METRICS = ["success", "rl_tasks_success", "task_score", "score", "invalid_rate", "episode_steps"]
METRICS.append("success_steps")
#: Learning curves a run record holds: its key, the training metric it follows, the panel's label.
CURVES = [("curve", "success", "success"), ("score_curve", "task_score", "purchase score (0-1)")]


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
    """``(estimators, env_overrides, settings)`` of a settings file (its header says its form); each setting's
    ``overrides`` begin with the file's ``common`` keys."""
    data = yaml.safe_load(path.read_text())
    settings = {
        name: Setting(**{**entry, "overrides": [*data["common"], *entry["overrides"]]})
        for name, entry in data["settings"].items()
    }
    return data["estimators"], data["env_overrides"], settings


ESTIMATOR_LIST, ENV_OVERRIDES, SETTINGS = load_settings()


def estimator_overrides(spec: str) -> list[str]:
    """``progpo train`` keys for an estimator spec (``name`` or ``name:key=value,...``).

    Example:
        >>> estimator_overrides("progpo:success_potential=0")
        ['algo.name=progpo', 'algo.params={"success_potential": 0}']
    """
    name, params = parse_estimator_spec(spec)
    return [f"algo.name={name}", *([f"algo.params={json.dumps(params)}"] if params else [])]


def final_metrics(records: list[dict[str, Any]], label: str = "after_rl") -> dict[str, float]:
    """Headline and per-task-type numbers of the last held-out evaluation with ``label``, plus
    ``rl_tasks_success`` from the last evaluation on RL's task pool with that label (when there is one)."""
    evals = [r for r in records if r.get("kind") == HELD_OUT_EVAL_KIND and r.get("label") == label]
    if not evals:
        return {}
    keep = lambda k, v: (k in METRICS or k.startswith("success/")) and isinstance(v, int | float)  # noqa: E731
    out = {k: v for k, v in evals[-1].items() if keep(k, v)}
    pool = [r for r in records if r.get("kind") == RL_TASKS_EVAL_KIND and r.get("label") == label]
    if pool:
        out["rl_tasks_success"] = pool[-1]["success"]
    return out


def curve(records: list[dict[str, Any]], key: str = "success") -> list[tuple[int, float]]:
    """``(iteration, value)`` of the training records."""
    return [(int(r["iteration"]), float(r[key])) for r in records if r.get("kind") == "train" and key in r]


def run_results(run_dir: Path, finished: bool) -> dict[str, Any]:
    """A run's numbers from its folder: ``final`` (empty unless it finished) and its learning curves."""
    records = read_metrics(run_dir)
    curves = {key: curve(records, metric) for key, metric, _ in CURVES}
    return {"final": final_metrics(records) if finished else {}, **curves}


def summarise(runs: list[dict[str, Any]]) -> tuple[dict[str, dict], dict[str, dict], list[str]]:
    """Per ``env / estimator`` over finished runs: display strings ``mean ± std (n)`` and raw statistics."""
    names = list(METRICS)
    for r in runs:
        names += sorted(k for k in r.get("final", {}) if k not in names)
    display: dict[str, dict[str, str]] = {}
    stats: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys(f"{r['env']} / {r['estimator']}" for r in runs):
        members = [r for r in runs if f"{r['env']} / {r['estimator']}" == key]
        stats[key] = {"started": len(members), "finished": sum(bool(r.get("final")) for r in members)}
        display[key] = {}
        for m in names:
            s = stats[key][m] = mean_spread([r["final"][m] for r in members if m in r.get("final", {})])
            display[key][m] = "—" if s["n"] == 0 else f"{s['mean']:.3f} ± {s['std']:.3f} (n={s['n']})"
        display[key]["runs finished / started"] = f"{stats[key]['finished']} / {stats[key]['started']}"
    return display, stats, [*names, "runs finished / started"]


def train_run(overrides: list[str], run_dir: Path, timeout_s: float, reuse: bool) -> dict[str, Any]:
    """``progpo train overrides run_dir=...``, or, with ``reuse`` and a finished run in the folder (its
    ``summary.json``, written last), that run's record (its time was not measured by this invocation)."""
    command = train_command([*overrides, f"run_dir={run_dir}"])
    if reuse and (run_dir / "summary.json").is_file():
        shown = shlex.join(["python", *command[1:]])
        return {"status": "ok", "returncode": 0, "seconds": None, "reused": True, "command": shown}
    record = run_measured(command, run_dir / "train.log", timeout_s)
    return {**record, "seconds": record.pop("resources")["wall_s"]}


@dataclass
class RLSettings(PartSettings):
    setting: str = option("cpu", "the comparison's setting", choices=sorted(SETTINGS))
    seeds: list[int] | None = option(None, "override the setting's seeds")
    estimators: list[str] | None = option(
        None, "override the setting's estimators (specs: name:key=value,...)"
    )
    envs: list[str] | None = option(None, "override the setting's envs", choices=sorted(ENV_OVERRIDES))
    model_path: str | None = option(None, "start from this local causal-LM folder instead of the tiny model")
    extra: list[str] = option([], "more progpo train overrides (key=value)", nargs="*")
    runs_dir: Path | None = option(None, "run folders (default runs/compare_estimators/<setting>)")
    timeout: float | None = option(None, "seconds per training run (default: the setting's)")
    jobs: int | None = option(None, "training runs at once (default: the setting's)")
    reuse: bool = option(False, "keep the warm start and finished runs in the folders; run what is missing")
    resummarise: bool = option(False, "run nothing: read --out's runs again from their folders, rewrite it")
    quick: bool = option(False, "the smoke setting")

    def __post_init__(self):
        self.setting = "smoke" if self.quick else self.setting
        for spec in self.estimators or []:
            parse_estimator_spec(spec)  # a bad name or parameter fails here, before any training


def run_rl(s: RLSettings) -> dict:
    """Each estimator trained from one warm start per env, over seeds: held-out success after RL and more."""
    if s.resummarise:
        return resummarise(json.loads(result_path(rl_name(s), s).read_text()))
    setting = SETTINGS[s.setting]
    seeds = s.seeds if s.seeds is not None else setting.seeds
    estimators, envs = s.estimators or setting.estimators, s.envs or setting.envs
    timeout_s, jobs = s.timeout or setting.timeout_s, s.jobs or setting.jobs
    runs_dir = s.runs_dir or ROOT / "runs" / "compare_estimators" / s.setting
    base = [*setting.overrides, *([f"model.path={s.model_path}"] if s.model_path else []), *s.extra]
    started, warm_starts, todo = time.perf_counter(), [], []
    for env in envs:
        env_base = [*base, *ENV_OVERRIDES[env], *setting.env_overrides.get(env, [])]
        # One warm start per env, shared by every estimator and seed; its held-out evaluation is every run's
        # ``before_rl``.
        ws_dir = runs_dir / env / "warm_start"
        console.print(f"[bold]{env}: warm start (seed {seeds[0]})")
        ws_overrides = [*env_base, f"seed={seeds[0]}", "iterations=0", "warm_start.enabled=true"]
        ws = train_run(ws_overrides, ws_dir, timeout_s, s.reuse and (ws_dir / "final").is_dir())
        ws.update(env=env, seed=seeds[0], run_dir=str(ws_dir))
        ws["before_rl"] = final_metrics(read_metrics(ws_dir), "before_rl")
        warm_starts.append(ws)
        for seed in seeds:
            for spec in estimators:
                run_dir = runs_dir / env / f"seed{seed}" / spec.replace(":", "__").replace(",", "__")
                record = {"env": env, "seed": seed, "estimator": spec, "run_dir": str(run_dir)}
                record["before_rl"] = ws["before_rl"]
                if ws["status"] != "ok" or not (ws_dir / "final").is_dir():
                    skipped = {"status": "skipped: warm start failed", "seconds": 0.0, "final": {}}
                    todo.append((record | skipped, []))
                    continue
                rl = [f"seed={seed}", *estimator_overrides(spec), f"model.path={ws_dir / 'final'}"]
                todo.append((record, [*env_base, *rl, "warm_start.enabled=false", "eval.before_rl=false"]))

    def run_one(job: tuple[dict[str, Any], list[str]]) -> dict[str, Any]:
        record, overrides = job
        if overrides:
            record.update(train_run(overrides, Path(record["run_dir"]), timeout_s, s.reuse))
            record.update(run_results(Path(record["run_dir"]), finished=record["status"] == "ok"))
            success = record["final"].get("success", "—")
            run = f"{record['env']} seed {record['seed']} {record['estimator']}"
            console.print(f"  {run}: {record['status']}; held-out success {success}")
        return record

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # runs are subprocesses: threads suffice
        runs = list(pool.map(run_one, todo))
    display, stats, metric_names = summarise(runs)
    config = {**asdict(setting), "seeds": seeds, "estimators": estimators, "envs": envs}
    config.update(timeout_s=timeout_s, model_path=s.model_path, extra=s.extra)
    import torch

    machine = {"numpy": np.__version__, "torch": torch.__version__, "cuda": torch.cuda.is_available()}
    machine.update({"gpu": torch.cuda.get_device_name(0)} if machine["cuda"] else {})
    return {
        "setting": s.setting,
        "config": config,
        "machine": machine,
        "git": git_commit(),
        "seconds": time.perf_counter() - started,
        "metric_names": metric_names,
        "summary": display,
        "statistics": stats,
        "warm_starts": warm_starts,
        "runs": runs,
        "failed": [
            f"{r['env']} seed {r['seed']} {r['estimator']}: {r['status']}"
            for r in runs
            if r["status"] != "ok"
        ],
    }


def rl_name(s: RLSettings) -> str:
    """The result file of a comparison setting (``cpu`` and ``smoke`` write ``compare_estimators.json``)."""
    return "compare_estimators" if s.setting in ("cpu", "smoke", "gpu") else f"compare_estimators_{s.setting}"


def resummarise(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` (a comparison's JSON) with every number read again from the run folders by this code (for
    when the extraction changed after the runs); the runs' ``git``, ``machine`` and ``seconds`` are kept and
    ``resummarised_by`` records the commit that read them again."""
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


def plot_rl(result: dict, path: Path) -> None:
    """Training success (and WebShop's purchase score) per iteration: mean over seeds, min-max band."""
    from benchmarks.lib.plots import figure

    runs = result["runs"]
    envs = dict.fromkeys(r["env"] for r in runs)
    panels = [
        (e, key, label)
        for e in envs
        for key, _, label in CURVES
        if any(r.get(key) for r in runs if r["env"] == e)
    ]
    if not panels:
        return
    with figure(path, panels=len(panels), width=6.5, height=4) as axes:
        for ax, (env, key, label) in zip(axes, panels, strict=True):
            for est in dict.fromkeys(r["estimator"] for r in runs if r["env"] == env):
                mine = [r[key] for r in runs if r["env"] == env and r["estimator"] == est and r.get(key)]
                if curves := [dict(map(tuple, c)) for c in mine]:
                    its = sorted(set().union(*curves))
                    values = [[c[i] for c in curves if i in c] for i in its]
                    ax.plot(its, [np.mean(v) for v in values], marker="o", label=f"{est} (n={len(curves)})")
                    ax.fill_between(its, [min(v) for v in values], [max(v) for v in values], alpha=0.15)
            ax.set(title=f"{env}: training {label} per iteration", xlabel="iteration", ylabel=label)
            ax.set_ylim(-0.02, 1.02)
            ax.legend(fontsize=7)


#: An absolute path up to a ``runs/`` folder (``/any/checkout/runs/...``): where a result was recorded.
_ABSOLUTE_RUNS_PREFIX = re.compile(r"/[^\s'=]*?/runs/")


def render_rl(data: dict) -> str:
    metrics: list[str] = data["metric_names"]
    again = (data.get("resummarised_by") or {}).get("commit")
    parts = [
        f"Setting `{data.get('setting', '—')}`, seeds {fmt(data.get('config', {}).get('seeds'))}: held-out "
        "success etc. after RL, mean ± sample std over seeds (n = finished runs)."
        + (f" The numbers were read again from the run folders by commit `{str(again)[:12]}` "
           "(`--resummarise`); the runs ran at the commit above." if again else "")
    ]  # fmt: skip
    for ws in data.get("warm_starts", []):
        before = ws.get("before_rl") or {}
        pool = before.get("rl_tasks_success")
        pool = f", success on RL's task pool {fmt(pool)}" if "rl_tasks_success" in before else ""
        parts.append(
            f"Warm start of `{ws.get('env')}` (shared by every run): {ws.get('status')} in "
            f"{fmt(ws.get('seconds'))} s, held-out success {fmt(before.get('success'))}{pool}."
        )
    parts.append(
        f"Whole comparison: {fmt(data.get('seconds'))} s. `score` is the mean return (ALFWorld: 10 per win; "
        "WebShop with the cpu setting's `reward_mode: raw`: the 0-1 purchase score); `task_score` is "
        "WebShop's purchase score whatever the reward (— in results recorded before it was logged)."
    )
    rows, warm = [], {ws.get("env"): ws.get("before_rl") or {} for ws in data.get("warm_starts", [])}
    for key, row in data["summary"].items():
        env = key.split(" / ", 1)[0]
        if env in warm:  # each env's warm start (the shared starting point, one run) heads its rows
            before = warm.pop(env)
            rows.append([f"{env} / *warm start, before RL*", *(before.get(m) for m in metrics)])
        rows.append([key, *(row.get(m) for m in metrics)])
    parts.append(markdown_table(["env / estimator", *metrics], rows) if rows else "No run was started.")
    runs = data.get("runs", [])
    columns = [m for m in ("success", "rl_tasks_success") if m in metrics]
    if columns and any(r.get("estimator") == "grpo" for r in runs):
        paired = {m: paired_differences(runs, m) for m in columns}
        cell = lambda s: "—" if not s["n"] else f"{s['mean']:+.3f} ± {s['std']:.3f} (n={s['n']})"  # noqa: E731
        table = [[key, *(cell(paired[m][key]) for m in columns)] for key in paired[columns[0]]]
        parts.append(
            "**Paired with GRPO** (estimator − GRPO, same env and seed: same warm start, RL task draws, "
            "evaluation tasks and sampling seeds; mean ± sample std over seeds). A difference within its "
            "spread is no difference.\n\n"
            + markdown_table(["env / estimator", *(f"Δ {m}" for m in columns)], table)
        )
    # the folders were recorded as absolute paths of the machine that ran them: shown from the root
    shown = lambda command: f"`{_ABSOLUTE_RUNS_PREFIX.sub('runs/', command)}`"  # noqa: E731
    lines = [
        "**Reproduce one run** (from the repository root; the other runs change `seed=` and `algo.name=`):"
    ]
    for ws in data.get("warm_starts", []):
        example = next((r for r in runs if r.get("env") == ws.get("env") and r.get("command")), None)
        if ws.get("command") and example:
            lines.append(f"- `{ws['env']}` warm start: {shown(ws['command'])}")
            name = f"`{ws['env']}` {example['estimator']}, seed {example['seed']}"
            lines.append(f"- then {name}: {shown(example['command'])}")
    if len(lines) > 1:
        parts.append("\n".join(lines))
    if runs:
        headline = [m for m in metrics if "/" not in m and m != "runs finished / started"]
        header = ["env", "estimator", "seed", "status", "seconds", "warm-start success", *headline]
        table = [
            [r.get(k) for k in ("env", "estimator", "seed", "status", "seconds")]
            + [r.get("before_rl", {}).get("success"), *(r.get("final", {}).get(m) for m in headline)]
            for r in runs
        ]
        parts.append("**Every started run**\n\n" + markdown_table(header, table))
    return "\n\n".join(parts)


PARTS = {
    "speed": Part(SpeedSettings, run_speed, plot_speed, "advantages"),
    "rl": Part(RLSettings, run_rl, plot_rl, rl_name),
}

SPECS = (
    Benchmark(
        "compare_estimators_quickstart_ablation",
        ["rl", "--setting", "quickstart_ablation"],
        quick=False,
        render=render_rl,
    ),
    Benchmark(
        "compare_estimators",
        ["rl", "--setting", "cpu"],
        render=render_rl,
        command=f"python {SCRIPT} rl --setting cpu  (GPU: --setting gpu)",
    ),
    Benchmark(
        "compare_estimators_quickstart_rl",
        ["rl", "--setting", "cpu_quickstart_rl"],
        quick=False,
        render=render_rl,
    ),
    Benchmark("advantages", ["speed"], render=render_speed),
)


main = script_main(__name__, __file__, PARTS, SPECS, __doc__)
