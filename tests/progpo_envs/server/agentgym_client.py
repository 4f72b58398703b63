"""A client that uses an env server exactly as AgentGym's own code does (its protocol and its scoring rule).

PyPI's ``agentenv`` is an empty placeholder and CI reaches no code host, so this restates, in our own code,
what AgentGym's ``agentenv`` package does against an env server (read from WooooDyy/AgentGym:
``agentenv/envs/alfworld.py`` ``AlfWorldEnvClient``, ``agentenv/envs/webshop.py`` ``WebshopEnvClient``,
``agentenv/controller`` ``BaseTask`` and ``Evaluator``):

* ALFWorld: ``POST /create`` → ``{"id"}``; every POST carries ``id``; ``reset(game)`` posts
  ``{game, world_type: "Text"}`` and keeps ``observation``/``available_actions``; the agent's state is
  ``"<observation>\\nAVAILABLE ACTIONS: <a>,<b>,..."``; ``step`` posts ``{action}`` and reads ``observation``,
  ``reward``, ``done``.
* WebShop: ``POST /create`` → an int; every POST carries ``env_idx``; ``reset(idx)`` posts ``{session_id:
  idx}`` then reads ``GET /observation?env_idx=``; ``step`` reads ``state``, ``reward``, ``done``.
* Any answer but 200 fails the client (AgentGym asserts on the status).
* Unlike AgentGym's client (``requests`` with a per-read timeout), every request here has a wall-clock
  deadline (:class:`~progpo_envs.core.http_client.DeadlineSession`), so a stuck server fails a test instead of
  hanging it.
* An episode (``BaseTask``): reset, then step until ``done`` or ``max_rounds``; its reward is the last
  step's reward. The ``Evaluator``'s score is the mean reward and its success rate the share of episodes whose
  reward is 1 or 100 (:func:`is_success`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from progpo_envs.core.http_client import DeadlineSession


def is_success(reward: float) -> bool:
    """AgentGym's ``Evaluator`` rule: an episode succeeded when its final reward is 1 or 100."""
    return reward == 1 or reward == 100


class AlfWorldClient:
    """AgentGym's ``AlfWorldEnvClient`` protocol against ``base_url``."""

    def __init__(self, base_url: str, timeout: float = 300.0):
        self.base_url, self.http = base_url.rstrip("/"), DeadlineSession(timeout)
        created = self.http.post(f"{self.base_url}/create")
        assert created.status_code == 200, created.text
        self.env_id = created.json()["id"]
        self.info: dict[str, Any] = {}

    def _post(self, path: str, data: dict[str, Any]) -> Any:
        response = self.http.post(f"{self.base_url}/{path}", json={**data, "id": self.env_id})
        assert response.status_code == 200, response.text
        return response.json()

    def observe(self) -> str:
        return f"{self.info['observation']}\nAVAILABLE ACTIONS: {','.join(self.info['available_actions'])}"

    def reset(self, game: int) -> dict[str, Any]:
        answer = self._post("reset", {"game": game, "world_type": "Text"})
        self.info = {"observation": answer["observation"], "available_actions": answer["available_actions"]}
        return answer

    def step(self, action: str) -> tuple[str, float, bool]:
        answer = self._post("step", {"action": action})
        self.info = {"observation": answer["observation"], "available_actions": answer["available_actions"]}
        return answer["observation"], answer["reward"], answer["done"]

    def close(self) -> None:
        self._post("close", {})
        self.http.close()


class WebShopClient:
    """AgentGym's ``WebshopEnvClient`` protocol against ``base_url``."""

    def __init__(self, base_url: str, timeout: float = 300.0):
        self.base_url, self.http = base_url.rstrip("/"), DeadlineSession(timeout)
        created = self.http.post(f"{self.base_url}/create")
        assert created.status_code == 200, created.text
        self.env_idx = created.json()

    def _post(self, path: str, data: dict[str, Any]) -> Any:
        body = {**data, "env_idx": self.env_idx}
        response = self.http.post(f"{self.base_url}/{path}", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    def _get(self, path: str) -> Any:
        response = self.http.get(f"{self.base_url}/{path}", params={"env_idx": self.env_idx})
        assert response.status_code == 200, response.text
        return response.json()

    def observe(self) -> str:
        return self._get("observation")

    def reset(self, session_id: int) -> list[Any]:
        answer = self._post("reset", {"session_id": session_id})
        answer[0] = self.observe()
        return answer

    def step(self, action: str) -> tuple[str, float, bool]:
        answer = self._post("step", {"action": action})
        return answer["state"], answer["reward"], answer["done"]

    def close(self) -> None:
        self._post("close", {})
        self.http.close()


def play(client: AlfWorldClient | WebShopClient, task: int, actions: Sequence[str], max_rounds: int) -> float:
    """One ``BaseTask`` episode with scripted actions: the final reward (0.0 if it never stepped)."""
    client.reset(task)
    reward, done, rounds = 0.0, False, 0
    for action in actions:
        if done or rounds >= max_rounds:
            break
        _, reward, done = client.step(action)
        rounds += 1
    return reward
