"""The harness tests' toy envs, a policy that plays them by reading their hints, and the command line that
evaluates the openai agent on them.

The envs are :class:`progpo_envs.testing.ToyALFWorldEnv` and :class:`progpo_envs.testing.ToyWebShopEnv`;
importing this module registers them (``agents-test/ToyALFWorld-v0``, ``agents-test/ToyWebShop-v0``). Each of
their observations says what the expert would do next ("Next you need to: ..."), so :func:`hint_policy`, the
answer of a scripted LLM endpoint, plays them to a win.
"""

from __future__ import annotations

import re

import progpo_envs.testing  # noqa: F401  (registers agents-test/ToyALFWorld-v0 and agents-test/ToyWebShop-v0)

_HINT = re.compile(r"Next you need to: (.+?)\.(?=\s|'|$)")


def hint_policy(messages: list[dict], body: dict) -> str:
    """Answer the toy envs' current "Next you need to: X." hint in the verl-agent format."""
    text = messages[-1]["content"]
    text = text[: text.rfind("admissible actions")]
    hints = _HINT.findall(text)
    action = hints[-1] if hints else "look"
    return f"<think>The observation says what to do next.</think>\n<action>{action}</action>"


def openai_eval_argv(base_url: str, out, *flags: str) -> list[str]:
    """``progpo eval``'s command line for the openai agent on the toy ALFWorld against the scripted endpoint
    at ``base_url`` (``--model scripted``), written to ``out`` without a progress bar; ``flags``: the rest."""
    agent = ["--agent", "openai", "--model", "scripted", "--base-url", base_url]
    return ["--env", "agents-test/ToyALFWorld-v0", *agent, "--out", str(out), "--no-progress", *flags]
