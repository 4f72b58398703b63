"""verl-agent's config (its Hydra ``ppo_trainer.yaml`` plus overrides) read into our specs (no verl import).

The config is whatever mapping verl-agent hands its trainer (an OmegaConf ``DictConfig``; plain dicts in
tests). Our keys live in blocks of their own beside verl-agent's, and verl-agent's own keys keep their
meaning:

=========================================  ===========================================================
verl-agent key                             ours
=========================================  ===========================================================
``algorithm.adv_estimator``                one of :func:`adv_estimator_names`: every estimator of
                                           :mod:`training.advantages` under its name (``progpo``,
                                           ``progpo_coverage``, ``g2po``, ``graphgpo``, ``dapo``), or
                                           ``progpo_<name>`` where verl-agent has one of that name
                                           (``progpo_gigpo``, ``progpo_grpo``, ``progpo_rloo``)
``algorithm.<adv_estimator>.*``            the estimator's parameters (``progpo train``'s ``algo.params``)
``algorithm.gamma``                        ``gamma`` of the estimators that have one (as verl-agent's GiGPO)
``actor_rollout_ref.actor.                 ``invalid_penalty`` (0 when ``use_invalid_action_penalty`` is
invalid_action_penalty_coef``              false)
``algorithm.progpo_rows.duplicates``       :class:`~progpo_verl.rows.Duplicates` (``dedupe``)
``algorithm.progpo_rows.won_reward``       :attr:`~progpo_verl.rows.RowOptions.won_reward` (10)
``env.env_name``                           a ``progpo/*`` env id: ``progpo/ALFWorld-v0``,
                                           ``progpo/WebShop-v0``, or ``progpo/Remote-v0`` with
                                           ``env.progpo.url`` and ``env.progpo.env_id`` (the id the
                                           env server hosts; ``url`` one server or several: a list,
                                           or URLs separated by commas)
``env.progpo.*``                           ``progpo train``'s ``env.*`` (:class:`training.config.EnvConfig`:
                                           ``kwargs``, ``train_kwargs``, ``url``, ``data_dir``,
                                           ``vector_mode``, ...) and the prompt
                                           (:class:`agents.base.PromptConfig`: ``template``,
                                           ``max_prompt_chars``, ``require_think``); defaults are the
                                           papers' (whole splits, the ``default`` template)
``env.max_steps``, ``env.history_length``  the same
``env.seed``, ``env.rollout.n``            group seeding as verl-agent's: training copy ``i`` of a reset is
``data.train_batch_size``,                 seeded ``seed + i // n`` (``n`` copies per task group,
``data.val_batch_size``                    ``train_batch_size`` groups); validation ``seed + 1000``,
                                           ``val_batch_size`` groups of one copy
``env.alfworld.eval_dataset``              ALFWorld's validation split (``eval_in_distribution`` =
                                           ``valid_seen``, ``eval_out_of_distribution`` = ``valid_unseen``)
=========================================  ===========================================================

Example:
    >>> names = adv_estimator_names()
    >>> names["progpo"], names["progpo_gigpo"], "gigpo" in names
    ('progpo', 'gigpo', False)
    >>> config = {"algorithm": {"adv_estimator": "progpo", "gamma": 0.95, "progpo": {"step_weight": 0.5}},
    ...           "actor_rollout_ref": {"actor": {"invalid_action_penalty_coef": 0.1}}}
    >>> spec = estimator_spec_from_config(config)
    >>> spec.estimator, dict(spec.params), spec.invalid_penalty
    ('progpo', {'step_weight': 0.5, 'gamma': 0.95}, 0.1)
    >>> estimator_spec_from_config({"algorithm": {"adv_estimator": "gigpo"}}) is None  # verl-agent's own
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym

import progpo_envs  # noqa: F401  (registers our env ids)
from agents.base import PromptConfig
from progpo_envs.core.registration import REMOTE_ENV_ID
from progpo_verl.estimator import EstimatorSpec, estimator_spec
from progpo_verl.rows import RowOptions
from progpo_verl.verl_agent.contract import BUILTIN_ESTIMATORS
from training.advantages import ESTIMATORS
from training.config import EnvConfig, algo_parameters

#: ``algorithm.<ROWS_BLOCK>``: how batch rows become estimator rows.
ROWS_BLOCK = "progpo_rows"
#: ``env.<ENV_BLOCK>``: our env's settings.
ENV_BLOCK = "progpo"
#: Estimator parameters set by verl-agent's own keys, not in the estimator's block.
SHARED_PARAMETERS = {
    "gamma": "algorithm.gamma",
    "invalid_penalty": "actor_rollout_ref.actor.invalid_action_penalty_coef",
}
#: verl-agent's ``env.alfworld.eval_dataset`` as our ALFWorld split names.
ALFWORLD_EVAL_SPLITS = {"eval_in_distribution": "valid_seen", "eval_out_of_distribution": "valid_unseen"}
#: verl-agent's validation envs: seeded ``env.seed + VAL_SEED_OFFSET``, one copy per task.
VAL_SEED_OFFSET = 1000

_MISSING = object()


def value_at(config: Mapping, path: str, default: Any = _MISSING) -> Any:
    """The value at dotted ``path`` (``algorithm.gamma``); ``default`` when absent (``KeyError`` without)."""
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node or node[part] is None:
            if default is _MISSING:
                raise KeyError(f"the config has no {path!r}")
            return default
        node = node[part]
    return node


def plain(value: Any) -> Any:
    """OmegaConf containers (or any mappings and sequences) as plain dicts and lists, recursively."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [plain(v) for v in value]
    return value


