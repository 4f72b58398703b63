"""The trainers' env classes (agents.trl for TRL, agents.skyrl for SkyRL, the progpo_verifiers package for
verifiers): a group's rollouts share one start, nothing a policy is shown depends on the expert (issue 41).

* The expert never reaches the policy: each client, played on a server that has the expert on (the operator's
  ``expert: true``, which ``progpo eval --agent expert`` needs), shows the policy exactly what it shows from
  an env without the expert, turn for turn, and the views it keeps hold no ``expert_action``; the expert is
  read apart (``agents.trl.expert_command``).
* A group shares its start: every instance reset with the same row starts from the same first observation,
  a different row from another.
* verifiers' package carries its own copy of our prompt style and answer rule (it installs without the
  suite): the same turns and the same commands as ``agents.prompts`` and ``agents.projection``.

agents.skyrl's classes are made through ``skyrl_gym.make`` where skyrl-gym is installed (``.venv-skyrl``,
which ``.ci/run_integrations`` runs this module with), and directly otherwise; their registration with
``skyrl_gym`` is tested there only.
"""

from __future__ import annotations

import importlib.util
import sys

import gymnasium as gym
import pytest

import agents.skyrl
from agents.projection import project_action_with_reason
from agents.prompts import admissible_actions_from_info, build_prompt, task_text_from_observation
from agents.trl import ALFWorldToolEnv, WebShopToolEnv, expert_command, task_rows
from tests.agents.trainer_servers import ALFWORLD, ENV_KWARGS, SPLIT, WEBSHOP, servers_on_first_use
from tests.paths import REPO_ROOT

KEY = "expert_action"


@pytest.fixture(scope="module")
def expert_servers():
    """Per env and protocol, a server with the expert on (one env worker), started on first use."""
    with servers_on_first_use(lambda env_id: {**ENV_KWARGS[env_id], "expert": True}) as url:
        yield url


def _expert_plan(env_id: str, task_index: int) -> list[str]:
    env = gym.make(env_id, **ENV_KWARGS[env_id], split=SPLIT[env_id], expert=True)
    _, info = env.reset(seed=0, options={"task_index": task_index})
    plan, done = [], False
    while not done:
        plan.append(info[KEY])
        _, _, terminated, truncated, info = env.step(plan[-1])
        done = terminated or truncated
    env.close()
    return plan


# --- TRL ---------------------------------------------------------------------------------------------------
TOOL_ENVS = {ALFWORLD: ALFWorldToolEnv, WEBSHOP: WebShopToolEnv}


def _tool_calls(env, env_id: str, plan: list[str]) -> list[str]:
    """The texts TRL hands the model: the first observation, then each tool's answer."""
    texts = [env.reset(task_index=1, split=SPLIT[env_id], seed=0)]
    assert KEY not in env.last_view
    for command in plan:
        if env_id == ALFWORLD:
            texts.append(env.act(command))
        elif command.startswith("search["):
            texts.append(env.search(command[len("search[") : -1]))
        else:
            texts.append(env.click(command[len("click[") : -1]))
        assert KEY not in env.last_view
    return texts


@pytest.mark.parametrize("protocol", ["openenv", "native"])
@pytest.mark.parametrize("env_id", [ALFWORLD, WEBSHOP])
def test_trl_tool_envs_show_the_model_nothing_of_the_servers_expert(expert_servers, env_id, protocol):
    plan = _expert_plan(env_id, 1)
    plain = TOOL_ENVS[env_id](split=SPLIT[env_id], **ENV_KWARGS[env_id])  # in process, no expert
    served = TOOL_ENVS[env_id](
        server=expert_servers(env_id, protocol), protocol=protocol, split=SPLIT[env_id]
    )
    assert _tool_calls(served, env_id, plan) == _tool_calls(plain, env_id, plan)
    assert served.get_reward() == plain.get_reward() > 0


@pytest.mark.parametrize("protocol", ["openenv", "native", "in-process"])
def test_trl_expert_command_reads_the_expert_apart(expert_servers, protocol):
    if protocol == "in-process":
        env = ALFWorldToolEnv(expert=True)
    else:
        kwargs = {"expert": True} if protocol == "native" else {}  # the native door: the client asks for it
        env = ALFWorldToolEnv(server=expert_servers(ALFWORLD, protocol), protocol=protocol, **kwargs)
    env.reset(task_index=2, split="train")
    while not env.done:
        assert KEY not in env.last_view
        env.act(expert_command(env))
    assert env.last_view["won"]
    with pytest.raises(RuntimeError, match="no expert"):
        plain = ALFWorldToolEnv()
        plain.reset(task_index=2, split="train")
        expert_command(plain)


def test_trl_a_group_shares_its_start(expert_servers):
    """TRL's own ``group_id`` is not there yet; here the row alone decides the start, so the G instances
    GRPOTrainer makes for one row start alike, on any backend."""
    url = expert_servers(ALFWORLD, "openenv")
    rows = list(task_rows(ALFWorldToolEnv(), "train", limit=3))
    for row in rows:
        group = [ALFWorldToolEnv(server=url) for _ in range(3)] + [ALFWorldToolEnv()]
        firsts = {env.reset(**row) for env in group}
        assert len(firsts) == 1
    assert len({ALFWorldToolEnv().reset(**row) for row in rows[1:]}) == 2  # another row, another start


