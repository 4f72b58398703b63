"""Issue 17's attacks on the env server, each reproduced: bounded decoding, splits as names, bounded batches,
worker recovery, fair shares, no 500 from client input, exact ``seq`` replay and a draining SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from progpo_envs.server.codec import CodecError, decode
from progpo_envs.server.policy import KWARG_BOUNDS, EnvPolicy, PolicyError
from progpo_envs.server.remote import RemoteEnv
from progpo_envs.server.serving import BackgroundServer
from tests.net import half_open, session_from
from tests.progpo_envs.server.hosting_helpers import (
    SLOW_ENV_ID,
    TOY_ENV_ID,
    serve_toy,
    slow_toy_cli_server,
)
from webshop_server.clients import ClientTokens
from webshop_server.serving import CONNECTION_LIMIT, connections_per_host

MIB = 1 << 20


def rss() -> int:
    return psutil.Process().memory_info().rss


def post_raw(url: str, body: str | bytes, session=requests) -> requests.Response:
    return session.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=60)


def new_instance(url: str, session=requests, **body) -> str:
    created = session.post(f"{url}/instances", json={"env_id": TOY_ENV_ID, "seed": 0, **body}, timeout=30)
    assert created.status_code == 201, created.text
    return created.json()["instance_id"]


# --- 1. a tiny request cannot make a huge allocation --------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    chars=st.integers(0, 2_000_000),
    shape=st.lists(st.integers(0, 4), min_size=1, max_size=2),
    limit=st.sampled_from([1 << 10, 1 << 20]),
)
def test_decoding_an_array_never_allocates_past_the_limit(chars, shape, limit):
    count = 1
    for size in shape:
        count *= size
    values = ["a"] * count
    data = {"$nd": f"<U{chars}", "shape": shape, "v": values}
    try:
        array = decode(data, max_bytes=limit)
    except CodecError:
        return
    assert array.nbytes <= limit  # anything decoded fits the budget: nothing larger was allocated


def test_the_budget_is_for_the_whole_payload_and_depth_is_bounded():
    small = {"$nd": "<U1000", "shape": [1], "v": ["a"]}  # 4,000 bytes each
    assert decode([small] * 2, max_bytes=8000)[1].dtype.itemsize == 4000
    with pytest.raises(CodecError, match="limit"):
        decode([small] * 3, max_bytes=8000)
    nested: list = []
    for _ in range(100):
        nested = [nested]
    with pytest.raises(CodecError, match="deeper"):
        decode(nested, max_depth=64)


def test_a_large_dtype_in_options_or_kwargs_is_a_400_without_the_allocation(toy_url):
    instance = new_instance(toy_url)
    pad = {"$nd": "<U50000000", "shape": [1], "v": ["a"]}  # 200 MB as numpy would allocate it
    before = rss()
    reset = requests.post(
        f"{toy_url}/instances/{instance}/reset", json={"options": {"task_index": 0, "pad": pad}}, timeout=60
    )
    assert reset.status_code == 400 and "limit" in reset.json()["error"]
    created = requests.post(
        f"{toy_url}/instances", json={"env_id": TOY_ENV_ID, "kwargs": {"pad": pad}}, timeout=60
    )
    assert created.status_code == 400 and "not allowed" in created.json()["error"]
    allowed_name = requests.post(
        f"{toy_url}/instances", json={"env_id": TOY_ENV_ID, "kwargs": {"rooms": pad}}, timeout=60
    )
    assert allowed_name.status_code == 400
    assert rss() - before < 64 * MIB  # before: +572 MiB (server and worker) for the reset alone


def test_a_small_request_decodes_at_most_a_few_times_its_size(toy_url):
    """An 85-byte reset naming an 8 MiB array is refused (before: 200, the server allocated the 8 MiB); the
    budget is the whole request's, so a batch's items share it; an honest array still decodes."""
    instance = new_instance(toy_url)
    pad = {"$nd": "<U2097152", "shape": [1], "v": ["a"]}  # 8 MiB, the old per-request limit
    body = {"options": {"pad": pad}}
    assert len(json.dumps(body)) < 100
    reset = requests.post(f"{toy_url}/instances/{instance}/reset", json=body, timeout=60)
    assert reset.status_code == 400 and "times its own size" in reset.json()["error"]
    item = {"instance_id": instance, "options": {"pad": {"$nd": "<U4096", "shape": [1], "v": ["a"]}}}
    batch = requests.post(f"{toy_url}/batch/reset", json={"resets": [item] * 8}, timeout=60)
    assert batch.status_code == 400 and "limit" in batch.json()["error"]  # 8 x 16 KiB > 64 KiB
    honest = {"$nd": "<i8", "shape": [500], "v": list(range(500))}
    ok = requests.post(f"{toy_url}/instances/{instance}/reset", json={"options": {"ids": honest}}, timeout=60)
    assert ok.status_code == 200


def test_a_batch_answer_is_bounded_and_the_client_sends_the_rest_again(monkeypatch):
    """Past MAX_BATCH_ANSWER_CHARS the rest of a batch is not run (413, not_run) and Remote-v0 resends it
    (before: a 4,096-item html-mode batch answered 52 times its request's size)."""
    import progpo_envs.server.native as native
    from progpo_envs.server.remote import step_batch

    monkeypatch.setattr(native, "BATCH_CHUNK", 4)
    monkeypatch.setattr(native, "MAX_BATCH_ANSWER_CHARS", 2_000)
    server = serve_toy(num_workers=1)
    try:
        envs = [RemoteEnv(server.url, TOY_ENV_ID, max_steps=1000) for _ in range(40)]
        for i, env in enumerate(envs):
            env.reset(seed=i)
        steps = [{"instance_id": env.instance_id, "action": "look", "seq": env._seq + 1} for env in envs]
        answer = requests.post(f"{server.url}/batch/step", json={"steps": steps}, timeout=60)
        results = answer.json()["results"]
        ran = [r for r in results if r["ok"]]
        assert 0 < len(ran) < 40 and all(r["status"] == 413 and r["not_run"] for r in results[len(ran) :])
        for env in envs[: len(ran)]:
            env._seq += 1  # these ran (by hand, above)
        seq_before = [env._seq for env in envs]
        answers = step_batch(envs, ["look"] * 40)  # several requests: every item runs once
        assert len(answers) == 40 and [env._seq for env in envs] == [s + 1 for s in seq_before]
    finally:
        server.stop()


def test_an_8_mib_body_of_empty_objects_is_refused_before_parsing(toy_url):
    body = '{"steps": [' + ",".join(["{}"] * ((8 * MIB - 64) // 3)) + "]}"
    assert len(body) < 8 * MIB
    before = rss()
    answer = post_raw(f"{toy_url}/batch/step", body)
    assert answer.status_code == 413 and "JSON values" in answer.json()["error"]
    assert rss() - before < 48 * MIB  # before: +212 MiB of parsed dicts


# --- 9. no 500 from client input ----------------------------------------------------------------------------


def deep(depth: int, kind: str) -> str:
    return ("[" * depth + "]" * depth) if kind == "list" else ('{"a":' * depth + "1" + "}" * depth)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    depth=st.one_of(st.integers(1, 40), st.integers(900, 6000)),
    kind=st.sampled_from(["list", "dict"]),
    where=st.sampled_from(["body", "options", "kwargs", "steps"]),
    path=st.sampled_from(["/instances", "/instances/{id}/reset", "/batch/reset", "/reset", "/create"]),
)
def test_deep_nesting_is_a_4xx_never_a_500(toy_url, fuzz_target, depth, kind, where, path):
    inner = deep(depth, kind)
    body = {
        "body": inner,
        "options": f'{{"env_id": "{TOY_ENV_ID}", "options": {inner}}}',
        "kwargs": f'{{"env_id": "{TOY_ENV_ID}", "kwargs": {{"rooms": {inner}}}}}',
        "steps": f'{{"resets": [{{"instance_id": "{fuzz_target}", "options": {inner}}}]}}',
    }[where]
    answer = post_raw(toy_url + path.replace("{id}", fuzz_target), body)
    assert answer.status_code < 500, (depth, kind, where, path, answer.text[:200])
    if depth >= 900 and path != "/create":  # AgentGym's /create reads no body
        assert 400 <= answer.status_code < 500 and answer.json()["error"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/instances/{id}/reset", '{"options": {"task_index": Infinity}}'),
        ("/instances/{id}/reset", '{"options": {"task_index": NaN}}'),
        ("/instances/{id}/reset", '{"options": {"task_index": {"$float": "inf"}}}'),
        ("/instances/{id}/reset", '{"options": {"task_index": 1e400}}'),
        ("/instances", f'{{"env_id": "{TOY_ENV_ID}", "options": {{"task_index": {{"$float": "-inf"}}}}}}'),
        ("/batch/reset", '{"resets": [{"instance_id": "{id}", "options": {"task_index": Infinity}}]}'),
        ("/reset", '{"id": Infinity, "game": 0}'),
        ("/reset", '{"env_idx": Infinity}'),
        ("/reset", '{"id": 1e400, "game": 0}'),
        ("/step", '{"id": -Infinity, "action": "look"}'),
    ],
)
def test_non_finite_numbers_are_a_400(toy_url, fuzz_target, path, body):
    answer = post_raw(toy_url + path.replace("{id}", fuzz_target), body.replace("{id}", fuzz_target))
    assert 400 <= answer.status_code < 500, answer.text
    assert answer.json()["error"]


@pytest.fixture(scope="module")
def fuzz_target(toy_url) -> str:
    return new_instance(toy_url)


# --- 2 and 3 (kwargs). splits are names, operator-only settings, bounds -------------------------------------


@pytest.fixture
def alfworld_data(tmp_path) -> Path:
    for split in ("train", "valid_seen"):
        (tmp_path / "data" / "json_2.1.1" / split).mkdir(parents=True)
    (tmp_path / "outside" / "json_2.1.1").mkdir(parents=True)
    return tmp_path / "data"


@pytest.mark.parametrize(
    "split", ["../../outside", "/", "/etc", "..", "train/../..", "missing", "x" * 300, "", 3, None]
)
def test_an_alfworld_split_must_be_one_of_the_data_dirs_names(alfworld_data, split):
    policy = EnvPolicy.from_registry("progpo/ALFWorld-v0", fixed_kwargs={"data_dir": str(alfworld_data)})
    assert policy.splits == ("train", "valid_seen")
    with pytest.raises(PolicyError) as error:
        policy.resolve_kwargs({"split": split})
    assert str(alfworld_data) not in str(error.value) and "/tmp" not in str(error.value)
    if isinstance(split, str) and len(split) < 256:
        assert "train, valid_seen" in str(error.value)  # the valid names are listed
    assert policy.resolve_kwargs({"split": "valid_seen"})["split"] == "valid_seen"


def test_alfworld_split_names_come_from_alfworld_data(alfworld_data, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(alfworld_data))
    assert EnvPolicy.from_registry("progpo/ALFWorld-v0").splits == ("train", "valid_seen")
    monkeypatch.delenv("ALFWORLD_DATA")
    assert EnvPolicy.from_registry("progpo/ALFWorld-v0").splits == ("train", "valid_seen", "valid_unseen")


@pytest.mark.parametrize("env_id", ["progpo/ALFWorld-v0", "progpo/WebShop-v0"])
def test_operator_only_settings_are_not_client_settable_by_default(env_id):
    policy = EnvPolicy.from_registry(env_id)
    for name in ("expert", "max_cached_games"):
        with pytest.raises(PolicyError, match="not allowed"):
            policy.resolve_kwargs({name: True if name == "expert" else 1000})
    allowed = EnvPolicy.from_registry(env_id, allowed_kwargs=["expert"])  # the operator's choice
    assert allowed.resolve_kwargs({"expert": True})["expert"] is True


def test_a_client_may_restate_what_the_operator_fixed_but_not_change_it():
    # the compose stage fixes expert=true on its env servers
    policy = EnvPolicy.from_registry("progpo/ALFWorld-v0", fixed_kwargs={"expert": True})
    assert "expert" not in policy.allowed_kwargs
    assert policy.resolve_kwargs({"expert": True, "max_steps": 5}) == {**policy.fixed_kwargs, "max_steps": 5}
    for other in (False, 1, "true"):  # another value, or the same truth in another type
        with pytest.raises(PolicyError, match="'expert' is not allowed"):
            policy.resolve_kwargs({"expert": other})


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(sorted(KWARG_BOUNDS)), value=st.integers(-(2**40), 2**40))
def test_work_and_memory_settings_are_bounded(name, value):
    policy = EnvPolicy.from_registry("progpo/ALFWorld-v0", allowed_kwargs=list(KWARG_BOUNDS))
    low, high = KWARG_BOUNDS[name]
    sent = [value] if name == "history_depths" else value
    if low <= value <= high:
        assert policy.resolve_kwargs({name: sent})[name] == sent
    else:
        with pytest.raises(PolicyError, match="must be an integer in"):
            policy.resolve_kwargs({name: sent})


