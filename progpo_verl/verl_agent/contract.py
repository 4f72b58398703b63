"""What the plugin relies on in verl-agent: the functions it wraps, with their parameters, and the estimator
names verl-agent ships (no verl import).

Read at verl-agent ``20bd331`` (the newest upstream commit we could read, with HGPO and GraphGPO recipes) and
``d0b9724``; both have exactly these. :func:`check_hooks` compares the live functions with :data:`HOOKS`
before anything is wrapped, so a verl-agent whose signatures moved fails at ``install()`` with the
difference, not later inside a training step.

Example:
    >>> def compute_advantage(data, adv_estimator, gamma=1.0): ...
    >>> parameters(compute_advantage)
    ('data', 'adv_estimator', 'gamma')
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping

#: The verl-agent commits this contract was read from.
CHECKED_COMMITS = ("20bd331", "d0b9724")

#: ``verl.trainer.ppo.ray_trainer.AdvantageEstimator`` at those commits: names that stay verl-agent's.
BUILTIN_ESTIMATORS = (
    "gae",
    "grpo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rloo",
    "grpo_passk",
    "gigpo",
)


@dataclasses.dataclass(frozen=True)
class Hook:
    """A verl-agent function the plugin wraps or calls.

    Attributes:
        module: Its module (``verl.trainer.ppo.ray_trainer``).
        name: Its name in the module, ``Class.method`` for a method.
        parameters: Its parameter names in order (``*args``/``**kwargs`` with their stars).
        why: What the plugin does with it.
    """

    module: str
    name: str
    parameters: tuple[str, ...]
    why: str


HOOKS = (
    Hook(
        "verl.trainer.ppo.ray_trainer",
        "compute_advantage",
        (
            "data",
            "adv_estimator",
            "gamma",
            "lam",
            "num_repeat",
            "multi_turn",
            "norm_adv_by_std_in_grpo",
            "step_advantage_w",
            "gigpo_mode",
            "gigpo_enable_similarity",
            "gigpo_similarity_thresh",
            "**kwargs",
        ),
        "our estimator names computed by ours; every other name by verl-agent's",
    ),
    Hook(
        "verl.trainer.ppo.ray_trainer",
        "RayPPOTrainer.__init__",
        (
            "self",
            "config",
            "tokenizer",
            "role_worker_mapping",
            "resource_pool_manager",
            "ray_worker_group_cls",
            "processor",
            "reward_fn",
            "val_reward_fn",
            "train_dataset",
            "val_dataset",
            "collate_fn",
            "train_sampler",
            "device_name",
            "traj_collector",
            "envs",
            "val_envs",
        ),
        "our estimator checked from the config; its closed list of critic-free estimators passed",
    ),
    Hook(
        "verl.trainer.ppo.ray_trainer", "RayPPOTrainer.fit", ("self",), "our estimator active while it runs"
    ),
    Hook(
        "agent_system.multi_turn_rollout",
        "TrajectoryCollector.multi_turn_loop",
        ("self", "gen_batch", "actor_rollout_wg", "envs", "is_train"),
        "each row tagged with its step and projected action before any reordering",
    ),
    Hook("agent_system.environments", "make_envs", ("config",), "progpo/* env ids built by us"),
    Hook("verl.trainer.main_ppo", "run_ppo", ("config",), "the launcher's entry into verl-agent"),
)


class ContractError(RuntimeError):
    """The installed verl-agent does not have the functions the plugin was written against."""


def parameters(fn: Callable) -> tuple[str, ...]:
    """``fn``'s parameter names in order, ``*args`` and ``**kwargs`` with their stars."""
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return tuple(stars.get(p.kind, "") + name for name, p in inspect.signature(fn).parameters.items())


def resolve(modules: Mapping[str, object], hook: Hook) -> Callable:
    """The function ``hook`` names, looked up in the imported ``modules`` (module name -> module)."""
    owner: object = modules[hook.module]
    for part in hook.name.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            raise ContractError(f"{hook.module}.{hook.name} is missing ({hook.why})")
    return owner  # type: ignore[return-value]


def check_hooks(modules: Mapping[str, object], hooks: tuple[Hook, ...] = HOOKS) -> None:
    """Raise :class:`ContractError` naming every hook that is missing or whose parameters changed."""
    problems = []
    for hook in hooks:
        try:
            found = parameters(resolve(modules, hook))
        except ContractError as error:
            problems.append(str(error))
            continue
        if found != hook.parameters:
            problems.append(
                f"{hook.module}.{hook.name}{found} != the expected {hook.parameters} ({hook.why})"
            )
    if problems:
        raise ContractError(
            "this verl-agent differs from the one the plugin was checked against "
            f"({', '.join(CHECKED_COMMITS)}):\n  " + "\n  ".join(problems)
        )
