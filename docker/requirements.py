"""Print the image's Python requirements, one a line, read from pyproject.toml (stdlib only, Python >= 3.11).

One list with two readers: ``docker/install.sh`` installs it in the image and ``scripts/wheelhouse.sh`` fills
a wheelhouse with it, so the two never drift apart.

* ``requirements.py build``: pip and the build system (the project is installed with them,
  ``--no-build-isolation``);
* ``requirements.py engine``: the ``[alfworld]`` extra, installed ``--no-deps`` (keeps jericho's spaCy out, as
  ``scripts/setup.sh`` does);
* ``requirements.py deps``: the core dependencies and the ``[webshop,serve,openenv]`` extras the services
  import.

Example:
    >>> import subprocess, sys
    >>> out = subprocess.run([sys.executable, __file__, "engine"], capture_output=True, text=True).stdout
    >>> "fast-downward-textworld==20.6.4" in out.split()
    True
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib  # Python >= 3.11 (ruff files it as third-party: the project's floor is 3.10)

PYPROJECT = Path(__file__).resolve().parent / "pyproject.toml"  # in the image's build folder
if not PYPROJECT.is_file():  # in a checkout
    PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
SERVICE_EXTRAS = ("webshop", "serve", "openenv")


def requirements(kind: str) -> list[str]:
    """The requirement strings of ``kind`` (``build``, ``engine`` or ``deps``), without duplicates."""
    project = tomllib.loads(PYPROJECT.read_text())
    extras = project["project"]["optional-dependencies"]
    if kind == "build":
        found = ["pip", *project["build-system"]["requires"]]
    elif kind == "engine":
        found = list(extras["alfworld"])
    elif kind == "deps":
        found = [*project["project"]["dependencies"], *(r for e in SERVICE_EXTRAS for r in extras[e])]
    else:
        raise ValueError(f"unknown kind {kind!r}: build, engine or deps")
    return list(dict.fromkeys(found))


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("build", "engine", "deps"):
        sys.exit("usage: requirements.py build|engine|deps")
    print("\n".join(requirements(sys.argv[1])))
