"""The benchmarks' harness: a settings dataclass as a command line, a suite's parts, the result file a part
writes, and the specs the results page finds."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.harness import (
    ROOT,
    Benchmark,
    Part,
    add_options,
    option,
    parse_config,
    recorded_command,
    run_suite,
    settings_argv,
)
from progpo_base.usage import CommandParser


@dataclass
class Settings:
    sizes: list[int] = option([250_000, 500_000], "rows per batch")
    quick: bool = option(False, "a smoke run")
    server: str = option("vllm", "which server", choices=["vllm", "stand-in"])
    timeout_s: float | None = option(None, "seconds allowed")
    extra: list[str] = option([], "more overrides", nargs="*")
    out: Path | None = option(None, "result file")

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
    text = add_options(CommandParser(prog="bench", description="d"), Settings).format_help()
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


def test_settings_go_to_a_child_process_as_the_flags_that_parse_back_to_them():
    """A part measured in a process of its own (update_memory's variants, weight_sync's paths) gets its
    parent's settings as flags, with its own changes; ``out`` is the child's own."""
    parent = Settings(sizes=[3], timeout_s=2.5, extra=["a=1", "b=2"], out=Path("x.json"))
    argv = settings_argv(parent, quick=True, server="stand-in")
    assert parse_config(Settings, argv, "d") == dataclasses.replace(
        parent, quick=True, server="stand-in", out=None
    )
    assert settings_argv(Settings()) == []


def run_demo(settings: Settings) -> dict:
    """A demo part."""
    return {"sizes": settings.sizes, "machine": {"demo": 1}, "failed": ["too slow"] if settings.quick else []}


def test_a_part_writes_its_result_with_the_command_that_reruns_it(tmp_path, capsys):
    specs = [Benchmark("demo", ["speed"])]
    parts = {"speed": Part(Settings, run_demo, name="demo")}
    out = tmp_path / "demo.json"
    assert (
        run_suite(str(ROOT / "benchmarks" / "demo.py"), parts, specs, "Demo.", ["speed", "--out", str(out)])
        == 0
    )
    result = json.loads(out.read_text())
    assert result["benchmark"] == "demo" and result["sizes"] == [250_000, 500_000]
    assert result["command"] == f"python benchmarks/demo.py speed --out {out}"
    machine = result["machine"]
    assert machine["demo"] == 1 and "cpu_model" in machine and len(machine["load_average_after"]) == 3
    assert f"wrote {out}" in capsys.readouterr().out
    # a non-empty ``failed`` list is exit status 1; a bad part name is a usage error
    assert (
        run_suite(
            str(ROOT / "benchmarks" / "demo.py"),
            parts,
            specs,
            "Demo.",
            ["speed", "--quick", "--out", str(out)],
        )
        == 1
    )
    with pytest.raises(SystemExit) as exc:
        run_suite(str(ROOT / "benchmarks" / "demo.py"), parts, specs, "Demo.", ["sped"])
    assert exc.value.code == 2


def test_every_suite_in_the_page_order_declares_its_specs():
    """A suite that is renamed or loses its SPECS would silently leave the page; every spec's script is its
    suite's file, and no two specs write the same result file."""
    folder = ROOT / "benchmarks"
    assert all(report.declares_specs(folder / f"{name}.py") for name in report.PAGE_ORDER)
    scripts = list(dict.fromkeys(spec.script for spec in report.BENCHMARKS))
    assert scripts[: len(report.PAGE_ORDER)] == [f"benchmarks/{name}.py" for name in report.PAGE_ORDER]
    names = [spec.name for spec in report.BENCHMARKS]
    assert len(names) == len(set(names)), "two specs write the same result file"


def test_every_result_file_is_one_command_away():
    """Each committed result has a top-level ``command`` naming a suite that exists, and a spec."""
    specs = {spec.name: spec for spec in report.BENCHMARKS}
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        command = json.loads(path.read_text()).get("command", "")
        scripts = [
            word for word in command.split() if word.startswith("benchmarks/") and word.endswith(".py")
        ]
        assert scripts and all((ROOT / s).is_file() for s in scripts), f"{path.name}: command {command!r}"
        assert path.stem in specs and specs[path.stem].script in scripts, path.name


def test_specs_are_found_by_reading_a_module_not_running_it(tmp_path):
    (tmp_path / "bench_new.py").write_text("raise SystemExit('imported')\nSPECS = ()\n")
    (tmp_path / "helper.py").write_text("def f():\n    SPECS = ()\n")  # not at the top level
    assert report.declares_specs(tmp_path / "bench_new.py")
    assert not report.declares_specs(tmp_path / "helper.py")
