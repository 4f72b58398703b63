"""Constants and helpers shared by the training tests (a module with a unique name: every test folder has a
``conftest.py``, so tests import from here, never from ``conftest``)."""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

from tests.paths import REPO_ROOT, repo_on_pythonpath

REPO = REPO_ROOT

#: Make the toy env (``progpo_envs.testing.DrawerEnv``) from any process (Gymnasium imports the module first).
TOY_ENV_ID = "progpo_envs.testing:progpo-test/ToyALFWorld-v0"

#: A seconds-long run with a tiny model, on whatever env the preset names (no env setting is among them).
TINY_RUN = [
    "model.tiny.vocab_size=2048",
    "model.tiny.hidden_size=64",
    "model.tiny.intermediate_size=128",
    "rollout.num_groups=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "rollout.max_prompt_tokens=512",
    "eval.rl_tasks=false",
    "warm_start.num_tasks=4",
    "warm_start.lm_epochs=1",
    "warm_start.epochs=1",
    "eval.num_tasks=2",
    "eval.seeds=1",
    "tensorboard=false",
    "progress=false",
    "num_threads=1",
    "optim.micro_batch_rows=4",
    "optim.mini_batch_rows=8",
]

#: Overrides that turn any preset into a seconds-long run on the toy env with a tiny model.
TINY_OVERRIDES = [
    f"env.id={TOY_ENV_ID}",
    "env.max_steps=4",
    "env.data_dir=",
    "env.kwargs={}",  # the quickstart's ALFWorld-only task restriction
    "env.train_kwargs={}",  # the quickstart's ALFWorld-only generator settings
    "env.train_split=train",
    "env.eval_split=valid_seen",
    "rollout.constrained_actions=false",  # the papers' free-text path (tests/training/test_constrained.py)
    "rollout.task_pool=0",  # the quickstart's RL task pool (tested in test_train_cli.py)
    *TINY_RUN,
]


#: The tiny Qwen2 of the tests that build a model without a tokenizer: 2 layers, a 300-token tied vocabulary.
TINY_QWEN2 = {
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}


def tiny_qwen2(seed: int = 0, **shape):
    """A random-initialised Qwen2 of :data:`TINY_QWEN2`'s shape (``shape`` overrides fields), after
    ``torch.manual_seed(seed)``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**{**TINY_QWEN2, **shape}))


def sample_from(policy, prompts, **sampling):
    """:func:`training.decoding.sample_responses` from a loaded :class:`training.policy.Policy` (its model,
    stop tokens and pad id); ``sampling``: the other keywords."""
    from training.decoding import sample_responses

    stops = {"stop_token_ids": policy.stop_token_ids, "pad_token_id": policy.tokenizer.pad_token_id}
    return sample_responses(policy.model, prompts, **stops, **sampling)


def policy_engine(policy):
    """A :class:`training.engines.TransformersEngine` over a loaded policy's model, stop tokens and pad id."""
    from training.engines import TransformersEngine

    return TransformersEngine(policy.model, policy.stop_token_ids, policy.tokenizer.pad_token_id)


def tiny_config(run_dir, *overrides: str):
    """The quickstart preset as a seconds-long toy run in ``run_dir`` (:data:`TINY_OVERRIDES`), then
    ``overrides``."""
    from training.config import load_config

    return load_config(
        REPO / "configs" / "quickstart.yaml", [*TINY_OVERRIDES, f"run_dir={run_dir}", *overrides]
    )


#: The tiny run on the real WebShop env in-process (200 products; evaluation on the test goals).
WEBSHOP_OVERRIDES = ("env.id=progpo/WebShop-v0", "env.kwargs={num_products: 200}", "env.eval_split=test")
#: A run of one bare RL iteration: no warm start, no evaluation.
ONE_BARE_ITERATION = ("iterations=1", "warm_start.enabled=false", "eval.num_tasks=0")


@contextlib.contextmanager
def tiny_trainer(run_dir, *overrides: str):
    """A :class:`training.trainer.Trainer` on :func:`tiny_config` of ``run_dir`` and ``overrides``, closed
    when the block ends."""
    from training.trainer import Trainer

    with contextlib.closing(Trainer(tiny_config(run_dir, *overrides))) as trainer:
        yield trainer


def subprocess_env() -> dict[str, str]:
    """Environment for CLI subprocesses: the repository (the source and the ``tests`` packages) importable,
    one thread, offline."""
    env = repo_on_pythonpath()
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def torchrun_train(config: Path, *overrides: str, processes: int = 2) -> list[str]:
    """``progpo train --config config overrides...`` over ``processes`` local ranks (torchrun)."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    launcher = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    nproc = ["--standalone", "--nproc_per_node", str(processes)]
    return [*launcher, *nproc, "-m", "training.cli", "--config", str(config), *overrides]
