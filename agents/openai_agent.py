"""An agent behind any OpenAI-compatible ``/v1/chat/completions`` endpoint (OpenAI, vLLM, SGLang, ...).

Requests of a batch go out concurrently: the official ``openai`` async client on an event loop of the
agent's own thread, at most ``concurrency`` requests in flight. Each attempt has a wall-clock deadline of
``timeout_s`` (``asyncio.wait_for``: the client's own timeout bounds each socket read, which a server sending
a byte at a time resets for ever); when it passes, the request is cancelled and its connection closed.
Timeouts, connection errors, answers that are not valid JSON, 429 and 5xx answers are retried with
exponential backoff (``Retry-After`` is honoured when the server sends it); any other 4xx answer raises
:class:`AgentRequestError` at once with the server's message — a wrong model name or a bad key will not be
fixed by retrying. The client's own retries are disabled so that this policy is the only one. Every error
message names the endpoint.

In a batch (:meth:`OpenAIChatAgent.generate`) a request that fails for good is that prompt's
:class:`~agents.base.Generation` with ``error`` set, so the other episodes go on.
:meth:`OpenAIChatAgent.close` cancels the requests in flight instead of waiting for them, so Ctrl-C stops an
evaluation at once.

Guided mode (:class:`~agents.base.AnswerMode`): each request carries its step's answers
(:func:`agents.base.guided_answers`) as vLLM's structured-outputs choice constraint
(``"structured_outputs": {"choice": [...]}`` in the request body, the spelling since vLLM 0.12 removed
``guided_choice``), so the engine decodes only tokens that continue one of them and the completion is one of
the answers. It is a vLLM extension: a server without it ignores the field or refuses the request (an error
naming the endpoint).
Free mode sends nothing beyond the OpenAI API, so it works against any OpenAI-compatible server.

The API key is read from the environment variable ``api_key_env`` (``OPENAI_API_KEY`` by default); a local
vLLM server accepts any key, so ``"EMPTY"`` is used when the variable is unset.

Example:
    >>> agent = OpenAIChatAgent(OpenAIConfig(model="Qwen/Qwen2.5-1.5B-Instruct",
    ...                                      base_url="http://127.0.0.1:8000/v1"))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError
from typing import Any

import openai

from agents.base import AnswerMode, Chat, Generation, PromptConfig, PromptedAgent
from agents.llm_config import OpenAIConfig


class AgentRequestError(RuntimeError):
    """A request the endpoint refused (4xx other than 429) or that still failed after every retry."""


def _is_retryable(error: Exception) -> bool:
    if isinstance(error, (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError)):
        return True
    return isinstance(error, openai.APIStatusError) and error.status_code >= 500


def _retry_after(error: Exception) -> float | None:
    response = getattr(error, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class _DeadlinePassed(Exception):
    """An attempt that had not finished by its deadline (cancelled)."""


class OpenAIChatAgent(PromptedAgent):
    """A :class:`~agents.base.PromptedAgent` whose completions come from an OpenAI-compatible endpoint.

    Args:
        config: Endpoint and sampling settings.
        prompt_config: Prompt template, history length, length bound.
        mode: :class:`~agents.base.AnswerMode` value: free text, or guided by the engine's choice constraint.
    """

    def __init__(
        self, config: OpenAIConfig, prompt_config: PromptConfig | None = None, mode: str = AnswerMode.FREE
    ):
        super().__init__(prompt_config, mode)
        if config.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {config.concurrency}")
        if not config.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {config.timeout_s}")
        self.config = config
        self.endpoint = config.base_url or "api.openai.com"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-agent", daemon=True)
        self._thread.start()
        self.client = self._run(self._make_client()).result()
        self._slots = asyncio.Semaphore(config.concurrency)
        self._jitter = random.Random(0)
        self._lock = threading.Lock()
        self.retries = 0  # retried attempts so far (for reports and tests)
        self._closed = False

    async def _make_client(self) -> openai.AsyncOpenAI:
        # made on the agent's loop, where its connections live
        return openai.AsyncOpenAI(
            api_key=os.environ.get(self.config.api_key_env) or "EMPTY",
            base_url=self.config.base_url,
            timeout=self.config.timeout_s,
            max_retries=0,
        )

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def _backoff(self, attempt: int, error: Exception) -> float:
        with self._lock:
            jitter = self._jitter.uniform(0, 0.25)
        wait = min(self.config.backoff_s * 2**attempt * (1 + jitter), self.config.max_backoff_s)
        hinted = _retry_after(error)
        return min(max(wait, hinted), self.config.max_backoff_s) if hinted is not None else wait

    def complete(
        self, messages: Chat, seed: int | None = None, choices: Sequence[str] | None = None
    ) -> Generation:
        """One chat completion with the retry policy of the module docstring (:class:`AgentRequestError`);
        with ``choices``, constrained to one of them (guided mode)."""
        return self._run(self._complete(messages, seed, choices)).result()

    async def _complete(
        self, messages: Chat, seed: int | None, choices: Sequence[str] | None = None
    ) -> Generation:
        config = self.config
        kwargs: dict[str, Any] = {
            "model": config.model,
            "messages": messages,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "max_tokens": config.max_tokens,
        }
        if config.send_seed and seed is not None:
            kwargs["seed"] = int(seed)
        extra_body = dict(config.extra_body)
        if choices is not None:
            extra_body["structured_outputs"] = {"choice": list(choices)}
        if extra_body:
            kwargs["extra_body"] = extra_body
        async with self._slots:
            for attempt in range(config.max_retries + 1):
                try:
                    response = await asyncio.wait_for(
                        self.client.chat.completions.create(**kwargs), config.timeout_s
                    )
                except asyncio.TimeoutError:
                    last_error: Exception = _DeadlinePassed(
                        f"no complete answer within the {config.timeout_s:g} s deadline"
                    )
                except openai.APIStatusError as error:
                    if not _is_retryable(error):
                        raise AgentRequestError(
                            f"{self.endpoint} refused the request for model {config.model!r}: "
                            f"HTTP {error.status_code}: {error.message}"
                        ) from error
                    last_error = error
                except (openai.APITimeoutError, openai.APIConnectionError) as error:
                    last_error = error
                except (ValueError, openai.APIResponseValidationError) as error:  # a body that is not JSON
                    last_error = error
                else:
                    if not response.choices:
                        raise AgentRequestError(
                            f"{self.endpoint} returned no choices for model {config.model!r}"
                        )
                    usage = response.usage
                    return Generation(
                        text=response.choices[0].message.content or "",
                        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
                    )
                if attempt < config.max_retries:
                    with self._lock:
                        self.retries += 1
                    await asyncio.sleep(self._backoff(attempt, last_error))
        raise AgentRequestError(
            f"request to {self.endpoint} failed after {config.max_retries + 1} attempts: "
            f"{type(last_error).__name__}: {last_error}"
        ) from last_error

    def generate(
        self, prompts: Sequence[Chat], seeds: Sequence[int], choices: Sequence[Sequence[str]] | None = None
    ) -> list[Generation]:
        per_prompt = choices if choices is not None else [None] * len(prompts)
        futures = [
            self._run(self._complete(prompt, seed, answers))
            for prompt, seed, answers in zip(prompts, seeds, per_prompt, strict=True)
        ]
        generations = []
        for future in futures:
            try:
                generations.append(future.result())
            except AgentRequestError as error:
                generations.append(Generation("", error=str(error)))
            except CancelledError:  # close() from another thread
                cancelled = f"request to {self.endpoint} cancelled: the agent was closed"
                generations.append(Generation("", error=cancelled))
        return generations

    def close(self) -> None:
        """Cancel the requests in flight, close the client and stop the agent's loop (without waiting for a
        stuck request: a KeyboardInterrupt ends an evaluation at once)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._shutdown()).result(timeout=2.0)
        except Exception:  # noqa: BLE001,S110 - closing: a client that does not close in time is dropped
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=2.0)
        if not self._thread.is_alive():
            self._loop.close()

    async def _shutdown(self) -> None:
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self.client.close()
