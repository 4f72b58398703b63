"""Where the tests find the repository, and how their subprocesses import the test packages.

One :data:`REPO_ROOT` here, so that no test counts ``Path(__file__).parents`` (a count a move breaks).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: The repository's root folder (the one holding pyproject.toml and the ``tests`` package).
REPO_ROOT = Path(__file__).resolve().parents[1]


def repo_on_pythonpath(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with the repository root first on ``PYTHONPATH``.

    pytest puts the root on ``sys.path`` (its ``pythonpath`` setting), which spawned workers inherit but a
    subprocess does not: one that imports a test module (``tests.<package>.<module>``, e.g. by ``progpo serve
    --import`` or an env id's entry point) is started with this environment.
    """
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env
