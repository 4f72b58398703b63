"""``progpo/Remote-v0`` over several env servers: groups spread by load, a lost server costs its episodes in
flight (not the run), its groups are made again on the others, and every server's share is visible.

The three-server kill test runs real ``progpo serve`` processes hosting WebShop on a generated catalog; the
others use the toy env served in this process (a stopped server refuses connections as a dead one does).
"""

from __future__ import annotations

import os
import random
import signal
import time
from contextlib import closing

import gymnasium as gym
import pytest
import requests

from agents.rollout import play_episodes
from agents.scripted import RandomAgent
from progpo_envs.server.fleet import (
    FleetGroupVectorEnv,
    FleetRemoteEnv,
    NoServerError,
    ServerFleet,
    fleet_for,
    server_urls,
)
from progpo_envs.server.remote import REMOTE_ENV_ID, RemoteEnv, RemoteGroupVectorEnv
from tests.progpo_envs.server.hosting_helpers import TOY_ENV_ID, CliServer, plain, same, serve_toy

#: Fast failure: a refused connection fails a call after ~0.1 s instead of the default ~1.4 s of retries.
FAST = {"retries": 1, "backoff": 0.05, "connect_timeout": 1.0, "timeout": 20.0}
ACTIONS = ["go left", "go right", "take key", "open door", "look"]


@pytest.fixture
def toy_servers():
    """Three toy servers of one worker each, stopped at the end (those a test has not stopped itself)."""
    servers = [serve_toy(num_workers=1) for _ in range(3)]
    yield servers
    for server in servers:
        try:
            server.stop()
        except Exception:  # noqa: BLE001, S110 - stopped by the test already
            pass


def without_server(value):
    """``value`` with every info's ``server`` entry (and its vector mask) left out: the only difference from
    the in-process env."""
    if isinstance(value, dict):
        return {k: without_server(v) for k, v in value.items() if k not in ("server", "_server")}
    if isinstance(value, (list, tuple)):
        return type(value)(without_server(v) for v in value)
    return value


def test_server_urls_read_a_list_or_commas_and_refuse_repeats():
    assert server_urls("http://a:1, http://b:2/ ,") == ("http://a:1", "http://b:2")
    assert server_urls(("http://a:1",)) == ("http://a:1",)
    with pytest.raises(ValueError, match="more than once"):
        server_urls("http://a:1,http://a:1/")
    with pytest.raises(ValueError, match="no env server"):
        server_urls(" , ")


def test_one_url_keeps_the_one_server_classes(toy_servers):
    url = toy_servers[0].url
    env = gym.make(REMOTE_ENV_ID, url=[url], env_id=TOY_ENV_ID)
    envs = gym.make_vec(REMOTE_ENV_ID, num_envs=2, group_size=2, url=f"{url},", env_id=TOY_ENV_ID)
    try:
        assert type(env.unwrapped) is RemoteEnv and type(envs) is RemoteGroupVectorEnv
    finally:
        env.close()
        envs.close()


def test_groups_spread_whole_by_load_and_play_as_in_process(toy_servers):
    urls = [s.url for s in toy_servers]
    local = gym.make_vec(TOY_ENV_ID, num_envs=12, group_size=2)
    remote = gym.make_vec(REMOTE_ENV_ID, num_envs=12, group_size=2, url=",".join(urls), env_id=TOY_ENV_ID)
    try:
        assert isinstance(remote, FleetGroupVectorEnv)
        assert [(s["groups"], s["sessions"], s["state"]) for s in remote.servers()] == [(2, 4, "up")] * 3
        rng = random.Random(0)
        options = {"task_indices": [0, 3, 5, 7, 9, 11]}
        remote_trace, local_trace = (
            [remote.reset(seed=4, options=options)],
            [local.reset(seed=4, options=options)],
        )
        homes = list(remote_trace[0][1]["server"])
        assert (
            homes
            == [urls[0]] * 2 + [urls[1]] * 2 + [urls[2]] * 2 + [urls[0]] * 2 + [urls[1]] * 2 + [urls[2]] * 2
        )
        before = [requests.get(f"{u}/metrics", timeout=10).json()["http"]["requests"] for u in urls]
        for _ in range(6):
            actions = [rng.choice(ACTIONS) for _ in range(12)]
            remote_trace.append(remote.step(actions))
            local_trace.append(local.step(actions))
            assert list(remote_trace[-1][-1]["server"]) == homes
        after = [requests.get(f"{u}/metrics", timeout=10).json()["http"]["requests"] for u in urls]
        assert [b - a for a, b in zip(before, after, strict=True)] == [7, 7, 7]  # a batch a step (+ one read)
        assert plain(without_server(remote_trace)) == plain(local_trace)
    finally:
        remote.close()
        local.close()
    assert [s["sessions"] for s in fleet_for(urls).status()] == [0, 0, 0]  # closed: nothing held


