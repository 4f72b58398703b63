"""Prompt templates, the prompt styles by name, history memory and the prompt length bound."""

import dataclasses

import pytest

from agents.memory import History
from agents.prompts import (
    EnvPromptStyle,
    admissible_actions_from_info,
    build_prompt,
    get_style,
    register_style,
    style_name_from_metadata,
    style_names,
    task_text_from_observation,
)

ALF_FIRST = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
    "you see a desk 1.\n\nYour task is to: put some mug on desk."
)
SHOP_FIRST = "WebShop [SEP] Instruction: [SEP] i need red socks under 10 dollars [SEP] Search"


def _history(n: int) -> History:
    history = History(task_text="put some mug on desk")
    for i in range(n):
        history.record(f"observation number {i}", f"action number {i}")
    return history


def test_task_text_and_admissible_actions_from_env_outputs():
    assert task_text_from_observation("alfworld", ALF_FIRST, {}) == "put some mug on desk"
    assert task_text_from_observation("webshop", SHOP_FIRST, {}) == "i need red socks under 10 dollars"
    assert task_text_from_observation("webshop", SHOP_FIRST, {"instruction_text": "given"}) == "given"
    assert admissible_actions_from_info(
        "alfworld", {"admissible_actions": ["look", "help", "go to desk 1"]}
    ) == ["look", "go to desk 1"]
    info = {"available_actions": {"has_search_bar": False, "clickables": ["back to search", "b01"]}}
    assert admissible_actions_from_info("webshop", info) == ["click[back to search]", "click[b01]"]
    assert admissible_actions_from_info(
        "webshop", {"available_actions": {"has_search_bar": True, "clickables": []}}
    ) == ["search[<your query>]"]
    assert admissible_actions_from_info("webshop", {"available_actions": ["click[x]"]}) == ["click[x]"]


def test_envs_name_their_style_in_metadata_and_the_id_plays_no_part():
    import gymnasium as gym

    import progpo_envs  # noqa: F401
    import progpo_envs.testing as toys
    from progpo_envs.alfworld.env import ALFWorldEnv
    from progpo_envs.webshop.env import WebShopEnv

    assert style_name_from_metadata(ALFWorldEnv.metadata) == "alfworld"
    assert style_name_from_metadata(WebShopEnv.metadata) == "webshop"
    for env_id, style in [
        (toys.TOY_ALFWORLD_ENV_ID, "alfworld"),
        (toys.TOY_WEBSHOP_ENV_ID, "webshop"),
        (toys.DRAWER_ENV_ID, "alfworld"),
        (toys.COUNTER_ENV_ID, "text"),  # names none: the generic style
    ]:
        assert style_name_from_metadata(gym.make(env_id).unwrapped.metadata) == style, env_id
    with pytest.raises(ValueError, match="did you mean 'webshop'"):
        style_name_from_metadata({"prompt_style": "webshopp"})


def test_a_registered_style_is_open_to_any_env_and_names_are_not_reused():
    style = EnvPromptStyle(
        name="test-guess",
        role="You are guessing a number.",
        task_prefix="Goal: ",
        format_admissible=", ".join,
        format_observation=str.strip,
        task_text=lambda observation, info: "guess the number",
        admissible_actions=lambda info: list(info["admissible_actions"]),
        shown_actions=lambda actions: [a for a in actions if a != "quit"],
        action_patterns={"say[<number>]": "say[{}]"},
    )
    assert register_style(style) is style and register_style(style) is style  # twice: the same style
    assert "test-guess" in style_names()
    [message] = build_prompt("test-guess", "guess the number", [], "Pick 1-4.", ["guess 1", "quit"])
    assert message["content"].startswith("You are guessing a number. Goal: guess the number")
    assert "guess 1" in message["content"] and "quit" not in message["content"]
    assert get_style("test-guess").enumerable_commands(["say[<number>]", "guess 1"], "3") == [
        "say[3]",
        "guess 1",
    ]
    with pytest.raises(ValueError, match="registered as 'test-guess' already"):
        register_style(dataclasses.replace(style, role="another role"))


def test_the_generic_style_reads_the_task_from_info_or_the_first_observation():
    assert task_text_from_observation("text", "Guess my number.", {}) == "Guess my number."
    assert task_text_from_observation("text", "Hello.", {"task_text": "say hi"}) == "say hi"
    assert admissible_actions_from_info("text", {"admissible_actions": ["a", "", "b"]}) == ["a", "b"]
    [message] = build_prompt("text", "say hi", [], "Hello.", ["say hi", "help"])
    assert (
        "text environment. Your task is to: say hi" in message["content"] and "'help'" in message["content"]
    )


def test_default_template_first_step_has_no_history_sentence():
    [message] = build_prompt("alfworld", "put some mug on desk", [], ALF_FIRST, ["go to desk 1", "help"])
    content = message["content"]
    assert message["role"] == "user"
    assert "ALFRED Embodied Environment. Your task is to: put some mug on desk" in content
    assert "Welcome to TextWorld" not in content and "Prior to this step" not in content
    assert "'go to desk 1'" in content and "'help'" not in content
    assert "<think> </think>" in content and "<action> </action>" in content


