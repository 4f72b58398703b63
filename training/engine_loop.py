"""One generation engine, stepped by its own thread, shared by many callers: requests in, futures out.

The per-episode rollout (:mod:`training.async_rollout`) submits each episode's request as soon as its env
step returns, and evaluations submit a whole turn at once (:meth:`EngineLoop.generate`, the
:class:`~training.engines.GenerationEngine` call): all of them land in one continuously batched engine
(:class:`training.engines.TransformersEngine`'s :class:`~training.decoding.DecodeBatch`, or vLLM's own
scheduler), which the loop's thread steps while there is work — the way vLLM's asynchronous engine serves
its callers, here inside the trainer's process (the engine, its weights and the weight sync stay where they
are). While it decodes, the caller threads step envs and build prompts; torch releases the GIL in its kernels.

Policy versions and weight syncs. The loop stamps every result with the policy version current when its
request entered the engine (:attr:`~training.sampling.SampleResult.policy_version`).
:meth:`EngineLoop.sync_weights` first *drains* the engine — no request is admitted, those in flight decode to
their end — then loads the weights and moves to the new version, and only then admits the requests that
waited: no response mixes two policies, so a row's version and behaviour log-probs describe exactly the policy
that sampled it (and vLLM's prefix cache, which must be empty to reset, is). :meth:`EngineLoop.paused` is the
same pause for other work on the engine.

Counters: ``busy_seconds`` (time inside engine steps), ``steps``, and the requests and tokens done, for the
rollout's engine-utilisation and overlap metrics.

Example:
    >>> import torch
    >>> from transformers import Qwen2Config, Qwen2ForCausalLM
    >>> from training.engines import TransformersEngine
    >>> model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32,
    ...                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    >>> loop = EngineLoop(TransformersEngine(model, stop_token_ids=[0], pad_token_id=0))
    >>> out = loop.generate([[1, 2, 3], [4, 5]], temperature=1.0, max_new_tokens=4, seeds=[0, 1])
    >>> len(out.token_ids), loop.policy_version
    (2, 0)
    >>> loop.close()
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future

import torch

from training.decoding import collect_results
from training.engines import GenerationEngine, OneRequestPerPrompt
from training.sampling import SampleOutput, SampleRequest, SampleResult


class EngineLoop(OneRequestPerPrompt):
    """A :class:`~training.engines.GenerationEngine` stepped by a thread of its own (module docstring).

    Thread-safe: any thread may :meth:`submit`, :meth:`generate`, :meth:`sync_weights` and :meth:`close`.

    Args:
        engine: The engine it owns (no other caller may touch it while the loop runs).
        device: The device the engine computes on (a CUDA device is made current in the loop's thread).
        policy_version: The version of the engine's weights at the start.
    """

    def __init__(self, engine: GenerationEngine, device: torch.device | str = "cpu", policy_version: int = 0):
        self.engine = engine
        self.device = torch.device(device)
        self.policy_version = policy_version
        self._cond = threading.Condition()
        self._waiting: deque[tuple[SampleRequest, Future]] = deque()
        self._in_flight: dict[int, tuple[Future, int]] = {}  # engine request id -> (future, version)
        self._pauses = 0  # callers holding a pause (no admissions while > 0)
        self._parked = False  # the thread saw the pause and the engine is empty
        self._closed = False
        self._error: BaseException | None = None
        #: Seconds spent inside engine steps, steps run, requests and generated tokens done.
        self.busy_seconds, self.steps, self.requests_done, self.tokens_done = 0.0, 0, 0, 0
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    @property
    def counters(self) -> tuple[float, int, int]:
        """``(busy seconds, decode steps, tokens)`` so far."""
        return self.busy_seconds, self.steps, self.tokens_done

    @property
    def in_flight(self) -> int:
        """Requests in the engine now (admitted, not yet done)."""
        with self._cond:
            return len(self._in_flight)

    @property
    def model(self) -> torch.nn.Module | None:
        """The engine's model, when it has one in this process (the transformers engine)."""
        return getattr(self.engine, "model", None)

    # ------------------------------------------------------------------ callers
    def submit(self, request: SampleRequest) -> Future[SampleResult]:
        """Queue ``request``; its result arrives in the returned future (an engine error is raised there)."""
        future: Future[SampleResult] = Future()
        with self._cond:
            if self._error is not None:
                raise RuntimeError("the engine loop stopped after an error") from self._error
            if self._closed:
                raise RuntimeError("the engine loop is closed")
            self._waiting.append((request, future))
            self._cond.notify_all()
        return future

    def answer(self, requests: Sequence[SampleRequest]) -> SampleOutput:
        """The responses to ``requests`` (:meth:`generate`'s), which join whatever the engine decodes."""
        results = [future.result() for future in [self.submit(r) for r in requests]]
        renumbered = [
            SampleResult(k, r.token_ids, r.logprobs, r.finished, r.policy_version)
            for k, r in enumerate(results)
        ]
        return collect_results(renumbered, range(len(renumbered)))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Drain the engine (no admissions; the requests in flight decode to their end) and hold it empty
        for the body; requests submitted meanwhile wait and are admitted after."""
        with self._cond:
            self._pauses += 1
            self._cond.notify_all()
            while not (self._parked or self._closed or self._error is not None):
                self._cond.wait()
            self._raise_error()
        try:
            yield
        finally:
            with self._cond:
                self._pauses -= 1
                self._cond.notify_all()

    def sync_weights(self, model: torch.nn.Module | None, version: int | None = None) -> None:
        """Load ``model``'s weights into the drained engine (:meth:`paused`; ``None``: nothing to load, the
        engine samples from the trained model itself) and, when given, make ``version`` the policy version of
        the requests admitted from now on."""
        with self.paused():
            if model is not None:
                self.engine.sync_weights(model)
            if version is not None:
                self.policy_version = version

    def set_version(self, version: int) -> None:
        """Move to policy ``version`` without loading weights: :meth:`sync_weights` with ``None``."""
        self.sync_weights(None, version)

    def stop(self) -> None:
        """Stop the thread (requests still waiting or in flight get an error); the engine stays open."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=60)

    def close(self) -> None:
        """:meth:`stop`, then close the engine."""
        self.stop()
        with contextlib.suppress(AttributeError):
            self.engine.close()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError("the engine loop stopped after an error") from self._error

    # ------------------------------------------------------------------ the loop's thread
    def _run(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        try:
            while self._admit():
                started = time.perf_counter()
                results = self.engine.step()
                self.busy_seconds += time.perf_counter() - started
                self.steps += 1
                self._deliver(results)
        except BaseException as error:  # every waiter must hear of it
            self._fail(error)
            return
        self._fail(RuntimeError("the engine loop is closed"))

    def _admit(self) -> bool:
        """Wait for work; move waiting requests into the engine unless paused. False when closed."""
        with self._cond:
            while True:
                if self._closed:
                    return False
                if self._pauses and not self.engine.has_unfinished():
                    if not self._parked:
                        self._parked = True
                        self._cond.notify_all()
                    self._cond.wait()
                    continue
                self._parked = False
                if not self._pauses:
                    while self._waiting:
                        request, future = self._waiting.popleft()
                        if future.set_running_or_notify_cancel():
                            request_id = self.engine.add_request(request)
                            self._in_flight[request_id] = (future, self.policy_version)
                if self.engine.has_unfinished():
                    return True
                self._cond.wait()

    def _deliver(self, results: Sequence[SampleResult]) -> None:
        with self._cond:
            for result in results:
                future, version = self._in_flight.pop(result.request_id)
                result.policy_version = version
                self.requests_done += 1
                self.tokens_done += len(result.token_ids)
                future.set_result(result)
            self._cond.notify_all()

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            if self._error is None and not self._closed:
                self._error = error
            futures = [f for f, _ in self._in_flight.values()] + [f for _, f in self._waiting]
            self._in_flight.clear()
            self._waiting.clear()
            self._cond.notify_all()
        for future in futures:
            if not future.done():
                future.set_exception(RuntimeError(f"engine loop stopped: {error}"))


def loop_counters(engine: GenerationEngine | EngineLoop) -> tuple[float, int, int]:
    """An engine loop's :attr:`EngineLoop.counters`; zeros for a bare engine (lock-step rollouts)."""
    return engine.counters if isinstance(engine, EngineLoop) else (0.0, 0, 0)
