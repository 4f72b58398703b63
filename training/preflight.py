"""Checks of a run that need the file system, done in a second before any model or env is built.

:func:`preflight` turns the mistakes a researcher makes most on a new machine into one line each, with the
fix: a model folder that is not there (nothing is ever downloaded at run time), ALFWorld's data named by an
unset ``$ALFWORLD_DATA`` (the presets refuse to fall back to generated games silently: their numbers would
not be comparable with the papers'), a training or held-out split the env does not have, a prompt and
response longer than the model's context, and the vLLM engine asked for where vLLM is not installed.

Example:
    >>> from training.config import load_config
    >>> preflight(load_config(None, []))  # the quickstart: a tiny model built locally, generated games
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
from pathlib import Path

from agents.envs import listed_splits
from training.config import ConfigError, EnvConfig, TrainConfig
from training.envs import data_dir_value, split_env_kwargs


def preflight(config: TrainConfig) -> None:
    """Raise :class:`~training.config.ConfigError` (one line, with the fix) on what would fail later."""
    _check_data_dir(config.env.data_dir)
    _check_splits(config.env)
    context = _check_model(config)
    needed = config.rollout.max_prompt_tokens + config.rollout.max_new_tokens
    if needed > context:
        raise ConfigError(
            f"rollout.max_prompt_tokens + rollout.max_new_tokens = {needed} is longer than the model's "
            f"context ({context} positions): lower one of them"
        )
    if config.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "rollout.engine=vllm, but vLLM is not installed: pip install 'progpo-suite[vllm]' (GPU) or "
            "scripts/setup_vllm_cpu.sh (CPU), or use rollout.engine=transformers"
        )


def _check_splits(env: EnvConfig) -> None:
    """The training and held-out splits are splits the env lists here (an env server checks its own)."""
    if env.url:
        return
    for key, split in (("env.train_split", env.train_split), ("env.eval_split", env.eval_split)):
        kwargs = {k: v for k, v in split_env_kwargs(env, split).items() if k != "split"}
        splits = listed_splits(env.id, kwargs)
        missing = _missing_data(env.id, kwargs) if splits == [] else None
        if missing is not None:
            raise ConfigError(missing)
        if splits is not None and split not in splits:
            raise ConfigError(f"{key} is {split!r}, which {env.id} does not have here: one of {splits}")


def _missing_data(env_id: str, kwargs: dict) -> str | None:
    """For an env that reads ALFWorld's data and lists no split: the data folder it was given that does not
    exist (``env.data_dir``, else ``$ALFWORLD_DATA``), with the fix."""
    from agents.envs import env_class
    from progpo_envs.alfworld.data import missing_data_dir

    if "data_dir" not in inspect.signature(env_class(env_id)).parameters:
        return None
    return missing_data_dir(kwargs.get("data_dir"))


def _check_data_dir(data_dir: str) -> None:
    if data_dir.startswith("$"):
        name = data_dir[1:]
        if not os.environ.get(name):
            raise ConfigError(
                f"env.data_dir is ${name}, which is not set: point {name} at the folder that contains "
                "json_2.1.1/ (ALFWorld's data), or set env.data_dir=generated to train on generated games "
                "(their numbers are not comparable with the papers')"
            )
        where = f"${name} ({os.environ[name]})"
    else:
        where = data_dir
    folder = data_dir_value(data_dir)
    if folder and folder != "generated" and not Path(folder).expanduser().is_dir():
        raise ConfigError(f"env.data_dir {where} is not a folder: give the folder that contains json_2.1.1/")


def _check_model(config: TrainConfig) -> int:
    """The model's context length (``max_position_embeddings``), after checking that its folder exists."""
    if not config.model.path:
        return config.model.tiny.max_position_embeddings
    folder = Path(config.model.path).expanduser()
    if not (folder / "config.json").is_file():
        what = "has no config.json" if folder.is_dir() else "is not a folder"
        raise ConfigError(
            f"model.path {config.model.path} {what}: give a transformers model folder (nothing is "
            "downloaded at run time: fetch the model first, e.g. with huggingface-cli download --local-dir)"
        )
    try:
        model_config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"model.path {config.model.path}: config.json is not JSON ({exc})") from None
    text_config = model_config.get("text_config", model_config)
    return int(text_config.get("max_position_embeddings", 1 << 30))


def resume_mode(run_dir: str | Path, resume: bool, resume_or_start: bool, overwrite: bool) -> bool:
    """Whether the run resumes, from the flags and what ``run_dir`` holds; a run dir that holds a run is never
    reused silently.

    Raises:
        ConfigError: ``--resume`` with no checkpoint to resume from, or a fresh start (no flag) in a run dir
            that holds a run (its checkpoints or metrics would be deleted).
    """
    run_dir = Path(run_dir)
    checkpoints = run_dir / "checkpoints"
    if checkpoints.exists() and not checkpoints.is_dir():
        raise ConfigError(f"{checkpoints} is not a folder: move it away")
    has_checkpoints = checkpoints.is_dir() and any(checkpoints.iterdir())
    metrics = run_dir / "metrics.jsonl"
    if resume and not has_checkpoints:
        raise ConfigError(
            f"--resume: {checkpoints} holds no checkpoint to resume from; run without --resume to start a "
            "run there, or with --resume-or-start"
        )
    if resume or resume_or_start:
        return has_checkpoints
    if not overwrite and (has_checkpoints or (metrics.is_file() and metrics.stat().st_size)):
        raise ConfigError(
            f"{run_dir} holds a run (its checkpoints and metrics.jsonl): --resume continues it, --overwrite "
            "starts it again (deleting them), or give another run_dir"
        )
    return False
