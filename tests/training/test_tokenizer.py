"""The Qwen2.5 tokenizers built from the offline Qwen files."""

from __future__ import annotations

import pytest

from training.tokenizer import qwen25_tokenizer, qwen25_tokenizer_truncated

TEXT = "You arrive at countertop 1. On the countertop 1, you see a egg 2, and a mug 1.\n'take egg 2'"


@pytest.fixture(scope="module")
def full():
    return qwen25_tokenizer()


def test_full_tokenizer_has_qwen25_ids_and_specials(full):
    assert full("Hello, world!")["input_ids"] == [9707, 11, 1879, 0]
    assert len(full) == 151665  # Qwen2.5: 151,643 BPE tokens + 22 specials (Qwen3's 4 extra dropped)
    assert full.convert_tokens_to_ids("<|im_start|>") == 151644
    assert full.eos_token == "<|im_end|>" and full.pad_token == "<|endoftext|>"
    assert "<think>" not in full.get_added_vocab()  # plain text in Qwen2.5, a special token only in Qwen3


def test_chat_template_renders_qwen25(full):
    text = full.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = full.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}], tokenize=False
    )
    assert with_system == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"


def test_truncated_keeps_qwen_ids_and_round_trips(full):
    tok = qwen25_tokenizer_truncated(2048)
    ids = tok(TEXT)["input_ids"]
    assert max(ids) < 2048
    assert tok.decode(ids) == TEXT
    # a token the truncated vocabulary keeps has the same id as in Qwen2.5
    kept = [i for i in full(TEXT)["input_ids"] if i < 2048]
    assert kept and set(kept) <= set(ids)
    assert len(tok) == 2048 + 22
    assert tok.convert_tokens_to_ids("<|endoftext|>") == 2048
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2050


def test_truncated_rejects_bad_size():
    with pytest.raises(ValueError, match="vocab_size"):
        qwen25_tokenizer_truncated(100)
