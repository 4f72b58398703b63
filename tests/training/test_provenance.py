"""The record of what a run was measured with (``training.provenance``): the machine, the packages, the
commit, and that reading them never fails on a machine that lacks one of the sources."""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys

import torch

from training import provenance

X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512bw amx_tile avx2 fma

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512bw amx_tile fma
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd sve crc32 atomics
CPU implementer\t: 0x41
"""


def test_the_record_names_the_machine_the_packages_and_the_commit():
    record = provenance.environment()
    json.dumps(record)  # goes into summary.json and result files as it is
    assert record["cpu_count"] >= 1 and re.fullmatch(r"\d+\.\d+\.\d+\S*", record["python"])
    for name in ("torch", "transformers", "numpy", "tokenizers", "gymnasium"):
        assert record["packages"][name] == importlib.metadata.version(name), name
    build = record["torch_build"]  # this process has imported torch
    assert build["version"] == torch.__version__
    assert build["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert build["num_threads"] == torch.get_num_threads() and build["config"]
    assert re.fullmatch(r"[0-9a-f]{40}", record["git"]["commit"]) and isinstance(record["git"]["dirty"], bool)


def test_cpu_model_and_flags_are_read_from_cpuinfo(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(X86_CPUINFO)
    monkeypatch.setattr(provenance, "CPUINFO", cpuinfo)
    info = provenance.cpu_info()
    assert info["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+"
    # the first processor's flags, each once, sorted: two records compare by plain string equality
    assert info["cpu_flags"] == "amx_tile avx2 avx512bw avx512f fma fpu sse2"

    cpuinfo.write_text(ARM_CPUINFO)  # Arm: no model name line, "Features" instead of "flags"
    monkeypatch.setattr(provenance.platform, "processor", lambda: "aarch64")
    info = provenance.cpu_info()
    assert info["cpu_model"] == "aarch64" and info["cpu_flags"] == "asimd atomics crc32 fp sve"


def test_a_machine_without_proc_cpuinfo_still_gets_a_record(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "CPUINFO", tmp_path / "absent")
    monkeypatch.setattr(provenance.platform, "system", lambda: "Linux")
    monkeypatch.setattr(provenance.platform, "processor", lambda: "")
    record = provenance.environment()
    assert record["cpu_model"] is None and record["cpu_flags"] is None
    assert record["cpu_count"] >= 1 and record["packages"]["numpy"]


def test_a_process_without_torch_records_no_build_and_does_not_import_it(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")
    assert provenance.torch_build() is None
    assert "torch" not in sys.modules


def test_an_installed_copy_outside_a_checkout_has_no_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    assert provenance.git_commit() == {"commit": None, "dirty": None}
