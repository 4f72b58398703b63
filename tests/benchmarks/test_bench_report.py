"""The results page: rendering from fixture JSONs, missing and malformed results, the published numbers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.lib.markdown import markdown_table

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def page(tmp_path) -> str:
    results = tmp_path / "results"
    shutil.copytree(FIXTURES, results)
    (results / "hosting.png").write_bytes(b"\x89PNG")
    return report.render_page(results)  # with the committed papers' numbers


def section(page: str, name: str) -> str:
    start = page.index(f"### {name}\n")
    end = page.find("\n### ", start + 1)
    return page[start:] if end < 0 else page[start:end]


def test_markdown_table_formats_cells():
    table = markdown_table(["a", "b", "c"], [[0.123456, None, "x|y"], [True, [1, 2], 3]])
    assert table.splitlines() == [
        "| a | b | c |",
        "|---|---|---|",
        "| 0.1235 | — | x\\|y |",
        "| yes | 1, 2 | 3 |",
    ]


def test_a_section_names_its_file_command_machine_and_plot(page):
    text = section(page, "hosting")
    quick = "quick: `python benchmarks/bench_hosting.py hosting --quick`"
    assert f"Run: `python benchmarks/bench_hosting.py hosting` · {quick}" in text
    assert "recorded command: `python benchmarks/bench_hosting.py hosting`" in text
    assert "![hosting.png](results/hosting.png)" in text


#: Lines each section shows, rendered from the fixture results.
SHOWN = {
    "compare_estimators": [
        "| alfworld / grpo | 0.250 ± 0.071 (n=2) | 0.100 ± 0.000 (n=2) | 2 / 2 |",
        # the shared warm start heads its env's rows
        "| alfworld / *warm start, before RL* | 0.1 | 0.2 | — |\n| alfworld / grpo |",
        # estimator minus GRPO, paired by seed: progpo's seed 0 (0.5 - 0.2); its timed-out seed 1 has no pair
        "| alfworld / progpo | +0.300 ± 0.000 (n=1) |",
        # one run's commands are printed to reproduce it
        "- `alfworld` warm start: `python -m training.cli seed=0 iterations=0 run_dir=runs/cmp",
        "- then `alfworld` grpo, seed 0: `python -m training.cli seed=0 algo.name=grpo model.path=",
        "| alfworld / progpo | 0.500 (n=1) | 0.050 (n=1) | 1 / 2 |",
        "| alfworld | progpo | 1 | timeout | 900 | — | — | — |",  # the timed-out run is in the table
    ],
    "quickstart": [
        "| 0 | 0.25 ± 0.03 → 0.5 ± 0.03 | 0.5 ± 0.03 → 0.875 ± 0.03 | +0.25 | +0.375 |",
        "| 1 | 0.25 ± 0.03 → 0.125 ± 0.03 | 0.25 ± 0.03 → 0.625 ± 0.03 | -0.125 | +0.375 |",
        "| mean ± std (n = 3) | 0.2083 ± 0.07217 → 0.3333 ± 0.1909 |",  # mean ± sample std over 3 RL seeds
        "Success on held-out tasks rose in 2 and fell in 1 of 3 RL seeds.",
        "783 s wall, 782 s user CPU, 12 s system CPU, 1.2 GB peak RSS",
        "- `python -m training.cli --run-dir runs/quickstart progress=false`",
    ],
    "async_rollouts": [
        "| transformers | alfworld_quickstart | 8 | 12 | 1.5 | 80 | 120 | 1.5 | 16/16 |",
        "| vllm | alfworld_quickstart | 10.67 | 32 | 3 |",
        "| async_staleness_1 | 10 | 2 | 7.5 | 0.75 | 0.6 |",
        "staleness_1_vs_0_speedup 1.6",
        "| vllm_eager_10ms | 275 | 110 | 2.5 |",
        "a model, not a measurement",
        "measured 3× env steps/s, 3× tokens/s; met: yes.",
    ],
    # no renderer of its own: the generic tables
    "hosting": ["| workers | 2 |", "| alfworld | 12.5 | 2.7 |", "| webshop | 1874 | — |"],
}


@pytest.mark.parametrize("name", sorted(SHOWN))
def test_a_section_shows_its_results(page, name):
    text = section(page, name)
    assert [line for line in SHOWN[name] if line not in text] == []


def test_missing_malformed_and_generic_results(page):
    assert "**Results: not run yet.**" in section(page, "weight_sync")
    assert "**Results: not run yet.**" in section(page, "webshop")
    assert "unreadable `alfworld.json`" in section(page, "alfworld")
    # a curated renderer that does not fit the JSON falls back to the generic table instead of failing
    assert "| results | unexpected shape |" in section(page, "advantages")


def test_quickstart_async_section_compares_with_the_lockstep_runs(page):
    text = section(page, "quickstart_async")
    assert (
        "`rollout.mode=async`, `rollout.max_staleness=1`; every seed starts RL from the default job's" in text
    )
    # success after RL beside the baseline's mean ± std and seed range, and the verdicts
    assert (
        "| held-out tasks | 0.3958 ± 0.1909 | 0.3333 ± 0.1909 | 0.125 … 0.5 | +0.0625 | yes | yes |" in text
    )
    assert "| mean ± std (n = 3) |" in text  # the runs' own table follows


def test_quickstart_section_without_result_file(tmp_path):
    text = section(report.render_page(tmp_path), "quickstart")
    assert "**Results: not run yet.**" in text and "benchmarks/bench_training.py quickstart" in text


def test_published_numbers_and_differences(page):
    assert "| GiGPO w/ std | 94.4 | 67.5 | 94.8 | 94.4 | 79.8 | 76.4 | 86.7 ±1.7 | 83.1 | 65.0 ±3.2 |" in page
    assert "| ALFWorld All | Qwen2.5-7B-Instruct | 83.33 | 94.27 | 95.31 |" in page
    assert "0.337 on webshop, 0.445 on alfworld" in page
    assert "What differs in ours" in page and "1.18M-product shop" in page
    assert "### published" not in page  # the papers' numbers are not one of our benchmarks


def test_published_numbers_missing(tmp_path):
    assert "**`data/published.json` is missing or unreadable.**" in report.render_page(tmp_path, tmp_path)


def test_a_result_no_benchmark_declares_is_shown_with_its_own_command(tmp_path):
    (tmp_path / "orphan.json").write_text('{"command": "python benchmarks/gone.py", "x": 1.5}')
    text = section(report.render_page(tmp_path), "orphan")
    assert (
        "(a result file no benchmark declares)" in text
        and "recorded command: `python benchmarks/gone.py`" in text
    )


def test_every_result_file_has_a_measures_paragraph_and_every_paragraph_a_result_file():
    measures = report.read_measures(report.MEASURES.read_text())
    assert sorted(measures) == sorted(b.name for b in report.BENCHMARKS)
    assert all(len(b.measures) > 40 for b in report.BENCHMARKS)


def test_empty_results_dir_renders_every_benchmark_as_not_run(tmp_path):
    page = report.render_page(tmp_path)
    assert page.count("**Results: not run yet.**") == len(report.BENCHMARKS)


def test_main_writes_and_checks(tmp_path):
    out = tmp_path / "README.md"
    assert report.main(["--results", str(FIXTURES), "--out", str(out)]) == 0
    assert report.main(["--results", str(FIXTURES), "--out", str(out), "--check"]) == 0
    out.write_text(out.read_text() + "edited\n")
    assert report.main(["--results", str(FIXTURES), "--out", str(out), "--check"]) == 1
