"""The harness records the same episodes whether the vector env hands out per-copy infos or batched ones."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize(
    ("env_id", "agent", "env_kwargs"),
    [
        ("agents-test/ToyWebShop-v0", "random", {}),
        ("agents-test/ToyALFWorld-v0", "expert", {"expert": True, "history_depths": (1, 2)}),
    ],
)
def test_harness_records_the_same_with_per_copy_or_batched_infos(tmp_path, env_id, agent, env_kwargs):
    """With a GroupVectorEnv the harness skips batching; through any other vector env it unbatches."""
    import gymnasium as gym

    from agents.evaluate import EvalConfig, evaluate
    from progpo_envs.core.vector import GroupVectorEnv

    outputs = []

    class Batched(gym.vector.VectorWrapper):  # a vector env that is not a GroupVectorEnv: batched infos only
        def get_attr(self, name):
            return self.env.get_attr(name)

    for name, wrap in (("copies", lambda envs: envs), ("batched", Batched)):
        envs = wrap(gym.make_vec(env_id, num_envs=3, group_size=1, **env_kwargs))
        assert isinstance(envs, GroupVectorEnv) == (name == "copies")
        config = EvalConfig(
            env_id=env_id,
            agent=agent,
            out_dir=str(tmp_path / name),
            num_envs=3,
            seed=2,
            env_kwargs={k: v for k, v in env_kwargs.items() if k != "expert"},
        )
        try:
            summary = evaluate(config, envs=envs, progress=False)
        finally:
            envs.close()
        outputs.append(((tmp_path / name / "trajectories.jsonl").read_bytes(), summary))
    assert outputs[0][0] == outputs[1][0] and outputs[0][0]
    assert json.dumps(outputs[0][1], sort_keys=True) == json.dumps(outputs[1][1], sort_keys=True)
