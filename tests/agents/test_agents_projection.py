"""Projection: model text -> (action, valid), the verl-agent rules and our stricter ones."""

import pytest

from agents.projection import (
    InvalidReason,
    has_other_script,
    match_admissible,
    project_action,
    project_action_with_reason,
    project_actions,
)

POOL = ["go to desk 1", "take mug 1 from desk 1", "look"]


def test_well_formed_output_is_valid_and_uses_the_admissible_spelling():
    text = "<think>The mug is on the desk.</think>\n<action>  Take   MUG 1 from desk 1 </action>"
    result = project_action_with_reason(text, POOL)
    assert result == ("take mug 1 from desk 1", True, InvalidReason.NONE, True)


def test_valid_format_but_inadmissible_action_stays_valid_and_is_flagged():
    result = project_action_with_reason("<think>x</think><action>fly to the moon</action>", POOL)
    assert (result.action, result.valid, result.admissible) == ("fly to the moon", True, False)


@pytest.mark.parametrize(
    ("text", "reason", "action"),
    [
        ("I will go to desk 1", InvalidReason.MISSING_ACTION_TAG, "I will go to desk 1"),
        (
            "<think>hm</think><action>go to desk 1",
            InvalidReason.MISSING_ACTION_TAG,
            "hm</think><action>go to desk 1",
        ),
        ("<action>go to desk 1</action>", InvalidReason.MISSING_THINK, "go to desk 1"),
        (
            "<think>a</think><action>look</action><action>go to desk 1</action>",
            InvalidReason.MULTIPLE_ACTIONS,
            "look",
        ),
        ("<think>a</think><action>  </action>", InvalidReason.EMPTY_ACTION, ""),
        (
            "<think>我应该去桌子</think><action>go to desk 1</action>",
            InvalidReason.OTHER_SCRIPT,
            "go to desk 1",
        ),
        ("<think>ok</think><action>взять кружку</action>", InvalidReason.OTHER_SCRIPT, "взять кружку"),
    ],
)
def test_invalid_outputs(text, reason, action):
    result = project_action_with_reason(text, POOL)
    assert not result.valid
    assert result.reason is reason
    assert result.action == action


def test_untagged_output_plays_its_tail():
    text = "x" * 100 + " go to desk 1"
    action, valid = project_action(text, POOL, fallback_chars=12)
    assert (action, valid) == ("go to desk 1", False)


def test_accents_are_latin_but_kana_and_hangul_are_not():
    assert not has_other_script("café, naïve, Ångström — 30.00 $ ≤ ✓")
    assert has_other_script("カップ")
    assert has_other_script("컵")


def test_think_can_be_optional():
    assert project_action("<action>look</action>", POOL, require_think=False) == ("look", True)


def test_non_string_output_is_invalid_not_an_error():
    assert project_action(None, POOL) == ("", False)  # type: ignore[arg-type]


def test_webshop_search_pattern_matches_any_query():
    pool = ["search[<your query>]", "click[buy now]"]
    assert match_admissible("search[red cotton shirt]", pool) == "search[red cotton shirt]"
    assert match_admissible("search[]", pool) is None
    assert match_admissible("Click[Buy Now]", pool) == "click[buy now]"
    assert project_action("<think>a</think><action>search[blue socks]</action>", pool) == (
        "search[blue socks]",
        True,
    )


def test_batched_projection_checks_lengths():
    actions, valids = project_actions(["<think>a</think><action>look</action>", "nope"], [POOL, None])
    assert actions == ["look", "nope"] and valids == [True, False]
    with pytest.raises(ValueError):
        project_actions(["a", "b"], [POOL])
