"""TransformersAgent with a tiny random Qwen2 and a locally trained tokenizer, loaded by from_pretrained: free
text, and guided by the model's own log-probabilities over the admissible answers."""

import dataclasses
import json
import os

import pytest

from agents.base import Task, guided_answers
from agents.evaluate import EvalConfig, evaluate
from agents.projection import demonstration_text, project_action
from agents.transformers_agent import TransformersAgent, TransformersConfig, default_threads

torch = pytest.importorskip("torch")
torch.set_num_threads(1)


def _prompts():
    return [
        [{"role": "user", "content": "Your task is to: put a mug on desk."}],
        [
            {
                "role": "user",
                "content": "WebShop [SEP] Instruction: [SEP] i need a red shirt [SEP] Search " * 3,
            }
        ],
        [{"role": "system", "content": "You are an expert agent."}, {"role": "user", "content": "look"}],
    ]


def test_batched_left_padded_generation_equals_one_by_one(tiny_qwen):
    agent = TransformersAgent(
        TransformersConfig(model_path=str(tiny_qwen), device="cpu", max_new_tokens=6, batch_size=3)
    )
    assert agent.tokenizer.padding_side == "left"
    batched = agent.generate(_prompts(), [0, 1, 2])
    single = [agent.generate([p], [0])[0] for p in _prompts()]
    assert [g.text for g in batched] == [g.text for g in single]
    for prompt, generation in zip(_prompts(), batched, strict=True):
        text = agent.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        assert generation.prompt_tokens == len(agent.tokenizer(text, add_special_tokens=False).input_ids)
        assert 0 < generation.completion_tokens <= 6
    agent.close()


def test_sampling_is_reproducible_for_the_same_seeds(tiny_qwen):
    config = TransformersConfig(model_path=str(tiny_qwen), device="cpu", max_new_tokens=8, temperature=1.0)
    agent = TransformersAgent(config)
    first = [g.text for g in agent.generate(_prompts(), [5, 6, 7])]
    again = [g.text for g in agent.generate(_prompts(), [5, 6, 7])]
    assert first == again
    agent.close()


def test_act_projects_the_model_text(tiny_qwen):
    agent = TransformersAgent(TransformersConfig(model_path=str(tiny_qwen), device="cpu", max_new_tokens=5))
    agent.reset([Task("alfworld", 0, "t0", "put a mug on desk")])
    [decision] = agent.act(["You are in a room."], [{"admissible_actions": ["look", "go to desk 1"]}])
    assert (decision.action, decision.valid) == project_action(decision.raw_output, ["look", "go to desk 1"])
    assert decision.prompt[0]["role"] == "user" and decision.completion_tokens > 0
    agent.close()


def _toy_evaluation(tiny_qwen, out, max_steps: int, mode: str = "free", **model) -> dict:
    """``evaluate`` of the transformers agent on two toy ALFWorld episodes played side by side; ``model``:
    the rest of its :class:`TransformersConfig`."""
    transformers = TransformersConfig(model_path=str(tiny_qwen), device="cpu", **model)
    toy = {"env_id": "agents-test/ToyALFWorld-v0", "episodes": 2, "num_envs": 2, "max_steps": max_steps}
    config = EvalConfig(agent="transformers", mode=mode, out_dir=str(out), transformers=transformers, **toy)
    return evaluate(config, progress=False)


def test_evaluate_with_the_transformers_agent(tiny_qwen, tmp_path):
    summary = _toy_evaluation(tiny_qwen, tmp_path, max_steps=2, max_new_tokens=4)
    records = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    steps = [s for r in records for s in r["trajectory"]]
    assert summary["episodes"] == 2 and len(steps) == 4 and summary["mean_steps"] == 2
    invalid = sum(not project_action(s["raw_output"], None)[1] for s in steps)
    assert summary["invalid_action_rate"] == invalid / 4
    assert summary["completion_tokens"] == sum(s["completion_tokens"] for s in steps) > 0


@pytest.mark.gpu
def test_generation_on_cuda_matches_cpu(tiny_qwen):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cpu = TransformersAgent(TransformersConfig(model_path=str(tiny_qwen), device="cpu", max_new_tokens=6))
    gpu = TransformersAgent(
        TransformersConfig(model_path=str(tiny_qwen), device="cuda", dtype="float32", max_new_tokens=6)
    )
    assert gpu.model.device.type == "cuda"
    assert [g.text for g in gpu.generate(_prompts(), [0, 1, 2])] == [
        g.text for g in cpu.generate(_prompts(), [0, 1, 2])
    ]


ANSWERS = ["look", "go to desk 1", "go to desk 10", "take mug 1 from desk 1", "inventory"]


