"""``python -m progpo_verl.verl_agent``: verl-agent's trainer with our estimators and envs.

Usage::

    python -m progpo_verl.verl_agent [--dry-run] [--config-dir DIR] OVERRIDE...

Overrides are verl-agent's Hydra overrides (``algorithm.adv_estimator=progpo env.env_name=progpo/ALFWorld-v0
data.train_batch_size=16 ...``, as ``python -m verl.trainer.main_ppo`` takes them); keys in our blocks
(``algorithm.<estimator>.*``, ``algorithm.progpo_rows.*``, ``env.progpo.*``) need no ``+``. The config is
verl-agent's ``ppo_trainer`` (the installed verl-agent's ``verl/trainer/config``, or ``--config-dir``) with
the overrides and Ray's ``worker_process_setup_hook`` set to :func:`progpo_verl.verl_agent.install.install`.
Our estimator and env settings are checked here, then Ray starts with that hook and verl-agent's ``run_ppo``
runs.

``--dry-run`` stops before Ray: it builds the config, checks it, builds our env package (the training and
validation env managers, reset once) and writes ``config.yaml`` and ``env_sample.json`` (each manager's first
prompt and anchor) to ``--out``. Recipes: ``progpo_verl/verl_agent/recipes/``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

from progpo_verl.verl_agent.install import SETUP_HOOK
from progpo_verl.verl_agent.settings import (
    ENV_BLOCK,
    ROWS_BLOCK,
    adv_estimator_names,
    env_spec_from_config,
    estimator_spec_from_config,
    plain,
)
from training.config import algo_parameters

#: verl-agent's trainer config (``verl/trainer/config/<CONFIG_NAME>.yaml``).
CONFIG_NAME = "ppo_trainer"
#: Ray's runtime env of ``run_ppo`` at d0b9724 (20bd331 reads it from ``verl.trainer.constants_ppo``).
DEFAULT_RUNTIME_ENV = {
    "env_vars": {
        "TOKENIZERS_PARALLELISM": "true",
        "NCCL_DEBUG": "WARN",
        "VLLM_LOGGING_LEVEL": "WARN",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
    }
}
DEFAULT_OUT = "runs/verl_agent_dry_run"


def estimator_help() -> str:
    """One line per estimator name of ours and the parameters its block takes."""
    lines = []
    for name, estimator in sorted(adv_estimator_names().items()):
        params = [p for p in algo_parameters(estimator) if p != "gamma"]
        lines.append(f"  {name:<16} algorithm.{name}.{{{', '.join(params)}}}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The launcher's argument parser (its help lists our estimators and their parameter keys)."""
    parser = argparse.ArgumentParser(
        prog="python -m progpo_verl.verl_agent",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "estimators (algorithm.adv_estimator=NAME; gamma is algorithm.gamma, the invalid-action penalty "
            "actor_rollout_ref.actor.invalid_action_penalty_coef):\n"
            f"{estimator_help()}\n"
            f"rows: algorithm.{ROWS_BLOCK}.duplicates=dedupe|count, algorithm.{ROWS_BLOCK}.won_reward=10\n"
            "envs (env.env_name=ID): progpo/ALFWorld-v0, progpo/WebShop-v0, progpo/Remote-v0 "
            f"(env.{ENV_BLOCK}.url, env.{ENV_BLOCK}.env_id); env.{ENV_BLOCK}.* takes progpo train's env.* "
            "keys and template, max_prompt_chars, require_think\n"
            "the key table and the deviations from verl-agent: docs/verl_agent.md"
        ),
    )
    parser.add_argument("--dry-run", action="store_true", help="build and check the config and envs; no Ray")
    parser.add_argument(
        "--config-dir", help="verl-agent's trainer config folder (default: the installed one)"
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"where --dry-run writes (default {DEFAULT_OUT})")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. algorithm.adv_estimator=progpo")
    return parser


def our_namespaces() -> tuple[str, ...]:
    """Override key prefixes that verl-agent's config does not have: ours, added with Hydra's ``++``."""
    blocks = [f"algorithm.{name}." for name in adv_estimator_names()]
    return (*blocks, f"algorithm.{ROWS_BLOCK}.", f"env.{ENV_BLOCK}.", "ray_init.runtime_env.")


def normalise_overrides(overrides: list[str]) -> list[str]:
    """Our blocks' keys with ``++`` (add or override), then the setup hook.

    Example:
        >>> normalise_overrides(["algorithm.progpo.step_weight=0.5", "env.max_steps=50"])[:2]
        ['++algorithm.progpo.step_weight=0.5', 'env.max_steps=50']
    """
    out = []
    for override in overrides:
        key = override.split("=", 1)[0]
        if not key.startswith(("+", "~")) and key.startswith(our_namespaces()):
            override = "++" + override
        out.append(override)
    return [*out, f"++ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}"]


