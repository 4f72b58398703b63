"""``scripts/serving_probe.py``'s in-process ALFWorld measurement runs end to end on a small scale (the
servers' measurements start servers of their own for minutes: they are run by hand, their results in the
script)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.paths import REPO_ROOT as ROOT

SCRIPT = ROOT / "scripts" / "serving_probe.py"


def test_copies_measures_what_closed_engines_leave_behind():
    command = [sys.executable, str(SCRIPT), "copies", "--engines", "2", "--extra", "2", "--steps", "3"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["measure"] == "alfworld_idle_planner_copies" and result["extra"] == 2
    rss = result["rss_mib"]
    assert 0 < rss["before"] <= rss["with_extra"]  # two more engines and planner copies: never less memory
    assert result["growth"] == round(rss["after_closing_extra"] / rss["before"] - 1, 4)
