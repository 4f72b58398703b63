"""The bundled training loop: rollouts in group vector envs → step-level advantages → PPO-style token updates.

One iteration (``docs/architecture.md`` "One training iteration"):

1. **Rollout** — ``num_groups`` tasks drawn from the training split (a seeded function of ``(seed,
   iteration)``, so a resumed run draws the same next batch), ``group_size`` copies each, sampled at the
   training temperature with per-token log-probs recorded (:mod:`training.rollout`; envs from
   :mod:`training.envs`). With DAPO's dynamic
   sampling, groups whose episodes all end the same are dropped and more groups are rolled (up to
   ``max_sampling_rounds``).
2. **Advantages** — :func:`training.advantages.compute_advantages` (``algo.name``, ProGPO by default) on the
   step rows' columns, with the invalid-action penalty; one float per row, broadcast over that row's response
   tokens.
3. **Update** — shuffled mini-batches of rows, micro-batches with gradient accumulation, the clipped
   token-level objective with dual clip, k3 KL to the frozen reference and an entropy bonus
   (:func:`training.update.micro_step` over :mod:`training.loss`), gradient clipping, AdamW.

Around it: an optional warm start on expert demonstrations (:mod:`training.warm_start`), validation on the
held-out split before training, every ``eval.every`` iterations and at the end, atomic checkpoints with exact
resume (:mod:`training.checkpoint`), metrics to JSONL and TensorBoard, a learning-curve PNG and a final plain
transformers export in ``<run_dir>/final``.

Example:
    >>> from training.config import load_config
    >>> cfg = load_config(None, ["iterations=0", "warm_start.enabled=false"])  # doctest: +SKIP
    >>> Trainer(cfg).run()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from transformers.utils import logging as transformers_logging

from agents.envs import num_tasks
from training.advantages import compute_advantages
from training.checkpoint import load_latest_checkpoint, save_checkpoint, set_rng_state
from training.config import ConfigError, TrainConfig, config_to_dict
from training.distributed import DistContext, full_state_dict, shard_model
from training.engines import TransformersEngine
from training.envs import make_split_envs, spread_tasks
from training.metrics import HELD_OUT_EVAL_KIND, RL_TASKS_EVAL_KIND, MetricsLog, plot_learning_curve
from training.policy import (
    Policy,
    build_tiny_policy,
    export_policy,
    load_policy,
    load_reference,
    resolve_device,
    resolve_dtype,
    resolve_export_dtype,
)
from training.provenance import environment
from training.rollout import Episode, RolloutResult, RolloutWorker, StepRows
from training.update import (
    MiniBatchPlan,
    Numerics,
    UpdateMetrics,
    micro_step,
    pack_micro_batch,
    recompute_old_logprobs,
)
from training.update_size import snapshot_parameters, update_size

transformers_logging.disable_progress_bar()  # checkpoint writes are not worth a progress bar each


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from ``parts`` (stable across processes: xxh3 of their text, not Python's ``hash``)."""
    from progpo_envs.core.hashing import text_digest

    return int(text_digest("/".join(str(p) for p in parts))) & ((1 << 63) - 1)


def episode_metrics(episodes: list[Episode], prefix: str = "") -> dict[str, float]:
    """Success overall and per task type, return (``score``), the env's task score when it reports one
    (``task_score``: WebShop's 0–1 purchase score), steps (all episodes, and ``success_steps``: won ones only)
    and invalid-action rate of a list of episodes."""
    if not episodes:
        return {}
    task_scores = [e.task_score for e in episodes if e.task_score is not None]
    won_steps = [e.steps for e in episodes if e.won]
    out = {
        f"{prefix}success": float(np.mean([e.won for e in episodes])),
        f"{prefix}score": float(np.mean([e.score for e in episodes])),
        **({f"{prefix}task_score": float(np.mean(task_scores))} if task_scores else {}),
        f"{prefix}episode_steps": float(np.mean([e.steps for e in episodes])),
        # steps to success: the mean length of the won episodes only (absent when none was won)
        **({f"{prefix}success_steps": float(np.mean(won_steps))} if won_steps else {}),
        f"{prefix}invalid_rate": float(
            sum(e.invalid_steps for e in episodes) / max(1, sum(e.steps for e in episodes))
        ),
        f"{prefix}episodes": float(len(episodes)),
    }
    by_type: dict[str, list[bool]] = defaultdict(list)
    for e in episodes:
        if e.task_type:  # WebShop goals have no type: their per-type entry would repeat ``success``
            by_type[e.task_type].append(e.won)
    for task_type, wins in sorted(by_type.items()):
        out[f"{prefix}success/{task_type}"] = float(np.mean(wins))
    return out