def test_long_history_depths_are_refused():
    policy = EnvPolicy.from_registry("progpo/ALFWorld-v0")
    with pytest.raises(PolicyError, match="at most"):
        policy.resolve_kwargs({"history_depths": {"$tuple": list(range(1, 65))}})  # ~68 ms per step before
    assert policy.resolve_kwargs({"history_depths": {"$tuple": [1, 2, 64]}})["history_depths"] == (1, 2, 64)


# --- 3. one batch cannot hold or kill a worker --------------------------------------------------------------


def costly_instance(url: str) -> str:
    """A toy instance whose steps cost ~2 ms each (8 deep history windows over up to 1,000 steps)."""
    return new_instance(url, kwargs={"history_depths": {"$tuple": list(range(57, 65))}, "max_steps": 1000})


def test_a_batch_longer_than_the_request_timeout_completes_without_a_restart():
    server = serve_toy(num_workers=1, request_timeout=1.0)
    try:
        instance = costly_instance(server.url)
        steps = [{"instance_id": instance, "action": "look"}] * 1000  # ~2 s of env time in one request
        answer = requests.post(f"{server.url}/batch/step", json={"steps": steps}, timeout=120)
        assert answer.status_code == 200
        results = answer.json()["results"]
        assert len(results) == 1000 and all(r["ok"] for r in results), results[-1]
        metrics = requests.get(f"{server.url}/metrics", timeout=10).json()
        assert metrics["worker_restarts"] == 0 and metrics["lost"] == 0  # before: 504, every instance lost
    finally:
        server.stop()


