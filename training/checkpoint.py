"""Atomic, verified checkpoints: model, optimizer, RNG states, iteration and config.

Layout under ``<run_dir>/checkpoints/``::

    iter_000004/            model.pt (full state dict), optimizer.pt, rng.pt, state.json, config.yaml,
                            manifest.json (size and xxh3-128 hash of every other file, written last)
    latest                  the name of the newest checkpoint written (a hint for people and tools)

Writing: a checkpoint is written into ``.tmp-iter_000004-<pid>/``, its manifest last, every file flushed,
then the folder is renamed into place, verified, and only then are the checkpoints it replaces pruned (those
older than the newest ``keep`` intact ones). A run killed at any moment leaves either a complete checkpoint
or a temporary folder, never half of one; temporary folders whose writer process is gone are removed by the
next write.

Reading: a checkpoint is *intact* when its manifest lists every required file and every listed file has the
recorded size and hash. :func:`load_latest_checkpoint` resumes from the newest checkpoint that is intact and
loads, whatever ``latest`` says, warns (:class:`CheckpointWarning`) about each newer one it skips and why,
and raises :class:`CheckpointError` when checkpoints exist but none can be used, so that a damaged run is
never mistaken for a fresh one. Every ``.pt`` file is read with ``torch.load(weights_only=True)``: the RNG
states are stored as tensors and plain containers, so a planted pickle payload fails to load instead of
running.

The trainer saves and resumes a (possibly FSDP2-sharded) model and its optimizer with
:func:`save_training_state` and :func:`restore_training_state`.

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> load_latest_checkpoint(root) is None  # no checkpoint at all: a fresh run
    True
    >>> folder = save_checkpoint(
    ...     root, 3, save_model=lambda path: torch.save({"w": torch.ones(2)}, path),
    ...     optimizer_state={"state": {}, "param_groups": []}, state={"stage": "rl"}, config={"seed": 0})
    >>> (root / "latest").write_text("")  # a damaged hint does not hide the checkpoint
    0
    >>> checkpoint = load_latest_checkpoint(root)
    >>> checkpoint.folder.name, checkpoint.iteration, checkpoint.model_state["w"].tolist()
    ('iter_000003', 3, [1.0, 1.0])
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash
import yaml

LATEST = "latest"
MANIFEST = "manifest.json"
#: Files every checkpoint has; a manifest that does not list one of them is not intact.
REQUIRED_FILES = ("model.pt", "optimizer.pt", "rng.pt", "state.json", "config.yaml")
MANIFEST_FORMAT = 1

_CHECKPOINT_NAME = re.compile(r"iter_(\d+)")
#: Temporary names of this writer, each ending in the writer's pid: checkpoint folders being written,
#: checkpoints set aside while being replaced, and ``latest`` being replaced.
_TEMPORARY_NAME = re.compile(r"\.(?:tmp|old)-iter_\d+-(\d+)|\.latest\.tmp-(\d+)")
_HASH_CHUNK = 8 << 20


class CheckpointError(RuntimeError):
    """A checkpoint that is not intact or does not load, or checkpoints of which none can be resumed."""


class CheckpointWarning(UserWarning):
    """A newer checkpoint was skipped because it is not intact; an older one is used."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One loaded checkpoint: what a trainer needs to continue exactly where it stopped.

    Attributes:
        folder: The checkpoint's folder (``<root>/iter_<iteration>``).
        state: The trainer state written with it (``iteration``, ``stage``, evaluations, ...).
        model_state: The model's full state dict (CPU tensors).
        optimizer_state: The optimizer's (full) state dict.
        rng_state: What :func:`set_rng_state` restores.
    """

    folder: Path
    state: dict[str, Any]
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    rng_state: dict[str, Any]

    @property
    def iteration(self) -> int:
        """Completed iterations when the checkpoint was written."""
        return int(self.state["iteration"])


# ---------------------------------------------------------------------------------------------- files
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


def _file_hash(path: Path) -> str:
    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path) -> dict[str, Any]:
    """Record the size and xxh3-128 hash of every file in ``folder`` in ``folder/manifest.json``.

    Called last, after every other file of the checkpoint is written and flushed.

    Returns:
        The manifest written: ``{"format": 1, "files": {relative path: {"size": bytes, "xxh3_128": hex}}}``.
    """
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
        files[path.relative_to(folder).as_posix()] = {
            "size": path.stat().st_size,
            "xxh3_128": _file_hash(path),
        }
    manifest = {"format": MANIFEST_FORMAT, "files": files}
    with open(folder / MANIFEST, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    return manifest


def verify_checkpoint(folder: Path) -> None:
    """Check that ``folder`` is an intact checkpoint: a manifest listing every required file, and every listed
    file present with the recorded size and hash (sizes first: a truncated file costs no read).

    Raises:
        CheckpointError: What is wrong, e.g. ``"model.pt has 7 bytes, the manifest says 1591"``.
    """
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        records = [(name, int(files[name]["size"]), str(files[name]["xxh3_128"])) for name in files]
    except FileNotFoundError:
        raise CheckpointError(f"no {MANIFEST} (incomplete, or written before checkpoints had one)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"unreadable {MANIFEST} ({_one_line(exc)})") from None
    if any(Path(name).is_absolute() or ".." in Path(name).parts for name in files):
        raise CheckpointError(f"{MANIFEST} lists a file outside the checkpoint")
    missing = [name for name in REQUIRED_FILES if name not in files]
    if missing:
        raise CheckpointError(f"{MANIFEST} does not list {', '.join(missing)}")
    for name, size, _ in records:
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{name} is missing")
        if path.stat().st_size != size:
            raise CheckpointError(f"{name} has {path.stat().st_size} bytes, the manifest says {size}")
    for name, _, expected in records:
        if _file_hash(folder / name) != expected:
            raise CheckpointError(f"{name} does not match its hash in the manifest")


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).splitlines() if line.strip()]
    refusal = [line for line in lines if line.startswith("WeightsUnpickler error:")]
    if refusal:  # torch's weights_only message: the one line that says what was refused
        reason = refusal[0].removeprefix("WeightsUnpickler error:").split(". Please")[0].strip()
        return f"weights_only refused it: {reason[:200]}"
    return f"{type(exc).__name__}: {(lines or [''])[0].split('. ')[0][:200]}"


# ---------------------------------------------------------------------------------------------- RNG
def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) RNG states as tensors and plain containers (what
    ``torch.load(weights_only=True)`` reads back)."""
    version, internal, gauss_next = random.getstate()
    _, keys, position, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),  # uint32 words; int64 holds them exactly
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"]), python["gauss_next"]))
    numpy = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy["keys"].numpy().astype(np.uint32),
            numpy["position"],
            numpy["has_gauss"],
            numpy["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------- writing
def _process_is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_temporaries(root: Path) -> list[Path]:
    """Remove this writer's temporary files under ``root`` whose writer is gone (or is this process).

    A temporary name ends in its writer's pid; one of a live process (another run writing into the same
    folder) is left alone. Nothing else is touched.

    Returns:
        The paths removed.
    """
    removed = []
    for path in sorted(Path(root).glob(".*")):
        match = _TEMPORARY_NAME.fullmatch(path.name)
        if match is None:
            continue
        pid = int(match.group(1) or match.group(2))
        if pid != os.getpid() and _process_is_alive(pid):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def save_checkpoint(
    root: Path, iteration: int, *, save_model, optimizer_state: dict, state: dict, config: dict, keep: int = 2
) -> Path:
    """Write checkpoint ``iter_<iteration>`` atomically, verify it, point ``latest`` at it, then prune.

    Args:
        root: The checkpoints folder.
        iteration: Completed iterations.
        save_model: ``path -> None``; writes the model's full state dict to ``path``.
        optimizer_state: ``optimizer.state_dict()`` (tensors and plain containers, as torch's optimizers
            and FSDP's full optimizer state dict are).
        state: JSON-serialisable trainer state (iteration, stage, evaluation results, ...).
        config: The run's config as a dict.
        keep: Intact checkpoints kept; only checkpoints older than the newest ``keep`` intact ones are
            removed (0 keeps every checkpoint).

    Returns:
        The checkpoint's folder.

    Raises:
        CheckpointError: The written checkpoint does not verify (then nothing is pruned).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(root)
    name = f"iter_{iteration:06d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    tmp.mkdir()
    save_model(tmp / "model.pt")
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({**state, "iteration": iteration}, indent=2), encoding="utf-8")
    (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    write_manifest(tmp)
    _fsync_dir(tmp)
    final = root / name
    replaced = root / f".old-{name}-{os.getpid()}"
    if final.exists():  # the same iteration saved again (e.g. after the final evaluation): set the old aside
        os.replace(final, replaced)
    os.replace(tmp, final)
    _fsync_dir(root)
    verify_checkpoint(final)
    write_text_atomic(root / LATEST, name)
    if replaced.exists():
        shutil.rmtree(replaced)
    if keep > 0:
        _prune(root, keep, verified=final)
    return final


def _prune(root: Path, keep: int, verified: Path) -> None:
    """Remove the checkpoints older than the newest ``keep`` intact ones (verified newest first, stopping
    once ``keep`` are found: an older intact checkpoint is never removed for a newer damaged one).
    ``verified`` was just verified and is not read again."""
    checkpoints = _checkpoint_folders(root)
    intact = 0
    for position, folder in enumerate(checkpoints):
        try:
            if folder != verified:
                verify_checkpoint(folder)
        except CheckpointError:
            continue
        intact += 1
        if intact == keep:
            for old in checkpoints[position + 1 :]:
                shutil.rmtree(old, ignore_errors=True)
            return


# ---------------------------------------------------------------------------------------------- reading
def _checkpoint_folders(root: Path) -> list[Path]:
    """``iter_*`` folders under ``root``, newest (highest iteration) first."""
    found = []
    for path in Path(root).glob("iter_*"):
        match = _CHECKPOINT_NAME.fullmatch(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found, reverse=True)]


def _latest_hint(root: Path) -> str | None:
    try:
        return (Path(root) / LATEST).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def load_checkpoint(folder: Path) -> Checkpoint:
    """Verify ``folder`` against its manifest and load it (every ``.pt`` with ``weights_only=True``).

    Raises:
        CheckpointError: The checkpoint is not intact or a file does not load (e.g. a pickle payload).
    """
    folder = Path(folder)
    verify_checkpoint(folder)
    parts: dict[str, Any] = {}
    for name in ("state.json", "model.pt", "optimizer.pt", "rng.pt"):
        try:
            if name.endswith(".json"):
                parts[name] = json.loads((folder / name).read_text(encoding="utf-8"))
            else:
                parts[name] = torch.load(folder / name, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch.load raises many types for a damaged or unsafe file
            raise CheckpointError(f"{name} does not load ({_one_line(exc)})") from exc
    state = parts["state.json"]
    if not isinstance(state, dict) or not isinstance(state.get("iteration"), int):
        raise CheckpointError("state.json has no integer 'iteration'")
    return Checkpoint(folder, state, parts["model.pt"], parts["optimizer.pt"], parts["rng.pt"])


def latest_checkpoint(root: Path) -> Path | None:
    """The newest intact checkpoint folder under ``root``; ``None`` when there is no checkpoint.

    ``latest`` is only a hint: every ``iter_*`` folder is a candidate, newest first, checked with
    :func:`verify_checkpoint`. Each one skipped is reported with a :class:`CheckpointWarning` that says what
    is wrong with it. Nothing is deleted.

    Raises:
        CheckpointError: Checkpoints exist (an ``iter_*`` folder or ``latest``) but none is intact; the
            one-line message lists what is wrong with each.
    """

    def verified(folder: Path) -> Path:
        verify_checkpoint(folder)
        return folder

    return _newest(Path(root), verified)


def load_latest_checkpoint(
    root: Path, check: Callable[[Checkpoint], None] | None = None
) -> Checkpoint | None:
    """The newest checkpoint under ``root`` that is intact, loads (:func:`load_checkpoint`) and passes
    ``check`` (e.g. :func:`check_training_state`: raises :class:`CheckpointError`), as
    :func:`latest_checkpoint` finds it (same warnings, same errors); ``None`` when there is no checkpoint."""

    def opened(folder: Path) -> Checkpoint:
        checkpoint = load_checkpoint(folder)
        if check is not None:
            check(checkpoint)
        return checkpoint

    return _newest(Path(root), opened)


def _newest(root: Path, open_checkpoint):
    """The first of ``open_checkpoint(folder)`` over the checkpoint folders, newest first, that does not
    raise :class:`CheckpointError`."""
    hint = _latest_hint(root)
    problems = []
    for folder in _checkpoint_folders(root):
        try:
            opened = open_checkpoint(folder)
        except CheckpointError as exc:
            problems.append(f"{folder.name}: {exc}")
            continue
        for problem in problems:
            warnings.warn(f"skipping checkpoint {problem}; resuming from {folder.name}", CheckpointWarning, 3)
        if hint is not None and hint != folder.name and not any(p.startswith(f"{hint}: ") for p in problems):
            warnings.warn(
                f"{root / LATEST} names {hint!r}; resuming from {folder.name}", CheckpointWarning, 3
            )
        return opened
    if not problems and hint is None:
        return None
    if not problems:
        problems.append(f"{LATEST} names {hint!r} but there is no iter_* folder")
    raise CheckpointError(
        f"no intact checkpoint to resume from in {root} ({'; '.join(problems)}); nothing was deleted: "
        "repair the checkpoints folder or move it away to start fresh"
    )


# ------------------------------------------------------------------------------------- the trainer's state
def gather_training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The model's and the optimizer's full state dicts, for :func:`save_checkpoint`: under FSDP2 gathered
    into rank 0's host memory one tensor at a time (a collective; empty on the other ranks)."""
    if not torch.distributed.is_initialized():
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}, optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return (
        get_model_state_dict(model, options=options),
        get_optimizer_state_dict(model, optimizer, options=options),
    )


