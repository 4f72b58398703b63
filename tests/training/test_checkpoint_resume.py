"""``--resume`` against damaged checkpoints (issue 17, items 5 and 6).

Each corruption the attack found: an empty ``latest``, a ``latest`` naming a missing folder, a newest
checkpoint without ``state.json``, a truncated or modified ``model.pt``/``optimizer.pt``/``rng.pt``/
``state.json``, leftover temporary folders, and a pickle payload planted in a ``.pt`` file. For each, first at
the :mod:`training.checkpoint` level (fast, no model), then through a tiny ``progpo train --resume``: which
checkpoint is resumed (the newest intact one), that nothing is deleted, and the one-line refusal when no
checkpoint is intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from progpo_base.folder_lock import LOCK_FILE
from tests.paths import REPO_ROOT
from tests.training.training_helpers import TINY_OVERRIDES, subprocess_env
from training.checkpoint import (
    MANIFEST,
    CheckpointError,
    CheckpointWarning,
    check_training_state,
    latest_checkpoint,
    load_checkpoint,
    load_latest_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
    set_rng_state,
    verify_checkpoint,
    write_manifest,
)

CONFIGS = REPO_ROOT / "configs"


# ------------------------------------------------------------------------------------ helpers
def _model_and_optimizer(iteration: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(iteration)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4)).square().sum().backward()
    optimizer.step()
    return model, optimizer


def _save(root: Path, iteration: int, keep: int = 0) -> Path:
    model, optimizer = _model_and_optimizer(iteration)
    return save_checkpoint(
        root,
        iteration,
        save_model=lambda path: torch.save(model.state_dict(), path),
        optimizer_state=optimizer.state_dict(),
        state={"stage": "rl", "evaluations": []},
        config={"seed": 0},
        keep=keep,
    )


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (hidden ones included) and a hash of its bytes, but the run folder's lock: it
    names its holder's pid, written again by every start, refused or not."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != LOCK_FILE
    }


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


class _Payload:
    """Unpickling this runs code: it writes ``marker`` (what an attacker's planted ``.pt`` would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def _plant_payload(path: Path, marker: Path) -> None:
    torch.save({"state": {}, "param_groups": [], "payload": _Payload(marker)}, path)


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# ------------------------------------------------------------------------------------ round trip
def test_checkpoint_round_trips_through_weights_only_loads(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # numpy draws Gaussians in pairs: the second one is cached in its state
    folder = _save(tmp_path, 5)
    expected = (random.random(), np.random.rand(), np.random.randn(), torch.rand(2))

    manifest = json.loads((folder / MANIFEST).read_text())
    assert set(manifest["files"]) == {"model.pt", "optimizer.pt", "rng.pt", "state.json", "config.yaml"}
    for name in ("model.pt", "optimizer.pt", "rng.pt"):
        torch.load(folder / name, weights_only=True)  # every .pt is readable without unpickling code

    checkpoint = load_checkpoint(folder)
    assert checkpoint.iteration == 5 and checkpoint.state["stage"] == "rl"
    model, optimizer = _model_and_optimizer(5)
    fresh = torch.nn.Linear(4, 3)
    fresh.load_state_dict(checkpoint.model_state)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True))
    restored = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    restored.load_state_dict(checkpoint.optimizer_state)
    assert torch.equal(
        restored.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"]
    )

    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    set_rng_state(checkpoint.rng_state)  # python, numpy (including its cached Gaussian) and torch
    again = (random.random(), np.random.rand(), np.random.randn(), torch.rand(2))
    assert again[:3] == expected[:3] and torch.equal(again[3], expected[3])


# ------------------------------------------------------------------------------------ damage
def _damage_latest_empty(root: Path) -> None:
    (root / "latest").write_text("")


def _damage_latest_missing_folder(root: Path) -> None:
    (root / "latest").write_text("iter_000009")


def _list_outside_file(folder: Path) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"]["../iter_000001/model.pt"] = manifest["files"]["model.pt"]
    (folder / MANIFEST).write_text(json.dumps(manifest))


def _damage_newest(change):
    def damage(root: Path) -> None:
        change(root / "iter_000002")

    return damage


