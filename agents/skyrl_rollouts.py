"""Rollouts of our SkyRL-Gym envs against an OpenAI-compatible model, as SkyRL's generator plays them: a check
of :mod:`agents.skyrl`'s classes against SkyRL's contract without ``skyrl-train`` (Ray, an inference engine).

``skyrl-train``'s ``SkyRLGymGenerator`` (read, not copied) plays each dataset row as :mod:`agents.skyrl` says:
the env made from the row (:func:`agents.skyrl.make`), ``init(prompt)``, then per turn the model's reply to
the chat, ``step(reply)``, the reply and the observations it returns appended, until ``done``;
``get_metrics()`` and ``close()`` at the end. :func:`play_rows` does the same with the model behind an
OpenAI-compatible server (greedy, one request per turn), which is what a SkyRL user's remote inference engine
is. From a venv with ``skyrl_gym`` (``.venv-skyrl``, ``scripts/setup_integrations.sh``) the envs are made by
``skyrl_gym.make``, as SkyRL makes them; elsewhere by our classes, which keep the same contract::

    .venv-skyrl/bin/python -m agents.skyrl_rollouts --env-class progpo_alfworld \\
        --server http://127.0.0.1:8000 --protocol native --model-url http://127.0.0.1:8002/v1 \\
        --model policy --tasks 0,2,4 --out rollouts.json

writes one record per row: ``task_index``, ``seed``, ``success``, ``steps``, the env's other metrics, and the
chat.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from openai import OpenAI

import agents.skyrl
from progpo_base.usage import CommandParser


def play_row(
    row: Mapping[str, Any], env_config: Mapping[str, Any], client: OpenAI, model: str, max_turns: int
) -> dict[str, Any]:
    """One row played as SkyRL's generator plays it (see the module docstring)."""
    extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
    env = agents.skyrl.make(row["env_class"], env_config, {**extras, "max_turns": max_turns})
    try:
        chat, _ = env.init(list(row["prompt"]))
        done = False
        while not done:
            answer = client.chat.completions.create(
                model=model, messages=chat, temperature=0.0, max_tokens=256
            )
            reply = answer.choices[0].message.content or ""
            out = env.step(reply)
            chat = [*chat, {"role": "assistant", "content": reply}, *out["observations"]]
            done = out["done"]
        metrics = env.get_metrics()
    finally:
        env.close()
    return {"task_index": row["task_index"], "seed": row["seed"], **metrics, "chat": chat}


def play_rows(
    rows: Sequence[Mapping[str, Any]],
    env_config: Mapping[str, Any],
    model_url: str,
    model: str,
    max_turns: int = 100,
    timeout_s: float = 120.0,
) -> list[dict[str, Any]]:
    """Every row, one after another."""
    client = OpenAI(base_url=model_url, api_key="EMPTY", timeout=timeout_s, max_retries=2)
    return [play_row(row, env_config, client, model, max_turns) for row in rows]


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(prog="python -m agents.skyrl_rollouts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-class", required=True, choices=sorted(agents.skyrl.ENV_CLASSES))
    parser.add_argument("--server", required=True, help="env server URL(s), comma-separated")
    parser.add_argument("--protocol", default="openenv", choices=("openenv", "native"))
    parser.add_argument("--split", default="train")
    parser.add_argument("--seed", type=int, default=0, help="task t is reset with seed + t")
    parser.add_argument("--tasks", required=True, help="task indices, comma-separated")
    parser.add_argument("--model-url", required=True, help="the OpenAI-compatible server's base URL (.../v1)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--max-turns", type=int, default=100)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        tasks = [int(t) for t in args.tasks.split(",")]
    except ValueError:
        parser.error(f"--tasks: comma-separated task indices, got {args.tasks!r}")
    rows = list(agents.skyrl.task_rows(args.env_class, tasks, split=args.split, seed=args.seed))
    env_config = {"server": args.server, "protocol": args.protocol, "split": args.split}
    records = play_rows(rows, env_config, args.model_url, args.model, args.max_turns)
    args.out.write_text(json.dumps(records))
    won = sum(r["success"] for r in records)
    print(f"[skyrl] {args.env_class}: {won:.0f}/{len(records)} won -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