def apply_training_state(
    checkpoint: Checkpoint, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Load ``checkpoint``'s model and optimizer state into a (possibly FSDP2) model and its optimizer."""
    if not torch.distributed.is_initialized():
        model.load_state_dict(checkpoint.model_state)
        optimizer.load_state_dict(checkpoint.optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, checkpoint.model_state, options=options)
    set_optimizer_state_dict(model, optimizer, checkpoint.optimizer_state, options=options)


def check_training_state(
    checkpoint: Checkpoint,
    model_shapes: dict[str, tuple[int, ...]],
    parameter_shapes: Sequence[tuple[int, ...]],
    last_iteration: int,
) -> None:
    """Refuse (:class:`CheckpointError`) a checkpoint that verifies and loads but could not continue this run:
    an iteration other than its folder's or outside ``[0, last_iteration]``, model weights whose names or
    shapes are not the model's (``model_shapes``: full shapes by name) or that are not finite, an optimizer
    state without its parts or whose moments do not have their parameters' shapes (``parameter_shapes``, in
    the optimizer's order; under FSDP2 the moments are keyed by parameter name and checked against
    ``model_shapes``).
    """
    number = int(_CHECKPOINT_NAME.fullmatch(checkpoint.folder.name).group(1))
    if checkpoint.iteration != number or not 0 <= number <= last_iteration:
        raise CheckpointError(
            f"state.json says iteration {checkpoint.iteration} in {checkpoint.folder.name} "
            f"(a run of {last_iteration} iterations)"
        )
    weights = checkpoint.model_state
    if not isinstance(weights, dict) or set(weights) != set(model_shapes):
        missing = sorted(set(model_shapes) - set(weights or {}))[:3]
        raise CheckpointError(f"model.pt does not hold this model's weights (missing e.g. {missing})")
    for name, tensor in weights.items():
        if not torch.is_tensor(tensor) or tuple(tensor.shape) != tuple(model_shapes[name]):
            raise CheckpointError(f"model.pt: {name} is not a tensor of shape {tuple(model_shapes[name])}")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"model.pt: {name} holds non-finite values")
    optimizer = checkpoint.optimizer_state
    if not isinstance(optimizer, dict) or not {"state", "param_groups"} <= set(optimizer):
        raise CheckpointError("optimizer.pt has no 'state' and 'param_groups'")
    for key, moments in optimizer["state"].items():
        shape = (
            model_shapes.get(key)
            if isinstance(key, str)
            else (
                parameter_shapes[key] if isinstance(key, int) and 0 <= key < len(parameter_shapes) else None
            )
        )
        if shape is None:
            raise CheckpointError(f"optimizer.pt: a state for an unknown parameter {key!r}")
        for part, tensor in moments.items():
            if torch.is_tensor(tensor) and tensor.dim() and tuple(tensor.shape) != tuple(shape):
                raise CheckpointError(f"optimizer.pt: {part} of {key!r} is not of shape {tuple(shape)}")


