"""Loading the policy: any transformers causal LM by path, or a tiny random Qwen2 built locally first.

Production loads ``Qwen/Qwen2.5-1.5B-Instruct`` through :func:`load_policy`; tests and the quickstart build a
tiny random-initialised Qwen2 with :func:`build_tiny_policy`, save it with ``save_pretrained`` and load it
through the *same* :func:`load_policy` call, so the code path under test is the production one.

Example:
    >>> import tempfile
    >>> folder = build_tiny_policy(tempfile.mkdtemp(), TinyModelConfig(vocab_size=1024, hidden_size=32,
    ...                            intermediate_size=64, num_attention_heads=2, num_key_value_heads=1))
    >>> policy = load_policy(folder, device="cpu")
    >>> type(policy.model).__name__, policy.tokenizer.eos_token
    ('Qwen2ForCausalLM', '<|im_end|>')
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from training.config import ModelConfig, TinyModelConfig
from training.distributed import shard_model
from training.tokenizer import QWEN25_CHAT_TEMPLATE, qwen25_tokenizer_truncated
from training.weight_sync import stream_weights

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


@dataclasses.dataclass
class Policy:
    """A causal LM with its tokenizer.

    Attributes:
        model: The trainable model (possibly a peft model with LoRA adapters).
        tokenizer: Its tokenizer, left padding, with a chat template.
        stop_token_ids: Token ids that end a response (``<|im_end|>``, ``<|endoftext|>``).
    """

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    stop_token_ids: list[int]

    @property
    def device(self) -> torch.device:
        """Device of the model's parameters."""
        return next(self.model.parameters()).device


def resolve_device(device: str) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``"auto"`` -> bfloat16 on CUDA, float32 on CPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def resolve_export_dtype(config: ModelConfig, device: torch.device) -> torch.dtype:
    """The dtype :func:`export_policy` writes: ``model.export_dtype``, where ``auto`` is the compute dtype.

    Example:
        >>> resolve_export_dtype(ModelConfig(compute_dtype="bfloat16"), torch.device("cpu"))
        torch.bfloat16
        >>> resolve_export_dtype(ModelConfig(), torch.device("cpu"))  # the quickstart: float32 as before
        torch.float32
    """
    name = config.compute_dtype if config.export_dtype == "auto" else config.export_dtype
    return resolve_dtype(name, device)


def compute_context(
    device: str | torch.device, compute_dtype: str | torch.dtype
) -> contextlib.AbstractContextManager:
    """The context every forward pass of training runs in: autocast to ``compute_dtype`` over the parameters
    (fp32 masters), or nothing when that is float32.

    Mixed precision as in PyTorch AMP: matmuls run in bf16 while the optimizer updates fp32 weights, whose
    ~1e-6 AdamW steps a bf16 weight would round away (issue 15). Autocast caches each weight's low-precision
    copy until the outermost context exits, so wrap forward passes (sampling, a micro-batch's forward), never
    ``optimizer.step()``: a step inside the context would leave stale copies in use.

    Args:
        device: Where the model runs (``autocast`` is per device type).
        compute_dtype: ``auto`` (bfloat16 on CUDA, float32 on CPU), a dtype name, or a ``torch.dtype``.

    Example:
        >>> with compute_context("cpu", "bfloat16"):
        ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
        torch.bfloat16
        >>> with compute_context("cpu", "auto"):
        ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
        torch.float32
    """
    device = torch.device(device)
    dtype = compute_dtype if isinstance(compute_dtype, torch.dtype) else resolve_dtype(compute_dtype, device)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def build_tiny_policy(folder: str | Path, shape: TinyModelConfig | None = None) -> Path:
    """Build a random-initialised Qwen2 with a truncated Qwen2.5 tokenizer; ``save_pretrained`` to ``folder``.

    The tokenizer keeps Qwen's first ``shape.vocab_size`` BPE ids (:func:`qwen25_tokenizer_truncated`);
    embeddings are tied as in Qwen2.5-1.5B. Building is deterministic in ``shape.seed``. Returns ``folder``.
    """
    shape = shape or TinyModelConfig()
    folder = Path(folder)
    tokenizer = qwen25_tokenizer_truncated(shape.vocab_size)
    config = Qwen2Config(
        vocab_size=max(len(tokenizer), shape.embedding_rows),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # seeded init without disturbing the caller's RNG
        torch.manual_seed(shape.seed)
        model = Qwen2ForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def policy_folder(config: ModelConfig, run_dir: Path, build: bool = True) -> Path:
    """The folder the run's policy loads from: ``model.path``, or else the tiny random-initialised policy of
    ``model.tiny``'s shape in ``<run_dir>/tiny_policy``, built when ``build`` (rank 0 builds, the others wait)
    and the folder holds another shape (deterministic in the shape, its seed included)."""
    if config.path:
        return Path(config.path)
    folder = Path(run_dir) / "tiny_policy"
    shape = json.dumps(dataclasses.asdict(config.tiny), sort_keys=True)
    marker = folder / "tiny_shape.json"
    if build and not (marker.is_file() and marker.read_text() == shape):
        build_tiny_policy(folder, config.tiny)
        marker.write_text(shape)
    return folder


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a LoRA wrapper (the model itself without one)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The token ids that end a response: the tokenizer's EOS and Qwen's end-of-turn tokens it knows."""
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|endoftext|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return sorted(i for i in ids if i is not None)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of ``path``, left-padded, with the Qwen2.5 template when the folder has none."""
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = QWEN25_CHAT_TEMPLATE
    return tokenizer


def load_policy(
    path: str | Path,
    device: str | torch.device = "auto",
    dtype: str = "float32",
    config: ModelConfig | None = None,
) -> Policy:
    """Load a causal LM folder or hub id with ``AutoModelForCausalLM.from_pretrained`` for training.

    Args:
        path: Folder or hub id (e.g. ``Qwen/Qwen2.5-1.5B-Instruct``).
        device: ``auto``, ``cpu``, ``cuda``...
        dtype: dtype of the trained parameters (``model.dtype``): float32 masters by default; compute in
            bf16 with :func:`compute_context`.
        config: Gradient checkpointing and LoRA settings (defaults: off).
    """
    config = config or ModelConfig()
    device = resolve_device(str(device))
    torch_dtype = resolve_dtype(dtype, device)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
    model.to(device)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if config.lora_rank > 0:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=config.lora_rank,
                lora_alpha=config.lora_alpha,
                target_modules=list(config.lora_target_modules),
                task_type="CAUSAL_LM",
            ),
        )
    tokenizer = load_tokenizer(path)
    return Policy(model=model, tokenizer=tokenizer, stop_token_ids=stop_token_ids(tokenizer))


