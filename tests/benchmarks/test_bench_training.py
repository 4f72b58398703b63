"""The training suite's quickstart part from run folders: hand-made ``summary.json`` files of three RL seeds
(no training), their statistics over seeds, the table, the plot, and bad input; the memory budgets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from benchmarks import bench_training as quickstart
from training.cli import train_command


def make_run(
    folder: Path,
    seed: int,
    held_out: tuple[float, float],
    rl_tasks: tuple[float, float] | None,
    resources: dict | None = None,
) -> Path:
    """A finished run folder as ``progpo train`` leaves it: ``summary.json`` and ``config.yaml``."""
    summary = {"iterations": 30, "algo": "progpo"}
    for prefix, pair in (("", held_out), ("rl_tasks_", rl_tasks)):
        if pair is None:
            continue
        for label, success in zip(("before_rl", "after_rl"), pair, strict=True):
            summary[prefix + label] = {
                "success": success,
                "success_std": 0.03,
                "success_per_seed": [success - 0.03, success, success + 0.03],
                "episodes": 96.0,
                "invalid_rate": 0.0,
            }
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    config = {
        "seed": seed,
        "model": {"path": "" if seed == 0 else "runs/quickstart/reference"},
        "warm_start": {"enabled": seed == 0},
        "eval": {"num_tasks": 32, "seeds": 3},
        "rollout": {"task_pool": 8},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    if resources is not None:
        record = {"status": "ok", "command": "python -m training.cli --run-dir x", "resources": resources}
        (folder / quickstart.RESOURCES_FILE).write_text(json.dumps(record))
    return folder


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    cost = {"wall_s": 783.0, "user_cpu_s": 782.0, "system_cpu_s": 12.0, "peak_rss_gb": 1.2}
    return [
        make_run(tmp_path / "seed0", 0, (0.25, 0.5), (0.5, 0.875), cost),
        make_run(tmp_path / "seed1", 1, (0.25, 0.125), (0.25, 0.625)),
        make_run(tmp_path / "seed2", 2, (0.125, 0.375), (0.25, 0.75)),
    ]


def test_result_per_seed_and_over_seeds(runs):
    result = quickstart.build_result(runs)
    assert [s["seed"] for s in result["seeds"]] == [0, 1, 2]
    seed0 = result["seeds"][0]
    assert seed0["held_out"]["before"] == {
        "success": 0.25,
        "spread": 0.03,
        "per_sampling_seed": [0.22, 0.25, 0.28],
        "episodes": 96.0,
    }
    assert seed0["held_out"]["change"] == pytest.approx(0.25)
    assert seed0["setting"]["warm_start"] is True and seed0["setting"]["eval_num_tasks"] == 32
    assert result["seeds"][1]["setting"]["model_path"] == "runs/quickstart/reference"
    # the cost is the seed-0 run's (the README's main job); runs not started by the script have none
    assert result["seed0_resources"]["wall_s"] == 783.0 and result["seeds"][1]["resources"] is None
    held_out = result["over_seeds"]["held_out"]
    assert held_out["after"]["mean"] == pytest.approx(1 / 3)
    assert held_out["after"]["std"] == pytest.approx(0.190941, abs=1e-6)  # sample std (n - 1)
    assert held_out["change"]["mean"] == pytest.approx((0.25 - 0.125 + 0.25) / 3)
    assert (held_out["seeds_where_it_rose"], held_out["seeds_where_it_fell"]) == (2, 1)
    rl = result["over_seeds"]["rl_tasks"]
    assert rl["before"]["mean"] == pytest.approx(1 / 3) and rl["after"]["mean"] == pytest.approx(0.75)
    # runs without an environment record: this process's commit (and machine, which the harness records)
    assert result["git"].keys() == {"commit", "dirty"} and result["machine"] == {}


def test_machine_and_commit_are_the_training_runs(runs):
    summary = json.loads((runs[0] / "summary.json").read_text())
    environment = {"cpu_model": "Test CPU", "cpu_flags": "avx2", "git": {"commit": "abc", "dirty": False}}
    (runs[0] / "summary.json").write_text(json.dumps({**summary, "environment": environment}))
    result = quickstart.build_result(runs)
    assert result["machine"] == environment and result["git"] == {"commit": "abc", "dirty": False}


def test_runs_without_the_rl_task_evaluation_have_no_such_summary(tmp_path):
    result = quickstart.build_result([make_run(tmp_path / "r", 0, (0.25, 0.5), None)])
    assert "rl_tasks" not in result["over_seeds"] and "rl_tasks" not in result["seeds"][0]
    assert result["over_seeds"]["held_out"]["after"] == {
        "mean": 0.5,
        "std": 0.0,
        "min": 0.5,
        "max": 0.5,
        "n": 1,
    }


def test_main_from_runs_writes_json_and_plot(runs, tmp_path, capsys):
    out = tmp_path / "results" / "quickstart.json"
    assert quickstart.main(["quickstart", "--from-runs", *map(str, runs), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["command"].startswith("python benchmarks/bench_training.py quickstart --from-runs ")
    assert result["benchmark"] == "quickstart" and "cpu_model" in result["machine"]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "0.25 ± 0.03 → 0.5 ± 0.03" in printed  # seed 0, held-out: the page's section
    assert "783 s wall" in printed  # seed 0's wall time


def test_unfinished_run_is_a_clear_error(runs, tmp_path, capsys):
    (runs[1] / "summary.json").unlink()
    with pytest.raises(SystemExit):
        quickstart.main(["quickstart", "--from-runs", *map(str, runs), "--out", str(tmp_path / "q.json")])
    assert "no summary.json in" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="the run did not finish"):
        quickstart.read_run(runs[1])


def test_summary_without_held_out_before_and_after_is_rejected(tmp_path):
    run = make_run(tmp_path / "r", 0, (0.25, 0.5), None)
    (run / "summary.json").write_text(json.dumps({"iterations": 0, "algo": "progpo"}))
    with pytest.raises(ValueError, match="no held-out success"):
        quickstart.read_run(run)


def test_the_first_run_must_be_the_main_job(runs):
    with pytest.raises(ValueError, match="must be the main job"):
        quickstart.build_result([runs[1], runs[0]])


def test_seed_commands_are_the_readme_job_and_its_warm_start():
    assert quickstart.train_arguments(0) == ["--run-dir", "runs/quickstart", "progress=false"]
    assert quickstart.train_arguments(1) == [
        "--run-dir",
        "runs/quickstart_seed1",
        "progress=false",
        "model.path=runs/quickstart/reference",
        "warm_start.enabled=false",
        "seed=1",
    ]


def test_seed_overrides_are_valid_config_keys():
    from training.cli import build_parser
    from training.config import load_config

    args = build_parser().parse_args(quickstart.train_arguments(2))
    config = load_config(None, [*args.overrides, f"run_dir={args.run_dir}"])
    assert (config.seed, config.warm_start.enabled) == (2, False)
    assert config.model.path == "runs/quickstart/reference" and config.progress is False


def test_a_training_run_records_the_process_resources(tmp_path):
    # --help-config: the training CLI's quickest successful exit (it lists the keys, trains nothing)
    command = train_command(["--run-dir", str(tmp_path / "run"), "--help-config"])
    record = quickstart.run_recorded(command, tmp_path / "run", "train.log", timeout_s=120)
    assert record["status"] == "ok" and record["returncode"] == 0
    resources = record["resources"]
    assert resources["wall_s"] > 0 and resources["user_cpu_s"] > 0 and 0.01 < resources["peak_rss_gb"] < 10
    assert json.loads((tmp_path / "run" / quickstart.RESOURCES_FILE).read_text()) == record
    assert "algo.name" in (tmp_path / "run" / "train.log").read_text()


def test_memory_budgets_of_the_presets(tmp_path):
    out = tmp_path / "memory_budget.json"
    assert quickstart.main(["memory_budget", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 2 * 2  # presets × engines × models × GPU counts
    one_gpu = {(r["preset"], r["model"], r["engine"]): r for r in rows if r["gpus"] == 1}
    assert one_gpu[("alfworld_progpo_qwen2.5-1.5b", "Qwen2.5-1.5B", "transformers")]["fits"]
    assert all(
        r["gib"]["total"] == pytest.approx(sum(v for k, v in r["gib"].items() if k != "total"), abs=0.5)
        for r in rows
    )
