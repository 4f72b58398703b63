"""One rank of ``test_world_size.py`` (``torchrun --nproc_per_node N -m
tests.training.world_size_worker OUT``): the PPO
update of :mod:`training.update` on the same 24 step rows, whatever the number of ranks.

Every rank builds the same tiny model (seeded) and the same rows (4 groups × 2 trajectories × 3 steps), keeps
the groups of its share (as the trainer's rollout does), shards the model with FSDP2 when there is more than
one rank, and runs :func:`training.update.plan_update` + :func:`training.update.ppo_update` (2 epochs, global
mini-batches of 5 rows, micro-batches of 2, pi_old recomputed). Rank 0 writes the update's statistics to
``OUT/stats.json`` and the full trained weights to ``OUT/weights.pt``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from tests.training.training_helpers import tiny_qwen2
from training.checkpoint import gather_training_state
from training.config import LossConfig
from training.distributed import DistContext, shard_model
from training.rollout import StepRows
from training.update import Numerics, UpdateSettings, plan_update, ppo_update

GROUPS, TRAJECTORIES, STEPS = 4, 2, 3
MINI_BATCH_ROWS, MICRO_BATCH_ROWS, EPOCHS = 5, 2, 2


def all_rows() -> tuple[StepRows, np.ndarray]:
    """The batch in play order (by step, then trajectory), and one advantage per row."""
    rng = np.random.default_rng(7)
    rows = StepRows.empty()
    advantages = []
    for step in range(STEPS):
        for traj in range(GROUPS * TRAJECTORIES):
            response = rng.integers(1, 300, rng.integers(2, 7)).tolist()
            rows.prompt_ids.append(rng.integers(1, 300, rng.integers(4, 12)).tolist())
            rows.response_ids.append(response)
            rows.old_logprobs.append([-5.0] * len(response))  # a sampler's: recomputed by the trainer
            rows.group_id.append(traj // TRAJECTORIES)
            rows.traj_id.append(traj)
            rows.step.append(step)
            rows.choices.append([])
            advantages.append(float(rng.normal()))
    for name in ("reward", "won", "valid", "admissible", "obs_key", "action_key", "admissible_key"):
        getattr(rows, name).extend([0] * rows.num_rows)
    rows.history_key.extend([0] * rows.num_rows)
    rows.policy_version.extend([0] * rows.num_rows)
    rows.obs_text.extend([""] * rows.num_rows)
    rows.action_text.extend([""] * rows.num_rows)
    return rows, np.asarray(advantages)


def main(out: Path) -> None:
    dist = DistContext.from_env()
    torch.set_num_threads(1)
    model = tiny_qwen2()
    rows, advantages = all_rows()
    mine_groups = set(dist.shard(list(range(GROUPS))))
    mine = [i for i, g in enumerate(rows.group_id) if g in mine_groups]
    rows, advantages = rows.select(mine), advantages[mine]
    if dist.enabled:
        shard_model(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    plan = plan_update(
        rows,
        np.ones(rows.num_rows, dtype=bool),
        epochs=EPOCHS,
        mini_batch_rows=MINI_BATCH_ROWS,
        micro_batch_rows=MICRO_BATCH_ROWS,
        rng=np.random.default_rng(0),
        dist=dist,
    )
    settings = UpdateSettings(LossConfig(kl_coef=0.0), 1.0, 1.0, recompute_old_logprobs=True)
    stats = ppo_update(
        model, optimizer, None, rows, advantages, plan, settings,
        numerics=Numerics(torch.device("cpu")), dist=dist, pad_token_id=0,
    )  # fmt: skip
    weights, _ = gather_training_state(model, optimizer)
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "stats.json").write_text(json.dumps({**stats, "world_size": dist.world_size}))
        torch.save(weights, out / "weights.pt")
    dist.barrier()
    dist.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
