"""``progpo bench``: help, listing, dry run; subprocess runs tolerate missing and failing scripts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import cli, report
from benchmarks.harness import Benchmark


def test_help_via_subprocess():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.cli", "--help"],
        cwd=report.ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0
    assert "progpo bench" in proc.stdout and "--report-only" in proc.stdout


def test_list_shows_every_benchmark_and_its_suite(capsys):
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    for bench in report.BENCHMARKS:
        assert f"{bench.name} " in out and bench.script in out
    assert "benchmarks/bench_estimators.py speed --quick" in out


def test_dry_run_prints_quick_commands_and_writes_nothing(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "PAGE", tmp_path / "README.md")
    assert cli.main(["--dry-run", "--only", "advantages", "eval_concurrency_stand_in"]) == 0
    out = capsys.readouterr().out
    assert "benchmarks/bench_estimators.py speed --quick" in out
    assert "benchmarks/bench_eval.py concurrency --server stand-in --quick" in out
    assert not (tmp_path / "README.md").exists()


def test_full_runs_use_each_result_files_own_arguments(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "PAGE", tmp_path / "README.md")
    assert (
        cli.main(["--dry-run", "--full", "--only", "compare_estimators", "compare_estimators_quickstart_rl"])
        == 0
    )
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("==> ")]
    assert commands[0].endswith("benchmarks/bench_estimators.py rl --setting cpu")
    # its own setting, hence its own result file: not the cpu setting's
    assert commands[1].endswith("benchmarks/bench_estimators.py rl --setting cpu_quickstart_rl")


def test_unknown_benchmark_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--only", "nope"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["--skip", "advantage"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("progpo bench: error: unknown benchmark 'nope'")
    assert "(did you mean 'advantages'?)" in err[1]  # one line, naming the fix


def test_missing_and_failing_scripts_are_tolerated(monkeypatch, tmp_path, capsys):
    (tmp_path / "ok.py").write_text("import sys; sys.exit(0)\n")
    (tmp_path / "bad.py").write_text("import sys; sys.exit(3)\n")
    benches = [
        Benchmark("ok", script="ok.py"),
        Benchmark("bad", script="bad.py"),
        Benchmark("missing", script="missing.py"),
        Benchmark("noquick", quick=False, script="ok.py"),
    ]
    monkeypatch.setattr(cli, "BENCHMARKS", benches)
    monkeypatch.setattr(cli, "ROOT", tmp_path)
    monkeypatch.setattr(cli, "PAGE", tmp_path / "README.md")
    monkeypatch.setattr(cli, "RESULTS_DIR", tmp_path / "results")
    assert cli.main([]) == 1  # one benchmark failed
    out = capsys.readouterr().out
    assert (
        "failed (rc 3)" in out and "skipped (script missing)" in out and "skipped (no quick version)" in out
    )
    assert (tmp_path / "README.md").read_text().startswith("# Benchmarks and results")
