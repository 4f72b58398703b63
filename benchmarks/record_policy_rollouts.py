"""Record group rollouts of a trained policy on ALFWorld for the credit diagnostics (issue 8, part 2).

The policy (a transformers folder: the quickstart's warm start is ``runs/quickstart/reference``) plays ``G``
episodes of each task with the training loop's own prompt, history and constrained decoding, sampled at the
training temperature; every step is labelled with the expert's action and its progress ``d(s_t) - d(s_t+1)``
(``d`` = the true-state expert's remaining plan length). The env settings are the quickstart's (its task
restriction and training split). The output is the JSONL that ``credit_diagnostics.py --rollouts`` analyses.

Run: ``.venv/bin/python benchmarks/record_policy_rollouts.py --policy runs/quickstart/reference --out
runs/policy_rollouts.jsonl`` then ``.venv/bin/python benchmarks/credit_diagnostics.py --rollouts
runs/policy_rollouts.jsonl``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import torch

from benchmarks.harness import option, parse_config
from benchmarks.lib.credit import StepRow, alfworld_source, save_rollouts_jsonl
from progpo_envs.core.hashing import action_set_key

ROOT = Path(__file__).resolve().parents[1]


def record(policy_dir: Path, num_tasks: int, group_size: int, seed: int) -> list[StepRow]:
    """``group_size`` policy rollouts of ``num_tasks`` training tasks (spread over the split).

    The episodes are played one at a time, each a pass of the harness's rollout loop
    (:func:`agents.rollout.play_episodes`) with the training policy's agent
    (:class:`training.rollout.PolicyAgent`: the training prompts, constrained decoding and projection).
    """
    from agents.envs import num_tasks as split_size
    from agents.envs import spread_tasks
    from agents.rollout import play_episodes
    from training.config import load_config
    from training.engines import TransformersEngine
    from training.envs import make_split_envs
    from training.policy import load_policy
    from training.rollout import PolicyAgent, RolloutWorker

    cfg = load_config(None)  # the quickstart
    envs = make_split_envs(cfg.env, cfg.env.train_split, 1, 1, expert=True)  # one in-process copy
    game = envs.get_attr("unwrapped")[0]  # the copy itself, for the expert's remaining plan length
    source, distance = alfworld_source(
        cfg.env.max_steps, **{**cfg.env.kwargs, **cfg.env.train_kwargs, "split": cfg.env.train_split}
    )
    source.close()  # only its plan-length oracle is used (on the copy the loop plays)
    policy = load_policy(policy_dir, device="cpu")
    tok = policy.tokenizer
    worker = RolloutWorker.from_config(envs, cfg, tok)
    engine = TransformersEngine(
        policy.model,
        policy.stop_token_ids,
        tok.pad_token_id,
        top_p=cfg.rollout.top_p,
        batch_size=cfg.rollout.sample_batch_size,
    )
    policy_agent = PolicyAgent(
        worker,
        engine=engine,
        temperature=cfg.rollout.temperature,
        max_new_tokens=cfg.rollout.max_new_tokens,
        sampling_seed=seed,
    )
    agent = _PlanLengthAtReset(policy_agent, lambda: distance(game))
    rows: list[StepRow] = []
    try:
        for group_id, task_index in enumerate(spread_tasks(split_size(envs), num_tasks)):
            for k in range(group_size):
                policy_agent.traj_offset = group_id * group_size + k  # each episode its own responses
                d_after = None
                for vector_step in play_episodes(
                    envs, agent, worker.env_kind, seed=seed, task_indices=[task_index]
                ):
                    (t,) = vector_step.transitions
                    d_before = agent.at_reset if t.step == 0 else d_after
                    won = bool(t.next_info.get("won", False))
                    d_after = 0 if won else distance(game)
                    progress = None if d_before is None or d_after is None else float(d_before - d_after)
                    rows.append(
                        StepRow(
                            group_id=group_id,
                            traj_id=group_id * group_size + k,
                            step=t.step,
                            obs=t.observation,
                            action=t.decision.action,
                            reward=t.reward,
                            won=won,
                            valid=bool(t.decision.valid),
                            expert_action=str(t.info.get("expert_action", "")),
                            progress=progress,
                            admissible_key=int(action_set_key(t.info.get("admissible_actions") or ())),
                        )
                    )
    finally:
        envs.close()
    return rows


class _PlanLengthAtReset:
    """``agent``, plus the expert's remaining plan length measured when the episode starts (``at_reset``):
    the loop calls :meth:`reset` right after the env reset, before the first action."""

    def __init__(self, agent, measure):
        self.agent, self.measure = agent, measure
        self.at_reset: int | None = None

    def reset(self, tasks) -> None:
        self.agent.reset(tasks)
        self.at_reset = self.measure()

    def act(self, observations, infos, active=None):
        return self.agent.act(observations, infos, active)

    def close(self) -> None:
        self.agent.close()


@dataclass
class Settings:
    policy: Path | None = option(None, "a transformers folder (the warm start)", required=True)
    tasks: int = option(12, "task groups")
    group_size: int = option(8, "rollouts per task")
    seed: int = option(0, "recording seed")
    out: Path | None = option(None, "JSONL to write", required=True)


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])
    torch.set_num_threads(1)
    rows = record(settings.policy, settings.tasks, settings.group_size, settings.seed)
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    save_rollouts_jsonl(rows, settings.out)
    won = sum(r.won for r in rows)
    rollouts = settings.tasks * settings.group_size
    print(f"wrote {len(rows)} steps of {rollouts} rollouts ({won} won) to {settings.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
