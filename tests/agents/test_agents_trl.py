"""``agents.trl``: ALFWorld and WebShop as environments of TRL's ``GRPOTrainer(environment_factory=...)``.

* the tools play the expert's plan to a win with the env's own return, in process, against OpenEnv's server
  (``progpo serve --protocol openenv``) and against our native server, and the three agree text for text;
* ``reset(**row)`` is deterministic in the row; a tool after the episode's end raises; the rows of a split;
* ALFWorld's answers restate the task before the admissible commands; ``last_view`` and ``done`` are no tools;
* TRL's tool schema comes out of the docstrings (TRL's own Qwen2.5 template renders it);
* (slow) TRL's own ``GRPOTrainer`` runs 2 optimisation steps on each env through the class, with a tiny
  random-initialised Qwen2 and the bundled tokenizer: loss and the env's rewards finite and logged, every
  rollout of a row reset to the same task.

Skipped per env when it cannot be built here.
"""

from __future__ import annotations

import math
import os
import re

import gymnasium as gym
import pytest

from agents.trl import ALFWorldToolEnv, WebShopToolEnv, expert_command, task_rows
from tests.agents.trainer_servers import (
    ALFWORLD,
    ENV_KWARGS,
    SPLIT,
    WEBSHOP,
    servers_on_first_use,
    start_server,
)

TOOL_ENVS = {ALFWORLD: ALFWorldToolEnv, WEBSHOP: WebShopToolEnv}


def _buildable(env_id: str) -> None:
    try:
        gym.make(env_id, **ENV_KWARGS[env_id], split=SPLIT[env_id]).close()
    except Exception as exc:  # noqa: BLE001 - any failure to build means "not available here"
        pytest.skip(f"{env_id} cannot be built here: {exc!r}")


@pytest.fixture(scope="module")
def servers():
    """Per env: the OpenEnv server and the native server (one env worker each), started on first use (by
    :func:`_tool_env`, once the env is known to build here)."""
    with servers_on_first_use(ENV_KWARGS.__getitem__) as url:
        yield url


def _tool_env(env_id: str, backend: str, servers):
    _buildable(env_id)
    if backend == "in-process":
        return TOOL_ENVS[env_id](split=SPLIT[env_id], **ENV_KWARGS[env_id])
    return TOOL_ENVS[env_id](server=servers(env_id, backend), protocol=backend, split=SPLIT[env_id])


def _expert_plan(env_id: str, task_index: int) -> tuple[list[str], float]:
    env = gym.make(env_id, **ENV_KWARGS[env_id], split=SPLIT[env_id], expert=True)
    _, info = env.reset(seed=0, options={"task_index": task_index})
    plan, total, done = [], 0.0, False
    while not done:
        plan.append(info["expert_action"])
        _, reward, terminated, truncated, info = env.step(plan[-1])
        total += reward
        done = terminated or truncated
    env.close()
    assert info["won"]
    return plan, total


def _call_tool(env, action: str) -> str:
    """The tool call that carries out an env action string."""
    if isinstance(env, WebShopToolEnv):
        kind, argument = re.fullmatch(r"(search|click)\[(.*)\]", action).groups()
        return env.search(argument) if kind == "search" else env.click(argument)
    return env.act(action)


@pytest.mark.parametrize(
    "env_id,backend",
    [
        (ALFWORLD, "in-process"),
        (ALFWORLD, "openenv"),
        (ALFWORLD, "native"),
        (WEBSHOP, "in-process"),
        (WEBSHOP, "openenv"),
    ],
)
def test_the_tools_play_the_experts_plan_to_a_win_with_the_envs_return(env_id, backend, servers):
    plan, expected_return = _expert_plan(env_id, task_index=2)
    env = _tool_env(env_id, backend, servers)
    reference = TOOL_ENVS[env_id](split=SPLIT[env_id], **ENV_KWARGS[env_id])  # in process
    row = {"prompt": [{"role": "user", "content": "x"}], "task_index": 2, "split": SPLIT[env_id], "seed": 0}
    first = env.reset(**row)
    assert first == reference.reset(**row)
    assert ("Admissible commands:" if env_id == ALFWORLD else "Available actions:") in first
    for action in plan:
        text = _call_tool(env, action)
        assert text == _call_tool(reference, action)
    assert text.endswith("The episode is over: the task is solved.")
    assert env.get_reward() == expected_return > 0
    with pytest.raises(ValueError, match="episode is over"):
        _call_tool(env, plan[-1])
    env.reset(**row)  # a new episode on the same instance, as TRL reuses them
    assert env.get_reward() == 0.0