#: name -> (damage to a folder holding intact iter_000001 and iter_000002, checkpoint resumed, why skipped)
CORRUPTIONS = {
    "empty latest": (_damage_latest_empty, "iter_000002", "names ''"),
    "latest names a missing folder": (_damage_latest_missing_folder, "iter_000002", "names 'iter_000009'"),
    "no state.json": (
        _damage_newest(lambda f: (f / "state.json").unlink()),
        "iter_000001",
        "state.json is missing",
    ),
    "no manifest": (_damage_newest(lambda f: (f / MANIFEST).unlink()), "iter_000001", "no manifest.json"),
    "truncated manifest": (_damage_newest(lambda f: _truncate(f / MANIFEST)), "iter_000001", "unreadable"),
    "manifest lists a file outside": (_damage_newest(_list_outside_file), "iter_000001", "outside"),
    **{
        f"truncated {name}": (_damage_newest(lambda f, n=name: _truncate(f / n)), "iter_000001", "bytes")
        for name in ("model.pt", "optimizer.pt", "rng.pt", "state.json")
    },
    **{
        f"modified {name}": (_damage_newest(lambda f, n=name: _flip_last_byte(f / n)), "iter_000001", "hash")
        for name in ("model.pt", "optimizer.pt", "rng.pt", "state.json")
    },
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_resume_picks_the_newest_intact_checkpoint_and_deletes_nothing(tmp_path, corruption):
    damage, expected, why = CORRUPTIONS[corruption]
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    damage(tmp_path)
    before = _snapshot(tmp_path)
    with pytest.warns(CheckpointWarning, match=why):
        checkpoint = load_latest_checkpoint(tmp_path)
    assert checkpoint.folder.name == expected and checkpoint.iteration == int(expected[-1])
    with pytest.warns(CheckpointWarning, match=why):
        assert latest_checkpoint(tmp_path).name == expected
    assert _snapshot(tmp_path) == before


def _rewrite(folder: Path, name: str, change) -> None:
    """Load ``name``, change it, save it back and rewrite the manifest (a writer bug or tampering: the
    checkpoint verifies)."""
    if name.endswith(".json"):
        data = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps(change(data)))
    else:
        torch.save(change(torch.load(folder / name, weights_only=True)), folder / name)
    write_manifest(folder)


def _nan_weight(state: dict) -> dict:
    state["weight"][0, 0] = float("nan")
    return state


def _wrong_shape_moment(state: dict) -> dict:
    state["state"][0]["exp_avg"] = torch.zeros(3)
    return state


#: name -> (a change that keeps the manifest consistent, why the checkpoint is refused)
LOADABLE_BUT_BROKEN = {
    "empty optimizer state": (("optimizer.pt", lambda state: {}), "no 'state' and 'param_groups'"),
    "wrong-shape weight": (("model.pt", lambda state: {**state, "weight": torch.zeros(2, 2)}), "shape"),
    "missing weight": (("model.pt", lambda state: {"bias": state["bias"]}), "this model's weights"),
    "NaN weight": (("model.pt", _nan_weight), "non-finite"),
    "wrong-shape Adam moment": (("optimizer.pt", _wrong_shape_moment), "exp_avg"),
    "iteration 10**9": (("state.json", lambda state: {**state, "iteration": 10**9}), "iteration 1000000000"),
    "iteration -7": (("state.json", lambda state: {**state, "iteration": -7}), "iteration -7"),
}


@pytest.mark.parametrize("case", list(LOADABLE_BUT_BROKEN))
def test_a_checkpoint_that_loads_but_does_not_fit_falls_back_to_the_older_one(tmp_path, case):
    (name, change), why = LOADABLE_BUT_BROKEN[case]
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    _rewrite(tmp_path / "iter_000002", name, change)
    verify_checkpoint(tmp_path / "iter_000002")  # intact as far as the manifest can tell
    model, optimizer = _model_and_optimizer(0)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}

    def fits(checkpoint) -> None:
        check_training_state(checkpoint, shapes, [tuple(p.shape) for p in model.parameters()], 5)

    before = _snapshot(tmp_path)
    with pytest.warns(CheckpointWarning, match=why):
        checkpoint = load_latest_checkpoint(tmp_path, check=fits)
    assert checkpoint.folder.name == "iter_000001"
    assert _snapshot(tmp_path) == before  # nothing deleted
    optimizer.load_state_dict(checkpoint.optimizer_state)  # what the older one holds does fit


