"""Fixtures of the agent-harness tests: toy envs, a scripted OpenAI-compatible endpoint, a tiny Qwen2."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.agents.agents_toy_envs import hint_policy  # noqa: E402  (importing registers agents-test/Toy*-v0)


class ScriptedEndpoint:
    """An OpenAI-compatible ``/v1/chat/completions`` server on a free loopback port, answering from a script.

    ``faults`` is a queue of ``(kind, value)`` consumed one per request before the policy answers:
    ``("status", 429)`` answers that HTTP status (with ``Retry-After: 0`` for 429), ``("sleep", s)`` waits
    ``s`` seconds before answering normally, ``("garbage", 0)`` answers 200 with a body that is not JSON (any
    other kind answers normally). ``requests`` records every request body; ``max_in_flight`` the
    highest number of requests served at once. Usage: prompt tokens = characters // 4, completion tokens
    likewise.
    """

    def __init__(self, policy: Callable[[list[dict], dict], str] = hint_policy, delay_s: float = 0.0):
        from flask import Flask, jsonify, request
        from werkzeug.serving import make_server

        self.policy = policy
        self.delay_s = delay_s
        self.faults: list[tuple[str, float]] = []
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        app = Flask("scripted-openai")

        @app.post("/v1/chat/completions")
        def chat():
            body = request.get_json(force=True)
            with self._lock:
                self.requests.append(body)
                fault = self.faults.pop(0) if self.faults else None
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                if fault and fault[0] == "status":
                    status = int(fault[1])
                    headers = {"Retry-After": "0"} if status == 429 else {}
                    error = {
                        "error": {"message": f"scripted error {status}", "type": "scripted", "code": status}
                    }
                    return jsonify(error), status, headers
                if fault and fault[0] == "sleep":
                    time.sleep(fault[1])
                if fault and fault[0] == "garbage":  # a 200 whose body is cut short: not JSON
                    return (
                        '{"id": "chatcmpl-x", "choices": [{"message": {"content": "<act',
                        200,
                        {"Content-Type": "application/json"},
                    )
                if self.delay_s:
                    time.sleep(self.delay_s)
                text = self.policy(body["messages"], body)
                prompt_chars = sum(len(m["content"]) for m in body["messages"])
                usage = {
                    "prompt_tokens": prompt_chars // 4,
                    "completion_tokens": len(text) // 4,
                    "total_tokens": prompt_chars // 4 + len(text) // 4,
                }
                return jsonify(
                    {
                        "id": f"chatcmpl-{len(self.requests)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": text},
                            }
                        ],
                        "usage": usage,
                    }
                )
            finally:
                with self._lock:
                    self.in_flight -= 1

        self._server = make_server("127.0.0.1", 0, app, threaded=True)
        self.base_url = f"http://127.0.0.1:{self._server.server_port}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=5)


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    server = ScriptedEndpoint()
    yield server
    server.close()


QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tiny_qwen(path: Path) -> Path:
    """A random 2-layer Qwen2 (hidden 64) and a byte-level BPE tokenizer trained here (save_pretrained)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [
        "You are an expert agent operating in the ALFRED Embodied Environment.",
        "Your task is to: put a mug on desk.",
        "<think>I should go to the desk first.</think><action>go to desk 1</action>",
        "WebShop [SEP] Instruction: [SEP] i need a red shirt [SEP] Search click[buy now] search[red shirt]",
        "Your admissible actions of the current situation are: 'look' 'inventory' 'take mug 1 from desk 1'",
    ] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = QWEN_CHAT_TEMPLATE
    fast.save_pretrained(path)
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    (path / "built_by.json").write_text(json.dumps({"by": "tests/agents/conftest.py::build_tiny_qwen"}))
    return path


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory) -> Path:
    import torch

    torch.set_num_threads(1)
    return build_tiny_qwen(tmp_path_factory.mktemp("tiny-qwen"))
