"""The per-episode rollout loop: each copy at its own pace, the same episodes as the lock-step loop, groups
admitted whole into free group slots."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import gymnasium as gym

from agents.base import AgentAction
from agents.per_episode import GroupStart, ListFeed, play_per_episode
from agents.rollout import play_episodes
from progpo_envs.testing import DRAWER_ENV_ID


class SlowAgent:
    """Decides from the observation alone (so a copy's episode depends on nothing else), after a random
    delay on a thread pool: decisions arrive out of order. Tracks how many groups play at once."""

    def __init__(self, max_delay_s: float = 0.02):
        self.pool = ThreadPoolExecutor(max_workers=8)
        self.rng = random.Random(0)
        self.max_delay_s = max_delay_s
        self.lock = threading.Lock()
        self.started: list[tuple[int, object]] = []

    @staticmethod
    def choose(observation: str, info: dict) -> str:
        actions = info.get("admissible_actions") or ["look"]
        return actions[sum(map(ord, observation)) % len(actions)]

    def start(self, slot, task, group) -> None:
        with self.lock:
            self.started.append((slot, group.key))

    def decide(self, slot, observation, info) -> Future:
        delay = self.rng.uniform(0, self.max_delay_s)
        return self.pool.submit(lambda: (time.sleep(delay), AgentAction(self.choose(observation, info)))[1])

    # the lock-step protocol, for the reference run
    def reset(self, tasks) -> None:
        pass

    def act(self, observations, infos, active=None):
        return [
            AgentAction(self.choose(o, i)) if active is None or active[k] else None
            for k, (o, i) in enumerate(zip(observations, infos, strict=True))
        ]

    def close(self) -> None:
        self.pool.shutdown()


def _episodes(transitions):
    """``(group key, copy) -> [(observation, action, reward, done)]``."""
    out: dict = {}
    for key, copy, t in transitions:
        out.setdefault((key, copy), []).append((t.observation, t.decision.action, t.reward, t.done))
    return out


def test_per_episode_plays_the_lockstep_episodes_in_fewer_group_slots():
    groups = [GroupStart(key=f"g{k}", seed=10 + k, task_index=k % 8) for k in range(6)]
    agent = SlowAgent()
    lockstep = []
    reference = gym.make_vec(DRAWER_ENV_ID, num_envs=12, group_size=2, max_steps=6, expert=True)
    try:
        for step in play_episodes(
            reference,
            agent,
            "alfworld",
            seed=[g.seed for g in groups],
            task_indices=[g.task_index for g in groups],
        ):
            lockstep += [(groups[t.slot // 2].key, t.slot % 2, t) for t in step.transitions]
    finally:
        reference.close()
    envs = gym.make_vec(DRAWER_ENV_ID, num_envs=4, group_size=2, max_steps=6, expert=True)  # 2 group slots
    try:
        steps = list(play_per_episode(envs, agent, "alfworld", ListFeed(groups), poll_s=0.01))
    finally:
        envs.close()
        agent.close()
    assert _episodes((s.group.key, s.copy, s.transition) for s in steps) == _episodes(lockstep)
    # groups were admitted whole, two slots at a time, and a slot took a new group only once free
    assert [key for _, key in agent.started] == [g.key for g in groups for _ in range(2)]
    assert {slot for slot, _ in agent.started} == {0, 1, 2, 3}
    done = [s.group.key for s in steps if s.group_done]
    assert sorted(done) == sorted(g.key for g in groups)
    in_flight, most = set(), 0
    for s in steps:
        in_flight.add(s.group.key)
        most = max(most, len(in_flight))
        if s.group_done:
            in_flight.discard(s.group.key)
    assert most <= 2


def test_an_agent_error_ends_the_loop():
    class Failing(SlowAgent):
        def decide(self, slot, observation, info) -> Future:
            future: Future = Future()
            future.set_exception(RuntimeError("the engine died"))
            return future

    envs = gym.make_vec(DRAWER_ENV_ID, num_envs=2, group_size=2, max_steps=3, expert=True)
    agent = Failing()
    try:
        feed = ListFeed([GroupStart(key="g", seed=0, task_index=0)])
        try:
            list(play_per_episode(envs, agent, "alfworld", feed))
        except RuntimeError as error:
            assert "the engine died" in str(error)
        else:
            raise AssertionError("the loop did not raise")
    finally:
        envs.close()
        agent.close()