def test_no_checkpoint_at_all_is_a_fresh_run(tmp_path):
    assert load_latest_checkpoint(tmp_path / "missing") is None
    assert load_latest_checkpoint(tmp_path) is None
    (tmp_path / ".tmp-iter_000001-1").mkdir()  # killed while writing the first checkpoint: none complete
    assert load_latest_checkpoint(tmp_path) is None


@pytest.mark.parametrize(
    "damage",
    ["every checkpoint damaged", "empty latest only", "latest names a missing folder only"],
)
def test_resume_refuses_when_no_checkpoint_is_intact(tmp_path, damage):
    if damage == "every checkpoint damaged":
        _save(tmp_path, 1)
        _save(tmp_path, 2)
        (tmp_path / "iter_000002" / "state.json").unlink()
        _truncate(tmp_path / "iter_000001" / "rng.pt")
    else:
        (tmp_path / "latest").write_text("" if damage == "empty latest only" else "iter_000004")
    before = _snapshot(tmp_path)
    for find in (load_latest_checkpoint, latest_checkpoint):
        with pytest.raises(CheckpointError, match="no intact checkpoint") as error:
            find(tmp_path)
        assert "\n" not in str(error.value) and "nothing was deleted" in str(error.value)
    if damage == "every checkpoint damaged":
        assert "iter_000002: state.json is missing" in str(error.value)
        assert "iter_000001: rng.pt has" in str(error.value)
    assert _snapshot(tmp_path) == before


# ------------------------------------------------------------------------------------ payloads
@pytest.mark.parametrize("name", ["rng.pt", "optimizer.pt", "model.pt"])
def test_planted_pickle_payload_never_runs(tmp_path, name):
    marker = tmp_path / "payload_ran"
    root = tmp_path / "checkpoints"
    _save(root, 1)
    _save(root, 2)
    planted = root / "iter_000002" / name
    _plant_payload(planted, marker)

    # the manifest catches a plain swap before anything is unpickled
    with pytest.warns(CheckpointWarning, match=f"{name} (has|does not match)"):
        assert load_latest_checkpoint(root).folder.name == "iter_000001"
    # an attacker who also rewrites the manifest: weights_only refuses the file, which counts as damage
    write_manifest(root / "iter_000002")
    verify_checkpoint(root / "iter_000002")
    with pytest.raises(CheckpointError, match=f"{name} does not load"):
        load_checkpoint(root / "iter_000002")
    with pytest.warns(CheckpointWarning, match=f"{name} does not load"):
        assert load_latest_checkpoint(root).folder.name == "iter_000001"
    assert not marker.exists()
    # the payload is real: the loader this replaces would have run it
    torch.load(planted, weights_only=False)
    assert marker.read_text() == "ran"


# ------------------------------------------------------------------------------------ temporaries
def test_only_dead_writers_temporaries_are_removed(tmp_path):
    _save(tmp_path, 1)
    dead = _dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = [tmp_path / f".tmp-iter_000002-{dead}", tmp_path / f".old-iter_000001-{dead}"]
        ours = tmp_path / f".tmp-iter_000003-{os.getpid()}"
        busy = tmp_path / f".tmp-iter_000002-{live.pid}"
        for folder in (*stale, ours, busy):
            folder.mkdir()
            (folder / "model.pt").write_bytes(b"partial")
        (tmp_path / f".latest.tmp-{dead}").write_text("iter_000002")
        (tmp_path / ".notes").write_text("not ours")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # temporaries are not checkpoints: nothing to warn about
            assert load_latest_checkpoint(tmp_path).folder.name == "iter_000001"
        assert (
            busy.exists() and ours.exists() and all(folder.exists() for folder in stale)
        )  # reading deletes nothing

        assert sorted(p.name for p in remove_stale_temporaries(tmp_path)) == sorted(
            [stale[0].name, stale[1].name, ours.name, f".latest.tmp-{dead}"]
        )
        assert busy.exists() and (tmp_path / ".notes").exists() and (tmp_path / "iter_000001").exists()
        _save(tmp_path, 2)  # a write cleans up the same way
        assert busy.exists()
    finally:
        live.kill()
        live.wait()