def test_default_template_shows_only_the_last_history_length_steps():
    [message] = build_prompt(
        "alfworld", "put some mug on desk", _history(5), "now", ["look"], history_length=2
    )
    content = message["content"]
    assert "already taken 5 step(s)" in content and "most recent 2 observations" in content
    assert "[Observation 4: 'observation number 3', Action 4: 'action number 3']" in content
    assert "[Observation 5: 'observation number 4', Action 5: 'action number 4']" in content
    assert "observation number 2" not in content
    assert "You are now at step 6 and your current observation is: now" in content


def test_history_length_zero_keeps_the_task():
    [message] = build_prompt(
        "alfworld", "put some mug on desk", _history(3), "now", ["look"], history_length=0
    )
    assert "observation number" not in message["content"] and "put some mug on desk" in message["content"]


def test_webshop_page_loses_its_instruction_header():
    [message] = build_prompt(
        "webshop", "i need red socks under 10 dollars", [], SHOP_FIRST, ["search[<your query>]"]
    )
    content = message["content"]
    assert "WebShop e-commerce environment" in content
    assert content.count("i need red socks under 10 dollars") == 1
    assert "Your current observation is: Search" in content


def test_react_template_is_a_multi_turn_chat():
    messages = build_prompt(
        "alfworld", "put some mug on desk", _history(4), "now", ["look"], history_length=2, template="react"
    )
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "put some mug on desk" in messages[0]["content"] and "first 2 step(s)" in messages[0]["content"]
    assert messages[2]["content"] == "<action>action number 2</action>"
    assert messages[-1]["content"].startswith("Step 5. Observation: now")


def test_compact_template_puts_the_task_last_and_skips_the_instructions():
    messages = build_prompt(
        "alfworld",
        "put some mug on desk",
        _history(4),
        "now",
        ["look", "go to desk 1"],
        history_length=2,
        template="compact",
    )
    assert [m["role"] for m in messages] == ["user"]
    lines = messages[0]["content"].split("\n")
    assert lines == [
        "Step 3: observation number 2 > action number 2",
        "Step 4: observation number 3 > action number 3",
        "Step 5: now",
        "Actions: look | go to desk 1",
        "Task: put some mug on desk",
    ]
    default = build_prompt("alfworld", "put some mug on desk", _history(4), "now", ["look"], history_length=2)
    assert len(messages[0]["content"]) < len(default[0]["content"]) / 2


@pytest.mark.parametrize("template", ["default", "react", "compact"])
def test_length_bound_drops_history_then_shortens_the_list_then_cuts_the_observation(template):
    history = _history(6)
    pool = [f"go to place {i}" for i in range(200)]

    def bounded_to(chars: int | None) -> list[dict[str, str]]:
        return build_prompt(
            "alfworld",
            "t",
            history,
            "short obs",
            pool,
            history_length=6,
            template=template,
            max_prompt_chars=chars,
        )

    def size(messages):
        return sum(len(m["content"]) for m in messages)

    full_size = size(bounded_to(None))
    # a bound a little below the full size: only history goes, the whole list stays
    bounded = bounded_to(full_size - 30)
    text = "".join(m["content"] for m in bounded)
    assert size(bounded) <= full_size - 30
    assert "observation number 0" not in text and "observation number 5" in text and "go to place 199" in text
    # a tight bound: no history, a shortened list
    tight = bounded_to(1500)
    text = "".join(m["content"] for m in tight)
    assert size(tight) <= 1500 and "observation number" not in text and "more not shown" in text
    assert "go to place 0" in text and "short obs" in text
    # a huge observation is cut in the middle, keeping head and tail
    huge = "HEAD " + "x" * 50_000 + " TAIL"
    cut = build_prompt("alfworld", "t", [], huge, ["look"], template=template, max_prompt_chars=4000)
    text = "".join(m["content"] for m in cut)
    assert size(cut) <= 4000 and "HEAD" in text and "TAIL" in text and "[...]" in text


def test_length_bound_with_a_token_counter():
    def words(text: str) -> int:
        return len(text.split())

    messages = build_prompt(
        "alfworld",
        "t",
        _history(10),
        "obs " * 3000,
        ["look"],
        history_length=10,
        max_prompt_chars=500,
        measure=words,
    )
    assert sum(words(m["content"]) for m in messages) <= 500


def test_history_accepts_pairs():
    a = build_prompt("webshop", "t", [("page one", "search[x]")], "page two", ["click[a]"])
    b = build_prompt("webshop", "t", _pairs_history(), "page two", ["click[a]"])
    assert a == b


def _pairs_history() -> History:
    history = History("t")
    history.record("page one", "search[x]")
    return history
