"""ALFWorld on the real engine: ``progpo/ALFWorld-v0``, its task sets, a game generator and an expert.

Modules: :mod:`~progpo_envs.alfworld.env` (the Gymnasium env), :mod:`~progpo_envs.alfworld.engine`
(TextWorld's PDDL engine with ALFWorld naming and the speed fixes), :mod:`~progpo_envs.alfworld.data` (real
and generated task sets), :mod:`~progpo_envs.alfworld.generator`, :mod:`~progpo_envs.alfworld.expert`,
:mod:`~progpo_envs.alfworld.task_types` (the six task types), :mod:`~progpo_envs.alfworld.wheel` (the files
of the ``alfworld`` wheel) and :mod:`~progpo_envs.alfworld.cli` (``progpo alfworld ...``).

``import alfworld`` sets ``$ALFWORLD_DATA`` to ``~/.cache/alfworld`` when it is unset, which would make every
later env in the process look for real data there. The package is imported here first, with the variable left
as the user set it, so no later import can change it. Without the ``alfworld`` extra installed only the
engine-free modules (:mod:`~progpo_envs.alfworld.task_types`) can be used.
"""

import importlib.util

from progpo_envs.alfworld.wheel import import_alfworld

if importlib.util.find_spec("alfworld") is not None:
    import_alfworld("alfworld")
