"""The walk of one training iteration through the code: how often a reader following it leaves a file and
comes back (issue 28's measure of the trainer as a recipe).

One lock-step iteration of a small ALFWorld run (generated games, the quickstart's random-init policy,
2 groups × 2, 4 steps, no KL, no evaluation) is played once untraced (imports, envs), then once under
``sys.setprofile``.
Every call into, and return to, a function of the project's packages at most ``--depth`` project frames
below ``Trainer.train_iteration`` is a visit to that function's file; consecutive visits to one file are one
*stay*; a stay in a file visited before is a *return*. Depth 1 is what ``train_iteration`` calls itself.

Run: ``.venv/bin/python scripts/walk_iteration.py --depth 1`` (and ``--depth 2``); in a checkout of another
commit, with that checkout on ``PYTHONPATH``, to compare.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
PACKAGES = ("training", "agents", "progpo_envs", "webshop_server", "progpo_base")
OVERRIDES = [
    "env.id=progpo/ALFWorld-v0",
    "env.data_dir=",  # generated games (ALFWORLD_DATA unset), in every version of the config
    "env.max_steps=4",
    "rollout.num_groups=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "loss.kl_coef=0",
    "warm_start.enabled=false",
    "checkpoint_every=0",
    "tensorboard=false",
    "progress=false",
    "device=cpu",
]


@functools.cache
def project_file(filename: str, root: Path) -> str | None:
    """``filename`` relative to ``root`` when it is a module of the project's packages, else None."""
    try:
        relative = Path(filename).resolve().relative_to(root)
    except ValueError:
        return None
    return relative.as_posix() if relative.parts[0] in PACKAGES else None


def walk(trainer, iteration: int, depth: int, root: Path) -> list[str]:
    """The files visited during ``trainer.train_iteration(iteration)``, one entry per stay."""
    stays: list[str] = []
    depths: dict = {}  # frame -> project frames from train_iteration's down to it (0 for that one)

    def visit(frame) -> None:
        name = project_file(frame.f_code.co_filename, root)
        level = depths.get(frame)
        if name and level is not None and level <= depth and (not stays or stays[-1] != name):
            stays.append(name)

    def profile(frame, event, _arg):
        if event == "call":
            if not depths and frame.f_code.co_name == "train_iteration":
                depths[frame] = 0
            elif frame.f_back in depths:
                depths[frame] = depths[frame.f_back] + bool(project_file(frame.f_code.co_filename, root))
            visit(frame)
        elif event == "return" and depths.get(frame, 0) > 0:
            depths.pop(frame)
            visit(frame.f_back)

    sys.setprofile(profile)
    try:
        trainer.train_iteration(iteration)
    finally:
        sys.setprofile(None)
    return stays


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=1, help="project frames below train_iteration")
    args = parser.parse_args(argv)
    from training.config import load_config
    from training.trainer import Trainer

    root = Path(sys.modules["training"].__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="walk-") as run_dir:
        config = load_config(root / "configs" / "quickstart.yaml", [*OVERRIDES, f"run_dir={run_dir}"])
        trainer = Trainer(config)
        try:
            trainer.train_iteration(0)  # imports, envs and first forwards, not walked
            stays = walk(trainer, 1, args.depth, root)
        finally:
            trainer.close()
    returns = sum(name in stays[:i] for i, name in enumerate(stays))
    back_to_trainer = sum(name == "training/trainer.py" for name in stays[1:])
    print(" -> ".join(stays))
    print(
        f"code at {root}: depth {args.depth}: {len(stays)} stays, {returns} returns "
        f"({back_to_trainer} to training/trainer.py)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