def verl_agent_config_dir() -> Path:
    """The installed verl-agent's trainer config folder.

    Raises:
        SystemExit: no ``verl`` is installed, or the installed one is not verl-agent (no ``env`` block).
    """
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        raise SystemExit(
            "no verl-agent here: install verl-agent (it installs itself as `verl`) or --config-dir"
        )
    folder = Path(spec.origin).parent / "trainer" / "config"
    trainer = folder / f"{CONFIG_NAME}.yaml"
    if not trainer.is_file() or "\nenv:" not in trainer.read_text(encoding="utf-8"):
        raise SystemExit(
            f"the verl at {Path(spec.origin).parent} is not verl-agent ({trainer} has no env block)"
        )
    return folder


def compose_config(config_dir: Path, overrides: list[str]) -> Any:
    """verl-agent's ``ppo_trainer`` config with the overrides, composed by Hydra as ``main_ppo`` does."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=normalise_overrides(overrides))


def check(config: Any) -> dict[str, Any]:
    """Our estimator and env settings, checked (``ValueError`` on a bad one); a summary for the user."""
    estimator = estimator_spec_from_config(config)
    env = env_spec_from_config(config)
    summary = {
        "adv_estimator": str(config["algorithm"]["adv_estimator"]),
        "env_name": str(config["env"]["env_name"]),
    }
    if estimator is not None:
        summary["estimator"] = {
            "name": estimator.estimator,
            "params": dict(estimator.params),
            "invalid_penalty": estimator.invalid_penalty,
            "duplicates": estimator.rows.duplicates.value,
            "won_reward": estimator.rows.won_reward,
        }
    if env is not None:
        summary["env"] = {
            "env": plain(vars(env.env)),
            "prompt": plain(vars(env.prompt)),
            "seed": env.seed,
            "train": f"{env.train_groups} groups x {env.group_size} copies",
            "val": f"{env.val_groups} tasks",
        }
    return summary


def env_sample(config: Any) -> dict[str, Any]:
    """Build our env package, reset each manager once, close it; its sizes and first prompt and anchor."""
    from progpo_verl.verl_agent.envs import env_managers

    spec = env_spec_from_config(config)
    if spec is None:
        return {"skipped": f"env.env_name={config['env']['env_name']} is verl-agent's own env"}
    sample = {}
    train, val = env_managers(spec)
    try:
        for name, manager in (("train", train), ("val", val)):
            started = time.perf_counter()
            observation, infos = manager.reset(None)
            sample[name] = {
                "copies": manager.num_envs,
                "reset_seconds": round(time.perf_counter() - started, 3),
                "task_ids": [str(info.get("task_id", "")) for info in infos[: spec.group_size + 1]],
                "prompt": observation["text"][0],
                "anchor": observation["anchor"][0],
            }
    finally:
        train.close()
        val.close()
    return sample


def dry_run(config: Any, out: Path) -> None:
    """Check the config, build the envs, write ``config.yaml`` and ``env_sample.json`` to ``out``."""
    from omegaconf import OmegaConf
    from rich.console import Console

    console = Console(stderr=True)
    with console.status("checking our estimator and env settings"):
        summary = check(config)
    with console.status("building and resetting our env package (ALFWorld may first generate games)"):
        sample = env_sample(config)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(config), encoding="utf-8")
    (out / "env_sample.json").write_text(json.dumps({**summary, "envs": sample}, indent=2) + "\n", "utf-8")
    console.print(f"[bold]dry run OK[/bold]: {summary['adv_estimator']} on {summary['env_name']}")
    for name in ("train", "val"):
        if name in sample:
            console.print(
                f"  {name}: {sample[name]['copies']} copies, reset in {sample[name]['reset_seconds']} s"
            )
    console.print(f"  config:  {out / 'config.yaml'}\n  envs:    {out / 'env_sample.json'}")


def ray_init_kwargs(config: Any) -> dict[str, Any]:
    """``ray.init`` keyword arguments as verl-agent's ``run_ppo`` builds them, our setup hook included."""
    try:
        runtime_env = importlib.import_module("verl.trainer.constants_ppo").get_ppo_ray_runtime_env()
    except ModuleNotFoundError:  # d0b9724 has the runtime env inline
        runtime_env = DEFAULT_RUNTIME_ENV
    kwargs = plain(config.get("ray_init", {}))
    runtime_env = plain(runtime_env)
    for key, value in kwargs.pop("runtime_env", {}).items():
        runtime_env[key] = {**runtime_env.get(key, {}), **value} if isinstance(value, dict) else value
    return {**{k: v for k, v in kwargs.items() if v is not None}, "runtime_env": runtime_env}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    config_dir = Path(args.config_dir) if args.config_dir else verl_agent_config_dir()
    config = compose_config(config_dir, args.overrides)
    try:
        if args.dry_run:
            dry_run(config, Path(args.out))
            return 0
        check(config)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import ray
    from verl.trainer.main_ppo import run_ppo

    ray.init(**ray_init_kwargs(config))
    run_ppo(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