# --- SkyRL -------------------------------------------------------------------------------------------------
def test_skyrl_gym_makes_our_registered_env_classes():
    reason = "skyrl-gym is in .venv-skyrl (scripts/setup_integrations.sh)"
    skyrl_gym = pytest.importorskip("skyrl_gym", reason=reason)
    from skyrl_gym.envs.base_text_env import BaseTextEnv

    for env_class, cls in agents.skyrl.ENV_CLASSES.items():
        assert skyrl_gym.registry[env_class].entry_point == f"agents.skyrl:{cls}"
    assert isinstance(agents.skyrl.make("progpo_alfworld", extras={"task_index": 0}), BaseTextEnv)


def _skyrl_chat(env_class: str, env_config: dict, plan: list[str], task_index: int = 1) -> list[dict]:
    env_id = ALFWORLD if env_class == "progpo_alfworld" else WEBSHOP
    extras = {"task_index": task_index, "seed": 0, "split": SPLIT[env_id], "max_turns": 100}
    env = agents.skyrl.make(env_class, env_config, extras)
    chat, _ = env.init([{"role": "system", "content": "Play the task."}])
    for command in plan:
        out = env.step(f"<think>the plan</think><action>{command}</action>")
        chat += [{"role": "assistant", "content": command}, *out["observations"]]
    assert out["done"] and env.get_metrics()["success"] == 1.0 and env.get_metrics()["invalid_actions"] == 0
    env.close()
    return chat


@pytest.mark.parametrize("protocol", ["openenv", "native"])
@pytest.mark.parametrize("env_id", [ALFWORLD, WEBSHOP])
def test_skyrl_envs_show_the_model_nothing_of_the_servers_expert(expert_servers, env_id, protocol):
    env_class = "progpo_alfworld" if env_id == ALFWORLD else "progpo_webshop"
    plan = _expert_plan(env_id, 1)
    local = _skyrl_chat(env_class, {"env_kwargs": ENV_KWARGS[env_id]}, plan)
    served = _skyrl_chat(env_class, {"server": expert_servers(env_id, protocol), "protocol": protocol}, plan)
    assert served == local
    assert "Your admissible actions of the current situation are" in local[1]["content"]


def test_skyrl_a_group_shares_its_start_and_shows_every_admissible_command():
    starts = {}
    for task_index in (21, 2):
        group = [
            agents.skyrl.make("progpo_alfworld", extras={"task_index": task_index, "seed": 5})
            for _ in range(3)
        ]
        firsts = {env.init([])[0][-1]["content"] for env in group}
        assert len(firsts) == 1
        starts[task_index] = firsts.pop()
    assert starts[21] != starts[2]
    # task 21's first admissible list (53 commands) is longer than the 20 items SkyRL's OpenEnv example keeps
    env = gym.make(ALFWORLD, split="train")
    _, info = env.reset(seed=5, options={"task_index": 21})
    admissible = admissible_actions_from_info("alfworld", info)
    assert len(admissible) > 20 and all(f"'{a}'" in starts[21] for a in admissible)
    with pytest.raises(ValueError, match="task_index"):
        agents.skyrl.make("progpo_alfworld", extras={"seed": 5})


def test_skyrl_an_answer_without_an_action_is_an_invalid_action():
    env = agents.skyrl.make("progpo_alfworld", extras={"task_index": 0, "seed": 0, "max_turns": 3})
    env.init([])
    out = env.step("I would rather not say.")
    assert not out["done"] and out["reward"] == 0.0 and not out["metadata"]["valid"]
    assert out["metadata"]["invalid_reason"] == "missing_action_tag"
    assert "Nothing happens" in out["observations"][0]["content"]
    env.step("")
    out = env.step("<action>look</action>")  # the third turn: max_turns ends it
    assert out["done"] and env.get_metrics()["invalid_actions"] == 3  # no <think>: invalid, still played


# --- verifiers' package: its own copy of our prompt style --------------------------------------------------
def _verifiers_prompts():
    """``progpo_verifiers.prompts``, imported by path: it needs nothing but the standard library."""
    path = REPO_ROOT / "integrations" / "verifiers" / "progpo_verifiers" / "prompts.py"
    spec = importlib.util.spec_from_file_location("progpo_verifiers_prompts", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("env_id", [ALFWORLD, WEBSHOP])
def test_the_verifiers_package_renders_our_prompt_style_and_reads_answers_as_we_do(env_id):
    prompts = _verifiers_prompts()
    kind = "alfworld" if env_id == ALFWORLD else "webshop"
    env = gym.make(env_id, **ENV_KWARGS[env_id], split=SPLIT[env_id], expert=True)
    text, info = env.reset(seed=0, options={"task_index": 1})
    task = task_text_from_observation(kind, text, info)
    assert prompts.task_text(kind, text) == task
    done = False
    while not done:
        observation = {"text": text, **{k: v for k, v in info.items() if k != KEY}}
        admissible = admissible_actions_from_info(kind, info)
        ours = build_prompt(kind, task, [], text, admissible, history_length=0, max_prompt_chars=None)
        assert prompts.turn(kind, task, observation) == ours[-1]["content"]
        # an observation that carried the expert (an older server) would show the policy nothing more
        assert prompts.turn(kind, task, {**observation, KEY: info[KEY]}) == ours[-1]["content"]
        for answer in (
            f"<think>plan</think><action>{info[KEY].upper()}</action>",
            f"<action> {info[KEY]} </action>",
            "no tags at all, just words",
            "<action>a</action><action>b</action>",
            "",
        ):
            expected = project_action_with_reason(answer, admissible, require_think=False)
            assert prompts.parse_answer(answer, admissible) == (expected.action, expected.valid)
        text, _, terminated, truncated, info = env.step(info[KEY])
        done = terminated or truncated
    env.close()
