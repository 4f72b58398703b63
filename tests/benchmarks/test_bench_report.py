"""The results page: rendering from fixture JSONs, missing and malformed results, the published numbers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks import credit_diagnostics, report
from benchmarks.lib.markdown import markdown_table

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def page(tmp_path) -> str:
    results = tmp_path / "results"
    shutil.copytree(FIXTURES, results)
    shutil.copy(report.RESULTS_DIR / "published.json", results)  # the committed papers' numbers
    (results / "credit_diagnostics.png").write_bytes(b"\x89PNG")
    return report.render_page(results)


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


def test_credit_diagnostics_section(page):
    text = section(page, "credit_diagnostics")
    # steps with an exact-prefix peer as measured, the paper's share without one (44.5%) beside it
    assert "| alfworld | p=0.5 | 100 | 8 | 0.625 | 0.5 | 0.25 | 0.445 | 0.875 |" in text
    # the summary covers every ranked column (progpo leads each in this fixture)
    assert "| alfworld | p=0.5 | progpo 0.75 | progpo 0.31 | progpo 0.3 | progpo 0.4 | progpo 0.7 |" in text
    assert "| progpo | 0.75 | 0.31 | 0.3 | 0.4 | 0.7 | 1.5 | 0.5 |" in text
    assert "| grpo | 0 | 0.1235 | 0.2 | — | — | 1 | 0 |" in text
    assert "recording failed: `RuntimeError: no catalog`" in text
    assert "commit: `0123456789ab` (with local changes)" in text
    assert "recorded command: `python benchmarks/credit_diagnostics.py --quick`" in text
    assert "machine: cpu_count 2, python 3.11.7, platform Linux-test, load 1.5" in text
    assert "![credit_diagnostics.png](results/credit_diagnostics.png)" in text


def test_compare_estimators_section_lists_every_run(page):
    text = section(page, "compare_estimators")
    assert "| alfworld / grpo | 0.250 ± 0.071 (n=2) | 0.100 ± 0.000 (n=2) | 2 / 2 |" in text
    # the shared warm start heads its env's rows, and one run's commands are printed to reproduce it
    assert "| alfworld / *warm start, before RL* | 0.1 | 0.2 | — |\n| alfworld / grpo |" in text
    # estimator minus GRPO, paired by seed: progpo's seed 0 (0.5 - 0.2); its timed-out seed 1 has no pair
    assert "| alfworld / progpo | +0.300 ± 0.000 (n=1) |" in text
    assert "- `alfworld` warm start: `python -m training.cli seed=0 iterations=0 run_dir=runs/cmp" in text
    assert "- then `alfworld` grpo, seed 0: `python -m training.cli seed=0 algo.name=grpo model.path=" in text
    assert "| alfworld / progpo | 0.500 (n=1) | 0.050 (n=1) | 1 / 2 |" in text
    assert (
        "| alfworld | progpo | 1 | timeout | 900 | — | — | — |" in text
    )  # the timed-out run is in the table


def test_missing_malformed_and_generic_results(page):
    assert "**Results: not run yet.**" in section(page, "training")
    assert "**Results: not run yet.**" in section(page, "webshop")
    assert "unreadable `alfworld.json`" in section(page, "alfworld")
    # a curated renderer that does not fit the JSON falls back to the generic table instead of failing
    assert "| results | unexpected shape |" in section(page, "advantages")
    hosting = section(page, "hosting")
    assert "| workers | 2 |" in hosting
    assert "| alfworld | 12.5 | 2.7 |" in hosting and "| webshop | 1874 | — |" in hosting


def test_credit_summary_ranks_every_column_not_only_the_leader():
    estimators = {
        "grpo": {"nonzero_step_fraction": 0.0, "corr_progress": 0.5, "corr_expert": 0.2},
        "gigpo": {"nonzero_step_fraction": 0.9, "corr_progress": 0.5, "corr_expert": 0.1},
        "progpo": {"nonzero_step_fraction": 0.75, "corr_progress": 0.25, "corr_expert": 0.3},
    }
    data = {"sources": {"rollouts": {"warm_start.jsonl": {"estimators": estimators}}}}
    assert (
        "| rollouts | warm_start.jsonl | gigpo 0.9; progpo 0.75 (2/3) | grpo = gigpo 0.5; progpo 0.25 (3/3) "
        "| progpo 0.3 | — | — |"
    ) in credit_diagnostics._credit_summary(data)


def test_quickstart_section(page):
    text = section(page, "quickstart")
    assert "| 0 | 0.25 ± 0.03 → 0.5 ± 0.03 | 0.5 ± 0.03 → 0.875 ± 0.03 | +0.25 | +0.375 |" in text
    assert "| 1 | 0.25 ± 0.03 → 0.125 ± 0.03 | 0.25 ± 0.03 → 0.625 ± 0.03 | -0.125 | +0.375 |" in text
    # mean ± sample std over the 3 RL seeds
    assert "| mean ± std (n = 3) | 0.2083 ± 0.07217 → 0.3333 ± 0.1909 |" in text
    assert "Success on held-out tasks rose in 2 and fell in 1 of 3 RL seeds." in text
    assert "783 s wall, 782 s user CPU, 12 s system CPU, 1.2 GB peak RSS" in text
    assert "- `python -m training.cli --run-dir runs/quickstart progress=false`" in text


def test_quickstart_async_section_compares_with_the_lockstep_runs(page):
    text = section(page, "quickstart_async")
    assert "`rollout.mode=async`, `rollout.max_staleness=1`" in text and "`--warm-start-from`" in text
    # success after RL beside the baseline's mean ± std and seed range, and the verdicts
    assert (
        "| held-out tasks | 0.3958 ± 0.1909 | 0.3333 ± 0.1909 | 0.125 … 0.5 | +0.0625 | yes | yes |" in text
    )
    assert "| mean ± std (n = 3) |" in text  # the runs' own table follows


def test_async_rollouts_section(page):
    text = section(page, "async_rollouts")
    assert "| transformers | alfworld_quickstart | 8 | 12 | 1.5 | 80 | 120 | 1.5 | 16/16 |" in text
    assert "| vllm | alfworld_quickstart | 10.67 | 32 | 3 |" in text
    assert "| async_staleness_1 | 10 | 2 | 7.5 | 0.75 | 0.6 |" in text
    assert "staleness_1_vs_0_speedup 1.6" in text
    assert "| vllm_eager_10ms | 275 | 110 | 2.5 |" in text and "a model, not a measurement" in text
    assert "measured 3× env steps/s, 3× tokens/s; met: yes." in text


def test_quickstart_section_without_result_file(tmp_path):
    text = section(report.render_page(tmp_path), "quickstart")
    assert "**Results: not run yet.**" in text and "benchmarks/quickstart.py" in text


def test_published_numbers_and_differences(page):
    assert "| GiGPO w/ std | 94.4 | 67.5 | 94.8 | 94.4 | 79.8 | 76.4 | 86.7 ±1.7 | 83.1 | 65.0 ±3.2 |" in page
    assert "| ALFWorld All | Qwen2.5-7B-Instruct | 83.33 | 94.27 | 95.31 |" in page
    assert "0.337 on webshop, 0.445 on alfworld" in page
    assert "What differs in ours" in page and "1.18M-product shop" in page
    assert "### published" not in page  # the papers' numbers are not one of our benchmarks


def test_published_numbers_missing(tmp_path):
    assert "**`results/published.json` is missing or unreadable.**" in report.render_page(tmp_path)


def test_empty_results_dir_renders_every_benchmark_as_not_run(tmp_path):
    page = report.render_page(tmp_path)
    assert page.count("**Results: not run yet.**") == len(report.BENCHMARKS)


def test_main_writes_and_checks(tmp_path):
    out = tmp_path / "README.md"
    assert report.main(["--results", str(FIXTURES), "--out", str(out)]) == 0
    assert report.main(["--results", str(FIXTURES), "--out", str(out), "--check"]) == 0
    out.write_text(out.read_text() + "edited\n")
    assert report.main(["--results", str(FIXTURES), "--out", str(out), "--check"]) == 1


def test_openenv_section_shows_the_ratio_and_whether_it_meets_the_goal(page):
    text = section(page, "openenv")
    assert "| env | native steps/s | OpenEnv steps/s | throughput ratio |" in text
    assert "| progpo/ALFWorld-v0 | 50 | 35 | 0.7 | 1300 | 1600 | 1.231 | no | 0 |" in text
    assert "| progpo/WebShop-v0 | 300 | 700 | 2.333 | 290 | 110 | 0.3793 | yes | 1 |" in text
    assert "ratio >= 0.8" in text and "32 concurrent sessions per protocol" in text