def test_a_long_batch_does_not_hold_the_worker_from_other_instances():
    server = serve_toy(num_workers=1)
    try:
        costly, other = costly_instance(server.url), new_instance(server.url)
        steps = [{"instance_id": costly, "action": "look"}] * 1000
        pool = server.app.extensions["progpo_pool"]
        started = time.perf_counter()
        batch = threading.Thread(target=pool.batch, args=("step", [{**s, "seq": None} for s in steps]))
        batch.start()
        time.sleep(0.3)  # the batch has the worker
        asked = time.perf_counter()
        step = requests.post(f"{server.url}/instances/{other}/step", json={"action": "look"}, timeout=60)
        waited = time.perf_counter() - asked
        batch.join(120)
        batch_s = time.perf_counter() - started
        assert step.status_code == 200
        # served between the batch's slices (before: after the whole batch, ~2 s of env time)
        assert waited < batch_s / 4, (waited, batch_s)
    finally:
        server.stop()


# --- 4. dead workers are restarted without traffic; creates survive a crash; counters stay right ------------


def test_an_idle_server_restarts_a_dead_worker_on_its_own():
    server = serve_toy(num_workers=2, supervise_interval=0.1)
    try:
        pool = server.app.extensions["progpo_pool"]
        victim = pool.worker_pids()[1]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        time.sleep(0.2)
        while time.monotonic() < deadline and not pool.ready:
            time.sleep(0.1)  # no request at all: only the supervisor can notice
        assert pool.worker_pids()[1] != victim
        assert requests.get(f"{server.url}/ready", timeout=10).status_code == 200
    finally:
        server.stop()