def test_an_inadmissible_command_is_the_envs_invalid_action_not_an_error():
    _buildable(ALFWORLD)
    env = ALFWorldToolEnv()
    env.reset(task_index=0, split="train")
    assert env.act("fly to the moon").startswith("Nothing happens.")
    assert env.get_reward() == 0.0


def test_each_answer_restates_the_task_just_before_the_admissible_commands():
    _buildable(ALFWORLD)
    env = ALFWorldToolEnv()
    first = env.reset(task_index=0, split="train")
    task = re.search(r"^Your task is to: .*$", first, re.M).group(0)
    assert first.count("Your task is to:") == 1  # the first observation states it once
    answer = env.act("look")
    assert f"\n\n{task}\nAdmissible commands: " in answer
    plain = ALFWorldToolEnv(restate_task=False)
    plain.reset(task_index=0, split="train")
    assert "Your task is to:" not in plain.act("look")


def test_the_view_and_the_end_of_the_episode_are_attributes_not_tools():
    """``last_view`` and ``done`` follow the episode; TRL exposes neither as a tool (it takes the class's
    public functions), nor the expert, read apart with ``expert_command`` and never in the view."""
    import inspect

    _buildable(ALFWORLD)
    env = ALFWorldToolEnv(expert=True)
    assert env.done and env.last_view == {}
    env.reset(task_index=2, split="train")
    steps = 0
    while not env.done:
        assert "expert_action" not in env.last_view
        command = expert_command(env)
        assert command in env.last_view["admissible_actions"]
        env.act(command)
        steps += 1
    assert env.last_view["won"] and env.get_reward() > 0 and steps > 1
    tools = [name for name, _ in inspect.getmembers(ALFWorldToolEnv, inspect.isfunction) if name[0] != "_"]
    assert sorted(tools) == ["act", "get_reward", "reset"]


def test_rows_cover_the_split_and_reset_is_deterministic_in_the_row():
    _buildable(ALFWORLD)
    env = ALFWorldToolEnv()
    count = gym.make(ALFWORLD, split="train").unwrapped.num_tasks
    rows = list(task_rows(env, "train", repeats=2, seed=3))
    assert len(rows) == 2 * count and [r["task_index"] for r in rows[:count]] == list(range(count))
    assert {r["split"] for r in rows} == {"train"} and {r["seed"] for r in rows} == {3}
    # TRL appends the first observation to the prompt as it is: a blank line keeps them apart
    assert rows[0]["prompt"][0]["content"] == env.instruction + "\n\n"
    other = ALFWorldToolEnv()
    assert env.reset(**rows[1]) == other.reset(**rows[1]) != env.reset(**rows[2])
    with pytest.raises(ValueError, match="task_index"):
        env.reset(prompt=rows[0]["prompt"])
    with pytest.raises(ValueError, match="repeats"):
        list(task_rows(env, "train", repeats=0))


def test_trls_tool_schema_comes_from_the_docstrings():
    from trl.chat_template_utils import qwen2_5_chat_template

    from training.tokenizer import qwen25_tokenizer_truncated

    tokenizer = qwen25_tokenizer_truncated(8192)
    tokenizer.chat_template = qwen2_5_chat_template
    messages = [{"role": "user", "content": "shop"}]
    for env_class, tools in ((ALFWorldToolEnv, ["act"]), (WebShopToolEnv, ["search", "click"])):
        methods = [getattr(env_class, name) for name in tools]
        text = tokenizer.apply_chat_template(messages, tools=methods, tokenize=False)
        for name in tools:
            assert f'"name": "{name}"' in text
        assert ('"command"' if env_class is ALFWorldToolEnv else '"query"') in text


