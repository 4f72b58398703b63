"""The env server's worker, in this process: every message gets a typed reply with the status it is
answered with, a retried ``seq`` is replayed without stepping twice, and a message it does not know is a
clear error."""

from __future__ import annotations

import multiprocessing
import signal
from pathlib import Path

import gymnasium as gym
import pytest

from progpo_envs.core.errors import EnvDataError
from progpo_envs.core.worker_protocol import Reply, Shutdown
from progpo_envs.server.codec import decode
from progpo_envs.server.pool_worker import Batch, EnvWorker, InstanceCall, Op, worker_main
from progpo_envs.testing import CounterEnv


class _Faulty(CounterEnv):
    """A counter whose step fails as its action says."""

    def step(self, action):
        if action == "reset-needed":
            raise gym.error.ResetNeeded("the episode is over; call reset")
        if action == "damaged":
            raise EnvDataError("games/0.json is not JSON")
        if action == "bad-input":
            raise IndexError("task_index 99 out of range")
        if action == "crash":
            raise RuntimeError("engine crashed")
        return super().step(action)


def _worker() -> EnvWorker:
    worker = EnvWorker({"toy": CounterEnv, "faulty": _Faulty})
    for instance_id, env_id in (("a", "toy"), ("f", "faulty")):
        reply = worker.handle(
            InstanceCall(Op.CREATE, {"instance_id": instance_id, "env_id": env_id, "kwargs": {}})
        )
        assert reply.ok and reply.value["max_steps"] == 8
    return worker


def _call(worker: EnvWorker, op: Op, **args) -> Reply:
    return worker.handle(InstanceCall(op, {"instance_id": "a", **args}))


def test_reset_step_and_get_answer_what_the_env_does():
    worker, twin = _worker(), CounterEnv()
    reset = _call(worker, Op.RESET, seed=4, options=None, seq=1)
    assert reset.ok and reset.value["observation"] == twin.reset(seed=4)[0]
    step = _call(worker, Op.STEP, action="inc", seq=2)
    observation, reward, terminated, truncated, info = twin.step("inc")
    assert step.value["observation"] == observation and step.value["terminated"] == terminated
    assert decode(step.value["info"]) == info
    assert _call(worker, Op.GET).value == {"observation": observation, "info": step.value["info"]}


def test_a_retried_seq_is_replayed_and_a_different_call_with_it_is_refused():
    worker = _worker()
    _call(worker, Op.RESET, seed=0, options=None, seq=1)
    first = _call(worker, Op.STEP, action="inc", seq=2)
    assert _call(worker, Op.STEP, action="inc", seq=2) is first  # the same reply, not a second step
    assert worker.instances["a"].env.unwrapped.engine_steps == 1
    other = _call(worker, Op.STEP, action="dec", seq=2)
    assert other == Reply.failure("seq 2 was already used by a different call; the next is 3", status=409)
    skipped = _call(worker, Op.STEP, action="inc", seq=9)
    assert skipped == Reply.failure("out-of-order call: seq 9, expected 3", status=409)


def test_errors_are_replies_with_their_status():
    worker = _worker()
    assert _call(worker, Op.STEP, action="inc").status == 409  # before any reset
    assert worker.handle(InstanceCall(Op.GET, {"instance_id": "nope"})).status == 404
    worker.handle(InstanceCall(Op.RESET, {"instance_id": "f", "seed": 0, "options": None}))
    statuses = {
        action: worker.handle(InstanceCall(Op.STEP, {"instance_id": "f", "action": action}))
        for action in ("reset-needed", "damaged", "bad-input", "crash")
    }
    assert {action: reply.status for action, reply in statuses.items()} == {
        "reset-needed": 409,
        "damaged": 500,
        "bad-input": 400,
        "crash": 500,
    }
    assert statuses["bad-input"].error == "IndexError: task_index 99 out of range"
    assert statuses["crash"].error == "the env raised RuntimeError: engine crashed"
    assert _call(worker, Op.CLOSE).ok and _call(worker, Op.CLOSE).status == 404


def test_a_batch_runs_a_prefix_within_its_budget():
    worker = _worker()
    _call(worker, Op.RESET, seed=0, options=None)
    calls = [InstanceCall(Op.STEP, {"instance_id": "a", "action": "inc"})] * 3
    everything = worker.handle(Batch(calls, budget=60.0))
    assert everything.ok and [reply.ok for reply in everything.value] == [True, True, True]
    assert len(worker.handle(Batch(calls, budget=0.0)).value) == 1  # one call at least, then the budget ends


@pytest.mark.parametrize("message", [("step", {"instance_id": "a"}), "count", None])
def test_a_message_the_worker_does_not_know_is_a_clear_error(message):
    reply = _worker().handle(message)
    assert reply == Reply.failure(f"unknown worker message {message!r}", status=500)


class WarmedCounter(CounterEnv):
    """A counter whose ``warm_up`` (what a worker calls once before it serves) writes ``marker``."""

    def __init__(self, marker: str, **kwargs):
        super().__init__(**kwargs)
        self.marker = Path(marker)

    def warm_up(self) -> None:
        self.marker.write_text("warmed")


def test_a_worker_warms_up_each_env_that_can_before_it_serves(tmp_path):
    marker = tmp_path / "warmed"
    parent, child = multiprocessing.Pipe()
    parent.send(Shutdown())  # the worker answers its start, then finds the shutdown waiting
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker_main(
            child,
            {"warm": f"{__name__}:WarmedCounter", "toy": "progpo_envs.testing:CounterEnv"},
            {"warm": {"marker": str(marker)}, "toy": {}},
        )
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert parent.recv().ok
    assert marker.read_text() == "warmed"
