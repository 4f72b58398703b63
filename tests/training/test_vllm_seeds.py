"""The vLLM engine's per-request seeds: integers derived from the rollout's generator on its own device
(no vLLM needed; the engine itself is tested in ``test_vllm_engine.py``)."""

from __future__ import annotations

import torch

from training.vllm_engine import base_seed, request_seeds


def test_request_seeds_are_a_pure_function_of_the_base():
    seeds = request_seeds(12345, 64)
    assert seeds == request_seeds(12345, 64)
    assert request_seeds(12345, 8) == seeds[:8]  # a request's seed does not depend on the batch size
    assert seeds != request_seeds(12346, 64)
    assert all(isinstance(s, int) and 0 <= s < 2**31 - 1 for s in seeds)
    assert len(set(seeds)) == 64
    # pinned: the same seeds on every machine and engine (numpy's PCG64 is stable across releases)
    assert request_seeds(0, 3) == [1826701614, 1367864806, 1097657231]


def test_base_seed_follows_the_generator_and_advances_it():
    first = base_seed(torch.Generator().manual_seed(3))
    assert first == base_seed(torch.Generator().manual_seed(3))
    assert first != base_seed(torch.Generator().manual_seed(4))
    generator = torch.Generator().manual_seed(3)
    draws = [base_seed(generator) for _ in range(3)]
    assert draws[0] == first and len(set(draws)) == 3  # consecutive rollout steps draw different seeds


def test_base_seed_draws_on_the_generators_device():
    """The crash of issue 15: ``torch.randint(..., generator=<CUDA generator>)`` on CPU. The draw happens
    where the generator lives (a CUDA generator when a GPU is here, else a CPU one)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(0)
    assert isinstance(base_seed(generator), int)
    assert isinstance(base_seed(None), int)
