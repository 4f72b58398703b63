"""The worker protocol: commands run on an env, replies survive the pipe, the loop stops when told, and a
message that is no command is a clear error, in-process and in a vector env's worker subprocess."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading

import numpy as np
import pytest

from progpo_envs.core.vector import GroupVectorEnv
from progpo_envs.core.worker_protocol import (
    Call,
    Reply,
    Reset,
    Shutdown,
    Step,
    UnknownCommandError,
    VectorBackend,
    apply_command,
    serve_requests,
)
from progpo_envs.testing import CounterEnv

TOY = "progpo_envs.testing:CounterEnv"


@pytest.mark.parametrize(
    "reply",
    [
        Reply.success(),
        Reply.success(
            {"observation": "You see 0.", "info": {"history_key": np.uint64(2**63 + 5), 3: (1, 2)}}
        ),
        Reply.failure("unknown instance (closed, expired or never created)", status=404),
        Reply.failure("Traceback (most recent call last):\n  ...\nValueError: boom"),
    ],
)
def test_a_reply_round_trips_through_a_pipe(reply):
    assert pickle.loads(pickle.dumps(reply)) == reply
    parent, child = mp.get_context("spawn").Pipe()
    child.send(reply)
    received = parent.recv()
    assert received == reply and type(received.value) is type(reply.value)
    if reply.value is not None:
        assert type(received.value["info"]["history_key"]) is np.uint64
    parent.close(), child.close()


def test_success_and_failure_fill_the_fields_of_their_kind():
    assert Reply.success(3) == Reply(ok=True, value=3, status=None, error=None)
    assert Reply.failure("gone", status=410) == Reply(ok=False, value=None, status=410, error="gone")
    assert not Reply.failure("boom").ok and Reply.failure("boom").status is None


def test_commands_run_on_an_env_like_the_env_itself():
    env, twin = CounterEnv(), CounterEnv()
    assert apply_command(env, Reset(seed=3, options={"task_index": 1})) == twin.reset(
        seed=3, options={"task_index": 1}
    )
    for action in ("inc", "nonsense", "inc"):
        assert apply_command(env, Step(action)) == twin.step(action)
    assert apply_command(env, Call("max_steps")) == 8  # an attribute is read
    assert apply_command(env, Call("render")) == twin.render()  # a method is called


@pytest.mark.parametrize("command", ["reset", ("step", ("look",)), Shutdown(), None])
def test_a_message_that_is_no_command_is_a_clear_error(command):
    with pytest.raises(UnknownCommandError, match=r"unknown command .*; a worker runs Reset, Step or Call"):
        apply_command(CounterEnv(), command)


def test_serve_requests_answers_until_shutdown_and_stops_when_the_pipe_closes():
    parent, child = mp.Pipe()
    outcome: list[bool] = []
    loop = threading.Thread(
        target=lambda: outcome.append(serve_requests(child, lambda m: Reply.success(m * 2)))
    )
    loop.start()
    parent.send(21)
    assert parent.recv() == Reply.success(42)
    parent.send(Shutdown())
    loop.join(5)
    assert outcome == [True] and not parent.poll(0.1)  # a Shutdown is not answered by the loop

    parent, child = mp.Pipe()
    outcome.clear()
    loop = threading.Thread(target=lambda: outcome.append(serve_requests(child, lambda m: Reply.success(m))))
    loop.start()
    parent.close()
    loop.join(5)
    assert outcome == [False]


@pytest.mark.parametrize("vector_mode", ["sync", "async"])
def test_both_backends_of_the_vector_env_run_commands_like_the_copies_would(vector_mode):
    envs = GroupVectorEnv(TOY, num_envs=4, group_size=2, vector_mode=vector_mode, num_workers=2)
    twins = [CounterEnv() for _ in range(4)]
    try:
        assert isinstance(envs.backend, VectorBackend)
        seeds = [5, 5, 6, 6]
        expected = [twin.reset(seed=seed) for twin, seed in zip(twins, seeds, strict=True)]
        assert envs.backend.reset(seeds, [None] * 4) == expected
        # some copies, in the order asked (across both shards under async)
        assert envs.backend.step(["inc", "x"], copies=[3, 0]) == [twins[3].step("inc"), twins[0].step("x")]
        assert envs.backend.call("max_steps") == [8, 8, 8, 8]
    finally:
        envs.close()


def test_an_async_worker_answers_a_bad_message_clearly_and_keeps_serving():
    envs = GroupVectorEnv(TOY, num_envs=2, vector_mode="async", num_workers=2)
    try:
        envs.reset(seed=0)
        with pytest.raises(RuntimeError, match="(?s)worker 0:.*AttributeError.*no_such_attribute"):
            envs.call("no_such_attribute")
        conn = envs.backend.conns[1]
        conn.send("jump")
        reply = conn.recv()
        assert not reply.ok and reply.error.startswith("unknown worker message 'jump'")
        assert len(envs.step(["inc", "inc"])[0]) == 2  # both workers still answer
    finally:
        envs.close()
