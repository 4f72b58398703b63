"""``install()``: our estimators and envs into a running verl-agent, without a patch to its files.

The launcher (``python -m progpo_verl.verl_agent``) starts Ray with
``runtime_env={"worker_process_setup_hook": "progpo_verl.verl_agent.install.install"}``, so every Ray worker —
the ``TaskRunner`` that builds and runs the trainer among them — calls :func:`install` before it runs
anything. It checks the functions it wraps against :mod:`progpo_verl.verl_agent.contract` first, then wraps
(each once; a second call does nothing):

* ``RayPPOTrainer.__init__``: when ``algorithm.adv_estimator`` is ours, the estimator and its parameters are
  checked there, before any GPU worker starts
  (:func:`~progpo_verl.verl_agent.settings.estimator_spec_from_config`), and verl-agent's closed list of
  critic-free estimators is passed by naming ``grpo`` to it while its own ``__init__`` runs;
* ``RayPPOTrainer.fit``: that estimator is the active one while ``fit`` runs (a context variable, so nothing
  outlives the run);
* ``TrajectoryCollector.multi_turn_loop``: with an estimator of ours active, the rows the loop returns are
  tagged, before ``adjust_batch`` copies rows and ``_balance_batch`` permutes them, with each row's step
  (:func:`progpo_verl.rows.step_tags`) and its projected action (the response decoded as the loop decodes it,
  then :func:`agents.projection.project_action_with_reason`'s action, lower-cased as verl-agent's projection
  does);
* ``compute_advantage``: our names go to :meth:`progpo_verl.estimator.EstimatorSpec.row_advantages` and
  :func:`progpo_verl.rows.token_advantages` (``advantages`` and ``returns``, as verl-agent's GiGPO sets
  both); every other name to verl-agent's own;
* ``make_envs``: a ``progpo/*`` ``env.env_name`` gets our env managers
  (:func:`progpo_verl.verl_agent.envs.env_managers`); every other one verl-agent's.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.util
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from agents.projection import project_action_with_reason
from progpo_verl.estimator import EstimatorSpec
from progpo_verl.rows import ACTION_COLUMN, STEP_COLUMN, step_tags, token_advantages
from progpo_verl.verl_agent.contract import HOOKS, ContractError, check_hooks, resolve
from progpo_verl.verl_agent.envs import env_managers
from progpo_verl.verl_agent.settings import (
    adv_estimator_names,
    env_spec_from_config,
    estimator_spec_from_config,
)

#: The import path Ray's ``worker_process_setup_hook`` takes.
SETUP_HOOK = "progpo_verl.verl_agent.install.install"
#: Set on every wrapper: the wrapped function, and a sign that it is ours.
WRAPPED = "__progpo_verl_wraps__"
#: Named to verl-agent's ``__init__`` in place of ours: an estimator in its critic-free list.
CRITIC_FREE_NAME = "grpo"

#: The estimator of the trainer whose ``fit`` is running (``None`` outside ``fit`` or for verl-agent's own).
ACTIVE: contextvars.ContextVar[tuple[str, EstimatorSpec] | None] = contextvars.ContextVar(
    "progpo_verl_estimator", default=None
)
_TRAINER_ESTIMATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _estimator_name(adv_estimator: Any) -> str:
    return str(getattr(adv_estimator, "value", adv_estimator))


def response_mask(data: Any) -> Any:
    """The batch's ``response_mask``, or verl-agent's ``compute_response_mask`` of it when it has none."""
    if "response_mask" in data.batch.keys():
        return data.batch["response_mask"]
    length = data.batch["responses"].shape[1]
    return data.batch["attention_mask"][:, -length:]


def apply_estimator(data: Any, spec: EstimatorSpec) -> Any:
    """Set ``data.batch["advantages"]`` and ``["returns"]`` (token level) from our estimator; return
    ``data``."""
    advantages = token_advantages(spec.row_advantages(data.non_tensor_batch), response_mask(data))
    data.batch["advantages"] = advantages
    data.batch["returns"] = advantages
    return data


def action_text(response: str) -> str:
    """The action a response plays, as an action key: the projected action, lower-cased."""
    return project_action_with_reason(response, None, require_think=False).action.lower()


def tag_rows(data: Any, tokenizer: Any) -> Any:
    """Tag the rollout loop's rows with their step and projected action (:data:`STEP_COLUMN`,
    :data:`ACTION_COLUMN`, object arrays as every non-tensor column of a DataProto); return ``data``."""
    columns = data.non_tensor_batch
    columns[STEP_COLUMN] = step_tags(columns["traj_uid"]).astype(object)
    texts = tokenizer.batch_decode(data.batch["responses"], skip_special_tokens=True)
    columns[ACTION_COLUMN] = np.array([action_text(t) for t in texts], dtype=object)
    return data


def _wrap(original: Callable, wrapper: Callable) -> Callable:
    functools.update_wrapper(wrapper, original)
    setattr(wrapper, WRAPPED, original)
    return wrapper


def wrap_compute_advantage(original: Callable) -> Callable:
    """verl-agent's ``compute_advantage``, with our estimator names computed by ours."""
    ours = adv_estimator_names()

    def compute_advantage(data, adv_estimator, *args, **kwargs):
        name = _estimator_name(adv_estimator)
        if name not in ours:
            return original(data, adv_estimator, *args, **kwargs)
        active = ACTIVE.get()
        if active is None or active[0] != name:
            raise RuntimeError(
                f"compute_advantage({name!r}) outside a RayPPOTrainer.fit configured with "
                f"algorithm.adv_estimator={name} (active: {active[0] if active else None})"
            )
        return apply_estimator(data, active[1])

    return _wrap(original, compute_advantage)


