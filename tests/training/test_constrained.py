"""Constrained decoding (``rollout.constrained_actions``): the trie, the sampler, the trainer's log-probs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.projection import demonstration_text
from agents.prompts import get_style
from tests.paths import REPO_ROOT
from tests.training.training_helpers import WEBSHOP_OVERRIDES, sample_from, subprocess_env, tiny_trainer
from training import sampling
from training.config import ConfigError, load_config
from training.constrained import (
    ChoiceTrie,
    allowed_index_tensor,
    allowed_token_sets,
    constrained_logprobs_and_entropy,
)
from training.policy import load_policy
from training.sampling import (
    allowed_logits,
    pack_sequences,
    policy_logprobs_and_entropy,
    response_logits,
)

CONFIGS = REPO_ROOT / "configs"
ACTIONS = [
    ["go to bed 1", "go to desk 1", "go to desk 2", "take book 1 from bed 1", "look"],
    ["inventory", "look", "examine desk 1"],
]


def test_trie_lists_continuations_and_rejects_responses_off_the_trie():
    trie = ChoiceTrie([[1, 2, 3], [1, 4], [5]])
    assert trie.allowed([]) == [1, 5]
    assert trie.allowed([1]) == [2, 4]
    assert trie.allowed([1, 2, 3]) == [] and trie.allowed([9]) == []
    assert allowed_token_sets([[1, 2, 3], [1, 4]], [1, 4]) == [[1], [2, 4]]
    with pytest.raises(ValueError, match="not an allowed continuation"):
        allowed_token_sets([[1, 2, 3], [1, 4]], [1, 3])
    with pytest.raises(ValueError, match="at least one candidate"):
        ChoiceTrie([])


def test_constrained_logprobs_renormalise_over_the_allowed_tokens():
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0], [5.0, 0.0, 0.0, 0.0]]])
    index, valid = allowed_index_tensor([[[1, 2], [0]]], 2)
    logprobs, entropy = constrained_logprobs_and_entropy(
        logits.gather(-1, index), index, valid, torch.tensor([[1, 0]])
    )
    assert logprobs[0, 0].item() == pytest.approx(1.0 - np.log(np.exp(1.0) + np.exp(2.0)))
    assert logprobs[0, 1].item() == pytest.approx(0.0)  # a forced token costs nothing
    p = np.exp([1.0, 2.0]) / np.exp([1.0, 2.0]).sum()
    assert entropy[0, 0].item() == pytest.approx(-(p * np.log(p)).sum())
    assert entropy[0, 1].item() == pytest.approx(0.0)


def _candidates(tokenizer):
    return [
        [
            tokenizer(demonstration_text(a) + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
            for a in actions
        ]
        for actions in ACTIONS
    ]


def _prompts(tok) -> list[list[int]]:
    return [tok("Your task is to: put a book on the desk.")["input_ids"], tok("look around")["input_ids"]]


def _sample_constrained(policy, prompts, candidates, seed: int, temperature: float):
    return sample_from(
        policy,
        prompts,
        max_new_tokens=40,
        temperature=temperature,
        seeds=[2 * seed + k for k in range(len(prompts))],
        candidates=candidates,
    )


def test_sampler_writes_only_candidates_and_the_trainer_recomputes_its_logprobs(tiny_policy_dir):
    policy = load_policy(tiny_policy_dir, device="cpu")
    tok = policy.tokenizer
    candidates = _candidates(tok)
    prompts = _prompts(tok)
    seen: set[str] = set()
    for seed in range(6):
        out = _sample_constrained(policy, prompts, candidates, seed, temperature=1.0)
        assert out.finished == [True, True]
        for row, response in enumerate(out.token_ids):
            assert response in candidates[row]  # an untrained model writes nothing else
            seen.add(tok.decode(response))
        packed = pack_sequences(prompts, out.token_ids, tok.pad_token_id)
        with torch.no_grad():
            logprobs, _ = policy_logprobs_and_entropy(policy.model, packed, out.token_ids, candidates)
        for row, recorded in enumerate(out.logprobs):
            assert torch.allclose(logprobs[row, : len(recorded)], torch.tensor(recorded), atol=1e-5)
    assert len(seen) >= 3  # it samples among the candidates, not one fixed answer


def test_constrained_responses_are_whole_candidates_whatever_max_new_tokens(tiny_policy_dir):
    policy = load_policy(tiny_policy_dir, device="cpu")
    tok = policy.tokenizer
    candidates = _candidates(tok)
    out = sample_from(
        policy,
        _prompts(tok),
        max_new_tokens=2,  # shorter than every candidate
        seeds=[0, 1],
        candidates=candidates,
    )
    assert out.finished == [True, True]
    assert all(response in candidates[row] for row, response in enumerate(out.token_ids))


def test_output_rows_of_the_allowed_tokens_give_the_full_vocabulary_results(tiny_policy_dir, monkeypatch):
    """The constrained fast path (only the allowed tokens' output rows) gives the log-probs, entropies and
    gradients of gathering from the full logits; the sampler's recorded log-probs match both."""
    policy = load_policy(tiny_policy_dir, device="cpu")
    tok = policy.tokenizer
    candidates = _candidates(tok)
    prompts = _prompts(tok)
    assert sampling.output_projection(policy.model) is not None
    out = _sample_constrained(policy, prompts, candidates, seed=3, temperature=0.8)
    packed = pack_sequences(prompts, out.token_ids, tok.pad_token_id)

    def trainer_side():
        policy.model.zero_grad()
        logprobs, entropy = policy_logprobs_and_entropy(policy.model, packed, out.token_ids, candidates, 0.8)
        (logprobs * packed.response_mask).sum().backward()
        grad = policy.model.get_output_embeddings().weight.grad.clone()
        return logprobs.detach(), entropy.detach(), grad

    fast = trainer_side()
    monkeypatch.setattr(sampling, "output_projection", lambda model: None)
    full = trainer_side()
    for a, b in zip(fast, full, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert float(fast[2].abs().sum()) > 0
    for row, recorded in enumerate(out.logprobs):
        assert torch.allclose(full[0][row, : len(recorded)], torch.tensor(recorded), atol=1e-5)


def test_allowed_logits_gather_from_the_full_logits(tiny_policy_dir):
    policy = load_policy(tiny_policy_dir, device="cpu")
    tok = policy.tokenizer
    options = _candidates(tok)[0]
    packed = pack_sequences([tok("go")["input_ids"]] * len(options), options, tok.pad_token_id)
    index, _ = allowed_index_tensor(
        [allowed_token_sets(options, o) for o in options], packed.response_ids.shape[1]
    )
    with torch.no_grad():
        full = response_logits(policy.model, packed, 0.5).gather(-1, index)
        assert torch.allclose(allowed_logits(policy.model, packed, index, 0.5), full, atol=1e-5)


def test_candidate_sequence_probabilities_sum_to_one(tiny_policy_dir):
    """The constrained policy is a distribution over the admissible actions."""
    policy = load_policy(tiny_policy_dir, device="cpu")
    tok = policy.tokenizer
    options = _candidates(tok)[0]
    prompt = tok("Your task is to: put a book on the desk.")["input_ids"]
    packed = pack_sequences([prompt] * len(options), options, tok.pad_token_id)
    with torch.no_grad():
        logprobs, _ = policy_logprobs_and_entropy(
            policy.model, packed, options, [options] * len(options), temperature=0.7
        )
    total = float((logprobs * packed.response_mask).sum(-1).exp().sum())
    assert total == pytest.approx(1.0, abs=1e-5)


def test_config_refuses_constrained_decoding_where_it_cannot_work():
    with pytest.raises(ConfigError, match="engine=transformers"):
        load_config(None, ["rollout.constrained_actions=true", "rollout.engine=vllm"])


def test_vllm_on_the_command_line_samples_the_quickstart_in_free_text(tmp_path):
    assert load_config(None).rollout.constrained_actions  # the quickstart decodes constrained
    assert not load_config(None, ["rollout.engine=vllm"]).rollout.constrained_actions
    preset = tmp_path / "vllm.yaml"  # a file that chooses vLLM and constrained decoding is refused as set
    preset.write_text("rollout:\n  engine: vllm\n  constrained_actions: true\n")
    with pytest.raises(ConfigError, match="engine=transformers"):
        load_config(preset)


def test_webshop_search_is_made_concrete_as_the_instruction():
    admissible = ["search[<your query>]", "click[back to search]", "click[b000123]"]
    assert get_style("webshop").enumerable_commands(admissible, "red socks") == [
        "search[red socks]",
        "click[back to search]",
        "click[b000123]",
    ]
    alfworld = get_style("alfworld")  # no pattern entries: the list as it is
    assert alfworld.enumerable_commands(["go to desk 1", "look"], "put a mug") == ["go to desk 1", "look"]


@pytest.mark.parametrize(
    "env_overrides",
    [[], [*WEBSHOP_OVERRIDES, "env.max_steps=5", "rollout.max_new_tokens=64"]],
    ids=["toy-alfworld", "webshop"],
)
def test_constrained_training_iteration_plays_only_admissible_actions(tmp_path, monkeypatch, env_overrides):
    from training.warm_start import warm_start

    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    constrained = ("rollout.constrained_actions=true", "warm_start.lm_epochs=2")
    longer = [] if env_overrides else ["rollout.max_new_tokens=40"]
    with tiny_trainer(
        tmp_path, *env_overrides, "iterations=1", "eval.num_tasks=0", *constrained, *longer
    ) as trainer:
        # demonstrations carry their candidates (the imitation loss is over the whole vocabulary)
        stats = warm_start(trainer.config, trainer.model, trainer.tokenizer, trainer.device, trainer.dist)
        metrics = trainer.train_iteration(0)
    assert stats["demo_steps"] > 0 and np.isfinite(stats["sft_loss_last_epoch"])
    assert 1 < stats["lm_texts"] <= stats["demo_steps"]  # distinct prompts
    assert stats["lm_loss_last_epoch"] < stats["lm_loss_first_epoch"]  # the prompt text was learned from
    assert metrics["admissible_rate"] == 1.0 and metrics["valid_rate"] == 1.0
    assert metrics["first_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["logprob_diff_max"] < 1e-4
    if env_overrides:  # WebShop reports its 0-1 purchase score, whatever the reward mode
        assert 0.0 <= metrics["task_score"] <= 1.0
    else:
        assert "task_score" not in metrics
