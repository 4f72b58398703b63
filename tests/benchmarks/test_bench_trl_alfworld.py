"""TRL on ALFWorld's result file from run folders: hand-made ``result.json`` files of three seeds (no
training), the numbers over seeds, the page's section, the plot, the seeds' arguments and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_training as trl_alfworld


def make_run(folder: Path, seed: int, before: float, after: float, resources: dict | None = None) -> Path:
    """A finished run folder as ``examples/trl_alfworld.py`` leaves it: ``result.json``."""
    settings = {"seed": seed, "eval_seeds": 2, "temperature": 1.0, "grpo_steps": 40}

    def evaluation(success: float) -> dict:
        return {"success": success, "spread": 0.02, "per_sampling_seed": [success - 0.02, success + 0.02]}

    result = {
        "settings": settings,
        "held_out_tasks": list(range(32)),
        "before": evaluation(before),
        "after": evaluation(after),
        **({"warm_start_from": "runs/trl_alfworld/seed0/sft"} if seed else {"sft": {"sft_loss_last": 0.3}}),
    }
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(result))
    if resources is not None:
        record = {"status": "ok", "command": "python examples/trl_alfworld.py", "resources": resources}
        (folder / "resources.json").write_text(json.dumps(record))
    return folder


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    cost = {"wall_s": 1500.0, "user_cpu_s": 2900.0, "system_cpu_s": 30.0, "peak_rss_gb": 2.1}
    return [
        make_run(tmp_path / "seed0", 0, 0.25, 0.5, cost),
        make_run(tmp_path / "seed1", 1, 0.25, 0.375),
        make_run(tmp_path / "seed2", 2, 0.3125, 0.4375),
    ]


def test_result_per_seed_and_over_seeds(runs):
    result = trl_alfworld.build_trl_result(runs)
    assert [s["seed"] for s in result["seeds"]] == [0, 1, 2]
    assert [(s["before"], s["after"]) for s in result["seeds"]] == [
        (0.25, 0.5),
        (0.25, 0.375),
        (0.3125, 0.4375),
    ]
    assert result["seeds"][0]["change"] == pytest.approx(0.25)
    assert result["seeds"][0]["resources"]["wall_s"] == 1500.0 and result["seeds"][1]["resources"] is None
    assert result["seeds"][1]["warm_start_from"] == "runs/trl_alfworld/seed0/sft"
    assert result["mean_before"] == pytest.approx(0.8125 / 3)
    assert result["mean_after"] == pytest.approx(1.3125 / 3)
    assert result["std_after"] == pytest.approx(0.0625)  # sample std (n - 1)
    assert result["mean_change"] == pytest.approx(0.5 / 3)
    assert (result["seeds_where_it_rose"], result["seeds_where_it_fell"]) == (3, 0)
    # the mean change (0.167) is larger than the std after (0.0625) and the sampling spread (0.02)
    assert result["gain_beyond_spread"] is True and result["max_sampling_spread"] == 0.02
    assert result["held_out_tasks"] == 32 and result["eval_seeds"] == 2


def test_no_gain_beyond_the_spread(tmp_path):
    runs = [make_run(tmp_path / f"seed{k}", k, 0.25, after) for k, after in enumerate((0.5, 0.125, 0.3125))]
    result = trl_alfworld.build_trl_result(runs)
    assert result["mean_change"] == pytest.approx(0.0625) and result["std_after"] > 0.0625
    assert result["gain_beyond_spread"] is False
    assert (result["seeds_where_it_rose"], result["seeds_where_it_fell"]) == (2, 1)


def test_the_section_and_the_plot(runs, tmp_path):
    result = trl_alfworld.build_trl_result(runs)
    section = trl_alfworld.render_trl(result)
    assert "32 generated valid_seen tasks × 2 sampling seeds" in section
    assert "| mean ± std (n = 3) |" in section and "after 40 GRPOTrainer steps" in section
    assert "GRPO raised success beyond the spread: True (rose in 3, fell in 0 of 3 seeds)" in section
    trl_alfworld.plot_trl(result, tmp_path / "trl_alfworld.png")
    assert (tmp_path / "trl_alfworld.png").stat().st_size > 0


def test_from_runs_writes_the_result_and_a_missing_run_is_a_usage_error(runs, tmp_path, capsys):
    out = tmp_path / "out" / "trl_alfworld.json"
    assert trl_alfworld.main(["trl", "--from-runs", *map(str, runs), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert set(written) >= {"seeds", "mean_before", "mean_after", "std_after", "command", "machine"}
    assert written["command"].startswith("python benchmarks/bench_training.py trl --from-runs")
    assert out.with_suffix(".png").is_file()
    with pytest.raises(SystemExit) as stop:
        trl_alfworld.main(["trl", "--from-runs", str(tmp_path / "nowhere")])
    assert stop.value.code == 2 and "no result.json" in capsys.readouterr().err


def test_seeds_after_the_first_start_from_its_warm_start():
    parent = Path("runs/trl_alfworld")
    assert trl_alfworld.seed_arguments(0, parent, False) == [
        "--seed",
        "0",
        "--run-dir",
        "runs/trl_alfworld/seed0",
    ]
    assert "--warm-start" not in trl_alfworld.seed_arguments(2, parent, True, ("--grpo-steps=5",))
    assert trl_alfworld.seed_arguments(2, parent, False, ("--grpo-steps=5",))[-3:] == [
        "--warm-start",
        "runs/trl_alfworld/seed0/sft",
        "--grpo-steps=5",
    ]
