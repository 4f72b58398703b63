"""The benchmarks' harness: a settings dataclass as a command line, and the specs the results page finds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from benchmarks import report
from benchmarks.harness import ROOT, build_parser, option, parse_config, recorded_command


@dataclass
class Settings:
    sizes: list[int] = option([250_000, 500_000], "rows per batch")
    quick: bool = option(False, "a smoke run")
    server: str = option("vllm", "which server", choices=["vllm", "stand-in"])
    timeout_s: float | None = option(None, "seconds allowed")
    extra: list[str] = option([], "more overrides", nargs="*")

    def __post_init__(self):
        if any(size <= 0 for size in self.sizes):
            raise ValueError(f"--sizes must be positive, got {self.sizes}")


def test_each_field_is_a_flag_parsed_by_its_type():
    argv = ["--sizes", "10", "20", "--quick", "--timeout-s", "1.5", "--extra"]
    settings = parse_config(Settings, argv, "d")
    assert settings == Settings(sizes=[10, 20], quick=True, timeout_s=1.5, extra=[])
    assert parse_config(Settings, [], "d") == Settings()  # the defaults, lists not shared between configs
    assert Settings().sizes is not Settings().sizes


def test_help_shows_each_default_and_meaning():
    text = build_parser(Settings, "d", prog="bench").format_help()
    assert "--sizes SIZES [SIZES ...]" in text and "rows per batch (default: [250000, 500000])" in text
    assert "--timeout-s TIMEOUT_S" in text and "{vllm,stand-in}" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nope"], "bench: error: unrecognized arguments: --nope"),
        (["--sizes", "x"], "bench: error: argument --sizes: invalid int value: 'x'"),
        (["--server", "vlm"], "bench: error: argument --server: invalid choice: 'vlm'"),
        (["--sizes", "0"], "bench: error: --sizes must be positive, got [0]"),
    ],
)
def test_a_bad_command_line_is_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(Settings, argv, "d", prog="bench")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_the_recorded_command_quotes_its_arguments():
    assert recorded_command("benchmarks/x.py", ["--set", "a=b c"]) == "python benchmarks/x.py --set 'a=b c'"
    assert recorded_command("benchmarks/x.py", []) == "python benchmarks/x.py"


def test_every_benchmark_module_in_the_page_order_declares_its_specs():
    """A module that is renamed or loses its SPECS would silently leave the page: the order names only modules
    that declare them, and every spec's script is that module's file."""
    folder = ROOT / "benchmarks"
    assert all(report.declares_specs(folder / f"{name}.py") for name in report.PAGE_ORDER)
    scripts = list(dict.fromkeys(spec.script for spec in report.BENCHMARKS))  # in page order
    listed = [f"benchmarks/{name}.py" for name in report.PAGE_ORDER]
    assert scripts[: len(listed)] == listed
    assert "benchmarks/bench_vllm_engine.py" in scripts[len(listed) :]  # found, though not listed
    names = [spec.name for spec in report.BENCHMARKS]
    assert len(names) == len(set(names)), "two specs write the same result file"
    assert all(dataclasses.is_dataclass(spec) for spec in report.BENCHMARKS)


def test_specs_are_found_by_reading_a_module_not_running_it(tmp_path):
    (tmp_path / "bench_new.py").write_text("raise SystemExit('imported')\nSPECS = ()\n")
    (tmp_path / "helper.py").write_text("def f():\n    SPECS = ()\n")  # not at the top level
    assert report.declares_specs(tmp_path / "bench_new.py")
    assert not report.declares_specs(tmp_path / "helper.py")


def test_a_variant_process_parses_the_command_its_parent_builds(monkeypatch):
    """bench_update_memory runs each variant in a child process with its own command line: the child's
    settings are the parent's, with the one variant and chunk size."""
    from benchmarks import bench_update_memory as bench

    parent = bench.Settings(rows=2, layers=3, chunk_tokens=[64, 32], temperature=0.5)
    seen = {}

    def fake_run(command, **kwargs):
        seen["argv"] = command[2:]  # after the interpreter and the script
        raise RuntimeError("stop before the child runs")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match="stop"):
        bench._child(parent, "chunked", 64)
    child = parse_config(bench.Settings, seen["argv"], "d")
    assert child == dataclasses.replace(parent, child="chunked", chunk_tokens=[64])
