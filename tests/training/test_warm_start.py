"""The warm start teaches the whole answer, its stop token included, whatever RL's decoding (issue 33).

Under constrained decoding the response's fixed tokens (``<think></think><action>``, ``</action>`` and the
end-of-turn token) are the only continuation the trie allows, so a loss renormalised over the allowed tokens
gives them log-probability 0 and no gradient: a policy warm-started that way never learned to write them, and
in free text (vLLM, a served export) it never stopped (docs/quickstart.md, "Free text"). The
warm start's imitation is over the whole vocabulary instead (``training/warm_start.py``, "The whole answer").
"""

from __future__ import annotations

import pytest
import torch

from tests.training.training_helpers import tiny_trainer
from training.sampling import pack_sequences, policy_logprobs
from training.warm_start import collect_demonstrations, warm_start


@pytest.mark.parametrize("constrained", [True, False], ids=["constrained", "free-text"])
def test_a_warm_started_policy_writes_its_stop_token_after_the_answer(tmp_path, constrained):
    overrides = [f"rollout.constrained_actions={str(constrained).lower()}", "warm_start.epochs=100"]
    overrides += ["warm_start.lr=0.01", "warm_start.batch_rows=4"]
    with tiny_trainer(tmp_path, *overrides, "iterations=0", "eval.num_tasks=0") as trainer:
        rows, _ = collect_demonstrations(trainer.config, trainer.tokenizer, range(4))
        packed = pack_sequences(rows.prompt_ids, rows.response_ids, trainer.tokenizer.pad_token_id)
        free_text = [[] for _ in rows.response_ids]  # the whole vocabulary, as vLLM or a served export sample

        def stop_probability() -> float:
            """Mean p(stop token) where the demonstrations end, after their ``</action>``, in free text."""
            with torch.no_grad():
                logprobs = policy_logprobs(trainer.model, packed, rows.response_ids, free_text)
            last = packed.response_mask.sum(-1) - 1
            return float(logprobs.gather(1, last[:, None]).exp().mean())

        before = stop_probability()
        warm_start(trainer.config, trainer.model, trainer.tokenizer, trainer.device, trainer.dist)
        after = stop_probability()
    assert all(r[-1] in trainer.policy.stop_token_ids for r in rows.response_ids)  # the demonstrations end
    assert before < 0.01  # a random policy: about 1 / vocabulary
    assert after > 0.9, (before, after)  # learned, also when RL decodes constrained
