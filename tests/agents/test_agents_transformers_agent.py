"""TransformersAgent with a tiny random Qwen2 and a locally trained tokenizer, loaded by from_pretrained."""

import json

import pytest

from agents.base import Task
from agents.evaluate import EvalConfig, evaluate
from agents.projection import project_action
from agents.transformers_agent import TransformersAgent, TransformersConfig

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


def test_evaluate_with_the_transformers_agent(tiny_qwen, tmp_path):
    config = EvalConfig(
        env_id="agents-test/ToyALFWorld-v0",
        agent="transformers",
        out_dir=str(tmp_path),
        episodes=2,
        num_envs=2,
        max_steps=2,
        transformers=TransformersConfig(model_path=str(tiny_qwen), max_new_tokens=4, device="cpu"),
    )
    summary = evaluate(config, progress=False)
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
