"""OpenAIChatAgent against a real HTTP endpoint started in the test (conftest.py::ScriptedEndpoint)."""

import json
import time

import pytest

from agents.base import Task
from agents.cli import main
from agents.openai_agent import AgentRequestError, OpenAIChatAgent, OpenAIConfig
from agents.projection import project_action
from tests.agents.agents_toy_envs import hint_policy, openai_eval_argv
from tests.agents.eval_run_checks import check_run

PROMPT = [
    {
        "role": "user",
        "content": "Your current observation is: hi. Next you need to: look.\n admissible actions",
    }
]


def _agent(endpoint, **overrides) -> OpenAIChatAgent:
    settings = {
        "model": "scripted",
        "base_url": endpoint.base_url,
        "backoff_s": 0.01,
        "max_backoff_s": 0.05,
        "timeout_s": 5.0,
        "max_retries": 3,
    } | overrides
    return OpenAIChatAgent(OpenAIConfig(**settings))


def test_completion_text_and_usage(endpoint):
    agent = _agent(endpoint)
    generation = agent.complete(PROMPT, seed=7)
    assert generation.text.endswith("<action>look</action>")
    assert generation.prompt_tokens == len(PROMPT[0]["content"]) // 4
    assert endpoint.requests[0]["seed"] == 7 and endpoint.requests[0]["model"] == "scripted"
    agent.close()


def test_batch_keeps_order_and_bounds_concurrency(endpoint):
    endpoint.delay_s = 0.15
    agent = _agent(endpoint, concurrency=3)
    prompts = [
        [{"role": "user", "content": f"Next you need to: act {i}.\n admissible actions"}] for i in range(9)
    ]
    generations = agent.generate(prompts, list(range(9)))
    assert [g.text.split("<action>")[1] for g in generations] == [f"act {i}</action>" for i in range(9)]
    assert endpoint.max_in_flight == 3
    agent.close()


@pytest.mark.parametrize("status", [429, 500, 503])
def test_retryable_statuses_are_retried(endpoint, status):
    endpoint.faults = [("status", status), ("status", status)]
    agent = _agent(endpoint)
    assert agent.complete(PROMPT).text.endswith("<action>look</action>")
    assert len(endpoint.requests) == 3 and agent.retries == 2
    agent.close()


def test_timeout_is_retried(endpoint):
    endpoint.faults = [("sleep", 1.5)]
    agent = _agent(endpoint, timeout_s=0.4)
    start = time.perf_counter()
    assert agent.complete(PROMPT).text.endswith("<action>look</action>")
    assert agent.retries == 1 and time.perf_counter() - start < 1.5
    agent.close()


@pytest.mark.parametrize("status", [400, 401, 404])
def test_client_errors_fail_at_once_with_the_server_message(endpoint, status):
    endpoint.faults = [("status", status)]
    agent = _agent(endpoint)
    with pytest.raises(AgentRequestError, match=f"HTTP {status}.*scripted error {status}"):
        agent.complete(PROMPT)
    assert len(endpoint.requests) == 1
    agent.close()


def test_gives_up_after_max_retries(endpoint):
    endpoint.faults = [("status", 500)] * 10
    agent = _agent(endpoint, max_retries=2)
    with pytest.raises(AgentRequestError, match="after 3 attempts"):
        agent.complete(PROMPT)
    assert len(endpoint.requests) == 3
    agent.close()


def test_agent_memory_feeds_the_prompt(endpoint):
    agent = _agent(endpoint)
    agent.reset(
        [Task("alfworld", 0, "t0", "put some mug on desk"), Task("alfworld", 1, "t1", "look at a book")]
    )
    infos = [{"admissible_actions": ["look", "go to desk 1"]}] * 2
    first = agent.act(["Next you need to: go to desk 1.", "Next you need to: look."], infos, [True, False])
    assert first[1] is None and first[0].action == "go to desk 1" and first[0].valid and first[0].admissible
    second = agent.act(["You arrive. Next you need to: look.", "ignored"], infos, [True, True])
    assert "Action 1: 'go to desk 1'" in second[0].prompt[0]["content"]
    assert "Prior to this step" not in second[1].prompt[0]["content"]  # slot 1 had not acted before
    agent.close()


def _malformed_every_fourth(endpoint):
    from tests.agents.agents_toy_envs import hint_policy

    def policy(messages, body):
        text = hint_policy(messages, body)
        return text.split("</think>")[1] if body["seed"] % 4 == 0 else text  # drop <think> -> invalid

    endpoint.policy = policy


