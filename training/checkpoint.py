"""Atomic checkpoints: model, optimizer, RNG states, iteration and config (a kill never leaves half of one).

Layout under ``<run_dir>/checkpoints/``::

    iter_000004/            model.pt (full state dict), optimizer.pt, rng.pt, state.json, config.yaml
    latest                  the name of the newest complete checkpoint (replaced atomically)

A checkpoint is written into ``.tmp-iter_000004-<pid>/``, flushed, then renamed into place; ``latest`` is
written to a temporary file and ``os.replace``-d. A run killed at any moment therefore resumes from the last
complete checkpoint. Older checkpoints beyond ``keep`` are deleted after the new one is in place.

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> latest_checkpoint(root) is None
    True
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

LATEST = "latest"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path, iteration: int, *, save_model, optimizer_state: dict, state: dict, config: dict, keep: int = 2
) -> Path:
    """Write checkpoint ``iter_<iteration>`` atomically and point ``latest`` at it.

    Args:
        root: The checkpoints folder.
        iteration: Completed iterations.
        save_model: ``path -> None``; writes the model's full state dict to ``path``.
        optimizer_state: ``optimizer.state_dict()``.
        state: JSON-serialisable trainer state (iteration, stage, evaluation results, ...).
        config: The run's config as a dict.
        keep: Newest checkpoints kept (older ones are removed).
    """
    root.mkdir(parents=True, exist_ok=True)
    name = f"iter_{iteration:06d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_model(tmp / "model.pt")
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({**state, "iteration": iteration}, indent=2), encoding="utf-8")
    (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    for file in tmp.rglob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    write_text_atomic(root / LATEST, name)
    checkpoints = sorted(p for p in root.glob("iter_*") if p.is_dir())
    for old in checkpoints[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (``None`` when there is none)."""
    pointer = Path(root) / LATEST
    if not pointer.is_file():
        return None
    folder = Path(root) / pointer.read_text(encoding="utf-8").strip()
    return folder if (folder / "state.json").is_file() else None


def load_checkpoint_state(folder: Path) -> tuple[dict, dict, dict]:
    """``(state, optimizer_state, rng_state)`` of a checkpoint folder."""
    state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    optimizer_state = torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=False)
    rng = torch.load(folder / "rng.pt", map_location="cpu", weights_only=False)
    return state, optimizer_state, rng
