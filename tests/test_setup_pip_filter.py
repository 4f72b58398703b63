"""scripts/setup.sh hides pip's one expected conflict notice (jericho's spaCy) and nothing else.

The filter (scripts/pip_expected_conflicts.awk) runs on pip's stderr as setup.sh runs it; the exit status
test runs setup.sh's own ``pip_install`` function (cut out of the script) with a stand-in ``pip`` that fails.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.paths import REPO_ROOT as REPO

FILTER = REPO / "scripts" / "pip_expected_conflicts.awk"
HEADING = (
    "ERROR: pip's dependency resolver does not currently take into account all the packages that are "
    "installed. This behaviour is the source of the following dependency conflicts."
)
JERICHO = "jericho 3.3.1 requires spacy>=2.1.0, which is not installed."
OTHER = "foo 1.0 requires bar<2, but you have bar 3.0 which is incompatible."

pytestmark = pytest.mark.skipif(shutil.which("awk") is None, reason="needs awk")


def _filter(text: str) -> list[str]:
    result = subprocess.run(
        ["awk", "-f", str(FILTER)], input=text, capture_output=True, text=True, check=True
    )
    return result.stdout.splitlines()


def test_the_expected_conflict_is_hidden_and_named_in_one_line():
    lines = _filter(f"WARNING: before\n{HEADING}\n{JERICHO}\nWARNING: after\n")
    assert lines[:2] == ["WARNING: before", "WARNING: after"]
    assert len(lines) == 3 and lines[2].startswith("[setup] skipped spaCy") and "jericho" in lines[2]
    assert not any(line.startswith("ERROR") for line in lines)


def test_other_conflicts_and_errors_are_shown():
    lines = _filter(f"{HEADING}\n{JERICHO}\n{OTHER}\nERROR: No matching distribution found for nope\n")
    assert lines[:3] == [HEADING, OTHER, "ERROR: No matching distribution found for nope"]
    assert _filter(f"{HEADING}\n{OTHER}\n") == [HEADING, OTHER]  # nothing skipped: no note either


def _pip_install_function() -> str:
    text = (REPO / "scripts" / "setup.sh").read_text()
    match = re.search(r"^pip_install\(\) \{\n.*?^\}\n", text, flags=re.M | re.S)
    assert match, "setup.sh has no pip_install function"
    return match.group(0)


@pytest.mark.parametrize("status", [0, 1])
def test_pip_install_keeps_pips_exit_status_and_output(tmp_path, status):
    fake_pip = tmp_path / "pip"
    fake_pip.write_text(
        f"#!/bin/sh\necho installing\necho \"{HEADING}\" >&2\necho '{JERICHO}' >&2\nexit {status}\n"
    )
    fake_pip.chmod(0o755)
    script = (
        f"set -euo pipefail\ncd {REPO}\nPIP={fake_pip}\n{_pip_install_function()}pip_install x\necho after\n"
    )
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert result.returncode == status
    assert result.stdout.splitlines() == (["installing", "after"] if status == 0 else ["installing"])
    assert "ERROR" not in result.stderr and "skipped spaCy" in result.stderr