def wrap_trainer_init(original: Callable) -> Callable:
    """``RayPPOTrainer.__init__``: our estimator checked from the config, verl-agent's list passed."""

    def __init__(self, config, *args, **kwargs):
        spec = estimator_spec_from_config(config)
        if spec is None:
            return original(self, config, *args, **kwargs)
        algorithm = config["algorithm"]
        name = str(algorithm["adv_estimator"])
        if config["actor_rollout_ref"]["rollout"]["multi_turn"]["enable"]:
            raise ValueError(
                f"{name} estimates env-loop rows; actor_rollout_ref.rollout.multi_turn.enable (tool "
                "rollouts) gives none"
            )
        algorithm["adv_estimator"] = CRITIC_FREE_NAME
        try:
            original(self, config, *args, **kwargs)
        finally:
            algorithm["adv_estimator"] = name
        _TRAINER_ESTIMATORS[self] = (name, spec)

    return _wrap(original, __init__)


def wrap_fit(original: Callable) -> Callable:
    """``RayPPOTrainer.fit`` with the trainer's estimator of ours active."""

    def fit(self):
        active = _TRAINER_ESTIMATORS.get(self)
        if active is None:
            return original(self)
        token = ACTIVE.set(active)
        try:
            return original(self)
        finally:
            ACTIVE.reset(token)

    return _wrap(original, fit)


def wrap_multi_turn_loop(original: Callable) -> Callable:
    """``TrajectoryCollector.multi_turn_loop`` whose rows are tagged while our estimator is active."""

    def multi_turn_loop(self, gen_batch, actor_rollout_wg, envs, is_train=True):
        data = original(self, gen_batch, actor_rollout_wg, envs, is_train)
        return tag_rows(data, self.tokenizer) if is_train and ACTIVE.get() is not None else data

    return _wrap(original, multi_turn_loop)


def wrap_make_envs(original: Callable) -> Callable:
    """``make_envs`` building our env managers for our env ids."""

    def make_envs(config):
        spec = env_spec_from_config(config)
        return original(config) if spec is None else env_managers(spec)

    return _wrap(original, make_envs)


WRAPPERS: dict[str, Callable[[Callable], Callable]] = {
    "compute_advantage": wrap_compute_advantage,
    "RayPPOTrainer.__init__": wrap_trainer_init,
    "RayPPOTrainer.fit": wrap_fit,
    "TrajectoryCollector.multi_turn_loop": wrap_multi_turn_loop,
    "make_envs": wrap_make_envs,
}
#: Modules that hold ``make_envs`` besides the package that exports it.
MAKE_ENVS_HOMES = ("agent_system.environments.env_manager",)


def _set(modules: dict[str, Any], module: str, name: str, value: Callable) -> None:
    owner: Any = modules[module]
    *path, attribute = name.split(".")
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, attribute, value)


def install() -> None:
    """Wrap verl-agent's functions (see the module docstring); a second call does nothing.

    Raises:
        ContractError: no verl-agent is importable (e.g. upstream verl), a wrapped function is missing or has
            other parameters than
            :data:`~progpo_verl.verl_agent.contract.HOOKS` say, or verl-agent ships an estimator under one of
            our names.
    """
    if importlib.util.find_spec("agent_system") is None:
        raise ContractError(
            "no verl-agent here (no agent_system package): install() wraps verl-agent's trainer; upstream "
            "verl gets our names from progpo_verl.upstream instead (see its docstring)"
        )
    modules = {hook.module: importlib.import_module(hook.module) for hook in HOOKS}
    wrapped = {hook.name: hasattr(resolve(modules, hook), WRAPPED) for hook in HOOKS if hook.name in WRAPPERS}
    if all(wrapped.values()):
        return
    check_hooks(modules)
    trainer_module = modules["verl.trainer.ppo.ray_trainer"]
    shipped = {_estimator_name(e) for e in trainer_module.AdvantageEstimator}
    taken = sorted(shipped & set(adv_estimator_names()))
    if taken:
        raise ContractError(f"verl-agent ships estimators named {taken}, which are ours: rename ours")
    for hook in HOOKS:
        if hook.name in WRAPPERS and not wrapped[hook.name]:
            replacement = WRAPPERS[hook.name](resolve(modules, hook))
            _set(modules, hook.module, hook.name, replacement)
            if hook.name == "make_envs":
                for home in MAKE_ENVS_HOMES:
                    importlib.import_module(home).make_envs = replacement