def test_a_single_env_over_several_servers(toy_servers):
    urls = [s.url for s in toy_servers[:2]]
    local = gym.make(TOY_ENV_ID)
    envs = [gym.make(REMOTE_ENV_ID, url=urls, env_id=TOY_ENV_ID, **FAST) for _ in range(3)]
    try:
        assert all(isinstance(env.unwrapped, FleetRemoteEnv) for env in envs)
        assert [env.unwrapped.url for env in envs] == [urls[0], urls[1], urls[0]]  # by load, ties by order
        first = envs[1]
        observation, info = first.reset(seed=3)
        assert info["server"] == urls[1] and same(without_server((observation, info)), local.reset(seed=3))
        assert same(without_server(first.step("take key")), local.step("take key"))
        toy_servers[1].stop()
        *_, truncated, info = first.step("look")
        assert truncated and urls[1] in info["env_error"]  # the episode in flight fails, the env does not
        assert first.step("look")[3]  # and stays ended until its reset
        observation, info = first.reset(seed=3)  # made again on the server left
        assert info["server"] == urls[0] and first.unwrapped.url == urls[0]
        status = first.unwrapped.servers()
        assert (
            status[1]["state"] == "down"
            and status[1]["failed_episodes"] == 1
            and status[1]["lost_groups"] == 1
        )
    finally:
        for env in envs:
            env.close()


def test_a_full_server_takes_no_more_groups(toy_servers):
    full = serve_toy(num_workers=1, max_instances=4)  # 2 per client
    urls = [full.url, toy_servers[0].url]
    try:
        envs = gym.make_vec(REMOTE_ENV_ID, num_envs=8, group_size=2, url=urls, env_id=TOY_ENV_ID)
        try:
            status = envs.servers()
            assert status[0]["state"] == "full" and status[0]["groups"] == 1 and status[1]["groups"] == 3
            envs.reset(seed=0)
        finally:
            envs.close()
    finally:
        full.stop()


def _two_groups_over(urls: list[str]) -> RemoteGroupVectorEnv:
    """Two groups of two copies of the toy env on the servers at ``urls``, failing fast."""
    return gym.make_vec(REMOTE_ENV_ID, num_envs=4, group_size=2, url=urls, env_id=TOY_ENV_ID, **FAST)


def test_an_instance_lost_on_a_live_server_fails_its_episode_and_is_made_again(toy_servers):
    urls = [s.url for s in toy_servers[:2]]
    with closing(_two_groups_over(urls)) as envs:
        envs.reset(seed=0)
        lost = envs.backend.copies[0]
        requests.delete(f"{urls[0]}/instances/{lost.instance_id}", timeout=10)  # expired behind its back
        _, _, _, truncated, info = envs.step(["look"] * 4)
        assert truncated.tolist() == [True, False, False, False] and urls[0] in info["env_error"][0]
        _, info = envs.reset(seed=1)
        assert list(info["server"]) == [urls[0]] * 2 + [urls[1]] * 2  # the server is fine: the group stays
        assert envs.backend.copies[0] is not lost and envs.servers()[0]["lost_groups"] == 1
        assert not envs.step(["look"] * 4)[3].any()


