"""The scripted expert endpoint (``agents.expert_stand_in``) and the SkyRL generator's loop
(``agents.skyrl_rollouts``) together, in process: the loop's rollouts through the stand-in play the expert's
episodes and win; a conversation of none of the run's episodes, or a body without messages, is a 400 with a
message; a streamed answer is the same answer."""

from __future__ import annotations

import pytest
import requests
from openai import OpenAI

import agents.skyrl
from agents.expert_stand_in import MODEL_NAME, EpisodeSpec, ExpertStandIn, StandInServer
from agents.skyrl_rollouts import play_rows

TASKS = (0, 2)  # tasks 0 and 1 of the generated train split start alike: the stand-in would refuse them


@pytest.fixture(scope="module")
def stand_in_url():
    stand_in = ExpertStandIn("progpo/ALFWorld-v0", [EpisodeSpec(t, t, "train") for t in TASKS])
    with StandInServer(stand_in) as server:
        yield server.url
    stand_in.close()


def test_the_generators_loop_through_the_stand_in_wins_every_episode(stand_in_url):
    rows = list(agents.skyrl.task_rows("progpo_alfworld", TASKS))  # task t reset with seed t
    records = play_rows(rows, {}, f"{stand_in_url}/v1", MODEL_NAME)  # the envs in this process
    assert [(r["task_index"], r["success"], r["invalid_actions"]) for r in records] == [
        (0, 1.0, 0),
        (2, 1.0, 0),
    ]
    replies = [m["content"] for m in records[0]["chat"] if m["role"] == "assistant"]
    assert len(replies) == records[0]["steps"] and replies[-1].startswith("<think>")


def test_a_conversation_of_no_episode_and_a_body_without_messages_are_refused(stand_in_url):
    url = f"{stand_in_url}/v1/chat/completions"
    unknown = requests.post(url, json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]})
    assert (
        unknown.status_code == 400
        and "matches 0 of the run's 2 episodes" in unknown.json()["error"]["message"]
    )
    malformed = requests.post(url, json={"model": MODEL_NAME})
    assert malformed.status_code == 400 and "messages" in malformed.json()["error"]["message"]


def test_a_streamed_answer_is_the_answer(stand_in_url):
    chat = agents.skyrl.make("progpo_alfworld", {}, {"task_index": 2, "seed": 2}).init([])[0]
    client = OpenAI(base_url=f"{stand_in_url}/v1", api_key="EMPTY")
    whole = client.chat.completions.create(model=MODEL_NAME, messages=chat).choices[0].message.content
    parts = client.chat.completions.create(model=MODEL_NAME, messages=chat, stream=True)
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == whole
    assert whole.startswith("<think>") and "<action>" in whole
