"""What a result was measured with: the machine, the software and the code, as one JSON-ready record.

An RL run's numbers follow its floating-point results, and those follow the CPU kernels that computed them
(torch picks AVX2 or AVX-512 code by the CPU's flags; MKL dispatches by CPU vendor and model) and the package
versions that were installed: one sampled token that flips changes every trajectory after it. So every
training run (``summary.json``'s ``environment``) and every benchmark result (``benchmarks.common
.machine_info``) records :func:`environment`, and two runs that disagree are diagnosed by diffing their
records. The fields:

* ``cpu_model``, ``cpu_flags`` (the instruction-set flags, sorted, space-separated), ``cpu_count`` — from
  ``/proc/cpuinfo`` on Linux, ``sysctl`` on macOS, else ``platform.processor()``; ``None`` where unknown
  (reading them never raises);
* ``python``, ``platform``;
* ``torch_build`` — the build of the torch this process runs (version with its local label, CUDA version,
  the CPU capability its kernels dispatch to, oneDNN, threads, ``torch.__config__.show()``), or ``None`` in
  a process that never imported torch (recording it must not load torch into, say, a WebShop benchmark);
* ``packages`` — every installed distribution's version, by name;
* ``git`` — :func:`git_commit` of the source tree the code was imported from.

Example:
    >>> import importlib.metadata
    >>> record = environment()
    >>> sorted(record)
    ['cpu_count', 'cpu_flags', 'cpu_model', 'git', 'packages', 'platform', 'python', 'torch_build']
    >>> record["packages"]["numpy"] == importlib.metadata.version("numpy")
    True
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The source tree's root (where ``.git`` is in a checkout; absent in an installed copy).
ROOT = Path(__file__).resolve().parents[1]
#: Linux's CPU description (a module constant so that tests can point it elsewhere).
CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo_field(text: str, names: tuple[str, ...]) -> str | None:
    """The value of the first line whose key is one of ``names`` (``key<tabs>: value``)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in names and value.strip():
            return value.strip()
    return None


def _sysctl(name: str) -> str | None:
    try:
        done = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def cpu_info() -> dict[str, Any]:
    """``{"cpu_model", "cpu_flags", "cpu_count"}`` of this machine; a field that cannot be read is ``None``.

    ``cpu_flags`` are the instruction-set extensions (x86 ``flags``, Arm ``Features``), sorted and joined by
    spaces, e.g. ``"... avx avx2 ... avx512f ..."``.
    """
    model = flags = None
    try:
        text = CPUINFO.read_text(errors="replace")
    except OSError:
        text = ""
    if text:
        model = _cpuinfo_field(text, ("model name", "Model", "Hardware", "cpu model"))
        flags = _cpuinfo_field(text, ("flags", "Features"))
    elif platform.system() == "Darwin":
        model = _sysctl("machdep.cpu.brand_string")
        features = " ".join(
            filter(None, (_sysctl("machdep.cpu.features"), _sysctl("machdep.cpu.leaf7_features")))
        )
        flags = features.lower() or None
    if model is None:
        model = platform.processor() or None
    return {
        "cpu_model": model,
        "cpu_flags": " ".join(sorted(set(flags.split()))) if flags else None,
        "cpu_count": os.cpu_count(),
    }


def torch_build() -> dict[str, Any] | None:
    """The build of the torch already imported in this process, or ``None`` when torch is not imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return {
            "version": torch.__version__,
            "cuda": torch.version.cuda,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkldnn": torch.backends.mkldnn.is_available(),
            "num_threads": torch.get_num_threads(),
            "config": torch.__config__.show().strip().splitlines(),
        }
    except Exception as error:  # a partly initialised or unusual build must not stop a run's record
        return {"version": getattr(torch, "__version__", None), "error": repr(error)}


def package_versions() -> dict[str, str]:
    """Every installed distribution's version, by its name as published, sorted case-insensitively."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name not in found:  # the first on sys.path is the one imported
            found[name] = dist.version
    return dict(sorted(found.items(), key=lambda item: item[0].lower()))


def git_commit() -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the source tree (read-only git calls); dirty =
    changed or untracked files exist, i.e. the numbers may come from code that is not in that commit. Both
    are ``None`` outside a git checkout (an installed copy) or without git."""
    if not (ROOT / ".git").exists():  # an installed copy: a repository around site-packages is not ours
        return {"commit": None, "dirty": None}
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if sha.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": sha.stdout.strip(), "dirty": bool(status.stdout.strip())}


def environment() -> dict[str, Any]:
    """The machine, software and code of this process (the fields are in the module docstring)."""
    return {
        **cpu_info(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_build": torch_build(),
        "packages": package_versions(),
        "git": git_commit(),
    }


def weights_digest(folder: Path) -> str | None:
    """SHA-256 of a saved model's weights (``model.safetensors``; None when absent): two runs with equal
    digests computed the same numbers bit for bit, so a user can tell whether their machine reproduces ours
    exactly or only within the spread (``progpo train`` prints those of its warm start and final weights and
    writes them into ``summary.json``'s ``weights_sha256``).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "model.safetensors").write_bytes(b"abc")
        >>> weights_digest(d)[:12], weights_digest(d / "missing")
        ('ba7816bf8f01', None)
    """
    path = folder / "model.safetensors"
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