class _Recorded:
    """Tool envs that record each reset's row and first observation (``reset`` is not a tool for TRL)."""

    resets: list[tuple[int, str]] = []


class RecordedALFWorld(ALFWorldToolEnv, _Recorded):
    def reset(self, **row):
        first = super().reset(**row)
        _Recorded.resets.append((row["task_index"], first))
        return first


class RecordedWebShop(WebShopToolEnv, _Recorded):
    def reset(self, **row):
        first = super().reset(**row)
        _Recorded.resets.append((row["task_index"], first))
        return first


@pytest.mark.slow
@pytest.mark.parametrize("env_id", [ALFWORLD, WEBSHOP])
def test_trls_grpo_trainer_takes_two_steps_on_the_env_through_the_class(env_id, tmp_path):
    _buildable(env_id)
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from training.config import TinyModelConfig
    from training.policy import build_tiny_policy

    shape = TinyModelConfig(
        vocab_size=8192,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    folder = build_tiny_policy(tmp_path / "tiny", shape)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = qwen2_5_chat_template  # TRL's own Qwen2.5 template, with tool calls
    model = AutoModelForCausalLM.from_pretrained(folder)
    env_class = RecordedALFWorld if env_id == ALFWORLD else RecordedWebShop

    def factory():
        return env_class(split=SPLIT[env_id], **ENV_KWARGS[env_id])

    dataset = Dataset.from_list(list(task_rows(factory(), SPLIT[env_id], limit=4)))
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=32,
        max_tool_calling_iterations=2,
        max_steps=2,
        learning_rate=1e-4,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
    )
    _Recorded.resets.clear()
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=args, train_dataset=dataset, environment_factory=factory
    )
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [1, 2]
    reward_key = f"rewards/{env_class.__name__}/mean"
    for entry in logged:
        assert (
            math.isfinite(entry["loss"])
            and math.isfinite(entry["reward"])
            and math.isfinite(entry[reward_key])
        )
        assert "tools/call_frequency" in entry
    # 2 steps x 1 row x 2 generations: each row's rollouts started from the same first observation
    assert len(_Recorded.resets) == 4
    by_task: dict[int, set[str]] = {}
    for task_index, first in _Recorded.resets:
        by_task.setdefault(task_index, set()).add(first)
    assert all(len(firsts) == 1 for firsts in by_task.values())


@pytest.mark.parametrize("protocol", ["native", "openenv"])
def test_over_two_servers_a_lost_one_ends_its_episode_and_the_next_reset_moves(protocol):
    """Two WebShop servers: the instances spread over them; the second server stops mid-episode: its tool
    answers that the episode is over (not an exception for TRL), and the next reset plays the row again on the
    server left, to the expert's win."""
    _buildable(WEBSHOP)
    started = [start_server(WEBSHOP, protocol, ENV_KWARGS[WEBSHOP]) for _ in range(2)]
    try:
        urls = ",".join(server.url for server in started)
        envs = [WebShopToolEnv(server=urls, protocol=protocol, split="test", timeout_s=30) for _ in range(2)]
        plan, expected_return = _expert_plan(WEBSHOP, task_index=2)
        row = {"prompt": [], "task_index": 2, "split": "test", "seed": 0}
        first = [env.reset(**row) for env in envs]
        assert first[0] == first[1]
        started[1].stop()
        text = _call_tool(envs[1], plan[0])
        assert "The episode is over: the env server was lost" in text and started[1].url in text
        with pytest.raises(ValueError, match="episode is over"):
            _call_tool(envs[1], plan[1])
        assert envs[1].reset(**row) == first[0]  # on the server left
        for action in plan:
            text = _call_tool(envs[1], action)
        assert text.endswith("The episode is over: the task is solved.")
        assert envs[1].get_reward() == expected_return
    finally:
        for server in started:
            try:
                server.stop()
            except Exception:  # noqa: BLE001, S110 - stopped by the test already
                pass