def test_per_group_resets_and_steps_move_a_lost_group(toy_servers):
    """The per-episode rollout's calls (``reset_group``, ``step_some``): a group whose server is lost fails
    its copies' episodes and its next ``reset_group`` plays on the server left, the other group playing on."""
    urls = [s.url for s in toy_servers[:2]]
    with closing(_two_groups_over(urls)) as envs:
        envs.reset_group(0, seed=0)
        _, infos = envs.reset_group(1, seed=1, options={"task_index": 3})
        assert [info["server"] for info in infos] == [urls[1]] * 2
        toy_servers[1].stop()
        *_, truncated, infos = envs.step_some([3, 0], ["look", "look"])
        assert truncated.tolist() == [True, False] and "env_error" in infos[0] and "env_error" not in infos[1]
        assert envs.step_some([2], ["look"])[3].tolist() == [True]  # its group's other copy: failed at once
        _, infos = envs.reset_group(1, seed=1, options={"task_index": 3})
        assert [info["server"] for info in infos] == [urls[0]] * 2 and infos[0]["task_id"] == "toy-3"
        assert not envs.step_some([2, 3, 1], ["look"] * 3)[3].any()
        assert [s["groups"] for s in envs.servers()] == [2, 0]


def test_no_server_left_is_a_clear_error_at_the_next_reset(toy_servers):
    urls = [s.url for s in toy_servers[:2]]
    with closing(_two_groups_over(urls)) as envs:
        envs.reset(seed=0)
        for server in toy_servers[:2]:
            server.stop()
        assert envs.step(["look"] * 4)[3].all()  # every episode failed; the step itself did not raise
        with pytest.raises(NoServerError, match="no env server is available"):
            envs.reset(seed=1)


def test_async_mode_takes_one_server():
    with pytest.raises(ValueError, match="vector_mode='sync'"):
        gym.make_vec(
            REMOTE_ENV_ID,
            num_envs=2,
            url="http://127.0.0.1:9,http://127.0.0.1:10",
            env_id=TOY_ENV_ID,
            vector_mode="async",
        )


def test_a_server_that_comes_back_takes_groups_again():
    fleet = ServerFleet(["http://127.0.0.1:9"], retry_s=0.0)
    fleet.servers[0].state = fleet.servers[0].state.DOWN
    with pytest.raises(NoServerError, match="down"):
        fleet.choose()  # probed at once: still refused
    server = serve_toy(num_workers=1)
    try:
        fleet = ServerFleet([server.url, "http://127.0.0.1:9"], retry_s=0.0)
        fleet.servers[0].state = fleet.servers[0].state.DOWN
        assert fleet.choose() is fleet.servers[0]  # its probe passed
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------------------------
# Three real servers, one killed mid-rollout
# ------------------------------------------------------------------------------------------------------------

WEBSHOP = "progpo/WebShop-v0"
WEBSHOP_KWARGS = '{"num_products": 200, "split": "test"}'


class KillingAgent(RandomAgent):
    """The random agent, which kills a server's process before its ``kill_at``-th decision."""

    def __init__(self, server: CliServer, kill_at: int):
        super().__init__(seed=0)
        self.server, self.kill_at, self.decisions = server, kill_at, 0

    def act(self, observations, infos, active=None):
        self.decisions += 1
        if self.decisions == self.kill_at:
            self.server.process.kill()
            self.server.process.wait(10)
        return super().act(observations, infos, active)


def _play(envs, agent, seed: int) -> tuple[int, int]:
    """One lock-step rollout of every group; (episodes finished, episodes failed by a lost server)."""
    finished = failed = 0
    for step in play_episodes(envs, agent, "webshop", seed=seed, task_indices=list(range(seed, seed + 6))):
        for t in step.transitions:
            if t.done:
                failed += "env_error" in t.next_info
                finished += "env_error" not in t.next_info
    return finished, failed


