"""ALFWorld and WebShop as SkyRL-Gym text environments, played on our env servers by URL.

SkyRL (``skyrl-train``'s ``SkyRLGymGenerator``, read, not copied) makes one env per rollout with
``skyrl_gym.make(env_class, env_config=<the generator config's skyrl_gym section for that class>,
extras=<the dataset row's columns besides prompt and env_class, with max_turns>)``, calls ``init(prompt)``
and sends the chat it returns to the model, then ``step(reply)`` each turn, appending the observations
``step`` returns, until ``done``; ``get_metrics()`` at the end. Importing this module registers two such
env classes with ``skyrl_gym``:

* ``progpo_alfworld`` — :class:`ALFWorldSkyRLEnv` (``progpo/ALFWorld-v0``);
* ``progpo_webshop`` — :class:`WebShopSkyRLEnv` (``progpo/WebShop-v0``).

What each does:

* **where**: ``env_config.server``, one URL or several (a list, or URLs separated by commas), of either
  protocol (``env_config.protocol``: ``"openenv"``, the default, or ``"native"``); without it the env runs in
  the generator's process (:mod:`agents.hosted`);
* **which task**: the row's ``task_index`` (or ``extra_info.task_index``, SkyRL's usual column), ``seed``
  (default 0) and ``split`` (default ``env_config.split``): every rollout of a prompt resets to the same task
  from the same first observation, so a GRPO group shares its start (a row without ``task_index`` is refused:
  an unseeded reset would give each rollout its own task);
* **what the model sees**: ``init`` appends the first observation to the row's prompt as a user turn, in our
  prompt style (:func:`agents.prompts.build_prompt`'s ``default`` template: the role and task, the
  observation, every admissible command, and the ``<think>``/``<action>`` answer format), and each ``step``
  answers with the next turn in the same style; the full admissible list, never cut; never the expert's next
  command (:mod:`agents.hosted` keeps it out of every view);
* **the answer**: the text inside ``<action>...</action>``, projected onto the admissible spelling
  (:func:`agents.projection.project_action_with_reason`, the rule the trainer and ``progpo eval`` use); an
  answer without it is an invalid action (its tail is played, as verl-agent does, and the env answers with
  its "nothing happens") and counted, never an exception;
* **reward and end**: each step's reward is the env's (ALFWorld 10 for a win by default; WebShop its
  ``reward_mode``'s); ``done`` when the env ends the episode or after ``max_turns`` turns; ``get_metrics()``
  has ``success``, ``task_score`` (WebShop's 0-1 purchase score), ``steps`` and ``invalid_actions``.

:func:`task_rows` writes the dataset rows of some tasks (``prompt``, ``env_class``, ``task_index``, ``seed``,
``split``).

With ``skyrl-gym`` installed (``.venv-skyrl``: ``scripts/setup_integrations.sh``) the classes are
``skyrl_gym``'s ``BaseTextEnv`` and registered; without it they keep the same contract on their own (what the
project's tests and this example use), and :func:`register` says what to install.

Example (SkyRL makes it with ``skyrl_gym.make("progpo_alfworld", env_config=..., extras=...)`` and calls
``init`` and ``step`` itself):
    >>> env = ALFWorldSkyRLEnv(env_config={"split": "train"}, extras={"task_index": 0, "seed": 0})
    >>> chat, _ = env.init([])
    >>> "Your admissible actions of the current situation are" in chat[-1]["content"]
    True
    >>> out = env.step("<think>look first</think><action>look</action>")
    >>> out["done"], out["observations"][0]["role"]
    (False, 'user')
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from agents.hosted import DEFAULT_TIMEOUT_S, Episode, close_quietly, open_backend
from agents.projection import project_action_with_reason
from agents.prompts import admissible_actions_from_info, build_prompt, task_text_from_observation

try:
    import skyrl_gym
    from skyrl_gym.envs.base_text_env import BaseTextEnv as _SkyRLTextEnv
except ImportError:  # skyrl-gym is not installed: the classes keep its contract on their own
    skyrl_gym = None
    _SkyRLTextEnv = object

#: The ids this module registers with ``skyrl_gym``, and the class of each.
ENV_CLASSES = {"progpo_alfworld": "ALFWorldSkyRLEnv", "progpo_webshop": "WebShopSkyRLEnv"}


def _config(env_config: Any) -> dict[str, Any]:
    """``env_config`` as a plain dict (SkyRL passes an OmegaConf ``DictConfig``, or ``{}``)."""
    if env_config is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(env_config, DictConfig):
            return dict(OmegaConf.to_container(env_config, resolve=True))
    except ImportError:  # pragma: no cover - skyrl_gym depends on omegaconf
        pass
    return dict(env_config)


def _row_value(extras: Mapping[str, Any], name: str) -> Any:
    """A row's column, or the same key of its ``extra_info`` (where SkyRL's datasets keep such values)."""
    if name in extras:
        return extras[name]
    extra_info = extras.get("extra_info")
    return extra_info.get(name) if isinstance(extra_info, Mapping) else None


class _ProgpoSkyRLEnv(_SkyRLTextEnv):
    """One rollout of a hosted text env for SkyRL (see the module docstring).

    Args:
        env_config: ``server`` (URL(s); none: in this process), ``protocol`` (``"openenv"`` or ``"native"``),
            ``split`` (default ``"train"``), ``timeout_s``, ``require_think`` (an answer without
            ``<think>...</think>`` counts as invalid, as in our trainer; default true), ``env_kwargs`` (the
            env's constructor kwargs: in process; on a server, those it allows).
        extras: The dataset row's other columns: ``task_index`` (required), ``seed``, ``split``,
            ``max_turns`` (SkyRL's generator sets it).
    """

    env_id: str
    style: str

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None):
        super().__init__()
        self.turns = 0  # BaseTextEnv's counter, set here too for use without skyrl-gym
        config, extras = _config(env_config), dict(extras or {})
        task_index = _row_value(extras, "task_index")
        if task_index is None or isinstance(task_index, bool) or not isinstance(task_index, numbers.Integral):
            raise ValueError(
                f"the dataset row needs an integer task_index column (got {task_index!r}): every rollout of "
                "a prompt then plays the same task (agents.skyrl.task_rows writes such rows)"
            )
        seed = _row_value(extras, "seed")
        self.task_index, self.seed = int(task_index), 0 if seed is None else int(seed)
        self.split = str(_row_value(extras, "split") or config.get("split", "train"))
        max_turns = extras.get("max_turns")
        self.max_turns = int(max_turns) if max_turns else 0  # 0: the env's own step limit ends it
        self.require_think = bool(config.get("require_think", True))
        self._backend = open_backend(
            self.env_id,
            config.get("server"),
            str(config.get("protocol", "openenv")),
            dict(config.get("env_kwargs") or {}),
            float(config.get("timeout_s", DEFAULT_TIMEOUT_S)),
        )
        self._task = ""
        self._view: Mapping[str, Any] = {}
        self._return = 0.0
        self._won = False
        self._score = 0.0
        self._invalid = 0
        self._closed = False

    # --- SkyRL's interface ---------------------------------------------------------------------------------
    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Reset to the row's task and return the chat: the row's prompt, then the first observation as a user
        turn in our prompt style."""
        episode = self._backend.reset(self.task_index, self.split, self.seed)
        self._task = task_text_from_observation(self.style, episode.text, dict(episode.view))
        self._view = episode.view
        metadata = {"task_index": self.task_index, "seed": self.seed, "split": self.split}
        return [*prompt, self._turn(episode)], metadata

    def step(self, action: str) -> dict[str, Any]:
        """Play the reply's ``<action>`` (an answer without one is an invalid action); the next turn."""
        self.turns += 1
        admissible = admissible_actions_from_info(self.style, dict(self._view))
        projection = project_action_with_reason(action, admissible, require_think=self.require_think)
        self._invalid += not projection.valid
        episode = self._backend.step(projection.action)
        self._view = episode.view
        self._return += episode.reward
        self._won = bool(episode.view.get("won", False))
        self._score = float(episode.view.get("task_score", 1.0 if self._won else 0.0))
        done = episode.done or bool(self.max_turns and self.turns >= self.max_turns)
        return {  # skyrl_gym's BaseTextEnvStepOutput
            "observations": [] if done else [self._turn(episode)],
            "reward": episode.reward,
            "done": done,
            "metadata": {
                "action": projection.action,
                "valid": projection.valid,
                "invalid_reason": projection.reason.value,
                "won": self._won,
                "env_error": episode.view.get("env_error"),
            },
        }

    def get_metrics(self) -> dict[str, Any]:
        """The episode's ``success``, ``task_score``, ``return``, ``steps`` and ``invalid_actions``."""
        return {
            "success": float(self._won),
            "task_score": self._score,
            "return": self._return,
            "steps": self.turns,
            "invalid_actions": self._invalid,
        }

    def close(self) -> None:
        """End the session (SkyRL calls this once the rollout is done)."""
        if not self._closed:
            self._closed = True
            close_quietly(self._backend)

    # --- our prompt style ----------------------------------------------------------------------------------
    def _turn(self, episode: Episode) -> dict[str, str]:
        """One user turn: the task, the observation and every admissible command, and the answer format (the
        chat itself holds the history)."""
        admissible = admissible_actions_from_info(self.style, dict(episode.view))
        messages = build_prompt(
            self.style, self._task, [], episode.text, admissible, history_length=0, max_prompt_chars=None
        )
        return messages[-1]


class ALFWorldSkyRLEnv(_ProgpoSkyRLEnv):
    """``progpo/ALFWorld-v0`` for SkyRL (``env_class: progpo_alfworld``; see the module docstring)."""

    env_id = "progpo/ALFWorld-v0"
    style = "alfworld"


class WebShopSkyRLEnv(_ProgpoSkyRLEnv):
    """``progpo/WebShop-v0`` for SkyRL (``env_class: progpo_webshop``; see the module docstring)."""

    env_id = "progpo/WebShop-v0"
    style = "webshop"


def register() -> None:
    """Register :data:`ENV_CLASSES` with ``skyrl_gym`` (done at import where it is installed; again is a
    no-op)."""
    if skyrl_gym is None:
        raise ImportError("skyrl-gym is not installed: scripts/setup_integrations.sh skyrl makes .venv-skyrl")
    for env_class, cls in ENV_CLASSES.items():
        if env_class not in skyrl_gym.registry:
            skyrl_gym.register(id=env_class, entry_point=f"{__name__}:{cls}")


def make(env_class: str, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> _ProgpoSkyRLEnv:
    """The env of ``env_class`` for one rollout as SkyRL's generator makes it: ``skyrl_gym.make`` where
    skyrl-gym is installed, else our class itself (the same contract)."""
    if env_class not in ENV_CLASSES:
        raise ValueError(f"env_class must be one of {', '.join(ENV_CLASSES)}, got {env_class!r}")
    if skyrl_gym is None:
        return globals()[ENV_CLASSES[env_class]](env_config, extras)
    return skyrl_gym.make(env_class, env_config=_config(env_config), extras=dict(extras or {}))


def task_rows(
    env_class: str,
    task_indices: Iterable[int],
    split: str = "train",
    seed: int = 0,
    prompt: list[dict[str, str]] | None = None,
) -> Iterator[dict[str, Any]]:
    """SkyRL dataset rows, one per task of ``task_indices``: ``{"prompt", "env_class", "task_index", "seed",
    "split"}``, task ``t`` reset with ``seed + t`` (as ``progpo eval --seed`` resets it).

    Args:
        env_class: ``progpo_alfworld`` or ``progpo_webshop``.
        task_indices: The tasks (``range(n)`` for the first ``n``).
        split: The split.
        seed: The base seed.
        prompt: Messages before the first observation (default none: ``init`` adds the whole first turn).
    """
    if env_class not in ENV_CLASSES:
        raise ValueError(f"env_class must be one of {', '.join(ENV_CLASSES)}, got {env_class!r}")
    for task_index in task_indices:
        yield {
            "prompt": list(prompt or []),
            "env_class": env_class,
            "task_index": int(task_index),
            "seed": seed + int(task_index),
            "split": split,
        }


if skyrl_gym is not None:
    register()