# ------------------------------------------------------------------------------------ writing and pruning
def test_pruning_keeps_older_intact_checkpoints_past_a_damaged_newer_one(tmp_path):
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    _truncate(tmp_path / "iter_000002" / "model.pt")
    _save(tmp_path, 3, keep=2)
    # the two newest intact are 3 and 1: neither 1 nor the damaged 2 (newer than a kept one) is removed
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_000001", "iter_000002", "iter_000003"]
    _save(tmp_path, 4, keep=2)
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_000003", "iter_000004"]


def test_a_new_checkpoint_that_does_not_verify_prunes_nothing(tmp_path, monkeypatch):
    _save(tmp_path, 1)
    _save(tmp_path, 2)

    def corrupting_save_model(path: Path) -> None:
        torch.save({"w": torch.ones(3)}, path)

    import training.checkpoint as checkpoint_module

    original_manifest = checkpoint_module.write_manifest

    def manifest_then_damage(folder: Path):
        manifest = original_manifest(folder)
        _truncate(folder / "model.pt")  # the disk lost the end of the file after the manifest was written
        return manifest

    monkeypatch.setattr(checkpoint_module, "write_manifest", manifest_then_damage)
    with pytest.raises(CheckpointError, match="model.pt has"):
        save_checkpoint(
            tmp_path,
            3,
            save_model=corrupting_save_model,
            optimizer_state={},
            state={},
            config={},
            keep=1,
        )
    assert (tmp_path / "latest").read_text() == "iter_000002"
    assert (tmp_path / "iter_000001").exists() and (tmp_path / "iter_000002").exists()
    monkeypatch.undo()
    with pytest.warns(CheckpointWarning, match="iter_000003: model.pt has"):
        assert load_latest_checkpoint(tmp_path).folder.name == "iter_000002"