def test_three_servers_one_killed_mid_rollout_the_rollout_finishes():
    servers = [
        CliServer("--env", WEBSHOP, "--env-kwargs", f"{WEBSHOP}={WEBSHOP_KWARGS}", "--workers", "1")
        for _ in range(3)
    ]
    try:
        urls = [s.url for s in servers]
        envs = gym.make_vec(
            REMOTE_ENV_ID, num_envs=12, group_size=2, url=urls, env_id=WEBSHOP, max_steps=6, **FAST
        )
        try:
            assert [s["groups"] for s in envs.servers()] == [2, 2, 2]
            # the first rollout: server 2 dies after two steps (its 2 groups' 4 episodes in flight fail)
            finished, failed = _play(envs, KillingAgent(servers[2], kill_at=3), seed=0)
            assert (finished, failed) == (8, 4)
            status = envs.servers()
            assert status[2]["state"] == "down" and status[2]["failed_episodes"] == 4
            # the next rollout: its groups are made again on the two left, and every episode finishes
            finished, failed = _play(envs, RandomAgent(seed=1), seed=6)
            assert (finished, failed) == (12, 0)
            status = envs.servers()
            assert [s["groups"] for s in status] == [3, 3, 0] and status[2]["lost_groups"] == 2
            assert [s["sessions"] for s in status] == [6, 6, 0]
        finally:
            envs.close()
    finally:
        for server in servers:
            server.stop()


# ------------------------------------------------------------------------------------------------------------
# A hung server (issue 38, item 2: F5)
# ------------------------------------------------------------------------------------------------------------


def _toy_cli_servers(count: int) -> list[CliServer]:
    return [
        CliServer("--import", "progpo_envs.testing", "--env", TOY_ENV_ID, "--workers", "1")
        for _ in range(count)
    ]


def _metrics(server: CliServer) -> dict:
    return requests.get(f"{server.url}/metrics", timeout=10).json()


def test_a_stopped_server_costs_its_copies_seconds_and_the_others_go_on():
    """SIGSTOP one of three servers mid-episode: before, the vector step joined every server's batch and all
    copies waited the whole ``timeout`` (60 s here); now the stopped server's probe goes unanswered, its
    copies end with ``env_error`` within seconds and the others step on. Continued, it closes the instances
    left there, and the batch it was sent while stopped is the last call they ever got (none sent twice)."""
    servers = _toy_cli_servers(3)
    stopped = servers[2]
    try:
        urls = [s.url for s in servers]
        envs = gym.make_vec(
            REMOTE_ENV_ID, num_envs=12, group_size=2, url=urls, env_id=TOY_ENV_ID, timeout=60.0
        )
        try:
            envs.reset(seed=0)
            fleet = envs.backend.fleet
            envs.step(["look"] * 12)
            steps_before = _metrics(stopped)["steps"]
            os.killpg(stopped.process.pid, signal.SIGSTOP)
            started = time.monotonic()
            _, _, terminated, truncated, info = envs.step(["look"] * 12)
            stall = time.monotonic() - started
            homes = [envs.backend.homes[i // 2].url for i in range(12)]
            on_stopped = [home == stopped.url for home in homes]
            assert stall < 30.0, f"the step waited {stall:.1f} s for the stopped server"
            assert stall >= fleet.hang_after  # found by its probe, not by a guess
            assert truncated.tolist() == on_stopped and not terminated.any()
            assert all("stopped answering" in info["env_error"][i] for i in range(12) if on_stopped[i])
            status = envs.servers()
            assert status[2]["state"] == "down" and status[2]["failed_episodes"] == 4
            started = time.monotonic()
            _, _, _, truncated, _ = envs.step(
                ["look"] * 12
            )  # the others go on; the stopped copies stay ended
            assert time.monotonic() - started < 30.0 and truncated.tolist() == on_stopped
            _, info = envs.reset(seed=1)  # its 2 groups made again on the two left
            assert stopped.url not in set(info["server"]) and not envs.step(["look"] * 12)[3].any()
        finally:
            os.killpg(stopped.process.pid, signal.SIGCONT)
        # continued: its next probe finds it answering, and the 4 instances left there are closed
        deadline = time.monotonic() + 60
        while _metrics(stopped)["live_instances"] and time.monotonic() < deadline:
            fleet.probe(fleet.servers[2])
            time.sleep(0.5)
        after = _metrics(stopped)
        assert after["live_instances"] == 0 and after["closed"] == 4
        assert after["steps"] == steps_before + 4  # the batch sent while stopped ran once, nothing after it
        envs.close()
    finally:
        for server in servers:
            server.stop()
