"""The trained policy's weights as a stream of full tensors: what a sampler loads after every update.

A sampler — the transformers engine's rollout copy under FSDP2, or a vLLM engine — needs the trained weights
under plain Hugging Face names, unsharded, in its own dtype. :func:`stream_weights` yields them one tensor at
a time: an FSDP2-sharded parameter is all-gathered alone (``DTensor.full_tensor``, a collective every rank
runs in the same order), cast to the sampler's dtype on the training device and handed on before the next
one is gathered. At no point does a whole-model copy exist — neither a full fp32 state dict on the GPU nor
one in host memory — so a sync costs one parameter's memory (the largest: the embedding matrix) and no host
copies (verl's hybrid engine and TRL's colocated vLLM reshard in GPU memory the same way).

Example:
    >>> from transformers import Qwen2Config, Qwen2ForCausalLM
    >>> model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32,
    ...                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    >>> weights = dict(stream_weights(model, torch.bfloat16))
    >>> weights["model.layers.0.self_attn.q_proj.weight"].dtype
    torch.bfloat16
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def policy_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's weights under plain Hugging Face names, LoRA adapters merged (nothing is modified).

    A peft model's ``state_dict`` names its base weights ``...q_proj.base_layer.weight`` and adds the
    ``lora_A``/``lora_B`` factors; a sampler knows only ``...q_proj.weight``. Each adapted weight is sent as
    ``W + get_delta_weight()`` (peft's own ``scaling * B @ A``), computed here instead of merging in place,
    which would round the trainer's base weights on every sync. Tensors may be DTensors (FSDP2 shards).

    Example:
        >>> from transformers import Qwen2Config, Qwen2ForCausalLM
        >>> model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32,
        ...                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
        >>> names = [name for name, _ in policy_weights(model)]
        >>> "model.layers.0.self_attn.q_proj.weight" in names
        True
    """
    if not hasattr(model, "peft_config"):
        for name, tensor in model.state_dict().items():
            yield name, tensor.detach()
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for module_name, module in base.named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    key = f"{module_name}.weight"
                    delta = module.get_delta_weight(adapter).detach()
                    deltas[key] = deltas[key] + delta if key in deltas else delta
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        tensor = tensor.detach()
        yield name, (tensor + deltas[name].to(tensor.dtype)) if name in deltas else tensor


@torch.no_grad()
def stream_weights(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor in dtype)`` for every weight of ``model`` (:func:`policy_weights`), one at a time.

    Under FSDP2 every rank must consume the stream to its end, in step: each sharded tensor is gathered by a
    collective. A tensor already in ``dtype`` is yielded as it is (the caller copies what it keeps).
    """
    from torch.distributed.tensor import DTensor

    for name, tensor in policy_weights(model):
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        yield name, full if full.dtype == dtype or not full.is_floating_point() else full.to(dtype)