def _full_sequence_logprob(agent, prompt, answer: str) -> float:
    """log p(answer + end of turn | prompt) by one plain forward pass over prompt + answer (no cache)."""
    text = agent.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    prompt_ids = agent.tokenizer(text, add_special_tokens=False).input_ids
    answer_ids = agent.tokenizer(answer + agent.tokenizer.eos_token, add_special_tokens=False).input_ids
    ids = torch.tensor([prompt_ids + answer_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(agent.model(input_ids=ids).logits[0].float(), dim=-1)
    return sum(float(logprobs[len(prompt_ids) + j - 1, t]) for j, t in enumerate(answer_ids))


@pytest.mark.parametrize("batch_size", [1, 2, 8])
def test_guided_scores_are_the_answers_log_probabilities_up_to_their_shared_start(tiny_qwen, batch_size):
    """Scored from one cached pass over the prompt, a few rows at a time, the scores are each answer's
    log-probability less one constant (the tokens every answer starts with): the same differences, the
    same argmax."""
    agent = TransformersAgent(
        TransformersConfig(model_path=str(tiny_qwen), device="cpu", batch_size=batch_size)
    )
    answers = guided_answers("alfworld", ANSWERS, "put a mug on desk")
    for prompt in _prompts():
        scores = agent.answer_scores(prompt, answers)
        exact = [_full_sequence_logprob(agent, prompt, a) for a in answers]
        shifts = [s - e for s, e in zip(scores, exact, strict=True)]
        assert max(shifts) - min(shifts) < 1e-3, shifts
        assert scores.index(max(scores)) == exact.index(max(exact))
        assert agent.choose(prompt, answers).text == answers[exact.index(max(exact))]
    agent.close()


def test_a_guided_agent_acts_validly_with_the_models_choice(tiny_qwen):
    agent = TransformersAgent(TransformersConfig(model_path=str(tiny_qwen), device="cpu"), mode="guided")
    agent.reset([Task("alfworld", 0, "t0", "put a mug on desk"), Task("alfworld", 1, "t1", "look at a mug")])
    infos = [{"admissible_actions": ANSWERS}, {"admissible_actions": ["look", "inventory"]}]
    decisions = agent.act(["You are in a room.", "You are in a hall."], infos)
    for decision, info in zip(decisions, infos, strict=True):
        assert decision.valid and decision.admissible and decision.action in info["admissible_actions"]
        scores = agent.answer_scores(
            decision.prompt, guided_answers("alfworld", info["admissible_actions"], "")
        )
        assert decision.raw_output == demonstration_text(
            info["admissible_actions"][scores.index(max(scores))]
        )
        assert decision.completion_tokens > 0 and decision.prompt_tokens > 0
    agent.close()


def test_a_guided_step_without_admissible_actions_is_that_episodes_error(tiny_qwen):
    agent = TransformersAgent(TransformersConfig(model_path=str(tiny_qwen), device="cpu"), mode="guided")
    agent.reset([Task("alfworld", 0, "t0", "put a mug on desk"), Task("alfworld", 1, "t1", "look")])
    first, second = agent.act(
        ["a room", "a hall"], [{"admissible_actions": []}, {"admissible_actions": ["look"]}]
    )
    assert first.error and "no admissible action" in first.error
    assert second.error is None and second.action == "look"
    agent.close()


def test_the_agent_computes_on_its_thread_setting(tiny_qwen):
    before = torch.get_num_threads()
    try:
        TransformersAgent(TransformersConfig(model_path=str(tiny_qwen), device="cpu", threads=2)).close()
        assert torch.get_num_threads() == 2
        TransformersAgent(TransformersConfig(model_path=str(tiny_qwen), device="cpu")).close()
        assert torch.get_num_threads() == default_threads() == max(1, len(os.sched_getaffinity(0)) // 2)
    finally:
        torch.set_num_threads(before)


def test_guided_evaluation_records_its_mode(tiny_qwen, tmp_path):
    summary = _toy_evaluation(tiny_qwen, tmp_path, max_steps=3, mode="guided")
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mode"] == saved["mode"] == "guided"
    assert summary["invalid_action_rate"] == summary["inadmissible_action_rate"] == 0.0
    assert "mode: guided" in (tmp_path / "report.md").read_text()


def test_a_run_resumes_only_in_its_own_mode(tiny_qwen, tmp_path):
    """The mode is a resume key: free episodes are never mixed into a guided run's summary. A run.json
    written before the mode existed was a free run."""
    config = EvalConfig(
        env_id="agents-test/ToyALFWorld-v0",
        agent="transformers",
        out_dir=str(tmp_path),
        episodes=1,
        max_steps=2,
        transformers=TransformersConfig(model_path=str(tiny_qwen), device="cpu", max_new_tokens=4),
    )
    evaluate(config, progress=False)
    with pytest.raises(ValueError, match="other settings.*'mode': \\('free', 'guided'\\)"):
        evaluate(dataclasses.replace(config, mode="guided"), progress=False)
    run_file = tmp_path / "run.json"
    settings = json.loads(run_file.read_text())
    del settings["mode"]
    run_file.write_text(json.dumps(settings))
    assert evaluate(dataclasses.replace(config, episodes=2), progress=False)["episodes"] == 2


def test_guided_sampling_draws_from_the_answers_probabilities_at_the_temperature(tiny_qwen):
    config = TransformersConfig(model_path=str(tiny_qwen), device="cpu", temperature=2.0)
    agent = TransformersAgent(config, mode="guided")
    prompt, answers = _prompts()[0], guided_answers("alfworld", ANSWERS, "put a mug on desk")
    expected = torch.softmax(torch.tensor(agent.answer_scores(prompt, answers)) / 2.0, dim=0)
    draws = [agent.choose(prompt, answers, seed).text for seed in range(300)]
    assert draws == [agent.choose(prompt, answers, seed).text for seed in range(300)]  # seeded
    for answer, probability in zip(answers, expected.tolist(), strict=True):
        assert abs(draws.count(answer) / 300 - probability) < 0.1, (answer, probability)
    agent.close()


def test_a_scripted_agents_summary_names_no_answer_mode(tmp_path):
    toy = {"env_id": "agents-test/ToyALFWorld-v0", "episodes": 1}
    config = EvalConfig(agent="random", out_dir=str(tmp_path), **toy)
    assert evaluate(config, progress=False)["mode"] is None
