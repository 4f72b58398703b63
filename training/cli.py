"""``progpo train``: train a policy with group RL (ProGPO by default).

Usage::

    progpo train                                   # the CPU quickstart (embedded defaults)
    progpo train --config configs/quickstart.yaml  # the same, from the shipped preset
    progpo train --config configs/alfworld_progpo_qwen2.5-1.5b.yaml --algo gigpo optim.lr=2e-6
    progpo train --config ... --resume             # continue a killed run from its last checkpoint
    torchrun --nproc_per_node 8 -m training.cli --config ...   # multi-GPU (FSDP2)

Overrides are ``section.key=value`` (YAML values); unknown keys are errors. ``--help-config`` lists every key
with its default and meaning. A run dir that holds a run is never reused silently: ``--resume`` continues it
(and refuses when it has no checkpoint), ``--resume-or-start`` continues it or starts one, ``--overwrite``
starts it again. One process at a time writes a run dir: it holds the run folder's lock
(:mod:`progpo_base.folder_lock`, the one ``progpo eval`` holds on its ``--out``; under ``torchrun`` rank 0
holds it) from before it writes anything, and a second ``progpo train`` or a ``progpo eval`` there,
``--resume`` or not, exits 2 in one line naming the first; so does a run dir this process cannot write. The
run says what it does from its first second and ends with a short result block.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

from progpo_base.config import field_table
from progpo_base.folder_lock import FolderRefused, folder_lock
from progpo_base.usage import CommandParser, report
from training.config import DAPO_RECIPE, ConfigError, TrainConfig, algo_choices, algo_parameters, load_config
from training.preflight import preflight, resume_mode


def build_parser() -> CommandParser:
    """The argument parser of ``progpo train``."""
    parser = CommandParser(
        prog="progpo train",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="YAML preset (default: the embedded quickstart defaults)")
    parser.add_argument(
        "--algo",
        choices=algo_choices(),
        help="advantage estimator (overrides algo.name); dapo means DAPO's recipe: "
        + ", ".join(f"{k}={v}" for k, v in DAPO_RECIPE.items())
        + ", except the keys you set on the command line",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in run_dir")
    mode.add_argument(
        "--resume-or-start",
        action="store_true",
        help="continue from the newest checkpoint in run_dir, or start a run when it has none",
    )
    mode.add_argument(
        "--overwrite", action="store_true", help="start again in a run_dir that holds a run (deletes it)"
    )
    parser.add_argument("--run-dir", help="output folder (overrides run_dir)")
    parser.add_argument("--help-config", action="store_true", help="list every config key and exit")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. rollout.group_size=8")
    return parser


def train_command(arguments: list[str], processes: int = 1) -> list[str]:
    """The command that runs ``progpo train arguments`` with this Python (``python -m training.cli``), under
    ``torchrun`` for ``processes`` > 1 (the ``torchrun`` beside this Python, else ``torch.distributed.run``).

    Example:
        >>> train_command(["iterations=0"])[1:]
        ['-m', 'training.cli', 'iterations=0']
    """
    if processes == 1:
        return [sys.executable, "-m", "training.cli", *arguments]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    launcher = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    return [*launcher, "--standalone", "--nproc_per_node", str(processes), "-m", "training.cli", *arguments]


def run_dir_lock(run_dir: str) -> contextlib.AbstractContextManager:
    """The run dir's lock, held by this process for the block; under ``torchrun`` by rank 0 alone (``RANK``
    is read before the ranks start their process group: rank 0 refused ends the job)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return contextlib.nullcontext()
    return folder_lock(run_dir, "progpo train", "give another run_dir")


def main(argv: list[str] | None = None) -> int:
    """Entry point (``progpo train ...``); returns the exit status."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.help_config:
        print("\n".join(field_table(TrainConfig)))
        print("\nalgo.name choices and the algo.params keys each accepts:")
        for name in algo_choices():
            print(f"  {name:<16} {', '.join(algo_parameters(name))}")
        return 0
    overrides = list(args.overrides)
    if args.algo:
        overrides.append(f"algo.name={args.algo}")
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    started = time.monotonic()
    with contextlib.ExitStack() as held:
        try:
            config = load_config(args.config, overrides)
            preflight(config)
            flags = (args.resume, args.resume_or_start, args.overwrite)
            resume_mode(config.run_dir, *flags)  # a refusal here leaves nothing behind, not even the folder
            held.enter_context(run_dir_lock(config.run_dir))  # before anything is written there
            resume = resume_mode(config.run_dir, *flags)  # again, as the run dir is now: this process's alone
        except (ConfigError, FileNotFoundError, FolderRefused) as exc:
            return report("progpo train", exc)
        return _train(config, resume, started)


def _train(config: TrainConfig, resume: bool, started: float) -> int:
    """The run of a checked config in its locked run dir; the exit status."""
    from training.checkpoint import CheckpointError
    from training.distributed import DistContext
    from training.report import print_banner, print_result
    from training.update import SamplerGapError

    dist = DistContext.from_env()
    if dist.is_main:
        print_banner(config, resume, dist.world_size)
    from training.trainer import Trainer

    trainer = Trainer(config, dist)
    try:
        summary = trainer.run(resume=resume)
    except (CheckpointError, SamplerGapError) as exc:  # nothing was deleted; the last checkpoint stands
        if dist.is_main:
            print(f"progpo train: {exc}", file=sys.stderr)
        return 1
    finally:
        trainer.close()
        dist.close()
    if dist.is_main:
        print_result(summary, config, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
