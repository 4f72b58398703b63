"""Concurrent evaluation: many episodes at once by default, with the same episodes as one at a time.

The harness must add no nondeterminism: task ``t`` is reset with ``seed + t`` and an agent samples from seeds
fixed by (task, step), so playing 1 or many episodes at once, in-process or in subprocesses, and resuming a
run with another concurrency all give the same per-episode records.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from agents.cli import main
from agents.evaluate import EvalConfig, evaluate
from agents.llm_config import OpenAIConfig, TransformersConfig
from tests.agents.agents_toy_envs import openai_eval_argv
from tests.agents.eval_run_checks import check_run, prompt_key, read_records

TOY_TASKS = {"agents-test/ToyALFWorld-v0": 12, "agents-test/ToyWebShop-v0": 8}


@pytest.mark.parametrize("vector_mode", ["sync", "async"])
@pytest.mark.parametrize(
    "env_id, agent", [("agents-test/ToyALFWorld-v0", "expert"), ("agents-test/ToyWebShop-v0", "random")]
)
def test_concurrent_and_sequential_runs_play_the_same_episodes(tmp_path, env_id, agent, vector_mode):
    episodes = TOY_TASKS[env_id] - 1  # 5 copies: the last batch is short and padded
    runs = {}
    for name, num_envs in (("sequential", 1), ("concurrent", 5)):
        config = EvalConfig(
            env_id=env_id,
            agent=agent,
            out_dir=str(tmp_path / name),
            episodes=episodes,
            num_envs=num_envs,
            vector_mode=vector_mode if num_envs > 1 else "sync",
            seed=7,
        )
        evaluate(config, progress=False)
        runs[name] = read_records(tmp_path / name)
    assert [r["task_index"] for r in runs["sequential"]] == list(range(episodes))
    assert [r["seed"] for r in runs["sequential"]] == [7 + t for t in range(episodes)]
    assert runs["concurrent"] == runs["sequential"]
    if agent == "random":  # the random agent's episodes differ between tasks (the comparison means something)
        assert len({tuple(s["action"] for s in r["trajectory"]) for r in runs["sequential"]}) > 1


def test_resuming_with_another_concurrency_gives_the_one_shot_run(tmp_path):
    env_id = "agents-test/ToyWebShop-v0"
    one_shot = EvalConfig(env_id=env_id, agent="random", out_dir=str(tmp_path / "one"), episodes=8, seed=3)
    evaluate(one_shot, progress=False)
    resumed = EvalConfig(
        env_id=env_id, agent="random", out_dir=str(tmp_path / "two"), episodes=3, num_envs=1, seed=3
    )
    evaluate(resumed, progress=False)
    resumed.episodes, resumed.num_envs = 8, 4
    evaluate(resumed, progress=False)
    assert read_records(tmp_path / "two") == read_records(tmp_path / "one")


@pytest.mark.parametrize(
    "settings, copies",
    [
        ({"agent": "openai"}, 32),
        ({"agent": "openai", "openai": OpenAIConfig(concurrency=4)}, 4),
        ({"agent": "openai", "episodes": 6}, 6),
        ({"agent": "openai", "num_envs": 2}, 2),
        ({"agent": "transformers", "transformers": TransformersConfig(batch_size=16)}, 16),
        ({"agent": "expert"}, 1),
        ({"agent": "random", "num_envs": 3, "episodes": 2}, 3),
    ],
)
def test_copies_follow_the_agent_unless_set(settings, copies):
    assert EvalConfig(env_id="agents-test/ToyWebShop-v0", out_dir="unused", **settings).copies() == copies


def _eval_argv(endpoint, out, *extra: str) -> list[str]:
    return openai_eval_argv(endpoint.base_url, out, "--episodes", "8", "--seed", "2", *extra)


def test_openai_eval_is_concurrent_by_default_and_records_every_request(endpoint, tmp_path):
    """Default flags: all 8 episodes at once (8 requests in flight); ``--num-envs 1 --concurrency 1``: one at
    a time. Same episodes, and every request the server saw is a recorded step (and the other way round)."""
    endpoint.delay_s = 0.1  # long enough that the 8 requests of a step overlap on the server
    assert main(_eval_argv(endpoint, tmp_path / "default")) == 0
    concurrent_requests = list(endpoint.requests)
    assert endpoint.max_in_flight == 8

    endpoint.delay_s, endpoint.requests, endpoint.max_in_flight = 0.0, [], 0
    assert main(_eval_argv(endpoint, tmp_path / "one", "--num-envs", "1", "--concurrency", "1")) == 0
    assert endpoint.max_in_flight == 1

    _, records = check_run(tmp_path / "default", 8)
    _, sequential = check_run(tmp_path / "one", 8)
    assert records == sequential
    steps = [s for r in records for s in r["trajectory"]]
    assert Counter(prompt_key(body["messages"]) for body in concurrent_requests) == Counter(
        prompt_key(s["prompt"]) for s in steps
    )
    assert sorted(body["seed"] for body in concurrent_requests) == sorted(
        body["seed"] for body in endpoint.requests
    )


def test_tasks_that_are_not_consecutive_share_a_batch(tmp_path):
    """A resumed run's gaps (or a stratified task order) do not split a batch: each copy is reset with its
    own task's seed, so 5 tasks with gaps between them are one batch, with the one-shot run's episodes."""
    from agents.scripted import RandomAgent

    class CountingAgent(RandomAgent):
        def reset(self, tasks):
            self.batches.append([t.task_index for t in tasks])
            super().reset(tasks)

    env_id = "agents-test/ToyWebShop-v0"
    evaluate(
        EvalConfig(env_id=env_id, agent="random", out_dir=str(tmp_path / "one"), episodes=8, seed=4),
        progress=False,
    )
    one_shot = read_records(tmp_path / "one")
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "run.json").write_text((tmp_path / "one" / "run.json").read_text())
    kept = [
        line
        for line in (tmp_path / "one" / "trajectories.jsonl").read_text().splitlines(keepends=True)
        if json.loads(line)["task_index"] in (1, 3, 6)
    ]
    (partial / "trajectories.jsonl").write_text("".join(kept))
    agent = CountingAgent(seed=4)
    agent.batches = []
    config = EvalConfig(env_id=env_id, agent="random", out_dir=str(partial), episodes=8, num_envs=5, seed=4)
    evaluate(config, agent=agent, progress=False)
    assert agent.batches == [[0, 2, 4, 5, 7]]
    assert read_records(partial) == one_shot
