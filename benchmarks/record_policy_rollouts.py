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

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.credit_diagnostics import StepRow, alfworld_source, save_rollouts_jsonl  # noqa: E402


def record(policy_dir: Path, num_tasks: int, group_size: int, seed: int) -> list[StepRow]:
    """``group_size`` policy rollouts of ``num_tasks`` training tasks (spread over the split)."""
    from agents.memory import History
    from agents.projection import project_action_with_reason
    from agents.prompts import admissible_actions_from_info, build_prompt, task_text_from_observation
    from training.config import load_config
    from training.policy import load_policy
    from training.rollout import PromptEncoder, response_token_ids
    from training.sampling import sample_responses
    from training.warm_start import demonstration_text

    cfg = load_config(None)  # the quickstart
    kwargs = {**cfg.env.kwargs, **cfg.env.train_kwargs, "split": cfg.env.train_split}
    env, distance = alfworld_source(cfg.env.max_steps, **kwargs)
    policy = load_policy(policy_dir, device="cpu")
    tok = policy.tokenizer
    encode = PromptEncoder(tok, cfg.rollout.max_prompt_tokens)
    generator = torch.Generator().manual_seed(seed)
    tasks = np.linspace(0, env.unwrapped.num_tasks, num_tasks, endpoint=False).astype(int)
    rows: list[StepRow] = []
    for group_id, task_index in enumerate(tasks.tolist()):
        for k in range(group_size):
            obs, info = env.reset(seed=seed, options={"task_index": task_index})
            history = History(task_text=task_text_from_observation("alfworld", obs, info))
            d_before, t = distance(env), 0
            while True:
                admissible = admissible_actions_from_info("alfworld", info)
                prompt = encode(
                    build_prompt(
                        "alfworld",
                        history.task_text,
                        history,
                        obs,
                        admissible,
                        cfg.rollout.history_length,
                        template=cfg.rollout.template,  # the layout the policy was trained on
                    )
                )
                options = [response_token_ids(tok, demonstration_text(a)) for a in admissible]
                out = sample_responses(
                    policy.model,
                    [prompt],
                    max_new_tokens=cfg.rollout.max_new_tokens,
                    stop_token_ids=policy.stop_token_ids,
                    pad_token_id=tok.pad_token_id,
                    temperature=cfg.rollout.temperature,
                    generator=generator,
                    candidates=[options],
                )
                text = tok.decode(out.token_ids[0], skip_special_tokens=True)
                projection = project_action_with_reason(text, admissible)
                expert_action = str(info.get("expert_action", ""))
                history.record(obs, projection.action)
                next_obs, reward, terminated, truncated, next_info = env.step(projection.action)
                won = bool(next_info.get("won", False))
                d_after = 0 if won else distance(env)
                progress = None if d_before is None or d_after is None else float(d_before - d_after)
                rows.append(
                    StepRow(
                        group_id=group_id,
                        traj_id=group_id * group_size + k,
                        step=t,
                        obs=obs,
                        action=projection.action,
                        reward=float(reward),
                        won=won,
                        valid=bool(projection.valid),
                        expert_action=expert_action,
                        progress=progress,
                    )
                )
                obs, info, d_before, t = next_obs, next_info, d_after, t + 1
                if terminated or truncated:
                    break
    env.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True, help="a transformers folder (the warm start)")
    parser.add_argument("--tasks", type=int, default=12, help="task groups (default: %(default)s)")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="JSONL to write")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = record(args.policy, args.tasks, args.group_size, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_rollouts_jsonl(rows, args.out)
    won = sum(r.won for r in rows)
    print(f"wrote {len(rows)} steps of {args.tasks * args.group_size} rollouts ({won} won) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
