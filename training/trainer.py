"""The bundled training loop: rollouts in group vector envs → step-level advantages → PPO-style token updates.

One iteration (``../shared/docs/architecture.md``):

1. **Rollout** — ``num_groups`` tasks drawn from the training split (a seeded function of ``(seed,
   iteration)``, so a resumed run draws the same next batch), ``group_size`` copies each, sampled at the
   training temperature with per-token log-probs recorded (:mod:`training.rollout`). With DAPO's dynamic
   sampling, groups whose episodes all end the same are dropped and more groups are rolled (up to
   ``max_sampling_rounds``).
2. **Advantages** — :func:`training.advantages.compute_advantages` (``algo.name``, ProGPO by default) on the
   step rows' columns, with the invalid-action penalty; one float per row, broadcast over that row's response
   tokens.
3. **Update** — shuffled mini-batches of rows, micro-batches with gradient accumulation, the clipped
   token-level objective with dual clip, k3 KL to the frozen reference and an entropy bonus
   (:mod:`training.loss`), gradient clipping, AdamW.

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

import gymnasium as gym
import numpy as np
import torch
import yaml
from transformers.utils import logging as transformers_logging

import progpo_envs  # noqa: F401  (registers the env ids)
from training.advantages import compute_advantages
from training.checkpoint import latest_checkpoint, load_checkpoint_state, save_checkpoint, set_rng_state
from training.config import ConfigError, TrainConfig, config_to_dict
from training.distributed import DistContext, full_state_dict, shard_model
from training.loss import kl_k3, masked_sum, policy_loss_terms
from training.metrics import HELD_OUT_EVAL_KIND, RL_TASKS_EVAL_KIND, MetricsLog, plot_learning_curve
from training.policy import (
    Policy,
    build_tiny_policy,
    export_policy,
    load_policy,
    load_reference,
    resolve_device,
)
from training.rollout import Episode, RolloutResult, RolloutWorker, StepRows, TransformersEngine
from training.sampling import (
    pack_sequences,
    policy_logprobs,
    policy_logprobs_and_entropy,
)

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


def spread_tasks(split_size: int, count: int) -> list[int]:
    """``count`` task indices spread evenly over a split of ``split_size`` tasks (wrapping if it is smaller).

    The splits are sorted by task type, so an even spread holds every type: the held-out evaluation and the RL
    task pool (``rollout.task_pool``) are both drawn this way.

    Example:
        >>> spread_tasks(16, 4), spread_tasks(3, 5)
        ([0, 4, 8, 12], [0, 0, 1, 1, 2])
    """
    return [int(t) % split_size for t in np.linspace(0, split_size, count, endpoint=False).astype(int)]


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
        self.rollout_model = self.model
        if self.dist.enabled:  # sample with a plain copy; train the FSDP2-sharded model
            self.rollout_model = copy.deepcopy(self.model)
            self.rollout_model.requires_grad_(False)
            shard_model(self.model)
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
                dtype=self.config.model.dtype,
                max_model_len=cfg.max_prompt_tokens + cfg.max_new_tokens,
            )
        return TransformersEngine(
            self.rollout_model,
            self.policy.stop_token_ids,
            self.tokenizer.pad_token_id,
            top_p=cfg.top_p,
            batch_size=cfg.sample_batch_size,
        )

    def _make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        params = [p for p in self.model.parameters() if p.requires_grad]
        cfg = self.config.optim
        return torch.optim.AdamW(params, lr=lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)

    def _make_envs(self, split: str, num_groups: int, group_size: int, expert: bool = False):
        env = self.config.env
        kwargs = dict(env.kwargs)
        if split == env.train_split:
            kwargs.update(env.train_kwargs)
        kwargs.update(split=split, max_steps=env.max_steps)
        if env.data_dir:
            kwargs["data_dir"] = env.data_dir
        if expert:
            kwargs["expert"] = True
        if env.vector_mode == "async":
            kwargs["num_workers"] = env.num_workers or None
        env_id = env.id
        if env.url:  # the same env hosted by an env server (its kwargs travel with the create request)
            from progpo_envs.core.registration import register_text_env
            from progpo_envs.server.remote import REMOTE_ENV_ID

            register_text_env(REMOTE_ENV_ID, "progpo_envs.server.remote:RemoteEnv")
            kwargs.update(url=env.url, env_id=env.id)
            env_id = REMOTE_ENV_ID
        return gym.make_vec(
            env_id,
            num_envs=num_groups * group_size,
            group_size=group_size,
            vector_mode=env.vector_mode,
            **kwargs,
        )

    @property
    def train_envs(self):
        """The training group vector env (this rank's groups), built on first use."""
        if self._train_envs is None:
            groups = len(self.dist.shard(list(range(self.config.rollout.num_groups))))
            self._train_envs = self._make_envs(
                self.config.env.train_split, max(groups, 1), self.config.rollout.group_size
            )
        return self._train_envs

    def _num_tasks(self, envs) -> int:
        return int(envs.call("num_tasks")[0]) if hasattr(envs, "call") else int(envs.get_attr("num_tasks")[0])

    def _worker(self, envs) -> RolloutWorker:
        return RolloutWorker(
            envs,
            self.config.env.id,
            self.tokenizer,
            self.config.rollout.history_length,
            self.config.rollout.max_prompt_tokens,
            template=self.config.rollout.template,
            constrained_actions=self.config.rollout.constrained_actions,
        )

    # ------------------------------------------------------------------ rollout
    def _generator(self, *parts) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(derive_seed(self.config.seed, *parts))

    def collect(self, iteration: int) -> RolloutResult:
        """Roll out this iteration's groups (all rounds of dynamic sampling) on this rank."""
        cfg, envs = self.config.rollout, self.train_envs
        num_tasks = self._num_tasks(envs)
        pool = spread_tasks(num_tasks, cfg.task_pool) if cfg.task_pool else list(range(num_tasks))
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
            result = self._worker(envs).run(
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
                self._filter_groups(result)
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

    @staticmethod
    def _filter_groups(result: RolloutResult) -> tuple[list[int], set[int]]:
        """DAPO dynamic sampling: keep groups whose episodes do not all have the same score."""
        scores: dict[int, set[float]] = defaultdict(set)
        for e in result.episodes:
            scores[e.group_id].add(round(e.score, 6))
        keep = {g for g, s in scores.items() if len(s) > 1}
        return [i for i, g in enumerate(result.rows.group_id) if g in keep], keep

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

    def _reference_logprobs(self, packed, temperature: float, responses, choices) -> torch.Tensor | None:
        if self.reference is None:
            return None
        with torch.no_grad():
            return policy_logprobs(self.reference, packed, responses, choices, temperature)

    def update(self, rows: StepRows, advantages: np.ndarray, iteration: int) -> dict[str, float]:
        """PPO epochs over shuffled mini-batches; returns loss/ratio/KL/entropy statistics."""
        cfg, loss_cfg = self.config, self.config.loss
        temperature = cfg.rollout.temperature
        self.model.train()
        rng = np.random.default_rng(derive_seed(cfg.seed, "shuffle", iteration, self.dist.rank))
        sums: dict[str, float] = defaultdict(float)
        first_check: dict[str, float] = {}
        tokens_total, grad_norms = 0.0, []
        n = rows.num_rows
        local_minis = max(1, math.ceil(n / cfg.optim.mini_batch_rows))
        num_minis = int(self.dist.all_reduce_max(local_minis))
        for epoch in range(loss_cfg.ppo_epochs):
            order = rng.permutation(n).tolist()
            minis = [order[i * n // num_minis : (i + 1) * n // num_minis] for i in range(num_minis)]
            for mini in minis:
                mini_tokens = sum(len(rows.response_ids[i]) for i in mini)
                global_tokens = self.dist.all_reduce_sum(mini_tokens)
                micro_size = cfg.optim.micro_batch_rows
                local_micros = max(1, math.ceil(len(mini) / micro_size))
                num_micros = int(self.dist.all_reduce_max(local_micros))
                self.optimizer.zero_grad(set_to_none=True)
                for m in range(num_micros):
                    micro = mini[m * micro_size : (m + 1) * micro_size]
                    weight = 1.0
                    if not micro:  # keep ranks in step: a zero-weight pass over some row
                        micro, weight = [order[0]] if order else [], 0.0
                    if not micro:
                        continue
                    packed = pack_sequences(
                        [rows.prompt_ids[i] for i in micro],
                        [rows.response_ids[i] for i in micro],
                        self.tokenizer.pad_token_id,
                        self.device,
                    )
                    mask = packed.response_mask.float()
                    width = mask.shape[1]
                    old = torch.zeros_like(mask)
                    for r, i in enumerate(micro):
                        old[r, : len(rows.old_logprobs[i])] = torch.tensor(rows.old_logprobs[i])
                    adv = torch.tensor(
                        [advantages[i] for i in micro], dtype=torch.float32, device=self.device
                    )[:, None].expand(-1, width)
                    responses = [rows.response_ids[i] for i in micro]
                    choices = [rows.choices[i] for i in micro]
                    logprobs, entropy = policy_logprobs_and_entropy(
                        self.model, packed, responses, choices, temperature
                    )
                    terms = policy_loss_terms(
                        logprobs,
                        old,
                        adv,
                        mask,
                        clip_low=loss_cfg.clip_low,
                        clip_high=loss_cfg.clip_high,
                        dual_clip=loss_cfg.dual_clip,
                    )
                    ref = self._reference_logprobs(packed, temperature, responses, choices)
                    kl_sum = masked_sum(kl_k3(logprobs, ref), mask) if ref is not None else torch.zeros(())
                    entropy_sum = masked_sum(entropy, mask)
                    objective = terms.pg_sum + loss_cfg.kl_coef * kl_sum - loss_cfg.entropy_coef * entropy_sum
                    scale = weight * self.dist.world_size / max(global_tokens, 1.0)
                    (objective * scale).backward()
                    if weight:
                        if epoch == 0 and not first_check:  # sampler vs trainer log-probs before any step
                            diff = (logprobs.detach() - old).abs() * mask
                            first_check = {
                                "first_ratio_mean": float(terms.ratio_sum / mask.sum().clamp(min=1)),
                                "logprob_diff_max": float(diff.max()),
                            }
                        count = float(mask.sum())
                        tokens_total += count
                        sums["pg_loss"] += float(terms.pg_sum.detach())
                        sums["ratio"] += float(terms.ratio_sum.detach())
                        sums["clip_frac"] += float(terms.clipped_sum.detach())
                        sums["dual_clip_frac"] += float(terms.dual_clipped_sum.detach())
                        sums["approx_kl"] += float(terms.approx_kl_sum.detach())
                        sums["kl"] += float(kl_sum.detach())
                        sums["entropy"] += float(entropy_sum.detach())
                params = [p for p in self.model.parameters() if p.requires_grad]
                norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
                grad_norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
                self.optimizer.step()
        out = {k: v / max(tokens_total, 1.0) for k, v in sums.items()}
        out.update(first_check)
        out["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        out["update_tokens"] = tokens_total
        return out

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
        stats = self.update(result.rows, adv, iteration)
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
            self._eval_envs[kind] = self._make_envs(
                split, max(len(self.dist.shard(list(range(count)))), 1), 1
            )
        envs = self._eval_envs[kind]
        tasks = self.dist.shard(spread_tasks(self._num_tasks(envs), count))
        indices = tasks or [0]
        per_seed, all_episodes, admissible = [], [], [0.0, 0.0]
        for s in range(cfg.seeds):
            result = self._worker(envs).run(
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
        """Load the newest checkpoint (model, optimizer, RNG, state); False when there is none."""
        folder = latest_checkpoint(self.run_dir / "checkpoints")
        if folder is None:
            return False
        state, optim_state, rng = load_checkpoint_state(folder)
        self._load_weights(torch.load(folder / "model.pt", map_location="cpu", weights_only=True))
        self.optimizer = self._make_optimizer(self.config.optim.lr)
        self._load_optimizer(optim_state)
        set_rng_state(rng)
        self.state = {k: v for k, v in state.items() if k != "iteration"}
        self.iteration = int(state["iteration"])
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
        self.reference = load_reference(folder, self.device, self.config.model.dtype)

    def run(self, resume: bool = False) -> dict[str, Any]:
        """Warm start (optional), validate, train, validate, export; returns a summary."""
        cfg = self.config
        if resume and self.restore():
            self._log(f"resumed from iteration {self.iteration}")
        else:
            self.metrics.truncate_after(-1)
            if self.dist.is_main:  # a fresh run in a used run_dir must not inherit its reference/checkpoints
                for stale in ("reference", "checkpoints"):
                    shutil.rmtree(self.run_dir / stale, ignore_errors=True)
            self.dist.barrier()
            if cfg.warm_start.enabled:
                from training.warm_start import warm_start

                ws = warm_start(self)
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
                    self._log(
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
            if self.dist.enabled:
                weights = full_state_dict(self.model)
                self.rollout_model.save_pretrained(self.run_dir / "final", state_dict=weights)
                self.tokenizer.save_pretrained(self.run_dir / "final")
            else:
                export_policy(self.policy, self.run_dir / "final")
            plot_learning_curve(self.metrics.read(), self.run_dir / "learning_curve.png")
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        else:
            full_state_dict(self.model) if self.dist.enabled else None
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

    def _log(self, message: str) -> None:
        if self.dist.is_main:
            print(f"[progpo train] {message}", flush=True)

    def close(self) -> None:
        """Close the envs."""
        for envs in (self._train_envs, *self._eval_envs.values()):
            if envs is not None:
                envs.close()