def exact_prefix_peer_fraction(rows: StepRows) -> float:
    """Fraction of step rows whose exact history prefix (task + all pairs + state) occurs in another
    trajectory of the same group: the rows ProGPO's exact-prefix peer comparison applies to."""
    if rows.num_rows == 0:
        return 0.0
    trajs: dict[tuple[int, int], set[int]] = defaultdict(set)
    for g, h, t in zip(rows.group_id, rows.history_key, rows.traj_id, strict=True):
        trajs[(g, h)].add(t)
    keys = zip(rows.group_id, rows.history_key, strict=True)
    return float(np.mean([len(trajs[(g, h)]) > 1 for g, h in keys]))


def mixed_outcome_groups(result: RolloutResult) -> tuple[list[int], set[int]]:
    """DAPO dynamic sampling: the groups whose episodes do not all have the same score, and their rows.

    Returns ``(row indices, group ids)`` of the groups kept.
    """
    scores: dict[int, set[float]] = defaultdict(set)
    for e in result.episodes:
        scores[e.group_id].add(round(e.score, 6))
    keep = {g for g, s in scores.items() if len(s) > 1}
    return [i for i, g in enumerate(result.rows.group_id) if g in keep], keep


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {}
    return {
        f"{prefix}_mean": float(values.mean()),
        f"{prefix}_std": float(values.std()),
        f"{prefix}_min": float(values.min()),
        f"{prefix}_max": float(values.max()),
    }


