"""Policy rollouts for the credit diagnostics: recorded with expert labels, readable and analysable."""

from __future__ import annotations

import pytest

from benchmarks.lib.credit import analyse, load_rollouts_jsonl
from benchmarks.record_policy_rollouts import main


def test_policy_rollouts_are_labelled_groups_the_diagnostics_read(tmp_path, monkeypatch):
    import training.rollout
    from training.config import TinyModelConfig, load_config
    from training.policy import build_tiny_policy

    templates = []  # the policy must see the prompt layout it was trained on (the quickstart's)
    real_build_prompt = training.rollout.build_prompt  # the prompts of the training policy's agent

    def build_prompt(*args, **kwargs):
        templates.append(kwargs.get("template"))
        return real_build_prompt(*args, **kwargs)

    monkeypatch.setattr(training.rollout, "build_prompt", build_prompt)

    policy = build_tiny_policy(
        tmp_path / "policy",
        TinyModelConfig(
            vocab_size=2048,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            num_key_value_heads=1,
        ),
    )
    out = tmp_path / "rollouts.jsonl"
    assert main(["--policy", str(policy), "--tasks", "2", "--group-size", "2", "--out", str(out)]) == 0
    rows = load_rollouts_jsonl(out)
    assert len(templates) == len(rows) and set(templates) == {load_config(None).rollout.template}
    assert {r.group_id for r in rows} == {0, 1} and len({r.traj_id for r in rows}) == 4
    assert all(r.valid for r in rows)  # constrained decoding: only admissible commands
    assert all(r.expert_action for r in rows)
    assert any(r.progress is not None and r.progress != 0 for r in rows)
    report = analyse(rows, ["grpo", "progpo"])
    assert report["batch"]["rows"] == len(rows)
    assert 0.0 <= report["batch"]["exact_prefix_peer_fraction"] <= 1.0
    assert set(report["estimators"]) == {"grpo", "progpo"}


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)
