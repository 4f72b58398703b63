"""The estimators suite: the estimator specs, the RL comparison's metric extraction and aggregation by hand,
its settings, a smoke run (slow); the speed part on small batches."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_estimators as ce
from benchmarks.common import mean_spread

#: ProGPO's first reading (before issue 20): terminal potential r_succ under the step-return target, every
#: depth's precision summed, normalised-text expansion, the row's own return inside its potential.
PROGPO_FIRST_READING = {
    "success_potential": 10,
    "dedup_depths": False,
    "semantic": "normalized_text",
    "leave_one_out": False,
}


def progpo_spec(**changes) -> str:
    """The estimator spec of ProGPO's first reading with ``changes`` applied (every ablated key spelled out).

    Example:
        >>> progpo_spec(success_potential=0)
        'progpo:success_potential=0,dedup_depths=false,semantic=normalized_text,leave_one_out=false'
    """
    params = {**PROGPO_FIRST_READING, **changes}
    return "progpo:" + ",".join(f"{k}={json.dumps(v).strip(chr(34))}" for k, v in params.items())


RECORDS = [
    {"kind": "warm_start", "iteration": 0},
    {"kind": "eval", "label": "before_rl", "iteration": 0, "success": 0.25, "invalid_rate": 0.5},
    {"kind": "train", "iteration": 1, "success": 0.5},
    {"kind": "train", "iteration": 2, "success": 0.75},
    {
        "kind": "eval",
        "label": "after_rl",
        "iteration": 2,
        "success": 0.5,
        "score": 5.0,
        "invalid_rate": 0.25,
        "episode_steps": 7.0,
        "success/pick_and_place_simple": 1.0,
        "success_per_seed": [0.5],
        "label2": "x",
    },
]


def test_final_metrics_and_curve():
    assert ce.final_metrics(RECORDS) == {
        "success": 0.5,
        "score": 5.0,
        "invalid_rate": 0.25,
        "episode_steps": 7.0,
        "success/pick_and_place_simple": 1.0,
    }
    assert ce.final_metrics(RECORDS, "before_rl") == {"success": 0.25, "invalid_rate": 0.5}
    assert ce.final_metrics([]) == {}
    assert ce.curve(RECORDS) == [(1, 0.5), (2, 0.75)]


def test_final_metrics_add_the_rl_task_pool_success():
    pool = [
        {"kind": "eval_rl_tasks", "label": "before_rl", "iteration": 0, "success": 0.125},
        {"kind": "eval_rl_tasks", "label": "after_rl", "iteration": 2, "success": 0.625},
    ]
    assert ce.final_metrics(RECORDS + pool)["rl_tasks_success"] == 0.625
    assert ce.final_metrics(RECORDS + pool, "before_rl") == {
        "success": 0.25,
        "invalid_rate": 0.5,
        "rl_tasks_success": 0.125,
    }
    assert "rl_tasks_success" not in ce.final_metrics(RECORDS)  # no pool evaluation: no column value


def test_mean_spread_by_hand():
    s = mean_spread([0.2, 0.4, 0.9])
    assert s["mean"] == pytest.approx(0.5) and s["n"] == 3
    assert s["std"] == pytest.approx(((0.09 + 0.01 + 0.16) / 2) ** 0.5)  # sample std, ddof 1
    assert mean_spread([0.3])["std"] == 0.0
    assert mean_spread([])["mean"] is None


def test_summarise_keeps_every_started_run():
    runs = [
        {"env": "alfworld", "estimator": "grpo", "seed": 0, "status": "ok", "final": {"success": 0.2}},
        {"env": "alfworld", "estimator": "grpo", "seed": 1, "status": "ok", "final": {"success": 0.4}},
        {"env": "alfworld", "estimator": "progpo", "seed": 0, "status": "timeout", "final": {}},
    ]
    display, stats, names = ce.summarise(runs)
    assert display["alfworld / grpo"]["success"] == "0.300 ± 0.141 (n=2)"
    assert display["alfworld / progpo"]["success"] == "—"
    assert display["alfworld / progpo"]["runs finished / started"] == "0 / 1"
    assert stats["alfworld / grpo"]["started"] == 2 and names[-1] == "runs finished / started"


def test_resummarise_reads_the_run_folders_again(tmp_path):
    """Numbers the training logged but an older comparison did not collect come back from the run folders;
    nothing else of the result changes."""
    ws_dir, run_dir = tmp_path / "warm_start", tmp_path / "seed0" / "grpo"
    for folder, records in [(ws_dir, RECORDS[:2]), (run_dir, RECORDS)]:
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    old = {
        "setting": "cpu",
        "git": {"commit": "a" * 40, "dirty": False},
        "seconds": 12.0,
        "warm_starts": [{"env": "alfworld", "run_dir": str(ws_dir), "before_rl": {}}],
        "runs": [
            {
                "env": "alfworld",
                "estimator": "grpo",
                "seed": 0,
                "status": "ok",
                "run_dir": str(run_dir),
                "final": {"success": 0.5},
                "curve": [],
            },
            {
                "env": "alfworld",
                "estimator": "progpo",
                "seed": 0,
                "status": "timeout",
                "run_dir": str(tmp_path / "missing"),
                "final": {},
            },
        ],
    }
    new = ce.resummarise(old)
    assert new["runs"][0]["final"] == ce.final_metrics(RECORDS) and new["runs"][0]["curve"] == [
        (1, 0.5),
        (2, 0.75),
    ]
    assert new["runs"][0]["before_rl"] == {"success": 0.25, "invalid_rate": 0.5}
    assert new["runs"][1]["final"] == {}  # a run that did not finish stays without numbers
    assert new["summary"]["alfworld / grpo"]["episode_steps"] == "7.000 ± 0.000 (n=1)"
    assert new["git"] == old["git"] and new["seconds"] == 12.0 and "resummarised_by" in new
    assert old["runs"][0]["final"] == {"success": 0.5}  # the input is not modified


def test_learning_curves_get_one_panel_per_env_and_logged_curve(tmp_path):
    from PIL import Image

    runs = [
        {"env": "alfworld", "estimator": "grpo", "curve": [[1, 0.2], [2, 0.4]], "score_curve": []},
        {"env": "webshop", "estimator": "grpo", "curve": [[1, 0.0]], "score_curve": [[1, 0.3]]},
    ]
    ce.plot_rl({"runs": runs}, tmp_path / "curves.png")
    # alfworld success, webshop success, webshop purchase score: three 6.5-inch panels at 110 dpi
    assert Image.open(tmp_path / "curves.png").size[0] == round(3 * 6.5 * 110)


def test_settings_use_known_estimators_and_cover_three_seeds():
    from training.config import algo_choices

    for name, setting in ce.SETTINGS.items():
        names = {ce.parse_estimator_spec(spec)[0] for spec in setting.estimators}  # specs: name:key=value
        assert names <= set(algo_choices()), name
        assert set(setting.envs) <= set(ce.ENV_OVERRIDES), name
    ablation = ce.SETTINGS["quickstart_ablation"]
    # GRPO, the first reading, each change of the defaults alone (not leave-one-out), the current defaults:
    # the YAML spells the specs out, every ablated parameter of the first reading in each
    changes = [
        progpo_spec(success_potential=0),
        progpo_spec(dedup_depths=True),
        progpo_spec(semantic="similarity"),
    ]
    assert len(ablation.seeds) >= 3
    assert ablation.estimators == ["grpo", progpo_spec(), *changes, "progpo"]
    assert len(ce.SETTINGS["cpu"].seeds) >= 3 and len(ce.SETTINGS["gpu"].seeds) >= 3
    assert set(ce.SETTINGS["cpu"].estimators) == set(ce.ESTIMATOR_LIST)
    assert set(ce.SETTINGS["cpu"].envs) == {"alfworld", "webshop"}  # issue 8: both envs in the quick setting


@pytest.mark.parametrize("name", sorted(ce.SETTINGS))
def test_every_setting_builds_valid_configs(name):
    """Each env's override list (setting, env, per-env) is a valid ``progpo train`` config, later keys
    winning."""
    from training.config import load_config

    setting = ce.SETTINGS[name]
    for env in setting.envs:
        overrides = [*setting.overrides, *ce.ENV_OVERRIDES[env], *setting.env_overrides.get(env, [])]
        config = load_config(None, overrides)
        assert config.env.id == ce.ENV_OVERRIDES[env][0].split("=", 1)[1]
        if name == "cpu" and env == "webshop":
            assert config.iterations == 6 and config.env.kwargs == {"num_products": 200, "reward_mode": "raw"}
        if name == "quickstart_ablation":
            # the quickstart itself: its embedded defaults, apart from the comparison's bookkeeping keys
            quickstart = load_config(None)
            assert (config.env, config.iterations, config.rollout) == (
                quickstart.env,
                quickstart.iterations,
                quickstart.rollout,
            )
        elif env == "alfworld":
            # issue 8: evaluation in held-out scenes, which must be able to host every trained task type
            from progpo_envs.alfworld.generator import check_restriction

            assert config.env.eval_split == "valid_unseen"
            kwargs = config.env.kwargs
            check_restriction(["train", "valid_unseen"], kwargs.get("task_types"), kwargs.get("scenes"))
        if name == "gpu" and env == "alfworld":  # distinct held-out tasks, no wrap-around repeats
            assert config.eval.num_tasks <= config.env.kwargs["num_generated"]
            assert config.env.train_kwargs["num_generated"] >= config.env.kwargs["num_generated"]
        if name == "cpu" and env == "alfworld":
            assert len(config.env.kwargs["task_types"]) == 2 and 308 in config.env.kwargs["scenes"]


@pytest.mark.slow
def test_smoke_run_end_to_end(tmp_path):
    out = tmp_path / "compare.json"
    rc = ce.main(["rl", "--quick", "--runs-dir", str(tmp_path / "runs"), "--out", str(out)])
    result = json.loads(out.read_text())
    assert rc == 0, result["runs"]
    assert [r["estimator"] for r in result["runs"]] == ["grpo", "progpo"]
    for run in result["runs"]:
        assert run["status"] == "ok" and "success" in run["final"] and len(run["curve"]) == 1
    assert result["git"]["commit"] is None or len(result["git"]["commit"]) == 40
    assert (tmp_path / "compare.png").exists()


def test_estimator_specs_become_train_overrides_and_folders():
    from training.config import load_config

    spec = progpo_spec(semantic="similarity")
    config = load_config(None, ce.estimator_overrides(spec))
    assert config.algo.name == "progpo"
    assert config.algo.params == {**PROGPO_FIRST_READING, "semantic": "similarity"}
    assert ce.estimator_overrides("grpo") == ["algo.name=grpo"]
    with pytest.raises(ValueError, match="unknown estimator"):
        ce.estimator_overrides("nope:x=1")


def test_estimator_spec_parsing():
    assert ce.parse_estimator_spec("gigpo") == ("gigpo", {})
    assert ce.parse_estimator_spec("progpo:step_weight=0.5,norm=mean") == (
        "progpo",
        {"step_weight": 0.5, "norm": "mean"},
    )
    with pytest.raises(ValueError, match="key=value"):
        ce.parse_estimator_spec("gigpo:step_weight")
    with pytest.raises(ValueError, match="'omega' was renamed; use 'step_weight'"):
        ce.parse_estimator_spec("progpo:omega=0.5")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['gama'\]"):
        ce.parse_estimator_spec("gigpo:gama=0.9")
    with pytest.raises(SystemExit) as exc:  # a bad spec stops the command line before any training
        ce.main(["rl", "--estimators", "gigpo:gama=0.9"])
    assert exc.value.code == 2


def test_speed_on_small_batches(tmp_path):
    """Every registered estimator timed and checked against its per-row Python reference."""
    out = tmp_path / "advantages.json"
    assert (
        ce.main(
            [
                "speed",
                "--sizes",
                "2000",
                "4000",
                "--reference-rows",
                "1000",
                "--repeats",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert set(result["results"]) == set(ce.ESTIMATORS) and result["command"].endswith(f"--out {out}")
    for name, r in result["results"].items():
        assert r["max_abs_diff_vs_reference"] < 1e-6, (
            name
        )  # the fast estimator computes the reference's formula
        assert r["seconds_by_rows"].keys() == {"2000", "4000"}
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
