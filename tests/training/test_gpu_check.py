"""``scripts/gpu_check.sh --variants``: a subset of the GPU check, so that it fits a machine lent for a few
minutes a command (the whole dry run is a rehearsal test, ``tests/training/test_gpu_rehearsal.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.paths import REPO_ROOT

GPU_CHECK = ["bash", str(REPO_ROOT / "scripts" / "gpu_check.sh")]


def test_a_subset_runs_only_its_variants_and_pairs_the_async_one_with_its_lockstep_baseline(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [*GPU_CHECK, "--dry-run", "--variants", "transformers", "async", "--out", str(out), "--threads", "1"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = json.loads(out.read_text())
    assert done.returncode == 0, (result.get("error"), done.stderr[-3000:])
    assert list(result["variants"]) == ["transformers", "async"]
    assert result["status"] == "passed" and result["async_rollout_speedup"]["async"] > 0


def test_an_unknown_variant_is_one_usage_line(tmp_path):
    done = subprocess.run(
        [*GPU_CHECK, "--variants", "tpu", "--out", str(tmp_path / "gpu.json")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "invalid choice: 'tpu'" in done.stderr
    assert not (tmp_path / "gpu.json").exists()