class Trainer:
    """Runs ``progpo train`` for one :class:`~training.config.TrainConfig` (see the module docstring).

    Args:
        config: The run's configuration.
        dist_ctx: Distributed context (default: read from the torchrun environment).
    """

    def __init__(self, config: TrainConfig, dist_ctx: DistContext | None = None):
        self.config = config
        self.dist = dist_ctx or DistContext.from_env()
        torch.set_num_threads(max(1, config.num_threads))
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
        self.policy_path = self._policy_path()
        self.dist.barrier()
        self.policy: Policy = load_policy(self.policy_path, self.device, config.model.dtype, config.model)
        self.tokenizer = self.policy.tokenizer
        self.model = self.policy.model
        self.reference: torch.nn.Module | None = None
        # fp32 masters, forward/backward and sampling in model.compute_dtype (bf16 on CUDA by default)
        self.numerics = Numerics(
            self.device,
            resolve_dtype(config.model.compute_dtype, self.device),
            config.optim.logit_chunk_tokens,
        )
        self.rollout_model = self.model
        if self.dist.enabled:  # sample with a plain copy; train the FSDP2-sharded model
            # never trained (sampling runs under no_grad), but left requiring grad: autocast caches its
            # low-precision weight copies only for such leaves, instead of casting every weight at every token
            self.rollout_model = copy.deepcopy(self.model)
            shard_model(self.model, compute_dtype=self.numerics.compute_dtype)
        self.engine = self._make_engine()
        self.optimizer = self._make_optimizer(config.optim.lr)
        self.metrics = MetricsLog(self.run_dir, tensorboard=config.tensorboard, enabled=self.dist.is_main)
        self.iteration = 0
        self.state: dict[str, Any] = {"stage": "start", "evaluations": []}
        self._train_envs = None
        # evaluation kind -> its envs, one copy per task (made on first use)
        self._eval_envs: dict[str, Any] = {}

    # ------------------------------------------------------------------ setup
    def _policy_path(self) -> Path:
        if self.config.model.path:
            return (
                Path(self.config.model.path)
                if Path(self.config.model.path).exists()
                else self.config.model.path
            )
        folder = self.run_dir / "tiny_policy"
        shape = json.dumps(dataclasses.asdict(self.config.model.tiny), sort_keys=True)
        marker = folder / "tiny_shape.json"
        if self.dist.is_main and not (marker.is_file() and marker.read_text() == shape):
            build_tiny_policy(folder, self.config.model.tiny)  # deterministic in the shape (seed included)
            marker.write_text(shape)
        return folder

    def _make_engine(self):
        cfg = self.config.rollout
        if cfg.engine == "vllm":
            from training.vllm_engine import VLLMEngine

            return VLLMEngine(
                str(self.policy_path),
                self.tokenizer,
                top_p=cfg.top_p,
                seed=self.config.seed,
                dtype=self.config.model.compute_dtype,
                max_model_len=cfg.max_prompt_tokens + cfg.max_new_tokens,
                gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            )
        return TransformersEngine(
            self.rollout_model,
            self.policy.stop_token_ids,
            self.tokenizer.pad_token_id,
            top_p=cfg.top_p,
            batch_size=cfg.sample_batch_size,
            compute_dtype=self.numerics.compute_dtype,
        )

    def _make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        params = [p for p in self.model.parameters() if p.requires_grad]
        cfg = self.config.optim
        return torch.optim.AdamW(params, lr=lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)

    @property
    def train_envs(self):
        """The training group vector env (this rank's groups), built on first use."""
        if self._train_envs is None:
            groups = len(self.dist.shard(list(range(self.config.rollout.num_groups))))
            self._train_envs = make_split_envs(
                self.config.env, self.config.env.train_split, max(groups, 1), self.config.rollout.group_size
            )
        return self._train_envs

    # ------------------------------------------------------------------ rollout
    def _generator(self, *parts) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(derive_seed(self.config.seed, *parts))

    def collect(self, iteration: int) -> RolloutResult:
        """Roll out this iteration's groups (all rounds of dynamic sampling) on this rank."""
        cfg, envs = self.config.rollout, self.train_envs
        split_size = num_tasks(envs)
        pool = spread_tasks(split_size, cfg.task_pool) if cfg.task_pool else list(range(split_size))
        groups_here = envs.num_groups
        rows, episodes = StepRows.empty(), []
        total = RolloutResult(rows, episodes)
        kept_groups = 0
        for round_index in range(cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            rng = np.random.default_rng(derive_seed(self.config.seed, "tasks", iteration, round_index))
            all_tasks = rng.choice(pool, size=cfg.num_groups, replace=cfg.num_groups > len(pool)).tolist()
            tasks = self.dist.shard(all_tasks)
            tasks = (tasks + all_tasks)[:groups_here]  # a rank with an empty share still steps its env
            offset = (round_index * self.dist.world_size + self.dist.rank) * groups_here
            result = RolloutWorker.from_config(envs, self.config, self.tokenizer).run(
                seed=derive_seed(self.config.seed, "reset", iteration, round_index) % (2**31 - groups_here),
                task_indices=tasks,
                engine=self.engine,
                temperature=cfg.temperature,
                max_new_tokens=cfg.max_new_tokens,
                generator=self._generator("sample", iteration, round_index, self.dist.rank),
                group_offset=offset,
                traj_offset=offset * cfg.group_size,
            )
            keep_rows, keep_groups = (
                mixed_outcome_groups(result)
                if cfg.dynamic_sampling
                else (list(range(result.rows.num_rows)), None)
            )
            rows.extend(result.rows.select(keep_rows))
            episodes.extend(e for e in result.episodes if keep_groups is None or e.group_id in keep_groups)
            for key in ("generated_tokens", "prompt_tokens", "env_steps", "sample_seconds", "env_seconds"):
                setattr(total, key, getattr(total, key) + getattr(result, key))
            kept_groups += groups_here if keep_groups is None else len(keep_groups)
            if not cfg.dynamic_sampling or self.dist.all_reduce_sum(kept_groups) >= cfg.num_groups:
                break
        if rows.num_rows == 0:  # dynamic sampling kept nothing: train on the last round (zero advantages)
            rows.extend(result.rows)
            episodes.extend(result.episodes)
        total.episodes = episodes
        return total

    # ------------------------------------------------------------------ update
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
        self, rows: StepRows, advantages: np.ndarray, iteration: int, in_update: np.ndarray | None = None
    ) -> dict[str, float]:
        """PPO epochs over shuffled mini-batches (one optimizer step each) of micro-batches (gradient
        accumulation, :func:`training.update.micro_step`); returns loss/ratio/KL/entropy statistics.

        ``in_update`` (bool per row) leaves rows out of the update altogether: no loss terms, no tokens in the
        token-mean denominator (``loss.exclude_uniform_groups``). With ``algo.recompute_old_logprobs``, pi_old
        is the training model's own log-probs over the first epoch's micro-batches
        (:func:`training.update.recompute_old_logprobs`) instead of the sampler's."""
        cfg = self.config
        self.model.train()
        rng = np.random.default_rng(derive_seed(cfg.seed, "shuffle", iteration, self.dist.rank))
        kept = np.ones(rows.num_rows, dtype=bool) if in_update is None else in_update
        if self.dist.all_reduce_sum(int(kept.sum())) == 0:  # every group was left out on every rank
            return {"update_skipped": 1.0}
        epochs = [
            self._epoch_plan(rng.permutation(rows.num_rows), kept, rows) for _ in range(cfg.loss.ppo_epochs)
        ]
        old_logprobs = None
        if cfg.algo.recompute_old_logprobs:
            micro_batches = [micro for mini in epochs[0] for micro, _weight in mini.micros]
            old_logprobs = recompute_old_logprobs(
                self.model,
                rows,
                micro_batches,
                self.tokenizer.pad_token_id,
                cfg.rollout.temperature,
                self.numerics,
            )
        # the optimizer's own (under FSDP2: sharded) parameters; the module may show the root's gathered ones
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        before = snapshot_parameters(params)
        metrics = UpdateMetrics()
        for epoch, minis in enumerate(epochs):
            for mini_index, mini in enumerate(minis):
                self.optimizer.zero_grad(set_to_none=True)
                for micro, weight in mini.micros:
                    batch = pack_micro_batch(
                        rows, advantages, micro, self.tokenizer.pad_token_id, self.device, old_logprobs
                    )
                    scale = weight * self.dist.world_size / max(mini.global_tokens, 1.0)
                    terms = micro_step(
                        self.model,
                        self.reference,
                        batch,
                        cfg.loss,
                        cfg.rollout.temperature,
                        scale,
                        self.numerics,
                    )
                    if weight:
                        metrics.add_micro_step(
                            batch,
                            terms,
                            first_epoch=epoch == 0,
                            before_first_step=epoch == 0 and mini_index == 0,
                        )
                norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
                metrics.add_grad_norm(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
                self.optimizer.step()
        out = metrics.summary()
        out.update(update_size(before, params).all_reduce(self.dist.all_reduce_sum).metrics())
        if "first_ratio_max_abs_dev" in out or self.dist.enabled:
            out["first_ratio_max_abs_dev"] = self.dist.all_reduce_max(out.get("first_ratio_max_abs_dev", 0.0))
        return out

    def _epoch_plan(self, permutation: np.ndarray, kept: np.ndarray, rows: StepRows) -> list[MiniBatchPlan]:
        """One epoch's mini-batches of micro-batches over this rank's kept rows, in ``permutation``'s order.

        Every rank plans the same number of mini-batches and of micro-batches in each (the FSDP2 collectives
        need it); a rank short of rows runs zero-weight passes over some row. The token-mean denominator of a
        mini-batch counts the response tokens of every rank's rows in it."""
        cfg = self.config.optim
        order = [int(i) for i in permutation if kept[i]]
        filler = order[0] if order else (0 if rows.num_rows else None)  # a row for zero-weight passes
        n = len(order)
        num_minis = int(self.dist.all_reduce_max(max(1, math.ceil(n / cfg.mini_batch_rows))))
        plan = []
        for i in range(num_minis):
            mini = order[i * n // num_minis : (i + 1) * n // num_minis]
            global_tokens = self.dist.all_reduce_sum(sum(len(rows.response_ids[j]) for j in mini))
            num_micros = int(self.dist.all_reduce_max(max(1, math.ceil(len(mini) / cfg.micro_batch_rows))))
            micros = []
            for m in range(num_micros):
                micro = mini[m * cfg.micro_batch_rows : (m + 1) * cfg.micro_batch_rows]
                if micro or filler is not None:
                    micros.append((micro, 1.0) if micro else ([filler], 0.0))
            plan.append(MiniBatchPlan(global_tokens, micros))
        return plan

    def _sync_rollout_weights(self) -> None:
        """Push the trained weights to the sampler (rollout copy under FSDP2, vLLM engine)."""
        if self.dist.enabled:
            self.rollout_model.load_state_dict(full_state_dict(self.model))
        if not (isinstance(self.engine, TransformersEngine) and self.engine.model is self.rollout_model):
            self.engine.sync_weights(self.rollout_model)

    # ------------------------------------------------------------------ one iteration
    def train_iteration(self, iteration: int) -> dict[str, float]:
        """Rollout → advantages → update for iteration ``iteration`` (0-based); returns its metrics."""
        started = time.perf_counter()
        result = self.collect(iteration)
        t_rollout = time.perf_counter()
        adv = self.advantages(result.rows)
        t_adv = time.perf_counter()
        in_update = None
        if self.config.loss.exclude_uniform_groups:  # DAPO: groups that all scored the same teach nothing
            in_update = np.zeros(result.rows.num_rows, dtype=bool)
            in_update[mixed_outcome_groups(result)[0]] = True
        stats = self.update(result.rows, adv, iteration, in_update)
        self._sync_rollout_weights()
        t_update = time.perf_counter()
        episodes = [e for part in self.dist.gather_objects(result.episodes) for e in part]
        metrics: dict[str, float] = {"kind": "train", "iteration": iteration + 1}
        metrics.update(episode_metrics(episodes))
        metrics.update(stats)
        metrics.update(_stats("advantage", adv))
        metrics["rows"] = float(self.dist.all_reduce_sum(result.rows.num_rows))
        metrics["valid_rate"] = float(np.mean(result.rows.valid)) if result.rows.num_rows else 0.0
        metrics["admissible_rate"] = float(np.mean(result.rows.admissible)) if result.rows.num_rows else 0.0
        metrics["exact_prefix_peer_fraction"] = exact_prefix_peer_fraction(result.rows)
        metrics["time_rollout"] = t_rollout - started
        metrics["time_advantage"] = t_adv - t_rollout
        metrics["time_update"] = t_update - t_adv
        metrics["time_iteration"] = t_update - started
        metrics["rollout_tokens_per_s"] = result.generated_tokens / max(result.sample_seconds, 1e-9)
        metrics["env_steps_per_s"] = result.env_steps / max(result.env_seconds, 1e-9)
        metrics["update_tokens_per_s"] = stats.get("update_tokens", 0.0) / max(t_update - t_adv, 1e-9)
        return metrics

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, iteration: int, label: str) -> dict[str, float]:
        """Success on the held-out split: ``eval.num_tasks`` tasks × ``eval.seeds`` sampling seeds."""
        if self.config.eval.num_tasks <= 0:
            return {}
        return self._evaluate_spread(
            HELD_OUT_EVAL_KIND, self.config.env.eval_split, self.config.eval.num_tasks, iteration, label
        )

    def evaluate_rl_tasks(self, iteration: int, label: str) -> dict[str, float]:
        """Success on the training tasks RL draws from (``rollout.task_pool``) if ``eval.rl_tasks`` is on."""
        if not self.config.eval.rl_tasks:
            return {}
        split, count = self.config.env.train_split, self.config.rollout.task_pool
        return self._evaluate_spread(RL_TASKS_EVAL_KIND, split, count, iteration, label)

    def _evaluations(self):
        """The evaluations run before and after RL: ``(record kind, name in logs, summary key prefix,
        evaluate)``."""
        return (
            (HELD_OUT_EVAL_KIND, "held-out", "", self.evaluate),
            (RL_TASKS_EVAL_KIND, "RL-task", "rl_tasks_", self.evaluate_rl_tasks),
        )

    def _evaluate_spread(self, kind: str, split: str, count: int, iteration: int, label: str) -> dict:
        """Play ``count`` tasks spread over ``split`` (shared out over ranks) once per ``eval.seeds`` seed;
        success mean and spread, recorded as ``kind``."""
        cfg = self.config.eval
        if kind not in self._eval_envs:
            self._eval_envs[kind] = make_split_envs(
                self.config.env, split, max(len(self.dist.shard(list(range(count)))), 1), 1
            )
        envs = self._eval_envs[kind]
        tasks = self.dist.shard(spread_tasks(num_tasks(envs), count))
        indices = tasks or [0]
        per_seed, all_episodes, admissible = [], [], [0.0, 0.0]
        for s in range(cfg.seeds):
            result = RolloutWorker.from_config(envs, self.config, self.tokenizer).run(
                seed=derive_seed(self.config.seed, kind, s) % (2**31 - len(indices)),
                task_indices=indices,
                engine=self.engine,
                temperature=cfg.temperature,
                max_new_tokens=self.config.rollout.max_new_tokens,
                generator=self._generator(kind, s, self.dist.rank),
            )
            mine = result.episodes if tasks else []
            if tasks:
                admissible[0] += sum(result.rows.admissible)
                admissible[1] += result.rows.num_rows
            episodes = [e for part in self.dist.gather_objects(mine) for e in part]
            per_seed.append(float(np.mean([e.won for e in episodes])) if episodes else 0.0)
            all_episodes += episodes
        record: dict[str, Any] = {"kind": kind, "iteration": iteration, "label": label}
        record.update(episode_metrics(all_episodes))
        record["success_std"] = float(np.std(per_seed))
        record["success_per_seed"] = per_seed
        record["admissible_rate"] = self.dist.all_reduce_sum(admissible[0]) / max(
            self.dist.all_reduce_sum(admissible[1]), 1.0
        )
        return record

    # ------------------------------------------------------------------ checkpoints
    def save(self, iteration: int) -> None:
        """Write a checkpoint of the state after ``iteration`` completed iterations (rank 0 writes)."""
        state_dict = full_state_dict(self.model)  # collective under FSDP2; LoRA keys included
        optim_state = self._optimizer_state()
        if self.dist.is_main:

            def save_model(path: Path) -> None:
                torch.save(state_dict, path)

            save_checkpoint(
                self.run_dir / "checkpoints",
                iteration,
                save_model=save_model,
                optimizer_state=optim_state,
                state=self.state,
                config=config_to_dict(self.config),
                keep=self.config.keep_checkpoints,
            )
        self.dist.barrier()

    def _optimizer_state(self) -> dict:
        if not self.dist.enabled:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def restore(self) -> bool:
        """Load the newest intact checkpoint (model, optimizer, RNG, state); False when the run has none.

        Raises :class:`training.checkpoint.CheckpointError` when checkpoints exist but none is intact
        (nothing is deleted)."""
        checkpoint = load_latest_checkpoint(self.run_dir / "checkpoints")
        if checkpoint is None:
            return False
        self._load_weights(checkpoint.model_state)
        self.optimizer = self._make_optimizer(self.config.optim.lr)
        self._load_optimizer(checkpoint.optimizer_state)
        set_rng_state(checkpoint.rng_state)
        self.state = {k: v for k, v in checkpoint.state.items() if k != "iteration"}
        self.iteration = checkpoint.iteration
        self._sync_rollout_weights()
        self.metrics.truncate_after(self.iteration)
        return True

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        if self.dist.enabled:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(self.model, weights, options=StateDictOptions(full_state_dict=True))
        else:
            self.model.load_state_dict(weights)

    def _load_optimizer(self, optim_state: dict) -> None:
        if self.dist.enabled:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(
                self.model, self.optimizer, optim_state, options=StateDictOptions(full_state_dict=True)
            )
        else:
            self.optimizer.load_state_dict(optim_state)

    # ------------------------------------------------------------------ the run
    def _setup_reference(self) -> None:
        """Freeze the RL starting point (after the warm start) as the KL reference."""
        if self.config.loss.kl_coef <= 0:
            return
        folder = self.run_dir / "reference"
        exists = (folder / "config.json").is_file()
        if self.state.get("warm_started") and not exists:
            weights = full_state_dict(self.model) if self.dist.enabled else None  # collective: every rank
            if self.dist.is_main:
                if weights is not None:
                    self.rollout_model.save_pretrained(folder, state_dict=weights)
                else:
                    export_policy(self.policy, folder)  # merges LoRA adapters: the reference is a plain model
        elif not exists:
            folder = self.policy_path
        self.dist.barrier()
        self.reference = load_reference(folder, self.device, self.config.model.compute_dtype)

    def run(self, resume: bool = False) -> dict[str, Any]:
        """Warm start (optional), validate, train, validate, export; returns a summary."""
        cfg = self.config
        if resume and self.restore():
            self.dist.log(f"resumed from iteration {self.iteration}")
        else:
            self.metrics.truncate_after(-1)
            if self.dist.is_main:  # a fresh run in a used run_dir must not inherit its reference/checkpoints
                for stale in ("reference", "checkpoints"):
                    shutil.rmtree(self.run_dir / stale, ignore_errors=True)
            self.dist.barrier()
            if cfg.warm_start.enabled:
                from training.warm_start import warm_start

                ws = warm_start(cfg, self.model, self.tokenizer, self.device, self.dist)
                self.metrics.write({"kind": "warm_start", "iteration": 0, **ws})
                self.state["warm_started"] = True
                self.optimizer = self._make_optimizer(cfg.optim.lr)
                self._sync_rollout_weights()
            self._setup_reference()  # before the first checkpoint, so a resumed run finds the same reference
            for _kind, what, _prefix, evaluate in self._evaluations():
                record = evaluate(0, "before_rl") if cfg.eval.before_rl else {}
                if record:
                    self.metrics.write(record)
                    self.state["evaluations"].append(record)
                    self.dist.log(
                        f"{what} success before RL: {record['success']:.3f} ± {record['success_std']:.3f}"
                    )
            self.state["stage"] = "rl"
            self.save(0)
        if self.reference is None:
            self._setup_reference()
        progress = self._progress()
        with progress:
            task = (
                progress.add_task("RL iterations", total=cfg.iterations, completed=self.iteration)
                if hasattr(progress, "add_task")
                else None
            )
            while self.iteration < cfg.iterations:
                metrics = self.train_iteration(self.iteration)
                self.iteration += 1
                self.metrics.write(metrics)
                if task is not None:
                    progress.update(
                        task,
                        completed=self.iteration,
                        description=f"RL it {self.iteration} success {metrics.get('success', 0):.2f}",
                    )
                if (
                    cfg.eval.every
                    and self.iteration % cfg.eval.every == 0
                    and self.iteration < cfg.iterations
                ):
                    record = self.evaluate(self.iteration, "periodic")
                    self.metrics.write(record)
                    self.state["evaluations"].append(record)
                if (
                    cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0
                ) or self.iteration == cfg.iterations:
                    self.save(self.iteration)
        for kind, _what, _prefix, evaluate in self._evaluations():
            done = [e for e in self.state["evaluations"] if e["kind"] == kind]
            if any(e.get("label") == "after_rl" for e in done):
                continue
            before = [e for e in done if e.get("label") == "before_rl"]
            # without RL iterations the policy is the one just measured: reuse, do not re-run, that evaluation
            final = (
                {**before[0], "label": "after_rl"}
                if before and self.iteration == 0
                else evaluate(self.iteration, "after_rl")
            )
            if final:
                self.metrics.write(final)
                self.state["evaluations"].append(final)
            self.save(self.iteration)
        summary = self._finish()
        return summary

    def _finish(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"iterations": self.iteration, "algo": self.config.algo.name}
        for kind, _what, prefix, _evaluate in self._evaluations():
            evals = {e["label"]: e for e in self.state["evaluations"] if e["kind"] == kind}
            for label in ("before_rl", "after_rl"):
                if label in evals:
                    summary[prefix + label] = {
                        k: evals[label][k]
                        for k in evals[label]
                        if k.startswith("success") or k in ("invalid_rate", "episodes", "score", "task_score")
                    }
        if self.dist.is_main:
            # the rollout model is the plain (unsharded) copy, in step with the trained one after every update
            trained = dataclasses.replace(self.policy, model=self.rollout_model)
            export_policy(
                trained, self.run_dir / "final", dtype=resolve_export_dtype(self.config.model, self.device)
            )
            plot_learning_curve(self.metrics.read(), self.run_dir / "learning_curve.png")
            summary["environment"] = self.environment  # machine, packages, commit (training.provenance)
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.metrics.close()
        self.dist.barrier()
        return summary

    def _progress(self):
        if not (self.config.progress and self.dist.is_main):
            return contextlib.nullcontext()
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        return Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
        )

    def close(self) -> None:
        """Close the envs."""
        for envs in (self._train_envs, *self._eval_envs.values()):
            if envs is not None:
                envs.close()