def load_reference(
    path: str | Path, device: str | torch.device = "auto", dtype: str = "auto"
) -> torch.nn.Module:
    """A frozen copy of the initial policy for the KL term (eval mode, no gradients)."""
    device = resolve_device(str(device))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype, device)).to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def load_kl_reference(
    path: str | Path, device: torch.device, config: ModelConfig, *, sharded: bool
) -> torch.nn.Module:
    """A training run's frozen KL reference from ``path`` (:func:`load_reference`) in ``model.compute_dtype``.
    With ``sharded`` (under torchrun) it is loaded on the CPU and sharded with FSDP2 like the trained model,
    computing in the compute dtype on ``device``: a whole copy per rank is too much at 7B."""
    reference = load_reference(path, "cpu" if sharded else device, config.compute_dtype)
    if sharded:
        shard_model(reference, compute_dtype=resolve_dtype(config.compute_dtype, device))
    return reference


def export_policy(
    policy: Policy,
    folder: str | Path,
    dtype: torch.dtype | None = None,
    *,
    sharded: bool = False,
    writer: bool = True,
) -> Path:
    """Save a plain transformers folder (LoRA merged) for ``from_pretrained``, ``progpo eval``, vLLM.

    Args:
        policy: The trained policy.
        folder: Output folder.
        dtype: The saved weights' dtype (``model.export_dtype`` resolved, e.g. bfloat16 for the 1.5B presets
            from fp32 masters); None keeps the parameters' dtype. The policy itself is not modified.
        sharded: The model is FSDP2-sharded: its weights are gathered one tensor at a time
            (:func:`training.weight_sync.stream_weights`, a collective: every rank calls this) and only the
            ``writer`` keeps them, in host memory (no second copy of the model on a GPU).
        writer: This process writes the folder (rank 0).
    """
    import copy

    folder = Path(folder)
    if sharded:
        weights = {name: t.to("cpu", copy=True) for name, t in stream_weights(policy.model, dtype) if writer}
        if writer:
            save_weights(folder, weights, base_model(policy.model).config, policy.tokenizer)
        return folder
    model = policy.model
    if hasattr(model, "merge_and_unload"):
        model = copy.deepcopy(model).merge_and_unload()
        if dtype is not None:
            model.to(dtype)
    elif dtype is not None and next(model.parameters()).dtype != dtype:
        model = copy.deepcopy(model).to(dtype)
    model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    return folder


def save_weights(
    folder: str | Path, weights: dict[str, torch.Tensor], model_config, tokenizer: PreTrainedTokenizerBase
) -> Path:
    """Save full ``weights`` (plain Hugging Face names, e.g. gathered from FSDP2 shards one tensor at a time)
    as a transformers folder of ``model_config``'s architecture, with ``tokenizer``.

    The architecture is built on the meta device (no memory), only to write the weights in the layout
    ``from_pretrained`` and vLLM read (tied weights, shards, index); no second copy of the model is made.
    """
    folder = Path(folder)
    dtype = next(iter(weights.values())).dtype if weights else torch.float32
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(model_config, dtype=dtype)
    skeleton.save_pretrained(folder, state_dict=dict(weights))
    tokenizer.save_pretrained(folder)
    return folder
