"""The README's code, run as a user would run it: pasted into a script."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

from tests.paths import REPO_ROOT as ROOT


def readme_block(section: str) -> str:
    """The first ``python`` code block after the README heading ``section``."""
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {section}\n")
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def test_the_usage_example_does_everything_under_its_main_guard():
    """Issue 39, item 8: the block made its env and stepped it at the top level, outside ``if __name__ ==
    "__main__":``, so each subprocess of the async vector env, importing the script again, repeated it (the
    games were generated twice). At the top level now: imports, definitions and the guard, nothing else."""
    tree = ast.parse(readme_block("Usage"))
    guards = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
    ]
    definitions = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
    others = [
        ast.unparse(node).splitlines()[0]
        for node in tree.body
        if not isinstance(node, definitions) and node not in guards
    ]
    assert len(guards) == 1 and not others, others


@pytest.mark.slow  # minutes on 2 cores (it generates ALFWorld's default game sets); .ci/run runs it
def test_the_usage_example_runs_as_a_script(tmp_path):
    """Before: the async ``make_vec`` line, pasted into a script, failed in its subprocesses (no ``__main__``
    guard: each one imported the script again and started its own)."""
    script = tmp_path / "usage.py"
    script.write_text(readme_block("Usage"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("ALFWORLD_DATA", None)  # generated games, as on a fresh machine
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