def test_creates_right_after_a_crash_land_on_a_live_worker_and_counters_stay_right():
    server = serve_toy(num_workers=2, supervise_interval=3600)  # only the create path can recover here
    try:
        pool = server.app.extensions["progpo_pool"]
        lost = [new_instance(server.url) for _ in range(4)]
        for pid in pool.worker_pids():
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        statuses: list[int] = []

        def create() -> None:
            answer = requests.post(f"{server.url}/instances", json={"env_id": TOY_ENV_ID}, timeout=120)
            statuses.append(answer.status_code)

        threads = [threading.Thread(target=create) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
        assert statuses == [201] * 8  # before: 4 of 8 were 410
        for instance in lost:
            assert requests.get(f"{server.url}/instances/{instance}", timeout=10).status_code == 410
        metrics = requests.get(f"{server.url}/metrics", timeout=10).json()
        per_worker = [w["live_instances"] for w in metrics["workers"]]
        assert min(per_worker) >= 0 and sum(per_worker) == metrics["live_instances"] == 8
    finally:
        server.stop()


# --- 8. one client cannot take everything -------------------------------------------------------------------


def _serve_toy_with_tokens(tokens: list[str], **pool_kwargs) -> BackgroundServer:
    from progpo_envs.server.app import ServerConfig, create_app
    from progpo_envs.server.pool import PoolConfig

    pool = PoolConfig(**{"num_workers": 1, "idle_timeout": 120.0, **pool_kwargs})
    config = ServerConfig(
        env_ids=(TOY_ENV_ID,), pool=pool, agentgym=TOY_ENV_ID, client_tokens=ClientTokens(tokens)
    )
    return BackgroundServer(create_app(config)).__enter__()


def test_one_client_gets_its_share_of_instances_and_others_still_get_theirs():
    """Clients on one host told apart by the operator's tokens: each has its own share."""
    server = _serve_toy_with_tokens(["greedy-token-1", "polite-token-2"], max_instances=8)
    try:
        greedy, polite = requests.Session(), requests.Session()
        greedy.headers["Authorization"] = "Bearer greedy-token-1"
        polite.headers["Authorization"] = "Bearer polite-token-2"
        statuses = [
            greedy.post(f"{server.url}/instances", json={"env_id": TOY_ENV_ID}, timeout=30).status_code
            for _ in range(8)
        ]
        assert statuses == [201] * 4 + [429] * 4  # half of the server's instances
        answer = greedy.post(f"{server.url}/create", timeout=30)  # the AgentGym door shares the same count
        assert answer.status_code == 429 and "share" in answer.json()["error"]
        assert (
            polite.post(f"{server.url}/instances", json={"env_id": TOY_ENV_ID}, timeout=30).status_code == 201
        )
        assert polite.get(f"{server.url}/health", timeout=30).status_code == 200
        remote = RemoteEnv(server.url, TOY_ENV_ID, token="polite-token-2")  # the client sends its token
        remote.close()
        forged = requests.post(
            f"{server.url}/instances",
            json={"env_id": TOY_ENV_ID},
            headers={"Authorization": "Bearer made-up"},
            timeout=30,
        )
        assert forged.status_code == 401 and "unknown client token" in forged.json()["error"]
    finally:
        server.stop()


def test_several_loopback_addresses_are_one_client():
    """Source addresses 127.0.0.2, .3, .4 of one host share one client's share (before: two loopback addresses
    took all 1,024 instances and a third client got 429)."""
    server = serve_toy(num_workers=1, max_instances=8)
    try:
        statuses = [
            session_from(f"127.0.0.{2 + i % 3}")
            .post(f"{server.url}/instances", json={"env_id": TOY_ENV_ID}, timeout=30)
            .status_code
            for i in range(8)
        ]
        assert statuses == [201] * 4 + [429] * 4
    finally:
        server.stop()


def test_idle_half_open_connections_do_not_starve_health_checks(toy_server, second_host_address):
    """Five loopback addresses x 250 half-open connections (past the server's whole limit) are one host's: at
    most its share stays open, and another host's health check answers at once (before: they starved /health
    for ~45 s)."""
    held = half_open(toy_server.port, [f"127.0.0.{i}" for i in range(2, 7)], 250, "/health")
    try:
        time.sleep(0.5)
        channels = list(toy_server._server.active_channels.values())
        from_attacker = [c for c in channels if c.addr[0].startswith("127.")]
        assert len(from_attacker) <= connections_per_host(CONNECTION_LIMIT)  # the rest: closed as they came
        monitor = session_from(second_host_address)
        assert monitor.get(f"{toy_server.url}/health", timeout=10).status_code == 200
    finally:
        for sock in held:
            sock.close()


class _RecordingTable(dict):
    """Waitress's table of open connections (``server.active_channels``), recording the most connections of
    one client host it ever held: at each insertion, not only when a test happens to look."""

    def __init__(self, *args):
        super().__init__(*args)
        self.most = self.inserted = 0

    def __setitem__(self, fd, channel) -> None:
        super().__setitem__(fd, channel)
        self.inserted += 1
        host = getattr(channel, "host", None)
        self.most = max(self.most, sum(getattr(c, "host", None) == host for c in list(self.values())))


def test_a_host_never_holds_more_than_its_share_even_while_a_connection_is_accepted():
    """Issue 38, item 5: the test above failed ``assert 257 <= 256`` on a loaded machine. Its look at the
    table came while the server was still accepting the flood (0.5 s was not enough on busy cores), and each
    connection past the share was registered first and made room after, so the table held 257 for a moment.
    Reproduced: 3 of 8 runs of that test beside 4 busy loops on the 2 cores failed so; this table records
    every insertion, so it fails on every run where room is made after registering."""
    server = serve_toy(num_workers=1)
    table = _RecordingTable()
    server._server.active_channels = table  # before any connection: nothing to copy
    held = half_open(server.port, ["127.0.0.2", "127.0.0.3"], 300, "/health")
    try:
        deadline = time.monotonic() + 60
        while table.inserted < len(held) and time.monotonic() < deadline:  # every one accepted (all idle)
            time.sleep(0.05)
        assert table.inserted == len(held) == 600
        assert table.most == connections_per_host(CONNECTION_LIMIT)  # filled, never passed
    finally:
        for sock in held:
            sock.close()
        server.stop()


def test_a_hosts_own_health_check_gets_through_its_stale_connections(toy_server):
    """Issue 35, item 6 (``scripts/serving_probe.py loopback``): 300 half-sent connections from 127.0.0.2 held
    the loopback share, and a health check from 127.0.0.1, the same host, was refused (before: a connection
    error on the env server and the site). Past its share a host's oldest idle connection makes room."""
    held = half_open(toy_server.port, ["127.0.0.2"], 300, "/health")
    try:
        time.sleep(0.5)
        assert requests.get(f"{toy_server.url}/health", timeout=10).status_code == 200
        channels = list(toy_server._server.active_channels.values())
        assert len([c for c in channels if c.addr[0].startswith("127.")]) <= connections_per_host(
            CONNECTION_LIMIT
        )
    finally:
        for sock in held:
            sock.close()


# --- 10. seq replays only the same call; SIGTERM drains -----------------------------------------------------


def test_a_seq_retry_replays_only_the_same_call(toy_url):
    instance = new_instance(toy_url)
    url = f"{toy_url}/instances/{instance}"
    step = requests.post(f"{url}/step", json={"action": "look", "seq": 1}, timeout=10)
    assert step.status_code == 200
    again = requests.post(f"{url}/step", json={"action": "look", "seq": 1}, timeout=10)
    assert again.json() == step.json()  # the same call: the same answer, not a second step
    for other in (
        ("reset", {"seq": 1}),
        ("step", {"action": "go right", "seq": 1}),
        ("reset", {"seed": 3, "seq": 1}),
    ):
        answer = requests.post(f"{url}/{other[0]}", json=other[1], timeout=10)
        assert answer.status_code == 409 and "different call" in answer.json()["error"], other


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    calls=st.lists(st.tuples(st.sampled_from(["look", "go right", "reset"]), st.integers(1, 4)), max_size=8)
)
def test_seq_replay_matches_a_model(toy_url, calls):
    """Against a model of the rule: a new seq is the last + 1; a repeated seq replays only the same call."""
    instance = new_instance(toy_url)
    last_seq, last_call, last_answer = 0, None, None
    for action, seq in calls:
        op, body = ("reset", {"seq": seq}) if action == "reset" else ("step", {"action": action, "seq": seq})
        answer = requests.post(f"{toy_url}/instances/{instance}/{op}", json=body, timeout=10)
        if seq == last_seq and last_answer is not None:
            if (op, action) == last_call:
                assert answer.status_code == 200 and answer.json() == last_answer
            else:
                assert answer.status_code == 409
        elif seq == last_seq + 1:
            assert answer.status_code == 200
            last_seq, last_call, last_answer = seq, (op, action), answer.json()
        else:
            assert answer.status_code == 409