def adv_estimator_names() -> dict[str, str]:
    """``algorithm.adv_estimator`` values that are ours -> their :mod:`training.advantages` names."""
    return {(f"progpo_{name}" if name in BUILTIN_ESTIMATORS else name): name for name in sorted(ESTIMATORS)}


def estimator_spec_from_config(config: Mapping) -> EstimatorSpec | None:
    """Our estimator as ``config`` selects it, checked; ``None`` when ``algorithm.adv_estimator`` is not ours.

    Raises:
        ValueError: a parameter that verl-agent's own key sets (the message names the key), an unknown or bad
            parameter, KL in the reward (our estimators read the env rewards from the rows), bad row options.
    """
    name = str(value_at(config, "algorithm.adv_estimator", ""))
    estimator = adv_estimator_names().get(name)
    if estimator is None:
        return None
    params = plain(value_at(config, f"algorithm.{name}", {}))
    if not isinstance(params, dict):
        raise ValueError(f"algorithm.{name} must be a mapping of {estimator}'s parameters, got {params!r}")
    for param, key in SHARED_PARAMETERS.items():
        if param in params:
            raise ValueError(f"algorithm.{name}.{param}: verl-agent's {key} sets it; set that instead")
    if "gamma" in algo_parameters(estimator):
        params["gamma"] = float(value_at(config, "algorithm.gamma", 1.0))
    if value_at(config, "algorithm.use_kl_in_reward", False):
        raise ValueError(
            f"algorithm.use_kl_in_reward=True with {name}: our estimators read the env's rewards from the "
            "rows, so a KL penalty in the reward would be ignored; use "
            "actor_rollout_ref.actor.use_kl_loss=True"
        )
    actor = "actor_rollout_ref.actor"
    penalised = bool(value_at(config, f"{actor}.use_invalid_action_penalty", True))
    penalty = float(value_at(config, f"{actor}.invalid_action_penalty_coef", 0.0)) if penalised else 0.0
    options = plain(value_at(config, f"algorithm.{ROWS_BLOCK}", {}))
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(RowOptions)})
    if unknown:
        raise ValueError(f"algorithm.{ROWS_BLOCK}: unknown key(s) {unknown}; allowed: duplicates, won_reward")
    return estimator_spec(estimator, params, invalid_penalty=penalty, rows=RowOptions(**options))


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Our env as verl-agent's config selects it.

    Attributes:
        env: The env and its arguments, as ``progpo train`` takes them (``env.id`` is the env played; with
            ``env.url`` it is played on that env server through ``progpo/Remote-v0``).
        prompt: How each step's prompt is built and each response projected.
        seed: ``env.seed``: the first training reset's seed (validation: ``seed + 1000``).
        group_size: ``env.rollout.n``: copies per task group.
        train_groups: ``data.train_batch_size``: task groups per training reset.
        val_groups: ``data.val_batch_size``: validation tasks per reset (one copy each).
    """

    env: EnvConfig
    prompt: PromptConfig
    seed: int
    group_size: int
    train_groups: int
    val_groups: int


def _block_fields() -> dict[str, str]:
    """The keys of ``env.progpo`` -> which dataclass takes them (``env`` or ``prompt``)."""
    env = {f.name: "env" for f in dataclasses.fields(EnvConfig) if f.name not in ("id", "max_steps")}
    prompt = {f.name: "prompt" for f in dataclasses.fields(PromptConfig) if f.name != "history_length"}
    return {**env, **prompt, "env_id": "remote"}


def is_our_env(env_id: str) -> bool:
    """Whether ``env_id`` is registered by :mod:`progpo_envs` (``progpo/*``, and the test envs).

    Example:
        >>> is_our_env("progpo/ALFWorld-v0"), is_our_env("alfworld/AlfredTWEnv")
        (True, False)
    """
    spec = gym.registry.get(env_id)
    entry_point = getattr(spec, "entry_point", None)
    return isinstance(entry_point, str) and entry_point.startswith("progpo_envs.")


def env_spec_from_config(config: Mapping) -> EnvSpec | None:
    """Our env as ``config`` selects it; ``None`` when ``env.env_name`` is not ours (:func:`is_our_env`).

    Raises:
        ValueError: an unknown key in ``env.progpo`` (the message lists the known ones), or
            ``progpo/Remote-v0`` without ``env.progpo.url`` and ``env.progpo.env_id``.
    """
    name = str(value_at(config, "env.env_name", ""))
    if not is_our_env(name):
        return None
    block = plain(value_at(config, f"env.{ENV_BLOCK}", {}))
    fields = _block_fields()
    unknown = sorted(set(block) - set(fields))
    if unknown:
        raise ValueError(f"env.{ENV_BLOCK}: unknown key(s) {unknown}; allowed: {sorted(fields)}")
    env_id = name
    if name == REMOTE_ENV_ID:
        if not block.get("url") or not block.get("env_id"):
            raise ValueError(
                f"env.env_name={REMOTE_ENV_ID} needs env.{ENV_BLOCK}.url (the env server) and "
                f"env.{ENV_BLOCK}.env_id (the env it hosts, e.g. progpo/ALFWorld-v0)"
            )
        env_id = str(block["env_id"])
    elif "env_id" in block:
        raise ValueError(f"env.{ENV_BLOCK}.env_id is for env.env_name={REMOTE_ENV_ID} only")
    alfworld_split = value_at(config, "env.alfworld.eval_dataset", "eval_in_distribution")
    if alfworld_split not in ALFWORLD_EVAL_SPLITS:
        raise ValueError(
            f"env.alfworld.eval_dataset={alfworld_split!r}: one of {sorted(ALFWORLD_EVAL_SPLITS)}"
        )
    env_values = {
        "kwargs": {},
        "train_kwargs": {},
        "eval_split": "test" if "webshop" in env_id.lower() else ALFWORLD_EVAL_SPLITS[alfworld_split],
        **{k: v for k, v in block.items() if fields[k] == "env"},
    }
    prompt_values = {"template": "default", **{k: v for k, v in block.items() if fields[k] == "prompt"}}
    group_size = int(value_at(config, "env.rollout.n", 1))
    return EnvSpec(
        env=EnvConfig(id=env_id, max_steps=int(value_at(config, "env.max_steps", 50)), **env_values),
        prompt=PromptConfig(history_length=int(value_at(config, "env.history_length", 2)), **prompt_values),
        seed=int(value_at(config, "env.seed", 0)),
        group_size=group_size if group_size > 0 else 1,
        train_groups=int(value_at(config, "data.train_batch_size")),
        val_groups=int(value_at(config, "data.val_batch_size")),
    )
