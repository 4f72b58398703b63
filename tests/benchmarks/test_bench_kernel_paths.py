"""The kernel-path benchmark: its comparison of two settings' outputs on hand-made tensors, its bad input, and
a smoke run of the three kernel settings (slow)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import bench_kernel_paths as kp


def _outputs(**changes):
    outputs = {
        "logits": torch.tensor([[0.5, -1.0], [2.0, 0.25]]),
        "params": {"a": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([[0.5], [-0.5]])},
        "tokens": torch.tensor([[7, 8, 9, 10], [11, 12, 13, 14]]),
        "sampled_logprobs": torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-0.5, -0.5, -0.5, -0.5]]),
        "losses": [3.0, 2.5, 2.0],
    }
    return {**outputs, **changes}


def test_a_setting_compared_with_itself_is_bit_identical():
    diff = kp.compare_runs(_outputs(), _outputs())
    assert diff == {
        "max_abs_logit_diff_init": 0.0,
        "param_fraction_differing": 0.0,
        "max_abs_param_diff": 0.0,
        "final_loss": 2.0,
        "final_loss_diff": 0.0,
        "token_agreement": 1.0,
        "max_abs_sampled_logprob_diff": 0.0,
        "bit_identical": True,
    }


def test_rounding_differences_are_counted_per_element_and_the_largest_is_kept():
    other = _outputs(
        logits=torch.tensor([[0.5, -1.0], [2.0, 0.375]]),  # one logit off by 0.125
        params={"a": torch.tensor([1.0, 2.0, 3.5]), "b": torch.tensor([[0.5], [-0.25]])},  # 2 of 5 differ
        tokens=torch.tensor([[7, 8, 9, 10], [11, 99, 98, 97]]),  # a flipped token and all after it: 3 of 8
        # row 0: same tokens, largest log-prob difference 0.25; row 1: 0.125 before its flip, then other
        # tokens in other contexts (differences of 3.0 that are not a rounding of the same quantity)
        sampled_logprobs=torch.tensor([[-1.0, -2.25, -3.0, -4.0], [-0.625, -3.5, -3.5, -3.5]]),
        losses=[3.0, 2.5, 2.25],
    )
    diff = kp.compare_runs(_outputs(), other)
    assert diff["max_abs_logit_diff_init"] == 0.125
    assert diff["param_fraction_differing"] == 2 / 5
    assert diff["max_abs_param_diff"] == 0.5
    assert diff["final_loss"] == 2.25 and diff["final_loss_diff"] == 0.25
    assert diff["token_agreement"] == 5 / 8
    assert diff["max_abs_sampled_logprob_diff"] == 0.25
    assert diff["bit_identical"] is False


@pytest.mark.parametrize(
    "field,value",
    [
        ("logits", torch.tensor([[0.5, -1.0], [2.0, 0.25 + 2**-20]])),
        ("params", {"a": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([[0.5], [-0.5 + 2**-20]])}),
        ("losses", [3.0, 2.5 + 2**-20, 2.0]),  # an earlier step differs, the final loss does not
        ("tokens", torch.tensor([[7, 8, 9, 10], [11, 12, 13, 15]])),
        ("sampled_logprobs", torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-0.5, -0.5, -0.5, -0.5 + 2**-20]])),
    ],
)
def test_any_single_difference_breaks_bit_identity(field, value):
    assert kp.compare_runs(_outputs(), _outputs(**{field: value}))["bit_identical"] is False


def test_a_first_token_that_differs_leaves_no_log_prob_to_compare():
    other = _outputs(
        tokens=torch.tensor([[1, 8, 9, 10], [2, 12, 13, 14]]),  # every row flips at its first token
        sampled_logprobs=torch.zeros(2, 4),
    )
    diff = kp.compare_runs(_outputs(), other)
    assert diff["max_abs_sampled_logprob_diff"] == 0.0 and diff["token_agreement"] == 6 / 8


def test_mismatched_settings_are_a_clear_error():
    with pytest.raises(ValueError, match="different parameter names"):
        kp.compare_runs(_outputs(), _outputs(params={"a": torch.tensor([1.0, 2.0, 3.0])}))
    with pytest.raises(ValueError, match=r"parameter b: shapes differ"):
        kp.compare_runs(
            _outputs(), _outputs(params={"a": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([0.5, -0.5])})
        )
    with pytest.raises(ValueError, match="tokens shapes differ"):
        kp.compare_runs(_outputs(), _outputs(tokens=torch.tensor([[7, 8]])))


def test_bad_arguments_are_rejected_before_any_work(capsys):
    with pytest.raises(SystemExit):
        kp.main(["--steps", "0"])
    assert "--steps and --sample-tokens must be >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_smoke_run_compares_the_three_kernel_settings(tmp_path):
    out = tmp_path / "kernel_paths.json"
    assert kp.main(["--steps", "2", "--sample-tokens", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["results"]) == [name for name, _ in kp.SETTINGS]
    best, again, default = result["results"].values()
    assert best["bit_identical"] and again["bit_identical"]  # the same kernels, the same numbers
    assert best["capability"] == again["capability"] and default["capability"] == "DEFAULT"
    assert [len(losses) for losses in result["losses"].values()] == [2, 2, 2]
    assert out.with_suffix(".png").stat().st_size > 0
