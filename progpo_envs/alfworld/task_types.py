"""ALFWorld's six task types: the one list every module of the ALFWorld env reads.

Example:
    >>> TaskType("pick_heat_then_place_in_recep") is TaskType.HEAT
    True
    >>> TASK_TYPES[1]
    'look_at_obj_in_light'
"""

from __future__ import annotations

import enum


class TaskType(str, enum.Enum):
    """The six ALFWorld task types (``alfworld.agents.environment.alfred_tw_env.TASK_TYPES``), in ALFWorld's
    numbering order (``env.task_types: [1, ..., 6]`` in its config)."""

    PICK = "pick_and_place_simple"
    LOOK = "look_at_obj_in_light"
    CLEAN = "pick_clean_then_place_in_recep"
    HEAT = "pick_heat_then_place_in_recep"
    COOL = "pick_cool_then_place_in_recep"
    PICK_TWO = "pick_two_obj_and_place"


#: The task types' names (the ``task_type`` of ``traj_data.json``), in ALFWorld's numbering order.
TASK_TYPES: tuple[str, ...] = tuple(task_type.value for task_type in TaskType)