def test_sigterm_finishes_the_requests_in_flight_then_exits():
    server = slow_toy_cli_server(step_delay=2.0)
    try:
        instance = requests.post(
            f"{server.url}/instances", json={"env_id": SLOW_ENV_ID, "seed": 0}, timeout=60
        ).json()["instance_id"]
        answers: list = []
        in_flight = threading.Thread(
            target=lambda: answers.append(
                requests.post(f"{server.url}/instances/{instance}/step", json={"action": "look"}, timeout=60)
            )
        )
        in_flight.start()
        time.sleep(0.5)
        server.process.send_signal(signal.SIGTERM)
        in_flight.join(60)
        assert answers and answers[0].status_code == 200 and "observation" in answers[0].json()
        assert server.process.wait(30) == 0
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{server.url}/health", timeout=5)
    finally:
        server.stop()
        server.log.seek(0)
        log = server.log.read()
    assert "finishing the requests in flight" in log, log[-2000:]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_whole_process_group_drains_a_batch_in_flight(sig):
    """Ctrl-C, systemd's KillMode=control-group and ``kill -TERM -PGID`` signal the workers too: they keep
    serving, the batch in flight is answered in full, no worker is restarted (before: the workers died at
    once, 118 of 849 items came back ok, and the supervisor restarted workers during the drain)."""
    server = slow_toy_cli_server("--workers", "2", step_delay=0.05, max_steps=1000)
    try:
        instances = [
            requests.post(
                f"{server.url}/instances", json={"env_id": SLOW_ENV_ID, "seed": i}, timeout=60
            ).json()["instance_id"]
            for i in range(4)
        ]
        steps = [{"instance_id": instances[i % 4], "action": "look"} for i in range(48)]  # ~0.6 s per worker
        answers: list = []
        in_flight = threading.Thread(
            target=lambda: answers.append(
                requests.post(f"{server.url}/batch/step", json={"steps": steps}, timeout=60)
            )
        )
        in_flight.start()
        time.sleep(0.2)
        os.killpg(server.process.pid, sig)
        in_flight.join(60)
        assert answers and answers[0].status_code == 200
        results = answers[0].json()["results"]
        assert sum(r["ok"] for r in results) == len(steps), [r for r in results if not r["ok"]][:3]
        assert server.process.wait(30) == 0
    finally:
        server.stop()
        server.log.seek(0)
        log = server.log.read()
    assert "finishing the requests in flight" in log, log[-2000:]
    assert "restarting env worker" not in log, log[-2000:]


def test_the_per_client_share_is_an_operator_setting():
    from progpo_envs.server.cli import build_config, parse_args

    assert build_config(parse_args(["--max-instances", "10"])).pool.client_share == 5
    assert build_config(parse_args(["--max-instances-per-client", "7"])).pool.client_share == 7
    with pytest.raises(SystemExit):
        parse_args(["--max-instances-per-client", "0"])