def test_saving_an_iteration_again_replaces_it_whole(tmp_path):
    _save(tmp_path, 2)
    model = torch.nn.Linear(4, 3)
    save_checkpoint(
        tmp_path,
        2,
        save_model=lambda path: torch.save(model.state_dict(), path),
        optimizer_state={},
        state={"stage": "final"},
        config={},
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_000002", "latest"]
    checkpoint = load_latest_checkpoint(tmp_path)
    assert checkpoint.state["stage"] == "final" and torch.equal(
        checkpoint.model_state["weight"], model.weight
    )


# ------------------------------------------------------------------------------------ through the trainer
RUN_ARGS = (
    "iterations=2",
    "checkpoint_every=1",
    "keep_checkpoints=3",
    "warm_start.enabled=false",
    "eval.num_tasks=0",
)


def _train_args(run_dir: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(CONFIGS / "quickstart.yaml"),
        *TINY_OVERRIDES,
        f"run_dir={run_dir}",
        *RUN_ARGS,
        *extra,
    ]


def _train_records(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if "time" not in k and "per_s" not in k}
        for r in records
        if r["kind"] == "train"
    ]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A tiny 2-iteration run with checkpoints iter_000000, iter_000001 and iter_000002."""
    run_dir = tmp_path_factory.mktemp("resume") / "run"
    done = subprocess.run(
        [sys.executable, "-m", "training.cli", *_train_args(run_dir)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*")) == [
        "iter_000000",
        "iter_000001",
        "iter_000002",
    ]
    return run_dir


def _resume(run_dir: Path, monkeypatch, capsys) -> tuple[int, str, str]:
    from training.cli import main

    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    code = main(_train_args(run_dir, "--resume"))
    out, err = capsys.readouterr()
    return code, out, err


def _in_newest(change):
    def damage(checkpoints: Path) -> None:
        change(checkpoints / "iter_000002")

    return damage


def _planted_with_manifest(marker_name: str):
    def damage(checkpoints: Path) -> None:
        _plant_payload(checkpoints / "iter_000002" / "rng.pt", checkpoints.parent / marker_name)
        write_manifest(checkpoints / "iter_000002")

    return damage


#: name -> (damage to the finished run's checkpoints folder, iteration resumed from)
TRAINER_CORRUPTIONS = {
    "empty latest": (_damage_latest_empty, 2),
    "latest names a missing folder": (_damage_latest_missing_folder, 2),
    "no state.json": (_in_newest(lambda f: (f / "state.json").unlink()), 1),
    **{
        f"truncated {name}": (_in_newest(lambda f, n=name: _truncate(f / n)), 1)
        for name in ("model.pt", "optimizer.pt", "rng.pt", "state.json")
    },
    "planted rng.pt": (_in_newest(lambda f: _plant_payload(f / "rng.pt", f.parents[1] / "payload_ran")), 1),
    "planted rng.pt, manifest rewritten": (_planted_with_manifest("payload_ran"), 1),
    "NaN weights, manifest rewritten": (
        _in_newest(lambda f: _rewrite(f, "model.pt", lambda s: {k: v * float("nan") for k, v in s.items()})),
        1,
    ),
    "iteration 10**9, manifest rewritten": (
        _in_newest(lambda f: _rewrite(f, "state.json", lambda s: {**s, "iteration": 10**9})),
        1,
    ),
}
#: the rest: -m slow
_FAST = {
    "no state.json",
    "truncated optimizer.pt",
    "planted rng.pt, manifest rewritten",
    "NaN weights, manifest rewritten",
}


@pytest.mark.parametrize(
    "corruption",
    [pytest.param(name, marks=[] if name in _FAST else [pytest.mark.slow]) for name in TRAINER_CORRUPTIONS],
)
def test_trainer_resumes_from_the_newest_intact_checkpoint(
    finished_run, tmp_path, corruption, monkeypatch, capsys
):
    damage, resumed_from = TRAINER_CORRUPTIONS[corruption]
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    stale = run_dir / "checkpoints" / f".tmp-iter_000003-{_dead_pid()}"  # a leftover of a killed writer
    stale.mkdir()
    damage(run_dir / "checkpoints")
    with pytest.warns(CheckpointWarning):
        code, out, _ = _resume(run_dir, monkeypatch, capsys)
    assert code == 0
    assert f"resumed from iteration {resumed_from}" in out
    assert not (run_dir / "payload_ran").exists()
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("iter_*")) == ["iter_000000", "iter_000001", "iter_000002"]
    assert all(verify_checkpoint(folder) is None for folder in checkpoints.glob("iter_*"))
    # the metrics continue the run (not rewritten by a fresh start), and the retrained iteration is exact
    assert _train_records(run_dir) == _train_records(finished_run)
    if resumed_from == 1:  # iteration 2 was trained again and its checkpoint written again: the stale is gone
        assert not stale.exists()


def test_trainer_refuses_in_one_line_when_no_checkpoint_is_intact(
    finished_run, tmp_path, monkeypatch, capsys
):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    checkpoints = run_dir / "checkpoints"
    (checkpoints / "latest").write_text("")
    (checkpoints / "iter_000002" / "state.json").unlink()
    _truncate(checkpoints / "iter_000001" / "optimizer.pt")
    _plant_payload(checkpoints / "iter_000000" / "rng.pt", run_dir / "payload_ran")
    write_manifest(checkpoints / "iter_000000")
    before = _snapshot(run_dir)
    code, out, err = _resume(run_dir, monkeypatch, capsys)
    before.pop("config.yaml")  # the run's config, written again by every start (this copy's run_dir differs)
    assert code != 0
    assert err.count("\n") == 1 and "no intact checkpoint" in err and "rng.pt does not load" in err
    assert "resumed" not in out
    assert not (run_dir / "payload_ran").exists()
    after = _snapshot(run_dir)
    after.pop("config.yaml")
    assert after == before  # no checkpoint deleted, metrics.jsonl not rewritten