def test_eval_cli_with_the_openai_agent_is_reproducible(endpoint, tmp_path):
    _malformed_every_fourth(endpoint)
    runs = []
    for name, num_envs in (("a", 4), ("b", 3)):
        out = tmp_path / name
        flags = ["--episodes", "6", "--num-envs", str(num_envs), "--seed", "3", "--concurrency", "4"]
        assert main(openai_eval_argv(endpoint.base_url, out, *flags)) == 0
        summary = json.loads((out / "summary.json").read_text())
        lines = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
        runs.append((summary, sorted(lines, key=lambda r: r["task_index"])))
    (summary, records), (_, records_b) = runs
    assert (
        summary["episodes"] == 6 and summary["success_rate"] == 1.0
    )  # invalid outputs still play their action
    steps = [s for r in records for s in r["trajectory"]]
    invalid = sum("<think>" not in s["raw_output"] for s in steps)
    assert 0 < invalid < len(steps)
    assert summary["invalid_action_rate"] == pytest.approx(invalid / len(steps))
    assert summary["tokens"] == sum(s["prompt_tokens"] + s["completion_tokens"] for s in steps) > 0
    assert all(s["prompt"][0]["role"] == "user" and len(s["obs_hash"]) == 16 for s in steps)
    assert records == records_b  # same seed, other batching: the same episodes


@pytest.mark.parametrize("what", ["body", "headers"])
def test_timeout_is_a_deadline_against_a_trickling_endpoint(trickling_server, what):
    """An endpoint sending a byte at a time resets any per-read timeout; ``timeout_s`` bounds each attempt
    (before: ``progpo eval --timeout 3`` was still waiting after 150 s)."""
    server = trickling_server(what=what)
    agent = OpenAIChatAgent(
        OpenAIConfig(model="m", base_url=server.url + "/v1", timeout_s=1.0, max_retries=1, backoff_s=0.01)
    )
    start = time.monotonic()
    with pytest.raises(AgentRequestError, match=r"127\.0\.0\.1.*after 2 attempts.*1 s deadline"):
        agent.complete(PROMPT)
    assert time.monotonic() - start < 4.0
    [generation] = agent.generate([PROMPT], [0])  # in a batch, the failure is that prompt's, not raised
    assert generation.error and "deadline" in generation.error and generation.text == ""
    agent.close()


def test_close_does_not_wait_for_a_stuck_request(trickling_server):
    """close() cancels what is in flight (before: it joined the stuck thread; Ctrl-C could not end eval)."""
    import threading

    server = trickling_server()
    agent = OpenAIChatAgent(OpenAIConfig(model="m", base_url=server.url + "/v1", timeout_s=600.0))
    threading.Thread(target=agent.generate, args=([PROMPT], [0]), daemon=True).start()
    while not server.requests:
        time.sleep(0.05)
    start = time.monotonic()
    agent.close()
    assert time.monotonic() - start < 1.0


def test_an_answer_that_is_not_json_is_retried_and_names_the_endpoint(endpoint):
    endpoint.faults = [("garbage", 0)] * 10
    agent = _agent(endpoint, max_retries=1)
    with pytest.raises(AgentRequestError, match=f"request to {endpoint.base_url} failed after 2 attempts"):
        agent.complete(PROMPT)
    assert len(endpoint.requests) == 2
    agent.close()


def _engine_choice(messages: list[dict], body: dict) -> str:
    """What a server with guided choice answers: one of the request's choices (the hint's action, as the
    toy envs' expert would, else the first)."""
    choices = body["structured_outputs"]["choice"]
    hinted = hint_policy(messages, body)
    return next((c for c in choices if c.endswith(hinted[hinted.index("<action>") :])), choices[0])


def test_guided_mode_sends_the_admissible_answers_as_the_engines_choice(endpoint, tmp_path):
    endpoint.policy = _engine_choice
    assert main(openai_eval_argv(endpoint.base_url, tmp_path, "--mode", "guided", "--episodes", "3")) == 0
    summary, records = check_run(tmp_path, episodes=3)
    assert summary["mode"] == "guided" and summary["success_rate"] == 1.0
    assert summary["invalid_action_rate"] == 0.0
    steps = [s for r in records for s in r["trajectory"]]
    asked = {json.dumps(b["messages"]): b["structured_outputs"]["choice"] for b in endpoint.requests}
    assert len(endpoint.requests) == len(steps)
    for step in steps:  # each step's request offered every admissible action in the answer format
        choices = asked[json.dumps(step["prompt"])]
        assert len(choices) > 1 and all(project_action(c, None)[1] for c in choices)
        assert step["raw_output"] in choices and step["valid"] and step["admissible"]


def test_free_mode_sends_only_the_openai_api(endpoint):
    agent = _agent(endpoint)
    agent.generate([PROMPT], [1])
    assert "structured_outputs" not in endpoint.requests[0]
    agent.close()