def load_fitting_checkpoint(
    root: Path, model: torch.nn.Module, parameters: Sequence[torch.Tensor], last_iteration: int
) -> Checkpoint | None:
    """The newest checkpoint under ``root`` that is intact and could continue a run of ``model`` trained by
    an optimizer over ``parameters`` for ``last_iteration`` iterations (:func:`load_latest_checkpoint` with
    :func:`check_training_state`); ``None`` when there is none."""
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}  # full shapes, DTensors too
    parameter_shapes = [tuple(p.shape) for p in parameters]
    return load_latest_checkpoint(
        root,
        check=lambda checkpoint: check_training_state(checkpoint, shapes, parameter_shapes, last_iteration),
    )


def save_training_state(
    root: Path,
    iteration: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    state: dict,
    config: dict,
    keep: int,
    writer: bool,
) -> None:
    """Checkpoint ``iteration`` of a (possibly FSDP2) model and its optimizer with the run's ``state`` and
    ``config`` (:func:`gather_training_state`, then :func:`save_checkpoint` by the ``writer``, rank 0). Every
    rank calls it: the gathering is a collective."""
    model_state, optimizer_state = gather_training_state(model, optimizer)
    if writer:
        save_checkpoint(
            root,
            iteration,
            save_model=lambda path: torch.save(model_state, path),
            optimizer_state=optimizer_state,
            state=state,
            config=config,
            keep=keep,
        )


def restore_training_state(
    root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, last_iteration: int
) -> Checkpoint | None:
    """Resume from the newest checkpoint under ``root`` that fits (:func:`load_fitting_checkpoint`): its
    weights and optimizer state loaded into ``model`` and the fresh ``optimizer``
    (:func:`apply_training_state`), the RNG states set; the checkpoint, or ``None`` (nothing changed) when
    there is none.

    Raises:
        CheckpointError: Checkpoints exist but none can be used (nothing is deleted).
    """
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    checkpoint = load_fitting_checkpoint(root, model, parameters, last_iteration)
    if checkpoint is not None:
        apply_training_state(checkpoint, model, optimizer)
        set_rng_state(checkpoint.rng_state)
    return checkpoint
