"""Does an ALFWorld policy read its task? A diagnostic for small policies (not a benchmark).

Two measures, both at steps where the task's object can be taken and some other object can be taken too
(the quickstart's env restriction, compact prompts and constrained decoding):

* **teacher-forced**, on the expert's own episodes of training tasks and of held-out (``valid_seen``) tasks:
  how often the policy ranks taking the task's object above taking any other object (each ``take``
  command scored by its constrained log-probability). A policy that memorised which object each training
  room's tasks want scores high on training tasks and at chance on held-out ones; a policy that reads
  scores high on both.
* **on-policy**, on the policy's own held-out rollouts: how often it takes the task's object.

Each is printed beside what a uniform choice among the offered objects would score.

Usage::

    .venv/bin/python scripts/reading_probe.py runs/quickstart/reference [--seeds 2] [--temperature 1.0]

Measured 2026-11-30 (32 held-out tasks; teacher-forced on 80 training tasks' expert episodes):

* imitation alone (the warm start before ``warm_start.lm_epochs`` existed, planner expert): teacher-forced
  0.65 on training tasks (chance 0.35) and 0.30 on held-out ones (chance 0.38); on-policy 0.38 (chance 0.32):
  it memorised which object each training room's tasks want;
* the quickstart's warm start (10 prompt-text passes, searching expert; ``runs/quickstart/reference``):
  teacher-forced 0.97 (chance 0.35) and 0.90 (chance 0.39); on-policy 0.52 (chance 0.38); after its 30 ProGPO
  iterations (``runs/quickstart/final``): 0.94, 0.97 and 0.60 (chance 0.36).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TAKE = re.compile(r"take (\w+) \d+ from")
TASK = re.compile(r"Task: (.*)")


def _task_words(trainer, prompt_ids) -> set[str]:
    task = TASK.search(trainer.tokenizer.decode(prompt_ids))
    return set(task.group(1).rstrip(".").split()) if task else set()


def _take_objects(trainer, choices) -> dict[str, list[int]]:
    """Candidate index of each offered ``take`` command, by object type."""
    objects: dict[str, list[int]] = {}
    for k, choice in enumerate(choices):
        if m := TAKE.search(trainer.tokenizer.decode(choice)):
            objects.setdefault(m.group(1), []).append(k)
    return objects


@torch.no_grad()
def teacher_forced(trainer, rows) -> tuple[float, float, int]:
    """(rate of ranking the task's object first, chance, steps) over the expert's take steps in ``rows``."""
    from training.sampling import pack_sequences, policy_logprobs

    hits = steps = 0
    chance = 0.0
    for i in range(rows.num_rows):
        if not TAKE.search(rows.action_text[i]):
            continue
        objects = _take_objects(trainer, rows.choices[i])
        goal = set(objects) & _task_words(trainer, rows.prompt_ids[i])
        if len(objects) < 2 or not goal:
            continue
        candidates = [c for ks in objects.values() for c in ks]
        responses = [rows.choices[i][k] for k in candidates]
        packed = pack_sequences(
            [rows.prompt_ids[i]] * len(responses), responses, trainer.tokenizer.pad_token_id, trainer.device
        )
        logprobs = policy_logprobs(trainer.model, packed, responses, [rows.choices[i]] * len(responses))
        best = candidates[int((logprobs * packed.response_mask).sum(-1).argmax())]
        hits += any(best in objects[g] for g in goal)
        steps += 1
        chance += 1 / len(objects)
    return hits / max(steps, 1), chance / max(steps, 1), steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_path", help="policy folder (e.g. runs/quickstart/reference: the warm start)")
    parser.add_argument("--tasks", type=int, default=32, help="held-out tasks, spread over the split")
    parser.add_argument("--train-tasks", type=int, default=80, help="training tasks, spread over the split")
    parser.add_argument("--seeds", type=int, default=2, help="sampling seeds per task (on-policy)")
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()

    from agents.envs import num_tasks, spread_tasks
    from training.config import load_config
    from training.envs import make_split_envs
    from training.rollout import RolloutWorker
    from training.seeds import derive_seed
    from training.trainer import Trainer
    from training.warm_start import collect_demonstrations

    config = load_config(
        None,
        [
            f"model.path={args.model_path}",
            "warm_start.enabled=false",
            "run_dir=runs/reading_probe",
            "progress=false",
            "tensorboard=false",
        ],
    )
    trainer = Trainer(config)
    trainer.model.eval()
    envs = make_split_envs(config.env, config.env.eval_split, args.tasks, 1)
    held_out = spread_tasks(num_tasks(envs), args.tasks)
    report = {}
    for name, split, tasks in (
        ("training", config.env.train_split, spread_tasks(config.warm_start.num_tasks, args.train_tasks)),
        ("held-out", config.env.eval_split, held_out),
    ):
        rows, _ = collect_demonstrations(config, trainer.tokenizer, tasks, split=split)
        report[name] = teacher_forced(trainer, rows)

    offered = took_goal = 0
    chance = 0.0  # expected takes of the task's object by a policy picking uniformly among the offered ones
    won = []
    try:
        for seed in range(args.seeds):
            result = RolloutWorker.from_config(envs, config, trainer.tokenizer).run(
                seed=seed,
                task_indices=held_out,
                engine=trainer.engine,
                temperature=args.temperature,
                max_new_tokens=config.rollout.max_new_tokens,
                sampling_seed=derive_seed(config.seed, "reading_probe", seed),
            )
            won += [e.won for e in result.episodes]
            rows = result.rows
            for i in range(rows.num_rows):
                objects = _take_objects(trainer, rows.choices[i])
                words = _task_words(trainer, rows.prompt_ids[i])
                if len(objects) > 1 and set(objects) & words:
                    offered += 1
                    chance += 1 / len(objects)
                    played = TAKE.search(rows.action_text[i])
                    took_goal += bool(played and played.group(1) in words)
    finally:
        envs.close()
        trainer.close()
    print(f"{args.model_path}: held-out success {np.mean(won):.3f} over {len(won)} episodes")
    for name, (rate, uniform, steps) in report.items():
        print(
            f"  teacher-forced, expert episodes of {name} tasks: ranks the task's object first at {rate:.2f} "
            f"of {steps} take steps (uniform choice: {uniform:.2f})"
        )
    print(
        f"  on-policy, held-out: took the task's object at {took_goal / max(offered, 1):.2f} of {offered} "
        f"steps where it was one of several takeable objects (uniform choice: {chance / max(offered, 1):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
