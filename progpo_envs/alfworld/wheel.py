"""The logic files shipped in the ``alfworld`` wheel, reached without ``alfworld``'s import side effects.

Everything a game is made of comes from the wheel: the PDDL domain, the TextWorld grammar, and the goal
library's task-text templates (:func:`templated_task_description`, which real-trial rebuilds and generated
games both use).

``import alfworld`` runs ``alfworld/info.py``, which creates the folder ``ALFWORLD_DATA`` names (or
``~/.cache/alfworld``) and *sets* ``os.environ["ALFWORLD_DATA"]`` when it is unset. Our loader reads
``ALFWORLD_DATA`` to decide between real data and generated games, so a stray import would silently switch it
to an empty folder, and a mistyped ``ALFWORLD_DATA`` would be created empty before the loader could say it
does not exist. :func:`import_alfworld` imports the package once with the variable naming the wheel's own
data folder (which exists: nothing is created) and puts it back as it was.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import random
from pathlib import Path
from types import ModuleType
from typing import Any

_ALFWORLD_DATA_VAR = "ALFWORLD_DATA"


def import_alfworld(module: str = "alfworld") -> ModuleType:
    """Import ``module`` (``alfworld`` or a submodule) leaving ``ALFWORLD_DATA`` as the user set it and
    creating no folder."""
    before = os.environ.get(_ALFWORLD_DATA_VAR)
    os.environ[_ALFWORLD_DATA_VAR] = str(wheel_data_dir())  # exists: alfworld/info.py's mkdirs is a no-op
    try:
        return importlib.import_module(module)
    finally:
        if before is None:
            os.environ.pop(_ALFWORLD_DATA_VAR, None)
        else:
            os.environ[_ALFWORLD_DATA_VAR] = before


@functools.cache
def wheel_data_dir() -> Path:
    """``alfworld/data`` inside the installed wheel (found without importing the package)."""
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the ALFWorld engine is not installed: pip install 'progpo-suite[alfworld]'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


@functools.cache
def wheel_domain() -> str:
    """The PDDL domain ``alfred.pddl`` of the installed wheel."""
    return (wheel_data_dir() / "alfred.pddl").read_text()


@functools.cache
def wheel_grammar() -> str:
    """The TextWorld grammar ``alfred.twl2`` of the installed wheel (task placeholder ``UNKNOWN GOAL``)."""
    return (wheel_data_dir() / "alfred.twl2").read_text()


@functools.cache
def goal_templates() -> dict[str, list[str]]:
    """Task-description templates per goal (``goal_library.gdict[goal]["templates"]``)."""
    library = import_alfworld("alfworld.gen.goal_library")
    return {goal: list(entry["templates"]) for goal, entry in library.gdict.items() if "templates" in entry}


def templated_task_description(traj_data: dict[str, Any], rng: random.Random) -> str:
    """ALFWorld's templated task text (``misc.get_templated_task_desc``), template drawn from ``rng``."""
    params = traj_data["pddl_params"]
    goal = traj_data["task_type"] + ("_slice" if params.get("object_sliced") else "")
    template = rng.choice(goal_templates()[goal])
    return template.format(
        obj=params["object_target"].lower(),
        recep=params["parent_target"].lower(),
        toggle=params["toggle_target"].lower(),
        mrecep=params["mrecep_target"].lower(),
    )
